// mkernel — the CPU executor's attention step (attention_exec.hpp; the shape and mask are attention.hpp's).
#include "attention_exec.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace mk::detail {

void runAttention(const AttentionShape& sh, const ElementRange& out, const ElementRange& q, const ElementRange& kv) {
  const uint64_t d = sh.headDim, group = sh.qHeads / sh.kvHeads;
  const uint64_t qRow = uint64_t{sh.qHeads} * d, kvRow = uint64_t{sh.kvHeads} * d;
  const uint64_t oRow = uint64_t{sh.qHeads} * sh.outRow();
  std::vector<double> qv(d), score(sh.skv), acc(d);
  for (uint64_t b = 0; b < sh.batch; ++b)
    for (uint64_t i = 0; i < sh.sq; ++i)
      for (uint64_t h = 0; h < sh.qHeads; ++h) {
        const uint64_t qAt = q.offset + (b * sh.ldq + i) * qRow + h * d;
        const uint64_t kAt = kv.offset + b * sh.ldkv * kvRow + (h / group) * d;  // key j at kAt + j * kvRow
        const uint64_t oAt = out.offset + (b * sh.ldo + i) * oRow + h * sh.outRow();
        const uint64_t seen = sh.visibleKeys(i);
        std::fill(acc.begin(), acc.end(), 0.0);
        if (seen == 0) {  // nothing to attend to: no contribution to a later lse-merge
          for (uint64_t c = 0; c < d; ++c) storeElement(out.type, out.base, oAt + c, 0.0f);
          storeElement(out.type, out.base, oAt + d, -std::numeric_limits<float>::infinity());
          continue;
        }
        for (uint64_t c = 0; c < d; ++c) qv[c] = loadElement(q.type, q.base, qAt + c);
        // Two passes: the scores and their maximum, then exp(score - max) weighting V (no overflow for any scale).
        double top = -std::numeric_limits<double>::infinity();
        for (uint64_t j = 0; j < seen; ++j) {
          double dot = 0;
          for (uint64_t c = 0; c < d; ++c) dot += qv[c] * loadElement(kv.type, kv.base, kAt + j * kvRow + c);
          score[j] = static_cast<double>(sh.scale) * dot;
          top = std::max(top, score[j]);
        }
        double sum = 0;
        for (uint64_t j = 0; j < seen; ++j) {
          const double w = std::exp(score[j] - top);
          sum += w;
          const uint64_t vAt = kAt + sh.vOffset + j * kvRow;
          for (uint64_t c = 0; c < d; ++c) acc[c] += w * loadElement(kv.type, kv.base, vAt + c);
        }
        for (uint64_t c = 0; c < d; ++c) storeElement(out.type, out.base, oAt + c, static_cast<float>(acc[c] / sum));
        storeElement(out.type, out.base, oAt + d, static_cast<float>(top + std::log(sum)));
      }
}

void runAttentionGrad(const AttentionShape& sh, const ElementRange& dst, const ElementRange& qdo,
                      const ElementRange& kv, const ElementRange& rows, const ElementRange& dq) {
  const uint64_t d = sh.headDim, group = sh.qHeads / sh.kvHeads;
  const uint64_t qRow = uint64_t{sh.qHeads} * d, kvRow = uint64_t{sh.kvHeads} * d;
  const uint64_t oRow = uint64_t{sh.qHeads} * sh.outRow(), kvBatch = uint64_t{sh.skv} * kvRow;
  const double scale = sh.scale;
  // One batch's dK and dV in double, added to the float32 accumulators once at the end of the batch.
  std::vector<double> qv(d), dov(d), dqAcc(d), dk(kvBatch), dv(kvBatch);
  auto load = [](const ElementRange& r, uint64_t at) { return static_cast<double>(loadElement(r.type, r.base, at)); };
  auto add = [](const ElementRange& r, uint64_t at, double v) {
    storeElement(r.type, r.base, at, static_cast<float>(loadElement(r.type, r.base, at) + v));
  };
  for (uint64_t b = 0; b < sh.batch; ++b) {
    std::fill(dk.begin(), dk.end(), 0.0);
    std::fill(dv.begin(), dv.end(), 0.0);
    for (uint64_t i = 0; i < sh.sq; ++i)
      for (uint64_t h = 0; h < sh.qHeads; ++h) {
        const uint64_t seen = sh.visibleKeys(i);
        if (seen == 0) continue;
        const uint64_t qAt = qdo.offset + (b * sh.ldq + i) * qRow + h * d;
        const uint64_t kAt = kv.offset + b * sh.ldkv * kvRow + (h / group) * d;  // key j at kAt + j * kvRow
        const uint64_t rAt = rows.offset + (b * sh.ldo + i) * oRow + h * sh.outRow();
        const uint64_t gAt = (h / group) * d;  // key j's gradient at gAt + j * kvRow in dk, dv
        const double lse = load(rows, rAt + d);
        if (!std::isfinite(lse)) continue;  // the forward saw no key for this row: it has no gradient
        double drow = 0;
        for (uint64_t c = 0; c < d; ++c) {
          qv[c] = load(qdo, qAt + c);
          dov[c] = load(qdo, qAt + sh.doOffset + c);
          drow += dov[c] * load(rows, rAt + c);
        }
        std::fill(dqAcc.begin(), dqAcc.end(), 0.0);
        for (uint64_t j = 0; j < seen; ++j) {
          const uint64_t kj = kAt + j * kvRow, vj = kj + sh.vOffset;
          double dot = 0, dp = 0;
          for (uint64_t c = 0; c < d; ++c) {
            dot += qv[c] * load(kv, kj + c);
            dp += dov[c] * load(kv, vj + c);
          }
          const double p = std::exp(scale * dot - lse);
          const double ds = p * (dp - drow);
          for (uint64_t c = 0; c < d; ++c) {
            dv[gAt + j * kvRow + c] += p * dov[c];
            dk[gAt + j * kvRow + c] += scale * ds * qv[c];
            dqAcc[c] += scale * ds * load(kv, kj + c);
          }
        }
        const uint64_t dqAt = dq.offset + (b * sh.ldq + i) * qRow + h * d;
        for (uint64_t c = 0; c < d; ++c) add(dq, dqAt + c, dqAcc[c]);
      }
    const uint64_t at = dst.offset + b * sh.ldkv * kvRow;
    for (uint64_t e = 0; e < kvBatch; ++e) {
      add(dst, at + e, dk[e]);
      add(dst, at + sh.vOffset + e, dv[e]);
    }
  }
}

}  // namespace mk::detail
