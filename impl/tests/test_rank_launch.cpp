// CPU test of the one CUDA-facing part of the bootstrap (bootstrapFromEnvironment, mk::impl): the launch
// variables are read first, then the GPUs are counted, then the rendezvous runs. Without a GPU it proves the refusal.
#include <doctest/doctest.h>

#include <string>

#include "env_guard.hpp"
#include "mk/bootstrap.hpp"
#include "mk/device_info.hpp"
#include "mk/error.hpp"

namespace {

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }
using mkt::EnvGuard;

}  // namespace

TEST_CASE("bootstrap: bootstrapFromEnvironment reads the variables, then the GPUs, then meets its peers") {
  {
    // A malformed variable is named before any device is asked for.
    EnvGuard g({{"RANK", "0"}, {"WORLD_SIZE", "x"}, {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", "1"}});
    try {
      mk::bootstrapFromEnvironment(1000);
      FAIL("a malformed WORLD_SIZE was accepted");
    } catch (const mk::Error& e) {
      CHECK(e.code() == mk::ErrorCode::InvalidArgument);
      CHECK(contains(e.message(), "WORLD_SIZE='x'"));
    }
  }
  {
    // One rank, not started by mpirun: the TCP rendezvous (alone: no network), LOCAL_RANK picks the GPU. Without
    // a GPU the launch is refused naming the rank, before any rendezvous.
    EnvGuard g(
        {{"RANK", "0"}, {"WORLD_SIZE", "1"}, {"LOCAL_RANK", "0"}, {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", "1"}});
    if (mk::cudaDeviceCountOrZero() == 0) {
      try {
        mk::bootstrapFromEnvironment(1000);
        FAIL("a launch without a GPU was accepted");
      } catch (const mk::Error& e) {
        CHECK(e.code() == mk::ErrorCode::Unsupported);
        CHECK(contains(e.message(), "rank 0: no usable CUDA device"));
      }
    } else {
      const mk::RankLaunch launch = mk::bootstrapFromEnvironment(1000);
      REQUIRE(launch.bootstrap != nullptr);
      CHECK(launch.bootstrap->rank() == 0);
      CHECK(launch.bootstrap->size() == 1);
      CHECK(launch.device == 0);
    }
  }
}
