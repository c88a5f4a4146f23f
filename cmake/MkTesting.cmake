# mk_add_doctest(<target> LABELS <l>... SOURCES <src>... [LIBS <lib>...] [GPU])
#
# One doctest executable per area. Every TEST_CASE becomes a CTest test carrying LABELS. GPU test binaries
# use impl's gpu_test_main, which lists tests without touching CUDA and exits 77 (reported as skipped)
# when no GPU is present: SKIP_RETURN_CODE 77 is set on every test of a GPU executable.
if(MK_BUILD_TESTS)
  find_package(doctest REQUIRED)
  include("${doctest_DIR}/doctest.cmake")
  enable_testing()
  # doctest's implementation and main(), compiled once for every CPU test binary (it takes as long to compile as
  # a large test file, and the build is CI's biggest cost).
  add_library(mk_doctest_main OBJECT ${PROJECT_SOURCE_DIR}/cmake/doctest_main.cpp)
  target_link_libraries(mk_doctest_main PUBLIC doctest::doctest PRIVATE mk::warnings)
  target_compile_options(mk_doctest_main PRIVATE "SHELL:-include ${PROJECT_SOURCE_DIR}/cmake/doctest_prelude.hpp")
endif()
function(mk_add_doctest target)
  cmake_parse_arguments(T "GPU" "" "LABELS;SOURCES;LIBS" ${ARGN})
  if(NOT MK_BUILD_TESTS)
    return()
  endif()
  add_executable(${target} ${T_SOURCES})
  target_link_libraries(${target} PRIVATE doctest::doctest ${T_LIBS} mk::warnings)
  if(NOT T_GPU)
    target_link_libraries(${target} PRIVATE mk_doctest_main)  # GPU binaries bring gpu_test_main's main()
  endif()
  # See doctest_prelude.hpp: lets CHECK(a == b) print mkernel enums by name.
  target_compile_options(${target} PRIVATE "SHELL:-include ${PROJECT_SOURCE_DIR}/cmake/doctest_prelude.hpp")
  set(props LABELS "${T_LABELS}" TIMEOUT 600)
  if(T_GPU)
    list(APPEND props SKIP_RETURN_CODE 77)
  endif()
  doctest_discover_tests(${target} PROPERTIES ${props} ADD_LABELS 0)
endfunction()
