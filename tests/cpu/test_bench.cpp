// The benchmark harness on the host: the timing loop's stopping rule, the generated inputs of
// sweeps, and the sweep grids (fa-grid and preset files).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "array.h"
#include "flashattn/device_fill.h"
#include "flashattn/error.h"
#include "sweep.h"
#include "timing.h"

namespace fa = flashattn;

namespace {

fa::TimingOptions rule(int min_samples, double max_noise, double max_time_s) {
  fa::TimingOptions t;
  t.repeat = min_samples;
  t.max_noise = max_noise;
  t.max_time_s = max_time_s;
  return t;
}

std::string write_temp(const std::string& name, const std::string& text) {
  const std::string path = ::testing::TempDir() + name;
  std::ofstream(path) << text;
  return path;
}

}  // namespace

TEST(StopRule, KeepsGoingBelowMinSamplesWhateverTheNoiseAndTime) {
  EXPECT_EQ(fa::stop_reason(rule(20, 0.005, 1.0), 19, 19.0, 0.0, 100.0), "");
}

TEST(StopRule, StopsOnNoiseOnceMinSamplesAreIn) {
  EXPECT_EQ(fa::stop_reason(rule(20, 0.005, 1.0), 20, 20.0, 0.004, 0.1), "noise");
}

TEST(StopRule, ContinuesWhileNoisyUntilMaxTime) {
  EXPECT_EQ(fa::stop_reason(rule(20, 0.005, 1.0), 50, 50.0, 0.02, 0.5), "");
  EXPECT_EQ(fa::stop_reason(rule(20, 0.005, 1.0), 80, 80.0, 0.02, 1.0), "max_time");
}

TEST(StopRule, RuleOffStopsAtExactlyMinSamples) {
  EXPECT_EQ(fa::stop_reason(rule(1, 0.0, 1.0), 1, 1.0, 1e9, 0.0), "min_samples");
}

TEST(StopRule, MinTimeIsHonouredBeforeTheNoiseRule) {
  fa::TimingOptions t = rule(5, 0.005, 1.0);
  t.min_time_ms = 100;
  EXPECT_EQ(fa::stop_reason(t, 10, 50.0, 0.0, 0.01), "");
  EXPECT_EQ(fa::stop_reason(t, 20, 100.0, 0.0, 0.01), "noise");
}

TEST(StopRule, MaxSamplesCapsEverything) {
  fa::TimingOptions t = rule(5, 0.005, 1e9);
  t.max_repeat = 100;
  EXPECT_EQ(fa::stop_reason(t, 100, 100.0, 0.5, 0.0), "max_samples");
}

TEST(GeneratedInputs, SameSeedSameValuesOtherStreamOtherValues) {
  std::vector<float> a(1001), b(1001), c(1001);
  fa::fill_normal_host(a.data(), fa::DType::F32, 1001, 7, 1);
  fa::fill_normal_host(b.data(), fa::DType::F32, 1001, 7, 1);
  fa::fill_normal_host(c.data(), fa::DType::F32, 1001, 7, 2);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
}

TEST(GeneratedInputs, ElementDependsOnlyOnItsIndex) {
  // A longer fill starts with the values of a shorter one (counter-based, no carried state).
  std::vector<float> shortv(33), longv(1000);
  fa::fill_normal_host(shortv.data(), fa::DType::F32, 33, 3, 1);
  fa::fill_normal_host(longv.data(), fa::DType::F32, 1000, 3, 1);
  for (int i = 0; i < 33; ++i) EXPECT_EQ(shortv[i], longv[i]) << i;
}

TEST(GeneratedInputs, AreStandardNormal) {
  const int n = 200000;
  std::vector<float> x(n);
  fa::fill_normal_host(x.data(), fa::DType::F32, n, 1, 1);
  double sum = 0, sq = 0;
  int beyond3 = 0;
  for (float v : x) {
    ASSERT_TRUE(std::isfinite(v));
    sum += v, sq += double(v) * v;
    beyond3 += std::fabs(v) > 3;
  }
  const double mean = sum / n, var = sq / n - mean * mean;
  EXPECT_NEAR(mean, 0.0, 0.01);
  EXPECT_NEAR(var, 1.0, 0.02);
  EXPECT_NEAR(beyond3 / double(n), 0.0027, 0.001);  // two-sided tail of N(0, 1) beyond 3 sigma
}

TEST(GeneratedInputs, HalfTypesAreTheFp32ValuesRoundedOnce) {
  const int n = 4096;
  std::vector<float> f(n);
  std::vector<uint16_t> bf(n), h(n);
  fa::fill_normal_host(f.data(), fa::DType::F32, n, 5, 3);
  fa::fill_normal_host(bf.data(), fa::DType::BF16, n, 5, 3);
  fa::fill_normal_host(h.data(), fa::DType::F16, n, 5, 3);
  for (int i = 0; i < n; ++i) {
    EXPECT_EQ(bf[i], fa::float_to_bf16_bits(f[i])) << i;
    EXPECT_EQ(h[i], fa::float_to_half_bits(f[i])) << i;
  }
}

TEST(SweepGrid, FaGridKeepsTokensAndWidthConstant) {
  fa::SweepDefaults cli;
  cli.kernels = {"cublas"};
  const fa::SweepGrid g = fa::load_sweep("fa-grid", cli);
  ASSERT_EQ(g.points.size(), 24u);  // 6 lengths x 2 head dims x causal or not
  for (const fa::SweepPoint& p : g.points) {
    EXPECT_EQ(p.dims.B * p.dims.S_q, 16384);
    EXPECT_EQ(p.dims.H * p.dims.D, 2048);
    EXPECT_EQ(p.dims.S_q, p.dims.S_k);
    EXPECT_EQ(p.dtype, fa::DType::BF16);  // the default without --dtype
    EXPECT_EQ(p.modes.size(), 2u);
    EXPECT_EQ(p.kernels, cli.kernels);
  }
}

TEST(SweepGrid, CommandLineFillsWhatThePresetLeavesOpen) {
  const std::string path = write_temp("preset_precedence.json", R"({
    "defaults": {"dtype": "fp32", "causal": [false, true], "mode": "forward"},
    "points": [{"B": 2, "H": 4, "S": 64, "D": 32},
               {"B": 1, "H": 4, "H_kv": 2, "S_q": 16, "S_k": 48, "D": 8, "dtype": "fp16", "causal": true,
                "mode": "backward", "kernels": "naive"}]})");
  fa::SweepDefaults cli;
  cli.dtype = "bf16";  // beats the file's defaults, not the point's own field
  cli.kernels = {"cublas"};
  const fa::SweepGrid g = fa::load_sweep(path, cli);
  ASSERT_EQ(g.points.size(), 3u);  // the first point twice (causal list), the second once
  EXPECT_EQ(g.points[0].dtype, fa::DType::BF16);
  EXPECT_FALSE(g.points[0].causal);
  EXPECT_TRUE(g.points[1].causal);
  EXPECT_EQ(g.points[0].modes, std::vector<fa::Mode>{fa::Mode::Forward});
  EXPECT_EQ(g.points[2].dtype, fa::DType::F16);
  EXPECT_EQ(g.points[2].dims.H_kv, 2);
  EXPECT_EQ(g.points[2].dims.S_k, 48);
  EXPECT_EQ(g.points[2].modes, std::vector<fa::Mode>{fa::Mode::Backward});
  EXPECT_EQ(g.points[2].kernels, std::vector<std::string>{"naive"});
}

TEST(SweepGrid, BadPresetsNameTheFileAndThePoint) {
  const std::string kDeep = std::string(200000, '[') + std::string(200000, ']');  // fails fast, no deep recursion
  struct Case {
    const char* text;
    const char* needle;
  };
  const Case cases[] = {
      {R"({"points": [{"B": 1, "H": 2, "S": 8, "D": 8, "Sq": 4}]})", "point 1: unknown field 'Sq'"},
      {R"({"points": [{"H": 2, "S": 8, "D": 8}]})", "point 1: missing B"},
      {R"({"points": [{"B": 1, "H": 3, "H_kv": 2, "S": 8, "D": 8}]})", "not a multiple"},
      {R"({"points": [{"B": 0, "H": 2, "S": 8, "D": 8}]})", "B must be a positive integer"},
      {R"({"points": [{"B": 1, "H": 2, "S": 8, "D": 8, "dtype": "int8"}]})", "dtype must be"},
      {R"({"points": [{"B": 1, "H": 2, "S": 8, "D": 8, "mode": "sideways"}]})", "mode 'sideways'"},
      {R"({"points": [)", "invalid JSON"},
      {R"({"points": [{"B": 1, "B": 2, "H": 2, "S": 8, "D": 8}]})", "key \"B\" appears twice"},
      {kDeep.c_str(), "nested deeper than 64 levels"},
      {R"({"grid": []})", "expected {\"points\""},
  };
  int i = 0;
  for (const Case& c : cases) {
    const std::string path = write_temp("bad_preset_" + std::to_string(i++) + ".json", c.text);
    try {
      fa::load_sweep(path, fa::SweepDefaults{});
      ADD_FAILURE() << "accepted: " << c.text;
    } catch (const fa::InputError& e) {
      const std::string msg = e.what();
      EXPECT_EQ(msg.rfind(path, 0), 0u) << msg;
      EXPECT_NE(msg.find(c.needle), std::string::npos) << msg;
      EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
    }
  }
}

TEST(SweepProgress, ARingSaysOverHowManyGpusItsTflopsAre) {
  flashattn::RunRecord r;
  r.kernel = "hopper";
  r.mode = flashattn::Mode::Forward;
  r.timing.median_ms = 15.17;
  r.tflops = 2320.0;
  r.timing.noise_rule = 1;
  EXPECT_EQ(flashattn::sweep_run_summary(r), "hopper fwd 15.2 ms 2320.0 TFLOP/s");
  r.ring.emplace();
  r.ring->size = 4;
  r.timing.noise_rule = 0;
  EXPECT_EQ(flashattn::sweep_run_summary(r), "hopper fwd 15.2 ms 2320.0 TFLOP/s over 4 GPUs (noisy)");
  r.status = flashattn::RunStatus::Skipped;
  EXPECT_EQ(flashattn::sweep_run_summary(r).rfind("hopper fwd ", 0), 0u);
}
