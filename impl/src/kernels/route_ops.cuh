// mkernel — internal to the resident kernel: the MoE routing steps, Route (a router's expert ids into a layout of
// counts and token lists), Gather (rows picked by an index list) and Combine (the weighted sum of the expert rows
// that came back), with the CPU executor's rules
// (models/src/exec/route_exec.cpp, mk/schedule/route.hpp): the same layout to the last entry, the same refusals.
// Included by resident_kernel.cu only.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "mk/device/engine_device.hpp"
#include "mk/device/poll_device.hpp"

namespace mk::device {
namespace {

/// Route, run by one CTA (the lowering gives the step one): ids (int32, tokens x topk) into the layout at `layout`:
/// experts counts, then experts lists of `capacity` int32 entries (each list's tokens in ascending order, once per id
/// naming the expert; entries past the count -1). An id outside [0, experts) or a list over its capacity fails the op
/// (Status::BadIndex / Status::RouteOverflow, flag: the entry or the expert) before any list entry is written; the
/// counts are the first thing written either way.
///
/// Order: warp 0 walks the ids in row-major order 32 at a time; lanes naming the same expert get consecutive places
/// (__match_any_sync, ranked by lane), the expert's count in the layout is the running total. Every other thread
/// clears the lists meanwhile (two passes: counts and the capacity check, then the lists). Returns false after a
/// reported failure (the same value in every thread).
__device__ __noinline__ bool routeExperts(const EngineDeviceHandle& h, const PollSite& site, const int32_t* ids,
                                          int32_t* layout, uint64_t entries, uint32_t topk, uint32_t experts,
                                          uint32_t capacity, uint32_t tid, uint32_t nth) {
  __shared__ int sBad;
  if (tid == 0) sBad = 0;
  __syncthreads();
  // Pass 0: every id in range (any thread may find one out of range: the first entry of each is reported).
  for (uint64_t i = tid; i < entries; i += nth) {
    const int32_t id = ids[i];
    if ((id < 0 || static_cast<uint32_t>(id) >= experts) && atomicCAS(&sBad, 0, 1) == 0) {
      PollSite at = site;
      at.code = Status::BadIndex;
      at.flag = static_cast<uint32_t>(i);
      at.expected = experts;
      reportFailure(h, at, static_cast<uint64_t>(static_cast<int64_t>(id)), 0);
    }
  }
  for (uint32_t e = tid; e < experts; e += nth) layout[e] = 0;
  __syncthreads();
  if (sBad) return false;
  const uint32_t lane = tid % 32;
  const unsigned lower = (1u << lane) - 1u;
  // Pass 1 (warp 0): counts, in the layout's count words.
  if (tid < 32) {
    for (uint64_t base = 0; base < entries; base += 32) {
      const uint64_t i = base + lane;
      const unsigned live = __ballot_sync(0xFFFFFFFFu, i < entries);
      if (i < entries) {
        const int32_t e = ids[i];
        const unsigned same = __match_any_sync(live, e);
        if ((same & lower) == 0) layout[e] += __popc(same);
      }
      __syncwarp();
    }
  }
  __syncthreads();
  for (uint32_t e = tid; e < experts; e += nth)
    if (static_cast<uint32_t>(layout[e]) > capacity && atomicCAS(&sBad, 0, 1) == 0) {
      PollSite at = site;
      at.code = Status::RouteOverflow;
      at.flag = e;
      at.expected = capacity;
      reportFailure(h, at, static_cast<uint64_t>(layout[e]), 0);
    }
  int32_t* lists = layout + experts;
  const uint64_t listEntries = uint64_t{experts} * capacity;
  for (uint64_t i = tid; i < listEntries; i += nth) lists[i] = -1;
  __syncthreads();
  if (sBad) return false;
  // Pass 2 (warp 0): the lists, counting again from zero (running totals in the count words).
  for (uint32_t e = tid; e < experts; e += nth) layout[e] = 0;
  __syncthreads();
  if (tid < 32) {
    for (uint64_t base = 0; base < entries; base += 32) {
      const uint64_t i = base + lane;
      const unsigned live = __ballot_sync(0xFFFFFFFFu, i < entries);
      int32_t e = 0;
      unsigned same = 0;
      int32_t first = 0;
      if (i < entries) {
        e = ids[i];
        same = __match_any_sync(live, e);
        const uint32_t leader = __ffs(same) - 1;
        if (lane == leader) first = layout[e];
        first = __shfl_sync(same, first, leader);
        lists[uint64_t{static_cast<uint32_t>(e)} * capacity + first + __popc(same & lower)] =
            static_cast<int32_t>(i / topk);
      }
      __syncwarp();
      if (i < entries && (same & lower) == 0) layout[e] = first + __popc(same);
      __syncwarp();
    }
  }
  __syncthreads();
  return true;
}

/// Gather rows [b, e) of a step: dst row r <- src row index[r], `rowBytes` each. An index outside [0, sourceRows)
/// fails the op (Status::BadIndex, flag: the row) and that row is not written. 16-byte copies where every row and
/// both bases are 16-byte aligned, 4-byte or byte copies otherwise; one warp per row. Returns false after a reported
/// failure (this CTA).
__device__ __noinline__ bool gatherRows(const EngineDeviceHandle& h, const PollSite& site, char* dst, const char* src,
                                        const int32_t* index, uint64_t b, uint64_t e, uint64_t rowBytes,
                                        uint64_t sourceRows, uint32_t tid, uint32_t nth) {
  __shared__ int sBad;
  if (tid == 0) sBad = 0;
  __syncthreads();
  const uint32_t warp = tid / 32, lane = tid % 32, warps = nth / 32;
  const uintptr_t align = reinterpret_cast<uintptr_t>(dst) | reinterpret_cast<uintptr_t>(src) | rowBytes;
  for (uint64_t r = b + warp; r < e; r += warps) {
    const int32_t at = index[r];
    if (at < 0 || static_cast<uint64_t>(at) >= sourceRows) {
      if (lane == 0 && atomicCAS(&sBad, 0, 1) == 0) {
        PollSite s = site;
        s.code = Status::BadIndex;
        s.flag = static_cast<uint32_t>(r);
        s.expected = sourceRows;
        reportFailure(h, s, static_cast<uint64_t>(static_cast<int64_t>(at)), 0);
      }
      continue;
    }
    char* d = dst + r * rowBytes;
    const char* sp = src + static_cast<uint64_t>(at) * rowBytes;
    if (align % 16 == 0) {
      for (uint64_t o = uint64_t{lane} * 16; o < rowBytes; o += 32 * 16)
        *reinterpret_cast<uint4*>(d + o) = *reinterpret_cast<const uint4*>(sp + o);
    } else if (align % 4 == 0) {
      for (uint64_t o = uint64_t{lane} * 4; o < rowBytes; o += 32 * 4)
        *reinterpret_cast<uint32_t*>(d + o) = *reinterpret_cast<const uint32_t*>(sp + o);
    } else {
      for (uint64_t o = lane; o < rowBytes; o += 32) d[o] = sp[o];
    }
  }
  __syncthreads();
  return sBad == 0;
}

/// Combine tokens [tb, te) of a Combine step with lists per expert (mk/schedule/route.hpp, CombineShape; the CPU
/// executor's runCombine): dst row t = sum over k of w[t][k] x row p(t, k) of expert ids[t][k]'s block in `a` (after
/// the T x topk weights; block j holds `tokens` rows), p(t, k) the number of slots before (t, k), in row-major order
/// of the ids, naming the same expert. Summed in double (each product of two floats exact) and rounded once to
/// float32: bit-exact with the CPU executor. An id outside [0, experts), a position at or past `tokens` or a weight
/// that is not finite fails the op (Status::BadIndex, flag: the slot; expected: the range; seen: the value or, for a
/// weight, its bits). `smem` (the compute kernel's dynamic shared memory, `smemBytes` of it): the per-expert counts
/// of the slots before the chunk, then the chunk's positions. Returns false after a reported failure (this CTA).
__device__ __noinline__ bool combineRows(const EngineDeviceHandle& h, const PollSite& site, float* dst, const float* a,
                                         const int32_t* ids, uint64_t tokens, uint32_t topk, uint32_t experts,
                                         uint32_t row, uint64_t tb, uint64_t te, uint8_t* smem, uint32_t smemBytes,
                                         uint32_t tid, uint32_t nth) {
  __shared__ int sBad;
  if (tid == 0) sBad = 0;
  auto fail = [&](uint64_t slot, uint64_t range, uint64_t seen) {
    if (atomicCAS(&sBad, 0, 1) == 0) {
      PollSite at = site;
      at.code = Status::BadIndex;
      at.flag = static_cast<uint32_t>(slot);
      at.expected = range;
      reportFailure(h, at, seen, 0);
    }
  };
  uint32_t* cnt = reinterpret_cast<uint32_t*>(smem);
  uint32_t* pos = cnt + experts;
  const uint64_t chunkTokens = (smemBytes / 4 - experts) / topk;  // >= 1: the lowering checks the sizes
  for (uint32_t e = tid; e < experts; e += nth) cnt[e] = 0;
  __syncthreads();
  // The slots of every token before this CTA's first: how far into each expert's block this CTA starts.
  for (uint64_t i = tid; i < tb * topk; i += nth) {
    const int32_t id = ids[i];
    if (id < 0 || static_cast<uint32_t>(id) >= experts)
      fail(i, experts, static_cast<uint64_t>(static_cast<int64_t>(id)));
    else
      atomicAdd(&cnt[id], 1u);
  }
  __syncthreads();
  const uint32_t lane = tid % 32;
  const unsigned lower = (1u << lane) - 1u;
  const uint64_t slots = tokens * topk;  // the weights: the blocks start after them
  for (uint64_t cb = tb; cb < te && !sBad; cb += chunkTokens) {
    const uint64_t ce = cb + chunkTokens < te ? cb + chunkTokens : te;
    const uint64_t first = cb * topk, last = ce * topk;
    if (tid < 32) {
      for (uint64_t base = first; base < last; base += 32) {
        const uint64_t i = base + lane;
        const unsigned live = __ballot_sync(0xFFFFFFFFu, i < last);
        if (i < last) {
          const int32_t id = ids[i];
          const bool ok = id >= 0 && static_cast<uint32_t>(id) < experts;
          if (!ok) fail(i, experts, static_cast<uint64_t>(static_cast<int64_t>(id)));
          const int32_t key = ok ? id : -1;
          const unsigned same = __match_any_sync(live, key);
          const uint32_t leader = __ffs(same) - 1;
          uint32_t at = 0;
          if (ok && lane == leader) at = cnt[id];
          at = __shfl_sync(same, at, leader) + __popc(same & lower);
          if (ok) {
            if (at >= tokens) fail(i, tokens, at);
            if (!isfinite(a[i])) fail(i, 0, __float_as_uint(a[i]));
            pos[i - first] = at;
            if (lane == leader) cnt[id] = at + __popc(same);  // the leader's place is its group's first
          }
        }
        __syncwarp();
      }
    }
    __syncthreads();
    if (sBad) break;
    for (uint64_t t = cb; t < ce; ++t)
      for (uint32_t c = tid; c < row; c += nth) {
        double acc = 0.0;
        for (uint32_t k = 0; k < topk; ++k) {
          const uint64_t i = t * topk + k;
          const uint64_t at = slots + (static_cast<uint64_t>(ids[i]) * tokens + pos[i - first]) * row + c;
          acc = __dadd_rn(acc, __dmul_rn(static_cast<double>(a[i]), static_cast<double>(a[at])));
        }
        dst[t * row + c] = static_cast<float>(acc);
      }
    __syncthreads();
  }
  __syncthreads();
  return sBad == 0;
}

}  // namespace
}  // namespace mk::device
