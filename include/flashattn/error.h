// Error types and the documented exit codes. Every failure surfaces as one of these exceptions and
// main() turns it into one line on stderr and the exit code below.
#pragma once

#include <stdexcept>
#include <string>

namespace flashattn {

enum ExitCode : int {
  kExitOk = 0,
  kExitRuntime = 1,     // CUDA/cuBLAS failure, out of memory, I/O failure while writing
  kExitInput = 2,       // bad command line or bad input data
  kExitValidation = 3,  // --check found an output outside its tolerance
};

class Error : public std::runtime_error {
 public:
  Error(const std::string& msg, int code) : std::runtime_error(msg), code_(code) {}
  int exit_code() const { return code_; }

 private:
  int code_;
};

// Bad input or usage: the message names the file (or option) and the problem.
class InputError : public Error {
 public:
  explicit InputError(const std::string& msg) : Error(msg, kExitInput) {}
};

// Failure while running: CUDA, cuBLAS, memory, writing outputs.
class RuntimeError : public Error {
 public:
  explicit RuntimeError(const std::string& msg) : Error(msg, kExitRuntime) {}
};

}  // namespace flashattn
