// fa2, backward — rung 5 of the ladder: FlashAttention-2's backward pass (Dao 2023, Algorithm 2),
// fp32 on CUDA cores.
//
// Over rung 4 (FlashAttention-1's backward, Dao et al. 2022, Alg. 4) this takes FA2's work split:
//   * D_i = rowsum(dO_i * O_i) once per query row, in a preprocessing kernel (Alg. 2 line 4),
//     instead of once per (query block, K/V block) pair;
//   * one thread block per (K/V block, kv head, batch): the grid is parallel over the sequence,
//     not only over batch and heads. The block keeps K_j, V_j and the dK_j, dV_j accumulators on
//     chip and walks the query blocks (lines 5-18) of every query head of its kv group, so dK/dV
//     are written once, without atomics;
//   * dQ_i += dS K_j (line 15) is a whole (kBlockM, D) tile per block pair in registers, added
//     to params.dq with one fp32 atomicAdd (RED.E.ADD.F32) per element; the preprocessing kernel
//     zeroes dq row by row (any strides) before, so no dQ workspace and no copy-out pass.
//   * --deterministic: the main kernel skips line 15 and a second kernel, parallel over query
//     blocks, recomputes S, P, dP and dS for its block and accumulates dQ in registers across the
//     K/V blocks (lines 10-11, 13-15): 7 instead of 5 products per (query, key) pair, about 1.4x
//     the FLOPs, bitwise reproducible.
//
// Each pair of blocks is a chain of five small SGEMMs (S, dP, dV, dK, dQ: 5*D FMAs per (query,
// key) pair), each done like an SGEMM: per-thread register micro-tiles on 4 x 8-thread warps fed
// by 128-bit shared-memory loads that are conflict-free and pair-broadcast (see ThreadTile).
// Operands live in shared memory in the layout their products read: Q, dO as (rows, D); K, V
// transposed to (D, keys); P, then dS in place, as (rows, keys). The scale is folded into log2
// space (P = exp2(S * scale*log2e - lse*log2e)) and into dS (dK, dQ need no final scaling).
// Next-block loads overlap compute: cp.async brings dO_{i+1} once dP is done and Q_{i+1}, lse,
// D once dK is done, so they land during dS / dK / dQ.
//
// Masks: blocks outside the visible range (causal, window, padding) are never visited; the
// per-element predicate (and the additive MaskView bias) run only on pairs that need them. An
// empty row (lse = -inf) and rows past S_q get lse := +inf, hence P = 0, dS = 0: no NaN, no
// contribution, dQ = 0.
//
// Limits: fp32 only; head dims 32, 64, 96, 128, 256 (all fit sm_80's 163 KB of shared memory);
// sm_80+ (cp.async); rows of q, k, v, dout, dk, dv 16-byte aligned. Workspace: D_i, [B, H, S_q]
// fp32. Instantiations: 2 kernels (dK/dV, deterministic dQ) x 5 head dims + 1 preprocessing = 11.
// Measured: see README. Thread tiles, traits and the per-step helpers: common/fa2_bwd_steps.cuh;
// this file holds the three kernels, the launch and the registration.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "common/fa2_bwd_steps.cuh"
#include "common/head_dims.h"
#include "common/host_device.h"
#include "common/mask.cuh"
#include "common/math_constants.h"
#include "flashattn/check.h"
#include "flashattn/error.h"
#include "flashattn/registry.h"

namespace flashattn {
namespace fa2_bwd {

// ---- kernels ------------------------------------------------------------------------------------
// Line 4: D_i = rowsum(dO_i o O_i), one warp per query row. On the atomic path it also zeroes the
// row's dq, which the main kernel then accumulates into.
__global__ void __launch_bounds__(256) dot_do_o_kernel(const Args a) {
  const int lane = threadIdx.x % 32;
  const int64_t rows = static_cast<int64_t>(a.B) * a.H * a.S_q;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (blockDim.x / 32);
  for (int64_t row = blockIdx.x * static_cast<int64_t>(blockDim.x / 32) + threadIdx.x / 32; row < rows;
       row += warps) {
    const int64_t i = row % a.S_q, bh = row / a.S_q;
    const int64_t h = bh % a.H, b = bh / a.H;
    const float* o_row = a.o + b * a.o_st.batch + h * a.o_st.head + i * a.o_st.row;
    const float* do_row = a.dout + b * a.do_st.batch + h * a.do_st.head + i * a.do_st.row;
    float acc = 0.f;
    for (int d = lane; d < a.D; d += 32) acc = fmaf(do_row[d], o_row[d], acc);
    FA2_UNROLL
    for (int off = 16; off > 0; off /= 2) acc += __shfl_xor_sync(0xffffffffu, acc, off);
    if (lane == 0) a.delta[row] = acc;
    if (a.atomic_dq) {
      float* dq_row = a.dq + b * a.dq_st.batch + h * a.dq_st.head + i * a.dq_st.row;
      for (int d = lane; d < a.D; d += 32) dq_row[d] = 0.f;
    }
  }
}

// Lines 5-19: one block per (K/V block, kv head, batch), looping over (query head of the group,
// query block) items. Five barriers per item; the comments at each say what they order.
template <class Tr>
__global__ void __launch_bounds__(kNThreads, 1) dkdv_kernel(const Args a) {
  using TileS = typename Tr::TileS;
  using TileKV = typename Tr::TileKV;
  using TileQ = typename Tr::TileQ;
  constexpr int kBlockM = Tr::kBlockM, kBlockN = Tr::kBlockN, kHeadDim = Tr::kHeadDim;
  extern __shared__ float4 smem_f4[];
  float* const smem = reinterpret_cast<float*>(smem_f4);
  float* const sLse = smem + Tr::kOffLse;    // (kBlockM)
  float* const sDelta = smem + Tr::kOffDelta;  // (kBlockM)
  float* const sQ = smem + Tr::kOffQ;        // (kBlockM, kLdQ)
  float* const sdO = smem + Tr::kOffDo;      // (kBlockM, kLdQ)
  float* const sKt = smem + Tr::kOffKt;      // (kHeadDim, kLdKt)
  float* const sVt = smem + Tr::kOffVt;      // (kHeadDim, kLdKt)
  float* const sP = smem + Tr::kOffP;        // (kBlockM, kLdP): P, then dS

  const int tid = threadIdx.x;
  const int64_t n0 = static_cast<int64_t>(blockIdx.x) * kBlockN;
  const int64_t g = blockIdx.y, b = blockIdx.z;
  const int group = a.H / a.H_kv;
  const int seqlen = a.vis.seqlen_k(b);
  const IndexRange qs = query_span(a.vis, n0, kBlockN, seqlen);
  const int m_blocks = static_cast<int>((qs.size() + kBlockM - 1) / kBlockM);
  const int items = group * m_blocks;  // query heads x query blocks

  const int s_tr = TileS::thread_row(tid), s_tc = TileS::thread_col(tid);
  const int kv_tr = TileKV::thread_row(tid), kv_tc = TileKV::thread_col(tid);
  const int q_tr = TileQ::thread_row(tid), q_tc = TileQ::thread_col(tid);

  auto item_head = [&](int it) { return g * group + it / m_blocks; };
  auto item_m0 = [&](int it) { return qs.begin + static_cast<int64_t>(it % m_blocks) * kBlockM; };
  auto q_slice = [&](int64_t h) { return a.q + b * a.q_st.batch + h * a.q_st.head; };
  auto do_slice = [&](int64_t h) { return a.dout + b * a.do_st.batch + h * a.do_st.head; };

  float acc_dk[TileKV::TR][TileKV::TC], acc_dv[TileKV::TR][TileKV::TC];  // (kBlockN, kHeadDim) each
  zero(acc_dk);
  zero(acc_dv);

  if (items > 0) {
    // Line 9 for the first item, in flight while line 6 brings K_j, V_j in, transposed, once.
    const int64_t h = item_head(0), m0 = item_m0(0);
    load_rows_async<Tr>(sQ, q_slice(h), a.q_st.row, m0, a.S_q, tid);
    load_rows_async<Tr>(sdO, do_slice(h), a.do_st.row, m0, a.S_q, tid);
    load_stats_async<Tr>(sLse, sDelta, a, (b * a.H + h) * a.S_q, m0, tid);
    cp_async_commit();
    float4 r[Tr::kKvChunks];
    load_kv_regs<Tr>(r, a.k + b * a.k_st.batch + g * a.k_st.head, a.k_st.row, n0, a.S_k, tid);
    store_kv_transposed<Tr>(sKt, r, tid);
    load_kv_regs<Tr>(r, a.v + b * a.v_st.batch + g * a.v_st.head, a.v_st.row, n0, a.S_k, tid);
    store_kv_transposed<Tr>(sVt, r, tid);
  }

#pragma unroll 1
  for (int it = 0; it < items; ++it) {
    const int64_t h = item_head(it), m0 = item_m0(it);
    const bool has_next = it + 1 < items;
    const int64_t h_next = has_next ? item_head(it + 1) : h, m0_next = has_next ? item_m0(it + 1) : m0;
    Pair pr;
    pr.m0 = m0, pr.n0 = n0, pr.b = b, pr.h = h, pr.seqlen = seqlen;
    pr.elementwise = a.vis.mask.ptr != nullptr || !pair_fully_visible(a.vis, m0, kBlockM, n0, kBlockN, seqlen);

    cp_async_wait_all();
    __syncthreads();  // Q_i, dO_i, lse, D_i landed; the previous dQ product is done with sP

    float rS[TileS::TR][TileS::TC];  // (kBlockM, kBlockN): S, P, then dP
    zero(rS);
    gemm<TileS, kHeadDim, Tr::kLdQ, Tr::kLdKt>(rS, sQ, sKt, s_tr, s_tc);  // line 10: S = Q_i K_j^T
    scores_to_probs<Tr>(rS, sP, sLse, a, pr, s_tr, s_tc);                // line 11
    __syncthreads();  // P complete

    gemm<TileKV, kBlockM, Tr::kLdP, Tr::kLdQ>(acc_dv, sP, sdO, kv_tr, kv_tc);  // line 12: dV_j += P^T dO_i
    zero(rS);
    gemm<TileS, kHeadDim, Tr::kLdQ, Tr::kLdKt>(rS, sdO, sVt, s_tr, s_tc);    // line 13: dP = dO_i V_j^T
    __syncthreads();  // every read of P (line 12) and of dO_i is done

    if (has_next) {  // dO_{i+1} lands during lines 14-16
      load_rows_async<Tr>(sdO, do_slice(h_next), a.do_st.row, m0_next, a.S_q, tid);
      cp_async_commit();
    }
    probs_to_dscores<Tr>(rS, sP, sDelta, a.scale, s_tr, s_tc);  // line 14 (scaled)
    __syncthreads();  // dS complete

    gemm<TileKV, kBlockM, Tr::kLdP, Tr::kLdQ>(acc_dk, sP, sQ, kv_tr, kv_tc);  // line 16: dK_j += dS^T Q_i
    __syncthreads();  // every read of Q_i, lse and D_i is done

    if (has_next) {  // Q_{i+1}, lse, D land during line 15
      load_rows_async<Tr>(sQ, q_slice(h_next), a.q_st.row, m0_next, a.S_q, tid);
      load_stats_async<Tr>(sLse, sDelta, a, (b * a.H + h_next) * a.S_q, m0_next, tid);
      cp_async_commit();
    }
    if (a.atomic_dq) {  // line 15: dQ_i += dS K_j, one RED per element
      float rdQ[TileQ::TR][TileQ::TC];  // (kBlockM, kHeadDim)
      zero(rdQ);
      gemm<TileQ, kBlockN, Tr::kLdP, Tr::kLdKt>(rdQ, sP, sKt, q_tr, q_tc);
      add_dq_tile<Tr>(rdQ, a.dq + b * a.dq_st.batch + h * a.dq_st.head, a.dq_st.row, m0, a.S_q, q_tr, q_tc);
    }
  }

  // Line 18. Keys nobody sees (padding, outside every window) get zeros.
  store_kv_tile<Tr>(acc_dk, a.dk + b * a.dk_st.batch + g * a.dk_st.head, a.dk_st.row, n0, a.S_k, kv_tr, kv_tc);
  store_kv_tile<Tr>(acc_dv, a.dv + b * a.dv_st.batch + g * a.dv_st.head, a.dv_st.row, n0, a.S_k, kv_tr, kv_tc);
}

// Deterministic dQ: one block per (query block, query head, batch) walks the visible K/V blocks
// in order, recomputing lines 10-11 and 13-14 and accumulating line 15 in registers. The next
// K/V block is fetched into registers during the dQ product of the current one.
template <class Tr>
__global__ void __launch_bounds__(kNThreads, 1) dq_kernel(const Args a) {
  using TileS = typename Tr::TileS;
  using TileQ = typename Tr::TileQ;
  constexpr int kBlockM = Tr::kBlockM, kBlockN = Tr::kBlockN, kHeadDim = Tr::kHeadDim;
  extern __shared__ float4 smem_f4[];
  float* const smem = reinterpret_cast<float*>(smem_f4);
  float* const sLse = smem + Tr::kOffLse;
  float* const sDelta = smem + Tr::kOffDelta;
  float* const sQ = smem + Tr::kOffQ;
  float* const sdO = smem + Tr::kOffDo;
  float* const sKt = smem + Tr::kOffKt;
  float* const sVt = smem + Tr::kOffVt;
  float* const sP = smem + Tr::kOffP;  // dS only

  const int tid = threadIdx.x;
  // Reversed: with a causal mask the last query blocks see the most keys; they start first.
  const int64_t m0 = static_cast<int64_t>(gridDim.x - 1 - blockIdx.x) * kBlockM;
  const int64_t h = blockIdx.y, b = blockIdx.z;
  const int64_t g = h / (a.H / a.H_kv);
  const int seqlen = a.vis.seqlen_k(b);
  const IndexRange ks = key_span(a.vis, m0, kBlockM, seqlen);
  const int n_blocks = static_cast<int>((ks.size() + kBlockN - 1) / kBlockN);
  const float* k_slice = a.k + b * a.k_st.batch + g * a.k_st.head;
  const float* v_slice = a.v + b * a.v_st.batch + g * a.v_st.head;

  const int s_tr = TileS::thread_row(tid), s_tc = TileS::thread_col(tid);
  const int q_tr = TileQ::thread_row(tid), q_tc = TileQ::thread_col(tid);

  float rdQ[TileQ::TR][TileQ::TC];  // (kBlockM, kHeadDim)
  zero(rdQ);
  float4 rk[Tr::kKvChunks], rv[Tr::kKvChunks];
  if (n_blocks > 0) {
    load_rows_async<Tr>(sQ, a.q + b * a.q_st.batch + h * a.q_st.head, a.q_st.row, m0, a.S_q, tid);
    load_rows_async<Tr>(sdO, a.dout + b * a.do_st.batch + h * a.do_st.head, a.do_st.row, m0, a.S_q, tid);
    load_stats_async<Tr>(sLse, sDelta, a, (b * a.H + h) * a.S_q, m0, tid);
    cp_async_commit();
    load_kv_regs<Tr>(rk, k_slice, a.k_st.row, ks.begin, a.S_k, tid);
    load_kv_regs<Tr>(rv, v_slice, a.v_st.row, ks.begin, a.S_k, tid);
  }

#pragma unroll 1
  for (int t = 0; t < n_blocks; ++t) {
    const int64_t n0 = ks.begin + static_cast<int64_t>(t) * kBlockN;
    Pair pr;
    pr.m0 = m0, pr.n0 = n0, pr.b = b, pr.h = h, pr.seqlen = seqlen;
    pr.elementwise = a.vis.mask.ptr != nullptr || !pair_fully_visible(a.vis, m0, kBlockM, n0, kBlockN, seqlen);

    cp_async_wait_all();
    __syncthreads();  // the previous dQ product is done with sKt and sP
    store_kv_transposed<Tr>(sKt, rk, tid);
    store_kv_transposed<Tr>(sVt, rv, tid);
    __syncthreads();  // K_j, V_j (and on the first trip Q_i, dO_i, lse, D_i) in place

    float rS[TileS::TR][TileS::TC];  // (kBlockM, kBlockN)
    zero(rS);
    gemm<TileS, kHeadDim, Tr::kLdQ, Tr::kLdKt>(rS, sQ, sKt, s_tr, s_tc);  // line 10
    scores_to_probs<Tr>(rS, sP, sLse, a, pr, s_tr, s_tc);                // line 11 (own entries)
    zero(rS);
    gemm<TileS, kHeadDim, Tr::kLdQ, Tr::kLdKt>(rS, sdO, sVt, s_tr, s_tc);  // line 13
    probs_to_dscores<Tr>(rS, sP, sDelta, a.scale, s_tr, s_tc);             // line 14
    __syncthreads();  // dS complete

    if (t + 1 < n_blocks) {
      load_kv_regs<Tr>(rk, k_slice, a.k_st.row, n0 + kBlockN, a.S_k, tid);
      load_kv_regs<Tr>(rv, v_slice, a.v_st.row, n0 + kBlockN, a.S_k, tid);
    }
    gemm<TileQ, kBlockN, Tr::kLdP, Tr::kLdKt>(rdQ, sP, sKt, q_tr, q_tc);  // line 15
  }

  float* dq_slice = a.dq + b * a.dq_st.batch + h * a.dq_st.head;
  FA2_UNROLL
  for (int i = 0; i < TileQ::TR; ++i) {
    const int64_t row = m0 + TileQ::row(q_tr, i);
    if (row >= a.S_q) continue;
    FA2_UNROLL
    for (int j = 0; j < TileQ::TC; ++j) dq_slice[row * a.dq_st.row + TileQ::col(q_tc, j)] = rdQ[i][j];
  }
}

// ---- host ---------------------------------------------------------------------------------------
size_t workspace_bytes(const BwdParams& p) { return static_cast<size_t>(p.B) * p.H * p.S_q * sizeof(float); }

inline unsigned ceil_div(int64_t n, int64_t d) { return static_cast<unsigned>((n + d - 1) / d); }

// float4 and cp.async move whole rows in 16-byte pieces.
void check_alignment(const BwdParams& p) {
  auto ok = [](const void* ptr, const Strides& s) {
    return reinterpret_cast<uintptr_t>(ptr) % 16 == 0 && s.batch % 4 == 0 && s.head % 4 == 0 && s.row % 4 == 0;
  };
  if (!ok(p.q, p.q_st) || !ok(p.k, p.k_st) || !ok(p.v, p.v_st) || !ok(p.dout, p.do_st) || !ok(p.dk, p.dk_st) ||
      !ok(p.dv, p.dv_st))
    throw RuntimeError("fa2 backward: q, k, v, dout, dk and dv need 16-byte aligned rows (strides a multiple of 4)");
}

Args make_args(const BwdParams& p) {
  Args a;
  a.q = static_cast<const float*>(p.q);
  a.k = static_cast<const float*>(p.k);
  a.v = static_cast<const float*>(p.v);
  a.o = static_cast<const float*>(p.o);
  a.dout = static_cast<const float*>(p.dout);
  a.lse = static_cast<const float*>(p.lse);
  a.delta = static_cast<float*>(p.workspace);
  a.dq = static_cast<float*>(p.dq);
  a.dk = static_cast<float*>(p.dk);
  a.dv = static_cast<float*>(p.dv);
  a.q_st = p.q_st, a.k_st = p.k_st, a.v_st = p.v_st, a.o_st = p.o_st, a.do_st = p.do_st;
  a.dq_st = p.dq_st, a.dk_st = p.dk_st, a.dv_st = p.dv_st;
  a.B = p.B, a.H = p.H, a.H_kv = p.H_kv, a.S_q = p.S_q, a.S_k = p.S_k, a.D = p.D;
  a.scale = p.scale;
  a.scale_log2 = p.scale_log2;
  a.vis = make_visibility(p);
  a.atomic_dq = !p.deterministic;
  return a;
}

template <int kHeadDim>
void launch(const Args& a, cudaStream_t stream) {
  using Tr = Traits<kHeadDim>;
  CUDA_CHECK(cudaFuncSetAttribute(dkdv_kernel<Tr>, cudaFuncAttributeMaxDynamicSharedMemorySize, Tr::kSmemBytes));
  const dim3 grid_kv(ceil_div(a.S_k, Tr::kBlockN), a.H_kv, a.B);
  dkdv_kernel<Tr><<<grid_kv, kNThreads, Tr::kSmemBytes, stream>>>(a);
  CHECK_LAUNCH("fa2 backward dK/dV");
  if (!a.atomic_dq) {
    CUDA_CHECK(cudaFuncSetAttribute(dq_kernel<Tr>, cudaFuncAttributeMaxDynamicSharedMemorySize, Tr::kSmemBytes));
    const dim3 grid_q(ceil_div(a.S_q, Tr::kBlockM), a.H, a.B);
    dq_kernel<Tr><<<grid_q, kNThreads, Tr::kSmemBytes, stream>>>(a);
    CHECK_LAUNCH("fa2 backward dQ");
  }
}

// Head dims with a variant; the build compiles those FLASHATTN_HDIMS enables (common/head_dims.h).
using KernelHeadDims = HeadDims<32, 64, 96, 128, 256>;

void run(const BwdParams& p, const LaunchContext& ctx) {
  if (static_cast<int64_t>(p.B) * p.H * p.S_q * p.S_k == 0) return;
  if (p.dtype != DType::F32) throw RuntimeError("fa2 backward: fp32 only");
  if (p.H_kv <= 0 || p.H % p.H_kv != 0) throw RuntimeError("fa2 backward: H must be a multiple of H_kv");
  if (p.workspace == nullptr || p.workspace_bytes < workspace_bytes(p))
    throw RuntimeError("fa2 backward: workspace smaller than its workspace function asked for");
  check_alignment(p);
  const Args a = make_args(p);
  const int64_t rows = static_cast<int64_t>(p.B) * p.H * p.S_q;
  const int64_t blocks = (rows + kNWarps - 1) / kNWarps;
  dot_do_o_kernel<<<static_cast<unsigned>(blocks < (1 << 20) ? blocks : (1 << 20)), kNThreads, 0, ctx.stream>>>(a);
  CHECK_LAUNCH("fa2 backward D = rowsum(dO * O)");
  KernelHeadDims::dispatch(p.D, "fa2 backward", [&](auto kD) { launch<decltype(kD)::value>(a, ctx.stream); });
}

KernelMode make_entry() {
  KernelMode m;
  m.kernel = "fa2";
  m.mode = Mode::Backward;
  m.summary = "FlashAttention-2 backward (Dao 2023, Alg. 2): K/V-block parallel, dQ by fp32 atomics "
              "(--deterministic: separate dQ pass)";
  m.rung = 5;
  m.gpu = true;
  m.min_sm = 80;  // cp.async
  m.dtypes = dtype_bit(DType::F32);
  m.head_dims = KernelHeadDims::list();
  m.features = kAllFeatures;
  m.uses_atomics = true;            // dQ: fp32 atomicAdd, order varies run to run
  m.partial_outputs = true;  // a ring over several GPUs may merge its blocks (registry.h)
  m.bitwise_reproducible = false;  // the order of the dQ atomics varies run to run
  m.has_deterministic_path = true;  // params.deterministic: the dQ kernel, no atomics
  m.bwd = &run;
  m.bwd_workspace = &workspace_bytes;
  return m;
}

}  // namespace fa2_bwd
}  // namespace flashattn

FLASHATTN_REGISTER_KERNEL_MODE(fa2_backward, flashattn::fa2_bwd::make_entry)
