// .npy and raw .bin readers/writers. Every error is an InputError whose message starts with the file
// path and names the problem in one line, e.g.
//   data/x/Q.npy: truncated data (header says [2, 8, 512, 64] float32 = 2097152 bytes, file has 1048576)
// Writers are atomic: they write `path.tmp.<pid>` next to the target and rename it into place.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "array.h"

namespace flashattn {

struct NpyHeader {
  int version_major = 1;        // 1, 2 or 3
  DType dtype = DType::F32;
  std::vector<int64_t> shape;   // () is a scalar: one element
  size_t data_offset = 0;       // bytes before the array data
};

// Parses the header at the start of `bytes` (the file's first `size` bytes, or all of them).
// Accepts versions 1.0, 2.0 and 3.0; descr '<f2' '<f4' '<f8' '<i4' '<i8' ('|' or '=' byte order
// where unambiguous on little-endian) and '<V2'/'|V2' as bfloat16 (what numpy + ml_dtypes write).
// Refuses: wrong magic, unknown version, truncated header, malformed dict, big-endian, fortran
// order, object/structured/unsupported descr, negative or absurd shapes (numel or byte size
// overflowing int64). `origin` names the file in messages.
NpyHeader parse_npy_header(const uint8_t* bytes, size_t size, const std::string& origin);

// Reads a whole .npy file; checks that the data size matches the header exactly.
HostArray read_npy(const std::string& path);
// The same parse from a whole file's bytes in memory (`origin` names it in messages); read_npy
// applies the same checks while reading the data straight from the file.
HostArray parse_npy(const uint8_t* bytes, size_t size, const std::string& origin);
// Writes version 1.0 (2.0 if the header needs it); bfloat16 is written as '<V2' so that
// np.load(p).view(ml_dtypes.bfloat16) gives it back.
void write_npy(const std::string& path, const HostArray& a);

// Raw little-endian data with shape and dtype supplied by the caller; the file size must equal
// numel * itemsize exactly.
HostArray read_raw(const std::string& path, DType dtype, const std::vector<int64_t>& shape);
// The same checks on a whole file's bytes in memory.
HostArray parse_raw(const uint8_t* bytes, size_t size, DType dtype, const std::vector<int64_t>& shape,
                    const std::string& origin);
void write_raw(const std::string& path, const HostArray& a);

// Atomic whole-file write (temp file in the same directory + rename). Throws RuntimeError naming
// the path on any failure (unwritable directory, disk full, short write) and removes the temp file.
void write_file_atomic(const std::string& path, const void* data, size_t size);
// Reads a whole file; InputError naming the path if it is missing or unreadable.
std::vector<uint8_t> read_file(const std::string& path);

}  // namespace flashattn
