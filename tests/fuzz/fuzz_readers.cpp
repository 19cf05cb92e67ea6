// libFuzzer entry point over everything that parses bytes from a data directory: the .npy header
// and whole-file parser, the .bin size checks, meta.json and the B{b}_H{h}_S{s}_D{d} directory
// name. Every input is offered to every reader (a seed .npy file also exercises the JSON parser,
// and the other way round). The property under test: bad bytes end in an InputError, never in a
// crash, a leak, another exception, an allocation the input does not pay for, or a hang.
//
//   scripts/fuzz.sh 60          # build with clang and run for 60 s on a copy of tests/fuzz/corpus
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "dataset.h"
#include "flashattn/error.h"
#include "meta.h"
#include "nonfinite.h"
#include "npy.h"

namespace fa = flashattn;

namespace {

const char* const kNames[] = {"Q", "K", "V", "dO", "seqlens_k", "mask"};

// Reads that succeed go through what the loader does next with an array, so the fuzzer also
// reaches those paths with hostile shapes.
void use_array(const fa::HostArray& a) {
  (void)fa::scan_nonfinite(a);
  if (a.numel() > 0) (void)fa::index_str(a.shape, a.numel() - 1);
  const fa::Dims dims{2, 4, 2, 5, 7, 3};
  try {
    (void)fa::mask_view(a.shape, dims, nullptr, "mask.npy");
  } catch (const fa::InputError&) {
  }
}

void npy(const uint8_t* data, size_t size) {
  try {
    (void)fa::parse_npy_header(data, size, "Q.npy");
  } catch (const fa::InputError&) {
  }
  try {
    use_array(fa::parse_npy(data, size, "Q.npy"));
  } catch (const fa::InputError&) {
  }
}

// The input as a whole .bin file, against every shape the directory description gives.
void bin_files(const fa::BinShapes& shapes, const uint8_t* data, size_t size) {
  for (const char* name : kNames) {
    try {
      const auto spec = shapes.spec(name);
      use_array(fa::parse_raw(data, size, spec.first, spec.second, std::string(name) + ".bin"));
    } catch (const fa::InputError&) {
    }
  }
}

void meta_json(const uint8_t* data, size_t size) {
  try {
    const nlohmann::json meta = fa::parse_meta_json(data, size, "meta.json");
    for (const auto requested : {std::optional<fa::Layout>(), std::optional<fa::Layout>(fa::Layout::BSHD)}) {
      try {
        const fa::Layout layout = fa::meta_layout(&meta, requested, "meta.json");
        bin_files(fa::BinShapes("data", &meta, layout), data, size);
      } catch (const fa::InputError&) {
      }
    }
  } catch (const fa::InputError&) {
  }
}

// The first line of the input as a directory name.
void dirname(const uint8_t* data, size_t size) {
  std::string name;
  for (size_t i = 0; i < size && i < 64 && data[i] != '\n' && data[i] != '\0'; ++i) name.push_back(static_cast<char>(data[i]));
  int64_t dims[4];
  (void)fa::BinShapes::parse_dims_name(name, dims);
  try {
    bin_files(fa::BinShapes("data/" + name, nullptr, fa::Layout::BHSD), data, size);
  } catch (const fa::InputError&) {
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  npy(data, size);
  meta_json(data, size);
  dirname(data, size);
  return 0;
}
