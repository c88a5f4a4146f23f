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

}  // namespace mk::detail
