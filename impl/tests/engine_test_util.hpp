// Helpers shared by the engine's GPU tests: device buffers that never call cudaFree while a resident
// kernel runs (cudaMallocAsync / cudaFreeAsync on a non-blocking stream), random inputs, and a
// collective runner checked against the CPU reference.
#pragma once

#include <doctest/doctest.h>

#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "mk/communicator.hpp"
#include "mk/cuda_check.hpp"
#include "mk/error.hpp"
#include "mk/exec/numeric.hpp"
#include "mk/exec/verify.hpp"

namespace mkt {

/// The message of the mk::Error `f` throws; "" when it throws none.
inline std::string errorOf(const std::function<void()>& f) {
  try {
    f();
  } catch (const mk::Error& e) {
    return e.what();
  }
  return "";
}

/// Let every GPU read and write the default memory pool of every other GPU (once per process): the
/// engine's peers write straight into user buffers, and peer access does not extend to pools.
inline void sharePools() {
  static const bool done = [] {
    int n = 0;
    MK_CUDA_CHECK(cudaGetDeviceCount(&n));
    for (int d = 0; d < n; ++d) {
      cudaMemPool_t pool = nullptr;
      MK_CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, d));
      for (int p = 0; p < n; ++p) {
        if (p == d) continue;
        int can = 0;
        MK_CUDA_CHECK(cudaDeviceCanAccessPeer(&can, p, d));
        if (!can) continue;
        cudaMemAccessDesc desc{};
        desc.location.type = cudaMemLocationTypeDevice;
        desc.location.id = p;
        desc.flags = cudaMemAccessFlagsProtReadWrite;
        MK_CUDA_CHECK(cudaMemPoolSetAccess(pool, &desc, 1));
      }
    }
    return true;
  }();
  (void)done;
}

/// Device memory from the stream-ordered allocator: freeing it does not wait for the resident kernel.
/// Or a view of `bytes` at `existing` (memory the caller owns and frees, e.g. allocated before the
/// communicator for memcheck runs: see runAndCheck's `userMemory`).
class DeviceBuffer {
 public:
  DeviceBuffer(int device, size_t bytes) : device_(device), bytes_(bytes) {
    sharePools();
    MK_CUDA_CHECK(cudaSetDevice(device));
    MK_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    MK_CUDA_CHECK(cudaMallocAsync(&ptr_, bytes ? bytes : 16, stream_));
    MK_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }
  DeviceBuffer(int device, void* existing, size_t bytes)
      : device_(device), bytes_(bytes), ptr_(existing), owns_(false) {
    MK_CUDA_CHECK(cudaSetDevice(device));
    MK_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  }
  ~DeviceBuffer() {
    cudaSetDevice(device_);
    if (owns_) cudaFreeAsync(ptr_, stream_);
    cudaStreamSynchronize(stream_);
    cudaStreamDestroy(stream_);
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  char* get() const { return static_cast<char*>(ptr_); }
  size_t bytes() const { return bytes_; }
  void upload(const void* host, size_t bytes, size_t offset = 0) {
    MK_CUDA_CHECK(cudaSetDevice(device_));
    MK_CUDA_CHECK(cudaMemcpyAsync(get() + offset, host, bytes, cudaMemcpyHostToDevice, stream_));
    MK_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }
  void download(void* host, size_t bytes, size_t offset = 0) const {
    MK_CUDA_CHECK(cudaSetDevice(device_));
    MK_CUDA_CHECK(cudaMemcpyAsync(host, get() + offset, bytes, cudaMemcpyDeviceToHost, stream_));
    MK_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }
  /// Every byte set to `byte`, by a copy from the host: a memset may run as a kernel, and under
  /// compute-sanitizer (one kernel at a time) no kernel runs beside the resident one.
  void fill(int byte) {
    const std::vector<char> host(bytes_, static_cast<char>(byte));
    upload(host.data(), host.size());
  }

 private:
  int device_;
  size_t bytes_;
  cudaStream_t stream_ = nullptr;
  void* ptr_ = nullptr;
  bool owns_ = true;
};

/// One non-blocking stream per rank.
struct Streams {
  std::vector<cudaStream_t> s;
  explicit Streams(const std::vector<mk::Communicator>& comms) {
    for (const auto& c : comms) {
      MK_CUDA_CHECK(cudaSetDevice(c.device()));
      cudaStream_t st = nullptr;
      MK_CUDA_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
      s.push_back(st);
    }
  }
  ~Streams() {
    for (auto st : s) cudaStreamDestroy(st);
  }
  void sync(const std::vector<mk::Communicator>& comms) {
    for (size_t r = 0; r < s.size(); ++r) {
      MK_CUDA_CHECK(cudaSetDevice(comms[r].device()));
      MK_CUDA_CHECK(cudaStreamSynchronize(s[r]));
    }
  }
};

inline std::vector<int> firstDevices(int n) {
  std::vector<int> d;
  for (int i = 0; i < n; ++i) d.push_back(i);
  return d;
}

/// Random values already representable in `dt`: small integers (every sum exact) or uniform [-1, 1).
inline std::vector<float> randomValues(mk::DType dt, uint64_t n, uint64_t seed, bool smallIntegers) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int> ints(-8, 8);
  std::uniform_real_distribution<float> uni(-1.f, 1.f);
  std::vector<float> v(n);
  std::vector<uint8_t> tmp(4);
  for (uint64_t i = 0; i < n; ++i) {
    const float x = smallIntegers ? static_cast<float>(ints(rng)) : uni(rng);
    mk::storeElement(dt, tmp.data(), 0, x);
    v[i] = mk::loadElement(dt, tmp.data(), 0);
  }
  return v;
}

inline std::vector<uint8_t> toBytes(mk::DType dt, const std::vector<float>& v) {
  std::vector<uint8_t> b(v.size() * mk::dtypeSize(dt));
  for (size_t i = 0; i < v.size(); ++i) mk::storeElement(dt, b.data(), i, v[i]);
  return b;
}

inline double unitRoundoff(mk::DType dt) {
  return dt == mk::DType::Float32    ? std::ldexp(1.0, -24)
         : dt == mk::DType::BFloat16 ? std::ldexp(1.0, -8)
                                     : std::ldexp(1.0, -11);
}

/// groupStart() now, groupEnd() at scope exit (also when a submit throws).
struct GroupGuard {
  GroupGuard() { mk::groupStart(); }
  ~GroupGuard() {
    try {
      mk::groupEnd();
    } catch (...) {
    }
  }
};

/// Where send / recv of rank r point for the in-place variant of `op` (NCCL's conventions).
struct Placement {
  uint64_t sendOffsetBytes = 0;  ///< send = recv buffer + this (in place), else its own buffer
};

/// Device memory of one rank that the caller allocated (and frees): runAndCheck carves its buffers from it.
struct UserMemory {
  char* base = nullptr;
  size_t bytes = 0;
};

/// Run `spec` on every rank (grouped submission) and compare every output element with the CPU reference.
/// Returns the number of mismatches (0 = pass); CHECKs report the first few. `userMemory` (one per rank):
/// take the buffers from there (output at the start, input 256-byte aligned after it) instead of allocating.
inline uint64_t runAndCheck(std::vector<mk::Communicator>& comms, const mk::CollectiveSpec& spec, bool inPlace,
                            uint64_t seed, bool smallIntegers = true, const mk::CollOptions& opt = {},
                            const std::vector<UserMemory>* userMemory = nullptr) {
  const uint32_t n = static_cast<uint32_t>(comms.size());
  const mk::DType dt = spec.dtype;
  const uint64_t es = mk::dtypeSize(dt);
  const uint64_t inCount = mk::inputCount(spec, n), outCount = mk::outputCount(spec, n);
  std::vector<std::vector<float>> inputs(n);
  for (uint32_t r = 0; r < n; ++r) inputs[r] = randomValues(dt, inCount, seed * 1000003 + r, smallIntegers);
  const auto expected = mk::referenceCollective(spec, n, inputs);

  Streams streams(comms);
  std::vector<std::unique_ptr<DeviceBuffer>> sendBufs(n), recvBufs(n);
  std::vector<const void*> send(n);
  std::vector<void*> recv(n);
  for (uint32_t r = 0; r < n; ++r) {
    const auto bytes = toBytes(dt, inputs[r]);
    // In place: the input sits where NCCL expects it inside the output buffer (allgather: block r;
    // reducescatter: the output is block r of the input buffer; others: the same buffer).
    uint64_t recvBytes = outCount * es, inOffset = 0, outOffset = 0;
    if (inPlace) {
      if (spec.op == mk::CollOp::AllGather) inOffset = uint64_t(r) * spec.count * es;
      if (spec.op == mk::CollOp::ReduceScatter) outOffset = uint64_t(r) * spec.count * es;
      recvBytes = std::max(outCount * es + outOffset, inCount * es + inOffset);
    }
    const uint64_t sendAt = (recvBytes + 255) / 256 * 256;
    if (userMemory) REQUIRE(sendAt + inCount * es <= (*userMemory)[r].bytes);
    recvBufs[r] = userMemory ? std::make_unique<DeviceBuffer>(comms[r].device(), (*userMemory)[r].base, recvBytes)
                             : std::make_unique<DeviceBuffer>(comms[r].device(), recvBytes);
    recvBufs[r]->fill(0xFF);  // NaN in every dtype: an element never written cannot pass
    if (inPlace) {
      recvBufs[r]->upload(bytes.data(), bytes.size(), inOffset);
      send[r] = recvBufs[r]->get() + inOffset;
      recv[r] = recvBufs[r]->get() + outOffset;
    } else {
      sendBufs[r] =
          userMemory ? std::make_unique<DeviceBuffer>(comms[r].device(), (*userMemory)[r].base + sendAt, inCount * es)
                     : std::make_unique<DeviceBuffer>(comms[r].device(), inCount * es);
      sendBufs[r]->upload(bytes.data(), bytes.size());
      send[r] = sendBufs[r]->get();
      recv[r] = recvBufs[r]->get();
    }
  }
  {
    GroupGuard group;
    for (uint32_t r = 0; r < n; ++r) {
      switch (spec.op) {
        case mk::CollOp::AllReduce:
          comms[r].allReduce(send[r], recv[r], spec.count, dt, spec.redop, streams.s[r], opt);
          break;
        case mk::CollOp::AllGather: comms[r].allGather(send[r], recv[r], spec.count, dt, streams.s[r], opt); break;
        case mk::CollOp::ReduceScatter:
          comms[r].reduceScatter(send[r], recv[r], spec.count, dt, spec.redop, streams.s[r], opt);
          break;
        case mk::CollOp::Broadcast:
          comms[r].broadcast(send[r], recv[r], spec.count, dt, spec.root, streams.s[r], opt);
          break;
        case mk::CollOp::AllToAll: comms[r].allToAll(send[r], recv[r], spec.count, dt, streams.s[r], opt); break;
      }
    }
  }
  streams.sync(comms);
  for (auto& c : comms) c.synchronize();

  uint64_t bad = 0;
  for (uint32_t r = 0; r < n; ++r) {
    std::vector<uint8_t> got(outCount * es);
    recvBufs[r]->download(got.data(), got.size(),
                          static_cast<size_t>(static_cast<char*>(recv[r]) - recvBufs[r]->get()));
    for (uint64_t i = 0; i < outCount; ++i) {
      const float g = mk::loadElement(dt, got.data(), i);
      const float e = expected[r][i];
      double tol = 0;
      if (!smallIntegers && spec.redop == mk::RedOp::Sum &&
          (spec.op == mk::CollOp::AllReduce || spec.op == mk::CollOp::ReduceScatter)) {
        double sumAbs = 0;
        const uint64_t at = spec.op == mk::CollOp::ReduceScatter ? uint64_t(r) * spec.count + i : i;
        for (uint32_t q = 0; q < n; ++q) sumAbs += std::fabs(inputs[q][at]);
        tol = (n - 1) * unitRoundoff(dt) * sumAbs * 2 + unitRoundoff(dt) * std::fabs(e) * 2;
      }
      const bool ok = (g == e && std::signbit(g) == std::signbit(e)) || std::fabs(double(g) - double(e)) <= tol;
      if (!ok) {
        if (bad < 3) {
          CAPTURE(r);
          CAPTURE(i);
          CAPTURE(g);
          CAPTURE(e);
          CHECK(ok);
        }
        ++bad;
      }
    }
  }
  return bad;
}

/// Mismatches of `got` against `want`, compared exactly (CHECKs report the first, with `what` and its index).
inline uint64_t mismatches(const std::vector<float>& got, const std::vector<float>& want, const char* what) {
  uint64_t bad = 0;
  for (size_t i = 0; i < want.size(); ++i)
    if (got[i] != want[i] && bad++ == 0) {
      CAPTURE(what);
      CAPTURE(i);
      CHECK(got[i] == want[i]);
    }
  return bad;
}

/// A float32 sum all-reduce of `count` elements on every rank, checked like runAndCheck (its mismatches): whether a
/// communicator still computes after a refused call.
inline uint64_t allReduceMismatches(std::vector<mk::Communicator>& comms, uint64_t count, uint64_t seed) {
  mk::CollectiveSpec spec;
  spec.op = mk::CollOp::AllReduce;
  spec.count = count;
  return runAndCheck(comms, spec, false, seed);
}

}  // namespace mkt
