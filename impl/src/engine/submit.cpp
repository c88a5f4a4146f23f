// mkernel — op submission: a rank's call of a collective or a custom schedule becomes its part of op `seq`
// (cache key, bound buffers, staged input, the doorbell on its stream); the op's descriptor is written once
// every rank called (finalize.cpp), in one process here, in several through the post board (progress.cpp).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <mutex>
#include <sstream>
#include <string>
#include <vector>

#include "device/driver_api.hpp"
#include "engine/engine.hpp"
#include "engine/host_log.hpp"
#include "engine/host_sync.hpp"
#include "engine/internode.hpp"
#include "gemm/gemm_lane.hpp"
#include "mk/algorithms/policy.hpp"
#include "mk/cuda_check.hpp"
#include "mk/error.hpp"
#include "mk/schedule/pack.hpp"
#include "mk/schedule/validate.hpp"

namespace mk::runtime {

void EngineSubmission::requireCapturable(int r) const {
  // What no op of this communicator could be captured with; what depends on the op is checked by captureLocked.
  if (ctx_.multiNode())
    throw Error(ErrorCode::Unsupported,
                rankName(r) +
                    ": an op was submitted to a stream under CUDA graph capture, but graph capture works on "
                    "one node only (the proxy takes each op from the host). Submit it outside the capture");
}

void EngineSubmission::submitCollective(int r, const CollectiveSpec& specIn, std::optional<Algorithm> algo,
                                        const GenOptions& genIn, const void* send, void* recv, cudaStream_t stream) {
  std::lock_guard<std::mutex> lock(ctx_.mu);
  failures_.throwIfFailedLocked();
  const uint32_t n = static_cast<uint32_t>(ctx_.ranks.size());
  requireCollectiveLayout();
  // The policy decides what the call leaves open (mk/algorithms/policy.hpp): the algorithm ("auto" choices
  // cached per op, count and dtype), chunks and channels given as 0, and the hierarchical inter-node variant
  // under the profile "auto" costs against. The decided request is the cache key.
  const Algorithm chosen = algo ? *algo : chooseAlgorithmLocked(specIn.op, specIn.count, specIn.dtype);
  const CollectivePlan plan = planCollective(specIn, chosen, genIn, ctx_.topology, n, ctx_.profile);
  const CollectiveSpec& spec = plan.spec;
  const GenOptions& gen = plan.gen;
  const uint64_t es = dtypeSize(spec.dtype);
  const uint64_t inBytes = inputCount(spec, n) * es, outBytes = outputCount(spec, n) * es;
  const ScheduleKey key = ScheduleKey::collective(spec, gen);
  auto make = [&] {
    Schedule s = generate(spec, ctx_.topology.layout(n), gen);
    ValidateOptions vo;
    vo.checkRaces = false;  // generators' own tests prove race freedom; this checks the shape we rely on
    validate(s, vo);
    return s;
  };
  std::string what;
  if (cache_.find(key) == cache_.end()) {
    std::ostringstream w;
    w << toString(spec.op) << ' ' << toString(spec.algo) << ' ' << toString(spec.dtype);
    if (spec.op == CollOp::AllReduce || spec.op == CollOp::ReduceScatter) w << ' ' << toString(spec.redop);
    if (spec.op == CollOp::Broadcast) w << " root " << spec.root;
    w << " count " << spec.count << " chunks " << gen.chunks << " channels " << gen.channels;
    what = w.str();
  }
  CachedSchedule& cs = cacheLocked(key, make, what);
  // Broadcast: non-root ranks never read their input; a null send is allowed there.
  submitLocked(r, key, cs, send, recv, send ? inBytes : 0, outBytes, stream);
}

void EngineSubmission::submitSchedule(int r, const Schedule& s, const void* input, void* output, cudaStream_t stream) {
  std::lock_guard<std::mutex> lock(ctx_.mu);
  failures_.throwIfFailedLocked();
  requireSameNodes(s);
  const std::vector<uint8_t> image = pack(s);
  const uint64_t h = fnv1a(image.data(), image.size());  // same schedule, same key
  const ScheduleKey key = ScheduleKey::customImage(h, image.size());
  const std::string what = "custom schedule '" + s.info.op + (s.info.algo.empty() ? "" : " " + s.info.algo) + "'";
  // The user memory the op touches on this rank (every Input buffer is bound to `input`, every Output and
  // InOut one to `output`): the fence rule needs it, or back-to-back custom ops writing the same output
  // could overlap.
  uint64_t inBytes = 0, outBytes = 0;
  for (const BufferDecl& b : s.buffers) {
    const uint64_t bytes = static_cast<uint64_t>(r) < b.count.size() ? b.count[r] * dtypeSize(b.dtype) : 0;
    if (b.kind == BufferKind::Input) inBytes = std::max(inBytes, bytes);
    if (b.kind == BufferKind::Output || b.kind == BufferKind::InOut) outBytes = std::max(outBytes, bytes);
  }
  CachedSchedule& cs = cacheLocked(
      key, [&] { return s; }, what);
  checkComputeOperands(cs.programs[static_cast<size_t>(r)], static_cast<uint32_t>(r), input, output);  // compute lanes
  submitLocked(r, key, cs, input, output, inBytes, outBytes, stream);
}

void EngineSubmission::waitRingSpaceLocked(int r, uint32_t seq) {
  if (seq < ctx_.ringSlots) return;
  const uint32_t need = seq - ctx_.ringSlots + 1;
  // Multi-process: this rank's post slot is free once every rank wrote the descriptor of its old op.
  auto lagging = [&] {
    std::string lag;
    if (ctx_.link)
      for (int q = 0; q < ctx_.size(); ++q)
        if (ctx_.sameNode(q, ctx_.me) && !seqGeq(loadHost(&ctx_.link->header().finalized[q]), need))
          lag += (lag.empty() ? "" : ", ") + std::to_string(q);
    return lag;
  };
  if (seqGeq(ctx_.fetched(r), need) && lagging().empty()) return;
  // Ops not yet submitted by every rank can never be fetched: waiting would deadlock a single thread.
  if (!ctx_.link && !pending_.empty() && !seqGeq(pending_.begin()->first, need)) {
    const PendingOp& p = pending_.begin()->second;
    std::string missing;
    for (size_t q = 0; q < p.called.size(); ++q)
      if (!p.called[q]) missing += (missing.empty() ? "" : ", ") + std::to_string(q);
    throw Error(ErrorCode::InvalidArgument,
                "rank " + std::to_string(r) + " is " + std::to_string(ctx_.ringSlots) + " ops ahead of rank(s) " +
                    missing + ", which have not submitted op " + std::to_string(pending_.begin()->first) +
                    ": submit each op on every rank before the next (loop over ranks inside the loop over ops), or "
                    "raise CommConfig::ringSlots");
  }
  // Back-pressure: block (bounded) until the kernel has taken the slot's previous op.
  if (!hostPoll(ctx_.config.hostBudgetMs, [&] {
        progress_.pumpLocked();
        return (seqGeq(ctx_.fetched(r), need) && lagging().empty()) || loadHost(&ctx_.status->abort) != 0;
      })) {
    const std::string lag = lagging();
    throw Error(ErrorCode::Timeout,
                "doorbell ring of rank " + std::to_string(r) + " stayed full for " + fmtMs(ctx_.config.hostBudgetMs) +
                    ": the kernel has taken " + std::to_string(ctx_.fetched(r)) + " ops, op " + std::to_string(seq) +
                    " needs slot " + std::to_string(seq % ctx_.ringSlots) +
                    (lag.empty() ? std::string(" (is a stream blocked?)")
                                 : "; rank(s) " + lag + " have not submitted op " + std::to_string(need - 1) +
                                       " yet (" + std::to_string(ctx_.ringSlots) + " ops behind)"));
  }
  failures_.throwIfFailedLocked(true);
}

void EngineSubmission::submitLocked(int r, const ScheduleKey& key, CachedSchedule& sched, const void* send, void* recv,
                                    uint64_t inBytes, uint64_t outBytes, cudaStream_t stream,
                                    const std::vector<uint64_t>& bind,
                                    const std::vector<std::pair<uintptr_t, uintptr_t>>& extraReads,
                                    const std::vector<std::pair<uintptr_t, uintptr_t>>& extraWrites) {
  if (RelaxedCapture::capturing(stream)) {
    captureLocked(r, CapturedOp{key, &sched, send, recv, inBytes, outBytes, bind, extraReads, extraWrites}, stream);
    return;
  }
  RankResources& rr = ctx_.ranks[r];
  const uint32_t seq = rr.submitted;
  MK_LOG_AT(Debug, rankName(r), "op " + std::to_string(seq) + ": submitting " + sched.what);
  waitRingSpaceLocked(r, seq);
  PendingOp& op = pendingOpLocked(r, seq, key, sched);

  const auto& api = driverApi();
  MK_CUDA_CHECK(cudaSetDevice(rr.device));
  if (ctx_.link) {
    // Peers map these buffers through CUDA IPC: refuse one that cannot be exported before the doorbell rings.
    ctx_.link->exportPointer(send, "send buffer");
    ctx_.link->exportPointer(recv, "recv buffer");
  }
  const uintptr_t s0 = reinterpret_cast<uintptr_t>(send), r0 = reinterpret_cast<uintptr_t>(recv);
  const void* boundInput = send;
  if (send && inBytes > 0 && outBytes > 0 && s0 < r0 + outBytes && r0 < s0 + inBytes) {
    // In place (or any overlap): the schedule may write the output while a peer still reads the input,
    // so the input is staged first. Staging slot seq % 2 was last read by op seq - 2: wait for it.
    // The copy is stream work outside the kernel, so it must also wait for the previous op, which may
    // still be writing this very input (chained in-place ops in a group): in place costs one stream
    // wait per op.
    void* staging = stagingLocked(r, seq, inBytes);
    if (seq >= 1)
      checkDriver(api.streamWaitValue32(stream, reinterpret_cast<CUdeviceptr>(&rr.state->complete), seq,
                                        CU_STREAM_WAIT_VALUE_GEQ),
                  "cuStreamWaitValue32 (previous op complete before staging)");
    MK_CUDA_CHECK(cudaMemcpyAsync(staging, send, inBytes, cudaMemcpyDeviceToDevice, stream));
    boundInput = staging;
  }
  const bool grouped = insideGroup();
  handoff_.handoff(r, stream, seq, !grouped);
  rr.submitted = seq + 1;
  if (interNode_) interNode_->noteSubmitted();
  if (grouped) deferGroupWait(&engine_, r, stream, seq);
  recordCallLocked(r, seq, op, boundInput, send, recv, inBytes, outBytes, bind, extraReads, extraWrites);
}

PendingOp& EngineSubmission::pendingOpLocked(int r, uint32_t seq, const ScheduleKey& key, CachedSchedule& sched) {
  auto it = pending_.find(seq);
  if (it == pending_.end()) {
    PendingOp fresh;
    fresh.key = key;
    fresh.sched = &sched;
    fresh.called.assign(ctx_.ranks.size(), false);
    fresh.input.assign(ctx_.ranks.size(), nullptr);
    fresh.output.assign(ctx_.ranks.size(), nullptr);
    fresh.bind.assign(ctx_.ranks.size(), {});
    return pending_.emplace(seq, std::move(fresh)).first->second;
  }
  PendingOp& op = it->second;
  if (op.key != key) {
    int first = 0;
    while (!op.called[first]) ++first;
    failures_.poisonAndThrow(
        ErrorCode::InvalidArgument,
        "op " + std::to_string(seq) + " differs between ranks: rank " + std::to_string(first) + " submitted " +
            op.sched->what + ", rank " + std::to_string(r) + " submitted " + sched.what +
            " (every rank must submit the same collective with the same count, dtype, op and algorithm)");
  }
  return op;
}

void EngineSubmission::recordCallLocked(int r, uint32_t seq, PendingOp& op, const void* boundInput, const void* send,
                                        void* recv, uint64_t inBytes, uint64_t outBytes,
                                        const std::vector<uint64_t>& bind,
                                        const std::vector<std::pair<uintptr_t, uintptr_t>>& extraReads,
                                        const std::vector<std::pair<uintptr_t, uintptr_t>>& extraWrites) {
  const uintptr_t s0 = reinterpret_cast<uintptr_t>(send), r0 = reinterpret_cast<uintptr_t>(recv);
  op.called[r] = true;
  op.input[r] = boundInput;
  op.output[r] = recv;
  if (send && inBytes) op.reads.emplace_back(s0, s0 + inBytes);
  if (recv && outBytes) op.writes.emplace_back(r0, r0 + outBytes);
  op.reads.insert(op.reads.end(), extraReads.begin(), extraReads.end());
  op.writes.insert(op.writes.end(), extraWrites.begin(), extraWrites.end());
  op.bind[r] = bind;
  if (++op.calls == ctx_.local.size()) {
    if (ctx_.link) {
      progress_.postLocked(seq, op);
      progress_.progressLocked();  // the peers may have posted already
      failures_.throwIfFailedLocked();
    } else {
      finalizeLocalLocked(seq, op);
      pending_.erase(seq);
    }
  }
}

}  // namespace mk::runtime
