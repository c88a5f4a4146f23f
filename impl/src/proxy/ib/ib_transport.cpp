// mkernel — the ibverbs transport (ib_transport.hpp; docs/inter-node.md, "ibverbs transport"): one RC queue pair per
// process of the job (itself included), set up through the bootstrap, the slot protocol of ib_peer.hpp over each,
// and one progress thread that polls the shared completion queue. Never run on an RDMA NIC: only its refusal on a
// machine without one has run (docs/inter-node.md, "What has never run on a NIC").
#include "proxy/ib_transport.hpp"

#include <atomic>
#include <cstdio>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>
#include <unordered_map>

#include "mk/bootstrap.hpp"
#include "mk/util/range.hpp"
#include "proxy/ib/ib_peer.hpp"
#include "proxy/spin.hpp"

namespace mk::proxy {

bool ibverbsBuilt() noexcept { return true; }

int rdmaDeviceCount(std::string* why) noexcept {
  try {
    return static_cast<int>(ib::makeRealVerbs()->deviceNames(why).size());
  } catch (const std::exception& e) {
    if (why) *why = e.what();
    return 0;
  }
}

namespace {

using ib::IbPeer;

class IbTransport final : public Transport {
 public:
  IbTransport(Bootstrap& boot, const TransportOptions& options)
      : opt_(options), me_(boot.rank()), n_(boot.size()), api_(ib::makeRealVerbs()) {
    std::string why;
    if (api_->deviceNames(&why).empty())
      throw Error(ErrorCode::Unsupported,
                  "transport ibverbs: no RDMA device found; use transport socket (" + why + ")");
    const uint32_t depth = static_cast<uint32_t>(n_) * 6 * opt_.ibSlots;  // every queue pair's sends and receives
    port_ = api_->open(opt_.ibDevice, opt_.ibPort, depth);
    if (!port_.active)
      throw Error(ErrorCode::IoError, "transport ibverbs: port " + std::to_string(opt_.ibPort) + " of device '" +
                                          opt_.ibDevice +
                                          "' is not active (cable, subnet manager?); use another "
                                          "port or transport socket");
    MemoryCopier& memory = opt_.stagingMemory ? *opt_.stagingMemory : hostMemory_;
    ib::PeerOptions po;
    po.slots = opt_.ibSlots;
    po.chunkBytes = opt_.chunkBytes;
    po.port = opt_.ibPort;
    po.budget = opt_.budget;
    po.payloadChecksum = opt_.payloadChecksum;
    std::vector<ib::EndpointRecord> mine(static_cast<std::size_t>(n_));
    for (int p = 0; p < n_; ++p) {
      peers_.push_back(std::make_unique<IbPeer>(*api_, me_, p, "process " + std::to_string(p), po));
      mine[static_cast<std::size_t>(p)] = peers_.back()->open(port_, memory);
      byQpn_[peers_.back()->qpn()] = peers_.back().get();
    }
    // Record (p, q) is process p's end of its connection to q: each process reads the row entries meant for it.
    const std::vector<uint8_t> all = boot.allGather(mine.data(), mine.size() * sizeof(ib::EndpointRecord));
    for (int p = 0; p < n_; ++p) {
      ib::EndpointRecord remote;
      std::memcpy(
          &remote,
          all.data() + (static_cast<std::size_t>(p) * static_cast<std::size_t>(n_) + static_cast<std::size_t>(me_)) *
                           sizeof remote,
          sizeof remote);
      peers_[static_cast<std::size_t>(p)]->connect(remote, port_);
    }
    boot.barrier();  // every queue pair of the job is ready to receive before anything is written
  }
  ~IbTransport() override { close(); }

  TransportKind kind() const noexcept override { return TransportKind::Ibverbs; }
  int process() const noexcept override { return me_; }
  int processes() const noexcept override { return n_; }
  std::string describeProcess(int p) const override { return "process " + std::to_string(p) + " (ibverbs)"; }

  void start(ProxySink& sink, MemoryCopier& copier) override {
    if (sink_) throw Error(ErrorCode::InvalidArgument, "ibverbs transport: start() called twice");
    sink_ = &sink;
    copier_ = &copier;
    progress_ = std::thread([this] { progressMain(); });
  }

  std::unique_ptr<Sender> openSender(MemoryCopier& copier) override;

  void sendControl(int process, const ControlMessage& m) override { peer(process).sendControl(m); }

  bool registerMemory(const void* base, std::size_t bytes, int dmabufFd, uint64_t dmabufOffset) override {
    try {
      ib::MemoryRegion mr = dmabufFd >= 0
                                ? api_->registerDmabuf(dmabufFd, dmabufOffset, bytes, reinterpret_cast<uint64_t>(base))
                                : api_->registerHost(const_cast<void*>(base), bytes, false);
      std::lock_guard<std::mutex> lock(regMu_);
      regions_.push_back(mr);
      return true;
    } catch (const Error& e) {
      log("ibverbs transport: engine memory [" + std::to_string(reinterpret_cast<uint64_t>(base)) + ", +" +
          std::to_string(bytes) + ") stays staged: " + e.message());
      return false;
    }
  }

  void abortAll(const Error& error) noexcept override {
    if (aborted_.exchange(true)) return;
    for (int p = 0; p < n_; ++p)
      if (p != me_) peers_[static_cast<std::size_t>(p)]->sendAbort(me_, error, std::chrono::milliseconds(200));
  }

  void close() noexcept override {
    if (closed_.exchange(true)) return;
    for (auto& p : peers_)
      if (p->state() == ib::PeerState::ReadyToSend) try {
          p->sendGoodbye();
        } catch (const Error& e) {
          log(e.message() + " (sending the goodbye)");
        }
    // The progress thread delivers the peers' goodbyes; wait for them (bounded) so no queue pair is destroyed
    // while a peer still writes into it.
    const auto deadline = std::chrono::steady_clock::now() + opt_.budget;
    while (progress_.joinable() && std::chrono::steady_clock::now() < deadline) {
      bool all = true;
      for (auto& p : peers_) all = all && (p->goodbyeSeen() || p->abortSeen() || p->state() == ib::PeerState::Failed);
      if (all) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    stop_.store(true);
    if (progress_.joinable()) progress_.join();
    peers_.clear();
    for (const ib::MemoryRegion& mr : regions_) api_->deregister(mr);
    regions_.clear();
  }

  IbPeer& peer(int process) {
    if (process < 0 || process >= n_)
      throw Error(ErrorCode::InvalidArgument, "ibverbs transport: process " + std::to_string(process) +
                                                  " is not in this job of " + std::to_string(n_) + " processes");
    if (closed_.load()) throw Error(ErrorCode::InvalidArgument, "ibverbs transport: sending after close()");
    return *peers_[static_cast<std::size_t>(process)];
  }

  /// The registered region holding [src, src + bytes), or null.
  const ib::MemoryRegion* regionFor(const void* src, uint64_t bytes) {
    const auto a = reinterpret_cast<uint64_t>(src);
    std::lock_guard<std::mutex> lock(regMu_);
    for (const ib::MemoryRegion& mr : regions_)
      if (a >= mr.addr && rangeInside(a - mr.addr, bytes, mr.length)) return &mr;
    return nullptr;
  }

 private:
  void log(const std::string& line) const {
    if (opt_.log)
      opt_.log(line);
    else
      std::fprintf(stderr, "mkernel: %s\n", line.c_str());
  }

  void progressMain() noexcept {
    std::unique_ptr<CopyStream> stream;
    try {
      stream = copier_->openStream();
    } catch (const Error& e) {
      sink_->failed(e);
      return;
    }
    ib::Completion batch[32];
    uint32_t idle = 0;
    while (!stop_.load(std::memory_order_relaxed)) {
      std::size_t n = 0;
      try {
        n = api_->pollCq(batch, 32);
      } catch (const Error& e) {
        sink_->failed(e);
        abortAll(e);
        return;
      }
      if (n == 0) {
        // Spin a while (a frame usually follows within microseconds), then sleep in short slices.
        if (++idle < 4096)
          cpuRelax();
        else
          std::this_thread::sleep_for(std::chrono::microseconds(50));
        continue;
      }
      idle = 0;
      for (std::size_t i = 0; i < n; ++i) {
        const auto it = byQpn_.find(batch[i].qpn);
        if (it == byQpn_.end()) continue;  // a queue pair already torn down
        try {
          it->second->onCompletion(batch[i], *sink_, *stream);
        } catch (const Error& e) {
          it->second->fail(e);
          if (closed_.load()) {
            log(e.message() + " (while closing)");
            continue;
          }
          sink_->failed(e);
          abortAll(e);
        }
      }
    }
  }

  TransportOptions opt_;
  int me_, n_;
  std::unique_ptr<ib::VerbsApi> api_;
  ib::PortInfo port_{};
  HostCopier hostMemory_;
  std::vector<std::unique_ptr<IbPeer>> peers_;
  std::unordered_map<uint32_t, IbPeer*> byQpn_;
  std::mutex regMu_;
  std::deque<ib::MemoryRegion> regions_;  ///< a deque: senders hold pointers into it while others register
  ProxySink* sink_ = nullptr;
  MemoryCopier* copier_ = nullptr;
  std::thread progress_;
  std::atomic<bool> stop_{false}, aborted_{false}, closed_{false};
};

class IbSender final : public Sender {
 public:
  IbSender(IbTransport& t, MemoryCopier& copier) : t_(t), stream_(copier.openStream()) {}
  void put(int process, const PutRequest& req) override {
    t_.peer(process).sendPut(req, *stream_, req.info.bytes ? t_.regionFor(req.src, req.info.bytes) : nullptr);
  }
  void flush() override {}  // every frame is posted when put() returns

 private:
  IbTransport& t_;
  std::unique_ptr<CopyStream> stream_;
};

std::unique_ptr<Sender> IbTransport::openSender(MemoryCopier& copier) {
  return std::make_unique<IbSender>(*this, copier);
}

}  // namespace

std::unique_ptr<Transport> connectIbverbsTransport(Bootstrap& bootstrap, const TransportOptions& options) {
  return std::make_unique<IbTransport>(bootstrap, options);
}

}  // namespace mk::proxy
