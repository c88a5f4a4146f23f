// CPU tests of the command FIFO's host side: the record layout, push / pop in position order across wrap-around,
// batching, back-pressure (never overwrite, never loss) with several pushers, and the bounded waits that name rank,
// lane, step and position.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "mk/error.hpp"
#include "mk/proxy/fifo.hpp"

namespace {

using mk::device::packProxyHeader;
using mk::device::ProxyCommand;
using mk::device::ProxyKind;
using mk::proxy::HostFifo;
using mk::proxy::PoppedCommand;
using mk::proxy::PushSite;

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

ProxyCommand command(uint32_t op, uint32_t lane, uint32_t step) {
  return ProxyCommand{packProxyHeader(ProxyKind::PutSignal, op, lane, step), 0};
}

}  // namespace

TEST_CASE("fifo: the header's fields round-trip at their widths") {
  const uint64_t h = packProxyHeader(ProxyKind::Signal, 4095, 65535, 0xfffffffeu);
  CHECK(mk::device::proxyKind(h) == ProxyKind::Signal);
  CHECK(mk::device::proxyOpTag(h) == 4095);
  CHECK(mk::device::proxyLane(h) == 65535);
  CHECK(mk::device::proxyStep(h) == 0xfffffffeu);
  // The op tag wraps at 4096: op 4096 and op 0 share a tag (at most that many ops are live at once).
  CHECK(mk::device::proxyOpTag(packProxyHeader(ProxyKind::Put, 4096 + 7, 1, 2)) == 7);
  CHECK(sizeof(ProxyCommand) == 16);
  CHECK(alignof(ProxyCommand) == 16);
}

TEST_CASE("fifo: push/pop keeps order across wrap-around and batches up to the limit") {
  HostFifo fifo(8);
  auto consumer = fifo.consumer();
  std::vector<PoppedCommand> out(16);
  uint64_t expected = 0;
  for (int round = 0; round < 5; ++round) {
    // 7 commands (the ring holds 8): every one comes back once, in position order, batched by 3.
    for (uint32_t i = 0; i < 7; ++i) {
      const auto pos = fifo.push(command(round, i, 100 * round + i), {0, i, i}, std::chrono::milliseconds(100));
      REQUIRE(pos.has_value());
      CHECK(*pos == expected + i);
    }
    std::size_t got = 0;
    while (got < 7) {
      const std::size_t n = consumer.poll(out.data(), 3);
      REQUIRE(n > 0);
      CHECK(n <= 3);
      for (std::size_t k = 0; k < n; ++k) {
        CHECK(out[k].position == expected + got + k);
        CHECK(mk::device::proxyStep(out[k].command.header) == 100 * round + got + k);
      }
      got += n;
      consumer.complete(expected + got);
    }
    CHECK(consumer.poll(out.data(), 16) == 0);  // slots were zeroed: nothing is taken twice
    expected += 7;
    CHECK(fifo.done() == expected);
  }
}

TEST_CASE("fifo: a full ring blocks the pusher until done passes, then the command lands") {
  HostFifo fifo(4);
  auto consumer = fifo.consumer();
  for (uint32_t i = 0; i < 4; ++i) REQUIRE(fifo.push(command(0, 0, i), {0, 0, i}, std::chrono::milliseconds(50)));
  std::atomic<bool> pushed{false};
  std::thread pusher([&] {
    fifo.push(command(0, 0, 4), {0, 0, 4}, std::chrono::milliseconds(5000));
    pushed = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  CHECK_FALSE(pushed.load());  // back-pressure: it waits, it does not overwrite slot 0
  std::vector<PoppedCommand> out(8);
  REQUIRE(consumer.poll(out.data(), 8) == 4);
  CHECK(mk::device::proxyStep(out[0].command.header) == 0);
  consumer.complete(1);
  pusher.join();
  CHECK(pushed.load());
  REQUIRE(consumer.poll(out.data(), 8) == 1);
  CHECK(out[0].position == 4);
  CHECK(mk::device::proxyStep(out[0].command.header) == 4);
}

TEST_CASE("fifo: a ring full for longer than the budget names rank, lane, step and position") {
  HostFifo fifo(2);
  REQUIRE(fifo.push(command(0, 0, 0), {3, 1, 0}, std::chrono::milliseconds(10)));
  REQUIRE(fifo.push(command(0, 0, 1), {3, 1, 1}, std::chrono::milliseconds(10)));
  const auto t0 = std::chrono::steady_clock::now();
  try {
    fifo.push(command(0, 0, 2), {3, 1, 7}, std::chrono::milliseconds(150));
    FAIL("a push into a full ring with no proxy returned");
  } catch (const mk::Error& e) {
    CHECK(e.code() == mk::ErrorCode::Timeout);
    CHECK(contains(e.message(), "rank 3 lane 1 step 7"));
    CHECK(contains(e.message(), "stayed full for 150 ms at position 2 (done 0, capacity 2)"));
    CHECK(contains(e.message(), "the proxy stopped answering"));
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  CHECK(s >= 0.14);
  CHECK(s < 2.0);
}

TEST_CASE("fifo: waiting for a command the proxy never handles times out naming it, cancel returns early") {
  HostFifo fifo(4);
  const auto pos = fifo.push(command(0, 2, 5), {1, 2, 5}, std::chrono::milliseconds(10));
  REQUIRE(pos);
  try {
    fifo.waitDone(*pos, {1, 2, 5}, std::chrono::milliseconds(100));
    FAIL("waitDone without a proxy returned");
  } catch (const mk::Error& e) {
    CHECK(e.code() == mk::ErrorCode::Timeout);
    CHECK(contains(e.message(), "rank 1 lane 2 step 5: the proxy has not handled FIFO position 0 within 100 ms"));
  }
  std::atomic<bool> cancel{false};
  std::thread canceller([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    cancel = true;
  });
  const auto t0 = std::chrono::steady_clock::now();
  CHECK_FALSE(fifo.waitDone(*pos, {1, 2, 5}, std::chrono::milliseconds(10000), [&] { return cancel.load(); }));
  canceller.join();
  CHECK(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() < 2.0);
  // A command of kind Empty would read as a free slot: refused.
  CHECK_THROWS_AS(fifo.push(ProxyCommand{0, 0}, {0, 0, 0}, std::chrono::milliseconds(10)), mk::Error);
}

TEST_CASE("fifo: four pushers and one consumer: every command once, each pusher's in its order") {
  HostFifo fifo(16);  // small: the pushers hit back-pressure all the time
  constexpr uint32_t kPushers = 4, kEach = 20000;
  std::vector<std::thread> pushers;
  for (uint32_t p = 0; p < kPushers; ++p)
    pushers.emplace_back([&, p] {
      for (uint32_t i = 0; i < kEach; ++i) fifo.push(command(p, p, i), {0, p, i}, std::chrono::milliseconds(10000));
    });
  auto consumer = fifo.consumer();
  std::vector<uint32_t> next(kPushers, 0);
  std::vector<PoppedCommand> out(8);
  uint64_t taken = 0;
  bool inOrder = true;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (taken < uint64_t{kPushers} * kEach && std::chrono::steady_clock::now() < deadline) {
    const std::size_t n = consumer.poll(out.data(), out.size());
    for (std::size_t k = 0; k < n; ++k) {
      inOrder = inOrder && out[k].position == taken + k;
      const uint32_t lane = mk::device::proxyLane(out[k].command.header);
      inOrder = inOrder && lane < kPushers && mk::device::proxyStep(out[k].command.header) == next[lane];
      if (lane < kPushers) ++next[lane];
    }
    taken += n;
    if (n) consumer.complete(taken);
  }
  for (auto& t : pushers) t.join();
  CHECK(inOrder);
  CHECK(taken == uint64_t{kPushers} * kEach);
  CHECK(fifo.head() == taken);
}

TEST_CASE("fifo: a consumer over foreign memory starts at its done, and bad shapes are refused") {
  std::vector<ProxyCommand> ring(8);
  uint64_t done = 5;
  mk::proxy::FifoConsumer c(ring.data(), &done, 8);
  CHECK(c.next() == 5);
  ring[5].arg = 42;
  __atomic_store_n(&ring[5].header, packProxyHeader(ProxyKind::Flush, 0, 0, 0), __ATOMIC_RELEASE);
  CHECK(c.ready());
  PoppedCommand out[2];
  REQUIRE(c.poll(out, 2) == 1);
  CHECK(out[0].position == 5);
  CHECK(out[0].command.arg == 42);
  CHECK(ring[5].header == 0);
  c.complete(6);
  CHECK(done == 6);
  CHECK_THROWS_AS(mk::proxy::FifoConsumer(ring.data(), &done, 6), mk::Error);
  CHECK_THROWS_AS(mk::proxy::FifoConsumer(nullptr, &done, 8), mk::Error);
  CHECK_THROWS_AS(HostFifo(3), mk::Error);
  CHECK_THROWS_AS(HostFifo(0), mk::Error);
}
