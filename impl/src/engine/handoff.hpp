// mkernel — internal: the engine's hand-off (engine/engine.hpp maps the parts): how an op meets the caller's stream,
// the doorbell and the wait for completion, through a 32-thread kernel or stream memory operations.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "engine/engine_context.hpp"

namespace mk::runtime {

/// The stream side of every op of an engine's ranks. Its calls are made under the engine's mutex, except
/// enqueueWait from groupEnd (the choice it reads was made at the rank's first op, before any wait for it).
class EngineHandoff {
 public:
  explicit EngineHandoff(EngineContext& ctx) : ctx_(ctx) {}
  EngineHandoff(const EngineHandoff&) = delete;
  EngineHandoff& operator=(const EngineHandoff&) = delete;

  /// Undecided choices for `nRanks` ranks, before the kernels start.
  void prepare(size_t nRanks) { kernelHandoff_.assign(nRanks, -1); }
  /// Whether rank r's ops meet their streams through the hand-off kernel (CommConfig::streamHandoff).
  bool useKernel(int r);
  /// Ring rank r's doorbell for op `seq` on `stream` and, when `wait`, hold the stream until the op completed.
  void handoff(int r, cudaStream_t stream, uint32_t seq, bool wait);
  /// Enqueue the completion wait for op `seq` (0-based) of rank r on `stream`.
  void enqueueWait(int r, cudaStream_t stream, uint32_t seq);

 private:
  EngineContext& ctx_;
  std::vector<int8_t> kernelHandoff_;  ///< per rank: 1 StreamHandoff::Kernel, 0 MemOps, -1 not decided yet
};

}  // namespace mk::runtime
