// The ring's element-wise steps (include/flashattn/ring_ops.h) against the same algebra on the
// host, in fp32 and bf16, on both of their paths: four elements per thread (D a multiple of 4,
// pointers aligned for it) and one (D = 6, or every pointer one element off its alignment).
// Rows whose block saw no key (lse = -inf), alone or with the running result's, are among them;
// the in-place merge leaves the rows outside its block as they were, bit for bit.
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
#include "flashattn/ring_ops.h"

namespace flashattn {
namespace {

struct OpsCase {
  DType dtype;
  int D;
  bool offset;  // every device pointer one element past an aligned address
  const char* tag;
};

// Host values of a dtype: float, and their bytes.
std::vector<float> rounded(DType t, std::vector<float> v) {
  if (t != DType::F32)
    for (float& x : v) x = bf16_bits_to_float(float_to_bf16_bits(x));
  return v;
}
std::vector<uint8_t> bytes_of(DType t, const std::vector<float>& v) {
  std::vector<uint8_t> out(v.size() * dtype_size(t));
  for (size_t i = 0; i < v.size(); ++i) {
    if (t == DType::F32) {
      std::memcpy(&out[i * 4], &v[i], 4);
    } else {
      const uint16_t b = float_to_bf16_bits(v[i]);
      std::memcpy(&out[i * 2], &b, 2);
    }
  }
  return out;
}
std::vector<float> floats_of(DType t, const std::vector<uint8_t>& b) {
  std::vector<float> out(b.size() / dtype_size(t));
  for (size_t i = 0; i < out.size(); ++i) {
    if (t == DType::F32) {
      std::memcpy(&out[i], &b[i * 4], 4);
    } else {
      uint16_t h;
      std::memcpy(&h, &b[i * 2], 2);
      out[i] = bf16_bits_to_float(h);
    }
  }
  return out;
}

// A device copy of host bytes at `offset` bytes past an aligned allocation.
struct Dev {
  DeviceBuffer buf;
  size_t offset = 0;
  Dev(const std::vector<uint8_t>& host, size_t off) : buf(host.size() + 16), offset(off) {
    CUDA_CHECK(cudaMemcpy(ptr(), host.data(), host.size(), cudaMemcpyHostToDevice));
  }
  void* ptr() const { return static_cast<char*>(buf.get()) + offset; }
  float* f() const { return static_cast<float*>(ptr()); }
  std::vector<uint8_t> get(size_t n) const {
    std::vector<uint8_t> out(n);
    CUDA_CHECK(cudaMemcpy(out.data(), ptr(), n, cudaMemcpyDeviceToHost));
    return out;
  }
};

std::vector<float> normal(int64_t n, uint64_t stream) {
  std::vector<float> v(n);
  fill_normal_host(v.data(), DType::F32, n, /*seed=*/11, stream);
  return v;
}

void weights(float la, float lp, float* lse, float* wa, float* wp) {
  const float m = std::max(la, lp);
  if (m == -INFINITY) {
    *lse = -INFINITY, *wa = 1.f, *wp = 0.f;
    return;
  }
  const float a = std::exp(la - m), p = std::exp(lp - m);
  *lse = m + std::log(a + p), *wa = a / (a + p), *wp = p / (a + p);
}

void expect_close(const std::vector<float>& got, const std::vector<float>& want, DType t, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  const float rel = t == DType::F32 ? 1e-5f : 1.0f / 128;  // one bf16 ulp for a rounded result
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::isinf(want[i])) {
      ASSERT_EQ(got[i], want[i]) << what << " element " << i;
    } else {
      ASSERT_NEAR(got[i], want[i], 1e-6f + rel * std::abs(want[i])) << what << " element " << i;
    }
  }
}

class RingOps : public testing::TestWithParam<OpsCase> {};

TEST_P(RingOps, MatchHost) {
  std::string why;
  if (cuda_device_count(&why) == 0) GTEST_SKIP() << why;
  const OpsCase c = GetParam();
  const DType t = c.dtype;
  const int B = 2, H = 3, S_loc = 37, rows = 20, row0 = 9, D = c.D;
  const int64_t pairs = int64_t(B) * H, n_shard = pairs * S_loc * D, n_block = pairs * rows * D;
  const size_t es = dtype_size(t), off_t = c.offset ? es : 0, off_f = c.offset ? 4 : 0;
  const std::vector<float> part = rounded(t, normal(n_block, 1)), acc0 = normal(n_shard, 2);
  std::vector<float> lse_part = normal(pairs * rows, 3), lse_acc0 = normal(pairs * S_loc, 4);
  lse_part[1] = -INFINITY;                                    // a block row that saw no key
  lse_part[2] = -INFINITY, lse_acc0[row0 + 2] = -INFINITY;   // ... nor did the running result
  lse_acc0[row0 + 3] = -INFINITY;                             // only the block saw keys
  const std::vector<uint8_t> part_b = bytes_of(t, part);
  const std::vector<uint8_t> acc_b = bytes_of(DType::F32, acc0), lse_acc_b = bytes_of(DType::F32, lse_acc0);
  const std::vector<uint8_t> lse_part_b = bytes_of(DType::F32, lse_part);

  // Host: the block merged into rows [row0, row0 + rows) of a running result `acc` (the other
  // rows as they were) and their lse.
  std::vector<float> lse_merged = lse_acc0;
  auto merge_host = [&](std::vector<float> acc) {
    for (int64_t bh = 0; bh < pairs; ++bh)
      for (int i = 0; i < rows; ++i) {
        const int64_t arow = bh * S_loc + row0 + i, prow = bh * rows + i;
        float lse, wa, wp;
        weights(lse_acc0[arow], lse_part[prow], &lse, &wa, &wp);
        for (int d = 0; d < D; ++d)
          acc[arow * D + d] = wa * acc[arow * D + d] + (wp == 0.f ? 0.f : wp * part[prow * D + d]);
        lse_merged[arow] = lse;
      }
    return acc;
  };
  const std::vector<float> merged = merge_host(acc0);

  {  // ring_merge_block
    Dev dp(part_b, off_t), da(acc_b, off_f), dl(lse_acc_b, off_f), dlp(lse_part_b, off_f);
    ring_merge_block(t, dp.ptr(), dlp.f(), da.f(), dl.f(), B, H, rows, row0, S_loc, D, nullptr);
    expect_close(floats_of(DType::F32, da.get(acc_b.size())), merged, DType::F32, "merge_block O");
    expect_close(floats_of(DType::F32, dl.get(lse_acc_b.size())), lse_merged, DType::F32, "merge_block lse");
  }
  {  // ring_merge_last: every row of the shard in the dtype
    Dev dp(part_b, off_t), da(acc_b, off_f), dl(lse_acc_b, off_f), dlp(lse_part_b, off_f);
    Dev dout(std::vector<uint8_t>(n_shard * es, 0xff), off_t);
    ring_merge_last(t, dp.ptr(), dlp.f(), da.f(), dl.f(), dout.ptr(), B, H, rows, row0, S_loc, D, nullptr);
    expect_close(floats_of(t, dout.get(n_shard * es)), rounded(t, merged), t, "merge_last O");
    expect_close(floats_of(DType::F32, dl.get(lse_acc_b.size())), lse_merged, DType::F32, "merge_last lse");
  }
  {  // ring_merge_in_place: the block's rows merged into an output in the dtype, the others kept
    const std::vector<float> o0 = rounded(t, acc0), want = merge_host(o0);
    Dev dp(part_b, off_t), dout(bytes_of(t, o0), off_t), dl(lse_acc_b, off_f), dlp(lse_part_b, off_f);
    ring_merge_in_place(t, dp.ptr(), dlp.f(), dout.ptr(), dl.f(), B, H, rows, row0, S_loc, D, nullptr);
    const std::vector<uint8_t> got = dout.get(n_shard * es), before = bytes_of(t, o0);
    expect_close(floats_of(t, got), rounded(t, want), t, "merge_in_place O");
    for (int64_t row = 0; row < pairs * S_loc; ++row) {
      const int i = int(row % S_loc);
      if (i >= row0 && i < row0 + rows) continue;
      ASSERT_EQ(0, std::memcmp(&got[row * D * es], &before[row * D * es], D * es)) << "merge_in_place row " << row;
    }
    expect_close(floats_of(DType::F32, dl.get(lse_acc_b.size())), lse_merged, DType::F32, "merge_in_place lse");
  }
  {  // ring_merge_first: the block's rows become the running result
    Dev dp(part_b, off_t), dlp(lse_part_b, off_f);
    Dev da(std::vector<uint8_t>(n_block * 4, 0xff), off_f), dl(std::vector<uint8_t>(pairs * rows * 4, 0xff), off_f);
    ring_merge_first(t, dp.ptr(), dlp.f(), da.f(), dl.f(), pairs * rows, D, nullptr);
    expect_close(floats_of(DType::F32, da.get(n_block * 4)), part, DType::F32, "merge_first O");
    expect_close(floats_of(DType::F32, dl.get(pairs * rows * 4)), lse_part, DType::F32, "merge_first lse");
  }
  {  // ring_accumulate
    std::vector<float> want = acc0;
    for (int64_t bh = 0; bh < pairs; ++bh)
      for (int i = 0; i < rows; ++i)
        for (int d = 0; d < D; ++d) want[(bh * S_loc + row0 + i) * D + d] += part[(bh * rows + i) * D + d];
    Dev dp(part_b, off_t), da(acc_b, off_f);
    ring_accumulate(t, dp.ptr(), da.f(), B, H, rows, row0, S_loc, D, nullptr);
    expect_close(floats_of(DType::F32, da.get(acc_b.size())), want, DType::F32, "accumulate");
  }
  {  // ring_round, ring_add_round and ring_fill
    Dev da(acc_b, off_f), dout(std::vector<uint8_t>(n_shard * es, 0xff), off_t);
    ring_round(t, da.f(), dout.ptr(), n_shard, nullptr);
    expect_close(floats_of(t, dout.get(n_shard * es)), rounded(t, acc0), t, "round");
    const std::vector<float> other = normal(n_shard, 5);
    Dev db(bytes_of(DType::F32, other), off_f);
    std::vector<float> sum(n_shard);
    for (int64_t i = 0; i < n_shard; ++i) sum[i] = acc0[i] + other[i];
    ring_add_round(t, db.f(), da.f(), dout.ptr(), n_shard, nullptr);
    expect_close(floats_of(t, dout.get(n_shard * es)), rounded(t, sum), t, "add_round");
    ring_fill(da.f(), -INFINITY, n_shard, nullptr);
    expect_close(floats_of(DType::F32, da.get(acc_b.size())), std::vector<float>(n_shard, -INFINITY), DType::F32,
                 "fill");
  }
  CUDA_CHECK(cudaDeviceSynchronize());
}

INSTANTIATE_TEST_SUITE_P(Paths, RingOps,
                         testing::Values(OpsCase{DType::F32, 8, false, "fp32_vec4"},
                                         OpsCase{DType::F32, 8, true, "fp32_unaligned"},
                                         OpsCase{DType::F32, 6, false, "fp32_d6"},
                                         OpsCase{DType::BF16, 8, false, "bf16_vec4"},
                                         OpsCase{DType::BF16, 8, true, "bf16_unaligned"},
                                         OpsCase{DType::BF16, 6, false, "bf16_d6"}),
                         [](const testing::TestParamInfo<OpsCase>& i) { return std::string(i.param.tag); });

}  // namespace
}  // namespace flashattn
