// DSA sparse attention in latent space (MLA as MQA, K = V = the latent row) over the positions
// the indexer selected, ONE sequence: one block per (query, group of heads), an online softmax
// in float32 over tiles of the selection in its order. ``selected (T, W)`` holds positions or
// -1 (none); position p is slot ``block_table[p / block_size] * block_size + p % block_size``
// of ``latent (num_slots, rank)``; only selected slots are read. A row with no selection gives
// zeros. q (T, H, rank) and out are dense.

#define DSA_THREADS 128
#define DSA_TILE 16
#define DSA_MAX_ACCUMULATORS 16  // (heads per block * rank) / DSA_THREADS, at most

template <typename T>
__device__ void sparse_latent_attention(
    T* out, const T* q, const T* latent, const long long* block_table,
    const long long* selected, int num_heads, int heads_per_block, int rank, int block_size,
    int width, float scale) {
    extern __shared__ float smem[];
    const int query = blockIdx.x;
    const int first_head = blockIdx.y * heads_per_block;
    const int group = min(heads_per_block, num_heads - first_head);
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const int stride = rank + 1;
    const int group_dims = group * rank;
    float* q_s = smem;                                // (heads_per_block, rank)
    float* c_s = q_s + heads_per_block * rank;        // (TILE, rank + 1)
    float* p_s = c_s + DSA_TILE * stride;             // (heads_per_block, TILE)
    float* max_s = p_s + heads_per_block * DSA_TILE;  // (heads_per_block,)
    float* sum_s = max_s + heads_per_block;
    float* rescale_s = sum_s + heads_per_block;
    __shared__ long long slots[DSA_TILE];  // -1: not selected

    const T* q_row = q + (static_cast<long long>(query) * num_heads + first_head) * rank;
    for (int e = threadIdx.x; e < group_dims; e += DSA_THREADS) {
        q_s[e] = to_float(q_row[e]);
    }
    for (int g = threadIdx.x; g < group; g += DSA_THREADS) {
        max_s[g] = negative_infinity();
        sum_s[g] = 0.0f;
    }
    float acc[DSA_MAX_ACCUMULATORS];
#pragma unroll
    for (int i = 0; i < DSA_MAX_ACCUMULATORS; ++i) {
        acc[i] = 0.0f;
    }
    const long long* chosen = selected + static_cast<long long>(query) * width;

    for (int tile_start = 0; tile_start < width; tile_start += DSA_TILE) {
        const int tile_n = min(DSA_TILE, width - tile_start);
        if (threadIdx.x < DSA_TILE) {
            long long slot = -1;
            if (threadIdx.x < tile_n) {
                const long long pos = chosen[tile_start + threadIdx.x];
                if (pos >= 0) {
                    slot = block_table[pos / block_size] * block_size + pos % block_size;
                }
            }
            slots[threadIdx.x] = slot;
        }
        __syncthreads();
        for (int e = threadIdx.x; e < DSA_TILE * rank; e += DSA_THREADS) {
            const int j = e / rank;
            const int d = e - j * rank;
            c_s[j * stride + d] = slots[j] >= 0 ? to_float(latent[slots[j] * rank + d]) : 0.0f;
        }
        __syncthreads();
        for (int e = threadIdx.x; e < group * DSA_TILE; e += DSA_THREADS) {
            const int g = e / DSA_TILE;
            const int j = e - g * DSA_TILE;
            float score = negative_infinity();
            if (slots[j] >= 0) {
                float dot = 0.0f;
                for (int d = 0; d < rank; ++d) {
                    dot += q_s[g * rank + d] * c_s[j * stride + d];
                }
                score = dot * scale;
            }
            p_s[g * DSA_TILE + j] = score;
        }
        __syncthreads();
        for (int g = warp; g < group; g += DSA_THREADS / 32) {
            const bool is_valid = lane < DSA_TILE && slots[lane] >= 0;
            const float score = is_valid ? p_s[g * DSA_TILE + lane] : negative_infinity();
            const float old_max = max_s[g];
            const float new_max = fmaxf(old_max, warp_max(score));
            const float weight = is_valid ? expf(score - new_max) : 0.0f;
            const float tile_sum = warp_sum(weight);
            if (lane < DSA_TILE) {
                p_s[g * DSA_TILE + lane] = weight;
            }
            if (lane == 0) {
                // Nothing selected so far: no sum to rescale (and -inf - -inf is NaN).
                const float rescale = old_max == negative_infinity() ? 0.0f : expf(old_max - new_max);
                sum_s[g] = sum_s[g] * rescale + tile_sum;
                max_s[g] = new_max;
                rescale_s[g] = rescale;
            }
        }
        __syncthreads();
#pragma unroll
        for (int i = 0; i < DSA_MAX_ACCUMULATORS; ++i) {
            const int e = threadIdx.x + i * DSA_THREADS;
            if (e < group_dims) {
                const int g = e / rank;
                const int d = e - g * rank;
                float a = acc[i] * rescale_s[g];
                for (int j = 0; j < tile_n; ++j) {
                    a += p_s[g * DSA_TILE + j] * c_s[j * stride + d];
                }
                acc[i] = a;
            }
        }
        __syncthreads();
    }

    T* out_row = out + (static_cast<long long>(query) * num_heads + first_head) * rank;
#pragma unroll
    for (int i = 0; i < DSA_MAX_ACCUMULATORS; ++i) {
        const int e = threadIdx.x + i * DSA_THREADS;
        if (e < group_dims) {
            const float total = sum_s[e / rank];
            out_row[e] = from_float<T>(total > 0.0f ? acc[i] / total : 0.0f);
        }
    }
}

#define DEFINE_DSA(SUFFIX, T)                                                               \
    extern "C" __global__ void __launch_bounds__(DSA_THREADS) sparse_latent_attention_##SUFFIX( \
        T* out, const T* q, const T* latent, const long long* block_table,                  \
        const long long* selected, int num_heads, int heads_per_block, int rank,            \
        int block_size, int width, float scale) {                                           \
        sparse_latent_attention<T>(out, q, latent, block_table, selected, num_heads,        \
                                   heads_per_block, rank, block_size, width, scale);        \
    }

DEFINE_DSA(f32, float)
DEFINE_DSA(f16, half_t)
DEFINE_DSA(bf16, bf16_t)
