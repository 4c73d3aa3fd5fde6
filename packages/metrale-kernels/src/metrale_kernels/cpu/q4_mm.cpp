// metrale::q4_mm(x, packed, scales, bias) -> x̂ @ W.T (+ bias): float32 activations (M, K),
// written as two int8 digits per value, times a q4 matrix (N, K) in blocks of 32 input features
// (w = d * q + m, q in [0, 15], d and m float16), in metrale_kernels.q4_matmul's layout.
//
// Output rows come in panels of 16: one 512-bit vpdpbusd multiplies the panel's 16 rows (its
// int32 lanes) by 4 input features of one activation row (a broadcast dword), so a block's 32
// features sum exactly in integers before the block's d and m scale them, once per block and
// activation row. Per block and row:
//     acc += d * (D1 + D2 / 254) + m * (S1 + S2 / 254)
// (D the digits' dot product with q, S their sum over the block), then y = s * acc + bias.
// Each row's arithmetic, in this fixed order, is its own: the result does not depend on the
// other rows of the batch. At one row the weight streams once (5 bits a weight against int8's
// 8); at many, each panel stays in cache while every row meets it.
//
// Built with -march=native: AVX-512 VNNI, AVX2 (maddubs then madd) or plain C.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/util/Half.h>
#include <torch/library.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>

#include "q4_mm.h"
#include "two_digits.h"
#if defined(__AVX2__)
#include <immintrin.h>
#endif

namespace {

constexpr int64_t kPanel = 16;       // output rows per panel
constexpr int64_t kBlock = 32;       // input features per (d, m)
constexpr int64_t kBlockBytes = 256;  // a panel's block: 16 rows x 32 nibbles
constexpr int64_t kScaleHalves = 2 * kPanel;  // a panel's block: 16 d, then 16 m
constexpr int64_t kRowGrain = 16;
constexpr int64_t kChunkDigitBytes = 192 * 1024;  // activation digits a pass over panels reads

// The activations as the kernels read them: row r's digits at first/second + r * k, its
// per-block sums S1 + S2 / 254 at block_sums + r * blocks, its scale at scale[r].
struct Digits {
  const int8_t* first;
  const int8_t* second;
  const float* block_sums;
  const float* scale;
  int64_t k;
  int64_t blocks;
};

inline int32_t load_quad(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
const char* const kPath = "avx512_vnni";
constexpr int kMaxTile = 8;  // activation rows per pass over a panel: 3 zmm accumulators each

template <int R>
void panel_rows(const uint8_t* w, const c10::Half* s, const Digits& a, int64_t r0, float* y,
                int64_t ldy, const float* bias) {
  __m512 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
  const __m512i low_nibbles = _mm512_set1_epi8(0x0F);
  const __m512 digit_step = _mm512_set1_ps(1.f / metrale_native::kDigitBase);
  for (int64_t b = 0; b < a.blocks; ++b) {
    __m512i first[R], second[R];
    for (int r = 0; r < R; ++r) first[r] = second[r] = _mm512_setzero_si512();
    const uint8_t* wb = w + b * kBlockBytes;
    for (int g = 0; g < 4; ++g) {
      const __m512i v = _mm512_loadu_si512(wb + 64 * g);
      const __m512i lo = _mm512_and_si512(v, low_nibbles);  // features 4g .. 4g + 3
      const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), low_nibbles);  // + 16
      for (int r = 0; r < R; ++r) {
        const int8_t* f = a.first + (r0 + r) * a.k + b * kBlock;
        const int8_t* sd = a.second + (r0 + r) * a.k + b * kBlock;
        first[r] = _mm512_dpbusd_epi32(first[r], lo, _mm512_set1_epi32(load_quad(f + 4 * g)));
        first[r] = _mm512_dpbusd_epi32(first[r], hi, _mm512_set1_epi32(load_quad(f + 16 + 4 * g)));
        second[r] = _mm512_dpbusd_epi32(second[r], lo, _mm512_set1_epi32(load_quad(sd + 4 * g)));
        second[r] =
            _mm512_dpbusd_epi32(second[r], hi, _mm512_set1_epi32(load_quad(sd + 16 + 4 * g)));
      }
    }
    const c10::Half* sb = s + b * kScaleHalves;
    const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(sb)));
    const __m512 m =
        _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(sb + kPanel)));
    for (int r = 0; r < R; ++r) {
      const __m512 dots = _mm512_fmadd_ps(_mm512_cvtepi32_ps(second[r]), digit_step,
                                          _mm512_cvtepi32_ps(first[r]));
      acc[r] = _mm512_fmadd_ps(dots, d, acc[r]);
      acc[r] = _mm512_fmadd_ps(m, _mm512_set1_ps(a.block_sums[(r0 + r) * a.blocks + b]), acc[r]);
    }
  }
  const __m512 add = bias != nullptr ? _mm512_loadu_ps(bias) : _mm512_setzero_ps();
  for (int r = 0; r < R; ++r)
    _mm512_storeu_ps(y + (r0 + r) * ldy,
                     _mm512_fmadd_ps(acc[r], _mm512_set1_ps(a.scale[r0 + r]), add));
}

#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
const char* const kPath = "avx2";
constexpr int kMaxTile = 4;  // per half panel: 3 ymm accumulators a row

inline __m256i quad_dot(__m256i w, const int8_t* a) {
  // u8 weights (<= 15) times s8 digits: a pair is at most 2 * 15 * 127, inside int16.
  const __m256i pairs = _mm256_maddubs_epi16(w, _mm256_set1_epi32(load_quad(a)));
  return _mm256_madd_epi16(pairs, _mm256_set1_epi16(1));
}

template <int R>
void panel_rows(const uint8_t* w, const c10::Half* s, const Digits& a, int64_t r0, float* y,
                int64_t ldy, const float* bias) {
  const __m256i low_nibbles = _mm256_set1_epi8(0x0F);
  const __m256 digit_step = _mm256_set1_ps(1.f / metrale_native::kDigitBase);
  for (int half = 0; half < 2; ++half) {  // panel rows 8 * half .. 8 * half + 7
    __m256 acc[R];
    for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
    for (int64_t b = 0; b < a.blocks; ++b) {
      __m256i first[R], second[R];
      for (int r = 0; r < R; ++r) first[r] = second[r] = _mm256_setzero_si256();
      const uint8_t* wb = w + b * kBlockBytes + 32 * half;
      for (int g = 0; g < 4; ++g) {
        const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb + 64 * g));
        const __m256i lo = _mm256_and_si256(v, low_nibbles);
        const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), low_nibbles);
        for (int r = 0; r < R; ++r) {
          const int8_t* f = a.first + (r0 + r) * a.k + b * kBlock;
          const int8_t* sd = a.second + (r0 + r) * a.k + b * kBlock;
          first[r] = _mm256_add_epi32(first[r], quad_dot(lo, f + 4 * g));
          first[r] = _mm256_add_epi32(first[r], quad_dot(hi, f + 16 + 4 * g));
          second[r] = _mm256_add_epi32(second[r], quad_dot(lo, sd + 4 * g));
          second[r] = _mm256_add_epi32(second[r], quad_dot(hi, sd + 16 + 4 * g));
        }
      }
      const c10::Half* sb = s + b * kScaleHalves + 8 * half;
      const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(sb)));
      const __m256 m =
          _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(sb + kPanel)));
      for (int r = 0; r < R; ++r) {
        const __m256 dots = _mm256_fmadd_ps(_mm256_cvtepi32_ps(second[r]), digit_step,
                                            _mm256_cvtepi32_ps(first[r]));
        acc[r] = _mm256_fmadd_ps(dots, d, acc[r]);
        acc[r] =
            _mm256_fmadd_ps(m, _mm256_set1_ps(a.block_sums[(r0 + r) * a.blocks + b]), acc[r]);
      }
    }
    const __m256 add = bias != nullptr ? _mm256_loadu_ps(bias + 8 * half) : _mm256_setzero_ps();
    for (int r = 0; r < R; ++r)
      _mm256_storeu_ps(y + (r0 + r) * ldy + 8 * half,
                       _mm256_fmadd_ps(acc[r], _mm256_set1_ps(a.scale[r0 + r]), add));
  }
}

#else
const char* const kPath = "scalar";
constexpr int kMaxTile = 1;

// Value i (panel row i / 4's feature i % 4) of quad j of a block.
inline int32_t nibble(const uint8_t* wb, int64_t j, int64_t i) {
  const uint8_t byte = wb[64 * (j % 4) + i];
  return j < 4 ? (byte & 0x0F) : (byte >> 4);
}

template <int R>
void panel_rows(const uint8_t* w, const c10::Half* s, const Digits& a, int64_t r0, float* y,
                int64_t ldy, const float* bias) {
  static_assert(R == 1, "one row at a time");
  const int8_t* f = a.first + r0 * a.k;
  const int8_t* sd = a.second + r0 * a.k;
  for (int64_t n = 0; n < kPanel; ++n) {
    float acc = 0.f;
    for (int64_t b = 0; b < a.blocks; ++b) {
      const uint8_t* wb = w + b * kBlockBytes;
      int32_t first = 0, second = 0;
      for (int64_t j = 0; j < kBlock / 4; ++j)
        for (int64_t e = 0; e < 4; ++e) {
          const int32_t q = nibble(wb, j, n * 4 + e);
          first += q * f[b * kBlock + 4 * j + e];
          second += q * sd[b * kBlock + 4 * j + e];
        }
      const float d = static_cast<float>(s[b * kScaleHalves + n]);
      const float m = static_cast<float>(s[b * kScaleHalves + kPanel + n]);
      const float dots = static_cast<float>(second) * (1.f / metrale_native::kDigitBase) +
                         static_cast<float>(first);
      acc += dots * d;
      acc += m * a.block_sums[r0 * a.blocks + b];
    }
    y[r0 * ldy + n] = acc * a.scale[r0] + (bias != nullptr ? bias[n] : 0.f);
  }
}
#endif

using PanelRows = void (*)(const uint8_t*, const c10::Half*, const Digits&, int64_t, float*,
                           int64_t, const float*);

template <int... R>
constexpr auto make_tiles(std::integer_sequence<int, R...>) {
  return std::array<PanelRows, sizeof...(R)>{panel_rows<R + 1>...};
}
constexpr auto kTiles = make_tiles(std::make_integer_sequence<int, kMaxTile>{});

void check_q4_weight(const at::Tensor& packed, const at::Tensor& scales, int64_t in_features) {
  TORCH_CHECK(packed.scalar_type() == at::kByte && packed.dim() == 3 && packed.is_contiguous() &&
                  packed.size(2) == kBlockBytes && packed.size(1) * kBlock == in_features,
              "q4 weight: packed uint8 (out / 16, in / 32, 256) contiguous with in = ",
              in_features, ", got ", packed.sizes());
  TORCH_CHECK(scales.scalar_type() == at::kHalf && scales.is_contiguous() && scales.dim() == 4 &&
                  scales.size(0) == packed.size(0) && scales.size(1) == packed.size(1) &&
                  scales.size(2) == 2 && scales.size(3) == kPanel,
              "q4 weight: float16 scales (out / 16, in / 32, 2, 16), got ", scales.sizes());
}

}  // namespace

bool metrale_native::is_q4_weight(const at::Tensor& w) { return w.scalar_type() == at::kByte; }

at::Tensor metrale_native::q4_linear(const at::Tensor& x, const at::Tensor& packed,
                                     const at::Tensor& scales,
                                     const c10::optional<at::Tensor>& bias,
                                     const c10::optional<at::Tensor>& row_amax) {
  TORCH_CHECK(x.scalar_type() == at::kFloat && x.dim() == 2 && x.device().is_cpu(),
              "q4_mm: float32 (tokens, features) activations on the CPU");
  const int64_t rows = x.size(0), k = x.size(1);
  check_q4_weight(packed, scales, k);
  const int64_t panels = packed.size(0), n_total = panels * kPanel, blocks = k / kBlock;
  const float* b = nullptr;
  if (bias.has_value()) {
    TORCH_CHECK(bias->scalar_type() == at::kFloat && bias->is_contiguous() &&
                    bias->numel() == n_total,
                "q4_mm: a float32 bias per output row");
    b = bias->data_ptr<float>();
  }
  const float* given = nullptr;
  if (row_amax.has_value()) {
    TORCH_CHECK(row_amax->scalar_type() == at::kFloat && row_amax->is_contiguous() &&
                    row_amax->numel() == rows,
                "q4_mm: row_amax is one float32 max|x| per row");
    given = row_amax->data_ptr<float>();
  }
  at::Tensor out = at::empty({rows, n_total}, x.options());
  if (rows == 0) return out;
  const at::Tensor xc = x.contiguous();
  at::Tensor digits = at::empty({2 * rows, k}, x.options().dtype(at::kChar));
  at::Tensor sums = at::empty({rows, blocks + 1}, x.options());  // block sums, then the scale
  const float* x_data = xc.data_ptr<float>();
  int8_t* first = digits.data_ptr<int8_t>();
  int8_t* second = first + rows * k;
  float* s_data = sums.data_ptr<float>();
  at::parallel_for(0, rows, kRowGrain, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      int8_t* f = first + r * k;
      int8_t* sd = second + r * k;
      const float scale = metrale_native::write_two_digits(x_data + r * k, k, f, sd,
                                                           given != nullptr ? given[r] : -1.f);
      for (int64_t bk = 0; bk < blocks; ++bk) {
        int32_t s1 = 0, s2 = 0;
        for (int64_t i = 0; i < kBlock; ++i) {
          s1 += f[bk * kBlock + i];
          s2 += sd[bk * kBlock + i];
        }
        s_data[r * blocks + bk] =
            static_cast<float>(s2) * (1.f / metrale_native::kDigitBase) + static_cast<float>(s1);
      }
      s_data[rows * blocks + r] = scale;
    }
  });
  const Digits a{first, second, s_data, s_data + rows * blocks, k, blocks};
  const uint8_t* w = packed.data_ptr<uint8_t>();
  const c10::Half* sc = scales.data_ptr<c10::Half>();
  float* y = out.data_ptr<float>();
  // A grain of ~64 KiB of weight per task, as int8_mm's.
  const int64_t grain = std::max<int64_t>(1, (64 * 1024) / (blocks * kBlockBytes));
  // Each task's panels pass over the rows a chunk at a time, a chunk's digits small enough to
  // stay in L2 meanwhile (a prefill's whole activation matrix is megabytes: read again for
  // every panel, it ran at ~0.7 of the speed). Decode's rows are one chunk: the weight streams
  // once.
  const int64_t chunk =
      std::max<int64_t>(1, kChunkDigitBytes / (2 * k) / kMaxTile) * kMaxTile;
  at::parallel_for(0, panels, grain, [&](int64_t begin, int64_t end) {
    for (int64_t c0 = 0; c0 < rows; c0 += chunk) {
      const int64_t c1 = std::min(rows, c0 + chunk);
      for (int64_t p = begin; p < end; ++p) {
        const uint8_t* wp = w + p * blocks * kBlockBytes;
        const c10::Half* sp = sc + p * blocks * kScaleHalves;
        const float* bp = b != nullptr ? b + p * kPanel : nullptr;
        for (int64_t r0 = c0; r0 < c1; r0 += kMaxTile) {
          const int64_t tile = std::min<int64_t>(kMaxTile, c1 - r0);
          kTiles[tile - 1](wp, sp, a, r0, y + p * kPanel, n_total, bp);
        }
      }
    }
  });
  return out;
}

namespace {

at::Tensor q4_mm(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& scales,
                 const c10::optional<at::Tensor>& bias,
                 const c10::optional<at::Tensor>& row_amax) {
  return metrale_native::q4_linear(x, packed, scales, bias, row_amax);
}

std::string q4_mm_path() { return kPath; }

}  // namespace

TORCH_LIBRARY_FRAGMENT(metrale, m) {
  m.def(
      "q4_mm(Tensor x, Tensor packed, Tensor scales, Tensor? bias, Tensor? row_amax=None) -> "
      "Tensor");
  m.impl("q4_mm", c10::DispatchKey::CPU, TORCH_FN(q4_mm));
  m.def("q4_mm_path() -> str", &q4_mm_path);
}
