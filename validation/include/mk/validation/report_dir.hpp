// mkernel — the report directories of the judge's tools (mk-validate, mk-plan): written whole or not at all.
//
// A report is written into a fresh temporary directory next to its destination (same file system), its Python
// generator runs there, and only then is it renamed into place, replacing an empty directory or a previous report
// of the same tool (recognised by a marker file). A failure leaves nothing behind.
#pragma once

#include <filesystem>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "mk/schedule/io.hpp"

namespace mk::report {

/// The directory holding `path` ("." for a bare name).
std::filesystem::path parentOf(const std::string& path);

/// The report directory: new, empty, or a previous report of this tool (it holds `marker`); its parent exists and
/// is writable. Throws Error(IoError) "<option> <dir>: ..." naming what is wrong. Removes what runs killed with -9
/// left next to it (removeStaleTempDirs).
void checkReportDir(const std::string& option, const std::string& dir, const std::string& marker,
                    const std::string& tool);

/// The report generator `scriptName`: next to an installed tool (../share/mkernel), else `sourcePath`.
std::string defaultScript(const std::string& scriptName, const std::string& sourcePath);

/// A fresh directory next to `dir` (".<name>.<tag>-<pid>-XXXXXX", mode as mkdir would give it).
std::filesystem::path makeTempDir(const std::string& option, const std::string& dir, const char* tag);

/// Remove the temporary directories next to report directory `target` (".<name>.tmp-<pid>-XXXXXX", and
/// ".<name>.old-<pid>-XXXXXX") whose process is gone: left by a run killed with -9, which no handler cleans up. A
/// previous report moved aside by a run killed before its own was in place goes back to `target` if that is free.
/// Directories of live runs, and names without a pid, are left alone. Never throws.
void removeStaleTempDirs(const std::string& target);

/// Move the finished report `tmp` to `dir`, replacing an empty directory or a previous report. A `dir` that is a
/// symbolic link is kept: the folder it points to is replaced (resolveOutputTarget), as checkReportDir and
/// makeTempDir see it.
void installReport(const std::string& option, const std::filesystem::path& tmp, const std::string& dir);

/// Run `python script args...` with stdout and stderr into `log`; throws Error(Unsupported) "<option>: <script>
/// (run by <python>) failed with exit N: <its last line>" when it fails, Error(IoError) when it cannot start.
void runScript(const std::string& option, const std::string& python, const std::string& script,
               const std::vector<std::string>& args, const std::string& log);

/// One report of a tool, staged as the file comment says. Its tool stages the report (write, render) before its
/// other outputs and installs it before committing them; a report not installed is removed with its stage (the
/// destructor, or SIGINT / SIGTERM while it is staged).
class StagedReport {
 public:
  /// The report for `dir`, given as `option` ("" = no report: every call does nothing); `marker` is the file that
  /// tells a later run the directory holds a report of `tool` (checkReportDir).
  StagedReport(std::string option, std::string dir, std::string marker, std::string tool);
  StagedReport(const StagedReport&) = delete;
  StagedReport& operator=(const StagedReport&) = delete;
  ~StagedReport();  ///< removes a stage not installed; never throws

  bool active() const noexcept { return !dir_.empty(); }
  /// Make the stage (makeTempDir) and write `files` (name, text) into it, then the marker. Throws Error(IoError).
  void write(const std::vector<std::pair<std::string, std::string>>& files);
  /// Run `python script --json <stage>/<jsonName> --out <stage>` (runScript), its output in the stage's
  /// report.log, removed when the script succeeds.
  void render(const std::string& python, const std::string& script, const std::string& jsonName);
  /// Move the stage into place (installReport).
  void install();

 private:
  std::string option_, dir_, marker_, tool_;
  std::filesystem::path stage_;
  std::optional<TempGuard> guard_;
};

}  // namespace mk::report
