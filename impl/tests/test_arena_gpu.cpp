// The device arena (CommConfig::deviceArenaBytes): everything the engine allocates after creation is carved
// from memory reserved before the resident kernel starts. This is the configuration compute-sanitizer memcheck
// can check (it knows only allocations older than a running kernel), so the user buffers here are allocated
// before the communicator as well, and ops meet their streams through memory operations (no kernel launched
// beside the resident one).
#include <doctest/doctest.h>

#include <cuda_runtime_api.h>

#include <string>
#include <vector>

#include "engine_test_util.hpp"

namespace {

using mk::CollOp;
using mk::DType;
using mk::RedOp;

/// cudaMalloc'd memory on each GPU, allocated before (and so freed after) the communicator using it.
struct RankMemory {
  std::vector<int> devices;
  std::vector<mkt::UserMemory> mem;
  RankMemory(const std::vector<int>& devs, size_t bytes) : devices(devs) {
    for (int d : devs) {
      MK_CUDA_CHECK(cudaSetDevice(d));
      void* p = nullptr;
      MK_CUDA_CHECK(cudaMalloc(&p, bytes));
      mem.push_back({static_cast<char*>(p), bytes});
    }
  }
  ~RankMemory() {
    for (size_t i = 0; i < mem.size(); ++i) {
      cudaSetDevice(devices[i]);
      cudaFree(mem[i].base);
    }
  }
  RankMemory(const RankMemory&) = delete;
  RankMemory& operator=(const RankMemory&) = delete;
};

}  // namespace

TEST_CASE("engine arena: with a preallocated device arena every collective matches the reference on 2 GPUs") {
  const auto devs = mkt::firstDevices(2);
  RankMemory user(devs, size_t{48} << 20);
  mk::CommConfig cfg;
  cfg.deviceArenaBytes = uint64_t{256} << 20;
  // The configuration a sanitizer run needs: compute-sanitizer runs one kernel at a time, so no hand-off
  // kernel may be launched beside the resident one (docs/gpu-engine.md, "compute-sanitizer").
  cfg.streamHandoff = mk::StreamHandoff::MemOps;
  {
    auto comms = mk::Communicator::createLocal(devs, cfg);
    uint64_t seed = 4242;
    for (CollOp op : {CollOp::AllReduce, CollOp::AllGather, CollOp::ReduceScatter, CollOp::Broadcast, CollOp::AllToAll})
      for (DType dt : {DType::Float32, DType::BFloat16})
        for (uint64_t count : {1ull, 1021ull, (1ull << 20) + 3})
          for (bool inPlace : {false, true}) {
            mk::CollectiveSpec spec;
            spec.op = op;
            spec.dtype = dt;
            spec.redop = op == CollOp::AllReduce && count == 1021 ? RedOp::Max : RedOp::Sum;
            spec.count = count;
            spec.root = op == CollOp::Broadcast ? 1 : 0;
            CAPTURE(mk::toString(op));
            CAPTURE(mk::toString(dt));
            CAPTURE(count);
            CAPTURE(inPlace);
            CAPTURE(mk::toString(comms[0].chooseAlgorithm(op, count, dt)));
            CHECK(mkt::runAndCheck(comms, spec, inPlace, seed++, true, {}, &user.mem) == 0);
          }
    // Every generator of all-reduce once more (their scratch layouts differ).
    for (const char* algo : {"one-shot", "two-shot", "ring"}) {
      mk::CollectiveSpec spec;
      spec.op = CollOp::AllReduce;
      spec.dtype = DType::Float32;
      spec.redop = RedOp::Sum;
      spec.count = (1ull << 19) + 7;
      CAPTURE(algo);
      CHECK(mkt::runAndCheck(comms, spec, false, seed++, true, mk::CollOptions(algo), &user.mem) == 0);
    }
  }
}

TEST_CASE("engine arena: an op that does not fit the device arena is refused naming the setting") {
  const auto devs = mkt::firstDevices(1);
  RankMemory user(devs, size_t{1} << 20);
  mk::CommConfig cfg;
  cfg.deviceArenaBytes = 64;  // smaller than any lowered program
  auto comms = mk::Communicator::createLocal(devs, cfg);
  MK_CUDA_CHECK(cudaSetDevice(devs[0]));
  cudaStream_t s = nullptr;
  MK_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  std::string msg;
  try {
    comms[0].allReduce(user.mem[0].base, user.mem[0].base + 4096, 256, DType::Float32, RedOp::Sum, s);
  } catch (const mk::Error& e) {
    CHECK(e.code() == mk::ErrorCode::InvalidArgument);
    msg = e.what();
  }
  CAPTURE(msg);
  CHECK(msg.find("deviceArenaBytes") != std::string::npos);
  CHECK(msg.find("rank 0") != std::string::npos);
  CHECK(msg.find("is full") != std::string::npos);
  MK_CUDA_CHECK(cudaStreamSynchronize(s));  // nothing was enqueued: the stream is free
  cudaStreamDestroy(s);
}
