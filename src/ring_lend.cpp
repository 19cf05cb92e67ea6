// Lending (ring_impl.h's lend_rank): on two GPUs, the slower card's other block gives its last
// key tiles (whole kv heads, or a part of one) to the faster one, which holds their keys and
// values already. Only with NCCL.
#ifdef FLASHATTN_HAVE_NCCL

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "flashattn/ring_ops.h"
#include "ring_impl.h"

namespace flashattn {

using namespace ring_detail;

void Ring::Impl::parse_lend() {
  lend_auto = false, lend_lag_ms = 0;
  lend_rank = -1, lend_tiles = lend_tile = lend_nkb = lend_kv = 0;
  const char* v = std::getenv("FLASHATTN_RING_LEND");
  if (v == nullptr || *v == '\0' || !backward) return;
  const std::string text = v;
  auto refuse = [&](const std::string& why) { throw InputError("FLASHATTN_RING_LEND=" + text + ": " + why); };
  int rank = -1;
  double kv = 0;
  char tail = 0;
  const bool automatic = text == "auto";
  if (!automatic && (std::sscanf(v, "%d:%lf%c", &rank, &kv, &tail) != 2 || !std::isfinite(kv)))
    refuse("expected RANK:KV_HEADS (rank 0 or 1 lends that many kv heads' worth, e.g. 1:2 or 1:0.25) or auto");
  if (n() != 2) refuse("lending is for a ring of two GPUs");
  if (!automatic && rank != 0 && rank != 1) refuse("the lending rank is 0 or 1");
  if (dims().B != 1) refuse("lending needs B = 1 (the lent heads' rows are one range per tensor)");
  if (prob.has_padding) refuse("lending does not carry key padding");
  if (!f32_grads || !dq_accum)
    refuse("lending needs a kernel that keeps fp32 gradients and offers its dQ accumulator (hopper)");
  if (automatic && multi) refuse("auto compares both GPUs' timelines, which one process of a ring does not see");
  for (int r = 0; r < 2; ++r) {
    if (!automatic && r != rank) continue;
    const RingCall c = lent_call(r);
    if (c.skip) refuse("rank " + std::to_string(r) + "'s other block is empty");
    if (c.causal) refuse("rank " + std::to_string(r) + "'s other block is under the causal mask");  // never on two GPUs
  }
  if (automatic) {
    lend_auto = true;
    return;
  }
  int tile = 0, nkb = 0;
  lend_unit(rank, &tile, &nkb);
  const int total = dims().H_kv * nkb, tiles = static_cast<int>(std::lround(kv * nkb));
  if (tiles < 1 || tiles >= total || std::abs(tiles - kv * nkb) > 1e-6)
    refuse("the kv heads' worth lent is a multiple of 1/" + std::to_string(nkb) + " (" +
           (nkb > 1 ? std::to_string(tile) + "-key tiles of the block's keys" : std::string("whole kv heads")) +
           ") from 1/" + std::to_string(nkb) + " to H_kv - 1/" + std::to_string(nkb));
  set_lend(rank, tiles);
}

// The unit: the kernel's key tile where it takes part of its work, else the block's keys (a
// whole kv head, one tile).
void Ring::Impl::lend_unit(int rank, int* tile, int* nkb) const {
  const int keys = lent_call(rank).k_rows;
  const int t = entry->key_tile != nullptr ? entry->key_tile(ring_block_bwd(prob, 1, 1, RingCall{}, {})) : 0;
  *tile = t > 0 ? t : keys;
  *nkb = (keys + *tile - 1) / *tile;
}

void Ring::Impl::set_lend(int rank, int tiles) {
  lend_rank = rank, lend_tiles = tiles;
  lend_unit(rank, &lend_tile, &lend_nkb);
  lend_kv = dims().H_kv - lend_first() / lend_nkb;
}

// The lent tiles' share of the owner's other block, in its FLOPs (no mask there: its keys').
double Ring::Impl::lent_flops() const {
  if (!lending()) return 0.0;
  const RingCall c = lent_call(lend_rank);
  int64_t keys = 0;  // the last tile of a kv head may be short
  for (int t = lend_first(); t < dims().H_kv * lend_nkb; ++t) keys += std::min(lend_tile, c.k_rows - (t % lend_nkb) * lend_tile);
  return block_flops(c) * double(keys) / (double(dims().H_kv) * c.k_rows);
}

// The helper's workspace for the lent block (on its compute stream), 0 on the owner.
size_t Ring::Impl::lent_workspace(const Dev& d) const {
  if (!lending() || d.rank == lend_rank || !entry->bwd_workspace) return 0;
  return entry->bwd_workspace(lent_params(d));
}

void Ring::Impl::choose_lend(const std::vector<RingProfile>& runs) {
  auto median = [&](int rank) {
    std::vector<double> v;
    for (const RingProfile& p : runs) v.push_back(p.blocks_ms.at(rank));
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  const double end0 = median(0), end1 = median(1);
  const int slow = end1 > end0 ? 1 : 0;
  lend_lag_ms = std::abs(end1 - end0);
  // One tile's share of the slower GPU's blocks time: its other block's FLOPs over all of its.
  double total_flops = 0;
  for (const Dev& d : devs)
    if (d.rank == slow)
      for (const Block& blk : d.blocks) total_flops += block_flops(blk.call);
  const double other = block_flops(lent_call(slow));
  int tile = 0, nkb = 0;
  lend_unit(slow, &tile, &nkb);
  const int total = dims().H_kv * nkb;
  const double tile_ms = total_flops > 0 ? std::max(end0, end1) * other / total_flops / total : 0.0;
  const int tiles = ring_lend_tiles(lend_lag_ms, tile_ms, total - 1);
  if (tiles == 0) return;
  set_lend(slow, tiles);
  for (Dev& d : devs) {
    allocate_lend(d);
    const size_t need = lent_workspace(d);
    if (need <= d.ws_bytes) continue;
    use(d);
    d.ws_bytes = need;
    d.ws = DeviceBuffer(need);
    CUDA_CHECK(cudaMemset(d.ws.get(), 0xFF, need));  // undefined to the kernel
  }
}

// The owner's other block keeps the tiles before the first lent one: its first kv heads, the last
// of them in part.
void Ring::Impl::lend_trim_owner(BwdParams* p) const {
  const int first = lend_first(), kv = (first + lend_nkb - 1) / lend_nkb;
  p->H_kv = kv, p->H = kv * (dims().H / dims().H_kv);
  if (first % lend_nkb != 0) p->tiles_begin = 0, p->tiles_end = first;
}

void Ring::Impl::allocate_lend(Dev& d) {
  for (DeviceBuffer* b : {&d.lend_in, &d.lend_dq, &d.lend_dq_in}) *b = DeviceBuffer();
  if (!lending()) return;
  const RingCall c = lent_call(lend_rank);
  const int len_o = shard_len(lend_rank), kh = lend_heads(), D = dims().D;
  const size_t dq_bytes = size_t(kh) * dq_rows(len_o) * D * 4;
  use(d);
  if (d.rank == lend_rank) {
    d.lend_dq_in = DeviceBuffer(dq_bytes);
  } else {
    d.lend_in = DeviceBuffer(3 * size_t(kh) * len_o * D * es() + size_t(kh) * c.q_rows * 4);
    d.lend_dq = DeviceBuffer(dq_bytes);
  }
}

BwdParams Ring::Impl::lent_params(const Dev& h) const {
  const int o = lend_rank, len_o = shard_len(o), len_h = h.shard.len(), kh = lend_heads(), D = dims().D;
  const RingCall c = lent_call(o);
  const int64_t head = int64_t(kh) * len_o * D;  // elements of one input, the lent heads
  RingBlockBuffers b;
  b.q = h.lend_in.get();
  b.o = at(h.lend_in, head * int64_t(es()));
  b.dout = at(h.lend_in, 2 * head * int64_t(es()));
  b.lse = at(h.lend_in, 3 * head * int64_t(es()));
  // The helper's own K and V, from the first lent kv head (each [1, H_kv, len_h, D]).
  b.kv = at(h.kv_own, int64_t(dims().H_kv - lend_kv) * len_h * D * int64_t(es()));
  b.workspace = h.ws.get();
  b.workspace_bytes = h.ws_bytes;
  BwdParams p = ring_block_bwd(prob, len_o, len_h, c, b);
  // dK/dV into the owner's accumulator, arrived in acc[1] (the whole shard's layout, those heads).
  float* acc = static_cast<float*>(h.acc[1].get()) + int64_t(dims().H_kv - lend_kv) * len_h * D;
  float* dq = static_cast<float*>(h.lend_dq.get());
  ring_block_grads_f32(prob, len_o, len_h, c, dq, acc, /*whole_shard=*/true, &p);
  p.dq_accum = dq;
  p.dq_accum_rows = dq_rows(len_o);
  p.dq_accum_row0 = c.q_row0;
  p.H = kh, p.H_kv = lend_kv;
  // A shared first kv head: the helper takes its tiles from the first lent one.
  const int skip = lend_first() % lend_nkb;
  if (skip != 0) p.tiles_begin = skip, p.tiles_end = lend_kv * lend_nkb;
  p.num_sms = h.ctx.sm_count;
  p.deterministic = deterministic;
  return p;
}

// The owner's Q, O, dO and lse of the lent heads to the helper (point to point: small, once).
void Ring::Impl::send_lend_inputs(Timeline* tl) {
  const RingCall c = lent_call(lend_rank);
  const int len_o = shard_len(lend_rank), kh = lend_heads(), H = dims().H, D = dims().D;
  const size_t bytes = size_t(kh) * len_o * D * es(), lse_bytes = size_t(kh) * c.q_rows * 4;
  const int64_t first = int64_t(H - kh) * len_o * D * int64_t(es());  // the lent heads are the last
  group_transfer(tl, [&](Dev& d) {
    if (d.rank == lend_rank) {
      const int helper = 1 - lend_rank;
      for (const DeviceBuffer* src : {&d.q, &d.o, &d.dout})
        send(d, at(*src, first), bytes, helper);
      const DeviceBuffer& lse = c.q_row0 == 0 ? d.lse : d.lse_b;  // the block's rows, contiguous
      send(d, at(lse, int64_t(H - kh) * c.q_rows * 4), lse_bytes, helper);
    } else {
      for (int i = 0; i < 4; ++i)
        recv(d, at(d.lend_in, i * int64_t(bytes)), i < 3 ? bytes : lse_bytes, lend_rank);
    }
    return double(3 * bytes + lse_bytes);  // the bytes that travel, on either side
  });
  for (Dev& d : devs) {
    use(d);
    CUDA_CHECK(cudaEventRecord(d.lend_in_arrived, d.comm));
  }
}

// On the helper's compute stream, once the inputs and the owner's accumulator have arrived (its
// own step-0 block is ahead of it there, the own block beside it); then its dQ to the owner.
void Ring::Impl::compute_lent(Dev& h, Timeline* tl) {
  use(h);
  wait_for(h, h.compute, h.lend_in_arrived, tl);
  wait_for(h, h.compute, h.acc_arrived[0], tl);
  ring_fill(static_cast<float*>(h.lend_dq.get()), 0.f, int64_t(h.lend_dq.bytes() / 4), h.compute);
  const BwdParams p = lent_params(h);
  RingRecord::BlockSpan span;
  span.step = 0, span.src = h.rank, span.lent = true, span.causal = p.causal;
  span.q_rows = p.S_q, span.k_rows = p.S_k;
  timed_block(h, h.compute, span, tl, [&] { entry->bwd(p, h.ctx); });
  CUDA_CHECK(cudaEventRecord(h.lend_done, h.compute));
}

// The lent heads' dQ (fp32, the kernel's layout) from the helper to the owner, after the lent block.
void Ring::Impl::return_lent_dq(Timeline* tl) {
  for (Dev& d : devs)
    if (d.rank != lend_rank) {
      use(d);
      CUDA_CHECK(cudaStreamWaitEvent(d.comm, d.lend_done, 0));
    }
  group_transfer(tl, [&](Dev& d) {
    const DeviceBuffer& buf = d.rank == lend_rank ? d.lend_dq_in : d.lend_dq;
    if (d.rank == lend_rank)
      recv(d, buf.get(), buf.bytes(), 1 - lend_rank);
    else
      send(d, buf.get(), buf.bytes(), lend_rank);
    return double(buf.bytes());
  });
  for (Dev& d : devs) {
    use(d);
    CUDA_CHECK(cudaEventRecord(d.lend_dq_arrived, d.comm));
  }
}

// The owner's merge stream: the lent heads' dQ into its accumulator (same layout, those heads).
void Ring::Impl::add_lent_dq(Dev& o, Timeline* tl) {
  wait_for(o, o.merge, o.lend_dq_arrived, tl);
  const int rows = dq_rows(o.shard.len()), kh = lend_heads(), D = dims().D;
  float* acc = static_cast<float*>(o.dq_acc.get()) + int64_t(dims().H - kh) * rows * D;
  ring_accumulate(DType::F32, o.lend_dq_in.get(), acc, 1, kh, rows, 0, rows, D, o.merge);
}

}  // namespace flashattn

#endif  // FLASHATTN_HAVE_NCCL
