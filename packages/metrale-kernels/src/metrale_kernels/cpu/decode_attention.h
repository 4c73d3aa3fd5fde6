// Decode attention over a paged K/V cache (float32 read in place, or quantized rows
// dequantized as they are read; kv_cache.h): the core of metrale::paged_decode and of
// metrale::int8_decode_layer.
//
// Each query head of a row scores every visible key, takes a softmax in float32 and sums the
// values. With sinks (gpt-oss: one logit per query head), each head's softmax has one more
// logit, which weighs no value: the row's weights sum below one. A row's result depends on its
// own context alone, never on the other rows of the step or on how its heads fall to threads,
// and the order of every sum is fixed by that context.
#pragma once

#include <ATen/Parallel.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "kv_cache.h"
#include "vec_math.h"

namespace metrale_native {

struct PagedCache {
  CacheRows k;
  CacheRows v;
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

// A task's buffers, reused from one call of attend_heads to the next.
struct AttendScratch {
  std::vector<float> scores, acc, totals;
  std::vector<int64_t> kv_head;
};

// Query heads [h0, h1) of decode row r: each visible key's slot read once for all of them.
// Each head's arithmetic is its own, whichever heads share the call. sinks: (heads,) or nullptr.
inline void attend_heads(const float* q_data, int64_t heads, int64_t dim, const PagedCache& cache,
                         const DecodeRows& decode, float softmax_scale, const float* sinks,
                         int64_t r, int64_t h0, int64_t h1, AttendScratch& scratch,
                         float* out_data) {
  const int64_t group = heads / cache.kv_heads, block_size = cache.block_size;
  const int64_t last = decode.seq_lens[r];
  const int64_t first = decode.first_keys != nullptr ? decode.first_keys[r]
                        : decode.sliding_window > 0  ? std::max<int64_t>(0, last - decode.sliding_window)
                                                : 0;
  const int64_t row = decode.rows != nullptr ? decode.rows[r] : r;
  const int64_t* table = decode.tables + (decode.seqs != nullptr ? decode.seqs[r] : r) * decode.table_stride;
  const int64_t keys = last - first, count = h1 - h0;
  TORCH_CHECK(keys > 0 && (last - 1) / block_size < decode.table_width,
              "decode attention: a row's keys are outside its block table");
  const float* query = q_data + row * heads * dim;
  std::vector<float>& scores = scratch.scores;
  std::vector<float>& acc = scratch.acc;
  std::vector<float>& totals = scratch.totals;
  std::vector<int64_t>& kv_head = scratch.kv_head;  // query head h reads kv head h / group
  scores.resize(count * keys);
  acc.assign(count * dim, 0.f);
  totals.resize(count);
  kv_head.resize(count);
  for (int64_t h = h0; h < h1; ++h) kv_head[h - h0] = h / group;
  // Visits key t's slot (first <= t < last) in order, without a division per key.
  const auto for_each_slot = [&](auto&& visit) {
    for (int64_t t = first; t < last;) {
      const int64_t offset = t % block_size, run = std::min(block_size - offset, last - t);
      const int64_t base = table[t / block_size] * block_size + offset;
      for (int64_t i = 0; i < run; ++i) visit(t - first + i, base + i);
      t += run;
    }
  };
  for_each_slot([&](int64_t i, int64_t slot) {
    for (int64_t j = 0; j < count; ++j)
      scores[j * keys + i] =
          cache.k.dot_row(query + (h0 + j) * dim, slot, kv_head[j]) * softmax_scale;
  });
  for (int64_t j = 0; j < count; ++j) {
    float* head_scores = scores.data() + j * keys;
    float peak = *std::max_element(head_scores, head_scores + keys);
    if (sinks != nullptr) peak = std::max(peak, sinks[h0 + j]);
    shifted_exp(head_scores, keys, peak);
    float total = 0.f;
    for (int64_t k = 0; k < keys; ++k) total += head_scores[k];
    if (sinks != nullptr) {
      float sink = sinks[h0 + j];
      shifted_exp(&sink, 1, peak);
      total += sink;
    }
    totals[j] = total;
  }
  for_each_slot([&](int64_t i, int64_t slot) {
    for (int64_t j = 0; j < count; ++j)
      cache.v.add_row(scores[j * keys + i], slot, kv_head[j], acc.data() + j * dim);
  });
  float* result = out_data + row * heads * dim;
  for (int64_t j = 0; j < count; ++j) {
    const float inverse = 1.f / totals[j];
    for (int64_t d = 0; d < dim; ++d) result[(h0 + j) * dim + d] = acc[j * dim + d] * inverse;
  }
}

inline void decode_attention(const float* q_data, int64_t heads, int64_t dim, const PagedCache& cache,
                             const DecodeRows& decode, float softmax_scale, float* out_data,
                             const float* sinks = nullptr) {
  // A task per row, its heads together, when there are rows enough for every thread; else a
  // task per (row, head), so one sequence's heads spread over the threads. Either way each
  // head's result is the same.
  // Tasks go to the threads round-robin: a prefill's rows run over ever longer contexts, so
  // contiguous ranges would leave the last thread with most of the work (3/4 of it over two).
  const int64_t threads = at::get_num_threads();
  const bool per_head = decode.count < threads;
  const int64_t per_task = per_head ? 1 : heads;
  const int64_t tasks = decode.count * heads / per_task;
  at::parallel_for(0, std::min(threads, tasks), 1, [&](int64_t begin, int64_t end) {
    AttendScratch scratch;
    for (int64_t first_task = begin; first_task < end; ++first_task) {
      for (int64_t task = first_task; task < tasks; task += threads) {
        const int64_t r = task * per_task / heads, h0 = task * per_task % heads;
        attend_heads(q_data, heads, dim, cache, decode, softmax_scale, sinks, r, h0,
                     h0 + per_task, scratch, out_data);
      }
    }
  });
}

}  // namespace metrale_native
