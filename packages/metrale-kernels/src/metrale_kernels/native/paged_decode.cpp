// metrale::paged_decode: attention for decode rows (one query token each) over a paged K/V
// cache, read in place: no gathered copy of the context, no padding, no mask.
//
// One task per row: its query heads score every visible key (a key's slot, all kv heads, read
// once for all of them), take a softmax in float32 and sum the values (each read once). A row's result depends on its own context alone, never on the
// other rows of the step, and the order of every sum is fixed by that context.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>
#if defined(__AVX2__)
#include <immintrin.h>
#endif

namespace {

// The vector loops are written out: GCC leaves these reductions scalar (measured 10x slower).
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

void shifted_exp(float* x, int64_t n, float shift) {
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
#endif
  for (; i < n; ++i) {
    const float v = std::max(x[i] - shift, kLowest);
    const float k = std::nearbyint(v * kLog2e);
    const float r = (v - k * kLn2Hi) - k * kLn2Lo;
    x[i] = std::ldexp(exp_poly(r), static_cast<int>(k));
  }
}

void paged_decode(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                  const at::Tensor& rows, const at::Tensor& seqs, const at::Tensor& block_tables,
                  const at::Tensor& seq_lens, const at::Tensor& first_keys, double scale,
                  const at::Tensor& out) {
  TORCH_CHECK(q.dim() == 3 && k_cache.dim() == 4 && v_cache.sizes() == k_cache.sizes(),
              "paged_decode: q (tokens, heads, dim), caches (blocks, block_size, kv_heads, dim)");
  TORCH_CHECK(q.scalar_type() == at::kFloat && k_cache.scalar_type() == at::kFloat &&
                  v_cache.scalar_type() == at::kFloat && out.scalar_type() == at::kFloat,
              "paged_decode: float32 q, caches and out");
  TORCH_CHECK(q.is_contiguous() && k_cache.is_contiguous() && v_cache.is_contiguous() &&
                  out.is_contiguous() && out.sizes() == q.sizes(),
              "paged_decode: contiguous tensors, out shaped as q");
  for (const at::Tensor* index : {&rows, &seqs, &seq_lens, &first_keys})
    TORCH_CHECK(index->scalar_type() == at::kLong && index->is_contiguous(),
                "paged_decode: int64 contiguous indices");
  // The tables may be a view of wider ones: rows strided, entries contiguous.
  TORCH_CHECK(block_tables.scalar_type() == at::kLong && block_tables.dim() == 2 &&
                  block_tables.stride(1) == 1,
              "paged_decode: int64 block tables with contiguous rows");
  const int64_t heads = q.size(1), dim = q.size(2);
  const int64_t block_size = k_cache.size(1), kv_heads = k_cache.size(2);
  TORCH_CHECK(k_cache.size(3) == dim && heads % kv_heads == 0, "paged_decode: head shapes");
  const int64_t group = heads / kv_heads, num_rows = rows.size(0);
  (void)kv_heads;
  const int64_t table_width = block_tables.size(1), table_stride = block_tables.stride(0);
  const float* q_data = q.data_ptr<float>();
  const float* k_data = k_cache.data_ptr<float>();
  const float* v_data = v_cache.data_ptr<float>();
  float* out_data = out.data_ptr<float>();
  const int64_t* row_data = rows.data_ptr<int64_t>();
  const int64_t* seq_data = seqs.data_ptr<int64_t>();
  const int64_t* table_data = block_tables.data_ptr<int64_t>();
  const int64_t* len_data = seq_lens.data_ptr<int64_t>();
  const int64_t* first_data = first_keys.data_ptr<int64_t>();
  const float softmax_scale = static_cast<float>(scale);
  const int64_t slot_stride = kv_heads * dim;  // floats between a kv head's consecutive slots

  // One task per row, every head of it: a key's slot (all kv heads) is read once, in order.
  at::parallel_for(0, num_rows, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> scores, acc(heads * dim), totals(heads);
    for (int64_t r = begin; r < end; ++r) {
      const int64_t first = first_data[r], last = len_data[r];  // keys [first, last)
      const int64_t* table = table_data + seq_data[r] * table_stride;
      const int64_t keys = last - first;
      const float* query = q_data + row_data[r] * heads * dim;
      float* result = out_data + row_data[r] * heads * dim;
      TORCH_CHECK(keys > 0 && (last - 1) / block_size < table_width,
                  "paged_decode: a row's keys are outside its block table");
      scores.resize(heads * keys);
      for (int64_t t = first; t < last; ++t) {
        const float* key = k_data + (table[t / block_size] * block_size + t % block_size) * slot_stride;
        // Query head h reads kv head h / group.
        for (int64_t h = 0; h < heads; ++h)
          scores[h * keys + (t - first)] = dot(query + h * dim, key + (h / group) * dim, dim) * softmax_scale;
      }
      for (int64_t h = 0; h < heads; ++h) {
        float* row_scores = scores.data() + h * keys;
        shifted_exp(row_scores, keys, *std::max_element(row_scores, row_scores + keys));
        float total = 0.f;
        for (int64_t i = 0; i < keys; ++i) total += row_scores[i];
        totals[h] = total;
      }
      std::fill(acc.begin(), acc.end(), 0.f);
      for (int64_t t = first; t < last; ++t) {
        const float* value = v_data + (table[t / block_size] * block_size + t % block_size) * slot_stride;
        for (int64_t h = 0; h < heads; ++h)
          axpy(scores[h * keys + (t - first)], value + (h / group) * dim, acc.data() + h * dim, dim);
      }
      for (int64_t h = 0; h < heads; ++h) {
        const float inverse = 1.f / totals[h];
        for (int64_t d = 0; d < dim; ++d) result[h * dim + d] = acc[h * dim + d] * inverse;
      }
    }
  });
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(metrale, m) {
  m.def(
      "paged_decode(Tensor q, Tensor k_cache, Tensor v_cache, Tensor rows, Tensor seqs, "
      "Tensor block_tables, Tensor seq_lens, Tensor first_keys, float scale, Tensor(a!) out) -> ()");
  m.impl("paged_decode", c10::DispatchKey::CPU, TORCH_FN(paged_decode));
}
