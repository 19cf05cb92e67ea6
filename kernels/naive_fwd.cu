// naive, forward — rung 1 of the ladder: attention exactly as the formula reads, every intermediate
// in global memory. It adds nothing over the CPU reference except running on the GPU. Its rounding
// points are those of a framework's unfused attention, and of the same-dtype baseline the
// fp16/bf16 check rule is derived from (reference.h, computed on the host for the checked rows):
//   S = scale * Q K^T (+ mask; invisible keys -> -inf)   fp32 accumulate, S stored in fp32
//   lse_i = log sum_j exp(S_ij);  P_ij = exp(S_ij - lse_i)  P stored in the dtype (rounded)
//   O = P V                                               fp32 accumulate, O stored in the dtype
// Three kernels, one thread per output element (one warp per row for the softmax), threads
// adjacent along the fastest output index so stores and the second operand's loads coalesce.
// Limits: fp32/fp16/bf16, any head dim, every feature; O(B*H*S_q*S_k) workspace (S in fp32 plus
// P in the dtype). Always deterministic.
// Measured: see README.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "common/dtype.cuh"
#include "common/mask.cuh"
#include "common/switch.h"
#include "common/warp_reduce.cuh"
#include "flashattn/check.h"
#include "flashattn/error.h"
#include "flashattn/registry.h"

namespace flashattn {
namespace naive_fwd {

constexpr int kThreads = 256;

inline size_t align256(size_t n) { return (n + 255) / 256 * 256; }

// Blocks for a grid-stride loop over n items; the cap only bounds the grid, the loop covers the rest.
inline unsigned blocks_for(int64_t n, int per_block) {
  const int64_t blocks = (n + per_block - 1) / per_block;
  return static_cast<unsigned>(blocks < (int64_t{1} << 24) ? blocks : (int64_t{1} << 24));
}

template <class T>
struct Args {
  const T* q = nullptr;
  const T* k = nullptr;
  const T* v = nullptr;
  T* o = nullptr;
  float* lse = nullptr;  // [B, H, S_q]
  Strides q_st, k_st, v_st, o_st;
  int B = 0, H = 0, H_kv = 0, S_q = 0, S_k = 0, D = 0;
  float scale = 0.f;
  Visibility vis;
  float* s = nullptr;  // workspace: [B, H, S_q, S_k] scores
  T* p = nullptr;      // workspace: [B, H, S_q, S_k] probabilities
};

// S[b, h, i, j] for flat index e over [B, H, S_q, S_k] (j fastest: a warp shares the Q row and
// writes 32 consecutive scores).
template <class T>
FLASHATTN_HD inline void scores_at(const Args<T>& a, int64_t e) {
  const int64_t j = e % a.S_k;
  const int64_t row = e / a.S_k;  // (b*H + h)*S_q + i
  const int64_t i = row % a.S_q;
  const int64_t bh = row / a.S_q;
  const int64_t h = bh % a.H, b = bh / a.H;
  const int64_t g = h / (a.H / a.H_kv);
  float s = -INFINITY;
  if (a.vis.visible(i, j, a.vis.seqlen_k(b))) {
    const T* q_row = a.q + b * a.q_st.batch + h * a.q_st.head + i * a.q_st.row;
    const T* k_row = a.k + b * a.k_st.batch + g * a.k_st.head + j * a.k_st.row;
    s = a.scale * dot_f32(q_row, k_row, a.D) + a.vis.bias(b, h, i, j);
  }
  a.s[e] = s;
}

// O[b, h, i, d] for flat index e over [B, H, S_q, D] (d fastest: V rows are read coalesced).
template <class T>
FLASHATTN_HD inline void output_at(const Args<T>& a, int64_t e) {
  const int64_t d = e % a.D;
  const int64_t row = e / a.D;
  const int64_t i = row % a.S_q;
  const int64_t bh = row / a.S_q;
  const int64_t h = bh % a.H, b = bh / a.H;
  const int64_t g = h / (a.H / a.H_kv);
  float acc = 0.f;
  // P is 0 outside the visible keys; skipping them also keeps padded V rows out of the sum.
  if (a.lse[row] != -INFINITY) {
    const IndexRange keys = a.vis.keys(i, a.vis.seqlen_k(b));
    const T* p_row = a.p + row * a.S_k;
    const T* v_col = a.v + b * a.v_st.batch + g * a.v_st.head + d;
    for (int64_t j = keys.begin; j < keys.end; ++j)
      acc += to_float(p_row[j]) * to_float(v_col[j * a.v_st.row]);
  }
  a.o[b * a.o_st.batch + h * a.o_st.head + i * a.o_st.row + d] = from_float<T>(acc);
}

template <class T>
__global__ void scores_kernel(Args<T> a, int64_t n) {
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < n;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x)
    scores_at(a, e);
}


// One warp per row of S: m = rowmax(S), l = rowsum(exp(S - m)), lse = m + log(l),
// P = exp(S - lse) rounded to the dtype. A row without a finite score gets lse = -inf, P = 0.
template <class T>
__global__ void softmax_kernel(Args<T> a, int64_t rows) {
  const int lane = threadIdx.x % 32;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (blockDim.x / 32);
  // The row index is the same for the whole warp, so the loop and the shuffles stay warp-uniform.
  for (int64_t row = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) / 32; row < rows;
       row += warps) {
    const float* s_row = a.s + row * a.S_k;
    T* p_row = a.p + row * a.S_k;
    float m = -INFINITY;
    for (int64_t j = lane; j < a.S_k; j += 32) m = fmaxf(m, s_row[j]);
    m = warp_max(m);
    float l = 0.f;
    if (m != -INFINITY)
      for (int64_t j = lane; j < a.S_k; j += 32) l += expf(s_row[j] - m);
    l = warp_sum(l);
    const float lse = m == -INFINITY ? -INFINITY : m + logf(l);
    for (int64_t j = lane; j < a.S_k; j += 32)
      p_row[j] = from_float<T>(lse == -INFINITY ? 0.f : expf(s_row[j] - lse));
    if (lane == 0) a.lse[row] = lse;
  }
}

template <class T>
__global__ void output_kernel(Args<T> a, int64_t n) {
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < n;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x)
    output_at(a, e);
}

size_t workspace_bytes(const FwdParams& p) {
  const size_t n = static_cast<size_t>(p.B) * p.H * p.S_q * p.S_k;
  return align256(n * sizeof(float)) + align256(n * dtype_size(p.dtype));
}

template <class T>
Args<T> make_args(const FwdParams& p) {
  Args<T> a;
  a.q = static_cast<const T*>(p.q);
  a.k = static_cast<const T*>(p.k);
  a.v = static_cast<const T*>(p.v);
  a.o = static_cast<T*>(p.o);
  a.lse = static_cast<float*>(p.lse);
  a.q_st = p.q_st;
  a.k_st = p.k_st;
  a.v_st = p.v_st;
  a.o_st = p.o_st;
  a.B = p.B;
  a.H = p.H;
  a.H_kv = p.H_kv;
  a.S_q = p.S_q;
  a.S_k = p.S_k;
  a.D = p.D;
  a.scale = p.scale;
  a.vis = make_visibility(p);
  const size_t n = static_cast<size_t>(p.B) * p.H * p.S_q * p.S_k;
  char* ws = static_cast<char*>(p.workspace);
  a.s = reinterpret_cast<float*>(ws);
  a.p = reinterpret_cast<T*>(ws + align256(n * sizeof(float)));
  return a;
}

template <class T>
void launch(const FwdParams& p, const LaunchContext& ctx) {
  const Args<T> a = make_args<T>(p);
  const int64_t rows = static_cast<int64_t>(p.B) * p.H * p.S_q;
  const int64_t n_scores = rows * p.S_k;
  const int64_t n_out = rows * p.D;
  scores_kernel<T><<<blocks_for(n_scores, kThreads), kThreads, 0, ctx.stream>>>(a, n_scores);
  CHECK_LAUNCH("naive scores_kernel");
  softmax_kernel<T><<<blocks_for(rows, kThreads / 32), kThreads, 0, ctx.stream>>>(a, rows);
  CHECK_LAUNCH("naive softmax_kernel");
  output_kernel<T><<<blocks_for(n_out, kThreads), kThreads, 0, ctx.stream>>>(a, n_out);
  CHECK_LAUNCH("naive output_kernel");
}

void run(const FwdParams& p, const LaunchContext& ctx) {
  if (static_cast<int64_t>(p.B) * p.H * p.S_q * p.S_k * p.D == 0) return;
  if (p.H_kv <= 0 || p.H % p.H_kv != 0) throw RuntimeError("naive forward: H must be a multiple of H_kv");
  if (p.workspace == nullptr || p.workspace_bytes < workspace_bytes(p))
    throw RuntimeError("naive forward: workspace smaller than its workspace function asked for");
  DTYPE_SWITCH(p.dtype, T, [&] { launch<T>(p, ctx); });
}

KernelMode make_entry() {
  KernelMode m;
  m.kernel = "naive";
  m.mode = Mode::Forward;
  m.summary = "materialised attention: separate GEMM, softmax and GEMM kernels, one thread per output";
  m.rung = 1;
  m.gpu = true;
  // Plain CUDA with no arch-specific instruction (bf16 conversions are emulated below sm_80).
  m.min_sm = 70;
  m.dtypes = dtype_bit(DType::F32) | dtype_bit(DType::F16) | dtype_bit(DType::BF16);
  m.max_head_dim = 0;  // any D
  m.features = kAllFeatures;
  m.uses_atomics = false;
  m.fwd = &run;
  m.fwd_workspace = &workspace_bytes;
  return m;
}

}  // namespace naive_fwd
}  // namespace flashattn

FLASHATTN_REGISTER_KERNEL_MODE(naive_forward, flashattn::naive_fwd::make_entry)
