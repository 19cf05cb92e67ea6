// `flashattn --ceilings`: the machine's measured ceilings, against which report.py's roofline
// places every run: cuBLAS GEMM throughput in bf16 (fp32 accumulation) and fp32 (no TF32), and
// device-to-device copy bandwidth, each timed like the kernels (same warm-up, L2 flush, noise rule).
#pragma once

#include <nlohmann/json.hpp>

#include <cstddef>

#include "app.h"
#include "timing.h"

namespace flashattn {

struct Ceilings {
  int gemm_n = 8192;          // square GEMM: n x n x n
  size_t copy_bytes = 0;      // bytes of each of the source and destination buffers
  TimingStats bf16_gemm, fp32_gemm, copy;
  double bf16_tflops = 0, fp32_tflops = 0;
  double copy_gbps = 0;       // (read + write bytes) / median time
};

// Runs the three measurements on `device`. RuntimeError on CUDA/cuBLAS failures, InputError when
// the buffers do not fit in free memory.
Ceilings measure_ceilings(int device, const TimingOptions& timing);

// The "ceilings" object of the session JSON.
nlohmann::json ceilings_json(const Ceilings& c);

// `flashattn --ceilings` on its own: measures, prints, and writes --json (a session document with
// no runs). Returns the exit code.
int run_ceilings(const AppOptions& opt);

}  // namespace flashattn
