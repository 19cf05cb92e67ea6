// naive, decode — rung 1 of the ladder in decode mode: one decode step's attention exactly as the
// formula reads, every intermediate in global memory, over the cache the update-cache kernel has
// just extended. Its rounding points are those of the naive forward (an unfused framework
// attention) and of the same-dtype baseline of the check rule (decode_reference.h):
//   S_ij = scale * <q_i, k_j>  for j <= cache_seqlens[b] + i, else -inf   fp32 accumulate, S in fp32
//   lse_i = log sum_j exp(S_ij);  P_ij = exp(S_ij - lse_i)                   P stored in the dtype
//   O_i = sum_j P_ij v_j                                                     fp32 accumulate
// Three kernels over rows (b, h, i) x keys [0, max_seqlen): one thread per score, one warp per
// softmax row, one thread per output element. Cache rows are found through the block table when
// the cache is paged. Limits: fp32/fp16/bf16, any head dim; workspace B*H*S_new*max_seqlen
// scores (fp32 + dtype). Deterministic. Instantiations: 3 dtypes x 3 kernels.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "common/decode.cuh"
#include "common/dtype.cuh"
#include "common/switch.h"
#include "common/warp_reduce.cuh"
#include "flashattn/check.h"
#include "flashattn/error.h"
#include "flashattn/registry.h"

namespace flashattn {
namespace naive_dec {

constexpr int kThreads = 256;

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
  float* lse = nullptr;
  Strides q_st, o_st;
  decode::CacheAddr k_addr, v_addr;
  const int32_t* cache_seqlens = nullptr;
  int H = 0, group = 1, S_new = 0, D = 0, L_max = 0;
  float scale = 0.f;
  float* s = nullptr;  // workspace [rows, L_max]
  T* p = nullptr;      // workspace [rows, L_max]
};

// Row r = (b*H + h)*S_new + i; the keys it sees: [0, cache_seqlens[b] + i + 1).
template <class T>
__device__ inline int visible_end(const Args<T>& a, int64_t row) {
  const int64_t b = row / (static_cast<int64_t>(a.H) * a.S_new);
  return a.cache_seqlens[b] + static_cast<int>(row % a.S_new) + 1;
}

template <class T>
__global__ void scores_kernel(const Args<T> a, int64_t n) {
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < n;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int j = static_cast<int>(e % a.L_max);
    const int64_t row = e / a.L_max;
    const int64_t i = row % a.S_new, bh = row / a.S_new;
    const int h = static_cast<int>(bh % a.H), b = static_cast<int>(bh / a.H);
    float s = -INFINITY;
    if (j < visible_end(a, row)) {
      const T* q_row = a.q + b * a.q_st.batch + h * a.q_st.head + i * a.q_st.row;
      s = a.scale * dot_f32(q_row, a.k + a.k_addr.offset(b, h / a.group, j), a.D);
    }
    a.s[e] = s;
  }
}


template <class T>
__global__ void softmax_kernel(const Args<T> a, int64_t rows) {
  const int lane = threadIdx.x % 32;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (blockDim.x / 32);
  for (int64_t row = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) / 32; row < rows; row += warps) {
    const float* s_row = a.s + row * a.L_max;
    T* p_row = a.p + row * a.L_max;
    float m = -INFINITY;
    for (int j = lane; j < a.L_max; j += 32) m = fmaxf(m, s_row[j]);
    m = warp_max(m);
    float l = 0.f;
    if (m != -INFINITY)
      for (int j = lane; j < a.L_max; j += 32) l += expf(s_row[j] - m);
    l = warp_sum(l);
    const float lse = m == -INFINITY ? -INFINITY : m + logf(l);
    for (int j = lane; j < a.L_max; j += 32) p_row[j] = from_float<T>(lse == -INFINITY ? 0.f : expf(s_row[j] - lse));
    if (lane == 0) a.lse[row] = lse;
  }
}

template <class T>
__global__ void output_kernel(const Args<T> a, int64_t n) {
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < n;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int d = static_cast<int>(e % a.D);
    const int64_t row = e / a.D;
    const int64_t i = row % a.S_new, bh = row / a.S_new;
    const int h = static_cast<int>(bh % a.H), b = static_cast<int>(bh / a.H);
    float acc = 0.f;
    if (a.lse[row] != -INFINITY) {
      const T* p_row = a.p + row * a.L_max;
      const int end = visible_end(a, row);
      for (int j = 0; j < end; ++j) acc += to_float(p_row[j]) * to_float(a.v[a.v_addr.offset(b, h / a.group, j) + d]);
    }
    a.o[b * a.o_st.batch + h * a.o_st.head + i * a.o_st.row + d] = from_float<T>(acc);
  }
}

size_t workspace_bytes(const DecodeParams& p) {
  const size_t n = static_cast<size_t>(p.B) * p.H * p.S_new * p.max_seqlen;
  return decode::align256(n * sizeof(float)) + decode::align256(n * dtype_size(p.dtype));
}

template <class T>
void launch(const DecodeParams& p, const LaunchContext& ctx) {
  Args<T> a;
  a.q = static_cast<const T*>(p.q);
  a.k = static_cast<const T*>(p.k_cache);
  a.v = static_cast<const T*>(p.v_cache);
  a.o = static_cast<T*>(p.o);
  a.lse = static_cast<float*>(p.lse);
  a.q_st = p.q_st, a.o_st = p.o_st;
  a.k_addr = decode::cache_addr(p, p.k_cache_st);
  a.v_addr = decode::cache_addr(p, p.v_cache_st);
  a.cache_seqlens = p.cache_seqlens;
  a.H = p.H, a.group = p.H / p.H_kv, a.S_new = p.S_new, a.D = p.D, a.L_max = p.max_seqlen;
  a.scale = p.scale;
  const size_t n = static_cast<size_t>(p.B) * p.H * p.S_new * p.max_seqlen;
  char* ws = static_cast<char*>(p.workspace);
  a.s = reinterpret_cast<float*>(ws);
  a.p = reinterpret_cast<T*>(ws + decode::align256(n * sizeof(float)));
  const int64_t rows = static_cast<int64_t>(p.B) * p.H * p.S_new;
  const int64_t n_scores = rows * p.max_seqlen, n_out = rows * p.D;
  scores_kernel<T><<<blocks_for(n_scores, kThreads), kThreads, 0, ctx.stream>>>(a, n_scores);
  CHECK_LAUNCH("naive decode scores_kernel");
  softmax_kernel<T><<<blocks_for(rows, kThreads / 32), kThreads, 0, ctx.stream>>>(a, rows);
  CHECK_LAUNCH("naive decode softmax_kernel");
  output_kernel<T><<<blocks_for(n_out, kThreads), kThreads, 0, ctx.stream>>>(a, n_out);
  CHECK_LAUNCH("naive decode output_kernel");
}

void run(const DecodeParams& p, const LaunchContext& ctx) {
  if (static_cast<int64_t>(p.B) * p.H * p.S_new * p.D == 0) return;
  if (p.H_kv <= 0 || p.H % p.H_kv != 0) throw RuntimeError("naive decode: H must be a multiple of H_kv");
  if (p.max_seqlen < 1) throw RuntimeError("naive decode: max_seqlen must be set (max of cache_seqlens + S_new)");
  if (p.workspace == nullptr || p.workspace_bytes < workspace_bytes(p))
    throw RuntimeError("naive decode: workspace smaller than its workspace function asked for");
  DTYPE_SWITCH(p.dtype, T, [&] { launch<T>(p, ctx); });
}

KernelMode make_entry() {
  KernelMode m;
  m.kernel = "naive";
  m.mode = Mode::Decode;
  m.summary = "materialised attention: separate GEMM, softmax and GEMM kernels, one thread per output";
  m.rung = 1;
  m.gpu = true;
  m.min_sm = 70;
  m.dtypes = dtype_bit(DType::F32) | dtype_bit(DType::F16) | dtype_bit(DType::BF16);
  m.max_head_dim = 0;
  m.features = kFeatGQA | kFeatPadding | kFeatPaged;
  m.dec = &run;
  m.dec_workspace = &workspace_bytes;
  m.dec_splits = nullptr;  // no split-K
  return m;
}

}  // namespace naive_dec
}  // namespace flashattn

FLASHATTN_REGISTER_KERNEL_MODE(naive_decode, flashattn::naive_dec::make_entry)
