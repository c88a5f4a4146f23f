// mk-bench — helpers every subcommand shares: timing statistics and the measurement file's system metadata.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>
#include <vector>

#include "mk/io/measurement.hpp"
#include "mk/util/stats.hpp"

namespace mkbench {

/// Host steady clock in nanoseconds.
double hostNs();
/// Median and percentile (p in [0, 1], linear interpolation): the project's one rule, mk/util/stats.hpp.
using mk::median;
inline double percentile(std::vector<double> v, double p) { return mk::quantile(std::move(v), p); }
/// `s` as a JSON string literal (quotes, backslashes and control characters escaped), for the JSON-text
/// fields of MeasurementFile (system, extra).
std::string quoted(const std::string& s);
/// Kernel driver version ("580.159.04"), else the CUDA driver API version.
std::string driverVersion();
/// "NV18": active NVLinks of GPU 0 through NVML (loaded at run time), or "" when NVML is not there.
std::string nvlinkName();
/// A measurement file with the system metadata of this machine (GPU 0's name and SMs, `gpus`, link — `link`
/// or NVML's —, driver, CUDA runtime), today's UTC date, the commit this binary was built from (mk::buildCommit) and
/// `command`. Records are added by the caller.
mk::MeasurementFile newMeasurementFile(int gpus, const std::string& link, const std::string& command);

/// Fill `count` bf16 values uniform in [-1, 1] on the device: a pool of 2^24 values drawn once (from the first
/// call's `seed`), copied over the buffer as often as it takes (timing does not depend on the values, only on their
/// being finite).
void fillRandomBf16(void* dst, uint64_t count, uint64_t seed);

/// Per-rank send and receive buffers of `bytes` each, allocated before any communicator exists (cudaFree while
/// a resident kernel runs would wait for it forever: destroy the communicators first).
struct Buffers {
  std::vector<int> devices;
  std::vector<char*> send, recv;
  uint64_t bytes = 0;
  Buffers(const std::vector<int>& devs, uint64_t b);
  ~Buffers();
  Buffers(const Buffers&) = delete;
  Buffers& operator=(const Buffers&) = delete;
};

/// cudaMalloc'd memory of the current device (at least 16 bytes), freed at scope exit: allocate it before any
/// communicator exists (cudaFree while a resident kernel runs would wait for it).
struct Dev {
  void* p = nullptr;
  explicit Dev(uint64_t bytes);
  ~Dev();
  Dev(const Dev&) = delete;
  Dev& operator=(const Dev&) = delete;
  char* c() const { return static_cast<char*>(p); }
};

/// One non-blocking stream and a start/stop event pair per GPU: nccl-tests-style loop timing.
struct Streams {
  std::vector<int> devices;
  std::vector<cudaStream_t> s;
  std::vector<cudaEvent_t> start, stop;
  explicit Streams(const std::vector<int>& devs);
  ~Streams();
  Streams(const Streams&) = delete;
  Streams& operator=(const Streams&) = delete;
  /// Host waits for every stream.
  void sync();
  /// Start event on every stream.
  void recordStart();
  /// Stop event on every stream; the slowest GPU's elapsed ms between the events.
  double recordStopAndElapsedMs();
};

}  // namespace mkbench
