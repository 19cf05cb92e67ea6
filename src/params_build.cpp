#include "params_build.h"

namespace flashattn {

namespace {

constexpr double kLog2eF64 = 1.4426950408889634074;  // log2(e)

// The scale as the kernels take it: fp32, fp32 times log2(e) (for exp2), and the fp64 value the
// cpu kernels use.
template <class Params>
void set_scale(Params& p, double scale) {
  p.scale_f64 = scale;
  p.scale = static_cast<float>(scale);
  p.scale_log2 = static_cast<float>(scale * kLog2eF64);
}

}  // namespace

FwdParams forward_params(const Problem& p) {
  const Dims& d = p.dims;
  FwdParams f;
  f.dtype = p.dtype;
  f.layout = p.layout;
  f.B = d.B, f.H = d.H, f.H_kv = d.H_kv, f.S_q = d.S_q, f.S_k = d.S_k, f.D = d.D;
  set_scale(f, p.scale);
  f.causal = p.causal;
  f.window_left = p.window_left;
  f.window_right = p.effective_window_right();
  f.q_st = f.o_st = layout_strides(p.layout, d.H, d.S_q, d.D);
  f.k_st = f.v_st = layout_strides(p.layout, d.H_kv, d.S_k, d.D);
  return f;
}

DecodeParams decode_params(const DecodeDims& d, DType t, double scale) {
  DecodeParams p;
  p.dtype = t;
  p.B = d.B, p.H = d.H, p.H_kv = d.H_kv, p.S_new = d.S_new, p.S_max = d.S_max, p.D = d.D;
  set_scale(p, scale);
  p.q_st = p.o_st = layout_strides(Layout::BHSD, d.H, d.S_new, d.D);
  p.k_new_st = p.v_new_st = layout_strides(Layout::BHSD, d.H_kv, d.S_new, d.D);
  p.k_cache_st = p.v_cache_st = layout_strides(Layout::BHSD, d.H_kv, d.paged() ? d.page_size : d.S_max, d.D);
  if (d.paged()) {
    p.block_table_stride = d.max_blocks;
    p.page_size = d.page_size;
    p.num_blocks = d.num_blocks;
  }
  return p;
}

}  // namespace flashattn
