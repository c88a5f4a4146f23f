// mkernel — the resident kernel's side of the inter-node path: a ProxyPut step stages its bytes in host memory and
// pushes one command per chunk into the rank's FIFO (mk/device/fifo_device.hpp); the control block's inbox warps
// apply what the host brings from other nodes (mk/device/inbox_device.hpp). Every wait is an MK_POLL.
#pragma once

#include <cstdint>

#include "mk/device/engine_device.hpp"
#include "mk/device/fifo_device.hpp"
#include "mk/device/inbox_device.hpp"
#include "mk/device/poll_device.hpp"

#if MK_HAVE_DEVICE_CODE
namespace mk::device {

/// Copy `bytes` from `src` to `dst` with threads tid, tid + nth, ...: 16-byte vectors when both share their
/// alignment modulo 16 (bytes before and after one at a time), bytes otherwise. Either side may be host-mapped.
MK_DEVICE_INLINE void copyBytes(char* dst, const char* src, uint64_t bytes, uint32_t tid, uint32_t nth) {
  const uintptr_t mis = reinterpret_cast<uintptr_t>(dst) & 15u;
  uint64_t head = bytes;
  if (mis == (reinterpret_cast<uintptr_t>(src) & 15u)) head = bytes < ((16u - mis) & 15u) ? bytes : ((16u - mis) & 15u);
  for (uint64_t i = tid; i < head; i += nth) dst[i] = src[i];
  if (head == bytes) return;
  const uint64_t nVec = (bytes - head) / 16;
  const uint4* s4 = reinterpret_cast<const uint4*>(src + head);
  uint4* d4 = reinterpret_cast<uint4*>(dst + head);
  uint64_t i = tid;
  // Several vectors in flight per thread: host memory is a PCIe round trip away.
  for (; i + 3ull * nth < nVec; i += 4ull * nth) {
    const uint4 v0 = s4[i], v1 = s4[i + nth], v2 = s4[i + 2ull * nth], v3 = s4[i + 3ull * nth];
    d4[i] = v0;
    d4[i + nth] = v1;
    d4[i + 2ull * nth] = v2;
    d4[i + 3ull * nth] = v3;
  }
  for (; i < nVec; i += nth) d4[i] = s4[i];
  for (uint64_t t = head + nVec * 16 + tid; t < bytes; t += nth) dst[t] = src[t];
}

/// Publish a command at its claimed position `pos`: `arg`, then the header last with release. The system fence
/// before it is cumulative over the writes the calling thread has ordered before it (a ProxyPut's staged chunk,
/// after a CTA barrier): the proxy that acquires the header sees them.
MK_DEVICE_INLINE void publishCommand(const ProxyFifoDeviceHandle& f, uint64_t pos, uint64_t header, uint64_t arg) {
  ProxyCommand* slot = &f.ring[pos & (f.capacity - 1)];
  storeRelaxed(&slot->arg, arg);
  fenceSys();
  storeRelease(&slot->header, header);
}

/// Run a ProxyPut step with every thread of the lane's first CTA: for each chunk of the step's `bytes`, claim a FIFO
/// position, wait (bounded) until its staging slot is free, copy the chunk from `src` into the slot, then push the
/// command (header last, release: the chunk is visible to the proxy first). The lane may overwrite the source
/// afterwards; the bytes land on the other node, then the destination flag is raised there (kLsRemoteSignal), later.
/// Returns false, in every thread, on abort or timeout (Status::ProxyTimeout names the FIFO position).
MK_DEVICE_INLINE bool proxyPutStep(const EngineDeviceHandle& h, const LoweredStep& step, const char* src,
                                   uint64_t bytes, uint32_t op, uint32_t lane, uint32_t stepIdx, uint32_t* sharedWord) {
  const ProxyFifoDeviceHandle& f = h.fifo;
  const uint32_t tid = threadIdx.x, nth = blockDim.x;
  const uint64_t chunks = bytes == 0 ? 1 : (bytes + f.chunkBytes - 1) / f.chunkBytes;
  // A slot is free once `done` passed its previous occupant: the ring's and the staging's reuse distance.
  const uint64_t window = f.stagingSlots < f.capacity ? f.stagingSlots : f.capacity;
  for (uint64_t c = 0; c < chunks; ++c) {
    __shared__ unsigned long long sPos;
    if (tid == 0) {
      const uint64_t pos = atomicAdd(reinterpret_cast<unsigned long long*>(f.head), 1ull);
      uint64_t seen = loadVolatile(f.doneCache);
      bool ok = true;
      if (pos - seen >= window) {
        ok = MK_POLL(h, (seen = loadVolatile(f.done)) + window > pos,
                     (PollSite{Status::ProxyTimeout, op, lane, stepIdx, static_cast<uint32_t>(pos), pos - window + 1}),
                     seen);
        if (ok) atomicMax(reinterpret_cast<unsigned long long*>(f.doneCache), static_cast<unsigned long long>(seen));
      }
      sPos = pos;
      *sharedWord = ok ? 1u : 0u;
    }
    __syncthreads();
    if (*sharedWord == 0) return false;
    const uint64_t pos = sPos;
    const uint64_t begin = c * f.chunkBytes;
    const uint64_t len = bytes == 0 ? 0 : (bytes - begin < f.chunkBytes ? bytes - begin : f.chunkBytes);
    copyBytes(f.staging + (pos % f.stagingSlots) * f.chunkBytes, src + begin, len, tid, nth);
    __syncthreads();
    if (tid == 0) {
      const bool last = c + 1 == chunks;
      const ProxyKind kind = bytes == 0                                ? ProxyKind::Signal
                             : (last && (step.bits & kLsRemoteSignal)) ? ProxyKind::PutSignal
                                                                       : ProxyKind::Put;
      publishCommand(f, pos, packProxyHeader(kind, op, lane, stepIdx), c);
    }
    __syncthreads();  // sPos and the shared word are rewritten for the next chunk
  }
  return true;
}

/// The control block's inbox warps (every warp from the third on, `nThreads` threads, named barrier 1): apply the
/// inbox records in order from `*pos` until it reads empty. Copy records move their bytes with every thread;
/// the rest are one store or add by the first thread after the copies before them completed. A malformed record is
/// reported as BadProgram (index in `flag`, header in `expected`) and skipped.
MK_DEVICE_INLINE void drainInbox(const EngineDeviceHandle& h, uint64_t* pos, uint32_t nThreads, uint32_t tid,
                                 InboxRecord* shared) {
  RankState* st = h.state;
  for (;;) {
    if (tid == 0) {
      InboxRecord* r = &h.inbox[*pos & (h.inboxCapacity - 1)];
      const uint64_t header = loadVolatile(&r->header);
      shared->header = header;
      if (inboxKind(header) != InboxKind::Empty) {
        fenceSys();  // acquire: the record's fields, and the staged bytes the host wrote before it
        shared->value = loadRelaxed(&r->value);
        shared->dst = loadRelaxed(&r->dst);
        shared->src = loadRelaxed(&r->src);
      }
    }
    asm volatile("bar.sync 1, %0;" ::"r"(nThreads) : "memory");
    const InboxRecord rec = *shared;
    const InboxKind kind = inboxKind(rec.header);
    if (kind == InboxKind::Empty) {
      asm volatile("bar.sync 1, %0;" ::"r"(nThreads) : "memory");  // everyone read the record before it changes
      return;
    }
    if (kind == InboxKind::Copy)
      copyBytes(reinterpret_cast<char*>(rec.dst), h.inboxStaging + rec.src, rec.value, tid, nThreads);
    asm volatile("bar.sync 1, %0;" ::"r"(nThreads) : "memory");
    if (tid == 0) {
      const uint32_t index = inboxIndex(rec.header);
      const uint32_t slot = inboxOpTag(rec.header) % kSlots;
      if (kind == InboxKind::Copy) {
        fenceGpu();  // the copies of every inbox thread (acquired by the barrier) before what follows them
      } else if (kind == InboxKind::FlagAdd && index < kMaxFlags) {
        addReleaseGpu(&st->flags[slot][index], rec.value);
      } else if (kind == InboxKind::DoneFrom && index < h.nRanks) {
        storeReleaseGpu(&st->doneFrom[index], static_cast<uint32_t>(rec.value));
      } else if (kind == InboxKind::EnteredFrom && index < h.nRanks) {
        storeReleaseGpu(&st->enteredFrom[index], static_cast<uint32_t>(rec.value));
      } else {
        reportFailure(h,
                      PollSite{Status::BadProgram, inboxOpTag(rec.header), 0xFFFFFFFFu, 0xFFFFFFFFu, index, rec.header},
                      rec.value, 0);
      }
      // Empty again before the slot is handed back: the host rewrites it only after inboxTaken passed it.
      storeRelaxed(&h.inbox[*pos & (h.inboxCapacity - 1)].header, uint64_t{0});
      storeRelease(&h.mailbox->inboxTaken, *pos + 1);
    }
    ++*pos;
  }
}

}  // namespace mk::device
#endif  // MK_HAVE_DEVICE_CODE
