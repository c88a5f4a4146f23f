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
  add_custom_target(mk_cuda_targets)
  add_dependencies(mk_cuda_targets ${cuda_targets})
endfunction()
cmake_language(DEFER CALL mk_collect_cuda_targets)
