// mkernel — the CPU reference executor on the inter-node path (mk/proxy/exec_port.hpp).
//
// One op at a time: begin() records the run (schedule, memory, endpoint, op tag) and then meets the other
// processes at a bootstrap barrier, so no process's lane pushes before every receiver knows the run. The proxy's
// resolver and sink look the run up under one mutex; a put or signal for another op tag is a protocol error. After
// a failure end() tells the other processes (unless the failure came from them), stops the proxy and closes the
// transport, so no thread touches the run's memory once execute() returned.
#include "mk/proxy/exec_port.hpp"

#include <mutex>
#include <optional>

#include "mk/bootstrap.hpp"
#include "mk/schedule/schedule.hpp"

namespace mk::proxy {
namespace {

Error asError(std::exception_ptr e) {
  try {
    std::rethrow_exception(std::move(e));
  } catch (const Error& err) {
    return err;
  } catch (const std::exception& err) {
    return Error(ErrorCode::Internal, err.what());
  } catch (...) {
    return Error(ErrorCode::Internal, "unknown exception");
  }
}

}  // namespace

struct ExecProxyPort::Impl final : ProxyResolver, ProxySink {
  Bootstrap& bootstrap;
  uint32_t nRanks;
  std::vector<uint32_t> localRanks;
  ExecPortOptions opt;
  HostCopier copier;
  std::unique_ptr<Transport> transport;
  std::vector<std::unique_ptr<HostFifo>> fifos;  ///< [rank], null for other processes' ranks
  std::unique_ptr<Proxy> proxy;

  std::mutex mu;  ///< guards the run and the failure below
  const Schedule* schedule = nullptr;
  HostMemory* memory = nullptr;
  RemoteEndpoint* endpoint = nullptr;
  uint32_t opTag = 0;  ///< the running op's tag (sequence number mod kProxyOpTags)
  uint64_t opSeq = 0;  ///< ops begun so far
  bool active = false;
  std::optional<Error> peerError;  ///< the first failure reported through the sink (already told to the others)
  std::optional<Error> spent;      ///< why this port cannot run any more

  Impl(Bootstrap& b, uint32_t n, std::vector<uint32_t> ranks, ExecPortOptions o)
      : bootstrap(b), nRanks(n), localRanks(std::move(ranks)), opt(std::move(o)), copier(!opt.stagedCopies) {}

  // ---- ProxyResolver -----------------------------------------------------------------------------------------
  PutRequest resolve(uint32_t rank, const device::ProxyCommand& command, uint64_t /*position*/) override {
    std::lock_guard<std::mutex> lock(mu);
    if (!active) throw Error(ErrorCode::Internal, "a command arrived while no op runs");
    const uint32_t tag = device::proxyOpTag(command.header);
    if (tag != opTag)
      throw Error(ErrorCode::Internal,
                  "the command names op tag " + std::to_string(tag) + ", the running op has " + std::to_string(opTag));
    const uint32_t lane = device::proxyLane(command.header);
    const uint32_t step = device::proxyStep(command.header);
    const Schedule& s = *schedule;
    if (rank >= s.nRanks || lane >= s.lanes[rank].size() || step >= s.lanes[rank][lane].steps.size() ||
        s.lanes[rank][lane].steps[step].kind != StepKind::ProxyPut)
      throw Error(ErrorCode::Internal, "the command names lane " + std::to_string(lane) + " step " +
                                           std::to_string(step) + ", which is no proxyput step of rank " +
                                           std::to_string(rank));
    const Step& st = s.lanes[rank][lane].steps[step];
    const uint64_t count = runtimeCount(s, st, rank, endpoint->extents());
    PutRequest req;
    PutInfo& p = req.info;
    p.srcRank = rank;
    p.dstRank = count > 0 ? st.dst.rank : st.flag.rank;  // a signal alone has no data operands
    p.opTag = tag;
    p.lane = lane;
    p.step = step;
    p.dstBuffer = st.dst.buffer;
    p.signal = (st.flags & kStepSignal) != 0;
    p.flagId = st.flag.id;
    p.flagValue = st.value;
    if (count > 0) {
      // The executor checked both operand ranges before it pushed the command.
      const uint64_t esize = dtypeSize(s.buffers[st.a.buffer].dtype);
      p.bytes = count * esize;
      p.dstOffset = st.dst.offset * esize;
      req.src = memory->bytes[rank][st.a.buffer].data() + st.a.offset * esize;
    }
    return req;
  }

  // ---- ProxySink ---------------------------------------------------------------------------------------------
  /// The running op's endpoint for an arrival of op tag `tag` (under mu).
  RemoteEndpoint& endpointFor(const PutArrival& a) {
    if (!active)
      throw Error(ErrorCode::InvalidArgument,
                  "a put for op tag " + std::to_string(a.info.opTag) + " arrived while this process runs no op");
    if (a.info.opTag != opTag)
      throw Error(ErrorCode::InvalidArgument, "a put for op tag " + std::to_string(a.info.opTag) +
                                                  " arrived while op tag " + std::to_string(opTag) + " runs");
    return *endpoint;
  }

  void* putDestination(const PutArrival& a) override {
    std::lock_guard<std::mutex> lock(mu);
    return endpointFor(a).remoteWriteTarget(a.info.dstRank, a.info.dstBuffer, a.info.dstOffset, a.info.bytes);
  }

  void putLanded(const PutArrival& a) override {
    std::lock_guard<std::mutex> lock(mu);
    RemoteEndpoint& e = endpointFor(a);
    if (a.info.signal) e.remoteSignal(a.info.dstRank, a.info.flagId, a.info.flagValue);
  }

  void control(const ControlMessage& m) override {
    if (opt.onControl) opt.onControl(m);
  }

  void failed(const Error& error) noexcept override {
    std::lock_guard<std::mutex> lock(mu);
    if (!peerError) peerError = error;
    if (active) endpoint->remoteFailure(std::make_exception_ptr(error));
  }
};

ExecProxyPort::ExecProxyPort(Bootstrap& bootstrap, uint32_t nRanks, std::vector<uint32_t> localRanks,
                             ExecPortOptions options)
    : impl_(std::make_unique<Impl>(bootstrap, nRanks, std::move(localRanks), std::move(options))) {
  Impl& m = *impl_;
  m.transport = connectTransport(bootstrap, m.opt.transport);
  const std::vector<int> placement = exchangePlacement(bootstrap, m.localRanks, nRanks);
  m.fifos.resize(nRanks);
  m.proxy = std::make_unique<Proxy>(*m.transport, m, m, m.copier, m.opt.proxy);
  m.proxy->setPlacement(placement);
  for (uint32_t r : m.localRanks) {
    m.fifos[r] = std::make_unique<HostFifo>(m.opt.fifoCapacity);
    m.proxy->addFifo(r, m.fifos[r]->consumer());
  }
  m.proxy->start();
}

ExecProxyPort::~ExecProxyPort() {
  impl_->proxy->stop();
  impl_->transport->close();
}

Transport& ExecProxyPort::transport() noexcept { return *impl_->transport; }
Proxy& ExecProxyPort::proxy() noexcept { return *impl_->proxy; }
const std::vector<uint32_t>& ExecProxyPort::localRanks() const noexcept { return impl_->localRanks; }

void ExecProxyPort::begin(const Schedule& s, HostMemory& mem, RemoteEndpoint& endpoint) {
  Impl& m = *impl_;
  {
    std::lock_guard<std::mutex> lock(m.mu);
    if (m.spent) throw Error(m.spent->code(), "this inter-node port failed in an earlier run: " + m.spent->message());
    if (m.peerError) throw *m.peerError;
    if (s.nRanks != m.nRanks)
      throw Error(ErrorCode::InvalidArgument, "the schedule has " + std::to_string(s.nRanks) +
                                                  " ranks, the inter-node port was made for " +
                                                  std::to_string(m.nRanks));
    m.schedule = &s;
    m.memory = &mem;
    m.endpoint = &endpoint;
    m.opTag = static_cast<uint32_t>(m.opSeq++ % device::kProxyOpTags);
    m.active = true;
  }
  try {
    m.bootstrap.barrier();  // every process knows its run before any lane pushes
  } catch (const Error& e) {
    std::lock_guard<std::mutex> lock(m.mu);
    m.active = false;
    // A peer that died shows up on the transport with a clearer message than the bootstrap's.
    if (m.peerError) throw *m.peerError;
    throw;
  }
}

void ExecProxyPort::proxyPut(uint32_t rank, uint32_t lane, uint32_t step) {
  Impl& m = *impl_;
  if (rank >= m.fifos.size() || !m.fifos[rank])
    throw Error(ErrorCode::InvalidArgument,
                "proxyput of rank " + std::to_string(rank) + ", which this process does not run");
  if (lane >= device::kProxyMaxLanes)
    throw Error(ErrorCode::Unsupported, "proxyput from lane " + std::to_string(lane) +
                                            ": a command names lanes below " + std::to_string(device::kProxyMaxLanes));
  const Step& st = m.schedule->lanes[rank][lane].steps[step];
  const device::ProxyKind kind = runtimeCount(*m.schedule, st, rank, m.endpoint->extents()) == 0
                                     ? device::ProxyKind::Signal
                                 : (st.flags & kStepSignal) ? device::ProxyKind::PutSignal
                                                            : device::ProxyKind::Put;
  const device::ProxyCommand command{device::packProxyHeader(kind, m.opTag, lane, step), 0};
  const PushSite site{rank, lane, step};
  RemoteEndpoint& endpoint = *m.endpoint;
  const auto cancelled = [&endpoint] { return endpoint.aborting(); };
  HostFifo& fifo = *m.fifos[rank];
  const std::optional<uint64_t> position = fifo.push(command, site, m.opt.budget, cancelled);
  if (!position) return;
  try {
    fifo.waitDone(*position, site, m.opt.budget, cancelled);
  } catch (const Error& e) {
    if (e.code() != ErrorCode::Timeout) throw;
    // A proxy thread that does not answer is most often blocked in a transport call with a budget of its own (a
    // send to a process that stopped reading), and the failure it reports names that process. Give it one more
    // budget to do so (the wait then ends as cancelled) before reporting the stall of the FIFO itself.
    try {
      fifo.waitDone(*position, site, m.opt.budget, cancelled);
    } catch (const Error&) {
      throw e;
    }
  }
}

void ExecProxyPort::end(std::exception_ptr error) noexcept {
  Impl& m = *impl_;
  std::optional<Error> failure;
  bool fromPeer = false;
  {
    std::lock_guard<std::mutex> lock(m.mu);
    m.active = false;
    if (error) {
      failure = asError(error);
      fromPeer = m.peerError.has_value();
      m.spent = failure;
    }
  }
  if (!failure) return;
  // Tell the others (unless the failure came through the transport, which told them already), then make sure no
  // proxy or receiver thread touches this run's memory after execute() returns.
  if (!fromPeer) m.proxy->abort(*failure);
  m.proxy->stop();
  m.transport->close();
}

}  // namespace mk::proxy
