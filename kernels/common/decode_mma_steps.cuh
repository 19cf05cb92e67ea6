// The pieces of the mma decode kernel (kernels/decode_mma.cu): the traits per head dim (regular
// and deep pipelines), the kernel arguments, the K/V block loader (contiguous or paged), the
// kernel's steps (O = 0, the first K/V loads, Q into registers, the per-block prefetch, the packed
// Q tile, scale and mask of S, O += P V_w, the first and last parts of the warp merge), and the
// in-kernel split merge done by a group's last CTA. Included by decode_mma.cu alone.
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "common/decode.cuh"
#include "common/dtype.cuh"
#include "common/math_constants.h"
#include "common/mma_sm80.cuh"
#include "common/swizzled_smem.cuh"
#include "flashattn/params.h"

namespace flashattn {
namespace mma_dec {

constexpr int kSmemAlign = 128;  // spare bytes so the tiles start 128-byte aligned (swizzle XOR form)
constexpr int kMaxSplits = 256;

template <int kHeadDim_, int kStages_, int kMinBlocksPerSm_>
struct Traits {
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBlockN = 64;  // keys per pipeline stage: 16 per warp, one k16 step of P.V
  static constexpr int kNWarps = 4;
  static constexpr int kThreads = kNWarps * 32;
  static constexpr int kRows = 16;  // one m16 tile of (query head, new token) rows
  static constexpr int kWarpKeys = kBlockN / kNWarps;
  static constexpr int kStages = kStages_;
  static constexpr int kMinBlocksPerSm = kMinBlocksPerSm_;
  // Q as A fragments for the whole loop (kKSteps x 4 registers) up to D = 128; at D = 256, O alone
  // takes 128 registers, so Q is re-read from shared memory (4 KB per warp and block, against the
  // 64 KB of K/V the block brings).
  static constexpr bool kQInRegs = kHeadDim <= 128;
  static constexpr int kDTiles = kHeadDim / 8;
  static constexpr int kKSteps = kHeadDim / 16;

  using TileQ = mma::SwizzledTile<kRows, kHeadDim>;
  using TileKV = mma::SwizzledTile<kBlockN, kHeadDim>;
  static constexpr int kStageBytes = 2 * TileKV::kBytes;  // K then V
  static constexpr int kSmemBytes = TileQ::kBytes + kStages * kStageBytes;
  // Epilogue scratch in the K/V stages: each warp's O (fp32 rows padded by 4 floats so the float2
  // stores of a quad's rows spread over the banks), then m, l, the merge weights and the lse.
  static constexpr int kLdO = kHeadDim + 4;
  static constexpr int kCombineBytes = (kNWarps * kRows * (kLdO + 3) + kRows) * 4;

  static_assert(kWarpKeys == 16, "a warp's keys are exactly one k16 step of P.V");
  static_assert(kStages >= 2, "the pipeline needs a stage to load while one is computed");
  static_assert(kCombineBytes <= kStages * kStageBytes, "the warp merge reuses the K/V stages");
  static_assert((kSmemBytes + kSmemAlign + 1024) * kMinBlocksPerSm <= 228 * 1024, "CTAs per SM must fit");
};

// Per head dim: stages and CTAs per SM, so that each SM keeps ~64-128 KB of K/V in flight (about
// what an SM's share of HBM3 bandwidth times the loaded latency needs) within 227 KB of smem.
template <int kHeadDim> struct TraitsFor;
template <> struct TraitsFor<32> { using type = Traits<32, 4, 4>; };    // 4 x 8 KB stages, 33 KB
template <> struct TraitsFor<64> { using type = Traits<64, 4, 3>; };    // 4 x 16 KB, 66 KB
template <> struct TraitsFor<96> { using type = Traits<96, 3, 2>; };    // 3 x 24 KB, 75 KB
template <> struct TraitsFor<128> { using type = Traits<128, 3, 2>; };  // 3 x 32 KB, 100 KB
template <> struct TraitsFor<256> { using type = Traits<256, 3, 1>; };  // 3 x 64 KB, 200 KB
// One CTA per SM, ~192 KB of stages, when the grid is a single wave. Not at D = 128: on the H100,
// B1 S32768 (one wave of 128 pieces) took 58.3 / 59.1 / 58.9 / 59.1 us with 3 / 4 / 5 / 6 stages
// (cold L2), and B16 S8192 ran 1 % faster with 3 than with 6: with five blocks in flight the SMs
// nearest the memory finish their pieces ~10 us early and idle, with two every SM streams at
// about the same rate and the whole GPU still reads at the copy rate (docs/PERF.md).
template <int kHeadDim> struct DeepTraitsFor;
template <> struct DeepTraitsFor<32> { using type = Traits<32, 16, 1>; };   // 16 x 8 KB
template <> struct DeepTraitsFor<64> { using type = Traits<64, 12, 1>; };   // 12 x 16 KB
template <> struct DeepTraitsFor<96> { using type = Traits<96, 8, 1>; };    // 8 x 24 KB
template <> struct DeepTraitsFor<128> { using type = TraitsFor<128>::type; };  // the regular one
template <> struct DeepTraitsFor<256> { using type = Traits<256, 3, 1>; };  // the regular one

template <class T>
struct Args {
  const T* q = nullptr;
  Strides q_st;
  const T* k = nullptr;
  const T* v = nullptr;
  Strides k_st, v_st;  // batch stride = page stride when paged
  const int32_t* cache_seqlens = nullptr;
  int uniform_len = -1;  // >= 0: every cache_seqlens[b] (DecodeParams::uniform_seqlen)
  const int32_t* block_table = nullptr;
  int table_stride = 0, log2_page = 0;
  T* o = nullptr;
  Strides o_st;
  float* lse = nullptr;
  decode::SplitWorkspace ws;
  int H = 0, H_kv = 0, group = 1, S_new = 0, S_max = 0, splits = 1;
  int64_t rows_total = 0;  // B * H * S_new
  float scale_log2 = 0.f;
  bool evict_first = false;  // K/V loads under L2 evict-first (see choose_l2_policy)
};

// cp.async copies of one 64-key block of K and V. Consecutive threads take consecutive 16-byte
// chunks of a row panel (whole 128-byte lines); each thread keeps one chunk column and steps down
// the rows, so its swizzled shared offset is a constant plus an immediate. Rows past L are
// zero-filled without a global read. Paged: each row's page comes from the block table.
template <class Tr, class T, bool kPaged>
struct KVLoader {
  using TileKV = typename Tr::TileKV;
  static constexpr int P = TileKV::kPanelChunks;
  static constexpr int kRowStep = Tr::kThreads / P;
  static constexpr int kIters = Tr::kBlockN / kRowStep;
  static constexpr int kPanels = TileKV::kChunks / P;
  static_assert(Tr::kThreads % P == 0 && kRowStep % 8 == 0 && Tr::kBlockN % kRowStep == 0, "loader mapping");

  const T* k;  // contiguous: row 0 of (b, g) + this thread's column; paged: pool + g*head + column
  const T* v;
  int64_t k_row, v_row, k_page, v_page;
  const int32_t* table;  // this batch element's block-table row (paged)
  int log2_page;
  int r0;          // this thread's first row within a block
  uint32_t s_off;  // this thread's first chunk within a tile
  uint64_t policy;  // L2 eviction policy of the K/V loads

  __device__ __forceinline__ KVLoader(const Args<T>& a, int b, int g, int tid) {
    const int col = (tid % P) * 8;
    r0 = tid / P;
    s_off = TileKV::offset(r0, tid % P);
    k_row = a.k_st.row, v_row = a.v_st.row;
    k_page = a.k_st.batch, v_page = a.v_st.batch;
    log2_page = a.log2_page;
    table = kPaged ? a.block_table + static_cast<int64_t>(b) * a.table_stride : nullptr;
    const int64_t k_base = (kPaged ? 0 : b * a.k_st.batch) + g * a.k_st.head + col;
    const int64_t v_base = (kPaged ? 0 : b * a.v_st.batch) + g * a.v_st.head + col;
    k = a.k + k_base;
    v = a.v + v_base;
    policy = a.evict_first ? mma::l2_evict_first_policy() : mma::l2_evict_unchanged_policy();
  }

  // Starts copying keys [n0, n0 + kBlockN) into the stage at sK (K) and sV (V).
  __device__ __forceinline__ void load(uint32_t sK, uint32_t sV, int n0, int L) const {
#pragma unroll
    for (int it = 0; it < kIters; ++it) {
      const int j = n0 + r0 + it * kRowStep;
      const bool valid = j < L;
      const T* kr = k;  // a mapped address for the zero-fill of rows past L
      const T* vr = v;
      if (valid) {
        if constexpr (kPaged) {
          const int64_t page = __ldg(table + (j >> log2_page));
          const int64_t jj = j & ((1 << log2_page) - 1);
          kr = k + page * k_page + jj * k_row;
          vr = v + page * v_page + jj * v_row;
        } else {
          kr = k + j * k_row;
          vr = v + j * v_row;
        }
      }
#pragma unroll
      for (int panel = 0; panel < kPanels; ++panel) {
        const uint32_t off = s_off + TileKV::block(it * kRowStep, panel * P);
        mma::cp_async_16_u32_hint(sK + off, valid ? kr + panel * P * 8 : k, valid, policy);
        mma::cp_async_16_u32_hint(sV + off, valid ? vr + panel * P * 8 : v, valid, policy);
      }
    }
  }
};

// O = 0 (this warp's partial O over its keys).
template <int kDTiles>
__device__ __forceinline__ void zero_o(float (&rO)[1][kDTiles][4]) {
#pragma unroll
  for (int di = 0; di < kDTiles; ++di)
#pragma unroll
    for (int e = 0; e < 4; ++e) rO[0][di][e] = 0.f;
}

// Load K/V blocks 0 .. kStages-2 of the piece (one commit group each, empty past count).
template <class Tr, class Loader>
__device__ __forceinline__ void load_first_stages(const Loader& loader, uint32_t sKV, int block_begin, int count,
                                                  int L) {
  using TileKV = typename Tr::TileKV;
#pragma unroll
  for (int s = 0; s < Tr::kStages - 1; ++s) {
    if (s < count) loader.load(sKV + s * Tr::kStageBytes, sKV + s * Tr::kStageBytes + TileKV::kBytes,
                               (block_begin + s) * Tr::kBlockN, L);
    mma::cp_async_commit();
  }
}

// Q as the A fragments of the kKSteps k16 steps, held in registers for the whole loop.
template <class Tr>
__device__ __forceinline__ void load_q_regs(uint32_t (&rQ)[Tr::kKSteps][4], uint32_t q_lane) {
  using TileQ = typename Tr::TileQ;
  mma::cp_async_wait<Tr::kStages - 1>();  // the Q group (the first) has landed
  __syncthreads();
#pragma unroll
  for (int kk = 0; kk < Tr::kKSteps; ++kk) mma::ldsm_x4(rQ[kk], TileQ::at(q_lane, 0, 2 * kk));
}

// Load K/V block pf of the piece into its stage (pf % kStages), if there is one; one commit group
// either way, so the wait counts stay fixed.
template <class Tr, class Loader>
__device__ __forceinline__ void prefetch_block(const Loader& loader, uint32_t sKV, int block_begin, int pf, int count,
                                               int L) {
  using TileKV = typename Tr::TileKV;
  if (pf < count) {
    const int pf_stage = pf % Tr::kStages;
    loader.load(sKV + pf_stage * Tr::kStageBytes, sKV + pf_stage * Tr::kStageBytes + TileKV::kBytes,
                (block_begin + pf) * Tr::kBlockN, L);
  }
  mma::cp_async_commit();
}

// Q tile: packed row R = r0 + r is query head g*G + R / S_new, new token R % S_new; rows past
// the group are zero-filled (they compute harmless scores that are never stored).
template <class Tr, class T>
__device__ __forceinline__ void load_q_tile(const Args<T>& a, uint32_t sQ, int b, int g, int r0, int m_rows,
                                            int tid) {
  using TileQ = typename Tr::TileQ;
  for (int c = tid; c < Tr::kRows * TileQ::kChunks; c += Tr::kThreads) {
    const int r = c / TileQ::kChunks, ch = c % TileQ::kChunks, R = r0 + r;
    const bool valid = r < m_rows;
    const T* src = valid ? a.q + b * a.q_st.batch + (g * a.group + R / a.S_new) * a.q_st.head +
                               (R % a.S_new) * a.q_st.row + ch * 8
                         : a.q;
    mma::cp_async_16_u32(sQ + TileQ::offset(r, ch), src, valid);
  }
}

// Scores in log2 units (the softmax then runs with c = 1 whatever the sign of the scale).
__device__ __forceinline__ void scale_scores(float (&rS)[1][2][4], float scale_log2) {
#pragma unroll
  for (int ni = 0; ni < 2; ++ni)
#pragma unroll
    for (int e = 0; e < 4; ++e) rS[0][ni][e] *= scale_log2;
}

// Causal at the bottom right: key j visible to packed row R (new token i = R % S_new) iff
// j <= cache_len + i (this also drops the zero-filled rows past L). Lane (g8, t) holds rows g8,
// g8+8 and keys 2t, 2t+1 of each n8 tile; j0 is the warp's first key (block start + w0).
__device__ __forceinline__ void mask_new_tokens(float (&rS)[1][2][4], int cache_len, int S_new, int r0, int j0,
                                                int lane) {
#pragma unroll
  for (int rr = 0; rr < 2; ++rr) {
    const int R = r0 + lane / 4 + 8 * rr;
    const int limit = cache_len + R % S_new + 1;
#pragma unroll
    for (int ni = 0; ni < 2; ++ni)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int j = j0 + ni * 8 + 2 * (lane % 4) + e;
        if (j >= limit) rS[0][ni][2 * rr + e] = -INFINITY;
      }
  }
}

// O += P V_w: P's accumulator pairs are the A fragment of one k16 step (v_lane: the V tile plus
// this lane's ldmatrix part; w0: the warp's first key).
template <class Tr, class T>
__device__ __forceinline__ void gemm_pv_warp(float (&rO)[1][Tr::kDTiles][4], const uint32_t (&rP)[1][2][2],
                                             uint32_t v_lane, int w0) {
  using TileKV = typename Tr::TileKV;
  const uint32_t pa[4] = {rP[0][0][0], rP[0][0][1], rP[0][1][0], rP[0][1][1]};
#pragma unroll
  for (int dp = 0; dp < Tr::kDTiles / 2; ++dp) {
    uint32_t vb[4];
    mma::ldsm_x4_trans(vb, TileKV::at(v_lane, w0, 2 * dp));
    const uint32_t b_lo[2] = {vb[0], vb[1]}, b_hi[2] = {vb[2], vb[3]};
    mma::mma_16816<T>(rO[0][2 * dp], pa, b_lo, rO[0][2 * dp]);
    mma::mma_16816<T>(rO[0][2 * dp + 1], pa, b_hi, rO[0][2 * dp + 1]);
  }
}

// Warp merge, first part: each warp's O_w (kRows, kHeadDim), m_w and l_w (its lanes' shares
// summed) to shared memory.
template <class Tr>
__device__ __forceinline__ void stage_warp_state(float* fO, float* fM, float* fL, const float (&rO)[1][Tr::kDTiles][4],
                                                 const float (&m_i)[1][2], const float (&l_i)[1][2], int warp,
                                                 int lane) {
#pragma unroll
  for (int rr = 0; rr < 2; ++rr) {
    float l = l_i[0][rr];  // this lane's share of the row sum
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    const int row = warp * Tr::kRows + lane / 4 + 8 * rr;
#pragma unroll
    for (int di = 0; di < Tr::kDTiles; ++di)
      *reinterpret_cast<float2*>(fO + row * Tr::kLdO + di * 8 + 2 * (lane % 4)) =
          make_float2(rO[0][di][2 * rr], rO[0][di][2 * rr + 1]);
    if (lane % 4 == 0) {
      fM[row] = m_i[0][rr];
      fL[row] = l;
    }
  }
}

// Warp merge, last part (after the weights): O = sum_w weight_w O_w, one float4 per thread and
// step, to the output (one split) or to the split's workspace piece, with lse.
template <class Tr, class T>
__device__ __forceinline__ void write_merged(const Args<T>& a, const float* fO, const float* fW, const float* fLse,
                                             int b, int g, int split, int r0, int m_rows, int tid) {
  constexpr int kVec = Tr::kHeadDim / 4;  // float4 columns per row
  for (int idx = tid; idx < m_rows * kVec; idx += Tr::kThreads) {
    const int r = idx / kVec, c4 = idx % kVec;
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
    for (int w = 0; w < Tr::kNWarps; ++w) {
      const float wt = fW[w * Tr::kRows + r];
      const float4 o = *reinterpret_cast<const float4*>(fO + (w * Tr::kRows + r) * Tr::kLdO + 4 * c4);
      acc.x = fmaf(wt, o.x, acc.x);
      acc.y = fmaf(wt, o.y, acc.y);
      acc.z = fmaf(wt, o.z, acc.z);
      acc.w = fmaf(wt, o.w, acc.w);
    }
    const int R = r0 + r, hq = g * a.group + R / a.S_new, i = R % a.S_new;
    const int64_t row = (static_cast<int64_t>(b) * a.H + hq) * a.S_new + i;
    if (a.splits == 1) {
      T* dst = a.o + b * a.o_st.batch + hq * a.o_st.head + i * a.o_st.row + 4 * c4;
      dst[0] = from_float<T>(acc.x);
      dst[1] = from_float<T>(acc.y);
      dst[2] = from_float<T>(acc.z);
      dst[3] = from_float<T>(acc.w);
      if (c4 == 0) a.lse[row] = fLse[r];
    } else {
      reinterpret_cast<float4*>(a.ws.o + (split * a.rows_total + row) * Tr::kHeadDim)[c4] = acc;
      if (c4 == 0) a.ws.lse[split * a.rows_total + row] = fLse[r];
    }
  }
}

// Flash-decoding's combine, done by the last CTA of a (batch, kv head, row tile) group to finish
// instead of by a second kernel (a decode step is a few microseconds; a launch and its drain are
// a good part of that on short caches):
//   lse = log sum_s exp(lse_s);  O = sum_s exp(lse_s - lse) O_s    (s in order: deterministic)
// Every CTA publishes its piece (release) as it counts itself in; the CTA that sees splits - 1
// earlier arrivals (acquire) reads all pieces through L2 (__ldcg: never a stale L1 line) and
// resets the counter for the next call. The merge runs after the group's last piece, on the
// critical path of the step, and is bound by L2 latency, so it is one round trip per kChunk
// pieces: each thread owns a float4 column of a row and issues the loads of kChunk pieces' lse
// (the same address across a row's lanes, so one request per warp) and O together, then folds
// them into a running max / sum / weighted O (the rescaling of FlashAttention's online softmax).
template <class Tr, class T>
__device__ __forceinline__ void merge_splits(const Args<T>& a, int b, int g, int r0, int m_rows) {
  constexpr int D = Tr::kHeadDim;
  constexpr int kVec = D / 4;  // float4 columns per row
  constexpr int kChunk = 16;
  __shared__ int s_last;
  const int tid = threadIdx.x;
  int* counter = a.ws.counters + static_cast<int64_t>(blockIdx.x) * gridDim.z + blockIdx.z;
  // Release/acquire through one thread: the barrier orders every thread's piece stores before
  // thread 0's acq_rel atomic (release, cumulative over what the barrier made it observe), and the
  // last arrival's acquire reaches the other threads through the second barrier. One L2 round trip
  // for the arrival instead of a full fence in every thread plus the atomic.
  __syncthreads();
  if (tid == 0) {
    int old;
    asm volatile("atom.acq_rel.gpu.global.add.s32 %0, [%1], 1;" : "=r"(old) : "l"(counter) : "memory");
    s_last = old == a.splits - 1;
  }
  __syncthreads();
  if (!s_last) return;
  const int64_t lse_step = a.rows_total;         // floats between two pieces of a row's lse
  const int64_t o_step = a.rows_total * kVec;    // float4s between two pieces of a row's O
  for (int idx = tid; idx < m_rows * kVec; idx += Tr::kThreads) {
    const int r = idx / kVec, c4 = idx % kVec;
    const int R = r0 + r, hq = g * a.group + R / a.S_new, i = R % a.S_new;
    const int64_t row = (static_cast<int64_t>(b) * a.H + hq) * a.S_new + i;
    const float* lse_src = a.ws.lse + row;
    const float4* o_src = reinterpret_cast<const float4*>(a.ws.o + row * D) + c4;
    float m = -INFINITY, sum = 0.f;
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
    for (int s0 = 0; s0 < a.splits; s0 += kChunk) {
      float l[kChunk];
      float4 v[kChunk];
#pragma unroll
      for (int u = 0; u < kChunk; ++u) {
        const bool in = s0 + u < a.splits;
        l[u] = in ? __ldcg(lse_src + (s0 + u) * lse_step) : -INFINITY;
        v[u] = in ? __ldcg(o_src + (s0 + u) * o_step) : make_float4(0.f, 0.f, 0.f, 0.f);
      }
      float m_new = m;
#pragma unroll
      for (int u = 0; u < kChunk; ++u) m_new = fmaxf(m_new, l[u]);
      if (m_new == -INFINITY) continue;  // only empty pieces so far (O_s = 0, lse_s = -inf)
      const float f = __expf(m - m_new);  // 0 while m = -inf
      sum *= f;
      acc.x *= f, acc.y *= f, acc.z *= f, acc.w *= f;
#pragma unroll
      for (int u = 0; u < kChunk; ++u) {
        const float e = __expf(l[u] - m_new);  // 0 for an empty piece (ex2.approx: ~2 ulp)
        sum += e;
        acc.x = fmaf(e, v[u].x, acc.x);
        acc.y = fmaf(e, v[u].y, acc.y);
        acc.z = fmaf(e, v[u].z, acc.z);
        acc.w = fmaf(e, v[u].w, acc.w);
      }
      m = m_new;
    }
    const float inv = sum > 0.f ? 1.f / sum : 0.f;
    T* dst = a.o + b * a.o_st.batch + hq * a.o_st.head + i * a.o_st.row + 4 * c4;
    dst[0] = from_float<T>(acc.x * inv);
    dst[1] = from_float<T>(acc.y * inv);
    dst[2] = from_float<T>(acc.z * inv);
    dst[3] = from_float<T>(acc.w * inv);
    if (c4 == 0) a.lse[row] = sum > 0.f ? m + logf(sum) : -INFINITY;
  }
  if (tid == 0) *counter = 0;  // ready for the next call (the driver zero-filled it once)
}

}  // namespace mma_dec
}  // namespace flashattn
