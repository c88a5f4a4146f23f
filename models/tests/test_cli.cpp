// The CLI convention's shared pieces (mk/util/cli_convention.hpp, cli.hpp) and the no-GPU exit code mapping.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "mk/error.hpp"
#include "mk/util/cli.hpp"
#include "mk/util/cli_convention.hpp"
#include "mk/util/size.hpp"

namespace {

/// Parse `args` with the shared size options; the resolved sweep, or "error: <message>".
std::string sweepOf(std::vector<std::string> args, const std::string& defaultSweep = "1MiB:1MiB:2") {
  CLI::App app;
  std::string bytes = "1MiB";
  mk::cli::SizeFlags f;
  app.add_option("--bytes", bytes);
  mk::cli::addSweepOptions(app, f, "test");
  args.insert(args.begin(), "tool");
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  app.parse(static_cast<int>(argv.size()), argv.data());
  try {
    return mk::cli::resolveSweep(app, f, defaultSweep);
  } catch (const mk::Error& e) {
    return "error: " + e.message();
  }
}

}  // namespace

TEST_CASE("cli: -b/-e/-f are nccl-tests' spelling of --sweep, a missing bound the tool's default") {
  CHECK(sweepOf({}).empty());
  CHECK(sweepOf({"--sweep", "8:1G:2"}) == "8:1G:2");
  CHECK(sweepOf({"-b", "8", "-e", "1G", "-f", "4"}) == "8:1G:4");
  CHECK(sweepOf({"--minbytes", "1K"}, "8:512M:2") == "1K:512M:2");
  CHECK(sweepOf({"-e", "64K"}, "8:512M:2") == "8:64K:2");
}

TEST_CASE("cli: one size and a range together, or two spellings of a range, are refused") {
  CHECK(sweepOf({"--bytes", "1M", "--sweep", "8:1G:2"}).find("--bytes gives one size") != std::string::npos);
  CHECK(sweepOf({"--bytes", "1M", "-b", "8"}).find("use one of them") != std::string::npos);
  CHECK(sweepOf({"--sweep", "8:1G:2", "-e", "1M"}).find("--sweep and -b/-e/-f") != std::string::npos);
  CHECK(sweepOf({"-b", "1G", "-e", "1K"}).find("bad -b/-e/-f '1G:1K:2': need 0 < MIN <= MAX") != std::string::npos);
}

TEST_CASE("size: parseSweep multiplies up to MAX and names the flag and rule it breaks") {
  CHECK(mk::parseSweep("8:64:2") == std::vector<uint64_t>{8, 16, 32, 64});
  CHECK(mk::parseSweep("1K:4K:3") == std::vector<uint64_t>{1024, 3072});
  CHECK(mk::parseSweep("1:1:2") == std::vector<uint64_t>{1});
  for (const auto& [text, why] :
       std::vector<std::pair<std::string, std::string>>{{"8:1G", "expected MIN:MAX:FACTOR"},
                                                        {"0:8:2", "need 0 < MIN <= MAX"},
                                                        {"8:1:2", "need 0 < MIN <= MAX"},
                                                        {"8:64:1", "FACTOR must be an integer >= 2"},
                                                        {"8:64:x", "bad size 'x'"}}) {
    try {
      mk::parseSweep(text, "--sweep");
      FAIL("accepted " << text);
    } catch (const mk::Error& e) {
      CHECK(e.code() == mk::ErrorCode::InvalidArgument);
      CHECK_MESSAGE(e.message().find("bad --sweep '" + text + "'") == 0, e.message());
      CHECK_MESSAGE(e.message().find(why) != std::string::npos, e.message());
    }
  }
}

TEST_CASE("size: a human size with the raw bytes next to it") {
  CHECK(mk::formatSizeWithBytes(64ull << 20) == "64 MiB (67108864 B)");
  CHECK(mk::formatSizeWithBytes(512) == "512 B");
  CHECK(mk::formatSizeWithBytes(1048573) == "1048573 B");
}

TEST_CASE("cli: no GPU and a too old driver have their own exit codes, apart from bad input") {
  CHECK(mk::cli::exitCodeFor(mk::ErrorCode::NoDevice) == 3);
  CHECK(mk::cli::exitCodeFor(mk::ErrorCode::DriverTooOld) == 4);
  CHECK(mk::cli::exitCodeFor(mk::ErrorCode::InvalidArgument) == mk::cli::kExitBadInput);
  CHECK(mk::cli::exitCodeFor(mk::ErrorCode::CudaError) == mk::cli::kExitBadInput);
  CHECK(mk::cli::exitCodeFor(mk::ErrorCode::Internal) == mk::cli::kExitFailed);
  const int rc = mk::cli::run("tool", []() -> int { throw mk::Error(mk::ErrorCode::NoDevice, "no GPU: test"); });
  CHECK(rc == mk::cli::kExitNoGpu);
  CHECK(std::string(mk::toString(mk::ErrorCode::NoDevice)) == "no-gpu");
}

TEST_CASE("error: CUDA start-up errors map to no GPU or driver too old") {
  CHECK(mk::cudaStartupErrorCode(100, true) == mk::ErrorCode::NoDevice);     // cudaErrorNoDevice
  CHECK(mk::cudaStartupErrorCode(35, false) == mk::ErrorCode::NoDevice);     // no libcuda at all
  CHECK(mk::cudaStartupErrorCode(35, true) == mk::ErrorCode::DriverTooOld);  // libcuda older than the runtime
  CHECK(mk::cudaStartupErrorCode(2, true) == mk::ErrorCode::CudaError);      // cudaErrorMemoryAllocation
}

namespace {

/// mk::cli::parse on an app with a path option, a list option, a flag and positional files: its exit code.
int parseCode(std::vector<std::string> args) {
  CLI::App app;
  std::string out;
  std::vector<std::string> ops, files;
  bool quiet = false;
  app.add_option("--out", out);
  app.add_option("--op", ops)->delimiter(',');
  app.add_flag("--quiet", quiet);
  app.add_option("files", files);
  args.insert(args.begin(), "tool");
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  return mk::cli::parse(app, static_cast<int>(argv.size()), argv.data(), "tool");
}

}  // namespace

TEST_CASE("cli: an empty value is refused on every option, never taken for 'not given'") {
  CHECK(parseCode({"--out", "x", "--op", "a,b", "--quiet", "f.json"}) == mk::cli::kContinue);
  CHECK(parseCode({"--out", ""}) == mk::cli::kExitBadInput);
  CHECK(parseCode({"--out="}) == mk::cli::kExitBadInput);
  CHECK(parseCode({"--op", ""}) == mk::cli::kExitBadInput);
  CHECK(parseCode({"f.json", ""}) == mk::cli::kExitBadInput);
}

TEST_CASE("cli: an error line escapes newlines and control bytes, so it stays one line") {
  CHECK(mk::cli::oneLine("plain text: ok") == "plain text: ok");
  CHECK(mk::cli::oneLine("all\nreduce") == "all\\nreduce");
  CHECK(mk::cli::oneLine("a\r\tb") == "a\\r\\tb");
  CHECK(mk::cli::oneLine(std::string("x\0y\x1b\x7f", 5)) == "x\\x00y\\x1b\\x7f");
  CHECK(mk::cli::oneLine("caf\xc3\xa9") == "caf\xc3\xa9");  // UTF-8 passes as is
}

TEST_CASE("cli: refuseOthers names the first given option outside the kept ones") {
  CLI::App app;
  std::string schedule, json;
  uint32_t ranks = 0;
  app.add_option("--schedule", schedule);
  app.add_option("--json", json);
  app.add_option("-r,--ranks", ranks);
  std::vector<std::string> args{"tool", "--schedule", "s.json", "--json", "o.json"};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  app.parse(static_cast<int>(argv.size()), argv.data());
  CHECK(mk::cli::refuseOthers(app, "tool", {"--schedule", "--json"}, "is ignored") == mk::cli::kContinue);
  CHECK(mk::cli::refuseOthers(app, "tool", {"--schedule"}, "is ignored") == mk::cli::kExitBadInput);
}
