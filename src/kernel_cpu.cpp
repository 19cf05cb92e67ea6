// Kernel `cpu`, rung 0: the fp64 reference (reference.cpp) behind the ordinary kernel interface, so
// the driver can run, time and write outputs of the oracle exactly as it does for a GPU kernel.
//
// Every feature, forward and backward, any head dim, inputs in fp32/fp16/bf16/fp64 with any
// strides. Inputs are gathered to contiguous bhsd doubles (each value exactly as stored), the
// reference runs in fp64, and each output is rounded once to params.dtype. The backward pass
// recomputes everything from q, k, v and dout: it never trusts the o and lse it is handed.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "array.h"
#include "flashattn/error.h"
#include "flashattn/registry.h"
#include "reference.h"

namespace flashattn {
namespace {

double load(const void* base, DType t, int64_t idx) {
  switch (t) {
    case DType::F32: return static_cast<const float*>(base)[idx];
    case DType::F64: return static_cast<const double*>(base)[idx];
    case DType::F16: return half_bits_to_float(static_cast<const uint16_t*>(base)[idx]);
    case DType::BF16: return bf16_bits_to_float(static_cast<const uint16_t*>(base)[idx]);
    default: break;
  }
  throw RuntimeError(std::string("cpu kernel: unsupported dtype ") + dtype_name(t));
}

// Round-to-odd from double to float: with the 13+ spare bits a float has over fp16/bf16, rounding
// this value to nearest gives the correctly rounded fp16/bf16 of `x` (a plain double -> float ->
// half chain can round twice and land one ulp off on ties).
float round_to_odd_float(double x) {
  if (std::isnan(x)) return static_cast<float>(x);
  float f = static_cast<float>(x);
  if (static_cast<double>(f) == x) return f;
  // Truncate toward zero, then mark inexactness in the last bit.
  if (std::fabs(static_cast<double>(f)) > std::fabs(x)) f = std::nextafter(f, 0.0f);
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  bits |= 1u;
  std::memcpy(&f, &bits, sizeof bits);
  return f;
}

void store(void* base, DType t, int64_t idx, double x) {
  switch (t) {
    case DType::F32: static_cast<float*>(base)[idx] = static_cast<float>(x); return;
    case DType::F64: static_cast<double*>(base)[idx] = x; return;
    case DType::F16: static_cast<uint16_t*>(base)[idx] = float_to_half_bits(round_to_odd_float(x)); return;
    case DType::BF16: static_cast<uint16_t*>(base)[idx] = float_to_bf16_bits(round_to_odd_float(x)); return;
    default: break;
  }
  throw RuntimeError(std::string("cpu kernel: unsupported dtype ") + dtype_name(t));
}

// [B, heads, S, D] strided tensor of `dtype` -> contiguous bhsd doubles.
std::vector<double> gather(const void* p, DType t, const Strides& st, int B, int heads, int S, int D) {
  std::vector<double> out(static_cast<size_t>(B) * heads * S * D);
  size_t n = 0;
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < heads; ++h)
      for (int i = 0; i < S; ++i) {
        const int64_t row = b * st.batch + h * st.head + i * st.row;
        for (int d = 0; d < D; ++d) out[n++] = load(p, t, row + d);
      }
  return out;
}

// Contiguous bhsd doubles -> [B, heads, S, D] strided tensor of `dtype`.
void scatter(const std::vector<double>& in, void* p, DType t, const Strides& st, int B, int heads, int S, int D) {
  size_t n = 0;
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < heads; ++h)
      for (int i = 0; i < S; ++i) {
        const int64_t row = b * st.batch + h * st.head + i * st.row;
        for (int d = 0; d < D; ++d) store(p, t, row + d, in[n++]);
      }
}

struct Gathered {
  std::vector<double> q, k, v, dout;
  RefInputs in;
};

Gathered gather_inputs(const FwdParams& p, const LaunchContext& ctx) {
  Gathered g;
  g.q = gather(p.q, p.dtype, p.q_st, p.B, p.H, p.S_q, p.D);
  g.k = gather(p.k, p.dtype, p.k_st, p.B, p.H_kv, p.S_k, p.D);
  g.v = gather(p.v, p.dtype, p.v_st, p.B, p.H_kv, p.S_k, p.D);
  g.in.dims = Dims{p.B, p.H, p.H_kv, p.S_q, p.S_k, p.D};
  // The unrounded scale when the driver kept it: the oracle should not inherit fp32 rounding.
  g.in.scale = p.scale_f64 != 0.0 ? p.scale_f64 : static_cast<double>(p.scale);
  g.in.causal = p.causal;
  g.in.window_left = p.window_left;
  g.in.window_right = p.window_right;
  g.in.seqlens_k = p.seqlens_k;
  g.in.mask = p.mask;
  g.in.threads = ctx.cpu_threads;
  g.in.q = g.q.data();
  g.in.k = g.k.data();
  g.in.v = g.v.data();
  return g;
}

void run_forward(const FwdParams& p, const LaunchContext& ctx) {
  Gathered g = gather_inputs(p, ctx);
  const size_t rows = static_cast<size_t>(p.B) * p.H * p.S_q;
  std::vector<double> o(rows * p.D), lse(rows);
  reference_forward(g.in, o.data(), lse.data());
  scatter(o, p.o, p.dtype, p.o_st, p.B, p.H, p.S_q, p.D);
  if (p.lse) {
    for (size_t r = 0; r < rows; ++r) {
      if (p.dtype == DType::F64) {
        static_cast<double*>(p.lse)[r] = lse[r];
      } else {
        static_cast<float*>(p.lse)[r] = static_cast<float>(lse[r]);
      }
    }
  }
}

void run_backward(const BwdParams& p, const LaunchContext& ctx) {
  Gathered g = gather_inputs(p, ctx);
  g.dout = gather(p.dout, p.dtype, p.do_st, p.B, p.H, p.S_q, p.D);
  g.in.dout = g.dout.data();
  std::vector<double> dq(g.q.size()), dk(g.k.size()), dv(g.v.size());
  reference_backward(g.in, dq.data(), dk.data(), dv.data());
  scatter(dq, p.dq, p.dtype, p.dq_st, p.B, p.H, p.S_q, p.D);
  scatter(dk, p.dk, p.dtype, p.dk_st, p.B, p.H_kv, p.S_k, p.D);
  scatter(dv, p.dv, p.dtype, p.dv_st, p.B, p.H_kv, p.S_k, p.D);
}

KernelMode base_entry(Mode mode) {
  KernelMode m;
  m.kernel = "cpu";
  m.mode = mode;
  m.summary = "fp64 CPU reference (the oracle): every feature, forward and backward, multi-threaded";
  m.rung = 0;
  m.gpu = false;
  m.min_sm = 0;
  m.dtypes = dtype_bit(DType::F32) | dtype_bit(DType::F16) | dtype_bit(DType::BF16) | dtype_bit(DType::F64);
  m.max_head_dim = 0;  // with empty head_dims: any D
  m.features = kAllFeatures;
  return m;
}

KernelMode forward_entry() {
  KernelMode m = base_entry(Mode::Forward);
  m.fwd = &run_forward;
  return m;
}

KernelMode backward_entry() {
  KernelMode m = base_entry(Mode::Backward);
  m.bwd = &run_backward;
  return m;
}

}  // namespace
}  // namespace flashattn

FLASHATTN_REGISTER_KERNEL_MODE(cpu_forward, flashattn::forward_entry);
FLASHATTN_REGISTER_KERNEL_MODE(cpu_backward, flashattn::backward_entry);
