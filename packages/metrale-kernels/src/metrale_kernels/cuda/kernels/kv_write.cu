// The KV-cache write by slot: one block per token copies its key and value heads into
// slot ``slot_mapping[t]`` of the caches (num_blocks * block_size, kv_heads, head_dim), dense.
// Inputs are strided by token and head; a negative slot is skipped (a padding token).

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

#define DEFINE_KV_WRITE(SUFFIX, T)                                                          \
    extern "C" __global__ void write_kv_##SUFFIX(                                           \
        T* k_cache, T* v_cache, const T* key, const T* value, const long long* slot_mapping, \
        int num_kv_heads, int head_dim, long long key_stride, long long key_head_stride,    \
        long long value_stride, long long value_head_stride) {                              \
        write_kv<T>(k_cache, v_cache, key, value, slot_mapping, num_kv_heads, head_dim,     \
                    key_stride, key_head_stride, value_stride, value_head_stride);          \
    }

DEFINE_KV_WRITE(f32, float)
DEFINE_KV_WRITE(f16, half_t)
DEFINE_KV_WRITE(bf16, bf16_t)
