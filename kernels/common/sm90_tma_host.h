// Host side of the copy engine: encoding the tensor maps (CUtensorMap) the hopper kernels read
// their tiles through. The driver's encoder is reached through the runtime's entry-point query, so
// the program links no libcuda of its own.
#pragma once

#include <cuda.h>
#include <cuda_runtime_api.h>
#include <cudaTypedefs.h>

#include <cstdint>
#include <string>

#include "flashattn/check.h"
#include "flashattn/error.h"
#include "flashattn/params.h"
#include "flashattn/types.h"

namespace flashattn {
namespace sm90 {

inline PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  static PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* ptr = nullptr;
    cudaDriverEntryPointQueryResult status{};
    CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &ptr, 12000, cudaEnableDefault, &status));
    if (status != cudaDriverEntryPointSuccess || ptr == nullptr)
      throw RuntimeError("the CUDA driver has no cuTensorMapEncodeTiled (TMA needs driver 12.0 or newer)");
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(ptr);
  }();
  return fn;
}

// A [B, heads, rows, D] tensor of 16-bit elements seen through `st` (element strides; the last
// dimension is contiguous) as a 4-D tensor map (D, rows, heads, B), read or written in boxes of
// 64 elements x box_rows rows with the 128-byte swizzle. Rows past `rows` load as zeros and are
// never stored.
inline CUtensorMap make_tensor_map(const void* base, DType dtype, const Strides& st, int B, int heads, int rows, int D,
                                   int box_rows) {
  if (dtype != DType::F16 && dtype != DType::BF16) throw RuntimeError("tensor map: 16-bit dtypes only");
  CUtensorMap map;
  const cuuint64_t dims[4] = {cuuint64_t(D), cuuint64_t(rows), cuuint64_t(heads), cuuint64_t(B)};
  const cuuint64_t strides[3] = {cuuint64_t(st.row) * 2, cuuint64_t(st.head) * 2, cuuint64_t(st.batch) * 2};
  const cuuint32_t box[4] = {64, cuuint32_t(box_rows), 1, 1};
  const cuuint32_t elem_strides[4] = {1, 1, 1, 1};
  const CUresult r = tensor_map_encoder()(
      &map, dtype == DType::BF16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 4,
      const_cast<void*>(base), dims, strides, box, elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
      CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS)
    throw RuntimeError("cuTensorMapEncodeTiled failed (error " + std::to_string(int(r)) + ") for a [" +
                       std::to_string(B) + ", " + std::to_string(heads) + ", " + std::to_string(rows) + ", " +
                       std::to_string(D) + "] tensor");
  return map;
}

}  // namespace sm90
}  // namespace flashattn
