// metrale::int8_qkv_step and metrale::int8_output_step: a dense llama-family layer's two
// segments around paged attention, for int8 or q4 weights (each projection either) and float32
// activations, each one call.
//
// They compute what metrale_model_arch's layer_qkv and layer_output compute with the
// reference ops (RMSNorm, activations in two int8 digits through the exact int8 product,
// rotary, SiLU-and-mul, residuals), with each row's arithmetic fixed by that row alone. One
// call per segment replaces ~50 dispatched ops (or a torch.compile'd graph's guards and
// wrapper, ~80 us per call at batch 1).
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <torch/library.h>

#include <c10/util/Optional.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <tuple>

#include "decode_attention.h"
#include "int8_mm.h"
#include "q4_mm.h"
#include "two_digits.h"
#include "vec_math.h"

namespace {

using metrale_native::kDigitBase;

// Rows per task of the per-row loops: one token's work is a few microseconds.
constexpr int64_t kRowGrain = 16;

void check_activations(const at::Tensor& x, const char* name) {
  TORCH_CHECK(x.scalar_type() == at::kFloat && x.dim() == 2 && x.is_contiguous(), name,
              ": float32 contiguous (tokens, features)");
}

void check_int8_weight(const at::Tensor& w, const at::Tensor& scale, int64_t in_features) {
  TORCH_CHECK(w.scalar_type() == at::kChar && w.is_contiguous() && w.dim() == 2 &&
                  w.size(1) == in_features,
              "int8 weight (out, in) contiguous with in = ", in_features);
  TORCH_CHECK(scale.scalar_type() == at::kFloat && scale.numel() == w.size(0),
              "one float32 scale per output row");
}

// out = weight * x * rsqrt(mean(x^2) + eps), row by row.
void rms_norm_rows(const float* x, const float* weight, float eps, float* out, int64_t rows,
                   int64_t width) {
  at::parallel_for(0, rows, kRowGrain, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float* row = x + r * width;
      const float mean = metrale_native::dot(row, row, width) / static_cast<float>(width);
      const float inverse = 1.f / std::sqrt(mean + eps);
      for (int64_t i = 0; i < width; ++i) out[r * width + i] = weight[i] * (row[i] * inverse);
    }
  });
}

// y = x @ W.T (+ bias), x written as two int8 digits per value (int8_matmul.two_digit_rows);
// W int8 with a float32 scale per row, or q4 (uint8 nibbles, float16 block scales: q4_mm.h).
at::Tensor linear(const at::Tensor& x, const at::Tensor& w, const at::Tensor& scale,
                  const c10::optional<at::Tensor>& bias) {
  if (metrale_native::is_q4_weight(w)) return metrale_native::q4_linear(x, w, scale, bias);
  const int64_t rows = x.size(0), width = x.size(1), out_features = w.size(0);
  check_int8_weight(w, scale, width);
  at::Tensor digits = at::empty({2 * rows, width}, x.options().dtype(at::kChar));
  at::Tensor x_scale = at::empty({rows}, x.options());
  const float* x_data = x.data_ptr<float>();
  int8_t* d_data = digits.data_ptr<int8_t>();
  float* s_data = x_scale.data_ptr<float>();
  at::parallel_for(0, rows, kRowGrain, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r)
      s_data[r] = metrale_native::write_two_digits(x_data + r * width, width,
                                                   d_data + r * width,
                                                   d_data + (rows + r) * width);
  });
  const at::Tensor sums = metrale_native::int8_mm(digits, w);
  at::Tensor out = at::empty({rows, out_features}, x.options());
  const int32_t* acc = sums.data_ptr<int32_t>();
  const float* w_scale = scale.data_ptr<float>();
  const float* b = bias.has_value() ? bias->data_ptr<float>() : nullptr;
  float* y = out.data_ptr<float>();
  at::parallel_for(0, rows, kRowGrain, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const int32_t* first = acc + r * out_features;
      const int32_t* second = acc + (rows + r) * out_features;
      for (int64_t n = 0; n < out_features; ++n) {
        float value = (static_cast<float>(second[n]) * (1.f / kDigitBase) +
                       static_cast<float>(first[n])) *
                      w_scale[n] * s_data[r];
        if (b != nullptr) value += b[n];
        y[r * out_features + n] = value;
      }
    }
  });
  return out;
}

// Rotate heads [0, heads) of each row of x (row stride `stride`) by the row's position, the
// half-rotation ("neox") layout: cos in the table's first half, sin in its second.
void rotate(float* x, int64_t rows, int64_t stride, int64_t heads, int64_t head_dim,
            const int64_t* positions, const float* table, int64_t table_rows) {
  const int64_t half = head_dim / 2;
  for (int64_t r = 0; r < rows; ++r) {
    TORCH_CHECK(positions[r] >= 0 && positions[r] < table_rows, "position ", positions[r],
                " is outside the rotary table");
    const float* cos = table + positions[r] * head_dim;
    const float* sin = cos + half;
    for (int64_t h = 0; h < heads; ++h) {
      float* v = x + r * stride + h * head_dim;
      for (int64_t i = 0; i < half; ++i) {
        const float a = v[i], b = v[i + half];
        v[i] = a * cos[i] + (-b) * sin[i];
        v[i + half] = b * cos[i] + a * sin[i];
      }
    }
  }
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> int8_qkv_step(
    const at::Tensor& hidden, const at::Tensor& norm_weight, double eps, const at::Tensor& qkv_w,
    const at::Tensor& qkv_scale, const c10::optional<at::Tensor>& qkv_bias,
    const at::Tensor& positions, const at::Tensor& cos_sin, int64_t num_heads,
    int64_t num_kv_heads, int64_t head_dim) {
  check_activations(hidden, "int8_qkv_step: hidden");
  TORCH_CHECK(positions.scalar_type() == at::kLong && positions.numel() == hidden.size(0),
              "int8_qkv_step: one int64 position per token");
  TORCH_CHECK(cos_sin.scalar_type() == at::kFloat && cos_sin.is_contiguous() &&
                  cos_sin.size(1) == head_dim && head_dim % 2 == 0,
              "int8_qkv_step: a float32 (positions, head_dim) rotary table");
  const int64_t rows = hidden.size(0), width = hidden.size(1);
  const int64_t q_size = num_heads * head_dim, kv_size = num_kv_heads * head_dim;
  const int64_t qkv_rows = metrale_native::is_q4_weight(qkv_w) ? qkv_w.size(0) * 16 : qkv_w.size(0);
  TORCH_CHECK(qkv_rows == q_size + 2 * kv_size, "int8_qkv_step: q, k and v rows");
  at::Tensor normed = at::empty_like(hidden);
  rms_norm_rows(hidden.data_ptr<float>(), norm_weight.data_ptr<float>(), static_cast<float>(eps),
                normed.data_ptr<float>(), rows, width);
  at::Tensor qkv = linear(normed, qkv_w, qkv_scale, qkv_bias);
  const at::Tensor positions_c = positions.contiguous();
  float* data = qkv.data_ptr<float>();
  const int64_t stride = q_size + 2 * kv_size;
  // q's heads, then k's (right after them in the row); v is not rotated.
  rotate(data, rows, stride, num_heads + num_kv_heads, head_dim, positions_c.data_ptr<int64_t>(),
         cos_sin.data_ptr<float>(), cos_sin.size(0));
  at::Tensor q = qkv.narrow(1, 0, q_size).view({rows, num_heads, head_dim});
  at::Tensor k = qkv.narrow(1, q_size, kv_size).view({rows, num_kv_heads, head_dim});
  at::Tensor v = qkv.narrow(1, q_size + kv_size, kv_size).view({rows, num_kv_heads, head_dim});
  return {q, k, v};
}

at::Tensor int8_output_step(const at::Tensor& hidden, const at::Tensor& attended,
                            const at::Tensor& o_w, const at::Tensor& o_scale,
                            const c10::optional<at::Tensor>& o_bias, const at::Tensor& norm_weight,
                            double eps, const at::Tensor& gate_up_w,
                            const at::Tensor& gate_up_scale,
                            const c10::optional<at::Tensor>& gate_up_bias,
                            const at::Tensor& down_w, const at::Tensor& down_scale,
                            const c10::optional<at::Tensor>& down_bias) {
  check_activations(hidden, "int8_output_step: hidden");
  const int64_t rows = hidden.size(0), width = hidden.size(1);
  const at::Tensor attended_rows = attended.reshape({rows, -1}).contiguous();
  check_activations(attended_rows, "int8_output_step: attended");
  // hidden + o_proj(attended), normed.
  at::Tensor summed = linear(attended_rows, o_w, o_scale, o_bias);
  float* s = summed.data_ptr<float>();
  const float* h = hidden.data_ptr<float>();
  for (int64_t i = 0; i < rows * width; ++i) s[i] = s[i] + h[i];
  at::Tensor normed = at::empty_like(summed);
  rms_norm_rows(s, norm_weight.data_ptr<float>(), static_cast<float>(eps), normed.data_ptr<float>(),
                rows, width);
  // silu(gate) * up, then down_proj, then the residual.
  const at::Tensor gate_up = linear(normed, gate_up_w, gate_up_scale, gate_up_bias);
  const int64_t inter = gate_up.size(1) / 2;
  at::Tensor act = at::empty({rows, inter}, hidden.options());
  const float* gu = gate_up.data_ptr<float>();
  float* a = act.data_ptr<float>();
  at::parallel_for(0, rows, kRowGrain, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      float* out_row = a + r * inter;
      const float* gate = gu + r * 2 * inter;
      for (int64_t i = 0; i < inter; ++i) out_row[i] = -gate[i];
      metrale_native::exp_in_place(out_row, inter);  // e^-gate
      for (int64_t i = 0; i < inter; ++i)
        out_row[i] = gate[i] / (1.f + out_row[i]) * gate[i + inter];
    }
  });
  at::Tensor out = linear(act, down_w, down_scale, down_bias);
  float* o = out.data_ptr<float>();
  for (int64_t i = 0; i < rows * width; ++i) o[i] = s[i] + o[i];
  return out;
}

// A decode-only step's whole layer: token t is sequence t's one query. q/k/v, then k and v
// written to their slots, attention over each sequence's cached keys, then the output segment.
at::Tensor int8_decode_layer(
    const at::Tensor& hidden, const at::Tensor& positions, const at::Tensor& cos_sin,
    const at::Tensor& input_norm, double eps, const at::Tensor& qkv_w, const at::Tensor& qkv_scale,
    const c10::optional<at::Tensor>& qkv_bias, int64_t num_heads, int64_t num_kv_heads,
    int64_t head_dim, const at::Tensor& k_cache, const at::Tensor& v_cache,
    const at::Tensor& slot_mapping, const at::Tensor& block_tables, const at::Tensor& seq_lens,
    int64_t sliding_window, double scale, const at::Tensor& o_w, const at::Tensor& o_scale,
    const c10::optional<at::Tensor>& o_bias, const at::Tensor& post_norm,
    const at::Tensor& gate_up_w, const at::Tensor& gate_up_scale,
    const c10::optional<at::Tensor>& gate_up_bias, const at::Tensor& down_w,
    const at::Tensor& down_scale, const c10::optional<at::Tensor>& down_bias) {
  const int64_t rows = hidden.size(0);
  TORCH_CHECK(v_cache.sizes() == k_cache.sizes() && v_cache.scalar_type() == k_cache.scalar_type() &&
                  k_cache.dim() == 4 && k_cache.size(2) == num_kv_heads,
              "int8_decode_layer: alike caches (blocks, block_size, kv_heads, row)");
  const metrale_native::CacheRows k_rows_of = metrale_native::cache_rows(k_cache, head_dim, "int8_decode_layer");
  const metrale_native::CacheRows v_rows_of = metrale_native::cache_rows(v_cache, head_dim, "int8_decode_layer");
  TORCH_CHECK(slot_mapping.scalar_type() == at::kLong && slot_mapping.is_contiguous() &&
                  slot_mapping.numel() == rows && seq_lens.scalar_type() == at::kLong &&
                  seq_lens.is_contiguous() && seq_lens.numel() == rows &&
                  block_tables.scalar_type() == at::kLong && block_tables.dim() == 2 &&
                  block_tables.size(0) >= rows && block_tables.stride(1) == 1,
              "int8_decode_layer: one slot, one length and one block table per token (int64)");
  auto [q, k, v] = int8_qkv_step(hidden, input_norm, eps, qkv_w, qkv_scale, qkv_bias, positions,
                                 cos_sin, num_heads, num_kv_heads, head_dim);
  const int64_t row_stride = k.stride(0), row_bytes = k_rows_of.row_bytes();
  const int64_t num_slots = k_cache.size(0) * k_cache.size(1);
  const int64_t* slots = slot_mapping.data_ptr<int64_t>();
  uint8_t* kc = static_cast<uint8_t*>(k_cache.data_ptr());
  uint8_t* vc = static_cast<uint8_t*>(v_cache.data_ptr());
  const float* k_rows = k.data_ptr<float>();
  const float* v_rows = v.data_ptr<float>();
  for (int64_t t = 0; t < rows; ++t) {
    TORCH_CHECK(slots[t] >= 0 && slots[t] < num_slots, "int8_decode_layer: slot ", slots[t],
                " is outside the cache");
    for (int64_t h = 0; h < num_kv_heads; ++h) {
      const int64_t offset = (slots[t] * num_kv_heads + h) * row_bytes;
      metrale_native::store_row(k_rows + t * row_stride + h * head_dim, head_dim, k_rows_of.format, kc + offset);
      metrale_native::store_row(v_rows + t * row_stride + h * head_dim, head_dim, v_rows_of.format, vc + offset);
    }
  }
  const at::Tensor queries = q.contiguous();
  at::Tensor attended = at::empty({rows, num_heads, head_dim}, hidden.options());
  const metrale_native::PagedCache cache{k_rows_of, v_rows_of, k_cache.size(1), num_kv_heads};
  const metrale_native::DecodeRows decode{rows,
                                          nullptr,
                                          nullptr,
                                          block_tables.data_ptr<int64_t>(),
                                          block_tables.stride(0),
                                          block_tables.size(1),
                                          seq_lens.data_ptr<int64_t>(),
                                          nullptr,
                                          sliding_window};
  metrale_native::decode_attention(queries.data_ptr<float>(), num_heads, head_dim, cache, decode,
                                   static_cast<float>(scale), attended.data_ptr<float>());
  return int8_output_step(hidden, attended, o_w, o_scale, o_bias, post_norm, eps, gate_up_w,
                          gate_up_scale, gate_up_bias, down_w, down_scale, down_bias);
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(metrale, m) {
  m.def(
      "int8_qkv_step(Tensor hidden, Tensor norm_weight, float eps, Tensor qkv_w, Tensor qkv_scale, "
      "Tensor? qkv_bias, Tensor positions, Tensor cos_sin, int num_heads, int num_kv_heads, "
      "int head_dim) -> (Tensor, Tensor, Tensor)");
  m.def(
      "int8_output_step(Tensor hidden, Tensor attended, Tensor o_w, Tensor o_scale, "
      "Tensor? o_bias, Tensor norm_weight, float eps, Tensor gate_up_w, Tensor gate_up_scale, "
      "Tensor? gate_up_bias, Tensor down_w, Tensor down_scale, Tensor? down_bias) -> Tensor");
  m.def(
      "int8_decode_layer(Tensor hidden, Tensor positions, Tensor cos_sin, Tensor input_norm, "
      "float eps, Tensor qkv_w, Tensor qkv_scale, Tensor? qkv_bias, int num_heads, "
      "int num_kv_heads, int head_dim, Tensor(a!) k_cache, Tensor(b!) v_cache, "
      "Tensor slot_mapping, Tensor block_tables, Tensor seq_lens, int sliding_window, "
      "float scale, Tensor o_w, Tensor o_scale, Tensor? o_bias, Tensor post_norm, "
      "Tensor gate_up_w, Tensor gate_up_scale, Tensor? gate_up_bias, Tensor down_w, "
      "Tensor down_scale, Tensor? down_bias) -> Tensor");
  m.impl("int8_qkv_step", c10::DispatchKey::CPU, TORCH_FN(int8_qkv_step));
  m.impl("int8_decode_layer", c10::DispatchKey::CPU, TORCH_FN(int8_decode_layer));
  m.impl("int8_output_step", c10::DispatchKey::CPU, TORCH_FN(int8_output_step));
}
