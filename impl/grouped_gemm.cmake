# impl/ — the grouped GEMM engine (MoE expert GEMMs with runtime row counts, optional SwiGLU epilogue): sources,
# mk-bench grouped-gemm, GPU and CPU-side tests (docs/grouped-gemm.md).
target_sources(mk_impl PRIVATE src/grouped_gemm/grouped_gemm.cpp src/kernels/grouped_gemm.cu)
# Register use and spills of the kernel are part of its contract, as for the GEMM kernel.
set_source_files_properties(src/kernels/grouped_gemm.cu PROPERTIES COMPILE_OPTIONS "-Xptxas=-v;-Xptxas=-warn-spills")
target_sources(mk-bench PRIVATE bench/bench_grouped_gemm.cpp bench/bench_moe.cpp)

# GPU: every output element against a double-precision CPU reference of the same bf16 inputs.
mk_add_doctest(mk_grouped_gemm_gpu_tests LABELS gpu GPU
  SOURCES tests/gpu_test_main.cpp tests/test_grouped_gemm_gpu.cpp LIBS mk::impl)
# CPU-only: what the engine refuses before any device work.
mk_add_doctest(mk_grouped_gemm_unit_tests LABELS unit
  SOURCES tests/test_grouped_gemm_unit.cpp LIBS mk::impl)
# GPU: moe-dispatch-gemm on the resident kernel (route, gathers, puts by runtime counts, grouped GEMM steps), ranks
# sharing GPU 0, against a double-precision reference.
mk_add_doctest(mk_moe_gpu_tests LABELS gpu GPU
  SOURCES tests/gpu_test_main.cpp tests/test_moe_gpu.cpp LIBS mk::impl)
