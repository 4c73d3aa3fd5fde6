// Small vector helpers shared by the native ops, written out for AVX-512 and AVX2 (GCC leaves
// these reductions and exp scalar). Each gives the same result for the same inputs, whatever
// the rest of the batch: sums run in a fixed order.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#if defined(__AVX2__)
#include <immintrin.h>
#endif

namespace metrale_native {

inline float dot(const float* a, const float* b, int64_t n) {
  int64_t d = 0;
  float total = 0.f;
#if defined(__AVX512F__)
  __m512 acc = _mm512_setzero_ps();
  for (; d + 16 <= n; d += 16) acc = _mm512_fmadd_ps(_mm512_loadu_ps(a + d), _mm512_loadu_ps(b + d), acc);
  total = _mm512_reduce_add_ps(acc);
#elif defined(__AVX2__) && defined(__FMA__)
  __m256 acc = _mm256_setzero_ps();
  for (; d + 8 <= n; d += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + d), _mm256_loadu_ps(b + d), acc);
  __m128 half = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
  half = _mm_add_ps(half, _mm_movehl_ps(half, half));
  half = _mm_add_ss(half, _mm_movehdup_ps(half));
  total = _mm_cvtss_f32(half);
#endif
  for (; d < n; ++d) total += a[d] * b[d];
  return total;
}

// y += p * x
inline void axpy(float p, const float* x, float* y, int64_t n) {
  int64_t d = 0;
#if defined(__AVX512F__)
  const __m512 pv = _mm512_set1_ps(p);
  for (; d + 16 <= n; d += 16)
    _mm512_storeu_ps(y + d, _mm512_fmadd_ps(pv, _mm512_loadu_ps(x + d), _mm512_loadu_ps(y + d)));
#elif defined(__AVX2__) && defined(__FMA__)
  const __m256 pv = _mm256_set1_ps(p);
  for (; d + 8 <= n; d += 8)
    _mm256_storeu_ps(y + d, _mm256_fmadd_ps(pv, _mm256_loadu_ps(x + d), _mm256_loadu_ps(y + d)));
#endif
  for (; d < n; ++d) y[d] += p * x[d];
}

// sum a[i] * b[i] over int8 b, each b[i] exactly a float: the sums of dot's order.
inline float dot_i8(const float* a, const int8_t* b, int64_t n) {
  int64_t d = 0;
  float total = 0.f;
#if defined(__AVX512F__)
  __m512 acc = _mm512_setzero_ps();
  for (; d + 16 <= n; d += 16) {
    const __m512 bf = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + d))));
    acc = _mm512_fmadd_ps(_mm512_loadu_ps(a + d), bf, acc);
  }
  total = _mm512_reduce_add_ps(acc);
#elif defined(__AVX2__) && defined(__FMA__)
  __m256 acc = _mm256_setzero_ps();
  for (; d + 8 <= n; d += 8) {
    const __m256 bf = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(b + d))));
    acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + d), bf, acc);
  }
  __m128 half = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
  half = _mm_add_ps(half, _mm_movehl_ps(half, half));
  half = _mm_add_ss(half, _mm_movehdup_ps(half));
  total = _mm_cvtss_f32(half);
#endif
  for (; d < n; ++d) total += a[d] * static_cast<float>(b[d]);
  return total;
}

// y += p * x over int8 x
inline void axpy_i8(float p, const int8_t* x, float* y, int64_t n) {
  int64_t d = 0;
#if defined(__AVX512F__)
  const __m512 pv = _mm512_set1_ps(p);
  for (; d + 16 <= n; d += 16) {
    const __m512 xf = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x + d))));
    _mm512_storeu_ps(y + d, _mm512_fmadd_ps(pv, xf, _mm512_loadu_ps(y + d)));
  }
#elif defined(__AVX2__) && defined(__FMA__)
  const __m256 pv = _mm256_set1_ps(p);
  for (; d + 8 <= n; d += 8) {
    const __m256 xf = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(x + d))));
    _mm256_storeu_ps(y + d, _mm256_fmadd_ps(pv, xf, _mm256_loadu_ps(y + d)));
  }
#endif
  for (; d < n; ++d) y[d] += p * static_cast<float>(x[d]);
}

// fp8 codes as floats, in registers. e4m3: the code's exponent and mantissa bits placed where
// a float's go, the float times 2^120 (the bias 127 - 7: exact, subnormal codes included; the
// NaN codes, which a clamped write never makes, read as +-480). e5m2 is the high byte of a
// float16. Elsewhere (and for the tails) `table[code]`.
#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
inline __m256 fp8x8_to_ps(const uint8_t* b, bool e4m3) {
  const __m128i bytes = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(b));
  if (!e4m3) return _mm256_cvtph_ps(_mm_slli_epi16(_mm_cvtepu8_epi16(bytes), 8));
  const __m256i v = _mm256_cvtepu8_epi32(bytes);
  const __m256i sign = _mm256_slli_epi32(_mm256_and_si256(v, _mm256_set1_epi32(0x80)), 24);
  const __m256i bits = _mm256_slli_epi32(_mm256_and_si256(v, _mm256_set1_epi32(0x7F)), 20);
  const __m256 magnitude = _mm256_mul_ps(_mm256_castsi256_ps(bits), _mm256_set1_ps(0x1p120f));
  return _mm256_or_ps(magnitude, _mm256_castsi256_ps(sign));
}
#endif
#if defined(__AVX512F__) && defined(__AVX512BW__)
inline __m512 fp8x16_to_ps(const uint8_t* b, bool e4m3) {
  const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b));
  if (!e4m3) return _mm512_cvtph_ps(_mm256_slli_epi16(_mm256_cvtepu8_epi16(bytes), 8));
  const __m512i v = _mm512_cvtepu8_epi32(bytes);
  const __m512i sign = _mm512_slli_epi32(_mm512_and_si512(v, _mm512_set1_epi32(0x80)), 24);
  const __m512i bits = _mm512_slli_epi32(_mm512_and_si512(v, _mm512_set1_epi32(0x7F)), 20);
  const __m512 magnitude = _mm512_mul_ps(_mm512_castsi512_ps(bits), _mm512_set1_ps(0x1p120f));
  return _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(magnitude), sign));
}
#endif

// sum a[i] * fp8 b[i] (`table`: each code's value, for what is not vectorized)
inline float dot_fp8(const float* a, const uint8_t* b, bool e4m3, const float* table, int64_t n) {
  int64_t d = 0;
  float total = 0.f;
#if defined(__AVX512F__) && defined(__AVX512BW__)
  __m512 acc = _mm512_setzero_ps();
  for (; d + 16 <= n; d += 16) acc = _mm512_fmadd_ps(_mm512_loadu_ps(a + d), fp8x16_to_ps(b + d, e4m3), acc);
  total = _mm512_reduce_add_ps(acc);
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
  __m256 acc = _mm256_setzero_ps();
  for (; d + 8 <= n; d += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + d), fp8x8_to_ps(b + d, e4m3), acc);
  __m128 half = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
  half = _mm_add_ps(half, _mm_movehl_ps(half, half));
  half = _mm_add_ss(half, _mm_movehdup_ps(half));
  total = _mm_cvtss_f32(half);
#endif
  for (; d < n; ++d) total += a[d] * table[b[d]];
  return total;
}

// y += p * fp8 x[i]
inline void axpy_fp8(float p, const uint8_t* x, bool e4m3, const float* table, float* y, int64_t n) {
  int64_t d = 0;
#if defined(__AVX512F__) && defined(__AVX512BW__)
  const __m512 pv = _mm512_set1_ps(p);
  for (; d + 16 <= n; d += 16)
    _mm512_storeu_ps(y + d, _mm512_fmadd_ps(pv, fp8x16_to_ps(x + d, e4m3), _mm512_loadu_ps(y + d)));
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
  const __m256 pv = _mm256_set1_ps(p);
  for (; d + 8 <= n; d += 8)
    _mm256_storeu_ps(y + d, _mm256_fmadd_ps(pv, fp8x8_to_ps(x + d, e4m3), _mm256_loadu_ps(y + d)));
#endif
  for (; d < n; ++d) y[d] += p * table[x[d]];
}

// x[i] = exp(x[i] - shift) for x[i] <= shift: 2^n * e^r with |r| <= ln(2) / 2 and e^r by
// its Taylor polynomial of degree 7 (relative error under 2e-8 before rounding).
inline float exp_poly(float r) {
  float p = 1.f / 5040.f;
  p = p * r + 1.f / 720.f;
  p = p * r + 1.f / 120.f;
  p = p * r + 1.f / 24.f;
  p = p * r + 1.f / 6.f;
  p = p * r + 0.5f;
  p = p * r + 1.f;
  return p * r + 1.f;
}

inline void shifted_exp(float* x, int64_t n, float shift) {
  constexpr float kLog2e = 1.44269504088896341f;
  constexpr float kLn2Hi = 0.693359375f, kLn2Lo = -2.12194440e-4f;
  constexpr float kLowest = -87.0f;  // e^-87 is about the smallest normal float
  int64_t i = 0;
#if defined(__AVX512F__)
  const __m512 shift_v = _mm512_set1_ps(shift), lowest = _mm512_set1_ps(kLowest);
  for (; i + 16 <= n; i += 16) {
    const __m512 v = _mm512_max_ps(_mm512_sub_ps(_mm512_loadu_ps(x + i), shift_v), lowest);
    const __m512 k = _mm512_roundscale_ps(_mm512_mul_ps(v, _mm512_set1_ps(kLog2e)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_sub_ps(v, _mm512_mul_ps(k, _mm512_set1_ps(kLn2Hi)));
    r = _mm512_sub_ps(r, _mm512_mul_ps(k, _mm512_set1_ps(kLn2Lo)));
    __m512 p = _mm512_set1_ps(1.f / 5040.f);
    for (const float c : {1.f / 720.f, 1.f / 120.f, 1.f / 24.f, 1.f / 6.f, 0.5f, 1.f, 1.f})
      p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(c));
    _mm512_storeu_ps(x + i, _mm512_scalef_ps(p, k));
  }
#elif defined(__AVX2__) && defined(__FMA__)
  // The same steps as AVX-512's; 2^k built in the exponent bits (k in [-126, 127] here).
  const __m256 shift_v = _mm256_set1_ps(shift), lowest = _mm256_set1_ps(kLowest);
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_max_ps(_mm256_sub_ps(_mm256_loadu_ps(x + i), shift_v), lowest);
    const __m256 k = _mm256_round_ps(_mm256_mul_ps(v, _mm256_set1_ps(kLog2e)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_sub_ps(v, _mm256_mul_ps(k, _mm256_set1_ps(kLn2Hi)));
    r = _mm256_sub_ps(r, _mm256_mul_ps(k, _mm256_set1_ps(kLn2Lo)));
    __m256 p = _mm256_set1_ps(1.f / 5040.f);
    for (const float c : {1.f / 720.f, 1.f / 120.f, 1.f / 24.f, 1.f / 6.f, 0.5f, 1.f, 1.f})
      p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(c));
    const __m256i bits = _mm256_slli_epi32(
        _mm256_add_epi32(_mm256_cvtps_epi32(k), _mm256_set1_epi32(127)), 23);
    _mm256_storeu_ps(x + i, _mm256_mul_ps(p, _mm256_castsi256_ps(bits)));
  }
#endif
  for (; i < n; ++i) {
    const float v = std::max(x[i] - shift, kLowest);
    const float k = std::nearbyint(v * kLog2e);
    const float r = (v - k * kLn2Hi) - k * kLn2Lo;
    x[i] = std::ldexp(exp_poly(r), static_cast<int>(k));
  }
}


// x[i] = e^x[i] for any x (clamped to [-87, 88], where float e^x is finite and normal).
inline void exp_in_place(float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] = std::min(x[i], 88.f);
  shifted_exp(x, n, 0.f);
}

}  // namespace metrale_native
