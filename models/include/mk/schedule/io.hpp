// mkernel — Schedule <-> JSON (nlohmann-json) and file helpers. The format is docs/schedule-format.md.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "mk/io/limits.hpp"
#include "mk/schedule/schedule.hpp"

namespace mk {

/// The "schema" string of a schedule document; readers accept it and its minor revisions.
inline constexpr const char* kScheduleSchema = "mkernel.schedule.v1";

/// Serialise to the JSON text of docs/schedule-format.md ("schema": "mkernel.schedule.v1").
std::string scheduleToJson(const Schedule& s, int indent = -1);
/// Parse JSON text; throws Error(ParseError) naming the offending field (e.g. "ranks[2].lanes[0].steps[5].kind").
/// The result is structurally complete but not validated: call validate() before running it.
Schedule scheduleFromJson(const std::string& text);

/// Runtime extent values of `s` from JSON (docs/schedule-format.md "Runtime extents"):
/// {"schema": "mkernel.extents.v1", "values": {"<extent>": 3 | [v_rank0, v_rank1, ...], ...}}, every extent of `s`
/// given, each value at most its bound. Throws Error(ParseError) naming the field; `what` names the document.
ExtentValues extentValuesFromJson(const Schedule& s, const std::string& text, const std::string& what = "extents");
/// The same from a file.
ExtentValues loadExtentValues(const Schedule& s, const std::string& path);

/// Read a schedule from a .json file (throws IoError / ParseError with the path in the message).
Schedule loadSchedule(const std::string& path);
/// Write atomically: to "<path>.tmp" first, then rename, so a failure never leaves a half-written file.
void saveSchedule(const Schedule& s, const std::string& path);

/// Write `text` to `path` atomically (temp file + rename); throws IoError. Shared by every tool. Refuses a `path`
/// that exists and is not a regular file (a device such as /dev/null, a FIFO, a directory): the rename would
/// replace it. A `path` that is a symbolic link keeps the link: its target is replaced (resolveOutputTarget).
void writeFileAtomic(const std::string& path, const std::string& text);
/// Every tool's check of an output path given as `option`, before any work: its directory exists, and it is not
/// an existing non-regular file (see writeFileAtomic) nor the same file as one of the command's `inputs` (which
/// it would overwrite). Throws Error naming the option and the path (exit 2): IoError for a missing directory,
/// InvalidArgument for the rest. An empty `path` is no output.
void checkOutputPath(const std::string& option, const std::string& path, const std::vector<std::string>& inputs = {});
/// Registers a temporary file or directory for removal if the process is ended by SIGINT, SIGTERM or SIGHUP
/// while the guard lives (the handler unlinks files with async-signal-safe calls, removes directories with a
/// forked `rm -rf`, then re-raises the signal with its default action). The guard does not remove the path
/// itself when it goes out of scope: its owner does, or renames it into place.
class TempGuard {
 public:
  TempGuard(const std::string& path, bool directory);
  TempGuard(const TempGuard&) = delete;
  TempGuard& operator=(const TempGuard&) = delete;
  ~TempGuard();

 private:
  int slot_ = -1;
};

/// A command's outputs written all or nothing: stage() writes each one to a temporary next to its target
/// ("<path>.tmp.<pid>"); commit() renames them all into place once every one was written; the destructor
/// removes whatever was not committed, so when one output fails none of the targets is replaced. Staged
/// temporaries are removed on SIGINT / SIGTERM as well (see TempGuard).
class OutputSet {
 public:
  OutputSet() = default;
  OutputSet(const OutputSet&) = delete;
  OutputSet& operator=(const OutputSet&) = delete;
  ~OutputSet();
  /// Write `text` to a temporary for `path` (nothing when `path` is empty); throws IoError naming `option`.
  void stage(const std::string& option, const std::string& path, const std::string& text);
  /// Rename every staged temporary over its target, in staging order; throws IoError. (Renames within one
  /// directory do not fail in practice once the writes succeeded; the rename itself is not undone.)
  void commit();

 private:
  struct Entry {
    std::string option, path, target, tmp;  // target: `path` with its symbolic links followed
  };
  std::vector<Entry> staged_;
  std::vector<std::unique_ptr<TempGuard>> guards_;
};

/// Read a whole file of at most `maxBytes`; throws IoError naming the path when it cannot be read, and
/// ParseError when it is longer (so that /dev/zero or a runaway pipe cannot exhaust memory).
std::string readFile(const std::string& path, std::size_t maxBytes = kMaxJsonBytes);

}  // namespace mk
