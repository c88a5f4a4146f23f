// mkernel — internal: the generator options (chunks, channels) an op gets when the caller leaves them 0.
// Host-only and CUDA-free so the unit tests check the table.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>

#include "mk/algorithms/algorithms.hpp"

namespace mk::runtime {

/// Chunks and channels for `algo` of `op` at `bytes` (nccl-tests size: the larger buffer of one rank) on
/// `nRanks` ranks.
///
/// Pipelining pays once a transfer is long against a flag round trip (~1.25 us = ~400 KB at NVLink rate); more
/// chunks also mean more flags and sync points. The sizes come from measurements on 2 x H200
/// (impl/tools/bw_sweep.sh, validation/data/measured/2026-11-30-h200x2-*-sweep*.tsv, docs/results.md
/// "Chunks per size"):
///  * generally 1 / 2 / 4 / 8 chunks from 0 / 1 / 4 / 64 MiB on (one-shot all-reduce and direct reduce-scatter
///    measured best at 8 chunks from 64 MiB to 512 MiB; all-gather was not swept);
///  * two-shot all-reduce: never more than the general rule, and pieces of about 16 MiB of the rank's shard,
///    2 to 4 chunks (measured 32-512 MiB: the general rule cost 1-15 % against the best of 2 or 4; the
///    closed forms priced at the general rule made two-shot 1-10 % dearer than one-shot, so "auto" took
///    one-shot, which measured 6-12 % slower);
///  * one channel: 2 or 4 channels measured 0-3 % slower at 512 MiB.
inline GenOptions defaultGenOptions(CollOp op, const std::string& algo, uint64_t bytes, uint32_t nRanks) {
  constexpr uint64_t MiB = uint64_t{1} << 20;
  GenOptions g;
  g.channels = 1;
  g.chunks = bytes >= 64 * MiB ? 8 : bytes >= 4 * MiB ? 4 : bytes >= MiB ? 2 : 1;
  if (op == CollOp::AllReduce && algo == "two-shot") {
    const uint64_t shard = bytes / std::max<uint32_t>(nRanks, 1);
    g.chunks = std::min(g.chunks, static_cast<uint32_t>(std::clamp<uint64_t>(shard / (16 * MiB), 2, 4)));
  }
  return g;
}

}  // namespace mk::runtime
