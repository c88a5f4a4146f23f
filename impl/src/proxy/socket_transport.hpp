// mkernel — internal: the socket (TCP) transport (mk/proxy/transport.hpp; docs/inter-node.md, "Socket transport").
#pragma once

#include <memory>

#include "mk/proxy/transport.hpp"

namespace mk {
class Bootstrap;
}

namespace mk::proxy {

/// Connect the socket transport collectively over `bootstrap` (connectTransport() with kind socket).
std::unique_ptr<Transport> connectSocketTransport(Bootstrap& bootstrap, const TransportOptions& options);

}  // namespace mk::proxy
