// RMSNorm over the last dim, one block per row, reduced in float32 in a fixed order.
// ``x`` is addressed as (outer, inner, hidden) with element strides; the output is dense.
// As the reference: normed = round(x * rsqrt(mean(x^2) + eps)), out = round(weight * normed).

template <typename T>
__device__ void rms_norm_row(
    T* out, const T* x, const T* weight, int hidden, float eps, float* scratch) {
    float square_sum = 0.0f;
    for (int i = threadIdx.x; i < hidden; i += blockDim.x) {
        const float v = to_float(x[i]);
        square_sum += v * v;
    }
    const float total = block_sum(square_sum, scratch);
    const float inv_rms = 1.0f / sqrtf(total / static_cast<float>(hidden) + eps);
    for (int i = threadIdx.x; i < hidden; i += blockDim.x) {
        const float normed = round_to<T>(to_float(x[i]) * inv_rms);
        out[i] = from_float<T>(to_float(weight[i]) * normed);
    }
}

template <typename T>
__device__ void rms_norm(
    T* out, const T* x, const T* weight, int inner, long long outer_stride,
    long long inner_stride, int hidden, float eps) {
    __shared__ float scratch[32];
    const long long row = blockIdx.x;
    const T* x_row = x + (row / inner) * outer_stride + (row % inner) * inner_stride;
    rms_norm_row(out + row * hidden, x_row, weight, hidden, eps, scratch);
}

// summed = round(x + residual) is written to ``summed`` (which may be ``residual`` itself),
// then normed as above: the residual add of a decoder layer fused with the next norm.
template <typename T>
__device__ void add_rms_norm(
    T* out, T* summed, const T* x, const T* residual, const T* weight, int hidden, float eps) {
    __shared__ float scratch[32];
    const long long offset = static_cast<long long>(blockIdx.x) * hidden;
    for (int i = threadIdx.x; i < hidden; i += blockDim.x) {
        summed[offset + i] =
            from_float<T>(to_float(x[offset + i]) + to_float(residual[offset + i]));
    }
    // Each thread re-reads only the elements it wrote itself: no barrier needed before.
    rms_norm_row(out + offset, summed + offset, weight, hidden, eps, scratch);
}

#define DEFINE_NORMS(SUFFIX, T)                                                              \
    extern "C" __global__ void rms_norm_##SUFFIX(                                            \
        T* out, const T* x, const T* weight, int inner, long long outer_stride,              \
        long long inner_stride, int hidden, float eps) {                                     \
        rms_norm<T>(out, x, weight, inner, outer_stride, inner_stride, hidden, eps);         \
    }                                                                                        \
    extern "C" __global__ void add_rms_norm_##SUFFIX(                                        \
        T* out, T* summed, const T* x, const T* residual, const T* weight, int hidden,       \
        float eps) {                                                                         \
        add_rms_norm<T>(out, summed, x, residual, weight, hidden, eps);                      \
    }

DEFINE_NORMS(f32, float)
DEFINE_NORMS(f16, half_t)
DEFINE_NORMS(bf16, bf16_t)
