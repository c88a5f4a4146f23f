// Tests of the output helpers (mk/schedule/io.hpp): a set of outputs written all or nothing, and temporaries
// removed when SIGTERM / SIGINT ends the process.
#include <doctest/doctest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <filesystem>
#include <fstream>
#include <string>

#include "mk/error.hpp"
#include "mk/schedule/io.hpp"

namespace fs = std::filesystem;
using namespace mk;

namespace {

/// A fresh directory under the build tree's temporary directory.
fs::path freshDir(const std::string& name) {
  const fs::path d = fs::temp_directory_path() / ("mk-outputs-" + name + "-" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

std::string contents(const fs::path& p) {
  std::ifstream in(p);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

bool anyTemporary(const fs::path& dir) {
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().filename().string().find(".tmp.") != std::string::npos) return true;
  return false;
}

}  // namespace

TEST_CASE("outputs: a set replaces every target only after every output was written") {
  const fs::path d = freshDir("set");
  std::ofstream(d / "a.json") << "old a";
  {
    OutputSet out;
    out.stage("--json", (d / "a.json").string(), "new a");
    out.stage("--trace", (d / "b.json").string(), "new b");
    CHECK(contents(d / "a.json") == "old a");  // staged, not yet in place
    CHECK_FALSE(fs::exists(d / "b.json"));
    out.commit();
  }
  CHECK(contents(d / "a.json") == "new a");
  CHECK(contents(d / "b.json") == "new b");
  CHECK_FALSE(anyTemporary(d));
  fs::remove_all(d);
}

TEST_CASE("outputs: when one output fails, no target is replaced and no temporary is left") {
  const fs::path d = freshDir("fail");
  std::ofstream(d / "a.json") << "old a";
  const std::string tooLong = (d / std::string(250, 'x')).string();  // no room for ".tmp.<pid>" in the name
  {
    OutputSet out;
    out.stage("--json", (d / "a.json").string(), "new a");
    try {
      out.stage("--packed", tooLong, "new b");
      FAIL("expected an IoError");
    } catch (const Error& e) {
      CHECK(e.code() == ErrorCode::IoError);
      CHECK(e.message().find("--packed") != std::string::npos);
    }
  }  // never committed
  CHECK(contents(d / "a.json") == "old a");
  CHECK_FALSE(anyTemporary(d));
  fs::remove_all(d);
}

TEST_CASE("outputs: SIGTERM and SIGINT remove the registered temporaries, then end the process by the signal") {
  for (const int sig : {SIGTERM, SIGINT}) {
    const fs::path d = freshDir("signal" + std::to_string(sig));
    const fs::path file = d / "x.json.tmp.1";
    const fs::path dir = d / ".report.tmp-abc";
    const pid_t child = ::fork();
    REQUIRE(child >= 0);
    if (child == 0) {
      std::ofstream(file) << "half written";
      fs::create_directories(dir / "img");
      std::ofstream(dir / "img" / "p.png") << "png";
      const TempGuard fileGuard(file.string(), false);
      const TempGuard dirGuard(dir.string(), true);
      ::raise(sig);
      ::_exit(0);  // not reached: the signal's default action ends the process
    }
    int status = 0;
    REQUIRE(::waitpid(child, &status, 0) == child);
    CHECK(WIFSIGNALED(status));
    CHECK(WTERMSIG(status) == sig);
    CHECK_FALSE(fs::exists(file));
    CHECK_FALSE(fs::exists(dir));
    fs::remove_all(d);
  }
}

TEST_CASE("outputs: a released guard leaves its path alone") {
  const fs::path d = freshDir("released");
  const fs::path file = d / "kept.tmp.1";
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    std::ofstream(file) << "kept";
    { const TempGuard guard(file.string(), false); }
    ::raise(SIGTERM);
    ::_exit(0);
  }
  int status = 0;
  REQUIRE(::waitpid(child, &status, 0) == child);
  CHECK(WIFSIGNALED(status));
  CHECK(fs::exists(file));
  fs::remove_all(d);
}
