// moe-ffn's two returns across nodes (MoeCombineReturn, mk/algorithms/moe.hpp): both checked element-wise on the
// CPU executor on 2 and 3 nodes, even, uneven and interleaved, with uniform, skewed, lopsided and given routings, an
// expert without a token; the network bytes each moves counted against the rows computed from the ids; one schedule
// on one node. The choice of auto by the replay: sim/tests/test_moe_choice.cpp.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "expect_error.hpp"
#include "layout.hpp"
#include "mk/algorithms/moe.hpp"
#include "mk/error.hpp"
#include "mk/exec/executor.hpp"
#include "mk/exec/verify_moe.hpp"
#include "mk/schedule/io.hpp"
#include "mk/schedule/pack.hpp"
#include "mk/schedule/validate.hpp"
#include "moe_ffn_case.hpp"

using namespace mk;
using test::ffnSpec;

namespace {

constexpr MoeCombineReturn kPerBlock = MoeCombineReturn::PerBlock, kNodeSum = MoeCombineReturn::NodeSum;

/// The node-sum return's bytes across nodes, from the ids alone: per (source, other node n) and per token of the
/// source naming an expert on n, its router weights to n's relay (topk float32) and one summed row back (H float32).
uint64_t nodeSumBytes(const MoeFfnSpec& spec, const std::vector<uint32_t>& nodeOf, const MoeIds& ids) {
  uint64_t bytes = 0;
  const uint32_t nodes = *std::max_element(nodeOf.begin(), nodeOf.end()) + 1;
  for (uint32_t r = 0; r < nodeOf.size(); ++r)
    for (uint32_t t = 0; t < spec.tokens; ++t) {
      std::vector<bool> named(nodes, false);
      for (uint32_t k = 0; k < spec.topk; ++k)
        named[nodeOf[static_cast<uint32_t>(ids[r][uint64_t{t} * spec.topk + k]) / spec.experts]] = true;
      for (uint32_t n = 0; n < nodes; ++n)
        if (named[n] && n != nodeOf[r]) bytes += (uint64_t{spec.topk} + spec.hidden) * sizeof(float);
    }
  return bytes;
}

/// The per-block return's: every (token, k) naming an expert of another node, its row (H float32).
uint64_t perBlockBytes(const MoeFfnSpec& spec, const std::vector<uint32_t>& nodeOf, const MoeIds& ids) {
  uint64_t bytes = 0;
  for (uint32_t r = 0; r < nodeOf.size(); ++r)
    for (const int32_t id : ids[r])
      if (nodeOf[static_cast<uint32_t>(id) / spec.experts] != nodeOf[r]) bytes += uint64_t{spec.hidden} * sizeof(float);
  return bytes;
}

/// Both returns on `nodeOf` match the reference for the routing, and each one's proxyputs move the dispatch's bytes
/// (its own schedule run on the same ids) plus exactly its rows; `fewer`: the node-sum's below the per-block's.
void checkReturns(const std::vector<uint32_t>& nodeOf, MoeFfnSpec spec, MoeRouting routing, const MoeIds& given = {},
                  bool fewer = false) {
  const MoeIds ids = routing == MoeRouting::Given
                         ? given
                         : moeRouting(spec.dispatch(), static_cast<uint32_t>(nodeOf.size()), routing, 11);
  const MoeDispatchGemmSpec d = spec.dispatch();
  ExecStats dispatched;
  CHECK(verifyMoeDispatchGemm(generateMoeDispatchGemm(d, nodeOf), d, 11, MoeRouting::Given, ids, &dispatched).ok);
  uint64_t moved[2] = {0, 0};
  for (MoeCombineReturn ret : {kPerBlock, kNodeSum}) {
    spec.combineReturn = ret;
    INFO("return " << toString(ret));
    const Schedule s = generateMoeFfn(spec, nodeOf);
    REQUIRE(validate(s).empty());
    CHECK(s.info.algo == (ret == kNodeSum ? "node-dedup-combine" : "node-dedup"));
    ExecStats stats;
    const VerifyResult v = verifyMoeFfn(s, spec, 11, MoeRouting::Given, ids, &stats);
    INFO(v.detail);
    CHECK(v.ok);
    const uint64_t combined = stats.bytes(StepKind::ProxyPut) - dispatched.bytes(StepKind::ProxyPut);
    CHECK(combined == (ret == kNodeSum ? nodeSumBytes(spec, nodeOf, ids) : perBlockBytes(spec, nodeOf, ids)));
    moved[ret == kNodeSum] = combined;
  }
  if (fewer) CHECK(moved[1] < moved[0]);
}

}  // namespace

TEST_CASE("moe-ffn: across nodes both returns match the reference, the node-sum one row per (token, node)") {
  const MoeFfnSpec spec = ffnSpec(2, 3, 9);
  const std::vector<uint32_t> nodeOf{0, 0, 1, 1};
  // The dispatch's 3 per rank; summed: per rank the weights of its tokens to its relay on the other node and per
  // (source, other node) the relay's partial sums going home; per block: per rank a block per expert to each source
  // of the other node.
  CHECK(test::countKind(generateMoeFfn(spec, nodeOf), StepKind::ProxyPut) == 4 * 3 + 4 + 4);
  MoeFfnSpec perBlock = spec;
  perBlock.combineReturn = kPerBlock;
  CHECK(test::countKind(generateMoeFfn(perBlock, nodeOf), StepKind::ProxyPut) == 4 * 3 + 4 * 2 * 2);
  // Given: expert 1 (rank 0's second) gets no token, rank 3's tokens all name experts 6, 7 and 0.
  const std::vector<int32_t> others = {0, 2, 3, 4, 5, 6, 7};
  MoeIds given(4);
  for (uint32_t r = 0; r < 3; ++r)
    for (uint32_t t = 0; t < 9; ++t)
      for (uint32_t k = 0; k < 3; ++k) given[r].push_back(others[(t + r + 2 * k) % 7]);
  for (uint32_t t = 0; t < 9; ++t) given[3].insert(given[3].end(), {6, 7, 0});
  checkReturns(nodeOf, spec, MoeRouting::Given, given, true);
}

TEST_CASE("moe-ffn: both returns on 2 and 3 nodes, uneven and interleaved, odd sizes and lopsided routings") {
  MoeFfnSpec spec = ffnSpec(2, 3, 7);
  for (const std::vector<uint32_t>& nodeOf : std::vector<std::vector<uint32_t>>{
           {0, 1}, {0, 0, 1, 1}, {0, 0, 0, 1}, {0, 1, 0, 1}, {0, 1, 2}, {0, 0, 1, 2, 2, 2}, {0, 1, 2, 0, 1, 2}}) {
    const auto R = static_cast<uint32_t>(nodeOf.size());
    INFO("ranks " << R << " last node " << nodeOf.back());
    checkReturns(nodeOf, spec, MoeRouting::Uniform);
    checkReturns(nodeOf, spec, MoeRouting::Skewed);  // one expert gets every token, the others none
    // Every token of every rank names the 3 experts of the last rank and the one before it: all remote for most
    // ranks, on one or two ranks of one node; expert 0 gets no token.
    MoeIds lopsided(R);
    const auto last = static_cast<int32_t>(2 * R - 1);
    for (uint32_t r = 0; r < R; ++r)
      for (uint32_t t = 0; t < spec.tokens; ++t) lopsided[r].insert(lopsided[r].end(), {last, last - 1, last - 2});
    checkReturns(nodeOf, spec, MoeRouting::Given, lopsided, nodeOf[R - 1] == nodeOf[R - 2]);
  }
  // One expert per rank, topk 1 (a token's rows never share a node: nothing to sum, the node-sum's volume is the row
  // plus its weight) and hidden 24, tokens 5.
  spec = ffnSpec(1, 1, 5);
  spec.hidden = 24;
  checkReturns({0, 0, 0, 1}, spec, MoeRouting::Uniform);
  checkReturns({0, 1, 2}, spec, MoeRouting::Skewed);
}

TEST_CASE("moe-ffn: on one node every return is the same schedule, across nodes auto needs the cost model") {
  for (const std::vector<uint32_t>& nodeOf : std::vector<std::vector<uint32_t>>{{0}, {0, 0, 0}}) {
    const Schedule perBlock = generateMoeFfn(ffnSpec(2, 2, 5, kPerBlock), nodeOf);
    CHECK(perBlock.info.algo == "direct");
    for (MoeCombineReturn ret : {MoeCombineReturn::Auto, kNodeSum}) {
      const Schedule other = generateMoeFfn(ffnSpec(2, 2, 5, ret), nodeOf);
      CHECK(pack(other) == pack(perBlock));
      CHECK(scheduleToJson(other) == scheduleToJson(perBlock));
    }
  }
  test::expectError(
      [] {
        generateMoeFfn(ffnSpec(2, 2, 5, MoeCombineReturn::Auto), {0, 1});
      },
      ErrorCode::InvalidArgument,
      {"moe-ffn: combineReturn auto across nodes is chosen by the SimGrid replay", "per-block or node-sum"});
  for (const char* name : {"auto", "per-block", "node-sum"})
    CHECK(toString(*parseMoeCombineReturn(name)) == std::string(name));
  CHECK_FALSE(parseMoeCombineReturn("nodesum").has_value());
}
