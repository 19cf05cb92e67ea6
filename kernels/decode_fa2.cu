// fa2, decode — rung 5 of the ladder in decode mode: flash-decoding on CUDA cores in fp32. A step
// has few query rows (G = H / H_kv heads x S_new tokens per kv head) and a long cache, so the
// forward's parallelism over query blocks is gone; instead the keys are cut into split-K pieces,
// each CTA streams one piece of one (batch, kv head) once for all the group's rows, and a combine
// kernel merges the pieces by their lse (Dao et al., Flash-Decoding, 2023).
//
// One CTA per (batch x kv head, split, tile of kRows rows); 4 warps, each a contiguous quarter of
// the piece's keys. A lane holds D/32 consecutive elements of a key row (float4 loads at D = 128:
// a warp reads the 512-byte row in one coalesced request) and of every row's q and O:
//   for each key j (kUnroll rows of K and V loaded ahead):
//     s_r = warp_sum(q_r . k_j)                     q pre-scaled by scale * log2(e): log2 units
//     s_r = -inf where j > cache_seqlens[b] + i_r   causal, bottom-right in the element's length
//     m_new = max(m_r, s_r); l_r = 2^(m_r - m_new) l_r + 2^(s_r - m_new)
//     O_r = 2^(m_r - m_new) O_r + 2^(s_r - m_new) v_j
// The xor-butterfly sum leaves the same bits in every lane, so m, l and the branches are uniform.
// The four warps' (m, l, O) merge through shared memory; a single split writes O and lse, several
// write fp32 partials that decode_combine.cu merges. Paged caches look each row up in the block
// table. Limits: fp32; head dims 32, 64, 96, 128, 256; sm_80+; 16-byte aligned q/caches for D with
// float4 rows. Instantiations: 5 (head dim). Measured: see README.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <string>

#include "common/decode.cuh"
#include "common/head_dims.h"
#include "common/layout_checks.h"
#include "flashattn/check.h"
#include "flashattn/error.h"
#include "flashattn/registry.h"

namespace flashattn {
namespace fa2_dec {

template <int kHeadDim_>
struct Traits {
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kNWarps = 4;
  static constexpr int kThreads = 32 * kNWarps;
  // Rows per CTA: q and O take 2 * kRows * kPer registers per lane (128 at D = 256); a group with
  // more rows (G * S_new > 8) takes more CTAs, which re-read the piece (from L2, mostly).
  static constexpr int kRows = 8;
  static constexpr int kPer = kHeadDim / 32;  // elements of a row per lane
  // Keys whose K and V rows are in flight per warp: 4 x 2 x 512 bytes at D = 128; 2 at D = 256,
  // where q and O already hold 128 registers per lane.
  static constexpr int kUnroll = kPer <= 4 ? 4 : 2;
  static constexpr int kCtasPerSm = 3;  // for the split heuristic (128 threads, 146 registers at D = 128)
  static_assert(kHeadDim % 32 == 0, "a lane owns D / 32 elements");
};

struct Args {
  const float* q = nullptr;
  const float* k = nullptr;
  const float* v = nullptr;
  Strides q_st, o_st;
  decode::CacheAddr k_addr, v_addr;
  const int32_t* cache_seqlens = nullptr;
  float* o = nullptr;
  float* lse = nullptr;
  decode::SplitWorkspace ws;
  int H = 0, H_kv = 0, group = 1, S_new = 0, S_max = 0, splits = 1;
  int64_t rows_total = 0;  // B * H * S_new
  float scale_log2 = 0.f;
};

template <int kPer>
__device__ __forceinline__ void load_row(const float* p, float (&x)[kPer]) {
  if constexpr (kPer % 4 == 0) {
#pragma unroll
    for (int c = 0; c < kPer / 4; ++c) {
      const float4 f = __ldg(reinterpret_cast<const float4*>(p) + c);
      x[4 * c] = f.x, x[4 * c + 1] = f.y, x[4 * c + 2] = f.z, x[4 * c + 3] = f.w;
    }
  } else if constexpr (kPer == 2) {
    const float2 f = __ldg(reinterpret_cast<const float2*>(p));
    x[0] = f.x, x[1] = f.y;
  } else {
#pragma unroll
    for (int c = 0; c < kPer; ++c) x[c] = __ldg(p + c);
  }
}

__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
  for (int off = 16; off > 0; off /= 2) x += __shfl_xor_sync(0xffffffffu, x, off);
  return x;
}

template <class Tr>
__global__ void __launch_bounds__(Tr::kThreads) decode_kernel(const Args a) {
  constexpr int kRows = Tr::kRows, kPer = Tr::kPer, D = Tr::kHeadDim;
  __shared__ float sO[Tr::kNWarps][kRows][D];  // each warp's unnormalised O
  __shared__ float sM[Tr::kNWarps][kRows], sL[Tr::kNWarps][kRows];

  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int b = blockIdx.x / a.H_kv, g = blockIdx.x % a.H_kv, split = blockIdx.y;
  const int r0 = blockIdx.z * kRows;
  const int rows = a.group * a.S_new;
  const int n_rows = min(kRows, rows - r0);
  const int cache_len = a.cache_seqlens[b];
  const int L = min(cache_len + a.S_new, a.S_max);
  const decode::Range piece = decode::split_range(L, a.splits, split);
  const decode::Range mine =
      decode::split_range(piece.end - piece.begin, Tr::kNWarps, warp);  // this warp's keys, piece-relative

  // q_r (pre-scaled to log2 units) and the last key each row sees; rows past n_rows stay zero.
  float rq[kRows][kPer], rO[kRows][kPer], m_i[kRows], l_i[kRows];
  int limit[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    m_i[r] = -INFINITY;
    l_i[r] = 0.f;
    limit[r] = 0;
#pragma unroll
    for (int c = 0; c < kPer; ++c) rq[r][c] = rO[r][c] = 0.f;
    if (r < n_rows) {
      const int R = r0 + r, hq = g * a.group + R / a.S_new, i = R % a.S_new;
      load_row<kPer>(a.q + b * a.q_st.batch + hq * a.q_st.head + i * a.q_st.row + lane * kPer, rq[r]);
#pragma unroll
      for (int c = 0; c < kPer; ++c) rq[r][c] *= a.scale_log2;
      limit[r] = cache_len + i + 1;
    }
  }

  const int k_end = piece.begin + mine.end;
  for (int j0 = piece.begin + mine.begin; j0 < k_end; j0 += Tr::kUnroll) {
    float rk[Tr::kUnroll][kPer], rv[Tr::kUnroll][kPer];
#pragma unroll
    for (int u = 0; u < Tr::kUnroll; ++u) {
      if (j0 + u < k_end) {
        load_row<kPer>(a.k + a.k_addr.offset(b, g, j0 + u) + lane * kPer, rk[u]);
        load_row<kPer>(a.v + a.v_addr.offset(b, g, j0 + u) + lane * kPer, rv[u]);
      }
    }
#pragma unroll
    for (int u = 0; u < Tr::kUnroll; ++u) {
      const int j = j0 + u;
      if (j >= k_end) break;
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        if (r >= n_rows || j >= limit[r]) continue;  // warp-uniform
        float part = 0.f;
#pragma unroll
        for (int c = 0; c < kPer; ++c) part = fmaf(rq[r][c], rk[u][c], part);
        const float s = warp_sum(part);  // s_rj, log2 units
        if (s > m_i[r]) {
          const float alpha = exp2f(m_i[r] - s);  // m_i = -inf: 0
          l_i[r] *= alpha;
#pragma unroll
          for (int c = 0; c < kPer; ++c) rO[r][c] *= alpha;
          m_i[r] = s;
        }
        const float p = exp2f(s - m_i[r]);
        l_i[r] += p;
#pragma unroll
        for (int c = 0; c < kPer; ++c) rO[r][c] = fmaf(p, rv[u][c], rO[r][c]);
      }
    }
  }

  // Merge the warps: m = max_w m_w, O = sum_w 2^(m_w - m) O_w, l likewise.
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
#pragma unroll
    for (int c = 0; c < kPer; ++c) sO[warp][r][lane * kPer + c] = rO[r][c];
    if (lane == 0) {
      sM[warp][r] = m_i[r];
      sL[warp][r] = l_i[r];
    }
  }
  __syncthreads();
  const int64_t rows_total = a.rows_total;
  for (int idx = threadIdx.x; idx < n_rows * D; idx += Tr::kThreads) {
    const int r = idx / D, col = idx % D;
    float m = -INFINITY;
#pragma unroll
    for (int w = 0; w < Tr::kNWarps; ++w) m = fmaxf(m, sM[w][r]);
    float l = 0.f, o = 0.f;
    if (m != -INFINITY) {
#pragma unroll
      for (int w = 0; w < Tr::kNWarps; ++w) {
        const float f = sM[w][r] == -INFINITY ? 0.f : exp2f(sM[w][r] - m);
        l = fmaf(f, sL[w][r], l);
        o = fmaf(f, sO[w][r][col], o);
      }
    }
    const bool empty = !(l > 0.f);
    const float out = empty ? 0.f : o / l;
    const float lse = empty ? -INFINITY : (m + log2f(l)) * 0.693147180559945309f;
    const int R = r0 + r, hq = g * a.group + R / a.S_new, i = R % a.S_new;
    const int64_t row = (static_cast<int64_t>(b) * a.H + hq) * a.S_new + i;
    if (a.splits == 1) {
      a.o[b * a.o_st.batch + hq * a.o_st.head + i * a.o_st.row + col] = out;
      if (col == 0) a.lse[row] = lse;
    } else {
      a.ws.o[(split * rows_total + row) * D + col] = out;
      if (col == 0) a.ws.lse[split * rows_total + row] = lse;
    }
  }
}

int num_splits(const DecodeParams& p) {
  if (p.num_splits > 0) return p.num_splits;
  const int row_tiles = (p.H / p.H_kv * p.S_new + Traits<32>::kRows - 1) / Traits<32>::kRows;
  // Units of 64 keys; at least 4 units (256 keys) per piece.
  const int units = (p.max_seqlen + 63) / 64;
  return decode::choose_splits(static_cast<int64_t>(p.B) * p.H_kv * row_tiles, units, p.num_sms,
                               Traits<32>::kCtasPerSm, /*min_units=*/4, /*max_splits=*/128);
}

size_t workspace_bytes(const DecodeParams& p) { return decode::split_workspace_bytes(p, num_splits(p)); }

template <int kHeadDim>
void launch(const DecodeParams& p, const LaunchContext& ctx) {
  using Tr = Traits<kHeadDim>;
  Args a;
  a.q = static_cast<const float*>(p.q);
  a.k = static_cast<const float*>(p.k_cache);
  a.v = static_cast<const float*>(p.v_cache);
  a.q_st = p.q_st, a.o_st = p.o_st;
  a.k_addr = decode::cache_addr(p, p.k_cache_st);
  a.v_addr = decode::cache_addr(p, p.v_cache_st);
  a.cache_seqlens = p.cache_seqlens;
  a.o = static_cast<float*>(p.o);
  a.lse = static_cast<float*>(p.lse);
  a.H = p.H, a.H_kv = p.H_kv, a.group = p.H / p.H_kv, a.S_new = p.S_new, a.S_max = p.S_max;
  a.splits = num_splits(p);
  a.rows_total = static_cast<int64_t>(p.B) * p.H * p.S_new;
  a.scale_log2 = p.scale_log2;
  if (a.splits > 1) {
    if (p.workspace == nullptr || p.workspace_bytes < decode::split_workspace_bytes(p, a.splits))
      throw RuntimeError("fa2 decode: workspace smaller than its workspace function asked for");
    a.ws = decode::split_workspace(p, a.splits);
  }
  const int row_tiles = (a.group * p.S_new + Tr::kRows - 1) / Tr::kRows;
  const dim3 grid(static_cast<unsigned>(p.B * p.H_kv), static_cast<unsigned>(a.splits), static_cast<unsigned>(row_tiles));
  decode_kernel<Tr><<<grid, Tr::kThreads, 0, ctx.stream>>>(a);
  CHECK_LAUNCH("fa2 decode_kernel");
  decode::launch_combine(p, a.splits, ctx.stream);
}

bool aligned(const void* ptr, int bytes) { return reinterpret_cast<uintptr_t>(ptr) % bytes == 0; }

// Head dims with a variant; the build compiles those FLASHATTN_HDIMS enables (common/head_dims.h).
using KernelHeadDims = HeadDims<32, 64, 96, 128, 256>;

void run(const DecodeParams& p, const LaunchContext& ctx) {
  if (static_cast<int64_t>(p.B) * p.H * p.S_new == 0) return;
  if (p.H_kv <= 0 || p.H % p.H_kv != 0) throw RuntimeError("fa2 decode: H must be a multiple of H_kv");
  if (static_cast<int64_t>(p.B) * p.H_kv > 0x7fffffff) throw RuntimeError("fa2 decode: B * H_kv too large");
  const int splits = num_splits(p);
  if (splits > 65535 || (p.H / p.H_kv * p.S_new + 7) / 8 > 65535)
    throw RuntimeError("fa2 decode: at most 65535 splits and row tiles (grid y/z)");
  // Vector loads of a lane's D/32 elements: 16 bytes when D/32 is a multiple of 4, 8 when it is 2.
  const int per = p.D / 32, vec = per % 4 == 0 ? 4 : (per == 2 ? 2 : 1);
  if (!aligned(p.q, 4 * vec) || !aligned(p.k_cache, 4 * vec) || !aligned(p.v_cache, 4 * vec) ||
      !strides_multiple_of(p.q_st, vec) || !strides_multiple_of(p.k_cache_st, vec) || !strides_multiple_of(p.v_cache_st, vec))
    throw RuntimeError("fa2 decode: q and the caches must be aligned for " + std::to_string(4 * vec) +
                       "-byte row loads, strides a multiple of " + std::to_string(vec) + " elements");
  KernelHeadDims::dispatch(p.D, "fa2 decode", [&](auto kD) { launch<decltype(kD)::value>(p, ctx); });
}

KernelMode make_entry() {
  KernelMode m;
  m.kernel = "fa2";
  m.mode = Mode::Decode;
  m.summary = "flash-decoding on CUDA cores: split-K over the cache, all heads of a kv group per CTA, lse combine";
  m.rung = 5;
  m.gpu = true;
  m.min_sm = 80;
  m.dtypes = dtype_bit(DType::F32);
  m.head_dims = KernelHeadDims::list();
  m.features = kFeatGQA | kFeatPadding | kFeatPaged;
  m.uses_atomics = false;
  m.dec = &run;
  m.dec_workspace = &workspace_bytes;
  m.dec_splits = &num_splits;
  return m;
}

}  // namespace fa2_dec
}  // namespace flashattn

FLASHATTN_REGISTER_KERNEL_MODE(fa2_decode, flashattn::fa2_dec::make_entry)
