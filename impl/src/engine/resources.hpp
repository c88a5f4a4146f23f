// mkernel — internal: the records the engine keeps: a lowered schedule per cache key, the resources of each
// rank, and each op while its ranks' calls are assembled (engine/engine.hpp holds them).
#pragma once

#include <cuda_runtime_api.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "device/device_arena.hpp"
#include "lowering/lowering.hpp"
#include "mk/algorithms/algorithms.hpp"
#include "mk/algorithms/fused.hpp"
#include "mk/device/engine_device.hpp"
#include "mk/schedule/schedule.hpp"

namespace mk::runtime {

/// FNV-1a (64-bit) of `n` bytes, continuing from `h`: the same value in every process for the same bytes.
inline uint64_t fnv1a(const void* data, std::size_t n, uint64_t h = 1469598103934665603ull) noexcept {
  const auto* p = static_cast<const unsigned char*>(data);
  for (std::size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

/// The fields of a fused op that decide its schedule (the spec and the concrete options planFused chose), as one
/// comparable tuple: the cache key of a fused call.
struct FusedKey {
  uint8_t op = 0, dtype = 0, layoutB = 0, order = 0;
  uint64_t m = 0, n = 0, k = 0;
  uint32_t tileRows = 0, ctas = 0, commCtas = 0, computeLanes = 0;

  static FusedKey of(const FusedSpec& s, const FusedOptions& o) {
    return FusedKey{uint8_t(s.op), uint8_t(s.dtype), uint8_t(s.layoutB), uint8_t(o.order), s.m, s.n, s.k,
                    o.tileRows,    o.ctas,           o.commCtas,         o.computeLanes};
  }
  auto tie() const noexcept {
    return std::tie(op, dtype, layoutB, order, m, n, k, tileRows, ctas, commCtas, computeLanes);
  }
  bool operator==(const FusedKey& o) const noexcept { return tie() == o.tie(); }
  bool operator<(const FusedKey& o) const noexcept { return tie() < o.tie(); }
};

/// What a cached schedule is generated from: a collective with everything decided (the algorithm, chunks,
/// channels and inter-node phase concrete), a fused op with its options concrete, or a caller's own schedule, known
/// by the FNV-1a hash and the size of its packed image.
struct ScheduleKey {
  bool custom = false;
  bool fused = false;
  CollectiveSpec spec;                     ///< collectives
  GenOptions gen;                          ///< collectives
  FusedKey fusedKey;                       ///< fused ops
  uint64_t imageHash = 0, imageBytes = 0;  ///< custom schedules

  static ScheduleKey collective(const CollectiveSpec& spec, const GenOptions& gen) {
    ScheduleKey k;
    k.spec = spec;
    k.gen = gen;
    return k;
  }
  static ScheduleKey fusedOp(const FusedSpec& spec, const FusedOptions& opt) {
    ScheduleKey k;
    k.fused = true;
    k.fusedKey = FusedKey::of(spec, opt);
    return k;
  }
  static ScheduleKey customImage(uint64_t hash, uint64_t bytes) {
    ScheduleKey k;
    k.custom = true;
    k.imageHash = hash;
    k.imageBytes = bytes;
    return k;
  }
  bool operator==(const ScheduleKey& o) const noexcept {
    return custom == o.custom && fused == o.fused && spec == o.spec && gen == o.gen && fusedKey == o.fusedKey &&
           imageHash == o.imageHash && imageBytes == o.imageBytes;
  }
  bool operator!=(const ScheduleKey& o) const noexcept { return !(*this == o); }
  bool operator<(const ScheduleKey& o) const noexcept {
    if (custom != o.custom) return custom < o.custom;
    if (custom) return imageHash != o.imageHash ? imageHash < o.imageHash : imageBytes < o.imageBytes;
    if (fused != o.fused) return fused < o.fused;
    if (fused) return fusedKey < o.fusedKey;
    return spec != o.spec ? spec < o.spec : gen < o.gen;
  }
  /// The same 64 bits in every process for the same key (FNV-1a over the fields, widened): the multi-process
  /// post board compares it to catch ranks that submitted different ops.
  uint64_t digest() const noexcept {
    const uint64_t fields[] = {custom ? 1u : 0u,
                               imageHash,
                               imageBytes,
                               uint64_t(spec.op),
                               uint64_t(spec.algo),
                               uint64_t(spec.dtype),
                               uint64_t(spec.redop),
                               spec.count,
                               uint64_t(spec.root),
                               uint64_t(gen.chunks),
                               uint64_t(gen.channels),
                               uint64_t(gen.inter) | uint64_t(gen.protocol) << 8,
                               fused ? 1u : 0u,
                               uint64_t(fusedKey.op) | uint64_t(fusedKey.dtype) << 8 |
                                   uint64_t(fusedKey.layoutB) << 16 | uint64_t(fusedKey.order) << 24,
                               fusedKey.m,
                               fusedKey.n,
                               fusedKey.k,
                               uint64_t(fusedKey.tileRows) | uint64_t(fusedKey.ctas) << 32,
                               uint64_t(fusedKey.commCtas) | uint64_t(fusedKey.computeLanes) << 32};
    return fnv1a(fields, sizeof fields);
  }
};

/// A schedule lowered and uploaded for every rank, generated once per key.
struct CachedSchedule {
  Schedule schedule;
  std::string what;                      ///< "allreduce one-shot float32 sum count 1021" (for diagnostics)
  std::vector<LoweredProgram> programs;  ///< per rank
  std::vector<void*> devicePrograms;     ///< per rank, on that rank's GPU (null for ranks of other processes)
  uint64_t scratchBytes = 0;
};

/// Engine resources of one rank.
struct RankResources {
  int device = -1;
  cudaStream_t kernelStream = nullptr;  ///< runs the resident kernel (non-blocking)
  cudaStream_t copyStream = nullptr;    ///< uploads (non-blocking: never waits for user streams)
  device::RankState* state = nullptr;
  uint32_t* doorbell = nullptr;
  device::OpStamp* stamps = nullptr;  ///< ringSlots entries, device memory
  std::array<void*, device::kSlots> scratch{};
  uint64_t scratchBytes = 0;
  std::array<void*, device::kSlots> staging{};
  uint64_t stagingBytes = 0;
  std::vector<void*> retired;  ///< device allocations freed once the kernel stopped
  /// Where programs, scratch, staging and compute-lane blocks come from (CommConfig::deviceArenaBytes).
  std::unique_ptr<DeviceArena> arena;
  /// Inter-node (a communicator spanning nodes): the command FIFO this rank's kernel pushes into (ring and `done`
  /// host-mapped, head and doneCache in device memory) and the inbox the host fills with what other nodes sent.
  device::ProxyCommand* fifoRing = nullptr;
  uint64_t* fifoDone = nullptr;
  uint64_t* fifoDeviceWords = nullptr;  ///< [0] head, [1] doneCache (device memory)
  device::InboxRecord* inbox = nullptr;
  char* fifoStaging = nullptr;   ///< host-mapped: the chunks the kernel stages for the proxy
  char* inboxStaging = nullptr;  ///< host-mapped: the bytes of Copy records
  uint64_t inboxWritten = 0;     ///< records the host wrote (the kernel's RankMailbox::inboxTaken trails it)
  bool launched = false;
  uint32_t submitted = 0;  ///< ops submitted by this rank
  /// [EngineSubmission::kMaxCaptures] device memory: each capture's running replay's base.
  uint32_t* graphBase = nullptr;
};

/// An op being assembled from the calls of every rank.
struct PendingOp {
  ScheduleKey key;
  CachedSchedule* sched = nullptr;
  std::vector<bool> called;
  std::vector<const void*> input;  ///< bound input per rank (staging when staged)
  std::vector<void*> output;
  /// Per rank, per schedule buffer: an address that overrides the binding by kind (0: by kind; empty: none). Fused
  /// ops and execute() with several inputs bind a and b separately this way.
  std::vector<std::vector<uint64_t>> bind;
  std::vector<std::pair<uintptr_t, uintptr_t>> reads, writes;  ///< user byte ranges per rank (fence rule)
  uint32_t calls = 0;                                          ///< local ranks that called
  bool posted = false;  ///< multi-process: this rank's post of the op is on the board
  /// Multi-process: this rank's scratch arena of the op's slot as posted. The descriptor must use the arena the peers
  /// were told of, even when a later op's schedule regrew the arenas before every rank posted this one.
  void* postedScratch = nullptr;
};

}  // namespace mk::runtime
