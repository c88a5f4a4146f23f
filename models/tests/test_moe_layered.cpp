// moe-ffn's layered baseline (generateMoeFfnLayered, mk/algorithms/moe.hpp) on the CPU executor: the dispatch op, the
// expert GEMMs computed here as the executor computes the fused op's (float dots in k order, SwiGLU rounded once to
// bf16, o in float32), then the combine op, give the fused schedule's y bit for bit; the dispatch's counts are the
// routing's and its blocks hold the routed tokens. Both ops validate (races included) and refuse what they cannot do.
#include <doctest/doctest.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "expect_error.hpp"
#include "mk/algorithms/moe.hpp"
#include "mk/error.hpp"
#include "mk/exec/executor.hpp"
#include "mk/exec/numeric.hpp"
#include "mk/exec/verify_moe.hpp"
#include "mk/schedule/validate.hpp"
#include "moe_ffn_case.hpp"

using namespace mk;

namespace {

uint16_t buf(const Schedule& s, const char* name) {
  const int b = s.bufferIndex(name);
  REQUIRE_MESSAGE(b >= 0, "no buffer " << name);
  return static_cast<uint16_t>(b);
}

/// Fill `name` of every rank of `mem` (laid out for `s`) from per-rank float values, stored as the buffer's dtype.
void fill(const Schedule& s, HostMemory& mem, const char* name, const std::vector<std::vector<float>>& v) {
  const uint16_t b = buf(s, name);
  for (uint32_t r = 0; r < s.nRanks; ++r)
    for (uint64_t i = 0; i < v[r].size(); ++i) storeElement(s.buffers[b].dtype, mem.bytes[r][b].data(), i, v[r][i]);
}

void fillIds(const Schedule& s, HostMemory& mem, const MoeIds& ids) {
  const uint16_t b = buf(s, "ids");
  for (uint32_t r = 0; r < s.nRanks; ++r) std::copy(ids[r].begin(), ids[r].end(), mem.as<int32_t>(r, b));
}

/// C = A x B (m x n, k inner) as the executor's gemm step computes it: dense float rows, each dot in k order.
std::vector<float> dots(const std::vector<float>& a, const std::vector<float>& b, uint64_t m, uint64_t n, uint64_t k) {
  std::vector<float> c(m * n);
  for (uint64_t i = 0; i < m; ++i)
    for (uint64_t j = 0; j < n; ++j) {
      float acc = 0.0f;
      for (uint64_t kk = 0; kk < k; ++kk) acc += a[i * k + kk] * b[kk * n + j];
      c[i * n + j] = acc;
    }
  return c;
}

}  // namespace

TEST_CASE("moe-ffn layered: dispatch, standalone GEMMs and combine give the fused op's y bit for bit") {
  uint64_t seed = 11;
  for (const uint32_t R : {1u, 2u, 3u})
    for (const auto routing : {MoeRouting::Uniform, MoeRouting::Skewed}) {
      MoeFfnSpec spec = test::ffnSpec(2, 2, 37);  // hidden 16, ffn 8
      spec.hidden = 24;
      spec.ffn = 16;
      const uint32_t E = spec.experts, T = spec.tokens, H = spec.hidden, F = spec.ffn, K = spec.topk, G = R * E;
      const uint32_t C = spec.capacityOr();
      INFO("ranks " << R << " routing " << std::string(routing == MoeRouting::Uniform ? "uniform" : "skewed"));
      const std::vector<uint32_t> nodeOf(R, 0);
      const Schedule fused = generateMoeFfn(spec, nodeOf);
      const MoeFfnLayered lay = generateMoeFfnLayered(spec, nodeOf);
      REQUIRE(validate(lay.dispatch).empty());
      REQUIRE(validate(lay.combine).empty());
      CHECK(lay.dispatch.info.algo == "layered-dispatch");
      CHECK(lay.combine.info.algo == "layered-combine");
      // What the caller binds, in order.
      auto names = [](const Schedule& s, BufferKind kind) {
        std::string out;
        for (const BufferDecl& d : s.buffers)
          if (d.kind == kind) out += (out.empty() ? "" : " ") + d.name;
        return out;
      };
      CHECK(names(lay.dispatch, BufferKind::Input) == "ids x");
      CHECK(names(lay.dispatch, BufferKind::Output) == "counts recv");
      CHECK(names(lay.combine, BufferKind::Input) == "ids counts weights o");
      CHECK(names(lay.combine, BufferKind::Output) == "y");

      const MoeIds ids = moeRouting(spec.dispatch(), R, routing, seed++);
      std::mt19937_64 rng(seed++);
      std::uniform_real_distribution<float> uni(-1.f, 1.f), unit(0.f, 1.f);
      auto draw = [&](uint64_t n, bool weights) {
        std::vector<std::vector<float>> v(R, std::vector<float>(n));
        for (auto& rank : v)
          for (float& x : rank) {
            x = weights ? unit(rng) : uni(rng);
            if (!weights) {  // a bf16 value, as the executor holds it
              uint16_t bits = 0;
              storeElement(DType::BFloat16, &bits, 0, x);
              x = loadElement(DType::BFloat16, &bits, 0);
            }
          }
        return v;
      };
      const auto x = draw(uint64_t{T} * H, false), w1 = draw(uint64_t{E} * H * 2 * F, false),
                 w2 = draw(uint64_t{E} * F * H, false), rw = draw(uint64_t{T} * K, true);

      HostMemory fm = HostMemory::allocate(fused);
      fillIds(fused, fm, ids);
      fill(fused, fm, "x", x);
      fill(fused, fm, "w1", w1);
      fill(fused, fm, "w2", w2);
      fill(fused, fm, "weights", rw);
      execute(fused, fm);

      HostMemory dm = HostMemory::allocate(lay.dispatch);
      fillIds(lay.dispatch, dm, ids);
      fill(lay.dispatch, dm, "x", x);
      execute(lay.dispatch, dm);
      const uint16_t kCounts = buf(lay.dispatch, "counts"), kRecv = buf(lay.dispatch, "recv");

      HostMemory cm = HostMemory::allocate(lay.combine);
      fillIds(lay.combine, cm, ids);
      fill(lay.combine, cm, "weights", rw);
      const uint16_t kO = buf(lay.combine, "o");
      for (uint32_t d = 0; d < R; ++d) {
        const int32_t* counts = dm.as<int32_t>(d, kCounts);
        std::copy(counts, counts + G, cm.as<int32_t>(d, buf(lay.combine, "counts")));
        for (uint32_t s = 0; s < R; ++s)
          for (uint32_t e = 0; e < E; ++e) {
            // The routing's count: tokens of s naming d's expert e.
            uint32_t want = 0;
            for (uint32_t t = 0; t < T; ++t)
              for (uint32_t k = 0; k < K; ++k) want += ids[s][uint64_t{t} * K + k] == int32_t(d * E + e);
            const uint32_t g = s * E + e, m = static_cast<uint32_t>(counts[g]);
            REQUIRE(m == want);
            // Its rows: the tokens in order.
            std::vector<float> a(uint64_t{m} * H), b1(uint64_t{H} * 2 * F), b2(uint64_t{F} * H);
            uint32_t row = 0;
            for (uint32_t t = 0; t < T && row < m; ++t) {
              bool named = false;
              for (uint32_t k = 0; k < K; ++k) named |= ids[s][uint64_t{t} * K + k] == int32_t(d * E + e);
              if (!named) continue;
              for (uint32_t h = 0; h < H; ++h) {
                const float got =
                    loadElement(DType::BFloat16, dm.bytes[d][kRecv].data(), (uint64_t{g} * C + row) * H + h);
                a[uint64_t{row} * H + h] = got;
                CHECK(got == loadElement(DType::BFloat16, fm.bytes[s][buf(fused, "x")].data(), uint64_t{t} * H + h));
              }
              ++row;
            }
            for (uint64_t i = 0; i < b1.size(); ++i) b1[i] = w1[d][uint64_t{e} * H * 2 * F + i];
            for (uint64_t i = 0; i < b2.size(); ++i) b2[i] = w2[d][uint64_t{e} * F * H + i];
            // GEMM 1 with the SwiGLU epilogue, rounded once to bf16; GEMM 2 into float32.
            const std::vector<float> up = dots(a, b1, m, 2 * F, H);
            std::vector<float> hrow(uint64_t{m} * F);
            for (uint64_t i = 0; i < m; ++i)
              for (uint64_t f = 0; f < F; ++f) {
                uint16_t bits = 0;
                storeElement(DType::BFloat16, &bits, 0, swiglu(up[i * 2 * F + 2 * f], up[i * 2 * F + 2 * f + 1]));
                hrow[i * F + f] = loadElement(DType::BFloat16, &bits, 0);
              }
            const std::vector<float> o = dots(hrow, b2, m, H, F);
            std::copy(o.begin(), o.end(), cm.as<float>(d, kO) + uint64_t{g} * C * H);
          }
      }
      execute(lay.combine, cm);
      uint64_t differ = 0;
      for (uint32_t r = 0; r < R; ++r) {
        const float* yF = fm.as<float>(r, buf(fused, "y"));
        const float* yL = cm.as<float>(r, buf(lay.combine, "y"));
        for (uint64_t i = 0; i < uint64_t{T} * H; ++i) {
          if (yF[i] != yL[i] && differ < 3)
            MESSAGE("rank " << r << " element " << i << ": fused " << yF[i] << ", layered " << yL[i]);
          differ += yF[i] != yL[i];
        }
      }
      CHECK(differ == 0);
    }
}

TEST_CASE("moe-ffn layered: ranks on two nodes and a bad spec are refused") {
  MoeFfnSpec spec = test::ffnSpec(2, 2, 8);
  test::expectError(
      [&] {
        generateMoeFfnLayered(spec, {0, 1});
      },
      ErrorCode::Unsupported, "the layered baseline is cut for one node");
  spec.ffn = 12;
  test::expectError([&] { generateMoeFfnLayered(spec, {0, 0}); }, ErrorCode::InvalidArgument, "moe-ffn: ffn");
}
