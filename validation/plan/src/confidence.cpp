// mkernel — confidence classes of a plan (confidence.hpp).
#include "mk/plan/confidence.hpp"

#include <algorithm>
#include <set>

#include "mk/error.hpp"
#include "mk/util/size.hpp"

namespace mk::plan {

namespace {

const char* kCollectives[] = {"allreduce", "allgather", "reducescatter", "alltoall", "sendrecv"};

std::string ranksText(const std::vector<uint32_t>& ranks) {
  std::string s;
  for (uint32_t r : ranks) s += (s.empty() ? "" : ", ") + std::to_string(r);
  return s;
}

/// The fused operators: the pooled error of the fused records across nodes in the regime they measured, else where
/// they were validated.
ConfidenceClass fusedClass(const std::vector<FusedNodesValidation>* fusedNodes) {
  ConfidenceClass c;
  c.id = "fused";
  c.what = "fused operators (AllGather+GEMM, GEMM+ReduceScatter, GEMM+AllReduce)";
  const std::string priced = "priced by the fused schedules' own model (closed form, SimGrid replay across nodes)";
  if (!fusedNodes || fusedNodes->empty()) {
    c.method =
        "validated only where the network is the slow part: ranks sharing one GPU as nodes over loopback TCP "
        "(docs/results.md, gated at 10 % median); not measured across GPUs (NVLink) or a real network: " +
        priced;
    return c;
  }
  std::vector<double> errs;
  std::set<uint32_t> ranks;
  std::map<std::string, int> ops;
  std::string fitted, regimes, skipped;
  std::size_t nSkipped = 0;
  for (const FusedNodesValidation& v : *fusedNodes) {
    for (const FusedRow& r : v.fused.rows) {
      errs.push_back(r.simErrPct);
      ranks.insert(r.ranks());
      ++ops[r.opName()];
    }
    std::string params;
    for (const ParameterFit& p : v.fit.parameters)
      if (p.measured) params += (params.empty() ? "" : ", ") + p.name;
    fitted += (fitted.empty() ? "" : "; ") + params + " fitted on " + std::to_string(v.manifest.calibration.size()) +
              " calibration file(s) of the same session over the " + v.manifest.base + " datasheet";
    regimes += (regimes.empty() ? "" : "; ") + v.manifest.regime;
    if (c.measuredGpu.empty()) c.measuredGpu = v.gpu;
    if (skipped.empty() && !v.fused.skipped.empty()) skipped = v.fused.skipped.front().reason;
    nSkipped += v.fused.skipped.size();
  }
  std::string opList;
  for (const auto& [op, n] : ops) opList += (opList.empty() ? "" : ", ") + std::to_string(n) + " " + op;
  c.error = errorStats(errs);
  c.measuredRanks.assign(ranks.begin(), ranks.end());
  c.regime = regimes;
  c.method = "the SimGrid replay's error on " + std::to_string(errs.size()) + " fused records across nodes (" + opList +
             "; mk-validate --fused-nodes): " + regimes + "; " + fitted + ". For this cluster " + priced;
  if (nSkipped > 0) c.method += "; " + std::to_string(nSkipped) + " record(s) not priced, the first: " + skipped;
  return c;
}

}  // namespace

const char* toString(Status s) noexcept {
  switch (s) {
    case Status::Validated: return "validated";
    case Status::Extrapolated: return "extrapolated";
    case Status::NotValidated: return "not validated";
    case Status::NotAvailable: return "not available";
  }
  return "not validated";
}

void ConfidenceTable::add(ConfidenceClass c) {
  const std::string id = c.id;
  classes_[id] = std::move(c);
}

UseConfidence ConfidenceTable::forClass(const std::string& id) const {
  UseConfidence u;
  u.classId = id;
  auto it = classes_.find(id);
  if (it == classes_.end() || !it->second.error) {
    u.status = id.rfind("fused.", 0) == 0 ? Status::NotAvailable : Status::NotValidated;
    u.note = it == classes_.end() ? "no measurement" : it->second.method;
    return u;
  }
  u.status = it->second.regime.empty() ? Status::Validated : Status::Extrapolated;
  if (!it->second.regime.empty()) u.note = "measured: " + it->second.regime;
  return u;
}

UseConfidence ConfidenceTable::forCompute(ComputeKind kind, const std::string& gpu) const {
  UseConfidence u = forClass(kind == ComputeKind::Gemm ? "compute.gemm" : "compute.attention");
  if (u.status != Status::Validated) return u;
  const ConfidenceClass& c = classes_.at(u.classId);
  if (c.measuredGpu != gpu) {
    u.status = Status::Extrapolated;
    u.note = "measured on " + c.measuredGpu + ", used for " + gpu;
  }
  return u;
}

UseConfidence ConfidenceTable::forKernelClass(KernelClass cls, const std::string& gpu) const {
  const std::string id = std::string("compute.") + toString(cls);
  auto it = classes_.find(id);
  if (it != classes_.end() && !it->second.errorByGpu.empty()) {
    UseConfidence u;
    u.classId = id;
    u.status = Status::Validated;
    if (!it->second.errorByGpu.count(gpu)) {
      u.status = Status::Extrapolated;
      u.note = "kernel records of " + it->second.measuredGpu + ", used for " + gpu;
    }
    return u;
  }
  if (cls == KernelClass::Gemm) return forCompute(ComputeKind::Gemm, gpu);
  if (cls == KernelClass::Attention) return forCompute(ComputeKind::Attention, gpu);
  return forClass(std::string("compute.") + toString(cls));
}

UseConfidence ConfidenceTable::forComm(CommDomain domain, const std::string& op, uint32_t groupSize,
                                       const std::string& gpu) const {
  UseConfidence u = forClass(std::string("comm.") + toString(domain) + "." + op);
  if (u.status != Status::Validated) return u;
  const ConfidenceClass& c = classes_.at(u.classId);
  std::vector<std::string> why;
  if (c.measuredGpu != gpu) why.push_back("measured on " + c.measuredGpu + ", used for " + gpu);
  if (std::find(c.measuredRanks.begin(), c.measuredRanks.end(), groupSize) == c.measuredRanks.end())
    why.push_back("measured on " + ranksText(c.measuredRanks) + " ranks, used on " + std::to_string(groupSize));
  if (!why.empty()) {
    u.status = Status::Extrapolated;
    for (const auto& w : why) u.note += (u.note.empty() ? "" : "; ") + w;
  }
  return u;
}

ConfidenceTable buildConfidence(const GemmModel* gemm, const ValidationResult* validation,
                                const std::string& validationGpu, const std::string& why, const KernelModels* kernels,
                                const std::string& planGpu, const LayeredValidation* layered,
                                const std::vector<FusedNodesValidation>* fusedNodes) {
  ConfidenceTable t;
  {
    ConfidenceClass c;
    c.id = "compute.gemm";
    c.what = "GEMMs (forward, data and weight gradients), priced by the GEMM model";
    if (gemm) {
      c.error = gemm->leaveOneShapeOut;
      c.measuredGpu = gemm->gpu;
      c.method = "leave-one-shape-out error of the GEMM model over " + std::to_string(gemm->samples.size()) +
                 " cuBLAS records of " + std::to_string(gemm->shapes) + " shapes on " + gemm->gpu;
    } else {
      c.method = "no GEMM measurement found";
    }
    t.add(c);
  }
  t.add({"compute.attention",
         "attention core (FlashAttention-style kernel), priced by the GEMM model",
         std::nullopt,
         "no attention kernel has been measured",
         "",
         {},
         {},
         ""});
  // Every other class of the census: no kernel model yet (issue 32 item 3), so the roofline prices it.
  for (int k = 0; k < kKernelClasses; ++k) {
    const auto cls = static_cast<KernelClass>(k);
    if (cls == KernelClass::Gemm || cls == KernelClass::Attention) continue;
    t.add({std::string("compute.") + toString(cls),
           std::string(toString(cls)) + " kernels, priced by the roofline c0 + bytes / B (unmeasured class)",
           std::nullopt,
           "roofline: unmeasured (no kernel records of this class)",
           "",
           {},
           {},
           ""});
  }
  // Every class with kernel records: the kernel models' leave-one-shape-out error per GPU.
  for (int k = 0; kernels && k < kKernelClasses; ++k) {
    const auto cls = static_cast<KernelClass>(k);
    const auto byGpu = kernels->classErrors(cls);
    if (byGpu.empty()) continue;
    ConfidenceClass c;
    c.id = std::string("compute.") + toString(cls);
    c.what =
        std::string(toString(cls)) + " kernels, priced by the kernel model c0 + flops / R + bytes / B fitted per GPU";
    c.measuredGpu = byGpu.count(planGpu) ? planGpu : byGpu.begin()->first;
    c.error = byGpu.at(c.measuredGpu).leaveOneShapeOut;
    c.method = "leave-one-shape-out error of the kernel models";
    for (const auto& [gpu, e] : byGpu) {
      c.errorByGpu[gpu] = e.leaveOneShapeOut;
      c.method += "; " + gpu + ": " + std::to_string(e.records) + " records of " + std::to_string(e.shapes) +
                  " shapes, median " + formatNumber(e.leaveOneShapeOut.medianAbsPct, 3) + " %, max " +
                  formatNumber(e.leaveOneShapeOut.maxAbsPct, 3) + " %";
    }
    t.add(c);
  }

  // Errors per op: our engine's (the simulator on its committed records) and the layered model's (NCCL's
  // committed `impl: nccl` records predicted by the nccl-* family, as mk-validate's nccl line computes them).
  struct OpErrors {
    std::vector<double> errs;
    std::set<uint32_t> ranks;
  };
  std::map<std::string, OpErrors> engine, nccl;
  if (validation)
    for (const ValidationRow& r : validation->rows) {
      OpErrors& e = engine[toString(r.request.spec.op)];
      e.errs.push_back(r.simErrPct);
      e.ranks.insert(r.request.nRanks);
    }
  if (layered)
    for (const LayeredRow& r : layered->rows) {
      nccl[r.op].errs.push_back(r.errPct);
      nccl[r.op].ranks.insert(r.ranks);
    }
  // One class per op from `by`: its error when it has records, else why not.
  auto fromRecords = [&](const std::string& id, const std::string& what, const std::map<std::string, OpErrors>& by,
                         const char* op, const std::string& records, bool ran) {
    ConfidenceClass c;
    c.id = id;
    c.what = what;
    auto it = by.find(op);
    if (it != by.end() && !it->second.errs.empty()) {
      c.error = errorStats(it->second.errs);
      c.measuredGpu = validationGpu;
      c.measuredRanks.assign(it->second.ranks.begin(), it->second.ranks.end());
      c.method = "the error on " + std::to_string(c.error->n) + " committed " + records + " (this plan's profile)";
    } else {
      c.method = ran ? std::string("no committed measurement of ") + op + " inside a node" : why;
    }
    t.add(c);
  };
  for (const char* op : kCollectives) {
    fromRecords(std::string("comm.nvlink.") + op,
                std::string(op) + " inside one node (NVLink), the layered baseline (NCCL's model), simulated", nccl, op,
                "impl: nccl records of the layered model (mk-validate's nccl line)", layered != nullptr);
    fromRecords(std::string("engine.nvlink.") + op,
                std::string(op) + " inside one node by this project's engine (the fused operators' collectives)",
                engine, op, "records of this project's engine (mk-validate's comparison)", validation != nullptr);
    ConfidenceClass n;
    n.id = std::string("comm.network.") + op;
    n.what = std::string(op) + " across nodes, simulated";
    n.method = "no inter-node measurement is committed";
    t.add(n);
  }
  t.add({"model.pipeline",
         "pipeline bubble ((p - 1) / v micro-batch times)",
         std::nullopt,
         "no pipelined training step has been measured",
         "",
         {},
         {},
         ""});
  t.add({"model.overlap",
         "what the step model hides: gradient buckets behind the backward pass, ZeRO gathers",
         std::nullopt,
         "no training step has been measured",
         "",
         {},
         {},
         ""});
  t.add(fusedClass(fusedNodes));
  return t;
}

}  // namespace mk::plan
