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
#include "mk/resources.hpp"
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

}  // namespace

std::string CommPricer::request(const CommOp& op, const GroupSet& groups, const Topology& cluster,
                                const Profile& profile) {
  return request(op, groups, context(cluster, profile));
}

std::size_t CommPricer::context(const Topology& cluster, const Profile& profile) {
  std::string text = topologyToJson(cluster, -1) + "|" + profileToJson(profile, {}, -1);
  for (std::size_t i = 0; i < contexts_.size(); ++i)
    if (contexts_[i].text == text) return i;
  contexts_.push_back(Context{cluster, profile, std::move(text)});
  return contexts_.size() - 1;
}

std::size_t CommPricer::placed(const GroupSet& groups, std::size_t context) {
  // FNV-1a over the context and every instance's ranks: a layout search asks for the same groups once per
  // micro-batch, ZeRO stage, recomputation and overlap flag of a parallel layout.
  uint64_t h = 14695981039346656037ull;
  auto mix = [&](uint64_t v) { h = (h ^ v) * 1099511628211ull; };
  mix(context);
  for (const auto& ranks : groups.instances) {
    mix(ranks.size() | uint64_t{1} << 40);
    for (uint32_t r : ranks) mix(r);
  }
  auto same = [&](const Placed& p) {
    if (p.context != context || p.sizes.size() != groups.instances.size()) return false;
    std::size_t at = 0;
    for (std::size_t i = 0; i < groups.instances.size(); ++i) {
      const auto& ranks = groups.instances[i];
      if (p.sizes[i] != ranks.size() || !std::equal(ranks.begin(), ranks.end(), p.ranks.begin() + at)) return false;
      at += ranks.size();
    }
    return true;
  };
  for (auto [it, end] = placedByHash_.equal_range(h); it != end; ++it)
    if (same(placed_[it->second])) return it->second;
  Placed p;
  p.context = context;
  p.placement = placeConcurrent(groups, contexts_.at(context).cluster, settings_.everyInstance);
  p.key = placementKey(p.placement);
  for (const auto& ranks : groups.instances) {
    p.sizes.push_back(static_cast<uint32_t>(ranks.size()));
    p.ranks.insert(p.ranks.end(), ranks.begin(), ranks.end());
  }
  placedByHash_.emplace(h, placed_.size());
  placed_.push_back(std::move(p));
  return placed_.size() - 1;
}

const std::string& CommPricer::request(const CommOp& op, const GroupSet& groups, std::size_t context) {
  ++requests_;
  const std::size_t at = placed(groups, context);
  const RequestKey id{at, op.kind, op.count, op.dtype};
  if (auto it = requested_.find(id); it != requested_.end()) return it->second;
  std::string key = priceOn(op, placed_[at].placement, placed_[at].key, contexts_[context].profile);
  return requested_.emplace(id, std::move(key)).first->second;
}

std::string CommPricer::priceOn(const CommOp& op, const ConcurrentPlacement& placement, const std::string& placed,
                                const Profile& profile) {
  Entry e;
  e.placement = placement;
  const ConcurrentPlacement& p = e.placement;
  e.spec.op = collOf(op.kind);
  e.spec.dtype = op.dtype;
  e.spec.count = op.count;
  e.price.op = toString(op.kind);
  e.price.groupSize = p.groupSize;
  e.price.groupNodes = p.groupNodes;
  e.price.concurrent = p.instances;
  e.price.domain = p.multiNode ? CommDomain::Network : CommDomain::NvLink;
  e.price.bytes = commBytes(op, p.groupSize);
  e.profile = profile;
  if (p.groupSize <= 1) {
    e.price.source = PriceSource::None;
    e.price.bound = CommBound::None;
    e.done = true;
    const std::string key = "none";
    entries_.emplace(key, std::move(e));
    return key;
  }
  if (op.kind == CommKind::SendRecv) {
    // What users run for a pipeline send is NCCL's p2p send (ncclSend / ncclRecv): nccl-p2p of two ranks, LL or
    // Simple by size as NCCL picks them (planNccl), priced as the layered library.
    e.spec.root = 0;
    const CollectivePlan plan =
        planNccl(e.spec, GenOptions{0, 0, InterPhase::Ring, Protocol::Auto}, p.choice, p.groupSize, profile);
    e.spec = plan.spec;
    e.gen = plan.gen;
    e.profile = layeredProfile(profile, e.gen.protocol);
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
      alternatives += (alternatives.empty() ? "" : "\x1f") + addEntry(std::move(candidate), profile, placed);
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
  return addEntry(std::move(e), profile, placed);
}

std::string CommPricer::addEntry(Entry e, const Profile& profile, const std::string& placed) {
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
  const std::string key =
      std::string(toString(e.spec.op)) + "|" + toString(e.spec.algo) + "|" + toString(e.spec.dtype) + "|" +
      std::to_string(e.spec.count) + "|" + std::to_string(e.gen.chunks) + "x" + std::to_string(e.gen.channels) + "|" +
      toString(e.gen.inter) + "|" + toString(e.gen.protocol) + "|" + placed + "|" + profileToJson(keyed, {}, -1);
  if (entries_.count(key)) return key;  // an existing entry (the same simulation) is kept
  planSimulation(e);
  entries_.emplace(key, std::move(e));
  return key;
}

void CommPricer::planSimulation(Entry& e) const {
  const ConcurrentPlacement& p = e.placement;
  e.by = p.multiNode ? PriceSource::SimGridFast : PriceSource::SimGrid;
  const uint64_t instances = std::max<std::size_t>(1, p.maps.size());
  // What one simulation costs (mk/resources.hpp): the embedded schedule and its replay on the reduced cluster.
  MemoryJob job;
  job.simulate = true;
  job.platformGpus = p.reduced.totalGpus();
  const uint64_t share = settings_.maxMemory == 0 ? std::numeric_limits<uint64_t>::max()
                                                  : settings_.maxMemory / std::max(1u, settings_.jobs);
  // Count one instance only as far as the budget and the share allow: an instance of a 32768-rank ring holds
  // billions of steps, and counting them all would cost what generating them did.
  uint64_t maxSteps = share / bytesPerStep(job) + 1;
  if (settings_.budgetSteps != 0) maxSteps = std::min(maxSteps, settings_.budgetSteps + 1);
  const ScheduleCount part = countSchedule(e.spec, p.partNodeOf, e.gen, maxSteps / instances + 1);
  ScheduleCount all = part;
  all.steps = part.steps * instances;  // both bounded by maxSteps x instances: no overflow
  all.lanes = part.lanes * instances;
  all.flags = part.flags * instances;
  all.barriers = part.barriers * instances;
  const MemoryNeed need = memoryNeed(all, job);
  e.price.steps = all.steps;
  // Counting stopped early (!complete) at whichever limit was lower; lanes weigh in the stop, so steps alone may
  // still look under it.
  const bool budgetStopped = settings_.budgetSteps != 0 && maxSteps == settings_.budgetSteps + 1 && !part.complete;
  const bool overBudget = settings_.budgetSteps != 0 && (all.steps > settings_.budgetSteps || budgetStopped);
  const bool overMemory = need.atLeast || need.total() > share;
  if (!overBudget && !overMemory) return;
  std::string why;
  if (overBudget)
    why = "the simulation of " + std::string(part.complete ? "" : "more than ") + std::to_string(all.steps) +
          " steps exceeds the budget of " + std::to_string(settings_.budgetSteps) + " (--sim-budget)";
  else
    why = "the simulation needs " + need.text() + ", above " + formatBytes(static_cast<double>(share)) +
          " (--max-memory" + (settings_.jobs > 1 ? " / " + std::to_string(settings_.jobs) + " jobs" : "") + ")";
  if (!e.price.closedFormUs)
    throw Error(ErrorCode::Unsupported, e.price.op + " of " + std::to_string(p.groupSize) + " ranks (" + e.price.algo +
                                            "): " + why +
                                            " and it has no closed form to stand in; raise the limit "
                                            "or plan fewer GPUs");
  e.by = PriceSource::ClosedForm;
  e.price.note = "closed form: " + why + "; link sharing is not in this number";
}

void CommPricer::runAll() {
  std::vector<Entry*> todo;
  for (auto& [key, e] : entries_) {
    if (e.done) continue;
    if (settings_.known) {
      if (auto it = settings_.known->find(key); it != settings_.known->end()) {
        e.price = it->second;
        e.done = true;
        continue;
      }
    }
    todo.push_back(&e);
  }
  if (todo.empty()) {
    recordPrices();
    return;
  }
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
  recordPrices();
}

void CommPricer::recordPrices() const {
  if (!settings_.record) return;
  for (const auto& [key, e] : entries_)
    if (e.done) (*settings_.record)[key] = e.price;
}

void CommPricer::simulate(Entry& e) const {
  const auto t0 = std::chrono::steady_clock::now();
  // The closed form's note and steps were set when it was chosen (planSimulation), without generating a step.
  pricerFor(e.by).price(e, e.price);
  e.price.wallS = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  e.done = true;
}

uint64_t CommPricer::plannedSteps() const noexcept {
  uint64_t steps = 0;
  for (const auto& [key, e] : entries_)
    if (!e.done && e.by != PriceSource::ClosedForm) steps += e.price.steps;
  return steps;
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
