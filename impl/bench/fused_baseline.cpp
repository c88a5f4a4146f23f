// mk-bench gemm-rs | ag-gemm | gemm-ar — the unfused program with NCCL (fused_baseline.hpp).
#include "fused_baseline.hpp"

#include <memory>
#include <set>

#include "cublaslt_loader.hpp"
#include "mk/cuda_check.hpp"
#include "mk/error.hpp"
#include "nccl_loader.hpp"

namespace mkbench {

NcclBaseline timeCublasThenNccl(const std::vector<int>& devs, Streams& st, const std::vector<mk::GemmProblem>& gemms,
                                const BaselineCollective& coll, const BaselineTiming& timing) {
  const std::size_t n = devs.size();
  if (gemms.size() != n || coll.send.size() != n || coll.recv.size() != n || st.s.size() != n)
    throw mk::Error(mk::ErrorCode::InvalidArgument, "NCCL baseline: one GEMM, buffer pair and stream per rank");
  if (std::set<int>(devs.begin(), devs.end()).size() != n)
    throw mk::Error(mk::ErrorCode::Unsupported, "NCCL baseline: NCCL needs one GPU per rank (ranks share GPUs here)");
  // One cuBLASLt handle per GPU (a handle and its workspace belong to the device current at creation).
  std::vector<std::unique_ptr<CublasLt>> lts;
  std::vector<CublasLt::Plan> plans;
  for (std::size_t r = 0; r < n; ++r) {
    MK_CUDA_CHECK(cudaSetDevice(devs[r]));
    lts.push_back(std::make_unique<CublasLt>());
    plans.push_back(lts[r]->plan(gemms[r]));
  }
  Nccl nccl(devs);
  auto gemmAll = [&] {
    for (std::size_t r = 0; r < n; ++r) {
      MK_CUDA_CHECK(cudaSetDevice(devs[r]));
      lts[r]->run(plans[r], st.s[r]);
    }
  };
  auto collAll = [&] {
    nccl.run(coll.op, coll.send, coll.recv, coll.count, mk::DType::BFloat16, mk::RedOp::Sum, 0, st.s);
  };
  auto time = [&](const auto& body) {
    for (uint64_t i = 0; i < timing.warmup; ++i) body();
    st.sync();
    std::vector<double> samples;
    for (uint64_t rep = 0; rep < timing.reps; ++rep) {
      st.recordStart();
      for (uint64_t i = 0; i < timing.iters; ++i) body();
      samples.push_back(st.recordStopAndElapsedMs() * 1e3 / static_cast<double>(timing.iters));
    }
    return median(samples);
  };
  NcclBaseline out;
  out.ncclVersion = nccl.version();
  out.cublasVersion = lts[0]->version();
  out.gemmUs = time(gemmAll);
  out.collUs = time(collAll);
  out.sequentialUs = time([&] {
    if (coll.first) collAll();
    gemmAll();
    if (!coll.first) collAll();
  });
  return out;
}

}  // namespace mkbench
