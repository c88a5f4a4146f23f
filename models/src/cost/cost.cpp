// mkernel — datasheet profile and the uncontended timeline (docs/cost-model.md).
#include "mk/cost/cost.hpp"

#include <algorithm>
#include <cmath>
#include <queue>
#include <sstream>
#include <unordered_map>

#include "mk/cost/step_cost.hpp"
#include "mk/error.hpp"

namespace mk {

namespace {

// ---- datasheet defaults ------------------------------------------------------------------------------------

// A copy kernel pass inside one GPU costs a few hundred ns before bytes flow (grid-stride loop start, the
// first HBM round trip); 0.5 us is that order of magnitude, not a measurement: calibration replaces it.
constexpr double kLocalAlphaUs = 0.5;
// A topology without NICs still gets a usable network class (so a what-if on it does not divide by zero):
// one ConnectX-7 NDR port, 400 Gb/s = 50 GB/s per direction, ~2.5 us one-way RDMA WRITE.
constexpr double kFallbackNicGBs = 50;
constexpr double kFallbackNicLatencyUs = 2.5;
// Op enqueue -> first step: the host writes a doorbell into mapped pinned memory that the resident kernel
// polls; measured on the H200 pair at about half of the 2.67 us GPU->CPU->GPU round trip (~1.3 us), plus
// decoding the descriptor and reaching the lane: rounded up to 2 us.
constexpr double kDispatchUs = 2.0;
// Per ProxyPut: the GPU writes a FIFO record, a pinned host thread sees it (half the measured 2.67 us
// mapped-memory round trip) and posts the work request (~1 us of ibv_post_send + doorbell MMIO).
constexpr double kProxyUs = 2.5;
// Of that, the proxy thread's own work per message (the post): the ~1 us above. The FIFO record's visibility
// is latency, which later messages overlap (step_cost.hpp, proxyIssueUs).
constexpr double kProxyPostUs = 1.0;
// cuBLAS bf16 GEMM reached 680-790 TFLOP/s on the H200 pair against a 989 TFLOP/s dense peak (69-80%).
constexpr double kGemmEfficiency = 0.75;
// What one CTA of a lane moves per second through NVLink stores or local copies: NCCL's own model caps a Hopper
// channel (one CTA) at 36.7 GB/s (perChMaxRingLL128Bw in NCCL's src/graph/tuning.cc). Not measured here: a
// put-bandwidth-versus-CTAs micro-benchmark would calibrate it.
constexpr double kCtaGBs = 36.7;

// ---- uncontended timeline ----------------------------------------------------------------------------------

/// Discrete-event evaluation of the timeline rules (the per-step rules are StepCosts'). Lanes run ahead on
/// their own ("inline") through every step whose timing does not depend on other lanes; only a Wait needs
/// global time order, because its end is the time the counter reaches the threshold with increments applied
/// in visibility order. Increments are therefore events in a time-ordered queue, and a Wait is decided only
/// when the clock has reached its ready time: by then every increment visible earlier has been produced (a
/// step's increment is never visible before the step starts, and every step starting earlier has already
/// been run) and applied.
class UncontendedSim {
 public:
  UncontendedSim(const Schedule& s, const Profile& p, std::vector<double> networkShares = {})
      : s_(s), p_(p), costs_(s, p, {}, std::move(networkShares)) {}

  Timeline run() {
    prepare();
    const double t0 = p_.dispatchUs;
    for (uint64_t g = 0; g < lanes_.size(); ++g) {
      lanes_[g].ready = t0;
      runLane(g, t0);
    }
    while (!events_.empty()) {
      const Event ev = events_.top();
      events_.pop();
      if (ev.increment) {
        applyIncrement(ev.index, ev.value, ev.t);
      } else {
        runLane(ev.index, ev.t);
      }
    }
    reportDeadlock();
    double lastEnd = 0;
    for (const StepTime& st : out_) lastEnd = std::max(lastEnd, st.endUs);
    Timeline tl;
    tl.totalUs = costs_.opTotalUs(lastEnd);
    tl.steps = std::move(out_);
    return tl;
  }

 private:
  struct LaneState {
    uint32_t rank = 0, lane = 0;
    uint32_t next = 0;  ///< index of the step to run
    double ready = 0;   ///< end of the previous step
    uint64_t firstOut = 0;
    const std::vector<Step>* steps = nullptr;
  };
  struct Event {
    double t;
    uint64_t seq;    ///< FIFO among equal times: keeps the run deterministic
    uint64_t index;  ///< lane (global index) or flag (rank * nFlags + id)
    uint64_t value;
    bool increment;
  };
  struct Later {
    bool operator()(const Event& a, const Event& b) const noexcept {
      return a.t > b.t || (a.t == b.t && a.seq > b.seq);
    }
  };
  struct BarrierState {
    uint64_t expected = 0;
    double lastArrival = 0;
    std::vector<uint64_t> arrived;  ///< lanes blocked on it
  };
  using Waiter = std::pair<uint64_t, uint64_t>;  // (threshold, lane)

  uint64_t flagIndex(FlagRef f) const noexcept { return static_cast<uint64_t>(f.rank) * s_.nFlags + f.id; }

  /// Lane states, output slots and barrier participation (the checks ran in StepCosts).
  void prepare() {
    for (const LaneRef& ref : costs_.lanes()) {
      LaneState ls;
      ls.rank = ref.rank;
      ls.lane = ref.lane;
      ls.firstOut = ref.firstStep;
      ls.steps = &s_.lanes[ref.rank][ref.lane].steps;
      lanes_.push_back(ls);
    }
    barriers_.resize(s_.nBarriers);
    for (uint32_t id = 0; id < s_.nBarriers; ++id) barriers_[id].expected = costs_.barrierParticipants(id);
    out_.resize(costs_.steps());
  }

  void push(double t, uint64_t index, uint64_t value, bool increment) {
    events_.push(Event{t, seq_++, index, value, increment});
  }

  void record(LaneState& ls, double start, double end) {
    StepTime& o = out_[ls.firstOut + ls.next];
    o.rank = ls.rank;
    o.lane = ls.lane;
    o.step = ls.next;
    o.startUs = start;
    o.endUs = end;
    ls.ready = end;
    ++ls.next;
  }

  /// Run lane `g` from its next step at clock `now` (== its ready time) until it blocks, must wait for the
  /// clock, or ends.
  void runLane(uint64_t g, double now) {
    LaneState& ls = lanes_[g];
    const auto& steps = *ls.steps;
    while (ls.next < steps.size()) {
      const Step& st = steps[ls.next];
      const double start = ls.ready;
      switch (st.kind) {
        case StepKind::Wait: {
          if (start > now) {  // later increments may still arrive before `start`: decide at that time
            push(start, g, 0, false);
            return;
          }
          const uint64_t f = flagIndex(st.flag);
          if (counter_[f] >= st.value) {
            record(ls, start, waitEndUs(p_, start, start));
            break;
          }
          waiters_[f].push(Waiter{st.value, g});
          return;
        }
        case StepKind::Barrier: {
          BarrierState& b = barriers_[st.aux];
          b.lastArrival = b.arrived.empty() ? start : std::max(b.lastArrival, start);
          b.arrived.push_back(g);
          if (b.arrived.size() < b.expected) return;
          const double end = b.lastArrival + costs_.barrierReleaseUs();
          for (uint64_t other : b.arrived) {
            LaneState& o = lanes_[other];
            record(o, o.ready, end);
            push(end, other, 0, false);
          }
          b.arrived.clear();
          return;  // this lane continues from its event too
        }
        default: {
          const double end = start + costs_.laneUs(st, ls.rank, ls.lane);
          if (incrementsFlag(st.kind, st.flags))
            push(end + costs_.incrementDelayUs(st, ls.rank), flagIndex(st.flag), st.value, true);
          record(ls, start, end);
        }
      }
    }
  }

  void applyIncrement(uint64_t flag, uint64_t value, double t) {
    uint64_t& c = counter_[flag];
    c = (c > UINT64_MAX - value) ? UINT64_MAX : c + value;
    auto it = waiters_.find(flag);
    if (it == waiters_.end()) return;
    auto& heap = it->second;
    resumed_.clear();
    while (!heap.empty() && heap.top().first <= c) {
      resumed_.push_back(heap.top().second);
      heap.pop();
    }
    if (heap.empty()) waiters_.erase(it);
    // The counter first reached these thresholds at t, and each waiter was blocked at or before t.
    for (uint64_t g : resumed_) {  // runLane never touches resumed_ (it does not apply increments)
      LaneState& ls = lanes_[g];
      record(ls, ls.ready, waitEndUs(p_, ls.ready, t));
      runLane(g, t);
    }
  }

  void reportDeadlock() const {
    uint64_t blocked = 0;
    const LaneState* first = nullptr;
    for (const LaneState& ls : lanes_)
      if (ls.next < ls.steps->size()) {
        ++blocked;
        if (!first) first = &ls;
      }
    if (!first) return;
    const Step& st = (*first->steps)[first->next];
    std::ostringstream os;
    os << describeStep(s_, first->rank, first->lane, first->next) << ": never completes: ";
    if (st.kind == StepKind::Wait) {
      auto it = counter_.find(flagIndex(st.flag));
      os << "waits for flag " << st.flag.id << " of rank " << st.flag.rank << " >= " << st.value
         << " but it only ever reaches " << (it == counter_.end() ? 0 : it->second);
    } else {
      const BarrierState& b = barriers_[st.aux];
      os << "barrier " << st.aux << " is reached by only " << b.arrived.size() << " of its " << b.expected
         << " participants";
    }
    os << " (" << blocked << " of " << lanes_.size() << " lanes blocked)";
    throw Error(ErrorCode::Deadlock, os.str());
  }

  const Schedule& s_;
  const Profile& p_;
  const StepCosts costs_;
  std::vector<LaneState> lanes_;
  std::vector<StepTime> out_;
  std::vector<BarrierState> barriers_;
  std::unordered_map<uint64_t, uint64_t> counter_;
  std::unordered_map<uint64_t, std::priority_queue<Waiter, std::vector<Waiter>, std::greater<Waiter>>> waiters_;
  std::priority_queue<Event, std::vector<Event>, Later> events_;
  std::vector<uint64_t> resumed_;
  uint64_t seq_ = 0;
};

}  // namespace

Profile defaultProfile(const Topology& t) {
  Profile p;
  p.source = "uncalibrated (datasheet defaults for " + t.node.gpu + ")";
  // A Put is a peer store: the link's one-way latency, then the per-direction NVLink bandwidth.
  p.nvlink = LinkCost{t.node.nvlink.latencyUs, t.node.nvlink.bwGBs};
  // GPU -> PCIe -> NIC -> leaf -> (spine) -> leaf -> NIC: the NIC's latency plus two leaf hops (rail-optimised:
  // same-rail peers under one leaf pair); bytes stream at what one GPU's network path gives while nothing else of
  // its node shares it (its NICs striped, capped by PCIe and switch uplinks: nodeNetworkAloneGBs). Sharing is
  // the topology's, applied per schedule (rankNetworkShares).
  const double alone = nodeNetworkAloneGBs(t.node);
  const bool hasNic = t.node.nics > 0 && alone > 0;
  const double nicGBs = hasNic ? alone : std::min(kFallbackNicGBs, t.node.pcie.bwGBs);  // no NIC: one 400 Gb/s
  const double nicUs = hasNic ? t.node.nic.latencyUs : kFallbackNicLatencyUs;           // (only what-ifs reach it)
  p.network = LinkCost{nicUs + 2 * t.fabric.switchLatencyUs, nicGBs};
  p.transport = defaultTransport(t.node.nics > 0 ? nicsOf(t.node).front().transport : std::string("ib"));
  // A local copy reads and writes every byte: half the HBM bandwidth.
  p.local = LinkCost{kLocalAlphaUs, t.node.hbmGBs / 2};
  // A reduce reads two operands and writes one: a third of the HBM bandwidth in output bytes.
  p.reduceGBs = t.node.hbmGBs / 3;
  // A flag is one 8-byte peer store: the NVLink one-way latency.
  p.flagUs = t.node.nvlink.latencyUs;
  // A flag between lanes of one GPU stays in its L2: about half a peer store (not measured; calibrate it).
  p.localFlagUs = t.node.nvlink.latencyUs / 2;
  p.dispatchUs = kDispatchUs;
  p.proxyUs = kProxyUs;
  p.proxyPostUs = kProxyPostUs;
  p.gemmTflops = kGemmEfficiency * t.node.bf16Tflops;
  // No datasheet gives an attention rate: the GEMM's, which priced attention before the field existed, so that a
  // prediction without a calibrated attention rate stays what it was.
  p.attentionTflops = p.gemmTflops;
  p.sms = t.node.sms;
  p.ctaGBs = kCtaGBs;
  return p;
}

Timeline simulateUncontended(const Schedule& s, const Profile& profile) { return UncontendedSim(s, profile).run(); }

Timeline simulateUncontended(const Schedule& s, const Profile& profile, const Topology& topo) {
  std::vector<bool> sends(s.nRanks, false);
  for (uint32_t r = 0; r < s.nRanks && r < s.lanes.size(); ++r)
    for (const Lane& lane : s.lanes[r])
      for (const Step& st : lane.steps) sends[r] = sends[r] || (kindInfo(st.kind).remote && st.count > 0);
  return UncontendedSim(s, profile, rankNetworkShares(topo, s.nodeOf, sends)).run();
}

double busBwFactor(CollOp op, uint32_t nRanks) noexcept {
  if (nRanks == 0) return 0;
  const double n = nRanks;
  switch (op) {
    case CollOp::AllReduce: return 2.0 * (n - 1) / n;
    case CollOp::AllGather:
    case CollOp::ReduceScatter:
    case CollOp::AllToAll: return (n - 1) / n;
    case CollOp::Broadcast: return 1.0;
  }
  return 1.0;
}

uint64_t opBytes(const CollectiveSpec& spec, uint32_t nRanks) noexcept {
  return std::max(inputCount(spec, nRanks), outputCount(spec, nRanks)) * dtypeSize(spec.dtype);
}

}  // namespace mk
