// mkernel — the moe-dispatch-gemm generator (mk/algorithms/moe.hpp): route -> notify -> gather -> puts with runtime
// extents -> grouped GEMM per source, every size read from the routing the schedule computes.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

#include "generator_common.hpp"
#include "mk/algorithms/moe.hpp"
#include "mk/error.hpp"
#include "mk/schedule/pack.hpp"
#include "mk/schedule/route.hpp"
#include "mk/schedule/schedule.hpp"

namespace mk {

namespace {

[[noreturn]] void bad(const std::string& what) {
  throw Error(ErrorCode::InvalidArgument, "moe-dispatch-gemm: " + what);
}

using gen::elements;
using gen::flagStep;

/// The buffer ids of the schedule, in declaration order (moe.hpp).
enum Buf : uint16_t { kIds, kX, kW, kLayout, kSend, kCounts, kRecv, kOut };

/// A copy (to the executing rank), put (inside its node) or proxyput (across nodes) of `count` elements, sized by
/// `extent` when it is not kNoExtent, signalling flag `flag` of the receiver +1 unless it is the executing rank.
Step move(const std::vector<uint32_t>& nodeOf, uint32_t r, BufRef dst, BufRef a, uint64_t count, uint32_t extent,
          uint32_t flag) {
  Step st;
  st.kind = dst.rank == r ? StepKind::Copy : nodeOf[dst.rank] == nodeOf[r] ? StepKind::Put : StepKind::ProxyPut;
  st.count = count;
  st.extent = extent;
  st.dst = dst;
  st.a = a;
  if (dst.rank != r) {
    st.flags = kStepSignal;
    st.flag = FlagRef{dst.rank, flag};
    st.value = 1;
  }
  return st;
}

}  // namespace

void validateMoeDispatchGemmSpec(const MoeDispatchGemmSpec& spec, uint32_t nRanks) {
  const std::string where = " on " + std::to_string(nRanks) + " ranks";
  if (nRanks == 0) bad("no ranks: the placement must name at least one");
  if (const char* zero = gen::firstZero({{"experts", spec.experts},
                                         {"topk", spec.topk},
                                         {"tokens", spec.tokens},
                                         {"hidden", spec.hidden},
                                         {"outCols", spec.outCols}}))
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

Schedule generateMoeDispatchGemm(const MoeDispatchGemmSpec& spec, const std::vector<uint32_t>& nodeOf) {
  const auto R = static_cast<uint32_t>(nodeOf.size());
  validateMoeDispatchGemmSpec(spec, R);
  const uint32_t E = spec.experts, K = spec.topk, T = spec.tokens, H = spec.hidden, N = spec.outCols;
  const uint32_t C = spec.capacityOr(), G = R * E;
  const uint64_t block = uint64_t{C} * H;
  // Flags: 0 counts arrived (R: one per source); 1 + s blocks of source s arrived (E); R + 1 routed and R + 2
  // gathered for the network lane (own rank only).
  const uint32_t countsFlag = 0, routedFlag = R + 1, gatheredFlag = R + 2;
  auto blocksFlag = [](uint32_t src) { return 1 + src; };

  Schedule s;
  s.nRanks = R;
  s.nodeOf = nodeOf;
  s.nFlags = R + 3;
  auto same = [&](uint64_t n) { return std::vector<uint64_t>(R, n); };
  s.buffers = {{"ids", DType::Int32, BufferKind::Input, same(uint64_t{T} * K)},
               {"x", DType::BFloat16, BufferKind::Input, same(uint64_t{T} * H)},
               {"w", DType::BFloat16, BufferKind::Input, same(uint64_t{E} * H * N)},
               {"layout", DType::Int32, BufferKind::Scratch, same(uint64_t{G} * (uint64_t{C} + 1))},
               {"send", DType::BFloat16, BufferKind::Scratch, same(G * block)},
               {"counts", DType::Int32, BufferKind::Scratch, same(G)},
               {"recv", DType::BFloat16, BufferKind::Scratch, same(G * block)},
               {"out", DType::Float32, BufferKind::Output, same(uint64_t{G} * C * N)}};
  // Extents (bound C): "to<j>" = layout[j], what the executing rank sends global expert j; "from<s>.<e>" =
  // counts[s x E + e], what it receives from rank s for its expert e. Both priced at the routing model's value.
  const double uniform = double(T) * K / G;
  const double expected = std::min(double(C), uniform * spec.imbalance);
  for (uint32_t j = 0; j < G; ++j) {
    ExtentDecl d{"to" + std::to_string(j), C, expected};
    d.sourceBuffer = kLayout;
    d.sourceElement = j;
    s.extents.push_back(d);
  }
  for (uint32_t src = 0; src < R; ++src)
    for (uint32_t e = 0; e < E; ++e) {
      ExtentDecl d{"from" + std::to_string(src) + "." + std::to_string(e), C, expected};
      d.sourceBuffer = kCounts;
      d.sourceElement = uint64_t{src} * E + e;
      s.extents.push_back(d);
      s.gemms.push_back(GemmShape{C, N, H, H, N, N, G + src * E + e});
    }

  s.lanes.resize(R);
  for (uint32_t r = 0; r < R; ++r) {
    Lane comm{LaneRole::Intra, 1, {}}, net{LaneRole::InterSend, 1, {}}, compute{LaneRole::Compute, 1, {}};
    Step route;
    route.kind = StepKind::Route;
    route.count = uint64_t{T} * K;
    route.aux = K;
    route.value = routeValue(G, C);
    route.dst = bufRef(r, kLayout, 0);
    route.a = bufRef(r, kIds, 0);
    comm.steps.push_back(route);
    // notify: rank d learns how many tokens r sends each of its experts (the network lane's once routed)
    for (uint32_t d = 0; d < R; ++d) {
      Lane& lane = nodeOf[d] == nodeOf[r] ? comm : net;
      if (&lane == &net && net.steps.empty()) net.steps.push_back(flagStep(StepKind::Wait, r, routedFlag, 1));
      lane.steps.push_back(move(nodeOf, r, bufRef(d, kCounts, uint64_t{r} * E), bufRef(r, kLayout, uint64_t{d} * E), E,
                                kNoExtent, countsFlag));
    }
    if (!net.steps.empty()) comm.steps.insert(comm.steps.begin() + 1, flagStep(StepKind::Signal, r, routedFlag, 1));
    comm.steps.push_back(flagStep(StepKind::Signal, r, countsFlag, 1));
    // dispatch: the blocks bound for other nodes first (the network is the slower link), then those of the node
    uint64_t gathered = 0;
    for (const bool remote : {true, false})
      for (uint32_t j = 0; j < G; ++j) {
        const uint32_t d = j / E;
        if ((nodeOf[d] != nodeOf[r]) != remote) continue;
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
        const Step put = move(nodeOf, r, bufRef(d, kRecv, (uint64_t{r} * E + j % E) * block),
                              bufRef(r, kSend, uint64_t{j} * block), block, j, blocksFlag(r));
        if (remote) {
          comm.steps.push_back(flagStep(StepKind::Signal, r, gatheredFlag, 1));
          net.steps.push_back(flagStep(StepKind::Wait, r, gatheredFlag, ++gathered));
          net.steps.push_back(put);
        } else {
          comm.steps.push_back(put);
        }
      }
    comm.steps.push_back(flagStep(StepKind::Signal, r, blocksFlag(r), E));  // its own blocks are copied
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
  }
  s.info.op = "moe-dispatch-gemm";
  s.info.algo = "direct";
  s.info.dtype = DType::BFloat16;
  fillCostAttributes(s);
  return s;
}

}  // namespace mk
