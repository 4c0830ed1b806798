// rlx CUDA kernels for packed GGML blocks (layouts: spec/ops.md, "Quantized encodings").
//
// y[m, n] = sum_k x[m, k] * dequant(w)[n, k] for up to RLX_MAX_M input rows, reading the packed
// bytes directly (no f32 weight is ever materialized). One warp per output row n; lane l handles
// value l of every 32-value group, so a warp's code load is 32 consecutive bytes and the fp16 scale
// is a broadcast. Each dequantized weight is d * q in f32 (the reference's rounding); the sum order
// differs from numpy's, so results agree within float32 summation error, not bit for bit.
//
// The lane functions are plain C++ so tests can run them on the CPU (tests/test_cuda_kernels.py
// compiles this file with g++ and checks them against the numpy reference); the __global__ wrappers
// add only the warp reduction.

#define RLX_MAX_M 8

__device__ __forceinline__ float rlx_half_to_float(unsigned int h) {
    const unsigned int e = (h >> 10) & 0x1fu;
    const unsigned int m = h & 0x3ffu;
    float v;
    if (e == 0u) {
        v = (float)m * 5.9604644775390625e-08f;  // subnormal: m * 2^-24
    } else if (e == 31u) {
        v = __int_as_float(m ? 0x7fc00000 : 0x7f800000);
    } else {
        v = __int_as_float((int)(((e + 112u) << 23) | (m << 13)));  // rebias 15 -> 127
    }
    return (h & 0x8000u) ? -v : v;
}

// Partial sums of lane `lane` (0..31) for output row n: acc[m] for m < M.
__device__ __forceinline__ void rlx_q8_0_lane(const unsigned char* __restrict__ w, const float* __restrict__ x,
                                              int n, int K, int M, int lane, float* acc) {
    const int nb = K >> 5;
    const unsigned char* row = w + (size_t)n * (size_t)nb * 34u;
#pragma unroll 4  // independent block loads in flight per warp: the loop is latency-bound otherwise
    for (int b = 0; b < nb; ++b) {
        const unsigned char* blk = row + (size_t)b * 34u;
        const float d = rlx_half_to_float((unsigned int)blk[0] | ((unsigned int)blk[1] << 8));
        const float wv = d * (float)(signed char)blk[2 + lane];
        const size_t k = ((size_t)b << 5) + (size_t)lane;
        for (int m = 0; m < RLX_MAX_M; ++m) {
            if (m < M) acc[m] += wv * x[(size_t)m * (size_t)K + k];
        }
    }
}

// TQ2_0: value j*128 + l*32 + lane of a 256-block sits in byte j*32 + lane at bit 2*l, code = q + 1.
__device__ __forceinline__ void rlx_tq2_0_lane(const unsigned char* __restrict__ w, const float* __restrict__ x,
                                               int n, int K, int M, int lane, float* acc) {
    const int nb = K >> 8;
    const unsigned char* row = w + (size_t)n * (size_t)nb * 66u;
#pragma unroll 2
    for (int b = 0; b < nb; ++b) {
        const unsigned char* blk = row + (size_t)b * 66u;
        const float d = rlx_half_to_float((unsigned int)blk[64] | ((unsigned int)blk[65] << 8));
        for (int j = 0; j < 2; ++j) {
            const unsigned int byte = blk[j * 32 + lane];
            for (int l = 0; l < 4; ++l) {
                const float wv = (float)((int)((byte >> (2 * l)) & 3u) - 1) * d;
                const size_t k = ((size_t)b << 8) + (size_t)(j * 128 + l * 32 + lane);
                for (int m = 0; m < RLX_MAX_M; ++m) {
                    if (m < M) acc[m] += wv * x[(size_t)m * (size_t)K + k];
                }
            }
        }
    }
}

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
__device__ __forceinline__ void rlx_store_rows(float* acc, float* __restrict__ y, int n, int N, int M, int lane) {
    for (int m = 0; m < RLX_MAX_M; ++m) {
        float v = acc[m];
        for (int off = 16; off > 0; off >>= 1) v += __shfl_down_sync(0xffffffffu, v, off);
        if (lane == 0 && m < M) y[(size_t)m * (size_t)N + n] = v;
    }
}

// blockDim.x = 32 * rows per block; grid covers N rows. The early return is warp-uniform.
template <bool TQ2>
__device__ __forceinline__ void rlx_gemv(const unsigned char* __restrict__ w, const float* __restrict__ x,
                                         float* __restrict__ y, int N, int K, int M) {
    const int lane = threadIdx.x & 31;
    const int n = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (n >= N) return;
    float acc[RLX_MAX_M] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
    if (TQ2) {
        rlx_tq2_0_lane(w, x, n, K, M, lane, acc);
    } else {
        rlx_q8_0_lane(w, x, n, K, M, lane, acc);
    }
    rlx_store_rows(acc, y, n, N, M, lane);
}

extern "C" __global__ void rlx_q8_0_gemv(const unsigned char* w, const float* x, float* y, int N, int K, int M) {
    rlx_gemv<false>(w, x, y, N, K, M);
}

extern "C" __global__ void rlx_tq2_0_gemv(const unsigned char* w, const float* x, float* y, int N, int K, int M) {
    rlx_gemv<true>(w, x, y, N, K, M);
}
#endif
