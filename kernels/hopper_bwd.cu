// hopper, backward — rung 8 of the ladder, the backward pass on Hopper's own instructions (sm_90a).
// Over rung 7's backward (mma, mma.sync fed by ldmatrix/cp.async) it adds what the hopper forward
// adds: Q, dO (and their lse, D_i) through the tensor copy engine into a two-stage ring of
// swizzled tiles counted on mbarriers, K and V once per CTA; the five products as warpgroup
// matrix products (wgmma); a producer warpgroup that gives its registers to two consumer
// warpgroups (setmaxnreg); and dQ added into global memory by the copy engine itself
// (cp.reduce.async.bulk .add.f32) instead of per-thread atomics.
//
//   preprocess  D_i = rowsum(dO_i ∘ O_i) and lse_i·log2 e (+inf for empty rows) into the
//               workspace, padded to whole Q blocks; the dQ accumulator zeroed
//   main        one CTA per (128-key block j, kv head, batch); warpgroup 1 + w owns keys
//               64w .. 64w + 63 of the block, with their dK_j, dV_j in registers. For every
//               query head of the GQA group and every Q block i that sees a key of block j
//               (FlashAttention-2, Algorithm 2, transposed so the keys are wgmma's M):
//                 S^T = K_j Q_i^T;  dP^T = V_j dO_i^T                         (wgmma, smem x smem)
//                 P^T = exp2(S^T·scale·log2 e − lse_i·log2 e)  (masked on boundary blocks)
//                 dV_j += P^T dO_i                                          (P from registers)
//                 dS^T = P^T ∘ (dP^T − D_i);  dK_j += dS^T Q_i              (dS from registers)
//                 dS -> shared memory (stmatrix, transposing);  dQ_i = dS K_j over the block's
//                 128 keys: D128 by warpgroup 2 alone (all 64 queries) while warpgroup 1 goes
//                 on to the next Q block, D64 by both (64 queries each); dQ -> shared memory;
//                 the dQ writer thread adds it into the accumulator. D128: a CTA starts its
//                 steps where the running CTAs of its (batch, kv head) are (each producer
//                 publishes its position every 8 steps; the list wraps around): CTAs launched as
//                 others finish would otherwise spread over the whole Q range, whose Q, dO and
//                 dQ accumulator outgrow L2 at long S (B1 H32 S131072: 4.6 % faster on an
//                 H200, 6.8 % on an H100; level at 65536; on only where they outgrow L2)
//               dK_j·scale, dV_j -> 16-bit -> shared memory -> TMA stores (grads_f32, a ring's
//               blocks: fp32 straight from registers to global memory)
//   convert     dQ = scale · accumulator, un-permuted (16-row groups in the fragments' order,
//               DqLayout) -> dtype (grads_f32: added into fp32 dQ);
//               none where the caller holds the accumulator (BwdParams::dq_accum: a ring's
//               blocks add into one, and the entry's dq_finish converts it once at the end)
// --deterministic: the same kernels; the CTAs adding into one Q block take turns in key-block
// order (a counter per Q block in the workspace), so dQ is bit-identical run to run. dK and dV
// never need it: each CTA owns its keys and sums the query heads of its group itself.
//
// Features: causal (bottom-right), window, key padding (the padded K/V rows must hold finite
// values, as for the forward: they meet P = 0 and dS = 0), GQA/MQA, S_q != S_k, any length >= 1,
// empty rows (lse = -inf: P = 0), bhsd and bshd. Not the additive mask (declared unsupported).
// Limits: fp16/bf16, head dims 64 and 128; head dims 32, 96 and 256 (and a scale <= 0) run the
// mma kernel's backward, as --list says (D = 256 would need dK + dV alone at 256 registers per
// consumer thread). sm_90 only; tensors 16-byte aligned, strides multiples of 8 elements.
// Instantiations: 2 head dims x (2 dtypes x (main, convert) + the fp32 adding convert) + 2
// preprocess = 12 kernels.
// Order inside a step (Consumer::step): S^T and dP^T issued together; P while dP^T runs; dV
// issued before dS is formed. D128: dK issued from dS's registers while dS is stored, then the
// two warpgroups meet; warpgroup 2 issues dQ (one 64 x 128 product, its accumulator in the
// registers of S^T and dP^T), meets warpgroup 1 again so that warpgroup 1's next products queue
// behind it, and stores it; warpgroup 1 runs ahead into the next step meanwhile, so the two
// warpgroups' exponentials and dS work no longer coincide (cuDNN's backward has this shape:
// docs/PERF.md, step 5). D64: after the barrier (dV landed) each warpgroup issues its dQ half
// before dK, so dQ's store to shared memory overlaps dK's product. Two dQ buffers at D128 (one at
// D64, where shared memory is full).
// Measured 2026-11-26, H100 SXM (1980 MHz), bf16, every row --check'ed, PyTorch's cuDNN and flash
// backends in the same run: B4 H16 S4096 D128 515 TFLOP/s, 0.91x cuDNN and 1.80x flash;
// B4 H32 S4096 D64 398 TFLOP/s, 0.87x cuDNN and 1.50x flash (docs/PERF.md has the grid). Since
// step 4 (dS by stmatrix, dQ^T), on an H200 beside cuDNN: B4 H16 S4096 D128 0.93x, causal 0.93x,
// B4 H32 S4096 D64 0.91x; at S = 16384, under the power cap, 0.92-0.93x. Step 5 (dQ by one
// warpgroup, the warpgroup index made warp-uniform for the compiler): D128 5-6 % faster.
// What limits it: docs/PERF.md (step 5 sets our kernel's profile beside cuDNN's backward).
#include <cuda.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "common/bwd_row_stats.cuh"
#include "common/head_dims.h"
#include "common/hopper_entry.h"
#include "common/hopper_bwd_consumer.cuh"
#include "common/hopper_bwd_tile.cuh"
#include "common/layout_checks.h"
#include "common/sm90.cuh"
#include "common/sm90_tma_host.h"
#include "flashattn/check.h"
#include "flashattn/error.h"
#include "flashattn/registry.h"

namespace flashattn {
namespace hopper_bwd {

constexpr int kPreRows = 64;  // rows per preprocess CTA, 4 threads each

struct PreArgs {
  const void* o = nullptr;
  const void* dout = nullptr;
  Strides o_st, do_st;
  const float* lse = nullptr;  // [B, H, S_q], natural log
  float* lse2 = nullptr;       // [B, H, S_pad]
  float* dsum = nullptr;       // [B, H, S_pad]
  int H = 0, S_q = 0, S_pad = 0, D = 0;
};

// D_i = rowsum(dO_i ∘ O_i) in fp32 and lse_i·log2 e, four threads per row (16-byte loads).
template <class T>
__global__ void __launch_bounds__(4 * kPreRows) preprocess_kernel(const PreArgs a) {
  const int i = blockIdx.x * kPreRows + threadIdx.x / 4, part = threadIdx.x % 4;
  const int h = blockIdx.y, b = blockIdx.z;
  float acc = 0.f;
  if (i < a.S_q) {
    const T* o_row = static_cast<const T*>(a.o) + b * a.o_st.batch + h * a.o_st.head + i * a.o_st.row;
    const T* do_row = static_cast<const T*>(a.dout) + b * a.do_st.batch + h * a.do_st.head + i * a.do_st.row;
    add_row_dot_part</*kLanes=*/4>(acc, o_row, do_row, a.D, part);
  }
  acc += __shfl_xor_sync(0xffffffffu, acc, 1);
  acc += __shfl_xor_sync(0xffffffffu, acc, 2);
  if (part == 0 && i < a.S_pad) {
    const int64_t r = (static_cast<int64_t>(b) * a.H + h) * a.S_pad + i;
    // Rows past S_q get +inf too: P = exp2(s - inf) = 0.
    a.lse2[r] = i < a.S_q ? lse_log2_units(a.lse[(static_cast<int64_t>(b) * a.H + h) * a.S_q + i]) : INFINITY;
    a.dsum[r] = i < a.S_q ? acc : 0.f;
  }
}

template <class Tr, bool kBf16>
__global__ void __launch_bounds__(Tr::kThreads, 1) backward_kernel(const __grid_constant__ Args a) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ == 900 && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ __align__(1024) unsigned char smem[];
  const Smem<Tr> sm(sm90::smem_u32(smem));
  // The warpgroup index broadcast from lane 0, so the compiler knows it is the same across a warp
  // (branches on it stay uniform).
  const int tid = threadIdx.x, wg = __shfl_sync(0xffffffffu, tid / 128, 0);
  int n_block = blockIdx.x, kv_head = blockIdx.y, b = blockIdx.z;
  if (a.n_kb > 0) {  // part of the work: tiles in (batch, kv head, key block) order
    const int t = a.tile0 + static_cast<int>(blockIdx.x), bh = t / a.n_kb, h_kv = a.H / a.group;
    n_block = t % a.n_kb, kv_head = bh % h_kv, b = bh / h_kv;
  }
  Steps<Tr> st(a, n_block, kv_head, b);

  if (tid == 0) {
    sm90::mbar_init(sm.full_kv(), 1);
    for (int s = 0; s < Tr::kStages; ++s) {
      sm90::mbar_init(sm.full_q(s), 1);
      sm90::mbar_init(sm.full_do(s), 1);
      sm90::mbar_init(sm.empty_qdo(s), Tr::kConsumerWGs * 4);  // one arrival per consumer warp
    }
    for (int b = 0; b < Tr::kDqBuffers; ++b) {
      sm90::mbar_init(sm.dq_full(b), Tr::kDqWarps);  // one arrival per warp that stores dQ
      sm90::mbar_init(sm.dq_empty(b), 1);
    }
    sm90::fence_barrier_init();
    // Steps::t0, read once from Args::phase: the same for every role.
    const int* pos = a.phase != nullptr ? a.phase + st.b * (a.H / a.group) + st.kv_head : nullptr;
    const int t0 = pos != nullptr ? st.step_at(sm90::ld_relaxed_gpu(pos)) : 0;
    sm90::st_shared_32(sm.first_step(), static_cast<uint32_t>(t0));
  }
  __syncthreads();
  st.t0 = static_cast<int>(sm90::ld_shared_32(sm.first_step()));

  if (wg == 0) {
    sm90::setmaxnreg_dec<Tr::kProducerRegs>();
    if (tid == 0) {
      sm90::prefetch_tensor_map(&a.tm_k);
      sm90::prefetch_tensor_map(&a.tm_v);
      produce<Tr>(a, sm, st);
    } else if (tid == 32) {
      write_dq<Tr>(a, sm, st);
    }
  } else {
    sm90::setmaxnreg_inc<Tr::kConsumerRegs>();
    Consumer<Tr, kBf16> c(a, sm, st, wg - 1, tid - 128 * wg);
    sm90::mbar_wait(sm.full_kv(), 0);
    for (int t = 0; t < st.total; ++t) c.step(t);
    // Both warpgroups are done with the Q/dO ring, which stages dK and dV now.
    sm90::named_sync(/*id=*/1, /*threads=*/256);
    c.epilogue();
  }
#endif
}

// One CTA per 64 rows of the accumulator (four DqLayout groups) of one (batch, head), `rows` rows
// apart, of which the groups holding rows below S_q are read: whole (16-byte loads), un-permuted
// through shared memory, then written row by row: dQ = scale · accumulator rounded to the dtype
// (16-byte stores of 8 columns), or (kAdd, grads_f32) added into fp32 dQ (16-byte
// read-modify-writes).
constexpr int kConvertRows = 64;
template <int kHeadDim, class T, bool kAdd>
__global__ void __launch_bounds__(256) convert_dq_kernel(const float* accum, int rows, int S_q, float scale, T* dq,
                                                         Strides dq_st) {
  using Layout = DqLayout<kHeadDim>;
  constexpr int kStride = kHeadDim + 4;  // floats per row in shared memory (4: fewer bank conflicts)
  __shared__ __align__(16) float tile[kConvertRows * kStride];
  const int r0 = blockIdx.x * kConvertRows, h = blockIdx.y, b = blockIdx.z;
  const int used = (S_q + kDqAccumRows - 1) / kDqAccumRows * kDqAccumRows;
  const int n_rows = min(kConvertRows, used - r0);
  const float4* src = reinterpret_cast<const float4*>(accum + ((static_cast<int64_t>(b) * gridDim.y + h) * rows + r0) * kHeadDim);
  for (int q = threadIdx.x; q < n_rows * kHeadDim / 4; q += blockDim.x) {
    const float4 x = src[q];
    const int group = q / Layout::kGroupFloat4s;
    const Layout l(q % Layout::kGroupFloat4s);
    float* at = tile + (group * kDqAccumRows + l.row) * kStride + l.col;
    const int s1 = l.step1_row * kStride + l.step1_col, s2 = l.step2_row * kStride + l.step2_col;
    at[0] = x.x, at[s1] = x.y, at[s2] = x.z, at[s1 + s2] = x.w;
  }
  __syncthreads();
  T* out = dq + b * dq_st.batch + h * dq_st.head;
  constexpr int kChunks = kHeadDim / 8;  // 8 columns per thread and pass
  for (int q = threadIdx.x; q < n_rows * kChunks; q += blockDim.x) {
    const int r = q / kChunks, c = (q % kChunks) * 8, i = r0 + r;
    if (i >= S_q) continue;
    const float* v = tile + r * kStride + c;
    T* o = out + i * dq_st.row + c;
    if constexpr (kAdd) {
      for (int k = 0; k < 8; k += 4) {
        float4 y = *reinterpret_cast<const float4*>(o + k);
        y.x += v[k] * scale, y.y += v[k + 1] * scale, y.z += v[k + 2] * scale, y.w += v[k + 3] * scale;
        *reinterpret_cast<float4*>(o + k) = y;
      }
    } else {
      uint4 y;
      y.x = mma::pack2<T>(v[0] * scale, v[1] * scale), y.y = mma::pack2<T>(v[2] * scale, v[3] * scale);
      y.z = mma::pack2<T>(v[4] * scale, v[5] * scale), y.w = mma::pack2<T>(v[6] * scale, v[7] * scale);
      *reinterpret_cast<uint4*>(o) = y;
    }
  }
}

template <int kHeadDim, class T, bool kAdd>
void convert_dq(const float* accum, int rows, const BwdParams& p, T* dq, cudaStream_t stream) {
  const dim3 grid((p.S_q + kConvertRows - 1) / kConvertRows, p.H, p.B);
  convert_dq_kernel<kHeadDim, T, kAdd><<<grid, 256, 0, stream>>>(accum, rows, p.S_q, p.scale, dq, p.dq_st);
  CHECK_LAUNCH("hopper_bwd convert_dq_kernel");
}

// ---- host side ------------------------------------------------------------------------------------

namespace {

// Rows of the workspace per (batch, head): S_q rounded up to whole steps.
int padded_rows(int S_q, int step) { return (S_q + step - 1) / step * step; }

// Workspace: the dQ accumulator [B, H, S_pad, D] fp32, then lse·log2 e and D_i [B, H, S_pad],
// then the deterministic path's counters [B, H, S_pad / kBlockM] (zeroed when used), then the
// CTAs' published positions [B, H_kv] (Args::phase; zeroed when used).
struct Workspace {
  size_t accum = 0, stats = 0, sems = 0, phase = 0;
  explicit Workspace(const BwdParams& p) {
    const int step = p.D == 64 ? TraitsFor<64>::type::kBlockM : TraitsFor<128>::type::kBlockM;
    const size_t rows = static_cast<size_t>(p.B) * p.H * padded_rows(p.S_q, step);
    accum = rows * p.D * sizeof(float);
    stats = rows * sizeof(float);
    sems = rows / step * sizeof(int);
    phase = static_cast<size_t>(p.B) * p.H_kv * sizeof(int);
  }
  size_t total() const { return accum + 2 * stats + sems + phase; }
};

// Whether the CTAs start in phase (Args::phase): where the Q, dO and dQ accumulator of one (batch,
// kv head) outgrow L2 (S_q > 25600 at D128 on a 50 MB L2); below that, CTAs anywhere in the Q
// range hit L2 anyway, and the start's extra load and the zeroing would be pure cost.
// FLASHATTN_HOPPER_BWD_PHASE = 0 or 1 overrides.
bool phased(const BwdParams& p, const LaunchContext& ctx) {
  const char* env = std::getenv("FLASHATTN_HOPPER_BWD_PHASE");
  if (env != nullptr && *env != '\0') return std::string(env) != "0";
  const double head_bytes = static_cast<double>(p.H / p.H_kv) * p.S_q * p.D * (2 + 2 + 4);
  return ctx.l2_bytes > 0 && head_bytes > static_cast<double>(ctx.l2_bytes);
}

template <bool kBf16, class Tr>
void launch(const BwdParams& p, const LaunchContext& ctx) {
  using T = std::conditional_t<kBf16, __nv_bfloat16, __half>;
  const Workspace ws(p);
  char* base = static_cast<char*>(p.workspace);
  Args a;
  a.tm_q = sm90::make_tensor_map(p.q, p.dtype, p.q_st, p.B, p.H, p.S_q, p.D, Tr::kBlockM);
  a.tm_do = sm90::make_tensor_map(p.dout, p.dtype, p.do_st, p.B, p.H, p.S_q, p.D, Tr::kBlockM);
  a.tm_k = sm90::make_tensor_map(p.k, p.dtype, p.k_st, p.B, p.H_kv, p.S_k, p.D, Tr::kBlockN);
  a.tm_v = sm90::make_tensor_map(p.v, p.dtype, p.v_st, p.B, p.H_kv, p.S_k, p.D, Tr::kBlockN);
  if (p.grads_f32) {  // the consumers store dK and dV themselves
    a.dk_f32 = static_cast<float*>(p.dk), a.dv_f32 = static_cast<float*>(p.dv);
    a.dk_f32_st = p.dk_st, a.dv_f32_st = p.dv_st;
  } else {
    a.tm_dk = sm90::make_tensor_map(p.dk, p.dtype, p.dk_st, p.B, p.H_kv, p.S_k, p.D, 64);
    a.tm_dv = sm90::make_tensor_map(p.dv, p.dtype, p.dv_st, p.B, p.H_kv, p.S_k, p.D, 64);
  }
  a.S_k = p.S_k;
  // dQ into the caller's accumulator (BwdParams::dq_accum) or the workspace's.
  const bool own_accum = p.dq_accum == nullptr;
  a.dq_accum = own_accum ? reinterpret_cast<float*>(base) : p.dq_accum;
  float* lse2 = reinterpret_cast<float*>(base + ws.accum);
  float* dsum = reinterpret_cast<float*>(base + ws.accum + ws.stats);
  a.lse2 = lse2;
  a.dsum = dsum;
  a.dq_sem = p.deterministic ? reinterpret_cast<int*>(base + ws.accum + 2 * ws.stats) : nullptr;
  if (Tr::kPhased && !p.deterministic && phased(p, ctx))
    a.phase = reinterpret_cast<int*>(base + ws.accum + 2 * ws.stats + ws.sems);
  a.H = p.H;
  a.group = p.H / p.H_kv;
  a.S_q = p.S_q;
  a.S_pad = padded_rows(p.S_q, Tr::kBlockM);
  a.dq_rows = own_accum ? a.S_pad : p.dq_accum_rows;
  a.dq_row0 = own_accum ? 0 : p.dq_accum_row0;
  a.scale = p.scale;
  a.scale_log2 = p.scale_log2;
  a.vis = make_visibility(p);
  const KeyShifts shifts = key_shifts(a.vis);
  a.key_lo_shift = shifts.lo;
  a.key_hi_shift = shifts.hi;

  if (own_accum) CUDA_CHECK(cudaMemsetAsync(a.dq_accum, 0, ws.accum, ctx.stream));
  if (p.deterministic) CUDA_CHECK(cudaMemsetAsync(a.dq_sem, 0, ws.sems, ctx.stream));
  if (a.phase != nullptr) CUDA_CHECK(cudaMemsetAsync(a.phase, 0, ws.phase, ctx.stream));
  PreArgs pre;
  pre.o = p.o, pre.dout = p.dout, pre.o_st = p.o_st, pre.do_st = p.do_st;
  pre.lse = static_cast<const float*>(p.lse);
  pre.lse2 = lse2, pre.dsum = dsum;
  pre.H = p.H, pre.S_q = p.S_q, pre.S_pad = a.S_pad, pre.D = p.D;
  preprocess_kernel<T><<<dim3((a.S_pad + kPreRows - 1) / kPreRows, p.H, p.B), 4 * kPreRows, 0, ctx.stream>>>(pre);
  CHECK_LAUNCH("hopper_bwd preprocess_kernel");

  auto kernel = &backward_kernel<Tr, kBf16>;
  CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Tr::kSmemBytes));
  // Key blocks of one kv head are adjacent in launch order (their CTAs share Q and dO in L2), block
  // 0 (under a causal mask the most Q blocks) first; the deterministic path relies on key block
  // j - 1 being launched before j.
  // A part of the work (BwdParams::tiles_*) keeps that order on a one-dimensional grid.
  const int n_kb = (p.S_k + Tr::kBlockN - 1) / Tr::kBlockN;
  dim3 grid(n_kb, p.H_kv, p.B);
  if (p.tiles_end > 0) a.n_kb = n_kb, a.tile0 = p.tiles_begin, grid = dim3(p.tiles_end - p.tiles_begin);
  kernel<<<grid, Tr::kThreads, Tr::kSmemBytes, ctx.stream>>>(a);
  CHECK_LAUNCH("hopper_bwd backward_kernel");

  if (!own_accum) return;  // the caller's dq_finish writes it out
  if (p.grads_f32)
    convert_dq<Tr::kHeadDim, float, true>(a.dq_accum, a.S_pad, p, static_cast<float*>(p.dq), ctx.stream);
  else
    convert_dq<Tr::kHeadDim, T, false>(a.dq_accum, a.S_pad, p, static_cast<T*>(p.dq), ctx.stream);
}

// Head dims with a variant of their own, and those handed to the mma backward.
using OwnHeadDims = HeadDims<64, 128>;
using FallbackHeadDims = HeadDims<32, 96, 256>;

// dq_finish: a caller's accumulator (BwdParams::dq_accum, dq_accum_rows per (batch, head)) ->
// dQ in the dtype, scaled.
template <bool kBf16, int kHeadDim>
void finish(const BwdParams& p, const LaunchContext& ctx) {
  using T = std::conditional_t<kBf16, __nv_bfloat16, __half>;
  convert_dq<kHeadDim, T, false>(p.dq_accum, p.dq_accum_rows, p, static_cast<T*>(p.dq), ctx.stream);
}

template <bool kBf16, bool kFinish = false>
void dispatch_head_dim(const BwdParams& p, const LaunchContext& ctx) {
  OwnHeadDims::dispatch(p.D, "hopper backward", [&](auto kD) {
    constexpr int D = decltype(kD)::value;
    if constexpr (kFinish)
      finish<kBf16, D>(p, ctx);
    else
      launch<kBf16, typename TraitsFor<D>::type>(p, ctx);
  });
}

bool has_own_variant(const BwdParams& p) {
  const bool scale_ok = p.scale_log2 > 0.f && std::isfinite(p.scale_log2);
  return OwnHeadDims::declares(p.D) && scale_ok && p.mask.ptr == nullptr;
}

// One CTA's keys, at every head dim of its own (Traits::kBlockN).
constexpr int kKeyTile = 128;
static_assert(TraitsFor<64>::type::kBlockN == kKeyTile && TraitsFor<128>::type::kBlockN == kKeyTile, "one key tile");
int key_tile(const BwdParams& p) { return has_own_variant(p) ? kKeyTile : 0; }

const KernelMode& mma_backward() {
  const KernelMode* mma = Registry::find("mma", Mode::Backward);
  if (mma == nullptr || mma->bwd == nullptr) throw RuntimeError("hopper backward: the mma fallback is not built");
  return *mma;
}

size_t workspace_bytes(const BwdParams& p) {
  if (!has_own_variant(p)) {
    const KernelMode& mma = mma_backward();
    return mma.bwd_workspace != nullptr ? mma.bwd_workspace(p) : 0;
  }
  return Workspace(p).total();
}

void run(const BwdParams& p, const LaunchContext& ctx) {
  if (static_cast<int64_t>(p.B) * p.H * p.S_q == 0 || p.S_k == 0) return;
  if (!has_own_variant(p)) {
    if (p.grads_f32) throw RuntimeError("hopper backward: fp32 gradients need its own variant (fp32_gradients says)");
    if (p.tiles_end != 0) throw RuntimeError("hopper backward: a tile range needs its own variant (key_tile says)");
    return mma_backward().bwd(p, ctx);  // as --list says
  }
  if (ctx.sm != 90)
    throw RuntimeError("hopper backward: built for sm_90a only; this GPU is sm_" + std::to_string(ctx.sm));
  check_tiled_forward(p, "hopper backward");
  if (!aligned16(p.dout) || !aligned16(p.dk) || !aligned16(p.dv) || !aligned16(p.dq) ||
      !strides_multiple_of(p.do_st, 8) || !strides_multiple_of(p.dk_st, 8) || !strides_multiple_of(p.dv_st, 8) ||
      !strides_multiple_of(p.dq_st, 8))
    throw RuntimeError("hopper backward: tensors must be 16-byte aligned with strides a multiple of 8 elements");
  if (p.lse == nullptr) throw RuntimeError("hopper backward: needs the forward's lse");
  if (p.dq_accum != nullptr && (!p.grads_f32 || p.dq_accum_rows % kDqAccumRows || p.dq_accum_row0 % kDqAccumRows ||
                                int64_t(p.dq_accum_row0) + p.S_q + kDqAccumSpare > p.dq_accum_rows))
    throw RuntimeError("hopper backward: dq_accum needs grads_f32, rows and a first row in multiples of " +
                       std::to_string(kDqAccumRows) + " and room for S_q + " + std::to_string(kDqAccumSpare) + " rows");
  if (p.tiles_begin != 0 || p.tiles_end != 0) {
    const int64_t tiles = int64_t(p.B) * p.H_kv * ((p.S_k + kKeyTile - 1) / kKeyTile);
    if (p.tiles_begin < 0 || p.tiles_begin >= p.tiles_end || p.tiles_end > tiles)
      throw RuntimeError("hopper backward: the tile range [" + std::to_string(p.tiles_begin) + ", " +
                         std::to_string(p.tiles_end) + ") is not inside the " + std::to_string(tiles) + " key tiles");
  }
  if (p.workspace == nullptr || p.workspace_bytes < Workspace(p).total())
    throw RuntimeError("hopper backward: workspace smaller than its workspace function asked for");
  switch (p.dtype) {
    case DType::F16: return dispatch_head_dim<false>(p, ctx);
    case DType::BF16: return dispatch_head_dim<true>(p, ctx);
    default: throw RuntimeError(std::string("hopper backward: no variant compiled for dtype ") + dtype_name(p.dtype));
  }
}

void dq_finish(const BwdParams& p, const LaunchContext& ctx) {
  if (static_cast<int64_t>(p.B) * p.H * p.S_q == 0) return;
  if (p.dq_accum == nullptr || p.dq_accum_rows % kDqAccumRows || p.dq_accum_rows < p.S_q || !OwnHeadDims::declares(p.D))
    throw RuntimeError("hopper backward: dq_finish needs an accumulator of whole " + std::to_string(kDqAccumRows) +
                       "-row groups covering S_q, at head dim 64 or 128");
  if (!aligned16(p.dq) || !strides_multiple_of(p.dq_st, 8))
    throw RuntimeError("hopper backward: dq must be 16-byte aligned with strides a multiple of 8 elements");
  switch (p.dtype) {
    case DType::F16: return dispatch_head_dim<false, true>(p, ctx);
    case DType::BF16: return dispatch_head_dim<true, true>(p, ctx);
    default: throw RuntimeError(std::string("hopper backward: no variant compiled for dtype ") + dtype_name(p.dtype));
  }
}

KernelMode make_entry() {
  KernelMode m = sm90::hopper_entry(Mode::Backward, OwnHeadDims::list(), FallbackHeadDims::list());
  m.summary = "FlashAttention-3 style backward: TMA ring of Q/dO, wgmma for all five products, dQ added by the "
              "copy engine (--deterministic: ordered); sm_90a; D 32/96/256 run mma";
  m.uses_atomics = true;  // the copy engine's reductions into the dQ accumulator
  m.bitwise_reproducible = false;
  m.has_deterministic_path = true;
  m.bwd = &run;
  m.bwd_workspace = &workspace_bytes;
  m.fp32_gradients = &has_own_variant;
  m.dq_finish = &dq_finish;
  m.key_tile = &key_tile;
  return m;
}

}  // namespace
}  // namespace hopper_bwd
}  // namespace flashattn

FLASHATTN_REGISTER_KERNEL_MODE(hopper_backward, flashattn::hopper_bwd::make_entry)
