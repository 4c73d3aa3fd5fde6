// metrale::input_major_mm(x, w, bias) -> x @ w (+ bias): float32 x (M, K) times a weight kept
// input-major, w (K, N) with contiguous rows (transformers' gpt-oss experts, read as stored).
//
// Every output is its own sum, acc = fma(x[m, k], w[k, n], acc) for k = 0 .. K-1 from 0, then
// the bias added: the same arithmetic whatever M and whichever rows or columns share a tile or
// a thread, vector or scalar (an fma rounds once either way). So a row's result does not depend
// on the other rows of the call (row invariance) without padding rows to a GEMM's tile: at the
// one or two rows a decode step gives an expert, the weight is read once, in order.
//
// Past 6 rows, a tile is 6 rows x 64 columns (24 AVX-512 accumulators, in registers; the last
// columns masked lanes). The weight is copied in blocks of rows x tiles that every row tile
// passes over, the sums carried from one block of K to the next in the output: a float stored
// and reloaded is the same float, so each output stays one fma chain from k = 0. Without
// AVX-512, a tile is 6 rows x 16 columns (12 AVX2 accumulators) over a packed strip of the
// weight; without AVX2, rows go 6 at a time through the few-row stream. The threads split the
// columns. input_major_mm_out writes into a given (M, N).
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>
#if defined(__AVX512F__) || defined(__AVX2__)
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
// Up to kFewRows rows, a weight block is 4 tiles wide (long rows read from memory in turn)
// and 256 deep; past it, one tile wide and up to 4096 deep (fewer carries of the sums).
constexpr int64_t kFewRows = 128;
constexpr int64_t kPrefetchRows = 8;

// The first count lanes (none for count <= 0, all for count >= 16).
inline __mmask16 first_lanes(int64_t count) {
  return static_cast<__mmask16>((1u << std::clamp<int64_t>(count, 0, 16)) - 1);
}

// Rows [m0, m0 + R) x the tile's columns over the weight's rows [k0, k0 + depth), from a packed
// panel (depth x kTileCols), the sums so far read from out (past the first block of K).
template <int R>
void vector_tile(const Operands& op, const float* panel, int64_t m0, int64_t n0, int64_t k0,
                 int64_t depth, const __mmask16* masks) {
  constexpr int V = kTileCols / 16;
  __m512 acc[R][V];
  float* out = op.out + m0 * op.ldo + n0;
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < V; ++v)
      acc[r][v] = k0 == 0 ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(masks[v], out + r * op.ldo + 16 * v);
  const float* x = op.x + m0 * op.ldx + k0;
  for (int64_t k = 0; k < depth; ++k) {
    __m512 wv[V];
    for (int v = 0; v < V; ++v) wv[v] = _mm512_loadu_ps(panel + k * kTileCols + 16 * v);
    for (int r = 0; r < R; ++r) {
      const __m512 a = _mm512_set1_ps(x[r * op.ldx + k]);
      for (int v = 0; v < V; ++v) acc[r][v] = _mm512_fmadd_ps(a, wv[v], acc[r][v]);
    }
  }
  const bool is_last = k0 + depth == op.k_size;
  for (int r = 0; r < R; ++r) {
    for (int v = 0; v < V; ++v) {
      __m512 result = acc[r][v];
      if (is_last && op.bias != nullptr)
        result = _mm512_add_ps(result, _mm512_maskz_loadu_ps(masks[v], op.bias + n0 + 16 * v));
      _mm512_mask_storeu_ps(out + r * op.ldo + 16 * v, masks[v], result);
    }
  }
}

// Weight rows [k0, k0 + depth) x columns [n0, n1) into panels of kTileCols columns, the last
// zero-padded. Copied contiguous: rows of a large weight lie a multiple of 4 KiB apart, and read
// in place they fall in the same few cache sets.
void pack_panels(const Operands& op, int64_t k0, int64_t depth, int64_t n0, int64_t n1, float* panels) {
  for (int64_t k = 0; k < depth; ++k) {
    const float* w = op.w + (k0 + k) * op.ldw;
    if (k0 + k + kPrefetchRows < op.k_size)
      for (int64_t n = n0; n < n1; n += 16)
        _mm_prefetch(reinterpret_cast<const char*>(w + kPrefetchRows * op.ldw + n), _MM_HINT_T0);
    for (int64_t n = n0; n < n1; n += kTileCols) {
      float* panel = panels + (n - n0) * depth + k * kTileCols;
      for (int64_t v = 0; v < kTileCols / 16; ++v)
        _mm512_storeu_ps(panel + 16 * v, _mm512_maskz_loadu_ps(first_lanes(n1 - n - 16 * v), w + n + 16 * v));
    }
  }
}

// Every row x columns [n0, n1): block_tiles tiles' columns at a time, over K in blocks (the sums
// carried over in out), each block packed once and used by every row tile.
void tile_columns(const Operands& op, int64_t m_size, int64_t n0, int64_t n1, std::vector<float>& panels) {
  const int64_t block_tiles = m_size <= kFewRows ? 4 : 1;
  const int64_t block_k = m_size <= kFewRows ? 256 : 4096;
  // 64-byte aligned: a panel's vector loads each one cache line.
  panels.resize(block_k * block_tiles * kTileCols + 15);
  float* const packed = panels.data() + (-reinterpret_cast<uintptr_t>(panels.data()) / sizeof(float)) % 16;
  for (int64_t nb = n0; nb < n1; nb += block_tiles * kTileCols) {
    const int64_t nb1 = std::min(n1, nb + block_tiles * kTileCols);
    for (int64_t k0 = 0; k0 < op.k_size; k0 += block_k) {
      const int64_t depth = std::min(block_k, op.k_size - k0);
      pack_panels(op, k0, depth, nb, nb1, packed);
      for (int64_t n = nb; n < nb1; n += kTileCols) {
        __mmask16 masks[kTileCols / 16];
        for (int64_t v = 0; v < kTileCols / 16; ++v) masks[v] = first_lanes(nb1 - n - 16 * v);
        const float* panel = packed + (n - nb) * depth;
        int64_t m = 0;
        for (; m + kTileRows <= m_size; m += kTileRows)
          vector_tile<kTileRows>(op, panel, m, n, k0, depth, masks);
        switch (m_size - m) {
          case 5: vector_tile<5>(op, panel, m, n, k0, depth, masks); break;
          case 4: vector_tile<4>(op, panel, m, n, k0, depth, masks); break;
          case 3: vector_tile<3>(op, panel, m, n, k0, depth, masks); break;
          case 2: vector_tile<2>(op, panel, m, n, k0, depth, masks); break;
          case 1: vector_tile<1>(op, panel, m, n, k0, depth, masks); break;
          default: break;
        }
      }
    }
  }
}
const char* const kPath = "avx512";
#else
// Rows [m0, m0 + rows) x columns [n0, n1) streamed as a decode step's are.
void stream_rows(const Operands& op, int64_t m0, int64_t rows, int64_t n0, int64_t n1) {
  Operands group = op;
  group.x = op.x + m0 * op.ldx;
  group.out = op.out + m0 * op.ldo;
  stream_columns(group, rows, n0, n1);
}

#if defined(__AVX2__) && defined(__FMA__)
constexpr int64_t kAvx2Cols = 16;

// Rows [m0, m0 + R) x 16 columns over all of K, 2R AVX2 accumulators in registers; w: the
// columns' first weight row, its rows ldw apart; out: the columns' first output.
template <int R>
void avx2_tile(const Operands& op, const float* w, int64_t ldw, int64_t m0, int64_t n0) {
  __m256 acc[R][2];
  for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
  const float* x = op.x + m0 * op.ldx;
  for (int64_t k = 0; k < op.k_size; ++k) {
    const __m256 w0 = _mm256_loadu_ps(w + k * ldw), w1 = _mm256_loadu_ps(w + k * ldw + 8);
    for (int r = 0; r < R; ++r) {
      const __m256 a = _mm256_set1_ps(x[r * op.ldx + k]);
      acc[r][0] = _mm256_fmadd_ps(a, w0, acc[r][0]);
      acc[r][1] = _mm256_fmadd_ps(a, w1, acc[r][1]);
    }
  }
  for (int r = 0; r < R; ++r) {
    float* out = op.out + (m0 + r) * op.ldo + n0;
    for (int v = 0; v < 2; ++v) {
      __m256 result = acc[r][v];
      if (op.bias != nullptr) result = _mm256_add_ps(result, _mm256_loadu_ps(op.bias + n0 + 8 * v));
      _mm256_storeu_ps(out + 8 * v, result);
    }
  }
}

// Every row x columns [n0, n1): 6 x 16 tiles over each strip of 16 columns copied to a
// contiguous panel (rows of a large weight lie a multiple of 4 KiB apart: read in place they
// fall in the same few cache sets), the last columns streamed.
void tile_columns(const Operands& op, int64_t m_size, int64_t n0, int64_t n1, std::vector<float>& panel) {
  panel.resize(op.k_size * kAvx2Cols);
  int64_t n = n0;
  for (; n + kAvx2Cols <= n1; n += kAvx2Cols) {
    for (int64_t k = 0; k < op.k_size; ++k)
      std::copy_n(op.w + k * op.ldw + n, kAvx2Cols, panel.data() + k * kAvx2Cols);
    const float* w = panel.data();
    int64_t m = 0;
    for (; m + kTileRows <= m_size; m += kTileRows) avx2_tile<kTileRows>(op, w, kAvx2Cols, m, n);
    switch (m_size - m) {
      case 5: avx2_tile<5>(op, w, kAvx2Cols, m, n); break;
      case 4: avx2_tile<4>(op, w, kAvx2Cols, m, n); break;
      case 3: avx2_tile<3>(op, w, kAvx2Cols, m, n); break;
      case 2: avx2_tile<2>(op, w, kAvx2Cols, m, n); break;
      case 1: avx2_tile<1>(op, w, kAvx2Cols, m, n); break;
      default: break;
    }
  }
  if (n < n1)
    for (int64_t m0 = 0; m0 < m_size; m0 += kTileRows) stream_rows(op, m0, std::min(kTileRows, m_size - m0), n, n1);
}
const char* const kPath = "avx2";
#else
// Rows kTileRows at a time, each group's columns streamed (fma_row vectorized by the compiler).
void tile_columns(const Operands& op, int64_t m_size, int64_t n0, int64_t n1, std::vector<float>&) {
  for (int64_t m0 = 0; m0 < m_size; m0 += kTileRows) stream_rows(op, m0, std::min(kTileRows, m_size - m0), n0, n1);
}
const char* const kPath = "scalar";
#endif
#endif

void check_operands(const at::Tensor& x, const at::Tensor& w) {
  TORCH_CHECK(x.dim() == 2 && w.dim() == 2 && x.size(1) == w.size(0),
              "input_major_mm: x (M, K) and w (K, N)");
  TORCH_CHECK(x.scalar_type() == at::kFloat && w.scalar_type() == at::kFloat,
              "input_major_mm: float32 x and w");
  TORCH_CHECK(x.stride(1) == 1 && w.stride(1) == 1, "input_major_mm: x and w with contiguous rows");
}

// out (M, N) float32 with contiguous rows, not overlapping x: it holds the sums between K blocks.
void input_major_mm_out(const at::Tensor& x, const at::Tensor& w, const c10::optional<at::Tensor>& bias,
                        at::Tensor& out) {
  check_operands(x, w);
  const int64_t m_size = x.size(0), k_size = x.size(1), n_size = w.size(1);
  TORCH_CHECK(out.scalar_type() == at::kFloat && out.dim() == 2 && out.size(0) == m_size &&
                  out.size(1) == n_size && (n_size <= 1 || out.stride(1) == 1),
              "input_major_mm: out (M, N) float32 with contiguous rows");
  const float* bias_data = nullptr;
  if (bias.has_value()) {
    TORCH_CHECK(bias->scalar_type() == at::kFloat && bias->dim() == 1 && bias->size(0) == n_size &&
                    bias->is_contiguous(),
                "input_major_mm: bias (N,) contiguous float32");
    bias_data = bias->data_ptr<float>();
  }
  const Operands op{x.data_ptr<float>(), x.stride(0), w.data_ptr<float>(), w.stride(0), k_size,
                    bias_data, out.data_ptr<float>(), out.stride(0)};
  if (m_size > 0 && m_size <= kTileRows) {
    at::parallel_for(0, n_size, kTileCols, [&](int64_t begin, int64_t end) {
      stream_columns(op, m_size, begin, end);
    });
  } else if (m_size > 0) {
    at::parallel_for(0, (n_size + kTileCols - 1) / kTileCols, 1, [&](int64_t begin, int64_t end) {
      thread_local std::vector<float> panels;
      tile_columns(op, m_size, begin * kTileCols, std::min(n_size, end * kTileCols), panels);
    });
  }
}

at::Tensor input_major_mm(const at::Tensor& x, const at::Tensor& w, const c10::optional<at::Tensor>& bias) {
  check_operands(x, w);
  at::Tensor out = at::empty({x.size(0), w.size(1)}, x.options());
  input_major_mm_out(x, w, bias, out);
  return out;
}

std::string input_major_mm_path() { return kPath; }

}  // namespace

TORCH_LIBRARY_FRAGMENT(metrale, m) {
  m.def("input_major_mm(Tensor x, Tensor w, Tensor? bias=None) -> Tensor");
  m.impl("input_major_mm", c10::DispatchKey::CPU, TORCH_FN(input_major_mm));
  m.def("input_major_mm_out(Tensor x, Tensor w, Tensor? bias, Tensor(a!) out) -> ()");
  m.impl("input_major_mm_out", c10::DispatchKey::CPU, TORCH_FN(input_major_mm_out));
  m.def("input_major_mm_path() -> str", &input_major_mm_path);
}
