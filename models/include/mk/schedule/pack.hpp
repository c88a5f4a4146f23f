// mkernel — the packed binary form of a Schedule: compact files, and what the GPU engine's lowering
// (impl/src/lowering) reads to build the per-rank program the resident kernel runs (its own format,
// mk/device/engine_device.hpp).
//
// Layout (little-endian, every record 16-byte aligned, sizes static_assert'ed below):
//   PackedHeader
//   PackedBuffer   [nBuffers]
//   PackedLane     [nLanes]      (all ranks' lanes, rank-major; PackedLane::rank tells whose)
//   PackedStep     [nSteps]      (each lane's steps contiguous, PackedLane::firstStep indexes here)
//   PackedGemm     [nGemms]
//   PackedExtent   [nExtents]
//   PackedAttention [nAttentions]
//   uint64_t       bufferCounts[nBuffers * nRanks]   (element count of buffer b on rank r at b*nRanks+r)
//   uint32_t       nodeOf[nRanks] (padded to 16 bytes)
// Cost attributes (bytes, flops) and names are not packed: the engine does not need them. Buffer and extent names
// and OpInfo travel in JSON only; unpack() restores them as "buf<i>" and "extent<i>".
// Version 2 added runtime extents (PackedExtent, PackedStep::extent, PackedGemm::extent); version 3 their source
// (PackedExtent::sourceBuffer / sourceElement); version 4 attention shapes (PackedAttention, the header's
// nAttentions); version 5 the combine step (kind 12) and the SwiGLU bit of Step::flags (kStepSwiGLU), which a
// version-4 reader would have run as a plain grouped GEMM; version 6 the attention-grad step (kind 13) and its
// offsets in PackedAttention (doOffset, rowsAt, dqAt; 96 bytes instead of 80). Older images are refused (regenerate
// them from their schedule).
#pragma once

#include <cstdint>
#include <vector>

#include "mk/schedule/schedule.hpp"

namespace mk {

inline constexpr uint32_t kPackMagic = 0x43534B4Du;  // "MKSC"
inline constexpr uint32_t kPackVersion = 6;

struct PackedHeader {
  uint32_t magic;
  uint32_t version;
  uint32_t nRanks;
  uint32_t nFlags;
  uint32_t nBarriers;
  uint32_t nBuffers;
  uint32_t nLanes;
  uint32_t nGemms;
  uint64_t nSteps;
  uint64_t totalBytes;  ///< size of the whole packed image, header included
  uint32_t nExtents;
  uint32_t nAttentions;
  uint64_t reserved1;
};
static_assert(sizeof(PackedHeader) == 64);

struct PackedBuffer {
  uint8_t dtype;  ///< DType
  uint8_t kind;   ///< BufferKind
  uint16_t reserved0;
  uint32_t reserved1;
  uint64_t reserved2;
};
static_assert(sizeof(PackedBuffer) == 16);

struct PackedLane {
  uint32_t rank;
  uint8_t role;  ///< LaneRole
  uint8_t reserved0;
  uint16_t laneIndex;  ///< index within its rank
  uint32_t ctas;
  uint32_t nSteps;
  uint64_t firstStep;
  uint64_t reserved1;
};
static_assert(sizeof(PackedLane) == 32);

/// One step: Step without the cost attributes. Written once and read whole, never concurrently, so no field
/// order rule.
struct PackedStep {
  uint8_t kind;   ///< StepKind
  uint8_t op;     ///< RedOp
  uint8_t link;   ///< LinkClass
  uint8_t flags;  ///< StepFlagBits
  uint32_t aux;
  uint64_t count;
  BufRef dst, a, b;
  FlagRef flag;
  uint64_t value;
  uint32_t extent;  ///< Step::extent (kNoExtent: none)
  uint32_t reserved0;
  uint64_t reserved1;
};
static_assert(sizeof(PackedStep) == 96);
static_assert(alignof(PackedStep) == 8);

struct PackedGemm {
  uint32_t m, n, k, lda, ldb, ldc;
  uint32_t extent;  ///< GemmShape::extent (kNoExtent: none)
  uint32_t reserved;
};
static_assert(sizeof(PackedGemm) == 32);

/// One runtime extent (ExtentDecl without its name).
struct PackedExtent {
  uint64_t bound;
  double expected;
  uint64_t sourceElement;  ///< ExtentDecl::sourceElement (0 without a source)
  uint16_t sourceBuffer;   ///< ExtentDecl::sourceBuffer (kNoSourceBuffer: the caller gives the values)
  uint16_t reserved0;
  uint32_t reserved1;
};
static_assert(sizeof(PackedExtent) == 32);

/// One attention shape (AttentionShape, attention.hpp).
struct PackedAttention {
  uint32_t batch, qHeads, kvHeads, headDim, sq, skv, ldq, ldkv, ldo;
  float scale;
  uint8_t causal;  ///< 0 or 1
  uint8_t reserved0;
  uint16_t reserved1;
  uint32_t reserved2;
  uint64_t vOffset, qPos, kvPos;
  uint64_t doOffset, rowsAt, dqAt;  ///< attention-grad's (0 for attention)
};
static_assert(sizeof(PackedAttention) == 96);

/// Pack the whole schedule.
std::vector<uint8_t> pack(const Schedule& s);
/// Pack only `rank`'s lanes (what one GPU uploads); buffers, counts and nodeOf stay complete.
std::vector<uint8_t> packRank(const Schedule& s, uint32_t rank);
/// Unpack an image made by pack()/packRank(); throws Error(ParseError) on a bad magic, version,
/// truncated image or out-of-range index. Cost attributes are recomputed by fillCostAttributes().
Schedule unpack(const uint8_t* data, std::size_t size);
inline Schedule unpack(const std::vector<uint8_t>& image) { return unpack(image.data(), image.size()); }

/// (Re)compute Step::bytes, Step::flops and Step::link from the other fields, the buffers' dtypes and
/// nodeOf. Generators call it once at the end; unpack() calls it too. A step or GEMM shape with a runtime extent is
/// priced at the extent's `expected` value (the bound's share expected / bound of its bytes and FLOPs).
void fillCostAttributes(Schedule& s);
/// The same, pricing every runtime extent at the given values (a routing known in advance: values[rank][extent],
/// checked by checkExtentValues; empty: the bounds).
void fillCostAttributes(Schedule& s, const ExtentValues& given);

}  // namespace mk
