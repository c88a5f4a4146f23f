# impl/ — mk_cuda_targets: the CUDA engine's libraries and tools, mk::impl and every target that links it (mk-bench,
# the probes) but the test binaries (*_tests: built and run where there is a GPU). CI builds it with warnings as
# errors (scripts/ci-cuda) without the CUDA-free targets its sanitized build already covers, and without the GPU
# tests, which would double that build's time. Collected once impl/ has been read to its end (a deferred call), so
# a target added after this file counts too.
function(mk_collect_cuda_targets)
  get_property(targets DIRECTORY ${CMAKE_CURRENT_SOURCE_DIR} PROPERTY BUILDSYSTEM_TARGETS)
  set(cuda_targets mk_impl)
  foreach(target IN LISTS targets)
    get_target_property(libs ${target} LINK_LIBRARIES)
    if(libs AND "mk::impl" IN_LIST libs AND NOT target MATCHES "_tests$")
      list(APPEND cuda_targets ${target})
    endif()
  endforeach()
  if(MK_CI_CUDA_O0)
    foreach(target IN LISTS cuda_targets)
      if(NOT target STREQUAL "mk_impl")
        target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-O0>)
      endif()
    endforeach()
  endif()
  add_custom_target(mk_cuda_targets)
  add_dependencies(mk_cuda_targets ${cuda_targets})
endfunction()
cmake_language(DEFER CALL mk_collect_cuda_targets)

# MK_CI_CUDA_O0 (scripts/ci-cuda turns it on): in this build, the CUDA-free libraries the engine links (mk::models,
# mk::host) and the host (C++) sources of its tools (mk-bench, the probes) compile at -O0, after the build type's
# flags, so it wins. CI's CUDA build compiles and links them and runs nothing; its sanitized build compiles the
# libraries' sources with warnings as errors (at -O1) and tests them. What -O0 gives up here: the warnings GCC finds
# only when optimising (-Wmaybe-uninitialized, -Warray-bounds and -Wstringop-* after inlining), which the developers'
# Release build still prints. The engine (its device code and its host files) and the tools' CUDA sources keep the
# build type's optimisation: ptxas's spill and register warnings are what this build is for. The tools' host files
# were a third of this build's CPU time (mk-bench's CLI11 fronts, 40 to 60 s each at -O3).
option(MK_CI_CUDA_O0 "Compile mk::models, mk::host and the CUDA tools' C++ files at -O0 (a build linked, not run)" OFF)
if(MK_CI_CUDA_O0)
  target_compile_options(mk_host PRIVATE -O0)
  target_compile_options(mk_models PRIVATE -O0)
endif()
