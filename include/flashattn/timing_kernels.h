// The device side of the timing loop (src/timing.h): the kernel that holds a stream until the host
// has enqueued a batch of repetitions, and the read pass of the L2 flush.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

namespace flashattn {

// Enqueues one thread that spins until *released >= ticket (a counter in host-mapped memory that
// the host advances) or until timeout_ns of %globaltimer have passed; a timeout adds 1 to
// *timeouts (host-mapped too), so the host can tell that the work behind the hold may have waited
// for it. Both pointers are device views of cudaHostAllocMapped memory.
void launch_stream_hold(const volatile unsigned long long* released, unsigned long long ticket,
                        unsigned long long timeout_ns, volatile unsigned int* timeouts, cudaStream_t stream);

// Reads `bytes` (a multiple of 16) at the 16-byte-aligned device buffer `buf` through L2, every
// line once; the loads' data only decide whether `sink` (never written for a zero buffer) is
// stored, so they cannot be optimised away.
void launch_l2_read(const void* buf, size_t bytes, unsigned int* sink, cudaStream_t stream);

}  // namespace flashattn
