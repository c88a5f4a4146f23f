// mkernel — the moe-ffn generator (mk/algorithms/moe.hpp): moe-dispatch-gemm's schedule with its grouped GEMM given
// the SwiGLU epilogue, a second grouped GEMM per source, the expert rows returned to their tokens' ranks (across
// nodes per block, or summed per node on the dispatch's relays first: MoeCombineReturn) and the combine step there.
#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "generator_common.hpp"
#include "mk/algorithms/moe.hpp"
#include "mk/error.hpp"
#include "mk/schedule/extent.hpp"
#include "mk/schedule/pack.hpp"
#include "mk/schedule/route.hpp"
#include "mk/schedule/schedule.hpp"
#include "moe_common.hpp"

namespace mk {

namespace {

[[noreturn]] void bad(const std::string& what) { throw Error(ErrorCode::InvalidArgument, "moe-ffn: " + what); }

/// Rethrow moe-dispatch-gemm's refusals as moe-ffn's: the dispatch is part of this operator.
template <class F>
auto asFfn(F&& f) {
  try {
    return f();
  } catch (const Error& e) {
    std::string what = e.what();
    const std::string prefix = "moe-dispatch-gemm: ";
    if (const auto at = what.find(prefix); at != std::string::npos) what = what.substr(at + prefix.size());
    throw Error(e.code(), "moe-ffn: " + what);
  }
}

uint16_t bufferNamed(const Schedule& s, const char* name) {
  for (std::size_t b = 0; b < s.buffers.size(); ++b)
    if (s.buffers[b].name == name) return static_cast<uint16_t>(b);
  throw Error(ErrorCode::Internal, std::string("moe-ffn: the dispatch has no buffer '") + name + "'");
}

uint32_t extentNamed(const Schedule& s, const std::string& name) {
  const int e = extentIndex(s, name);
  if (e < 0) throw Error(ErrorCode::Internal, "moe-ffn: the dispatch has no extent '" + name + "'");
  return static_cast<uint32_t>(e);
}

/// Across nodes, per relay the sources of other nodes it sums for, in rank order: slot i of its "relayBack" and
/// "relayOut" holds the i-th's.
struct RelaySlots {
  std::vector<std::vector<uint32_t>> served;  ///< [relay]: its sources, ascending
  std::vector<std::vector<uint32_t>> slot;    ///< [relay][source]: the source's slot on that relay
  uint32_t most = 0;                          ///< the most sources one relay serves

  RelaySlots(const gen::MoePlacement& at, const std::vector<uint32_t>& nodeOf)
      : served(nodeOf.size()), slot(nodeOf.size(), std::vector<uint32_t>(nodeOf.size(), 0)) {
    for (uint32_t src = 0; src < nodeOf.size(); ++src)
      for (const auto& [n, ranks] : at.ranksOf) {
        if (n == nodeOf[src]) continue;
        const uint32_t relay = at.relay(src, n);
        slot[relay][src] = static_cast<uint32_t>(served[relay].size());
        served[relay].push_back(src);
        most = std::max<uint32_t>(most, static_cast<uint32_t>(served[relay].size()));
      }
  }
};

/// What both returns share: the FFN's sizes, buffers and flags.
struct Ffn {
  const std::vector<uint32_t>& nodeOf;
  uint32_t R = 0, E = 0, K = 0, T = 0, H = 0, G = 0;
  uint64_t slots = 0;  ///< T x topk: the weights in front of "back"
  uint64_t block = 0;  ///< one (source, expert) block of "o": capacity x H
  uint16_t kIds = 0, kWeights = 0, kO = 0, kBack = 0, kY = 0;
  uint32_t doneFlag = 0;  ///< own: +1 per source whose GEMM 2 ran
  uint32_t backFlag = 0;  ///< +1 per block (or node's sum) returned

  /// Where global expert j's rows for the executing rank's tokens sit in "back".
  uint64_t backBlock(uint32_t j) const noexcept { return slots + uint64_t{j} * T * H; }
};

/// Turn the dispatch `s` into the FFN both returns start from: GEMM 1 with the SwiGLU epilogue into "h", GEMM 2 into
/// "o" after it with a signal of "ffn done", the buffers of moe.hpp's list up to "y" and the two flags.
Ffn addFfn(Schedule& s, const MoeFfnSpec& spec, const std::vector<uint32_t>& nodeOf) {
  const auto R = static_cast<uint32_t>(nodeOf.size());
  const uint32_t E = spec.experts, T = spec.tokens, H = spec.hidden, F = spec.ffn;
  const uint32_t C = spec.capacityOr(), G = R * E;
  const uint64_t slots = uint64_t{T} * spec.topk;
  const uint16_t kW1 = bufferNamed(s, "w"), kH = bufferNamed(s, "out");
  auto same = [&](uint64_t n) { return std::vector<uint64_t>(R, n); };
  s.buffers[kW1].name = "w1";
  s.buffers[kH] = {"h", DType::BFloat16, BufferKind::Scratch, same(uint64_t{G} * C * F)};
  const auto kWeights = static_cast<uint16_t>(s.buffers.size());
  Ffn f{nodeOf};
  f.R = R;
  f.E = E;
  f.K = spec.topk;
  f.T = T;
  f.H = H;
  f.G = G;
  f.slots = slots;
  f.block = uint64_t{C} * H;
  f.kIds = bufferNamed(s, "ids");
  f.kWeights = kWeights;
  f.kO = kWeights + 2;
  f.kBack = kWeights + 3;
  f.kY = kWeights + 4;
  f.doneFlag = s.nFlags;
  f.backFlag = s.nFlags + 1;
  s.buffers.push_back({"weights", DType::Float32, BufferKind::Input, same(slots)});
  s.buffers.push_back({"w2", DType::BFloat16, BufferKind::Input, same(uint64_t{E} * F * H)});
  s.buffers.push_back({"o", DType::Float32, BufferKind::Scratch, same(uint64_t{G} * C * H)});
  s.buffers.push_back({"back", DType::Float32, BufferKind::Scratch, same(slots + uint64_t{G} * T * H)});
  s.buffers.push_back({"y", DType::Float32, BufferKind::Output, same(uint64_t{T} * H)});
  s.nFlags += 2;
  const uint16_t kW2 = kWeights + 1;
  // GEMM 1 writes F columns of "h" (the SwiGLU pairs); GEMM 2's shapes follow, one per (source, expert), sized by
  // the same runtime extent as GEMM 1's group (the rows that arrived).
  const auto first = static_cast<uint32_t>(s.gemms.size());  // R x E shapes, group (src, e) at src x E + e
  for (uint32_t g = 0; g < first; ++g) {
    s.gemms[g].ldc = F;
    s.gemms.push_back(GemmShape{C, H, F, F, H, H, s.gemms[g].extent});
  }
  for (uint32_t r = 0; r < R; ++r)
    for (Lane& lane : s.lanes[r]) {
      if (lane.role != LaneRole::Compute) continue;
      std::vector<Step> steps;
      for (const Step& st : lane.steps) {
        steps.push_back(st);
        if (st.kind != StepKind::GroupedGemm) continue;
        Step& g1 = steps.back();
        const uint32_t src = g1.aux / E;
        g1.flags |= kStepSwiGLU;
        g1.dst = bufRef(r, kH, uint64_t{src} * E * C * F);
        Step g2 = g1;
        g2.flags = 0;
        g2.aux = first + src * E;
        g2.dst = bufRef(r, f.kO, uint64_t{src} * E * f.block);
        g2.a = g1.dst;
        g2.b = bufRef(r, kW2, 0);
        steps.push_back(g2);
        steps.push_back(gen::flagStep(StepKind::Signal, r, f.doneFlag, 1));
      }
      lane.steps = std::move(steps);
    }
  return f;
}

/// Where rank r's block of expert j for a source goes: `to`, signalling flag `flag` of that rank (`collector`); when
/// the collector is r itself its moves are copies, which signal nothing, so r signals the E blocks once.
struct BlockTarget {
  BufRef to;
  uint32_t flag;
  uint32_t collector;
};

/// Rank r's combine lane up to its final wait: the weights into "back", then `prelude`, then per source once its FFN
/// ran, per expert e the block (source, e) of "o" at its runtime extent ("from<src>.<e>": the rows rank src sent
/// expert e, GEMM 1's and 2's m) to target(src, j = r x E + e).
template <class Target>
Lane combineLane(const Ffn& f, uint32_t r, const std::vector<Step>& prelude, Target&& target) {
  Lane ret{LaneRole::Intra, 1, {}};
  Step copy;
  copy.kind = StepKind::Copy;
  copy.count = f.slots;
  copy.dst = bufRef(r, f.kBack, 0);
  copy.a = bufRef(r, f.kWeights, 0);
  ret.steps.push_back(copy);
  ret.steps.insert(ret.steps.end(), prelude.begin(), prelude.end());
  for (uint32_t src = 0; src < f.R; ++src) {
    ret.steps.push_back(gen::flagStep(StepKind::Wait, r, f.doneFlag, src + 1));
    BlockTarget last{};
    for (uint32_t e = 0; e < f.E; ++e) {
      last = target(src, r * f.E + e);
      ret.steps.push_back(gen::move(f.nodeOf, r, last.to, bufRef(r, f.kO, (uint64_t{src} * f.E + e) * f.block), f.block,
                                    f.G + src * f.E + e, last.flag));
    }
    if (last.collector == r) ret.steps.push_back(gen::flagStep(StepKind::Signal, r, last.flag, f.E));
  }
  return ret;
}

/// Rank r's combine of "back" into "y" over its own ids (`flags`: its buckets, route.hpp).
Step finalCombine(const Ffn& f, uint32_t r, uint8_t flags) {
  Step combine;
  combine.kind = StepKind::Combine;
  combine.count = uint64_t{f.T} * f.H;
  combine.aux = f.K;
  combine.value = combineValue(f.G, f.H);
  combine.dst = bufRef(r, f.kY, 0);
  combine.a = bufRef(r, f.kBack, 0);
  combine.b = bufRef(r, f.kIds, 0);
  combine.flags = flags;
  return combine;
}

/// The per-block return: every block straight to its source's "back" (a proxyput across nodes), then, once all G are
/// back, the combine.
void returnPerBlock(Schedule& s, const Ffn& f) {
  for (uint32_t r = 0; r < f.R; ++r) {
    Lane ret = combineLane(f, r, {}, [&](uint32_t src, uint32_t j) {
      return BlockTarget{bufRef(src, f.kBack, f.backBlock(j)), f.backFlag, src};
    });
    ret.steps.push_back(gen::flagStep(StepKind::Wait, r, f.backFlag, f.G));
    ret.steps.push_back(finalCombine(f, r, 0));
    s.lanes[r].push_back(std::move(ret));
  }
}

/// The node-sum return across nodes: inside a node as the per-block; a source's blocks from another node to its relay
/// there (with the weights the source sends it first), which sums them per token and sends one row per token.
void returnNodeSum(Schedule& s, const Ffn& f, const gen::MoePlacement& at) {
  const std::vector<uint32_t>& nodeOf = f.nodeOf;
  const uint32_t R = f.R, E = f.E, K = f.K, T = f.T, H = f.H, G = f.G;
  const uint64_t slots = f.slots;
  const RelaySlots relays(at, nodeOf);
  const uint64_t relaySlot = slots + uint64_t{G} * T * H;  // a relay's "relayBack" per source: weights, G blocks
  for (const auto& [name, n] :
       {std::pair<const char*, uint64_t>{"relayBack (sources per relay x (tokens x topk + experts in total x "
                                         "tokens x hidden))",
                                         gen::elements({relays.most, relaySlot})},
        {"relayOut (sources per relay x tokens x hidden)", gen::elements({relays.most, T, H})}})
    if (n > kMaxElements)
      bad("buffer " + std::string(name) + " on " + std::to_string(R) +
          " ranks holds more than 2^50 elements: use fewer tokens or smaller sizes");
  auto same = [&](uint64_t n) { return std::vector<uint64_t>(R, n); };
  const auto kNodeWeights = static_cast<uint16_t>(s.buffers.size());
  const uint16_t kRelayBack = kNodeWeights + 1, kRelayOut = kNodeWeights + 2;
  const uint32_t nodeIds = at.ranksOf.rbegin()->first + 1;
  s.buffers.push_back({"nodeWeights", DType::Float32, BufferKind::Scratch, same(uint64_t{nodeIds} * slots)});
  s.buffers.push_back({"relayBack", DType::Float32, BufferKind::Scratch, same(relays.most * relaySlot)});
  s.buffers.push_back({"relayOut", DType::Float32, BufferKind::Scratch, same(uint64_t{relays.most} * T * H)});
  // Per source s "summed" (on s's relays: s's weights and every block of the relay's node arrived).
  auto sumFlag = [base = s.nFlags](uint32_t src) { return base + src; };
  s.nFlags += R;
  const gen::MoeDispatchFlags dispatchFlags{R};
  // Node n's partial sums land in "back" where the block of its lowest expert would (route.hpp, CombineShape).
  auto nodeBlock = [&](uint32_t n) { return f.backBlock(at.on(n)[0] * E); };
  auto nodeExtent = [&](uint32_t n) { return extentNamed(s, "node" + std::to_string(n)); };
  auto relayExtent = [&](uint32_t src, uint32_t n) {
    return extentNamed(s, "relay" + std::to_string(src) + "." + std::to_string(n));
  };
  const auto nodes = static_cast<uint32_t>(at.ranksOf.size());
  for (uint32_t r = 0; r < R; ++r) {
    // First, per other node, the weights of the tokens r sent there to its relay.
    std::vector<Step> prelude{gen::flagStep(StepKind::Wait, r, dispatchFlags.routed(), 1)};
    for (const auto& [n, ranks] : at.ranksOf) {
      if (n == nodeOf[r]) continue;
      const uint32_t relay = at.relay(r, n);
      Step gather;
      gather.kind = StepKind::Gather;
      gather.count = slots;
      gather.aux = K;
      gather.value = T;
      gather.extent = nodeExtent(n);
      gather.dst = bufRef(r, kNodeWeights, uint64_t{n} * slots);
      gather.a = bufRef(r, f.kWeights, 0);
      gather.b = bufRef(r, bufferNamed(s, "nodeLayout"), G + uint64_t{n} * T);
      prelude.push_back(gather);
      prelude.push_back(gen::move(nodeOf, r, bufRef(relay, kRelayBack, relays.slot[relay][r] * relaySlot), gather.dst,
                                  slots, gather.extent, sumFlag(r)));
    }
    // Home inside the node, to the source's relay on this node from another node.
    Lane ret = combineLane(f, r, prelude, [&](uint32_t src, uint32_t j) {
      if (nodeOf[src] == nodeOf[r]) return BlockTarget{bufRef(src, f.kBack, f.backBlock(j)), f.backFlag, src};
      const uint32_t relay = at.relay(src, nodeOf[r]);
      return BlockTarget{bufRef(relay, kRelayBack, relays.slot[relay][src] * relaySlot + slots + uint64_t{j} * T * H),
                         sumFlag(src), relay};
    });
    // Back: E per rank of the node, one partial sum per other node.
    ret.steps.push_back(
        gen::flagStep(StepKind::Wait, r, f.backFlag, uint64_t{at.on(nodeOf[r]).size()} * E + nodes - 1));
    ret.steps.push_back(finalCombine(f, r, kStepRouteNodes));
    s.lanes[r].push_back(std::move(ret));
    // A relay sums, per source it serves, the rows its node's experts made for that source's tokens, weighted, and
    // sends the source one row per token (the dispatch's forward lane, after its forwarding).
    for (uint32_t src : relays.served[r]) {
      Lane* forward = nullptr;
      for (Lane& lane : s.lanes[r])
        if (lane.role == LaneRole::InterRecv) forward = &lane;
      if (forward == nullptr) throw Error(ErrorCode::Internal, "moe-ffn: relay " + std::to_string(r) + " has no lane");
      const uint32_t n = nodeOf[r];
      const uint64_t slot = relays.slot[r][src];
      forward->steps.push_back(gen::flagStep(StepKind::Wait, r, sumFlag(src), uint64_t{at.on(n).size()} * E + 1));
      Step sum = finalCombine(f, r, kStepRouteOwnNode);
      sum.extent = relayExtent(src, n);
      sum.dst = bufRef(r, kRelayOut, slot * T * H);
      sum.a = bufRef(r, kRelayBack, slot * relaySlot);
      sum.b = bufRef(r, bufferNamed(s, "relayIds"), uint64_t{src} * slots);
      forward->steps.push_back(sum);
      forward->steps.push_back(
          gen::move(nodeOf, r, bufRef(src, f.kBack, nodeBlock(n)), sum.dst, uint64_t{T} * H, sum.extent, f.backFlag));
    }
  }
}

}  // namespace

MoeDispatchGemmSpec MoeFfnSpec::dispatch() const {
  MoeDispatchGemmSpec d;
  d.experts = experts;
  d.topk = topk;
  d.tokens = tokens;
  d.hidden = hidden;
  d.outCols = 2 * ffn;
  d.capacity = capacity;
  d.imbalance = imbalance;
  d.computeCtas = computeCtas;
  return d;
}

const char* toString(MoeCombineReturn r) noexcept {
  switch (r) {
    case MoeCombineReturn::Auto: return "auto";
    case MoeCombineReturn::PerBlock: return "per-block";
    case MoeCombineReturn::NodeSum: return "node-sum";
  }
  return "?";
}

std::optional<MoeCombineReturn> parseMoeCombineReturn(std::string_view s) noexcept {
  for (MoeCombineReturn r : {MoeCombineReturn::Auto, MoeCombineReturn::PerBlock, MoeCombineReturn::NodeSum})
    if (s == toString(r)) return r;
  return std::nullopt;
}

void validateMoeFfnSpec(const MoeFfnSpec& spec, uint32_t nRanks) {
  if (std::string(toString(spec.combineReturn)) == "?")
    bad("combineReturn " + std::to_string(static_cast<int>(spec.combineReturn)) +
        " is not one of auto, per-block, node-sum");
  if (spec.ffn == 0) bad("ffn must be >= 1 (got 0)");
  if (spec.ffn % 8 != 0)
    bad("ffn " + std::to_string(spec.ffn) +
        " is not a multiple of 8: the grouped GEMMs' rows must be whole 16-byte units for the GPU engine's TMA");
  if (spec.ffn > (uint32_t{1} << 30)) bad("ffn " + std::to_string(spec.ffn) + " is larger than 2^30");
  if (spec.capacity && spec.tokens > 0 && *spec.capacity > spec.tokens)
    bad("capacity " + std::to_string(*spec.capacity) + " is larger than tokens " + std::to_string(spec.tokens) +
        ": a rank's returned block per expert holds tokens rows");
  asFfn([&] {
    validateMoeDispatchGemmSpec(spec.dispatch(), nRanks);
    return 0;
  });
  const uint64_t G = uint64_t{nRanks} * spec.experts;
  for (const auto& [name, n] :
       {std::pair<const char*, uint64_t>{"w2 (experts x ffn x hidden)",
                                         gen::elements({spec.experts, spec.ffn, spec.hidden})},
        {"o (experts in total x capacity x hidden)", gen::elements({G, spec.capacityOr(), spec.hidden})},
        {"back (experts in total x tokens x hidden)", gen::elements({G + 1, spec.tokens, spec.hidden})}})
    if (n > kMaxElements)
      bad("buffer " + std::string(name) + " on " + std::to_string(nRanks) +
          " ranks holds more than 2^50 elements: use fewer tokens or smaller sizes");
}

Schedule generateMoeFfn(const MoeFfnSpec& spec, const std::vector<uint32_t>& nodeOf) {
  validateMoeFfnSpec(spec, static_cast<uint32_t>(nodeOf.size()));
  const gen::MoePlacement at(nodeOf);
  if (at.multiNode() && spec.combineReturn == MoeCombineReturn::Auto)
    bad("combineReturn auto across nodes is chosen by the SimGrid replay (mk::sim::planMoeFfn, as mk-sim and mk-plan "
        "do): the generator needs per-block or node-sum");
  Schedule s = asFfn([&] { return generateMoeDispatchGemm(spec.dispatch(), nodeOf); });
  const Ffn f = addFfn(s, spec, nodeOf);
  if (at.multiNode() && spec.combineReturn == MoeCombineReturn::NodeSum) {
    returnNodeSum(s, f, at);
    s.info.algo = "node-dedup-combine";
  } else {
    returnPerBlock(s, f);  // on one node both returns are this one
  }
  s.info.op = "moe-ffn";
  s.info.dtype = DType::BFloat16;
  fillCostAttributes(s);
  return s;
}

}  // namespace mk
