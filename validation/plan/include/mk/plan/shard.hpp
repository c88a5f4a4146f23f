// mkernel — a plan split over processes (mk-plan --shard i/n, then mk-plan merge; docs/planner.md, "Sharding").
//
// A plan's work items are (variant, GPU count[, layout of the search]) in the planner's order: item k =
// variant x items-per-variant + index. Shard i of n plans the items k with k mod n == i (round robin: the large GPU
// counts, the slow ones, spread over the shards) and writes its plan.json with a "shard" section: which shard, the
// command line's plan options, a digest of everything the plan reads, and the price of every collective it
// simulated. The merge runs the same plan with those prices instead of simulations, so its plan.json, text and
// report are the single process's by construction, not by a second writer that could drift.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "mk/plan/comm_pricer.hpp"

namespace mk::plan {

/// Which part of the work items a process plans: `index` of `count` (count 1: all of them).
struct ShardSpec {
  uint32_t index = 0, count = 1;
  bool active() const noexcept { return count > 1; }
};

/// "i/n" (0 <= i < n), or "auto": the launcher's rank and size, from OMPI_COMM_WORLD_RANK / OMPI_COMM_WORLD_SIZE
/// (Open MPI), PMI_RANK / PMI_SIZE (MPICH, Intel MPI), or SLURM_ARRAY_TASK_ID - SLURM_ARRAY_TASK_MIN /
/// SLURM_ARRAY_TASK_COUNT (a Slurm job array), the first pair present. `env` reads a variable (nullptr when unset).
/// Throws Error(InvalidArgument) naming --shard and what was seen.
ShardSpec parseShard(const std::string& text, const std::function<const char*(const char*)>& env);

/// Whether the shard plans work item `item`.
inline bool ownsItem(const ShardSpec& s, std::size_t item) noexcept { return item % s.count == s.index; }

/// What a shard hands the merge: which shard it is, what it planned from, what it simulated.
struct ShardFile {
  std::string path;
  ShardSpec shard;
  std::vector<std::string> args;            ///< the plan's options (mk-plan's command line less shard and outputs)
  std::string digest;                       ///< inputsDigest of its inputs
  std::map<std::string, CommPrice> prices;  ///< by CommPricer key: every collective it priced
};

/// A digest (16 hex digits, FNV-1a 64) of the texts `parts`, of every *.json file at the top of `measuredDir` (name
/// and bytes, in name order; "" for none) and of the fused operators' manifests in `fusedValidationDir` (each
/// manifest and every file it names: findFusedNodesManifests): equal digests, equal inputs.
std::string inputsDigest(const std::vector<std::string>& parts, const std::string& measuredDir,
                         const std::string& fusedValidationDir);

/// `planJson` (planToJson's text) with the "shard" section of `f` added (f.path unused).
std::string addShardSection(const std::string& planJson, const ShardFile& f);

/// The "shard" section of a shard's plan.json. Throws Error(InvalidArgument) naming the file: not a plan.json, no
/// shard section (written without --shard), an index outside 0..count-1.
ShardFile readShardFile(const std::string& path);

/// The shards of one plan, checked: all of `digest` (the merge's own inputs), of one count, each index exactly
/// once. Returns every price of every shard. Throws Error(InvalidArgument) naming the file (or the missing
/// shard).
std::map<std::string, CommPrice> mergeShardPrices(const std::vector<ShardFile>& shards, const std::string& digest);

}  // namespace mk::plan
