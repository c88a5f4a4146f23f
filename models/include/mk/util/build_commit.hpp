// mkernel — the commit a tool was built from, for the provenance of what it writes. Defined in a source generated
// at build time (cmake/MkBuildCommit.cmake): link mk::build_commit.
#pragma once

namespace mk {

/// "<sha>" of the source tree at the last build, "<sha>-dirty" when tracked files differed, "unknown" outside git.
const char* buildCommit() noexcept;

}  // namespace mk
