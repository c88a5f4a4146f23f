// Lowering of one rank's schedule into the resident kernel's program (see lowering.hpp).
#include "lowering/lowering.hpp"

#include <algorithm>
#include <cstring>
#include <limits>
#include <string>

#include "lowering/attention_step.hpp"
#include "lowering/extents.hpp"
#include "lowering/grouped_gemm_step.hpp"
#include "lowering/packets.hpp"
#include "lowering/route_steps.hpp"
#include "mk/device/compute_lane_device.hpp"
#include "mk/error.hpp"
#include "mk/gemm_choice.hpp"
#include "mk/schedule/check.hpp"
#include "mk/schedule/pack.hpp"
#include "mk/schedule/route.hpp"

namespace mk::runtime {
namespace {

using device::LoweredStep;

constexpr uint64_t kScratchAlign = 256;
/// Partition key of accesses made in tiles or units rather than ctaPiece pieces: equal to no data step's.
constexpr uint64_t kTiled = ~uint64_t{0};
/// Access::extent of a step split by whole rows (lse-merge), or-ed with the row width: above every extent word
/// (LoweredStep::extent, sourced ones included).
constexpr uint64_t kRowPieces = uint64_t{1} << 32;
constexpr uint16_t kIdleLane = 0xFFFF;

uint64_t alignUp(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

/// One element range a data step of a lane touched since the lane's CTAs last met.
struct Access {
  uint32_t rank;
  uint16_t buffer;
  bool write;
  uint64_t begin, end;  ///< elements
  // Partition key: the same (count, active, offset) puts every element in the same CTA.
  uint64_t count;
  uint32_t active;
  uint64_t extent = device::kNoExtentWord;  ///< a runtime extent sizes the step: same extent, same pieces
};

bool overlaps(const Access& x, const Access& y) {
  return x.rank == y.rank && x.buffer == y.buffer && x.begin < y.end && y.begin < x.end;
}
bool samePiece(const Access& x, const Access& y) {
  return x.count == y.count && x.active == y.active && x.begin == y.begin && x.extent == y.extent;
}

class Lowerer {
 public:
  Lowerer(const Schedule& s, uint32_t rank, const LowerOptions& opt) : s_(s), rank_(rank), opt_(opt) {}

  LoweredProgram run() {
    checkShape();
    packets_ = planPackets(s_, uint64_t{device::kPacketsPerSlot} * 16);
    LoweredProgram p;
    p.rank = rank_;
    p.nRanks = s_.nRanks;
    p.nFlags = s_.nFlags;
    p.nBarriers = s_.nBarriers;
    layoutBuffers(p);
    const auto& lanes = s_.lanes[rank_];
    p.nLanes = static_cast<uint32_t>(lanes.size());
    const std::vector<uint32_t> ctaCount = assignCtas();

    std::vector<device::LoweredLane> outLanes(lanes.size());
    std::vector<LoweredStep> outSteps;
    std::vector<device::CtaAssignment> outCtas(opt_.nWorkers, device::CtaAssignment{kIdleLane, 0});
    uint32_t nextCta = 0;
    for (uint32_t l = 0; l < lanes.size(); ++l) {
      device::LoweredLane& ll = outLanes[l];
      ll.firstStep = static_cast<uint32_t>(outSteps.size());
      ll.nSteps = static_cast<uint32_t>(lanes[l].steps.size());  // one lowered step per schedule step
      ll.ctaBegin = nextCta;
      ll.ctaCount = ctaCount[l];
      ll.laneIndex = static_cast<uint16_t>(l);
      ll.role = static_cast<uint8_t>(lanes[l].role);
      for (uint32_t i = 0; i < ctaCount[l]; ++i)
        outCtas[nextCta + i] = device::CtaAssignment{static_cast<uint16_t>(l), static_cast<uint16_t>(i)};
      nextCta += ctaCount[l];
      lowerLane(l, ctaCount[l], outSteps);
    }
    p.activeWorkers = nextCta;
    p.nSyncPoints = syncPoints_;

    device::ProgramHeader h{};
    h.magic = device::kProgramMagic;
    h.rank = rank_;
    h.nRanks = s_.nRanks;
    h.nLanes = p.nLanes;
    h.nSteps = static_cast<uint32_t>(outSteps.size());
    h.nFlags = s_.nFlags;
    h.nBarriers = s_.nBarriers;
    h.nBuffers = static_cast<uint32_t>(s_.buffers.size());
    h.nWorkers = opt_.nWorkers;
    h.nSyncPoints = syncPoints_;
    h.flags = (peersTouchUserBuffers(s_, rank_) ? 0u : device::kProgLocalCompletion) |
              (needsComputeKernel_ ? device::kProgComputeKernel : 0u);
    h.extentsBinding = extentsBindingOf(s_, rank_);
    h.lanesOffset = alignUp(sizeof h, 16);
    h.stepsOffset = alignUp(h.lanesOffset + outLanes.size() * sizeof(device::LoweredLane), 16);
    h.ctasOffset = alignUp(h.stepsOffset + outSteps.size() * sizeof(LoweredStep), 16);
    h.totalBytes = alignUp(h.ctasOffset + outCtas.size() * sizeof(device::CtaAssignment), 16);
    // Compute lanes: the Gemm steps' aux table last (what the host reads per op to bind their tensor maps).
    h.nGemms = static_cast<uint32_t>(gemms_.size());
    if (!gemms_.empty()) {
      h.gemmsOffset = h.totalBytes;
      h.totalBytes = alignUp(h.gemmsOffset + gemms_.size() * sizeof(device::LoweredGemm), 16);
    }
    h.nAttentions = static_cast<uint32_t>(attentions_.size());
    if (!attentions_.empty()) {
      h.attentionsOffset = h.totalBytes;
      h.totalBytes = alignUp(h.attentionsOffset + attentions_.size() * sizeof(device::LoweredAttention), 16);
    }
    h.nGroupedGemms = static_cast<uint32_t>(groupedGemms_.size());
    if (!groupedGemms_.empty()) {
      h.groupedGemmsOffset = h.totalBytes;
      h.totalBytes = alignUp(h.groupedGemmsOffset + groupedGemms_.size() * sizeof(device::LoweredGroupedGemm), 16);
    }
    if (!extentSources_.empty()) {
      h.extentSourcesOffset = h.totalBytes;
      h.totalBytes = alignUp(h.extentSourcesOffset + extentSources_.size() * sizeof(uint64_t), 16);
    }
    h.nPacketRecvs = static_cast<uint32_t>(recvs_.size());
    if (!recvs_.empty()) {
      h.packetRecvsOffset = h.totalBytes;
      h.totalBytes = alignUp(h.packetRecvsOffset + recvs_.size() * sizeof(device::LoweredPacketRecv), 16);
    }
    p.image.assign(h.totalBytes, 0);
    std::memcpy(p.image.data(), &h, sizeof h);
    if (!outLanes.empty())
      std::memcpy(p.image.data() + h.lanesOffset, outLanes.data(), outLanes.size() * sizeof(device::LoweredLane));
    if (!outSteps.empty())
      std::memcpy(p.image.data() + h.stepsOffset, outSteps.data(), outSteps.size() * sizeof(LoweredStep));
    std::memcpy(p.image.data() + h.ctasOffset, outCtas.data(), outCtas.size() * sizeof(device::CtaAssignment));
    if (!gemms_.empty())
      std::memcpy(p.image.data() + h.gemmsOffset, gemms_.data(), gemms_.size() * sizeof(device::LoweredGemm));
    if (!attentions_.empty())
      std::memcpy(p.image.data() + h.attentionsOffset, attentions_.data(),
                  attentions_.size() * sizeof(device::LoweredAttention));
    if (!groupedGemms_.empty())
      std::memcpy(p.image.data() + h.groupedGemmsOffset, groupedGemms_.data(),
                  groupedGemms_.size() * sizeof(device::LoweredGroupedGemm));
    if (!extentSources_.empty())
      std::memcpy(p.image.data() + h.extentSourcesOffset, extentSources_.data(),
                  extentSources_.size() * sizeof(uint64_t));
    if (!recvs_.empty())
      std::memcpy(p.image.data() + h.packetRecvsOffset, recvs_.data(),
                  recvs_.size() * sizeof(device::LoweredPacketRecv));
    return p;
  }

 private:
  [[noreturn]] void fail(ErrorCode code, const std::string& msg) const { throw Error(code, msg); }
  [[noreturn]] void failStep(ErrorCode code, uint32_t lane, uint32_t step, const std::string& msg) const {
    throw Error(code, describeStep(s_, rank_, lane, step) + ": " + msg);
  }

  void checkShape() const {
    if (s_.nRanks == 0) fail(ErrorCode::InvalidSchedule, "schedule has no ranks");
    if (rank_ >= s_.nRanks)
      fail(ErrorCode::InvalidArgument,
           "rank " + std::to_string(rank_) + " is outside the schedule's " + std::to_string(s_.nRanks) + " ranks");
    if (s_.nRanks > device::kMaxRanks)
      fail(ErrorCode::Unsupported, "schedule has " + std::to_string(s_.nRanks) +
                                       " ranks; the GPU engine drives at most " + std::to_string(device::kMaxRanks) +
                                       " (one NVLink domain)");
    requireRankTables(s_);
    // Barriers are node-local on the GPU (their counters live in the node's mapped memory): a schedule spanning
    // nodes synchronises with flags, which ProxyPut steps raise across nodes.
    if (s_.nBarriers > 0 &&
        std::any_of(s_.nodeOf.begin(), s_.nodeOf.end(), [&](uint32_t v) { return v != s_.nodeOf[0]; }))
      fail(ErrorCode::Unsupported, "schedule spans " + std::to_string(nodeCount()) + " nodes and uses " +
                                       std::to_string(s_.nBarriers) +
                                       " barrier(s); the GPU engine's barriers are node-local: synchronise across "
                                       "nodes with flags (a ProxyPut with a signal, a Wait)");
    const uint64_t bindings = uint64_t{s_.nRanks} * s_.buffers.size();
    if (bindings > device::kMaxBindings)
      fail(ErrorCode::Unsupported, "schedule binds " + std::to_string(s_.buffers.size()) + " buffers on " +
                                       std::to_string(s_.nRanks) + " ranks (" + std::to_string(bindings) +
                                       " addresses); the engine carries at most " +
                                       std::to_string(device::kMaxBindings));
    if (s_.nFlags > device::kMaxFlags)
      fail(ErrorCode::Unsupported, "schedule uses " + std::to_string(s_.nFlags) + " flags per rank; the engine has " +
                                       std::to_string(device::kMaxFlags) + " (fewer chunks or channels)");
    if (s_.nBarriers > device::kMaxBarriers)
      fail(ErrorCode::Unsupported, "schedule uses " + std::to_string(s_.nBarriers) + " barriers; the engine has " +
                                       std::to_string(device::kMaxBarriers));
    for (size_t b = 0; b < s_.buffers.size(); ++b) {
      const std::string problem = bufferCountProblem(s_, b);
      if (!problem.empty()) fail(ErrorCode::InvalidSchedule, "schedule: " + problem);
    }
    const size_t nLanes = s_.lanes[rank_].size();
    if (nLanes > device::kMaxLanes || nLanes > opt_.nWorkers)
      fail(ErrorCode::Unsupported,
           "rank " + std::to_string(rank_) + " has " + std::to_string(nLanes) + " lanes but the resident kernel has " +
               std::to_string(opt_.nWorkers) + " worker CTAs (each lane needs one; at most " +
               std::to_string(device::kMaxLanes) + "): raise CommConfig::workerCtas or use fewer channels");
  }

  void layoutBuffers(LoweredProgram& p) const {
    uint64_t arena = 0;
    for (const BufferDecl& d : s_.buffers) {
      BufferLayout b;
      b.kind = d.kind;
      b.dtype = d.dtype;
      b.count = d.count;
      if (d.kind == BufferKind::Scratch) {
        const uint64_t most = *std::max_element(d.count.begin(), d.count.end());
        b.scratchOffset = arena;
        arena = alignUp(arena + most * dtypeSize(d.dtype), kScratchAlign);
      }
      p.buffers.push_back(b);
    }
    p.scratchBytes = arena;
  }

  uint64_t stepBytes(const Step& st) const {
    if (kindInfo(st.kind).extent != StepExtent::Flat || kindInfo(st.kind).remote) return 0;
    if (st.dst.buffer >= s_.buffers.size()) return 0;
    return st.count * dtypeSize(s_.buffers[st.dst.buffer].dtype);
  }

  /// CTAs a step could keep busy: data steps one per minBytesPerCta; a Gemm step one per 128 x 128 output
  /// tile (the narrower of the engine's tiles), each CTA owning one SM in the compute-capable kernel.
  uint64_t stepWantsCtas(const Step& st) const {
    if (st.kind == StepKind::Gemm) {
      if (st.aux >= s_.gemms.size()) return 1;
      const GemmShape& g = s_.gemms[st.aux];
      return std::max<uint64_t>(1, ((uint64_t{g.m} + 127) / 128) * ((uint64_t{g.n} + 127) / 128));
    }
    if (st.kind == StepKind::GroupedGemm) return groupedGemmTiles(s_, st);
    if (st.kind == StepKind::Attention)
      return st.aux < s_.attentions.size() ? std::max<uint64_t>(1, attentionUnits(s_.attentions[st.aux])) : 1;
    return std::max<uint64_t>(1, (stepBytes(st) + opt_.minBytesPerCta - 1) / opt_.minBytesPerCta);
  }

  uint32_t activeFor(uint64_t bytes, uint32_t n) const {
    const uint64_t want = std::max<uint64_t>(1, (bytes + opt_.minBytesPerCta - 1) / opt_.minBytesPerCta);
    return static_cast<uint32_t>(std::min<uint64_t>(want, n));
  }

  /// CTAs per lane: one each, then the rest of the workers by how many CTAs the lane's largest data step
  /// can keep busy (a lane that moves 8 bytes gets one CTA and so never pays a lane barrier), weighted by
  /// the generator's suggestion, largest remainder first.
  std::vector<uint32_t> assignCtas() const {
    const auto& lanes = s_.lanes[rank_];
    const uint32_t L = static_cast<uint32_t>(lanes.size());
    std::vector<uint32_t> give(L, 1);
    if (L == 0) return give;
    std::vector<uint64_t> want(L, 1);
    uint64_t wantExtra = 0;
    for (uint32_t l = 0; l < L; ++l) {
      uint64_t w = 1;
      for (const Step& st : lanes[l].steps) w = std::max(w, stepWantsCtas(st));
      want[l] = std::min<uint64_t>(w, opt_.nWorkers);
      wantExtra += want[l] - 1;
    }
    const uint32_t spare = opt_.nWorkers - L;
    if (wantExtra <= spare) {
      for (uint32_t l = 0; l < L; ++l) give[l] = static_cast<uint32_t>(want[l]);
      return give;
    }
    // Not enough CTAs for every lane's wish: share the spare ones in proportion to (wish - 1) x weight.
    std::vector<double> weight(L);
    double total = 0;
    for (uint32_t l = 0; l < L; ++l) {
      weight[l] = static_cast<double>(want[l] - 1) * std::max<uint32_t>(1, lanes[l].ctas);
      total += weight[l];
    }
    std::vector<std::pair<double, uint32_t>> remainders;
    uint32_t used = 0;
    for (uint32_t l = 0; l < L; ++l) {
      const double exact = total > 0 ? spare * weight[l] / total : 0;
      const auto whole = static_cast<uint32_t>(std::min<double>(exact, static_cast<double>(want[l] - 1)));
      give[l] += whole;
      used += whole;
      remainders.emplace_back(exact - whole, l);
    }
    std::sort(remainders.begin(), remainders.end(), [](const auto& x, const auto& y) {
      return x.first != y.first ? x.first > y.first : x.second < y.second;
    });
    for (const auto& rem : remainders) {
      if (used >= spare) break;
      if (give[rem.second] < want[rem.second]) {
        ++give[rem.second];
        ++used;
      }
    }
    return give;
  }

  uint64_t encode(uint32_t lane, uint32_t step, const BufRef& ref, uint64_t count, const char* which) const {
    if (ref.rank >= s_.nRanks)
      failStep(
          ErrorCode::InvalidSchedule, lane, step,
          std::string(which) + " rank " + std::to_string(ref.rank) + " is outside 0.." + std::to_string(s_.nRanks - 1));
    if (ref.buffer >= s_.buffers.size())
      failStep(ErrorCode::InvalidSchedule, lane, step,
               std::string(which) + " buffer index " + std::to_string(ref.buffer) + " is outside the schedule's " +
                   std::to_string(s_.buffers.size()) + " buffers");
    const BufferDecl& d = s_.buffers[ref.buffer];
    const uint64_t size = d.count[ref.rank];
    if (ref.offset > size || count > size - ref.offset)
      failStep(ErrorCode::InvalidSchedule, lane, step,
               std::string(which) + " elements [" + std::to_string(ref.offset) + ", " +
                   std::to_string(ref.offset + count) + ") fall outside buffer '" + d.name + "' of rank " +
                   std::to_string(ref.rank) + " (" + std::to_string(size) + " elements)");
    const uint64_t bytes = ref.offset * dtypeSize(d.dtype);
    if (bytes > device::kOperandOffsetMask)
      failStep(ErrorCode::Unsupported, lane, step, std::string(which) + " byte offset exceeds 2^48");
    const uint64_t binding = uint64_t{ref.rank} * s_.buffers.size() + ref.buffer;
    return (binding << device::kOperandShift) | bytes;
  }

  bool isUserBuffer(uint16_t buffer) const {
    const BufferKind k = s_.buffers[buffer].kind;
    return k == BufferKind::Input || k == BufferKind::Output || k == BufferKind::InOut;
  }

  void lowerLane(uint32_t l, uint32_t n, std::vector<LoweredStep>& out) {
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
        case StepKind::Reduce: {
          const bool reduce = st.kind == StepKind::Reduce;
          ls.dst = encode(l, i, st.dst, st.count, "dst");
          ls.a = encode(l, i, st.a, st.count, reduce ? "lhs" : "src");
          if (reduce) ls.b = encode(l, i, st.b, st.count, "rhs");
          const DType dt = s_.buffers[st.dst.buffer].dtype;
          if (s_.buffers[st.a.buffer].dtype != dt || (reduce && s_.buffers[st.b.buffer].dtype != dt))
            failStep(ErrorCode::InvalidSchedule, l, i,
                     "operands have different dtypes (the engine converts only when rounding a Reduce)");
          if (reduce && !isRedOp(static_cast<uint8_t>(st.op)))
            failStep(ErrorCode::InvalidSchedule, l, i,
                     "unknown reduction operator " + std::to_string(static_cast<int>(st.op)));
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
          if (rows &&
              (dt != DType::Float32 || st.extent != kNoExtent || st.aux == 0 || st.count % (uint64_t{st.aux} + 1) != 0))
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
            if (ref && ref->rank != rank_ && isUserBuffer(ref->buffer))
              ls.entryMask |= static_cast<uint16_t>(1u << ref->rank);
          if (n > 1) {
            const uint64_t key = st.count;
            std::vector<Access> mine;
            mine.push_back(
                Access{st.dst.rank, st.dst.buffer, true, st.dst.offset, st.dst.offset + st.count, key, ls.activeCtas});
            mine.push_back(
                Access{st.a.rank, st.a.buffer, false, st.a.offset, st.a.offset + st.count, key, ls.activeCtas});
            if (reduce)
              mine.push_back(
                  Access{st.b.rank, st.b.buffer, false, st.b.offset, st.b.offset + st.count, key, ls.activeCtas});
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
          break;
        }
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
          needsComputeKernel_ = true;
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
        default:
          failStep(ErrorCode::InvalidSchedule, l, i, "unknown step kind " + std::to_string(static_cast<int>(st.kind)));
      }
      out.push_back(ls);
    }
  }

  // ---- compute lanes: Gemm steps (mk/device/compute_lane_device.hpp) --------------------------------------

  /// Lower one Gemm step: check what the tile engine can run (the rules of mk::validateGemm, on the
  /// schedule's offsets: the op's base addresses are checked when it is submitted), choose the tile width
  /// for the lane's CTAs, record a LoweredGemm and point the step at it (count = its index). The step's
  /// CTAs touch C, A and B in tiles, not in ctaPiece pieces: a lane barrier separates it from any earlier
  /// step of the lane touching the same memory, and later steps touching C from it.
  void lowerGemm(uint32_t l, uint32_t i, const Step& st, uint32_t n, LoweredStep& ls, std::vector<Access>& pending) {
    requireStaticGemm(s_, rank_, l, i);
    if (st.aux >= s_.gemms.size())
      failStep(ErrorCode::InvalidSchedule, l, i,
               "gemm index " + std::to_string(st.aux) + " is outside the schedule's " +
                   std::to_string(s_.gemms.size()) + " gemm shapes");
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
    for (const auto& [op, name] :
         {std::pair<uint64_t, const char*>{ls.dst, "C (dst)"}, {ls.a, "A (a)"}, {ls.b, "B (b)"}})
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
  void addTiledAccesses(uint32_t l, uint32_t i, const Step& st, uint64_t dstExtent, uint64_t aExtent, uint64_t bExtent,
                        LoweredStep& ls, std::vector<Access>& pending) {
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
  void requireComputeBinding(uint32_t l, uint32_t i) const {
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
  void lowerAttention(uint32_t l, uint32_t i, const Step& st, uint32_t n, LoweredStep& ls,
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
  void lowerGroupedGemm(uint32_t l, uint32_t i, const Step& st, uint32_t n, LoweredStep& ls,
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
      if (g.counted && std::any_of(pending.begin(), pending.end(),
                                   [&](const Access& y) { return y.write && overlaps(counts, y); })) {
        ls.bits |= device::kLsBarrierBefore;
        ls.barrierSync = newSyncPoint(l, i);
        pending.clear();
      }
      addTiledAccesses(l, i, st, g.cSpan, g.aSpan, g.bSpan, ls, pending);
      if (g.counted) pending.push_back(counts);
    }
  }

  uint32_t newSyncPoint(uint32_t l, uint32_t i) {
    if (syncPoints_ >= device::kMaxSyncPoints)
      failStep(ErrorCode::Unsupported, l, i,
               "needs more than " + std::to_string(device::kMaxSyncPoints) +
                   " lane sync points on this rank (fewer chunks, or fewer CTAs per lane)");
    return syncPoints_++;
  }

  uint32_t nodeCount() const {
    std::vector<uint32_t> nodes(s_.nodeOf);
    std::sort(nodes.begin(), nodes.end());
    return static_cast<uint32_t>(std::unique(nodes.begin(), nodes.end()) - nodes.begin());
  }

  /// A ProxyPut: the lane's first CTA pushes its command to the proxy (which reads the source and writes the
  /// destination on the other node) and waits until the source was read. The source read counts as an access of
  /// that CTA alone, so a later step of the lane that overwrites it waits at a lane barrier; a destination in a
  /// user buffer waits until its rank entered the op (rule 3, through the relayed entered count).
  void lowerProxyPut(uint32_t l, uint32_t i, const Step& st, uint32_t n, LoweredStep& ls,
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
  void lowerPacketWait(uint32_t l, uint32_t i, const Step& st, uint32_t n, LoweredStep& ls,
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

  void addSignal(uint32_t l, uint32_t i, const Step& st, uint32_t n, LoweredStep& ls) {
    requireSyncReferences(s_, rank_, l, i);
    ls.bits |= device::kLsSignal;
    ls.flagRank = st.flag.rank;
    ls.flagId = st.flag.id;
    if (n > 1) ls.arriveSync = newSyncPoint(l, i);
  }

  const Schedule& s_;
  uint32_t rank_;
  LowerOptions opt_;
  uint32_t syncPoints_ = 0;
  std::vector<device::LoweredGemm> gemms_;            ///< compute lanes: the aux table of this rank's Gemm steps
  std::vector<device::LoweredAttention> attentions_;  ///< compute lanes: the aux table of this rank's Attention steps
  /// compute lanes: the aux table of this rank's GroupedGemm steps
  std::vector<device::LoweredGroupedGemm> groupedGemms_;
  bool needsComputeKernel_ = false;      ///< a step runs on the compute-capable kernel only (ProgramHeader::flags)
  std::vector<uint64_t> extentSources_;  ///< sourced extents' int32 elements (ProgramHeader::extentSourcesOffset)
  PacketPlan packets_;                   ///< where every LL packet Put of the schedule lands
  std::vector<device::LoweredPacketRecv> recvs_;  ///< the packet runs this rank's Waits unpack
};

}  // namespace

LoweredProgram lowerRank(const Schedule& s, uint32_t rank, const LowerOptions& opt) {
  if (opt.nWorkers == 0 || opt.nWorkers > 0xFFFE)
    throw Error(ErrorCode::InvalidArgument,
                "LowerOptions::nWorkers must be in 1..65534 (got " + std::to_string(opt.nWorkers) + ")");
  if (opt.minBytesPerCta == 0) throw Error(ErrorCode::InvalidArgument, "LowerOptions::minBytesPerCta must be > 0");
  return Lowerer(s, rank, opt).run();
}

LoweredProgram lowerPacked(const std::vector<uint8_t>& packedRankImage, uint32_t rank, const LowerOptions& opt) {
  const Schedule s = unpack(packedRankImage);
  // A rank's image lacks the other ranks' lanes, so it cannot tell which packets its Waits receive.
  if (hasPacketPuts(s))
    throw Error(ErrorCode::Unsupported,
                "the schedule sends LL packets: lower it from the whole schedule (lowerRank), not one rank's image");
  return lowerRank(s, rank, opt);
}

}  // namespace mk::runtime
