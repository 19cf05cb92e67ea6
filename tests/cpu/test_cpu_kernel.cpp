// The `cpu` kernel (the reference behind FwdParams/BwdParams, any strides, rounding once), checked
// against the fp64 reference on the cases of reference_case.h.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "array.h"
#include "flashattn/error.h"
#include "flashattn/registry.h"
#include "reference.h"
#include "reference_case.h"

namespace flashattn {
namespace {

using namespace test;  // NOLINT: the cases of reference_case.h

TEST(CpuKernel, RegistersForwardAndBackwardWithEveryFeatureAndAnyHeadDim) {
  for (Mode mode : {Mode::Forward, Mode::Backward}) {
    const KernelMode* m = Registry::find("cpu", mode);
    ASSERT_NE(m, nullptr) << mode_name(mode);
    EXPECT_FALSE(m->gpu);
    EXPECT_EQ(m->rung, 0);
    EXPECT_EQ(m->features, kAllFeatures);
    for (DType t : {DType::F32, DType::F16, DType::BF16, DType::F64}) EXPECT_TRUE(m->dtypes & dtype_bit(t));
    EXPECT_TRUE(m->head_dims.empty());
    EXPECT_EQ(m->max_head_dim, 0);
    EXPECT_EQ(m->fwd_workspace, nullptr);
    EXPECT_EQ(m->bwd_workspace, nullptr);
    EXPECT_EQ(mode == Mode::Forward, m->fwd != nullptr);
    EXPECT_EQ(mode == Mode::Backward, m->bwd != nullptr);
  }
}

// A [B, heads, S, D] tensor stored as bshd with padded rows and batches, in `t`.
struct Strided {
  std::vector<uint8_t> bytes;
  Strides st;
  DType t;
  int B, heads, S, D;
  Strided(DType dt, int B_, int heads_, int S_, int D_) : t(dt), B(B_), heads(heads_), S(S_), D(D_) {
    st.head = D + 1;                 // a gap after each head's row
    st.row = heads * st.head + 3;    // and after each token
    st.batch = S * st.row + 5;       // and after each batch
    bytes.assign(static_cast<size_t>(B * st.batch) * dtype_size(t), 0xff);  // NaN-ish poison
  }
  int64_t at(int b, int h, int i, int e) const { return b * st.batch + h * st.head + i * st.row + e; }
  void set(int b, int h, int i, int e, double x) {
    const int64_t n = at(b, h, i, e);
    if (t == DType::F64) reinterpret_cast<double*>(bytes.data())[n] = x;
    else if (t == DType::F32) reinterpret_cast<float*>(bytes.data())[n] = static_cast<float>(x);
    else if (t == DType::F16) reinterpret_cast<uint16_t*>(bytes.data())[n] = float_to_half_bits(static_cast<float>(x));
  }
  double get(int b, int h, int i, int e) const {
    const int64_t n = at(b, h, i, e);
    if (t == DType::F64) return reinterpret_cast<const double*>(bytes.data())[n];
    if (t == DType::F32) return reinterpret_cast<const float*>(bytes.data())[n];
    return half_bits_to_float(reinterpret_cast<const uint16_t*>(bytes.data())[n]);
  }
  uint16_t bits(int b, int h, int i, int e) const { return reinterpret_cast<const uint16_t*>(bytes.data())[at(b, h, i, e)]; }
  // Stores `x` (contiguous bhsd) and replaces it with the values as stored.
  void fill(std::vector<double>& x) {
    size_t n = 0;
    for (int b = 0; b < B; ++b)
      for (int h = 0; h < heads; ++h)
        for (int i = 0; i < S; ++i)
          for (int e = 0; e < D; ++e, ++n) {
            set(b, h, i, e, x[n]);
            x[n] = get(b, h, i, e);
          }
  }
};

// Runs the cpu kernel on case `c` stored in dtype `t` (c's data is replaced by the stored values).
struct KernelRun {
  Strided q, k, v, o, dout, dq, dk, dv;
  std::vector<uint8_t> lse;
  KernelRun(Case& c, DType t)
      : q(t, c.d.B, c.d.H, c.d.S_q, c.d.D), k(t, c.d.B, c.d.H_kv, c.d.S_k, c.d.D), v(k), o(q), dout(q), dq(q),
        dk(k), dv(k) {
    q.fill(c.q);
    k.fill(c.k);
    v.fill(c.v);
    dout.fill(c.dout);
    lse.resize(static_cast<size_t>(c.d.B) * c.d.H * c.d.S_q * (t == DType::F64 ? 8 : 4));
    BwdParams p;
    p.dtype = t;
    p.layout = Layout::BSHD;
    p.B = c.d.B, p.H = c.d.H, p.H_kv = c.d.H_kv, p.S_q = c.d.S_q, p.S_k = c.d.S_k, p.D = c.d.D;
    p.scale = static_cast<float>(c.scale);
    p.scale_f64 = c.scale;
    p.causal = c.causal;
    p.window_left = c.wl;
    p.window_right = c.causal ? (c.wr < 0 ? 0 : std::min(c.wr, 0)) : c.wr;  // folded, as the driver does
    const RefInputs in = c.inputs();
    p.seqlens_k = in.seqlens_k;
    p.mask = in.mask;
    p.q = q.bytes.data(), p.k = k.bytes.data(), p.v = v.bytes.data(), p.dout = dout.bytes.data();
    p.q_st = q.st, p.k_st = k.st, p.v_st = v.st, p.do_st = dout.st;
    p.o = o.bytes.data(), p.o_st = o.st, p.lse = lse.data();
    p.dq = dq.bytes.data(), p.dk = dk.bytes.data(), p.dv = dv.bytes.data();
    p.dq_st = dq.st, p.dk_st = dk.st, p.dv_st = dv.st;
    LaunchContext ctx;
    ctx.cpu_threads = 2;
    Registry::find("cpu", Mode::Forward)->fwd(p, ctx);
    Registry::find("cpu", Mode::Backward)->bwd(p, ctx);
  }
};

// Every element of `s` ([B, heads, S, D]) equals round(want) in s's dtype.
void expect_stored(const Strided& s, const std::vector<double>& want, const char* what) {
  size_t n = 0;
  for (int b = 0; b < s.B; ++b)
    for (int h = 0; h < s.heads; ++h)
      for (int i = 0; i < s.S; ++i)
        for (int e = 0; e < s.D; ++e, ++n) {
          const double w = s.t == DType::F32 ? static_cast<double>(static_cast<float>(want[n])) : want[n];
          EXPECT_EQ(s.get(b, h, i, e), w) << what << " (" << b << "," << h << "," << i << "," << e << ")";
        }
}

TEST(CpuKernel, Fp64BshdStridedGivesExactlyTheReference) {
  Case c = make_case(2, 6, 2, 7, 9, 5);
  c.causal = true;
  c.seqlens = {9, 3};
  add_mask(c, 1, 6, 7, 9);
  const KernelRun run(c, DType::F64);
  const Result want = run_reference(c);
  expect_stored(run.o, want.o, "O");
  expect_stored(run.dq, want.dq, "dQ");
  expect_stored(run.dk, want.dk, "dK");
  expect_stored(run.dv, want.dv, "dV");
  std::vector<double> lse(want.lse.size());
  std::memcpy(lse.data(), run.lse.data(), run.lse.size());
  EXPECT_EQ(lse, want.lse);
}

TEST(CpuKernel, Fp32OutputsAreTheReferenceOnStoredInputsRoundedOnce) {
  Case c = make_case(2, 4, 4, 6, 5, 8);
  c.wl = 1;
  c.wr = 2;
  c.seqlens = {5, 0};
  const KernelRun run(c, DType::F32);  // c now holds the fp32 values as stored
  const Result want = run_reference(c);
  expect_stored(run.o, want.o, "O");
  expect_stored(run.dq, want.dq, "dQ");
  expect_stored(run.dk, want.dk, "dK");
  expect_stored(run.dv, want.dv, "dV");
  const float* lse = reinterpret_cast<const float*>(run.lse.data());
  for (size_t n = 0; n < want.lse.size(); ++n) EXPECT_EQ(lse[n], static_cast<float>(want.lse[n])) << n;
}

// Correct fp16 rounding of x, found by comparing distances to the neighbouring fp16 values (ties to
// the even bit pattern): independent of the route the kernel takes.
uint16_t nearest_half(double x) {
  const uint16_t h0 = float_to_half_bits(static_cast<float>(x));
  uint16_t best = h0;
  for (int delta : {-1, 1}) {
    const uint16_t h = static_cast<uint16_t>(h0 + delta);
    const double dh = half_bits_to_float(h), db = half_bits_to_float(best);
    if (std::isnan(dh) || (std::signbit(dh) != std::signbit(x) && dh != 0.0)) continue;
    if (std::fabs(dh - x) < std::fabs(db - x) || (std::fabs(dh - x) == std::fabs(db - x) && (h & 1) == 0)) best = h;
  }
  return best;
}

TEST(CpuKernel, Fp16OutputsAreRoundedOnceFromDouble) {
  // Many output values, so that some lie just beside an fp16 tie, where rounding through float
  // first would go the wrong way.
  Case c = make_case(1, 2, 1, 8, 6, 2048, /*seed=*/3);
  c.scale = 0.05;
  const KernelRun run(c, DType::F16);
  const Result want = run_reference(c);
  int double_rounding_cases = 0;
  size_t n = 0;
  for (int h = 0; h < 2; ++h)
    for (int i = 0; i < 8; ++i)
      for (int e = 0; e < 2048; ++e, ++n) {
        const uint16_t expect = nearest_half(want.o[n]);
        if (float_to_half_bits(static_cast<float>(want.o[n])) != expect) ++double_rounding_cases;
        ASSERT_EQ(run.o.bits(0, h, i, e), expect) << "O(0," << h << "," << i << "," << e << ") = " << want.o[n];
      }
  EXPECT_GT(double_rounding_cases, 0) << "the data no longer exercises double rounding";
}

}  // namespace
}  // namespace flashattn
