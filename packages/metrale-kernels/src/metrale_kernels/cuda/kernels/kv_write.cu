// The KV-cache write by slot: one block per token copies its key and value heads into
// slot ``slot_mapping[t]`` of the caches (num_blocks * block_size, kv_heads, head_dim), dense.
// Inputs are strided by token and head; a negative slot is skipped (a padding token).
// ``write_kv_<format>_<dtype>`` quantizes into a cache of rows ``head_dim + KV_SCALE_BYTES``
// bytes (kv_quantization.cuh), one warp per (token, head) row.

template <typename T>
__device__ void write_kv(
    T* k_cache, T* v_cache, const T* key, const T* value, const long long* slot_mapping,
    int num_kv_heads, int head_dim, long long key_stride, long long key_head_stride,
    long long value_stride, long long value_head_stride) {
    const long long token = blockIdx.x;
    const long long slot = slot_mapping[token];
    if (slot < 0) {
        return;
    }
    const int width = num_kv_heads * head_dim;
    T* k_dst = k_cache + slot * width;
    T* v_dst = v_cache + slot * width;
    for (int e = threadIdx.x; e < width; e += blockDim.x) {
        const int head = e / head_dim;
        const int i = e - head * head_dim;
        k_dst[e] = key[token * key_stride + head * key_head_stride + i];
        v_dst[e] = value[token * value_stride + head * value_head_stride + i];
    }
}

// One warp: ``src`` (head_dim values) quantized into the row at ``dst``.
template <typename T, typename F>
__device__ __forceinline__ void write_quantized_row(
    unsigned char* dst, const T* src, int head_dim) {
    const int lane = threadIdx.x & 31;
    float amax = 0.0f;
    for (int d = lane; d < head_dim; d += 32) {
        amax = fmaxf(amax, fabsf(to_float(src[d])));
    }
    const half_t scale = kv_row_scale<F>(warp_max(amax));
    for (int d = lane; d < head_dim; d += 32) {
        dst[d] = kv_quantize<F>(to_float(src[d]), scale);
    }
    if (lane == 0) {
        dst[head_dim] = static_cast<unsigned char>(scale.bits & 0xff);
        dst[head_dim + 1] = static_cast<unsigned char>(scale.bits >> 8);
    }
}

template <typename T, typename F>
__device__ void write_kv_quantized(
    unsigned char* k_cache, unsigned char* v_cache, const T* key, const T* value,
    const long long* slot_mapping, int num_kv_heads, int head_dim, long long key_stride,
    long long key_head_stride, long long value_stride, long long value_head_stride) {
    const long long token = blockIdx.x;
    const long long slot = slot_mapping[token];
    if (slot < 0) {
        return;
    }
    const long long row_bytes = head_dim + KV_SCALE_BYTES;
    const int num_warps = blockDim.x >> 5;
    // Rows 0 .. kv_heads - 1 are the keys', then the values'; a warp's rows are warp-uniform.
    for (int r = threadIdx.x >> 5; r < 2 * num_kv_heads; r += num_warps) {
        if (r < num_kv_heads) {
            write_quantized_row<T, F>(k_cache + (slot * num_kv_heads + r) * row_bytes,
                                      key + token * key_stride + r * key_head_stride, head_dim);
        } else {
            const int head = r - num_kv_heads;
            write_quantized_row<T, F>(
                v_cache + (slot * num_kv_heads + head) * row_bytes,
                value + token * value_stride + head * value_head_stride, head_dim);
        }
    }
}

#define DEFINE_KV_WRITE(SUFFIX, T)                                                          \
    extern "C" __global__ void write_kv_##SUFFIX(                                           \
        T* k_cache, T* v_cache, const T* key, const T* value, const long long* slot_mapping, \
        int num_kv_heads, int head_dim, long long key_stride, long long key_head_stride,    \
        long long value_stride, long long value_head_stride) {                              \
        write_kv<T>(k_cache, v_cache, key, value, slot_mapping, num_kv_heads, head_dim,     \
                    key_stride, key_head_stride, value_stride, value_head_stride);          \
    }

#define DEFINE_QUANTIZED_KV_WRITE(KV, F, SUFFIX, T)                                         \
    extern "C" __global__ void write_kv_##KV##_##SUFFIX(                                    \
        unsigned char* k_cache, unsigned char* v_cache, const T* key, const T* value,       \
        const long long* slot_mapping, int num_kv_heads, int head_dim, long long key_stride, \
        long long key_head_stride, long long value_stride, long long value_head_stride) {   \
        write_kv_quantized<T, F>(k_cache, v_cache, key, value, slot_mapping, num_kv_heads,  \
                                 head_dim, key_stride, key_head_stride, value_stride,       \
                                 value_head_stride);                                        \
    }

#define DEFINE_QUANTIZED_KV_WRITES(KV, F)             \
    DEFINE_QUANTIZED_KV_WRITE(KV, F, f32, float)      \
    DEFINE_QUANTIZED_KV_WRITE(KV, F, f16, half_t)     \
    DEFINE_QUANTIZED_KV_WRITE(KV, F, bf16, bf16_t)

DEFINE_KV_WRITE(f32, float)
DEFINE_KV_WRITE(f16, half_t)
DEFINE_KV_WRITE(bf16, bf16_t)
DEFINE_QUANTIZED_KV_WRITES(i8, KvInt8)
DEFINE_QUANTIZED_KV_WRITES(e4m3, KvFp8E4m3)
DEFINE_QUANTIZED_KV_WRITES(e5m2, KvFp8E5m2)
