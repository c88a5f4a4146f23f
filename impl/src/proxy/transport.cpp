// mkernel — the transport choice (mk/proxy/transport.hpp: connectTransport and the kind names).
#include <cstring>

#include "mk/bootstrap.hpp"
#include "mk/proxy/transport.hpp"
#include "proxy/ib_transport.hpp"
#include "proxy/socket_transport.hpp"

namespace mk::proxy {

const char* toString(TransportKind kind) noexcept {
  switch (kind) {
    case TransportKind::Auto: return "auto";
    case TransportKind::Socket: return "socket";
    case TransportKind::Ibverbs: return "ibverbs";
  }
  return "unknown";
}

std::optional<TransportKind> parseTransportKind(std::string_view s) noexcept {
  for (TransportKind k : {TransportKind::Auto, TransportKind::Socket, TransportKind::Ibverbs})
    if (s == toString(k)) return k;
  return std::nullopt;
}

TransportKind requireTransportKind(std::string_view s, std::string_view what) {
  if (const auto k = parseTransportKind(s)) return *k;
  throw Error(ErrorCode::InvalidArgument,
              "unknown " + std::string(what) + " '" + std::string(s) + "' (expected auto, socket or ibverbs)");
}

std::unique_ptr<Transport> connectTransport(Bootstrap& bootstrap, const TransportOptions& options) {
  // Decided together: every process says what it asked for and whether it could run ibverbs, so that all of them
  // pick the same transport (or all refuse with the same reason) instead of some waiting for connections that
  // never come.
  std::string why;
  const bool canIb = rdmaDeviceCount(&why) > 0;
  const uint8_t mine[2] = {static_cast<uint8_t>(options.kind), static_cast<uint8_t>(canIb)};
  const std::vector<uint8_t> all = bootstrap.allGather(mine, sizeof mine);
  const int n = bootstrap.size();
  std::string without;
  bool everyIb = true;
  for (int p = 0; p < n; ++p) {
    const auto asked = static_cast<TransportKind>(all[static_cast<std::size_t>(2 * p)]);
    if (asked != options.kind)
      throw Error(ErrorCode::InvalidArgument, "transport: process " + std::to_string(p) + " asked for transport " +
                                                  toString(asked) + ", process " + std::to_string(bootstrap.rank()) +
                                                  " for " + toString(options.kind) +
                                                  " (every process of a job must ask for the same one)");
    if (!all[static_cast<std::size_t>(2 * p + 1)]) {
      everyIb = false;
      without += (without.empty() ? "" : ", ") + std::to_string(p);
    }
  }
  TransportKind kind = options.kind;
  if (kind == TransportKind::Auto) kind = everyIb ? TransportKind::Ibverbs : TransportKind::Socket;
  if (kind == TransportKind::Ibverbs) {
    if (!ibverbsBuilt())
      throw Error(ErrorCode::Unsupported,
                  "transport ibverbs: this build has no ibverbs transport (libibverbs-dev was not found when mkernel "
                  "was configured); use transport socket");
    if (!everyIb)
      throw Error(ErrorCode::Unsupported, "transport ibverbs: no RDMA device found on process(es) " + without +
                                              (canIb ? std::string() : " (here: " + why + ")") +
                                              "; use transport socket");
    return connectIbverbsTransport(bootstrap, options);
  }
  return connectSocketTransport(bootstrap, options);
}

}  // namespace mk::proxy
