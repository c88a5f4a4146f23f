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
  # which keeps CI's second build short; line tables are all a sanitizer's stack trace needs.
  add_compile_options(-fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer -O1 -g1)
  add_link_options(-fsanitize=address,undefined)
  message(STATUS "mkernel: AddressSanitizer + UndefinedBehaviorSanitizer ON")
endif()

# MK_WERROR: warnings are errors (CI turns it on; off by default so that a newer compiler's new warning does not
# stop a user's build).
option(MK_WERROR "Treat compiler warnings as errors" OFF)
