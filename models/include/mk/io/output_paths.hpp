// mkernel — the outputs of one command must not collide: two options naming the same file, or a file inside a
// folder another option replaces whole, would let one output replace or remove another after the work is done
// (the tool then reports a failure with a target already replaced). Checked once, right after parsing.
#pragma once

#include <string>
#include <vector>

namespace mk {

/// What an output option writes: one file, or a folder the tool fills and replaces whole (a --report, a --cache).
enum class OutputKind { File, Folder };

/// One output of a command as the user gave it.
struct OutputPath {
  std::string option;  ///< the option that names it, e.g. "--json"
  std::string path;    ///< as given; empty: not given (skipped)
  OutputKind kind = OutputKind::File;
};

/// Every tool's check, after parsing and before any work, that its outputs are pairwise apart: no two name the
/// same file or folder, and none lies inside another. Paths are compared after resolving ".", ".." and repeated
/// slashes lexically, again after resolving the symbolic links of their existing parts (and of a symlinked output
/// itself, which is written through: see resolveOutputTarget), and by device and inode where both exist (hard
/// links). Throws Error(InvalidArgument) "<option> <path> and <option> <path>: ..." naming both (exit 2). Empty
/// paths are skipped.
void checkDistinctOutputs(const std::vector<OutputPath>& outputs);

/// Where writing `path` lands: `path` itself, or, when it is a symbolic link, the file it finally points to
/// (followed link by link, relative links from the link's folder), as `cp` and shell redirection do. An atomic
/// write renames onto this target, so the link is kept and its target replaced; a dangling link's target is
/// created. Throws Error(IoError) naming `path` when the links loop.
std::string resolveOutputTarget(const std::string& path);

}  // namespace mk
