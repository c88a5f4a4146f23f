# MK_SANITIZE: build everything with AddressSanitizer + UndefinedBehaviorSanitizer (CPU code only).
#
# Sanitizers must instrument every translation unit and link their runtime into every executable, so this is
# the one place that uses directory-wide add_compile_options / add_link_options instead of a target. The CUDA
# engine is refused in such a build: the CUDA runtime and the resident kernel's host-mapped memory are not
# meant to run under ASan, and compute-sanitizer covers that side (impl/tools/sanitize_suite.sh).
option(MK_SANITIZE "Build with AddressSanitizer and UndefinedBehaviorSanitizer (CPU targets; needs MK_WITH_CUDA=OFF)" OFF)
if(MK_SANITIZE)
  if(NOT MK_WITH_CUDA STREQUAL "OFF")
    message(FATAL_ERROR "MK_SANITIZE=ON builds the CPU targets only: configure with -DMK_WITH_CUDA=OFF")
  endif()
  # -fno-sanitize-recover: an undefined-behaviour report fails the test instead of scrolling past.
  # -O1 -g1 (placed after the build type's flags, so they win): about a third of the compile time of -O2 -g,
  # which keeps CI's build (a sanitized one) short; line tables are all a sanitizer's stack trace needs.
  # -fno-sanitize=null,object-size: two UBSan checks that ASan already makes at run time (a null dereference faults
  # and ASan's SEGV handler reports it with its stack; an access past its object lands in a redzone), whose inline
  # code on every dereference cost 8 to 23 % of a file's compile time (docs/journal/robustness.md, "CI time").
  add_compile_options(-fsanitize=address,undefined -fno-sanitize=null,object-size -fno-sanitize-recover=all
                      -fno-omit-frame-pointer -O1 -g1)
  # -no-pie: an instrumented position-independent executable carries a million relative relocations that the
  # loader applies at every start (a third of a test binary's start-up, docs/journal/robustness.md, "CI time"),
  # and the tests start tools and test binaries thousands of times. The sanitizers check the same either way.
  add_link_options(-fsanitize=address,undefined -no-pie)
  message(STATUS "mkernel: AddressSanitizer + UndefinedBehaviorSanitizer ON")
endif()

# mk_sanitize_thin(<target>...): in a sanitized build, compile these targets' own sources at -Og instead of -O1.
# For the test binaries and the tools' command-line front ends: code that checks and parses, whose run time is
# small next to the libraries it calls (those stay at -O1), and whose compile time is CI's largest build cost
# (doctest's and CLI11's templates: -Og compiles a large test file in about 60 % of the -O1 time). Instrumented the
# same way: the sanitizers check every access at any optimisation level.
function(mk_sanitize_thin)
  if(MK_SANITIZE)
    foreach(t IN LISTS ARGN)
      target_compile_options(${t} PRIVATE -Og)
    endforeach()
  endif()
endfunction()

# mk_sanitize_thin_sources(<source>...): the same for single sources of a library (call it in the directory that
# adds them). For the JSON and report writers among a library's sources: their compile time is large (nlohmann's
# templates) and their run time small, while the library's hot paths (the planner's search and pricing) keep -O1.
function(mk_sanitize_thin_sources)
  if(MK_SANITIZE)
    set_property(SOURCE ${ARGN} APPEND PROPERTY COMPILE_OPTIONS -Og)
  endif()
endfunction()

# MK_FUZZ: the reader fuzz targets (models/fuzz/) as libFuzzer binaries. Needs clang (Debian's clang package);
# everything is instrumented for coverage and built with ASan + UBSan, as libFuzzer wants.
option(MK_FUZZ "Build models/fuzz/ as libFuzzer targets (clang; needs MK_WITH_CUDA=OFF)" OFF)
if(MK_FUZZ)
  if(NOT CMAKE_CXX_COMPILER_ID MATCHES "Clang")
    message(FATAL_ERROR "MK_FUZZ=ON needs clang: configure with -DCMAKE_CXX_COMPILER=clang++")
  endif()
  if(NOT MK_WITH_CUDA STREQUAL "OFF")
    message(FATAL_ERROR "MK_FUZZ=ON builds the CPU targets only: configure with -DMK_WITH_CUDA=OFF")
  endif()
  add_compile_options(-fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer -g)
  add_link_options(-fsanitize=address,undefined)
  message(STATUS "mkernel: libFuzzer targets ON (ASan + UBSan)")
endif()

# MK_WERROR: warnings are errors (CI turns it on; off by default so that a newer compiler's new warning does not
# stop a user's build).
option(MK_WERROR "Treat compiler warnings as errors" OFF)
