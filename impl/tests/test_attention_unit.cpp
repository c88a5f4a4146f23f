// CPU-side tests of the attention forward engine's host API (mk/attention.hpp): what it refuses before any device
// work, each reason naming the argument. No GPU needed (the refusals come before any CUDA call).
#include <doctest/doctest.h>

#include <string>

#include "mk/attention.hpp"
#include "mk/error.hpp"

using namespace mk;

namespace {

AttentionShape good(uint32_t d) {
  AttentionShape sh;
  sh.batch = 2;
  sh.qHeads = 8;
  sh.kvHeads = 2;
  sh.headDim = d;
  sh.sq = sh.ldq = sh.ldo = 100;
  sh.skv = sh.ldkv = 77;
  sh.scale = defaultAttentionScale(d);
  sh.vOffset = uint64_t{2} * 77 * 2 * d;
  return sh;
}

/// attentionForward refuses `sh` with Error(InvalidArgument) whose message contains `needle`.
void refused(const AttentionShape& sh, DType dtype, const std::string& needle) {
  alignas(16) static uint16_t dummy[64];
  float out[4];
  CHECK(attentionForwardProblem(sh, dtype).find(needle) != std::string::npos);
  try {
    attentionForward(sh, dtype, dummy, dummy, out, nullptr);
    FAIL("accepted: " << needle);
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::InvalidArgument);
    CHECK_MESSAGE(std::string(e.what()).find(needle) != std::string::npos, e.what());
  }
}

}  // namespace

TEST_CASE("attention forward: head dims 64 and 128 with bf16 are accepted by the check") {
  CHECK(attentionForwardProblem(good(64), DType::BFloat16).empty());
  CHECK(attentionForwardProblem(good(128), DType::BFloat16).empty());
}

TEST_CASE("attention forward: refuses other head dims, dtypes, GQA groups and misaligned V, naming them") {
  for (uint32_t d : {32u, 96u, 256u}) {
    AttentionShape sh = good(64);
    sh.headDim = d;
    sh.vOffset = uint64_t{2} * 77 * 2 * d;
    refused(sh, DType::BFloat16, "headDim " + std::to_string(d));
  }
  AttentionShape gqa = good(64);
  gqa.qHeads = 6;
  gqa.kvHeads = 4;
  refused(gqa, DType::BFloat16, "qHeads 6 is not a multiple of kvHeads 4");
  refused(good(128), DType::Float16, "dtype");
  AttentionShape v = good(64);
  v.vOffset += 4;
  refused(v, DType::BFloat16, "vOffset");
  AttentionShape ld = good(64);
  ld.ldq = 50;
  refused(ld, DType::BFloat16, "ldq 50 < sq 100");
}

TEST_CASE("attention forward: null and misaligned pointers are refused before any device work") {
  const AttentionShape sh = good(64);
  alignas(16) static uint16_t buf[64];
  float out[4];
  CHECK_THROWS_AS(attentionForward(sh, DType::BFloat16, nullptr, buf, out, nullptr), Error);
  CHECK_THROWS_AS(attentionForward(sh, DType::BFloat16, buf + 1, buf, out, nullptr), Error);
}
