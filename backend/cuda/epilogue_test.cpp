// The CUDA device's fusion decisions (backend/cuda/epilogue.hpp) on the CPU: which options fuse what, and which
// shapes and alignments are refused before cuBLASLt is asked for a GELU epilogue. Runs in every build (no CUDA
// needed); what the fused kernels compute is checked on a GPU (tests/backend/test_cuda_device.cpp).
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <cstddef>
#include <string_view>

#include "backend/cuda/epilogue.hpp"

namespace epi = harmony::backend::cuda::epi;

namespace {
// An address with exactly `align` bytes of alignment (align a power of two < 256), or 256 bytes or more (256).
alignas(256) unsigned char buffer[512];
const void* at(std::size_t align) { return align == 256 ? buffer : buffer + align; }
}  // namespace

TEST_CASE("alignment_bytes: the largest power of two dividing the address, capped at 256") {
  CHECK(epi::alignment_bytes(at(256)) == 256);
  CHECK(epi::alignment_bytes(buffer + 256) == 256);
  CHECK(epi::alignment_bytes(at(16)) == 16);
  CHECK(epi::alignment_bytes(at(8)) == 8);
  CHECK(epi::alignment_bytes(at(2)) == 2);
  CHECK(epi::alignment_bytes(at(1)) == 1);
}

TEST_CASE("cuBLASLt epilogues: only with the fused option, bf16 storage and the bf16 fast path") {
  for (const bool fused : {false, true}) {
    for (const bool fast : {false, true}) {
      for (const bool bf16 : {false, true}) {
        INFO("fused " << fused << " bf16_fast " << fast << " bf16 storage " << bf16);
        CHECK(epi::fuse_epilogues({.fused = fused, .bf16_fast = fast}, bf16) == (fused && fast && bf16));
      }
    }
  }
}

TEST_CASE("the fused residual add + LayerNorm: with the fused option, whatever the storage and mode") {
  CHECK(epi::fuse_add_layernorm({.fused = true, .bf16_fast = false}));
  CHECK(epi::fuse_add_layernorm({.fused = true, .bf16_fast = true}));
  CHECK_FALSE(epi::fuse_add_layernorm({.fused = false, .bf16_fast = true}));
  CHECK_FALSE(epi::fuse_add_layernorm({.fused = false, .bf16_fast = false}));
}

TEST_CASE("GELU epilogue refusals: cuBLASLt's aux leading dimension and 16-byte vectors") {
  const void* ok = at(256);
  // GPT-2 small and medium's c_fc (rows = 4C) and the tiny test model's (C = 32): asked.
  CHECK(epi::gelu_epilogue_refusal(3072, 8192, 768, ok, ok).empty());
  CHECK(epi::gelu_epilogue_refusal(4096, 8192, 1024, ok, at(16)).empty());
  CHECK(epi::gelu_epilogue_refusal(128, 64, 32, at(16), nullptr).empty());  // no bias vector: not checked
  // Each refusal names its reason.
  CHECK(epi::gelu_epilogue_refusal(0, 64, 32, ok, ok) == "an empty dimension");
  CHECK(epi::gelu_epilogue_refusal(128, 0, 32, ok, ok) == "an empty dimension");
  CHECK(epi::gelu_epilogue_refusal(128, 64, 0, ok, ok) == "an empty dimension");
  CHECK(epi::gelu_epilogue_refusal(777, 64, 32, ok, ok) ==
        "the GELU input's leading dimension (rows) is not a multiple of 8");
  CHECK(epi::gelu_epilogue_refusal(132, 64, 32, ok, ok) ==
        "the GELU input's leading dimension (rows) is not a multiple of 8");
  CHECK(epi::gelu_epilogue_refusal(128, 64, 32, at(8), ok) == "the GELU input is not 16-byte aligned");
  CHECK(epi::gelu_epilogue_refusal(128, 64, 32, ok, at(2)) == "the bias vector is not 16-byte aligned");
}
