// mk-proxy-bench — the host half of the inter-node path, measured without a GPU (docs/inter-node.md,
// "Measurements"):
//   drain  how many commands per second one proxy thread takes from a host-pushed FIFO: Flush commands (the FIFO
//          and the consumer loop alone), and Signal commands that become frames to a second process over loopback
//          TCP (timed until that process has seen them all);
//   put    socket-transport puts of 8 B .. 256 MiB between two processes over loopback, next to a plain TCP probe
//          between the same two processes with the same sizes, in the same run.
// Records follow the measurement-file contract (mk/io/measurement.hpp): op "proxy-drain" / "put-network", impl
// "mkernel" / "tcp-loopback", with "transport" and "nodes".
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <mutex>
#include <new>
#include <thread>

#include "mk/bootstrap.hpp"
#include "mk/error.hpp"
#include "mk/io/measurement.hpp"
#include "mk/proxy/proxy.hpp"
#include "mk/schedule/io.hpp"
#include "mk/util/build_commit.hpp"
#include "mk/util/cli.hpp"
#include "mk/util/size.hpp"
#include "mk/util/stats.hpp"
#include "net/socket_util.hpp"
#include "proxy_bench_pair.hpp"
#include "proxy_bench_sink.hpp"

namespace {

using Clock = std::chrono::steady_clock;
using mk::bench::CountingSink;
using mk::proxy::PutRequest;

double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

using mk::median;

struct Config {
  uint64_t commands = 2000000;
  uint32_t batch = 32;
  uint32_t fifo = 1024;
  int reps = 5;
  uint64_t minBytes = 8;
  uint64_t maxBytes = uint64_t{256} << 20;
  uint32_t chunk = 1u << 20;
  uint32_t step = 2;
  std::string copies = "both";
  bool checksum = false;
  double budgetMs = 30000;
};

/// Every command names a signal to rank 1 (the second process): the cheapest real resolution (a table lookup).
class SignalResolver final : public mk::proxy::ProxyResolver {
 public:
  PutRequest resolve(uint32_t rank, const mk::device::ProxyCommand& command, uint64_t) override {
    PutRequest req;
    req.info.srcRank = rank;
    req.info.dstRank = 1;
    req.info.lane = mk::device::proxyLane(command.header);
    req.info.step = mk::device::proxyStep(command.header);
    req.info.signal = true;
    req.info.flagId = req.info.step & 63;
    req.info.flagValue = 1;
    return req;
  }
};

mk::proxy::TransportOptions transportOptions(const Config& c, bool quietLog = false) {
  mk::proxy::TransportOptions o;
  o.kind = mk::proxy::TransportKind::Socket;
  o.address = "127.0.0.1";
  o.budget = std::chrono::milliseconds(static_cast<long>(c.budgetMs));
  o.chunkBytes = c.chunk;
  o.payloadChecksum = c.checksum;
  if (quietLog) o.log = [](const std::string&) {};
  return o;
}

mk::MeasurementRecord record(const std::string& op, const std::string& impl, uint64_t bytes, double timeUs,
                             uint64_t iters) {
  mk::MeasurementRecord m;
  m.op = op;
  m.impl = impl;
  m.dtype = "uint8";
  m.ranks = 2;
  m.bytes = bytes;
  m.timeUs = timeUs;
  m.algbwGBs = bytes > 0 ? static_cast<double>(bytes) / (timeUs * 1e3) : 0;
  m.iters = iters;
  m.stat = "median";
  return m;
}

// ---- drain ---------------------------------------------------------------------------------------------------

/// Push `n` commands of `kind` into `fifo` as fast as the ring allows; return seconds until the proxy handled them.
double pushAll(mk::proxy::HostFifo& fifo, mk::device::ProxyKind kind, uint64_t n, double budgetMs) {
  const auto budget = std::chrono::milliseconds(static_cast<long>(budgetMs));
  const auto t0 = Clock::now();
  uint64_t last = 0;
  for (uint64_t i = 0; i < n; ++i)
    last = *fifo.push(mk::device::ProxyCommand{mk::device::packProxyHeader(kind, 0, 0, static_cast<uint32_t>(i)), 0},
                      {0, 0, static_cast<uint32_t>(i)}, budget);
  fifo.waitDone(last, {0, 0, 0}, budget);
  return since(t0);
}

mk::proxy::ProxyOptions drainProxyOptions(const Config& c) {
  mk::proxy::ProxyOptions po;
  po.maxBatch = c.batch;
  po.idleSpin = std::chrono::seconds(1);  // measure the loop, not its wake-ups
  return po;
}

/// Flush commands: the FIFO and the consumer loop, no transport work (a one-process job's transport). Two ways:
/// "concurrent" (a host thread pushes while the proxy drains: the rate of the pair, which includes their cache-line
/// traffic and, on a busy host, their competition for cores) and "prefilled" (the FIFO holds every command before
/// the proxy starts: the rate of the proxy thread alone).
std::vector<mk::MeasurementRecord> drainFlush(const Config& c, uint16_t port) {
  mk::TcpBootstrapOptions bo;
  bo.port = port;
  mk::TcpBootstrap boot(bo);
  mk::proxy::HostCopier copier;
  CountingSink sink(1);
  SignalResolver resolver;
  const auto budget = std::chrono::milliseconds(static_cast<long>(c.budgetMs));
  std::vector<mk::MeasurementRecord> out;
  for (const char* mode : {"concurrent", "prefilled"}) {
    const bool prefilled = std::string(mode) == "prefilled";
    uint32_t capacity = c.fifo;
    if (prefilled)
      while (capacity < c.commands && capacity < (1u << 24)) capacity *= 2;
    const uint64_t n = prefilled ? std::min<uint64_t>(c.commands, capacity) : c.commands;
    std::vector<double> rates;
    for (int rep = 0; rep < c.reps; ++rep) {
      auto transport = mk::proxy::connectTransport(boot, transportOptions(c));
      mk::proxy::HostFifo fifo(capacity);
      mk::proxy::Proxy proxy(*transport, resolver, sink, copier, drainProxyOptions(c));
      proxy.setPlacement({0});
      proxy.addFifo(0, fifo.consumer());
      double seconds = 0;
      if (prefilled) {
        for (uint64_t i = 0; i < n; ++i)
          fifo.push(mk::device::ProxyCommand{mk::device::packProxyHeader(mk::device::ProxyKind::Flush, 0, 0, 0), 0},
                    {0, 0, 0}, budget);
        const auto t0 = Clock::now();
        proxy.start();
        fifo.waitDone(n - 1, {0, 0, 0}, budget);
        seconds = since(t0);
      } else {
        proxy.start();
        seconds = pushAll(fifo, mk::device::ProxyKind::Flush, n, c.budgetMs);
      }
      rates.push_back(static_cast<double>(n) / seconds);
      proxy.stop();
      transport->close();
    }
    const double rate = median(rates);
    std::printf(
        "proxy-drain  flush commands, %-10s, no transport %8.2f M commands/s per proxy thread (median of "
        "%d)\n",
        mode, rate / 1e6, c.reps);
    mk::MeasurementRecord m = record("proxy-drain", "mkernel", 16, 1e6 / rate, n);
    m.ranks = 1;
    m.algbwGBs = 16 * rate / 1e9;
    m.extra["transport"] = "\"none\"";
    m.extra["nodes"] = "1";
    m.extra["command"] = "\"flush\"";
    m.extra["pushes"] = std::string("\"") + mode + "\"";
    m.extra["commands_per_s"] = std::to_string(rate);
    m.extra["batch"] = std::to_string(c.batch);
    out.push_back(m);
  }
  return out;
}

/// Signal commands: each becomes a frame to the second process, timed until it has seen them all; concurrent and
/// prefilled as drainFlush.
int drainSignalPeer(const Config& c, int me, uint16_t port, std::vector<mk::MeasurementRecord>* out) {
  mk::TcpBootstrap boot(mk::bench::bootOptions(me, port));
  mk::proxy::HostCopier copier;
  CountingSink sink(1);
  SignalResolver resolver;
  const auto budget = std::chrono::milliseconds(static_cast<long>(c.budgetMs));
  for (const char* mode : {"concurrent", "prefilled"}) {
    const bool prefilled = std::string(mode) == "prefilled";
    uint32_t capacity = c.fifo;
    if (prefilled)
      while (capacity < c.commands && capacity < (1u << 24)) capacity *= 2;
    const uint64_t n = prefilled ? std::min<uint64_t>(c.commands, capacity) : c.commands;
    std::vector<double> rates;
    for (int rep = 0; rep < c.reps; ++rep) {
      auto transport = mk::proxy::connectTransport(boot, transportOptions(c));
      mk::proxy::HostFifo fifo(capacity);
      mk::proxy::Proxy proxy(*transport, resolver, sink, copier, drainProxyOptions(c));
      proxy.setPlacement({0, 1});
      if (me == 0) proxy.addFifo(0, fifo.consumer());
      if (me == 0 && prefilled)
        for (uint64_t i = 0; i < n; ++i)
          fifo.push(
              mk::device::ProxyCommand{
                  mk::device::packProxyHeader(mk::device::ProxyKind::Signal, 0, 0, static_cast<uint32_t>(i)), 0},
              {0, 0, 0}, budget);
      boot.barrier();
      const auto t0 = Clock::now();
      proxy.start();
      if (me == 1) {
        sink.waitLanded(n);
        mk::proxy::ControlMessage ack;
        ack.dstRank = 0;
        ack.value = static_cast<uint64_t>(rep);
        proxy.sendControl(ack);
      } else {
        if (!prefilled) pushAll(fifo, mk::device::ProxyKind::Signal, n, c.budgetMs);
        sink.waitAck();
        rates.push_back(static_cast<double>(n) / since(t0));
      }
      boot.barrier();
      proxy.stop();
      transport->close();
    }
    if (me != 0) continue;
    const double rate = median(rates);
    std::printf(
        "proxy-drain  signal commands, %-10s, socket to a peer %8.2f M commands/s per proxy thread (median "
        "of %d)\n",
        mode, rate / 1e6, c.reps);
    mk::MeasurementRecord m = record("proxy-drain", "mkernel", 16, 1e6 / rate, n);
    m.algbwGBs = 16 * rate / 1e9;
    m.extra["transport"] = "\"socket\"";
    m.extra["nodes"] = "2";
    m.extra["command"] = "\"signal\"";
    m.extra["pushes"] = std::string("\"") + mode + "\"";
    m.extra["commands_per_s"] = std::to_string(rate);
    m.extra["batch"] = std::to_string(c.batch);
    out->push_back(m);
  }
  return 0;
}

// ---- put bandwidth -------------------------------------------------------------------------------------------

std::vector<uint64_t> putSizes(const Config& c) {
  std::vector<uint64_t> sizes;
  // s x step is formed only when it stays <= maxBytes: near 2^64 (--max-bytes 16777215T) it wrapped to a small size
  // and the loop never ended.
  for (uint64_t s = c.minBytes;; s *= c.step) {
    sizes.push_back(s);
    if (s > c.maxBytes / c.step) break;
  }
  if (sizes.back() != c.maxBytes) sizes.push_back(c.maxBytes);
  return sizes;
}

/// What --put allocates in its two processes: the source buffer of each (process 0's also feeds the TCP probe),
/// process 1's landing buffer, and the staging chunks of the socket transport (two a side, per copy mode).
mk::MemoryNeed putMemory(const Config& c) {
  const uint64_t modes = c.copies == "both" ? 2 : 1;
  const uint64_t maxBytes = c.maxBytes, chunk = c.chunk;
  mk::MemoryNeed need;
  need.parts.emplace_back("put buffers", maxBytes > UINT64_MAX / 3 ? UINT64_MAX : 3 * maxBytes);
  need.parts.emplace_back("staging", 4 * modes * chunk);
  return need;
}

/// Puts per timed batch: enough bytes (and enough puts) that the acknowledgement's round trip is noise.
uint64_t itersFor(uint64_t bytes) { return std::clamp<uint64_t>((uint64_t{256} << 20) / bytes, 3, 20000); }

/// The plain TCP probe: a connection of its own between the same two processes, `iters` sends of `bytes`, then a
/// one-byte acknowledgement.
double tcpBatch(int fd, int me, uint64_t bytes, uint64_t iters, std::vector<std::byte>& buf) {
  const auto deadline = mk::net::deadlineAfter(120000);
  const auto t0 = Clock::now();
  char ack = 1;
  if (me == 0) {
    for (uint64_t i = 0; i < iters; ++i) mk::net::sendAll(fd, buf.data(), bytes, deadline, "tcp probe", "process 1");
    mk::net::recvAll(fd, &ack, 1, deadline, "tcp probe", "process 1");
  } else {
    for (uint64_t i = 0; i < iters; ++i) mk::net::recvAll(fd, buf.data(), bytes, deadline, "tcp probe", "process 0");
    mk::net::sendAll(fd, &ack, 1, deadline, "tcp probe", "process 0");
  }
  return since(t0);
}

int putPeer(const Config& c, int me, uint16_t port, std::vector<mk::MeasurementRecord>* out) {
  mk::TcpBootstrap boot(mk::bench::bootOptions(me, port));
  const std::vector<uint64_t> sizes = putSizes(c);
  const int probe = mk::bench::connectProbe(boot);
  std::vector<std::string> copyModes;
  if (c.copies == "both" || c.copies == "direct") copyModes.push_back("direct");
  if (c.copies == "both" || c.copies == "staged") copyModes.push_back("staged");
  std::vector<std::byte> src(c.maxBytes, std::byte{0x5a});
  CountingSink sink(me == 1 ? c.maxBytes : 1);
  std::vector<std::pair<std::string, std::unique_ptr<mk::proxy::Transport>>> transports;
  std::vector<std::unique_ptr<mk::proxy::HostCopier>> copiers;
  for (const std::string& mode : copyModes) {
    copiers.push_back(std::make_unique<mk::proxy::HostCopier>(mode == "direct"));
    transports.emplace_back(mode, mk::proxy::connectTransport(boot, transportOptions(c)));
    transports.back().second->start(sink, *copiers.back());
  }
  for (uint64_t bytes : sizes) {
    const uint64_t iters = itersFor(bytes);
    std::vector<double> tcp;
    std::vector<std::vector<double>> ours(transports.size());
    for (int rep = 0; rep < c.reps; ++rep) {
      // Interleaved: the probe and each path take turns, so a change of machine load hits them alike.
      boot.barrier();
      tcp.push_back(tcpBatch(probe, me, bytes, iters, src));
      for (std::size_t t = 0; t < transports.size(); ++t) {
        mk::proxy::Transport& tr = *transports[t].second;
        boot.barrier();
        if (me == 1) {
          sink.waitLanded(iters);
          mk::proxy::ControlMessage ack;
          ack.value = static_cast<uint64_t>(rep);
          tr.sendControl(0, ack);
          continue;
        }
        auto sender = tr.openSender(*copiers[t]);
        const auto t0 = Clock::now();
        for (uint64_t i = 0; i < iters; ++i) {
          PutRequest req;
          req.info.dstRank = 1;
          req.info.bytes = bytes;
          req.info.signal = true;
          req.info.flagValue = 1;
          req.src = src.data();
          sender->put(1, req);
        }
        sender->flush();
        sink.waitAck();
        ours[t].push_back(since(t0));
      }
    }
    if (me != 0) continue;
    const double tcpUs = median(tcp) * 1e6 / static_cast<double>(iters);
    mk::MeasurementRecord base = record("put-network", "tcp-loopback", bytes, tcpUs, iters);
    base.extra["transport"] = "\"tcp\"";
    base.extra["nodes"] = "2";
    out->push_back(base);
    std::printf("put-network %10s  tcp-loopback %9.2f us %8.3f GB/s", mk::formatSize(bytes).c_str(), tcpUs,
                base.algbwGBs);
    for (std::size_t t = 0; t < transports.size(); ++t) {
      const double us = median(ours[t]) * 1e6 / static_cast<double>(iters);
      mk::MeasurementRecord m = record("put-network", "mkernel", bytes, us, iters);
      m.extra["transport"] = "\"socket\"";
      m.extra["nodes"] = "2";
      m.extra["copies"] = "\"" + transports[t].first + "\"";
      m.extra["checksum"] = c.checksum ? "true" : "false";
      m.extra["vs_tcp"] = std::to_string(tcpUs / us);
      out->push_back(m);
      std::printf("  | socket %s %9.2f us %8.3f GB/s (%.0f %% of tcp)", transports[t].first.c_str(), us, m.algbwGBs,
                  100 * tcpUs / us);
    }
    std::printf("\n");
    std::fflush(stdout);
  }
  boot.barrier();
  for (auto& t : transports) t.second->close();
  ::close(probe);
  return 0;
}

uint64_t sizeOption(const std::string& text, const char* option) {
  try {
    return mk::parseSize(text);
  } catch (const mk::Error& e) {
    throw mk::Error(e.code(), std::string(option) + ": " + e.message());
  }
}

mk::MeasurementFile newFile(const std::string& command) {
  mk::MeasurementFile f;
  f.schema = "mkernel.measurement.v1";
  f.system["gpu"] = "\"none\"";
  f.system["gpus"] = "0";
  f.system["cpu"] = "\"" + mk::bench::cpuModel() + "\"";
  f.system["cores"] = std::to_string(std::thread::hardware_concurrency());
  f.system["network"] = "\"loopback TCP (two processes of one host)\"";
  // The host's load when the run started: spinning proxy threads compete with it for cores.
  std::ifstream load("/proc/loadavg");
  double load1 = 0;
  if (load >> load1) f.system["load_average_1m"] = std::to_string(load1);
  char date[32];
  const std::time_t now = std::time(nullptr);
  std::strftime(date, sizeof date, "%Y-%m-%d", std::gmtime(&now));
  f.date = date;
  f.commit = mk::buildCommit();
  f.command = command;
  return f;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "mk-proxy-bench: the inter-node path's host half without a GPU: proxy drain rate and socket put "
      "bandwidth next to plain TCP, between two processes of this host over loopback",
      "mk-proxy-bench"};
  Config c;
  std::string json;
  bool drain = false, put = false;
  app.add_flag("--drain", drain, "measure the proxy's drain rate (commands/s per proxy thread)");
  app.add_flag("--put", put, "measure socket put bandwidth next to a plain TCP probe (default: both)");
  app.add_option("--json", json, "write the records to this measurement file (mkernel.measurement.v1)");
  app.add_option("--commands", c.commands, "commands per drain measurement")->check(CLI::Range(1000ull, 1ull << 32));
  app.add_option("--batch", c.batch, "most commands the proxy takes at once")->check(CLI::Range(1u, 4096u));
  app.add_option("--fifo", c.fifo, "FIFO slots (a power of two)")->check(CLI::Range(2u, 1u << 24));
  app.add_option("--reps", c.reps, "repetitions; the median is reported")->check(CLI::Range(1, 1000));
  std::string minB = "8", maxB = "256M";
  app.add_option("--min-bytes", minB, "smallest put (suffixes K, M, G)");
  app.add_option("--max-bytes", maxB, "largest put");
  app.add_option("--step", c.step, "sizes grow by this factor from --min-bytes (the largest is always measured)")
      ->check(CLI::Range(2u, 1024u));
  app.add_option("--chunk", c.chunk, "staging chunk in bytes")->check(CLI::Range(4096u, 1u << 30));
  app.add_option("--copies", c.copies,
                 "put path: direct (from and into host memory), staged (through staging "
                 "copies, as a GPU engine), or both")
      ->check(CLI::IsMember({"direct", "staged", "both"}));
  app.add_flag("--checksum", c.checksum, "add a CRC32C of every payload");
  mk::cli::GuardArgs guard;
  mk::cli::addMaxMemoryOption(app, guard,
                              "refuse (exit 2) a --put whose buffers (3 x --max-bytes over the two processes, and the "
                              "staging chunks) are above SIZE");
  // Bad input exits 2 with one line, as in every tool (CLI11_PARSE exited 105 for a value out of range, and a
  // bad size exited 1 like a failed run); a failure of the benchmark itself stays 1 (below).
  if (int rc = mk::cli::parse(app, argc, argv, "mk-proxy-bench"); rc != mk::cli::kContinue) return rc;
  if (int rc = mk::cli::run("mk-proxy-bench",
                            [&] {
                              c.minBytes = sizeOption(minB, "--min-bytes");
                              c.maxBytes = sizeOption(maxB, "--max-bytes");
                              if (c.minBytes == 0 || c.maxBytes < c.minBytes)
                                throw mk::Error(mk::ErrorCode::InvalidArgument,
                                                "--min-bytes must be >= 1 and <= --max-bytes");
                              mk::checkOutputPath("--json", json);  // before minutes of measuring, not after
                              if (put || !drain) {
                                mk::requireWithin(putMemory(c), guard.maxMemory());
                                (void)putSizes(c);
                              }
                              return mk::cli::kContinue;
                            });
      rc != mk::cli::kContinue)
    return rc;
  try {
    if (!drain && !put) drain = put = true;
    std::string command = "mk-proxy-bench";
    for (int i = 1; i < argc; ++i) command += std::string(" ") + argv[i];
    mk::MeasurementFile file = newFile(command);
    std::printf("# mk-proxy-bench: %s, %u cores; two processes of this host over loopback TCP\n",
                mk::bench::cpuModel().c_str(), std::thread::hardware_concurrency());
    if (drain) {
      for (auto& m : drainFlush(c, mk::bench::freePort())) file.records.push_back(m);
      mk::bench::runPair([&](int me, uint16_t port, auto* out) { return drainSignalPeer(c, me, port, out); },
                         &file.records);
    }
    if (put)
      mk::bench::runPair([&](int me, uint16_t port, auto* out) { return putPeer(c, me, port, out); }, &file.records);
    if (!json.empty()) {
      mk::saveMeasurementFile(file, json);
      std::printf("# %zu records written to %s\n", file.records.size(), json.c_str());
    }
  } catch (const mk::Error& e) {
    std::fprintf(stderr, "mk-proxy-bench: error: %s\n", mk::cli::oneLine(e.what()).c_str());
    return mk::cli::kExitFailed;
  } catch (const std::bad_alloc&) {
    // Above what the estimate saw (another process took the memory): one line and exit 5, as in every tool.
    std::fprintf(stderr,
                 "mk-proxy-bench: error: out of memory: an allocation failed; lower --max-bytes or free memory\n");
    return mk::cli::kExitOutOfMemory;
  }
  return 0;
}
