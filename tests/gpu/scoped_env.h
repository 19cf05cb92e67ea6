// An environment variable set for the life of a scope (a test shape's switches), unset again
// however the scope ends.
#pragma once

#include <cstdlib>
#include <string>

namespace flashattn {

struct ScopedEnv {
  ScopedEnv(const char* name, bool on, const std::string& value) : name_(name) {
    if (on) setenv(name, value.c_str(), 1);
  }
  ~ScopedEnv() { unsetenv(name_); }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;
  const char* name_;
};

}  // namespace flashattn
