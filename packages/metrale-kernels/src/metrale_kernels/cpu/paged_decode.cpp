// metrale::paged_decode: attention for decode rows (one query token each) over a paged K/V
// cache (float32, or quantized: kv_cache.h), read in place: no gathered copy of the context,
// no padding, no mask; optionally a sink logit per query head (gpt-oss) in each softmax.
// The kernel is decode_attention.h's: one task per row, each visible key read once, a row's
// result fixed by its own context alone.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "decode_attention.h"

namespace {

void paged_decode(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                  const at::Tensor& rows, const at::Tensor& seqs, const at::Tensor& block_tables,
                  const at::Tensor& seq_lens, const at::Tensor& first_keys, double scale,
                  const at::Tensor& out, const c10::optional<at::Tensor>& sinks) {
  TORCH_CHECK(q.dim() == 3 && k_cache.dim() == 4 && v_cache.sizes() == k_cache.sizes() &&
                  v_cache.scalar_type() == k_cache.scalar_type(),
              "paged_decode: q (tokens, heads, dim), alike caches (blocks, block_size, kv_heads, row)");
  TORCH_CHECK(q.scalar_type() == at::kFloat && out.scalar_type() == at::kFloat,
              "paged_decode: float32 q and out");
  TORCH_CHECK(q.is_contiguous() && out.is_contiguous() && out.sizes() == q.sizes(),
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
  TORCH_CHECK(heads % kv_heads == 0, "paged_decode: head shapes");
  const int64_t num_rows = rows.size(0);
  const int64_t table_width = block_tables.size(1), table_stride = block_tables.stride(0);
  const float* q_data = q.data_ptr<float>();
  float* out_data = out.data_ptr<float>();
  const int64_t* row_data = rows.data_ptr<int64_t>();
  const int64_t* seq_data = seqs.data_ptr<int64_t>();
  const int64_t* table_data = block_tables.data_ptr<int64_t>();
  const int64_t* len_data = seq_lens.data_ptr<int64_t>();
  const int64_t* first_data = first_keys.data_ptr<int64_t>();
  const float softmax_scale = static_cast<float>(scale);
  const float* sink_data = nullptr;
  if (sinks.has_value()) {
    TORCH_CHECK(sinks->scalar_type() == at::kFloat && sinks->is_contiguous() && sinks->dim() == 1 &&
                    sinks->size(0) == heads,
                "paged_decode: sinks are (heads,) contiguous float32");
    sink_data = sinks->data_ptr<float>();
  }

  const metrale_native::PagedCache cache{metrale_native::cache_rows(k_cache, dim, "paged_decode"),
                                         metrale_native::cache_rows(v_cache, dim, "paged_decode"),
                                         block_size, kv_heads};
  const metrale_native::DecodeRows decode{num_rows,   row_data,  seq_data,   table_data,
                                          table_stride, table_width, len_data, first_data, 0};
  metrale_native::decode_attention(q_data, heads, dim, cache, decode, softmax_scale, out_data,
                                   sink_data);
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(metrale, m) {
  m.def(
      "paged_decode(Tensor q, Tensor k_cache, Tensor v_cache, Tensor rows, Tensor seqs, "
      "Tensor block_tables, Tensor seq_lens, Tensor first_keys, float scale, Tensor(a!) out, "
      "Tensor? sinks=None) -> ()");
  m.impl("paged_decode", c10::DispatchKey::CPU, TORCH_FN(paged_decode));
}
