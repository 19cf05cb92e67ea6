// NaN and infinity: the input scan behind --allow-nonfinite, and the --check path failing a
// kernel output with a NaN where the fp64 reference is finite.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "array.h"
#include "nonfinite.h"
#include "validate.h"

namespace flashattn {
namespace {

HostArray from(DType t, const std::vector<double>& v, std::vector<int64_t> shape) {
  HostArray f64(DType::F64, std::move(shape));
  for (size_t i = 0; i < v.size(); ++i) f64.data<double>()[i] = v[i];
  return t == DType::F64 ? f64 : convert(f64, t);
}

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

TEST(ScanNonFinite, CountsNanAndInfinityInEveryFloatDtype) {
  for (DType t : {DType::F32, DType::F16, DType::BF16, DType::F64}) {
    const HostArray a = from(t, {1, kNaN, -kInf, 2, kInf, kNaN, 0}, {7});
    const NonFiniteCount c = scan_nonfinite(a);
    EXPECT_EQ(c.nan, 2) << dtype_name(t);
    EXPECT_EQ(c.inf, 2) << dtype_name(t);
    EXPECT_EQ(c.first, 1) << dtype_name(t);
    EXPECT_EQ(c.total(), count_nonfinite(a)) << dtype_name(t);
  }
}

TEST(ScanNonFinite, LargestFiniteValuesAndSubnormalsAreFinite) {
  EXPECT_EQ(scan_nonfinite(from(DType::F16, {65504, -65504, 6e-8}, {3})).total(), 0);
  EXPECT_EQ(scan_nonfinite(from(DType::BF16, {3.38e38, 1e-40}, {2})).total(), 0);
  EXPECT_EQ(scan_nonfinite(from(DType::F32, {3.4e38, 1e-45}, {2})).total(), 0);
  EXPECT_EQ(scan_nonfinite(from(DType::F64, {1.7e308, 5e-324}, {2})).total(), 0);
}

TEST(ScanNonFinite, IntegerArraysHaveNone) {
  HostArray a(DType::I32, {4});
  a.data<int32_t>()[0] = -1;  // all bits set, which would be NaN in a float dtype
  EXPECT_EQ(scan_nonfinite(a).total(), 0);
  EXPECT_EQ(scan_nonfinite(a).first, -1);
}

TEST(ScanNonFinite, MessageNamesCountsAndTheFirstPosition) {
  std::vector<double> v(2 * 3 * 4 * 5, 0.0);
  v[1 * 60 + 2 * 5 + 3] = kNaN;  // [1, 0, 2, 3]
  v[119] = kInf;                 // [1, 2, 3, 4]
  const HostArray a = from(DType::F32, v, {2, 3, 4, 5});
  EXPECT_EQ(describe_nonfinite(scan_nonfinite(a), a.shape), "1 NaN and 1 Inf values (first at [1, 0, 2, 3])");
  EXPECT_EQ(describe_nonfinite(scan_nonfinite(from(DType::F32, {kInf}, {1})), {1}), "1 Inf value (first at [0])");
}

TEST(IndexStr, IsTheCOrderMultiIndex) {
  EXPECT_EQ(index_str({2, 3, 4}, 0), "[0, 0, 0]");
  EXPECT_EQ(index_str({2, 3, 4}, 23), "[1, 2, 3]");
  EXPECT_EQ(index_str({}, 0), "[]");
}

// With --allow-nonfinite the oracle must propagate NaN as the kernels do, not mistake a row of
// NaN scores for a fully masked row (O = 0, lse = -inf).
TEST(Reference, NanInAQueryRowMakesThatRowNan) {
  const Dims d{1, 1, 1, 3, 4, 2};
  std::vector<double> q = {0.1, 0.2, kNaN, 0.5, 0.3, -0.4}, k(8, 0.25), v(8, 1.0);
  RefInputs in;
  in.dims = d;
  in.scale = 1.0;
  in.q = q.data(), in.k = k.data(), in.v = v.data();
  in.threads = 1;
  std::vector<double> o(6), lse(3);
  reference_forward(in, o.data(), lse.data());
  EXPECT_TRUE(std::isfinite(o[0]) && std::isfinite(o[1]) && std::isfinite(lse[0]));
  EXPECT_TRUE(std::isnan(o[2]) && std::isnan(o[3]) && std::isnan(lse[1]));
  EXPECT_TRUE(std::isfinite(o[4]) && std::isfinite(lse[2]));
}

// The whole --check path without a GPU: a kernel output with one NaN where the fp64 reference is
// finite is counted and fails, even though every other value is exact.
TEST(CheckPath, NanInAKernelOutputFailsAgainstAFiniteReference) {
  const Dims d{1, 2, 2, 3, 4, 8};
  std::vector<double> q(size_t(d.B) * d.H * d.S_q * d.D), k(size_t(d.B) * d.H_kv * d.S_k * d.D), v(k.size());
  for (size_t i = 0; i < q.size(); ++i) q[i] = std::sin(0.3 * double(i));
  for (size_t i = 0; i < k.size(); ++i) k[i] = std::cos(0.7 * double(i)), v[i] = std::sin(1.1 * double(i));
  RefInputs in;
  in.dims = d;
  in.scale = 1.0 / std::sqrt(double(d.D));
  in.q = q.data(), in.k = k.data(), in.v = v.data();
  in.threads = 1;

  std::vector<double> o(q.size()), lse(size_t(d.B) * d.H * d.S_q);
  reference_forward(in, o.data(), lse.data());
  KernelOutputs out;
  out.o = from(DType::F64, o, {d.B, d.H, d.S_q, d.D});
  out.lse = from(DType::F64, lse, {d.B, d.H, d.S_q});
  const RowSelection sel = select_rows(d, /*backward=*/false, 1e12, 0);
  const ReferenceRows want = compute_reference(in, sel, /*backward=*/false);

  const CheckResult clean = judge(measure_errors(gather_rows(out, sel, d, Layout::BHSD), want, d.D), DType::F64,
                                  nullptr);
  EXPECT_TRUE(clean.passed);

  out.o->data<double>()[5] = kNaN;
  const auto errors = measure_errors(gather_rows(out, sel, d, Layout::BHSD), want, d.D);
  const CheckResult bad = judge(errors, DType::F64, nullptr);
  EXPECT_FALSE(bad.passed);
  for (const OutputCheck& c : bad.outputs) {
    if (c.name == "O") {
      EXPECT_EQ(c.err.nonfinite, 1);
      EXPECT_FALSE(c.passed);
    }
    if (c.name == "lse") {
      EXPECT_TRUE(c.passed);
    }
  }
}

}  // namespace
}  // namespace flashattn
