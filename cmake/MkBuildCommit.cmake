# mk::build_commit: mk::buildCommit() (models/include/mk/util/build_commit.hpp), the commit the tools put into
# measurement files, profiles, plans and validation results. Read at build time, not at configure time: a commit
# made after cmake ran still reaches the next build. The source is regenerated on every build but rewritten only
# when the commit changes (cmake/write_build_commit.cmake), so rebuilds stay incremental.
set(mk_build_commit_cpp ${CMAKE_BINARY_DIR}/generated/mk_build_commit.cpp)
add_custom_target(mk_build_commit_source
  COMMAND ${CMAKE_COMMAND} -DSRC=${PROJECT_SOURCE_DIR} -DOUT=${mk_build_commit_cpp}
          -P ${CMAKE_CURRENT_LIST_DIR}/write_build_commit.cmake
  BYPRODUCTS ${mk_build_commit_cpp}
  COMMENT "mkernel: build commit"
  VERBATIM)
add_library(mk_build_commit STATIC ${mk_build_commit_cpp})
add_library(mk::build_commit ALIAS mk_build_commit)
add_dependencies(mk_build_commit mk_build_commit_source)
target_include_directories(mk_build_commit PUBLIC $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}/models/include>)
set_target_properties(mk_build_commit PROPERTIES POSITION_INDEPENDENT_CODE ON)
