// harmony-sim's operator new under mimalloc (meson -Dallocator): it throws std::bad_alloc when memory runs out, as
// the standard says, so that the CLI's error ladder (main.cpp) exits 2 with a message. Debian's libmimalloc 2.0 is
// built as C, where its own operator new cannot see a new-handler and calls abort() (exit 134, no word) instead.
#ifdef HARMONY_MIMALLOC

#include <mimalloc.h>

#include <cstddef>
#include <new>

void* operator new(std::size_t n) {
  if (void* p = mi_new_nothrow(n)) return p;
  throw std::bad_alloc();
}

void* operator new[](std::size_t n) {
  if (void* p = mi_new_nothrow(n)) return p;
  throw std::bad_alloc();
}

void* operator new(std::size_t n, std::align_val_t a) {
  if (void* p = mi_new_aligned_nothrow(n, static_cast<std::size_t>(a))) return p;
  throw std::bad_alloc();
}

void* operator new[](std::size_t n, std::align_val_t a) {
  if (void* p = mi_new_aligned_nothrow(n, static_cast<std::size_t>(a))) return p;
  throw std::bad_alloc();
}

#endif
