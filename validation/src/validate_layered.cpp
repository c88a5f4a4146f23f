// mkernel — validation of the layered baseline (validate_layered.hpp).
#include "mk/validation/validate_layered.hpp"

#include <string>

#include "mk/algorithms/nccl.hpp"
#include "mk/algorithms/request.hpp"
#include "mk/error.hpp"
#include "mk/sim/replay.hpp"
#include "mk/topology/topology.hpp"
#include "mk/validation/prediction_cache.hpp"

namespace mk {

LayeredValidation validateLayered(const std::vector<MeasurementFile>& files, const std::vector<std::string>& names,
                                  const std::string& cluster, const Profile& profile, unsigned jobs,
                                  PredictionCache* cache) {
  LayeredValidation out;
  struct Job {
    Schedule schedule;
    Topology topo;
    Profile profile;
  };
  std::vector<Job> work;
  for (std::size_t f = 0; f < files.size(); ++f) {
    for (std::size_t i = 0; i < files[f].records.size(); ++i) {
      const MeasurementRecord& r = files[f].records[i];
      if (r.impl != "nccl") continue;
      const auto op = parseCollOp(r.op);
      if (!op || layeredAlgorithmsFor(*op).empty()) {
        ++out.ignored;
        continue;
      }
      const std::string where =
          names[f] + ": records[" + std::to_string(i) + "] (nccl " + r.op + ", " + std::to_string(r.bytes) + " B)";
      try {
        const DType dtype = requireDType(r.dtype, "dtype");
        const Placement placed = placeRanks(cluster, 0, r.ranks);
        const uint64_t count = requireCountForBytes(*op, r.bytes, dtype, placed.nRanks);
        const LayeredChoice choice = chooseLayered(*op, count, dtype, placed.topo, placed.nRanks, profile);
        CollectiveSpec spec;
        spec.op = *op;
        spec.algo = choice.algo;
        spec.dtype = dtype;
        spec.count = count;
        LayeredRow row;
        row.file = names[f];
        row.index = i;
        row.op = r.op;
        row.bytes = r.bytes;
        row.ranks = placed.nRanks;
        row.measuredUs = r.timeUs;
        row.choice = std::string(toString(choice.algo)) + "/" + toString(choice.gen.protocol);
        row.launchesPerOp = launchesPerOp(files[f], names[f]);
        out.rows.push_back(row);
        work.push_back(Job{generate(spec, placed.topo.layout(placed.nRanks), choice.gen), placed.topo,
                           layeredProfile(profile, choice.gen.protocol)});
      } catch (const Error& e) {
        throw Error(e.code(), where + ": " + e.message());
      }
    }
  }
  std::vector<TotalJob> totals;
  for (const Job& j : work) totals.push_back(TotalJob{&j.schedule, &j.topo, &j.profile});
  const std::vector<double> gpuUs = predictTotals(totals, jobs, cache, [&](std::size_t k) {
    return out.rows[k].file + ": records[" + std::to_string(out.rows[k].index) + "]";
  });
  std::vector<double> err;
  for (std::size_t k = 0; k < out.rows.size(); ++k) {
    LayeredRow& row = out.rows[k];
    row.gpuUs = gpuUs[k];
    row.predictedUs = layeredOpUs(row.gpuUs, profile, row.launchesPerOp);
    row.errPct = errorPct(row.predictedUs, row.measuredUs);
    err.push_back(row.errPct);
  }
  out.stats = errorStats(err);
  return out;
}

}  // namespace mk
