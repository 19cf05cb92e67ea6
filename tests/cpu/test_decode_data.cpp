// The decode directory contract (data/README.md, "Decode directories"): loading contiguous and
// paged directories, every refusal, and the split-K choice the decode kernels declare.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numeric>
#include <string>
#include <vector>

#include "decode_data.h"
#include "flashattn/error.h"
#include "flashattn/registry.h"
#include "npy.h"

namespace fa = flashattn;
namespace fs = std::filesystem;

namespace {

std::string scratch_dir() {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  const fs::path root = fs::path(::testing::TempDir()) /
                        ("flashattn_dec_" + std::string(info->test_suite_name()) + "_" + info->name() + "_" +
                         std::to_string(::getpid()));
  fs::remove_all(root);
  fs::create_directories(root);
  return root.string();
}

fa::HostArray zeros(fa::DType t, std::vector<int64_t> shape) { return fa::HostArray(t, std::move(shape)); }

fa::HostArray i32(std::vector<int64_t> shape, std::vector<int32_t> values) {
  fa::HostArray a(fa::DType::I32, std::move(shape));
  std::copy(values.begin(), values.end(), a.data<int32_t>());
  return a;
}

void put(const std::string& dir, const std::string& name, const fa::HostArray& a) {
  fa::write_npy(dir + "/" + name + ".npy", a);
}

// B=2, H=4, H_kv=2, S_new=2, D=8; contiguous S_max=16, or a pool of 4 pages of 16 (2 per element).
std::string write_dir(bool paged, std::vector<int32_t> lens = {3, 14}, fa::DType t = fa::DType::F32) {
  const std::string dir = scratch_dir();
  put(dir, "q", zeros(t, {2, 4, 2, 8}));
  put(dir, "k_new", zeros(t, {2, 2, 2, 8}));
  put(dir, "v_new", zeros(t, {2, 2, 2, 8}));
  const std::vector<int64_t> cache = paged ? std::vector<int64_t>{4, 2, 16, 8} : std::vector<int64_t>{2, 2, 16, 8};
  put(dir, "K_cache", zeros(t, cache));
  put(dir, "V_cache", zeros(t, cache));
  put(dir, "cache_seqlens", i32({2}, lens));
  if (paged) put(dir, "block_table", i32({2, 2}, {3, 1, 0, 2}));
  return dir;
}

void expect_input_error(const std::string& dir, const std::string& fragment) {
  try {
    fa::load_decode_dataset(dir);
    FAIL() << "expected an InputError containing: " << fragment;
  } catch (const fa::InputError& e) {
    EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
    EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos) << "one line: " << e.what();
  }
}

TEST(DecodeData, LoadsAContiguousDirectory) {
  const std::string dir = write_dir(false);
  EXPECT_TRUE(fa::is_decode_dir(dir));
  const fa::DecodeDataset ds = fa::load_decode_dataset(dir);
  EXPECT_EQ(ds.dims.B, 2);
  EXPECT_EQ(ds.dims.H, 4);
  EXPECT_EQ(ds.dims.H_kv, 2);
  EXPECT_EQ(ds.dims.S_new, 2);
  EXPECT_EQ(ds.dims.D, 8);
  EXPECT_EQ(ds.dims.S_max, 16);
  EXPECT_FALSE(ds.dims.paged());
  EXPECT_EQ(fa::decode_lengths(ds.cache_seqlens, 2), (std::vector<int>{5, 16}));
}

TEST(DecodeData, LoadsAPagedDirectory) {
  const fa::DecodeDataset ds = fa::load_decode_dataset(write_dir(true));
  EXPECT_TRUE(ds.dims.paged());
  EXPECT_EQ(ds.dims.page_size, 16);
  EXPECT_EQ(ds.dims.num_blocks, 4);
  EXPECT_EQ(ds.dims.max_blocks, 2);
  EXPECT_EQ(ds.dims.S_max, 32);
}

TEST(DecodeData, AForwardDirectoryIsNotADecodeDirectory) {
  const std::string dir = scratch_dir();
  put(dir, "Q", zeros(fa::DType::F32, {1, 1, 1, 8}));
  EXPECT_FALSE(fa::is_decode_dir(dir));
}

TEST(DecodeData, RefusesAMissingFile) {
  const std::string dir = write_dir(false);
  fs::remove(dir + "/v_new.npy");
  expect_input_error(dir, "missing v_new");
}

TEST(DecodeData, RefusesALengthThatOverflowsTheCache) {
  expect_input_error(write_dir(false, {3, 15}), "cache_seqlens[1] = 15 plus S_new = 2 exceeds the cache's 16 positions");
}

TEST(DecodeData, RefusesANegativeLength) { expect_input_error(write_dir(false, {-1, 3}), "is negative"); }

TEST(DecodeData, RefusesMixedDtypes) {
  const std::string dir = write_dir(false);
  put(dir, "k_new", zeros(fa::DType::F16, {2, 2, 2, 8}));
  expect_input_error(dir, "must share one dtype");
}

TEST(DecodeData, RefusesHeadsThatDoNotGroup) {
  const std::string dir = write_dir(false);
  put(dir, "q", zeros(fa::DType::F32, {2, 3, 2, 8}));
  expect_input_error(dir, "does not divide");
}

TEST(DecodeData, RefusesAPageSizeThatIsNotAPowerOfTwo) {
  const std::string dir = write_dir(true);
  put(dir, "K_cache", zeros(fa::DType::F32, {4, 2, 24, 8}));
  put(dir, "V_cache", zeros(fa::DType::F32, {4, 2, 24, 8}));
  expect_input_error(dir, "page size 24");
}

TEST(DecodeData, RefusesABlockTableEntryOutsideThePool) {
  const std::string dir = write_dir(true, {3, 20});
  put(dir, "block_table", i32({2, 2}, {3, 1, 0, 4}));
  expect_input_error(dir, "block_table[1, 1] = 4 is outside the pool's [0, 4)");
}

TEST(DecodeData, RefusesTwoElementsAppendingIntoOnePage) {
  const std::string dir = write_dir(true, {3, 3});
  put(dir, "block_table", i32({2, 2}, {1, 2, 1, 3}));
  expect_input_error(dir, "receives new tokens of batch elements 0 and 1");
}

TEST(DecodeData, RefusesReadingAPageAnotherElementAppendsInto) {
  // Element 1 reads page 0 as its first block; element 0 appends into page 0.
  const std::string dir = write_dir(true, {3, 20});
  put(dir, "block_table", i32({2, 2}, {0, 1, 0, 2}));
  expect_input_error(dir, "page 0");
}

TEST(DecodeData, RefusesTwoBlocksOfOneElementOnOnePage) {
  // Element 0's blocks 0 and 1 are both page 0: positions j and j + page_size would alias.
  const std::string dir = write_dir(true, {20, 3});
  put(dir, "block_table", i32({2, 2}, {0, 0, 1, 2}));
  expect_input_error(dir, "are both page 0");
}

TEST(DecodeData, AllowsSharedPrefixPagesNobodyAppendsInto) {
  // Both elements read page 0 (a shared prefix) and append into pages of their own.
  const std::string dir = write_dir(true, {16, 17});
  put(dir, "block_table", i32({2, 2}, {0, 1, 0, 2}));
  EXPECT_NO_THROW(fa::load_decode_dataset(dir));
}

TEST(DecodeData, RefusesBshdMeta) {
  const std::string dir = write_dir(false);
  std::ofstream(dir + "/meta.json") << R"({"format_version": 1, "layout": "bshd"})";
  expect_input_error(dir, "decode directories are bhsd");
}

TEST(DecodeData, ReadsBinFilesDescribedByMetaJson) {
  const std::string dir = scratch_dir();
  nlohmann::json files = nlohmann::json::object();
  auto bin = [&](const std::string& name, const fa::HostArray& a) {
    fa::write_raw(dir + "/" + name + ".bin", a);
    files[name] = {{"dtype", fa::dtype_name(a.dtype)}, {"shape", a.shape}};
  };
  bin("q", zeros(fa::DType::BF16, {1, 2, 1, 8}));
  bin("k_new", zeros(fa::DType::BF16, {1, 1, 1, 8}));
  bin("v_new", zeros(fa::DType::BF16, {1, 1, 1, 8}));
  bin("K_cache", zeros(fa::DType::BF16, {1, 1, 4, 8}));
  bin("V_cache", zeros(fa::DType::BF16, {1, 1, 4, 8}));
  bin("cache_seqlens", i32({1}, {2}));
  std::ofstream(dir + "/meta.json") << nlohmann::json({{"format_version", 1}, {"files", files}}).dump();
  const fa::DecodeDataset ds = fa::load_decode_dataset(dir);
  EXPECT_EQ(ds.format, fa::FileFormat::Bin);
  EXPECT_EQ(ds.dtype, fa::DType::BF16);
  EXPECT_EQ(ds.dims.S_max, 4);
}

// ---- split-K choice, as the decode kernels declare it -------------------------------------------

fa::DecodeParams params(int B, int H, int H_kv, int S_new, int len, int sms) {
  fa::DecodeParams p;
  p.B = B, p.H = H, p.H_kv = H_kv, p.S_new = S_new, p.D = 128, p.max_seqlen = len, p.num_sms = sms;
  return p;
}

TEST(DecodeSplits, TheMmaKernelSplitsLongSingleSequences) {
  const fa::KernelMode* e = fa::Registry::find("mma", fa::Mode::Decode);
  ASSERT_NE(e, nullptr);
  ASSERT_NE(e->dec_splits, nullptr);
  const int s = e->dec_splits(params(1, 32, 8, 1, 32768, 132));
  EXPECT_GT(s, 8);
  EXPECT_LE(s, 128);
  // Few groups: about one CTA per SM (8 groups x s pieces within 90-100% of the 132 SMs).
  EXPECT_LE(8 * s, 132);
  EXPECT_GE(8 * s * 10, 132 * 9);
}

TEST(DecodeSplits, TheMmaKernelDoesNotSplitAFullGrid) {
  const fa::KernelMode* e = fa::Registry::find("mma", fa::Mode::Decode);
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(e->dec_splits(params(64, 32, 8, 1, 2048, 132)), 1);
}

TEST(DecodeSplits, UpToAGroupPerSmTheGridIsOneWave) {
  const fa::KernelMode* e = fa::Registry::find("mma", fa::Mode::Decode);
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(e->dec_splits(params(16, 32, 8, 1, 8192, 132)), 1);  // 128 groups: unsplit
  const int s = e->dec_splits(params(8, 32, 8, 1, 4096, 132));     // 64 groups
  EXPECT_EQ(s, 2);
}

TEST(DecodeSplits, ShortCachesAreNotCutBelowTheMinimumPiece) {
  const fa::KernelMode* e = fa::Registry::find("mma", fa::Mode::Decode);
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(e->dec_splits(params(1, 32, 8, 1, 100, 132)), 1);
}

TEST(DecodeSplits, AForcedCountIsKept) {
  for (const char* k : {"mma", "fa2"}) {
    const fa::KernelMode* e = fa::Registry::find(k, fa::Mode::Decode);
    ASSERT_NE(e, nullptr) << k;
    fa::DecodeParams p = params(2, 4, 4, 1, 100, 132);
    p.num_splits = 7;
    EXPECT_EQ(e->dec_splits(p), 7) << k;
    EXPECT_GT(e->dec_workspace(p), 0u) << k;
  }
}

TEST(DecodeSplits, EveryDecodeKernelDeclaresItsEntryPoints) {
  int n = 0;
  for (const fa::KernelMode* e : fa::Registry::entries()) {
    if (e->mode != fa::Mode::Decode) continue;
    ++n;
    EXPECT_NE(e->dec, nullptr) << e->kernel;
    EXPECT_TRUE(e->features & fa::kFeatPaged) << e->kernel;
  }
  EXPECT_GE(n, 3);
}

}  // namespace
