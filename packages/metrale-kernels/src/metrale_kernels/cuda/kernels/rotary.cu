// Rotary embedding, half-rotation ("neox") layout, one block per token. ``cos_sin`` is
// (max_positions, head_dim) float32: cos in the first half, sin in the second. Each op is
// rounded to the activations' dtype as the reference does: out = round(round(x * c) +
// round(rotated * s)) with c, s rounded first. Inputs are strided, outputs dense.

template <typename T>
__device__ void rotate_heads(
    T* out, const T* x, int num_heads, long long head_stride, int head_dim,
    const float* angles) {
    const int half = head_dim / 2;
    for (int e = threadIdx.x; e < num_heads * half; e += blockDim.x) {
        const int head = e / half;
        const int i = e - head * half;
        const T* src = x + head * head_stride;
        T* dst = out + head * head_dim;
        const float c = round_to<T>(angles[i]);
        const float s = round_to<T>(angles[half + i]);
        const float lo = to_float(src[i]);
        const float hi = to_float(src[half + i]);
        dst[i] = from_float<T>(round_to<T>(lo * c) + round_to<T>(-hi * s));
        dst[half + i] = from_float<T>(round_to<T>(hi * c) + round_to<T>(lo * s));
    }
}

template <typename T>
__device__ void rotary(
    T* q_out, T* k_out, const T* q, const T* k, const long long* positions,
    const float* cos_sin, int num_heads, int num_kv_heads, int head_dim, long long q_stride,
    long long q_head_stride, long long k_stride, long long k_head_stride) {
    const long long token = blockIdx.x;
    const float* angles = cos_sin + positions[token] * head_dim;
    rotate_heads(q_out + token * num_heads * head_dim, q + token * q_stride, num_heads,
                 q_head_stride, head_dim, angles);
    rotate_heads(k_out + token * num_kv_heads * head_dim, k + token * k_stride, num_kv_heads,
                 k_head_stride, head_dim, angles);
}

#define DEFINE_ROTARY(SUFFIX, T)                                                            \
    extern "C" __global__ void rotary_##SUFFIX(                                             \
        T* q_out, T* k_out, const T* q, const T* k, const long long* positions,             \
        const float* cos_sin, int num_heads, int num_kv_heads, int head_dim,                \
        long long q_stride, long long q_head_stride, long long k_stride,                    \
        long long k_head_stride) {                                                          \
        rotary<T>(q_out, k_out, q, k, positions, cos_sin, num_heads, num_kv_heads,          \
                  head_dim, q_stride, q_head_stride, k_stride, k_head_stride);              \
    }

DEFINE_ROTARY(f32, float)
DEFINE_ROTARY(f16, half_t)
DEFINE_ROTARY(bf16, bf16_t)
