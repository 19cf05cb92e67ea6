// Loading a data directory (see data/README.md) and writing an output directory.
//
// Inputs: Q, K, V (required), dO, seqlens_k, mask (optional), each as NAME.npy or NAME.bin.
// Shapes and dtypes of .bin files come from meta.json in the directory or, failing that, from a
// directory name B{b}_H{h}_S{s}_D{d} (float32, H_kv = H, S_q = S_k = S, bhsd).
// Every error is an InputError naming the file and the problem in one line.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "array.h"
#include "flashattn/params.h"
#include "problem.h"

namespace flashattn {

enum class FileFormat { Npy, Bin };
const char* format_name(FileFormat f);  // "npy", "bin"

struct Dataset {
  std::string dir;
  FileFormat format = FileFormat::Npy;
  std::string source;          // how shapes were found: "npy", "bin+meta.json", "bin+dirname"
  Layout layout = Layout::BHSD;
  Dims dims;
  DType dtype = DType::F32;    // element type of Q, K and V as stored
  HostArray q, k, v;           // as stored (layout above)
  std::optional<HostArray> dout;       // same shape and dtype as q
  std::optional<HostArray> seqlens_k;  // int32 [B], values in [0, S_k]
  std::optional<HostArray> mask;       // float32, rank 1..4, broadcastable to [B, H, S_q, S_k]
  std::vector<std::string> input_paths;  // every file read, for "never overwrite inputs"
  std::vector<std::string> notices;      // one-line notices (conversions) for the console
};

struct LoadOptions {
  std::optional<Layout> layout;  // from --layout; must agree with meta.json when both are given
};

Dataset load_dataset(const std::string& dir, const LoadOptions& opt);

// Broadcast strides of `mask` (shape right-aligned against [B, H, S_q, S_k]; each dimension 1 or
// equal) with `ptr` as base; InputError naming `origin` if it does not broadcast.
MaskView mask_view(const std::vector<int64_t>& mask_shape, const Dims& dims, const float* ptr,
                   const std::string& origin);

// Writes outputs NAME.npy or NAME.bin (+ meta.json describing them for bin) as one set: each file
// is written completely under a temporary name in the directory, and finish() renames them all
// into place. A writer destroyed before finish() (an error, a full disk) removes what it staged
// and the directories it created, so a failed run leaves no partial or new output behind.
// Creates the directory (and parents). Refuses (InputError) to write over any path in `protect`.
class OutputWriter {
 public:
  OutputWriter(std::string dir, FileFormat format, Layout layout, std::vector<std::string> protect);
  ~OutputWriter();
  OutputWriter(const OutputWriter&) = delete;
  OutputWriter& operator=(const OutputWriter&) = delete;
  void add(const std::string& name, const HostArray& a);
  // Any other file of the set (e.g. timing.json), by its full name.
  void add_file(const std::string& file_name, const std::string& bytes);
  // For bin: writes meta.json listing every file added (dtype, shape) and the layout. Then renames
  // every staged file into place. RuntimeError naming the file on failure.
  void finish();
  const std::string& dir() const { return dir_; }

  // Checks, creating nothing, that `dir` is a writable directory or can be created as one, and
  // that no output file name in it is taken by a directory: InputError "DIR: cannot write outputs
  // here (...)" otherwise. Run before any kernel, so a bad output directory is reported before
  // minutes of work.
  static void check_writable(const std::string& dir);

 private:
  void ensure_dir();
  // Registers `path` for finish() and returns the temporary path to write it to.
  std::string stage(const std::string& path);

  std::string dir_;
  FileFormat format_;
  Layout layout_;
  std::vector<std::string> protect_;
  std::vector<std::pair<std::string, HostArray>> written_meta_;  // name -> (dtype, shape only)
  std::vector<std::pair<std::string, std::string>> staged_;     // (temporary path, final path)
  std::vector<std::string> created_dirs_;                        // deepest first
};

}  // namespace flashattn
