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
