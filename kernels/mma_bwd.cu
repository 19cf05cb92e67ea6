// mma, backward — rung 7 of the ladder: FlashAttention-2's backward pass (Dao 2023, Algorithm 2)
// on tensor cores through mma.sync.m16n8k16 (fp16/bf16 operands, fp32 accumulators). Over the
// wmma rung it chooses its own fragment layouts: ldmatrix(.trans) reads every operand of the five
// products from the one row-major, swizzled copy of each tile (no transposed copies, no padding),
// and the softmax gradient works on the accumulators in registers.
//
//   preprocess   D_i = rowsum(dO_i ∘ O_i) (fp32, workspace); the fp32 dQ accumulator zeroed
//   dK/dV        one block per (K/V block j, kv head, batch), looping over every query head of
//                its GQA group and every Q block that sees block j (common/mma_bwd_dkdv.cuh):
//                  S = Q_i K_jᵀ;  P = exp2(S·scale·log2 e − lse_i·log2 e);  dP = dO_i V_jᵀ
//                  dS = P ∘ (dP − D_i);  dV_j += Pᵀ dO_i;  dK_j += dSᵀ Q_i  (registers)
//                  dQ_i += dS K_j  (fp32 reductions into the workspace, in fragment order)
//                Q_i, dO_i arrive by cp.async one step ahead (double-buffered); K_j, V_j once
//   convert      dQ = scale · accumulator, un-permuted -> dtype, 16-byte stores with dQ's strides
// --deterministic: no dQ atomics; a dQ kernel (one block per Q block and query head) recomputes
// S, P, dP, dS and accumulates dQ_i in registers in a fixed key order (common/mma_bwd_dq.cuh):
// 7 products instead of 5. dK/dV never use atomics (GQA heads summed inside the block).
// How the dK/dV step is laid out and what each choice bought: common/mma_bwd_dkdv.cuh.
//
// Masking: Q blocks with no visible key for block j are never visited (mask.cuh ranges); the
// per-element test (causal, window, key padding, S_k tail) runs only on blocks that straddle a
// boundary, and on every block when an additive mask is given (its entries are read per element,
// -inf allowed). Empty rows (lse = -inf) give P = 0, so they add nothing to dK, dV and keep dQ = 0.
// Tile shapes per head dim: common/mma_bwd_traits.cuh (Config<kHeadDim>), with the reasons.
//
// Limits: fp16 and bf16; head dims 32, 64, 96, 128, 256; sm_80+ (cp.async, ldmatrix, bf16 mma);
// pointers 16-byte aligned, strides multiples of 8 elements; at most 161 KiB of shared memory per
// block (D = 64 and 128), so every shape also runs on an A100. Workspace: D [B, H, S_q] fp32
// plus, unless deterministic, the dQ accumulator [B, H, S_q rounded up to 128, D] fp32.
// Instantiations: 2 dtypes x 5 head dims x (dK/dV, dQ, convert) = 30, plus the preprocess kernel
// per dtype: 32 per arch, about 45 s of nvcc wall time for sm_80 + sm_90a together (CUDA 13.0,
// 2026-11-25). Masking and the additive mask are uniform run-time branches, not template
// parameters. -DFLASHATTN_HDIMS=128 compiles (and registers) head dim 128 alone, for fast
// development builds.
// Registers: the dK/dV kernel runs one 256-thread block per SM at up to 255 registers, without
// spills on sm_90a; on sm_80 the D = 64 dK/dV kernel spills 12 bytes (stores) / 20 bytes (loads)
// per thread to its stack, every other kernel none (ptxas -v, CUDA 13.0).
//
// Measured (H200, 2026-11-21, bf16, FlashAttention's grid B·S = 16384, H = 2048/D; TFLOP/s,
// backward = 2.5x the forward's FLOPs; x = ratio to PyTorch's flash backend on the same card):
//   D = 64:   S = 1k 241 (1.28x), 4k 274 (1.08x), 16k 282 (0.99x);
//             causal 1k 186 (1.43x), 4k 252 (1.17x), 16k 283 (1.06x)
//   D = 128:  S = 1k 266 (1.34x), 4k 305 (1.12x), 16k 315 (1.05x);
//             causal 1k 204 (1.47x), 4k 274 (1.16x), 16k 319 (1.05x)
// What limits it: mma.sync is Ampere's tensor-core path (Hopper's wgmma and TMA are not used),
// and at up to 255 registers per thread one block of 8 warps holds the SM, so the two barriers
// of every step stall the whole SM with no other block to switch to. Per warp and step the
// tensor instructions share the issue slots with the ldmatrix (144 per 320 mma), exp2, dS and
// reduction work: about 925 instructions per 320 mma at D = 128, 1134 at D = 64 (sm_90a,
// unmasked step), hence D = 64 below D = 128. Short and causal problems give each block few
// steps over which to spread loading K_j, V_j and storing dK_j, dV_j (1k causal: 186 / 204).
#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <vector>

#include "common/head_dims.h"
#include "common/layout_checks.h"
#include "common/mma_bwd_dkdv.cuh"
#include "common/mma_bwd_dq.cuh"
#include "common/mma_bwd_traits.cuh"
#include "flashattn/check.h"
#include "flashattn/error.h"
#include "flashattn/registry.h"

namespace flashattn {
namespace mma_bwd {

// ---- kernels: thin wrappers that hand the block its coordinates --------------------------------

template <class T>
__global__ void __launch_bounds__(kRowThreads) preprocess_kernel(const Args<T> a) {
  preprocess_rows(a, threadIdx.x, blockIdx.x, blockIdx.y, blockIdx.z);
}

// One block per (Q block of the dK/dV kernel, query head, batch).
template <class Kt, class T>
__global__ void __launch_bounds__(kRowThreads) convert_dq_kernel(const Args<T> a) {
  __shared__ __align__(16) uint32_t s[DqFragTile<Kt>::kWords];
  convert_dq<Kt>(a, s, threadIdx.x, kRowThreads, blockIdx.x, blockIdx.y, blockIdx.z);
}

// The XOR addressing of the swizzled tiles needs their shared-window addresses aligned to a row
// (up to 512 bytes); the declared alignment should give that, and kSmemSlack spare bytes make it
// certain whatever the runtime places before the dynamic segment.
__device__ __forceinline__ char* aligned_smem(char* p) {
  const uint32_t s = ptx::smem_u32(p);
  return p + (kSmemSlack - s % kSmemSlack) % kSmemSlack;
}

// One block per SM: dK and dV take most of the register file.
template <class Kt, class T>
__global__ void __launch_bounds__(Kt::kThreads, 1) dkdv_kernel(const Args<T> a) {
  extern __shared__ __align__(1024) char smem[];
  dkdv_block<Kt>(a, aligned_smem(smem), threadIdx.x, blockIdx.x, blockIdx.y, blockIdx.z);
}

template <class Kt, class T>
__global__ void __launch_bounds__(Kt::kThreads, 1) dq_kernel(const Args<T> a) {
  extern __shared__ __align__(1024) char smem[];
  dq_block<Kt>(a, aligned_smem(smem), threadIdx.x, blockIdx.x, blockIdx.y, blockIdx.z);
}

// ---- host side ------------------------------------------------------------------------------------

namespace {

int padded_rows(int S_q) { return (S_q + kAccumRowAlign - 1) / kAccumRowAlign * kAccumRowAlign; }
size_t dsum_bytes(const BwdParams& p) { return static_cast<size_t>(p.B) * p.H * p.S_q * sizeof(float); }
size_t dq_accum_bytes(const BwdParams& p) {
  return p.deterministic ? 0 : static_cast<size_t>(p.B) * p.H * padded_rows(p.S_q) * p.D * sizeof(float);
}

// The dQ accumulator first (its rows are D floats, so D_i behind it stays 16-byte aligned).
size_t workspace_bytes(const BwdParams& p) { return dq_accum_bytes(p) + dsum_bytes(p); }

template <class T>
Args<T> make_args(const BwdParams& p) {
  Args<T> a;
  a.q = static_cast<const T*>(p.q);
  a.k = static_cast<const T*>(p.k);
  a.v = static_cast<const T*>(p.v);
  a.o = static_cast<const T*>(p.o);
  a.dout = static_cast<const T*>(p.dout);
  a.dq = static_cast<T*>(p.dq);
  a.dk = static_cast<T*>(p.dk);
  a.dv = static_cast<T*>(p.dv);
  a.q_st = p.q_st, a.k_st = p.k_st, a.v_st = p.v_st, a.o_st = p.o_st, a.do_st = p.do_st;
  a.dq_st = p.dq_st, a.dk_st = p.dk_st, a.dv_st = p.dv_st;
  a.lse = static_cast<const float*>(p.lse);
  char* ws = static_cast<char*>(p.workspace);
  a.dq_accum = p.deterministic ? nullptr : reinterpret_cast<float*>(ws);
  a.dsum = reinterpret_cast<float*>(ws + dq_accum_bytes(p));
  a.B = p.B, a.H = p.H, a.H_kv = p.H_kv, a.S_q = p.S_q, a.S_k = p.S_k, a.D = p.D;
  a.S_q_pad = padded_rows(p.S_q);
  a.group = p.H / p.H_kv;
  a.scale = p.scale;
  a.scale_log2 = p.scale_log2;
  a.vis = make_visibility(p);
  return a;
}

unsigned blocks_of(int64_t n, int per_block) { return static_cast<unsigned>((n + per_block - 1) / per_block); }

template <class Kernel>
void prepare_smem(Kernel kernel, int bytes, const LaunchContext& ctx, int head_dim) {
  int optin = 0;
  CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, ctx.device));
  if (optin < bytes)
    throw RuntimeError("mma backward: head dim " + std::to_string(head_dim) + " needs " + std::to_string(bytes) +
                       " bytes of shared memory per block, the device allows " + std::to_string(optin));
  CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
}

template <int kHeadDim, class T>
void launch(const BwdParams& p, const LaunchContext& ctx) {
  using DkDv = typename Config<kHeadDim>::DkDv;
  using Dq = typename Config<kHeadDim>::Dq;
  const Args<T> a = make_args<T>(p);
  // The accumulator's padding rows are zeroed too.
  const dim3 pre_grid(blocks_of(p.deterministic ? p.S_q : a.S_q_pad, kRowsPerBlock), p.H, p.B);
  preprocess_kernel<T><<<pre_grid, kRowThreads, 0, ctx.stream>>>(a);
  CHECK_LAUNCH("mma_bwd preprocess_kernel");

  if (p.deterministic) {
    auto kernel = &dq_kernel<Dq, T>;
    const int smem = Dq::kSmemBytes + kSmemSlack;
    prepare_smem(kernel, smem, ctx, kHeadDim);
    const dim3 grid(blocks_of(p.S_q, Dq::kBlockM), p.H, p.B);
    kernel<<<grid, Dq::kThreads, smem, ctx.stream>>>(a);
    CHECK_LAUNCH("mma_bwd dq_kernel");
  }

  auto kernel = &dkdv_kernel<DkDv, T>;
  const int smem = DkDv::kSmemBytes + kSmemSlack;
  prepare_smem(kernel, smem, ctx, kHeadDim);
  // K blocks of one kv head are adjacent in launch order, so the blocks running together share
  // their Q and dO tiles in L2; block 0 (the most Q blocks under causal masking) goes first.
  const dim3 grid(blocks_of(p.S_k, DkDv::kBlockN), p.H_kv, p.B);
  kernel<<<grid, DkDv::kThreads, smem, ctx.stream>>>(a);
  CHECK_LAUNCH("mma_bwd dkdv_kernel");

  if (!p.deterministic) {
    const dim3 convert_grid(blocks_of(p.S_q, DkDv::kBlockM), p.H, p.B);
    convert_dq_kernel<DkDv, T><<<convert_grid, kRowThreads, 0, ctx.stream>>>(a);
    CHECK_LAUNCH("mma_bwd convert_dq_kernel");
  }
}

// Head dims with a variant; the build compiles those FLASHATTN_HDIMS enables (common/head_dims.h).
using KernelHeadDims = HeadDims<32, 64, 96, 128, 256>;

template <class T>
void dispatch_head_dim(const BwdParams& p, const LaunchContext& ctx) {
  KernelHeadDims::dispatch(p.D, "mma backward", [&](auto kD) { launch<decltype(kD)::value, T>(p, ctx); });
}


void run(const BwdParams& p, const LaunchContext& ctx) {
  if (static_cast<int64_t>(p.B) * p.H * p.S_q == 0 || p.S_k == 0) return;
  if (p.H_kv <= 0 || p.H % p.H_kv != 0) throw RuntimeError("mma backward: H must be a multiple of H_kv");
  if (p.H > 65535 || p.B > 65535) throw RuntimeError("mma backward: B and H must be at most 65535 (grid limits)");
  if (p.lse == nullptr) throw RuntimeError("mma backward: needs the forward's lse");
  if (p.workspace_bytes < workspace_bytes(p) || (workspace_bytes(p) > 0 && p.workspace == nullptr))
    throw RuntimeError("mma backward: workspace smaller than its workspace function asked for");
  // 16-byte cp.async and vector loads/stores of whole 8-element chunks.
  const void* ptrs[] = {p.q, p.k, p.v, p.o, p.dout, p.dq, p.dk, p.dv};
  for (const void* ptr : ptrs)
    if (!aligned16(ptr)) throw RuntimeError("mma backward: every tensor must be 16-byte aligned");
  const Strides* strides[] = {&p.q_st, &p.k_st, &p.v_st, &p.o_st, &p.do_st, &p.dq_st, &p.dk_st, &p.dv_st};
  for (const Strides* s : strides)
    if (!strides_multiple_of(*s, 8)) throw RuntimeError("mma backward: strides must be multiples of 8 elements");
  switch (p.dtype) {
    case DType::F16: return dispatch_head_dim<__half>(p, ctx);
    case DType::BF16: return dispatch_head_dim<__nv_bfloat16>(p, ctx);
    default: throw RuntimeError(std::string("mma backward: not compiled for dtype ") + dtype_name(p.dtype));
  }
}

KernelMode make_entry() {
  KernelMode m;
  m.kernel = "mma";
  m.mode = Mode::Backward;
  m.summary = "FlashAttention-2 backward with mma.sync: K/V-block parallel, dQ by fp32 atomics "
              "(--deterministic: separate dQ pass)";
  m.rung = 7;
  m.gpu = true;
  m.min_sm = 80;  // cp.async, ldmatrix, bf16 mma.sync
  m.dtypes = dtype_bit(DType::F16) | dtype_bit(DType::BF16);
  m.head_dims = KernelHeadDims::list();
  m.features = kAllFeatures;
  m.uses_atomics = true;
  m.partial_outputs = true;  // a ring over several GPUs may merge its blocks (registry.h)
  m.bitwise_reproducible = false;  // the order of the dQ atomics varies run to run
  m.has_deterministic_path = true;
  m.bwd = &run;
  m.bwd_workspace = &workspace_bytes;
  return m;
}

}  // namespace
}  // namespace mma_bwd
}  // namespace flashattn

FLASHATTN_REGISTER_KERNEL_MODE(mma_backward, flashattn::mma_bwd::make_entry)
