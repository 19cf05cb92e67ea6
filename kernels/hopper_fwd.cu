// hopper, forward — rung 8 of the ladder: FlashAttention on Hopper's own instructions (sm_90a).
// Over rung 7 (mma, mma.sync fed by ldmatrix/cp.async) it adds:
//   - the tensor copy engine (TMA, cp.async.bulk.tensor): Q, K and V tiles arrive in 128-byte
//     swizzled shared memory through tensor maps, completion counted in bytes on mbarriers, K/V in a
//     kStages-deep ring; rows past a sequence arrive as zeros, and O leaves through a TMA store
//     that drops rows past S_q;
//   - warpgroup matrix products (wgmma.mma_async): S = Q K^T with both operands in shared memory,
//     O += P V with P straight from registers (the accumulator layout of S, rounded to 16 bits, is
//     the A-fragment layout) and V read transposed by the tensor cores;
//   - warp specialisation: warpgroup 0 is the producer (one thread issues every copy; setmaxnreg
//     gives its registers away), warpgroups 1..kConsumerWGs each own 64 query rows of the tile.
//   - a persistent grid: one CTA per SM takes (m block, head, batch) tiles in order from a global
//     counter, so one tile's epilogue (O through shared memory, the TMA store) overlaps the next
//     tile's Q and K/V copies, and a short sequence pays no CTA launch per tile.
// Tiles: D128 and D256 take 128 query rows (two consumer warpgroups taking turns; 128 and 80 keys
// per block), D64 192 rows (three consumer warpgroups, no turns: its softmax, not the tensor
// cores, is the bound), except under a causal mask or window below 2048 queries and on grids of
// under four waves, where 128-row tiles with turns measure faster (d64_wide_tiles). D128 on long
// rows takes 192 rows of 80-key blocks too: a third less K/V out of L2 per product, which the
// power cap turns into clock (d128_wide_tiles). Where registers are short (three warpgroups,
// D256), P is computed in place in the score registers (hopper_fwd_tile.cuh, TraitsFor).
//
// FlashAttention-3 (Shah et al. 2024), Algorithm 1 with its two overlaps (Consumer::run_pipelined):
//   producer: load Q_i; for each key block j (masked blocks first, then the rest, descending):
//               wait until K's slot of stage s is free, load K_j; the same for V_j
//   consumer: wait for Q_i; S_0 = Q_i K_0^T; softmax(S_0) -> P_0
//             for each later j, on this warpgroup's turn (ping-pong with the other warpgroup,
//             where there are two):
//               issue S_j = Q_i K_j^T and O += P_{j-1} V_{j-1} (two wgmma groups)
//               wait for S_j only; release K_j; mask S_j on boundary blocks
//               m_new = max(m_i, rowmax(S_j)); P_j = exp2(S_j*c - m_new*c)
//               l_i = exp2((m_i - m_new)*c) l_i + rowsum(P_j)        (while P V still runs)
//               wait for P V; release V_{j-1}; O = diag(exp2((m_i - m_new)*c)) O
//             O += P_last V_last; O /= l_i; lse_i = (m_i*c + log2 l_i) ln 2
//             O -> swizzled smem -> TMA store; lse -> global
//
// Features: causal (bottom-right), window, key padding (seqlens_k; the padded K/V rows must hold
// finite values: they are multiplied by P = 0), GQA/MQA, S_q != S_k, any length >= 1, empty rows
// (O = 0, lse = -inf), bhsd and bshd. Not the additive mask (declared unsupported).
// Limits: fp16/bf16, head dims 64, 128, 256 (other head dims, and a scale <= 0, run the mma
// kernel instead); sm_90 only (the file is built for sm_90a alone); tensors 16-byte aligned with
// strides a multiple of 8 elements (tensor-map rules).
// Instantiations: 5 tile configurations x 2 dtypes = 10 kernels, plus the serial schedule at D128
// bf16 in 128-row tiles for the ablation (FLASHATTN_HOPPER_SCHEDULE=serial).
// Measured 2026-11-26, H100 SXM (1980 MHz), bf16, every row --check'ed, PyTorch's cuDNN and flash
// backends in the same run: B4 H16 S4096 D128 690 TFLOP/s, 1.01x cuDNN and 1.92x flash;
// B2 H32 S8192 D64 533 TFLOP/s, 1.07x cuDNN and 1.72x flash (docs/PERF.md has the grid).
#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <type_traits>

#include "common/head_dims.h"
#include "common/hopper_entry.h"
#include "common/hopper_fwd_tile.cuh"
#include "common/layout_checks.h"
#include "common/sm90.cuh"
#include "common/sm90_tma_host.h"
#include "flashattn/check.h"
#include "flashattn/error.h"
#include "flashattn/registry.h"

namespace flashattn {
namespace hopper_fwd {

// The producer: one thread issues every copy and fetches every tile. Per tile: publish its index,
// load Q once the consumers are done with the previous one, then each key block's K and V into
// the next ring stage once the consumers have released it. The ring position (it_base + it)
// runs on across tiles, as the consumers' does.
template <class Tr>
__device__ __forceinline__ void produce(const Args& a, const Smem<Tr>& sm) {
  sm90::prefetch_tensor_map(&a.tm_q);
  sm90::prefetch_tensor_map(&a.tm_k);
  sm90::prefetch_tensor_map(&a.tm_v);
  int tile = blockIdx.x, it_base = 0;
  for (int k = 0;; ++k) {
    const int slot = k & 1;
    sm90::mbar_wait(sm.empty_tile(slot), ((k >> 1) & 1) ^ 1);
    const bool done = tile >= a.num_tiles;
    sm90::st_shared_32(sm.tile_id(slot), done ? ~0u : static_cast<uint32_t>(tile));
    sm90::mbar_arrive(sm.full_tile(slot));
    if (done) break;
    const Tile<Tr> t(a, tile);
    const KeySchedule<Tr> ks(a.vis, t.m0, t.m_last, t.seqlen_k);
    sm90::mbar_wait(sm.empty_q(), (k & 1) ^ 1);
    sm90::mbar_arrive_expect_tx(sm.bar_q(), Tr::kTileQBytes);
#pragma unroll
    for (int p = 0; p < Tr::kPanels; ++p)
      sm90::tma_load_4d(sm.q + p * Tr::kPanelBytesQ, &a.tm_q, sm.bar_q(), p * 64, t.m0, t.h, t.b);
    const int hk = t.h / a.h_per_kv;  // GQA: the kv head this query head reads
    for (int it = 0; it < ks.n_total; ++it) {
      const int s = (it_base + it) % Tr::kStages;
      const uint32_t phase = ((it_base + it) / Tr::kStages) & 1;
      const int n0 = ks.block_at(it) * Tr::kBlockN;
      sm90::mbar_wait(sm.empty_k(s), phase ^ 1);  // the consumers are done with the K it held
      sm90::mbar_arrive_expect_tx(sm.full_k(s), Tr::kTileKVBytes);
#pragma unroll
      for (int p = 0; p < Tr::kPanels; ++p)
        sm90::tma_load_4d(sm.k_stage(s) + p * Tr::kPanelBytesKV, &a.tm_k, sm.full_k(s), p * 64, n0, hk, t.b);
      sm90::mbar_wait(sm.empty_v(s), phase ^ 1);  // ... and with its V
      sm90::mbar_arrive_expect_tx(sm.full_v(s), Tr::kTileKVBytes);
#pragma unroll
      for (int p = 0; p < Tr::kPanels; ++p)
        sm90::tma_load_4d(sm.v_stage(s) + p * Tr::kPanelBytesKV, &a.tm_v, sm.full_v(s), p * 64, n0, hk, t.b);
    }
    // Claim the next tile only now, with this tile's last copies issued (kStages key blocks before
    // the consumers finish it): claiming it when the tile starts would hand out tiles by start time,
    // and under a causal mask a CTA that began with a heavy tile would also get the next heavy one.
    // The atomic's latency still hides behind the consumers' last blocks.
    tile = static_cast<int>(atomicAdd(a.tile_counter, 1u)) + gridDim.x;
    it_base += ks.n_total;
  }
}

template <class Tr, bool kBf16, bool kSerial>
__global__ void __launch_bounds__(Tr::kThreads, 1) forward_kernel(const __grid_constant__ Args a) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ == 900 && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ __align__(1024) unsigned char smem[];
  const Smem<Tr> sm(sm90::smem_u32(smem));
  const int tid = threadIdx.x, wg = tid / 128;
  constexpr int kConsumerWarps = Tr::kConsumerWGs * 4;  // one arrival each on the empty barriers

  if (tid == 0) {
    sm90::mbar_init(sm.bar_q(), 1);
    sm90::mbar_init(sm.empty_q(), kConsumerWarps);
    for (int s = 0; s < Tr::kStages; ++s) {
      sm90::mbar_init(sm.full_k(s), 1);
      sm90::mbar_init(sm.full_v(s), 1);
      sm90::mbar_init(sm.empty_k(s), kConsumerWarps);
      sm90::mbar_init(sm.empty_v(s), kConsumerWarps);
    }
    for (int slot = 0; slot < 2; ++slot) {
      sm90::mbar_init(sm.full_tile(slot), 1);
      sm90::mbar_init(sm.empty_tile(slot), kConsumerWarps);
    }
    sm90::fence_barrier_init();
  }
  __syncthreads();

  if (wg == 0) {
    sm90::setmaxnreg_dec<Tr::kProducerRegs>();
    if (tid == 0) produce<Tr>(a, sm);
  } else {
    sm90::setmaxnreg_inc<Tr::kConsumerRegs>();
    const int cw = wg - 1, ctid = tid - 128 * wg;
    if (Tr::kPingPong && cw == 1) sm90::named_arrive(5, 256);  // warpgroup 0 takes the first turn
    int it_base = 0;
    for (int k = 0;; ++k) {
      const int slot = k & 1;
      sm90::mbar_wait(sm.full_tile(slot), (k >> 1) & 1);
      const int tile = static_cast<int>(sm90::ld_shared_32(sm.tile_id(slot)));
      __syncwarp();
      if (ctid % 32 == 0) sm90::mbar_arrive(sm.empty_tile(slot));
      if (tile < 0) break;
      const Tile<Tr> t(a, tile);
      const KeySchedule<Tr> ks(a.vis, t.m0, t.m_last, t.seqlen_k);
      Consumer<Tr, kBf16> c(a, sm, ks, t, cw, ctid, it_base);
      sm90::mbar_wait(sm.bar_q(), k & 1);
      if (ks.n_total == 0) {
        if (Tr::kSeparateO) c.release(sm.empty_q());
      } else if constexpr (kSerial) {
        c.run_serial();
      } else {
        c.run_pipelined();
      }
      c.epilogue();
      it_base += ks.n_total;
    }
    if (Tr::kPingPong && cw == 0) sm90::named_sync(5, 256);  // warpgroup 1's last hand-over
    if (Tr::kSeparateO && ctid == 0) sm90::tma_store_wait_read();
  }
#endif
}

template <bool kBf16, class Tr>
void launch(const FwdParams& p, const LaunchContext& ctx) {
  Args a;
  a.tm_q = sm90::make_tensor_map(p.q, p.dtype, p.q_st, p.B, p.H, p.S_q, p.D, Tr::kBlockM);
  a.tm_k = sm90::make_tensor_map(p.k, p.dtype, p.k_st, p.B, p.H_kv, p.S_k, p.D, Tr::kBlockN);
  a.tm_v = sm90::make_tensor_map(p.v, p.dtype, p.v_st, p.B, p.H_kv, p.S_k, p.D, Tr::kBlockN);
  a.tm_o = sm90::make_tensor_map(p.o, p.dtype, p.o_st, p.B, p.H, p.S_q, p.D, 64);
  a.lse = static_cast<float*>(p.lse);
  a.lse_stride = p.lse_stride > 0 ? p.lse_stride : p.S_q;
  a.merge = p.merge_output;
  a.o_in = p.o;
  a.o_sb = p.o_st.batch, a.o_sh = p.o_st.head, a.o_ss = p.o_st.row;
  a.tile_counter = static_cast<unsigned*>(p.workspace);
  a.num_m_blocks = (p.S_q + Tr::kBlockM - 1) / Tr::kBlockM;
  a.num_tiles = static_cast<int>(static_cast<int64_t>(a.num_m_blocks) * p.H * p.B);  // < 2^31: run() checks
  a.H = p.H;
  a.h_per_kv = p.H / p.H_kv;
  a.S_q = p.S_q;
  a.scale_log2 = p.scale_log2;
  a.vis = make_visibility(p);
  const KeyShifts shifts = key_shifts(a.vis);
  a.key_lo_shift = shifts.lo;
  a.key_hi_shift = shifts.hi;

  // FLASHATTN_HOPPER_SCHEDULE=serial runs the step-1 schedule (docs/PERF.md's ablation); it is
  // compiled for bf16 at D=128 in 128-row tiles only, to keep the build lean.
  const char* sched = std::getenv("FLASHATTN_HOPPER_SCHEDULE");
  const bool serial = sched != nullptr && std::string(sched) == "serial";
  if (sched != nullptr && !serial && std::string(sched) != "pipelined")
    throw RuntimeError(std::string("FLASHATTN_HOPPER_SCHEDULE: expected serial or pipelined, got '") + sched + "'");
  auto kernel = &forward_kernel<Tr, kBf16, false>;
  if (serial) {
    if constexpr (kBf16 && std::is_same_v<Tr, TraitsFor<128>::type>)
      kernel = &forward_kernel<Tr, kBf16, true>;
    else
      throw RuntimeError("FLASHATTN_HOPPER_SCHEDULE=serial is built for bf16 at D=128 in 128-row tiles only "
                         "(FLASHATTN_HOPPER_D128_ROWS=128 on long rows)");
  }
  // A persistent grid, one CTA per SM (shared memory and registers allow no second), each taking
  // tiles until none are left; one CTA per tile instead (the same code, each CTA's loop running
  // once) where other streams need SMs during the kernel (ctx.shares_device: a ring's merges and
  // transfers, which a persistent grid would hold off until its end). FLASHATTN_HOPPER_GRID=
  // persistent or tiles overrides the choice (the ablation).
  const char* grid_env = std::getenv("FLASHATTN_HOPPER_GRID");
  if (grid_env != nullptr && std::string(grid_env) != "tiles" && std::string(grid_env) != "persistent")
    throw RuntimeError(std::string("FLASHATTN_HOPPER_GRID: expected persistent or tiles, got '") + grid_env + "'");
  const bool per_tile = grid_env != nullptr ? std::string(grid_env) == "tiles" : ctx.shares_device;
  const int sms = ctx.sm_count > 0 ? ctx.sm_count : p.num_sms;
  const int ctas = per_tile || sms <= 0 ? a.num_tiles : std::min(a.num_tiles, sms);
  CUDA_CHECK(cudaMemsetAsync(p.workspace, 0, kWorkspaceBytes, ctx.stream));
  CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Tr::kSmemBytes));
  kernel<<<ctas, Tr::kThreads, Tr::kSmemBytes, ctx.stream>>>(a);
  CHECK_LAUNCH("hopper forward_kernel");
}

// FLASHATTN_HOPPER_D64_ROWS / _D128_ROWS = 128 or 192 force one tile height (the ablations in
// docs/PERF.md); -1 where the variable is unset.
int forced_rows(const char* var) {
  const char* rows = std::getenv(var);
  if (rows == nullptr) return -1;
  if (std::string(rows) == "128" || std::string(rows) == "192") return std::stoi(rows);
  throw RuntimeError(std::string(var) + ": expected 128 or 192, got '" + rows + "'");
}

// A causal mask or a window (the tile choices below treat both alike).
bool masked(const FwdParams& p) { return p.causal || p.window_left >= 0 || p.window_right >= 0; }

// Whole waves of `rows`-row tiles over the GPU's SMs.
int64_t waves_of(const FwdParams& p, const LaunchContext& ctx, int rows) {
  const int64_t tiles = static_cast<int64_t>((p.S_q + rows - 1) / rows) * p.H * p.B;
  return tiles / std::max(ctx.sm_count > 0 ? ctx.sm_count : p.num_sms, 1);
}

// D64's 192-row tiles pay off on big grids only: under a causal mask or window below 2048 queries
// (more of each diagonal block masked, more padding), and on grids of fewer than four waves of
// tiles (B4 H8 S1024: 192 tiles of 192 rows on 132 SMs is 1.45 waves, 0.72x cuDNN against 0.91x
// with 256 tiles of 128 rows), the 128-row tile with turns is faster.
bool d64_wide_tiles(const FwdParams& p, const LaunchContext& ctx) {
  if (const int rows = forced_rows("FLASHATTN_HOPPER_D64_ROWS"); rows > 0) return rows == 192;
  return !(masked(p) && p.S_q < 2048) && waves_of(p, ctx, TraitsFor<64>::type::kBlockM) >= 4;
}

// D128's 192-row tiles of 80-key blocks (TraitsD128Wide) move a third less K/V out of L2 per
// product: where the GPU runs at its power cap that is clock regained (H100, B1 H32 S65536: 3.4 %
// faster, 2.6 % under a causal mask). At full clock they are as fast per product, but they pad
// S_q to a multiple of 192 and S_k to one of 80 where the 128-row tiles pad to 128 (B4 H16 S4096:
// 4.7 % more work, 4.6 % slower), and under a causal mask or window their diagonal takes more
// masked blocks (S8192 and S16384 causal: 3 % slower). So they run without a mask where both
// lengths are 8192 or more, with one where S_q is 32768 or more (the power cap), on grids of
// four waves or more (docs/PERF.md).
bool d128_wide_tiles(const FwdParams& p, const LaunchContext& ctx) {
  if (const int rows = forced_rows("FLASHATTN_HOPPER_D128_ROWS"); rows > 0) return rows == 192;
  const bool long_rows = masked(p) ? p.S_q >= 32768 : p.S_q >= 8192 && p.S_k >= 8192;
  return long_rows && waves_of(p, ctx, TraitsD128Wide::kBlockM) >= 4;
}

// Head dims with variants of their own, and those handed to the mma kernel (fallback_head_dims);
// the build compiles those FLASHATTN_HDIMS enables (common/head_dims.h).
using OwnHeadDims = HeadDims<64, 128, 256>;
using FallbackHeadDims = HeadDims<32, 96>;

template <bool kBf16>
void dispatch_head_dim(const FwdParams& p, const LaunchContext& ctx) {
  OwnHeadDims::dispatch(p.D, "hopper forward", [&](auto kD) {
    constexpr int kHeadDim = decltype(kD)::value;
    if constexpr (kHeadDim == 64) {
      if (d64_wide_tiles(p, ctx)) return launch<kBf16, TraitsFor<64>::type>(p, ctx);
      return launch<kBf16, TraitsD64Narrow>(p, ctx);
    } else if constexpr (kHeadDim == 128) {
      if (d128_wide_tiles(p, ctx)) return launch<kBf16, TraitsD128Wide>(p, ctx);
      return launch<kBf16, TraitsFor<128>::type>(p, ctx);
    } else {
      return launch<kBf16, typename TraitsFor<kHeadDim>::type>(p, ctx);
    }
  });
}

bool has_own_variant(const FwdParams& p) {
  const bool dim_ok = OwnHeadDims::declares(p.D);
  const bool scale_ok = p.scale_log2 > 0.f && std::isfinite(p.scale_log2);
  return dim_ok && scale_ok && p.mask.ptr == nullptr;
}

size_t workspace_bytes(const FwdParams& p) {
  // The mma fallback needs none; ours is the tile counter.
  return has_own_variant(p) ? kWorkspaceBytes : 0;
}

void run(const FwdParams& p, const LaunchContext& ctx) {
  if (static_cast<int64_t>(p.B) * p.H * p.S_q == 0) return;
  if (!has_own_variant(p)) {
    if (p.merge_output || p.lse_stride > 0)
      throw RuntimeError("hopper forward: merging into the outputs needs its own variant (merges_output says)");
    // Head dims 32 and 96 (and a non-positive scale) take the mma.sync kernel, as --list says.
    const KernelMode* mma = Registry::find("mma", Mode::Forward);
    if (mma == nullptr || mma->fwd == nullptr) throw RuntimeError("hopper forward: the mma fallback is not built");
    return mma->fwd(p, ctx);
  }
  if (ctx.sm != 90) throw RuntimeError("hopper forward: built for sm_90a only; this GPU is sm_" + std::to_string(ctx.sm));
  // Tensor maps need 16-byte aligned base addresses and strides, too.
  check_tiled_forward(p, "hopper forward");
  if (p.workspace == nullptr || p.workspace_bytes < kWorkspaceBytes)
    throw RuntimeError("hopper forward: needs its workspace (the persistent grid's tile counter)");
  switch (p.dtype) {
    case DType::F16: return dispatch_head_dim<false>(p, ctx);
    case DType::BF16: return dispatch_head_dim<true>(p, ctx);
    default: throw RuntimeError(std::string("hopper forward: no variant compiled for dtype ") + dtype_name(p.dtype));
  }
}

KernelMode make_entry() {
  KernelMode m = sm90::hopper_entry(Mode::Forward, OwnHeadDims::list(), FallbackHeadDims::list());
  m.summary = "FlashAttention-3 style forward: TMA + mbarrier ring, wgmma (P from registers), producer/consumer "
              "warpgroups with setmaxnreg; sm_90a; D 32/96 run mma";
  m.uses_atomics = false;
  m.fwd = &run;
  m.fwd_workspace = &workspace_bytes;
  m.merges_output = &has_own_variant;
  return m;
}

}  // namespace hopper_fwd
}  // namespace flashattn

FLASHATTN_REGISTER_KERNEL_MODE(hopper_forward, flashattn::hopper_fwd::make_entry)
