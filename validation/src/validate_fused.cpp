// mkernel — validation of the fused operators (validate.hpp, "the fused operators"): every gemm-rs, ag-gemm and
// gemm-ar record of our engine predicted with the options it ran, by the fused model the planner and mk-sim use, and
// every ring-attention record with the schedule it ran (ring_attention_records.cpp).
#include <nlohmann/json.hpp>

#include <algorithm>
#include <string>
#include <utility>

#include "mk/algorithms/request.hpp"
#include "mk/error.hpp"
#include "mk/io/json.hpp"
#include "mk/resources.hpp"
#include "mk/util/format.hpp"
#include "mk/validation/prediction_cache.hpp"
#include "mk/validation/validate.hpp"
#include "record_fields.hpp"

namespace mk {

namespace record_fields {

std::optional<nlohmann::json> field(const MeasurementRecord& r, const char* key) {
  const auto it = r.extra.find(key);
  if (it == r.extra.end()) return std::nullopt;
  return nlohmann::json::parse(it->second);
}

std::optional<uint32_t> countField(const MeasurementRecord& r, const char* key, const std::string& where, bool required,
                                   uint32_t min) {
  const auto v = field(r, key);
  if (!v) {
    if (required)
      throw Error(ErrorCode::InvalidArgument, where + ": missing field '" + key +
                                                  "' (mk-bench writes it for a fused op: needed to rebuild the "
                                                  "schedule that ran)");
    return std::nullopt;
  }
  return json_get::u32(*v, where + ": field '" + key + "'", UINT32_MAX, min);
}

void bad(const std::string& where, const std::string& what) {
  throw Error(ErrorCode::InvalidArgument, where + ": " + what);
}

DType dtypeOf(const MeasurementRecord& r, const std::string& where) {
  try {
    return requireDType(r.dtype, "dtype");
  } catch (const Error& e) {
    bad(where, e.message());
  }
}

uint32_t ranksOf(const MeasurementRecord& r, const std::string& where) {
  if (r.ranks == 0) bad(where, "ranks must be >= 1");
  return r.ranks;
}

RecordPlacement placementOf(const MeasurementRecord& r, const std::string& where, uint32_t nRanks) {
  RecordPlacement p;
  if (const auto sh = field(r, "shared_gpu")) p.sharedGpu = json_get::boolean(*sh, where + ": field 'shared_gpu'");
  if (const auto nodes = countField(r, "nodes", where, false, 1)) {
    if (nRanks % *nodes != 0)
      bad(where, "field 'nodes' " + std::to_string(*nodes) + " does not divide the record's " + std::to_string(nRanks) +
                     " ranks into equal nodes");
    p.nodes = *nodes;
  }
  if (const auto rpn = countField(r, "ranks_per_node", where, false, 1)) {
    if (p.nodes == 0) bad(where, "field 'ranks_per_node' needs 'nodes' (how many nodes the ranks ran on)");
    if (*rpn != nRanks / p.nodes)
      bad(where, "field 'ranks_per_node' " + std::to_string(*rpn) +
                     " is not ranks / nodes = " + std::to_string(nRanks / p.nodes));
  }
  if (const auto t = field(r, "transport")) p.transport = json_get::text(*t, where + ": field 'transport'", 64);
  if (p.nodes == 1) p.nodes = 0;  // one node, as a record without the field
  return p;
}

}  // namespace record_fields

namespace {

using nlohmann::json;
using record_fields::bad;
using record_fields::countField;
using record_fields::dtypeOf;
using record_fields::field;
using record_fields::placementOf;
using record_fields::ranksOf;
using record_fields::RecordPlacement;

std::string describeFused(const MeasurementRecord& r) {
  auto dim = [&](const char* k) {
    const auto it = r.extra.find(k);
    return it == r.extra.end() ? std::string("?") : it->second;
  };
  if (isRingAttentionRecord(r))
    return r.op + " " + std::to_string(r.ranks) + " x " + dim("seq_per_rank") + " tokens, " + dim("q_heads") + "/" +
           dim("kv_heads") + " heads";
  return r.op + " " + dim("m") + " x " + dim("n") + " x " + dim("k");
}

/// One prediction: a fused record's schedule on its placement, under the profile of the SMs its ranks held.
struct Job {
  Schedule schedule;
  Topology topo;
  Profile profile;
};

/// A ring-attention record's row and job (its closed form the uncontended timeline); false when it is skipped
/// (listed in out.skipped: a broken record under skipBad, or one the model cannot place or split).
bool prepareRing(const MeasurementRecord& r, const std::string& where, const Profile& profile,
                 const std::string& cluster, const ValidationOptions& options, uint64_t limit, FusedValidation& out,
                 FusedRow& row, Job& job) {
  try {
    row.ring = ringAttentionRecordRequest(r, where);
  } catch (const Error& e) {
    if (!options.skipBad) throw;
    out.skipped.push_back({row.file, row.index, e.message()});
    return false;
  }
  const RingAttentionRecordRequest& q = *row.ring;
  try {
    job.topo = fusedRecordTopology(cluster, q.nRanks, q.nodes, q.sharedGpu);
    job.schedule = ringAttentionRecordSchedule(q, job.topo.layout(q.nRanks));
    // Shared GPU or not, each lane computes with its own CTAs' SMs (the kernel's other CTAs do not compute).
    job.profile = heldSmsProfile(profile, q.computeCtas + q.commCtas);
  } catch (const Error& e) {
    out.skipped.push_back({row.file, row.index, where + ": not priced: " + e.message()});
    return false;
  }
  try {
    MemoryJob mj;
    mj.simulate = true;
    mj.platformGpus = static_cast<uint64_t>(job.topo.node.gpus) * job.topo.nodes;
    requireWithin(memoryNeed(countOf(job.schedule), mj), limit / std::max(1u, options.jobs));
  } catch (const Error& e) {
    if (!options.skipBad) throw Error(e.code(), where + ": " + e.message());
    out.skipped.push_back({row.file, row.index, where + ": " + e.message()});
    return false;
  }
  row.gpusPerNode = job.topo.node.gpus;
  row.closedUs = simulateUncontended(job.schedule, job.profile, job.topo).totalUs;
  return true;
}

}  // namespace

bool isFusedRecord(const MeasurementRecord& r) noexcept {
  return r.impl == "mkernel" && parseFusedOp(r.op).has_value();
}

FusedRecordRequest fusedRecordRequest(const MeasurementRecord& r, const std::string& where) {
  FusedRecordRequest q;
  const auto op = parseFusedOp(r.op);
  if (!op) bad(where, "op '" + r.op + "' is not a fused operator (expected gemm-rs, ag-gemm or gemm-ar)");
  q.spec.op = *op;
  q.spec.dtype = dtypeOf(r, where);
  q.nRanks = ranksOf(r, where);
  q.spec.m = *countField(r, "m", where, true, 1);
  q.spec.n = *countField(r, "n", where, true, 1);
  q.spec.k = *countField(r, "k", where, true, 1);
  if (const auto lb = field(r, "layout_b")) {
    const auto l = lb->is_string() ? parseMatrixLayout(lb->get<std::string>()) : std::nullopt;
    if (!l) bad(where, "field 'layout_b' must be \"row\" or \"col\" (got " + describeJson(*lb) + ")");
    q.spec.layoutB = *l;
  }
  const auto order = field(r, "order");
  if (!order)
    bad(where,
        "missing field 'order' (own-first, own-last or interleaved: the tile order that ran; mk-bench writes "
        "it)");
  const auto o = order->is_string() ? parseTileOrder(order->get<std::string>()) : std::nullopt;
  if (!o || *o == TileOrder::Auto)
    bad(where, "field 'order' must be own-first, own-last or interleaved (got " + describeJson(*order) + ")");
  q.opt.order = *o;
  q.opt.tileRows = *countField(r, "tile_rows", where, true, 1);
  const uint32_t compute = *countField(r, "compute_ctas", where, true, 1);
  q.opt.commCtas = *countField(r, "comm_ctas", where, true, 0);
  q.opt.ctas = countField(r, "ctas", where, false, 1).value_or(compute + q.opt.commCtas);
  if (q.opt.ctas != compute + q.opt.commCtas)
    bad(where, "field 'ctas' " + std::to_string(q.opt.ctas) + " is not compute_ctas " + std::to_string(compute) +
                   " + comm_ctas " + std::to_string(q.opt.commCtas) + " (a rank's CTAs are the two lanes' together)");
  q.opt.computeLanes = countField(r, "compute_lanes", where, false, 1).value_or(1);
  const RecordPlacement placed = placementOf(r, where, q.nRanks);
  q.nodes = placed.nodes;
  q.sharedGpu = placed.sharedGpu;
  q.transport = placed.transport;
  try {
    validateFusedSpec(q.spec, q.nRanks);
  } catch (const Error& e) {
    bad(where, "fields m, n, k (the shape that ran): " + e.message());
  }
  return q;
}

Topology fusedRecordTopology(const std::string& cluster, const FusedRecordRequest& q) {
  return fusedRecordTopology(cluster, q.nRanks, q.nodes, q.sharedGpu);
}

Topology fusedRecordTopology(const std::string& cluster, uint32_t nRanks, uint32_t nodes, bool sharedGpu) {
  if (nodes > 0) return placeRecordRanks(cluster, nRanks, nodes);
  Topology t = loadTopology(cluster, 1);
  if (nRanks > t.node.gpus) {
    if (!sharedGpu)
      throw Error(ErrorCode::InvalidArgument,
                  "the record ran " + std::to_string(nRanks) + " ranks on one node, but cluster " + t.name + " has " +
                      std::to_string(t.node.gpus) +
                      " GPU(s) per node: give --cluster a node with as many GPUs, or a record with 'nodes'");
    // The engine prices ranks sharing a GPU as a node of that many GPUs like it (its topology for "auto").
    t.node.gpus = nRanks;
  }
  return t;
}

std::string FusedRow::opName() const { return ring ? "ring-attention" : toString(request.spec.op); }

FusedValidation validateFused(const std::vector<MeasurementFile>& files, const std::vector<std::string>& names,
                              const std::string& cluster, const Profile& profileIn, const ValidationOptions& options) {
  FusedValidation out;
  Profile profile = profileIn;
  out.filled = fillCtaDefaults(profile, loadTopology(cluster));  // the split is priced by timeline rule 2b
  const uint64_t limit = options.maxMemory > 0 ? options.maxMemory : defaultMaxMemory();
  std::vector<Job> jobs;
  for (std::size_t f = 0; f < files.size(); ++f) {
    for (std::size_t i = 0; i < files[f].records.size(); ++i) {
      const MeasurementRecord& r = files[f].records[i];
      const bool ring = isRingAttentionRecord(r);
      if (!isFusedRecord(r) && !ring) continue;
      if (!options.ops.empty() || !options.algos.empty()) {
        ++out.filtered;
        continue;
      }
      const std::string where = names[f] + ": records[" + std::to_string(i) + "] (" + describeFused(r) + ")";
      FusedRow row;
      row.file = names[f];
      row.index = i;
      row.measuredUs = r.timeUs;
      Job job;
      if (ring) {
        if (prepareRing(r, where, profile, cluster, options, limit, out, row, job)) {
          out.rows.push_back(std::move(row));
          jobs.push_back(std::move(job));
        }
        continue;
      }
      try {
        row.request = fusedRecordRequest(r, where);
      } catch (const Error& e) {
        if (!options.skipBad) throw;
        out.skipped.push_back({names[f], i, e.message()});
        continue;
      }
      const FusedRecordRequest& q = row.request;
      FusedPlan plan;
      try {
        // What the model cannot place or split on this cluster is reported, not fatal: the record itself is sound.
        job.topo = fusedRecordTopology(cluster, q);
        // Ranks that shared one GPU held only their own CTAs' SMs of it (heldSmsProfile); a rank alone on its GPU
        // keeps the lanes' split of all of it, as the engine plans it.
        job.profile = q.sharedGpu ? heldSmsProfile(profile, q.opt.ctas) : profile;
        plan = planFused(q.spec, q.opt, job.topo, q.nRanks, job.profile);
      } catch (const Error& e) {
        out.skipped.push_back({names[f], i, where + ": not priced: " + e.message()});
        continue;
      }
      try {
        MemoryJob mj;
        mj.simulate = true;
        mj.platformGpus = static_cast<uint64_t>(job.topo.node.gpus) * job.topo.nodes;
        checkMemory(plan.spec, job.topo.layout(q.nRanks), plan.opt, mj, limit / std::max(1u, options.jobs));
        job.schedule = generate(plan.spec, job.topo.layout(q.nRanks), plan.opt);
      } catch (const Error& e) {
        if (!options.skipBad) throw Error(e.code(), where + ": " + e.message());
        out.skipped.push_back({names[f], i, where + ": " + e.message()});
        continue;
      }
      row.gpusPerNode = job.topo.node.gpus;
      row.closedUs = plan.estimate.totalUs;
      out.rows.push_back(std::move(row));
      jobs.push_back(std::move(job));
    }
  }
  std::vector<TotalJob> work;
  for (const Job& j : jobs) work.push_back(TotalJob{&j.schedule, &j.topo, &j.profile});
  const std::vector<double> simUs = predictTotals(work, options.jobs, options.cache, [&](std::size_t k) {
    return out.rows[k].file + ": records[" + std::to_string(out.rows[k].index) + "]";
  });
  std::vector<double> simErr, closedErr;
  for (std::size_t k = 0; k < out.rows.size(); ++k) {
    FusedRow& row = out.rows[k];
    row.simUs = simUs[k];
    row.simErrPct = errorPct(row.simUs, row.measuredUs);
    row.closedErrPct = errorPct(row.closedUs, row.measuredUs);
    simErr.push_back(row.simErrPct);
    closedErr.push_back(row.closedErrPct);
  }
  out.sim = errorStats(simErr);
  out.closed = errorStats(closedErr);
  return out;
}

std::string formatFusedTable(const FusedValidation& v) {
  std::string out =
      strprintf("%-8s %-20s %-9s %6s %-11s %9s %5s %13s %13s %13s %9s %9s\n", "fused", "m x n x k", "ranks", "tile",
                "order", "cmp/comm", "lanes", "measured(us)", "sim(us)", "closed(us)", "sim err%", "cf err%");
  for (const FusedRow& r : v.rows) {
    if (r.ring) {
      const RingAttentionRecordRequest& q = *r.ring;
      const std::string ranks = std::to_string(q.nRanks / std::max(1u, q.nodes)) + "x" +
                                std::to_string(std::max(1u, q.nodes)) + (q.sharedGpu ? "s" : "");
      const std::string split = std::to_string(q.computeCtas) + "/" + std::to_string(q.commCtas);
      out += strprintf("%-8s %-20s %-9s %6s %-11s %9s %5u %13.2f %13.2f %13.2f %+9.1f %+9.1f\n", "ring-att",
                       describeRingAttention(q.spec).c_str(), ranks.c_str(), "-", q.spec.causal ? "zigzag" : "ring",
                       split.c_str(), 1u, r.measuredUs, r.simUs, r.closedUs, r.simErrPct, r.closedErrPct);
      continue;
    }
    const FusedRecordRequest& q = r.request;
    const std::string shape =
        std::to_string(q.spec.m) + "x" + std::to_string(q.spec.n) + "x" + std::to_string(q.spec.k);
    const std::string ranks = std::to_string(q.nRanks / std::max(1u, q.nodes)) + "x" +
                              std::to_string(std::max(1u, q.nodes)) + (q.sharedGpu ? "s" : "");
    const std::string split = std::to_string(q.opt.ctas - q.opt.commCtas) + "/" + std::to_string(q.opt.commCtas);
    out += strprintf("%-8s %-20s %-9s %6u %-11s %9s %5u %13.2f %13.2f %13.2f %+9.1f %+9.1f\n", toString(q.spec.op),
                     shape.c_str(), ranks.c_str(), q.opt.tileRows, toString(q.opt.order), split.c_str(),
                     q.opt.computeLanes, r.measuredUs, r.simUs, r.closedUs, r.simErrPct, r.closedErrPct);
  }
  return out;
}

std::string fusedValidationToJson(const FusedValidation& v, std::optional<double> maxMedianErrPct) {
  auto stats = [](const ErrorStats& s) {
    return json{{"n", s.n},
                {"median_abs_err_pct", s.medianAbsPct},
                {"p90_abs_err_pct", s.p90AbsPct},
                {"max_abs_err_pct", s.maxAbsPct}};
  };
  json summary = {{"sim", stats(v.sim)},    {"closed_form", stats(v.closed)}, {"gated", "sim.median_abs_err_pct"},
                  {"filtered", v.filtered}, {"skipped", v.skipped.size()},    {"profile_from_datasheet", v.filled}};
  summary["max_median_err_pct"] = maxMedianErrPct ? json(*maxMedianErrPct) : json(nullptr);
  summary["gate_passed"] = maxMedianErrPct ? json(v.sim.medianAbsPct <= *maxMedianErrPct) : json(nullptr);
  json rows = json::array();
  for (const FusedRow& r : v.rows) {
    if (r.ring) {
      const RingAttentionRecordRequest& q = *r.ring;
      rows.push_back({{"file", r.file},
                      {"index", r.index},
                      {"op", "ring-attention"},
                      {"batch", q.spec.batch},
                      {"seq", q.spec.seq},
                      {"q_heads", q.spec.qHeads},
                      {"kv_heads", q.spec.kvHeads},
                      {"head_dim", q.spec.headDim},
                      {"causal", q.spec.causal},
                      {"ranks", q.nRanks},
                      {"nodes", std::max(1u, q.nodes)},
                      {"gpus_per_node", r.gpusPerNode},
                      {"shared_gpu", q.sharedGpu},
                      {"transport", q.transport.empty() ? json(nullptr) : json(q.transport)},
                      {"ctas", q.ctas},
                      {"compute_ctas", q.computeCtas},
                      {"comm_ctas", q.commCtas},
                      {"measured_us", r.measuredUs},
                      {"sim_us", r.simUs},
                      {"closed_us", r.closedUs},
                      {"sim_err_pct", r.simErrPct},
                      {"closed_err_pct", r.closedErrPct}});
      continue;
    }
    const FusedRecordRequest& q = r.request;
    rows.push_back({{"file", r.file},
                    {"index", r.index},
                    {"op", toString(q.spec.op)},
                    {"m", q.spec.m},
                    {"n", q.spec.n},
                    {"k", q.spec.k},
                    {"layout_b", toString(q.spec.layoutB)},
                    {"ranks", q.nRanks},
                    {"nodes", std::max(1u, q.nodes)},
                    {"gpus_per_node", r.gpusPerNode},
                    {"shared_gpu", q.sharedGpu},
                    {"transport", q.transport.empty() ? json(nullptr) : json(q.transport)},
                    {"tile_rows", q.opt.tileRows},
                    {"order", toString(q.opt.order)},
                    {"ctas", q.opt.ctas},
                    {"comm_ctas", q.opt.commCtas},
                    {"compute_lanes", q.opt.computeLanes},
                    {"measured_us", r.measuredUs},
                    {"sim_us", r.simUs},
                    {"closed_us", r.closedUs},
                    {"sim_err_pct", r.simErrPct},
                    {"closed_err_pct", r.closedErrPct}});
  }
  json skipped = json::array();
  for (const auto& s : v.skipped) skipped.push_back({{"file", s.file}, {"index", s.index}, {"reason", s.reason}});
  return json{{"summary", summary}, {"rows", rows}, {"skipped", skipped}}.dump();
}

}  // namespace mk
