# impl/ — one process per GPU: bootstrap (TCP rendezvous, MPI), cross-process memory, tests.
# TCP rendezvous (torchrun-style variables; Open MPI / PMI rank variables accepted) and the shared state of
# one process per GPU. No MPI library is needed: under mpirun the rank variables come from the launcher.
target_sources(mk_impl PRIVATE
  ${CMAKE_CURRENT_SOURCE_DIR}/src/runtime/bootstrap.cpp
  ${CMAKE_CURRENT_SOURCE_DIR}/src/runtime/process_link.cpp
  ${CMAKE_CURRENT_SOURCE_DIR}/src/runtime/topology_probe.cpp)
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
