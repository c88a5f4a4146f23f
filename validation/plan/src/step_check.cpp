// mkernel — the planner against measured training steps (step_check.hpp).
#include "mk/plan/step_check.hpp"

#include <cstdio>
#include <map>
#include <optional>

#include "mk/cost/cost.hpp"
#include "mk/error.hpp"
#include "mk/plan/gemm_model.hpp"
#include "mk/plan/kernel_model.hpp"
#include "mk/plan/step_model.hpp"
#include "mk/workload/lowering.hpp"
#include "mk/workload/workload.hpp"

namespace mk::plan {

namespace {

std::string unquoted(const std::string& jsonText) {
  return jsonText.size() >= 2 && jsonText.front() == '"' ? jsonText.substr(1, jsonText.size() - 2) : jsonText;
}

}  // namespace

std::string stepKernelKey(const ComputeOp& op) {
  return std::string(toString(op.cls)) + " " + (op.cls == KernelClass::Gemm ? std::string() : op.kernel) + " " +
         dtypeName(op);
}

StepCheckResult checkSteps(const std::vector<MeasurementFile>& files, const std::vector<std::string>& names) {
  return checkSteps(files, names, KernelModels::fit(files, names));
}

StepCheckResult checkSteps(const std::vector<MeasurementFile>& files, const std::vector<std::string>& names,
                           const KernelModels& kernels) {
  StepCheckResult out;
  std::map<std::string, std::vector<double>> byGpu;
  out.kernelNote = std::to_string(kernels.models().size()) + " kernel models fitted on " +
                   std::to_string(kernels.records()) + " kernel records";
  std::vector<double> errors;
  std::map<std::string, GemmModel> gemms;  // per GPU of the records: fitted once
  for (std::size_t f = 0; f < files.size(); ++f) {
    const auto g = files[f].system.find("gpu");
    for (std::size_t i = 0; i < files[f].records.size(); ++i) {
      const MeasurementRecord& r = files[f].records[i];
      if (r.op != "step") continue;
      const std::string where = names[f] + ": records[" + std::to_string(i) + "]";
      if (g == files[f].system.end()) throw Error(ErrorCode::InvalidArgument, names[f] + ": system.gpu: missing");
      StepCheck c;
      c.file = names[f];
      c.record = i;
      c.gpu = unquoted(g->second);
      const auto wl = r.extra.find("workload");
      if (wl == r.extra.end())
        throw Error(ErrorCode::InvalidArgument, where + ".workload: missing (a step record carries its workload)");
      Workload w;
      ResolvedLayout layout;
      NodeSpec node;
      try {
        w = workloadFromJson(wl->second);
        layout = resolveLayout(w, 1);
        node = presetNodeOfGpu(presetGpuName(c.gpu));
      } catch (const Error& e) {
        throw Error(ErrorCode::InvalidArgument, where + ".workload: " + e.message());
      }
      if (w.training.fp8 && !(node.fp8Tflops > 0))
        throw Error(ErrorCode::InvalidArgument,
                    where + ".workload.training.dtype: fp8 on " + c.gpu + ", a GPU without FP8 tensor cores");
      auto fitted = gemms.find(node.gpu);
      if (fitted == gemms.end()) {
        std::optional<GemmModel> m = fitGemmModelFor(files, names, node.gpu);
        // No cuBLAS GEMM records: the kernel models price the GEMMs, and what they miss goes at the gemmTflops of
        // the GPU's datasheet profile, the planner's rule without records.
        if (!m) m = gemmModelAtRate(node, defaultProfile(presetTopologyOfGpu(node.gpu)).gemmTflops);
        fitted = gemms.emplace(node.gpu, std::move(*m)).first;
      }
      const GemmModel* gemm = &fitted->second;
      const StepLowering step = lowerStep(w, layout);
      std::vector<StagePrices> prices(step.stages.size());
      for (std::size_t s = 0; s < step.stages.size(); ++s)
        for (const ComputeOp& op : step.stages[s].compute) {
          const KernelPrice p = priceCompute(*gemm, kernels, op, node);
          prices[s].computeUs.push_back(p.us);
          out.kernelsByGpu[presetGpuName(c.gpu)].insert(stepKernelKey(op));
          if (p.source != "kernel-model" && c.unmodelled.find(op.kernel) == std::string::npos)
            c.unmodelled += (c.unmodelled.empty() ? "" : ",") + op.kernel;
        }
      c.workload = w.name;
      c.dtype = w.training.fp8 ? "fp8" : toString(w.training.dtype);
      c.seq = w.training.seq;
      c.microBatch = w.training.microBatch;
      c.microBatches = layout.microBatches;
      c.measuredUs = r.timeUs;
      c.predictedUs = composeStep(w, step, prices).stepUs;
      c.errorPct = (c.predictedUs / c.measuredUs - 1) * 100;
      errors.push_back(c.errorPct);
      byGpu[presetGpuName(c.gpu)].push_back(c.errorPct);
      out.checks.push_back(std::move(c));
    }
  }
  if (out.checks.empty()) throw Error(ErrorCode::NotFound, "no step record (\"op\": \"step\") in the files given");
  out.error = errorStats(errors);
  for (const auto& [gpu, e] : byGpu) out.errorByGpu[gpu] = errorStats(e);
  return out;
}

std::string stepCheckText(const StepCheckResult& r) {
  std::string s;
  char line[320];
  for (const StepCheck& c : r.checks) {
    std::snprintf(line, sizeof line,
                  "%-22s %-9s seq %5llu mb %llu x %-3llu %-26s measured %9.1f ms  predicted %9.1f ms  %+6.1f %%%s%s\n",
                  c.workload.c_str(), c.dtype.c_str(), static_cast<unsigned long long>(c.seq),
                  static_cast<unsigned long long>(c.microBatch), static_cast<unsigned long long>(c.microBatches),
                  c.gpu.c_str(), c.measuredUs / 1e3, c.predictedUs / 1e3, c.errorPct,
                  c.unmodelled.empty() ? "" : "  no kernel model: ", c.unmodelled.c_str());
    s += line;
  }
  s += formatSummaryLine(r.error, "steps") + "\n";
  return s;
}

}  // namespace mk::plan
