// Failure paths of the engine on 2 GPUs: bounded waits report who waited for what, bad use is refused
// with a clear mk::Error, and nothing hangs.
#include <doctest/doctest.h>

#include <chrono>
#include <string>

#include "engine_test_util.hpp"

namespace {

using mk::DType;
using mk::RedOp;
using mkt::errorOf;

mk::BufRef ref(uint32_t rank, uint16_t buffer, uint64_t offset) { return mk::bufRef(rank, buffer, offset); }

/// input / output / scratch of `count` float32 on 2 ranks, no lanes.
mk::Schedule handMade(uint64_t count) {
  mk::Schedule s;
  s.nRanks = 2;
  s.nodeOf = {0, 0};
  s.nFlags = 2;
  s.nBarriers = 1;
  const char* names[] = {"input", "output", "scratch"};
  const mk::BufferKind kinds[] = {mk::BufferKind::Input, mk::BufferKind::Output, mk::BufferKind::Scratch};
  for (int b = 0; b < 3; ++b) {
    mk::BufferDecl d;
    d.name = names[b];
    d.kind = kinds[b];
    d.count = {count, count};
    s.buffers.push_back(d);
  }
  s.lanes.resize(2);
  s.info.op = "custom";
  s.info.algo = "hand-made";
  return s;
}

}  // namespace

TEST_CASE("engine errors: a wait nobody signals times out naming rank lane and step") {
  mk::CommConfig cfg;
  cfg.pollBudgetMs = 300;
  auto comms = mk::Communicator::createLocal(mkt::firstDevices(2), cfg);
  mk::Schedule s = handMade(64);
  mk::Lane lane1;  // rank 1: copies its input, then waits for a flag nobody signals
  mk::Step cp;
  cp.kind = mk::StepKind::Copy;
  cp.dst = ref(1, 1, 0);
  cp.a = ref(1, 0, 0);
  cp.count = 64;
  mk::Step w;
  w.kind = mk::StepKind::Wait;
  w.flag = mk::FlagRef{1, 1};
  w.value = 3;
  lane1.steps = {cp, w};
  s.lanes[1] = {mk::Lane{}, lane1};
  mkt::Streams streams(comms);
  std::vector<std::unique_ptr<mkt::DeviceBuffer>> bufs;
  for (int r = 0; r < 2; ++r) bufs.push_back(std::make_unique<mkt::DeviceBuffer>(comms[r].device(), 1024));
  const auto start = std::chrono::steady_clock::now();
  for (int r = 0; r < 2; ++r) comms[r].execute(s, bufs[r]->get(), bufs[r]->get() + 512, streams.s[r]);
  const std::string msg = errorOf([&] { comms[1].synchronize(); });
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  CAPTURE(msg);
  CHECK(msg.find("timeout") != std::string::npos);
  CHECK(msg.find("rank 1 lane 1") != std::string::npos);
  CHECK(msg.find("step 1 (wait)") != std::string::npos);
  CHECK(msg.find("flag 1 expected >= 3, seen 0") != std::string::npos);
  CHECK(seconds < 5.0);
  // Unusable afterwards, with the same story; the stream was released (no hang).
  const std::string again = errorOf(
      [&] { comms[0].allReduce(bufs[0]->get(), bufs[0]->get() + 256, 4, DType::Float32, RedOp::Sum, streams.s[0]); });
  CHECK(again.find("unusable") != std::string::npos);
  CHECK(again.find("rank 1 lane 1") != std::string::npos);
  streams.sync(comms);
}

TEST_CASE("engine errors: a barrier step synchronises both ranks and the data after it is exact") {
  auto comms = mk::Communicator::createLocal(mkt::firstDevices(2));
  const uint64_t count = 5000;
  mk::Schedule s = handMade(count);
  for (uint32_t r = 0; r < 2; ++r) {
    mk::Lane lane;
    mk::Step put;  // my input into the peer's scratch, no signal: the barrier orders it
    put.kind = mk::StepKind::Put;
    put.dst = ref(1 - r, 2, 0);
    put.a = ref(r, 0, 0);
    put.count = count;
    mk::Step bar;
    bar.kind = mk::StepKind::Barrier;
    bar.aux = 0;
    mk::Step cp;
    cp.kind = mk::StepKind::Copy;
    cp.dst = ref(r, 1, 0);
    cp.a = ref(r, 2, 0);
    cp.count = count;
    lane.steps = {put, bar, cp};
    s.lanes[r] = {lane};
  }
  s.nFlags = 0;
  mkt::Streams streams(comms);
  std::vector<std::unique_ptr<mkt::DeviceBuffer>> in, out;
  std::vector<std::vector<float>> vals;
  for (int r = 0; r < 2; ++r) {
    vals.push_back(mkt::randomValues(DType::Float32, count, 99 + r, false));
    in.push_back(std::make_unique<mkt::DeviceBuffer>(comms[r].device(), count * 4));
    out.push_back(std::make_unique<mkt::DeviceBuffer>(comms[r].device(), count * 4));
    in[r]->upload(vals[r].data(), count * 4);
  }
  for (int round = 0; round < 3; ++round) {
    for (int r = 0; r < 2; ++r) comms[r].execute(s, in[r]->get(), out[r]->get(), streams.s[r]);
    streams.sync(comms);
    for (int r = 0; r < 2; ++r) {
      std::vector<float> got(count);
      out[r]->download(got.data(), count * 4);
      CHECK(got == vals[1 - r]);
    }
  }
}

TEST_CASE("engine errors: ranks submitting different collectives get a clear error and no hang") {
  auto comms = mk::Communicator::createLocal(mkt::firstDevices(2));
  mkt::Streams streams(comms);
  mkt::DeviceBuffer a(comms[0].device(), 4096), b(comms[1].device(), 4096);
  comms[0].allReduce(a.get(), a.get() + 2048, 100, DType::Float32, RedOp::Sum, streams.s[0]);
  const std::string msg =
      errorOf([&] { comms[1].allReduce(b.get(), b.get() + 2048, 101, DType::Float32, RedOp::Sum, streams.s[1]); });
  CAPTURE(msg);
  CHECK(msg.find("differs between ranks") != std::string::npos);
  CHECK(msg.find("count 100") != std::string::npos);
  CHECK(msg.find("count 101") != std::string::npos);
  CHECK(errorOf([&] { comms[0].synchronize(); }).find("unusable") != std::string::npos);
  streams.sync(comms);  // the kernels stopped and released the stream waits
}

TEST_CASE("engine errors: a rank running a ring ahead of its peer is refused instead of blocking") {
  mk::CommConfig cfg;
  cfg.ringSlots = 4;
  auto comms = mk::Communicator::createLocal(mkt::firstDevices(2), cfg);
  mkt::Streams streams(comms);
  mkt::DeviceBuffer a(comms[0].device(), 4096);
  mk::groupStart();
  std::string msg;
  for (int k = 0; k < 6 && msg.empty(); ++k)
    msg = errorOf([&] { comms[0].allReduce(a.get(), a.get() + 2048, 16, DType::Float32, RedOp::Sum, streams.s[0]); });
  mk::groupEnd();
  CAPTURE(msg);
  CHECK(msg.find("ahead of rank(s) 1") != std::string::npos);
}

TEST_CASE("engine errors: a full doorbell ring applies back-pressure and loses no op") {
  mk::CommConfig cfg;
  cfg.ringSlots = 2;
  auto comms = mk::Communicator::createLocal(mkt::firstDevices(2), cfg);
  mkt::Streams streams(comms);
  const uint64_t count = 777;
  std::vector<std::unique_ptr<mkt::DeviceBuffer>> in, out;
  std::vector<std::vector<float>> vals;
  for (int r = 0; r < 2; ++r) {
    vals.push_back(mkt::randomValues(DType::Float32, count, 5 + r, true));
    in.push_back(std::make_unique<mkt::DeviceBuffer>(comms[r].device(), count * 4));
    out.push_back(std::make_unique<mkt::DeviceBuffer>(comms[r].device(), count * 4));
    in[r]->upload(vals[r].data(), count * 4);
  }
  mk::groupStart();
  for (int k = 0; k < 40; ++k)
    for (int r = 0; r < 2; ++r)
      comms[r].allReduce(in[r]->get(), out[r]->get(), count, DType::Float32, RedOp::Max, streams.s[r]);
  mk::groupEnd();
  streams.sync(comms);
  CHECK(comms[0].nextOpIndex() == 40);
  for (int r = 0; r < 2; ++r) {
    std::vector<float> got(count);
    out[r]->download(got.data(), count * 4);
    uint64_t bad = 0;
    for (uint64_t i = 0; i < count; ++i) bad += got[i] != std::max(vals[0][i], vals[1][i]);
    CHECK(bad == 0);
  }
}

TEST_CASE("engine errors: bad device lists are refused") {
  CHECK(errorOf([] { mk::Communicator::createLocal({}); }).find("empty") != std::string::npos);
  CHECK(errorOf([] { mk::Communicator::createLocal({0, 0}); }).find("listed twice") != std::string::npos);
  CHECK(errorOf([] {
          mk::Communicator::createLocal({0, 1, 2, 3, 4, 5, 6, 7, 8});
        }).find("at most") != std::string::npos);
  int n = 0;
  MK_CUDA_CHECK(cudaGetDeviceCount(&n));
  CHECK(errorOf([&] { mk::Communicator::createLocal({0, n}); }).find("more ranks than GPUs") != std::string::npos);
  mk::CommConfig many;
  many.premappedBuffers.assign(mk::CommConfig::kMaxPremapped + 1, nullptr);
  CHECK(errorOf([&] {
          mk::Communicator::createLocal({0, 1}, many);
        }).find("premappedBuffers lists 17") != std::string::npos);
}

TEST_CASE("engine errors: a missing profile file fails the creation naming it and a datasheet one is used by default") {
  mk::CommConfig cfg;
  cfg.profile = "/nonexistent/profile.json";
  CHECK(errorOf([&] { mk::Communicator::createLocal(mkt::firstDevices(2), cfg); }).find("/nonexistent/profile.json") !=
        std::string::npos);
  auto comms = mk::Communicator::createLocal(mkt::firstDevices(2));
  CHECK(comms[0].profileSource().find("datasheet") != std::string::npos);
}

TEST_CASE("engine errors: mismatched schedules through execute and unsupported steps are refused") {
  auto comms = mk::Communicator::createLocal(mkt::firstDevices(2));
  mkt::Streams streams(comms);
  mk::Schedule s = handMade(8);
  mk::Lane lane;
  mk::Step pp;
  pp.kind = mk::StepKind::ProxyPut;
  pp.dst = ref(1, 2, 0);
  pp.a = ref(0, 0, 0);
  pp.count = 8;
  lane.steps = {pp};
  s.lanes[0] = {lane};
  mkt::DeviceBuffer a(comms[0].device(), 1024);
  const std::string msg = errorOf([&] { comms[0].execute(s, a.get(), a.get() + 512, streams.s[0]); });
  CHECK(msg.find("ProxyPut") != std::string::npos);
  // Refused before anything was enqueued: the communicator still works.
  mk::CollectiveSpec spec;
  spec.op = mk::CollOp::AllReduce;
  spec.count = 33;
  CHECK(mkt::runAndCheck(comms, spec, false, 3) == 0);
}
