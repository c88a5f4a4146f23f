// mkernel — the engine's "auto" choice: the generator whose closed form is fastest under the engine's profile
// (cached per op, count and dtype), and the generator options an op gets when the caller leaves them 0.
#include <cmath>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "engine/engine.hpp"
#include "engine/gen_defaults.hpp"
#include "mk/cost/cost.hpp"
#include "mk/error.hpp"

namespace mk::runtime {

GenOptions Engine::chooseGenOptions(CollOp op, uint64_t count, DType dtype, const std::string& algo) const {
  CollectiveSpec spec;
  spec.op = op;
  spec.count = count;
  spec.dtype = dtype;
  const auto n = static_cast<uint32_t>(ranks_.size());
  return defaultGenOptions(op, algo, opBytes(spec, n), n);
}

std::string Engine::chooseAlgorithm(CollOp op, uint64_t count, DType dtype) {
  std::lock_guard<std::mutex> lock(mu_);
  return chooseAlgorithmLocked(op, count, dtype);
}

std::string Engine::chooseAlgorithmLocked(CollOp op, uint64_t count, DType dtype) {
  const auto key = std::make_tuple(static_cast<int>(op), count, static_cast<int>(dtype));
  auto it = autoCache_.find(key);
  if (it != autoCache_.end()) return it->second;
  const std::vector<std::string> algos = algorithmsFor(op);
  if (algos.empty()) throw Error(ErrorCode::NotFound, std::string("no generator exists for ") + toString(op));
  const Profile& profile = profile_;
  std::string best;
  double bestUs = 0;
  for (const auto& a : algos) {
    CollectiveSpec spec;
    spec.op = op;
    spec.algo = a;
    spec.count = count;
    spec.dtype = dtype;
    try {
      const double t = closedForm(spec, chooseGenOptions(op, count, dtype, a), topology_,
                                  static_cast<uint32_t>(ranks_.size()), profile).totalUs;
      if (std::isfinite(t) && (best.empty() || t < bestUs)) {
        best = a;
        bestUs = t;
      }
    } catch (const Error&) {
      // No closed form for this generator (or it does not apply here): not a candidate.
    }
  }
  if (best.empty()) best = algos.front();
  autoCache_.emplace(key, best);
  return best;
}

}  // namespace mk::runtime
