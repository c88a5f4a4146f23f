// mkernel — the ibverbs transport in a build without rdma-core: it says so, it never pretends.
#include "mk/error.hpp"
#include "proxy/ib_transport.hpp"

namespace mk::proxy {

namespace {
const char* kNotBuilt =
    "this build has no ibverbs transport (libibverbs-dev was not found when mkernel was configured, or "
    "MK_WITH_IBVERBS=OFF)";
}

bool ibverbsBuilt() noexcept { return false; }

int rdmaDeviceCount(std::string* why) noexcept {
  if (why) *why = kNotBuilt;
  return 0;
}

std::unique_ptr<Transport> connectIbverbsTransport(Bootstrap& /*bootstrap*/, const TransportOptions& /*options*/) {
  throw Error(ErrorCode::Unsupported, std::string("transport ibverbs: ") + kNotBuilt + "; use transport socket");
}

}  // namespace mk::proxy
