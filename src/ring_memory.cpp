// The ring's memory (ring_impl.h): shards cut from the host inputs and put back from the
// devices, NCCL's registered buffers and symmetric windows, and each rank's allocation. Only with
// NCCL.
#ifdef FLASHATTN_HAVE_NCCL

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "array.h"
#include "device_buffer.h"
#include "flashattn/check.h"
#include "flashattn/error.h"
#include "ring_impl.h"
#include "ring_plan.h"
#include "ring_shards.h"

namespace flashattn {

using namespace ring_detail;

// ---- shards -------------------------------------------------------------------------------------
// Rows of `a` (the problem's layout, [B, heads, S, D]) that `shard` holds, as [B, heads, len, D].
HostArray Ring::Impl::shard_rows(const HostArray& a, int heads, const RingShard& shard) const {
  HostArray out(a.dtype, {dims().B, heads, shard.len(), dims().D});
  ring_gather_rows(a.bytes.data(), layout_strides(prob.layout, heads, dims().S_q, dims().D), dtype_size(a.dtype),
                   dims().B, heads, dims().D, shard, out.bytes.data());
  return out;
}

// The inverse, from the device: a shard [B, heads, len, D] of `buf` (from element
// `offset_elems`) into its rows of `out` (problem layout, or [B, H, S] for lse with D = 1).
void Ring::Impl::unshard(const DeviceBuffer& buf, int64_t offset_elems, DType t, int heads, int D, bool lse_like,
                         const RingShard& shard, HostArray* out) const {
  const size_t bytes = size_t(dims().B) * heads * shard.len() * D * dtype_size(t);
  if (bytes == 0) return;
  std::vector<unsigned char> host(bytes);
  CUDA_CHECK(cudaMemcpy(host.data(), at(buf, offset_elems * int64_t(dtype_size(t))), bytes, cudaMemcpyDeviceToHost));
  const Strides st = lse_like ? Strides{int64_t(heads) * dims().S_q, dims().S_q, 1}
                              : layout_strides(prob.layout, heads, dims().S_q, D);
  ring_scatter_rows(host.data(), dtype_size(t), dims().B, heads, D, shard, st, out->bytes.data());
}

DeviceBuffer Ring::Impl::transfer_buffer(const Dev& d, size_t bytes) const {
  if (!registered || bytes == 0) return DeviceBuffer(bytes);
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 19, 0)
  use(d);
  void* ptr = nullptr;
  NCCL_CHECK(ncclMemAlloc(&ptr, bytes));
  void* handle = nullptr;
  const ncclResult_t r = ncclCommRegister(d.nccl, ptr, bytes, &handle);
  if (r != ncclSuccess) ncclMemFree(ptr);
  NCCL_CHECK(r);
  return DeviceBuffer(ptr, bytes, [comm = d.nccl, handle](void* p) {
    ncclCommDeregister(comm, handle);
    ncclMemFree(p);
  });
#else
  throw RuntimeError("registered ring buffers need NCCL 2.19 or later (ncclMemAlloc, ncclCommRegister)");
#endif
}

std::unique_ptr<Window> Ring::Impl::window(const Dev& d, size_t slot_bytes) const {
  auto w = std::make_unique<Window>();
  w->comm = d.nccl;
  if (slot_bytes == 0) return w;
  use(d);
  void* ptr = nullptr;
  NCCL_CHECK(ncclMemAlloc(&ptr, 2 * slot_bytes));
  w->mem = DeviceBuffer(ptr, 2 * slot_bytes, [](void* p) { ncclMemFree(p); });
  return w;
}

// Every rank's windows registered at once (a collective call: one group over this process's GPUs;
// the ranks of other processes make the same calls, in the same order, with the same sizes).
void Ring::Impl::register_windows() {
#if FLASHATTN_RING_HAVE_CE
  try {
    NCCL_CHECK(ncclGroupStart());
    for (Dev& d : devs) {
      use(d);
      for (Window* w : {d.kv_window.get(), d.acc_window.get()})
        if (w && w->mem.bytes())
          NCCL_CHECK(ncclCommWindowRegister(d.nccl, w->mem.get(), w->mem.bytes(), &w->win, NCCL_WIN_COLL_SYMMETRIC));
    }
    NCCL_CHECK(ncclGroupEnd());
  } catch (const RuntimeError& e) {
    throw RuntimeError(std::string(e.what()) +
                       " (the copy-engine exchange of two GPUs; FLASHATTN_RING_COPY_ENGINE=0 uses NCCL's send/recv instead)");
  }
#endif
}

namespace {
// A view of `bytes` at `p` (memory a Window owns).
DeviceBuffer view(void* p, size_t bytes) { return DeviceBuffer(p, bytes, [](void*) {}); }
}  // namespace

void Ring::Impl::allocate(Dev& d, const RunInputs& in) {
  const int len = d.shard.len(), max_kv = max_len();
  const size_t e = es(), B = dims().B, H = dims().H;
  // The largest block any step computes (rows of Q and of K), for the partial buffers; the
  // workspace for the largest any call asks (the forward's too: a backward runs it first).
  int q_rows = 0, k_rows = 0;
  d.ws_bytes = 0;
  for (int s = 0; s < n(); ++s) {
    const RingCall& c = d.blocks[src_of(d.rank, s)].call;
    q_rows = std::max(q_rows, c.q_rows), k_rows = std::max(k_rows, c.k_rows);
    if (c.skip) continue;
    if (backward && entry->bwd_workspace) d.ws_bytes = std::max(d.ws_bytes, entry->bwd_workspace(block_bwd_params(d, s, 0)));
    if (fwd_entry->fwd_workspace) d.ws_bytes = std::max(d.ws_bytes, fwd_entry->fwd_workspace(block_params(d, s, 0)));
  }
  d.ws_bytes = std::max(d.ws_bytes, lent_workspace(d));
  // Q, dO, the own K/V and two receive buffers, the workspace; the forward's running result
  // (none where the blocks merge in place), the partial results (steps 1, 3, ... in the second,
  // steps 2, 4, ... in the first; the own block writes O and lse) and O; the backward's
  // accumulators, two partial gradients, outputs.
  const size_t ws_side = side_fwd ? d.ws_bytes : 0;  // side_bwd implies side_fwd
  const size_t acc_es = merges_in_place(d) ? 0 : 4, parts = n() > 2 ? 2 : 1;
  size_t need = 2 * q_elems(len) * e + 3 * size_t(2 * kv_elems(max_kv)) * e + d.ws_bytes + ws_side;
  need += q_elems(len) * (acc_es + e) + B * H * len * 4 + parts * (q_elems(q_rows) * e + B * H * q_rows * 4);
  // fp32 gradients: no dQ partials, fp32 dK/dV partials.
  const size_t dq_part_elems = f32_grads ? 0 : q_elems(q_rows), part_es = f32_grads ? 4 : e;
  if (backward)
    need += q_elems(dq_rows(len)) * 4 + q_elems(len) * e + B * H * d.shard.len_b * 4 +
            2 * (dq_part_elems * e + 2 * kv_elems(k_rows) * part_es) +
            2 * size_t(2 * kv_elems(max_kv)) * 4 + 2 * kv_elems(len) * e;
  if (side_bwd) need += 2 * kv_elems(len) * 4;  // dkv_own
  if (dq_apart()) need += q_elems(len) * 4;     // dq_own
  use(d);
  require_device_memory(entry->kernel + " (ring rank " + std::to_string(d.rank) + ")", need, d.id);
  bytes_held = std::max(bytes_held, need);
  d.q = upload_array(shard_rows(in.q, dims().H, d.shard));
  {
    const HostArray k = shard_rows(in.k, dims().H_kv, d.shard), v = shard_rows(in.v, dims().H_kv, d.shard);
    const size_t slot = 2 * kv_elems(max_kv) * e;
    d.kv_window.reset();
    if (copy_engine()) {  // the own K/V in slot `rank`, the other's arrives in the other slot
      d.kv_window = window(d, slot);
      d.kv_own = view(d.kv_window->slot(d.rank), slot);
      d.kv[0] = view(d.kv_window->slot(1 - d.rank), slot);
      d.kv[1] = DeviceBuffer();
    } else {
      d.kv_own = transfer_buffer(d, k.nbytes() + v.nbytes());
      for (DeviceBuffer& b : d.kv) b = transfer_buffer(d, slot);
    }
    if (k.nbytes()) {
      CUDA_CHECK(cudaMemcpy(d.kv_own.get(), k.bytes.data(), k.nbytes(), cudaMemcpyHostToDevice));
      CUDA_CHECK(cudaMemcpy(at(d.kv_own, int64_t(k.nbytes())), v.bytes.data(), v.nbytes(), cudaMemcpyHostToDevice));
    }
  }
  d.o_acc = DeviceBuffer(q_elems(len) * acc_es);
  d.lse = DeviceBuffer(B * H * len * 4);
  for (int i = 2 - int(parts); i < 2; ++i) {
    d.o_part[i] = DeviceBuffer(q_elems(q_rows) * e);
    d.lse_part[i] = DeviceBuffer(B * H * q_rows * 4);
  }
  d.o = DeviceBuffer(q_elems(len) * e);
  d.ws = DeviceBuffer(d.ws_bytes);
  if (d.ws_bytes) CUDA_CHECK(cudaMemset(d.ws.get(), 0xFF, d.ws_bytes));  // undefined to the kernel
  d.ws_side = DeviceBuffer(ws_side);
  if (ws_side) CUDA_CHECK(cudaMemset(d.ws_side.get(), 0xFF, ws_side));
  if (backward) {
    d.dout = upload_array(shard_rows(*in.dout, dims().H, d.shard));
    d.lse_b = DeviceBuffer(B * H * d.shard.len_b * 4);
    d.dq_acc = DeviceBuffer(q_elems(dq_rows(len)) * 4);
    const size_t acc_slot = 2 * kv_elems(max_kv) * 4;
    d.acc_window.reset();
    if (copy_engine()) d.acc_window = window(d, acc_slot);
    for (int i = 0; i < 2; ++i) {
      d.dq_part[i] = DeviceBuffer(dq_part_elems * e);
      d.dkv_part[i] = DeviceBuffer(2 * kv_elems(k_rows) * part_es);
      // copy_engine: the first step's accumulator (sent) in slot `rank`, the returning one in the other
      d.acc[i] = copy_engine() ? view(d.acc_window->slot(i == 0 ? d.rank : 1 - d.rank), acc_slot)
                             : transfer_buffer(d, acc_slot);
    }
    d.dq = DeviceBuffer(q_elems(len) * e);
    d.dkv = DeviceBuffer(2 * kv_elems(len) * e);
    if (side_bwd) d.dkv_own = DeviceBuffer(2 * kv_elems(len) * 4);
    if (dq_apart()) d.dq_own = DeviceBuffer(q_elems(len) * 4);
  }
  allocate_lend(d);
  const int32_t* seqlens = in.seqlens_k ? in.seqlens_k->data<int32_t>() : nullptr;
  for (int src = 0; src < n() && seqlens; ++src) {  // each block's keys below each batch element's length
    Block& blk = d.blocks[src];
    HostArray local(DType::I32, {dims().B});
    const RingShard kv = ring_shard(dims().S_k, n(), src);
    for (int b = 0; b < dims().B; ++b)
      local.data<int32_t>()[b] = ring_local_seqlen(kv, blk.call.k_row0, blk.call.k_rows, seqlens[b]);
    blk.seqlens = upload_array(local);
  }
}

}  // namespace flashattn

#endif  // FLASHATTN_HAVE_NCCL
