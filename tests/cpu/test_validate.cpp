// The --check machinery: error metrics, the tolerance rules and row sampling.
#include <gtest/gtest.h>

#include <cmath>
#include <set>

#include "array.h"
#include "validate.h"

namespace flashattn {
namespace {

TEST(CompareValues, ReportsAbsoluteRelativeAndL2Errors) {
  const std::vector<double> want = {1, 2, 3, 4};
  const std::vector<double> got = {1, 2, 3.5, 4};
  ErrorStats e = compare_values(got, want, 2, 0.1);
  EXPECT_EQ(e.count, 4);
  EXPECT_DOUBLE_EQ(e.max_abs, 0.5);
  EXPECT_DOUBLE_EQ(e.mean_abs, 0.125);
  EXPECT_DOUBLE_EQ(e.mse, 0.0625);
  EXPECT_NEAR(e.max_rel, 0.5 / 3, 1e-15);
  EXPECT_NEAR(e.rel_l2, 0.5 / std::sqrt(30.0), 1e-15);
  ASSERT_EQ(e.first_mismatches.size(), 1u);
  EXPECT_EQ(e.first_mismatches[0].row, 1);
  EXPECT_EQ(e.first_mismatches[0].col, 0);
}

TEST(CompareValues, NanWhereTheReferenceIsFiniteIsCounted) {
  ErrorStats e = compare_values({1, NAN}, {1, 2}, 1, 1e-3);
  EXPECT_EQ(e.nonfinite, 1);
}

TEST(CompareValues, MinusInfinityMustMatchExactly) {
  EXPECT_EQ(compare_values({-INFINITY, 1}, {-INFINITY, 1}, 1, 1e-3).nonfinite, 0);
  EXPECT_EQ(compare_values({0.0, 1}, {-INFINITY, 1}, 1, 1e-3).nonfinite, 1);
}

TEST(CompareValues, AllZeroReferenceAndOutputIsExact) {
  EXPECT_EQ(compare_values({0, 0}, {0, 0}, 1, 0).rel_l2, 0.0);
  EXPECT_GT(compare_values({0, 1e-3}, {0, 0}, 1, 0).rel_l2, 1.0);
}

std::vector<std::pair<std::string, ErrorStats>> one(const char* name, double max_abs, double rel_l2) {
  ErrorStats e;
  e.count = 1;
  e.max_abs = max_abs;
  e.rel_l2 = rel_l2;
  e.ref_max_abs = 1;
  e.ref_rms = 1;
  return {{name, e}};
}

TEST(Judge, Fp32UsesRelativeL2OfOneInAHundredThousand) {
  EXPECT_TRUE(judge(one("O", 1, 0.9e-5), DType::F32, nullptr).passed);
  EXPECT_FALSE(judge(one("O", 1, 1.1e-5), DType::F32, nullptr).passed);
}

TEST(Judge, Fp32OutputThatIsZeroBySymmetryIsHeldToAnAbsoluteRmsError) {
  ErrorStats e = compare_values({3e-7, -2e-7}, {0, 0}, 1, 1e-3);
  EXPECT_TRUE(judge({{"dK", e}}, DType::F32, nullptr).passed);
  e = compare_values({3e-5, -2e-5}, {0, 0}, 1, 1e-3);
  EXPECT_FALSE(judge({{"dK", e}}, DType::F32, nullptr).passed);
}

// A baseline error of 1e-3 against max|ref| = 1 is within bf16's bound (2 x 2^-7 x 1 = 0.0156).
TEST(Judge, HalfPrecisionAllowsTwiceTheBaselineErrorForOutputs) {
  auto base = one("O", 1e-3, 0);
  EXPECT_TRUE(judge(one("O", 1.9e-3, 0), DType::BF16, &base).passed);
  EXPECT_FALSE(judge(one("O", 2.2e-3, 0), DType::BF16, &base).passed);
}

TEST(Judge, HalfPrecisionAllowsThreeTimesTheBaselineErrorForGradients) {
  auto base = one("dK", 1e-3, 0);  // fp16's bound: 2 x 2^-10 = 1.95e-3
  EXPECT_TRUE(judge(one("dK", 2.9e-3, 0), DType::F16, &base).passed);
  EXPECT_FALSE(judge(one("dK", 3.2e-3, 0), DType::F16, &base).passed);
}

TEST(Judge, ABaselineOutsideItsBoundFailsTheCheckAndSaysSo) {
  auto base = one("O", 0.05, 0);  // bf16 bound at max|ref| = 1: 2 x 2^-7 = 0.0156
  const CheckResult c = judge(one("O", 1e-4, 0), DType::BF16, &base);
  EXPECT_FALSE(c.passed);
  ASSERT_EQ(c.outputs.size(), 1u);
  EXPECT_FALSE(c.outputs[0].baseline_passed);
  EXPECT_NE(c.outputs[0].rule.find("baseline out of bounds"), std::string::npos) << c.outputs[0].rule;
  // The tolerance is capped at factor x bound (+ floor), never factor x the bad baseline.
  EXPECT_NEAR(c.outputs[0].tolerance, 2 * 2 * std::ldexp(1.0, -7) + 1e-6, 1e-12);
}

TEST(Judge, TheRecordNamesTheBaselineItsBoundAndTheTolerance) {
  auto base = one("lse", 2e-7, 0);
  const CheckResult c = judge(one("lse", 3e-7, 0), DType::F16, &base);
  EXPECT_TRUE(c.passed);
  EXPECT_EQ(c.baseline, "cpu-naive-fp16");
  EXPECT_DOUBLE_EQ(c.outputs[0].baseline, 2e-7);
  EXPECT_NEAR(c.outputs[0].baseline_bound, kLseBaselineBound * std::ldexp(1.0, -23), 1e-18);
  EXPECT_NEAR(c.outputs[0].tolerance, 2 * 2e-7 + 1e-6, 1e-18);
}

TEST(Judge, HalfPrecisionWithoutABaselineFallsBackToTheSanityBound) {
  const CheckResult c = judge(one("O", 1, 1e-3), DType::BF16, nullptr);
  EXPECT_EQ(c.outputs[0].metric, "rel_l2");
  EXPECT_NE(c.outputs[0].rule.find("no same-dtype baseline"), std::string::npos);
}

TEST(Judge, NonFiniteValuesFailRegardlessOfTheMetric) {
  auto errs = one("O", 0, 0);
  errs[0].second.nonfinite = 1;
  EXPECT_FALSE(judge(errs, DType::F32, nullptr).passed);
}

// The same-dtype baseline costs the sampled rows only, like the reference: a 131072-token problem
// is checked with memory linear in S (the old GPU baseline needed B·H·S² scores).
TEST(Baseline, LongSequencesAreCheckedOnSampledRowsWithinTheBound) {
  const Dims d{1, 4, 4, 131072, 131072, 8};
  const int64_t n = int64_t(d.B) * d.H * d.S_q * d.D;
  std::vector<double> q(n), k(n), v(n);
  uint64_t x = 12345;
  auto next = [&] {  // a small LCG: values in [-1, 1), exact in bf16 after rounding below
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    return std::ldexp(double(int64_t(x >> 40) - (1 << 23)), -23);
  };
  for (auto* a : {&q, &k, &v})
    for (double& e : *a) e = double(bf16_bits_to_float(float_to_bf16_bits(float(next()))));
  RefInputs in;
  in.dims = d;
  in.scale = 1.0 / std::sqrt(8.0);
  in.causal = true;
  in.q = q.data(), in.k = k.data(), in.v = v.data();
  const RowSelection sel = select_rows(d, /*backward=*/false, 1e8, 3);
  EXPECT_EQ(sel.q_rows.size(), 256u);
  const ReferenceRows ref = compute_reference(in, sel, false);
  const OutputErrors base = measure_errors(compute_baseline(in, sel, false, DType::BF16), ref, d.D);
  const CheckResult c = judge(base, DType::BF16, &base);  // the baseline judged as a kernel: within its own rule
  for (const OutputCheck& o : c.outputs) EXPECT_TRUE(o.baseline_passed) << o.name << ": " << o.rule;
}

TEST(SelectRows, SmallProblemsCheckEveryRow) {
  Dims d{2, 4, 2, 33, 47, 16};
  RowSelection s = select_rows(d, true, 1e9, 1);
  EXPECT_EQ(static_cast<int64_t>(s.q_rows.size()), s.q_total);
  EXPECT_EQ(static_cast<int64_t>(s.k_rows.size()), s.k_total);
}

TEST(SelectRows, LargeProblemsSampleDistinctRowsIncludingTheEnds) {
  Dims d{1, 16, 16, 16384, 16384, 128};
  RowSelection s = select_rows(d, true, 4e9, 7);
  EXPECT_LT(static_cast<int64_t>(s.q_rows.size()), s.q_total);
  EXPECT_GE(s.q_rows.size(), 256u);
  std::set<std::tuple<int, int, int>> seen;
  for (const RowId& r : s.q_rows) seen.insert({r.b, r.h, r.i});
  EXPECT_EQ(seen.size(), s.q_rows.size());
  EXPECT_TRUE(seen.count({0, 0, 0}));
  EXPECT_TRUE(seen.count({0, 15, 16383}));
  EXPECT_FALSE(s.k_rows.empty());
  // Same seed, same rows.
  RowSelection again = select_rows(d, true, 4e9, 7);
  ASSERT_EQ(again.q_rows.size(), s.q_rows.size());
  EXPECT_EQ(again.q_rows[10].i, s.q_rows[10].i);
}

}  // namespace
}  // namespace flashattn
