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

/// A copy of the committed fused-nodes measurements and their manifest, in a fresh directory laid out as the tree
/// (the manifest's data and topology paths are relative to it).
fs::path copyFused(const std::string& name) {
  const fs::path data = fs::path(MK_MEASURED_DIR).parent_path();
  const fs::path root = fs::temp_directory_path() / ("mk-shard-digest-" + name + "-" + std::to_string(::getpid()));
  fs::remove_all(root);
  fs::create_directories(root / "measured" / "internode");
  fs::copy(data / "measured" / "internode" / "fused-nodes", root / "measured" / "internode" / "fused-nodes",
           fs::copy_options::recursive);
  fs::copy(data / "topologies", root / "topologies", fs::copy_options::recursive);
  fs::copy(data / "fused-validation", root / "fused-validation", fs::copy_options::recursive);
  return root;
}

}  // namespace

TEST_CASE("shard digest: a changed fused record or manifest changes the digest") {
  const fs::path root = copyFused("fused");
  const std::string fused = (root / "fused-validation").string();
  const std::string before = inputsDigest({"plan"}, "", fused);
  CHECK(before == inputsDigest({"plan"}, "", fused));  // the same inputs, the same digest
  CHECK(before != inputsDigest({"plan"}, "", ""));     // the fused data is in it
  // One byte more in one gated record: another digest.
  fs::path gated;
  for (const auto& e : fs::directory_iterator(root / "measured" / "internode" / "fused-nodes"))
    if (e.path().filename().string().find("-2x1-") != std::string::npos && e.path().extension() == ".json")
      gated = e.path();
  REQUIRE(!gated.empty());
  std::ofstream(gated, std::ios::app) << "\n";
  const std::string afterRecord = inputsDigest({"plan"}, "", fused);
  CHECK(afterRecord != before);
  // The manifest itself is in it too.
  for (const auto& e : fs::directory_iterator(root / "fused-validation")) std::ofstream(e.path(), std::ios::app) << " ";
  CHECK(inputsDigest({"plan"}, "", fused) != afterRecord);
  fs::remove_all(root);
}
