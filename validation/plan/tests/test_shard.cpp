// The shards' inputs digest (shard.hpp): every file the planner reads is in it, the fused operators' data too.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include <unistd.h>

#include "mk/plan/shard.hpp"

using namespace mk::plan;
namespace fs = std::filesystem;

namespace {

/// A copy of the committed measurement directory's top-level files and its fused-nodes data, in a fresh directory
/// (the manifest's topology path is relative: the topologies folder is copied beside it as in the tree).
fs::path copyMeasured(const std::string& name) {
  const fs::path src = MK_MEASURED_DIR;
  const fs::path root = fs::temp_directory_path() / ("mk-shard-digest-" + name + "-" + std::to_string(::getpid()));
  fs::remove_all(root);
  fs::create_directories(root / "measured" / "internode");
  fs::copy(src / "internode" / "fused-nodes", root / "measured" / "internode" / "fused-nodes",
           fs::copy_options::recursive);
  fs::copy(src.parent_path() / "topologies", root / "topologies", fs::copy_options::recursive);
  return root;
}

}  // namespace

TEST_CASE("shard digest: a changed fused record below --measured changes the digest") {
  const fs::path root = copyMeasured("fused");
  const std::string measured = (root / "measured").string();
  const std::string before = inputsDigest({"plan"}, measured);
  CHECK(before == inputsDigest({"plan"}, measured));  // the same inputs, the same digest
  CHECK(before != inputsDigest({"plan"}, ""));        // the fused data is in it
  // One byte more in one gated record: another digest.
  fs::path gated;
  for (const auto& e : fs::directory_iterator(root / "measured" / "internode" / "fused-nodes"))
    if (e.path().filename().string().find("-2x1-") != std::string::npos && e.path().extension() == ".json")
      gated = e.path();
  REQUIRE(!gated.empty());
  std::ofstream(gated, std::ios::app) << "\n";
  CHECK(inputsDigest({"plan"}, measured) != before);
  fs::remove_all(root);
}
