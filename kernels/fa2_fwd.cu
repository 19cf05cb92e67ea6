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
  constexpr int kBlockN = Kt::kBlockN;
  extern __shared__ float4 smem_f4[];
  float* sQt = reinterpret_cast<float*>(smem_f4);  // (kHeadDim, kBlockM)  Qᵀ · scale·log2 e
  float* sK = sQt + Kt::kSizeQ;                    // (kBlockN, kLdK)
  float* sV = sK + Kt::kSizeK;                     // (kBlockN, kHeadDim)
  float* sPt = sV + Kt::kSizeV;                    // (kBlockN, kLdP)      P_ijᵀ
  __shared__ BlockInfo s_info;
  const volatile BlockInfo& info = s_info;

  int n_begin, n_end;  // K/V blocks holding any key visible to a row of this Q block
  block_setup<Kt>(a, s_info, sQt, sK, n_begin, n_end);  // block's key range, s_info; load K_1, Q_i
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

    if (has_bias) add_bias<Kt>(rS, sP_thr, tc);  // S' += mask log2 e
    if (n_block < info.n_full_begin || n_block >= info.n_full_end)  // straddles a row's boundary
      mask_scores<Kt>(rS, a, info, n0);

    // m_new = max(m_i, rowmax(S)); P = exp(S - m_new); l_i = e^(m_i - m_new) l_i + rowsum(P);
    // O_i = diag(e^(m_i - m_new)) O_i
    online_softmax<Kt>(rS, rO, m_i, l_i);
    store_pt<Kt>(sP_thr, rS, tc);  // P_ijᵀ -> shared memory

    // P and V_j visible; every thread is done with K_j, so the next K tile may land in sK while
    // P V runs.
    cp_async_wait_all();
    __syncthreads();
    if (n_block + 1 < n_end)
      load_kv_tile<Kt>(sK, Kt::kLdK, k_head(a, info.b, info.h), a.k_st.row, n0 + kBlockN, info.kv_hi);
    cp_async_commit();

    gemm_pv<Kt>(rO, sP_thr, sV_thr);  // O_i += P_ij V_j
  }

  epilogue<Kt>(a, info, rO, m_i, l_i, tr, tc);  // O_i = diag(l_i)^-1 O_i; L_i = m_i + log(l_i)
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
  m.partial_outputs = true;  // a ring over several GPUs may merge its blocks (registry.h)
  m.fwd = &run;
  m.fwd_workspace = nullptr;
  return m;
}

}  // namespace fa2_fwd
}  // namespace flashattn

FLASHATTN_REGISTER_KERNEL_MODE(fa2_forward, flashattn::fa2_fwd::make_entry)
