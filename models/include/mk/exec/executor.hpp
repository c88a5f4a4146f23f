// mkernel — the CPU reference executor: runs any schedule with one host thread per (rank, lane).
//
// It is the oracle for generators and for the GPU engine: same Schedule, host memory, the flag
// semantics of schedule.hpp. Reduce computes in float and rounds once to the destination dtype
// (round-to-nearest-even), exactly as the GPU engine must.
#pragma once

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <vector>

#include "mk/schedule/schedule.hpp"

namespace mk {

/// Host memory for every (rank, buffer) of a schedule: bytes[rank][buffer], sized count * dtypeSize. A run that
/// spans processes (ExecOptions::localRanks) leaves the ranks of other processes empty (no buffers).
struct HostMemory {
  std::vector<std::vector<std::vector<std::byte>>> bytes;

  /// Zero-filled memory shaped for `s`.
  static HostMemory allocate(const Schedule& s);
  /// Zero-filled memory for `ranks` of `s` only; the other ranks get no buffers. Throws Error(InvalidArgument) for
  /// a rank outside the schedule.
  static HostMemory allocate(const Schedule& s, const std::vector<uint32_t>& ranks);
  template <class T>
  T* as(uint32_t rank, uint16_t buffer) {
    return reinterpret_cast<T*>(bytes[rank][buffer].data());
  }
};

/// The executor's side of a run that spans processes, handed to its ProxyPort: the one entry point for what
/// arrives from the proxy (other processes, or this one through its own transport). Thread-safe.
class RemoteEndpoint {
 public:
  /// Where `bytes` bytes for buffer `buffer` of local rank `rank` at byte offset `byteOffset` go: checked against
  /// the schedule and the memory. Throws Error(InvalidArgument) naming what is outside (a rank this process does not
  /// run, a buffer or range outside the schedule).
  virtual std::byte* remoteWriteTarget(uint32_t rank, uint16_t buffer, uint64_t byteOffset, uint64_t bytes) = 0;
  /// Flag `flagId` of local rank `rank` += value, with release: bytes written through remoteWriteTarget before are
  /// visible to a lane that sees the new value. Throws Error(InvalidArgument) for a rank or flag outside the run.
  virtual void remoteSignal(uint32_t rank, uint32_t flagId, uint64_t value) = 0;
  /// Abort the run with `error` (the run's first error wins; execute() throws it).
  virtual void remoteFailure(std::exception_ptr error) noexcept = 0;
  /// True once the run aborts: a port's waits return early.
  virtual bool aborting() const noexcept = 0;
  /// The run's runtime extent values (ExecOptions::extents): a port sizes a ProxyPut by runtimeCount() with them.
  virtual const ExtentValues& extents() const noexcept = 0;

 protected:
  ~RemoteEndpoint() = default;
};

/// Where ProxyPut steps go when ExecOptions::proxy is set (impl's command FIFO and proxy implement it: the CPU
/// executor then drives the same inter-node path as the GPU engine).
class ProxyPort {
 public:
  virtual ~ProxyPort() = default;
  /// The run starts: called once, on the calling thread, after the run's state exists and before any lane runs. May
  /// block (a barrier with the other processes). Throws to refuse the run (execute() rethrows it).
  virtual void begin(const Schedule& s, HostMemory& mem, RemoteEndpoint& endpoint) = 0;
  /// Lane `lane` of local rank `rank` reached ProxyPut step `step`: return once the step is complete for the lane
  /// (its source has been read; its bytes and flag land at the destination later). Returns early when the endpoint
  /// aborts; throws mk::Error on failure. Called by lane threads concurrently.
  virtual void proxyPut(uint32_t rank, uint32_t lane, uint32_t step) = 0;
  /// The run ended (every lane returned) with `error` (null on success). Called once after a successful begin(), on
  /// the calling thread, before execute() returns or throws.
  virtual void end(std::exception_ptr error) noexcept = 0;
};

struct ExecOptions {
  /// A wait that sees no progress anywhere for this long fails (a global stall is detected at once).
  std::chrono::milliseconds stallTimeout{10000};
  /// The ranks this process runs (empty: every rank). Other ranks' steps are not run and their memory may be empty;
  /// only a ProxyPut may reach a rank outside this set (its destination), and only through `proxy`. Barrier steps
  /// need every rank.
  std::vector<uint32_t> localRanks;
  /// Where ProxyPut steps go (null: the executor copies their bytes itself, which needs the destination rank
  /// local). With a port, a lane waiting on a flag that a ProxyPut raises is never called deadlocked (the increment
  /// may be in flight): stallTimeout bounds it, and remote arrivals count as progress.
  ProxyPort* proxy = nullptr;
  /// Runtime extent values, values[rank][extent] (extent.hpp); empty: every extent at its bound. A step that names an
  /// extent moves or computes its share of the bound on the rank that runs it. Checked by checkExtentValues first.
  /// An extent with a source takes its value from that int32 element instead (a value given here is not used); one
  /// outside [0, bound] there fails the run with Error(InvalidArgument) naming the step, the extent and the rank.
  ExtentValues extents;
};

/// What a run moved, counted as its steps ran (each at its runtime size).
struct ExecStats {
  /// Bytes of dst's dtype each data-moving kind wrote (copy, put, proxyput, gather), indexed by StepKind; a
  /// ProxyPut's are the bytes that crossed nodes.
  std::array<uint64_t, kStepKindCount> bytesMoved{};

  /// The bytes steps of `kind` moved.
  uint64_t bytes(StepKind kind) const noexcept { return bytesMoved[static_cast<std::size_t>(kind)]; }
};

/// Run `s` over `mem` and say what it moved (ExecStats). Throws Error(Deadlock) when every unfinished lane is blocked
/// (message: each blocked step with flag, threshold and value seen), Error(Timeout) after stallTimeout without
/// progress, Error(InvalidSchedule) for an out-of-range operand met at run time, Error(InvalidArgument) for a step of
/// a local rank that reaches another process's rank other than through a ProxyPut and the port, or for extent values
/// that do not fit the schedule (checkExtentValues). The schedule is not
/// validated here: validate() first when it comes from outside.
ExecStats execute(const Schedule& s, HostMemory& mem, const ExecOptions& opt = {});

}  // namespace mk
