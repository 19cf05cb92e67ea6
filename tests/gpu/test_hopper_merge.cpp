// hopper's forward merging into its outputs (FwdParams::merge_output, the ring's last block): the
// keys split in two calls, the first writing O and lse at a row range of longer buffers
// (lse_stride), the second merging into them, must give the one call over all keys within the
// rounding of the first call's O to bf16; the buffers' other rows untouched. Key padding makes a
// batch element with no keys at all (both calls empty) and one whose keys all fall in the first
// call (the second empty). D 64, 128 and 256 (those built), GQA; D64 and D128 also in their
// 192-row tiles (forced: long rows take them by default). Skipped without an sm_90 GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "array.h"
#include "device_buffer.h"
#include "device_info.h"
#include "flashattn/check.h"
#include "flashattn/device_fill.h"
#include "flashattn/registry.h"
#include "gpu_context.h"
#include "hopper_test_util.h"
#include "params_build.h"
#include "problem.h"
#include "scoped_env.h"

namespace flashattn {
namespace {

constexpr uint64_t kSeed = 11;

struct MergeCase {
  int D;
  bool wide;  // FLASHATTN_HOPPER_D64_ROWS / _D128_ROWS = 192
};

class HopperMerge : public testing::TestWithParam<MergeCase> {};

TEST_P(HopperMerge, TwoKeyRangesEqualOneCall) {
  if (const std::string why = why_no_hopper_gpu(); !why.empty()) GTEST_SKIP() << why;
  const DeviceInfo dev = query_device(0);
  const KernelMode* fwd = Registry::find("hopper", Mode::Forward);
  if (!fwd || !fwd->merges_output) GTEST_SKIP() << "hopper is not built";
  const int D = GetParam().D;
  const std::string rows_var = "FLASHATTN_HOPPER_D" + std::to_string(D) + "_ROWS";
  const ScopedEnv rows(rows_var.c_str(), GetParam().wide, "192");
  if (std::find(fwd->head_dims.begin(), fwd->head_dims.end(), D) == fwd->head_dims.end())
    GTEST_SKIP() << "head dim " << D << " is not in this build";

  // Rows [row0, row0 + S_q) of buffers `len` rows long per (batch, head), as a ring's last block
  // writes into its rank's outputs; keys [0, split) in the first call, [split, S_k) in the second.
  const int B = 3, H = 4, H_kv = 2, S_q = 300, S_k = 300, split = 137, row0 = 24, len = S_q + 40;
  const std::vector<int32_t> lens = {0, 100, S_k};  // no keys; all in the first call; both calls
  Problem prob;
  prob.dims = {B, H, H_kv, S_q, S_k, D};
  prob.dtype = DType::BF16;
  prob.scale = 1.0 / std::sqrt(double(D));
  prob.has_padding = true;
  cudaStream_t stream = nullptr;
  CUDA_CHECK(cudaStreamCreate(&stream));
  const LaunchContext ctx = gpu_launch_context(dev, 0, stream);
  const int64_t nq = int64_t(B) * H * S_q * D, nk = int64_t(B) * H_kv * S_k * D;
  DeviceBuffer q = upload_normal(DType::BF16, nq, kSeed, 1), k = upload_normal(DType::BF16, nk, kSeed, 2),
               v = upload_normal(DType::BF16, nk, kSeed, 3);
  std::vector<int32_t> lens_a(B), lens_b(B);
  for (int b = 0; b < B; ++b) {
    lens_a[b] = std::min(lens[b], split);
    lens_b[b] = std::max(lens[b] - split, 0);
  }
  DeviceBuffer seq = upload_i32(lens), seq_a = upload_i32(lens_a), seq_b = upload_i32(lens_b);

  FwdParams f = forward_params(prob);
  f.q = q.get(), f.k = k.get(), f.v = v.get();
  f.seqlens_k = static_cast<const int32_t*>(seq.get());
  f.num_sms = dev.sm_count;
  ASSERT_TRUE(fwd->merges_output(f));
  DeviceBuffer ws(fwd->fwd_workspace ? fwd->fwd_workspace(f) : 0);
  f.workspace = ws.get(), f.workspace_bytes = ws.bytes();

  // The one call over all keys.
  DeviceBuffer o_ref(nq * 2), lse_ref(int64_t(B) * H * S_q * 4);
  FwdParams whole = f;
  whole.o = o_ref.get(), whole.lse = lse_ref.get();
  fwd->fwd(whole, ctx);

  // The two calls into the longer buffers, every byte of them set to a pattern first.
  const int64_t n_big = int64_t(B) * H * len * D, n_lse = int64_t(B) * H * len;
  DeviceBuffer o_big(n_big * 2), lse_big(n_lse * 4);
  CUDA_CHECK(cudaMemset(o_big.get(), 0x3f, n_big * 2));
  CUDA_CHECK(cudaMemset(lse_big.get(), 0x3f, n_lse * 4));
  FwdParams part = f;
  part.S_k = split;
  part.seqlens_k = static_cast<const int32_t*>(seq_a.get());
  part.o = static_cast<char*>(o_big.get()) + int64_t(row0) * D * 2;
  part.o_st = {int64_t(H) * len * D, int64_t(len) * D, D};
  part.lse = static_cast<float*>(lse_big.get()) + row0;
  part.lse_stride = len;
  fwd->fwd(part, ctx);
  part.S_k = S_k - split;
  part.k = static_cast<const char*>(k.get()) + int64_t(split) * D * 2;
  part.v = static_cast<const char*>(v.get()) + int64_t(split) * D * 2;
  part.seqlens_k = static_cast<const int32_t*>(seq_b.get());
  part.merge_output = true;
  fwd->fwd(part, ctx);
  CUDA_CHECK(cudaStreamSynchronize(stream));

  const std::vector<float> want = download_bf16(o_ref), got = download_bf16(o_big);
  const std::vector<float> lse_want = download_f32(lse_ref), lse_got = download_f32(lse_big);
  const float pattern = bf16_bits_to_float(0x3f3f);
  const uint32_t lse_bits = 0x3f3f3f3fu;
  float lse_pattern = 0.f;
  std::memcpy(&lse_pattern, &lse_bits, 4);
  for (int64_t bh = 0; bh < int64_t(B) * H; ++bh) {
    for (int r = 0; r < len; ++r) {
      const bool inside = r >= row0 && r < row0 + S_q;
      const float lg = lse_got[bh * len + r];
      if (!inside) {
        ASSERT_EQ(lg, lse_pattern) << "lse row " << r << " of (batch, head) " << bh << " was written";
      } else {
        const float lw = lse_want[bh * S_q + r - row0];
        if (std::isinf(lw))
          ASSERT_EQ(lg, lw) << "lse row " << r - row0 << " of (batch, head) " << bh;
        else
          ASSERT_NEAR(lg, lw, 2e-5f * std::max(1.f, std::abs(lw))) << "lse row " << r - row0 << " of (batch, head) " << bh;
      }
      for (int x = 0; x < D; ++x) {
        const float g = got[(bh * len + r) * D + x];
        if (!inside) {
          ASSERT_EQ(g, pattern) << "O row " << r << " of (batch, head) " << bh << " was written";
          continue;
        }
        // The first call's O was rounded to bf16 before the merge: an ulp of it (up to ~1/128 of
        // the largest |O|, 0.3 here), weighted by at most 1, plus the final rounding.
        const float w = want[(bh * S_q + r - row0) * D + x];
        ASSERT_NEAR(g, w, std::abs(w) / 128 + 3e-3f) << "O row " << r - row0 << ", column " << x << " of (batch, head) " << bh;
      }
    }
  }
  CUDA_CHECK(cudaStreamDestroy(stream));
}

INSTANTIATE_TEST_SUITE_P(HeadDims, HopperMerge,
                         testing::Values(MergeCase{64, false}, MergeCase{128, false}, MergeCase{256, false},
                                         MergeCase{64, true}, MergeCase{128, true}),
                         [](const testing::TestParamInfo<MergeCase>& i) {
                           return "D" + std::to_string(i.param.D) + (i.param.wide ? "_wide" : "");
                         });

}  // namespace
}  // namespace flashattn
