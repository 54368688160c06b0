// doctest's implementation and main(), compiled once and linked into every test binary (tests/meson.build) instead
// of once per test file: each copy costs ~28 CPU-seconds at -O2 -g with ASan+UBSan (~4 at -O3), and 56 test files
// each carried one.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>
