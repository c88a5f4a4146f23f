// GPU tests of the engine under faults, on one GPU: an op descriptor corrupted (or written wrong) on purpose, and a
// rank process killed while ops are in flight. Each must end in an mk::Error on every rank that is still alive,
// within the communicator's budget, naming what went wrong; the survivors then destroy their communicator (bounded)
// and the GPU still runs a fresh communicator's collectives exactly.
//
// The descriptor cases run in one process (two ranks sharing GPU 0). The killed-rank cases re-launch this binary as
// rank processes sharing GPU 0 (multiprocess_launch.hpp), which needs CUDA MPS: without it they skip (exit 77); the
// GPU is then checked from a fresh process.
#include <doctest/doctest.h>

#include <cuda_runtime_api.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "engine/fault_injection.hpp"
#include "engine_test_util.hpp"
#include "multiprocess_cases.hpp"
#include "multiprocess_launch.hpp"

namespace {

using mk::device::DescriptorFault;
using Clock = std::chrono::steady_clock;

constexpr double kPollBudgetMs = 3000;
constexpr double kChildTimeoutS = 100;

double secondsSince(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

/// Whatever happened before, GPU `dev` still runs a fresh communicator: two ranks sharing it (small grids), an
/// all-reduce and an all-gather of odd sizes checked element-wise.
void gpuStillWorks(int dev) {
  mk::CommConfig cfg;
  cfg.shareGpus = true;
  cfg.workerCtas = 8;  // other survivors' processes may run the same check on the GPU at once
  cfg.pollBudgetMs = kPollBudgetMs;
  auto comms = mk::Communicator::createLocal({dev, dev}, cfg);
  mk::CollectiveSpec spec;
  spec.op = mk::CollOp::AllReduce;
  spec.count = 100003;
  CHECK(mkt::runAndCheck(comms, spec, false, 7) == 0);
  spec.op = mk::CollOp::AllGather;
  spec.count = 4099;
  CHECK(mkt::runAndCheck(comms, spec, false, 8) == 0);
}

// ---- a poisoned descriptor, one process ---------------------------------------------------------------------------

/// Two ranks sharing GPU 0 run one good all-reduce, then one whose descriptor carries `fault` for `victim`'s entry:
/// every rank's next call throws the kernel's refusal (naming `refuser` when it is >= 0: a fault of the shared words
/// is seen by both kernels, and the first to report it wins), the communicator is destroyed within its budget, and
/// a fresh one works.
void poisonedDescriptor(DescriptorFault fault, int victim, int refuser, const std::string& expectWords) {
  mk::CommConfig cfg;
  cfg.shareGpus = true;
  cfg.pollBudgetMs = kPollBudgetMs;
  const uint64_t count = 4097;
  std::vector<std::unique_ptr<mkt::DeviceBuffer>> bufs;
  for (int r = 0; r < 4; ++r) bufs.push_back(std::make_unique<mkt::DeviceBuffer>(0, count * 4));
  {
    auto comms = mk::Communicator::createLocal({0, 0}, cfg);
    mk::CollectiveSpec spec;
    spec.op = mk::CollOp::AllReduce;
    spec.count = count;
    REQUIRE(mkt::runAndCheck(comms, spec, false, 3) == 0);
    mkt::Streams streams(comms);
    mk::runtime::TestHooks::injectDescriptorFault(comms[static_cast<size_t>(victim)], fault);
    const auto t0 = Clock::now();
    {
      mkt::GroupGuard group;
      for (int r = 0; r < 2; ++r)
        comms[static_cast<size_t>(r)].allReduce(bufs[static_cast<size_t>(r)]->get(),
                                                bufs[static_cast<size_t>(2 + r)]->get(), count, mk::DType::Float32,
                                                mk::RedOp::Sum, streams.s[static_cast<size_t>(r)]);
    }
    for (int r = 0; r < 2; ++r) {
      const std::string msg = mkt::errorOf([&] { comms[static_cast<size_t>(r)].synchronize(); });
      CAPTURE(r);
      CAPTURE(msg);
      CHECK(contains(msg, "op descriptor refused"));
      CHECK(contains(msg, expectWords));
      if (refuser >= 0) CHECK(contains(msg, "rank " + std::to_string(refuser) + " op "));
    }
    const double detectS = secondsSince(t0);
    MESSAGE("refused in " << detectS * 1e3 << " ms");
    CHECK(detectS * 1e3 < kPollBudgetMs);  // the refusal is immediate: nothing waits out a budget
    // Every later call says the same, naming the first failure.
    CHECK(contains(mkt::errorOf([&] { comms[0].synchronize(); }), "op descriptor refused"));
    streams.sync(comms);  // the aborted op released the streams
    const auto t1 = Clock::now();
    comms.clear();
    MESSAGE("destroyed in " << secondsSince(t1) * 1e3 << " ms");
    CHECK(secondsSince(t1) * 1e3 < kPollBudgetMs);
  }
  gpuStillWorks(0);
}

// ---- a rank process killed mid-op, several processes under MPS -----------------------------------------------------

/// In the launcher: run `name` as `ranks` processes on GPU 0 (a fresh folder for their notes in MK_FAULT_DIR), CHECK
/// that `victim` died of SIGKILL and every other rank passed; then, in a fresh process (MK_FAULT_PHASE=verify), that
/// the GPU runs collectives exactly, retried for up to 60 s (under MPS, a client's fatal fault stops every client of
/// the GPU, and the server takes new ones once they have all exited). In a rank: false.
bool launch(const char* name, int ranks, int victim) {
  if (mkt::isRankProcess()) return false;
  mkt::skipWithoutMps();
  char dir[] = "/tmp/mk-faults.XXXXXX";
  REQUIRE(::mkdtemp(dir) != nullptr);
  const auto codes = mkt::execRanks(ranks, name, kChildTimeoutS, {std::string("MK_FAULT_DIR=") + dir}, /*gpus=*/1);
  for (size_t r = 0; r < codes.size(); ++r) {
    CAPTURE(r);
    CHECK(codes[r] == (static_cast<int>(r) == victim ? 128 + SIGKILL : 0));
  }
  const auto t0 = Clock::now();
  int verified = -1;
  for (int attempt = 0; verified != 0 && secondsSince(t0) < 60; ++attempt) {
    if (attempt > 0) ::usleep(500 * 1000);
    verified = mkt::execRanks(1, name, kChildTimeoutS, {"MK_FAULT_PHASE=verify"}, 1)[0];
  }
  MESSAGE("a fresh process ran collectives on the GPU " << secondsSince(t0) << " s after the ranks exited");
  CHECK(verified == 0);
  std::system((std::string("rm -rf ") + dir).c_str());
  return true;
}

/// In a process launch() started to check the GPU afterwards: true once it did.
bool verifyPhase() {
  const char* phase = std::getenv("MK_FAULT_PHASE");
  if (phase == nullptr || std::string(phase) != "verify") return false;
  gpuStillWorks(mkt::useLocalDevice());
  return true;
}

mk::CommConfig rankConfig(uint32_t ranksPerNode) {
  return mkt::sharedGpuNodesConfig(ranksPerNode, kPollBudgetMs, 20000);
}

std::string faultDir() {
  const char* d = std::getenv("MK_FAULT_DIR");
  REQUIRE(d != nullptr);
  return d;
}

double wallNowS() {
  timespec ts{};
  clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

/// This rank's body: a checked all-reduce, then back-to-back ring all-reduces of 32 MiB. Rank `victim` writes the
/// time and SIGKILLs itself once it has submitted `killAfter` of them (its kernel is then inside one, with more
/// queued); every other rank must get an mk::Error naming the victim (`expectWords`) within the poll budget of the
/// kill, and destroy its communicator within the budget. Under MPS a client that dies with work on the GPU can take
/// every client's CUDA context with it (an illegal-address fault reported to all, about 0.2 s after the kill): this
/// process then says so, and launch() checks the GPU from a fresh process.
void killedMidOp(uint32_t ranksPerNode, int victim, const std::string& expectWords) {
  mkt::useLocalDevice();
  const uint64_t count = 8u << 20;  // 32 MiB of float32
  mkt::Buffer a(count * 4), b(count * 4);
  const std::string note = faultDir() + "/killed";
  {
    auto owned = std::make_unique<mkt::Env>(rankConfig(ranksPerNode));
    mkt::Env& env = *owned;
    mk::CollectiveSpec spec;
    spec.op = mk::CollOp::AllReduce;
    spec.count = 1021;
    REQUIRE(mkt::runCase(env, a, b, spec, false, 11) == 0);
    const int me = env.comm.rank();
    const int killAfter = 3;
    mk::CollOptions ring(mk::Algorithm::Ring);
    std::string msg;
    try {
      for (int i = 0; i < 8; ++i) {
        if (me == victim && i == killAfter) {
          std::ofstream(note) << std::to_string(wallNowS()) << "\n";
          ::kill(::getpid(), SIGKILL);
        }
        env.comm.allReduce(a.p, b.p, count, mk::DType::Float32, mk::RedOp::Sum, env.stream, ring);
      }
      env.comm.synchronize();
    } catch (const mk::Error& e) {
      msg = e.what();
    }
    const double detected = wallNowS();
    CAPTURE(msg);
    REQUIRE(!msg.empty());  // a run that lost a rank cannot succeed
    double killedAt = 0;
    std::ifstream(note) >> killedAt;
    REQUIRE(killedAt > 0);
    const double afterKillMs = (detected - killedAt) * 1e3;
    MESSAGE("rank " << me << ": error " << afterKillMs << " ms after the kill: " << msg);
    CHECK(contains(msg, expectWords));
    CHECK(afterKillMs < kPollBudgetMs);
    // The error stays: every later call throws it.
    CHECK(!mkt::errorOf([&] { env.comm.synchronize(); }).empty());
    const cudaError_t e = cudaStreamSynchronize(env.stream);  // released by the abort, unless the context is lost
    if (e != cudaSuccess) MESSAGE("rank " << me << ": this process's CUDA context is lost: " << cudaGetErrorName(e));
    const auto t1 = Clock::now();
    owned.reset();
    MESSAGE("rank " << me << ": communicator destroyed in " << secondsSince(t1) * 1e3 << " ms");
    CHECK(secondsSince(t1) * 1e3 < kPollBudgetMs);
  }
}

}  // namespace

TEST_CASE("faults: a descriptor overwritten after it was published is refused on every rank, the GPU works after") {
  poisonedDescriptor(DescriptorFault::CheckWord, 0, -1, "do not match the check word");
}

TEST_CASE("faults: a descriptor with more bindings than the table is refused on every rank, the GPU works after") {
  poisonedDescriptor(DescriptorFault::Bindings, 1, -1, "bindings, more than the table's");
}

TEST_CASE("faults: a descriptor with a misaligned program address is refused on every rank, the GPU works after") {
  poisonedDescriptor(DescriptorFault::ProgramAddress, 1, 1, "not 16-byte aligned");
}

TEST_CASE("faults: a descriptor naming memory that is not a program is refused on every rank, the GPU works after") {
  poisonedDescriptor(DescriptorFault::ProgramHeader, 0, 0, "is not this rank's lowered program");
}

TEST_CASE("faults: 3 ranks of one node, rank 2 killed mid-op: both survivors name it within the budget") {
  if (launch("faults: 3 ranks of one node, rank 2 killed mid-op: both survivors name it within the budget", 3, 2) ||
      verifyPhase())
    return;
  killedMidOp(3, 2, "rank 2 (pid ");
}

TEST_CASE("faults: 2 nodes of 1 rank, rank 1 killed mid-op: rank 0 names it within the budget") {
  if (launch("faults: 2 nodes of 1 rank, rank 1 killed mid-op: rank 0 names it within the budget", 2, 1) ||
      verifyPhase())
    return;
  killedMidOp(1, 1, "process 1");
}
