// mkernel — datasheet profile, closed-form dispatch, and the uncontended timeline (docs/cost-model.md).
#include "mk/cost/cost.hpp"

#include <algorithm>
#include <cmath>
#include <queue>
#include <sstream>
#include <unordered_map>

#include "../algorithms/builder.hpp"
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
// cuBLAS bf16 GEMM reached 680-790 TFLOP/s on the H200 pair against a 989 TFLOP/s dense peak (69-80%).
constexpr double kGemmEfficiency = 0.75;

// ---- uncontended timeline ----------------------------------------------------------------------------------

/// The shared resources of rule 2 of the timeline model.
enum Resource : uint8_t { kNvl = 0, kNet = 1, kMem = 2, kGpu = 3, kResources = 4, kNoResource = 255 };

/// Discrete-event evaluation of the timeline rules. Lanes run ahead on their own ("inline") through every
/// step whose timing does not depend on other lanes; only a Wait needs global time order, because its end is
/// the time the counter reaches the threshold with increments applied in visibility order. Increments are
/// therefore events in a time-ordered queue, and a Wait is decided only when the clock has reached its
/// ready time: by then every increment visible earlier has been produced (a step's increment is never
/// visible before the step starts, and every step starting earlier has already been run) and applied.
class UncontendedSim {
 public:
  UncontendedSim(const Schedule& s, const Profile& p) : s_(s), p_(p) {}

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
    Timeline tl;
    tl.totalUs = t0;
    for (const StepTime& st : out_) tl.totalUs = std::max(tl.totalUs, st.endUs);
    // Global completion and the entry handshake, when some rank's user buffers are a peer's operand.
    if (p_.peerUserUs > 0 && peersTouchUserBuffers(s_)) tl.totalUs += p_.peerUserUs;
    tl.steps = std::move(out_);
    return tl;
  }

 private:
  struct LaneState {
    uint32_t rank = 0, lane = 0;
    uint32_t next = 0;   ///< index of the step to run
    double ready = 0;    ///< end of the previous step
    uint64_t firstOut = 0;
    const std::vector<Step>* steps = nullptr;
  };
  struct Event {
    double t;
    uint64_t seq;  ///< FIFO among equal times: keeps the run deterministic
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

  [[noreturn]] void badStep(uint32_t rank, uint32_t lane, uint32_t step, const std::string& what) const {
    throw Error(ErrorCode::InvalidSchedule, describeStep(s_, rank, lane, step) + ": " + what);
  }

  uint64_t flagIndex(FlagRef f) const noexcept { return static_cast<uint64_t>(f.rank) * s_.nFlags + f.id; }

  Resource resourceOf(const Step& st, uint32_t rank, uint32_t lane, uint32_t step) const {
    switch (st.kind) {
      case StepKind::Put: return kNvl;
      case StepKind::ProxyPut: return kNet;
      case StepKind::Gemm: return kGpu;
      case StepKind::Copy:
      case StepKind::Reduce:
        if (st.link == LinkClass::NVLink) return kNvl;
        if (st.link == LinkClass::Local) return kMem;
        if (st.link == LinkClass::Network)
          badStep(rank, lane, step, "a copy or reduce cannot touch another node's memory (link network): use a ProxyPut");
        badStep(rank, lane, step,
                std::string("a copy or reduce needs link local or nvlink (got ") + toString(st.link) +
                    "): call fillCostAttributes() first");
      default: return kNoResource;
    }
  }

  static void needRate(const char* field, double v, const char* why) {
    if (!std::isfinite(v) || !(v > 0)) {
      std::ostringstream os;
      os << "profile." << field << " must be > 0 (got " << v << ") for " << why;
      throw Error(ErrorCode::InvalidArgument, os.str());
    }
  }

  static void needLatency(const char* field, double v) {
    if (!std::isfinite(v) || v < 0) {
      std::ostringstream os;
      os << "profile." << field << " must be >= 0 and finite (got " << v << ")";
      throw Error(ErrorCode::InvalidArgument, os.str());
    }
  }

  /// Structure checks the rules depend on, shares (rule 2), output slots, barrier participation.
  void prepare() {
    if (s_.lanes.size() != s_.nRanks)
      throw Error(ErrorCode::InvalidSchedule, "schedule has " + std::to_string(s_.lanes.size()) +
                                                  " lane lists for nRanks " + std::to_string(s_.nRanks));
    if (s_.nodeOf.size() != s_.nRanks)
      throw Error(ErrorCode::InvalidSchedule, "schedule has nodeOf of size " + std::to_string(s_.nodeOf.size()) +
                                                  " for nRanks " + std::to_string(s_.nRanks));
    needLatency("dispatchUs", p_.dispatchUs);
    needLatency("flagUs", p_.flagUs);
    needLatency("localFlagUs", p_.localFlagUs);
    needLatency("proxyUs", p_.proxyUs);
    needLatency("nvlink.alphaUs", p_.nvlink.alphaUs);
    needLatency("network.alphaUs", p_.network.alphaUs);
    needLatency("local.alphaUs", p_.local.alphaUs);

    singleNode_ = std::all_of(s_.nodeOf.begin(), s_.nodeOf.end(), [&](uint32_t n) { return n == s_.nodeOf[0]; });
    share_.assign(static_cast<std::size_t>(s_.nRanks) * kResources, 0);
    barriers_.resize(s_.nBarriers);
    bool copyLocal = false, copyNvl = false, reduceLocal = false, reduceNvl = false, net = false, gemm = false;
    uint64_t outCount = 0;
    for (uint32_t r = 0; r < s_.nRanks; ++r) {
      for (uint32_t l = 0; l < s_.lanes[r].size(); ++l) {
        const auto& steps = s_.lanes[r][l].steps;
        if (steps.size() > UINT32_MAX) throw Error(ErrorCode::InvalidSchedule, "a lane has more than 2^32 steps");
        LaneState ls;
        ls.rank = r;
        ls.lane = l;
        ls.firstOut = outCount;
        ls.steps = &steps;
        lanes_.push_back(ls);
        outCount += steps.size();
        bool uses[kResources] = {false, false, false, false};
        for (uint32_t i = 0; i < steps.size(); ++i) {
          const Step& st = steps[i];
          const Resource res = resourceOf(st, r, l, i);
          if (res != kNoResource) uses[res] = true;
          const bool signals = st.kind == StepKind::Signal || st.kind == StepKind::Wait ||
                               ((st.kind == StepKind::Put || st.kind == StepKind::ProxyPut) && (st.flags & kStepSignal));
          if (signals && (st.flag.rank >= s_.nRanks || st.flag.id >= s_.nFlags))
            badStep(r, l, i, "flag (rank " + std::to_string(st.flag.rank) + ", id " + std::to_string(st.flag.id) +
                                 ") is out of range (nRanks " + std::to_string(s_.nRanks) + ", nFlags " +
                                 std::to_string(s_.nFlags) + ")");
          if (st.kind == StepKind::Wait && st.flag.rank != r)
            badStep(r, l, i, "a wait must be on the executing rank's own flag (got rank " + std::to_string(st.flag.rank) + ")");
          if (st.kind == StepKind::Barrier) {
            if (st.aux >= s_.nBarriers)
              badStep(r, l, i, "barrier " + std::to_string(st.aux) + " is out of range (nBarriers " +
                                   std::to_string(s_.nBarriers) + ")");
            ++barriers_[st.aux].expected;
          }
          copyLocal = copyLocal || (st.kind == StepKind::Copy && res == kMem);
          copyNvl = copyNvl || (st.kind == StepKind::Copy && res == kNvl) || st.kind == StepKind::Put;
          reduceLocal = reduceLocal || (st.kind == StepKind::Reduce && res == kMem);
          reduceNvl = reduceNvl || (st.kind == StepKind::Reduce && res == kNvl);
          net = net || st.kind == StepKind::ProxyPut;
          gemm = gemm || st.kind == StepKind::Gemm;
        }
        for (int k = 0; k < kResources; ++k)
          if (uses[k]) ++share_[static_cast<std::size_t>(r) * kResources + static_cast<std::size_t>(k)];
      }
    }
    if (copyLocal) needRate("local.bwGBs", p_.local.bwGBs, "a local copy");
    if (copyNvl || reduceNvl) needRate("nvlink.bwGBs", p_.nvlink.bwGBs, "an NVLink transfer");
    if (reduceLocal || reduceNvl) needRate("reduceGBs", p_.reduceGBs, "a reduce");
    if (net) needRate("network.bwGBs", p_.network.bwGBs, "a proxy put");
    if (gemm) needRate("gemmTflops", p_.gemmTflops, "a gemm");
    out_.resize(outCount);
  }

  double share(uint32_t rank, Resource res) const noexcept {
    return static_cast<double>(share_[static_cast<std::size_t>(rank) * kResources + res]);
  }

  /// Duration of a step that does not synchronise (rule 3), and the visibility delay of its increment.
  double duration(const Step& st, uint32_t rank) const {
    const double bytes = static_cast<double>(st.bytes);
    switch (st.kind) {
      case StepKind::Copy:
        if (st.link == LinkClass::NVLink)
          return p_.nvlink.alphaUs + bytes * share(rank, kNvl) / (p_.nvlink.bwGBs * 1e3);
        return p_.local.alphaUs + bytes * share(rank, kMem) / (p_.local.bwGBs * 1e3);
      case StepKind::Reduce:
        if (st.link == LinkClass::NVLink)
          return p_.nvlink.alphaUs + bytes * share(rank, kNvl) / (std::min(p_.reduceGBs, p_.nvlink.bwGBs) * 1e3);
        return p_.local.alphaUs + bytes * share(rank, kMem) / (p_.reduceGBs * 1e3);
      case StepKind::Put:
        return putLaneUs(p_, writesPeerUserBuffer(s_, st, rank)) + bytes * share(rank, kNvl) / (p_.nvlink.bwGBs * 1e3);
      case StepKind::ProxyPut:
        if (st.count == 0) return p_.proxyUs + p_.network.alphaUs;
        return p_.proxyUs + p_.network.alphaUs + bytes * share(rank, kNet) / (p_.network.bwGBs * 1e3);
      case StepKind::Gemm: return st.flops * share(rank, kGpu) / (p_.gemmTflops * 1e6);
      default: return 0;  // Signal (Wait and Barrier are handled by the caller)
    }
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
            record(ls, start, start);
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
          const double end = b.lastArrival + (singleNode_ ? p_.flagUs : p_.proxyUs + p_.network.alphaUs);
          for (uint64_t other : b.arrived) {
            LaneState& o = lanes_[other];
            record(o, o.ready, end);
            push(end, other, 0, false);
          }
          b.arrived.clear();
          return;  // this lane continues from its event too
        }
        default: {
          const double end = start + duration(st, ls.rank);
          if (st.kind == StepKind::Signal) {
            const bool sameRank = st.flag.rank == ls.rank;
            const bool sameNode = s_.nodeOf[st.flag.rank] == s_.nodeOf[ls.rank];
            const double delay =
                sameRank ? p_.localFlagUs : sameNode ? p_.flagUs : p_.proxyUs + p_.network.alphaUs;
            push(end + delay, flagIndex(st.flag), st.value, true);
          } else if (st.kind == StepKind::Put && (st.flags & kStepSignal)) {
            // The lane moved on after the issue time; the data (and so the signal) lands alpha after the start.
            const bool user = writesPeerUserBuffer(s_, st, ls.rank);
            push(end + (putAlphaUs(p_, user) - putLaneUs(p_, user)), flagIndex(st.flag), st.value, true);
          } else if (st.kind == StepKind::ProxyPut && (st.flags & kStepSignal)) {
            push(end, flagIndex(st.flag), st.value, true);
          }
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
      record(ls, ls.ready, std::max(ls.ready, t));
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
  bool singleNode_ = true;
  std::vector<uint32_t> share_;  ///< [rank * kResources + resource]: lanes of the rank using it
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
  // same-rail peers under one leaf pair); bytes stream at the slower of the NIC and its PCIe link.
  const bool hasNic = t.node.nics > 0 && t.node.nic.bwGBs > 0;
  const double nicGBs = hasNic ? t.node.nic.bwGBs : kFallbackNicGBs;             // no NIC: a 400 Gb/s one assumed
  const double nicUs = hasNic ? t.node.nic.latencyUs : kFallbackNicLatencyUs;    // (only what-ifs reach it)
  p.network = LinkCost{nicUs + 2 * t.fabric.switchLatencyUs, std::min(nicGBs, t.node.pcie.bwGBs)};
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
  p.gemmTflops = kGemmEfficiency * t.node.bf16Tflops;
  return p;
}

double putIssueUs(const Profile& p) noexcept {
  return p.putIssueUs > 0 && p.putIssueUs < p.nvlink.alphaUs ? p.putIssueUs : p.nvlink.alphaUs;
}

double putAlphaUs(const Profile& p, bool intoUserBuffer) noexcept {
  return p.nvlink.alphaUs + (intoUserBuffer && p.userPutUs > 0 ? p.userPutUs : 0.0);
}

double putLaneUs(const Profile& p, bool intoUserBuffer) noexcept {
  return p.putIssueUs > 0 && p.putIssueUs < p.nvlink.alphaUs ? p.putIssueUs : putAlphaUs(p, intoUserBuffer);
}

bool writesPeerUserBuffer(const Schedule& s, const Step& st, uint32_t rank) noexcept {
  return st.dst.rank != rank && st.dst.buffer < s.buffers.size() && s.buffers[st.dst.buffer].kind != BufferKind::Scratch;
}

CostEstimate closedForm(const CollectiveSpec& spec, const GenOptions& opt, const Topology& topo, uint32_t nRanks,
                        const Profile& profile) {
  const detail::AlgorithmDef& d = detail::findAlgorithm(spec.op, spec.algo);
  if (!d.cost)
    throw Error(ErrorCode::Unsupported, std::string("algorithm '") + d.name + "' for " + toString(spec.op) +
                                            " has no closed-form cost model (use simulateUncontended on its schedule)");
  // "auto" is the cheaper inter-node variant under this profile (resolveInter), priced as that variant.
  const std::vector<uint32_t> nodeOf = topo.layout(nRanks);
  GenOptions resolved = opt;
  resolved.inter = resolveInter(spec, nodeOf, opt, profile);
  const detail::GenContext ctx = detail::makeContext(spec, nodeOf, resolved);
  // Profile::userPutUs: the closed forms have one NVLink alpha per generator, so a generator whose peers write
  // user buffers pays it on every NVLink message (the timeline charges it per Put by destination).
  Profile pf = profile;
  if (pf.userPutUs > 0 && d.peersTouchUser) pf.nvlink.alphaUs += pf.userPutUs;
  CostEstimate e = d.cost(detail::CostContext{spec, resolved, topo, ctx, pf});
  // The op-level term of the timeline (Profile::peerUserUs), from the generator's declared property (a test
  // checks it against peersTouchUserBuffers on the generated schedules).
  if (profile.peerUserUs > 0 && nRanks > 1 && d.peersTouchUser) {
    e.totalUs += profile.peerUserUs;
    e.latencyUs += profile.peerUserUs;
    e.formula += " + U";
  }
  return e;
}

Timeline simulateUncontended(const Schedule& s, const Profile& profile) { return UncontendedSim(s, profile).run(); }

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
