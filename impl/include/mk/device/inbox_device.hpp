// mkernel — the CPU -> GPU inbox of one rank: what arrived from ranks on other nodes, for the resident kernel
// to apply to its own device memory (flag increments, a remote rank's done and entered counts).
//
// A ring of 16-byte records in host-mapped pinned memory. Positions are 64-bit counters; a position's slot is
// position % capacity, a power of two.
//  * The host (one writer per rank: the engine's receive path) writes `value`, then `header` LAST with release,
//    and waits (bounded) while position - taken >= capacity.
//  * The control block's host-link warp reads `header` (a kind other than Empty means the record is complete),
//    acquires, applies the record, zeroes the header, and advances RankMailbox::inboxTaken (host-mapped) in
//    position order. Records are applied in the order they were written: a remote rank's data, then its flag
//    increment, then its done count, as they arrived.
// Data arriving from another node is written by the host into a host-mapped receive staging area; a Copy record asks
// the kernel to copy it into the destination (device memory), in order with the records around it, so a put's bytes
// are in place before its flag increment is applied. The host makes no CUDA call on this path (fifo_device.hpp says
// why); it reuses the staging of a Copy record once inboxTaken passed it.
#pragma once

#include <cstdint>
#include <type_traits>

#include "mk/device/macros_device.hpp"

namespace mk::device {

/// What an inbox record asks the kernel to do (InboxRecord::header bits 0..3).
enum class InboxKind : uint32_t {
  Empty = 0,
  Copy = 4,         ///< copy `value` bytes from receive staging offset `src` to device address `dst`
  FlagAdd = 1,      ///< flags[slot][index] += value (a ProxyPut's signal; slot = op tag % kSlots)
  DoneFrom = 2,     ///< doneFrom[index] = value (rank `index`, on another node, finished op value - 1)
  EnteredFrom = 3,  ///< enteredFrom[index] = value (rank `index` entered op value - 1)
};

/// Header bit layout (LSB first): kind [0, 4) | op tag [4, 16) | index [32, 64). The op tag (the op's sequence
/// number modulo 4096, as in ProxyCommand) picks the flag slot of FlagAdd; index is the flag id or the rank.
struct alignas(32) InboxRecord {
  uint64_t header;  ///< packInboxHeader(); written last, with release
  uint64_t value;   ///< FlagAdd: the increment; DoneFrom / EnteredFrom: the count; Copy: the bytes
  uint64_t dst;     ///< Copy: the destination's device address (16-byte aligned with src, or any for a tail)
  uint64_t src;     ///< Copy: the byte offset in the receive staging area
};
static_assert(sizeof(InboxRecord) == 32);
static_assert(std::is_trivially_copyable_v<InboxRecord>);

inline constexpr uint32_t kInboxOpTagShift = 4;
inline constexpr uint32_t kInboxOpTagMask = 0xFFFu;
inline constexpr uint32_t kInboxIndexShift = 32;

MK_HOST_DEVICE_INLINE uint64_t packInboxHeader(InboxKind kind, uint32_t opTag, uint32_t index) {
  return static_cast<uint64_t>(static_cast<uint32_t>(kind) & 0xFu) |
         (static_cast<uint64_t>(opTag & kInboxOpTagMask) << kInboxOpTagShift) |
         (static_cast<uint64_t>(index) << kInboxIndexShift);
}
MK_HOST_DEVICE_INLINE InboxKind inboxKind(uint64_t header) { return static_cast<InboxKind>(header & 0xFu); }
MK_HOST_DEVICE_INLINE uint32_t inboxOpTag(uint64_t header) {
  return static_cast<uint32_t>(header >> kInboxOpTagShift) & kInboxOpTagMask;
}
MK_HOST_DEVICE_INLINE uint32_t inboxIndex(uint64_t header) { return static_cast<uint32_t>(header >> kInboxIndexShift); }

}  // namespace mk::device
