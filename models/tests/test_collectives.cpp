// Tests of the allgather, reducescatter, broadcast and alltoall generators: schedule structure, the validator
// (race check on), the CPU reference executor against the plain reference collective, and the closed forms
// against the uncontended timeline. Algorithms and formulas: docs/algorithms-collectives.md.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "../src/algorithms/builder.hpp"
#include "../src/algorithms/common.hpp"
#include "expect_error.hpp"
#include "layout.hpp"
#include "mk/algorithms/algorithms.hpp"
#include "mk/cost/cost.hpp"
#include "mk/error.hpp"
#include "mk/exec/verify.hpp"
#include "mk/schedule/validate.hpp"
#include "mk/topology/topology.hpp"

using namespace mk;
using mk::test::expectError;
using mk::test::nodesOf;

namespace {

/// Nodes holding the given numbers of ranks, node-major.
std::vector<uint32_t> nodesSized(std::initializer_list<uint32_t> sizes) {
  std::vector<uint32_t> nodeOf;
  uint32_t node = 0;
  for (uint32_t s : sizes) {
    nodeOf.insert(nodeOf.end(), s, node);
    ++node;
  }
  return nodeOf;
}

std::string describe(const std::vector<uint32_t>& nodeOf) {
  std::string out = "{";
  for (std::size_t i = 0; i < nodeOf.size(); ++i) out += (i ? " " : "") + std::to_string(nodeOf[i]);
  return out + "}";
}

CollectiveSpec makeSpec(CollOp op, const char* algo, uint64_t count, DType dtype = DType::Float32,
                        RedOp redop = RedOp::Sum, uint32_t root = 0) {
  CollectiveSpec s;
  s.op = op;
  s.algo = requireAlgorithm(op, algo);
  s.count = count;
  s.dtype = dtype;
  s.redop = redop;
  s.root = root;
  return s;
}

GenOptions makeOpt(uint32_t chunks, uint32_t channels) {
  GenOptions o;
  o.chunks = chunks;
  o.channels = channels;
  return o;
}

struct Algo {
  CollOp op;
  const char* name;
};
const Algo kAlgos[] = {
    {CollOp::AllGather, "ring"},     {CollOp::AllGather, "direct"},     {CollOp::AllGather, "hierarchical"},
    {CollOp::ReduceScatter, "ring"}, {CollOp::ReduceScatter, "direct"}, {CollOp::ReduceScatter, "hierarchical"},
    {CollOp::Broadcast, "direct"},   {CollOp::Broadcast, "ring"},       {CollOp::AllToAll, "direct"},
};

/// Generate, validate (races included), execute and compare with the reference; one failure message names
/// everything needed to reproduce it.
void runCase(const CollectiveSpec& spec, const std::vector<uint32_t>& nodeOf, const GenOptions& opt, uint64_t seed,
             InputKind kind = InputKind::Uniform) {
  const std::string what = std::string(toString(spec.op)) + " " + toString(spec.algo) + " nodes " + describe(nodeOf) +
                           " count " + std::to_string(spec.count) + " " + toString(spec.dtype) + " " +
                           toString(spec.redop) + " root " + std::to_string(spec.root) + " chunks " +
                           std::to_string(opt.chunks) + " channels " + std::to_string(opt.channels) + " seed " +
                           std::to_string(seed) + (kind == InputKind::SmallIntegers ? " small-integers" : " uniform");
  INFO(what);
  const Schedule s = generate(spec, nodeOf, opt);
  const auto issues = validateAll(s);
  REQUIRE_MESSAGE(issues.empty(), (issues.empty() ? std::string() : issues.front().message));
  const VerifyResult r = verifyCollective(s, spec, seed, kind);
  CHECK_MESSAGE(r.ok, r.detail);
  CHECK(r.checked == outputCount(spec, s.nRanks) * s.nRanks);
}

/// The layouts every algorithm is run on for `p` ranks: one node, nodes of 4 (p > 4), uneven {3,2,3} (p = 8),
/// and one rank per node (p = 5).
std::vector<std::vector<uint32_t>> layoutsFor(uint32_t p) {
  std::vector<std::vector<uint32_t>> out{nodesOf(p, p)};
  if (p > 4) out.push_back(nodesOf(p, 4));
  if (p == 8) out.push_back(nodesSized({3, 2, 3}));
  if (p == 5) out.push_back(nodesOf(p, 1));
  if (p == 3) out.push_back(nodesSized({2, 1}));
  return out;
}

/// The verification sweep of one algorithm: ranks {1,2,3,4,5,8,16} x layouts x counts; chunks, channels and
/// dtype rotate so every combination of them meets several rank counts without a full cross product.
void sweep(CollOp op, const char* algo) {
  const uint32_t rankCounts[] = {1, 2, 3, 4, 5, 8, 16};
  const uint64_t counts[] = {1, 2, 7, 31, 1021};
  const GenOptions opts[] = {makeOpt(1, 1), makeOpt(3, 1), makeOpt(1, 2), makeOpt(3, 2)};
  const DType dtypes[] = {DType::Float32, DType::BFloat16, DType::Float16};
  uint64_t seed = 0xC011ull * 1000 + static_cast<uint64_t>(op) * 100;
  uint32_t turn = 0;
  for (uint32_t p : rankCounts)
    for (const auto& nodeOf : layoutsFor(p))
      for (uint64_t count : counts) {
        ++turn;
        const DType dtype = dtypes[turn % 3];
        const uint32_t root = op == CollOp::Broadcast ? (turn * 7) % p : 0;
        runCase(makeSpec(op, algo, count, dtype, RedOp::Sum, root), nodeOf, opts[turn % 4], ++seed);
      }
  // One large odd count per algorithm, on two nodes of 4 with chunks and channels.
  runCase(makeSpec(op, algo, 16411, DType::BFloat16), nodesOf(8, 4), makeOpt(3, 2), ++seed);
}

const Lane* laneWithRole(const Schedule& s, uint32_t rank, LaneRole role) {
  for (const Lane& l : s.lanes[rank])
    if (l.role == role) return &l;
  return nullptr;
}

uint64_t countSteps(const Schedule& s, StepKind kind, int rank = -1) {
  uint64_t n = 0;
  for (uint32_t r = 0; r < s.nRanks; ++r)
    if (rank < 0 || static_cast<uint32_t>(rank) == r)
      for (const Lane& l : s.lanes[r])
        for (const Step& st : l.steps) n += st.kind == kind ? 1 : 0;
  return n;
}

/// A profile whose prices are all distinct and where the network beats NVLink in bandwidth, so a formula
/// that picks the wrong maximum or forgets a term cannot agree with the timeline by accident.
Profile oddProfile() {
  Profile p;
  p.source = "test";
  p.nvlink = LinkCost{0.7, 37};
  p.network = LinkCost{1.3, 91};
  p.local = LinkCost{0.31, 173};
  p.reduceGBs = 23;
  p.flagUs = 0.41;
  p.dispatchUs = 1.9;
  p.proxyUs = 2.3;
  p.gemmTflops = 10;
  return p;
}

/// Closed form and uncontended timeline of one case; the closed form goes through the registry directly so
/// any layout (not only the topology's node-major one) can be priced.
struct Priced {
  double formula = 0, timeline = 0;
  std::string text;
};
Priced price(const CollectiveSpec& spec, const std::vector<uint32_t>& nodeOf, const GenOptions& opt,
             const Profile& profile) {
  const Topology topo = topologyPreset("dgx-h100", 1);
  const detail::GenContext ctx = detail::makeContext(spec, nodeOf, opt);
  const auto& def = detail::findAlgorithm(spec.op, spec.algo);
  REQUIRE(static_cast<bool>(def.cost));
  const CostEstimate e = def.cost(detail::CostContext{spec, opt, topo, ctx, profile});
  CHECK(std::fabs(e.latencyUs + e.bandwidthUs + e.reduceUs - e.totalUs) <= 1e-9 * e.totalUs);
  Priced out;
  out.formula = e.totalUs;
  out.text = e.formula;
  out.timeline = simulateUncontended(generate(spec, nodeOf, opt), profile).totalUs;
  return out;
}

/// Exact agreement for even splits on equal node-major nodes, under two different profiles.
void expectExactCost(CollOp op, const char* algo) {
  const Profile profiles[] = {oddProfile(), defaultProfile(topologyPreset("dgx-h100", 2))};
  struct Shape {
    uint32_t p, perNode;
  };
  const Shape shapes[] = {{1, 1}, {2, 2}, {3, 3}, {4, 4}, {8, 8}, {8, 4}, {8, 2}, {8, 1}, {12, 4}, {16, 8}, {6, 3}};
  uint32_t turn = 0;
  for (const Profile& profile : profiles)
    for (const Shape& sh : shapes)
      for (uint32_t chunks : {1u, 2u, 4u})
        for (uint32_t channels : {1u, 2u}) {
          ++turn;
          const uint64_t count = 4096ull * chunks * channels * (1 + turn % 3);  // divisible by C*K
          const uint32_t root = op == CollOp::Broadcast ? (turn * 5) % sh.p : 0;
          const auto spec = makeSpec(op, algo, count, turn % 2 ? DType::BFloat16 : DType::Float32, RedOp::Sum, root);
          const auto nodeOf = nodesOf(sh.p, sh.perNode);
          const Priced pr = price(spec, nodeOf, makeOpt(chunks, channels), profile);
          INFO(toString(op) << " " << algo << " p " << sh.p << " per node " << sh.perNode << " chunks " << chunks
                            << " channels " << channels << " count " << count << " root " << root << ": " << pr.text);
          CHECK(pr.formula == doctest::Approx(pr.timeline).epsilon(1e-9));
        }
}

}  // namespace

// ---- registry and bad input --------------------------------------------------------------------------------

TEST_CASE("collectives: the registry lists every gather and scatter algorithm with a closed form") {
  using A = Algorithm;
  CHECK(algorithmsFor(CollOp::AllGather) == std::vector<A>{A::Ring, A::Direct, A::Hierarchical});
  CHECK(algorithmsFor(CollOp::ReduceScatter) == std::vector<A>{A::Ring, A::Direct, A::Hierarchical});
  CHECK(algorithmsFor(CollOp::Broadcast) == std::vector<A>{A::Direct, A::Ring});
  CHECK(algorithmsFor(CollOp::AllToAll) == std::vector<A>{A::Direct});
  for (const Algo& a : kAlgos) {
    const auto& def = detail::findAlgorithm(a.op, requireAlgorithm(a.op, a.name));
    CHECK(static_cast<bool>(def.emit));
    CHECK(static_cast<bool>(def.cost));
    CHECK(std::string(def.summary).size() > 10);
  }
}

TEST_CASE("collectives: an unknown algorithm name is NotFound and lists the known ones") {
  // A name that is no algorithm (refused where it is parsed), and an algorithm without a generator for the op
  // (refused where it is parsed and by generate()).
  expectError([] { (void)requireAlgorithm(CollOp::AllGather, "tree"); }, ErrorCode::NotFound,
              "unknown algorithm 'tree' for allgather (expected ring, direct, hierarchical)");
  expectError([] { (void)requireAlgorithm(CollOp::AllToAll, "ring"); }, ErrorCode::NotFound, "(expected direct)");
  CollectiveSpec ringAllToAll = makeSpec(CollOp::AllToAll, "direct", 8);
  ringAllToAll.algo = Algorithm::Ring;
  expectError([&] { generate(ringAllToAll, nodesOf(4, 4)); }, ErrorCode::NotFound, "(expected direct)");
}

TEST_CASE("collectives: specs and options compare field by field, so a pair of them can key a cache") {
  const CollectiveSpec a = makeSpec(CollOp::AllGather, "ring", 8);
  CHECK(a == makeSpec(CollOp::AllGather, "ring", 8));
  std::vector<CollectiveSpec> differ(6, a);
  differ[0].op = CollOp::ReduceScatter;
  differ[1].algo = Algorithm::Direct;
  differ[2].dtype = DType::Float16;
  differ[3].redop = RedOp::Max;
  differ[4].count = 9;
  differ[5].root = 1;
  for (const CollectiveSpec& d : differ) {
    CHECK(a != d);
    CHECK((a < d) != (d < a));  // strict and total over distinct specs
  }
  CHECK_FALSE(a < a);
  const GenOptions o = makeOpt(2, 3);
  CHECK(o == makeOpt(2, 3));
  GenOptions rhd = o;
  rhd.inter = InterPhase::Rhd;
  for (const GenOptions& d : {makeOpt(1, 3), makeOpt(2, 1), rhd}) {
    CHECK(o != d);
    CHECK((o < d) != (d < o));
  }
  CHECK_FALSE(o < o);
  std::map<std::pair<CollectiveSpec, GenOptions>, int> cache;
  cache[{a, o}] = 1;
  cache[{a, rhd}] = 2;
  cache[{makeSpec(CollOp::AllGather, "ring", 8), makeOpt(2, 3)}] += 10;
  CHECK(cache.size() == 2);
  CHECK(cache.at({a, o}) == 11);
}

TEST_CASE("collectives: count 0 and broadcast roots outside the ranks are InvalidArgument") {
  for (const Algo& a : kAlgos) {
    INFO(toString(a.op) << " " << a.name);
    expectError([&] { generate(makeSpec(a.op, a.name, 0), nodesOf(4, 2)); }, ErrorCode::InvalidArgument, "count");
  }
  for (const char* algo : {"direct", "ring"}) {
    expectError([&] { generate(makeSpec(CollOp::Broadcast, algo, 8, DType::Float32, RedOp::Sum, 4), nodesOf(4, 4)); },
                ErrorCode::InvalidArgument, "root 4");
    expectError([&] { generate(makeSpec(CollOp::Broadcast, algo, 8, DType::Float32, RedOp::Sum, 99), nodesOf(1, 1)); },
                ErrorCode::InvalidArgument, "root 99");
  }
}

TEST_CASE("collectives: zero chunks or channels and an empty layout are InvalidArgument") {
  const auto spec = makeSpec(CollOp::ReduceScatter, "ring", 8);
  expectError([&] { generate(spec, nodesOf(4, 4), makeOpt(0, 1)); }, ErrorCode::InvalidArgument, "chunks");
  expectError([&] { generate(spec, nodesOf(4, 4), makeOpt(1, 0)); }, ErrorCode::InvalidArgument, "channels");
  expectError([&] { generate(spec, {}, makeOpt(1, 1)); }, ErrorCode::InvalidArgument, "rank");
}

// ---- structure ---------------------------------------------------------------------------------------------

TEST_CASE("collectives: NVLink puts run on intra lanes and proxy puts on inter-send lanes") {
  for (const Algo& a : kAlgos)
    for (const auto& nodeOf : {nodesOf(8, 4), nodesSized({3, 2, 3}), nodesOf(4, 1)}) {
      INFO(toString(a.op) << " " << a.name << " nodes " << describe(nodeOf));
      const Schedule s = generate(makeSpec(a.op, a.name, 13, DType::Float32, RedOp::Sum, 1), nodeOf, makeOpt(2, 2));
      for (uint32_t r = 0; r < s.nRanks; ++r)
        for (const Lane& l : s.lanes[r])
          for (const Step& st : l.steps) {
            if (st.kind == StepKind::Put) CHECK(l.role == LaneRole::Intra);
            if (st.kind == StepKind::ProxyPut) CHECK(l.role == LaneRole::InterSend);
            if (st.kind == StepKind::Put || st.kind == StepKind::ProxyPut) CHECK(st.count > 0);
          }
    }
}

TEST_CASE("collectives: a single rank is one local copy for every algorithm") {
  for (const Algo& a : kAlgos) {
    INFO(toString(a.op) << " " << a.name);
    const Schedule s = generate(makeSpec(a.op, a.name, 37), nodesOf(1, 1));
    CHECK(s.stepCount() == 1);
    REQUIRE(s.lanes[0].size() == 1);
    const Step& st = s.lanes[0][0].steps.at(0);
    CHECK(st.kind == StepKind::Copy);
    CHECK(st.link == LinkClass::Local);
    CHECK(st.count == 37);
    CHECK(verifyCollective(s, makeSpec(a.op, a.name, 37), 11).ok);
  }
}

TEST_CASE("allgather ring: each rank forwards p-1 blocks of K chunks to its successor") {
  const uint32_t p = 6;
  const Schedule s = generate(makeSpec(CollOp::AllGather, "ring", 30), nodesOf(p, 3), makeOpt(3, 1));
  CHECK(s.nFlags == 1);
  for (uint32_t r = 0; r < p; ++r) {
    CHECK(countSteps(s, StepKind::Put, static_cast<int>(r)) + countSteps(s, StepKind::ProxyPut, static_cast<int>(r)) ==
          (p - 1) * 3);
    for (const Lane& l : s.lanes[r])
      for (const Step& st : l.steps)
        if (st.kind == StepKind::Put || st.kind == StepKind::ProxyPut) CHECK(st.dst.rank == (r + 1) % p);
  }
  // Rank 2 ends node 0, so its ring lane is the inter-send one; rank 1's is intra.
  CHECK(laneWithRole(s, 2, LaneRole::InterSend) != nullptr);
  CHECK(laneWithRole(s, 1, LaneRole::InterSend) == nullptr);
  CHECK(s.buffers.size() == 2);  // no scratch: data goes straight into the successor's output
}

TEST_CASE("allgather direct: every rank puts its block to every peer starting with its successor") {
  const uint32_t p = 5;
  const Schedule s = generate(makeSpec(CollOp::AllGather, "direct", 4), nodesOf(p, p));
  for (uint32_t r = 0; r < p; ++r) {
    const Lane* intra = laneWithRole(s, r, LaneRole::Intra);
    REQUIRE(intra != nullptr);
    std::vector<uint32_t> targets;
    for (const Step& st : intra->steps)
      if (st.kind == StepKind::Put) {
        targets.push_back(st.dst.rank);
        CHECK(st.dst.offset == r * 4);
      }
    REQUIRE(targets.size() == p - 1);
    for (uint32_t i = 0; i + 1 < p; ++i) CHECK(targets[i] == (r + i + 1) % p);
  }
  CHECK(s.nFlags == p);  // one per sender
}

TEST_CASE("allgather hierarchical: every block crosses the network once per other node on its rail") {
  const auto nodeOf = nodesOf(12, 4);  // M = 3, G = 4
  const Schedule s = generate(makeSpec(CollOp::AllGather, "hierarchical", 10), nodeOf, makeOpt(2, 1));
  CHECK(countSteps(s, StepKind::ProxyPut) == 12 * 2 * 2);  // p blocks x (M-1) nodes x K chunks
  for (uint32_t r = 0; r < s.nRanks; ++r)
    for (const Lane& l : s.lanes[r])
      for (const Step& st : l.steps)
        if (st.kind == StepKind::ProxyPut) CHECK(st.dst.rank % 4 == r % 4);  // same rail
  // Intra: each rank hands M blocks (its own and M-1 received) to G-1 peers, in K chunks.
  CHECK(countSteps(s, StepKind::Put) == 12 * 3 * 3 * 2);
  const auto single = generate(makeSpec(CollOp::AllGather, "hierarchical", 10), nodesOf(4, 4));
  CHECK(countSteps(single, StepKind::ProxyPut) == 0);
  const auto spread = generate(makeSpec(CollOp::AllGather, "hierarchical", 10), nodesOf(4, 1));
  CHECK(countSteps(spread, StepKind::Put) == 0);
  CHECK(countSteps(spread, StepKind::ProxyPut) == 4 * 3);
}

TEST_CASE("allgather hierarchical: uneven nodes route the missing rail through a smaller node's owner") {
  const auto nodeOf = nodesSized({3, 2, 3});
  const Schedule s = generate(makeSpec(CollOp::AllGather, "hierarchical", 5), nodeOf);
  // Node 1 (ranks 3, 4) has no local index 2: ranks 2 and 7 send their blocks to rank 3 (rail 2 % 2 = 0).
  auto sendsTo = [&](uint32_t from, uint32_t to) {
    for (const Lane& l : s.lanes[from])
      for (const Step& st : l.steps)
        if (st.kind == StepKind::ProxyPut && st.dst.rank == to) return true;
    return false;
  };
  CHECK(sendsTo(2, 3));
  CHECK(sendsTo(7, 3));
  CHECK_FALSE(sendsTo(2, 4));
  CHECK(verifyCollective(s, makeSpec(CollOp::AllGather, "hierarchical", 5), 3).ok);
}

TEST_CASE("reducescatter ring: p-1 put and reduce steps per chunk through a per-step scratch slot") {
  const uint32_t p = 5;
  const auto spec = makeSpec(CollOp::ReduceScatter, "ring", 12);
  const Schedule s = generate(spec, nodesOf(p, p), makeOpt(2, 1));
  const int scratch = s.bufferIndex("scratch");
  REQUIRE(scratch >= 0);
  CHECK(s.buffers[static_cast<std::size_t>(scratch)].count[0] == (p - 1) * 12);
  for (uint32_t r = 0; r < p; ++r) {
    CHECK(countSteps(s, StepKind::Put, static_cast<int>(r)) == (p - 1) * 2);
    CHECK(countSteps(s, StepKind::Reduce, static_cast<int>(r)) == (p - 1) * 2);
  }
  // The last reduce of rank r writes its output from its own input block r.
  const Step& last = s.lanes[3].front().steps.back();
  CHECK(last.kind == StepKind::Reduce);
  CHECK(last.dst.buffer == s.bufferIndex("output"));
  CHECK(last.b.offset == 3 * 12 + 6);
}

TEST_CASE("reducescatter direct: each destination reduces its p blocks in rank order") {
  const uint32_t p = 4;
  const Schedule s = generate(makeSpec(CollOp::ReduceScatter, "direct", 9), nodesOf(p, 2));
  const auto scratch = static_cast<uint16_t>(s.bufferIndex("scratch"));
  const auto input = static_cast<uint16_t>(s.bufferIndex("input"));
  for (uint32_t j = 0; j < p; ++j) {
    const Lane* compute = laneWithRole(s, j, LaneRole::Compute);
    REQUIRE(compute != nullptr);
    std::vector<uint32_t> order;  // which source each reduce operand is, in order
    auto source = [&](const BufRef& ref) { return ref.buffer == input ? j : static_cast<uint32_t>(ref.offset / 9); };
    for (const Step& st : compute->steps)
      if (st.kind == StepKind::Reduce) {
        if (order.empty()) order.push_back(source(st.a));
        order.push_back(source(st.b));
        if (st.b.buffer == scratch) CHECK(st.b.offset % 9 == 0);
      }
    CHECK(order == std::vector<uint32_t>{0, 1, 2, 3});
  }
}

TEST_CASE("reducescatter hierarchical: only rail owners cross nodes and each sends M-1 chunks per block") {
  const auto nodeOf = nodesOf(12, 4);  // M = 3, G = 4: every rank owns one rail
  const Schedule s = generate(makeSpec(CollOp::ReduceScatter, "hierarchical", 10), nodeOf, makeOpt(2, 1));
  // Ring of M owners per rail: M-1 sends per block, M blocks... each owner sends (M-1) of its M items, K chunks.
  CHECK(countSteps(s, StepKind::ProxyPut) == 12 * 2 * 2);
  for (uint32_t r = 0; r < 12; ++r)
    for (const Lane& l : s.lanes[r])
      for (const Step& st : l.steps)
        if (st.kind == StepKind::ProxyPut) {
          CHECK(st.dst.rank % 4 == r % 4);
          CHECK(st.dst.rank / 4 == (r / 4 + 1) % 3);  // ring over nodes
        }
  // Phase 1: each rank sends, to each of its G-1 node-mates, the M blocks of that mate's rail.
  CHECK(countSteps(s, StepKind::Put) == 12 * 3 * 3 * 2);
  CHECK(verifyCollective(s, makeSpec(CollOp::ReduceScatter, "hierarchical", 10), 5, InputKind::SmallIntegers).ok);
}

TEST_CASE("broadcast direct: the root sends K chunks to every other rank and nobody else sends") {
  const auto nodeOf = nodesOf(8, 4);
  const Schedule s =
      generate(makeSpec(CollOp::Broadcast, "direct", 20, DType::Float32, RedOp::Sum, 5), nodeOf, makeOpt(2, 1));
  CHECK(countSteps(s, StepKind::Put, 5) == 3 * 2);
  CHECK(countSteps(s, StepKind::ProxyPut, 5) == 4 * 2);
  CHECK(countSteps(s, StepKind::Put) + countSteps(s, StepKind::ProxyPut) == 7 * 2);
  for (uint32_t r = 0; r < 8; ++r)
    if (r != 5) CHECK(countSteps(s, StepKind::Wait, static_cast<int>(r)) == 1);
}

TEST_CASE("broadcast ring: a chain from the root where each rank forwards every chunk once") {
  const uint32_t p = 6, root = 4;
  const Schedule s =
      generate(makeSpec(CollOp::Broadcast, "ring", 30, DType::Float32, RedOp::Sum, root), nodesOf(p, 3), makeOpt(3, 1));
  for (uint32_t r = 0; r < p; ++r) {
    const uint64_t sent =
        countSteps(s, StepKind::Put, static_cast<int>(r)) + countSteps(s, StepKind::ProxyPut, static_cast<int>(r));
    CHECK(sent == (r == (root + p - 1) % p ? 0u : 3u));
  }
  // Chain 4 -> 5 -> 0 -> 1 -> 2 -> 3: the hops 5 -> 0 and 2 -> 3 cross nodes, rank 3 ends it.
  CHECK(countSteps(s, StepKind::ProxyPut, 5) == 3);
  CHECK(countSteps(s, StepKind::ProxyPut, 2) == 3);
  CHECK(countSteps(s, StepKind::Put, 4) == 3);
  CHECK(countSteps(s, StepKind::Wait, 3) == 1);
}

TEST_CASE("alltoall direct: block j of rank r lands in block r of rank j") {
  const uint32_t p = 4;
  const Schedule s = generate(makeSpec(CollOp::AllToAll, "direct", 3), nodesOf(p, 2));
  for (uint32_t r = 0; r < p; ++r)
    for (const Lane& l : s.lanes[r])
      for (const Step& st : l.steps)
        if (st.kind == StepKind::Put || st.kind == StepKind::ProxyPut) {
          CHECK(st.a.offset == st.dst.rank * 3);
          CHECK(st.dst.offset == r * 3);
        }
  CHECK(countSteps(s, StepKind::ProxyPut) == p * 2);
}

TEST_CASE("collectives: channels own disjoint slices and never share a lane") {
  for (const Algo& a : kAlgos) {
    INFO(toString(a.op) << " " << a.name);
    const Schedule one = generate(makeSpec(a.op, a.name, 40, DType::Float32, RedOp::Sum, 2), nodesOf(8, 4));
    const Schedule two =
        generate(makeSpec(a.op, a.name, 40, DType::Float32, RedOp::Sum, 2), nodesOf(8, 4), makeOpt(1, 2));
    for (uint32_t r = 0; r < 8; ++r) CHECK(two.lanes[r].size() == 2 * one.lanes[r].size());
    // A count smaller than the channels uses only count channels.
    const Schedule tiny =
        generate(makeSpec(a.op, a.name, 1, DType::Float32, RedOp::Sum, 2), nodesOf(8, 4), makeOpt(1, 4));
    for (uint32_t r = 0; r < 8; ++r) CHECK(tiny.lanes[r].size() == one.lanes[r].size());
  }
}

TEST_CASE("collectives: every schedule validates with the race check on awkward layouts") {
  const std::vector<std::vector<uint32_t>> layouts = {
      nodesSized({3, 2, 3}), nodesSized({1, 4, 2}), nodesSized({5, 1}), {0, 1, 0, 1, 2, 2, 0}, nodesOf(9, 3)};
  for (const Algo& a : kAlgos)
    for (const auto& nodeOf : layouts)
      for (uint32_t chunks : {1u, 4u}) {
        INFO(toString(a.op) << " " << a.name << " nodes " << describe(nodeOf) << " chunks " << chunks);
        const auto spec = makeSpec(a.op, a.name, 11, DType::Float16, RedOp::Sum, 3);
        const Schedule s = generate(spec, nodeOf, makeOpt(chunks, 2));
        const auto issues = validateAll(s);
        CHECK_MESSAGE(issues.empty(), (issues.empty() ? std::string() : issues.front().message));
        CHECK(verifyCollective(s, spec, 17, InputKind::SmallIntegers).ok);
      }
}

// ---- numerics: the sweep -----------------------------------------------------------------------------------

TEST_CASE("verify: allgather ring over ranks layouts counts chunks channels and dtypes") {
  sweep(CollOp::AllGather, "ring");
}
TEST_CASE("verify: allgather direct over ranks layouts counts chunks channels and dtypes") {
  sweep(CollOp::AllGather, "direct");
}
TEST_CASE("verify: allgather hierarchical over ranks layouts counts chunks channels and dtypes") {
  sweep(CollOp::AllGather, "hierarchical");
}
TEST_CASE("verify: reducescatter ring over ranks layouts counts chunks channels and dtypes") {
  sweep(CollOp::ReduceScatter, "ring");
}
TEST_CASE("verify: reducescatter direct over ranks layouts counts chunks channels and dtypes") {
  sweep(CollOp::ReduceScatter, "direct");
}
TEST_CASE("verify: reducescatter hierarchical over ranks layouts counts chunks channels and dtypes") {
  sweep(CollOp::ReduceScatter, "hierarchical");
}
TEST_CASE("verify: broadcast direct over ranks layouts counts chunks channels and dtypes") {
  sweep(CollOp::Broadcast, "direct");
}
TEST_CASE("verify: broadcast ring over ranks layouts counts chunks channels and dtypes") {
  sweep(CollOp::Broadcast, "ring");
}
TEST_CASE("verify: alltoall direct over ranks layouts counts chunks channels and dtypes") {
  sweep(CollOp::AllToAll, "direct");
}

TEST_CASE("verify: reducescatter sum max and min are bit-exact on small integers for every algorithm") {
  uint64_t seed = 900;
  for (const char* algo : {"ring", "direct", "hierarchical"})
    for (RedOp op : {RedOp::Sum, RedOp::Max, RedOp::Min})
      for (DType dtype : {DType::Float32, DType::BFloat16, DType::Float16})
        for (const auto& nodeOf : {nodesOf(8, 4), nodesSized({3, 2, 3}), nodesOf(5, 5)})
          runCase(makeSpec(CollOp::ReduceScatter, algo, 31, dtype, op), nodeOf, makeOpt(3, 2), ++seed,
                  InputKind::SmallIntegers);
}

TEST_CASE("verify: reducescatter max and min on uniform inputs select exact values") {
  uint64_t seed = 1900;
  for (const char* algo : {"ring", "direct", "hierarchical"})
    for (RedOp op : {RedOp::Max, RedOp::Min})
      runCase(makeSpec(CollOp::ReduceScatter, algo, 1021, DType::BFloat16, op), nodesOf(16, 4), makeOpt(3, 2), ++seed);
}

TEST_CASE("verify: reducescatter sums of 16 ranks stay within the bound in every dtype") {
  uint64_t seed = 2900;
  for (const char* algo : {"ring", "direct", "hierarchical"})
    for (DType dtype : {DType::Float32, DType::BFloat16, DType::Float16})
      runCase(makeSpec(CollOp::ReduceScatter, algo, 257, dtype), nodesSized({5, 3, 8}), makeOpt(2, 1), ++seed);
}

TEST_CASE("verify: broadcast from every root on one node and across uneven nodes") {
  uint64_t seed = 3900;
  for (const char* algo : {"direct", "ring"}) {
    for (uint32_t root = 0; root < 5; ++root)
      runCase(makeSpec(CollOp::Broadcast, algo, 61, DType::Float16, RedOp::Sum, root), nodesOf(5, 5), makeOpt(3, 2),
              ++seed);
    for (uint32_t root : {0u, 2u, 3u, 4u, 7u})
      runCase(makeSpec(CollOp::Broadcast, algo, 61, DType::BFloat16, RedOp::Sum, root), nodesSized({3, 2, 3}),
              makeOpt(2, 1), ++seed);
  }
}

TEST_CASE("verify: ranks interleaved over nodes still give the right answer") {
  const std::vector<uint32_t> nodeOf = {0, 1, 2, 0, 1, 2, 0, 1};  // not node-major
  uint64_t seed = 4900;
  for (const Algo& a : kAlgos)
    runCase(makeSpec(a.op, a.name, 23, DType::Float32, RedOp::Sum, 6), nodeOf, makeOpt(2, 2), ++seed);
}

// ---- closed forms ------------------------------------------------------------------------------------------

TEST_CASE("cost: allgather closed forms equal the uncontended timeline for even splits") {
  for (const char* algo : {"ring", "direct", "hierarchical"}) expectExactCost(CollOp::AllGather, algo);
}

TEST_CASE("cost: reducescatter closed forms equal the uncontended timeline for even splits") {
  for (const char* algo : {"ring", "direct", "hierarchical"}) expectExactCost(CollOp::ReduceScatter, algo);
}

TEST_CASE("cost: broadcast and alltoall closed forms equal the uncontended timeline for even splits") {
  expectExactCost(CollOp::Broadcast, "direct");
  expectExactCost(CollOp::Broadcast, "ring");
  expectExactCost(CollOp::AllToAll, "direct");
}

TEST_CASE("cost: closed forms through closedForm match the timeline on a two-node preset") {
  const Topology topo = topologyPreset("dgx-h100", 2);
  const Profile profile = defaultProfile(topo);
  for (const Algo& a : kAlgos) {
    const auto spec = makeSpec(a.op, a.name, 1u << 16, DType::BFloat16, RedOp::Sum, 3);
    const GenOptions opt = makeOpt(4, 2);
    const CostEstimate e = closedForm(spec, opt, topo, 16, profile);
    const double t = simulateUncontended(generate(spec, topo.layout(16), opt), profile).totalUs;
    INFO(toString(a.op) << " " << a.name << ": " << e.formula);
    CHECK(e.totalUs == doctest::Approx(t).epsilon(1e-9));
    CHECK(e.latencyUs >= profile.dispatchUs);
    CHECK(e.bandwidthUs > 0);
    CHECK(e.formula.find("t0") != std::string::npos);
    if (a.op == CollOp::ReduceScatter) CHECK(e.reduceUs > 0);
  }
}

TEST_CASE("cost: uneven counts are priced by the largest piece and bound the timeline from above") {
  const Profile profile = oddProfile();
  for (const Algo& a : kAlgos)
    for (uint64_t count : {7ull, 1021ull, 16411ull})
      for (const auto& nodeOf : {nodesOf(8, 4), nodesOf(6, 6)}) {
        const auto spec = makeSpec(a.op, a.name, count, DType::Float32, RedOp::Sum, 1);
        const Priced pr = price(spec, nodeOf, makeOpt(3, 2), profile);
        INFO(toString(a.op) << " " << a.name << " count " << count << " nodes " << describe(nodeOf) << ": " << pr.text);
        CHECK(pr.formula >= pr.timeline * (1 - 1e-12));
        // The largest piece is at most one element above the average: within 1% once pieces hold >= 100.
        if (count >= 16411) CHECK(pr.formula <= pr.timeline * 1.01);
      }
}

TEST_CASE("cost: uneven and interleaved nodes are priced exactly too") {
  const Profile profiles[] = {oddProfile(), defaultProfile(topologyPreset("dgx-h100", 2))};
  const std::vector<std::vector<uint32_t>> layouts = {nodesSized({3, 2, 3}), nodesSized({8, 4}),
                                                      nodesSized({1, 4, 2}), nodesSized({8, 8, 3}),
                                                      {0, 1, 0, 1, 2, 2, 0}, {0, 1, 2, 0, 1, 2, 0, 1, 2}};
  for (const Profile& profile : profiles)
    for (const Algo& a : kAlgos)
      for (const auto& nodeOf : layouts)
        for (uint32_t chunks : {1u, 4u}) {
          const auto spec = makeSpec(a.op, a.name, 4096ull * chunks, DType::BFloat16, RedOp::Sum, 2);
          const Priced pr = price(spec, nodeOf, makeOpt(chunks, 1), profile);
          INFO(toString(a.op) << " " << a.name << " nodes " << describe(nodeOf) << " chunks " << chunks << ": "
                              << pr.text << " timeline " << pr.timeline);
          CHECK(pr.formula == doctest::Approx(pr.timeline).epsilon(1e-9));
        }
}

TEST_CASE("cost: the closed forms rank algorithms like the timeline at scale") {
  // 256 ranks on 32 nodes of 8: hierarchical allgather beats the ring (fewer network hops), and both
  // formulas still equal the timeline.
  const Profile profile = defaultProfile(topologyPreset("dgx-h100", 32));
  const auto nodeOf = nodesOf(256, 8);
  double hier = 0, ring = 0;
  for (const char* algo : {"ring", "hierarchical"}) {
    const auto spec = makeSpec(CollOp::AllGather, algo, 1u << 14, DType::BFloat16);
    const Priced pr = price(spec, nodeOf, makeOpt(1, 1), profile);
    INFO(algo << ": " << pr.text);
    CHECK(pr.formula == doctest::Approx(pr.timeline).epsilon(1e-9));
    (std::string(algo) == "ring" ? ring : hier) = pr.formula;
  }
  CHECK(hier < ring);
}

// ---- the checks above can fail -----------------------------------------------------------------------------

TEST_CASE("verify: a put redirected into the wrong block is caught") {
  const auto spec = makeSpec(CollOp::AllToAll, "direct", 7);
  Schedule s = generate(spec, nodesOf(4, 4));
  bool moved = false;
  for (Step& st : s.lanes[1][1].steps)
    if (!moved && st.kind == StepKind::Put) {
      st.dst.offset = (st.dst.offset + 7) % 28;  // the block of another sender
      moved = true;
    }
  REQUIRE(moved);
  CHECK_FALSE(verifyCollective(s, spec, 21).ok);
}

TEST_CASE("validate: dropping a ring wait makes the reduce race with the incoming put") {
  // Rank 1's first wait orders its reduce of scratch slot 0 after rank 0's put into it; without it the
  // flag accounting still balances (the last wait covers every increment) but the data race is reported.
  Schedule s = generate(makeSpec(CollOp::ReduceScatter, "ring", 16), nodesOf(4, 4), makeOpt(2, 1));
  REQUIRE(validateAll(s).empty());
  auto& steps = s.lanes[1][0].steps;
  const auto firstWait =
      std::find_if(steps.begin(), steps.end(), [](const Step& st) { return st.kind == StepKind::Wait; });
  REQUIRE(firstWait != steps.end());
  steps.erase(firstWait);
  const auto issues = validateAll(s);
  REQUIRE_FALSE(issues.empty());
  MESSAGE(issues.front().message);
  CHECK(issues.front().message.find("race on rank 1 buffer 'scratch'") != std::string::npos);
}

TEST_CASE("collectives: 1024 ranks on 128 nodes broadcast and are priced exactly") {
  const Topology topo = topologyPreset("dgx-h100", 128);
  const Profile profile = defaultProfile(topo);
  for (const char* algo : {"direct", "ring"}) {
    const auto spec = makeSpec(CollOp::Broadcast, algo, 1u << 12, DType::BFloat16, RedOp::Sum, 517);
    const Schedule s = generate(spec, topo.layout(1024), makeOpt(2, 1));
    CHECK(validateAll(s).empty());
    const double t = simulateUncontended(s, profile).totalUs;
    CHECK(closedForm(spec, makeOpt(2, 1), topo, 1024, profile).totalUs == doctest::Approx(t).epsilon(1e-9));
  }
}

TEST_CASE("collectives: a direct exchange sends across nodes in staggered order") {
  // 3 nodes of 4 ranks: at every position of their cross-node send order, the 4 senders of a node target 4
  // different ranks (one per remote GPU and NIC), starting with the next node; same-node peers keep ring order.
  const std::vector<uint32_t> nodeOf = {0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2};
  CollectiveSpec spec;
  spec.op = CollOp::AllGather;
  spec.algo = Algorithm::Direct;
  spec.count = 64;
  const detail::GenContext ctx = detail::makeContext(spec, nodeOf, GenOptions{});
  for (uint32_t node = 0; node < 3; ++node) {
    std::vector<std::vector<uint32_t>> remote;  // per sender of this node: its cross-node targets in order
    for (uint32_t r = node * 4; r < node * 4 + 4; ++r) {
      const std::vector<uint32_t> order = detail::directSendOrder(ctx, r);
      REQUIRE(order.size() == 11);
      std::vector<uint32_t> local(order.begin(), order.begin() + 3), rest(order.begin() + 3, order.end());
      for (uint32_t i = 0; i < 3; ++i) CHECK(local[i] / 4 == node);
      CHECK(local[0] == (r % 4 == 3 ? node * 4 : r + 1));
      CHECK(rest[0] / 4 == (node + 1) % 3);  // the next node first
      remote.push_back(rest);
    }
    for (uint32_t k = 0; k < 8; ++k) {
      std::set<uint32_t> targets;
      for (const auto& rest : remote) targets.insert(rest[k]);
      CHECK(targets.size() == 4);
    }
  }
  // The generated schedule is still exact.
  CHECK(verifyCollective(generate(spec, nodeOf, GenOptions{}), spec, 3).ok);
}
