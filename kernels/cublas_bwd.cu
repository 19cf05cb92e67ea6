// cublas, backward — rung 2 of the ladder: standard attention backward with cuBLAS GEMMs, the
// in-process baseline. Over naive: tensor-core GEMMs and one fused elementwise pass.
//   S  = scale * Q K^T                         GEMM, fp32 out (recomputed, as the forward did)
//   dP = dO V^T                                GEMM, fp32 out
//   D_i = rowsum(dO_i * O_i);  P = exp(S + mask - lse) (0 where invisible or the row is empty);
//   dS = P * (dP - D_i)                        one fused pass; P, dS stored in the dtype
//   dV = P^T dO,  dQ = scale * dS K,  dK = scale * dS^T Q     GEMMs, fp32 accumulate
// GQA: a kv head's dK/dV sum over the G query heads of its group. With G > 1 the dK/dV GEMMs run
// in G rounds (round r takes query head g*G + r of every group) into fp32 accumulators, beta = 1
// after the first round, then one kernel converts them to the dtype; with G = 1 the GEMMs write
// dK/dV directly. No atomics: bitwise reproducible.
//
// Row-major <-> column-major (see cublas_fwd.cu): row-major X (r x c, stride ld) is column-major
// X^T (c x r, ld). Each product is computed transposed:
//   S^T  (S_k x S_q) = K . Q^T          A = K^T stored, op T;   B = Q^T stored, op N
//   dP^T (S_k x S_q) = V . dO^T         A = V^T stored, op T;   B = dO^T stored, op N
//   dV^T (D x S_k)   = dO^T . P         A = dO^T stored, op N;  B = P^T stored, op T
//   dQ^T (D x S_q)   = K^T . dS^T       A = K^T stored, op N;   B = dS^T stored, op N
//   dK^T (D x S_k)   = Q^T . dS         A = Q^T stored, op N;   B = dS^T stored, op T
//
// Workspace: two fp32 S_q x S_k matrices per (b, h), 256-byte aligned: S (overwritten in place by
// P in the dtype) and dP (overwritten by dS), plus with G > 1 two fp32 [B, H_kv, S_k, D]
// accumulators, plus the pointer arrays.
// Limits: fp32/fp16/bf16, any head dim, every feature.
// Measured: see README.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "common/cublas_util.h"
#include "common/dtype.cuh"
#include "common/mask.cuh"
#include "common/switch.h"
#include "common/warp_reduce.cuh"
#include "flashattn/check.h"
#include "flashattn/error.h"
#include "flashattn/registry.h"

namespace flashattn {
namespace cublas_bwd {

constexpr int kThreads = 256;
constexpr int kUnroll = 4;
constexpr int kNumGemms = 5;

inline size_t align256(size_t n) { return (n + 255) / 256 * 256; }

inline unsigned blocks_for(int64_t n, int per_block) {
  const int64_t blocks = (n + per_block - 1) / per_block;
  return static_cast<unsigned>(blocks < (int64_t{1} << 24) ? blocks : (int64_t{1} << 24));
}

// Byte sizes of the workspace pieces; each piece starts 256-byte aligned.
struct Workspace {
  int64_t scratch_head = 0;  // one (b, h) S_q x S_k fp32 matrix, padded
  int64_t scratch = 0;       // B*H of them (one buffer; there are two)
  int64_t acc_head = 0;      // one (b, g) S_k x D fp32 accumulator, padded; 0 when G = 1
  int64_t acc = 0;           // B*H_kv of them (one buffer; there are two)
  int64_t pointers = 0;
  explicit Workspace(const BwdParams& p) {
    const blas::BatchShape shape{p.B, p.H, p.H_kv};
    scratch_head = static_cast<int64_t>(align256(static_cast<size_t>(p.S_q) * p.S_k * sizeof(float)));
    scratch = shape.entries() * scratch_head;
    if (p.H != p.H_kv) {
      acc_head = static_cast<int64_t>(align256(static_cast<size_t>(p.S_k) * p.D * sizeof(float)));
      acc = static_cast<int64_t>(p.B) * p.H_kv * acc_head;
    }
    pointers = static_cast<int64_t>(align256(blas::GemmBatch::pointer_bytes(kNumGemms, shape)));
  }
  size_t total() const { return static_cast<size_t>(2 * scratch + 2 * acc + pointers); }
};

size_t workspace_bytes(const BwdParams& p) { return Workspace(p).total(); }

template <class T>
struct DSoftmaxArgs {
  char* s_scratch = nullptr;   // S in, P out
  char* dp_scratch = nullptr;  // dP in, dS out
  int64_t head_bytes = 0;
  const T* o = nullptr;
  const T* dout = nullptr;
  Strides o_st, do_st;
  const float* lse = nullptr;
  int H = 0, S_q = 0, S_k = 0, D = 0;
  int64_t rows = 0;
  Visibility vis;
};

// Sum over the row's threads, identical in each of them.
template <int kRowThreads>
__device__ inline float row_sum(float x, float* sm) {
  x = warp_sum(x);
  if constexpr (kRowThreads > 32) {
    __syncthreads();  // the previous row's readers are done with sm
    if (threadIdx.x % 32 == 0) sm[threadIdx.x / 32] = x;
    __syncthreads();
    x = sm[0];
    for (int w = 1; w < kRowThreads / 32; ++w) x += sm[w];
  }
  return x;
}

template <int kRowThreads>
__device__ inline void row_sync() {
  if constexpr (kRowThreads > 32) __syncthreads(); else __syncwarp();
}

// One row of kRowThreads threads per query row. P and dS are written in place over S and dP; the
// batch-then-barrier structure that makes this safe for 16-bit outputs is the forward's (see
// softmax_kernel in cublas_fwd.cu): batch t writes only bytes of entries that every thread of the
// row read in batches <= t, before the barrier.
template <class T, int kRowThreads>
__global__ void __launch_bounds__(kThreads) dsoftmax_kernel(DSoftmaxArgs<T> a) {
  static_assert(kThreads % kRowThreads == 0 && kRowThreads % 32 == 0, "rows are whole warps");
  constexpr int kRowsPerBlock = kThreads / kRowThreads;
  constexpr bool kNarrowing = sizeof(T) < sizeof(float);
  __shared__ float sm[kThreads / 32];
  const int t = threadIdx.x % kRowThreads;
  const int64_t row_blocks = (a.rows + kRowsPerBlock - 1) / kRowsPerBlock;
  for (int64_t rb = blockIdx.x; rb < row_blocks; rb += gridDim.x) {
    const int64_t row = rb * kRowsPerBlock + threadIdx.x / kRowThreads;
    if (row >= a.rows) continue;  // only with several rows per block, so only warp-wide
    const int64_t i = row % a.S_q, bh = row / a.S_q;
    const int64_t h = bh % a.H, b = bh / a.H;
    const int64_t row_offset = bh * a.head_bytes + i * a.S_k * static_cast<int64_t>(sizeof(float));
    const float* s_row = reinterpret_cast<const float*>(a.s_scratch + row_offset);
    const float* dp_row = reinterpret_cast<const float*>(a.dp_scratch + row_offset);
    T* p_row = reinterpret_cast<T*>(a.s_scratch + row_offset);
    T* ds_row = reinterpret_cast<T*>(a.dp_scratch + row_offset);

    // D_i = sum_d dO[i, d] * O[i, d]
    const T* o_row = a.o + b * a.o_st.batch + h * a.o_st.head + i * a.o_st.row;
    const T* do_row = a.dout + b * a.do_st.batch + h * a.do_st.head + i * a.do_st.row;
    float part = 0.f;
    for (int d = t; d < a.D; d += kRowThreads) part += to_float(do_row[d]) * to_float(o_row[d]);
    const float delta = row_sum<kRowThreads>(part, sm);

    const float lse = a.lse[row];
    const IndexRange keys = a.vis.keys(i, a.vis.seqlen_k(b));
    for (int64_t j0 = 0; j0 < a.S_k; j0 += kRowThreads * kUnroll) {
      float p[kUnroll], dp[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int64_t j = j0 + u * kRowThreads + t;
        const bool live = lse != -INFINITY && j >= keys.begin && j < keys.end;
        p[u] = live ? expf(s_row[j] + a.vis.bias(b, h, i, j) - lse) : 0.f;  // P = exp(S - lse)
        dp[u] = live ? dp_row[j] : 0.f;
      }
      if constexpr (kNarrowing) row_sync<kRowThreads>();
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int64_t j = j0 + u * kRowThreads + t;
        if (j >= a.S_k) continue;
        const T p_t = from_float<T>(p[u]);
        // dS = P (dP - D) with P as stored, what a framework's softmax backward reads.
        p_row[j] = p_t;
        ds_row[j] = from_float<T>(p[u] == 0.f ? 0.f : to_float(p_t) * (dp[u] - delta));
      }
    }
  }
}

// dK, dV (dtype, strided) from the fp32 accumulators [B, H_kv] x (S_k x D, padded per head).
template <class T>
__global__ void convert_kernel(const float* acc_k, const float* acc_v, int64_t acc_head_elems, T* dk,
                               Strides dk_st, T* dv, Strides dv_st, int H_kv, int S_k, int D, int64_t n) {
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < n;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t d = e % D, rest = e / D;
    const int64_t j = rest % S_k, bg = rest / S_k;
    const int64_t g = bg % H_kv, b = bg / H_kv;
    const int64_t src = bg * acc_head_elems + j * D + d;
    dk[b * dk_st.batch + g * dk_st.head + j * dk_st.row + d] = from_float<T>(acc_k[src]);
    dv[b * dv_st.batch + g * dv_st.head + j * dv_st.row + d] = from_float<T>(acc_v[src]);
  }
}

// Where the scratch lives and the five GEMMs, as plain data (dtype-independent).
struct Plan {
  blas::BatchShape shape;
  Workspace ws;
  char* s_scratch = nullptr;   // S, then P over it
  char* dp_scratch = nullptr;  // dP, then dS over it
  char* acc_k = nullptr;       // fp32 dK, dV sums when G > 1
  char* acc_v = nullptr;
  void* pointers = nullptr;    // GemmBatch pointer arrays
  blas::GemmOp s, dp, dv, dq, dk;
  explicit Plan(const BwdParams& p) : ws(p) {}
};

Plan make_plan(const BwdParams& p) {
  using blas::BatchOrder;
  using blas::gemm_op;
  Plan plan(p);
  plan.shape = blas::BatchShape{p.B, p.H, p.H_kv};
  const Workspace& ws = plan.ws;
  plan.s_scratch = static_cast<char*>(p.workspace);
  plan.dp_scratch = plan.s_scratch + ws.scratch;
  plan.acc_k = plan.dp_scratch + ws.scratch;
  plan.acc_v = plan.acc_k + ws.acc;
  plan.pointers = plan.acc_v + ws.acc;

  const size_t es = dtype_size(p.dtype);
  const cudaDataType_t dt = blas::cuda_type(p.dtype);
  const blas::MatSpec s_spec{plan.s_scratch, p.H * ws.scratch_head, ws.scratch_head, /*kv_head=*/false};
  const blas::MatSpec dp_spec{plan.dp_scratch, p.H * ws.scratch_head, ws.scratch_head, /*kv_head=*/false};
  const int ld_f32 = p.S_k;                                        // S, dP
  const int ld_t = static_cast<int>(p.S_k * sizeof(float) / es);  // P, dS written over them

  const blas::MatSpec q = blas::mat_spec(p.q, p.q_st.batch, p.q_st.head, es, /*kv_head=*/false);
  const blas::MatSpec k = blas::mat_spec(p.k, p.k_st.batch, p.k_st.head, es, /*kv_head=*/true);
  const blas::MatSpec v = blas::mat_spec(p.v, p.v_st.batch, p.v_st.head, es, /*kv_head=*/true);
  const blas::MatSpec dout = blas::mat_spec(p.dout, p.do_st.batch, p.do_st.head, es, /*kv_head=*/false);
  const blas::MatSpec dq = blas::mat_spec(p.dq, p.dq_st.batch, p.dq_st.head, es, /*kv_head=*/false);
  const int ld_q = blas::leading_dim(p.q_st.row, p.S_q, p.D);
  const int ld_k = blas::leading_dim(p.k_st.row, p.S_k, p.D);
  const int ld_v = blas::leading_dim(p.v_st.row, p.S_k, p.D);
  const int ld_do = blas::leading_dim(p.do_st.row, p.S_q, p.D);
  const int ld_dq = blas::leading_dim(p.dq_st.row, p.S_q, p.D);

  // With G = 1 the dK/dV GEMMs write the outputs; otherwise the fp32 accumulators (leading dim D).
  blas::MatSpec dk_out, dv_out;
  int ld_dk = p.D, ld_dv = p.D;
  cudaDataType_t type_dkv = CUDA_R_32F;
  if (p.H == p.H_kv) {
    dk_out = blas::mat_spec(p.dk, p.dk_st.batch, p.dk_st.head, es, /*kv_head=*/true);
    dv_out = blas::mat_spec(p.dv, p.dv_st.batch, p.dv_st.head, es, /*kv_head=*/true);
    ld_dk = blas::leading_dim(p.dk_st.row, p.S_k, p.D);
    ld_dv = blas::leading_dim(p.dv_st.row, p.S_k, p.D);
    type_dkv = dt;
  } else {
    dk_out = blas::MatSpec{plan.acc_k, p.H_kv * ws.acc_head, ws.acc_head, /*kv_head=*/true};
    dv_out = blas::MatSpec{plan.acc_v, p.H_kv * ws.acc_head, ws.acc_head, /*kv_head=*/true};
  }

  // Operands: (matrix, type, leading dim) for A, then B, then C.
  // S^T = K . Q^T                    (m = S_k, n = S_q, k = D)
  plan.s = gemm_op(CUBLAS_OP_T, CUBLAS_OP_N, p.S_k, p.S_q, p.D,
                   k, dt, ld_k, q, dt, ld_q, s_spec, CUDA_R_32F, ld_f32);
  // dP^T = V . dO^T                  (m = S_k, n = S_q, k = D)
  plan.dp = gemm_op(CUBLAS_OP_T, CUBLAS_OP_N, p.S_k, p.S_q, p.D,
                    v, dt, ld_v, dout, dt, ld_do, dp_spec, CUDA_R_32F, ld_f32);
  // dV^T = dO^T . P                  (m = D, n = S_k, k = S_q), in rounds over the group's heads
  plan.dv = gemm_op(CUBLAS_OP_N, CUBLAS_OP_T, p.D, p.S_k, p.S_q,
                    dout, dt, ld_do, s_spec, dt, ld_t, dv_out, type_dkv, ld_dv, BatchOrder::kGroupRound);
  // dQ^T = K^T . dS^T                (m = D, n = S_q, k = S_k)
  plan.dq = gemm_op(CUBLAS_OP_N, CUBLAS_OP_N, p.D, p.S_q, p.S_k,
                    k, dt, ld_k, dp_spec, dt, ld_t, dq, dt, ld_dq);
  // dK^T = Q^T . dS                  (m = D, n = S_k, k = S_q), in rounds over the group's heads
  plan.dk = gemm_op(CUBLAS_OP_N, CUBLAS_OP_T, p.D, p.S_k, p.S_q,
                    q, dt, ld_q, dp_spec, dt, ld_t, dk_out, type_dkv, ld_dk, BatchOrder::kGroupRound);
  return plan;
}

template <class T>
void launch(const BwdParams& p, const LaunchContext& ctx) {
  cublasHandle_t handle = blas::handle_of(ctx);
  blas::HandleStateGuard guard(handle);
  const Plan plan = make_plan(p);
  const int G = plan.shape.group();
  const int64_t all = plan.shape.entries();
  const int64_t per_round = static_cast<int64_t>(p.B) * p.H_kv;

  blas::GemmBatch gemms(plan.shape, plan.pointers, handle, ctx.stream);
  const int op_s = gemms.add(plan.s);
  const int op_dp = gemms.add(plan.dp);
  const int op_dv = gemms.add(plan.dv);
  const int op_dq = gemms.add(plan.dq);
  const int op_dk = gemms.add(plan.dk);
  gemms.fill_pointers();

  gemms.run(op_s, /*alpha=*/p.scale, /*beta=*/0.f, 0, all);
  gemms.run(op_dp, /*alpha=*/1.f, /*beta=*/0.f, 0, all);

  DSoftmaxArgs<T> da;
  da.s_scratch = plan.s_scratch;
  da.dp_scratch = plan.dp_scratch;
  da.head_bytes = plan.ws.scratch_head;
  da.o = static_cast<const T*>(p.o);
  da.dout = static_cast<const T*>(p.dout);
  da.o_st = p.o_st;
  da.do_st = p.do_st;
  da.lse = static_cast<const float*>(p.lse);
  da.H = p.H;
  da.S_q = p.S_q;
  da.S_k = p.S_k;
  da.D = p.D;
  da.rows = all * p.S_q;
  da.vis = make_visibility(p);
  if (p.S_k <= 1024) {  // as in the forward: a warp per row up to 1024 keys, else a block
    dsoftmax_kernel<T, 32><<<blocks_for(da.rows, kThreads / 32), kThreads, 0, ctx.stream>>>(da);
    CHECK_LAUNCH("cublas dsoftmax_kernel (warp rows)");
  } else {
    dsoftmax_kernel<T, kThreads><<<blocks_for(da.rows, 1), kThreads, 0, ctx.stream>>>(da);
    CHECK_LAUNCH("cublas dsoftmax_kernel (block rows)");
  }

  for (int r = 0; r < G; ++r)
    gemms.run(op_dv, /*alpha=*/1.f, /*beta=*/r == 0 ? 0.f : 1.f, r * per_round, per_round);
  gemms.run(op_dq, /*alpha=*/p.scale, /*beta=*/0.f, 0, all);
  for (int r = 0; r < G; ++r)
    gemms.run(op_dk, /*alpha=*/p.scale, /*beta=*/r == 0 ? 0.f : 1.f, r * per_round, per_round);

  if (G > 1) {
    const int64_t n = per_round * p.S_k * p.D;
    convert_kernel<T><<<blocks_for(n, kThreads), kThreads, 0, ctx.stream>>>(
        reinterpret_cast<const float*>(plan.acc_k), reinterpret_cast<const float*>(plan.acc_v),
        plan.ws.acc_head / static_cast<int64_t>(sizeof(float)), static_cast<T*>(p.dk), p.dk_st,
        static_cast<T*>(p.dv), p.dv_st, p.H_kv, p.S_k, p.D, n);
    CHECK_LAUNCH("cublas convert_kernel");
  }
}

void run(const BwdParams& p, const LaunchContext& ctx) {
  if (static_cast<int64_t>(p.B) * p.H * p.S_q * p.S_k * p.D == 0) return;
  if (p.H_kv <= 0 || p.H % p.H_kv != 0) throw RuntimeError("cublas backward: H must be a multiple of H_kv");
  if (p.workspace == nullptr || p.workspace_bytes < workspace_bytes(p))
    throw RuntimeError("cublas backward: workspace smaller than its workspace function asked for");
  DTYPE_SWITCH(p.dtype, T, [&] { launch<T>(p, ctx); });
}

KernelMode make_entry() {
  KernelMode m;
  m.kernel = "cublas";
  m.role = KernelRole::Baseline;
  m.mode = Mode::Backward;
  m.summary = "standard attention backward: cuBLAS batched GEMMs + one fused dsoftmax kernel";
  m.rung = 2;
  m.gpu = true;
  m.min_sm = 80;  // as the forward: bf16 GEMMs need sm_80
  m.dtypes = dtype_bit(DType::F32) | dtype_bit(DType::F16) | dtype_bit(DType::BF16);
  m.max_head_dim = 0;
  m.features = kAllFeatures;
  m.uses_atomics = false;
  m.uses_cublas = true;
  m.bwd = &run;
  m.bwd_workspace = &workspace_bytes;
  return m;
}

}  // namespace cublas_bwd
}  // namespace flashattn

FLASHATTN_REGISTER_KERNEL_MODE(cublas_backward, flashattn::cublas_bwd::make_entry)
