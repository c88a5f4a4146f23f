// mkernel — Schedule -> SimGrid actors and activities -> prediction (replay.hpp, docs/simulator.md).
#include "mk/sim/replay.hpp"

#include <malloc.h>
#include <simgrid/plugins/load.h>
#include <simgrid/version.h>
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
#include <functional>
#include <iterator>
#include <limits>
#include <memory>
#include <sstream>
#include <type_traits>
#include <unordered_map>

#include "flag_state.hpp"
#include "isolated.hpp"
#include "link_ledger.hpp"
#include "mk/cost/step_cost.hpp"
#include "mk/error.hpp"
#include "mk/sim/platform.hpp"
#include "replay_plan.hpp"

XBT_LOG_NEW_DEFAULT_CATEGORY(mk_replay, "mkernel: schedule replay");

namespace sg4 = simgrid::s4u;

namespace mk::sim {

using detail::BarrierState;
using detail::FlagState;
using detail::FlagWaiter;
using detail::Plan;

namespace {

constexpr double kSecondsPerUs = 1e-6;
constexpr double kBytesPerGB = 1e9;
constexpr double kInf = std::numeric_limits<double>::infinity();

// ---- the simulation ---------------------------------------------------------------------------------------

/// Where one lane's transfers go: one mailbox per destination host, so that a lane's drain receive always
/// matches its own (single outstanding) comm.
struct LaneMailboxes {
  std::vector<std::pair<const sg4::Host*, sg4::Mailbox*>> byDestination;
};

/// All simulation state of one replay. Lives in the simulating process only.
class Replayer {
 public:
  /// `timeTransfers` (exact mode): NVLink and network transfers are timed at their caps and proven uncontended
  /// (LinkLedger) instead of simulated; see runLane.
  Replayer(const Plan& plan, const Platform& platform, const SimOptions& opt, bool timeTransfers)
      : plan_(plan),
        costs_(plan.costs),
        s_(costs_.schedule()),
        p_(costs_.profile()),
        lanes_(costs_.lanes()),
        platform_(platform),
        opt_(opt),
        timeTransfers_(timeTransfers) {
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

  /// SimGrid found actors blocked with nothing left to run (its on_deadlock signal): a replay that cannot
  /// complete is an error, never a message on a run that goes on (issue 33).
  void engineDeadlocked() { engineDeadlocked_ = true; }

  void finish(Prediction& out) const {
    if (engineDeadlocked_)
      throw Error(ErrorCode::Deadlock, "SimGrid found the replay of " + opName() + " deadlocked with " +
                                           std::to_string(lanes_.size() - lanesDone_) + " of " +
                                           std::to_string(lanes_.size()) +
                                           " lanes unfinished (a bug of the replay: please report it)");
    out.stats.oversubscribed = oversubscribed_;
    if (oversubscribed_) return;  // the timed pass is void: predict() runs the replay again
    if (lanesDone_ != lanes_.size()) reportStuck();
    out.totalUs = costs_.opTotalUs(maxEndUs_);  // rule 1: dispatch at least, peerUserUs on top
    out.stats.steps = costs_.steps();
    out.stats.comms = comms_;
    out.stats.execs = execs_;
    out.stats.actors = lanes_.size();
    out.stats.timedTransfers = timed_;
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

  /// Every link of the platform: those whose bytes are reported, and those the ledger of timed transfers keeps.
  void trackLinks(const std::vector<sg4::Link*>& links) {
    std::vector<double> capacity;
    for (uint32_t i = 0; i < links.size(); ++i) {
      linkIndex_.emplace(links[i], i);
      capacity.push_back(links[i]->get_bandwidth());
    }
    linkBytes_.assign(links.size(), 0.0);
    if (timeTransfers_) ledger_ = std::make_unique<detail::LinkLedger>(std::move(capacity));
  }
  double linkBytes(uint32_t i) const { return linkBytes_[i]; }
  /// The largest instantaneous load of link `i` from the transfers timed without SimGrid (bytes/s; 0: none).
  double timedPeakBps(uint32_t i) const { return ledger_ ? ledger_->peakBps(i) : 0.0; }

  /// Called every kStepsPerTick steps done (progress reports that do not wait for the engine clock to move).
  void onSteps(std::function<void()> tick) { onSteps_ = std::move(tick); }

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

  /// One lane's steps on a lane-local clock `t` that may run ahead of SimGrid's. Steps that can never contend
  /// are timed with the timeline's own rule (StepCosts::laneUs) on that clock without any simulation event: a
  /// local Copy / Reduce or a Gemm holds its pipe at its lane's share, and the shares of a pipe's lanes add up
  /// to at most the pipe (rule 2), so an Exec bounded to it would always run at exactly its bound. Signals and
  /// Waits are decided from the flag's increments (waitFlag). Transfers (NVLink, and a ProxyPut's bytes) are
  /// timed the same way at their caps and entered in the ledger, which proves that SimGrid would have given each
  /// its cap (timedFlow); fast mode times NVLink without that proof (its network transfers go to the ledger
  /// too), and the second pass after a failed proof simulates every transfer (fast: every network transfer). The lane
  /// meets the engine clock (syncTo) only before a simulated transfer. A Wait that the increments sent so far decide by
  /// the lane's clock ends there (later increments could only make the threshold's time earlier); otherwise the lane
  /// suspends until the engine reaches that time, and any increment sent meanwhile moves the wake-up. A Barrier takes
  /// the latest arrival over its lanes' clocks.
  void runLane(uint64_t g) {
    const auto [rank, lane, firstStep] = lanes_[g];
    const auto& steps = s_.lanes[rank][lane].steps;
    double t = p_.dispatchUs * kSecondsPerUs;  // dispatch is paid once per op: every lane starts then (rule 1)
    noteEnd(t);
    for (uint32_t i = 0; i < steps.size(); ++i) {
      const Step& st = steps[i];
      const double start = t;
      switch (st.kind) {
        case StepKind::Wait:
          waitFlag(g, st.flag, st.value, t);
          t = waitEnd(t, std::max(t, now()));
          break;
        case StepKind::Barrier: t = barrier(g, st.aux, t); break;
        case StepKind::ProxyPut: t = proxyPut(g, rank, lane, st, t); break;
        case StepKind::Signal:
          increment(st.flag, st.value, t + signalDelayUs(rank, st.flag.rank) * kSecondsPerUs);
          break;
        default: {  // Copy, Reduce, Put, Gemm
          const StepPrice pr = costs_.price(st, rank, lane);
          if (pr.resource == StepResource::NvLink && !opt_.fast && timeTransfers_) {
            t = timedNvl(rank, lane, st, pr, t);
          } else if (pr.resource == StepResource::NvLink && !opt_.fast) {
            t = transferNvl(g, rank, nvlinkSource(st, rank), st.dst.rank, st.bytes, pr, t);
          } else {
            const double us = costs_.laneUs(st, rank, lane);
            if (pr.resource != StepResource::NvLink && us > 0) ++execs_;
            t += us * kSecondsPerUs;
          }
          if (incrementsFlag(st.kind, st.flags))
            increment(st.flag, st.value, t + costs_.incrementDelayUs(st, rank) * kSecondsPerUs);
        }
      }
      stepDone(firstStep + i, start, t);
      if (oversubscribed_) return;
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
    // Lanes that only time their steps never move the engine clock: they report progress every so many steps.
    if ((++stepsDone_ & (kStepsPerTick - 1)) == 0 && onSteps_) onSteps_();
  }

  /// Bring the engine clock to the lane's clock `t` before the lane starts an activity there: a kernel timer
  /// resumes the lane at exactly `t` (cheaper than a sleep activity; set without a simcall, as in scheduleWake).
  static void syncTo(double t) {
    if (t > now()) {
      sg4::Actor* self = sg4::Actor::self();
      simgrid::kernel::timer::Timer::set(t, [self] { self->resume(); });
      sg4::this_actor::suspend();
    }
  }

  /// A ProxyPut started at lane time `t`: the issue on the lane, then the bytes over the fabric (simulated); the
  /// message lands the transport's latency (and any extra switch hops) later, while the lane goes on within its
  /// in-flight slots (proxyLaneUs). Returns the lane's clock after the step.
  double proxyPut(uint64_t g, uint32_t rank, uint32_t lane, const Step& st, double t) {
    const StepPrice pr = costs_.price(st, rank, lane);
    const uint32_t hops = platform_.extraSwitchHops(plan_.gpuOf[rank], plan_.gpuOf[st.dst.rank]);
    double sent = t + pr.alphaUs * kSecondsPerUs;  // the end, then the bytes' end
    if (pr.amount > 0 && timeTransfers_) {
      sent = timedStripes(rank, st.dst.rank, pr.amount, laneRate(rank, pr), sent);
    } else if (pr.amount > 0) {
      syncTo(sent);
      sendStriped(g, rank, st.dst.rank, pr.amount, laneRate(rank, pr));
      sent = now();
    }
    const double busyUs = (sent - t) / kSecondsPerUs;
    const double landsUs = proxyLatencyUs(p_) + hops * platform_.switchLatencyUs;  // after the bytes
    if (st.flags & kStepSignal) increment(st.flag, st.value, sent + landsUs * kSecondsPerUs);
    const double restUs = proxyLaneUs(p_, busyUs) - busyUs;
    return restUs > 0 ? sent + restUs * kSecondsPerUs : sent;
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
    if (kindInfo(st.kind).peerWrite) return rank;
    if (kindInfo(st.kind).fields & kFieldB) return st.a.rank != st.dst.rank ? st.a.rank : st.b.rank;
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

  /// An NVLink step started at lane time `t`, timed by the timeline's rule (alpha, then the bytes at the lane's
  /// cap) and entered in the ledger on its SimGrid route. While no link is oversubscribed, SimGrid would give
  /// every such transfer exactly its cap (max-min sharing leaves a bound alone while its links have room), so
  /// the times are the simulated ones; otherwise the pass stops and predict() simulates every transfer.
  double timedNvl(uint32_t rank, uint32_t lane, const Step& st, const StepPrice& pr, double t) {
    const double end = t + costs_.laneUs(st, rank, lane) * kSecondsPerUs;
    if (st.bytes == 0) return end;
    timedFlow(gpuHost(nvlinkSource(st, rank)), gpuHost(st.dst.rank), st.bytes, t + pr.alphaUs * kSecondsPerUs, end,
              laneRate(rank, pr));
    return end;
  }

  /// A ProxyPut's wire bytes timed as sendStriped would send them (one transfer per NIC stripe at its part of
  /// the lane's rate), from `start`; returns when the last stripe is through.
  double timedStripes(uint32_t rank, uint32_t dst, double wireBytes, double rateCap, double start) {
    const auto& from = platform_.netVia[plan_.gpuOf[rank]];
    const auto& to = platform_.netVia[plan_.gpuOf[dst]];
    const auto bytes = static_cast<uint64_t>(std::ceil(wireBytes));
    const uint64_t k = from.size();
    const double rate = k == 1 ? rateCap : rateCap / static_cast<double>(k);
    double end = start;
    for (uint64_t j = 0; j < k; ++j) {
      const uint64_t part = bytes / k + (j < bytes % k ? 1 : 0);
      if (part == 0) continue;
      const double stripeEnd = start + static_cast<double>(part) / rate;
      timedFlow(from[j], to[j % to.size()], part, start, stripeEnd, rate);
      end = std::max(end, stripeEnd);
    }
    return end;
  }

  /// One transfer timed at its cap `rate` over [start, end): its bytes on the link report, and its place in the
  /// ledger; an oversubscribed link stops the pass.
  void timedFlow(const sg4::Host* from, const sg4::Host* to, uint64_t bytes, double start, double end, double rate) {
    if (opt_.linkLoad) account(from, to, bytes);
    ++timed_;
    if (!ledger_->add(route(from, to), start, end, rate, now())) stopOversubscribed();
  }

  /// A link carried more than its bandwidth: release every suspended lane so that all of them end at
  /// their next step and the engine runs dry; the result is void (finish).
  void stopOversubscribed() {
    oversubscribed_ = true;
    for (FlagState& f : flags_) {
      for (const FlagWaiter& w : f.waiters) actors_[w.lane]->resume();
      f.waiters.clear();
    }
    for (BarrierState& b : barriers_) {
      for (const uint64_t lane : b.waiting) actors_[lane]->resume();
      b.waiting.clear();
    }
  }

  /// An NVLink transfer between `from` and `to` (one of them a peer; Plan checked it) started at lane time `t`:
  /// the lane pays the price's alpha (a Put its issue time; the rest of its alpha delays only its signal), then
  /// the bytes flow capped at the lane's share of the price's rate. Returns the lane's clock after the step.
  double transferNvl(uint64_t g, uint32_t rank, uint32_t from, uint32_t to, uint64_t bytes, const StepPrice& pr,
                     double t) {
    t += pr.alphaUs * kSecondsPerUs;
    if (bytes == 0) return t;
    syncTo(t);
    // The bytes flow from `from` to `to` whoever executes the step: a read starts at the peer.
    communicate(g, gpuHost(from), gpuHost(to), bytes, laneRate(rank, pr));
    return now();
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
    simgrid::kernel::actor::ActorImpl* self = sg4::Actor::self()->get_impl();
    ++comms_;
    sg4::Comm::send(self, mb, static_cast<double>(bytes), rateCap, &token_, sizeof(void*), nullptr, nullptr, nullptr,
                    -1.0);
    // The permanent receiver keeps finished comms until someone receives them: take ours back at once.
    void* back = nullptr;
    std::size_t size = sizeof(void*);
    sg4::Comm::recv(self, mb, &back, &size, nullptr, nullptr, nullptr, -1.0, -1.0);
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
    for (const uint32_t id : route(from, to)) linkBytes_[id] += static_cast<double>(bytes);
  }

  /// The links from `from` to `to` as indices of trackLinks' list (cached: SimGrid computes a route per call).
  const std::vector<uint32_t>& route(const sg4::Host* from, const sg4::Host* to) {
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
    return it->second;
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
    // After a failed proof the lanes that would raise this flag may already have left: never suspend then.
    if (oversubscribed_) return;
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

  /// Lane `g` reaches barrier `id` at lane time `t`; returns its clock when the barrier lets it go: the last
  /// arrival (in simulated time, whichever lane gets there last in the run) plus the release. Only lanes that
  /// arrive before the last participant suspend; none of them needs the engine clock.
  double barrier(uint64_t g, uint32_t id, double t) {
    BarrierState& b = barriers_[id];
    b.lastArrival = b.arrived == 0 ? t : std::max(b.lastArrival, t);
    ++b.arrived;
    if (b.arrived < costs_.barrierParticipants(id)) {
      if (oversubscribed_) return t;  // the others may have left already (stopOversubscribed)
      b.waiting.push_back(g);
      sg4::this_actor::suspend();
      if (oversubscribed_) return t;
    } else {
      for (const uint64_t other : b.waiting) actors_[other]->resume();
      b.waiting.clear();
    }
    const double releaseUs = b.lastArrival / kSecondsPerUs + costs_.barrierReleaseUs();
    return std::max(t, releaseUs * kSecondsPerUs);
  }

  /// The collective replayed, for errors: "sendrecv (direct, 4 ranks, count 1024)".
  std::string opName() const {
    return (s_.info.op.empty() ? std::string("a schedule") : s_.info.op) + " (" + s_.info.algo + ", " +
           std::to_string(s_.nRanks) + " ranks, count " + std::to_string(s_.info.count) + ")";
  }

  [[noreturn]] void reportStuck() const {
    throw Error(ErrorCode::Deadlock, "the replay of " + opName() + " stopped with " +
                                         std::to_string(lanes_.size() - lanesDone_) + " of " +
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
  const bool timeTransfers_;
  std::unique_ptr<detail::LinkLedger> ledger_;  ///< when timeTransfers_
  bool oversubscribed_ = false;                 ///< the ledger found a link over its bandwidth
  bool engineDeadlocked_ = false;               ///< SimGrid's on_deadlock fired
  uint64_t timed_ = 0;
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
  static constexpr uint64_t kStepsPerTick = 1024;
  std::function<void()> onSteps_;
  uint64_t lanesDone_ = 0;
  uint64_t comms_ = 0;
  uint64_t execs_ = 0;
};

double peakRssMiB() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return static_cast<double>(ru.ru_maxrss) / 1024.0;  // Linux reports KiB
}

/// One replay in this process. `timeTransfers`: exact mode times NVLink and network transfers and proves them
/// uncontended (Replayer::timedFlow); the result then has stats.oversubscribed set when the proof failed.
Prediction simulate(const Plan& plan, const Topology& topo, const SimOptions& opt, bool timeTransfers) {
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
  const std::vector<sg4::Link*> links = engine->get_all_links();
  if (opt.linkLoad)
    for (const sg4::Link* l : links) sg_link_load_track(l);
  Replayer replayer(plan, platform, opt, timeTransfers);
  replayer.trackLinks(links);
  replayer.start();
  sg4::Engine::on_deadlock_cb([&replayer] { replayer.engineDeadlocked(); });
  XBT_INFO("replaying %llu steps on %zu lanes (%s mode)", static_cast<unsigned long long>(plan.costs.steps()),
           plan.costs.lanes().size(), opt.fast ? "fast" : "exact");
  // Outlives the callback, which runs inside engine->run() below (a copy in the `if` block's scope did not).
  double nextReport = opt.progressAfterS;
  auto report = [&] {
    const double w = wallSeconds();
    if (w < nextReport) return;
    nextReport = w + opt.progressEveryS;
    opt.onProgress(replayer.progress(), sg4::Engine::get_clock() / kSecondsPerUs, w);
  };
  if (opt.onProgress) {
    sg4::Engine::on_time_advance_cb([&](double) { report(); });
    replayer.onSteps(report);
  }
  engine->run();
  if (opt.onProgress) report();  // the last report, when one is due
  Prediction out;
  replayer.finish(out);
  if (opt.linkLoad && !out.stats.oversubscribed) {
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
      ll.peakGBs = std::max(sg_link_get_max_instantaneous_load(l), replayer.timedPeakBps(i)) / kBytesPerGB;
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

Prediction predict(const Schedule& s, const Topology& whole, const Profile& profile, const SimOptions& opt) {
  const Topology topo = usedPart(whole, s);
  const Plan plan(s, topo, profile);
  if (!opt.isolate) {
    if (inProcessUsed)
      throw Error(ErrorCode::Unsupported,
                  "SimGrid 3.32 allows one engine per process and this process already ran one: use isolate = true");
    inProcessUsed = true;
    return simulate(plan, topo, opt, /*timeTransfers=*/false);  // no second engine for a second pass
  }
  auto pass = [&](bool timeTransfers) {
    return detail::deserialize(
        runIsolated([&] { return detail::serialize(simulate(plan, topo, opt, timeTransfers)); }));
  };
  if (!opt.timeTransfers) return pass(false);
  Prediction timed = pass(true);
  if (!timed.stats.oversubscribed) return timed;
  // Some link was shared beyond its bandwidth: SimGrid's sharing decides the transfers.
  Prediction simulated = pass(false);
  simulated.stats.passes = 2;
  simulated.stats.oversubscribed = true;
  simulated.stats.wallSeconds += timed.stats.wallSeconds;
  simulated.stats.peakRssMiB = std::max(simulated.stats.peakRssMiB, timed.stats.peakRssMiB);
  return simulated;
}

std::string engineVersion() {
  int major = 0, minor = 0, patch = 0;
  sg_version_get(&major, &minor, &patch);
  return "SimGrid " + std::to_string(major) + "." + std::to_string(minor) + "." + std::to_string(patch);
}

}  // namespace mk::sim
