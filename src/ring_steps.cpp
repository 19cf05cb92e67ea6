// The steps of a ring repetition (ring_impl.h): K/V and the backward's accumulators passed
// around the ring by NCCL on the transfer stream, each step's block on the compute stream, the
// merges and accumulations on the merge stream under the next block; and the profile of one
// repetition from events on every stream.
#ifdef FLASHATTN_HAVE_NCCL

#include <string>
#include <vector>

#include "flashattn/ring_ops.h"
#include "nvtx.h"
#include "ring_impl.h"

namespace flashattn {

using namespace ring_detail;

void Ring::Impl::group_begin() {
  if (!loopback) NCCL_CHECK(ncclGroupStart());
}

void Ring::Impl::send(Dev& d, const void* buf, size_t bytes, int peer) {
  if (!loopback) {
    NCCL_CHECK(ncclSend(buf, bytes, ncclUint8, peer, d.nccl, d.comm));
    return;
  }
  loop_sends.push_back({d.rank, peer, bytes});
  loop_send_bufs.push_back(const_cast<void*>(buf));
}

void Ring::Impl::recv(Dev& d, void* buf, size_t bytes, int peer) {
  if (!loopback) {
    NCCL_CHECK(ncclRecv(buf, bytes, ncclUint8, peer, d.nccl, d.comm));
    return;
  }
  loop_recvs.push_back({peer, d.rank, bytes});
  loop_recv_bufs.push_back(buf);
}

// The loopback's group: each send meets the receive its receiver posted for it
// (ring_pair_transfers), a copy on the receiver's transfer stream.
void Ring::Impl::group_end() {
  if (!loopback) {
    NCCL_CHECK(ncclGroupEnd());
    return;
  }
  std::vector<RingTransfer> sends, recvs;
  std::vector<void*> from, into;
  sends.swap(loop_sends), recvs.swap(loop_recvs), from.swap(loop_send_bufs), into.swap(loop_recv_bufs);
  std::string error;
  const std::vector<int> pair = ring_pair_transfers(sends, recvs, &error);
  if (!error.empty()) throw RuntimeError("ring (one GPU): " + error);
  for (Dev& d : devs) {
    use(d);
    CUDA_CHECK(cudaEventRecord(d.loop_ready, d.comm));  // what each rank enqueued before the group
  }
  for (size_t i = 0; i < sends.size(); ++i) {
    Dev& to = devs[sends[i].to];
    use(to);
    CUDA_CHECK(cudaStreamWaitEvent(to.comm, devs[sends[i].from].loop_ready, 0));
    CUDA_CHECK(cudaMemcpyAsync(into[pair[i]], from[i], sends[i].bytes, cudaMemcpyDeviceToDevice, to.comm));
  }
  for (Dev& d : devs) {
    use(d);
    CUDA_CHECK(cudaEventRecord(d.loop_done, d.comm));
  }
  for (Dev& d : devs)  // a sender's buffer is free, as after NCCL's group, once its copies are done
    for (const Dev& o : devs)
      if (&o != &d) {
        use(d);
        CUDA_CHECK(cudaStreamWaitEvent(d.comm, o.loop_done, 0));
      }
}

// Every rank sends `send(r)` (the buffer of the block it used at step s: bytes_of(src) bytes)
// to the next rank and receives from the previous one into `recv(r)`: one NCCL group over all
// devices (one thread drives them all).
template <class SendBuf, class RecvBuf, class Bytes>
void Ring::Impl::ring_shift(int s, SendBuf send, RecvBuf recv, Bytes bytes_of, Timeline* tl,
                            std::unique_ptr<Window> Dev::*window) {
  group_transfer(tl, [&](Dev& d) {
    if (copy_engine()) {  // two GPUs: the slot of this rank to the other's window, by copy engine
      const Window& w = *(d.*window);
      if (send(d) != w.slot(d.rank) || recv(d) != w.slot(1 - d.rank))
        throw RuntimeError("ring: a copy-engine transfer between buffers that are not its window's slots");
      if (w.slot_bytes())
        NCCL_CHECK(ncclAllGather(w.slot(d.rank), w.mem.get(), w.slot_bytes(), ncclUint8, d.nccl, d.comm));
      return double(w.slot_bytes());
    }
    const size_t out = bytes_of(src_of(d.rank, s)), in = bytes_of(src_of(prev(d.rank), s));
    if (out) this->send(d, send(d), out, next(d.rank));
    if (in) this->recv(d, recv(d), in, prev(d.rank));
    return double(in);
  });
}

// The K/V of step s into its buffer (each rank passes on what it used at step s - 1), once the
// buffer is free (step s - 2 computed from it). Steps on the own shard need none.
void Ring::Impl::fetch_kv(int s, Timeline* tl) {
  if (s >= n() || own_step(s)) return;
  for (Dev& d : devs) {
    use(d);
    if (s >= 2) CUDA_CHECK(cudaStreamWaitEvent(d.comm, d.computed[s - 2], 0));
  }
  ring_shift(
      s - 1, [&](Dev& d) { return kv_buffer(d, s - 1).get(); }, [&](Dev& d) { return kv_buffer(d, s).get(); },
      [&](int r) { return kv_bytes_of(r); }, tl, &Dev::kv_window);
  for (Dev& d : devs) {
    use(d);
    CUDA_CHECK(cudaEventRecord(d.kv_arrived[s], d.comm));
  }
}

// `stream` waits for `e`, a transfer's end; timed under profile().
void Ring::Impl::wait_for(Dev& d, cudaStream_t stream, cudaEvent_t e, Timeline* tl, bool alone) {
  if (tl) {
    tl->wait_in[d.rank].push_back(make_event(true));
    CUDA_CHECK(cudaEventRecord(tl->wait_in[d.rank].back(), stream));
  }
  CUDA_CHECK(cudaStreamWaitEvent(stream, e, 0));
  if (tl) {
    tl->wait_out[d.rank].push_back(make_event(true));
    CUDA_CHECK(cudaEventRecord(tl->wait_out[d.rank].back(), stream));
    tl->wait_on_kernels[d.rank].push_back(stream == d.compute || stream == d.side);
    tl->wait_alone[d.rank].push_back(alone);
  }
}

void Ring::Impl::enqueue(cudaStream_t stream0, bool flush, Timeline* tl) {
  CUDA_CHECK(cudaSetDevice(devs[0].id));
  CUDA_CHECK(cudaEventRecord(start, stream0));
  for (Dev& d : devs) {
    use(d);
    if (flush && d.flusher) d.flusher->flush(d.compute);  // while rank 0 flushes before `start`
    for (cudaStream_t st : {d.compute, d.comm, d.merge, d.side}) CUDA_CHECK(cudaStreamWaitEvent(st, start, 0));
    if (tl) CUDA_CHECK(cudaEventRecord(tl->begin[d.rank], d.compute));
    if (backward) zero_accumulators(d);
  }
  fetch_kv(0, tl);  // the backward's first shard
  if (lending()) send_lend_inputs(tl);
  // Step s's block on its stream (ctx_of), once its K/V has arrived and its partial buffers
  // were merged from (at step s - 2).
  auto compute_step = [&](Dev& d, int s) {
    LaunchContext ctx = ctx_of(d, s);
    if (last_alone(s)) ctx.shares_device = false;
    const cudaStream_t stream = ctx.stream;
    // Gated (side_gated), the own block waits for the first shard as well (untimed: the others'
    // wait for it is timed, with nothing beside it).
    const bool gated = backward && side_gated;
    if (gated && on_side(s)) CUDA_CHECK(cudaStreamWaitEvent(stream, d.kv_arrived[0], 0));
    if (!own_step(s)) wait_for(d, stream, d.kv_arrived[s], tl, gated && s == 0);
    const bool uses_parts = !(backward && on_side(s));  // else the own block's own buffers
    if (s >= 2 && uses_parts) CUDA_CHECK(cudaStreamWaitEvent(stream, d.merged[s - 2], 0));
    const RingCall& call = block_of(d, s).call;
    if (!call.skip) {
      RingRecord::BlockSpan span;
      span.step = s, span.src = src_of(d.rank, s), span.side = stream == d.side, span.causal = call.causal;
      span.q_rows = call.q_rows, span.k_rows = call.k_rows;
      timed_block(d, stream, span, tl, [&] {
        if (backward)
          entry->bwd(block_bwd_params(d, s, s & 1), ctx);
        else
          entry->fwd(block_params(d, s, s & 1), ctx);
      });
    }
    CUDA_CHECK(cudaEventRecord(d.computed[s], stream));
    if (tl && side() && own_step(s)) CUDA_CHECK(cudaEventRecord(tl->own_end[d.rank], stream));
  };
  if (backward && side()) {  // the own block beside the others from the start
    NvtxRange range("ring own block");
    for (Dev& d : devs) {
      use(d);
      compute_step(d, n() - 1);
    }
  }
  for (int s = 0; s < n(); ++s) {
    NvtxRange range("ring step " + std::to_string(s));
    fetch_kv(s + 1, tl);  // the next step's K/V travels while this step computes
    for (Dev& d : devs) {
      use(d);
      if (!(backward && side() && own_step(s))) compute_step(d, s);  // else enqueued above
      CUDA_CHECK(cudaStreamWaitEvent(d.merge, d.computed[s], 0));
      if (backward)
        accumulate_step(d, s, tl);
      else
        merge_step(d, s);
      CUDA_CHECK(cudaEventRecord(d.merged[s], d.merge));
    }
    if (backward && s + 1 < n()) {  // the accumulators move on to the rank that computes them next
      for (Dev& d : devs) {
        use(d);
        CUDA_CHECK(cudaStreamWaitEvent(d.comm, d.merged[s], 0));
      }
      ring_shift(
          s, [&](Dev& d) { return d.acc[s & 1].get(); }, [&](Dev& d) { return d.acc[(s + 1) & 1].get(); },
          [&](int r) { return acc_bytes_of(r); }, tl, &Dev::acc_window);
      for (Dev& d : devs) {
        use(d);
        CUDA_CHECK(cudaEventRecord(d.acc_arrived[s], d.comm));
      }
    }
    if (lending() && s == 0) {  // the helper's part of the owner's block, once its accumulator is here
      for (Dev& d : devs)
        if (d.rank != lend_rank) compute_lent(d, tl);
      return_lent_dq(tl);
    }
  }
  for (Dev& d : devs) {
    use(d);
    if (side() && n() > 1) CUDA_CHECK(cudaStreamWaitEvent(d.compute, d.computed[n() - 1], 0));  // side's last
    if (tl) CUDA_CHECK(cudaEventRecord(tl->compute_end[d.rank], d.compute));
    const int len = d.shard.len();
    if (backward) {  // the last step's block was the own one: its accumulator is complete here
      if (lending()) {  // the lent heads' dQ into the owner's; at the helper, their dK/dV are in acc
        if (d.rank == lend_rank)
          add_lent_dq(d, tl);
        else  // (sent: the lent block has ended, and its dQ buffer is free for the next repetition)
          CUDA_CHECK(cudaStreamWaitEvent(d.merge, d.lend_dq_arrived, 0));
      }
      if (dq_accum && len > 0) {  // the kernel's layout: its own pass writes it out
        BwdParams fin;
        fin.dtype = prob.dtype, fin.B = dims().B, fin.H = dims().H, fin.S_q = len, fin.D = dims().D;
        fin.scale = forward_params(prob).scale;
        fin.dq = d.dq.get(), fin.dq_st = ring_packed(dims().H, len, dims().D);
        fin.dq_accum = static_cast<float*>(d.dq_acc.get()), fin.dq_accum_rows = dq_rows(len);
        LaunchContext on_merge = d.ctx;
        on_merge.stream = d.merge;
        entry->dq_finish(fin, on_merge);
      } else if (dq_apart()) {  // plus the own block's
        ring_add_round(prob.dtype, static_cast<const float*>(d.dq_own.get()),
                       static_cast<const float*>(d.dq_acc.get()), d.dq.get(), q_elems(len), d.merge);
      } else {
        ring_round(prob.dtype, static_cast<const float*>(d.dq_acc.get()), d.dq.get(), q_elems(len), d.merge);
      }
      const float* acc = static_cast<const float*>(d.acc[(n() - 1) & 1].get());
      if (f32_grads && !d.blocks[d.rank].call.skip)  // plus the own block's fp32 dK/dV (all its keys)
        ring_add_round(prob.dtype,
                       static_cast<const float*>((side() ? d.dkv_own : d.dkv_part[(n() - 1) & 1]).get()), acc,
                       d.dkv.get(), 2 * kv_elems(len), d.merge);
      else
        ring_round(prob.dtype, acc, d.dkv.get(), 2 * kv_elems(len), d.merge);
    }
    if (tl) CUDA_CHECK(cudaEventRecord(tl->end[d.rank], d.merge));
    CUDA_CHECK(cudaEventRecord(d.done, d.merge));
  }
  CUDA_CHECK(cudaSetDevice(devs[0].id));
  for (Dev& d : devs) CUDA_CHECK(cudaStreamWaitEvent(stream0, d.done, 0));
}

// The dQ accumulator (the kernels add into it), the first step's dK/dV accumulator and, where
// the own block's dQ is apart (dq_apart), its buffer, zeroed on the compute stream before any
// block. With fp32 gradients the first step's block stores its dK/dV into that accumulator
// (every key row of the block: registry.h's fp32_gradients): only the source shard's other rows
// are zeroed: none where the block takes all its keys, half where it takes one chunk of two (at
// 64k the first 1 GB or 0.5 GB less before the own block starts).
void Ring::Impl::zero_accumulators(Dev& d) {
  ring_fill(static_cast<float*>(d.dq_acc.get()), 0.f, q_elems(dq_rows(d.shard.len())), d.compute);
  const int src = src_of(d.rank, 0), len_src = shard_len(src);
  const RingCall& c = d.blocks[src].call;
  float* acc = static_cast<float*>(d.acc[0].get());
  if (!f32_grads || own_step(0) || c.skip) {
    ring_fill(acc, 0.f, 2 * kv_elems(max_len()), d.compute);
  } else {  // per (dK or dV, batch, kv head): the rows before and after the block's
    const size_t pitch = size_t(len_src) * dims().D * 4, height = 2 * size_t(dims().B) * dims().H_kv;
    const size_t before = size_t(c.k_row0) * dims().D * 4, after = pitch - before - size_t(c.k_rows) * dims().D * 4;
    if (before) CUDA_CHECK(cudaMemset2DAsync(acc, pitch, 0, before, height, d.compute));
    if (after) CUDA_CHECK(cudaMemset2DAsync(reinterpret_cast<char*>(acc) + pitch - after, pitch, 0, after, height, d.compute));
  }
  if (dq_apart()) ring_fill(static_cast<float*>(d.dq_own.get()), 0.f, q_elems(d.shard.len()), d.compute);
  CUDA_CHECK(cudaEventRecord(d.zeroed, d.compute));
  CUDA_CHECK(cudaStreamWaitEvent(d.side, d.zeroed, 0));
}

// Forward, on the merge stream. The own block (step 0) wrote the outputs O and lse itself. Where
// one other block follows it (two GPUs), that block is merged into them in place; else O goes to
// the fp32 running result, the blocks between are merged into it, and the last one is merged and
// the output written in the dtype in the same pass.
void Ring::Impl::merge_step(Dev& d, int s) {
  const RingCall& c = d.blocks[src_of(d.rank, s)].call;
  const int len = d.shard.len(), last = last_block(d);
  if (c.skip || last <= 0 || merges_in_kernel(s)) return;
  const int B = dims().B, H = dims().H, D = dims().D;
  const void* o_part = d.o_part[s & 1].get();
  const float* lse_part = static_cast<const float*>(d.lse_part[s & 1].get());
  float* o_acc = static_cast<float*>(d.o_acc.get());
  float* lse = static_cast<float*>(d.lse.get());
  if (merges_in_place(d)) {
    if (s > 0)
      ring_merge_in_place(prob.dtype, o_part, lse_part, d.o.get(), lse, B, H, c.q_rows, c.q_row0, len, D, d.merge);
  } else if (s == 0) {
    ring_merge_first(prob.dtype, d.o.get(), lse, o_acc, lse, int64_t(B) * H * len, D, d.merge);
  } else if (s == last) {
    ring_merge_last(prob.dtype, o_part, lse_part, o_acc, lse, d.o.get(), B, H, c.q_rows, c.q_row0, len, D, d.merge);
  } else {
    ring_merge_block(prob.dtype, o_part, lse_part, o_acc, lse, B, H, c.q_rows, c.q_row0, len, D, d.merge);
  }
}

// Backward, on the merge stream: dQ into its accumulator, dK/dV into the travelling one (which
// arrived with the previous step's transfer).
void Ring::Impl::accumulate_step(Dev& d, int s, Timeline* tl) {
  const int src = src_of(d.rank, s);
  const RingCall& c = d.blocks[src].call;
  const int len = d.shard.len(), len_src = shard_len(src);
  if (s > 0) wait_for(d, d.merge, d.acc_arrived[s - 1], tl);
  if (c.skip) return;
  const int B = dims().B, D = dims().D;
  if (f32_grads) {
    // dQ is in dq_acc already; step 0 stored into the accumulator, the last step's partial is
    // added when the outputs are rounded (enqueue); a step in between adds its fp32 partial.
    if (s == 0 || s == n() - 1) return;
    const float* part = static_cast<const float*>(d.dkv_part[s & 1].get());
    float* acc = static_cast<float*>(d.acc[s & 1].get());
    for (int half = 0; half < 2; ++half)  // dK, then dV
      ring_accumulate(DType::F32, part + half * kv_elems(c.k_rows), acc + half * kv_elems(len_src), B, dims().H_kv,
                      c.k_rows, c.k_row0, len_src, D, d.merge);
    return;
  }
  ring_accumulate(prob.dtype, d.dq_part[s & 1].get(), static_cast<float*>(d.dq_acc.get()), B, dims().H, c.q_rows,
                  c.q_row0, len, D, d.merge);
  float* acc = static_cast<float*>(d.acc[s & 1].get());
  const DeviceBuffer& part = d.dkv_part[s & 1];
  ring_accumulate(prob.dtype, part.get(), acc, B, dims().H_kv, c.k_rows, c.k_row0, len_src, D, d.merge);
  ring_accumulate(prob.dtype, at(part, kv_elems(c.k_rows) * int64_t(es())), acc + kv_elems(len_src), B, dims().H_kv,
                  c.k_rows, c.k_row0, len_src, D, d.merge);
}

void Ring::enqueue(cudaStream_t stream0, bool flush) { impl_->enqueue(stream0, flush, nullptr); }

RingProfile Ring::profile(cudaStream_t stream0) {
  Impl& s = *impl_;
  Impl::Timeline tl;
  // Indexed by rank, as every Timeline is: a process of a multi-process ring holds one of them.
  for (auto* v : {&tl.wait_in, &tl.wait_out, &tl.comm_in, &tl.comm_out, &tl.block_in, &tl.block_out}) v->resize(s.n());
  tl.blocks.resize(s.n());
  tl.comm_bytes.resize(s.n());
  tl.wait_on_kernels.resize(s.n());
  tl.wait_alone.resize(s.n());
  tl.begin.resize(s.n());
  tl.end.resize(s.n());
  tl.compute_end.resize(s.n());
  tl.own_end.resize(s.n());
  for (Impl::Dev& d : s.devs) {
    s.use(d);
    tl.begin[d.rank] = make_event(true);
    tl.end[d.rank] = make_event(true);
    tl.compute_end[d.rank] = make_event(true);
    tl.own_end[d.rank] = make_event(true);
  }
  s.enqueue(stream0, true, &tl);
  RingProfile p;
  for (Impl::Dev& d : s.devs) {
    s.use(d);
    for (cudaStream_t st : {d.compute, d.merge, d.comm, d.side}) CUDA_CHECK(cudaStreamSynchronize(st));
    float ms = 0, end_ms = 0;
    CUDA_CHECK(cudaEventElapsedTime(&end_ms, tl.begin[d.rank], tl.end[d.rank]));
    CUDA_CHECK(cudaEventElapsedTime(&ms, tl.begin[d.rank], tl.compute_end[d.rank]));
    p.blocks_ms.push_back(ms);
    // Not hidden: a wait of a kernels' stream stalls the blocks, except while the own block
    // runs on the other kernels' stream (side(): the own block's stream never waits, and runs
    // from the start; gated, it waits for the first shard too, and that wait is exposed whole);
    // a wait of the merge stream (the backward's accumulators) costs only what lies past the
    // last block's end.
    double waiting = 0;
    for (size_t i = 0; i < tl.wait_in[d.rank].size(); ++i) {
      CUDA_CHECK(cudaEventElapsedTime(&ms, tl.wait_in[d.rank][i], tl.wait_out[d.rank][i]));
      const bool on_kernels = tl.wait_on_kernels[d.rank][i];
      if (!tl.wait_alone[d.rank][i] && (!on_kernels || s.side())) {
        float past = 0;
        CUDA_CHECK(cudaEventElapsedTime(&past, on_kernels ? tl.own_end[d.rank] : tl.compute_end[d.rank],
                                        tl.wait_out[d.rank][i]));
        ms = std::clamp(past, 0.f, ms);
      }
      waiting += ms;
    }
    // The link's rate: the best transfer's bytes over its time (a transfer's events also hold
    // the wait for its partner, so the fastest is the closest to the link's own rate).
    for (size_t i = 0; i < tl.comm_in[d.rank].size(); ++i) {
      CUDA_CHECK(cudaEventElapsedTime(&ms, tl.comm_in[d.rank][i], tl.comm_out[d.rank][i]));
      if (ms > 0 && tl.comm_bytes[d.rank][i] >= (1 << 20))
        p.link_gbps = std::max(p.link_gbps, tl.comm_bytes[d.rank][i] / (ms * 1e-3) / 1e9);
    }
    p.waiting_ms.push_back(waiting);
    std::vector<RingRecord::BlockSpan> spans = tl.blocks[d.rank];
    for (size_t i = 0; i < spans.size(); ++i) {
      CUDA_CHECK(cudaEventElapsedTime(&ms, tl.begin[d.rank], tl.block_in[d.rank][i]));
      spans[i].begin_ms = ms;
      CUDA_CHECK(cudaEventElapsedTime(&ms, tl.begin[d.rank], tl.block_out[d.rank][i]));
      spans[i].end_ms = ms;
    }
    p.block_spans.push_back(std::move(spans));
    p.total_ms = std::max(p.total_ms, double(end_ms));
    p.exposed_comm_ms = std::max(p.exposed_comm_ms, waiting);
  }
  for (Impl::Dev& d : s.devs) {
    s.use(d);
    for (cudaEvent_t e : {tl.begin[d.rank], tl.end[d.rank], tl.compute_end[d.rank], tl.own_end[d.rank]})
      cudaEventDestroy(e);
    for (auto* v : {&tl.wait_in[d.rank], &tl.wait_out[d.rank], &tl.comm_in[d.rank], &tl.comm_out[d.rank],
                    &tl.block_in[d.rank], &tl.block_out[d.rank]})
      for (cudaEvent_t e : *v) cudaEventDestroy(e);
  }
  CUDA_CHECK(cudaSetDevice(s.devs[0].id));
  return p;
}

}  // namespace flashattn

#endif  // FLASHATTN_HAVE_NCCL
