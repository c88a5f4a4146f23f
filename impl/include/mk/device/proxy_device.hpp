// mkernel — the resident kernel's side of the inter-node path: a ProxyPut step pushes its command into the rank's
// FIFO (mk/device/fifo_device.hpp) and waits until the proxy has handled it; the host-link warp applies what the
// inbox (mk/device/inbox_device.hpp) brings from other nodes. Both spin with MK_POLL.
#pragma once

#include <cstdint>

#include "mk/device/engine_device.hpp"
#include "mk/device/fifo_device.hpp"
#include "mk/device/inbox_device.hpp"
#include "mk/device/poll_device.hpp"

#if MK_HAVE_DEVICE_CODE
namespace mk::device {

/// Run a ProxyPut step (one thread): push the command naming step `stepIdx` of lane `lane` of op `op` and wait
/// until the proxy's `done` passes it, i.e. it has read the step's source (the lane may overwrite it) and sent it.
/// The destination flag (kLsRemoteSignal) is raised by the receiving side once the data has landed. Returns false
/// on abort or timeout (Status::ProxyTimeout names the FIFO position in `flag` and `expected`).
MK_DEVICE_INLINE bool proxyPutStep(const EngineDeviceHandle& h, const LoweredStep& step, uint32_t op, uint32_t lane,
                                   uint32_t stepIdx) {
  const ProxyFifoDeviceHandle& f = h.fifo;
  const ProxyKind kind = step.count == 0                 ? ProxyKind::Signal
                         : (step.bits & kLsRemoteSignal) ? ProxyKind::PutSignal
                                                         : ProxyKind::Put;
  const uint64_t pos = atomicAdd(reinterpret_cast<unsigned long long*>(f.head), 1ull);
  // Back-pressure: the slot is free once `done` passed the command capacity positions back. The device-side
  // cache spares a PCIe read per push while the ring has room.
  uint64_t seen = loadVolatile(f.doneCache);
  if (pos - seen >= f.capacity) {
    const bool room = MK_POLL(
        h, (seen = loadVolatile(f.done)) + f.capacity > pos,
        (PollSite{Status::ProxyTimeout, op, lane, stepIdx, static_cast<uint32_t>(pos), pos - f.capacity + 1}), seen);
    if (!room) return false;
    atomicMax(reinterpret_cast<unsigned long long*>(f.doneCache), static_cast<unsigned long long>(seen));
  }
  ProxyCommand* slot = &f.ring[pos & (f.capacity - 1)];
  storeRelaxed(&slot->arg, uint64_t{0});
  // The header last, with release at system scope: the proxy (a CPU thread) acquires it, and it orders this
  // thread's earlier writes (and, through the lane barrier or flag wait that preceded the step, the lane's data)
  // before the proxy's copy reads the source.
  storeRelease(&slot->header, packProxyHeader(kind, op, lane, stepIdx));
  const bool handled = MK_POLL(h, loadVolatile(f.done) > pos,
                               (PollSite{Status::ProxyTimeout, op, lane, stepIdx, static_cast<uint32_t>(pos), pos + 1}),
                               loadVolatile(f.done));
  if (handled) atomicMax(reinterpret_cast<unsigned long long*>(f.doneCache), static_cast<unsigned long long>(pos + 1));
  return handled;
}

/// Apply up to `most` inbox records from position `*pos` (host-link warp, one thread). A malformed record is
/// reported as BadProgram (its index in `flag`, its header in `expected`) and skipped; the group then aborts.
MK_DEVICE_INLINE void drainInbox(const EngineDeviceHandle& h, uint64_t* pos, uint32_t most) {
  RankState* st = h.state;
  for (uint32_t k = 0; k < most; ++k) {
    InboxRecord* r = &h.inbox[*pos & (h.inboxCapacity - 1)];
    const uint64_t header = loadVolatile(&r->header);
    const InboxKind kind = inboxKind(header);
    if (kind == InboxKind::Empty) break;
    fenceSys();  // acquire: the value, and the data the host copied into this GPU before it wrote the record
    const uint64_t value = loadRelaxed(&r->value);
    const uint32_t index = inboxIndex(header);
    const uint32_t slot = inboxOpTag(header) % kSlots;
    if (kind == InboxKind::FlagAdd && index < kMaxFlags) {
      addReleaseGpu(&st->flags[slot][index], value);
    } else if (kind == InboxKind::DoneFrom && index < h.nRanks) {
      storeReleaseGpu(&st->doneFrom[index], static_cast<uint32_t>(value));
    } else if (kind == InboxKind::EnteredFrom && index < h.nRanks) {
      storeReleaseGpu(&st->enteredFrom[index], static_cast<uint32_t>(value));
    } else {
      reportFailure(h, PollSite{Status::BadProgram, inboxOpTag(header), 0xFFFFFFFFu, 0xFFFFFFFFu, index, header}, value,
                    0);
    }
    // Empty again before the slot is handed back: the host rewrites it only after inboxTaken passed it.
    storeRelaxed(&r->header, uint64_t{0});
    ++*pos;
  }
}

}  // namespace mk::device
#endif  // MK_HAVE_DEVICE_CODE
