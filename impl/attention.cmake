# impl/ — the attention forward tile engine: sources, mk-bench attention, GPU and CPU-side tests (docs/attention.md).
target_sources(mk_impl PRIVATE src/attention/attention.cpp src/kernels/attention.cu)
# Register use and spills of the kernel are part of its contract, as for the GEMM kernel.
set_source_files_properties(src/kernels/attention.cu PROPERTIES COMPILE_OPTIONS "-Xptxas=-v;-Xptxas=-warn-spills")
target_sources(mk-bench PRIVATE bench/bench_attention.cpp bench/bench_ring_attention.cpp)

# GPU: every output value and log-sum-exp against the CPU executor's attention step (double, same bf16 inputs).
mk_add_doctest(mk_attention_gpu_tests LABELS gpu GPU
  SOURCES tests/gpu_test_main.cpp tests/test_attention_gpu.cpp LIBS mk::impl)
# CPU-only: what the engine refuses before any device work.
mk_add_doctest(mk_attention_unit_tests LABELS unit
  SOURCES tests/test_attention_unit.cpp LIBS mk::impl)

# GPU: ring attention through Communicator::ringAttention (the attention engine as steps of the resident kernel's
# compute lane): ranks sharing GPU 0 in one process, and ranks as nodes in processes under CUDA MPS (those skip
# without it). Every value against the double reference of mk/exec/ring_attention_data.hpp.
mk_add_doctest(mk_ring_attention_gpu_tests LABELS gpu GPU
  SOURCES tests/gpu_test_main.cpp tests/test_ring_attention_gpu.cpp LIBS mk::impl)
if(TARGET mk_ring_attention_gpu_tests)
  target_include_directories(mk_ring_attention_gpu_tests PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/src)
endif()
