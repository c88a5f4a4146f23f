// CPU tests of the multi-process bootstrap: TCP rendezvous among forked processes on 127.0.0.1, bounded
// failures that name the rank or address at fault, and the launch variables.
#include <doctest/doctest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "env_guard.hpp"
#include "mk/bootstrap.hpp"
#include "mk/error.hpp"
#include "multiprocess_launch.hpp"

namespace {

using mkt::EnvGuard;

std::string envError() {
  try {
    mk::readLaunchEnvironment();
  } catch (const mk::Error& e) {
    CHECK(e.code() == mk::ErrorCode::InvalidArgument);
    return e.message();
  }
  return "no error";
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

constexpr const char* kKeyHex = "00112233445566778899aabbccddeeff0123456789abcdef";

/// The message of the mk::Error `f` throws ("no error" when it throws none).
template <class F>
std::string errorOf(F f) {
  try {
    f();
  } catch (const mk::Error& e) {
    return e.message();
  }
  return "no error";
}

}  // namespace

TEST_CASE("bootstrap: all-gather and barrier among four forked processes") {
  const uint16_t port = mkt::freePort();
  const int n = 4;
  const auto codes = mkt::forkRanks(
      n,
      [&](int r) {
        mk::TcpBootstrap boot(mkt::bootOptions(r, n, port, 10000));
        if (boot.rank() != r || boot.size() != n) return 2;
        for (int round = 0; round < 3; ++round) {
          // Contributions differ per rank and round, and their size varies per round.
          std::vector<uint8_t> mine(static_cast<size_t>(1 + round * 1000));
          for (size_t i = 0; i < mine.size(); ++i) mine[i] = static_cast<uint8_t>(r * 31 + round * 7 + i);
          const auto all = boot.allGather(mine.data(), mine.size());
          if (all.size() != mine.size() * n) return 3;
          for (int q = 0; q < n; ++q)
            for (size_t i = 0; i < mine.size(); ++i)
              if (all[q * mine.size() + i] != static_cast<uint8_t>(q * 31 + round * 7 + i)) return 4;
          boot.barrier();
        }
        return 0;
      },
      30);
  for (int r = 0; r < n; ++r) {
    CAPTURE(r);
    CHECK(codes[static_cast<size_t>(r)] == 0);
  }
}

TEST_CASE("bootstrap: a rank that never arrives times out naming it") {
  const uint16_t port = mkt::freePort();
  // WORLD_SIZE 3 but rank 2 is never started: rank 0 must fail within its budget naming rank 2; rank 1
  // (connected) then sees rank 0 go away instead of hanging.
  const auto codes = mkt::forkRanks(
      2,
      [&](int r) {
        const auto t0 = std::chrono::steady_clock::now();
        try {
          mk::TcpBootstrap boot(mkt::bootOptions(r, 3, port, 400));
          boot.barrier();
          return 10;  // must not succeed
        } catch (const mk::Error& e) {
          const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
          std::fprintf(stderr, "rank %d: %s (%.2f s)\n", r, e.what(), s);
          if (s > 5) return 11;
          if (r == 0)
            return e.code() == mk::ErrorCode::Timeout && contains(e.message(), "rank(s) 2 never connected") &&
                           contains(e.message(), "127.0.0.1:" + std::to_string(port))
                       ? 0
                       : 12;
          return contains(e.message(), "rank 0") ? 0 : 13;
        }
      },
      20);
  CHECK(codes[0] == 0);
  CHECK(codes[1] == 0);
}

TEST_CASE("bootstrap: a rank that cannot reach rank 0 names the address") {
  const uint16_t port = mkt::freePort();
  const auto t0 = std::chrono::steady_clock::now();
  try {
    mk::TcpBootstrap boot(mkt::bootOptions(1, 2, port, 300));
    FAIL("rendezvous without rank 0 succeeded");
  } catch (const mk::Error& e) {
    CHECK(e.code() == mk::ErrorCode::Timeout);
    CHECK(contains(e.message(), "rank 1 could not reach rank 0 at 127.0.0.1:" + std::to_string(port)));
    CHECK(contains(e.message(), "refused"));
  }
  CHECK(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() < 3);
}

TEST_CASE("bootstrap: mismatched collective calls fail on both sides") {
  const uint16_t port = mkt::freePort();
  const auto codes = mkt::forkRanks(
      2,
      [&](int r) {
        mk::TcpBootstrap boot(mkt::bootOptions(r, 2, port, 3000));
        const uint64_t v[2] = {1, 2};
        try {
          boot.allGather(v, r == 0 ? 8 : 16);  // rank 1 sends twice as many bytes
          return 10;
        } catch (const mk::Error& e) {
          std::fprintf(stderr, "rank %d: %s\n", r, e.what());
          if (r == 0) return contains(e.message(), "rank 1 is at collective call 0 with 16 bytes") ? 0 : 11;
          return 0;  // rank 1 sees rank 0 close the connection
        }
      },
      20);
  CHECK(codes[0] == 0);
  CHECK(codes[1] == 0);
}

TEST_CASE("bootstrap: a second process claiming the same rank is refused") {
  const uint16_t port = mkt::freePort();
  const auto codes = mkt::forkRanks(
      3,
      [&](int r) {
        try {
          mk::TcpBootstrap boot(mkt::bootOptions(r == 0 ? 0 : 1, 3, port, 1500));  // two processes say rank 1
          boot.barrier();
          return 10;
        } catch (const mk::Error& e) {
          if (r == 0) return contains(e.message(), "already connected") ? 0 : 11;
          return 0;
        }
      },
      20);
  CHECK(codes[0] == 0);
  CHECK(codes[1] == 0);
  CHECK(codes[2] == 0);
}

TEST_CASE("bootstrap: launch variables are read and malformed ones named") {
  {
    EnvGuard g({{"RANK", "1"},
                {"WORLD_SIZE", "2"},
                {"LOCAL_RANK", "1"},
                {"MASTER_ADDR", "127.0.0.1"},
                {"MASTER_PORT", "29500"},
                {"MK_JOB_KEY", kKeyHex}});
    CHECK(mk::launchedAsRanks());
    const auto env = mk::readLaunchEnvironment();
    CHECK(env.rank == 1);
    CHECK(env.size == 2);
    CHECK(env.localRank == 1);
    CHECK(env.masterAddr == "127.0.0.1");
    CHECK(env.masterPort == 29500);
  }
  {
    EnvGuard g({{"OMPI_COMM_WORLD_RANK", "3"},
                {"OMPI_COMM_WORLD_SIZE", "4"},
                {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                {"MASTER_ADDR", "localhost"},
                {"MASTER_PORT", "1234"},
                {"MK_JOB_KEY", kKeyHex}});
    const auto env = mk::readLaunchEnvironment();
    CHECK(env.rank == 3);
    CHECK(env.size == 4);
    CHECK(env.localRank == 1);
  }
  {
    // torchrun's agent holds MASTER_PORT for its own store: the rendezvous moves to the next port.
    EnvGuard g({{"RANK", "0"},
                {"WORLD_SIZE", "2"},
                {"MASTER_ADDR", "h"},
                {"MASTER_PORT", "29500"},
                {"TORCHELASTIC_RUN_ID", "none"},
                {"MK_JOB_KEY", kKeyHex}});
    CHECK(mk::readLaunchEnvironment().masterPort == 29501);
  }
  {
    EnvGuard g({{"RANK", "0"},
                {"WORLD_SIZE", "2"},
                {"MASTER_ADDR", "h"},
                {"MASTER_PORT", "65535"},
                {"TORCHELASTIC_RUN_ID", "none"}});
    CHECK(contains(envError(), "MASTER_PORT + 1"));
  }
  {
    EnvGuard g({{"RANK", "0"}, {"WORLD_SIZE", "1"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "1"}});
    CHECK(mk::readLaunchEnvironment().localRank == 0);  // LOCAL_RANK defaults to RANK
  }
  {
    // The node rank alone (mpirun sets no rendezvous variables): the GPU is picked before any bootstrap.
    EnvGuard g({{"OMPI_COMM_WORLD_RANK", "3"}, {"OMPI_COMM_WORLD_LOCAL_RANK", "1"}});
    CHECK(mk::launchLocalRank() == 1);
  }
  {
    EnvGuard g({{"RANK", "2"}});
    CHECK(mk::launchLocalRank() == 2);  // no local rank: the rank
  }
  {
    EnvGuard g({{"LOCAL_RANK", "x"}});
    std::string msg;
    try {
      mk::launchLocalRank();
    } catch (const mk::Error& e) {
      msg = e.what();
    }
    CHECK(contains(msg, "LOCAL_RANK='x'"));
  }
  {
    EnvGuard g({});
    CHECK(mk::launchLocalRank() == 0);
  }
  {
    EnvGuard g({});
    CHECK_FALSE(mk::launchedAsRanks());
    CHECK(contains(envError(), "WORLD_SIZE is not set"));
  }
  {
    EnvGuard g({{"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "1"}});
    CHECK(contains(envError(), "RANK is not set"));
  }
  {
    EnvGuard g({{"RANK", "x1"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "1"}});
    CHECK(contains(envError(), "RANK='x1'"));
  }
  {
    EnvGuard g({{"RANK", "2"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "1"}});
    CHECK(contains(envError(), "RANK='2' is not a rank below WORLD_SIZE"));
  }
  {
    EnvGuard g({{"RANK", "0"}, {"WORLD_SIZE", "0"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "1"}});
    CHECK(contains(envError(), "WORLD_SIZE='0'"));
  }
  {
    EnvGuard g({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "-1"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "1"}});
    CHECK(contains(envError(), "LOCAL_RANK='-1'"));
  }
  {
    EnvGuard g({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "1"}});
    CHECK(contains(envError(), "MASTER_ADDR is not set"));
  }
  {
    EnvGuard g({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}});
    CHECK(contains(envError(), "MASTER_PORT is not set"));
  }
  {
    EnvGuard g({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "70000"}});
    CHECK(contains(envError(), "MASTER_PORT='70000' is not a TCP port"));
  }
}

TEST_CASE("bootstrap: bad options and unknown hosts are refused at once") {
  CHECK_THROWS_AS(mk::TcpBootstrap(mkt::bootOptions(2, 2, 1234, 100)), mk::Error);
  CHECK_THROWS_AS(mk::TcpBootstrap(mkt::bootOptions(0, 2, 0, 100)), mk::Error);
  mk::TcpBootstrapOptions o = mkt::bootOptions(1, 2, 1234, 100);
  o.addr = "no-such-host.invalid";
  try {
    mk::TcpBootstrap boot(o);
    FAIL("unknown host accepted");
  } catch (const mk::Error& e) {
    CHECK(contains(e.message(), "cannot resolve MASTER_ADDR 'no-such-host.invalid'"));
  }
  // One rank alone needs no network at all.
  mk::TcpBootstrap solo(mkt::bootOptions(0, 1, 1, 100));
  const uint32_t v = 42;
  const auto all = solo.allGather(&v, sizeof v);
  REQUIRE(all.size() == 4);
  uint32_t back = 0;
  std::memcpy(&back, all.data(), 4);
  CHECK(back == 42);
  solo.barrier();
}

TEST_CASE("bootstrap: a job of several processes needs a job key, read from MK_JOB_KEY or a private file") {
  {
    EnvGuard g({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "1"}});
    CHECK(contains(envError(), "neither MK_JOB_KEY nor MK_JOB_KEY_FILE is set"));
  }
  {
    // One process alone needs none.
    EnvGuard g({{"RANK", "0"}, {"WORLD_SIZE", "1"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "1"}});
    CHECK(mk::readLaunchEnvironment().jobKey.empty());
  }
  {
    EnvGuard g(
        {{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "1"}, {"MK_JOB_KEY", kKeyHex}});
    CHECK(mk::readLaunchEnvironment().jobKey.hex() == kKeyHex);
  }
  // Malformed keys are named by where they came from, and their text is never echoed.
  const std::string secretish = "zz112233445566778899aabbccddeeff";
  for (const std::string& bad : {std::string("00112233"), secretish, std::string(kKeyHex) + "0"}) {
    CAPTURE(bad);
    EnvGuard g({{"MK_JOB_KEY", bad.c_str()}});
    const std::string m = errorOf([] { mk::readJobKey(); });
    CHECK(contains(m, "environment variable MK_JOB_KEY"));
    CHECK(contains(m, "hex digits"));
    CHECK_FALSE(contains(m, bad));
  }
  // A key file: private, regular, not a link; the same key as the variable would give.
  char dir[] = "/tmp/mk-key-XXXXXX";
  REQUIRE(::mkdtemp(dir) != nullptr);
  const std::string file = std::string(dir) + "/key";
  {
    FILE* f = std::fopen(file.c_str(), "w");
    REQUIRE(f != nullptr);
    std::fprintf(f, "%s\n", kKeyHex);
    std::fclose(f);
  }
  ::chmod(file.c_str(), 0600);
  {
    EnvGuard g({{"MK_JOB_KEY_FILE", file.c_str()}});
    CHECK(mk::readJobKey().hex() == kKeyHex);
  }
  {
    EnvGuard g({{"MK_JOB_KEY_FILE", file.c_str()}, {"MK_JOB_KEY", kKeyHex}});
    CHECK(contains(errorOf([] { mk::readJobKey(); }), "both MK_JOB_KEY and MK_JOB_KEY_FILE are set"));
  }
  ::chmod(file.c_str(), 0644);
  CHECK(contains(errorOf([&] { mk::JobKey::fromFile(file); }), "readable or writable by other users (mode 0644)"));
  ::chmod(file.c_str(), 0600);
  const std::string link = std::string(dir) + "/link";
  REQUIRE(::symlink(file.c_str(), link.c_str()) == 0);
  CHECK(contains(errorOf([&] { mk::JobKey::fromFile(link); }), "symbolic link"));
  const std::string fifo = std::string(dir) + "/fifo";
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  CHECK(contains(errorOf([&] { mk::JobKey::fromFile(fifo); }), "not a regular file"));  // and does not hang
  CHECK(contains(errorOf([&] { mk::JobKey::fromFile(std::string(dir) + "/none"); }), "cannot open job key file"));
  for (const std::string& p : {file, link, fifo}) ::unlink(p.c_str());
  ::rmdir(dir);
  // A job of several processes without a key is refused before any socket is opened.
  mk::TcpBootstrapOptions o = mkt::bootOptions(0, 2, 1, 100);
  o.key = mk::JobKey();
  CHECK(contains(errorOf([&] { mk::TcpBootstrap boot(o); }), "needs a job key"));
}

TEST_CASE("bootstrap: the job key's HMAC-SHA256 matches RFC 4231 and fresh keys differ") {
  // RFC 4231, test case 1: key 0x0b x 20, data "Hi There".
  const mk::JobKey k = mk::JobKey::fromHex("0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b", "the test vector");
  const mk::JobKey::Mac m = k.mac("Hi There", 8);
  char hex[65] = {};
  for (size_t i = 0; i < m.size(); ++i) std::snprintf(hex + 2 * i, 3, "%02x", m[i]);
  CHECK(std::string(hex) == "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7");
  mk::JobKey::Mac other = m;
  CHECK(mk::macEqual(m, other));
  other[31] ^= 1;
  CHECK_FALSE(mk::macEqual(m, other));
  const mk::JobKey a = mk::JobKey::generate(), b = mk::JobKey::generate();
  CHECK(a.hex().size() == 64);
  CHECK(a.hex() != b.hex());
  CHECK(mk::JobKey::fromHex(a.hex(), "x").hex() == a.hex());
}
