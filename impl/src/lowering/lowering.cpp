// Lowering of one rank's schedule into the resident kernel's program (see lowering.hpp): the program image, the
// CTAs per lane, operand encoding (the Lowerer's other members: lowering_steps.cpp, lowering_compute.cpp).
#include "lowering/lowering.hpp"

#include <algorithm>
#include <cstring>
#include <string>

#include "lowering/attention_step.hpp"
#include "lowering/extents.hpp"
#include "lowering/grouped_gemm_step.hpp"
#include "lowering/lowerer.hpp"
#include "mk/schedule/pack.hpp"

namespace mk::runtime::lowering_detail {

LoweredProgram Lowerer::run() {
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
  h.flags = (peersTouchUserBuffers(s_, rank_) ? 0u : device::kProgLocalCompletion);
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
    std::memcpy(p.image.data() + h.packetRecvsOffset, recvs_.data(), recvs_.size() * sizeof(device::LoweredPacketRecv));
  return p;
}

void Lowerer::checkShape() const {
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
                                     " addresses); the engine carries at most " + std::to_string(device::kMaxBindings));
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
    fail(ErrorCode::Unsupported, "rank " + std::to_string(rank_) + " has " + std::to_string(nLanes) +
                                     " lanes but the resident kernel has " + std::to_string(opt_.nWorkers) +
                                     " worker CTAs (each lane needs one; at most " + std::to_string(device::kMaxLanes) +
                                     "): raise CommConfig::workerCtas or use fewer channels");
}

void Lowerer::layoutBuffers(LoweredProgram& p) const {
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

/// CTAs a step could keep busy: data steps one per minBytesPerCta; a Gemm step one per 128 x 128 output
/// tile (the narrower of the engine's tiles), each CTA owning one SM in the compute-capable kernel.
uint64_t Lowerer::stepWantsCtas(const Step& st) const {
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

/// CTAs per lane: one each, then the rest of the workers by how many CTAs the lane's largest data step
/// can keep busy (a lane that moves 8 bytes gets one CTA and so never pays a lane barrier), weighted by
/// the generator's suggestion, largest remainder first.
std::vector<uint32_t> Lowerer::assignCtas() const {
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
  std::sort(remainders.begin(), remainders.end(),
            [](const auto& x, const auto& y) { return x.first != y.first ? x.first > y.first : x.second < y.second; });
  for (const auto& rem : remainders) {
    if (used >= spare) break;
    if (give[rem.second] < want[rem.second]) {
      ++give[rem.second];
      ++used;
    }
  }
  return give;
}

uint64_t Lowerer::encode(uint32_t lane, uint32_t step, const BufRef& ref, uint64_t count, const char* which) const {
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

uint32_t Lowerer::nodeCount() const {
  std::vector<uint32_t> nodes(s_.nodeOf);
  std::sort(nodes.begin(), nodes.end());
  return static_cast<uint32_t>(std::unique(nodes.begin(), nodes.end()) - nodes.begin());
}

}  // namespace mk::runtime::lowering_detail

namespace mk::runtime {

LoweredProgram lowerRank(const Schedule& s, uint32_t rank, const LowerOptions& opt) {
  if (opt.nWorkers == 0 || opt.nWorkers > 0xFFFE)
    throw Error(ErrorCode::InvalidArgument,
                "LowerOptions::nWorkers must be in 1..65534 (got " + std::to_string(opt.nWorkers) + ")");
  if (opt.minBytesPerCta == 0) throw Error(ErrorCode::InvalidArgument, "LowerOptions::minBytesPerCta must be > 0");
  return lowering_detail::Lowerer(s, rank, opt).run();
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
