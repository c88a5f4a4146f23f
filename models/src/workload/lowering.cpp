// mkernel — a training step lowered to per-GPU GEMMs, attention kernels and collectives (lowering.hpp; the
// formulas are in docs/planner.md).
#include "mk/workload/lowering.hpp"

#include <algorithm>
#include <cmath>

#include "lowering_groups.hpp"
#include "lowering_internal.hpp"
#include "mk/error.hpp"
#include "mk/workload/model_shape.hpp"

namespace mk::detail {

StageBuilder::StageBuilder(const Workload& w, const ResolvedLayout& r, uint32_t stage) : w_(w), r_(r) {
  const ModelShape& m = w.model;
  out_.stage = stage;
  out_.layers = r.stageLayers.at(stage);
  out_.embedding = stage == 0;
  out_.head = stage + 1 == r.pp;
  tokens_ = uint64_t{w.training.microBatch} * w.training.seq / r.cp;  // the rank's share of each sequence
  d_ = m.headDim();
  kvLocal_ = std::max<uint64_t>(1, m.kvHeads / r.tp);
  qkvN_ = (m.heads / r.tp + 2 * kvLocal_) * d_;
  dqk_ = m.mla ? m.mla->qkNopeHeadDim + m.mla->qkRopeHeadDim : d_;
  dv_ = m.mla ? m.mla->vHeadDim : d_;
  if (m.mla) d_ = (dqk_ + dv_) / 2;  // the mean of K's and V's head dims: what context parallelism exchanges
  attnOutK_ = (m.heads / r.tp) * dv_;
  ffnLocal_ = m.ffn / r.tp;
  // Which of the stage's layers are MoE or windowed follows their index in the whole model.
  uint32_t firstLayer = 0;
  for (uint32_t s = 0; s < stage; ++s) firstLayer += r.stageLayers[s];
  for (uint32_t i = firstLayer; i < firstLayer + out_.layers; ++i) {
    moeLayers_ += isMoeLayer(m, i) ? 1 : 0;
    windowLayers_ += isWindowedLayer(m, i) ? 1 : 0;
  }
  denseLayers_ = out_.layers - moeLayers_;
  out_.moeLayers = moeLayers_;
  vocabLocal_ = paddedVocab(m, r.tp) / r.tp;
  elemBytes_ = static_cast<double>(dtypeSize(w.training.dtype));
}

StageLowering StageBuilder::build() {
  addGroups();
  addLayers(Pass::Forward, false);
  addBackward();
  if (w_.training.recompute != Recompute::None) addLayers(Pass::Backward, true);
  addPipeline();
  addDataParallel();
  addStepKernels();
  return std::move(out_);
}

uint32_t StageBuilder::group(GroupSet g) {
  out_.groups.push_back(std::move(g));
  return static_cast<uint32_t>(out_.groups.size() - 1);
}

void StageBuilder::addGroups() {
  detail::StageGroups g = detail::stageGroups(r_, out_.stage, detail::cpA2aRanks(w_.layout));
  tpGroups_ = group(std::move(g.tp));
  dpGroups_ = group(std::move(g.dp));
  epGroups_ = group(std::move(g.ep));
  edpGroups_ = group(std::move(g.edp));
  ppGroups_ = group(std::move(g.pp));
  if (r_.etp > 1) etpGroups_ = group(std::move(g.etp));
  if (r_.cp > 1) {
    cpGroups_ = group(std::move(g.cp));
    if (!g.cpRing.instances.empty()) cpRingGroups_ = group(std::move(g.cpRing));
    if (!g.cpRingRanks.instances.empty()) cpRingRanksGroups_ = group(std::move(g.cpRingRanks));
  }
}

uint32_t StageBuilder::addComm(const std::string& name, Phase phase, CommKind kind, Pass pass, CommTiming timing,
                               uint64_t count, DType dtype, uint32_t times, uint32_t groups) {
  CommOp op;
  op.name = name;
  op.phase = phase;
  op.kind = kind;
  op.pass = pass;
  op.timing = timing;
  op.count = count;
  op.dtype = dtype;
  op.times = times;
  op.groups = groups;
  out_.comm.push_back(op);
  return static_cast<uint32_t>(out_.comm.size() - 1);
}

bool StageBuilder::rerun(const std::string& name) const {
  const TrainingSpec& t = w_.training;
  if (t.recompute == Recompute::Full) return true;
  if (t.recompute == Recompute::None) return false;
  const std::string base = name.substr(0, name.find(".recompute"));
  const RecomputeModules& m = t.recomputeModules;
  if (base == "attention") return m.coreAttn;
  if (base == "expert-act") return m.moeAct;
  if (base == "attn-norm" || base == "mlp-norm") return m.norms;
  for (const char* op : {"mlp-up", "mlp-act", "mlp-down", "tp.ag.mlp-up", "tp.rs.mlp-down", "tp.ar.mlp-down"})
    if (base == op) return m.mlp;
  return false;
}

}  // namespace mk::detail

namespace mk {

StepLowering lowerStep(const Workload& w, const ResolvedLayout& r) {
  if (r.stageLayers.size() != r.pp || r.tp == 0 || r.dp == 0 || r.pp == 0)
    throw Error(ErrorCode::InvalidArgument, "lowerStep: the layout is not resolved (call resolveLayout first)");
  StepLowering out;
  out.layout = r;
  out.tokensPerStep = w.training.globalBatch * w.training.seq;
  for (uint32_t s = 0; s < r.pp; ++s) {
    out.stages.push_back(detail::StageBuilder(w, r, s).build());
    double perMb = 0;
    // Model FLOPs are the matrix products' (GEMMs and attention), as MFU counts them.
    for (const ComputeOp& op : out.stages.back().compute)
      if (!op.recompute && op.kind != ComputeKind::Other) perMb += op.flops * op.times;
    out.modelFlopsPerStep += perMb * r.microBatches * static_cast<double>(r.tp) * r.cp * r.dp;
  }
  return out;
}

const char* toString(Phase p) noexcept {
  switch (p) {
    case Phase::Tp: return "tp";
    case Phase::Ep: return "ep";
    case Phase::Pp: return "pp";
    case Phase::Dp: return "dp";
    case Phase::Cp: return "cp";
  }
  return "tp";
}

const char* toString(CommKind k) noexcept {
  switch (k) {
    case CommKind::AllReduce: return "allreduce";
    case CommKind::AllGather: return "allgather";
    case CommKind::ReduceScatter: return "reducescatter";
    case CommKind::AllToAll: return "alltoall";
    case CommKind::SendRecv: return "sendrecv";
  }
  return "allreduce";
}

const char* toString(CommTiming t) noexcept {
  switch (t) {
    case CommTiming::Blocking: return "blocking";
    case CommTiming::GradBucket: return "grad-bucket";
    case CommTiming::ParamGather: return "param-gather";
    case CommTiming::LayerPrefetch: return "layer-prefetch";
    case CommTiming::AttentionRing: return "attention-ring";
  }
  return "blocking";
}

const char* toString(FusedKind k) noexcept {
  switch (k) {
    case FusedKind::AllGatherGemm: return "allgather+gemm";
    case FusedKind::GemmReduceScatter: return "gemm+reducescatter";
    case FusedKind::GemmAllReduce: return "gemm+allreduce";
  }
  return "gemm+allreduce";
}

const char* toString(FusedBlockKind k) noexcept { return k == FusedBlockKind::MoeFfn ? "moe-ffn" : "ring-attention"; }

const char* toString(Pass p) noexcept {
  switch (p) {
    case Pass::Forward: return "forward";
    case Pass::Backward: return "backward";
    case Pass::Step: return "step";
  }
  return "forward";
}

const char* toString(ComputeKind k) noexcept {
  switch (k) {
    case ComputeKind::Gemm: return "gemm";
    case ComputeKind::Attention: return "attention";
    case ComputeKind::Other: return "other";
  }
  return "gemm";
}

const char* toString(KernelClass c) noexcept {
  switch (c) {
    case KernelClass::Gemm: return "gemm";
    case KernelClass::Attention: return "attention";
    case KernelClass::Norm: return "norm";
    case KernelClass::Activation: return "activation";
    case KernelClass::Rotary: return "rotary";
    case KernelClass::Residual: return "residual";
    case KernelClass::Loss: return "loss";
    case KernelClass::Embedding: return "embedding";
    case KernelClass::Optimizer: return "optimizer";
    case KernelClass::GradNorm: return "grad-norm";
    case KernelClass::Cast: return "cast";
    case KernelClass::Router: return "router";
    case KernelClass::Permute: return "permute";
  }
  return "gemm";
}

const char* dtypeName(const ComputeOp& op) noexcept { return toString(op.fp8 ? DType::Float8E4M3 : op.dtype); }

bool softmaxRowInSharedMemory(uint64_t rowElems, std::size_t elemBytes) noexcept {
  constexpr uint64_t kSharedBytes = 49152, kReductionScratch = 128, kVector = 16;
  if (elemBytes == 0 || kVector % elemBytes != 0) return false;
  return rowElems < (kSharedBytes - kReductionScratch) / elemBytes && rowElems % (kVector / elemBytes) == 0;
}

uint64_t commBytes(const CommOp& op, uint32_t groupSize) noexcept {
  const uint64_t elem = dtypeSize(op.dtype);
  switch (op.kind) {
    case CommKind::AllGather:
    case CommKind::ReduceScatter:
    case CommKind::AllToAll: return op.count * groupSize * elem;
    case CommKind::AllReduce:
    case CommKind::SendRecv: return op.count * elem;
  }
  return op.count * elem;
}

}  // namespace mk
