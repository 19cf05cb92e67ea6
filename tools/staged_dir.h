// flashattn-gen's all-or-nothing output: every file of a dataset is written into a temporary
// directory beside the target (same file system), and only a complete dataset moves into place.
// A full disk, an allocation failure or a kill while writing leaves the target as it was (the
// temporary directory is removed by the destructor), never a half-written dataset that flashattn
// would load.
#pragma once

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <string>
#include <system_error>
#include <vector>

#include "flashattn/error.h"

namespace flashattn_gen {

class StagedDir {
 public:
  // Checks, creating nothing yet, that `out` is absent, an empty directory, or (with force) a
  // directory whose data files may be replaced; usage errors go through `refuse`.
  template <class Refuse>
  StagedDir(std::string out, bool force, Refuse refuse) : out_(std::move(out)) {
    namespace fs = std::filesystem;
    std::error_code ec;
    if (fs::exists(out_, ec)) {
      if (!fs::is_directory(out_, ec)) refuse(out_ + ": exists and is not a directory");
      if (!fs::is_empty(out_, ec) && !force) refuse(out_ + ": directory is not empty (--force replaces its data files)");
    }
    const fs::path abs = fs::absolute(fs::path(out_), ec).lexically_normal();
    const fs::path target = abs.has_filename() ? abs : abs.parent_path();
    fs::create_directories(target.parent_path(), ec);
    if (ec) throw flashattn::RuntimeError(target.parent_path().string() + ": cannot create directory (" + ec.message() + ")");
    tmp_ = (target.parent_path() / ("." + target.filename().string() + ".gen-tmp." + std::to_string(::getpid()))).string();
    fs::remove_all(tmp_, ec);
    fs::create_directory(tmp_, ec);
    if (ec) throw flashattn::RuntimeError(tmp_ + ": cannot create directory (" + ec.message() + ")");
  }
  ~StagedDir() {
    std::error_code ec;
    std::filesystem::remove_all(tmp_, ec);
  }
  StagedDir(const StagedDir&) = delete;
  StagedDir& operator=(const StagedDir&) = delete;

  // Where to write file `name` of the dataset now.
  std::string path(const std::string& name) {
    names_.push_back(name);
    return (std::filesystem::path(tmp_) / name).string();
  }

  // Moves the complete dataset into place: the temporary directory is renamed onto a missing
  // target (one atomic step); into an existing one each file is renamed (renames need no space),
  // then the data files this run did not write (`stale`) are removed, so the directory describes
  // exactly one problem.
  void commit(const std::vector<std::string>& stale) {
    namespace fs = std::filesystem;
    std::error_code ec;
    if (!fs::exists(out_, ec)) {
      fs::rename(tmp_, out_, ec);
      if (ec) throw flashattn::RuntimeError(out_ + ": cannot move the dataset into place (" + ec.message() + ")");
      return;
    }
    for (const std::string& n : names_) {
      fs::rename(fs::path(tmp_) / n, fs::path(out_) / n, ec);
      if (ec) throw flashattn::RuntimeError((fs::path(out_) / n).string() + ": cannot move into place (" + ec.message() + ")");
    }
    for (const std::string& f : stale)
      if (std::find(names_.begin(), names_.end(), f) == names_.end()) fs::remove(fs::path(out_) / f, ec);
  }

 private:
  std::string out_, tmp_;
  std::vector<std::string> names_;
};

}  // namespace flashattn_gen
