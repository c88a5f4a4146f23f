// The Lowerer's data, sync, proxy and packet steps, and the lane barriers their accesses need (lowerer.hpp).

#include <algorithm>
#include <string>

#include "lowering/extents.hpp"
#include "lowering/lowerer.hpp"

namespace mk::runtime::lowering_detail {

void Lowerer::lowerLane(uint32_t l, uint32_t n, std::vector<LoweredStep>& out) {
  const Lane& lane = s_.lanes[rank_][l];
  std::vector<Access> pending;
  for (uint32_t i = 0; i < lane.steps.size(); ++i) {
    const Step& st = lane.steps[i];
    LoweredStep ls{};
    ls.kind = static_cast<uint8_t>(st.kind);
    ls.redop = static_cast<uint8_t>(st.op);
    ls.count = st.count;
    ls.value = st.value;
    ls.activeCtas = 1;
    if (!kindInfo(st.kind).gpu)
      failStep(ErrorCode::Unsupported, l, i,
               std::string("the GPU engine does not run ") + toString(st.kind) +
                   " steps yet; run the schedule on the CPU executor");
    lowerStepExtent(s_, rank_, l, i, ls, &extentSources_);
    switch (st.kind) {
      case StepKind::Copy:
      case StepKind::Put:
      case StepKind::Reduce: lowerDataStep(l, i, st, n, ls, pending); break;
      case StepKind::Signal: addSignal(l, i, st, n, ls); break;
      case StepKind::Wait:
        requireSyncReferences(s_, rank_, l, i);
        ls.flagRank = st.flag.rank;
        ls.flagId = st.flag.id;
        lowerPacketWait(l, i, st, n, ls, pending);
        break;
      case StepKind::Barrier:
        requireSyncReferences(s_, rank_, l, i);
        ls.flagId = st.aux;
        if (n > 1) ls.arriveSync = newSyncPoint(l, i);
        pending.clear();  // every CTA waits for the barrier, which the last arrival opens
        break;
      case StepKind::ProxyPut: lowerProxyPut(l, i, st, n, ls, pending); break;
      case StepKind::Gemm: lowerGemm(l, i, st, n, ls, pending); break;
      case StepKind::Attention: lowerAttention(l, i, st, n, ls, pending); break;
      case StepKind::GroupedGemm: lowerGroupedGemm(l, i, st, n, ls, pending); break;
      case StepKind::Route:
      case StepKind::Combine:
      case StepKind::Gather: lowerRoutingStep(l, i, st, n, ls, pending); break;
      default:
        failStep(ErrorCode::InvalidSchedule, l, i, "unknown step kind " + std::to_string(static_cast<int>(st.kind)));
    }
    out.push_back(ls);
  }
}

/// Lower one Copy, Put or Reduce: dtypes and operators the element loops know, CTAs by bytes, the lane barrier
/// before it where it touches what an earlier step of the lane touched in other pieces, its flag.
void Lowerer::lowerDataStep(uint32_t l, uint32_t i, const Step& st, uint32_t n, LoweredStep& ls,
                            std::vector<Access>& pending) {
  const bool reduce = st.kind == StepKind::Reduce;
  ls.dst = encode(l, i, st.dst, st.count, "dst");
  ls.a = encode(l, i, st.a, st.count, reduce ? "lhs" : "src");
  if (reduce) ls.b = encode(l, i, st.b, st.count, "rhs");
  const DType dt = s_.buffers[st.dst.buffer].dtype;
  if (s_.buffers[st.a.buffer].dtype != dt || (reduce && s_.buffers[st.b.buffer].dtype != dt))
    failStep(ErrorCode::InvalidSchedule, l, i,
             "operands have different dtypes (the engine converts only when rounding a Reduce)");
  if (reduce && !isRedOp(static_cast<uint8_t>(st.op)))
    failStep(ErrorCode::InvalidSchedule, l, i, "unknown reduction operator " + std::to_string(static_cast<int>(st.op)));
  // The engine's element loops know float32, bfloat16, float16 and the element-wise operators; anything
  // else is refused here rather than run as a type or operator the kernel does know.
  // int32 (routing data: counts, ids) moves as bytes; it is never reduced (the CPU executor refuses that).
  const bool moves = dt == DType::Int32 && !reduce;
  if (dt != DType::Float32 && dt != DType::BFloat16 && dt != DType::Float16 && !moves)
    failStep(ErrorCode::Unsupported, l, i,
             std::string("the GPU engine does not ") + (reduce ? "reduce " : "move ") + toString(dt) +
                 " elements yet (float32, bfloat16, float16" + (reduce ? "" : ", int32") +
                 "); run it on the CPU executor");
  // A row operator (lse-merge): float32 rows of aux values and their log-sum-exp, split among the CTAs by
  // whole rows (kRowPieces below); the row width travels in extentUnit (such a step has no runtime extent).
  const bool rows = reduce && redOpInfo(st.op).shape == RedOpShape::LseRows;
  if (reduce && !rows && redOpInfo(st.op).shape != RedOpShape::Elementwise)
    failStep(ErrorCode::Unsupported, l, i,
             std::string("the GPU engine's reduction kernels do not run ") + toString(st.op) +
                 " yet (sum, max, min, lse-merge); run it on the CPU executor");
  if (rows && (dt != DType::Float32 || st.extent != kNoExtent || st.aux == 0 || st.count % (uint64_t{st.aux} + 1) != 0))
    failStep(ErrorCode::Unsupported, l, i,
             "the GPU engine merges float32 lse rows of a fixed count only (a whole number of rows of row + 1 "
             "elements, no runtime extent)");
  ls.dtype = static_cast<uint8_t>(dt);
  ls.activeCtas = static_cast<uint16_t>(activeFor(st.count * dtypeSize(dt), n));
  if (rows) {
    ls.extentUnit = st.aux;
    ls.activeCtas = static_cast<uint16_t>(
        std::min<uint64_t>(ls.activeCtas, std::max<uint64_t>(1, st.count / (uint64_t{st.aux} + 1))));
  }
  // A packet Put writes the receiver's packet area, never its buffers: only its source counts for rule 3.
  const auto sent = packets_.sendOffset.find({rank_, l, i});
  const bool packet = sent != packets_.sendOffset.end();
  for (const BufRef* ref : {packet ? nullptr : &st.dst, &st.a, reduce ? &st.b : nullptr})
    if (ref && ref->rank != rank_ && isUserBuffer(ref->buffer)) ls.entryMask |= static_cast<uint16_t>(1u << ref->rank);
  if (n > 1) {
    const uint64_t key = st.count;
    std::vector<Access> mine;
    mine.push_back(
        Access{st.dst.rank, st.dst.buffer, true, st.dst.offset, st.dst.offset + st.count, key, ls.activeCtas});
    mine.push_back(Access{st.a.rank, st.a.buffer, false, st.a.offset, st.a.offset + st.count, key, ls.activeCtas});
    if (reduce)
      mine.push_back(Access{st.b.rank, st.b.buffer, false, st.b.offset, st.b.offset + st.count, key, ls.activeCtas});
    // Row pieces (lse-merge) equal only another row step's of the same count, width and CTAs: a partition
    // key no element step has.
    for (Access& x : mine) x.extent = rows ? (kRowPieces | st.aux) : ls.extent;
    bool conflict = false;
    for (const Access& x : mine)
      for (const Access& y : pending)
        if ((x.write || y.write) && overlaps(x, y) && !samePiece(x, y)) conflict = true;
    if (conflict) {
      ls.bits |= device::kLsBarrierBefore;
      ls.barrierSync = newSyncPoint(l, i);
      pending.clear();
    }
    pending.insert(pending.end(), mine.begin(), mine.end());
  }
  if (packet) {
    ls.bits |= device::kLsPacket;
    ls.flagRank = st.flag.rank;
    ls.flagId = st.flag.id;
    ls.value = sent->second;
  } else if (incrementsFlag(st.kind, st.flags)) {
    addSignal(l, i, st, n, ls);
  }
}

uint32_t Lowerer::newSyncPoint(uint32_t l, uint32_t i) {
  if (syncPoints_ >= device::kMaxSyncPoints)
    failStep(ErrorCode::Unsupported, l, i,
             "needs more than " + std::to_string(device::kMaxSyncPoints) +
                 " lane sync points on this rank (fewer chunks, or fewer CTAs per lane)");
  return syncPoints_++;
}

/// A ProxyPut: the lane's first CTA pushes its command to the proxy (which reads the source and writes the
/// destination on the other node) and waits until the source was read. The source read counts as an access of
/// that CTA alone, so a later step of the lane that overwrites it waits at a lane barrier; a destination in a
/// user buffer waits until its rank entered the op (rule 3, through the relayed entered count).
void Lowerer::lowerProxyPut(uint32_t l, uint32_t i, const Step& st, uint32_t n, LoweredStep& ls,
                            std::vector<Access>& pending) {
  if (st.dst.rank < s_.nRanks && st.dst.rank < s_.nodeOf.size() && s_.nodeOf[st.dst.rank] == s_.nodeOf[rank_])
    failStep(ErrorCode::InvalidSchedule, l, i,
             "a ProxyPut targets rank " + std::to_string(st.dst.rank) + " on this rank's own node (use a Put)");
  static_assert(device::kMaxLanes <= device::kProxyMaxLanes, "a command must be able to name every lane");
  ls.dst = encode(l, i, st.dst, st.count, "dst");
  ls.a = encode(l, i, st.a, st.count, "src");
  const DType dt = s_.buffers[st.dst.buffer].dtype;
  if (s_.buffers[st.a.buffer].dtype != dt)
    failStep(ErrorCode::InvalidSchedule, l, i, "operands have different dtypes (a ProxyPut copies bytes)");
  if (st.a.rank != rank_)
    failStep(ErrorCode::InvalidSchedule, l, i,
             "a ProxyPut reads rank " + std::to_string(st.a.rank) + "'s memory; its source must be this rank's");
  ls.dtype = static_cast<uint8_t>(dt);
  ls.activeCtas = 1;
  if (st.flags & kStepSignal) {
    requireSyncReferences(s_, rank_, l, i);
    ls.bits |= device::kLsRemoteSignal;
    ls.flagRank = st.flag.rank;
    ls.flagId = st.flag.id;
  }
  if (isUserBuffer(st.dst.buffer)) ls.entryMask |= static_cast<uint16_t>(1u << st.dst.rank);
  if (n > 1 && st.count > 0) {
    const Access read{st.a.rank, st.a.buffer, false, st.a.offset, st.a.offset + st.count, st.count, 1};
    bool conflict = false;
    for (const Access& y : pending)
      if (y.write && overlaps(read, y) && !samePiece(read, y)) conflict = true;
    if (conflict) {
      ls.bits |= device::kLsBarrierBefore;
      ls.barrierSync = newSyncPoint(l, i);
      pending.clear();
    }
    pending.push_back(read);
  }
}

/// A Wait on a flag that LL packet Puts raise: it unpacks their runs (LoweredPacketRecv[value, value + count))
/// instead of polling the flag, each run split among the lane's first activeCtas CTAs like a data step, and
/// each run's destination counted as a write of those CTAs.
void Lowerer::lowerPacketWait(uint32_t l, uint32_t i, const Step& st, uint32_t n, LoweredStep& ls,
                              std::vector<Access>& pending) {
  const auto it = packets_.runs.find({rank_, st.flag.id});
  if (it == packets_.runs.end()) return;
  uint64_t most = 0;
  for (const PacketRun& run : it->second) most = std::max(most, run.count * dtypeSize(run.dtype));
  ls.bits |= device::kLsPacket;
  ls.activeCtas = static_cast<uint16_t>(activeFor(most, n));
  ls.value = recvs_.size();
  ls.count = it->second.size();
  std::vector<Access> mine;
  for (const PacketRun& run : it->second) {
    device::LoweredPacketRecv rec{};
    rec.dst = encode(l, i, run.dst, run.count, "packet dst");
    rec.count = run.count;
    rec.areaOffset = run.areaOffset;
    rec.dtype = static_cast<uint8_t>(run.dtype);
    rec.sender = run.sender;
    recvs_.push_back(rec);
    mine.push_back(Access{run.dst.rank, run.dst.buffer, true, run.dst.offset, run.dst.offset + run.count, run.count,
                          ls.activeCtas});
  }
  if (n == 1) return;
  bool conflict = false;
  for (const Access& x : mine)
    for (const Access& y : pending)
      if (overlaps(x, y) && !samePiece(x, y)) conflict = true;
  if (conflict) {
    ls.bits |= device::kLsBarrierBefore;
    ls.barrierSync = newSyncPoint(l, i);
    pending.clear();
  }
  pending.insert(pending.end(), mine.begin(), mine.end());
}

void Lowerer::addSignal(uint32_t l, uint32_t i, const Step& st, uint32_t n, LoweredStep& ls) {
  requireSyncReferences(s_, rank_, l, i);
  ls.bits |= device::kLsSignal;
  ls.flagRank = st.flag.rank;
  ls.flagId = st.flag.id;
  if (n > 1) ls.arriveSync = newSyncPoint(l, i);
}

}  // namespace mk::runtime::lowering_detail
