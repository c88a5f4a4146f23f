// mkernel — internal: the engine's observations (engine/engine.hpp maps the parts): per-op timestamps, the host <->
// GPU clock offset and per-step traces. It owns the trace and clock-probe blocks; the ranks' stamps are theirs.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "engine/engine_context.hpp"
#include "mk/communicator.hpp"
#include "mk/device/engine_device.hpp"

namespace mk::runtime {

/// Timestamps, clock calibration and traces of an engine's ranks. Every call takes the engine's mutex.
class EngineTiming {
 public:
  explicit EngineTiming(EngineContext& ctx) : ctx_(ctx) {}
  EngineTiming(const EngineTiming&) = delete;
  EngineTiming& operator=(const EngineTiming&) = delete;

  /// The host-mapped trace records (CommConfig::trace) and the clock probe's mailbox of `nRanks` ranks, before the
  /// kernels start (cudaFreeHost may wait for the device, so they live as long as the engine).
  void allocate(size_t nRanks);
  /// Free what allocate() took; only once no kernel runs.
  void release() noexcept;
  /// Rank r's trace records (host-mapped; null without CommConfig::trace).
  device::TraceRecord* traceOf(uint32_t r) const;

  /// Rank r's timestamps of op `op`.
  OpTiming opTiming(int r, uint64_t op);
  /// The offset between the host clock and rank r's GPU clock, best of `rounds` pings.
  ClockSync calibrateClock(int r, int rounds);
  /// Rank r's per-step trace records not returned before.
  std::vector<TraceEvent> takeTrace(int r);

 private:
  EngineContext& ctx_;
  device::TraceRecord* trace_ = nullptr;  ///< [nRanks][traceCapacity]
  std::vector<uint32_t> traceTaken_;      ///< records already returned per rank
  uint32_t* clockPing_ = nullptr;         ///< clock probe mailbox (host-mapped): the host's ping
  uint64_t* clockPong_ = nullptr;         ///< the probe's answer: GPU time and the ping it answers
};

}  // namespace mk::runtime
