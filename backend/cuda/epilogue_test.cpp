// The CUDA device's fusion decisions (backend/cuda/epilogue.hpp) on the CPU: which options fuse what, which shapes
// and alignments are refused before cuBLASLt is asked for a GELU epilogue, and the key its answers are cached under.
// Runs in every build (no CUDA needed); what the fused kernels compute is checked on a GPU (test_cuda_device.cpp).
#include <doctest/doctest.h>

#include <cstddef>
#include <map>
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

TEST_CASE("LtKey: cuBLASLt's cached answers are per shape, epilogue, types and alignments") {
  const epi::LtKey base{.epilogue = 1,
                        .ta = 0,
                        .tb = 1,
                        .m = 4096,
                        .n = 8192,
                        .k = 1024,
                        .lda = 4096,
                        .ldb = 1024,
                        .d_type = 14,
                        .align_a = 256,
                        .align_b = 256,
                        .align_d = 256,
                        .align_bias = 16,
                        .align_aux = 0};
  std::map<epi::LtKey, int> cache{{base, 7}};
  epi::LtKey same = base;
  CHECK(cache.count(same) == 1);  // the same call shape finds the answer
  // Every field is part of the key: a call differing in any one of them asks cuBLASLt again.
  const auto differs = [&](auto change) {
    epi::LtKey k = base;
    change(k);
    return k != base && cache.count(k) == 0;
  };
  CHECK(differs([](epi::LtKey& k) { k.epilogue = 2; }));
  CHECK(differs([](epi::LtKey& k) { k.ta = 1; }));
  CHECK(differs([](epi::LtKey& k) { k.tb = 0; }));
  CHECK(differs([](epi::LtKey& k) { k.m = 4095; }));
  CHECK(differs([](epi::LtKey& k) { k.n = 1; }));
  CHECK(differs([](epi::LtKey& k) { k.k = 1023; }));
  CHECK(differs([](epi::LtKey& k) { k.lda = 8192; }));
  CHECK(differs([](epi::LtKey& k) { k.ldb = 8; }));
  CHECK(differs([](epi::LtKey& k) { k.d_type = 0; }));
  CHECK(differs([](epi::LtKey& k) { k.align_a = 2; }));
  CHECK(differs([](epi::LtKey& k) { k.align_b = 2; }));
  CHECK(differs([](epi::LtKey& k) { k.align_d = 2; }));
  CHECK(differs([](epi::LtKey& k) { k.align_bias = 0; }));
  CHECK(differs([](epi::LtKey& k) { k.align_aux = 16; }));
}
