// mkernel — internal: the ibverbs transport's entry point (built with rdma-core: ib_transport.cpp; without it:
// ib_unavailable.cpp, which says so).
#pragma once

#include <memory>

#include "mk/proxy/transport.hpp"

namespace mk {
class Bootstrap;
}

namespace mk::proxy {

/// Connect the ibverbs transport collectively over `bootstrap` (connectTransport() with kind ibverbs, after every
/// process said it has a device).
std::unique_ptr<Transport> connectIbverbsTransport(Bootstrap& bootstrap, const TransportOptions& options);

}  // namespace mk::proxy
