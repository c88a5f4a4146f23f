// mkernel — the GPU -> CPU command FIFO of one rank: the 16-byte commands its lanes push (one per ProxyPut step
// of an op) and its proxy thread pops, in host-mapped pinned memory.
//
// Positions are 64-bit counters (they do not wrap in practice); a position's slot is position % capacity, a
// power of two.
//  * head (device memory): the next free position, claimed with atomicAdd, so several lanes may push.
//  * done (host-mapped, written by the proxy only, release): commands fully handled, in position order — the
//    proxy has read the data the command names (the pusher may overwrite its source) and frees the slot.
//  * doneCache (device memory): the last `done` a pusher read, so a push crosses PCIe only when the ring looks
//    full.
// A push waits (bounded) while position - done >= capacity: back-pressure, never overwrite, never loss.
//
// The data of a GPU's command travels through host memory the GPU writes itself: the pushing lane copies a chunk of
// the step's source into staging slot position % stagingSlots (host-mapped, chunkBytes each) before it pushes, so
// the proxy reads only host memory and makes no CUDA call while ops run (a CUDA call of the proxy can wait for a
// driver lock that a caller's thread holds while it waits for the very op the proxy serves). A step of more bytes
// than one chunk pushes one command per chunk, `arg` = the chunk's index; only the last raises the remote flag.
//
// Word order: a pusher writes `arg`, then `header` LAST with release (system scope: the reader is the CPU); the
// proxy acquires `header`, and a header whose kind is Empty means the slot holds no command. The proxy copies
// the command out, zeroes the header, handles the command and only then advances `done`.
#pragma once

#include <cstdint>
#include <type_traits>

#include "mk/device/macros_device.hpp"

namespace mk::device {

/// What a command asks the proxy to do (ProxyCommand::header bits 0..3).
enum class ProxyKind : uint32_t {
  Empty = 0,      ///< no command in this slot
  Put = 1,        ///< a ProxyPut step without a signal: send its bytes to the destination rank's buffer
  PutSignal = 2,  ///< a ProxyPut step with kStepSignal: the bytes, then the destination flag once they landed
  Signal = 3,     ///< a ProxyPut step of count 0: the destination flag only
  Flush = 4,      ///< nothing to send: `done` passes it once every earlier command was handled
};

/// Header bit layout (LSB first): kind [0, 4) | op tag [4, 16) | lane [16, 32) | step [32, 64).
///  * op tag: the op's sequence number on the pushing rank, modulo 4096 (at most kSlots ops are live at once, so
///    the proxy can tell them apart); the proxy reads the op's bindings from it.
///  * lane, step: the step in the pushing rank's schedule; the proxy reads the step's operands, count, dtype and
///    flag from its own copy of the schedule, so the record carries no addresses.
inline constexpr uint32_t kProxyKindBits = 4;
inline constexpr uint32_t kProxyOpTagBits = 12;
inline constexpr uint32_t kProxyLaneBits = 16;
inline constexpr uint32_t kProxyStepBits = 32;
inline constexpr uint32_t kProxyOpTagShift = kProxyKindBits;
inline constexpr uint32_t kProxyLaneShift = kProxyOpTagShift + kProxyOpTagBits;
inline constexpr uint32_t kProxyStepShift = kProxyLaneShift + kProxyLaneBits;
static_assert(kProxyStepShift + kProxyStepBits == 64, "the header fields fill one 64-bit word");
/// Op tags wrap at this many ops.
inline constexpr uint32_t kProxyOpTags = 1u << kProxyOpTagBits;
/// Most lanes a rank may push from (lane indices must fit the header).
inline constexpr uint32_t kProxyMaxLanes = 1u << kProxyLaneBits;

/// One command: 16 bytes, 16-byte aligned, in a ring of host-mapped pinned memory.
struct alignas(16) ProxyCommand {
  uint64_t header;  ///< packProxyHeader(); written last, with release
  uint64_t arg;     ///< step commands: the chunk's index in the step's bytes (chunks of chunkBytes); Flush: 0
};
static_assert(sizeof(ProxyCommand) == 16);
static_assert(std::is_trivially_copyable_v<ProxyCommand>);

/// The header of a command of `kind` for step `step` of lane `lane` of the op with sequence number `opSeq`.
MK_HOST_DEVICE_INLINE uint64_t packProxyHeader(ProxyKind kind, uint32_t opSeq, uint32_t lane, uint32_t step) {
  return static_cast<uint64_t>(static_cast<uint32_t>(kind) & ((1u << kProxyKindBits) - 1)) |
         (static_cast<uint64_t>(opSeq & (kProxyOpTags - 1)) << kProxyOpTagShift) |
         (static_cast<uint64_t>(lane & (kProxyMaxLanes - 1)) << kProxyLaneShift) |
         (static_cast<uint64_t>(step) << kProxyStepShift);
}
MK_HOST_DEVICE_INLINE ProxyKind proxyKind(uint64_t header) {
  return static_cast<ProxyKind>(header & ((1u << kProxyKindBits) - 1));
}
MK_HOST_DEVICE_INLINE uint32_t proxyOpTag(uint64_t header) {
  return static_cast<uint32_t>(header >> kProxyOpTagShift) & (kProxyOpTags - 1);
}
MK_HOST_DEVICE_INLINE uint32_t proxyLane(uint64_t header) {
  return static_cast<uint32_t>(header >> kProxyLaneShift) & (kProxyMaxLanes - 1);
}
MK_HOST_DEVICE_INLINE uint32_t proxyStep(uint64_t header) { return static_cast<uint32_t>(header >> kProxyStepShift); }

/// What a pusher needs of one rank's FIFO; passed to the kernel by value.
struct ProxyFifoDeviceHandle {
  ProxyCommand* ring;    ///< host-mapped, `capacity` slots
  uint64_t* head;        ///< device memory: next position to claim
  uint64_t* doneCache;   ///< device memory: the last `done` a pusher saw
  const uint64_t* done;  ///< host-mapped: commands the proxy fully handled (written by the proxy only)
  uint32_t capacity;     ///< slots, a power of two
  uint32_t
      stagingSlots;     ///< chunk slots of `staging` (<= capacity): the data of position p is in slot p % stagingSlots
  char* staging;        ///< host-mapped, stagingSlots x chunkBytes: the chunks the proxy sends
  uint64_t chunkBytes;  ///< bytes per chunk (a multiple of 16)
};
static_assert(std::is_trivially_copyable_v<ProxyFifoDeviceHandle>);

}  // namespace mk::device
