// mkernel — GEMM host side: validation (before any launch), TMA descriptor encoding, the plan.
#include "mk/gemm.hpp"

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

#include "device/driver_api.hpp"
#include "gemm/gemm_launch.hpp"
#include "gemm/gemm_maps.hpp"
#include "mk/cuda_check.hpp"
#include "mk/error.hpp"

namespace mk {

namespace {

using device::GemmTileConfig;

// TMA (cuTensorMapEncodeTiled): global addresses 16-byte aligned, every stride but the innermost a
// multiple of 16 bytes and below 2^40, every dimension in [1, 2^32].
constexpr int64_t kAlignBytes = 16;
constexpr int64_t kMaxDim = int64_t{1} << 32;
constexpr int64_t kMaxStrideBytes = int64_t{1} << 40;
constexpr int64_t kMaxSplitK = 64;

[[noreturn]] void bad(const std::string& what) { throw Error(ErrorCode::InvalidArgument, "gemm: " + what); }

void needPositive(int64_t v, const char* name) {
  if (v < 1 || v > kMaxDim) bad(std::string(name) + " must be in [1, 2^32] (got " + std::to_string(v) + ")");
}

void needAligned(const void* p, const char* name) {
  if (p == nullptr) bad(std::string(name) + " is null");
  const auto addr = reinterpret_cast<uintptr_t>(p);
  if (addr % kAlignBytes != 0)
    bad(std::string(name) + " must be 16-byte aligned for TMA / vector stores (address " + std::to_string(addr) +
        " is " + std::to_string(addr % kAlignBytes) + " bytes past a 16-byte boundary)");
}

void needLd(int64_t ld, int64_t minLd, int64_t elemBytes, const char* name, const char* minName) {
  if (ld < minLd)
    bad(std::string(name) + " must be >= " + minName + " = " + std::to_string(minLd) + " (got " + std::to_string(ld) +
        ")");
  if ((ld * elemBytes) % kAlignBytes != 0)
    bad(std::string(name) + " must be a multiple of " + std::to_string(kAlignBytes / elemBytes) +
        " elements (rows 16-byte aligned for TMA), got " + std::to_string(ld));
  if (ld * elemBytes >= kMaxStrideBytes) bad(std::string(name) + " is too large for TMA (stride >= 2^40 bytes)");
}

int64_t ceilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace

const char* toString(GemmLayout layout) noexcept { return layout == GemmLayout::RowMajor ? "row" : "col"; }
const char* toString(GemmEpilogue epilogue) noexcept {
  return epilogue == GemmEpilogue::TmaStore ? "tma-store" : "direct";
}

namespace {
template <uint32_t kBlockN, bool kTmaStoreC>
GemmTileShape shapeOf() {
  using Cfg = device::GemmTileConfigT<kBlockN, kTmaStoreC>;
  GemmTileShape s;
  s.blockM = Cfg::kBlockM;
  s.blockN = Cfg::kBlockN;
  s.blockK = Cfg::kBlockK;
  s.stages = Cfg::kStages;
  s.smemBytes = Cfg::kSmemBytes;
  s.threads = Cfg::kThreads;
  return s;
}
}  // namespace

GemmTileShape gemmTileShape(uint32_t blockN, GemmEpilogue epilogue) noexcept {
  if (epilogue == GemmEpilogue::TmaStore) return blockN == 128 ? shapeOf<128, true>() : shapeOf<256, true>();
  return blockN == 128 ? shapeOf<128, false>() : shapeOf<256, false>();
}

GemmTiles validateGemm(const GemmProblem& pr, const GemmConfig& cfg, int64_t smCount) {
  needPositive(pr.m, "m");
  needPositive(pr.n, "n");
  needPositive(pr.k, "k");
  if (pr.outDType != DType::BFloat16 && pr.outDType != DType::Float32)
    throw Error(ErrorCode::Unsupported, std::string("gemm: output dtype must be bfloat16 or float32 (got ") +
                                            (pr.outDType == DType::Float16 ? "float16" : "an unknown dtype") + ")");
  if (pr.layoutB != GemmLayout::RowMajor && pr.layoutB != GemmLayout::ColMajor)
    throw Error(ErrorCode::Unsupported, "gemm: layoutB must be RowMajor or ColMajor (got value " +
                                            std::to_string(static_cast<int>(pr.layoutB)) + ")");
  needAligned(pr.a, "A");
  needAligned(pr.b, "B");
  needAligned(pr.c, "C");
  needLd(pr.lda, pr.k, 2, "lda", "k");
  if (pr.layoutB == GemmLayout::RowMajor)
    needLd(pr.ldb, pr.n, 2, "ldb", "n (B row-major, K x N)");
  else
    needLd(pr.ldb, pr.k, 2, "ldb", "k (B column-major)");
  // C: pair stores need an even ldc; 8 elements keeps every row 16-byte aligned for both output types
  // (and for a later TMA store epilogue).
  if (pr.ldc < pr.n) bad("ldc must be >= n = " + std::to_string(pr.n) + " (got " + std::to_string(pr.ldc) + ")");
  if (pr.ldc % 8 != 0) bad("ldc must be a multiple of 8 elements (got " + std::to_string(pr.ldc) + ")");
  if (smCount < 1) bad("the device reports " + std::to_string(smCount) + " SMs");
  if (cfg.ctas < 0 || cfg.ctas > smCount)
    bad("ctas must be in [0, " + std::to_string(smCount) + "] (0 = every SM; one CTA per SM at most), got " +
        std::to_string(cfg.ctas));
  if (cfg.groupM < 1 || cfg.groupM > 65535)
    bad("groupM must be in [1, 65535] (got " + std::to_string(cfg.groupM) + ")");
  if (cfg.tileN != 0 && cfg.tileN != 128 && cfg.tileN != 256)
    bad("tileN must be 0 (choose), 128 or 256 (got " + std::to_string(cfg.tileN) + ")");
  if (cfg.epilogue != GemmEpilogue::Direct && cfg.epilogue != GemmEpilogue::TmaStore)
    bad("epilogue must be Direct or TmaStore (got value " + std::to_string(static_cast<int>(cfg.epilogue)) + ")");
  if (cfg.splitK < 1 || cfg.splitK > kMaxSplitK)
    bad("splitK must be in [1, " + std::to_string(kMaxSplitK) + "] (1 = no split), got " + std::to_string(cfg.splitK));
  if (cfg.schedule != GemmSchedule::Auto && cfg.schedule != GemmSchedule::Tiles &&
      cfg.schedule != GemmSchedule::StreamK)
    bad("schedule must be Auto, Tiles or StreamK (got value " + std::to_string(static_cast<int>(cfg.schedule)) + ")");
  if (cfg.schedule == GemmSchedule::StreamK && cfg.splitK > 1)
    bad("schedule StreamK cannot be combined with splitK > 1 (got splitK = " + std::to_string(cfg.splitK) +
        "): stream-K already cuts the tiles' k-ranges; use one or the other");
  const int64_t ctas = cfg.ctas == 0 ? smCount : cfg.ctas;
  GemmTiles t;
  // Split-K asked for explicitly keeps whole-tile units (Auto never adds stream-K to it).
  const GemmSchedule requested = cfg.splitK > 1 ? GemmSchedule::Tiles : cfg.schedule;
  const GemmScheduleChoice choice = gemmChooseSchedule(pr.m, pr.n, pr.k, ctas, cfg.tileN, requested);
  t.blockN = choice.blockN;
  t.schedule = choice.schedule;
  t.tilesM = static_cast<uint64_t>(ceilDiv(pr.m, GemmTileConfig::kBlockM));
  t.tilesN = static_cast<uint64_t>(ceilDiv(pr.n, static_cast<int64_t>(t.blockN)));
  // The staging buffer holds bf16 tiles only; fp32 output keeps the direct epilogue. So does an N that is
  // not a multiple of 8: measured on H200, a TMA store clipped at the tensor map's N still wrote
  // the rest of the last 16-byte piece of each row (columns N .. round_up(N, 8) - 1, outside C).
  const bool tmaStoreFits = pr.outDType == DType::BFloat16 && pr.n % 8 == 0;
  t.epilogue = cfg.epilogue == GemmEpilogue::TmaStore && tmaStoreFits ? GemmEpilogue::TmaStore : GemmEpilogue::Direct;
  // Split-K: pieces of ceil(kIters / splitK) slices, then as many pieces as that takes (none empty:
  // K = 100 (2 slices) with splitK = 4 runs 2 pieces of 1 slice).
  const int64_t kIters = ceilDiv(pr.k, GemmTileConfig::kBlockK);
  const int64_t perSplit = ceilDiv(kIters, std::min(cfg.splitK, kIters));
  t.kItersPerSplit = static_cast<uint64_t>(perSplit);
  t.splitK = static_cast<uint64_t>(ceilDiv(kIters, perSplit));
  if (t.units() >= (uint64_t{1} << 31))
    bad("the problem has too many work units (" + std::to_string(t.count()) + " tiles x " + std::to_string(t.splitK) +
        " k-pieces)");
  if (t.schedule == GemmSchedule::StreamK) {
    t.streamKTiles = gemmStreamKTileCount(t.count(), static_cast<uint64_t>(ctas));
    const uint64_t skIters = t.streamKTiles * static_cast<uint64_t>(kIters);
    // The device walks stream-K ranges with 32-bit iteration indices (registers: docs/gemm.md).
    if (skIters >= (uint64_t{1} << 32)) {
      if (cfg.schedule == GemmSchedule::StreamK)
        bad("schedule StreamK: the stream-K region has too many k-iterations (" + std::to_string(skIters) +
            ", must be below 2^32)");
      t.schedule = GemmSchedule::Tiles;  // Auto: whole tiles of the same width
      t.streamKTiles = 0;
    } else {
      t.streamKCtas = std::min(static_cast<uint64_t>(ctas), skIters);
    }
  }
  // More CTAs than work would only start CTAs that find none: with stream-K and whole waves every CTA has
  // tiles; with stream-K alone, at most one CTA per k-iteration.
  if (t.schedule == GemmSchedule::StreamK)
    t.ctas = t.streamKTiles < t.count() ? static_cast<uint64_t>(ctas) : t.streamKCtas;
  else
    t.ctas = std::min(static_cast<uint64_t>(ctas), t.units());
  return t;
}

struct GemmPlan::Impl {
  device::GemmParams params{};
  uint32_t ctas = 0;
  GemmTiles tiles;
  uint32_t* hookCounts = nullptr;
  int device = 0;
  uint32_t* report = nullptr;      ///< host-mapped timeout report of the device (8 words, shared, never freed)
  void* splitWorkspace = nullptr;  ///< split-K or stream-K: partial tiles + counters (owned, one allocation)
  ~Impl() {
    if (splitWorkspace != nullptr) cudaFree(splitWorkspace);  // no throw from a destructor
  }
};

namespace {

/// The host-mapped timeout report of `device`: allocated once per device and process and never freed.
/// Per plan it would cost a cudaHostAlloc and a cudaFreeHost (which synchronises the device) on every
/// mk::gemm() call, and a plan destroyed while its kernel still runs would leave the kernel a dangling
/// pointer. Plans of one device share it: it holds the first timeout on that device.
uint32_t* timeoutReportOf(int device) {
  static std::mutex mu;
  static std::map<int, uint32_t*> reports;
  std::lock_guard<std::mutex> lock(mu);
  uint32_t*& r = reports[device];
  if (r == nullptr) {
    MK_CUDA_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&r), 8 * sizeof(uint32_t), cudaHostAllocMapped));
    std::memset(r, 0, 8 * sizeof(uint32_t));
  }
  return r;
}

}  // namespace

namespace runtime {
// Declared in gemm_maps.hpp (shared with the compute lanes' per-op GemmParams blocks, gemm_lane.cpp).
device::GemmTensorMap encodeGemmMap2d(const void* base, uint64_t inner, uint64_t outer, uint64_t strideElems,
                                      uint32_t boxInner, uint32_t boxOuter, const char* name) {
  static_assert(sizeof(CUtensorMap) == sizeof(device::GemmTensorMap), "CUtensorMap is 128 bytes");
  CUtensorMap map;
  const cuuint64_t dims[2] = {inner, outer};
  const cuuint64_t strides[1] = {strideElems * 2};
  const cuuint32_t box[2] = {boxInner, boxOuter};
  const cuuint32_t elemStrides[2] = {1, 1};
  const CUresult r =
      runtime::tensorMapEncodeTiled()(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<void*>(base), dims, strides,
                                      box, elemStrides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                                      CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  runtime::checkDriver(r, (std::string("cuTensorMapEncodeTiled (gemm operand ") + name + ")").c_str());
  device::GemmTensorMap out;
  std::memcpy(&out, &map, sizeof(out));
  return out;
}
}  // namespace runtime

GemmPlan::GemmPlan(const GemmProblem& pr, const GemmConfig& cfg) {
  int dev = 0, sms = 0, major = 0, minor = 0;
  MK_CUDA_CHECK(cudaGetDevice(&dev));
  MK_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  MK_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
  MK_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
  const GemmTiles tiles = validateGemm(pr, cfg, sms);
  if (major != 9 || minor != 0)
    throw Error(ErrorCode::Unsupported, "gemm: the engine needs an sm_90 GPU (wgmma, TMA); device " +
                                            std::to_string(dev) + " is sm_" + std::to_string(major) +
                                            std::to_string(minor));
  runtime::prepareGemmKernels();

  auto impl = std::make_unique<Impl>();
  device::GemmParams& p = impl->params;
  const auto m = static_cast<uint64_t>(pr.m), n = static_cast<uint64_t>(pr.n), k = static_cast<uint64_t>(pr.k);
  p.mapA = runtime::encodeGemmMap2d(pr.a, k, m, static_cast<uint64_t>(pr.lda), GemmTileConfig::kBlockK,
                                    GemmTileConfig::kBlockM, "A");
  if (pr.layoutB == GemmLayout::RowMajor)
    p.mapB = runtime::encodeGemmMap2d(pr.b, n, k, static_cast<uint64_t>(pr.ldb), GemmTileConfig::kBoxN,
                                      GemmTileConfig::kBlockK, "B");
  else
    p.mapB = runtime::encodeGemmMap2d(pr.b, k, n, static_cast<uint64_t>(pr.ldb), GemmTileConfig::kBlockK,
                                      static_cast<uint32_t>(tiles.blockN), "B");
  p.c = pr.c;
  p.ldc = static_cast<uint64_t>(pr.ldc);
  p.m = static_cast<uint32_t>(m);
  p.n = static_cast<uint32_t>(n);
  p.k = static_cast<uint32_t>(k);
  p.tilesM = static_cast<uint32_t>(tiles.tilesM);
  p.tilesN = static_cast<uint32_t>(tiles.tilesN);
  p.blockN = static_cast<uint32_t>(tiles.blockN);
  p.kIters = static_cast<uint32_t>((k + GemmTileConfig::kBlockK - 1) / GemmTileConfig::kBlockK);
  p.groupM = static_cast<uint32_t>(cfg.groupM);
  p.out = pr.outDType == DType::Float32 ? device::GemmOut::Float32 : device::GemmOut::BFloat16;
  p.bRowMajor = pr.layoutB == GemmLayout::RowMajor ? 1u : 0u;
  p.tmaStoreC = tiles.epilogue == GemmEpilogue::TmaStore ? 1u : 0u;
  if (p.tmaStoreC) {
    // C as N x M bf16 with row stride ldc; 64 x 64 boxes in the 128-byte swizzle of the staging buffer.
    // TMA clips stores at the true N and M, which gives remainder tiles for free.
    p.mapC = runtime::encodeGemmMap2d(pr.c, n, m, static_cast<uint64_t>(pr.ldc), 64, 64, "C");
  }
  p.splitK = static_cast<uint32_t>(tiles.splitK);
  p.kItersPerSplit = static_cast<uint32_t>(tiles.kItersPerSplit);
  p.skTiles = static_cast<uint32_t>(tiles.streamKTiles);
  p.skCtas = static_cast<uint32_t>(tiles.streamKCtas);
  if (tiles.splitK > 1 || tiles.schedule == GemmSchedule::StreamK) {
    // One allocation: the fp32 partial tiles, then one counter per tile (zeroed once; the last unit of a
    // tile resets its counter, so every later launch starts from zero again). Split-K: a slot per piece of
    // every tile; stream-K: two slots per CTA (GemmStreamK::slot) and a counter per stream-K tile.
    const uint64_t tileBytes = GemmTileConfig::kBlockM * tiles.blockN * 4;
    const bool sk = tiles.schedule == GemmSchedule::StreamK;
    const uint64_t partialBytes = sk ? 2 * tiles.streamKCtas * tileBytes : tiles.count() * tiles.splitK * tileBytes;
    const uint64_t counterBytes = (sk ? tiles.streamKTiles : tiles.count()) * 4;
    MK_CUDA_CHECK(cudaMalloc(&impl->splitWorkspace, partialBytes + counterBytes));
    MK_CUDA_CHECK(cudaMemset(static_cast<uint8_t*>(impl->splitWorkspace) + partialBytes, 0, counterBytes));
    // The first run may be on a non-blocking stream, which does not wait for the legacy stream's memset.
    MK_CUDA_CHECK(cudaStreamSynchronize(nullptr));
    p.workspace = static_cast<float*>(impl->splitWorkspace);
    p.tileCounters = reinterpret_cast<uint32_t*>(static_cast<uint8_t*>(impl->splitWorkspace) + partialBytes);
  }
  impl->ctas = static_cast<uint32_t>(tiles.ctas);
  impl->tiles = tiles;
  impl->hookCounts = cfg.hookCounts;
  impl->device = dev;
  impl->report = timeoutReportOf(dev);
  MK_CUDA_CHECK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&p.timeoutReport), impl->report, 0));
  impl_ = impl.release();
}

GemmPlan::~GemmPlan() { delete impl_; }
GemmPlan::GemmPlan(GemmPlan&& o) noexcept : impl_(std::exchange(o.impl_, nullptr)) {}
GemmPlan& GemmPlan::operator=(GemmPlan&& o) noexcept {
  if (this != &o) {
    delete impl_;
    impl_ = std::exchange(o.impl_, nullptr);
  }
  return *this;
}

void GemmPlan::run(cudaStream_t stream) const {
  if (!impl_) throw Error(ErrorCode::InvalidArgument, "gemm: run() on a moved-from GemmPlan");
  int dev = 0;
  MK_CUDA_CHECK(cudaGetDevice(&dev));
  if (dev != impl_->device)
    throw Error(ErrorCode::InvalidArgument, "gemm: plan was made for device " + std::to_string(impl_->device) +
                                                " but device " + std::to_string(dev) + " is current");
  runtime::launchGemm(impl_->params, impl_->ctas, impl_->hookCounts, stream);
}

uint32_t GemmPlan::ctas() const { return impl_ ? impl_->ctas : 0; }
GemmTiles GemmPlan::tiles() const { return impl_ ? impl_->tiles : GemmTiles{}; }

std::string GemmPlan::timeoutReport() const {
  if (!impl_ || !impl_->report) return "";
  const volatile uint32_t* r = impl_->report;
  if (r[0] != 2) return "";
  return "gemm: CTA " + std::to_string(r[1]) + " thread " + std::to_string(r[2]) +
         (r[3] == 1 ? " (producer) waited for shared-memory stage "
                    : " (consumer) waited for the TMA loads of stage ") +
         std::to_string(r[4]) + " (phase parity " + std::to_string(r[5]) + ") of tile " + std::to_string(r[6]) +
         " for more than 10 s and trapped";
}

void gemm(const GemmProblem& problem, const GemmConfig& config, cudaStream_t stream) {
  GemmPlan(problem, config).run(stream);
}

}  // namespace mk
