// mkernel — the engine's side of the inter-node path (engine/internode.hpp): the proxy's resolver and sink on a
// GPU, the inbox writer and the receive staging. The relay and failures: internode_relay.cpp.
#include "engine/internode.hpp"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <string>
#include <utility>

#include "engine/engine_context.hpp"
#include "engine/host_log.hpp"
#include "engine/host_sync.hpp"
#include "mk/schedule/validate.hpp"
#include "mk/util/range.hpp"

namespace mk::runtime {

namespace {

// Ops of one rank the inter-node path keeps bound: fewer than the op tags a command can name (4096), so a tag names
// one kept op; CommConfig::ringSlots (ops a rank may submit ahead) must stay below it on several nodes.
constexpr uint32_t kKeptOps = 2048;

proxy::TransportKind transportKind(ProxyTransport t) {
  switch (t) {
    case ProxyTransport::Socket: return proxy::TransportKind::Socket;
    case ProxyTransport::IbVerbs: return proxy::TransportKind::Ibverbs;
    case ProxyTransport::Auto: break;
  }
  return proxy::TransportKind::Auto;
}

bool sameArrival(const proxy::PutInfo& a, const proxy::PutInfo& b) {
  return a.srcRank == b.srcRank && a.opTag == b.opTag && a.lane == b.lane && a.step == b.step &&
         a.dstBuffer == b.dstBuffer && a.dstOffset == b.dstOffset && a.bytes == b.bytes;
}

}  // namespace

InterNode::InterNode(EngineContext& ctx, std::function<std::string()> describeDeviceFailure, Bootstrap& boot)
    : ctx_(ctx), describeDeviceFailure_(std::move(describeDeviceFailure)) {
  const int me = ctx_.me;
  const RankResources& rr = ctx_.ranks[static_cast<size_t>(me)];
  if (ctx_.ringSlots >= kKeptOps)
    throw Error(ErrorCode::InvalidArgument, "CommConfig::ringSlots must be below " + std::to_string(kKeptOps) +
                                                " on several nodes (the proxy names an op by its sequence number "
                                                "modulo 4096; got " +
                                                std::to_string(ctx_.ringSlots) + ")");
  proxy::TransportOptions topt;
  topt.kind = transportKind(ctx_.config.transport);
  topt.budget = std::chrono::milliseconds(static_cast<int64_t>(ctx_.config.hostBudgetMs));
  topt.log = [me](const std::string& line) { MK_LOG_AT(Info, rankName(me), "proxy: " + line); };
  // The kernel stages its bytes in host memory and the sink hands out host memory: the transports read and write
  // it directly, no copies, no CUDA.
  copier_ = std::make_unique<proxy::HostCopier>(/*direct=*/true);
  transport_ = proxy::connectTransport(boot, topt);
  proxy::ProxyOptions popt;
  // A GPU pusher cannot wake the consumer: it polls, spinning a while after each command before it sleeps.
  popt.idleSpin = std::chrono::microseconds(2000);
  popt.maxIdleSleep = std::chrono::microseconds(50);
  popt.log = topt.log;
  popt.commandBudget = topt.budget;
  popt.poll = [this] { return relayOnce(); };  // the relay needs no thread of its own
  proxy_ = std::make_unique<proxy::Proxy>(*transport_, *this, *this, *copier_, popt);
  const auto n = static_cast<uint32_t>(ctx_.ranks.size());
  proxy_->setPlacement(proxy::exchangePlacement(boot, {static_cast<uint32_t>(me)}, n));
  proxy_->addFifo(static_cast<uint32_t>(me), proxy::FifoConsumer(rr.fifoRing, rr.fifoDone, ctx_.config.proxyFifoSlots));
  locals_.resize(n);
  locals_[static_cast<size_t>(me)] = std::make_unique<Local>();
  MK_LOG_AT(Info, rankName(me),
            std::string("inter-node path: transport ") + transportName() + " connected to " +
                std::to_string(transport_->processes() - 1) + " other process(es)");
}

InterNode::~InterNode() { stop(); }

const char* InterNode::transportName() const noexcept { return proxy::toString(transport_->kind()); }

void InterNode::start() {
  if (started_) return;
  proxy_->start();
  started_ = true;
}

void InterNode::stop() noexcept {
  if (proxy_) proxy_->stop();
  if (transport_) transport_->close();
}

InterNode::Local& InterNode::local(uint32_t rank) {
  if (rank >= locals_.size() || !locals_[rank])
    throw Error(ErrorCode::InvalidArgument, "rank " + std::to_string(rank) + " does not run in this process");
  return *locals_[rank];
}

const OpBinding* InterNode::findOp(uint32_t rank, uint32_t seq) const {
  if (rank >= locals_.size() || !locals_[rank]) return nullptr;
  const auto& ops = locals_[rank]->ops;
  auto it = ops.find(seq);
  return it == ops.end() ? nullptr : &it->second;
}

void InterNode::bind(uint32_t rank, uint32_t seq, const CachedSchedule& cs, const uint64_t* table) {
  std::lock_guard<std::mutex> lock(mu_);
  MK_LOG_AT(Debug, rankName(static_cast<int>(rank)), "proxy: op " + std::to_string(seq) + " bound (" + cs.what + ")");
  Local& l = local(rank);
  OpBinding b;
  b.seq = seq;
  b.sched = &cs;
  const size_t nB = cs.schedule.buffers.size();
  for (size_t i = 0; i < nB; ++i) {
    const BufferDecl& d = cs.schedule.buffers[i];
    b.address.push_back(table[rank * nB + i]);
    b.bytes.push_back(d.count[rank] * dtypeSize(d.dtype));
  }
  l.ops[seq] = std::move(b);
  while (!l.ops.empty() && seq - l.ops.begin()->first >= kKeptOps) l.ops.erase(l.ops.begin());
  // What arrived before this op was bound is applied now, in arrival order, before the kernel can start it (the
  // descriptor's `seq` is written after this returns).
  applyParkedLocked(rank, seq);
}

void InterNode::applyParkedLocked(uint32_t rank, uint32_t seq) {
  Local& l = local(rank);
  const OpBinding* op = findOp(rank, seq);
  auto it = l.parked.find(seq);
  if (!op || it == l.parked.end()) return;
  auto& q = it->second;
  uint32_t applied = 0;
  while (!q.empty() && q.front().landed) {
    const Parked& p = q.front();
    uint64_t dst = 0, offset = 0, ringEnd = 0;
    if (!p.data.empty()) {
      if (p.info.dstBuffer >= op->address.size() ||
          !rangeInside(p.info.dstOffset, p.data.size(), op->bytes[p.info.dstBuffer]) ||
          op->address[p.info.dstBuffer] == 0)
        throw Error(ErrorCode::InvalidArgument, "rank " + std::to_string(p.info.srcRank) + " sent op " +
                                                    std::to_string(seq) + " bytes for buffer " +
                                                    std::to_string(p.info.dstBuffer) + " " +
                                                    rangeText(p.info.dstOffset, p.data.size()) + " that rank " +
                                                    std::to_string(rank) + " does not have (" + op->sched->what + ")");
      dst = op->address[p.info.dstBuffer] + p.info.dstOffset;
      offset = allocateReceive(rank, p.data.size(), &ringEnd);
      std::memcpy(ctx_.ranks[rank].inboxStaging + offset, p.data.data(), p.data.size());
      l.parkedBytes -= p.data.size();
    }
    deliverLocked(rank, p.info, dst, offset, p.data.size(), ringEnd);
    q.pop_front();
    ++applied;
  }
  if (q.empty()) l.parked.erase(it);
  if (applied)
    MK_LOG_AT(Debug, rankName(static_cast<int>(rank)),
              "op " + std::to_string(seq) + ": applied " + std::to_string(applied) + " put(s) that arrived early");
}

uint64_t InterNode::allocateReceive(uint32_t rank, uint64_t bytes, uint64_t* end) {
  Local& l = local(rank);
  ReceiveRing& ring = l.ring;
  const uint64_t size = ctx_.config.proxyReceiveBytes;
  // 256-byte slots keep the kernel's 16-byte copies aligned; bytes is compared first because rounding a length near
  // 2^64 up wraps to a small one.
  const uint64_t want = bytes > size ? UINT64_MAX : (bytes + 255) / 256 * 256;
  if (want > size)
    throw Error(ErrorCode::InvalidArgument,
                "a put of " + std::to_string(bytes) +
                    " bytes does not fit the receive staging (CommConfig::proxyReceiveBytes " + std::to_string(size) +
                    ")");
  uint64_t start = ring.head;
  if (start % size + want > size) start += size - start % size;  // contiguous: skip to the ring's start
  const uint64_t* taken = &ctx_.mailboxes[rank].inboxTaken;
  auto release = [&] {
    while (!ring.used.empty() && ring.used.front().first != UINT64_MAX &&
           ring.used.front().first < __atomic_load_n(taken, __ATOMIC_ACQUIRE)) {
      ring.tail = ring.used.front().second;
      ring.used.pop_front();
    }
    if (ring.used.empty()) ring.tail = ring.head;
  };
  release();
  if (start + want - ring.tail > size) {
    const bool ok = hostPoll(ctx_.config.hostBudgetMs, [&] {
      release();
      return start + want - ring.tail <= size || loadHost(&ctx_.status->abort) != 0;
    });
    if (!ok || loadHost(&ctx_.status->abort) != 0)
      throw Error(ErrorCode::Timeout, "rank " + std::to_string(rank) + ": the receive staging stayed full for " +
                                          fmtMs(ctx_.config.hostBudgetMs) +
                                          " (the kernel took no inbox record: is its resident kernel running?)");
  }
  ring.head = start + want;
  ring.used.emplace_back(UINT64_MAX, ring.head);
  *end = ring.head;
  return start % size;
}

void InterNode::deliverLocked(uint32_t rank, const proxy::PutInfo& info, uint64_t dst, uint64_t offset, uint64_t bytes,
                              uint64_t ringEnd) {
  Local& l = local(rank);
  if (bytes > 0) {
    const uint64_t at = pushInbox(rank, device::InboxKind::Copy, info.opTag, 0, bytes, dst, offset);
    // The allocation is freed once the kernel took this record.
    for (auto& u : l.ring.used)
      if (u.second == ringEnd) {
        u.first = at;
        break;
      }
  }
  if (info.signal) raiseFlag(info);
}

proxy::PutRequest InterNode::resolve(uint32_t rank, const device::ProxyCommand& command, uint64_t position) {
  const uint32_t tag = device::proxyOpTag(command.header);
  const uint32_t lane = device::proxyLane(command.header);
  const uint32_t stepIdx = device::proxyStep(command.header);
  std::lock_guard<std::mutex> lock(mu_);
  const Local& l = local(rank);
  const OpBinding* op = nullptr;
  for (auto it = l.ops.rbegin(); it != l.ops.rend() && !op; ++it)
    if (it->first % device::kProxyOpTags == tag) op = &it->second;
  if (!op)
    throw Error(ErrorCode::Internal, "FIFO position " + std::to_string(position) + " names op tag " +
                                         std::to_string(tag) + ", which no bound op of rank " + std::to_string(rank) +
                                         " has");
  const Schedule& s = op->sched->schedule;
  if (lane >= s.lanes[rank].size() || stepIdx >= s.lanes[rank][lane].steps.size())
    throw Error(ErrorCode::Internal, "FIFO position " + std::to_string(position) + " names lane " +
                                         std::to_string(lane) + " step " + std::to_string(stepIdx) + " of op " +
                                         std::to_string(op->seq) + " (" + op->sched->what +
                                         "), which has no such step");
  const Step& st = s.lanes[rank][lane].steps[stepIdx];
  if (st.kind != StepKind::ProxyPut)
    throw Error(ErrorCode::Internal, describeStep(s, rank, lane, stepIdx) + " of op " + std::to_string(op->seq) +
                                         " is a " + toString(st.kind) + ", not the ProxyPut its command says");
  const uint64_t es = dtypeSize(s.buffers[st.dst.buffer].dtype);
  const uint64_t stepBytes = st.count * es;
  const uint64_t chunk = ctx_.config.proxyChunkBytes;
  const uint64_t chunks = stepBytes == 0 ? 1 : (stepBytes + chunk - 1) / chunk;
  const uint64_t c = command.arg;
  if (c >= chunks)
    throw Error(ErrorCode::Internal, describeStep(s, rank, lane, stepIdx) + " of op " + std::to_string(op->seq) +
                                         ": FIFO position " + std::to_string(position) + " names chunk " +
                                         std::to_string(c) + " of its " + std::to_string(chunks));
  const uint64_t begin = c * chunk;
  proxy::PutRequest req;
  proxy::PutInfo& info = req.info;
  info.srcRank = rank;
  info.dstRank = st.dst.rank;
  info.opTag = op->seq;  // the full sequence number: the receiver finds its own op k without ambiguity
  info.lane = lane;
  info.step = stepIdx;
  info.dstBuffer = st.dst.buffer;
  info.dstOffset = st.dst.offset * es + begin;
  info.bytes = stepBytes == 0 ? 0 : std::min(chunk, stepBytes - begin);
  info.signal = (st.flags & kStepSignal) != 0 && c + 1 == chunks;  // the last chunk raises the flag
  info.flagId = st.flag.id;
  info.flagValue = st.value;
  MK_LOG_AT(Debug, rankName(static_cast<int>(rank)),
            "proxy: FIFO position " + std::to_string(position) + " is op " + std::to_string(op->seq) + " lane " +
                std::to_string(lane) + " step " + std::to_string(stepIdx) + " chunk " + std::to_string(c) + ": " +
                std::to_string(info.bytes) + " bytes to rank " + std::to_string(info.dstRank) +
                (info.signal ? ", flag " + std::to_string(info.flagId) + " += " + std::to_string(info.flagValue)
                             : std::string()));
  // The kernel staged this chunk in slot position % stagingSlots before it pushed the command.
  const RankResources& rr = ctx_.ranks[rank];
  if (info.bytes > 0) req.src = rr.fifoStaging + (position % ctx_.config.proxyStagingSlots) * chunk;
  return req;
}

void* InterNode::putDestination(const proxy::PutArrival& put) {
  const proxy::PutInfo& info = put.info;
  std::lock_guard<std::mutex> lock(mu_);
  Local& l = local(info.dstRank);
  if (const OpBinding* op = findOp(info.dstRank, info.opTag); op && l.parked.count(info.opTag) == 0) {
    if (info.dstBuffer >= op->address.size() || !rangeInside(info.dstOffset, info.bytes, op->bytes[info.dstBuffer]) ||
        op->address[info.dstBuffer] == 0)
      throw Error(ErrorCode::InvalidArgument,
                  "rank " + std::to_string(info.srcRank) + " (lane " + std::to_string(info.lane) + " step " +
                      std::to_string(info.step) + ") sent op " + std::to_string(info.opTag) + " bytes " +
                      rangeText(info.dstOffset, info.bytes) + " of buffer " + std::to_string(info.dstBuffer) +
                      ", which rank " + std::to_string(info.dstRank) + " does not have in that op (" + op->sched->what +
                      ")");
    // The bytes land in the receive staging; putLanded asks the kernel to copy them into place.
    Receiving r;
    r.info = info;
    r.fromProcess = put.fromProcess;
    r.dst = op->address[info.dstBuffer] + info.dstOffset;
    r.offset = allocateReceive(info.dstRank, info.bytes, &r.ringEnd);
    l.receiving.push_back(r);
    return ctx_.ranks[info.dstRank].inboxStaging + r.offset;
  }
  // The op is not bound on this rank yet (its caller has not submitted it): keep the bytes in host memory until it
  // is, rather than stop reading the connection (the sender's done / entered notices travel behind them).
  const uint64_t limit = ctx_.config.proxyParkBytes;
  if (!rangeInside(l.parkedBytes, info.bytes, limit))
    throw Error(ErrorCode::InvalidArgument,
                "rank " + std::to_string(info.srcRank) + " sent " + std::to_string(info.bytes) + " bytes of op " +
                    std::to_string(info.opTag) + " before rank " + std::to_string(info.dstRank) +
                    " submitted it, beyond CommConfig::proxyParkBytes (" + std::to_string(limit) +
                    " bytes held already: " + std::to_string(l.parkedBytes) + ")");
  Parked p;
  p.info = info;
  p.fromProcess = put.fromProcess;
  p.data.resize(info.bytes);
  l.parkedBytes += info.bytes;
  auto& q = l.parked[info.opTag];
  q.push_back(std::move(p));
  return q.back().data.data();
}

void InterNode::putLanded(const proxy::PutArrival& put) {
  const proxy::PutInfo& info = put.info;
  MK_LOG_AT(Debug, rankName(static_cast<int>(info.dstRank)),
            "proxy: op " + std::to_string(info.opTag) + ": " + std::to_string(info.bytes) + " bytes from rank " +
                std::to_string(info.srcRank) + " landed" +
                (info.signal ? ", flag " + std::to_string(info.flagId) + " += " + std::to_string(info.flagValue)
                             : std::string()));
  std::lock_guard<std::mutex> lock(mu_);
  Local& l = local(info.dstRank);
  if (info.bytes > 0)
    for (auto it = l.receiving.begin(); it != l.receiving.end(); ++it)
      if (it->fromProcess == put.fromProcess && sameArrival(it->info, info)) {
        const Receiving r = *it;
        l.receiving.erase(it);
        deliverLocked(info.dstRank, info, r.dst, r.offset, info.bytes, r.ringEnd);
        return;
      }
  auto pit = l.parked.find(info.opTag);
  if (pit != l.parked.end() || !findOp(info.dstRank, info.opTag)) {
    // Its bytes were parked, or it is a signal that must not overtake bytes parked before it (or arrive before
    // its op is bound): mark it landed and apply what can be, in arrival order.
    auto& q = l.parked[info.opTag];
    bool found = false;
    for (Parked& p : q)
      if (!p.landed && info.bytes > 0 && p.fromProcess == put.fromProcess && sameArrival(p.info, info)) {
        p.landed = true;
        found = true;
        break;
      }
    if (!found) {
      Parked sig;
      sig.info = info;
      sig.fromProcess = put.fromProcess;
      sig.landed = true;
      q.push_back(std::move(sig));
    }
    applyParkedLocked(info.dstRank, info.opTag);
    return;
  }
  deliverLocked(info.dstRank, info, 0, 0, 0, 0);  // a signal alone
}

void InterNode::raiseFlag(const proxy::PutInfo& info) {
  pushInbox(info.dstRank, device::InboxKind::FlagAdd, info.opTag, info.flagId, info.flagValue);
}

void InterNode::control(const proxy::ControlMessage& message) {
  switch (static_cast<RelayCode>(message.code)) {
    case RelayCode::Done:
      pushInbox(message.dstRank, device::InboxKind::DoneFrom, 0, message.srcRank, message.value);
      return;
    case RelayCode::Entered:
      pushInbox(message.dstRank, device::InboxKind::EnteredFrom, 0, message.srcRank, message.value);
      return;
  }
  failed(Error(ErrorCode::Internal, "rank " + std::to_string(message.srcRank) + " sent an unknown control code " +
                                        std::to_string(message.code)));
}

uint64_t InterNode::pushInbox(uint32_t rank, device::InboxKind kind, uint32_t opTag, uint32_t index, uint64_t value,
                              uint64_t dst, uint64_t src) {
  Local& l = local(rank);
  std::lock_guard<std::mutex> lock(l.inboxMu);
  RankResources& rr = ctx_.ranks[rank];
  const uint32_t cap = ctx_.config.inboxSlots;
  const uint64_t pos = rr.inboxWritten;
  const uint64_t* taken = &ctx_.mailboxes[rank].inboxTaken;
  const bool room = hostPoll(ctx_.config.hostBudgetMs, [&] {
    return pos - __atomic_load_n(taken, __ATOMIC_ACQUIRE) < cap || loadHost(&ctx_.status->abort) != 0;
  });
  if (!room)
    throw Error(ErrorCode::Timeout, "rank " + std::to_string(rank) + ": the kernel took no inbox record for " +
                                        fmtMs(ctx_.config.hostBudgetMs) + " (position " + std::to_string(pos) +
                                        ", taken " + std::to_string(__atomic_load_n(taken, __ATOMIC_ACQUIRE)) +
                                        ", capacity " + std::to_string(cap) + ")");
  if (loadHost(&ctx_.status->abort) != 0) return pos;  // the engine stopped: nothing applies any more
  device::InboxRecord* r = &rr.inbox[pos & (cap - 1)];
  __atomic_store_n(&r->value, value, __ATOMIC_RELAXED);
  __atomic_store_n(&r->dst, dst, __ATOMIC_RELAXED);
  __atomic_store_n(&r->src, src, __ATOMIC_RELAXED);
  // Last, with release: the kernel reads the header first (and the staged bytes this record announces were written
  // before it).
  __atomic_store_n(&r->header, device::packInboxHeader(kind, opTag, index), __ATOMIC_RELEASE);
  rr.inboxWritten = pos + 1;
  MK_LOG_AT(Debug, rankName(static_cast<int>(rank)),
            "inbox " + std::to_string(pos) + ": kind " + std::to_string(static_cast<int>(kind)) + " op tag " +
                std::to_string(opTag) + " index " + std::to_string(index) + " value " + std::to_string(value));
  return pos;
}

}  // namespace mk::runtime
