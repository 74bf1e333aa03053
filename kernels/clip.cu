// clip.cu: global-L2 gradient clipping in three kernels, with torch.nn.utils.clip_grad_norm_'s
// semantics (see docs/kernels.md):
//
//   norm  = sqrt(sum over every element of every gradient of g*g)
//   scale = min(1, max_norm / (norm + eps))      (1 when norm is NaN or inf: gradients untouched)
//   g    *= scale                                (in place)
//
//   k_grad_norm_partial  every chunk of every gradient tensor -> its sum of squares, in its own slot
//   k_grad_norm_final    one block: slots -> norm, scale and a non-finite flag, in GPU memory
//   k_grad_scale         g *= scale in place; returns at once when scale == 1
//
// Launched by pytest_spikecheck/clipping/_kernel_runner.py (through CuPy on a GPU, through
// cuda_emulator.h on the CPU). The same file compiles with NVRTC and with g++: it includes no
// headers, and the only GPU-specific lines (inline PTX: fp16/bf16 conversions and the fp32
// arithmetic that -ftz=true must not touch) are guarded by __CUDA_ARCH__, the bf16 instruction by
// __CUDA_ARCH__ >= 800. The dtype codes GRAD_DTYPE_* come from the host code as -D flags so they
// have one definition (GRAD_DTYPE_CODES in _kernel_runner.py).
//
// Design choices and their trade-offs (in the spirit of llm.c's dev/cuda/global_norm.cu):
//
// 1. One launch for all tensors. A model has ~150 gradient tensors, from a layernorm bias (768
//    elements) to the embedding (8449 x 768). One launch per tensor would cost ~150 launches of
//    a few microseconds each: more than the whole 12-bytes-per-parameter pass over ANDREA-120M's
//    98M parameters (274 us at 4.3 TB/s). Instead the host builds a table of (address, numel,
//    first chunk, dtype), one row per tensor, and every kernel walks all of it (the Apex / torch
//    foreach "multi-tensor apply" idea).
//
// 2. Fixed-size chunks with one slot each, no atomics. Each tensor is cut into chunks of
//    chunk_elements (the last one shorter); chunk c's sum of squares always goes to
//    partial_sums[c] and is always reduced by one block in the same order. So the norm is
//    bitwise identical run to run and whatever the grid size (a grid smaller than the number of
//    chunks makes blocks loop over chunks; it changes who computes a slot, never how).
//    atomicAdd into one float would be simpler and skip the final kernel, but float addition is
//    not associative: the result would change with the order the blocks finish in.
//    Cost: one 4-byte slot per chunk (6,088 slots, 24 KB, for ANDREA-120M at 16k-element chunks).
//
// 3. Chunk to tensor by binary search over first_chunk: log2(#tensors) ~ 8 loads of the same
//    table rows by every thread of the block, served from L1, once per chunk of tens of KB. A
//    per-chunk index array would make it one load but costs memory and host work per table.
//
// 4. fp32 accumulation inside a chunk, fp64 across chunks. A thread adds ~16-64 squares, a block
//    adds 256 thread sums in a tree: relative error ~1e-7 per chunk. The final kernel adds the
//    chunk sums in double, so a 100M-parameter norm is as accurate as one chunk's. Like torch,
//    squares are fp32: a norm above ~1.8e19 overflows to inf (and is then treated as non-finite).
//
// 5. 128-bit loads and stores (4 fp32 or 8 fp16/bf16 values) when the tensor starts 16-byte
//    aligned (chunk_elements is a multiple of 8, so every chunk then starts aligned too); scalar
//    accesses otherwise and for the ragged tail. Wide accesses need 4x fewer memory instructions
//    to keep the same bytes in flight, which is what saturates HBM.
//
// 6. The scale stays on the GPU. k_grad_norm_final writes it to memory and k_grad_scale reads it,
//    so the host never waits for the norm (no cudaMemcpy / .item() sync). The price: the scale
//    kernel is always launched (a few microseconds) and returns at once when the scale is 1 --
//    the common step, where gradients are below max_norm, costs no pass over memory.
//
// 7. fp16 / bf16 gradients are read as 16-bit words. fp16 <-> fp32 uses the cvt instruction on
//    every GPU (exact, one instruction). fp32 -> bf16 uses cvt.rn.bf16.f32 from sm_80 on; sm_75
//    (T4) has no bf16 instruction, so there, and on the CPU, float_to_bfloat16_bits_rne does the
//    same round to nearest even on the bit pattern (~4 integer instructions, exact). The CPU build
//    uses bit-level conversions throughout; tests/test_emulator.py checks them against torch's
//    rounding for every bf16 value with ties, subnormals, inf and NaN (and clip.cu against numpy
//    for every fp16 / bf16 value through the conformance kit).
//
// 8. No flush to zero. CuPy always compiles with -ftz=true (it appends the flag after ours), which
//    would flush fp32 subnormals (|x| < 1.2e-38) in every fp32 add, multiply, fma, compare and
//    conversion on the GPU only -- torch does not, and neither does the CPU emulator. So every
//    fp32 operation on gradient data or the norm goes through the *_ieee helpers below: inline
//    PTX without .ftz on the GPU, plain C++ on the CPU. tests/test_kernels_compile.py compiles
//    with CuPy's options and fails on any .ftz instruction in the PTX. Subnormal gradients then
//    count in the norm and are scaled exactly as torch scales them, on every device.

#if !defined(GRAD_DTYPE_FLOAT32) || !defined(GRAD_DTYPE_FLOAT16) || !defined(GRAD_DTYPE_BFLOAT16)
#error "compile with the -DGRAD_DTYPE_* flags from pytest_spikecheck.clipping._kernel_runner"
#endif

// One row per non-empty gradient tensor. Four 8-byte fields, no padding: the host writes the
// table as an int64 array of shape (num_tensors, 4).
struct GradTableRow {
    long long address;      // address of element 0
    long long numel;        // number of elements (64-bit: an embedding can pass 2^31)
    long long first_chunk;  // global index of the tensor's first chunk; rows are sorted by it
    long long dtype;        // GRAD_DTYPE_FLOAT32, GRAD_DTYPE_FLOAT16 or GRAD_DTYPE_BFLOAT16
};

// Enumerators rather than constexpr variables: NVRTC with --device-as-default-execution-space
// would also emit namespace-scope constants as (unused) __device__ globals.
enum : int {
    kWarpSize = 32,
    kMaxWarpsPerBlock = 32,  // 1024 threads; the host launches a multiple of 32 threads per block
};
enum : unsigned int { kFullWarpMask = 0xffffffffu };

// Gradient addresses come from the table, not from kernel parameters, so the compiler cannot tell
// they point to global memory and would emit generic loads and stores (LD.E / ST.E, which check
// the address window). Saying so gets LDG.E.128 / STG.E.128.
#if defined(__CUDA_ARCH__)
#define ASSUME_GLOBAL(pointer) __builtin_assume(__isGlobal(pointer))
#else
#define ASSUME_GLOBAL(pointer) ((void)0)
#endif

// 16 bytes, loaded and stored with one 128-bit instruction.
struct alignas(16) Pack128 {
    unsigned int word[4];
};

// ---------------------------------------------------------------------------------------------
// fp32 arithmetic that -ftz=true cannot change (design choice 8). IEEE round to nearest even,
// subnormal inputs and results kept. double is never flushed, so its arithmetic stays plain C++.

#if defined(__CUDA_ARCH__)
__device__ __forceinline__ float fma_ieee(float a, float b, float c)
{
    float r;
    asm("fma.rn.f32 %0, %1, %2, %3;" : "=f"(r) : "f"(a), "f"(b), "f"(c));
    return r;
}
__device__ __forceinline__ float add_ieee(float a, float b)
{
    float r;
    asm("add.rn.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
    return r;
}
__device__ __forceinline__ float mul_ieee(float a, float b)
{
    float r;
    asm("mul.rn.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
    return r;
}
__device__ __forceinline__ float div_ieee(float a, float b)
{
    float r;
    asm("div.rn.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
    return r;
}
__device__ __forceinline__ double widen_ieee(float a)
{
    double r;
    asm("cvt.f64.f32 %0, %1;" : "=d"(r) : "f"(a));
    return r;
}
__device__ __forceinline__ float narrow_ieee(double a)
{
    float r;
    asm("cvt.rn.f32.f64 %0, %1;" : "=f"(r) : "d"(a));
    return r;
}
#else
inline float fma_ieee(float a, float b, float c) { return fmaf(a, b, c); }
inline float add_ieee(float a, float b) { return a + b; }
inline float mul_ieee(float a, float b) { return a * b; }
inline float div_ieee(float a, float b) { return a / b; }
inline double widen_ieee(float a) { return static_cast<double>(a); }
inline float narrow_ieee(double a) { return static_cast<float>(a); }
#endif
__device__ __forceinline__ double add_ieee(double a, double b) { return a + b; }

// x < 1.0f on the bit pattern (an fp32 compare would be setp.ftz under -ftz=true).
__device__ __forceinline__ bool less_than_one(float x)
{
    const unsigned int bits = __float_as_uint(x);
    if ((bits & 0x7fffffffu) > 0x7f800000u) return false;  // NaN
    return (bits >> 31) != 0 || bits < 0x3f800000u;         // negative, or below 1.0f's pattern
}

// ---------------------------------------------------------------------------------------------
// fp16 / bf16 <-> fp32 (bit patterns held in unsigned short)

__device__ __forceinline__ float half_bits_to_float(unsigned short bits)
{
#if defined(__CUDA_ARCH__)
    float value;
    asm("cvt.f32.f16 %0, %1;" : "=f"(value) : "h"(bits));
    return value;
#else
    const unsigned int sign = (bits & 0x8000u) << 16;
    const unsigned int exponent = (bits >> 10) & 0x1fu;
    const unsigned int mantissa = bits & 0x3ffu;
    if (exponent == 0x1fu) {  // inf or NaN: keep the payload
        return __uint_as_float(sign | 0x7f800000u | (mantissa << 13));
    }
    if (exponent == 0) {  // zero or subnormal: mantissa * 2^-24 is exact in fp32
        const float magnitude = static_cast<float>(mantissa) * 5.9604644775390625e-8f;
        return sign ? -magnitude : magnitude;
    }
    return __uint_as_float(sign | ((exponent + (127 - 15)) << 23) | (mantissa << 13));
#endif
}

__device__ __forceinline__ unsigned short float_to_half_bits(float value)
{
#if defined(__CUDA_ARCH__)
    unsigned short bits;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(bits) : "f"(value));
    return bits;
#else
    const unsigned int u = __float_as_uint(value);
    const unsigned int sign = (u >> 16) & 0x8000u;
    const unsigned int magnitude = u & 0x7fffffffu;
    if (magnitude > 0x7f800000u) return static_cast<unsigned short>(sign | 0x7e00u);  // NaN
    if (magnitude >= 0x477ff000u) {  // >= 65520, halfway above the largest half: rounds to inf
        return static_cast<unsigned short>(sign | 0x7c00u);
    }
    if (magnitude >= 0x38800000u) {  // normal half: rebias the exponent, round 23 -> 10 bits
        const unsigned int rounded = magnitude + 0xfffu + ((magnitude >> 13) & 1u);
        return static_cast<unsigned short>(sign | ((rounded - ((127u - 15u) << 23)) >> 13));
    }
    // Subnormal half (or zero): units of 2^-24, rounded to nearest even.
    const unsigned int exponent = magnitude >> 23;
    if (exponent < 102) return static_cast<unsigned short>(sign);  // below 2^-25: rounds to 0
    const unsigned int significand = (magnitude & 0x7fffffu) | 0x800000u;
    const unsigned int shift = 126 - exponent;  // 14..24
    unsigned int quotient = significand >> shift;
    const unsigned int remainder = significand & ((1u << shift) - 1u);
    const unsigned int halfway = 1u << (shift - 1);
    if (remainder > halfway || (remainder == halfway && (quotient & 1u))) ++quotient;
    return static_cast<unsigned short>(sign | quotient);
#endif
}

__device__ __forceinline__ float bfloat16_bits_to_float(unsigned short bits)
{
    return __uint_as_float(static_cast<unsigned int>(bits) << 16);
}

// fp32 -> bf16, round to nearest even, on the bit pattern: exact on any architecture. NaN stays a
// quiet NaN of the same sign (0x40: the quiet bit) instead of rounding into inf; every other
// value, inf and subnormals included, gives the same bits as torch's and cvt.rn.bf16.f32's rounding.
__device__ __forceinline__ unsigned short float_to_bfloat16_bits_rne(float value)
{
    const unsigned int u = __float_as_uint(value);
    if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<unsigned short>((u >> 16) | 0x40u);
    return static_cast<unsigned short>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);  // nearest even
}

__device__ __forceinline__ unsigned short float_to_bfloat16_bits(float value)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    unsigned short bits;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(bits) : "f"(value));  // sm_80+: one instruction
    return bits;
#else
    return float_to_bfloat16_bits_rne(value);  // sm_75 and the CPU
#endif
}

// ---------------------------------------------------------------------------------------------
// Element formats: how many values a Pack128 holds and how to read / write value i of it.

struct Float32Format {
    using Storage = float;
    enum : int { kPerPack = 4 };
    __device__ static float load(const Storage* p) { return *p; }
    __device__ static void store(Storage* p, float x) { *p = x; }
    __device__ static float unpack(const Pack128& pack, int i) { return __uint_as_float(pack.word[i]); }
    __device__ static void repack(Pack128& pack, int i, float x) { pack.word[i] = __float_as_uint(x); }
};

template <float (*ToFloat)(unsigned short), unsigned short (*FromFloat)(float)>
struct SixteenBitFormat {
    using Storage = unsigned short;
    enum : int { kPerPack = 8 };
    __device__ static float load(const Storage* p) { return ToFloat(*p); }
    __device__ static void store(Storage* p, float x) { *p = FromFloat(x); }
    // Little-endian: value 2k is the low half of word k.
    __device__ static float unpack(const Pack128& pack, int i)
    {
        const unsigned int word = pack.word[i / 2];
        return ToFloat(static_cast<unsigned short>(i % 2 ? word >> 16 : word & 0xffffu));
    }
    __device__ static void repack(Pack128& pack, int i, float x)
    {
        const unsigned int bits = FromFloat(x);
        unsigned int& word = pack.word[i / 2];
        word = i % 2 ? (word & 0x0000ffffu) | (bits << 16) : (word & 0xffff0000u) | bits;
    }
};

using Float16Format = SixteenBitFormat<half_bits_to_float, float_to_half_bits>;
using BFloat16Format = SixteenBitFormat<bfloat16_bits_to_float, float_to_bfloat16_bits>;

__device__ __forceinline__ bool is_pack_aligned(long long address) { return (address & 15) == 0; }

// ---------------------------------------------------------------------------------------------
// Reductions. Every thread of the block must call block_reduce_sum (it contains __syncthreads).

template <typename T>
__device__ __forceinline__ T warp_reduce_sum(T value)
{
    // Butterfly: every lane ends with the same sum, added in the same order on every run.
    for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
        value = add_ieee(value, __shfl_xor_sync(kFullWarpMask, value, offset));
    }
    return value;
}

// The block's sum, valid in warp 0 (thread 0 writes it out).
template <typename T>
__device__ T block_reduce_sum(T value)
{
    __shared__ T warp_sums[kMaxWarpsPerBlock];
    const int lane = threadIdx.x % kWarpSize;
    const int warp = threadIdx.x / kWarpSize;
    const int num_warps = blockDim.x / kWarpSize;

    value = warp_reduce_sum(value);
    if (lane == 0) warp_sums[warp] = value;
    __syncthreads();  // warp 0 reads every warp's sum

    T total = 0;
    if (warp == 0) {
        total = warp_reduce_sum(lane < num_warps ? warp_sums[lane] : T(0));
    }
    __syncthreads();  // the next call (next chunk) overwrites warp_sums only after warp 0 read it
    return total;
}

// The row holding global chunk `chunk`: the last row whose first_chunk <= chunk.
__device__ __forceinline__ const GradTableRow& find_row(const GradTableRow* table, int num_tensors,
                                                        long long chunk)
{
    int low = 0;
    int high = num_tensors - 1;
    while (low < high) {
        const int middle = (low + high + 1) / 2;
        if (table[middle].first_chunk <= chunk) {
            low = middle;
        } else {
            high = middle - 1;
        }
    }
    return table[low];
}

// ---------------------------------------------------------------------------------------------
// Per-chunk work. `count` elements starting at element `begin` of the row's tensor.

template <typename Format>
__device__ float chunk_sum_of_squares(const GradTableRow& row, long long begin, int count)
{
    const typename Format::Storage* chunk =
        reinterpret_cast<const typename Format::Storage*>(row.address) + begin;
    ASSUME_GLOBAL(chunk);
    float sum = 0.0f;
    int tail_begin = 0;
    if (is_pack_aligned(row.address)) {
        const Pack128* packs = reinterpret_cast<const Pack128*>(chunk);
        const int num_packs = count / Format::kPerPack;
#pragma unroll 4
        for (int p = threadIdx.x; p < num_packs; p += blockDim.x) {
            const Pack128 pack = packs[p];
#pragma unroll
            for (int i = 0; i < Format::kPerPack; ++i) {
                const float x = Format::unpack(pack, i);
                sum = fma_ieee(x, x, sum);
            }
        }
        tail_begin = num_packs * Format::kPerPack;
    }
    for (int i = tail_begin + threadIdx.x; i < count; i += blockDim.x) {
        const float x = Format::load(chunk + i);
        sum = fma_ieee(x, x, sum);
    }
    return sum;
}

template <typename Format>
__device__ void scale_chunk(const GradTableRow& row, long long begin, int count, float scale)
{
    typename Format::Storage* chunk = reinterpret_cast<typename Format::Storage*>(row.address) + begin;
    ASSUME_GLOBAL(chunk);
    int tail_begin = 0;
    if (is_pack_aligned(row.address)) {
        Pack128* packs = reinterpret_cast<Pack128*>(chunk);
        const int num_packs = count / Format::kPerPack;
#pragma unroll 4
        for (int p = threadIdx.x; p < num_packs; p += blockDim.x) {
            Pack128 pack = packs[p];
#pragma unroll
            for (int i = 0; i < Format::kPerPack; ++i) {
                Format::repack(pack, i, mul_ieee(Format::unpack(pack, i), scale));
            }
            packs[p] = pack;
        }
        tail_begin = num_packs * Format::kPerPack;
    }
    for (int i = tail_begin + threadIdx.x; i < count; i += blockDim.x) {
        Format::store(chunk + i, mul_ieee(Format::load(chunk + i), scale));
    }
}

// ---------------------------------------------------------------------------------------------
// Kernels. Launch with blockDim.x a multiple of 32, at most 1024; any grid size.

// partial_sums[c] = sum of squares of chunk c, for c in [0, num_chunks).
extern "C" __global__ void k_grad_norm_partial(const GradTableRow* table, int num_tensors,
                                               long long num_chunks, long long chunk_elements,
                                               float* partial_sums)
{
    // The loop bound is the same for every thread of the block, so all of them reach the
    // __syncthreads inside block_reduce_sum together.
    for (long long chunk = blockIdx.x; chunk < num_chunks; chunk += gridDim.x) {
        const GradTableRow& row = find_row(table, num_tensors, chunk);
        const long long begin = (chunk - row.first_chunk) * chunk_elements;
        const long long remaining = row.numel - begin;
        const int count = static_cast<int>(remaining < chunk_elements ? remaining : chunk_elements);
        float sum;
        switch (row.dtype) {
        case GRAD_DTYPE_FLOAT32: sum = chunk_sum_of_squares<Float32Format>(row, begin, count); break;
        case GRAD_DTYPE_FLOAT16: sum = chunk_sum_of_squares<Float16Format>(row, begin, count); break;
        case GRAD_DTYPE_BFLOAT16: sum = chunk_sum_of_squares<BFloat16Format>(row, begin, count); break;
        default: sum = __uint_as_float(0x7fc00000u);  // unknown dtype code: poison the norm (NaN)
        }
        const float chunk_sum = block_reduce_sum(sum);
        if (threadIdx.x == 0) partial_sums[chunk] = chunk_sum;
    }
}

// One block. Writes the pre-clip norm, the scale to multiply by and whether the norm is NaN/inf.
extern "C" __global__ void k_grad_norm_final(const float* partial_sums, long long num_chunks,
                                             float max_norm, float eps, float* norm_out,
                                             float* scale_out, int* nonfinite_out)
{
    double sum = 0.0;
    for (long long i = threadIdx.x; i < num_chunks; i += blockDim.x) {
        sum += widen_ieee(partial_sums[i]);
    }
    sum = block_reduce_sum(sum);
    if (threadIdx.x == 0) {
        const double norm = sqrt(sum);
        const bool nonfinite = !isfinite(norm);
        const float norm32 = narrow_ieee(norm);
        // torch computes max_norm / (norm + eps) as reciprocal(norm + eps) * max_norm in fp32;
        // the same operations give the same scale for the same norm.
        const float coefficient = mul_ieee(div_ieee(1.0f, add_ieee(norm32, eps)), max_norm);
        *norm_out = norm32;
        *scale_out = (nonfinite || !less_than_one(coefficient)) ? 1.0f : coefficient;
        *nonfinite_out = nonfinite ? 1 : 0;
    }
}

// g *= *scale for every chunk; a no-op when *scale == 1 (not clipped, or non-finite norm).
extern "C" __global__ void k_grad_scale(const GradTableRow* table, int num_tensors,
                                        long long num_chunks, long long chunk_elements,
                                        const float* scale)
{
    const float factor = *scale;
    if (__float_as_uint(factor) == 0x3f800000u) return;  // == 1.0f, without an fp32 compare
    for (long long chunk = blockIdx.x; chunk < num_chunks; chunk += gridDim.x) {
        const GradTableRow& row = find_row(table, num_tensors, chunk);
        const long long begin = (chunk - row.first_chunk) * chunk_elements;
        const long long remaining = row.numel - begin;
        const int count = static_cast<int>(remaining < chunk_elements ? remaining : chunk_elements);
        switch (row.dtype) {
        case GRAD_DTYPE_FLOAT32: scale_chunk<Float32Format>(row, begin, count, factor); break;
        case GRAD_DTYPE_FLOAT16: scale_chunk<Float16Format>(row, begin, count, factor); break;
        case GRAD_DTYPE_BFLOAT16: scale_chunk<BFloat16Format>(row, begin, count, factor); break;
        default: break;  // unknown dtype: the norm is already NaN, so the scale is 1 and we never get here
        }
    }
}
