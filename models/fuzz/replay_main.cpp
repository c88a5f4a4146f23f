// mkernel — replay a fuzz target's corpus without libFuzzer: every file under the arguments (files or
// directories) is fed to LLVMFuzzerTestOneInput once. Linked into every normal build (and the CI's ASan build),
// so every input a fuzzer ever found keeps being checked. A file named bad-* holds input the reader must refuse:
// its acceptance fails the run. Exits 1 when an input fails or none was found; -v prints each outcome.
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "fuzz_target.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size);

namespace {

bool replay(const std::filesystem::path& file, bool verbose) {
  std::ifstream in(file, std::ios::binary);
  if (!in) {
    std::fprintf(stderr, "replay: cannot read %s\n", file.c_str());
    return false;
  }
  const std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
  const std::string& why = mk::fuzz::lastRejection();
  if (verbose) std::printf("%s: %s\n", file.filename().c_str(), why.empty() ? "accepted" : why.c_str());
  if (why.empty() && file.filename().string().rfind("bad-", 0) == 0) {
    std::fprintf(stderr, "replay: %s was accepted but holds input the reader must refuse\n", file.c_str());
    return false;
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  std::size_t count = 0;
  bool verbose = false;
  for (int i = 1; i < argc; ++i) {
    if (std::string(argv[i]) == "-v") {
      verbose = true;
      continue;
    }
    const std::filesystem::path arg = argv[i];
    std::vector<std::filesystem::path> files;
    if (std::filesystem::is_directory(arg)) {
      for (const auto& e : std::filesystem::recursive_directory_iterator(arg))
        if (e.is_regular_file()) files.push_back(e.path());
    } else {
      files.push_back(arg);
    }
    for (const auto& f : files) {
      if (!replay(f, verbose)) return 1;
      ++count;
    }
  }
  std::printf("replayed %zu inputs\n", count);
  return count > 0 ? 0 : 1;
}
