// What the driver knows about the GPU: properties for the JSON and for peak-throughput fractions,
// and NVML readings (SM clock, other processes) loaded at run time with dlopen so the binary has
// no link-time dependency on the driver (it must start on machines without a GPU).
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace flashattn {

struct DeviceInfo {
  int index = -1;
  std::string name;
  std::string pci_bus_id;
  int sm_count = 0;
  int cc_major = 0, cc_minor = 0;
  size_t memory_bytes = 0;
  size_t l2_bytes = 0;
  size_t smem_per_block_optin = 0;
  int max_sm_clock_mhz = 0;
  int max_mem_clock_mhz = 0;
  int memory_bus_bits = 0;
  int driver_version = 0;   // e.g. 13000
  int runtime_version = 0;  // e.g. 13000
  // Datasheet-style peaks derived from the SM count and max clock (0 where the arch is not known).
  double peak_fp32_tflops = 0;    // CUDA-core FMA rate
  double peak_tensor_tflops = 0;  // dense fp16/bf16 tensor-core rate with fp32 accumulation
  double peak_dram_gbps = 0;      // from memory clock and bus width

  int sm() const { return cc_major * 10 + cc_minor; }
};

// Number of CUDA devices. When 0, *why (if given) says why ("no CUDA-capable device", driver...).
int cuda_device_count(std::string* why);
DeviceInfo query_device(int index);

// Peak TFLOP/s of `info` for a compute dtype name ("fp32", "fp16", "bf16"); 0 if unknown.
double peak_tflops_for(const DeviceInfo& info, const std::string& dtype);

// NVML readings; each returns -1 when NVML or the reading is unavailable.
int nvml_sm_clock_mhz(const DeviceInfo& info);
int nvml_other_processes(const DeviceInfo& info);  // compute processes on the GPU, excluding us
// Reasons the GPU is running below its clock target right now, limited to actual slowdowns
// (power cap, thermal, hardware slowdown, power brake; not idle or application-clock settings):
// an NVML bitmask, 0 when none or when NVML cannot say.
unsigned long long nvml_slowdown_reasons(const DeviceInfo& info);
// Names of the bits of such a mask, e.g. "sw_power_cap", "hw_thermal_slowdown".
std::vector<std::string> slowdown_reason_names(unsigned long long mask);
// Why NVML is unavailable ("" when it loaded).
std::string nvml_status();

}  // namespace flashattn
