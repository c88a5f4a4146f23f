// mk-bench — shared helpers (bench_common.hpp).
#include "bench_common.hpp"

#include <cuda_runtime_api.h>
#include <dlfcn.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <fstream>
#include <random>
#include <sstream>

#include "mk/cuda_check.hpp"
#include "mk/util/build_commit.hpp"
#include "mk/util/format.hpp"

namespace mkbench {

double hostNs() {
  return static_cast<double>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
          .count());
}

std::string quoted(const std::string& s) {
  std::string out = "\"";
  for (const char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      out += mk::strprintf("\\u%04x", static_cast<unsigned>(static_cast<unsigned char>(c)));
    } else {
      out += c;
    }
  }
  return out + "\"";
}

namespace {
std::string readFileLine(const char* path) {
  std::ifstream f(path);
  std::string line;
  std::getline(f, line);
  return line;
}
}  // namespace

// The first dotted number on /proc's version line: its wording differs between the proprietary and the open
// kernel module.
std::string driverVersion() {
  std::istringstream is(readFileLine("/proc/driver/nvidia/version"));
  for (std::string tok; is >> tok;) {
    const bool digitsAndDots = tok.find_first_not_of("0123456789.") == std::string::npos;
    if (digitsAndDots && std::count(tok.begin(), tok.end(), '.') >= 1 &&
        std::isdigit(static_cast<unsigned char>(tok[0])))
      return tok;
  }
  int v = 0;
  cudaDriverGetVersion(&v);
  return "cuda-driver-api-" + std::to_string(v / 1000) + "." + std::to_string(v % 1000 / 10);
}

std::string nvlinkName() {
  void* lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!lib) return "";
  using Init = int (*)();
  using Handle = int (*)(unsigned, void**);
  using LinkState = int (*)(void*, unsigned, int*);
  auto init = reinterpret_cast<Init>(dlsym(lib, "nvmlInit_v2"));
  auto handle = reinterpret_cast<Handle>(dlsym(lib, "nvmlDeviceGetHandleByIndex_v2"));
  auto state = reinterpret_cast<LinkState>(dlsym(lib, "nvmlDeviceGetNvLinkState"));
  auto shutdown = reinterpret_cast<Init>(dlsym(lib, "nvmlShutdown"));
  std::string out;
  if (init && handle && state && init() == 0) {
    void* dev = nullptr;
    if (handle(0, &dev) == 0) {
      int links = 0;
      for (unsigned l = 0; l < 18; ++l) {
        int on = 0;
        if (state(dev, l, &on) == 0 && on == 1) ++links;
      }
      if (links > 0) out = "NV" + std::to_string(links);
    }
    if (shutdown) shutdown();
  }
  return out;
}

mk::MeasurementFile newMeasurementFile(int gpus, const std::string& link, const std::string& command) {
  cudaDeviceProp prop{};
  MK_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  int rt = 0;
  cudaRuntimeGetVersion(&rt);
  mk::MeasurementFile mf;
  mf.schema = "mkernel.measurement.v1";
  mf.system["gpu"] = quoted(prop.name);
  mf.system["gpus"] = std::to_string(gpus);
  mf.system["sms"] = std::to_string(prop.multiProcessorCount);
  const std::string l = link.empty() ? nvlinkName() : link;
  if (!l.empty()) mf.system["link"] = quoted(l);
  mf.system["driver"] = quoted(driverVersion());
  mf.system["cuda"] = quoted(std::to_string(rt / 1000) + "." + std::to_string(rt % 1000 / 10));
  char date[32];
  const std::time_t now = std::time(nullptr);
  std::strftime(date, sizeof date, "%Y-%m-%d", std::gmtime(&now));
  mf.date = date;
  mf.commit = mk::buildCommit();
  mf.command = command;
  return mf;
}

Dev::Dev(uint64_t bytes) { MK_CUDA_CHECK(cudaMalloc(&p, std::max<uint64_t>(bytes, 16))); }
Dev::~Dev() { cudaFree(p); }

Buffers::Buffers(const std::vector<int>& devs, uint64_t b) : devices(devs), bytes(b) {
  for (int d : devs) {
    MK_CUDA_CHECK(cudaSetDevice(d));
    char* s = nullptr;
    char* r = nullptr;
    MK_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&s), b));
    MK_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&r), b));
    send.push_back(s);
    recv.push_back(r);
  }
}

Buffers::~Buffers() {
  for (size_t i = 0; i < devices.size(); ++i) {
    cudaSetDevice(devices[i]);
    cudaFree(send[i]);
    cudaFree(recv[i]);
  }
}

Streams::Streams(const std::vector<int>& devs) : devices(devs) {
  for (int d : devs) {
    MK_CUDA_CHECK(cudaSetDevice(d));
    cudaStream_t st = nullptr;
    cudaEvent_t a = nullptr, b = nullptr;
    MK_CUDA_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    MK_CUDA_CHECK(cudaEventCreate(&a));
    MK_CUDA_CHECK(cudaEventCreate(&b));
    s.push_back(st);
    start.push_back(a);
    stop.push_back(b);
  }
}

Streams::~Streams() {
  for (size_t i = 0; i < devices.size(); ++i) {
    cudaSetDevice(devices[i]);
    cudaEventDestroy(start[i]);
    cudaEventDestroy(stop[i]);
    cudaStreamDestroy(s[i]);
  }
}

void Streams::sync() {
  for (size_t i = 0; i < devices.size(); ++i) {
    MK_CUDA_CHECK(cudaSetDevice(devices[i]));
    MK_CUDA_CHECK(cudaStreamSynchronize(s[i]));
  }
}

void Streams::recordStart() {
  for (size_t i = 0; i < devices.size(); ++i) {
    MK_CUDA_CHECK(cudaSetDevice(devices[i]));
    MK_CUDA_CHECK(cudaEventRecord(start[i], s[i]));
  }
}

double Streams::recordStopAndElapsedMs() {
  for (size_t i = 0; i < devices.size(); ++i) {
    MK_CUDA_CHECK(cudaSetDevice(devices[i]));
    MK_CUDA_CHECK(cudaEventRecord(stop[i], s[i]));
  }
  double worst = 0;
  for (size_t i = 0; i < devices.size(); ++i) {
    MK_CUDA_CHECK(cudaSetDevice(devices[i]));
    MK_CUDA_CHECK(cudaEventSynchronize(stop[i]));
    float ms = 0;
    MK_CUDA_CHECK(cudaEventElapsedTime(&ms, start[i], stop[i]));
    worst = std::max(worst, static_cast<double>(ms));
  }
  return worst;
}

void fillRandomBf16(void* dst, uint64_t count, uint64_t seed) {
  static std::vector<uint16_t> pool;
  if (pool.empty()) {
    pool.resize(uint64_t{1} << 24);
    std::mt19937_64 rng(seed);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    for (uint16_t& v : pool) {
      const float f = u(rng);
      uint32_t bits = 0;
      std::memcpy(&bits, &f, 4);
      v = static_cast<uint16_t>((bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16);  // round to nearest even
    }
  }
  for (uint64_t at = 0; at < count; at += pool.size()) {
    const uint64_t n = std::min<uint64_t>(pool.size(), count - at);
    MK_CUDA_CHECK(cudaMemcpy(static_cast<uint16_t*>(dst) + at, pool.data(), n * 2, cudaMemcpyHostToDevice));
  }
}

}  // namespace mkbench
