// The output directory is written as one set: nothing is visible before finish(), and a failure
// (an error, a full disk) leaves neither a partial file nor a new one, nor a directory it created.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <unistd.h>

#include <csignal>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>

#include "dataset.h"
#include "flashattn/error.h"
#include "npy.h"

namespace fa = flashattn;
namespace fs = std::filesystem;

namespace {

std::string scratch_dir() {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  const fs::path root = fs::path(::testing::TempDir()) /
                        ("flashattn_out_" + std::string(info->name()) + "_" + std::to_string(::getpid()));
  fs::remove_all(root);
  fs::create_directories(root);
  return root.string();
}

std::set<std::string> names_in(const std::string& dir) {
  std::set<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.insert(e.path().filename().string());
  return names;
}

fa::HostArray ones(std::vector<int64_t> shape) {
  fa::HostArray a(fa::DType::F32, std::move(shape));
  for (int64_t i = 0; i < a.numel(); ++i) a.data<float>()[i] = 1.0f;
  return a;
}

TEST(OutputSet, FilesAppearOnlyWhenTheSetIsFinished) {
  const std::string root = scratch_dir(), out = root + "/out";
  fa::OutputWriter w(out, fa::FileFormat::Npy, fa::Layout::BHSD, {});
  w.add("O", ones({1, 2, 3, 4}));
  w.add("lse", ones({1, 2, 3}));
  w.add_file("timing.json", "{}\n");
  for (const std::string& n : names_in(out)) EXPECT_NE(n.find(".tmp."), std::string::npos) << n;
  w.finish();
  EXPECT_EQ(names_in(out), (std::set<std::string>{"O.npy", "lse.npy", "timing.json"}));
  EXPECT_EQ(fa::read_npy(out + "/O.npy").shape, (std::vector<int64_t>{1, 2, 3, 4}));
  fs::remove_all(root);
}

TEST(OutputSet, BinSetsIncludeTheirMetaJson) {
  const std::string root = scratch_dir(), out = root + "/out";
  fa::OutputWriter w(out, fa::FileFormat::Bin, fa::Layout::BHSD, {});
  w.add("O", ones({1, 1, 2, 2}));
  EXPECT_FALSE(fs::exists(out + "/meta.json"));
  w.finish();
  EXPECT_EQ(names_in(out), (std::set<std::string>{"O.bin", "meta.json"}));
  fs::remove_all(root);
}

TEST(OutputSet, AnUnfinishedSetLeavesNothingAndRemovesTheDirectoriesItCreated) {
  const std::string root = scratch_dir();
  {
    fa::OutputWriter w(root + "/a/b/out", fa::FileFormat::Npy, fa::Layout::BHSD, {});
    w.add("O", ones({2, 2}));
    EXPECT_TRUE(fs::is_directory(root + "/a/b/out"));
  }
  EXPECT_TRUE(names_in(root).empty());
  fs::remove_all(root);
}

TEST(OutputSet, AnUnfinishedSetKeepsThePreviousOutputs) {
  const std::string root = scratch_dir();
  fa::write_npy(root + "/O.npy", ones({3}));
  std::ofstream(root + "/notes.txt") << "mine";
  {
    fa::OutputWriter w(root, fa::FileFormat::Npy, fa::Layout::BHSD, {});
    w.add("O", ones({5}));
  }
  EXPECT_EQ(fa::read_npy(root + "/O.npy").shape, (std::vector<int64_t>{3}));
  EXPECT_EQ(names_in(root), (std::set<std::string>{"O.npy", "notes.txt"}));
  fs::remove_all(root);
}

// One file of the set cannot land (a directory is where lse.npy would go): no file of the set
// moves, the previous O.npy stays, and nothing temporary is left.
TEST(OutputSet, ADirectoryInTheWayOfOneFileLeavesThePreviousSet) {
  const std::string root = scratch_dir();
  fa::write_npy(root + "/O.npy", ones({3}));
  fs::create_directory(root + "/lse.npy");
  {
    fa::OutputWriter w(root, fa::FileFormat::Npy, fa::Layout::BHSD, {});
    w.add("O", ones({5}));
    w.add("lse", ones({5}));
    try {
      w.finish();
      ADD_FAILURE() << "finish() replaced a directory";
    } catch (const fa::RuntimeError& e) {
      EXPECT_NE(std::string(e.what()).find("lse.npy"), std::string::npos) << e.what();
    }
  }
  EXPECT_EQ(fa::read_npy(root + "/O.npy").shape, (std::vector<int64_t>{3}));
  EXPECT_EQ(names_in(root), (std::set<std::string>{"O.npy", "lse.npy"}));
  fs::remove_all(root);
}

// Replacing a whole previous set leaves only the new files (the set-aside copies are gone).
TEST(OutputSet, ReplacingAPreviousSetLeavesOnlyTheNewFiles) {
  const std::string root = scratch_dir();
  fa::write_npy(root + "/O.npy", ones({3}));
  fa::write_npy(root + "/lse.npy", ones({3}));
  {
    fa::OutputWriter w(root, fa::FileFormat::Npy, fa::Layout::BHSD, {});
    w.add("O", ones({5}));
    w.add("lse", ones({5}));
    w.finish();
  }
  EXPECT_EQ(fa::read_npy(root + "/O.npy").shape, (std::vector<int64_t>{5}));
  EXPECT_EQ(fa::read_npy(root + "/lse.npy").shape, (std::vector<int64_t>{5}));
  EXPECT_EQ(names_in(root), (std::set<std::string>{"O.npy", "lse.npy"}));
  fs::remove_all(root);
}

// A full disk, simulated with a file-size limit: write() fails with EFBIG once the limit is hit.
TEST(OutputSet, AFailedWriteNamesTheOutputFileAndLeavesNothing) {
  const std::string root = scratch_dir(), out = root + "/out";
  rlimit old{};
  ASSERT_EQ(getrlimit(RLIMIT_FSIZE, &old), 0);
  auto* old_handler = std::signal(SIGXFSZ, SIG_IGN);
  rlimit tiny = old;
  tiny.rlim_cur = 4096;
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &tiny), 0);
  std::string message;
  {
    fa::OutputWriter w(out, fa::FileFormat::Npy, fa::Layout::BHSD, {});
    w.add("lse", ones({16}));
    try {
      w.add("O", ones({64, 64}));
    } catch (const fa::RuntimeError& e) {
      message = e.what();
    }
  }
  setrlimit(RLIMIT_FSIZE, &old);
  std::signal(SIGXFSZ, old_handler);
  EXPECT_EQ(message.rfind(out + "/O.npy: write failed", 0), 0u) << message;
  EXPECT_NE(message.find("File too large"), std::string::npos) << message;
  EXPECT_FALSE(fs::exists(out));
  EXPECT_TRUE(names_in(root).empty());
  fs::remove_all(root);
}

TEST(OutputSet, CheckWritableAcceptsDirectoriesThatExistOrCanBeCreated) {
  const std::string root = scratch_dir();
  EXPECT_NO_THROW(fa::OutputWriter::check_writable(root));
  EXPECT_NO_THROW(fa::OutputWriter::check_writable(root + "/new/deeper/"));
  EXPECT_FALSE(fs::exists(root + "/new"));  // it creates nothing
  fs::remove_all(root);
}

TEST(OutputSet, CheckWritableRefusesAPathThroughARegularFile) {
  const std::string root = scratch_dir();
  std::ofstream(root + "/file") << "x";
  for (const std::string& dir : {root + "/file", root + "/file/sub/out"}) {
    try {
      fa::OutputWriter::check_writable(dir);
      FAIL() << dir;
    } catch (const fa::InputError& e) {
      EXPECT_EQ(std::string(e.what()), dir + ": cannot write outputs here (" + root + "/file is not a directory)");
    }
  }
  fs::remove_all(root);
}

TEST(OutputSet, CheckWritableRefusesAReadOnlyDirectory) {
  if (::geteuid() == 0) GTEST_SKIP() << "permissions do not apply to root";
  const std::string root = scratch_dir();
  fs::create_directory(root + "/ro");
  fs::permissions(root + "/ro", fs::perms::owner_read | fs::perms::owner_exec);
  EXPECT_THROW(fa::OutputWriter::check_writable(root + "/ro/out"), fa::InputError);
  fs::permissions(root + "/ro", fs::perms::owner_all);
  fs::remove_all(root);
}

}  // namespace
