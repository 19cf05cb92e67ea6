// FLASHATTN_HD marks helpers that compile for both host and device.
#pragma once

#if defined(__CUDACC__)
#define FLASHATTN_HD __host__ __device__
#else
#define FLASHATTN_HD
#endif
