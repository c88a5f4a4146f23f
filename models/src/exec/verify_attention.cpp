// mkernel — ring-attention on the CPU executor against a double reference (verify_attention.hpp has the tolerance).
#include "mk/exec/verify_attention.hpp"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "mk/exec/executor.hpp"
#include "mk/exec/numeric.hpp"
#include "mk/exec/ring_attention_data.hpp"
#include "verify_common.hpp"

namespace mk {

namespace {

/// Store the whole sequence's `global` ([batch][seq][width], as float) into every rank's buffer `buf` from element
/// `at`, as [batch][seq / ranks][width] in the rank's local token order (attention.hpp's placement), in `dtype`.
void scatterTokens(const RingAttentionSpec& spec, uint32_t R, HostMemory& mem, uint16_t buf, uint64_t at, DType dtype,
                   const std::vector<float>& global, uint64_t width) {
  const uint64_t S = spec.seq, L = S / R;
  for (uint32_t r = 0; r < R; ++r)
    for (uint64_t b = 0; b < spec.batch; ++b)
      for (uint64_t t = 0; t < L; ++t) {
        const uint64_t pos = ringAttentionPosition(spec, R, r, t);
        for (uint64_t c = 0; c < width; ++c)
          storeElement(dtype, mem.bytes[r][buf].data(), at + (b * L + t) * width + c,
                       global[(b * S + pos) * width + c]);
      }
}

/// A rank's buffer as RingAttentionData holds it (bytes in the buffer's dtype) into the executor's memory.
void copyBytes(const std::vector<uint8_t>& from, std::vector<std::byte>& to) {
  std::memcpy(to.data(), from.data(), std::min(from.size(), to.size()));
}

/// `n` values uniform in [-1, 1) from `rng`, rounded to `dtype`.
std::vector<float> drawInputs(std::mt19937_64& rng, DType dtype, uint64_t n) {
  std::vector<float> v(n);
  for (float& x : v) x = detail::roundTo(dtype, detail::inputValue(InputKind::Uniform, rng(), 0));
  return v;
}

}  // namespace

VerifyResult verifyRingAttention(const Schedule& s, const RingAttentionSpec& spec, uint64_t seed) {
  const uint32_t R = s.nRanks;
  const RingAttentionData data = makeRingAttentionData(spec, R, seed);
  const uint32_t B = spec.batch, Hq = spec.qHeads, Hkv = spec.kvHeads, D = spec.headDim;
  const uint64_t L = spec.seq / R, outSize = uint64_t{B} * L * Hq * (D + 1);
  const std::string who = "verifyRingAttention";
  const uint16_t qBuf = detail::requireBuffer(s, who, "q", spec.dtype, uint64_t{B} * L * Hq * D);
  const uint16_t kvBuf = detail::requireBuffer(s, who, "kv", spec.dtype, 2 * uint64_t{B} * L * Hkv * D);
  const uint16_t outBuf = detail::requireBuffer(s, who, "out", DType::Float32, outSize);
  HostMemory mem = HostMemory::allocate(s);
  for (uint32_t r = 0; r < R; ++r) {
    copyBytes(data.qBytes[r], mem.bytes[r][qBuf]);
    copyBytes(data.kvBytes[r], mem.bytes[r][kvBuf]);
  }
  execute(s, mem);

  VerifyResult res;
  res.ok = true;
  const double u32 = std::ldexp(1.0, -24);
  const RingAttentionTolerance tol = [&](double want, double lse, bool) {
    return 16.0 * 2 * R * u32 * (1 + std::fabs(lse)) * (1 + std::fabs(want));
  };
  std::vector<float> out(outSize);
  for (uint32_t r = 0; r < R; ++r) {
    std::memcpy(out.data(), mem.bytes[r][outBuf].data(), outSize * sizeof(float));
    checkRingAttentionRank(res, data, r, out.data(), tol);
  }
  if (res.ok) res.detail = "OK";
  return res;
}

VerifyResult verifyRingAttentionBackward(const Schedule& s, const RingAttentionSpec& spec, uint64_t seed) {
  const uint32_t R = s.nRanks;
  validateRingAttentionSpec(spec, R);
  const uint32_t B = spec.batch, Hq = spec.qHeads, Hkv = spec.kvHeads, D = spec.headDim;
  const uint64_t S = spec.seq, L = S / R, group = Hq / Hkv, qRow = uint64_t{Hq} * D, kvRow = uint64_t{Hkv} * D;
  const uint64_t qSize = B * L * qRow, kSize = B * L * kvRow;
  const RingAttentionGradLayout lay = ringAttentionBackwardLayout(spec, R);
  const std::string who = "verifyRingAttentionBackward";
  const uint16_t qdoBuf = detail::requireBuffer(s, who, "qdo", spec.dtype, 2 * qSize);
  const uint16_t kvBuf = detail::requireBuffer(s, who, "kv", spec.dtype, 2 * kSize);
  const uint16_t gradBuf = detail::requireBuffer(s, who, "grad", DType::Float32, lay.size);

  // Q, K and V as the forward's check draws them; dO and the start values from a second stream.
  const RingAttentionData data = makeRingAttentionData(spec, R, seed);
  const std::vector<float>& q = data.q;
  const std::vector<float>& k = data.k;
  const std::vector<float>& v = data.v;
  std::mt19937_64 rng(seed ^ 0x9E3779B97F4A7C15ull);
  const std::vector<float> dO = drawInputs(rng, spec.dtype, B * S * qRow);
  // The accumulators' values before the op: it adds to them.
  const std::vector<float> dq0 = drawInputs(rng, DType::Float32, B * S * qRow);
  const std::vector<float> dk0 = drawInputs(rng, DType::Float32, B * S * kvRow);
  const std::vector<float> dv0 = drawInputs(rng, DType::Float32, B * S * kvRow);

  // The dense reference over the whole sequence, in double: the forward's rows (given to the schedule rounded to
  // float32), then dQ, dK and dV, and for each gradient element the sum of its terms' magnitudes (the scale of its
  // rounding error: P carries the float32 log-sum-exp's error, D = rowsum(dO o O) the float32 O's).
  const double scale = spec.scale > 0 ? spec.scale : defaultAttentionScale(D);
  std::vector<float> rows(B * S * Hq * (D + 1));
  std::vector<double> dq(B * S * qRow), dk(B * S * kvRow), dv(B * S * kvRow);
  std::vector<double> magQ(dq.size()), magK(dk.size()), magV(dv.size());
  std::vector<double> p(S), dp(S), o(D);
  double lseMax = 0;
  for (uint64_t b = 0; b < B; ++b)
    for (uint64_t h = 0; h < Hq; ++h)
      for (uint64_t i = 0; i < S; ++i) {
        const uint64_t kvh = h / group, seen = spec.causal ? i + 1 : S;  // keys 0 .. seen - 1
        const float* qi = &q[(b * S + i) * qRow + h * D];
        const float* doi = &dO[(b * S + i) * qRow + h * D];
        auto key = [&](const std::vector<float>& x, uint64_t j) { return &x[(b * S + j) * kvRow + kvh * D]; };
        double top = -std::numeric_limits<double>::infinity();
        for (uint64_t j = 0; j < seen; ++j) {
          double dot = 0;
          for (uint64_t c = 0; c < D; ++c) dot += double{qi[c]} * key(k, j)[c];
          p[j] = scale * dot;
          top = std::max(top, p[j]);
        }
        double sum = 0;
        for (uint64_t j = 0; j < seen; ++j) sum += std::exp(p[j] - top);
        const double lse = top + std::log(sum);
        lseMax = std::max(lseMax, std::fabs(lse));
        std::fill(o.begin(), o.end(), 0.0);
        for (uint64_t j = 0; j < seen; ++j) {
          p[j] = std::exp(p[j] - lse);
          for (uint64_t c = 0; c < D; ++c) o[c] += p[j] * key(v, j)[c];
        }
        double drow = 0, dabs = 0;
        float* row = &rows[((b * S + i) * Hq + h) * (D + 1)];
        for (uint64_t c = 0; c < D; ++c) {
          row[c] = static_cast<float>(o[c]);
          drow += doi[c] * o[c];
          dabs += std::fabs(doi[c] * o[c]);
        }
        row[D] = static_cast<float>(lse);
        const uint64_t qAt = (b * S + i) * qRow + h * D;
        for (uint64_t j = 0; j < seen; ++j) {
          double dpj = 0;
          for (uint64_t c = 0; c < D; ++c) dpj += double{doi[c]} * key(v, j)[c];
          const double ds = p[j] * (dpj - drow), mag = p[j] * (std::fabs(dpj) + dabs);
          const uint64_t kAt = (b * S + j) * kvRow + kvh * D;
          for (uint64_t c = 0; c < D; ++c) {
            dv[kAt + c] += p[j] * doi[c];
            magV[kAt + c] += p[j] * std::fabs(doi[c]);
            dk[kAt + c] += scale * ds * qi[c];
            magK[kAt + c] += scale * mag * std::fabs(qi[c]);
            dq[qAt + c] += scale * ds * key(k, j)[c];
            magQ[qAt + c] += scale * mag * std::fabs(key(k, j)[c]);
          }
        }
      }

  HostMemory mem = HostMemory::allocate(s);
  for (uint32_t r = 0; r < R; ++r) {
    copyBytes(data.qBytes[r], mem.bytes[r][qdoBuf]);  // Q first, dO after it
    copyBytes(data.kvBytes[r], mem.bytes[r][kvBuf]);
  }
  scatterTokens(spec, R, mem, qdoBuf, qSize, spec.dtype, dO, qRow);
  scatterTokens(spec, R, mem, gradBuf, lay.rows, DType::Float32, rows, uint64_t{Hq} * (D + 1));
  scatterTokens(spec, R, mem, gradBuf, lay.dq, DType::Float32, dq0, qRow);
  scatterTokens(spec, R, mem, gradBuf, lay.dkv, DType::Float32, dk0, kvRow);
  scatterTokens(spec, R, mem, gradBuf, lay.dkv + kSize, DType::Float32, dv0, kvRow);
  execute(s, mem);

  // Each float32 accumulator takes at most 2R additions (one per block pair), each rounding to u x (its start value
  // + the magnitude of its terms); P's relative error is about u x (|lse| + 2) from the float32 log-sum-exp. Eight
  // times that bound: a missing or doubled block pair changes an element by about its magnitude, far beyond it.
  const double u32 = std::ldexp(1.0, -24), factor = 8.0 * (2.0 * R + 8.0 + lseMax) * u32;
  VerifyResult res;
  res.ok = true;
  auto compare = [&](uint32_t r, uint64_t at, uint64_t from, float start, double grad, double mag, const char* name,
                     uint64_t b, uint64_t t, uint64_t pos) {
    const double got = loadElement(DType::Float32, mem.bytes[r][gradBuf].data(), at);
    detail::checkElement(res, got, start + grad, factor * (std::fabs(start) + mag), [&] {
      return "rank " + std::to_string(r) + " " + name + " grad[" + std::to_string(at) + "] (batch " +
             std::to_string(b) + ", token " + std::to_string(t) + " at position " + std::to_string(pos) + ", element " +
             std::to_string(from) + " of the sequence's)";
    });
  };
  for (uint32_t r = 0; r < R; ++r)
    for (uint64_t b = 0; b < B; ++b)
      for (uint64_t t = 0; t < L; ++t) {
        const uint64_t pos = ringAttentionPosition(spec, R, r, t);
        for (uint64_t c = 0; c < qRow; ++c) {
          const uint64_t from = (b * S + pos) * qRow + c;
          compare(r, lay.dq + (b * L + t) * qRow + c, from, dq0[from], dq[from], magQ[from], "dQ", b, t, pos);
        }
        for (uint64_t c = 0; c < kvRow; ++c) {
          const uint64_t from = (b * S + pos) * kvRow + c, at = lay.dkv + (b * L + t) * kvRow + c;
          compare(r, at, from, dk0[from], dk[from], magK[from], "dK", b, t, pos);
          compare(r, at + kSize, from, dv0[from], dv[from], magV[from], "dV", b, t, pos);
        }
      }
  if (res.ok) res.detail = "OK";
  return res;
}

}  // namespace mk
