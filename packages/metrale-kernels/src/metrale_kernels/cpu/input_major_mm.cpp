// metrale::input_major_mm(x, w, bias) -> x @ w (+ bias): float32 x (M, K) times a weight kept
// input-major, w (K, N) with contiguous rows (transformers' gpt-oss experts, read as stored).
//
// Every output is its own sum, acc = fma(x[m, k], w[k, n], acc) for k = 0 .. K-1 from 0, then
// the bias added: the same arithmetic whatever M and whichever rows or columns share a tile or
// a thread, vector or scalar (an fma rounds once either way). So a row's result does not depend
// on the other rows of the call (row invariance) without padding rows to a GEMM's tile: at the
// one or two rows a decode step gives an expert, the weight is read once, in order.
//
// Past 6 rows, a tile is 6 rows x 64 columns (24 AVX-512 accumulators, in registers) over all
// of K; the threads split the columns.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>
#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace {

constexpr int64_t kTileRows = 6;
constexpr int64_t kTileCols = 64;

struct Operands {
  const float* x;
  int64_t ldx;
  const float* w;
  int64_t ldw;
  int64_t k_size;
  const float* bias;  // nullptr: none
  float* out;
  int64_t ldo;
};

// Rows [m0, m0 + rows) x columns [n0, n0 + cols), scalar (any cols): the reference arithmetic.
void scalar_tile(const Operands& op, int64_t m0, int64_t rows, int64_t n0, int64_t cols) {
  for (int64_t m = m0; m < m0 + rows; ++m) {
    for (int64_t n = n0; n < n0 + cols; ++n) {
      float acc = 0.f;
      for (int64_t k = 0; k < op.k_size; ++k) acc = std::fma(op.x[m * op.ldx + k], op.w[k * op.ldw + n], acc);
      op.out[m * op.ldo + n] = op.bias != nullptr ? acc + op.bias[n] : acc;
    }
  }
}

// acc[n] = fma(a, w[n], acc[n]) for n in [0, count).
inline void fma_row(float a, const float* w, float* acc, int64_t count) {
  int64_t n = 0;
#if defined(__AVX512F__)
  const __m512 av = _mm512_set1_ps(a);
  for (; n + 16 <= count; n += 16)
    _mm512_storeu_ps(acc + n, _mm512_fmadd_ps(av, _mm512_loadu_ps(w + n), _mm512_loadu_ps(acc + n)));
#endif
  for (; n < count; ++n) acc[n] = std::fma(a, w[n], acc[n]);
}

// Every row of a few (a decode step's), columns [n0, n1): the weight's rows read in order, one
// stream the prefetcher follows (64-column tiles read it strided, at a third of the speed).
void stream_columns(const Operands& op, int64_t m_size, int64_t n0, int64_t n1) {
  const int64_t count = n1 - n0;
  std::vector<float> acc(m_size * count, 0.f);
  for (int64_t k = 0; k < op.k_size; ++k) {
    const float* w = op.w + k * op.ldw + n0;
    for (int64_t m = 0; m < m_size; ++m) fma_row(op.x[m * op.ldx + k], w, acc.data() + m * count, count);
  }
  for (int64_t m = 0; m < m_size; ++m) {
    float* out = op.out + m * op.ldo + n0;
    for (int64_t n = 0; n < count; ++n)
      out[n] = op.bias != nullptr ? acc[m * count + n] + op.bias[n0 + n] : acc[m * count + n];
  }
}

#if defined(__AVX512F__)
// w: the tile's first column of row 0, its rows ldw apart.
template <int R>
void vector_tile(const Operands& op, const float* w, int64_t ldw, int64_t m0, int64_t n0) {
  constexpr int V = kTileCols / 16;
  __m512 acc[R][V];
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < V; ++v) acc[r][v] = _mm512_setzero_ps();
  const float* x = op.x + m0 * op.ldx;
  for (int64_t k = 0; k < op.k_size; ++k) {
    __m512 wv[V];
    for (int v = 0; v < V; ++v) wv[v] = _mm512_loadu_ps(w + k * ldw + 16 * v);
    for (int r = 0; r < R; ++r) {
      const __m512 a = _mm512_set1_ps(x[r * op.ldx + k]);
      for (int v = 0; v < V; ++v) acc[r][v] = _mm512_fmadd_ps(a, wv[v], acc[r][v]);
    }
  }
  for (int r = 0; r < R; ++r) {
    float* out = op.out + (m0 + r) * op.ldo + n0;
    for (int v = 0; v < V; ++v) {
      __m512 result = acc[r][v];
      if (op.bias != nullptr) result = _mm512_add_ps(result, _mm512_loadu_ps(op.bias + n0 + 16 * v));
      _mm512_storeu_ps(out + 16 * v, result);
    }
  }
}

// Columns [n0, n0 + kTileCols) of every row. Past one row tile, the weight's columns are first
// copied to a contiguous panel: rows of a large weight lie a multiple of 4 KiB apart, and read
// in place they fall in the same few cache sets (measured: half the speed at 64-256 rows).
void full_tile_columns(const Operands& op, int64_t m_size, int64_t n0, std::vector<float>& panel) {
  const float* w = op.w + n0;
  int64_t ldw = op.ldw;
  if (m_size > kTileRows) {
    panel.resize(op.k_size * kTileCols);
    for (int64_t k = 0; k < op.k_size; ++k)
      std::copy_n(op.w + k * op.ldw + n0, kTileCols, panel.data() + k * kTileCols);
    w = panel.data();
    ldw = kTileCols;
  }
  int64_t m = 0;
  for (; m + kTileRows <= m_size; m += kTileRows) vector_tile<kTileRows>(op, w, ldw, m, n0);
  switch (m_size - m) {
    case 5: vector_tile<5>(op, w, ldw, m, n0); break;
    case 4: vector_tile<4>(op, w, ldw, m, n0); break;
    case 3: vector_tile<3>(op, w, ldw, m, n0); break;
    case 2: vector_tile<2>(op, w, ldw, m, n0); break;
    case 1: vector_tile<1>(op, w, ldw, m, n0); break;
    default: break;
  }
}
const char* const kPath = "avx512";
#else
void full_tile_columns(const Operands& op, int64_t m_size, int64_t n0, std::vector<float>&) {
  scalar_tile(op, 0, m_size, n0, kTileCols);
}
const char* const kPath = "scalar";
#endif

at::Tensor input_major_mm(const at::Tensor& x, const at::Tensor& w, const c10::optional<at::Tensor>& bias) {
  TORCH_CHECK(x.dim() == 2 && w.dim() == 2 && x.size(1) == w.size(0),
              "input_major_mm: x (M, K) and w (K, N)");
  TORCH_CHECK(x.scalar_type() == at::kFloat && w.scalar_type() == at::kFloat,
              "input_major_mm: float32 x and w");
  TORCH_CHECK(x.stride(1) == 1 && w.stride(1) == 1, "input_major_mm: x and w with contiguous rows");
  const int64_t m_size = x.size(0), k_size = x.size(1), n_size = w.size(1);
  const float* bias_data = nullptr;
  if (bias.has_value()) {
    TORCH_CHECK(bias->scalar_type() == at::kFloat && bias->dim() == 1 && bias->size(0) == n_size &&
                    bias->is_contiguous(),
                "input_major_mm: bias (N,) contiguous float32");
    bias_data = bias->data_ptr<float>();
  }
  at::Tensor out = at::empty({m_size, n_size}, x.options());
  const Operands op{x.data_ptr<float>(), x.stride(0), w.data_ptr<float>(), w.stride(0), k_size,
                    bias_data, out.data_ptr<float>(), n_size};
  const int64_t full_tiles = n_size / kTileCols;
  if (m_size > 0 && m_size <= kTileRows) {
    at::parallel_for(0, n_size, kTileCols, [&](int64_t begin, int64_t end) {
      stream_columns(op, m_size, begin, end);
    });
  } else if (m_size > 0) {
    at::parallel_for(0, full_tiles, 1, [&](int64_t begin, int64_t end) {
      std::vector<float> panel;
      for (int64_t tile = begin; tile < end; ++tile)
        full_tile_columns(op, m_size, tile * kTileCols, panel);
    });
    const int64_t n0 = full_tiles * kTileCols;
    if (n0 < n_size) scalar_tile(op, 0, m_size, n0, n_size - n0);
  }
  return out;
}

std::string input_major_mm_path() { return kPath; }

}  // namespace

TORCH_LIBRARY_FRAGMENT(metrale, m) {
  m.def("input_major_mm(Tensor x, Tensor w, Tensor? bias=None) -> Tensor");
  m.impl("input_major_mm", c10::DispatchKey::CPU, TORCH_FN(input_major_mm));
  m.def("input_major_mm_path() -> str", &input_major_mm_path);
}
