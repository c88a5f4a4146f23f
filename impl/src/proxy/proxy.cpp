// mkernel — the proxy's consumer threads (mk/proxy/proxy.hpp).
//
// One thread per FIFO, so commands of one FIFO are handled in position order and `done` advances in that order.
// A command is handled in full (the Sender has read its source) before `done` passes it; the Sender is flushed
// after each batch, so a small put waits at most one batch before it leaves. A failure stops that thread: the
// sink hears it (the engine fails its ops, which releases the pushers) and every other process is told.
#include "mk/proxy/proxy.hpp"

#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <optional>
#include <set>

#include "mk/bootstrap.hpp"
#include "proxy/spin.hpp"

namespace mk::proxy {
namespace {

/// A put above this size streams through the transport (it is not buffered with the small ones): the commands
/// before it are released first, and it is released once sent.
constexpr uint64_t kStreamedPutBytes = 64 * 1024;

}  // namespace

struct Proxy::Consumer {
  uint32_t rank = 0;
  FifoConsumer fifo;
  int cpu = -1;
  std::atomic<uint64_t> handled{0};
  std::thread thread;
};

Proxy::Proxy(Transport& transport, ProxyResolver& resolver, ProxySink& sink, MemoryCopier& copier, ProxyOptions options)
    : transport_(transport), resolver_(resolver), sink_(sink), copier_(copier), opt_(std::move(options)) {
  if (opt_.maxBatch == 0) throw Error(ErrorCode::InvalidArgument, "ProxyOptions::maxBatch must be >= 1 (got 0)");
}

Proxy::~Proxy() { stop(); }

void Proxy::log(const std::string& line) const {
  if (opt_.log)
    opt_.log(line);
  else
    std::fprintf(stderr, "mkernel: %s\n", line.c_str());
}

void Proxy::setPlacement(std::vector<int> processOfRank) {
  if (started_) throw Error(ErrorCode::InvalidArgument, "Proxy::setPlacement: the proxy already started");
  for (std::size_t r = 0; r < processOfRank.size(); ++r)
    if (processOfRank[r] < 0 || processOfRank[r] >= transport_.processes())
      throw Error(ErrorCode::InvalidArgument, "Proxy::setPlacement: rank " + std::to_string(r) +
                                                  " is placed on process " + std::to_string(processOfRank[r]) +
                                                  ", expected 0.." + std::to_string(transport_.processes() - 1));
  processOfRank_ = std::move(processOfRank);
}

void Proxy::addFifo(uint32_t rank, FifoConsumer consumer) {
  if (started_) throw Error(ErrorCode::InvalidArgument, "Proxy::addFifo: the proxy already started");
  if (!consumer.valid())
    throw Error(ErrorCode::InvalidArgument,
                "Proxy::addFifo: rank " + std::to_string(rank) + ": the FIFO consumer has no memory");
  for (const auto& c : consumers_)
    if (c->rank == rank)
      throw Error(ErrorCode::InvalidArgument,
                  "Proxy::addFifo: rank " + std::to_string(rank) + " already has a FIFO (one consumer per FIFO)");
  auto c = std::make_unique<Consumer>();
  c->rank = rank;
  c->fifo = consumer;
  if (!opt_.cpus.empty()) c->cpu = opt_.cpus[consumers_.size() % opt_.cpus.size()];
  consumers_.push_back(std::move(c));
}

void Proxy::start() {
  if (started_) throw Error(ErrorCode::InvalidArgument, "Proxy::start: called twice");
  if (processOfRank_.empty()) throw Error(ErrorCode::InvalidArgument, "Proxy::start: no placement (setPlacement)");
  started_ = true;
  transport_.start(sink_, copier_);
  for (auto& c : consumers_) {
    Consumer* raw = c.get();
    c->thread = std::thread([this, raw] { consumerMain(*raw); });
  }
}

void Proxy::stop() noexcept {
  stopping_.store(true);
  wake();  // a consumer asleep between polls sees stopping_ at once
  for (auto& c : consumers_) {
    if (c->fifo.bell()) c->fifo.bell()->pushed();  // a consumer asleep on its bell wakes and sees stopping_
    if (c->thread.joinable()) c->thread.join();
  }
}

void Proxy::abort(const Error& error) noexcept { transport_.abortAll(error); }

int Proxy::processOf(uint32_t rank) const {
  if (rank >= processOfRank_.size())
    throw Error(ErrorCode::InvalidArgument, "rank " + std::to_string(rank) + " is outside the placement of " +
                                                std::to_string(processOfRank_.size()) + " ranks");
  return processOfRank_[rank];
}

void Proxy::sendControl(const ControlMessage& message) { transport_.sendControl(processOf(message.dstRank), message); }

uint64_t Proxy::handled(uint32_t rank) const noexcept {
  for (const auto& c : consumers_)
    if (c->rank == rank) return c->handled.load(std::memory_order_relaxed);
  return 0;
}

void Proxy::checkGap(Consumer& c, std::chrono::steady_clock::time_point& gapSince) {
  const uint64_t later = c.fifo.readyBeyondGap(64);
  if (later == 0) {
    gapSince = {};
    return;
  }
  const auto now = std::chrono::steady_clock::now();
  if (gapSince == std::chrono::steady_clock::time_point{}) gapSince = now;
  if (now - gapSince < opt_.commandBudget) return;
  throw Error(ErrorCode::Timeout,
              "FIFO position " + std::to_string(c.fifo.next()) + " was claimed but its command never arrived within " +
                  std::to_string(opt_.commandBudget.count()) + " ms, while position " + std::to_string(later) +
                  " holds one (a pusher died between claiming and writing, or wrote out of order)");
}

void Proxy::wake() noexcept {
  {
    std::lock_guard<std::mutex> lock(wakeMu_);
    wakes_.fetch_add(1, std::memory_order_relaxed);
  }
  wakeCv_.notify_all();
}

void Proxy::idle(Consumer& c, uint32_t& idleRounds) {
  // Spin first: a lane pushing a burst of commands keeps the proxy busy, and a sleep costs tens of microseconds.
  // The poll hook runs on every round; while it says more is due, the spin goes on.
  const uint64_t wakesSeen = wakes_.load(std::memory_order_relaxed);
  const auto spinUntil = std::chrono::steady_clock::now() + opt_.idleSpin;
  bool busy = false;
  do {
    for (int i = 0; i < 64; ++i) {
      if (c.fifo.ready() || stopping_.load(std::memory_order_relaxed)) {
        idleRounds = 0;
        return;
      }
      cpuRelax();
    }
    busy = opt_.poll && opt_.poll();
    if (busy) idleRounds = 0;
  } while (busy || std::chrono::steady_clock::now() < spinUntil);
  if (FifoBell* bell = c.fifo.bell()) {
    bell->waitPushed(std::chrono::milliseconds(1),
                     [&] { return c.fifo.ready() || stopping_.load(std::memory_order_relaxed); });
    return;
  }
  // A device FIFO cannot ring: sleep in growing slices up to maxIdleSleep, or until wake().
  const auto slice = std::min<std::chrono::microseconds>(opt_.maxIdleSleep,
                                                         std::chrono::microseconds(1L << std::min(idleRounds, 10u)));
  ++idleRounds;
  std::unique_lock<std::mutex> lock(wakeMu_);
  wakeCv_.wait_for(lock, slice, [&] {
    return wakes_.load(std::memory_order_relaxed) != wakesSeen || stopping_.load(std::memory_order_relaxed);
  });
}

std::optional<PutRequest> Proxy::resolve(Consumer& c, const PoppedCommand& popped) {
  const uint64_t header = popped.command.header;
  const device::ProxyKind kind = device::proxyKind(header);
  if (kind == device::ProxyKind::Flush) return std::nullopt;
  if (kind != device::ProxyKind::Put && kind != device::ProxyKind::PutSignal && kind != device::ProxyKind::Signal)
    throw Error(ErrorCode::InvalidArgument, "unknown command kind " + std::to_string(static_cast<unsigned>(kind)));
  PutRequest req = resolver_.resolve(c.rank, popped.command, popped.position);
  const PutInfo& in = req.info;
  const bool wantData = kind != device::ProxyKind::Signal;
  const bool wantSignal = kind != device::ProxyKind::Put;
  if ((in.bytes > 0) != wantData || in.signal != wantSignal || (in.bytes > 0 && !req.src))
    throw Error(ErrorCode::Internal, "the resolver answered " + std::to_string(in.bytes) + " bytes" +
                                         (in.signal ? " with a signal" : " without a signal") +
                                         (in.bytes > 0 && !req.src ? " from a null source" : "") +
                                         " for a command of kind " + std::to_string(static_cast<unsigned>(kind)));
  return req;
}

void Proxy::consumerMain(Consumer& c) noexcept {
  if (c.cpu >= 0) {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(c.cpu, &set);
    if (pthread_setaffinity_np(pthread_self(), sizeof set, &set) != 0)
      log("proxy of rank " + std::to_string(c.rank) + ": cannot pin its thread to CPU " + std::to_string(c.cpu) +
          " (not in this process's CPU set?); it runs unpinned");
  }
  PoppedCommand current{};
  try {
    std::unique_ptr<Sender> sender = transport_.openSender(copier_);
    std::vector<PoppedCommand> batch(opt_.maxBatch);
    std::vector<std::optional<PutRequest>> requests(opt_.maxBatch);
    uint32_t idleRounds = 0;
    std::chrono::steady_clock::time_point gapSince{};
    while (!stopping_.load(std::memory_order_relaxed)) {
      const std::size_t n = c.fifo.poll(batch.data(), batch.size());
      if (n == 0) {
        checkGap(c, gapSince);
        idle(c, idleRounds);
        continue;
      }
      gapSince = {};
      // Resolve the batch first (cheap), then send in order. `done` is published once per batch (one store, one
      // bell check), except around a put that streams: the commands before it are released before it starts, and
      // it is released as soon as its source has been read.
      for (std::size_t i = 0; i < n; ++i) {
        current = batch[i];
        requests[i] = resolve(c, current);
      }
      uint64_t released = batch[0].position;
      // `handled` counts a command before `done` passes it (the release of done then publishes the count too).
      auto release = [&](uint64_t end) {
        c.handled.fetch_add(end - released, std::memory_order_relaxed);
        c.fifo.complete(released = end);
      };
      for (std::size_t i = 0; i < n; ++i) {
        current = batch[i];
        const bool streams = requests[i] && requests[i]->info.bytes > kStreamedPutBytes;
        if (streams && released < current.position) {
          sender->flush();
          release(current.position);
        }
        if (requests[i])
          sender->put(processOf(requests[i]->info.dstRank), *requests[i]);
        else
          sender->flush();  // a Flush command: everything before it leaves now
        if (streams) release(current.position + 1);
        if (opt_.poll) opt_.poll();
      }
      current = PoppedCommand{};
      sender->flush();
      if (released < batch[n - 1].position + 1) release(batch[n - 1].position + 1);
    }
  } catch (const std::exception& e) {
    const Error* mkError = dynamic_cast<const Error*>(&e);
    const uint64_t h = current.command.header;
    std::string what = "proxy of rank " + std::to_string(c.rank);
    if (h != 0)
      what += ", FIFO position " + std::to_string(current.position) + " (op tag " +
              std::to_string(device::proxyOpTag(h)) + ", lane " + std::to_string(device::proxyLane(h)) + ", step " +
              std::to_string(device::proxyStep(h)) + ")";
    const Error error(mkError ? mkError->code() : ErrorCode::Internal,
                      what + ": " + (mkError ? mkError->message() : std::string(e.what())));
    sink_.failed(error);
    transport_.abortAll(error);
  }
}

std::vector<int> exchangePlacement(Bootstrap& bootstrap, const std::vector<uint32_t>& myRanks, uint32_t nRanks) {
  // Two exchanges (counts, then lists padded to the longest) because the bootstrap gathers equal sizes.
  const uint64_t mine[2] = {nRanks, myRanks.size()};
  const std::vector<uint8_t> heads = bootstrap.allGather(mine, sizeof mine);
  const int n = bootstrap.size();
  uint64_t longest = 0;
  for (int p = 0; p < n; ++p) {
    uint64_t theirs[2];
    std::memcpy(theirs, heads.data() + static_cast<std::size_t>(p) * sizeof theirs, sizeof theirs);
    if (theirs[0] != nRanks)
      throw Error(ErrorCode::InvalidArgument,
                  "placement: process " + std::to_string(p) + " runs a job of " + std::to_string(theirs[0]) +
                      " ranks, process " + std::to_string(bootstrap.rank()) + " one of " + std::to_string(nRanks));
    longest = std::max(longest, theirs[1]);
  }
  std::vector<uint32_t> padded(static_cast<std::size_t>(longest), UINT32_MAX);
  std::copy(myRanks.begin(), myRanks.end(), padded.begin());
  const std::vector<uint8_t> lists = bootstrap.allGather(padded.data(), padded.size() * sizeof(uint32_t));
  std::vector<int> processOf(nRanks, -1);
  for (int p = 0; p < n; ++p)
    for (uint64_t i = 0; i < longest; ++i) {
      uint32_t r;
      std::memcpy(&r, lists.data() + (static_cast<std::size_t>(p) * longest + i) * sizeof r, sizeof r);
      if (r == UINT32_MAX) continue;
      if (r >= nRanks)
        throw Error(ErrorCode::InvalidArgument, "placement: process " + std::to_string(p) + " says it runs rank " +
                                                    std::to_string(r) + ", outside 0.." + std::to_string(nRanks - 1));
      if (processOf[r] >= 0)
        throw Error(ErrorCode::InvalidArgument, "placement: rank " + std::to_string(r) + " is run by process " +
                                                    std::to_string(processOf[r]) + " and by process " +
                                                    std::to_string(p) + " (each rank by exactly one process)");
      processOf[r] = p;
    }
  for (uint32_t r = 0; r < nRanks; ++r)
    if (processOf[r] < 0)
      throw Error(ErrorCode::InvalidArgument,
                  "placement: no process runs rank " + std::to_string(r) + " (each rank by exactly one process)");
  return processOf;
}

}  // namespace mk::proxy
