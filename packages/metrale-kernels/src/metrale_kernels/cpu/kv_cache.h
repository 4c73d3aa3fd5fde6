// A paged K/V cache as the native ops read and write it: float32, or quantized (int8, fp8
// e4m3 or e5m2 values, each (slot, kv head) row followed by its float16 scale's two bytes; the
// layout and quantization of metrale_kernels.reference.kv_quantization, byte for byte; an int8
// row's dot product is scaled after its sum, so it differs from the reference's, which scales
// each value first, by float32 rounding).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>
#include <c10/util/Float8_e4m3fn.h>
#include <c10/util/Float8_e5m2.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "vec_math.h"

namespace metrale_native {

constexpr int64_t kScaleBytes = 2;

enum class KvFormat { kFloat, kInt8, kFp8E4m3, kFp8E5m2 };

inline KvFormat kv_format(const at::Tensor& cache) {
  switch (cache.scalar_type()) {
    case at::kFloat: return KvFormat::kFloat;
    case at::kChar: return KvFormat::kInt8;
    case at::kFloat8_e4m3fn: return KvFormat::kFp8E4m3;
    case at::kFloat8_e5m2: return KvFormat::kFp8E5m2;
    default: TORCH_CHECK(false, "a K/V cache of ", cache.scalar_type(), " is not float32, int8 or fp8");
  }
}

// The stored magnitude a row's amax maps to (kv_quantization.QMAX).
inline float qmax(KvFormat format) { return format == KvFormat::kInt8 ? 127.f : 448.f; }

// Each fp8 code's value as a float.
inline std::array<float, 256> fp8_values(KvFormat format) {
  std::array<float, 256> values{};
  for (int b = 0; b < 256; ++b) {
    const uint8_t bits = static_cast<uint8_t>(b);
    values[b] = format == KvFormat::kFp8E4m3
                    ? static_cast<float>(c10::Float8_e4m3fn(bits, c10::Float8_e4m3fn::from_bits()))
                    : static_cast<float>(c10::Float8_e5m2(bits, c10::Float8_e5m2::from_bits()));
  }
  return values;
}

// One paged cache (K or V): `kv_heads` rows a slot, each `dim` values (+ the scale when quantized).
// Quantized rows are read in registers (int8 converted, fp8 decoded by its bits): the row's dot
// product, then its scale.
struct CacheRows {
  const uint8_t* data;
  KvFormat format;
  int64_t dim, kv_heads;
  const float* values;  // fp8_values(format), for the tails; unused for float32 and int8

  int64_t row_bytes() const {
    return format == KvFormat::kFloat ? dim * 4 : dim + kScaleBytes;
  }
  const uint8_t* row(int64_t slot, int64_t kv_head) const {
    return data + (slot * kv_heads + kv_head) * row_bytes();
  }
  float scale(const uint8_t* row) const {
    c10::Half half;
    std::memcpy(&half, row + dim, kScaleBytes);
    return static_cast<float>(half);
  }
  // q . (the row of `kv_head` at `slot`)
  float dot_row(const float* q, int64_t slot, int64_t kv_head) const {
    const uint8_t* r = row(slot, kv_head);
    switch (format) {
      case KvFormat::kFloat: return dot(q, reinterpret_cast<const float*>(r), dim);
      case KvFormat::kInt8: return dot_i8(q, reinterpret_cast<const int8_t*>(r), dim) * scale(r);
      default: return dot_fp8(q, r, format == KvFormat::kFp8E4m3, values, dim) * scale(r);
    }
  }
  // acc += p * (the row of `kv_head` at `slot`)
  void add_row(float p, int64_t slot, int64_t kv_head, float* acc) const {
    const uint8_t* r = row(slot, kv_head);
    switch (format) {
      case KvFormat::kFloat: axpy(p, reinterpret_cast<const float*>(r), acc, dim); break;
      case KvFormat::kInt8: axpy_i8(p * scale(r), reinterpret_cast<const int8_t*>(r), acc, dim); break;
      default: axpy_fp8(p * scale(r), r, format == KvFormat::kFp8E4m3, values, acc, dim);
    }
  }
};

inline const float* fp8_value_table(KvFormat format) {
  static const std::array<float, 256> e4m3 = fp8_values(KvFormat::kFp8E4m3);
  static const std::array<float, 256> e5m2 = fp8_values(KvFormat::kFp8E5m2);
  switch (format) {
    case KvFormat::kFp8E4m3: return e4m3.data();
    case KvFormat::kFp8E5m2: return e5m2.data();
    default: return nullptr;
  }
}

// `cache` (blocks, block_size, kv_heads, dim, or dim + kScaleBytes when quantized), checked.
inline CacheRows cache_rows(const at::Tensor& cache, int64_t dim, const char* op) {
  const KvFormat format = kv_format(cache);
  TORCH_CHECK(cache.dim() == 4 && cache.is_contiguous(), op,
              ": contiguous caches (blocks, block_size, kv_heads, row)");
  const int64_t row = format == KvFormat::kFloat ? dim : dim + kScaleBytes;
  TORCH_CHECK(cache.size(3) == row, op, ": cache rows of ", cache.size(3), " values for head dim ",
              dim, format == KvFormat::kFloat ? "" : " (+ 2 scale bytes)");
  return CacheRows{static_cast<const uint8_t*>(cache.data_ptr()), format, dim, cache.size(2),
                   fp8_value_table(format)};
}

// `x` (dim floats) into its row of a cache of `format` at `out`.
inline void store_row(const float* x, int64_t dim, KvFormat format, uint8_t* out) {
  if (format == KvFormat::kFloat) {
    std::memcpy(out, x, dim * sizeof(float));
    return;
  }
  const float limit = qmax(format);
  float amax = 0.f;
  for (int64_t d = 0; d < dim; ++d) amax = std::max(amax, std::fabs(x[d]));
  const c10::Half half(amax / limit);
  const float scale = static_cast<float>(half);
  const float divisor = scale > 0.f ? scale : 1.f;
  for (int64_t d = 0; d < dim; ++d) {
    const float scaled = std::min(std::max(x[d] / divisor, -limit), limit);
    if (format == KvFormat::kInt8) {
      out[d] = static_cast<uint8_t>(static_cast<int8_t>(std::nearbyint(scaled)));
    } else if (format == KvFormat::kFp8E4m3) {
      out[d] = c10::Float8_e4m3fn(scaled).x;
    } else {
      out[d] = c10::Float8_e5m2(scaled).x;
    }
  }
  std::memcpy(out + dim, &half, kScaleBytes);
}

}  // namespace metrale_native
