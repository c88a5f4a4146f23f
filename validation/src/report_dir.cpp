// mkernel — report directories written whole or not at all (report_dir.hpp).
#include "mk/validation/report_dir.hpp"

#include <fcntl.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <fstream>

#include "mk/error.hpp"
#include "mk/io/output_paths.hpp"
#include "mk/schedule/io.hpp"

extern char** environ;

namespace mk::report {

namespace fs = std::filesystem;

namespace {

[[noreturn]] void ioError(const std::string& msg) { throw Error(ErrorCode::IoError, msg); }

/// ".<name>.<tag>-": how the temporary directories of report directory `target` begin (also for "rep/").
std::string tempPrefix(const fs::path& target, const char* tag) {
  const fs::path t = target.lexically_normal();
  const std::string name = t.has_filename() ? t.filename().string() : t.parent_path().filename().string();
  return "." + name + "." + tag + "-";
}

/// The pid in a temporary directory's name "<prefix><pid>-XXXXXX", or 0 when the name is not of that form (another
/// directory's, or one made before names held a pid: left alone, its owner is unknown).
long ownerOf(const std::string& name, const std::string& prefix) {
  if (name.compare(0, prefix.size(), prefix) != 0) return 0;
  const std::string rest = name.substr(prefix.size());
  const std::size_t dash = rest.find('-');
  if (dash == 0 || dash == std::string::npos || dash > 9 || rest.size() != dash + 7) return 0;
  long pid = 0;
  for (std::size_t i = 0; i < dash; ++i) {
    if (rest[i] < '0' || rest[i] > '9') return 0;
    pid = pid * 10 + (rest[i] - '0');
  }
  return pid;
}

/// The process is gone: kill answers ESRCH (EPERM means it lives, under another user). A process of another pid
/// namespace looks gone too; runs in different containers do not share a report's parent directory.
bool processGone(long pid) { return pid > 0 && ::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH; }

/// In the forked child: report which step failed (and errno) through the error pipe, and end. Async-signal-safe.
[[noreturn]] void childFailed(int fd, int step) {
  const int report[2] = {step, errno};
  const ssize_t ignored = ::write(fd, report, sizeof report);
  (void)ignored;
  ::_exit(127);
}

}  // namespace

void removeStaleTempDirs(const std::string& target) {
  if (target.empty()) return;
  const fs::path report = fs::path(target).lexically_normal();
  for (const char* tag : {"tmp", "old"}) {
    const std::string prefix = tempPrefix(report, tag);
    std::error_code ec;
    for (fs::directory_iterator it(parentOf(target), ec), end; !ec && it != end; it.increment(ec)) {
      const long pid = ownerOf(it->path().filename().string(), prefix);
      std::error_code ignored;
      if (pid == 0 || pid == ::getpid() || !fs::is_directory(fs::symlink_status(it->path(), ignored)) ||
          !processGone(pid))
        continue;
      // A run killed between moving the previous report away and moving its own into place left no report: the
      // previous one goes back rather than away.
      if (std::strcmp(tag, "old") == 0 && !fs::exists(fs::symlink_status(report, ignored)) &&
          ::rename(it->path().c_str(), report.c_str()) == 0)
        continue;
      fs::remove_all(it->path(), ignored);
    }
  }
}

fs::path parentOf(const std::string& path) {
  const fs::path p = fs::path(path).lexically_normal();
  fs::path parent = p.has_filename() ? p.parent_path() : p.parent_path().parent_path();
  return parent.empty() ? fs::path(".") : parent;
}

void checkReportDir(const std::string& option, const std::string& dir, const std::string& marker,
                    const std::string& tool) {
  if (dir.empty()) return;
  std::error_code ec;
  const std::string target = resolveOutputTarget(dir);  // a symlinked report folder: its target is replaced
  const fs::path parent = parentOf(target);
  if (!fs::is_directory(parent, ec))
    ioError(option + " " + dir + ": parent directory '" + parent.string() + "' does not exist");
  if (::access(parent.c_str(), W_OK) != 0)
    ioError(option + " " + dir + ": parent directory '" + parent.string() + "' is not writable");
  removeStaleTempDirs(target);
  if (!fs::exists(target, ec)) return;
  if (!fs::is_directory(target, ec)) ioError(option + " " + dir + " exists and is not a directory");
  if (!fs::is_empty(target, ec) && !fs::exists(fs::path(target) / marker, ec))
    ioError(option + " " + dir + " is a non-empty directory that holds no previous " + tool +
            " report: choose a new or empty directory");
}

std::string defaultScript(const std::string& scriptName, const std::string& sourcePath) {
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    const fs::path installed = exe.parent_path().parent_path() / "share" / "mkernel" / scriptName;
    if (fs::exists(installed, ec)) return installed.string();
  }
  return sourcePath;
}

fs::path makeTempDir(const std::string& option, const std::string& dir, const char* tag) {
  // Next to the folder the report replaces: the target of a symbolic link (same file system for the rename).
  const std::string resolved = resolveOutputTarget(dir);
  const fs::path target = fs::path(resolved).lexically_normal();
  // The pid in the name tells a later run whether the directory's owner still lives (removeStaleTempDirs).
  std::string tmpl = (parentOf(resolved) / (tempPrefix(target, tag) + std::to_string(::getpid()) + "-XXXXXX")).string();
  if (::mkdtemp(tmpl.data()) == nullptr)
    ioError(option + " " + dir + ": cannot create a temporary directory next to it: " + std::strerror(errno));
  // mkdtemp makes it 0700; the report is an ordinary directory, so give it the mode mkdir would have.
  const mode_t mask = ::umask(0);
  ::umask(mask);
  ::chmod(tmpl.c_str(), 0777 & ~mask);
  return tmpl;
}

void installReport(const std::string& option, const fs::path& tmp, const std::string& dir) {
  std::error_code ec;
  // Through a symbolic link the link is kept and the folder it points to replaced, as for an output file.
  const fs::path target = fs::path(resolveOutputTarget(dir)).lexically_normal();
  fs::path old;
  if (fs::exists(target, ec) && !fs::is_empty(target, ec)) {
    old = makeTempDir(option, dir, "old");
    if (::rename(target.c_str(), old.c_str()) != 0)
      ioError(option + " " + dir + ": cannot move the previous report away: " + std::strerror(errno));
  }
  if (::rename(tmp.c_str(), target.c_str()) != 0) {
    const int err = errno;
    if (!old.empty()) ::rename(old.c_str(), target.c_str());
    ioError(option + " " + dir + ": cannot move the report into place: " + std::strerror(err));
  }
  if (!old.empty()) fs::remove_all(old, ec);
}

void runScript(const std::string& option, const std::string& python, const std::string& script,
               const std::vector<std::string>& args, const std::string& log) {
  std::vector<std::string> all = {python, script};
  all.insert(all.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : all) argv.push_back(a.data());
  argv.push_back(nullptr);
  // fork, not posix_spawn: the child must ask to die with this process (PR_SET_PDEATHSIG) before Python starts, so a
  // tool killed with -9 leaves no report script running. This process may have threads: between fork and exec only
  // async-signal-safe calls, on data prepared here. What fails before exec comes back through a close-on-exec pipe
  // (a successful exec closes it with nothing written).
  const char* const pythonPath = python.c_str();
  const char* const logPath = log.c_str();
  int errPipe[2];
  if (::pipe2(errPipe, O_CLOEXEC) != 0) ioError(option + ": cannot run " + python + ": " + std::strerror(errno));
  const pid_t parent = ::getpid();
  std::fflush(nullptr);
  const pid_t pid = ::fork();
  if (pid < 0) {
    const int err = errno;
    ::close(errPipe[0]);
    ::close(errPipe[1]);
    ioError(option + ": cannot run " + python + ": " + std::strerror(err));
  }
  if (pid == 0) {
    // The signal comes when the forking thread ends: this one, which waits for the child below.
    if (::prctl(PR_SET_PDEATHSIG, SIGKILL) != 0) childFailed(errPipe[1], 0);
    if (::getppid() != parent) ::_exit(127);  // the tool died before prctl: nobody waits for this report
    const int fd = ::open(logPath, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0 || ::dup2(fd, 1) < 0 || ::dup2(fd, 2) < 0) childFailed(errPipe[1], 1);
    if (fd > 2) ::close(fd);
    ::execve(pythonPath, argv.data(), environ);
    childFailed(errPipe[1], 2);
  }
  ::close(errPipe[1]);
  int report[2] = {0, 0};
  ssize_t got = 0;
  while ((got = ::read(errPipe[0], report, sizeof report)) < 0 && errno == EINTR) {
  }
  ::close(errPipe[0]);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (got == static_cast<ssize_t>(sizeof report)) {
    const std::string what = report[0] == 0   ? "cannot tie " + python + " to this process"
                             : report[0] == 1 ? "cannot open the log " + log + " for " + python
                                              : "cannot run " + python;
    ioError(option + ": " + what + ": " + std::strerror(report[1]));
  }
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return;
  std::ifstream in(log);
  std::string line, last;
  while (std::getline(in, line))
    if (!line.empty()) last = line;
  const int code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  throw Error(ErrorCode::Unsupported, option + ": " + script + " (run by " + python + ") failed with exit " +
                                          std::to_string(code) + ": " + (last.empty() ? "no output" : last));
}

StagedReport::StagedReport(std::string option, std::string dir, std::string marker, std::string tool)
    : option_(std::move(option)), dir_(std::move(dir)), marker_(std::move(marker)), tool_(std::move(tool)) {}

StagedReport::~StagedReport() {
  std::error_code ec;
  if (!stage_.empty()) fs::remove_all(stage_, ec);
}

void StagedReport::write(const std::vector<std::pair<std::string, std::string>>& files) {
  if (!active()) return;
  stage_ = makeTempDir(option_, dir_, "tmp");
  guard_.emplace(stage_.string(), true);
  for (const auto& [name, text] : files) writeFileAtomic((stage_ / name).string(), text);
  writeFileAtomic((stage_ / marker_).string(), "written by " + tool_ + "; a new report may replace this directory\n");
}

void StagedReport::render(const std::string& python, const std::string& script, const std::string& jsonName) {
  if (!active()) return;
  const std::string log = (stage_ / "report.log").string();
  runScript(option_, python, script, {"--json", (stage_ / jsonName).string(), "--out", stage_.string()}, log);
  std::error_code ec;
  fs::remove(log, ec);
}

void StagedReport::install() {
  if (!active()) return;
  installReport(option_, stage_, dir_);
  stage_.clear();
  guard_.reset();
}

}  // namespace mk::report
