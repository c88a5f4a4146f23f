// Tests of the report folders written whole (mk/validation/report_dir.hpp): through a symbolic link, and staged.
#include <doctest/doctest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include "mk/error.hpp"
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

namespace {

std::size_t entriesOf(const fs::path& dir) {
  std::size_t n = 0;
  for (auto it = fs::directory_iterator(dir); it != fs::directory_iterator(); ++it) ++n;
  return n;
}

std::string textOf(const fs::path& file) {
  std::ifstream in(file);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

}  // namespace

TEST_CASE("report dir: a staged report is rendered and installed whole, or leaves nothing behind") {
  const fs::path d = fs::temp_directory_path() / ("mk-staged-report-" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  // Report generators as the tools run them: SCRIPT --json FILE --out DIR.
  std::ofstream(d / "good.sh") << "echo '<html>' > \"$4/index.html\"\necho rendered\n";
  std::ofstream(d / "bad.sh") << "echo 'no plot'\nexit 3\n";
  const std::string dir = (d / "rep").string();
  {
    mk::report::StagedReport report("--report", dir, ".marker", "mk-test");
    report.write({{"a.json", "{}"}, {"b.json", "[]"}});
    report.render("/bin/sh", (d / "good.sh").string(), "a.json");
    CHECK_FALSE(fs::exists(d / "rep"));  // staged beside it until installed
    report.install();
  }
  CHECK(textOf(d / "rep" / "a.json") == "{}");
  CHECK(textOf(d / "rep" / "b.json") == "[]");
  CHECK(fs::exists(d / "rep" / "index.html"));
  CHECK(textOf(d / "rep" / ".marker") == "written by mk-test; a new report may replace this directory\n");
  CHECK_FALSE(fs::exists(d / "rep" / "report.log"));
  CHECK(entriesOf(d) == 3);  // good.sh, bad.sh, rep: no stage left
  {
    mk::report::StagedReport report("--report", dir, ".marker", "mk-test");
    report.write({{"a.json", "{\"new\": 1}"}});
    const std::string why = "--report: " + (d / "bad.sh").string() + " (run by /bin/sh) failed with exit 3: no plot";
    CHECK_THROWS_WITH_AS(report.render("/bin/sh", (d / "bad.sh").string(), "a.json"), doctest::Contains(why.c_str()),
                         mk::Error);
  }
  CHECK(textOf(d / "rep" / "a.json") == "{}");  // the previous report stays
  CHECK(entriesOf(d) == 3);                     // and the failed one's stage is gone
  {
    mk::report::StagedReport none("--report", "", ".marker", "mk-test");  // no --report: nothing at all
    none.write({{"a.json", "{}"}});
    none.render("/bin/sh", (d / "bad.sh").string(), "a.json");
    none.install();
  }
  CHECK(entriesOf(d) == 3);
  fs::remove_all(d);
}
