// mkernel — cuBLASLt loaded at run time (dlopen libcublasLt.so.13, then .12), the GEMM baseline of
// mk-bench gemm and of the GEMM GPU tests. Only the few entry points a bf16 matmul needs, declared with
// cuBLASLt's stable C ABI, so nothing links against cuBLAS.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>

#include "mk/gemm.hpp"

namespace mkbench {

/// One cuBLASLt handle, a workspace on the current device, and a bf16 matmul in mk::GemmProblem's terms.
class CublasLt {
 public:
  /// Loads the library and creates a handle plus a 32 MiB workspace on the current device. Throws
  /// mk::Error(Unsupported) naming what was tried when no libcublasLt can be loaded.
  CublasLt();
  ~CublasLt();
  CublasLt(const CublasLt&) = delete;
  CublasLt& operator=(const CublasLt&) = delete;

  /// "13.0.0" (cublasLtGetVersion).
  std::string version() const { return version_; }
  /// Where the library came from.
  std::string path() const { return path_; }

  /// A planned matmul: descriptors and the heuristic's best algorithm for one problem.
  class Plan {
   public:
    Plan() = default;
    ~Plan();
    Plan(Plan&&) noexcept;
    Plan& operator=(Plan&&) noexcept;
    Plan(const Plan&) = delete;
    Plan& operator=(const Plan&) = delete;

   private:
    friend class CublasLt;
    void release();
    const CublasLt* lt_ = nullptr;
    void* op_ = nullptr;
    void* layoutA_ = nullptr;
    void* layoutB_ = nullptr;
    void* layoutC_ = nullptr;
    uint64_t algo_[8] = {};
    mk::GemmProblem problem_;
  };

  /// Same meaning as mk::gemm: C = A * B, bf16 in, fp32 compute, C bf16 or fp32, every matrix row-major
  /// except B when layoutB is ColMajor. Throws mk::Error when cuBLASLt has no algorithm for it.
  Plan plan(const mk::GemmProblem& problem) const;
  /// Enqueue on `stream`.
  void run(const Plan& plan, cudaStream_t stream) const;

 private:
  void check(int status, const char* what) const;
  struct Api;
  void* lib_ = nullptr;
  Api* api_ = nullptr;
  void* handle_ = nullptr;
  void* workspace_ = nullptr;
  std::size_t workspaceBytes_ = 0;
  std::string version_, path_;
};

}  // namespace mkbench
