// mkernel — report directories written whole or not at all (report_dir.hpp).
#include "mk/validation/report_dir.hpp"

#include <fcntl.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>

#include "mk/error.hpp"

extern char** environ;

namespace mk::report {

namespace fs = std::filesystem;

namespace {

[[noreturn]] void ioError(const std::string& msg) { throw Error(ErrorCode::IoError, msg); }

}  // namespace

fs::path parentOf(const std::string& path) {
  const fs::path p = fs::path(path).lexically_normal();
  fs::path parent = p.has_filename() ? p.parent_path() : p.parent_path().parent_path();
  return parent.empty() ? fs::path(".") : parent;
}

void checkReportDir(const std::string& option, const std::string& dir, const std::string& marker,
                    const std::string& tool) {
  if (dir.empty()) return;
  std::error_code ec;
  const fs::path parent = parentOf(dir);
  if (!fs::is_directory(parent, ec))
    ioError(option + " " + dir + ": parent directory '" + parent.string() + "' does not exist");
  if (::access(parent.c_str(), W_OK) != 0)
    ioError(option + " " + dir + ": parent directory '" + parent.string() + "' is not writable");
  if (!fs::exists(dir, ec)) return;
  if (!fs::is_directory(dir, ec)) ioError(option + " " + dir + " exists and is not a directory");
  if (!fs::is_empty(dir, ec) && !fs::exists(fs::path(dir) / marker, ec))
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
  const fs::path target = fs::path(dir).lexically_normal();
  std::string name = target.has_filename() ? target.filename().string() : target.parent_path().filename().string();
  std::string tmpl = (parentOf(dir) / ("." + name + "." + tag + "-XXXXXX")).string();
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
  const fs::path target = fs::path(dir).lexically_normal();
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
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&fa, 1, 2);
  pid_t pid = 0;
  std::fflush(nullptr);
  const int rc = posix_spawn(&pid, python.c_str(), &fa, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  if (rc != 0) ioError(option + ": cannot run " + python + ": " + std::strerror(rc));
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
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

}  // namespace mk::report
