// mkernel — NCCL's host path per op fitted from our own impl "nccl" records (calibrate_nccl.hpp).
#include "calibrate_nccl.hpp"

#include <algorithm>
#include <exception>
#include <limits>
#include <string>
#include <vector>

#include "mk/error.hpp"
#include "mk/util/stats.hpp"

namespace mk {

uint32_t launchesPerOp(const MeasurementFile& f, const std::string& name) {
  auto positive = [&](const char* key) -> uint32_t {
    const auto it = f.system.find(key);
    if (it == f.system.end()) return 0;
    try {
      const long v = std::stol(it->second);
      if (v > 0 && std::to_string(v) == it->second) return static_cast<uint32_t>(v);
    } catch (const std::exception&) {
    }
    throw Error(ErrorCode::InvalidArgument,
                name + ": system." + key + " must be a positive integer (got " + it->second + ")");
  };
  const uint32_t gpus = positive("gpus");
  if (gpus == 0) throw Error(ErrorCode::InvalidArgument, name + ": system.gpus is missing (the GPUs of the run)");
  const uint32_t processes = positive("processes");
  return processes == 0 ? gpus : std::max<uint32_t>(1, gpus / processes);
}

std::optional<ParameterFit> fitNcclGroupGpuUs(const std::vector<MeasurementFile>& files,
                                              const std::vector<std::string>& names, LayeredCosts& nccl) {
  std::vector<double> perGpuUs;
  for (std::size_t f = 0; f < files.size(); ++f)
    for (const MeasurementRecord& r : files[f].records) {
      if (r.impl != "nccl" || r.op != kNcclHostFitOp || r.ranks < 2 || r.bytes > kNcclHostPlateauBytes) continue;
      const std::string name = f < names.size() ? names[f] : "file " + std::to_string(f);
      perGpuUs.push_back(r.timeUs / launchesPerOp(files[f], name));
    }
  if (perGpuUs.empty()) return std::nullopt;
  const double total = median(perGpuUs);
  if (total < nccl.hostOpUs)
    throw Error(ErrorCode::InvalidArgument,
                std::string("nccl.groupGpuUs: the ") + kNcclHostFitOp + " plateau costs " + std::to_string(total) +
                    " us per op and GPU, less than nccl.hostOpUs (" + std::to_string(nccl.hostOpUs) +
                    " us): expected NCCL's multi-rank path to cost at least its one-rank path; check the records");
  nccl.groupGpuUs = total - nccl.hostOpUs;
  return ParameterFit{"nccl.groupGpuUs",
                      "us",
                      nccl.groupGpuUs,
                      true,
                      perGpuUs.size(),
                      std::numeric_limits<double>::quiet_NaN(),
                      0,
                      std::string("median of impl nccl ") + kNcclHostFitOp +
                          " <= 64 KiB per GPU - nccl.hostOpUs (held out: other ops)"};
}

}  // namespace mk
