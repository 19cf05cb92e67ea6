// The head-dim helper of kernels/common/head_dims.h, on the host: which of a kernel's declared
// head dims a build's mask compiles (the registry entry's list), that dispatch hands the callback
// the head dim as a compile-time constant, and that any other head dim throws RuntimeError. The
// masks here are the tests' own; the last test reads the build's (FLASHATTN_HDIMS).
#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "common/head_dims.h"
#include "flashattn/error.h"
#include "flashattn/registry.h"

namespace fa = flashattn;

namespace {

constexpr unsigned kAllDims = 0x1f;
constexpr unsigned kOnly128 = fa::head_dim_bit(128);
constexpr unsigned k64And256 = fa::head_dim_bit(64) | fa::head_dim_bit(256);

using AllFive = fa::HeadDimSet<kAllDims, 32, 64, 96, 128, 256>;
using AllFiveOnly128 = fa::HeadDimSet<kOnly128, 32, 64, 96, 128, 256>;
using OwnDims64And256 = fa::HeadDimSet<k64And256, 64, 128, 256>;
using FallbackOnly128 = fa::HeadDimSet<kOnly128, 32, 96>;

// The message of the RuntimeError that dispatch throws for head dim d, or "" when it calls back.
template <class Set>
std::string dispatch_error(int d) {
  try {
    Set::dispatch(d, "test kernel", [](auto) {});
  } catch (const fa::RuntimeError& e) {
    return e.what();
  }
  return "";
}

TEST(HeadDims, MaskBitsFollowTheChoices) {
  EXPECT_EQ(fa::head_dim_bit(32), 1u);
  EXPECT_EQ(fa::head_dim_bit(256), 16u);
  EXPECT_EQ(fa::head_dim_bit(80), 0u);
  EXPECT_EQ(fa::head_dim_bit(0), 0u);
}

TEST(HeadDims, AFullBuildCompilesEveryDeclaredHeadDim) {
  EXPECT_EQ(AllFive::list(), (std::vector<int>{32, 64, 96, 128, 256}));
}

TEST(HeadDims, ListIsTheDeclaredHeadDimsTheBuildEnables) {
  EXPECT_EQ(AllFiveOnly128::list(), std::vector<int>{128});
  EXPECT_EQ(OwnDims64And256::list(), (std::vector<int>{64, 256}));
  EXPECT_TRUE(FallbackOnly128::list().empty());
}

TEST(HeadDims, DeclaresAndCompilesAreCompileTimeAnswers) {
  static_assert(AllFiveOnly128::declares(64) && !AllFiveOnly128::declares(80));
  static_assert(AllFiveOnly128::compiles(128) && !AllFiveOnly128::compiles(64));
  static_assert(!OwnDims64And256::compiles(32) && !OwnDims64And256::compiles(128));
  SUCCEED();
}

TEST(HeadDims, DispatchPassesTheHeadDimAsAConstant) {
  std::vector<int> seen;
  for (int d : {256, 32, 128, 96, 64})
    AllFive::dispatch(d, "test kernel", [&](auto kD) {
      constexpr int kHeadDim = decltype(kD)::value;  // usable as a template argument
      static_assert(kHeadDim % 32 == 0, "one of the five");
      seen.push_back(kHeadDim);
    });
  EXPECT_EQ(seen, (std::vector<int>{256, 32, 128, 96, 64}));
}

TEST(HeadDims, DispatchThrowsForAnUndeclaredHeadDim) {
  EXPECT_EQ(dispatch_error<AllFive>(80), "test kernel: no variant compiled for head dim 80 (this build compiles 32, 64, 96, "
                                         "128, 256)");
  EXPECT_NE(dispatch_error<OwnDims64And256>(32), "");
  EXPECT_NE(dispatch_error<AllFive>(0), "");
}

TEST(HeadDims, DispatchThrowsForADeclaredHeadDimTheBuildLeavesOut) {
  EXPECT_EQ(dispatch_error<AllFiveOnly128>(128), "");
  EXPECT_EQ(dispatch_error<AllFiveOnly128>(64), "test kernel: no variant compiled for head dim 64 (this build compiles 128)");
  EXPECT_EQ(dispatch_error<OwnDims64And256>(256), "");
  EXPECT_NE(dispatch_error<OwnDims64And256>(128), "");
}

// The build's FLASHATTN_HDIMS reaches the registry: kernels with head-dim templates list exactly
// the head dims it enables (each declares all five), hopper's own and fallback ones together.
TEST(HeadDims, RegistryEntriesListTheBuildsHeadDims) {
  const std::vector<int> build = fa::HeadDims<32, 64, 96, 128, 256>::list();
  ASSERT_FALSE(build.empty());
  const std::pair<const char*, fa::Mode> entries[] = {
      {"fa1", fa::Mode::Forward},  {"fa1", fa::Mode::Backward}, {"fa2", fa::Mode::Forward},
      {"fa2", fa::Mode::Backward}, {"fa2", fa::Mode::Decode},   {"wmma", fa::Mode::Forward},
      {"wmma", fa::Mode::Backward}, {"mma", fa::Mode::Forward}, {"mma", fa::Mode::Backward},
      {"mma", fa::Mode::Decode},   {"hopper", fa::Mode::Forward}};
  for (const auto& [name, mode] : entries) {
    const fa::KernelMode* m = fa::Registry::find(name, mode);
    ASSERT_NE(m, nullptr) << name;
    EXPECT_EQ(m->head_dims, build) << name << " " << fa::mode_name(mode);
  }
  const fa::KernelMode* hopper = fa::Registry::find("hopper", fa::Mode::Forward);
  EXPECT_EQ(hopper->fallback_head_dims, (fa::HeadDims<32, 96>::list()));
}

}  // namespace
