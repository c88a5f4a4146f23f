// mkernel — communication prices: one SimGrid simulation per distinct collective (comm_pricer.hpp).
#include "mk/plan/comm_pricer.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <limits>
#include <mutex>

#include "mk/algorithms/nccl.hpp"
#include "mk/cost/profile_io.hpp"
#include "mk/error.hpp"
#include "mk/plan/embed.hpp"
#include "mk/util/size.hpp"
#include "mk/validation/parallel.hpp"

namespace mk::plan {

namespace {

CollOp collOf(CommKind k) {
  switch (k) {
    case CommKind::AllReduce: return CollOp::AllReduce;
    case CommKind::AllGather: return CollOp::AllGather;
    case CommKind::ReduceScatter: return CollOp::ReduceScatter;
    case CommKind::AllToAll: return CollOp::AllToAll;
    case CommKind::SendRecv: return CollOp::Broadcast;  // a two-rank direct broadcast is one send
  }
  return CollOp::AllReduce;
}

std::string describeAlgo(const CollectiveSpec& spec, const GenOptions& gen) {
  std::string s = toString(spec.algo);
  if (spec.op == CollOp::AllReduce && spec.algo == Algorithm::Hierarchical)
    s += std::string(" (") + toString(gen.inter) + ")";
  if (isLayered(spec.algo)) s += std::string(" (") + toString(gen.protocol) + ")";
  s += ", " + std::to_string(gen.chunks) + (gen.chunks == 1 ? " chunk" : " chunks");
  if (gen.channels > 1) s += " x " + std::to_string(gen.channels) + " channels";
  return s;
}

std::string pct(double x) { return std::to_string(static_cast<int>(x * 100 + 0.5)) + " %"; }

/// What limits a simulated op: a link busy at least half of the op's time limits it by its bandwidth; otherwise
/// the op waits on latencies (alphas, flags, proxy) and synchronisation more than on any link.
std::string boundOf(const CommPrice& p) {
  if (p.busiest.empty()) return "latency (no link carried bytes)";
  const sim::LinkLoad& l = p.busiest.front();
  const std::string cls = linkClass(l.name);
  if (l.utilization >= 0.5 && !cls.empty()) return cls + " (" + l.name + " busy " + pct(l.utilization) + ")";
  return "latency and synchronisation (busiest link " + l.name + " busy " + pct(l.utilization) + ")";
}

}  // namespace

std::string linkClass(const std::string& name) {
  if (name.find(".up_") != std::string::npos) return "leaf uplink bandwidth";
  if (name.find(".nic") != std::string::npos) return "NIC bandwidth";
  if (name.find(".pcie") != std::string::npos) return "PCIe bandwidth";
  if (name.find(".nvl") != std::string::npos) return "NVLink bandwidth";
  return "";
}

std::string CommPricer::request(const CommOp& op, const GroupSet& groups, const Topology& cluster,
                                const Profile& profile) {
  ++requests_;
  Entry e;
  e.placement = placeConcurrent(groups, cluster);
  const ConcurrentPlacement& p = e.placement;
  e.spec.op = collOf(op.kind);
  e.spec.dtype = op.dtype;
  e.spec.count = op.count;
  e.price.op = toString(op.kind);
  e.price.groupSize = p.groupSize;
  e.price.groupNodes = p.groupNodes;
  e.price.concurrent = p.instances;
  e.price.domain = p.multiNode ? "network" : "nvlink";
  e.price.bytes = commBytes(op, p.groupSize);
  e.profile = profile;
  if (p.groupSize <= 1) {
    e.price.source = "none";
    e.price.bound = "-";
    e.done = true;
    const std::string key = "none";
    entries_.emplace(key, std::move(e));
    return key;
  }
  if (op.kind == CommKind::SendRecv) {
    e.spec.algo = Algorithm::Direct;
    e.spec.root = 0;
    e.gen = defaultGenOptions(e.spec.op, e.spec.algo, opBytes(e.spec, p.groupSize), p.groupSize);
    e.gen.inter = InterPhase::Ring;
  } else if (!layeredAlgorithmsFor(e.spec.op).empty()) {
    // The layered variant is what users run: NCCL, modelled by the nccl-* family. Its closed forms cannot rank
    // the algorithms (the tree's is an estimate: 1.4 ms against 3.9 ms simulated for a 26 MB all-reduce over 32
    // nodes), and a pick made on them turned a faster NIC into a slower step; so each algorithm's best protocol
    // by closed form (exact within one algorithm's family) is simulated where it runs, and the op's price is the
    // fastest of them (the tuner that picks well, as NCCL's tries to).
    constexpr double kEveryCandidate = std::numeric_limits<double>::infinity();
    std::string alternatives;
    std::vector<Algorithm> seen;
    for (const LayeredChoice& c :
         layeredCandidates(e.spec.op, e.spec.count, e.spec.dtype, p.choice, p.groupSize, profile, kEveryCandidate)) {
      if (std::find(seen.begin(), seen.end(), c.algo) != seen.end()) continue;  // lowest first: its best protocol
      seen.push_back(c.algo);
      Entry candidate = e;
      candidate.spec.algo = c.algo;
      candidate.gen = c.gen;
      candidate.profile = layeredProfile(profile, c.gen.protocol);
      alternatives += (alternatives.empty() ? "" : "\x1f") + addEntry(std::move(candidate), profile);
    }
    const std::string key = "fastest of\x1e" + alternatives;
    std::vector<std::string>& parts = fastestOf_[key];
    if (parts.empty())
      for (std::size_t at = 0, next; at <= alternatives.size(); at = next + 1) {
        next = alternatives.find('\x1f', at);
        if (next == std::string::npos) next = alternatives.size();
        parts.push_back(alternatives.substr(at, next - at));
      }
    return key;
  } else {
    const CollectivePlan plan =
        planCollective(e.spec, std::nullopt, GenOptions{0, 0, InterPhase::Auto}, p.choice, p.groupSize, profile);
    e.spec = plan.spec;
    e.gen = plan.gen;
    e.price.chosenByAuto = plan.chosenByAuto;
  }
  return addEntry(std::move(e), profile);
}

std::string CommPricer::addEntry(Entry e, const Profile& profile) {
  const ConcurrentPlacement& p = e.placement;
  e.price.algo = describeAlgo(e.spec, e.gen);
  try {
    e.price.closedFormUs = closedForm(e.spec, e.gen, p.choice, p.groupSize, profile).totalUs;
  } catch (const Error& err) {
    if (err.code() != ErrorCode::Unsupported) throw;
  }
  // Everything the simulation depends on. A one-node simulation never uses the network's profile.
  Profile keyed = e.profile;
  keyed.source.clear();
  if (!p.multiNode) {
    keyed.network = LinkCost{};
    keyed.proxyUs = 0;
  }
  const std::string key = std::string(toString(e.spec.op)) + "|" + toString(e.spec.algo) + "|" +
                          toString(e.spec.dtype) + "|" + std::to_string(e.spec.count) + "|" +
                          std::to_string(e.gen.chunks) + "x" + std::to_string(e.gen.channels) + "|" +
                          toString(e.gen.inter) + "|" + toString(e.gen.protocol) + "|" + placementKey(p) + "|" +
                          profileToJson(keyed, {}, -1);
  entries_.emplace(key, std::move(e));  // an existing entry (the same simulation) is kept
  return key;
}

void CommPricer::runAll() {
  std::vector<Entry*> todo;
  for (auto& [key, e] : entries_)
    if (!e.done) todo.push_back(&e);
  if (todo.empty()) return;
  const auto start = std::chrono::steady_clock::now();
  std::atomic<std::size_t> finished{0};
  std::mutex progress;
  try {
    forEachParallel(todo.size(), settings_.jobs, [&](std::size_t k) {
      simulate(*todo[k]);
      const std::size_t done = ++finished;
      if (settings_.onProgress) {
        std::lock_guard<std::mutex> lock(progress);
        settings_.onProgress(done, todo.size(),
                             std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
      }
    });
  } catch (...) {
    simulations_ += finished.load();
    throw;
  }
  simulations_ += finished.load();
}

void CommPricer::simulate(Entry& e) const {
  const auto t0 = std::chrono::steady_clock::now();
  const ConcurrentPlacement& p = e.placement;
  const Schedule all = embedConcurrent(generate(e.spec, p.partNodeOf, e.gen), p.maps, p.nodeOf);
  e.price.steps = all.stepCount();
  if (settings_.budgetSteps != 0 && e.price.steps > settings_.budgetSteps && e.price.closedFormUs) {
    e.price.us = isLayered(e.spec.algo) ? layeredOpUs(*e.price.closedFormUs, e.profile, 1) : *e.price.closedFormUs;
    e.price.source = "closed-form";
    e.price.note = "closed form: the simulation of " + std::to_string(e.price.steps) + " steps exceeds the budget of " +
                   std::to_string(settings_.budgetSteps) + " (--sim-budget); link sharing is not in this number";
    e.price.bound = "not simulated";
  } else {
    sim::SimOptions so;
    so.trace = false;
    so.linkLoad = true;
    so.fast = p.multiNode;
    const sim::Prediction pred = sim::predict(all, p.reduced, e.profile, so);
    // A layered op also pays its kernel's launch on the host (one process per GPU: one launch per op).
    e.price.us = isLayered(e.spec.algo) ? layeredOpUs(pred.totalUs, e.profile, 1) : pred.totalUs;
    e.price.source = so.fast ? "simgrid-fast" : "simgrid";
    for (std::size_t i = 0; i < pred.links.size() && i < 3; ++i) e.price.busiest.push_back(pred.links[i]);
    e.price.bound = boundOf(e.price);
  }
  e.price.wallS = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  e.done = true;
}

const CommPrice& CommPricer::price(const std::string& key) const {
  if (auto alt = fastestOf_.find(key); alt != fastestOf_.end()) {
    const CommPrice* best = nullptr;
    for (const std::string& part : alt->second) {
      const CommPrice& c = price(part);
      if (!best || c.us < best->us) best = &c;
    }
    return *best;
  }
  auto it = entries_.find(key);
  if (it == entries_.end() || !it->second.done)
    throw Error(ErrorCode::Internal, "CommPricer: no price for a key (request() and runAll() first)");
  return it->second.price;
}

}  // namespace mk::plan
