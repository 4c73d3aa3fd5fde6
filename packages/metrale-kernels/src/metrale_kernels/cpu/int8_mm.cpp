// metrale::int8_mm(a, w) -> a @ w.T: int8 (M, K) times int8 (N, K), int32 (M, N), exact.
//
// torch._int_mm (oneDNN) is compute-shaped: at a few rows it streams the weight at a third of
// the memory bandwidth. Here the weight is read once, row after row (one sequential stream the
// hardware prefetcher follows; four rows at a time, strided, ran at half the speed), every
// activation row (at most 4 at a time, in registers) meeting each 64-byte chunk.
// Integer sums are exact, so the result is bit-identical to torch._int_mm's whichever kernel
// runs: the op takes its own path for few rows and, where the CPU has int8 dot products
// (VNNI), oneDNN's for many; without them oneDNN's int8 GEMM is a slow path (AVX2, 2 threads,
// the head's 576 x 49152 at 16-512 rows: 3.5-5.6 GOP/s against this kernel's 101-142), so this
// kernel takes every row count.
//
// Built on the machine that runs it (-march=native), so the #if branches are its CPU's:
// AVX-512 VNNI (vpdpbusd on u8 x s8: the weight is offset to u8 by +128 and the activation
// row's sum x 128 taken back), AVX2 (maddubs on |w| and a * sign(w), pairs within int16), or
// plain C.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/_int_mm.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <cstdint>
#include <vector>

#include "int8_mm.h"
#if defined(__AVX2__)
#include <immintrin.h>
#endif

namespace {

constexpr int64_t kRowsPerBlock = 1;  // weight rows per block: one thread's unit of work
constexpr int64_t kMaxActRows = 4;    // activation rows per pass over a block
// Above this many activation rows oneDNN's blocked GEMM is faster (measured on the default
// model's matrices, 2 threads: 8 rows 10.4 vs 14.1 ms, 16 rows 27.0 vs 22.3 ms).
constexpr int64_t kFewRows = 8;

#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
const char* const kPath = "avx512_vnni";
constexpr bool kOneDnnForManyRows = true;

template <int MR>
void block_dot(const int8_t* const* a, const int32_t* a_sums, const int8_t* const* w, int64_t k,
               int32_t* out, int64_t ldo, int64_t n_valid) {
  __m512i acc[MR][kRowsPerBlock];
  for (int m = 0; m < MR; ++m)
    for (int n = 0; n < kRowsPerBlock; ++n) acc[m][n] = _mm512_setzero_si512();
  const __m512i offset = _mm512_set1_epi8(static_cast<char>(0x80));
  int64_t i = 0;
  for (; i + 64 <= k; i += 64) {
    __m512i av[MR];
    for (int m = 0; m < MR; ++m) av[m] = _mm512_loadu_si512(a[m] + i);
    for (int n = 0; n < kRowsPerBlock; ++n) {
      const __m512i wu = _mm512_xor_si512(_mm512_loadu_si512(w[n] + i), offset);
      for (int m = 0; m < MR; ++m) acc[m][n] = _mm512_dpbusd_epi32(acc[m][n], wu, av[m]);
    }
  }
  if (i < k) {
    // Lanes past k load as 0: the weight's 0 ^ 0x80 = 128 meets an activation 0.
    const __mmask64 mask = (~0ULL) >> (64 - (k - i));
    __m512i av[MR];
    for (int m = 0; m < MR; ++m) av[m] = _mm512_maskz_loadu_epi8(mask, a[m] + i);
    for (int n = 0; n < kRowsPerBlock; ++n) {
      const __m512i wu = _mm512_xor_si512(_mm512_maskz_loadu_epi8(mask, w[n] + i), offset);
      for (int m = 0; m < MR; ++m) acc[m][n] = _mm512_dpbusd_epi32(acc[m][n], wu, av[m]);
    }
  }
  for (int m = 0; m < MR; ++m)
    for (int n = 0; n < n_valid; ++n)
      out[m * ldo + n] = _mm512_reduce_add_epi32(acc[m][n]) - 128 * a_sums[m];
}

#elif defined(__AVX2__)
const char* const kPath = "avx2";
constexpr bool kOneDnnForManyRows = false;

inline int32_t sum8(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
  return _mm_cvtsi128_si32(s);
}

template <int MR>
void block_dot(const int8_t* const* a, const int32_t* a_sums, const int8_t* const* w, int64_t k,
               int32_t* out, int64_t ldo, int64_t n_valid) {
  (void)a_sums;
  __m256i acc[MR][kRowsPerBlock];
  for (int m = 0; m < MR; ++m)
    for (int n = 0; n < kRowsPerBlock; ++n) acc[m][n] = _mm256_setzero_si256();
  const __m256i ones = _mm256_set1_epi16(1);
  int64_t i = 0;
  for (; i + 32 <= k; i += 32) {
    __m256i av[MR];
    for (int m = 0; m < MR; ++m)
      av[m] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a[m] + i));
    for (int n = 0; n < kRowsPerBlock; ++n) {
      const __m256i wv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w[n] + i));
      const __m256i w_abs = _mm256_sign_epi8(wv, wv);
      for (int m = 0; m < MR; ++m) {
        // |w| * (a * sign(w)) = w * a; a pair sums to at most 2 * 127 * 127 < 2^15.
        const __m256i pairs = _mm256_maddubs_epi16(w_abs, _mm256_sign_epi8(av[m], wv));
        acc[m][n] = _mm256_add_epi32(acc[m][n], _mm256_madd_epi16(pairs, ones));
      }
    }
  }
  for (int m = 0; m < MR; ++m)
    for (int n = 0; n < n_valid; ++n) {
      int32_t total = sum8(acc[m][n]);
      for (int64_t j = i; j < k; ++j) total += int32_t(a[m][j]) * int32_t(w[n][j]);
      out[m * ldo + n] = total;
    }
}

#else
const char* const kPath = "scalar";
constexpr bool kOneDnnForManyRows = true;

template <int MR>
void block_dot(const int8_t* const* a, const int32_t* a_sums, const int8_t* const* w, int64_t k,
               int32_t* out, int64_t ldo, int64_t n_valid) {
  (void)a_sums;
  for (int m = 0; m < MR; ++m)
    for (int n = 0; n < n_valid; ++n) {
      int32_t total = 0;
      for (int64_t j = 0; j < k; ++j) total += int32_t(a[m][j]) * int32_t(w[n][j]);
      out[m * ldo + n] = total;
    }
}
#endif

using BlockDot = void (*)(const int8_t* const*, const int32_t*, const int8_t* const*, int64_t,
                          int32_t*, int64_t, int64_t);
constexpr BlockDot kBlockDots[kMaxActRows + 1] = {nullptr, block_dot<1>, block_dot<2>,
                                                  block_dot<3>, block_dot<4>};

void few_rows_mm(const at::Tensor& a, const at::Tensor& w, at::Tensor& out) {
  const int64_t rows = a.size(0), k = a.size(1), n_total = w.size(0);
  const int8_t* a_data = a.data_ptr<int8_t>();
  const int8_t* w_data = w.data_ptr<int8_t>();
  int32_t* out_data = out.data_ptr<int32_t>();
  std::vector<int32_t> a_sums(rows);
  for (int64_t m = 0; m < rows; ++m) {
    int32_t total = 0;
    for (int64_t j = 0; j < k; ++j) total += a_data[m * k + j];
    a_sums[m] = total;
  }
  const int64_t blocks = (n_total + kRowsPerBlock - 1) / kRowsPerBlock;
  // A grain of 64 KiB of weight per task: both cores stream even a layer's smallest matrix
  // (measured against 256 KiB and 1 MiB: 5.2 vs 7.2 and 6.8 ms for the default model's).
  const int64_t grain = std::max<int64_t>(1, (64 * 1024) / (kRowsPerBlock * k));
  at::parallel_for(0, blocks, grain, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) {
      const int64_t n0 = b * kRowsPerBlock;
      const int64_t n_valid = std::min(kRowsPerBlock, n_total - n0);
      const int8_t* w_rows[kRowsPerBlock];
      // A short last block (rows per block > 1) reads its last row again for the missing ones.
      for (int64_t n = 0; n < kRowsPerBlock; ++n)
        w_rows[n] = w_data + (n0 + std::min(n, n_valid - 1)) * k;
      for (int64_t m0 = 0; m0 < rows; m0 += kMaxActRows) {
        const int64_t mr = std::min(kMaxActRows, rows - m0);
        const int8_t* a_rows[kMaxActRows];
        for (int64_t m = 0; m < mr; ++m) a_rows[m] = a_data + (m0 + m) * k;
        kBlockDots[mr](a_rows, a_sums.data() + m0, w_rows, k, out_data + m0 * n_total + n0,
                       n_total, n_valid);
      }
    }
  });
}

at::Tensor int8_mm(const at::Tensor& a, const at::Tensor& w) {
  TORCH_CHECK(a.dim() == 2 && w.dim() == 2 && a.size(1) == w.size(1),
              "int8_mm: a (M, K) and w (N, K), got ", a.sizes(), " and ", w.sizes());
  TORCH_CHECK(a.scalar_type() == at::kChar && w.scalar_type() == at::kChar,
              "int8_mm: int8 operands");
  TORCH_CHECK(a.device().is_cpu() && w.device().is_cpu(), "int8_mm: CPU tensors");
  const bool is_many = kOneDnnForManyRows && a.size(0) > kFewRows;
  if (is_many || a.size(0) == 0 || !w.is_contiguous()) {
    return at::_int_mm(a, w.t());
  }
  const at::Tensor a_rows = a.contiguous();
  at::Tensor out = at::empty({a.size(0), w.size(0)}, a.options().dtype(at::kInt));
  few_rows_mm(a_rows, w, out);
  return out;
}

std::string int8_mm_path() { return kPath; }

}  // namespace

at::Tensor metrale_native::int8_mm(const at::Tensor& a, const at::Tensor& w) {
  return ::int8_mm(a, w);
}

TORCH_LIBRARY(metrale, m) {
  m.def("int8_mm(Tensor a, Tensor w) -> Tensor");
  m.impl("int8_mm", c10::DispatchKey::CPU, TORCH_FN(::int8_mm));
  m.def("int8_mm_path() -> str", &int8_mm_path);
}
