// libflashattn_capi (include/flashattn/capi.h): the driver's stream hold, L2 flush, input
// generator and --check behind a C interface. Exceptions stop here: each becomes a -1 / NULL
// return with its message in fa_last_error(). The CheckProblem holds copies of the inputs as
// doubles, so a checker outlives the caller's buffers.
#include "flashattn/capi.h"

#include <cuda_runtime_api.h>

#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "array.h"
#include "dataset.h"
#include "flashattn/device_fill.h"
#include "flashattn/check.h"
#include "flashattn/error.h"
#include "report.h"
#include "timing.h"
#include "validate.h"
#include "stopwatch.h"

namespace {

using flashattn::DType;
using nlohmann::json;

thread_local std::string g_error;

template <class F>
int guarded(F&& f) {
  try {
    f();
    return 0;
  } catch (const std::exception& e) {
    g_error = e.what();
  } catch (...) {
    g_error = "unknown error";
  }
  return -1;
}

// A host tensor of `n` elements in `t` (contiguous), as doubles.
std::vector<double> as_doubles(const void* p, DType t, int64_t n) {
  flashattn::HostArray a(t, {n});
  std::memcpy(a.bytes.data(), p, a.nbytes());
  return flashattn::to_f64(a);
}

flashattn::HostArray copy_of(const void* p, DType t, std::vector<int64_t> shape) {
  flashattn::HostArray a(t, std::move(shape));
  std::memcpy(a.bytes.data(), p, a.nbytes());
  return a;
}

struct CheckProblem {
  flashattn::Dims d;
  DType dtype = DType::F32;
  bool backward = false;
  flashattn::RefInputs in;
  std::vector<double> q, k, v, dout;
  std::vector<int64_t> mask_shape;
  std::vector<int32_t> seqlens;  // copies: the caller's buffers may go before the checks
  std::vector<float> mask;
  uint64_t seed = 0;
  double budget = 8e9;
};

template <class T>
T field(const json& j, const char* name, T fallback) {
  return j.contains(name) && !j[name].is_null() ? j[name].get<T>() : fallback;
}

void parse_problem(const char* text, const void* const* t, CheckProblem& p) {
  const json j = json::parse(text ? text : "");
  p.d = {j.at("B").get<int>(), j.at("H").get<int>(), j.at("H_kv").get<int>(), j.at("S_q").get<int>(),
         j.at("S_k").get<int>(), j.at("D").get<int>()};
  const flashattn::Dims& d = p.d;
  if (d.B < 1 || d.H < 1 || d.H_kv < 1 || d.S_q < 1 || d.S_k < 1 || d.D < 1 || d.H % d.H_kv != 0)
    throw flashattn::InputError("problem: B, H, H_kv, S_q, S_k, D must be >= 1 with H a multiple of H_kv");
  const std::string dtype = j.at("dtype").get<std::string>();
  if (!flashattn::parse_dtype(dtype, &p.dtype) || !(p.dtype == DType::F32 || p.dtype == DType::F16 || p.dtype == DType::BF16))
    throw flashattn::InputError("problem: dtype '" + dtype + "' is not fp32, fp16 or bf16");
  const std::string mode = field<std::string>(j, "mode", "forward");
  if (mode != "forward" && mode != "backward") throw flashattn::InputError("problem: mode '" + mode + "' is not forward or backward");
  p.backward = mode == "backward";
  for (int i = 0; i < (p.backward ? 4 : 3); ++i)
    if (!t || !t[i]) throw flashattn::InputError("problem: tensors[" + std::to_string(i) + "] (an input) is NULL");
  const int64_t nq = int64_t(d.B) * d.H * d.S_q * d.D, nkv = int64_t(d.B) * d.H_kv * d.S_k * d.D;
  p.q = as_doubles(t[0], p.dtype, nq);
  p.k = as_doubles(t[1], p.dtype, nkv);
  p.v = as_doubles(t[2], p.dtype, nkv);
  if (p.backward) p.dout = as_doubles(t[3], p.dtype, nq);
  p.seed = field<uint64_t>(j, "seed", 0);
  p.budget = field<double>(j, "budget_macs", 8e9);
  flashattn::RefInputs& in = p.in;
  in.dims = d;
  in.scale = field<double>(j, "scale", 1.0 / std::sqrt(double(d.D)));
  in.causal = field<bool>(j, "causal", false);
  in.window_left = field<int>(j, "window_left", -1);
  in.window_right = field<int>(j, "window_right", -1);
  in.q = p.q.data(), in.k = p.k.data(), in.v = p.v.data();
  in.dout = p.backward ? p.dout.data() : nullptr;
  if (t[9]) {
    const auto* lens = static_cast<const int32_t*>(t[9]);
    p.seqlens.assign(lens, lens + d.B);
    in.seqlens_k = p.seqlens.data();
  }
  if (t[10]) {
    p.mask_shape = j.at("mask_shape").get<std::vector<int64_t>>();
    const int64_t n = flashattn::shape_numel(p.mask_shape);
    const auto* m = static_cast<const float*>(t[10]);
    p.mask.assign(m, m + n);
    in.mask = flashattn::mask_view(p.mask_shape, d, p.mask.data(), "mask");
  }
  in.threads = field<int>(j, "threads", 0);
}

// The reference (and the same-dtype baseline's errors) of one problem, computed at the first check
// and reused for every set of outputs checked against it (each PyTorch backend of a point).
struct Checker {
  CheckProblem p;
  flashattn::RowSelection sel;
  std::optional<flashattn::ReferenceRows> ref;
  flashattn::OutputErrors base;

  std::string check(const void* const* t) {
    const flashattn::Dims& d = p.d;
    const bool half = p.dtype == DType::F16 || p.dtype == DType::BF16;
    const flashattn::Stopwatch since_start;
    if (!ref) {
      ref = flashattn::compute_reference(p.in, sel, p.backward);
      if (half) base = flashattn::measure_errors(flashattn::compute_baseline(p.in, sel, p.backward, p.dtype), *ref, d.D);
    }
    flashattn::KernelOutputs out;
    const std::vector<int64_t> q_shape = {d.B, d.H, d.S_q, d.D}, kv_shape = {d.B, d.H_kv, d.S_k, d.D};
    if (!p.backward) {
      if (t[4]) out.o = copy_of(t[4], p.dtype, q_shape);
      if (t[5]) out.lse = copy_of(t[5], DType::F32, {d.B, d.H, d.S_q});
    } else {
      if (t[6]) out.dq = copy_of(t[6], p.dtype, q_shape);
      if (t[7]) out.dk = copy_of(t[7], p.dtype, kv_shape);
      if (t[8]) out.dv = copy_of(t[8], p.dtype, kv_shape);
    }
    const flashattn::OutputErrors errs =
        flashattn::measure_errors(flashattn::gather_rows(out, sel, d, flashattn::Layout::BHSD), *ref, d.D);
    flashattn::CheckResult c = flashattn::judge(errs, p.dtype, half ? &base : nullptr);
    c.rows_checked = static_cast<int64_t>(sel.q_rows.size());
    c.rows_total = sel.q_total;
    c.key_rows_checked = static_cast<int64_t>(sel.k_rows.size());
    c.key_rows_total = sel.k_total;
    c.seconds = since_start.seconds();
    return flashattn::check_json(c).dump();
  }
};

char* dup_string(const std::string& text) {
  char* s = static_cast<char*>(std::malloc(text.size() + 1));
  if (!s) {
    g_error = "out of host memory";
    return nullptr;
  }
  std::memcpy(s, text.c_str(), text.size() + 1);
  return s;
}

}  // namespace

extern "C" {

FA_API int fa_capi_version(void) { return FA_CAPI_VERSION; }
FA_API const char* fa_last_error(void) { return g_error.c_str(); }

FA_API void* fa_hold_create(void) {
  flashattn::StreamHold* h = nullptr;
  guarded([&] { h = new flashattn::StreamHold(); });
  return h;
}
FA_API int fa_hold_enqueue(void* hold, void* stream, double timeout_s) {
  return guarded([&] { static_cast<flashattn::StreamHold*>(hold)->hold(static_cast<cudaStream_t>(stream), timeout_s); });
}
FA_API int fa_hold_release(void* hold) {
  return guarded([&] { static_cast<flashattn::StreamHold*>(hold)->release(); });
}
FA_API long long fa_hold_timeouts(void* hold) {
  return static_cast<long long>(static_cast<flashattn::StreamHold*>(hold)->timeouts());
}
FA_API void fa_hold_destroy(void* hold) { delete static_cast<flashattn::StreamHold*>(hold); }

FA_API void* fa_flush_create(long long l2_bytes) {
  flashattn::L2Flusher* f = nullptr;
  guarded([&] {
    if (l2_bytes <= 0) {
      int dev = 0, l2 = 0;
      CUDA_CHECK(cudaGetDevice(&dev));
      CUDA_CHECK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, dev));
      l2_bytes = l2;
    }
    f = new flashattn::L2Flusher(static_cast<size_t>(l2_bytes));
  });
  return f;
}
FA_API int fa_flush_enqueue(void* flush, void* stream) {
  return guarded([&] { static_cast<flashattn::L2Flusher*>(flush)->flush(static_cast<cudaStream_t>(stream)); });
}
FA_API long long fa_flush_bytes(void* flush) {
  return static_cast<long long>(static_cast<flashattn::L2Flusher*>(flush)->bytes());
}
FA_API void fa_flush_destroy(void* flush) { delete static_cast<flashattn::L2Flusher*>(flush); }

FA_API int fa_fill_normal(void* dst, int dtype, long long n, unsigned long long seed, unsigned long long tensor,
                          void* stream) {
  return guarded([&] {
    if (dtype < 0 || dtype > 2) throw flashattn::InputError("fa_fill_normal: dtype must be 0 (fp32), 1 (fp16) or 2 (bf16)");
    flashattn::fill_normal_device(dst, static_cast<DType>(dtype), n, seed, tensor, static_cast<cudaStream_t>(stream));
  });
}

FA_API void* fa_checker_create(const char* problem_json, const void* const* tensors) {
  Checker* c = nullptr;
  guarded([&] {
    auto owned = std::make_unique<Checker>();
    parse_problem(problem_json, tensors, owned->p);
    owned->sel = flashattn::select_rows(owned->p.d, owned->p.backward, owned->p.budget, owned->p.seed);
    c = owned.release();
  });
  return c;
}

FA_API char* fa_checker_check(void* checker, const void* const* tensors) {
  std::string text;
  if (guarded([&] { text = static_cast<Checker*>(checker)->check(tensors); }) != 0) return nullptr;
  return dup_string(text);
}

FA_API void fa_checker_destroy(void* checker) { delete static_cast<Checker*>(checker); }

FA_API char* fa_check_attention(const char* problem_json, const void* const* tensors) {
  std::unique_ptr<Checker> c(static_cast<Checker*>(fa_checker_create(problem_json, tensors)));
  return c ? fa_checker_check(c.get(), tensors) : nullptr;
}

FA_API void fa_free(char* p) { std::free(p); }

}  // extern "C"
