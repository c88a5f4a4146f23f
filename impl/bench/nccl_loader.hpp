// mkernel — NCCL loaded at run time (dlopen "libnccl.so.2"), so mk-bench builds without nccl.h and runs
// wherever a libnccl.so.2 exists (torch's wheel included). Only the few entry points the baseline needs,
// declared here with NCCL's stable C ABI.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <string>
#include <vector>

#include "mk/algorithms/algorithms.hpp"
#include "mk/bootstrap.hpp"
#include "mk/schedule/types.hpp"

namespace mkbench {

/// ncclUniqueId: 128 opaque bytes (NCCL's stable C ABI).
struct NcclUniqueId {
  char internal[128];
};

/// One NCCL communicator per local GPU (ncclCommInitAll), or this process's one rank of several
/// (ncclCommInitRank, the unique id passed through mkernel's bootstrap), and the collectives mk-bench
/// compares with.
class Nccl {
 public:
  /// Loads the library and initialises communicators on `devices`. NVLink SHARP (NVLS) is disabled
  /// first (NCCL_NVLS_ENABLE=0): multicast can take a shared host's GPUs out of service.
  /// Throws mk::Error(Unsupported) when libnccl.so.2 cannot be loaded, naming what was tried.
  explicit Nccl(const std::vector<int>& devices);
  /// One process per GPU: rank `rank` of `nRanks` on `device`; collective over `boot`.
  Nccl(int device, int rank, int nRanks, mk::Bootstrap& boot);
  ~Nccl();
  Nccl(const Nccl&) = delete;
  Nccl& operator=(const Nccl&) = delete;

  /// "2.28.9".
  std::string version() const { return version_; }
  /// Where the library came from (dlinfo path when known).
  std::string path() const { return path_; }

  /// Every rank's part of one collective, grouped (ncclGroupStart / End) as single-thread use requires.
  void run(mk::CollOp op, const std::vector<const void*>& send, const std::vector<void*>& recv, std::size_t count,
           mk::DType dtype, mk::RedOp redop, uint32_t root, const std::vector<cudaStream_t>& streams);
  /// ncclGroupStart / ncclGroupEnd around several run() calls.
  void groupStart();
  void groupEnd();

 private:
  void load();
  void unload() noexcept;
  void check(int result, const char* what) const;
  struct Api;
  void* lib_ = nullptr;
  Api* api_ = nullptr;
  std::vector<void*> comms_;
  std::vector<int> devices_;
  int nRanks_ = 0;  ///< every process's ranks together
  std::string version_, path_;
};

}  // namespace mkbench
