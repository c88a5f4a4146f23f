// mkernel — the MPI bootstrap in a build without MPI (mk/bootstrap.hpp): it says so, it never pretends.
#include "mk/bootstrap.hpp"
#include "mk/error.hpp"

namespace mk {

bool mpiBootstrapBuilt() noexcept { return false; }

std::unique_ptr<Bootstrap> makeMpiBootstrap(double /*timeoutMs*/, int* /*localRank*/) {
  throw Error(ErrorCode::Unsupported,
              "makeMpiBootstrap: mkernel was built without MPI (install libopenmpi-dev and reconfigure, "
              "MK_WITH_MPI=AUTO or ON); or launch with MASTER_ADDR / MASTER_PORT for the TCP rendezvous");
}

}  // namespace mk
