// The in-memory parsers behind the fuzz target agree with the file readers on every seed of
// tests/fuzz/corpus, and what they quote from a file cannot break the one-line error rule.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "flashattn/error.h"
#include "meta.h"
#include "npy.h"

namespace fa = flashattn;
namespace fs = std::filesystem;

namespace {

const fs::path kCorpus = fs::path(FLASHATTN_SOURCE_DIR) / "tests" / "fuzz" / "corpus";

// The message without its leading "ORIGIN: ".
std::string problem(const std::string& what, const std::string& origin) {
  return what.rfind(origin + ": ", 0) == 0 ? what.substr(origin.size() + 2) : "(does not start with the origin) " + what;
}

TEST(ParseNpy, AgreesWithReadNpyOnEverySeed) {
  ASSERT_TRUE(fs::is_directory(kCorpus)) << kCorpus;
  int seeds = 0;
  for (const auto& e : fs::directory_iterator(kCorpus)) {
    const std::string path = e.path().string();
    const std::vector<uint8_t> bytes = fa::read_file(path);
    std::string from_file, from_memory;
    fa::HostArray a, b;
    try {
      a = fa::read_npy(path);
    } catch (const fa::InputError& err) {
      from_file = problem(err.what(), path);
    }
    try {
      b = fa::parse_npy(bytes.data(), bytes.size(), "mem");
    } catch (const fa::InputError& err) {
      from_memory = problem(err.what(), "mem");
    }
    EXPECT_EQ(from_file, from_memory) << path;
    EXPECT_EQ(a.shape, b.shape) << path;
    EXPECT_EQ(a.bytes, b.bytes) << path;
    EXPECT_EQ(from_file.find('\n'), std::string::npos) << path;
    ++seeds;
  }
  EXPECT_GT(seeds, 30);
}

TEST(ParseNpy, ControlCharactersFromTheHeaderAreEscapedInMessages) {
  const std::string dict = "{'descr': '<f\n4\x1b', 'fortran_order': False, 'shape': (1,), }\n";
  std::vector<uint8_t> bytes = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, static_cast<uint8_t>(dict.size()), 0};
  bytes.insert(bytes.end(), dict.begin(), dict.end());
  try {
    (void)fa::parse_npy(bytes.data(), bytes.size(), "Q.npy");
    FAIL();
  } catch (const fa::InputError& e) {
    EXPECT_EQ(std::string(e.what()).substr(0, 42), "Q.npy: unsupported dtype '<f\\x0a4\\x1b'; su");
  }
}

TEST(ParseRaw, SizeMustMatchTheShapeExactly) {
  const std::vector<uint8_t> bytes(24, 0);
  EXPECT_EQ(fa::parse_raw(bytes.data(), bytes.size(), fa::DType::F32, {2, 3}, "Q.bin").shape,
            (std::vector<int64_t>{2, 3}));
  EXPECT_THROW(fa::parse_raw(bytes.data(), bytes.size(), fa::DType::F16, {2, 3}, "Q.bin"), fa::InputError);
  EXPECT_THROW(fa::parse_raw(bytes.data(), bytes.size(), fa::DType::F32, {int64_t(1) << 62, 4}, "Q.bin"),
               fa::InputError);
}

TEST(ParseMetaJson, ErrorsAreOneLineAndNameTheFile) {
  for (const std::string text : {"{\"B\": \n\n", "[1]", "{\"format_version\": 2}", "\x01\xff{"}) {
    try {
      (void)fa::parse_meta_json(reinterpret_cast<const uint8_t*>(text.data()), text.size(), "d/meta.json");
      FAIL() << text;
    } catch (const fa::InputError& e) {
      const std::string what = e.what();
      EXPECT_EQ(what.rfind("d/meta.json: ", 0), 0u) << what;
      EXPECT_EQ(what.find('\n'), std::string::npos) << what;
      for (const char c : what) EXPECT_TRUE(c >= 0x20 && c < 0x7f) << what;
    }
  }
}

TEST(ParseMetaJson, ShapesOfBinFilesComeFromTheTopLevelSizes) {
  const std::string text = R"({"B": 2, "H": 4, "H_kv": 2, "S": 5, "D": 8, "layout": "bshd"})";
  const nlohmann::json meta = fa::parse_meta_json(reinterpret_cast<const uint8_t*>(text.data()), text.size(), "m");
  const fa::Layout layout = fa::meta_layout(&meta, std::nullopt, "m");
  EXPECT_EQ(layout, fa::Layout::BSHD);
  EXPECT_THROW(fa::meta_layout(&meta, fa::Layout::BHSD, "m"), fa::InputError);
  const fa::BinShapes shapes("d", &meta, layout);
  EXPECT_EQ(shapes.spec("K").second, (std::vector<int64_t>{2, 5, 2, 8}));
  EXPECT_EQ(shapes.spec("mask").second, (std::vector<int64_t>{2, 4, 5, 5}));
  EXPECT_EQ(shapes.spec("seqlens_k").first, fa::DType::I32);
}

}  // namespace
