#include "device_info.h"

#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <unistd.h>

#include <mutex>
#include <vector>

#include "flashattn/check.h"

namespace flashattn {

int cuda_device_count(std::string* why) {
  int n = 0;
  cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess) {
    cudaGetLastError();
    if (why) {
      if (err == cudaErrorNoDevice)
        *why = "no CUDA device found";
      else if (err == cudaErrorInsufficientDriver)
        *why = "no CUDA device (no NVIDIA driver loaded, or one older than this CUDA runtime)";
      else
        *why = std::string("no usable CUDA device (") + cudaGetErrorString(err) + ")";
    }
    return 0;
  }
  if (n == 0 && why) *why = "no CUDA device found";
  return n;
}

namespace {

int attr(cudaDeviceAttr a, int dev) {
  int v = 0;
  if (cudaDeviceGetAttribute(&v, a, dev) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return v;
}

}  // namespace

DeviceInfo query_device(int index) {
  DeviceInfo d;
  cudaDeviceProp prop{};
  CUDA_CHECK(cudaGetDeviceProperties(&prop, index));
  d.index = index;
  d.name = prop.name;
  d.sm_count = prop.multiProcessorCount;
  d.cc_major = prop.major;
  d.cc_minor = prop.minor;
  d.memory_bytes = prop.totalGlobalMem;
  d.l2_bytes = static_cast<size_t>(prop.l2CacheSize);
  d.smem_per_block_optin = prop.sharedMemPerBlockOptin;
  d.max_sm_clock_mhz = attr(cudaDevAttrClockRate, index) / 1000;
  d.max_mem_clock_mhz = attr(cudaDevAttrMemoryClockRate, index) / 1000;
  d.memory_bus_bits = attr(cudaDevAttrGlobalMemoryBusWidth, index);
  char bus[32] = {0};
  if (cudaDeviceGetPCIBusId(bus, sizeof(bus), index) == cudaSuccess) d.pci_bus_id = bus;
  cudaDriverGetVersion(&d.driver_version);
  cudaRuntimeGetVersion(&d.runtime_version);

  // Per-SM, per-clock dense rates (FLOPs): FP32 FMA lanes x 2, and fp16/bf16 tensor-core MACs x 2
  // with fp32 accumulation, for the architectures whose numbers we know.
  double fp32_per_clk = 0, tensor_per_clk = 0;
  const int sm = d.sm();
  if (sm == 80) { fp32_per_clk = 128; tensor_per_clk = 2048; }          // A100
  else if (sm == 86 || sm == 89) { fp32_per_clk = 256; }                // tensor rate varies by SKU
  else if (sm == 90) { fp32_per_clk = 256; tensor_per_clk = 4096; }     // H100/H200 SXM
  const double clk_hz = d.max_sm_clock_mhz * 1e6;
  d.peak_fp32_tflops = fp32_per_clk * d.sm_count * clk_hz / 1e12;
  d.peak_tensor_tflops = tensor_per_clk * d.sm_count * clk_hz / 1e12;
  // HBM/GDDR: two transfers per memory clock.
  d.peak_dram_gbps = 2.0 * d.max_mem_clock_mhz * 1e6 * (d.memory_bus_bits / 8.0) / 1e9;
  return d;
}

double peak_tflops_for(const DeviceInfo& info, const std::string& dtype) {
  if (dtype == "fp32") return info.peak_fp32_tflops;
  if (dtype == "fp16" || dtype == "bf16") return info.peak_tensor_tflops;
  return 0;
}

// ---- NVML through dlopen ------------------------------------------------------------------------
namespace {

using nvmlDevice = void*;
constexpr int kNvmlSuccess = 0;
constexpr int kNvmlInsufficientSize = 7;
constexpr int kNvmlClockSM = 1;

struct NvmlProcessInfo {  // nvmlProcessInfo_t (v2/v3 layout)
  unsigned int pid;
  unsigned long long used_gpu_memory;
  unsigned int gpu_instance_id;
  unsigned int compute_instance_id;
};

struct Nvml {
  void* lib = nullptr;
  std::string status = "not loaded";
  int (*init)() = nullptr;
  int (*by_bus_id)(const char*, nvmlDevice*) = nullptr;
  int (*clock_info)(nvmlDevice, int, unsigned int*) = nullptr;
  int (*compute_procs)(nvmlDevice, unsigned int*, NvmlProcessInfo*) = nullptr;
  int (*clock_reasons)(nvmlDevice, unsigned long long*) = nullptr;

  Nvml() {
    lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
      status = "libnvidia-ml.so.1 not found";
      return;
    }
    init = reinterpret_cast<int (*)()>(dlsym(lib, "nvmlInit_v2"));
    by_bus_id = reinterpret_cast<int (*)(const char*, nvmlDevice*)>(dlsym(lib, "nvmlDeviceGetHandleByPciBusId_v2"));
    clock_info = reinterpret_cast<int (*)(nvmlDevice, int, unsigned int*)>(dlsym(lib, "nvmlDeviceGetClockInfo"));
    compute_procs = reinterpret_cast<int (*)(nvmlDevice, unsigned int*, NvmlProcessInfo*)>(
        dlsym(lib, "nvmlDeviceGetComputeRunningProcesses_v3"));
    // Renamed in recent drivers ("clocks event reasons"); same signature and bits.
    void* reasons = dlsym(lib, "nvmlDeviceGetCurrentClocksEventReasons");
    if (!reasons) reasons = dlsym(lib, "nvmlDeviceGetCurrentClocksThrottleReasons");
    clock_reasons = reinterpret_cast<int (*)(nvmlDevice, unsigned long long*)>(reasons);
    if (!init || !by_bus_id || !clock_info) {
      status = "libnvidia-ml.so.1 lacks the functions used";
      return;
    }
    if (init() != kNvmlSuccess) {
      status = "nvmlInit failed";
      return;
    }
    status = "";
  }
  bool ok() const { return status.empty(); }
  bool handle(const DeviceInfo& info, nvmlDevice* dev) const {
    return ok() && !info.pci_bus_id.empty() && by_bus_id(info.pci_bus_id.c_str(), dev) == kNvmlSuccess;
  }
};

Nvml& nvml() {
  static Nvml n;
  return n;
}

// NVML clocks-event reason bits that mean the SM clock was pulled down by a limit.
struct SlowdownBit {
  unsigned long long bit;
  const char* name;
};
constexpr SlowdownBit kSlowdownBits[] = {
    {0x4ull, "sw_power_cap"},         {0x8ull, "hw_slowdown"},
    {0x20ull, "sw_thermal_slowdown"}, {0x40ull, "hw_thermal_slowdown"},
    {0x80ull, "hw_power_brake"},
};

}  // namespace

std::string nvml_status() { return nvml().status; }

unsigned long long nvml_slowdown_reasons(const DeviceInfo& info) {
  nvmlDevice dev = nullptr;
  if (!nvml().clock_reasons || !nvml().handle(info, &dev)) return 0;
  unsigned long long r = 0;
  if (nvml().clock_reasons(dev, &r) != kNvmlSuccess) return 0;
  unsigned long long mask = 0;
  for (const SlowdownBit& b : kSlowdownBits) mask |= b.bit;
  return r & mask;
}

std::vector<std::string> slowdown_reason_names(unsigned long long mask) {
  std::vector<std::string> names;
  for (const SlowdownBit& b : kSlowdownBits)
    if (mask & b.bit) names.push_back(b.name);
  return names;
}

int nvml_sm_clock_mhz(const DeviceInfo& info) {
  nvmlDevice dev = nullptr;
  if (!nvml().handle(info, &dev)) return -1;
  unsigned int mhz = 0;
  return nvml().clock_info(dev, kNvmlClockSM, &mhz) == kNvmlSuccess ? static_cast<int>(mhz) : -1;
}

int nvml_other_processes(const DeviceInfo& info) {
  nvmlDevice dev = nullptr;
  if (!nvml().compute_procs || !nvml().handle(info, &dev)) return -1;
  unsigned int count = 0;
  int rc = nvml().compute_procs(dev, &count, nullptr);
  if (rc != kNvmlSuccess && rc != kNvmlInsufficientSize) return -1;
  if (count == 0) return 0;
  std::vector<NvmlProcessInfo> procs(count + 4);
  unsigned int n = static_cast<unsigned int>(procs.size());
  if (nvml().compute_procs(dev, &n, procs.data()) != kNvmlSuccess) return -1;
  const unsigned int self = static_cast<unsigned int>(getpid());
  int others = 0;
  for (unsigned int i = 0; i < n; ++i) others += procs[i].pid != self;
  return others;
}

}  // namespace flashattn
