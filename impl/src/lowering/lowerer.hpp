// mkernel — internal: the lowering of one rank's schedule into the resident kernel's program (lowering.hpp), as one
// class whose members live in three files along its seams: lowering.cpp (the program image, CTAs per lane, operand
// encoding), lowering_steps.cpp (data, sync, proxy and packet steps and the lane barriers they need),
// lowering_compute.cpp (the compute and routing steps: Gemm, Attention, GroupedGemm, Route, Gather, Combine). No CUDA.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "lowering/lowering.hpp"
#include "lowering/packets.hpp"
#include "mk/device/compute_lane_device.hpp"
#include "mk/error.hpp"
#include "mk/schedule/check.hpp"

namespace mk::runtime::lowering_detail {

using device::LoweredStep;

constexpr uint64_t kScratchAlign = 256;
/// Partition key of accesses made in tiles or units rather than ctaPiece pieces: equal to no data step's.
constexpr uint64_t kTiled = ~uint64_t{0};
/// Access::extent of a step split by whole rows (lse-merge), or-ed with the row width: above every extent word
/// (LoweredStep::extent, sourced ones included).
constexpr uint64_t kRowPieces = uint64_t{1} << 32;
constexpr uint16_t kIdleLane = 0xFFFF;

inline uint64_t alignUp(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

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

inline bool overlaps(const Access& x, const Access& y) {
  return x.rank == y.rank && x.buffer == y.buffer && x.begin < y.end && y.begin < x.end;
}
inline bool samePiece(const Access& x, const Access& y) {
  return x.count == y.count && x.active == y.active && x.begin == y.begin && x.extent == y.extent;
}

/// Lowers one rank of a schedule: lowerRank constructs one and calls run().
class Lowerer {
 public:
  Lowerer(const Schedule& s, uint32_t rank, const LowerOptions& opt) : s_(s), rank_(rank), opt_(opt) {}

  LoweredProgram run();

 private:
  [[noreturn]] void fail(ErrorCode code, const std::string& msg) const { throw Error(code, msg); }

  [[noreturn]] void failStep(ErrorCode code, uint32_t lane, uint32_t step, const std::string& msg) const {
    throw Error(code, describeStep(s_, rank_, lane, step) + ": " + msg);
  }

  void checkShape() const;

  void layoutBuffers(LoweredProgram& p) const;

  uint64_t stepBytes(const Step& st) const {
    if (kindInfo(st.kind).extent != StepExtent::Flat || kindInfo(st.kind).remote) return 0;
    if (st.dst.buffer >= s_.buffers.size()) return 0;
    return st.count * dtypeSize(s_.buffers[st.dst.buffer].dtype);
  }

  /// CTAs a step could keep busy: data steps one per minBytesPerCta; a Gemm step one per 128 x 128 output
  /// tile (the narrower of the engine's tiles), each CTA owning one SM in the compute-capable kernel.
  uint64_t stepWantsCtas(const Step& st) const;

  uint32_t activeFor(uint64_t bytes, uint32_t n) const {
    const uint64_t want = std::max<uint64_t>(1, (bytes + opt_.minBytesPerCta - 1) / opt_.minBytesPerCta);
    return static_cast<uint32_t>(std::min<uint64_t>(want, n));
  }

  /// CTAs per lane: one each, then the rest of the workers by how many CTAs the lane's largest data step
  /// can keep busy (a lane that moves 8 bytes gets one CTA and so never pays a lane barrier), weighted by
  /// the generator's suggestion, largest remainder first.
  std::vector<uint32_t> assignCtas() const;

  uint64_t encode(uint32_t lane, uint32_t step, const BufRef& ref, uint64_t count, const char* which) const;

  bool isUserBuffer(uint16_t buffer) const {
    const BufferKind k = s_.buffers[buffer].kind;
    return k == BufferKind::Input || k == BufferKind::Output || k == BufferKind::InOut;
  }

  void lowerLane(uint32_t l, uint32_t n, std::vector<LoweredStep>& out);

  /// Lower one Copy, Put or Reduce (lowering_steps.cpp).
  void lowerDataStep(uint32_t l, uint32_t i, const Step& st, uint32_t n, LoweredStep& ls, std::vector<Access>& pending);

  /// Lower one Route, Combine or Gather (lowering_compute.cpp).
  void lowerRoutingStep(uint32_t l, uint32_t i, const Step& st, uint32_t n, LoweredStep& ls,
                        std::vector<Access>& pending);

  // ---- compute lanes: Gemm steps (mk/device/compute_lane_device.hpp) --------------------------------------
  /// Lower one Gemm step: check what the tile engine can run (the rules of mk::validateGemm, on the
  /// schedule's offsets: the op's base addresses are checked when it is submitted), choose the tile width
  /// for the lane's CTAs, record a LoweredGemm and point the step at it (count = its index). The step's
  /// CTAs touch C, A and B in tiles, not in ctaPiece pieces: a lane barrier separates it from any earlier
  /// step of the lane touching the same memory, and later steps touching C from it.
  void lowerGemm(uint32_t l, uint32_t i, const Step& st, uint32_t n, LoweredStep& ls, std::vector<Access>& pending);

  /// A compute step's CTAs touch dst (written), a and b (read) in tiles or units, not in ctaPiece pieces: never the
  /// "same piece" as another step's access, so a lane barrier separates it from any earlier step of the lane touching
  /// the same memory, and later steps touching its dst from it.
  void addTiledAccesses(uint32_t l, uint32_t i, const Step& st, uint64_t dstExtent, uint64_t aExtent, uint64_t bExtent,
                        LoweredStep& ls, std::vector<Access>& pending);

  /// Every compute step's parameter block is one more binding per rank (compute_lane_device.hpp).
  void requireComputeBinding(uint32_t l, uint32_t i) const;

  /// Lower one Attention step (attention_step.hpp's checks and record): its CTAs draw the step's units from a
  /// counter (runAttentionStep), count = its record's index.
  void lowerAttention(uint32_t l, uint32_t i, const Step& st, uint32_t n, LoweredStep& ls,
                      std::vector<Access>& pending);

  /// Lower one GroupedGemm step (grouped_gemm_step.hpp's checks and record): its CTAs take the tiles of the list the
  /// engine builds from the counts when the step starts (runGroupedGemmStep), count = its record's index.
  void lowerGroupedGemm(uint32_t l, uint32_t i, const Step& st, uint32_t n, LoweredStep& ls,
                        std::vector<Access>& pending);

  uint32_t newSyncPoint(uint32_t l, uint32_t i);

  uint32_t nodeCount() const;

  /// A ProxyPut: the lane's first CTA pushes its command to the proxy (which reads the source and writes the
  /// destination on the other node) and waits until the source was read. The source read counts as an access of
  /// that CTA alone, so a later step of the lane that overwrites it waits at a lane barrier; a destination in a
  /// user buffer waits until its rank entered the op (rule 3, through the relayed entered count).
  void lowerProxyPut(uint32_t l, uint32_t i, const Step& st, uint32_t n, LoweredStep& ls, std::vector<Access>& pending);

  /// A Wait on a flag that LL packet Puts raise: it unpacks their runs (LoweredPacketRecv[value, value + count))
  /// instead of polling the flag, each run split among the lane's first activeCtas CTAs like a data step, and
  /// each run's destination counted as a write of those CTAs.
  void lowerPacketWait(uint32_t l, uint32_t i, const Step& st, uint32_t n, LoweredStep& ls,
                       std::vector<Access>& pending);

  void addSignal(uint32_t l, uint32_t i, const Step& st, uint32_t n, LoweredStep& ls);

  const Schedule& s_;
  uint32_t rank_;
  LowerOptions opt_;
  uint32_t syncPoints_ = 0;
  std::vector<device::LoweredGemm> gemms_;            ///< compute lanes: the aux table of this rank's Gemm steps
  std::vector<device::LoweredAttention> attentions_;  ///< compute lanes: the aux table of this rank's Attention steps
  /// compute lanes: the aux table of this rank's GroupedGemm steps
  std::vector<device::LoweredGroupedGemm> groupedGemms_;
  std::vector<uint64_t> extentSources_;  ///< sourced extents' int32 elements (ProgramHeader::extentSourcesOffset)
  PacketPlan packets_;                   ///< where every LL packet Put of the schedule lands
  std::vector<device::LoweredPacketRecv> recvs_;  ///< the packet runs this rank's Waits unpack
};

}  // namespace mk::runtime::lowering_detail
