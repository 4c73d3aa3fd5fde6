// DSA position selection, ONE sequence, one block per query: a query at ``pos`` has
// ``n = (pos + 1) / kpool`` complete pools as candidates; with ``n <= num_chosen`` it takes
// them all, else the ``num_chosen`` of highest score (a bitonic sort of the candidates in
// shared memory, descending; ties any way). Each chosen pool contributes its ``kpool``
// positions; with ``select_tail`` (and kpool > 1) the incomplete pool's positions up to
// ``pos`` follow at ``topk_pools * kpool``. Unused entries are -1; the order within a row is
// unspecified, as the reference's. Scores (T, J) float32, rows ``score_stride`` apart.

#define SELECT_THREADS 256
#define SELECT_MAX_POOLS 4096

__device__ __forceinline__ int next_power_of_two(int n) {
    int size = 1;
    while (size < n) {
        size <<= 1;
    }
    return size;
}

extern "C" __global__ void __launch_bounds__(SELECT_THREADS) select_positions(
    long long* out, const float* scores, const long long* positions, long long score_stride,
    int kpool, int topk_pools, int num_chosen, int select_tail, int width) {
    __shared__ float keys[SELECT_MAX_POOLS];
    __shared__ int pools[SELECT_MAX_POOLS];
    const long long query = blockIdx.x;
    const long long pos = positions[query];
    const int complete = static_cast<int>((pos + 1) / kpool);
    long long* row = out + query * width;
    for (int e = threadIdx.x; e < width; e += SELECT_THREADS) {
        row[e] = -1;
    }
    __syncthreads();
    if (complete <= num_chosen) {
        for (int e = threadIdx.x; e < complete * kpool; e += SELECT_THREADS) {
            row[e] = e;  // pool e / kpool, offset e % kpool: position e itself
        }
    } else {
        const float* query_scores = scores + query * score_stride;
        const int size = next_power_of_two(complete);
        for (int i = threadIdx.x; i < size; i += SELECT_THREADS) {
            keys[i] = i < complete ? query_scores[i] : negative_infinity();
            pools[i] = i;
        }
        __syncthreads();
        for (int k = 2; k <= size; k <<= 1) {
            for (int j = k >> 1; j > 0; j >>= 1) {
                for (int i = threadIdx.x; i < size; i += SELECT_THREADS) {
                    const int partner = i ^ j;
                    if (partner > i) {
                        const float a = keys[i];
                        const float b = keys[partner];
                        // Descending runs where bit k of i is clear: all of it at k == size.
                        if ((i & k) == 0 ? a < b : a > b) {
                            keys[i] = b;
                            keys[partner] = a;
                            const int pool = pools[i];
                            pools[i] = pools[partner];
                            pools[partner] = pool;
                        }
                    }
                }
                __syncthreads();
            }
        }
        for (int e = threadIdx.x; e < num_chosen * kpool; e += SELECT_THREADS) {
            row[e] = static_cast<long long>(pools[e / kpool]) * kpool + e % kpool;
        }
    }
    if (select_tail && kpool > 1) {
        for (int r = threadIdx.x; r < kpool - 1; r += SELECT_THREADS) {
            const long long tail = static_cast<long long>(complete) * kpool + r;
            row[static_cast<long long>(topk_pools) * kpool + r] = tail <= pos ? tail : -1;
        }
    }
}
