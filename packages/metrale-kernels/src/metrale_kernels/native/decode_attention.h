// Decode attention over a paged float32 K/V cache, read in place: the core of
// metrale::paged_decode and of metrale::int8_decode_layer.
//
// One task per row: its query heads score every visible key (a key's slot, all kv heads, read
// once for all of them), take a softmax in float32 and sum the values (each read once). A
// row's result depends on its own context alone, never on the other rows of the step, and the
// order of every sum is fixed by that context.
#pragma once

#include <ATen/Parallel.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "vec_math.h"

namespace metrale_native {

struct PagedCache {
  const float* k;
  const float* v;
  int64_t block_size;
  int64_t kv_heads;
};

struct DecodeRows {
  int64_t count;
  const int64_t* rows;         // q/out row of each decode row; nullptr: row r is row r
  const int64_t* seqs;         // its block table; nullptr: table r
  const int64_t* tables;
  int64_t table_stride;
  int64_t table_width;
  const int64_t* seq_lens;     // keys [first, seq_len)
  const int64_t* first_keys;   // nullptr: from the sliding window (<= 0: none)
  int64_t sliding_window;
};

inline void decode_attention(const float* q_data, int64_t heads, int64_t dim, const PagedCache& cache,
                             const DecodeRows& decode, float softmax_scale, float* out_data) {
  const int64_t group = heads / cache.kv_heads, block_size = cache.block_size;
  const int64_t slot_stride = cache.kv_heads * dim;  // floats between consecutive slots
  // One task per row, every head of it: a key's slot (all kv heads) is read once, in order.
  at::parallel_for(0, decode.count, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> scores, acc(heads * dim), totals(heads);
    for (int64_t r = begin; r < end; ++r) {
      const int64_t last = decode.seq_lens[r];
      const int64_t first = decode.first_keys != nullptr ? decode.first_keys[r]
                            : decode.sliding_window > 0  ? std::max<int64_t>(0, last - decode.sliding_window)
                                                    : 0;
      const int64_t row = decode.rows != nullptr ? decode.rows[r] : r;
      const int64_t* table = decode.tables + (decode.seqs != nullptr ? decode.seqs[r] : r) * decode.table_stride;
      const int64_t keys = last - first;
      const float* query = q_data + row * heads * dim;
      float* result = out_data + row * heads * dim;
      TORCH_CHECK(keys > 0 && (last - 1) / block_size < decode.table_width,
                  "decode attention: a row's keys are outside its block table");
      scores.resize(heads * keys);
      for (int64_t t = first; t < last; ++t) {
        const float* key = cache.k + (table[t / block_size] * block_size + t % block_size) * slot_stride;
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
        const float* value = cache.v + (table[t / block_size] * block_size + t % block_size) * slot_stride;
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

}  // namespace metrale_native
