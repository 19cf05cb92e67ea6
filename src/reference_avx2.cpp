// The reference's AVX2 copy: reference.cpp compiled again with -mavx2 -mno-fma, its code in
// namespace reference_copy::avx2 (reference.cpp's opening comment says how the two copies relate).
#define FLASHATTN_REFERENCE_AVX2_COPY
#include "reference.cpp"  // NOLINT(bugprone-suspicious-include): the same source, another instruction set
