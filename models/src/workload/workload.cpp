// mkernel — workloads: checks, and fixing a layout for a GPU count (workload.hpp; presets: workload_presets.cpp).
#include "mk/workload/workload.hpp"

#include <algorithm>
#include <string>

#include "mk/error.hpp"
#include "mk/util/checked_mul.hpp"
#include "mk/util/size.hpp"
#include "mk/workload/model_shape.hpp"

namespace mk {

namespace {

[[noreturn]] void bad(const std::string& msg) { throw Error(ErrorCode::InvalidArgument, msg); }

std::string str(uint64_t v) { return std::to_string(v); }

void requireAtLeast1(const char* field, uint64_t v) {
  if (v == 0) bad(std::string(field) + " must be >= 1 (got 0)");
}

/// The lowering and the planner count tokens, elements and bytes in 64 bits: a shape whose largest products do
/// not fit is refused here, naming its fields, instead of wrapping (a wrapped element count of 0 surfaced as
/// "count must be > 0 (got 0)", a wrapped token count as a wrong throughput).
void checkProductsFit(const Workload& w) {
  const ModelShape& m = w.model;
  const TrainingSpec& t = w.training;
  const char* hint = "use a smaller model or batch";
  (void)checkedMul({{"training.globalBatch", t.globalBatch}, {"training.seq", t.seq}}, hint);
  const uint64_t elem = std::max(dtypeSize(t.dtype), dtypeSize(w.layout.gradDtype));
  // A micro-batch's activations in bytes (tensor-parallel and expert-parallel messages are slices of it), and
  // the rows routed to the experts of one expert-parallel group.
  if (!m.moe) {
    (void)checkedMul({{"training.microBatch", t.microBatch},
                      {"training.seq", t.seq},
                      {"model.hidden", m.hidden},
                      {"bytes per element", elem}},
                     hint);
  } else {
    (void)checkedMul({{"training.microBatch", t.microBatch},
                      {"training.seq", t.seq},
                      {"model.hidden", m.hidden},
                      {"model.moe.topK", m.moe->topK},
                      {"bytes per element", elem}},
                     hint);
    (void)checkedMul({{"training.microBatch", t.microBatch},
                      {"training.seq", t.seq},
                      {"model.moe.topK", m.moe->topK},
                      {"layout.ep", w.layout.ep}},
                     hint);
  }
  // The parameters (as doubles in the lowering) are rounded to 64-bit element counts and multiplied by the
  // element size: bound the model's parameter bytes below 2^63.
  ModelShape padded = m;
  padded.vocab = paddedVocab(m, w.layout.tp);
  const double params = countParams(padded).total;
  if (!(params * static_cast<double>(elem) < 0x1p63))
    bad("the model has " + formatNumber(params, 3) + " parameters: x " + str(elem) +
        " bytes each overflows 64 bits (model.layers, model.hidden, model.ffn, model.vocab and model.moe are too "
        "large)");
}

void validateContextParallel(const Workload& w) {
  const ParallelLayout& l = w.layout;
  const uint64_t seq = w.training.seq;
  const uint64_t kvLocal = std::max<uint64_t>(1, w.model.kvHeads / l.tp);
  if (l.cpCommType != CpCommType::A2aP2p && l.cpA2aSize != 0)
    bad("layout.cpA2aSize is for layout.cpCommType \"a2a+p2p\" only (got " + str(l.cpA2aSize) + " with \"" +
        toString(l.cpCommType) + "\")");
  if (l.cp == 1) return;
  // p2p and a2a+p2p balance the causal mask as zigzag: each rank holds chunks i and 2 cp - 1 - i.
  const bool ring = l.cpCommType == CpCommType::P2p || l.cpCommType == CpCommType::A2aP2p;
  const uint64_t chunks = ring ? 2 * uint64_t{l.cp} : l.cp;
  if (seq % chunks != 0)
    bad("layout.cp " + str(l.cp) + " needs training.seq " + str(seq) + " to be a multiple of " + str(chunks) +
        (ring ? " (2 x cp: the causal zigzag splits each sequence into 2 cp chunks)" : " (cp)"));
  uint64_t a2a = 0;
  if (l.cpCommType == CpCommType::A2a) a2a = l.cp;
  if (l.cpCommType == CpCommType::A2aP2p) {
    if (l.cpA2aSize < 2 || l.cp % l.cpA2aSize != 0 || l.cpA2aSize == l.cp)
      bad("layout.cpA2aSize must be > 1, below layout.cp and divide it for \"a2a+p2p\" (got " + str(l.cpA2aSize) +
          " with layout.cp " + str(l.cp) + ")");
    a2a = l.cpA2aSize;
  }
  if (a2a > 0 && (kvLocal % a2a != 0))
    bad(std::string(l.cpCommType == CpCommType::A2a ? "layout.cp " : "layout.cpA2aSize ") + str(a2a) +
        " must divide the key/value heads per tensor-parallel rank, model.kvHeads / layout.tp = " + str(kvLocal) +
        " (Ulysses all-to-all splits the heads over the a2a ranks)");
}

/// etp > 1: Megatron-LM's expert grid splits a stage's `ranks` (tp x cp x dp) into etp x ep x edp.
void checkExpertGrid(const ParallelLayout& l, uint64_t ranks, const std::string& what, const std::string& at = "") {
  if (ranks % l.ep != 0)
    bad("layout.ep " + str(l.ep) + " does not divide " + what + " = " + str(ranks) + at +
        " (with layout.etp > 1 the expert grid etp x ep x edp covers those ranks)");
  if ((ranks / l.ep) % l.etp != 0)
    bad("layout.etp " + str(l.etp) + " does not divide " + what + " / layout.ep = " + str(ranks / l.ep) + at +
        " (the expert grid etp x ep x edp covers those ranks); choose an etp that divides it");
}

}  // namespace

const char* toString(CpCommType c) noexcept {
  switch (c) {
    case CpCommType::P2p: return "p2p";
    case CpCommType::AllGather: return "all-gather";
    case CpCommType::A2a: return "a2a";
    case CpCommType::A2aP2p: return "a2a+p2p";
  }
  return "p2p";
}

const char* toString(Recompute r) noexcept {
  switch (r) {
    case Recompute::None: return "none";
    case Recompute::Full: return "full";
    case Recompute::Selective: return "selective";
  }
  return "none";
}

bool setRecomputeModule(RecomputeModules& m, const std::string& name) {
  if (name == "core_attn")
    m.coreAttn = true;
  else if (name == "mlp")
    m.mlp = true;
  else if (name == "moe_act")
    m.moeAct = true;
  else if (name == "norms" || name == "layernorm")
    m.norms = true;
  else
    return false;
  return true;
}

std::vector<std::string> recomputeModuleNames(const RecomputeModules& m) {
  std::vector<std::string> out;
  if (m.coreAttn) out.emplace_back("core_attn");
  if (m.mlp) out.emplace_back("mlp");
  if (m.moeAct) out.emplace_back("moe_act");
  if (m.norms) out.emplace_back("norms");
  return out;
}

const char* toString(PipelineSchedule s) noexcept {
  switch (s) {
    case PipelineSchedule::OneFOneB: return "1f1b";
    case PipelineSchedule::Interleaved: return "interleaved";
    case PipelineSchedule::GPipe: return "gpipe";
  }
  return "1f1b";
}

void validateWorkload(const Workload& w) {
  const ModelShape& m = w.model;
  requireAtLeast1("model.layers", m.layers);
  requireAtLeast1("model.hidden", m.hidden);
  requireAtLeast1("model.ffn", m.ffn);
  requireAtLeast1("model.heads", m.heads);
  requireAtLeast1("model.kvHeads", m.kvHeads);
  requireAtLeast1("model.vocab", m.vocab);
  validateModelShape(m);
  if (m.kvHeads > m.heads || m.heads % m.kvHeads != 0)
    bad("model.kvHeads " + str(m.kvHeads) + " must divide model.heads " + str(m.heads) +
        " (grouped-query attention shares each key/value head among heads / kvHeads query heads)");
  if (m.moe) {
    if (m.moe->experts < 2) bad("model.moe.experts must be >= 2 (got " + str(m.moe->experts) + ")");
    if (m.moe->topK < 1 || m.moe->topK > m.moe->experts)
      bad("model.moe.topK must be between 1 and model.moe.experts " + str(m.moe->experts) + " (got " +
          str(m.moe->topK) + ")");
  }

  const TrainingSpec& t = w.training;
  requireAtLeast1("training.seq", t.seq);
  requireAtLeast1("training.microBatch", t.microBatch);
  requireAtLeast1("training.globalBatch", t.globalBatch);
  if (t.globalBatch % t.microBatch != 0)
    bad("training.microBatch " + str(t.microBatch) + " does not divide training.globalBatch " + str(t.globalBatch));
  if (t.dtype != DType::BFloat16 && t.dtype != DType::Float16)
    bad(std::string("training.dtype must be bfloat16 or float16 (got ") + toString(t.dtype) +
        "): the compute model is fitted on 16-bit GEMMs (FP8 GEMMs: the \"fp8\" recipe)");
  if (t.recompute == Recompute::Selective && !t.recomputeModules.any())
    bad("training.recomputeModules must name at least one of core_attn, mlp, moe_act, norms with training.recompute "
        "\"selective\"");
  if (t.recompute != Recompute::Selective && t.recomputeModules.any())
    bad(std::string("training.recomputeModules needs training.recompute \"selective\" (got \"") +
        toString(t.recompute) + "\")");

  const ParallelLayout& l = w.layout;
  requireAtLeast1("layout.tp", l.tp);
  requireAtLeast1("layout.pp", l.pp);
  requireAtLeast1("layout.ep", l.ep);
  requireAtLeast1("layout.cp", l.cp);
  requireAtLeast1("layout.etp", l.etp);
  requireAtLeast1("layout.virtualStages", l.virtualStages);
  if (l.dp) requireAtLeast1("layout.dp", *l.dp);
  if (m.heads % l.tp != 0)
    bad("layout.tp " + str(l.tp) + " does not divide model.heads " + str(m.heads) +
        " (tensor parallelism splits the attention heads)");
  if (m.kvHeads % l.tp != 0 && l.tp % m.kvHeads != 0)
    bad("layout.tp " + str(l.tp) + " and model.kvHeads " + str(m.kvHeads) +
        " must divide one another (key/value heads are split, or replicated when tp > kvHeads)");
  if (m.ffn % l.tp != 0) bad("layout.tp " + str(l.tp) + " does not divide model.ffn " + str(m.ffn));
  if (m.moe && m.moe->ffn != 0 && m.moe->ffn % l.tp != 0)
    bad("layout.tp " + str(l.tp) + " does not divide model.moe.ffn " + str(m.moe->ffn));
  if (m.moe && m.moe->sharedExperts > 0 && layerParams(m, 1).shared != layerParams(m, l.tp).shared * l.tp)
    bad("layout.tp " + str(l.tp) +
        " does not divide the shared experts' width (model.moe.sharedExperts x "
        "model.moe.sharedFfn)");
  if (l.pp > m.layers) bad("layout.pp " + str(l.pp) + " exceeds model.layers " + str(m.layers));
  if (l.schedule == PipelineSchedule::Interleaved) {
    if (l.pp < 2) bad("layout.ppSchedule \"interleaved\" needs layout.pp >= 2 (got " + str(l.pp) + ")");
    if (l.virtualStages < 2)
      bad("layout.virtualStages must be >= 2 with the interleaved schedule (got " + str(l.virtualStages) + ")");
    if (static_cast<uint64_t>(l.pp) * l.virtualStages > m.layers)
      bad("layout.pp x layout.virtualStages (" + str(uint64_t{l.pp} * l.virtualStages) + ") exceeds model.layers " +
          str(m.layers));
  } else if (l.virtualStages != 1) {
    bad(std::string("layout.virtualStages must be 1 with the ") + toString(l.schedule) + " schedule (got " +
        str(l.virtualStages) + "; use \"ppSchedule\": \"interleaved\")");
  }
  if (l.ep > 1) {
    if (!m.moe) bad("layout.ep " + str(l.ep) + " needs a mixture-of-experts model (model.moe)");
    if (m.moe->experts % l.ep != 0)
      bad("layout.ep " + str(l.ep) + " does not divide model.moe.experts " + str(m.moe->experts));
  }
  if (m.moe && l.tp > 1 && !l.sp)
    bad("layout.sp must be true for a mixture-of-experts model with layout.tp > 1 (experts are not split by tensor "
        "parallelism: each tensor-parallel rank routes its own sequence slice)");
  if (m.moe && m.moe->imbalance > std::max<uint32_t>(1, l.ep))
    bad("model.moe.imbalance " + formatNumber(m.moe->imbalance, 4) + " exceeds layout.ep " + str(l.ep) +
        " (the busiest rank receives at most every routed token of its expert-parallel group)");
  if (l.etp > 1) {
    // Expert tensor parallelism splits each expert's columns (Megatron-LM's --expert-tensor-parallel-size).
    if (!m.moe) bad("layout.etp " + str(l.etp) + " needs a mixture-of-experts model (model.moe); use 1");
    const uint64_t fe = m.moe->ffn ? m.moe->ffn : m.ffn;
    if (fe % l.etp != 0)
      bad("layout.etp " + str(l.etp) + " does not divide the experts' intermediate size " + str(fe) +
          (m.moe->ffn ? " (model.moe.ffn)" : " (model.ffn)") + "; choose an etp that divides it");
  }
  if (l.dp && l.etp > 1) checkExpertGrid(l, uint64_t{l.tp} * l.cp * *l.dp, "layout.tp x layout.cp x layout.dp");
  if (l.dp && l.etp == 1 && (uint64_t{*l.dp} * l.cp) % l.ep != 0 && (uint64_t{l.tp} * l.cp * *l.dp) % l.ep != 0)
    bad("layout.ep " + str(l.ep) + " divides neither layout.dp x layout.cp " + str(uint64_t{*l.dp} * l.cp) +
        " nor layout.tp x layout.cp x layout.dp / layout.etp " + str(uint64_t{l.tp} * l.cp * *l.dp / l.etp) +
        " (expert parallelism is drawn from those ranks)");
  validateContextParallel(w);
  if (l.zero > 3) bad("layout.zero must be 0, 1, 2 or 3 (got " + str(l.zero) + ")");
  if (l.bucketBytes < kMinBucketBytes || l.bucketBytes > kMaxBucketBytes)
    bad("layout.bucketMiB (--bucket) must be in [4 KiB, 1e6 MiB] (got " + str(l.bucketBytes) + " bytes)");
  if (l.gradDtype != DType::Float32 && l.gradDtype != DType::BFloat16)
    bad(std::string("layout.gradDtype must be float32 or bfloat16 (got ") + toString(l.gradDtype) + ")");
  if (l.tpCommOverlap && l.tp > 1 && !l.sp)
    bad("layout.tpCommOverlap needs layout.sp (sequence parallelism), as Megatron-LM's --tp-comm-overlap does");
  requireAtLeast1("layout.overlapSms", l.overlapSms);
  checkProductsFit(w);
}

ResolvedLayout resolveLayout(const Workload& w, uint32_t gpus) {
  const ParallelLayout& l = w.layout;
  const TrainingSpec& t = w.training;
  if (gpus == 0) bad("the GPU count must be >= 1 (got 0)");
  const uint64_t tpp = uint64_t{l.tp} * l.cp * l.pp;
  if (gpus % tpp != 0)
    bad(std::string(l.cp > 1 ? "layout.tp x layout.cp x layout.pp = " : "layout.tp x layout.pp = ") + str(tpp) +
        " does not divide " + str(gpus) + " GPUs");
  ResolvedLayout r;
  r.gpus = gpus;
  r.tp = l.tp;
  r.pp = l.pp;
  r.cp = l.cp;
  r.ep = l.ep;
  r.etp = l.etp;
  r.virtualStages = l.virtualStages;
  r.dp = static_cast<uint32_t>(gpus / tpp);
  if (l.dp && *l.dp != r.dp)
    bad("layout.dp " + str(*l.dp) + " gives " + str(tpp * *l.dp) + " GPUs (tp x cp x pp x dp), not " + str(gpus) +
        " (use \"dp\": \"auto\" to sweep GPU counts)");
  // Megatron-LM draws the expert-parallel group from the dp x cp ranks (x tp / etp: its expert grid).
  const uint64_t stageRanks = uint64_t{l.tp} * l.cp * r.dp;
  if (l.etp > 1) checkExpertGrid(l, stageRanks, "tp x cp x dp", " at " + str(gpus) + " GPUs");
  if (l.etp == 1 && (uint64_t{r.dp} * l.cp) % l.ep != 0 && stageRanks % l.ep != 0)
    bad("layout.ep " + str(l.ep) + " divides neither dp x cp = " + str(uint64_t{r.dp} * l.cp) +
        " nor tp x cp x dp / etp = " + str(stageRanks / l.etp) + " at " + str(gpus) + " GPUs");
  r.edp = static_cast<uint32_t>(stageRanks / (uint64_t{l.etp} * l.ep));
  const uint64_t perStep = uint64_t{r.dp} * t.microBatch;
  if (t.globalBatch % perStep != 0)
    bad("training.globalBatch " + str(t.globalBatch) + " is not a multiple of dp x microBatch = " + str(perStep) +
        " at " + str(gpus) + " GPUs");
  const uint64_t mb = t.globalBatch / perStep;
  if (mb > UINT32_MAX) bad("training.globalBatch gives too many micro-batches (" + str(mb) + ")");
  r.microBatches = static_cast<uint32_t>(mb);
  if (l.schedule == PipelineSchedule::Interleaved && r.microBatches % l.pp != 0)
    bad("the interleaved schedule needs the micro-batches per replica (" + str(r.microBatches) +
        ") to be a multiple of layout.pp " + str(l.pp) + " at " + str(gpus) + " GPUs");
  r.stageLayers.assign(l.pp, w.model.layers / l.pp);
  for (uint32_t s = 0; s < w.model.layers % l.pp; ++s) ++r.stageLayers[s];
  return r;
}

}  // namespace mk
