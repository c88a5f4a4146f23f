// mkernel — the resident kernel's worker CTAs: run one lane of an op's lowered program, step by step
// (resident_kernel.cu's control block hands them the op). Included once, by resident_kernel.cu: the kernel and its
// device functions are one translation unit (no relocatable device code).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "data_ops.cuh"
#include "lse_merge.cuh"
#include "mbarrier.cuh"
#include "mk/device/compute_lane_device.hpp"
#include "mk/device/descriptor_device.hpp"
#include "mk/device/engine_device.hpp"
#include "mk/device/packets_device.hpp"
#include "mk/device/poll_device.hpp"
#include "mk/device/proxy_device.hpp"
#include "mk/schedule/types.hpp"
#include "resident_kernel.hpp"
#include "route_ops.cuh"

namespace mk::device {
namespace {

constexpr uint16_t kIdleLane = 0xFFFF;

// runLane dispatches on the packed kind code (StepKind's value). The kinds it has a branch for are exactly the
// table's GPU kinds: a new kind stays refused by the lowering (kindInfo().gpu false) until it gets one here.
constexpr StepKind kKernelKinds[] = {StepKind::Copy,      StepKind::Reduce,      StepKind::Put,   StepKind::ProxyPut,
                                     StepKind::Signal,    StepKind::Wait,        StepKind::Gemm,  StepKind::Barrier,
                                     StepKind::Attention, StepKind::GroupedGemm, StepKind::Route, StepKind::Gather,
                                     StepKind::Combine};
constexpr bool kernelKindsAreGpuKinds() {
  std::size_t gpuKinds = 0;
  for (const StepKindInfo& k : kStepKinds) gpuKinds += k.gpu ? 1 : 0;
  for (StepKind k : kKernelKinds)
    if (!kindInfo(k).gpu) return false;
  return gpuKinds == sizeof(kKernelKinds) / sizeof(kKernelKinds[0]);
}
static_assert(kernelKindsAreGpuKinds(), "the resident kernel runs exactly the step kinds the table marks gpu");
constexpr unsigned kFullMask = 0xFFFFFFFFu;

// ---- worker CTAs --------------------------------------------------------------------------------------

/// Run one lane's steps for op `op`. Returns false when the CTA must stop (abort or timeout), with the
/// same value in every thread. kCompute: the compute-capable instantiation (Gemm, GroupedGemm and Attention steps; 384
/// threads).
/// Forced inline, as workerLoop: with both tile engines in it, nvcc would otherwise outline the lane loop, and a
/// wgmma pipeline inside a called function makes ptxas serialise every wgmma of the kernel (warning C7510).
template <bool kTrace, bool kCompute>
__device__ __forceinline__ bool runLane(const EngineDeviceHandle& h, uint32_t op, const ProgramHeader* ph,
                                        const LoweredLane& lane, const LoweredStep* steps, CtaAssignment me,
                                        const uint64_t* table) {
  __shared__ int sOkBefore, sOkAfter;
  __shared__ uint32_t sProxyWord;
  __shared__ uint64_t sExtentCount;  // elements of the current step when a runtime extent sizes it
  const uint32_t slot = op % kSlots;
  const uint32_t n = lane.ctaCount;
  const uint32_t idx = me.indexInLane;
  const uint32_t tid = threadIdx.x;
  const uint32_t nth = blockDim.x;
  RankState* st = h.state;
  for (uint32_t s = 0; s < lane.nSteps; ++s) {
    const LoweredStep step = steps[s];
    uint64_t t0 = 0;
    if (tid == 0) {
      if (kTrace && idx == 0) t0 = globalTimerNs();
      if (s == 0 && me.lane == 0 && idx == 0) h.stamps[op % h.ringSlots].firstStepNs = globalTimerNs();
      bool ok = true;
      // Rule 3: a peer's user buffer only once that peer entered this op.
      if (step.entryMask != 0) {
        for (uint32_t q = 0; ok && q < h.nRanks; ++q)
          if (step.entryMask & (1u << q))
            ok = MK_POLL(h, seqGeq(loadVolatile(&st->enteredFrom[q]), op + 1),
                         (PollSite{Status::EntryTimeout, op, lane.laneIndex, s, q, op + 1ull}),
                         loadVolatile(&st->enteredFrom[q]));
        fenceSys();
      }
      if (ok && (step.bits & kLsBarrierBefore)) {
        uint32_t* ctr = &st->laneSync[slot][step.barrierSync];
        // Earlier steps may have written a peer's memory that another CTA of the lane reads next.
        fenceSys();
        addReleaseGpu(ctr, 1u);
        ok =
            MK_POLL(h, loadVolatile(ctr) >= n,
                    (PollSite{Status::LaneSyncTimeout, op, lane.laneIndex, s, step.barrierSync, n}), loadVolatile(ctr));
        fenceGpu();
      }
      // A runtime extent: its value is read once, after the step's waits (a future step kind may write the word
      // earlier in this op; the waits' fences acquired it). Volatile: the word changes from op to op at one address.
      if (ok && step.extent != kNoExtentWord) {
        uint64_t value = step.extentBound;
        if (step.extent & kSourcedExtent) {
          // A sourced extent: the int32 an earlier step of this op wrote into the rank's buffer (negative reads as
          // a value above every bound: refused).
          const auto* sources =
              reinterpret_cast<const uint64_t*>(reinterpret_cast<const char*>(ph) + ph->extentSourcesOffset);
          const auto* at =
              reinterpret_cast<const uint32_t*>(operandAddress(table, sources[step.extent & ~kSourcedExtent]));
          const auto v = static_cast<int32_t>(loadVolatile(at));
          value = v < 0 ? ~uint64_t{0} : static_cast<uint64_t>(v);
        } else {
          const auto* words = reinterpret_cast<const uint64_t*>(table[ph->extentsBinding]);
          if (words) value = loadVolatile(words + step.extent);
        }
        if (value > step.extentBound) {
          reportFailure(h, PollSite{Status::BadExtent, op, lane.laneIndex, s, step.extent, step.extentBound}, value, 0);
          ok = false;
        }
        sExtentCount = step.extentUnit * value;
      }
      sOkBefore = ok;
    }
    __syncthreads();
    if (!sOkBefore) return false;
    const uint64_t count = step.extent == kNoExtentWord ? step.count : sExtentCount;

    const int kind = step.kind;
    if (kind == static_cast<int>(StepKind::Copy) || kind == static_cast<int>(StepKind::Put)) {
      if (idx < step.activeCtas) {
        uint64_t b, e;
        ctaPiece(count, step.activeCtas, idx, &b, &e);
        const uint32_t es = dtypeBytes(step.dtype);
        if (step.bits & kLsPacket)  // LL packets into the receiver's area (mk/device/packets_device.hpp)
          sendPackets(&h.peers[step.flagRank]->packets[slot][0][0] + step.value / 4, operandAddress(table, step.a),
                      step.count * es, b * es, e * es, op + 1, tid, nth);
        else
          copyRange(operandAddress(table, step.dst) + b * es, operandAddress(table, step.a) + b * es, (e - b) * es, tid,
                    nth);
      }
    } else if (kind == static_cast<int>(StepKind::Wait) && (step.bits & kLsPacket)) {
      // The packets of the LL Puts this Wait stands for: poll them and unpack them (no flag to wait on).
      const bool ok =
          idx >= step.activeCtas ||
          recvPacketRuns(h, ph, step, table, op,
                         PollSite{Status::WaitTimeout, op, lane.laneIndex, s, step.flagId, op + 1ull}, idx, tid, nth);
      if (__syncthreads_or(!ok)) return false;
    } else if (kind == static_cast<int>(StepKind::Reduce) && step.redop == static_cast<int>(RedOp::LseMerge)) {
      // Rows of extentUnit values and their log-sum-exp, split by whole rows (the lowering's rule).
      if (idx < step.activeCtas) {
        uint64_t b, e;
        ctaPiece(count / (step.extentUnit + 1), step.activeCtas, idx, &b, &e);
        lseMergeRowRange(reinterpret_cast<float*>(operandAddress(table, step.dst)),
                         reinterpret_cast<const float*>(operandAddress(table, step.a)),
                         reinterpret_cast<const float*>(operandAddress(table, step.b)),
                         static_cast<uint32_t>(step.extentUnit), b, e, tid, nth);
      }
    } else if (kind == static_cast<int>(StepKind::Route)) {
      // One CTA (the lowering's rule); a bad id or an overflowing list fails the op here.
      if (idx < step.activeCtas && !routeExperts(h, PollSite{Status::BadIndex, op, lane.laneIndex, s, 0, 0},
                                                 reinterpret_cast<const int32_t*>(operandAddress(table, step.a)),
                                                 reinterpret_cast<int32_t*>(operandAddress(table, step.dst)), count,
                                                 step.flagId, static_cast<uint32_t>(step.value & 0xFFFFFFFFu),
                                                 static_cast<uint32_t>(step.value >> 32), tid, nth))
        return false;
    } else if (kind == static_cast<int>(StepKind::Gather)) {
      if (idx < step.activeCtas) {
        uint64_t b, e;
        ctaPiece(count / step.flagId, step.activeCtas, idx, &b, &e);
        const uint64_t rowBytes = uint64_t{step.flagId} * dtypeBytes(step.dtype);
        if (!gatherRows(h, PollSite{Status::BadIndex, op, lane.laneIndex, s, 0, 0}, operandAddress(table, step.dst),
                        operandAddress(table, step.a), reinterpret_cast<const int32_t*>(operandAddress(table, step.b)),
                        b, e, rowBytes, step.value, tid, nth))
          return false;
      }
    } else if (kind == static_cast<int>(StepKind::Combine)) {
      // Whole tokens per CTA; the counts and positions live in the kernel's dynamic shared memory (both kernels have
      // at least kCombineSmemBytes of it).
      {
        if (idx < step.activeCtas) {
          const uint32_t row = static_cast<uint32_t>(step.value >> 32);
          uint64_t b, e;
          ctaPiece(count / row, step.activeCtas, idx, &b, &e);
          if (!combineRows(h, PollSite{Status::BadIndex, op, lane.laneIndex, s, 0, 0},
                           reinterpret_cast<float*>(operandAddress(table, step.dst)),
                           reinterpret_cast<const float*>(operandAddress(table, step.a)),
                           reinterpret_cast<const int32_t*>(operandAddress(table, step.b)), step.flagRank, step.flagId,
                           static_cast<uint32_t>(step.value & 0xFFFFFFFFu), row, b, e, mkComputeLaneSmem,
                           kCombineSmemBytes, tid, nth))
            return false;
        }
      }
    } else if (kind == static_cast<int>(StepKind::Reduce)) {
      if (idx < step.activeCtas) {
        uint64_t b, e;
        ctaPiece(count, step.activeCtas, idx, &b, &e);
        const uint32_t es = dtypeBytes(step.dtype);
        reduceDispatch(step.dtype, step.redop, operandAddress(table, step.dst) + b * es,
                       operandAddress(table, step.a) + b * es, operandAddress(table, step.b) + b * es, e - b, tid, nth);
      }
    }
    // ---- compute lanes (mk/device/compute_lane_device.hpp): only in the compute-capable instantiation ----
    // A ProxyPut: the lane's first CTA stages its bytes in host memory chunk by chunk and pushes a command per chunk
    // to the proxy (the lowering gives it one active CTA and orders the lane's other CTAs around it).
    bool proxyOk = true;
    if (kind == static_cast<int>(StepKind::ProxyPut) && idx == 0)
      proxyOk = proxyPutStep(h, step, operandAddress(table, step.a), step.count * dtypeBytes(step.dtype), op,
                             lane.laneIndex, s, &sProxyWord);
    if constexpr (kCompute) {
      if (kind == static_cast<int>(StepKind::Gemm)) runGemmStep(step, ph, table, h.rank, idx);
      if (kind == static_cast<int>(StepKind::Attention)) runAttentionStep(step, ph, table, h.rank, op, idx);
      if (kind == static_cast<int>(StepKind::GroupedGemm)) runGroupedGemmStep(step, ph, table, h.rank, idx);
    }

    const bool arrives = (step.bits & kLsSignal) || kind == static_cast<int>(StepKind::Barrier);
    if (arrives || (kind == static_cast<int>(StepKind::Wait) && !(step.bits & kLsPacket))) {
      if (arrives) __syncthreads();  // every thread's data of this CTA is written before thread 0 publishes it
      if (tid == 0) {
        bool ok = true;
        if (arrives) {
          bool last = true;
          // One system fence per signal. In a lane of several CTAs each CTA releases its data (possibly in a
          // peer's memory) at GPU scope to the CTA that completes the count; that CTA's system fence below is
          // cumulative over the data its arrival acquired, so it alone pays the system scope, then signals for
          // the whole lane.
          if (n > 1) {
            fenceGpu();
            last = fetchAddAcqRelGpu(&st->laneSync[slot][step.arriveSync], 1u) + 1u == n;
          }
          // The increments below are relaxed: the system fence just above them orders the data before them. A
          // fence plus a relaxed store is the cheaper release (mk-probe-latency: NVLink round trip 1.3 us that
          // way, 2.4 us with st.release.sys).
          if (last) {
            fenceSys();
            if (kind == static_cast<int>(StepKind::Barrier)) {
              for (uint32_t q = 0; q < h.nRanks; ++q)  // Barrier steps span one node (the lowering's rule)
                if (h.localMask & (1u << q)) addRelaxed(&h.peers[q]->barriers[slot][step.flagId], 1u);
            } else if (step.flagRank == h.rank) {
              addRelaxedGpu(&st->flags[slot][step.flagId], step.value);  // a lane of this GPU waits on it
            } else {
              addRelaxed(&h.peers[step.flagRank]->flags[slot][step.flagId], step.value);
            }
          }
          if (kind == static_cast<int>(StepKind::Barrier)) {
            uint32_t* ctr = &st->barriers[slot][step.flagId];
            ok = MK_POLL(h, loadVolatile(ctr) >= h.nRanks,
                         (PollSite{Status::BarrierTimeout, op, lane.laneIndex, s, step.flagId, h.nRanks}),
                         loadVolatile(ctr));
            fenceSys();
          }
        } else {
          const uint64_t* flag = &st->flags[slot][step.flagId];
          ok = MK_POLL(h, loadVolatile(flag) >= step.value,
                       (PollSite{Status::WaitTimeout, op, lane.laneIndex, s, step.flagId, step.value}),
                       loadVolatile(flag));
          fenceSys();  // the flag may come from another GPU: acquire its data once, not on every spin
        }
        sOkAfter = ok;
      }
    } else if (tid == 0) {
      sOkAfter = proxyOk ? 1 : 0;
    }
    __syncthreads();
    if (!sOkAfter) return false;
    if (kTrace && tid == 0 && idx == 0) {
      const uint32_t at = atomicAdd(&st->traceCount, 1u);
      if (at < h.traceCapacity) {
        TraceRecord r;
        r.op = op;
        r.lane = lane.laneIndex;
        r.kind = step.kind;
        r.step = s;
        r.reserved = h.rank;
        r.startNs = t0;
        r.endNs = globalTimerNs();
        h.trace[at] = r;
      }
    }
  }
  return true;
}

template <bool kTrace, bool kCompute>
__device__ __forceinline__ void workerLoop(const EngineDeviceHandle& h, uint32_t worker) {
  __shared__ uint64_t sTable[kMaxBindings];
  __shared__ uint64_t sProgram;
  __shared__ uint32_t sBindings;
  __shared__ uint32_t sWaitFor;   // OpBoard::waitComplete of the op being picked up
  __shared__ int sStop;           // shutdown or abort while waiting for an op
  __shared__ uint32_t sGateStop;  // the wait for the previous op's completion failed (reported)
  RankState* st = h.state;
  const uint32_t tid = threadIdx.x;
  uint64_t cachedProgram = 0;
  CtaAssignment me{kIdleLane, 0};
  LoweredLane lane{};
  const LoweredStep* steps = nullptr;
  for (uint32_t op = 0;; ++op) {
    if (tid == 0) {
      // Idle until the control warp publishes op: not a bounded wait (no op may come for minutes), but
      // it ends on abort or shutdown.
      int stop = 0;
      for (uint32_t spins = 1;; ++spins) {
        if (seqGeq(loadVolatile(&st->published), op + 1)) break;
        if ((spins & 63u) == 0u && (loadVolatile(&st->stop) != 0u || aborted(h))) {
          stop = 1;
          break;
        }
      }
      fenceGpu();  // the board was written by this GPU's control warp before it bumped `published`
      sStop = stop;
      if (!stop) {
        const OpBoard* board = &st->board[op % kSlots];
        sProgram = __ldcg(&board->program);
        sBindings = __ldcg(&board->nBindings);
        sWaitFor = __ldcg(&board->waitComplete);
      }
    }
    __syncthreads();
    if (sStop) return;
    const OpBoard* board = &st->board[op % kSlots];
    for (uint32_t i = tid; i < sBindings; i += blockDim.x) sTable[i] = __ldcg(&board->table[i]);
    // Published early (fenced on the previous op): start only once that op is complete for this rank. The table
    // above is read while the previous op still runs; only the op's steps wait.
    if (tid == 0) {
      uint32_t stop = 0;
      if (sWaitFor != kNoCompleteWait) {
        stop = MK_POLL(h, seqGeq(loadVolatile(&st->complete), sWaitFor),
                       (PollSite{Status::GateTimeout, op, 0xFFFFFFFFu, 0xFFFFFFFFu, h.rank, sWaitFor}),
                       loadVolatile(&st->complete))
                   ? 0u
                   : 1u;
        fenceGpu();  // acquire: the control warp released `complete` after acquiring every writer's data
      }
      sGateStop = stop;
    }
    __syncthreads();
    if (sGateStop) return;
    // What this CTA runs in a program (its assignment, lane record and first step) is decoded once per
    // program: programs are immutable and their memory is freed only after the kernel stopped, so the
    // address identifies the content. Back-to-back ops of one schedule skip three dependent loads.
    if (sProgram != cachedProgram) {
      const auto* ph = reinterpret_cast<const ProgramHeader*>(sProgram);
      const char* base = reinterpret_cast<const char*>(ph);
      me = reinterpret_cast<const CtaAssignment*>(base + ph->ctasOffset)[worker];
      if (me.lane != kIdleLane) {
        lane = reinterpret_cast<const LoweredLane*>(base + ph->lanesOffset)[me.lane];
        steps = reinterpret_cast<const LoweredStep*>(base + ph->stepsOffset) + lane.firstStep;
      }
      cachedProgram = sProgram;
    }
    bool ok = true;
    if (me.lane != kIdleLane)
      ok = runLane<kTrace, kCompute>(h, op, reinterpret_cast<const ProgramHeader*>(sProgram), lane, steps, me, sTable);
    if (!ok) return;
    __syncthreads();
    if (tid == 0) {
      // GPU scope is enough: the control warp acquires this count and announces the rank's done to its peers after
      // a system fence, which is cumulative over this CTA's writes into peers (one system fence per op and rank,
      // not one per CTA on the op's critical path).
      fenceGpu();
      addRelaxedGpu(&st->lanesDone[op % kSlots], 1u);  // ordered by the fence above
    }
  }
}

}  // namespace
}  // namespace mk::device
