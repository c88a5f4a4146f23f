// Shared helpers of the sim tests: a small cluster and profile with round numbers (so expected times can be
// worked out by hand), and a hand schedule builder.
#pragma once

#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "mk/cost/cost.hpp"
#include "mk/error.hpp"
#include "mk/schedule/pack.hpp"
#include "mk/schedule/schedule.hpp"
#include "mk/sim/replay.hpp"
#include "mk/topology/topology.hpp"

namespace simtest {

/// `nodes` nodes of `gpus` GPUs: NVLink 100 GB/s (switched unless told), PCIe 100, NIC 50, `perLeaf` nodes per
/// leaf, 0.5 us per switch hop.
inline mk::Topology cluster(uint32_t nodes, uint32_t gpus, uint32_t perLeaf = 32, double oversub = 1.0,
                            bool switched = true, uint32_t nics = 0) {
  mk::Topology t;
  t.name = "test";
  t.nodes = nodes;
  t.node.gpu = "test GPU";
  t.node.gpus = gpus;
  t.node.sms = 100;
  t.node.bf16Tflops = 1000;
  t.node.hbmGBs = 3000;
  t.node.nvlink = mk::NvlinkSpec{100, 0.5, switched};
  t.node.pcie = mk::PcieSpec{100, 1};
  t.node.nics = nics ? nics : gpus;
  t.node.nic = mk::NicSpec{50, 2, "ib", {}, {}};
  t.fabric.nodesPerLeaf = perLeaf;
  t.fabric.oversubscription = oversub;
  t.fabric.switchLatencyUs = 0.5;
  return t;
}

/// Round numbers: NVLink alpha 1 us at 100 GB/s, network alpha 2 us at 50 GB/s, local copy 0.5 us at
/// 1000 GB/s, reduce 500 GB/s, flag 0.25 us, dispatch 3 us, proxy 1.5 us, GEMM 100 TFLOP/s.
inline mk::Profile profile() {
  mk::Profile p;
  p.source = "test profile";
  p.nvlink = mk::LinkCost{1, 100};
  p.network = mk::LinkCost{2, 50};
  p.local = mk::LinkCost{0.5, 1000};
  p.reduceGBs = 500;
  p.flagUs = 0.25;
  p.localFlagUs = 0.125;
  p.dispatchUs = 3;
  p.proxyUs = 1.5;
  p.gemmTflops = 100;
  p.attentionTflops = 100;
  return p;
}

/// Builds a schedule step by step; buffer 0 is "buf" (float32, `elems` per rank).
class Builder {
 public:
  Builder(std::vector<uint32_t> nodeOf, uint64_t elems = 1u << 22) {
    s_.nRanks = static_cast<uint32_t>(nodeOf.size());
    s_.nodeOf = std::move(nodeOf);
    s_.nFlags = 4;
    s_.nBarriers = 2;
    mk::BufferDecl b;
    b.name = "buf";
    b.dtype = mk::DType::Float32;
    b.kind = mk::BufferKind::Scratch;
    b.count.assign(s_.nRanks, elems);
    s_.buffers.push_back(b);
    s_.lanes.resize(s_.nRanks);
    s_.info.op = "custom";
    s_.info.algo = "hand";
  }

  mk::Step& add(uint32_t rank, uint32_t lane, mk::StepKind kind) {
    auto& lanes = s_.lanes[rank];
    if (lanes.size() <= lane) lanes.resize(lane + 1);
    lanes[lane].steps.push_back(mk::Step{});
    mk::Step& st = lanes[lane].steps.back();
    st.kind = kind;
    st.dst.rank = rank;
    st.a.rank = rank;
    st.b.rank = rank;
    return st;
  }
  static mk::BufRef ref(uint32_t rank, uint64_t offset = 0) {
    mk::BufRef r;
    r.rank = rank;
    r.offset = offset;
    return r;
  }
  void put(uint32_t rank, uint32_t lane, uint32_t to, uint64_t bytes, int signalFlag = -1, uint64_t value = 1) {
    mk::Step& st = add(rank, lane, mk::StepKind::Put);
    st.dst = ref(to);
    st.count = bytes / 4;
    if (signalFlag >= 0) signal(st, to, signalFlag, value);
  }
  void proxyPut(uint32_t rank, uint32_t lane, uint32_t to, uint64_t bytes, int signalFlag = -1) {
    mk::Step& st = add(rank, lane, mk::StepKind::ProxyPut);
    st.dst = ref(to);
    st.count = bytes / 4;
    if (signalFlag >= 0) signal(st, to, signalFlag, 1);
  }
  void copy(uint32_t rank, uint32_t lane, uint32_t from, uint32_t to, uint64_t bytes) {
    mk::Step& st = add(rank, lane, mk::StepKind::Copy);
    st.a = ref(from);
    st.dst = ref(to, 1u << 20);
    st.count = bytes / 4;
  }
  void reduce(uint32_t rank, uint32_t lane, uint32_t from, uint64_t bytes) {
    mk::Step& st = add(rank, lane, mk::StepKind::Reduce);
    st.a = ref(from);
    st.b = ref(rank, 1u << 20);
    st.dst = ref(rank, 2u << 20);
    st.count = bytes / 4;
  }
  void signalStep(uint32_t rank, uint32_t lane, uint32_t target, uint32_t flag, uint64_t value = 1) {
    mk::Step& st = add(rank, lane, mk::StepKind::Signal);
    signal(st, target, flag, value);
    st.flags = 0;
  }
  void wait(uint32_t rank, uint32_t lane, uint32_t flag, uint64_t threshold) {
    mk::Step& st = add(rank, lane, mk::StepKind::Wait);
    st.flag.rank = rank;
    st.flag.id = flag;
    st.value = threshold;
  }
  void barrier(uint32_t rank, uint32_t lane, uint32_t id) { add(rank, lane, mk::StepKind::Barrier).aux = id; }
  void gemm(uint32_t rank, uint32_t lane, uint32_t m, uint32_t n, uint32_t k) {
    mk::GemmShape g;
    g.m = m;
    g.n = n;
    g.k = k;
    g.lda = k;
    g.ldb = n;
    g.ldc = n;
    s_.gemms.push_back(g);
    mk::Step& st = add(rank, lane, mk::StepKind::Gemm);
    st.aux = static_cast<uint32_t>(s_.gemms.size() - 1);
  }
  /// Give every rank at least `lanes` lanes (empty ones are allowed).
  void lanes(uint32_t rank, uint32_t count) {
    if (s_.lanes[rank].size() < count) s_.lanes[rank].resize(count);
  }
  mk::Schedule done() {
    mk::fillCostAttributes(s_);
    return s_;
  }

 private:
  static void signal(mk::Step& st, uint32_t target, uint32_t flag, uint64_t value) {
    st.flags |= mk::kStepSignal;
    st.flag.rank = target;
    st.flag.id = flag;
    st.value = value;
  }
  mk::Schedule s_;
};

/// predict() with the defaults tests want (isolated, trace and link load on).
inline mk::sim::Prediction run(const mk::Schedule& s, const mk::Topology& t, const mk::Profile& p = profile()) {
  return mk::sim::predict(s, t, p);
}

/// The record of (rank, lane, step).
inline const mk::sim::StepRecord& at(const mk::sim::Prediction& p, uint32_t rank, uint32_t lane, uint32_t step) {
  for (const auto& r : p.steps)
    if (r.rank == rank && r.lane == lane && r.step == step) return r;
  FAIL("no record for rank " << rank << " lane " << lane << " step " << step);
  return p.steps.front();
}

/// Relative closeness for times that should agree up to floating point.
inline bool near(double a, double b, double rel = 1e-9) {
  return std::fabs(a - b) <= rel * std::max(1.0, std::fabs(b));
}

/// Run `fn` and return the mk::Error it throws (fails the test if it does not throw one).
template <class F>
mk::Error errorOf(F&& fn) {
  try {
    fn();
  } catch (const mk::Error& e) {
    return e;
  }
  FAIL("expected an mk::Error");
  return mk::Error(mk::ErrorCode::Internal, "unreachable");
}

}  // namespace simtest
