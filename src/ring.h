// Context-parallel (ring) attention over several GPUs of one process, through NCCL: the sequence
// is sharded zig-zag across the GPUs (ring_plan.h), each keeps its query shard, and the K/V shards
// travel around the ring (ncclSend/ncclRecv on a communication stream per GPU, double-buffered, so
// the next shard arrives while the current one is computed; two GPUs exchange by an AllGather on
// NCCL's copy engines instead, ring_impl.h). Any registered kernel that declares
// `partial_outputs` computes the blocks:
//   forward   the own shard first, its block writing O and lse; each later block gives O_p and
//             lse_p, merged in (ring_ops.h) on a third stream while the next block computes: in
//             place on two GPUs, else through an fp32 running result whose last merge writes O.
//   backward  the own shard last; each step's block runs the kernel's backward against the
//             merged O and lse; dQ accumulates locally in fp32, the fp32 dK/dV accumulators
//             travel with the K/V shards and end at their owner with its own block.
// The Session (run.h) drives it: a run with several devices goes through a Ring instead of one
// GPU, and is checked and timed like any other run.
#pragma once

#include <cuda_runtime_api.h>

#include <memory>
#include <string>
#include <vector>

#include "flashattn/registry.h"
#include "problem.h"
#include "run.h"

namespace flashattn {

// "" when this build can run on several GPUs (it found NCCL), else why not.
std::string ring_unavailable();

// "" when `e` can run `p` as a ring over `n_devices` GPUs, else a one-line reason (the kernel does
// not declare partial outputs, a feature the ring does not carry: an additive mask, a window,
// S_q != S_k).
std::string why_ring_unsupported(const KernelMode& e, const Problem& p, int n_devices);

// The ring's outputs against the same kernel's on one GPU: `info`'s bitwise_vs_one_gpu and the
// per-output differences of vs_one_gpu.
void compare_ring_outputs(const KernelOutputs& ring, const KernelOutputs& one_gpu, RingRecord* info);

// With --check: each output's difference from the one-GPU run held to the check's metric and
// tolerance for that output (rec.ring->vs_one_gpu); one beyond it fails the check, with a note.
void judge_ring_vs_one_gpu(RunRecord& rec);

// The console's note for a ring run (per-GPU throughput, transfers not hidden, the scaling).
std::string ring_note(const RingRecord& g, double median_ms);

// What one instrumented repetition of a ring run saw, from events on every GPU's streams.
struct RingProfile {
  std::vector<double> blocks_ms;   // per GPU: from the start to the end of its last block
  std::vector<double> waiting_ms;  // per GPU: transfer waits not hidden (ring_steps.cpp, profile)
  std::vector<std::vector<RingRecord::BlockSpan>> block_spans;  // per GPU (RingRecord::block_spans)
  double total_ms = 0;             // start to the last GPU's end (its outputs written)
  double exposed_comm_ms = 0;      // max over GPUs of waiting_ms: communication not hidden
  double link_gbps = 0;            // the fastest transfer of at least 1 MiB: bytes / its time
};

class Ring {
 public:
  // Devices in ring order (rank i = devices[i]); creates the streams and the communicator (one
  // per device, ncclCommInitAll) and sets NCCL_NVLS_ENABLE=0 in the process environment first.
  explicit Ring(std::vector<int> devices);
  // One rank of a ring whose ranks are processes, one GPU each (the way it runs across nodes):
  // `device` is this process's GPU; the NCCL unique id goes through `me.id_file`, which rank 0
  // creates (refusing one that exists: each launch needs a new path) and removes once every rank
  // has joined, and the others wait for (up to two minutes).
  Ring(int device, const RingProcess& me);
  ~Ring();
  Ring(const Ring&) = delete;
  Ring& operator=(const Ring&) = delete;

  int size() const;                        // GPUs in the ring
  const std::vector<int>& devices() const;  // the GPUs this process drives, in ring order
  // Whether this process gathers the outputs and reports (the single process, or rank 0).
  bool root() const;
  // After prepare: whether the backward's kernel keeps the gradients in fp32 (ring_impl.h).
  bool fp32_gradients() const;
  // After prepare: whether the own block runs beside the others on a second kernels' stream.
  bool side_stream() const;
  // After prepare: whether that own block waits for the first K/V shard before it starts (ring_impl.h).
  bool side_after_first_shard() const;
  // After prepare: whether the forward's last block takes the whole GPU (two GPUs; ring_impl.h).
  bool last_block_alone() const;
  // After prepare: whether that last block merges into the outputs in its kernel (ring_impl.h).
  bool last_block_merges() const;
  // After prepare: whether NCCL sends from and receives into buffers registered with it
  // (zero-copy between the GPUs of a node; ring_impl.h).
  bool registered_buffers() const;
  // After prepare: whether two GPUs exchange by NCCL's copy engines, no SM taken (ring_impl.h).
  bool copy_engine() const;
  // Whether one GPU plays every rank (its index listed for each, `--devices 0,0`): the transfers
  // are copies on that GPU, the ring's steps otherwise the same (ring_impl.h). For checking a ring
  // on one GPU; its times are not a ring's.
  bool loopback() const;
  // After prepare: the rank that lends kv heads of its other block to the other GPU (-1: none),
  // and how many kv heads' worth (key tiles: may be a fraction; two GPUs, backward,
  // FLASHATTN_RING_LEND; ring_impl.h).
  int lend_rank() const;
  double lend_kv_heads() const;
  // After prepare: whether the lending was chosen from a measured lag (FLASHATTN_RING_LEND=auto;
  // lend_rank() says what it chose, -1 for none), and that lag in ms (the GPUs' blocks' ends).
  bool lend_auto() const;
  double lend_lag_ms() const;

  // Uploads the shards of `in` (host inputs in the problem's layout) for kernel `e` (its forward
  // or backward entry) and allocates every buffer; a backward also runs the ring forward once
  // (not timed) for O and lse. InputError when a device lacks the memory.
  void prepare(const KernelMode& e, const RunInputs& in, bool deterministic);
  // Sets the outputs to NaN (every dtype's all-ones pattern), so an element not written fails.
  void poison_outputs();
  // Enqueues one repetition behind `start` (an event the caller recorded on the first device's
  // stream `stream0`), and makes `stream0` wait for its end: every GPU's work lies between the
  // events the caller records on `stream0`. `flush` also leaves every other GPU's L2 clean first.
  void enqueue(cudaStream_t stream0, bool flush);
  // The outputs gathered from every shard, in the problem's layout (O and lse, or dQ, dK, dV);
  // across processes every rank must call it (the shards go to rank 0), and only the root's
  // result holds anything.
  KernelOutputs gather() const;
  // Every rank's `values` (the same count on each), in rank order. Across processes every rank
  // must call it, and none returns before all have: the ranks can take turns by it. One process:
  // `values` as given.
  std::vector<double> share(const std::vector<double>& values) const;
  // One repetition with timing events on every stream (after the timed loop).
  RingProfile profile(cudaStream_t stream0);
  // Attention FLOPs each GPU computes (the blocks its steps run), in the problem's counting.
  std::vector<double> flops_per_device() const;
  // Device bytes the ring holds per GPU (shards, buffers, workspace), the largest over the GPUs.
  size_t bytes_per_device() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace flashattn
