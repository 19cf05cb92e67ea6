// Kernels of the timing loop (src/timing.cpp): the stream hold and the L2 flush's read pass.
//
// Stream hold. The host enqueues this kernel, then a whole batch of timed repetitions behind it
// (flush, start event, the kernel under test, end event), then advances the released counter: the
// GPU starts the batch only once every launch of it is queued, so no host time (Python dispatch,
// autograd, our own launch overhead) can fall between a repetition's events. The counter is
// monotonic, so a release the spinning thread has not seen yet can never be undone by the next
// hold. The timeout keeps a host that cannot enqueue (a full launch queue) from deadlocking with
// the GPU: the hold then lets go and counts itself, and the host discards that batch.
//
// L2 flush read pass. Writing a buffer larger than L2 evicts everything but leaves L2 full of
// dirty lines that the next kernel pays to write back; reading a second such buffer afterwards
// leaves only clean lines, so every timed kernel (ours and the peers') starts from the same clean,
// cold cache.
#include <cuda_runtime.h>

#include <cstdint>

#include "flashattn/check.h"
#include "flashattn/timing_kernels.h"

namespace flashattn {
namespace {

__device__ __forceinline__ unsigned long long global_timer_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__global__ void stream_hold_kernel(const volatile unsigned long long* released, unsigned long long ticket,
                                   unsigned long long timeout_ns, volatile unsigned int* timeouts) {
  const unsigned long long t0 = global_timer_ns();
  while (*released < ticket) {  // volatile: a fresh read of host memory every time
    if (global_timer_ns() - t0 > timeout_ns) {
      *timeouts = *timeouts + 1;  // one hold at a time per counter: no atomic needed
      __threadfence_system();
      return;
    }
    __nanosleep(500);
  }
}

__global__ void l2_read_kernel(const uint4* buf, size_t n, unsigned int* sink) {
  unsigned int acc = 0;
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n; i += stride) {
    const uint4 v = __ldcg(buf + i);  // cache-global: allocates the line in L2, not in L1
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x9e3779b9u) *sink = acc;
}

}  // namespace

void launch_stream_hold(const volatile unsigned long long* released, unsigned long long ticket,
                        unsigned long long timeout_ns, volatile unsigned int* timeouts, cudaStream_t stream) {
  stream_hold_kernel<<<1, 1, 0, stream>>>(released, ticket, timeout_ns, timeouts);
  // Not CHECK_LAUNCH: a Debug build's synchronising check would wait for the release that only
  // comes after the batch behind the hold is enqueued.
  const cudaError_t err = cudaPeekAtLastError();
  if (err != cudaSuccess) {
    cudaGetLastError();
    throw_cuda_error(err, "launch of stream_hold_kernel", __FILE__, __LINE__);
  }
}

void launch_l2_read(const void* buf, size_t bytes, unsigned int* sink, cudaStream_t stream) {
  const size_t n = bytes / sizeof(uint4);
  if (n == 0) return;
  l2_read_kernel<<<1024, 256, 0, stream>>>(static_cast<const uint4*>(buf), n, sink);
  CHECK_LAUNCH("l2_read_kernel");
}

}  // namespace flashattn
