// mkernel — the moe-ffn generator (mk/algorithms/moe.hpp): moe-dispatch-gemm's schedule with its grouped GEMM given
// the SwiGLU epilogue, a second grouped GEMM per source, the expert rows returned to their tokens' ranks (across
// nodes summed per node on the dispatch's relays first) and the combine step there.
#include <cstdint>
#include <string>
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

void validateMoeFfnSpec(const MoeFfnSpec& spec, uint32_t nRanks) {
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
  const auto R = static_cast<uint32_t>(nodeOf.size());
  validateMoeFfnSpec(spec, R);
  Schedule s = asFfn([&] { return generateMoeDispatchGemm(spec.dispatch(), nodeOf); });
  const uint32_t E = spec.experts, K = spec.topk, T = spec.tokens, H = spec.hidden, F = spec.ffn;
  const uint32_t C = spec.capacityOr(), G = R * E;
  const uint64_t slots = uint64_t{T} * K, backRows = slots;  // the weights come first in "back"
  const gen::MoePlacement at(nodeOf);
  const bool multiNode = at.multiNode();
  const RelaySlots relays(at, nodeOf);
  const uint64_t relaySlot = slots + uint64_t{G} * T * H;  // a relay's "relayBack" per source: weights, G blocks
  if (multiNode)
    for (const auto& [name, n] :
         {std::pair<const char*, uint64_t>{"relayBack (sources per relay x (tokens x topk + experts in total x "
                                           "tokens x hidden))",
                                           gen::elements({relays.most, relaySlot})},
          {"relayOut (sources per relay x tokens x hidden)", gen::elements({relays.most, T, H})}})
      if (n > kMaxElements)
        bad("buffer " + std::string(name) + " on " + std::to_string(R) +
            " ranks holds more than 2^50 elements: use fewer tokens or smaller sizes");
  const uint16_t kIds = bufferNamed(s, "ids"), kW1 = bufferNamed(s, "w"), kH = bufferNamed(s, "out");
  auto same = [&](uint64_t n) { return std::vector<uint64_t>(R, n); };
  s.buffers[kW1].name = "w1";
  s.buffers[kH] = {"h", DType::BFloat16, BufferKind::Scratch, same(uint64_t{G} * C * F)};
  const auto kWeights = static_cast<uint16_t>(s.buffers.size());
  const uint16_t kW2 = kWeights + 1, kO = kWeights + 2, kBack = kWeights + 3, kY = kWeights + 4;
  const uint16_t kNodeWeights = kWeights + 5, kRelayBack = kWeights + 6, kRelayOut = kWeights + 7;
  s.buffers.push_back({"weights", DType::Float32, BufferKind::Input, same(slots)});
  s.buffers.push_back({"w2", DType::BFloat16, BufferKind::Input, same(uint64_t{E} * F * H)});
  s.buffers.push_back({"o", DType::Float32, BufferKind::Scratch, same(uint64_t{G} * C * H)});
  s.buffers.push_back({"back", DType::Float32, BufferKind::Scratch, same(backRows + uint64_t{G} * T * H)});
  s.buffers.push_back({"y", DType::Float32, BufferKind::Output, same(uint64_t{T} * H)});
  const uint32_t nodeIds = at.ranksOf.rbegin()->first + 1;
  if (multiNode) {
    s.buffers.push_back({"nodeWeights", DType::Float32, BufferKind::Scratch, same(uint64_t{nodeIds} * slots)});
    s.buffers.push_back({"relayBack", DType::Float32, BufferKind::Scratch, same(relays.most * relaySlot)});
    s.buffers.push_back({"relayOut", DType::Float32, BufferKind::Scratch, same(uint64_t{relays.most} * T * H)});
  }
  // GEMM 1 writes F columns of "h" (the SwiGLU pairs); GEMM 2's shapes follow, one per (source, expert), sized by
  // the same runtime extent as GEMM 1's group (the rows that arrived).
  const auto first = static_cast<uint32_t>(s.gemms.size());  // R x E shapes, group (src, e) at src x E + e
  for (uint32_t g = 0; g < first; ++g) {
    s.gemms[g].ldc = F;
    s.gemms.push_back(GemmShape{C, H, F, F, H, H, s.gemms[g].extent});
  }
  // Flags: the dispatch's, then "ffn done" (own: +1 per source whose GEMM 2 ran), "back" (+1 per block returned)
  // and across nodes per source s "summed" (on s's relays: s's weights and every block of the relay's node arrived).
  const uint32_t doneFlag = s.nFlags, backFlag = s.nFlags + 1;
  auto sumFlag = [base = s.nFlags + 2](uint32_t src) { return base + src; };
  s.nFlags += multiNode ? 2 + R : 2;
  const gen::MoeDispatchFlags dispatchFlags{R};
  const uint64_t block = uint64_t{C} * H;  // one (source, expert) block of "o"
  // Node n's partial sums land in "back" where the block of its lowest expert would (route.hpp, CombineShape).
  auto nodeBlock = [&](uint32_t n) { return backRows + uint64_t{at.on(n)[0]} * E * T * H; };
  auto nodeExtent = [&](uint32_t n) { return extentNamed(s, "node" + std::to_string(n)); };
  auto relayExtent = [&](uint32_t src, uint32_t n) {
    return extentNamed(s, "relay" + std::to_string(src) + "." + std::to_string(n));
  };
  for (uint32_t r = 0; r < R; ++r) {
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
        g2.dst = bufRef(r, kO, uint64_t{src} * E * block);
        g2.a = g1.dst;
        g2.b = bufRef(r, kW2, 0);
        steps.push_back(g2);
        steps.push_back(gen::flagStep(StepKind::Signal, r, doneFlag, 1));
      }
      lane.steps = std::move(steps);
    }
    // The combine lane: the weights into "back" (across nodes also, per other node, those of the tokens it sent
    // there to its relay), then each source's blocks once its FFN ran: home inside the node, to the source's relay
    // on this node from another node; last, once everything is back, the combine.
    Lane ret{LaneRole::Intra, 1, {}};
    Step copy;
    copy.kind = StepKind::Copy;
    copy.count = slots;
    copy.dst = bufRef(r, kBack, 0);
    copy.a = bufRef(r, kWeights, 0);
    ret.steps.push_back(copy);
    if (multiNode) ret.steps.push_back(gen::flagStep(StepKind::Wait, r, dispatchFlags.routed(), 1));
    for (const auto& [n, ranks] : at.ranksOf) {
      if (!multiNode || n == nodeOf[r]) continue;
      const uint32_t relay = at.relay(r, n);
      Step gather;
      gather.kind = StepKind::Gather;
      gather.count = slots;
      gather.aux = K;
      gather.value = T;
      gather.extent = nodeExtent(n);
      gather.dst = bufRef(r, kNodeWeights, uint64_t{n} * slots);
      gather.a = bufRef(r, kWeights, 0);
      gather.b = bufRef(r, bufferNamed(s, "nodeLayout"), G + uint64_t{n} * T);
      ret.steps.push_back(gather);
      ret.steps.push_back(gen::move(nodeOf, r, bufRef(relay, kRelayBack, relays.slot[relay][r] * relaySlot), gather.dst,
                                    slots, gather.extent, sumFlag(r)));
    }
    for (uint32_t src = 0; src < R; ++src) {
      ret.steps.push_back(gen::flagStep(StepKind::Wait, r, doneFlag, src + 1));
      const bool home = nodeOf[src] == nodeOf[r];
      const uint32_t relay = home ? src : at.relay(src, nodeOf[r]);
      for (uint32_t e = 0; e < E; ++e) {
        const uint32_t j = r * E + e;
        // "from<src>.<e>": the rows rank src sent expert e, GEMM 1's and 2's m
        const BufRef to =
            home ? bufRef(src, kBack, backRows + uint64_t{j} * T * H)
                 : bufRef(relay, kRelayBack, relays.slot[relay][src] * relaySlot + slots + uint64_t{j} * T * H);
        ret.steps.push_back(gen::move(nodeOf, r, to, bufRef(r, kO, (uint64_t{src} * E + e) * block), block,
                                      G + src * E + e, home ? backFlag : sumFlag(src)));
      }
      if (relay == r) ret.steps.push_back(gen::flagStep(StepKind::Signal, r, home ? backFlag : sumFlag(src), E));
    }
    // Back: E per rank of the node, one partial sum per other node.
    const auto nodes = static_cast<uint32_t>(at.ranksOf.size());
    ret.steps.push_back(
        gen::flagStep(StepKind::Wait, r, backFlag, multiNode ? uint64_t{at.on(nodeOf[r]).size()} * E + nodes - 1 : G));
    Step combine;
    combine.kind = StepKind::Combine;
    combine.count = uint64_t{T} * H;
    combine.aux = K;
    combine.value = combineValue(G, H);
    combine.dst = bufRef(r, kY, 0);
    combine.a = bufRef(r, kBack, 0);
    combine.b = bufRef(r, kIds, 0);
    if (multiNode) combine.flags = kStepRouteNodes;
    ret.steps.push_back(combine);
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
      Step sum = combine;
      sum.flags = kStepRouteOwnNode;
      sum.extent = relayExtent(src, n);
      sum.dst = bufRef(r, kRelayOut, slot * T * H);
      sum.a = bufRef(r, kRelayBack, slot * relaySlot);
      sum.b = bufRef(r, bufferNamed(s, "relayIds"), uint64_t{src} * slots);
      forward->steps.push_back(sum);
      forward->steps.push_back(
          gen::move(nodeOf, r, bufRef(src, kBack, nodeBlock(n)), sum.dst, uint64_t{T} * H, sum.extent, backFlag));
    }
  }
  s.info.op = "moe-ffn";
  if (multiNode) s.info.algo = "node-dedup-combine";
  s.info.dtype = DType::BFloat16;
  fillCostAttributes(s);
  return s;
}

}  // namespace mk
