// Tests of the CPU executor's hooks for runs that span processes (ExecOptions::localRanks and ::proxy), on
// hand-built schedules and through an in-process port that delivers each ProxyPut from a thread of its own after a
// delay — what a real proxy does, without the network (impl/tests covers that: mk_proxy_exec_tests).
#include <doctest/doctest.h>

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "mk/algorithms/algorithms.hpp"
#include "mk/error.hpp"
#include "mk/exec/executor.hpp"
#include "mk/exec/verify.hpp"

using namespace mk;

namespace {

bool contains(const std::string& hay, const std::string& needle) { return hay.find(needle) != std::string::npos; }

/// Delivers ProxyPuts like a proxy: the source is read when proxyPut() returns, the bytes and then the flag land
/// later (after `delay`) from another thread, through the run's RemoteEndpoint. With `drop`, nothing lands.
class DelayedPort final : public ProxyPort {
 public:
  explicit DelayedPort(std::chrono::milliseconds delay, bool drop = false) : delay_(delay), drop_(drop) {}

  void begin(const Schedule& s, HostMemory& mem, RemoteEndpoint& endpoint) override {
    s_ = &s;
    mem_ = &mem;
    endpoint_ = &endpoint;
    stop_ = false;
    worker_ = std::thread([this] { deliver(); });
    ++begun;
  }
  void proxyPut(uint32_t rank, uint32_t lane, uint32_t step) override {
    const Step& st = s_->lanes[rank][lane].steps[step];
    Item item;
    item.st = st;
    item.st.count = runtimeCount(*s_, st, rank, endpoint_->extents());
    if (item.st.count > 0) {
      const std::size_t esize = dtypeSize(s_->buffers[st.a.buffer].dtype);
      const std::byte* src = mem_->bytes[rank][st.a.buffer].data() + st.a.offset * esize;
      item.bytes.assign(src, src + item.st.count * esize);  // read now: the lane may overwrite it once we return
    }
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(std::move(item));
    cv_.notify_all();
    ++puts;
  }
  void end(std::exception_ptr error) noexcept override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
      cv_.notify_all();
    }
    worker_.join();
    ended = true;
    failed = error != nullptr;
  }

  int begun = 0, puts = 0;
  bool ended = false, failed = false;

 private:
  struct Item {
    Step st;
    std::vector<std::byte> bytes;
  };
  void deliver() {
    for (;;) {
      Item item;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
        if (queue_.empty()) return;
        item = std::move(queue_.front());
        queue_.pop_front();
      }
      std::this_thread::sleep_for(delay_);
      if (drop_) continue;
      try {
        const Step& st = item.st;
        if (!item.bytes.empty()) {
          const std::size_t esize = dtypeSize(s_->buffers[st.dst.buffer].dtype);
          std::byte* dst =
              endpoint_->remoteWriteTarget(st.dst.rank, st.dst.buffer, st.dst.offset * esize, item.bytes.size());
          std::memcpy(dst, item.bytes.data(), item.bytes.size());
        }
        if (st.flags & kStepSignal) endpoint_->remoteSignal(st.flag.rank, st.flag.id, st.value);
      } catch (...) {
        endpoint_->remoteFailure(std::current_exception());
      }
    }
  }

  std::chrono::milliseconds delay_;
  bool drop_;
  const Schedule* s_ = nullptr;
  HostMemory* mem_ = nullptr;
  RemoteEndpoint* endpoint_ = nullptr;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Item> queue_;
  bool stop_ = false;
  std::thread worker_;
};

/// Two ranks on two nodes: rank 0 proxyputs 8 floats into rank 1 and signals; rank 1 waits, then answers.
Schedule pingPong() {
  Schedule s;
  s.nRanks = 2;
  s.nodeOf = {0, 1};
  s.nFlags = 1;
  s.lanes.resize(2);
  s.info.op = "custom";
  s.buffers.push_back(BufferDecl{"buf", DType::Float32, BufferKind::InOut, {8, 8}});
  for (uint32_t r = 0; r < 2; ++r) {
    Step put;
    put.kind = StepKind::ProxyPut;
    put.count = 8;
    put.a = bufRef(r, 0, 0);
    put.dst = bufRef(1 - r, 0, 0);
    put.flags = kStepSignal;
    put.flag = FlagRef{1 - r, 0};
    put.value = 1;
    Step wait;
    wait.kind = StepKind::Wait;
    wait.flag = FlagRef{r, 0};
    wait.value = 1;
    Lane lane;
    lane.role = LaneRole::InterSend;
    if (r == 0) lane.steps = {put, wait};
    if (r == 1) lane.steps = {wait, put};
    s.lanes[r].push_back(lane);
  }
  return s;
}

}  // namespace

TEST_CASE("executor port: generated collectives across nodes run through a delayed port without a false deadlock") {
  // Every lane of a rank may be blocked while an increment is still in the port's queue: that is no deadlock.
  for (const Algorithm algo : {Algorithm::Hierarchical, Algorithm::Ring}) {
    CollectiveSpec spec;
    spec.op = CollOp::AllReduce;
    spec.algo = algo;
    spec.count = 1031;
    DelayedPort port(std::chrono::milliseconds(2));
    ExecOptions opt;
    opt.proxy = &port;
    opt.stallTimeout = std::chrono::milliseconds(5000);
    const VerifyResult v = verifyCollective(generate(spec, {0, 0, 1, 1, 2, 2}), spec, 11, InputKind::Uniform, opt);
    CHECK_MESSAGE(v.ok, v.detail);
    CHECK(port.begun == 1);
    CHECK(port.ended);
    CHECK_FALSE(port.failed);
    CHECK(port.puts > 0);
  }
}

TEST_CASE("executor port: a run over some ranks only runs them and leaves the others' memory alone") {
  const Schedule s = pingPong();
  HostMemory mem = HostMemory::allocate(s, {0});
  CHECK(mem.bytes[1].empty());
  for (uint32_t i = 0; i < 8; ++i) reinterpret_cast<float*>(mem.bytes[0][0].data())[i] = static_cast<float>(i);
  // Rank 1 is another process's: rank 0's wait is fed by nobody here, so the stall timeout (not a deadlock) ends
  // it, naming the rank whose proxyput it waits for.
  DelayedPort port(std::chrono::milliseconds(0), true);
  ExecOptions opt;
  opt.localRanks = {0};
  opt.proxy = &port;
  opt.stallTimeout = std::chrono::milliseconds(150);
  const auto t0 = std::chrono::steady_clock::now();
  try {
    execute(s, mem, opt);
    FAIL("a wait nobody feeds returned");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::Timeout);
    CHECK(contains(e.message(),
                   "rank 0 lane 0 (inter-send) step 1 (wait): waits for flag 0 >= 1, seen 0 (raised "
                   "through the proxy by rank(s) 1)"));
  }
  CHECK(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() < 3);
  CHECK(port.puts == 1);  // rank 0's put went to the port; rank 1's lane never ran here
  CHECK(port.failed);
}

TEST_CASE("executor port: steps that reach another process other than by proxyput are refused before any lane") {
  Schedule s = pingPong();
  HostMemory mem = HostMemory::allocate(s, {0});
  ExecOptions opt;
  opt.localRanks = {0};
  // Without a port a proxyput to another process's rank cannot go anywhere.
  CHECK_THROWS_WITH_AS(execute(s, mem, opt),
                       doctest::Contains("rank 0 lane 0 (inter-send) step 0 (proxyput): operand dst (no "
                                         "ExecOptions::proxy to reach it) is on rank 1, which another process runs"),
                       Error);
  // A copy reading another process's rank.
  Step copy;
  copy.kind = StepKind::Copy;
  copy.count = 8;
  copy.dst = bufRef(0, 0, 0);
  copy.a = bufRef(1, 0, 0);
  s.lanes[0][0].steps.insert(s.lanes[0][0].steps.begin(), copy);
  DelayedPort port(std::chrono::milliseconds(0));
  opt.proxy = &port;
  CHECK_THROWS_WITH_AS(execute(s, mem, opt),
                       doctest::Contains("operand a is on rank 1, which another process runs; only a proxyput crosses "
                                         "processes (this process runs rank 0)"),
                       Error);
  CHECK(port.begun == 0);  // refused before the run met anyone
  // A proxyput sized by an extent read from a buffer: the port sizes commands from the caller's values only.
  s = pingPong();
  s.buffers.push_back(BufferDecl{"n", DType::Int32, BufferKind::Input, {1, 1}});
  ExtentDecl n{"n", 8, 8.0};
  n.sourceBuffer = 1;
  s.extents = {n};
  s.lanes[0][0].steps[0].extent = 0;
  HostMemory withCount = HostMemory::allocate(s, {0});
  CHECK_THROWS_WITH_AS(execute(s, withCount, opt),
                       doctest::Contains("rank 0 lane 0 (inter-send) step 0 (proxyput): its extent 'n' is read from a "
                                         "buffer, but the proxy port sizes a proxyput from the caller's values"),
                       Error);
  CHECK(port.begun == 0);
  // A barrier needs every rank.
  s = pingPong();
  s.nBarriers = 1;
  Step barrier;
  barrier.kind = StepKind::Barrier;
  s.lanes[0][0].steps.push_back(barrier);
  CHECK_THROWS_WITH_AS(execute(s, mem, opt), doctest::Contains("a barrier needs every rank in one process"), Error);
  // Bad local rank lists.
  opt.localRanks = {0, 0};
  CHECK_THROWS_WITH_AS(execute(pingPong(), mem, opt), doctest::Contains("names rank 0 twice"), Error);
  opt.localRanks = {2};
  CHECK_THROWS_WITH_AS(execute(pingPong(), mem, opt), doctest::Contains("names rank 2, outside the schedule's 2"),
                       Error);
}

TEST_CASE("executor port: remote writes and signals outside the run are refused, and abort the run") {
  const Schedule s = pingPong();
  HostMemory mem = HostMemory::allocate(s, {1});
  struct Probe final : ProxyPort {
    std::vector<std::string> errors;
    void begin(const Schedule&, HostMemory&, RemoteEndpoint& e) override {
      auto expect = [&](auto&& f) {
        try {
          f();
          errors.push_back("accepted");
        } catch (const Error& err) {
          errors.push_back(err.message());
        }
      };
      expect([&] { e.remoteWriteTarget(0, 0, 0, 4); });    // rank 0 is not run here
      expect([&] { e.remoteWriteTarget(1, 3, 0, 4); });    // no buffer 3
      expect([&] { e.remoteWriteTarget(1, 0, 30, 4); });   // bytes [30, 34) of a 32-byte buffer
      expect([&] { e.remoteSignal(1, 5, 1); });            // no flag 5
      CHECK(e.remoteWriteTarget(1, 0, 28, 4) != nullptr);  // the last 4 bytes are fine
      e.remoteFailure(std::make_exception_ptr(Error(ErrorCode::IoError, "process 0 died")));
      CHECK(e.aborting());
    }
    void proxyPut(uint32_t, uint32_t, uint32_t) override {}
    void end(std::exception_ptr) noexcept override {}
  } probe;
  ExecOptions opt;
  opt.localRanks = {1};
  opt.proxy = &probe;
  CHECK_THROWS_WITH_AS(execute(s, mem, opt), doctest::Contains("process 0 died"), Error);
  REQUIRE(probe.errors.size() == 4);
  CHECK(contains(probe.errors[0], "remote write for rank 0, which this process does not run"));
  CHECK(contains(probe.errors[1], "remote write for buffer 3 of rank 1, the schedule declares 1"));
  CHECK(contains(probe.errors[2], "bytes [30, +4) is outside buffer 'buf' of rank 1 (32 bytes)"));
  CHECK(contains(probe.errors[3], "remote signal of flag 5 of rank 1: not a flag of a rank this process runs"));
}
