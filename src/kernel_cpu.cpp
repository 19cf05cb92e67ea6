// Kernel `cpu`, rung 0: the fp64 references (reference.cpp, decode_reference.cpp) behind the
// ordinary kernel interface, so the driver can run, time and write outputs of the oracle exactly
// as it does for a GPU kernel, on any machine.
//
// Every feature, forward, backward and decode, any head dim, inputs in fp32/fp16/bf16/fp64 with
// any strides. Inputs are gathered to contiguous bhsd doubles (each value exactly as stored), the
// reference runs in fp64, and each output is rounded once to params.dtype. The backward pass
// recomputes everything from q, k, v and dout: it never trusts the o and lse it is handed. A
// decode step reads the caches the driver updated on the host, through the block table when paged.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "array.h"
#include "decode_reference.h"
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

// A strided [n0, n1, n2, D] tensor of `t` -> a contiguous HostArray (same dtype, values as stored).
HostArray gather_array(const void* p, DType t, const Strides& st, std::vector<int64_t> shape) {
  HostArray a(t, shape);
  const size_t es = dtype_size(t), row_bytes = static_cast<size_t>(shape[3]) * es;
  uint8_t* dst = a.bytes.data();
  for (int64_t x = 0; x < shape[0]; ++x)
    for (int64_t y = 0; y < shape[1]; ++y)
      for (int64_t z = 0; z < shape[2]; ++z, dst += row_bytes)
        std::memcpy(dst, static_cast<const uint8_t*>(p) + (x * st.batch + y * st.head + z * st.row) * es, row_bytes);
  return a;
}

void run_decode(const DecodeParams& p, const LaunchContext& ctx) {
  const std::vector<int64_t> q_shape = {p.B, p.H, p.S_new, p.D}, new_shape = {p.B, p.H_kv, p.S_new, p.D};
  const std::vector<int64_t> cache_shape = p.block_table ? std::vector<int64_t>{p.num_blocks, p.H_kv, p.page_size, p.D}
                                                         : std::vector<int64_t>{p.B, p.H_kv, p.S_max, p.D};
  const HostArray q = gather_array(p.q, p.dtype, p.q_st, q_shape);
  const HostArray k_new = gather_array(p.k_new, p.dtype, p.k_new_st, new_shape);
  const HostArray v_new = gather_array(p.v_new, p.dtype, p.v_new_st, new_shape);
  const HostArray k_cache = gather_array(p.k_cache, p.dtype, p.k_cache_st, cache_shape);
  const HostArray v_cache = gather_array(p.v_cache, p.dtype, p.v_cache_st, cache_shape);
  DecodeRefInputs in;
  in.B = p.B, in.H = p.H, in.H_kv = p.H_kv, in.S_new = p.S_new, in.D = p.D;
  in.scale = p.scale_f64 != 0.0 ? p.scale_f64 : static_cast<double>(p.scale);
  in.q = &q, in.k_new = &k_new, in.v_new = &v_new, in.k_cache = &k_cache, in.v_cache = &v_cache;
  in.cache_seqlens = p.cache_seqlens;
  in.block_table = p.block_table;
  in.block_table_stride = p.block_table_stride;
  in.page_size = p.page_size;
  in.threads = ctx.cpu_threads;
  const size_t rows = static_cast<size_t>(p.B) * p.H * p.S_new;
  std::vector<double> o(rows * p.D), lse(rows);
  decode_reference(in, o.data(), lse.data());
  scatter(o, p.o, p.dtype, p.o_st, p.B, p.H, p.S_new, p.D);
  for (size_t r = 0; r < rows; ++r) static_cast<float*>(p.lse)[r] = static_cast<float>(lse[r]);
}

KernelMode base_entry(Mode mode) {
  KernelMode m;
  m.kernel = "cpu";
  m.role = KernelRole::Reference;
  m.mode = mode;
  m.summary = "fp64 CPU reference (the oracle): every feature, forward, backward and decode, multi-threaded";
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

KernelMode decode_entry() {
  KernelMode m = base_entry(Mode::Decode);
  m.summary = "fp64 CPU reference (the oracle): every feature, forward, backward and decode, multi-threaded";
  m.dtypes &= ~dtype_bit(DType::F64);  // decode data are computed in fp32, fp16 or bf16
  m.features = kFeatGQA | kFeatPadding | kFeatPaged;
  m.dec = &run_decode;
  return m;
}

}  // namespace
}  // namespace flashattn

FLASHATTN_REGISTER_KERNEL_MODE(cpu_decode, flashattn::decode_entry);
FLASHATTN_REGISTER_KERNEL_MODE(cpu_forward, flashattn::forward_entry);
FLASHATTN_REGISTER_KERNEL_MODE(cpu_backward, flashattn::backward_entry);
