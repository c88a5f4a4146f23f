// The prediction cache (mk/validation/prediction_cache.hpp): a hit is the number a fresh simulation gives, records
// of one request share one simulation, the key follows every input, and a broken cache never breaks a run.
#include <doctest/doctest.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include "mk/algorithms/algorithms.hpp"
#include "mk/io/measurement.hpp"
#include "mk/topology/topology.hpp"
#include "mk/validation/prediction_cache.hpp"
#include "mk/validation/validate.hpp"
#include "validate_fixtures.hpp"

namespace {

namespace fs = std::filesystem;

/// A fresh directory under the system's temporary one, removed at scope exit.
struct TempDir {
  explicit TempDir(const std::string& tag)
      : path(fs::temp_directory_path() / ("mk-cache-test-" + tag + "-" + std::to_string(::getpid()))) {
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  fs::path path;
};

/// Five records of three requests: a repeat of the first, and "auto:ring" beside "ring" (one generator).
mk::MeasurementFile records() {
  return mkt::file({mkt::coll("allreduce", "one-shot", 4096, 1024, 11.0),
                    mkt::coll("allreduce", "ring", 1 << 20, 1 << 18, 60.0),
                    mkt::coll("allreduce", "one-shot", 4096, 1024, 12.0),
                    mkt::coll("allreduce", "auto:ring", 1 << 20, 1 << 18, 61.0),
                    mkt::coll("allgather", "direct", 1 << 16, 1 << 13, 9.0)});
}

mk::ValidationResult validate(const mk::MeasurementFile& f, mk::PredictionCache* cache) {
  mk::ValidationOptions opt;
  opt.jobs = 2;
  opt.cache = cache;
  return mk::validateMeasurements({f}, {"f.json"}, mkt::datasheet(), opt);
}

}  // namespace

TEST_CASE("prediction cache: a hit is what a fresh simulation gives, and repeated requests simulate once") {
  TempDir dir("hit");
  const mk::MeasurementFile f = records();
  const mk::ValidationResult fresh = validate(f, nullptr);
  REQUIRE(fresh.rows.size() == 5);
  CHECK(fresh.simulations == 3);
  CHECK(fresh.fromCache == 0);
  CHECK(fresh.rows[0].simUs == fresh.rows[2].simUs);
  CHECK(fresh.rows[1].simUs == fresh.rows[3].simUs);

  mk::PredictionCache first(dir.path.string());
  REQUIRE(first.enabled());
  const mk::ValidationResult a = validate(f, &first);
  CHECK(a.fromCache == 0);
  CHECK(fs::exists(first.file()));

  mk::PredictionCache second(dir.path.string());  // a later run of the same executable reads the file
  const mk::ValidationResult b = validate(f, &second);
  CHECK(b.simulations == 3);
  CHECK(b.fromCache == 3);
  for (std::size_t i = 0; i < fresh.rows.size(); ++i) {
    CAPTURE(i);
    CHECK(a.rows[i].simUs == fresh.rows[i].simUs);  // exact: the cache stores what the simulation returned
    CHECK(b.rows[i].simUs == fresh.rows[i].simUs);
    CHECK(b.rows[i].simErrPct == fresh.rows[i].simErrPct);
  }
  CHECK(b.sim.medianAbsPct == fresh.sim.medianAbsPct);

  // Another profile is another prediction: nothing from the cache.
  mk::Profile faster = mkt::datasheet();
  faster.nvlink.bwGBs *= 2;
  mk::ValidationOptions opt;
  opt.cache = &second;
  const mk::ValidationResult c = mk::validateMeasurements({f}, {"f.json"}, faster, opt);
  CHECK(c.fromCache == 0);
  CHECK(c.rows[1].simUs < fresh.rows[1].simUs);
}

TEST_CASE("prediction cache: the key follows the schedule, the topology and the profile") {
  const mk::Topology topo = mk::topologyPreset("h200x2");
  mk::CollectiveSpec spec;
  spec.op = mk::CollOp::AllReduce;
  spec.algo = mk::Algorithm::Ring;
  spec.dtype = mk::DType::Float32;
  spec.count = 1 << 16;
  const mk::Schedule s = mk::generate(spec, topo.layout(2), {});
  const mk::Profile& p = mkt::datasheet();
  const std::string k = mk::PredictionCache::key(s, topo, p);
  CHECK(k == mk::PredictionCache::key(s, topo, p));
  mk::CollectiveSpec bigger = spec;
  bigger.count += 1;
  CHECK(k != mk::PredictionCache::key(mk::generate(bigger, topo.layout(2), {}), topo, p));
  mk::Topology slower = topo;
  slower.node.nvlink.bwGBs /= 2;
  CHECK(k != mk::PredictionCache::key(s, slower, p));
  mk::Profile q = p;
  q.nvlink.alphaUs += 0.01;
  CHECK(k != mk::PredictionCache::key(s, topo, q));
}

TEST_CASE("prediction cache: off, torn or unwritable, it only costs time") {
  const mk::MeasurementFile f = records();
  const mk::ValidationResult fresh = validate(f, nullptr);

  mk::PredictionCache off("");
  CHECK_FALSE(off.enabled());
  off.put("k", 1.0);
  CHECK_FALSE(off.find("k"));
  CHECK(off.save());

  TempDir dir("torn");
  {
    mk::PredictionCache c(dir.path.string());
    (void)validate(f, &c);
    std::ofstream(c.file(), std::ios::trunc) << "{\"schema\": \"mkernel.prediction-cache.v1\", \"entr";
  }
  mk::PredictionCache torn(dir.path.string());
  const mk::ValidationResult t = validate(f, &torn);  // an empty cache: simulated again, the same numbers
  CHECK(t.fromCache == 0);
  for (std::size_t i = 0; i < fresh.rows.size(); ++i) CHECK(t.rows[i].simUs == fresh.rows[i].simUs);
  mk::PredictionCache repaired(dir.path.string());  // and rewritten whole
  CHECK(validate(f, &repaired).fromCache == 3);

  // A directory that cannot be created (a regular file stands in its way): the run goes on without a cache.
  TempDir blocked("blocked");
  std::ofstream(blocked.path / "file") << "x";
  mk::PredictionCache nowhere((blocked.path / "file" / "cache").string());
  const mk::ValidationResult n = validate(f, &nowhere);
  CHECK(n.fromCache == 0);
  CHECK(n.rows[4].simUs == fresh.rows[4].simUs);
  CHECK_FALSE(nowhere.save());
  CHECK_FALSE(fs::exists(nowhere.file()));
}

TEST_CASE("prediction cache: the directory keeps the 16 most recently written files") {
  TempDir dir("prune");
  for (int i = 0; i < 20; ++i) {
    const fs::path old = dir.path / ("predictions-old" + std::to_string(i) + ".json");
    std::ofstream(old) << "{}";
    fs::last_write_time(old, fs::file_time_type::clock::now() - std::chrono::hours(100 - i));
  }
  std::ofstream(dir.path / "notes.txt") << "not ours";
  mk::PredictionCache c(dir.path.string());
  (void)validate(records(), &c);
  std::size_t ours = 0;
  for (const auto& e : fs::directory_iterator(dir.path))
    if (e.path().filename().string().rfind("predictions-", 0) == 0) ++ours;
  CHECK(ours == 16);
  CHECK(fs::exists(c.file()));                             // the newest: this run's
  CHECK(fs::exists(dir.path / "predictions-old19.json"));  // the newest of the old ones stay
  CHECK_FALSE(fs::exists(dir.path / "predictions-old0.json"));
  CHECK(fs::exists(dir.path / "notes.txt"));  // other files are not the cache's to remove
}

TEST_CASE("prediction cache: a damaged entry is ignored, counted once and simulated again, never used") {
  const mk::MeasurementFile f = records();
  const mk::ValidationResult fresh = validate(f, nullptr);
  TempDir dir("damaged");
  std::string file;
  {
    mk::PredictionCache c(dir.path.string());
    REQUIRE(validate(f, &c).fromCache == 0);
    file = c.file();
  }
  // Each kind of damage a disk, an editor or a bug can leave: negative, zero, huge, null (what a NaN is written
  // as), a string, a bool, and a good value under a key of the wrong shape (a truncated one).
  const std::vector<std::vector<nlohmann::json>> rounds = {{-5.0, 0.0, 1e300}, {nullptr, "12", true}};
  for (std::size_t round = 0; round < rounds.size(); ++round) {
    CAPTURE(round);
    nlohmann::json j = nlohmann::json::parse(std::ifstream(file));
    REQUIRE(j["entries"].size() == 3);
    std::size_t i = 0;
    for (auto& [key, value] : j["entries"].items()) value = rounds[round][i++];
    if (round == 1) j["entries"]["0123-4-5"] = 10.0;
    std::ofstream(file, std::ios::trunc) << j.dump();
    std::vector<std::string> warnings;
    mk::PredictionCache damaged(dir.path.string(), [&](const std::string& w) { warnings.push_back(w); });
    CHECK(damaged.enabled());
    CHECK(damaged.damaged() == (round == 1 ? 4 : 3));
    REQUIRE(warnings.size() == 1);
    CHECK(warnings[0].find("ignored " + std::to_string(damaged.damaged()) + " damaged cache entries") !=
          std::string::npos);
    const mk::ValidationResult d = validate(f, &damaged);
    CHECK(d.fromCache == 0);  // simulated again: the errors are the fresh ones, not 100 %
    for (std::size_t r = 0; r < fresh.rows.size(); ++r) {
      CAPTURE(r);
      CHECK(d.rows[r].simUs == fresh.rows[r].simUs);
      CHECK(d.rows[r].simErrPct == fresh.rows[r].simErrPct);
    }
    CHECK(d.sim.medianAbsPct == fresh.sim.medianAbsPct);
  }
  std::vector<std::string> warnings;
  mk::PredictionCache repaired(dir.path.string(), [&](const std::string& w) { warnings.push_back(w); });
  CHECK(warnings.empty());  // the save dropped the damaged entries
  CHECK(repaired.damaged() == 0);
  CHECK(validate(f, &repaired).fromCache == 3);
  // A total no reader would accept is not written either.
  repaired.put(std::string(32, 'a') + "-1-1", 0.0);
  CHECK_FALSE(repaired.find(std::string(32, 'a') + "-1-1"));
}

TEST_CASE("prediction cache: a FIFO at the cache's path neither hangs the run nor is replaced") {
  TempDir dir("fifo");
  const std::string file = mk::PredictionCache(dir.path.string()).file();
  REQUIRE_FALSE(file.empty());
  REQUIRE(::mkfifo(file.c_str(), 0600) == 0);
  std::vector<std::string> warnings;
  // Bounded: if opening the FIFO blocks (a regression), open its other end so that the reader sees EOF, and fail.
  auto opened = std::async(std::launch::async, [&] {
    return std::make_unique<mk::PredictionCache>(dir.path.string(),
                                                 [&](const std::string& w) { warnings.push_back(w); });
  });
  if (opened.wait_for(std::chrono::seconds(10)) != std::future_status::ready) {
    FAIL_CHECK("opening a FIFO as the prediction cache blocked");
    const int unblock = ::open(file.c_str(), O_RDWR);
    if (unblock >= 0) ::close(unblock);
  }
  const std::unique_ptr<mk::PredictionCache> c = opened.get();
  CHECK_FALSE(c->enabled());  // off for this run: the validation simulates, and save() writes nothing
  REQUIRE(warnings.size() == 1);
  CHECK(warnings[0].find("not a regular file") != std::string::npos);
  const mk::ValidationResult r = validate(records(), c.get());
  CHECK(r.fromCache == 0);
  struct stat st {};
  REQUIRE(::stat(file.c_str(), &st) == 0);
  CHECK(S_ISFIFO(st.st_mode));
}
