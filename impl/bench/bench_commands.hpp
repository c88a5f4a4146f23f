// mk-bench — the subcommands that have their own options. `argv[0]` is the subcommand's name; `command` is
// the whole command line (for the measurement file). Each returns the process exit code: 0 ok, 1 a
// measurement or check failed, 2 bad usage or an error before measuring.
#pragma once

#include <string>

namespace mkbench {

/// mk-bench gemm -m M -n N -k K [--ctas C] [--check] [--json f]: the in-kernel GEMM engine against cuBLASLt.
int gemmMain(int argc, char** argv, const std::string& command);
/// mk-bench attention [--seq ...] [--json f]: the attention forward engine on issue 38's shapes.
int attentionMain(int argc, char** argv, const std::string& command);
/// mk-bench ring-attention [--ranks R] [--seq-per-rank ...] [--check] [--json f]: ring attention on the resident
/// kernel against the layered program (bench_ring_attention.cpp).
int ringAttentionMain(int argc, char** argv, const std::string& command);
/// mk-bench moe-ffn [--ranks R] [--tokens ...] [--check] [--json f]: the MoE expert FFN on the resident kernel against
/// the layered program (bench_moe.cpp).
int moeFfnMain(int argc, char** argv, const std::string& command);
/// mk-bench grouped-gemm [--tokens ...] [--json f]: the grouped GEMM engine on issue 39's MoE expert FFN shapes.
int groupedGemmMain(int argc, char** argv, const std::string& command);
/// mk-bench calibrate --json f: the micro-benchmarks mk-calibrate fits the hardware profile from.
int calibrateMain(int argc, char** argv, const std::string& command);
/// mk-bench calibrate-network --json f, as 2 rank processes on 2 nodes: the inter-node micro-benchmarks.
int calibrateNetworkMain(int argc, char** argv, const std::string& command);
/// mk-bench gemm-rs|ag-gemm|gemm-ar: a fused operator against cuBLASLt + the collective (bench_fused.cpp).
int fusedMain(int argc, char** argv, const std::string& command);
/// mk-bench soak [--seconds S] ...: mixed back-to-back collectives, checked, memory sampled (bench_soak.cpp).
int soakMain(int argc, char** argv, const std::string& command);

}  // namespace mkbench
