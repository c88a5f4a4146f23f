// mkernel — prediction JSON and Chrome / Perfetto trace (output.hpp).
#include "mk/sim/output.hpp"

#include <algorithm>
#include <nlohmann/json.hpp>

#include "mk/io/trace.hpp"

namespace mk::sim {

namespace {

using Json = nlohmann::ordered_json;

constexpr const char* kPredictionSchema = "mkernel.prediction.v1";
constexpr std::size_t kBusiestLinks = 3;

Json linkJson(const LinkLoad& l) {
  return Json{{"name", l.name},      {"bandwidth_gbs", l.bandwidthGBs}, {"bytes", l.bytes},
              {"avg_gbs", l.avgGBs}, {"peak_gbs", l.peakGBs},           {"utilization", l.utilization}};
}

/// Fields that describe the run (shared by single predictions and sweeps).
void describe(Json& j, const RunInfo& info) {
  j["engine"] = "simgrid-3.32";
  j["op"] = info.op;
  j["algo"] = info.chosenByAuto ? "auto:" + info.algo : info.algo;  // mk-bench's spelling of an auto choice
  j["cluster"] = info.cluster;
  j["nodes"] = info.nodes;
  j["gpus_per_node"] = info.gpusPerNode;
  j["ranks"] = info.ranks;
  j["dtype"] = info.dtype;
  j["chunks"] = info.chunks;
  j["channels"] = info.channels;
  j["profile"] = info.profileSource;
}

/// Fields of one size.
void result(Json& j, const Prediction& p, const RunInfo& info) {
  const double algbw = algBwGBs(info.bytes, p.totalUs);
  j["bytes"] = info.bytes;
  j["count"] = info.count;
  if (!info.inter.empty()) j["inter"] = info.inter;  // per size: "auto" may choose differently per size
  j["time_us"] = p.totalUs;
  j["algbw_gbs"] = algbw;
  j["busbw_gbs"] = algbw * info.busBwFactor;
  if (info.closedFormUs) j["closed_form_us"] = *info.closedFormUs;
  if (info.uncontendedUs) j["uncontended_us"] = *info.uncontendedUs;
  Json busiest = Json::array();
  for (std::size_t i = 0; i < std::min(kBusiestLinks, p.links.size()); ++i) busiest.push_back(linkJson(p.links[i]));
  j["busiest_links"] = busiest;
}

/// A fused op's shape, split and breakdown; `timeUs` is the prediction the rates are taken from.
Json fusedJson(const FusedRunInfo& f, double timeUs, uint32_t ranks) {
  const FusedSpec& s = f.plan.spec;
  const FusedOptions& o = f.plan.opt;
  const FusedEstimate& e = f.plan.estimate;
  const double flops = fusedFlops(s);
  Json j{
      {"m", s.m},
      {"n", s.n},
      {"k", s.k},
      {"layout_b", toString(s.layoutB)},
      {"tile_rows", o.tileRows},
      {"order", toString(o.order)},
      {"ctas", o.ctas},
      {"comm_ctas", o.commCtas},
      {"compute_ctas", e.computeCtas},
      {"compute_lanes", o.computeLanes},
      {"chosen_by_model",
       {{"tile_rows", f.plan.tileDefault},
        {"order", f.plan.orderByModel},
        {"split", f.plan.splitByModel},
        {"compute_lanes", f.plan.lanesByModel}}},
      {"gflop", flops / 1e9},
      {"tflops_per_gpu", timeUs > 0 ? flops / ranks / (timeUs * 1e6) : 0.0},
      {"bound", toString(e.bound)},
      {"busy_us", {{"tensor", e.tensorUs}, {"nvlink", e.nvlinkUs}, {"network", e.networkUs}, {"memory", e.memoryUs}}},
      {"fill_drain_us", e.fillDrainUs},
      {"gemm_alone_us", f.layered.gemmUs},
      {"collective_alone_us", f.layered.collectiveUs},
      {"collective", f.layered.collective},
      {"unfused_us", f.layered.totalUs()},
      {"physical_bound_us", f.layered.boundUs()},
      {"speedup_vs_unfused", timeUs > 0 ? f.layered.totalUs() / timeUs : 0.0}};
  return j;
}

Json statsJson(const SimStats& s) {
  return Json{{"steps", s.steps},   {"comms", s.comms},        {"execs", s.execs},
              {"actors", s.actors}, {"wall_s", s.wallSeconds}, {"peak_rss_mib", s.peakRssMiB}};
}

}  // namespace

double algBwGBs(uint64_t bytes, double timeUs) noexcept {
  return timeUs > 0 ? static_cast<double>(bytes) / (timeUs * 1e3) : 0.0;
}

std::string predictionToJson(const Prediction& p, const RunInfo& info, int indent) {
  Json j;
  j["schema"] = kPredictionSchema;
  describe(j, info);
  result(j, p, info);
  if (info.fused) j["fused"] = fusedJson(*info.fused, p.totalUs, info.ranks);
  Json links = Json::array();
  for (const LinkLoad& l : p.links) links.push_back(linkJson(l));
  j["links"] = links;
  j["stats"] = statsJson(p.stats);
  return j.dump(indent);
}

std::string sweepToJson(const std::vector<std::pair<RunInfo, Prediction>>& rows, int indent) {
  Json j;
  j["schema"] = kPredictionSchema;
  if (!rows.empty()) describe(j, rows.front().first);
  const bool perSize = !rows.empty() && rows.front().first.chosenByAuto;
  if (perSize) {  // "auto" decides per size: each result says what it chose
    j["algo"] = "auto";
    j.erase("chunks");
    j.erase("channels");
  }
  Json results = Json::array();
  for (const auto& [info, p] : rows) {
    Json r;
    if (perSize) {
      r["algo"] = info.algo;
      r["chunks"] = info.chunks;
      r["channels"] = info.channels;
    }
    result(r, p, info);
    r["stats"] = statsJson(p.stats);
    results.push_back(r);
  }
  j["results"] = results;
  return j.dump(indent);
}

std::string traceToJson(const Schedule& s, const std::vector<StepRecord>& steps) {
  io::TraceWriter w;
  for (uint32_t r = 0; r < s.nRanks; ++r) {
    w.process(r, "rank " + std::to_string(r) + " (node " + std::to_string(r < s.nodeOf.size() ? s.nodeOf[r] : 0) + ")");
    for (uint32_t l = 0; r < s.lanes.size() && l < s.lanes[r].size(); ++l)
      w.lane(r, l, "lane " + std::to_string(l) + " (" + toString(s.lanes[r][l].role) + ")");
  }
  for (const StepRecord& st : steps)
    w.slice({st.rank,
             st.lane,
             toString(st.kind),
             toString(st.link),
             io::usToNs(st.startUs),
             io::usToNs(st.endUs),
             {{"step", uint64_t{st.step}}, {"kind", std::string(toString(st.kind))}, {"bytes", uint64_t{st.bytes}}}});
  return w.finish();
}

}  // namespace mk::sim
