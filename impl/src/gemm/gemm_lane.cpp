// mkernel — host side of the resident kernel's compute lanes: per-op GemmParams blocks (see gemm_lane.hpp).
#include "gemm/gemm_lane.hpp"

#include <cuda_runtime_api.h>

#include <cstring>
#include <memory>
#include <mutex>
#include <sstream>

#include "engine/host_sync.hpp"
#include "gemm/gemm_maps.hpp"
#include "mk/cuda_check.hpp"
#include "mk/device/compute_lane_device.hpp"
#include "mk/error.hpp"

namespace mk::runtime {
namespace {

/// Blocks kept per rank before the ones of completed ops are recycled (distinct address sets in use).
constexpr size_t kMaxBlocks = 64;

/// The GemmParams of one Gemm step for one op's addresses.
device::GemmParams buildParams(const device::LoweredGemm& g, const uint64_t* table, uint32_t* report,
                               uint64_t waitLimitNs) {
  using Cfg = device::GemmTileConfigT<256>;
  auto addr = [&](uint64_t operand) {
    return reinterpret_cast<void*>(table[operand >> device::kOperandShift] + (operand & device::kOperandOffsetMask));
  };
  device::GemmParams p = gemmLaneParams(g, waitLimitNs);
  const bool colB = (g.flags & device::kLgBColMajor) != 0;
  p.mapA = encodeGemmMap2d(addr(g.a), g.k, g.m, g.lda, Cfg::kBlockK, Cfg::kBlockM, "A of a Gemm step");
  if (colB)
    p.mapB = encodeGemmMap2d(addr(g.b), g.k, g.n, g.ldb, Cfg::kBlockK, g.blockN, "B of a Gemm step");
  else
    p.mapB = encodeGemmMap2d(addr(g.b), g.n, g.k, g.ldb, Cfg::kBoxN, Cfg::kBlockK, "B of a Gemm step");
  if (p.tmaStoreC) p.mapC = encodeGemmMap2d(addr(g.dst), g.n, g.m, g.ldc, 64, 64, "C of a Gemm step");
  p.c = addr(g.dst);
  p.timeoutReport = report;
  return p;
}

std::mutex gRegistryMu;
std::map<std::pair<const void*, uint32_t>, std::unique_ptr<GemmLaneBinder>> gRegistry;

}  // namespace

GemmLaneBinder::GemmLaneBinder(int device, uint32_t rank, uint64_t waitLimitNs, DeviceArena* arena)
    : device_(device), rank_(rank), waitLimitNs_(gemmLaneWaitLimitNs(waitLimitNs)), arena_(arena) {
  MK_CUDA_CHECK(cudaSetDevice(device_));
  MK_CUDA_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&report_), 8 * sizeof(uint32_t),
                              cudaHostAllocMapped | cudaHostAllocPortable));
  std::memset(report_, 0, 8 * sizeof(uint32_t));
}

GemmLaneBinder::~GemmLaneBinder() { release(); }

uint64_t GemmLaneBinder::bind(const LoweredProgram& program, const void* programKey, const uint64_t* table,
                              uint32_t seq, uint32_t completed, cudaStream_t copyStream) {
  const device::ProgramHeader& h = program.header();
  Key key{programKey,
          std::vector<uint64_t>(table + size_t{rank_} * h.nBuffers, table + size_t{rank_ + 1} * h.nBuffers)};
  auto it = blocks_.find(key);
  if (it != blocks_.end()) {
    it->second.lastSeq = seq;
    return reinterpret_cast<uint64_t>(it->second.device);
  }
  // A new address set: recycle the blocks of ops that completed everywhere once there are many.
  if (blocks_.size() >= kMaxBlocks) {
    for (auto b = blocks_.begin(); b != blocks_.end();) {
      if (seqGeq(completed, b->second.lastSeq + 1)) {
        free_.push_back(b->second);
        b = blocks_.erase(b);
      } else {
        ++b;
      }
    }
  }
  std::vector<device::GemmParams> params(h.nGemms);
  const device::LoweredGemm* g = loweredGemms(program);
  uint32_t* reportDevice = nullptr;
  MK_CUDA_CHECK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&reportDevice), report_, 0));
  for (uint32_t i = 0; i < h.nGemms; ++i) params[i] = buildParams(g[i], table, reportDevice, waitLimitNs_);
  const size_t bytes = params.size() * sizeof(device::GemmParams);
  Block blk;
  for (size_t i = 0; i < free_.size(); ++i)
    if (free_[i].bytes >= bytes) {
      blk = free_[i];
      free_.erase(free_.begin() + static_cast<std::ptrdiff_t>(i));
      break;
    }
  MK_CUDA_CHECK(cudaSetDevice(device_));
  if (blk.device == nullptr) {
    // 256-byte aligned either way: tensor maps need 64.
    if (arena_ != nullptr) {
      blk.device = arena_->allocate(bytes, "the GemmParams block of a compute-lane op");
    } else {
      MK_CUDA_CHECK(cudaMalloc(&blk.device, bytes));
    }
    blk.bytes = bytes;
  }
  // The copy stream never waits for user streams; the op's doorbell is rung only after this returns, and
  // the kernel acquires the maps with fence.proxy.tensormap before TMA reads them.
  MK_CUDA_CHECK(cudaMemcpyAsync(blk.device, params.data(), bytes, cudaMemcpyHostToDevice, copyStream));
  MK_CUDA_CHECK(cudaStreamSynchronize(copyStream));
  blk.lastSeq = seq;
  blocks_.emplace(std::move(key), blk);
  return reinterpret_cast<uint64_t>(blk.device);
}

std::string GemmLaneBinder::timeoutReport() const {
  if (report_ == nullptr) return "";
  const volatile uint32_t* r = report_;
  if (r[0] != 2) return "";
  std::ostringstream os;
  os << "rank " << rank_ << " lane " << (r[7] >> 16) << " step " << (r[7] & 0xFFFFu) << " (gemm): worker CTA "
     << (r[1] >= 1 ? r[1] - 1 : r[1]) << " thread " << r[2]
     << (r[3] == 1 ? " (producer) waited for shared-memory stage " : " (consumer) waited for the TMA loads of stage ")
     << r[4] << " (phase parity " << r[5] << ") of tile " << r[6] << " for more than " << waitLimitNs_ / 1000000
     << " ms and trapped";
  return os.str();
}

void GemmLaneBinder::release() noexcept {
  if (device_ >= 0) cudaSetDevice(device_);
  auto freeBlock = [this](void* p) {
    if (arena_ != nullptr)
      arena_->release(p);
    else
      cudaFree(p);
  };
  for (auto& kv : blocks_) freeBlock(kv.second.device);
  for (auto& b : free_) freeBlock(b.device);
  blocks_.clear();
  free_.clear();
  if (report_) cudaFreeHost(report_);
  report_ = nullptr;
  cudaGetLastError();
}

GemmLaneBinder& gemmLaneBinder(const void* engine, uint32_t rank, int device, uint64_t waitLimitNs,
                               DeviceArena* arena) {
  std::lock_guard<std::mutex> lock(gRegistryMu);
  auto& b = gRegistry[{engine, rank}];
  if (!b) b = std::make_unique<GemmLaneBinder>(device, rank, waitLimitNs, arena);
  return *b;
}

std::string gemmLaneTimeoutReport(const void* engine, uint32_t rank) {
  std::lock_guard<std::mutex> lock(gRegistryMu);
  auto it = gRegistry.find({engine, rank});
  return it == gRegistry.end() ? std::string() : it->second->timeoutReport();
}

void releaseGemmLaneBinders(const void* engine, bool freeMemory) noexcept {
  std::lock_guard<std::mutex> lock(gRegistryMu);
  for (auto it = gRegistry.begin(); it != gRegistry.end();) {
    if (it->first.first == engine) {
      if (!freeMemory) static_cast<void>(it->second.release());  // leaked on purpose: a live kernel may read it
      it = gRegistry.erase(it);                                  // otherwise the destructor frees
    } else {
      ++it;
    }
  }
}

}  // namespace mk::runtime
