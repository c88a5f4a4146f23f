#include "cublaslt_loader.hpp"

#include <dlfcn.h>
#include <link.h>

#include <string>
#include <utility>

#include "mk/cuda_check.hpp"
#include "mk/error.hpp"

namespace mkbench {

// cuBLASLt's C ABI (cublasLt.h, stable since CUDA 11): opaque handles, int enums, a 64-byte algo blob.
namespace {
constexpr int kCudaR32F = 0;          // cudaDataType CUDA_R_32F
constexpr int kCudaR16BF = 14;        // CUDA_R_16BF
constexpr int kComputeF32 = 68;       // cublasComputeType_t CUBLAS_COMPUTE_32F
constexpr int kDescTransA = 3;        // CUBLASLT_MATMUL_DESC_TRANSA
constexpr int kDescTransB = 4;        // CUBLASLT_MATMUL_DESC_TRANSB
constexpr int kPrefMaxWorkspace = 1;  // CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES
constexpr int kOpN = 0, kOpT = 1;     // cublasOperation_t
constexpr std::size_t kWorkspaceBytes = 32u << 20;

struct HeuristicResult {  // cublasLtMatmulHeuristicResult_t
  uint64_t algo[8];
  std::size_t workspaceSize;
  int state;
  float wavesCount;
  int reserved[4];
};
static_assert(sizeof(HeuristicResult) == 96, "cublasLtMatmulHeuristicResult_t is 96 bytes");

template <class Fn>
void sym(void* lib, const char* name, Fn& out) {
  void* p = dlsym(lib, name);
  if (!p) throw mk::Error(mk::ErrorCode::Unsupported, std::string("libcublasLt has no symbol ") + name);
  out = reinterpret_cast<Fn>(p);
}
}  // namespace

struct CublasLt::Api {
  int (*create)(void**);
  int (*destroy)(void*);
  std::size_t (*getVersion)();
  int (*descCreate)(void**, int, int);
  int (*descDestroy)(void*);
  int (*descSetAttribute)(void*, int, const void*, std::size_t);
  int (*layoutCreate)(void**, int, uint64_t, uint64_t, int64_t);
  int (*layoutDestroy)(void*);
  int (*prefCreate)(void**);
  int (*prefDestroy)(void*);
  int (*prefSetAttribute)(void*, int, const void*, std::size_t);
  int (*heuristic)(void*, void*, void*, void*, void*, void*, void*, int, HeuristicResult*, int*);
  int (*matmul)(void*, void*, const void*, const void*, void*, const void*, void*, const void*, const void*, void*,
                void*, void*, const void*, void*, std::size_t, cudaStream_t);
};

CublasLt::CublasLt() {
  const char* names[] = {"libcublasLt.so.13", "libcublasLt.so.12"};
  std::string tried;
  for (const char* n : names) {
    lib_ = dlopen(n, RTLD_NOW | RTLD_LOCAL);
    if (lib_) break;
    tried += std::string(tried.empty() ? "" : "; ") + dlerror();
  }
  if (!lib_)
    throw mk::Error(mk::ErrorCode::Unsupported,
                    "cannot load libcublasLt.so.13 or .so.12 (" + tried +
                        "): put cuBLAS's lib directory on LD_LIBRARY_PATH (torch's wheel has it under "
                        "site-packages/nvidia/cublas/lib)");
  api_ = new Api{};
  try {
    sym(lib_, "cublasLtCreate", api_->create);
    sym(lib_, "cublasLtDestroy", api_->destroy);
    sym(lib_, "cublasLtGetVersion", api_->getVersion);
    sym(lib_, "cublasLtMatmulDescCreate", api_->descCreate);
    sym(lib_, "cublasLtMatmulDescDestroy", api_->descDestroy);
    sym(lib_, "cublasLtMatmulDescSetAttribute", api_->descSetAttribute);
    sym(lib_, "cublasLtMatrixLayoutCreate", api_->layoutCreate);
    sym(lib_, "cublasLtMatrixLayoutDestroy", api_->layoutDestroy);
    sym(lib_, "cublasLtMatmulPreferenceCreate", api_->prefCreate);
    sym(lib_, "cublasLtMatmulPreferenceDestroy", api_->prefDestroy);
    sym(lib_, "cublasLtMatmulPreferenceSetAttribute", api_->prefSetAttribute);
    sym(lib_, "cublasLtMatmulAlgoGetHeuristic", api_->heuristic);
    sym(lib_, "cublasLtMatmul", api_->matmul);
    const std::size_t v = api_->getVersion();
    version_ = std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." + std::to_string(v % 100);
    link_map* lm = nullptr;
    if (dlinfo(lib_, RTLD_DI_LINKMAP, &lm) == 0 && lm && lm->l_name) path_ = lm->l_name;
    check(api_->create(&handle_), "cublasLtCreate");
    MK_CUDA_CHECK(cudaMalloc(&workspace_, kWorkspaceBytes));
    workspaceBytes_ = kWorkspaceBytes;
  } catch (...) {
    if (handle_) api_->destroy(handle_);
    delete api_;
    api_ = nullptr;
    dlclose(lib_);
    lib_ = nullptr;
    throw;
  }
}

CublasLt::~CublasLt() {
  if (workspace_) cudaFree(workspace_);
  if (api_ && handle_) api_->destroy(handle_);
  delete api_;
}

void CublasLt::check(int status, const char* what) const {
  if (status != 0)
    throw mk::Error(mk::ErrorCode::Internal, std::string(what) + " failed: cublasStatus_t " + std::to_string(status));
}

CublasLt::Plan::~Plan() { release(); }
CublasLt::Plan::Plan(Plan&& o) noexcept { *this = std::move(o); }
CublasLt::Plan& CublasLt::Plan::operator=(Plan&& o) noexcept {
  if (this != &o) {
    release();
    lt_ = std::exchange(o.lt_, nullptr);
    op_ = std::exchange(o.op_, nullptr);
    layoutA_ = std::exchange(o.layoutA_, nullptr);
    layoutB_ = std::exchange(o.layoutB_, nullptr);
    layoutC_ = std::exchange(o.layoutC_, nullptr);
    for (int i = 0; i < 8; ++i) algo_[i] = o.algo_[i];
    problem_ = o.problem_;
  }
  return *this;
}
void CublasLt::Plan::release() {
  if (!lt_) return;
  if (op_) lt_->api_->descDestroy(op_);
  if (layoutA_) lt_->api_->layoutDestroy(layoutA_);
  if (layoutB_) lt_->api_->layoutDestroy(layoutB_);
  if (layoutC_) lt_->api_->layoutDestroy(layoutC_);
  lt_ = nullptr;
  op_ = layoutA_ = layoutB_ = layoutC_ = nullptr;
}

// Row-major C = A * B is column-major C^T = B^T * A^T: cuBLAS's "A" is our B and its "B" is our A. Our
// row-major A read column-major is A^T (K x M, ld lda) already; our B is B^T when row-major (N x K, ld ldb)
// and needs op T when column-major (stored K x N, ld ldb).
CublasLt::Plan CublasLt::plan(const mk::GemmProblem& pr) const {
  Plan p;
  p.lt_ = this;
  p.problem_ = pr;
  const auto m = static_cast<uint64_t>(pr.m), n = static_cast<uint64_t>(pr.n), k = static_cast<uint64_t>(pr.k);
  check(api_->descCreate(&p.op_, kComputeF32, kCudaR32F), "cublasLtMatmulDescCreate");
  const int opA = pr.layoutB == mk::GemmLayout::ColMajor ? kOpT : kOpN, opB = kOpN;
  check(api_->descSetAttribute(p.op_, kDescTransA, &opA, sizeof(opA)), "cublasLtMatmulDescSetAttribute(TRANSA)");
  check(api_->descSetAttribute(p.op_, kDescTransB, &opB, sizeof(opB)), "cublasLtMatmulDescSetAttribute(TRANSB)");
  if (pr.layoutB == mk::GemmLayout::ColMajor)
    check(api_->layoutCreate(&p.layoutA_, kCudaR16BF, k, n, pr.ldb), "cublasLtMatrixLayoutCreate(B)");
  else
    check(api_->layoutCreate(&p.layoutA_, kCudaR16BF, n, k, pr.ldb), "cublasLtMatrixLayoutCreate(B)");
  check(api_->layoutCreate(&p.layoutB_, kCudaR16BF, k, m, pr.lda), "cublasLtMatrixLayoutCreate(A)");
  const int outType = pr.outDType == mk::DType::Float32 ? kCudaR32F : kCudaR16BF;
  check(api_->layoutCreate(&p.layoutC_, outType, n, m, pr.ldc), "cublasLtMatrixLayoutCreate(C)");
  void* pref = nullptr;
  check(api_->prefCreate(&pref), "cublasLtMatmulPreferenceCreate");
  const uint64_t ws = workspaceBytes_;
  int status = api_->prefSetAttribute(pref, kPrefMaxWorkspace, &ws, sizeof(ws));
  HeuristicResult result{};
  int found = 0;
  if (status == 0)
    status = api_->heuristic(handle_, p.op_, p.layoutA_, p.layoutB_, p.layoutC_, p.layoutC_, pref, 1, &result, &found);
  api_->prefDestroy(pref);
  check(status, "cublasLtMatmulAlgoGetHeuristic");
  if (found < 1)
    throw mk::Error(mk::ErrorCode::Unsupported, "cuBLASLt has no algorithm for gemm m=" + std::to_string(m) +
                                                    " n=" + std::to_string(n) + " k=" + std::to_string(k));
  for (int i = 0; i < 8; ++i) p.algo_[i] = result.algo[i];
  return p;
}

void CublasLt::run(const Plan& p, cudaStream_t stream) const {
  const float alpha = 1.0f, beta = 0.0f;
  check(api_->matmul(handle_, p.op_, &alpha, p.problem_.b, p.layoutA_, p.problem_.a, p.layoutB_, &beta, p.problem_.c,
                     p.layoutC_, p.problem_.c, p.layoutC_, p.algo_, workspace_, workspaceBytes_, stream),
        "cublasLtMatmul");
}

}  // namespace mkbench
