// The block-level visibility helpers the tiled kernels (mma, hopper) plan their key loops with
// (kernels/common/key_blocks.cuh), checked against the per-element rule of params.h on random
// problems: every key block a query tile visits holds a key some row sees, every block it skips
// holds none, "full" blocks need no masking, and the window-as-two-shifts form gives each row
// exactly its visible keys.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <random>

#include "common/key_blocks.cuh"

namespace fa = flashattn;

namespace {

struct Problem {
  fa::Visibility vis;
  int seqlen_k = 0;
};

Problem random_problem(std::mt19937& rng) {
  auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  Problem p;
  p.vis.S_q = pick(1, 300);
  p.vis.S_k = pick(1, 300);
  const int kind = pick(0, 4);  // none, causal, window, causal + window, huge window
  p.vis.window_left = kind >= 2 ? (kind == 4 ? 1 << 29 : pick(0, 80)) : -1;
  p.vis.window_right = kind == 1 || kind == 3 ? 0 : (kind == 2 ? pick(0, 40) : -1);
  p.seqlen_k = pick(0, 3) == 0 ? pick(0, p.vis.S_k) : p.vis.S_k;
  return p;
}

template <int kBlockM, int kBlockN>
void check_tiles(const Problem& p) {
  const fa::Visibility& v = p.vis;
  for (int m0 = 0; m0 < v.S_q; m0 += kBlockM) {
    const int m_last = std::min(m0 + kBlockM, v.S_q) - 1;
    const fa::BlockRange nb = fa::key_blocks<kBlockN>(v, m0, m_last, p.seqlen_k);
    const fa::BlockRange full = fa::full_key_blocks<kBlockN>(v, m0, m_last, p.seqlen_k);
    const int n_blocks = (v.S_k + kBlockN - 1) / kBlockN;
    for (int n = 0; n < n_blocks; ++n) {
      bool any = false, all = true;
      for (int i = m0; i <= m_last; ++i)
        for (int j = n * kBlockN; j < (n + 1) * kBlockN; ++j) {
          const bool vis = v.visible(i, j, p.seqlen_k);
          any = any || vis;
          all = all && vis;
        }
      const bool visited = n >= nb.begin && n < nb.end;
      ASSERT_EQ(visited, any) << "S_q " << v.S_q << " S_k " << v.S_k << " window (" << v.window_left << ", "
                              << v.window_right << ") seqlen_k " << p.seqlen_k << " tile " << m0 << " block " << n;
      if (n >= full.begin && n < full.end) {
        ASSERT_TRUE(all) << "block " << n << " declared full, tile " << m0;
      }
    }
  }
}

}  // namespace

TEST(KeyBlocks, VisitedBlocksAreExactlyThoseWithAVisibleKey) {
  std::mt19937 rng(1234);
  for (int t = 0; t < 300; ++t) {
    const Problem p = random_problem(rng);
    check_tiles<128, 128>(p);
    check_tiles<64, 32>(p);
    check_tiles<128, 64>(p);
  }
}

TEST(KeyBlocks, KeyShiftsGiveEachRowItsVisibleKeys) {
  std::mt19937 rng(99);
  for (int t = 0; t < 300; ++t) {
    const Problem p = random_problem(rng);
    const fa::KeyShifts k = fa::key_shifts(p.vis);
    for (int i = 0; i < p.vis.S_q; ++i) {
      const fa::IndexRange want = p.vis.keys(i, p.seqlen_k);
      const int64_t lo = std::max<int64_t>(int64_t(i) + k.lo, 0);
      const int64_t hi = std::min<int64_t>(int64_t(i) + k.hi, p.seqlen_k);
      if (want.empty()) {
        ASSERT_LE(hi, lo) << "row " << i;
      } else {
        ASSERT_EQ(lo, want.begin) << "row " << i;
        ASSERT_EQ(hi, want.end) << "row " << i;
      }
    }
  }
}
