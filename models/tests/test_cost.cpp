// Tests of the cost layer: datasheet profile, nccl-tests conventions, and the uncontended timeline on
// hand-built schedules (no generator involved), checked against hand-computed times and against an
// independent fixed-point evaluation of the same rules on random schedules.
#include <doctest/doctest.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <functional>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "../src/algorithms/builder.hpp"
#include "expect_error.hpp"
#include "mk/cost/cost.hpp"
#include "mk/cost/step_cost.hpp"
#include "mk/error.hpp"
#include "mk/schedule/check.hpp"
#include "mk/schedule/pack.hpp"
#include "mk/schedule/validate.hpp"
#include "mk/topology/topology.hpp"

using namespace mk;
using mk::test::expectError;

namespace {

/// Round numbers so every expected time below can be computed by hand:
/// NVLink 100 GB/s = 1e5 B/us, network 10 GB/s = 1e4 B/us, local 200 GB/s, reduce 50 GB/s, gemm 10 TFLOP/s = 1e7
/// flop/us.
Profile roundProfile() {
  Profile p;
  p.source = "test";
  p.nvlink = LinkCost{1.0, 100};
  p.network = LinkCost{3.0, 10};
  p.local = LinkCost{0.5, 200};
  p.reduceGBs = 50;
  p.flagUs = 0.25;
  p.localFlagUs = 0.125;
  p.dispatchUs = 2.0;
  p.proxyUs = 2.0;
  p.gemmTflops = 10;
  return p;
}

constexpr uint64_t k100KB = 25000;  ///< float32 elements in 1e5 bytes: 1 us over the test NVLink

/// A hand-built schedule: one float32 buffer per rank, and one bf16 buffer for gemm operands.
struct Hand {
  Schedule s;
  Hand(std::vector<uint32_t> nodeOf, uint32_t nFlags, uint32_t nBarriers = 0) {
    s.nRanks = static_cast<uint32_t>(nodeOf.size());
    s.nodeOf = std::move(nodeOf);
    s.nFlags = nFlags;
    s.nBarriers = nBarriers;
    s.lanes.resize(s.nRanks);
    s.info.op = "custom";
    s.buffers.push_back(
        BufferDecl{"buf", DType::Float32, BufferKind::Scratch, std::vector<uint64_t>(s.nRanks, 1u << 24)});
    s.buffers.push_back(
        BufferDecl{"gemm", DType::BFloat16, BufferKind::Scratch, std::vector<uint64_t>(s.nRanks, 1u << 24)});
  }
  uint32_t lane(uint32_t rank, LaneRole role = LaneRole::Intra) {
    s.lanes.at(rank).push_back(Lane{role, 1, {}});
    return static_cast<uint32_t>(s.lanes[rank].size() - 1);
  }
  Step& add(uint32_t rank, uint32_t lane, StepKind kind) {
    auto& v = s.lanes.at(rank).at(lane).steps;
    v.emplace_back();
    v.back().kind = kind;
    return v.back();
  }
  static BufRef at(uint32_t rank, uint16_t buffer = 0) {
    BufRef r;
    r.rank = rank;
    r.buffer = buffer;
    return r;
  }
  void put(uint32_t rank, uint32_t lane, uint32_t dst, uint64_t count, std::optional<uint32_t> flag = {}) {
    transfer(StepKind::Put, rank, lane, dst, count, flag);
  }
  void proxyPut(uint32_t rank, uint32_t lane, uint32_t dst, uint64_t count, std::optional<uint32_t> flag = {}) {
    transfer(StepKind::ProxyPut, rank, lane, dst, count, flag);
  }
  void transfer(StepKind kind, uint32_t rank, uint32_t lane, uint32_t dst, uint64_t count,
                std::optional<uint32_t> flag) {
    Step& st = add(rank, lane, kind);
    st.dst = at(dst);
    st.a = at(rank);
    st.count = count;
    if (flag) {
      st.flags |= kStepSignal;
      st.flag = FlagRef{dst, *flag};
      st.value = 1;
    }
  }
  void signal(uint32_t rank, uint32_t lane, uint32_t target, uint32_t flag, uint64_t value = 1) {
    Step& st = add(rank, lane, StepKind::Signal);
    st.flag = FlagRef{target, flag};
    st.value = value;
  }
  void wait(uint32_t rank, uint32_t lane, uint32_t flag, uint64_t threshold) {
    Step& st = add(rank, lane, StepKind::Wait);
    st.flag = FlagRef{rank, flag};
    st.value = threshold;
  }
  /// dst on `rank`, source on `from` (a same-node peer makes it an NVLink copy).
  void copy(uint32_t rank, uint32_t lane, uint32_t from, uint64_t count) {
    Step& st = add(rank, lane, StepKind::Copy);
    st.dst = at(rank);
    st.a = at(from);
    st.count = count;
  }
  void reduce(uint32_t rank, uint32_t lane, uint32_t from, uint64_t count) {
    Step& st = add(rank, lane, StepKind::Reduce);
    st.dst = at(rank);
    st.a = at(rank);
    st.b = at(from);
    st.count = count;
  }
  void gemm(uint32_t rank, uint32_t lane, uint32_t m, uint32_t n, uint32_t k) {
    s.gemms.push_back(GemmShape{m, n, k, k, n, n});
    Step& st = add(rank, lane, StepKind::Gemm);
    st.dst = at(rank, 1);
    st.a = at(rank, 1);
    st.b = at(rank, 1);
    st.aux = static_cast<uint32_t>(s.gemms.size() - 1);
  }
  void barrier(uint32_t rank, uint32_t lane, uint32_t id) { add(rank, lane, StepKind::Barrier).aux = id; }

  Timeline run(const Profile& p = roundProfile()) {
    fillCostAttributes(s);
    return simulateUncontended(s, p);
  }
};

const StepTime& stepAt(const Timeline& tl, uint32_t rank, uint32_t lane, uint32_t step) {
  for (const auto& st : tl.steps)
    if (st.rank == rank && st.lane == lane && st.step == step) return st;
  FAIL("no step rank " << rank << " lane " << lane << " step " << step << " in the timeline");
  static StepTime none;
  return none;
}

void checkStep(const Timeline& tl, uint32_t rank, uint32_t lane, uint32_t step, double start, double end) {
  CAPTURE(rank);
  CAPTURE(lane);
  CAPTURE(step);
  const StepTime& st = stepAt(tl, rank, lane, step);
  CHECK(st.startUs == doctest::Approx(start).epsilon(1e-12));
  CHECK(st.endUs == doctest::Approx(end).epsilon(1e-12));
}

// ---- an independent evaluation of the timeline rules, for random schedules -------------------------------
//
// A deliberately naive design (no event queue): run every lane through the steps that do not synchronise,
// then among the blocked lanes resolve the one that can end earliest, repeat. That earliest candidate is
// exact: a Wait's candidate (threshold-th smallest *known* increment) can only be later than its true value,
// and an increment not yet known comes after some blocked lane ends, so it cannot precede the earliest end.
// Quadratic, but shares nothing with the implementation.
Timeline referenceTimeline(const Schedule& s, const Profile& p) {
  enum { kNvl, kNet, kMem, kGpu };
  auto resourceOf = [](const Step& st) -> int {
    switch (st.kind) {
      case StepKind::Put: return kNvl;
      case StepKind::ProxyPut: return kNet;
      case StepKind::Gemm: return kGpu;
      case StepKind::Copy:
      case StepKind::Reduce: return st.link == LinkClass::NVLink ? kNvl : kMem;
      default: return -1;
    }
  };
  std::vector<std::array<int, 4>> share(s.nRanks, std::array<int, 4>{0, 0, 0, 0});
  for (uint32_t r = 0; r < s.nRanks; ++r)
    for (const auto& lane : s.lanes[r]) {
      std::array<bool, 4> uses{false, false, false, false};
      for (const auto& st : lane.steps)
        if (resourceOf(st) >= 0) uses[static_cast<std::size_t>(resourceOf(st))] = true;
      for (std::size_t k = 0; k < 4; ++k) share[r][k] += uses[k] ? 1 : 0;
    }
  auto proxyBusy = [&](const Step& st, uint32_t r) {
    const double net = static_cast<double>(share[r][static_cast<std::size_t>(kNet)]);
    return p.proxyUs + (st.count == 0 ? 0.0 : static_cast<double>(st.bytes) / (p.network.bwGBs * 1e3 / net));
  };
  auto duration = [&](const Step& st, uint32_t r) {
    const double b = static_cast<double>(st.bytes);
    auto sh = [&](int k) { return static_cast<double>(share[r][static_cast<std::size_t>(k)]); };
    switch (st.kind) {
      case StepKind::Copy:
        return st.link == LinkClass::NVLink ? p.nvlink.alphaUs + b / (p.nvlink.bwGBs * 1e3 / sh(kNvl))
                                            : p.local.alphaUs + b / (p.local.bwGBs * 1e3 / sh(kMem));
      case StepKind::Reduce:
        return st.link == LinkClass::NVLink
                   ? p.nvlink.alphaUs + b / (std::min(p.reduceGBs, p.nvlink.bwGBs) * 1e3 / sh(kNvl))
                   : p.local.alphaUs + b / (p.reduceGBs * 1e3 / sh(kMem));
      case StepKind::Put: return p.nvlink.alphaUs + b / (p.nvlink.bwGBs * 1e3 / sh(kNvl));
      case StepKind::ProxyPut: {  // the issue and bytes on the lane; the latency in one of inFlight slots
        const double busy = proxyBusy(st, r);
        return std::max(busy, (busy + p.network.alphaUs) / p.transport.inFlight);
      }
      case StepKind::Gemm: return st.flops / (p.gemmTflops * 1e6 / sh(kGpu));
      default: return 0.0;
    }
  };
  const bool oneNode = std::all_of(s.nodeOf.begin(), s.nodeOf.end(), [&](uint32_t n) { return n == s.nodeOf[0]; });
  const double remoteFlag = p.proxyUs + p.network.alphaUs;
  struct Cursor {
    uint32_t rank, lane;
    std::size_t next = 0;
    double ready;
  };
  std::vector<Cursor> cursors;
  Timeline tl;
  std::vector<std::vector<std::size_t>> firstOut(s.nRanks);
  for (uint32_t r = 0; r < s.nRanks; ++r)
    for (std::size_t l = 0; l < s.lanes[r].size(); ++l) {
      cursors.push_back(Cursor{r, static_cast<uint32_t>(l), 0, p.dispatchUs});
      firstOut[r].push_back(tl.steps.size());
      for (std::size_t i = 0; i < s.lanes[r][l].steps.size(); ++i)
        tl.steps.push_back(StepTime{r, static_cast<uint32_t>(l), static_cast<uint32_t>(i), -1, -1});
    }
  std::vector<uint64_t> expected(s.nBarriers, 0);
  for (const auto& ranks : s.lanes)
    for (const auto& lane : ranks)
      for (const auto& st : lane.steps)
        if (st.kind == StepKind::Barrier) ++expected[st.aux];
  std::vector<std::vector<std::pair<double, uint64_t>>> inc(static_cast<std::size_t>(s.nRanks) * s.nFlags);
  auto finish = [&](Cursor& c, double start, double end) {
    StepTime& o = tl.steps[firstOut[c.rank][c.lane] + c.next];
    o.startUs = start;
    o.endUs = end;
    c.ready = end;
    ++c.next;
  };
  for (;;) {
    for (Cursor& c : cursors) {
      const auto& steps = s.lanes[c.rank][c.lane].steps;
      while (c.next < steps.size() && steps[c.next].kind != StepKind::Wait && steps[c.next].kind != StepKind::Barrier) {
        const Step& st = steps[c.next];
        const double end = c.ready + duration(st, c.rank);
        const std::size_t f = static_cast<std::size_t>(st.flag.rank) * s.nFlags + st.flag.id;
        if (st.kind == StepKind::Signal)
          inc[f].emplace_back(end + (st.flag.rank == c.rank                       ? p.localFlagUs
                                     : s.nodeOf[st.flag.rank] == s.nodeOf[c.rank] ? p.flagUs
                                                                                  : remoteFlag),
                              st.value);
        if (st.kind == StepKind::Put && (st.flags & kStepSignal)) inc[f].emplace_back(end, st.value);
        if (st.kind == StepKind::ProxyPut && (st.flags & kStepSignal))  // lands after its latency
          inc[f].emplace_back(c.ready + proxyBusy(st, c.rank) + p.network.alphaUs, st.value);
        finish(c, c.ready, end);
      }
    }
    // Candidates: waits from the increments known so far, barriers once every participant has arrived.
    std::vector<uint64_t> arrived(s.nBarriers, 0);
    std::vector<double> lastArrival(s.nBarriers, 0);
    for (const Cursor& c : cursors) {
      const auto& steps = s.lanes[c.rank][c.lane].steps;
      if (c.next < steps.size() && steps[c.next].kind == StepKind::Barrier) {
        ++arrived[steps[c.next].aux];
        lastArrival[steps[c.next].aux] = std::max(lastArrival[steps[c.next].aux], c.ready);
      }
    }
    double best = std::numeric_limits<double>::infinity();
    Cursor* bestCursor = nullptr;
    bool anyLeft = false;
    for (Cursor& c : cursors) {
      const auto& steps = s.lanes[c.rank][c.lane].steps;
      if (c.next >= steps.size()) continue;
      anyLeft = true;
      const Step& st = steps[c.next];
      double cand = std::numeric_limits<double>::infinity();
      if (st.kind == StepKind::Barrier) {
        if (arrived[st.aux] == expected[st.aux]) cand = lastArrival[st.aux] + (oneNode ? p.flagUs : remoteFlag);
      } else {
        auto known = inc[static_cast<std::size_t>(c.rank) * s.nFlags + st.flag.id];
        std::sort(known.begin(), known.end());
        uint64_t sum = 0;
        double v = 0;
        for (const auto& [time, value] : known) {
          if (sum >= st.value) break;
          sum += value;
          v = time;
        }
        if (sum >= st.value) cand = std::max(c.ready, v);
      }
      if (cand < best) {
        best = cand;
        bestCursor = &c;
      }
    }
    if (!anyLeft) break;
    if (!bestCursor) FAIL("reference evaluation: the schedule deadlocks");
    const Step& chosen = s.lanes[bestCursor->rank][bestCursor->lane].steps[bestCursor->next];
    if (chosen.kind != StepKind::Barrier) {
      finish(*bestCursor, bestCursor->ready, best);
      continue;
    }
    const uint32_t id = chosen.aux;
    for (Cursor& c : cursors) {
      const auto& steps = s.lanes[c.rank][c.lane].steps;
      if (c.next < steps.size() && steps[c.next].kind == StepKind::Barrier && steps[c.next].aux == id)
        finish(c, c.ready, best);
    }
  }
  tl.totalUs = p.dispatchUs;
  for (const auto& st : tl.steps) tl.totalUs = std::max(tl.totalUs, st.endUs);
  return tl;
}

/// A random schedule that cannot deadlock: steps are appended in one global order that is itself a valid
/// execution (every Wait is appended after the increments it needs, a barrier on all ranks at once), and
/// every flag is fully consumed at the end.
Schedule randomSchedule(std::mt19937& rng) {
  auto pick = [&](uint32_t lo, uint32_t hi) { return std::uniform_int_distribution<uint32_t>(lo, hi)(rng); };
  std::vector<uint32_t> nodeOf;
  const uint32_t nodes = pick(1, 3);
  for (uint32_t n = 0; n < nodes; ++n)
    for (uint32_t g = pick(1, 4); g > 0; --g) nodeOf.push_back(n);
  const uint32_t nFlags = pick(1, 3);
  const uint32_t nBarriers = pick(0, 2);
  Hand h(nodeOf, nFlags, nBarriers);
  const uint32_t nRanks = h.s.nRanks;
  for (uint32_t r = 0; r < nRanks; ++r)
    for (uint32_t l = pick(1, 3); l > 0; --l) h.lane(r);
  std::vector<uint64_t> sent(static_cast<std::size_t>(nRanks) * nFlags, 0);
  uint32_t barriersLeft = nBarriers;
  auto anyLane = [&](uint32_t r) { return pick(0, static_cast<uint32_t>(h.s.lanes[r].size() - 1)); };
  auto oddCount = [&] { return uint64_t{pick(0, 40000)} * 2 + 1; };
  auto peerOf = [&](uint32_t r, bool sameNode) -> std::optional<uint32_t> {
    std::vector<uint32_t> c;
    for (uint32_t q = 0; q < nRanks; ++q)
      if (q != r && (nodeOf[q] == nodeOf[r]) == sameNode) c.push_back(q);
    if (c.empty()) return std::nullopt;
    return c[pick(0, static_cast<uint32_t>(c.size() - 1))];
  };
  const uint32_t nOps = pick(10, 60);
  for (uint32_t op = 0; op < nOps; ++op) {
    const uint32_t r = pick(0, nRanks - 1);
    const uint32_t l = anyLane(r);
    const uint32_t f = pick(0, nFlags - 1);
    switch (pick(0, 9)) {
      case 0: h.copy(r, l, r, oddCount()); break;
      case 1:
        if (auto q = peerOf(r, true)) h.copy(r, l, *q, oddCount());
        break;
      case 2: h.reduce(r, l, peerOf(r, true).value_or(r), oddCount()); break;
      case 3: h.gemm(r, l, pick(1, 300), pick(1, 300), pick(1, 300)); break;
      case 4:
        if (auto q = peerOf(r, true)) {
          const bool sig = pick(0, 3) > 0;
          h.put(r, l, *q, oddCount(), sig ? std::optional<uint32_t>(f) : std::nullopt);
          if (sig) ++sent[*q * nFlags + f];
        }
        break;
      case 5:
        if (auto q = peerOf(r, false)) {
          h.proxyPut(r, l, *q, pick(0, 1) ? oddCount() : 0, f);
          ++sent[*q * nFlags + f];
        }
        break;
      case 6: {
        const uint32_t q = pick(0, nRanks - 1);
        const uint64_t v = pick(1, 3);
        h.signal(r, l, q, f, v);
        sent[q * nFlags + f] += v;
        break;
      }
      case 7:
      case 8:
        if (sent[r * nFlags + f] > 0) h.wait(r, l, f, pick(1, static_cast<uint32_t>(sent[r * nFlags + f])));
        break;
      case 9:
        if (barriersLeft > 0) {
          const uint32_t id = nBarriers - barriersLeft--;
          for (uint32_t q = 0; q < nRanks; ++q) h.barrier(q, anyLane(q), id);
        }
        break;
    }
  }
  for (uint32_t r = 0; r < nRanks; ++r)
    for (uint32_t f = 0; f < nFlags; ++f)
      if (sent[r * nFlags + f] > 0) h.wait(r, anyLane(r), f, sent[r * nFlags + f]);
  fillCostAttributes(h.s);
  return h.s;
}

}  // namespace

// ---- profile and conventions ---------------------------------------------------------------------------------

TEST_CASE("cost: default profile of h200x2 follows the datasheet") {
  const Profile p = defaultProfile(topologyPreset("h200x2"));
  CHECK(p.source == "uncalibrated (datasheet defaults for NVIDIA H200)");
  CHECK(p.nvlink.alphaUs == doctest::Approx(0.65));
  CHECK(p.nvlink.bwGBs == 450);
  CHECK(p.local.alphaUs == doctest::Approx(0.5));
  CHECK(p.local.bwGBs == 2400);
  CHECK(p.reduceGBs == 1600);
  CHECK(p.flagUs == doctest::Approx(0.65));
  CHECK(p.dispatchUs == 2.0);
  CHECK(p.proxyUs == 2.5);
  CHECK(p.gemmTflops == doctest::Approx(0.75 * 989));
  // No NIC on that machine: a 400 Gb/s one is assumed so what-ifs stay finite.
  CHECK(p.network.bwGBs == 50);
  CHECK(p.network.alphaUs == doctest::Approx(2.5 + 2 * 0.5));
}

TEST_CASE("cost: default profile of dgx-h100 uses the NIC and two leaf hops") {
  const Topology t = topologyPreset("dgx-h100", 4);
  const Profile p = defaultProfile(t);
  CHECK(p.source.find("NVIDIA H100") != std::string::npos);
  CHECK(p.network.alphaUs == doctest::Approx(t.node.nic.latencyUs + 2 * t.fabric.switchLatencyUs));
  CHECK(p.network.bwGBs == 50);
  CHECK(p.local.bwGBs == doctest::Approx(3350 / 2.0));
  CHECK(p.reduceGBs == doctest::Approx(3350 / 3.0));
  CHECK(p.dispatchUs > 0);
  CHECK(p.gemmTflops < t.node.bf16Tflops);
}

TEST_CASE("cost: default network bandwidth is capped by PCIe when PCIe is slower than the NIC") {
  Topology t = topologyPreset("dgx-h200", 2);
  t.node.pcie.bwGBs = 32;  // a Gen4 x16 host link behind a 400G NIC
  t.fabric.switchLatencyUs = 1.25;
  const Profile p = defaultProfile(t);
  CHECK(p.network.bwGBs == 32);
  CHECK(p.network.alphaUs == doctest::Approx(2.5 + 2.5));
}

TEST_CASE("cost: bus bandwidth factors follow nccl-tests") {
  CHECK(busBwFactor(CollOp::AllReduce, 8) == doctest::Approx(1.75));
  CHECK(busBwFactor(CollOp::AllReduce, 2) == doctest::Approx(1.0));
  CHECK(busBwFactor(CollOp::AllReduce, 1) == 0.0);
  CHECK(busBwFactor(CollOp::AllGather, 4) == doctest::Approx(0.75));
  CHECK(busBwFactor(CollOp::ReduceScatter, 5) == doctest::Approx(0.8));
  CHECK(busBwFactor(CollOp::AllToAll, 16) == doctest::Approx(15.0 / 16));
  CHECK(busBwFactor(CollOp::Broadcast, 7) == 1.0);
  CHECK(busBwFactor(CollOp::AllReduce, 0) == 0.0);
}

TEST_CASE("cost: op bytes are the larger of the input and output buffer of one rank") {
  CollectiveSpec s;
  s.op = CollOp::AllReduce;
  s.dtype = DType::Float32;
  s.count = 1001;
  CHECK(opBytes(s, 8) == 4004);
  s.op = CollOp::AllGather;
  s.dtype = DType::BFloat16;
  s.count = 10;
  CHECK(opBytes(s, 4) == 80);  // output: 10 x 4 ranks x 2 bytes
  s.op = CollOp::ReduceScatter;
  s.dtype = DType::Float32;
  CHECK(opBytes(s, 4) == 160);  // input: 10 x 4 ranks x 4 bytes
  s.op = CollOp::AllToAll;
  s.dtype = DType::Float16;
  s.count = 7;
  CHECK(opBytes(s, 3) == 42);
  s.op = CollOp::Broadcast;
  CHECK(opBytes(s, 3) == 14);
}

TEST_CASE("cost: closedForm of an algorithm without a generator for the op is NotFound") {
  CollectiveSpec s;
  s.op = CollOp::AllReduce;
  s.algo = Algorithm::Direct;
  s.count = 17;
  const Topology t = topologyPreset("h200x2");
  expectError([&] { closedForm(s, GenOptions{}, t, 2, defaultProfile(t)); }, ErrorCode::NotFound,
              {"unknown algorithm 'direct' for allreduce"});
}

TEST_CASE("cost: closedForm dispatches to the generator's own cost function") {
  const Topology topo = topologyPreset("dgx-h200", 2);
  const Profile prof = defaultProfile(topo);
  GenOptions opt;
  opt.chunks = 3;
  opt.channels = 2;
  int checked = 0;
  for (const auto& d : detail::algorithmRegistry()) {
    CAPTURE(d.name);
    CollectiveSpec spec;
    spec.op = d.op;
    spec.algo = *parseAlgorithm(d.name);
    spec.count = 12345;
    spec.root = 3;
    if (!d.cost) {
      expectError([&] { closedForm(spec, opt, topo, 16, prof); }, ErrorCode::Unsupported, {d.name});
      ++checked;
      continue;
    }
    const detail::GenContext gen = detail::makeContext(spec, topo.layout(16), opt);
    std::optional<CostEstimate> direct;
    std::optional<ErrorCode> directError;
    try {
      direct = d.cost(detail::CostContext{spec, opt, topo, gen, prof});
    } catch (const Error& e) {
      directError = e.code();
    }
    if (directError) {
      try {
        closedForm(spec, opt, topo, 16, prof);
        FAIL("closedForm did not throw where the cost function does");
      } catch (const Error& e) {
        CHECK(e.code() == *directError);
      }
    } else {
      const CostEstimate viaDispatch = closedForm(spec, opt, topo, 16, prof);
      CHECK(viaDispatch.totalUs == direct->totalUs);
      CHECK(viaDispatch.latencyUs == direct->latencyUs);
      CHECK(viaDispatch.formula == direct->formula);
    }
    ++checked;
  }
  CHECK(checked == static_cast<int>(detail::algorithmRegistry().size()));
}

TEST_CASE("cost: closedForm rejects more ranks than the topology has GPUs") {
  const Topology topo = topologyPreset("h200x2");
  for (const auto& d : detail::algorithmRegistry()) {
    if (!d.cost) continue;
    CollectiveSpec spec;
    spec.op = d.op;
    spec.algo = *parseAlgorithm(d.name);
    spec.count = 100;
    expectError([&] { closedForm(spec, GenOptions{}, topo, 3, defaultProfile(topo)); }, ErrorCode::InvalidArgument,
                {"3 ranks"});
    return;
  }
  MESSAGE("no generator has a closed form yet: nothing to check");
  CHECK(detail::algorithmRegistry().size() >= 0u);
}

// ---- the uncontended timeline on hand-built schedules ----------------------------------------------------------

TEST_CASE("timeline: an empty schedule ends at the dispatch time") {
  Hand h({0, 0}, 0);
  h.lane(0);
  const Timeline tl = h.run();
  CHECK(tl.totalUs == 2.0);
  CHECK(tl.steps.empty());
}

TEST_CASE("timeline: a single put costs alpha plus bytes over the nvlink bandwidth") {
  Hand h({0, 0}, 0);
  h.put(0, h.lane(0), 1, k100KB);  // 1 us alpha + 1e5 B / 1e5 B/us
  const Timeline tl = h.run();
  REQUIRE(tl.steps.size() == 1);
  checkStep(tl, 0, 0, 0, 2.0, 4.0);
  CHECK(tl.totalUs == doctest::Approx(4.0));
}

TEST_CASE("timeline: a put chain across three ranks waits for each signal") {
  Hand h({0, 0, 0}, 1);
  for (uint32_t r = 0; r < 3; ++r) h.lane(r);
  h.put(0, 0, 1, k100KB, 0u);      // [2, 4], flag visible at 4
  h.wait(1, 0, 0, 1);              // [2, 4]
  h.put(1, 0, 2, 2 * k100KB, 0u);  // [4, 7]: 1 + 2 us
  h.wait(2, 0, 0, 1);              // [2, 7]
  h.copy(2, 0, 2, k100KB);         // local: 0.5 + 1e5 / 2e5 = 1 us -> [7, 8]
  const Timeline tl = h.run();
  checkStep(tl, 0, 0, 0, 2, 4);
  checkStep(tl, 1, 0, 0, 2, 4);
  checkStep(tl, 1, 0, 1, 4, 7);
  checkStep(tl, 2, 0, 0, 2, 7);
  checkStep(tl, 2, 0, 1, 7, 8);
  CHECK(tl.totalUs == doctest::Approx(8.0));
}

TEST_CASE("timeline: two lanes of one rank sharing nvlink get half the bandwidth each") {
  Hand h({0, 0}, 0);
  const uint32_t a = h.lane(0), b = h.lane(0), c = h.lane(0), other = h.lane(1);
  h.put(0, a, 1, k100KB);  // share 2: 1 + 2 us
  h.put(0, b, 1, k100KB);
  h.copy(0, c, 0, k100KB);     // memory, not NVLink: full local bandwidth, 1 us
  h.put(1, other, 0, k100KB);  // another rank: its own NVLink, full bandwidth
  const Timeline tl = h.run();
  checkStep(tl, 0, a, 0, 2, 5);
  checkStep(tl, 0, b, 0, 2, 5);
  checkStep(tl, 0, c, 0, 2, 3);
  checkStep(tl, 1, other, 0, 2, 4);
}

TEST_CASE("timeline: a lane counts once in the share however many steps it has") {
  Hand h({0, 0}, 0);
  const uint32_t a = h.lane(0), b = h.lane(0);
  h.put(0, a, 1, k100KB);
  h.put(0, a, 1, k100KB);
  h.copy(0, b, 1, k100KB);  // an NVLink copy shares NVLink with the puts: share 2
  const Timeline tl = h.run();
  checkStep(tl, 0, a, 0, 2, 5);
  checkStep(tl, 0, a, 1, 5, 8);
  checkStep(tl, 0, b, 0, 2, 5);
}

TEST_CASE("timeline: a wait resolves at the threshold-th increment in visibility order") {
  // The slow signaller is on a lower rank, so it is met first in processing order.
  Hand h({0, 0, 0}, 1);
  for (uint32_t r = 0; r < 3; ++r) h.lane(r);
  const uint32_t second = h.lane(0), late = h.lane(0);
  h.put(1, 0, 0, 5 * k100KB, 0u);  // [2, 8]: 1 + 5 us, visible at 8
  h.signal(2, 0, 0, 0);            // [2, 2], visible at 2 + flagUs = 2.25
  h.wait(0, 0, 0, 1);              // first increment in time order: 2.25
  h.wait(0, second, 0, 2);         // second: 8
  h.copy(0, late, 0, 5 * k100KB);  // [2, 5]: 0.5 + 2.5 us
  h.wait(0, late, 0, 1);           // ready at 5, after the increment: ends at 5
  const Timeline tl = h.run();
  checkStep(tl, 1, 0, 0, 2, 8);
  checkStep(tl, 2, 0, 0, 2, 2);
  checkStep(tl, 0, 0, 0, 2, 2.25);
  checkStep(tl, 0, second, 0, 2, 8);
  checkStep(tl, 0, late, 1, 5, 5);
  CHECK(tl.totalUs == doctest::Approx(8));
}

TEST_CASE("timeline: signal values add up and a threshold may be met by one large increment") {
  Hand h({0, 0}, 1);
  h.lane(0);
  h.lane(1);
  const uint32_t b = h.lane(1);
  h.signal(1, 0, 0, 0, 3);      // visible at 2.25
  h.copy(1, b, 1, 4 * k100KB);  // [2, 4.5]
  h.signal(1, b, 0, 0, 1);      // visible at 4.75
  h.wait(0, 0, 0, 2);           // reached by the value-3 increment
  h.wait(0, 0, 0, 4);           // needs the second one
  const Timeline tl = h.run();
  checkStep(tl, 0, 0, 0, 2, 2.25);
  checkStep(tl, 0, 0, 1, 2.25, 4.75);
}

TEST_CASE("timeline: a cross-node proxy put keeps its lane for issue and bytes, lands after the latency") {
  Hand h({0, 1}, 1);
  h.lane(0);
  h.lane(1);
  h.proxyPut(0, 0, 1, k100KB, 0u);  // issue 2 + 1e5 / 1e4 = 12 us -> [2, 14], lands 3 us later at 17
  h.wait(1, 0, 0, 1);               // [2, 17]
  h.proxyPut(1, 0, 0, 0, 0u);       // signal only: issue 2 -> [17, 19], lands at 22
  h.wait(0, 0, 0, 1);               // [14, 22]
  h.signal(0, 0, 1, 0);             // [22, 22], visible at 22 + 2 + 3 = 27
  h.wait(1, 0, 0, 2);               // [19, 27]
  const Timeline tl = h.run();
  checkStep(tl, 0, 0, 0, 2, 14);
  checkStep(tl, 1, 0, 0, 2, 17);
  checkStep(tl, 1, 0, 1, 17, 19);
  checkStep(tl, 0, 0, 1, 14, 22);
  checkStep(tl, 0, 0, 2, 22, 22);
  checkStep(tl, 1, 0, 2, 19, 27);
  CHECK(tl.totalUs == doctest::Approx(27));
}

TEST_CASE("timeline: back-to-back proxy puts overlap their latency up to the in-flight slots") {
  // Two 100 KB puts on one lane: the second starts when the first's bytes are out, not when it has landed
  // (the old serial rule gave [2, 17] and [17, 32]).
  Hand h({0, 1}, 1);
  h.lane(0);
  h.lane(1);
  h.proxyPut(0, 0, 1, k100KB, 0u);
  h.proxyPut(0, 0, 1, k100KB, 0u);
  h.wait(1, 0, 0, 2);
  Timeline tl = h.run();
  checkStep(tl, 0, 0, 0, 2, 14);
  checkStep(tl, 0, 0, 1, 14, 26);
  checkStep(tl, 1, 0, 0, 2, 29);  // the second lands 3 us after its bytes
  // One slot in flight is the serial rule: each put keeps its lane until it has landed.
  Profile serial = roundProfile();
  serial.transport.inFlight = 1;
  tl = h.run(serial);
  checkStep(tl, 0, 0, 0, 2, 17);
  checkStep(tl, 0, 0, 1, 17, 32);
  checkStep(tl, 1, 0, 0, 2, 32);
  // Signal-only puts (issue 2 us, latency 3 us) and two slots: a slot frees 5 us after a start, so the lane
  // starts one every 2.5 us.
  Hand z({0, 1}, 1);
  z.lane(0);
  z.lane(1);
  for (int i = 0; i < 4; ++i) z.proxyPut(0, 0, 1, 0, 0u);
  z.wait(1, 0, 0, 4);
  Profile two = roundProfile();
  two.transport.inFlight = 2;
  tl = z.run(two);
  checkStep(tl, 0, 0, 3, 2 + 3 * 2.5, 2 + 4 * 2.5);
  checkStep(tl, 1, 0, 0, 2, 2 + 3 * 2.5 + 5);
}

TEST_CASE("timeline: proxy puts of one rank share the network") {
  Hand h({0, 0, 1}, 0);
  const uint32_t a = h.lane(0), b = h.lane(0);
  h.proxyPut(0, a, 2, k100KB);
  h.proxyPut(0, b, 2, k100KB);
  const Timeline tl = h.run();
  checkStep(tl, 0, a, 0, 2, 2 + 2 + 20);
  checkStep(tl, 0, b, 0, 2, 2 + 2 + 20);
}

TEST_CASE("timeline: a barrier on one node ends flagUs after the last arrival") {
  Hand h({0, 0}, 0, 1);
  h.lane(0);
  h.lane(1);
  h.copy(0, 0, 0, k100KB);  // [2, 3]
  h.barrier(0, 0, 0);       // [3, 3.25]
  h.barrier(1, 0, 0);       // [2, 3.25]
  h.put(1, 0, 0, k100KB);   // [3.25, 5.25]
  const Timeline tl = h.run();
  checkStep(tl, 0, 0, 1, 3, 3.25);
  checkStep(tl, 1, 0, 0, 2, 3.25);
  checkStep(tl, 1, 0, 1, 3.25, 5.25);
  CHECK(tl.totalUs == doctest::Approx(5.25));
}

TEST_CASE("timeline: a barrier across nodes costs proxy plus network alpha") {
  Hand h({0, 0, 1}, 0, 1);
  for (uint32_t r = 0; r < 3; ++r) h.lane(r);
  h.gemm(2, 0, 100, 100, 1000);  // 2e7 flop at 1e7 flop/us: [2, 4]
  for (uint32_t r = 0; r < 3; ++r) h.barrier(r, 0, 0);
  const Timeline tl = h.run();
  for (uint32_t r = 0; r < 2; ++r) checkStep(tl, r, 0, 0, 2, 4 + 5);
  checkStep(tl, 2, 0, 1, 4, 9);
}

TEST_CASE("timeline: gemm runs at gemmTflops divided among the gemm lanes of a rank") {
  Hand h({0}, 0);
  const uint32_t a = h.lane(0, LaneRole::Compute), b = h.lane(0, LaneRole::Compute);
  h.gemm(0, a, 100, 100, 1000);  // 2e7 flop: 2 us alone, 4 us at half the GPU
  h.gemm(0, a, 50, 100, 1000);   // 1e7 flop: 2 us at half
  h.gemm(0, b, 100, 100, 1000);
  const Timeline tl = h.run();
  checkStep(tl, 0, a, 0, 2, 6);
  checkStep(tl, 0, a, 1, 6, 8);
  checkStep(tl, 0, b, 0, 2, 6);
}

TEST_CASE("timeline: on a rank that runs Gemm steps each lane runs at its CTAs' rate (rule 2b)") {
  Profile p = roundProfile();
  p.sms = 100;
  p.ctaGBs = 2;  // 10 CTAs move 20 GB/s, below the 100 GB/s NVLink
  auto build = [](uint32_t computeCtas, uint32_t putCtas) {
    Hand h({0, 0, 1}, 0);
    const uint32_t c = h.lane(0, LaneRole::Compute), put = h.lane(0), net = h.lane(0, LaneRole::InterSend);
    h.s.lanes[0][c].ctas = computeCtas;
    h.s.lanes[0][put].ctas = putCtas;
    h.gemm(0, c, 1280, 1280, 10);  // 100 tiles of 128 x 128, 3.2768e7 flop
    h.gemm(0, c, 128, 256, 10);    // 2 tiles: only 2 CTAs have work
    h.put(0, put, 1, k100KB);
    h.proxyPut(0, net, 2, k100KB);   // the proxy moves it: not capped
    h.put(1, h.lane(1), 0, k100KB);  // rank 1 runs no Gemm: rule 2 alone
    return h;
  };
  // The 100 SMs shared by the lanes' weights: compute 30, put 10, network 1 of 41.
  const double computeSms = 100.0 * 30 / 41, putSms = 100.0 * 10 / 41;
  Hand h = build(30, 10);
  const Timeline tl = h.run(p);
  const double g0 = 3.2768e7 / (10e6 * computeSms / 100);  // at its share of the tensor pipe
  checkStep(tl, 0, 0, 0, 2, 2 + g0);
  checkStep(tl, 0, 0, 1, 2 + g0, 2 + g0 + 655360.0 / (10e6 * 2 / 100));  // 2 tiles: only 2 SMs have work
  checkStep(tl, 0, 1, 0, 2, 2 + 1 + 1e5 / (putSms * 2e3));               // its SMs x 2 GB/s
  checkStep(tl, 0, 2, 0, 2, 2 + 2 + 1e5 / 1e4);                          // issue + 10 GB/s, latency overlaps
  checkStep(tl, 1, 0, 0, 2, 2 + 1 + 1e5 / 1e5);                          // 100 GB/s
  // Only the proportions count: ten times the weights price the same.
  Hand scaled = build(300, 100);
  scaled.s.lanes[0][2].ctas = 10;
  checkStep(scaled.run(p), 0, 1, 0, 2, 2 + 1 + 1e5 / (putSms * 2e3));
  // One Gemm lane of weight 1 holds the whole GPU.
  Hand one({0}, 0);
  one.gemm(0, one.lane(0, LaneRole::Compute), 1280, 1280, 10);
  checkStep(one.run(p), 0, 0, 0, 2, 2 + 3.2768e7 / 10e6);
  // A profile that does not distinguish SMs keeps rule 2 on every rank.
  Profile plain = roundProfile();
  checkStep(build(30, 10).run(plain), 0, 1, 0, 2, 2 + 1 + 1e5 / 1e5);
}

TEST_CASE("timeline: reduce and copy durations per link class") {
  Hand h({0, 0}, 0);
  const uint32_t a = h.lane(0), b = h.lane(1), c = h.lane(1);
  h.reduce(0, a, 1, k100KB);  // NVLink reduce at min(50, 100) GB/s: 1 + 2 us
  h.reduce(0, a, 0, k100KB);  // local reduce at 50 GB/s: 0.5 + 2 us
  h.copy(1, b, 0, k100KB);    // NVLink copy: 1 + 1
  h.copy(1, c, 1, k100KB);    // local copy: 0.5 + 0.5
  const Timeline tl = h.run();
  checkStep(tl, 0, a, 0, 2, 5);
  checkStep(tl, 0, a, 1, 5, 7.5);
  checkStep(tl, 1, b, 0, 2, 4);
  checkStep(tl, 1, c, 0, 2, 3);
}

TEST_CASE("timeline: steps are listed in rank lane step order") {
  Hand h({0, 0, 0}, 1);
  h.lane(2);
  h.lane(0);
  h.lane(0);
  h.put(2, 0, 0, 3, 0u);
  h.wait(0, 1, 0, 1);
  h.copy(0, 1, 0, 5);
  h.copy(0, 0, 0, 7);
  const Timeline tl = h.run();
  REQUIRE(tl.steps.size() == 4);
  const std::vector<std::array<uint32_t, 3>> order = {{0, 0, 0}, {0, 1, 0}, {0, 1, 1}, {2, 0, 0}};
  for (std::size_t i = 0; i < order.size(); ++i) {
    CAPTURE(i);
    CHECK(tl.steps[i].rank == order[i][0]);
    CHECK(tl.steps[i].lane == order[i][1]);
    CHECK(tl.steps[i].step == order[i][2]);
    CHECK(tl.steps[i].endUs >= tl.steps[i].startUs);
  }
}

TEST_CASE("timeline: a wait that can never be met is a deadlock naming the step and the flag") {
  Hand h({0, 0}, 1);
  h.lane(0);
  h.lane(1);
  h.signal(1, 0, 0, 0);
  h.wait(0, 0, 0, 2);
  expectError([&] { h.run(); }, ErrorCode::Deadlock,
              {"rank 0 lane 0", "flag 0 of rank 0 >= 2", "only ever reaches 1", "1 of 2 lanes blocked"});
}

TEST_CASE("timeline: a cycle through a barrier is a deadlock naming the barrier") {
  Hand h({0, 0}, 1, 1);
  h.lane(0);
  h.lane(1);
  h.barrier(0, 0, 0);
  h.signal(0, 0, 1, 0);
  h.wait(1, 0, 0, 1);  // needs rank 0's signal, which comes after the barrier rank 1 never reaches
  h.barrier(1, 0, 0);
  expectError([&] { h.run(); }, ErrorCode::Deadlock, {"rank 0 lane 0", "barrier 0", "only 1 of its 2"});
}

TEST_CASE("timeline: a copy without a link class and a bad flag are rejected") {
  Hand h({0, 0}, 1);
  h.lane(0);
  h.copy(0, 0, 0, 8);
  h.s.lanes[0][0].steps[0].link = LinkClass::None;  // as if fillCostAttributes was never called
  expectError([&] { simulateUncontended(h.s, roundProfile()); }, ErrorCode::InvalidSchedule, {"fillCostAttributes"});

  Hand g({0, 0}, 1);
  g.lane(0);
  g.signal(0, 0, 1, 5);
  expectError([&] { g.run(); }, ErrorCode::InvalidSchedule, {"id 5", "nFlags 1"});
}

TEST_CASE("timeline: a profile without the bandwidth a step needs is rejected") {
  Hand h({0, 0}, 0);
  h.put(0, h.lane(0), 1, 8);
  Profile p = roundProfile();
  p.nvlink.bwGBs = 0;
  expectError([&] { h.run(p); }, ErrorCode::InvalidArgument, {"profile.nvlink.bwGBs"});
  p = roundProfile();
  p.dispatchUs = std::numeric_limits<double>::quiet_NaN();
  expectError([&] { h.run(p); }, ErrorCode::InvalidArgument, {"profile.dispatchUs"});
  p = roundProfile();
  p.gemmTflops = 0;  // no gemm in this schedule: not needed
  CHECK(h.run(p).totalUs == doctest::Approx(2 + 1 + 32e-5));
}

TEST_CASE("timeline: random schedules match an independent naive evaluation") {
  const uint32_t seed = 20251129;
  std::mt19937 rng(seed);
  Profile p = roundProfile();
  p.flagUs = 0.3;  // not a power of two: ties are rarer, arithmetic is not exact
  p.localFlagUs = 0.17;
  for (int iter = 0; iter < 60; ++iter) {
    CAPTURE(seed);
    CAPTURE(iter);
    const Schedule s = randomSchedule(rng);
    const Timeline got = simulateUncontended(s, p);
    const Timeline want = referenceTimeline(s, p);
    REQUIRE(got.steps.size() == want.steps.size());
    CHECK(got.totalUs == doctest::Approx(want.totalUs).epsilon(1e-9));
    for (std::size_t i = 0; i < got.steps.size(); ++i) {
      CAPTURE(i);
      REQUIRE(got.steps[i].rank == want.steps[i].rank);
      REQUIRE(got.steps[i].lane == want.steps[i].lane);
      REQUIRE(got.steps[i].step == want.steps[i].step);
      CHECK(got.steps[i].startUs == doctest::Approx(want.steps[i].startUs).epsilon(1e-9));
      CHECK(got.steps[i].endUs == doctest::Approx(want.steps[i].endUs).epsilon(1e-9));
    }
  }
}

// Its wall time is printed, not asserted: a time limit belongs to a benchmark (it fails under sanitizers and on a
// loaded machine without saying anything about the timeline's results).
TEST_CASE("timeline: a million steps over 3072 lanes give the ring's exact times") {
  // A ring: every rank puts to the next and waits for the previous one's put, 163 rounds.
  const uint32_t nRanks = 3072, rounds = 163;
  Hand h(std::vector<uint32_t>(nRanks, 0), 1);
  for (uint32_t r = 0; r < nRanks; ++r) {
    h.lane(r);
    h.s.lanes[r][0].steps.reserve(2 * rounds);
    for (uint32_t k = 0; k < rounds; ++k) {
      h.put(r, 0, (r + 1) % nRanks, 2 * k100KB, 0u);  // 1 + 2 us
      h.wait(r, 0, 0, k + 1);
    }
  }
  fillCostAttributes(h.s);
  REQUIRE(h.s.stepCount() > 1000000);
  const auto t0 = std::chrono::steady_clock::now();
  const Timeline tl = simulateUncontended(h.s, roundProfile());
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  MESSAGE("1e6-step timeline took " << seconds << " s");
  CHECK(tl.totalUs == doctest::Approx(2 + 3.0 * rounds));
  checkStep(tl, 1234, 0, 2 * 100, 2 + 3.0 * 100, 2 + 3.0 * 101);      // round 100's put
  checkStep(tl, 1234, 0, 2 * 100 + 1, 2 + 3.0 * 101, 2 + 3.0 * 101);  // its wait: the neighbour's put just landed
}

TEST_CASE("cost: every generator declares whether peers touch user buffers as its schedules do") {
  // The closed forms add Profile::peerUserUs by the generator's declared property; the timeline and the
  // simulator compute it from the schedule. They must agree on one node and across nodes.
  for (const auto& d : detail::algorithmRegistry()) {
    const std::string name = std::string(toString(d.op)) + " " + d.name;
    CAPTURE(name);
    for (const auto& [preset, ranks] :
         {std::pair<std::string, uint32_t>{"h200x2", 2u}, {"dgx-h200", 4u}, {"dgx-h200", 16u}}) {
      CAPTURE(preset);
      CAPTURE(ranks);
      const Topology topo = topologyPreset(preset, ranks > 8 ? 2 : 1);
      CollectiveSpec spec;
      spec.op = d.op;
      spec.algo = *parseAlgorithm(d.name);
      spec.count = 4099;
      for (uint32_t chunks : {1u, 4u}) {
        GenOptions opt;
        opt.chunks = chunks;
        Schedule s;
        try {
          s = generate(spec, topo.layout(ranks), opt);
        } catch (const Error&) {
          continue;  // a generator that does not take this layout (its own tests cover the refusal)
        }
        CHECK(peersTouchUserBuffers(s) == d.peersTouchUser);
      }
    }
  }
}

TEST_CASE("cost: the peer-user-buffer term is charged once per op, by the timeline and the closed form alike") {
  const Topology topo = topologyPreset("h200x2");
  Profile p = defaultProfile(topo);
  Profile q = p;
  q.peerUserUs = 1.5;
  for (const char* algo : {"one-shot", "two-shot", "ring"}) {
    CAPTURE(algo);
    CollectiveSpec spec;
    spec.op = CollOp::AllReduce;
    spec.algo = *parseAlgorithm(algo);
    spec.count = 1 << 20;
    const Schedule s = generate(spec, topo.layout(2));
    const double extra = peersTouchUserBuffers(s) ? 1.5 : 0.0;
    CHECK(simulateUncontended(s, q).totalUs == doctest::Approx(simulateUncontended(s, p).totalUs + extra));
    CHECK(closedForm(spec, {}, topo, 2, q).totalUs ==
          doctest::Approx(closedForm(spec, {}, topo, 2, p).totalUs + extra));
  }
  // One-shot writes only the peers' scratch; two-shot's all-gather phase writes their outputs.
  CollectiveSpec one;
  one.op = CollOp::AllReduce;
  one.algo = Algorithm::OneShot;
  one.count = 1000;
  CHECK_FALSE(peersTouchUserBuffers(generate(one, topo.layout(2))));
  one.algo = Algorithm::TwoShot;
  CHECK(peersTouchUserBuffers(generate(one, topo.layout(2))));
}

TEST_CASE("timeline: a put issue gap lets the lane move on while the put's signal still waits for alpha") {
  Hand h({0, 0}, 1);
  h.lane(0);
  h.lane(1);
  for (int i = 0; i < 3; ++i) h.put(0, 0, 1, k100KB, 0u);
  h.wait(1, 0, 0, 3);
  Profile p = roundProfile();                       // alpha 1 us, 1e5 bytes take 1 us
  CHECK(h.run(p).totalUs == doctest::Approx(8.0));  // 2 + 3 x (1 + 1)
  p.putIssueUs = 0.4;
  const Timeline tl = h.run(p);
  checkStep(tl, 0, 0, 0, 2.0, 3.4);
  checkStep(tl, 0, 0, 2, 4.8, 6.2);
  checkStep(tl, 1, 0, 0, 2.0, 6.8);  // the last signal lands 0.6 us after its put's lane time
  CHECK(tl.totalUs == doctest::Approx(6.8));
  p.putIssueUs = 5.0;  // not below alpha: not distinguished
  CHECK(h.run(p).totalUs == doctest::Approx(8.0));
  CHECK(putIssueUs(p) == 1.0);
}

TEST_CASE("step costs: shares, prices, delays and the engine's own check come from one object") {
  // Rank 0 (node 0): two lanes putting to rank 1 (NVLink share 2), one proxy put to rank 2 on node 1.
  Hand h({0, 0, 1}, 1, 1);
  h.lane(0);
  h.lane(0);
  h.lane(0, LaneRole::InterSend);
  h.put(0, 0, 1, k100KB, 0u);
  h.put(0, 1, 1, k100KB);
  h.proxyPut(0, 2, 2, k100KB);
  h.lane(1);
  h.wait(1, 0, 0, 1);
  h.signal(1, 0, 1, 0);  // to its own rank
  h.lane(2);
  h.barrier(2, 0, 0);
  fillCostAttributes(h.s);
  const Profile p = roundProfile();
  std::vector<std::string> seen;
  const StepCosts costs(h.s, p, [&](uint32_t r, uint32_t l, uint32_t i, StepResource res) {
    seen.push_back(std::to_string(r) + "." + std::to_string(l) + "." + std::to_string(i) + ":" +
                   std::to_string(static_cast<int>(res)));
  });
  CHECK(seen == std::vector<std::string>{"0.0.0:0", "0.1.0:0", "0.2.0:1", "1.0.0:255", "1.0.1:255", "2.0.0:255"});
  CHECK(costs.lanes().size() == 5);
  CHECK(costs.lanes()[3].rank == 1);
  CHECK(costs.lanes()[3].firstStep == 3);
  CHECK(costs.steps() == 6);
  CHECK(costs.share(0, StepResource::NvLink) == 2);
  CHECK(costs.share(0, StepResource::Network) == 1);
  CHECK(costs.share(1, StepResource::NvLink) == 0);
  CHECK(costs.barrierParticipants(0) == 1);
  CHECK_FALSE(costs.singleNode());
  const Step& put = h.s.lanes[0][0].steps[0];
  const StepPrice pr = costs.price(put, 0, 0);
  CHECK(pr.resource == StepResource::NvLink);
  CHECK(pr.alphaUs == 1.0);
  CHECK(pr.rate == 100);
  CHECK(pr.unitsPerSecond() == 1e9);
  CHECK(costs.laneUs(put, 0, 0) == doctest::Approx(3.0));  // 1 + 1e5 B at 100 GB/s / 2 lanes
  // proxy 2 + 1e5 B at 10 GB/s on the lane; the network's alpha 3 overlaps and delays only the landing.
  CHECK(costs.laneUs(h.s.lanes[0][2].steps[0], 0, 2) == doctest::Approx(12.0));
  CHECK(costs.incrementDelayUs(h.s.lanes[0][2].steps[0], 0) == doctest::Approx(3.0));
  CHECK(costs.incrementDelayUs(h.s.lanes[1][0].steps[1], 1) == p.localFlagUs);
  CHECK(costs.signalDelayUs(0, 1) == p.flagUs);
  CHECK(costs.signalDelayUs(0, 2) == p.proxyUs + p.network.alphaUs);
  CHECK(costs.barrierReleaseUs() == p.proxyUs + p.network.alphaUs);
  CHECK(costs.opTotalUs(1.0) == p.dispatchUs);
  // A rate the schedule needs must be set; one it does not need may be 0.
  Profile noNet = p;
  noNet.network.bwGBs = 0;
  expectError([&] { StepCosts(h.s, noNet); }, ErrorCode::InvalidArgument, {"profile.network.bwGBs", "a proxy put"});
  Profile noGemm = p;
  noGemm.gemmTflops = 0;
  CHECK(StepCosts(h.s, noGemm).steps() == 6);
}

TEST_CASE("check: the timeline names a bad flag, wait or barrier in the validator's words") {
  auto expectSameWords = [](Hand& h) {
    fillCostAttributes(h.s);
    const std::vector<ValidationIssue> issues = validateAll(h.s);
    REQUIRE_FALSE(issues.empty());
    expectError([&] { simulateUncontended(h.s, roundProfile()); }, ErrorCode::InvalidSchedule, {issues[0].message});
  };
  Hand signal({0, 0}, 1);
  signal.lane(0);
  signal.signal(0, 0, 1, 5);  // flag id out of range
  expectSameWords(signal);
  Hand foreign({0, 0}, 1);
  foreign.lane(0);
  foreign.wait(0, 0, 0, 1);
  foreign.s.lanes[0][0].steps[0].flag.rank = 1;  // a wait on another rank's flag
  expectSameWords(foreign);
  Hand barrier({0, 0}, 1, 1);
  barrier.lane(0);
  barrier.barrier(0, 0, 3);
  expectSameWords(barrier);
  Hand tables({0, 0}, 1);
  tables.s.nodeOf.pop_back();
  expectError([&] { simulateUncontended(tables.s, roundProfile()); }, ErrorCode::InvalidSchedule,
              {"schedule: ", nodeOfProblem(tables.s)});
}

/// Rank 0 puts 1e5 bytes `puts` times to rank 1 (the first with a signal), into its scratch or its output buffer;
/// rank 1 waits for the signal.
Hand putsToRank1(bool intoOutput, int puts) {
  Hand h({0, 0}, 1);
  h.s.buffers.push_back(BufferDecl{"out", DType::Float32, BufferKind::Output, std::vector<uint64_t>(2, 1u << 24)});
  h.lane(0);
  h.lane(1);
  h.put(0, 0, 1, k100KB, 0u);
  for (int i = 1; i < puts; ++i) h.put(0, 0, 1, k100KB);
  if (intoOutput)
    for (Step& st : h.s.lanes[0][0].steps) st.dst.buffer = 2;
  h.wait(1, 0, 0, 1);
  return h;
}

TEST_CASE("timeline: a put into a peer's user buffer pays userPutUs on its visibility, into scratch it does not") {
  // One put with a signal, into rank 1's scratch or into its output; rank 1 waits for it.
  auto build = [](bool intoOutput) { return putsToRank1(intoOutput, 1); };
  Profile p = roundProfile();  // alpha 1 us, 1e5 bytes take 1 us
  p.userPutUs = 0.5;
  const Timeline scratch = build(false).run(p), output = build(true).run(p);
  CHECK(scratch.totalUs == doctest::Approx(4.0));  // dispatch 2 + alpha 1 + bytes 1
  CHECK(output.totalUs == doctest::Approx(4.5));   // + userPutUs on the put's latency
  CHECK(putAlphaUs(p, false) == doctest::Approx(1.0));
  CHECK(putAlphaUs(p, true) == doctest::Approx(1.5));
  // With a distinguished issue time the lane moves on after it either way; only the signal waits longer.
  p.putIssueUs = 0.4;
  CHECK(putLaneUs(p, true) == doctest::Approx(0.4));
  const Timeline issued = build(true).run(p);
  checkStep(issued, 0, 0, 0, 2.0, 3.4);
  CHECK(issued.totalUs == doctest::Approx(4.5));
  // 0 = not distinguished: both destinations cost alpha.
  p.userPutUs = 0;
  CHECK(build(true).run(p).totalUs == doctest::Approx(build(false).run(p).totalUs));
}

TEST_CASE("timeline: a put into scratch skips the entry check: its lane time is putIssueUs - userPutUs") {
  // Two puts into rank 1's scratch or into its output; putIssueUs is the user-buffer Put's (calib-put-stream).
  auto build = [](bool intoOutput) { return putsToRank1(intoOutput, 2); };
  Profile p = roundProfile();  // alpha 1 us (scratch), 1e5 bytes take 1 us
  p.userPutUs = 0.5;
  p.putIssueUs = 0.8;
  CHECK(putLaneUs(p, true) == doctest::Approx(0.8));
  CHECK(putLaneUs(p, false) == doctest::Approx(0.3));
  const Timeline scratch = build(false).run(p), output = build(true).run(p);
  checkStep(scratch, 0, 0, 0, 2.0, 3.3);  // issue 0.3 + bytes 1
  checkStep(scratch, 0, 0, 1, 3.3, 4.6);
  checkStep(scratch, 1, 0, 0, 2.0, 4.0);  // the first put's signal: 2 + alpha 1 + bytes 1
  checkStep(output, 0, 0, 0, 2.0, 3.8);   // issue 0.8 + bytes 1
  checkStep(output, 0, 0, 1, 3.8, 5.6);
  checkStep(output, 1, 0, 0, 2.0, 4.5);  // 2 + alpha 1.5 + bytes 1
  // An issue not below the Put's own alpha is not distinguished, for each destination on its own.
  p.putIssueUs = 1.2;
  CHECK(putLaneUs(p, true) == doctest::Approx(1.2));   // below 1.5
  CHECK(putLaneUs(p, false) == doctest::Approx(0.7));  // 1.2 - 0.5, below 1
  p.putIssueUs = 1.6;
  CHECK(putLaneUs(p, true) == doctest::Approx(1.5));
  CHECK(putLaneUs(p, false) == doctest::Approx(1.0));
}

TEST_CASE("timeline: a met Wait keeps its lane waitUs, an unmet one ends when its flag is visible") {
  // Rank 0 puts with a signal; rank 1 waits for it on two lanes: lane 0 at once (unmet), lane 1 after a long copy
  // (met by then); each lane then copies again.
  Hand h({0, 0}, 1);
  h.lane(0);
  h.lane(1);
  h.lane(1);
  h.put(0, 0, 1, k100KB, 0u);
  h.wait(1, 0, 0, 1);
  h.copy(1, 0, 1, k100KB);
  h.copy(1, 1, 1, 4 * k100KB);
  h.wait(1, 1, 0, 1);
  h.copy(1, 1, 1, k100KB);
  // The put is visible at 2 + 1 + 1 = 4; rank 1's two copying lanes share its memory: 1e5 bytes take 0.5 + 1 us.
  Profile p = roundProfile();
  const Timeline before = h.run(p);
  checkStep(before, 1, 0, 0, 2.0, 4.0);
  checkStep(before, 1, 1, 1, 6.5, 6.5);  // met: nothing
  p.waitUs = 0.75;
  CHECK(waitEndUs(p, 6.5, 4.0) == doctest::Approx(7.25));
  CHECK(waitEndUs(p, 2.0, 4.0) == doctest::Approx(4.0));
  const Timeline tl = h.run(p);
  checkStep(tl, 1, 0, 0, 2.0, 4.0);  // unmet: visibility (its 2 us exceed waitUs)
  checkStep(tl, 1, 0, 1, 4.0, 5.5);
  checkStep(tl, 1, 1, 1, 6.5, 7.25);  // met: waitUs
  checkStep(tl, 1, 1, 2, 7.25, 8.75);
  CHECK(tl.totalUs == doctest::Approx(8.75));
  CHECK(tl.totalUs == doctest::Approx(before.totalUs + 0.75));
}

// ---- ramps: a link's rate by transfer size -------------------------------------------------------------------

TEST_CASE("cost: a ramp interpolates its fraction in log size and holds it beyond its ends") {
  const LinkCost c{1.0, 100, {{1024, 0.25}, {4096, 0.5}, {65536, 1.0}}};
  CHECK(rampFraction(c.ramp, 8) == doctest::Approx(0.25));  // below the first point: the first fraction
  CHECK(rampFraction(c.ramp, 1024) == doctest::Approx(0.25));
  CHECK(rampFraction(c.ramp, 2048) == doctest::Approx(0.375));  // half way in log2 between 1 KiB and 4 KiB
  CHECK(rampFraction(c.ramp, 16384) == doctest::Approx(0.75));  // half way between 4 KiB and 64 KiB
  CHECK(rampFraction(c.ramp, 1e12) == doctest::Approx(1.0));
  CHECK(linkRate(c, 2048) == doctest::Approx(37.5));
  CHECK(linkRate(LinkCost{1.0, 100}, 2048) == 100);  // no ramp: the line
}

TEST_CASE("cost: the step price of a put follows the link's ramp, and the closed form agrees") {
  Profile p = defaultProfile(topologyPreset("h200x2"));
  p.nvlink.ramp = {{64 * 1024, 0.2}, {16 << 20, 1.0}};
  const StepPrice small = stepPrice(p, StepKind::Put, LinkClass::NVLink, 64 * 1024, false);
  CHECK(small.rate == doctest::Approx(0.2 * p.nvlink.bwGBs));
  const StepPrice large = stepPrice(p, StepKind::Put, LinkClass::NVLink, 64 << 20, false);
  CHECK(large.rate == doctest::Approx(p.nvlink.bwGBs));
  // The uncontended timeline and the closed form of a two-rank all-gather price the same put.
  const Topology t = topologyPreset("h200x2");
  for (const uint64_t bytes : {uint64_t{4096}, uint64_t{1} << 20, uint64_t{64} << 20}) {
    CollectiveSpec spec{CollOp::AllGather, Algorithm::Direct, DType::Float32, RedOp::Sum, bytes / 8, 0};
    const Schedule s = generate(spec, t.layout(2), GenOptions{});
    const double timeline = simulateUncontended(s, p).totalUs;
    const double closed = closedForm(spec, GenOptions{}, t, 2, p).totalUs;
    CHECK(closed == doctest::Approx(timeline).epsilon(1e-6));
  }
}

TEST_CASE("cost: a ramp that breaks its rules is refused naming the point") {
  auto message = [](const std::vector<RampPoint>& r, bool capped) -> std::string {
    try {
      validateRamp(r, "nvlink.ramp", capped);
    } catch (const Error& e) {
      CHECK(e.code() == ErrorCode::InvalidArgument);
      return e.message();
    }
    return "no error";
  };
  CHECK(message({{1024, 0.5}, {2048, 0.7}}, true) == "no error");
  CHECK(message({{1024, 0.5}, {1024, 0.7}}, true).find("nvlink.ramp[1].bytes must be larger") != std::string::npos);
  CHECK(message({{1024, 0.5}, {2048, 0.4}}, true).find("nvlink.ramp[1].fraction must not fall") != std::string::npos);
  CHECK(message({{1024, 0.5}, {2048, 0.4}}, false) == "no error");  // a memory pipe's L2 bump
  CHECK(message({{1024, 1.5}}, true).find("nvlink.ramp[0].fraction must be in (0, 1]") != std::string::npos);
  CHECK(message({{1024, 1.5}}, false) == "no error");
  CHECK(message({{0, 0.5}}, true).find("nvlink.ramp[0].bytes must be finite and > 0") != std::string::npos);
  CHECK(message({{1024, 0}}, false).find("nvlink.ramp[0].fraction must be finite and > 0") != std::string::npos);
  CHECK(message({{1024, std::nan("")}}, false).find("fraction") != std::string::npos);
}
