// mkernel — the compute lanes' op-independent GemmParams and operand checks (gemm_lane_params.hpp): no CUDA.
#include "gemm/gemm_lane_params.hpp"

#include <sstream>
#include <string>

#include "mk/error.hpp"

namespace mk::runtime {
namespace {

uint64_t ceilDiv(uint64_t a, uint64_t b) { return (a + b - 1) / b; }

}  // namespace

device::GemmParams gemmLaneParams(const device::LoweredGemm& g, uint64_t waitLimitNs) {
  using Cfg = device::GemmTileConfigT<256>;
  if ((g.blockN != 128 && g.blockN != 256) || g.m == 0 || g.n == 0 || g.k == 0)
    throw Error(ErrorCode::Internal, "lane " + std::to_string(g.lane) + " step " + std::to_string(g.step) +
                                         " (gemm): the lowered record has m " + std::to_string(g.m) + ", n " +
                                         std::to_string(g.n) + ", k " + std::to_string(g.k) + ", tile width " +
                                         std::to_string(g.blockN) +
                                         " (expected m, n, k >= 1 and a width of 128 or 256)");
  device::GemmParams p{};
  p.tmaStoreC = (g.flags & device::kLgTmaStore) ? 1u : 0u;
  p.ldc = g.ldc;
  p.m = g.m;
  p.n = g.n;
  p.k = g.k;
  p.tilesM = static_cast<uint32_t>(ceilDiv(g.m, Cfg::kBlockM));
  p.tilesN = static_cast<uint32_t>(ceilDiv(g.n, g.blockN));
  p.blockN = g.blockN;
  p.kIters = static_cast<uint32_t>(ceilDiv(g.k, Cfg::kBlockK));
  p.groupM = 8;
  p.out = g.outDType == static_cast<uint8_t>(DType::Float32) ? device::GemmOut::Float32 : device::GemmOut::BFloat16;
  p.bRowMajor = (g.flags & device::kLgBColMajor) ? 0u : 1u;
  p.splitK = 1;
  p.kItersPerSplit = p.kIters;
  p.accumulate = (g.flags & device::kLgAccumulate) ? 1u : 0u;
  p.tag = (uint32_t{g.lane} << 16) | (g.step & 0xFFFFu);
  p.waitLimitNs = waitLimitNs;
  // The kernel splits tilesM x tilesN tiles among the step's activeCtas (= g.ctas) CTAs: the lowering's count
  // must be the same, and no CTA may be left without a tile (it would return before the others' work).
  if (uint64_t{p.tilesM} * p.tilesN != g.tiles || g.ctas == 0 || g.ctas > g.tiles)
    throw Error(ErrorCode::Internal, "lane " + std::to_string(g.lane) + " step " + std::to_string(g.step) +
                                         " (gemm): the lowered record says " + std::to_string(g.tiles) + " tiles on " +
                                         std::to_string(g.ctas) + " CTAs, the tile engine counts " +
                                         std::to_string(uint64_t{p.tilesM} * p.tilesN) + " tiles");
  return p;
}

uint64_t gemmLaneWaitLimitNs(uint64_t pollBudgetNs) { return pollBudgetNs / 2 > 0 ? pollBudgetNs / 2 : 1; }

void checkComputeOperands(const LoweredProgram& program, uint32_t rank, const void* input, const void* output) {
  std::vector<uint64_t> bases(program.buffers.size(), 0);
  for (size_t b = 0; b < bases.size(); ++b) {
    const BufferKind kind = program.buffers[b].kind;
    bases[b] = kind == BufferKind::Input                                   ? reinterpret_cast<uint64_t>(input)
               : (kind == BufferKind::Output || kind == BufferKind::InOut) ? reinterpret_cast<uint64_t>(output)
                                                                           : 0;
  }
  checkComputeOperands(program, rank, bases);
}

void checkComputeOperands(const LoweredProgram& program, uint32_t rank, const std::vector<uint64_t>& bases) {
  const uint32_t nB = program.image.empty() ? 0 : program.header().nBuffers;
  // Each operand: its encoding, name, the alignment its engine needs, step kind, lane and step.
  struct Operand {
    uint64_t op;
    const char* name;
    uint32_t align;
    const char* kind;
    uint32_t lane, step;
  };
  std::vector<Operand> ops;
  const device::LoweredGemm* g = loweredGemms(program);
  for (uint32_t i = 0; i < gemmCount(program); ++i)
    for (const auto& [op, name] : {std::pair<uint64_t, const char*>{g[i].a, "A"}, {g[i].b, "B"}, {g[i].dst, "C"}})
      ops.push_back(Operand{op, name, 16, "gemm", g[i].lane, g[i].step});
  const device::LoweredAttention* at = loweredAttentions(program);
  for (uint32_t i = 0; i < attentionCount(program); ++i) {
    ops.push_back(Operand{at[i].q, "Q (a)", 16, "attention", at[i].lane, at[i].step});
    ops.push_back(Operand{at[i].kv, "K / V (b)", 16, "attention", at[i].lane, at[i].step});
    ops.push_back(Operand{at[i].dst, "out (dst)", 4, "attention", at[i].lane, at[i].step});
  }
  const device::LoweredGroupedGemm* gg = loweredGroupedGemms(program);
  for (uint32_t i = 0; i < groupedGemmCount(program); ++i) {
    for (const auto& [op, name] : {std::pair<uint64_t, const char*>{gg[i].a, "A"}, {gg[i].b, "B"}, {gg[i].dst, "C"}})
      ops.push_back(Operand{op, name, 16, "grouped-gemm", gg[i].lane, gg[i].step});
    if (gg[i].counts != device::kStaticGroupCounts)
      ops.push_back(Operand{gg[i].counts, "counts", 4, "grouped-gemm", gg[i].lane, gg[i].step});
  }
  for (const Operand& o : ops) {
    const uint32_t buffer = static_cast<uint32_t>(o.op >> device::kOperandShift) % nB;
    const BufferKind kind = program.buffers[buffer].kind;
    if (kind == BufferKind::Scratch) continue;  // engine memory: 256-byte aligned arenas
    const uint64_t base = buffer < bases.size() ? bases[buffer] : 0;
    const uint64_t addr = base + (o.op & device::kOperandOffsetMask);
    if (base == 0 || addr % o.align != 0) {
      std::ostringstream os;
      os << "execute: rank " << rank << " lane " << o.lane << " step " << o.step << " (" << o.kind << "): " << o.name
         << " at " << (kind == BufferKind::Input ? "input" : "output") << " buffer " << buffer << " "
         << reinterpret_cast<const void*>(base) << " + " << (o.op & device::kOperandOffsetMask) << " bytes "
         << (base == 0 ? "has no buffer (null pointer)"
                       : "is not " + std::to_string(o.align) + "-byte aligned (the " + o.kind + " engine needs it)");
      throw Error(ErrorCode::InvalidArgument, os.str());
    }
  }
}

}  // namespace mk::runtime
