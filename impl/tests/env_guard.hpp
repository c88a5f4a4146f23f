// Test helper: launch variables set for one scope, and whatever was there before restored.
#pragma once

#include <cstdlib>
#include <initializer_list>
#include <map>
#include <string>
#include <utility>

namespace mkt {

/// Sets variables for one scope and restores what was there before.
class EnvGuard {
 public:
  EnvGuard(std::initializer_list<std::pair<const char*, const char*>> vars) {
    for (const char* k : kLaunchVariables) {
      const char* v = std::getenv(k);
      if (v) saved_[k] = v;
      unsetenv(k);
    }
    for (const auto& kv : vars) setenv(kv.first, kv.second, 1);
  }
  ~EnvGuard() {
    for (const char* k : kLaunchVariables) unsetenv(k);
    for (const auto& kv : saved_) setenv(kv.first.c_str(), kv.second.c_str(), 1);
  }

 private:
  static constexpr const char* kLaunchVariables[] = {"RANK",
                                                     "WORLD_SIZE",
                                                     "LOCAL_RANK",
                                                     "MASTER_ADDR",
                                                     "MASTER_PORT",
                                                     "OMPI_COMM_WORLD_RANK",
                                                     "OMPI_COMM_WORLD_SIZE",
                                                     "OMPI_COMM_WORLD_LOCAL_RANK",
                                                     "PMI_RANK",
                                                     "PMI_SIZE",
                                                     "MPI_LOCALRANKID",
                                                     "TORCHELASTIC_RUN_ID",
                                                     "MK_JOB_KEY",
                                                     "MK_JOB_KEY_FILE"};
  std::map<std::string, std::string> saved_;
};

}  // namespace mkt
