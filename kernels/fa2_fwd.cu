// fa2, forward — rung 5 of the ladder: FlashAttention-2 (Dao 2023, Algorithm 1) in fp32 on CUDA
// cores. Over fa1 it swaps the loop nest (the Q block is the outer, block-level loop, so the
// running statistics and O never leave registers), keeps O unnormalised and divides by l once at
// the end, writes lse = m + log(l) for the backward pass, and treats both products as register-
// blocked SGEMMs:
//   S = Q Kᵀ   each thread owns a kTM x kSN tile of S (rows × strided columns); operands come from
//              shared memory with 128-bit loads: Qᵀ (d-major, pre-scaled by scale·log2 e) and K
//              row-major (4 consecutive d of one key per load), both conflict-free
//   O += P V   the same thread owns the same kTM rows of O (kON columns): P goes through shared
//              memory transposed (Pᵀ, so 4 rows of one key are one 128-bit load), V row-major
// The rows a thread owns are the same in both products, so the rescale of O by exp(m_old - m_new)
// and the statistics m_i, l_i stay in the thread's registers; a row's kTN threads are adjacent
// lanes and reduce the row max with __shfl_xor_sync (l_i is reduced only once, at the end).
// K and V arrive by cp.async one phase ahead of their use (V during QKᵀ, the next K during PV).
//
// Algorithm 1 lines (per block of Q rows, loop over K/V blocks j):
//   S_ij = Q_i K_jᵀ                                  gemm_qk
//   m_new = max(m_i, rowmax(S_ij))                   online_softmax
//   P_ij = exp(S_ij - m_new); l_i = e^(m_i - m_new) l_i + rowsum(P_ij)
//   O_i = diag(e^(m_i - m_new)) O_i + P_ij V_j       online_softmax (rescale), gemm_pv
//   O_i = diag(l_i)^-1 O_i;  L_i = m_i + log(l_i)    epilogue
// Softmax runs in log2 units: S' = S·log2 e (scale folded into Qᵀ), one FADD + one MUFU.EX2 per
// score (ex2.approx.ftz: 2 ulp).
//
// Masking: whole K/V blocks outside the Q block's visible key range (causal, window, key padding,
// S_k tail) are never visited; element masks (mask.cuh's visible_keys per row) are applied only
// on blocks that straddle a boundary. The additive mask, when given, is added on every block.
// Rows without a visible finite score get O = 0 and lse = -inf. Grid order: heaviest Q blocks
// first when the key ranges are unbalanced (causal), otherwise Q blocks of one head adjacent (L2).
//
// Limits: fp32 only; head dims 32, 64, 96, 128, 256 (one tile shape each); sm_80+ (cp.async);
// q/k/v/o 16-byte aligned with strides a multiple of 4 elements. 5 instantiations (one per head
// dim; masking and the additive mask are uniform run-time branches, not template parameters).
// Measured: see README. Traits and the device steps: common/fa2_fwd_steps.cuh; this file holds
// the kernel, the launch and the registration.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <string>

#include "common/fa2_fwd_steps.cuh"
#include "common/head_dims.h"
#include "common/layout_checks.h"
#include "common/mask.cuh"
#include "common/math_constants.h"
#include "flashattn/check.h"
#include "flashattn/error.h"
#include "flashattn/registry.h"

namespace flashattn {
namespace fa2_fwd {

template <class Kt>
__global__ void __launch_bounds__(Kt::kThreads, Kt::kMinBlocksPerSm) fa2_fwd_kernel(const Args a) {
  constexpr int kTM = Kt::kTM, kSN = Kt::kSN, kON = Kt::kON, kTN = Kt::kTN;
  constexpr int kBlockM = Kt::kBlockM, kBlockN = Kt::kBlockN;
  extern __shared__ float4 smem_f4[];
  float* sQt = reinterpret_cast<float*>(smem_f4);  // (kHeadDim, kBlockM)  Qᵀ · scale·log2 e
  float* sK = sQt + Kt::kSizeQ;                    // (kBlockN, kLdK)
  float* sV = sK + Kt::kSizeK;                     // (kBlockN, kHeadDim)
  float* sPt = sV + Kt::kSizeV;                    // (kBlockN, kLdP)      P_ijᵀ
  __shared__ BlockInfo s_info;
  const volatile BlockInfo& info = s_info;

  int n_begin, n_end;  // K/V blocks holding any key visible to a row of this Q block
  {
    const TileCoords tile = tile_coords(a);
    const int m0 = tile.m_block * kBlockM;
    const int rows = min(kBlockM, a.S_q - m0);
    // begin and end of visible_keys(i) never decrease with i, so the block's rows see at most
    // [first.begin, last.end) and all of them see [last.begin, first.end).
    const int seqlen = a.vis.seqlen_k(tile.b);
    const IndexRange first = a.vis.keys(m0, seqlen), last = a.vis.keys(m0 + rows - 1, seqlen);
    // Clamped to [0, seqlen]: a range that starts past seqlen (a window far right of the keys)
    // is empty but has begin = end > seqlen.
    const int kv_lo = clamp_to(first.begin, seqlen), kv_hi = clamp_to(last.end, seqlen);
    const int full_lo = clamp_to(last.begin, seqlen), full_hi = clamp_to(first.end, seqlen);
    n_begin = kv_lo / kBlockN;
    n_end = kv_hi > kv_lo ? (kv_hi + kBlockN - 1) / kBlockN : n_begin;
    if (threadIdx.x == 0) {
      s_info.b = tile.b;
      s_info.h = tile.h;
      s_info.m0 = m0;
      s_info.seqlen = seqlen;
      s_info.kv_hi = kv_hi;
      const bool any_full = full_hi > full_lo;
      s_info.n_full_begin = any_full ? (full_lo + kBlockN - 1) / kBlockN : 0;
      s_info.n_full_end = any_full ? full_hi / kBlockN : 0;
    }
    if (n_end > n_begin) {  // block-uniform
      load_kv_tile<Kt>(sK, Kt::kLdK, k_head(a, tile.b, tile.h), a.k_st.row, n_begin * kBlockN, kv_hi);
      cp_async_commit();
      load_q_transposed<Kt>(sQt, a.q + tile.b * a.q_st.batch + tile.h * a.q_st.head + m0 * a.q_st.row,
                            a.q_st.row, rows, a.scale_log2);
    }
  }
  __syncthreads();  // s_info visible (the loop's first barrier would do, but not an empty loop)

  const int tc = threadIdx.x % kTN;  // column group: keys tc + kTN t, O columns 4(tc + kTN k) + e
  const int tr = threadIdx.x / kTN;  // row group: rows tr kTM .. tr kTM + kTM - 1
  const float* sQ_thr = sQt + tr * kTM;
  const float* sK_thr = sK + tc * Kt::kLdK;
  const float* sV_thr = sV + 4 * tc;
  float* sP_thr = sPt + tr * kTM;

  float rO[kTM][kON];  // (kTM, kON) unnormalised O rows
  float m_i[kTM], l_i[kTM];  // row max (log2 units) and this thread's part of the row sum
#pragma unroll
  for (int r = 0; r < kTM; ++r) {
    m_i[r] = -INFINITY;
    l_i[r] = 0.f;
#pragma unroll
    for (int c = 0; c < kON; ++c) rO[r][c] = 0.f;
  }

#pragma unroll 1
  for (int n_block = n_begin; n_block < n_end; ++n_block) {
    const int n0 = n_block * kBlockN;
    // K_j (and, the first time, Qᵀ) visible; every thread is done with the last P V, so sV and
    // sPt may be refilled.
    cp_async_wait_all();
    __syncthreads();
    load_kv_tile<Kt>(sV, Kt::kLdV, v_head(a, info.b, info.h), a.v_st.row, n0, info.kv_hi);
    const bool has_bias = a.vis.mask.ptr != nullptr;
    if (has_bias) load_bias_tile<Kt>(sPt, a, info.b, info.h, info.m0, n0);
    cp_async_commit();

    float rS[kTM][kSN];  // (kTM, kSN) S'_ij = S_ij log2 e
    gemm_qk<Kt>(rS, sQ_thr, sK_thr);

    if (has_bias) {  // S' += mask log2 e, from the tile staged in the Pᵀ buffer
      cp_async_wait_all();
      __syncthreads();
#pragma unroll
      for (int t = 0; t < kSN; ++t) {
        const float* src = sP_thr + (tc + kTN * t) * Kt::kLdP;
        const float4 ba = *reinterpret_cast<const float4*>(src);
        const float4 bb = *reinterpret_cast<const float4*>(src + 4);
        const float rB[kTM] = {ba.x, ba.y, ba.z, ba.w, bb.x, bb.y, bb.z, bb.w};
#pragma unroll
        for (int r = 0; r < kTM; ++r) rS[r][t] = fmaf(rB[r], kLog2e, rS[r][t]);
      }
      __syncthreads();  // everyone has its bias before P overwrites the buffer
    }
    if (n_block < info.n_full_begin || n_block >= info.n_full_end) {  // straddles a row's boundary
      const int seqlen = info.seqlen;
      const int row0 = info.m0 + thread_index_here() / kTN * kTM;
      const int col0 = n0 + thread_index_here() % kTN;
#pragma unroll
      for (int r = 0; r < kTM; ++r) {
        const IndexRange keys = a.vis.keys(row0 + r, seqlen);
        const int lo = clamp_to(keys.begin, seqlen), hi = clamp_to(keys.end, seqlen);
#pragma unroll
        for (int t = 0; t < kSN; ++t) {
          const int j = col0 + kTN * t;
          if (j < lo || j >= hi) rS[r][t] = -INFINITY;
        }
      }
    }

    // m_new = max(m_i, rowmax(S)); P = exp(S - m_new); l_i = e^(m_i - m_new) l_i + rowsum(P);
    // O_i = diag(e^(m_i - m_new)) O_i. A row with no finite score yet keeps m = -inf and
    // subtracts 0 instead, so its P is exp(-inf) = 0 rather than NaN.
#pragma unroll
    for (int r = 0; r < kTM; ++r) {
      float mx = rS[r][0];
#pragma unroll
      for (int t = 1; t < kSN; ++t) mx = fmaxf(mx, rS[r][t]);
#pragma unroll
      for (int off = kTN / 2; off > 0; off /= 2) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
      const float m_new = fmaxf(m_i[r], mx);
      const float m_use = m_new == -INFINITY ? 0.f : m_new;
      const float alpha = ex2(m_i[r] - m_use);
      m_i[r] = m_new;
      float rowsum = 0.f;
#pragma unroll
      for (int t = 0; t < kSN; ++t) {
        rS[r][t] = ex2(rS[r][t] - m_use);
        rowsum += rS[r][t];
      }
      l_i[r] = fmaf(l_i[r], alpha, rowsum);
#pragma unroll
      for (int c = 0; c < kON; ++c) rO[r][c] *= alpha;
    }
    // P_ijᵀ to shared memory: for each owned key, its 8 rows as two 128-bit stores.
#pragma unroll
    for (int t = 0; t < kSN; ++t) {
      float* dst = sP_thr + (tc + kTN * t) * Kt::kLdP;
      *reinterpret_cast<float4*>(dst) = make_float4(rS[0][t], rS[1][t], rS[2][t], rS[3][t]);
      *reinterpret_cast<float4*>(dst + 4) = make_float4(rS[4][t], rS[5][t], rS[6][t], rS[7][t]);
    }

    // P and V_j visible; every thread is done with K_j, so the next K tile may land in sK while
    // P V runs.
    cp_async_wait_all();
    __syncthreads();
    if (n_block + 1 < n_end)
      load_kv_tile<Kt>(sK, Kt::kLdK, k_head(a, info.b, info.h), a.k_st.row, n0 + kBlockN, info.kv_hi);
    cp_async_commit();

    gemm_pv<Kt>(rO, sP_thr, sV_thr);  // O_i += P_ij V_j
  }

  // O_i = diag(l_i)^-1 O_i;  L_i = m_i + log(l_i)  (natural log: m_i is in log2 units).
  const int b = info.b, h = info.h;
  float* gO = a.o + b * a.o_st.batch + h * a.o_st.head;
  float* gLse = a.lse + (static_cast<int64_t>(b) * a.H + h) * a.S_q;
#pragma unroll
  for (int r = 0; r < kTM; ++r) {
    float l = l_i[r];
#pragma unroll
    for (int off = kTN / 2; off > 0; off /= 2) l += __shfl_xor_sync(0xffffffffu, l, off);
    const int i = info.m0 + tr * kTM + r;
    if (i >= a.S_q) continue;
    const float inv_l = l > 0.f ? 1.f / l : 0.f;  // l = 0: no visible finite score, O = 0
    float* o_row = gO + i * a.o_st.row;
#pragma unroll
    for (int ch = 0; ch < Kt::kOChunks; ++ch)
      *reinterpret_cast<float4*>(o_row + 4 * (tc + kTN * ch)) =
          make_float4(rO[r][4 * ch] * inv_l, rO[r][4 * ch + 1] * inv_l, rO[r][4 * ch + 2] * inv_l,
                      rO[r][4 * ch + 3] * inv_l);
    if (tc == 0) gLse[i] = l > 0.f ? fmaf(m_i[r], kLn2, logf(l)) : -INFINITY;
  }
}

// Heaviest Q blocks first when key ranges grow (causal: the last rows see the most keys) or
// shrink (left window only) along the rows, so the last wave is short blocks; otherwise the Q
// blocks of one head run side by side and share its K/V in L2.
int grid_order(const Visibility& vis) {
  const bool left = vis.window_left >= 0, right = vis.window_right >= 0;
  if (right && !left) return kHeavyFirstDescending;
  if (left && !right) return kHeavyFirstAscending;
  return kRowBlocksFastest;
}

Args make_args(const FwdParams& p, int block_m) {
  Args a;
  a.q = static_cast<const float*>(p.q);
  a.k = static_cast<const float*>(p.k);
  a.v = static_cast<const float*>(p.v);
  a.o = static_cast<float*>(p.o);
  a.lse = static_cast<float*>(p.lse);
  a.q_st = p.q_st;
  a.k_st = p.k_st;
  a.v_st = p.v_st;
  a.o_st = p.o_st;
  a.B = p.B;
  a.H = p.H;
  a.S_q = p.S_q;
  a.S_k = p.S_k;
  a.kv_group = p.H / p.H_kv;
  a.num_m_blocks = (p.S_q + block_m - 1) / block_m;
  a.scale_log2 = p.scale_log2;
  a.vis = make_visibility(p);
  a.order = grid_order(a.vis);
  return a;
}

template <class Kt>
void launch(const FwdParams& p, const LaunchContext& ctx) {
  const Args a = make_args(p, Kt::kBlockM);
  const int64_t blocks = static_cast<int64_t>(a.num_m_blocks) * p.B * p.H;
  if (blocks > INT32_MAX)
    throw RuntimeError("fa2 forward: grid of " + std::to_string(blocks) + " blocks too large");
  // Set the kernel's attributes once per device (a host round trip per launch would sit in the
  // timed gap between launches for small problems).
  static int configured_device = -1;
  auto kernel = &fa2_fwd_kernel<Kt>;
  if (configured_device != ctx.device) {
    int optin = 0;
    CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, ctx.device));
    if (static_cast<size_t>(optin) < Kt::kSmemBytes + sizeof(BlockInfo))
      throw RuntimeError("fa2 forward: head dim " + std::to_string(Kt::kHeadDim) + " needs " +
                         std::to_string(Kt::kSmemBytes + sizeof(BlockInfo)) +
                         " bytes of shared memory per block, the device allows " + std::to_string(optin));
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    static_cast<int>(Kt::kSmemBytes)));
    // Several blocks per SM only fit with the largest shared-memory carveout.
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                    cudaSharedmemCarveoutMaxShared));
    configured_device = ctx.device;
  }
  kernel<<<static_cast<unsigned>(blocks), Kt::kThreads, Kt::kSmemBytes, ctx.stream>>>(a);
  CHECK_LAUNCH("fa2_fwd_kernel");
}

bool strides4(const Strides& s) { return s.batch % 4 == 0 && s.head % 4 == 0 && s.row % 4 == 0; }

// Head dims with a variant; the build compiles those FLASHATTN_HDIMS enables (common/head_dims.h).
using KernelHeadDims = HeadDims<32, 64, 96, 128, 256>;

void run(const FwdParams& p, const LaunchContext& ctx) {
  if (p.dtype != DType::F32) throw RuntimeError("fa2 forward: only fp32 is compiled");
  if (static_cast<int64_t>(p.B) * p.H * p.S_q == 0) return;
  if (p.H_kv <= 0 || p.H % p.H_kv != 0) throw RuntimeError("fa2 forward: H must be a multiple of H_kv");
  // 128-bit loads and cp.async of 16 bytes.
  if (!aligned16(p.q) || !aligned16(p.k) || !aligned16(p.v) || !aligned16(p.o) || !strides4(p.q_st) ||
      !strides4(p.k_st) || !strides4(p.v_st) || !strides4(p.o_st))
    throw RuntimeError("fa2 forward: q, k, v and o must be 16-byte aligned with strides a multiple of 4");
  KernelHeadDims::dispatch(p.D, "fa2 forward", [&](auto kD) { launch<Traits<decltype(kD)::value>>(p, ctx); });
}

KernelMode make_entry() {
  KernelMode m;
  m.kernel = "fa2";
  m.mode = Mode::Forward;
  m.summary = "FlashAttention-2 forward (Dao 2023, Alg. 1): one block per (Q block, head), online softmax in "
              "registers, fp32 CUDA cores";
  m.rung = 5;
  m.gpu = true;
  m.min_sm = 80;  // cp.async
  m.dtypes = dtype_bit(DType::F32);
  m.head_dims = KernelHeadDims::list();
  m.features = kAllFeatures;
  m.uses_atomics = false;
  m.fwd = &run;
  m.fwd_workspace = nullptr;
  return m;
}

}  // namespace fa2_fwd
}  // namespace flashattn

FLASHATTN_REGISTER_KERNEL_MODE(fa2_forward, flashattn::fa2_fwd::make_entry)
