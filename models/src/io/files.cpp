// mkernel — the file helpers every tool shares (mk/schedule/io.hpp): read a whole file, write one atomically,
// and the one check of an output path (not a device, FIFO or directory; not one of the command's inputs).
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "mk/error.hpp"
#include "mk/schedule/io.hpp"

namespace mk {

std::string readFile(const std::string& path, std::size_t maxBytes) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(ErrorCode::IoError, "cannot open '" + path + "' for reading: " + std::strerror(errno));
  std::string out;
  std::vector<char> buf(std::size_t{1} << 20);
  while (in) {
    in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
    out.append(buf.data(), static_cast<std::size_t>(in.gcount()));
    if (out.size() > maxBytes)
      throw Error(ErrorCode::ParseError,
                  path + ": longer than the limit of " + std::to_string(maxBytes) + " bytes for this kind of file");
  }
  if (in.bad()) throw Error(ErrorCode::IoError, "error while reading '" + path + "'");
  return out;
}

namespace {

/// "" when `path` may be replaced by a rename (absent, or a regular file), else what it is.
std::string nonRegularKind(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);  // follows links: a link to /dev/null is refused too
  if (ec || !fs::exists(st) || fs::is_regular_file(st)) return {};
  if (fs::is_directory(st)) return "a directory";
  if (fs::is_fifo(st)) return "a FIFO";
  if (fs::is_character_file(st) || fs::is_block_file(st)) return "a device";
  if (fs::is_socket(st)) return "a socket";
  return "not a regular file";
}

}  // namespace

void checkOutputPath(const std::string& option, const std::string& path, const std::vector<std::string>& inputs) {
  namespace fs = std::filesystem;
  if (path.empty()) return;
  const fs::path p(path);
  std::error_code ec;
  const fs::path dir = p.has_parent_path() ? p.parent_path() : fs::path(".");
  if (!fs::is_directory(dir, ec))
    throw Error(ErrorCode::IoError, option + " " + path + ": directory '" + dir.string() + "' does not exist");
  const std::string kind = nonRegularKind(path);
  if (!kind.empty())
    throw Error(ErrorCode::InvalidArgument,
                option + " " + path + ": is " + kind + "; an output must be a regular file or a new path");
  for (const std::string& in : inputs) {
    if (!in.empty() && fs::equivalent(p, fs::path(in), ec))
      throw Error(ErrorCode::InvalidArgument,
                  option + " " + path + ": is also an input of this command (" + in + "); it would be overwritten");
  }
}

void writeFileAtomic(const std::string& path, const std::string& text) {
  if (const std::string kind = nonRegularKind(path); !kind.empty())
    throw Error(ErrorCode::IoError, "cannot write '" + path + "': it is " + kind + ", not a regular file");
  const std::string tmp = path + ".tmp." + std::to_string(static_cast<long>(::getpid()));
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  if (f == nullptr)
    throw Error(ErrorCode::IoError,
                "cannot write '" + path + "': cannot create temporary file '" + tmp + "': " + std::strerror(errno));
  bool ok = std::fwrite(text.data(), 1, text.size(), f) == text.size();
  int err = ok ? 0 : errno;
  if (ok && std::fflush(f) != 0) ok = false, err = errno;
  // fsync so that a crash after the rename cannot expose an empty file under the final name.
  if (ok && ::fsync(::fileno(f)) != 0) ok = false, err = errno;
  if (std::fclose(f) != 0 && ok) ok = false, err = errno;
  if (ok && std::rename(tmp.c_str(), path.c_str()) != 0) ok = false, err = errno;
  if (!ok) {
    std::remove(tmp.c_str());
    throw Error(ErrorCode::IoError, "cannot write '" + path + "': " + std::strerror(err));
  }
}

}  // namespace mk
