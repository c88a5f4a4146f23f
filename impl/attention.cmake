# impl/ — the attention forward tile engine: sources, mk-bench attention, GPU and CPU-side tests (docs/attention.md).
target_sources(mk_impl PRIVATE src/attention/attention.cpp src/kernels/attention.cu)
# Register use and spills of the kernel are part of its contract, as for the GEMM kernel.
set_source_files_properties(src/kernels/attention.cu PROPERTIES COMPILE_OPTIONS "-Xptxas=-v;-Xptxas=-warn-spills")
target_sources(mk-bench PRIVATE bench/bench_attention.cpp)

# GPU: every output value and log-sum-exp against the CPU executor's attention step (double, same bf16 inputs).
mk_add_doctest(mk_attention_gpu_tests LABELS gpu GPU
  SOURCES tests/gpu_test_main.cpp tests/test_attention_gpu.cpp LIBS mk::impl)
# CPU-only: what the engine refuses before any device work.
mk_add_doctest(mk_attention_unit_tests LABELS unit
  SOURCES tests/test_attention_unit.cpp LIBS mk::impl)
