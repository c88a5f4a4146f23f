// CPU tests of the proxy itself, in one process whose ranks reach each other through the socket transport's
// connection to itself: commands of several FIFOs become puts in order, `done` passes them, and what goes wrong
// (a command the resolver refuses, an unknown kind, a claimed position never written) stops that FIFO's proxy and
// reaches the sink naming rank and position, within the budget.
#include <doctest/doctest.h>

#include <atomic>
#include <functional>
#include <map>
#include <thread>

#include "../bench/proxy_bench_sink.hpp"
#include "mk/proxy/proxy.hpp"
#include "mk/util/range.hpp"
#include "proxy_test_util.hpp"

namespace {

using mk::device::packProxyHeader;
using mk::device::ProxyCommand;
using mk::device::ProxyKind;
using mkt::contains;

/// Step s of any lane of rank r puts `bytes[s]` bytes of rank r's source into rank 1 - r's buffer 0 at s * 4096,
/// then signals flag s. Step 99 is refused.
class TableResolver final : public mk::proxy::ProxyResolver {
 public:
  std::vector<std::vector<std::byte>> sources;
  std::vector<uint64_t> bytes;
  mk::proxy::PutRequest resolve(uint32_t rank, const ProxyCommand& cmd, uint64_t) override {
    const uint32_t step = mk::device::proxyStep(cmd.header);
    if (step == 99) throw mk::Error(mk::ErrorCode::InvalidSchedule, "step 99 is no proxyput step");
    mk::proxy::PutRequest req;
    req.info.srcRank = rank;
    req.info.dstRank = 1 - rank;
    req.info.lane = mk::device::proxyLane(cmd.header);
    req.info.step = step;
    req.info.dstOffset = uint64_t{step} * 4096;
    req.info.bytes = bytes.at(step);
    req.info.signal = mk::device::proxyKind(cmd.header) != ProxyKind::Put;
    req.info.flagId = step;
    req.info.flagValue = 1;
    req.src = req.info.bytes ? sources.at(rank).data() : nullptr;
    return req;
  }
};

/// A one-process job: its transport, a sink with a buffer per rank, the proxy over two FIFOs (ranks 0 and 1).
struct Solo {
  mk::TcpBootstrap boot{mkt::bootOptions(0, 1, 1)};
  std::unique_ptr<mk::proxy::Transport> transport;
  mk::proxy::HostCopier copier;
  mkt::HostSink sink;
  TableResolver resolver;
  mk::proxy::HostFifo fifo[2] = {mk::proxy::HostFifo(8), mk::proxy::HostFifo(8)};
  std::unique_ptr<mk::proxy::Proxy> proxy;

  explicit Solo(std::chrono::milliseconds commandBudget = std::chrono::milliseconds(10000)) {
    transport = mk::proxy::connectTransport(boot, mkt::socketOptions(nullptr));
    for (uint32_t r = 0; r < 2; ++r) {
      sink.addBuffer(r, 0, 64 * 4096);
      resolver.sources.emplace_back(4096);
      for (uint32_t i = 0; i < 4096; ++i) resolver.sources[r][i] = mkt::patternByte(r, 0, i);
    }
    resolver.bytes.assign(100, 4096);
    resolver.bytes[3] = 0;  // a signal alone
    mk::proxy::ProxyOptions po;
    po.maxBatch = 4;
    po.commandBudget = commandBudget;
    proxy = std::make_unique<mk::proxy::Proxy>(*transport, resolver, sink, copier, po);
    proxy->setPlacement({0, 0});  // both ranks in this process
    for (uint32_t r = 0; r < 2; ++r) proxy->addFifo(r, fifo[r].consumer());
    proxy->start();
  }
  ~Solo() {
    proxy->stop();
    transport->close();
  }
  uint64_t push(uint32_t rank, ProxyKind kind, uint32_t step) {
    return *fifo[rank].push(ProxyCommand{packProxyHeader(kind, 0, 1, step), 0}, {rank, 1, step},
                            std::chrono::milliseconds(2000));
  }
};

}  // namespace

TEST_CASE("proxy: commands of several FIFOs become puts in order, and done passes each") {
  Solo s;
  for (uint32_t step = 0; step < 20; ++step)
    for (uint32_t r = 0; r < 2; ++r) {
      const ProxyKind kind = step == 3 ? ProxyKind::Signal : (step % 5 == 4 ? ProxyKind::Flush : ProxyKind::PutSignal);
      s.push(r, kind, step);
    }
  const uint64_t last = 19;
  for (uint32_t r = 0; r < 2; ++r) CHECK(s.fifo[r].waitDone(last, {r, 1, 19}, std::chrono::milliseconds(5000)));
  // Per rank: 15 puts with a signal and 1 signal alone; the 4 Flush commands send nothing.
  REQUIRE(s.sink.waitFor([&] { return s.sink.arrivals.size() == 32; }, 5));
  std::vector<uint32_t> next(2, 0);
  for (const auto& a : s.sink.arrivals) {
    CHECK(a.info.signal);
    CHECK(a.info.step >= next[a.info.srcRank]);  // in FIFO order per rank
    next[a.info.srcRank] = a.info.step + 1;
    if (a.info.bytes) {
      const auto& buf = s.sink.buffer(a.info.dstRank, 0);
      CHECK(buf[a.info.dstOffset + 4095] == mkt::patternByte(a.info.srcRank, 0, 4095));
    }
  }
  CHECK(s.proxy->handled(0) == 20);
  CHECK(s.proxy->handled(1) == 20);
  CHECK(s.sink.failures.empty());
}

TEST_CASE("proxy: a command the resolver refuses stops that FIFO's proxy and names rank and position") {
  Solo s;
  s.push(1, ProxyKind::PutSignal, 0);
  s.push(1, ProxyKind::PutSignal, 99);
  REQUIRE(s.sink.waitFor([&] { return !s.sink.failures.empty(); }, 5));
  const mk::Error& e = s.sink.failures[0];
  CHECK(e.code() == mk::ErrorCode::InvalidSchedule);
  CHECK(contains(e.message(),
                 "proxy of rank 1, FIFO position 1 (op tag 0, lane 1, step 99): step 99 is no proxyput step"));
  // The other FIFO's proxy goes on.
  s.push(0, ProxyKind::PutSignal, 5);
  CHECK(s.fifo[0].waitDone(0, {0, 1, 5}, std::chrono::milliseconds(5000)));
  // The refused FIFO does not advance past the command before the refused one: its pusher times out naming it.
  CHECK_THROWS_WITH_AS(s.fifo[1].waitDone(1, {1, 1, 99}, std::chrono::milliseconds(100)),
                       doctest::Contains("rank 1 lane 1 step 99: the proxy has not handled FIFO position 1"),
                       mk::Error);
}

TEST_CASE("proxy: an unknown command kind is refused naming it") {
  Solo s;
  s.fifo[0].push(ProxyCommand{packProxyHeader(static_cast<ProxyKind>(9), 0, 2, 4), 0}, {0, 2, 4},
                 std::chrono::milliseconds(100));
  REQUIRE(s.sink.waitFor([&] { return !s.sink.failures.empty(); }, 5));
  CHECK(contains(s.sink.failures[0].message(),
                 "proxy of rank 0, FIFO position 0 (op tag 0, lane 2, step 4): unknown command kind 9"));
}

TEST_CASE("proxy: a position claimed but never written is a timeout naming rank and position") {
  Solo s(std::chrono::milliseconds(150));
  // A pusher claims position 0 and dies before writing it; the next pusher writes position 1.
  mk::device::ProxyFifoDeviceHandle h = s.fifo[1].handle();
  __atomic_fetch_add(h.head, 1, __ATOMIC_RELAXED);
  s.push(1, ProxyKind::PutSignal, 1);
  const auto t0 = std::chrono::steady_clock::now();
  REQUIRE(s.sink.waitFor([&] { return !s.sink.failures.empty(); }, 5));
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const mk::Error& e = s.sink.failures[0];
  CHECK(e.code() == mk::ErrorCode::Timeout);
  CHECK(contains(e.message(),
                 "proxy of rank 1: FIFO position 0 was claimed but its command never arrived within 150 "
                 "ms, while position 1 holds one"));
  CHECK(seconds < 2);
  CHECK(s.sink.arrivals.empty());
}

namespace {

/// A one-process job whose single FIFO has no bell (as a GPU's: the consumer sleeps between polls), with the
/// poll hook under test.
struct Hooked {
  mk::TcpBootstrap boot{mkt::bootOptions(0, 1, 1)};
  std::unique_ptr<mk::proxy::Transport> transport;
  mk::proxy::HostCopier copier;
  mkt::HostSink sink;
  TableResolver resolver;
  mk::proxy::HostFifo fifo{8};
  std::unique_ptr<mk::proxy::Proxy> proxy;

  Hooked(std::function<bool()> poll, std::chrono::microseconds idleSpin, std::chrono::microseconds maxIdleSleep) {
    transport = mk::proxy::connectTransport(boot, mkt::socketOptions(nullptr));
    sink.addBuffer(1, 0, 64 * 4096);
    resolver.sources.emplace_back(4096);
    resolver.bytes.assign(100, 4096);
    mk::proxy::ProxyOptions po;
    po.idleSpin = idleSpin;
    po.maxIdleSleep = maxIdleSleep;
    po.poll = std::move(poll);
    proxy = std::make_unique<mk::proxy::Proxy>(*transport, resolver, sink, copier, po);
    proxy->setPlacement({0, 0});
    const mk::device::ProxyFifoDeviceHandle h = fifo.handle();
    proxy->addFifo(0, mk::proxy::FifoConsumer(h.ring, const_cast<uint64_t*>(h.done), h.capacity));  // no bell
    proxy->start();
  }
  ~Hooked() {
    proxy->stop();
    transport->close();
  }
};

/// Polls `cond` every millisecond for up to `seconds`.
bool waitUntil(const std::function<bool()>& cond, double seconds) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (!cond()) {
    if (std::chrono::steady_clock::now() > end) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

}  // namespace

TEST_CASE("proxy: the poll hook runs on the consumer thread and keeps it spinning while it says busy") {
  std::atomic<uint64_t> calls{0};
  std::atomic<bool> busy{true};
  const std::thread::id me = std::this_thread::get_id();
  std::atomic<bool> onOtherThread{true};
  Hooked h(
      [&] {
        if (std::this_thread::get_id() == me) onOtherThread = false;
        calls.fetch_add(1);
        return busy.load();
      },
      std::chrono::microseconds(10), std::chrono::microseconds(1000));
  // Busy: called round after round while the FIFO stays empty.
  REQUIRE(waitUntil([&] { return calls.load() > 1000; }, 5));
  // Idle: the consumer sleeps between polls and still calls it; wake() is harmless at any time.
  busy = false;
  h.proxy->wake();
  const uint64_t idle = calls.load();
  REQUIRE(waitUntil([&] { return calls.load() > idle + 10; }, 5));
  // A command goes through, and the hook runs after it.
  const uint64_t beforePut = calls.load();
  h.fifo.push(ProxyCommand{packProxyHeader(ProxyKind::PutSignal, 0, 1, 2), 0}, {0, 1, 2},
              std::chrono::milliseconds(2000));
  CHECK(h.fifo.waitDone(0, {0, 1, 2}, std::chrono::milliseconds(5000)));
  CHECK(waitUntil([&] { return calls.load() > beforePut; }, 5));
  CHECK(onOtherThread.load());
  CHECK(h.sink.failures.empty());
}

TEST_CASE("proxy: a poll hook that throws fails the consumer like a send, naming its rank") {
  Hooked h([]() -> bool { throw mk::Error(mk::ErrorCode::IoError, "relay: the peer is gone"); },
           std::chrono::microseconds(10), std::chrono::microseconds(1000));
  REQUIRE(h.sink.waitFor([&] { return !h.sink.failures.empty(); }, 5));
  CHECK(h.sink.failures[0].code() == mk::ErrorCode::IoError);
  CHECK(contains(h.sink.failures[0].message(), "proxy of rank 0"));
  CHECK(contains(h.sink.failures[0].message(), "relay: the peer is gone"));
}

// ---- range checks that cannot wrap (mk/util/range.hpp) and the sinks that use it ----------------------------------

namespace {

constexpr uint64_t kMax = UINT64_MAX;

/// A put of `bytes` bytes at `offset` into buffer 0 of rank 0.
mk::proxy::PutArrival arrival(uint64_t offset, uint64_t bytes) {
  mk::proxy::PutArrival a;
  a.info.srcRank = 1;
  a.info.dstRank = 0;
  a.info.dstBuffer = 0;
  a.info.dstOffset = offset;
  a.info.bytes = bytes;
  return a;
}

/// Offsets and lengths whose sum wraps past 2^64 to a small number: a check by addition lets them in.
const std::vector<std::pair<uint64_t, uint64_t>> kWrapping = {
    {kMax - 15, 32}, {16, kMax - 7}, {kMax, 1}, {1, kMax}, {kMax, kMax}};

}  // namespace

TEST_CASE("range: rangeInside accepts exactly the ranges inside the region, also near 2^64") {
  static_assert(mk::rangeInside(0, 0, 0) && !mk::rangeInside(kMax - 15, 32, 64), "usable in constant expressions");
  // Zero bytes: inside anywhere up to and including the end, never past it.
  CHECK(mk::rangeInside(0, 0, 0));
  CHECK(mk::rangeInside(64, 0, 64));
  CHECK_FALSE(mk::rangeInside(65, 0, 64));
  CHECK_FALSE(mk::rangeInside(kMax, 0, 64));
  // The last byte, the whole region, one byte too many.
  CHECK(mk::rangeInside(63, 1, 64));
  CHECK(mk::rangeInside(0, 64, 64));
  CHECK_FALSE(mk::rangeInside(64, 1, 64));
  CHECK_FALSE(mk::rangeInside(1, 64, 64));
  CHECK_FALSE(mk::rangeInside(0, 65, 64));
  // Offsets and lengths near 2^64, where offset + bytes wraps.
  for (const auto& range : kWrapping) {
    const uint64_t offset = range.first, bytes = range.second;
    CAPTURE(offset);
    CAPTURE(bytes);
    CHECK_FALSE(mk::rangeInside(offset, bytes, 64));
    CHECK_FALSE(mk::rangeInside(offset, bytes, kMax - 1));
  }
  // A region as large as 64 bits allow.
  CHECK(mk::rangeInside(kMax - 16, 16, kMax));
  CHECK(mk::rangeInside(0, kMax, kMax));
  CHECK_FALSE(mk::rangeInside(kMax - 15, 16, kMax));
  CHECK(mk::rangeText(kMax - 15, 32) == "[18446744073709551600, +32)");
}

TEST_CASE("range: the test sink and mk-proxy-bench's sink refuse puts whose offset + bytes wraps, naming them") {
  mkt::HostSink host;
  host.addBuffer(0, 0, 4096);
  mk::bench::CountingSink bench(4096);
  for (mk::proxy::ProxySink* sink :
       {static_cast<mk::proxy::ProxySink*>(&host), static_cast<mk::proxy::ProxySink*>(&bench)}) {
    CAPTURE(sink == &host ? "HostSink" : "CountingSink");
    for (const auto& range : kWrapping) {
      const uint64_t offset = range.first, bytes = range.second;
      CAPTURE(offset);
      CAPTURE(bytes);
      CHECK_THROWS_WITH_AS(sink->putDestination(arrival(offset, bytes)),
                           doctest::Contains(mk::rangeText(offset, bytes).c_str()), mk::Error);
    }
    CHECK_THROWS_AS(sink->putDestination(arrival(4096 - 31, 32)), mk::Error);
    CHECK(sink->putDestination(arrival(4096 - 32, 32)) != nullptr);
  }
  for (const std::byte b : host.buffer(0, 0)) REQUIRE(b == std::byte{0});
}

TEST_CASE("range: a peer's put at offset 2^64 - 16 fails its connection naming the range, and writes nothing") {
  namespace wire = mk::proxy::wire;
  const uint16_t port = mkt::freePort();
  const auto codes = mkt::forkRanks(
      2,
      [&](int me) -> int {
        mk::TcpBootstrap boot(mkt::bootOptions(me, 2, port));
        if (me == 1) {
          mkt::FakePeer fake(boot);
          if (fake.connect(0).kind != static_cast<uint16_t>(wire::HelloKind::Accept)) return 10;
          // With offset + bytes = 16 a check by addition passes and the payload lands 16 bytes before the buffer.
          const wire::FrameHeader h = mkt::FakePeer::frame(wire::FrameType::Put, 0, [](wire::FrameHeader& f) {
            f.srcRank = 1;
            f.offset = kMax - 15;
            f.bytes = 32;
          });
          const std::vector<uint8_t> payload(32, 0x5a);
          const wire::FrameTrailer t{wire::kTrailerMagic, 0, 0, 0};
          fake.sendRaw(&h, sizeof h);
          fake.sendRaw(payload.data(), payload.size());
          fake.sendRaw(&t, sizeof t);
          boot.barrier();
          return 0;
        }
        auto transport = mk::proxy::connectTransport(boot, mkt::socketOptions(nullptr, 1000));
        mk::proxy::HostCopier copier;
        mkt::HostSink sink;
        sink.addBuffer(0, 0, 4096);
        transport->start(sink, copier);
        int rc = mkt::expectFailure(sink, "process 0, a put at 2^64 - 16",
                                    {"process 1 (127.0.0.1:", "[18446744073709551600, +32) outside the buffer"});
        for (const std::byte b : sink.buffer(0, 0))
          if (b != std::byte{0}) rc = 5;
        boot.barrier();
        transport->close();
        return rc;
      },
      30);
  CHECK(codes[0] == 0);
  CHECK(codes[1] == 0);
}
