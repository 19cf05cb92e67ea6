// GPU test matrix, derived from the kernel registry: every registered GPU kernel x mode x dtype x
// head dim it declares, on awkward shapes (S = 1, 17, 100, 1023 vs 1024, S_q != S_k with causal,
// GQA, window, key padding, additive mask, fully masked rows, bshd, and S = 4096 and 8192 checked
// on sampled rows), checked against the fp64 cpu reference with outputs poisoned (NaN) before the
// run. A case whose features the kernel does not
// declare is skipped, not failed. Exits 77 (ctest: skipped) when no CUDA device is present.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "device_info.h"
#include "flashattn/registry.h"
#include "random.h"
#include "run.h"
#include "scoped_env.h"

namespace flashattn {
namespace {

struct Shape {
  int B, H, H_kv, S_q, S_k;
  bool causal = false;
  int wl = -1, wr = -1;
  bool padding = false;  // seqlens_k with a 0 and a short length
  bool mask = false;     // additive mask with -inf entries and fully masked rows
  bool bshd = false;
  const char* tag = "";
};

struct Case {
  const KernelMode* entry;
  DType dtype;
  int D;
  Shape s;
};

// Head dims tried for kernels that accept any D (FlashAttention suite's list, trimmed).
const std::vector<int> kAnyHeadDims = {32, 40, 59, 64, 80, 96, 111, 128, 160, 256};

const std::vector<Shape>& shape_matrix() {
  static const std::vector<Shape> shapes = [] {
    std::vector<Shape> v;
    v.push_back({1, 2, 2, 1, 1, false, -1, -1, false, false, false, "s1"});
    v.push_back({2, 2, 2, 17, 17, false, -1, -1, false, false, false, "s17"});
    v.push_back({1, 3, 3, 100, 100, true, -1, -1, false, false, false, "s100_causal"});
    v.push_back({1, 2, 2, 1023, 1024, false, -1, -1, false, false, false, "s1023x1024"});
    v.push_back({1, 2, 2, 1024, 1023, true, -1, -1, false, false, false, "s1024x1023_causal"});
    v.push_back({1, 2, 2, 113, 203, true, -1, -1, false, false, false, "s113x203_causal"});
    v.push_back({1, 2, 2, 203, 113, true, -1, -1, false, false, false, "s203x113_causal"});
    v.push_back({2, 2, 2, 1, 239, true, -1, -1, false, false, false, "s1x239_causal"});
    v.push_back({1, 2, 2, 3, 799, false, -1, -1, false, false, false, "s3x799"});
    v.push_back({1, 2, 2, 127, 513, false, -1, -1, false, false, false, "s127x513"});
    v.push_back({2, 6, 2, 128, 217, true, -1, -1, false, false, false, "gqa6_2_causal"});
    v.push_back({1, 6, 1, 108, 256, false, -1, -1, false, false, false, "mqa6_1"});
    v.push_back({1, 2, 2, 256, 512, false, 32, 16, false, false, false, "window32_16"});
    v.push_back({1, 2, 2, 300, 300, true, 64, -1, false, false, false, "window64_causal"});
    v.push_back({3, 2, 2, 96, 160, false, -1, -1, true, false, false, "padding"});
    v.push_back({2, 2, 2, 77, 130, false, -1, -1, false, true, false, "mask"});
    v.push_back({2, 4, 2, 65, 140, true, -1, -1, false, false, true, "bshd_gqa_causal"});
    // Long sequences, checked on sampled rows (kLongCheckBudget below): more query rows than the
    // budget covers, and for backward every key row of one sampled (batch, kv head) group.
    v.push_back({2, 4, 4, 4096, 4096, true, -1, -1, false, false, false, "s4096_causal_sampled"});
    v.push_back({1, 4, 2, 8192, 8192, false, -1, -1, false, false, false, "s8192_gqa_sampled"});
    return v;
  }();
  return shapes;
}

std::vector<Case> all_cases() {
  std::vector<Case> cases;
  const DType dtypes[] = {DType::F32, DType::F16, DType::BF16};
  for (const KernelMode* e : Registry::entries()) {
    if (!e->gpu || (e->mode != Mode::Forward && e->mode != Mode::Backward)) continue;
    for (DType t : dtypes) {
      if (!(e->dtypes & dtype_bit(t))) continue;
      std::vector<int> dims = e->head_dims;
      if (dims.empty())
        for (int d : kAnyHeadDims)
          if (e->max_head_dim == 0 || d <= e->max_head_dim) dims.push_back(d);
      // Every head dim on one unequal, causal shape and one plain shape...
      for (int D : dims) {
        cases.push_back({e, t, D, {1, 2, 2, 113, 203, false, -1, -1, false, false, false, "s113x203"}});
        cases.push_back({e, t, D, {2, 2, 1, 128, 100, true, -1, -1, false, false, false, "s128x100_causal_mqa"}});
      }
      // ...and every awkward shape at one representative head dim.
      int D0 = dims.front();
      for (int d : dims)
        if (d == 64) D0 = 64;
      for (const Shape& s : shape_matrix()) cases.push_back({e, t, D0, s});
    }
  }
  return cases;
}

// gtest prints a failing parameter with this instead of its bytes.
void PrintTo(const Case& c, std::ostream* os) {
  *os << c.entry->kernel << " " << mode_name(c.entry->mode) << " " << dtype_name(c.dtype) << " D=" << c.D
      << " B=" << c.s.B << " H=" << c.s.H << " H_kv=" << c.s.H_kv << " S_q=" << c.s.S_q << " S_k=" << c.s.S_k
      << (c.s.causal ? " causal" : "") << " window=(" << c.s.wl << "," << c.s.wr << ")"
      << (c.s.padding ? " padding" : "") << (c.s.mask ? " mask" : "") << (c.s.bshd ? " bshd" : "");
}

std::string case_name(const testing::TestParamInfo<Case>& info) {
  const Case& c = info.param;
  std::string n = c.entry->kernel + "_" + mode_name(c.entry->mode) + "_" + dtype_name(c.dtype) + "_D" +
                  std::to_string(c.D) + "_" + c.s.tag;
  for (char& ch : n)
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  return n;
}

HostArray random_array(DType t, std::vector<int64_t> shape, uint64_t seed, uint64_t stream) {
  HostArray f(DType::F64, std::move(shape));
  Rng rng(seed, stream);
  for (int64_t i = 0; i < f.numel(); ++i) f.data<double>()[i] = rng.normal();
  return convert(f, t);
}

RunInputs make_inputs(const Case& c, uint64_t seed) {
  const Shape& s = c.s;
  RunInputs in;
  Problem& p = in.problem;
  p.dims = {s.B, s.H, s.H_kv, s.S_q, s.S_k, c.D};
  p.dtype = c.dtype;
  p.layout = s.bshd ? Layout::BSHD : Layout::BHSD;
  p.scale = 1.0 / std::sqrt(double(c.D));
  p.causal = s.causal;
  p.window_left = s.wl;
  p.window_right = s.wr;
  auto shape = [&](int H, int S) {
    return s.bshd ? std::vector<int64_t>{s.B, S, H, c.D} : std::vector<int64_t>{s.B, H, S, c.D};
  };
  in.q = random_array(c.dtype, shape(s.H, s.S_q), seed, 1);
  in.k = random_array(c.dtype, shape(s.H_kv, s.S_k), seed, 2);
  in.v = random_array(c.dtype, shape(s.H_kv, s.S_k), seed, 3);
  in.dout = random_array(c.dtype, shape(s.H, s.S_q), seed, 4);
  if (s.padding) {
    HostArray lens(DType::I32, {s.B});
    for (int b = 0; b < s.B; ++b) lens.data<int32_t>()[b] = b == 0 ? 0 : (b == 1 ? s.S_k / 3 + 1 : s.S_k);
    in.seqlens_k = lens;
    p.has_padding = true;
  }
  if (s.mask) {
    // [B, 1, S_q, S_k] (broadcast over heads): N(0,1) bias, ~10% -inf, and fully masked rows 0 and 5.
    HostArray m(DType::F32, {s.B, 1, s.S_q, s.S_k});
    Rng rng(seed, 5);
    float* mp = m.data<float>();
    for (int b = 0; b < s.B; ++b)
      for (int i = 0; i < s.S_q; ++i)
        for (int j = 0; j < s.S_k; ++j) {
          const double u = rng.uniform();
          float val = static_cast<float>(rng.normal());
          if (u < 0.1 || i == 0 || i == 5) val = -INFINITY;
          mp[(int64_t(b) * s.S_q + i) * s.S_k + j] = val;
        }
    in.mask = m;
    p.has_mask = true;
  }
  return in;
}

int g_device = 0;

// The long shapes check sampled rows with a smaller reference budget than --check's (8e9
// multiply-adds): the matrix has dozens of them, and the sample still spans every head.
constexpr int64_t kLongScores = int64_t(4096) * 4096;
constexpr double kLongCheckBudget = 2e9;

// One untimed run of entry with --check (on sampled rows, at kLongCheckBudget, where `sampled`).
RunRecord run_checked(const KernelMode& entry, RunInputs in, bool sampled) {
  SessionOptions so;
  so.device = g_device;
  so.timing.warmup = 0;
  so.timing.repeat = 1;
  so.timing.flush_l2 = false;
  so.check = true;
  if (sampled) so.check_budget_macs = kLongCheckBudget;
  Session session(std::move(in), so);
  return session.run(entry);
}

void expect_outputs_pass(const RunRecord& r) {
  for (const OutputCheck& o : r.check.outputs) {
    EXPECT_TRUE(o.passed) << o.name << ": " << o.metric << " " << o.measured << " vs tolerance " << o.tolerance
                          << " [" << o.rule << "], nonfinite " << o.err.nonfinite << ", max_abs " << o.err.max_abs
                          << ", rel_l2 " << o.err.rel_l2;
  }
}

class KernelMatrix : public testing::TestWithParam<Case> {};

TEST_P(KernelMatrix, MatchesReference) {
  const Case& c = GetParam();
  RunInputs in = make_inputs(c, 1234);
  const std::string why = why_unsupported(*c.entry, in.problem, query_device(g_device).sm());
  if (!why.empty()) GTEST_SKIP() << why;
  const bool long_case = int64_t(c.s.S_q) * c.s.S_k >= kLongScores;
  const RunRecord r = run_checked(*c.entry, std::move(in), long_case);
  ASSERT_TRUE(r.check.performed);
  if (long_case) {
    EXPECT_LT(r.check.rows_checked, r.check.rows_total) << "a long case must sample its rows";
  }
  expect_outputs_pass(r);
}

INSTANTIATE_TEST_SUITE_P(Registry, KernelMatrix, testing::ValuesIn(all_cases()), case_name);

// hopper's backward with its CTAs started in phase (FLASHATTN_HOPPER_BWD_PHASE=1; by default only
// where a head's Q, dO and dQ outgrow L2, longer than any shape here): grids of more CTAs than SMs,
// so later CTAs start partway through their step lists and wrap around, with causal masks, GQA,
// S_q != S_k, a window, key padding and bshd; checked as the matrix is.
TEST(HopperPhasedBackward, MatchesReference) {
  const KernelMode* e = Registry::find("hopper", Mode::Backward);
  if (e == nullptr) GTEST_SKIP() << "hopper is not built";
  const ScopedEnv phased("FLASHATTN_HOPPER_BWD_PHASE", true, "1");
  const Shape shapes[] = {{2, 4, 4, 4096, 4096, true, -1, -1, false, false, false, "s4096_causal"},
                          {2, 8, 4, 2051, 3000, false, -1, -1, false, false, false, "gqa8_4_s2051x3000"},
                          {2, 8, 2, 3000, 2051, true, -1, -1, false, false, false, "gqa8_2_s3000x2051_causal"},
                          {4, 4, 4, 1500, 2500, false, 300, 200, false, false, false, "window300_200"},
                          {8, 4, 4, 700, 1800, false, -1, -1, true, false, false, "padding"},
                          {2, 8, 4, 1100, 1700, true, -1, -1, false, false, true, "bshd_gqa_causal"}};
  for (const Shape& shape : shapes) {
    SCOPED_TRACE(shape.tag);
    Case c{e, DType::BF16, 128, shape};
    RunInputs in = make_inputs(c, 4321);
    if (const std::string why = why_unsupported(*e, in.problem, query_device(g_device).sm()); !why.empty())
      GTEST_SKIP() << why;
    const RunRecord r = run_checked(*e, std::move(in), /*sampled=*/true);
    ASSERT_TRUE(r.check.performed);
    expect_outputs_pass(r);
  }
}

// hopper's forward with its 192-row tiles forced (FLASHATTN_HOPPER_D64_ROWS / _D128_ROWS=192; by
// default D128 takes them only where both lengths are 8192 or more): every awkward shape of the
// matrix at both head dims that have them, in both 16-bit dtypes, checked as the matrix is.
TEST(HopperWideForward, MatchesReference) {
  const KernelMode* e = Registry::find("hopper", Mode::Forward);
  if (e == nullptr) GTEST_SKIP() << "hopper is not built";
  const ScopedEnv d64("FLASHATTN_HOPPER_D64_ROWS", true, "192");
  const ScopedEnv d128("FLASHATTN_HOPPER_D128_ROWS", true, "192");
  int ran = 0;
  for (const int D : {64, 128}) {
    for (const DType t : {DType::BF16, DType::F16}) {
      for (const Shape& shape : shape_matrix()) {
        SCOPED_TRACE(std::string(dtype_name(t)) + " D" + std::to_string(D) + " " + shape.tag);
        Case c{e, t, D, shape};
        RunInputs in = make_inputs(c, 2468);
        if (!why_unsupported(*e, in.problem, query_device(g_device).sm()).empty()) continue;  // the additive mask
        const RunRecord r = run_checked(*e, std::move(in), int64_t(shape.S_q) * shape.S_k >= kLongScores);
        ASSERT_TRUE(r.check.performed);
        expect_outputs_pass(r);
        ++ran;
      }
    }
  }
  if (ran == 0) GTEST_SKIP() << "hopper runs none of these here";
}

// Kernels that declare themselves bitwise reproducible (or that have a deterministic path, taken
// here) give bitwise-identical outputs run after run, and the deterministic path passes the same
// check against the reference as the default one (GQA with causal, key padding, a window).
class Determinism : public testing::TestWithParam<const KernelMode*> {};

TEST_P(Determinism, RepeatedRunsAreBitwiseIdenticalAndCorrect) {
  const KernelMode* e = GetParam();
  DType t = (e->dtypes & dtype_bit(DType::BF16)) ? DType::BF16 : DType::F32;
  int D = e->head_dims.empty() ? 64 : e->head_dims.front();
  for (int d : e->head_dims)
    if (d == 64) D = 64;
  const Shape shapes[] = {{2, 4, 2, 200, 333, true, -1, -1, false, false, false, "det"},
                          {3, 2, 2, 96, 160, false, -1, -1, true, false, false, "det_padding"},
                          {1, 2, 2, 300, 300, true, 64, -1, false, false, false, "det_window"}};
  for (const Shape& shape : shapes) {
    SCOPED_TRACE(shape.tag);
    Case c{e, t, D, shape};
    RunInputs in = make_inputs(c, 99);
    if (!why_unsupported(*e, in.problem, query_device(g_device).sm()).empty()) continue;  // a feature it lacks
    SessionOptions so;
    so.device = g_device;
    so.timing.warmup = 0;
    so.timing.repeat = 1;
    so.deterministic = true;
    so.check = true;
    Session session(std::move(in), so);
    RunRecord a = session.run(*e), b = session.run(*e);
    auto same = [](const std::optional<HostArray>& x, const std::optional<HostArray>& y) {
      return x.has_value() == y.has_value() && (!x || x->bytes == y->bytes);
    };
    EXPECT_TRUE(same(a.outputs.o, b.outputs.o) && same(a.outputs.lse, b.outputs.lse));
    EXPECT_TRUE(same(a.outputs.dq, b.outputs.dq) && same(a.outputs.dk, b.outputs.dk) &&
                same(a.outputs.dv, b.outputs.dv));
    ASSERT_TRUE(a.check.performed);
    for (const OutputCheck& o : a.check.outputs)
      EXPECT_TRUE(o.passed) << o.name << ": " << o.metric << " " << o.measured << " vs tolerance " << o.tolerance;
  }
}

std::vector<const KernelMode*> deterministic_entries() {
  std::vector<const KernelMode*> v;
  for (const KernelMode* e : Registry::entries())
    if (e->gpu && (e->bitwise_reproducible || e->has_deterministic_path) && e->mode != Mode::Decode) v.push_back(e);
  return v;
}

INSTANTIATE_TEST_SUITE_P(Registry, Determinism, testing::ValuesIn(deterministic_entries()),
                         [](const testing::TestParamInfo<const KernelMode*>& i) {
                           return i.param->kernel + "_" + mode_name(i.param->mode);
                         });

}  // namespace
}  // namespace flashattn

int main(int argc, char** argv) {
  std::string why;
  bool list_only = false;  // listing the matrix needs no GPU
  for (int i = 1; i < argc; ++i) list_only = list_only || std::string(argv[i]) == "--gtest_list_tests";
  if (!list_only && flashattn::cuda_device_count(&why) == 0) {
    std::printf("GPU tests skipped: %s\n", why.c_str());
    return 77;  // ctest SKIP_RETURN_CODE
  }
  if (const char* dev = std::getenv("FLASHATTN_TEST_DEVICE")) flashattn::g_device = std::atoi(dev);
  testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
