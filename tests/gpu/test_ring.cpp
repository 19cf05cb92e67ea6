// Rings over two GPUs, and a few over three and four (src/ring.h): every kernel that declares partial outputs, forward and
// backward, causal (zig-zag) and not, GQA, key padding (with an empty and a short sequence), and
// lengths that 2N does not divide, the backward's gradients in fp32 where the kernel keeps them
// so and as 16-bit partials, the own block beside the others on a second stream and on one
// stream, the forward's last block with the whole GPU and on its per-tile grid, the transfers by
// NCCL's copy engines (the default on two GPUs) and by its send/recv kernels, checked against
// the fp64 reference like one-GPU runs, and compared with the same kernel on one GPU. With fewer
// GPUs than a shape's ranks, the shape as a ring of that many ranks on GPU 0 (`--devices 0,0`,
// ring.h's loopback: the transfers are copies on it, NCCL's registered buffers and copy engines
// not used). Skipped (with
// the reason) where no GPU is present or the build has no NCCL.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "device_info.h"
#include "flashattn/registry.h"
#include "flashattn/device_fill.h"
#include "params_build.h"
#include "ring.h"
#include "ring_block.h"
#include "run.h"
#include "scoped_env.h"

namespace flashattn {
namespace {

struct RingShape {
  int B, H, H_kv, S;
  bool causal;
  bool padding;
  bool partial_gradients;  // FLASHATTN_RING_FP32_GRADIENTS=0: the 16-bit partials where fp32 would do
  bool one_stream;         // FLASHATTN_RING_SIDE_STREAM=0: every block on one stream
  bool last_shared;        // FLASHATTN_RING_LAST_ALONE=0: the forward's last block on its per-tile grid
  bool unregistered;       // FLASHATTN_RING_REGISTER=0: NCCL through its own staging buffers
  bool send_recv;          // FLASHATTN_RING_COPY_ENGINE=0: NCCL's send/recv kernels, not its copy engines
  const char* tag;
  const char* lend = nullptr;  // FLASHATTN_RING_LEND (the backward of a kernel that can lend; B = 1)
  int ranks = 2;               // GPUs 0..ranks-1 where present, else as many ranks on GPU 0
};

const RingShape kShapes[] = {
    {2, 4, 4, 256, false, false, true, false, false, false, false, "s256"},
    {2, 4, 4, 256, false, false, false, false, false, false, false, "s256_f32"},
    {1, 4, 4, 301, true, false, false, false, true, false, false, "s301_causal"},  // 2N = 4 does not divide S
    {1, 4, 4, 301, true, false, false, true, false, true, false, "s301_causal_one_stream"},
    {2, 8, 2, 257, true, false, false, false, false, false, false, "gqa8_2_s257_causal"},
    {3, 2, 2, 200, true, true, true, false, false, true, false, "padding_causal"},
    {3, 2, 2, 200, true, true, false, false, false, false, false, "padding_causal_f32"},
    {1, 2, 2, 3, true, false, false, false, false, false, false, "s3_causal"},  // shards with empty chunks
    // Chunks of whole 16-row groups: dQ in the kernel's own layout where it offers one (so is s256
    // above, whose chunks are 64 rows).
    {1, 4, 4, 1024, true, false, false, false, false, false, true, "s1024_causal"},
    {1, 4, 4, 1024, true, false, false, true, false, false, false, "s1024_causal_one_stream"},
    {2, 4, 2, 512, false, false, false, false, true, false, false, "gqa4_2_s512"},
    {3, 2, 2, 512, true, true, false, false, false, false, false, "padding_causal_s512"},
    // Lending: rank 1's other block leaves a kv head to rank 0 (causal), rank 0's two of four
    // query heads (GQA 8/4: a kv head and its group) to rank 1. And parts of a kv head, in
    // 128-key tiles where the kernel has them (key_tile): rank 1's last tile of two (causal: its
    // other block has 256 keys), rank 0's last six of four heads' four tiles (the third kv head
    // shared).
    {1, 4, 4, 1024, true, false, false, false, false, false, false, "lend_1_1_s1024_causal", "1:1"},
    {1, 8, 4, 512, false, false, false, false, false, false, false, "lend_0_1_gqa8_4_s512", "0:1"},
    {1, 8, 4, 1024, true, false, false, false, false, false, false, "lend_0_3_gqa8_4_s1024_causal", "0:3"},
    {1, 4, 4, 1024, true, false, false, false, false, false, false, "lend_1_half_s1024_causal", "1:0.5"},
    {1, 8, 4, 1024, false, false, false, false, false, false, false, "lend_0_1_5_gqa8_4_s1024", "0:1.5"},
    // The lender and its tiles from the measured lag (any choice, none included, must hold).
    {1, 4, 4, 1024, true, false, false, false, false, false, false, "lend_auto_s1024_causal", "auto"},
    // Longer rings: the forward's fp32 running result, more than one remote block per GPU, K/V
    // and accumulators over more than one hop; 2N = 6 and 8 divide neither S.
    {1, 4, 4, 301, true, false, false, false, false, false, false, "r3_s301_causal", nullptr, 3},
    {3, 2, 2, 200, true, true, false, false, false, false, false, "r3_padding_causal", nullptr, 3},
    {2, 8, 2, 509, false, false, false, false, false, false, false, "r4_gqa8_2_s509", nullptr, 4},
    {1, 4, 4, 509, true, false, true, true, false, false, false, "r4_s509_causal_partial_one_stream", nullptr, 4},
};

struct RingCase {
  const KernelMode* entry;
  DType dtype;
  int D;
};

std::vector<RingCase> ring_cases() {
  std::vector<RingCase> v;
  for (const KernelMode* e : Registry::entries()) {
    if (!e->gpu || !e->partial_outputs || e->mode == Mode::Decode) continue;
    const DType t = (e->dtypes & dtype_bit(DType::BF16)) ? DType::BF16 : DType::F32;
    for (int D : {64, 128})
      if (e->head_dims.empty() || std::count(e->head_dims.begin(), e->head_dims.end(), D)) v.push_back({e, t, D});
  }
  return v;
}

std::string skip_reason() {
  const std::string why = ring_unavailable();
  if (!why.empty()) return why;
  std::string no_gpu;
  if (cuda_device_count(&no_gpu) == 0) return no_gpu;
  return "";
}

// GPUs 0..ranks-1, or GPU 0 for every rank where fewer are present.
std::vector<int> ring_devices(int ranks) {
  std::string no_gpu;
  std::vector<int> ids(ranks, 0);
  if (cuda_device_count(&no_gpu) >= ranks)
    for (int i = 0; i < ranks; ++i) ids[i] = i;
  return ids;
}

HostArray normal(DType t, std::vector<int64_t> shape, uint64_t stream) {
  HostArray a(t, std::move(shape));
  fill_normal_host(a.bytes.data(), t, a.numel(), /*seed=*/7, stream);
  return a;
}

class RingMatrix : public testing::TestWithParam<RingCase> {};

TEST_P(RingMatrix, MatchesReferenceAndOneGpu) {
  const std::string skip = skip_reason();
  if (!skip.empty()) GTEST_SKIP() << skip;
  const RingCase& c = GetParam();
  if (!why_gpu_unsupported(*c.entry, query_device(0).sm()).empty()) GTEST_SKIP() << why_gpu_unsupported(*c.entry, query_device(0).sm());
  for (const RingShape& s : kShapes) {
    SCOPED_TRACE(s.tag);
    RunInputs in;
    Problem& p = in.problem;
    p.dims = {s.B, s.H, s.H_kv, s.S, s.S, c.D};
    p.dtype = c.dtype;
    p.scale = 1.0 / std::sqrt(double(c.D));
    p.causal = s.causal;
    in.q = normal(c.dtype, {s.B, s.H, s.S, c.D}, 1);
    in.k = normal(c.dtype, {s.B, s.H_kv, s.S, c.D}, 2);
    in.v = normal(c.dtype, {s.B, s.H_kv, s.S, c.D}, 3);
    in.dout = normal(c.dtype, {s.B, s.H, s.S, c.D}, 4);
    if (s.padding) {
      HostArray lens(DType::I32, {s.B});
      for (int b = 0; b < s.B; ++b) lens.data<int32_t>()[b] = b == 0 ? 0 : (b == 1 ? s.S / 3 + 1 : s.S);
      in.seqlens_k = lens;
      p.has_padding = true;
    }
    if (!why_unsupported(*c.entry, p, query_device(0).sm()).empty()) continue;  // a feature it lacks
    const bool can_lend = c.entry->mode == Mode::Backward && c.entry->dq_finish != nullptr &&
                          c.entry->fp32_gradients != nullptr && c.entry->fp32_gradients(ring_block_bwd(p, 1, 1, RingCall{}, {}));
    if (s.lend && !can_lend) continue;
    const bool automatic = s.lend != nullptr && std::string(s.lend) == "auto";
    const bool whole_heads = s.lend == nullptr || (!automatic && std::string(s.lend).find('.') == std::string::npos);
    if (!whole_heads && (c.entry->key_tile == nullptr || c.entry->key_tile(ring_block_bwd(p, 1, 1, RingCall{}, {})) != 128))
      continue;  // parts of a kv head as this shape's comment counts them
    const bool merges = c.entry->merges_output != nullptr && c.entry->merges_output(forward_params(p));
    SessionOptions so;
    so.device = 0;
    so.devices = ring_devices(s.ranks);
    const bool loopback = so.devices[1] == so.devices[0];
    so.timing.warmup = 0;
    so.timing.repeat = 1;
    so.timing.flush_l2 = false;
    so.check = true;
    const ScopedEnv partial("FLASHATTN_RING_FP32_GRADIENTS", s.partial_gradients, "0");
    const ScopedEnv streams("FLASHATTN_RING_SIDE_STREAM", s.one_stream, "0");
    const ScopedEnv last("FLASHATTN_RING_LAST_ALONE", s.last_shared, "0");
    const ScopedEnv reg("FLASHATTN_RING_REGISTER", s.unregistered, "0");
    const ScopedEnv ce("FLASHATTN_RING_COPY_ENGINE", s.send_recv, "0");
    const ScopedEnv lend("FLASHATTN_RING_LEND", s.lend != nullptr, s.lend ? s.lend : "");
    Session session(std::move(in), so);
    const RunRecord r = session.run(*c.entry);
    ASSERT_TRUE(r.ring.has_value());
    ASSERT_TRUE(r.check.performed);
    for (const OutputCheck& o : r.check.outputs)
      EXPECT_TRUE(o.passed) << o.name << ": " << o.metric << " " << o.measured << " vs tolerance " << o.tolerance
                            << " [" << o.rule << "], nonfinite " << o.err.nonfinite << ", max_abs " << o.err.max_abs;
    EXPECT_TRUE(r.ring->one_gpu_skipped.empty()) << r.ring->one_gpu_skipped;
    for (const RingRecord::VsOneGpu& d : r.ring->vs_one_gpu)
      EXPECT_TRUE(d.passed) << d.name << " vs one GPU: " << d.metric << " " << d.measured << " > " << d.tolerance;
    EXPECT_GE(r.ring->max_abs_vs_one_gpu(), 0.0);
    // Each rank's card alone (SessionOptions::ring_baseline_each, the default): rank 0's is the
    // first GPU's run; a card that plays several ranks (the loopback) is timed once.
    ASSERT_EQ(int(r.ring->one_gpu_per_rank.size()), s.ranks);
    for (int k = 0; k < s.ranks; ++k) {
      const RingRecord::CardTime& card = r.ring->one_gpu_per_rank[k];
      EXPECT_EQ(card.rank, k);
      EXPECT_EQ(card.device, so.devices[k]);
      EXPECT_GT(card.median_ms, 0.0) << card.skipped;
      if (so.devices[k] == so.devices[0]) {
        EXPECT_EQ(card.median_ms, r.ring->one_gpu_median_ms);
      }
    }
    if (loopback) {
      EXPECT_NEAR(r.ring->scaling_efficiency_cards, r.ring->scaling_efficiency, 1e-12);  // one card
    } else {
      EXPECT_GT(r.ring->scaling_efficiency_cards, 0.0);
    }
    // Two streams unless told not to: the forward where its last block does not take the whole
    // GPU (more than two ranks, or told not to), the backward with fp32 gradients, its own block after the first
    // K/V shard under GQA.
    const bool forward = c.entry->mode == Mode::Forward;
    const bool last_alone = forward && !s.last_shared && s.ranks == 2;
    EXPECT_EQ(r.ring->size, s.ranks);
    EXPECT_EQ(r.ring->last_block_alone, last_alone);
    EXPECT_EQ(r.ring->last_block_merges, r.ring->last_block_alone && merges);
    EXPECT_EQ(r.ring->loopback, loopback);
    EXPECT_EQ(r.ring->registered_buffers, !s.unregistered && !loopback);
    EXPECT_EQ(r.ring->lend_auto, automatic);
    if (automatic) {
      EXPECT_GE(r.ring->lend_lag_ms, 0.0);
      EXPECT_EQ(r.ring->lend_rank >= 0, r.ring->lend_kv_heads > 0);
    } else {
      EXPECT_EQ(r.ring->lend_rank, s.lend ? s.lend[0] - '0' : -1);
      EXPECT_EQ(r.ring->lend_kv_heads, s.lend ? std::stod(s.lend + 2) : 0.0);
    }
    if (s.unregistered || s.send_recv || loopback) {
      EXPECT_FALSE(r.ring->copy_engine);
    }
    if (s.one_stream || last_alone) {
      EXPECT_FALSE(r.ring->side_stream);
    } else if (forward || r.ring->gradients == "fp32") {
      EXPECT_TRUE(r.ring->side_stream);
    }
    EXPECT_EQ(r.ring->side_after_first_shard, !forward && r.ring->side_stream && s.H != s.H_kv);
    std::printf("  [ring%s %s %s D%d %s%s%s] vs one GPU: %s, max abs %.3g; scaling efficiency %.3f\n",
                loopback ? " on one GPU" : "", c.entry->kernel.c_str(), mode_name(c.entry->mode), c.D, s.tag,
                r.ring->side_stream        ? ", two streams"
                : r.ring->last_block_alone ? ", last block alone"
                                           : "",
                r.ring->copy_engine ? ", copy engine" : "",
                r.ring->bitwise_vs_one_gpu ? "bitwise" : "differs",
                r.ring->max_abs_vs_one_gpu(), r.ring->scaling_efficiency);
  }
}

INSTANTIATE_TEST_SUITE_P(Registry, RingMatrix, testing::ValuesIn(ring_cases()),
                         [](const testing::TestParamInfo<RingCase>& i) {
                           return i.param.entry->kernel + "_" + mode_name(i.param.entry->mode) + "_" +
                                  dtype_name(i.param.dtype) + "_D" + std::to_string(i.param.D);
                         });

}  // namespace
}  // namespace flashattn
