// FLOP counting and layout strides: the closed-form count of visible (query, key) pairs against
// a brute-force count over every pair.
#include <gtest/gtest.h>

#include <vector>

#include "problem.h"

namespace flashattn {
namespace {

double brute_force_pairs(const Problem& p, const std::vector<int32_t>& lens) {
  const Dims& d = p.dims;
  double n = 0;
  for (int b = 0; b < d.B; ++b)
    for (int i = 0; i < d.S_q; ++i)
      for (int j = 0; j < d.S_k; ++j) {
        const int len = lens.empty() ? d.S_k : lens[b];
        const int diag = i + d.S_k - d.S_q;
        bool vis = j < len;
        if (p.causal) vis = vis && j <= diag;
        if (p.window_left >= 0) vis = vis && j >= diag - p.window_left;
        if (p.window_right >= 0) vis = vis && j <= diag + p.window_right;
        n += vis ? d.H : 0;
      }
  return n;
}

TEST(VisiblePairs, MatchBruteForceOverCausalWindowAndPadding) {
  const int sizes[][2] = {{1, 1}, {1, 17}, {17, 1}, {33, 70}, {70, 33}, {64, 64}};
  const int windows[][2] = {{-1, -1}, {0, 0}, {5, -1}, {-1, 3}, {4, 7}};
  for (auto& sz : sizes)
    for (auto& w : windows)
      for (int causal = 0; causal < 2; ++causal)
        for (int pad = 0; pad < 2; ++pad) {
          Problem p;
          p.dims = {2, 3, 3, sz[0], sz[1], 8};
          p.causal = causal;
          p.window_left = w[0];
          p.window_right = w[1];
          std::vector<int32_t> lens;
          if (pad) lens = {0, sz[1] / 2 + 1};
          EXPECT_DOUBLE_EQ(count_visible_pairs(p, pad ? lens.data() : nullptr), brute_force_pairs(p, lens))
              << "S_q=" << sz[0] << " S_k=" << sz[1] << " window=" << w[0] << "," << w[1] << " causal=" << causal
              << " pad=" << pad;
        }
}

TEST(Flops, ForwardIsFourDTimesPairsAndBackwardTwoAndAHalfTimesThat) {
  Problem p;
  p.dims = {2, 4, 2, 128, 256, 64};
  const double pairs = 2.0 * 4 * 128 * 256;
  EXPECT_DOUBLE_EQ(forward_flops(p, nullptr), 4.0 * 64 * pairs);
  EXPECT_DOUBLE_EQ(backward_flops(p, nullptr), 2.5 * 4.0 * 64 * pairs);
}

TEST(Flops, CausalSquareCountsTheLowerTriangleIncludingTheDiagonal) {
  Problem p;
  p.dims = {1, 1, 1, 100, 100, 64};
  p.causal = true;
  EXPECT_DOUBLE_EQ(count_visible_pairs(p, nullptr), 100.0 * 101 / 2);
}

TEST(Problem, CausalFoldsIntoTheRightWindowEdge) {
  Problem p;
  p.causal = true;
  EXPECT_EQ(p.effective_window_right(), 0);
  p.window_right = 5;
  EXPECT_EQ(p.effective_window_right(), 0);
  p.causal = false;
  EXPECT_EQ(p.effective_window_right(), 5);
}

TEST(Problem, RequiredFeaturesNameWhatTheProblemUses) {
  Problem p;
  p.dims = {1, 8, 2, 10, 20, 64};
  p.causal = true;
  p.layout = Layout::BSHD;
  const uint32_t f = p.required_features();
  EXPECT_TRUE(f & kFeatCausal);
  EXPECT_TRUE(f & kFeatGQA);
  EXPECT_TRUE(f & kFeatUnequalSeq);
  EXPECT_TRUE(f & kFeatBSHD);
  EXPECT_FALSE(f & kFeatWindow);
  EXPECT_FALSE(f & kFeatMask);
}

TEST(LayoutStrides, BhsdAndBshdAddressTheSameLogicalElement) {
  const int H = 3, S = 5, D = 4;
  const Strides a = layout_strides(Layout::BHSD, H, S, D);
  const Strides b = layout_strides(Layout::BSHD, H, S, D);
  EXPECT_EQ(a.batch, H * S * D);
  EXPECT_EQ(a.head, S * D);
  EXPECT_EQ(a.row, D);
  EXPECT_EQ(b.batch, S * H * D);
  EXPECT_EQ(b.head, D);
  EXPECT_EQ(b.row, H * D);
}

}  // namespace
}  // namespace flashattn
