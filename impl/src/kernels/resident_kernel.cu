// mkernel — the resident kernel: launched once per rank, it runs op after op from the doorbell ring.
//
// Grid = 1 control block + nWorkers worker CTAs (all co-resident: checked before launch).
//  * Control warp (block 0, warp 0): notices doorbells, takes the op's descriptor that warp 1 (the host
//    link, the only warp touching host memory) staged in shared memory,
//    gates the op (see "Cross-op rules" below), hands it to the workers through OpBoard + `published`,
//    tells the peers it entered the op, notices local completion (every worker arrived), zeroes the slot's
//    flags / barriers / lane-sync counters, pushes its done count to every rank, and advances `complete`
//    (what stream hand-offs poll) by rule 4.
//  * Worker CTA w runs lane ctas[w].lane of the op's lowered program (CTAs without a lane idle through
//    the op). Data steps split their elements among the lane's first activeCtas CTAs (ctaPiece).
//    (The worker CTAs' code is in worker_lanes.cuh, included here: one translation unit.)
//
// Cross-op rules (why back-to-back ops never confuse flags or scratch) — also in docs/gpu-engine.md:
//  1. Op k uses slot k % 2 of every per-op resource: flags, barrier counters, lane-sync counters, board,
//     scratch arena, in-place staging. A rank zeroes its slot's counters when op k completes locally
//     (every flag is fully consumed by then: the validator's rule), before it announces done(k).
//  2. Op k is published (may start) on a rank only once op k-2 has completed on EVERY rank, so nobody
//     can still read or write slot k % 2 of anyone from op k-2 — and only once op k-1 is complete for
//     this rank's stream (rule 4) when the host marked op k with kOpFence (it touches user memory op k-1
//     touched).
//  3. A step that touches a peer's user buffer (input / output) first waits until that peer has entered
//     op k: the peer's stream has reached the op, so the caller is done with that memory.
//  4. `complete` (and so the caller's stream) moves past op k only when no peer writes into or reads from
//     this rank's user buffers afterwards: when every rank finished op k, or, for a program lowered with
//     kProgLocalCompletion (no other rank's step names this rank's user buffers), when this rank did.
// So flags need no epoch base: thresholds are the schedule's own values in a slot that starts at zero.
#include <cuda_runtime.h>

#include <cstdint>

#include "data_ops.cuh"
#include "mbarrier.cuh"
#include "mk/device/compute_lane_device.hpp"
#include "mk/device/descriptor_device.hpp"
#include "mk/device/engine_device.hpp"
#include "mk/device/packets_device.hpp"
#include "mk/device/poll_device.hpp"
#include "mk/device/proxy_device.hpp"
#include "mk/schedule/types.hpp"
#include "resident_kernel.hpp"
#include "worker_lanes.cuh"

namespace mk::device {
namespace {

// ---- control block: warp 0 drives ops, warp 1 talks to the host ------------------------------------------

/// Depth of the descriptor prefetch: ops whose descriptor sits in shared memory before their doorbell rings.
constexpr uint32_t kPrefetch = 2;

/// What the two warps of the control block share (shared memory). Every hand-over between them is an
/// mbarrier polled with the non-blocking test_wait: an arrive releases and a successful test acquires at CTA
/// scope, so the data it guards needs no other fence — and compute-sanitizer racecheck, which does not see
/// orderings made of volatile flags and fences, sees these (the flag version it reported as hazards). The
/// slot barriers expect all 32 lanes of the writing (full) or reading (empty) warp, and every lane of the
/// other warp tests the phase before it touches the slot: each thread's accesses are ordered by its own
/// arrive or test, not through __syncwarp (racecheck reported the one-arrival version as 3 hazards). Phases:
/// op j uses slot j % kPrefetch in phase j / kPrefetch of both of its barriers; neither can run two phases
/// ahead of its reader, because staging op j + kPrefetch needs `empty` of op j and taking op j needs `full`
/// of op j.
struct ControlShared {
  uint64_t full[kPrefetch];   ///< host-link -> control: the slot holds op j's descriptor (32 arrivals)
  uint64_t empty[kPrefetch];  ///< control -> host-link: op j was published, its slot may be refilled (32)
  uint64_t hostShutdown;      ///< host-link -> control: RankMailbox::shutdown was raised (one phase)
  uint64_t done;              ///< control -> host-link: the control warp left its loop (one phase)
  struct Slot {
    uint64_t program;
    uint32_t nBindings, flags;
    uint64_t table[kMaxBindings];
  } slot[kPrefetch];
};

/// Parity of op j's phase in its slot's barriers.
__device__ __forceinline__ uint32_t slotParity(uint32_t j) { return (j / kPrefetch) & 1u; }

/// Warp 1 of the control block: every access to host memory on the engine's path happens here, so the
/// control warp's fences never wait for a PCIe write and its loop never stalls on a PCIe read
/// (mk-probe-latency: a system fence costs 0.6 us, 1.4 us after a host-memory store; a host read ~1.2 us).
///  * stages descriptor j into shared memory as soon as the host has written it, usually long before its
///    doorbell rings (the descriptor's PCIe round trips leave the op's critical path);
///  * mirrors `complete` into RankMailbox::completed and the published count into `fetched`, the host's abort
///    into the device-memory abort word, and RankMailbox::shutdown into the control block.
__device__ void hostLinkWarp(const EngineDeviceHandle& h, ControlShared& cs) {
  const uint32_t lid = threadIdx.x & 31u;
  RankState* st = h.state;
  // next: the op to stage; taken: ops the control warp published (their slots are free again).
  uint32_t next = 0, taken = 0, mirroredComplete = 0, mirroredTaken = 0;
  uint32_t mirroredDone = 0, mirroredEntered = 0;
  bool shutdownSent = false;
  bool refused = false;  // a descriptor failed its checks: nothing more is staged
  for (uint32_t iter = 1;; ++iter) {
    uint32_t quit = 0;
    if (lid == 0) {
      quit = mbarDone(&cs.done, 0) ? 1u : 0u;
      const uint32_t c = loadVolatile(&st->complete);
      if (c != mirroredComplete || quit) {
        storeRelaxed(&h.mailbox->completed, c);
        mirroredComplete = c;
      }
      // The host reuses ring slot j (descriptor AND doorbell word) once fetched > j: only after the op was
      // published, since a doorbell word rewritten before the control warp saw it would be lost. Staging
      // alone does not free the slot.
      while (taken != next && mbarDone(&cs.empty[taken % kPrefetch], slotParity(taken))) ++taken;
      if (taken != mirroredTaken) {
        storeRelaxed(&h.mailbox->fetched, taken);
        mirroredTaken = taken;
      }
      if (h.inbox != nullptr) {
        // Other nodes: hand this rank's done and entered counts to the host, which relays them (this GPU cannot
        // store into their state). What they send is applied by the inbox warps.
        const uint32_t d = loadVolatile(&st->doneFrom[h.rank]), e = loadVolatile(&st->enteredFrom[h.rank]);
        if (d != mirroredDone || e != mirroredEntered) {
          fenceSys();  // the done count stands for this rank's writes: visible before the host relays it
          storeRelaxed(&h.mailbox->doneOut, d);
          storeRelaxed(&h.mailbox->enteredOut, e);
          mirroredDone = d;
          mirroredEntered = e;
        }
      }
      if ((iter & 15u) == 0u) {
        if (loadRelaxed(&h.status->abort) != 0u) storeRelaxed(&st->abort, 1u);
        if (!shutdownSent && loadRelaxed(&h.mailbox->shutdown) != 0u) {
          mbarArrive(&cs.hostShutdown);
          shutdownSent = true;
        }
      }
    }
    if (__shfl_sync(kFullMask, quit, 0)) break;
    taken = __shfl_sync(kFullMask, taken, 0);
    // Stage the next descriptor once its slot is free and the host has published it. Each poll reads the whole
    // descriptor, seq included, in one PCIe round trip: polling seq alone and then reading the body took two, on
    // the critical path of an op submitted to an idle kernel. A body read beside its new seq but before the
    // host's writes of it arrived fails the check word (readDescriptor) and is read again after the fence.
    if (!refused && next - taken < kPrefetch) {
      const OpDescriptor* d = &h.ring[next % h.ringSlots];
      // Every lane acquires the slot's release by the control warp (lane 0 saw it complete: true for all).
      if (next >= kPrefetch) mbarAcquire(&cs.empty[next % kPrefetch], slotParity(next - kPrefetch));
      ControlShared::Slot& sl = cs.slot[next % kPrefetch];
      DescriptorRead rd = readDescriptor(d, h.rank, lid, sl.table);
      if (rd.seq == next + 1) {
        fenceSys();  // acquire: `seq` is written last by the host; what the op reads next was written before it
        if (rd.fault != 0) rd = readDescriptor(d, h.rank, lid, sl.table);  // torn by the host's writes, or bad
        if (lid == 0) {
          // Refused, not staged: the control warp never sees the op and stops on the abort this raises.
          if (rd.fault != 0)
            reportFailure(h, PollSite{Status::BadDescriptor, next, 0xFFFFFFFFu, 0xFFFFFFFFu, rd.fault, rd.want},
                          rd.seen, 0);
          sl.program = rd.program;
          sl.nBindings = rd.nBindings;
          sl.flags = rd.flags;
        }
        if (rd.fault != 0) {
          refused = true;
        } else {
          if (lid == 0) h.stamps[next % h.ringSlots].stagedNs = globalTimerNs();
          mbarArrive(&cs.full[next % kPrefetch]);  // every lane releases its own writes
          ++next;
        }
      }
    }
  }
  if (lid == 0) storeRelaxed(&h.mailbox->exited, 1u);
}

/// Tell every rank of this node (this one included) that this rank entered op `op` (rule 3); the host relays it
/// to the ranks of other nodes (RankMailbox::enteredOut).
__device__ __forceinline__ void announceEntry(const EngineDeviceHandle& h, uint32_t op) {
  for (uint32_t q = 0; q < h.nRanks; ++q)
    if (q != h.rank && (h.localMask & (1u << q))) storeRelaxed(&h.peers[q]->enteredFrom[h.rank], op + 1);
  h.state->enteredFrom[h.rank] = op + 1;
}

/// Warp 0 of the control block: the op pipeline. Touches device and peer memory only.
__device__ void controlWarp(const EngineDeviceHandle& h, ControlShared& cs) {
  __shared__ uint32_t cZero[kSlots][3];  // flags, barriers, sync points to zero when the slot's op completes
  __shared__ uint32_t cLocal[kSlots];    // the slot's op completes for the stream on local completion
  const uint32_t lid = threadIdx.x & 31u;
  RankState* st = h.state;
  const uint32_t ringSlots = h.ringSlots;
  // lastGlobal: ops done on every rank (rules 2 and 4). lastComplete: ops complete for this rank's stream
  // (= lastGlobal, plus following ops with kProgLocalCompletion that are done here).
  uint32_t nextPub = 0, nextLocal = 0, lastComplete = 0, lastGlobal = 0;
  // A fenced op published early (before the previous op completed): its entry is announced to the peers
  // only once its fence holds (rule 3: peers may then touch this rank's user buffers).
  uint32_t enterOp = 0;
  bool enterPending = false;
  bool have = false, failed = false;
  uint64_t descSince = 0, gateSince = 0;
  // Lane 0, after the fence that releases them: the stream may move past ops [lastComplete, c); their stamps.
  auto releaseComplete = [&](uint32_t c) {
    storeRelaxed(&st->complete, c);
    const uint64_t now = globalTimerNs();
    for (uint32_t j = lastComplete; j != c; ++j) {
      h.stamps[j % ringSlots].completeNs = now;
      h.stamps[j % ringSlots].op = j;
    }
  };
  if (lid < kSlots * 3) cZero[lid / 3][lid % 3] = 0;
  if (lid < kSlots) cLocal[lid] = 0;
  __syncwarp();

  // Co-residency: every CTA announced itself, or the host times out and reports it.
  if (lid == 0) {
    while (loadVolatile(&st->started) != h.nWorkers + 1 && loadRelaxed(&h.status->abort) == 0u) {
    }
    storeRelaxed(&h.mailbox->started, loadVolatile(&st->started));
  }
  __syncwarp();

  for (uint32_t iter = 1;; ++iter) {
    if ((iter & 63u) == 0u) {
      uint32_t ab = 0, sd = 0;
      if (lid == 0) {
        ab = aborted(h) ? 1u : 0u;  // the host's abort arrives here through the host-link warp
        sd = mbarDone(&cs.hostShutdown, 0) ? 1u : 0u;
      }
      ab = __shfl_sync(kFullMask, ab, 0);
      sd = __shfl_sync(kFullMask, sd, 0);
      if (ab) {
        failed = true;
        break;
      }
      // Leave only once every rank is done too: peers still write done counts into this rank's state.
      if (sd && nextLocal == nextPub && !have && lastGlobal == nextPub) break;
    }

    // (a) Local completion of the oldest running op: zero its slot (rule 1), then announce done.
    if (nextLocal != nextPub) {
      uint32_t done = 0;
      if (lid == 0) done = loadVolatile(&st->lanesDone[nextLocal % kSlots]);
      done = __shfl_sync(kFullMask, done, 0);
      if (done == h.nWorkers) {
        fenceGpu();
        const uint32_t sl = nextLocal % kSlots;
        if (lid == 0) h.stamps[nextLocal % ringSlots].localDoneNs = globalTimerNs();  // every worker CTA finished
        // An op complete on local completion (kProgLocalCompletion) whose predecessors are complete releases the
        // stream (and the next op's workers waiting for it) now: the fence above acquired every worker's writes and
        // releases them at GPU scope, the scope of everyone who reads `complete` on this GPU. The slot reset and the
        // done exchange below are for the peers (rules 1 and 2) and no longer sit between this op and the next.
        if (cLocal[sl] && lastComplete == nextLocal) {
          if (lid == 0) releaseComplete(nextLocal + 1);
          lastComplete = nextLocal + 1;
        }
        for (uint32_t i = lid; i < cZero[sl][0]; i += 32) st->flags[sl][i] = 0;
        for (uint32_t i = lid; i < cZero[sl][1]; i += 32) st->barriers[sl][i] = 0;
        for (uint32_t i = lid; i < cZero[sl][2]; i += 32) st->laneSync[sl][i] = 0;
        if (lid == 0) st->lanesDone[sl] = 0;
        fenceGpu();
        __syncwarp();
        if (lid == 0) {
          // One system-scope release covers the zeroed slot and every worker's writes (acquired above).
          fenceSys();
          // Ranks of other nodes learn it from the host (RankMailbox::doneOut, mirrored by the host-link warp).
          for (uint32_t q = 0; q < h.nRanks; ++q)
            if (h.localMask & (1u << q)) storeRelaxed(&h.peers[q]->doneFrom[h.rank], nextLocal + 1);
        }
        ++nextLocal;
      }
    }

    // (b) Completion: global (rule 4) = the smallest done count over all ranks; for the stream, also the
    // ops after it that need only this rank (kProgLocalCompletion) and are done here. An op's cLocal entry
    // is still its own while the op is not globally done: its slot is reused only after that (rule 2).
    {
      uint32_t g = 0, c = 0;
      if (lid == 0) {
        g = nextLocal;
        for (uint32_t q = 0; q < h.nRanks; ++q) {
          const uint32_t d = loadVolatile(&st->doneFrom[q]);
          if (!seqGeq(d, g)) g = d;
        }
        c = seqGeq(lastComplete, g) ? lastComplete : g;
        while (c != nextLocal && cLocal[c % kSlots]) ++c;
        if (c != lastComplete) {
          // Acquire every rank's done (and so their writes into this GPU) — or, for local completions, this
          // GPU's workers — then release the stream: the fence serves both, so the store after it is relaxed.
          if (g != lastGlobal)
            fenceSys();
          else
            fenceGpu();
          releaseComplete(c);
        }
      }
      lastGlobal = __shfl_sync(kFullMask, g, 0);
      lastComplete = __shfl_sync(kFullMask, c, 0);
    }
    if (enterPending && seqGeq(lastComplete, enterOp)) {
      // The publication's system fence (program order before these stores) still orders the doorbell's
      // data before them.
      if (lid == 0) announceEntry(h, enterOp);
      enterPending = false;
    }

    // (c) The next op may start once its doorbell rang and the host-link warp has staged its descriptor.
    if (!have) {
      uint32_t rung = 0;
      if (lid == 0) rung = loadVolatile(&st->doorbell[nextPub % ringSlots]) == nextPub + 1 ? 1u : 0u;
      rung = __shfl_sync(kFullMask, rung, 0);
      if (rung) {
        uint32_t ready = 0;
        if (lid == 0) {
          ready = mbarDone(&cs.full[nextPub % kPrefetch], slotParity(nextPub)) ? 1u : 0u;
          const uint64_t now = globalTimerNs();
          if (descSince == 0) h.stamps[nextPub % ringSlots].rungNs = now;
          if (ready || descSince == 0) h.stamps[nextPub % ringSlots].doorbellNs = now;
          if (!ready && descSince == 0) descSince = now;
        }
        ready = __shfl_sync(kFullMask, ready, 0);
        if (ready) {
          // Every lane acquires the slot itself (it reads the binding table below); the phase completed, so
          // the test is true for each.
          mbarAcquire(&cs.full[nextPub % kPrefetch], slotParity(nextPub));
          have = true;
          descSince = 0;
        } else {
          uint32_t fail = 0;
          if (lid == 0) {
            const uint64_t now = globalTimerNs();
            if (now - descSince > h.pollBudgetNs) {
              reportFailure(h,
                            PollSite{Status::DescriptorTimeout, nextPub, 0xFFFFFFFFu, 0xFFFFFFFFu, 0, nextPub + 1ull},
                            nextPub, now - descSince);
              fail = 1;
            }
          }
          if (__shfl_sync(kFullMask, fail, 0)) {
            failed = true;
            break;
          }
        }
      }
    }

    // (d) Publish it once the cross-op gate opens (rule 2).
    if (have) {
      const ControlShared::Slot& staged = cs.slot[nextPub % kPrefetch];
      // Rule 2 on every rank's progress; the fence (kOpFence) on this stream's completion: the previous op
      // no longer touches this rank's user memory, and peers' steps on it wait for entry (rule 3).
      // A fenced op whose previous op is not complete yet is published anyway (the workers pick it up and
      // wait for `complete` themselves, off the critical path), unless another op's entry is still pending.
      const bool fenced = (staged.flags & kOpFence) != 0;
      const bool early = fenced && !seqGeq(lastComplete, nextPub);
      const uint32_t need = nextPub - 1;
      if (seqGeq(lastGlobal, nextPub - 1) && !enterPending) {
        const uint32_t sl = nextPub % kSlots;
        OpBoard* b = &st->board[sl];
        const uint32_t nb = staged.nBindings;
        // The program must be this rank's: the descriptor's check word guards against corruption, not against a
        // host that names the wrong memory. Checked on the header's first line, which the lines below read anyway.
        const auto* ph = reinterpret_cast<const ProgramHeader*>(staged.program);
        uint32_t badHeader = 0;
        if (lid == 0 && (ph->magic != kProgramMagic || ph->rank != h.rank || ph->nRanks != h.nRanks ||
                         ph->nWorkers != h.nWorkers)) {
          reportFailure(h,
                        PollSite{Status::BadDescriptor, nextPub, 0xFFFFFFFFu, 0xFFFFFFFFu,
                                 static_cast<uint32_t>(DescriptorFault::ProgramHeader), kProgramMagic},
                        ph->magic, 0);
          badHeader = 1;
        }
        if (__shfl_sync(kFullMask, badHeader, 0)) {
          failed = true;
          break;
        }
        for (uint32_t i = lid; i < nb; i += 32) b->table[i] = staged.table[i];
        if (lid == 0) {
          b->program = staged.program;
          b->nBindings = nb;
          b->op = nextPub;
          b->waitComplete = early ? nextPub : kNoCompleteWait;
          cZero[sl][0] = ph->nFlags;
          cZero[sl][1] = ph->nBarriers;
          cZero[sl][2] = ph->nSyncPoints;
          cLocal[sl] = ph->flags & kProgLocalCompletion;
        }
        // Every lane is done reading the slot (lane 0 in the block above): each releases it.
        mbarArrive(&cs.empty[nextPub % kPrefetch]);
        __syncwarp();
        if (lid == 0) {
          h.stamps[nextPub % ringSlots].publishNs = globalTimerNs();
          // One fence: acquire of the doorbell (the caller's input, written before it, becomes visible to
          // this rank and, through the stores below, to peers that read it) and release of the board.
          fenceSys();
          storeRelaxedGpu(&st->published, nextPub + 1);
          if (!early) announceEntry(h, nextPub);
        }
        if (early) {
          enterPending = true;
          enterOp = nextPub;
        }
        ++nextPub;
        have = false;
        gateSince = 0;
      } else {
        uint32_t fail = 0;
        if (lid == 0) {
          const uint64_t now = globalTimerNs();
          if (gateSince == 0) {
            gateSince = now;
          } else if (now - gateSince > h.pollBudgetNs) {
            uint32_t lag = 0, seen = 0;
            for (uint32_t q = 0; q < h.nRanks; ++q) {
              const uint32_t d = loadVolatile(&st->doneFrom[q]);
              if (!seqGeq(d, need)) {
                lag = q;
                seen = d;
                break;
              }
            }
            reportFailure(h, PollSite{Status::GateTimeout, nextPub, 0xFFFFFFFFu, 0xFFFFFFFFu, lag, need}, seen,
                          now - gateSince);
            fail = 1;
          }
        }
        if (__shfl_sync(kFullMask, fail, 0)) {
          failed = true;
          break;
        }
      }
    }
  }

  if (lid == 0) {
    storeRelease(&st->stop, 1u);
    if (failed) storeRelease(&st->abort, 1u);
    // An aborted group releases every stream wait the host may have enqueued (GEQ compares cyclically,
    // so anything up to 2^30 ops ahead counts as reached); the host reports the failure instead.
    if (failed) storeRelease(&st->complete, lastComplete + (1u << 30));
    mbarArrive(&cs.done);  // the host-link warp mirrors the final `complete`, then reports the exit
  }
}

/// The control block's warps from the third on, when the communicator spans nodes: apply the inbox (what ranks of
/// other nodes sent: bytes to copy into this GPU, flag increments, their done / entered counts) in order, until the
/// control warp left.
__device__ void inboxWarps(const EngineDeviceHandle& h, ControlShared& cs) {
  __shared__ InboxRecord sRecord;
  __shared__ int sQuit;
  const uint32_t nThreads = blockDim.x - 64, tid = threadIdx.x - 64;
  uint64_t pos = 0;
  for (;;) {
    drainInbox(h, &pos, nThreads, tid, &sRecord);
    if (tid == 0) sQuit = mbarDone(&cs.done, 0) ? 1 : 0;
    asm volatile("bar.sync 1, %0;" ::"r"(nThreads) : "memory");
    const int quit = sQuit;
    asm volatile("bar.sync 1, %0;" ::"r"(nThreads) : "memory");
    if (quit) return;
  }
}

/// Block 0 of either resident kernel: warp 0 drives ops, warp 1 talks to the host, the rest leave.
__device__ __forceinline__ void controlBlock(const EngineDeviceHandle& h) {
  __shared__ ControlShared cs;
  if (threadIdx.x == 0) {
    for (uint32_t s = 0; s < kPrefetch; ++s) {
      mbarInit(&cs.full[s], 32);
      mbarInit(&cs.empty[s], 32);
    }
    mbarInit(&cs.hostShutdown, 1);
    mbarInit(&cs.done, 1);
  }
  __syncthreads();
  if (threadIdx.x < 32)
    controlWarp(h, cs);
  else if (threadIdx.x < 64)
    hostLinkWarp(h, cs);
  else if (h.inbox != nullptr)
    inboxWarps(h, cs);
}

template <bool kTrace>
__global__ void __launch_bounds__(runtime::kMaxThreadsPerCta, 1) residentKernel(const EngineDeviceHandle h) {
  if (threadIdx.x == 0) atomicAdd(&h.state->started, 1u);
  if (blockIdx.x == 0) return controlBlock(h);
  workerLoop<kTrace, false>(h, blockIdx.x - 1);
}

// ---- compute lanes: the compute-capable instantiation (CommConfig::computeLanes) -----------------------
// 384 threads (the GEMM engine's producer + 2 consumer warpgroups), launched with exactly 168 registers per
// thread (setmaxnreg moves them inside a Gemm step and gives them back after it), kComputeSmemBytes of
// dynamic shared memory: one CTA per SM.
template <bool kTrace>
__global__ void __launch_bounds__(kComputeThreads, 1) residentComputeKernel(const EngineDeviceHandle h) {
  if (threadIdx.x == 0) atomicAdd(&h.state->started, 1u);
  if (blockIdx.x == 0) return controlBlock(h);
  workerLoop<kTrace, true>(h, blockIdx.x - 1);
}

}  // namespace
}  // namespace mk::device

namespace mk::runtime {

int residentBlocksPerSm(bool trace, int threads) {
  int blocks = 0;
  const cudaError_t err = trace ? cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, device::residentKernel<true>,
                                                                                threads, device::kCombineSmemBytes)
                                : cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, device::residentKernel<false>,
                                                                                threads, device::kCombineSmemBytes);
  return err == cudaSuccess ? blocks : -1;
}

cudaError_t preloadKernels() {
  cudaFuncAttributes attr{};
  cudaError_t e = cudaFuncGetAttributes(&attr, device::residentKernel<true>);
  if (e == cudaSuccess) e = cudaFuncGetAttributes(&attr, device::residentKernel<false>);
  if (e == cudaSuccess) e = preloadHelperKernels();
  if (e == cudaSuccess) e = cudaFuncGetAttributes(&attr, device::residentComputeKernel<true>);  // compute lanes
  if (e == cudaSuccess) e = cudaFuncGetAttributes(&attr, device::residentComputeKernel<false>);
  return e;
}

cudaError_t launchResident(const device::EngineDeviceHandle& h, bool trace, int threads, cudaStream_t stream) {
  const dim3 grid(h.nWorkers + 1), block(static_cast<unsigned>(threads));
  // Dynamic shared memory: a Combine step's counts and positions (the only step of this kernel that uses it).
  if (trace)
    device::residentKernel<true><<<grid, block, device::kCombineSmemBytes, stream>>>(h);
  else
    device::residentKernel<false><<<grid, block, device::kCombineSmemBytes, stream>>>(h);
  return cudaGetLastError();
}

// ---- compute lanes ----
int residentComputeBlocksPerSm(bool trace) {
  if (prepareResidentCompute() != cudaSuccess) return -1;
  int blocks = 0;
  const int threads = static_cast<int>(device::kComputeThreads);
  const size_t smem = device::kComputeSmemBytes;
  const cudaError_t err =
      trace
          ? cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, device::residentComputeKernel<true>, threads, smem)
          : cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, device::residentComputeKernel<false>, threads, smem);
  return err == cudaSuccess ? blocks : -1;
}

cudaError_t prepareResidentCompute() {
  const int smem = static_cast<int>(device::kComputeSmemBytes);
  cudaError_t e =
      cudaFuncSetAttribute(device::residentComputeKernel<true>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (e == cudaSuccess)
    e = cudaFuncSetAttribute(device::residentComputeKernel<false>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  return e;
}

cudaError_t launchResidentCompute(const device::EngineDeviceHandle& h, bool trace, cudaStream_t stream) {
  const cudaError_t e = prepareResidentCompute();
  if (e != cudaSuccess) return e;
  const dim3 grid(h.nWorkers + 1), block(device::kComputeThreads);
  if (trace)
    device::residentComputeKernel<true><<<grid, block, device::kComputeSmemBytes, stream>>>(h);
  else
    device::residentComputeKernel<false><<<grid, block, device::kComputeSmemBytes, stream>>>(h);
  return cudaGetLastError();
}

}  // namespace mk::runtime
