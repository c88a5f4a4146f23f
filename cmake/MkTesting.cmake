# mk_add_doctest(<target> LABELS <l>... SOURCES <src>... [LIBS <lib>...] [GPU])
#
# One doctest executable per area. Every source file of SOURCES that defines test cases becomes one CTest test,
# "<target>: <file stem>", carrying LABELS: the binary run with --source-file=*/<file>. One process per file, not
# per case: under CI's sanitizers a test binary's start costs 0.1 to 0.2 s of CPU, and ~800 per-case starts were a
# tenth of CI's test time (docs/journal/robustness.md, "CI time"). A failing case is named in the test's output;
# run one case with the binary's own filter (`mk_models_tests -tc='name*'`). The mains fail a run whose filters
# match no case (cmake/doctest_case_counter.hpp), so a file whose cases all vanished cannot pass. GPU test
# binaries use impl's gpu_test_main, which lists tests without touching CUDA and exits 77 (reported as skipped)
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
  mk_sanitize_thin(mk_doctest_main)
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
  if(NOT T_GPU)
    mk_sanitize_thin(${target})
  endif()
  target_include_directories(${target} PRIVATE ${PROJECT_SOURCE_DIR}/cmake)  # doctest_case_counter.hpp
  set(props LABELS "${T_LABELS}" TIMEOUT 600)
  if(T_GPU)
    list(APPEND props SKIP_RETURN_CODE 77)
  endif()
  foreach(src IN LISTS T_SOURCES)
    get_filename_component(path "${src}" ABSOLUTE)
    file(STRINGS "${path}" cases REGEX "^[ \t]*(TEST_CASE|SCENARIO)")
    if(NOT cases)
      continue()  # a main, a fixture or a helper compiled into the binary: no test of its own
    endif()
    get_filename_component(file "${src}" NAME)
    get_filename_component(stem "${src}" NAME_WE)
    list(LENGTH cases n)
    add_test(NAME "${target}: ${stem}" COMMAND ${target} "--source-file=*/${file}")
    # COST: the file's number of cases, so that CTest starts the large files first on a fresh machine.
    set_tests_properties("${target}: ${stem}" PROPERTIES ${props} COST ${n})
  endforeach()
endfunction()
