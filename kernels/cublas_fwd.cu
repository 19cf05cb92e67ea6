// cublas, forward — rung 2 of the ladder: the standard attention a user would write in-process,
// and the baseline column of every table. Over naive it swaps the one-thread-per-output GEMMs for
// cuBLAS tensor-core GEMMs and fuses masking and softmax into one kernel that reads S once more:
//   S = scale * Q K^T          cublasGemmBatchedEx, fp32 out                  (B*H GEMMs)
//   S += mask; invisible -> -inf; lse = log rowsum exp(S); P = exp(S - lse)   (one fused pass)
//   O = P V                    cublasGemmBatchedEx, fp32 accumulate, dtype out
// Every GEMM computes in fp32 (CUBLAS_COMPUTE_32F, never TF32). Pointer arrays address each
// (batch, head) matrix through the tensors' element strides, so bhsd, bshd and GQA all take the
// same calls.
//
// Row-major tensors as cuBLAS column-major matrices: a row-major X (rows x cols, row stride ld)
// is the column-major X^T (cols x rows, leading dim ld). So we compute transposes:
//   S^T (S_k x S_q) = K (S_k x D) . Q^T (D x S_q):  A = K^T stored, op T;  B = Q^T stored, op N
//   O^T (D x S_q)   = V^T (D x S_k) . P^T (S_k x S_q): A = V^T stored, op N; B = P^T stored, op N
//
// Workspace: one fp32 S_q x S_k matrix per (b, h) (each padded to 256 bytes), which the fused
// pass overwrites in place with P in the dtype (row i of P starts where row i of S started; a
// 16-bit P uses half of each row, so its leading dim is 2*S_k), plus the pointer arrays.
// Limits: fp32/fp16/bf16, any head dim, every feature; O(B*H*S_q*S_k) fp32 workspace.
// Measured: see README.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "common/cublas_util.h"
#include "common/dtype.cuh"
#include "common/mask.cuh"
#include "common/switch.h"
#include "flashattn/check.h"
#include "flashattn/error.h"
#include "flashattn/registry.h"

namespace flashattn {
namespace cublas_fwd {

constexpr int kThreads = 256;
constexpr int kUnroll = 4;  // loads in flight per thread: the pass is bound by memory latency

inline size_t align256(size_t n) { return (n + 255) / 256 * 256; }

// One (b, h) score matrix, padded so every matrix starts 256-byte aligned (what cuBLAS's vector
// loads want, see blas::batched_addresses_ok).
inline int64_t scratch_head_bytes(int S_q, int S_k) {
  return static_cast<int64_t>(align256(static_cast<size_t>(S_q) * S_k * sizeof(float)));
}

size_t workspace_bytes(const FwdParams& p) {
  const blas::BatchShape shape{p.B, p.H, p.H_kv};
  return static_cast<size_t>(shape.entries()) * scratch_head_bytes(p.S_q, p.S_k) +
         align256(blas::GemmBatch::pointer_bytes(2, shape));
}

struct SoftmaxArgs {
  char* scratch = nullptr;  // S in, P out, per (b, h) matrix of head_bytes
  int64_t head_bytes = 0;
  float* lse = nullptr;
  int H = 0, S_q = 0, S_k = 0;
  int64_t rows = 0;  // B*H*S_q
  Visibility vis;
};

// Softmax statistics (m, l): running max and sum of exp(s - m); m = -inf means no finite score yet.
struct RowStats {
  float m = -INFINITY;
  float l = 0.f;
};

__device__ inline RowStats merge(RowStats a, RowStats b) {
  const float m = fmaxf(a.m, b.m);
  if (m == -INFINITY) return a;
  // l_new = l_a exp(m_a - m_new) + l_b exp(m_b - m_new); symmetric, so both lanes of a shuffle
  // pair compute the same bits.
  return RowStats{m, a.l * expf(a.m - m) + b.l * expf(b.m - m)};
}

// (m, l) of the row, identical in every thread of the row.
template <int kRowThreads>
__device__ inline RowStats row_reduce(RowStats st, float* sm_m, float* sm_l) {
  for (int off = 16; off > 0; off /= 2) {
    const RowStats other{__shfl_xor_sync(0xffffffffu, st.m, off), __shfl_xor_sync(0xffffffffu, st.l, off)};
    st = merge(st, other);
  }
  if constexpr (kRowThreads > 32) {
    constexpr int kWarps = kRowThreads / 32;
    const int warp = threadIdx.x / 32;
    __syncthreads();  // the previous row's readers are done with sm_m / sm_l
    if (threadIdx.x % 32 == 0) {
      sm_m[warp] = st.m;
      sm_l[warp] = st.l;
    }
    __syncthreads();
    st = RowStats{sm_m[0], sm_l[0]};
    for (int w = 1; w < kWarps; ++w) st = merge(st, RowStats{sm_m[w], sm_l[w]});
  }
  return st;
}

template <int kRowThreads>
__device__ inline void row_sync() {
  if constexpr (kRowThreads > 32) __syncthreads(); else __syncwarp();
}

// One row of kRowThreads threads per query row (a warp for short rows, the whole block for long
// ones). Pass 1 reads the visible scores for (m, l); pass 2 reads them again (mostly from L2: the
// rows in flight take a few MB) and writes P over S.
//
// Writing a 16-bit P in place is safe because of the batch structure of pass 2: batch t reads
// S[j] for j in [tW, (t+1)W), W = kRowThreads*kUnroll, synchronises the row, then writes P[j],
// which occupies the bytes of S[j/2]; for t >= 1 those are S entries of earlier batches, already
// read by every thread of the row, and for t = 0 they were read before the barrier. S and P
// alias, so neither pointer may be __restrict__ (no read-only-cache loads).
template <class T, int kRowThreads>
__global__ void __launch_bounds__(kThreads) softmax_kernel(SoftmaxArgs a) {
  static_assert(kThreads % kRowThreads == 0 && kRowThreads % 32 == 0, "rows are whole warps");
  constexpr int kRowsPerBlock = kThreads / kRowThreads;
  constexpr bool kNarrowing = sizeof(T) < sizeof(float);
  __shared__ float sm_m[kThreads / 32], sm_l[kThreads / 32];
  const int t = threadIdx.x % kRowThreads;
  const int64_t row_blocks = (a.rows + kRowsPerBlock - 1) / kRowsPerBlock;
  for (int64_t rb = blockIdx.x; rb < row_blocks; rb += gridDim.x) {
    const int64_t row = rb * kRowsPerBlock + threadIdx.x / kRowThreads;
    if (row >= a.rows) continue;  // only with several rows per block, so only warp-wide
    const int64_t i = row % a.S_q, bh = row / a.S_q;
    const int64_t h = bh % a.H, b = bh / a.H;
    char* row_base = a.scratch + bh * a.head_bytes + i * a.S_k * static_cast<int64_t>(sizeof(float));
    const float* s_row = reinterpret_cast<const float*>(row_base);
    T* p_row = reinterpret_cast<T*>(row_base);
    const IndexRange keys = a.vis.keys(i, a.vis.seqlen_k(b));

    // Pass 1: m = rowmax(S), l = rowsum(exp(S - m)) over the visible keys.
    RowStats st;
    for (int64_t j0 = keys.begin; j0 < keys.end; j0 += kRowThreads * kUnroll) {
      float s[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int64_t j = j0 + u * kRowThreads + t;
        s[u] = j < keys.end ? s_row[j] + a.vis.bias(b, h, i, j) : -INFINITY;
      }
      float m_new = st.m;  // m_new = max(m, max_u s_u)
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) m_new = fmaxf(m_new, s[u]);
      if (m_new != -INFINITY) {
        float l_new = st.l * expf(st.m - m_new);  // l_new = l exp(m - m_new) + sum_u exp(s_u - m_new)
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) l_new += expf(s[u] - m_new);
        st = RowStats{m_new, l_new};
      }
    }
    st = row_reduce<kRowThreads>(st, sm_m, sm_l);
    const float lse = st.m == -INFINITY ? -INFINITY : st.m + logf(st.l);
    if (t == 0) a.lse[row] = lse;
    // Pass 2 hands the keys to threads from j = 0, pass 1 from keys.begin: order every pass-1 read
    // before any pass-2 write of the row.
    row_sync<kRowThreads>();

    // Pass 2: P = exp(S - lse), 0 outside the visible keys and in empty rows.
    for (int64_t j0 = 0; j0 < a.S_k; j0 += kRowThreads * kUnroll) {
      float p[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int64_t j = j0 + u * kRowThreads + t;
        const bool live = lse != -INFINITY && j >= keys.begin && j < keys.end;
        p[u] = live ? expf(s_row[j] + a.vis.bias(b, h, i, j) - lse) : 0.f;
      }
      if constexpr (kNarrowing) row_sync<kRowThreads>();
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int64_t j = j0 + u * kRowThreads + t;
        if (j < a.S_k) p_row[j] = from_float<T>(p[u]);
      }
    }
  }
}

// Where the scratch lives and the two GEMMs, as plain data (dtype-independent).
struct Plan {
  blas::BatchShape shape;
  char* scratch = nullptr;  // B*H matrices of head_bytes: S, then P over it
  int64_t head_bytes = 0;
  void* pointers = nullptr;  // GemmBatch pointer arrays
  blas::GemmOp qk, pv;
};

Plan make_plan(const FwdParams& p) {
  Plan plan;
  plan.shape = blas::BatchShape{p.B, p.H, p.H_kv};
  const size_t es = dtype_size(p.dtype);
  const cudaDataType_t dt = blas::cuda_type(p.dtype);
  plan.head_bytes = scratch_head_bytes(p.S_q, p.S_k);
  plan.scratch = static_cast<char*>(p.workspace);
  plan.pointers = plan.scratch + plan.shape.entries() * plan.head_bytes;
  const blas::MatSpec scratch{plan.scratch, p.H * plan.head_bytes, plan.head_bytes, /*kv_head=*/false};

  // S^T = K . Q^T  (column-major m = S_k, n = S_q, k = D)
  const blas::MatSpec k = blas::mat_spec(p.k, p.k_st.batch, p.k_st.head, es, /*kv_head=*/true);
  const blas::MatSpec q = blas::mat_spec(p.q, p.q_st.batch, p.q_st.head, es, /*kv_head=*/false);
  plan.qk = blas::gemm_op(CUBLAS_OP_T, CUBLAS_OP_N, p.S_k, p.S_q, p.D,
                          k, dt, blas::leading_dim(p.k_st.row, p.S_k, p.D),
                          q, dt, blas::leading_dim(p.q_st.row, p.S_q, p.D),
                          scratch, CUDA_R_32F, /*ldc=*/p.S_k);

  // O^T = V^T . P^T  (m = D, n = S_q, k = S_k); P rows are S rows reinterpreted, so a 16-bit P
  // has leading dim 2*S_k.
  const blas::MatSpec v = blas::mat_spec(p.v, p.v_st.batch, p.v_st.head, es, /*kv_head=*/true);
  const blas::MatSpec o = blas::mat_spec(p.o, p.o_st.batch, p.o_st.head, es, /*kv_head=*/false);
  const int ld_p = static_cast<int>(p.S_k * sizeof(float) / es);
  plan.pv = blas::gemm_op(CUBLAS_OP_N, CUBLAS_OP_N, p.D, p.S_q, p.S_k,
                          v, dt, blas::leading_dim(p.v_st.row, p.S_k, p.D),
                          scratch, dt, ld_p,
                          o, dt, blas::leading_dim(p.o_st.row, p.S_q, p.D));
  return plan;
}

template <class T>
void launch(const FwdParams& p, const LaunchContext& ctx) {
  cublasHandle_t handle = blas::handle_of(ctx);
  blas::HandleStateGuard guard(handle);
  const Plan plan = make_plan(p);
  const int64_t entries = plan.shape.entries();
  blas::GemmBatch gemms(plan.shape, plan.pointers, handle, ctx.stream);
  const int op_qk = gemms.add(plan.qk);
  const int op_pv = gemms.add(plan.pv);
  gemms.fill_pointers();

  gemms.run(op_qk, /*alpha=*/p.scale, /*beta=*/0.f, 0, entries);

  SoftmaxArgs sa;
  sa.scratch = plan.scratch;
  sa.head_bytes = plan.head_bytes;
  sa.lse = static_cast<float*>(p.lse);
  sa.H = p.H;
  sa.S_q = p.S_q;
  sa.S_k = p.S_k;
  sa.rows = entries * p.S_q;
  sa.vis = make_visibility(p);
  // A warp covers rows up to 1024 keys with 32 loads per lane; longer rows get the whole block.
  const bool warp_rows = p.S_k <= 1024;
  const int64_t rows_per_block = warp_rows ? kThreads / 32 : 1;
  const int64_t blocks = (sa.rows + rows_per_block - 1) / rows_per_block;
  const unsigned grid = static_cast<unsigned>(blocks < (int64_t{1} << 24) ? blocks : (int64_t{1} << 24));
  if (warp_rows) {
    softmax_kernel<T, 32><<<grid, kThreads, 0, ctx.stream>>>(sa);
    CHECK_LAUNCH("cublas softmax_kernel (warp rows)");
  } else {
    softmax_kernel<T, kThreads><<<grid, kThreads, 0, ctx.stream>>>(sa);
    CHECK_LAUNCH("cublas softmax_kernel (block rows)");
  }

  gemms.run(op_pv, /*alpha=*/1.f, /*beta=*/0.f, 0, entries);
}

void run(const FwdParams& p, const LaunchContext& ctx) {
  if (static_cast<int64_t>(p.B) * p.H * p.S_q * p.S_k * p.D == 0) return;
  if (p.H_kv <= 0 || p.H % p.H_kv != 0) throw RuntimeError("cublas forward: H must be a multiple of H_kv");
  if (p.workspace == nullptr || p.workspace_bytes < workspace_bytes(p))
    throw RuntimeError("cublas forward: workspace smaller than its workspace function asked for");
  DTYPE_SWITCH(p.dtype, T, [&] { launch<T>(p, ctx); });
}

KernelMode make_entry() {
  KernelMode m;
  m.kernel = "cublas";
  m.role = KernelRole::Baseline;  // the default of the speedup column
  m.mode = Mode::Forward;
  m.summary = "standard attention: cuBLAS batched GEMMs + one fused mask/softmax kernel";
  m.rung = 2;
  m.gpu = true;
  m.min_sm = 80;  // bf16 GEMMs (CUDA_R_16BF) need sm_80; one entry covers every dtype
  m.dtypes = dtype_bit(DType::F32) | dtype_bit(DType::F16) | dtype_bit(DType::BF16);
  m.max_head_dim = 0;  // any D
  m.features = kAllFeatures;
  m.uses_atomics = false;
  m.uses_cublas = true;
  m.fwd = &run;
  m.fwd_workspace = &workspace_bytes;
  return m;
}

}  // namespace cublas_fwd
}  // namespace flashattn

FLASHATTN_REGISTER_KERNEL_MODE(cublas_forward, flashattn::cublas_fwd::make_entry)
