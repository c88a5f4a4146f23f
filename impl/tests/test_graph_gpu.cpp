// CUDA graph capture of mkernel ops (mk/graph.hpp): captured ops replayed through GraphExec compute what the same
// ops submitted one by one compute, launch after launch, with eager ops between launches; what cannot be captured
// is refused at capture time without breaking the caller's capture; a replay after the communicator is gone is
// refused. Two GPUs when there are two, else two ranks sharing GPU 0 (CommConfig::shareGpus).
#include <doctest/doctest.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine_test_util.hpp"
#include "mk/device/engine_device.hpp"
#include "mk/graph.hpp"

namespace {

using mk::DType;
using mk::RedOp;
using mkt::errorOf;
using mkt::mismatches;

std::vector<mk::Communicator> twoRanks(mk::CommConfig cfg = {}) {
  int devices = 0;
  REQUIRE(cudaGetDeviceCount(&devices) == cudaSuccess);
  if (devices >= 2) return mk::Communicator::createLocal({0, 1}, cfg);
  cfg.shareGpus = true;
  return mk::Communicator::createLocal({0, 0}, cfg);
}

/// Rank r's buffers of the captured sequence: an all-reduce (c1), an all-gather of its result, three grouped
/// all-reduces (c3 each), and an eager all-reduce (ce) run between launches.
struct RankBuffers {
  static constexpr uint64_t c1 = 1021, c3 = 3, ce = 4099;
  std::unique_ptr<mkt::DeviceBuffer> in1, out1, out2, in3, out3, inE, outE;
  RankBuffers(int device, uint32_t n) {
    in1 = std::make_unique<mkt::DeviceBuffer>(device, c1 * 4);
    out1 = std::make_unique<mkt::DeviceBuffer>(device, c1 * 4);
    out2 = std::make_unique<mkt::DeviceBuffer>(device, n * c1 * 4);
    in3 = std::make_unique<mkt::DeviceBuffer>(device, 3 * 256);
    out3 = std::make_unique<mkt::DeviceBuffer>(device, 3 * 256);
    inE = std::make_unique<mkt::DeviceBuffer>(device, ce * 4);
    outE = std::make_unique<mkt::DeviceBuffer>(device, ce * 4);
  }
};

std::vector<float> download(const mkt::DeviceBuffer& b, uint64_t count, uint64_t offsetBytes = 0) {
  std::vector<float> v(count);
  b.download(v.data(), count * 4, offsetBytes);
  return v;
}

}  // namespace

TEST_CASE("graph: captured ops replay exactly, launch after launch, with eager ops between launches") {
  auto comms = twoRanks();
  const uint32_t n = 2;
  mkt::Streams st(comms);
  std::vector<RankBuffers> bufs;
  for (uint32_t r = 0; r < n; ++r) bufs.emplace_back(comms[r].device(), n);

  std::vector<cudaGraph_t> graphs(n, nullptr);
  for (uint32_t r = 0; r < n; ++r) REQUIRE(cudaStreamBeginCapture(st.s[r], cudaStreamCaptureModeGlobal) == cudaSuccess);
  // One thread drives both ranks: op by op, rank by rank (the group spans both ranks' streams).
  comms[0].allReduce(bufs[0].in1->get(), bufs[0].out1->get(), RankBuffers::c1, DType::Float32, RedOp::Sum, st.s[0]);
  comms[1].allReduce(bufs[1].in1->get(), bufs[1].out1->get(), RankBuffers::c1, DType::Float32, RedOp::Sum, st.s[1]);
  for (uint32_t r = 0; r < n; ++r)
    comms[r].allGather(bufs[r].out1->get(), bufs[r].out2->get(), RankBuffers::c1, DType::Float32, st.s[r]);
  {
    mkt::GroupGuard group;
    for (int j = 0; j < 3; ++j)
      for (uint32_t r = 0; r < n; ++r)
        comms[r].allReduce(bufs[r].in3->get() + 256 * j, bufs[r].out3->get() + 256 * j, RankBuffers::c3, DType::Float32,
                           RedOp::Sum, st.s[r]);
  }
  for (uint32_t r = 0; r < n; ++r) REQUIRE(cudaStreamEndCapture(st.s[r], &graphs[r]) == cudaSuccess);
  CHECK(comms[0].nextOpIndex() == 0);  // captured, not submitted

  std::vector<mk::GraphExec> execs;
  for (uint32_t r = 0; r < n; ++r) {
    execs.emplace_back(graphs[r]);
    CHECK(execs[r].ops() == 5);
    cudaGraphDestroy(graphs[r]);  // the executable graph stands alone
  }

  uint64_t expectOps = 0;
  for (int launch = 0; launch < 6; ++launch) {
    CAPTURE(launch);
    std::vector<std::vector<float>> in1(n), in3(n), inE(n);
    for (uint32_t r = 0; r < n; ++r) {
      in1[r] = mkt::randomValues(DType::Float32, RankBuffers::c1, 1000 * launch + r, true);
      in3[r] = mkt::randomValues(DType::Float32, 3 * 64, 2000 * launch + r, true);
      inE[r] = mkt::randomValues(DType::Float32, RankBuffers::ce, 3000 * launch + r, true);
      bufs[r].in1->upload(in1[r].data(), in1[r].size() * 4);
      bufs[r].in3->upload(in3[r].data(), in3[r].size() * 4);
      bufs[r].inE->upload(inE[r].data(), inE[r].size() * 4);
    }
    for (uint32_t r = 0; r < n; ++r) execs[r].launch(st.s[r]);
    expectOps += 5;
    if (launch % 2 == 1) {  // an eager op between two launches takes the next op number on both ranks
      for (uint32_t r = 0; r < n; ++r)
        comms[r].allReduce(bufs[r].inE->get(), bufs[r].outE->get(), RankBuffers::ce, DType::Float32, RedOp::Sum,
                           st.s[r]);
      expectOps += 1;
    }
    st.sync(comms);
    uint64_t bad = 0;
    for (uint32_t r = 0; r < n; ++r) {
      CAPTURE(r);
      std::vector<float> sum1(RankBuffers::c1), gathered, sumE(RankBuffers::ce);
      for (uint32_t q = 0; q < n; ++q)
        for (uint64_t i = 0; i < RankBuffers::c1; ++i) sum1[i] += in1[q][i];
      for (uint32_t q = 0; q < n; ++q) gathered.insert(gathered.end(), sum1.begin(), sum1.end());
      bad += mismatches(download(*bufs[r].out1, RankBuffers::c1), sum1, "all-reduce");
      bad += mismatches(download(*bufs[r].out2, n * RankBuffers::c1), gathered, "all-gather of its result");
      for (int j = 0; j < 3; ++j) {
        std::vector<float> sum3(RankBuffers::c3);
        for (uint32_t q = 0; q < n; ++q)
          for (uint64_t i = 0; i < RankBuffers::c3; ++i) sum3[i] += in3[q][64 * j + i];
        bad += mismatches(download(*bufs[r].out3, RankBuffers::c3, 256 * j), sum3, "grouped all-reduce");
      }
      if (launch % 2 == 1) {
        for (uint32_t q = 0; q < n; ++q)
          for (uint64_t i = 0; i < RankBuffers::ce; ++i) sumE[i] += inE[q][i];
        bad += mismatches(download(*bufs[r].outE, RankBuffers::ce), sumE, "eager all-reduce between launches");
      }
      CHECK(comms[r].nextOpIndex() == expectOps);
    }
    REQUIRE(bad == 0);
  }
  for (uint32_t r = 0; r < n; ++r) CHECK_NOTHROW(comms[r].synchronize());
}

TEST_CASE("graph: back-to-back launches queue on the stream without waiting for each other") {
  auto comms = twoRanks();
  mkt::Streams st(comms);
  std::vector<RankBuffers> bufs;
  for (uint32_t r = 0; r < 2; ++r) bufs.emplace_back(comms[r].device(), 2);
  std::vector<cudaGraph_t> graphs(2, nullptr);
  for (uint32_t r = 0; r < 2; ++r) REQUIRE(cudaStreamBeginCapture(st.s[r], cudaStreamCaptureModeThreadLocal) == 0);
  {
    mkt::GroupGuard group;
    for (uint32_t r = 0; r < 2; ++r)
      comms[r].allReduce(bufs[r].in3->get(), bufs[r].out3->get(), 2, DType::Float32, RedOp::Sum, st.s[r]);
  }
  for (uint32_t r = 0; r < 2; ++r) REQUIRE(cudaStreamEndCapture(st.s[r], &graphs[r]) == cudaSuccess);
  mk::GraphExec e0(graphs[0]), e1(graphs[1]);
  for (cudaGraph_t g : graphs) cudaGraphDestroy(g);
  const std::vector<float> ones(64, 1.f);
  for (uint32_t r = 0; r < 2; ++r) bufs[r].in3->upload(ones.data(), 256);
  // More launches than the graph has cells: the host waits (bounded) for earlier launches to start.
  const int launches = 3 * static_cast<int>(mk::device::kGraphCells) + 1;
  for (int i = 0; i < launches; ++i) {
    e0.launch(st.s[0]);
    e1.launch(st.s[1]);
  }
  st.sync(comms);
  CHECK(comms[0].nextOpIndex() == static_cast<uint64_t>(launches));
  CHECK(download(*bufs[1].out3, 2) == std::vector<float>{2.f, 2.f});
}

TEST_CASE("graph: what cannot be captured is refused at capture time and the caller's capture stays valid") {
  auto comms = twoRanks();
  mkt::Streams st(comms);
  RankBuffers b(comms[0].device(), 2);
  cudaStream_t s = st.s[0];
  REQUIRE(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal) == cudaSuccess);
  const std::string inPlace =
      errorOf([&] { comms[0].allReduce(b.in1->get(), b.in1->get(), 16, DType::Float32, RedOp::Sum, s); });
  cudaStream_t other = nullptr;
  REQUIRE(cudaStreamCreateWithFlags(&other, cudaStreamNonBlocking) == cudaSuccess);
  cudaEvent_t fork = nullptr;
  REQUIRE(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming) == cudaSuccess);
  // A second stream joined to the capture: rank 0's ops of one capture must stay on one stream.
  comms[0].allReduce(b.in1->get(), b.out1->get(), 16, DType::Float32, RedOp::Sum, s);
  REQUIRE(cudaEventRecord(fork, s) == cudaSuccess);
  REQUIRE(cudaStreamWaitEvent(other, fork, 0) == cudaSuccess);
  const std::string twoStreams =
      errorOf([&] { comms[0].allReduce(b.in1->get(), b.out1->get(), 16, DType::Float32, RedOp::Sum, other); });
  REQUIRE(cudaEventRecord(fork, other) == cudaSuccess);
  REQUIRE(cudaStreamWaitEvent(s, fork, 0) == cudaSuccess);
  cudaGraph_t graph = nullptr;
  const cudaError_t ended = cudaStreamEndCapture(s, &graph);
  CAPTURE(inPlace);
  CAPTURE(twoStreams);
  CHECK(inPlace.find("in place") != std::string::npos);
  CHECK(twoStreams.find("one stream") != std::string::npos);
  CHECK(ended == cudaSuccess);  // none of the refused calls invalidated the caller's capture
  REQUIRE(graph != nullptr);
  // The graph holds rank 0's one captured op; a second GraphExec of the same ops is refused while the first lives.
  {
    mk::GraphExec first(graph);
    CHECK(first.ops() == 1);
    CHECK(errorOf([&] { mk::GraphExec second(graph); }).find("another live GraphExec") != std::string::npos);
  }
  CHECK_NOTHROW(mk::GraphExec again(graph));
  cudaGraphDestroy(graph);
  cudaEventDestroy(fork);
  cudaStreamDestroy(other);
  // Nothing ran: the communicator still computes.
  CHECK(mkt::allReduceMismatches(comms, 1021, 17) == 0);
}

TEST_CASE("graph: the stream memory-operation hand-off cannot be captured") {
  mk::CommConfig cfg;
  cfg.streamHandoff = mk::StreamHandoff::MemOps;
  auto comms = twoRanks(cfg);
  mkt::Streams st(comms);
  RankBuffers b(comms[0].device(), 2);
  REQUIRE(cudaStreamBeginCapture(st.s[0], cudaStreamCaptureModeGlobal) == cudaSuccess);
  const std::string e =
      errorOf([&] { comms[0].allReduce(b.in1->get(), b.out1->get(), 16, DType::Float32, RedOp::Sum, st.s[0]); });
  cudaGraph_t graph = nullptr;
  CHECK(cudaStreamEndCapture(st.s[0], &graph) == cudaSuccess);
  if (graph) cudaGraphDestroy(graph);
  CAPTURE(e);
  CHECK(e.find("kernel hand-off") != std::string::npos);
}

TEST_CASE("graph: a graph replayed after its communicator was destroyed is refused") {
  cudaGraph_t graph = nullptr;
  std::unique_ptr<mk::GraphExec> exec;
  {
    auto comms = twoRanks();
    mkt::Streams st(comms);
    RankBuffers b(comms[0].device(), 2);
    REQUIRE(cudaStreamBeginCapture(st.s[0], cudaStreamCaptureModeGlobal) == cudaSuccess);
    comms[0].allReduce(b.in1->get(), b.out1->get(), 16, DType::Float32, RedOp::Sum, st.s[0]);
    REQUIRE(cudaStreamEndCapture(st.s[0], &graph) == cudaSuccess);
    exec = std::make_unique<mk::GraphExec>(graph);
  }
  cudaStream_t s = nullptr;
  REQUIRE(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess);
  const std::string e = errorOf([&] { exec->launch(s); });
  CAPTURE(e);
  CHECK(e.find("was destroyed") != std::string::npos);
  CHECK(errorOf([&] { mk::GraphExec late(graph); }).find("was destroyed") != std::string::npos);
  exec.reset();
  cudaGraphDestroy(graph);
  cudaStreamDestroy(s);
}
