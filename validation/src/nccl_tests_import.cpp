// mkernel — nccl-tests output and bus-bandwidth tables read, and the profile's efficiencies fitted from them
// through the layered model (nccl_tests_import.hpp; docs/calibration.md, "Importing nccl-tests output").
#include "mk/validation/nccl_tests_import.hpp"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <sstream>

#include "mk/algorithms/nccl.hpp"
#include "mk/algorithms/request.hpp"
#include "mk/error.hpp"
#include "mk/schedule/io.hpp"
#include "mk/util/format.hpp"
#include "mk/util/size.hpp"

namespace mk {
namespace {

/// Input files are tables of at most a few thousand rows.
constexpr std::size_t kMaxTableBytes = 16u << 20;
/// Rows at or above this size fit the rate: the bytes dominate the time there.
constexpr uint64_t kBandwidthBytes = 16u << 20;
/// Rows at or below this size across nodes fit the per-message latency: the latency dominates there.
constexpr uint64_t kLatencyBytes = 64u << 10;
/// A row's busbw (of at least 1 GB/s) and time must agree within this: nccl-tests prints busbw with 2 decimals
/// (0.5 % at 1 GB/s) and the time with 2 (below 0.1 % above 10 us). A larger gap means the run had another rank
/// count than the cluster given (16 against 32 ranks: 3 %; it cannot tell 128 from 256, the "#  Rank" lines can).
constexpr double kBusBwAgreement = 0.01;
/// Measured faster than the datasheet allows by more than this: the cluster's rates are wrong, not the run.
constexpr double kFasterThanDatasheet = 1.02;

[[noreturn]] void badLine(const std::string& path, std::size_t line, const std::string& what) {
  throw Error(ErrorCode::ParseError, path + ":" + std::to_string(line) + ": " + what);
}

std::vector<std::string> splitWords(const std::string& s) {
  std::istringstream in(s);
  std::vector<std::string> out;
  for (std::string w; in >> w;) out.push_back(w);
  return out;
}

std::string trimmed(const std::string& s) {
  const auto b = s.find_first_not_of(" \t\r");
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(" \t\r") - b + 1);
}

std::vector<std::string> lines(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string l; std::getline(in, l);) out.push_back(l);
  return out;
}

uint64_t integerField(const std::string& w, const std::string& path, std::size_t line, const char* column) {
  const bool digits = !w.empty() && std::all_of(w.begin(), w.end(), [](char c) { return c >= '0' && c <= '9'; });
  if (!digits || w.size() > 18)
    badLine(path, line, std::string(column) + " must be a whole number of bytes (got \"" + w + "\")");
  return std::stoull(w);
}

double numberField(const std::string& w, const std::string& path, std::size_t line, const char* column) {
  char* end = nullptr;
  const double v = std::strtod(w.c_str(), &end);
  if (w.empty() || end != w.c_str() + w.size() || !std::isfinite(v) || v < 0)
    badLine(path, line, std::string(column) + " must be a number >= 0 (got \"" + w + "\")");
  return v;
}

/// nccl-tests program name -> op; sendrecv_perf and others are not collectives the model prices.
CollOp testOp(const std::string& name, const std::string& path, std::size_t line) {
  static const std::pair<const char*, CollOp> kTests[] = {
      {"all_reduce_perf", CollOp::AllReduce},         {"all_gather_perf", CollOp::AllGather},
      {"reduce_scatter_perf", CollOp::ReduceScatter}, {"alltoall_perf", CollOp::AllToAll},
      {"broadcast_perf", CollOp::Broadcast},
  };
  for (const auto& [test, op] : kTests)
    if (name == test) return op;
  badLine(path, line,
          "test \"" + name +
              "\" is not read: the model prices all_reduce_perf, all_gather_perf, reduce_scatter_perf, "
              "alltoall_perf and broadcast_perf");
}

/// nccl-tests' type names (src/common.cu test_typenames) for the types the model prices.
DType testType(const std::string& name, const std::string& path, std::size_t line) {
  if (name == "float") return DType::Float32;
  if (name == "half") return DType::Float16;
  if (name == "bfloat16") return DType::BFloat16;
  badLine(path, line, "type \"" + name + "\" is not priced by the model (expected float, half or bfloat16)");
}

/// The layered model's time per op of `row` on every GPU of `topo` under `p`.
double modelUs(const BusBwRow& row, const Topology& topo, const Profile& p) {
  const uint32_t n = topo.totalGpus();
  const uint64_t count = requireCountForBytes(row.op, row.bytes, row.dtype, n);
  const double gpuUs = layeredCandidates(row.op, count, row.dtype, topo, n, p).front().closedFormUs;
  return layeredOpUs(gpuUs, p, row.launchesPerOp);
}

/// Sum of squared relative errors of the model over `rows` when `set` puts `x` into the profile.
double relativeSquares(const std::vector<const BusBwRow*>& rows, const Topology& topo, Profile p,
                       const std::function<void(Profile&, double)>& set, double x) {
  set(p, x);
  double sum = 0;
  for (const BusBwRow* r : rows) {
    const double e = (modelUs(*r, topo, p) - r->timeUs) / r->timeUs;
    sum += e * e;
  }
  return sum;
}

/// The x in [lo, hi] with the least relativeSquares: a grid of 24 points, then golden sections around the best.
double leastSquares(const std::vector<const BusBwRow*>& rows, const Topology& topo, const Profile& p,
                    const std::function<void(Profile&, double)>& set, double lo, double hi) {
  const auto cost = [&](double x) { return relativeSquares(rows, topo, p, set, x); };
  constexpr int kGrid = 24;
  int best = 0;
  double bestCost = cost(lo);
  for (int i = 1; i <= kGrid; ++i) {
    const double c = cost(lo + (hi - lo) * i / kGrid);
    if (c < bestCost) bestCost = c, best = i;
  }
  double a = lo + (hi - lo) * std::max(0, best - 1) / kGrid, b = lo + (hi - lo) * std::min(kGrid, best + 1) / kGrid;
  const double g = (std::sqrt(5.0) - 1) / 2;
  double c = b - g * (b - a), d = a + g * (b - a);
  double fc = cost(c), fd = cost(d);
  for (int i = 0; i < 40 && b - a > 1e-6 * (hi - lo); ++i) {
    if (fc < fd) {
      b = d, d = c, fd = fc, c = b - g * (b - a), fc = cost(c);
    } else {
      a = c, c = d, fc = fd, d = a + g * (b - a), fd = cost(d);
    }
  }
  return (a + b) / 2;
}

}  // namespace

BusBwInput parseNcclTests(const std::string& text, const std::string& path) {
  BusBwInput in;
  bool haveOp = false;
  CollOp op = CollOp::AllReduce;
  uint32_t launches = 1;
  const auto all = lines(text);
  for (std::size_t i = 0; i < all.size(); ++i) {
    const std::size_t line = i + 1;
    const std::string l = trimmed(all[i]);
    if (l.empty() || l.find(" NCCL ") != std::string::npos) continue;  // NCCL_DEBUG's log lines
    if (l[0] == '#') {
      const auto w = splitWords(l.substr(1));
      if (w.size() >= 4 && w[0] == "Collective" && w[1] == "test" && w[2] == "starting:")
        op = testOp(w[3], path, line), haveOp = true;
      else if (w.size() >= 2 && w[0] == "Rank")
        ++in.ranks;
      else if (w.size() >= 4 && w[0] == "nThread" && w[2] == "nGpus")
        launches = static_cast<uint32_t>(std::max<uint64_t>(1, integerField(w[3], path, line, "nGpus")));
      continue;
    }
    const auto w = splitWords(l);
    if (w.size() != 13)
      badLine(path, line,
              "a result row has 13 columns (size count type redop root, then time algbw busbw #wrong out-of-place "
              "and in-place), got " +
                  std::to_string(w.size()));
    if (!haveOp) badLine(path, line, "a result row before \"# Collective test starting: <test>\": not nccl-tests");
    BusBwRow r;
    r.op = op;
    r.bytes = integerField(w[0], path, line, "size");
    integerField(w[1], path, line, "count");
    r.dtype = testType(w[2], path, line);
    r.timeUs = numberField(w[5], path, line, "time (us)");
    numberField(w[6], path, line, "algbw (GB/s)");
    r.busBwGBs = numberField(w[7], path, line, "busbw (GB/s)");
    if (w[8] != "N/A" && numberField(w[8], path, line, "#wrong") != 0)
      badLine(path, line, "the row reports " + w[8] + " wrong elements: a failed run is not a measurement");
    if (!(r.timeUs > 0)) badLine(path, line, "time (us) must be > 0 (got " + w[5] + ")");
    r.launchesPerOp = launches;
    r.where = path + ":" + std::to_string(line);
    in.rows.push_back(r);
  }
  if (in.rows.empty())
    throw Error(ErrorCode::ParseError,
                path +
                    ": no result rows (expected nccl-tests' table: size count type redop root time algbw busbw "
                    "#wrong ...)");
  return in;
}

BusBwInput parseBusBwTable(const std::string& text, const std::string& path) {
  BusBwInput in;
  const auto all = lines(text);
  int colOp = -1, colBytes = -1, colBusBw = -1, colTime = -1;
  std::size_t columns = 0;
  for (std::size_t i = 0; i < all.size(); ++i) {
    const std::size_t line = i + 1;
    const std::string l = trimmed(all[i]);
    if (l.empty() || l[0] == '#') continue;
    std::vector<std::string> cells;
    std::istringstream cs(l);
    for (std::string c; std::getline(cs, c, ',');) cells.push_back(trimmed(c));
    if (l.back() == ',') cells.push_back("");
    if (columns == 0) {  // the header
      for (std::size_t c = 0; c < cells.size(); ++c) {
        const std::string& h = cells[c];
        int* slot = h == "op"          ? &colOp
                    : h == "bytes"     ? &colBytes
                    : h == "busbw_GBs" ? &colBusBw
                    : h == "time_us"   ? &colTime
                                       : nullptr;
        if (slot == nullptr && (h == "busbw" || h == "time" || h == "size"))
          badLine(path, line,
                  "column \"" + h +
                      "\" has no unit: name the columns op, bytes, busbw_GBs (GB/s, 1e9 bytes/s, "
                      "as nccl-tests) and optionally time_us");
        if (slot == nullptr)
          badLine(path, line, "unknown column \"" + h + "\" (expected op, bytes, busbw_GBs and optionally time_us)");
        if (*slot >= 0) badLine(path, line, "column \"" + h + "\" appears twice");
        *slot = static_cast<int>(c);
      }
      if (colOp < 0 || colBytes < 0 || colBusBw < 0)
        badLine(path, line, "the header must name op, bytes and busbw_GBs (optionally time_us)");
      columns = cells.size();
      continue;
    }
    if (cells.size() != columns)
      badLine(path, line,
              "a row has " + std::to_string(columns) + " columns as the header, got " + std::to_string(cells.size()));
    BusBwRow r;
    const auto op = parseCollOp(cells[colOp]);
    if (!op)
      badLine(path, line,
              "op \"" + cells[colOp] + "\" is not one of allreduce, allgather, reducescatter, alltoall, broadcast");
    r.op = *op;
    r.bytes = integerField(cells[colBytes], path, line, "bytes");
    r.busBwGBs = numberField(cells[colBusBw], path, line, "busbw_GBs");
    if (!(r.busBwGBs > 0)) badLine(path, line, "busbw_GBs must be > 0 (got " + cells[colBusBw] + ")");
    if (colTime >= 0) {
      r.timeUs = numberField(cells[colTime], path, line, "time_us");
      if (!(r.timeUs > 0)) badLine(path, line, "time_us must be > 0 (got " + cells[colTime] + ")");
    }
    r.where = path + ":" + std::to_string(line);
    in.rows.push_back(r);
  }
  if (columns == 0) throw Error(ErrorCode::ParseError, path + ": no header (expected op,bytes,busbw_GBs[,time_us])");
  if (in.rows.empty()) throw Error(ErrorCode::ParseError, path + ": a header but no rows");
  return in;
}

BusBwInput readBusBwFile(const std::string& path) {
  const std::string text = readFile(path, kMaxTableBytes);
  // nccl-tests prints its version or its options first, each on a "#" line.
  const bool ncclTests =
      text.find("# nccl-tests") != std::string::npos || text.find("# Collective test starting:") != std::string::npos;
  return ncclTests ? parseNcclTests(text, path) : parseBusBwTable(text, path);
}

BusBwFit fitBusBw(const std::vector<BusBwRow>& given, const Topology& topo, const Profile& base) {
  const uint32_t n = topo.totalGpus();
  BusBwFit fit;
  fit.network = topo.nodes > 1;
  // Every row gets its time (from busbw where a table gave none) and its busbw and time must agree on n ranks.
  std::vector<BusBwRow> rows = given;
  for (BusBwRow& r : rows) {
    const double busBytes = static_cast<double>(r.bytes) * busBwFactor(r.op, n);
    if (r.timeUs <= 0) r.timeUs = busBytes / (r.busBwGBs * 1e3);
    const double fromTime = busBytes / (r.timeUs * 1e3);
    if (r.busBwGBs >= 1 && std::abs(fromTime / r.busBwGBs - 1) > kBusBwAgreement)
      throw Error(ErrorCode::InvalidArgument,
                  r.where + ": busbw " + formatNumber(r.busBwGBs) + " GB/s and time " + formatNumber(r.timeUs) +
                      " us disagree on " + std::to_string(n) + " ranks (" + formatNumber(fromTime) +
                      " GB/s): the run had another rank count than --cluster's " + std::to_string(topo.nodes) + " x " +
                      std::to_string(topo.node.gpus) + " GPUs; pass the cluster and --nodes it ran on");
  }
  std::vector<const BusBwRow*> bandwidth, latency;
  for (const BusBwRow& r : rows) {
    if (r.bytes >= kBandwidthBytes) bandwidth.push_back(&r);
    if (fit.network && r.bytes <= kLatencyBytes) latency.push_back(&r);
  }
  const std::string files = rows.empty() ? std::string("the input") : rows.front().where;
  if (bandwidth.size() < 2)
    throw Error(ErrorCode::InvalidArgument, "fitting the " + std::string(fit.network ? "network" : "NVLink") +
                                                " efficiency needs at least 2 " + "rows of >= 16 MiB (got " +
                                                std::to_string(bandwidth.size()) + ", e.g. " + files +
                                                "): run nccl-tests up to -e 1G");
  // The rate: network across nodes (its bytes set the time there), NVLink on one node.
  const double rate0 = fit.network ? base.network.bwGBs : base.nvlink.bwGBs;
  const auto setRate = [&](Profile& p, double e) { (fit.network ? p.network.bwGBs : p.nvlink.bwGBs) = e * rate0; };
  const auto setLatency = [](Profile& p, double us) { p.transport.latencyUs = us; };
  // Faster than the datasheet at 100 %: the cluster given is not the one the rows ran on.
  for (const BusBwRow* r : bandwidth) {
    const double bound = modelUs(*r, topo, base);
    if (r->timeUs * kFasterThanDatasheet < bound)
      throw Error(ErrorCode::InvalidArgument,
                  r->where + ": " + formatNumber(r->timeUs) + " us is faster than " + topo.name +
                      "'s datasheet allows (" + formatNumber(bound) +
                      " us at 100 % of its rates): check --cluster's link and NIC rates and --nodes");
  }
  Profile p = base;
  fit.efficiency = leastSquares(bandwidth, topo, p, setRate, 0.02, 1.0);
  setRate(p, fit.efficiency);
  if (!latency.empty()) {
    fit.latencyUs = leastSquares(latency, topo, p, setLatency, 0.0, 200.0);
    fit.latencyFitted = true;
    setLatency(p, fit.latencyUs);
    // The latency moves the large rows a little: refit their rate under it.
    fit.efficiency = leastSquares(bandwidth, topo, p, setRate, 0.02, 1.0);
    setRate(p, fit.efficiency);
  } else {
    fit.latencyUs = p.transport.latencyUs;
  }
  for (const BusBwRow& r : rows) {
    const bool bw = r.bytes >= kBandwidthBytes, lat = fit.network && r.bytes <= kLatencyBytes;
    const double m = modelUs(r, topo, p);
    fit.rows.push_back({r, bw ? "bandwidth" : lat ? "latency" : "-", m, (m - r.timeUs) / r.timeUs});
  }
  fit.profile = p;
  return fit;
}

std::string formatBusBwFit(const BusBwFit& fit) {
  std::string out = strprintf("%-34s %-13s %12s %12s %12s %9s  %s\n", "row", "op", "bytes", "measured_us", "model_us",
                              "residual", "regime");
  for (const BusBwRowFit& r : fit.rows)
    out += strprintf("%-34s %-13s %12llu %12.2f %12.2f %+8.1f%%  %s\n", r.row.where.c_str(), toString(r.row.op),
                     static_cast<unsigned long long>(r.row.bytes), r.row.timeUs, r.modelUs, 100 * r.residual,
                     r.regime.c_str());
  out +=
      strprintf("%s efficiency %.4f (%s.bwGBs %.3f GB/s)\n", fit.network ? "network" : "nvlink", fit.efficiency,
                fit.network ? "network" : "nvlink", fit.network ? fit.profile.network.bwGBs : fit.profile.nvlink.bwGBs);
  if (fit.network)
    out += fit.latencyFitted
               ? strprintf("transport.latencyUs %.3f us (fitted on the rows of <= 64 KiB)\n", fit.latencyUs)
               : strprintf("transport.latencyUs %.3f us (kept: no rows of <= 64 KiB)\n", fit.latencyUs);
  return out;
}

}  // namespace mk
