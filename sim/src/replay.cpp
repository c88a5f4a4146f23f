// mkernel — Schedule -> SimGrid actors and activities -> prediction (replay.hpp, docs/simulator.md).
#include "mk/sim/replay.hpp"

#include <malloc.h>
#include <simgrid/plugins/load.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>
#include <xbt/log.h>
#include <simgrid/kernel/Timer.hpp>
#include <simgrid/s4u.hpp>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstring>
#include <deque>
#include <iterator>
#include <limits>
#include <sstream>
#include <type_traits>
#include <unordered_map>

#include "isolated.hpp"
#include "mk/cost/step_cost.hpp"
#include "mk/error.hpp"
#include "mk/schedule/check.hpp"
#include "mk/sim/platform.hpp"

XBT_LOG_NEW_DEFAULT_CATEGORY(mk_replay, "mkernel: schedule replay");

namespace sg4 = simgrid::s4u;

namespace mk::sim {

namespace {

constexpr double kSecondsPerUs = 1e-6;
constexpr double kBytesPerGB = 1e9;
constexpr double kInf = std::numeric_limits<double>::infinity();
// Exec amounts are durations at full rate in ns: a GPU core runs 1e9 units per second (platform.cpp).
constexpr double kWorkPerSecond = 1e9;

// ---- the replay's own checks and its plan, made in the calling process before any simulation ------------

[[noreturn]] void badStep(const Schedule& s, uint32_t rank, uint32_t lane, uint32_t step, const std::string& what) {
  throw Error(ErrorCode::InvalidSchedule, describeStep(s, rank, lane, step) + ": " + what);
}

void checkRankRef(const Schedule& s, uint32_t rank, uint32_t lane, uint32_t step, const char* what, uint32_t ref) {
  if (ref >= s.nRanks)
    badStep(s, rank, lane, step,
            std::string(what) + " names rank " + std::to_string(ref) + " (nRanks " + std::to_string(s.nRanks) + ")");
}

/// The replay's own check of a step, after the timeline's (StepCosts): routes exist only where the hardware
/// has a path, NVLink inside a node and the network across nodes.
void checkRoute(const Schedule& s, uint32_t r, uint32_t l, uint32_t i, StepResource res) {
  const Step& st = s.lanes[r][l].steps[i];
  if (res == StepResource::NvLink || res == StepResource::Network || res == StepResource::Memory) {
    checkRankRef(s, r, l, i, "dst", st.dst.rank);
    checkRankRef(s, r, l, i, "operand a", st.a.rank);
    if (st.kind == StepKind::Reduce) checkRankRef(s, r, l, i, "operand b", st.b.rank);
  }
  if (res == StepResource::NvLink) {
    const bool peer = st.dst.rank != r || st.a.rank != r || (st.kind == StepKind::Reduce && st.b.rank != r);
    if (!peer)
      badStep(s, r, l, i,
              std::string("an NVLink ") + toString(st.kind) + " has every operand on this rank (use link local)");
    for (uint32_t other : {st.dst.rank, st.a.rank, st.kind == StepKind::Reduce ? st.b.rank : r})
      if (s.nodeOf[other] != s.nodeOf[r])
        badStep(s, r, l, i,
                std::string("an NVLink ") + toString(st.kind) + " reaches rank " + std::to_string(other) + " on node " +
                    std::to_string(s.nodeOf[other]) + ", not this rank's node " + std::to_string(s.nodeOf[r]));
  }
  if (res == StepResource::Network && s.nodeOf[st.dst.rank] == s.nodeOf[r])
    badStep(s, r, l, i,
            "a proxy put targets rank " + std::to_string(st.dst.rank) + " on this rank's own node (use put)");
}

/// Everything the actors need that does not depend on SimGrid: built and checked before forking, so that bad
/// input fails with a clean error in the caller's process.
struct Plan {
  Plan(const Schedule& s, const Topology& topo, const Profile& p)
      : gpuOf(placeRanks(s, topo)),
        costs(s, p, [&s](uint32_t r, uint32_t l, uint32_t i, StepResource res) { checkRoute(s, r, l, i, res); }) {
    platformRates(topo, p);  // the platform's own rate checks, also before forking
  }
  std::vector<uint32_t> gpuOf;  ///< rank -> GPU index
  StepCosts costs;              ///< the timeline's per-step rules: shares, prices, delays
};

// ---- the simulation ---------------------------------------------------------------------------------------

uint64_t saturatingAdd(uint64_t a, uint64_t b) {
  return a > std::numeric_limits<uint64_t>::max() - b ? std::numeric_limits<uint64_t>::max() : a + b;
}

/// A lane suspended on a flag until `wakeAt` (infinity: until an increment makes the threshold reachable).
/// `generation` tells a current wake-up timer from one made stale by an earlier increment.
struct FlagWaiter {
  uint64_t threshold = 0;
  uint64_t lane = 0;
  double wakeAt = 0;
  uint64_t generation = 0;
};

/// A flag counter. Increments are known when they are sent, together with the time they become visible, so
/// the counter keeps `value` (visible by now) and `pending` (visible later, in time order): the time it reaches
/// a threshold is known without waking anybody per increment. Only a lane that must block costs a timer.
struct FlagState {
  uint64_t value = 0;
  std::deque<std::pair<double, uint64_t>> pending;  ///< (visibility time, increment), ascending time
  std::vector<FlagWaiter> waiters;

  /// Fold the increments visible at `now` into `value`.
  void settle(double now) {
    while (!pending.empty() && pending.front().first <= now) {
      value = saturatingAdd(value, pending.front().second);
      pending.pop_front();
    }
  }
  void add(double t, uint64_t inc) {
    // Increments arrive nearly in time order: insert from the back.
    auto it = pending.end();
    while (it != pending.begin() && std::prev(it)->first > t) --it;
    pending.insert(it, {t, inc});
  }
  /// Earliest time the counter is >= threshold with the increments sent so far (-inf: already; inf: never yet).
  double reachTime(uint64_t threshold) const {
    if (value >= threshold) return -kInf;
    uint64_t sum = value;
    for (const auto& [t, inc] : pending) {
      sum = saturatingAdd(sum, inc);
      if (sum >= threshold) return t;
    }
    return kInf;
  }
};

struct BarrierState {
  uint64_t arrived = 0;
  double lastArrival = 0;
  std::vector<uint64_t> waiting;  ///< lanes suspended until the last arrival
};

/// Where one lane's transfers go: one mailbox per destination host, so that a lane's drain receive always
/// matches its own (single outstanding) comm.
struct LaneMailboxes {
  std::vector<std::pair<const sg4::Host*, sg4::Mailbox*>> byDestination;
};

/// All simulation state of one replay. Lives in the simulating process only.
class Replayer {
 public:
  Replayer(const Plan& plan, const Platform& platform, const SimOptions& opt)
      : plan_(plan),
        costs_(plan.costs),
        s_(costs_.schedule()),
        p_(costs_.profile()),
        lanes_(costs_.lanes()),
        platform_(platform),
        opt_(opt) {
    if (opt_.trace) times_.assign(2 * costs_.steps(), 0.0);
    flags_.resize(static_cast<std::size_t>(s_.nRanks) * s_.nFlags);
    barriers_.resize(s_.nBarriers);
    actors_.resize(lanes_.size(), nullptr);
    where_.resize(lanes_.size(), nullptr);
    mailboxes_.resize(lanes_.size());
  }

  /// One actor per lane, in (rank, lane) order: SimGrid is deterministic for a fixed creation order.
  void start() {
    for (uint64_t g = 0; g < lanes_.size(); ++g) {
      const auto [rank, lane, firstStep] = lanes_[g];
      where_[g] = gpuHost(rank);
      actors_[g] =
          sg4::Actor::create("r" + std::to_string(rank) + ".l" + std::to_string(lane), where_[g], LaneActor{this, g})
              .get();
    }
  }

  void finish(Prediction& out) const {
    if (lanesDone_ != lanes_.size()) reportStuck();
    out.totalUs = costs_.opTotalUs(maxEndUs_);  // rule 1: dispatch at least, peerUserUs on top
    out.stats.steps = costs_.steps();
    out.stats.comms = comms_;
    out.stats.execs = execs_;
    out.stats.actors = lanes_.size();
    if (!opt_.trace) return;
    out.steps.resize(costs_.steps());
    for (const auto& [rank, lane, firstStep] : lanes_) {
      const auto& steps = s_.lanes[rank][lane].steps;
      for (uint32_t i = 0; i < steps.size(); ++i) {
        const uint64_t k = firstStep + i;
        StepRecord& r = out.steps[k];
        r.rank = rank;
        r.lane = lane;
        r.step = i;
        r.kind = steps[i].kind;
        r.link = steps[i].link;
        r.bytes = steps[i].bytes;
        r.startUs = times_[2 * k];
        r.endUs = times_[2 * k + 1];
      }
    }
  }

  /// Links whose bytes are reported.
  void trackLinks(const std::vector<sg4::Link*>& links) {
    for (uint32_t i = 0; i < links.size(); ++i) linkIndex_.emplace(links[i], i);
    linkBytes_.assign(links.size(), 0.0);
  }
  double linkBytes(uint32_t i) const { return linkBytes_[i]; }

  double progress() const {
    return costs_.steps() == 0 ? 1.0 : static_cast<double>(stepsDone_) / static_cast<double>(costs_.steps());
  }

 private:
  /// A lane as a small functor (3.32 examples style); SimGrid copies it into the actor.
  struct LaneActor {
    Replayer* r;
    uint64_t lane;
    void operator()() const { r->runLane(lane); }
  };

  sg4::Host* gpuHost(uint32_t rank) const { return platform_.gpu[plan_.gpuOf[rank]]; }
  static double now() { return sg4::Engine::get_clock(); }

  void runLane(uint64_t g) {
    if (opt_.fast) {
      runLaneFast(g);
      return;
    }
    const auto [rank, lane, firstStep] = lanes_[g];
    const auto& steps = s_.lanes[rank][lane].steps;
    // Dispatch is paid once per op: every lane starts then (timeline rule 1).
    sg4::this_actor::sleep_for(p_.dispatchUs * kSecondsPerUs);
    noteEnd(now());
    for (uint32_t i = 0; i < steps.size(); ++i) {
      const double start = now();
      runStep(g, rank, lane, steps[i]);
      stepDone(firstStep + i, start, now());
    }
    ++lanesDone_;
  }

  void noteEnd(double t) { maxEndUs_ = std::max(maxEndUs_, t / kSecondsPerUs); }

  /// Step `k` (flat index) ran from `start` to `end` (seconds): its trace times, the op's end so far, progress.
  void stepDone(uint64_t k, double start, double end) {
    if (opt_.trace) {
      times_[2 * k] = start / kSecondsPerUs;
      times_[2 * k + 1] = end / kSecondsPerUs;
    }
    noteEnd(end);
    ++stepsDone_;
  }

  /// SimOptions::fast: node-local steps (NVLink, memory, tensor pipe, signals) are timed with the timeline
  /// formulas on a lane-local clock that runs ahead of SimGrid's; the lane meets the engine clock only where
  /// the fabric decides (ProxyPut, Barrier) or a Wait cannot be decided from the increments sent so far.
  void runLaneFast(uint64_t g) {
    const auto [rank, lane, firstStep] = lanes_[g];
    const auto& steps = s_.lanes[rank][lane].steps;
    double t = p_.dispatchUs * kSecondsPerUs;  // this lane's clock (seconds)
    noteEnd(t);
    for (uint32_t i = 0; i < steps.size(); ++i) {
      const Step& st = steps[i];
      const double start = t;
      switch (st.kind) {
        case StepKind::Wait:
          waitFlag(g, st.flag, st.value, t);
          t = waitEnd(t, std::max(t, now()));
          break;
        case StepKind::Barrier:
        case StepKind::ProxyPut:
          if (t > now()) sg4::this_actor::sleep_until(t);
          runStep(g, rank, lane, st);
          t = now();
          break;
        case StepKind::Signal:
          increment(st.flag, st.value, t + signalDelayUs(rank, st.flag.rank) * kSecondsPerUs);
          break;
        default:  // Copy, Reduce, Put, Gemm: the timeline's duration on the lane's own clock
          t += costs_.laneUs(st, rank, lane) * kSecondsPerUs;
          if (st.kind == StepKind::Put && (st.flags & kStepSignal))
            increment(st.flag, st.value, t + costs_.incrementDelayUs(st, rank) * kSecondsPerUs);
      }
      stepDone(firstStep + i, start, t);
    }
    ++lanesDone_;
  }

  /// Exact mode: every step as SimGrid activities, priced by the timeline's rules (StepCosts::price): the
  /// latency as a sleep, the payload as a comm over the route or an Exec on the GPU, at the lane's share.
  void runStep(uint64_t g, uint32_t rank, uint32_t lane, const Step& st) {
    switch (st.kind) {
      case StepKind::Copy:
      case StepKind::Reduce:
      case StepKind::Put:
      case StepKind::Gemm: {
        const StepPrice pr = costs_.price(st, rank, lane);
        if (pr.resource == StepResource::NvLink)
          transferNvl(g, rank, nvlinkSource(st, rank), st.dst.rank, st.bytes, pr);
        else
          execute(rank, pr);
        if (st.kind == StepKind::Put && (st.flags & kStepSignal))
          increment(st.flag, st.value, now() + costs_.incrementDelayUs(st, rank) * kSecondsPerUs);
        break;
      }
      case StepKind::ProxyPut: {
        // The issue on the lane, then the bytes over the fabric; the message lands the transport's latency (and
        // any extra switch hops) later, while the lane goes on within its in-flight slots (proxyLaneUs).
        const StepPrice pr = costs_.price(st, rank, lane);
        const uint32_t hops = platform_.extraSwitchHops(plan_.gpuOf[rank], plan_.gpuOf[st.dst.rank]);
        const double start = now();
        delay(pr.alphaUs);
        if (pr.amount > 0) sendStriped(g, rank, st.dst.rank, pr.amount, laneRate(rank, pr));
        const double busyUs = (now() - start) / kSecondsPerUs;
        const double landsUs = proxyLatencyUs(p_) + hops * platform_.switchLatencyUs;  // after the bytes
        if (st.flags & kStepSignal) increment(st.flag, st.value, now() + landsUs * kSecondsPerUs);
        delay(proxyLaneUs(p_, busyUs) - busyUs);
        break;
      }
      case StepKind::Signal:
        increment(st.flag, st.value, now() + signalDelayUs(rank, st.flag.rank) * kSecondsPerUs);
        break;
      case StepKind::Wait: {
        const double start = now();
        waitFlag(g, st.flag, st.value, start);
        const double end = waitEnd(start, now());
        if (end > now()) sg4::this_actor::sleep_until(end);
        break;
      }
      case StepKind::Barrier: barrier(g, st.aux); break;
    }
  }

  /// Rule 3's Wait (mk::waitEndUs) in seconds: a Wait started at `start` whose flag was visible at `visible`.
  /// Without waitUs exactly `visible`, so that no unit conversion moves a wait that costs nothing.
  double waitEnd(double start, double visible) const {
    if (!(p_.waitUs > 0)) return visible;
    return waitEndUs(p_, start / kSecondsPerUs, visible / kSecondsPerUs) * kSecondsPerUs;
  }

  /// The rank whose memory an NVLink step's bytes leave: the executing rank for a Put, the source of a Copy,
  /// the operand of a Reduce that lives on another rank than the destination.
  static uint32_t nvlinkSource(const Step& st, uint32_t rank) {
    if (st.kind == StepKind::Put) return rank;
    if (st.kind == StepKind::Reduce) return st.a.rank != st.dst.rank ? st.a.rank : st.b.rank;
    return st.a.rank;
  }

  /// Rule 3's signal visibility, plus the extra switch hops of a route that leaves its leaf across nodes.
  double signalDelayUs(uint32_t from, uint32_t to) const {
    const double us = costs_.signalDelayUs(from, to);
    if (s_.nodeOf[from] == s_.nodeOf[to]) return us;
    const uint32_t hops = platform_.extraSwitchHops(plan_.gpuOf[from], plan_.gpuOf[to]);
    return us + hops * platform_.switchLatencyUs;
  }

  /// The lane's share of the step's full rate (rule 2), or its CTAs' cap where lower (rule 2b), in units (bytes)
  /// per second.
  double laneRate(uint32_t rank, const StepPrice& pr) const {
    if (costs_.capBinds(pr, rank)) return pr.capPerUs * 1e6;
    return pr.rate * pr.unitsPerSecond() / costs_.share(rank, pr.resource);
  }

  /// Latency is paid as a sleep, never as link latency: CM02 would weight bandwidth shares by it.
  static void delay(double us) {
    if (us > 0) sg4::this_actor::sleep_for(us * kSecondsPerUs);
  }

  /// An NVLink transfer between `from` and `to` (one of them a peer; Plan checked it): the lane pays the
  /// price's alpha (a Put its issue time; the rest of its alpha delays only its signal), then the bytes flow
  /// capped at the lane's share of the price's rate.
  void transferNvl(uint64_t g, uint32_t rank, uint32_t from, uint32_t to, uint64_t bytes, const StepPrice& pr) {
    delay(pr.alphaUs);
    if (bytes == 0) return;
    // The bytes flow from `from` to `to` whoever executes the step: a read starts at the peer.
    communicate(g, gpuHost(from), gpuHost(to), bytes, laneRate(rank, pr));
  }

  /// One transfer from host `from` to host `to` at most `rateCap` bytes/s (the lane's share: a lane's CTAs
  /// bound its rate, as in the timeline; links then share what is left among flows).
  ///
  /// A mailbox comm with a permanent receiver, not Comm::sendto: 3.32 ignores set_rate on host-to-host comms,
  /// and it detaches them into one engine-wide list whose removal is linear, which made the replay quadratic in
  /// the number of flows in flight (30% of the time at 1024 GPUs). A mailbox comm's source is its sender's
  /// host, so the lane actor moves to `from` first (it has no activity in flight then, so that is cheap).
  void communicate(uint64_t g, sg4::Host* from, sg4::Host* to, uint64_t bytes, double rateCap) {
    if (where_[g] != from) {
      sg4::this_actor::set_host(from);
      where_[g] = from;
    }
    if (opt_.linkLoad) account(from, to, bytes);
    sg4::Mailbox* mb = mailbox(g, to);
    sg4::CommPtr c = mb->put_init(&token_, bytes);
    c->set_rate(rateCap);
    c->start();
    ++comms_;
    c->wait();
    // The permanent receiver keeps finished comms until someone receives them: take ours back at once.
    void* back = nullptr;
    mb->get_async<void>(&back)->wait();
  }

  /// A ProxyPut's wire bytes from `rank` to `dst`, striped evenly over the sender's NICs (Platform::netVia): one
  /// comm per stripe at its part of the lane's rate, all in flight at once.
  void sendStriped(uint64_t g, uint32_t rank, uint32_t dst, double wireBytes, double rateCap) {
    const auto& from = platform_.netVia[plan_.gpuOf[rank]];
    const auto& to = platform_.netVia[plan_.gpuOf[dst]];
    const auto bytes = static_cast<uint64_t>(std::ceil(wireBytes));
    if (from.size() == 1) return communicate(g, from[0], to[0], bytes, rateCap);
    const uint64_t k = from.size();
    std::vector<std::pair<sg4::Mailbox*, sg4::CommPtr>> comms;
    for (uint64_t j = 0; j < k; ++j) {
      const uint64_t part = bytes / k + (j < bytes % k ? 1 : 0);
      if (part == 0) continue;
      // A mailbox comm leaves from its sender's host when it starts: the actor visits each stripe's endpoint.
      if (where_[g] != from[j]) {
        sg4::this_actor::set_host(from[j]);
        where_[g] = from[j];
      }
      sg4::Host* dest = to[j % to.size()];
      if (opt_.linkLoad) account(from[j], dest, part);
      sg4::Mailbox* mb = mailbox(g, dest);
      sg4::CommPtr c = mb->put_init(&token_, part);
      c->set_rate(rateCap / static_cast<double>(k));
      c->start();
      ++comms_;
      comms.emplace_back(mb, c);
    }
    for (auto& [mb, c] : comms) c->wait();
    for (auto& [mb, c] : comms) {
      void* back = nullptr;
      mb->get_async<void>(&back)->wait();
    }
  }

  sg4::Mailbox* mailbox(uint64_t g, sg4::Host* to) {
    auto& list = mailboxes_[g].byDestination;
    for (const auto& [host, mb] : list)
      if (host == to) return mb;
    sg4::Mailbox* mb = sg4::Mailbox::by_name("l" + std::to_string(g) + ">" + to->get_name());
    mb->set_receiver(receiver(to));
    list.emplace_back(to, mb);
    return mb;
  }

  /// The host's receiver, created on first use: a permanent receiver makes a mailbox comm start as soon as it
  /// is sent, like a one-sided write. The actor itself only sleeps; daemons are killed with the last lane.
  sg4::ActorPtr receiver(sg4::Host* h) {
    auto it = receiver_.find(h);
    if (it != receiver_.end()) return it->second;
    sg4::ActorPtr rx = sg4::Actor::create(h->get_name() + ".rx", h, [] { sg4::this_actor::sleep_for(1e18); });
    rx->daemonize();
    receiver_.emplace(h, rx);
    return rx;
  }

  /// Bytes per link, counted exactly from every comm and its (cached) route. SimGrid's link-load plugin only
  /// integrates a link's load between that link's own events, so its byte count is wrong whenever a flow's
  /// rate changes because another flow ended elsewhere; it is used for the peak instantaneous load only.
  void account(const sg4::Host* from, const sg4::Host* to, uint64_t bytes) {
    auto it = routes_.find({from, to});
    if (it == routes_.end()) {
      std::vector<sg4::Link*> links;
      double latency = 0;
      from->route_to(to, links, &latency);
      std::vector<uint32_t> ids;
      for (const sg4::Link* l : links) {
        auto li = linkIndex_.find(l);
        if (li != linkIndex_.end()) ids.push_back(li->second);
      }
      it = routes_.emplace(std::make_pair(from, to), std::move(ids)).first;
    }
    for (const uint32_t id : it->second) linkBytes_[id] += static_cast<double>(bytes);
  }

  /// `alphaUs` then `fullRateSeconds` of work at the lane's share, as one Exec bounded to that share. The alpha
  /// rides in the amount (one activity instead of a sleep and an exec): it occupies the lane's bound, never more,
  /// and the lanes of one pipe never exceed its core (their bounds add up to at most one core).
  void execute(uint32_t rank, const StepPrice& pr) {
    const double fullRateSeconds = pr.amount / (pr.rate * pr.unitsPerSecond());
    const double share = costs_.share(rank, pr.resource);
    double seconds = pr.alphaUs * kSecondsPerUs + fullRateSeconds * share;
    double bound = kWorkPerSecond / share;
    if (costs_.capBinds(pr, rank)) {  // rule 2b: the lane's CTAs hold this fraction of the pipe
      const double fraction = pr.capPerUs / (pr.rate * pr.unitsPerUs);
      seconds = pr.alphaUs * kSecondsPerUs + fullRateSeconds / fraction;
      bound = kWorkPerSecond * fraction;
    }
    if (!(seconds > 0)) return;
    sg4::ExecPtr e = sg4::Exec::init();
    e->set_host(gpuHost(rank));
    e->set_flops_amount(seconds * bound);
    e->set_bound(bound);
    e->start();
    ++execs_;
    e->wait();
  }

  FlagState& flag(FlagRef f) { return flags_[static_cast<std::size_t>(f.rank) * s_.nFlags + f.id]; }

  /// Record an increment visible at `visibleAt` (>= now) and move the wake-up of every lane it helps earlier.
  void increment(FlagRef f, uint64_t value, double visibleAt) {
    FlagState& st = flag(f);
    st.settle(now());
    st.add(visibleAt, value);
    for (std::size_t i = 0; i < st.waiters.size();) {
      FlagWaiter& w = st.waiters[i];
      const double reach = st.reachTime(w.threshold);
      if (reach >= w.wakeAt) {
        ++i;
      } else if (reach <= now()) {
        actors_[w.lane]->resume();
        st.waiters[i] = st.waiters.back();
        st.waiters.pop_back();
      } else {
        w.wakeAt = reach;
        scheduleWake(f, w);
        ++i;
      }
    }
  }

  /// A kernel timer resumes the lane at w.wakeAt unless a later increment rescheduled it. Timers are set from
  /// actor code without a simcall: contexts run one at a time (SimGrid's default, never changed here), so the
  /// maestro cannot be touching the timer heap meanwhile.
  void scheduleWake(FlagRef f, FlagWaiter& w) {
    const uint64_t generation = ++w.generation;
    const uint64_t lane = w.lane;
    simgrid::kernel::timer::Timer::set(w.wakeAt, [this, f, lane, generation] {
      auto& waiters = flag(f).waiters;
      for (std::size_t i = 0; i < waiters.size(); ++i)
        if (waiters[i].lane == lane && waiters[i].generation == generation) {
          actors_[lane]->resume();
          waiters[i] = waiters.back();
          waiters.pop_back();
          return;
        }
    });
  }

  /// Block lane `g`, whose clock reads `t` (>= now), until the flag reaches the threshold: the wait ends at
  /// max(t, V) with V the time the counter reaches it in visibility order (timeline rule 3). When V <= t the
  /// lane does not touch the engine at all: increments not sent yet could only make V earlier. Nothing runs
  /// between the check and suspend() (actors only switch inside simcalls), so no wake-up can be lost.
  void waitFlag(uint64_t g, FlagRef f, uint64_t threshold, double t) {
    FlagState& st = flag(f);
    st.settle(now());
    const double reach = st.reachTime(threshold);
    if (reach <= t) return;
    FlagWaiter w;
    w.threshold = threshold;
    w.lane = g;
    w.wakeAt = reach;
    st.waiters.push_back(w);
    if (reach < kInf) scheduleWake(f, st.waiters.back());
    sg4::this_actor::suspend();
  }

  void barrier(uint64_t g, uint32_t id) {
    BarrierState& b = barriers_[id];
    b.lastArrival = b.arrived == 0 ? now() : std::max(b.lastArrival, now());
    ++b.arrived;
    if (b.arrived < costs_.barrierParticipants(id)) {
      b.waiting.push_back(g);
      sg4::this_actor::suspend();
    } else {
      for (const uint64_t other : b.waiting) actors_[other]->resume();
      b.waiting.clear();
    }
    const double releaseUs = b.lastArrival / kSecondsPerUs + costs_.barrierReleaseUs();
    if (releaseUs * kSecondsPerUs > now()) sg4::this_actor::sleep_until(releaseUs * kSecondsPerUs);
  }

  [[noreturn]] void reportStuck() const {
    throw Error(ErrorCode::Deadlock, "the replay stopped with " + std::to_string(lanes_.size() - lanesDone_) + " of " +
                                         std::to_string(lanes_.size()) +
                                         " lanes unfinished (the schedule cannot complete: run mk::validate on it)");
  }

  struct PairHash {
    std::size_t operator()(const std::pair<const sg4::Host*, const sg4::Host*>& p) const noexcept {
      return std::hash<const void*>()(p.first) * 31u + std::hash<const void*>()(p.second);
    }
  };

  const Plan& plan_;
  const StepCosts& costs_;
  const Schedule& s_;
  const Profile& p_;
  const std::vector<LaneRef>& lanes_;
  const Platform& platform_;
  const SimOptions& opt_;
  std::vector<double> times_;  ///< [2 * step]: start, end (us)
  std::vector<FlagState> flags_;
  std::vector<BarrierState> barriers_;
  std::vector<sg4::Actor*> actors_;  ///< per lane (kept alive by SimGrid until it ends)
  std::vector<sg4::Host*> where_;    ///< per lane: the host its actor is on
  std::vector<LaneMailboxes> mailboxes_;
  std::unordered_map<const sg4::Host*, sg4::ActorPtr> receiver_;
  int token_ = 0;  ///< the payload every comm carries (only its simulated size matters)
  std::unordered_map<std::pair<const sg4::Host*, const sg4::Host*>, std::vector<uint32_t>, PairHash> routes_;
  std::unordered_map<const sg4::Link*, uint32_t> linkIndex_;
  std::vector<double> linkBytes_;  ///< per tracked link
  double maxEndUs_ = 0;
  uint64_t stepsDone_ = 0;
  uint64_t lanesDone_ = 0;
  uint64_t comms_ = 0;
  uint64_t execs_ = 0;
};

double peakRssMiB() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return static_cast<double>(ru.ru_maxrss) / 1024.0;  // Linux reports KiB
}

Prediction simulate(const Plan& plan, const Topology& topo, const SimOptions& opt) {
  const auto wallStart = std::chrono::steady_clock::now();
  auto wallSeconds = [wallStart] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - wallStart).count();
  };
  // One Engine per process, never destroyed: the process (usually a forked child) ends right after, and
  // tearing down a 10k-host platform would only cost time.
  if (opt.isolate) {
    // SimGrid allocates every actor stack with calloc (guard-size 0), which zero-fills it through the page
    // cache: at 1024 GPUs (~5000 lane and receiver actors) that memset and its page faults were a third of
    // the run. Served by mmap instead, a stack is already zero and only the pages an actor really touches
    // (its top few KiB) are ever faulted in. Only in the forked child: the caller's allocator stays as is.
    mallopt(M_MMAP_THRESHOLD, static_cast<int>(opt.actorStackKiB) * 1024);
  }
#if defined(__SANITIZE_ADDRESS__)
  // AddressSanitizer cannot follow SimGrid's own stack switching (it warns on stderr and may report false
  // positives): a sanitizer build runs every actor on a thread of its own (slower, same results). The context
  // factory is chosen when the engine is created, so it comes as a command-line setting.
  std::string arg0 = "mk-sim", arg1 = "--log=xbt_cfg.thres:warning", arg2 = "--cfg=contexts/factory:thread";
  char* argv[] = {arg0.data(), arg1.data(), arg2.data(), nullptr};
  int argc = 3;
  auto* engine = new sg4::Engine(&argc, argv);
#else
  auto* engine = new sg4::Engine("mk-sim");
#endif
  configureEngine(EngineConfig{opt.verbose, opt.actorStackKiB});
  if (opt.linkLoad) sg_link_load_plugin_init();
  const Platform platform = buildPlatform(topo, plan.costs.profile(), /*nvlink=*/!opt.fast);  // fast: never used
  std::vector<sg4::Link*> links;
  if (opt.linkLoad) {
    links = engine->get_all_links();
    for (const sg4::Link* l : links) sg_link_load_track(l);
  }
  Replayer replayer(plan, platform, opt);
  replayer.trackLinks(links);
  replayer.start();
  XBT_INFO("replaying %llu steps on %zu lanes (%s mode)", static_cast<unsigned long long>(plan.costs.steps()),
           plan.costs.lanes().size(), opt.fast ? "fast" : "exact");
  // Outlives the callback, which runs inside engine->run() below (a copy in the `if` block's scope did not).
  double nextReport = opt.progressAfterS;
  if (opt.onProgress) {
    sg4::Engine::on_time_advance_cb([&](double) {
      const double w = wallSeconds();
      if (w < nextReport) return;
      nextReport = w + opt.progressEveryS;
      opt.onProgress(replayer.progress(), sg4::Engine::get_clock() / kSecondsPerUs, w);
    });
  }
  engine->run();
  Prediction out;
  replayer.finish(out);
  if (opt.linkLoad) {
    const double seconds = out.totalUs * kSecondsPerUs;
    for (uint32_t i = 0; i < links.size(); ++i) {
      const sg4::Link* l = links[i];
      const double bytes = replayer.linkBytes(i);
      if (!(bytes > 0)) continue;
      LinkLoad ll;
      ll.name = l->get_name();
      ll.bandwidthGBs = l->get_bandwidth() / kBytesPerGB;
      ll.bytes = bytes;
      ll.avgGBs = seconds > 0 ? bytes / seconds / kBytesPerGB : 0;
      ll.peakGBs = sg_link_get_max_instantaneous_load(l) / kBytesPerGB;
      ll.utilization = ll.bandwidthGBs > 0 ? ll.avgGBs / ll.bandwidthGBs : 0;
      out.links.push_back(std::move(ll));
    }
    std::sort(out.links.begin(), out.links.end(), [](const LinkLoad& a, const LinkLoad& b) {
      return a.utilization != b.utilization ? a.utilization > b.utilization : a.name < b.name;
    });
  }
  out.stats.wallSeconds = wallSeconds();
  out.stats.peakRssMiB = peakRssMiB();
  return out;
}

/// SimGrid 3.32 allows one engine per process: set once predict() ran one here without isolation.
bool inProcessUsed = false;

}  // namespace

std::vector<uint32_t> placeRanks(const Schedule& s, const Topology& topo) {
  requireRankTables(s);
  const std::string cluster = topo.name.empty() ? std::string("the cluster") : "cluster '" + topo.name + "'";
  std::vector<uint32_t> used(topo.nodes, 0);
  std::vector<uint32_t> gpuOf(s.nRanks);
  for (uint32_t r = 0; r < s.nRanks; ++r) {
    const uint32_t node = s.nodeOf[r];
    if (node >= topo.nodes)
      throw Error(ErrorCode::InvalidArgument, "schedule rank " + std::to_string(r) + " is on node " +
                                                  std::to_string(node) + " but " + cluster + " has " +
                                                  std::to_string(topo.nodes) + " node(s) (use --nodes)");
    if (used[node] == topo.node.gpus)
      throw Error(ErrorCode::InvalidArgument, "schedule places more than " + std::to_string(topo.node.gpus) +
                                                  " ranks on node " + std::to_string(node) + " but " + cluster +
                                                  " has " + std::to_string(topo.node.gpus) + " GPUs per node");
    gpuOf[r] = node * topo.node.gpus + used[node]++;
  }
  return gpuOf;
}

Topology usedPart(const Topology& topo, const Schedule& s) {
  Topology part = topo;
  uint32_t last = 0;
  for (const uint32_t node : s.nodeOf) last = std::max(last, node);
  // Nodes past the last one a rank sits on carry no traffic, and a leaf's uplink is sized by nodesPerLeaf, not by
  // the number of leaves: leaving them out changes no route and no rate of the nodes in use.
  if (!s.nodeOf.empty() && last + 1 < topo.nodes) part.nodes = last + 1;
  return part;
}

Prediction predict(const Schedule& s, const Topology& whole, const Profile& profile, const SimOptions& opt) {
  const Topology topo = usedPart(whole, s);
  const Plan plan(s, topo, profile);
  if (!opt.isolate) {
    if (inProcessUsed)
      throw Error(ErrorCode::Unsupported,
                  "SimGrid 3.32 allows one engine per process and this process already ran one: use isolate = true");
    inProcessUsed = true;
    return simulate(plan, topo, opt);
  }
  return detail::deserialize(runIsolated([&] { return detail::serialize(simulate(plan, topo, opt)); }));
}

}  // namespace mk::sim
