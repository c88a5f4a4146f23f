// mkernel — ring attention's inputs and double reference (ring_attention_data.hpp).
#include "mk/exec/ring_attention_data.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <string>

#include "mk/exec/numeric.hpp"
#include "verify_common.hpp"

namespace mk {

RingAttentionData makeRingAttentionData(const RingAttentionSpec& spec, uint32_t nRanks, uint64_t seed) {
  validateRingAttentionSpec(spec, nRanks);
  RingAttentionData d;
  d.spec = spec;
  d.nRanks = nRanks;
  const uint32_t B = spec.batch, Hq = spec.qHeads, Hkv = spec.kvHeads, D = spec.headDim;
  const uint64_t S = spec.seq, L = S / nRanks;
  std::mt19937_64 rng(seed);
  auto draw = [&](uint64_t n) {
    std::vector<float> v(n);
    for (float& x : v) x = detail::roundTo(spec.dtype, detail::inputValue(InputKind::Uniform, rng(), 0));
    return v;
  };
  d.q = draw(uint64_t{B} * S * Hq * D);
  d.k = draw(uint64_t{B} * S * Hkv * D);
  d.v = draw(uint64_t{B} * S * Hkv * D);
  const uint64_t es = dtypeSize(spec.dtype), kSize = uint64_t{B} * L * Hkv * D;
  d.qBytes.assign(nRanks, std::vector<uint8_t>(uint64_t{B} * L * Hq * D * es));
  d.kvBytes.assign(nRanks, std::vector<uint8_t>(2 * kSize * es));
  for (uint32_t r = 0; r < nRanks; ++r)
    for (uint64_t b = 0; b < B; ++b)
      for (uint64_t t = 0; t < L; ++t) {
        const uint64_t pos = ringAttentionPosition(spec, nRanks, r, t);
        for (uint64_t c = 0; c < uint64_t{Hq} * D; ++c)
          storeElement(spec.dtype, d.qBytes[r].data(), (b * L + t) * Hq * D + c, d.q[(b * S + pos) * Hq * D + c]);
        for (uint64_t c = 0; c < uint64_t{Hkv} * D; ++c) {
          const uint64_t at = (b * L + t) * Hkv * D + c, from = (b * S + pos) * Hkv * D + c;
          storeElement(spec.dtype, d.kvBytes[r].data(), at, d.k[from]);
          storeElement(spec.dtype, d.kvBytes[r].data(), kSize + at, d.v[from]);
        }
      }
  return d;
}

void checkRingAttentionRank(VerifyResult& res, const RingAttentionData& data, uint32_t rank, const float* out,
                            const RingAttentionTolerance& tol) {
  const RingAttentionSpec& spec = data.spec;
  const uint32_t R = data.nRanks, B = spec.batch, Hq = spec.qHeads, Hkv = spec.kvHeads, D = spec.headDim;
  const uint64_t S = spec.seq, L = S / R, group = Hq / Hkv;
  const double scale = spec.scale > 0 ? spec.scale : defaultAttentionScale(D);
  std::vector<double> score(S), want(D + 1);
  for (uint64_t b = 0; b < B; ++b)
    for (uint64_t t = 0; t < L; ++t)
      for (uint64_t h = 0; h < Hq; ++h) {
        const uint64_t pos = ringAttentionPosition(spec, R, rank, t), kvh = h / group;
        const uint64_t seen = spec.causal ? pos + 1 : S;  // keys 0 .. seen - 1
        double top = -std::numeric_limits<double>::infinity();
        for (uint64_t j = 0; j < seen; ++j) {
          double dot = 0;
          for (uint64_t c = 0; c < D; ++c)
            dot += double{data.q[((b * S + pos) * Hq + h) * D + c]} * data.k[((b * S + j) * Hkv + kvh) * D + c];
          score[j] = scale * dot;
          top = std::max(top, score[j]);
        }
        double sum = 0;
        std::fill(want.begin(), want.end(), 0.0);
        for (uint64_t j = 0; j < seen; ++j) {
          const double w = std::exp(score[j] - top);
          sum += w;
          for (uint64_t c = 0; c < D; ++c) want[c] += w * data.v[((b * S + j) * Hkv + kvh) * D + c];
        }
        for (uint64_t c = 0; c < D; ++c) want[c] /= sum;
        want[D] = top + std::log(sum);
        const uint64_t row = ((b * L + t) * Hq + h) * (D + 1);
        for (uint64_t c = 0; c <= D; ++c)
          detail::checkElement(res, out[row + c], want[c], tol(want[c], want[D], c == D), [&] {
            return "rank " + std::to_string(rank) + " out[" + std::to_string(row + c) + "] (batch " +
                   std::to_string(b) + ", token " + std::to_string(t) + " at position " + std::to_string(pos) +
                   ", head " + std::to_string(h) + (c == D ? ", log-sum-exp)" : ", column " + std::to_string(c) + ")");
          });
      }
}

}  // namespace mk
