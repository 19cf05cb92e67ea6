// cuBLAS for the attention GEMMs: CUBLAS_CHECK, the handle state a run needs, and batched GEMMs over
// (batch, head) whose matrices are addressed through element strides, so that both layouts and GQA
// (several query heads reading one kv head) go through the same pointer-array calls.
// nvcc only (it defines a kernel).
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <climits>
#include <cstdint>
#include <string>

#include "common/dtype.cuh"
#include "flashattn/check.h"
#include "flashattn/error.h"
#include "flashattn/registry.h"

namespace flashattn {

inline void cublas_check(cublasStatus_t status, const char* what, const char* file, int line) {
  if (status == CUBLAS_STATUS_SUCCESS) return;
  throw RuntimeError(std::string(file) + ":" + std::to_string(line) + ": " + what + " failed: " +
                     cublasGetStatusString(status));
}

}  // namespace flashattn

#define CUBLAS_CHECK(expr) ::flashattn::cublas_check((expr), #expr, __FILE__, __LINE__)

namespace flashattn {
namespace blas {

inline cudaDataType_t cuda_type(DType t) {
  switch (t) {
    case DType::F32: return CUDA_R_32F;
    case DType::F16: return CUDA_R_16F;
    case DType::BF16: return CUDA_R_16BF;
    default: throw RuntimeError(std::string("cuBLAS GEMM: no cuBLAS type for dtype ") + dtype_name(t));
  }
}

// The driver's handle, checked: a handle on another stream would race with our kernels, and
// cublasSetStream would throw away the workspace the driver gave the handle, so we refuse instead.
inline cublasHandle_t handle_of(const LaunchContext& ctx) {
  if (ctx.cublas == nullptr) throw RuntimeError("cuBLAS kernel launched without a cuBLAS handle");
  cublasHandle_t handle = static_cast<cublasHandle_t>(ctx.cublas);
  cudaStream_t bound = nullptr;
  CUBLAS_CHECK(cublasGetStream(handle, &bound));
  if (bound != ctx.stream) throw RuntimeError("cuBLAS handle is not bound to the launch stream");
  return handle;
}

// Sets the handle state our calls assume and restores the caller's on scope exit:
//  - plain fp32 arithmetic: DEFAULT math never rounds fp32 inputs to TF32 (TF32_TENSOR_OP math
//    would), and DISALLOW_REDUCED_PRECISION_REDUCTION keeps split-k partial sums in fp32 when the
//    output is 16-bit, so every GEMM accumulates in fp32 end to end;
//  - alpha and beta are host floats.
class HandleStateGuard {
 public:
  explicit HandleStateGuard(cublasHandle_t h) : handle_(h) {
    CUBLAS_CHECK(cublasGetMathMode(handle_, &math_));
    CUBLAS_CHECK(cublasGetPointerMode(handle_, &pointer_));
    const int fp32_math = CUBLAS_DEFAULT_MATH | CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION;
    CUBLAS_CHECK(cublasSetMathMode(handle_, static_cast<cublasMath_t>(fp32_math)));
    CUBLAS_CHECK(cublasSetPointerMode(handle_, CUBLAS_POINTER_MODE_HOST));
  }
  ~HandleStateGuard() {  // best effort: a destructor must not throw
    cublasSetMathMode(handle_, math_);
    cublasSetPointerMode(handle_, pointer_);
  }
  HandleStateGuard(const HandleStateGuard&) = delete;
  HandleStateGuard& operator=(const HandleStateGuard&) = delete;

 private:
  cublasHandle_t handle_;
  cublasMath_t math_ = CUBLAS_DEFAULT_MATH;
  cublasPointerMode_t pointer_ = CUBLAS_POINTER_MODE_HOST;
};

struct BatchShape {
  int B = 0, H = 0, H_kv = 0;
  FLASHATTN_HD int group() const { return H / H_kv; }
  FLASHATTN_HD int64_t entries() const { return static_cast<int64_t>(B) * H; }
};

// How a batched GEMM enumerates its B*H entries (batch b, query head h).
enum class BatchOrder : uint8_t {
  kPerHead,     // e = b*H + h
  kGroupRound,  // e = (r*B + b)*H_kv + g with h = g*G + r: round r (B*H_kv consecutive entries)
                // holds one query head of every kv group, so G calls with beta = 1 after the first
                // sum a group's query heads into a per-kv-head output without atomics.
};

FLASHATTN_HD inline void entry_coords(BatchOrder order, const BatchShape& s, int64_t e, int64_t* b,
                                      int64_t* h) {
  if (order == BatchOrder::kPerHead) {
    *b = e / s.H;
    *h = e % s.H;
  } else {
    const int64_t per_round = static_cast<int64_t>(s.B) * s.H_kv;
    const int64_t r = e / per_round, rest = e % per_round;
    *b = rest / s.H_kv;
    *h = (rest % s.H_kv) * s.group() + r;
  }
}

// Where one operand's matrices live: entry (b, h) starts at base + b*batch_bytes + x*head_bytes,
// x = h for per-query-head tensors and x = h / G for per-kv-head tensors (K, V, dK, dV).
struct MatSpec {
  const void* base = nullptr;
  int64_t batch_bytes = 0;
  int64_t head_bytes = 0;
  bool kv_head = false;

  FLASHATTN_HD void* at(int64_t b, int64_t h, int group) const {
    const int64_t x = kv_head ? h / group : h;
    return const_cast<char*>(static_cast<const char*>(base)) + b * batch_bytes + x * head_bytes;
  }
};

// A tensor with element strides (params.h convention) as a GEMM operand.
inline MatSpec mat_spec(const void* base, int64_t batch_elems, int64_t head_elems, size_t elem_bytes,
                        bool kv_head) {
  MatSpec m;
  m.base = base;
  m.batch_bytes = batch_elems * static_cast<int64_t>(elem_bytes);
  m.head_bytes = head_elems * static_cast<int64_t>(elem_bytes);
  m.kv_head = kv_head;
  return m;
}

// One batched GEMM in cuBLAS (column-major) terms: C = alpha * op(A) op(B) + beta * C, with
// op(A) m x k, op(B) k x n and C m x n, for every entry of the batch.
struct GemmOp {
  cublasOperation_t trans_a = CUBLAS_OP_N, trans_b = CUBLAS_OP_N;
  int m = 0, n = 0, k = 0;
  MatSpec a, b, c;
  cudaDataType_t type_a = CUDA_R_32F, type_b = CUDA_R_32F, type_c = CUDA_R_32F;
  int lda = 0, ldb = 0, ldc = 0;
  BatchOrder order = BatchOrder::kPerHead;
};

inline GemmOp gemm_op(cublasOperation_t trans_a, cublasOperation_t trans_b, int m, int n, int k,
                      const MatSpec& a, cudaDataType_t type_a, int lda, const MatSpec& b,
                      cudaDataType_t type_b, int ldb, const MatSpec& c, cudaDataType_t type_c, int ldc,
                      BatchOrder order = BatchOrder::kPerHead) {
  GemmOp op;
  op.trans_a = trans_a;
  op.trans_b = trans_b;
  op.m = m;
  op.n = n;
  op.k = k;
  op.a = a;
  op.b = b;
  op.c = c;
  op.type_a = type_a;
  op.type_b = type_b;
  op.type_c = type_c;
  op.lda = lda;
  op.ldb = ldb;
  op.ldc = ldc;
  op.order = order;
  return op;
}

// A row stride as a leading dimension. cuBLAS wants ld >= the stored row length even when there is
// a single row, where the stride is never used.
inline int leading_dim(int64_t row_stride, int rows, int row_length) {
  if (rows <= 1 && row_stride < row_length) return row_length;
  if (row_stride < row_length || row_stride > INT_MAX)
    throw RuntimeError("cuBLAS GEMM: row stride " + std::to_string(row_stride) +
                       " cannot be a leading dimension for rows of " + std::to_string(row_length));
  return static_cast<int>(row_stride);
}

constexpr int kMaxGemmOps = 5;

template <int kMaxOps>
struct PointerFill {
  MatSpec spec[kMaxOps][3];  // a, b, c of each op
  BatchOrder order[kMaxOps];
  int num_ops = 0;
  BatchShape shape;
  void** out = nullptr;  // [num_ops][3][entries]
};

// One thread per pointer; a few thousand pointers at most.
template <int kMaxOps>
__global__ void fill_gemm_pointers_kernel(PointerFill<kMaxOps> f) {
  const int64_t entries = f.shape.entries();
  const int64_t total = f.num_ops * 3 * entries;
  for (int64_t t = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; t < total;
       t += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int op = static_cast<int>(t / (3 * entries));
    const int operand = static_cast<int>(t / entries % 3);
    int64_t b = 0, h = 0;
    entry_coords(f.order[op], f.shape, t % entries, &b, &h);
    f.out[t] = f.spec[op][operand].at(b, h, f.shape.group());
  }
}

// Largest power of two (up to 256) dividing every address an operand takes.
inline int64_t address_alignment(const MatSpec& s, const BatchShape& shape) {
  uint64_t bits = static_cast<uint64_t>(reinterpret_cast<uintptr_t>(s.base));
  if (shape.B > 1) bits |= static_cast<uint64_t>(s.batch_bytes);
  if ((s.kv_head ? shape.H_kv : shape.H) > 1) bits |= static_cast<uint64_t>(s.head_bytes);
  bits |= 256;
  return static_cast<int64_t>(bits & (~bits + 1));
}

// cuBLAS cannot see the matrix addresses of a pointer-array GEMM, and its documentation for
// cublasGemmBatchedEx asks, for 16-bit inputs, 16-byte aligned matrices when k % 8 == 0 and
// 4-byte aligned ones when k % 2 == 0. Layouts with a head dim that is a multiple of 8 always
// qualify; the others take the per-entry path below, where cuBLAS checks each address itself.
inline bool batched_addresses_ok(const GemmOp& op, const BatchShape& shape) {
  if (op.type_a != CUDA_R_16F && op.type_a != CUDA_R_16BF) return true;
  const int64_t need = op.k % 8 == 0 ? 16 : (op.k % 2 == 0 ? 4 : 2);
  return address_alignment(op.a, shape) >= need && address_alignment(op.b, shape) >= need &&
         address_alignment(op.c, shape) >= need;
}

// Up to kMaxGemmOps batched GEMMs sharing one batch shape. Their pointer arrays live in the
// kernel's workspace and are written by one small kernel (no host staging, so the run can also be
// captured in a CUDA graph).
class GemmBatch {
 public:
  static size_t pointer_bytes(int num_ops, const BatchShape& s) {
    return static_cast<size_t>(num_ops) * 3 * static_cast<size_t>(s.entries()) * sizeof(void*);
  }

  GemmBatch(const BatchShape& shape, void* pointer_workspace, cublasHandle_t handle, cudaStream_t stream)
      : shape_(shape), handle_(handle), stream_(stream) {
    fill_.shape = shape;
    fill_.out = static_cast<void**>(pointer_workspace);
  }

  int add(const GemmOp& op) {
    if (fill_.num_ops == kMaxGemmOps) throw RuntimeError("GemmBatch: too many GEMMs");
    const int i = fill_.num_ops++;
    ops_[i] = op;
    fill_.spec[i][0] = op.a;
    fill_.spec[i][1] = op.b;
    fill_.spec[i][2] = op.c;
    fill_.order[i] = op.order;
    return i;
  }

  // Call once, after the last add and before the first run.
  void fill_pointers() {
    const int64_t total = fill_.num_ops * 3 * shape_.entries();
    if (total == 0) return;
    const int threads = 256;
    const int64_t blocks = (total + threads - 1) / threads;
    fill_gemm_pointers_kernel<kMaxGemmOps>
        <<<static_cast<unsigned>(blocks < 4096 ? blocks : 4096), threads, 0, stream_>>>(fill_);
    CHECK_LAUNCH("fill_gemm_pointers_kernel");
  }

  // Runs entries [first, first + count) of GEMM `i` (see BatchOrder for what a range holds).
  void run(int i, float alpha, float beta, int64_t first, int64_t count) const {
    const GemmOp& op = ops_[i];
    if (count <= 0) return;
    if (count > INT_MAX) throw RuntimeError("GemmBatch: batch of " + std::to_string(count) + " GEMMs");
    if (batched_addresses_ok(op, shape_)) {
      void* const* arrays = fill_.out + static_cast<int64_t>(i) * 3 * shape_.entries() + first;
      const int64_t stride = shape_.entries();
      CUBLAS_CHECK(cublasGemmBatchedEx(handle_, op.trans_a, op.trans_b, op.m, op.n, op.k, &alpha,
                                       arrays, op.type_a, op.lda, arrays + stride, op.type_b, op.ldb,
                                       &beta, arrays + 2 * stride, op.type_c, op.ldc,
                                       static_cast<int>(count), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
      return;
    }
    for (int64_t e = first; e < first + count; ++e) {
      int64_t b = 0, h = 0;
      entry_coords(op.order, shape_, e, &b, &h);
      const int G = shape_.group();
      CUBLAS_CHECK(cublasGemmEx(handle_, op.trans_a, op.trans_b, op.m, op.n, op.k, &alpha,
                                op.a.at(b, h, G), op.type_a, op.lda, op.b.at(b, h, G), op.type_b, op.ldb,
                                &beta, op.c.at(b, h, G), op.type_c, op.ldc, CUBLAS_COMPUTE_32F,
                                CUBLAS_GEMM_DEFAULT));
    }
  }

 private:
  BatchShape shape_;
  cublasHandle_t handle_;
  cudaStream_t stream_;
  GemmOp ops_[kMaxGemmOps];
  PointerFill<kMaxGemmOps> fill_;
};

}  // namespace blas
}  // namespace flashattn
