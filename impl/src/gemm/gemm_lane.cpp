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

const device::LoweredGemm* gemmsOf(const LoweredProgram& p) {
  return reinterpret_cast<const device::LoweredGemm*>(p.image.data() + p.header().gemmsOffset);
}

uint64_t ceilDiv(uint64_t a, uint64_t b) { return (a + b - 1) / b; }

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

device::GemmParams gemmLaneParams(const device::LoweredGemm& g, uint64_t waitLimitNs) {
  using Cfg = device::GemmTileConfigT<256>;
  if ((g.blockN != 128 && g.blockN != 256) || g.m == 0 || g.n == 0 || g.k == 0)
    throw Error(ErrorCode::Internal, "lane " + std::to_string(g.lane) + " step " + std::to_string(g.step) +
                                         " (gemm): the lowered record has m " + std::to_string(g.m) + ", n " +
                                         std::to_string(g.n) + ", k " + std::to_string(g.k) + ", tile width " +
                                         std::to_string(g.blockN) +
                                         " (expected m, n, k >= 1 and a width of 128 or 256)");
  device::GemmParams p{};
  p.tmaStoreC = (g.flags & device::kLgTmaStore) ? 1u : 0u;
  p.ldc = g.ldc;
  p.m = g.m;
  p.n = g.n;
  p.k = g.k;
  p.tilesM = static_cast<uint32_t>(ceilDiv(g.m, Cfg::kBlockM));
  p.tilesN = static_cast<uint32_t>(ceilDiv(g.n, g.blockN));
  p.blockN = g.blockN;
  p.kIters = static_cast<uint32_t>(ceilDiv(g.k, Cfg::kBlockK));
  p.groupM = 8;
  p.out = g.outDType == static_cast<uint8_t>(DType::Float32) ? device::GemmOut::Float32 : device::GemmOut::BFloat16;
  p.bRowMajor = (g.flags & device::kLgBColMajor) ? 0u : 1u;
  p.splitK = 1;
  p.kItersPerSplit = p.kIters;
  p.accumulate = (g.flags & device::kLgAccumulate) ? 1u : 0u;
  p.tag = (uint32_t{g.lane} << 16) | (g.step & 0xFFFFu);
  p.waitLimitNs = waitLimitNs;
  // The kernel splits tilesM x tilesN tiles among the step's activeCtas (= g.ctas) CTAs: the lowering's count
  // must be the same, and no CTA may be left without a tile (it would return before the others' work).
  if (uint64_t{p.tilesM} * p.tilesN != g.tiles || g.ctas == 0 || g.ctas > g.tiles)
    throw Error(ErrorCode::Internal, "lane " + std::to_string(g.lane) + " step " + std::to_string(g.step) +
                                         " (gemm): the lowered record says " + std::to_string(g.tiles) + " tiles on " +
                                         std::to_string(g.ctas) + " CTAs, the tile engine counts " +
                                         std::to_string(uint64_t{p.tilesM} * p.tilesN) + " tiles");
  return p;
}

uint64_t gemmLaneWaitLimitNs(uint64_t pollBudgetNs) { return pollBudgetNs / 2 > 0 ? pollBudgetNs / 2 : 1; }

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
  const device::LoweredGemm* g = gemmsOf(program);
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

void checkGemmOperands(const LoweredProgram& program, uint32_t rank, const void* input, const void* output) {
  std::vector<uint64_t> bases(program.buffers.size(), 0);
  for (size_t b = 0; b < bases.size(); ++b) {
    const BufferKind kind = program.buffers[b].kind;
    bases[b] = kind == BufferKind::Input                                   ? reinterpret_cast<uint64_t>(input)
               : (kind == BufferKind::Output || kind == BufferKind::InOut) ? reinterpret_cast<uint64_t>(output)
                                                                           : 0;
  }
  checkGemmOperands(program, rank, bases);
}

void checkGemmOperands(const LoweredProgram& program, uint32_t rank, const std::vector<uint64_t>& bases) {
  const uint32_t n = gemmCount(program);
  if (n == 0) return;
  const uint32_t nB = program.header().nBuffers;
  const device::LoweredGemm* g = gemmsOf(program);
  for (uint32_t i = 0; i < n; ++i) {
    const std::pair<uint64_t, const char*> ops[3] = {{g[i].a, "A"}, {g[i].b, "B"}, {g[i].dst, "C"}};
    for (const auto& [op, name] : ops) {
      const uint32_t buffer = static_cast<uint32_t>(op >> device::kOperandShift) % nB;
      const BufferKind kind = program.buffers[buffer].kind;
      if (kind == BufferKind::Scratch) continue;  // engine memory: 256-byte aligned arenas
      const uint64_t base = buffer < bases.size() ? bases[buffer] : 0;
      const uint64_t at = base + (op & device::kOperandOffsetMask);
      if (base == 0 || at % 16 != 0) {
        std::ostringstream os;
        os << "execute: rank " << rank << " lane " << g[i].lane << " step " << g[i].step << " (gemm): " << name
           << " at " << (kind == BufferKind::Input ? "input" : "output") << " buffer " << buffer << " "
           << reinterpret_cast<const void*>(base) << " + " << (op & device::kOperandOffsetMask) << " bytes "
           << (base == 0 ? "has no buffer (null pointer)" : "is not 16-byte aligned (the tile engine's TMA needs it)");
        throw Error(ErrorCode::InvalidArgument, os.str());
      }
    }
  }
}

}  // namespace mk::runtime
