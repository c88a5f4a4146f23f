// mkernel — order statistics of a sample: the one median and the one percentile rule of the project (the
// validation summary, the calibration fits and the benchmarks' repetition statistics all use these).
#pragma once

#include <vector>

namespace mk {

/// The median of `v`: the middle value, or the mean of the two middle values for an even count; 0 when empty.
double median(std::vector<double> v);

/// The `q`-quantile of `v` (q in [0, 1], clamped), by linear interpolation between order statistics (the
/// "type 7" rule of R and numpy's default): quantile(v, 0.5) == median(v); 0 when empty.
double quantile(std::vector<double> v, double q);

}  // namespace mk
