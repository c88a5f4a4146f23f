// mkernel — the one choice of rendezvous and GPU for a process started as one rank (mk/bootstrap.hpp). The only
// part of the bootstrap that asks CUDA (how many GPUs this process sees), so it lives in the CUDA engine (mk::impl)
// while the rest of the bootstrap is CUDA-free (mk::host).
#include <cuda_runtime_api.h>

#include <memory>
#include <string>

#include "mk/bootstrap.hpp"
#include "mk/error.hpp"

namespace mk {

RankLaunch bootstrapFromEnvironment(double timeoutMs) {
  // Started by mpirun without MASTER_ADDR (and built with MPI): MPI itself is the rendezvous, and the node
  // rank it reports picks the GPU. Otherwise the TCP rendezvous of the launch variables.
  RankLaunch launch;
  int rank = 0;
  if (preferMpiBootstrap()) {
    launch.bootstrap = makeMpiBootstrap(timeoutMs, &launch.device);
    rank = launch.bootstrap->rank();
  } else {
    const LaunchEnvironment env = readLaunchEnvironment();
    rank = env.rank;
    launch.device = env.localRank;
  }
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) {
    cudaGetLastError();
    throw Error(ErrorCode::Unsupported,
                "rank " + std::to_string(rank) + ": no usable CUDA device (" + cudaGetErrorName(e) + ")");
  }
  if (launch.device >= count)
    throw Error(ErrorCode::InvalidArgument,
                "rank " + std::to_string(rank) + (launch.bootstrap ? ": node rank " : ": LOCAL_RANK ") +
                    std::to_string(launch.device) + " picks GPU " + std::to_string(launch.device) +
                    " but this process sees " + std::to_string(count) + " GPU(s) (more processes per node than GPUs?)");
  if (!launch.bootstrap) launch.bootstrap = TcpBootstrap::fromEnvironment(timeoutMs);
  return launch;
}

}  // namespace mk
