// mkernel — internal: the CPU executor's attention step (attention.hpp), on bound host memory.
#pragma once

#include "mk/exec/numeric.hpp"
#include "mk/schedule/attention.hpp"

namespace mk::detail {

/// One attention step: for every (batch, query row, query head) of `sh`, the softmax of the scaled scores against the
/// keys the row sees, times V, in double, then the row's log-sum-exp; written as float32 rows of headDim + 1 at `out`.
/// Q and K / V are read through their dtype (`q`, `kv`; V at kv + vOffset). A row that sees no key gets 0 and -inf.
void runAttention(const AttentionShape& sh, const ElementRange& out, const ElementRange& q, const ElementRange& kv);

/// One attention-grad step (attention.hpp): with P recomputed from the forward's log-sum-exp and D = rowsum(dO o O)
/// from its output, add dV += P^T dO, dK += scale dS^T Q and dQ += scale dS K (dS = P o (dO V^T - D)), each summed in
/// double over the whole block and added to the float32 accumulators once (dK / dV summed over a KV head's query
/// heads). `qdo` is Q with dO at doOffset, `kv` K with V at vOffset, `dst` dK with dV at vOffset; `rows` and `dq` are
/// the forward's rows and dQ (the offsets already resolved from rowsAt and dqAt).
void runAttentionGrad(const AttentionShape& sh, const ElementRange& dst, const ElementRange& qdo,
                      const ElementRange& kv, const ElementRange& rows, const ElementRange& dq);

}  // namespace mk::detail
