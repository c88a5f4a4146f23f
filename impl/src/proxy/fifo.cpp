// mkernel — the host side of the command FIFO (mk/proxy/fifo.hpp).
//
// The words the device writes or reads (ring slots, done) are plain uint64_t in memory shared with a GPU, so they
// are accessed with the compiler's __atomic builtins (the C++17 library has no atomic_ref); the orders below are
// the ones fifo_device.hpp documents for the device side.
#include "mk/proxy/fifo.hpp"

#include <algorithm>
#include <thread>

#include "mk/error.hpp"
#include "proxy/spin.hpp"

namespace mk::proxy {
namespace {

constexpr uint32_t kMaxCapacity = 1u << 24;

void checkCapacity(uint32_t capacity, const char* who) {
  if (capacity < 2 || capacity > kMaxCapacity || (capacity & (capacity - 1)) != 0)
    throw Error(ErrorCode::InvalidArgument, std::string(who) + ": capacity must be a power of two in [2, " +
                                                std::to_string(kMaxCapacity) + "] (got " + std::to_string(capacity) +
                                                ")");
}

std::string where(const PushSite& site) {
  return "rank " + std::to_string(site.rank) + " lane " + std::to_string(site.lane) + " step " +
         std::to_string(site.step);
}

}  // namespace

// ---- FifoBell -------------------------------------------------------------------------------------------------

// The wake-ups need store-load order on both sides (a Dekker pattern): the sleeper announces itself and then checks
// the FIFO; the notifier publishes (header or done) and then checks for sleepers; at least one sees the other. The
// notifier's publishing store is seq_cst (HostFifo::push, FifoConsumer::complete) and its load of the sleeper count
// too, so no fence is needed on the fast path (an xchg on x86, stlr/ldar on ARM); the sleeper, on the slow path,
// pairs its announcement with a full fence.
void FifoBell::pushed() noexcept {
  if (consumerAsleep_.load(std::memory_order_seq_cst) == 0) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++pushes_;
  }
  pushedCv_.notify_all();
}

void FifoBell::completed() noexcept {
  if (pushersAsleep_.load(std::memory_order_seq_cst) == 0) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++completions_;
  }
  completedCv_.notify_all();
}

void FifoBell::waitPushed(std::chrono::microseconds timeout, const std::function<bool()>& ready) {
  std::unique_lock<std::mutex> lock(mu_);
  consumerAsleep_.fetch_add(1, std::memory_order_seq_cst);
  std::atomic_thread_fence(std::memory_order_seq_cst);
  const uint64_t seen = pushes_;
  if (!ready()) pushedCv_.wait_for(lock, timeout, [&] { return pushes_ != seen; });
  consumerAsleep_.fetch_sub(1, std::memory_order_relaxed);
}

void FifoBell::waitCompleted(std::chrono::microseconds timeout, const std::function<bool()>& ready) {
  std::unique_lock<std::mutex> lock(mu_);
  pushersAsleep_.fetch_add(1, std::memory_order_seq_cst);
  std::atomic_thread_fence(std::memory_order_seq_cst);
  const uint64_t seen = completions_;
  if (!ready()) completedCv_.wait_for(lock, timeout, [&] { return completions_ != seen; });
  pushersAsleep_.fetch_sub(1, std::memory_order_relaxed);
}

// ---- FifoConsumer ---------------------------------------------------------------------------------------------

FifoConsumer::FifoConsumer(device::ProxyCommand* ring, uint64_t* done, uint32_t capacity, FifoBell* bell)
    : ring_(ring), done_(done), capacity_(capacity), bell_(bell) {
  if (!ring || !done) throw Error(ErrorCode::InvalidArgument, "FifoConsumer: ring and done must not be null");
  checkCapacity(capacity, "FifoConsumer");
  next_ = __atomic_load_n(done_, __ATOMIC_ACQUIRE);
}

std::size_t FifoConsumer::poll(PoppedCommand* out, std::size_t maxBatch) noexcept {
  std::size_t n = 0;
  while (n < maxBatch) {
    device::ProxyCommand& slot = ring_[next_ & (capacity_ - 1)];
    // Acquire pairs with the pusher's release store of the header (written after arg).
    const uint64_t header = __atomic_load_n(&slot.header, __ATOMIC_ACQUIRE);
    if (device::proxyKind(header) == device::ProxyKind::Empty) break;
    out[n].position = next_;
    out[n].command.header = header;
    out[n].command.arg = __atomic_load_n(&slot.arg, __ATOMIC_RELAXED);
    // Relaxed: the release store of `done` in complete() orders it before the slot can be claimed again.
    __atomic_store_n(&slot.header, 0, __ATOMIC_RELAXED);
    ++next_;
    ++n;
  }
  return n;
}

bool FifoConsumer::ready() const noexcept {
  const device::ProxyCommand& slot = ring_[next_ & (capacity_ - 1)];
  return device::proxyKind(__atomic_load_n(&slot.header, __ATOMIC_ACQUIRE)) != device::ProxyKind::Empty;
}

uint64_t FifoConsumer::readyBeyondGap(uint32_t lookahead) const noexcept {
  if (ready()) return 0;
  // Positions next()+1 .. next()+lookahead-1 of this lap: a later lap cannot be written before done passes next().
  for (uint32_t k = 1; k < lookahead && k < capacity_; ++k) {
    const device::ProxyCommand& slot = ring_[(next_ + k) & (capacity_ - 1)];
    if (device::proxyKind(__atomic_load_n(&slot.header, __ATOMIC_ACQUIRE)) != device::ProxyKind::Empty)
      return next_ + k;
  }
  return 0;
}

void FifoConsumer::complete(uint64_t endPosition) noexcept {
  // Release (at least): the header zeroed in poll() and every read of the command's source data happen before a
  // pusher sees the slot free. seq_cst where a host pusher may sleep on the bell (see FifoBell).
  __atomic_store_n(done_, endPosition, bell_ ? __ATOMIC_SEQ_CST : __ATOMIC_RELEASE);
  if (bell_) bell_->completed();
}

uint64_t FifoConsumer::done() const noexcept { return __atomic_load_n(done_, __ATOMIC_RELAXED); }

// ---- HostFifo -------------------------------------------------------------------------------------------------

struct HostFifo::Memory {
  // Each counter on its own cache line: pushers hammer head, the consumer writes done.
  alignas(64) uint64_t head = 0;
  alignas(64) uint64_t doneCache = 0;
  alignas(64) uint64_t done = 0;
  std::unique_ptr<device::ProxyCommand[]> ring;
};

HostFifo::HostFifo(uint32_t capacity) : capacity_(capacity) {
  checkCapacity(capacity, "HostFifo");
  mem_ = std::make_unique<Memory>();
  mem_->ring = std::make_unique<device::ProxyCommand[]>(capacity);  // value-initialised: every header Empty
}

HostFifo::~HostFifo() = default;

std::optional<uint64_t> HostFifo::push(const device::ProxyCommand& command, const PushSite& site,
                                       std::chrono::milliseconds budget, const std::function<bool()>& cancelled) {
  if (device::proxyKind(command.header) == device::ProxyKind::Empty)
    throw Error(ErrorCode::InvalidArgument, where(site) +
                                                ": a proxy command of kind Empty marks a free slot and "
                                                "cannot be pushed");
  const uint64_t position = __atomic_fetch_add(&mem_->head, 1, __ATOMIC_RELAXED);
  uint64_t done = __atomic_load_n(&mem_->doneCache, __ATOMIC_RELAXED);
  if (position - done >= capacity_) {
    auto roomy = [&] {
      done = __atomic_load_n(&mem_->done, __ATOMIC_ACQUIRE);
      return position - done < capacity_;
    };
    SpinWait wait(budget);
    while (!roomy()) {
      if (cancelled && cancelled()) return std::nullopt;
      if (wait.expired())
        throw Error(ErrorCode::Timeout,
                    where(site) + ": the proxy FIFO stayed full for " + std::to_string(budget.count()) +
                        " ms at position " + std::to_string(position) + " (done " + std::to_string(done) +
                        ", capacity " + std::to_string(capacity_) + "): the proxy stopped answering");
      if (wait.spin()) continue;
      bell_.waitCompleted(wait.sleepSlice(), roomy);
    }
    __atomic_store_n(&mem_->doneCache, done, __ATOMIC_RELAXED);
  }
  device::ProxyCommand& slot = mem_->ring[position & (capacity_ - 1)];
  __atomic_store_n(&slot.arg, command.arg, __ATOMIC_RELAXED);
  // Last, publishing arg with it; seq_cst (not just release) so the bell needs no fence (see FifoBell).
  __atomic_store_n(&slot.header, command.header, __ATOMIC_SEQ_CST);
  bell_.pushed();
  return position;
}

bool HostFifo::waitDone(uint64_t position, const PushSite& site, std::chrono::milliseconds budget,
                        const std::function<bool()>& cancelled) {
  auto handled = [&] { return __atomic_load_n(&mem_->done, __ATOMIC_ACQUIRE) > position; };
  SpinWait wait(budget);
  while (!handled()) {
    if (cancelled && cancelled()) return false;
    if (wait.expired())
      throw Error(ErrorCode::Timeout, where(site) + ": the proxy has not handled FIFO position " +
                                          std::to_string(position) + " within " + std::to_string(budget.count()) +
                                          " ms (done " + std::to_string(done()) + ", capacity " +
                                          std::to_string(capacity_) + "): the proxy stopped answering");
    if (wait.spin()) continue;
    bell_.waitCompleted(wait.sleepSlice(), handled);
  }
  return true;
}

FifoConsumer HostFifo::consumer() { return FifoConsumer(mem_->ring.get(), &mem_->done, capacity_, &bell_); }

uint64_t HostFifo::done() const noexcept { return __atomic_load_n(&mem_->done, __ATOMIC_ACQUIRE); }

uint64_t HostFifo::head() const noexcept { return __atomic_load_n(&mem_->head, __ATOMIC_RELAXED); }

device::ProxyFifoDeviceHandle HostFifo::handle() noexcept {
  device::ProxyFifoDeviceHandle h{};
  h.ring = mem_->ring.get();
  h.head = &mem_->head;
  h.doneCache = &mem_->doneCache;
  h.done = &mem_->done;
  h.capacity = capacity_;
  return h;
}

}  // namespace mk::proxy
