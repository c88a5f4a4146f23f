// Tests of the all-reduce generators (one-shot, two-shot, ring, hierarchical): schedule structure per layout,
// the validator with its race check, the CPU reference executor against the plain reference (bit-exact on
// small integers, within the summation bound on uniform inputs), identical bits on every rank, and the closed
// forms against the uncontended timeline. Algorithms and formulas: docs/algorithms-allreduce.md.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "../src/algorithms/allreduce_hierarchical.hpp"
#include "../src/algorithms/builder.hpp"
#include "layout.hpp"
#include "mk/algorithms/algorithms.hpp"
#include "mk/cost/cost.hpp"
#include "mk/error.hpp"
#include "mk/exec/executor.hpp"
#include "mk/exec/numeric.hpp"
#include "mk/exec/verify.hpp"
#include "mk/schedule/validate.hpp"
#include "mk/topology/topology.hpp"
#include "mk/util/format.hpp"

using namespace mk;

using mk::test::countKind;
using mk::test::nodesOf;

namespace {

const char* const kAllReduce[] = {"one-shot", "two-shot", "ring", "hierarchical"};

/// The uneven layout of the brief: nodes of 3, 2 and 3 ranks.
std::vector<uint32_t> unevenLayout() { return {0, 0, 0, 1, 1, 2, 2, 2}; }

std::string describe(const std::vector<uint32_t>& nodeOf) {
  std::string out = "{";
  for (std::size_t i = 0; i < nodeOf.size(); ++i) out += (i ? " " : "") + std::to_string(nodeOf[i]);
  return out + "}";
}

CollectiveSpec arSpec(const std::string& algo, uint64_t count, DType dtype = DType::Float32, RedOp redop = RedOp::Sum) {
  CollectiveSpec s;
  s.op = CollOp::AllReduce;
  s.algo = requireAlgorithm(CollOp::AllReduce, algo);
  s.count = count;
  s.dtype = dtype;
  s.redop = redop;
  return s;
}

/// Hierarchical's inter-node phase is "ring" unless a test asks for another (the structural tests below
/// describe the ring variant; the rhd variant and "auto" have their own section).
GenOptions opts(uint32_t chunks, uint32_t channels, const std::string& inter = "ring") {
  GenOptions o;
  o.chunks = chunks;
  o.channels = channels;
  o.inter = *parseInterPhase(inter);
  return o;
}

/// Steps of one rank grouped by the role of their lane.
std::map<LaneRole, std::map<StepKind, uint64_t>> stepsByRole(const Schedule& s, uint32_t rank) {
  std::map<LaneRole, std::map<StepKind, uint64_t>> out;
  for (const Lane& l : s.lanes[rank])
    for (const Step& st : l.steps) ++out[l.role][st.kind];
  return out;
}

/// Generate, validate (races included), execute on fresh inputs and compare with the reference.
void verifyCase(const std::string& algo, const std::vector<uint32_t>& nodeOf, uint64_t count, uint32_t chunks,
                uint32_t channels, DType dtype, RedOp redop, InputKind kind, uint64_t seed,
                const std::string& inter = "ring") {
  const CollectiveSpec spec = arSpec(algo, count, dtype, redop);
  const GenOptions opt = opts(chunks, channels, inter);
  INFO("allreduce " << algo << " inter " << inter << " nodes " << describe(nodeOf) << " count " << count << " chunks "
                    << chunks << " channels " << channels << " " << toString(dtype) << " " << toString(redop)
                    << " seed " << seed << (kind == InputKind::SmallIntegers ? " small-integers" : " uniform"));
  const Schedule s = generate(spec, nodeOf, opt);
  const auto issues = validateAll(s);
  REQUIRE_MESSAGE(issues.empty(), (issues.empty() ? std::string() : issues.front().message));
  const VerifyResult r = verifyCollective(s, spec, seed, kind);
  CHECK_MESSAGE(r.ok, r.detail);
  CHECK(r.checked == count * s.nRanks);
}

/// The brief's numeric matrix for one algorithm, sampled so every rank count, layout, count, chunking,
/// channel count, dtype and redop appears, in about a hundred runs per algorithm.
void numericSweep(const std::string& algo, InputKind kind) {
  std::vector<std::vector<uint32_t>> layouts;
  for (uint32_t p : {1u, 2u, 3u, 4u, 5u, 8u, 16u}) layouts.push_back(nodesOf(p, p));
  layouts.push_back(nodesOf(8, 4));
  layouts.push_back(unevenLayout());
  layouts.push_back(nodesOf(5, 1));
  layouts.push_back(nodesOf(16, 4));
  const uint64_t counts[] = {1, 2, 7, 31, 1021, 65537};
  const DType dtypes[] = {DType::Float32, DType::BFloat16, DType::Float16};
  const RedOp redops[] = {RedOp::Sum, RedOp::Max, RedOp::Min};
  uint64_t seed = 1000 + std::hash<std::string>{}(algo) % 1000;
  uint32_t turn = 0;
  for (const auto& nodeOf : layouts)
    for (uint64_t count : counts) {
      // 65537 elements only where it stays cheap: the sweep must stay well under the suite's budget.
      if (count == 65537 && nodeOf.size() > 8) continue;
      const uint32_t chunks = (turn % 2) ? 3 : 1;
      const uint32_t channels = (turn / 2 % 2) ? 2 : 1;
      const DType dtype = dtypes[turn % 3];
      const RedOp redop = kind == InputKind::Uniform ? RedOp::Sum : redops[(turn / 3) % 3];
      verifyCase(algo, nodeOf, count, chunks, channels, dtype, redop, kind, seed++);
      ++turn;
    }
}

/// Dropping any one wait of `ranks` breaks validation: it ordered a real dependency (a race appears) or was
/// the last one on its flag (the flag is left unconsumed).
void checkEveryWaitMatters(const Schedule& base, std::initializer_list<uint32_t> ranks) {
  REQUIRE(validateAll(base).empty());
  uint32_t tried = 0;
  for (uint32_t r : ranks)
    for (std::size_t l = 0; l < base.lanes[r].size(); ++l)
      for (std::size_t i = 0; i < base.lanes[r][l].steps.size(); ++i) {
        if (base.lanes[r][l].steps[i].kind != StepKind::Wait) continue;
        Schedule s = base;
        s.lanes[r][l].steps.erase(s.lanes[r][l].steps.begin() + static_cast<std::ptrdiff_t>(i));
        INFO("rank " << r << " lane " << l << " step " << i);
        CHECK_FALSE(validateAll(s).empty());
        ++tried;
      }
  CHECK(tried > 20);
}

/// Every rank's output buffer after executing `s` on inputs drawn from `seed` (float32 only).
std::vector<std::vector<std::byte>> runOutputs(const Schedule& s, uint64_t seed) {
  HostMemory mem = HostMemory::allocate(s);
  const int in = s.bufferIndex("input"), out = s.bufferIndex("output");
  REQUIRE(in >= 0);
  REQUIRE(out >= 0);
  uint64_t x = seed * 2654435761u + 1;
  for (uint32_t r = 0; r < s.nRanks; ++r) {
    float* p = mem.as<float>(r, static_cast<uint16_t>(in));
    for (uint64_t i = 0; i < s.buffers[static_cast<std::size_t>(in)].count[r]; ++i) {
      x = x * 6364136223846793005ull + 1442695040888963407ull;
      p[i] = static_cast<float>(static_cast<double>(x >> 11) / 9007199254740992.0 * 2.0 - 1.0);
    }
  }
  execute(s, mem);
  std::vector<std::vector<std::byte>> outs;
  for (uint32_t r = 0; r < s.nRanks; ++r) outs.push_back(mem.bytes[r][static_cast<std::size_t>(out)]);
  return outs;
}

/// A profile with unrelated, awkward values, so a formula that only matches by coincidence fails.
Profile oddProfile() {
  Profile p;
  p.nvlink = LinkCost{0.73, 311};
  p.network = LinkCost{2.9, 37};
  p.local = LinkCost{0.21, 1777};
  p.reduceGBs = 613;
  p.flagUs = 0.47;
  p.dispatchUs = 3.3;
  p.proxyUs = 1.9;
  return p;
}

/// A profile where reductions are the bottleneck (slow reduce throughput, fast links).
Profile reduceBoundProfile() {
  Profile p = oddProfile();
  p.reduceGBs = 41;
  p.nvlink.bwGBs = 900;
  return p;
}

CostEstimate closedFormOf(const CollectiveSpec& spec, const GenOptions& opt, const std::vector<uint32_t>& nodeOf,
                          const Profile& profile) {
  const Topology topo = topologyPreset("dgx-h100", 1);
  const detail::GenContext ctx = detail::makeContext(spec, nodeOf, opt);
  return detail::findAlgorithm(spec.op, spec.algo).cost(detail::CostContext{spec, opt, topo, ctx, profile});
}

/// Closed form and uncontended timeline of one case; returns (closed form, timeline) totals.
std::pair<double, double> formVsTimeline(const std::string& algo, const std::vector<uint32_t>& nodeOf, uint64_t count,
                                         uint32_t chunks, uint32_t channels, const Profile& profile,
                                         DType dtype = DType::Float32, const std::string& inter = "ring") {
  const CollectiveSpec spec = arSpec(algo, count, dtype);
  const GenOptions opt = opts(chunks, channels, inter);
  const CostEstimate e = closedFormOf(spec, opt, nodeOf, profile);
  CHECK(e.totalUs == doctest::Approx(e.latencyUs + e.bandwidthUs + e.reduceUs).epsilon(1e-12));
  CHECK(e.latencyUs > 0);
  const Timeline t = simulateUncontended(generate(spec, nodeOf, opt), profile);
  return {e.totalUs, t.totalUs};
}

/// The even cases of the brief: several p, K, C, layouts, two profiles; closed form must equal the timeline.
void exactSweep(const std::string& algo) {
  const std::vector<std::vector<uint32_t>> layouts = {nodesOf(2, 2), nodesOf(4, 4), nodesOf(8, 8),  nodesOf(8, 4),
                                                      nodesOf(8, 2), nodesOf(4, 1), nodesOf(12, 4), nodesOf(16, 8)};
  const Profile profiles[] = {oddProfile(), reduceBoundProfile(), defaultProfile(topologyPreset("dgx-h100", 2))};
  for (const auto& nodeOf : layouts)
    for (uint32_t chunks : {1u, 3u, 4u})
      for (uint32_t channels : {1u, 2u})
        for (const Profile& profile : profiles)
          for (uint64_t unit : {1ull, 96ull, 65536ull}) {
            // divisible by every piece: channels x ranks x chunks (x node size for hierarchical's shards)
            const uint64_t count = unit * channels * chunks * uint64_t(nodeOf.size()) * 8;
            INFO(algo << " nodes " << describe(nodeOf) << " count " << count << " chunks " << chunks << " channels "
                      << channels << " profile " << profile.source);
            const auto [form, timeline] = formVsTimeline(algo, nodeOf, count, chunks, channels, profile);
            CHECK(form == doctest::Approx(timeline).epsilon(1e-9));
          }
}

}  // namespace

// ---------------------------------------------------------------------------------------------------------
// registry and bad input

TEST_CASE("allreduce: the registry lists one-shot two-shot ring hierarchical in that order with closed forms") {
  const auto names = algorithmsFor(CollOp::AllReduce);
  REQUIRE(names.size() == 4);
  for (std::size_t i = 0; i < 4; ++i) CHECK(std::string(toString(names[i])) == kAllReduce[i]);
  for (const char* name : kAllReduce) {
    const auto& def = detail::findAlgorithm(CollOp::AllReduce, requireAlgorithm(CollOp::AllReduce, name));
    const bool hasSetup = def.setup != nullptr;  // every all-reduce declares scratch
    CHECK(hasSetup);
    const bool hasEmit = def.emit != nullptr, hasCost = def.cost != nullptr;
    CHECK(hasEmit);
    CHECK(hasCost);
    CHECK(std::string(def.summary).size() > 20);
  }
}

TEST_CASE("allreduce: count 0 and chunks 0 and channels 0 are InvalidArgument and an unknown algorithm is NotFound") {
  for (const char* name : kAllReduce) {
    INFO(name);
    try {
      generate(arSpec(name, 0), nodesOf(4, 4));
      FAIL("count 0 accepted");
    } catch (const Error& e) {
      CHECK(e.code() == ErrorCode::InvalidArgument);
      CHECK(std::string(e.what()).find("count") != std::string::npos);
    }
    CHECK_THROWS_AS(generate(arSpec(name, 16), nodesOf(4, 4), opts(0, 1)), Error);
    CHECK_THROWS_AS(generate(arSpec(name, 16), nodesOf(4, 4), opts(1, 0)), Error);
    CHECK_THROWS_AS(generate(arSpec(name, 16), {}), Error);
  }
  // A name that is no algorithm, and an algorithm without an all-reduce generator.
  CollectiveSpec direct = arSpec("ring", 16);
  direct.algo = Algorithm::Direct;
  for (const auto& attempt : std::vector<std::function<void()>>{
           [] { generate(arSpec("butterfly", 16), nodesOf(4, 4)); }, [&] { generate(direct, nodesOf(4, 4)); }}) {
    try {
      attempt();
      FAIL("unknown algorithm accepted");
    } catch (const Error& e) {
      CHECK(e.code() == ErrorCode::NotFound);
      CHECK(std::string(e.what()).find("hierarchical") != std::string::npos);
    }
  }
}

TEST_CASE("allreduce: a closed form with a zero bandwidth in its profile is InvalidArgument naming the field") {
  Profile p = oddProfile();
  p.reduceGBs = 0;
  try {
    closedFormOf(arSpec("ring", 1024), opts(1, 1), nodesOf(4, 4), p);
    FAIL("zero reduce throughput accepted");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::InvalidArgument);
    CHECK(std::string(e.what()).find("reduceGBs") != std::string::npos);
  }
}

// ---------------------------------------------------------------------------------------------------------
// structure

TEST_CASE("allreduce: one rank is a single local copy per channel for every algorithm") {
  for (const char* name : kAllReduce)
    for (uint32_t channels : {1u, 2u}) {
      INFO(name << " channels " << channels);
      const Schedule s = generate(arSpec(name, 101), {0}, opts(3, channels));
      REQUIRE(s.lanes.size() == 1);
      CHECK(s.lanes[0].size() == channels);
      CHECK(s.stepCount() == channels);
      for (const Lane& l : s.lanes[0]) {
        REQUIRE(l.steps.size() == 1);
        CHECK(l.steps[0].kind == StepKind::Copy);
        CHECK(l.steps[0].link == LinkClass::Local);
      }
      CHECK(s.nFlags == 0);
      CHECK(verifyCollective(s, arSpec(name, 101), 5, InputKind::SmallIntegers).ok);
    }
}

TEST_CASE("allreduce one-shot: puts stay intra and proxy puts go to inter-send lanes with staggered peers") {
  const uint32_t chunks = 3;
  const Schedule s = generate(arSpec("one-shot", 3 * 64), nodesOf(8, 4), opts(chunks, 1));
  for (uint32_t r = 0; r < 8; ++r) {
    INFO("rank " << r);
    auto by = stepsByRole(s, r);
    CHECK(by[LaneRole::Intra][StepKind::Put] == chunks * 3);
    CHECK(by[LaneRole::InterSend][StepKind::ProxyPut] == chunks * 4);
    CHECK(by[LaneRole::InterSend][StepKind::Put] == 0);
    CHECK(by[LaneRole::Intra][StepKind::ProxyPut] == 0);
    CHECK(by[LaneRole::Intra][StepKind::Reduce] == chunks * 7);
    // Within each chunk the peers come in the order r+1, r+2, ... (mod p), split by link.
    std::vector<uint32_t> intraOrder, interOrder;
    for (const Lane& l : s.lanes[r])
      for (const Step& st : l.steps)
        if ((st.kind == StepKind::Put || st.kind == StepKind::ProxyPut) && st.a.offset == 0)
          (l.role == LaneRole::Intra ? intraOrder : interOrder).push_back(st.dst.rank);
    std::vector<uint32_t> intra, inter;
    for (uint32_t i = 1; i < 8; ++i) ((r + i) % 8 / 4 == r / 4 ? intra : inter).push_back((r + i) % 8);
    CHECK(intraOrder == intra);
    CHECK(interOrder == inter);
  }
}

TEST_CASE("allreduce one-shot: every rank reduces the p contributions in rank order") {
  const uint32_t p = 5;
  const Schedule s = generate(arSpec("one-shot", 40), nodesOf(p, p), opts(1, 1));
  const int scratch = s.bufferIndex("scratch");
  REQUIRE(scratch >= 0);
  for (uint32_t r = 0; r < p; ++r) {
    std::vector<uint32_t> sources;  // which rank's data each Reduce operand holds
    for (const Lane& l : s.lanes[r])
      for (const Step& st : l.steps) {
        if (st.kind != StepKind::Reduce) continue;
        auto owner = [&](const BufRef& b) -> int64_t {
          if (b.buffer == s.bufferIndex("input")) return r;
          if (b.buffer == scratch) return static_cast<int64_t>(b.offset / 40);
          return -1;  // the running result in output
        };
        if (sources.empty()) sources.push_back(static_cast<uint32_t>(owner(st.a)));
        CHECK(owner(st.b) >= 0);
        sources.push_back(static_cast<uint32_t>(owner(st.b)));
      }
    std::vector<uint32_t> expected(p);
    for (uint32_t j = 0; j < p; ++j) expected[j] = j;
    CHECK(sources == expected);
  }
}

TEST_CASE("allreduce two-shot: rank j reduces shard j and gathers it back with one put per peer and chunk") {
  const uint32_t p = 8, chunks = 2;
  const Schedule s = generate(arSpec("two-shot", p * chunks * 8), nodesOf(p, 4), opts(chunks, 1));
  // scratch: one shard-sized slot per source rank
  REQUIRE(s.bufferIndex("scratch") >= 0);
  CHECK(s.buffers[static_cast<std::size_t>(s.bufferIndex("scratch"))].count[0] == p * chunks * 8);
  for (uint32_t r = 0; r < p; ++r) {
    INFO("rank " << r);
    auto by = stepsByRole(s, r);
    // reduce-scatter and all-gather: one message per peer and chunk each
    CHECK(by[LaneRole::Intra][StepKind::Put] == 2 * chunks * 3);
    CHECK(by[LaneRole::InterSend][StepKind::ProxyPut] == 2 * chunks * 4);
    CHECK(by[LaneRole::Intra][StepKind::Reduce] == chunks * (p - 1));
    // every reduction writes only this rank's shard of the output
    for (const Lane& l : s.lanes[r])
      for (const Step& st : l.steps)
        if (st.kind == StepKind::Reduce) {
          CHECK(st.dst.buffer == s.bufferIndex("output"));
          CHECK(st.dst.offset / 16 == r);
        }
  }
}

TEST_CASE("allreduce ring: every rank sends only to its successor and only node boundaries use the network") {
  const uint32_t p = 8, chunks = 3;
  const Schedule s = generate(arSpec("ring", p * chunks * 5), nodesOf(p, 4), opts(chunks, 1));
  for (uint32_t r = 0; r < p; ++r) {
    INFO("rank " << r);
    const bool boundary = r % 4 == 3;
    uint64_t sends = 0, reduces = 0;
    for (const Lane& l : s.lanes[r])
      for (const Step& st : l.steps) {
        if (st.kind == StepKind::Put || st.kind == StepKind::ProxyPut) {
          ++sends;
          CHECK(st.dst.rank == (r + 1) % p);
          CHECK(st.kind == (boundary ? StepKind::ProxyPut : StepKind::Put));
          CHECK(l.role == (boundary ? LaneRole::InterSend : LaneRole::Intra));
        }
        if (st.kind == StepKind::Reduce) {
          ++reduces;
          CHECK(l.role == LaneRole::Intra);
          CHECK(st.link == LinkClass::Local);
        }
      }
    CHECK(sends == 2 * (p - 1) * chunks);
    CHECK(reduces == (p - 1) * chunks);
  }
}

TEST_CASE("allreduce hierarchical: only shard owners cross nodes and only to the same shard's owner") {
  const Schedule s = generate(arSpec("hierarchical", 8 * 2 * 7), nodesOf(8, 4), opts(2, 1));
  // scratch holds only owned shards: 4 phase-1 slots + 1 ring slot of count/4 elements each
  REQUIRE(s.bufferIndex("scratch") >= 0);
  CHECK(s.buffers[static_cast<std::size_t>(s.bufferIndex("scratch"))].count[0] == 5 * 112 / 4);
  for (uint32_t r = 0; r < 8; ++r)
    for (const Lane& l : s.lanes[r])
      for (const Step& st : l.steps) {
        if (st.kind == StepKind::ProxyPut) {
          CHECK(l.role == LaneRole::InterSend);
          CHECK(st.dst.rank == (r + 4) % 8);  // same local index on the other node
        }
        if (st.kind == StepKind::Put) {
          CHECK(l.role == LaneRole::Intra);
          CHECK(st.dst.rank / 4 == r / 4);
        }
      }
  // per rank: phase 1 and phase 3 send 3 peers x K = 2 groups (one position = one piece each); the ring
  // 2 x (M-1) x Kr proxy puts with Kr = ceil(K / M) = 1
  for (uint32_t r = 0; r < 8; ++r) {
    auto by = stepsByRole(s, r);
    CHECK(by[LaneRole::Intra][StepKind::Put] == 2 * 3 * 2);
    CHECK(by[LaneRole::InterSend][StepKind::ProxyPut] == 2 * 1 * 1);
  }
}

TEST_CASE("allreduce hierarchical: NVLink messages per rank do not grow with the node count") {
  // Phases 1 and 3 move K groups per shard (two pieces where a group spans ring blocks), whatever M is;
  // only the ring's 2(M-1) proxy puts grow with M.
  const uint32_t chunks = 2;
  for (uint32_t nodes : {4u, 8u, 16u}) {
    INFO("nodes " << nodes);
    const uint32_t p = 4 * nodes;
    const Schedule s = generate(arSpec("hierarchical", uint64_t(p) * 6), nodesOf(p, 4), opts(chunks, 1));
    for (uint32_t r = 0; r < p; r += 5) {
      auto by = stepsByRole(s, r);
      CHECK(by[LaneRole::Intra][StepKind::Put] == 2 * 3 * chunks * 2);
      CHECK(by[LaneRole::InterSend][StepKind::ProxyPut] == 2 * (nodes - 1));
      uint64_t steps = 0;
      for (const Lane& l : s.lanes[r]) steps += l.steps.size();
      // ring: RS put + wait and AG put + wait on the sender, wait + reduce + signal on the reducer
      CHECK(steps <= 7 * (nodes - 1) + 4 * 3 * chunks * 2 + 16);
    }
  }
}

TEST_CASE("allreduce hierarchical: phase-1 pieces tile every owner's shard once including where the walk wraps") {
  // Three nodes of two, one group per shard (K = 1): on nodes 0 and 1 the group wraps from element 0 of the
  // shard to its top, on node 2 it does not; every node still cuts it into the same number of pieces.
  for (uint64_t count : {60ull, 61ull, 1000ull}) {
    INFO("count " << count);
    const Schedule s = generate(arSpec("hierarchical", count), nodesOf(6, 2), opts(1, 1));
    const int scratch = s.bufferIndex("scratch"), input = s.bufferIndex("input");
    REQUIRE(scratch >= 0);
    const uint64_t shard0 = (count + 1) / 2;  // shard s = [s * shard0, ...) of the part
    for (uint32_t r = 0; r < 6; ++r) {
      std::vector<uint32_t> covered(count, 0);
      uint32_t pieces = 0;
      for (const Lane& l : s.lanes[r])
        for (const Step& st : l.steps)
          if (st.kind == StepKind::Put && st.dst.buffer == scratch) {
            CHECK(st.a.buffer == input);
            for (uint64_t e = st.a.offset; e < st.a.offset + st.count; ++e) ++covered[e];
            ++pieces;
          }
      CHECK(pieces == 2);
      const uint32_t peerShard = 1 - r % 2;
      for (uint64_t e = 0; e < count; ++e) CHECK(covered[e] == (e / shard0 == peerShard ? 1u : 0u));
    }
    CHECK(validateAll(s).empty());
    CHECK(verifyCollective(s, arSpec("hierarchical", count), 11, InputKind::SmallIntegers).ok);
  }
}

TEST_CASE("allreduce hierarchical: more chunks than nodes cut every ring block") {
  // M = 2, K = 5: Kr = ceil(5/2) = 3 units per block, 6 positions in 5 groups.
  const Schedule s = generate(arSpec("hierarchical", 6 * 2 * 3 * 7), nodesOf(6, 3), opts(5, 1));
  for (uint32_t r = 0; r < 6; ++r) {
    auto by = stepsByRole(s, r);
    CHECK(by[LaneRole::InterSend][StepKind::ProxyPut] == 2 * 1 * 3);
    CHECK(by[LaneRole::Intra][StepKind::Put] == 2 * 2 * 5);  // 5 groups, none spanning two blocks
  }
  ValidateOptions vo;
  vo.checkRaces = true;
  CHECK(validateAll(s, vo).empty());
  CHECK(verifyCollective(s, arSpec("hierarchical", 252), 12, InputKind::SmallIntegers).ok);
}

TEST_CASE("allreduce: dropping any one wait from a hierarchical schedule breaks validation") {
  // Every wait orders a real dependency (a race appears) or is the last one on its flag (the flag is left
  // unconsumed). Checked for every wait of one rank per node position, on three nodes with wrapping groups.
  checkEveryWaitMatters(generate(arSpec("hierarchical", 6 * 3 * 5), nodesOf(6, 2), opts(2, 1)), {0, 3, 5});
}

TEST_CASE("allreduce hierarchical: 1024 ranks take 7 steps per ring position plus O(G K) steps per rank") {
  // The scale target of the Foundation issue: 128 nodes of 8, every unit non-empty, chunks 1 and 4. The
  // ring costs 7 steps per position (sender: put + wait twice; reducer: wait, reduce, signal); phases 1
  // and 3 about 60 per group (7 peers x 2 pieces, twice, plus 7 waits and 14 reductions).
  const auto nodeOf = nodesOf(1024, 8);
  for (uint32_t chunks : {1u, 4u}) {
    INFO("chunks " << chunks);
    const Schedule s = generate(arSpec("hierarchical", 1 << 20, DType::BFloat16), nodeOf, opts(chunks, 1));
    CHECK(s.stepCount() <= 1024ull * (7 * 127 + 60 * chunks));
    CHECK(countKind(s, StepKind::ProxyPut) == 1024ull * 2 * 127);
    // P1 and P3: 7 peers x K groups x 2 pieces (every group spans ring blocks)
    CHECK(countKind(s, StepKind::Put) == 1024ull * 2 * 7 * chunks * 2);
  }
}

TEST_CASE("allreduce hierarchical: one node has no network phase and one rank per node has no NVLink phase") {
  const Schedule oneNode = generate(arSpec("hierarchical", 96), nodesOf(4, 4), opts(2, 1));
  CHECK(countKind(oneNode, StepKind::ProxyPut) == 0);
  CHECK(countKind(oneNode, StepKind::Put) > 0);
  for (const auto& lanes : oneNode.lanes)
    for (const Lane& l : lanes) CHECK(l.role == LaneRole::Intra);
  const Schedule railOnly = generate(arSpec("hierarchical", 96), nodesOf(4, 1), opts(2, 1));
  CHECK(countKind(railOnly, StepKind::Put) == 0);
  CHECK(countKind(railOnly, StepKind::ProxyPut) == 2 * 3 * 2 * 4);
  // with one rank per node, hierarchical is the ring over the nodes
  const Schedule ring = generate(arSpec("ring", 96), nodesOf(4, 1), opts(2, 1));
  CHECK(railOnly.stepCount() == ring.stepCount());
  CHECK(verifyCollective(oneNode, arSpec("hierarchical", 96), 3, InputKind::SmallIntegers).ok);
  CHECK(verifyCollective(railOnly, arSpec("hierarchical", 96), 4, InputKind::SmallIntegers).ok);
}

TEST_CASE("allreduce hierarchical: a smaller node's ranks own several shards and still produce every element") {
  // S = 3 shards; node 1 has 2 ranks, so its rank 0 owns shards 0 and 2 and joins two inter-node rings.
  const Schedule s = generate(arSpec("hierarchical", 3 * 3 * 5), unevenLayout(), opts(1, 1));
  std::set<uint32_t> ringPeersOfRank3;
  for (const Lane& l : s.lanes[3])
    for (const Step& st : l.steps)
      if (st.kind == StepKind::ProxyPut) ringPeersOfRank3.insert(st.dst.rank);
  CHECK(ringPeersOfRank3 == std::set<uint32_t>{5, 7});  // owners of shards 0 and 2 on node 2
  CHECK(validateAll(s).empty());
  CHECK(verifyCollective(s, arSpec("hierarchical", 45), 9, InputKind::SmallIntegers).ok);
}

TEST_CASE("allreduce: channels use disjoint lanes and disjoint elements") {
  for (const char* name : kAllReduce) {
    INFO(name);
    const uint64_t count = 2 * 8 * 3 * 4;
    const Schedule one = generate(arSpec(name, count), nodesOf(8, 4), opts(3, 1));
    const Schedule two = generate(arSpec(name, count), nodesOf(8, 4), opts(3, 2));
    for (uint32_t r = 0; r < 8; ++r) {
      CHECK(two.lanes[r].size() == 2 * one.lanes[r].size());
      // every lane touches output elements of one channel's half only
      for (const Lane& l : two.lanes[r]) {
        std::set<bool> halves;
        for (const Step& st : l.steps)
          if ((st.kind == StepKind::Put || st.kind == StepKind::ProxyPut || st.kind == StepKind::Reduce) &&
              st.dst.buffer == two.bufferIndex("output"))
            halves.insert(st.dst.offset >= count / 2);
        CHECK(halves.size() <= 1);
      }
    }
  }
}

TEST_CASE("allreduce: pieces that come out empty emit no steps and no zero-byte messages") {
  for (const char* name : kAllReduce)
    for (const auto& nodeOf : {nodesOf(8, 8), nodesOf(8, 4), unevenLayout()}) {
      INFO(name << " nodes " << describe(nodeOf));
      const Schedule s = generate(arSpec(name, 1), nodeOf, opts(3, 2));
      for (const auto& lanes : s.lanes)
        for (const Lane& l : lanes) {
          CHECK_FALSE(l.steps.empty());
          for (const Step& st : l.steps)
            if (st.kind == StepKind::Put || st.kind == StepKind::ProxyPut || st.kind == StepKind::Reduce ||
                st.kind == StepKind::Copy)
              CHECK(st.count > 0);
        }
      CHECK(validateAll(s).empty());
      CHECK(verifyCollective(s, arSpec(name, 1), 2, InputKind::SmallIntegers).ok);
    }
}

TEST_CASE("allreduce: every schedule validates with the race check across ranks layouts chunks and channels") {
  const std::vector<std::vector<uint32_t>> layouts = {{0},
                                                      {0, 0},
                                                      {0, 1},
                                                      {0, 0, 0},
                                                      {0, 1, 2},
                                                      nodesOf(5, 5),
                                                      {0, 0, 1, 1, 1},
                                                      nodesOf(8, 4),
                                                      unevenLayout(),
                                                      {0, 1, 1, 1, 2, 2, 3, 3},
                                                      {7, 7, 3, 3, 3, 9},
                                                      nodesOf(16, 4)};
  ValidateOptions vo;
  vo.checkRaces = true;
  for (const char* name : kAllReduce)
    for (const auto& nodeOf : layouts)
      for (uint64_t count : {2ull, 7ull, 103ull})
        for (uint32_t chunks : {1u, 3u})
          for (uint32_t channels : {1u, 2u}) {
            const Schedule s = generate(arSpec(name, count), nodeOf, opts(chunks, channels));
            const auto issues = validateAll(s, vo);
            INFO(name << " nodes " << describe(nodeOf) << " count " << count << " chunks " << chunks << " channels "
                      << channels);
            CHECK_MESSAGE(issues.empty(), (issues.empty() ? std::string() : issues.front().message));
          }
}

TEST_CASE("allreduce: dropping any one wait from a ring breaks validation") {
  // Every Wait of the ring orders a real dependency: without it the validator finds a race or leaves the
  // flag unconsumed. Checked for each wait of rank 1.
  const Schedule base = generate(arSpec("ring", 4 * 2 * 3), nodesOf(4, 2), opts(2, 1));
  uint32_t tried = 0;
  for (std::size_t l = 0; l < base.lanes[1].size(); ++l)
    for (std::size_t i = 0; i < base.lanes[1][l].steps.size(); ++i) {
      if (base.lanes[1][l].steps[i].kind != StepKind::Wait) continue;
      Schedule s = base;
      s.lanes[1][l].steps.erase(s.lanes[1][l].steps.begin() + static_cast<std::ptrdiff_t>(i));
      INFO("lane " << l << " step " << i);
      CHECK_FALSE(validateAll(s).empty());
      ++tried;
    }
  CHECK(tried > 4);
}

TEST_CASE("allreduce: without its arrival wait a one-shot reducer races with the incoming puts") {
  // Remove rank 1's wait and the signals it counted, so flag accounting stays clean: what is left is the
  // data race between the peers' puts into rank 1's scratch and rank 1's reductions reading it.
  Schedule s = generate(arSpec("one-shot", 8), nodesOf(4, 4), opts(1, 1));
  REQUIRE(validateAll(s).empty());
  uint32_t flag = 0;
  bool removed = false;
  for (Lane& l : s.lanes[1])
    for (std::size_t i = 0; i < l.steps.size() && !removed; ++i)
      if (l.steps[i].kind == StepKind::Wait) {
        flag = l.steps[i].flag.id;
        l.steps.erase(l.steps.begin() + static_cast<std::ptrdiff_t>(i));
        removed = true;
      }
  REQUIRE(removed);
  for (auto& lanes : s.lanes)
    for (Lane& l : lanes)
      for (Step& st : l.steps)
        if ((st.flags & kStepSignal) && st.flag.rank == 1 && st.flag.id == flag) st.flags = 0;
  const auto issues = validateAll(s);
  REQUIRE_FALSE(issues.empty());
  CHECK(issues.front().message.find("race") != std::string::npos);
}

TEST_CASE("allreduce: a large cluster generates and validates for every algorithm") {
  // 1024 ranks (128 nodes of 8) with few elements: most pieces are empty, which must stay consistent; then
  // full-size pieces on 256 and 64 ranks.
  const auto nodeOf = nodesOf(1024, 8);
  for (const char* name : {"ring", "hierarchical"}) {
    INFO(name);
    const Schedule s = generate(arSpec(name, 7), nodeOf, opts(2, 1));
    CHECK(s.nRanks == 1024);
    ValidateOptions vo;
    vo.checkRaces = false;
    CHECK(validateAll(s, vo).empty());
  }
  const Schedule h = generate(arSpec("hierarchical", 4096), nodesOf(256, 8), opts(1, 1));
  CHECK(countKind(h, StepKind::ProxyPut) == 256 * 2 * 31);
  const Schedule o = generate(arSpec("one-shot", 3), nodesOf(64, 8), opts(1, 1));
  CHECK(countKind(o, StepKind::Put) + countKind(o, StepKind::ProxyPut) == 64 * 63);
  CHECK(validateAll(o).empty());
}

// ---------------------------------------------------------------------------------------------------------
// numerics on the CPU reference executor

TEST_CASE("allreduce one-shot: bit-exact on small integers over ranks layouts counts dtypes and redops") {
  numericSweep("one-shot", InputKind::SmallIntegers);
}
TEST_CASE("allreduce two-shot: bit-exact on small integers over ranks layouts counts dtypes and redops") {
  numericSweep("two-shot", InputKind::SmallIntegers);
}
TEST_CASE("allreduce ring: bit-exact on small integers over ranks layouts counts dtypes and redops") {
  numericSweep("ring", InputKind::SmallIntegers);
}
TEST_CASE("allreduce hierarchical: bit-exact on small integers over ranks layouts counts dtypes and redops") {
  numericSweep("hierarchical", InputKind::SmallIntegers);
}
TEST_CASE("allreduce: uniform inputs stay within the summation bound for every algorithm") {
  for (const char* name : kAllReduce) numericSweep(name, InputKind::Uniform);
}

TEST_CASE("allreduce: every algorithm leaves identical bits on every rank") {
  // One-shot reduces in rank order everywhere; the others compute each value once and copy it.
  for (const char* name : kAllReduce)
    for (const auto& nodeOf : {nodesOf(5, 5), nodesOf(8, 4), unevenLayout()}) {
      INFO(name << " nodes " << describe(nodeOf));
      const Schedule s = generate(arSpec(name, 999), nodeOf, opts(3, 2));
      const auto outs = runOutputs(s, 77);
      for (uint32_t r = 1; r < s.nRanks; ++r) CHECK(outs[r] == outs[0]);
    }
}

// ---------------------------------------------------------------------------------------------------------
// closed forms against the uncontended timeline

TEST_CASE("allreduce one-shot: closed form equals the uncontended timeline on even cases") { exactSweep("one-shot"); }
TEST_CASE("allreduce two-shot: closed form equals the uncontended timeline on even cases") { exactSweep("two-shot"); }
TEST_CASE("allreduce ring: closed form equals the uncontended timeline on even cases") { exactSweep("ring"); }
TEST_CASE("allreduce hierarchical: closed form equals the uncontended timeline on even cases") {
  exactSweep("hierarchical");
}

TEST_CASE("allreduce hierarchical: closed form equals the timeline on 16 nodes and with more chunks than nodes") {
  // Groups of several ring blocks (two pieces each), single-unit groups, and Kr = ceil(K/M) > 1.
  struct Case {
    uint32_t ranks, perNode, chunks;
  };
  const Case cases[] = {{64, 4, 1}, {64, 4, 5}, {64, 4, 20}, {6, 3, 5}, {9, 3, 7}, {16, 2, 3}};
  const Profile profiles[] = {oddProfile(), reduceBoundProfile(), defaultProfile(topologyPreset("dgx-h100", 2))};
  for (const Case& c : cases)
    for (uint32_t channels : {1u, 2u})
      for (const Profile& profile : profiles)
        for (uint64_t unit : {3ull, 4096ull}) {
          const uint32_t nodes = c.ranks / c.perNode, ringChunks = (c.chunks + nodes - 1) / nodes;
          const uint64_t count = unit * channels * c.perNode * nodes * ringChunks;  // every unit the same size
          INFO("nodes " << nodes << " of " << c.perNode << " chunks " << c.chunks << " channels " << channels
                        << " count " << count << " profile " << profile.source);
          const auto [form, timeline] =
              formVsTimeline("hierarchical", nodesOf(c.ranks, c.perNode), count, c.chunks, channels, profile);
          CHECK(form == doctest::Approx(timeline).epsilon(1e-9));
        }
}

TEST_CASE("allreduce: closed forms bound the timeline from above on uneven counts within 1e-3") {
  // Counts that do not divide: every piece is priced as the largest one.
  for (const char* name : kAllReduce)
    for (const auto& nodeOf : {nodesOf(8, 8), nodesOf(8, 4), nodesOf(6, 2)})
      for (uint64_t count : {1021ull, 65537ull, 1000003ull}) {
        INFO(name << " nodes " << describe(nodeOf) << " count " << count);
        const auto [form, timeline] = formVsTimeline(name, nodeOf, count, 3, 2, oddProfile(), DType::BFloat16);
        CHECK(form >= timeline * (1 - 1e-12));
        CHECK(form <= timeline * (1 + 1e-3));
      }
}

TEST_CASE("allreduce: closed forms bound the timeline from above on uneven nodes") {
  // Nodes of 3, 2 and 3: prices of the largest node and the slowest hop; documented as a bound (it can be
  // loose on other layouts and profiles). Here within 6%: hierarchical (ring inter phase) gives +5.8% since a
  // ProxyPut's latency overlaps (+3.9% before; its tightness moves with the profile either way: +6.8% with
  // network.alphaUs 0 under this profile, which prices alike under both rules).
  for (const char* name : kAllReduce)
    for (uint64_t count : {48ull, 4800ull, 480000ull}) {
      INFO(std::string(name) << " count " << count);
      const auto [form, timeline] = formVsTimeline(name, unevenLayout(), count, 2, 1, oddProfile());
      CHECK(form >= timeline * (1 - 1e-12));
      CHECK(form <= timeline * 1.06);
    }
}

TEST_CASE("allreduce: the formula text shows the critical path and its total") {
  const CostEstimate e = closedFormOf(arSpec("ring", 1 << 24), opts(2, 1), nodesOf(8, 8), oddProfile());
  CHECK(e.formula.find("ring") != std::string::npos);
  CHECK(e.formula.find("critical path") != std::string::npos);
  CHECK(e.formula.find("t_nv") != std::string::npos);
  CHECK(e.formula.find(mk::strprintf("%.6g", e.totalUs)) != std::string::npos);
  CHECK(e.bandwidthUs > 10 * e.latencyUs);  // 64 MiB: bandwidth dominates
  // A Reduce slower than a send puts the reducers on the critical path.
  const CostEstimate slow = closedFormOf(arSpec("ring", 1 << 24), opts(2, 1), nodesOf(8, 8), reduceBoundProfile());
  CHECK(slow.reduceUs > slow.bandwidthUs);
  CHECK(slow.formula.find("t_red") != std::string::npos);
}

TEST_CASE("allreduce: one-shot wins at 8 bytes and ring and two-shot win at 256 MiB on 8 ranks") {
  const Topology topo = topologyPreset("dgx-h100", 1);
  const Profile profile = defaultProfile(topo);
  auto cost = [&](const char* algo, uint64_t bytes) {
    return closedForm(arSpec(algo, bytes / 4), opts(1, 1), topo, 8, profile).totalUs;
  };
  CHECK(cost("one-shot", 8) < cost("ring", 8));
  CHECK(cost("one-shot", 8) < cost("two-shot", 8));
  const uint64_t big = 256ull << 20;
  CHECK(cost("ring", big) < cost("one-shot", big));
  CHECK(cost("two-shot", big) < cost("one-shot", big));
  // on 4 nodes the hierarchical algorithm beats the flat ring for large messages
  const Topology four = topologyPreset("dgx-h100", 4);
  const Profile p4 = defaultProfile(four);
  CHECK(closedForm(arSpec("hierarchical", big / 4), opts(4, 1), four, 32, p4).totalUs <
        closedForm(arSpec("ring", big / 4), opts(4, 1), four, 32, p4).totalUs);
}

// ---------------------------------------------------------------------------------------------------------
// hierarchical's inter-node phase: recursive halving/doubling ("rhd") and "auto"

namespace {

/// Layouts for the rhd variant: power-of-two and other node counts (folds), one rank per node, uneven nodes.
std::vector<std::vector<uint32_t>> rhdLayouts() {
  std::vector<std::vector<uint32_t>> l;
  for (uint32_t nodes : {2u, 3u, 4u, 5u, 6u, 7u, 8u}) l.push_back(nodesOf(nodes * 2, 2));
  l.push_back(nodesOf(12, 4));  // 3 nodes of 4
  l.push_back(nodesOf(5, 1));   // 5 nodes of one rank: the fold on single-rank nodes
  l.push_back(nodesOf(8, 1));
  l.push_back(unevenLayout());               // nodes of 3, 2, 3
  l.push_back({0, 0, 1, 2, 2, 2, 3, 4, 4});  // 5 nodes of 2, 1, 3, 1, 2
  l.push_back({0, 1, 0, 1, 2, 2, 0});        // interleaved ranks, nodes of 3, 2, 2
  return l;
}

}  // namespace

TEST_CASE("allreduce hierarchical rhd: bit-exact on small integers over node counts layouts counts and chunks") {
  const uint64_t counts[] = {1, 5, 31, 1021, 4096};
  const RedOp redops[] = {RedOp::Sum, RedOp::Max, RedOp::Min};
  const DType dtypes[] = {DType::Float32, DType::BFloat16, DType::Float16};
  uint64_t seed = 7100;
  uint32_t turn = 0;
  for (const auto& nodeOf : rhdLayouts())
    for (uint64_t count : counts)
      for (uint32_t chunks : {1u, 3u}) {
        const uint32_t channels = (turn % 2) ? 2 : 1;
        verifyCase("hierarchical", nodeOf, count, chunks, channels, dtypes[turn % 3], redops[(turn / 3) % 3],
                   InputKind::SmallIntegers, seed++, "rhd");
        ++turn;
      }
}

TEST_CASE("allreduce hierarchical rhd: uniform inputs stay within the summation bound and ranks agree") {
  for (const auto& nodeOf : {nodesOf(16, 2), nodesOf(12, 2), unevenLayout()}) {
    verifyCase("hierarchical", nodeOf, 65537, 4, 1, DType::Float32, RedOp::Sum, InputKind::Uniform, 31, "rhd");
    const Schedule s = generate(arSpec("hierarchical", 999), nodeOf, opts(3, 2, "rhd"));
    const auto outs = runOutputs(s, 78);
    for (uint32_t r = 1; r < s.nRanks; ++r) CHECK(outs[r] == outs[0]);
  }
}

TEST_CASE("allreduce hierarchical rhd: 2 log2 M exchanges per chunk and owner and the fold costs two more") {
  // 8 nodes of 4 (power of two): per owner 2 * 3 ProxyPuts per chunk; 6 nodes: M2 = 4, 2 hosts and 2 extras
  // add one ProxyPut each way per chunk and owner.
  for (uint32_t chunks : {1u, 4u}) {
    INFO("chunks " << chunks);
    const Schedule p2 = generate(arSpec("hierarchical", 32 * 4 * 64), nodesOf(32, 4), opts(chunks, 1, "rhd"));
    CHECK(countKind(p2, StepKind::ProxyPut) == 32ull * 2 * 3 * chunks);
    const Schedule fold = generate(arSpec("hierarchical", 24 * 4 * 64), nodesOf(24, 4), opts(chunks, 1, "rhd"));
    CHECK(countKind(fold, StepKind::ProxyPut) == (16ull * 2 * 2 + 2 * 4 * 2) * chunks);
    // phases 1 and 3: two NVLink puts per peer and chunk each (phase 1: the half sent at step 0, then the
    // kept half; phase 3: the kept half, then the half the last doubling step delivers)
    CHECK(countKind(p2, StepKind::Put) == 32ull * 3 * chunks * 4);
  }
  // 1024 ranks: the inter phase is 2 log2(128) = 14 sends per owner, not 2 * 127
  const Schedule big = generate(arSpec("hierarchical", 1 << 20, DType::BFloat16), nodesOf(1024, 8), opts(1, 1, "rhd"));
  CHECK(countKind(big, StepKind::ProxyPut) == 1024ull * 14);
  // per rank: 14 sends, their waits and reductions, and phases 1 and 3 in halves (4 x 7 puts, 2 x 7
  // reductions and their waits): about 115 steps, against 2 x 127 sends alone for a ring over the nodes
  CHECK(big.stepCount() < 1024ull * 128);
}

TEST_CASE("allreduce hierarchical rhd: every wait matters on a folded layout") {
  // 3 nodes of 2: ranks 0 (host node 0), 3 (plain node 1), 5 (extra node 2)
  checkEveryWaitMatters(generate(arSpec("hierarchical", 6 * 3 * 8), nodesOf(6, 2), opts(2, 1, "rhd")), {0, 3, 5});
}

TEST_CASE("allreduce hierarchical rhd: closed form equals the uncontended timeline on even cases") {
  const Profile profiles[] = {oddProfile(), reduceBoundProfile(), defaultProfile(topologyPreset("dgx-h100", 2))};
  struct Case {
    uint32_t ranks, perNode;
  };
  // powers of two, folds (3, 5, 6, 7 nodes), one rank per node, one node
  const Case cases[] = {{4, 2}, {6, 2}, {8, 2}, {10, 2}, {12, 4}, {14, 2}, {16, 2}, {32, 4}, {5, 1}, {8, 1}, {4, 4}};
  for (const Case& c : cases)
    for (uint32_t chunks : {1u, 3u, 4u})
      for (uint32_t channels : {1u, 2u})
        for (const Profile& profile : profiles)
          for (uint64_t unit : {1ull, 4096ull}) {
            const uint32_t nodes = c.ranks / c.perNode;
            const uint64_t count = unit * channels * c.perNode * chunks * 8;  // chunks divide by M2 <= 8
            INFO("nodes " << nodes << " of " << c.perNode << " chunks " << chunks << " channels " << channels
                          << " count " << count << " profile " << profile.source);
            const auto [form, timeline] = formVsTimeline("hierarchical", nodesOf(c.ranks, c.perNode), count, chunks,
                                                         channels, profile, DType::Float32, "rhd");
            CHECK(form == doctest::Approx(timeline).epsilon(1e-9));
          }
}

TEST_CASE("allreduce hierarchical rhd: closed form bounds the timeline on uneven counts and nodes") {
  for (const auto& nodeOf : rhdLayouts())
    for (uint64_t count : {1021ull, 65537ull, 1000003ull}) {
      INFO("nodes " << describe(nodeOf) << " count " << count);
      const auto [form, timeline] =
          formVsTimeline("hierarchical", nodeOf, count, 3, 2, oddProfile(), DType::BFloat16, "rhd");
      CHECK(form >= timeline * (1 - 1e-12));
      // a bound: one representative per node carries its busiest rank (observed up to +17% on interleaved nodes)
      CHECK(form <= timeline * 1.25);
    }
}

TEST_CASE("allreduce hierarchical bruck, bruck-half: bit-exact on small integers over node counts layouts counts") {
  const uint64_t counts[] = {1, 5, 31, 1021, 4096};
  const RedOp redops[] = {RedOp::Sum, RedOp::Max, RedOp::Min};
  const DType dtypes[] = {DType::Float32, DType::BFloat16, DType::Float16};
  uint64_t seed = 7300;
  uint32_t turn = 0;
  std::vector<std::vector<uint32_t>> layouts = rhdLayouts();
  layouts.push_back(nodesOf(11, 1));  // 11 nodes of one rank: rounds of 1, 2, 4 and 3 blocks, wrapping
  layouts.push_back(nodesOf(26, 2));  // 13 nodes
  layouts.push_back(nodesOf(24, 2));  // 12 nodes
  layouts.push_back(nodesOf(48, 8));  // 6 nodes of 8: parts and rotations of every shard
  layouts.push_back(nodesOf(7, 1));   // 7 nodes of one rank: the input copied into the rotated copy
  layouts.push_back(nodesOf(9, 1));   // 9 nodes: the 1-block round J-1 third of 4 (BruckPlan::smallAt)
  layouts.push_back(nodesOf(36, 2));  // 18 nodes: the 2-block round J-1 fourth of 5, before rounds 0 and 1
  layouts.push_back(nodesOf(20, 1));  // 20 nodes: the 4-block round J-1 third of 5
  layouts.push_back({0, 0, 0, 1, 1, 2, 2, 2, 3, 4, 4, 4, 4, 5, 6, 6, 7, 8, 8, 9});  // 10 ragged nodes
  for (const char* inter : {"bruck", "bruck-half"})
    for (const auto& nodeOf : layouts)
      for (uint64_t count : counts)
        for (uint32_t chunks : {1u, 3u}) {
          const uint32_t channels = (turn % 2) ? 2 : 1;
          verifyCase("hierarchical", nodeOf, count, chunks, channels, dtypes[turn % 3], redops[(turn / 3) % 3],
                     InputKind::SmallIntegers, seed++, inter);
          ++turn;
        }
}

TEST_CASE("allreduce hierarchical bruck: ceil(log2 M) rounds per pass and M - 1 blocks per node") {
  // 6 nodes of 4: rounds of 1, 2 and 2 blocks each way; every rank sends one ProxyPut per reduce-scatter round
  // (its rotated copy) and 1 + 2 + 2 in the all-gather (two from two blocks on, wrapped or not): the same on
  // every node. Every node moves 5 of 6 blocks each way.
  for (uint32_t chunks : {1u, 4u}) {
    INFO("chunks " << chunks);
    const uint64_t count = 24 * 4 * 60;
    const Schedule s = generate(arSpec("hierarchical", count), nodesOf(24, 4), opts(chunks, 1, "bruck"));
    CHECK(countKind(s, StepKind::ProxyPut) == 24ull * (3 + 5) * chunks);
    for (uint32_t r = 0; r < s.nRanks; ++r) {
      uint64_t mine = 0;
      for (const auto& lane : s.lanes[r])
        for (const auto& st : lane.steps) mine += st.kind == StepKind::ProxyPut;
      CHECK(mine == (3 + 5) * chunks);
    }
    uint64_t netBytes = 0;
    for (uint32_t r = 0; r < s.nRanks; ++r)
      for (const auto& lane : s.lanes[r])
        for (const auto& st : lane.steps)
          if (st.kind == StepKind::ProxyPut) netBytes += st.count;
    CHECK(netBytes == 24ull * 2 * (count / 4 / 6) * 5);  // per rank: its shard's 5 of 6 blocks, each way
  }
}

TEST_CASE("allreduce hierarchical bruck-half: every reduce-scatter round halves what is live") {
  // 6 nodes of 4: the reduce-scatter moves 3, then 1, then 1 block (live 6 -> 3 -> 2 -> 1), the all-gather the
  // reverse: 1 + 1 + 2 messages (two from two blocks on); every node still moves 5 of 6 blocks each way.
  for (uint32_t chunks : {1u, 4u}) {
    INFO("chunks " << chunks);
    const uint64_t count = 24 * 4 * 60;
    const Schedule s = generate(arSpec("hierarchical", count), nodesOf(24, 4), opts(chunks, 1, "bruck-half"));
    for (uint32_t r = 0; r < s.nRanks; ++r) {
      uint64_t mine = 0, bytes = 0;
      for (const auto& lane : s.lanes[r])
        for (const auto& st : lane.steps)
          if (st.kind == StepKind::ProxyPut) {
            ++mine;
            bytes += st.count;
          }
      CHECK(mine == (3 + 4) * chunks);
      CHECK(bytes == 2 * (count / 4 / 6) * 5);
    }
  }
  // The plans: bruck-half's first reduce-scatter round moves floor(M/2) blocks; on a power of two and on 3 nodes
  // it is bruck's plan.
  for (uint32_t nodes = 2; nodes <= 1024; ++nodes) {
    INFO("nodes " << nodes);
    const detail::BruckPlan half = detail::bruckPlan(nodes, InterPhase::BruckHalf);
    const detail::BruckPlan bruck = detail::bruckPlan(nodes, InterPhase::Bruck);
    REQUIRE(half.rounds == bruck.rounds);
    CHECK(half.held.front() == 1);
    CHECK(half.held.back() == nodes);
    CHECK(half.blocks(half.firstRound()) == nodes / 2);
    CHECK_FALSE(half.swapped());
    for (uint32_t k = 0; k < half.rounds; ++k) CHECK(half.blocks(k) <= half.distance(k));
    if ((nodes & (nodes - 1)) == 0 || nodes == 3) CHECK(half.held == bruck.held);
  }
}

TEST_CASE("allreduce hierarchical bruck, bruck-half: closed form equals the uncontended timeline on even cases") {
  const Profile profiles[] = {oddProfile(), reduceBoundProfile(), defaultProfile(topologyPreset("dgx-h100", 2))};
  struct Case {
    uint32_t ranks, perNode;
  };
  const Case cases[] = {
      {4, 2}, {6, 2}, {8, 2}, {10, 2}, {12, 4}, {14, 2}, {16, 2},
      {5, 1}, {7, 1}, {4, 4}, {18, 2}, {17, 1}, {20, 2}};  // 9 and 17 nodes: round J-1 between rounds (smallAt)
  for (const char* inter : {"bruck", "bruck-half"})
    for (const Case& c : cases)
      for (uint32_t chunks : {1u, 3u})
        for (uint32_t channels : {1u, 2u})
          for (const Profile& profile : profiles)
            for (uint64_t unit : {1ull, 4096ull}) {
              const uint32_t nodes = c.ranks / c.perNode;
              const uint64_t count = unit * channels * c.perNode * chunks * nodes;  // chunks divide by M
              INFO(inter << " nodes " << nodes << " of " << c.perNode << " chunks " << chunks << " channels "
                         << channels << " count " << count << " profile " << profile.source);
              const auto [form, timeline] = formVsTimeline("hierarchical", nodesOf(c.ranks, c.perNode), count, chunks,
                                                           channels, profile, DType::Float32, inter);
              CHECK(form == doctest::Approx(timeline).epsilon(1e-9));
            }
}

TEST_CASE("allreduce hierarchical bruck, bruck-half: closed form bounds the timeline on uneven counts and nodes") {
  for (const char* inter : {"bruck", "bruck-half"})
    for (const auto& nodeOf : rhdLayouts())
      for (uint64_t count : {1021ull, 65537ull, 1000003ull}) {
        INFO(inter << " nodes " << describe(nodeOf) << " count " << count);
        const auto [form, timeline] =
            formVsTimeline("hierarchical", nodeOf, count, 3, 2, oddProfile(), DType::BFloat16, inter);
        CHECK(form >= timeline * (1 - 1e-12));
        // a bound: one representative per node carries its busiest rank; +29% on nodes of 2, 1, 3, 1, 2 since a
        // ProxyPut's latency overlaps (the representative chains its rounds' landings; within 25% before)
        CHECK(form <= timeline * 1.30);
      }
}

TEST_CASE("allreduce hierarchical: auto picks the inter-node variant with the lower closed form") {
  const Topology topo = topologyPreset("dgx-h100", 128);
  const Profile profile = defaultProfile(topo);
  const auto nodeOf = topo.layout(1024);
  for (uint64_t bytes : {uint64_t(1) << 12, uint64_t(1) << 30}) {
    INFO("bytes " << bytes);
    const CollectiveSpec spec = arSpec("hierarchical", bytes / 4);
    const double ring = closedForm(spec, opts(4, 1, "ring"), topo, 1024, profile).totalUs;
    const double rhd = closedForm(spec, opts(4, 1, "rhd"), topo, 1024, profile).totalUs;
    const double bruck = closedForm(spec, opts(4, 1, "bruck"), topo, 1024, profile).totalUs;
    const double half = closedForm(spec, opts(4, 1, "bruck-half"), topo, 1024, profile).totalUs;
    const InterPhase pick = resolveInter(spec, nodeOf, opts(4, 1, "auto"), profile);
    const double best = std::min({ring, rhd, bruck, half});
    CHECK(pick == (best == ring    ? InterPhase::Ring
                   : best == rhd   ? InterPhase::Rhd
                   : best == bruck ? InterPhase::Bruck
                                   : InterPhase::BruckHalf));
    CHECK(closedForm(spec, opts(4, 1, "auto"), topo, 1024, profile).totalUs == best);
  }
  // 128 nodes: 14 latency-bound exchanges beat 254 ring steps for a small message
  CHECK(resolveInter(arSpec("hierarchical", 1024), nodeOf, opts(1, 1, "auto"), profile) == InterPhase::Rhd);
  // no network phase, or another generator: nothing to choose
  CHECK(resolveInter(arSpec("hierarchical", 1024), nodesOf(8, 8), opts(1, 1, "auto"), profile) == InterPhase::Ring);
  CHECK(resolveInter(arSpec("ring", 1024), nodeOf, opts(1, 1, "auto"), profile) == InterPhase::Ring);
  // generate() resolves auto under the datasheet DGX-H100 profile: the schedule is one of the two variants
  const Schedule a = generate(arSpec("hierarchical", 1024), nodesOf(64, 8), opts(1, 1, "auto"));
  CHECK(countKind(a, StepKind::ProxyPut) == 64ull * 2 * 3);  // rhd over 8 nodes
}

TEST_CASE("allreduce hierarchical: auto leaves rhd out where it folds, and picks the lowest of ring and the bruck's") {
  // rhd's fold makes host NICs receive two messages at once, which its closed form does not see.
  for (uint32_t nodes : {3u, 5u, 6u, 12u, 13u, 24u})
    for (uint64_t bytes : {uint64_t(1) << 10, uint64_t(1) << 16, uint64_t(1) << 22, uint64_t(1) << 28}) {
      INFO("nodes " << nodes << " bytes " << bytes);
      const Topology topo = topologyPreset("dgx-h100", nodes);
      const Profile profile = defaultProfile(topo);
      const CollectiveSpec spec = arSpec("hierarchical", bytes / 4);
      const double ring = closedForm(spec, opts(4, 1, "ring"), topo, 8 * nodes, profile).totalUs;
      const double bruck = closedForm(spec, opts(4, 1, "bruck"), topo, 8 * nodes, profile).totalUs;
      const double half = closedForm(spec, opts(4, 1, "bruck-half"), topo, 8 * nodes, profile).totalUs;
      const InterPhase pick = resolveInter(spec, topo.layout(8 * nodes), opts(4, 1, "auto"), profile);
      const double best = std::min({ring, bruck, half});  // the earlier on ties
      CHECK(pick == (best == ring ? InterPhase::Ring : best == bruck ? InterPhase::Bruck : InterPhase::BruckHalf));
    }
  // a power of two keeps rhd a candidate
  const Topology topo = topologyPreset("dgx-h100", 8);
  CHECK(resolveInter(arSpec("hierarchical", 1024), topo.layout(64), opts(1, 1, "auto"), defaultProfile(topo)) ==
        InterPhase::Rhd);
}

TEST_CASE("allreduce: an unknown inter-node variant is InvalidArgument naming the choices") {
  // Names are parsed at the edges (parseInterPhase); a value outside the enum is still refused by generate().
  CHECK_FALSE(parseInterPhase("tree").has_value());
  CHECK_FALSE(parseInterPhase("Ring").has_value());
  GenOptions bad = opts(1, 1);
  bad.inter = static_cast<InterPhase>(7);
  for (const char* name : kAllReduce) {
    INFO(std::string(name));
    try {
      (void)generate(arSpec(name, 64), nodesOf(8, 4), bad);
      FAIL("expected an error");
    } catch (const Error& e) {
      CHECK(e.code() == ErrorCode::InvalidArgument);
      CHECK(std::string(e.what()).find("ring, rhd, bruck, bruck-half or auto") != std::string::npos);
    }
  }
  CHECK_THROWS_AS(resolveInter(arSpec("hierarchical", 64), nodesOf(8, 4), bad, Profile{}), Error);
}
