#include "ring_shards.h"

#include <cstdint>
#include <cstring>

namespace flashattn {

namespace {

// Row i of the shard for (b, h): its place in the whole tensor and in the contiguous rows.
template <class F>
void for_each_row(const Strides& st, int B, int heads, int width, const RingShard& shard, F&& f) {
  const int len = shard.len();
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < heads; ++h)
      for (int i = 0; i < len; ++i)
        f(b * st.batch + h * st.head + int64_t(shard.global(i)) * st.row, ((int64_t(b) * heads + h) * len + i) * width);
}

}  // namespace

void ring_gather_rows(const void* whole, const Strides& st, size_t es, int B, int heads, int width,
                      const RingShard& shard, void* rows) {
  const auto* src = static_cast<const uint8_t*>(whole);
  auto* dst = static_cast<uint8_t*>(rows);
  for_each_row(st, B, heads, width, shard,
               [&](int64_t at_whole, int64_t at_rows) { std::memcpy(dst + at_rows * es, src + at_whole * es, width * es); });
}

void ring_scatter_rows(const void* rows, size_t es, int B, int heads, int width, const RingShard& shard,
                       const Strides& st, void* whole) {
  const auto* src = static_cast<const uint8_t*>(rows);
  auto* dst = static_cast<uint8_t*>(whole);
  for_each_row(st, B, heads, width, shard,
               [&](int64_t at_whole, int64_t at_rows) { std::memcpy(dst + at_whole * es, src + at_rows * es, width * es); });
}

}  // namespace flashattn
