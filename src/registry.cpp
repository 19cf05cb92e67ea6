#include "flashattn/registry.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>

namespace flashattn {
namespace {

// Function-local so registrars in other translation units can run in any static-init order.
std::map<std::pair<std::string, int>, std::unique_ptr<KernelMode>>& table() {
  static std::map<std::pair<std::string, int>, std::unique_ptr<KernelMode>> t;
  return t;
}

bool ladder_less(const KernelMode* a, const KernelMode* b) {
  if (a->rung != b->rung) return a->rung < b->rung;
  if (a->kernel != b->kernel) return a->kernel < b->kernel;
  return a->mode < b->mode;
}

}  // namespace

bool Registry::add(KernelMode entry) {
  auto key = std::make_pair(entry.kernel, static_cast<int>(entry.mode));
  if (entry.kernel.empty()) {
    std::fprintf(stderr, "flashattn: internal error: a kernel registered without a name\n");
    std::abort();
  }
  if (table().count(key)) {
    std::fprintf(stderr, "flashattn: internal error: kernel '%s' registered twice for mode %s\n",
                 entry.kernel.c_str(), mode_name(entry.mode));
    std::abort();
  }
  table().emplace(key, std::make_unique<KernelMode>(std::move(entry)));
  return true;
}

const KernelMode* Registry::find(const std::string& kernel, Mode mode) {
  auto it = table().find(std::make_pair(kernel, static_cast<int>(mode)));
  return it == table().end() ? nullptr : it->second.get();
}

std::vector<const KernelMode*> Registry::entries() {
  std::vector<const KernelMode*> out;
  for (auto& kv : table()) out.push_back(kv.second.get());
  std::sort(out.begin(), out.end(), ladder_less);
  return out;
}

std::string why_gpu_unsupported(const KernelMode& e, int sm) {
  if (!e.gpu) return "";
  if (sm == 0) return "needs a GPU and none is available";
  if (sm < e.min_sm)
    return "needs sm_" + std::to_string(e.min_sm) + " or newer; this GPU is sm_" + std::to_string(sm);
  if (e.max_sm > 0 && sm > e.max_sm)
    return "is built for sm_" + std::to_string(e.max_sm) + (e.max_sm == e.min_sm ? "" : " at most") +
           " (arch-specific code); this GPU is sm_" + std::to_string(sm);
  return "";
}

std::string fallback_note(const KernelMode& e, int D) {
  for (int d : e.fallback_head_dims)
    if (d == D) return "no D=" + std::to_string(D) + " variant: runs the " + e.fallback_kernel + " kernel";
  return "";
}

std::vector<std::string> Registry::kernel_names() {
  std::vector<std::string> names;
  for (const KernelMode* e : entries()) {
    if (std::find(names.begin(), names.end(), e->kernel) == names.end()) names.push_back(e->kernel);
  }
  return names;
}

}  // namespace flashattn
