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
#include <cmath>

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

// The backward's own block in two pieces (ring_impl.h: the own shard comes last, so that each
// dK/dV accumulator ends its trip at home, and the first K/V transfer has nothing to overlap).
// The lead piece, the block's first `u` (batch element, kv head) units with all their rows and
// keys, runs while that transfer travels; the rest, the other units, runs in the own step. The
// units are batch-major; a piece takes whole batch elements, or kv heads of the only one (a
// piece's lse rows must be contiguous in [B, H, rows]). Each piece is the whole block's
// problem for its heads, CTA for CTA: only the kernel boundary between them is new. The pieces
// hold disjoint heads, so each stores its dK/dV outright.
struct RingUnits {
  int b0 = 0, nb = 0;  // batch elements [b0, b0 + nb); nb == 0: the whole block
  int g0 = 0, ng = 0;  // kv heads [g0, g0 + ng) of each
  bool all() const { return nb == 0; }
};

struct RingOwnSplit {
  RingUnits lead, rest;
};

// `u` units to the lead: u < H_kv when B == 1, else a multiple of H_kv below B * H_kv.
inline RingOwnSplit ring_split_units(int B, int H_kv, int u) {
  RingOwnSplit s;
  if (B == 1) {
    s.lead = {0, 1, 0, u};
    s.rest = {0, 1, u, H_kv - u};
  } else {
    s.lead = {0, u / H_kv, 0, H_kv};
    s.rest = {u / H_kv, B - u / H_kv, 0, H_kv};
  }
  return s;
}

// How many units the lead takes: enough to last the first K/V transfer (`first_bytes`), with the
// block's kernel computing kLeadFlopsPerByte backward FLOPs (10 per visible pair per head dim)
// in the time the link moves a byte (~500 TFLOP/s over ~340 GB/s between two NVLink GPUs), and
// at least a wave of the backward's CTAs (one per kLeadKeyBlock keys of a unit; two waves under
// a causal mask, whose CTAs shorten along the diagonal); whole batch elements where B > 1; at
// most half the units. A longer lead costs nothing (its work leaves the own step); what a lead
// costs is its last wave, about one CTA, so there is none where the longest CTA (key block 0,
// every row of a unit's query heads) alone outlasts the transfer: few heads, or a GQA group's
// CTA summing several (32/8 at 32k). 0: no split.
constexpr double kLeadFlopsPerByte = 1500;
constexpr int kLeadKeyBlock = 128;

inline int ring_lead_units(int len, int B, int H, int H_kv, int D, bool causal, int sms, double first_bytes) {
  const int units = B * H_kv;
  if (units < 2 || len <= 0 || sms <= 0 || first_bytes <= 0) return 0;
  const double budget = kLeadFlopsPerByte * first_bytes;  // FLOPs the transfer lasts
  const double group = double(H) / H_kv;
  if (10.0 * D * group * kLeadKeyBlock * len * sms > budget) return 0;
  const double pairs = causal ? double(len) * (len + 1) / 2 : double(len) * len;
  const double per_unit = 10.0 * D * group * pairs;
  const int ctas_per_unit = (len + kLeadKeyBlock - 1) / kLeadKeyBlock, min_ctas = causal ? 2 * sms : sms;
  int u = std::max(int(std::ceil(budget / per_unit)), (min_ctas + ctas_per_unit - 1) / ctas_per_unit);
  if (B > 1) u = (u + H_kv - 1) / H_kv * H_kv;
  return u <= units / 2 ? u : 0;
}

}  // namespace flashattn
