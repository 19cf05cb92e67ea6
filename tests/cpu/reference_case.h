// Tiny attention problems for the reference tests (test_reference.cpp, test_cpu_kernel.cpp): a
// case with random data, an optional broadcast mask, and the reference's outputs on it.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "reference.h"

namespace flashattn {
namespace test {

// A tiny problem with its data; the mask is stored with its own (broadcast) shape.
struct Case {
  Dims d;
  double scale = 0.0;
  bool causal = false;
  int wl = -1, wr = -1;
  std::vector<int32_t> seqlens;  // empty: no padding
  std::vector<float> mask;       // empty: no mask
  int mshape[4] = {1, 1, 1, 1};  // broadcast shape of `mask` against [B, H, S_q, S_k]
  std::vector<double> q, k, v, dout;

  RefInputs inputs(int threads = 0) const {
    RefInputs in;
    in.dims = d;
    in.scale = scale;
    in.causal = causal;
    in.window_left = wl;
    in.window_right = wr;
    in.q = q.data();
    in.k = k.data();
    in.v = v.data();
    in.dout = dout.data();
    in.seqlens_k = seqlens.empty() ? nullptr : seqlens.data();
    if (!mask.empty()) {
      const int64_t col = 1, row = mshape[3], head = row * mshape[2], batch = head * mshape[1];
      in.mask.ptr = mask.data();
      in.mask.batch = mshape[0] == 1 ? 0 : batch;
      in.mask.head = mshape[1] == 1 ? 0 : head;
      in.mask.row = mshape[2] == 1 ? 0 : row;
      in.mask.col = mshape[3] == 1 ? 0 : col;
    }
    in.threads = threads;
    return in;
  }
  float mask_at(int b, int h, int i, int j) const {
    const int idx[4] = {b % mshape[0], h % mshape[1], i % mshape[2], j % mshape[3]};
    return mask[((static_cast<size_t>(idx[0]) * mshape[1] + idx[1]) * mshape[2] + idx[2]) * mshape[3] + idx[3]];
  }
};

inline std::vector<double> random_vec(size_t n, std::mt19937_64& rng) {
  std::uniform_real_distribution<double> u(-1.0, 1.0);
  std::vector<double> x(n);
  for (double& e : x) e = u(rng);
  return x;
}

inline Case make_case(int B, int H, int H_kv, int S_q, int S_k, int D, uint64_t seed = 1) {
  Case c;
  c.d = Dims{B, H, H_kv, S_q, S_k, D};
  c.scale = 1.0 / std::sqrt(static_cast<double>(D));
  std::mt19937_64 rng(seed);
  c.q = random_vec(static_cast<size_t>(B) * H * S_q * D, rng);
  c.k = random_vec(static_cast<size_t>(B) * H_kv * S_k * D, rng);
  c.v = random_vec(static_cast<size_t>(B) * H_kv * S_k * D, rng);
  c.dout = random_vec(static_cast<size_t>(B) * H * S_q * D, rng);
  return c;
}

// Random additive mask of the given broadcast shape; about one entry in `inf_every` is -inf.
inline void add_mask(Case& c, int mb, int mh, int mq, int mk, int inf_every = 5, uint64_t seed = 7) {
  const int s[4] = {mb, mh, mq, mk};
  std::copy(s, s + 4, c.mshape);
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(-2.0f, 2.0f);
  c.mask.resize(static_cast<size_t>(mb) * mh * mq * mk);
  for (size_t n = 0; n < c.mask.size(); ++n) {
    c.mask[n] = (inf_every > 0 && n % inf_every == 3) ? -std::numeric_limits<float>::infinity() : u(rng);
  }
}

struct Result {
  std::vector<double> o, lse, dq, dk, dv;
};

inline Result run_reference(const Case& c, int threads = 0) {
  Result r;
  r.o.resize(c.q.size());
  r.lse.resize(static_cast<size_t>(c.d.B) * c.d.H * c.d.S_q);
  r.dq.resize(c.q.size());
  r.dk.resize(c.k.size());
  r.dv.resize(c.v.size());
  const RefInputs in = c.inputs(threads);
  reference_forward(in, r.o.data(), r.lse.data());
  reference_backward(in, r.dq.data(), r.dk.data(), r.dv.data());
  return r;
}

}  // namespace test
}  // namespace flashattn
