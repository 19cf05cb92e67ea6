// decode_baseline_rows (decode_reference.h): a decode step's same-dtype baseline, computed by the
// forward baseline (reference.h) one batch element at a time.
#include <map>
#include <vector>

#include "decode_reference.h"
#include "reference.h"

namespace flashattn {

void decode_baseline_rows(const DecodeRefInputs& in, DType dtype, const std::vector<DecodeRowId>& rows, double* o,
                          double* lse) {
  const int D = in.D;
  std::map<int, std::vector<size_t>> by_batch;  // b -> indices into `rows`
  for (size_t r = 0; r < rows.size(); ++r) by_batch[rows[r].b].push_back(r);
  for (const auto& [b, mine] : by_batch) {
    const int c = in.cache_seqlens[b], L = c + in.S_new;
    // Element b as a forward problem: q [1, H, S_new, D], K and V [1, H_kv, L, D] after the append.
    std::vector<double> q(static_cast<size_t>(in.H) * in.S_new * D), k(static_cast<size_t>(in.H_kv) * L * D),
        v(k.size());
    for (int h = 0; h < in.H; ++h)
      for (int i = 0; i < in.S_new; ++i)
        for (int d = 0; d < D; ++d)
          q[(static_cast<size_t>(h) * in.S_new + i) * D + d] =
              element_as_double(*in.q, ((static_cast<int64_t>(b) * in.H + h) * in.S_new + i) * D + d);
    for (int g = 0; g < in.H_kv; ++g)
      for (int j = 0; j < L; ++j) {
        const size_t dst = (static_cast<size_t>(g) * L + j) * D;
        // Rows before the cache length come from the cache, the rest from k_new / v_new.
        const bool cached = j < c;
        const HostArray& ks = cached ? *in.k_cache : *in.k_new;
        const HostArray& vs = cached ? *in.v_cache : *in.v_new;
        const int64_t fresh = ((static_cast<int64_t>(b) * in.H_kv + g) * in.S_new + (j - c)) * D;
        const int64_t ko = cached ? decode_cache_offset(in, ks, b, g, j) : fresh;
        const int64_t vo = cached ? decode_cache_offset(in, vs, b, g, j) : fresh;
        for (int d = 0; d < D; ++d) {
          k[dst + d] = element_as_double(ks, ko + d);
          v[dst + d] = element_as_double(vs, vo + d);
        }
      }
    RefInputs ri;
    ri.dims = Dims{1, in.H, in.H_kv, in.S_new, L, D};
    ri.scale = in.scale;
    ri.causal = true;  // query i sees keys j <= i + L - S_new = c + i
    ri.q = q.data(), ri.k = k.data(), ri.v = v.data();
    ri.threads = in.threads;
    std::vector<RowId> ids;
    for (size_t r : mine) ids.push_back({0, rows[r].h, rows[r].i});
    std::vector<double> ob(ids.size() * D), lb(ids.size());
    baseline_forward_rows(ri, dtype, ids, ob.data(), lb.data());
    for (size_t n = 0; n < mine.size(); ++n) {
      std::copy(ob.begin() + n * D, ob.begin() + (n + 1) * D, o + mine[n] * D);
      lse[mine[n]] = lb[n];
    }
  }
}

}  // namespace flashattn
