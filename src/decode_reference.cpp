// The decode oracle (decode_reference.h). Per (batch, kv head) group: pass 1 streams the group's
// key rows once and stores every selected row's scores (rows x L_b doubles) with their maxima;
// pass 2 streams the value rows once and accumulates exp(s - max) v. Sums run in key order, so
// results are bitwise identical for any thread count.
#include "decode_reference.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <thread>
#include <utility>

#include "parallel.h"
#include "reference.h"

namespace flashattn {
namespace {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

// n consecutive elements of `a` from element `off`, as doubles.
void load_row(const HostArray& a, int64_t off, int n, double* out) {
  switch (a.dtype) {
    case DType::F64: {
      const double* p = a.data<double>() + off;
      std::copy(p, p + n, out);
      return;
    }
    case DType::F32: {
      const float* p = a.data<float>() + off;
      for (int d = 0; d < n; ++d) out[d] = p[d];
      return;
    }
    case DType::F16: {
      const uint16_t* p = a.data<uint16_t>() + off;
      for (int d = 0; d < n; ++d) out[d] = half_bits_to_float(p[d]);
      return;
    }
    case DType::BF16: {
      const uint16_t* p = a.data<uint16_t>() + off;
      for (int d = 0; d < n; ++d) out[d] = bf16_bits_to_float(p[d]);
      return;
    }
    default:
      for (int d = 0; d < n; ++d) out[d] = element_as_double(a, off + d);
  }
}

int64_t row_offset(const HostArray& a, int64_t outer, int g, int64_t r) {
  // [outer, H_kv, S, D] row-major
  const int64_t H_kv = a.shape[1], S = a.shape[2], D = a.shape[3];
  return ((outer * H_kv + g) * S + r) * D;
}

// Key (or value) row j of group (b, g) after the step's append.
void key_row(const DecodeRefInputs& in, const HostArray& cache, const HostArray& fresh, int b, int g, int j,
             double* out) {
  const int c = in.cache_seqlens[b];
  if (j >= c) {
    load_row(fresh, row_offset(fresh, b, g, j - c), in.D, out);
  } else {
    load_row(cache, decode_cache_offset(in, cache, b, g, j), in.D, out);
  }
}

// The selected rows of one (b, g) group: indices into the caller's row list.
void run_group(const DecodeRefInputs& in, int b, int g, const std::vector<DecodeRowId>& rows,
               const std::vector<size_t>& mine, double* o, double* lse) {
  const int D = in.D;
  const int c = in.cache_seqlens[b];
  const int L = c + in.S_new;
  const size_t n = mine.size();
  std::vector<double> q(n * D), s(n * static_cast<size_t>(L)), m(n, kNegInf), row(D);
  std::vector<int> limit(n);  // keys [0, limit) are visible to the row
  std::vector<bool> nan(n, false);
  for (size_t r = 0; r < n; ++r) {
    const DecodeRowId& id = rows[mine[r]];
    load_row(*in.q, row_offset(*in.q, id.b, id.h, id.i), D, q.data() + r * D);
    limit[r] = c + id.i + 1;
  }
  // Pass 1: scores s_ij = scale <q_i, k_j> and their row maxima.
  for (int j = 0; j < L; ++j) {
    key_row(in, *in.k_cache, *in.k_new, b, g, j, row.data());
    for (size_t r = 0; r < n; ++r) {
      if (j >= limit[r]) continue;
      const double x = in.scale * dot_f64(q.data() + r * D, row.data(), D);
      s[r * L + j] = x;
      if (std::isnan(x)) nan[r] = true;
      m[r] = std::max(m[r], x);
    }
  }
  // Pass 2: sum exp(s - max) and accumulate it times v_j; subtracting the max keeps each term <= 1.
  std::vector<double> acc(n * D, 0.0), sum(n, 0.0);
  for (int j = 0; j < L; ++j) {
    bool needed = false;
    for (size_t r = 0; r < n; ++r) needed = needed || j < limit[r];
    if (!needed) break;
    key_row(in, *in.v_cache, *in.v_new, b, g, j, row.data());
    for (size_t r = 0; r < n; ++r) {
      if (j >= limit[r] || m[r] == kNegInf) continue;
      const double p = std::exp(s[r * L + j] - m[r]);
      sum[r] += p;
      double* a = acc.data() + r * D;
      for (int d = 0; d < D; ++d) a[d] += p * row[d];
    }
  }
  for (size_t r = 0; r < n; ++r) {
    double* out = o + mine[r] * D;
    if (nan[r]) {
      std::fill(out, out + D, std::numeric_limits<double>::quiet_NaN());
      lse[mine[r]] = std::numeric_limits<double>::quiet_NaN();
    } else if (m[r] == kNegInf || !(sum[r] > 0)) {
      // Only reachable with -inf scores (infinite inputs): nothing visible contributes.
      std::fill(out, out + D, 0.0);
      lse[mine[r]] = kNegInf;
    } else {
      for (int d = 0; d < D; ++d) out[d] = acc[r * D + d] / sum[r];
      lse[mine[r]] = m[r] + std::log(sum[r]);
    }
  }
}

}  // namespace

int64_t decode_cache_offset(const DecodeRefInputs& in, const HostArray& cache, int b, int g, int j) {
  if (in.block_table == nullptr) return row_offset(cache, b, g, j);
  const int page = in.block_table[static_cast<int64_t>(b) * in.block_table_stride + j / in.page_size];
  return row_offset(cache, page, g, j % in.page_size);
}

void decode_reference_rows(const DecodeRefInputs& in, const std::vector<DecodeRowId>& rows, double* o,
                           double* lse) {
  const int group = in.H / in.H_kv;
  std::map<std::pair<int, int>, std::vector<size_t>> groups;  // (b, g) -> row indices, ordered
  for (size_t r = 0; r < rows.size(); ++r) groups[{rows[r].b, rows[r].h / group}].push_back(r);
  std::vector<std::pair<std::pair<int, int>, std::vector<size_t>>> tasks(groups.begin(), groups.end());

  unsigned threads = in.threads > 0 ? static_cast<unsigned>(in.threads) : std::thread::hardware_concurrency();
  threads = std::max(1u, std::min<unsigned>(threads, static_cast<unsigned>(tasks.size())));
  parallel_tasks(static_cast<int64_t>(tasks.size()), static_cast<int>(threads), [] { return 0; },
                 [&](int64_t t, int) {
                   run_group(in, tasks[t].first.first, tasks[t].first.second, rows, tasks[t].second, o, lse);
                 });
}

void decode_reference(const DecodeRefInputs& in, double* o, double* lse) {
  std::vector<DecodeRowId> rows;
  rows.reserve(static_cast<size_t>(in.B) * in.H * in.S_new);
  for (int b = 0; b < in.B; ++b)
    for (int h = 0; h < in.H; ++h)
      for (int i = 0; i < in.S_new; ++i) rows.push_back({b, h, i});
  decode_reference_rows(in, rows, o, lse);
}

}  // namespace flashattn
