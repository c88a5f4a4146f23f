// mkernel — how this process was launched (mk/bootstrap.hpp): the launch variables, read here and nowhere else.
// CUDA-free (mk::host); the choice of rendezvous and GPU for a process started as one rank is in rank_launch.cpp.
#include <cerrno>
#include <cstdlib>
#include <initializer_list>
#include <memory>
#include <string>

#include "mk/bootstrap.hpp"
#include "mk/error.hpp"

namespace mk {
namespace {

const char* envOrNull(const char* name) {
  const char* v = std::getenv(name);
  return (v && *v) ? v : nullptr;
}

/// Parse a whole decimal integer in [lo, hi] or throw naming the variable.
long parseIntVar(const char* name, const char* value, long lo, long hi, const char* what) {
  errno = 0;
  char* end = nullptr;
  const long v = std::strtol(value, &end, 10);
  if (errno != 0 || end == value || *end != '\0' || v < lo || v > hi)
    throw Error(ErrorCode::InvalidArgument, std::string("environment variable ") + name + "='" + value + "' is not " +
                                                what + " (expected an integer in " + std::to_string(lo) + ".." +
                                                std::to_string(hi) + ")");
  return v;
}

/// The first of `names` that is set (its name through *which), else null.
const char* firstVar(std::initializer_list<const char*> names, const char** which) {
  for (const char* n : names)
    if (const char* v = envOrNull(n)) {
      *which = n;
      return v;
    }
  *which = *names.begin();
  return nullptr;
}

}  // namespace

bool launchedAsRanks() {
  return envOrNull("RANK") || envOrNull("WORLD_SIZE") || envOrNull("OMPI_COMM_WORLD_RANK") || envOrNull("PMI_RANK");
}

int launchLocalRank() {
  const char* which = nullptr;
  if (const char* local = firstVar({"LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID"}, &which))
    return static_cast<int>(parseIntVar(which, local, 0, 1 << 16, "a local rank"));
  if (const char* rank = firstVar({"RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK"}, &which))
    return static_cast<int>(parseIntVar(which, rank, 0, 1 << 20, "a rank"));
  return 0;
}

LaunchEnvironment readLaunchEnvironment() {
  LaunchEnvironment env;
  const char* which = nullptr;
  const char* size = firstVar({"WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE"}, &which);
  if (!size)
    throw Error(ErrorCode::InvalidArgument,
                "environment variable WORLD_SIZE is not set (launch with torchrun, or set RANK WORLD_SIZE LOCAL_RANK "
                "MASTER_ADDR MASTER_PORT; under mpirun OMPI_COMM_WORLD_SIZE / PMI_SIZE are read too)");
  env.size = static_cast<int>(parseIntVar(which, size, 1, 1 << 20, "a process count"));
  const char* rank = firstVar({"RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK"}, &which);
  if (!rank)
    throw Error(ErrorCode::InvalidArgument, "environment variable RANK is not set (WORLD_SIZE is " +
                                                std::to_string(env.size) + "; each process needs its rank)");
  env.rank = static_cast<int>(parseIntVar(which, rank, 0, env.size - 1, "a rank below WORLD_SIZE"));
  env.localRank = launchLocalRank();  // RANK when no local rank is set (validated above)
  const char* addr = envOrNull("MASTER_ADDR");
  if (!addr)
    throw Error(ErrorCode::InvalidArgument,
                "environment variable MASTER_ADDR is not set (the host rank 0 listens on, e.g. 127.0.0.1)");
  env.masterAddr = addr;
  const char* port = envOrNull("MASTER_PORT");
  if (!port)
    throw Error(ErrorCode::InvalidArgument,
                "environment variable MASTER_PORT is not set (a free TCP port, e.g. 29500)");
  env.masterPort = static_cast<uint16_t>(parseIntVar("MASTER_PORT", port, 1, 65535, "a TCP port"));
  if (envOrNull("TORCHELASTIC_RUN_ID")) {
    // torchrun's agent serves its own store on MASTER_PORT: rendezvous on the next port.
    if (env.masterPort == 65535)
      throw Error(ErrorCode::InvalidArgument,
                  "MASTER_PORT=65535 under torchrun: the rendezvous uses MASTER_PORT + 1 "
                  "(torchrun's own store holds MASTER_PORT); pick a lower --master-port");
    ++env.masterPort;
  }
  env.jobKey = readJobKey();
  if (env.size > 1 && env.jobKey.empty())
    throw Error(ErrorCode::InvalidArgument,
                "neither MK_JOB_KEY nor MK_JOB_KEY_FILE is set: " + missingJobKeyText(env.size));
  return env;
}

// Without MPI the TCP rendezvous is the only bootstrap, whatever launched the process.
bool preferMpiBootstrap() noexcept {
  return mpiBootstrapBuilt() && (envOrNull("OMPI_COMM_WORLD_SIZE") || envOrNull("PMI_SIZE")) &&
         !envOrNull("MASTER_ADDR");
}

}  // namespace mk
