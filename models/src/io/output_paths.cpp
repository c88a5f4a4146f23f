// mkernel — the one check that a command's outputs are pairwise apart, and where writing through a symbolic link
// lands (mk/io/output_paths.hpp).
#include "mk/io/output_paths.hpp"

#include <sys/stat.h>

#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

#include "mk/error.hpp"

namespace mk {

namespace fs = std::filesystem;

namespace {

/// Linux's own limit on links followed in one lookup (MAXSYMLINKS).
constexpr int kMaxLinks = 40;

/// `p` without a trailing separator ("rep/" and "rep" are one folder).
fs::path withoutTrailingSlash(fs::path p) {
  while (!p.empty() && !p.has_filename() && p.has_relative_path()) p = p.parent_path();
  return p;
}

/// The ways one output path is compared with the others.
struct Spelling {
  fs::path lexical;  ///< absolute, ".", ".." and repeated slashes resolved on the text
  fs::path real;     ///< the symbolic links of its existing part resolved as the kernel would (empty: unknown)
  bool exists = false;
  dev_t dev = 0;
  ino_t ino = 0;
};

Spelling spell(const std::string& path) {
  Spelling s;
  std::error_code ec;
  const fs::path target = resolveOutputTarget(path);
  const fs::path abs = fs::absolute(target, ec);
  s.lexical = withoutTrailingSlash((ec ? target : abs).lexically_normal());
  // weakly_canonical resolves the longest existing prefix as the kernel does (a symlinked parent, then "..").
  const fs::path real = fs::weakly_canonical(ec ? target : abs, ec);
  if (!ec) s.real = withoutTrailingSlash(real.lexically_normal());
  struct stat st {};
  if (::stat(target.c_str(), &st) == 0) {
    s.exists = true;
    s.dev = st.st_dev;
    s.ino = st.st_ino;
  }
  return s;
}

/// True when `inner` is `outer` followed by at least one more component.
bool isInside(const fs::path& inner, const fs::path& outer) {
  if (inner.empty() || outer.empty()) return false;
  auto o = outer.begin();
  auto i = inner.begin();
  for (; o != outer.end(); ++o, ++i)
    if (i == inner.end() || *i != *o) return false;
  return i != inner.end();
}

bool same(const Spelling& a, const Spelling& b) {
  if (a.lexical == b.lexical) return true;
  if (!a.real.empty() && a.real == b.real) return true;
  return a.exists && b.exists && a.dev == b.dev && a.ino == b.ino;
}

bool inside(const Spelling& inner, const Spelling& outer) {
  return isInside(inner.lexical, outer.lexical) || isInside(inner.real, outer.real);
}

std::string named(const OutputPath& o) { return o.option + " " + o.path; }

}  // namespace

std::string resolveOutputTarget(const std::string& path) {
  fs::path p(path);
  for (int hops = 0; hops < kMaxLinks; ++hops) {
    // "rep/" names the link "rep" too (a folder output); a path that is no link is returned as given.
    const fs::path bare = withoutTrailingSlash(p);
    std::error_code ec;
    if (!fs::is_symlink(fs::symlink_status(bare, ec)) || ec) return p.string();
    const fs::path to = fs::read_symlink(bare, ec);
    if (ec) return p.string();
    p = to.is_absolute() ? to : bare.parent_path() / to;
  }
  throw Error(ErrorCode::IoError, path + ": too many levels of symbolic links (a loop?): cannot write through it");
}

void checkDistinctOutputs(const std::vector<OutputPath>& outputs) {
  std::vector<const OutputPath*> given;
  std::vector<Spelling> spellings;
  for (const OutputPath& o : outputs) {
    if (o.path.empty()) continue;
    given.push_back(&o);
    spellings.push_back(spell(o.path));
  }
  for (std::size_t a = 0; a < given.size(); ++a) {
    for (std::size_t b = a + 1; b < given.size(); ++b) {
      const OutputPath& x = *given[a];
      const OutputPath& y = *given[b];
      if (same(spellings[a], spellings[b]))
        throw Error(ErrorCode::InvalidArgument,
                    named(x) + " and " + named(y) +
                        ": both name the same path, so one output would replace the other; give each its own path");
      for (const auto& [in, out] : {std::pair{a, b}, std::pair{b, a}}) {
        if (!inside(spellings[in], spellings[out])) continue;
        const OutputPath& inner = *given[in];
        const OutputPath& outer = *given[out];
        throw Error(ErrorCode::InvalidArgument,
                    named(inner) + " and " + named(outer) + ": the first lies inside the second, " +
                        (outer.kind == OutputKind::Folder ? "a folder this command writes" : "an output file") +
                        ", so one output would replace or remove the other; give " + inner.option +
                        " a path outside it");
      }
    }
  }
}

}  // namespace mk
