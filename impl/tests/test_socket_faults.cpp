// CPU tests of the socket transport's faults, between forked processes (some of them hand-made peers that send what
// a correct process never sends): refused handshakes (token, version, rank, strangers) are logged and nothing they
// send reaches memory; a peer that never connects or never answers, a corrupted, truncated or over-long frame, a
// closed, stalled or killed peer each end in an mk::Error naming the peer within the budget.
#include <doctest/doctest.h>
#include <signal.h>

#include <thread>

#include "mk/proxy/memory.hpp"
#include "proxy_test_util.hpp"

namespace {

namespace wire = mk::proxy::wire;
using mk::proxy::PutRequest;
using mkt::contains;

double secondsSince(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

/// Runs `body` expecting it to throw mk::Error; returns the error ("" code when it did not throw).
template <class F>
mk::Error expectError(F&& body) {
  try {
    body();
  } catch (const mk::Error& e) {
    return e;
  }
  return mk::Error(mk::ErrorCode::Internal, "no error was thrown");
}

}  // namespace

TEST_CASE("socket faults: strangers are refused and logged, and nothing they send reaches memory") {
  const uint16_t port = mkt::freePort();
  const auto codes = mkt::forkRanks(
      3,
      [&](int me) -> int {
        mk::TcpBootstrap boot(mkt::bootOptions(me, 3, port));
        if (me == 2) {
          // Process 2 is hand-made: four strangers knock on process 0 (each followed by a put frame that would
          // write 0xEE), then it connects properly and sends one real put.
          mkt::FakePeer fake(boot);
          auto tryStranger = [&](const std::function<void(wire::Hello&)>& edit, wire::RejectReason want) {
            mkt::FakePeer stranger(fake);
            const wire::Hello answer = stranger.connect(0, edit);
            const wire::FrameHeader h = mkt::FakePeer::frame(wire::FrameType::Put, 0, [](wire::FrameHeader& f) {
              f.bytes = 64;
              f.flags = wire::kFrameSignal;
            });
            const std::vector<uint8_t> evil(64, 0xEE);
            try {
              stranger.sendRaw(&h, sizeof h);
              stranger.sendRaw(evil.data(), evil.size());
            } catch (const mk::Error&) {  // it may be closed already: fine
            }
            const bool ok = answer.kind == static_cast<uint16_t>(wire::HelloKind::Reject) &&
                            answer.reason == static_cast<uint32_t>(want) && answer.token[0] == 0 &&
                            stranger.closedWithin(2);
            if (!ok) std::fprintf(stderr, "stranger: kind %u reason %u\n", answer.kind, answer.reason);
            return ok;
          };
          if (!tryStranger([](wire::Hello& h) { h.token[0] ^= 1; }, wire::RejectReason::Token)) return 10;
          if (!tryStranger([](wire::Hello& h) { h.version = 2; }, wire::RejectReason::Version)) return 11;
          if (!tryStranger([](wire::Hello& h) { h.fromProcess = 7; }, wire::RejectReason::UnknownProcess)) return 12;
          {
            mkt::FakePeer stranger(fake);
            stranger.connectRaw(0);
            const char junk[48] = "GET / HTTP/1.1\r\nHost: x\r\n\r\n";
            stranger.sendRaw(junk, sizeof junk);
            if (!stranger.closedWithin(2)) return 13;
          }
          // Now as process 2 for real, to both processes.
          mkt::FakePeer to1(fake);
          if (to1.connect(1).kind != static_cast<uint16_t>(wire::HelloKind::Accept)) return 14;
          if (fake.connect(0).kind != static_cast<uint16_t>(wire::HelloKind::Accept)) return 15;
          const wire::FrameHeader h = mkt::FakePeer::frame(wire::FrameType::Put, 0, [](wire::FrameHeader& f) {
            f.srcRank = 2;
            f.bytes = 64;
            f.flags = wire::kFrameSignal;
            f.flagId = 3;
            f.value = 1;
          });
          const std::vector<uint8_t> good(64, 0x42);
          const wire::FrameTrailer t{wire::kTrailerMagic, 0, 0, 0};
          fake.sendRaw(&h, sizeof h);
          fake.sendRaw(good.data(), good.size());
          fake.sendRaw(&t, sizeof t);
          boot.barrier();  // process 0 checked its memory
          fake.goodbye(1);
          to1.goodbye(0);
          return 0;
        }
        std::vector<std::string> log;
        auto transport = mk::proxy::connectTransport(boot, mkt::socketOptions(&log));
        mk::proxy::HostCopier copier;
        mkt::HostSink sink;
        sink.addBuffer(static_cast<uint32_t>(me), 0, 64);
        transport->start(sink, copier);
        int rc = 0;
        if (me == 0) {
          if (!sink.waitFor([&] { return !sink.arrivals.empty() || !sink.failures.empty(); }, 5)) rc = 2;
          const auto& buf = sink.buffer(0, 0);
          for (std::byte b : buf)
            if (b != std::byte{0x42}) rc = 3;  // only the real put's bytes, never a stranger's
          int refusals = 0;
          for (const std::string& line : log)
            if (contains(line, "process 0 (127.0.0.1:") && contains(line, "refused a connection from 127.0.0.1:")) {
              refusals += contains(line, "claiming process 2: not the job's token");
              refusals += contains(line, "claiming process 2: inter-node protocol version 2 (this process speaks 1)");
              refusals += contains(line, "claiming process 7: process 7 is not one this process accepts");
              refusals += contains(line, ": not an mkernel handshake");
            }
          if (refusals != 4) {
            std::fprintf(stderr, "process 0: %d of 4 refusals logged\n", refusals);
            rc = 4;
          }
          if (!sink.failures.empty()) rc = 5;
        }
        boot.barrier();
        transport->close();
        return rc;
      },
      30);
  for (std::size_t r = 0; r < codes.size(); ++r) {
    CAPTURE(r);
    CHECK(codes[r] == 0);
  }
}

TEST_CASE("socket faults: a process that presents another token or never connects is named when the budget ends") {
  for (const bool wrongToken : {true, false}) {
    CAPTURE(wrongToken);
    const uint16_t port = mkt::freePort();
    const auto codes = mkt::forkRanks(
        2,
        [&](int me) -> int {
          mk::TcpBootstrap boot(mkt::bootOptions(me, 2, port));
          if (me == 1) {
            mkt::FakePeer fake(boot);
            if (wrongToken) {
              const wire::Hello answer = fake.connect(0, [](wire::Hello& h) { h.token[1] ^= 0xff; });
              if (answer.reason != static_cast<uint32_t>(wire::RejectReason::Token)) return 10;
            }
            std::this_thread::sleep_for(std::chrono::milliseconds(1500));  // never connects (again)
            return 0;
          }
          const auto t0 = std::chrono::steady_clock::now();
          const mk::Error e = expectError([&] { mk::proxy::connectTransport(boot, mkt::socketOptions(nullptr, 600)); });
          std::fprintf(stderr, "process 0 (%.2f s): %s\n", secondsSince(t0), e.what());
          if (e.code() != mk::ErrorCode::Timeout) return 2;
          if (!contains(e.message(),
                        "could not connect every process within 600 ms; never connected to it: process(es) 1"))
            return 3;
          if (wrongToken && !contains(e.message(), "refused meanwhile: [connection from 127.0.0.1:") &&
              !contains(e.message(), "claiming process 1: not the job's token"))
            return 4;
          return secondsSince(t0) < 3 ? 0 : 5;
        },
        30);
    CHECK(codes[0] == 0);
    CHECK(codes[1] == 0);
  }
}

TEST_CASE("socket faults: a process that accepts but never answers the handshake is named") {
  const uint16_t port = mkt::freePort();
  const auto codes = mkt::forkRanks(
      3,
      [&](int me) -> int {
        mk::TcpBootstrap boot(mkt::bootOptions(me, 3, port));
        if (me == 0) {
          // Process 0 listens (the kernel completes connections) but never answers; it must share a token.
          mkt::FakePeer fake(boot, [](wire::AddressRecord& r) { r.token[0] = 42; });
          std::this_thread::sleep_for(std::chrono::milliseconds(1500));
          return 0;
        }
        const auto t0 = std::chrono::steady_clock::now();
        const mk::Error e = expectError([&] { mk::proxy::connectTransport(boot, mkt::socketOptions(nullptr, 600)); });
        std::fprintf(stderr, "process %d (%.2f s): %s\n", me, secondsSince(t0), e.what());
        if (e.code() != mk::ErrorCode::Timeout) return 2;
        if (!contains(e.message(), "it could not reach: process 0 (127.0.0.1:") ||
            !contains(e.message(), "connected, but no handshake answer"))
          return 3;
        return secondsSince(t0) < 3 ? 0 : 4;
      },
      30);
  for (int c : codes) CHECK(c == 0);
}

TEST_CASE("socket faults: a process of another protocol version is refused by every process at setup") {
  const uint16_t port = mkt::freePort();
  const auto codes = mkt::forkRanks(
      3,
      [&](int me) -> int {
        mk::TcpBootstrap boot(mkt::bootOptions(me, 3, port));
        if (me == 2) {
          mkt::FakePeer fake(boot, [](wire::AddressRecord& r) { r.version = 2; });
          return 0;
        }
        const mk::Error e = expectError([&] { mk::proxy::connectTransport(boot, mkt::socketOptions(nullptr)); });
        std::fprintf(stderr, "process %d: %s\n", me, e.what());
        if (e.code() != mk::ErrorCode::Unsupported) return 2;
        return contains(e.message(),
                        "process 2 speaks inter-node protocol version 2, process " + std::to_string(me) + " version 1")
                   ? 0
                   : 3;
      },
      30);
  for (int c : codes) CHECK(c == 0);
}

namespace {

/// One bad thing a connected peer (hand-made process 1) does after a correct handshake, and what process 0 must say.
struct FrameFault {
  const char* name;
  std::function<void(mkt::FakePeer&)> send;
  const char* expected;   ///< in the error process 0's sink hears
  bool abortReachesPeer;  ///< process 0 tells process 1 it failed (the connection is still open)
};

std::vector<FrameFault> frameFaults() {
  auto put = [](uint64_t bytes, uint16_t flags, uint16_t buffer = 0) {
    return mkt::FakePeer::frame(wire::FrameType::Put, 0, [=](wire::FrameHeader& f) {
      f.srcRank = 1;
      f.bytes = bytes;
      f.flags = flags;
      f.buffer = buffer;
      f.value = 1;
    });
  };
  const std::vector<uint8_t> payload(100000, 0x5a);
  return {
      {"corrupted header",
       [=](mkt::FakePeer& p) {
         wire::FrameHeader h = put(1000, wire::kFrameSignal);
         h.offset ^= 8;  // a bit flipped after the CRC was computed
         p.sendRaw(&h, sizeof h);
         p.sendRaw(payload.data(), 1000);
       },
       "header CRC mismatch (corrupted header)", true},
      {"truncated put",
       [=](mkt::FakePeer& p) {
         const wire::FrameHeader h = put(100000, wire::kFrameSignal);
         p.sendRaw(&h, sizeof h);
         p.sendRaw(payload.data(), 5000);
         p.closeConnection();
       },
       "is truncated: the connection closed after 5000 of 100000 bytes", false},
      {"payload longer than its header",
       [=](mkt::FakePeer& p) {
         const wire::FrameHeader h = put(1000, wire::kFrameSignal);
         p.sendRaw(&h, sizeof h);
         p.sendRaw(payload.data(), 1016);  // 16 bytes too many where the trailer belongs
       },
       "no frame trailer where the payload should end", true},
      {"corrupted payload",
       [=](mkt::FakePeer& p) {
         const wire::FrameHeader h = put(1000, wire::kFrameSignal | wire::kFrameChecksum);
         const wire::FrameTrailer t{wire::kTrailerMagic, 0, wire::crc32c(payload.data(), 1000) ^ 1, 0};
         p.sendRaw(&h, sizeof h);
         p.sendRaw(payload.data(), 1000);
         p.sendRaw(&t, sizeof t);
       },
       "payload checksum mismatch", true},
      {"put outside every buffer",
       [=](mkt::FakePeer& p) {
         const wire::FrameHeader h = put(1000, wire::kFrameSignal, 9);
         p.sendRaw(&h, sizeof h);
         p.sendRaw(payload.data(), 1000);
       },
       "sent a put this process refuses (rank 1 lane 0 step 0 -> rank 0 op tag 0 buffer 9", true},
      {"closed connection", [](mkt::FakePeer& p) { p.closeConnection(); },
       "closed the connection without a goodbye (did that process die?)", false},
  };
}

}  // namespace

TEST_CASE("socket faults: a corrupted, truncated, over-long or refused frame fails the connection, never lands") {
  for (const FrameFault& fault : frameFaults()) {
    CAPTURE(fault.name);
    const uint16_t port = mkt::freePort();
    const auto codes = mkt::forkRanks(
        2,
        [&](int me) -> int {
          mk::TcpBootstrap boot(mkt::bootOptions(me, 2, port));
          if (me == 1) {
            mkt::FakePeer fake(boot);
            if (fake.connect(0).kind != static_cast<uint16_t>(wire::HelloKind::Accept)) return 10;
            fault.send(fake);
            if (fault.abortReachesPeer) {
              // Process 0 tells this process it failed: an abort frame naming the problem.
              wire::FrameHeader h{};
              fake.recvRaw(&h, sizeof h);
              if (h.type != static_cast<uint8_t>(wire::FrameType::Abort)) return 11;
              std::string text(h.bytes, '\0');
              fake.recvRaw(text.data(), text.size());
              if (!contains(text, fault.expected)) return 12;
            }
            boot.barrier();
            return 0;
          }
          auto transport = mk::proxy::connectTransport(boot, mkt::socketOptions(nullptr, 1000));
          mk::proxy::HostCopier copier;
          mkt::HostSink sink;
          sink.addBuffer(0, 0, 200000);
          transport->start(sink, copier);
          const int rc = mkt::expectFailure(sink, std::string("process 0, ") + fault.name,
                                            {"process 1 (127.0.0.1:", fault.expected});
          boot.barrier();
          transport->close();
          return rc;
        },
        30);
    CHECK(codes[0] == 0);
    CHECK(codes[1] == 0);
  }
}

TEST_CASE("socket faults: a put to a peer that stops reading fails as stalled within the budget") {
  const uint16_t port = mkt::freePort();
  constexpr std::size_t kBytes = 64u << 20;
  const auto codes = mkt::forkRanks(
      2,
      [&](int me) -> int {
        mk::TcpBootstrap boot(mkt::bootOptions(me, 2, port));
        auto transport = mk::proxy::connectTransport(boot, mkt::socketOptions(nullptr, 300));
        mk::proxy::HostCopier copier;
        mkt::HostSink sink;
        sink.addBuffer(static_cast<uint32_t>(me), 0, kBytes);
        // The receiver of process 1 stops reading for 1.5 s: TCP's buffers fill and process 0's send stalls.
        if (me == 1)
          sink.beforeDestination = [](const auto&) { std::this_thread::sleep_for(std::chrono::milliseconds(1500)); };
        transport->start(sink, copier);
        int rc = 0;
        if (me == 0) {
          std::vector<std::byte> src(kBytes, std::byte{1});
          PutRequest req;
          req.info.dstRank = 1;
          req.info.bytes = kBytes;
          req.info.signal = true;
          req.src = src.data();
          auto sender = transport->openSender(copier);
          const auto t0 = std::chrono::steady_clock::now();
          const mk::Error e = expectError([&] { sender->put(1, req); });
          std::fprintf(stderr, "process 0 (%.2f s): %s\n", secondsSince(t0), e.what());
          if (e.code() != mk::ErrorCode::Timeout) rc = 2;
          if (!contains(e.message(), "process 1 (127.0.0.1:") ||
              !contains(e.message(), "stalled: no byte accepted for 300 ms"))
            rc = 3;
          if (secondsSince(t0) > 1.4) rc = 4;  // before process 1 reads again
          // The connection is broken for good: the next put says so at once.
          if (!contains(expectError([&] { sender->put(1, req); }).message(), "stalled")) rc = 5;
        } else {
          // Process 0 gives up mid-frame: this process then sees the put cut short, and never reports it landed.
          rc = mkt::expectFailure(sink, "process 1", {"process 0 (127.0.0.1:"}, 10);
        }
        boot.barrier();
        transport->close();
        return rc;
      },
      30);
  CHECK(codes[0] == 0);
  CHECK(codes[1] == 0);
}

TEST_CASE("socket faults: a process killed in the middle of a put is named by every survivor") {
  const uint16_t port = mkt::freePort();
  constexpr std::size_t kBytes = 16u << 20;
  const auto codes = mkt::forkRanks(
      3,
      [&](int me) -> int {
        mk::TcpBootstrap boot(mkt::bootOptions(me, 3, port));
        auto transport = mk::proxy::connectTransport(boot, mkt::socketOptions(nullptr, 1000));
        mk::proxy::HostCopier copier(false);
        mkt::HostSink sink;
        sink.addBuffer(static_cast<uint32_t>(me), 0, kBytes);
        // Process 0 takes its time with the put's destination, so the kill lands while the put is under way.
        if (me == 0)
          sink.beforeDestination = [](const auto&) { std::this_thread::sleep_for(std::chrono::milliseconds(300)); };
        transport->start(sink, copier);
        boot.barrier();
        if (me == 1) {
          std::thread killer([] {
            std::this_thread::sleep_for(std::chrono::milliseconds(100));
            ::kill(::getpid(), SIGKILL);
          });
          std::vector<std::byte> src(kBytes, std::byte{3});
          PutRequest req;
          req.info.srcRank = 1;
          req.info.bytes = kBytes;
          req.info.signal = true;
          req.src = src.data();
          transport->openSender(copier)->put(0, req);
          killer.join();
          return 20;  // not reached
        }
        // The cut put is never reported landed.
        const int rc = mkt::expectFailure(sink, "process " + std::to_string(me), {"process 1 (127.0.0.1:"});
        transport->close();
        return rc;
      },
      30);
  CHECK(codes[0] == 0);
  CHECK(codes[1] == 128 + SIGKILL);
  CHECK(codes[2] == 0);
}
