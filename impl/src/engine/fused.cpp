// mkernel — the fused operators on the GPU engine (docs/fused-operators.md): a fused call is planned (planFused under
// the engine's topology and profile, the split dividing this communicator's worker CTAs), generated, lowered and
// uploaded once per FusedKey like a collective, and bound buffer by buffer (a, b and c are three user pointers);
// execute() with several inputs or outputs binds a caller's own schedule the same way.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <mutex>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "engine/engine.hpp"
#include "engine/fused_args.hpp"
#include "gemm/gemm_lane.hpp"
#include "mk/error.hpp"
#include "mk/schedule/pack.hpp"
#include "mk/schedule/validate.hpp"

namespace mk::runtime {

FusedPlan EngineSubmission::fusedPlan(const FusedSpec& spec, const FusedOptions& opt) {
  std::lock_guard<std::mutex> lock(ctx_.mu);
  return fusedPlanLocked(spec, opt);
}

FusedPlan EngineSubmission::fusedPlanLocked(const FusedSpec& spec, const FusedOptions& opt) {
  // planFused searches every split under the closed form (milliseconds): once per requested (spec, options).
  const FusedKey req = FusedKey::of(spec, opt);
  auto it = fusedPlans_.find(req);
  if (it != fusedPlans_.end()) return it->second;
  const FusedPlan plan = planFusedCall(spec, opt, ctx_.topology, static_cast<uint32_t>(ctx_.ranks.size()), ctx_.profile,
                                       ctx_.workers, ctx_.config.computeLanes);
  fusedPlans_.emplace(req, plan);
  return plan;
}

void EngineSubmission::submitFused(int r, const FusedSpec& spec, const FusedOptions& opt, const void* a, const void* b,
                                   void* c, cudaStream_t stream) {
  std::lock_guard<std::mutex> lock(ctx_.mu);
  failures_.throwIfFailedLocked();
  requireCollectiveLayout();
  const uint32_t n = static_cast<uint32_t>(ctx_.ranks.size());
  const FusedPlan plan = fusedPlanLocked(spec, opt);
  checkFusedOperands(spec, n, static_cast<uint32_t>(r), a, b, c);
  const ScheduleKey key = ScheduleKey::fusedOp(plan.spec, plan.opt);
  std::string what;
  if (cache_.find(key) == cache_.end()) {
    std::ostringstream w;
    w << toString(spec.op) << ' ' << toString(spec.dtype) << ' ' << spec.m << " x " << spec.n << " x " << spec.k
      << " B " << toString(spec.layoutB) << " tile " << plan.opt.tileRows << ' ' << toString(plan.opt.order) << " ctas "
      << plan.opt.ctas << " comm " << plan.opt.commCtas << " lanes " << plan.opt.computeLanes;
    what = w.str();
  }
  CachedSchedule& cs = cacheLocked(
      key,
      [&] {
        Schedule s = generate(plan.spec, ctx_.topology.layout(n), plan.opt);
        ValidateOptions vo;
        vo.checkRaces = false;  // the generators' tests prove race freedom; this checks the shape we rely on
        validate(s, vo);
        return s;
      },
      what);
  std::vector<uint64_t> bind(cs.schedule.buffers.size(), 0);
  const std::pair<const char*, const void*> named[3] = {{"a", a}, {"b", b}, {"c", c}};
  for (const auto& [name, p] : named) {
    const int idx = cs.schedule.bufferIndex(name);
    if (idx < 0) throw Error(ErrorCode::Internal, what + ": the generated schedule has no buffer '" + name + "'");
    bind[static_cast<size_t>(idx)] = reinterpret_cast<uint64_t>(p);
  }
  submitBoundLocked(r, key, cs, bind, stream);
}

void EngineSubmission::submitScheduleBound(int r, const Schedule& s, const std::vector<const void*>& inputs,
                                           const std::vector<void*>& outputs, cudaStream_t stream,
                                           const uint64_t* extentWords) {
  std::lock_guard<std::mutex> lock(ctx_.mu);
  failures_.throwIfFailedLocked();
  requireSameNodes(s);
  if (extentWords && s.extents.empty())
    throw Error(ErrorCode::InvalidArgument,
                "execute: extent words were given but the schedule declares no runtime extents (pass null)");
  if (reinterpret_cast<uintptr_t>(extentWords) % alignof(uint64_t) != 0)
    throw Error(ErrorCode::InvalidArgument, "execute: the extent words must be 8-byte aligned device memory");
  if (inputs.empty() || outputs.empty())
    throw Error(ErrorCode::InvalidArgument,
                "execute: the lists of inputs and outputs must each name at least one "
                "pointer (the last one binds every further buffer of its kind)");
  const std::vector<uint8_t> image = pack(s);
  const ScheduleKey key = ScheduleKey::customImage(fnv1a(image.data(), image.size()), image.size());
  const std::string what = "custom schedule '" + s.info.op + (s.info.algo.empty() ? "" : " " + s.info.algo) + "'";
  CachedSchedule& cs = cacheLocked(
      key, [&] { return s; }, what);
  std::vector<uint64_t> bind(s.buffers.size(), 0);
  size_t nIn = 0, nOut = 0;
  for (size_t b = 0; b < s.buffers.size(); ++b) {
    const BufferKind k = s.buffers[b].kind;
    if (k == BufferKind::Input) bind[b] = reinterpret_cast<uint64_t>(inputs[std::min(nIn++, inputs.size() - 1)]);
    if (k == BufferKind::Output || k == BufferKind::InOut)
      bind[b] = reinterpret_cast<uint64_t>(outputs[std::min(nOut++, outputs.size() - 1)]);
  }
  if (!s.extents.empty()) bind.push_back(reinterpret_cast<uint64_t>(extentWords));  // finalize.cpp binds it
  submitBoundLocked(r, key, cs, bind, stream);
}

void EngineSubmission::submitBoundLocked(int r, const ScheduleKey& key, CachedSchedule& cs,
                                         const std::vector<uint64_t>& bind, cudaStream_t stream) {
  const Schedule& s = cs.schedule;
  // The user byte ranges of this rank (the fence rule) and the first input and output: what the post board of
  // one process per GPU carries for peers, and what in-place staging would look at (refused here instead: the
  // bound buffers are read while the outputs are written).
  std::vector<std::pair<uintptr_t, uintptr_t>> reads, writes;
  const void* firstIn = nullptr;
  void* firstOut = nullptr;
  for (size_t b = 0; b < s.buffers.size(); ++b) {
    const BufferDecl& d = s.buffers[b];
    if (d.kind == BufferKind::Scratch || bind[b] == 0) continue;
    const uint64_t bytes = static_cast<size_t>(r) < d.count.size() ? d.count[r] * dtypeSize(d.dtype) : 0;
    const bool in = d.kind == BufferKind::Input;
    (in ? reads : writes).emplace_back(bind[b], bind[b] + bytes);
    if (in && !firstIn) firstIn = reinterpret_cast<const void*>(bind[b]);
    if (!in && !firstOut) firstOut = reinterpret_cast<void*>(bind[b]);
  }
  for (const auto& w : writes)
    for (const auto& x : reads)
      if (w.first < x.second && x.first < w.second)
        throw Error(ErrorCode::InvalidArgument, cs.what + ": rank " + std::to_string(r) +
                                                    ": an output overlaps an input (bound buffers are not staged; "
                                                    "pass separate memory)");
  checkComputeOperands(cs.programs[static_cast<size_t>(r)], static_cast<uint32_t>(r), bind);
  // send / recv of submitLocked carry only the first input and output (in-place staging never applies: no
  // overlap); every range goes to the fence rule through `reads` / `writes`.
  submitLocked(r, key, cs, firstIn, firstOut, 0, 0, stream, bind, reads, writes);
}

}  // namespace mk::runtime
