// CUDA graph capture in child processes (mk/graph.hpp), on one GPU:
//  * one process per rank: two rank processes sharing GPU 0 under CUDA MPS (CommConfig::shareGpus; the cases skip,
//    exit 77, without MPS) each capture their ops and replay them through GraphExec; every launch posts the
//    buffers on the post board as an eager op would, so the results are checked element-wise against the CPU
//    reference, launch after launch, with eager ops between launches; a buffer the peers cannot map is refused at
//    capture time and the capture stays valid;
//  * a plain cudaGraphLaunch of captured ops: its first node stops the CUDA context, so it runs in a child process,
//    and the communicator's next call must name the cause;
//  * the race the replay test found, in eager ops: a rank posts an op, then a larger op's schedule regrows the scratch
//    arenas before its peer posts the first; the first op's descriptor must still use the arena the peer was told of.
#include <doctest/doctest.h>

#include <cuda_runtime_api.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "engine_test_util.hpp"
#include "mk/communicator.hpp"
#include "mk/graph.hpp"
#include "multiprocess_cases.hpp"
#include "multiprocess_launch.hpp"

namespace {

using mk::DType;
using mk::RedOp;

constexpr double kChildTimeoutS = 55;

#define PROCESS_TEST(name, ranks, mps, fn)                               \
  static void fn();                                                      \
  TEST_CASE(name) {                                                      \
    if (!mkt::launchOnSharedGpu(name, ranks, kChildTimeoutS, mps)) fn(); \
  }                                                                      \
  static void fn()

mk::CommConfig sharedConfig() {
  mk::CommConfig c = mkt::Env::config();
  c.shareGpus = true;
  return c;
}

/// Upload rank r's input `seed` of `count` floats into `dst` (every process can compute every rank's input).
void uploadInput(mkt::Env& env, void* dst, uint64_t count, uint64_t seed) {
  const uint32_t r = static_cast<uint32_t>(env.comm.rank());
  std::vector<float> v(count);
  for (uint64_t i = 0; i < count; ++i) v[i] = mkt::inputValue(seed, r, i);
  MK_CUDA_CHECK(cudaMemcpyAsync(dst, v.data(), count * 4, cudaMemcpyHostToDevice, env.stream));
  MK_CUDA_CHECK(cudaStreamSynchronize(env.stream));
}

/// The sum over every rank's input `seed`.
std::vector<float> sumOfInputs(uint32_t ranks, uint64_t count, uint64_t seed) {
  std::vector<float> s(count, 0.f);
  for (uint32_t q = 0; q < ranks; ++q)
    for (uint64_t i = 0; i < count; ++i) s[i] += mkt::inputValue(seed, q, i);
  return s;
}

/// Mismatches of the floats at `src` (offset `offsetBytes`) against `want` (mkt::mismatches).
uint64_t mismatches(const void* src, const std::vector<float>& want, const char* what, uint64_t offsetBytes = 0) {
  std::vector<float> got(want.size());
  MK_CUDA_CHECK(
      cudaMemcpy(got.data(), static_cast<const char*>(src) + offsetBytes, got.size() * 4, cudaMemcpyDeviceToHost));
  return mkt::mismatches(got, want, what);
}

}  // namespace

PROCESS_TEST("graph (processes): ranks of two processes replay captured ops exactly, with eager ops between", 2, true,
             replayAcrossProcesses) {
  mkt::useLocalDevice();
  constexpr uint64_t c1 = 1021, c3 = 3, ce = 4099;
  mkt::Buffer in1(c1 * 4), out1(c1 * 4), out2(2 * c1 * 4), in3(3 * 256), out3(3 * 256), inE(ce * 4), outE(ce * 4);
  mkt::Env env(sharedConfig());
  REQUIRE(env.comm.multiProcess());
  const uint32_t n = static_cast<uint32_t>(env.comm.size());
  REQUIRE(n == 2);

  // An all-reduce, an all-gather of its result, three grouped all-reduces.
  REQUIRE(cudaStreamBeginCapture(env.stream, cudaStreamCaptureModeGlobal) == cudaSuccess);
  env.comm.allReduce(in1.p, out1.p, c1, DType::Float32, RedOp::Sum, env.stream);
  env.comm.allGather(out1.p, out2.p, c1, DType::Float32, env.stream);
  {
    mkt::GroupGuard group;
    for (int j = 0; j < 3; ++j)
      env.comm.allReduce(in3.c() + 256 * j, out3.c() + 256 * j, c3, DType::Float32, RedOp::Sum, env.stream);
  }
  cudaGraph_t graph = nullptr;
  REQUIRE(cudaStreamEndCapture(env.stream, &graph) == cudaSuccess);
  CHECK(env.comm.nextOpIndex() == 0);  // captured, not submitted
  mk::GraphExec exec(graph);
  cudaGraphDestroy(graph);
  CHECK(exec.ops() == 5);

  uint64_t expectOps = 0;
  for (uint64_t launch = 0; launch < 6; ++launch) {
    CAPTURE(launch);
    const uint64_t s1 = 100 + launch, s3 = 200 + launch, sE = 300 + launch;
    uploadInput(env, in1.p, c1, s1);
    for (int j = 0; j < 3; ++j) uploadInput(env, in3.c() + 256 * j, c3, s3 + 10 * j);
    uploadInput(env, inE.p, ce, sE);
    exec.launch(env.stream);
    expectOps += 5;
    if (launch % 2 == 1) {  // an eager op between two launches takes the next op number on both ranks
      env.comm.allReduce(inE.p, outE.p, ce, DType::Float32, RedOp::Sum, env.stream);
      expectOps += 1;
    }
    MK_CUDA_CHECK(cudaStreamSynchronize(env.stream));
    const std::vector<float> sum1 = sumOfInputs(n, c1, s1);
    std::vector<float> gathered;
    for (uint32_t q = 0; q < n; ++q) gathered.insert(gathered.end(), sum1.begin(), sum1.end());
    uint64_t bad = mismatches(out1.p, sum1, "all-reduce");
    bad += mismatches(out2.p, gathered, "all-gather of its result");
    for (int j = 0; j < 3; ++j)
      bad += mismatches(out3.p, sumOfInputs(n, c3, s3 + 10 * j), "grouped all-reduce", 256 * j);
    if (launch % 2 == 1) bad += mismatches(outE.p, sumOfInputs(n, ce, sE), "eager all-reduce between launches");
    CHECK(env.comm.nextOpIndex() == expectOps);
    REQUIRE(bad == 0);
  }
  CHECK_NOTHROW(env.comm.synchronize());
}

PROCESS_TEST("graph (processes): a buffer the peers cannot map is refused at capture and the capture stays valid", 2,
             true, refusedAtCapture) {
  mkt::useLocalDevice();
  constexpr uint64_t count = 1021;
  mkt::Buffer in(count * 4), out(count * 4);
  mkt::Env env(sharedConfig());
  // Stream-ordered pool memory cannot be exported through CUDA IPC; allocated before the capture (inside it the
  // allocation would become a graph node).
  void* pool = nullptr;
  MK_CUDA_CHECK(cudaMallocAsync(&pool, count * 4, env.stream));
  MK_CUDA_CHECK(cudaStreamSynchronize(env.stream));
  REQUIRE(cudaStreamBeginCapture(env.stream, cudaStreamCaptureModeGlobal) == cudaSuccess);
  const std::string e =
      mkt::errorOf([&] { env.comm.allReduce(pool, out.p, count, DType::Float32, RedOp::Sum, env.stream); });
  cudaGraph_t graph = nullptr;
  const cudaError_t ended = cudaStreamEndCapture(env.stream, &graph);
  CAPTURE(e);
  CHECK(e.find("under CUDA graph capture") != std::string::npos);
  CHECK(e.find("cannot be shared with the other processes") != std::string::npos);
  CHECK(ended == cudaSuccess);  // the refused call did not invalidate the caller's capture
  if (graph) cudaGraphDestroy(graph);
  CHECK(env.comm.nextOpIndex() == 0);
  // Nothing was given an op number: the next eager op is op 0 on both ranks, and exact.
  uploadInput(env, in.p, count, 7);
  env.comm.allReduce(in.p, out.p, count, DType::Float32, RedOp::Sum, env.stream);
  MK_CUDA_CHECK(cudaStreamSynchronize(env.stream));
  CHECK(mismatches(out.p, sumOfInputs(2, count, 7), "eager all-reduce after the refusal") == 0);
  MK_CUDA_CHECK(cudaFreeAsync(pool, env.stream));  // cudaFree would wait for the resident kernel
  MK_CUDA_CHECK(cudaStreamSynchronize(env.stream));
}

PROCESS_TEST("graph: a plain cudaGraphLaunch of captured ops stops the communicator and its next call says why", 1,
             false, plainLaunch) {
  // One process, two ranks (sharing GPU 0 where there is one): its CUDA context ends with the trap.
  int devices = 0;
  REQUIRE(cudaGetDeviceCount(&devices) == cudaSuccess);
  mk::CommConfig cfg;
  cfg.shareGpus = devices < 2;
  auto comms = mk::Communicator::createLocal(devices < 2 ? std::vector<int>{0, 0} : std::vector<int>{0, 1}, cfg);
  mkt::Streams st(comms);
  std::vector<std::unique_ptr<mkt::DeviceBuffer>> in, out;
  for (int r = 0; r < 2; ++r) {
    in.push_back(std::make_unique<mkt::DeviceBuffer>(comms[r].device(), 256));
    out.push_back(std::make_unique<mkt::DeviceBuffer>(comms[r].device(), 256));
  }
  std::vector<cudaGraph_t> graphs(2, nullptr);
  for (int r = 0; r < 2; ++r) REQUIRE(cudaStreamBeginCapture(st.s[r], cudaStreamCaptureModeGlobal) == cudaSuccess);
  for (int r = 0; r < 2; ++r) comms[r].allReduce(in[r]->get(), out[r]->get(), 16, DType::Float32, RedOp::Sum, st.s[r]);
  for (int r = 0; r < 2; ++r) REQUIRE(cudaStreamEndCapture(st.s[r], &graphs[r]) == cudaSuccess);
  // The misuse: CUDA's own launch, which cannot give the captured op its number.
  cudaGraphExec_t raw = nullptr;
  REQUIRE(cudaGraphInstantiate(&raw, graphs[0], 0) == cudaSuccess);
  REQUIRE(cudaGraphLaunch(raw, st.s[0]) == cudaSuccess);
  const cudaError_t synced = cudaStreamSynchronize(st.s[0]);
  CHECK(synced != cudaSuccess);  // the first node trapped
  const std::string e = mkt::errorOf([&] { comms[0].synchronize(); });
  CAPTURE(e);
  CHECK(e.find("without mk::GraphExec::launch") != std::string::npos);
  CHECK(e.find("replay 0") != std::string::npos);
  // The communicator stays unusable, and says so, on every rank.
  CHECK(mkt::errorOf([&] { comms[1].synchronize(); }).find("unusable") != std::string::npos);
}

PROCESS_TEST("processes: an op posted before a later op regrew the scratch arenas is exact on every rank", 2, true,
             postedBeforeRegrow) {
  mkt::useLocalDevice();
  constexpr uint64_t small = 1021, large = (1u << 20) + 3;
  mkt::Buffer inS(small * 4), outS(small * 4), inL(large * 4), outL(large * 4);
  mkt::Env env(sharedConfig());
  const uint32_t n = static_cast<uint32_t>(env.comm.size());
  uploadInput(env, inS.p, small, 11);
  uploadInput(env, inL.p, large, 12);
  // Rank 1 posts op 0 late, so rank 0 has posted op 0 and cached op 1's schedule (whose scratch regrows the arenas)
  // before rank 0's descriptor of op 0 can be written.
  if (env.comm.rank() == 1) std::this_thread::sleep_for(std::chrono::milliseconds(300));
  mk::CollOptions oneShot("one-shot");
  env.comm.allReduce(inS.p, outS.p, small, DType::Float32, RedOp::Sum, env.stream, oneShot);
  env.comm.allReduce(inL.p, outL.p, large, DType::Float32, RedOp::Sum, env.stream, oneShot);
  MK_CUDA_CHECK(cudaStreamSynchronize(env.stream));
  CHECK(mismatches(outS.p, sumOfInputs(n, small, 11), "the op posted before the regrow") == 0);
  CHECK(mismatches(outL.p, sumOfInputs(n, large, 12), "the op that regrew the arenas") == 0);
}
