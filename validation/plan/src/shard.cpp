// mkernel — which work items a shard plans, from the command line or the launcher (shard.hpp).
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "mk/error.hpp"
#include "mk/plan/shard.hpp"
#include "mk/validation/fused_nodes_manifest.hpp"

namespace mk::plan {

namespace {

[[noreturn]] void bad(const std::string& msg) { throw Error(ErrorCode::InvalidArgument, msg); }

/// A whole non-negative decimal number, or -1.
long long wholeNumber(const std::string& s) {
  if (s.empty() || s.size() > 9 || !std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; }))
    return -1;
  return std::stoll(s);
}

ShardSpec checked(long long index, long long count, const std::string& seen) {
  if (count < 1) bad("--shard " + seen + ": expected i/n with n >= 1, e.g. 0/4");
  if (index < 0 || index >= count)
    bad("--shard " + seen + ": the shard index must be in 0.." + std::to_string(count - 1));
  return ShardSpec{static_cast<uint32_t>(index), static_cast<uint32_t>(count)};
}

/// FNV-1a, 64 bits: a fingerprint of inputs, not a defence against an adversary.
void fnv(uint64_t& h, const std::string& bytes) {
  for (unsigned char c : bytes) {
    h ^= c;
    h *= 1099511628211ull;
  }
  h ^= 0xff;  // a separator, so that ("ab", "c") and ("a", "bc") differ
  h *= 1099511628211ull;
}

}  // namespace

ShardSpec parseShard(const std::string& text, const std::function<const char*(const char*)>& env) {
  if (text != "auto") {
    const auto slash = text.find('/');
    if (slash == std::string::npos) bad("--shard '" + text + "': expected i/n (0 <= i < n) or auto");
    const long long index = wholeNumber(text.substr(0, slash)), count = wholeNumber(text.substr(slash + 1));
    if (index < 0 || count < 0) bad("--shard '" + text + "': expected i/n with whole numbers, e.g. 0/4");
    return checked(index, count, "'" + text + "'");
  }
  // The launchers' standard variables (STYLE.md 15): read here only, once, when asked with --shard auto.
  const char* pairs[][3] = {{"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", nullptr},
                            {"PMI_RANK", "PMI_SIZE", nullptr},
                            {"SLURM_ARRAY_TASK_ID", "SLURM_ARRAY_TASK_COUNT", "SLURM_ARRAY_TASK_MIN"}};
  for (const auto& p : pairs) {
    const char* rank = env(p[0]);
    if (!rank) continue;
    const char* size = env(p[1]);
    const char* base = p[2] ? env(p[2]) : "0";
    const std::string seen = std::string("auto (") + p[0] + "=" + rank + ", " + p[1] + "=" + (size ? size : "unset") +
                             (p[2] ? std::string(", ") + p[2] + "=" + (base ? base : "unset") : "") + ")";
    const long long r = wholeNumber(rank), n = size ? wholeNumber(size) : -1, b = base ? wholeNumber(base) : -1;
    if (r < 0 || n < 0 || b < 0) bad("--shard " + seen + ": expected whole numbers from the launcher");
    return checked(r - b, n, seen);
  }
  bad("--shard auto: no launcher rank found (OMPI_COMM_WORLD_RANK, PMI_RANK or SLURM_ARRAY_TASK_ID); run under "
      "mpirun or a Slurm job array, or give --shard i/n");
}

std::string inputsDigest(const std::vector<std::string>& parts, const std::string& measuredDir,
                         const std::string& fusedValidationDir) {
  uint64_t h = 14695981039346656037ull;
  for (const std::string& p : parts) fnv(h, p);
  namespace fs = std::filesystem;
  std::error_code ec;
  std::vector<fs::path> files;
  if (!measuredDir.empty() && fs::is_directory(measuredDir, ec))
    for (const auto& e : fs::directory_iterator(measuredDir, ec))
      if (e.is_regular_file() && e.path().extension() == ".json") files.push_back(e.path());
  std::sort(files.begin(), files.end());
  auto hashFile = [&](const fs::path& f, const std::string& base) {
    std::ifstream in(f, std::ios::binary);
    fnv(h, fs::relative(f, base, ec).string());
    fnv(h, std::string(std::istreambuf_iterator<char>(in), {}));
  };
  for (const fs::path& f : files) hashFile(f, measuredDir);
  // The fused operators' manifests (the planner replays what they name): each manifest and every file it names,
  // by their path from the manifests' directory. A manifest that does not load is hashed alone: the planner
  // refuses it anyway.
  for (const std::string& path : findFusedNodesManifests(fusedValidationDir)) {
    hashFile(path, fusedValidationDir);
    try {
      const FusedNodesManifest m = loadFusedNodesManifest(path);
      hashFile(m.topology, fusedValidationDir);
      for (const auto* list : {&m.calibration, &m.gated})
        for (const std::string& f : *list) hashFile(f, fusedValidationDir);
    } catch (const Error&) {
    }
  }
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(h));
  return hex;
}

}  // namespace mk::plan
