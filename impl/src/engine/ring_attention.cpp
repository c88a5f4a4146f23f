// mkernel — ring attention on the GPU engine (Communicator::ringAttention; docs/attention.md, "Ring attention"): the
// ring-attention schedule (mk/algorithms/attention.hpp) for this communicator's placement of ranks on nodes,
// generated, lowered and uploaded once per spec, its Attention steps run by the compute lane's attention engine while
// the send lane passes the K / V blocks around the ring (NVLink or same-GPU puts inside a node, the proxy across).
#include <cuda_runtime_api.h>

#include <sstream>
#include <string>
#include <vector>

#include "engine/engine.hpp"
#include "mk/algorithms/attention.hpp"
#include "mk/attention_params.hpp"
#include "mk/error.hpp"

namespace mk::runtime {
namespace {

/// The spec as the schedule is generated from it: without a caller's weight, the compute lane weighs 8 against the
/// send lane's 1. Inside a node the lowering then gives the send lane about a ninth of the worker CTAs (its puts want
/// one per 32 KiB piece, the attention steps one per unit: about as many); across nodes the proxy moves the bytes and
/// the send lane keeps one CTA. Whether a ninth keeps the copy ahead of the attention is not measured yet.
RingAttentionSpec plannedSpec(RingAttentionSpec spec) {
  if (spec.scale == 0) spec.scale = defaultAttentionScale(spec.headDim);
  if (spec.computeCtas <= 1) spec.computeCtas = 8;
  return spec;
}

std::string specText(const RingAttentionSpec& s) {
  std::ostringstream os;
  os << "ring-attention " << toString(s.dtype) << " B " << s.batch << " heads " << s.qHeads << "/" << s.kvHeads << " D "
     << s.headDim << " S " << s.seq << (s.causal ? " causal" : "") << " scale " << s.scale << " weight "
     << s.computeCtas;
  return os.str();
}

}  // namespace

void checkRingAttentionCall(const RingAttentionSpec& spec, uint32_t nRanks, bool computeLanes) {
  validateRingAttentionSpec(spec, nRanks);  // Error(InvalidArgument) naming the field
  if (!computeLanes)
    throw Error(ErrorCode::Unsupported,
                "ringAttention: the communicator has no compute lanes; create it with CommConfig::computeLanes = true "
                "(the attention engine runs inside the compute-capable resident kernel)");
  // The blocks the Attention steps see: what the engine must be able to run (head dim, dtype, TMA's ranges).
  const uint64_t local = spec.seq / nRanks, chunk = spec.causal ? local / 2 : local;
  AttentionShape sh;
  sh.batch = spec.batch;
  sh.qHeads = spec.qHeads;
  sh.kvHeads = spec.kvHeads;
  sh.headDim = spec.headDim;
  sh.sq = sh.skv = static_cast<uint32_t>(chunk);
  sh.ldq = sh.ldkv = sh.ldo = static_cast<uint32_t>(local);
  sh.scale = spec.scale > 0 ? spec.scale : defaultAttentionScale(spec.headDim);
  sh.vOffset = uint64_t{spec.batch} * local * spec.kvHeads * spec.headDim;
  if (chunk > (uint64_t{1} << 30))
    throw Error(ErrorCode::InvalidArgument,
                "ringAttention: seq / ranks must be <= 2^30 tokens (got " + std::to_string(local) + ")");
  const std::string why = attentionForwardProblem(sh, spec.dtype);
  if (!why.empty()) throw Error(ErrorCode::InvalidArgument, "ringAttention: " + why);
}

CachedSchedule& EngineSubmission::ringScheduleLocked(const RingAttentionSpec& spec, ScheduleKey* key) {
  const auto n = static_cast<uint32_t>(ctx_.ranks.size());
  return specScheduleLocked(
      specText(spec), [&] { return generateRingAttention(spec, ctx_.topology.layout(n)); }, key);
}

RingAttentionPlan EngineSubmission::ringAttentionPlan(int r, const RingAttentionSpec& specIn) {
  std::lock_guard<std::mutex> lock(ctx_.mu);
  failures_.throwIfFailedLocked();
  RingAttentionPlan plan;
  plan.spec = plannedSpec(specIn);
  plan.workerCtas = ctx_.workers;
  ScheduleKey key;
  const CachedSchedule& cs = ringScheduleLocked(plan.spec, &key);
  countLaneCtas(cs.programs.at(static_cast<size_t>(r)), &plan.computeCtas, &plan.sendCtas);
  return plan;
}

void EngineSubmission::submitRingAttention(int r, const RingAttentionSpec& specIn, const void* q, const void* kv,
                                           float* out, cudaStream_t stream) {
  std::lock_guard<std::mutex> lock(ctx_.mu);
  failures_.throwIfFailedLocked();
  checkRingAttentionCall(specIn, static_cast<uint32_t>(ctx_.ranks.size()), ctx_.config.computeLanes);
  ScheduleKey key;
  CachedSchedule& cs = ringScheduleLocked(plannedSpec(specIn), &key);
  submitNamedLocked(r, key, cs, {{"q", q}, {"kv", kv}, {"out", out}}, stream);
}

}  // namespace mk::runtime
