# Run at build time (cmake -P, from the mk_build_commit_source target of cmake/MkBuildCommit.cmake): write OUT, a
# source defining mk::buildCommit() as the commit of SRC ("<sha>-dirty" when tracked files differ, "unknown"
# outside git), and leave it untouched when that is what it already says, so that a rebuild recompiles and relinks
# nothing unless the commit changed.
execute_process(COMMAND git -C ${SRC} rev-parse HEAD OUTPUT_VARIABLE sha OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
execute_process(COMMAND git -C ${SRC} status --porcelain --untracked-files=no OUTPUT_VARIABLE dirty
                OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
if(NOT sha)
  set(sha "unknown")
elseif(dirty)
  string(APPEND sha "-dirty")
endif()
set(content "// Generated at build time by cmake/write_build_commit.cmake: do not edit.
#include \"mk/util/build_commit.hpp\"

const char* mk::buildCommit() noexcept { return \"${sha}\"; }
")
set(old "")
if(EXISTS "${OUT}")
  file(READ "${OUT}" old)
endif()
if(NOT old STREQUAL content)
  file(WRITE "${OUT}" "${content}")
endif()
