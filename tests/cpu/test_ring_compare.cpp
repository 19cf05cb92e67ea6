// The ring's comparison with one GPU (ring_run.cpp): a one-ulp parting in the output's dtype is
// rounding, anything beyond it is held to twice the check's tolerance (each run is within the
// tolerance of the truth).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "ring.h"

namespace flashattn {
namespace {

HostArray bf16_row(std::initializer_list<float> xs) {
  HostArray a(DType::BF16, {static_cast<int64_t>(xs.size())});
  int i = 0;
  for (float x : xs) {
    const uint16_t b = float_to_bf16_bits(x);
    std::memcpy(a.bytes.data() + 2 * i++, &b, 2);
  }
  return a;
}

RunRecord judged(const HostArray& ring, const HostArray& one, double tolerance) {
  KernelOutputs a, b;
  a.o = ring, b.o = one;
  RunRecord rec;
  rec.ring.emplace();
  compare_ring_outputs(a, b, &*rec.ring);
  rec.check.performed = true;
  OutputCheck o;
  o.name = "O";
  o.metric = "max_abs";
  o.tolerance = tolerance;
  rec.check.outputs.push_back(o);
  judge_ring_vs_one_gpu(rec);
  return rec;
}

TEST(RingCompare, OneUlpInTheOutputDtypeIsRounding) {
  // 1.0 and the next bf16 above it (1 + 2^-7): one ulp apart, far beyond a 1e-4 tolerance.
  const RunRecord r = judged(bf16_row({1.0f, 0.5f}), bf16_row({1.0078125f, 0.5f}), 1e-4);
  ASSERT_EQ(r.ring->vs_one_gpu.size(), 1u);
  EXPECT_EQ(r.ring->vs_one_gpu[0].metric, "max_abs_beyond_1ulp");
  EXPECT_DOUBLE_EQ(r.ring->vs_one_gpu[0].max_abs, 0.0078125);
  EXPECT_TRUE(r.check.passed);
  EXPECT_FALSE(r.ring->bitwise_vs_one_gpu);
}

TEST(RingCompare, TwoUlpsFailBeyondTheTolerance) {
  const RunRecord r = judged(bf16_row({1.0f}), bf16_row({1.015625f}), 1e-4);
  EXPECT_FALSE(r.check.passed);
  EXPECT_DOUBLE_EQ(r.ring->vs_one_gpu[0].measured, 0.0078125);  // the second ulp
  EXPECT_FALSE(r.notes.empty());
}

TEST(RingCompare, BeyondOneUlpIsHeldToTwiceTheTolerance) {
  // 1.0 against 1 + 2^-6: two ulps, 0.0078125 beyond one. Two correct runs may part by twice the
  // check's tolerance: within 2 x 0.004 passes, beyond 2 x 0.0039 fails.
  const RunRecord pass = judged(bf16_row({1.0f}), bf16_row({1.015625f}), 0.004);
  EXPECT_TRUE(pass.check.passed);
  EXPECT_DOUBLE_EQ(pass.ring->vs_one_gpu[0].tolerance, 0.008);
  const RunRecord fail = judged(bf16_row({1.0f}), bf16_row({1.015625f}), 0.0039);
  EXPECT_FALSE(fail.check.passed);
}

TEST(RingCompare, NonFiniteOnOneSideFails) {
  const RunRecord r = judged(bf16_row({1.0f, std::numeric_limits<float>::quiet_NaN()}), bf16_row({1.0f, 2.0f}), 1.0);
  EXPECT_FALSE(r.check.passed);
}

TEST(RingCompare, IdenticalIsBitwise) {
  const RunRecord r = judged(bf16_row({3.0f, -0.25f}), bf16_row({3.0f, -0.25f}), 1e-6);
  EXPECT_TRUE(r.check.passed);
  EXPECT_TRUE(r.ring->bitwise_vs_one_gpu);
  EXPECT_DOUBLE_EQ(r.ring->max_abs_vs_one_gpu(), 0.0);
}

TEST(RingCompare, EveryChunkOfALongOutputCounts) {
  // Over three chunks of the comparison's 2^20 elements: a difference in the last one is found.
  HostArray a(DType::BF16, {3 << 20}), b(DType::BF16, {3 << 20});
  const uint16_t one = float_to_bf16_bits(1.0f), two = float_to_bf16_bits(2.0f);
  for (int64_t i = 0; i < a.numel(); ++i) {
    std::memcpy(a.bytes.data() + 2 * i, &one, 2);
    std::memcpy(b.bytes.data() + 2 * i, &one, 2);
  }
  std::memcpy(b.bytes.data() + 2 * (a.numel() - 1), &two, 2);
  const RunRecord r = judged(a, b, 1e-3);
  EXPECT_FALSE(r.check.passed);
  EXPECT_DOUBLE_EQ(r.ring->vs_one_gpu[0].max_abs, 1.0);
  EXPECT_NEAR(r.ring->vs_one_gpu[0].rel_l2, 1.0 / std::sqrt(double(3 << 20) + 3), 1e-12);
}

}  // namespace
}  // namespace flashattn
