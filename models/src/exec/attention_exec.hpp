// mkernel — internal: the CPU executor's attention step (attention.hpp), on bound host memory.
#pragma once

#include "mk/exec/numeric.hpp"
#include "mk/schedule/attention.hpp"

namespace mk::detail {

/// One attention step: for every (batch, query row, query head) of `sh`, the softmax of the scaled scores against the
/// keys the row sees, times V, in double, then the row's log-sum-exp; written as float32 rows of headDim + 1 at `out`.
/// Q and K / V are read through their dtype (`q`, `kv`; V at kv + vOffset). A row that sees no key gets 0 and -inf.
void runAttention(const AttentionShape& sh, const ElementRange& out, const ElementRange& q, const ElementRange& kv);

}  // namespace mk::detail
