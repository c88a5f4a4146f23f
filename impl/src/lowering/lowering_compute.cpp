// The Lowerer's compute and routing steps: Gemm, Attention, GroupedGemm (the compute lane's records), Route, Gather,
// Combine (lowerer.hpp).

#include <algorithm>
#include <string>

#include "lowering/attention_step.hpp"
#include "lowering/extents.hpp"
#include "lowering/grouped_gemm_step.hpp"
#include "lowering/lowerer.hpp"
#include "lowering/route_steps.hpp"
#include "mk/gemm_choice.hpp"
#include "mk/schedule/route.hpp"

namespace mk::runtime::lowering_detail {

// ---- compute lanes: Gemm steps (mk/device/compute_lane_device.hpp) --------------------------------------
/// Lower one Gemm step: check what the tile engine can run (the rules of mk::validateGemm, on the
/// schedule's offsets: the op's base addresses are checked when it is submitted), choose the tile width
/// for the lane's CTAs, record a LoweredGemm and point the step at it (count = its index). The step's
/// CTAs touch C, A and B in tiles, not in ctaPiece pieces: a lane barrier separates it from any earlier
/// step of the lane touching the same memory, and later steps touching C from it.
void Lowerer::lowerGemm(uint32_t l, uint32_t i, const Step& st, uint32_t n, LoweredStep& ls,
                        std::vector<Access>& pending) {
  requireStaticGemm(s_, rank_, l, i);
  if (st.aux >= s_.gemms.size())
    failStep(ErrorCode::InvalidSchedule, l, i,
             "gemm index " + std::to_string(st.aux) + " is outside the schedule's " + std::to_string(s_.gemms.size()) +
                 " gemm shapes");
  const GemmShape& g = s_.gemms[st.aux];
  const std::string shape = "gemms[" + std::to_string(st.aux) + "] (m " + std::to_string(g.m) + ", n " +
                            std::to_string(g.n) + ", k " + std::to_string(g.k) + ")";
  if (g.m == 0 || g.n == 0 || g.k == 0)
    failStep(ErrorCode::Unsupported, l, i, shape + ": the GPU tile engine needs m, n and k >= 1");
  const bool colB = (st.flags & kStepBColMajor) != 0;
  const bool accumulate = (st.flags & kStepAccumulate) != 0;
  if (g.lda < g.k)
    failStep(ErrorCode::InvalidSchedule, l, i,
             shape + ": lda " + std::to_string(g.lda) + " < k " + std::to_string(g.k));
  const uint32_t needLdb = colB ? g.k : g.n;
  if (g.ldb < needLdb)
    failStep(ErrorCode::InvalidSchedule, l, i,
             shape + ": ldb " + std::to_string(g.ldb) + " < " + (colB ? "k " : "n ") + std::to_string(needLdb) +
                 (colB ? " (B column-major)" : " (B row-major)"));
  if (g.ldc < g.n)
    failStep(ErrorCode::InvalidSchedule, l, i,
             shape + ": ldc " + std::to_string(g.ldc) + " < n " + std::to_string(g.n));
  for (const auto& [ld, name] : {std::pair<uint32_t, const char*>{g.lda, "lda"}, {g.ldb, "ldb"}, {g.ldc, "ldc"}})
    if (ld % 8 != 0)
      failStep(ErrorCode::Unsupported, l, i,
               shape + ": " + name + " " + std::to_string(ld) +
                   " is not a multiple of 8 elements (the tile engine's TMA needs 16-byte aligned rows)");
  for (const auto& [ref, name] :
       {std::pair<const BufRef*, const char*>{&st.dst, "C (dst)"}, {&st.a, "A (a)"}, {&st.b, "B (b)"}})
    if (ref->rank != rank_)
      failStep(ErrorCode::Unsupported, l, i,
               std::string(name) + " lives on rank " + std::to_string(ref->rank) +
                   ": a Gemm step reads and writes only its own rank's memory (Put the tile afterwards)");
  const uint64_t cExtent = (uint64_t{g.m} - 1) * g.ldc + g.n;
  const uint64_t aExtent = (uint64_t{g.m} - 1) * g.lda + g.k;
  const uint64_t bExtent = colB ? (uint64_t{g.n} - 1) * g.ldb + g.k : (uint64_t{g.k} - 1) * g.ldb + g.n;
  ls.dst = encode(l, i, st.dst, cExtent, "C (dst)");
  ls.a = encode(l, i, st.a, aExtent, "A (a)");
  ls.b = encode(l, i, st.b, bExtent, "B (b)");
  const DType ct = s_.buffers[st.dst.buffer].dtype;
  if (s_.buffers[st.a.buffer].dtype != DType::BFloat16 || s_.buffers[st.b.buffer].dtype != DType::BFloat16)
    failStep(ErrorCode::Unsupported, l, i,
             std::string("A and B must be bfloat16 buffers (got A ") + toString(s_.buffers[st.a.buffer].dtype) +
                 ", B " + toString(s_.buffers[st.b.buffer].dtype) + ")");
  if (ct != DType::BFloat16 && ct != DType::Float32)
    failStep(ErrorCode::Unsupported, l, i,
             std::string("C must be a bfloat16 or float32 buffer (got ") + toString(ct) + ")");
  for (const auto& [op, name] : {std::pair<uint64_t, const char*>{ls.dst, "C (dst)"}, {ls.a, "A (a)"}, {ls.b, "B (b)"}})
    if ((op & device::kOperandOffsetMask) % 16 != 0)
      failStep(ErrorCode::Unsupported, l, i,
               std::string(name) + " starts " + std::to_string(op & device::kOperandOffsetMask) +
                   " bytes into its buffer, not a multiple of 16 (TMA needs 16-byte aligned tiles)");
  auto overlap = [](const BufRef& x, uint64_t nx, const BufRef& y, uint64_t ny) {
    return x.rank == y.rank && x.buffer == y.buffer && x.offset < y.offset + ny && y.offset < x.offset + nx;
  };
  if (overlap(st.dst, cExtent, st.a, aExtent) || overlap(st.dst, cExtent, st.b, bExtent))
    failStep(ErrorCode::InvalidSchedule, l, i, "the C tile overlaps the A or B tile");
  requireComputeBinding(l, i);

  device::LoweredGemm lg{};
  lg.m = g.m;
  lg.n = g.n;
  lg.k = g.k;
  lg.lda = g.lda;
  lg.ldb = g.ldb;
  lg.ldc = g.ldc;
  lg.blockN = gemmChooseTileN(g.m, g.n, n);
  lg.tiles = static_cast<uint32_t>(((uint64_t{g.m} + 127) / 128) * ((uint64_t{g.n} + lg.blockN - 1) / lg.blockN));
  lg.ctas = std::min<uint32_t>(n, lg.tiles);
  // The staged epilogue stores bf16 only, clips correctly only when n % 8 == 0 (docs/gemm.md), and does not
  // read the old C: accumulation and fp32 output take the direct epilogue.
  const bool tmaStore = ct == DType::BFloat16 && g.n % 8 == 0 && !accumulate;
  lg.flags = (colB ? device::kLgBColMajor : 0u) | (accumulate ? device::kLgAccumulate : 0u) |
             (tmaStore ? device::kLgTmaStore : 0u);
  lg.lane = static_cast<uint16_t>(l);
  lg.outDType = static_cast<uint8_t>(ct);
  lg.step = i;
  lg.a = ls.a;
  lg.b = ls.b;
  lg.dst = ls.dst;
  ls.dtype = static_cast<uint8_t>(ct);
  ls.activeCtas = static_cast<uint16_t>(lg.ctas);
  ls.count = gemms_.size();
  ls.value = 0;
  gemms_.push_back(lg);

  if (n > 1) addTiledAccesses(l, i, st, cExtent, aExtent, bExtent, ls, pending);
}

/// A compute step's CTAs touch dst (written), a and b (read) in tiles or units, not in ctaPiece pieces: never the
/// "same piece" as another step's access, so a lane barrier separates it from any earlier step of the lane touching
/// the same memory, and later steps touching its dst from it.
void Lowerer::addTiledAccesses(uint32_t l, uint32_t i, const Step& st, uint64_t dstExtent, uint64_t aExtent,
                               uint64_t bExtent, LoweredStep& ls, std::vector<Access>& pending) {
  const std::vector<Access> mine = {
      Access{st.dst.rank, st.dst.buffer, true, st.dst.offset, st.dst.offset + dstExtent, kTiled, 0},
      Access{st.a.rank, st.a.buffer, false, st.a.offset, st.a.offset + aExtent, kTiled, 0},
      Access{st.b.rank, st.b.buffer, false, st.b.offset, st.b.offset + bExtent, kTiled, 0}};
  bool conflict = false;
  for (const Access& x : mine)
    for (const Access& y : pending)
      if ((x.write || y.write) && overlaps(x, y)) conflict = true;
  if (conflict) {
    ls.bits |= device::kLsBarrierBefore;
    ls.barrierSync = newSyncPoint(l, i);
    pending.clear();
  }
  pending.insert(pending.end(), mine.begin(), mine.end());
}

/// Every compute step's parameter block is one more binding per rank (compute_lane_device.hpp).
void Lowerer::requireComputeBinding(uint32_t l, uint32_t i) const {
  const uint64_t bindings = uint64_t{s_.nRanks} * s_.buffers.size() + s_.nRanks;
  if (bindings > device::kMaxBindings)
    failStep(ErrorCode::Unsupported, l, i,
             "a schedule with compute steps (Gemm, GroupedGemm, Attention) binds one more address per rank (their "
             "tensor maps): " +
                 std::to_string(s_.buffers.size()) + " buffers on " + std::to_string(s_.nRanks) + " ranks need " +
                 std::to_string(bindings) + ", the engine carries at most " + std::to_string(device::kMaxBindings));
}

/// Lower one Attention step (attention_step.hpp's checks and record): its CTAs draw the step's units from a
/// counter (runAttentionStep), count = its record's index.
void Lowerer::lowerAttention(uint32_t l, uint32_t i, const Step& st, uint32_t n, LoweredStep& ls,
                             std::vector<Access>& pending) {
  AttentionStepLowering a = lowerAttentionStep(s_, rank_, l, i, n);
  ls.dst = encode(l, i, st.dst, a.spans.out, "out (dst)");
  ls.a = encode(l, i, st.a, a.spans.q, "Q (a)");
  ls.b = encode(l, i, st.b, a.spans.kv, "K / V (b)");
  requireComputeBinding(l, i);
  a.record.q = ls.a;
  a.record.kv = ls.b;
  a.record.dst = ls.dst;
  ls.dtype = static_cast<uint8_t>(DType::Float32);
  ls.activeCtas = static_cast<uint16_t>(a.record.ctas);
  ls.count = attentions_.size();
  ls.value = 0;
  attentions_.push_back(a.record);
  if (n > 1) addTiledAccesses(l, i, st, a.spans.out, a.spans.q, a.spans.kv, ls, pending);
}

/// Lower one GroupedGemm step (grouped_gemm_step.hpp's checks and record): its CTAs take the tiles of the list the
/// engine builds from the counts when the step starts (runGroupedGemmStep), count = its record's index.
void Lowerer::lowerGroupedGemm(uint32_t l, uint32_t i, const Step& st, uint32_t n, LoweredStep& ls,
                               std::vector<Access>& pending) {
  GroupedGemmStepLowering g = lowerGroupedGemmStep(s_, rank_, l, i, n);
  ls.dst = encode(l, i, st.dst, g.cSpan, "C (dst)");
  ls.a = encode(l, i, st.a, g.aSpan, "A (a)");
  ls.b = encode(l, i, st.b, g.bSpan, "B (b)");
  auto overlap = [](const BufRef& x, uint64_t nx, const BufRef& y, uint64_t ny) {
    return x.rank == y.rank && x.buffer == y.buffer && x.offset < y.offset + ny && y.offset < x.offset + nx;
  };
  if (overlap(st.dst, g.cSpan, st.a, g.aSpan) || overlap(st.dst, g.cSpan, st.b, g.bSpan))
    failStep(ErrorCode::InvalidSchedule, l, i, "C overlaps A or B");
  if (g.counted) {
    g.record.counts = encode(l, i, g.counts, g.record.groups, "the groups' counts");
    if (overlap(st.dst, g.cSpan, g.counts, g.record.groups))
      failStep(ErrorCode::InvalidSchedule, l, i, "C overlaps the groups' counts");
  }
  requireComputeBinding(l, i);
  g.record.a = ls.a;
  g.record.b = ls.b;
  g.record.dst = ls.dst;
  ls.dtype = g.record.outDType;
  ls.activeCtas = static_cast<uint16_t>(g.record.ctas);
  ls.count = groupedGemms_.size();
  ls.value = 0;
  groupedGemms_.push_back(g.record);
  if (n > 1) {
    // Every CTA of the step reads the counts: an earlier write of the lane to them needs the lane barrier, as A's.
    const Access counts{
        g.counts.rank, g.counts.buffer, false, g.counts.offset, g.counts.offset + g.record.groups, kTiled, 0};
    if (g.counted &&
        std::any_of(pending.begin(), pending.end(), [&](const Access& y) { return y.write && overlaps(counts, y); })) {
      ls.bits |= device::kLsBarrierBefore;
      ls.barrierSync = newSyncPoint(l, i);
      pending.clear();
    }
    addTiledAccesses(l, i, st, g.cSpan, g.aSpan, g.bSpan, ls, pending);
    if (g.counted) pending.push_back(counts);
  }
}

/// Lower one routing step (Route, Combine, Gather; route_steps.hpp's checks): their CTAs take whole tokens or rows,
/// not ctaPiece pieces (route_ops.cuh), so they join the lane's accesses as tiled ones.
void Lowerer::lowerRoutingStep(uint32_t l, uint32_t i, const Step& st, uint32_t n, LoweredStep& ls,
                               std::vector<Access>& pending) {
  switch (st.kind) {
    case StepKind::Route: {
      // One CTA walks the ids in order (route_ops.cuh): the layout's lists are in token order.
      const RouteStepSpans sp = checkRouteStep(s_, rank_, l, i);
      ls.dst = encode(l, i, st.dst, sp.dst, "the layout (dst)");
      ls.a = encode(l, i, st.a, sp.a, "the ids (a)");
      ls.dtype = static_cast<uint8_t>(DType::Int32);
      ls.flagId = st.aux;  // topk
      if (n > 1) addTiledAccesses(l, i, st, sp.dst, sp.a, 0, ls, pending);
      break;
    }
    case StepKind::Combine: {
      // Whole tokens per CTA (route_ops.cuh's combineRows, the compute kernel only).
      const RouteStepSpans sp = checkCombineStep(s_, rank_, l, i);
      const CombineShape c = combineShape(st);
      ls.dst = encode(l, i, st.dst, sp.dst, "dst");
      ls.a = encode(l, i, st.a, sp.a, "the weights and rows (a)");
      ls.b = encode(l, i, st.b, sp.b, "the ids (b)");
      ls.dtype = static_cast<uint8_t>(DType::Float32);
      ls.flagId = c.topk;
      ls.flagRank = static_cast<uint32_t>(c.tokens);
      ls.activeCtas = static_cast<uint16_t>(
          std::min<uint64_t>(activeFor(st.count * sizeof(float), n), std::max<uint64_t>(1, c.tokens)));
      if (n > 1) addTiledAccesses(l, i, st, sp.dst, sp.a, sp.b, ls, pending);
      break;
    }
    case StepKind::Gather: {
      // Whole rows per CTA (a warp per row): pieces of rows, not of elements.
      const RouteStepSpans sp = checkGatherStep(s_, rank_, l, i);
      ls.dst = encode(l, i, st.dst, sp.dst, "dst");
      ls.a = encode(l, i, st.a, sp.a, "the source rows (a)");
      ls.b = encode(l, i, st.b, sp.b, "the indices (b)");
      const DType dt = s_.buffers[st.dst.buffer].dtype;
      ls.dtype = static_cast<uint8_t>(dt);
      ls.flagId = st.aux;  // elements of a row
      ls.activeCtas = static_cast<uint16_t>(
          std::min<uint64_t>(activeFor(st.count * dtypeSize(dt), n), std::max<uint64_t>(1, st.count / st.aux)));
      if (n > 1) addTiledAccesses(l, i, st, sp.dst, sp.a, sp.b, ls, pending);
      break;
    }
    default: failStep(ErrorCode::InvalidSchedule, l, i, std::string("not a routing step: ") + toString(st.kind));
  }
}

}  // namespace mk::runtime::lowering_detail
