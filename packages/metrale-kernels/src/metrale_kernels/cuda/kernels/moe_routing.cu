// Softmax top-k routing (Mixtral, Qwen3-MoE), one warp per token: softmax over the experts in
// float32, then ``top_k`` rounds of a warp argmax (ties to the lower expert id), weights in
// descending order, divided by their sum when ``renormalize``. Up to 32 * MAX_PER_LANE experts.

#define ROUTING_WARPS 4
#define MAX_PER_LANE 16

template <typename T>
__device__ void softmax_topk(
    float* weights, long long* ids, const T* logits, long long num_tokens, int num_experts,
    int top_k, int renormalize) {
    const int lane = threadIdx.x & 31;
    const long long token = static_cast<long long>(blockIdx.x) * ROUTING_WARPS + (threadIdx.x >> 5);
    if (token >= num_tokens) {
        return;
    }
    const T* row = logits + token * num_experts;
    float v[MAX_PER_LANE];
    float local_max = negative_infinity();
#pragma unroll
    for (int i = 0; i < MAX_PER_LANE; ++i) {
        const int e = lane + 32 * i;
        v[i] = e < num_experts ? to_float(row[e]) : negative_infinity();
        local_max = fmaxf(local_max, v[i]);
    }
    const float row_max = warp_max(local_max);
    float local_sum = 0.0f;
#pragma unroll
    for (int i = 0; i < MAX_PER_LANE; ++i) {
        v[i] = lane + 32 * i < num_experts ? expf(v[i] - row_max) : 0.0f;
        local_sum += v[i];
    }
    const float row_sum = warp_sum(local_sum);
    unsigned int taken = 0;
    float chosen_sum = 0.0f;
    for (int k = 0; k < top_k; ++k) {
        float best = -1.0f;
        int best_expert = 0x7fffffff;
#pragma unroll
        for (int i = 0; i < MAX_PER_LANE; ++i) {
            const int e = lane + 32 * i;
            const float p = v[i] / row_sum;
            if (e < num_experts && !(taken & (1u << i)) && p > best) {
                best = p;
                best_expert = e;
            }
        }
        for (int offset = 16; offset > 0; offset >>= 1) {
            const float other = __shfl_xor_sync(0xffffffffu, best, offset);
            const int other_expert = __shfl_xor_sync(0xffffffffu, best_expert, offset);
            if (other > best || (other == best && other_expert < best_expert)) {
                best = other;
                best_expert = other_expert;
            }
        }
        if (lane == (best_expert & 31)) {
            taken |= 1u << (best_expert >> 5);
        }
        chosen_sum += best;
        if (lane == 0) {
            weights[token * top_k + k] = best;
            ids[token * top_k + k] = best_expert;
        }
    }
    if (renormalize && lane == 0) {
        for (int k = 0; k < top_k; ++k) {
            weights[token * top_k + k] /= chosen_sum;
        }
    }
}

#define DEFINE_ROUTING(SUFFIX, T)                                                           \
    extern "C" __global__ void softmax_topk_##SUFFIX(                                       \
        float* weights, long long* ids, const T* logits, long long num_tokens,              \
        int num_experts, int top_k, int renormalize) {                                      \
        softmax_topk<T>(weights, ids, logits, num_tokens, num_experts, top_k, renormalize); \
    }

DEFINE_ROUTING(f32, float)
DEFINE_ROUTING(f16, half_t)
DEFINE_ROUTING(bf16, bf16_t)
