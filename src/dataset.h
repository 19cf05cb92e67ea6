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

// Writes outputs NAME.npy or NAME.bin (+ meta.json describing them for bin), each atomically.
// Creates the directory (and parents). Refuses (InputError) to write over any path in `protect`.
class OutputWriter {
 public:
  OutputWriter(std::string dir, FileFormat format, Layout layout, std::vector<std::string> protect);
  void add(const std::string& name, const HostArray& a);
  // For bin: writes meta.json listing every file added (dtype, shape) and the layout.
  void finish();
  const std::string& dir() const { return dir_; }

 private:
  std::string dir_;
  FileFormat format_;
  Layout layout_;
  std::vector<std::string> protect_;
  std::vector<std::pair<std::string, HostArray>> written_meta_;  // name -> (dtype, shape only)
};

}  // namespace flashattn
