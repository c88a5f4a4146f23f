// mkernel — the moe-dispatch-gemm generator (mk/algorithms/moe.hpp): route -> notify -> gather -> puts with runtime
// extents -> grouped GEMM per source, every size read from the routing the schedule computes.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "generator_common.hpp"
#include "mk/algorithms/moe.hpp"
#include "mk/error.hpp"
#include "mk/schedule/pack.hpp"
#include "mk/schedule/route.hpp"
#include "mk/schedule/schedule.hpp"
#include "moe_common.hpp"

namespace mk {

namespace {

[[noreturn]] void bad(const std::string& what) {
  throw Error(ErrorCode::InvalidArgument, "moe-dispatch-gemm: " + what);
}

using gen::elements;
using gen::flagStep;
using gen::move;

/// The buffer ids of the schedule, in declaration order (moe.hpp).
enum Buf : uint16_t {
  kIds,
  kX,
  kW,
  kLayout,
  kSend,
  kCounts,
  kRecv,
  kOut,
  // across nodes only
  kNodeLayout,
  kNodeSend,
  kNodeIds,
  kRelayCounts,
  kRelayRecv,
  kRelayIds,
  kRelayLayout,
  kRelaySend,
};

}  // namespace

void validateMoeDispatchGemmSpec(const MoeDispatchGemmSpec& spec, uint32_t nRanks) {
  const std::string where = " on " + std::to_string(nRanks) + " ranks";
  if (nRanks == 0) bad("no ranks: the placement must name at least one");
  if (const char* zero = gen::firstZero({{"experts", spec.experts},
                                         {"topk", spec.topk},
                                         {"tokens", spec.tokens},
                                         {"hidden", spec.hidden},
                                         {"outCols", spec.outCols},
                                         {"computeCtas", spec.computeCtas}}))
    bad(std::string(zero) + " must be >= 1 (got 0)");
  const uint64_t global = uint64_t{nRanks} * spec.experts;
  if (spec.topk > global)
    bad("topk " + std::to_string(spec.topk) + " is larger than the experts in total, " + std::to_string(global) + " (" +
        std::to_string(spec.experts) + " per rank" + where + "): a token names distinct experts");
  if (spec.capacity && *spec.capacity == 0)
    bad("capacity must be >= 1 (got 0): the most tokens one rank may send one expert (leave it unset for tokens, " +
        std::to_string(spec.tokens) + ")");
  for (const auto& [name, v] : {std::pair<const char*, uint32_t>{"hidden", spec.hidden}, {"outCols", spec.outCols}})
    if (v % 8 != 0)
      bad(std::string(name) + " " + std::to_string(v) +
          " is not a multiple of 8: the grouped GEMM's rows must be whole 16-byte units for the GPU engine's TMA");
  if (!std::isfinite(spec.imbalance) || spec.imbalance < 1.0)
    bad("imbalance " + std::to_string(spec.imbalance) +
        " must be a finite factor >= 1 (the hottest expert's tokens over the uniform mean)");
  const uint64_t c = spec.capacityOr();
  for (const auto& [name, n] :
       {std::pair<const char*, uint64_t>{"ids (tokens x topk)", elements({spec.tokens, spec.topk})},
        {"x (tokens x hidden)", elements({spec.tokens, spec.hidden})},
        {"w (experts x hidden x outCols)", elements({spec.experts, spec.hidden, spec.outCols})},
        {"layout (experts in total x (capacity + 1))", elements({global, c + 1})},
        {"recv (experts in total x capacity x hidden)", elements({global, c, spec.hidden})},
        {"out (experts in total x capacity x outCols)", elements({global, c, spec.outCols})}})
    if (n > kMaxElements)
      bad("buffer " + std::string(name) + where + " holds more than 2^50 elements: use fewer tokens, a lower " +
          "capacity or smaller sizes");
}

namespace {

/// The uniform routing model's chance that a token's topk distinct experts, drawn from `global`, name at least one
/// of the `onNode` experts of a node: 1 - C(global - onNode, topk) / C(global, topk) = 1 - prod_{i < topk}
/// (global - onNode - i) / (global - i).
double nodeHitChance(uint64_t global, uint64_t onNode, uint32_t topk) {
  double miss = 1.0;
  for (uint32_t i = 0; i < topk && miss > 0.0; ++i)
    miss *= global >= onNode + i ? double(global - onNode - i) / double(global - i) : 0.0;
  return 1.0 - miss;
}

}  // namespace

Schedule generateMoeDispatchGemm(const MoeDispatchGemmSpec& spec, const std::vector<uint32_t>& nodeOf) {
  const auto R = static_cast<uint32_t>(nodeOf.size());
  validateMoeDispatchGemmSpec(spec, R);
  const uint32_t E = spec.experts, K = spec.topk, T = spec.tokens, H = spec.hidden, N = spec.outCols;
  const uint32_t C = spec.capacityOr(), G = R * E;
  const uint64_t block = uint64_t{C} * H;
  const gen::MoePlacement at(nodeOf);
  const bool multiNode = at.multiNode();
  const uint32_t nodeIds = at.ranksOf.rbegin()->first + 1;  // node lists and nodeSend are indexed by node id
  if (multiNode && nodeIds > G)
    bad("node id " + std::to_string(nodeIds - 1) + " is not below the experts in total, " + std::to_string(G) +
        ": the route's node lists are indexed by node id (number the nodes from 0)");
  const uint64_t relayLayout = uint64_t{G} * (uint64_t{C} + 1);  // one relay layout per source
  if (multiNode)
    for (const auto& [name, n] :
         {std::pair<const char*, uint64_t>{"relayRecv (ranks x tokens x hidden)", elements({R, T, H})},
          {"relayLayout (ranks x experts in total x (capacity + 1))", elements({R, relayLayout})},
          {"relaySend (ranks x widest node x experts x capacity x hidden)", elements({R, at.widest, E, C, H})},
          {"nodeSend (nodes x tokens x hidden)", elements({nodeIds, T, H})}})
      if (n > kMaxElements)
        bad("buffer " + std::string(name) + " holds more than 2^50 elements: use fewer tokens or smaller sizes");
  const gen::MoeDispatchFlags flags{R};  // moe_common.hpp says what each counts
  const uint32_t countsFlag = flags.counts(), routedFlag = flags.routed(), gatheredFlag = flags.gathered();
  auto blocksFlag = [flags](uint32_t src) { return flags.blocks(src); };
  auto relayFlag = [flags](uint32_t src) { return flags.relay(src); };

  Schedule s;
  s.nRanks = R;
  s.nodeOf = nodeOf;
  s.nFlags = flags.total(multiNode);
  auto same = [&](uint64_t n) { return std::vector<uint64_t>(R, n); };
  s.buffers = {{"ids", DType::Int32, BufferKind::Input, same(uint64_t{T} * K)},
               {"x", DType::BFloat16, BufferKind::Input, same(uint64_t{T} * H)},
               {"w", DType::BFloat16, BufferKind::Input, same(uint64_t{E} * H * N)},
               {"layout", DType::Int32, BufferKind::Scratch, same(uint64_t{G} * (uint64_t{C} + 1))},
               {"send", DType::BFloat16, BufferKind::Scratch, same(G * block)},
               {"counts", DType::Int32, BufferKind::Scratch, same(G)},
               {"recv", DType::BFloat16, BufferKind::Scratch, same(G * block)},
               {"out", DType::Float32, BufferKind::Output, same(uint64_t{G} * C * N)}};
  if (multiNode)
    s.buffers.insert(s.buffers.end(),
                     {{"nodeLayout", DType::Int32, BufferKind::Scratch, same(uint64_t{G} * (uint64_t{T} + 1))},
                      {"nodeSend", DType::BFloat16, BufferKind::Scratch, same(uint64_t{nodeIds} * T * H)},
                      {"nodeIds", DType::Int32, BufferKind::Scratch, same(uint64_t{nodeIds} * T * K)},
                      {"relayCounts", DType::Int32, BufferKind::Scratch, same(R)},
                      {"relayRecv", DType::BFloat16, BufferKind::Scratch, same(uint64_t{R} * T * H)},
                      {"relayIds", DType::Int32, BufferKind::Scratch, same(uint64_t{R} * T * K)},
                      {"relayLayout", DType::Int32, BufferKind::Scratch, same(R * relayLayout)},
                      {"relaySend", DType::BFloat16, BufferKind::Scratch, same(uint64_t{R} * at.widest * E * block)}});
  // Extents (bound C): "to<j>" = layout[j], what the executing rank sends global expert j; "from<s>.<e>" =
  // counts[s x E + e], what it receives from rank s for its expert e. Both priced at the routing model's value.
  const double uniform = double(T) * K / G;
  const double expected = std::min(double(C), uniform * spec.imbalance);
  auto sourced = [&s](std::string name, uint64_t bound, double value, uint16_t buffer, uint64_t element) {
    ExtentDecl d{std::move(name), bound, value};
    d.sourceBuffer = buffer;
    d.sourceElement = element;
    s.extents.push_back(d);
    return static_cast<uint32_t>(s.extents.size() - 1);
  };
  for (uint32_t j = 0; j < G; ++j) sourced("to" + std::to_string(j), C, expected, kLayout, j);
  for (uint32_t src = 0; src < R; ++src)
    for (uint32_t e = 0; e < E; ++e) {
      sourced("from" + std::to_string(src) + "." + std::to_string(e), C, expected, kCounts, uint64_t{src} * E + e);
      s.gemms.push_back(GemmShape{C, N, H, H, N, N, G + src * E + e});
    }
  // Across nodes (bound T): "node<n>" = nodeLayout[n], the distinct tokens the executing rank sends node n;
  // "relay<s>.<n>" = relayCounts[s], those a relay on n received from s; "fwd<s>.<j>" (bound C) = the relay's
  // count of them for expert j. A node's are priced at T x the chance a token names one of its experts
  // (nodeHitChance) x imbalance, capped at T.
  const uint32_t nodeSlots = multiNode ? nodeIds : 0;
  std::vector<uint32_t> nodeExtent(nodeSlots, kNoExtent);
  std::vector<std::vector<uint32_t>> relayExtent(R, std::vector<uint32_t>(nodeSlots, kNoExtent));
  std::vector<std::vector<uint32_t>> fwdExtent(R, std::vector<uint32_t>(G, kNoExtent));
  for (const auto& [n, ranks] : at.ranksOf) {
    if (!multiNode) break;
    const double perNode = std::min(double(T), T * nodeHitChance(G, uint64_t{E} * ranks.size(), K) * spec.imbalance);
    nodeExtent[n] = sourced("node" + std::to_string(n), T, perNode, kNodeLayout, n);
    for (uint32_t src = 0; src < R; ++src) {
      if (nodeOf[src] == n) continue;
      relayExtent[src][n] =
          sourced("relay" + std::to_string(src) + "." + std::to_string(n), T, perNode, kRelayCounts, src);
      for (uint32_t d : ranks)
        for (uint32_t e = 0; e < E; ++e) {
          const uint32_t j = d * E + e;
          fwdExtent[src][j] = sourced("fwd" + std::to_string(src) + "." + std::to_string(j), C, expected, kRelayLayout,
                                      src * relayLayout + j);
        }
    }
  }

  s.lanes.resize(R);
  for (uint32_t r = 0; r < R; ++r) {
    Lane comm{LaneRole::Intra, 1, {}}, net{LaneRole::InterSend, 1, {}}, forward{LaneRole::InterRecv, 1, {}},
        compute{LaneRole::Compute, spec.computeCtas, {}};
    Step route;
    route.kind = StepKind::Route;
    route.count = uint64_t{T} * K;
    route.aux = K;
    route.value = routeValue(G, C);
    route.dst = bufRef(r, kLayout, 0);
    route.a = bufRef(r, kIds, 0);
    comm.steps.push_back(route);
    if (multiNode) {  // the node lists: each token once per node that owns one of its experts
      route.value = routeValue(G, T);
      route.flags = kStepRouteNodes;
      route.dst = bufRef(r, kNodeLayout, 0);
      comm.steps.push_back(route);
      comm.steps.push_back(flagStep(StepKind::Signal, r, routedFlag, 1));
      net.steps.push_back(flagStep(StepKind::Wait, r, routedFlag, 1));
    }
    // notify: rank d of r's node learns how many tokens r sends each of its experts (other nodes from their relay)
    for (uint32_t d : at.on(nodeOf[r]))
      comm.steps.push_back(move(nodeOf, r, bufRef(d, kCounts, uint64_t{r} * E), bufRef(r, kLayout, uint64_t{d} * E), E,
                                kNoExtent, countsFlag));
    comm.steps.push_back(flagStep(StepKind::Signal, r, countsFlag, 1));
    // across nodes first (the network is the slower link): per other node its distinct tokens and their ids, packed
    // by the node list, to the relay, one proxyput each plus the count that sizes them there
    uint64_t gathered = 0;
    for (const auto& [n, ranks] : at.ranksOf) {
      if (!multiNode || n == nodeOf[r]) continue;
      const uint32_t relay = at.relay(r, n);
      for (const auto& [dst, src, row] :
           {std::tuple<uint16_t, uint16_t, uint32_t>{kNodeSend, kX, H}, {kNodeIds, kIds, K}}) {
        Step gather;
        gather.kind = StepKind::Gather;
        gather.count = uint64_t{T} * row;
        gather.aux = row;
        gather.value = T;
        gather.extent = nodeExtent[n];
        gather.dst = bufRef(r, dst, uint64_t{n} * T * row);
        gather.a = bufRef(r, src, 0);
        gather.b = bufRef(r, kNodeLayout, G + uint64_t{n} * T);
        comm.steps.push_back(gather);
      }
      comm.steps.push_back(flagStep(StepKind::Signal, r, gatheredFlag, 1));
      net.steps.push_back(
          move(nodeOf, r, bufRef(relay, kRelayCounts, r), bufRef(r, kNodeLayout, n), 1, kNoExtent, relayFlag(r)));
      net.steps.push_back(flagStep(StepKind::Wait, r, gatheredFlag, ++gathered));
      net.steps.push_back(move(nodeOf, r, bufRef(relay, kRelayRecv, uint64_t{r} * T * H),
                               bufRef(r, kNodeSend, uint64_t{n} * T * H), uint64_t{T} * H, nodeExtent[n],
                               relayFlag(r)));
      net.steps.push_back(move(nodeOf, r, bufRef(relay, kRelayIds, uint64_t{r} * T * K),
                               bufRef(r, kNodeIds, uint64_t{n} * T * K), uint64_t{T} * K, nodeExtent[n], relayFlag(r)));
    }
    // inside the node: per expert a gather and a put (a copy to itself) of its block at the runtime extent
    for (uint32_t d : at.on(nodeOf[r]))
      for (uint32_t e = 0; e < E; ++e) {
        const uint32_t j = d * E + e;
        Step gather;
        gather.kind = StepKind::Gather;
        gather.count = block;
        gather.aux = H;
        gather.value = T;
        gather.extent = j;
        gather.dst = bufRef(r, kSend, uint64_t{j} * block);
        gather.a = bufRef(r, kX, 0);
        gather.b = bufRef(r, kLayout, G + uint64_t{j} * C);
        comm.steps.push_back(gather);
        comm.steps.push_back(move(nodeOf, r, bufRef(d, kRecv, (uint64_t{r} * E + e) * block),
                                  bufRef(r, kSend, uint64_t{j} * block), block, j, blocksFlag(r)));
      }
    comm.steps.push_back(flagStep(StepKind::Signal, r, blocksFlag(r), E));  // its own blocks are copied
    // relay: per source of another node whose relay r is, route the ids that arrived over this node's experts,
    // then forward the counts and each expert's rows to the ranks of the node, as the source would have
    for (uint32_t src = 0; multiNode && src < R; ++src) {
      if (nodeOf[src] == nodeOf[r] || at.relay(src, nodeOf[r]) != r) continue;
      forward.steps.push_back(flagStep(StepKind::Wait, r, relayFlag(src), 3));
      Step own = route;
      own.value = routeValue(G, C);
      own.flags = kStepRouteOwnNode;
      own.extent = relayExtent[src][nodeOf[r]];
      own.dst = bufRef(r, kRelayLayout, src * relayLayout);
      own.a = bufRef(r, kRelayIds, uint64_t{src} * T * K);
      forward.steps.push_back(own);
      for (uint32_t d : at.on(nodeOf[r]))
        forward.steps.push_back(move(nodeOf, r, bufRef(d, kCounts, uint64_t{src} * E),
                                     bufRef(r, kRelayLayout, src * relayLayout + uint64_t{d} * E), E, kNoExtent,
                                     countsFlag));
      forward.steps.push_back(flagStep(StepKind::Signal, r, countsFlag, 1));
      for (uint32_t d : at.on(nodeOf[r]))
        for (uint32_t e = 0; e < E; ++e) {
          const uint32_t j = d * E + e;
          const uint64_t staged = ((uint64_t{src} * at.widest + at.local[d]) * E + e) * block;
          Step gather;
          gather.kind = StepKind::Gather;
          gather.count = block;
          gather.aux = H;
          gather.value = T;
          gather.extent = fwdExtent[src][j];
          gather.dst = bufRef(r, kRelaySend, staged);
          gather.a = bufRef(r, kRelayRecv, uint64_t{src} * T * H);
          gather.b = bufRef(r, kRelayLayout, src * relayLayout + G + uint64_t{j} * C);
          forward.steps.push_back(gather);
          forward.steps.push_back(move(nodeOf, r, bufRef(d, kRecv, (uint64_t{src} * E + e) * block),
                                       bufRef(r, kRelaySend, staged), block, fwdExtent[src][j], blocksFlag(src)));
        }
      forward.steps.push_back(flagStep(StepKind::Signal, r, blocksFlag(src), E));
    }
    // compute: every source's counts size the GEMMs; each source's blocks as they arrive
    compute.steps.push_back(flagStep(StepKind::Wait, r, countsFlag, R));
    for (uint32_t src = 0; src < R; ++src) {
      compute.steps.push_back(flagStep(StepKind::Wait, r, blocksFlag(src), E));
      Step g;
      g.kind = StepKind::GroupedGemm;
      g.count = E;
      g.aux = src * E;
      g.dst = bufRef(r, kOut, uint64_t{src} * E * C * N);
      g.a = bufRef(r, kRecv, uint64_t{src} * E * block);
      g.b = bufRef(r, kW, 0);
      compute.steps.push_back(g);
    }
    s.lanes[r] = {std::move(comm), std::move(compute)};
    if (!net.steps.empty()) s.lanes[r].push_back(std::move(net));
    if (!forward.steps.empty()) s.lanes[r].push_back(std::move(forward));
  }
  s.info.op = "moe-dispatch-gemm";
  s.info.algo = multiNode ? "node-dedup" : "direct";
  s.info.dtype = DType::BFloat16;
  fillCostAttributes(s);
  return s;
}

}  // namespace mk
