// mk-sim's shared parts (mk_sim_common.hpp): the run's description, the replay's options and the report lines
// every op prints.
#include "mk_sim_common.hpp"

#include <algorithm>
#include <cstdio>

#include "mk/io/output_paths.hpp"
#include "mk/schedule/io.hpp"
#include "mk/sim/link_use.hpp"
#include "mk/util/format.hpp"

namespace mksim {

mk::sim::RunInfo baseInfo(const Setup& st, const mk::Schedule& s) {
  mk::sim::RunInfo info;
  info.op = st.spec ? mk::toString(st.spec->op) : s.info.op;
  info.algo = st.spec ? mk::toString(st.spec->algo) : s.info.algo;
  info.chosenByAuto = st.chosenByAuto;
  info.cluster = st.topo.name;
  info.dtype = mk::toString(st.spec ? st.spec->dtype : s.info.dtype);
  info.profileSource = st.profile.source;
  info.nodes = st.topo.nodes;
  info.gpusPerNode = st.topo.node.gpus;
  info.ranks = s.nRanks;
  info.chunks = st.spec ? st.gen.chunks : s.info.chunks;
  info.channels = st.spec ? st.gen.channels : s.info.channels;
  if (st.spec && st.spec->op == mk::CollOp::AllReduce && st.spec->algo == mk::Algorithm::Hierarchical)
    info.inter = mk::toString(st.gen.inter);
  const auto op = mk::parseCollOp(info.op);
  if (st.spec) {
    info.count = st.spec->count;
    info.bytes = mk::opBytes(*st.spec, s.nRanks);
  } else if (op) {
    mk::CollectiveSpec spec;
    spec.op = *op;
    spec.dtype = s.info.dtype;
    spec.count = s.info.count;
    info.count = s.info.count;
    info.bytes = mk::opBytes(spec, s.nRanks);
  }
  info.busBwFactor = op ? mk::busBwFactor(*op, s.nRanks) : 1.0;
  return info;
}

mk::sim::SimOptions simOptions(const Options& o, bool trace) {
  mk::sim::SimOptions so;
  so.verbose = o.verbose;
  so.trace = trace;
  so.fast = o.fast;
  if (o.guard.progressWanted())
    so.onProgress = [](double fraction, double simUs, double wallS) {
      mk::printProgress("mk-sim", "simulate", fraction, wallS, "simulated " + mk::formatMicros(simUs));
    };
  return so;
}

void printBusiestLinks(const std::vector<mk::sim::LinkLoad>& links) {
  for (std::size_t i = 0; i < std::min(kBusiestLinks, links.size()); ++i) {
    const mk::sim::LinkLoad& l = links[i];
    std::printf("  %zu. %-22s %5.1f %% busy  (avg %.1f of %.1f GB/s, %s)\n", i + 1, l.name.c_str(),
                100.0 * l.utilization, l.avgGBs, l.bandwidthGBs, mk::formatBytes(l.bytes).c_str());
  }
}

void printStats(const mk::sim::SimStats& s) {
  std::printf("simulation: %llu steps, %llu comms, %llu execs, %llu actors; %.2f s wall, %.0f MiB peak\n",
              static_cast<unsigned long long>(s.steps), static_cast<unsigned long long>(s.comms),
              static_cast<unsigned long long>(s.execs), static_cast<unsigned long long>(s.actors), s.wallSeconds,
              s.peakRssMiB);
  if (s.passes > 1)
    std::printf("transfers: a link was oversubscribed, so a second pass simulated every transfer\n");
  else if (s.timedTransfers > 0)
    std::printf("transfers: %llu timed at their caps (no link oversubscribed: SimGrid would agree)\n",
                static_cast<unsigned long long>(s.timedTransfers));
}

void writeOutputs(const Options& o, const std::string& json, const std::string& trace) {
  mk::OutputSet outputs;
  outputs.stage("--trace", o.traceOut, trace);
  outputs.stage("--json", o.jsonOut, json + "\n");
  outputs.commit();
  if (!o.traceOut.empty()) std::printf("wrote %s\n", o.traceOut.c_str());
  if (!o.jsonOut.empty()) std::printf("wrote %s\n", o.jsonOut.c_str());
}

mk::MemoryJob jobOf(const Setup& st, bool trace) {
  mk::MemoryJob job;
  job.simulate = true;
  job.trace = trace;
  job.json = false;  // the prediction's JSON holds no per-step data
  job.platformGpus =
      static_cast<uint64_t>(st.topo.node.gpus) * ((st.nRanks + st.topo.node.gpus - 1) / st.topo.node.gpus);
  return job;
}

Setup makeSetup(const Options& o, const mk::Schedule* loaded) {
  Setup st;
  const uint32_t minNodes = loaded != nullptr && !loaded->nodeOf.empty()
                                ? *std::max_element(loaded->nodeOf.begin(), loaded->nodeOf.end()) + 1
                                : 0;
  // A loaded schedule brings its own ranks: only its node count constrains the cluster.
  const mk::Placement placed =
      mk::placeRanks(o.coll.cluster, o.coll.nodes, loaded != nullptr ? 0 : o.coll.ranks, minNodes);
  st.topo = placed.topo;
  st.nRanks = placed.nRanks;
  st.profile = mk::profileFor(o.coll, st.topo);
  st.defaultProfile = o.coll.profile.empty();
  return st;
}

void printProfile(const Options& o, const Setup& st) {
  if (st.defaultProfile)
    std::printf("profile: uncalibrated (datasheet defaults)\n");
  else
    std::printf("profile: %s (%s)\n", o.coll.profile.c_str(), st.profile.source.c_str());
}

Uncontended uncontended(const Setup& st, const mk::Schedule& s) {
  Uncontended u;
  if (s.stepCount() > kUncontendedMaxSteps) return u;
  const mk::Timeline t = mk::simulateUncontended(s, st.profile, st.topo);
  u.us = t.totalUs;
  u.compute = mk::computeResourceUse(s, t, t.totalUs);
  return u;
}

std::string boundText(const mk::sim::Prediction& p, const Uncontended& u) {
  std::vector<mk::ResourceUse> uses = mk::sim::linkResourceUse(p.links);
  for (mk::ResourceUse use : u.compute) {
    // Busy over the uncontended total, taken over the predicted one: the compute steps' time does not change.
    if (p.totalUs > 0) use.busy = std::min(1.0, use.busy * *u.us / p.totalUs);
    uses.push_back(std::move(use));
  }
  return mk::bottleneckText(uses);
}

int runOperator(const Options& o, const Setup& st, const mk::Schedule& s,
                const std::vector<std::pair<std::string, std::string>>& lines) {
  const bool wantTrace = !o.traceOut.empty();
  mk::requireWithin(mk::memoryNeed(mk::countOf(s), jobOf(st, wantTrace)), o.guard.maxMemory());
  std::printf("mk-sim: %s on %s x %u node(s) (%u ranks, %u GPU(s) per node)\n", s.info.op.c_str(), st.topo.name.c_str(),
              st.topo.nodes, st.nRanks, st.topo.node.gpus);
  for (const auto& [label, text] : lines) std::printf("%s: %s\n", label.c_str(), text.c_str());
  printProfile(o, st);
  if (o.fast) std::printf("mode: fast (node-local steps analytic, network simulated)\n");
  std::fflush(stdout);

  mk::sim::RunInfo info = baseInfo(st, s);
  const Uncontended reference = uncontended(st, s);
  info.uncontendedUs = reference.us;
  const mk::sim::Prediction p = mk::sim::predict(s, st.topo, st.profile, simOptions(o, wantTrace));
  double flops = 0, networkBytes = 0, nvlinkBytes = 0;
  for (const auto& rankLanes : s.lanes)
    for (const mk::Lane& lane : rankLanes)
      for (const mk::Step& step : lane.steps) {
        if (mk::pricedByFlops(step.kind)) flops += step.flops;
        if (mk::kindInfo(step.kind).extent == mk::StepExtent::None) continue;  // synchronisation carries no payload
        if (step.link == mk::LinkClass::Network) networkBytes += static_cast<double>(step.bytes);
        if (step.link == mk::LinkClass::NVLink) nvlinkBytes += static_cast<double>(step.bytes);
      }
  std::printf("predicted: %s  %.1f TFLOP/s per GPU\n", mk::formatMicros(p.totalUs).c_str(),
              p.totalUs > 0 ? flops / st.nRanks / (p.totalUs * 1e6) : 0.0);
  if (info.uncontendedUs)
    std::printf("uncontended: %s (the timeline without link sharing; predicted / uncontended = %.3f)\n",
                mk::formatMicros(*info.uncontendedUs).c_str(),
                *info.uncontendedUs > 0 ? p.totalUs / *info.uncontendedUs : 0.0);
  std::printf("bytes: across nodes %s, inside nodes (NVLink) %s (summed over ranks)\n",
              mk::formatBytes(networkBytes).c_str(), mk::formatBytes(nvlinkBytes).c_str());
  std::printf("bound: %s\n", boundText(p, reference).c_str());
  finishReport(o, s, p, info, wantTrace);
  return 0;
}

void finishReport(const Options& o, const mk::Schedule& s, const mk::sim::Prediction& p, const mk::sim::RunInfo& info,
                  bool wantTrace) {
  std::printf("busiest links:%s\n", p.links.empty() ? " none (no bytes crossed a link)" : "");
  printBusiestLinks(p.links);
  if (o.verbose) printStats(p.stats);
  writeOutputs(o, o.jsonOut.empty() ? std::string() : mk::sim::predictionToJson(p, info),
               wantTrace ? mk::sim::traceToJson(s, p.steps) : std::string());
}

}  // namespace mksim
