// DSA lightning indexer scores, float32: s[t, j] = sum_h w[t, h] * relu(scale * q[t, h] . k[j])
// for q (T, heads, dim), w (T, heads) float32, pooled keys k (J, dim) float32, s (T, J). One
// block per (query, tile of 32 pools); warp ``w`` sums heads w, w + 4, ... for lane j's pool,
// then the warps' sums are added in warp order (a fixed order: batch-invariant). The query is
// read from global memory: every lane of a warp reads the same element (one broadcast).

#define INDEXER_THREADS 128
#define INDEXER_TILE 32

template <typename T>
__device__ void index_scores(
    float* scores, const T* q, const float* head_weights, const float* keys, int num_pools,
    int num_heads, int dim, float scale) {
    extern __shared__ float smem[];
    const int query = blockIdx.x;
    const int first_pool = blockIdx.y * INDEXER_TILE;
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const int stride = dim + 1;
    float* k_s = smem;                               // (TILE, dim + 1)
    float* partial_s = k_s + INDEXER_TILE * stride;  // (warps, TILE)
    const T* q_row = q + static_cast<long long>(query) * num_heads * dim;
    for (int e = threadIdx.x; e < INDEXER_TILE * dim; e += INDEXER_THREADS) {
        const int j = e / dim;
        const int d = e - j * dim;
        const int pool = first_pool + j;
        k_s[j * stride + d] = pool < num_pools ? keys[static_cast<long long>(pool) * dim + d] : 0.0f;
    }
    __syncthreads();
    float total = 0.0f;
    for (int h = warp; h < num_heads; h += INDEXER_THREADS / 32) {
        float dot = 0.0f;
        for (int d = 0; d < dim; ++d) {
            dot += to_float(q_row[h * dim + d]) * k_s[lane * stride + d];
        }
        total += head_weights[static_cast<long long>(query) * num_heads + h] * fmaxf(dot * scale, 0.0f);
    }
    partial_s[warp * INDEXER_TILE + lane] = total;
    __syncthreads();
    if (warp == 0 && first_pool + lane < num_pools) {
        float sum = 0.0f;
        for (int w = 0; w < INDEXER_THREADS / 32; ++w) {
            sum += partial_s[w * INDEXER_TILE + lane];
        }
        scores[static_cast<long long>(query) * num_pools + first_pool + lane] = sum;
    }
}

#define DEFINE_INDEXER(SUFFIX, T)                                                           \
    extern "C" __global__ void __launch_bounds__(INDEXER_THREADS) index_scores_##SUFFIX(    \
        float* scores, const T* q, const float* head_weights, const float* keys,            \
        int num_pools, int num_heads, int dim, float scale) {                               \
        index_scores<T>(scores, q, head_weights, keys, num_pools, num_heads, dim, scale);   \
    }

DEFINE_INDEXER(f32, float)
DEFINE_INDEXER(f16, half_t)
DEFINE_INDEXER(bf16, bf16_t)

// Pooled indexer keys: per pool and channel, the softmax over the pool's tokens of the gate
// logits weights the keys. keys, gate_logits (J, P, dim) dense; out (J, dim) float32. One
// thread per (pool, channel); consecutive threads read consecutive channels.
template <typename T, typename G>
__device__ void pool_index_keys(
    float* out, const T* keys, const G* gate_logits, long long num_pools, int pool, int dim) {
    const long long e = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x;
    if (e >= num_pools * dim) {
        return;
    }
    const long long j = e / dim;
    const int c = static_cast<int>(e - j * dim);
    const long long first = j * pool * dim + c;
    float max_logit = negative_infinity();
    for (int i = 0; i < pool; ++i) {
        max_logit = fmaxf(max_logit, to_float(gate_logits[first + i * dim]));
    }
    float total = 0.0f;
    float weighted = 0.0f;
    for (int i = 0; i < pool; ++i) {
        const float w = expf(to_float(gate_logits[first + i * dim]) - max_logit);
        total += w;
        weighted += w * to_float(keys[first + i * dim]);
    }
    out[e] = weighted / total;
}

#define DEFINE_POOLING(SUFFIX, T, G)                                                        \
    extern "C" __global__ void pool_index_keys_##SUFFIX(                                    \
        float* out, const T* keys, const G* gate_logits, long long num_pools, int pool,     \
        int dim) {                                                                          \
        pool_index_keys<T, G>(out, keys, gate_logits, num_pools, pool, dim);                \
    }

DEFINE_POOLING(f32, float, float)
DEFINE_POOLING(f16, half_t, half_t)
DEFINE_POOLING(bf16, bf16_t, bf16_t)
