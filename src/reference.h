// The oracle: attention forward and backward in fp64, multi-threaded, written plainly from the
// definitions (no code shared with the kernels), supporting every feature any kernel supports.
//
// Definitions (bhsd, query head h uses kv head g = h / (H / H_kv)):
//   s_ij = scale * <q_i, k_j> + mask[b, h, i, j]          (mask term only when a mask is given)
//   key j visible to query i:  j < seqlen_k(b),
//                               causal:       j <= i + S_k - S_q
//                               window l >= 0: j >= i + S_k - S_q - l
//                               window r >= 0: j <= i + S_k - S_q + r
//   lse_i = log sum_{visible j} exp(s_ij);  P_ij = exp(s_ij - lse_i);  O_i = sum_j P_ij v_j
//   a row with no visible key, or only -inf scores: O_i = 0, lse_i = -inf, no gradient flows.
//   dP_ij = <dO_i, v_j>;  D_i = <dO_i, O_i>;  dS_ij = P_ij (dP_ij - D_i)
//   dQ_i = scale sum_j dS_ij k_j;  dK_j = scale sum_{i, h in group} dS_ij q_i;
//   dV_j = sum_{i, h in group} P_ij dO_i
#pragma once

#include <cstdint>
#include <vector>

#include "flashattn/params.h"
#include "problem.h"

namespace flashattn {

struct RefInputs {
  Dims dims;
  double scale = 0.0;
  bool causal = false;
  int window_left = -1;   // -1: unbounded
  int window_right = -1;  // -1: unbounded
  const double* q = nullptr;     // [B, H, S_q, D] contiguous
  const double* k = nullptr;     // [B, H_kv, S_k, D] contiguous
  const double* v = nullptr;     // [B, H_kv, S_k, D] contiguous
  const double* dout = nullptr;  // [B, H, S_q, D] contiguous; backward only
  const int32_t* seqlens_k = nullptr;  // [B] or null
  MaskView mask;                       // host float32 with broadcast strides, or ptr == null
  int threads = 0;                     // 0: std::thread::hardware_concurrency()
};

struct RowId {
  int b = 0;
  int h = 0;  // query head for query rows; kv head for key rows
  int i = 0;  // query index for query rows; key index for key rows
};

// <a, b> in fp64, in an order that does not depend on threading (the references' inner product).
double dot_f64(const double* a, const double* b, int n);

// The reference's code path on this CPU: "avx2" (the copy built with AVX2, where the CPU has it)
// or "baseline" (the target's baseline instructions; FLASHATTN_REFERENCE_ISA=baseline forces it).
// Both give bitwise identical results (reference.cpp).
const char* reference_instruction_set();

// Whole tensors: o [B, H, S_q, D], lse [B, H, S_q].
void reference_forward(const RefInputs& in, double* o, double* lse);
// Whole tensors: dq like Q, dk and dv like K.
void reference_backward(const RefInputs& in, double* dq, double* dk, double* dv);

// Selected rows only (for large problems): o is rows.size() x D, lse rows.size().
void reference_forward_rows(const RefInputs& in, const std::vector<RowId>& rows, double* o, double* lse);
// dq for the query rows (q_rows.size() x D); dk, dv for the key rows (k_rows.size() x D). Cost is
// one full forward pass over each (b, kv head) group that a key row belongs to.
void reference_backward_rows(const RefInputs& in, const std::vector<RowId>& q_rows, double* dq,
                             const std::vector<RowId>& k_rows, double* dk, double* dv);

// The same-dtype baseline of the fp16/bf16 check rule (validate.h), on the same rows: attention as
// a framework's unfused kernels compute it in `dtype` (fp16 or bf16), the rounding points of
// kernels/naive_fwd.cu and naive_bwd.cu:
//   S = scale * Q K^T (+ mask) in fp32;  lse in fp32;  P = exp(S - lse) rounded to the dtype
//   O = P V summed in fp32, rounded;  D_i = <dO_i, O_i> in fp32 over the rounded O
//   dS = P (dO V^T - D) in fp32, rounded;  dQ = scale dS K, dK = scale dS^T Q, dV = P^T dO summed
//   in fp32, rounded.
// The inputs are the dtype's values (as doubles). Computing it on the host for the checked rows
// only keeps the rule available at any size the kernels can run.
void baseline_forward_rows(const RefInputs& in, DType dtype, const std::vector<RowId>& rows, double* o, double* lse);
void baseline_backward_rows(const RefInputs& in, DType dtype, const std::vector<RowId>& q_rows, double* dq,
                            const std::vector<RowId>& k_rows, double* dk, double* dv);

}  // namespace flashattn
