// The decode oracle (src/decode_reference.h), checked against a brute-force evaluation of the
// definition: the logical key rows of each batch element are assembled explicitly (cache rows
// below cache_seqlens[b], then the new tokens), every score is computed, and the softmax is taken
// in long double over the keys each query sees (j <= cache_seqlens[b] + i).
#include <gtest/gtest.h>

#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "array.h"
#include "decode_data.h"
#include "decode_reference.h"

namespace flashattn {
namespace {

struct DecodeCase {
  int B = 1, H = 1, H_kv = 1, S_new = 1, D = 8, S_max = 16;
  int page = 0;  // 0: contiguous
  std::vector<int32_t> lens;
  double scale = 0.0;
  HostArray q, k_new, v_new, k_cache, v_cache;  // logical caches (contiguous) [B, H_kv, S_max, D]
  HostArray pool_k, pool_v;                     // paged form
  std::vector<int32_t> table;
  int max_blocks = 0;

  DecodeRefInputs inputs(bool paged, int threads = 0) const {
    DecodeRefInputs in;
    in.B = B, in.H = H, in.H_kv = H_kv, in.S_new = S_new, in.D = D, in.scale = scale;
    in.q = &q, in.k_new = &k_new, in.v_new = &v_new;
    in.k_cache = paged ? &pool_k : &k_cache;
    in.v_cache = paged ? &pool_v : &v_cache;
    in.cache_seqlens = lens.data();
    if (paged) {
      in.block_table = table.data();
      in.block_table_stride = max_blocks;
      in.page_size = page;
    }
    in.threads = threads;
    return in;
  }
};

HostArray random_array(std::vector<int64_t> shape, std::mt19937_64& rng) {
  HostArray a(DType::F64, std::move(shape));
  std::normal_distribution<double> n(0.0, 1.0);
  for (int64_t i = 0; i < a.numel(); ++i) a.data<double>()[i] = n(rng);
  return a;
}

// S_max is a multiple of `page` when paged; the pool is a shuffled copy of the logical cache.
DecodeCase make_case(int B, int H, int H_kv, int S_new, int D, int S_max, std::vector<int32_t> lens, int page,
                     uint64_t seed) {
  DecodeCase c;
  c.B = B, c.H = H, c.H_kv = H_kv, c.S_new = S_new, c.D = D, c.S_max = S_max, c.page = page, c.lens = std::move(lens);
  c.scale = 1.0 / std::sqrt(double(D));
  std::mt19937_64 rng(seed);
  c.q = random_array({B, H, S_new, D}, rng);
  c.k_new = random_array({B, H_kv, S_new, D}, rng);
  c.v_new = random_array({B, H_kv, S_new, D}, rng);
  c.k_cache = random_array({B, H_kv, S_max, D}, rng);
  c.v_cache = random_array({B, H_kv, S_max, D}, rng);
  if (page > 0) {
    c.max_blocks = S_max / page;
    c.table.resize(size_t(B) * c.max_blocks);
    std::iota(c.table.begin(), c.table.end(), 0);
    std::shuffle(c.table.begin(), c.table.end(), rng);
    c.pool_k = HostArray(DType::F64, {int64_t(B) * c.max_blocks, H_kv, page, D});
    c.pool_v = c.pool_k;
    for (int b = 0; b < B; ++b)
      for (int g = 0; g < H_kv; ++g)
        for (int j = 0; j < S_max; ++j) {
          const int pg = c.table[size_t(b) * c.max_blocks + j / page];
          const int64_t src = ((int64_t(b) * H_kv + g) * S_max + j) * D;
          const int64_t dst = ((int64_t(pg) * H_kv + g) * page + j % page) * D;
          for (int d = 0; d < D; ++d) {
            c.pool_k.data<double>()[dst + d] = c.k_cache.data<double>()[src + d];
            c.pool_v.data<double>()[dst + d] = c.v_cache.data<double>()[src + d];
          }
        }
  }
  return c;
}

// The definition, evaluated plainly from the logical rows.
void brute_force(const DecodeCase& c, std::vector<double>* o, std::vector<double>* lse) {
  const int G = c.H / c.H_kv;
  o->assign(size_t(c.B) * c.H * c.S_new * c.D, 0.0);
  lse->assign(size_t(c.B) * c.H * c.S_new, 0.0);
  auto at = [&](const HostArray& a, int64_t b, int64_t h, int64_t i, int64_t d) {
    return a.data<double>()[((b * a.shape[1] + h) * a.shape[2] + i) * a.shape[3] + d];
  };
  for (int b = 0; b < c.B; ++b)
    for (int h = 0; h < c.H; ++h)
      for (int i = 0; i < c.S_new; ++i) {
        const int g = h / G, cb = c.lens[b], n_keys = cb + i + 1;
        std::vector<long double> s(n_keys);
        long double m = -INFINITY;
        for (int j = 0; j < n_keys; ++j) {
          long double dot = 0;
          for (int d = 0; d < c.D; ++d)
            dot += (long double)at(c.q, b, h, i, d) * (j < cb ? at(c.k_cache, b, g, j, d) : at(c.k_new, b, g, j - cb, d));
          s[j] = c.scale * dot;
          m = std::max(m, s[j]);
        }
        long double sum = 0;
        for (int j = 0; j < n_keys; ++j) sum += std::exp(s[j] - m);
        const size_t row = (size_t(b) * c.H + h) * c.S_new + i;
        (*lse)[row] = double(m + std::log(sum));
        for (int d = 0; d < c.D; ++d) {
          long double acc = 0;
          for (int j = 0; j < n_keys; ++j)
            acc += std::exp(s[j] - m) / sum * (j < cb ? at(c.v_cache, b, g, j, d) : at(c.v_new, b, g, j - cb, d));
          (*o)[row * c.D + d] = double(acc);
        }
      }
}

void expect_close(const std::vector<double>& got, const std::vector<double>& want, double tol) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t k = 0; k < got.size(); ++k) EXPECT_NEAR(got[k], want[k], tol * std::max(1.0, std::fabs(want[k]))) << "at " << k;
}

void check_against_brute_force(const DecodeCase& c, bool paged) {
  std::vector<double> o(size_t(c.B) * c.H * c.S_new * c.D), lse(size_t(c.B) * c.H * c.S_new), bo, blse;
  decode_reference(c.inputs(paged), o.data(), lse.data());
  brute_force(c, &bo, &blse);
  expect_close(o, bo, 1e-12);
  expect_close(lse, blse, 1e-12);
}

TEST(DecodeReference, MatchesBruteForceWithPerBatchLengths) {
  check_against_brute_force(make_case(3, 2, 2, 1, 8, 32, {5, 0, 31}, 0, 1), false);
}

TEST(DecodeReference, MatchesBruteForceWithSeveralNewTokens) {
  check_against_brute_force(make_case(2, 2, 2, 3, 8, 32, {7, 29}, 0, 2), false);
}

TEST(DecodeReference, MatchesBruteForceForGqaRatios1_4_8) {
  for (int ratio : {1, 4, 8}) {
    SCOPED_TRACE(ratio);
    check_against_brute_force(make_case(2, 8, 8 / ratio, 2, 16, 48, {17, 40}, 0, 3 + ratio), false);
  }
}

TEST(DecodeReference, MatchesBruteForceWithAPagedCache) {
  for (int page : {16, 32}) {
    SCOPED_TRACE(page);
    check_against_brute_force(make_case(3, 4, 2, 3, 8, 64, {0, 33, 61}, page, 7), true);
  }
}

TEST(DecodeReference, PagedAndContiguousFormsAgreeBitwise) {
  const DecodeCase c = make_case(2, 4, 1, 2, 16, 128, {100, 45}, 16, 11);
  std::vector<double> o1(2 * 4 * 2 * 16), l1(2 * 4 * 2), o2(o1.size()), l2(l1.size());
  decode_reference(c.inputs(false), o1.data(), l1.data());
  decode_reference(c.inputs(true), o2.data(), l2.data());
  EXPECT_EQ(o1, o2);
  EXPECT_EQ(l1, l2);
}

TEST(DecodeReference, ResultsDoNotDependOnTheThreadCount) {
  const DecodeCase c = make_case(3, 8, 2, 2, 16, 64, {10, 50, 3}, 0, 13);
  std::vector<double> o1(3 * 8 * 2 * 16), l1(3 * 8 * 2), o2(o1.size()), l2(l1.size());
  decode_reference(c.inputs(false, 1), o1.data(), l1.data());
  decode_reference(c.inputs(false, 5), o2.data(), l2.data());
  EXPECT_EQ(o1, o2);
  EXPECT_EQ(l1, l2);
}

TEST(DecodeReference, SelectedRowsEqualTheWholeTensor) {
  const DecodeCase c = make_case(2, 4, 2, 3, 8, 32, {4, 20}, 0, 17);
  std::vector<double> o(2 * 4 * 3 * 8), l(2 * 4 * 3);
  decode_reference(c.inputs(false), o.data(), l.data());
  const std::vector<DecodeRowId> rows = {{1, 3, 2}, {0, 0, 0}, {1, 1, 1}};
  std::vector<double> ro(rows.size() * 8), rl(rows.size());
  decode_reference_rows(c.inputs(false), rows, ro.data(), rl.data());
  for (size_t r = 0; r < rows.size(); ++r) {
    const size_t row = (size_t(rows[r].b) * 4 + rows[r].h) * 3 + rows[r].i;
    EXPECT_EQ(rl[r], l[row]);
    for (int d = 0; d < 8; ++d) EXPECT_EQ(ro[r * 8 + d], o[row * 8 + d]);
  }
}

TEST(DecodeReference, AnEmptyCacheWithOneNewTokenReturnsItsValue) {
  const DecodeCase c = make_case(1, 2, 1, 1, 8, 16, {0}, 0, 19);
  std::vector<double> o(2 * 8), l(2);
  decode_reference(c.inputs(false), o.data(), l.data());
  for (int h = 0; h < 2; ++h) {
    double dot = 0;
    for (int d = 0; d < 8; ++d) dot += c.q.data<double>()[h * 8 + d] * c.k_new.data<double>()[d];
    EXPECT_NEAR(l[h], c.scale * dot, 1e-14);
    for (int d = 0; d < 8; ++d) EXPECT_EQ(o[h * 8 + d], c.v_new.data<double>()[d]);
  }
}

TEST(DecodeReference, ANewTokenDoesNotSeeTheTokensAfterIt) {
  DecodeCase c = make_case(1, 1, 1, 3, 8, 16, {5}, 0, 23);
  std::vector<double> o1(3 * 8), l1(3), o2(o1.size()), l2(l1.size());
  decode_reference(c.inputs(false), o1.data(), l1.data());
  for (int d = 0; d < 8; ++d) c.k_new.data<double>()[2 * 8 + d] += 1.0, c.v_new.data<double>()[2 * 8 + d] -= 1.0;
  decode_reference(c.inputs(false), o2.data(), l2.data());
  for (int i = 0; i < 2; ++i) {  // tokens 0 and 1 do not see token 2
    EXPECT_EQ(l1[i], l2[i]);
    for (int d = 0; d < 8; ++d) EXPECT_EQ(o1[i * 8 + d], o2[i * 8 + d]);
  }
  EXPECT_NE(l1[2], l2[2]);
}

TEST(DecodeReference, CacheRowsPastTheLengthAreNeverRead) {
  DecodeCase c = make_case(1, 2, 1, 2, 8, 32, {9}, 0, 29);
  std::vector<double> o1(2 * 2 * 8), l1(4), o2(o1.size()), l2(l1.size());
  decode_reference(c.inputs(false), o1.data(), l1.data());
  for (int j = 9; j < 32; ++j)
    for (int d = 0; d < 8; ++d) c.k_cache.data<double>()[j * 8 + d] = NAN, c.v_cache.data<double>()[j * 8 + d] = NAN;
  decode_reference(c.inputs(false), o2.data(), l2.data());
  EXPECT_EQ(o1, o2);
  EXPECT_EQ(l1, l2);
}

TEST(DecodeReference, PagedOffsetsFollowTheBlockTable) {
  const DecodeCase c = make_case(2, 2, 2, 1, 4, 64, {10, 10}, 16, 31);
  const DecodeRefInputs in = c.inputs(true);
  for (int b = 0; b < 2; ++b)
    for (int g = 0; g < 2; ++g)
      for (int j = 0; j < 64; ++j) {
        const int page = c.table[size_t(b) * 4 + j / 16];
        EXPECT_EQ(decode_cache_offset(in, c.pool_k, b, g, j), ((int64_t(page) * 2 + g) * 16 + j % 16) * 4);
      }
}

TEST(DecodeAppend, WritesTheNewRowsAtTheCacheLengthContiguousAndPaged) {
  const DecodeCase c = make_case(2, 2, 2, 3, 4, 64, {5, 60}, 16, 37);
  HostArray lens(DType::I32, {2});
  lens.data<int32_t>()[0] = 5, lens.data<int32_t>()[1] = 60;
  const HostArray flat = append_on_host(c.k_cache, c.k_new, lens, nullptr, 0);
  HostArray table(DType::I32, {2, 4});
  std::copy(c.table.begin(), c.table.end(), table.data<int32_t>());
  const HostArray paged = append_on_host(c.pool_k, c.k_new, lens, &table, 16);
  DecodeCase after = c;
  after.k_cache = flat, after.pool_k = paged;
  const DecodeRefInputs in_flat = after.inputs(false), in_paged = after.inputs(true);
  for (int b = 0; b < 2; ++b)
    for (int g = 0; g < 2; ++g)
      for (int j = 0; j < 64; ++j) {
        const bool fresh = j >= c.lens[b] && j < c.lens[b] + 3;
        for (int d = 0; d < 4; ++d) {
          const double want = fresh ? c.k_new.data<double>()[((b * 2 + g) * 3 + (j - c.lens[b])) * 4 + d]
                                    : c.k_cache.data<double>()[((b * 2 + g) * 64 + j) * 4 + d];
          EXPECT_EQ(flat.data<double>()[decode_cache_offset(in_flat, flat, b, g, j) + d], want);
          EXPECT_EQ(paged.data<double>()[decode_cache_offset(in_paged, paged, b, g, j) + d], want);
        }
      }
}

}  // namespace
}  // namespace flashattn
