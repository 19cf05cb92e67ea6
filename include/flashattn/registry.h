// What a kernel declares about itself. Each kernel file registers one entry per mode it implements
// (forward, backward, decode); `--list`, the support errors, the validator and the GPU test matrix
// are all derived from these entries, so adding a kernel is adding one file.
//
//   static flashattn::KernelMode make_entry() {
//     flashattn::KernelMode m;
//     m.kernel = "naive"; m.mode = flashattn::Mode::Forward; ...
//     m.fwd = &run_forward; m.fwd_workspace = &forward_workspace_bytes;
//     return m;
//   }
//   FLASHATTN_REGISTER_KERNEL_MODE(naive_forward, make_entry);
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "flashattn/check.h"
#include "flashattn/params.h"
#include "flashattn/types.h"

namespace flashattn {

// Everything a launch needs besides the params. Owned by the driver.
struct LaunchContext {
  cudaStream_t stream = nullptr;
  void* cublas = nullptr;  // cublasHandle_t bound to `stream` with its workspace set (GPU runs only)
  int device = -1;         // -1 for the cpu kernel
  int sm = 0;              // compute capability as major*10+minor, 0 for the cpu kernel
  int sm_count = 0;
  size_t smem_optin = 0;   // shared memory a CTA may opt in to, bytes (0: unknown)
  size_t l2_bytes = 0;     // L2 cache size, bytes (0: unknown)
  int cpu_threads = 0;     // threads the cpu kernel may use (0: all hardware threads)
  // Other streams of the run need SMs while the kernel runs (a ring's transfers and merges): a
  // kernel with a persistent grid launches one CTA per tile instead, so SMs free up as tiles end.
  bool shares_device = false;
};

using FwdFn = void (*)(const FwdParams&, const LaunchContext&);
using BwdFn = void (*)(const BwdParams&, const LaunchContext&);
using FwdWorkspaceFn = size_t (*)(const FwdParams&);
using BwdWorkspaceFn = size_t (*)(const BwdParams&);
using DecodeFn = void (*)(const DecodeParams&, const LaunchContext&);
using DecodeWorkspaceFn = size_t (*)(const DecodeParams&);
// Split-K pieces per (batch, kv head) the kernel will use for these params (num_splits, or its
// own choice when num_splits is 0); null means the kernel does not split (1).
using DecodeSplitsFn = int (*)(const DecodeParams&);

// What the driver uses a kernel for besides running it: the fp64 oracle (its fp64 run is the
// reference, not checked against itself), or the default baseline of the speedup column.
enum class KernelRole : uint8_t { Kernel = 0, Reference = 1, Baseline = 2 };

struct KernelMode {
  std::string kernel;   // name used by --compute, e.g. "naive"
  KernelRole role = KernelRole::Kernel;
  Mode mode = Mode::Forward;
  std::string summary;  // one line for --list
  int rung = 0;         // position on the ladder: orders --list, `all` and tables
  bool gpu = true;      // false: runs on the host with host pointers (the cpu kernel)
  int min_sm = 0;       // smallest compute capability (major*10+minor) it runs on
  int max_sm = 0;       // largest one (0: no bound); arch-specific code (sm_90a) runs on one only

  uint32_t dtypes = 0;          // OR of dtype_bit(DType::...)
  std::vector<int> head_dims;   // supported head dims; empty: any D in [1, max_head_dim]
  int max_head_dim = 0;         // with empty head_dims: the largest D (0: unbounded)
  uint32_t features = 0;        // OR of Feature bits
  bool uses_atomics = false;    // issues atomic memory operations (dQ reductions, arrival counters)
  bool bitwise_reproducible = true;     // by default, the same outputs bit for bit run after run
  bool has_deterministic_path = false;  // honours FwdParams::deterministic (then reproducible)
  bool uses_cublas = false;     // needs LaunchContext::cublas (the driver creates the handle)
  // The partial-output contract a ring over several GPUs (src/ring.h) builds on: the forward
  // computes any block (Q and K/V given by pointer and strides, S_q != S_k, causal only where the
  // block is square) and writes its O and lse; the backward takes O and lse from elsewhere (the
  // ring's merged ones) and writes the block's dQ, dK, dV.
  bool partial_outputs = false;
  // Whether its forward honours FwdParams::merge_output (and lse_stride) for these params (null:
  // never): the ring's last block then merges into the outputs in its epilogue, with no merge
  // pass after it.
  bool (*merges_output)(const FwdParams&) = nullptr;
  // Whether its backward honours BwdParams::grads_f32 for these params (null: never): the ring
  // then keeps dQ and dK/dV in fp32 from the kernel on, without 16-bit partials and the passes
  // that add them up.
  bool (*fp32_gradients)(const BwdParams&) = nullptr;
  // With fp32_gradients: the backward also adds dQ into a caller's accumulator in its own layout
  // (BwdParams::dq_accum; no pass per call), and this writes such an accumulator out: p.dq_accum
  // over p.dq_accum_rows rows per (batch, head) -> p.dq (p.dtype at p.dq_st, scaled by p.scale),
  // rows below p.S_q, on ctx.stream. Null: not offered.
  BwdFn dq_finish = nullptr;
  // Keys per tile of BwdParams::tiles_begin/tiles_end for these params (null or 0: the backward
  // takes no part of the work): a ring lends that many keys of a kv head at a time.
  int (*key_tile)(const BwdParams&) = nullptr;
  // Head dims (within head_dims) the kernel hands to another registered kernel, which --list and
  // the run's notes name: the kernel has no variant of its own for them.
  std::vector<int> fallback_head_dims;
  std::string fallback_kernel;

  // Filled in by the registration macro: the archs the registering file was compiled for.
  std::string compiled_archs;

  // Entry points: the pair matching `mode` is set (decode: dec, dec_workspace, dec_splits).
  // Workspace functions may be null (no scratch).
  FwdFn fwd = nullptr;
  FwdWorkspaceFn fwd_workspace = nullptr;
  BwdFn bwd = nullptr;
  BwdWorkspaceFn bwd_workspace = nullptr;
  DecodeFn dec = nullptr;
  DecodeWorkspaceFn dec_workspace = nullptr;
  DecodeSplitsFn dec_splits = nullptr;
};

// Why a GPU kernel cannot run on compute capability `sm` (0: no GPU), or "" when it can.
std::string why_gpu_unsupported(const KernelMode& e, int sm);
// "no D=32 variant: runs the mma kernel" when head dim D is one the kernel hands on, else "".
std::string fallback_note(const KernelMode& e, int D);

class Registry {
 public:
  // Adds an entry; a second entry with the same (kernel, mode) is a programming error: it prints
  // the duplicate and aborts at start-up.
  static bool add(KernelMode entry);
  static const KernelMode* find(const std::string& kernel, Mode mode);
  // Distinct kernel names, in ladder order (rung, then name).
  static std::vector<std::string> kernel_names();
  // Every entry, in ladder order then mode.
  static std::vector<const KernelMode*> entries();
};

// Registers `make_fn()` at static-initialisation time. Kernel objects are linked as an OBJECT
// library so the linker keeps these registrars.
#define FLASHATTN_REGISTER_KERNEL_MODE(ident, make_fn)                            \
  namespace {                                                                     \
  const bool ident##_registered = [] {                                            \
    ::flashattn::KernelMode entry_ = make_fn();                                   \
    entry_.compiled_archs = FLASHATTN_COMPILED_ARCHS;                             \
    return ::flashattn::Registry::add(std::move(entry_));                         \
  }();                                                                            \
  }

}  // namespace flashattn
