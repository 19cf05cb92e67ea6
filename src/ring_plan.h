// Context-parallel (ring) attention: which sequence positions each GPU holds and which block of
// the score matrix it computes at each ring step. Pure host arithmetic, shared by the ring driver
// (ring.cpp) and its tests.
//
// Sharding (zig-zag, for causal balance; the same layout serves the non-causal case): the
// sequence is cut into 2N chunks of c = ceil(S / 2N) positions (the last ones shorter, or empty,
// when 2N does not divide S); rank r holds chunks r and 2N-1-r, in that order, for Q, K, V, dO and
// every output. Under a causal mask the early chunk sees few keys and the late one many, so every
// rank has the same work.
//
// Step s of the ring (s = 0 .. N-1): rank r holds the K/V shard of rank src = (r - s) mod N and
// computes one block of scores against it:
//   non-causal                  all local queries x all of src's keys
//   causal, src == r            all x all with the causal mask (the local order is the global
//                               order restricted to the two chunks, so the mask is the plain one)
//   causal, src <  r            all local queries x src's first chunk, unmasked (src's second
//                               chunk lies after both of r's chunks)
//   causal, src >  r            r's second chunk x all of src's keys, unmasked (r's first chunk
//                               lies before both of src's chunks)
// so each (query, key) pair the mask allows is computed exactly once over the N steps.
#pragma once

#include <algorithm>
#include <cstddef>
#include <string>
#include <vector>

namespace flashattn {

struct RingShard {
  int chunk = 0;                // c: positions per chunk
  int begin_a = 0, len_a = 0;   // chunk r: global positions [begin_a, begin_a + len_a)
  int begin_b = 0, len_b = 0;   // chunk 2N-1-r
  int len() const { return len_a + len_b; }
  // Global position of local row `row` (< len()).
  int global(int row) const { return row < len_a ? begin_a + row : begin_b + (row - len_a); }
};

inline RingShard ring_shard(int S, int N, int rank) {
  RingShard s;
  s.chunk = (S + 2 * N - 1) / (2 * N);
  auto clip = [&](int chunk_index, int* begin, int* len) {
    *begin = std::min(S, chunk_index * s.chunk);
    *len = std::min(S, *begin + s.chunk) - *begin;
  };
  clip(rank, &s.begin_a, &s.len_a);
  clip(2 * N - 1 - rank, &s.begin_b, &s.len_b);
  return s;
}

// One block of a ring step: local query rows [q_row0, q_row0 + q_rows) of the rank's shard
// against local key rows [k_row0, k_row0 + k_rows) of the source's shard.
struct RingCall {
  bool skip = true;   // nothing to compute (an empty shard)
  bool causal = false;
  int q_row0 = 0, q_rows = 0;
  int k_row0 = 0, k_rows = 0;
};

inline RingCall ring_call(int S, int N, int rank, int src, bool causal) {
  const RingShard q = ring_shard(S, N, rank), kv = ring_shard(S, N, src);
  RingCall c;
  c.q_rows = q.len();
  c.k_rows = kv.len();
  if (causal) {
    if (src == rank) {
      c.causal = true;
    } else if (src < rank) {
      c.k_rows = kv.len_a;
    } else {
      c.q_row0 = q.len_a;
      c.q_rows = q.len_b;
    }
  }
  c.skip = c.q_rows == 0 || c.k_rows == 0;
  return c;
}

// Keys of the shard's local rows [k_row0, k_row0 + k_rows) that lie below the global key length
// L (key padding). They are always a prefix of the range: the shard's chunks are in global order.
inline int ring_local_seqlen(const RingShard& kv, int k_row0, int k_rows, int L) {
  int n = 0;
  for (int part = 0; part < 2; ++part) {
    const int lo = part == 0 ? 0 : kv.len_a, hi = part == 0 ? kv.len_a : kv.len();
    const int begin = part == 0 ? kv.begin_a : kv.begin_b;
    const int a = std::max(lo, k_row0), b = std::min(hi, k_row0 + k_rows);
    if (b > a) n += std::clamp(L - (begin + (a - lo)), 0, b - a);
  }
  return n;
}

// Lending chosen from a measured lag (FLASHATTN_RING_LEND=auto; src/ring_impl.h): the key tiles a
// slower GPU lends so that two GPUs' blocks end together. tile_ms is one tile's share of the
// lender's blocks time; a tile lent takes kRingLendSpread times that off the difference (the
// lender ends 1.3 tiles' time earlier, the helper 1.6 later: the lent block shares the helper's
// SMs with its own block, and the transfers cost; docs/PERF.md, ring steps 22 and 24). Rounded
// to the nearest tile, at most max_tiles; 0 for no lag.
constexpr double kRingLendSpread = 2.9;
inline int ring_lend_tiles(double lag_ms, double tile_ms, int max_tiles) {
  if (!(lag_ms > 0) || !(tile_ms > 0) || max_tiles < 1) return 0;
  const double tiles = lag_ms / (kRingLendSpread * tile_ms) + 0.5;
  return tiles >= max_tiles ? max_tiles : static_cast<int>(tiles);
}

// Whether a ring's device list names one GPU for every rank (`--devices 0,0`: ring.h's loopback).
inline bool ring_one_gpu_for_all(const std::vector<int>& ids) {
  return !ids.empty() && std::count(ids.begin(), ids.end(), ids[0]) == static_cast<long>(ids.size());
}

// A ring's scaling efficiency against its own cards: `one_gpu_ms[r]` is the kernel's time alone
// on rank r's card. Cards that differ (under a power cap they do, by a few per cent) could finish
// the problem together, each doing the share its speed allows, in 1 / sum(1 / one_gpu_ms[r]): the
// efficiency is that over the ring's time. For cards alike it is T(one GPU) / (N T(ring)); unlike
// that formula on one card's time it does not change with the order the cards are listed in.
// -1 where a time is missing (not positive).
inline double ring_cards_efficiency(const std::vector<double>& one_gpu_ms, double ring_ms) {
  if (one_gpu_ms.empty() || !(ring_ms > 0)) return -1;
  double rate = 0;
  for (double t : one_gpu_ms) {
    if (!(t > 0)) return -1;
    rate += 1.0 / t;
  }
  return 1.0 / (rate * ring_ms);
}

// One GPU playing every rank (ring.h's loopback): a group's point-to-point transfers, paired as
// NCCL pairs them: the k-th send from rank a to rank b meets the k-th receive that b posted from
// a. For each send, the index of its receive; where a send meets no receive or one of another
// size, or a receive meets no send, an empty result and the reason in *error.
struct RingTransfer {
  int from = 0, to = 0;
  size_t bytes = 0;
};
inline std::vector<int> ring_pair_transfers(const std::vector<RingTransfer>& sends,
                                            const std::vector<RingTransfer>& recvs, std::string* error) {
  std::vector<int> pair(sends.size(), -1);
  std::vector<char> met(recvs.size(), 0);
  auto fail = [&](const std::string& why) {
    *error = why;
    return std::vector<int>{};
  };
  for (size_t i = 0; i < sends.size(); ++i) {
    const RingTransfer& out = sends[i];
    size_t j = 0;
    while (j < recvs.size() && (met[j] || recvs[j].from != out.from || recvs[j].to != out.to)) ++j;
    if (j == recvs.size() || recvs[j].bytes != out.bytes)
      return fail("rank " + std::to_string(out.from) + " sends " + std::to_string(out.bytes) + " bytes to rank " +
                  std::to_string(out.to) + ", which posted no receive of that size");
    met[j] = 1;
    pair[i] = static_cast<int>(j);
  }
  for (size_t j = 0; j < recvs.size(); ++j)
    if (!met[j])
      return fail("rank " + std::to_string(recvs[j].to) + " waits for " + std::to_string(recvs[j].bytes) +
                  " bytes from rank " + std::to_string(recvs[j].from) + ", which sends none");
  error->clear();
  return pair;
}

}  // namespace flashattn
