// CPU tests of the ibverbs transport without an RDMA device: the endpoint record, and the per-peer state machine and
// slot protocol (ib_peer.hpp) driven over an in-memory double of the verbs (this file is the only place one is
// used). The double checks what a NIC would: queue pair states in order, keys and bounds of every write, a posted
// receive for every write and send with immediate. Also the real refusal on this machine, which has no RDMA device.
#include <doctest/doctest.h>

#include <atomic>
#include <deque>
#include <map>
#include <thread>

#include "mk/bootstrap.hpp"
#include "mk/proxy/memory.hpp"
#include "proxy/ib/ib_peer.hpp"
#include "proxy/wire.hpp"
#include "proxy_test_util.hpp"

namespace {

namespace ib = mk::proxy::ib;
using mkt::contains;

/// Two fake devices share one fabric: the queue pairs, the registrations (by key) and a hook that corrupts a write.
struct FakeFabric {
  struct Qp {
    int device = 0;
    int state = 0;  ///< 0 RESET, 1 INIT, 2 RTR, 3 RTS
    uint32_t remoteQpn = 0, remotePsn = 0, sendPsn = 0;
    std::deque<uint64_t> recvs;  ///< posted receive ids
  };
  struct Mr {
    uint64_t addr, length;
    uint32_t key;
    bool remoteWrite;
  };
  std::mutex mu;
  std::map<uint32_t, Qp> qps;
  std::vector<Mr> mrs;
  uint32_t nextQpn = 0x100, nextKey = 7;
  std::vector<std::deque<ib::Completion>> cqs{2};
  std::function<void(std::byte* frame, std::size_t bytes)> corrupt;  ///< applied to the next write's landed bytes
  std::vector<std::string> transitions;                              ///< "device 0 qp 256 -> RTR (remote 257 psn 9)"

  bool inRegion(uint64_t addr, uint64_t len, uint32_t key, bool needRemote) {
    for (const Mr& m : mrs)
      if (m.key == key && addr >= m.addr && addr + len <= m.addr + m.length && (!needRemote || m.remoteWrite))
        return true;
    return false;
  }
};

class FakeVerbs final : public ib::VerbsApi {
 public:
  FakeVerbs(FakeFabric& f, int device) : f_(f), device_(device) {}
  std::string failTransition;  ///< "INIT", "RTR" or "RTS": that transition throws

  std::vector<std::string> deviceNames(std::string*) override { return {"fake" + std::to_string(device_)}; }
  ib::PortInfo open(const std::string&, uint8_t, uint32_t) override {
    ib::PortInfo p;
    p.lid = static_cast<uint16_t>(10 + device_);
    p.mtuBytes = device_ == 0 ? 4096 : 2048;
    p.active = true;
    return p;
  }
  ib::MemoryRegion registerHost(void* addr, std::size_t bytes, bool remoteWrite) override {
    std::lock_guard<std::mutex> lock(f_.mu);
    const uint32_t key = f_.nextKey++;
    f_.mrs.push_back({reinterpret_cast<uint64_t>(addr), bytes, key, remoteWrite});
    return ib::MemoryRegion{key, reinterpret_cast<uint64_t>(addr), bytes, key, key};
  }
  ib::MemoryRegion registerDmabuf(int, uint64_t, std::size_t, uint64_t) override {
    throw mk::Error(mk::ErrorCode::Unsupported, "no dma-buf in the double");
  }
  void deregister(const ib::MemoryRegion&) noexcept override {}
  ib::QueuePair createQp(uint32_t, uint32_t) override {
    std::lock_guard<std::mutex> lock(f_.mu);
    const uint32_t qpn = f_.nextQpn++;
    f_.qps[qpn].device = device_;
    return ib::QueuePair{qpn, qpn};
  }
  void toInit(const ib::QueuePair& qp, uint8_t) override { move(qp, 0, 1, "INIT", ""); }
  void toRtr(const ib::QueuePair& qp, uint8_t, const ib::RemoteAddress& r, uint8_t) override {
    move(qp, 1, 2, "RTR",
         " (remote " + std::to_string(r.qpn) + " psn " + std::to_string(r.psn) + " mtu " + std::to_string(r.mtuBytes) +
             ")");
    std::lock_guard<std::mutex> lock(f_.mu);
    f_.qps[qp.qpn].remoteQpn = r.qpn;
    f_.qps[qp.qpn].remotePsn = r.psn;
  }
  void toRts(const ib::QueuePair& qp, uint32_t psn) override {
    move(qp, 2, 3, "RTS", " (psn " + std::to_string(psn) + ")");
  }
  void destroyQp(const ib::QueuePair&) noexcept override {}

  void postWriteImm(const ib::QueuePair& qp, uint64_t wrId, const ib::Sge* sges, int count, uint64_t remoteAddr,
                    uint32_t rkey, uint32_t imm) override {
    std::lock_guard<std::mutex> lock(f_.mu);
    FakeFabric::Qp& me = f_.qps.at(qp.qpn);
    if (me.state != 3) throw mk::Error(mk::ErrorCode::IoError, "ibv_post_send: queue pair not in RTS");
    uint64_t total = 0;
    for (int i = 0; i < count; ++i) {
      REQUIRE(f_.inRegion(sges[i].addr, sges[i].length, sges[i].lkey, false));  // a NIC would fault the request
      total += sges[i].length;
    }
    FakeFabric::Qp& peer = f_.qps.at(me.remoteQpn);
    if (peer.state < 2 || peer.remoteQpn != qp.qpn) return complete(me, wrId, "remote queue pair not connected");
    if (!f_.inRegion(remoteAddr, total, rkey, true)) return complete(me, wrId, "remote access error");
    if (peer.recvs.empty()) return complete(me, wrId, "receiver not ready (no posted receive)");
    auto* dst = reinterpret_cast<std::byte*>(remoteAddr);
    for (int i = 0; i < count; ++i) {
      std::memcpy(dst, reinterpret_cast<const void*>(sges[i].addr), sges[i].length);
      dst += sges[i].length;
    }
    if (f_.corrupt) {
      f_.corrupt(reinterpret_cast<std::byte*>(remoteAddr), total);
      f_.corrupt = nullptr;
    }
    ib::Completion arrived;
    arrived.wrId = peer.recvs.front();
    peer.recvs.pop_front();
    arrived.qpn = me.remoteQpn;
    arrived.kind = ib::CompletionKind::RecvWriteImm;
    arrived.ok = true;
    arrived.imm = imm;
    f_.cqs[static_cast<std::size_t>(peer.device)].push_back(arrived);
    complete(me, wrId, "", ib::CompletionKind::WriteImm, qp.qpn);
  }
  void postSendImm(const ib::QueuePair& qp, uint64_t wrId, uint32_t imm) override {
    std::lock_guard<std::mutex> lock(f_.mu);
    FakeFabric::Qp& me = f_.qps.at(qp.qpn);
    FakeFabric::Qp& peer = f_.qps.at(me.remoteQpn);
    if (peer.recvs.empty()) return complete(me, wrId, "receiver not ready (no posted receive)");
    ib::Completion arrived;
    arrived.wrId = peer.recvs.front();
    peer.recvs.pop_front();
    arrived.qpn = me.remoteQpn;
    arrived.kind = ib::CompletionKind::RecvSendImm;
    arrived.ok = true;
    arrived.imm = imm;
    f_.cqs[static_cast<std::size_t>(peer.device)].push_back(arrived);
    complete(me, wrId, "", ib::CompletionKind::SendImm, qp.qpn);
  }
  void postRecv(const ib::QueuePair& qp, uint64_t wrId) override {
    std::lock_guard<std::mutex> lock(f_.mu);
    FakeFabric::Qp& me = f_.qps.at(qp.qpn);
    if (me.state < 1) throw mk::Error(mk::ErrorCode::IoError, "ibv_post_recv: queue pair in RESET");
    me.recvs.push_back(wrId);
  }
  std::size_t pollCq(ib::Completion* out, std::size_t max) override {
    std::lock_guard<std::mutex> lock(f_.mu);
    auto& cq = f_.cqs[static_cast<std::size_t>(device_)];
    std::size_t n = 0;
    while (n < max && !cq.empty()) {
      out[n++] = cq.front();
      cq.pop_front();
    }
    return n;
  }

 private:
  void move(const ib::QueuePair& qp, int from, int to, const char* name, const std::string& detail) {
    std::lock_guard<std::mutex> lock(f_.mu);
    FakeFabric::Qp& q = f_.qps.at(qp.qpn);
    if (q.state != from)
      throw mk::Error(mk::ErrorCode::IoError, std::string("ibv_modify_qp(") + name + ") failed: Invalid argument");
    if (failTransition == name)
      throw mk::Error(mk::ErrorCode::IoError, std::string("ibv_modify_qp(") + name + ") failed: injected");
    q.state = to;
    f_.transitions.push_back("device " + std::to_string(device_) + " qp " + std::to_string(qp.qpn) + " -> " + name +
                             detail);
  }
  /// Local completion of a send-side request (or its failure with `error`; locked by the caller).
  void complete(FakeFabric::Qp& me, uint64_t wrId, const std::string& error,
                ib::CompletionKind kind = ib::CompletionKind::Other, uint32_t qpn = 0) {
    ib::Completion c;
    c.wrId = wrId;
    c.ok = error.empty();
    c.status = error;
    c.kind = kind;
    c.qpn = qpn;
    for (auto& [n, q] : f_.qps)
      if (&q == &me) c.qpn = n;
    f_.cqs[static_cast<std::size_t>(device_)].push_back(c);
  }

  FakeFabric& f_;
  int device_;
};

/// Two processes' connections to each other over the double, each with a sink over host memory, and a progress
/// thread per side (as the transport runs one).
struct Pair {
  FakeFabric fabric;
  FakeVerbs verbs[2] = {FakeVerbs(fabric, 0), FakeVerbs(fabric, 1)};
  mk::proxy::HostCopier memory[2] = {mk::proxy::HostCopier(true), mk::proxy::HostCopier(true)};
  mkt::HostSink sink[2];
  std::unique_ptr<ib::IbPeer> peer[2];
  ib::EndpointRecord record[2]{};
  std::atomic<bool> stop{false};
  std::vector<std::thread> progress;
  std::vector<std::string> progressErrors;
  std::mutex errMu;

  explicit Pair(ib::PeerOptions o) {
    for (int s = 0; s < 2; ++s) {
      peer[s] = std::make_unique<ib::IbPeer>(verbs[s], s, 1 - s, "process " + std::to_string(1 - s), o);
      record[s] = peer[s]->open(verbs[s].open("", 1, 64), memory[s]);
      sink[s].addBuffer(static_cast<uint32_t>(s), 0, 8u << 20);
    }
  }
  void connect() {
    for (int s = 0; s < 2; ++s) peer[s]->connect(record[1 - s], verbs[s].open("", 1, 64));
  }
  void startProgress() {
    for (int s = 0; s < 2; ++s)
      progress.emplace_back([this, s] {
        auto stream = memory[s].openStream();
        ib::Completion batch[16];
        while (!stop.load()) {
          const std::size_t n = verbs[s].pollCq(batch, 16);
          for (std::size_t i = 0; i < n; ++i) try {
              peer[s]->onCompletion(batch[i], sink[s], *stream);
            } catch (const mk::Error& e) {
              sink[s].failed(e);
              std::lock_guard<std::mutex> lock(errMu);
              progressErrors.push_back(e.what());
            }
          if (n == 0) std::this_thread::sleep_for(std::chrono::microseconds(50));
        }
      });
  }
  ~Pair() {
    stop = true;
    for (auto& t : progress) t.join();
  }
};

ib::PeerOptions smallOptions() {
  ib::PeerOptions o;
  o.slots = 4;
  o.chunkBytes = 64 * 1024;
  o.budget = std::chrono::milliseconds(2000);
  return o;
}

}  // namespace

TEST_CASE("ib peer: endpoint records are checked field by field") {
  ib::EndpointRecord r{};
  r.magic = ib::kEndpointMagic;
  r.version = mk::proxy::wire::kProtocolVersion;
  r.process = 1;
  r.peer = 0;
  r.qpn = 0x123;
  r.psn = 0xabcde;
  r.mtuBytes = 4096;
  r.slots = 16;
  r.slotBytes = 64 + 4096 + 16;
  r.windowAddr = 0x10000;
  CHECK(ib::endpointProblem(r, 1, 0).empty());
  CHECK(contains(ib::endpointProblem(r, 2, 0), "the record of process 1 for process 0 where the one of process 2"));
  ib::EndpointRecord bad = r;
  bad.magic = 1;
  CHECK(contains(ib::endpointProblem(bad, 1, 0), "not an ibverbs endpoint record"));
  bad = r;
  bad.version = 9;
  CHECK(contains(ib::endpointProblem(bad, 1, 0), "inter-node protocol version 9, this process speaks 1"));
  bad = r;
  bad.psn = 1u << 24;
  CHECK(contains(ib::endpointProblem(bad, 1, 0), "does not fit 24 bits"));
  bad = r;
  bad.mtuBytes = 1500;
  CHECK(contains(ib::endpointProblem(bad, 1, 0), "MTU 1500 is not one of 256 .. 4096"));
  bad = r;
  bad.qpn = 0;
  CHECK(contains(ib::endpointProblem(bad, 1, 0), "not a QPN"));
}

TEST_CASE("ib peer: connect walks INIT, RTR, RTS towards the remote's QPN and PSN at the smaller MTU") {
  Pair p(smallOptions());
  CHECK(p.peer[0]->state() == ib::PeerState::Created);
  CHECK(p.record[0].qpn != p.record[1].qpn);
  CHECK(p.record[0].mtuBytes == 4096);
  p.connect();
  CHECK(p.peer[0]->state() == ib::PeerState::ReadyToSend);
  REQUIRE(p.fabric.transitions.size() == 6);
  const std::string rtr = "device 0 qp " + std::to_string(p.record[0].qpn) + " -> RTR (remote " +
                          std::to_string(p.record[1].qpn) + " psn " + std::to_string(p.record[1].psn) + " mtu 2048)";
  CHECK(p.fabric.transitions[1] == rtr);
  CHECK(p.fabric.transitions[2] ==
        "device 0 qp " + std::to_string(p.record[0].qpn) + " -> RTS (psn " + std::to_string(p.record[0].psn) + ")");
}

TEST_CASE("ib peer: a failing transition names it and leaves the connection failed") {
  Pair p(smallOptions());
  p.verbs[1].failTransition = "RTR";
  p.peer[0]->connect(p.record[1], p.verbs[0].open("", 1, 64));
  try {
    p.peer[1]->connect(p.record[0], p.verbs[1].open("", 1, 64));
    FAIL("a failed RTR transition was not reported");
  } catch (const mk::Error& e) {
    CHECK(contains(e.message(), "process 0: moving queue pair " + std::to_string(p.record[1].qpn) +
                                    " to RTR (ready to receive) failed: ibv_modify_qp(RTR) failed: injected"));
  }
  CHECK(p.peer[1]->state() == ib::PeerState::Failed);
  mk::proxy::PutRequest req;
  req.info.signal = true;
  auto stream = p.memory[1].openStream();
  CHECK_THROWS_WITH_AS(p.peer[1]->sendPut(req, *stream, nullptr), doctest::Contains("to RTR"), mk::Error);
  // A mismatched window shape is refused before any transition.
  ib::PeerOptions other = smallOptions();
  other.slots = 8;
  FakeFabric fabric;
  FakeVerbs verbs(fabric, 0);
  mk::proxy::HostCopier memory;
  ib::IbPeer odd(verbs, 0, 1, "process 1", other);
  odd.open(verbs.open("", 1, 64), memory);
  CHECK_THROWS_WITH_AS(odd.connect(p.record[1], verbs.open("", 1, 64)),
                       doctest::Contains("uses 4 slots of 65616 bytes, this process 8 of 65616"), mk::Error);
}

TEST_CASE("ib peer: puts of every size arrive whole and in order, the flag after their last chunk") {
  for (const bool gathered : {false, true}) {
    CAPTURE(gathered);
    Pair p(smallOptions());
    p.connect();
    std::vector<uint32_t> next(2, 0);
    std::vector<int> signals(2, 0);
    for (int s = 0; s < 2; ++s)
      p.sink[s].onLanded = [&, s](const mk::proxy::PutArrival& a) -> std::string {
        if (!a.info.signal) return {};  // a chunk of a larger put: only the last one carries the signal
        ++signals[static_cast<std::size_t>(s)];
        const uint32_t k = a.info.flagId;
        if (k != next[static_cast<std::size_t>(s)]++) return "put " + std::to_string(k) + " signalled out of order";
        // Every byte of the whole put is in place when its flag is raised.
        const auto& buf = p.sink[s].buffer(static_cast<uint32_t>(s), 0);
        const uint64_t start = a.info.flagValue;  // the put's first byte (see below)
        for (uint64_t i = 0; i < a.info.dstOffset + a.info.bytes - start; ++i)
          if (buf[start + i] != mkt::patternByte(static_cast<uint32_t>(1 - s), k, i))
            return "put " + std::to_string(k) + ": byte " + std::to_string(i) + " wrong when signalled";
        return {};
      };
    p.startProgress();
    const std::vector<uint64_t> sizes = {0, 1, 4096, 65536, 65537, 300001, 1u << 20};
    std::vector<std::vector<std::byte>> src(2 * sizes.size());
    auto sendAll = [&](int s) {
      auto stream = p.memory[s].openStream();
      uint64_t offset = 0;
      for (uint32_t k = 0; k < sizes.size(); ++k) {
        auto& bytes = src[s * sizes.size() + k];
        bytes.resize(sizes[k]);
        for (uint64_t i = 0; i < sizes[k]; ++i) bytes[i] = mkt::patternByte(static_cast<uint32_t>(s), k, i);
        ib::MemoryRegion mr{};
        if (gathered && sizes[k] > 0) mr = p.verbs[s].registerHost(bytes.data(), bytes.size(), false);
        mk::proxy::PutRequest req;
        req.info.srcRank = static_cast<uint32_t>(s);
        req.info.dstRank = static_cast<uint32_t>(1 - s);
        req.info.dstOffset = offset;
        req.info.bytes = sizes[k];
        req.info.signal = true;
        req.info.flagId = k;
        req.info.flagValue = offset;  // lets the receiver find the put's start
        req.src = bytes.data();
        p.peer[s]->sendPut(req, *stream, gathered && sizes[k] > 0 ? &mr : nullptr);
        offset += sizes[k];
      }
    };
    std::vector<std::thread> senders;
    for (int s = 0; s < 2; ++s)
      senders.emplace_back([&, s] {
        try {
          sendAll(s);
        } catch (const mk::Error& e) {
          p.sink[s].failed(e);
        }
      });
    for (auto& t : senders) t.join();
    for (int s = 0; s < 2; ++s) {
      CHECK(p.sink[s].waitFor([&] { return signals[static_cast<std::size_t>(s)] == static_cast<int>(sizes.size()); },
                              10));
      CHECK(p.sink[s].problems.empty());
      for (const auto& problem : p.sink[s].problems) MESSAGE(problem);
      CHECK(p.sink[s].failures.empty());
    }
  }
}

TEST_CASE("ib peer: control, abort and goodbye frames, and a sender without credits times out naming the peer") {
  Pair p(smallOptions());
  p.connect();
  p.startProgress();
  mk::proxy::ControlMessage m;
  m.code = 7;
  m.opTag = 12;
  m.value = 99;
  m.body.assign(1000, 0x33);
  p.peer[0]->sendControl(m);
  p.peer[0]->sendGoodbye();
  REQUIRE(p.sink[1].waitFor([&] { return !p.sink[1].controls.empty(); }, 5));
  CHECK(p.sink[1].controls[0].code == 7);
  CHECK(p.sink[1].controls[0].body == m.body);
  CHECK(p.sink[1].controls[0].fromProcess == 0);
  for (int i = 0; i < 200 && !p.peer[1]->goodbyeSeen(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  CHECK(p.peer[1]->goodbyeSeen());
  p.peer[1]->sendAbort(1, mk::Error(mk::ErrorCode::Timeout, "rank 3 gave up"), std::chrono::milliseconds(500));
  REQUIRE(p.sink[0].waitFor([&] { return !p.sink[0].failures.empty(); }, 5));
  CHECK(p.sink[0].failures[0].code() == mk::ErrorCode::Timeout);
  CHECK(contains(p.sink[0].failures[0].message(), "ibverbs transport: process 1 failed: rank 3 gave up"));

  // Without a receiver polling, credits never return: the fifth frame waits for a slot and times out.
  ib::PeerOptions o = smallOptions();
  o.budget = std::chrono::milliseconds(200);
  Pair q(o);
  q.connect();
  auto stream = q.memory[0].openStream();
  mk::proxy::PutRequest signal;
  signal.info.signal = true;
  for (int i = 0; i < 4; ++i) q.peer[0]->sendPut(signal, *stream, nullptr);
  CHECK_THROWS_WITH_AS(q.peer[0]->sendPut(signal, *stream, nullptr),
                       doctest::Contains("process 1: no receive slot came back within 200 ms (4 frames in flight"),
                       mk::Error);
}

TEST_CASE("ib peer: a corrupted frame or a failed completion fails the connection, never lands") {
  Pair p(smallOptions());
  p.connect();
  p.fabric.corrupt = [](std::byte* frame, std::size_t) { frame[40] ^= std::byte{1}; };  // a header bit
  p.startProgress();
  std::vector<std::byte> src(1000, std::byte{1});
  mk::proxy::PutRequest req;
  req.info.dstRank = 1;
  req.info.bytes = src.size();
  req.info.signal = true;
  req.src = src.data();
  auto stream = p.memory[0].openStream();
  p.peer[0]->sendPut(req, *stream, nullptr);
  REQUIRE(p.sink[1].waitFor([&] { return !p.sink[1].failures.empty(); }, 5));
  CHECK(contains(p.sink[1].failures[0].message(), "ibverbs transport: frame 0 from process 0: header CRC mismatch"));
  CHECK(p.sink[1].arrivals.empty());
  CHECK(p.peer[1]->state() == ib::PeerState::Failed);

  // A completion in error (what a NIC reports when the peer is gone) names the request and the status.
  Pair q(smallOptions());
  q.connect();
  auto s2 = q.memory[0].openStream();
  ib::Completion bad;
  bad.kind = ib::CompletionKind::Other;
  bad.status = "transport retry counter exceeded";
  CHECK_THROWS_WITH_AS(q.peer[0]->onCompletion(bad, q.sink[0], *s2),
                       doctest::Contains("process 1: a work request failed: transport retry counter exceeded"),
                       mk::Error);
  CHECK(q.peer[0]->state() == ib::PeerState::Failed);
}

TEST_CASE("ib transport: without an RDMA device, transport ibverbs is a clear error and auto picks socket") {
  std::string why;
  if (mk::proxy::rdmaDeviceCount(&why) > 0) {
    MESSAGE("this machine has an RDMA device: the refusal is not tested here");
    return;
  }
  CHECK_FALSE(why.empty());
  mk::TcpBootstrap solo(mkt::bootOptions(0, 1, 1));
  mk::proxy::TransportOptions o;
  o.kind = mk::proxy::TransportKind::Ibverbs;
  try {
    mk::proxy::connectTransport(solo, o);
    FAIL("transport ibverbs without a device was accepted");
  } catch (const mk::Error& e) {
    CHECK(e.code() == mk::ErrorCode::Unsupported);
    CHECK(contains(e.message(), "use transport socket"));
    if (mk::proxy::ibverbsBuilt())
      CHECK(contains(e.message(), "no RDMA device found"));
    else
      CHECK(contains(e.message(), "this build has no ibverbs transport"));
  }
  o.kind = mk::proxy::TransportKind::Auto;
  o.address = "127.0.0.1";
  auto t = mk::proxy::connectTransport(solo, o);
  CHECK(t->kind() == mk::proxy::TransportKind::Socket);
  t->close();
  CHECK(mk::proxy::requireTransportKind("ibverbs") == mk::proxy::TransportKind::Ibverbs);
  CHECK_THROWS_WITH_AS(mk::proxy::requireTransportKind("rdma", "--transport"),
                       doctest::Contains("unknown --transport 'rdma' (expected auto, socket or ibverbs)"), mk::Error);
}
