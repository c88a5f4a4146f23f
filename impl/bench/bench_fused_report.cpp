// mk-bench gemm-rs | ag-gemm | gemm-ar — the table and the records of one shape (bench_fused_report.hpp).
#include "bench_fused_report.hpp"

#include <algorithm>
#include <cstdio>

#include "bench_common.hpp"
#include "mk/util/format.hpp"

namespace mkbench {

void printFusedHeader() {
  std::printf("%8s %5s %5s %6s %6s %6s %5s %11s %5s %6s %10s %10s %10s %10s %10s %8s %9s %9s %7s\n", "op", "ranks",
              "nodes", "m", "n", "k", "tile", "order", "lanes", "cmp/cm", "fused_us", "base_us", "gemm_us", "coll_us",
              "bound_us", "speedup", "vs_bound", "TFLOP/s", "check");
}

void reportFusedShape(const FusedRunInfo& info, const FusedShapeTimes& t, bool print, mk::MeasurementFile& file) {
  const mk::FusedSpec& spec = t.spec;
  const bool ag = spec.op == mk::FusedOp::AllGatherGemm;
  const double flops = mk::fusedFlops(spec);
  const double base = t.baseUs, bound = std::max(t.gemmUs, t.collUs);
  const uint64_t collBytes = (ag ? spec.m * spec.k : spec.m * spec.n) * 2;
  auto common = [&](mk::MeasurementRecord& rec) {
    rec.op = info.op;
    rec.dtype = "bfloat16";
    rec.ranks = info.ranks;
    rec.bytes = collBytes;
    rec.iters = info.iters;
    rec.stat = "median";
    rec.extra["m"] = std::to_string(spec.m);
    rec.extra["n"] = std::to_string(spec.n);
    rec.extra["k"] = std::to_string(spec.k);
    rec.extra["layout_b"] = quoted(info.layoutB);
    rec.extra["gpus"] = std::to_string(info.gpus);
    rec.extra["shared_gpu"] = info.shared ? "true" : "false";
    rec.extra["flops"] = std::to_string(static_cast<uint64_t>(flops));
    if (info.processes > 1) rec.extra["processes"] = std::to_string(info.processes);
    if (info.nodes > 1) {
      rec.extra["nodes"] = std::to_string(info.nodes);
      rec.extra["ranks_per_node"] = std::to_string(info.ranks / info.nodes);
      rec.extra["transport"] = quoted(info.transport);
    }
  };
  auto num = [](double v) { return mk::strprintf("%.3f", v); };
  for (const Variant& row : t.rows) {
    std::string baseText = "-", collText = "-", speedText = "-", vsText = "-";
    if (t.haveBase) {
      baseText = mk::strprintf("%.2f", base);
      collText = mk::strprintf("%.2f", t.collUs);
      speedText = mk::strprintf("%.3f", base / row.fusedUs);
      vsText = mk::strprintf("%.3f", bound / row.fusedUs);
    }
    const std::string split = std::to_string(row.computeCtas) + "/" + std::to_string(row.commCtas);
    if (print) {
      std::printf("%8s %5u %5u %6llu %6llu %6llu %5u %11s %5u %6s %10.2f %10s %10.2f %10s %10.2f %8s %9s %9.1f %7s\n",
                  info.op.c_str(), info.ranks, info.nodes, static_cast<unsigned long long>(spec.m),
                  static_cast<unsigned long long>(spec.n), static_cast<unsigned long long>(spec.k),
                  row.plan.opt.tileRows, mk::toString(row.plan.opt.order), row.plan.opt.computeLanes, split.c_str(),
                  row.fusedUs, baseText.c_str(), t.gemmUs, collText.c_str(), t.haveBase ? bound : t.gemmUs,
                  speedText.c_str(), vsText.c_str(), flops / row.fusedUs * 1e-6,
                  row.checked ? (row.ok ? "ok" : "FAIL") : "-");
      std::fflush(stdout);
    }
    // Each process names its own first mismatch (rank logs of a launch).
    if (row.checked && !row.first.empty()) std::printf("# check FAILED: %s\n", row.first.c_str());
    mk::MeasurementRecord f;
    common(f);
    f.impl = "mkernel";
    f.algo = std::string("fused ") + mk::toString(row.plan.opt.order);
    f.timeUs = row.fusedUs;
    f.algbwGBs = static_cast<double>(collBytes) / row.fusedUs * 1e-3;
    f.extra["sms"] = std::to_string(row.workers * info.ranks);  // each compute-lane CTA owns an SM
    f.extra["ctas"] = std::to_string(row.workers);
    f.extra["compute_ctas"] = std::to_string(row.computeCtas);
    f.extra["comm_ctas"] = std::to_string(row.commCtas);
    f.extra["plan_comm_ctas"] = std::to_string(row.plan.opt.commCtas);
    f.extra["tile_rows"] = std::to_string(row.plan.opt.tileRows);
    f.extra["order"] = quoted(mk::toString(row.plan.opt.order));
    f.extra["compute_lanes"] = std::to_string(row.plan.opt.computeLanes);
    f.extra["predicted_us"] = num(row.plan.estimate.totalUs);
    f.extra["tflops"] = num(flops / row.fusedUs * 1e-6);
    if (t.haveBase) {
      f.extra["baseline_us"] = num(base);
      f.extra["bound_us"] = num(bound);
      f.extra["speedup"] = num(base / row.fusedUs);
    }
    if (row.checked) {
      f.extra["check"] = row.ok ? "true" : "false";
      f.extra["check_samples"] = std::to_string(info.samples);
      f.extra["worst_error_over_tolerance"] = num(row.worst);
    }
    file.records.push_back(f);
  }
  if (t.haveBase) {
    mk::MeasurementRecord b;
    common(b);
    b.impl = t.baseImpl;
    b.algo = t.baseAlgo;
    b.timeUs = base;
    b.algbwGBs = static_cast<double>(collBytes) / base * 1e-3;
    b.extra["sms"] = std::to_string(info.sms);
    b.extra["gemm_us"] = num(t.gemmUs);
    b.extra["coll_us"] = num(t.collUs);
    b.extra["baseline"] = quoted(t.baseHow);
    b.extra["tflops"] = num(flops / base * 1e-6);
    file.records.push_back(b);
  }
}

}  // namespace mkbench
