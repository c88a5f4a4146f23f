// mkernel — the MoE expert FFN on the GPU engine (Communicator::moeFfn; docs/fused-operators.md, "MoE FFN"): the
// moe-ffn schedule (mk/algorithms/moe.hpp) for this communicator's ranks, generated, lowered and uploaded once per
// spec; every step of it (route, notify, gather, the grouped GEMMs with SwiGLU, the return, combine) runs in the
// resident kernel (docs/gpu-engine.md, "MoE steps"), so a whole layer is one op per rank.
#include <cuda_runtime_api.h>

#include <sstream>
#include <string>
#include <vector>

#include "engine/engine.hpp"
#include "mk/algorithms/moe.hpp"
#include "mk/error.hpp"

namespace mk::runtime {
namespace {

std::string specText(const MoeFfnSpec& s) {
  std::ostringstream os;
  os << "moe-ffn E " << s.experts << " topk " << s.topk << " T " << s.tokens << " H " << s.hidden << " F " << s.ffn
     << " capacity " << s.capacityOr() << " weight " << s.computeCtas << " return " << toString(s.combineReturn);
  return os.str();
}

}  // namespace

void checkMoeFfnCall(const MoeFfnSpec& spec, const std::vector<uint32_t>& nodeOf, bool computeLanes) {
  const auto n = static_cast<uint32_t>(nodeOf.size());
  validateMoeFfnSpec(spec, n);  // Error(InvalidArgument) "moe-ffn: ..." naming the field
  if (!computeLanes)
    throw Error(ErrorCode::Unsupported,
                "moeFfn: the communicator has no compute lanes; create it with CommConfig::computeLanes = true (the "
                "grouped GEMMs and the combine run inside the compute-capable resident kernel)");
  for (uint32_t r = 1; r < n; ++r)
    if (nodeOf[r] != nodeOf[0])
      throw Error(ErrorCode::Unsupported,
                  "moeFfn: the ranks span more than one node; the GPU engine runs moe-ffn on one node so far (a "
                  "dispatch across nodes routes per node and returns rows sized at run time through the proxy, which "
                  "the resident kernel does not do yet): replay it with mk-sim --op moe-ffn, or verify it on the CPU "
                  "executor with mk-schedule --op moe-ffn --verify");
}

CachedSchedule& EngineSubmission::moeScheduleLocked(const MoeFfnSpec& spec, ScheduleKey* key) {
  const std::vector<uint32_t> nodeOf = ctx_.topology.layout(static_cast<uint32_t>(ctx_.ranks.size()));
  checkMoeFfnCall(spec, nodeOf, ctx_.config.computeLanes);
  return specScheduleLocked(
      specText(spec), [&] { return generateMoeFfn(spec, nodeOf); }, key);
}

MoeFfnPlan EngineSubmission::moeFfnPlan(int r, const MoeFfnSpec& spec) {
  std::lock_guard<std::mutex> lock(ctx_.mu);
  failures_.throwIfFailedLocked();
  ScheduleKey key;
  const CachedSchedule& cs = moeScheduleLocked(spec, &key);
  MoeFfnPlan plan;
  plan.workerCtas = ctx_.workers;
  countLaneCtas(cs.programs.at(static_cast<size_t>(r)), &plan.computeCtas, &plan.otherCtas);
  return plan;
}

void EngineSubmission::submitMoeFfn(int r, const MoeFfnSpec& spec, const MoeFfnBuffers& io, cudaStream_t stream) {
  std::lock_guard<std::mutex> lock(ctx_.mu);
  failures_.throwIfFailedLocked();
  ScheduleKey key;
  CachedSchedule& cs = moeScheduleLocked(spec, &key);
  submitNamedLocked(r, key, cs,
                    {{"ids", io.ids}, {"x", io.x}, {"w1", io.w1}, {"weights", io.weights}, {"w2", io.w2}, {"y", io.y}},
                    stream);
}

}  // namespace mk::runtime
