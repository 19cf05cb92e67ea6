// The block-level visibility helpers the tiled kernels (mma, hopper) plan their key loops with
// (kernels/common/key_blocks.cuh), checked against the per-element rule of params.h on random
// problems: every key block a query tile visits holds a key some row sees, every block it skips
// holds none, "full" blocks need no masking, and the window-as-two-shifts form gives each row
// exactly its visible keys. The other direction too, for the backward kernels that walk the
// query blocks of one key block: query_blocks and full_query_rows, and that the two directions
// agree (the hopper backward's --deterministic path ranks the key blocks adding into a Q block by
// key_blocks, while each key block visits the Q blocks query_blocks gives it).
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

// Key block n (kBlockN keys, clipped to min(seqlen_k, S_k) as the backward kernels clip it)
// visits exactly the Q blocks holding a query that sees one of its keys; those are exactly the Q
// blocks whose key_blocks() contain n; Q blocks inside full_query_rows see every key of the block.
template <int kBlockM, int kBlockN>
void check_key_block_rows(const Problem& p) {
  const fa::Visibility& v = p.vis;
  const int key_end = std::min(p.seqlen_k, v.S_k);
  for (int n0 = 0; n0 < v.S_k; n0 += kBlockN) {
    const int n_keys = std::min(key_end - n0, kBlockN);
    const fa::BlockRange mb = fa::query_blocks(v, n0, n_keys, p.seqlen_k, kBlockM);
    const fa::IndexRange full = fa::full_query_rows(v, n0, kBlockN, p.seqlen_k);
    for (int m0 = 0; m0 < v.S_q; m0 += kBlockM) {
      const int m_last = std::min(m0 + kBlockM, v.S_q) - 1;
      bool any = false, all = true;
      for (int i = m0; i <= m_last; ++i)
        for (int j = n0; j < n0 + kBlockN; ++j) {
          const bool vis = v.visible(i, j, p.seqlen_k);
          any = any || vis;
          all = all && vis;
        }
      const int m = m0 / kBlockM, n = n0 / kBlockN;
      const bool visited = m >= mb.begin && m < mb.end;
      const fa::BlockRange nb = fa::key_blocks<kBlockN>(v, m0, m_last, p.seqlen_k);
      ASSERT_EQ(visited, any) << "S_q " << v.S_q << " S_k " << v.S_k << " window (" << v.window_left << ", "
                              << v.window_right << ") seqlen_k " << p.seqlen_k << " key block " << n << " Q block " << m;
      ASSERT_EQ(visited, n >= nb.begin && n < nb.end) << "the two directions disagree: key block " << n << " Q block " << m;
      if (m0 >= full.begin && m_last + 1 <= full.end) {
        ASSERT_TRUE(all) << "Q block " << m << " declared fully visible to key block " << n;
      }
    }
  }
}

}  // namespace

TEST(KeyBlocks, QueryBlocksOfAKeyBlockAgreeWithKeyBlocksOfAQueryBlock) {
  std::mt19937 rng(4321);
  for (int t = 0; t < 300; ++t) {
    const Problem p = random_problem(rng);
    check_key_block_rows<64, 128>(p);
    check_key_block_rows<128, 128>(p);
    check_key_block_rows<64, 64>(p);
  }
}

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
