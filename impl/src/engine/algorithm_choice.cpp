// mkernel — the engine's "auto" choice, cached per op, count and dtype: mk::chooseAlgorithm under the engine's
// profile (models/include/mk/algorithms/policy.hpp holds the rule), and the options an op gets when the caller
// leaves them 0.
#include <mutex>
#include <tuple>

#include "engine/engine.hpp"
#include "mk/algorithms/policy.hpp"
#include "mk/cost/cost.hpp"

namespace mk::runtime {

GenOptions EngineSubmission::chooseGenOptions(CollOp op, uint64_t count, DType dtype, Algorithm algo) const {
  CollectiveSpec spec;
  spec.op = op;
  spec.count = count;
  spec.dtype = dtype;
  const auto n = static_cast<uint32_t>(ctx_.ranks.size());
  return defaultGenOptions(op, algo, opBytes(spec, n), n);
}

Algorithm EngineSubmission::chooseAlgorithm(CollOp op, uint64_t count, DType dtype) {
  std::lock_guard<std::mutex> lock(ctx_.mu);
  return chooseAlgorithmLocked(op, count, dtype);
}

Algorithm EngineSubmission::chooseAlgorithmLocked(CollOp op, uint64_t count, DType dtype) {
  const auto key = std::make_tuple(static_cast<int>(op), count, static_cast<int>(dtype));
  auto it = autoCache_.find(key);
  if (it != autoCache_.end()) return it->second;
  const Algorithm best =
      mk::chooseAlgorithm(op, count, dtype, ctx_.topology, static_cast<uint32_t>(ctx_.ranks.size()), ctx_.profile).algo;
  autoCache_.emplace(key, best);
  return best;
}

}  // namespace mk::runtime
