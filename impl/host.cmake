# impl/ — the host side of the engine, CUDA-free and built everywhere (so its tests run in CI and under ASan):
# the bootstrap (TCP rendezvous, MPI), the command FIFO's host side, the proxy and its transports (socket; ibverbs
# where rdma-core is found) and the CPU executor's inter-node port. The CUDA engine (mk::impl) links it.
add_library(mk_host STATIC
  src/bootstrap/job_key.cpp
  src/bootstrap/launch.cpp
  src/bootstrap/tcp_bootstrap.cpp
  src/bootstrap/tcp_rendezvous.cpp
  src/net/socket_util.cpp
  # the proxy: FIFO host side, consumer threads, wire protocol, socket transport, transport choice
  src/proxy/fifo.cpp
  src/proxy/memory.cpp
  src/proxy/proxy.cpp
  src/proxy/wire.cpp
  src/proxy/socket_setup.cpp
  src/proxy/socket_stream.cpp
  src/proxy/socket_transport.cpp
  src/proxy/transport.cpp
  src/proxy/exec_port.cpp
  # ibverbs: the per-peer slot protocol builds everywhere (it talks to verbs_api.hpp only, and its unit test runs
  # it over an in-memory double); the rdma-core calls and the transport only with libibverbs
  src/proxy/ib/ib_peer.cpp)
add_library(mk::host ALIAS mk_host)
set_target_properties(mk_host PROPERTIES EXPORT_NAME host)
target_include_directories(mk_host PUBLIC
  $<BUILD_INTERFACE:${CMAKE_CURRENT_SOURCE_DIR}/include>
  $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>
  PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/src)
# libcrypto (OpenSSL, Debian libssl-dev): HMAC-SHA256 for the rendezvous's handshake (mk/job_key.hpp).
find_package(OpenSSL REQUIRED COMPONENTS Crypto)
target_link_libraries(mk_host PUBLIC mk::models Threads::Threads PRIVATE mk::warnings OpenSSL::Crypto)
install(TARGETS mk_host EXPORT mkernelTargets
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR})

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
  target_sources(mk_host PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/src/bootstrap/bootstrap_mpi.cpp)
  target_link_libraries(mk_host PRIVATE MPI::MPI_CXX)
else()
  target_sources(mk_host PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/src/bootstrap/bootstrap_mpi_stub.cpp)
endif()

# rdma-core (libibverbs, found by pkg-config): MK_WITH_IBVERBS (top CMakeLists) AUTO builds the ibverbs transport
# when it is found, ON requires it, OFF never. Without it transport=ibverbs says so (ib_unavailable.cpp).
set(mk_ibverbs_found OFF)
if(NOT MK_WITH_IBVERBS STREQUAL "OFF")
  pkg_check_modules(IBVERBS IMPORTED_TARGET libibverbs)
  if(IBVERBS_FOUND)
    set(mk_ibverbs_found ON)
  elseif(MK_WITH_IBVERBS STREQUAL "ON")
    message(FATAL_ERROR "MK_WITH_IBVERBS=ON but libibverbs was not found by pkg-config (apt-get install "
                        "libibverbs-dev, or use AUTO/OFF)")
  endif()
endif()
set(MK_HAVE_IBVERBS ${mk_ibverbs_found} PARENT_SCOPE)
message(STATUS "mkernel: ibverbs transport ${mk_ibverbs_found}")
if(mk_ibverbs_found)
  target_sources(mk_host PRIVATE src/proxy/ib/verbs_real.cpp src/proxy/ib/ib_transport.cpp)
  target_link_libraries(mk_host PRIVATE PkgConfig::IBVERBS)
else()
  target_sources(mk_host PRIVATE src/proxy/ib_unavailable.cpp)
endif()

# mk-proxy-bench: the host half of the inter-node path measured without a GPU (docs/inter-node.md).
add_executable(mk-proxy-bench bench/proxy_bench.cpp bench/proxy_bench_pair.cpp)
target_include_directories(mk-proxy-bench PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/src)
# The commit its measurement files name: mk::build_commit (read at build time).
target_link_libraries(mk-proxy-bench PRIVATE mk::host mk::build_commit CLI11::CLI11 mk::warnings)
install(TARGETS mk-proxy-bench EXPORT mkernelTargets RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})

# CPU tests of the bootstrap (forked processes on 127.0.0.1): label unit, run everywhere.
mk_add_doctest(mk_bootstrap_tests LABELS unit
  SOURCES tests/test_bootstrap.cpp LIBS mk::host)

# The MPI bootstrap: each TEST_CASE of mk_mpi_bootstrap_tests is collective, so each runs as one CTest under
# `mpirun -np 3` (the script skips with 77 when mpirun is absent). Without MPI the binary checks the stub
# (makeMpiBootstrap throws Unsupported) and runs directly. Label unit: CPU only, run in CI (as root there,
# hence --allow-run-as-root).
if(MK_BUILD_TESTS)
  add_executable(mk_mpi_bootstrap_tests tests/test_mpi_bootstrap.cpp)
  target_link_libraries(mk_mpi_bootstrap_tests PRIVATE mk_doctest_main doctest::doctest mk::host mk::warnings)
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
endif()

# CPU tests of the inter-node path (label unit, fast): the FIFO's host side and the wire records; the socket
# transport, the proxy and the CPU executor over it between forked processes on 127.0.0.1; the faults.
mk_add_doctest(mk_proxy_tests LABELS unit
  SOURCES tests/test_fifo.cpp tests/test_wire.cpp tests/test_socket_transport.cpp
          tests/test_socket_faults.cpp tests/test_ib_peer.cpp tests/test_proxy.cpp
  LIBS mk::host)
if(TARGET mk_proxy_tests)
  target_include_directories(mk_proxy_tests PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/src)
endif()
mk_add_doctest(mk_proxy_exec_tests LABELS unit
  SOURCES tests/test_exec_multinode.cpp tests/test_exec_multinode_fused.cpp tests/test_exec_faults.cpp
          tests/test_bootstrap_hostile.cpp LIBS mk::host)
if(TARGET mk_proxy_exec_tests)
  target_include_directories(mk_proxy_exec_tests PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/src)
endif()
