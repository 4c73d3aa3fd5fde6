// The exact int8 product the native ops share: a (M, K) int8 times w (N, K) int8 -> int32.
#pragma once

#include <ATen/core/Tensor.h>

namespace metrale_native {

at::Tensor int8_mm(const at::Tensor& a, const at::Tensor& w);

}  // namespace metrale_native
