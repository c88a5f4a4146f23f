// mkernel — the Schedule IR: what every GPU does, step by step, for one operation instance.
//
// A Schedule holds no pointers. Buffers are named and per rank; step operands are (rank, buffer,
// element offset); the runtime binds addresses when an op is enqueued, the CPU executor binds host
// vectors, the simulator binds nothing (it only needs bytes, FLOPs and routes).
//
// Ordering model (the contract every engine implements):
//  * a lane runs its steps strictly in order; a step starts after the previous one's effects are
//    complete *as seen by this lane*;
//  * lanes (of one rank or of different ranks) are ordered only by flags and barriers;
//  * a flag is a 64-bit counter per (rank, id), zero at the start of every op instance; Signal (and a
//    Put/ProxyPut with kStepSignal) adds `value` with release semantics after the step's data is
//    written; Wait blocks until the lane's own flag reaches `value` (acquire). Engines running many
//    instances back to back add a per-instance base (epoch x total increments) — the schedule never
//    sees it. The validator therefore requires every flag to be fully consumed: the largest Wait
//    threshold on a flag equals the total of the increments sent to it.
#pragma once

#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "mk/schedule/attention.hpp"
#include "mk/schedule/extent.hpp"
#include "mk/schedule/types.hpp"

namespace mk {

/// One operand: element `offset` into buffer `buffer` of rank `rank`.
struct BufRef {
  uint64_t offset = 0;  ///< in elements of the buffer's dtype
  uint32_t rank = 0;    ///< whose buffer (the executing rank, an NVLink peer, or a remote-node rank for ProxyPut dst)
  uint16_t buffer = 0;  ///< index into Schedule::buffers
  uint16_t reserved = 0;
};
static_assert(sizeof(BufRef) == 16, "BufRef is part of the packed wire form");

/// A BufRef from its three coordinates (what generators and tests spell operands with).
inline BufRef bufRef(uint32_t rank, uint16_t buffer, uint64_t offset) noexcept {
  BufRef r;
  r.rank = rank;
  r.buffer = buffer;
  r.offset = offset;
  return r;
}

/// A flag counter: (owner rank, id).
struct FlagRef {
  uint32_t rank = 0;
  uint32_t id = 0;
};
static_assert(sizeof(FlagRef) == 8, "FlagRef is part of the packed wire form");

/// Step::flags bits.
enum StepFlagBits : uint8_t {
  kStepSignal = 1u << 0,      ///< Put/ProxyPut: signal `flag` by `value` once the data has landed
  kStepAccumulate = 1u << 1,  ///< Gemm: C += A*B (else C = A*B)
  kStepBColMajor = 1u << 2,   ///< Gemm: B is column-major (K contiguous), else row-major (N contiguous)
  /// Put/ProxyPut, cost flavour "LL" (NCCL's low-latency protocol): data and flag travel in the same 8-byte
  /// stores (4 B data + 4 B flag), so the receiver polls the data itself and no fence separates data and flag.
  /// Same semantics as a plain Put (+ signal): the CPU executor runs it as one; the GPU engine sends it as 16-byte
  /// packets where its flag takes only packets and one Wait takes them all (impl/src/lowering/packets.hpp), as a
  /// plain Put elsewhere. Priced by Profile::ll.
  kStepLL = 1u << 3,
  /// Put/ProxyPut, cost flavour "LL128": 128-byte lines carrying 120 B data + 8 B flag (NCCL's LL128). As
  /// kStepLL otherwise; priced by Profile::ll128. At most one of kStepLL and kStepLL128 is set.
  kStepLL128 = 1u << 4,
  /// Route: a token's list is its experts' node, listed once per node; Combine: another node's slots read that node's
  /// partial sum once per token (route.hpp, RouteBuckets::Nodes)
  kStepRouteNodes = 1u << 5,
  /// Route: only the executing rank's node's experts are listed; Combine: only their slots are summed (route.hpp,
  /// RouteBuckets::OwnNode)
  kStepRouteOwnNode = 1u << 6,
  /// GroupedGemm, SwiGLU epilogue (a MoE FFN's first GEMM): the groups' n columns are interleaved (gate, up) pairs
  /// and C holds n / 2 columns, C[i][f] = silu(acc[i][2f]) x acc[i][2f + 1], computed in float from the
  /// accumulators and rounded once to C's dtype (gemmOutCols). Pairs are adjacent so that one accumulator
  /// fragment of a tensor-core tile holds both halves of its outputs (the GPU epilogue pairs registers in a thread).
  /// Not with kStepAccumulate; n must be even.
  kStepSwiGLU = 1u << 7,
};
/// The protocol bits of Step::flags.
inline constexpr uint8_t kStepProtocolBits = kStepLL | kStepLL128;

/// Why the protocol bits of a step of `kind` with `flags` are invalid (only Put and ProxyPut carry one, and at
/// most one), or nullptr when they are valid.
const char* protocolFlagProblem(StepKind kind, uint8_t flags) noexcept;

// clang-format off
/// One step of a lane. Trivially copyable; what each field means depends on `kind`:
///
/// | kind     | dst          | a         | b      | count                | flag / value                 | aux         |
/// |----------|--------------|-----------|--------|----------------------|------------------------------|-------------|
/// | Copy     | destination  | source    | -      | elements             | -                            | -           |
/// | Reduce   | destination  | lhs       | rhs    | elements             | -                            | row (lse)   |
/// | Put      | peer dst     | local src | -      | elements             | signal if kStepSignal        | -           |
/// | ProxyPut | remote dst   | local src | -      | elements (0: signal) | remote signal if kStepSignal | -           |
/// | Signal   | -            | -         | -      | -                    | target flag, increment       | -           |
/// | Wait     | -            | -         | -      | -                    | own flag, threshold          | -           |
/// | Gemm     | C tile start | A tile    | B tile | -                    | -                            | gemms index |
/// | Barrier  | -            | -         | -      | -                    | -                            | barrier id  |
///
/// `extent` (kFieldExtent kinds: Copy, Reduce, Put, ProxyPut, Route, Gather, Combine): kNoExtent, or the index of a
/// runtime extent in Schedule::extents; `count` is then the element count at the extent's bound (extent.hpp).
// clang-format on
struct Step {
  StepKind kind = StepKind::Copy;
  RedOp op = RedOp::Sum;
  LinkClass link = LinkClass::None;  ///< path of the bytes; set by generators (see linkBetween())
  uint8_t flags = 0;                 ///< StepFlagBits
  uint32_t aux = 0;
  uint64_t count = 0;  ///< elements of dst's dtype
  BufRef dst, a, b;
  FlagRef flag;
  uint32_t extent = kNoExtent;  ///< runtime extent of `count` (kFieldExtent kinds), or kNoExtent
  uint64_t value = 0;
  // Cost attributes, consumed by the closed-form model and the simulator:
  uint64_t bytes = 0;  ///< payload bytes over `link` (Reduce: bytes written; Gemm: A+B+C tile bytes; Signal: 8)
  double flops = 0;    ///< arithmetic operations (Reduce: count; Gemm: 2*m*n*k)
};
static_assert(std::is_trivially_copyable_v<Step>);

/// Whether a step of `kind` with `flags` increments a flag: always for a kind with a flag that does not wait
/// (Signal), with kStepSignal for a kind with an optional signal (Put, ProxyPut); false for an unknown kind.
constexpr bool incrementsFlag(StepKind kind, uint8_t flags) noexcept {
  const StepKindInfo& k = kindInfo(kind);
  return ((k.fields & kFieldFlag) && !k.waits) || ((k.fields & kFieldSignal) && (flags & kStepSignal));
}

/// Shape of a Gemm step: C[m x n] (ldc) [+]= A[m x k] (lda, row-major) * B[k x n] (ldb; layout by kStepBColMajor).
struct GemmShape {
  uint32_t m = 0, n = 0, k = 0;
  uint32_t lda = 0, ldb = 0, ldc = 0;  ///< leading dimensions in elements
  uint32_t extent = kNoExtent;         ///< runtime extent of m (m rows at its bound, extent.hpp), or kNoExtent
};

/// Columns of C a Gemm of shape `g` writes under `flags`: n, or n / 2 with the SwiGLU epilogue (kStepSwiGLU).
constexpr uint32_t gemmOutCols(const GemmShape& g, uint8_t flags) noexcept {
  return (flags & kStepSwiGLU) ? g.n / 2 : g.n;
}

/// Calls visit(gemm) for each Gemm that `st` (a kind with StepExtent::Tile) stands for, in order: `st` itself for a
/// Gemm; for a GroupedGemm, one Gemm per group h < count on shape gemms[aux + h], whose A, B and C start where
/// the previous group's end (A and C: m rows of lda / ldc; B: k rows of ldb, or n columns when column-major).
/// Stops after visiting a shape index out of range (the visitor reports it: no offset can follow it).
template <class Visit>
void forEachGemm(const std::vector<GemmShape>& gemms, const Step& st, Visit&& visit) {
  if (st.kind != StepKind::GroupedGemm) {
    visit(st);
    return;
  }
  Step one = st;
  one.kind = StepKind::Gemm;
  one.count = 0;
  for (uint64_t h = 0; h < st.count; ++h) {
    one.aux = static_cast<uint32_t>(st.aux + h);
    visit(static_cast<const Step&>(one));
    if (one.aux >= gemms.size() || one.aux < st.aux) return;
    const GemmShape& g = gemms[one.aux];
    one.a.offset += uint64_t{g.m} * g.lda;
    one.b.offset += uint64_t{(st.flags & kStepBColMajor) ? g.n : g.k} * g.ldb;
    one.dst.offset += uint64_t{g.m} * g.ldc;
  }
}

/// A group of CTAs with one role running `steps` in order.
struct Lane {
  LaneRole role = LaneRole::Intra;
  uint32_t ctas = 1;  ///< how many CTAs the generator suggests (a weight; the runtime may scale it)
  std::vector<Step> steps;
};

/// A named per-rank buffer. `count[r]` is its element count on rank r (ranks may differ).
/// Most elements a buffer, a step or an offset may name: 2^50, so that bytes (elements x element size, at most
/// 8) and offset + count never overflow 64 bits and stay exact in a double, the cost model's unit. Readers
/// refuse larger values at the field.
inline constexpr uint64_t kMaxElements = uint64_t{1} << 50;

struct BufferDecl {
  std::string name;
  DType dtype = DType::Float32;
  BufferKind kind = BufferKind::Scratch;
  std::vector<uint64_t> count;  ///< size nRanks
};

/// What produced a schedule; engines never branch on it, verifiers and reports read it.
struct OpInfo {
  std::string op;    ///< "allreduce", "allgather", "reducescatter", "broadcast", "alltoall", "custom"
  std::string algo;  ///< generator name
  DType dtype = DType::Float32;
  RedOp redop = RedOp::Sum;
  uint64_t count = 0;  ///< the op's count argument (see algorithms.hpp for its meaning per op)
  uint32_t root = 0;
  uint32_t chunks = 1;
  uint32_t channels = 1;
};

/// One operation instance on nRanks GPUs.
struct Schedule {
  uint32_t nRanks = 0;
  std::vector<uint32_t> nodeOf;          ///< node index of each rank (size nRanks)
  uint32_t nFlags = 0;                   ///< flags per rank: ids 0 .. nFlags-1 on every rank
  uint32_t nBarriers = 0;                ///< barrier ids 0 .. nBarriers-1
  std::vector<BufferDecl> buffers;       ///< at most 65535
  std::vector<std::vector<Lane>> lanes;  ///< lanes[rank][lane]
  std::vector<GemmShape> gemms;
  std::vector<AttentionShape> attentions;  ///< shapes of Attention steps (attention.hpp); steps name them by index
  std::vector<ExtentDecl> extents;         ///< runtime extents (extent.hpp); steps and gemms name them by index
  OpInfo info;

  /// Index of the buffer called `name`, or -1.
  int bufferIndex(const std::string& name) const noexcept;
  /// Total steps over all ranks and lanes.
  uint64_t stepCount() const noexcept;
};

/// Whether a step of another rank than `rank` reads or writes one of `rank`'s user buffers (Input, Output,
/// InOut; only the operands the step's kind uses count). The engine completes an op for a rank's stream on
/// local completion when this is false for that rank (kProgLocalCompletion); the cost model charges
/// Profile::peerUserUs to ops where it is true for some rank.
bool peersTouchUserBuffers(const Schedule& s, uint32_t rank);
/// True when peersTouchUserBuffers(s, r) holds for some rank r.
bool peersTouchUserBuffers(const Schedule& s);

/// Link class of a transfer between two ranks of `s` ("local" on the same rank, NVLink on the same node,
/// network otherwise).
LinkClass linkBetween(const Schedule& s, uint32_t fromRank, uint32_t toRank) noexcept;

/// Index of the extent called `name`, or -1.
int extentIndex(const Schedule& s, const std::string& name) noexcept;
/// Throws Error(InvalidArgument) naming the extent and the rank unless `values` fits `s`: empty, or one row per rank
/// of one value per extent, each at most its bound.
void checkExtentValues(const Schedule& s, const ExtentValues& values);
/// Value of extent `e` on `rank`: values[rank][e], or the bound when `values` is empty (checkExtentValues first).
uint64_t extentValue(const Schedule& s, const ExtentValues& values, uint32_t rank, uint32_t e) noexcept;
/// Elements `st` moves or computes when `rank` runs it: its count, scaled to the extent's value when it names one.
uint64_t runtimeCount(const Schedule& s, const Step& st, uint32_t rank, const ExtentValues& values) noexcept;
/// Rows of `g` when `rank` runs it: m, scaled to the extent's value when it names one.
uint32_t runtimeRows(const Schedule& s, const GemmShape& g, uint32_t rank, const ExtentValues& values) noexcept;

/// "rank 3 lane 1 (intra) step 17 (wait)": the prefix every diagnostic about a step uses.
std::string describeStep(const Schedule& s, uint32_t rank, uint32_t lane, uint32_t step);

}  // namespace mk
