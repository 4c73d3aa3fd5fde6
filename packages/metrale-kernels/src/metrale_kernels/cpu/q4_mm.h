// The q4 product the native ops share: float32 x (M, K), written as two int8 digits, times a q4
// matrix (packed uint8 (N / 16, K / 32, 256), scales float16 (N / 16, K / 32, 2, 16)) -> float32
// (M, N), bias added. `row_amax` float32 (M,): each row's max|x| over the whole row, when x holds
// only a rank's columns of it (tensor parallelism); absent, x's own.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/Optional.h>

namespace metrale_native {

// A linear layer's weight is q4 (uint8 nibbles) rather than int8 with per-row scales.
bool is_q4_weight(const at::Tensor& w);

at::Tensor q4_linear(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& scales,
                     const c10::optional<at::Tensor>& bias,
                     const c10::optional<at::Tensor>& row_amax = c10::nullopt);

}  // namespace metrale_native
