// Build stamp, generated at build time (scripts/gen_version.cmake).
#pragma once

namespace flashattn {
extern const char* const kVersion;    // "0.1.0"
extern const char* const kGitSha;     // short SHA, "-dirty" when the tree had local changes
extern const char* const kBuildType;  // "Release", "Debug", ...
extern const char* const kCudaArchs;  // "80,90a"
}  // namespace flashattn
