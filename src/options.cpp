#include "options.h"

#include <algorithm>
#include <cmath>

#include "flashattn/error.h"
#include "ring_plan.h"

namespace flashattn {

const char* run_mode_name(RunMode m) {
  switch (m) {
    case RunMode::Forward: return "forward";
    case RunMode::Backward: return "backward";
    case RunMode::Both: return "both";
    case RunMode::Decode: return "decode";
  }
  return "?";
}

std::vector<Mode> run_mode_passes(RunMode m) {
  switch (m) {
    case RunMode::Forward: return {Mode::Forward};
    case RunMode::Backward: return {Mode::Backward};
    case RunMode::Both: return {Mode::Forward, Mode::Backward};
    case RunMode::Decode: return {Mode::Decode};
  }
  return {};
}

std::string DtypeChoice::text() const {
  if (kind == Kind::Auto) return "auto";
  std::string s;
  for (DType t : list) s += (s.empty() ? "" : ",") + std::string(dtype_name(t));
  return s;
}

RunMode parse_run_mode(const std::string& s) {
  for (RunMode m : {RunMode::Forward, RunMode::Backward, RunMode::Both, RunMode::Decode})
    if (s == run_mode_name(m)) return m;
  throw InputError("--mode: '" + s + "' is not one of forward, backward, both, decode");
}

Window parse_window(const std::string& s) {
  auto bad = [&] { return InputError("--window: '" + s + "' is not LEFT,RIGHT with integers >= -1 (-1 = unbounded)"); };
  // An integer as typed: an optional '-' and digits, nothing around them, within int's range.
  auto side = [&](const std::string& t) {
    const size_t digits = t.size() - (t.rfind('-', 0) == 0 ? 1 : 0);
    if (digits == 0 || digits > 9 || t.find_first_not_of("0123456789", t.size() - digits) != std::string::npos)
      throw bad();
    const int v = std::stoi(t);
    if (v < -1) throw bad();
    return v;
  };
  const size_t comma = s.find(',');
  if (comma == std::string::npos) throw bad();
  return Window{side(s.substr(0, comma)), side(s.substr(comma + 1))};
}

DtypeChoice parse_dtype_choice(const std::string& s) {
  DtypeChoice c;
  if (s.empty()) return c;
  if (s == "auto") {
    c.kind = DtypeChoice::Kind::Auto;
    return c;
  }
  c.kind = DtypeChoice::Kind::List;
  size_t begin = 0;
  while (true) {
    const size_t comma = s.find(',', begin);
    const std::string item = s.substr(begin, comma == std::string::npos ? std::string::npos : comma - begin);
    DType t;
    if (item.empty()) throw InputError("--dtype: an empty item in '" + s + "' (NAME[,NAME...] or auto)");
    if (!parse_dtype(item, &t) || !dtype_is_float(t))
      throw InputError("--dtype: '" + item + "' is not one of fp32, fp16, bf16, fp64 (or auto)");
    for (DType seen : c.list)
      if (seen == t) throw InputError("--dtype: '" + item + "' is listed twice in '" + s + "'");
    c.list.push_back(t);
    if (comma == std::string::npos) break;
    begin = comma + 1;
  }
  return c;
}

Layout parse_layout_option(const std::string& s) {
  if (s == "bhsd") return Layout::BHSD;
  if (s == "bshd") return Layout::BSHD;
  throw InputError("--layout: '" + s + "' is not bhsd or bshd");
}

std::vector<int> parse_devices(const std::string& s) {
  std::vector<int> ids;
  size_t begin = 0;
  while (true) {
    const size_t comma = s.find(',', begin);
    const std::string item = s.substr(begin, comma == std::string::npos ? std::string::npos : comma - begin);
    const bool digits = !item.empty() && item.size() <= 4 && item.find_first_not_of("0123456789") == std::string::npos;
    const int id = digits ? std::stoi(item) : -1;
    if (!digits || id > 1023)
      throw InputError("--devices: '" + item + "' in '" + s + "' is not a device index (0..1023)");
    ids.push_back(id);
    if (comma == std::string::npos) break;
    begin = comma + 1;
  }
  if (ids.size() < 2) throw InputError("--devices: '" + s + "' names one GPU; a ring needs two or more (one GPU: --device)");
  // A GPU per rank, or one GPU for every rank (0,0: ring.h's loopback), nothing between.
  if (ring_one_gpu_for_all(ids)) return ids;
  for (size_t i = 1; i < ids.size(); ++i)
    if (std::find(ids.begin(), ids.begin() + i, ids[i]) != ids.begin() + i)
      throw InputError("--devices: device " + std::to_string(ids[i]) + " is listed twice in '" + s +
                       "' (a GPU per rank, or one GPU for every rank as in 0,0)");
  return ids;
}

void type_options(const OptionWords& words, AppOptions* opt) {
  // A sweep without --mode takes each point's modes from its preset.
  opt->mode.reset();
  if (words.mode_given || opt->sweep.empty()) opt->mode = parse_run_mode(words.mode);
  if (!words.window.empty()) opt->window = parse_window(words.window);
  opt->dtype = parse_dtype_choice(words.dtype);
  if (!words.layout.empty()) opt->layout = parse_layout_option(words.layout);
  if (!words.devices.empty()) {
    opt->devices = parse_devices(words.devices);
    opt->device = opt->devices.front();
  }
  const bool ring_given = words.ring_rank_given || opt->ring_size != 0 || !opt->ring_id.empty();
  if (ring_given) {
    if (!words.ring_rank_given || opt->ring_size == 0 || opt->ring_id.empty())
      throw InputError("--ring-rank, --ring-size and --ring-id: give all three (one process per GPU of a ring)");
    if (opt->ring_size < 2) throw InputError("--ring-size: a ring needs two or more processes");
    if (opt->ring_rank < 0 || opt->ring_rank >= opt->ring_size)
      throw InputError("--ring-rank: " + std::to_string(opt->ring_rank) + " is not in 0.." + std::to_string(opt->ring_size - 1));
    if (!opt->devices.empty()) throw InputError("--ring-rank: conflicts with --devices (one process drives every GPU)");
  }
  if (!words.ring_baseline.empty()) {
    if (words.ring_baseline != "each" && words.ring_baseline != "first")
      throw InputError("--ring-baseline: '" + words.ring_baseline + "' is not one of each, first");
    if (!ring_given && opt->devices.empty()) throw InputError("--ring-baseline: only with --devices or --ring-rank (a ring)");
    opt->ring_baseline_each = words.ring_baseline == "each";
  }

  if (opt->timing.warmup < 0) throw InputError("--warmup: must be >= 0");
  if (opt->timing.repeat < 1) throw InputError("--repeat: must be >= 1");
  if (opt->threads < 0) throw InputError("--threads: must be >= 0");
  if (opt->device < 0) throw InputError("--device: must be >= 0");
  if (opt->scale && !(std::isfinite(*opt->scale) && *opt->scale > 0))
    throw InputError("--scale: must be a positive finite number");
  if (!(opt->timing.min_time_ms >= 0)) throw InputError("--min-time: must be >= 0");
  if (!(opt->timing.max_noise_pct >= 0 && opt->timing.max_noise_pct < 100))
    throw InputError("--max-noise: must be a percentage in [0, 100)");
  if (!(opt->timing.max_time_s > 0)) throw InputError("--max-time: must be a positive number of seconds");
  if (opt->no_write && !opt->out.empty()) throw InputError("--out: conflicts with --no-write (which writes no outputs)");
}

}  // namespace flashattn
