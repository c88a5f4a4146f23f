// mkernel — moe-dispatch-gemm on the CPU executor against an FP32 reference (verify_moe.hpp has the tolerance).
#include "mk/exec/verify_moe.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "mk/error.hpp"
#include "mk/exec/executor.hpp"
#include "mk/exec/numeric.hpp"
#include "verify_moe_common.hpp"

namespace mk {

namespace {

uint16_t requireBuffer(const Schedule& s, const char* name, DType dtype, uint64_t want) {
  return detail::requireBuffer(s, "verifyMoeDispatchGemm", name, dtype, want);
}

}  // namespace

MoeIds moeRouting(const MoeDispatchGemmSpec& spec, uint32_t nRanks, MoeRouting routing, uint64_t seed) {
  validateMoeDispatchGemmSpec(spec, nRanks);
  const uint32_t G = nRanks * spec.experts, K = spec.topk;
  std::mt19937_64 rng(seed);
  MoeIds ids(nRanks);
  const auto hot = static_cast<uint32_t>(rng() % G);
  std::vector<int32_t> all(G);
  for (uint32_t r = 0; r < nRanks; ++r)
    for (uint32_t t = 0; t < spec.tokens; ++t) {
      if (routing == MoeRouting::Skewed) {
        for (uint32_t k = 0; k < K; ++k) ids[r].push_back(static_cast<int32_t>((hot + k) % G));
        continue;
      }
      // A partial Fisher-Yates shuffle from the raw 64-bit stream (std distributions differ between libraries).
      std::iota(all.begin(), all.end(), 0);
      for (uint32_t k = 0; k < K; ++k) {
        std::swap(all[k], all[k + rng() % (G - k)]);
        ids[r].push_back(all[k]);
      }
    }
  return ids;
}

VerifyResult verifyMoeDispatchGemm(const Schedule& s, const MoeDispatchGemmSpec& spec, uint64_t seed,
                                   MoeRouting routing, const MoeIds& given, ExecStats* stats) {
  const uint32_t R = s.nRanks;
  validateMoeDispatchGemmSpec(spec, R);
  const uint32_t E = spec.experts, K = spec.topk, T = spec.tokens, H = spec.hidden, N = spec.outCols;
  const uint32_t C = spec.capacityOr(), G = R * E;
  const uint16_t idsBuf = requireBuffer(s, "ids", DType::Int32, uint64_t{T} * K);
  const uint16_t xBuf = requireBuffer(s, "x", DType::BFloat16, uint64_t{T} * H);
  const uint16_t wBuf = requireBuffer(s, "w", DType::BFloat16, uint64_t{E} * H * N);
  const uint16_t outBuf = requireBuffer(s, "out", DType::Float32, uint64_t{G} * C * N);
  const MoeIds ids = detail::moeIdsFor(s, spec, seed, routing, given, "verifyMoeDispatchGemm");

  HostMemory mem = HostMemory::allocate(s);
  std::mt19937_64 rng(seed ^ 0x9E3779B97F4A7C15ull);
  detail::fillMoeInputs(mem, s, ids, idsBuf, {xBuf, wBuf}, rng);
  for (uint32_t r = 0; r < R; ++r) {
    uint32_t* out = mem.as<uint32_t>(r, outBuf);
    std::fill(out, out + s.buffers[outBuf].count[r], detail::kMoeSentinel);
  }
  const ExecStats moved = execute(s, mem);
  if (stats) *stats = moved;

  VerifyResult res;
  res.ok = true;
  const double u32 = std::ldexp(1.0, -24);
  for (uint32_t src = 0; src < R; ++src) {
    // The reference's own layout: the tokens of `src` per global expert, ascending.
    std::vector<std::vector<uint32_t>> tokensOf(G);
    for (uint32_t t = 0; t < T; ++t)
      for (uint32_t k = 0; k < K; ++k) tokensOf[static_cast<uint32_t>(ids[src][uint64_t{t} * K + k])].push_back(t);
    const uint16_t* xs = mem.as<uint16_t>(src, xBuf);
    for (uint32_t j = 0; j < G; ++j) {
      const uint32_t d = j / E, e = j % E;
      const uint16_t* we = mem.as<uint16_t>(d, wBuf) + uint64_t{e} * H * N;
      const uint64_t base = (uint64_t{src} * E + e) * C * N;
      const float* o = mem.as<float>(d, outBuf) + base;
      for (uint32_t i = 0; i < C; ++i)
        for (uint32_t c = 0; c < N; ++c) {
          auto where = [&] {
            return "rank " + std::to_string(d) + " out[" + std::to_string(base + uint64_t{i} * N + c) +
                   "] (from rank " + std::to_string(src) + ", expert " + std::to_string(e) + ", row " +
                   std::to_string(i) + ")";
          };
          const float got = o[uint64_t{i} * N + c];
          if (i >= tokensOf[j].size()) {
            uint32_t bits;
            std::memcpy(&bits, &got, sizeof bits);
            ++res.checked;
            if (bits != detail::kMoeSentinel && res.ok) {
              res.ok = false;
              res.detail = where() + ": written past the block's count " + std::to_string(tokensOf[j].size()) +
                           " (got " + std::to_string(got) + ")";
            }
            continue;
          }
          double want = 0, mag = 0;
          const uint64_t row = uint64_t{tokensOf[j][i]} * H;
          for (uint32_t k = 0; k < H; ++k) {
            const double p = double(bf16ToFloat(xs[row + k])) * bf16ToFloat(we[uint64_t{k} * N + c]);
            want += p;
            mag += std::fabs(p);
          }
          detail::checkElement(res, got, want, (H + 1) * u32 * mag + detail::subnormalHalfStep(DType::Float32), where);
        }
    }
  }
  if (res.ok) res.detail = "OK";
  return res;
}

}  // namespace mk
