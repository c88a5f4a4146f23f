// mkernel — plan.json and run-stats.json (plan_output.hpp).
#include <nlohmann/json.hpp>

#include <cmath>
#include <string>

#include "mk/cost/profile_io.hpp"
#include "mk/error.hpp"
#include "mk/plan/headline.hpp"
#include "mk/plan/plan_output.hpp"
#include "mk/plan/search.hpp"
#include "mk/topology/topology.hpp"
#include "mk/util/size.hpp"

namespace mk::plan {

namespace {

using Json = nlohmann::json;

Json statsJson(const ErrorStats& s) {
  return {{"n", s.n},
          {"median_abs_err_pct", s.medianAbsPct},
          {"p90_abs_err_pct", s.p90AbsPct},
          {"max_abs_err_pct", s.maxAbsPct}};
}

Json phaseJson(const PhaseTime& p) { return {{"exposed_us", p.exposedUs}, {"hidden_us", p.hiddenUs}}; }

Json stepJson(const StepBreakdown& b) {
  Json byClass = Json::object();
  for (int k = 0; k < kKernelClasses; ++k) byClass[toString(static_cast<KernelClass>(k))] = b.computeClassUs[k];
  return {{"step_us", b.stepUs},
          {"compute_us", b.computeUs},
          {"compute_gemm_us", b.computeGemmUs},
          {"compute_attention_us", b.computeAttentionUs},
          {"compute_class_us", byClass},
          {"optimizer_us", b.optimizerUs},
          {"tp", phaseJson(b.tp)},
          {"ep", phaseJson(b.ep)},
          {"pp", phaseJson(b.pp)},
          {"dp", phaseJson(b.dp)},
          {"cp", phaseJson(b.cp)},
          {"bubble_us", b.bubbleUs},
          {"critical_stage", b.criticalStage},
          {"forward_us", b.forwardUs},
          {"backward_us", b.backwardUs},
          {"critical_compute_us", b.criticalComputeUs}};
}

Json useJson(const UseConfidence& u) {
  return {{"class", u.classId}, {"status", toString(u.status)}, {"note", u.note}};
}

Json topologyJson(const Topology& t) { return Json::parse(topologyToJson(t, -1)); }

/// Short, stable ids for the collectives ("c1", "c2", ... in key order).
std::map<std::string, std::string> collectiveIds(const PlanResult& plan) {
  std::map<std::string, std::string> ids;
  for (const auto& [key, price] : plan.prices) ids[key] = "c" + std::to_string(ids.size() + 1);
  return ids;
}

Json scaleJson(const ScaleResult& s, const PlanResult& plan, const std::map<std::string, std::string>& ids) {
  Json j = {{"gpus", s.gpus}, {"nodes", s.nodes}, {"feasible", s.feasible}};
  if (!s.feasible) {
    j["reason"] = s.reason;
    return j;
  }
  const ResolvedLayout& l = s.layout;
  j["layout"] = {{"tp", l.tp},
                 {"pp", l.pp},
                 {"dp", l.dp},
                 {"ep", l.ep},
                 {"cp", l.cp},
                 {"micro_batches", l.microBatches},
                 {"virtual_stages", l.virtualStages},
                 {"stage_layers", l.stageLayers}};
  j["layered"] = stepJson(s.layered);
  if (s.fusedAvailable) {
    j["fused"] = stepJson(s.fused);
    j["fused"]["available"] = true;
    j["fused_speedup"] = s.layered.stepUs / s.fused.stepUs;
  } else {
    j["fused"] = {{"available", false}, {"note", s.fusedNote}};
    j["fused_speedup"] = nullptr;
  }
  j["tokens_per_s"] = s.tokensPerS;
  j["mfu"] = s.mfu;
  j["scaling_efficiency"] = s.scalingEfficiency;
  j["gpu_hours"] = s.gpuHours;
  if (s.hasNoise)
    j["noise"] = {{"mean_step_us", s.noise.meanStepUs}, {"max_step_us", s.noise.maxStepUs},
                  {"goodput", s.noise.goodput},         {"stragglers", s.noise.stragglers},
                  {"steps_sampled", s.noise.steps},     {"tokens_per_s", s.tokensPerS * s.noise.goodput}};
  if (s.hasFailures) {
    const GoodputResult& g = s.failures;
    const auto known = [](const std::optional<double>& v) { return v ? Json(*v) : Json(nullptr); };
    j["failures"] = {{"failures_per_hour", g.failuresPerHour},
                     {"job_mtbf_s", g.jobMtbfS},
                     {"mtbf_source", g.mtbfSource},
                     {"racks", g.racks},
                     {"checkpoint_bytes_per_gpu", g.checkpointBytesPerGpu},
                     {"write_s", known(g.writeS)},
                     {"interval_s", known(g.intervalS)},
                     {"interval_young_daly", g.youngDaly},
                     {"restart_s", known(g.restartS)},
                     {"no_spare_probability", g.noSpareProbability},
                     {"wait_s", known(g.waitS)},
                     {"lost_per_failure_s", known(g.lostPerFailureS)},
                     {"ettr", known(g.ettr)},
                     {"goodput_tokens_per_s", known(g.goodputTokensPerS)},
                     {"train_s", known(g.trainS)},
                     {"unknown", g.unknown},
                     {"note", g.note}};
  }
  const MemoryEstimate& m = s.memory;
  j["memory"] = {{"stage", m.stage},
                 {"weights_bytes", m.weights},
                 {"gradients_bytes", m.gradients},
                 {"optimizer_bytes", m.optimizer},
                 {"activations_bytes", m.activations},
                 {"micro_batches_in_flight", m.inFlight},
                 {"total_bytes", m.total()},
                 {"capacity_bytes", s.memoryCapacity > 0 ? Json(s.memoryCapacity) : Json(nullptr)},
                 {"fits", s.memoryCapacity > 0 ? Json(m.total() <= s.memoryCapacity) : Json(nullptr)}};
  Json classes = Json::object();
  for (const auto& [id, us] : s.classUs) {
    const UseConfidence& u = s.classUse.at(id);
    classes[id] = {{"us", us}, {"status", toString(u.status)}, {"note", u.note}};
  }
  j["confidence"] = {{"status", toString(s.status)}, {"note", s.statusNote}, {"classes", classes}};
  j["compute_checked"] = {{"by_step_records", s.computeByStepRecords},
                          {"by_kernel_records", s.computeByKernelRecords},
                          {"unchecked", s.computeUnchecked}};
  j["unmeasured_compute_us"] = s.unmeasuredComputeUs;
  j["unmeasured_compute_share"] = s.unmeasuredComputeShare;
  j["unpriced"] = s.unpriced;
  j["bounds"] = s.bounds;
  Json comm = Json::array();
  for (const CommUse& c : s.comm)
    comm.push_back({{"name", c.name},
                    {"phase", toString(c.phase)},
                    {"timing", toString(c.timing)},
                    {"times_per_step", c.timesPerStep},
                    {"collective", ids.at(c.priceKey)},
                    {"time_us", plan.prices.at(c.priceKey).us},
                    {"confidence", useJson(c.confidence)}});
  j["comm"] = comm;
  Json compute = Json::array();
  for (const ComputeUse& c : s.compute)
    compute.push_back({{"name", c.name},
                       {"kind", toString(c.kind)},
                       {"class", toString(c.cls)},
                       {"kernel", c.kernel},
                       {"pass", toString(c.pass)},
                       {"source", c.source},
                       {"unmeasured", c.source.rfind("roofline", 0) == 0},
                       {"m", c.m},
                       {"n", c.n},
                       {"k", c.k},
                       {"batch", c.batch},
                       {"times_per_step", c.timesPerStep},
                       {"time_us", c.us},
                       {"tflops", c.tflops},
                       {"memory_bound", c.memoryBound}});
  j["compute"] = compute;
  Json fusedOps = Json::array();
  for (const FusedUse& f : s.fusedOps)
    fusedOps.push_back({{"kind", toString(f.kind)},
                        {"gemm", f.gemm},
                        {"comm", f.comm},
                        {"m", f.m},
                        {"n", f.n},
                        {"k", f.k},
                        {"times_per_step", f.timesPerStep},
                        {"gemm_us", f.gemmUs},
                        {"collective", ids.at(f.priceKey)},
                        {"comm_us", plan.prices.at(f.priceKey).us},
                        {"fused_us", s.fusedAvailable ? Json(f.us) : Json(nullptr)},
                        {"source", f.source}});
  j["fused_ops"] = fusedOps;
  Json blocks = Json::array();
  for (const FusedBlockUse& b : s.fusedBlocks)
    blocks.push_back({{"kind", toString(b.kind)},
                      {"pass", toString(b.pass)},
                      {"mirror", b.mirror},
                      {"replaces", b.replaces},
                      {"times_per_step", b.timesPerStep},
                      {"ranks", b.ranks},
                      {"layered_compute_us", b.layeredComputeUs},
                      {"layered_comm_us", b.layeredCommUs},
                      {"fused", b.fused},
                      {"fused_us", b.priced ? Json(b.us) : Json(nullptr)},
                      {"source", b.source},
                      {"split", b.split},
                      {"note", b.note}});
  j["fused_blocks"] = blocks;
  return j;
}

/// The last guard before a document is written: every number is finite. nlohmann writes NaN and inf as null,
/// which a reader cannot tell from "not applicable"; a non-finite number here is a model bug the input checks
/// missed, so it is an internal error naming the field, never a plan with a hole in it.
void requireFinite(const Json& j, const std::string& path) {
  if (j.is_number_float()) {
    const double v = j.get<double>();
    if (!std::isfinite(v))
      throw Error(ErrorCode::Internal, path + " is " + formatNumber(v) +
                                           ", not a finite number: refusing to write it as null (a bug: please "
                                           "report it with the command line)");
  } else if (j.is_object()) {
    for (const auto& [k, v] : j.items()) requireFinite(v, path + "." + k);
  } else if (j.is_array()) {
    for (std::size_t i = 0; i < j.size(); ++i) requireFinite(j[i], path + "[" + std::to_string(i) + "]");
  }
}

Json whatIfJson(const WhatIf& w) {
  Json j = Json::object();
  if (w.nicBwFactor) j["nic_bw_factor"] = *w.nicBwFactor;
  if (w.nicBwGBs) j["nic_bw_gbs"] = *w.nicBwGBs;
  if (w.nics) j["nics"] = *w.nics;
  if (w.oversub) j["oversubscription"] = *w.oversub;
  if (w.nodesPerLeaf) j["nodes_per_leaf"] = *w.nodesPerLeaf;
  if (w.nvlinkDomain) j["nvlink_domain"] = *w.nvlinkDomain;
  if (w.noise.any())
    j["noise"] = {{"sigma", w.noise.sigma},
                  {"straggler_fraction", w.noise.stragglerFraction},
                  {"straggler_slowdown", w.noise.stragglerSlowdown},
                  {"seed", w.noise.seed}};
  if (w.failures.any()) {
    const FailureSpec& f = w.failures;
    Json fj = Json::object();
    if (f.mtbfGpuH) fj["mtbf_gpu_h"] = *f.mtbfGpuH;
    if (f.mtbfNodeH) fj["mtbf_node_h"] = *f.mtbfNodeH;
    if (f.mtbfRackH) fj["mtbf_rack_h"] = *f.mtbfRackH;
    if (f.rackNodes) fj["rack_nodes"] = *f.rackNodes;
    if (f.restartS) fj["restart_s"] = *f.restartS;
    if (!f.restartPartsS.empty()) fj["restart_parts_s"] = f.restartPartsS;
    if (f.checkpointWriteS) fj["checkpoint_write_s"] = *f.checkpointWriteS;
    if (f.checkpointBytesPerGpu) fj["checkpoint_bytes_per_gpu"] = *f.checkpointBytesPerGpu;
    if (f.ckptBwGBs) fj[f.ckptBwPerGpu ? "checkpoint_gbs_per_gpu" : "checkpoint_gbs_per_node"] = *f.ckptBwGBs;
    if (f.intervalS) fj["checkpoint_interval_s"] = *f.intervalS;
    if (f.spares) fj["spare_nodes"] = *f.spares;
    if (f.repairS) fj["repair_s"] = *f.repairS;
    j["failures"] = fj;
  }
  return j;
}

}  // namespace

std::string planToJson(const PlanResult& plan, const std::string& commit, int indent) {
  const auto ids = collectiveIds(plan);
  const PlanInputs& in = plan.inputs;
  Json j;
  j["schema"] = kPlanSchema;
  j["tool"] = {{"name", "mk-plan"}, {"commit", commit}};
  j["headline"] = planHeadline(plan);
  Json whatIfs = Json::array();
  for (const auto& w : in.whatIfs) whatIfs.push_back(w.name);
  j["inputs"] = {
      {"workload", Json::parse(workloadToJson(in.workload, -1))},
      {"workload_source", workloadPresetSource(in.workload.name)},
      {"cluster", {{"spec", in.cluster}, {"is_file", plan.clusterIsFile}, {"topology", topologyJson(plan.cluster)}}},
      {"gpus", in.gpus},
      {"what_ifs", whatIfs},
      {"token_budget", in.tokenBudget},
      {"gpu_memory_gb", in.gpuMemoryGB ? Json(*in.gpuMemoryGB) : Json(nullptr)},
      {"sim_budget_steps", in.pricer.budgetSteps},
      {"measured_dir", in.measuredDir},
      {"profile", Json::parse(profileToJson(plan.profile, plan.provenance, -1))},
      {"profile_note", plan.profileNote}};
  const GemmModel& g = *plan.gemm;
  j["compute_model"] = {{"formula", "t = c0 + max(flops / R, bytes / B)"},
                        {"gpu", g.gpu},
                        {"peak_tflops", g.peakTflops},
                        {"hbm_gbs", g.hbmGBs},
                        {"tflops", g.tflops},
                        {"overhead_us", g.overheadUs},
                        {"samples", g.samples.size()},
                        {"shapes", g.shapes},
                        {"files", g.files},
                        {"in_sample", statsJson(g.inSample)},
                        {"leave_one_shape_out", statsJson(g.leaveOneShapeOut)},
                        {"note", plan.gemmNote}};
  Json kernelModels = Json::array();
  for (const auto& [key, m] : plan.kernels.models())
    kernelModels.push_back({{"gpu", key.gpu},
                            {"class", toString(key.cls)},
                            {"kernel", key.variant},
                            {"dtype", key.dtype},
                            {"pass", key.pass},
                            {"overhead_us", m.overheadUs},
                            {"tflops", m.tflops > 0 ? Json(m.tflops) : Json(nullptr)},
                            {"rows_per_us", m.rowsPerUs > 0 ? Json(m.rowsPerUs) : Json(nullptr)},
                            {"bandwidth_gbs", m.bandwidthGBs > 0 ? Json(m.bandwidthGBs) : Json(nullptr)},
                            {"records", m.records},
                            {"shapes", m.shapes},
                            {"files", m.files},
                            {"in_sample", statsJson(m.inSample)},
                            {"leave_one_shape_out", statsJson(m.leaveOneShapeOut)}});
  Json overlapFits = Json::array();
  for (const OverlapFit& f : plan.overlap.fits())
    overlapFits.push_back({{"gpu", f.gpu},
                           {"sms", f.sms},
                           {"comm_kernel", f.comm},
                           {"stand_in_records_left_out", f.standInRecords},
                           {"phi", f.phi},
                           {"f0", f.f0},
                           {"records", f.records},
                           {"shapes", f.shapes},
                           {"files", f.files},
                           {"in_sample", statsJson(f.inSample)},
                           {"leave_one_shape_out", statsJson(f.leaveOneShapeOut)}});
  j["overlap_model"] = {{"formula", "slowdown = (1 + f0) S / (S - phi c), c = layout.overlapSms"},
                        {"note", plan.overlapNote},
                        {"fits", overlapFits}};
  j["kernel_models"] = {{"formula",
                         "t = c0 + flops / R + bytes / B; the loss: t = c0 + rows / rows_per_us + bytes / B (a term "
                         "fitted to 0 is null)"},
                        {"note", plan.kernelNote},
                        {"models", kernelModels}};
  Json classes = Json::object();
  for (const auto& [id, c] : plan.confidence.classes()) {
    Json cj = {{"what", c.what}, {"method", c.method}};
    // A class measured only in a regime no use is in (ConfidenceClass::regime) is extrapolated wherever it is used.
    cj["status"] = c.error ? (c.regime.empty() ? "measured" : "extrapolated")
                           : (id == "fused" ? "not available" : "not validated");
    cj["error"] = c.error ? statsJson(*c.error) : Json(nullptr);
    cj["measured_gpu"] = c.measuredGpu;
    cj["measured_ranks"] = c.measuredRanks;
    Json byGpu = Json::object();
    for (const auto& [gpu, e] : c.errorByGpu) byGpu[gpu] = statsJson(e);
    cj["error_by_gpu"] = byGpu;
    classes[id] = cj;
  }
  j["confidence"] = {{"classes", classes}, {"validation", plan.validationNote}};
  Json steps = nullptr;  // the measured training steps against this planner (mk-plan --check-steps)
  if (plan.steps) {
    Json byGpu = Json::object();
    for (const auto& [gpu, e] : plan.steps->errorByGpu) byGpu[gpu] = statsJson(e);
    Json records = Json::array();
    for (const StepCheck& c : plan.steps->checks)
      records.push_back({{"file", c.file},
                         {"record", c.record},
                         {"gpu", c.gpu},
                         {"workload", c.workload},
                         {"dtype", c.dtype},
                         {"seq", c.seq},
                         {"micro_batch", c.microBatch},
                         {"micro_batches", c.microBatches},
                         {"measured_us", c.measuredUs},
                         {"predicted_us", c.predictedUs},
                         {"error_pct", c.errorPct}});
    steps = {{"error", statsJson(plan.steps->error)}, {"error_by_gpu", byGpu}, {"records", records}};
  }
  j["confidence"]["steps"] = steps;
  j["fused"] = {{"status", plan.fusedStatus}};
  Json colls = Json::object();
  for (const auto& [key, p] : plan.prices) {
    Json links = Json::array();
    for (const auto& l : p.busiest)
      links.push_back({{"name", l.name},
                       {"bandwidth_gbs", l.bandwidthGBs},
                       {"bytes", l.bytes},
                       {"avg_gbs", l.avgGBs},
                       {"peak_gbs", l.peakGBs},
                       {"utilization", l.utilization}});
    colls[ids.at(key)] = {{"op", p.op},
                          {"algo", p.algo},
                          {"auto", p.chosenByAuto},
                          {"source", toString(p.source)},
                          {"note", p.note},
                          {"domain", toString(p.domain)},
                          {"group_size", p.groupSize},
                          {"group_nodes", p.groupNodes},
                          {"concurrent", p.concurrent},
                          {"bytes", p.bytes},
                          {"time_us", p.us},
                          {"closed_form_us", p.closedFormUs ? Json(*p.closedFormUs) : Json(nullptr)},
                          {"busiest_links", links},
                          {"bound", boundText(p)}};
  }
  j["collectives"] = colls;
  Json variants = Json::array();
  for (const VariantResult& v : plan.variants) {
    Json scales = Json::array();
    for (const ScaleResult& s : v.scales) {
      Json sj = scaleJson(s, plan, ids);
      if (s.feasible) {
        // The terminal's words and numbers (headline.hpp), so that the HTML report says the same.
        const StepBand band = stepBand(plan, v, s);
        const Bottleneck bn = bottleneck(s);
        sj["headline"] = formatHeadline(plan, v, s);
        sj["band"] = {{"pct", band.pct}, {"measured_share", band.measuredShare}, {"text", formatBand(band)}};
        sj["bottleneck"] = {{"part", bn.part}, {"share", bn.share}};
      }
      scales.push_back(sj);
    }
    Json node = topologyJson(v.nodeType);
    node.erase("nodes");
    variants.push_back(
        {{"name", v.name},
         {"what_if", whatIfJson(v.whatIf)},
         {"cluster", node},
         {"profile_network", {{"alphaUs", v.profile.network.alphaUs}, {"bwGBs", v.profile.network.bwGBs}}},
         {"scales", scales}});
  }
  j["variants"] = variants;
  if (plan.search) j["search"] = nlohmann::json::parse(searchToJson(*plan.search));
  requireFinite(j, "plan.json");
  return j.dump(indent);
}

namespace {

/// One kernel of the census: the contract's fields, then the planner's price.
Json kernelJson(const ComputeOp& op, const KernelPrice& price, uint32_t microBatches) {
  Json k = {{"name", op.name},
            {"class", toString(op.cls)},
            {"kernel", op.kernel},
            {"pass", toString(op.pass)},
            {"dtype", dtypeName(op)}};
  switch (op.cls) {
    case KernelClass::Gemm: k.update({{"m", op.m}, {"n", op.n}, {"k", op.k}, {"batch", op.batch}}); break;
    case KernelClass::Attention:
      k.update({{"batch", op.seqs},
                {"seq", op.seq},
                {"heads", op.heads},
                {"kv_heads", op.kvHeads},
                {"head_dim", op.headDim},
                {"causal", op.causal}});
      break;
    case KernelClass::Norm:
    case KernelClass::Activation:
    case KernelClass::Residual: k.update({{"tokens", op.tokens}, {"hidden", op.hidden}}); break;
    case KernelClass::Rotary:
      k.update({{"tokens", op.tokens}, {"heads", op.heads}, {"kv_heads", op.kvHeads}, {"head_dim", op.headDim}});
      break;
    case KernelClass::Loss: k.update({{"tokens", op.tokens}, {"vocab", op.vocab}}); break;
    case KernelClass::Embedding: k.update({{"tokens", op.tokens}, {"hidden", op.hidden}, {"vocab", op.vocab}}); break;
    case KernelClass::Optimizer:
    case KernelClass::GradNorm: k["params"] = op.params; break;
    case KernelClass::Cast: k["elements"] = op.elements; break;
    case KernelClass::Router: k.update({{"tokens", op.tokens}, {"experts", op.experts}, {"topk", op.topk}}); break;
    case KernelClass::Permute:
      k.update({{"tokens", op.tokens}, {"hidden", op.hidden}, {"topk", op.topk}, {"experts", op.experts}});
      break;
  }
  const bool perStep = op.pass == Pass::Step;
  const double perMb = perStep ? 0.0 : price.us * op.times;
  k.update({{"flops", op.flops},
            {"bytes", op.bytes},
            {"times", op.times},
            {"per", perStep ? "step" : "micro-batch"},
            {"recompute", op.recompute},
            {"price",
             {{"us_per_launch", price.us},
              {"us_per_micro_batch", perStep ? Json(nullptr) : Json(perMb)},
              {"us_per_step", perStep ? price.us * op.times : perMb * microBatches},
              {"memory_bound", price.memoryBound},
              {"source", price.source}}}});
  return k;
}

}  // namespace

std::string kernelCensusToJson(const PlanResult& plan, const std::string& commit, int indent) {
  const GemmModel& g = *plan.gemm;
  const VariantResult& base = plan.variants.at(0);
  const NodeSpec& node = base.nodeType.node;
  Json scales = Json::array();
  for (const ScaleResult& s : base.scales) {
    if (!s.feasible) continue;
    // The planner's own lowering and prices, recomputed: both are pure functions of the workload, the layout, the
    // GEMM model and the node.
    const StepLowering step =
        lowerStep(plan.inputs.items.empty() ? plan.inputs.workload : plan.inputs.items[s.item].workload, s.layout);
    Json stages = Json::array();
    for (const StageLowering& st : step.stages) {
      Json kernels = Json::array();
      double perStep = 0, unmeasured = 0;
      for (const ComputeOp& op : st.compute) {
        const KernelPrice price = priceCompute(g, plan.kernels, op, node);
        kernels.push_back(kernelJson(op, price, s.layout.microBatches));
        const double us = price.us * op.times * (op.pass == Pass::Step ? 1 : s.layout.microBatches);
        perStep += us;
        if (price.source.rfind("roofline", 0) == 0) unmeasured += us;
      }
      stages.push_back({{"stage", st.stage},
                        {"layers", st.layers},
                        {"embedding", st.embedding},
                        {"head", st.head},
                        {"compute_us_per_step", perStep},
                        {"unmeasured_us_per_step", unmeasured},
                        {"unmeasured_share", perStep > 0 ? unmeasured / perStep : 0.0},
                        {"kernels", kernels}});
    }
    const ResolvedLayout& r = s.layout;
    scales.push_back({{"gpus", s.gpus},
                      {"layout",
                       {{"tp", r.tp},
                        {"pp", r.pp},
                        {"dp", r.dp},
                        {"ep", r.ep},
                        {"cp", r.cp},
                        {"virtual_stages", r.virtualStages},
                        {"micro_batches", r.microBatches}}},
                      {"critical_stage", s.layered.criticalStage},
                      {"unmeasured_compute_share", s.unmeasuredComputeShare},
                      {"unpriced", s.unpriced},
                      {"stages", stages}});
  }
  Json j = {{"schema", kKernelCensusSchema},
            {"tool", {{"name", "mk-plan"}, {"commit", commit}}},
            {"workload", plan.inputs.workload.name},
            {"cluster", plan.inputs.cluster},
            {"gpu", node.gpu},
            {"pricing",
             {{"kernel-model", "t = c0 + flops / R + bytes / B, fitted per GPU, class, kernel, dtype and pass"},
              {"gemm-model", "t = c0 + max(flops / R, bytes / B)"},
              {"roofline: unmeasured", "t = c0 + bytes / B"},
              {"c0_us", g.overheadUs},
              {"R_tflops", g.tflops * node.bf16Tflops / g.peakTflops},
              {"B_gbs", node.hbmGBs}}},
            {"scales", scales}};
  requireFinite(j, "kernel census");
  return j.dump(indent);
}

std::string planStatsToJson(const PlanResult& plan, const std::string& command, int indent) {
  const auto ids = collectiveIds(plan);
  Json sims = Json::object();
  for (const auto& [key, p] : plan.prices) sims[ids.at(key)] = {{"steps", p.steps}, {"wall_s", p.wallS}};
  const RunStats& s = plan.stats;
  Json j = {{"schema", kPlanStatsSchema},
            {"command", command},
            {"wall_s", s.wallS},
            {"validation_s", s.validationS},
            {"validation_predictions", s.validationPredictions},
            {"validation_from_cache", s.validationFromCache},
            {"simulation_s", s.simulationS},
            {"simulated_wall_s", s.simulatedWallS},
            {"simulations", s.simulations},
            {"requests", s.requests},
            {"distinct", s.distinct},
            {"collectives", sims}};
  requireFinite(j, "run-stats.json");
  return j.dump(indent);
}

}  // namespace mk::plan
