/* libflashattn_capi: what an outside timing or checking script (scripts/peers.py) shares with
 * flashattn, through a C interface that ctypes can load. The functions run the same code the driver
 * runs, so a PyTorch backend timed and checked through them is measured exactly as our kernels are:
 *
 *   stream hold   a spin kernel that keeps a stream from starting the work enqueued behind it until
 *                 the host releases it: every repetition of a batch is enqueued before the first
 *                 one runs, so no host time can fall between a repetition's events (timing.h)
 *   L2 flush      writes one buffer and then reads another, each twice the L2 size, so the next
 *                 kernel finds L2 holding clean lines of neither its inputs nor anybody's outputs
 *   inputs        the counter-based N(0, 1) generator of `flashattn --sweep` (device_fill.h): the
 *                 same seed gives the same Q, K, V, dO values
 *   check         `--check` on host tensors: fp64 reference and same-dtype naive baseline on the
 *                 same sampled rows, the same rules, the same "check" JSON object (validate.h)
 *
 * Every call that can fail returns 0 (or a non-null handle) on success and -1 (or NULL) on
 * failure; fa_last_error() then describes the failure (per thread). Streams are cudaStream_t /
 * CUstream handles of the caller's CUDA context (e.g. torch.cuda.current_stream().cuda_stream);
 * the current device is used. */
#ifndef FLASHATTN_CAPI_H
#define FLASHATTN_CAPI_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

#define FA_CAPI_VERSION 1

#if defined(__GNUC__)
#define FA_API __attribute__((visibility("default")))
#else
#define FA_API
#endif

FA_API int fa_capi_version(void);
FA_API const char* fa_last_error(void);

/* Stream hold. fa_hold_enqueue puts a spin kernel on `stream` that waits for the matching
 * fa_hold_release (or for `timeout_s` seconds, after which it lets the stream go on and counts a
 * timeout: the work behind it may then have had host time between its events). */
FA_API void* fa_hold_create(void);
FA_API int fa_hold_enqueue(void* hold, void* stream, double timeout_s);
FA_API int fa_hold_release(void* hold);
FA_API long long fa_hold_timeouts(void* hold);
FA_API void fa_hold_destroy(void* hold);

/* L2 flush: `l2_bytes` <= 0 takes the current device's L2 size. */
FA_API void* fa_flush_create(long long l2_bytes);
FA_API int fa_flush_enqueue(void* flush, void* stream);
FA_API long long fa_flush_bytes(void* flush);
FA_API void fa_flush_destroy(void* flush);

/* Fills `n` elements of dtype (0 fp32, 1 fp16, 2 bf16) at device pointer `dst` on `stream`:
 * element i of tensor `tensor` (1 Q, 2 K, 3 V, 4 dO in flashattn's sweeps) is N(0, 1) drawn from
 * (seed, tensor, i). */
FA_API int fa_fill_normal(void* dst, int dtype, long long n, unsigned long long seed, unsigned long long tensor,
                   void* stream);

/* --check on host tensors. `problem_json` is an object with
 *   "B", "H", "H_kv", "S_q", "S_k", "D", "dtype" ("fp32" | "fp16" | "bf16"), "mode" ("forward" |
 *   "backward"), and optionally "causal" (false), "window_left" / "window_right" (-1), "scale"
 *   (1/sqrt(D)), "seed" (0: which rows are sampled), "budget_macs" (8e9), "threads" (0: all).
 *   "mask_shape" ([mB, mH, S_q, S_k], mB in {1, B}, mH in {1, H}: required with a mask).
 * `tensors` holds 11 host pointers, contiguous bhsd in the dtype unless said otherwise:
 *   [0] Q  [1] K  [2] V  [3] dO (backward)  [4] O  [5] lse (float32 [B, H, S_q])  [6] dQ  [7] dK
 *   [8] dV  [9] seqlens_k (int32 [B], or NULL)  [10] additive mask (float32, mask_shape, or NULL)
 * The inputs (Q, K, V, and dO for backward) are required; each output that is non-NULL is checked
 * (O and lse in forward, dQ, dK, dV in backward). Returns the "check" object of flashattn's JSON
 * as a string to release with fa_free, or NULL on a bad problem. */
FA_API char* fa_check_attention(const char* problem_json, const void* const* tensors);
FA_API void fa_free(char* p);

/* The same check for several sets of outputs of one problem (each PyTorch backend of a point):
 * fa_checker_create takes the problem and the inputs ([0..3], [9], [10] of `tensors`; they are
 * copied), the reference and baseline are computed at the first fa_checker_check and reused; each
 * fa_checker_check takes the outputs ([4..8]) and returns the "check" JSON as fa_check_attention
 * does. */
FA_API void* fa_checker_create(const char* problem_json, const void* const* tensors);
FA_API char* fa_checker_check(void* checker, const void* const* tensors);
FA_API void fa_checker_destroy(void* checker);

#ifdef __cplusplus
}
#endif

#endif /* FLASHATTN_CAPI_H */
