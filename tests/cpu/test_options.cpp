// The typed options: each word parsed once, every bad form refused with the option's name.
#include <gtest/gtest.h>

#include <string>

#include "flashattn/error.h"
#include "options.h"

namespace flashattn {
namespace {

std::string error_of(void (*f)(const std::string&), const std::string& s) {
  try {
    f(s);
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

TEST(Options, RunModes) {
  EXPECT_EQ(parse_run_mode("both"), RunMode::Both);
  EXPECT_EQ(run_mode_passes(RunMode::Both), (std::vector<Mode>{Mode::Forward, Mode::Backward}));
  EXPECT_EQ(run_mode_passes(RunMode::Decode), (std::vector<Mode>{Mode::Decode}));
  EXPECT_NE(error_of([](const std::string& s) { parse_run_mode(s); }, "Forward").find("--mode: 'Forward'"),
            std::string::npos);
}

TEST(Options, WindowTakesTwoIntegersAndNothingElse) {
  const Window w = parse_window("128,-1");
  EXPECT_EQ(w.left, 128);
  EXPECT_EQ(w.right, -1);
  for (const char* bad : {"1,2junk", "1", ",2", "1,", "-2,0", "1,2,3", "99999999999,0", " 1,2", "+1,2", "-,1", "1,2 "})
    EXPECT_NE(error_of([](const std::string& s) { parse_window(s); }, bad).find("--window"), std::string::npos) << bad;
}

TEST(Options, DtypeInputAutoOrAList) {
  EXPECT_EQ(parse_dtype_choice("").kind, DtypeChoice::Kind::Input);
  EXPECT_EQ(parse_dtype_choice("auto").kind, DtypeChoice::Kind::Auto);
  const DtypeChoice one = parse_dtype_choice("bf16");
  EXPECT_TRUE(one.one());
  EXPECT_EQ(one.list[0], DType::BF16);
  const DtypeChoice two = parse_dtype_choice("fp32,bf16");
  EXPECT_FALSE(two.one());
  EXPECT_EQ(two.list, (std::vector<DType>{DType::F32, DType::BF16}));
  EXPECT_EQ(two.text(), "fp32,bf16");
  auto err = [](const char* s) { return error_of([](const std::string& x) { parse_dtype_choice(x); }, s); };
  EXPECT_NE(err("fp32,,bf16").find("an empty item"), std::string::npos);
  EXPECT_NE(err(",fp32").find("an empty item"), std::string::npos);
  EXPECT_NE(err("fp32,").find("an empty item"), std::string::npos);
  EXPECT_NE(err("bf16,bf16").find("listed twice"), std::string::npos);
  EXPECT_NE(err("fp32,int8").find("'int8' is not one of"), std::string::npos);
  EXPECT_NE(err("fp32,auto").find("'auto' is not one of"), std::string::npos);
}

TEST(Options, LayoutWords) {
  EXPECT_EQ(parse_layout_option("bshd"), Layout::BSHD);
  EXPECT_NE(error_of([](const std::string& s) { parse_layout_option(s); }, "BSHD").find("--layout"), std::string::npos);
}

TEST(Options, SharedChecksRunOnce) {
  AppOptions opt;
  OptionWords words;
  type_options(words, &opt);
  EXPECT_EQ(opt.mode, RunMode::Forward);
  opt.sweep = "fa-grid";
  type_options(words, &opt);
  EXPECT_FALSE(opt.mode.has_value());  // a sweep without --mode: the preset's modes
  opt.sweep.clear();
  opt.no_write = true;
  opt.out = "o";
  EXPECT_THROW(type_options(words, &opt), InputError);
}

}  // namespace
}  // namespace flashattn

namespace flashattn {
namespace {

TEST(Options, DevicesTakeTwoOrMoreDistinctIndicesOrOneForEveryRank) {
  EXPECT_EQ(parse_devices("0,1"), (std::vector<int>{0, 1}));
  EXPECT_EQ(parse_devices("3,1,2"), (std::vector<int>{3, 1, 2}));
  EXPECT_EQ(parse_devices("0,0"), (std::vector<int>{0, 0}));  // one GPU plays both ranks
  EXPECT_EQ(parse_devices("2,2,2"), (std::vector<int>{2, 2, 2}));
  for (const char* bad : {"0", "", "0,", ",1", "0,0,1", "1,0,0", "0,1,0", "0,x", "0,1.5", "-1,0", "0,1024", "0, 1", "+1,0"}) {
    std::string what;
    try {
      parse_devices(bad);
    } catch (const InputError& e) {
      what = e.what();
    }
    EXPECT_NE(what.find("--devices"), std::string::npos) << "'" << bad << "' was accepted";
  }
}

TEST(Options, RingBaselineIsEachOrFirstAndNeedsARing) {
  AppOptions opt;
  OptionWords words;
  words.devices = "0,1";
  type_options(words, &opt);
  EXPECT_TRUE(opt.ring_baseline_each);  // the default
  words.ring_baseline = "first";
  type_options(words, &opt);
  EXPECT_FALSE(opt.ring_baseline_each);
  words.ring_baseline = "each";
  type_options(words, &opt);
  EXPECT_TRUE(opt.ring_baseline_each);
  auto error = [](const OptionWords& w) {
    AppOptions o;
    try {
      type_options(w, &o);
    } catch (const InputError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  words.ring_baseline = "all";
  EXPECT_NE(error(words).find("--ring-baseline: 'all' is not one of each, first"), std::string::npos);
  words.devices.clear();
  words.ring_baseline = "first";
  EXPECT_NE(error(words).find("--ring-baseline: only with --devices or --ring-rank"), std::string::npos);
}

}  // namespace
}  // namespace flashattn
