// What a run reads, and where it may write. Every input file is noted by its identity (device and
// inode, symlinks followed) when it is opened; every output path is checked against those
// identities, so no spelling of a path (a symlink, ./, .., a bind mount) lets an output replace an
// input. Outputs land by temp file + rename when they are regular files (or new), and in place
// when they are device nodes, FIFOs or sockets, or name an open descriptor (/dev/stdout,
// /dev/fd/N, /proc/...): /dev/null and /dev/stdout are written to, never replaced.
#pragma once

#include <cstddef>
#include <string>

namespace flashattn {

// Records `path` (an input just opened for reading) for is_input_file. Thread-safe.
void note_input_file(const std::string& path);
// True when `path` exists and is the same file as a noted input.
bool is_input_file(const std::string& path);
// Forgets every noted input (tests; a process runs one workload).
void clear_input_files();
// From now on write_file_atomic refuses to replace a noted input. The workloads (a run, a decode
// run, a sweep) switch it on before reading anything; library users and tests that rewrite their
// own inputs between loads leave it off.
void protect_input_files();
bool input_files_protected();

// True when an output at `path` must be written in place rather than replaced: an existing
// non-regular file (character or block device, FIFO, socket), or a name of an open descriptor.
bool written_in_place(const std::string& path);

// The open descriptor a path names (/dev/stdout 1, /dev/stderr 2, /dev/fd/N and /proc/self/fd/N
// N), or -1. Such outputs are written through the descriptor itself, so a shell redirect keeps
// its offset (what was printed before stays).
int descriptor_named(const std::string& path);

// InputError naming `what` (the option, e.g. "--json") unless `path` can take an output file:
// not a directory, not one of the noted inputs, and either written in place or in an existing
// directory this process may create files in. Creates nothing.
void check_output_file(const std::string& path, const std::string& what);

// True when `s` is well-formed UTF-8. Paths go into the JSON reports, which hold UTF-8 only: a
// path option that is not is refused up front (check_utf8_path) instead of failing the report.
bool valid_utf8(const std::string& s);
void check_utf8_path(const std::string& path, const std::string& what);

// True when the two paths name the same existing file or directory (by identity).
bool same_file(const std::string& a, const std::string& b);

}  // namespace flashattn
