// mkernel — host side of the resident kernel's compute lanes: per-op GemmParams blocks (see gemm_lane.hpp).
#include "gemm/gemm_lane.hpp"

#include <cuda_runtime_api.h>

#include <cstring>
#include <memory>
#include <mutex>
#include <sstream>

#include "attention/attention_launch.hpp"
#include "engine/host_sync.hpp"
#include "gemm/gemm_maps.hpp"
#include "grouped_gemm/grouped_gemm_launch.hpp"
#include "mk/attention.hpp"
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

/// The AttentionParams of one Attention step for one op's addresses (attentionWorkParams of the lowered shape, the
/// maps of Q, K and V, the resident wait budget and tag); the caller sets the unit counter.
device::AttentionParams buildAttentionParams(const device::LoweredAttention& a, const uint64_t* table, uint32_t* report,
                                             uint64_t waitLimitNs) {
  auto addr = [&](uint64_t operand) {
    return reinterpret_cast<char*>(table[operand >> device::kOperandShift] + (operand & device::kOperandOffsetMask));
  };
  AttentionShape sh;
  sh.batch = a.batch;
  sh.qHeads = a.qHeads;
  sh.kvHeads = a.kvHeads;
  sh.headDim = a.headDim;
  sh.sq = a.sq;
  sh.skv = a.skv;
  sh.ldq = a.ldq;
  sh.ldkv = a.ldkv;
  sh.ldo = a.ldo;
  sh.causal = a.causal != 0;
  sh.scale = a.scale;
  sh.vOffset = a.vOffset;
  sh.qPos = a.causalDelta > 0 ? static_cast<uint64_t>(a.causalDelta) : 0;
  sh.kvPos = a.causalDelta < 0 ? static_cast<uint64_t>(-a.causalDelta) : 0;
  device::AttentionParams p = attentionWorkParams(sh);
  if (p.units != a.units || a.ctas == 0 || a.ctas > a.units)
    throw Error(ErrorCode::Internal, "lane " + std::to_string(a.lane) + " step " + std::to_string(a.step) +
                                         " (attention): the lowered record says " + std::to_string(a.units) +
                                         " units on " + std::to_string(a.ctas) + " CTAs, the engine counts " +
                                         std::to_string(p.units));
  char* kv = addr(a.kv);
  p.mapQ = encodeAttentionMap(addr(a.q), a.headDim, a.qHeads, a.sq, a.batch, a.ldq, "Q of an Attention step");
  p.mapK = encodeAttentionMap(kv, a.headDim, a.kvHeads, a.skv, a.batch, a.ldkv, "K of an Attention step");
  p.mapV =
      encodeAttentionMap(kv + a.vOffset * 2, a.headDim, a.kvHeads, a.skv, a.batch, a.ldkv, "V of an Attention step");
  p.out = reinterpret_cast<float*>(addr(a.dst));
  p.timeoutReport = report;
  p.waitLimitNs = waitLimitNs;
  p.tag = (uint32_t{a.lane} << 16) | (a.step & 0xFFFFu);
  return p;
}

/// The GroupedGemmParams of one GroupedGemm step for one op's addresses, its B_g maps into `maps` (the caller places
/// them and sets mapsB) and, for a step without runtime rows, rowCounts left for the caller (`staticCounts`).
device::GroupedGemmParams buildGroupedParams(const device::LoweredGroupedGemm& r, const uint64_t* table,
                                             uint32_t* report, uint64_t waitLimitNs,
                                             std::vector<device::GemmTensorMap>* maps) {
  auto addr = [&](uint64_t operand) {
    return reinterpret_cast<char*>(table[operand >> device::kOperandShift] + (operand & device::kOperandOffsetMask));
  };
  const bool colB = (r.flags & device::kLggBColMajor) != 0;
  std::vector<const void*> bs(r.groups);
  for (uint32_t g = 0; g < r.groups; ++g) bs[g] = addr(r.b) + uint64_t{g} * r.bStride * 2;
  GroupedGemmProblem pr;
  pr.groups = r.groups;
  pr.n = r.n;
  pr.k = r.k;
  pr.rowLayout = GroupedRowLayout::Strided;
  pr.maxRows = r.rows;
  // A static step's counts are placed by the caller; the check only needs a non-null, aligned pointer here.
  pr.rowCounts = r.counts == device::kStaticGroupCounts ? reinterpret_cast<const int32_t*>(16)
                                                        : reinterpret_cast<const int32_t*>(addr(r.counts));
  pr.a = addr(r.a);
  pr.lda = r.lda;
  pr.b = bs.data();
  pr.ldb = r.ldb;
  pr.layoutB = colB ? GemmLayout::ColMajor : GemmLayout::RowMajor;
  pr.c = addr(r.dst);
  pr.ldc = r.ldc;
  pr.outDType = static_cast<DType>(r.outDType);
  pr.swiglu = (r.flags & device::kLggSwiglu) != 0;
  GroupedGemmConfig cfg;
  cfg.epilogue = GemmEpilogue::Direct;  // the resident variant (grouped_gemm_device.hpp)
  const std::string why = groupedGemmProblem(pr, cfg);
  if (!why.empty())
    throw Error(ErrorCode::InvalidArgument, "lane " + std::to_string(r.lane) + " step " + std::to_string(r.step) +
                                                " (grouped-gemm) at this op's addresses: " + why);
  device::GroupedGemmParams p = groupedGemmDeviceParams(pr, cfg, maps);
  p.gemm.timeoutReport = report;
  p.gemm.waitLimitNs = waitLimitNs;
  p.gemm.tag = (uint32_t{r.lane} << 16) | (r.step & 0xFFFFu);
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
  // The block: GemmParams[nGemms], then AttentionParams[nAttentions] (runAttentionStep finds them after the GEMMs'),
  // GroupedGemmParams[nGroupedGemms] (runGroupedGemmStep: after both), then the attention steps' unit counters, kSlots
  // x nAttentions zeroed words (slot-major; each resets itself at the end of its step's run, so a block reused by the
  // next op with the same addresses needs no clearing).
  std::vector<device::GemmParams> params(h.nGemms);
  std::vector<device::AttentionParams> attn(h.nAttentions);
  std::vector<device::GroupedGemmParams> grouped(h.nGroupedGemms);
  std::vector<std::vector<device::GemmTensorMap>> groupedMaps(h.nGroupedGemms);
  const device::LoweredGemm* g = loweredGemms(program);
  const device::LoweredAttention* la = loweredAttentions(program);
  uint32_t* reportDevice = nullptr;
  MK_CUDA_CHECK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&reportDevice), report_, 0));
  for (uint32_t i = 0; i < h.nGemms; ++i) params[i] = buildParams(g[i], table, reportDevice, waitLimitNs_);
  for (uint32_t i = 0; i < h.nAttentions; ++i) {
    attn[i] = buildAttentionParams(la[i], table, reportDevice, waitLimitNs_);
    attentionTags_.insert(attn[i].tag);
  }
  const device::LoweredGroupedGemm* lgg = loweredGroupedGemms(program);
  for (uint32_t i = 0; i < h.nGroupedGemms; ++i)
    grouped[i] = buildGroupedParams(lgg[i], table, reportDevice, waitLimitNs_, &groupedMaps[i]);
  // After the records and the attention counters: the GroupedGemm steps' B_g maps (64-byte aligned for TMA), then
  // the row counts of the steps without runtime rows (every group at its bound).
  const size_t gemmBytes = params.size() * sizeof(device::GemmParams);
  const size_t attnBytes = attn.size() * sizeof(device::AttentionParams);
  const size_t groupedBytes = grouped.size() * sizeof(device::GroupedGemmParams);
  const size_t counterBytes = size_t{device::kSlots} * attn.size() * sizeof(uint32_t);
  const size_t mapsAt = (gemmBytes + attnBytes + groupedBytes + counterBytes + 127) / 128 * 128;
  std::vector<size_t> mapOffset(grouped.size()), countOffset(grouped.size(), 0);
  size_t bytes = mapsAt;
  for (size_t i = 0; i < grouped.size(); ++i) {
    mapOffset[i] = bytes;
    bytes += groupedMaps[i].size() * sizeof(device::GemmTensorMap);
  }
  for (size_t i = 0; i < grouped.size(); ++i)
    if (lgg[i].counts == device::kStaticGroupCounts) {
      countOffset[i] = bytes;
      bytes += size_t{lgg[i].groups} * sizeof(int32_t);
    }
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
      blk.device = arena_->allocate(bytes, "the parameter block of a compute-lane op");
    } else {
      MK_CUDA_CHECK(cudaMalloc(&blk.device, bytes));
    }
    blk.bytes = bytes;
  }
  char* dev = static_cast<char*>(blk.device);
  auto* counters = reinterpret_cast<uint32_t*>(dev + gemmBytes + attnBytes + groupedBytes);
  for (uint32_t i = 0; i < h.nAttentions; ++i) attn[i].unitCounter = counters + i;  // slot 0's; slot s at + s x n
  std::vector<uint8_t> image(bytes, 0);                                             // the counters start at zero
  for (size_t i = 0; i < grouped.size(); ++i) {
    grouped[i].mapsB = reinterpret_cast<const device::GemmTensorMap*>(dev + mapOffset[i]);
    std::memcpy(image.data() + mapOffset[i], groupedMaps[i].data(),
                groupedMaps[i].size() * sizeof(device::GemmTensorMap));
    if (lgg[i].counts != device::kStaticGroupCounts) continue;
    grouped[i].rowCounts = reinterpret_cast<const int32_t*>(dev + countOffset[i]);
    std::vector<int32_t> full(lgg[i].groups, static_cast<int32_t>(lgg[i].rows));
    std::memcpy(image.data() + countOffset[i], full.data(), full.size() * sizeof(int32_t));
  }
  if (!params.empty()) std::memcpy(image.data(), params.data(), gemmBytes);
  if (!attn.empty()) std::memcpy(image.data() + gemmBytes, attn.data(), attnBytes);
  if (!grouped.empty()) std::memcpy(image.data() + gemmBytes + attnBytes, grouped.data(), groupedBytes);
  // The copy stream never waits for user streams; the op's doorbell is rung only after this returns, and
  // the kernel acquires the maps with fence.proxy.tensormap before TMA reads them.
  MK_CUDA_CHECK(cudaMemcpyAsync(blk.device, image.data(), bytes, cudaMemcpyHostToDevice, copyStream));
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
  // Attention reports number their stages as attention_device.hpp's waitBar says (K / V, Q, unit word).
  const bool attention = attentionTags_.count(static_cast<uint32_t>(r[7])) != 0;
  os << "rank " << rank_ << " lane " << (r[7] >> 16) << " step " << (r[7] & 0xFFFFu)
     << (attention ? " (attention)" : " (gemm)") << ": worker CTA " << (r[1] >= 1 ? r[1] - 1 : r[1]) << " thread "
     << r[2]
     << (r[3] == 1 ? " (producer) waited for shared-memory stage " : " (consumer) waited for the TMA loads of stage ")
     << r[4] << " (phase parity " << r[5] << ") of " << (attention ? "unit " : "tile ") << r[6] << " for more than "
     << waitLimitNs_ / 1000000 << " ms and trapped";
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
