// GPU test matrix of the decode kernels, derived from the registry: every Mode::Decode entry x
// dtype x head dim it declares, then, at one head dim, contiguous and paged caches (pages of 16,
// 64, 256) x S_new 1 and 3 x GQA ratios 1, 4, 8 x split counts (the kernel's choice, 1, 7), on
// batches whose cache lengths differ and include an empty cache; and a cache longer than 64k.
// Each case runs one decode step (update-cache kernel + attention) with O and lse poisoned, and is
// checked against the fp64 decode reference with the rules of --check (fp32 rel L2 1e-5; fp16/bf16
// 2x the same-dtype baseline's max error), the updated caches bit for bit against the host's
// append; a split case also runs with more pieces than one wave of CTAs. Skipped (with the reason)
// where the kernel does not declare what the case needs.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "decode_run.h"
#include "device_info.h"
#include "flashattn/registry.h"
#include "random.h"

namespace flashattn {
namespace {

int test_device() {
  const char* dev = std::getenv("FLASHATTN_TEST_DEVICE");
  return dev ? std::atoi(dev) : 0;
}

struct DecodeShape {
  int B = 2, H = 8, H_kv = 2, S_new = 1;
  std::vector<int> lens;  // cache_seqlens
  int S_max = 0;          // 0: max(lens) + S_new rounded up to 64
  int page = 0;           // 0: contiguous
  int splits = 0;         // 0: the kernel's choice
  std::string tag;
};

struct DecodeCase {
  const KernelMode* entry;
  DType dtype;
  int D;
  DecodeShape s;
};

void PrintTo(const DecodeCase& c, std::ostream* os) {
  *os << c.entry->kernel << " decode " << dtype_name(c.dtype) << " D=" << c.D << " B=" << c.s.B << " H=" << c.s.H
      << " H_kv=" << c.s.H_kv << " S_new=" << c.s.S_new << " page=" << c.s.page << " splits=" << c.s.splits << " lens=";
  for (int l : c.s.lens) *os << l << ",";
}

std::string case_name(const testing::TestParamInfo<DecodeCase>& info) {
  const DecodeCase& c = info.param;
  std::string n = c.entry->kernel + "_" + dtype_name(c.dtype) + "_D" + std::to_string(c.D) + "_" + c.s.tag;
  for (char& ch : n)
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  return n;
}

std::vector<int> head_dims_of(const KernelMode& e) {
  if (!e.head_dims.empty()) return e.head_dims;
  return {32, 64, 80, 128, 256};
}

int representative_dim(const KernelMode& e) {
  const std::vector<int> dims = head_dims_of(e);
  for (int d : dims)
    if (d == 128) return 128;
  return dims.front();
}

std::vector<DecodeCase> matrix_cases() {
  std::vector<DecodeCase> cases;
  const DType dtypes[] = {DType::F32, DType::F16, DType::BF16};
  for (const KernelMode* e : Registry::entries()) {
    if (!e->gpu || e->mode != Mode::Decode) continue;
    for (DType t : dtypes) {
      if (!(e->dtypes & dtype_bit(t))) continue;
      for (int D : head_dims_of(*e)) {
        DecodeShape s;
        s.lens = std::vector<int>{37, 300};
        s.tag = "dims";
        cases.push_back({e, t, D, s});
      }
      const int D0 = representative_dim(*e);
      const std::vector<int> splits = e->dec_splits ? std::vector<int>{0, 1, 7} : std::vector<int>{0};
      for (int page : {0, 16, 64, 256})
        for (int S_new : {1, 3})
          for (int ratio : {1, 4, 8})
            for (int sp : splits) {
              DecodeShape s;
              s.B = 3, s.H = 8, s.H_kv = 8 / ratio, s.S_new = S_new;
              s.lens = std::vector<int>{0, 77, 1000};  // an empty cache, a short one inside one block, a long one
              s.page = page, s.splits = sp;
              s.tag = "page" + std::to_string(page) + "_new" + std::to_string(S_new) + "_gqa" + std::to_string(ratio) +
                      "_splits" + std::to_string(sp);
              cases.push_back({e, t, D0, s});
            }
      // More split pieces than one wave of CTAs (2 x 8 groups x 200 pieces = 3200 CTAs), so pieces
      // of one group finish in different waves and the arrival counters see every interleaving.
      if (e->dec_splits) {
        DecodeShape s;
        s.B = 2, s.H = 16, s.H_kv = 8, s.S_new = 1;
        s.lens = std::vector<int>{20000, 9000};
        s.splits = 200;
        s.tag = "splits200_waves";
        cases.push_back({e, t, D0, s});
      }
      // A cache longer than 64k keys, contiguous and paged, split (the kernel's choice) and not.
      for (int page : {0, 256})
        for (int sp : {0, 1}) {
          if (sp == 1 && !e->dec_splits) continue;
          DecodeShape s;
          s.B = 1, s.H = 4, s.H_kv = 1, s.S_new = 3;
          s.lens = std::vector<int>{65600};
          s.S_max = 70000 + (page ? 256 - 70000 % 256 : 0);
          s.page = page, s.splits = sp;
          s.tag = "long65600_page" + std::to_string(page) + "_splits" + std::to_string(sp);
          cases.push_back({e, t, D0, s});
        }
    }
  }
  return cases;
}

HostArray random_array(DType t, std::vector<int64_t> shape, uint64_t seed, uint64_t stream) {
  HostArray f(DType::F64, std::move(shape));
  Rng rng(seed, stream);
  for (int64_t i = 0; i < f.numel(); ++i) f.data<double>()[i] = rng.normal();
  return convert(f, t);
}

DecodeInputs make_inputs(const DecodeCase& c, uint64_t seed) {
  const DecodeShape& s = c.s;
  DecodeInputs in;
  DecodeDims& d = in.dims;
  d.B = s.B, d.H = s.H, d.H_kv = s.H_kv, d.S_new = s.S_new, d.D = c.D;
  int need = 0;
  for (int l : s.lens) need = std::max(need, l + s.S_new);
  const int unit = s.page ? s.page : 64;
  d.S_max = s.S_max ? s.S_max : (need + unit - 1) / unit * unit;
  in.dtype = c.dtype;
  in.scale = 1.0 / std::sqrt(double(c.D));
  in.q = random_array(c.dtype, {s.B, s.H, s.S_new, c.D}, seed, 1);
  in.k_new = random_array(c.dtype, {s.B, s.H_kv, s.S_new, c.D}, seed, 2);
  in.v_new = random_array(c.dtype, {s.B, s.H_kv, s.S_new, c.D}, seed, 3);
  std::vector<int64_t> cache = {s.B, s.H_kv, d.S_max, c.D};
  if (s.page) {
    d.page_size = s.page;
    d.max_blocks = d.S_max / s.page;
    d.num_blocks = s.B * d.max_blocks;
    cache = {d.num_blocks, s.H_kv, s.page, c.D};
    HostArray table(DType::I32, {s.B, d.max_blocks});
    int32_t* tp = table.data<int32_t>();
    std::iota(tp, tp + table.numel(), 0);
    Rng rng(seed, 6);
    for (int64_t k = table.numel() - 1; k > 0; --k) std::swap(tp[k], tp[rng.below(k + 1)]);
    in.block_table = table;
  }
  in.k_cache = random_array(c.dtype, cache, seed, 4);
  in.v_cache = random_array(c.dtype, cache, seed, 5);
  in.cache_seqlens = HostArray(DType::I32, {s.B});
  for (int b = 0; b < s.B; ++b) in.cache_seqlens.data<int32_t>()[b] = s.lens[b];
  return in;
}

DecodeOptions options(bool check) {
  DecodeOptions o;
  o.device = test_device();
  o.timing.warmup = 0;
  o.timing.repeat = 1;
  o.timing.flush_l2 = false;
  o.time_attention = false;
  o.check = check;
  return o;
}

class DecodeMatrix : public testing::TestWithParam<DecodeCase> {};

TEST_P(DecodeMatrix, MatchesReference) {
  const DecodeCase& c = GetParam();
  DecodeInputs in = make_inputs(c, 4321);
  const std::string why = decode_why_unsupported(*c.entry, in.dims, c.dtype, query_device(test_device()).sm());
  if (!why.empty()) GTEST_SKIP() << why;
  DecodeOptions o = options(true);
  o.splits = c.s.splits;
  DecodeSession session(std::move(in), o);
  const DecodeRecord r = session.run(*c.entry);
  ASSERT_TRUE(r.run.check.performed);
  if (c.s.splits > 0 && c.entry->dec_splits) {
    EXPECT_EQ(r.splits, c.s.splits);
  }
  EXPECT_TRUE(r.cache_checked);
  for (const OutputCheck& o : r.run.check.outputs)
    EXPECT_TRUE(o.passed) << o.name << ": " << o.metric << " " << o.measured << " vs tolerance " << o.tolerance << " ["
                          << o.rule << "], nonfinite " << o.err.nonfinite << ", max_abs " << o.err.max_abs
                          << ", rel_l2 " << o.err.rel_l2 << ", splits " << r.splits;
}

INSTANTIATE_TEST_SUITE_P(Registry, DecodeMatrix, testing::ValuesIn(matrix_cases()), case_name);

// The checked run makes two steps back to back on one workspace: a kernel that left its split
// arrival counters dirty would merge the second step wrongly. Both results are checked: the second
// against the reference, the first against the second bit for bit ("repeat").
class DecodeCounters : public testing::TestWithParam<const KernelMode*> {};

TEST_P(DecodeCounters, ArrivalCountersResetBetweenBackToBackSteps) {
  const KernelMode* e = GetParam();
  if (!e->dec_splits) GTEST_SKIP() << "kernel '" << e->kernel << "' does not split";
  DecodeShape s;
  s.B = 2, s.H = 16, s.H_kv = 8, s.S_new = 1, s.splits = 200;
  s.lens = std::vector<int>{20000, 9000};
  const DecodeCase c{e, (e->dtypes & dtype_bit(DType::BF16)) ? DType::BF16 : DType::F32, representative_dim(*e), s};
  DecodeInputs in = make_inputs(c, 555);
  if (!decode_why_unsupported(*e, in.dims, c.dtype, query_device(test_device()).sm()).empty()) GTEST_SKIP();
  DecodeOptions o = options(true);
  o.splits = s.splits;
  DecodeSession session(std::move(in), o);
  const DecodeRecord r = session.run(*e);
  EXPECT_EQ(r.splits, 200);
  bool repeat = false;
  for (const OutputCheck& out : r.run.check.outputs) {
    EXPECT_TRUE(out.passed) << out.name << ": " << out.rule << " measured " << out.measured;
    repeat = repeat || out.name == "repeat";
  }
  EXPECT_TRUE(repeat) << "the checked run did not compare two back-to-back steps";
}

std::vector<const KernelMode*> decode_entries() {
  std::vector<const KernelMode*> v;
  for (const KernelMode* e : Registry::entries())
    if (e->gpu && e->mode == Mode::Decode) v.push_back(e);
  return v;
}

std::string entry_name(const testing::TestParamInfo<const KernelMode*>& i) { return i.param->kernel; }

DType dtype_for(const KernelMode& e) { return (e.dtypes & dtype_bit(DType::BF16)) ? DType::BF16 : DType::F32; }

// The same logical cache, contiguous or in shuffled pages: the kernels read the same values in the
// same order, so the outputs agree bit for bit.
class DecodePaging : public testing::TestWithParam<const KernelMode*> {};

TEST_P(DecodePaging, PagedAndContiguousCachesGiveIdenticalOutputs) {
  const KernelMode* e = GetParam();
  DecodeShape s;
  s.B = 2, s.H = 8, s.H_kv = 2, s.S_new = 2, s.page = 64;
  s.lens.push_back(500), s.lens.push_back(130);
  const DecodeCase c{e, dtype_for(*e), representative_dim(*e), s};
  DecodeInputs paged = make_inputs(c, 77);
  if (!decode_why_unsupported(*e, paged.dims, c.dtype, query_device(test_device()).sm()).empty()) GTEST_SKIP();
  // The contiguous form of the pool: row j of (b, g) from page table[b][j / 64].
  DecodeInputs flat = paged;
  const DecodeDims& d = paged.dims;
  flat.dims.page_size = flat.dims.num_blocks = flat.dims.max_blocks = 0;
  flat.block_table.reset();
  const size_t row = size_t(d.D) * dtype_size(c.dtype);
  for (HostArray* cache : {&flat.k_cache, &flat.v_cache}) {
    const HostArray& pool = cache == &flat.k_cache ? paged.k_cache : paged.v_cache;
    HostArray out(c.dtype, {d.B, d.H_kv, d.S_max, d.D});
    for (int b = 0; b < d.B; ++b)
      for (int g = 0; g < d.H_kv; ++g)
        for (int j = 0; j < d.S_max; ++j) {
          const int64_t page = paged.block_table->data<int32_t>()[b * d.max_blocks + j / 64];
          std::memcpy(out.bytes.data() + ((int64_t(b) * d.H_kv + g) * d.S_max + j) * row,
                      pool.bytes.data() + ((page * d.H_kv + g) * 64 + j % 64) * row, row);
        }
    *cache = std::move(out);
  }
  DecodeSession a(std::move(paged), options(false)), b(std::move(flat), options(false));
  const DecodeRecord ra = a.run(*e), rb = b.run(*e);
  EXPECT_EQ(ra.splits, rb.splits);
  EXPECT_TRUE(ra.run.outputs.o->bytes == rb.run.outputs.o->bytes);
  EXPECT_TRUE(ra.run.outputs.lse->bytes == rb.run.outputs.lse->bytes);
}

INSTANTIATE_TEST_SUITE_P(Registry, DecodePaging, testing::ValuesIn(decode_entries()), entry_name);

// Every decode kernel is declared bitwise reproducible (mma's arrival counters only pick which CTA
// merges; the merge order is fixed): a step run twice gives the same bits.
class DecodeDeterminism : public testing::TestWithParam<const KernelMode*> {};

TEST_P(DecodeDeterminism, RepeatedStepsAreBitwiseIdentical) {
  const KernelMode* e = GetParam();
  DecodeShape s;
  s.B = 2, s.H = 8, s.H_kv = 2, s.S_new = 1;
  s.lens.push_back(3000), s.lens.push_back(20);
  const DecodeCase c{e, dtype_for(*e), representative_dim(*e), s};
  DecodeInputs in = make_inputs(c, 99);
  if (!decode_why_unsupported(*e, in.dims, c.dtype, query_device(test_device()).sm()).empty()) GTEST_SKIP();
  DecodeSession session(std::move(in), options(false));
  const DecodeRecord x = session.run(*e), y = session.run(*e);
  EXPECT_TRUE(x.run.outputs.o->bytes == y.run.outputs.o->bytes);
  EXPECT_TRUE(x.run.outputs.lse->bytes == y.run.outputs.lse->bytes);
}

INSTANTIATE_TEST_SUITE_P(Registry, DecodeDeterminism, testing::ValuesIn(decode_entries()), entry_name);
INSTANTIATE_TEST_SUITE_P(Registry, DecodeCounters, testing::ValuesIn(decode_entries()), entry_name);

}  // namespace
}  // namespace flashattn
