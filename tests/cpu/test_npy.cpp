// .npy reading and writing, atomic writes, and the bit-exact fp16/bf16 conversions.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "array.h"
#include "flashattn/error.h"
#include "npy.h"

namespace fa = flashattn;
namespace fs = std::filesystem;

namespace {

// A fresh, empty directory per test.
std::string scratch_dir() {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  const fs::path dir = fs::path(::testing::TempDir()) / ("flashattn_npy_" + std::string(info->test_suite_name()) +
                                                         "_" + info->name() + "_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir.string();
}

void write_bytes(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream f(path, std::ios::binary);
  f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

// A .npy file written by hand: any version, any header text, any payload.
std::vector<uint8_t> npy_bytes(int major, const std::string& dict, size_t data_bytes, int minor = 0) {
  std::vector<uint8_t> out = {0x93, 'N', 'U', 'M', 'P', 'Y', static_cast<uint8_t>(major), static_cast<uint8_t>(minor)};
  const std::string header = dict + "\n";
  const size_t len = header.size();
  out.push_back(static_cast<uint8_t>(len & 0xff));
  out.push_back(static_cast<uint8_t>(len >> 8));
  if (major >= 2) {
    out.push_back(static_cast<uint8_t>(len >> 16));
    out.push_back(static_cast<uint8_t>(len >> 24));
  }
  out.insert(out.end(), header.begin(), header.end());
  for (size_t i = 0; i < data_bytes; ++i) out.push_back(static_cast<uint8_t>(i * 7 + 1));
  return out;
}

std::string dict_for(const std::string& descr, const std::string& shape, const std::string& fortran = "False") {
  return "{'descr': '" + descr + "', 'fortran_order': " + fortran + ", 'shape': " + shape + ", }";
}

// Expects read_npy(path) to fail with a one-line InputError that starts with the path and contains `needle`.
void expect_read_error(const std::string& path, const std::string& needle) {
  try {
    (void)fa::read_npy(path);
    ADD_FAILURE() << path << ": expected an error containing '" << needle << "'";
  } catch (const fa::InputError& e) {
    const std::string msg = e.what();
    EXPECT_EQ(msg.rfind(path, 0), 0u) << msg;
    EXPECT_NE(msg.find(needle), std::string::npos) << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  }
}

fa::HostArray sample(fa::DType t, std::vector<int64_t> shape) {
  fa::HostArray a(t, std::move(shape));
  for (size_t i = 0; i < a.bytes.size(); ++i) a.bytes[i] = static_cast<uint8_t>(i * 37 + 11);
  return a;
}

float f(uint32_t bits) {
  float x;
  std::memcpy(&x, &bits, 4);
  return x;
}

}  // namespace

// ---- round trips ---------------------------------------------------------------------------

TEST(NpyRoundTrip, EveryDtypeAndShapeReadsBackIdentically) {
  const std::string dir = scratch_dir();
  const fa::DType dtypes[] = {fa::DType::F16, fa::DType::F32, fa::DType::F64, fa::DType::BF16, fa::DType::I32,
                              fa::DType::I64};
  const std::vector<std::vector<int64_t>> shapes = {{}, {1}, {5}, {2, 3, 4}, {1, 2, 1, 3}, {0, 3}};
  for (fa::DType t : dtypes) {
    for (const auto& shape : shapes) {
      const std::string path = dir + "/a.npy";
      const fa::HostArray a = sample(t, shape);
      fa::write_npy(path, a);
      const fa::HostArray b = fa::read_npy(path);
      EXPECT_EQ(b.dtype, t);
      EXPECT_EQ(b.shape, shape);
      EXPECT_EQ(b.bytes, a.bytes);
    }
  }
}

TEST(NpyWrite, HeaderIsVersion1AndDataIs64ByteAligned) {
  const std::string path = scratch_dir() + "/a.npy";
  fa::write_npy(path, sample(fa::DType::F32, {2, 3}));
  const std::vector<uint8_t> bytes = fa::read_file(path);
  const fa::NpyHeader h = fa::parse_npy_header(bytes.data(), bytes.size(), path);
  EXPECT_EQ(h.version_major, 1);
  EXPECT_EQ(h.data_offset % 64, 0u);
  EXPECT_EQ(bytes[h.data_offset - 1], '\n');
}

TEST(NpyWrite, Bf16IsWrittenAsV2AndOneDimShapeHasTrailingComma) {
  const std::string path = scratch_dir() + "/a.npy";
  fa::write_npy(path, sample(fa::DType::BF16, {7}));
  const std::vector<uint8_t> bytes = fa::read_file(path);
  const std::string text(bytes.begin(), bytes.end());
  EXPECT_NE(text.find("'descr': '<V2'"), std::string::npos);
  EXPECT_NE(text.find("'shape': (7,)"), std::string::npos);
}

TEST(NpyRead, Version2And3HeadersRoundTripEveryDtype) {
  const std::string dir = scratch_dir();
  const std::pair<std::string, fa::DType> descrs[] = {{"<f2", fa::DType::F16}, {"<f4", fa::DType::F32},
                                                      {"<f8", fa::DType::F64}, {"<V2", fa::DType::BF16},
                                                      {"<i4", fa::DType::I32}};
  const std::pair<std::string, std::vector<int64_t>> shapes[] = {{"()", {}}, {"(3,)", {3}}, {"(2, 3)", {2, 3}}};
  for (int major : {2, 3}) {
    for (const auto& d : descrs) {
      for (const auto& sh : shapes) {
        const std::string path = dir + "/a.npy";
        const size_t nbytes = static_cast<size_t>(fa::shape_numel(sh.second)) * fa::dtype_size(d.second);
        const std::vector<uint8_t> bytes = npy_bytes(major, dict_for(d.first, sh.first), nbytes);
        write_bytes(path, bytes);
        const fa::HostArray a = fa::read_npy(path);
        EXPECT_EQ(a.dtype, d.second) << major << d.first;
        EXPECT_EQ(a.shape, sh.second) << major << sh.first;
        EXPECT_TRUE(std::equal(a.bytes.begin(), a.bytes.end(), bytes.end() - static_cast<std::ptrdiff_t>(nbytes)));
        // Written back, the same array reads back identically (as version 1.0).
        fa::write_npy(path, a);
        EXPECT_EQ(fa::read_npy(path).bytes, a.bytes);
      }
    }
  }
}

TEST(NpyRead, Version3HeaderMayCarryUtf8) {
  // Version 3 headers are UTF-8; non-ASCII text can only sit inside strings, so a non-ASCII descr
  // must be refused cleanly rather than misread.
  const std::string path = scratch_dir() + "/a.npy";
  write_bytes(path, npy_bytes(3, dict_for("<f\xc3\xa9", "(2,)"), 8));
  expect_read_error(path, "unsupported dtype");
}

TEST(NpyRead, AcceptedDescrSpellings) {
  const std::string dir = scratch_dir();
  const std::pair<std::string, fa::DType> cases[] = {
      {"<f2", fa::DType::F16}, {"<f4", fa::DType::F32}, {"<f8", fa::DType::F64}, {"<i4", fa::DType::I32},
      {"<i8", fa::DType::I64}, {"<V2", fa::DType::BF16}, {"|V2", fa::DType::BF16}, {"=f4", fa::DType::F32},
      {"|f8", fa::DType::F64}, {"f4", fa::DType::F32}};
  for (const auto& c : cases) {
    const std::string path = dir + "/a.npy";
    write_bytes(path, npy_bytes(1, dict_for(c.first, "(3,)"), 3 * fa::dtype_size(c.second)));
    EXPECT_EQ(fa::read_npy(path).dtype, c.second) << c.first;
  }
}

TEST(NpyRead, ScalarAndOneElementTupleShapes) {
  const std::string dir = scratch_dir();
  const std::pair<std::string, std::vector<int64_t>> cases[] = {
      {"()", {}}, {"(4,)", {4}}, {"(4)", {4}}, {"(2, 3,)", {2, 3}}, {"( 2 ,3 )", {2, 3}}, {"(2L, 3L)", {2, 3}}};
  for (const auto& c : cases) {
    const std::string path = dir + "/a.npy";
    write_bytes(path, npy_bytes(1, dict_for("<f4", c.first), 4 * static_cast<size_t>(fa::shape_numel(c.second))));
    EXPECT_EQ(fa::read_npy(path).shape, c.second) << c.first;
  }
}

TEST(NpyRead, KeyOrderQuotesAndMissingNewlineDoNotMatter) {
  const std::string path = scratch_dir() + "/a.npy";
  std::vector<uint8_t> bytes = npy_bytes(1, "{\"shape\": (2,), \"fortran_order\": False, \"descr\": \"<f4\"}", 8);
  write_bytes(path, bytes);
  EXPECT_EQ(fa::read_npy(path).shape, (std::vector<int64_t>{2}));
}

// ---- refusals ------------------------------------------------------------------------------

TEST(NpyRead, RefusesWrongMagic) {
  const std::string path = scratch_dir() + "/a.npy";
  std::vector<uint8_t> bytes = npy_bytes(1, dict_for("<f4", "(2,)"), 8);
  bytes[1] = 'X';
  write_bytes(path, bytes);
  expect_read_error(path, "bad magic");
}

TEST(NpyRead, RefusesUnknownVersions) {
  const std::string dir = scratch_dir();
  write_bytes(dir + "/a.npy", npy_bytes(4, dict_for("<f4", "(2,)"), 8));
  expect_read_error(dir + "/a.npy", "unsupported .npy version 4.0");
  write_bytes(dir + "/b.npy", npy_bytes(1, dict_for("<f4", "(2,)"), 8, /*minor=*/1));
  expect_read_error(dir + "/b.npy", "unsupported .npy version 1.1");
}

TEST(NpyRead, RefusesTruncatedHeader) {
  const std::string dir = scratch_dir();
  std::vector<uint8_t> bytes = npy_bytes(1, dict_for("<f4", "(2,)"), 0);
  bytes.resize(bytes.size() - 5);
  write_bytes(dir + "/a.npy", bytes);
  expect_read_error(dir + "/a.npy", "truncated .npy header");
  write_bytes(dir + "/b.npy", {0x93, 'N', 'U', 'M', 'P', 'Y', 1});
  expect_read_error(dir + "/b.npy", "truncated .npy header");
  write_bytes(dir + "/c.npy", {});
  expect_read_error(dir + "/c.npy", "truncated .npy header");
  // Version 2 needs a 4-byte length field.
  write_bytes(dir + "/d.npy", {0x93, 'N', 'U', 'M', 'P', 'Y', 2, 0, 0x10, 0});
  expect_read_error(dir + "/d.npy", "truncated .npy header");
}

TEST(NpyRead, RefusesTruncatedData) {
  const std::string path = scratch_dir() + "/a.npy";
  write_bytes(path, npy_bytes(1, dict_for("<f4", "(2, 8)"), 60));
  expect_read_error(path, "truncated data (header says [2, 8] fp32 = 64 bytes, file has 60)");
}

TEST(NpyRead, RefusesTrailingData) {
  const std::string path = scratch_dir() + "/a.npy";
  write_bytes(path, npy_bytes(1, dict_for("<f4", "(2,)"), 9));
  expect_read_error(path, "1 trailing bytes after the data");
}

TEST(NpyRead, RefusesCorruptDicts) {
  const std::string dir = scratch_dir();
  const std::pair<std::string, std::string> cases[] = {
      {"{'descr': '<f4', 'fortran_order': False}", "needs 'descr', 'fortran_order' and 'shape'"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (2,), 'extra': 1}", "unexpected key 'extra'"},
      {"{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (2,)}", "duplicate key 'descr'"},
      {"{'descr': '<f4, 'fortran_order': False, 'shape': (2,)}", "malformed .npy header"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (2,)", "malformed .npy header"},
      {"['descr', '<f4']", "header is not a dict"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (2,)} junk", "unexpected text after the header dict"},
      {"{'descr': '<f4', 'fortran_order': 0, 'shape': (2,)}", "'fortran_order' is not a bool"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': [2]}", "'shape' is not a tuple"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': ('2',)}", "shape entry is not an integer"},
      {"{'descr': 4, 'fortran_order': False, 'shape': (2,)}", "'descr' is not a string"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': ((((((((((2,),),),),),),),),),)}", "nested too deeply"},
      {"", "malformed .npy header"},
  };
  for (const auto& c : cases) {
    write_bytes(dir + "/a.npy", npy_bytes(1, c.first, 8));
    expect_read_error(dir + "/a.npy", c.second);
  }
}

TEST(NpyRead, RefusesBigEndianWithTheDocumentedMessage) {
  const std::string path = scratch_dir() + "/Q.npy";
  write_bytes(path, npy_bytes(1, dict_for(">f4", "(2,)"), 8));
  try {
    (void)fa::read_npy(path);
    FAIL() << "big-endian accepted";
  } catch (const fa::InputError& e) {
    EXPECT_EQ(std::string(e.what()),
              path + ": unsupported dtype '>f4' (big-endian); supported: <f2 <f4 <f8 <i4 <i8 <V2 (bfloat16)");
  }
}

TEST(NpyRead, RefusesFortranOrder) {
  const std::string path = scratch_dir() + "/a.npy";
  write_bytes(path, npy_bytes(1, dict_for("<f4", "(2, 2)", "True"), 16));
  expect_read_error(path, "fortran_order=True is not supported");
}

TEST(NpyRead, RefusesObjectStructuredAndOtherDescrs) {
  const std::string dir = scratch_dir();
  write_bytes(dir + "/o.npy", npy_bytes(1, dict_for("|O", "(2,)"), 16));
  expect_read_error(dir + "/o.npy", "unsupported dtype '|O' (object arrays)");
  write_bytes(dir + "/s.npy", npy_bytes(1, "{'descr': [('a', '<f4'), ('b', '<i4')], 'fortran_order': False, 'shape': (2,)}", 16));
  expect_read_error(dir + "/s.npy", "structured dtypes are not supported");
  for (const std::string descr : {"<i2", "<u4", "<c8", "|b1", "<f16", "<V4", "<U3"}) {
    write_bytes(dir + "/x.npy", npy_bytes(1, dict_for(descr, "(2,)"), 8));
    expect_read_error(dir + "/x.npy", "unsupported dtype '" + descr + "'");
  }
}

TEST(NpyRead, RefusesNegativeAndOverflowingShapes) {
  const std::string dir = scratch_dir();
  write_bytes(dir + "/a.npy", npy_bytes(1, dict_for("<f4", "(2, -3)"), 8));
  expect_read_error(dir + "/a.npy", "negative dimension -3");
  // numel fits in int64 but numel * itemsize does not.
  write_bytes(dir + "/b.npy", npy_bytes(1, dict_for("<f8", "(4294967296, 4294967296)"), 8));
  expect_read_error(dir + "/b.npy", "absurd shape");
  write_bytes(dir + "/c.npy", npy_bytes(1, dict_for("<f4", "(99999999999999999999,)"), 8));
  expect_read_error(dir + "/c.npy", "absurd shape");
  write_bytes(dir + "/d.npy", npy_bytes(1, dict_for("<f4", "(1152921504606846976, 0)"), 0));
  EXPECT_EQ(fa::read_npy(dir + "/d.npy").numel(), 0);  // zero elements: no overflow
}

TEST(NpyRead, RefusesLyingHeaderLengthWithoutAllocating) {
  const std::string path = scratch_dir() + "/a.npy";
  std::vector<uint8_t> bytes = npy_bytes(2, dict_for("<f4", "(2,)"), 8);
  bytes[8] = bytes[9] = bytes[10] = bytes[11] = 0xff;  // 4 GiB header
  write_bytes(path, bytes);
  expect_read_error(path, "truncated .npy header");
}

TEST(NpyRead, DirectoryAndMissingFilesAreInputErrors) {
  const std::string dir = scratch_dir();
  fs::create_directories(dir + "/d.npy");
  expect_read_error(dir + "/d.npy", "is a directory");
  expect_read_error(dir + "/missing.npy", "cannot read");
}

// Arbitrary bytes must give a parse or an InputError, never anything else (run under sanitizers).
TEST(NpyHeaderFuzz, MutatedAndRandomHeadersFailCleanly) {
  std::mt19937_64 rng(1234);
  const std::vector<uint8_t> valid = npy_bytes(1, dict_for("<f4", "(2, 3)"), 0);
  const std::string alphabet = "{}()[],:' \"-0123456789TrueFalsedescrshapefortran_order<>|=fiV2L\n";
  for (int iter = 0; iter < 20000; ++iter) {
    std::vector<uint8_t> bytes = valid;
    const int edits = 1 + static_cast<int>(rng() % 6);
    for (int e = 0; e < edits; ++e) {
      const size_t pos = rng() % bytes.size();
      switch (rng() % 4) {
        case 0: bytes[pos] = static_cast<uint8_t>(rng()); break;
        case 1: bytes[pos] = static_cast<uint8_t>(alphabet[rng() % alphabet.size()]); break;
        case 2: bytes.erase(bytes.begin() + static_cast<std::ptrdiff_t>(pos)); break;
        default: bytes.insert(bytes.begin() + static_cast<std::ptrdiff_t>(pos), static_cast<uint8_t>(alphabet[rng() % alphabet.size()]));
      }
      if (bytes.empty()) bytes.push_back(0x93);
    }
    if (iter % 4 == 0) bytes.resize(rng() % (bytes.size() + 1));
    try {
      const fa::NpyHeader h = fa::parse_npy_header(bytes.data(), bytes.size(), "fuzz");
      EXPECT_LE(h.data_offset, bytes.size());
    } catch (const fa::InputError&) {
    }
  }
}

// ---- raw files and atomic writes ----------------------------------------------------------

TEST(RawFile, RoundTripAndSizeMismatch) {
  const std::string dir = scratch_dir();
  const fa::HostArray a = sample(fa::DType::F16, {3, 4});
  fa::write_raw(dir + "/a.bin", a);
  EXPECT_EQ(fa::read_raw(dir + "/a.bin", fa::DType::F16, {3, 4}).bytes, a.bytes);
  try {
    (void)fa::read_raw(dir + "/a.bin", fa::DType::F32, {3, 4});
    FAIL();
  } catch (const fa::InputError& e) {
    EXPECT_EQ(std::string(e.what()), dir + "/a.bin: file has 24 bytes, expected [3, 4] fp32 = 48 bytes");
  }
}

TEST(AtomicWrite, ReplacesTheFileAndLeavesNoTempFile) {
  const std::string dir = scratch_dir();
  const std::string path = dir + "/x.bin";
  write_bytes(path, std::vector<uint8_t>(100, 1));
  const char text[] = "new";
  fa::write_file_atomic(path, text, 3);
  EXPECT_EQ(fa::read_file(path), (std::vector<uint8_t>{'n', 'e', 'w'}));
  EXPECT_EQ(std::distance(fs::directory_iterator(dir), fs::directory_iterator{}), 1);
}

TEST(AtomicWrite, MissingDirectoryIsRuntimeErrorNamingThePath) {
  const std::string path = scratch_dir() + "/no/such/dir/x.bin";
  try {
    fa::write_file_atomic(path, "x", 1);
    FAIL();
  } catch (const fa::RuntimeError& e) {
    EXPECT_EQ(std::string(e.what()).rfind(path + ": cannot write", 0), 0u) << e.what();
  }
}

TEST(AtomicWrite, FailedRenameRemovesTheTempFile) {
  const std::string dir = scratch_dir();
  fs::create_directories(dir + "/target");  // rename onto a non-empty directory fails
  write_bytes(dir + "/target/keep", {1});
  EXPECT_THROW(fa::write_file_atomic(dir + "/target", "x", 1), fa::RuntimeError);
  EXPECT_EQ(std::distance(fs::directory_iterator(dir), fs::directory_iterator{}), 1);
}

TEST(AtomicWrite, ShortWriteKeepsTheOldFileAndRemovesTheTempFile) {
  const std::string dir = scratch_dir();
  const std::string path = dir + "/x.bin";
  write_bytes(path, {7, 7, 7});
  // A file size limit makes write() fail part-way, as a full disk would.
  struct rlimit old_limit;
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &old_limit), 0);
  const auto old_handler = ::signal(SIGXFSZ, SIG_IGN);
  struct rlimit small = old_limit;
  small.rlim_cur = 4096;
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &small), 0);
  const std::vector<uint8_t> big(1 << 16, 0);
  bool threw = false;
  std::string msg;
  try {
    fa::write_file_atomic(path, big.data(), big.size());
  } catch (const fa::RuntimeError& e) {
    threw = true;
    msg = e.what();
  }
  ::setrlimit(RLIMIT_FSIZE, &old_limit);
  ::signal(SIGXFSZ, old_handler);
  EXPECT_TRUE(threw);
  EXPECT_EQ(msg.rfind(path + ": write failed", 0), 0u) << msg;
  EXPECT_EQ(fa::read_file(path), (std::vector<uint8_t>{7, 7, 7}));
  EXPECT_EQ(std::distance(fs::directory_iterator(dir), fs::directory_iterator{}), 1);
}

// ---- fp16 ----------------------------------------------------------------------------------

TEST(HalfConversion, ExactValues) {
  EXPECT_EQ(fa::float_to_half_bits(1.0f), 0x3c00);
  EXPECT_EQ(fa::float_to_half_bits(-2.0f), 0xc000);
  EXPECT_EQ(fa::float_to_half_bits(0.0f), 0x0000);
  EXPECT_EQ(fa::float_to_half_bits(-0.0f), 0x8000);
  EXPECT_EQ(fa::float_to_half_bits(65504.0f), 0x7bff);
  EXPECT_EQ(fa::float_to_half_bits(std::ldexp(1.0f, -14)), 0x0400);  // smallest normal
}

TEST(HalfConversion, RoundsToNearestEven) {
  EXPECT_EQ(fa::float_to_half_bits(1.0f + std::ldexp(1.0f, -11)), 0x3c00);      // tie, down to even
  EXPECT_EQ(fa::float_to_half_bits(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3c02);  // tie, up to even
  EXPECT_EQ(fa::float_to_half_bits(1.0f + std::ldexp(1.0f, -11) + std::ldexp(1.0f, -20)), 0x3c01);  // above tie
  EXPECT_EQ(fa::float_to_half_bits(2047.0f / 2048.0f * 2.0f), 0x3c00 + 0x3ff);
  EXPECT_EQ(fa::float_to_half_bits(std::nextafter(2.0f, 0.0f)), 0x4000);  // carry into the exponent
}

TEST(HalfConversion, OverflowGoesToInfinity) {
  EXPECT_EQ(fa::float_to_half_bits(65519.0f), 0x7bff);
  EXPECT_EQ(fa::float_to_half_bits(65520.0f), 0x7c00);  // tie between max and "2^16": even is inf
  EXPECT_EQ(fa::float_to_half_bits(1e6f), 0x7c00);
  EXPECT_EQ(fa::float_to_half_bits(-FLT_MAX), 0xfc00);
  EXPECT_EQ(fa::float_to_half_bits(std::numeric_limits<float>::infinity()), 0x7c00);
  EXPECT_EQ(fa::float_to_half_bits(-std::numeric_limits<float>::infinity()), 0xfc00);
}

TEST(HalfConversion, NaNStaysNaN) {
  for (uint32_t bits : {0x7fc00000u, 0x7f800001u, 0xffc00001u, 0x7f802000u}) {
    const uint16_t h = fa::float_to_half_bits(f(bits));
    EXPECT_EQ(h & 0x7c00, 0x7c00);
    EXPECT_NE(h & 0x3ff, 0) << std::hex << bits;
    EXPECT_EQ(h >> 15, bits >> 31);
    EXPECT_TRUE(std::isnan(fa::half_bits_to_float(h)));
  }
}

TEST(HalfConversion, Subnormals) {
  const float tiny = std::ldexp(1.0f, -24);  // smallest half subnormal
  EXPECT_EQ(fa::float_to_half_bits(tiny), 0x0001);
  EXPECT_EQ(fa::float_to_half_bits(tiny / 2), 0x0000);                    // tie, down to even (zero)
  EXPECT_EQ(fa::float_to_half_bits(tiny / 2 * 1.0001f), 0x0001);          // just above the tie
  EXPECT_EQ(fa::float_to_half_bits(3 * tiny / 2), 0x0002);                // tie, up to even
  EXPECT_EQ(fa::float_to_half_bits(1023 * tiny), 0x03ff);                 // largest subnormal
  EXPECT_EQ(fa::float_to_half_bits(1023.5f * tiny), 0x0400);              // rounds up into the normals
  EXPECT_EQ(fa::float_to_half_bits(-5 * tiny), 0x8005);
  EXPECT_EQ(fa::float_to_half_bits(std::numeric_limits<float>::denorm_min()), 0x0000);
  EXPECT_EQ(fa::half_bits_to_float(0x0001), tiny);
  EXPECT_EQ(fa::half_bits_to_float(0x83ff), -1023 * tiny);
}

TEST(HalfConversion, EveryHalfSurvivesARoundTrip) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float x = fa::half_bits_to_float(static_cast<uint16_t>(h));
    if (std::isnan(x)) {
      EXPECT_TRUE(std::isnan(fa::half_bits_to_float(fa::float_to_half_bits(x))));
    } else {
      ASSERT_EQ(fa::float_to_half_bits(x), h) << std::hex << h;
    }
  }
}

// ---- bf16 ----------------------------------------------------------------------------------

TEST(Bf16Conversion, RoundsToNearestEven) {
  EXPECT_EQ(fa::float_to_bf16_bits(1.0f), 0x3f80);
  EXPECT_EQ(fa::float_to_bf16_bits(1.0f + std::ldexp(1.0f, -8)), 0x3f80);      // tie, down to even
  EXPECT_EQ(fa::float_to_bf16_bits(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3f82);  // tie, up to even
  EXPECT_EQ(fa::float_to_bf16_bits(1.0f + std::ldexp(1.0f, -8) + std::ldexp(1.0f, -20)), 0x3f81);
  EXPECT_EQ(fa::float_to_bf16_bits(-0.0f), 0x8000);
}

TEST(Bf16Conversion, OverflowInfAndNaN) {
  EXPECT_EQ(fa::float_to_bf16_bits(FLT_MAX), 0x7f80);
  EXPECT_EQ(fa::float_to_bf16_bits(f(0x7f7f7fffu)), 0x7f7f);
  EXPECT_EQ(fa::float_to_bf16_bits(f(0x7f7f8000u)), 0x7f80);  // tie, odd max rounds up to inf
  EXPECT_EQ(fa::float_to_bf16_bits(-std::numeric_limits<float>::infinity()), 0xff80);
  for (uint32_t bits : {0x7fc00000u, 0x7f800001u, 0xff800001u, 0x7fffffffu}) {
    const uint16_t b = fa::float_to_bf16_bits(f(bits));
    EXPECT_TRUE(std::isnan(fa::bf16_bits_to_float(b))) << std::hex << bits;  // never rounds into inf
  }
}

TEST(Bf16Conversion, SubnormalsAndRoundTrip) {
  EXPECT_EQ(fa::float_to_bf16_bits(f(0x00010000u)), 0x0001);
  EXPECT_EQ(fa::float_to_bf16_bits(f(0x00008000u)), 0x0000);  // tie, down to even
  EXPECT_EQ(fa::float_to_bf16_bits(f(0x00018000u)), 0x0002);  // tie, up to even
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float x = fa::bf16_bits_to_float(static_cast<uint16_t>(h));
    if (!std::isnan(x)) {
      ASSERT_EQ(fa::float_to_bf16_bits(x), h) << std::hex << h;
    }
  }
}

// ---- array conversions ---------------------------------------------------------------------

TEST(ArrayConvert, F64ToHalfAndBf16RoundOnce) {
  // Just above a half tie, but the excess is lost in float: rounding through float would round
  // twice and land on the even neighbour below.
  fa::HostArray a(fa::DType::F64, {2});
  a.data<double>()[0] = 1.0 + std::ldexp(1.0, -11) + std::ldexp(1.0, -40);
  a.data<double>()[1] = 1.0 + std::ldexp(1.0, -8) + std::ldexp(1.0, -40);
  EXPECT_EQ(fa::convert(a, fa::DType::F16).data<uint16_t>()[0], 0x3c01);
  EXPECT_EQ(fa::convert(a, fa::DType::BF16).data<uint16_t>()[1], 0x3f81);
  const std::vector<double> r = fa::rounded_to_f64(a, fa::DType::F16);
  EXPECT_EQ(r[0], 1.0 + std::ldexp(1.0, -10));
}

TEST(ArrayConvert, F64ToF32OverflowAndSpecials) {
  fa::HostArray a(fa::DType::F64, {5});
  double* p = a.data<double>();
  p[0] = 1e300;
  p[1] = -1e300;
  p[2] = static_cast<double>(FLT_MAX);
  p[3] = std::numeric_limits<double>::quiet_NaN();
  p[4] = 1e300;
  const fa::HostArray b = fa::convert(a, fa::DType::F32);
  EXPECT_EQ(b.data<float>()[0], std::numeric_limits<float>::infinity());
  EXPECT_EQ(b.data<float>()[1], -std::numeric_limits<float>::infinity());
  EXPECT_EQ(b.data<float>()[2], FLT_MAX);
  EXPECT_TRUE(std::isnan(b.data<float>()[3]));
  EXPECT_EQ(fa::count_nonfinite(b), 4);
  EXPECT_EQ(fa::convert(a, fa::DType::F16).data<uint16_t>()[4], 0x7c00);
  EXPECT_EQ(fa::convert(a, fa::DType::BF16).data<uint16_t>()[1], 0xff80);
}

TEST(ArrayConvert, IntegersReadAsDoubleAndAreNotConverted) {
  fa::HostArray a(fa::DType::I64, {2});
  a.data<int64_t>()[0] = -3;
  a.data<int64_t>()[1] = int64_t{1} << 40;
  EXPECT_EQ(fa::to_f64(a), (std::vector<double>{-3.0, std::ldexp(1.0, 40)}));
  EXPECT_EQ(fa::count_nonfinite(a), 0);
  EXPECT_THROW(fa::convert(a, fa::DType::F32), fa::Error);
}

TEST(ArrayShape, StringAndElementCount) {
  EXPECT_EQ(fa::shape_str({2, 8, 512, 64}), "[2, 8, 512, 64]");
  EXPECT_EQ(fa::shape_str({}), "[]");
  EXPECT_EQ(fa::shape_numel({}), 1);
  EXPECT_EQ(fa::shape_numel({2, 0, 3}), 0);
  EXPECT_EQ(fa::HostArray(fa::DType::BF16, {3, 5}).nbytes(), 30u);
}
