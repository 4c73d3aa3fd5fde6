// SiLU-and-mul: out[r, i] = round(round(silu(x[r, i])) * x[r, d + i]) for x (rows, 2d), as the
// reference computes it op by op in the activations' dtype. ``x`` rows are ``row_stride`` apart.

template <typename T>
__device__ void silu_and_mul(T* out, const T* x, long long rows, int d, long long row_stride) {
    const long long total = rows * d;
    for (long long e = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; e < total;
         e += static_cast<long long>(gridDim.x) * blockDim.x) {
        const long long row = e / d;
        const int i = static_cast<int>(e - row * d);
        const float gate = to_float(x[row * row_stride + i]);
        const float up = to_float(x[row * row_stride + d + i]);
        const float activated = round_to<T>(gate / (1.0f + expf(-gate)));
        out[e] = from_float<T>(activated * up);
    }
}

#define DEFINE_ACTIVATION(SUFFIX, T)                                                        \
    extern "C" __global__ void silu_and_mul_##SUFFIX(                                       \
        T* out, const T* x, long long rows, int d, long long row_stride) {                  \
        silu_and_mul<T>(out, x, rows, d, row_stride);                                       \
    }

DEFINE_ACTIVATION(f32, float)
DEFINE_ACTIVATION(f16, half_t)
DEFINE_ACTIVATION(bf16, bf16_t)
