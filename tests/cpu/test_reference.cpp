// The fp64 reference, checked against a brute-force evaluation of the
// definitions in reference.h (full score matrix, softmax, P·V and the explicit backward formulas in
// long double) and against finite differences of L = sum(O * dO).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "array.h"
#include "flashattn/error.h"
#include "flashattn/registry.h"
#include "reference.h"
#include "reference_case.h"

namespace flashattn {
namespace {

using namespace test;  // NOLINT: the cases of reference_case.h

constexpr double kInf = std::numeric_limits<double>::infinity();

struct Brute {
  std::vector<long double> o, lse, dq, dk, dv;
};

// The definitions evaluated literally, with causal folded into the right window bound the way
// the driver folds it (so the reference's separate causal test is checked against it).
Brute brute_force(const Case& c) {
  const Dims& d = c.d;
  const int G = d.H / d.H_kv;
  const long off = static_cast<long>(d.S_k) - d.S_q;
  int right = c.wr;
  if (c.causal) right = right < 0 ? 0 : std::min(right, 0);
  Brute r;
  r.o.assign(c.q.size(), 0.0L);
  r.lse.assign(static_cast<size_t>(d.B) * d.H * d.S_q, -INFINITY);
  r.dq.assign(c.q.size(), 0.0L);
  r.dk.assign(c.k.size(), 0.0L);
  r.dv.assign(c.v.size(), 0.0L);
  auto qi = [&](int b, int h, int i) { return ((static_cast<size_t>(b) * d.H + h) * d.S_q + i) * d.D; };
  auto kj = [&](int b, int g, int j) { return ((static_cast<size_t>(b) * d.H_kv + g) * d.S_k + j) * d.D; };
  for (int b = 0; b < d.B; ++b) {
    const int len = c.seqlens.empty() ? d.S_k : c.seqlens[b];
    for (int h = 0; h < d.H; ++h) {
      const int g = h / G;
      for (int i = 0; i < d.S_q; ++i) {
        std::vector<long double> s(d.S_k, -INFINITY), p(d.S_k, 0.0L), dp(d.S_k, 0.0L);
        long double m = -INFINITY;
        for (int j = 0; j < d.S_k; ++j) {
          const long rel = j - (i + off);
          const bool vis = j < len && (c.wl < 0 || rel >= -c.wl) && (right < 0 || rel <= right);
          if (!vis) continue;
          long double acc = 0.0L;
          for (int e = 0; e < d.D; ++e) acc += static_cast<long double>(c.q[qi(b, h, i) + e]) * c.k[kj(b, g, j) + e];
          s[j] = c.scale * acc + (c.mask.empty() ? 0.0L : c.mask_at(b, h, i, j));
          m = std::max(m, s[j]);
        }
        if (m == -INFINITY) continue;  // O = 0, lse = -inf, no gradient
        long double sum = 0.0L;
        for (int j = 0; j < d.S_k; ++j) sum += std::exp(s[j] - m);
        const long double lse = m + std::log(sum);
        r.lse[(static_cast<size_t>(b) * d.H + h) * d.S_q + i] = lse;
        long double Di = 0.0L;  // D_i as sum_j P_ij dP_ij: equal to <dO_i, O_i>, computed differently
        for (int j = 0; j < d.S_k; ++j) {
          p[j] = std::exp(s[j] - lse);
          for (int e = 0; e < d.D; ++e) {
            r.o[qi(b, h, i) + e] += p[j] * c.v[kj(b, g, j) + e];
            dp[j] += static_cast<long double>(c.dout[qi(b, h, i) + e]) * c.v[kj(b, g, j) + e];
          }
          Di += p[j] * dp[j];
        }
        for (int j = 0; j < d.S_k; ++j) {
          const long double ds = p[j] * (dp[j] - Di);
          for (int e = 0; e < d.D; ++e) {
            r.dq[qi(b, h, i) + e] += c.scale * ds * c.k[kj(b, g, j) + e];
            r.dk[kj(b, g, j) + e] += c.scale * ds * c.q[qi(b, h, i) + e];
            r.dv[kj(b, g, j) + e] += p[j] * c.dout[qi(b, h, i) + e];
          }
        }
      }
    }
  }
  return r;
}

void expect_close(const std::vector<double>& got, const std::vector<long double>& want, const char* what,
                  double tol = 1e-12) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t n = 0; n < got.size(); ++n) {
    if (std::isinf(want[n])) {
      EXPECT_EQ(got[n], static_cast<double>(want[n])) << what << "[" << n << "]";
    } else {
      EXPECT_NEAR(got[n], static_cast<double>(want[n]), tol * (1.0 + std::fabs(static_cast<double>(want[n]))))
          << what << "[" << n << "]";
    }
  }
}

// Forward and backward against the brute force.
void expect_matches_brute_force(const Case& c) {
  const Result r = run_reference(c);
  const Brute want = brute_force(c);
  expect_close(r.o, want.o, "O");
  expect_close(r.lse, want.lse, "lse");
  expect_close(r.dq, want.dq, "dQ");
  expect_close(r.dk, want.dk, "dK");
  expect_close(r.dv, want.dv, "dV");
}

// ------------------------------------------------------------------------------------------------
// Each feature against the brute force.

TEST(Reference, PlainMatchesBruteForce) { expect_matches_brute_force(make_case(2, 3, 3, 7, 7, 5)); }

TEST(Reference, UnequalLengthsMatchBruteForce) {
  expect_matches_brute_force(make_case(1, 2, 2, 4, 9, 3));
  expect_matches_brute_force(make_case(1, 2, 2, 9, 4, 3));
}

TEST(Reference, CausalWithMoreQueriesThanKeysIsBottomRightAligned) {
  Case c = make_case(2, 2, 2, 9, 5, 4);
  c.causal = true;
  expect_matches_brute_force(c);
  // Queries 0..3 see no key at all (i + S_k - S_q < 0): O = 0, lse = -inf.
  const Result r = run_reference(c);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(r.lse[i], -kInf) << "row " << i;
  EXPECT_GT(r.lse[4], -kInf);
}

TEST(Reference, CausalWithFewerQueriesThanKeysIsBottomRightAligned) {
  Case c = make_case(2, 2, 2, 4, 9, 4);
  c.causal = true;
  expect_matches_brute_force(c);
}

TEST(Reference, SlidingWindowsMatchBruteForce) {
  const int windows[][2] = {{0, 0}, {2, 0}, {0, 2}, {3, -1}, {-1, 1}, {1, 1}, {0, -1}, {-1, 0}};
  for (const auto& w : windows) {
    for (bool causal : {false, true}) {
      for (auto sq_sk : {std::pair<int, int>{6, 6}, {4, 9}, {9, 4}}) {
        SCOPED_TRACE(::testing::Message() << "window " << w[0] << "," << w[1] << " causal " << causal << " S_q "
                                          << sq_sk.first << " S_k " << sq_sk.second);
        Case c = make_case(1, 2, 1, sq_sk.first, sq_sk.second, 3);
        c.wl = w[0];
        c.wr = w[1];
        c.causal = causal;
        expect_matches_brute_force(c);
      }
    }
  }
}

TEST(Reference, CausalFlagAndFoldedWindowRightGiveIdenticalResults) {
  Case a = make_case(1, 2, 2, 5, 8, 4);
  a.causal = true;
  a.wl = 2;
  Case b = a;
  b.wr = 0;  // what the driver passes after folding
  Case c = a;
  c.causal = false;
  c.wr = 0;
  Case e = a;
  e.wr = 3;  // causal wins over a wider right window
  const Result ra = run_reference(a), rb = run_reference(b), rc = run_reference(c), re = run_reference(e);
  for (const Result* r : {&rb, &rc, &re}) {
    EXPECT_EQ(r->o, ra.o);
    EXPECT_EQ(r->lse, ra.lse);
    EXPECT_EQ(r->dq, ra.dq);
    EXPECT_EQ(r->dk, ra.dk);
    EXPECT_EQ(r->dv, ra.dv);
  }
}

TEST(Reference, GroupedQueryAttentionMatchesBruteForce) {
  expect_matches_brute_force(make_case(2, 6, 2, 5, 7, 3));
  Case c = make_case(2, 6, 2, 7, 5, 3);
  c.causal = true;
  expect_matches_brute_force(c);
}

TEST(Reference, MultiQueryAttentionMatchesBruteForce) { expect_matches_brute_force(make_case(2, 6, 1, 5, 7, 3)); }

TEST(Reference, KeyPaddingIncludingEmptySequencesMatchesBruteForce) {
  Case c = make_case(3, 2, 1, 5, 7, 3);
  c.seqlens = {7, 0, 3};
  expect_matches_brute_force(c);
  const Result r = run_reference(c);
  // Batch 1 has no key: every row is empty, and so are its gradients.
  for (int n = 0; n < 2 * 5; ++n) EXPECT_EQ(r.lse[2 * 5 + n], -kInf);
  // Keys beyond seqlen get no gradient.
  for (int j = 3; j < 7; ++j)
    for (int e = 0; e < 3; ++e) {
      EXPECT_EQ(r.dk[(2 * 7 + j) * 3 + e], 0.0);
      EXPECT_EQ(r.dv[(2 * 7 + j) * 3 + e], 0.0);
    }
}

TEST(Reference, PaddingWithCausalAndUnequalLengthsMatchesBruteForce) {
  Case c = make_case(2, 2, 2, 6, 8, 3);
  c.seqlens = {5, 8};
  c.causal = true;
  expect_matches_brute_force(c);
}

TEST(Reference, AdditiveMaskWithMinusInfinityMatchesBruteForce) {
  Case c = make_case(2, 2, 2, 5, 6, 3);
  add_mask(c, 2, 2, 5, 6);
  expect_matches_brute_force(c);
}

TEST(Reference, RowsWhoseMaskIsAllMinusInfinityAreEmpty) {
  Case c = make_case(1, 2, 2, 4, 5, 3);
  add_mask(c, 1, 1, 4, 5, /*inf_every=*/0);
  for (int j = 0; j < 5; ++j) c.mask[2 * 5 + j] = -std::numeric_limits<float>::infinity();  // row 2
  expect_matches_brute_force(c);
  const Result r = run_reference(c);
  for (int h = 0; h < 2; ++h) {
    EXPECT_EQ(r.lse[h * 4 + 2], -kInf);
    for (int e = 0; e < 3; ++e) {
      EXPECT_EQ(r.o[(h * 4 + 2) * 3 + e], 0.0);
      EXPECT_EQ(r.dq[(h * 4 + 2) * 3 + e], 0.0);
    }
  }
}

TEST(Reference, BroadcastMasksMatchBruteForce) {
  const int shapes[][4] = {{1, 1, 1, 6},  // one bias per key: batch, head and row strides 0
                           {1, 1, 5, 1},  // one bias per query: column stride 0
                           {2, 1, 5, 6},  // shared by heads
                           {1, 3, 1, 1},  // one scalar per head
                           {2, 3, 1, 6}};
  for (const auto& s : shapes) {
    SCOPED_TRACE(::testing::Message() << "mask shape " << s[0] << "," << s[1] << "," << s[2] << "," << s[3]);
    Case c = make_case(2, 3, 1, 5, 6, 3);
    add_mask(c, s[0], s[1], s[2], s[3], /*inf_every=*/4);
    expect_matches_brute_force(c);
  }
}

TEST(Reference, EveryFeatureAtOnceMatchesBruteForce) {
  Case c = make_case(3, 6, 2, 7, 9, 5);
  c.causal = true;
  c.wl = 4;
  c.seqlens = {9, 2, 0};
  c.scale = 0.9;
  add_mask(c, 3, 1, 7, 9);
  expect_matches_brute_force(c);
}

TEST(Reference, FullyMaskedRowsGiveZeroOutputMinusInfLseAndNoGradient) {
  // Window (0, 0) with S_q > S_k: only the diagonal is visible, and the first rows see nothing.
  Case c = make_case(1, 1, 1, 5, 3, 2);
  c.wl = 0;
  c.wr = 0;
  const Result r = run_reference(c);
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(r.lse[i], -kInf);
    for (int e = 0; e < 2; ++e) {
      EXPECT_EQ(r.o[i * 2 + e], 0.0);
      EXPECT_EQ(r.dq[i * 2 + e], 0.0);
    }
  }
  // A single visible key: P = 1, O is that value row, dS = 0 so dQ = dK = 0, dV = dO.
  for (int i = 2; i < 5; ++i) {
    for (int e = 0; e < 2; ++e) {
      EXPECT_EQ(r.o[i * 2 + e], c.v[(i - 2) * 2 + e]);
      EXPECT_EQ(r.dq[i * 2 + e], 0.0);
      EXPECT_EQ(r.dk[(i - 2) * 2 + e], 0.0);
      EXPECT_EQ(r.dv[(i - 2) * 2 + e], c.dout[i * 2 + e]);
    }
  }
}

// ------------------------------------------------------------------------------------------------
// Identities of the backward pass.

// L = sum(O * dO) as a function of the inputs, by the forward reference.
double loss(const Case& c) {
  std::vector<double> o(c.q.size()), lse(static_cast<size_t>(c.d.B) * c.d.H * c.d.S_q);
  reference_forward(c.inputs(1), o.data(), lse.data());
  double l = 0.0;
  for (size_t n = 0; n < o.size(); ++n) l += o[n] * c.dout[n];
  return l;
}

void expect_gradient_matches_finite_differences(Case c, std::vector<double> Case::*x, const std::vector<double>& grad,
                                                const char* what) {
  const double eps = 1e-5;
  double scale = 0.0;
  for (double g : grad) scale = std::max(scale, std::fabs(g));
  for (size_t n = 0; n < grad.size(); ++n) {
    const double x0 = (c.*x)[n];
    (c.*x)[n] = x0 + eps;
    const double lp = loss(c);
    (c.*x)[n] = x0 - eps;
    const double lm = loss(c);
    (c.*x)[n] = x0;
    const double fd = (lp - lm) / (2 * eps);
    EXPECT_NEAR(grad[n], fd, 1e-6 * std::max(std::fabs(grad[n]), 1e-2 * scale)) << what << "[" << n << "]";
  }
}

TEST(ReferenceBackward, GradientsMatchFiniteDifferencesOfSumODo) {
  Case c = make_case(2, 4, 2, 5, 6, 3, /*seed=*/11);
  c.causal = true;
  c.wl = 3;
  c.seqlens = {6, 4};
  add_mask(c, 1, 4, 5, 6, /*inf_every=*/7);
  const Result r = run_reference(c);
  expect_gradient_matches_finite_differences(c, &Case::q, r.dq, "dQ");
  expect_gradient_matches_finite_differences(c, &Case::k, r.dk, "dK");
  expect_gradient_matches_finite_differences(c, &Case::v, r.dv, "dV");
}

// Softmax is invariant to shifting a row's scores, so sum_j dS_ij = 0 for every row, hence the
// key gradients of a group sum to zero; and since sum_j P_ij = 1, the value gradients of a group
// sum to the dO of its non-empty rows.
TEST(ReferenceBackward, KeyGradientsSumToZeroAndValueGradientsToDo) {
  Case c = make_case(2, 6, 2, 6, 7, 4, /*seed=*/5);
  c.causal = true;
  c.seqlens = {7, 5};
  add_mask(c, 2, 6, 6, 7, /*inf_every=*/9);
  const Result r = run_reference(c);
  const Dims& d = c.d;
  for (int b = 0; b < d.B; ++b)
    for (int g = 0; g < d.H_kv; ++g)
      for (int e = 0; e < d.D; ++e) {
        double dk_sum = 0.0, dv_sum = 0.0, do_sum = 0.0;
        for (int j = 0; j < d.S_k; ++j) {
          dk_sum += r.dk[((b * d.H_kv + g) * d.S_k + j) * d.D + e];
          dv_sum += r.dv[((b * d.H_kv + g) * d.S_k + j) * d.D + e];
        }
        for (int h = g * 3; h < g * 3 + 3; ++h)
          for (int i = 0; i < d.S_q; ++i) {
            const size_t row = (b * d.H + h) * d.S_q + i;
            if (r.lse[row] != -kInf) do_sum += c.dout[row * d.D + e];
          }
        EXPECT_NEAR(dk_sum, 0.0, 1e-13) << "b " << b << " g " << g << " e " << e;
        EXPECT_NEAR(dv_sum, do_sum, 1e-13) << "b " << b << " g " << g << " e " << e;
      }
}

// ------------------------------------------------------------------------------------------------
// Row variants and threading.

TEST(ReferenceRowVariants, ForwardRowsEqualWholeTensorRowsBitwise) {
  Case c = make_case(2, 6, 2, 9, 7, 5);
  c.causal = true;
  add_mask(c, 2, 1, 9, 7);
  const Result whole = run_reference(c);
  const std::vector<RowId> rows = {{1, 5, 8}, {0, 0, 0}, {1, 2, 3}, {0, 3, 1}, {1, 5, 8}, {0, 4, 6}};
  std::vector<double> o(rows.size() * 5), lse(rows.size());
  reference_forward_rows(c.inputs(), rows, o.data(), lse.data());
  for (size_t n = 0; n < rows.size(); ++n) {
    const size_t row = (static_cast<size_t>(rows[n].b) * 6 + rows[n].h) * 9 + rows[n].i;
    EXPECT_EQ(lse[n], whole.lse[row]) << "row " << n;
    for (int e = 0; e < 5; ++e) EXPECT_EQ(o[n * 5 + e], whole.o[row * 5 + e]) << "row " << n;
  }
}

TEST(ReferenceRowVariants, BackwardRowsEqualWholeTensorRowsBitwise) {
  Case c = make_case(2, 6, 2, 9, 7, 5);
  c.wl = 2;
  c.wr = 1;
  c.seqlens = {7, 4};
  add_mask(c, 1, 6, 1, 7);
  const Result whole = run_reference(c);
  const std::vector<RowId> q_rows = {{0, 1, 2}, {1, 5, 8}, {1, 0, 0}};
  const std::vector<RowId> k_rows = {{1, 1, 6}, {0, 0, 3}, {1, 1, 0}, {0, 1, 6}, {1, 0, 2}, {0, 0, 3}};
  std::vector<double> dq(q_rows.size() * 5), dk(k_rows.size() * 5), dv(k_rows.size() * 5);
  reference_backward_rows(c.inputs(), q_rows, dq.data(), k_rows, dk.data(), dv.data());
  for (size_t n = 0; n < q_rows.size(); ++n) {
    const size_t row = (static_cast<size_t>(q_rows[n].b) * 6 + q_rows[n].h) * 9 + q_rows[n].i;
    for (int e = 0; e < 5; ++e) EXPECT_EQ(dq[n * 5 + e], whole.dq[row * 5 + e]) << "q row " << n;
  }
  for (size_t n = 0; n < k_rows.size(); ++n) {
    const size_t row = (static_cast<size_t>(k_rows[n].b) * 2 + k_rows[n].h) * 7 + k_rows[n].i;
    for (int e = 0; e < 5; ++e) {
      EXPECT_EQ(dk[n * 5 + e], whole.dk[row * 5 + e]) << "k row " << n;
      EXPECT_EQ(dv[n * 5 + e], whole.dv[row * 5 + e]) << "k row " << n;
    }
  }
}

TEST(ReferenceRowVariants, BackwardWithOnlyQueryRowsOrOnlyKeyRowsWorks) {
  Case c = make_case(1, 2, 1, 4, 4, 3);
  const Result whole = run_reference(c);
  std::vector<double> dq(3), dk(3), dv(3);
  reference_backward_rows(c.inputs(), {{0, 1, 2}}, dq.data(), {}, nullptr, nullptr);
  for (int e = 0; e < 3; ++e) EXPECT_EQ(dq[e], whole.dq[(4 + 2) * 3 + e]);
  reference_backward_rows(c.inputs(), {}, nullptr, {{0, 0, 3}}, dk.data(), dv.data());
  for (int e = 0; e < 3; ++e) {
    EXPECT_EQ(dk[e], whole.dk[3 * 3 + e]);
    EXPECT_EQ(dv[e], whole.dv[3 * 3 + e]);
  }
}

TEST(ReferenceThreads, ResultsAreBitwiseIndependentOfThreadCount) {
  // Large enough that the work is split over several threads.
  Case c = make_case(1, 4, 2, 96, 80, 32);
  c.causal = true;
  const Result one = run_reference(c, 1), many = run_reference(c, 5), all = run_reference(c, 0);
  for (const Result* r : {&many, &all}) {
    EXPECT_EQ(r->o, one.o);
    EXPECT_EQ(r->lse, one.lse);
    EXPECT_EQ(r->dq, one.dq);
    EXPECT_EQ(r->dk, one.dk);
    EXPECT_EQ(r->dv, one.dv);
  }
}

// The reference's AVX2 copy (reference.cpp) against its baseline copy, bitwise: the oracle and the
// same-dtype baseline, every output, a head dim with and without a remainder past whole vectors.
bool same_bits(const std::vector<double>& a, const std::vector<double>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(double)) == 0;
}

struct BothModels {
  Result exact, bf16;
};

BothModels run_both_models(const Case& c) {
  BothModels r{run_reference(c), {}};
  const Dims& d = c.d;
  std::vector<RowId> q_rows, k_rows;
  for (int h = 0; h < d.H; ++h)
    for (int i = 0; i < d.S_q; ++i) q_rows.push_back({0, h, i});
  for (int g = 0; g < d.H_kv; ++g)
    for (int j = 0; j < d.S_k; ++j) k_rows.push_back({0, g, j});
  Result& b = r.bf16;
  b.o.resize(q_rows.size() * d.D), b.lse.resize(q_rows.size()), b.dq.resize(q_rows.size() * d.D);
  b.dk.resize(k_rows.size() * d.D), b.dv.resize(k_rows.size() * d.D);
  baseline_forward_rows(c.inputs(), DType::BF16, q_rows, b.o.data(), b.lse.data());
  baseline_backward_rows(c.inputs(), DType::BF16, q_rows, b.dq.data(), k_rows, b.dk.data(), b.dv.data());
  return r;
}

TEST(ReferenceCopies, AvxTwoCopyEqualsBaselineCopyBitwise) {
  if (std::string(reference_instruction_set()) != "avx2") {
    GTEST_SKIP() << "no AVX2 copy of the reference on this CPU or in this build";
  }
  for (const int D : {128, 37}) {
    Case c = make_case(1, 4, 2, 67, 80, D);
    c.causal = true;
    const BothModels avx2 = run_both_models(c);
    setenv("FLASHATTN_REFERENCE_ISA", "baseline", 1);
    const std::string forced = reference_instruction_set();
    const BothModels base = run_both_models(c);
    unsetenv("FLASHATTN_REFERENCE_ISA");
    ASSERT_EQ(forced, "baseline");
    for (const auto& [x, y] : {std::pair{&avx2.exact, &base.exact}, std::pair{&avx2.bf16, &base.bf16}}) {
      EXPECT_TRUE(same_bits(x->o, y->o)) << "D " << D;
      EXPECT_TRUE(same_bits(x->lse, y->lse)) << "D " << D;
      EXPECT_TRUE(same_bits(x->dq, y->dq)) << "D " << D;
      EXPECT_TRUE(same_bits(x->dk, y->dk)) << "D " << D;
      EXPECT_TRUE(same_bits(x->dv, y->dv)) << "D " << D;
    }
  }
}

TEST(ReferenceErrors, SeqlenOutsideKeyRangeIsAnInputError) {
  Case c = make_case(2, 1, 1, 3, 4, 2);
  c.seqlens = {4, 5};
  std::vector<double> o(c.q.size()), lse(6);
  EXPECT_THROW(reference_forward(c.inputs(), o.data(), lse.data()), InputError);
}

TEST(ReferenceErrors, HeadsNotAMultipleOfKvHeadsIsRejected) {
  Case c = make_case(1, 3, 3, 3, 4, 2);
  c.d.H_kv = 2;
  std::vector<double> o(c.q.size()), lse(9);
  EXPECT_THROW(reference_forward(c.inputs(), o.data(), lse.data()), Error);
}

}  // namespace
}  // namespace flashattn
