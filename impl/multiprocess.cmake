# impl/ — one process per GPU: bootstrap (TCP rendezvous, MPI), cross-process memory, tests.
# The launch variables and the one choice of rendezvous and GPU, the TCP rendezvous (torchrun-style variables;
# Open MPI / PMI rank variables accepted) and the shared state of one process per GPU.
target_sources(mk_impl PRIVATE
  ${CMAKE_CURRENT_SOURCE_DIR}/src/bootstrap/launch.cpp
  ${CMAKE_CURRENT_SOURCE_DIR}/src/bootstrap/tcp_bootstrap.cpp
  ${CMAKE_CURRENT_SOURCE_DIR}/src/engine/process_link.cpp)

# MPI bootstrap (mpirun -np N without MASTER_ADDR): MK_WITH_MPI (top CMakeLists) AUTO builds it when an MPI
# library is found, ON requires one, OFF never. MPI's C API is found through the C++ compiler (the CXX
# component, C++ bindings skipped): the project enables no C language, and neither need its consumers
# (mkernelConfig.cmake finds the same component). Without MPI a stub throws Error(Unsupported).
set(mk_mpi_found OFF)
if(NOT MK_WITH_MPI STREQUAL "OFF")
  set(MPI_CXX_SKIP_MPICXX ON)
  find_package(MPI COMPONENTS CXX)
  if(MPI_CXX_FOUND)
    set(mk_mpi_found ON)
  elseif(MK_WITH_MPI STREQUAL "ON")
    message(FATAL_ERROR "MK_WITH_MPI=ON but no MPI library was found (apt-get install libopenmpi-dev openmpi-bin, "
                        "or use AUTO/OFF)")
  endif()
endif()
# The top CMakeLists configures mkernelConfig.cmake with it (find_dependency(MPI) when the build used MPI).
set(MK_HAVE_MPI ${mk_mpi_found} PARENT_SCOPE)
message(STATUS "mkernel: MPI bootstrap ${mk_mpi_found}")
if(mk_mpi_found)
  target_sources(mk_impl PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/src/bootstrap/bootstrap_mpi.cpp)
  target_link_libraries(mk_impl PRIVATE MPI::MPI_CXX)
else()
  target_sources(mk_impl PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/src/bootstrap/bootstrap_mpi_stub.cpp)
endif()
# shm_open / shm_unlink live in librt on older glibc.
find_library(MK_LIBRT rt)
if(MK_LIBRT)
  target_link_libraries(mk_impl PRIVATE ${MK_LIBRT})
endif()

# CPU tests of the bootstrap (forked processes on 127.0.0.1) and of the NVLink probe's topology update:
# label unit, run everywhere.
mk_add_doctest(mk_bootstrap_tests LABELS unit
  SOURCES tests/unit_main.cpp tests/test_bootstrap.cpp tests/test_topology_probe.cpp LIBS mk::impl)
if(TARGET mk_bootstrap_tests)
  target_include_directories(mk_bootstrap_tests PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/src)
endif()

# GPU tests of the multi-process mode: the binary re-launches itself as 2 ranks (label multigpu).
mk_add_doctest(mk_multiprocess_tests LABELS multigpu GPU
  SOURCES tests/gpu_test_main.cpp tests/test_multiprocess_gpu.cpp LIBS mk::impl)
if(TARGET mk_multiprocess_tests)
  target_compile_definitions(mk_multiprocess_tests PRIVATE MK_TEST_MIN_GPUS=2)
  target_include_directories(mk_multiprocess_tests PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/src)
endif()

# The MPI bootstrap: each TEST_CASE of mk_mpi_bootstrap_tests is collective, so each runs as one CTest under
# `mpirun -np 3` (the script skips with 77 when mpirun is absent). Without MPI the binary checks the stub
# (makeMpiBootstrap throws Unsupported) and runs directly. Label unit: CPU only, run in CI (as root there,
# hence --allow-run-as-root).
if(MK_BUILD_TESTS)
  add_executable(mk_mpi_bootstrap_tests tests/unit_main.cpp tests/test_mpi_bootstrap.cpp)
  target_link_libraries(mk_mpi_bootstrap_tests PRIVATE doctest::doctest mk::impl mk::warnings)
  target_compile_options(mk_mpi_bootstrap_tests PRIVATE "SHELL:-include ${PROJECT_SOURCE_DIR}/cmake/doctest_prelude.hpp")
  if(mk_mpi_found)
    target_compile_definitions(mk_mpi_bootstrap_tests PRIVATE MK_TEST_MPI=1)
    set(mk_mpi_cases
      "mpi bootstrap: the build has MPI and rank and size match mpirun"
      "mpi bootstrap: allGather returns the bytes of every rank in rank order"
      "mpi bootstrap: barrier returns only once every rank has arrived"
      "mpi bootstrap: a rank that skips allGather ends in Timeout within the budget"
      "mpi bootstrap: a rank that skips barrier ends in Timeout within the budget"
      "mpi bootstrap: different byte counts are rejected on every rank")
    foreach(tc IN LISTS mk_mpi_cases)
      add_test(NAME "${tc}" COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/tests/run_mpi_test.sh "${MPIEXEC_EXECUTABLE}" 3
                                    $<TARGET_FILE:mk_mpi_bootstrap_tests> "${tc}")
      set_tests_properties("${tc}" PROPERTIES LABELS unit TIMEOUT 120 SKIP_RETURN_CODE 77)
    endforeach()
  else()
    doctest_discover_tests(mk_mpi_bootstrap_tests PROPERTIES LABELS unit TIMEOUT 60 ADD_LABELS 0)
  endif()
  # The GPU engine under mpirun: the multi-process test cases, launched as `mpirun -np 2` instead of
  # re-launching themselves (multiprocess_launch.hpp: isRankProcess), so Communicator::createFromEnvironment
  # bootstraps through MPI. Skipped (77) where there are fewer than 2 GPUs. "A peer process that dies" is left
  # out: mpirun itself tears the job down when a rank dies.
  if(mk_mpi_found AND TARGET mk_multiprocess_tests)
    set(mk_mpi_gpu_cases
      "multiprocess: allreduce every dtype redop count in and out of place"
      "multiprocess: allgather every dtype count in and out of place"
      "multiprocess: reducescatter every dtype redop count in and out of place"
      "multiprocess: broadcast every dtype count in and out of place"
      "multiprocess: alltoall every dtype count in and out of place"
      "multiprocess: 256 MiB of every collective"
      "multiprocess: back-to-back ops in a group reuse buffers"
      "multiprocess: a peer that never submits yields an error within budget"
      "multiprocess: ranks submitting different ops get an error naming both")
    foreach(tc IN LISTS mk_mpi_gpu_cases)
      string(REPLACE "multiprocess: " "mpirun: " name "${tc}")
      add_test(NAME "${name}" COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/tests/run_mpi_test.sh "${MPIEXEC_EXECUTABLE}" 2
                                      $<TARGET_FILE:mk_multiprocess_tests> "${tc}")
      set_tests_properties("${name}" PROPERTIES LABELS multigpu TIMEOUT 120 SKIP_RETURN_CODE 77)
    endforeach()
  endif()
endif()
