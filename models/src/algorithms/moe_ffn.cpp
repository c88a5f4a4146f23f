// mkernel — the moe-ffn generator (mk/algorithms/moe.hpp): moe-dispatch-gemm's schedule with its grouped GEMM given
// the SwiGLU epilogue, a second grouped GEMM per source, the expert rows returned to their tokens' ranks and the
// combine step there.
#include <cstdint>
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
  const uint16_t kIds = bufferNamed(s, "ids"), kW1 = bufferNamed(s, "w"), kH = bufferNamed(s, "out");
  auto same = [&](uint64_t n) { return std::vector<uint64_t>(R, n); };
  s.buffers[kW1].name = "w1";
  s.buffers[kH] = {"h", DType::BFloat16, BufferKind::Scratch, same(uint64_t{G} * C * F)};
  const auto kWeights = static_cast<uint16_t>(s.buffers.size());
  const uint16_t kW2 = kWeights + 1, kO = kWeights + 2, kBack = kWeights + 3, kY = kWeights + 4;
  s.buffers.push_back({"weights", DType::Float32, BufferKind::Input, same(slots)});
  s.buffers.push_back({"w2", DType::BFloat16, BufferKind::Input, same(uint64_t{E} * F * H)});
  s.buffers.push_back({"o", DType::Float32, BufferKind::Scratch, same(uint64_t{G} * C * H)});
  s.buffers.push_back({"back", DType::Float32, BufferKind::Scratch, same(backRows + uint64_t{G} * T * H)});
  s.buffers.push_back({"y", DType::Float32, BufferKind::Output, same(uint64_t{T} * H)});
  // GEMM 1 writes F columns of "h" (the SwiGLU pairs); GEMM 2's shapes follow, one per (source, expert), sized by
  // the same runtime extent as GEMM 1's group (the rows that arrived).
  const auto first = static_cast<uint32_t>(s.gemms.size());  // R x E shapes, group (src, e) at src x E + e
  for (uint32_t g = 0; g < first; ++g) {
    s.gemms[g].ldc = F;
    s.gemms.push_back(GemmShape{C, H, F, F, H, H, s.gemms[g].extent});
  }
  // Flags: the dispatch's, then "ffn done" (own: +1 per source whose GEMM 2 ran) and "back" (+1 per block returned).
  const uint32_t doneFlag = s.nFlags, backFlag = s.nFlags + 1;
  s.nFlags += 2;
  const uint64_t block = uint64_t{C} * H;  // one (source, expert) block of "o"
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
    // The combine lane: the weights into "back", then each source's blocks home once its FFN ran, then the combine.
    Lane ret{LaneRole::Intra, 1, {}};
    Step copy;
    copy.kind = StepKind::Copy;
    copy.count = slots;
    copy.dst = bufRef(r, kBack, 0);
    copy.a = bufRef(r, kWeights, 0);
    ret.steps.push_back(copy);
    for (uint32_t src = 0; src < R; ++src) {
      ret.steps.push_back(gen::flagStep(StepKind::Wait, r, doneFlag, src + 1));
      for (uint32_t e = 0; e < E; ++e) {
        const uint32_t j = r * E + e;
        // "from<src>.<e>": the rows rank src sent expert e, GEMM 1's and 2's m
        ret.steps.push_back(gen::move(nodeOf, r, bufRef(src, kBack, backRows + uint64_t{j} * T * H),
                                      bufRef(r, kO, (uint64_t{src} * E + e) * block), block, G + src * E + e,
                                      backFlag));
      }
      if (src == r) ret.steps.push_back(gen::flagStep(StepKind::Signal, r, backFlag, E));
    }
    ret.steps.push_back(gen::flagStep(StepKind::Wait, r, backFlag, G));
    Step combine;
    combine.kind = StepKind::Combine;
    combine.count = uint64_t{T} * H;
    combine.aux = K;
    combine.value = combineValue(G, H);
    combine.dst = bufRef(r, kY, 0);
    combine.a = bufRef(r, kBack, 0);
    combine.b = bufRef(r, kIds, 0);
    ret.steps.push_back(combine);
    s.lanes[r].push_back(std::move(ret));
  }
  s.info.op = "moe-ffn";
  s.info.dtype = DType::BFloat16;
  fillCostAttributes(s);
  return s;
}

}  // namespace mk
