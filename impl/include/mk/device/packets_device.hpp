// mkernel — LL packets in the resident kernel: data and flag in the same stores (docs/gpu-engine.md, "LL packets").
//
// A packet is 16 bytes {data lo, epoch, data hi, epoch}: 8 bytes of data, each 4-byte half next to the op's epoch
// (op + 1) in the same 8-byte word. The sender writes it with one 16-byte store and no fence; the receiver polls
// the packet itself with 16-byte volatile loads until both epochs are this op's, so an 8-byte word whose epoch is
// current carries current data (8-byte aligned stores are single-copy atomic). No flag, no fence between data
// and flag, no second round trip: what the packet costs is half the link's bandwidth, which is why only small
// puts use it. A packet area is reused every kSlots ops; an older op's packets carry an older epoch, so the area
// is never zeroed.
#pragma once

#include <cstdint>

#include "mk/device/engine_device.hpp"
#include "mk/device/poll_device.hpp"

#if MK_HAVE_DEVICE_CODE
namespace mk::device {

MK_DEVICE_INLINE void storePacket(uint32_t* p, uint32_t lo, uint32_t hi, uint32_t epoch) {
  asm volatile("st.volatile.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(lo), "r"(epoch), "r"(hi), "r"(epoch)
               : "memory");
}

MK_DEVICE_INLINE void loadPacket(const uint32_t* p, uint32_t* v) {
  asm volatile("ld.volatile.global.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v[0]), "=r"(v[1]), "=r"(v[2]), "=r"(v[3])
               : "l"(p)
               : "memory");
}

/// The 8 data bytes of packet `j` of a run of `bytes` bytes starting at `src` (fewer, zero-padded, at the tail).
MK_DEVICE_INLINE uint2 readPacketData(const char* src, uint64_t bytes, uint64_t j) {
  const uint64_t at = j * kPacketDataBytes;
  const char* s = src + at;
  if (at + kPacketDataBytes <= bytes && (reinterpret_cast<uintptr_t>(s) & 7u) == 0)
    return *reinterpret_cast<const uint2*>(s);
  uint32_t w[2] = {0, 0};
  for (uint32_t k = 0; k < kPacketDataBytes && at + k < bytes; ++k)
    w[k / 4] |= static_cast<uint32_t>(static_cast<unsigned char>(s[k])) << (8 * (k % 4));
  return make_uint2(w[0], w[1]);
}

MK_DEVICE_INLINE void writePacketData(char* dst, uint64_t bytes, uint64_t j, uint32_t lo, uint32_t hi) {
  const uint64_t at = j * kPacketDataBytes;
  char* d = dst + at;
  if (at + kPacketDataBytes <= bytes && (reinterpret_cast<uintptr_t>(d) & 7u) == 0) {
    *reinterpret_cast<uint2*>(d) = make_uint2(lo, hi);
    return;
  }
  const uint32_t w[2] = {lo, hi};
  for (uint32_t k = 0; k < kPacketDataBytes && at + k < bytes; ++k)
    d[k] = static_cast<char>((w[k / 4] >> (8 * (k % 4))) & 0xFFu);
}

/// Send bytes [byteBegin, byteEnd) of a packet Put (byteBegin a multiple of 8: ctaPiece's pieces are) from `src`
/// (the run's first byte) as packets into `area` (the run's first packet on the receiver); every thread of the
/// CTA takes packets tid, tid + nth, ...
MK_DEVICE_INLINE void sendPackets(uint32_t* area, const char* src, uint64_t runBytes, uint64_t byteBegin,
                                  uint64_t byteEnd, uint32_t epoch, uint32_t tid, uint32_t nth) {
  const uint64_t first = byteBegin / kPacketDataBytes;
  const uint64_t last = (byteEnd + kPacketDataBytes - 1) / kPacketDataBytes;
  for (uint64_t j = first + tid; j < last; j += nth) {
    const uint2 d = readPacketData(src, runBytes, j);
    storePacket(area + 4 * j, d.x, d.y, epoch);
  }
}

/// Receive bytes [byteBegin, byteEnd) of one packet run: wait (bounded, `site`) until each packet carries
/// `epoch`, then write its data to `dst` (the run's first byte). Returns false on abort or timeout.
MK_DEVICE_INLINE bool recvPackets(const EngineDeviceHandle& h, const uint32_t* area, char* dst, uint64_t runBytes,
                                  uint64_t byteBegin, uint64_t byteEnd, uint32_t epoch, uint32_t tid, uint32_t nth,
                                  const PollSite& site) {
  const uint64_t first = byteBegin / kPacketDataBytes;
  const uint64_t last = (byteEnd + kPacketDataBytes - 1) / kPacketDataBytes;
  for (uint64_t j = first + tid; j < last; j += nth) {
    uint32_t v[4];
    const bool ok =
        MK_POLL(h, (loadPacket(area + 4 * j, v), v[1] == epoch && v[3] == epoch), site, (uint64_t{v[1]} << 32) | v[3]);
    if (!ok) return false;
    writePacketData(dst, runBytes, j, v[0], v[2]);
  }
  return true;
}

/// A Wait with kLsPacket, for CTA `idx` (< step.activeCtas) of its lane: receive its share of every packet run the
/// lowering attached (LoweredPacketRecv[step.value, step.value + step.count), split like a data step by ctaPiece).
MK_DEVICE_INLINE bool recvPacketRuns(const EngineDeviceHandle& h, const ProgramHeader* ph, const LoweredStep& step,
                                     const uint64_t* table, uint32_t op, const PollSite& site, uint32_t idx,
                                     uint32_t tid, uint32_t nth) {
  const auto* runs =
      reinterpret_cast<const LoweredPacketRecv*>(reinterpret_cast<const char*>(ph) + ph->packetRecvsOffset);
  const uint32_t* area = &h.state->packets[op % kSlots][0][0];
  for (uint64_t k = 0; k < step.count; ++k) {
    const LoweredPacketRecv run = runs[step.value + k];
    const uint32_t es = dtypeBytes(run.dtype);
    uint64_t b, e;
    ctaPiece(run.count, step.activeCtas, idx, &b, &e);
    if (!recvPackets(h, area + run.areaOffset / 4, operandAddress(table, run.dst), run.count * es, b * es, e * es,
                     op + 1, tid, nth, site))
      return false;
  }
  return true;
}

}  // namespace mk::device
#endif  // MK_HAVE_DEVICE_CODE
