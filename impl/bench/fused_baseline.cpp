// mk-bench gemm-rs | ag-gemm | gemm-ar — the unfused program with NCCL or mkernel's collective (fused_baseline.hpp).
#include "fused_baseline.hpp"

#include <memory>
#include <set>

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
  auto time = [&](const auto& body) { return timeLoopUs(timing, st, false, body); };
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

void submitEngineCollective(mk::Communicator& comm, const BaselineCollective& coll, std::size_t r,
                            cudaStream_t stream) {
  const mk::DType bf16 = mk::DType::BFloat16;
  switch (coll.op) {
    case mk::CollOp::AllGather: comm.allGather(coll.send[r], coll.recv[r], coll.count, bf16, stream); break;
    case mk::CollOp::AllReduce:
      comm.allReduce(coll.send[r], coll.recv[r], coll.count, bf16, mk::RedOp::Sum, stream);
      break;
    case mk::CollOp::ReduceScatter:
      comm.reduceScatter(coll.send[r], coll.recv[r], coll.count, bf16, mk::RedOp::Sum, stream);
      break;
    case mk::CollOp::Broadcast:
    case mk::CollOp::AllToAll:
      throw mk::Error(mk::ErrorCode::Internal, std::string("fused baseline: no fused operator runs ") +
                                                   mk::toString(coll.op) + " beside its GEMM");
  }
}

EngineBaseline timeCublasThenEngine(const Launch& launch, Streams& st, const CublasLt& lt,
                                    const std::vector<mk::GemmProblem>& gemms, const BaselineCollective& coll,
                                    const BaselineTiming& timing, mk::CommConfig cfg) {
  const std::size_t n = launch.devs.size();
  if (gemms.size() != n || coll.send.size() != n || coll.recv.size() != n || st.s.size() != n)
    throw mk::Error(mk::ErrorCode::InvalidArgument, "engine baseline: one GEMM, buffer pair and stream per rank");
  std::vector<CublasLt::Plan> plans;
  for (const mk::GemmProblem& g : gemms) plans.push_back(lt.plan(g));
  auto gemmAll = [&] {
    for (std::size_t r = 0; r < n; ++r) lt.run(plans[r], st.s[r]);
  };
  EngineBaseline out;
  // Every process starts each timed part together: ranks sharing a GPU share it as they do in the fused op.
  launch.barrier();
  out.gemmUs = launch.maxOverProcesses(timeLoopUs(timing, st, false, gemmAll));
  cfg.computeLanes = false;
  cfg.trace = false;
  std::vector<mk::Communicator> comms = createCommunicators(launch, cfg);
  auto collAll = [&] {
    for (std::size_t r = 0; r < n; ++r) submitEngineCollective(comms[r], coll, r, st.s[r]);
  };
  launch.barrier();
  out.collUs = launch.maxOverProcesses(timeLoopUs(timing, st, true, collAll));
  launch.barrier();
  out.sequentialUs = launch.maxOverProcesses(timeLoopUs(timing, st, false, [&] {
    if (coll.first) collAll();
    gemmAll();
    if (!coll.first) collAll();
  }));
  for (auto& c : comms) c.synchronize();
  out.algo = mk::toString(comms[0].chooseAlgorithm(coll.op, coll.count, mk::DType::BFloat16));
  return out;
}

}  // namespace mkbench
