// Activations written as two int8 digits per value, as metrale_kernels.int8_matmul.two_digit_rows
// writes them: x ~ s * (first + second / 254), s = max|x| / 127 (the int8 and q4 products').
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace metrale_native {

constexpr float kInt8Max = 127.f;
constexpr float kDigitBase = 2.f * kInt8Max;
// The least max|x| a row is scaled by: 127 / it stays finite, so a zero row writes zeros.
constexpr float kMinAmax = 0x1p-100f;

// One row of `width` values into its two digit rows; returns the row's scale s. `given_amax`
// (>= 0) is the max|x| of the whole row when these values are only a rank's slice of it.
inline float write_two_digits(const float* row, int64_t width, int8_t* first, int8_t* second,
                              float given_amax = -1.f) {
  float amax = given_amax;
  if (amax < 0.f) {
    amax = 0.f;
    for (int64_t i = 0; i < width; ++i) amax = std::max(amax, std::fabs(row[i]));
  }
  amax = std::max(amax, kMinAmax);
  const float step = kInt8Max / amax;
  for (int64_t i = 0; i < width; ++i) {
    const float steps = row[i] * step;
    const float rounded = std::nearbyint(steps);
    first[i] = static_cast<int8_t>(rounded);
    second[i] = static_cast<int8_t>(std::nearbyint((steps - rounded) * kDigitBase));
  }
  return amax / kInt8Max;
}

}  // namespace metrale_native
