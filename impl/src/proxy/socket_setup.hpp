// mkernel — internal: how the socket transport's processes find and authenticate each other (docs/inter-node.md,
// "Handshake"). Every process listens, all-gathers its address (and rank 0 the job token) through the bootstrap,
// connects to every process of lower or equal index (itself included) and accepts from the others; one poll loop
// drives every connection's handshake at once, so the order processes get there in does not matter.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "mk/proxy/transport.hpp"

namespace mk {
class Bootstrap;
}

namespace mk::proxy {

/// The connected sockets of one process, indexed by process. For another process sendFd == recvFd (one full-duplex
/// connection); for this process itself they are the two ends of its self-connection.
struct SocketLinks {
  int process = 0;
  int processes = 0;
  std::vector<int> sendFd, recvFd;
  std::vector<std::string> names;  ///< "process 1 (127.0.0.1:40123)"
  std::array<uint64_t, 2> token{};
};

/// Connect every pair of processes (collective over `bootstrap`). Refused connections are logged through `log` and
/// named in a timeout. Throws what connectTransport() documents.
SocketLinks connectSockets(Bootstrap& bootstrap, const TransportOptions& options,
                           const std::function<void(const std::string&)>& log);

/// The address this process listens on when options.address is empty, given every process's host name (index =
/// process): 127.0.0.1 when all are this host's name, else this host name's IPv4 address (refused when it is a
/// loopback address). Throws Error(InvalidArgument) naming the hosts.
std::string defaultListenAddress(const std::vector<std::string>& hostNames, int me);

}  // namespace mk::proxy
