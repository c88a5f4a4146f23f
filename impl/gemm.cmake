# impl/ — the in-kernel GEMM engine (issue 6): sources, mk-bench gemm, GPU tests.
