/* kernels.cu - the CUDA kernels of qsa_runtime, compiled at run time by NVRTC.
 *
 * `make` embeds this file into kernels.cu.inc (one C string per line, after a `#line 1 "kernels.cu"`
 * so that NVRTC diagnostics name lines of this file); the header hands that text to NVRTC.
 * Edit this file, never the .inc; CI fails when the two differ (`make check-kernels`).
 *
 * Rules (SPEC section 6):
 *   - no #include: NVRTC 11 ships no headers, so everything used here is a compiler builtin;
 *   - sm_70-level instructions only (the default target is compute_70 PTX): fp16 conversions by
 *     inline PTX `cvt`, tensor cores by PTX `wmma.*.m16n16k16`; no ldmatrix, cp.async, bf16 MMA;
 *   - entry points are `extern "C" __global__ void qsa_k_<op>` so their names are not mangled.
 *
 * Conventions:
 *   - fp16 tensors travel as their bit patterns (`qsa_f16`, an unsigned short);
 *   - all arithmetic and accumulation is fp32; fp16 only at loads and stores;
 *   - every reduction runs in an order fixed by the launch shape (no atomics, no dependence on
 *     timing), so a given launch gives bitwise-identical results run after run;
 *   - each kernel's comment states its grid/block shape; the host must launch it that way.
 */

typedef unsigned short qsa_f16;
typedef unsigned char qsa_u8;
typedef unsigned int qsa_u32;
typedef unsigned long long qsa_u64;
typedef long long qsa_i64;

#define QSA_FULL_MASK 0xffffffffu

/* ---------------------------------------------------------------------------------------------- */
/* helpers                                                                                         */
/* ---------------------------------------------------------------------------------------------- */

/* fp16 bits -> fp32 (exact). */
static __device__ __forceinline__ float qsa_f16_to_f32(qsa_f16 h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}

/* fp32 -> fp16 bits, round to nearest even (overflow gives infinity, as in the CPU path). */
static __device__ __forceinline__ qsa_f16 qsa_f32_to_f16(float f) {
    qsa_f16 h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}

/* Butterfly sum over the 32 lanes of a warp.  Every lane ends with the same bits: at each step
   lanes i and i^m add the same two numbers, and fp32 addition is commutative. */
static __device__ __forceinline__ float qsa_warp_sum(float v) {
    for (int m = 16; m > 0; m >>= 1) v += __shfl_xor_sync(QSA_FULL_MASK, v, m);
    return v;
}

/* Sum over a block whose size is a multiple of 32 (at most 1024), in a fixed order: each warp
   sums its lanes, then warp 0 sums the per-warp partials in warp order.  `scratch` is 33 floats
   of shared memory.  Every thread gets the total. */
static __device__ float qsa_block_sum(float v, float *scratch) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    v = qsa_warp_sum(v);
    __syncthreads(); /* scratch may still be in use by a previous call */
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    if (warp == 0) {
        float t = qsa_warp_sum(lane < nwarps ? scratch[lane] : 0.0f);
        if (lane == 0) scratch[32] = t;
    }
    __syncthreads();
    return scratch[32];
}

/* Loads the 8 fp16 values p[0..7] as floats; values at or past `valid` read as zero.  A 16-byte
   vector load is used when the whole chunk is valid and p is 16-byte aligned.  Both paths give
   the same numbers, so callers' results do not depend on alignment. */
static __device__ __forceinline__ void qsa_load8_f16(float *v, const qsa_f16 *p, int valid) {
    if (valid >= 8 && (((qsa_u64)p) & 15u) == 0) {
        uint4 u = *(const uint4 *)p;
        qsa_u32 w[4] = {u.x, u.y, u.z, u.w};
        for (int k = 0; k < 4; k++) {
            v[2 * k] = qsa_f16_to_f32((qsa_f16)(w[k] & 0xffffu)); /* little endian: low half first */
            v[2 * k + 1] = qsa_f16_to_f32((qsa_f16)(w[k] >> 16));
        }
    } else {
        for (int k = 0; k < 8; k++) v[k] = k < valid ? qsa_f16_to_f32(p[k]) : 0.0f;
    }
}

/* FP4 E2M1 code (bit 3 sign, bits 0-2 magnitude code) -> value.  Twice the magnitudes
   0, 0.5, 1, 1.5, 2, 3, 4, 6 are 0, 1, 2, 3, 4, 6, 8, 12: one hex digit each of 0xC8643210. */
static __device__ __forceinline__ float qsa_e2m1_to_f32(qsa_u32 code) {
    float mag = 0.5f * (float)((0xC8643210u >> ((code & 7u) * 4u)) & 15u);
    return (code & 8u) ? -mag : mag;
}

/* FP8 E4M3 ("fn": bias 7, no infinities, S.1111.111 is NaN) -> value. */
static __device__ __forceinline__ float qsa_e4m3_to_f32(qsa_u32 b) {
    qsa_u32 e = (b >> 3) & 15u, m = b & 7u;
    float v;
    if (e == 0) v = (float)m * 0.001953125f; /* subnormal: m/8 * 2^-6 */
    else if (e == 15u && m == 7u) v = __int_as_float(0x7fc00000);
    else v = __int_as_float((int)(((e + 120u) << 23) | (m << 20))); /* (1 + m/8) * 2^(e-7) */
    return (b & 0x80u) ? -v : v;
}

/* ---------------------------------------------------------------------------------------------- */
/* qsa_k_rmsnorm                                                                                   */
/* ---------------------------------------------------------------------------------------------- */

/* y[r,:] = x[r,:] * rsqrt(mean(x[r,:]^2) + eps) * (w_offset + w[:])       (rows of length n)
 *
 * The Qwen4-Exp norms use zero-centred weights (`1 + w`): pass w_offset = 1.  The GDN output norm
 * uses a plain weight: w_offset = 0.  Math is fp32 as in the reference (x.float(), then the cast
 * back to fp16 at the very end).  y may equal x (in place).  Group norms (the hyper-connection
 * norms over hidden_size-sized groups) are rows of length hidden_size.
 * Launch: grid (rows), block a multiple of 32 up to 1024 (256 recommended). */
extern "C" __global__ void qsa_k_rmsnorm(qsa_f16 *y, const qsa_f16 *x, const qsa_f16 *__restrict__ w,
                                         float w_offset, int n, float eps) {
    __shared__ float scratch[33];
    const qsa_f16 *xr = x + (qsa_i64)blockIdx.x * n;
    qsa_f16 *yr = y + (qsa_i64)blockIdx.x * n;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        float v = qsa_f16_to_f32(xr[i]);
        ss = fmaf(v, v, ss);
    }
    float inv = rsqrtf(qsa_block_sum(ss, scratch) / (float)n + eps);
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        float v = qsa_f16_to_f32(xr[i]) * inv;
        yr[i] = qsa_f32_to_f16(v * (w_offset + qsa_f16_to_f32(w[i])));
    }
}

/* ---------------------------------------------------------------------------------------------- */
/* qsa_k_embed_gather                                                                              */
/* ---------------------------------------------------------------------------------------------- */

/* out[t,:] = table[ids[t],:]     (fp16 rows of length dim; table has `vocab` rows)
 *
 * An id outside [0, vocab) gives a zero row: the host validates ids before launching, this only
 * keeps a bad id from reading out of bounds.  `table` may be host memory mapped into the device
 * address space (the huge PLE table), so each row is read exactly once.
 * Launch: grid (ceil(dim / blockDim.x), ntok), any block size (256 recommended). */
extern "C" __global__ void qsa_k_embed_gather(qsa_f16 *__restrict__ out, const qsa_f16 *__restrict__ table,
                                              const int *__restrict__ ids, int ntok, int dim, qsa_i64 vocab) {
    int t = blockIdx.y;
    int j = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= ntok || j >= dim) return;
    qsa_i64 id = ids[t];
    out[(qsa_i64)t * dim + j] = (id >= 0 && id < vocab) ? table[id * dim + j] : (qsa_f16)0;
}

/* ---------------------------------------------------------------------------------------------- */
/* qsa_k_gemv_f16                                                                                  */
/* ---------------------------------------------------------------------------------------------- */

/* y[b,r] = sum_c W[r,c] * x[b,c]      W fp16 [rows, cols] row-major, x fp16 [batch, cols]
 *
 * Writes y (fp16 [batch, rows]) and/or y32 (fp32 [batch, rows]), whichever is non-null.
 * One warp per output row.  Fixed reduction order: lane L owns the 8-element chunks L, L+32,
 * L+64, ... of the row and accumulates them in ascending order with fmaf; then the warp butterfly
 * adds the 32 lane sums.  The order depends only on cols, never on alignment or timing.
 * Launch: grid (ceil(rows / 8), batch), block 256 (8 warps = 8 rows). */
extern "C" __global__ void qsa_k_gemv_f16(qsa_f16 *__restrict__ y, float *__restrict__ y32,
                                          const qsa_f16 *__restrict__ W, const qsa_f16 *__restrict__ x,
                                          int rows, int cols) {
    int lane = threadIdx.x & 31;
    int r = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    int b = blockIdx.y;
    if (r >= rows) return; /* whole warps leave together */
    const qsa_f16 *wr = W + (qsa_i64)r * cols;
    const qsa_f16 *xb = x + (qsa_i64)b * cols;
    float acc = 0.0f;
    for (int c = lane * 8; c < cols; c += 32 * 8) {
        float wv[8], xv[8];
        qsa_load8_f16(wv, wr + c, cols - c);
        qsa_load8_f16(xv, xb + c, cols - c);
        for (int k = 0; k < 8; k++) acc = fmaf(wv[k], xv[k], acc);
    }
    acc = qsa_warp_sum(acc);
    if (lane == 0) {
        if (y) y[(qsa_i64)b * rows + r] = qsa_f32_to_f16(acc);
        if (y32) y32[(qsa_i64)b * rows + r] = acc;
    }
}

/* ---------------------------------------------------------------------------------------------- */
/* qsa_k_nvfp4_gemv                                                                                */
/* ---------------------------------------------------------------------------------------------- */

/* y[b,r] = sum_c dq(W)[r,c] * x[b,c]     NVFP4 weights (ModelOpt), fp16 activations (W4A16)
 *
 *   wq     U8 [rows, cols/2]: element 2i is the low nibble of byte i, element 2i+1 the high one;
 *          a nibble is sign (bit 3) | E2M1 magnitude code (0, 0.5, 1, 1.5, 2, 3, 4, 6)
 *   scale  F8_E4M3 [rows, cols/16]: one scale per 16 consecutive elements of a row
 *   scale2 fp32: the tensor's global scale (weight_scale_2)
 *   dq(W)[r,c] = e2m1(wq[r,c]) * e4m3(scale[r, c/16]) * scale2
 *
 * cols must be a multiple of 16.  One warp per output row.  Fixed order: lane L owns the
 * 16-element groups L, L+32, ...; per group it sums e2m1 * x in element order (fp32), multiplies
 * by the group scale and adds to its accumulator; the warp butterfly adds the lanes; scale2 is
 * applied last.  Writes y (fp16) and/or y32 (fp32), whichever is non-null.
 * Launch: grid (ceil(rows / 8), batch), block 256 (8 warps = 8 rows). */
extern "C" __global__ void qsa_k_nvfp4_gemv(qsa_f16 *__restrict__ y, float *__restrict__ y32,
                                            const qsa_u8 *__restrict__ wq, const qsa_u8 *__restrict__ scale,
                                            float scale2, const qsa_f16 *__restrict__ x, int rows, int cols) {
    int lane = threadIdx.x & 31;
    int r = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    int b = blockIdx.y;
    if (r >= rows) return;
    int groups = cols / 16;
    const qsa_u8 *qr = wq + (qsa_i64)r * (cols / 2);
    const qsa_u8 *sr = scale + (qsa_i64)r * groups;
    const qsa_f16 *xb = x + (qsa_i64)b * cols;
    float acc = 0.0f;
    for (int g = lane; g < groups; g += 32) {
        const qsa_u8 *q = qr + g * 8;
        qsa_u32 lo, hi; /* the group's 8 bytes = 16 nibbles, element order from the low nibble up */
        if ((((qsa_u64)q) & 7u) == 0) {
            uint2 u = *(const uint2 *)q;
            lo = u.x;
            hi = u.y;
        } else {
            lo = (qsa_u32)q[0] | ((qsa_u32)q[1] << 8) | ((qsa_u32)q[2] << 16) | ((qsa_u32)q[3] << 24);
            hi = (qsa_u32)q[4] | ((qsa_u32)q[5] << 8) | ((qsa_u32)q[6] << 16) | ((qsa_u32)q[7] << 24);
        }
        float xv[16];
        qsa_load8_f16(xv, xb + g * 16, 8);
        qsa_load8_f16(xv + 8, xb + g * 16 + 8, 8);
        float gs = 0.0f;
        for (int k = 0; k < 8; k++) gs = fmaf(qsa_e2m1_to_f32((lo >> (4 * k)) & 15u), xv[k], gs);
        for (int k = 0; k < 8; k++) gs = fmaf(qsa_e2m1_to_f32((hi >> (4 * k)) & 15u), xv[8 + k], gs);
        acc = fmaf(gs, qsa_e4m3_to_f32(sr[g]), acc);
    }
    acc = qsa_warp_sum(acc) * scale2;
    if (lane == 0) {
        if (y) y[(qsa_i64)b * rows + r] = qsa_f32_to_f16(acc);
        if (y32) y32[(qsa_i64)b * rows + r] = acc;
    }
}

/* ---------------------------------------------------------------------------------------------- */
/* qsa_k_gemm_f16_wmma                                                                             */
/* ---------------------------------------------------------------------------------------------- */

/* C[M,N] = A[M,K] * B[N,K]^T on tensor cores (PTX wmma m16n16k16: fp16 in, fp32 accumulate)
 *
 * A: activations, row-major, row stride K.  B: weights in the checkpoint's [out, in] row-major
 * layout, which is B^T stored column-major: the "col" layout of the b operand, stride K.
 * Writes C32 (fp32, row stride N) and/or C16 (fp16, row stride N), whichever is non-null.
 * Requirements: M, N, K multiples of 16 (the host pads), A, B, C32, C16 32-byte aligned.
 * One warp per 16x16 tile of C; k runs in ascending order, so for a given GPU the result is fixed.
 * Launch: grid (ceil(N / 64), M / 16), block 128 (4 warps along N). */
extern "C" __global__ void qsa_k_gemm_f16_wmma(float *__restrict__ C32, qsa_f16 *__restrict__ C16,
                                               const qsa_f16 *__restrict__ A, const qsa_f16 *__restrict__ B,
                                               int M, int N, int K) {
    __shared__ __align__(32) float stage[4][16 * 16]; /* per-warp fp32 tile for the fp16 store; 1 KB each */
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int m0 = blockIdx.y * 16, n0 = (blockIdx.x * 4 + warp) * 16;
    if (m0 >= M || n0 >= N) return; /* whole warps leave together */
    float d0 = 0.0f, d1 = 0.0f, d2 = 0.0f, d3 = 0.0f, d4 = 0.0f, d5 = 0.0f, d6 = 0.0f, d7 = 0.0f;
    for (int k0 = 0; k0 < K; k0 += 16) {
        const qsa_f16 *pa = A + (qsa_i64)m0 * K + k0;
        const qsa_f16 *pb = B + (qsa_i64)n0 * K + k0;
        qsa_u32 a0, a1, a2, a3, a4, a5, a6, a7, b0, b1, b2, b3, b4, b5, b6, b7;
        asm volatile("wmma.load.a.sync.aligned.row.m16n16k16.f16 {%0, %1, %2, %3, %4, %5, %6, %7}, [%8], %9;"
                     : "=r"(a0), "=r"(a1), "=r"(a2), "=r"(a3), "=r"(a4), "=r"(a5), "=r"(a6), "=r"(a7)
                     : "l"(pa), "r"(K)
                     : "memory");
        asm volatile("wmma.load.b.sync.aligned.col.m16n16k16.f16 {%0, %1, %2, %3, %4, %5, %6, %7}, [%8], %9;"
                     : "=r"(b0), "=r"(b1), "=r"(b2), "=r"(b3), "=r"(b4), "=r"(b5), "=r"(b6), "=r"(b7)
                     : "l"(pb), "r"(K)
                     : "memory");
        asm volatile("wmma.mma.sync.aligned.row.col.m16n16k16.f32.f32 "
                     "{%0, %1, %2, %3, %4, %5, %6, %7}, "
                     "{%8, %9, %10, %11, %12, %13, %14, %15}, "
                     "{%16, %17, %18, %19, %20, %21, %22, %23}, "
                     "{%0, %1, %2, %3, %4, %5, %6, %7};"
                     : "+f"(d0), "+f"(d1), "+f"(d2), "+f"(d3), "+f"(d4), "+f"(d5), "+f"(d6), "+f"(d7)
                     : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(a4), "r"(a5), "r"(a6), "r"(a7),
                       "r"(b0), "r"(b1), "r"(b2), "r"(b3), "r"(b4), "r"(b5), "r"(b6), "r"(b7));
    }
    if (C32) {
        float *pc = C32 + (qsa_i64)m0 * N + n0;
        asm volatile("wmma.store.d.sync.aligned.row.m16n16k16.f32 [%0], {%1, %2, %3, %4, %5, %6, %7, %8}, %9;"
                     :
                     : "l"(pc), "f"(d0), "f"(d1), "f"(d2), "f"(d3), "f"(d4), "f"(d5), "f"(d6), "f"(d7), "r"(N)
                     : "memory");
    }
    if (C16) {
        /* The fragment's element-to-lane mapping is unspecified: go through shared memory. */
        float *st = stage[warp];
        asm volatile("wmma.store.d.sync.aligned.row.m16n16k16.f32 [%0], {%1, %2, %3, %4, %5, %6, %7, %8}, %9;"
                     :
                     : "l"(st), "f"(d0), "f"(d1), "f"(d2), "f"(d3), "f"(d4), "f"(d5), "f"(d6), "f"(d7), "r"(16)
                     : "memory");
        __syncwarp();
        for (int i = lane; i < 256; i += 32)
            C16[(qsa_i64)(m0 + i / 16) * N + n0 + i % 16] = qsa_f32_to_f16(st[i]);
    }
}
