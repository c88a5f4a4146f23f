// mkernel — internal: ops captured into CUDA graphs (mk/graph.hpp; capture.cpp).
//
// A CaptureRecord is one rank's ops of one capture (cudaStreamGetCaptureInfo's id): what each op needs to be
// submitted again at every launch (the cache key, the schedule, the bound buffers), and the graph cells the
// launch gives its op numbers through (device::GraphCells, host-mapped, from the engine's block, and the
// replay's base in device memory for the op nodes). The engine keeps every record for its life; GraphExec shares
// the ones of its graph and reaches their engine through a weak pointer.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "engine/resources.hpp"
#include "mk/device/engine_device.hpp"

namespace mk::runtime {

class Engine;

/// One captured op of one rank: the arguments of its submission.
struct CapturedOp {
  ScheduleKey key;
  CachedSchedule* sched = nullptr;
  const void* send = nullptr;
  void* recv = nullptr;
  uint64_t inBytes = 0, outBytes = 0;
  std::vector<uint64_t> bind;
  std::vector<std::pair<uintptr_t, uintptr_t>> extraReads, extraWrites;
};

struct CaptureRecord {
  std::weak_ptr<Engine> engine;
  int rank = 0;
  unsigned long long captureId = 0;
  cudaStream_t stream = nullptr;        ///< the one stream this rank's ops were captured on
  device::GraphCells* cells = nullptr;  ///< host-mapped (the engine's block)
  uint32_t* base = nullptr;             ///< device memory of the rank's GPU: the running replay's first op number
  std::vector<CapturedOp> ops;
  uint32_t launches = 0;        ///< launches given op numbers (the host's copy of cells->authorized)
  const void* owner = nullptr;  ///< the live GraphExec that instantiated it, if any
};

/// The record whose cells are `cells`, if one is alive (GraphExec finds a graph's records by its first nodes).
std::shared_ptr<CaptureRecord> findCaptureRecord(const device::GraphCells* cells);
/// Make `rec` findable by its cells.
void registerCaptureRecord(const std::shared_ptr<CaptureRecord>& rec);

/// While alive, and when `stream` is under capture: this thread's capture mode is relaxed, so the engine's own
/// calls during a submission (pointer checks, uploads on its copy stream) cannot invalidate the caller's capture.
class RelaxedCapture {
 public:
  explicit RelaxedCapture(cudaStream_t stream);
  ~RelaxedCapture();
  RelaxedCapture(const RelaxedCapture&) = delete;
  RelaxedCapture& operator=(const RelaxedCapture&) = delete;
  bool active() const noexcept { return active_; }
  /// Whether `stream` is under capture (cudaStreamIsCapturing; throws mk::Error on a bad stream).
  static bool capturing(cudaStream_t stream);

 private:
  bool active_ = false;
  cudaStreamCaptureMode previous_ = cudaStreamCaptureModeRelaxed;
};

/// The first line of every Communicator entry point that takes a stream: relaxed capture mode while the call runs
/// (RelaxedCapture), and, when the stream is capturing, what no op of the engine could be captured with refused
/// before anything is checked or enqueued (Engine::requireCapturable).
class CaptureScope : public RelaxedCapture {
 public:
  CaptureScope(const Engine& engine, int rank, cudaStream_t stream);
};

}  // namespace mk::runtime
