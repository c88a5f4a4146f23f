# impl/ — the in-kernel GEMM engine: sources, mk-bench gemm, GPU tests.
target_sources(mk_impl PRIVATE src/gemm/gemm.cpp src/kernels/gemm.cu
  # compute lanes of the resident kernel: per-op GemmParams blocks (tensor maps) of Gemm steps
  src/gemm/gemm_lane.cpp)
# Register use and spills of the GEMM kernel are part of its contract (docs/gemm.md): print them, and warn of any
# spill (an error with MK_WERROR, as in CI).
set_source_files_properties(src/kernels/gemm.cu PROPERTIES COMPILE_OPTIONS "-Xptxas=-v;-Xptxas=-warn-spills")
target_sources(mk-bench PRIVATE bench/cublaslt_loader.cpp bench/bench_fused.cpp bench/bench_fused_cli.cpp
  bench/bench_fused_report.cpp bench/fused_check.cpp bench/fused_baseline.cpp)

# GPU tests: correctness against a CPU reference and cuBLASLt (loaded at run time), hooks, bad input.
mk_add_doctest(mk_gemm_gpu_tests LABELS gpu GPU
  SOURCES tests/gpu_test_main.cpp tests/test_gemm_gpu.cpp bench/cublaslt_loader.cpp LIBS mk::impl)
if(TARGET mk_gemm_gpu_tests)
  target_include_directories(mk_gemm_gpu_tests PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/bench)
endif()
# CPU-only: validation of problems and configs (no GPU needed).
mk_add_doctest(mk_gemm_unit_tests LABELS unit
  SOURCES tests/test_gemm_unit.cpp LIBS mk::impl)

# Compute lanes (Gemm steps inside the resident kernel): the 1-GPU cases (label gpu) and, from the same file,
# the 2-GPU cases (fused Gemm + Put pattern, collectives in the compute-capable mode; label multigpu).
mk_add_doctest(mk_compute_lane_gpu_tests LABELS gpu GPU
  SOURCES tests/gpu_test_main.cpp tests/test_compute_lane_gpu.cpp tests/test_grouped_lane_gpu.cpp LIBS mk::impl)
mk_add_doctest(mk_compute_lane_multigpu_tests LABELS multigpu GPU
  SOURCES tests/gpu_test_main.cpp tests/test_compute_lane_gpu.cpp LIBS mk::impl)
if(TARGET mk_compute_lane_multigpu_tests)
  target_compile_definitions(mk_compute_lane_multigpu_tests PRIVATE MK_TEST_MIN_GPUS=2)
endif()

# The fused operators through Communicator on one GPU (1 rank and 2-4 ranks sharing it; label gpu), checked
# against the host reference of impl/bench/fused_check.cpp.
mk_add_doctest(mk_fused_gpu_tests LABELS gpu GPU
  SOURCES tests/gpu_test_main.cpp tests/test_fused_gpu.cpp bench/fused_check.cpp LIBS mk::impl)
if(TARGET mk_fused_gpu_tests)
  target_include_directories(mk_fused_gpu_tests PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/bench)
endif()
