// Paged attention, one query token per row (a decode row, or one token of a prefill chunk),
// in two passes: ``paged_attention_partial`` attends one split of a row's visible keys for one
// kv head and its whole GQA group, with an online softmax in float32; ``paged_attention_combine``
// merges a row's splits in split order. A row at position ``pos`` sees keys ``lo..pos``
// (``lo = pos - window + 1`` with a sliding window) in splits of ``split_keys``, so the splits
// and every reduction order depend on the row alone, never on the batch around it.
//
// Caches are (num_blocks, block_size, kv_heads, head_dim), dense; only the visible keys'
// slots are read. ``paged_attention_partial_<format>_<dtype>`` reads quantized caches of rows
// ``head_dim + KV_SCALE_BYTES`` bytes (kv_quantization.cuh), dequantized to float32 as a tile
// is loaded: the same keys and values as the reference's dequantized cache. Partials: acc
// (rows, heads, max_splits, head_dim), (max, sum) pairs (rows, heads, max_splits, 2), float32.

#define ATTENTION_THREADS 128
#define ATTENTION_TILE 32  // keys per tile: one per lane of a warp
#define MAX_ACCUMULATORS 16  // (group * head_dim) / ATTENTION_THREADS, at most

__device__ __forceinline__ int first_visible(int pos, int sliding_window) {
    return sliding_window > 0 ? max(0, pos - sliding_window + 1) : 0;
}

__device__ __forceinline__ int num_splits_of(int pos, int sliding_window, int split_keys) {
    const int num_keys = pos + 1 - first_visible(pos, sliding_window);
    return (num_keys + split_keys - 1) / split_keys;
}

// A quantized cache's rows, of format ``F``.
template <typename F>
struct QuantizedCache {
    const unsigned char* rows;
};

// Value ``d`` of the row of ``kv_head`` at ``slot``, as float32.
template <typename T>
__device__ __forceinline__ float cache_value(
    const T* cache, long long slot, int num_kv_heads, int kv_head, int head_dim, int d) {
    return to_float(cache[(slot * num_kv_heads + kv_head) * head_dim + d]);
}

template <typename F>
__device__ __forceinline__ float cache_value(
    QuantizedCache<F> cache, long long slot, int num_kv_heads, int kv_head, int head_dim, int d) {
    const long long row_bytes = head_dim + KV_SCALE_BYTES;
    const unsigned char* row = cache.rows + (slot * num_kv_heads + kv_head) * row_bytes;
    return F::decode(row[d]) * kv_scale_of(row, head_dim);
}

// ``load_tile`` a value at a time (any head_dim, any alignment).
template <typename Cache>
__device__ void load_tile_elements(
    float* tile, Cache cache, const long long* table, int tile_start, int tile_keys,
    int block_size, int num_kv_heads, int kv_head, int head_dim, int stride) {
    for (int e = threadIdx.x; e < ATTENTION_TILE * head_dim; e += ATTENTION_THREADS) {
        const int j = e / head_dim;
        const int d = e - j * head_dim;
        float v = 0.0f;
        if (j < tile_keys) {
            const int key = tile_start + j;
            const long long slot = table[key / block_size] * block_size + key % block_size;
            v = cache_value(cache, slot, num_kv_heads, kv_head, head_dim, d);
        }
        tile[j * stride + d] = v;
    }
}

// Keys ``tile_start .. tile_start + tile_keys - 1`` of one kv head, as float32, rows
// ``stride`` apart; rows past ``tile_keys`` are zeros (their slots are never read). With
// ``vector_loads`` (16-byte aligned caches, head_dim a multiple of 16 bytes' elements) each
// thread reads 16 bytes at a time.
template <typename T>
__device__ void load_tile(
    float* tile, const T* cache, const long long* table, int tile_start, int tile_keys,
    int block_size, int num_kv_heads, int kv_head, int head_dim, int stride, int vector_loads) {
    constexpr int VEC = 16 / sizeof(T);
    if (vector_loads) {
        const int vecs_per_row = head_dim / VEC;
        for (int e = threadIdx.x; e < ATTENTION_TILE * vecs_per_row; e += ATTENTION_THREADS) {
            const int j = e / vecs_per_row;
            const int c = e - j * vecs_per_row;
            float* dst = tile + j * stride + c * VEC;
            if (j < tile_keys) {
                const int key = tile_start + j;
                const long long slot = table[key / block_size] * block_size + key % block_size;
                const uint4 raw = *reinterpret_cast<const uint4*>(
                    cache + (slot * num_kv_heads + kv_head) * head_dim + c * VEC);
                const T* parts = reinterpret_cast<const T*>(&raw);
#pragma unroll
                for (int v = 0; v < VEC; ++v) {
                    dst[v] = to_float(parts[v]);
                }
            } else {
#pragma unroll
                for (int v = 0; v < VEC; ++v) {
                    dst[v] = 0.0f;
                }
            }
        }
        return;
    }
    load_tile_elements(tile, cache, table, tile_start, tile_keys, block_size, num_kv_heads, kv_head,
                       head_dim, stride);
}

// As above, from a quantized cache; with ``pair_loads`` (head_dim even, the cache 2-byte
// aligned) each thread reads two values and the scale a 2-byte load each.
template <typename F>
__device__ void load_tile(
    float* tile, QuantizedCache<F> cache, const long long* table, int tile_start, int tile_keys,
    int block_size, int num_kv_heads, int kv_head, int head_dim, int stride, int pair_loads) {
    const long long row_bytes = head_dim + KV_SCALE_BYTES;
    if (pair_loads) {
        const int pairs_per_row = head_dim / 2;
        for (int e = threadIdx.x; e < ATTENTION_TILE * pairs_per_row; e += ATTENTION_THREADS) {
            const int j = e / pairs_per_row;
            const int c = e - j * pairs_per_row;
            float lo = 0.0f;
            float hi = 0.0f;
            if (j < tile_keys) {
                const int key = tile_start + j;
                const long long slot = table[key / block_size] * block_size + key % block_size;
                const unsigned char* row =
                    cache.rows + (slot * num_kv_heads + kv_head) * row_bytes;
                const unsigned int two = *reinterpret_cast<const unsigned short*>(row + 2 * c);
                const float scale = to_float(*reinterpret_cast<const half_t*>(row + head_dim));
                lo = F::decode(two & 0xffu) * scale;
                hi = F::decode(two >> 8) * scale;
            }
            tile[j * stride + 2 * c] = lo;
            tile[j * stride + 2 * c + 1] = hi;
        }
        return;
    }
    load_tile_elements(tile, cache, table, tile_start, tile_keys, block_size, num_kv_heads, kv_head,
                       head_dim, stride);
}

// ``Cache``: ``const T*`` (a float cache of q's dtype) or ``QuantizedCache<F>``.
template <typename T, typename Cache>
__device__ void paged_attention_partial(
    float* part_acc, float* part_ml, const T* q, Cache k_cache, Cache v_cache,
    const long long* block_tables, long long table_stride, const int* row_seq,
    const int* row_pos, int num_heads, int num_kv_heads, int head_dim, int block_size,
    long long q_stride, long long q_head_stride, float scale, int sliding_window,
    int split_keys, int max_splits, int vector_loads) {
    extern __shared__ float smem[];
    const int group = num_heads / num_kv_heads;
    const int row = blockIdx.x;
    const int kv_head = blockIdx.y;
    const int split = blockIdx.z;
    const int pos = row_pos[row];
    if (split >= num_splits_of(pos, sliding_window, split_keys)) {
        return;
    }
    const int begin = first_visible(pos, sliding_window) + split * split_keys;
    const int end = min(pos + 1, begin + split_keys);
    const long long* table = block_tables + row_seq[row] * table_stride;
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const int stride = head_dim + 1;  // padded: the score loop reads a column per lane
    const int group_dims = group * head_dim;
    float* q_s = smem;                               // (group, head_dim)
    float* kv_s = q_s + group_dims;                  // (TILE, head_dim + 1): K, then V
    float* p_s = kv_s + ATTENTION_TILE * stride;     // (group, TILE): scores, then weights
    float* max_s = p_s + group * ATTENTION_TILE;     // (group,)
    float* sum_s = max_s + group;                    // (group,)
    float* rescale_s = sum_s + group;                // (group,)

    for (int e = threadIdx.x; e < group_dims; e += ATTENTION_THREADS) {
        const int g = e / head_dim;
        const int d = e - g * head_dim;
        q_s[e] = to_float(q[row * q_stride + (kv_head * group + g) * q_head_stride + d]);
    }
    for (int g = threadIdx.x; g < group; g += ATTENTION_THREADS) {
        max_s[g] = negative_infinity();
        sum_s[g] = 0.0f;
    }
    float acc[MAX_ACCUMULATORS];
#pragma unroll
    for (int i = 0; i < MAX_ACCUMULATORS; ++i) {
        acc[i] = 0.0f;
    }
    __syncthreads();

    for (int tile_start = begin; tile_start < end; tile_start += ATTENTION_TILE) {
        const int tile_keys = min(ATTENTION_TILE, end - tile_start);
        load_tile(kv_s, k_cache, table, tile_start, tile_keys, block_size, num_kv_heads,
                  kv_head, head_dim, stride, vector_loads);
        __syncthreads();
        for (int e = threadIdx.x; e < group * ATTENTION_TILE; e += ATTENTION_THREADS) {
            const int g = e / ATTENTION_TILE;
            const int j = e - g * ATTENTION_TILE;
            float score = negative_infinity();
            if (j < tile_keys) {
                float dot = 0.0f;
                for (int d = 0; d < head_dim; ++d) {
                    dot += q_s[g * head_dim + d] * kv_s[j * stride + d];
                }
                score = dot * scale;
            }
            p_s[e] = score;
        }
        __syncthreads();
        // V replaces K while the warps turn scores into weights (different buffers).
        load_tile(kv_s, v_cache, table, tile_start, tile_keys, block_size, num_kv_heads,
                  kv_head, head_dim, stride, vector_loads);
        for (int g = warp; g < group; g += ATTENTION_THREADS / 32) {
            const float score = p_s[g * ATTENTION_TILE + lane];
            const float old_max = max_s[g];
            const float new_max = fmaxf(old_max, warp_max(score));
            const float weight = lane < tile_keys ? expf(score - new_max) : 0.0f;
            const float tile_sum = warp_sum(weight);
            p_s[g * ATTENTION_TILE + lane] = weight;
            if (lane == 0) {
                const float rescale = expf(old_max - new_max);  // 0 on the first tile
                sum_s[g] = sum_s[g] * rescale + tile_sum;
                max_s[g] = new_max;
                rescale_s[g] = rescale;
            }
        }
        __syncthreads();
#pragma unroll
        for (int i = 0; i < MAX_ACCUMULATORS; ++i) {
            const int e = threadIdx.x + i * ATTENTION_THREADS;
            if (e < group_dims) {
                const int g = e / head_dim;
                const int d = e - g * head_dim;
                float a = acc[i] * rescale_s[g];
                for (int j = 0; j < tile_keys; ++j) {
                    a += p_s[g * ATTENTION_TILE + j] * kv_s[j * stride + d];
                }
                acc[i] = a;
            }
        }
        __syncthreads();
    }

    const long long first = (static_cast<long long>(row) * num_heads + kv_head * group) *
                            max_splits + split;
#pragma unroll
    for (int i = 0; i < MAX_ACCUMULATORS; ++i) {
        const int e = threadIdx.x + i * ATTENTION_THREADS;
        if (e < group_dims) {
            const int g = e / head_dim;
            const int d = e - g * head_dim;
            part_acc[(first + static_cast<long long>(g) * max_splits) * head_dim + d] = acc[i];
        }
    }
    for (int g = threadIdx.x; g < group; g += ATTENTION_THREADS) {
        part_ml[(first + static_cast<long long>(g) * max_splits) * 2] = max_s[g];
        part_ml[(first + static_cast<long long>(g) * max_splits) * 2 + 1] = sum_s[g];
    }
}

// One block per (row, head): out = sum_z acc_z e^(m_z - M) / sum_z l_z e^(m_z - M), z in order.
template <typename T>
__device__ void paged_attention_combine(
    T* out, const float* part_acc, const float* part_ml, const int* row_pos, int num_heads,
    int head_dim, int sliding_window, int split_keys, int max_splits, long long out_stride,
    long long out_head_stride) {
    const int row = blockIdx.x;
    const int head = blockIdx.y;
    const int num_splits = num_splits_of(row_pos[row], sliding_window, split_keys);
    const long long first = (static_cast<long long>(row) * num_heads + head) * max_splits;
    float global_max = negative_infinity();
    for (int z = 0; z < num_splits; ++z) {
        global_max = fmaxf(global_max, part_ml[(first + z) * 2]);
    }
    float total = 0.0f;
    for (int z = 0; z < num_splits; ++z) {
        total += part_ml[(first + z) * 2 + 1] * expf(part_ml[(first + z) * 2] - global_max);
    }
    T* dst = out + row * out_stride + head * out_head_stride;
    for (int d = threadIdx.x; d < head_dim; d += blockDim.x) {
        float a = 0.0f;
        for (int z = 0; z < num_splits; ++z) {
            a += part_acc[(first + z) * head_dim + d] *
                 expf(part_ml[(first + z) * 2] - global_max);
        }
        dst[d] = from_float<T>(a / total);
    }
}

#define DEFINE_PAGED_ATTENTION(SUFFIX, T)                                                   \
    extern "C" __global__ void __launch_bounds__(ATTENTION_THREADS)                         \
        paged_attention_partial_##SUFFIX(                                                   \
            float* part_acc, float* part_ml, const T* q, const T* k_cache, const T* v_cache, \
            const long long* block_tables, long long table_stride, const int* row_seq,      \
            const int* row_pos, int num_heads, int num_kv_heads, int head_dim,              \
            int block_size, long long q_stride, long long q_head_stride, float scale,       \
            int sliding_window, int split_keys, int max_splits, int vector_loads) {         \
        paged_attention_partial<T, const T*>(                                               \
            part_acc, part_ml, q, k_cache, v_cache, block_tables, table_stride, row_seq,    \
            row_pos, num_heads, num_kv_heads, head_dim, block_size, q_stride,               \
            q_head_stride, scale, sliding_window, split_keys, max_splits, vector_loads);    \
    }                                                                                       \
    extern "C" __global__ void paged_attention_combine_##SUFFIX(                            \
        T* out, const float* part_acc, const float* part_ml, const int* row_pos,            \
        int num_heads, int head_dim, int sliding_window, int split_keys, int max_splits,    \
        long long out_stride, long long out_head_stride) {                                  \
        paged_attention_combine<T>(out, part_acc, part_ml, row_pos, num_heads, head_dim,    \
                                   sliding_window, split_keys, max_splits, out_stride,      \
                                   out_head_stride);                                        \
    }

// ``vector_loads``: the pair loads of the quantized ``load_tile``.
#define DEFINE_QUANTIZED_PAGED_ATTENTION(KV, F, SUFFIX, T)                                  \
    extern "C" __global__ void __launch_bounds__(ATTENTION_THREADS)                         \
        paged_attention_partial_##KV##_##SUFFIX(                                            \
            float* part_acc, float* part_ml, const T* q, const unsigned char* k_cache,      \
            const unsigned char* v_cache, const long long* block_tables,                    \
            long long table_stride, const int* row_seq, const int* row_pos, int num_heads,  \
            int num_kv_heads, int head_dim, int block_size, long long q_stride,             \
            long long q_head_stride, float scale, int sliding_window, int split_keys,       \
            int max_splits, int vector_loads) {                                             \
        paged_attention_partial<T, QuantizedCache<F>>(                                      \
            part_acc, part_ml, q, QuantizedCache<F>{k_cache}, QuantizedCache<F>{v_cache},   \
            block_tables, table_stride, row_seq, row_pos, num_heads, num_kv_heads,          \
            head_dim, block_size, q_stride, q_head_stride, scale, sliding_window,           \
            split_keys, max_splits, vector_loads);                                          \
    }

#define DEFINE_QUANTIZED_PAGED_ATTENTIONS(KV, F)             \
    DEFINE_QUANTIZED_PAGED_ATTENTION(KV, F, f32, float)      \
    DEFINE_QUANTIZED_PAGED_ATTENTION(KV, F, f16, half_t)     \
    DEFINE_QUANTIZED_PAGED_ATTENTION(KV, F, bf16, bf16_t)

DEFINE_PAGED_ATTENTION(f32, float)
DEFINE_PAGED_ATTENTION(f16, half_t)
DEFINE_PAGED_ATTENTION(bf16, bf16_t)
DEFINE_QUANTIZED_PAGED_ATTENTIONS(i8, KvInt8)
DEFINE_QUANTIZED_PAGED_ATTENTIONS(e4m3, KvFp8E4m3)
DEFINE_QUANTIZED_PAGED_ATTENTIONS(e5m2, KvFp8E5m2)
