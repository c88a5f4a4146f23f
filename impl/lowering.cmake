# impl/ — the lowering (one rank's schedule into the resident kernel's program), the GEMM tile engine's tile and
# schedule choice, and the compute lanes' op-independent parameters: pure host code without CUDA, so it is part of
# mk::host, built everywhere and unit-tested in every build (CI's sanitized one included). The CUDA engine
# (mk::impl, which links mk::host) calls the same code.
target_sources(mk_host PRIVATE src/lowering/lowering.cpp src/lowering/lowering_steps.cpp src/lowering/lowering_compute.cpp
                               src/lowering/extents.cpp src/lowering/packets.cpp
                               src/gemm/gemm_choice.cpp src/gemm/gemm_lane_params.cpp
                               src/attention/attention_params.cpp src/lowering/attention_step.cpp
                               src/lowering/grouped_gemm_step.cpp src/lowering/route_steps.cpp)

# CPU tests of the lowering and the tile choice: label unit, run everywhere.
mk_add_doctest(mk_lowering_tests LABELS unit
  SOURCES tests/test_lowering.cpp tests/test_lowering_extent.cpp tests/test_lowering_attention.cpp
          tests/test_lowering_grouped.cpp
          tests/test_gemm_choice.cpp LIBS mk::host)
if(TARGET mk_lowering_tests)
  target_include_directories(mk_lowering_tests PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/src)
endif()
