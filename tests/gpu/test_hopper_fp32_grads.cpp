// hopper's backward with BwdParams::grads_f32 (the ring's blocks) against its own 16-bit path on
// one GPU: the same launch, dQ added into an fp32 buffer that already holds a known value, dK and
// dV stored in fp32. Both runs take the deterministic path, so they sum the same fp32 terms in the
// same order: each fp32 gradient must round to the 16-bit one (half an ulp), at every element,
// for D 64 and 128, causal and not, GQA and a length no tile divides. And dQ added into a caller's
// accumulator in the kernel's layout (BwdParams::dq_accum, at a row offset) and written out by
// the entry's dq_finish: bit for bit the 16-bit path's dQ, the accumulator's other rows untouched.
// And part of the work (BwdParams::tiles_*): two launches of complementary key tiles give the
// whole launch's fp32 gradients (dQ in a caller's accumulator) bit for bit.
// Skipped without an sm_90 GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <cstdint>
#include <string>
#include <utility>
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

namespace flashattn {
namespace {

constexpr uint64_t kSeed = 5;

// got (fp32, less `base`) rounds to want (bf16): within half a bf16 ulp of it, plus fp32's own
// error in subtracting `base`.
void expect_rounds_to(const std::vector<float>& got, float base, const std::vector<float>& want, const char* what) {
  for (size_t i = 0; i < want.size(); ++i) {
    const float x = got[i] - base;
    ASSERT_TRUE(std::isfinite(got[i])) << what << " element " << i;
    ASSERT_NEAR(x, want[i], std::abs(want[i]) / 256 + 1e-6f + std::abs(base) * 1e-7f) << what << " element " << i;
  }
}

struct Fp32Case {
  int D;
  bool causal;
};

class HopperFp32Gradients : public testing::TestWithParam<Fp32Case> {};

// One GPU's problem for both tests: bf16 inputs from the generator, hopper's forward run
// (deterministic), the backward's parameters with a workspace, gradients not yet pointed at.
struct Fp32Setup {
  Problem prob;
  int64_t nq = 0, nk = 0;
  cudaStream_t stream = nullptr;
  LaunchContext ctx;
  DeviceBuffer q, k, v, dout, o, lse, fws, bws;
  BwdParams b;
  Fp32Setup(const DeviceInfo& dev, const KernelMode& fwd, const KernelMode& bwd, const Fp32Case& c) {
    prob.dims = {2, 4, 2, 300, 300, c.D};
    prob.dtype = DType::BF16;
    prob.scale = 1.0 / std::sqrt(double(c.D));
    prob.causal = c.causal;
    const Dims& d = prob.dims;
    nq = int64_t(d.B) * d.H * d.S_q * d.D, nk = int64_t(d.B) * d.H_kv * d.S_k * d.D;
    CUDA_CHECK(cudaStreamCreate(&stream));
    ctx = gpu_launch_context(dev, 0, stream);
    q = upload_normal(DType::BF16, nq, kSeed, 1), k = upload_normal(DType::BF16, nk, kSeed, 2);
    v = upload_normal(DType::BF16, nk, kSeed, 3), dout = upload_normal(DType::BF16, nq, kSeed, 4);
    o = DeviceBuffer(nq * 2), lse = DeviceBuffer(int64_t(d.B) * d.H * d.S_q * 4);
    FwdParams f = forward_params(prob);
    f.q = q.get(), f.k = k.get(), f.v = v.get(), f.o = o.get(), f.lse = lse.get();
    f.num_sms = dev.sm_count;
    f.deterministic = true;
    fws = DeviceBuffer(fwd.fwd_workspace ? fwd.fwd_workspace(f) : 0);
    f.workspace = fws.get(), f.workspace_bytes = fws.bytes();
    fwd.fwd(f, ctx);
    static_cast<FwdParams&>(b) = f;
    b.dout = dout.get(), b.do_st = f.q_st;
    b.dq_st = f.q_st, b.dk_st = b.dv_st = f.k_st;
    bws = DeviceBuffer(bwd.bwd_workspace ? bwd.bwd_workspace(b) : 0);
    b.workspace = bws.get(), b.workspace_bytes = bws.bytes();
  }
  ~Fp32Setup() { cudaStreamDestroy(stream); }
};

// Why the test cannot run here, or "" (then fwd and bwd are hopper's entries).
std::string why_skip(const Fp32Case& c, const KernelMode*& fwd, const KernelMode*& bwd) {
  if (std::string why = why_no_hopper_gpu(); !why.empty()) return why;
  fwd = Registry::find("hopper", Mode::Forward);
  bwd = Registry::find("hopper", Mode::Backward);
  if (!fwd || !bwd || !bwd->fp32_gradients) return "hopper is not built";
  if (std::find(bwd->head_dims.begin(), bwd->head_dims.end(), c.D) == bwd->head_dims.end())
    return "head dim " + std::to_string(c.D) + " is not in this build";
  return "";
}

TEST_P(HopperFp32Gradients, RoundToTheDtypePath) {
  const KernelMode *fwd = nullptr, *bwd = nullptr;
  if (const std::string why = why_skip(GetParam(), fwd, bwd); !why.empty()) GTEST_SKIP() << why;
  Fp32Setup u(query_device(0), *fwd, *bwd, GetParam());
  const Dims& d = u.prob.dims;
  const int64_t nq = u.nq, nk = u.nk;
  const cudaStream_t stream = u.stream;
  const LaunchContext& ctx = u.ctx;
  BwdParams& b = u.b;
  ASSERT_TRUE(bwd->fp32_gradients(b));

  DeviceBuffer dq(nq * 2), dk(nk * 2), dv(nk * 2);
  b.dq = dq.get(), b.dk = dk.get(), b.dv = dv.get();
  bwd->bwd(b, ctx);

  const float base = 0.5f;  // dQ is added into what the buffer holds
  DeviceBuffer dq32(nq * 4), dk32(nk * 4), dv32(nk * 4);
  const std::vector<float> filled(nq, base);
  CUDA_CHECK(cudaMemcpy(dq32.get(), filled.data(), nq * 4, cudaMemcpyHostToDevice));
  CUDA_CHECK(cudaMemset(dk32.get(), 0xff, nk * 4));  // NaN: every element must be stored
  CUDA_CHECK(cudaMemset(dv32.get(), 0xff, nk * 4));
  b.grads_f32 = true;
  b.dq = dq32.get(), b.dk = dk32.get(), b.dv = dv32.get();
  bwd->bwd(b, ctx);
  CUDA_CHECK(cudaStreamSynchronize(stream));

  expect_rounds_to(download_f32(dq32, nq), base, download_bf16(dq, nq), "dQ");
  expect_rounds_to(download_f32(dk32, nk), 0.f, download_bf16(dk, nk), "dK");
  expect_rounds_to(download_f32(dv32, nk), 0.f, download_bf16(dv, nk), "dV");

  // The caller's accumulator: rows [row0, row0 + S_q + kDqAccumSpare) of `rows` per (batch, head).
  ASSERT_NE(bwd->dq_finish, nullptr);
  const int row0 = kDqAccumRows, row_end = row0 + d.S_q + kDqAccumSpare;
  const int rows = (row_end + kDqAccumRows - 1) / kDqAccumRows * kDqAccumRows + kDqAccumRows;
  const int64_t n_acc = int64_t(d.B) * d.H * rows * d.D;
  DeviceBuffer acc(n_acc * 4), dq_fin(nq * 2);
  CUDA_CHECK(cudaMemset(acc.get(), 0, n_acc * 4));
  CUDA_CHECK(cudaMemset(dq_fin.get(), 0xff, nq * 2));
  b.dq_accum = static_cast<float*>(acc.get()), b.dq_accum_rows = rows, b.dq_accum_row0 = row0;
  bwd->bwd(b, ctx);
  BwdParams fin = b;
  fin.dq_accum = static_cast<float*>(acc.get()) + int64_t(row0) * d.D;  // the call's rows start there
  fin.dq = dq_fin.get();
  bwd->dq_finish(fin, ctx);
  CUDA_CHECK(cudaStreamSynchronize(stream));
  const std::vector<float> want = download_bf16(dq, nq), got = download_bf16(dq_fin, nq), a = download_f32(acc, n_acc);
  for (int64_t i = 0; i < nq; ++i) ASSERT_EQ(got[i], want[i]) << "dQ from the caller's accumulator, element " << i;
  // The call's rows are in the kernel's layout (not row-major), and it may add zeros up to
  // kDqAccumSpare rows past them; every other row is untouched.
  for (int64_t bh = 0; bh < int64_t(d.B) * d.H; ++bh)
    for (int r = 0; r < rows; ++r) {
      if (r >= row0 && r < row_end) continue;
      for (int x = 0; x < d.D; ++x)
        ASSERT_EQ(a[(bh * rows + r) * d.D + x], 0.f) << "accumulator row " << r << " of (batch, head) " << bh;
    }
}

// Part of the work (BwdParams::tiles_begin/end, what a ring lends): the key tiles split in two
// launches, once inside a kv head (the second part starting at its last tile), once at a batch
// boundary, give the whole launch's fp32 gradients bit for bit (the deterministic path: dQ's
// terms added into one accumulator in the same order, the second launch after the first); one
// part alone writes dK and dV of its own keys only.
TEST_P(HopperFp32Gradients, TileRanges) {
  const KernelMode *fwd = nullptr, *bwd = nullptr;
  if (const std::string why = why_skip(GetParam(), fwd, bwd); !why.empty()) GTEST_SKIP() << why;
  Fp32Setup u(query_device(0), *fwd, *bwd, GetParam());
  const Dims& d = u.prob.dims;
  BwdParams& b = u.b;
  ASSERT_NE(bwd->key_tile, nullptr);
  const int tile = bwd->key_tile(b), n_kb = (d.S_k + tile - 1) / tile, tiles = d.B * d.H_kv * n_kb;
  ASSERT_EQ(tile, 128);
  ASSERT_EQ(n_kb, 3);
  // dQ into a caller's accumulator (as in a ring), where both launches add in turn; dK and dV fp32.
  b.grads_f32 = true;
  const int rows = (d.S_q + kDqAccumSpare + kDqAccumRows - 1) / kDqAccumRows * kDqAccumRows;
  const int64_t n_acc = int64_t(d.B) * d.H * rows * d.D;
  DeviceBuffer dq(n_acc * 4), dk(u.nk * 4), dv(u.nk * 4);
  b.dq_accum = static_cast<float*>(dq.get()), b.dq_accum_rows = rows, b.dq_accum_row0 = 0;
  b.dk = dk.get(), b.dv = dv.get();
  // Runs the listed ranges in order into fresh buffers (dQ's accumulator zeroed, dK and dV NaN).
  auto run = [&](std::vector<std::pair<int, int>> ranges) {
    CUDA_CHECK(cudaMemset(dq.get(), 0, n_acc * 4));
    CUDA_CHECK(cudaMemset(dk.get(), 0xff, u.nk * 4));
    CUDA_CHECK(cudaMemset(dv.get(), 0xff, u.nk * 4));
    for (const auto& [lo, hi] : ranges) {
      b.tiles_begin = lo, b.tiles_end = hi;
      bwd->bwd(b, u.ctx);
    }
    CUDA_CHECK(cudaStreamSynchronize(u.stream));
    return std::vector<std::vector<float>>{download_f32(dq), download_f32(dk), download_f32(dv)};
  };
  const auto whole = run({{0, 0}});
  const char* names[] = {"dQ", "dK", "dV"};
  for (int cut : {n_kb + n_kb - 1, 2 * n_kb}) {  // inside (batch 0, kv head 1); batch 1's first tile
    const auto parts = run({{0, cut}, {cut, tiles}});
    for (int t = 0; t < 3; ++t)
      for (size_t i = 0; i < whole[t].size(); ++i)
        ASSERT_EQ(std::memcmp(&parts[t][i], &whole[t][i], 4), 0)
            << names[t] << " element " << i << ", tiles cut at " << cut << ": " << parts[t][i] << " vs " << whole[t][i];
  }
  // The tiles from n_kb + 1 on: (batch 0, kv head 0) and the first tile of kv head 1 unwritten.
  const auto part = run({{n_kb + 1, tiles}});
  for (int t = 1; t < 3; ++t)
    for (int64_t bh = 0; bh < int64_t(d.B) * d.H_kv; ++bh)
      for (int j = 0; j < d.S_k; ++j) {
        const int64_t i = (bh * d.S_k + j) * d.D;
        const bool mine = bh * n_kb + j / tile >= n_kb + 1;
        ASSERT_EQ(std::isnan(part[t][i]), !mine) << names[t] << " (batch, kv head) " << bh << " key " << j;
        if (mine) {
          ASSERT_EQ(std::memcmp(&part[t][i], &whole[t][i], 4), 0) << names[t] << " key " << j;
        }
      }
  // Outside the tiles: refused before any work.
  b.tiles_begin = 0, b.tiles_end = tiles + 1;
  EXPECT_THROW(bwd->bwd(b, u.ctx), RuntimeError);
}

INSTANTIATE_TEST_SUITE_P(Shapes, HopperFp32Gradients,
                         testing::Values(Fp32Case{64, false}, Fp32Case{64, true}, Fp32Case{128, false},
                                         Fp32Case{128, true}),
                         [](const testing::TestParamInfo<Fp32Case>& i) {
                           return "D" + std::to_string(i.param.D) + (i.param.causal ? "_causal" : "");
                         });

}  // namespace
}  // namespace flashattn
