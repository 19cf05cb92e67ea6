#include "ceilings.h"

#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "flashattn/device_fill.h"
#include "device_info.h"
#include "flashattn/check.h"
#include "flashattn/error.h"
#include "harness.h"
#include "io_guard.h"
#include "npy.h"
#include "nvtx.h"
#include "report.h"

namespace flashattn {

namespace {

constexpr size_t kCublasWorkspaceBytes = size_t(32) << 20;
constexpr size_t kMaxCopyBytes = size_t(1) << 30;

// Device buffers (and the stream and handle when set), released however the measurement ends.
struct Scratch {
  std::vector<void*> bufs;
  cudaStream_t stream = nullptr;
  cublasHandle_t cublas = nullptr;
  ~Scratch() {
    for (void* p : bufs) cudaFree(p);
    if (cublas) cublasDestroy(cublas);
    if (stream) cudaStreamDestroy(stream);
  }
  void* alloc(size_t bytes) {
    void* p = nullptr;
    CUDA_CHECK(cudaMalloc(&p, bytes));
    bufs.push_back(p);
    return p;
  }
};

void cublas_check(cublasStatus_t st, const char* what) {
  if (st != CUBLAS_STATUS_SUCCESS) throw RuntimeError(std::string(what) + " failed: cuBLAS status " + std::to_string(int(st)));
}

TimingStats time_it(const std::function<void()>& fn, cudaStream_t stream, const TimingOptions& t, GpuTimer* timer,
                    const DeviceInfo& info) {
  ClockProbe probe;
  probe.sm_clock_mhz = [info] { return nvml_sm_clock_mhz(info); };
  probe.throttle_reasons = [info] { return nvml_slowdown_reasons(info); };
  fn();  // first call outside the statistics: cuBLAS picks and loads its kernel here
  CUDA_CHECK(cudaStreamSynchronize(stream));
  return timer->time(fn, stream, t, &probe);
}

// One n x n x n GEMM C = A * B with inputs N(0,1) (realistic power draw, unlike zeros).
TimingStats time_gemm(Scratch& s, int n, DType t, const TimingOptions& timing, GpuTimer* timer,
                      const DeviceInfo& info) {
  const size_t elems = size_t(n) * n;
  const size_t es = dtype_size(t);
  Scratch mem;  // freed when this GEMM is done
  void* a = mem.alloc(elems * es);
  void* b = mem.alloc(elems * es);
  void* c = mem.alloc(elems * es);
  fill_normal_device(a, t, int64_t(elems), 1, 1, s.stream);
  fill_normal_device(b, t, int64_t(elems), 1, 2, s.stream);
  const cudaDataType_t ty = t == DType::BF16 ? CUDA_R_16BF : CUDA_R_32F;
  const float alpha = 1.0f, beta = 0.0f;
  // CUBLAS_COMPUTE_32F with the default math mode: fp32 accumulation, and no TF32 for fp32 inputs.
  auto gemm = [&] {
    cublas_check(cublasGemmEx(s.cublas, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &alpha, a, ty, n, b, ty, n, &beta, c, ty, n,
                              CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                 "cublasGemmEx");
  };
  NvtxRange range(std::string("ceiling ") + dtype_name(t) + " GEMM " + std::to_string(n));
  return time_it(gemm, s.stream, timing, timer, info);
}

double tflops_of(double flops, const TimingStats& t) { return t.median_ms > 0 ? flops / (t.median_ms * 1e-3) / 1e12 : 0; }

}  // namespace

Ceilings measure_ceilings(int device, const TimingOptions& timing) {
  CUDA_CHECK(cudaSetDevice(device));
  const DeviceInfo info = query_device(device);
  Ceilings c;
  Scratch s;
  CUDA_CHECK(cudaStreamCreateWithFlags(&s.stream, cudaStreamNonBlocking));
  cublas_check(cublasCreate(&s.cublas), "cublasCreate");
  cublas_check(cublasSetStream(s.cublas, s.stream), "cublasSetStream");
  cublas_check(cublasSetWorkspace(s.cublas, s.alloc(kCublasWorkspaceBytes), kCublasWorkspaceBytes), "cublasSetWorkspace");
  cublas_check(cublasSetMathMode(s.cublas, CUBLAS_DEFAULT_MATH), "cublasSetMathMode");
  GpuTimer timer(info.l2_bytes);

  size_t free = 0, total = 0;
  CUDA_CHECK(cudaMemGetInfo(&free, &total));
  const size_t gemm_bytes = 3 * size_t(c.gemm_n) * c.gemm_n * sizeof(float);
  if (gemm_bytes + (size_t(256) << 20) > free)
    throw InputError(fmt::format("--ceilings: the {}^3 fp32 GEMM needs {:.1f} GiB of GPU memory, {:.1f} GiB free", c.gemm_n,
                                 gemm_bytes / double(1ull << 30), free / double(1ull << 30)));
  const double gemm_flops = 2.0 * c.gemm_n * double(c.gemm_n) * c.gemm_n;
  c.bf16_gemm = time_gemm(s, c.gemm_n, DType::BF16, timing, &timer, info);
  c.bf16_tflops = tflops_of(gemm_flops, c.bf16_gemm);
  c.fp32_gemm = time_gemm(s, c.gemm_n, DType::F32, timing, &timer, info);
  c.fp32_tflops = tflops_of(gemm_flops, c.fp32_gemm);

  // Copy: far larger than L2 so it streams from DRAM; a quarter of free memory at most.
  CUDA_CHECK(cudaMemGetInfo(&free, &total));
  c.copy_bytes = std::min(kMaxCopyBytes, (free / 4) & ~size_t(0xFFFFF));
  void* src = s.alloc(c.copy_bytes);
  void* dst = s.alloc(c.copy_bytes);
  fill_normal_device(src, DType::F32, int64_t(c.copy_bytes / 4), 1, 3, s.stream);
  {
    NvtxRange range("ceiling device copy");
    auto copy = [&] { CUDA_CHECK(cudaMemcpyAsync(dst, src, c.copy_bytes, cudaMemcpyDeviceToDevice, s.stream)); };
    c.copy = time_it(copy, s.stream, timing, &timer, info);
  }
  c.copy_gbps = c.copy.median_ms > 0 ? 2.0 * double(c.copy_bytes) / (c.copy.median_ms * 1e-3) / 1e9 : 0;
  return c;
}

nlohmann::json ceilings_json(const Ceilings& c) {
  return {{"bf16_gemm_tflops", c.bf16_tflops},
          {"fp32_gemm_tflops", c.fp32_tflops},
          {"copy_gbps", c.copy_gbps},
          {"gemm_n", c.gemm_n},
          {"copy_bytes", c.copy_bytes},
          {"method", "cuBLAS GemmEx n x n x n with fp32 accumulation (bf16 in and out; fp32 without TF32), "
                     "2n^3 FLOPs; cudaMemcpyAsync device to device, read + write bytes; median time"},
          {"timing", {{"bf16_gemm", timing_json(c.bf16_gemm, -1, -1)},
                      {"fp32_gemm", timing_json(c.fp32_gemm, -1, -1)},
                      {"copy", timing_json(c.copy, -1, -1)}}}};
}

int run_ceilings(const AppOptions& opt) {
  const std::string started = iso8601_now();
  std::string why;
  if (cuda_device_count(&why) <= opt.device || opt.device < 0)
    throw InputError("--ceilings: needs a GPU: " + (why.empty() ? "no device " + std::to_string(opt.device) : why));
  if (!opt.json.empty() && opt.json != "-") check_output_file(opt.json, "--json");  // before minutes of work
  const TimingOptions timing = timing_options(opt);
  const DeviceInfo info = query_device(opt.device);
  FILE* human = opt.json == "-" ? stderr : stdout;
  ReportHeader hdr;
  hdr.command_line = opt.command_line;
  hdr.started_at = started;
  hdr.device = &info;
  hdr.timing = timing;
  note_device_state(&hdr, opt.device);  // its warning is printed with the table
  const Ceilings c = measure_ceilings(opt.device, timing);
  hdr.sm_clock_end_mhz = nvml_sm_clock_mhz(info);
  hdr.ceilings = ceilings_json(c);
  if (!opt.quiet || opt.json != "-") {
    std::string out = fmt::format("ceilings on {} (sm_{}), median of L2-{} repetitions\n", info.name, info.sm(),
                                  timing.flush_l2 ? "flushed" : "hot");
    auto line = [&](const char* what, double v, const char* unit, double peak, const TimingStats& t) {
      out += fmt::format("  {:<38} {:>9.1f} {:<8} ({:.3f} ms, noise {:.1f}%{}", what, v, unit, t.median_ms,
                         100 * t.rel_stddev, t.clock.throttled ? ", throttled" : "");
      out += peak > 0 ? fmt::format("; datasheet {:.0f}, {:.0f}%)\n", peak, 100 * v / peak) : ")\n";
    };
    line(fmt::format("bf16 GEMM {}^3 (fp32 accumulation)", c.gemm_n).c_str(), c.bf16_tflops, "TFLOP/s",
         info.peak_tensor_tflops, c.bf16_gemm);
    line(fmt::format("fp32 GEMM {}^3 (no TF32)", c.gemm_n).c_str(), c.fp32_tflops, "TFLOP/s", info.peak_fp32_tflops,
         c.fp32_gemm);
    line(fmt::format("device copy {} MiB (read + write)", c.copy_bytes >> 20).c_str(), c.copy_gbps, "GB/s",
         info.peak_dram_gbps, c.copy);
    for (const std::string& w : hdr.warnings) out += "warning: " + w + "\n";
    std::fputs(out.c_str(), human);
  }
  if (!opt.json.empty()) {
    nlohmann::json doc = session_json(hdr, {});
    doc.erase("data");
    emit_json(opt.json, doc);
  }
  return kExitOk;
}

}  // namespace flashattn
