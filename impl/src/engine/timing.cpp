// mkernel — observations of the engine: per-op timestamps, the host <-> GPU clock offset, per-step traces and
// their Chrome trace form.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "engine/timing.hpp"

#include "engine/host_alloc.hpp"
#include "engine/host_sync.hpp"
#include "kernels/resident_kernel.hpp"
#include "mk/cuda_check.hpp"
#include "mk/error.hpp"
#include "mk/io/trace.hpp"

namespace mk {
namespace runtime {

void EngineTiming::allocate(size_t nRanks) {
  if (ctx_.config.trace) trace_ = hostAlloc<device::TraceRecord>(nRanks * size_t{ctx_.config.traceCapacity});
  traceTaken_.assign(nRanks, 0);
  clockPing_ = hostAlloc<uint32_t>(4);
  clockPong_ = hostAlloc<uint64_t>(2);
}

void EngineTiming::release() noexcept {
  if (trace_) cudaFreeHost(trace_);
  if (clockPing_) cudaFreeHost(clockPing_);
  if (clockPong_) cudaFreeHost(clockPong_);
}

device::TraceRecord* EngineTiming::traceOf(uint32_t r) const {
  return trace_ ? &trace_[size_t{r} * ctx_.config.traceCapacity] : nullptr;
}

OpTiming EngineTiming::opTiming(int r, uint64_t op) {
  std::lock_guard<std::mutex> lock(ctx_.mu);
  device::OpStamp st{};
  MK_CUDA_CHECK(cudaSetDevice(ctx_.ranks[r].device));
  MK_CUDA_CHECK(cudaMemcpyAsync(&st, &ctx_.ranks[r].stamps[op % ctx_.ringSlots], sizeof st, cudaMemcpyDeviceToHost,
                                ctx_.ranks[r].copyStream));
  MK_CUDA_CHECK(cudaStreamSynchronize(ctx_.ranks[r].copyStream));
  if (st.op != static_cast<uint32_t>(op) || st.completeNs == 0)
    throw Error(ErrorCode::NotFound, "timestamps of op " + std::to_string(op) + " on rank " + std::to_string(r) +
                                         " are not available (not complete yet, or overwritten by later ops)");
  OpTiming t;
  t.op = op;
  t.doorbellNs = st.doorbellNs;
  t.publishNs = st.publishNs;
  t.firstStepNs = st.firstStepNs;
  t.localDoneNs = st.localDoneNs;
  t.completeNs = st.completeNs;
  t.stagedNs = st.stagedNs;
  t.rungNs = st.rungNs;
  return t;
}

ClockSync EngineTiming::calibrateClock(int r, int rounds) {
  if (rounds < 1) throw Error(ErrorCode::InvalidArgument, "calibrateClock: rounds must be >= 1");
  std::lock_guard<std::mutex> lock(ctx_.mu);
  uint32_t* ping = clockPing_;
  uint64_t* pong = clockPong_;
  storeHost(ping, 0);
  pong[1] = 0;
  MK_CUDA_CHECK(cudaSetDevice(ctx_.ranks[r].device));
  MK_CUDA_CHECK(launchClockProbe(ping, pong, static_cast<uint32_t>(rounds), 1000000000ull, ctx_.ranks[r].copyStream));
  auto hostNs = [] {
    return static_cast<double>(
        std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count());
  };
  ClockSync best;
  best.uncertaintyNs = -1;
  volatile uint64_t* vp = pong;
  for (int i = 1; i <= rounds; ++i) {
    const double t0 = hostNs();
    storeHost(ping, static_cast<uint32_t>(i));
    if (!hostPoll(1000, [&] { return static_cast<uint32_t>(vp[1]) == static_cast<uint32_t>(i); })) {
      storeHost(ping, 0xFFFFFFFFu);  // the probe leaves at once if it ever runs
      hostPoll(2000, [&] { return cudaStreamQuery(ctx_.ranks[r].copyStream) != cudaErrorNotReady; });
      throw Error(ErrorCode::Timeout, "calibrateClock: the probe kernel on GPU " +
                                          std::to_string(ctx_.ranks[r].device) + " did not answer ping " +
                                          std::to_string(i) + " within 1 s");
    }
    const double t1 = hostNs();
    const double g = static_cast<double>(vp[0]);
    const double half = (t1 - t0) / 2;
    if (best.uncertaintyNs < 0 || half < best.uncertaintyNs) {
      best.uncertaintyNs = half;
      best.offsetNs = g - (t0 + half);
    }
  }
  MK_CUDA_CHECK(cudaStreamSynchronize(ctx_.ranks[r].copyStream));
  return best;
}

std::vector<TraceEvent> EngineTiming::takeTrace(int r) {
  std::lock_guard<std::mutex> lock(ctx_.mu);
  std::vector<TraceEvent> out;
  if (!trace_) return out;
  uint32_t count = 0;
  MK_CUDA_CHECK(cudaSetDevice(ctx_.ranks[r].device));
  MK_CUDA_CHECK(cudaMemcpyAsync(&count, &ctx_.ranks[r].state->traceCount, sizeof count, cudaMemcpyDeviceToHost,
                                ctx_.ranks[r].copyStream));
  MK_CUDA_CHECK(cudaStreamSynchronize(ctx_.ranks[r].copyStream));
  count = std::min(count, ctx_.config.traceCapacity);
  const device::TraceRecord* rec = &trace_[size_t(r) * ctx_.config.traceCapacity];
  for (uint32_t i = traceTaken_[r]; i < count; ++i) {
    TraceEvent e;
    e.rank = static_cast<uint32_t>(r);
    e.lane = rec[i].lane;
    e.step = rec[i].step;
    e.op = rec[i].op;
    e.kind = static_cast<StepKind>(rec[i].kind);
    e.startNs = rec[i].startNs;
    e.endNs = rec[i].endNs;
    out.push_back(e);
  }
  traceTaken_[r] = count;
  return out;
}

}  // namespace runtime

std::string traceToChromeJson(const std::vector<TraceEvent>& events, const std::string& label) {
  uint64_t t0 = UINT64_MAX;
  for (const auto& e : events) t0 = std::min(t0, e.startNs);
  io::TraceWriter w({{"source", label}});
  std::set<uint32_t> ranks;
  std::set<std::pair<uint32_t, uint32_t>> lanes;
  for (const auto& e : events) {
    ranks.insert(e.rank);
    lanes.insert({e.rank, e.lane});
  }
  for (uint32_t r : ranks) w.process(r, "rank " + std::to_string(r));
  for (const auto& [r, l] : lanes) w.lane(r, l, "lane " + std::to_string(l));
  for (const auto& e : events)
    w.slice({e.rank,
             e.lane,
             toString(e.kind),
             "step",
             static_cast<int64_t>(e.startNs - t0),
             static_cast<int64_t>(e.endNs >= e.startNs ? e.endNs - t0 : e.startNs - t0),
             {{"op", e.op}, {"step", uint64_t{e.step}}}});
  return w.finish();
}

}  // namespace mk
