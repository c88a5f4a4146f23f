// The engine on one GPU: a 1-rank communicator, bad input, a timeout, clock calibration and the trace.
#include <doctest/doctest.h>

#include <chrono>
#include <string>

#include "engine_test_util.hpp"

namespace {

using mk::DType;
using mk::RedOp;
using mkt::errorOf;

}  // namespace

TEST_CASE("engine: a one-rank communicator runs every collective") {
  auto comms = mk::Communicator::createLocal({0});
  uint64_t seed = 11;
  for (mk::CollOp op : {mk::CollOp::AllReduce, mk::CollOp::AllGather, mk::CollOp::ReduceScatter, mk::CollOp::Broadcast,
                        mk::CollOp::AllToAll})
    for (uint64_t count : {1ull, 1021ull}) {
      mk::CollectiveSpec spec;
      spec.op = op;
      spec.count = count;
      CAPTURE(mk::toString(op));
      CHECK(mkt::runAndCheck(comms, spec, false, seed++) == 0);
    }
}

TEST_CASE("engine: bad arguments are refused with a clear error and the communicator stays usable") {
  auto comms = mk::Communicator::createLocal({0});
  mk::Communicator& c = comms[0];
  mkt::Streams streams(comms);
  cudaStream_t s = streams.s[0];
  mkt::DeviceBuffer buf(0, 1 << 16);
  char* d = buf.get();
  CHECK(errorOf([&] { c.allReduce(nullptr, d, 4, DType::Float32, RedOp::Sum, s); }).find("send is null") !=
        std::string::npos);
  CHECK(errorOf([&] { c.allReduce(d, nullptr, 4, DType::Float32, RedOp::Sum, s); }).find("recv is null") !=
        std::string::npos);
  CHECK(errorOf([&] { c.allReduce(d + 1, d + 4096, 4, DType::Float32, RedOp::Sum, s); }).find("not aligned") !=
        std::string::npos);
  CHECK(errorOf([&] { c.allReduce(d, d + 4098, 4, DType::Float32, RedOp::Sum, s); }).find("not aligned") !=
        std::string::npos);
  CHECK(errorOf([&] { c.allReduce(d, d + 4096, 0, DType::Float32, RedOp::Sum, s); }).find("count must be > 0") !=
        std::string::npos);
  CHECK(errorOf([&] { c.allReduce(d, d + 4096, 4, static_cast<DType>(9), RedOp::Sum, s); }).find("dtype") !=
        std::string::npos);
  CHECK(errorOf([&] {
          c.allReduce(d, d + 4096, 4, DType::Float32, static_cast<RedOp>(7), s);
        }).find("reduction operator") != std::string::npos);
  CHECK(errorOf([&] { c.broadcast(d, d + 4096, 4, DType::Float32, 3, s); }).find("root 3") != std::string::npos);
  std::vector<float> host(16);
  CHECK(errorOf([&] {
          c.allReduce(host.data(), d, 4, DType::Float32, RedOp::Sum, s);
        }).find("device memory of GPU 0") != std::string::npos);
  CHECK(errorOf([&] {
          c.allReduce(d, d + 4096, 4, DType::Float32, RedOp::Sum, s, "no-such-algo");
        }).find("unknown algorithm") != std::string::npos);
  // None of these enqueued anything: the communicator still computes.
  mk::CollectiveSpec spec;
  spec.op = mk::CollOp::AllReduce;
  spec.count = 5;
  CHECK(mkt::runAndCheck(comms, spec, false, 1) == 0);
}

TEST_CASE("engine: an op that cannot be captured is refused under capture and the stream and engine stay usable") {
  auto comms = mk::Communicator::createLocal({0});
  mkt::Streams streams(comms);
  cudaStream_t s = streams.s[0];
  mkt::DeviceBuffer buf(0, 1 << 16);
  char* d = buf.get();
  REQUIRE(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal) == cudaSuccess);
  // In place needs a staging copy chosen per op number: refused under capture (test_graph_gpu.cpp has the rest).
  const std::string e = errorOf([&] { comms[0].allReduce(d, d, 4, DType::Float32, RedOp::Sum, s); });
  cudaGraph_t graph = nullptr;
  const cudaError_t ended = cudaStreamEndCapture(s, &graph);
  if (graph) cudaGraphDestroy(graph);
  CAPTURE(e);
  CHECK(e.find("CUDA graph capture") != std::string::npos);
  CHECK(ended == cudaSuccess);  // nothing the refused call did invalidated the caller's capture
  CHECK(mkt::allReduceMismatches(comms, 1021, 5) == 0);
}

TEST_CASE("engine: a kernel grid that cannot be co-resident is refused") {
  mk::CommConfig cfg;
  cfg.workerCtas = 60000;
  const std::string msg = errorOf([&] { mk::Communicator::createLocal({0}, cfg); });
  CHECK(msg.find("co-resident") != std::string::npos);
}

TEST_CASE("engine: a wait that can never be satisfied on one GPU times out within the budget") {
  mk::CommConfig cfg;
  cfg.pollBudgetMs = 200;
  auto comms = mk::Communicator::createLocal({0}, cfg);
  mk::Schedule s;
  s.nRanks = 1;
  s.nodeOf = {0};
  s.nFlags = 1;
  mk::Lane lane;
  mk::Step w;
  w.kind = mk::StepKind::Wait;
  w.flag = mk::FlagRef{0, 0};
  w.value = 1;
  lane.steps = {w};
  s.lanes = {{lane}};
  mkt::Streams streams(comms);
  const auto start = std::chrono::steady_clock::now();
  comms[0].execute(s, nullptr, nullptr, streams.s[0]);
  const std::string msg = errorOf([&] { comms[0].synchronize(); });
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  CAPTURE(msg);
  CHECK(msg.find("rank 0 lane 0") != std::string::npos);
  CHECK(msg.find("step 0 (wait)") != std::string::npos);
  CHECK(msg.find("expected >= 1, seen 0") != std::string::npos);
  CHECK(seconds < 3.0);
  streams.sync(comms);
}

TEST_CASE("engine: clock calibration and op timestamps are consistent") {
  auto comms = mk::Communicator::createLocal({0});
  const mk::ClockSync cs = comms[0].calibrateClock(50);
  CHECK(cs.uncertaintyNs > 0);
  CHECK(cs.uncertaintyNs < 50000);
  mk::CollectiveSpec spec;
  spec.op = mk::CollOp::AllReduce;
  spec.count = 1000;
  const uint64_t op = comms[0].nextOpIndex();
  CHECK(mkt::runAndCheck(comms, spec, false, 2) == 0);
  const mk::OpTiming t = comms[0].opTiming(op);
  CHECK(t.doorbellNs > 0);
  CHECK(t.publishNs >= t.doorbellNs);
  CHECK(t.firstStepNs >= t.publishNs);
  CHECK(t.localDoneNs >= t.firstStepNs);
  CHECK(t.completeNs >= t.localDoneNs);
}

TEST_CASE("engine: the per-step trace records every step and exports Chrome JSON") {
  mk::CommConfig cfg;
  cfg.trace = true;
  auto comms = mk::Communicator::createLocal({0}, cfg);
  mk::CollectiveSpec spec;
  spec.op = mk::CollOp::AllReduce;
  spec.count = 4096;
  CHECK(mkt::runAndCheck(comms, spec, false, 9) == 0);
  const auto events = comms[0].takeTrace();
  CHECK(!events.empty());
  for (const auto& e : events) CHECK(e.endNs >= e.startNs);
  const std::string json = mk::traceToChromeJson(events);
  CHECK(json.find("\"traceEvents\"") != std::string::npos);
  CHECK(json.find("\"ph\":\"X\"") != std::string::npos);
}
