// Quantized K/V cache rows (metrale_kernels.reference.kv_quantization): a (slot, kv head) row
// is ``head_dim`` one-byte values, then its float16 scale's two bytes (little-endian). ``x`` is
// stored as ``x / scale`` clamped to +-QMAX, rounded half to even (int8) or cast to fp8 as torch
// casts (round to nearest even); ``scale = float16(amax(|row|) / QMAX)``; a value reads back as
// ``float(stored) * float(scale)``. The same bytes as the torch reference on the CPU, which
// divides by QMAX (torch on CUDA multiplies by its reciprocal: a scale may differ in its last bit).
// Pure arithmetic on bits: tests compile this file for the host (test_cuda_kv_quantization.py).

#define KV_SCALE_BYTES 2

__device__ __forceinline__ float float16_bits_to_float(unsigned int bits) {
    half_t h;
    h.bits = static_cast<unsigned short>(bits);
    return to_float(h);
}

struct KvInt8 {
    static constexpr float QMAX = 127.0f;
    __device__ __forceinline__ static unsigned char encode(float scaled) {
        return static_cast<unsigned char>(static_cast<signed char>(rintf(scaled)));
    }
    __device__ __forceinline__ static float decode(unsigned int byte) {
        return static_cast<float>(static_cast<signed char>(byte));
    }
};

// fp8 from float32 by the bits, rounding to nearest even (torch's c10 conversion, for a value
// already within +-448): below the smallest normal, adding ``denorm`` rounds the value into the
// low mantissa bits; above it, the exponent is rebiased and the dropped bits rounded.
__device__ __forceinline__ unsigned char fp8_from_float(
    float x, unsigned int min_normal, unsigned int denorm, unsigned int rebias, int shift) {
    unsigned int bits = __float_as_uint(x);
    const unsigned int sign = bits & 0x80000000u;
    bits ^= sign;
    unsigned int result;
    if (bits < min_normal) {
        const float rounded = __fadd_rn(__uint_as_float(bits), __uint_as_float(denorm));
        result = __float_as_uint(rounded) - denorm;
    } else {
        const unsigned int odd = (bits >> shift) & 1u;
        result = (bits + rebias + ((1u << (shift - 1)) - 1u) + odd) >> shift;
    }
    return static_cast<unsigned char>(result | (sign >> 24));
}

struct KvFp8E4m3 {
    static constexpr float QMAX = 448.0f;
    __device__ __forceinline__ static unsigned char encode(float scaled) {
        return fp8_from_float(scaled, 121u << 23, 141u << 23,
                              static_cast<unsigned int>(7 - 127) << 23, 20);
    }
    // As a float16 whose exponent field holds e4m3's (bias 15, not 7: times 2^8), exact for
    // subnormals too; 0x7f and 0xff are NaN.
    __device__ __forceinline__ static float decode(unsigned int byte) {
        const float value = float16_bits_to_float(((byte & 0x80u) << 8) | ((byte & 0x7fu) << 7));
        return (byte & 0x7fu) == 0x7fu ? __int_as_float(0x7fffffff) : value * 256.0f;
    }
};

struct KvFp8E5m2 {
    static constexpr float QMAX = 448.0f;
    __device__ __forceinline__ static unsigned char encode(float scaled) {
        return fp8_from_float(scaled, 113u << 23, 134u << 23,
                              static_cast<unsigned int>(15 - 127) << 23, 21);
    }
    // e5m2 is the top byte of a float16.
    __device__ __forceinline__ static float decode(unsigned int byte) {
        return float16_bits_to_float(byte << 8);
    }
};

// A row's scale from its amax (float32, true division as the CPU reference divides).
template <typename F>
__device__ __forceinline__ half_t kv_row_scale(float amax) {
    return from_float<half_t>(__fdiv_rn(amax, F::QMAX));
}

// ``x`` stored in a row of scale ``scale``.
template <typename F>
__device__ __forceinline__ unsigned char kv_quantize(float x, half_t scale) {
    const float s = to_float(scale);
    const float divisor = s > 0.0f ? s : 1.0f;
    return F::encode(fminf(fmaxf(__fdiv_rn(x, divisor), -F::QMAX), F::QMAX));
}

// The scale stored after a row's ``head_dim`` values, read a byte at a time (any alignment).
__device__ __forceinline__ float kv_scale_of(const unsigned char* row, int head_dim) {
    return float16_bits_to_float(row[head_dim] | (row[head_dim + 1] << 8));
}
