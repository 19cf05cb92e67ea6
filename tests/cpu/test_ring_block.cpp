// A whole ring on the host: every rank's blocks built by ring_block.h from shard buffers laid out
// as the ring lays them out (src/ring.cpp), the forward's blocks run by the cpu kernel and merged
// by their lse, the backward's blocks by a block backward that takes the merged O and lse as the
// partial-output contract says (registry.h), dQ summed over the steps and dK/dV over the ranks.
// The result must be the whole problem's, computed in one piece: this checks the plan, the block
// parameters (offsets, strides, key lengths, the lse rows of a second chunk) and the algebra
// that the GPU ring runs, without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "flashattn/device_fill.h"
#include "flashattn/registry.h"
#include "problem.h"
#include "ring_block.h"
#include "ring_plan.h"

namespace flashattn {
namespace {

using Vec = std::vector<float>;

Vec normal(int64_t n, uint64_t stream) {
  Vec v(n);
  fill_normal_host(v.data(), DType::F32, n, /*seed=*/3, stream);
  return v;
}

// Rows of a [B, heads, S, D] tensor that `sh` holds, as [B, heads, len, D] (and back).
Vec shard_of(const Vec& full, int B, int heads, int S, int D, const RingShard& sh) {
  Vec out(size_t(B) * heads * sh.len() * D);
  for (int bh = 0; bh < B * heads; ++bh)
    for (int i = 0; i < sh.len(); ++i)
      std::copy_n(&full[(size_t(bh) * S + sh.global(i)) * D], D, &out[(size_t(bh) * sh.len() + i) * D]);
  return out;
}
void unshard(const Vec& part, int B, int heads, int S, int D, const RingShard& sh, Vec* full) {
  for (int bh = 0; bh < B * heads; ++bh)
    for (int i = 0; i < sh.len(); ++i)
      std::copy_n(&part[(size_t(bh) * sh.len() + i) * D], D, &(*full)[(size_t(bh) * S + sh.global(i)) * D]);
}

float at(const void* base, const Strides& st, int b, int h, int i, int d) {
  return static_cast<const float*>(base)[b * st.batch + h * st.head + int64_t(i) * st.row + d];
}
float& at(void* base, const Strides& st, int b, int h, int i, int d) {
  return static_cast<float*>(base)[b * st.batch + h * st.head + int64_t(i) * st.row + d];
}

// The backward of one block against the given O and lse (fp32 in and out, double inside); with
// grads_f32, dQ is added into what dq holds.
void block_backward(const BwdParams& p) {
  const int group = p.H / p.H_kv;
  for (int b = 0; b < p.B; ++b)
    for (int g = 0; g < p.H_kv; ++g)
      for (int j = 0; j < p.S_k; ++j)
        for (int d = 0; d < p.D; ++d) at(p.dk, p.dk_st, b, g, j, d) = at(p.dv, p.dv_st, b, g, j, d) = 0.f;
  for (int b = 0; b < p.B; ++b) {
    const int L = p.seqlens_k ? p.seqlens_k[b] : p.S_k;
    for (int h = 0; h < p.H; ++h) {
      const int g = h / group;
      for (int i = 0; i < p.S_q; ++i) {
        const double lse = static_cast<const float*>(p.lse)[(int64_t(b) * p.H + h) * p.S_q + i];
        double Di = 0;
        for (int d = 0; d < p.D; ++d) Di += double(at(p.dout, p.do_st, b, h, i, d)) * at(p.o, p.o_st, b, h, i, d);
        std::vector<double> dq(p.D, 0.0);
        for (int j = 0; j < p.S_k; ++j) {
          if (j >= L || (p.window_right >= 0 && j > i + (p.S_k - p.S_q) + p.window_right) || std::isinf(lse)) continue;
          double s = 0, dp = 0;
          for (int d = 0; d < p.D; ++d) {
            s += double(at(p.q, p.q_st, b, h, i, d)) * at(p.k, p.k_st, b, g, j, d);
            dp += double(at(p.dout, p.do_st, b, h, i, d)) * at(p.v, p.v_st, b, g, j, d);
          }
          const double P = std::exp(s * p.scale_f64 - lse), dS = P * (dp - Di);
          for (int d = 0; d < p.D; ++d) {
            at(p.dv, p.dv_st, b, g, j, d) += float(P * at(p.dout, p.do_st, b, h, i, d));
            at(p.dk, p.dk_st, b, g, j, d) += float(p.scale_f64 * dS * at(p.q, p.q_st, b, h, i, d));
            dq[d] += p.scale_f64 * dS * at(p.k, p.k_st, b, g, j, d);
          }
        }
        for (int d = 0; d < p.D; ++d) {
          float& out = at(p.dq, p.dq_st, b, h, i, d);
          out = p.grads_f32 ? out + float(dq[d]) : float(dq[d]);  // fp32 gradients: dQ is added
        }
      }
    }
  }
}

struct Case {
  int B, H, H_kv, S, D, N;
  bool causal, padding;
};

class RingOnHost : public testing::TestWithParam<Case> {};

TEST_P(RingOnHost, EqualsTheWholeProblem) {
  const Case c = GetParam();
  Problem p;
  p.dims = {c.B, c.H, c.H_kv, c.S, c.S, c.D};
  p.dtype = DType::F32;
  p.scale = 1.0 / std::sqrt(double(c.D));
  p.causal = c.causal;
  p.has_padding = c.padding;
  const int B = c.B, H = c.H, Hk = c.H_kv, S = c.S, D = c.D, N = c.N;
  const Vec q = normal(int64_t(B) * H * S * D, 1), k = normal(int64_t(B) * Hk * S * D, 2),
            v = normal(int64_t(B) * Hk * S * D, 3), dout = normal(int64_t(B) * H * S * D, 4);
  std::vector<int32_t> lens(B, S);
  if (c.padding)
    for (int b = 0; b < B; ++b) lens[b] = b == 0 ? 0 : (b == 1 ? S / 3 + 1 : S);
  const KernelMode* cpu = Registry::find("cpu", Mode::Forward);
  ASSERT_NE(cpu, nullptr);
  const LaunchContext ctx;

  // The whole problem in one piece.
  FwdParams whole = forward_params(p);
  whole.seqlens_k = c.padding ? lens.data() : nullptr;
  whole.q = q.data(), whole.k = k.data(), whole.v = v.data();
  Vec o_ref(q.size()), lse_ref(size_t(B) * H * S);
  whole.o = o_ref.data(), whole.lse = lse_ref.data();
  cpu->fwd(whole, ctx);
  BwdParams whole_b;
  static_cast<FwdParams&>(whole_b) = whole;
  Vec dq_ref(q.size()), dk_ref(k.size()), dv_ref(v.size());
  whole_b.dout = dout.data(), whole_b.do_st = whole.q_st;
  whole_b.dq = dq_ref.data(), whole_b.dk = dk_ref.data(), whole_b.dv = dv_ref.data();
  whole_b.dq_st = whole.q_st, whole_b.dk_st = whole.k_st, whole_b.dv_st = whole.v_st;
  block_backward(whole_b);

  // The shards, as the ring holds them: Q, dO per rank; K then V per rank.
  std::vector<RingShard> sh(N);
  std::vector<Vec> qs(N), dos(N), kvs(N);
  for (int r = 0; r < N; ++r) {
    sh[r] = ring_shard(S, N, r);
    qs[r] = shard_of(q, B, H, S, D, sh[r]);
    dos[r] = shard_of(dout, B, H, S, D, sh[r]);
    kvs[r] = shard_of(k, B, Hk, S, D, sh[r]);
    const Vec vs = shard_of(v, B, Hk, S, D, sh[r]);
    kvs[r].insert(kvs[r].end(), vs.begin(), vs.end());
  }
  auto local_lens = [&](int r, int src) {
    const RingCall call = ring_call(S, N, r, src, c.causal);
    std::vector<int32_t> out(B);
    for (int b = 0; b < B; ++b) out[b] = ring_local_seqlen(sh[src], call.k_row0, call.k_rows, lens[b]);
    return out;
  };

  // Forward: each rank merges its blocks (own shard first, as the ring orders them).
  Vec o_ring(q.size()), lse_ring(size_t(B) * H * S);
  std::vector<Vec> o_sh(N), lse_sh(N);
  for (int r = 0; r < N; ++r) {
    const int len = sh[r].len();
    std::vector<double> acc(size_t(B) * H * len * D, 0.0), lse(size_t(B) * H * len, -INFINITY);
    for (int s = 0; s < N; ++s) {
      const int src = ((r - s) % N + N) % N;
      const RingCall call = ring_call(S, N, r, src, c.causal);
      if (call.skip) continue;
      Vec o_part(size_t(B) * H * call.q_rows * D), lse_part(size_t(B) * H * call.q_rows);
      const std::vector<int32_t> kl = local_lens(r, src);
      RingBlockBuffers buf;
      buf.q = qs[r].data(), buf.kv = kvs[src].data(), buf.o_part = o_part.data(), buf.lse_part = lse_part.data();
      buf.seqlens = c.padding ? kl.data() : nullptr;
      cpu->fwd(ring_block_fwd(p, len, sh[src].len(), call, buf), ctx);
      for (int bh = 0; bh < B * H; ++bh)
        for (int i = 0; i < call.q_rows; ++i) {
          const size_t row = size_t(bh) * len + call.q_row0 + i, prow = size_t(bh) * call.q_rows + i;
          const double a = lse[row], m = std::max(a, double(lse_part[prow]));
          if (m == -INFINITY) continue;
          const double wa = std::exp(a - m), wp = std::exp(lse_part[prow] - m);
          for (int d = 0; d < D; ++d) acc[row * D + d] = (wa * acc[row * D + d] + wp * o_part[prow * D + d]) / (wa + wp);
          lse[row] = m + std::log(wa + wp);
        }
    }
    o_sh[r].assign(acc.begin(), acc.end());
    lse_sh[r].assign(lse.begin(), lse.end());
    unshard(o_sh[r], B, H, S, D, sh[r], &o_ring);
    unshard(lse_sh[r], B, H, S, 1, sh[r], &lse_ring);
  }
  for (size_t i = 0; i < o_ref.size(); ++i) ASSERT_NEAR(o_ring[i], o_ref[i], 2e-5) << "O element " << i;
  for (size_t i = 0; i < lse_ref.size(); ++i) {
    if (std::isinf(lse_ref[i])) {
      EXPECT_TRUE(std::isinf(lse_ring[i]) && lse_ring[i] < 0) << "lse row " << i;
    } else {
      ASSERT_NEAR(lse_ring[i], lse_ref[i], 2e-5) << "lse row " << i;
    }
  }

  // Backward: blocks against the merged O and lse, dQ summed per rank, dK/dV per source shard
  // (sums: the order of the steps changes only their rounding), in the ring's order (steps
  // outer, own shard last). Three ways: with the partial-output contract (each block's gradients
  // added up here); with fp32 gradients (ring_block_grads_f32: dQ added by the block into the
  // rank's accumulator, step 0's dK/dV stored into the accumulator it starts, the others' into a
  // partial added here); and with fp32 gradients and the own block on its own stream (run first,
  // as it starts before the first shard arrives, its dQ and dK/dV into buffers of its own added
  // last).
  enum Way { kPartial, kF32, kF32Beside };
  for (const Way way : {kPartial, kF32, kF32Beside}) {
    SCOPED_TRACE(way == kPartial ? "partial gradients" : (way == kF32 ? "fp32 gradients" : "fp32 gradients, own block beside"));
    const bool f32 = way != kPartial, beside = way == kF32Beside;
    std::vector<Vec> dq_sh(N), dq_own(N), dkv_acc(N), dkv_own(N), lse_b(N);
    for (int r = 0; r < N; ++r) {
      dq_sh[r].assign(size_t(B) * H * sh[r].len() * D, 0.f);
      dq_own[r].assign(dq_sh[r].size(), 0.f);
      dkv_acc[r].assign(2 * size_t(B) * Hk * sh[r].len() * D, 0.f);
      dkv_own[r].assign(dkv_acc[r].size(), 0.f);
      // lse of the second chunk's rows, contiguous (what a block of those rows reads).
      lse_b[r].resize(size_t(B) * H * sh[r].len_b);
      for (int bh = 0; bh < B * H && sh[r].len_b > 0; ++bh)
        std::copy_n(&lse_sh[r][size_t(bh) * sh[r].len() + sh[r].len_a], sh[r].len_b,
                    &lse_b[r][size_t(bh) * sh[r].len_b]);
    }
    // One block of rank r against src's shard, or the own block beside the others (`own`: dQ
    // into dq_own, dK/dV into dkv_own, whole-shard rows).
    auto run = [&](int r, int src, const RingCall& call, bool into_acc, bool own) {
      const int len = sh[r].len();
      Vec dq_part(size_t(B) * H * call.q_rows * D), dkv_part(2 * size_t(B) * Hk * call.k_rows * D);
      std::vector<int32_t> kl(B);
      for (int b = 0; b < B; ++b) kl[b] = ring_local_seqlen(sh[src], call.k_row0, call.k_rows, lens[b]);
      RingBlockBuffers buf;
      buf.q = qs[r].data(), buf.kv = kvs[src].data(), buf.seqlens = c.padding ? kl.data() : nullptr;
      buf.o = o_sh[r].data(), buf.lse = call.q_row0 == 0 ? lse_sh[r].data() : lse_b[r].data();
      buf.dout = dos[r].data(), buf.dq_part = dq_part.data(), buf.dkv_part = dkv_part.data();
      BwdParams bp = ring_block_bwd(p, len, sh[src].len(), call, buf);
      if (f32)
        ring_block_grads_f32(p, len, sh[src].len(), call, (own ? dq_own : dq_sh)[r].data(),
                             into_acc ? dkv_acc[src].data() : (own ? dkv_own[r].data() : dkv_part.data()),
                             into_acc || own, &bp);
      block_backward(bp);
      if (!f32)
        for (int bh = 0; bh < B * H; ++bh)
          for (int i = 0; i < call.q_rows; ++i)
            for (int d = 0; d < D; ++d)
              dq_sh[r][(size_t(bh) * len + call.q_row0 + i) * D + d] += dq_part[(size_t(bh) * call.q_rows + i) * D + d];
      if (into_acc || own) return;
      const size_t half = size_t(B) * Hk * sh[src].len() * D, part_half = size_t(B) * Hk * call.k_rows * D;
      for (int t = 0; t < 2; ++t)
        for (int bg = 0; bg < B * Hk; ++bg)
          for (int j = 0; j < call.k_rows; ++j)
            for (int d = 0; d < D; ++d)
              dkv_acc[src][t * half + (size_t(bg) * sh[src].len() + call.k_row0 + j) * D + d] +=
                  dkv_part[t * part_half + (size_t(bg) * call.k_rows + j) * D + d];
    };
    for (int r = 0; r < N && beside; ++r)
      if (!ring_call(S, N, r, r, c.causal).skip) run(r, r, ring_call(S, N, r, r, c.causal), false, true);
    for (int s = 0; s < N - (beside ? 1 : 0); ++s) {
      for (int r = 0; r < N; ++r) {
        const int src = ((r - s - 1) % N + N) % N;
        const RingCall call = ring_call(S, N, r, src, c.causal);
        if (call.skip) continue;
        run(r, src, call, f32 && s == 0, false);
      }
    }
    for (int r = 0; r < N && beside; ++r) {  // the own block's gradients, added as the outputs are rounded
      for (size_t i = 0; i < dkv_own[r].size(); ++i) dkv_acc[r][i] += dkv_own[r][i];
      for (size_t i = 0; i < dq_own[r].size(); ++i) dq_sh[r][i] += dq_own[r][i];
    }
    Vec dq_ring(q.size()), dk_ring(k.size()), dv_ring(v.size());
    for (int r = 0; r < N; ++r) {
      unshard(dq_sh[r], B, H, S, D, sh[r], &dq_ring);
      const size_t half = size_t(B) * Hk * sh[r].len() * D;
      unshard(Vec(dkv_acc[r].begin(), dkv_acc[r].begin() + half), B, Hk, S, D, sh[r], &dk_ring);
      unshard(Vec(dkv_acc[r].begin() + half, dkv_acc[r].end()), B, Hk, S, D, sh[r], &dv_ring);
    }
    for (size_t i = 0; i < dq_ref.size(); ++i) ASSERT_NEAR(dq_ring[i], dq_ref[i], 1e-4) << "dQ element " << i;
    for (size_t i = 0; i < dk_ref.size(); ++i) ASSERT_NEAR(dk_ring[i], dk_ref[i], 1e-4) << "dK element " << i;
    for (size_t i = 0; i < dv_ref.size(); ++i) ASSERT_NEAR(dv_ring[i], dv_ref[i], 1e-4) << "dV element " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, RingOnHost,
                         testing::Values(Case{2, 2, 2, 16, 8, 2, false, false}, Case{1, 2, 2, 17, 8, 2, true, false},
                                         Case{2, 4, 2, 33, 8, 3, true, false}, Case{3, 2, 2, 20, 8, 2, true, true},
                                         Case{1, 2, 1, 3, 8, 2, true, false}, Case{2, 2, 2, 29, 16, 4, false, true},
                                         Case{1, 8, 4, 21, 8, 2, true, false}, Case{1, 16, 16, 9, 8, 2, false, false}),
                         [](const testing::TestParamInfo<Case>& i) {
                           const Case& c = i.param;
                           return "N" + std::to_string(c.N) + "_S" + std::to_string(c.S) + "_H" + std::to_string(c.H) +
                                  "_" + std::to_string(c.H_kv) + (c.causal ? "_causal" : "") +
                                  (c.padding ? "_padding" : "");
                         });

}  // namespace
}  // namespace flashattn
