// Tests of the one check that a command's outputs are pairwise apart (mk/io/output_paths.hpp), and of writing an
// output through a symbolic link (the link kept, its target replaced).
#include <doctest/doctest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "expect_error.hpp"
#include "mk/error.hpp"
#include "mk/io/output_paths.hpp"
#include "mk/schedule/io.hpp"

namespace fs = std::filesystem;
using namespace mk;
using mk::test::expectError;

namespace {

fs::path freshDir(const std::string& name) {
  const fs::path d = fs::temp_directory_path() / ("mk-output-paths-" + name + "-" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

std::string contents(const fs::path& p) {
  std::ifstream in(p);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

OutputPath file(const std::string& option, const fs::path& p) { return {option, p.string(), OutputKind::File}; }
OutputPath folder(const std::string& option, const fs::path& p) { return {option, p.string(), OutputKind::Folder}; }

}  // namespace

TEST_CASE("output paths: the same path, spelled alike or not, is refused naming both options") {
  const fs::path d = freshDir("same");
  fs::create_directories(d / "sub");
  const std::string y = (d / "y").string();
  expectError(
      [&] {
        checkDistinctOutputs({file("--json", y), file("--packed", y)});
      },
      ErrorCode::InvalidArgument, {"--json " + y + " and --packed " + y, "same path"});
  // ".", "..", repeated slashes: one file on the text alone (neither exists yet)
  const std::string odd = d.string() + "//sub/.././y";
  expectError(
      [&] {
        checkDistinctOutputs({file("--json", y), file("--trace", odd)});
      },
      ErrorCode::InvalidArgument, {"--json " + y, "--trace " + odd});
  // a relative and an absolute spelling of one file
  const fs::path cwd = fs::current_path();
  fs::current_path(d);
  expectError(
      [&] {
        checkDistinctOutputs({file("--out", "y"), file("--summary", y)});
      },
      ErrorCode::InvalidArgument, {"--out y and --summary " + y});
  fs::current_path(cwd);
  fs::remove_all(d);
}

TEST_CASE("output paths: a file inside a folder output is refused, a sibling with a common prefix is not") {
  const fs::path d = freshDir("nested");
  const fs::path rep = d / "rep";
  expectError(
      [&] {
        checkDistinctOutputs({folder("--report", rep), file("--json", rep / "copy.json")});
      },
      ErrorCode::InvalidArgument,
      {"--json " + (rep / "copy.json").string() + " and --report " + rep.string(),
       "the first lies inside the second, a folder"});
  expectError(
      [&] {
        checkDistinctOutputs({folder("--report", d.string() + "/rep/"), file("--json", rep / "a.json")});
      },
      ErrorCode::InvalidArgument, "--report");
  CHECK_NOTHROW(checkDistinctOutputs({folder("--report", rep), file("--json", d / "rep-copy.json")}));
  CHECK_NOTHROW(checkDistinctOutputs({folder("--report", rep), file("--json", d / "rep.json"),
                                      file("--stats", d / "stats.json"), folder("--cache", d / "cache")}));
  fs::remove_all(d);
}

TEST_CASE("output paths: symlinked parents, '..' through a link and hard links are seen through") {
  const fs::path d = freshDir("links");
  fs::create_directories(d / "real" / "deep");
  fs::create_directory_symlink(d / "real", d / "alias");
  // a symlinked parent folder that points at the same place
  expectError(
      [&] {
        checkDistinctOutputs({file("--json", d / "real" / "w"), file("--trace", d / "alias" / "w")});
      },
      ErrorCode::InvalidArgument, "same path");
  // "x/.." where x is a link: the kernel goes up from the link's target, not from the link
  fs::create_directory_symlink(d / "real" / "deep", d / "jump");
  expectError(
      [&] {
        checkDistinctOutputs({file("--json", d / "jump" / ".." / "w"), file("--trace", d / "real" / "w")});
      },
      ErrorCode::InvalidArgument, "same path");
  // a file inside a folder output reached through a link
  expectError(
      [&] {
        checkDistinctOutputs({folder("--report", d / "real"), file("--json", d / "alias" / "x.json")});
      },
      ErrorCode::InvalidArgument, "lies inside");
  // an output that is a symbolic link to another output (it is written through)
  std::ofstream(d / "real" / "target.json") << "t";
  fs::create_symlink(d / "real" / "target.json", d / "link.json");
  expectError(
      [&] {
        checkDistinctOutputs({file("--json", d / "link.json"), file("--out", d / "real" / "target.json")});
      },
      ErrorCode::InvalidArgument, "same path");
  // two hard links of one file
  fs::create_hard_link(d / "real" / "target.json", d / "hard.json");
  expectError(
      [&] {
        checkDistinctOutputs({file("--json", d / "hard.json"), file("--out", d / "real" / "target.json")});
      },
      ErrorCode::InvalidArgument, "same path");
  fs::remove_all(d);
}

TEST_CASE("output paths: distinct paths pass, and an empty path is no output") {
  const fs::path d = freshDir("distinct");
  CHECK_NOTHROW(checkDistinctOutputs({}));
  CHECK_NOTHROW(checkDistinctOutputs({file("--json", d / "a.json"), file("--trace", d / "b.json")}));
  CHECK_NOTHROW(checkDistinctOutputs({file("--json", ""), file("--trace", ""), folder("--report", "")}));
  CHECK_NOTHROW(checkDistinctOutputs({file("--json", d / "a.json"), file("--trace", "")}));
  fs::remove_all(d);
}

TEST_CASE("output paths: writing through a symbolic link replaces its target and keeps the link") {
  const fs::path d = freshDir("write");
  fs::create_directories(d / "store");
  std::ofstream(d / "store" / "a.json") << "old a";
  fs::create_symlink(fs::path("store") / "a.json", d / "a.json");  // relative, from the link's folder
  writeFileAtomic((d / "a.json").string(), "new a");
  CHECK(fs::is_symlink(fs::symlink_status(d / "a.json")));
  CHECK(contents(d / "store" / "a.json") == "new a");

  std::ofstream(d / "store" / "b.json") << "old b";
  fs::create_symlink(d / "store" / "b.json", d / "b.json");
  fs::create_symlink(d / "store" / "new.json", d / "dangling.json");
  {
    OutputSet out;
    out.stage("--json", (d / "b.json").string(), "new b");
    out.stage("--trace", (d / "dangling.json").string(), "created");
    out.commit();
  }
  CHECK(fs::is_symlink(fs::symlink_status(d / "b.json")));
  CHECK(contents(d / "store" / "b.json") == "new b");
  CHECK(fs::is_symlink(fs::symlink_status(d / "dangling.json")));
  CHECK(contents(d / "store" / "new.json") == "created");

  fs::create_symlink(d / "loop1", d / "loop2");
  fs::create_symlink(d / "loop2", d / "loop1");
  expectError([&] { writeFileAtomic((d / "loop1").string(), "x"); }, ErrorCode::IoError, "symbolic links");
  fs::remove_all(d);
}
