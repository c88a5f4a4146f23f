// mkernel — one connection of the ibverbs transport and its slot protocol (ib_peer.hpp).
#include "proxy/ib/ib_peer.hpp"

#include <cstring>
#include <random>
#include <thread>

#include "proxy/wire.hpp"

namespace mk::proxy::ib {
namespace {

// Work request ids: the kind in the top byte, a counter below (for messages only).
constexpr uint64_t kWrWrite = 1ull << 56, kWrCredit = 2ull << 56, kWrRecv = 3ull << 56;

const char* kindName(CompletionKind k) {
  switch (k) {
    case CompletionKind::WriteImm: return "RDMA write with immediate";
    case CompletionKind::SendImm: return "send with immediate (slot credit)";
    case CompletionKind::RecvWriteImm: return "receive of a frame";
    case CompletionKind::RecvSendImm: return "receive of a slot credit";
    case CompletionKind::Other: return "work request";
  }
  return "work request";
}

}  // namespace

std::string endpointProblem(const EndpointRecord& r, uint32_t from, uint32_t to) {
  if (r.magic != kEndpointMagic) return "not an ibverbs endpoint record (magic " + std::to_string(r.magic) + ")";
  if (r.version != wire::kProtocolVersion)
    return "inter-node protocol version " + std::to_string(r.version) + ", this process speaks " +
           std::to_string(wire::kProtocolVersion);
  if (r.process != from || r.peer != to)
    return "the record of process " + std::to_string(r.process) + " for process " + std::to_string(r.peer) +
           " where the one of process " + std::to_string(from) + " for process " + std::to_string(to) + " belongs";
  if (r.qpn == 0 || r.qpn >= (1u << 24)) return "queue pair number " + std::to_string(r.qpn) + " is not a QPN";
  if (r.psn >= (1u << 24)) return "packet sequence number " + std::to_string(r.psn) + " does not fit 24 bits";
  if (r.mtuBytes < 256 || r.mtuBytes > 4096 || (r.mtuBytes & (r.mtuBytes - 1)) != 0)
    return "MTU " + std::to_string(r.mtuBytes) + " is not one of 256 .. 4096";
  if (r.slots == 0 || r.slotBytes < 64 + 16 || r.windowAddr == 0) return "an empty receive window";
  return {};
}

const char* toString(PeerState s) noexcept {
  switch (s) {
    case PeerState::Idle: return "idle";
    case PeerState::Created: return "created";
    case PeerState::ReadyToSend: return "ready to send";
    case PeerState::Failed: return "failed";
  }
  return "unknown";
}

IbPeer::IbPeer(VerbsApi& api, int me, int peer, std::string name, PeerOptions options)
    : api_(api), me_(me), peer_(peer), name_(std::move(name)), opt_(options) {
  if (opt_.slots == 0 || opt_.chunkBytes < kMaxControlBody)
    throw Error(ErrorCode::InvalidArgument, "ibverbs transport: slots must be >= 1 and chunkBytes >= " +
                                                std::to_string(kMaxControlBody) + " (a control message fits a slot)");
}

IbPeer::~IbPeer() {
  if (qp_.handle) api_.destroyQp(qp_);
  if (windowMr_.handle) api_.deregister(windowMr_);
  if (stagingMr_.handle) api_.deregister(stagingMr_);
}

PeerState IbPeer::state() const noexcept {
  std::lock_guard<std::mutex> lock(mu_);
  return state_;
}
bool IbPeer::goodbyeSeen() const noexcept {
  std::lock_guard<std::mutex> lock(mu_);
  return goodbyeSeen_;
}
bool IbPeer::abortSeen() const noexcept {
  std::lock_guard<std::mutex> lock(mu_);
  return abortSeen_;
}

std::byte* IbPeer::sendSlot(uint32_t slot) const noexcept {
  return staging_.data() + static_cast<std::size_t>(slot) * slotBytes();
}
std::byte* IbPeer::windowSlot(uint32_t slot) const noexcept {
  return window_.data() + static_cast<std::size_t>(slot) * slotBytes();
}

void IbPeer::fail(const Error& e) noexcept {
  std::lock_guard<std::mutex> lock(mu_);
  if (state_ != PeerState::Failed) {
    state_ = PeerState::Failed;
    failure_ = e.message();
    failureCode_ = e.code();
  }
  cv_.notify_all();
}

void IbPeer::throwIfFailed() {
  std::lock_guard<std::mutex> lock(mu_);
  if (state_ == PeerState::Failed) throw Error(failureCode_, failure_);
  if (state_ != PeerState::ReadyToSend)
    throw Error(ErrorCode::Internal,
                "ibverbs transport: " + name_ + ": sending while the connection is " + toString(state_));
}

EndpointRecord IbPeer::open(const PortInfo& port, MemoryCopier& memory) {
  if (state() != PeerState::Idle)
    throw Error(ErrorCode::Internal,
                "ibverbs transport: " + name_ + ": open() on a connection that is " + toString(state()));
  memory_ = &memory;
  const std::size_t bytes = static_cast<std::size_t>(opt_.slots) * slotBytes();
  window_ = StagingBuffer(memory, bytes);
  staging_ = StagingBuffer(memory, bytes);
  windowMr_ = api_.registerHost(window_.data(), bytes, true);
  stagingMr_ = api_.registerHost(staging_.data(), bytes, false);
  // Receives: two per slot (a frame into the window and a credit for a frame this end sent can both be pending).
  // Sends: a write per slot and a credit per slot, twice over, because a request's queue entry is freed only when its
  // completion is polled, which may come after its slot's credit.
  qp_ = api_.createQp(4 * opt_.slots, 2 * opt_.slots);
  psn_ = std::random_device{}() & 0xffffffu;
  {
    std::lock_guard<std::mutex> lock(mu_);
    state_ = PeerState::Created;
  }
  EndpointRecord r{};
  r.magic = kEndpointMagic;
  r.version = wire::kProtocolVersion;
  r.lid = port.lid;
  r.process = static_cast<uint32_t>(me_);
  r.peer = static_cast<uint32_t>(peer_);
  r.qpn = qp_.qpn;
  r.psn = psn_;
  r.mtuBytes = port.mtuBytes;
  r.slots = opt_.slots;
  r.slotBytes = slotBytes();
  r.rkey = windowMr_.rkey;
  r.windowAddr = windowMr_.addr;
  std::memcpy(r.gid, port.gid.data(), sizeof r.gid);
  return r;
}

void IbPeer::connect(const EndpointRecord& remote, const PortInfo& port) {
  if (state() != PeerState::Created)
    throw Error(ErrorCode::Internal,
                "ibverbs transport: " + name_ + ": connect() on a connection that is " + toString(state()));
  const std::string problem = endpointProblem(remote, static_cast<uint32_t>(peer_), static_cast<uint32_t>(me_));
  if (!problem.empty()) {
    const Error e(ErrorCode::InvalidArgument,
                  "ibverbs transport: " + name_ + " sent a bad endpoint record: " + problem);
    fail(e);
    throw e;
  }
  if (remote.slots != opt_.slots || remote.slotBytes != slotBytes()) {
    const Error e(ErrorCode::InvalidArgument,
                  "ibverbs transport: " + name_ + " uses " + std::to_string(remote.slots) + " slots of " +
                      std::to_string(remote.slotBytes) + " bytes, this process " + std::to_string(opt_.slots) + " of " +
                      std::to_string(slotBytes()) + " (every process needs the same chunk and slot options)");
    fail(e);
    throw e;
  }
  remote_ = remote;
  RemoteAddress ra;
  ra.qpn = remote.qpn;
  ra.psn = remote.psn;
  ra.lid = remote.lid;
  std::memcpy(ra.gid.data(), remote.gid, sizeof remote.gid);
  ra.mtuBytes = std::min(port.mtuBytes, remote.mtuBytes);
  ra.global = port.ethernet || remote.lid == 0;
  const char* step = "INIT";
  try {
    api_.toInit(qp_, opt_.port);
    for (uint32_t i = 0; i < 2 * opt_.slots; ++i) api_.postRecv(qp_, kWrRecv | i);
    step = "RTR (ready to receive)";
    api_.toRtr(qp_, opt_.port, ra, port.gidIndex);
    step = "RTS (ready to send)";
    api_.toRts(qp_, psn_);
  } catch (const Error& e) {
    const Error failed(e.code(), "ibverbs transport: " + name_ + ": moving queue pair " + std::to_string(qp_.qpn) +
                                     " to " + step + " failed: " + e.message());
    fail(failed);
    throw failed;
  }
  std::lock_guard<std::mutex> lock(mu_);
  state_ = PeerState::ReadyToSend;
}

uint32_t IbPeer::takeSlot(std::unique_lock<std::mutex>& lock, std::chrono::milliseconds wait) {
  const bool free =
      cv_.wait_for(lock, wait, [&] { return state_ == PeerState::Failed || framesSent_ - creditsBack_ < opt_.slots; });
  if (state_ == PeerState::Failed) throw Error(failureCode_, failure_);
  if (!free)
    throw Error(ErrorCode::Timeout, "ibverbs transport: " + name_ + ": no receive slot came back within " +
                                        std::to_string(wait.count()) + " ms (" +
                                        std::to_string(framesSent_ - creditsBack_) +
                                        " frames in flight; is that process still running?)");
  return static_cast<uint32_t>(framesSent_ % opt_.slots);
}

void IbPeer::post(uint32_t slot, uint32_t frameBytes, const Sge* payload) {
  Sge sges[3];
  int count = 1;
  const auto base = reinterpret_cast<uint64_t>(sendSlot(slot));
  if (payload) {
    // Gathered: header (64 bytes), the payload from its registered region, the trailer laid after the header.
    sges[0] = Sge{base, 64, stagingMr_.lkey};
    sges[1] = *payload;
    sges[2] = Sge{base + 64, static_cast<uint32_t>(sizeof(wire::FrameTrailer)), stagingMr_.lkey};
    count = 3;
  } else {
    sges[0] = Sge{base, frameBytes, stagingMr_.lkey};
  }
  uint64_t frame;
  {
    std::lock_guard<std::mutex> lock(mu_);
    frame = framesSent_;
  }
  try {
    api_.postWriteImm(qp_, kWrWrite | frame, sges, count,
                      remote_.windowAddr + static_cast<uint64_t>(slot) * remote_.slotBytes, remote_.rkey, slot);
  } catch (const Error& e) {
    const Error failed(e.code(), "ibverbs transport: " + name_ + ": posting frame " + std::to_string(frame) +
                                     " failed: " + e.message());
    fail(failed);
    throw failed;
  }
  std::lock_guard<std::mutex> lock(mu_);
  ++framesSent_;
}

uint32_t IbPeer::beginFrame(wire::FrameHeader& h, std::chrono::milliseconds wait, uint64_t* frame) {
  uint32_t slot;
  {
    std::unique_lock<std::mutex> lock(mu_);
    slot = takeSlot(lock, wait);
    *frame = framesSent_;
  }
  wire::sealFrame(h, static_cast<uint32_t>(*frame));
  std::memcpy(sendSlot(slot), &h, sizeof h);
  return slot;
}

void IbPeer::sendCopied(wire::FrameHeader h, const void* body, std::size_t bytes, std::chrono::milliseconds wait) {
  uint64_t frame = 0;
  const uint32_t slot = beginFrame(h, wait, &frame);
  if (!wire::hasTrailer(static_cast<wire::FrameType>(h.type))) return post(slot, 64, nullptr);
  std::byte* s = sendSlot(slot);
  if (bytes) std::memcpy(s + 64, body, bytes);
  const wire::FrameTrailer t{wire::kTrailerMagic, static_cast<uint32_t>(frame), wire::crc32c(body, bytes), 0};
  std::memcpy(s + 64 + bytes, &t, sizeof t);
  post(slot, static_cast<uint32_t>(64 + bytes + 16), nullptr);
}

void IbPeer::sendPut(const PutRequest& req, CopyStream& stream, const MemoryRegion* srcRegion) {
  std::lock_guard<std::mutex> sequence(sendMu_);
  throwIfFailed();
  const PutInfo& p = req.info;
  const bool checksum = opt_.payloadChecksum;
  const bool gather = srcRegion && !checksum;  // a checksum needs the payload in host memory
  const uint64_t chunks = p.bytes == 0 ? 1 : (p.bytes + opt_.chunkBytes - 1) / opt_.chunkBytes;
  uint64_t lastFrame = 0;
  for (uint64_t k = 0; k < chunks; ++k) {
    const uint64_t off = k * opt_.chunkBytes;
    PutInfo piece = p;
    piece.dstOffset = p.dstOffset + off;
    piece.bytes = std::min<uint64_t>(opt_.chunkBytes, p.bytes - std::min(p.bytes, off));
    piece.signal = p.signal && k + 1 == chunks;
    wire::FrameHeader h = wire::putHeader(piece, checksum);
    const uint32_t slot = beginFrame(h, opt_.budget, &lastFrame);
    std::byte* s = sendSlot(slot);
    const auto n = static_cast<uint32_t>(piece.bytes);
    const auto* src = static_cast<const std::byte*>(req.src) + off;
    if (n == 0) {
      post(slot, 64, nullptr);
    } else if (gather) {
      const wire::FrameTrailer t{wire::kTrailerMagic, static_cast<uint32_t>(lastFrame), 0, 0};
      std::memcpy(s + 64, &t, sizeof t);
      const Sge payload{reinterpret_cast<uint64_t>(src), n, srcRegion->lkey};
      post(slot, 64 + n + 16, &payload);
    } else {
      stream.wait(stream.copyOut(s + 64, src, n), opt_.budget);
      const wire::FrameTrailer t{wire::kTrailerMagic, static_cast<uint32_t>(lastFrame),
                                 checksum ? wire::crc32c(s + 64, n) : 0, 0};
      std::memcpy(s + 64 + n, &t, sizeof t);
      post(slot, 64 + n + 16, nullptr);
    }
  }
  if (!gather) return;
  // Gathered writes read the source until they complete (RC completes in order): wait for the last one.
  std::unique_lock<std::mutex> lock(mu_);
  if (!cv_.wait_for(lock, opt_.budget, [&] { return state_ == PeerState::Failed || writesDone_ > lastFrame; }))
    throw Error(ErrorCode::Timeout, "ibverbs transport: " + name_ + ": the RDMA write of frame " +
                                        std::to_string(lastFrame) + " did not complete within " +
                                        std::to_string(opt_.budget.count()) + " ms");
  if (state_ == PeerState::Failed) throw Error(failureCode_, failure_);
}

void IbPeer::sendControl(const ControlMessage& m) {
  if (m.body.size() > kMaxControlBody)
    throw Error(ErrorCode::InvalidArgument, "ibverbs transport: a control message body of " +
                                                std::to_string(m.body.size()) + " bytes (at most " +
                                                std::to_string(kMaxControlBody) + ")");
  std::lock_guard<std::mutex> sequence(sendMu_);
  throwIfFailed();
  sendCopied(wire::controlHeader(m), m.body.data(), m.body.size(), opt_.budget);
}

void IbPeer::sendAbort(int fromProcess, const Error& error, std::chrono::milliseconds wait) noexcept {
  try {
    std::unique_lock<std::mutex> sequence(sendMu_, std::defer_lock);
    // A sender stuck waiting for slots holds the sequence lock: give up rather than wait behind it.
    const auto until = std::chrono::steady_clock::now() + wait;
    while (!sequence.try_lock()) {
      if (std::chrono::steady_clock::now() >= until) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    if (state() != PeerState::ReadyToSend) return;
    std::string text = error.message();
    if (text.size() > wire::kMaxAbortBytes) text.resize(wire::kMaxAbortBytes);
    sendCopied(wire::abortHeader(fromProcess, error.code(), text.size()), text.data(), text.size(), wait);
  } catch (...) {  // best effort
  }
}

void IbPeer::sendGoodbye() {
  std::lock_guard<std::mutex> sequence(sendMu_);
  throwIfFailed();
  wire::FrameHeader h{};
  h.type = static_cast<uint8_t>(wire::FrameType::Goodbye);
  sendCopied(h, nullptr, 0, opt_.budget);
}

void IbPeer::deliver(uint32_t slot, ProxySink& sink, CopyStream& stream) {
  const std::byte* s = windowSlot(slot);
  wire::FrameHeader h;
  std::memcpy(&h, s, sizeof h);
  uint64_t index;
  {
    std::lock_guard<std::mutex> lock(mu_);
    index = framesReceived_;
  }
  const auto seq = static_cast<uint32_t>(index);
  const std::string where = "ibverbs transport: frame " + std::to_string(index) + " from " + name_;
  std::string problem = wire::frameProblem(h, seq);
  const auto type = static_cast<wire::FrameType>(h.type);
  if (problem.empty() && wire::hasTrailer(type) && h.bytes > opt_.chunkBytes)
    problem = "a payload of " + std::to_string(h.bytes) + " bytes does not fit a slot (" +
              std::to_string(opt_.chunkBytes) + ")";
  if (!problem.empty()) throw Error(ErrorCode::ParseError, where + ": " + problem);
  const std::byte* payload = s + 64;
  if (wire::hasTrailer(type)) {
    wire::FrameTrailer t;
    std::memcpy(&t, payload + h.bytes, sizeof t);
    const bool checksum = (h.flags & wire::kFrameChecksum) != 0;
    problem = wire::trailerProblem(t, seq, checksum, checksum ? wire::crc32c(payload, h.bytes) : 0);
    if (!problem.empty()) throw Error(ErrorCode::ParseError, where + ": " + problem);
  }
  switch (type) {
    case wire::FrameType::Put:
    case wire::FrameType::Signal: {
      PutArrival a;
      a.info = wire::putInfo(h);
      a.fromProcess = peer_;
      if (a.info.bytes > 0) {
        void* dst = nullptr;
        try {
          dst = sink.putDestination(a);
        } catch (const Error& e) {
          throw Error(e.code(), "ibverbs transport: " + name_ + " sent a put this process refuses (" +
                                    wire::describePut(a.info) + "): " + e.message());
        }
        // Complete before the slot goes back: the next frame may overwrite it, and the flag follows every byte.
        stream.wait(stream.copyIn(dst, payload, a.info.bytes), opt_.budget);
      }
      sink.putLanded(a);
      break;
    }
    case wire::FrameType::Control: {
      ControlMessage m = wire::controlMessage(h, peer_);
      m.body.assign(reinterpret_cast<const uint8_t*>(payload), reinterpret_cast<const uint8_t*>(payload) + h.bytes);
      sink.control(m);
      break;
    }
    case wire::FrameType::Abort: {
      const std::string text(reinterpret_cast<const char*>(payload), h.bytes);
      const Error e(wire::abortCode(h), "ibverbs transport: " + name_ + " failed: " + text);
      {
        std::lock_guard<std::mutex> lock(mu_);
        abortSeen_ = true;
      }
      fail(e);
      sink.failed(e);
      break;
    }
    case wire::FrameType::Goodbye: {
      std::lock_guard<std::mutex> lock(mu_);
      goodbyeSeen_ = true;
      break;
    }
  }
}

void IbPeer::onCompletion(const Completion& c, ProxySink& sink, CopyStream& stream) {
  try {
    handle(c, sink, stream);
  } catch (const Error& e) {
    fail(e);  // nothing more is sent on a connection that broke its protocol
    throw;
  }
}

void IbPeer::handle(const Completion& c, ProxySink& sink, CopyStream& stream) {
  if (!c.ok) {
    const Error e(ErrorCode::IoError, "ibverbs transport: " + name_ + ": a " + kindName(c.kind) +
                                          " failed: " + c.status + " (is that process still running?)");
    fail(e);
    throw e;
  }
  switch (c.kind) {
    case CompletionKind::WriteImm: {
      std::lock_guard<std::mutex> lock(mu_);
      ++writesDone_;
      cv_.notify_all();
      return;
    }
    case CompletionKind::SendImm:
    case CompletionKind::Other: return;
    case CompletionKind::RecvSendImm: {
      // The receive goes back before the slot is counted free: a sender woken by the credit may send a frame whose
      // own credit comes back at once, and it needs a posted receive (2 x slots bound them all).
      api_.postRecv(qp_, kWrRecv | c.wrId);
      std::lock_guard<std::mutex> lock(mu_);
      if (c.imm != creditsBack_ % opt_.slots)
        throw Error(ErrorCode::ParseError, "ibverbs transport: " + name_ + " returned slot " + std::to_string(c.imm) +
                                               ", expected slot " + std::to_string(creditsBack_ % opt_.slots));
      ++creditsBack_;
      cv_.notify_all();
      return;
    }
    case CompletionKind::RecvWriteImm: {
      uint64_t index;
      {
        std::lock_guard<std::mutex> lock(mu_);
        index = framesReceived_;
      }
      if (c.imm != index % opt_.slots)
        throw Error(ErrorCode::ParseError, "ibverbs transport: " + name_ + " wrote slot " + std::to_string(c.imm) +
                                               ", expected slot " + std::to_string(index % opt_.slots) + " for frame " +
                                               std::to_string(index));
      deliver(c.imm, sink, stream);
      {
        std::lock_guard<std::mutex> lock(mu_);
        ++framesReceived_;
      }
      api_.postRecv(qp_, kWrRecv | c.wrId);
      if (!abortSeen()) api_.postSendImm(qp_, kWrCredit | index, c.imm);
      return;
    }
  }
}

}  // namespace mk::proxy::ib
