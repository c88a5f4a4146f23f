// CPU tests of the socket transport between forked processes on 127.0.0.1: puts of every size land whole before
// their flag and in order (direct, staged, checksummed, to itself), control messages keep their place, and an abort
// reaches every process.
#include <doctest/doctest.h>

#include <numeric>
#include <thread>

#include "mk/proxy/memory.hpp"
#include "proxy_test_util.hpp"

namespace {

using mk::proxy::PutArrival;
using mk::proxy::PutRequest;
using mkt::contains;

const std::vector<uint64_t> kSizes = {1, 100, 4095, 4096, 4097, 65535, 65536, 65537, 300001, (1u << 20) + 3};

uint64_t offsetOf(std::size_t k) { return std::accumulate(kSizes.begin(), kSizes.begin() + k, uint64_t{0}); }

/// Every process sends every size to every process (itself included); each receiver checks at putLanded that the
/// whole payload is in place, and that each sender's puts land in the order sent. 0 when all is well.
int exchange(int me, int n, uint16_t port, bool staged, bool checksum) {
  mk::TcpBootstrap boot(mkt::bootOptions(me, n, port));
  mk::proxy::TransportOptions opt = mkt::socketOptions(nullptr);
  opt.payloadChecksum = checksum;
  auto transport = mk::proxy::connectTransport(boot, opt);
  mk::proxy::HostCopier copier(!staged);
  mkt::HostSink sink;
  const uint64_t total = offsetOf(kSizes.size());
  for (int src = 0; src < n; ++src) sink.addBuffer(static_cast<uint32_t>(me), static_cast<uint16_t>(src), total);
  std::vector<uint32_t> nextFrom(static_cast<std::size_t>(n), 0);
  sink.onLanded = [&](const PutArrival& a) -> std::string {
    const uint32_t k = a.info.lane;  // the put's index
    if (a.fromProcess != static_cast<int>(a.info.srcRank)) return "fromProcess differs from srcRank";
    if (k != nextFrom[a.info.srcRank]++) return "put " + std::to_string(k) + " landed out of order";
    if (!a.info.signal || a.info.flagId != k || a.info.flagValue != k + 1) return "flag fields changed in flight";
    const std::vector<std::byte>& buf = sink.buffer(static_cast<uint32_t>(me), a.info.dstBuffer);
    for (uint64_t i = 0; i < a.info.bytes; ++i)
      if (buf[a.info.dstOffset + i] != mkt::patternByte(a.info.srcRank, k, i))
        return "put " + std::to_string(k) + " from " + std::to_string(a.info.srcRank) + ": byte " + std::to_string(i) +
               " is wrong when its flag is raised";
    return {};
  };
  transport->start(sink, copier);
  std::vector<std::vector<std::byte>> sources;
  for (std::size_t k = 0; k < kSizes.size(); ++k) {
    sources.emplace_back(kSizes[k]);
    for (uint64_t i = 0; i < kSizes[k]; ++i)
      sources.back()[i] = mkt::patternByte(static_cast<uint32_t>(me), static_cast<uint32_t>(k), i);
  }
  auto sender = transport->openSender(copier);
  for (std::size_t k = 0; k < kSizes.size(); ++k)
    for (int dst = 0; dst < n; ++dst) {
      PutRequest req;
      req.info.srcRank = static_cast<uint32_t>(me);
      req.info.dstRank = static_cast<uint32_t>(dst);
      req.info.lane = static_cast<uint32_t>(k);
      req.info.dstBuffer = static_cast<uint16_t>(me);
      req.info.dstOffset = offsetOf(k);
      req.info.bytes = kSizes[k];
      req.info.signal = true;
      req.info.flagId = static_cast<uint32_t>(k);
      req.info.flagValue = k + 1;
      req.src = sources[k].data();
      sender->put(dst, req);
    }
  sender->flush();
  const std::size_t expected = kSizes.size() * static_cast<std::size_t>(n);
  const bool all = sink.waitFor([&] { return sink.arrivals.size() == expected || !sink.failures.empty(); }, 20);
  int rc = 0;
  if (!all || sink.arrivals.size() != expected) {
    std::fprintf(stderr, "process %d: %zu of %zu puts landed\n", me, sink.arrivals.size(), expected);
    rc = 2;
  }
  for (const auto& p : sink.problems) {
    std::fprintf(stderr, "process %d: %s\n", me, p.c_str());
    rc = 3;
  }
  for (const auto& f : sink.failures) {
    std::fprintf(stderr, "process %d: failure %s\n", me, f.what());
    rc = 4;
  }
  boot.barrier();  // nobody closes while another still sends
  transport->close();
  return rc;
}

void checkAllZero(const std::vector<int>& codes) {
  for (std::size_t r = 0; r < codes.size(); ++r) {
    CAPTURE(r);
    CHECK(codes[r] == 0);
  }
}

}  // namespace

TEST_CASE("socket transport: puts of every size land whole before their flag and in order") {
  const uint16_t port = mkt::freePort();
  checkAllZero(mkt::forkRanks(
      3, [&](int r) { return exchange(r, 3, port, false, false); }, 60));
}

TEST_CASE("socket transport: the staged pipeline with payload checksums delivers the same bytes") {
  const uint16_t port = mkt::freePort();
  checkAllZero(mkt::forkRanks(
      2, [&](int r) { return exchange(r, 2, port, true, true); }, 60));
}

TEST_CASE("socket transport: one process reaches itself through its own connection") {
  const uint16_t port = mkt::freePort();
  checkAllZero(mkt::forkRanks(
      1, [&](int r) { return exchange(r, 1, port, true, false); }, 60));
}

TEST_CASE("socket transport: control messages arrive whole, after the puts sent before them") {
  const uint16_t port = mkt::freePort();
  const auto codes = mkt::forkRanks(
      2,
      [&](int me) {
        mk::TcpBootstrap boot(mkt::bootOptions(me, 2, port));
        auto transport = mk::proxy::connectTransport(boot, mkt::socketOptions(nullptr));
        mk::proxy::HostCopier copier;
        mkt::HostSink sink;
        sink.addBuffer(static_cast<uint32_t>(me), 0, 1 << 16);
        transport->start(sink, copier);
        const int peer = 1 - me;
        std::vector<std::byte> src(1 << 16, std::byte{7});
        auto sender = transport->openSender(copier);
        for (uint32_t i = 0; i < 3; ++i) {
          PutRequest req;
          req.info.srcRank = static_cast<uint32_t>(me);
          req.info.dstRank = static_cast<uint32_t>(peer);
          req.info.bytes = 1 << 16;
          req.src = src.data();
          sender->put(peer, req);
          sender->flush();
          mk::proxy::ControlMessage m;
          m.code = static_cast<uint16_t>(100 + i);
          m.srcRank = static_cast<uint32_t>(me);
          m.dstRank = static_cast<uint32_t>(peer);
          m.opTag = 4000 + i;
          m.value = 0x123456789abcdefull + i;
          m.aux = i;
          m.body.assign(1000 * i, static_cast<uint8_t>(i + 1));
          transport->sendControl(peer, m);
        }
        if (!sink.waitFor([&] { return sink.controls.size() == 3 && sink.arrivals.size() == 3; }, 10)) return 2;
        for (uint32_t i = 0; i < 3; ++i) {
          const auto& m = sink.controls[i];
          if (m.code != 100 + i || m.opTag != 4000 + i || m.value != 0x123456789abcdefull + i || m.aux != i ||
              m.fromProcess != peer || m.body != std::vector<uint8_t>(1000 * i, static_cast<uint8_t>(i + 1)))
            return 3;
        }
        boot.barrier();
        transport->close();
        return sink.failures.empty() ? 0 : 4;
      },
      30);
  checkAllZero(codes);
}

TEST_CASE("socket transport: an abort reaches every other process with its code and names the process") {
  const uint16_t port = mkt::freePort();
  const auto codes = mkt::forkRanks(
      3,
      [&](int me) {
        mk::TcpBootstrap boot(mkt::bootOptions(me, 3, port));
        auto transport = mk::proxy::connectTransport(boot, mkt::socketOptions(nullptr));
        mk::proxy::HostCopier copier;
        mkt::HostSink sink;
        transport->start(sink, copier);
        boot.barrier();
        if (me == 1) {
          transport->abortAll(mk::Error(mk::ErrorCode::Timeout, "rank 1 lane 3 step 9 gave up"));
          transport->abortAll(mk::Error(mk::ErrorCode::Internal, "a second abort is not sent"));
        } else {
          if (!sink.waitFor([&] { return !sink.failures.empty(); }, 5)) return 2;
          const mk::Error& e = sink.failures.front();
          std::fprintf(stderr, "process %d: %s\n", me, e.what());
          if (e.code() != mk::ErrorCode::Timeout) return 3;
          if (!contains(e.message(), "process 1 (127.0.0.1:") ||
              !contains(e.message(), "failed: rank 1 lane 3 step 9 gave up"))
            return 4;
        }
        boot.barrier();
        transport->close();
        return sink.failures.size() <= 1 ? 0 : 5;
      },
      30);
  checkAllZero(codes);
}
