// mkernel — the grouped GEMM engine on one GPU (mk/device/grouped_gemm_device.hpp), launched on its own: the expert
// GEMMs of a MoE layer, C_g = A_g * B_g for every group (expert) g < G in one kernel, each group's row count a
// runtime value in device memory, with an optional SwiGLU epilogue (the `grouped-gemm` step kind's contract,
// docs/schedule-format.md, and docs/grouped-gemm.md).
//
// Layout: A (bf16, row-major, lda) and C (row-major, ldc) hold the groups' rows stacked. Group g's rows start at
// g x maxRows (Strided: fixed-capacity blocks, the schedule IR's layout: "offsets stay those of the bound") or at the
// sum of the counts of the groups before it (Packed: computed in the kernel from the counts, no offset array). B_g
// (bf16) is one pointer per group, row-major K x N or column-major (N x K row-major), as the GEMM engine reads it.
//
// Alignment (TMA and pair stores): A, every B_g and C 16-byte aligned; lda, ldb, ldc multiples of 8 elements.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>

#include "mk/gemm.hpp"
#include "mk/schedule/types.hpp"

namespace mk {

/// Where group g's rows start in A and C.
enum class GroupedRowLayout : uint8_t {
  Strided = 0,  ///< at g x maxRows; each count is at most maxRows
  Packed = 1,   ///< at rowCounts[0] + ... + rowCounts[g - 1]; their sum is at most maxRows
};

/// "strided" / "packed".
const char* toString(GroupedRowLayout layout) noexcept;

/// Most groups one grouped GEMM takes.
constexpr int64_t kGroupedGemmMaxGroups = 1024;
/// Most groups the TMA-store epilogue takes (its staging buffer leaves shared memory for a table of 160 groups);
/// more run the direct epilogue.
constexpr int64_t kGroupedGemmMaxGroupsTmaStore = 160;

/// One grouped GEMM. Signed sizes so that a negative value is reported, not wrapped.
struct GroupedGemmProblem {
  int64_t groups = 0;  ///< G, in [1, kGroupedGemmMaxGroups]
  int64_t n = 0;       ///< columns of every B_g (2F with swiglu: gate / up pairs interleaved at 2f, 2f + 1)
  int64_t k = 0;       ///< columns of A, rows of B_g
  GroupedRowLayout rowLayout = GroupedRowLayout::Strided;  ///< where each group's rows start
  /// The static row bound, used for the tensor maps and the grid: Strided, the rows of each group's block (the
  /// bound of every count; A and C hold groups x maxRows rows); Packed, the rows A and C hold (the bound of the sum).
  int64_t maxRows = 0;
  /// Device array of `groups` int32 row counts, read by the kernel when it starts (the runtime extent). A negative
  /// count reads as 0; a count past the bound is clamped to it (no access outside A and C), never an error: the
  /// caller's layout step keeps them within it.
  const int32_t* rowCounts = nullptr;
  const void* a = nullptr;                    ///< bf16, row-major, lda >= k
  int64_t lda = 0;                            ///< elements between rows of A
  const void* const* b = nullptr;             ///< host array of `groups` device pointers to the B_g (bf16)
  int64_t ldb = 0;                            ///< RowMajor: >= n; ColMajor: >= k
  GemmLayout layoutB = GemmLayout::RowMajor;  ///< how every B_g is stored
  void* c = nullptr;                          ///< output, row-major, ldc >= n (n / 2 with swiglu)
  int64_t ldc = 0;                            ///< elements between rows of C
  DType outDType = DType::BFloat16;           ///< BFloat16 or Float32
  /// C[i][f] = silu(acc[i][2f]) * acc[i][2f + 1] in fp32, rounded once (C n / 2 wide; n even).
  bool swiglu = false;
};

/// How to run it.
struct GroupedGemmConfig {
  int64_t ctas = 0;    ///< CTAs of the persistent grid, one per SM at most; 0 = every SM (never more than the tiles)
  int64_t groupM = 8;  ///< tile rows per raster band inside a group (L2 reuse of B_g's column panels), >= 1
  /// Epilogue variant (docs/grouped-gemm.md, "Epilogue"). TmaStore (the default, as for the GEMM engine) runs for bf16
  /// output without swiglu, n a multiple of 8 and at most kGroupedGemmMaxGroupsTmaStore groups; Direct otherwise
  /// (groupedGemmEpilogue says which runs).
  GemmEpilogue epilogue = GemmEpilogue::TmaStore;
  /// Host-mapped, 8 words zeroed (optional): receives who waited for what if a device wait times out (10 s).
  uint32_t* timeoutReport = nullptr;
};

/// Why the grouped GEMM engine cannot run `problem` with `config` ("" when it can): each reason names the argument
/// (groups, n, k, maxRows, a null or misaligned pointer, a leading dimension, outDType, layoutB, swiglu with odd n,
/// ctas, groupM, epilogue, a size TMA or the 32-bit tile list cannot address). Reads no device memory; needs no GPU.
std::string groupedGemmProblem(const GroupedGemmProblem& problem, const GroupedGemmConfig& config = {});

/// The epilogue that runs for `problem` with `config` (config.epilogue, or Direct where TmaStore does not apply).
GemmEpilogue groupedGemmEpilogue(const GroupedGemmProblem& problem, const GroupedGemmConfig& config);

/// Rows A and C must hold: groups x maxRows (Strided) or maxRows (Packed).
int64_t groupedGemmRows(const GroupedGemmProblem& problem);

/// A validated grouped GEMM for the current CUDA device: the tensor maps (A, and one per B_g in a device array the
/// plan owns) encoded once, run many times with whatever counts rowCounts holds at each run. The caller owns A, the
/// B_g, C and rowCounts, which must outlive every run; destroy the plan only after its runs have finished. Neither
/// creating nor destroying a plan waits for the whole device (its map array lives in the stream-ordered pool, on
/// the plan's own stream), so plans come and go beside a communicator's resident kernel.
class GroupedGemmPlan {
 public:
  /// Throws Error(InvalidArgument) with groupedGemmProblem's reason (prefixed "groupedGemm: ") before any device
  /// work, Error(Unsupported) on a GPU other than sm_90, Error(CudaError) when the driver refuses a map.
  GroupedGemmPlan(const GroupedGemmProblem& problem, const GroupedGemmConfig& config = {});
  ~GroupedGemmPlan();
  GroupedGemmPlan(GroupedGemmPlan&&) noexcept;
  GroupedGemmPlan& operator=(GroupedGemmPlan&&) noexcept;
  GroupedGemmPlan(const GroupedGemmPlan&) = delete;
  GroupedGemmPlan& operator=(const GroupedGemmPlan&) = delete;

  /// Enqueue the grouped GEMM on `stream` (asynchronous; launch errors throw Error(CudaError)).
  void run(cudaStream_t stream) const;
  /// CTAs the kernel is launched with.
  uint32_t ctas() const;
  /// The epilogue that runs (groupedGemmEpilogue).
  GemmEpilogue epilogue() const;

 private:
  struct Impl;
  Impl* impl_ = nullptr;
};

/// Plan and run once (convenience: the plan's map array is freed when this returns, which waits for the device).
void groupedGemm(const GroupedGemmProblem& problem, const GroupedGemmConfig& config, cudaStream_t stream);

}  // namespace mk
