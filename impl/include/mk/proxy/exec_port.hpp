// mkernel — the CPU reference executor on the inter-node path: its ProxyPut steps become commands in a host
// command FIFO per local rank, a Proxy thread per FIFO sends them through a Transport, and the receiving process's
// port writes the bytes into its executor's memory and raises the flag. Several processes (one per "node") run one
// schedule together, each its own ranks, so the protocol the GPU engine uses is tested without a GPU.
//
//   mk::TcpBootstrap boot(...);                         // one per process
//   mk::proxy::ExecProxyPort port(boot, s.nRanks, myRanks);
//   mk::ExecOptions opt;  opt.localRanks = myRanks;  opt.proxy = &port;
//   mk::execute(s, mem, opt);                           // every process, the same schedules in the same order
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "mk/exec/executor.hpp"
#include "mk/proxy/proxy.hpp"
#include "mk/proxy/transport.hpp"

namespace mk {
class Bootstrap;
}

namespace mk::proxy {

/// Options of an ExecProxyPort.
struct ExecPortOptions {
  TransportOptions transport;    ///< which transport, its budget and address
  ProxyOptions proxy;            ///< batching, pinning
  uint32_t fifoCapacity = 1024;  ///< commands per rank's FIFO (a power of two)
  /// Budget of a lane's push into a full FIFO and of its wait for the proxy to handle the command.
  std::chrono::milliseconds budget{10000};
  /// Send through staging buffers and copies, as a GPU engine must (HostCopier(false)), instead of straight from
  /// and into the executor's memory.
  bool stagedCopies = false;
  /// Control messages from other processes (none of the executor's own; for tools and tests). Empty: ignored.
  std::function<void(const ControlMessage&)> onControl;
};

/// A ProxyPort over a real transport. Construction is collective over the bootstrap (every process, same order);
/// so is each execute() that uses it (begin() meets the other processes). After a failed run the port is spent:
/// later runs throw that failure.
class ExecProxyPort final : public ProxyPort {
 public:
  /// Connect the transport, exchange which process runs which of the `nRanks` ranks (this one: `localRanks`), start
  /// the proxy. Throws what connectTransport() and exchangePlacement() throw.
  ExecProxyPort(Bootstrap& bootstrap, uint32_t nRanks, std::vector<uint32_t> localRanks, ExecPortOptions options = {});
  /// Stop the proxy, close the transport (goodbyes). Never throws.
  ~ExecProxyPort() override;
  ExecProxyPort(const ExecProxyPort&) = delete;
  ExecProxyPort& operator=(const ExecProxyPort&) = delete;

  void begin(const Schedule& s, HostMemory& mem, RemoteEndpoint& endpoint) override;
  void proxyPut(uint32_t rank, uint32_t lane, uint32_t step) override;
  void end(std::exception_ptr error) noexcept override;

  /// The transport (to send control messages, name processes).
  Transport& transport() noexcept;
  /// The proxy (its counters).
  Proxy& proxy() noexcept;
  /// The ranks this process runs.
  const std::vector<uint32_t>& localRanks() const noexcept;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace mk::proxy
