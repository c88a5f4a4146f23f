// mkernel — what the host and the resident kernel share: memory blocks, the doorbell ring, the lowered
// program format and the kernel's launch handle.
//
// Every struct here crosses PCIe (host-mapped pinned memory) or NVLink (peer device memory), so every field
// has a fixed width and every size is static_assert'ed. Who writes which word, and which word is written
// last, is stated next to each struct. Design notes: docs/gpu-engine.md.
#pragma once

#include <cstdint>
#include <type_traits>

#include "mk/device/fifo_device.hpp"
#include "mk/device/inbox_device.hpp"
#include "mk/device/macros_device.hpp"
#include "mk/schedule/types.hpp"

namespace mk::device {

/// Most ranks one communicator drives, over every node (the binding table and the per-rank progress words are
/// sized by it).
inline constexpr uint32_t kMaxRanks = 8;
/// Most (rank, buffer) address bindings one op carries: kMaxRanks x 8 buffers.
inline constexpr uint32_t kMaxBindings = 64;
/// Most flags one schedule may use per rank.
inline constexpr uint32_t kMaxFlags = 2048;
/// Most barrier ids one schedule may use.
inline constexpr uint32_t kMaxBarriers = 64;
/// Most lanes one rank's schedule may have (each lane needs at least one CTA of its own).
inline constexpr uint32_t kMaxLanes = 256;
/// Most lane sync points (places where the CTAs of one multi-CTA lane meet or count arrivals) per rank
/// and op. Each has its own counter: CTAs that only arrive may run ahead to the next sync point, so one
/// shared running counter could not tell whose arrival completed which point.
inline constexpr uint32_t kMaxSyncPoints = 4096;
/// Ops whose per-op state (flags, barriers, scratch, staging) can be live at once on a rank. Op k uses
/// slot k % kSlots. Two slots let op k+1 start on one rank while a peer still finishes op k.
inline constexpr uint32_t kSlots = 2;
/// LL packets one rank can receive per op (per slot): 16 bytes each, carrying 8 bytes of data and the op's
/// epoch twice (docs/gpu-engine.md, "LL packets"), so 512 KiB of data per rank and op.
inline constexpr uint32_t kPacketsPerSlot = 65536;
/// Bytes of data one LL packet carries.
inline constexpr uint32_t kPacketDataBytes = 8;

/// Why the kernel stopped. Written once into StatusBlock::code (the first failure wins).
enum class Status : uint32_t {
  Ok = 0,
  WaitTimeout = 1,        ///< a Wait step: own flag never reached the threshold
  BarrierTimeout = 2,     ///< a Barrier step: some rank never arrived
  EntryTimeout = 3,       ///< a step touching a peer's user buffer: the peer never entered the op
  DescriptorTimeout = 4,  ///< the doorbell rang but the op's descriptor never became valid
  GateTimeout = 5,        ///< an earlier op never completed on some rank, so this op could not start
  LaneSyncTimeout = 6,    ///< CTAs of one lane never met at a lane barrier
  BadProgram = 7,         ///< a lowered program failed a device-side sanity check
  HostAbort = 8,          ///< the host poisoned the communicator (a mismatched collective, shutdown on error)
  ProxyTimeout = 9,       ///< a ProxyPut step: the proxy never took (FIFO full) or never finished its command
  BadDescriptor = 10,     ///< an op descriptor failed its check word or its bounds (DescriptorFault in `flag`)
  /// A step's runtime extent value is above its bound (flag: the extent's index, expected: the bound, seen: the value)
  BadExtent = 11,
  /// A Route's expert id or a Gather's row index is out of range (flag: the id's entry or the gather's row,
  /// expected: the range's end, seen: the value as int64)
  BadIndex = 12,
  /// A Route gives an expert more tokens than its list holds (flag: the expert, expected: the capacity, seen: the
  /// count)
  RouteOverflow = 13,
};

/// What was wrong with a refused op descriptor (StatusBlock::flag of a BadDescriptor failure).
enum class DescriptorFault : uint32_t {
  CheckWord = 1,       ///< the descriptor's words do not match the check word the host wrote (expected / seen)
  Bindings = 2,        ///< nBindings above kMaxBindings (seen: the count)
  ProgramAddress = 3,  ///< this rank's program address is null or not 16-byte aligned (seen: the address)
  ProgramHeader = 4,   ///< the program's header is not this rank's (magic, rank, ranks or worker CTAs differ)
};

/// Failure record; host-mapped pinned memory shared by every rank of a communicator. The writer first
/// claims the record with a compare-and-swap on EngineDeviceHandle::failureClaim (device memory of rank 0:
/// GPU atomics on host-mapped memory are not atomic across devices without PCIe atomics), fills every
/// field, fences (system scope) and only then sets `abort`, so a reader that sees abort != 0 sees the
/// whole record. `abort` itself is a plain store of 1 (any number of writers).
struct alignas(64) StatusBlock {
  uint32_t abort;  ///< != 0: every kernel of the group exits at its next poll
  uint32_t code;   ///< Status
  uint32_t rank, lane, step, flag;
  uint32_t op;  ///< op sequence number (0-based) on `rank`
  uint32_t reserved0;
  uint64_t expected, seen;
  uint64_t elapsedNs;  ///< how long the failing wait spun
  uint64_t reserved1;
};
static_assert(sizeof(StatusBlock) == 64);

/// Kernel -> host progress of one rank, host-mapped. Single writer per field: the rank's control block
/// (its host-link warp, the only one that touches host memory), except `shutdown` (host -> kernel).
struct alignas(64) RankMailbox {
  /// Ops published to the workers (the host may reuse ring slot j, descriptor and doorbell, once > j).
  uint32_t fetched;
  uint32_t completed;  ///< ops complete on every rank (mirror of RankState::complete for host polling)
  uint32_t started;    ///< CTAs that entered the kernel (co-residency check at launch)
  uint32_t exited;     ///< 1 once the control warp has left its loop
  uint32_t shutdown;   ///< host -> kernel: exit once every issued op has completed
  /// Mirrors of this rank's own done and entered counts (RankState::doneFrom / enteredFrom [rank]): the host
  /// relays them to the ranks of other nodes, which no store of this GPU reaches.
  uint32_t doneOut;
  uint32_t enteredOut;
  uint32_t reserved0;
  uint64_t inboxTaken;  ///< inbox records applied (the host may reuse their slots)
  uint32_t reserved[6];
};
static_assert(sizeof(RankMailbox) == 64);

/// Launches of one captured graph whose first op number the host has written ahead (GraphCells::base).
inline constexpr uint32_t kGraphCells = 8;

/// One rank's ops captured into a CUDA graph (graph capture; engine/capture.hpp), host-mapped. The host gives each
/// launch of the graph its first op number (base[n % kGraphCells] for launch n, then authorized = n + 1); the
/// graph's first node takes it (begun = n + 1) and the op nodes ring doorbells base + 0, base + 1, ...
struct alignas(64) GraphCells {
  uint32_t authorized;  ///< host -> device: launches given an op number
  uint32_t begun;       ///< device -> host: launches whose first node ran (their cells may be reused)
  uint32_t misused;     ///< device -> host: 1 + the replay that ran without being authorised (0: none)
  uint32_t base[kGraphCells];
};

/// Timestamps (%globaltimer, ns) of one op on one rank, a device-memory ring indexed by op % ringSlots
/// (device memory so stamping costs no PCIe write on the op's path).
/// Written by the control warp, except firstStepNs (the first worker CTA of lane 0) and stagedNs (the host-link warp).
struct alignas(16) OpStamp {
  uint64_t doorbellNs;   ///< control warp saw the doorbell with the descriptor staged (the later of the two)
  uint64_t publishNs;    ///< op handed to the worker CTAs
  uint64_t firstStepNs;  ///< lane 0's first CTA began its first step
  uint64_t localDoneNs;  ///< every worker CTA of this rank finished the op
  uint64_t completeNs;   ///< every rank finished the op (the stream may move on)
  uint32_t op;           ///< op sequence number the record belongs to (written last)
  uint32_t reserved;
  uint64_t stagedNs;  ///< host-link warp had staged the descriptor (read from host memory) into shared memory
  uint64_t rungNs;    ///< control warp first saw the doorbell (staged or not)
};
static_assert(sizeof(OpStamp) == 64);

/// One traced step (start/end of the lane's first CTA), host-mapped, appended with atomicAdd.
struct alignas(16) TraceRecord {
  uint32_t op;
  uint16_t lane;
  uint16_t kind;  ///< StepKind
  uint32_t step;
  uint32_t reserved;
  uint64_t startNs, endNs;
};
static_assert(sizeof(TraceRecord) == 32);

/// OpDescriptor::flags bits.
enum OpFlagBits : uint32_t {
  kOpFence = 1u << 0,  ///< op touches user memory the previous op touched: start only once that op completed
};

/// One submitted op, host-mapped ring of `ringSlots` entries shared by the ranks one process drives. The
/// host writes every field, then `seq` = op + 1 LAST with release; the kernel reads `seq` with acquire
/// (system scope) before anything else. Slot op % ringSlots is reused only after every rank's control warp
/// has fetched the previous occupant (RankMailbox::fetched). `check` (descriptorCheck) covers every word the
/// kernel uses, so a descriptor corrupted after the host wrote it is refused (Status::BadDescriptor) instead of
/// sending the kernel through a wild pointer.
struct alignas(64) OpDescriptor {
  uint32_t seq;        ///< op + 1 when valid
  uint32_t nBindings;  ///< entries of `table` in use (nRanks x nBuffers of the schedule)
  uint32_t flags;      ///< OpFlagBits
  uint32_t reserved0;
  uint64_t program[kMaxRanks];   ///< device address of each rank's lowered program (on that rank's GPU)
  uint64_t table[kMaxBindings];  ///< address of (rank, buffer) at rank * nBuffers + buffer
  uint64_t check;                ///< descriptorCheck of the words above, written before `seq`
  uint64_t reserved1[5];
};
static_assert(sizeof(OpDescriptor) == 640);

/// Words of an OpDescriptor the check covers: (seq, nBindings), (flags, reserved0), program[], table[].
inline constexpr uint32_t kDescriptorWords = 2 + kMaxRanks + kMaxBindings;

/// Word `i` of the descriptor's checked part, mixed with its position (a splitmix64 finalizer): the check is the
/// XOR of every word's mix, so lanes of a warp can each fold a share of the words and XOR-reduce, and a changed,
/// swapped or moved word changes it.
MK_HOST_DEVICE_INLINE uint64_t descriptorWordMix(uint64_t word, uint32_t i) {
  uint64_t z = word ^ (0x9E3779B97F4A7C15ull * (static_cast<uint64_t>(i) + 1));
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

/// Word `i` < kDescriptorWords of `d` (seq taken as `seq`: the host computes the check before it publishes seq).
MK_HOST_DEVICE_INLINE uint64_t descriptorWord(const OpDescriptor& d, uint32_t seq, uint32_t i) {
  if (i == 0) return static_cast<uint64_t>(seq) | (static_cast<uint64_t>(d.nBindings) << 32);
  if (i == 1) return static_cast<uint64_t>(d.flags) | (static_cast<uint64_t>(d.reserved0) << 32);
  if (i < 2 + kMaxRanks) return d.program[i - 2];
  return d.table[i - 2 - kMaxRanks];
}

/// The check word of descriptor `d` published with `seq` (host side; the kernel folds the same words per lane).
inline uint64_t descriptorCheck(const OpDescriptor& d, uint32_t seq) {
  uint64_t c = 0;
  for (uint32_t i = 0; i < kDescriptorWords; ++i) c ^= descriptorWordMix(descriptorWord(d, seq, i), i);
  return c;
}

/// OpBoard::waitComplete when the workers may start at once.
inline constexpr uint32_t kNoCompleteWait = 0xFFFFFFFFu;

/// What the worker CTAs read to start an op: the descriptor's content, copied into device memory by the
/// control warp once the op may start. Written by the control warp before it bumps RankState::published.
struct alignas(64) OpBoard {
  uint64_t program;  ///< this rank's lowered program
  uint32_t op;
  uint32_t nBindings;
  uint64_t table[kMaxBindings];
  /// kNoCompleteWait, or: the op is fenced (kOpFence) and was published before the previous op completed;
  /// workers start its steps only once RankState::complete >= this value (they pick the op up meanwhile).
  uint32_t waitComplete;
  uint32_t reserved0;
  uint64_t reserved[5];
};
static_assert(sizeof(OpBoard) == 576);

/// One rank's device-resident engine state (device memory of that rank's GPU; peers write the
/// `fromPeers` words and the flags / barrier counters over NVLink). Polled words sit on their own
/// 128-byte lines so a writer on one side does not slow a poller on the other.
struct alignas(128) RankState {
  /// doorbell[j % ringSlots] = j + 1 once op j reached the front of its caller's stream; written by a
  /// stream memory operation (cuStreamWriteValue32). One word per op, not a counter, so ops of one rank
  /// on different streams cannot release each other.
  uint32_t* doorbell;
  uint64_t reserved0[15];
  /// Ops complete for this rank's stream (monotonic, cyclic compare): done on every rank, or done here
  /// for an op with kProgLocalCompletion. Stream hand-offs poll it.
  alignas(128) uint32_t complete;
  /// CTAs that entered the kernel (mirrored to RankMailbox::started by the control warp); the failure
  /// claim word of the group (used on rank 0 only); trace records appended.
  alignas(128) uint32_t started;
  uint32_t failureClaim;
  uint32_t traceCount;
  /// != 0: stop (device mirror of StatusBlock::abort; written by failing CTAs of any rank and by the
  /// control warp when the host aborts). Spins read this, never host memory.
  alignas(128) uint32_t abort;
  /// Ops the control warp has handed to the workers (op j may run once published > j); `stop` != 0
  /// tells idle workers to leave (shutdown).
  alignas(128) uint32_t published;
  uint32_t stop;
  /// Worker CTAs that finished the op of each slot (reset to 0 when the op completes locally).
  alignas(128) uint32_t lanesDone[kSlots];
  /// Written by rank q (over NVLink): ops rank q has finished / entered.
  alignas(128) uint32_t doneFrom[kMaxRanks];
  alignas(128) uint32_t enteredFrom[kMaxRanks];
  /// Per-slot op state, zero when an op of that slot starts (the owner zeroes it when the op completes).
  alignas(128) uint64_t flags[kSlots][kMaxFlags];
  uint32_t barriers[kSlots][kMaxBarriers];
  uint32_t laneSync[kSlots][kMaxSyncPoints];
  OpBoard board[kSlots];
  /// LL packets peers wrote for the op of each slot ({data lo, epoch, data hi, epoch}, epoch = op + 1); never
  /// zeroed: a packet of an older op carries an older epoch. Offsets are the lowering's (LoweredPacketRecv).
  alignas(128) uint32_t packets[kSlots][kPacketsPerSlot][4];
};
static_assert(std::is_trivially_copyable_v<RankState>);

// ---- the lowered program: a packed schedule of one rank, prepared once on the host ---------------------

inline constexpr uint32_t kProgramMagic = 0x4750524Bu;  // "KRPG"

/// LoweredStep::bits.
enum LoweredStepBits : uint8_t {
  kLsBarrierBefore = 1u << 0,  ///< every CTA of the lane meets (laneSync[barrierSync] == ctas) before the step
  kLsSignal = 1u << 1,         ///< after the step, the lane's last CTA adds `value` to flag (flagRank, flagId)
  kLsEntryCheck = 1u << 2,     ///< touches user buffers of the ranks in entryMask: wait until they entered the op
  kLsRemoteSignal = 1u << 3,   ///< ProxyPut: the destination flag is raised on arrival (PutSignal / Signal commands)
  /// Put: send as LL packets into rank flagRank's packet area at byte offset `value` (no fence, no signal).
  /// Wait: receive the `count` packet runs LoweredPacketRecv[value ...] instead of polling the flag.
  kLsPacket = 1u << 4,
};

/// Operand: (binding index << 48) | byte offset into that binding.
inline constexpr uint32_t kOperandShift = 48;
inline constexpr uint64_t kOperandOffsetMask = (uint64_t{1} << kOperandShift) - 1;

/// The address an operand names, given the op's binding table.
MK_HOST_DEVICE_INLINE char* operandAddress(const uint64_t* table, uint64_t operand) {
  return reinterpret_cast<char*>(table[operand >> kOperandShift]) + (operand & kOperandOffsetMask);
}

/// Bytes of one element of a lowered step's dtype (the element table's size, element.hpp).
MK_HOST_DEVICE_INLINE uint32_t dtypeBytes(uint8_t dtype) {
  return static_cast<uint32_t>(kDTypeSizeNibbles >> (4u * (dtype & 15u))) & 15u;
}

/// LoweredStep::extent / ProgramHeader::extentsBinding of a program without runtime extents.
inline constexpr uint32_t kNoExtentWord = 0xFFFFFFFFu;
/// LoweredStep::extent bit: the value is the int32 the schedule keeps in one of its buffers (a sourced extent,
/// mk/schedule/extent.hpp), the low bits index the program's extent sources (ProgramHeader::extentSourcesOffset).
inline constexpr uint32_t kSourcedExtent = 0x80000000u;

/// One step as the resident kernel runs it; 80 bytes, read whole before acting, never written at run time.
struct alignas(16) LoweredStep {
  uint8_t kind;  ///< StepKind (Copy, Reduce, Put, Signal, Wait, Barrier; Gemm / Attention / GroupedGemm: count = record
                 ///< index)
  uint8_t redop;         ///< RedOp
  uint8_t dtype;         ///< DType of the operands (checked equal at lowering)
  uint8_t bits;          ///< LoweredStepBits
  uint16_t activeCtas;   ///< CTAs of the lane that move data (the rest only take part in syncs)
  uint16_t entryMask;    ///< ranks whose op entry this step waits for (kLsEntryCheck)
  uint32_t flagRank;     ///< Signal / Put+signal: target rank; Wait: own rank
  uint32_t flagId;       ///< flag id (Signal, Put+signal, Wait) or barrier id (Barrier)
  uint32_t barrierSync;  ///< sync point the lane's CTAs meet at before the step (kLsBarrierBefore)
  uint32_t arriveSync;   ///< sync point counting arrivals after the step (signal / barrier, lanes of > 1 CTA):
                         ///< the CTA whose arrival completes it signals for the whole lane
  uint64_t count;        ///< elements
  uint64_t value;        ///< Signal increment / Wait threshold
  uint64_t dst, a, b;    ///< operands (kOperandShift encoding)
  /// Copy, Put, Reduce with a runtime extent (mk/schedule/extent.hpp): index of the extent's word among the op's
  /// extent words (ProgramHeader::extentsBinding), kSourcedExtent | index of its source (an int32 of a buffer), or
  /// kNoExtentWord. The step then runs extentUnit x value elements, value read when the step starts and refused above
  /// extentBound or below 0 (Status::BadExtent); `count` is the bound's.
  uint32_t extent;
  uint32_t extentBound;  ///< the extent's bound, in units
  /// Elements per unit (count = extentUnit x extentBound). A Reduce with a row operator (lse-merge, which never has
  /// an extent): the row's width, its count a whole number of rows of width + 1 elements.
  uint64_t extentUnit;
};
static_assert(sizeof(LoweredStep) == 80);

/// One packet run a Wait with kLsPacket receives: the packets of one LL Put, unpacked into `dst` once every
/// packet carries this op's epoch. 32 bytes.
struct alignas(16) LoweredPacketRecv {
  uint64_t dst;         ///< operand (kOperandShift encoding) on this rank
  uint64_t count;       ///< elements
  uint64_t areaOffset;  ///< byte offset of the run's first packet in RankState::packets[slot]
  uint8_t dtype;        ///< DType
  uint8_t reserved0[3];
  uint32_t sender;  ///< the rank whose Put sent it (diagnostics)
};
static_assert(sizeof(LoweredPacketRecv) == 32);

/// One lane: steps [firstStep, firstStep + nSteps) run by worker CTAs [ctaBegin, ctaBegin + ctaCount).
struct alignas(16) LoweredLane {
  uint32_t firstStep, nSteps;
  uint32_t ctaBegin, ctaCount;
  uint16_t laneIndex;  ///< index in the schedule (for diagnostics and traces)
  uint8_t role;        ///< LaneRole
  uint8_t reserved0;
  uint32_t reserved1[3];
};
static_assert(sizeof(LoweredLane) == 32);

/// Which lane a worker CTA runs.
struct CtaAssignment {
  uint16_t lane;  ///< index into the program's lanes
  uint16_t indexInLane;
};
static_assert(sizeof(CtaAssignment) == 4);

/// ProgramHeader::flags bits.
enum ProgramFlagBits : uint32_t {
  /// No other rank's step reads or writes this rank's user buffers (Input / Output / InOut): the op is
  /// complete for this rank's stream as soon as this rank's own steps are done (one-shot, for example, where
  /// peers write only into scratch). Other ops complete for the stream once every rank is done (rule 4).
  kProgLocalCompletion = 1u << 0,
};

/// Dynamic shared memory a Combine step uses on either resident kernel (its per-expert counts, then the positions of
/// a chunk of tokens; route_ops.cuh's combineRows): the communication-only kernel is launched with this much, the
/// compute-capable one has more. The lowering refuses a combine whose experts + topk words do not fit.
inline constexpr uint32_t kCombineSmemBytes = 8192;

/// Program header; followed by LoweredLane[nLanes], LoweredStep[nSteps], CtaAssignment[nWorkers] at the
/// byte offsets given (each 16-byte aligned), then (compute lanes) LoweredGemm[nGemms] at gemmsOffset,
/// LoweredAttention[nAttentions] at attentionsOffset, LoweredGroupedGemm[nGroupedGemms] at groupedGemmsOffset and
/// (LL packets) LoweredPacketRecv[nPacketRecvs] at packetRecvsOffset.
struct alignas(16) ProgramHeader {
  uint32_t magic;
  uint32_t rank, nRanks;
  uint32_t nLanes, nSteps;
  uint32_t nFlags, nBarriers;
  uint32_t nBuffers;
  uint32_t nWorkers;  ///< worker CTAs the program was lowered for
  uint32_t nSyncPoints;
  uint64_t lanesOffset, stepsOffset, ctasOffset, totalBytes;
  uint32_t flags;  ///< ProgramFlagBits
  // ---- compute lanes (mk/device/compute_lane_device.hpp) ----
  uint32_t nGemms;       ///< Gemm steps of this rank (LoweredGemm records; 0 = none)
  uint64_t gemmsOffset;  ///< byte offset of LoweredGemm[nGemms] (0 when nGemms = 0)
  // ---- LL packets (kLsPacket) ----
  uint32_t nPacketRecvs;  ///< LoweredPacketRecv records (0 = none)
  /// Runtime extents: the binding-table index of this rank's extent words (extentWordsBinding), kNoExtentWord when
  /// no step of the program has an extent. A null address there: every extent at its bound.
  uint32_t extentsBinding;
  uint64_t packetRecvsOffset;  ///< byte offset of LoweredPacketRecv[nPacketRecvs] (0 when none)
  // ---- compute lanes: Attention steps (mk/device/compute_lane_device.hpp) ----
  uint32_t nAttentions;  ///< Attention steps of this rank (LoweredAttention records; 0 = none)
  /// GroupedGemm steps of this rank (LoweredGroupedGemm records; 0 = none)
  uint32_t nGroupedGemms;
  uint64_t attentionsOffset;    ///< byte offset of LoweredAttention[nAttentions] (0 when none)
  uint64_t groupedGemmsOffset;  ///< byte offset of LoweredGroupedGemm[nGroupedGemms] (0 when none)
  /// Byte offset of the sourced extents' operands (uint64, kOperandShift encoding of an int32 element of this rank):
  /// LoweredStep::extent with kSourcedExtent indexes them (0 when none).
  uint64_t extentSourcesOffset;
};
static_assert(sizeof(ProgramHeader) == 144);

/// Binding-table index of rank `rank`'s extent words (an op's device array of one uint64 per Schedule::extents
/// entry): after the schedule's nRanks x nBuffers addresses and, when the schedule has compute steps (Gemm,
/// Attention), the nRanks compute-parameter blocks (gemmParamsBinding). Written per op by the host (finalize), so one
/// lowered program serves every array of words.
MK_HOST_DEVICE_INLINE uint32_t extentWordsBinding(uint32_t nRanks, uint32_t nBuffers, bool gemms, uint32_t rank) {
  return nRanks * nBuffers + (gemms ? nRanks : 0u) + rank;
}

/// Elements of one data step that CTA `idx` of `active` moves: [*begin, *end). Pieces are multiples of
/// 256 elements (so every piece but the last starts 16-byte aligned relative to the step's start) and
/// identical for identical (count, active): the lowering relies on that to skip lane barriers between
/// steps whose CTAs only touch their own pieces.
MK_HOST_DEVICE_INLINE void ctaPiece(uint64_t count, uint32_t active, uint32_t idx, uint64_t* begin, uint64_t* end) {
  const uint64_t per = ((count + active - 1) / active + 255) / 256 * 256;
  const uint64_t b = static_cast<uint64_t>(idx) * per;
  *begin = b < count ? b : count;
  *end = (b + per) < count ? (b + per) : count;
}

/// Everything the resident kernel of one rank needs; passed by value at launch.
struct EngineDeviceHandle {
  RankState* state;             ///< this rank's state (device memory)
  RankState* peers[kMaxRanks];  ///< every rank's state as this GPU addresses it (peer mappings; [rank] = state)
  StatusBlock* status;          ///< host-mapped, shared by the group
  RankMailbox* mailbox;         ///< host-mapped, this rank's
  const OpDescriptor* ring;     ///< host-mapped, shared by the group
  OpStamp* stamps;              ///< device memory, this rank's, ringSlots entries (read by cudaMemcpy)
  TraceRecord* trace;           ///< host-mapped, this rank's (null when tracing is off)
  uint32_t* failureClaim;       ///< the node's first rank's RankState::failureClaim (peer-mapped)
  uint32_t traceCapacity;
  uint32_t ringSlots;
  uint32_t rank, nRanks;
  uint32_t nWorkers;  ///< worker CTAs (the grid is nWorkers + 1: block 0 is the control block)
  /// Bit q set: rank q is on this rank's node, so peers[q] is mapped and this GPU writes its words directly.
  /// Ranks of other nodes are reached through the proxy (the FIFO) and heard from through the inbox.
  uint32_t localMask;
  uint64_t pollBudgetNs;       ///< budget of every bounded wait
  ProxyFifoDeviceHandle fifo;  ///< this rank's command FIFO (ring null: the communicator spans one node)
  InboxRecord* inbox;          ///< host-mapped, this rank's inbox (null: one node)
  const char* inboxStaging;    ///< host-mapped: where the host puts the bytes of Copy records
  uint32_t inboxCapacity;      ///< records, a power of two
  uint32_t reserved1;
};
static_assert(std::is_trivially_copyable_v<EngineDeviceHandle>);

}  // namespace mk::device
