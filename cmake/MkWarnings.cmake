# mk::warnings — one INTERFACE target carrying the project's warning flags (C++ and, where built, CUDA host code).
add_library(mk_warnings INTERFACE)
add_library(mk::warnings ALIAS mk_warnings)
target_compile_options(mk_warnings INTERFACE
  $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wpedantic -Wshadow -Wconversion -Wno-sign-conversion -Wnon-virtual-dtor -Wold-style-cast -Woverloaded-virtual>
  $<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-Wall,-Wextra --Werror=cross-execution-space-call>)
if(MK_WERROR)
  # Build tree only: an installed mk::warnings must not turn a user's warnings into errors. CUDA: the host
  # compiler's warnings (-Xcompiler) and nvcc's own, the front end's and ptxas's (--Werror=all-warnings).
  target_compile_options(mk_warnings INTERFACE
    $<BUILD_INTERFACE:$<$<COMPILE_LANGUAGE:CXX>:-Werror>>
    "$<BUILD_INTERFACE:$<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-Werror;--Werror=all-warnings>>")
endif()
install(TARGETS mk_warnings EXPORT mkernelTargets)
