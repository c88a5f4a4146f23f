#include "nccl_loader.hpp"

#include <dlfcn.h>
#include <link.h>

#include <cstdlib>
#include <cstring>
#include <string>

#include "mk/cuda_check.hpp"
#include "mk/error.hpp"

namespace mkbench {

// NCCL's C ABI (nccl.h, stable since 2.x): opaque communicator, int enums.
using ncclComm_t = void*;
using ncclResult_t = int;
enum NcclDataType { kNcclFloat16 = 6, kNcclFloat32 = 7, kNcclBfloat16 = 9 };
enum NcclRedOp { kNcclSum = 0, kNcclMax = 2, kNcclMin = 3 };

struct Nccl::Api {
  ncclResult_t (*getVersion)(int*);
  ncclResult_t (*commInitAll)(ncclComm_t*, int, const int*);
  ncclResult_t (*getUniqueId)(NcclUniqueId*);
  ncclResult_t (*commInitRank)(ncclComm_t*, int, NcclUniqueId, int);
  ncclResult_t (*commDestroy)(ncclComm_t);
  const char* (*getErrorString)(ncclResult_t);
  ncclResult_t (*groupStart)();
  ncclResult_t (*groupEnd)();
  ncclResult_t (*allReduce)(const void*, void*, size_t, int, int, ncclComm_t, cudaStream_t);
  ncclResult_t (*allGather)(const void*, void*, size_t, int, ncclComm_t, cudaStream_t);
  ncclResult_t (*reduceScatter)(const void*, void*, size_t, int, int, ncclComm_t, cudaStream_t);
  ncclResult_t (*broadcast)(const void*, void*, size_t, int, int, ncclComm_t, cudaStream_t);
  ncclResult_t (*send)(const void*, size_t, int, int, ncclComm_t, cudaStream_t);
  ncclResult_t (*recv)(void*, size_t, int, int, ncclComm_t, cudaStream_t);
};

namespace {
template <class Fn>
void sym(void* lib, const char* name, Fn& out) {
  void* p = dlsym(lib, name);
  if (!p) throw mk::Error(mk::ErrorCode::Unsupported, std::string("libnccl.so.2 has no symbol ") + name);
  out = reinterpret_cast<Fn>(p);
}
int ncclType(mk::DType t) {
  switch (t) {
    case mk::DType::BFloat16: return kNcclBfloat16;
    case mk::DType::Float16: return kNcclFloat16;
    case mk::DType::Float8E4M3:
    case mk::DType::Float8E5M2:
      throw mk::Error(mk::ErrorCode::Unsupported, std::string("the NCCL baseline does not run ") + mk::toString(t));
    default: return kNcclFloat32;
  }
}
int ncclOp(mk::RedOp op) { return op == mk::RedOp::Max ? kNcclMax : op == mk::RedOp::Min ? kNcclMin : kNcclSum; }
}  // namespace

void Nccl::load() {
  // Before the library reads its environment: never NVLink multicast on the machines we measure on.
  setenv("NCCL_NVLS_ENABLE", "0", 1);
  lib_ = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
  if (!lib_)
    throw mk::Error(mk::ErrorCode::Unsupported, std::string("cannot load libnccl.so.2 (") + dlerror() +
                                                    "): put NCCL's lib directory on LD_LIBRARY_PATH (torch's wheel "
                                                    "has it under site-packages/nvidia/nccl/lib)");
  api_ = new Api{};
  try {
    sym(lib_, "ncclGetVersion", api_->getVersion);
    sym(lib_, "ncclCommInitAll", api_->commInitAll);
    sym(lib_, "ncclGetUniqueId", api_->getUniqueId);
    sym(lib_, "ncclCommInitRank", api_->commInitRank);
    sym(lib_, "ncclCommDestroy", api_->commDestroy);
    sym(lib_, "ncclGetErrorString", api_->getErrorString);
    sym(lib_, "ncclGroupStart", api_->groupStart);
    sym(lib_, "ncclGroupEnd", api_->groupEnd);
    sym(lib_, "ncclAllReduce", api_->allReduce);
    sym(lib_, "ncclAllGather", api_->allGather);
    sym(lib_, "ncclReduceScatter", api_->reduceScatter);
    sym(lib_, "ncclBroadcast", api_->broadcast);
    sym(lib_, "ncclSend", api_->send);
    sym(lib_, "ncclRecv", api_->recv);
    int v = 0;
    check(api_->getVersion(&v), "ncclGetVersion");
    version_ = std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." + std::to_string(v % 100);
    link_map* lm = nullptr;
    if (dlinfo(lib_, RTLD_DI_LINKMAP, &lm) == 0 && lm && lm->l_name) path_ = lm->l_name;
  } catch (...) {
    unload();
    throw;
  }
}

void Nccl::unload() noexcept {
  delete api_;
  api_ = nullptr;
  if (lib_) dlclose(lib_);
  lib_ = nullptr;
}

Nccl::Nccl(const std::vector<int>& devices) : devices_(devices), nRanks_(static_cast<int>(devices.size())) {
  load();
  comms_.assign(devices.size(), nullptr);
  const int rc = api_->commInitAll(comms_.data(), static_cast<int>(devices.size()), devices.data());
  if (rc != 0) {
    const std::string why = api_->getErrorString(rc);
    unload();
    throw mk::Error(mk::ErrorCode::Internal, "ncclCommInitAll failed: " + why);
  }
}

Nccl::Nccl(int device, int rank, int nRanks, mk::Bootstrap& boot) : devices_{device}, nRanks_(nRanks) {
  load();
  // Rank 0's unique id reaches every rank through the bootstrap (an all-gather; rank 0's part is the id).
  NcclUniqueId id{};
  if (rank == 0) check(api_->getUniqueId(&id), "ncclGetUniqueId");
  const std::vector<uint8_t> all = boot.allGather(&id, sizeof id);
  std::memcpy(&id, all.data(), sizeof id);
  MK_CUDA_CHECK(cudaSetDevice(device));
  comms_.assign(1, nullptr);
  const int rc = api_->commInitRank(&comms_[0], nRanks, id, rank);
  if (rc != 0) {
    const std::string why = api_->getErrorString(rc);
    unload();
    throw mk::Error(mk::ErrorCode::Internal, "ncclCommInitRank (rank " + std::to_string(rank) + " of " +
                                                 std::to_string(nRanks) + ") failed: " + why);
  }
}

Nccl::~Nccl() {
  if (api_)
    for (void* c : comms_)
      if (c) api_->commDestroy(c);
  delete api_;
  // The library stays loaded: NCCL's own threads may still be winding down.
}

void Nccl::check(int result, const char* what) const {
  if (result != 0)
    throw mk::Error(mk::ErrorCode::Internal, std::string(what) + " failed: " +
                                                 (api_ && api_->getErrorString ? api_->getErrorString(result) : "?"));
}

void Nccl::groupStart() { check(api_->groupStart(), "ncclGroupStart"); }
void Nccl::groupEnd() { check(api_->groupEnd(), "ncclGroupEnd"); }

void Nccl::run(mk::CollOp op, const std::vector<const void*>& send, const std::vector<void*>& recv, size_t count,
               mk::DType dtype, mk::RedOp redop, uint32_t root, const std::vector<cudaStream_t>& streams) {
  const int n = static_cast<int>(comms_.size());  // this process's ranks
  const int t = ncclType(dtype);
  const size_t es = mk::dtypeSize(dtype);
  check(api_->groupStart(), "ncclGroupStart");
  for (int r = 0; r < n; ++r) {
    switch (op) {
      case mk::CollOp::AllReduce:
        check(api_->allReduce(send[r], recv[r], count, t, ncclOp(redop), comms_[r], streams[r]), "ncclAllReduce");
        break;
      case mk::CollOp::AllGather:
        check(api_->allGather(send[r], recv[r], count, t, comms_[r], streams[r]), "ncclAllGather");
        break;
      case mk::CollOp::ReduceScatter:
        check(api_->reduceScatter(send[r], recv[r], count, t, ncclOp(redop), comms_[r], streams[r]),
              "ncclReduceScatter");
        break;
      case mk::CollOp::Broadcast:
        check(api_->broadcast(send[r], recv[r], count, t, static_cast<int>(root), comms_[r], streams[r]),
              "ncclBroadcast");
        break;
      case mk::CollOp::AllToAll:
        // All-to-all as nccl-tests does it: grouped send/recv of block j with every rank j.
        for (int j = 0; j < nRanks_; ++j) {
          check(api_->send(static_cast<const char*>(send[r]) + j * count * es, count, t, j, comms_[r], streams[r]),
                "ncclSend");
          check(api_->recv(static_cast<char*>(recv[r]) + j * count * es, count, t, j, comms_[r], streams[r]),
                "ncclRecv");
        }
        break;
    }
  }
  check(api_->groupEnd(), "ncclGroupEnd");
}

}  // namespace mkbench
