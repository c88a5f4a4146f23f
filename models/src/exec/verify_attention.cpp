// mkernel — ring-attention on the CPU executor against a double reference (verify_attention.hpp has the tolerance).
#include "mk/exec/verify_attention.hpp"

#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "mk/exec/executor.hpp"
#include "mk/exec/numeric.hpp"
#include "verify_common.hpp"

namespace mk {

VerifyResult verifyRingAttention(const Schedule& s, const RingAttentionSpec& spec, uint64_t seed) {
  const uint32_t R = s.nRanks;
  validateRingAttentionSpec(spec, R);
  const uint32_t B = spec.batch, Hq = spec.qHeads, Hkv = spec.kvHeads, D = spec.headDim;
  const uint64_t S = spec.seq, L = S / R, group = Hq / Hkv;
  const std::string who = "verifyRingAttention";
  const uint16_t qBuf = detail::requireBuffer(s, who, "q", spec.dtype, uint64_t{B} * L * Hq * D);
  const uint16_t kvBuf = detail::requireBuffer(s, who, "kv", spec.dtype, 2 * uint64_t{B} * L * Hkv * D);
  const uint16_t outBuf = detail::requireBuffer(s, who, "out", DType::Float32, uint64_t{B} * L * Hq * (D + 1));

  // The whole sequence: q[b][pos][h][d], k and v [b][pos][kvh][d], rounded to the dtype once.
  std::mt19937_64 rng(seed);
  auto draw = [&](uint64_t n) {
    std::vector<float> v(n);
    for (float& x : v) x = detail::roundTo(spec.dtype, detail::inputValue(InputKind::Uniform, rng(), 0));
    return v;
  };
  const std::vector<float> q = draw(uint64_t{B} * S * Hq * D), k = draw(uint64_t{B} * S * Hkv * D),
                           v = draw(uint64_t{B} * S * Hkv * D);
  HostMemory mem = HostMemory::allocate(s);
  const uint64_t kSize = uint64_t{B} * L * Hkv * D;
  for (uint32_t r = 0; r < R; ++r)
    for (uint64_t b = 0; b < B; ++b)
      for (uint64_t t = 0; t < L; ++t) {
        const uint64_t pos = ringAttentionPosition(spec, R, r, t);
        for (uint64_t c = 0; c < uint64_t{Hq} * D; ++c)
          storeElement(spec.dtype, mem.bytes[r][qBuf].data(), (b * L + t) * Hq * D + c, q[(b * S + pos) * Hq * D + c]);
        for (uint64_t c = 0; c < uint64_t{Hkv} * D; ++c) {
          const uint64_t at = (b * L + t) * Hkv * D + c, from = (b * S + pos) * Hkv * D + c;
          storeElement(spec.dtype, mem.bytes[r][kvBuf].data(), at, k[from]);
          storeElement(spec.dtype, mem.bytes[r][kvBuf].data(), kSize + at, v[from]);
        }
      }
  execute(s, mem);

  VerifyResult res;
  res.ok = true;
  const double scale = spec.scale > 0 ? spec.scale : defaultAttentionScale(D);
  const double u32 = std::ldexp(1.0, -24);
  std::vector<double> score(S), want(D + 1);
  for (uint32_t r = 0; r < R; ++r)
    for (uint64_t b = 0; b < B; ++b)
      for (uint64_t t = 0; t < L; ++t)
        for (uint64_t h = 0; h < Hq; ++h) {
          const uint64_t pos = ringAttentionPosition(spec, R, r, t), kvh = h / group;
          const uint64_t seen = spec.causal ? pos + 1 : S;  // keys 0 .. seen - 1
          double top = -std::numeric_limits<double>::infinity();
          for (uint64_t j = 0; j < seen; ++j) {
            double dot = 0;
            for (uint64_t c = 0; c < D; ++c)
              dot += double{q[((b * S + pos) * Hq + h) * D + c]} * k[((b * S + j) * Hkv + kvh) * D + c];
            score[j] = scale * dot;
            top = std::max(top, score[j]);
          }
          double sum = 0;
          std::fill(want.begin(), want.end(), 0.0);
          for (uint64_t j = 0; j < seen; ++j) {
            const double w = std::exp(score[j] - top);
            sum += w;
            for (uint64_t c = 0; c < D; ++c) want[c] += w * v[((b * S + j) * Hkv + kvh) * D + c];
          }
          for (uint64_t c = 0; c < D; ++c) want[c] /= sum;
          want[D] = top + std::log(sum);
          const uint64_t row = ((b * L + t) * Hq + h) * (D + 1);
          const double lseScale = 1 + std::fabs(want[D]);
          for (uint64_t c = 0; c <= D; ++c) {
            const double got = loadElement(DType::Float32, mem.bytes[r][outBuf].data(), row + c);
            detail::checkElement(res, got, want[c], 16.0 * 2 * R * u32 * lseScale * (1 + std::fabs(want[c])), [&] {
              return "rank " + std::to_string(r) + " out[" + std::to_string(row + c) + "] (batch " + std::to_string(b) +
                     ", token " + std::to_string(t) + " at position " + std::to_string(pos) + ", head " +
                     std::to_string(h) + (c == D ? ", log-sum-exp)" : ", column " + std::to_string(c) + ")");
            });
          }
        }
  if (res.ok) res.detail = "OK";
  return res;
}

}  // namespace mk
