// The data directory contract (data/README.md): loading, every refusal, mask broadcasting and
// the output writer.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "dataset.h"
#include "flashattn/error.h"
#include "npy.h"

namespace fa = flashattn;
namespace fs = std::filesystem;

namespace {

// A fresh, empty directory per test; `leaf` lets a test choose the directory's own name.
std::string scratch_dir(const std::string& leaf = "data") {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  const fs::path root = fs::path(::testing::TempDir()) / ("flashattn_ds_" + std::string(info->test_suite_name()) +
                                                          "_" + info->name() + "_" + std::to_string(::getpid()));
  fs::remove_all(root);
  fs::create_directories(root / leaf);
  return (root / leaf).string();
}

fa::HostArray filled(fa::DType t, std::vector<int64_t> shape, double start = 0.25) {
  fa::HostArray f64(fa::DType::F64, std::move(shape));
  for (int64_t i = 0; i < f64.numel(); ++i) f64.data<double>()[i] = start + 0.5 * static_cast<double>(i % 13);
  return t == fa::DType::F64 ? f64 : fa::convert(f64, t);
}

fa::HostArray ints(fa::DType t, std::vector<int64_t> values) {
  fa::HostArray a(t, {static_cast<int64_t>(values.size())});
  for (size_t i = 0; i < values.size(); ++i) {
    if (t == fa::DType::I32) a.data<int32_t>()[i] = static_cast<int32_t>(values[i]);
    else a.data<int64_t>()[i] = values[i];
  }
  return a;
}

void put_npy(const std::string& dir, const std::string& name, const fa::HostArray& a) {
  fa::write_npy(dir + "/" + name + ".npy", a);
}
void put_bin(const std::string& dir, const std::string& name, const fa::HostArray& a) {
  fa::write_raw(dir + "/" + name + ".bin", a);
}
void put_text(const std::string& path, const std::string& text) { std::ofstream(path) << text; }

struct Sizes {
  int64_t B = 2, H = 4, H_kv = 2, S_q = 3, S_k = 5, D = 8;
};

// Q, K, V as .npy in bhsd (or bshd) order.
void put_qkv(const std::string& dir, const Sizes& s = {}, fa::DType t = fa::DType::F32,
             fa::Layout layout = fa::Layout::BHSD) {
  const bool bshd = layout == fa::Layout::BSHD;
  put_npy(dir, "Q", filled(t, bshd ? std::vector<int64_t>{s.B, s.S_q, s.H, s.D} : std::vector<int64_t>{s.B, s.H, s.S_q, s.D}));
  const std::vector<int64_t> kv = bshd ? std::vector<int64_t>{s.B, s.S_k, s.H_kv, s.D} : std::vector<int64_t>{s.B, s.H_kv, s.S_k, s.D};
  put_npy(dir, "K", filled(t, kv, 1.0));
  put_npy(dir, "V", filled(t, kv, 2.0));
}

// The one-line InputError message of loading `dir` ("" and a test failure if it loads).
std::string load_error(const std::string& dir, const fa::LoadOptions& opt = {}) {
  try {
    (void)fa::load_dataset(dir, opt);
  } catch (const fa::InputError& e) {
    const std::string msg = e.what();
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
    return msg;
  }
  ADD_FAILURE() << dir << " loaded, expected an error";
  return "";
}

#define EXPECT_CONTAINS(haystack, needle) \
  EXPECT_NE(std::string(haystack).find(needle), std::string::npos) << "message: " << (haystack)

std::map<std::string, fs::file_time_type> listing(const std::string& dir) {
  std::map<std::string, fs::file_time_type> out;
  for (const auto& e : fs::recursive_directory_iterator(dir)) out[e.path().string()] = e.last_write_time();
  return out;
}

}  // namespace

// ---- loading -------------------------------------------------------------------------------

TEST(DatasetLoad, NpyDirectoryWithGqaShapes) {
  const std::string dir = scratch_dir();
  put_qkv(dir);
  const fa::Dataset ds = fa::load_dataset(dir, {});
  EXPECT_EQ(ds.format, fa::FileFormat::Npy);
  EXPECT_EQ(ds.source, "npy");
  EXPECT_EQ(ds.layout, fa::Layout::BHSD);
  EXPECT_EQ(ds.dtype, fa::DType::F32);
  EXPECT_EQ(ds.dims.B, 2);
  EXPECT_EQ(ds.dims.H, 4);
  EXPECT_EQ(ds.dims.H_kv, 2);
  EXPECT_EQ(ds.dims.S_q, 3);
  EXPECT_EQ(ds.dims.S_k, 5);
  EXPECT_EQ(ds.dims.D, 8);
  EXPECT_EQ(ds.q.bytes, filled(fa::DType::F32, {2, 4, 3, 8}).bytes);
  EXPECT_FALSE(ds.dout || ds.seqlens_k || ds.mask);
  EXPECT_EQ(ds.input_paths, (std::vector<std::string>{dir + "/Q.npy", dir + "/K.npy", dir + "/V.npy"}));
  EXPECT_TRUE(ds.notices.empty());
}

TEST(DatasetLoad, BinWithMetaJson) {
  const std::string dir = scratch_dir();
  put_bin(dir, "Q", filled(fa::DType::F16, {2, 4, 3, 8}));
  put_bin(dir, "K", filled(fa::DType::F16, {2, 2, 5, 8}));
  put_bin(dir, "V", filled(fa::DType::F16, {2, 2, 5, 8}));
  put_bin(dir, "seqlens_k", ints(fa::DType::I32, {5, 0}));
  put_bin(dir, "mask", filled(fa::DType::F32, {3, 5}));
  put_text(dir + "/meta.json", R"({"format_version": 1, "layout": "bhsd", "dtype": "fp16", "B": 2, "H": 4,
    "H_kv": 2, "S_q": 3, "S_k": 5, "D": 8, "files": {"mask": {"dtype": "fp32", "shape": [3, 5]}}})");
  const fa::Dataset ds = fa::load_dataset(dir, {});
  EXPECT_EQ(ds.format, fa::FileFormat::Bin);
  EXPECT_EQ(ds.source, "bin+meta.json");
  EXPECT_EQ(ds.dtype, fa::DType::F16);
  EXPECT_EQ(ds.dims.H_kv, 2);
  EXPECT_EQ(ds.k.bytes, filled(fa::DType::F16, {2, 2, 5, 8}).bytes);
  ASSERT_TRUE(ds.seqlens_k && ds.mask);
  EXPECT_EQ(ds.seqlens_k->data<int32_t>()[0], 5);
  EXPECT_EQ(ds.mask->shape, (std::vector<int64_t>{3, 5}));
  EXPECT_EQ(ds.input_paths.front(), dir + "/meta.json");
  EXPECT_EQ(ds.input_paths.size(), 6u);
}

TEST(DatasetLoad, BinMetaDefaultsHkvToHAndSeqLengthsToS) {
  const std::string dir = scratch_dir();
  for (const char* name : {"Q", "K", "V", "dO"}) put_bin(dir, name, filled(fa::DType::F32, {1, 2, 6, 4}));
  put_bin(dir, "mask", filled(fa::DType::F32, {1, 2, 6, 6}));  // no "files" entry: full shape
  put_text(dir + "/meta.json", R"({"B": 1, "H": 2, "S": 6, "D": 4})");
  const fa::Dataset ds = fa::load_dataset(dir, {});
  EXPECT_EQ(ds.dims.H_kv, 2);
  EXPECT_EQ(ds.dims.S_q, 6);
  EXPECT_EQ(ds.dims.S_k, 6);
  EXPECT_TRUE(ds.dout && ds.mask);
}

TEST(DatasetLoad, BinWithDirectoryName) {
  const std::string dir = scratch_dir("B2_H4_S3_D8");
  for (const char* name : {"Q", "K", "V"}) put_bin(dir, name, filled(fa::DType::F32, {2, 4, 3, 8}));
  put_bin(dir, "seqlens_k", ints(fa::DType::I32, {3, 1}));
  for (const std::string& spelling : {dir, dir + "/"}) {
    const fa::Dataset ds = fa::load_dataset(spelling, {});
    EXPECT_EQ(ds.source, "bin+dirname");
    EXPECT_EQ(ds.dims.B, 2);
    EXPECT_EQ(ds.dims.H_kv, 4);
    EXPECT_EQ(ds.dims.S_k, 3);
    EXPECT_TRUE(ds.seqlens_k);
  }
}

TEST(DatasetLoad, BshdFromTheLayoutOption) {
  const std::string dir = scratch_dir();
  put_qkv(dir, {}, fa::DType::F32, fa::Layout::BSHD);
  fa::LoadOptions opt;
  opt.layout = fa::Layout::BSHD;
  const fa::Dataset ds = fa::load_dataset(dir, opt);
  EXPECT_EQ(ds.layout, fa::Layout::BSHD);
  EXPECT_EQ(ds.dims.H, 4);
  EXPECT_EQ(ds.dims.H_kv, 2);
  EXPECT_EQ(ds.dims.S_q, 3);
  EXPECT_EQ(ds.dims.S_k, 5);
}

TEST(DatasetLoad, BshdFromMetaJsonInAnNpyDirectory) {
  const std::string dir = scratch_dir();
  put_qkv(dir, {}, fa::DType::BF16, fa::Layout::BSHD);
  put_text(dir + "/meta.json", R"({"layout": "bshd"})");
  const fa::Dataset ds = fa::load_dataset(dir, {});
  EXPECT_EQ(ds.layout, fa::Layout::BSHD);
  EXPECT_EQ(ds.dtype, fa::DType::BF16);
  EXPECT_EQ(ds.dims.S_k, 5);
}

TEST(DatasetLoad, BshdBinShapesFollowTheLayout) {
  const std::string dir = scratch_dir();
  put_bin(dir, "Q", filled(fa::DType::F32, {1, 3, 4, 8}));
  put_bin(dir, "K", filled(fa::DType::F32, {1, 5, 2, 8}));
  put_bin(dir, "V", filled(fa::DType::F32, {1, 5, 2, 8}));
  put_text(dir + "/meta.json", R"({"layout": "bshd", "B": 1, "H": 4, "H_kv": 2, "S_q": 3, "S_k": 5, "D": 8})");
  const fa::Dataset ds = fa::load_dataset(dir, {});
  EXPECT_EQ(ds.q.shape, (std::vector<int64_t>{1, 3, 4, 8}));
  EXPECT_EQ(ds.dims.H, 4);
}

TEST(DatasetLoad, OptionalInputsWithConversionNotices) {
  const std::string dir = scratch_dir();
  put_qkv(dir);
  put_npy(dir, "dO", filled(fa::DType::F64, {2, 4, 3, 8}));
  put_npy(dir, "seqlens_k", ints(fa::DType::I64, {0, 5}));
  fa::HostArray mask = filled(fa::DType::F32, {2, 1, 3, 5});
  mask.data<float>()[4] = -std::numeric_limits<float>::infinity();
  put_npy(dir, "mask", fa::convert(mask, fa::DType::F16));
  const fa::Dataset ds = fa::load_dataset(dir, {});
  ASSERT_TRUE(ds.dout && ds.seqlens_k && ds.mask);
  EXPECT_EQ(ds.dout->dtype, fa::DType::F32);
  EXPECT_EQ(ds.seqlens_k->dtype, fa::DType::I32);
  EXPECT_EQ(ds.seqlens_k->data<int32_t>()[1], 5);
  EXPECT_EQ(ds.mask->dtype, fa::DType::F32);
  EXPECT_EQ(ds.mask->data<float>()[4], -std::numeric_limits<float>::infinity());
  ASSERT_EQ(ds.notices.size(), 3u);
  EXPECT_EQ(ds.notices[0], dir + "/dO.npy: converted fp64 to fp32 to match Q");
  EXPECT_EQ(ds.notices[1], dir + "/seqlens_k.npy: converted int64 to int32");
  EXPECT_EQ(ds.notices[2], dir + "/mask.npy: converted fp16 to fp32");
  EXPECT_EQ(ds.input_paths.size(), 6u);
}

TEST(DatasetLoad, NeverWritesIntoTheDirectory) {
  const std::string dir = scratch_dir();
  put_qkv(dir);
  put_text(dir + "/meta.json", R"({"layout": "bhsd"})");
  const auto before = listing(dir);
  (void)fa::load_dataset(dir, {});
  EXPECT_EQ(listing(dir), before);
}

// ---- refusals ------------------------------------------------------------------------------

TEST(DatasetErrors, DirectoryMissingOrAFile) {
  const std::string dir = scratch_dir();
  EXPECT_EQ(load_error(dir + "/nope"), dir + "/nope: no such directory");
  put_text(dir + "/file", "x");
  EXPECT_EQ(load_error(dir + "/file"), dir + "/file: not a directory");
}

TEST(DatasetErrors, MissingRequiredInput) {
  const std::string dir = scratch_dir();
  put_qkv(dir);
  fs::remove(dir + "/V.npy");
  EXPECT_EQ(load_error(dir), dir + ": missing V (expected V.npy or V.bin)");
}

TEST(DatasetErrors, BothNpyAndBinOfOneInput) {
  const std::string dir = scratch_dir();
  put_qkv(dir);
  put_bin(dir, "Q", filled(fa::DType::F32, {2, 4, 3, 8}));
  EXPECT_EQ(load_error(dir), dir + ": both Q.npy and Q.bin exist; keep one");
}

TEST(DatasetErrors, MixedFormatsForQKV) {
  const std::string dir = scratch_dir();
  put_qkv(dir);
  fs::remove(dir + "/K.npy");
  put_bin(dir, "K", filled(fa::DType::F32, {2, 2, 5, 8}));
  EXPECT_CONTAINS(load_error(dir), "Q, K and V must all be .npy or all be .bin");
}

TEST(DatasetErrors, WrongRank) {
  const std::string dir = scratch_dir();
  put_qkv(dir);
  put_npy(dir, "Q", filled(fa::DType::F32, {2, 4, 24}));
  EXPECT_EQ(load_error(dir), dir + "/Q.npy: expected rank 4 [B, H, S_q, D] (bhsd), got shape [2, 4, 24]");
}

TEST(DatasetErrors, IntegerQ) {
  const std::string dir = scratch_dir();
  put_qkv(dir);
  put_npy(dir, "Q", fa::HostArray(fa::DType::I32, {2, 4, 3, 8}));
  EXPECT_CONTAINS(load_error(dir), dir + "/Q.npy: dtype int32 is not supported for Q");
}

TEST(DatasetErrors, QKVDtypesDiffer) {
  const std::string dir = scratch_dir();
  put_qkv(dir);
  put_npy(dir, "V", filled(fa::DType::F16, {2, 2, 5, 8}));
  EXPECT_EQ(load_error(dir), dir + ": Q.npy is fp32, K.npy is fp32, V.npy is fp16: Q, K and V must have the same dtype");
}

TEST(DatasetErrors, KAndVShapesDiffer) {
  const std::string dir = scratch_dir();
  put_qkv(dir);
  put_npy(dir, "V", filled(fa::DType::F32, {2, 2, 6, 8}));
  EXPECT_CONTAINS(load_error(dir), "K and V must have the same shape");
}

TEST(DatasetErrors, BatchOrHeadDimDisagree) {
  const std::string dir = scratch_dir();
  put_qkv(dir);
  put_npy(dir, "K", filled(fa::DType::F32, {3, 2, 5, 8}));
  put_npy(dir, "V", filled(fa::DType::F32, {3, 2, 5, 8}));
  EXPECT_EQ(load_error(dir), dir + ": Q.npy has B=2, K.npy has B=3: batch sizes must agree");
  put_npy(dir, "K", filled(fa::DType::F32, {2, 2, 5, 16}));
  put_npy(dir, "V", filled(fa::DType::F32, {2, 2, 5, 16}));
  EXPECT_EQ(load_error(dir), dir + ": Q.npy has D=8, K.npy has D=16: head dims must agree");
}

TEST(DatasetErrors, HeadsNotAMultipleOfKvHeads) {
  const std::string dir = scratch_dir();
  put_qkv(dir, Sizes{2, 8, 3, 3, 5, 8});
  EXPECT_EQ(load_error(dir), dir + ": Q.npy has H=8 heads, K.npy has H_kv=3: H must be a multiple of H_kv");
}

TEST(DatasetErrors, EmptyDimension) {
  const std::string dir = scratch_dir();
  put_qkv(dir, Sizes{2, 4, 2, 0, 5, 8});
  EXPECT_EQ(load_error(dir), dir + "/Q.npy: S_q = 0; every size must be >= 1");
}

TEST(DatasetErrors, GradientOfTheWrongShapeOrType) {
  const std::string dir = scratch_dir();
  put_qkv(dir);
  put_npy(dir, "dO", filled(fa::DType::F32, {2, 4, 3, 4}));
  EXPECT_CONTAINS(load_error(dir), dir + "/dO.npy: shape [2, 4, 3, 4] differs from Q's [2, 4, 3, 8]");
  put_npy(dir, "dO", fa::HostArray(fa::DType::I64, {2, 4, 3, 8}));
  EXPECT_CONTAINS(load_error(dir), dir + "/dO.npy: dtype int64 is not a float dtype");
}

TEST(DatasetErrors, SeqlensOfTheWrongTypeLengthOrRange) {
  const std::string dir = scratch_dir();
  put_qkv(dir);
  put_npy(dir, "seqlens_k", filled(fa::DType::F32, {2}));
  EXPECT_CONTAINS(load_error(dir), dir + "/seqlens_k.npy: dtype fp32 is not supported");
  put_npy(dir, "seqlens_k", ints(fa::DType::I32, {1, 2, 3}));
  EXPECT_EQ(load_error(dir), dir + "/seqlens_k.npy: expected shape [B] = [2], got [3]");
  put_npy(dir, "seqlens_k", ints(fa::DType::I32, {1, 6}));
  EXPECT_EQ(load_error(dir), dir + "/seqlens_k.npy: seqlens_k[1] = 6 is outside [0, S_k] = [0, 5]");
  put_npy(dir, "seqlens_k", ints(fa::DType::I64, {-1, 2}));
  EXPECT_CONTAINS(load_error(dir), "seqlens_k[0] = -1 is outside");
}

TEST(DatasetErrors, MaskWithNaNOrPlusInf) {
  const std::string dir = scratch_dir();
  put_qkv(dir);
  fa::HostArray mask = filled(fa::DType::F32, {3, 5});
  mask.data<float>()[7] = std::numeric_limits<float>::quiet_NaN();
  put_npy(dir, "mask", mask);
  EXPECT_EQ(load_error(dir), dir + "/mask.npy: NaN at flat index 7 (use -inf to mask a key out)");
  mask.data<float>()[7] = std::numeric_limits<float>::infinity();
  put_npy(dir, "mask", mask);
  EXPECT_CONTAINS(load_error(dir), "+inf at flat index 7");
}

TEST(DatasetErrors, MaskThatDoesNotBroadcastOrIsNotFloat) {
  const std::string dir = scratch_dir();
  put_qkv(dir);
  put_npy(dir, "mask", filled(fa::DType::F32, {4, 5}));
  EXPECT_EQ(load_error(dir), dir + "/mask.npy: mask shape [4, 5] does not broadcast to [B, H, S_q, S_k] = [2, 4, 3, 5]");
  put_npy(dir, "mask", filled(fa::DType::F32, {1, 2, 4, 3, 5}));
  EXPECT_CONTAINS(load_error(dir), "it must have rank 1 to 4");
  put_npy(dir, "mask", fa::HostArray(fa::DType::I32, {3, 5}));
  EXPECT_CONTAINS(load_error(dir), dir + "/mask.npy: dtype int32 is not supported");
}

TEST(DatasetErrors, BinWithoutMetaOrMatchingName) {
  for (const std::string leaf : {"data", "B2_H4_S3_D8_x", "B02_H4_S3_D8", "b2_h4_s3_d8"}) {
    const std::string dir = scratch_dir(leaf);
    for (const char* name : {"Q", "K", "V"}) put_bin(dir, name, filled(fa::DType::F32, {2, 4, 3, 8}));
    EXPECT_EQ(load_error(dir), dir + ": .bin inputs need meta.json or a directory named B{b}_H{h}_S{s}_D{d}");
  }
}

TEST(DatasetErrors, DirectoryNameConventionIsBhsdOnly) {
  const std::string dir = scratch_dir("B2_H4_S3_D8");
  for (const char* name : {"Q", "K", "V"}) put_bin(dir, name, filled(fa::DType::F32, {2, 4, 3, 8}));
  fa::LoadOptions opt;
  opt.layout = fa::Layout::BSHD;
  EXPECT_CONTAINS(load_error(dir, opt), "bshd needs a meta.json");
}

TEST(DatasetErrors, BinSizeDisagreesWithMeta) {
  const std::string dir = scratch_dir();
  for (const char* name : {"Q", "K", "V"}) put_bin(dir, name, filled(fa::DType::F32, {2, 4, 3, 8}));
  put_text(dir + "/meta.json", R"({"B": 2, "H": 4, "S": 3, "D": 16})");
  EXPECT_EQ(load_error(dir), dir + "/Q.bin: file has 768 bytes, expected [2, 4, 3, 16] fp32 = 1536 bytes");
}

TEST(DatasetErrors, BadMetaJson) {
  const std::string dir = scratch_dir();
  for (const char* name : {"Q", "K", "V"}) put_bin(dir, name, filled(fa::DType::F32, {2, 4, 3, 8}));
  const std::string meta = dir + "/meta.json";
  const std::pair<std::string, std::string> cases[] = {
      {"{\"B\": 2,", meta + ": invalid JSON"},
      {"[1, 2]", meta + ": expected a JSON object"},
      {R"({"format_version": 2, "B": 2, "H": 4, "S": 3, "D": 8})", meta + ": field 'format_version' must be 1"},
      {R"({"B": 2, "H": 4, "S": 3})", meta + ": missing field 'D', needed for the shape of Q.bin"},
      {R"({"B": 2, "H": 4, "D": 8})", meta + ": missing field 'S_q' (or 'S'), needed for the shape of Q.bin"},
      {R"({"B": "2", "H": 4, "S": 3, "D": 8})", meta + ": field 'B' must be a positive integer"},
      {R"({"B": 2.0, "H": 4, "S": 3, "D": 8})", meta + ": field 'B' must be a positive integer"},
      {R"({"B": 0, "H": 4, "S": 3, "D": 8})", meta + ": field 'B' must be a positive integer"},
      {R"({"B": 2, "H": 4, "S": 3, "D": 8, "dtype": "int8"})", meta + ": field 'dtype' must be one of"},
      {R"({"B": 2, "H": 4, "S": 3, "D": 8, "layout": "bsdh"})", meta + ": field 'layout' must be \"bhsd\" or \"bshd\""},
      {R"({"B": 2, "H": 4, "S": 3, "D": 8, "files": []})", meta + ": field 'files' must be an object"},
      {R"({"B": 2, "H": 4, "S": 3, "D": 8, "files": {"Q": 1}})", meta + ": field 'files.Q' must be an object"},
      {R"({"B": 2, "H": 4, "S": 3, "D": 8, "files": {"Q": {"shape": [2, -4, 3, 8]}}})",
       meta + ": field 'files.Q.shape' must be a list of non-negative integers"},
      {R"({"B": 2, "H": 4, "S": 3, "D": 8, "files": {"Q": {"dtype": "half-ish"}}})",
       meta + ": field 'files.Q.dtype' must be a dtype name"},
  };
  for (const auto& c : cases) {
    put_text(meta, c.first);
    EXPECT_EQ(load_error(dir).rfind(c.second, 0), 0u) << c.first << " -> " << load_error(dir);
  }
}

TEST(DatasetErrors, LayoutConflictBetweenOptionAndMeta) {
  const std::string dir = scratch_dir();
  put_qkv(dir, {}, fa::DType::F32, fa::Layout::BSHD);
  put_text(dir + "/meta.json", R"({"layout": "bshd"})");
  fa::LoadOptions opt;
  opt.layout = fa::Layout::BHSD;
  EXPECT_EQ(load_error(dir, opt), dir + "/meta.json: layout 'bshd' conflicts with --layout bhsd");
}

TEST(DatasetErrors, InputThatIsADirectory) {
  const std::string dir = scratch_dir();
  put_qkv(dir);
  fs::create_directories(dir + "/mask.npy");
  EXPECT_EQ(load_error(dir), dir + "/mask.npy: is a directory, expected a file");
}

// ---- mask broadcasting ---------------------------------------------------------------------

namespace {
fa::MaskView view(std::vector<int64_t> shape) {
  fa::Dims d;
  d.B = 2;
  d.H = 4;
  d.H_kv = 2;
  d.S_q = 3;
  d.S_k = 5;
  d.D = 8;
  return fa::mask_view(shape, d, nullptr, "m.npy");
}
std::vector<int64_t> strides(const fa::MaskView& v) { return {v.batch, v.head, v.row, v.col}; }
}  // namespace

TEST(MaskView, FullMaskIsContiguous) { EXPECT_EQ(strides(view({2, 4, 3, 5})), (std::vector<int64_t>{60, 15, 5, 1})); }

TEST(MaskView, BroadcastDimensionsHaveStrideZero) {
  EXPECT_EQ(strides(view({3, 5})), (std::vector<int64_t>{0, 0, 5, 1}));
  EXPECT_EQ(strides(view({5})), (std::vector<int64_t>{0, 0, 0, 1}));
  EXPECT_EQ(strides(view({1, 4, 3, 5})), (std::vector<int64_t>{0, 15, 5, 1}));
  EXPECT_EQ(strides(view({4, 3, 5})), (std::vector<int64_t>{0, 15, 5, 1}));
  EXPECT_EQ(strides(view({2, 1, 3, 5})), (std::vector<int64_t>{15, 0, 5, 1}));
  EXPECT_EQ(strides(view({2, 1, 1, 5})), (std::vector<int64_t>{5, 0, 0, 1}));
  EXPECT_EQ(strides(view({2, 4, 3, 1})), (std::vector<int64_t>{12, 3, 1, 0}));
  EXPECT_EQ(strides(view({1, 1, 1, 1})), (std::vector<int64_t>{0, 0, 0, 0}));
}

TEST(MaskView, KeepsThePointer) {
  const float x = 0.f;
  fa::Dims d;
  d.B = d.H = d.H_kv = d.S_q = d.S_k = d.D = 1;
  EXPECT_EQ(fa::mask_view({1}, d, &x, "m").ptr, &x);
}

TEST(MaskView, RefusesShapesThatDoNotBroadcast) {
  EXPECT_THROW(view({3, 4}), fa::InputError);
  EXPECT_THROW(view({2, 4, 5, 3}), fa::InputError);
  EXPECT_THROW(view({3, 3, 5}), fa::InputError);
  EXPECT_THROW(view({}), fa::InputError);
  EXPECT_THROW(view({1, 2, 4, 3, 5}), fa::InputError);
}

// ---- output writer -------------------------------------------------------------------------

TEST(OutputWriter, NpyCreatesParentsAndWritesReadableFiles) {
  const std::string out = scratch_dir() + "/a/b/out";
  fa::OutputWriter w(out, fa::FileFormat::Npy, fa::Layout::BHSD, {});
  w.add("O", filled(fa::DType::BF16, {1, 2, 3, 4}));
  w.add("lse", filled(fa::DType::F32, {1, 2, 3}));
  w.finish();
  EXPECT_EQ(fa::read_npy(out + "/O.npy").bytes, filled(fa::DType::BF16, {1, 2, 3, 4}).bytes);
  EXPECT_EQ(fa::read_npy(out + "/lse.npy").dtype, fa::DType::F32);
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(out)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"O.npy", "lse.npy"}));  // no temp files, no meta.json
  EXPECT_EQ(w.dir(), out);
}

TEST(OutputWriter, BinWritesRawFilesAndMetaJson) {
  const std::string out = scratch_dir() + "/out";
  fa::OutputWriter w(out, fa::FileFormat::Bin, fa::Layout::BSHD, {});
  w.add("O", filled(fa::DType::F16, {1, 3, 2, 4}));
  w.add("lse", filled(fa::DType::F32, {1, 2, 3}));
  w.finish();
  EXPECT_EQ(fa::read_raw(out + "/O.bin", fa::DType::F16, {1, 3, 2, 4}).bytes, filled(fa::DType::F16, {1, 3, 2, 4}).bytes);
  const std::vector<uint8_t> text = fa::read_file(out + "/meta.json");
  const nlohmann::json meta = nlohmann::json::parse(text.begin(), text.end());
  EXPECT_EQ(meta["format_version"], 1);
  EXPECT_EQ(meta["layout"], "bshd");
  EXPECT_EQ(meta["files"]["O"]["dtype"], "fp16");
  EXPECT_EQ(meta["files"]["O"]["shape"], (std::vector<int64_t>{1, 3, 2, 4}));
  EXPECT_EQ(meta["files"]["lse"]["dtype"], "fp32");
  EXPECT_EQ(meta["files"]["lse"]["shape"], (std::vector<int64_t>{1, 2, 3}));
}

TEST(OutputWriter, ReplacesAnExistingOutputWhole) {
  const std::string out = scratch_dir();
  put_text(out + "/O.npy", std::string(10000, 'x'));
  fa::OutputWriter w(out, fa::FileFormat::Npy, fa::Layout::BHSD, {});
  w.add("O", filled(fa::DType::F32, {2}));
  w.finish();
  EXPECT_EQ(fa::read_npy(out + "/O.npy").shape, (std::vector<int64_t>{2}));
  EXPECT_EQ(std::distance(fs::directory_iterator(out), fs::directory_iterator{}), 1);
}

TEST(OutputWriter, RefusesToOverwriteAProtectedInput) {
  const std::string dir = scratch_dir();
  put_qkv(dir);
  const auto before = fa::read_file(dir + "/Q.npy");
  // The protect list spells the path differently; the check compares canonical paths.
  fa::OutputWriter w(dir, fa::FileFormat::Npy, fa::Layout::BHSD, {dir + "/./sub/../Q.npy"});
  try {
    w.add("Q", filled(fa::DType::F32, {1}));
    FAIL() << "overwrote an input";
  } catch (const fa::InputError& e) {
    EXPECT_EQ(std::string(e.what()), dir + "/Q.npy: refusing to overwrite an input file");
  }
  EXPECT_EQ(fa::read_file(dir + "/Q.npy"), before);
  w.add("O", filled(fa::DType::F32, {1}));  // other names are fine
}

TEST(OutputWriter, RefusesThroughASymlinkedDirectory) {
  const std::string dir = scratch_dir();
  put_qkv(dir);
  const std::string link = dir + "_link";
  fs::remove(link);
  fs::create_directory_symlink(dir, link);
  fa::OutputWriter w(link, fa::FileFormat::Npy, fa::Layout::BHSD, {dir + "/K.npy"});
  EXPECT_THROW(w.add("K", filled(fa::DType::F32, {1})), fa::InputError);
  fs::remove(link);
}

TEST(OutputWriter, BinIntoTheInputDirectoryIsRefusedBeforeWriting) {
  const std::string dir = scratch_dir();
  put_text(dir + "/meta.json", "{}");
  EXPECT_THROW(fa::OutputWriter(dir, fa::FileFormat::Bin, fa::Layout::BHSD, {dir + "/meta.json"}), fa::InputError);
}

TEST(OutputWriter, OutputPathThatIsAFile) {
  const std::string dir = scratch_dir();
  put_text(dir + "/file", "x");
  fa::OutputWriter w(dir + "/file", fa::FileFormat::Npy, fa::Layout::BHSD, {});
  EXPECT_THROW(w.add("O", filled(fa::DType::F32, {1})), fa::InputError);
}

TEST(OutputWriter, FormatNames) {
  EXPECT_STREQ(fa::format_name(fa::FileFormat::Npy), "npy");
  EXPECT_STREQ(fa::format_name(fa::FileFormat::Bin), "bin");
}
