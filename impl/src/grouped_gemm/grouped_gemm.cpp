// mkernel — the grouped GEMM engine's host side: refuse what it cannot run, encode the tensor maps (A over the stacked
// rows, one per B_g into a device array), fill GroupedGemmParams and launch (kernels/grouped_gemm.cu).
#include "mk/grouped_gemm.hpp"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "gemm/gemm_maps.hpp"
#include "grouped_gemm/grouped_gemm_launch.hpp"
#include "mk/cuda_check.hpp"
#include "mk/error.hpp"

namespace mk {
namespace {

using Cfg = device::GroupedGemmTileConfig;
static_assert(kGroupedGemmMaxGroups == device::kGroupedGemmMaxGroups, "one group limit, host and device");
static_assert(kGroupedGemmMaxGroupsTmaStore == device::kGroupedGemmMaxGroupsTmaStore, "one TMA-store group limit");

// The tile list and every row index are 32-bit on the device (registers), TMA coordinates int32.
constexpr int64_t kMaxIndex = (int64_t{1} << 31) - 1;
constexpr int64_t kMaxStrideBytes = int64_t{1} << 40;  // TMA strides

std::string s(int64_t v) { return std::to_string(v); }

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

/// "" or why leading dimension `ld` (name) is not >= minLd (minName) and a multiple of 8 elements below 2^40 bytes.
std::string ldProblem(int64_t ld, int64_t minLd, int64_t elemBytes, const char* name, const char* minName) {
  if (ld < minLd) return std::string(name) + " must be >= " + minName + " = " + s(minLd) + " (got " + s(ld) + ")";
  if (ld % 8 != 0) return std::string(name) + " must be a multiple of 8 elements (16-byte aligned rows), got " + s(ld);
  if (ld * elemBytes >= kMaxStrideBytes) return std::string(name) + " is too large for TMA (stride >= 2^40 bytes)";
  return "";
}

int64_t ceilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

/// Tiles the kernel can meet at most: every group at its bound (Strided), or the rows' bound cut at G - 1 group
/// boundaries (Packed: each boundary adds at most one partial tile row).
int64_t tileBound(const GroupedGemmProblem& pr) {
  const int64_t tilesN = ceilDiv(pr.n, Cfg::kBlockN);
  if (pr.rowLayout == GroupedRowLayout::Strided) return pr.groups * ceilDiv(pr.maxRows, Cfg::kBlockM) * tilesN;
  return (ceilDiv(pr.maxRows, Cfg::kBlockM) + pr.groups - 1) * tilesN;
}

}  // namespace

const char* toString(GroupedRowLayout layout) noexcept {
  return layout == GroupedRowLayout::Packed ? "packed" : "strided";
}

GemmEpilogue groupedGemmEpilogue(const GroupedGemmProblem& pr, const GroupedGemmConfig& cfg) {
  // TMA stores clip at the map's n: with n not a multiple of 8 a bf16 store wrote past it (docs/gemm.md), so those
  // run direct, as fp32 output (the staging buffer holds bf16) and SwiGLU (see grouped_gemm_device.hpp) do.
  const bool fits =
      pr.outDType == DType::BFloat16 && !pr.swiglu && pr.n % 8 == 0 && pr.groups <= kGroupedGemmMaxGroupsTmaStore;
  return cfg.epilogue == GemmEpilogue::TmaStore && fits ? GemmEpilogue::TmaStore : GemmEpilogue::Direct;
}

int64_t groupedGemmRows(const GroupedGemmProblem& pr) {
  return pr.rowLayout == GroupedRowLayout::Strided ? pr.groups * pr.maxRows : pr.maxRows;
}

std::string groupedGemmProblem(const GroupedGemmProblem& pr, const GroupedGemmConfig& cfg) {
  if (pr.groups < 1 || pr.groups > kGroupedGemmMaxGroups)
    return "groups must be in [1, " + s(kGroupedGemmMaxGroups) + "] (got " + s(pr.groups) + ")";
  if (pr.n < 1 || pr.n > kMaxIndex) return "n must be in [1, 2^31) (got " + s(pr.n) + ")";
  if (pr.k < 1 || pr.k > kMaxIndex) return "k must be in [1, 2^31) (got " + s(pr.k) + ")";
  if (pr.swiglu && pr.n % 2 != 0)
    return "swiglu needs an even n (interleaved gate / up column pairs), got n = " + s(pr.n);
  if (pr.rowLayout != GroupedRowLayout::Strided && pr.rowLayout != GroupedRowLayout::Packed)
    return "rowLayout must be Strided or Packed (got value " + s(static_cast<int>(pr.rowLayout)) + ")";
  if (pr.maxRows < 1 || pr.maxRows > kMaxIndex) return "maxRows must be in [1, 2^31) (got " + s(pr.maxRows) + ")";
  if (groupedGemmRows(pr) > kMaxIndex)
    return "groups x maxRows must be < 2^31 rows (got " + s(pr.groups) + " x " + s(pr.maxRows) + ")";
  if (tileBound(pr) > kMaxIndex) return "the problem has too many tiles (>= 2^31) for the 32-bit tile list";
  if (pr.outDType != DType::BFloat16 && pr.outDType != DType::Float32)
    return "outDType must be bfloat16 or float32 (got " + std::string(toString(pr.outDType)) + ")";
  if (pr.layoutB != GemmLayout::RowMajor && pr.layoutB != GemmLayout::ColMajor)
    return "layoutB must be RowMajor or ColMajor (got value " + s(static_cast<int>(pr.layoutB)) + ")";
  if (pr.rowCounts == nullptr) return "rowCounts is null (a device array of groups int32 counts)";
  if (reinterpret_cast<uintptr_t>(pr.rowCounts) % 4 != 0) return "rowCounts must be 4-byte aligned";
  if (pr.a == nullptr) return "a is null";
  if (!aligned16(pr.a)) return "a must be 16-byte aligned (TMA)";
  if (pr.c == nullptr) return "c is null";
  if (!aligned16(pr.c)) return "c must be 16-byte aligned";
  if (pr.b == nullptr) return "b is null (a host array of groups device pointers)";
  for (int64_t g = 0; g < pr.groups; ++g) {
    if (pr.b[g] == nullptr) return "b[" + s(g) + "] is null";
    if (!aligned16(pr.b[g])) return "b[" + s(g) + "] must be 16-byte aligned (TMA)";
  }
  std::string why = ldProblem(pr.lda, pr.k, 2, "lda", "k");
  if (why.empty())
    why = pr.layoutB == GemmLayout::RowMajor ? ldProblem(pr.ldb, pr.n, 2, "ldb", "n (B row-major, K x N)")
                                             : ldProblem(pr.ldb, pr.k, 2, "ldb", "k (B column-major)");
  if (why.empty())
    why = ldProblem(pr.ldc, pr.swiglu ? pr.n / 2 : pr.n, pr.outDType == DType::Float32 ? 4 : 2, "ldc",
                    pr.swiglu ? "n / 2 (swiglu)" : "n");
  if (!why.empty()) return why;
  if (cfg.ctas < 0) return "ctas must be >= 0 (0 = every SM), got " + s(cfg.ctas);
  if (cfg.groupM < 1 || cfg.groupM > 65535) return "groupM must be in [1, 65535] (got " + s(cfg.groupM) + ")";
  if (cfg.epilogue != GemmEpilogue::Direct && cfg.epilogue != GemmEpilogue::TmaStore)
    return "epilogue must be Direct or TmaStore (got value " + s(static_cast<int>(cfg.epilogue)) + ")";
  return "";
}

namespace runtime {

device::GroupedGemmParams groupedGemmDeviceParams(const GroupedGemmProblem& pr, const GroupedGemmConfig& cfg,
                                                  std::vector<device::GemmTensorMap>* mapsB) {
  device::GroupedGemmParams p{};
  device::GemmParams& g = p.gemm;
  const auto rows = static_cast<uint64_t>(groupedGemmRows(pr));
  const auto n = static_cast<uint64_t>(pr.n), k = static_cast<uint64_t>(pr.k);
  g.mapA = encodeGemmMap2d(pr.a, k, rows, static_cast<uint64_t>(pr.lda), Cfg::kBlockK, Cfg::kBlockM, "A");
  mapsB->assign(static_cast<size_t>(pr.groups), device::GemmTensorMap{});
  for (int64_t grp = 0; grp < pr.groups; ++grp) {
    const std::string name = "B[" + s(grp) + "]";
    if (pr.layoutB == GemmLayout::RowMajor)
      (*mapsB)[grp] =
          encodeGemmMap2d(pr.b[grp], n, k, static_cast<uint64_t>(pr.ldb), Cfg::kBoxN, Cfg::kBlockK, name.c_str());
    else
      (*mapsB)[grp] =
          encodeGemmMap2d(pr.b[grp], k, n, static_cast<uint64_t>(pr.ldb), Cfg::kBlockK, Cfg::kBlockN, name.c_str());
  }
  g.c = pr.c;
  g.ldc = static_cast<uint64_t>(pr.ldc);
  g.m = static_cast<uint32_t>(rows);
  g.n = static_cast<uint32_t>(n);
  g.k = static_cast<uint32_t>(k);
  g.tilesN = static_cast<uint32_t>(ceilDiv(pr.n, Cfg::kBlockN));
  g.blockN = Cfg::kBlockN;
  g.kIters = static_cast<uint32_t>(ceilDiv(pr.k, Cfg::kBlockK));
  g.groupM = static_cast<uint32_t>(cfg.groupM);
  g.out = pr.outDType == DType::Float32 ? device::GemmOut::Float32 : device::GemmOut::BFloat16;
  g.bRowMajor = pr.layoutB == GemmLayout::RowMajor ? 1u : 0u;
  if (groupedGemmEpilogue(pr, cfg) == GemmEpilogue::TmaStore) {
    // C as n x rows bf16 with row stride ldc, 64 x 64 boxes in the staging buffer's 128-byte swizzle: only blocks of
    // 64 rows wholly inside a group are stored through it.
    g.tmaStoreC = 1;
    g.mapC = encodeGemmMap2d(pr.c, n, rows, static_cast<uint64_t>(pr.ldc), 64, 64, "C");
  }
  g.splitK = 1;
  g.kItersPerSplit = g.kIters;
  g.timeoutReport = nullptr;
  p.mapsB = nullptr;
  p.rowCounts = pr.rowCounts;
  p.groups = static_cast<uint32_t>(pr.groups);
  p.rowStride = static_cast<uint32_t>(pr.rowLayout == GroupedRowLayout::Strided ? pr.maxRows : 0);
  p.rows = pr.rowLayout == GroupedRowLayout::Packed ? device::GroupedRows::Packed : device::GroupedRows::Strided;
  p.swiglu = pr.swiglu ? 1u : 0u;
  return p;
}

}  // namespace runtime

struct GroupedGemmPlan::Impl {
  device::GroupedGemmParams params{};
  uint32_t ctas = 0;
  int device = 0;
  GemmEpilogue epilogue = GemmEpilogue::Direct;
  device::GemmTensorMap* mapsB = nullptr;  ///< device array of the B_g maps (owned, from the stream-ordered pool)
  /// The plan's own stream: the maps are allocated, written and freed on it, so neither the plan nor its end waits
  /// for the whole device (cudaMalloc / cudaFree do, and beside a resident kernel that wait never ends).
  cudaStream_t stream = nullptr;
  ~Impl() {  // no throw from a destructor
    if (mapsB != nullptr) cudaFreeAsync(mapsB, stream);
    if (stream != nullptr) {
      cudaStreamSynchronize(stream);
      cudaStreamDestroy(stream);
    }
  }
};

GroupedGemmPlan::GroupedGemmPlan(const GroupedGemmProblem& pr, const GroupedGemmConfig& cfg) {
  const std::string why = groupedGemmProblem(pr, cfg);
  if (!why.empty()) throw Error(ErrorCode::InvalidArgument, "groupedGemm: " + why);
  int dev = 0, sms = 0, major = 0, minor = 0;
  MK_CUDA_CHECK(cudaGetDevice(&dev));
  MK_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  MK_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
  MK_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
  if (cfg.ctas > sms)
    throw Error(ErrorCode::InvalidArgument, "groupedGemm: ctas must be <= the SM count " + s(sms) +
                                                " (one CTA per SM at most), got " + s(cfg.ctas));
  if (major != 9 || minor != 0)
    throw Error(ErrorCode::Unsupported, "groupedGemm: the engine needs an sm_90 GPU (wgmma, TMA); device " + s(dev) +
                                            " is sm_" + s(major) + s(minor));

  auto impl = std::make_unique<Impl>();
  std::vector<device::GemmTensorMap> maps;
  impl->params = runtime::groupedGemmDeviceParams(pr, cfg, &maps);
  device::GroupedGemmParams& p = impl->params;
  const size_t mapBytes = maps.size() * sizeof(device::GemmTensorMap);
  MK_CUDA_CHECK(cudaStreamCreateWithFlags(&impl->stream, cudaStreamNonBlocking));
  MK_CUDA_CHECK(cudaMallocAsync(reinterpret_cast<void**>(&impl->mapsB), mapBytes, impl->stream));
  // Waited for here: the maps are in place before any run (on any stream) reads them.
  MK_CUDA_CHECK(cudaMemcpyAsync(impl->mapsB, maps.data(), mapBytes, cudaMemcpyHostToDevice, impl->stream));
  MK_CUDA_CHECK(cudaStreamSynchronize(impl->stream));
  p.mapsB = impl->mapsB;
  if (cfg.timeoutReport != nullptr)
    MK_CUDA_CHECK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&p.gemm.timeoutReport), cfg.timeoutReport, 0));
  impl->epilogue = groupedGemmEpilogue(pr, cfg);
  const int64_t ctas = cfg.ctas == 0 ? sms : cfg.ctas;
  impl->ctas = static_cast<uint32_t>(std::min(ctas, tileBound(pr)));
  impl->device = dev;
  impl_ = impl.release();
}

GroupedGemmPlan::~GroupedGemmPlan() { delete impl_; }
GroupedGemmPlan::GroupedGemmPlan(GroupedGemmPlan&& o) noexcept : impl_(std::exchange(o.impl_, nullptr)) {}
GroupedGemmPlan& GroupedGemmPlan::operator=(GroupedGemmPlan&& o) noexcept {
  if (this != &o) {
    delete impl_;
    impl_ = std::exchange(o.impl_, nullptr);
  }
  return *this;
}

void GroupedGemmPlan::run(cudaStream_t stream) const {
  if (!impl_) throw Error(ErrorCode::InvalidArgument, "groupedGemm: run() on a moved-from GroupedGemmPlan");
  int dev = 0;
  MK_CUDA_CHECK(cudaGetDevice(&dev));
  if (dev != impl_->device)
    throw Error(ErrorCode::InvalidArgument,
                "groupedGemm: plan was made for device " + s(impl_->device) + " but device " + s(dev) + " is current");
  runtime::launchGroupedGemm(impl_->params, impl_->ctas, stream);
}

uint32_t GroupedGemmPlan::ctas() const { return impl_ ? impl_->ctas : 0; }
GemmEpilogue GroupedGemmPlan::epilogue() const { return impl_ ? impl_->epilogue : GemmEpilogue::Direct; }

void groupedGemm(const GroupedGemmProblem& problem, const GroupedGemmConfig& config, cudaStream_t stream) {
  GroupedGemmPlan plan(problem, config);
  plan.run(stream);
  // The plan's map array is read by the kernel: free it only once the kernel has finished.
  MK_CUDA_CHECK(cudaStreamSynchronize(stream));
}

}  // namespace mk
