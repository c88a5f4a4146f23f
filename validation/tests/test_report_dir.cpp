// Tests of the report folders written whole (mk/validation/report_dir.hpp) when the folder is a symbolic link.
#include <doctest/doctest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "mk/validation/report_dir.hpp"

namespace fs = std::filesystem;

TEST_CASE("report dir: a symlinked report folder keeps the link and replaces the folder it points to") {
  const fs::path d = fs::temp_directory_path() / ("mk-report-dir-link-" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d / "store" / "rep");
  std::ofstream(d / "store" / "rep" / ".marker") << "previous report";
  std::ofstream(d / "store" / "rep" / "stale.html") << "old";
  fs::create_directory_symlink(fs::path("store") / "rep", d / "rep");  // relative, from the link's folder
  const std::string dir = (d / "rep").string();

  CHECK_NOTHROW(mk::report::checkReportDir("--report", dir, ".marker", "test"));
  const fs::path tmp = mk::report::makeTempDir("--report", dir, "tmp");
  CHECK(tmp.parent_path() == d / "store");  // next to the target: one file system for the rename
  std::ofstream(tmp / "index.html") << "new";
  mk::report::installReport("--report", tmp, dir);

  CHECK(fs::is_symlink(fs::symlink_status(d / "rep")));
  CHECK(fs::exists(d / "store" / "rep" / "index.html"));
  CHECK_FALSE(fs::exists(d / "store" / "rep" / "stale.html"));
  std::size_t entries = 0;  // no temporary or old folder left beside the target
  for (const auto& e : fs::directory_iterator(d / "store")) {
    (void)e;
    ++entries;
  }
  CHECK(entries == 1);
  fs::remove_all(d);
}
