// CPU-side tests of the attention forward engine's host API (mk/attention.hpp): what it refuses before any device
// work, each reason naming the argument. No GPU needed (the refusals come before any CUDA call).
#include <doctest/doctest.h>

#include <algorithm>
#include <random>
#include <string>
#include <vector>

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

TEST_CASE("attention forward: units run exactly the key tiles their rows see, unmasked tiles are seen whole") {
  // For random shapes (causal with offsets either way, odd lengths), every unit's kvTiles is the smallest tile count
  // that holds every key some row of the unit sees, and a tile attentionTileNeedsMask calls whole is seen whole by
  // every row of the unit (rows past sq do not count; keys past skv are never whole).
  std::mt19937 rng(38);
  for (int trial = 0; trial < 300; ++trial) {
    AttentionShape sh = good(trial % 2 ? 64 : 128);
    sh.batch = 1 + static_cast<uint32_t>(rng() % 2);
    sh.qHeads = 2;
    sh.kvHeads = 1;
    sh.sq = sh.ldq = sh.ldo = 1 + static_cast<uint32_t>(rng() % 400);
    sh.skv = sh.ldkv = 1 + static_cast<uint32_t>(rng() % 500);
    sh.vOffset = uint64_t{sh.batch} * sh.ldkv * sh.kvHeads * sh.headDim;
    sh.causal = trial % 3 != 0;
    sh.qPos = rng() % 600;
    sh.kvPos = rng() % 600;
    REQUIRE(attentionForwardProblem(sh, DType::BFloat16).empty());
    const device::AttentionParams p = attentionWorkParams(sh);
    CHECK(p.units == sh.batch * sh.qHeads * ((sh.sq + 127) / 128));
    std::vector<uint32_t> seenUnits(p.units, 0);
    for (uint32_t u = 0; u < p.units; ++u) {
      const device::AttentionUnit un = device::attentionUnit(p, u);
      REQUIRE(un.b < sh.batch);
      REQUIRE(un.h < sh.qHeads);
      REQUIRE(un.m0 < sh.sq);
      ++seenUnits[(un.m0 / 128) * sh.batch * sh.qHeads + un.b * sh.qHeads + un.h];
      uint64_t most = 0;  // keys the unit's rows see: a prefix, the last row's the longest
      for (uint64_t i = un.m0; i < std::min<uint64_t>(un.m0 + 128, sh.sq); ++i)
        most = std::max(most, sh.visibleKeys(i));
      CHECK(un.kvTiles == (most + 127) / 128);
      for (uint32_t t = 0; t < un.kvTiles; ++t) {
        if (device::attentionTileNeedsMask(p, un, t)) continue;
        for (uint64_t i = un.m0; i < std::min<uint64_t>(un.m0 + 128, sh.sq); ++i)
          REQUIRE(sh.visibleKeys(i) >= uint64_t{t} * 128 + 128);
      }
    }
    for (uint32_t c : seenUnits) CHECK(c == 1);  // every (tile, batch, head) exactly once
  }
}
