// The ring's sharding and step plan (src/ring_plan.h): every (query, key) pair the mask allows is
// computed exactly once over all ranks and steps, the zig-zag gives every rank the same work
// under a causal mask, and key padding reaches each block as a prefix of its keys.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "ring_plan.h"
#include "ring_shards.h"

namespace flashattn {
namespace {

TEST(RingPlan, ShardsCoverTheSequenceOnce) {
  for (int N : {2, 3, 4, 8})
    for (int S : {1, 2, 3, 7, 16, 17, 100, 1023, 1024}) {
      std::vector<int> seen(S, 0);
      for (int r = 0; r < N; ++r) {
        const RingShard s = ring_shard(S, N, r);
        for (int i = 0; i < s.len(); ++i) ++seen[s.global(i)];
        if (s.len_a && s.len_b) {
          EXPECT_LE(s.begin_a + s.len_a, s.begin_b);  // chunks in global order
        }
      }
      for (int p = 0; p < S; ++p) EXPECT_EQ(seen[p], 1) << "S=" << S << " N=" << N << " position " << p;
    }
}

TEST(RingPlan, EveryVisiblePairOnceAndNoOther) {
  for (bool causal : {false, true})
    for (int N : {2, 3, 4})
      for (int S : {1, 5, 17, 64, 100}) {
        std::vector<int> count(size_t(S) * S, 0);
        for (int r = 0; r < N; ++r)
          for (int s = 0; s < N; ++s) {
            const int src = ((r - s) % N + N) % N;
            const RingCall c = ring_call(S, N, r, src, causal);
            if (c.skip) continue;
            const RingShard q = ring_shard(S, N, r), kv = ring_shard(S, N, src);
            if (c.causal) {
              EXPECT_EQ(c.q_rows, c.k_rows);  // causal blocks are square (the local diagonal)
            }
            for (int i = 0; i < c.q_rows; ++i)
              for (int j = 0; j < c.k_rows; ++j) {
                if (c.causal && j > i) continue;
                ++count[size_t(q.global(c.q_row0 + i)) * S + kv.global(c.k_row0 + j)];
              }
          }
        for (int i = 0; i < S; ++i)
          for (int j = 0; j < S; ++j)
            EXPECT_EQ(count[size_t(i) * S + j], causal && j > i ? 0 : 1)
                << "causal=" << causal << " N=" << N << " S=" << S << " query " << i << " key " << j;
      }
}

TEST(RingPlan, CausalZigZagBalancesTheWork) {
  const int S = 4096;
  for (int N : {2, 4, 8}) {
    std::vector<long long> work(N, 0);
    for (int r = 0; r < N; ++r)
      for (int s = 0; s < N; ++s) {
        const RingCall c = ring_call(S, N, r, ((r - s) % N + N) % N, true);
        if (!c.skip) work[r] += c.causal ? (long long)c.q_rows * (c.q_rows + 1) / 2 : (long long)c.q_rows * c.k_rows;
      }
    for (int r = 1; r < N; ++r) EXPECT_EQ(work[r], work[0]) << "N=" << N << " rank " << r;
  }
}

TEST(RingPlan, KeyPaddingIsAPrefixOfEachBlock) {
  for (int N : {2, 3})
    for (int S : {17, 64})
      for (int L = 0; L <= S; ++L)
        for (int src = 0; src < N; ++src)
          for (int r = 0; r < N; ++r) {
            const RingCall c = ring_call(S, N, r, src, true);
            const RingShard kv = ring_shard(S, N, src);
            const int n = ring_local_seqlen(kv, c.k_row0, c.k_rows, L);
            for (int j = 0; j < c.k_rows; ++j)
              EXPECT_EQ(j < n, kv.global(c.k_row0 + j) < L) << "S=" << S << " N=" << N << " L=" << L << " key " << j;
          }
}

// The auto lending's tiles: the lag over the spread of one tile's time, rounded, within bounds.
// Against the cards' combined rate: T(one GPU) / (N T(ring)) for cards alike, the same whichever
// card is listed first, and between the two one-card formulas for cards that differ.
TEST(RingPlan, CardsEfficiencyIsTheCombinedRatesAndIgnoresOrder) {
  EXPECT_DOUBLE_EQ(ring_cards_efficiency({150.0, 150.0}, 78.0), 150.0 / (2 * 78.0));
  EXPECT_DOUBLE_EQ(ring_cards_efficiency({100.0, 100.0, 100.0, 100.0}, 26.0), 100.0 / (4 * 26.0));
  const double ab = ring_cards_efficiency({149.0, 152.0}, 78.0), ba = ring_cards_efficiency({152.0, 149.0}, 78.0);
  EXPECT_DOUBLE_EQ(ab, ba);
  EXPECT_GT(ab, 149.0 / (2 * 78.0));
  EXPECT_LT(ab, 152.0 / (2 * 78.0));
  EXPECT_NEAR(ab, 1.0 / (78.0 * (1 / 149.0 + 1 / 152.0)), 1e-15);
  EXPECT_EQ(ring_cards_efficiency({150.0, -1.0}, 78.0), -1);  // a card without its time
  EXPECT_EQ(ring_cards_efficiency({}, 78.0), -1);
  EXPECT_EQ(ring_cards_efficiency({150.0, 150.0}, 0.0), -1);
}

TEST(RingPlan, LendTilesFollowTheLag) {
  // 64k causal backward, rank 1 the slower: 4096 tiles of a 38.5 ms other block in a 77 ms run.
  const double tile_ms = 38.5 / 4096;
  EXPECT_EQ(ring_lend_tiles(0.0, tile_ms, 4095), 0);
  EXPECT_EQ(ring_lend_tiles(-1.0, tile_ms, 4095), 0);
  EXPECT_EQ(ring_lend_tiles(0.01, tile_ms, 4095), 0);  // under half a tile's spread
  EXPECT_EQ(ring_lend_tiles(0.84, tile_ms, 4095), 31);  // pair L's lag: about a quarter of a kv head
  EXPECT_EQ(ring_lend_tiles(3.5, tile_ms, 4095), 128);  // about one kv head: step 22's whole move
  EXPECT_EQ(ring_lend_tiles(1e6, tile_ms, 4095), 4095);
  EXPECT_EQ(ring_lend_tiles(1.0, 0.0, 4095), 0);
  EXPECT_EQ(ring_lend_tiles(1.0, tile_ms, 0), 0);
  for (double lag = 0.05; lag < 5; lag += 0.05) {  // the tiles' spread brackets the lag
    const int t = ring_lend_tiles(lag, tile_ms, 4095);
    EXPECT_LE(std::abs(t * kRingLendSpread * tile_ms - lag), kRingLendSpread * tile_ms / 2 + 1e-12) << lag;
  }
}

}  // namespace
}  // namespace flashattn

namespace flashattn {
namespace {

// Gathering every rank's rows and scattering them back gives the tensor again, in either layout.
// The loopback's pairing (one GPU playing every rank): in NCCL's order per (sender, receiver).
TEST(RingPlan, TransfersPairAsNcclPairsThem) {
  std::string error;
  // Two ranks exchanging, then rank 0 sending two buffers to rank 1 (lending's inputs).
  const std::vector<RingTransfer> sends = {{0, 1, 8}, {1, 0, 8}, {0, 1, 4}, {0, 1, 2}};
  const std::vector<RingTransfer> recvs = {{1, 0, 8}, {0, 1, 8}, {0, 1, 4}, {0, 1, 2}};
  EXPECT_EQ(ring_pair_transfers(sends, recvs, &error), (std::vector<int>{1, 0, 2, 3}));
  EXPECT_TRUE(error.empty());
  // Three ranks around the ring.
  EXPECT_EQ(ring_pair_transfers({{0, 1, 5}, {1, 2, 5}, {2, 0, 5}}, {{2, 0, 5}, {0, 1, 5}, {1, 2, 5}}, &error),
            (std::vector<int>{1, 2, 0}));
  EXPECT_TRUE(ring_pair_transfers({}, {}, &error).empty());
  EXPECT_TRUE(error.empty());
  // A size that differs, a send nobody receives, a receive nobody sends: refused with the reason.
  EXPECT_TRUE(ring_pair_transfers({{0, 1, 8}}, {{0, 1, 4}}, &error).empty());
  EXPECT_NE(error.find("rank 0 sends 8 bytes to rank 1"), std::string::npos) << error;
  EXPECT_TRUE(ring_pair_transfers({{0, 1, 8}}, {}, &error).empty());
  EXPECT_NE(error.find("no receive"), std::string::npos) << error;
  EXPECT_TRUE(ring_pair_transfers({}, {{1, 0, 8}}, &error).empty());
  EXPECT_NE(error.find("rank 0 waits for 8 bytes from rank 1, which sends none"), std::string::npos) << error;
}

TEST(RingPlan, ShardRowsRoundTrip) {
  const int B = 2, heads = 3, S = 19, width = 4, N = 3;
  for (bool bshd : {false, true}) {
    const Strides st = bshd ? Strides{int64_t(S) * heads * width, width, int64_t(heads) * width}
                            : Strides{int64_t(heads) * S * width, int64_t(S) * width, width};
    std::vector<float> whole(size_t(B) * heads * S * width), back(whole.size(), -1.f);
    for (size_t i = 0; i < whole.size(); ++i) whole[i] = float(i);
    for (int r = 0; r < N; ++r) {
      const RingShard sh = ring_shard(S, N, r);
      std::vector<float> rows(size_t(B) * heads * sh.len() * width);
      ring_gather_rows(whole.data(), st, sizeof(float), B, heads, width, sh, rows.data());
      if (sh.len()) {
        EXPECT_EQ(rows[0], whole[size_t(sh.global(0)) * st.row]);  // (b 0, h 0, first row)
      }
      ring_scatter_rows(rows.data(), sizeof(float), B, heads, width, sh, st, back.data());
    }
    EXPECT_EQ(back, whole) << (bshd ? "bshd" : "bhsd");
  }
}

}  // namespace
}  // namespace flashattn
