#!/usr/bin/env bash
# harmony's full check, as CI runs it (.ci/run): every stage runs even if an earlier one failed, and
# the last line is "N passed, N failed[, N skipped]" over every meson test of every build plus each
# check and fuzzer (and each build that failed, whose tests could not run). Exit 1 if anything failed.
#
#   1. checks       scripts/check-format.sh, scripts/check-layering.sh, scripts/check-sizes.py,
#                   scripts/check-doc-links.py (seconds)
#   2. release      build/      -Dbuildtype=release (-Werror from meson.build); meson test; then
#                   scripts/comparison-docs.py: docs/comparison.md's generated tables against build/'s harmony-sim
#                   (~25 s: the bundled 1,344-point sweep and the paper-regime sweeps)
#   3. notebooks    scripts/run-notebooks.sh build out/notebooks: the bundled GPT sweep with build/'s harmony-sim,
#                   then every notebooks/*.ipynb executed headless (figures in out/notebooks/figures; ~1 min)
#   4. sanitizers   build-san/  ASan + UBSan, debugoptimized (-O2 -g1, the test files themselves -O1; asserts on:
#                   the sanitizers catch the same bugs at -O2; tests ~9 min instead of ~16 at -O0, but a cold compile
#                   ~5x -O0's: docs/history/benchmarks-journal.md, "CI"), -Dcuda=disabled (nvcc and the sanitizers
#                   do not mix; the release build compiles the CUDA device); meson test (detect_leaks=1,
#                   halt_on_error=1).
#                   tests/meson.build sets HARMONY_SANITIZED=1 there: the CLI tests run their long cases on
#                   fewer steps / smaller grids (same checks), and the longest tests start first (priority)
#   5. fuzz         build-fuzz/ clang, -Dfuzz=enabled; each libFuzzer target for HARMONY_FUZZ_SECONDS
#                   on a temp copy of fuzz/corpus/<target>/ (crash inputs land in out/fuzz/)
#   6. tidy         scripts/tidy.sh, only with HARMONY_TIDY=1 (slow)
#
# Knobs (environment): JOBS=2 (ninja/meson test parallelism), HARMONY_FUZZ_SECONDS=20,
# HARMONY_SAN=0 / HARMONY_FUZZ=0 / HARMONY_NOTEBOOKS=0 to skip a stage (its steps count as skipped),
# HARMONY_TIDY=1.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 2
root=$PWD

jobs=${JOBS:-2}
# ccache (where installed) keys debug builds (-g: build-san/, build-fuzz/) on the working directory unless told
# not to, so every fresh clone recompiled them cold (~27 of the 40 minutes of a CI run) while the release tree
# hit the cache. The objects differ only in the debug info's compile directory, which no test reads.
export CCACHE_NOHASHDIR=1
fuzz_seconds=${HARMONY_FUZZ_SECONDS:-20}
steps=$(mktemp)
scratch=$(mktemp -d)
trap 'rm -rf "$steps" "$scratch"' EXIT
declare -a timings=()
stage_start=0

section() {
  printf '\n==================== %s ====================\n' "$*"
  stage_start=$SECONDS
}
stage_done() { timings+=("$(printf '%-12s %4ds' "$1" $((SECONDS - stage_start)))"); }
record() { printf 'step\t%s\t%s\n' "$1" "$2" >>"$steps"; }  # record PASS|FAIL|SKIP name
run_step() {  # run_step NAME CMD...: one pass/fail step
  local name=$1
  shift
  if "$@"; then record PASS "$name"; else record FAIL "$name"; echo "---- FAILED: $name"; fi
}

# setup_build DIR OPTION...: configure DIR fresh or reconfigure it with these options.
setup_build() {
  local dir=$1
  shift
  if [[ -f $dir/meson-private/coredata.dat ]]; then
    meson setup --reconfigure "$dir" "$@" || meson setup --wipe "$dir" "$@"
  else
    rm -rf "$dir"
    meson setup "$dir" "$@"
  fi
}

# build_and_test LABEL DIR [MESON_TEST_ARG...] -- [SETUP_OPTION...]: build all, run meson test.
build_and_test() {
  local label=$1 dir=$2
  shift 2
  local test_args=()
  while (($#)) && [[ $1 != -- ]]; do test_args+=("$1"); shift; done
  shift
  rm -f "$dir/meson-logs/testlog.json"  # never count a previous run's results
  if ! setup_build "$dir" "$@"; then
    record FAIL "$label: meson setup $dir"; echo "---- FAILED: meson setup $dir"; return
  fi
  if ! ninja -C "$dir" -j "$jobs"; then
    record FAIL "$label: build $dir"; echo "---- FAILED: build $dir (its tests did not run)"; return
  fi
  local rc=0
  meson test -C "$dir" --no-rebuild --print-errorlogs --num-processes "$jobs" "${test_args[@]}" || rc=$?
  printf 'meson\t%s\t%s\t%s\n' "$rc" "$label" "$dir/meson-logs/testlog.json" >>"$steps"
}

section "install dependencies"
# Counted only if it fails (like a build): the steps that need a missing package fail on their own too.
bash scripts/install-deps.sh || { record FAIL install-deps; echo "---- FAILED: install-deps"; }
stage_done deps

section "checks: format, layering, sizes, doc links"
run_step check-format bash scripts/check-format.sh
run_step check-layering bash scripts/check-layering.sh
run_step check-sizes python3 scripts/check-sizes.py
run_step check-doc-links python3 scripts/check-doc-links.py
stage_done checks

section "release build and tests (build/)"
build_and_test release build -- -Dbuildtype=release -Dwerror=true
run_step comparison-docs python3 scripts/comparison-docs.py --build build
stage_done release

if [[ ${HARMONY_NOTEBOOKS:-1} == 0 ]]; then
  section "notebooks: skipped (HARMONY_NOTEBOOKS=0)"
  record SKIP notebooks
else
  section "notebooks: bundled sweep + headless execution (out/notebooks/)"
  run_step notebooks bash scripts/run-notebooks.sh build out/notebooks
fi
stage_done notebooks

if [[ ${HARMONY_SAN:-1} == 0 ]]; then
  section "sanitizers: skipped (HARMONY_SAN=0)"
  record SKIP "sanitizers: build-san"
else
  section "sanitizer build and tests (build-san/: ASan+UBSan, debugoptimized)"
  # LeakSanitizer cannot run under some debuggers/sandboxes (ptrace); then run without leak checks
  # rather than failing every test.
  leaks=1
  cxx=${CXX:-c++}
  if printf 'int main() { return 0; }\n' >"$scratch/probe.cpp" &&
    $cxx -fsanitize=address "$scratch/probe.cpp" -o "$scratch/probe" 2>/dev/null &&
    ! ASAN_OPTIONS=detect_leaks=1 "$scratch/probe" >/dev/null 2>&1; then
    echo "WARNING: LeakSanitizer does not work here; build-san tests run with detect_leaks=0"
    leaks=0
  fi
  export ASAN_OPTIONS="detect_leaks=$leaks"
  export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
  # -g1: line tables only (the sanitizers' reports keep function, file and line; no variables): a third less compile
  # time than -g at -O2 (docs/benchmarks.md, "Cold CI").
  build_and_test sanitizers build-san --timeout-multiplier 4 -- \
    -Db_sanitize=address,undefined -Db_lundef=false -Dbuildtype=debugoptimized -Dfuzz=disabled -Dcuda=disabled \
    -Dcpp_args=-g1
  unset ASAN_OPTIONS UBSAN_OPTIONS
fi
stage_done sanitizers

fuzz_targets=(fuzz_config fuzz_profile)
if [[ ${HARMONY_FUZZ:-1} == 0 ]]; then
  section "fuzz: skipped (HARMONY_FUZZ=0)"
  for t in "${fuzz_targets[@]}"; do record SKIP "fuzz: $t"; done
else
  section "fuzz build (build-fuzz/: clang, libFuzzer + ASan + UBSan)"
  # A build dir configured with another compiler cannot be switched: start it again.
  if [[ -f build-fuzz/meson-info/intro-compilers.json ]] &&
    ! grep -q '"id": *"clang"' build-fuzz/meson-info/intro-compilers.json; then
    rm -rf build-fuzz
  fi
  # Only the fuzzers (and the core library) are built here. -Wno-error: clang-only warnings should not
  # stop the fuzzers; the release build's -Werror is the warning gate. Meson puts ccache in front of the
  # compilers it finds itself, not of ones named in CC/CXX: named here, or every run compiled this tree cold
  # (~2 minutes of each CI run).
  fuzz_built=0
  fuzz_cc=clang fuzz_cxx=clang++
  if command -v ccache >/dev/null 2>&1; then fuzz_cc="ccache clang" fuzz_cxx="ccache clang++"; fi
  if CC=$fuzz_cc CXX=$fuzz_cxx setup_build build-fuzz -Dfuzz=enabled -Dbuildtype=debugoptimized -Dcuda=disabled \
    -Db_sanitize=address,undefined -Db_lundef=false \
    "-Dcpp_args=-fsanitize=fuzzer-no-link -Wno-error" &&
    ninja -C build-fuzz -j "$jobs" "${fuzz_targets[@]/#/fuzz/}"; then
    fuzz_built=1
  else
    echo "---- FAILED: fuzz build"
  fi
  stage_done fuzz-build

  section "fuzz run (${fuzz_seconds}s per target)"
  mkdir -p out/fuzz
  for t in "${fuzz_targets[@]}"; do
    kind=${t#fuzz_}
    if ((!fuzz_built)); then record FAIL "fuzz: $t (not built)"; continue; fi
    corpus="$scratch/corpus-$kind"
    mkdir -p "$corpus"
    cp -R "fuzz/corpus/$kind/." "$corpus/"
    dict=()
    [[ -f fuzz/corpus/$kind.dict ]] && dict=("-dict=fuzz/corpus/$kind.dict")
    log="out/fuzz/$t.log"
    echo "-- $t: corpus fuzz/corpus/$kind ($(find "$corpus" -type f | wc -l) seeds), log $log"
    # Runs from the repository root: seed configs name fuzz/corpus/profile/*.json relative to it.
    if ASAN_OPTIONS="detect_leaks=1" UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1" \
      "build-fuzz/fuzz/$t" -max_total_time="$fuzz_seconds" -timeout=10 -rss_limit_mb=2048 \
      -print_final_stats=1 "${dict[@]}" -artifact_prefix="$root/out/fuzz/$t-" "$corpus" >"$log" 2>&1; then
      record PASS "fuzz: $t"
      grep -E '^(stat::number_of_executed_units|stat::peak_rss_mb|Done )' "$log" | tr '\n' ' '
      echo
    else
      record FAIL "fuzz: $t"
      echo "---- FAILED: fuzz: $t; the input that broke it is in out/fuzz/$t-* ; end of $log:"
      tail -n 60 "$log"
      echo "reproduce: build-fuzz/fuzz/$t out/fuzz/$t-<crash-file>"
    fi
  done
  stage_done fuzz-run
fi

if [[ ${HARMONY_TIDY:-0} == 1 ]]; then
  section "clang-tidy (HARMONY_TIDY=1)"
  run_step clang-tidy env JOBS="$jobs" bash scripts/tidy.sh
  stage_done tidy
fi

section "summary"
printf '  %s\n' "${timings[@]}"
echo "  total        ${SECONDS}s"
python3 scripts/count-results.py --steps "$steps"
