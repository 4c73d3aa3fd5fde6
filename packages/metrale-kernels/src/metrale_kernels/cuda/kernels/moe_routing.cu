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

// The best (value, lower id on ties) over the warp: every lane gets it.
__device__ __forceinline__ void warp_argmax(float& value, int& index) {
    for (int offset = 16; offset > 0; offset >>= 1) {
        const float other = __shfl_xor_sync(0xffffffffu, value, offset);
        const int other_index = __shfl_xor_sync(0xffffffffu, index, offset);
        if (other > value || (other == value && other_index < index)) {
            value = other;
            index = other_index;
        }
    }
}

// DeepSeek-V3 / GLM routing, one warp per token: scores = sigmoid(logits), biased = scores +
// bias; with ``topk_groups < num_groups`` only the experts of the ``topk_groups`` groups of
// best top-2 biased sum compete; the ``top_k`` best biased experts are chosen and weighted by
// their unbiased scores (divided by their sum + 1e-20 when ``renormalize``) times ``scaling``.
// Up to 32 groups; ``biased_s`` holds ROUTING_WARPS * num_experts floats.
template <typename T>
__device__ void grouped_sigmoid_topk(
    float* weights, long long* ids, const T* logits, const float* bias, long long num_tokens,
    int num_experts, int top_k, int num_groups, int topk_groups, int renormalize,
    float scaling) {
    extern __shared__ float biased_s[];
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const long long token = static_cast<long long>(blockIdx.x) * ROUTING_WARPS + warp;
    if (token >= num_tokens) {
        return;
    }
    const T* row = logits + token * num_experts;
    float* biased = biased_s + warp * num_experts;
    const int group_size = num_experts / num_groups;
    float score[MAX_PER_LANE];
#pragma unroll
    for (int i = 0; i < MAX_PER_LANE; ++i) {
        const int e = lane + 32 * i;
        score[i] = 0.0f;
        if (e < num_experts) {
            score[i] = 1.0f / (1.0f + expf(-to_float(row[e])));
            biased[e] = score[i] + bias[e];
        }
    }
    __syncwarp();
    unsigned int allowed_groups = 0xffffffffu;
    if (topk_groups < num_groups) {
        float group_score = negative_infinity();
        if (lane < num_groups) {
            float first = negative_infinity();
            float second = negative_infinity();
            for (int e = lane * group_size; e < (lane + 1) * group_size; ++e) {
                const float v = biased[e];
                if (v > first) {
                    second = first;
                    first = v;
                } else if (v > second) {
                    second = v;
                }
            }
            group_score = group_size > 1 ? first + second : first;
        }
        allowed_groups = 0;
        for (int k = 0; k < topk_groups; ++k) {
            float best = lane < num_groups && !(allowed_groups & (1u << lane))
                             ? group_score
                             : negative_infinity();
            int best_group = lane < num_groups && !(allowed_groups & (1u << lane)) ? lane
                                                                                    : 0x7fffffff;
            warp_argmax(best, best_group);
            allowed_groups |= 1u << best_group;
        }
    }
    unsigned int taken = 0;
    float chosen_sum = 0.0f;
    for (int k = 0; k < top_k; ++k) {
        float best = negative_infinity();
        int best_expert = 0x7fffffff;
#pragma unroll
        for (int i = 0; i < MAX_PER_LANE; ++i) {
            const int e = lane + 32 * i;
            if (e < num_experts && !(taken & (1u << i)) &&
                (allowed_groups & (1u << (e / group_size))) && biased[e] > best) {
                best = biased[e];
                best_expert = e;
            }
        }
        warp_argmax(best, best_expert);
        float weight = 0.0f;
#pragma unroll
        for (int i = 0; i < MAX_PER_LANE; ++i) {
            if (lane + 32 * i == best_expert) {
                taken |= 1u << i;
                weight = score[i];
            }
        }
        // The owner lane holds the unbiased score: every lane takes it from there.
        weight = __shfl_sync(0xffffffffu, weight, best_expert & 31);
        chosen_sum += weight;
        if (lane == 0) {
            weights[token * top_k + k] = weight;
            ids[token * top_k + k] = best_expert;
        }
    }
    if (lane == 0) {
        const float divisor = renormalize ? chosen_sum + 1e-20f : 1.0f;
        for (int k = 0; k < top_k; ++k) {
            weights[token * top_k + k] = weights[token * top_k + k] / divisor * scaling;
        }
    }
}

#define DEFINE_ROUTING(SUFFIX, T)                                                           \
    extern "C" __global__ void softmax_topk_##SUFFIX(                                       \
        float* weights, long long* ids, const T* logits, long long num_tokens,              \
        int num_experts, int top_k, int renormalize) {                                      \
        softmax_topk<T>(weights, ids, logits, num_tokens, num_experts, top_k, renormalize); \
    }                                                                                       \
    extern "C" __global__ void grouped_sigmoid_topk_##SUFFIX(                               \
        float* weights, long long* ids, const T* logits, const float* bias,                 \
        long long num_tokens, int num_experts, int top_k, int num_groups, int topk_groups,  \
        int renormalize, float scaling) {                                                   \
        grouped_sigmoid_topk<T>(weights, ids, logits, bias, num_tokens, num_experts, top_k, \
                                num_groups, topk_groups, renormalize, scaling);             \
    }

DEFINE_ROUTING(f32, float)
DEFINE_ROUTING(f16, half_t)
DEFINE_ROUTING(bf16, bf16_t)
