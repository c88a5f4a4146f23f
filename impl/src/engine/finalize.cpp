// mkernel — an op's descriptor: once every rank submitted op `seq`, its slot of the descriptor ring gets each
// rank's program and bound addresses (and the compute lanes' parameter blocks), the fence bit of the ordering
// rule, the check word over all of it, and `seq` last.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <utility>
#include <vector>

#include "engine/engine.hpp"
#include "engine/host_sync.hpp"
#include "engine/internode.hpp"
#include "gemm/gemm_lane.hpp"
#include "mk/device/compute_lane_device.hpp"

namespace mk::runtime {

void EngineSubmission::finalizeLocked(uint32_t seq, const CachedSchedule& cs, const std::vector<uint64_t>& input,
                                      const std::vector<uint64_t>& output, const std::vector<uint64_t>& scratch,
                                      bool fence, const std::vector<std::vector<uint64_t>>& bind) {
  // The descriptor slot's previous op must have been taken by every local rank's kernel.
  if (seq >= ctx_.ringSlots) {
    const uint32_t need = seq - ctx_.ringSlots + 1;
    const bool ok = hostPoll(ctx_.config.hostBudgetMs, [&] {
      if (loadHost(&ctx_.status->abort) != 0) return true;
      for (const int q : ctx_.local)
        if (!seqGeq(ctx_.fetched(q), need)) return false;
      return true;
    });
    if (!ok)
      failures_.poisonAndThrow(ErrorCode::Timeout, "descriptor ring slot " + std::to_string(seq % ctx_.ringSlots) +
                                                       " for op " + std::to_string(seq) + " stayed busy for " +
                                                       fmtMs(ctx_.config.hostBudgetMs));
    failures_.throwIfFailedLocked();
  }
  const uint32_t nB = static_cast<uint32_t>(cs.schedule.buffers.size());
  // Built here, then copied into the ring in one go: the check word is computed without reading host-mapped memory
  // back, and the ring sees one streaming write. Unused entries are 0.
  device::OpDescriptor d{};
  d.nBindings = static_cast<uint32_t>(ctx_.ranks.size()) * nB;
  d.flags = fence ? device::kOpFence : 0u;
  for (uint32_t q = 0; q < ctx_.ranks.size(); ++q) {
    d.program[q] = reinterpret_cast<uint64_t>(cs.devicePrograms[q]);  // kernels read only their own entry
    for (uint32_t b = 0; b < nB; ++b) {
      const BufferLayout& L = cs.programs[q].buffers[b];
      uint64_t addr = 0;
      switch (L.kind) {
        case BufferKind::Input: addr = input[q]; break;
        case BufferKind::Output:
        case BufferKind::InOut: addr = output[q]; break;
        case BufferKind::Scratch: addr = scratch[q] ? scratch[q] + L.scratchOffset : 0; break;  // 0: another node
      }
      if (q < bind.size() && b < bind[q].size() && bind[q][b] != 0) addr = bind[q][b];
      d.table[q * nB + b] = addr;
    }
  }
  // ---- compute lanes: each local rank's Gemm and Attention steps get the parameter block (tensor maps) of this
  // op's addresses, after the schedule's bindings (table[nRanks * nB + rank]; gemm_lane.hpp).
  bool gemms = false;
  for (uint32_t q = 0; q < ctx_.ranks.size(); ++q) gemms = gemms || computeStepCount(cs.programs[q]) > 0;
  if (gemms) {
    const uint32_t n = static_cast<uint32_t>(ctx_.ranks.size());
    for (uint32_t q = 0; q < n; ++q) d.table[device::gemmParamsBinding(n, nB, q)] = 0;
    for (const int lq : ctx_.local) {
      const auto q = static_cast<uint32_t>(lq);
      if (computeStepCount(cs.programs[q]) == 0) continue;
      GemmLaneBinder& binder =
          gemmLaneBinder(&engine_, q, ctx_.ranks[q].device, static_cast<uint64_t>(ctx_.config.pollBudgetMs * 1e6),
                         ctx_.ranks[q].arena.get());
      d.table[device::gemmParamsBinding(n, nB, q)] =
          binder.bind(cs.programs[q], cs.devicePrograms[q], d.table, seq, ctx_.completed(lq), ctx_.ranks[q].copyStream);
    }
    d.nBindings = n * nB + n;
  }
  // ---- runtime extents: each rank's extent words (the entry after the schedule's buffers in its `bind`; null: every
  // extent at its bound), at the index its program was lowered with (extentWordsBinding). Only the rank itself reads
  // its entry, so the ranks of other processes leave theirs 0.
  for (uint32_t q = 0; q < ctx_.ranks.size(); ++q) {
    const uint32_t at = cs.programs[q].header().extentsBinding;
    if (at == device::kNoExtentWord) continue;
    d.table[at] = q < bind.size() && bind[q].size() > nB ? bind[q][nB] : 0;
    d.nBindings = std::max(d.nBindings, at + 1);
  }
  opSchedule_[seq % ctx_.ringSlots] = &cs;
  // Several nodes: the proxy learns this op's addresses (and applies what arrived for it early) before the kernel
  // can start it.
  if (interNode_)
    for (const int lq : ctx_.local) interNode_->bind(static_cast<uint32_t>(lq), seq, cs, d.table);
  d.check = device::descriptorCheck(d, seq + 1);
  if (injectFault_ != device::DescriptorFault{}) applyInjectedFaultLocked(d, seq);
  device::OpDescriptor& slot = ctx_.ring[seq % ctx_.ringSlots];
  static_assert(offsetof(device::OpDescriptor, seq) == 0 && sizeof(d.seq) == 4, "seq leads the descriptor");
  std::memcpy(reinterpret_cast<char*>(&slot) + sizeof(d.seq), reinterpret_cast<const char*>(&d) + sizeof(d.seq),
              sizeof d - sizeof(d.seq));
  storeHost(&slot.seq, seq + 1);  // last, with release: the kernel reads seq first (acquire)
  if (ctx_.link) storeHost(&ctx_.link->header().finalized[ctx_.me], seq + 1);  // this rank's post slot may be reused
}

bool EngineSubmission::touchesPreviousLocked(PendingOp& op) {
  // Rule 2 of resident_kernel.cu: an op that touches user memory the previous op touched (and one of the
  // two writes it) starts only after the previous op completed everywhere.
  auto hit = [](const std::vector<std::pair<uintptr_t, uintptr_t>>& x,
                const std::vector<std::pair<uintptr_t, uintptr_t>>& y) {
    for (const auto& a : x)
      for (const auto& b : y)
        if (a.first < b.second && b.first < a.second) return true;
    return false;
  };
  const bool fence = hit(op.writes, prevWrites_) || hit(op.writes, prevReads_) || hit(op.reads, prevWrites_);
  prevReads_ = std::move(op.reads);
  prevWrites_ = std::move(op.writes);
  return fence;
}

void EngineSubmission::finalizeLocalLocked(uint32_t seq, PendingOp& op) {
  const bool fence = touchesPreviousLocked(op);
  const uint32_t slot = seq % device::kSlots;
  const size_t n = ctx_.ranks.size();
  std::vector<uint64_t> in(n), out(n), scratch(n);
  for (size_t q = 0; q < n; ++q) {
    in[q] = reinterpret_cast<uint64_t>(op.input[q]);
    out[q] = reinterpret_cast<uint64_t>(op.output[q]);
    scratch[q] = reinterpret_cast<uint64_t>(ctx_.ranks[q].scratch[slot]);
  }
  finalizeLocked(seq, *op.sched, in, out, scratch, fence, op.bind);
}

}  // namespace mk::runtime
