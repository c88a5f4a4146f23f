# impl/ — one process per GPU: the CUDA side of it (the bootstrap itself is mk::host, host.cmake): the one choice
# of rendezvous and GPU for a rank process, the shared state of one process per GPU, tests.
target_sources(mk_impl PRIVATE
  ${CMAKE_CURRENT_SOURCE_DIR}/src/bootstrap/rank_launch.cpp
  ${CMAKE_CURRENT_SOURCE_DIR}/src/engine/process_link.cpp)
# shm_open / shm_unlink live in librt on older glibc.
find_library(MK_LIBRT rt)
if(MK_LIBRT)
  target_link_libraries(mk_impl PRIVATE ${MK_LIBRT})
endif()

# CPU tests of the CUDA-facing launch (bootstrapFromEnvironment) and of the NVLink probe's topology update: label
# unit, run everywhere the engine is built.
mk_add_doctest(mk_rank_launch_tests LABELS unit
  SOURCES tests/test_rank_launch.cpp tests/test_topology_probe.cpp LIBS mk::impl)
if(TARGET mk_rank_launch_tests)
  target_include_directories(mk_rank_launch_tests PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/src)
endif()

# GPU tests of the multi-process mode: the binary re-launches itself as 2 ranks (label multigpu).
mk_add_doctest(mk_multiprocess_tests LABELS multigpu GPU
  SOURCES tests/gpu_test_main.cpp tests/test_multiprocess_gpu.cpp LIBS mk::impl)
if(TARGET mk_multiprocess_tests)
  target_compile_definitions(mk_multiprocess_tests PRIVATE MK_TEST_MIN_GPUS=2)
  target_include_directories(mk_multiprocess_tests PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/src)
endif()

# GPU tests of the inter-node path on one GPU: rank processes as "nodes" under CUDA MPS (label gpu: one GPU).
mk_add_doctest(mk_multinode_tests LABELS gpu GPU
  SOURCES tests/gpu_test_main.cpp tests/test_multinode_gpu.cpp LIBS mk::impl)
if(TARGET mk_multinode_tests)
  target_include_directories(mk_multinode_tests PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/src)
endif()

# GPU tests of CUDA graph capture in child processes on one GPU: rank processes sharing GPU 0 under CUDA MPS (those
# cases skip without it), and a plain cudaGraphLaunch, which ends its process's CUDA context (label gpu).
mk_add_doctest(mk_graph_process_tests LABELS gpu GPU
  SOURCES tests/gpu_test_main.cpp tests/test_graph_process_gpu.cpp LIBS mk::impl)
if(TARGET mk_graph_process_tests)
  target_include_directories(mk_graph_process_tests PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/src)
endif()

if(MK_BUILD_TESTS)
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

# GPU tests of faults on one GPU: poisoned op descriptors (one process), rank processes killed mid-op (under CUDA MPS;
# those cases skip without it). Label gpu.
mk_add_doctest(mk_faults_tests LABELS gpu GPU
  SOURCES tests/gpu_test_main.cpp tests/test_faults_gpu.cpp LIBS mk::impl)
if(TARGET mk_faults_tests)
  target_include_directories(mk_faults_tests PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/src)
endif()
