// The MPI bootstrap (mk/bootstrap.hpp: makeMpiBootstrap). Built with MPI, every TEST_CASE is collective: it
// runs on 3 ranks under mpirun (impl/tests/run_mpi_test.sh, one CTest per case) and every rank checks its
// own view. Built without MPI, the stub must refuse with Error(Unsupported).
#include <doctest/doctest.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "mk/bootstrap.hpp"
#include "mk/error.hpp"

namespace {

/// The code and message of the mk::Error `f` throws; fails the test when it throws nothing.
struct Caught {
  bool thrown = false;
  mk::ErrorCode code = mk::ErrorCode::Internal;
  std::string message;
};

Caught catchError(const std::function<void()>& f) {
  Caught c;
  try {
    f();
  } catch (const mk::Error& e) {
    c.thrown = true;
    c.code = e.code();
    c.message = e.what();
  }
  return c;
}

}  // namespace

#if defined(MK_TEST_MPI)

namespace {

using Clock = std::chrono::steady_clock;

double msSince(Clock::time_point t0) { return std::chrono::duration<double, std::milli>(Clock::now() - t0).count(); }

int envInt(const char* name) {
  const char* v = std::getenv(name);
  REQUIRE_MESSAGE(v != nullptr, name << " is not set: run this test under mpirun (run_mpi_test.sh)");
  return std::atoi(v);
}

/// The byte `rank` contributes at offset `i`: distinct per rank and offset, so a misplaced block shows.
uint8_t pattern(int rank, size_t i) {
  return static_cast<uint8_t>((static_cast<size_t>(rank) * 131u + i * 7u) & 0xffu);
}

void checkGather(mk::Bootstrap& boot, size_t bytes) {
  std::vector<uint8_t> mine(bytes);
  for (size_t i = 0; i < bytes; ++i) mine[i] = pattern(boot.rank(), i);
  const std::vector<uint8_t> all = boot.allGather(mine.data(), bytes);
  REQUIRE(all.size() == bytes * static_cast<size_t>(boot.size()));
  size_t wrong = 0, firstWrong = 0;
  for (int q = 0; q < boot.size(); ++q)
    for (size_t i = 0; i < bytes; ++i)
      if (all[static_cast<size_t>(q) * bytes + i] != pattern(q, i) && wrong++ == 0)
        firstWrong = static_cast<size_t>(q) * bytes + i;
  CHECK_MESSAGE(wrong == 0,
                wrong << " wrong bytes in an allGather of " << bytes << " bytes, the first at " << firstWrong);
}

}  // namespace

TEST_CASE("mpi bootstrap: the build has MPI and rank and size match mpirun") {
  CHECK(mk::mpiBootstrapBuilt());
  CHECK(mk::preferMpiBootstrap());  // started by mpirun, MASTER_ADDR unset (run_mpi_test.sh)
  {
    // MASTER_ADDR (non-empty) keeps the TCP rendezvous; PMI_SIZE alone also marks an MPI launch.
    const std::string worldSize = std::to_string(envInt("OMPI_COMM_WORLD_SIZE"));
    ::setenv("MASTER_ADDR", "127.0.0.1", 1);
    CHECK_FALSE(mk::preferMpiBootstrap());
    ::setenv("MASTER_ADDR", "", 1);
    CHECK(mk::preferMpiBootstrap());
    ::unsetenv("MASTER_ADDR");
    ::unsetenv("OMPI_COMM_WORLD_SIZE");
    CHECK_FALSE(mk::preferMpiBootstrap());
    ::setenv("PMI_SIZE", "3", 1);
    CHECK(mk::preferMpiBootstrap());
    ::unsetenv("PMI_SIZE");
    ::setenv("OMPI_COMM_WORLD_SIZE", worldSize.c_str(), 1);
  }
  int local = -1;
  const auto boot = mk::makeMpiBootstrap(20000, &local);
  CHECK(boot->size() == envInt("OMPI_COMM_WORLD_SIZE"));
  CHECK(boot->size() == 3);
  CHECK(boot->rank() == envInt("OMPI_COMM_WORLD_RANK"));
  CHECK(local == envInt("OMPI_COMM_WORLD_LOCAL_RANK"));  // one node: the node rank is the world rank
  CHECK(local == boot->rank());
  // Bad budgets are refused before any MPI call.
  for (double bad : {0.0, -1.0, std::nan("")}) {
    const Caught c = catchError([&] { mk::makeMpiBootstrap(bad); });
    CHECK(c.thrown);
    CHECK(c.code == mk::ErrorCode::InvalidArgument);
    CHECK(c.message.find("timeoutMs") != std::string::npos);
  }
  // Two bootstraps side by side never mix their collectives (each has its own duplicate of the world).
  const auto second = mk::makeMpiBootstrap(20000);
  checkGather(*second, 5);
  checkGather(*boot, 3);
  boot->barrier();
}

TEST_CASE("mpi bootstrap: allGather returns the bytes of every rank in rank order") {
  const auto boot = mk::makeMpiBootstrap(20000);
  REQUIRE(boot->size() >= 2);
  for (size_t bytes : {size_t{1}, size_t{37}, size_t{4096}, size_t{(1u << 20) + 3}}) checkGather(*boot, bytes);
  // Zero bytes is a valid (empty) exchange that still synchronises the call count.
  CHECK(boot->allGather(nullptr, 0).empty());
  checkGather(*boot, 8);
  // A null pointer with bytes is refused locally, before any rank is waited for (every rank checks it).
  const Caught c = catchError([&] { boot->allGather(nullptr, 4); });
  CHECK(c.thrown);
  CHECK(c.code == mk::ErrorCode::InvalidArgument);
  checkGather(*boot, 2);  // the refusal left the bootstrap usable and in step
}

TEST_CASE("mpi bootstrap: barrier returns only once every rank has arrived") {
  const auto boot = mk::makeMpiBootstrap(20000);
  REQUIRE(boot->size() >= 2);
  boot->barrier();  // line up
  constexpr double kLateMs = 400;
  const auto t0 = Clock::now();
  if (boot->rank() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(static_cast<int>(kLateMs)));
  boot->barrier();
  const double waited = msSince(t0);
  // Every other rank waited for rank 0 (minus the skew of the line-up barrier's exits, far below 100 ms).
  if (boot->rank() != 0)
    CHECK_MESSAGE(waited >= kLateMs - 100, "rank " << boot->rank() << " left after " << waited << " ms");
  CHECK(waited < kLateMs + 5000);
  checkGather(*boot, 16);
}

TEST_CASE("mpi bootstrap: a rank that skips allGather ends in Timeout within the budget") {
  constexpr double kBudgetMs = 500;
  const auto boot = mk::makeMpiBootstrap(kBudgetMs);
  REQUIRE(boot->size() >= 3);
  const int skipper = 2;
  if (boot->rank() != skipper) {
    const uint32_t mine = 7;
    const auto t0 = Clock::now();
    const Caught c = catchError([&] { boot->allGather(&mine, sizeof mine); });
    const double took = msSince(t0);
    CHECK(c.thrown);
    CHECK(c.code == mk::ErrorCode::Timeout);
    CHECK_MESSAGE(
        c.message.find("MPI_Iallgather did not complete within 500 ms: a rank never called it") != std::string::npos,
        c.message);
    CHECK(took >= kBudgetMs - 10);
    CHECK_MESSAGE(took < kBudgetMs + 3000, "the timeout took " << took << " ms");
    // From now on the bootstrap refuses (its collective may still be pending inside MPI).
    const Caught again = catchError([&] { boot->barrier(); });
    CHECK(again.thrown);
    CHECK(again.code == mk::ErrorCode::InvalidArgument);
    CHECK(again.message.find("unusable") != std::string::npos);
  }
  // All ranks meet again on a fresh bootstrap: the skipper stays until the others are done.
  const auto fresh = mk::makeMpiBootstrap(20000);
  checkGather(*fresh, 12);
  fresh->barrier();
}

TEST_CASE("mpi bootstrap: a rank that skips barrier ends in Timeout within the budget") {
  constexpr double kBudgetMs = 300;
  const auto boot = mk::makeMpiBootstrap(kBudgetMs);
  REQUIRE(boot->size() >= 2);
  const int skipper = 1;
  if (boot->rank() != skipper) {
    const auto t0 = Clock::now();
    const Caught c = catchError([&] { boot->barrier(); });
    const double took = msSince(t0);
    CHECK(c.thrown);
    CHECK(c.code == mk::ErrorCode::Timeout);
    CHECK_MESSAGE(
        c.message.find("MPI_Ibarrier did not complete within 300 ms: a rank never called it") != std::string::npos,
        c.message);
    CHECK(took >= kBudgetMs - 10);
    CHECK_MESSAGE(took < kBudgetMs + 3000, "the timeout took " << took << " ms");
  }
  const auto fresh = mk::makeMpiBootstrap(20000);
  fresh->barrier();
}

TEST_CASE("mpi bootstrap: different byte counts are rejected on every rank") {
  const auto boot = mk::makeMpiBootstrap(20000);
  REQUIRE(boot->size() == 3);
  const uint64_t data[2] = {1, 2};
  const size_t bytes = boot->rank() == 1 ? 8 : 16;
  const Caught c = catchError([&] { boot->allGather(data, bytes); });
  CHECK(c.thrown);
  CHECK(c.code == mk::ErrorCode::InvalidArgument);
  CHECK_MESSAGE(c.message.find("the ranks disagree (rank 0: 16 bytes at call #1, rank 1: 8 bytes at call #1, "
                               "rank 2: 16 bytes at call #1)") != std::string::npos,
                c.message);
  const auto fresh = mk::makeMpiBootstrap(20000);
  checkGather(*fresh, 3);
}

#else  // built without MPI

TEST_CASE("mpi bootstrap: a build without MPI refuses with Unsupported") {
  CHECK_FALSE(mk::mpiBootstrapBuilt());
  // Even when started by mpirun, the TCP rendezvous stays the only bootstrap.
  ::setenv("OMPI_COMM_WORLD_SIZE", "2", 1);
  CHECK_FALSE(mk::preferMpiBootstrap());
  ::unsetenv("OMPI_COMM_WORLD_SIZE");
  int local = -1;
  const Caught c = catchError([&] { mk::makeMpiBootstrap(1000, &local); });
  CHECK(c.thrown);
  CHECK(c.code == mk::ErrorCode::Unsupported);
  CHECK_MESSAGE(c.message.find("built without MPI (install libopenmpi-dev and reconfigure") != std::string::npos,
                c.message);
  CHECK(local == -1);  // nothing written on failure
}

#endif
