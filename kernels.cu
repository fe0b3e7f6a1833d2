/* kernels.cu - the CUDA kernels of qsa_runtime, compiled at run time by NVRTC.
 *
 * `make` embeds this file into kernels.cu.inc (one C string per line, after a `#line 1 "kernels.cu"`
 * so that NVRTC diagnostics name lines of this file); the header hands that text to NVRTC.
 * Edit this file, never the .inc; CI fails when the two differ (`make check-kernels`).
 *
 * Rules (SPEC section 6):
 *   - no #include: NVRTC 11 ships no headers, so everything used here is a compiler builtin;
 *     no static_assert (NVRTC 11.8 rejects it when compiling for sm_80+): QSA_CT_CHECK;
 *   - sm_70-level instructions (the default target is compute_70 PTX): fp16 conversions by inline
 *     PTX `cvt`, tensor cores by PTX `wmma.*.m16n16k16`; no bf16 MMA; cp.async, ldmatrix and
 *     mma.m16n8k16 only under `__CUDA_ARCH__ >= 800` (QSA_CPA), the e4m3 conversion under 890,
 *     each with the sm_70 path beside it;
 *   - entry points are `extern "C" __global__ void qsa_k_<op>` so their names are not mangled, and
 *     each starts with QSA_PDL_ENTRY() (the one sm_90 instruction pair, compiled only there).
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

/* Compile-time check: QSA_CT_CHECK(cond) fails to compile when cond is false.  NVRTC 11.8 compiling
 * for sm_80+ reports static_assert as an undefined identifier in these sources, so this is spelled
 * with a template that is only defined for true. */
template <bool> struct qsa_ct_check;
template <> struct qsa_ct_check<true> { enum { ok = 1 }; };
#define QSA_CT_CHECK(cond) ((void)qsa_ct_check<(cond)>::ok)

/* First statement of every entry point.  Launched as a programmatic dependent (the host's
 * qsa__cu_launch_ex on sm_90+), a kernel may be resident before the previous kernel of its stream
 * has finished: griddepcontrol.wait holds it until that kernel has completed and its writes are
 * visible, then launch_dependents lets the next kernel be scheduled behind this one.  Launched
 * normally, both are no-ops.  Nothing may be read or written before it (tests/t_jit.c checks that
 * every entry point waits before any memory access), with one exception: QSA_PDL_LATE() marks a
 * kernel that issues some loads first and reaches QSA_PDL_ENTRY() before it stores anything or
 * loads anything else, so those loads overlap the previous kernel's tail.  It may load early only
 * what no kernel writes (weights: the dense GEMV) or what no kernel since the one before its
 * predecessor has written (a GDN layer's recurrent state, the residual stream X, the output of a
 * projection two launches back): a kernel starts only once its predecessor has passed its own wait
 * (QSA_PDL_ENTRY waits, then lets dependents launch; a predecessor that is not a kernel of ours, a
 * copy or an event, is waited for whole), so every earlier launch of the stream has completed.
 * Each such kernel names what it loads early and who last wrote it. */
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define QSA_PDL_ENTRY() asm volatile("griddepcontrol.wait;\n\tgriddepcontrol.launch_dependents;" ::: "memory")
#else
#define QSA_PDL_ENTRY() ((void)0)
#endif
#define QSA_PDL_LATE() ((void)0)

/* The module in parts.  The host compiles this file as QSA__PARTS programs over its threads, program p
 * with -DQSA_PART=p holding only the entry points of part p (each definition sits in #if QSA_IN_PART(p)):
 * what is compiled once per program is the parse, and the helpers and templates are emitted only
 * where an entry point of the part uses them, so the parts' NVRTC and driver JIT run side by side.  An
 * entry point's code is the whole program's (tested: jit/module_parts_hold_the_whole_programs_kernels).
 * The parts were balanced on each entry point's compile time and PTX size (session 68, nvcc -ptx for
 * compute_90), then on NVRTC 13.0's sm_90 CUBIN time (session 69: qsa_k_moe_gate_up alone takes ~5.2 s of the
 * ~48 s, so part 0 holds little else); a new entry point goes in the lightest part.  Without QSA_PART (nvrtc-check, the kernel
 * tests' modules) the program holds every entry point. */
#ifdef QSA_PART
#define QSA_IN_PART(p) ((p) == QSA_PART)
#else
#define QSA_IN_PART(p) 1
#endif

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

#if __CUDA_ARCH__ < 890
/* FP8 E4M3 ("fn": bias 7, no infinities, S.1111.111 is NaN) -> value (sm_89+: a cvt instruction). */
static __device__ __forceinline__ float qsa_e4m3_to_f32(qsa_u32 b) {
    qsa_u32 e = (b >> 3) & 15u, m = b & 7u;
    float v;
    if (e == 0) v = (float)m * 0.001953125f; /* subnormal: m/8 * 2^-6 */
    else if (e == 15u && m == 7u) v = __int_as_float(0x7fc00000);
    else v = __int_as_float((int)(((e + 120u) << 23) | (m << 20))); /* (1 + m/8) * 2^(e-7) */
    return (b & 0x80u) ? -v : v;
}
#endif

/* Bytes 0 and 1 of v (two e4m3 block scales) as two fp16 (bits 0-15: byte 0's): exact, every e4m3 value
   is an fp16 (the subnormals 2^-9 .. 7 * 2^-9 are normal fp16 numbers) and a NaN stays a NaN.  One
   conversion on sm_89+. */
static __device__ __forceinline__ qsa_u32 qsa_e4m3x2_to_h2(qsa_u32 v) {
#if __CUDA_ARCH__ >= 890
    qsa_u32 h;
    asm("{\n .reg .b16 t;\n cvt.u16.u32 t, %1;\n cvt.rn.f16x2.e4m3x2 %0, t;\n}" : "=r"(h) : "r"(v));
    return h;
#else
    return (qsa_u32)qsa_f32_to_f16(qsa_e4m3_to_f32(v & 0xffu)) |
           ((qsa_u32)qsa_f32_to_f16(qsa_e4m3_to_f32((v >> 8) & 0xffu)) << 16);
#endif
}

/* ============================================================================================== */
/* helpers of this file                                                                            */
/* ============================================================================================== */

#define QSA_NEG_INF __int_as_float((int)0xff800000u)
#define QSA_QNAN __int_as_float(0x7fc00000)
#define QSA_INF __int_as_float(0x7f800000)

/* The CPU reference's formulas (parts/model.h qsa__sigmoid / qsa__silu): expf and an IEEE
   division (NVRTC's defaults: -prec-div=true, no fast math). */
static __device__ __forceinline__ float qsa_sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }
static __device__ __forceinline__ float qsa_silu(float x) { return x / (1.0f + expf(-x)); }
/* act = 0: silu, 1: sigmoid (qsa_act: QSA_ACT_SILU = 0, QSA_ACT_SIGMOID = 1) */
static __device__ __forceinline__ float qsa_act(int act, float x) { return act ? qsa_sigmoid(x) : qsa_silu(x); }

/* Maximum over a block (multiple of 32 threads).  Max is exact, so the order does not matter;
   NaN inputs are ignored (fmaxf).  `scratch` is 33 floats. */
static __device__ float qsa_block_max(float v, float *scratch) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    for (int m = 16; m > 0; m >>= 1) v = fmaxf(v, __shfl_xor_sync(QSA_FULL_MASK, v, m));
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    if (warp == 0) {
        float t = lane < nwarps ? scratch[lane] : QSA_NEG_INF;
        for (int m = 16; m > 0; m >>= 1) t = fmaxf(t, __shfl_xor_sync(QSA_FULL_MASK, t, m));
        if (lane == 0) scratch[32] = t;
    }
    __syncthreads();
    return scratch[32];
}

/* (v2, i2) beats (v1, i1): larger value, ties to the lower index.  NaN never beats anything. */
static __device__ __forceinline__ int qsa_better(float v2, int i2, float v1, int i1) {
    return v2 > v1 || (v2 == v1 && i2 < i1);
}

/* Arg-max over a block (multiple of 32 threads): the largest value, lowest index among equals.
   Exact, so order-independent.  Every thread gets the winner; `sv`/`si` are 33 floats / ints. */
static __device__ void qsa_block_argmax(float *v, int *i, float *sv, int *si) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    float bv = *v;
    int bi = *i;
    for (int m = 16; m > 0; m >>= 1) {
        float ov = __shfl_xor_sync(QSA_FULL_MASK, bv, m);
        int oi = __shfl_xor_sync(QSA_FULL_MASK, bi, m);
        if (qsa_better(ov, oi, bv, bi)) { bv = ov; bi = oi; }
    }
    __syncthreads();
    if (lane == 0) { sv[warp] = bv; si[warp] = bi; }
    __syncthreads();
    if (warp == 0) {
        bv = lane < nwarps ? sv[lane] : QSA_NEG_INF;
        bi = lane < nwarps ? si[lane] : 0x7fffffff;
        for (int m = 16; m > 0; m >>= 1) {
            float ov = __shfl_xor_sync(QSA_FULL_MASK, bv, m);
            int oi = __shfl_xor_sync(QSA_FULL_MASK, bi, m);
            if (qsa_better(ov, oi, bv, bi)) { bv = ov; bi = oi; }
        }
        if (lane == 0) { sv[32] = bv; si[32] = bi; }
    }
    __syncthreads();
    *v = sv[32];
    *i = si[32];
}

/* ============================================================================================== */
/* embedding, norms, hyper-connections, elementwise                                                */
/* ============================================================================================== */

/* X[t][s*H + j] = table[ids[t]][j] for every stream s < hc        (table fp16 [V][H], X fp32)
 * The hyper-connection streams start as hc copies of the embedding.  An id outside [0, V) gives a
 * zero row (the host validates ids; this only keeps a bad id from reading out of bounds).
 * Launch: grid (M, Y) with any Y (ceil(H / 256) for small M), block any multiple of 32 (256). */
#if QSA_IN_PART(2)
extern "C" __global__ void qsa_k_embed(const qsa_f16 *__restrict__ table, const int *__restrict__ ids,
                                       float *__restrict__ X, int H, int hc, int V) {
    QSA_PDL_ENTRY();
    qsa_i64 t = blockIdx.x;
    int id = ids[t];
    int ok = id >= 0 && id < V;
    const qsa_f16 *row = table + (qsa_i64)(ok ? id : 0) * H;
    float *x = X + t * hc * H;
    for (int j = blockIdx.y * blockDim.x + threadIdx.x; j < H; j += gridDim.y * blockDim.x) {
        float v = ok ? qsa_f16_to_f32(row[j]) : 0.0f;
        for (int s = 0; s < hc; s++) x[s * H + j] = v;
    }
}
#endif

/* RMSNorm per group: for group g of row t (values x[t][g*group .. g*group+group)):
 *   y = x * (1 / sqrtf(mean(x^2) + eps)) * (one_plus ? 1 + w : w),   w indexed within the row
 *   (w has `dim` entries, w[g*group + i]).
 * The formula and its operation order are the CPU's (qsa__rmsnorm_1p); the sum of squares is a
 * fixed-order block reduction (thread i sums elements i, i+256, ...; then qsa_block_sum), which
 * depends only on `group` and the block size.  y (fp32) and/or y16 (fp16 copy) may be NULL; y may
 * equal x (in place).  dim must be a multiple of group.
 * Launch: grid (M * dim/group), block 256 (the bits depend on the block size: keep 256). */
#if QSA_IN_PART(1)
extern "C" __global__ void qsa_k_rmsnorm(const float *x, const float *__restrict__ w, float *y,
                                         qsa_f16 *__restrict__ y16, int dim, int group, float eps, int one_plus) {
    QSA_PDL_ENTRY();
    __shared__ float scratch[33];
    int gpr = dim / group;
    qsa_i64 row = blockIdx.x / gpr;
    int g = blockIdx.x % gpr;
    qsa_i64 base = row * dim + (qsa_i64)g * group;
    const float *xr = x + base;
    const float *wr = w + (qsa_i64)g * group;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < group; i += blockDim.x) ss += xr[i] * xr[i];
    float inv = 1.0f / sqrtf(qsa_block_sum(ss, scratch) / (float)group + eps);
    for (int i = threadIdx.x; i < group; i += blockDim.x) {
        float v = xr[i] * inv * (one_plus ? 1.0f + wr[i] : wr[i]);
        if (y) y[base + i] = v;
        if (y16) y16[base + i] = qsa_f32_to_f16(v);
    }
}
#endif

/* GatedResidual input mix of one hidden index j: (sum over s ascending of sigmoid(m[s]) * x[s * H])
 * / hc, the CPU's loop (acc += sigmoid * xn without fused multiply-add, then / hc); m: the hc mix
 * weights of j (adjacent: the device's up projection interleaves its rows by stream), x: xn[t] + j. */
static __device__ __forceinline__ float qsa_gres_mix1(const float *m, const float *x, int H, int hc) {
    float acc = 0.0f;
    for (int s = 0; s < hc; s++) acc = __fadd_rn(acc, __fmul_rn(qsa_sigmoid(m[s]), x[(qsa_i64)s * H]));
    return acc / (float)hc;
}

/* GatedResidual input mix:  inp[t][j] = qsa_gres_mix1(mw[t] + j * hc, xn[t] + j) for the mix
 * weights mw [M][H][hc] (interleaved by stream, see qsa__dlin_up_hc) and the normed streams xn
 * [M][hc][H].  inp (fp32) and/or inp16 (fp16) may be NULL.  Launch: grid (M, Y) with any Y
 * (ceil(H / 256) for small M), block any multiple of 32 (256). */
#if QSA_IN_PART(4)
extern "C" __global__ void qsa_k_gres_mix(const float *__restrict__ mw, const float *__restrict__ xn,
                                          float *__restrict__ inp, qsa_f16 *__restrict__ inp16, int H, int hc) {
    QSA_PDL_ENTRY();
    qsa_i64 t = blockIdx.x;
    const float *m = mw + t * hc * H, *x = xn + t * hc * H;
    for (int j = blockIdx.y * blockDim.x + threadIdx.x; j < H; j += gridDim.y * blockDim.x) {
        const float v = qsa_gres_mix1(m + (qsa_i64)j * hc, x + j, H, hc);
        if (inp) inp[t * H + j] = v;
        if (inp16) inp16[t * H + j] = qsa_f32_to_f16(v);
    }
}
#endif

/* x[i] = silu(x[i] * scale) for i < n; x16 (optional) receives the fp16 copy.
 * The CPU computes silu(x / hc); pass scale = 1/hc: identical bits when hc is a power of two
 * (the model's hc_count = 4), otherwise within 1 ulp before the silu.
 * Launch: grid (ceil(n / 256)), block 256 (any grid/block works: grid-stride loop). */
#if QSA_IN_PART(6)
extern "C" __global__ void qsa_k_silu_scale(float *x, qsa_f16 *__restrict__ x16, int n, float scale) {
    QSA_PDL_ENTRY();
    for (qsa_i64 i = (qsa_i64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (qsa_i64)gridDim.x * blockDim.x) {
        float v = qsa_silu(x[i] * scale);
        x[i] = v;
        if (x16) x16[i] = qsa_f32_to_f16(v);
    }
}
#endif

/* qsa_k_inject, then qsa_k_rmsnorm of the updated streams (group H, one_plus: the hyper-connection
 * norm of the next gated residual) in one launch:
 *   X[t][s*H+j] += w * out[t][j]  (w = 2 * sigmoid(inj[t][s] / hc), as qsa_k_inject),
 *   xn[t][s*H+j] = X[t][s*H+j] * (1 / sqrtf(mean_j X[t][s*H+j]^2 + eps)) * (1 + nw[s*H+j]),
 *   xn16 its fp16 copy.  The operations and their order are those of the two kernels (the sum of
 *   squares: thread i adds elements i, i+256, ... then qsa_block_sum), so the same bits (tested).
 *   A decode-sized row loads its norm weights, X's row and the injection logit before the PDL wait
 *   (QSA_PDL_LATE; `out` after it).
 * Launch: grid (M * hc), block 256 (the bits depend on the block size: keep 256). */
#define QSA_IRN_REGS 16 /* rows of up to 16 * blockDim values are held in registers */
#if QSA_IN_PART(5)
extern "C" __global__ void qsa_k_inject_rmsnorm(float *__restrict__ X, const float *__restrict__ inj,
                                                const float *__restrict__ out, const float *__restrict__ nw,
                                                float *__restrict__ xn, qsa_f16 *__restrict__ xn16, int H, int hc,
                                                float eps) {
    QSA_PDL_LATE();
    __shared__ float scratch[33];
    const qsa_i64 t = blockIdx.x / hc, row = blockIdx.x;
    const int s = blockIdx.x % hc;
    const float *wr = nw + (qsa_i64)s * H;
    if (H <= QSA_IRN_REGS * (int)blockDim.x) {
        /* the row in registers: every load of a phase is issued before the first use (a decode
           step's rows are a few thousand values: the loop below waited on memory ~H/256 times per
           phase); the same operations in the same order */
        float v[QSA_IRN_REGS], u[QSA_IRN_REGS], nv[QSA_IRN_REGS];
#pragma unroll
        for (int i = 0; i < QSA_IRN_REGS; i++) {
            const int j = threadIdx.x + i * blockDim.x;
            nv[i] = j < H ? wr[j] : 0.0f;
        }
        /* X's row and the injection logit before the wait too: X was last written by the injection
           before (this launch follows a projection or the MoE's combine), inj by the gated residual's
           down projection group, two or more launches back */
        float *x = X + row * H;
#pragma unroll
        for (int i = 0; i < QSA_IRN_REGS; i++) {
            const int j = threadIdx.x + i * blockDim.x;
            v[i] = j < H ? x[j] : 0.0f;
        }
        const float wl = inj[t * hc + s];
        QSA_PDL_ENTRY();
        const float w = 2.0f * qsa_sigmoid(wl / (float)hc);
        const float *o = out + t * H;
        float ss = 0.0f;
#pragma unroll
        for (int i = 0; i < QSA_IRN_REGS; i++) {
            const int j = threadIdx.x + i * blockDim.x;
            u[i] = j < H ? o[j] : 0.0f;
        }
#pragma unroll
        for (int i = 0; i < QSA_IRN_REGS; i++) {
            const int j = threadIdx.x + i * blockDim.x;
            if (j >= H) break;
            v[i] = __fadd_rn(v[i], __fmul_rn(w, u[i]));
            x[j] = v[i];
            ss += v[i] * v[i];
        }
        const float inv = 1.0f / sqrtf(qsa_block_sum(ss, scratch) / (float)H + eps);
#pragma unroll
        for (int i = 0; i < QSA_IRN_REGS; i++) {
            const int j = threadIdx.x + i * blockDim.x;
            if (j >= H) break;
            const float y = v[i] * inv * (1.0f + nv[i]);
            xn[row * H + j] = y;
            xn16[row * H + j] = qsa_f32_to_f16(y);
        }
        return;
    }
    QSA_PDL_ENTRY();
    const float w = 2.0f * qsa_sigmoid(inj[t * hc + s] / (float)hc);
    float *x = X + row * H;
    const float *o = out + t * H;
    float ss = 0.0f;
    for (int j = threadIdx.x; j < H; j += blockDim.x) {
        const float v = __fadd_rn(x[j], __fmul_rn(w, o[j]));
        x[j] = v;
        ss += v * v;
    }
    const float inv = 1.0f / sqrtf(qsa_block_sum(ss, scratch) / (float)H + eps);
    for (int j = threadIdx.x; j < H; j += blockDim.x) {
        const float v = x[j] * inv * (1.0f + wr[j]);
        xn[row * H + j] = v;
        xn16[row * H + j] = qsa_f32_to_f16(v);
    }
}
#endif

/* X[t][s*H + j] += w * out[t][j] with w = 2 * sigmoid(inj[t][s] / hc), inj the raw injection
 * projection [M][hc]: the weight as the CPU computes it (qsa__inject), then one IEEE multiply and
 * one add, no fused multiply-add.  Launch: grid (M, Y) with any Y (ceil(H / 256) for small M), block
 * any multiple of 32 (256). */
#if QSA_IN_PART(2)
extern "C" __global__ void qsa_k_inject(float *__restrict__ X, const float *__restrict__ inj,
                                        const float *__restrict__ out, int H, int hc) {
    QSA_PDL_ENTRY();
    qsa_i64 t = blockIdx.x;
    float *x = X + t * hc * H;
    const float *o = out + t * H;
    for (int j = blockIdx.y * blockDim.x + threadIdx.x; j < H; j += gridDim.y * blockDim.x) {
        float v = o[j];
        for (int s = 0; s < hc; s++) {
            const float w = 2.0f * qsa_sigmoid(inj[t * hc + s] / (float)hc);
            x[s * H + j] = __fadd_rn(x[s * H + j], __fmul_rn(w, v));
        }
    }
}
#endif

#if QSA_IN_PART(4)
extern "C" __global__ void qsa_k_to_f16(const float *__restrict__ x, qsa_f16 *__restrict__ y, int n) {
    QSA_PDL_ENTRY();
    for (qsa_i64 i = (qsa_i64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (qsa_i64)gridDim.x * blockDim.x)
        y[i] = qsa_f32_to_f16(x[i]);
}
#endif


/* ============================================================================================== */
/* GEMM machinery: tensor cores through PTX wmma m16n16k16 (fp16 in, fp32 accumulate)             */
/* ============================================================================================== */
/*
 * Canonical order (what makes the GEMMs batch invariant).  For every output element
 * Y[m][n] = sum_k A[m][k] W[n][k], K (a multiple of 16) is cut into segments of QSA_SEG = 256
 * (the last may be shorter); segment s gives P_s = a chain of wmma.mma over its 16-wide chunks in
 * ascending k, starting from a zero accumulator; then T = ((0 + P_0) + P_1) + ... in fp32, in
 * ascending s.  Finally y = T (+ bias[n]) and Y = y, or Y = Y + y when accumulating.
 * Two tilings compute exactly this, chosen by M:
 *   - "split-K" (M <= QSA_SPLITK_MAX_M, the decode regime): a block owns one 16x16 output tile;
 *     its 8 warps compute the segments of a round (8 consecutive segments) in parallel, store the
 *     P_s tiles in shared memory, and every thread adds its element's P_s in ascending s.  The
 *     weight stream is read once per 16 rows of A, with 16-byte loads, by many blocks at once.
 *   - "tiled" (larger M, prefill): a block owns a 64x64 tile; each warp a 16x32 sub-tile over the
 *     whole K, adding its P_s fragment into its T fragment at each segment end (same fragment
 *     layout, so it is the same element-wise fp32 add).
 * A row's result depends only on that row of A (the tensor core computes each output element as
 * its own dot product; padding rows are zero or never stored), so a token gives the same bits
 * whatever M is and wherever it sits in the tile.
 * Operands go through shared memory: global loads are 16-byte vectors when aligned (scalar
 * otherwise: same values), rows past M or N and columns past K are zero-filled, stores are
 * predicated.  Shared staging rows are 40 halves (80 bytes) long: 32 data + 8 padding, which keeps
 * wmma.load free of bank conflicts and every fragment pointer 32-byte aligned.
 * NVFP4 weights reach the tensor cores as w' = e2m1 * e4m3 * 2^-14, exact in fp16 (qsa_dq8: no
 * rounding, no table), and each segment's fp32 partial P_s is multiplied by s2 * 2^14 (qsa_pscale, one
 * fp32 rounding) before it is folded or stored, in every path: so sum_s (P_s * s2 * 2^14) is the
 * canonical value of an NVFP4 element, and a power-of-two s2 * 2^14 gives the dense GEMM's bits on
 * the fp16 weights w' (tests/t_gpu_k1.c).
 */

#define QSA_GEMM_THREADS 256   /* 8 warps: required by every GEMM/MoE kernel */
#define QSA_SEG 256            /* canonical K segment (elements) */
#define QSA_ST 40              /* staging row stride in halves */
#define QSA_STW 72             /* staging row stride for the 64-wide NVFP4 sub-steps */
#define QSA_SPLITK_MAX_M 64    /* M up to this: split-K tiling; above: 64x64 tiles */
#define QSA_OST 68             /* fp32 output staging row stride (floats) in the tiled path */
#define QSA_GEMM_SMEM 30720    /* bytes of shared staging (split-K with two weight matrices) */

typedef struct { qsa_u32 x[8]; } qsa_frag_ab;
typedef struct { float x[8]; } qsa_frag_c;

static __device__ __forceinline__ void qsa_frag_zero(qsa_frag_c &c) {
#pragma unroll
    for (int i = 0; i < 8; i++) c.x[i] = 0.0f;
}

/* The shared-window address of a generic pointer into shared memory: the fragment loads and
   stores below name the .shared state space, so ptxas emits shared-memory instructions (a generic
   address compiled to one generic 32-bit load per register: 8 per fragment per lane). */
static __device__ __forceinline__ qsa_u32 qsa_smem_u32(const void *p) {
    qsa_u64 a;
    asm("cvta.to.shared.u64 %0, %1;" : "=l"(a) : "l"(p));
    return (qsa_u32)a;
}
/* A fragment: 16x16 fp16, row-major, ld halves between rows; p in shared memory, 32-byte aligned. */
/* (the _s forms take the shared-window address itself, for loops that compute it once) */
static __device__ __forceinline__ void qsa_wmma_load_a_s(qsa_frag_ab &f, qsa_u32 p, int ld) {
    asm volatile("wmma.load.a.sync.aligned.row.m16n16k16.shared.f16 {%0, %1, %2, %3, %4, %5, %6, %7}, [%8], %9;"
                 : "=r"(f.x[0]), "=r"(f.x[1]), "=r"(f.x[2]), "=r"(f.x[3]), "=r"(f.x[4]), "=r"(f.x[5]),
                   "=r"(f.x[6]), "=r"(f.x[7])
                 : "r"(p), "r"(ld)
                 : "memory");
}
static __device__ __forceinline__ void qsa_wmma_load_a(qsa_frag_ab &f, const qsa_f16 *p, int ld) {
    qsa_wmma_load_a_s(f, qsa_smem_u32(p), ld);
}
/* B fragment: 16(k)x16(n) fp16 stored column-major, i.e. W rows (n) of 16 k values, ld halves apart;
   p in shared memory. */
static __device__ __forceinline__ void qsa_wmma_load_b_s(qsa_frag_ab &f, qsa_u32 p, int ld) {
    asm volatile("wmma.load.b.sync.aligned.col.m16n16k16.shared.f16 {%0, %1, %2, %3, %4, %5, %6, %7}, [%8], %9;"
                 : "=r"(f.x[0]), "=r"(f.x[1]), "=r"(f.x[2]), "=r"(f.x[3]), "=r"(f.x[4]), "=r"(f.x[5]),
                   "=r"(f.x[6]), "=r"(f.x[7])
                 : "r"(p), "r"(ld)
                 : "memory");
}
static __device__ __forceinline__ void qsa_wmma_load_b(qsa_frag_ab &f, const qsa_f16 *p, int ld) {
    qsa_wmma_load_b_s(f, qsa_smem_u32(p), ld);
}
/* c = a * b + c, fp32 accumulate */
static __device__ __forceinline__ void qsa_wmma_mma(qsa_frag_c &c, const qsa_frag_ab &a, const qsa_frag_ab &b) {
    asm volatile("wmma.mma.sync.aligned.row.col.m16n16k16.f32.f32 "
                 "{%0, %1, %2, %3, %4, %5, %6, %7}, "
                 "{%8, %9, %10, %11, %12, %13, %14, %15}, "
                 "{%16, %17, %18, %19, %20, %21, %22, %23}, "
                 "{%0, %1, %2, %3, %4, %5, %6, %7};"
                 : "+f"(c.x[0]), "+f"(c.x[1]), "+f"(c.x[2]), "+f"(c.x[3]), "+f"(c.x[4]), "+f"(c.x[5]),
                   "+f"(c.x[6]), "+f"(c.x[7])
                 : "r"(a.x[0]), "r"(a.x[1]), "r"(a.x[2]), "r"(a.x[3]), "r"(a.x[4]), "r"(a.x[5]), "r"(a.x[6]),
                   "r"(a.x[7]), "r"(b.x[0]), "r"(b.x[1]), "r"(b.x[2]), "r"(b.x[3]), "r"(b.x[4]), "r"(b.x[5]),
                   "r"(b.x[6]), "r"(b.x[7]));
}
/* Stores a 16x16 fp32 accumulator row-major (ld floats between rows; p in shared memory, 32-byte
   aligned). */
static __device__ __forceinline__ void qsa_wmma_store(float *p, const qsa_frag_c &c, int ld) {
    asm volatile("wmma.store.d.sync.aligned.row.m16n16k16.shared.f32 [%0], {%1, %2, %3, %4, %5, %6, %7, %8}, %9;"
                 :
                 : "r"(qsa_smem_u32(p)), "f"(c.x[0]), "f"(c.x[1]), "f"(c.x[2]), "f"(c.x[3]), "f"(c.x[4]), "f"(c.x[5]),
                   "f"(c.x[6]), "f"(c.x[7]), "r"(ld)
                 : "memory");
}

static __device__ __forceinline__ uint4 qsa_u4_zero() {
    uint4 u;
    u.x = u.y = u.z = u.w = 0u;
    return u;
}

/* The unaligned and partial variants of the loads below.  (Out of line, __noinline__, they made
   the kernels ~20% shorter but raised the register counts of the GEMMs: calls clobber registers.) */

/* p[0 .. 8) as 8 fp16 bits, those at or past n (n < 8: a K that is not a multiple of 8 or 16 is
   zero-padded, and zero products leave every sum unchanged) read as zero; p any alignment */
static __device__ __forceinline__ uint4 qsa_ld8_f16_tail(const qsa_f16 *p, int n) {
    qsa_u32 e[8];
#pragma unroll
    for (int i = 0; i < 8; i++) e[i] = i < n ? (qsa_u32)p[i] : 0u;
    uint4 u;
    u.x = e[0] | (e[1] << 16);
    u.y = e[2] | (e[3] << 16);
    u.z = e[4] | (e[5] << 16);
    u.w = e[6] | (e[7] << 16);
    return u;
}

/* p[0 .. n) (n <= 16 bytes) as a little-endian uint4, the rest zero; vec8: p 8-byte aligned and n a
   multiple of 8 (8-byte loads), else byte loads */
static __device__ __forceinline__ uint4 qsa_ld_bytes(const qsa_u8 *p, int n, int vec8) {
    qsa_u32 wd[4] = {0u, 0u, 0u, 0u};
    if (vec8) {
#pragma unroll
        for (int h = 0; h < 2; h++)
            if (8 * h < n) {
                const uint2 v = *(const uint2 *)(p + 8 * h);
                wd[2 * h] = v.x;
                wd[2 * h + 1] = v.y;
            }
    } else {
#pragma unroll
        for (int i = 0; i < 16; i++)
            if (i < n) wd[i >> 2] |= (qsa_u32)p[i] << (8 * (i & 3));
    }
    uint4 u;
    u.x = wd[0];
    u.y = wd[1];
    u.z = wd[2];
    u.w = wd[3];
    return u;
}

/* row[k .. k+8) as 8 fp16 bits; zero when row is NULL or k >= K.  vec: row + k is 16-byte aligned. */
static __device__ __forceinline__ uint4 qsa_ld8_f16(const qsa_f16 *row, int k, int K, int vec) {
    if (!row || k >= K) return qsa_u4_zero();
    const qsa_f16 *p = row + k;
    if (vec && k + 8 <= K) return *(const uint4 *)p;
    return qsa_ld8_f16_tail(p, K - k);
}

/* One weight source: a dense fp16 matrix [N][K] or an NVFP4 one (q [N][K/2], s [N][K/16], s2). */
typedef struct {
    const qsa_f16 *w16;   /* dense, or NULL for NVFP4 */
    const qsa_u8 *q, *s;
    float s2;
    int vec;              /* dense: w16 16-byte aligned; NVFP4: q 8-byte aligned (rows are K/2 = 8j bytes) */
    int vec16;            /* NVFP4: q 16-byte aligned and K % 32 == 0, so 16-byte pieces of rows are aligned */
    int svec16;           /* NVFP4: s 16-byte aligned and K % 256 == 0: a segment's 16 scale bytes of a row
                             are one aligned 16-byte piece */
} qsa_wsrc;

static __device__ __forceinline__ qsa_wsrc qsa_wsrc_f16(const qsa_f16 *w) {
    qsa_wsrc r;
    r.w16 = w;
    r.q = r.s = 0;
    r.s2 = 0.0f;
    r.vec = (((qsa_u64)w) & 15u) == 0;
    r.vec16 = r.svec16 = 0;
    return r;
}
static __device__ __forceinline__ qsa_wsrc qsa_wsrc_nvfp4(const qsa_u8 *q, const qsa_u8 *s, float s2, int K) {
    qsa_wsrc r;
    r.w16 = 0;
    r.q = q;
    r.s = s;
    r.s2 = s2;
    r.vec = (((qsa_u64)q) & 7u) == 0;
    r.vec16 = (((qsa_u64)q) & 15u) == 0 && (K & 31) == 0;
    r.svec16 = (((qsa_u64)s) & 15u) == 0 && (K & 255) == 0;
    return r;
}

/* NVFP4 in the split-K core: a lane owns weight row n0 + (lane >> 1) and, in every 32-element sub-step
   j of the segment, the half (lane & 1): 16 weights = 8 bytes of q and their scale byte.  All 8
   sub-steps are loaded when the segment starts (a warp then has 2 KB of packed weights in flight;
   one sub-step alone would be 256 bytes).  Halves at or past kend (a multiple of 16) read as zero. */
static __device__ __forceinline__ void qsa_ld_nvfp4_seg(const qsa_wsrc &w, int n, int N, int kbeg, int kend, int K,
                                                        int half, uint2 *q8, qsa_u32 *sc) {
#pragma unroll
    for (int j = 0; j < QSA_SEG / 32; j++) q8[j].x = q8[j].y = 0u;
    sc[0] = sc[1] = 0u;
    if (n >= N) return;
    const qsa_u8 *qr = w.q + (qsa_i64)n * (K >> 1), *sr = w.s + (qsa_i64)n * (K >> 4);
#pragma unroll
    for (int j = 0; j < QSA_SEG / 32; j++) {
        const int k = kbeg + 32 * j + 16 * half;
        if (k < kend) {
            const qsa_u8 *p = qr + (k >> 1);
            if (w.vec) {
                q8[j] = *(const uint2 *)p;
            } else {
                q8[j].x = (qsa_u32)p[0] | ((qsa_u32)p[1] << 8) | ((qsa_u32)p[2] << 16) | ((qsa_u32)p[3] << 24);
                q8[j].y = (qsa_u32)p[4] | ((qsa_u32)p[5] << 8) | ((qsa_u32)p[6] << 16) | ((qsa_u32)p[7] << 24);
            }
            sc[j >> 2] |= (qsa_u32)sr[k >> 4] << (8 * (j & 3));
        }
    }
}

/* Dequantisation without tables.  The tensor cores get w' = e2m1 * e4m3 * 2^-14, which fp16 holds
 * exactly: the nibble's magnitude bits (exponent e, mantissa m) placed at fp16 bits 11-10 and 9, with
 * its sign at bit 15, are e2m1 * 2^-14 (code 1, 0.5, is the subnormal 2^-15), and the product with
 * the block scale (an fp16 itself) has at most 6 significant bits and is a multiple of 2^-24, the
 * smallest fp16 subnormal (checked for all 16 x 255 finite pairs; the bit placement for random words).
 * The global scale times 2^14 multiplies each segment's fp32 partial P_s (qsa_pscale) before it is
 * folded or stored, in every NVFP4 path alike; the weights are never rounded.
 * On the device every 32-bit word of packed weights is in the dequantisation's order
 * (qsa_k_nvfp4_order, run once on upload; the checkpoint's byte j holds elements 2j and 2j + 1):
 * elements 0, 1, 2, 3 sit in bytes 1, 3, 0, 2 already as fp16 high bytes (sign at bit 7, magnitude
 * at bits 3-1), so that one mask makes the fp16 pair of elements 0 and 1 and a shift and a mask that
 * of 2 and 3; elements 4-7 share those bytes, magnitude at bits 6-4 and sign at bit 0, and two shifts
 * and two masks move all four to the fp16 high-byte bits, where a byte permute against zero makes
 * each pair (qsa_nvfp4_put).  Per 8 weights: 7 integer operations on the ALU pipe, which the
 * decode expert kernels fill (9 in the previous order, where elements 0-3 took the steps that 4-7
 * take), 2 shifts on the multiply pipe and an fp16x2 multiply per pair: 13 instructions.
 * Which 8 elements of a row a word holds — the fragment order: when K is a multiple of 32 (every
 * real shape), the 4 words t = 0..3 of each 32-element block (16 bytes) hold, as the word's elements
 * j = 0..7, the block's k = 2 t + 8 (j / 2) + j % 2: exactly what lane t of a quad holds of that row
 * in the mma's fragments of the block's two chunks of 16 (qsa_segs16_nvd dequantises them straight
 * into registers).  The forms that stage rows in shared memory dequantise the block's 4 words and
 * regroup the fp16 pairs in registers (qsa_dq32, qsa_dq16h: the same instructions).  Otherwise (K an
 * odd multiple of 16) word i of a row holds its elements 8 i .. 8 i + 7. */
static __device__ __forceinline__ qsa_u32 qsa_prmt(qsa_u32 a, qsa_u32 b, qsa_u32 sel) {
    qsa_u32 d;
    asm("prmt.b32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(sel));
    return d;
}
/* a (fp16x2) times half H of sp (0: bits 0-15) in both halves.  sp holds block scales as fp16 (a group's
   scale, or two groups' side by side), and ptxas reads the broadcast as an operand selector of the
   multiply (HMUL2 R, R, R.H0_H0): no instruction makes the scale pairs. */
template <int H>
static __device__ __forceinline__ qsa_u32 qsa_hmul2s(qsa_u32 a, qsa_u32 sp) {
    qsa_u32 d;
    if (H == 0)
        asm("{\n .reg .b16 l, h;\n .reg .b32 t;\n mov.b32 {l, h}, %2;\n mov.b32 t, {l, l};\n mul.rn.f16x2 %0, %1, t;\n}"
            : "=r"(d)
            : "r"(a), "r"(sp));
    else
        asm("{\n .reg .b16 l, h;\n .reg .b32 t;\n mov.b32 {l, h}, %2;\n mov.b32 t, {h, h};\n mul.rn.f16x2 %0, %1, t;\n}"
            : "=r"(d)
            : "r"(a), "r"(sp));
    return d;
}
/* Element j (0..7) of a device word with code c (sign bit 3, magnitude bits 2-0) as the word's bits:
   j < 4 in byte 1, 3, 0, 2 (j = 0, 1, 2, 3) at bit 7 (sign) and 3-1 (magnitude); j >= 4 in the byte of
   j - 4 at bits 6-4 (magnitude) and 0 (sign) */
static __device__ __forceinline__ qsa_u32 qsa_nvfp4_put(int j, qsa_u32 c) {
    const int b = 2 * (j & 1) + 1 - ((j >> 1) & 1);
    return (j < 4 ? ((c & 8u) << 4) | ((c & 7u) << 1) : ((c & 7u) << 4) | (c >> 3)) << (8 * b);
}
/* Elements 4-7 of a device word moved to the fp16 high-byte bits of their bytes (sign 7, magnitude 3-1) */
static __device__ __forceinline__ qsa_u32 qsa_nvfp4_hi(qsa_u32 w) {
    return ((w >> 3) & 0x0E0E0E0Eu) | ((w << 7) & 0x80808080u);
}
/* The fp16 pairs of elements 0, 1 and 2, 3 of a device word, or of qsa_nvfp4_hi's 4, 5 and 6, 7 */
#define QSA_NVFP4_P01 0x8E008E00u
/* 8 elements (one 32-bit word of q in the device order, qsa_nvfp4_put) as fp16 bits of e2m1 * scale *
   2^-14: elements 0-3 times half HL of sp, 4-7 times half HH (qsa_hmul2s) */
template <int HL = 0, int HH = HL>
static __device__ __forceinline__ uint4 qsa_dq8(qsa_u32 w, qsa_u32 sp) {
    const qsa_u32 hi = qsa_nvfp4_hi(w);
    uint4 u;
    u.x = qsa_hmul2s<HL>(w & QSA_NVFP4_P01, sp);        /* elements 0, 1: bytes 1, 3 */
    u.y = qsa_hmul2s<HL>((w << 8) & QSA_NVFP4_P01, sp); /* 2, 3: bytes 0, 2 */
    u.z = qsa_hmul2s<HH>(qsa_prmt(hi, 0u, 0x3414u), sp); /* 4, 5: bytes (0, hi 1, 0, hi 3) */
    u.w = qsa_hmul2s<HH>(qsa_prmt(hi, 0u, 0x2404u), sp); /* 6, 7: bytes (0, hi 0, 0, hi 2) */
    return u;
}
/* Packed NVFP4 weights from the checkpoint's order (element i of a row in nibble i % 8 of its word
 * i / 8) into the device order (above), in place: n words (4 bytes each; rows are K / 2 = 8j bytes);
 * frag (K % 32 == 0, so n % 4 == 0 and every 4 words are one block): the fragment order.  The host
 * runs it once per packed tensor after its upload (qsa__dlin_up); the tests check it against their
 * host permutation (k1_order_q).  Launch: any grid, any block. */
#if QSA_IN_PART(5)
extern "C" __global__ void qsa_k_nvfp4_order(qsa_u32 *q, qsa_i64 n, int frag) {
    QSA_PDL_ENTRY();
    const qsa_i64 nb = frag ? n / 4 : n; /* units: blocks of 4 words, or single words */
    for (qsa_i64 i = (qsa_i64)blockIdx.x * blockDim.x + threadIdx.x; i < nb; i += (qsa_i64)gridDim.x * blockDim.x) {
        if (!frag) {
            const qsa_u32 w = q[i];
            qsa_u32 r = 0u;
#pragma unroll
            for (int j = 0; j < 8; j++) r |= qsa_nvfp4_put(j, (w >> (4 * j)) & 15u);
            q[i] = r;
            continue;
        }
        const qsa_u32 src[4] = {q[4 * i], q[4 * i + 1], q[4 * i + 2], q[4 * i + 3]};
        qsa_u32 r[4];
#pragma unroll
        for (int t = 0; t < 4; t++) {
            r[t] = 0u;
#pragma unroll
            for (int j = 0; j < 8; j++) {
                const int e = 2 * t + 8 * (j >> 1) + (j & 1); /* the block's element */
                r[t] |= qsa_nvfp4_put(j, (src[e >> 3] >> (4 * (e & 7))) & 15u);
            }
        }
#pragma unroll
        for (int t = 0; t < 4; t++) q[4 * i + t] = r[t];
    }
}
#endif
/* Elements 0-3 (h = 0) or 4-7 (h = 1) of a device word as two fp16x2 (0, 1 and 2, 3 of the four) times
   the low half of sp: the same instructions for either h (h may differ between a warp's lanes) */
static __device__ __forceinline__ uint2 qsa_dq4(qsa_u32 w, int h, qsa_u32 sp) {
    const qsa_u32 v = h ? qsa_nvfp4_hi(w) : w;
    return make_uint2(qsa_hmul2s<0>(v & QSA_NVFP4_P01, sp), qsa_hmul2s<0>((v << 8) & QSA_NVFP4_P01, sp));
}
/* A block in the fragment order (its 4 words) as its 32 elements in row order, dst[i] = k 8 i .. 8 i + 7;
   sp: its two group scales (low half: the first 16 k's, which a word's elements 0-3 are, at k 2 t,
   2 t + 1, 2 t + 8, 2 t + 9; elements 4-7 at k 2 t + 16 .. 2 t + 25) */
static __device__ __forceinline__ void qsa_dq32(uint4 q, qsa_u32 sp, uint4 *dst) {
    const uint4 d0 = qsa_dq8<0, 1>(q.x, sp), d1 = qsa_dq8<0, 1>(q.y, sp), d2 = qsa_dq8<0, 1>(q.z, sp),
                d3 = qsa_dq8<0, 1>(q.w, sp);
    dst[0] = make_uint4(d0.x, d1.x, d2.x, d3.x);
    dst[1] = make_uint4(d0.y, d1.y, d2.y, d3.y);
    dst[2] = make_uint4(d0.z, d1.z, d2.z, d3.z);
    dst[3] = make_uint4(d0.w, d1.w, d2.w, d3.w);
}
/* Half h of such a block (k 16 h .. 16 h + 15, one group: its scale the low half of sc2) in row order,
   dst[0..1] */
static __device__ __forceinline__ void qsa_dq16h(uint4 q, int h, qsa_u32 sc2, uint4 *dst) {
    const uint2 d0 = qsa_dq4(q.x, h, sc2), d1 = qsa_dq4(q.y, h, sc2), d2 = qsa_dq4(q.z, h, sc2),
                d3 = qsa_dq4(q.w, h, sc2);
    dst[0] = make_uint4(d0.x, d1.x, d2.x, d3.x);
    dst[1] = make_uint4(d0.y, d1.y, d2.y, d3.y);
}
/* The block of a lane pair (lanes 2i, 2i + 1 of the warp, or threads of a block likewise) of which
   each loaded 8 bytes (the even lane bytes 0-7, the odd lane 8-15), whole in both: every lane calls it */
static __device__ __forceinline__ uint4 qsa_pair_block(uint2 mine) {
    const qsa_u32 ox = __shfl_xor_sync(QSA_FULL_MASK, mine.x, 1), oy = __shfl_xor_sync(QSA_FULL_MASK, mine.y, 1);
    return (threadIdx.x & 1) ? make_uint4(ox, oy, mine.x, mine.y) : make_uint4(mine.x, mine.y, ox, oy);
}
/* The block scale of byte 0 of b as the low half of an fp16 pair (the high half: unused) */
static __device__ __forceinline__ qsa_u32 qsa_scale1(qsa_u32 b) {
#if __CUDA_ARCH__ >= 890
    return qsa_e4m3x2_to_h2(b); /* (the one cvt converts byte 1 as well) */
#else
    return (qsa_u32)qsa_f32_to_f16(qsa_e4m3_to_f32(b & 0xffu));
#endif
}
/* The factor of an NVFP4 source's segment partials, and the multiply: a separate fp32 rounding
   (never contracted into the fold's addition), so that every path gives the same bits. */
static __device__ __forceinline__ float qsa_pscale_of(const qsa_wsrc &w) { return w.s2 * 16384.0f; }
template <int NE = 8>
static __device__ __forceinline__ void qsa_pscale(qsa_frag_c &P, float ps) {
#pragma unroll
    for (int i = 0; i < NE; i++) P.x[i] = __fmul_rn(P.x[i], ps);
}

/* W[n][k .. k+8) as fp16 bits (k a multiple of 8; rows are K long); zero when n >= N or k >= kend.
   NVFP4: e2m1 * e4m3 * 2^-14 (qsa_dq8; the global scale goes on the segment's partial).  NV = false:
   callers whose sources are dense (no NVFP4 code in their kernels). */
template <bool NV = true>
static __device__ __forceinline__ uint4 qsa_ld8_w(const qsa_wsrc &w, int n, int N, int k, int kend, int K) {
    if (n >= N || k >= kend) return qsa_u4_zero();
    if (!NV || w.w16) return qsa_ld8_f16(w.w16 + (qsa_i64)n * K, k, kend, w.vec && !(K & 7)); /* rows 16-byte aligned */
    const qsa_u32 sc2 = qsa_scale1(w.s[(qsa_i64)n * (K >> 4) + (k >> 4)]);
    if (!(K & 31)) { /* the fragment order: pair (k / 8) % 2 of half (k / 16) % 2 of the block's 4 words */
        const uint4 b = qsa_ld_bytes(w.q + (qsa_i64)n * (K >> 1) + ((k >> 5) << 4), 16, w.vec);
        uint4 d[2];
        qsa_dq16h(b, (k >> 4) & 1, sc2, d);
        return d[(k >> 3) & 1];
    }
    const qsa_u8 *q = w.q + (qsa_i64)n * (K >> 1) + (k >> 1);
    qsa_u32 b;
    if (w.vec) b = *(const qsa_u32 *)q;
    else b = (qsa_u32)q[0] | ((qsa_u32)q[1] << 8) | ((qsa_u32)q[2] << 16) | ((qsa_u32)q[3] << 24);
    return qsa_dq8(b, sc2);
}

/* One warp: P[b] = the 16 x 16 tile (rows arow[0..15], weight rows n0..n0+15 of ws[b]) over
 * segment `seg` of K, in the canonical order (sub-steps of 32 from the segment's start, 2 mma of
 * k = 16 each, into a zeroed fragment; NVFP4 sources then scaled).  Without NV, NB = 1 takes dense
 * weights only (NB = 2 may mix the kinds, through the generic loads).  sa / sw: the warp's staging,
 * A [16][QSA_ST] then NB x W [16][QSA_ST] halves. */
template <int NB, bool NV, bool PW = false, bool PF1 = false>
static __device__ __forceinline__ void qsa_seg16(const qsa_f16 *const *arow, int avec, const qsa_wsrc *ws, int n0,
                                                 int N, int K, int seg, qsa_f16 *sa, qsa_f16 *sw, qsa_frag_c *P) {
    const int lane = threadIdx.x & 31;
    /* this lane's two 8-element pieces of a 16 x 32 sub-step: piece c = lane + 32 i, row c / 4 */
    const int r0 = lane >> 2, r1 = r0 + 8, kp = (lane & 3) * 8;
    /* NVFP4: this lane's weight row and half of each sub-step */
    const int nr = lane >> 1, nh = lane & 1;
#pragma unroll
    for (int b = 0; b < NB; b++) qsa_frag_zero(P[b]);
    const int kbeg = seg * QSA_SEG, kend = min(K, kbeg + QSA_SEG);
    const qsa_f16 *a0 = arow[r0], *a1 = arow[r1];
    /* dense single matrix: the whole segment's weights are loaded when it starts (8 KB per
       warp in flight, what a bandwidth-bound GEMV needs); otherwise, or with PF1 (a cold
       fallback that must not set its kernel's register count), one sub-step ahead */
    enum { PF = (!NV && NB == 1 && !PF1) ? QSA_SEG / 32 : 1 };
    /* A: a lane whose row r1 is padding (every lane when M <= 8: decode) keeps its r0 pieces
       of 4 sub-steps in flight (ra[j % 4]); otherwise both rows one sub-step ahead (ra[0..1]) */
    const bool deep = a1 == 0;
    uint4 ra[4], rw0[PF][NB], rw1[PF][NB];
    uint2 q8[NV ? NB : 1][QSA_SEG / 32];
    qsa_u32 sc[NV ? NB : 1][2];
    /* PW: the weights first, then the PDL wait (QSA_PDL_LATE), then the activations */
    if (!PW) {
        ra[0] = qsa_ld8_f16(a0, kbeg + kp, kend, avec);
        ra[1] = qsa_ld8_f16(deep ? a0 : a1, kbeg + (deep ? 32 : 0) + kp, kend, avec);
        ra[2] = qsa_ld8_f16(deep ? a0 : 0, kbeg + 64 + kp, kend, avec);
        ra[3] = qsa_ld8_f16(deep ? a0 : 0, kbeg + 96 + kp, kend, avec);
    }
#pragma unroll
    for (int b = 0; b < NB; b++) {
        if (NV) {
            qsa_ld_nvfp4_seg(ws[b], n0 + nr, N, kbeg, kend, K, nh, q8[NV ? b : 0], sc[NV ? b : 0]);
        } else {
#pragma unroll
            for (int j = 0; j < PF; j++) {
                rw0[j][b] = qsa_ld8_w<(NB > 1)>(ws[b], n0 + r0, N, kbeg + 32 * j + kp, kend, K);
                rw1[j][b] = qsa_ld8_w<(NB > 1)>(ws[b], n0 + r1, N, kbeg + 32 * j + kp, kend, K);
            }
        }
    }
    if (PW) {
        QSA_PDL_ENTRY();
        ra[0] = qsa_ld8_f16(a0, kbeg + kp, kend, avec);
        ra[1] = qsa_ld8_f16(deep ? a0 : a1, kbeg + (deep ? 32 : 0) + kp, kend, avec);
        ra[2] = qsa_ld8_f16(deep ? a0 : 0, kbeg + 64 + kp, kend, avec);
        ra[3] = qsa_ld8_f16(deep ? a0 : 0, kbeg + 96 + kp, kend, avec);
    }
#pragma unroll
    for (int j = 0; j < QSA_SEG / 32; j++) {
        const int k0 = kbeg + 32 * j;
        if (k0 >= kend) break;
        __syncwarp();
        *(uint4 *)(sa + r0 * QSA_ST + kp) = deep ? ra[j & 3] : ra[0];
        *(uint4 *)(sa + r1 * QSA_ST + kp) = deep ? qsa_u4_zero() : ra[1];
        if (NV) { /* every lane dequantises its 16 weights of this sub-step (the fragment order: its
                     half of the block, whose other 8 bytes the pair's other lane loaded) */
#pragma unroll
            for (int b = 0; b < NB; b++) {
                const uint2 qq = q8[NV ? b : 0][j];
                const qsa_u32 sc2 = qsa_scale1(sc[NV ? b : 0][j >> 2] >> (8 * (j & 3)));
                uint4 *dst = (uint4 *)(sw + b * 16 * QSA_ST + nr * QSA_ST + nh * 16);
                if (!(K & 31)) {
                    qsa_dq16h(qsa_pair_block(qq), nh, sc2, dst);
                } else {
                    dst[0] = qsa_dq8(qq.x, sc2);
                    dst[1] = qsa_dq8(qq.y, sc2);
                }
            }
        } else {
#pragma unroll
            for (int b = 0; b < NB; b++) {
                *(uint4 *)(sw + b * 16 * QSA_ST + r0 * QSA_ST + kp) = rw0[PF > 1 ? j : 0][b];
                *(uint4 *)(sw + b * 16 * QSA_ST + r1 * QSA_ST + kp) = rw1[PF > 1 ? j : 0][b];
            }
        }
        __syncwarp();
        const int kn = k0 + 32;
        if (deep) ra[j & 3] = qsa_ld8_f16(a0, k0 + 128 + kp, kend, avec);
        if (kn < kend) { /* prefetch the next sub-step while the tensor cores work */
            if (!deep) {
                ra[0] = qsa_ld8_f16(a0, kn + kp, kend, avec);
                ra[1] = qsa_ld8_f16(a1, kn + kp, kend, avec);
            }
            if (!NV && PF == 1) {
#pragma unroll
                for (int b = 0; b < NB; b++) {
                    rw0[0][b] = qsa_ld8_w<(NB > 1)>(ws[b], n0 + r0, N, kn + kp, kend, K);
                    rw1[0][b] = qsa_ld8_w<(NB > 1)>(ws[b], n0 + r1, N, kn + kp, kend, K);
                }
            }
        }
        qsa_frag_ab fa, fb;
        qsa_wmma_load_a(fa, sa, QSA_ST);
#pragma unroll
        for (int b = 0; b < NB; b++) {
            qsa_wmma_load_b(fb, sw + b * 16 * QSA_ST, QSA_ST);
            qsa_wmma_mma(P[b], fa, fb);
        }
        if (k0 + 16 < kend) {
            qsa_wmma_load_a(fa, sa + 16, QSA_ST);
#pragma unroll
            for (int b = 0; b < NB; b++) {
                qsa_wmma_load_b(fb, sw + b * 16 * QSA_ST + 16, QSA_ST);
                qsa_wmma_mma(P[b], fa, fb);
            }
        }
    }
#pragma unroll
    for (int b = 0; b < NB; b++)
        if (NV || (NB > 1 && !ws[b].w16)) qsa_pscale(P[b], qsa_pscale_of(ws[b])); /* (mixed kinds: generic loads) */
}

/* qsa_seg16<1, false, true> (one dense matrix; the weights, then the PDL wait, then the
 * activations) with the segment's 16 x 256 weights copied straight into shared memory by cp.async
 * (sm_80+): no weight registers and no register-to-shared stores, so more warps fit per SM and
 * more bytes are in flight, and the sub-step loop is rolled (a decode GEMV's warp runs it once).
 * The A staging, the fragments and the mma are those of qsa_seg16, in the same order: the same
 * bits (tested through the GEMV kernels against the one-block GEMM).  W rows 16-byte aligned
 * (W aligned, K % 8 == 0).  sa: A [16][QSA_ST] halves; sw: W [16][QSA_SWS] halves, 32-byte
 * aligned. */
#define QSA_SWS (QSA_SEG + 8)
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
#define QSA_CPA 1
/* The segment [kbeg, kend) of W rows n0 .. n0 + 15 into sw [16][QSA_SWS] by cp.async, committed as one
   group: row i of the tile is 512 contiguous bytes, lane l copies the 16 at k = kbeg + 8 l; rows >= N
   and k >= kend are zero-filled (source size 0) */
/* 16 bytes from src (ok) or zeros into the shared address dst */
static __device__ __forceinline__ void qsa_cp16z(qsa_u32 dst, const void *src, bool ok) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(ok ? 16 : 0) : "memory");
}
static __device__ __forceinline__ void qsa_cpa_w16(const qsa_f16 *W, int n0, int N, int K, int kbeg, int kend,
                                                   qsa_f16 *sw) {
    const int k = kbeg + 8 * (threadIdx.x & 31);
    const qsa_u32 dst = qsa_smem_u32(sw + 8 * (threadIdx.x & 31));
#pragma unroll
    for (int i = 0; i < 16; i++) {
        const bool ok = n0 + i < N && k < kend;
        qsa_cp16z(dst + i * QSA_SWS * 2, ok ? W + (qsa_i64)(n0 + i) * K + k : W, ok);
    }
    asm volatile("cp.async.commit_group;" ::: "memory");
}
static __device__ __forceinline__ void qsa_seg16_cpa(const qsa_f16 *const *arow, int avec, const qsa_f16 *W, int n0,
                                                     int N, int K, int seg, qsa_f16 *sa, qsa_f16 *sw, qsa_frag_c &P) {
    const int lane = threadIdx.x & 31;
    const int kbeg = seg * QSA_SEG, kend = min(K, kbeg + QSA_SEG);
    qsa_cpa_w16(W, n0, N, K, kbeg, kend, sw);
    QSA_PDL_ENTRY();
    /* A as in qsa_seg16: a lane's r0 pieces of 4 sub-steps in flight when row r1 is padding (deep:
       every lane when M <= 8), else both rows one sub-step ahead; here they shift down (ra[0] is
       the current sub-step's) */
    const int r0 = lane >> 2, r1 = r0 + 8, kp = (lane & 3) * 8;
    const qsa_f16 *a0 = arow[r0], *a1 = arow[r1];
    const bool deep = a1 == 0;
    uint4 ra[4];
    ra[0] = qsa_ld8_f16(a0, kbeg + kp, kend, avec);
    ra[1] = qsa_ld8_f16(deep ? a0 : a1, kbeg + (deep ? 32 : 0) + kp, kend, avec);
    ra[2] = qsa_ld8_f16(deep ? a0 : 0, kbeg + 64 + kp, kend, avec);
    ra[3] = qsa_ld8_f16(deep ? a0 : 0, kbeg + 96 + kp, kend, avec);
    qsa_frag_zero(P);
    asm volatile("cp.async.wait_group 0;" ::: "memory");
#pragma unroll 1
    for (int j = 0; j < QSA_SEG / 32; j++) {
        const int k0 = kbeg + 32 * j;
        if (k0 >= kend) break;
        __syncwarp(); /* (j = 0: every lane's weights have landed) */
        *(uint4 *)(sa + r0 * QSA_ST + kp) = ra[0];
        *(uint4 *)(sa + r1 * QSA_ST + kp) = deep ? qsa_u4_zero() : ra[1];
        __syncwarp();
        if (deep) {
            ra[0] = ra[1];
            ra[1] = ra[2];
            ra[2] = ra[3];
            ra[3] = qsa_ld8_f16(a0, k0 + 128 + kp, kend, avec);
        } else if (k0 + 32 < kend) {
            ra[0] = qsa_ld8_f16(a0, k0 + 32 + kp, kend, avec);
            ra[1] = qsa_ld8_f16(a1, k0 + 32 + kp, kend, avec);
        }
        qsa_frag_ab fa, fb;
        qsa_wmma_load_a(fa, sa, QSA_ST);
        qsa_wmma_load_b(fb, sw + 32 * j, QSA_SWS);
        qsa_wmma_mma(P, fa, fb);
        if (k0 + 16 < kend) {
            qsa_wmma_load_a(fa, sa + 16, QSA_ST);
            qsa_wmma_load_b(fb, sw + 32 * j + 16, QSA_SWS);
            qsa_wmma_mma(P, fa, fb);
        }
    }
}
#else
#define QSA_CPA 0
#endif

/* qsa_seg16 for NVFP4 weights in sub-steps of 64 (the cross-warp kernels: more staging per warp
 * than the 8-warp split-K core can hold).  Lane (nr = lane / 2, nh = lane % 2) owns weight row
 * n0 + nr and, in sub-step J, the 32 weights at k = kbeg + 64 J + 32 nh: one 16-byte load, so a warp
 * reads 16 rows x 32 contiguous bytes (whole sectors; the 32-wide form read 16-byte halves of them),
 * all 4 sub-steps issued when the segment starts; the segment's 16 scale bytes of the row come in
 * one 16-byte load (svec16) or byte by byte.  A: lane piece i holds row lane / 8 + 4 i, k + 8 (lane
 * % 8) of the sub-step (a quarter-warp stores one row's 128 contiguous bytes), one sub-step ahead.
 * The mma are the same k = 16 steps in the same order into the same fragment: the same bits as
 * qsa_seg16<1, true> (tested through the kernels that use it).  sa / sw: A [16][QSA_STW] then W
 * [16][QSA_STW] halves.  (Copying the packed weights into shared memory by cp.async, the next
 * segment's in flight, gained nothing at B = 32 over this form; over the leaner fast form below,
 * qsa_seg16_nvf, it does: qsa_segs16_nvf_pipe.) */
template <bool ROLL>
static __device__ __forceinline__ void qsa_seg16_nvw(const qsa_f16 *const *arow, int avec, const qsa_wsrc &w, int n0,
                                                     int N, int K, int seg, qsa_f16 *sa, qsa_f16 *sw, qsa_frag_c &P) {
    const int lane = threadIdx.x & 31, nr = lane >> 1, nh = lane & 1, ar = lane >> 3, ak = (lane & 7) * 8;
    qsa_frag_zero(P);
    const int kbeg = seg * QSA_SEG, kend = min(K, kbeg + QSA_SEG);
    uint4 q16[QSA_SEG / 64], sc = qsa_u4_zero();
#pragma unroll
    for (int J = 0; J < QSA_SEG / 64; J++) q16[J] = qsa_u4_zero();
    if (n0 + nr < N) {
        const qsa_u8 *qr = w.q + (qsa_i64)(n0 + nr) * (K >> 1), *sr = w.s + (qsa_i64)(n0 + nr) * (K >> 4) + (kbeg >> 4);
#pragma unroll
        for (int J = 0; J < QSA_SEG / 64; J++) {
            const int k = kbeg + 64 * J + 32 * nh;
            const qsa_u8 *pq = qr + (k >> 1);
            /* 32 weights (16 bytes), or the segment's last 16 (kend is a multiple of 16) */
            if (k + 32 <= kend && w.vec16) q16[J] = *(const uint4 *)pq;
            else if (k + 16 <= kend) q16[J] = qsa_ld_bytes(pq, k + 32 <= kend ? 16 : 8, w.vec);
        }
        if (w.svec16 && kend - kbeg == QSA_SEG) sc = *(const uint4 *)sr;
        else sc = qsa_ld_bytes(sr, (kend - kbeg) >> 4, 0);
    }
    uint4 ra[4];
#pragma unroll
    for (int i = 0; i < 4; i++) ra[i] = qsa_ld8_f16(arow[ar + 4 * i], kbeg + ak, kend, avec);
    /* ROLL: a rolled loop (the sub-step's weights and scale word shift down after each), for warps
       that run it once (a decode GEMV's one segment: unrolled it is 4x the code to fetch); the
       whole-tile kernels, which loop over segments, keep it unrolled (fewer registers) */
    enum { UNR = ROLL ? 1 : QSA_SEG / 64 };
#pragma unroll(UNR)
    for (int J = 0; J < QSA_SEG / 64; J++) {
        const int k0 = kbeg + 64 * J;
        if (k0 >= kend) break;
        __syncwarp();
#pragma unroll
        for (int i = 0; i < 4; i++) *(uint4 *)(sa + (ar + 4 * i) * QSA_STW + ak) = ra[i];
        /* this lane's 32 packed weights of the sub-step and the scale word of groups 4 J .. 4 J + 3
           (its two, 4 J + 2 nh and the next, picked below) */
        const uint4 q = q16[0];
        const qsa_u32 sw32 = sc.x;
#pragma unroll
        for (int i = 0; i + 1 < QSA_SEG / 64; i++) q16[i] = q16[i + 1];
        sc.x = sc.y;
        sc.y = sc.z;
        sc.z = sc.w;
        const qsa_u32 sp = qsa_e4m3x2_to_h2(sw32 >> (16 * nh)); /* this lane's two groups */
        uint4 *dst = (uint4 *)(sw + nr * QSA_STW + nh * 32);
        if (!(K & 31)) {
            qsa_dq32(q, sp, dst);
        } else { /* (the segment's last 16 may be half a piece: q.z, q.w zero) */
            dst[0] = qsa_dq8<0>(q.x, sp);
            dst[1] = qsa_dq8<0>(q.y, sp);
            dst[2] = qsa_dq8<1>(q.z, sp);
            dst[3] = qsa_dq8<1>(q.w, sp);
        }
        __syncwarp();
        if (k0 + 64 < kend) { /* the next sub-step's A while the tensor cores work */
#pragma unroll
            for (int i = 0; i < 4; i++) ra[i] = qsa_ld8_f16(arow[ar + 4 * i], k0 + 64 + ak, kend, avec);
        }
        qsa_frag_ab fa, fb;
#pragma unroll
        for (int c = 0; c < 4; c++) {
            if (k0 + 16 * c >= kend) break;
            qsa_wmma_load_a(fa, sa + 16 * c, QSA_STW);
            qsa_wmma_load_b(fb, sw + 16 * c, QSA_STW);
            qsa_wmma_mma(P, fa, fb);
        }
    }
    qsa_pscale(P, qsa_pscale_of(w));
}

/* qsa_seg16_nvw's fast form: the same loads, dequantisation, staging and mma in the same order,
 * hence the same bits (tested through every kernel that uses it), for the shapes real checkpoints
 * have (qsa_nvf_ok: K a multiple of 64, so every sub-step and chunk is whole; A rows and q rows
 * 16-byte aligned; s rows 4-byte aligned), with the per-element bounds, the per-chunk branches and
 * the shared-address arithmetic of every fragment load out of the loop.  Only A rows below nrows
 * may be non-NULL: the rest are staged as zeros once, so a tile of one pair (decode) loads and
 * stores one A piece per lane per sub-step instead of four.  ROLL as in qsa_seg16_nvw. */
static __device__ __forceinline__ bool qsa_nvf_ok(const qsa_wsrc &w, int avec, int K) {
    return avec && w.vec16 && !(K & 63) && !(((qsa_u64)w.s) & 3u);
}
/* The segment's block scales of one row from sr (that row's scales at the segment start; NULL: a
   row past N, zeros): word J holds groups 4 J .. 4 J + 3; v16: sr is 16-byte aligned. */
static __device__ __forceinline__ void qsa_nvf_scales_at(const qsa_u8 *sr, bool v16, int nsub, qsa_u32 *sc) {
#pragma unroll
    for (int J = 0; J < QSA_SEG / 64; J++) sc[J] = 0u;
    if (!sr) return;
    if (nsub == QSA_SEG / 64 && v16) {
        const uint4 v = __ldg((const uint4 *)sr);
        sc[0] = v.x;
        sc[1] = v.y;
        sc[2] = v.z;
        sc[3] = v.w;
    } else {
#pragma unroll
        for (int J = 0; J < QSA_SEG / 64; J++)
            if (J < nsub) sc[J] = __ldg((const qsa_u32 *)(sr + 4 * J));
    }
}
/* ... of this lane's row (n0 + lane / 2) */
static __device__ __forceinline__ void qsa_nvf_scales(const qsa_wsrc &w, int n0, int N, int K, int seg, qsa_u32 *sc) {
    const int n = n0 + ((threadIdx.x & 31) >> 1), kbeg = seg * QSA_SEG;
    qsa_nvf_scales_at(n < N ? w.s + (qsa_i64)n * (K >> 4) + (kbeg >> 4) : 0, w.svec16, min(QSA_SEG, K - kbeg) >> 6,
                      sc);
}

/* The two halves of a fast-form sub-step.  qsa_nvf_put stages this lane's A pieces ra[i] (i < na)
   and its 32 packed weights q, dequantised with the block scales of its two groups (the bytes of
   sw32 for this lane's half), between __syncwarp's (pieces i with bit i of live); qsa_nvf_mma4 then
   runs the sub-step's 4 mma of k = 16 into P (the next sub-step's A loads can go between the two). */
template <int NA>
static __device__ __forceinline__ void qsa_nvf_put(const uint4 *ra, unsigned live, uint4 q, qsa_u32 sw32,
                                                   qsa_f16 *sa, uint4 *dst) {
    const int lane = threadIdx.x & 31, nh = lane & 1, ar = lane >> 3, ak = (lane & 7) * 8;
    __syncwarp();
#pragma unroll
    for (int i = 0; i < NA; i++)
        if ((live >> i) & 1u) *(uint4 *)(sa + (ar + 4 * i) * QSA_STW + ak) = ra[i];
    qsa_dq32(q, qsa_e4m3x2_to_h2(sw32 >> (16 * nh)), dst); /* (K % 64 == 0: the fragment order) */
    __syncwarp();
}
static __device__ __forceinline__ void qsa_nvf_mma4(qsa_u32 sau, qsa_u32 swu, qsa_frag_c &P) {
#pragma unroll
    for (int c = 0; c < 4; c++) {
        qsa_frag_ab fa, fb;
        qsa_wmma_load_a_s(fa, sau + 32 * c, QSA_STW);
        qsa_wmma_load_b_s(fb, swu + 32 * c, QSA_STW);
        qsa_wmma_mma(P, fa, fb);
    }
}

/* The body of qsa_seg16_nvf: the segment's packed weights of this lane from registers (q16).
   A: this lane's pieces come from rows ap[4 i] (NULL: a zero row) for i < na, column lane % 8 * 8
   of each sub-step; rows lane / 8 + 4 i for i >= na are staged as zeros. */
template <bool ROLL>
static __device__ __forceinline__ void qsa_nvf_run(const qsa_f16 *const *ap, int na, float ps, int kbeg, int nsub,
                                                   uint4 *q16, qsa_u32 *sc, qsa_f16 *sa, qsa_f16 *sw,
                                                   qsa_frag_c &P) {
    const int lane = threadIdx.x & 31, nr = lane >> 1, nh = lane & 1, ar = lane >> 3, ak = (lane & 7) * 8;
    qsa_frag_zero(P);
    __syncwarp(); /* the staging's last readers are done before the zero rows are written */
    uint4 ra[4];
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const qsa_f16 *a = i < na ? ap[4 * i] : 0;
        ra[i] = a ? *(const uint4 *)(a + kbeg + ak) : qsa_u4_zero();
        if (i >= na) *(uint4 *)(sa + (ar + 4 * i) * QSA_STW + ak) = qsa_u4_zero();
    }
    const qsa_u32 sau = qsa_smem_u32(sa), swu = qsa_smem_u32(sw);
    uint4 *dst = (uint4 *)(sw + nr * QSA_STW + nh * 32);
    enum { UNR = ROLL ? 1 : QSA_SEG / 64 };
#pragma unroll(UNR)
    for (int J = 0; J < QSA_SEG / 64; J++) {
        if (J >= nsub) break;
        const uint4 q = q16[0];
        const qsa_u32 sw32 = sc[0];
#pragma unroll
        for (int i = 0; i + 1 < QSA_SEG / 64; i++) {
            q16[i] = q16[i + 1];
            sc[i] = sc[i + 1];
        }
        qsa_nvf_put<4>(ra, (1u << na) - 1u, q, sw32, sa, dst);
        if (J + 1 < nsub) { /* the next sub-step's A while the tensor cores work */
#pragma unroll
            for (int i = 0; i < 4; i++)
                if (i < na) {
                    const qsa_f16 *a = ap[4 * i];
                    ra[i] = a ? *(const uint4 *)(a + kbeg + 64 * (J + 1) + ak) : qsa_u4_zero();
                }
        }
        qsa_nvf_mma4(sau, swu, P);
    }
    qsa_pscale(P, ps);
}

template <bool ROLL>
static __device__ __forceinline__ void qsa_seg16_nvf(const qsa_f16 *const *arow, int nrows, const qsa_wsrc &w,
                                                     int n0, int N, int K, int seg, qsa_f16 *sa, qsa_f16 *sw,
                                                     qsa_frag_c &P) {
    const int lane = threadIdx.x & 31, nr = lane >> 1, nh = lane & 1;
    const int kbeg = seg * QSA_SEG, nsub = min(QSA_SEG, K - kbeg) >> 6;
    uint4 q16[QSA_SEG / 64];
    qsa_u32 sc[QSA_SEG / 64];
#pragma unroll
    for (int J = 0; J < QSA_SEG / 64; J++) q16[J] = qsa_u4_zero();
    if (n0 + nr < N) {
        const qsa_u8 *qr = w.q + (qsa_i64)(n0 + nr) * (K >> 1) + (kbeg >> 1) + 16 * nh;
#pragma unroll
        for (int J = 0; J < QSA_SEG / 64; J++)
            if (J < nsub) q16[J] = *(const uint4 *)(qr + 32 * J);
    }
    qsa_nvf_scales(w, n0, N, K, seg, sc);
    qsa_nvf_run<ROLL>(arow + (lane >> 3), min(4, (nrows + 3) >> 2), qsa_pscale_of(w), kbeg, nsub, q16, sc, sa, sw, P);
}

#if QSA_CPA
/* The whole-tile fold over segments (qsa_segs16) in the fast form, software-pipelined: the warp
 * copies segment s + 1's packed weights (16 rows x up to 128 bytes) into the other half of its pk
 * buffer by cp.async, and loads their scales, before it works on segment s; rows of QSA_PKS bytes
 * (a quarter-warp's 16-byte reads of 4 rows x 2 halves hit distinct banks).  The same values reach
 * the same staging in the same order: the same bits.  Everything that does not change from one
 * segment to the next (this lane's copy sources and destinations, its scale row, its A rows, the
 * zero rows of the staging) is worked out once per tile, and one loop runs the sub-steps of all
 * segments.  Tiles of up to 4 rows (a decode batch's experts mostly get one or two) take the direct
 * form, qsa_segs16_nvd.  N a multiple of 16 (every weight row of a tile is real: the expert kernels
 * trap otherwise), K of 64. */
#define QSA_PKS 160
/* The 4 mma of a sub-step (qsa_nvf_mma4) spelled as the instructions wmma compiles to on sm_80+
   (ldmatrix x4 + mma m16n8k16 twice per chunk, the two halves of the tile's 16 columns into P.x[0..3]
   and P.x[4..7]), from lane addresses worked out once: ab = this lane's A row (lane % 16) at column
   8 (lane / 16), wb = its W row 8 (lane / 16) + lane % 8 at k = 8 (lane / 8 % 2), both shared-window
   byte addresses of the chunk c = 0 (the wmma forms recompute them when registers are short). */
static __device__ __forceinline__ void qsa_ldsm4(qsa_u32 a, qsa_u32 *r) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a)
                 : "memory");
}
static __device__ __forceinline__ void qsa_mma16816(float *d, const qsa_u32 *a, qsa_u32 b0, qsa_u32 b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
                 "{%0, %1, %2, %3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
static __device__ __forceinline__ void qsa_nvf_mma4_ld(qsa_u32 ab, qsa_u32 wb, qsa_frag_c &P) {
#pragma unroll
    for (int c = 0; c < 4; c++) {
        qsa_u32 fa[4], fb[4];
        qsa_ldsm4(ab + 32 * c, fa);
        qsa_ldsm4(wb + 32 * c, fb);
        qsa_mma16816(P.x, fa, fb[0], fb[1]);
        qsa_mma16816(P.x + 4, fa, fb[2], fb[3]);
    }
}

/* qsa_seg16_cpa with the roles of the operands swapped, for A of at most QSA_GEMV_TR_ROWS rows
 * (decode), 16-byte aligned (avec): the segment's 16 W rows, copied by cp.async as there, are the
 * mma's A operand (16 x 16 per chunk, one ldmatrix), and the tile's A rows its B operand (8 columns
 * of m16n8k16), whose fragments each lane loads straight from global memory (row g = lane / 4, NULL
 * past M): no staging of A, no warp barrier in the loop, ~150 instructions per task instead of
 * ~1,700.  Each element is the same 16 products in the same positions of k per chunk, chunk after
 * chunk into a zeroed accumulator: the bits of qsa_seg16_cpa (as qsa_segs16_nvd against
 * qsa_nvf_mma4_ld; tested through the GEMV kernels against the one-block GEMM).  (ptxas places the
 * copy's wait among the activation loads rather than after them.)  d: the mma's D, W rows g and g + 8 against A rows 2 (lane % 4) and + 1 (d[0] (g, 2t), d[1]
 * (g, 2t + 1), d[2] (g + 8, 2t), d[3] (g + 8, 2t + 1)).  sw: W [16][QSA_SWS] halves, 32-byte aligned.
 * (Measured on the H200 against the staged form, eager, per launch: one row (batch 1) the GDN input
 * group 41.4 -> 35.2 us, the out projections 22.9 -> 19.7, lm_head 426 -> 362; eight rows mixed (the
 * GDN input group 50.0 -> 47.9, the HC down group 16.8 -> 18.7); two row groups of 8 (batch 32)
 * slower everywhere (out projections 46.2 -> 50.0): 32 four-byte loads per lane per segment from up to
 * 8 rows cost more than the staging they save.) */
static __device__ __forceinline__ void qsa_seg16_tr(const qsa_f16 *const *arow, const qsa_f16 *W, int n0, int N, int K,
                                                    int seg, qsa_f16 *sw, float *d) {
    const int lane = threadIdx.x & 31, g = lane >> 2;
    const int kbeg = seg * QSA_SEG, kend = min(K, kbeg + QSA_SEG);
    const qsa_f16 *x0 = arow[g]; /* (NULL past M) */
    qsa_cpa_w16(W, n0, N, K, kbeg, kend, sw);
    QSA_PDL_ENTRY();
    /* the B fragments of the whole segment (32 registers), all loads issued before any is used: this
       lane's two halves at k = 16 c + 2 (lane % 4) and + 8, zero from kend on (kend - kbeg is a
       multiple of 8, so k < kend covers k + 1) */
    qsa_u32 xb[QSA_SEG / 16][2];
#pragma unroll
    for (int c = 0; c < QSA_SEG / 16; c++) {
        const int k = kbeg + 16 * c + 2 * (lane & 3);
        xb[c][0] = x0 && k < kend ? __ldg((const qsa_u32 *)(x0 + k)) : 0u;
        xb[c][1] = x0 && k + 8 < kend ? __ldg((const qsa_u32 *)(x0 + k + 8)) : 0u;
    }
#pragma unroll
    for (int i = 0; i < 4; i++) d[i] = 0.0f;
    const qsa_u32 wa = qsa_smem_u32(sw) + 2 * ((lane & 15) * QSA_SWS + (lane >> 4) * 8);
    asm volatile("cp.async.wait_group 0;" ::: "memory");
    __syncwarp(); /* every lane's weights have landed */
#pragma unroll
    for (int c = 0; c < QSA_SEG / 16; c++) {
        if (kbeg + 16 * c >= kend) break;
        qsa_u32 fw[4];
        qsa_ldsm4(wa + 32 * c, fw);
        qsa_mma16816(d, fw, xb[c][0], xb[c][1]);
    }
}

/* RG (a range of the tile's segments, tiles of up to 4 pairs: NA = 1): segments sb .. se - 1 only, and
   each segment's P_s stored as the split forms store it (rg: pair r's row e of segment s at
   rg.p[r * rg.pair + s * rg.seg + e], pairs below rg.cnt) instead of folded into T. */
typedef struct {
    int sb, se;     /* the segment range */
    float *p;       /* the partials of the tile's pair 0, column tile, matrix and segment 0 */
    qsa_i64 pair;   /* floats between pairs */
    int seg, cnt;   /* floats between segments; the tile's pairs */
} qsa_seg_range;
/* The pipelined fold for tiles of up to 4 pairs (a decode batch's experts mostly get one or two; TWO: 8,
 * qsa_moe_lean's passes), with the roles of the mma's operands swapped: the tile's 16 W rows are the A
 * operand (16 x 16 per chunk), its pairs the B operand (8 columns of m16n8k16, staged rows 0-7 in sa's
 * QSA_NVD_SA bytes, below), and each lane dequantises its W fragments straight into registers: lane
 * (g = lane / 4, t = lane % 4) reads word t of each 32-element block of rows g and g + 8, which in the fragment
 * order (K % 64 == 0 here) holds exactly its a0 / a2 (row g) and a1 / a3 (row g + 8) of the block's
 * two chunks — no staging of the dequantised tile and no ldmatrix of it (the staged form issued ~1.6x
 * the instructions per sub-step).  The warp copies segment s + 1's packed weights and block scales
 * (16 rows of QSA_PKD bytes: a row's 128 bytes of q, then its 16 scale bytes) into the other half of
 * pk, and the segment's pieces of the pairs' rows 0-3 into the other half of sa's ring, by cp.async
 * before it works on segment s (no register round trip of A, no barrier per sub-step: measured on the
 * H200, B=32 +5%, B=8 +2%).  Each element is the same 16 products in the same
 * positions of k per chunk as in qsa_nvf_mma4_ld, chunk after chunk into a zeroed accumulator, P_s
 * scaled and folded in ascending segment order: the canonical bits (tested against the one-block and
 * the split forms).  RG: segments rg.sb .. rg.se - 1 only, each P_s stored as the split forms store
 * it; otherwise (NM = 1) the tile's pairs 0..7 end as rows of slot (16 floats each, aliasing the staging). */
/* The four block scales of v's bytes as two fp16 pairs for qsa_dq8: lo = bytes 0 and 1, hi = 2 and 3 */
static __device__ __forceinline__ void qsa_scale4(qsa_u32 v, qsa_u32 &lo, qsa_u32 &hi) {
#if __CUDA_ARCH__ >= 890
    asm("{\n .reg .b16 a, b;\n mov.b32 {a, b}, %2;\n cvt.rn.f16x2.e4m3x2 %0, a;\n cvt.rn.f16x2.e4m3x2 %1, b;\n}"
        : "=r"(lo), "=r"(hi)
        : "r"(v));
#else
    lo = qsa_e4m3x2_to_h2(v);
    hi = qsa_e4m3x2_to_h2(v >> 16);
#endif
}
#define QSA_PKD 144 /* the direct form's copy rows: 128 bytes of packed weights, then the 16 scale bytes */
#define QSA_NVD_SA 4608 /* the direct form's B operand staging per warp (bytes): a ring of 4 A rows, then 4 rows */
/* One matrix's part of the direct form's copy of segment sn (16 rows of QSA_PKD bytes: 128 of packed
   weights, then the 16 scale bytes; and, with arow, the segment's A pieces into the A ring): this lane's
   sources and destinations (qsa_nvd_src_of), and the copy (qsa_nvd_copy1: into half sn % 2 of the warp's
   pk, whose halves hold NM matrices' rows; nothing past the last segment s1) */
struct qsa_nvd_src {
    const qsa_u8 *qrow, *srow; /* this lane's copy sources at segment 0 */
    qsa_u32 cdst, sdst;        /* ... and destinations in half 0 */
    qsa_u32 rb;                /* bytes between q rows */
    int sw;                    /* the lane's first scale word (4- and 8-byte copies) */
    bool s16;                  /* the scales in one 16-byte piece per row (svec16) */
    bool s8;                   /* ... else in two 8-byte pieces per row (s 8-byte aligned, K % 128 == 0) */
    const qsa_f16 *arow;       /* this lane's A pieces at segment 0 (pair row lane / 8; NULL: none) */
    qsa_u32 adst;              /* their destination in the A ring, half 0, sub-step 0 */
};
template <int NM>
static __device__ __forceinline__ void qsa_nvd_copy1(const qsa_nvd_src &c, int K, int sn, int s1) {
    const int lane = threadIdx.x & 31, pc = lane & 7;
    if (sn < s1) { /* (one block of copies: a piece past K is a zero fill from a valid address, not a branch) */
        const int kn = sn * QSA_SEG, rem = K - kn;
        const qsa_u32 half = (sn & 1) * NM * 16 * QSA_PKD, qn = 32 * pc < rem ? 16u : 0u;
        const qsa_u8 *q = c.qrow + (qn ? kn >> 1 : 0);
#pragma unroll
        for (int i = 0; i < 4; i++)
            asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(c.cdst + half + i * 4 * QSA_PKD),
                         "l"(q + i * 4 * c.rb), "r"(qn)
                         : "memory");
        if (c.s16) {
            if (lane < 16)
                asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(c.sdst + half), "l"(c.srow + (kn >> 4))
                             : "memory");
        } else if (c.s8) { /* (rem is a multiple of 128: a piece is whole or past K) */
            const qsa_u32 sn8 = 64 * c.sw < rem ? 8u : 0u;
            asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;" ::"r"(c.sdst + half),
                         "l"(c.srow + (sn8 ? kn >> 4 : 0)), "r"(sn8)
                         : "memory");
        } else {
#pragma unroll
            for (int i = 0; i < 2; i++) {
                const qsa_u32 sn4 = 64 * (c.sw + i) < rem ? 4u : 0u;
                asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"(c.sdst + half + 4 * i),
                             "l"(c.srow + (sn4 ? (kn >> 4) + 4 * i : 0)), "r"(sn4)
                             : "memory");
            }
        }
        if (c.arow) { /* the A row's pieces 8 J + lane % 8 of the segment's sub-steps (kept in L1: the block's
                         other warps mostly read the same rows; none past K, where the fold stops) */
            const qsa_f16 *a = c.arow + kn;
            const qsa_u32 ad = c.adst + (sn & 1) * 512;
#pragma unroll
            for (int J = 0; J < QSA_SEG / 64; J++)
                if (64 * J < rem)
                    asm volatile("cp.async.ca.shared.global [%0], [%1], 16;" ::"r"(ad + 128 * J), "l"(a + 64 * J)
                                 : "memory");
        }
    }
}
/* The copy of segment sn of NM matrices (pk: half sn % 2 holds matrix m's 16 rows at m 16 QSA_PKD
   bytes), committed as one group (empty past the last segment s1, so that every segment is one group) */
template <int NM>
static __device__ __forceinline__ void qsa_nvd_copy(const qsa_nvd_src *c, int K, int sn, int s1) {
#pragma unroll
    for (int m = 0; m < NM; m++) qsa_nvd_copy1<NM>(c[m], K, sn, s1);
    asm volatile("cp.async.commit_group;" ::: "memory");
}
/* This lane's copy of rows n0 .. n0 + 15 of w (no A row) into the 16 rows of QSA_PKD bytes at pk */
static __device__ __forceinline__ qsa_nvd_src qsa_nvd_src_of(const qsa_wsrc &w, int n0, int K, const qsa_u8 *pk) {
    const int lane = threadIdx.x & 31, pr = lane >> 3, pc = lane & 7;
    qsa_nvd_src cs;
    cs.rb = (qsa_u32)(K >> 1);
    cs.qrow = w.q + ((qsa_i64)(n0 + pr) * cs.rb + 16 * pc);
    cs.cdst = qsa_smem_u32(pk) + pr * QSA_PKD + 16 * pc;
    /* the scale copy: row lane (one 16-byte piece, svec16) or row lane / 2, words 2 (lane % 2) + {0, 1}
       (one 8-byte piece where s and the rows are 8-byte aligned: half the requests of two 4-byte words,
       whose rows of K / 16 bytes are 40 apart at the real shape's down K = 640) */
    cs.s16 = w.svec16;
    cs.s8 = !cs.s16 && !(((qsa_u64)w.s) & 7u) && !(K & 127);
    const int sr_ = cs.s16 ? (lane & 15) : lane >> 1;
    cs.sw = cs.s16 ? 0 : 2 * (lane & 1);
    cs.srow = w.s + (qsa_i64)(n0 + sr_) * (K >> 4) + 4 * cs.sw;
    cs.sdst = qsa_smem_u32(pk) + sr_ * QSA_PKD + 128 + 4 * cs.sw;
    cs.arow = 0;
    cs.adst = 0;
    return cs;
}
/* NM = 2 (not with RG): the same fold of rows n1 .. n1 + 15 of a second matrix w2 of the same K (gate
   and up of an expert, n1 = n0; or two column tiles of one matrix) into *T2, in the same pass: its rows
   copied beside w's (pk twice the size), the B operand's fragments loaded once for both. */
template <bool RG = false, bool TWO = false, int NM = 1>
static __device__ __forceinline__ void qsa_segs16_nvd(const qsa_f16 *a0p, bool live, const qsa_wsrc &w, int n0, int K,
                                                      int nseg, qsa_f16 *sa, qsa_u8 *pk, qsa_frag_c &T, float *slot,
                                                      qsa_seg_range rg = qsa_seg_range(), const qsa_f16 *a1p = 0,
                                                      const qsa_wsrc *w2 = 0, qsa_frag_c *T2 = 0, int n1 = 0) {
    QSA_CT_CHECK(NM == 1 || (NM == 2 && !RG));
    const int lane = threadIdx.x & 31, g = lane >> 2, t4 = lane & 3, pr = lane >> 3, pc = lane & 7;
    qsa_nvd_src cs[NM];
    qsa_frag_c *Tm[2] = {&T, T2};
    float ps[NM];
#pragma unroll
    for (int m = 0; m < NM; m++) {
        const qsa_wsrc &wm = m ? *w2 : w;
        cs[m] = qsa_nvd_src_of(wm, m ? n1 : n0, K, pk + m * 16 * QSA_PKD);
        ps[m] = qsa_pscale_of(wm);
    }
    const qsa_u8 *pkg = pk + g * QSA_PKD; /* row g (row g + 8: 8 rows on) */
    /* The mma's B operand, the pairs' rows 0-7 (row lane / 8 from a0p when live, row lane / 8 + 4 from
       a1p when TWO and a1p is not NULL, zero otherwise), in sa (QSA_NVD_SA bytes): rows 0-3 a ring of two
       segments that the segment copy fills with the weights (row r at r 1024 bytes, its 16-byte piece q
       of 64 at 16 (q ^ r)), rows 4-7 the sub-step's 8 pieces that TWO stores from registers (row r at
       4096 + 128 (r - 4), piece q at 16 (q ^ r)); the swizzle puts the 8 rows of every ldmatrix phase
       in distinct banks.  This lane's ldmatrix row: r = lane % 8, pieces lane / 8 and lane / 8 + 4 of the
       sub-step (+64 bytes in the ring, -64 in rows 4-7: the swizzle's bit 2). */
    const int r8 = lane & 7, m8 = lane >> 3;
    const qsa_u32 sab = qsa_smem_u32(sa), xmask = r8 < 4 ? ~0u : 0u;
    const qsa_u32 xb = sab + (r8 < 4 ? r8 * 1024 : 4096 + (r8 - 4) * 128) + 16 * (m8 ^ r8);
    const qsa_u32 xh = r8 < 4 ? 64u : (qsa_u32)-64;
    const bool live1 = TWO && a1p != 0;
    cs[0].arow = live ? a0p + 8 * pc : 0;
    cs[0].adst = sab + pr * 1024 + 16 * (pc ^ pr);
    uint4 *const st1 = (uint4 *)(sa + 2048 + pr * 64 + 8 * (pc ^ (pr + 4))); /* row pr + 4, piece pc */
    if (!live) /* (rows of no pair: zeros, which only their own outputs would see) */
#pragma unroll
        for (int i = 0; i < 2 * QSA_SEG / 64; i++)
            *(uint4 *)(sa + pr * 512 + 256 * (i >> 2) + 64 * (i & 3) + 8 * (pc ^ pr)) = qsa_u4_zero();
    if (!live1) *st1 = qsa_u4_zero();
    const uint4 *ap1 = (const uint4 *)(a1p + 8 * pc); /* this lane's 8 elements of row pr + 4 (advanced by 64) */
    uint4 rb = live1 ? *ap1 : qsa_u4_zero();
    float d[NM][4];
#pragma unroll
    for (int m = 0; m < NM; m++)
#pragma unroll
        for (int i = 0; i < 4; i++) d[m][i] = Tm[m]->x[i] = 0.0f;
    const int s0 = RG ? rg.sb : 0, s1 = RG ? rg.se : nseg, nt = RG ? min(K >> 6, 4 * s1) : K >> 6;
    qsa_nvd_copy<NM>(cs, K, s0, s1);
    for (int seg = s0; seg < s1; seg++) {
        __syncwarp(); /* every lane is done with the halves that the next copy overwrites */
        qsa_nvd_copy<NM>(cs, K, seg + 1, s1);
        asm volatile("cp.async.wait_group 1;" ::: "memory");
        __syncwarp(); /* every lane's copies of segment seg have landed */
        const qsa_u8 *pw0 = pkg + (seg & 1) * NM * 16 * QSA_PKD;
        enum { UNR = RG ? 1 : QSA_SEG / 64 }; /* (the ranged form's kernel: unrolled it spills) */
#pragma unroll(UNR)
        for (int J = 0; J < QSA_SEG / 64; J++) {
            const int t = 4 * seg + J;
            if (t >= nt) break;
            if (TWO) {
                __syncwarp(); /* the previous sub-step's B fragments are loaded */
                if (live1) *st1 = rb;
                __syncwarp();
                ap1 += 8;
                if (live1 && t + 1 < nt) rb = *ap1;
            }
            const qsa_u32 xa = xb + (xmask & (128u * (t & 7))); /* (t & 7: the ring half, then the sub-step) */
            qsa_u32 fx0[4], fx1[4]; /* the B fragments of the sub-step's two blocks (loaded for matrix 0) */
#pragma unroll
            for (int m = 0; m < NM; m++) {
                const qsa_u8 *pw = pw0 + m * 16 * QSA_PKD;
                /* row g's and row g + 8's word t of the sub-step's two blocks, and their scale words */
                const qsa_u32 wg0 = *(const qsa_u32 *)(pw + 32 * J + 4 * t4),
                              wg1 = *(const qsa_u32 *)(pw + 32 * J + 16 + 4 * t4);
                const qsa_u32 wh0 = *(const qsa_u32 *)(pw + 8 * QSA_PKD + 32 * J + 4 * t4),
                              wh1 = *(const qsa_u32 *)(pw + 8 * QSA_PKD + 32 * J + 16 + 4 * t4);
                const qsa_u32 sg = *(const qsa_u32 *)(pw + 128 + 4 * J),
                              sh = *(const qsa_u32 *)(pw + 8 * QSA_PKD + 128 + 4 * J);
                qsa_u32 a[4], l01, l23, m01, m23;
                qsa_scale4(sg, l01, l23);
                qsa_scale4(sh, m01, m23);
                uint4 ug = qsa_dq8<0, 1>(wg0, l01), uh = qsa_dq8<0, 1>(wh0, m01);
                if (m == 0) qsa_ldsm4(xa, fx0);
                a[0] = ug.x, a[1] = uh.x, a[2] = ug.y, a[3] = uh.y;
                qsa_mma16816(d[m], a, fx0[0], fx0[1]);
                a[0] = ug.z, a[1] = uh.z, a[2] = ug.w, a[3] = uh.w;
                qsa_mma16816(d[m], a, fx0[2], fx0[3]);
                ug = qsa_dq8<0, 1>(wg1, l23);
                uh = qsa_dq8<0, 1>(wh1, m23);
                if (m == 0) qsa_ldsm4(xa + xh, fx1);
                a[0] = ug.x, a[1] = uh.x, a[2] = ug.y, a[3] = uh.y;
                qsa_mma16816(d[m], a, fx1[0], fx1[1]);
                a[0] = ug.z, a[1] = uh.z, a[2] = ug.w, a[3] = uh.w;
                qsa_mma16816(d[m], a, fx1[2], fx1[3]);
            }
        }
        /* the segment's end: T += P_s, the canonical fold, or P_s stored */
#pragma unroll
        for (int m = 0; m < NM; m++)
#pragma unroll
            for (int i = 0; i < 4; i++) d[m][i] = __fmul_rn(d[m][i], ps[m]);
        if (RG) {
            const int c2 = 2 * t4;
            float *o = rg.p + (qsa_i64)seg * rg.seg + g;
            if (c2 < rg.cnt) {
                o[c2 * rg.pair] = d[0][0];
                o[c2 * rg.pair + 8] = d[0][2];
            }
            if (c2 + 1 < rg.cnt) {
                o[(c2 + 1) * rg.pair] = d[0][1];
                o[(c2 + 1) * rg.pair + 8] = d[0][3];
            }
        } else {
#pragma unroll
            for (int m = 0; m < NM; m++)
#pragma unroll
                for (int i = 0; i < 4; i++) Tm[m]->x[i] = Tm[m]->x[i] + d[m][i];
        }
#pragma unroll
        for (int m = 0; m < NM; m++)
#pragma unroll
            for (int i = 0; i < 4; i++) d[m][i] = 0.0f;
    }
    if (!RG && NM == 1) { /* the tile's pairs 0..7 as rows of slot (16 floats each; the staging, read no more) */
        const int c2 = 2 * t4;
        __syncwarp();
        slot[c2 * 16 + g] = T.x[0];
        slot[(c2 + 1) * 16 + g] = T.x[1];
        slot[c2 * 16 + g + 8] = T.x[2];
        slot[(c2 + 1) * 16 + g + 8] = T.x[3];
    }
}

/* The pipelined fold for tiles of 5 to 16 pairs: A rows ap[4 i] (this lane's rows lane / 8 + 4 i; NULL
   or i >= na: zeros) staged by qsa_nvf_put, the segment's W dequantised there too, qsa_nvf_mma4_ld. */
static __device__ __forceinline__ void qsa_segs16_nvf_pipe4(const qsa_f16 *const *ap, int na, const qsa_wsrc &w,
                                                            int n0, int K, int nseg, qsa_f16 *sa, qsa_f16 *sw,
                                                            qsa_u8 *pk, qsa_frag_c &T) {
    const int lane = threadIdx.x & 31, nr = lane >> 1, nh = lane & 1, pr = lane >> 3, pc = lane & 7;
    /* copy piece i of this lane: row pr + 4 i of the tile, bytes 16 pc .. 16 pc + 15 of the segment */
    const qsa_u32 rb = (qsa_u32)(K >> 1);
    const qsa_u8 *qrow = w.q + ((qsa_i64)(n0 + pr) * rb + 16 * pc);
    unsigned live = 0u;
    const qsa_u32 cdst = qsa_smem_u32(pk) + pr * QSA_PKS + 16 * pc;
    const qsa_u8 *srow = w.s + (qsa_i64)(n0 + nr) * (K >> 4);
    const qsa_u8 *pkl = pk + nr * QSA_PKS + 16 * nh; /* this lane's row and half of the copy */
    const qsa_u32 ab = qsa_smem_u32(sa) + 2 * ((lane & 15) * QSA_STW + (lane >> 4) * 8),
                  wb = qsa_smem_u32(sw) + 2 * (((lane >> 4) * 8 + (lane & 7)) * QSA_STW + ((lane >> 3) & 1) * 8);
    uint4 *dst = (uint4 *)(sw + nr * QSA_STW + nh * 32);
    /* A rows that are padding (past the tile's pairs) are zeros in the staging from here on: only the
       live pieces are loaded and stored (the warp's staging has no readers before this tile) */
    uint4 ra[4];
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const qsa_f16 *a = i < na ? ap[4 * i] : 0;
        if (a) live |= 1u << i;
        else *(uint4 *)(sa + (pr + 4 * i) * QSA_STW + 8 * pc) = qsa_u4_zero();
        ra[i] = a ? *(const uint4 *)(a + 8 * pc) : qsa_u4_zero();
    }
    qsa_u32 sc[QSA_SEG / 64], scn[QSA_SEG / 64];
    const float ps = qsa_pscale_of(w);
    qsa_frag_c P;
    qsa_frag_zero(T);
    qsa_frag_zero(P);
    /* one loop over the sub-steps of all segments (K % 64 == 0): a segment's first sub-step starts
       the copy of the next one and waits for its own, its last adds P into T */
    const int nt = K >> 6;
    for (int t = -4; t < nt; t++) {
        const int seg = t >> 2, J = t & 3;
        if (J == 0) {
            const int sn = seg + 1; /* the segment whose copy starts now */
            if (sn < nseg) {
                const int kn = sn * QSA_SEG, np = min(QSA_SEG, K - kn) >> 5;
                __syncwarp(); /* every lane is done with the half that this copy overwrites */
                if (pc < np) {
#pragma unroll
                    for (int i = 0; i < 4; i++)
                        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(
                                         cdst + (sn & 1) * 16 * QSA_PKS + i * 4 * QSA_PKS),
                                     "l"(qrow + (kn >> 1) + i * 4 * rb)
                                     : "memory");
                }
                asm volatile("cp.async.commit_group;" ::: "memory");
                qsa_nvf_scales_at(srow + (kn >> 4), w.svec16, np >> 1, scn);
            }
            if (seg < 0) { /* the prologue: segment 0's copy is on its way */
#pragma unroll
                for (int i = 0; i < QSA_SEG / 64; i++) sc[i] = scn[i];
                t += 3;
                continue;
            }
            if (sn < nseg) asm volatile("cp.async.wait_group 1;" ::: "memory");
            else asm volatile("cp.async.wait_group 0;" ::: "memory");
            __syncwarp(); /* every lane's copies of segment seg have landed */
        }
        const uint4 q = *(const uint4 *)(pkl + (seg & 1) * 16 * QSA_PKS + 32 * J);
        const qsa_u32 sw32 = sc[0];
#pragma unroll
        for (int i = 0; i + 1 < QSA_SEG / 64; i++) sc[i] = sc[i + 1];
        qsa_nvf_put<4>(ra, live, q, sw32, sa, dst);
        if (t + 1 < nt) { /* the next sub-step's A while the tensor cores work */
#pragma unroll
            for (int i = 0; i < 4; i++)
                if ((live >> i) & 1u) ra[i] = *(const uint4 *)(ap[4 * i] + 64 * (t + 1) + 8 * pc);
        }
        qsa_nvf_mma4_ld(ab, wb, P);
        if (J == 3 || t + 1 == nt) { /* the segment's end: T += P_s, the canonical fold */
            qsa_pscale(P, ps);
#pragma unroll
            for (int i = 0; i < 8; i++) T.x[i] = T.x[i] + P.x[i];
            qsa_frag_zero(P);
#pragma unroll
            for (int i = 0; i < QSA_SEG / 64; i++) sc[i] = scn[i];
        }
    }
}
/* Returns whether the tile is already in slot (the pairs' rows of the partial tile, [16][16] fp32,
   aliasing the staging); otherwise it is in T, in the wmma layout. */
static __device__ __forceinline__ bool qsa_segs16_nvf_pipe(const qsa_f16 *const *arow, int nrows, const qsa_wsrc &w,
                                                           int n0, int N, int K, int nseg, qsa_f16 *sa, qsa_f16 *sw,
                                                           qsa_u8 *pk, qsa_frag_c &T, float *slot) {
    const int na = min(4, (nrows + 3) >> 2);
    if (na == 1) { /* this lane's one A row in a register */
        const qsa_f16 *a0 = arow[(threadIdx.x & 31) >> 3];
        (void)sw;
        qsa_segs16_nvd<false>(a0, a0 != 0, w, n0, K, nseg, sa, pk, T, slot);
        return true;
    }
    /* (rows from the shared list at each sub-step: four in registers spill) */
    qsa_segs16_nvf_pipe4(arow + ((threadIdx.x & 31) >> 3), na, w, n0, K, nseg, sa, sw, pk, T);
    return false;
}
#endif

/* Split-K core: one 16 x 16 output tile (NB weight matrices sharing the A rows, e.g. gate and up),
 * the whole block (8 warps).  arow[16] (shared) are the A rows (NULL: padding), each K long, 16-byte
 * aligned when avec.  Weight rows n0 .. n0+15 of each ws[b] (rows >= N are zero).  On return
 * thread tid holds T[b] of element (tid / 16, tid % 16) in the canonical order.  `smem` is
 * QSA_GEMM_SMEM bytes, 32-byte aligned.  Contains __syncthreads: every thread must call it. */
template <int NB, bool NV>
static __device__ void qsa_tile16_splitk(const qsa_f16 *const *arow, int avec, const qsa_wsrc *ws, int n0, int N,
                                         int K, unsigned char *smem, float *T) {
    const int tid = threadIdx.x, warp = tid >> 5;
    /* per warp: A [16][QSA_ST] then NB x W [16][QSA_ST] halves */
    qsa_f16 *sa = (qsa_f16 *)(smem + warp * (1 + NB) * 16 * QSA_ST * 2);
    qsa_f16 *sw = sa + 16 * QSA_ST;
    float *slots = (float *)smem; /* [8][NB][256] partial tiles, aliasing the staging between rounds */
    const int nseg = (K + QSA_SEG - 1) / QSA_SEG;
#pragma unroll
    for (int b = 0; b < NB; b++) T[b] = 0.0f;
    for (int round = 0; round < nseg; round += 8) {
        const int seg = round + warp;
        qsa_frag_c P[NB];
#pragma unroll
        for (int b = 0; b < NB; b++) qsa_frag_zero(P[b]);
        if (seg < nseg) qsa_seg16<NB, NV>(arow, avec, ws, n0, N, K, seg, sa, sw, P);
        __syncthreads(); /* every warp is done with its staging: reuse it for the partial tiles */
#pragma unroll
        for (int b = 0; b < NB; b++) qsa_wmma_store(slots + (warp * NB + b) * 256, P[b], 16);
        __syncthreads();
        for (int w = 0; w < 8 && round + w < nseg; w++) {
#pragma unroll
            for (int b = 0; b < NB; b++) T[b] = T[b] + slots[(w * NB + b) * 256 + tid];
        }
        __syncthreads(); /* before the next round overwrites the slots */
    }
}

/* One sub-step of the tiled cores: its NC chunks of k = 16 (staging rows of ST halves) into the
   warp's two accumulator fragments in ascending k, then at a segment's end T += P_s (element-wise,
   the same layout; NVFP4, PS: P_s times ps first) and P = 0: the canonical order. */
template <int ST, int NC, bool PS = false>
static __device__ __forceinline__ void qsa_tile64_step(const qsa_f16 *As, const qsa_f16 *Ws, int wm, int wc, int k0,
                                                       int K, bool seg_end, qsa_frag_c &P0, qsa_frag_c &P1,
                                                       qsa_frag_c &T0, qsa_frag_c &T1, float ps = 1.0f) {
    qsa_frag_ab fa, fb;
    for (int c = 0; c < NC && k0 + 16 * c < K; c++) {
        qsa_wmma_load_a(fa, As + wm * 16 * ST + 16 * c, ST);
        qsa_wmma_load_b(fb, Ws + (wc * 32) * ST + 16 * c, ST);
        qsa_wmma_mma(P0, fa, fb);
        qsa_wmma_load_b(fb, Ws + (wc * 32 + 16) * ST + 16 * c, ST);
        qsa_wmma_mma(P1, fa, fb);
    }
    if (seg_end) {
        if (PS) {
            qsa_pscale(P0, ps);
            qsa_pscale(P1, ps);
        }
#pragma unroll
        for (int i = 0; i < 8; i++) {
            T0.x[i] = T0.x[i] + P0.x[i];
            T1.x[i] = T1.x[i] + P1.x[i];
            P0.x[i] = 0.0f;
            P1.x[i] = 0.0f;
        }
    }
}
/* The tiled cores' end: the warp's fragments into the output staging os [64][QSA_OST], between
   barriers (the staging overlays the operands). */
static __device__ __forceinline__ void qsa_tile64_out(float *os, int wm, int wc, const qsa_frag_c &T0,
                                                      const qsa_frag_c &T1) {
    __syncthreads();
    qsa_wmma_store(os + wm * 16 * QSA_OST + wc * 32, T0, QSA_OST);
    qsa_wmma_store(os + wm * 16 * QSA_OST + wc * 32 + 16, T1, QSA_OST);
    __syncthreads();
}

/* The tiled core for FP16 weights in sub-steps of 32 (staging rows of QSA_ST halves): the 64-pair
 * expert kernels' (their register budget; the dense GEMM takes qsa_tile64_core_w).  One 64 x 64 tile
 * of A W^T into the fp32 staging os = (float *)smem [64][QSA_OST].
 * Thread tid supplies row tid / 4 of both operands: `arow` its A row (K long, NULL: zeros) and
 * weight row `wn` of `ws` (rows >= N read as zero), so the caller chooses which tokens and which
 * weight rows (of one or two matrices) form the tile.  Warp w owns rows 16 (w % 4) .. +16 and
 * columns 32 (w / 4) .. +32 (two accumulator fragments); K in sub-steps of 32, P reset every 8 of
 * them: T += P_s per segment of 256, the canonical order, so a tile's bits equal the split-K core's.
 * Returns after a __syncthreads with os filled; the caller syncs again before reusing smem. */
static __device__ void qsa_tile64_core_f16(const qsa_f16 *arow, int avec, const qsa_wsrc &ws, int wn, int N, int K,
                                           unsigned char *smem) {
    const int tid = threadIdx.x, warp = tid >> 5, wm = warp & 3, wc = warp >> 2;
    qsa_f16 *As = (qsa_f16 *)smem, *Ws = As + 64 * QSA_ST;
    float *os = (float *)smem; /* [64][QSA_OST] output staging, after the K loop */
    const int row = tid >> 2, kp = (tid & 3) * 8;
    qsa_frag_c T0, T1, P0, P1;
    qsa_frag_zero(T0);
    qsa_frag_zero(T1);
    qsa_frag_zero(P0);
    qsa_frag_zero(P1);
    const int nsub = (K + 31) / 32;
    uint4 ra = qsa_ld8_f16(arow, kp, K, avec), rw = qsa_ld8_w<false>(ws, wn, N, kp, K, K);
    for (int j = 0; j < nsub; j++) {
        const int k0 = j * 32;
        __syncthreads();
        *(uint4 *)(As + row * QSA_ST + kp) = ra;
        *(uint4 *)(Ws + row * QSA_ST + kp) = rw;
        __syncthreads();
        if (j + 1 < nsub) {
            ra = qsa_ld8_f16(arow, k0 + 32 + kp, K, avec);
            rw = qsa_ld8_w<false>(ws, wn, N, k0 + 32 + kp, K, K);
        }
        qsa_tile64_step<QSA_ST, 2>(As, Ws, wm, wc, k0, K, (j & 7) == 7 || j + 1 == nsub, P0, P1, T0, T1);
    }
    qsa_tile64_out(os, wm, wc, T0, T1);
}

/* One thread's operands of a 64-wide sub-step (qsa_tile64_core_w): its two 8-half pieces of A and
   its 16 weights — FP16 two 8-half pieces, NVFP4 8 bytes of q and the group's scale byte. */
typedef struct {
    uint4 a0, a1, w0, w1;
    uint2 q8;
    qsa_u32 sb;
} qsa_t64op;
template <bool NV>
static __device__ __forceinline__ void qsa_t64_load(qsa_t64op &o, const qsa_f16 *arow, int avec, const qsa_wsrc &ws,
                                                    const qsa_u8 *qr, const qsa_u8 *sr, int wn, int N, int k, int K) {
    o.a0 = qsa_ld8_f16(arow, k, K, avec);
    o.a1 = qsa_ld8_f16(arow, k + 8, K, avec);
    if (NV) { /* (k a multiple of 16, K is) */
        o.q8.x = o.q8.y = 0u;
        o.sb = 0u;
        if (qr && k < K) {
            const qsa_u8 *p = qr + (k >> 1);
            if (ws.vec) {
                o.q8 = *(const uint2 *)p;
            } else {
                o.q8.x = (qsa_u32)p[0] | ((qsa_u32)p[1] << 8) | ((qsa_u32)p[2] << 16) | ((qsa_u32)p[3] << 24);
                o.q8.y = (qsa_u32)p[4] | ((qsa_u32)p[5] << 8) | ((qsa_u32)p[6] << 16) | ((qsa_u32)p[7] << 24);
            }
            o.sb = sr[k >> 4];
        }
    } else {
        o.w0 = qsa_ld8_w<false>(ws, wn, N, k, K, K);
        o.w1 = qsa_ld8_w<false>(ws, wn, N, k + 8, K, K);
    }
}
template <bool NV>
static __device__ __forceinline__ void qsa_t64_stage(const qsa_t64op &o, const qsa_wsrc &ws, qsa_f16 *As, qsa_f16 *Ws,
                                                     int row, int kp, int K) {
    *(uint4 *)(As + row * QSA_STW + kp) = o.a0;
    *(uint4 *)(As + row * QSA_STW + kp + 8) = o.a1;
    if (NV) {
        const qsa_u32 sc2 = qsa_scale1(o.sb);
        if (!(K & 31)) { /* the fragment order: threads tid, tid ^ 1 hold the two halves of a block */
            qsa_dq16h(qsa_pair_block(o.q8), threadIdx.x & 1, sc2, (uint4 *)(Ws + row * QSA_STW + kp));
        } else {
            *(uint4 *)(Ws + row * QSA_STW + kp) = qsa_dq8(o.q8.x, sc2);
            *(uint4 *)(Ws + row * QSA_STW + kp + 8) = qsa_dq8(o.q8.y, sc2);
        }
    } else {
        *(uint4 *)(Ws + row * QSA_STW + kp) = o.w0;
        *(uint4 *)(Ws + row * QSA_STW + kp + 8) = o.w1;
    }
}

/* Tiled core: one 64 x 64 tile of A W^T into the fp32 staging os = (float *)smem [64][QSA_OST].
 * Thread tid supplies row tid / 4 of both operands: `arow` its A row (K long, NULL: zeros) and
 * weight row `wn` of `ws` (rows >= N read as zero), so the caller chooses which tokens and which
 * weight rows (of one or two matrices) form the tile.  Warp w owns rows 16 (w % 4) .. +16 and
 * columns 32 (w / 4) .. +32 (two accumulator fragments).  K in sub-steps of 64 staged in rows of
 * QSA_STW halves: the thread supplies k piece 16 (tid % 4) of its rows (two 16-byte loads of A
 * and, FP16, of W; NVFP4: 8 bytes of q and the group's scale byte, a row's 32 bytes of q from 4
 * neighbouring threads; each warp scales its partials by its own threads' source, whose rows are
 * its fragments' columns, so a caller may give the two 32-row halves different sources), loaded AHEAD sub-steps ahead (2: two operand
 * sets in registers, alternating — more of a decode batch's weight stream in flight, for the
 * tiled group kernel; 1 keeps the other kernels' register counts).  Each fragment takes the k = 16 mma in ascending order with P reset every segment of 256
 * (4 sub-steps): T += P_s, the canonical order, so a tile's bits equal the split-K core's.
 * Returns after a __syncthreads with os filled; the caller syncs again before reusing smem. */
template <bool NV, int AHEAD = 1>
static __device__ void qsa_tile64_core_w(const qsa_f16 *arow, int avec, const qsa_wsrc &ws, int wn, int N, int K,
                                         unsigned char *smem) {
    const int tid = threadIdx.x, warp = tid >> 5, wm = warp & 3, wc = warp >> 2;
    qsa_f16 *As = (qsa_f16 *)smem, *Ws = As + 64 * QSA_STW;
    float *os = (float *)smem; /* [64][QSA_OST] output staging, after the K loop */
    const int row = tid >> 2, kp = (tid & 3) * 16;
    qsa_frag_c T0, T1, P0, P1;
    qsa_frag_zero(T0);
    qsa_frag_zero(T1);
    qsa_frag_zero(P0);
    qsa_frag_zero(P1);
    const int nsub = (K + 63) / 64;
    const qsa_u8 *qr = NV && wn < N ? ws.q + (qsa_i64)wn * (K >> 1) : 0, *sr = NV && wn < N ? ws.s + (qsa_i64)wn * (K >> 4) : 0;
    const float ps = NV ? qsa_pscale_of(ws) : 1.0f;
    qsa_t64op o0, o1; /* sub-steps j (even j: o0) and j + 1 */
    qsa_t64_load<NV>(o0, arow, avec, ws, qr, sr, wn, N, kp, K);
    if (AHEAD == 1) {
        for (int j = 0; j < nsub; j++) {
            __syncthreads();
            qsa_t64_stage<NV>(o0, ws, As, Ws, row, kp, K);
            __syncthreads();
            if (j + 1 < nsub) qsa_t64_load<NV>(o0, arow, avec, ws, qr, sr, wn, N, (j + 1) * 64 + kp, K);
            qsa_tile64_step<QSA_STW, 4, NV>(As, Ws, wm, wc, j * 64, K, (j & 3) == 3 || j + 1 == nsub, P0, P1, T0, T1, ps);
        }
        qsa_tile64_out(os, wm, wc, T0, T1);
        return;
    }
    qsa_t64_load<NV>(o1, arow, avec, ws, qr, sr, wn, N, 64 + kp, K);
    for (int j = 0; j < nsub; j += 2) {
        /* sub-step j from o0, which then takes sub-step j + 2; the same for j + 1 and o1 */
        __syncthreads();
        qsa_t64_stage<NV>(o0, ws, As, Ws, row, kp, K);
        __syncthreads();
        if (j + 2 < nsub) qsa_t64_load<NV>(o0, arow, avec, ws, qr, sr, wn, N, (j + 2) * 64 + kp, K);
        qsa_tile64_step<QSA_STW, 4, NV>(As, Ws, wm, wc, j * 64, K, (j & 3) == 3 || j + 1 == nsub, P0, P1, T0, T1, ps);
        if (j + 1 >= nsub) break;
        __syncthreads();
        qsa_t64_stage<NV>(o1, ws, As, Ws, row, kp, K);
        __syncthreads();
        if (j + 3 < nsub) qsa_t64_load<NV>(o1, arow, avec, ws, qr, sr, wn, N, (j + 3) * 64 + kp, K);
        qsa_tile64_step<QSA_STW, 4, NV>(As, Ws, wm, wc, (j + 1) * 64, K, ((j + 1) & 3) == 3 || j + 2 == nsub, P0, P1, T0,
                                        T1, ps);
    }
    qsa_tile64_out(os, wm, wc, T0, T1);
}

/* Either weight kind for the 64-pair expert kernels (NVFP4 needs K % 16 == 0, which every caller checks
   or poisons before). */
static __device__ __forceinline__ void qsa_tile64_core(const qsa_f16 *arow, int avec, const qsa_wsrc &ws, int wn, int N,
                                                       int K, unsigned char *smem) {
    if (ws.w16) qsa_tile64_core_f16(arow, avec, ws, wn, N, K, smem);
    else qsa_tile64_core_w<true>(arow, avec, ws, wn, N, K, smem);
}

/* The 64 x 64 tile (m0, n0) of Y = A W^T (+ bias), A dense [M][K]; ws NVFP4 (NV) or dense (the
   kernel holds the code of one kind only). */
template <int AHEAD, bool NV>
static __device__ void qsa_tile64(const qsa_f16 *A, int avec, const qsa_wsrc &ws, const float *bias, float *Y, int M,
                                  int N, int K, int accumulate, int m0, int n0, unsigned char *smem) {
    const int tid = threadIdx.x, row = tid >> 2;
    const float *os = (const float *)smem;
    const qsa_f16 *arow = m0 + row < M ? A + (qsa_i64)(m0 + row) * K : 0;
    qsa_tile64_core_w<NV, AHEAD>(arow, avec, ws, n0 + row, N, K, smem); /* 64-wide for FP16 too */
    for (int e = tid; e < 64 * 64; e += QSA_GEMM_THREADS) {
        int r = e >> 6, c = e & 63, m = m0 + r, n = n0 + c;
        if (m < M && n < N) {
            float y = os[r * QSA_OST + c];
            if (bias) y = y + bias[n];
            float *py = Y + (qsa_i64)m * N + n;
            *py = accumulate ? *py + y : y;
        }
    }
    __syncthreads(); /* the next tile reuses the staging */
}

/* Y (+)= A W^T (+ bias), ws NVFP4 (NV) or dense: picks the tiling from M, loops over its tiles. */
template <bool NV>
static __device__ void qsa_gemm(const qsa_f16 *A, const qsa_wsrc &ws, const float *bias, float *Y, int M, int N, int K,
                                int accumulate) {
    __shared__ __align__(128) unsigned char smem[QSA_GEMM_SMEM];
    __shared__ const qsa_f16 *arow[16];
    if (blockDim.x != QSA_GEMM_THREADS) __trap(); /* a launch error, never silently wrong results */
    const qsa_i64 nblocks = (qsa_i64)gridDim.x * gridDim.y, bid = (qsa_i64)blockIdx.y * gridDim.x + blockIdx.x;
    const int avec = (((qsa_u64)A) & 15u) == 0 && !(K & 7); /* every row 16-byte aligned */
    if (K <= 0 || (NV && (K & 15))) { /* NVFP4 needs whole groups of 16: poison rather than guess */
        for (qsa_i64 i = bid * QSA_GEMM_THREADS + threadIdx.x; i < (qsa_i64)M * N; i += nblocks * QSA_GEMM_THREADS)
            Y[i] = QSA_QNAN;
        return;
    }
    if (M <= QSA_SPLITK_MAX_M) {
        const int mt = (M + 15) / 16;
        const qsa_i64 tiles = (qsa_i64)mt * ((N + 15) / 16);
        for (qsa_i64 t = bid; t < tiles; t += nblocks) {
            const int m0 = (int)(t % mt) * 16, n0 = (int)(t / mt) * 16; /* m fastest: neighbours share W */
            __syncthreads(); /* arow of the previous tile is no longer read */
            if (threadIdx.x < 16) arow[threadIdx.x] = m0 + (int)threadIdx.x < M ? A + (qsa_i64)(m0 + threadIdx.x) * K : 0;
            __syncthreads();
            float T[1];
            qsa_tile16_splitk<1, NV>(arow, avec, &ws, n0, N, K, smem, T);
            const int m = m0 + (threadIdx.x >> 4), n = n0 + (threadIdx.x & 15);
            if (m < M && n < N) {
                float y = T[0];
                if (bias) y = y + bias[n];
                float *py = Y + (qsa_i64)m * N + n;
                *py = accumulate ? *py + y : y;
            }
        }
    } else {
        const int mt = (M + 63) / 64;
        const qsa_i64 tiles = (qsa_i64)mt * ((N + 63) / 64);
        for (qsa_i64 t = bid; t < tiles; t += nblocks)
            qsa_tile64<1, NV>(A, avec, ws, bias, Y, M, N, K, accumulate, (int)(t % mt) * 64, (int)(t / mt) * 64, smem);
    }
}

/* Y[m][n] = sum_k A[m][k] W[n][k] (+ bias[n]); with accumulate, Y[m][n] += that instead.
 *   A fp16 [M][K] row-major, W fp16 [N][K] (the checkpoint's [out, in]), bias fp32 [N] or NULL,
 *   Y fp32 [M][N].  Any M, N, K >= 1 (a K that is not a multiple of 16 is zero-padded in the tiles).
 * Canonical per-element order: see the GEMM machinery comment (segments of 256, fixed sum order).
 * Launch: block 256 (required; another size traps); grid: any (the kernel loops over its tiles);
 *   best: M <= 64: ceil(M/16) * ceil(N/16) blocks, else ceil(M/64) * ceil(N/64) blocks
 *   (1-D or 2-D: blocks are numbered y * gridDim.x + x).  Static shared memory 30.9 KB. */
#if QSA_IN_PART(0)
extern "C" __global__ void __launch_bounds__(256) qsa_k_gemm_f16(const qsa_f16 *__restrict__ A,
                                                                 const qsa_f16 *__restrict__ W,
                                                                 const float *__restrict__ bias, float *Y, int M,
                                                                 int N, int K, int accumulate) {
    QSA_PDL_ENTRY();
    qsa_wsrc ws = qsa_wsrc_f16(W);
    qsa_gemm<false>(A, ws, bias, Y, M, N, K, accumulate);
}
#endif

/* The same with NVFP4 weights (W4A16): q u8 [N][K/2] (in the device order, qsa_dq8),
 * s E4M3 [N][K/16], global scale s2; w = e2m1 * e4m3 * s2, fed as the exact fp16 e2m1 * e4m3 * 2^-14
 * with each segment's partial times s2 * 2^14 (see the GEMM machinery comment).  No bias (NVFP4
 * linears have none).  Launch: as qsa_k_gemm_f16. */
#if QSA_IN_PART(6)
extern "C" __global__ void __launch_bounds__(256) qsa_k_gemm_nvfp4(const qsa_f16 *__restrict__ A,
                                                                   const qsa_u8 *__restrict__ q,
                                                                   const qsa_u8 *__restrict__ s, float s2, float *Y,
                                                                   int M, int N, int K, int accumulate) {
    QSA_PDL_ENTRY();
    qsa_wsrc ws = qsa_wsrc_nvfp4(q, s, s2, K);
    qsa_gemm<true>(A, ws, 0, Y, M, N, K, accumulate);
}
#endif

/* The split-K tiling spread over warps, for small M (decode): the (tile, segment) tasks of
 * Y = A W^T, task i = tile * nseg + s, go to warps, QSA_GEMV_WARPS per block (warp w of block x
 * takes task x * QSA_GEMV_WARPS + w; qsa_k_gemv_blk: a block's warps take 4 column tiles of one row
 * tile and segment at a time, looping), so every warp streams segments of 16 weight rows whatever
 * the shape.  A warp stores its P_s tile (only the rows < M) in part; the warp that completes a
 * tile (an integer ticket in count[tile], qsa_ticket_last) adds all of them in ascending s,
 * T = ((0 + P_0) + P_1) + ..., exactly the canonical order, writes Y and resets count[tile] to 0 for
 * the next launch (or graph replay).  Same bits as qsa_k_gemm_* for every M, N, K.  Y16 != NULL
 * fuses qsa_k_silu_scale into the store: Y = silu(Y * act_scale) and Y16 its fp16 copy (the bits of
 * the two launches).  part: [tiles][nseg][prow][16] fp32 with prow = min(M, 16); count: [tiles]
 * unsigned, zero before the first launch.  Launch: grid ceil(tiles * nseg / QSA_GEMV_WARPS) with
 * tiles = ceil(M/16) * ceil(N/16), block 32 * QSA_GEMV_WARPS, M <= QSA_SPLITK_MAX_M.  (A whole tile
 * per warp, the segments folded in registers, measured slower here: lm_head 520 -> 630 us.) */
#define QSA_GEMV_WARPS 4
#define QSA_GEMV_TR_ROWS 4 /* sm_80+, the per-warp kernels' A rows up to this: qsa_seg16_tr (the host takes
                              qsa_k_gemv_blk instead wherever that applies, QSA__GEMV_BLK_MIN_M) */
/* t = ((0 + p[0]) + p[stride]) + ... + p[(n-1)*stride], ascending (the canonical segment order), the
   loads issued NP at a time (the last batch predicated) so the completing warp waits on memory
   ceil(n/NP) times, not n (32 at a time measured slower in the completing warps: decode GEMVs 10-30%
   longer) */
/* a part: through L2 (CG: another warp's, written in this launch) or a plain load (the warp's own, in
   shared memory: qsa_gemv_fold<false>) */
template <bool CG>
static __device__ __forceinline__ float qsa_ldpart(const float *p) {
    return CG ? __ldcg(p) : *p;
}
template <bool CG = true, int NP = 8>
static __device__ __forceinline__ float qsa_sum_parts(const float *p, qsa_i64 stride, int n) {
    float t = 0.0f;
    for (int s = 0; s < n; s += NP) {
        float v[NP];
#pragma unroll
        for (int u = 0; u < NP; u++) v[u] = s + u < n ? qsa_ldpart<CG>(p + (qsa_i64)(s + u) * stride) : 0.0f;
#pragma unroll
        for (int u = 0; u < NP; u++)
            if (s + u < n) t = t + v[u];
    }
    return t;
}
/* The same sum with two lanes per element, for tiles of one row (16 elements): lanes l and l + 16
   get the same p; per round the low lane loads 8 parts and the high lane the next 8, which reach
   the low lane by shuffles, so it waits on memory ceil(n/16) times; it adds all of them in
   ascending order (the same bits).  Every lane of the warp calls it with the same n; `ok` false
   loads nothing.  The result is the low lane's. */
template <bool CG = true>
static __device__ __forceinline__ float qsa_sum_parts_pair(const float *p, qsa_i64 stride, int n, bool ok) {
    const int h = (threadIdx.x >> 4) & 1;
    float t = 0.0f;
    for (int s = 0; s < n; s += 16) {
        float v[8];
#pragma unroll
        for (int u = 0; u < 8; u++) {
            const int q = s + 8 * h + u;
            v[u] = ok && q < n ? qsa_ldpart<CG>(p + (qsa_i64)q * stride) : 0.0f;
        }
#pragma unroll
        for (int u = 0; u < 8; u++)
            if (s + u < n) t = t + v[u];
#pragma unroll
        for (int u = 0; u < 8; u++) {
            const float o = __shfl_down_sync(QSA_FULL_MASK, v[u], 16);
            if (s + 8 + u < n) t = t + o;
        }
    }
    return t;
}
/* qsa_sum_parts for up to NE elements of one lane at once: element j (j < ne <= NE) at p + es * j,
   its parts `stride` apart.  Per round the lane issues NP parts of every element (NE * NP loads in
   flight) and then adds them, each element's parts in ascending order (the same bits). */
template <int NE, int NP, bool CG = true>
static __device__ __forceinline__ void qsa_sum_parts_multi(const float *p, int es, qsa_i64 stride, int n, int ne,
                                                           float *t) {
#pragma unroll
    for (int j = 0; j < NE; j++) t[j] = 0.0f;
    for (int s = 0; s < n; s += NP) {
        float v[NE][NP];
#pragma unroll
        for (int j = 0; j < NE; j++)
#pragma unroll
            for (int u = 0; u < NP; u++)
                v[j][u] = j < ne && s + u < n ? qsa_ldpart<CG>(p + es * j + (qsa_i64)(s + u) * stride) : 0.0f;
#pragma unroll
        for (int j = 0; j < NE; j++)
#pragma unroll
            for (int u = 0; u < NP; u++)
                if (s + u < n) t[j] = t[j] + v[j][u];
    }
}
/* A lane's elements of a several-row tile (e = lane + 32 j, j < ne <= 8), 4 parts of each per round:
   a tile of 16 rows waits on memory ceil(n/4) times instead of 8 ceil(n/8). */
template <bool CG = true>
static __device__ __forceinline__ void qsa_sum_parts8(const float *p, qsa_i64 stride, int n, int ne, float *t) {
    qsa_sum_parts_multi<8, 4, CG>(p, 32, stride, n, ne, t);
}
/* The nc adjacent elements p[0 .. nc) of one lane (a hyper-connection group's mix weights), four at a
   time with NP parts of each per round. */
template <bool CG = true, int NP = 2>
static __device__ __forceinline__ void qsa_sum_parts_cols(const float *p, qsa_i64 stride, int n, int nc, float *t) {
    for (int c0 = 0; c0 < nc; c0 += 4) {
        float a[4];
        qsa_sum_parts_multi<4, NP, CG>(p + c0, 1, stride, n, nc - c0, a);
#pragma unroll
        for (int c = 0; c < 4; c++)
            if (c0 + c < nc) t[c0 + c] = a[c];
    }
}
/* The ticket of a split tile (count: its arrivals so far): releases the calling warp's earlier
   partial stores (every lane's: the warp barrier orders them before lane 0's atomic) to the device,
   and the warp that arrives last (n arrivals in all) acquires the others' by a fence before it
   reads them.  A release atomic and one acq_rel fence for the last warp only, instead of a
   sequentially consistent fence on both sides (an acq_rel atomic in every warp was measured slower
   at batch 32: a gpu-scope acquire also drops the SM's L1 lines, which the other warps' A rows use).
   Returns, in every lane, whether this warp arrived last. */
static __device__ __forceinline__ bool qsa_ticket_last(unsigned *count, unsigned n) {
    __syncwarp();
    unsigned old = 0u;
    if ((threadIdx.x & 31) == 0)
        asm volatile("atom.release.gpu.global.add.u32 %0, [%1], 1;" : "=r"(old) : "l"(count) : "memory");
    if (__shfl_sync(QSA_FULL_MASK, old, 0) != n - 1u) return false;
    asm volatile("fence.acq_rel.gpu;" ::: "memory");
    return true;
}

/* The same for a whole block (every thread calls it; flag: a shared word): the block barrier orders
   every thread's earlier stores before thread 0's release atomic (a release is cumulative over what
   the barrier ordered before it), and the block that arrives last acquires the others' by the acq_rel
   fence before it reads them — where each thread's sequentially consistent __threadfence() was a
   MEMBAR.SC and an L1 invalidation in every warp (ncu of the tensor-core attention at batch 32: 9.4%
   of the warp samples on that fence's ERRBAR).  Returns, in every thread, whether this block arrived
   last (of n). */
static __device__ __forceinline__ bool qsa_block_ticket_last(unsigned *count, unsigned n, unsigned *flag) {
    __syncthreads();
    if (threadIdx.x == 0) {
        unsigned old;
        asm volatile("atom.release.gpu.global.add.u32 %0, [%1], 1;" : "=r"(old) : "l"(count) : "memory");
        *flag = old == n - 1u;
    }
    __syncthreads();
    if (!*flag) return false;
    asm volatile("fence.acq_rel.gpu;" ::: "memory");
    return true;
}

/* The canonical fold of a tile's segments inside one warp (one matrix): T = ((0 + P_0) + P_1) + ...,
   element-wise in the accumulator layout (the order qsa_sum_parts and the tiled core use, so the
   same bits).  NVFP4 through qsa_seg16_nvw: staging rows of QSA_STW halves. */
template <bool NV>
static __device__ __forceinline__ bool qsa_segs16(const qsa_f16 *const *arow, int nrows, int avec, const qsa_wsrc &w,
                                                  int n0, int N, int K, int nseg, qsa_f16 *sa, qsa_f16 *sw,
                                                  qsa_u8 *pk, qsa_frag_c &T, float *slot) {
    const bool fast = NV && qsa_nvf_ok(w, avec, K);
#if QSA_CPA
    if (fast) return qsa_segs16_nvf_pipe(arow, nrows, w, n0, N, K, nseg, sa, sw, pk, T, slot);
#else
    (void)pk;
    (void)slot;
#endif
    qsa_frag_zero(T);
    for (int seg = 0; seg < nseg; seg++) {
        qsa_frag_c P;
        if (fast) qsa_seg16_nvf<false>(arow, nrows, w, n0, N, K, seg, sa, sw, P);
        else if (NV) qsa_seg16_nvw<false>(arow, avec, w, n0, N, K, seg, sa, sw, P);
        else qsa_seg16<1, false, false, true>(arow, avec, &w, n0, N, K, seg, sa, sw, &P); /* (fp16 experts) */
#pragma unroll
        for (int i = 0; i < 8; i++) T.x[i] = T.x[i] + P.x[i];
    }
    return false;
}

/* The epilogue of a completed GEMV element: y = t (+ bias[n]) into row Y (Y[n] + y when accumulating);
   with Y16 (that row's fp16 copy) qsa_k_silu_scale fused: the same operations on the same value. */
static __device__ __forceinline__ void qsa_gemv_put(float t, const float *bias, float *Y, qsa_f16 *Y16,
                                                    int accumulate, float act_scale, int n) {
    if (bias) t = t + bias[n];
    t = accumulate ? Y[n] + t : t;
    if (Y16) {
        t = qsa_silu(t * act_scale);
        Y16[n] = qsa_f32_to_f16(t);
    }
    Y[n] = t;
}

/* The members of a dense cross-warp GEMV launch: qsa_k_gemv_f16 and qsa_k_gemv_gres one,
 * qsa_k_gemv_f16_group up to QSA_GEMV_GROUP (the projections of a layer that read the same
 * activations): member b computes Y_b (+ bias_b; Y16_b: the silu store of qsa_k_gemv_f16) =
 * A W_b^T with N_b outputs. */
#define QSA_GEMV_GROUP 4
struct qsa_gemv_member {
    const qsa_f16 *W;
    const float *bias;
    float *Y;
    qsa_f16 *Y16;
    int N;
    float act_scale;
};
struct qsa_gemv_group {
    qsa_gemv_member m[QSA_GEMV_GROUP];
    int n;
};

/* The mix output of row m, columns n .. n + ghc - 1 (qsa_k_gemv_gres): mwj their sums (+ bias), mixed
   with the normed streams gxn [M][ghc][H] into Y [M][H] and its fp16 copy Y16 */
static __device__ __forceinline__ void qsa_gres_put(float *mwj, const float *bias, const float *gxn, float *Y,
                                                    qsa_f16 *Y16, int m, int n, int N, int ghc) {
    const int H = N / ghc;
    if (bias)
        for (int st = 0; st < ghc; st++) mwj[st] = mwj[st] + bias[n + st];
    const float v = qsa_gres_mix1(mwj, gxn + (qsa_i64)m * N + n / ghc, H, ghc);
    Y[(qsa_i64)m * H + n / ghc] = v;
    Y16[(qsa_i64)m * H + n / ghc] = qsa_f32_to_f16(v);
}

/* The outputs of a completed tile from its nseg partial tiles pt[seg] (added in ascending order: the
   canonical fold) — Y (+ bias, accumulation, the silu store) or, with gxn, qsa_k_gemv_gres's mix of
   its 16 / ghc groups.  CG: the parts are other warps' (read through L2); without it pt is the
   calling warp's own tile in shared memory (nseg 1: the segments already folded in registers). */
template <bool CG>
static __device__ void qsa_gemv_fold(const float *pt, int m0, int n0, int M, int N, int nseg, const float *bias,
                                     float *Y, qsa_f16 *Y16, int accumulate, float act_scale, const float *gxn,
                                     int ghc) {
    const int lane = threadIdx.x & 31, prow = M < 16 ? M : 16;
    if (gxn) { /* qsa_k_gemv_gres: the tile's 16 / ghc groups of ghc interleaved mix weights, mixed */
        const int per = 16 / ghc, H = N / ghc;
        if (prow == 1) { /* one row: a lane per column, its group's columns gathered by shuffles
                            (ghc divides 16: a group's lanes are adjacent) */
            const int n = n0 + (lane & 15);
            const bool ok = lane < 16 && n < N;
            float t = ok ? qsa_sum_parts<CG>(pt + (lane & 15), 16, nseg) : 0.0f;
            if (ok && bias) t = t + bias[n];
            float mwj[16];
            for (int st = 0; st < ghc; st++) mwj[st] = __shfl_sync(QSA_FULL_MASK, t, (lane & ~(ghc - 1)) + st);
            if (ok && n % ghc == 0) {
                const float v = qsa_gres_mix1(mwj, gxn + n / ghc, H, ghc);
                Y[n / ghc] = v;
                Y16[n / ghc] = qsa_f32_to_f16(v);
            }
            return;
        }
        for (int e = lane; e < prow * per; e += 32) { /* group e: row e / per, its ghc columns at e * ghc */
            const int r = e / per, m = m0 + r, n = n0 + (e % per) * ghc;
            if (m >= M || n >= N) continue;
            float mwj[16];
            qsa_sum_parts_cols<CG>(pt + e * ghc, (qsa_i64)prow * 16, nseg, ghc, mwj);
            qsa_gres_put(mwj, bias, gxn, Y, Y16, m, n, N, ghc);
        }
        return;
    }
    if (prow == 1) { /* one row (decode): two lanes per element (qsa_sum_parts_pair) */
        const int n = n0 + (lane & 15);
        const bool ok = n < N;
        const float t = qsa_sum_parts_pair<CG>(pt + (lane & 15), 16, nseg, ok);
        if (ok && lane < 16) qsa_gemv_put(t, bias, Y, Y16, accumulate, act_scale, n);
        return;
    }
    /* several rows: every element's parts were stored (rows past M and columns past N as zeros), so
       a lane sums all of its elements at once */
    float t[8];
    qsa_sum_parts8<CG>(pt + lane, (qsa_i64)prow * 16, nseg, (prow * 16 - lane + 31) / 32, t);
#pragma unroll
    for (int j = 0; j < 8; j++) {
        const int e = lane + 32 * j, m = m0 + (e >> 4), n = n0 + (e & 15);
        if (e < prow * 16 && m < M && n < N)
            qsa_gemv_put(t[j], bias, Y + (qsa_i64)m * N, Y16 ? Y16 + (qsa_i64)m * N : Y16, accumulate, act_scale, n);
    }
}

/* The end of a (tile, segment) task whose partial tile is in pt[seg]: the ticket; the warp that
   completes the tile folds it (qsa_gemv_fold), then resets the ticket. */
static __device__ void qsa_gemv_done(const float *pt, unsigned *count, int tile, int m0, int n0, int M, int N,
                                     int nseg, const float *bias, float *Y, qsa_f16 *Y16, int accumulate,
                                     float act_scale, const float *gxn, int ghc) {
    if (!qsa_ticket_last(&count[tile], (unsigned)nseg)) return;
    qsa_gemv_fold<true>(pt, m0, n0, M, N, nseg, bias, Y, Y16, accumulate, act_scale, gxn, ghc);
    if ((threadIdx.x & 31) == 0) count[tile] = 0u;
}

template <bool NV>
static __device__ void qsa_gemv_xwarp(const qsa_f16 *A, const qsa_wsrc &ws, const float *bias, float *Y, int M, int N,
                                      int K, int accumulate, float *part, unsigned *count, qsa_f16 *Y16,
                                      float act_scale, qsa_i64 task, const float *gxn = 0, int ghc = 0) {
    enum { ST = NV ? QSA_STW : QSA_ST, CPA = !NV && QSA_CPA };
    /* per warp: A, then W (cp.async: the whole segment's W); once the mma are done, the warp's
       partial tile (256 floats) */
    __shared__ __align__(128) qsa_f16 stage[QSA_GEMV_WARPS][CPA ? 16 * QSA_ST + 16 * QSA_SWS : 2 * 16 * ST];
    __shared__ const qsa_f16 *arow[QSA_GEMV_WARPS][16];
    if (blockDim.x != 32 * QSA_GEMV_WARPS || M > QSA_SPLITK_MAX_M) __trap();
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, mt = (M + 15) / 16, prow = M < 16 ? M : 16;
    const int bad = K <= 0 || (NV && (K & 15)), nseg = bad ? 1 : (K + QSA_SEG - 1) / QSA_SEG;
    const qsa_i64 tiles = (qsa_i64)mt * ((N + 15) / 16);
    if (task >= tiles * nseg) return; /* warp-level from here on: no block barriers */
    const int tile = (int)(task / nseg), seg = (int)(task % nseg), m0 = (tile % mt) * 16, n0 = (tile / mt) * 16;
    if (!NV && bad) QSA_PDL_ENTRY(); /* dense (QSA_PDL_LATE): otherwise qsa_seg16 waits after the weight loads */
    if (bad) { /* as qsa_gemm: poison, never guess */
        for (int e = lane; e < 256; e += 32)
            if (m0 + (e >> 4) < M && n0 + (e & 15) < N) Y[(qsa_i64)(m0 + (e >> 4)) * N + n0 + (e & 15)] = QSA_QNAN;
        return;
    }
    const int avec = (((qsa_u64)A) & 15u) == 0 && !(K & 7);
    if (lane < 16) arow[warp][lane] = m0 + lane < M ? A + (qsa_i64)(m0 + lane) * K : 0;
    __syncwarp();
    qsa_frag_c P;
    float *pt = part + (qsa_i64)tile * nseg * prow * 16;
    bool tr = false; /* the partial tile is already in pt (qsa_seg16_tr) */
    if (NV && qsa_nvf_ok(ws, avec, K))
        qsa_seg16_nvf<true>(arow[warp], M - m0, ws, n0, N, K, seg, stage[warp], stage[warp] + 16 * ST, P);
    else if (NV) qsa_seg16_nvw<true>(arow[warp], avec, ws, n0, N, K, seg, stage[warp], stage[warp] + 16 * ST, P);
#if QSA_CPA
    else if (ws.vec && !(K & 7) && avec && M <= QSA_GEMV_TR_ROWS) {
        /* the lane's D elements straight into the partial tile: (W row n, A row m) at [m][n] for its
           prow = M rows */
        float d[4];
        qsa_seg16_tr(arow[warp], ws.w16, n0, N, K, seg, stage[warp] + 16 * ST, d);
        float *ps = pt + (qsa_i64)seg * prow * 16;
        const int g = lane >> 2, m = 2 * (lane & 3);
        if (m < prow) {
            ps[m * 16 + g] = d[0];
            ps[m * 16 + g + 8] = d[2];
        }
        if (m + 1 < prow) {
            ps[(m + 1) * 16 + g] = d[1];
            ps[(m + 1) * 16 + g + 8] = d[3];
        }
        tr = true;
    } else if (ws.vec && !(K & 7))
        qsa_seg16_cpa(arow[warp], avec, ws.w16, n0, N, K, seg, stage[warp], stage[warp] + 16 * ST, P);
    else qsa_seg16<1, false, true, true>(arow[warp], avec, &ws, n0, N, K, seg, stage[warp], stage[warp] + 16 * ST, &P);
#else
    else qsa_seg16<1, false, true>(arow[warp], avec, &ws, n0, N, K, seg, stage[warp], stage[warp] + 16 * ST, &P);
#endif
    if (!tr) {
        float *slot = (float *)stage[warp];
        __syncwarp(); /* every lane's fragment loads are done: the staging becomes the partial tile */
        qsa_wmma_store(slot, P, 16);
        __syncwarp();
        for (int e = lane; e < prow * 16; e += 32) pt[(qsa_i64)seg * prow * 16 + e] = slot[e];
    }
    qsa_gemv_done(pt, count, tile, m0, n0, M, N, nseg, bias, Y, Y16, accumulate, act_scale, gxn, ghc);
}

#if QSA_IN_PART(6)
extern "C" __global__ void __launch_bounds__(32 * QSA_GEMV_WARPS) qsa_k_gemv_f16(const qsa_f16 *__restrict__ A,
                                                                             const qsa_f16 *__restrict__ W,
                                                                             const float *__restrict__ bias, float *Y,
                                                                             int M, int N, int K, int accumulate,
                                                                             float *part, unsigned *count,
                                                                             qsa_f16 *Y16, float act_scale) {
    QSA_PDL_LATE();
    qsa_wsrc ws = qsa_wsrc_f16(W);
    qsa_gemv_xwarp<false>(A, ws, bias, Y, M, N, K, accumulate, part, count, Y16, act_scale,
                          (qsa_i64)blockIdx.x * QSA_GEMV_WARPS + (threadIdx.x >> 5));
}
#endif

/* The same with NVFP4 weights (see qsa_k_gemm_nvfp4).  Launch: as qsa_k_gemv_f16. */
#if QSA_IN_PART(4)
extern "C" __global__ void __launch_bounds__(32 * QSA_GEMV_WARPS) qsa_k_gemv_nvfp4(const qsa_f16 *__restrict__ A,
                                                                               const qsa_u8 *__restrict__ q,
                                                                               const qsa_u8 *__restrict__ s, float s2,
                                                                               float *Y, int M, int N, int K,
                                                                               int accumulate, float *part,
                                                                               unsigned *count, qsa_f16 *Y16,
                                                                               float act_scale) {
    QSA_PDL_ENTRY();
    qsa_wsrc ws = qsa_wsrc_nvfp4(q, s, s2, K);
    qsa_gemv_xwarp<true>(A, ws, 0, Y, M, N, K, accumulate, part, count, Y16, act_scale,
                         (qsa_i64)blockIdx.x * QSA_GEMV_WARPS + (threadIdx.x >> 5));
}
#endif

/* The hyper-connection up projection with the input mix in its epilogue (decode): mw = A W^T (+
 * bias) for W with interleaved rows (qsa__dlin_up_hc: N = hc * H, row j * hc + s), then inp[m][j] =
 * qsa_gres_mix1 of the completed tile's group j and xn [M][hc][H] (inp16 its fp16 copy): the bits of
 * qsa_k_gemv_f16 into mw followed by qsa_k_gres_mix (tested), one launch fewer and no mw.  hc divides
 * 16 (a tile holds whole groups).  Launch: as qsa_k_gemv_f16. */
#if QSA_IN_PART(1)
extern "C" __global__ void __launch_bounds__(32 * QSA_GEMV_WARPS) qsa_k_gemv_gres(
    const qsa_f16 *__restrict__ A, const qsa_f16 *__restrict__ W, const float *__restrict__ bias,
    const float *__restrict__ xn, float *inp, qsa_f16 *inp16, int M, int N, int K, int hc, float *part,
    unsigned *count) {
    QSA_PDL_LATE();
    if (hc < 1 || 16 % hc || N % hc || K <= 0) __trap(); /* the host checks these */
    qsa_wsrc ws = qsa_wsrc_f16(W);
    qsa_gemv_xwarp<false>(A, ws, bias, inp, M, N, K, 0, part, count, inp16, 0.0f,
                          (qsa_i64)blockIdx.x * QSA_GEMV_WARPS + (threadIdx.x >> 5), xn, hc);
}
#endif

/* Up to QSA_GEMV_GROUP dense GEMVs of one input in one launch (the projections of a layer that
 * read the same activations): member b computes Y_b (+ bias_b; Y16_b: the silu store of
 * qsa_k_gemv_f16) = A W_b^T with N_b outputs, no accumulation.  The tasks of the members follow
 * one another (member 0's (tile, segment) tasks first), and so do their partial tiles in `part` and
 * their tickets in `count`; each task runs exactly the body of qsa_k_gemv_f16, so every member gets
 * the bits of its own launch (tested).  Launch: grid ceil(sum_b tiles_b * nseg / QSA_GEMV_WARPS),
 * block 32 * QSA_GEMV_WARPS, M <= QSA_SPLITK_MAX_M; part and count hold the members' regions. */
#if QSA_IN_PART(3)
extern "C" __global__ void __launch_bounds__(32 * QSA_GEMV_WARPS) qsa_k_gemv_f16_group(const qsa_f16 *__restrict__ A,
                                                                                   qsa_gemv_group grp, int M, int K,
                                                                                   float *part, unsigned *count) {
    QSA_PDL_LATE();
    const int mt = (M + 15) / 16, prow = M < 16 ? M : 16, nseg = K <= 0 ? 1 : (K + QSA_SEG - 1) / QSA_SEG;
    qsa_i64 task = (qsa_i64)blockIdx.x * QSA_GEMV_WARPS + (threadIdx.x >> 5);
    qsa_gemv_member mb;
    bool found = false;
#pragma unroll
    for (int b = 0; b < QSA_GEMV_GROUP; b++) { /* unrolled: the parameter struct is indexed statically */
        if (found || b >= grp.n) continue;
        const qsa_i64 tiles = (qsa_i64)mt * ((grp.m[b].N + 15) / 16);
        if (task < tiles * nseg) {
            mb = grp.m[b];
            found = true;
        } else {
            task -= tiles * nseg;
            part += tiles * nseg * prow * 16;
            count += tiles;
        }
    }
    if (!found) return; /* a warp past the last task touches nothing */
    const qsa_wsrc ws = qsa_wsrc_f16(mb.W);
    qsa_gemv_xwarp<false>(A, ws, mb.bias, mb.Y, M, mb.N, K, 0, part, count, mb.Y16, mb.act_scale, task);
}
#endif

/* The block form's stage: the group's RP row tiles of A (RP 1, or 2: 32 rows, each weight fragment
   serving both) and each warp's W, 16 rows of half a segment (QSA_GBK halves apart: a quarter-warp's
   ldmatrix rows hit distinct banks), twice (the stage in use and the one in flight): QSA_GB_SMEM(RP)
   bytes of dynamic shared memory (43,520 or 52,224; the host's QSA__GB_SMEM) */
#define QSA_GBK (QSA_SEG / 2 + 8)
#define QSA_GB_TILE (16 * QSA_GBK)
#define QSA_GB_STAGE(rp) ((QSA_GEMV_WARPS + (rp)) * QSA_GB_TILE)
#define QSA_GB_SMEM(rp) (2 * QSA_GB_STAGE(rp) * 2)
/* Blocks per SM qsa_k_gemv_blk is built for (registers; its 43.5 KB of shared memory also allows 5 on
   sm_90): the copies in flight per SM scale with it (the host's QSA__GEMV_BLOCKS). */
#define QSA_GEMV_BLOCKS 5

/* member b of a launch's group (unrolled: the parameter struct is indexed statically) */
static __device__ __forceinline__ qsa_gemv_member qsa_gemv_pick(const qsa_gemv_group &grp, int b) {
    qsa_gemv_member r = grp.m[0];
#pragma unroll
    for (int i = 1; i < QSA_GEMV_GROUP; i++)
        if (i == b) r = grp.m[i];
    return r;
}

#if QSA_CPA
/* Whether the block form (qsa_gemv_blocks) can take a dense GEMV launch: sm_80+, 1 to
   QSA_SPLITK_MAX_M rows, K a positive multiple of 8, A and every member's W 16-byte aligned (the
   host's qsa__gemv_groups is the same test, and decides from how many rows it takes them). */
static __device__ __forceinline__ bool qsa_gemv_blockwise(const qsa_f16 *A, const qsa_gemv_group &grp, int M, int K) {
    bool ok = M >= 1 && M <= QSA_SPLITK_MAX_M && K > 0 && !(K & 7) && !(((qsa_u64)A) & 15u);
#pragma unroll
    for (int b = 0; b < QSA_GEMV_GROUP; b++)
        if (b < grp.n && (((qsa_u64)grp.m[b].W) & 15u)) ok = false;
    return ok;
}

/* Where group g of a block-form launch lies: member b, segment seg, first row m0 (of its rp row
 * tiles), the block's first column tile nt0 (warp w takes nt0 + w), and the member's partial tiles
 * and tickets (part, count offsets: those are per 16-row tile whatever rp).  A member's groups go
 * column groups fastest, then row groups of 16 rp rows, then segments. */
struct qsa_gb_job {
    int b, seg, m0, nt0;
    qsa_i64 part_off, count_off;
};
static __device__ __forceinline__ qsa_gb_job qsa_gb_locate(const qsa_gemv_group &grp, int M, int nseg, int g,
                                                           int rp) {
    const int mt = (M + 15) / 16, prow = M < 16 ? M : 16, mg = (M + 16 * rp - 1) / (16 * rp);
    qsa_gb_job j;
    j.b = -1;
    j.seg = j.m0 = j.nt0 = 0;
    j.part_off = j.count_off = 0;
#pragma unroll
    for (int b = 0; b < QSA_GEMV_GROUP; b++) {
        if (j.b >= 0 || b >= grp.n) continue;
        const int nt = (grp.m[b].N + 15) / 16, ng = (nt + QSA_GEMV_WARPS - 1) / QSA_GEMV_WARPS, G = ng * mg * nseg;
        if (g < G) {
            const int r = g / ng;
            j.b = b;
            j.nt0 = (g - r * ng) * QSA_GEMV_WARPS;
            j.m0 = (r % mg) * 16 * rp;
            j.seg = r / mg;
        } else {
            g -= G;
            j.part_off += (qsa_i64)mt * nt * nseg * prow * 16;
            j.count_off += (qsa_i64)mt * nt;
        }
    }
    return j;
}
/* The copies of one stage (half h of job j's segment) into st: this warp's 16 W rows (8 pieces of
   16 bytes per lane: rows lane / 16 + 2 i, k = 8 (lane % 16)) and, shared by the block, A rows m0 ..
   m0 + 16 RP - 1 (2 RP pieces per thread); rows past M or N and k >= kend zero-filled.  With `pdl`
   the PDL wait comes between the two (the weights are never written by a kernel; A is the previous
   kernel's). */
template <int RP>
static __device__ __forceinline__ void qsa_gb_copy(const qsa_f16 *A, const qsa_gemv_group &grp, int M, int K,
                                                   const qsa_gb_job &j, int h, qsa_f16 *st, bool pdl) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int kend = min(K, (j.seg + 1) * QSA_SEG), k = j.seg * QSA_SEG + h * (QSA_SEG / 2) + 8 * (lane & 15);
    const qsa_gemv_member mb = qsa_gemv_pick(grp, j.b);
    const int n0 = (j.nt0 + warp) * 16;
    const qsa_u32 wdst = qsa_smem_u32(st + (RP + warp) * QSA_GB_TILE + (lane >> 4) * QSA_GBK + 8 * (lane & 15));
#pragma unroll
    for (int i = 0; i < 8; i++) {
        const int n = n0 + (lane >> 4) + 2 * i;
        const bool ok = n < mb.N && k < kend;
        qsa_cp16z(wdst + i * 2 * QSA_GBK * 2, ok ? mb.W + (qsa_i64)n * K + k : mb.W, ok);
    }
    if (pdl) QSA_PDL_ENTRY();
#pragma unroll
    for (int i = 0; i < RP * 16 * 16 / (32 * QSA_GEMV_WARPS); i++) {
        const int p = threadIdx.x + 32 * QSA_GEMV_WARPS * i, r = p >> 4,
                  ka = j.seg * QSA_SEG + h * (QSA_SEG / 2) + 8 * (p & 15);
        const bool ok = j.m0 + r < M && ka < kend;
        const qsa_u32 dst = qsa_smem_u32(st + r * QSA_GBK + 8 * (p & 15));
        qsa_cp16z(dst, ok ? A + (qsa_i64)(j.m0 + r) * K + ka : A, ok);
    }
}

/* The block form of the dense GEMV for decode batches (1 to 64 rows, sm_80+):
 * a block's warps take QSA_GEMV_WARPS column tiles of RP row tiles (16 or 32 rows) and one segment (a
 * group), so the block copies that segment of A once for all of them, and each block loops over groups g =
 * blockIdx.x, + gridDim.x, ... in stages of half a segment, double-buffered: the copies of the next
 * stage (cp.async) are in flight while the warps work on this one and end their tasks (ticket, and
 * the completing warp's fold) — the per-warp form's warps did one task each and then waited on the
 * next block's copies (ncu at batch 32: DRAM busy ~20% of the time).  Per chunk of 16: an ldmatrix of
 * W, and per row tile one of A and two m16n8k16 (the instructions wmma compiles to on sm_80+,
 * qsa_nvf_mma4_ld), chunk after chunk into an accumulator zeroed at the segment's start: the bits of
 * qsa_seg16_cpa, and the same partial tiles (one per 16-row tile whatever RP), tickets and folds
 * (qsa_gemv_done) as the per-warp form (tested against the one-block GEMM, with grids that loop).
 * `whole` (qsa_k_gemv_blk_whole): a group is all of K instead of one segment (its stages run
 * through the segments in order); each warp folds its tile's segments in registers, T = ((0 + P_0) +
 * P_1) + ..., and writes the outputs itself from its own shared memory (qsa_gemv_fold<false>): no
 * partial tiles in global memory, no tickets, the same bits.  For short K (the HC up projection's
 * 320: two segments), where the ticket and the completing warp's reload are most of a task.  (A
 * template: the split form compiles to its code without the whole form's, which doubles the
 * kernel.)  Every thread of the block calls it. */
/* A tile's rows < prow as [prow][16] floats at p, from the mma accumulators d of the calling warp:
   d[4 hh + 2 i + jj] is row lane / 4 + 8 i, column 8 hh + 2 (lane % 4) + jj */
static __device__ __forceinline__ void qsa_gb_put_tile(float *p, const float *d, int prow) {
    const int lane = threadIdx.x & 31, g = lane >> 2, c = 2 * (lane & 3);
#pragma unroll
    for (int hh = 0; hh < 2; hh++)
#pragma unroll
        for (int i = 0; i < 2; i++)
            if (g + 8 * i < prow)
                *(float2 *)(p + (g + 8 * i) * 16 + 8 * hh + c) = make_float2(d[4 * hh + 2 * i], d[4 * hh + 2 * i + 1]);
}
/* the dynamic shared memory of this launch, bytes */
static __device__ __forceinline__ unsigned qsa_dyn_smem_bytes(void) {
    unsigned r;
    asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(r));
    return r;
}
template <bool whole, int RP>
static __device__ void qsa_gemv_blocks(const qsa_f16 *A, const qsa_gemv_group &grp, int M, int K, int accumulate,
                                       float *part, unsigned *count, const float *gxn, int ghc) {
    extern __shared__ __align__(128) unsigned char qsa_dyn[];
    qsa_f16 *const st = (qsa_f16 *)qsa_dyn;
    if (qsa_dyn_smem_bytes() < QSA_GB_SMEM(RP)) __trap(); /* the host passes QSA__GB_SMEM(RP) */
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, mt = (M + 15) / 16, prow = M < 16 ? M : 16;
    const int nseg = (K + QSA_SEG - 1) / QSA_SEG, gseg = whole ? 1 : nseg, spg = whole ? nseg : 1;
    const int mg = (M + 16 * RP - 1) / (16 * RP);
    int G = 0;
#pragma unroll
    for (int b = 0; b < QSA_GEMV_GROUP; b++)
        if (b < grp.n) G += (((grp.m[b].N + 15) / 16 + QSA_GEMV_WARPS - 1) / QSA_GEMV_WARPS) * mg * gseg;
    if ((int)blockIdx.x >= G) return;
    /* stages: 2 per segment, spg segments per group */
    const int nq = 2 * spg * ((G - (int)blockIdx.x + (int)gridDim.x - 1) / (int)gridDim.x);
    /* this lane's ldmatrix addresses in a stage: A row lane % 16 (of row tile r: + r QSA_GB_TILE) at
       column 8 (lane / 16); W row 8 (lane / 16) + lane % 8 at k = 8 (lane / 8 % 2) */
    const qsa_u32 ab = qsa_smem_u32(st) + 2 * ((lane & 15) * QSA_GBK + (lane >> 4) * 8),
                  wb = qsa_smem_u32(st + (RP + warp) * QSA_GB_TILE) +
                       2 * (((lane >> 4) * 8 + (lane & 7)) * QSA_GBK + ((lane >> 3) & 1) * 8);
    qsa_gb_job cur = qsa_gb_locate(grp, M, gseg, blockIdx.x, RP), nxt = cur;
    qsa_gb_copy<RP>(A, grp, M, K, cur, 0, st, true);
    asm volatile("cp.async.commit_group;" ::: "memory");
    float d[8 * RP], T[8 * RP]; /* row tile r: d[8 r ..], T[8 r ..] */
    for (int q = 0; q < nq; q++) {
        const int h = q & 1;
        if (q + 1 < nq) {
            if (h) { /* the next stage starts a segment: the group's next one, or the next group's first */
                const int sn = ((q + 1) >> 1) % spg;
                if (sn) {
                    nxt = cur;
                    nxt.seg = sn;
                } else {
                    nxt = qsa_gb_locate(grp, M, gseg, blockIdx.x + ((q + 1) >> 1) / spg * gridDim.x, RP);
                }
            }
            qsa_gb_copy<RP>(A, grp, M, K, nxt, h ^ 1, st + ((q + 1) & 1) * QSA_GB_STAGE(RP), false);
        }
        asm volatile("cp.async.commit_group;" ::: "memory"); /* (possibly empty: one group per stage) */
        asm volatile("cp.async.wait_group 1;" ::: "memory");  /* this stage's copies have landed */
        __syncthreads(); /* ... every thread's */
        if (!h) {
#pragma unroll
            for (int i = 0; i < 8 * RP; i++) d[i] = 0.0f;
        }
        const int k0 = cur.seg * QSA_SEG + h * (QSA_SEG / 2), kend = min(K, (cur.seg + 1) * QSA_SEG);
        const qsa_u32 so = 2 * (q & 1) * QSA_GB_STAGE(RP);
#pragma unroll
        for (int c = 0; c < QSA_SEG / 32; c++) {
            if (k0 + 16 * c >= kend) break;
            qsa_u32 fa[4], fw[4];
            qsa_ldsm4(wb + so + 32 * c, fw);
#pragma unroll
            for (int r = 0; r < RP; r++) {
                qsa_ldsm4(ab + so + 2 * r * QSA_GB_TILE + 32 * c, fa);
                qsa_mma16816(d + 8 * r, fa, fw[0], fw[1]);
                qsa_mma16816(d + 8 * r + 4, fa, fw[2], fw[3]);
            }
        }
        const qsa_gemv_member mb = qsa_gemv_pick(grp, cur.b);
        const int ntile = cur.nt0 + warp;
        if (h && whole) {
            if (!cur.seg) {
#pragma unroll
                for (int i = 0; i < 8 * RP; i++) T[i] = 0.0f;
            }
#pragma unroll
            for (int i = 0; i < 8 * RP; i++) T[i] = T[i] + d[i];
            if (cur.seg == nseg - 1 && ntile < (mb.N + 15) / 16) {
                /* the folded tiles [prow][16] each into this warp's W tile of this stage (its ldmatrix
                   loads are done; the next copy into it follows the block barrier below) */
                float *tt = (float *)(st + (q & 1) * QSA_GB_STAGE(RP) + (RP + warp) * QSA_GB_TILE);
                __syncwarp();
#pragma unroll
                for (int r = 0; r < RP; r++) qsa_gb_put_tile(tt + r * 16 * 16, T + 8 * r, prow);
                __syncwarp();
#pragma unroll
                for (int r = 0; r < RP; r++)
                    if (RP == 1 || cur.m0 + 16 * r < M)
                        qsa_gemv_fold<false>(tt + r * 16 * 16, cur.m0 + 16 * r, ntile * 16, M, mb.N, 1, mb.bias,
                                             mb.Y, mb.Y16, accumulate, mb.act_scale, gxn, ghc);
            }
        } else if (h && ntile < (mb.N + 15) / 16) {
            /* the partial tiles straight from the mma's D */
#pragma unroll
            for (int r = 0; r < RP; r++) {
                const int m0 = cur.m0 + 16 * r, tile = ntile * mt + m0 / 16;
                if (RP > 1 && m0 >= M) continue; /* (RP 1: never; the test costs registers) */
                float *pt = part + cur.part_off + (qsa_i64)tile * nseg * prow * 16;
                qsa_gb_put_tile(pt + (qsa_i64)cur.seg * prow * 16, d + 8 * r, prow);
                if (count) /* (else a qsa_k_gemv_fold launch folds the tiles) */
                    qsa_gemv_done(pt, count + cur.count_off, tile, m0, ntile * 16, M, mb.N, nseg, mb.bias, mb.Y,
                                  mb.Y16, accumulate, mb.act_scale, gxn, ghc);
            }
        }
        if (h) cur = nxt;
        __syncthreads(); /* every warp is done with this stage's buffer: the next iteration's copy refills it */
    }
}
#endif

/* The dense GEMVs of the decode batches in the block form
 * (qsa_gemv_blocks): the members of grp over A (one: qsa_k_gemv_f16's work, with `accumulate`; one
 * and xn != NULL: qsa_k_gemv_gres's, hc its stream count; up to QSA_GEMV_GROUP:
 * qsa_k_gemv_f16_group's), the same partial tiles, tickets and outputs as those kernels: their bits
 * (tested); count NULL: qsa_k_gemv_blk stores the partial tiles only (no tickets, no folds) and a
 * qsa_k_gemv_fold launch after it folds them; qsa_k_gemv_blk_whole: whole-K groups, no partial tiles or
 * tickets (part and count unused), the same outputs.  qsa_k_gemv_blk32: qsa_k_gemv_blk with groups of
 * 32 rows (RP = 2), each weight fragment loaded once for both row tiles (the host takes it from 17 rows
 * on, qsa__gemv_rp; whole-K groups of 32 rows measured slower, so no kernel has them); either applies
 * to any M.  Only where qsa_gemv_blockwise holds (sm_80+, 1 to 64
 * rows, K % 8 == 0, 16-byte aligned A and W: the host's qsa__gemv_groups); elsewhere they trap.
 * Launch: any grid (the host: at most QSA_GEMV_BLOCKS per SM, and as many as fit one), block 32 *
 * QSA_GEMV_WARPS, dynamic shared memory QSA_GB_SMEM(RP) bytes (RP 2: past 48 KB, the function's
 * limit raised). */
#if QSA_CPA
template <bool whole, int RP>
static __device__ __forceinline__ void qsa_gemv_blk_entry(const qsa_f16 *A, const qsa_gemv_group &grp, int M, int K,
                                                          int accumulate, float *part, unsigned *count,
                                                          const float *xn, int hc) {
    if (blockDim.x != 32 * QSA_GEMV_WARPS || !qsa_gemv_blockwise(A, grp, M, K)) __trap(); /* the host checks these */
    if (xn && (grp.n != 1 || hc < 1 || 16 % hc || grp.m[0].N % hc)) __trap();
    qsa_gemv_blocks<whole, RP>(A, grp, M, K, accumulate, part, count, xn, hc);
}
#define QSA_GEMV_BLK_BODY(whole, rp)                                                                          \
    QSA_PDL_LATE();                                                                                           \
    qsa_gemv_blk_entry<whole, rp>(A, grp, M, K, accumulate, part, count, xn, hc)
#else
#define QSA_GEMV_BLK_BODY(whole, rp)                                                                          \
    (void)A, (void)grp, (void)M, (void)K, (void)accumulate, (void)part, (void)count, (void)xn, (void)hc;    \
    __trap() /* (sm_80+ only: cp.async) */
#endif
/* (blocks per SM at RP = 2: four fit the H200's 228 KB, so up to 128 registers) */
#define QSA_GEMV_BLK_PARAMS                                                                                   \
    const qsa_f16 *__restrict__ A, qsa_gemv_group grp, int M, int K, int accumulate, float *part, unsigned *count, \
        const float *__restrict__ xn, int hc
#if QSA_IN_PART(3)
extern "C" __global__ void __launch_bounds__(32 * QSA_GEMV_WARPS, QSA_GEMV_BLOCKS) qsa_k_gemv_blk(QSA_GEMV_BLK_PARAMS) {
    QSA_GEMV_BLK_BODY(false, 1);
}
#endif
#if QSA_IN_PART(0)
extern "C" __global__ void __launch_bounds__(32 * QSA_GEMV_WARPS, QSA_GEMV_BLOCKS)
    qsa_k_gemv_blk_whole(QSA_GEMV_BLK_PARAMS) {
    QSA_GEMV_BLK_BODY(true, 1);
}
#endif
#if QSA_IN_PART(4)
extern "C" __global__ void __launch_bounds__(32 * QSA_GEMV_WARPS, 4) qsa_k_gemv_blk32(QSA_GEMV_BLK_PARAMS) {
    QSA_GEMV_BLK_BODY(false, 2);
}
#endif

/* The folds of a qsa_k_gemv_blk launch made without tickets (count NULL; same grp, M, K, accumulate,
 * part, xn and hc): one thread per output element of every member's tiles (with xn: per group of hc
 * columns, qsa_k_gemv_gres's mix), its nseg partial tiles added in ascending order, ((0 + P_0) + P_1)
 * + ..., 16 loads in flight, then the epilogue of qsa_gemv_fold — the same operations on the same
 * values as the completing warp's fold: the same bits (tested).  Where the completing warps' folds
 * are the launch's tail (batch 32: 42 warps fold 40 parts of 256 elements each for the HC down
 * projection, 10 rounds of loads apiece, while the other SMs idle), this spreads them over a thread
 * per element, for one launch more.  Launch: grid ceil(items / 256) (items: sum over members of
 * ceil(M/16) ceil(N_b/16) prow 16, or / hc with xn; more blocks return), block 256. */
#if QSA_IN_PART(6)
extern "C" __global__ void __launch_bounds__(256) qsa_k_gemv_fold(qsa_gemv_group grp, int M, int K, int accumulate,
                                                                  const float *__restrict__ part,
                                                                  const float *__restrict__ xn, int hc) {
    QSA_PDL_ENTRY();
    if (M < 1 || M > QSA_SPLITK_MAX_M || K <= 0 || (xn && (grp.n != 1 || hc < 1 || 16 % hc || grp.m[0].N % hc)))
        __trap(); /* the host checks these */
    const int mt = (M + 15) / 16, prow = M < 16 ? M : 16, nseg = (K + QSA_SEG - 1) / QSA_SEG;
    const int per = xn ? 16 / hc : 16, items = prow * per; /* per tile */
    qsa_i64 i = (qsa_i64)blockIdx.x * blockDim.x + threadIdx.x, poff = 0;
    int b = -1;
#pragma unroll
    for (int bb = 0; bb < QSA_GEMV_GROUP; bb++) { /* (the parameter struct is indexed statically) */
        if (b >= 0 || bb >= grp.n) continue;
        const qsa_i64 tiles = (qsa_i64)mt * ((grp.m[bb].N + 15) / 16);
        if (i < tiles * items) {
            b = bb;
        } else {
            i -= tiles * items;
            poff += tiles * nseg * prow * 16;
        }
    }
    if (b < 0) return;
    const qsa_gemv_member mb = qsa_gemv_pick(grp, b);
    const qsa_i64 tile = i / items;
    const int e = (int)(i - tile * items), r = e / per, m = (int)(tile % mt) * 16 + r;
    const int n = (int)(tile / mt) * 16 + (e % per) * (xn ? hc : 1);
    if (m >= M || n >= mb.N) return;
    const float *pe = part + poff + tile * nseg * prow * 16 + r * 16 + (e % per) * (xn ? hc : 1);
    if (!xn) {
        const float t = qsa_sum_parts<true, 16>(pe, (qsa_i64)prow * 16, nseg);
        qsa_gemv_put(t, mb.bias, mb.Y + (qsa_i64)m * mb.N, mb.Y16 ? mb.Y16 + (qsa_i64)m * mb.N : mb.Y16, accumulate,
                     mb.act_scale, n);
        return;
    }
    float mwj[16];
    qsa_sum_parts_cols<true, 4>(pe, (qsa_i64)prow * 16, nseg, hc, mwj);
    qsa_gres_put(mwj, mb.bias, xn, mb.Y, mb.Y16, m, n, mb.N, hc);
}
#endif

/* The tiled form of qsa_k_gemv_f16_group: the 64 x 64 tiles of member 0, then member 1's, ..., each
 * through qsa_tile64 as qsa_k_gemm_f16 computes it for M > QSA_SPLITK_MAX_M — the canonical order,
 * so every member gets the bits of its own launch whatever M (tested against the split-K tiles of
 * qsa_k_gemm_f16 for M <= 64 too); a small member (the GDN gates, the injection projection, the
 * shared-expert gate: N <= 64) fills SMs beside its siblings instead of taking a launch of its own.
 * Prefill chunks take it, and decode batches for wide projections (qsa__dgemm_tiled: each weight
 * row read once for up to 64 tokens instead of once per 16).  No accumulation; members' Y16 /
 * act_scale are ignored (the host applies qsa_k_silu_scale).  Launch: grid sum_b ceil(M/64) *
 * ceil(N_b/64) (or fewer: blocks loop), block 256, M >= 1, K >= 1. */
#if QSA_IN_PART(4)
extern "C" __global__ void __launch_bounds__(256) qsa_k_gemm_f16_group(const qsa_f16 *__restrict__ A,
                                                                   qsa_gemv_group grp, int M, int K) {
    QSA_PDL_ENTRY();
    __shared__ __align__(128) unsigned char smem[QSA_GEMM_SMEM];
    if (blockDim.x != QSA_GEMM_THREADS || M <= 0 || K <= 0) __trap(); /* the host checks these */
    const int mt = (M + 63) / 64, avec = (((qsa_u64)A) & 15u) == 0 && !(K & 7);
    qsa_i64 total = 0;
#pragma unroll
    for (int b = 0; b < QSA_GEMV_GROUP; b++)
        if (b < grp.n) total += (qsa_i64)mt * ((grp.m[b].N + 63) / 64);
    for (qsa_i64 t0 = blockIdx.x; t0 < total; t0 += gridDim.x) {
        qsa_i64 t = t0;
        qsa_gemv_member mb;
        bool found = false;
#pragma unroll
        for (int b = 0; b < QSA_GEMV_GROUP; b++) { /* unrolled: the parameter struct is indexed statically */
            if (found || b >= grp.n) continue;
            const qsa_i64 tiles = (qsa_i64)mt * ((grp.m[b].N + 63) / 64);
            if (t < tiles) {
                mb = grp.m[b];
                found = true;
            } else {
                t -= tiles;
            }
        }
        qsa_tile64<2, false>(A, avec, qsa_wsrc_f16(mb.W), mb.bias, mb.Y, M, mb.N, K, 0, (int)(t % mt) * 64, (int)(t / mt) * 64,
                      smem);
    }
}
#endif

/* The wide dense projections of a decode batch of 1 to 32 rows (sm_80+), the weights streamed through
 * a ring of cp.async stages: the same members, outputs and bits as qsa_k_gemm_f16_group (tested), for
 * the projections whose columns alone fill the GPU (the GDN input group, attention q/k/v, lm_head).
 * A block of nw = blockDim.x / 32 warps (4 or 8) in kh K halves (1 or 2) takes group g (members' groups
 * follow one another): nc = nw / kh column tiles of one member, warp w the tile of rows 16 (g nc + w %
 * nc), which is the mma's A operand (16 x 16 per chunk, one ldmatrix, as qsa_seg16_tr), the batch's rows
 * its B operand in four n8 column groups of 8 rows (two ldmatrix x4 per chunk; groups wholly past M
 * skipped).  K goes in stages of QSA_DEEP_K: the block copies a stage's W rows and A rows by cp.async
 * into a ring of `stages` buffers of QSA_DEEP_STAGE(nw, kh) bytes (dynamic shared memory), stages - 1 of
 * them in flight while the warps work on one; one block barrier per stage.  Unlike the 64 x 64 tiles,
 * no mma or staging for padding rows, and no operand round trip through registers.  Each element is
 * the same 16 products in the same positions of k per chunk, chunk after chunk into an accumulator P
 * zeroed at each segment's start (P_s), T = ((0 + P_0) + P_1) + ... in registers, then + bias: the
 * canonical order.  kh = 2 (the halves): warps w < nc take the even segments, warps w + nc the odd ones
 * of the same tile, side by side (stage i of the block: segment 2 (i / 4) + half, its stage i % 4, A rows
 * of both halves staged); at the end of each pair of segments the odd half leaves its P_s in shared
 * memory and the even half, after the next barrier, adds it after its own: the same T, with twice the
 * warps per tile (for groups too few to give two 8-warp blocks per SM: the GDN input group's 1,030 tiles
 * are ~8 warps per SM in whole-K warps).  (On the H200 at batch 32: the GDN input group 48.4 -> 41.5 us
 * against the 64 x 64 tiles, lm_head quarters 172.7 -> 101.5 us with 8 warps; 8 stages instead of 6, or
 * A copied through L1, made no difference: the rate rose with the warps per SM, not with the bytes in
 * flight.)  Requires 1 <= M <= 32, K a positive multiple of 8, A and every W 16-byte aligned, 2 <= stages
 * <= 8, block 128 or 256, kh 1 or 2 (else trap; the host checks).  Launch: any grid (blocks loop over
 * groups; best: one block per group), dynamic shared memory stages * QSA_DEEP_STAGE(nw, kh) + (kh - 1) *
 * QSA_DEEP_X(nw / kh) bytes (over 48 KB: the host raises the function's limit). */
#define QSA_DEEP_K 64                 /* k per stage: 4 chunks */
#define QSA_DEEP_LD (QSA_DEEP_K + 8)  /* staged row, halves: 144 bytes, ldmatrix rows on distinct banks */
#define QSA_DEEP_STAGE(nw, kh) (((nw) * 16 + 32 * (kh)) * QSA_DEEP_LD * 2) /* W rows of nw warps, 32 A rows per half */
#define QSA_DEEP_X(nc) ((nc) * 16 * 32 * 4) /* the odd half's P_s handed over: 16 floats per lane per tile */
#if QSA_CPA
/* waits until at most n (0 .. 7) committed copy groups of this thread are in flight */
static __device__ __forceinline__ void qsa_cp_wait_n(int n) {
    switch (n) {
    case 0: asm volatile("cp.async.wait_group 0;" ::: "memory"); break;
    case 1: asm volatile("cp.async.wait_group 1;" ::: "memory"); break;
    case 2: asm volatile("cp.async.wait_group 2;" ::: "memory"); break;
    case 3: asm volatile("cp.async.wait_group 3;" ::: "memory"); break;
    case 4: asm volatile("cp.async.wait_group 4;" ::: "memory"); break;
    case 5: asm volatile("cp.async.wait_group 5;" ::: "memory"); break;
    case 6: asm volatile("cp.async.wait_group 6;" ::: "memory"); break;
    default: asm volatile("cp.async.wait_group 7;" ::: "memory"); break;
    }
}
/* The K stage of block stage i for half h: kh 1, i itself; kh 2, stage i % 4 of segment 2 (i / 4) + h */
static __device__ __forceinline__ int qsa_deep_q(int i, int h, int kh) {
    return kh == 1 ? i : (i >> 2) * 2 * (QSA_SEG / QSA_DEEP_K) + h * (QSA_SEG / QSA_DEEP_K) + (i & 3);
}
/* Stage i's copies into buffer st (shared address): this warp's W rows n0 .. n0 + 15 at its half h's
   stage (lane: rows lane / 8 + 4 i, k = 8 (lane % 8): a quarter-warp copies a row's 128 contiguous
   bytes) and the block's share of the A rows of every half (thread: rows tid / 8 + 16 i of the halves'
   32 each); rows past N or M and k >= K zero-filled (a half's stage past K: all of it).  Only the W
   copies with `a` false, only the A copies with `w` false. */
static __device__ __forceinline__ void qsa_deep_copy(const qsa_f16 *W, int n0, int N, const qsa_f16 *A, int M, int K,
                                                     int i, int h, int kh, int nw, qsa_u32 st, bool w, bool a) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, k = qsa_deep_q(i, h, kh) * QSA_DEEP_K + 8 * (lane & 7);
#pragma unroll
    for (int j = 0; j < 4 && w; j++) {
        const int r = (lane >> 3) + 4 * j, n = n0 + r;
        const bool ok = n < N && k < K;
        qsa_cp16z(st + 2 * ((warp * 16 + r) * QSA_DEEP_LD + 8 * (lane & 7)), ok ? W + (qsa_i64)n * K + k : W, ok);
    }
    for (int r = (int)(threadIdx.x >> 3); r < 32 * kh && a; r += 4 * nw) {
        const int ka = qsa_deep_q(i, kh == 1 ? 0 : r >> 5, kh) * QSA_DEEP_K + 8 * (threadIdx.x & 7), m = kh == 1 ? r : r & 31;
        const bool ok = m < M && ka < K;
        qsa_cp16z(st + 2 * ((nw * 16 + r) * QSA_DEEP_LD + 8 * (threadIdx.x & 7)), ok ? A + (qsa_i64)m * K + ka : A, ok);
    }
}
/* T += the odd half's P_s handed over at xh (element e at xh[32 e]) */
static __device__ __forceinline__ void qsa_deep_take(float *T, const float *xh) {
#pragma unroll
    for (int e = 0; e < 16; e++) T[e] = T[e] + xh[32 * e];
}
/* the kernel for kh = KH (a template: each form's stage loop with kh a constant; nvcc sm_90 SASS: the whole-K
   form 991 instructions per loop where the form before the halves had 1,005, the halves' form 1,190) */
template <int KH>
static __device__ __forceinline__ void qsa_gemv_deep(const qsa_f16 *__restrict__ A, const qsa_gemv_group &grp, int M,
                                                     int K, int stages) {
    enum { kh = KH };
    extern __shared__ __align__(128) unsigned char qsa_dyn[];
    const int nw = blockDim.x >> 5, S = QSA_DEEP_STAGE(nw, kh);
    bool ok = M >= 1 && M <= 32 && K > 0 && !(K & 7) && !(((qsa_u64)A) & 15u) && stages >= 2 && stages <= 8 &&
              (blockDim.x == 128 || blockDim.x == 256);
#pragma unroll
    for (int b = 0; b < QSA_GEMV_GROUP; b++)
        if (b < grp.n && (((qsa_u64)grp.m[b].W) & 15u)) ok = false;
    if (!ok) __trap(); /* the host checks these */
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g8 = lane >> 2, t4 = lane & 3;
    const int nc = nw / kh, h = kh == 1 ? 0 : warp / nc, mg = (M + 7) / 8, nq = (K + QSA_DEEP_K - 1) / QSA_DEEP_K;
    const int nseg = (K + QSA_SEG - 1) / QSA_SEG, spq = QSA_SEG / QSA_DEEP_K;
    const int ni = kh == 1 ? nq : spq * ((nseg + 1) / 2); /* the block's stages per group */
    const qsa_u32 s0 = qsa_smem_u32(qsa_dyn);
    /* the odd half's handover of tile warp % nc: [16][32] floats (element e of lane l at e 32 + l) */
    float *xh = (float *)(qsa_dyn + stages * S) + (warp % nc) * 16 * 32 + lane;
    /* this lane's ldmatrix addresses in a stage: W row lane % 16 of its warp's tile at k = 8 (lane /
       16); A row 8 (lane / 16) + lane % 8 (+ 16 for groups 2 and 3) of its half at k = 8 (lane / 8 % 2) */
    const qsa_u32 wa = 2 * ((warp * 16 + (lane & 15)) * QSA_DEEP_LD + (lane >> 4) * 8),
                  xa = 2 * ((nw * 16 + 32 * h + (lane >> 4) * 8 + (lane & 7)) * QSA_DEEP_LD + ((lane >> 3) & 1) * 8);
    int G = 0;
#pragma unroll
    for (int b = 0; b < QSA_GEMV_GROUP; b++)
        if (b < grp.n) G += (grp.m[b].N + 16 * nc - 1) / (16 * nc);
    bool waited = false;
    for (int gi = blockIdx.x; gi < G; gi += gridDim.x) {
        int b = -1, g = gi;
#pragma unroll
        for (int i = 0; i < QSA_GEMV_GROUP; i++) { /* (the parameter struct is indexed statically) */
            if (b >= 0 || i >= grp.n) continue;
            const int gb = (grp.m[i].N + 16 * nc - 1) / (16 * nc);
            if (g < gb) b = i;
            else g -= gb;
        }
        const qsa_gemv_member mb = qsa_gemv_pick(grp, b);
        const int n0 = (g * nc + warp % nc) * 16;
        /* the prologue: stages 0 .. stages - 2 in flight (the weights before the PDL wait: no kernel
           writes them) */
        for (int i = 0; i < stages - 1 && i < ni; i++)
            qsa_deep_copy(mb.W, n0, mb.N, A, M, K, i, h, kh, nw, s0 + i * S, true, false);
        if (!waited) QSA_PDL_ENTRY();
        waited = true;
        for (int i = 0; i < stages - 1; i++) {
            if (i < ni) qsa_deep_copy(mb.W, n0, mb.N, A, M, K, i, h, kh, nw, s0 + i * S, false, true);
            asm volatile("cp.async.commit_group;" ::: "memory"); /* (possibly empty: one group per stage) */
        }
        float P[16], T[16];
#pragma unroll
        for (int e = 0; e < 16; e++) P[e] = T[e] = 0.0f;
        for (int i = 0; i < ni; i++) {
            qsa_cp_wait_n(stages - 2); /* stage i's copies (this thread's) have landed */
            __syncthreads();           /* ... every thread's; and stage i - 1's buffer is free */
            if (i + stages - 1 < ni)
                qsa_deep_copy(mb.W, n0, mb.N, A, M, K, i + stages - 1, h, kh, nw, s0 + ((i + stages - 1) % stages) * S,
                              true, true);
            asm volatile("cp.async.commit_group;" ::: "memory");
            if (kh == 2 && !h && i && !(i & 3) && qsa_deep_q(i - 4, 1, 2) < nq) qsa_deep_take(T, xh); /* the odd segment before */
            const int q = qsa_deep_q(i, h, kh);
            const qsa_u32 so = s0 + (i % stages) * S;
#pragma unroll
            for (int c = 0; c < QSA_DEEP_K / 16; c++) {
                if (q * QSA_DEEP_K + 16 * c >= K) break;
                qsa_u32 fw[4], fx[4];
                qsa_ldsm4(so + wa + 32 * c, fw);
                qsa_ldsm4(so + xa + 32 * c, fx);
                qsa_mma16816(P, fw, fx[0], fx[1]);
                if (mg > 1) qsa_mma16816(P + 4, fw, fx[2], fx[3]);
                if (mg > 2) {
                    qsa_ldsm4(so + xa + 16 * QSA_DEEP_LD * 2 + 32 * c, fx);
                    qsa_mma16816(P + 8, fw, fx[0], fx[1]);
                    if (mg > 3) qsa_mma16816(P + 12, fw, fx[2], fx[3]);
                }
            }
            if ((i & 3) == 3 || i + 1 == ni) { /* a segment's end: T += P_s (the odd half: hand P_s over), P = 0 */
                if (!h) {
#pragma unroll
                    for (int e = 0; e < 16; e++) T[e] = T[e] + P[e];
                } else if (qsa_deep_q(i & ~3, 1, 2) < nq) { /* (an odd segment past K: none) */
#pragma unroll
                    for (int e = 0; e < 16; e++) xh[32 * e] = P[e];
                }
#pragma unroll
                for (int e = 0; e < 16; e++) P[e] = 0.0f;
            }
        }
        if (kh == 2) {
            __syncthreads(); /* the last odd segment's P_s */
            if (!h && qsa_deep_q(ni - 4, 1, 2) < nq) qsa_deep_take(T, xh);
        }
        /* T[4 j + 2 r + e]: W row n0 + g8 + 8 r, A row 8 j + 2 t4 + e */
#pragma unroll
        for (int r = 0; r < 2; r++) {
            const int n = n0 + g8 + 8 * r;
            if (h || n >= mb.N) continue;
            const float bias = mb.bias ? mb.bias[n] : 0.0f;
#pragma unroll
            for (int j = 0; j < 4; j++)
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    const int m = 8 * j + 2 * t4 + e;
                    if (m < M) mb.Y[(qsa_i64)m * mb.N + n] = mb.bias ? T[4 * j + 2 * r + e] + bias : T[4 * j + 2 * r + e];
                }
        }
        __syncthreads(); /* every warp is done with the ring before the next group's prologue refills it */
    }
}
#endif
#if QSA_IN_PART(5)
extern "C" __global__ void __launch_bounds__(256) qsa_k_gemv_deep(const qsa_f16 *__restrict__ A,
                                                                                 qsa_gemv_group grp, int M, int K,
                                                                                 int stages, int kh) {
    QSA_PDL_LATE();
#if QSA_CPA
    if (kh == 2) qsa_gemv_deep<2>(A, grp, M, K, stages);
    else if (kh == 1) qsa_gemv_deep<1>(A, grp, M, K, stages);
    else __trap(); /* the host checks kh */
#else
    (void)A, (void)grp, (void)M, (void)K, (void)stages, (void)kh;
    __trap(); /* (sm_80+ only: cp.async) */
#endif
}
#endif

/* ============================================================================================== */
/* MoE                                                                                             */
/* ============================================================================================== */

/* Per-expert weights, addressed through a device array [E] (host mirror: qsa__dexpert in
   parts/cuda.h, 88 bytes).  A matrix is dense fp16 when its *16 pointer is set, else NVFP4. */
struct qsa_expert_w {
    const qsa_u8 *gate_q, *gate_s, *up_q, *up_s, *down_q, *down_s; /* NVFP4 [I][H/2], [I][H/16], ...   */
    const qsa_f16 *gate16, *up16, *down16;                        /* dense [I][H], [I][H], [H][I]     */
    float gate_s2, up_s2, down_s2, pad;
};
/* Matrix m of an expert (0 gate, 1 up, 2 down; K its row length) as a weight source. */
static __device__ __forceinline__ qsa_wsrc qsa_expert_ws(const qsa_expert_w &ex, int m, int K) {
    if (m == 0) return ex.gate16 ? qsa_wsrc_f16(ex.gate16) : qsa_wsrc_nvfp4(ex.gate_q, ex.gate_s, ex.gate_s2, K);
    if (m == 1) return ex.up16 ? qsa_wsrc_f16(ex.up16) : qsa_wsrc_nvfp4(ex.up_q, ex.up_s, ex.up_s2, K);
    return ex.down16 ? qsa_wsrc_f16(ex.down16) : qsa_wsrc_nvfp4(ex.down_q, ex.down_s, ex.down_s2, K);
}

/* Router: for token t, p = softmax(logits[t][0..E)) in fp32 (max, then e = expf(l - max), sum, e / sum:
 * the CPU's formulas; the max and the sum are fixed-order block reductions), the K largest p
 * (ties: lower expert id, as the CPU's repeated arg-max; NaN never selected: a round without a
 * candidate gives id 0 and weight -inf, as the CPU's), optionally divided by their sum (summed in
 * selection order, as the CPU), written sorted by ascending expert id:
 *   topk_ids [M][K] int, topk_w [M][K] fp32.  1 <= K <= 64, K <= E.
 * The order "p larger, then id lower" is total over the non-NaN values, so the k-th selection is the
 * value with exactly k better ones: E <= 4 * blockDim.x with blockDim.x / 32 * K <= 512 keeps the
 * probabilities in registers and selects without a barrier per selection — each warp takes its own
 * K best by K rounds of a warp arg-max (its candidates: every value of the global top K is one), then
 * each candidate is ranked among all candidates, one thread per (candidate, warp list) counting
 * (its rank there is its global rank when that is < K, and >= K otherwise).  Other shapes take the
 * repeated block arg-max; the same selection and weights either way.  (Measured on the H200 at the
 * real shape, E = 512, K = 10, one token: ~12.5 us per launch when each value was ranked among its
 * warp's 64 by shuffles and each of the 80 candidates against all 80 by one thread; batch 1 +1.7%
 * with this.)  The entry point's last parameter (qsa_router_extra, below) adds the shared expert's
 * SwiGLU middle and the expert plan to the launch.  On sm_80+ a round's warp arg-max is two integer
 * reductions (redux.sync) instead of 5 shuffle steps; the probabilities stay the values e of the sum.
 * Launch: grid (M), block 256. */
#define QSA_ROUTER_REG 4    /* probabilities per thread kept in registers: E <= 4 * blockDim.x (1,024 at 256) */
#define QSA_ROUTER_CAND 512 /* candidates of the rank selection: blockDim.x / 32 * K at most */
/* The body's shared memory (a struct, so that a kernel may place it in memory it uses otherwise later) */
struct qsa_router_ws {
    float scratch[33], sv[33];
    int si[33], sel[64];
    float selw[64], cv[QSA_ROUTER_CAND];
    int ci[QSA_ROUTER_CAND], crank[QSA_ROUTER_CAND];
};
/* One token's row l of E logits -> its K ids and weights in ascending id order at ids[0..K) and
 * w[0..K) (global or shared memory), by the whole block of 256 threads (every thread calls it).  The
 * sum: thread x sums experts x + 256 r in ascending r, then qsa_block_sum's order (the butterfly of each
 * 32-thread group, and of the 8 group sums in group order).  The max and the selection are exact, so
 * any order gives their bits. */
static __device__ void qsa_router_body(const float *__restrict__ l, int E, int K, int norm, int *ids, float *w,
                                       qsa_router_ws &ws) {
    float *const scratch = ws.scratch, *const sv = ws.sv, *const selw = ws.selw, *const cv = ws.cv;
    int *const si = ws.si, *const sel = ws.sel, *const ci = ws.ci, *const crank = ws.crank;
    if (blockDim.x != 256) __trap();
    if (K < 1 || K > 64 || K > E) { /* unsupported: ids 0 and NaN weights, never out of bounds */
        for (int k = threadIdx.x; k < K; k += blockDim.x) {
            ids[k] = 0;
            w[k] = QSA_QNAN;
        }
        return;
    }
    const int warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5, bd = blockDim.x;
    float mx = QSA_NEG_INF;
    for (int e = threadIdx.x; e < E; e += bd) mx = fmaxf(mx, l[e]);
    mx = qsa_block_max(mx, scratch);
    /* the register form keeps each e = expf(l - max) for its probability (value r at expert x + r bd) */
    const bool inreg = E <= QSA_ROUTER_REG * bd && nwarps * K <= QSA_ROUTER_CAND;
    float p[QSA_ROUTER_REG];
    float s = 0.0f; /* thread x sums experts x + 256 r in ascending r */
    if (inreg) {
#pragma unroll
        for (int r = 0; r < QSA_ROUTER_REG; r++) {
            const int e = threadIdx.x + r * bd;
            p[r] = e < E ? expf(l[e] - mx) : 0.0f;
        }
#pragma unroll
        for (int r = 0; r < QSA_ROUTER_REG; r++)
            if (threadIdx.x + r * bd < E) s += p[r];
    } else {
        for (int e = threadIdx.x; e < E; e += bd) s += expf(l[e] - mx);
    }
    const float sum = qsa_block_sum(s, scratch);
    for (int k = threadIdx.x; k < K; k += bd) { /* what a round without a candidate gives */
        sel[k] = 0;
        selw[k] = QSA_NEG_INF;
    }
    if (inreg) {
        const int R = (E + bd - 1) / bd; /* registers in use (uniform) */
#pragma unroll
        for (int r = 0; r < QSA_ROUTER_REG; r++) { /* past E: NaN, never better, never a candidate */
            const int e = threadIdx.x + r * bd;
            p[r] = e < E ? p[r] / sum : QSA_QNAN;
        }
        for (int c = threadIdx.x; c < nwarps * K; c += bd) {
            cv[c] = QSA_QNAN;
            crank[c] = 0;
        }
        __syncthreads();
        /* each warp's K best values in order (its candidates: every value of the global top K is one),
           by K rounds of a warp arg-max over its values (lane j's register r holds expert 32 warp + j +
           r bd); a round's winner leaves by becoming NaN in its lane */
        for (int k = 0; k < K; k++) {
            float bv = QSA_NEG_INF;
            int bi = 0x7fffffff;
#pragma unroll
            for (int r = 0; r < QSA_ROUTER_REG; r++)
                if (r < R && qsa_better(p[r], (int)threadIdx.x + r * bd, bv, bi)) {
                    bv = p[r];
                    bi = (int)threadIdx.x + r * bd;
                }
#if __CUDA_ARCH__ >= 800
            /* the warp's best by two integer reductions: the largest key (a probability is >= 0 or NaN,
               so its bits order as unsigned; + 1 keeps +0 above a lane without a value), then the lowest
               index among the lanes that hold it */
            const qsa_u32 key = bi == 0x7fffffff ? 0u : __float_as_uint(bv) + 1u;
            qsa_u32 mk, mi;
            asm volatile("redux.sync.max.u32 %0, %1, 0xffffffff;" : "=r"(mk) : "r"(key));
            asm volatile("redux.sync.min.u32 %0, %1, 0xffffffff;" : "=r"(mi) : "r"(key == mk ? (qsa_u32)bi : 0x7fffffffu));
            if (mk == 0u) break; /* (warp-uniform) no number left */
            if ((qsa_u32)bi == mi) { /* the winner's lane */
                cv[warp * K + k] = bv;
                ci[warp * K + k] = bi;
            }
            bi = (int)mi;
#else
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) {
                const float ov = __shfl_xor_sync(QSA_FULL_MASK, bv, o);
                const int oi = __shfl_xor_sync(QSA_FULL_MASK, bi, o);
                if (qsa_better(ov, oi, bv, bi)) {
                    bv = ov;
                    bi = oi;
                }
            }
            if (bi == 0x7fffffff) break; /* (warp-uniform) no number left */
            if ((threadIdx.x & 31) == 0) {
                cv[warp * K + k] = bv;
                ci[warp * K + k] = bi;
            }
#endif
#pragma unroll
            for (int r = 0; r < QSA_ROUTER_REG; r++)
                if ((int)threadIdx.x + r * bd == bi) p[r] = QSA_QNAN;
        }
        __syncthreads();
        /* each candidate's rank among all candidates (its k-th selection has rank k): thread pairs
           (candidate, warp list) count the list's better entries into it (integer sums: any order) */
        for (int t = threadIdx.x; t < nwarps * K * nwarps; t += bd) {
            const int c = t / nwarps, w = t - c * nwarps;
            const float x = cv[c];
            if (x != x) continue;
            const int ix = ci[c];
            int rk = 0;
            for (int d = w * K; d < w * K + K; d++) rk += qsa_better(cv[d], ci[d], x, ix);
            if (rk) atomicAdd(&crank[c], rk);
        }
        __syncthreads();
        for (int c = threadIdx.x; c < nwarps * K; c += bd)
            if (cv[c] == cv[c] && crank[c] < K) {
                sel[crank[c]] = ci[c];
                selw[crank[c]] = cv[c];
            }
        __syncthreads(); /* sel / selw complete */
    } else {
        for (int k = 0; k < K; k++) {
            float bv = QSA_NEG_INF;
            int bi = 0x7fffffff;
            for (int e = threadIdx.x; e < E; e += bd) {
                int used = 0;
                for (int j = 0; j < k; j++) used |= sel[j] == e;
                float pe = expf(l[e] - mx) / sum;
                if (!used && qsa_better(pe, e, bv, bi)) { bv = pe; bi = e; }
            }
            qsa_block_argmax(&bv, &bi, sv, si);
            if (threadIdx.x == 0) {
                sel[k] = bi == 0x7fffffff ? 0 : bi;
                selw[k] = bv;
            }
            __syncthreads();
        }
    }
    /* thread k writes selection k: its weight (over the sum in selection order), at its place in
       the ascending-id order (equal ids — the rounds without a candidate — keep selection order) */
    if ((int)threadIdx.x < K) {
        const int k = threadIdx.x, id = sel[k];
        float wk = selw[k];
        if (norm) {
            float s = 0.0f;
            for (int j = 0; j < K; j++) s += selw[j];
            wk /= s;
        }
        int pos = 0;
        for (int j = 0; j < K; j++) pos += sel[j] < id || (sel[j] == id && j < k);
        ids[pos] = id;
        w[pos] = wk;
    }
}

/* What the router's launch does besides the top-k (decode: three launches in one).
 *   sa != NULL: the shared expert's SwiGLU middle of token t, sa16[t][i] = fp16(act(sa[t][i]) *
 *     sb[t][i]) for i < Is (act 0: silu, 1: sigmoid; the CPU's `act(gate) * up`);
 *   pairs != NULL: the expert plan of all gridDim.x * K pairs (qsa_k_moe_plan's, with tr and wcnt),
 *     made by the block that finishes last (an integer ticket in *ticket after a __threadfence;
 *     the block resets it to 0; a grid of one block needs no ticket): the plan is a function of
 *     topk_ids alone, whatever its block size, so the same pairs and tiles as the separate launch
 *     (tested).
 * The shared expert's inputs are loaded before the top-k and converted after it (decode: their
 * latency hides behind the selection's). */
#define QSA_ROUTER_SA 4 /* shared-expert values per thread loaded ahead: Is <= 4 * blockDim.x */
typedef struct {
    const float *sa, *sb;
    qsa_f16 *sa16;
    int Is, act;
    int *pairs, *tiles, *ntiles, *wcnt;
    unsigned *ticket;
    int tr;
} qsa_router_extra;

#define QSA_PLAN_SMEM 4096 /* the plan's per-warp expert counts in shared memory up to this many ints */
/* Inclusive scans of a and b over the lanes of a warp (exact integers) */
static __device__ __forceinline__ void qsa_warp_scan2(int &a, int &b) {
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int d = 1; d < 32; d <<= 1) {
        const int x = __shfl_up_sync(QSA_FULL_MASK, a, d), y = __shfl_up_sync(QSA_FULL_MASK, b, d);
        if (lane >= d) {
            a += x;
            b += y;
        }
    }
}
static __device__ void qsa_moe_plan_body(const int *__restrict__ topk_ids, int MK, int E, int *__restrict__ pairs,
                                         int *__restrict__ tiles, int *__restrict__ ntiles, int tr,
                                         int *__restrict__ wcnt);

#if QSA_IN_PART(4)
extern "C" __global__ void qsa_k_router_topk(const float *__restrict__ logits, int *__restrict__ topk_ids,
                                             float *__restrict__ topk_w, int E, int K, int norm, qsa_router_extra x) {
    QSA_PDL_ENTRY();
    __shared__ unsigned last;
    __shared__ qsa_router_ws ws;
    const qsa_i64 o = (qsa_i64)blockIdx.x * x.Is;
    const bool ahead = x.sa && x.Is <= QSA_ROUTER_SA * (int)blockDim.x;
    float va[QSA_ROUTER_SA], vb[QSA_ROUTER_SA];
#pragma unroll
    for (int r = 0; r < QSA_ROUTER_SA; r++) {
        const int i = threadIdx.x + r * blockDim.x;
        va[r] = ahead && i < x.Is ? x.sa[o + i] : 0.0f;
        vb[r] = ahead && i < x.Is ? x.sb[o + i] : 0.0f;
    }
    qsa_router_body(logits + (qsa_i64)blockIdx.x * E, E, K, norm, topk_ids + (qsa_i64)blockIdx.x * K,
                    topk_w + (qsa_i64)blockIdx.x * K, ws);
    if (ahead) {
#pragma unroll
        for (int r = 0; r < QSA_ROUTER_SA; r++) {
            const int i = threadIdx.x + r * blockDim.x;
            if (i < x.Is) x.sa16[o + i] = qsa_f32_to_f16(qsa_act(x.act, va[r]) * vb[r]);
        }
    } else if (x.sa) {
        for (int i = threadIdx.x; i < x.Is; i += blockDim.x)
            x.sa16[o + i] = qsa_f32_to_f16(qsa_act(x.act, x.sa[o + i]) * x.sb[o + i]);
    }
    if (!x.pairs) return;
    if (gridDim.x == 1) {
        __syncthreads(); /* the block's own ids are visible to the block */
    } else {
        if (!qsa_block_ticket_last(x.ticket, gridDim.x, &last)) return; /* this block's ids released */
    }
    qsa_moe_plan_body(topk_ids, (int)gridDim.x * K, E, x.pairs, x.tiles, x.ntiles, x.tr, x.wcnt);
    if (threadIdx.x == 0) *x.ticket = 0u;
}
#endif

/* Groups the MK = M*K (token, slot) pairs by expert for the grouped expert GEMMs.
 *   pairs [MK]: pair indices p = t*K + k, grouped by ascending expert, ascending p within one;
 *   tiles [max_tiles][3]: (expert, first index into pairs, count <= tr), experts ascending;
 *   *ntiles: number of tiles.  tr: pairs per tile, 16 (qsa_k_moe_gate_up / _down) or 64 (the
 *   *64 kernels).  max_tiles = ceil(MK/tr) + min(E, MK) always suffices.
 *   wcnt: scratch of (blockDim.x / 32) * E ints (any contents).
 * A counting sort: warp w owns the pairs [w*S, (w+1)*S) (S = ceil(MK / warps)) and counts them per
 * expert (lanes with the same id found by a warp match, the group's lowest lane adds its size);
 * then per expert the warps' counts become base offsets (ascending warps after the exclusive scan
 * of the experts' totals), and each warp places its pairs again in ascending order (a lane's
 * rank among equal ids below it in its group).  The counts live in shared memory where the warps'
 * E-long rows fit QSA_PLAN_SMEM ints (else in wcnt), and each chunk of blockDim.x experts is scanned
 * by warp shuffles and one more scan of the warps' totals (two barriers; a Hillis-Steele scan took
 * 16).  The output is a function of topk_ids alone, no atomics.  Ids outside [0, E) are skipped (their pairs are never computed).  MK <= 32: warp 0
 * alone (qsa_moe_plan_small), the same output.
 * Launch: grid (1), block 1024 (any multiple of 32 up to 1024). */
#if QSA_IN_PART(3)
extern "C" __global__ void qsa_k_moe_plan(const int *__restrict__ topk_ids, int MK, int E, int *__restrict__ pairs,
                                          int *__restrict__ tiles, int *__restrict__ ntiles, int tr,
                                          int *__restrict__ wcnt) {
    QSA_PDL_ENTRY();
    qsa_moe_plan_body(topk_ids, MK, E, pairs, tiles, ntiles, tr, wcnt);
}
#endif
/* topk_ids are read through L2 (__ldcg): in the router's launch other blocks wrote them */
/* The plan of MK <= 32 pairs (decode of up to 3 tokens at K = 10) by warp 0 alone, in registers:
   pair i = lane i; its position is the number of valid pairs before it in (expert, index) order,
   an expert's first pair (the lowest lane of its match group) writes the expert's tiles after
   those of the lower experts.  The same pairs, tiles and count as the general plan (tested); the
   general one spends ~16 barriers and global-memory round trips on E-long scans. */
static __device__ void qsa_moe_plan_small(int id, int MK, int E, int *__restrict__ pairs, int *__restrict__ tiles,
                                          int *__restrict__ ntiles, int tr) {
    const int lane = threadIdx.x & 31; /* id: pair lane's expert (lanes < MK) */
    if (lane >= MK) id = -1;
    const int ok = id >= 0 && id < E;
    const qsa_u32 grp = __match_any_sync(QSA_FULL_MASK, ok ? id : -1);
    const int cnt = __popc(grp), lead = ok && (grp & ((1u << lane) - 1u)) == 0;
    const int nte = lead ? (cnt + tr - 1) / tr : 0; /* tiles of this lane's expert, on its leader */
    int pos = 0, toff = 0, total = 0;
    for (int j = 0; j < 32; j++) {
        const int idj = __shfl_sync(QSA_FULL_MASK, id, j), okj = __shfl_sync(QSA_FULL_MASK, ok, j),
                  ntj = __shfl_sync(QSA_FULL_MASK, nte, j);
        pos += okj && (idj < id || (idj == id && j < lane));
        toff += idj < id ? ntj : 0;
        total += ntj;
    }
    if (ok) pairs[pos] = lane;
    if (lead)
        for (int j = 0; j * tr < cnt; j++) {
            int *tt = tiles + 3 * (qsa_i64)(toff + j);
            tt[0] = id;
            tt[1] = pos + tr * j;
            tt[2] = min(tr, cnt - tr * j);
        }
    if (lane == 0) *ntiles = total;
}

/* A warp's step of the plan's pass 1 over 32 of its pairs (lane: expert id, or -1 past the warp's pairs): the
   expert counts of wc (lanes with the same id found by a warp match, the group's lowest lane adds its size) */
static __device__ __forceinline__ void qsa_plan_count(int id, int E, int *wc) {
    const int ok = id >= 0 && id < E;
    const qsa_u32 grp = __match_any_sync(QSA_FULL_MASK, ok ? id : -1), below = (1u << (threadIdx.x & 31)) - 1u;
    if (ok && (grp & below) == 0) wc[id] += __popc(grp);
    __syncwarp();
}
/* ... and of pass 2: pair i placed at its expert's next position (wc: the positions) */
static __device__ __forceinline__ void qsa_plan_place(int id, int i, int E, int *wc, int *__restrict__ pairs) {
    const int ok = id >= 0 && id < E;
    const qsa_u32 grp = __match_any_sync(QSA_FULL_MASK, ok ? id : -1), below = (1u << (threadIdx.x & 31)) - 1u;
    if (ok) pairs[wc[id] + __popc(grp & below)] = i;
    __syncwarp();
    if (ok && (grp & below) == 0) wc[id] += __popc(grp);
    __syncwarp();
}
#define QSA_PLAN_REG 4 /* a warp's first QSA_PLAN_REG x 32 pair ids, loaded at once and kept for both passes */
static __device__ void qsa_moe_plan_body(const int *__restrict__ topk_ids, int MK, int E, int *__restrict__ pairs,
                                         int *__restrict__ tiles, int *__restrict__ ntiles, int tr,
                                         int *__restrict__ wcnt) {
    if (MK <= 32) { /* (warp-uniform: the other warps have nothing to do) */
        if (threadIdx.x < 32)
            qsa_moe_plan_small(threadIdx.x < MK ? __ldcg(topk_ids + threadIdx.x) : -1, MK, E, pairs, tiles, ntiles, tr);
        return;
    }
    /* per-warp counts in shared memory where they fit (the real shapes: 8 warps x 512 experts), else in wcnt;
       the two running totals (pairs, tiles) of the expert chunks before, in registers */
    __shared__ int wsm[QSA_PLAN_SMEM];
    __shared__ int wtot[2][32][2]; /* per chunk parity: the warps' exclusive offsets (pairs, tiles) */
    __shared__ int wsum[2][2];    /* ... and the chunk's totals */
    const int tid = threadIdx.x, nt = blockDim.x, lane = tid & 31, warp = tid >> 5, nw = nt >> 5;
    const int S = (MK + nw - 1) / nw, sbeg = min(MK, warp * S), send = min(MK, sbeg + S);
    /* the ids in one round trip to L2 (the passes' loads one after the other took four at batch 32) */
    int rid[QSA_PLAN_REG];
#pragma unroll
    for (int r = 0; r < QSA_PLAN_REG; r++) {
        const int i = sbeg + 32 * r + lane;
        rid[r] = i < send ? __ldcg(topk_ids + i) : -1;
    }
    int *const wcb = nw * E <= QSA_PLAN_SMEM ? wsm : wcnt;
    int *wc = wcb + (qsa_i64)warp * E;
    for (int e = lane; e < E; e += 32) wc[e] = 0;
    __syncwarp();
#pragma unroll
    for (int r = 0; r < QSA_PLAN_REG; r++) /* pass 1: this warp's counts */
        if (sbeg + 32 * r < send) qsa_plan_count(rid[r], E, wc);
    for (int i0 = sbeg + 32 * QSA_PLAN_REG; i0 < send; i0 += 32) {
        const int i = i0 + lane;
        qsa_plan_count(i < send ? __ldcg(topk_ids + i) : -1, E, wc);
    }
    __syncthreads();
    int carry0 = 0, carry1 = 0;
    for (int e0 = 0, c = 0; e0 < E; e0 += nt, c ^= 1) {
        const int e = e0 + tid;
        int cnt = 0;
        if (e < E)
            for (int w = 0; w < nw; w++) cnt += wcb[(qsa_i64)w * E + e];
        const int tc = (cnt + tr - 1) / tr;
        /* inclusive scans (exact integers) of the counts and the tile counts: within the warp, then over
           the warps' totals by warp 0 (the buffer of this chunk's parity: the chunk before last was read
           before the barrier that every thread passed to get here) */
        int a = cnt, b = tc;
        qsa_warp_scan2(a, b);
        if (lane == 31) {
            wtot[c][warp][0] = a;
            wtot[c][warp][1] = b;
        }
        __syncthreads();
        if (warp == 0) {
            const int x0 = lane < nw ? wtot[c][lane][0] : 0, y0 = lane < nw ? wtot[c][lane][1] : 0;
            int x = x0, y = y0;
            qsa_warp_scan2(x, y);
            if (lane < nw) {
                wtot[c][lane][0] = x - x0;
                wtot[c][lane][1] = y - y0;
            }
            if (lane == 31) { /* the chunk's totals (lane 31's inclusive sums: every warp's) */
                wsum[c][0] = x;
                wsum[c][1] = y;
            }
        }
        __syncthreads();
        const int off = carry0 + wtot[c][warp][0] + a - cnt, toff = carry1 + wtot[c][warp][1] + b - tc;
        carry0 += wsum[c][0];
        carry1 += wsum[c][1];
        if (e < E) {
            int base = off; /* the warps' counts become their first positions */
            for (int w = 0; w < nw; w++) {
                const int cw = wcb[(qsa_i64)w * E + e];
                wcb[(qsa_i64)w * E + e] = base;
                base += cw;
            }
            for (int j = 0; j * tr < cnt; j++) {
                int *tt = tiles + 3 * (qsa_i64)(toff + j);
                tt[0] = e;
                tt[1] = off + tr * j;
                tt[2] = min(tr, cnt - tr * j);
            }
        }
    }
    __syncthreads();
#pragma unroll
    for (int r = 0; r < QSA_PLAN_REG; r++) /* pass 2: place this warp's pairs */
        if (sbeg + 32 * r < send) qsa_plan_place(rid[r], sbeg + 32 * r + lane, E, wc, pairs);
    for (int i0 = sbeg + 32 * QSA_PLAN_REG; i0 < send; i0 += 32) {
        const int i = i0 + lane;
        qsa_plan_place(i < send ? __ldcg(topk_ids + i) : -1, i, E, wc, pairs);
    }
    if (tid == 0) *ntiles = carry1;
}

/* Routed experts, first half: for each pair p = t*K + k with expert e = topk_ids[p]:
 *   h16[p][i] = fp16( act(gate_e x_t)[i] * (up_e x_t)[i] )      x16 fp16 [M][H], h16 fp16 [M*K][I]
 * (act 0: silu, 1: sigmoid).  Block (tile, n-tile): the <= 16 pairs of tile blockIdx.x (from
 * qsa_k_moe_plan; blocks past *ntiles exit) times 16 columns of I; gate and up in the canonical
 * GEMM order (split-K core), so a pair's bits do not depend on which pairs share its tile.
 * H, I multiples of 16.  Launch: grid (max_tiles, ceil(I/16)), block 256. */
#if QSA_IN_PART(0)
extern "C" __global__ void __launch_bounds__(256) qsa_k_moe_gate_up(
    const qsa_f16 *__restrict__ x16, const int *__restrict__ pairs, const int *__restrict__ tiles,
    const int *__restrict__ ntiles, const qsa_expert_w *__restrict__ experts, qsa_f16 *__restrict__ h16, int H, int I,
    int K, int act) {
    QSA_PDL_ENTRY();
    __shared__ __align__(128) unsigned char smem[QSA_GEMM_SMEM];
    __shared__ const qsa_f16 *arow[16];
    __shared__ int prow[16];
    if (blockDim.x != QSA_GEMM_THREADS) __trap();
    if ((int)blockIdx.x >= *ntiles) return; /* the whole block leaves */
    const int *tt = tiles + 3 * (qsa_i64)blockIdx.x;
    const int e = tt[0], first = tt[1], cnt = tt[2], n0 = blockIdx.y * 16;
    if (threadIdx.x < 16) {
        int p = (int)threadIdx.x < cnt ? pairs[first + threadIdx.x] : -1;
        prow[threadIdx.x] = p;
        arow[threadIdx.x] = p >= 0 ? x16 + (qsa_i64)(p / K) * H : 0;
    }
    __syncthreads();
    const int r = threadIdx.x >> 4, n = n0 + (threadIdx.x & 15);
    if (H <= 0 || (H & 15)) { /* unsupported shape: poison rather than compute garbage */
        if (r < cnt && n < I) h16[(qsa_i64)prow[r] * I + n] = qsa_f32_to_f16(QSA_QNAN);
        return;
    }
    const qsa_expert_w &ex = experts[e];
    qsa_wsrc ws[2];
    ws[0] = ex.gate16 ? qsa_wsrc_f16(ex.gate16) : qsa_wsrc_nvfp4(ex.gate_q, ex.gate_s, ex.gate_s2, H);
    ws[1] = ex.up16 ? qsa_wsrc_f16(ex.up16) : qsa_wsrc_nvfp4(ex.up_q, ex.up_s, ex.up_s2, H);
    const int avec = (((qsa_u64)x16) & 15u) == 0 && (H & 7) == 0;
    float T[2];
    if (!ws[0].w16 && !ws[1].w16) qsa_tile16_splitk<2, true>(arow, avec, ws, n0, I, H, smem, T);
    else qsa_tile16_splitk<2, false>(arow, avec, ws, n0, I, H, smem, T); /* fp16 or mixed kinds: generic loads, same bits */
    if (r < cnt && n < I) h16[(qsa_i64)prow[r] * I + n] = qsa_f32_to_f16(qsa_act(act, T[0]) * T[1]);
}
#endif

/* Routed experts, second half: y[p][j] = (down_e h_p)[j]   h16 fp16 [M*K][I] -> y fp32 [M*K][H]
 * (same tiles as qsa_k_moe_gate_up; canonical GEMM order).  The per-token sum over the K experts is
 * qsa_k_moe_combine.  H, I multiples of 16.  Launch: grid (max_tiles, ceil(H/16)), block 256. */
#if QSA_IN_PART(3)
extern "C" __global__ void __launch_bounds__(256) qsa_k_moe_down(
    const qsa_f16 *__restrict__ h16, const int *__restrict__ pairs, const int *__restrict__ tiles,
    const int *__restrict__ ntiles, const qsa_expert_w *__restrict__ experts, float *__restrict__ y, int H, int I) {
    QSA_PDL_ENTRY();
    __shared__ __align__(128) unsigned char smem[QSA_GEMM_SMEM];
    __shared__ const qsa_f16 *arow[16];
    __shared__ int prow[16];
    if (blockDim.x != QSA_GEMM_THREADS) __trap();
    if ((int)blockIdx.x >= *ntiles) return;
    const int *tt = tiles + 3 * (qsa_i64)blockIdx.x;
    const int e = tt[0], first = tt[1], cnt = tt[2], n0 = blockIdx.y * 16;
    if (threadIdx.x < 16) {
        int p = (int)threadIdx.x < cnt ? pairs[first + threadIdx.x] : -1;
        prow[threadIdx.x] = p;
        arow[threadIdx.x] = p >= 0 ? h16 + (qsa_i64)p * I : 0;
    }
    __syncthreads();
    const int r = threadIdx.x >> 4, n = n0 + (threadIdx.x & 15);
    if (I <= 0 || (I & 15)) {
        if (r < cnt && n < H) y[(qsa_i64)prow[r] * H + n] = QSA_QNAN;
        return;
    }
    const qsa_expert_w &ex = experts[e];
    qsa_wsrc ws = ex.down16 ? qsa_wsrc_f16(ex.down16) : qsa_wsrc_nvfp4(ex.down_q, ex.down_s, ex.down_s2, I);
    const int avec = (((qsa_u64)h16) & 15u) == 0 && (I & 7) == 0;
    float T[1];
    if (ws.w16) qsa_tile16_splitk<1, false>(arow, avec, &ws, n0, H, I, smem, T);
    else qsa_tile16_splitk<1, true>(arow, avec, &ws, n0, H, I, smem, T);
    if (r < cnt && n < H) y[(qsa_i64)prow[r] * H + n] = T[0];
}
#endif

/* The end of a whole-form gate/up task (NB = 2) whose folded tile (matrix gate or up) is already in
   part: the tile's ticket; the second of its two warps forms fp16(act(gate) * up) of the tile's pairs
   from both (no addition: the bits of the fold) and resets the ticket.  prow: the pairs' rows. */
static __device__ __forceinline__ void qsa_moe_whole_gu_end(const float *part, unsigned *count, unsigned tile, int ncol,
                                                            int ct, int first, int cnt, const int *prow, int N, int act,
                                                            qsa_f16 *h16) {
    const int lane = threadIdx.x & 31, n0 = ct * 16;
    unsigned *tk = count + (qsa_i64)tile * ncol + ct;
    if (!qsa_ticket_last(tk, 2u)) return;
    for (int i = lane; i < cnt * 16; i += 32) {
        const int n = n0 + (i & 15);
        if (n >= N) continue;
        const float *pp = part + ((qsa_i64)(first + (i >> 4)) * ncol + ct) * 2 * 16 + (i & 15);
        h16[(qsa_i64)prow[i >> 4] * N + n] = qsa_f32_to_f16(qsa_act(act, __ldcg(pp)) * __ldcg(pp + 16));
    }
    if (lane == 0) *tk = 0u;
}
/* The plan (qsa_moe_plan_small's output) of MK <= 32 pairs whose ids, all in [0, E), ascend with the
   pair index (lane i holds pair i's; one token's router output): pair i stays at place i, and a tile
   starts at each run of equal ids and every tr pairs into a run — from two ballots where the general
   one-warp plan runs 32 rounds of shuffles.  Warp 0 calls it. */
static __device__ void qsa_moe_plan_sorted(int id, int MK, int *pairs, int *tiles, int *ntiles, int tr) {
    const int lane = threadIdx.x & 31;
    const bool in = lane < MK;
    const int prev = __shfl_up_sync(QSA_FULL_MASK, id, 1);
    const qsa_u32 runs = __ballot_sync(QSA_FULL_MASK, in && (lane == 0 || prev != id)); /* run starts */
    const qsa_u32 upto = lane == 31 ? QSA_FULL_MASK : (2u << lane) - 1u;             /* lanes <= this one */
    const int rs = 31 - __clz(runs & upto), after = __ffs(runs & ~upto);           /* (runs has lane 0) */
    const int rend = after ? after - 1 : MK;                                       /* this run's end */
    const bool ts = in && (lane - rs) % tr == 0;
    const qsa_u32 tsm = __ballot_sync(QSA_FULL_MASK, ts);
    if (in) pairs[lane] = lane;
    if (ts) {
        int *tt = tiles + 3 * __popc(tsm & ((1u << lane) - 1u));
        tt[0] = id;
        tt[1] = lane;
        tt[2] = min(tr, rend - lane);
    }
    if (lane == 0) *ntiles = __popc(tsm);
}
/* The largest (MAX) or the smallest of a warp's unsigned values (every lane gets it) */
template <bool MAX>
static __device__ __forceinline__ qsa_u32 qsa_warp_uext(qsa_u32 v) {
#if __CUDA_ARCH__ >= 800
    qsa_u32 r;
    if (MAX) asm volatile("redux.sync.max.u32 %0, %1, 0xffffffff;" : "=r"(r) : "r"(v));
    else asm volatile("redux.sync.min.u32 %0, %1, 0xffffffff;" : "=r"(r) : "r"(v));
    return r;
#else
    for (int o = 16; o > 0; o >>= 1) {
        const qsa_u32 x = __shfl_xor_sync(QSA_FULL_MASK, v, o);
        v = MAX ? max(v, x) : min(v, x);
    }
    return v;
#endif
}
/* One token's router by one warp: qsa_router_body's selection and bits for E <= QSA_ROUTE1_E logits
 * (lane j holds experts j + 32 r, r < 16, in registers) and K <= 32, with no barrier and no shared
 * scratch.  The max and the selection are exact; the sum keeps the 256-thread block's order (lane j
 * forms the sums of that block's threads j + 32 w, w < 8, over experts j + 32 w and j + 32 w + 256,
 * then the eight 32-thread butterflies and the butterfly of their eight sums).  Each of the K rounds
 * takes the best probability (ties: lower id) by an in-lane tree and two warp reductions of its key
 * (bits + 1: a probability is >= 0 or NaN, NaN key 0: never taken; a round without a key gives id 0
 * and weight -inf, as qsa_router_body), lane k keeps round k's id and weight, and the weights' sum
 * (norm) runs in selection order as the rounds go.  ids[0..K), w[0..K) in ascending id order (equal
 * ids, the rounds without a candidate, in selection order); warp-level, every lane calls it. */
#define QSA_ROUTE1_E 512
static __device__ void qsa_router_warp(const float *__restrict__ l, int E, int K, int norm, int *ids, float *w) {
    const int lane = threadIdx.x & 31;
    float p[16];
    float mx = QSA_NEG_INF;
#pragma unroll
    for (int r = 0; r < 16; r++) {
        p[r] = lane + 32 * r < E ? l[lane + 32 * r] : QSA_NEG_INF;
        mx = fmaxf(mx, p[r]);
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(QSA_FULL_MASK, mx, o));
#pragma unroll
    for (int r = 0; r < 16; r++) p[r] = lane + 32 * r < E ? expf(p[r] - mx) : 0.0f;
    float t[8];
#pragma unroll
    for (int g = 0; g < 8; g++) { /* thread lane + 32 g of 256: experts lane + 32 g and lane + 32 g + 256 */
        float s = 0.0f;
        if (lane + 32 * g < E) s += p[g];
        if (lane + 32 * g + 256 < E) s += p[g + 8];
        t[g] = qsa_warp_sum(s);
    }
    float u = 0.0f;
#pragma unroll
    for (int g = 0; g < 8; g++)
        if (lane == g) u = t[g];
    const float sum = qsa_warp_sum(u);
    qsa_u32 key[16];
#pragma unroll
    for (int r = 0; r < 16; r++) {
        const float q = lane + 32 * r < E ? p[r] / sum : QSA_QNAN;
        key[r] = q == q ? __float_as_uint(q) + 1u : 0u;
    }
    int sid = 0;
    float sw = QSA_NEG_INF, ns = 0.0f;
    for (int k = 0; k < K; k++) {
        /* the lane's best: the largest key, the lower r among equals (a tree of pairs, left wins ties) */
        qsa_u32 bk[8];
        int br[8];
#pragma unroll
        for (int r = 0; r < 8; r++) {
            const bool right = key[2 * r + 1] > key[2 * r];
            bk[r] = right ? key[2 * r + 1] : key[2 * r];
            br[r] = right ? 2 * r + 1 : 2 * r;
        }
#pragma unroll
        for (int h = 4; h > 0; h >>= 1)
#pragma unroll
            for (int r = 0; r < h; r++) {
                const bool right = bk[r + h] > bk[r];
                bk[r] = right ? bk[r + h] : bk[r];
                br[r] = right ? br[r + h] : br[r];
            }
        const qsa_u32 mk = qsa_warp_uext<true>(bk[0]);
        const int eb = lane + 32 * br[0];
        const qsa_u32 mi = qsa_warp_uext<false>(bk[0] == mk ? (qsa_u32)eb : 0x7fffffffu);
        const float v = mk ? __uint_as_float(mk - 1u) : QSA_NEG_INF;
        if (lane == k) {
            sid = mk ? (int)mi : 0;
            sw = v;
        }
        ns += v;
        const int taken = mk && (qsa_u32)eb == mi ? br[0] : -1; /* the winner's lane leaves its key */
#pragma unroll
        for (int r = 0; r < 16; r++) key[r] = r == taken ? 0u : key[r];
    }
    int pos = 0;
    for (int j = 0; j < K; j++) {
        const int o = __shfl_sync(QSA_FULL_MASK, sid, j);
        pos += o < sid || (o == sid && j < lane);
    }
    if (lane < K) {
        ids[pos] = sid;
        w[pos] = norm ? sw / ns : sw;
    }
}
struct qsa_route1 {
    const float *logits; /* [E] */
    int E, K, norm;
    int *topk_ids;       /* [K] (block 0) */
    float *topk_w;       /* [K] (block 0) */
    int *pairs, *tiles, *ntiles; /* the plan (block 0) */
    const float *sa, *sb;        /* the shared expert's gate and up rows [Is] (sa NULL: no shared expert) */
    qsa_f16 *sa16;
    int Is, act;
};
/* The router of one token inside the gate/up launch that follows it (decode of one token: no launch of
 * its own).  Warp 0 of every block runs qsa_router_warp on the token's logits (the bits of the router's
 * launch) and qsa_moe_plan_sorted on its ids (ascending: the plan of the router's launch), into shared
 * memory that the block's tasks then read as their plan, while the block's other warps write the
 * shared expert's SwiGLU middle (the router's qsa_router_extra sa16; all blocks' together); block 0
 * also writes the ids, the weights and the plan where the router's launch would have (the down
 * projection and the combine read them).  K <= 32 pairs, tiles of 16.  (Measured on the H200 against
 * every warp of every block running qsa_router_body: see docs/PERFORMANCE-LOG.md.) */
static __device__ void qsa_route1_block(const qsa_route1 &rt, const int *&pairs, const int *&tiles, const int *&ntiles) {
    __shared__ int rid[32], rplan[32 + 3 * 32 + 1]; /* ids; the plan: pairs [32], tiles [32][3], count */
    __shared__ float rw[32];
    const int tid = threadIdx.x, bd = blockDim.x, warp = tid >> 5, lane = tid & 31;
    if (rt.K < 1 || rt.K > 32 || rt.K > rt.E || rt.E > QSA_ROUTE1_E || bd < 64) __trap(); /* the host checks them */
    if (warp == 0) {
        qsa_router_warp(rt.logits, rt.E, rt.K, rt.norm, rid, rw);
        __syncwarp();
        qsa_moe_plan_sorted(lane < rt.K ? rid[lane] : 0, rt.K, rplan, rplan + 32, rplan + 128, 16);
    } else if (rt.sa) {
        const int n = bd - 32;
        for (int i = (int)blockIdx.x * n + tid - 32; i < rt.Is; i += (int)gridDim.x * n)
            rt.sa16[i] = qsa_f32_to_f16(qsa_act(rt.act, rt.sa[i]) * rt.sb[i]);
    }
    __syncthreads(); /* rid, rw and the plan complete */
    if (blockIdx.x == 0) {
        const int nt = rplan[128];
        for (int i = tid; i < rt.K; i += bd) {
            rt.topk_ids[i] = rid[i];
            rt.topk_w[i] = rw[i];
            rt.pairs[i] = rplan[i];
        }
        for (int i = tid; i < 3 * nt; i += bd) rt.tiles[i] = rplan[32 + i];
        if (tid == 0) *rt.ntiles = nt;
    }
    pairs = rplan;
    tiles = rplan + 32;
    ntiles = rplan + 128;
}

/* The same two GEMMs for decode-sized steps (16-pair tiles, a pair or two per expert), spread over
 * warps like qsa_k_gemv_*: a warp computes one matrix (gate_up: 0 gate, 1 up; down: NB = 1) of one
 * 16 x 16 tile (pair tile, column tile ct) over one K segment (split forms, qsa_k_moe_*_xw with
 * nrange >= nseg: task i = (tile, ct, matrix mat, segment)), over a range of them (ranged forms, the
 * same entry points with nrange < nseg: task i = (tile, ct, mat, range), range r the segments
 * r nseg / nrange .. (r + 1) nseg / nrange - 1, for steps too small to fill the GPU with whole
 * tiles: the warp copies a segment's weights while it works on the one before, and stores each
 * segment's partial like the split forms) or over all of them folded in registers (whole forms,
 * qsa_k_moe_*_xwk: task i = (tile, ct, mat), for steps whose tiles alone fill the GPU: batches of
 * decode tokens), in the canonical order either way.  Each warp stores its partial tiles in part and
 * takes a ticket in count[tile * ncol + ct]; the warp that completes the (tile, ct) (NB * nu
 * arrivals, nu = nseg split, nrange ranged, 1 whole) adds each matrix's partials in ascending segment
 * order (the canonical order of the one-block kernels, hence the same bits, tested), applies the
 * epilogue and resets the ticket.  The whole down form (one matrix, nothing to combine) stores its
 * tile directly.  part (pair-indexed, so it needs no tile count): [MK][ncol][nsp][NB][16] fp32 (nsp =
 * nseg split and ranged, 1 whole); count [max_tiles * ncol], zero before, left zero.  Grid
 * ceil(max_tiles * ncol * NB * nu / QSA_GEMV_WARPS) (tasks past *ntiles exit), block 32 *
 * QSA_GEMV_WARPS; H, I multiples of 16. */
template <int NB, bool whole, bool route = false>
static __device__ void qsa_moe_xwarp(const qsa_f16 *X, int ldx, int rowdiv, const int *pairs, const int *tiles,
                                     const int *ntiles, const qsa_expert_w *experts, int N, int Kd, int act,
                                     qsa_f16 *h16, float *y, float *part, unsigned *count, int nrange = 1,
                                     const qsa_route1 *rt = 0) {
    /* per warp: A then W staging (dense: rows of QSA_ST), which then holds the partial tile (slot) */
    __shared__ __align__(128) qsa_f16 stage[QSA_GEMV_WARPS][2 * 16 * QSA_STW];
    __shared__ const qsa_f16 *arow[QSA_GEMV_WARPS][16];
    __shared__ int prow[QSA_GEMV_WARPS][16];
#if QSA_CPA
    /* whole and ranged forms: the pipelined segments' packed weights (qsa_segs16_nvf_pipe), two halves
       per warp */
    __shared__ __align__(16) qsa_u8 pk[QSA_GEMV_WARPS][2 * 16 * QSA_PKS];
#else
    qsa_u8 *pk[QSA_GEMV_WARPS] = {0};
#endif
    if (blockDim.x != 32 * QSA_GEMV_WARPS || nrange < 1) __trap();
#if QSA_CPA
    QSA_CT_CHECK(sizeof(stage[0]) >= QSA_NVD_SA); /* (the direct fold's staging) */
#endif
    if (route) qsa_route1_block(*rt, pairs, tiles, ntiles); /* the router's work and the plan in this block */
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int ncol = (N + 15) / 16, nseg = (Kd + QSA_SEG - 1) / QSA_SEG, nsp = whole ? 1 : nseg;
    const bool ranged = !whole && nrange < nseg;
    const int nu = ranged ? nrange : nsp, nst = NB * nu;
    const qsa_i64 task = (qsa_i64)blockIdx.x * QSA_GEMV_WARPS + warp;
    if (Kd <= 0 || task >= (qsa_i64)*ntiles * ncol * nst) return; /* warp-level from here on */
    /* (unsigned 32-bit divisions: a grid of tasks never reaches 2^32) */
    const unsigned per = (unsigned)(ncol * nst), tile = (unsigned)task / per, rem = (unsigned)task - tile * per;
    const int ct = (int)(rem / (unsigned)nst), mat = (int)(rem % (unsigned)nst / (unsigned)nu),
              unit = (int)(rem % (unsigned)nu), n0 = ct * 16;
    /* the task's segments: one (split), a range, or all (whole) */
    const int sb = ranged ? unit * nseg / nrange : whole ? 0 : unit;
    const int se = ranged ? (unit + 1) * nseg / nrange : sb + 1;
    const int *tt = tiles + 3 * (qsa_i64)tile;
    const int e = tt[0], first = tt[1], cnt = tt[2];
    if (lane < 16) {
        const int p = lane < cnt ? pairs[first + lane] : -1;
        prow[warp][lane] = p;
        arow[warp][lane] = p >= 0 ? X + (qsa_i64)(p / rowdiv) * ldx : 0;
    }
    __syncwarp();
    const qsa_wsrc ws = qsa_expert_ws(experts[e], NB == 1 ? 2 : mat, Kd);
    const int avec = (((qsa_u64)X) & 15u) == 0 && (ldx & 7) == 0;
    qsa_f16 *sa = stage[warp];
    float *slot = (float *)stage[warp];
    qsa_frag_c P;
    bool put = false; /* the tile already in slot */
    if (whole) { /* (dense experts, checkpoints with fp16 experts: one sub-step ahead, so that this path
                    does not set the register count of the NVFP4 one) */
        if (!ws.w16)
            put = qsa_segs16<true>(arow[warp], cnt, avec, ws, n0, N, Kd, nseg, sa, sa + 16 * QSA_STW, pk[warp], P, slot);
        else qsa_segs16<false>(arow[warp], cnt, avec, ws, n0, N, Kd, nseg, sa, sa + 16 * QSA_ST, 0, P, slot);
        __syncwarp(); /* every lane's fragment loads are done: the staging becomes the partial tile */
        if (!put) qsa_wmma_store(slot, P, 16);
        __syncwarp();
        if (NB == 1) { /* the whole down tile: nothing to wait for */
            for (int i = lane; i < cnt * 16; i += 32)
                if (n0 + (i & 15) < N) y[(qsa_i64)prow[warp][i >> 4] * N + n0 + (i & 15)] = slot[i];
            return;
        }
    } else {
        /* the tile's partials: pair r's segment s at pp0[r * ncol * nsp * NB * 16 + s * NB * 16] */
        float *pp0 = part + (((qsa_i64)first * ncol + ct) * nsp * NB + mat) * 16;
        int seg = sb;
#if QSA_CPA
        if (ranged && !ws.w16 && cnt <= 4 && qsa_nvf_ok(ws, avec, Kd)) { /* pipelined, one A row per lane */
            const qsa_f16 *a0 = arow[warp][lane >> 3];
            qsa_seg_range rg;
            rg.sb = sb;
            rg.se = se;
            rg.p = pp0;
            rg.pair = (qsa_i64)ncol * nsp * NB * 16;
            rg.seg = NB * 16;
            rg.cnt = cnt;
            qsa_segs16_nvd<true>(a0, a0 != 0, ws, n0, Kd, nseg, sa, pk[warp], P, slot, rg);
            seg = se;
        }
#endif
        for (; seg < se; seg++) { /* the split form's segment, or each of the range's in turn */
            if (!ws.w16 && qsa_nvf_ok(ws, avec, Kd))
                qsa_seg16_nvf<true>(arow[warp], cnt, ws, n0, N, Kd, seg, sa, sa + 16 * QSA_STW, P);
            else if (!ws.w16) qsa_seg16_nvw<true>(arow[warp], avec, ws, n0, N, Kd, seg, sa, sa + 16 * QSA_STW, P);
            else qsa_seg16<1, false, false, true>(arow[warp], avec, &ws, n0, N, Kd, seg, sa, sa + 16 * QSA_ST, &P);
            __syncwarp(); /* every lane's fragment loads are done: the staging becomes the partial tile */
            qsa_wmma_store(slot, P, 16);
            __syncwarp();
            for (int i = lane; i < cnt * 16; i += 32)
                pp0[(qsa_i64)(i >> 4) * ncol * nsp * NB * 16 + (qsa_i64)seg * NB * 16 + (i & 15)] = slot[i];
            __syncwarp(); /* the slot is read before the next segment stages into it */
        }
    }
    if (whole) { /* (NB = 2 here: the whole down tile was stored above) */
        for (int i = lane; i < cnt * 16; i += 32)
            part[(((qsa_i64)(first + (i >> 4)) * ncol + ct) * NB + mat) * 16 + (i & 15)] = slot[i];
        qsa_moe_whole_gu_end(part, count, tile, ncol, ct, first, cnt, prow[warp], N, act, h16);
        return;
    }
    unsigned *tk = count + (qsa_i64)tile * ncol + ct;
    if (!qsa_ticket_last(tk, (unsigned)nst)) return;
    if (cnt == 1) { /* one pair (decode): two lanes per element, gate and up (NB = 2) or
                       the two halves of the segments (qsa_sum_parts_pair) */
        const int e = lane & 15, n = n0 + e;
        const bool ok = n < N;
        const float *pp = part + (qsa_i64)first * ncol * nsp * NB * 16 + (qsa_i64)ct * nsp * NB * 16 + e;
        float T[NB];
        if (NB == 2) {
            const float t = ok ? qsa_sum_parts(pp + (lane >> 4) * 16, NB * 16, nseg) : 0.0f;
            T[0] = t;
            T[NB - 1] = __shfl_down_sync(QSA_FULL_MASK, t, 16);
        } else {
            T[0] = qsa_sum_parts_pair(pp, NB * 16, nseg, ok);
        }
        if (ok && lane < 16) {
            const qsa_i64 p = prow[warp][0];
            if (NB == 2) h16[p * N + n] = qsa_f32_to_f16(qsa_act(act, T[0]) * T[NB - 1]);
            else y[p * N + n] = T[0];
        }
        if (lane == 0) *tk = 0u;
        return;
    }
    for (int i = lane; i < cnt * 16; i += 32) {
        const int r = i >> 4, n = n0 + (i & 15);
        if (n >= N) continue;
        const float *pp = part + ((qsa_i64)(first + r) * ncol + ct) * nsp * NB * 16 + (i & 15);
        float T[NB];
#pragma unroll
        for (int b = 0; b < NB; b++) T[b] = qsa_sum_parts(pp + b * 16, NB * 16, nseg);
        const qsa_i64 p = prow[warp][r];
        if (NB == 2) h16[p * N + n] = qsa_f32_to_f16(qsa_act(act, T[0]) * T[NB - 1]);
        else y[p * N + n] = T[0];
    }
    if (lane == 0) *tk = 0u;
}
#if QSA_IN_PART(7)
extern "C" __global__ void __launch_bounds__(32 * QSA_GEMV_WARPS, 5) qsa_k_moe_gate_up_xw(
    const qsa_f16 *__restrict__ x16, const int *__restrict__ pairs, const int *__restrict__ tiles,
    const int *__restrict__ ntiles, const qsa_expert_w *__restrict__ experts, qsa_f16 *__restrict__ h16, int H, int I,
    int K, int act, float *part, unsigned *count, int nrange) {
    QSA_PDL_ENTRY();
    if ((H | I) & 15) __trap(); /* the host validates the shapes (I padded to 16) */
    qsa_moe_xwarp<2, false>(x16, H, K, pairs, tiles, ntiles, experts, I, H, act, h16, 0, part, count, nrange);
}
#endif
/* qsa_k_moe_gate_up_xw of one token with its router (qsa_route1_block): the plan arguments come from
   rt, which also names where the router's outputs go.  Grid as qsa_k_moe_gate_up_xw's for K tiles
   (blocks past the tasks route and exit), block 32 * QSA_GEMV_WARPS (128). */
#if QSA_IN_PART(7)
extern "C" __global__ void __launch_bounds__(32 * QSA_GEMV_WARPS, 5) qsa_k_moe_gate_up_xwr(
    const qsa_f16 *__restrict__ x16, const qsa_expert_w *__restrict__ experts, qsa_f16 *__restrict__ h16, int H, int I,
    int act, float *part, unsigned *count, int nrange, qsa_route1 rt) {
    QSA_PDL_ENTRY();
    if ((H | I) & 15) __trap();
    qsa_moe_xwarp<2, false, true>(x16, H, rt.K, 0, 0, 0, experts, I, H, act, h16, 0, part, count, nrange, &rt);
}
#endif
#if QSA_IN_PART(7)
extern "C" __global__ void __launch_bounds__(32 * QSA_GEMV_WARPS) qsa_k_moe_down_xw(
    const qsa_f16 *__restrict__ h16, const int *__restrict__ pairs, const int *__restrict__ tiles,
    const int *__restrict__ ntiles, const qsa_expert_w *__restrict__ experts, float *__restrict__ y, int H, int I,
    float *part, unsigned *count, int nrange) {
    QSA_PDL_ENTRY();
    if ((H | I) & 15) __trap();
    qsa_moe_xwarp<1, false>(h16, I, 1, pairs, tiles, ntiles, experts, H, I, 0, 0, y, part, count, nrange);
}
#endif
/* The whole-tile forms (own entry points: their segment loop sets their register count). */
#if QSA_IN_PART(5)
extern "C" __global__ void __launch_bounds__(32 * QSA_GEMV_WARPS, 5) qsa_k_moe_gate_up_xwk(
    const qsa_f16 *__restrict__ x16, const int *__restrict__ pairs, const int *__restrict__ tiles,
    const int *__restrict__ ntiles, const qsa_expert_w *__restrict__ experts, qsa_f16 *__restrict__ h16, int H, int I,
    int K, int act, float *part, unsigned *count) {
    QSA_PDL_ENTRY();
    if ((H | I) & 15) __trap();
    qsa_moe_xwarp<2, true>(x16, H, K, pairs, tiles, ntiles, experts, I, H, act, h16, 0, part, count);
}
#endif
#if QSA_IN_PART(6)
extern "C" __global__ void __launch_bounds__(32 * QSA_GEMV_WARPS) qsa_k_moe_down_xwk(
    const qsa_f16 *__restrict__ h16, const int *__restrict__ pairs, const int *__restrict__ tiles,
    const int *__restrict__ ntiles, const qsa_expert_w *__restrict__ experts, float *__restrict__ y, int H, int I) {
    QSA_PDL_ENTRY();
    if ((H | I) & 15) __trap();
    qsa_moe_xwarp<1, true>(h16, I, 1, pairs, tiles, ntiles, experts, H, I, 0, 0, y, 0, 0);
}
#endif

/* The whole forms for all-NVFP4 experts on sm_80+ (lean: qsa_k_moe_*_xwn), the host's choice for them
 * where H and I are multiples of 64: the same tasks (tile, column tile, matrix), the same partials and
 * tickets, the same bits (tested against the one-block kernels), but every tile through the direct
 * fold (qsa_segs16_nvd) in passes of 8 pairs (a pass's weights come again from L2) and none through the
 * staged one, so that a warp needs the direct fold's A staging (QSA_NVD_SA) and copy buffer only.
 * (Measured on the H200 against the whole forms, alternating, graphs, when they ran 6 blocks of 4 warps
 * with one matrix per fold: B=8 557 -> 589 tok/s, B=32 1085 -> 1113-1121, B=128 1469 -> 1512-1517, B=1
 * unchanged.)  A warp takes ctw (1, 2 or 4, dividing ncol NB) consecutive tasks of one tile, pass by
 * pass (the tile, its pairs and its expert looked up once); with ctw >= 2 a gate/up warp folds both
 * matrices of each column tile in one pass (qsa_segs16_nvd with NM = 2: both matrices' rows copied
 * per segment, the pairs' B fragments loaded once for the two; ~14% fewer instructions per weight,
 * two independent mma chains per warp) and forms fp16(act(gate) * up) from its registers (the ticket
 * end's expression on the same values: no partials, no ticket); a down warp folds two column tiles so.
 * Blocks of QSA_LEAN_WARPS warps (~14 KB of shared memory per warp: 8 blocks, 16 warps per SM, at most
 * 128 registers; measured on the H200, graphs: B=32 +2.9% for gate/up, +1.2% more for down).  Grid
 * ceil(max_tiles ncol NB / (QSA_LEAN_WARPS ctw)), otherwise arguments as qsa_k_moe_*_xwk; X, the
 * experts' q and s 16-byte aligned. */
#define QSA_LEAN_WARPS 2 /* warps per block of qsa_k_moe_gate_up_xwn and qsa_k_moe_down_xwn */
#if QSA_CPA
/* early (down only; the caller is QSA_PDL_LATE): the plan (ntiles, tiles, pairs) was written two or
   more launches back, so the warp looks up its tile, pairs and expert before the PDL wait and asks
   L2 for its first fold's weights (constant), and waits only before the first A row. */
template <int NB>
static __device__ void qsa_moe_lean(const qsa_f16 *X, int ldx, int rowdiv, const int *pairs, const int *tiles,
                                    const int *ntiles, const qsa_expert_w *experts, int N, int Kd, int act,
                                    qsa_f16 *h16, float *y, float *part, unsigned *count, int ctw, int early = 0) {
    enum { W = QSA_LEAN_WARPS };
    __shared__ __align__(128) qsa_f16 stage[W][QSA_NVD_SA / 2]; /* A rows, then the pass's tile */
    __shared__ __align__(16) qsa_u8 pk[W][2 * 2 * 16 * QSA_PKD]; /* (the two folds of a pass: 2 x 16 rows) */
    __shared__ int prow[W][16];
    const int ncol = N / 16, nseg = (Kd + QSA_SEG - 1) / QSA_SEG, per = ncol * NB;
    if (blockDim.x != 32 * W || (N & 15) || (Kd & 63) || (((qsa_u64)X) & 15u) || (ldx & 7) ||
        (ctw != 1 && ctw != 2 && ctw != 4) || (per & (ctw - 1)))
        __trap();
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    /* (32-bit: a 64-bit division is a long call, paid per warp) */
    const unsigned task0 = (blockIdx.x * W + warp) * (unsigned)ctw;
    if ((qsa_i64)task0 >= (qsa_i64)*ntiles * per) return; /* warp-level from here on */
    const unsigned tile = task0 / (unsigned)per;
    const int rem0 = (int)(task0 - tile * (unsigned)per);
    const int *tt = tiles + 3 * (qsa_i64)tile;
    const int e = tt[0], first = tt[1], cnt = tt[2];
    if (lane < 16) prow[warp][lane] = lane < cnt ? pairs[first + lane] : -1;
    __syncwarp();
    if (early) { /* (NB = 1: task rem0 + i is column tile rem0 + i) the first fold's rows: 16 per task, up to 2 tasks */
        const qsa_wsrc w0 = qsa_expert_ws(experts[e], 2, Kd);
        const int rows = 16 * (ctw < 2 ? ctw : 2), rq = Kd >> 1, rs = Kd >> 4;
        if (!w0.w16 && w0.q)
            for (int r = lane; r < rows; r += 32) {
                const qsa_i64 n = 16 * (qsa_i64)rem0 + r;
                for (int b = 0; b < rq; b += 128)
                    asm volatile("prefetch.global.L2 [%0];" ::"l"(w0.q + n * rq + b));
                asm volatile("prefetch.global.L2 [%0];" ::"l"(w0.s + n * rs));
            }
        QSA_PDL_ENTRY();
    }
    /* two tasks per fold (gate/up: both matrices of a column tile, act(gate) * up from registers, no
       ticket; down: two column tiles) */
    const bool fuse = ctw > 1;
    float *slot = (float *)stage[warp];
    qsa_frag_c T;
    for (int p0 = 0; p0 < cnt; p0 += 8) {
        const int r0 = p0 + (lane >> 3), r1 = r0 + 4;
        const qsa_f16 *a0 = r0 < cnt ? X + (qsa_i64)(prow[warp][r0] / rowdiv) * ldx : 0;
        const qsa_f16 *a1 = r1 < cnt ? X + (qsa_i64)(prow[warp][r1] / rowdiv) * ldx : 0;
        for (int i = 0; i < ctw; i++) {
            const int rem = rem0 + i, ct = rem / NB, mat = rem % NB, n0 = ct * 16;
            const qsa_wsrc ws = qsa_expert_ws(experts[e], NB == 1 ? 2 : mat, Kd);
            if (ws.w16 || !qsa_nvf_ok(ws, 1, Kd)) __trap(); /* the host takes these for NVFP4 experts only */
            __syncwarp(); /* the previous fold's tile is read before this one stages over it */
            if (fuse) { /* tasks i and i + 1 in one fold: gate (rem0 + i even) and up, or column tiles ct, ct + 1 */
                const qsa_wsrc w2 = NB == 2 ? qsa_expert_ws(experts[e], 1, Kd) : ws;
                const int n1 = NB == 2 ? n0 : n0 + 16;
                if (w2.w16 || !qsa_nvf_ok(w2, 1, Kd)) __trap();
                qsa_frag_c U;
                if (cnt - p0 <= 4)
                    qsa_segs16_nvd<false, false, 2>(a0, a0 != 0, ws, n0, Kd, nseg, stage[warp], pk[warp], T, slot,
                                                    qsa_seg_range(), 0, &w2, &U, n1);
                else
                    qsa_segs16_nvd<false, true, 2>(a0, a0 != 0, ws, n0, Kd, nseg, stage[warp], pk[warp], T, slot,
                                                   qsa_seg_range(), a1, &w2, &U, n1);
#pragma unroll
                for (int k = 0; k < 4; k++) { /* T.x: rows g, g, g + 8, g + 8 of pairs 2 t, 2 t + 1, 2 t, 2 t + 1 */
                    const int p = p0 + 2 * (lane & 3) + (k & 1), n = (lane >> 2) + 8 * (k >> 1);
                    if (p >= cnt) continue;
                    const qsa_i64 o = (qsa_i64)prow[warp][p] * N;
                    if (NB == 2) {
                        h16[o + n0 + n] = qsa_f32_to_f16(qsa_act(act, T.x[k]) * U.x[k]);
                    } else {
                        y[o + n0 + n] = T.x[k];
                        y[o + n1 + n] = U.x[k];
                    }
                }
                i++; /* (the second task) */
                continue;
            }
            if (cnt - p0 <= 4) /* (most decode tiles: the one-row fold, without the second row's copies) */
                qsa_segs16_nvd<false, false>(a0, a0 != 0, ws, n0, Kd, nseg, stage[warp], pk[warp], T, slot);
            else
                qsa_segs16_nvd<false, true>(a0, a0 != 0, ws, n0, Kd, nseg, stage[warp], pk[warp], T, slot,
                                            qsa_seg_range(), a1);
            __syncwarp();
            for (int j = lane; j < min(8, cnt - p0) * 16; j += 32) {
                const int r = p0 + (j >> 4);
                if (NB == 1) y[(qsa_i64)prow[warp][r] * N + n0 + (j & 15)] = slot[j];
                else part[(((qsa_i64)(first + r) * ncol + ct) * NB + mat) * 16 + (j & 15)] = slot[j];
            }
        }
    }
    if (NB == 2 && !fuse)
        qsa_moe_whole_gu_end(part, count, tile, ncol, rem0 / NB, first, cnt, prow[warp], N, act, h16);
}
#endif
/* (below sm_80 the host never launches them: no direct fold there) */
#if QSA_IN_PART(5)
extern "C" __global__ void __launch_bounds__(32 * QSA_LEAN_WARPS, 8) qsa_k_moe_gate_up_xwn(
    const qsa_f16 *__restrict__ x16, const int *__restrict__ pairs, const int *__restrict__ tiles,
    const int *__restrict__ ntiles, const qsa_expert_w *__restrict__ experts, qsa_f16 *__restrict__ h16, int H, int I,
    int K, int act, float *part, unsigned *count, int ctw) {
    QSA_PDL_ENTRY();
#if QSA_CPA
    qsa_moe_lean<2>(x16, H, K, pairs, tiles, ntiles, experts, I, H, act, h16, 0, part, count, ctw);
#else
    __trap();
#endif
}
#endif
#if QSA_IN_PART(4)
extern "C" __global__ void __launch_bounds__(32 * QSA_LEAN_WARPS, 8) qsa_k_moe_down_xwn(
    const qsa_f16 *__restrict__ h16, const int *__restrict__ pairs, const int *__restrict__ tiles,
    const int *__restrict__ ntiles, const qsa_expert_w *__restrict__ experts, float *__restrict__ y, int H, int I,
    int ctw, int early) {
    QSA_PDL_LATE(); /* (early: qsa_moe_lean's look-ups and weights before the wait; the plan was written two or
                       more launches back, the host says so) */
    if (!early) QSA_PDL_ENTRY();
#if QSA_CPA
    qsa_moe_lean<1>(h16, I, 1, pairs, tiles, ntiles, experts, H, I, 0, 0, y, 0, 0, ctw, early);
#else
    __trap();
#endif
}
#endif

/* The same two GEMMs with 64-pair tiles (qsa_k_moe_plan with tr = 64), for chunks where experts
 * get many pairs (prefill): each expert's weights are read and dequantised once per 64 pairs
 * instead of once per 16, through the tiled core.  Same canonical order, so the same bits as the
 * 16-pair kernels for every pair (tested).  gate_up: block (tile, y) computes columns
 * 32y .. 32y+31 of I for gate (tile columns 0..31) and up (32..63) at once.
 * Launch: grid (max_tiles, ceil(I/32)) resp. (max_tiles, ceil(H/64)), block 256. */
static __device__ __forceinline__ void qsa_moe_rows64(const int *pairs, const int *tt, int *prow) {
    if (threadIdx.x < 64) prow[threadIdx.x] = (int)threadIdx.x < tt[2] ? pairs[tt[1] + threadIdx.x] : -1;
    __syncthreads();
}
#if QSA_IN_PART(1)
extern "C" __global__ void __launch_bounds__(256) qsa_k_moe_gate_up64(
    const qsa_f16 *__restrict__ x16, const int *__restrict__ pairs, const int *__restrict__ tiles,
    const int *__restrict__ ntiles, const qsa_expert_w *__restrict__ experts, qsa_f16 *__restrict__ h16, int H, int I,
    int K, int act) {
    QSA_PDL_ENTRY();
    __shared__ __align__(128) unsigned char smem[QSA_GEMM_SMEM];
    __shared__ int prow[64];
    if (blockDim.x != QSA_GEMM_THREADS) __trap();
    if ((int)blockIdx.x >= *ntiles) return;
    const int *tt = tiles + 3 * (qsa_i64)blockIdx.x;
    const int e = tt[0], cnt = tt[2], n0 = blockIdx.y * 32, row = threadIdx.x >> 2;
    qsa_moe_rows64(pairs, tt, prow);
    if (H <= 0 || (H & 15)) {
        for (int i = threadIdx.x; i < 64 * 32; i += QSA_GEMM_THREADS)
            if ((i >> 5) < cnt && n0 + (i & 31) < I) h16[(qsa_i64)prow[i >> 5] * I + n0 + (i & 31)] = qsa_f32_to_f16(QSA_QNAN);
        return;
    }
    const qsa_expert_w &ex = experts[e];
    const bool up = row >= 32; /* this thread's weight row: gate or up row n0 + row % 32 */
    const qsa_f16 *w16 = up ? ex.up16 : ex.gate16;
    const qsa_wsrc ws = w16 ? qsa_wsrc_f16(w16)
                            : (up ? qsa_wsrc_nvfp4(ex.up_q, ex.up_s, ex.up_s2, H) : qsa_wsrc_nvfp4(ex.gate_q, ex.gate_s, ex.gate_s2, H));
    const int avec = (((qsa_u64)x16) & 15u) == 0 && (H & 7) == 0;
    qsa_tile64_core(prow[row] >= 0 ? x16 + (qsa_i64)(prow[row] / K) * H : 0, avec, ws, n0 + (row & 31), I, H, smem);
    const float *os = (const float *)smem;
    for (int i = threadIdx.x; i < 64 * 32; i += QSA_GEMM_THREADS) {
        const int r = i >> 5, c = i & 31;
        if (r < cnt && n0 + c < I)
            h16[(qsa_i64)prow[r] * I + n0 + c] = qsa_f32_to_f16(qsa_act(act, os[r * QSA_OST + c]) * os[r * QSA_OST + 32 + c]);
    }
}
#endif
#if QSA_IN_PART(3)
extern "C" __global__ void __launch_bounds__(256) qsa_k_moe_down64(
    const qsa_f16 *__restrict__ h16, const int *__restrict__ pairs, const int *__restrict__ tiles,
    const int *__restrict__ ntiles, const qsa_expert_w *__restrict__ experts, float *__restrict__ y, int H, int I) {
    QSA_PDL_ENTRY();
    __shared__ __align__(128) unsigned char smem[QSA_GEMM_SMEM];
    __shared__ int prow[64];
    if (blockDim.x != QSA_GEMM_THREADS) __trap();
    if ((int)blockIdx.x >= *ntiles) return;
    const int *tt = tiles + 3 * (qsa_i64)blockIdx.x;
    const int e = tt[0], cnt = tt[2], n0 = blockIdx.y * 64, row = threadIdx.x >> 2;
    qsa_moe_rows64(pairs, tt, prow);
    if (I <= 0 || (I & 15)) {
        for (int i = threadIdx.x; i < 64 * 64; i += QSA_GEMM_THREADS)
            if ((i >> 6) < cnt && n0 + (i & 63) < H) y[(qsa_i64)prow[i >> 6] * H + n0 + (i & 63)] = QSA_QNAN;
        return;
    }
    const qsa_expert_w &ex = experts[e];
    const qsa_wsrc ws = ex.down16 ? qsa_wsrc_f16(ex.down16) : qsa_wsrc_nvfp4(ex.down_q, ex.down_s, ex.down_s2, I);
    const int avec = (((qsa_u64)h16) & 15u) == 0 && (I & 7) == 0;
    qsa_tile64_core(prow[row] >= 0 ? h16 + (qsa_i64)prow[row] * I : 0, avec, ws, n0 + row, H, I, smem);
    const float *os = (const float *)smem;
    for (int i = threadIdx.x; i < 64 * 64; i += QSA_GEMM_THREADS) {
        const int r = i >> 6, c = i & 63;
        if (r < cnt && n0 + c < H) y[(qsa_i64)prow[r] * H + n0 + c] = os[r * QSA_OST + c];
    }
}
#endif

/* out[t][j] = sum over slots k ascending (= ascending expert id) of topk_w[t][k] * y[t*K+k][j],
 * from 0, without fused multiply-add: the CPU's `out[j] += y[j] * topw[k]`; then, with sh != NULL,
 * the shared expert: out[t][j] = out[t][j] + sigmoid(gate_logit[t]) * sh[t][j] (gate_logit [M], the
 * N = 1 GEMM output; the CPU's expression, no fused multiply-add: the bits of the separate
 * shared-combine launch it replaces).  Launch: grid (M, Y) with any Y (ceil(H / 256) for small M),
 * block any multiple of 32 (256). */
#if QSA_IN_PART(5)
extern "C" __global__ void qsa_k_moe_combine(const float *__restrict__ y, const float *__restrict__ topk_w,
                                             float *__restrict__ out, int H, int K, const float *__restrict__ sh,
                                             const float *__restrict__ gate_logit) {
    QSA_PDL_ENTRY();
    qsa_i64 t = blockIdx.x;
    const float g = sh ? qsa_sigmoid(gate_logit[t]) : 0.0f;
    for (int j = blockIdx.y * blockDim.x + threadIdx.x; j < H; j += gridDim.y * blockDim.x) {
        float acc = 0.0f;
        for (int k = 0; k < K; k++) acc = __fadd_rn(acc, __fmul_rn(y[(t * K + k) * H + j], topk_w[t * K + k]));
        if (sh) acc = __fadd_rn(acc, __fmul_rn(g, sh[t * H + j]));
        out[t * H + j] = acc;
    }
}
#endif

/* ============================================================================================== */
/* PLE (per-layer n-gram embeddings)                                                               */
/* ============================================================================================== */

/* Per token t (hcH = hc * H, groups of H per stream s):
 *   key = groupRMSNorm(keyp[t], nk) (1 + w);  q = groupRMSNorm(X[t], nq) (1 + w)
 *   g_s = <key_s, q_s> / sqrtf(H);  g_s = sign(g_s) * sqrtf(max(|g_s|, 1e-6))
 *   gv[t][s*H + j] = sigmoid(g_s) * valp[t][j];  gvn[t] = groupRMSNorm(gv[t], nc) (1 + w)
 * keyp [M][hcH], X [M][hcH] (streams before this PLE), valp [M][H]; gv, gvn [M][hcH].  Sums are
 * fixed-order block reductions.  The streams are independent: block (t, y) takes streams y, y + Y, ..
 * (the same bits for any Y).  Launch: grid (M, Y), Y = hc (a block per stream: the 4 streams of a
 * decode token one after another in one block was 70 us under ncu on the H200), block 256 (bits
 * depend on it: keep 256). */
#if QSA_IN_PART(7)
extern "C" __global__ void qsa_k_ple_gate(const float *__restrict__ keyp, const float *__restrict__ X,
                                          const float *__restrict__ valp, const float *__restrict__ nk,
                                          const float *__restrict__ nq, const float *__restrict__ nc,
                                          float *__restrict__ gv, float *__restrict__ gvn, int H, int hc, float eps) {
    QSA_PDL_ENTRY();
    __shared__ float scratch[33];
    const qsa_i64 t = blockIdx.x, hcH = (qsa_i64)hc * H;
    for (int s = blockIdx.y; s < hc; s += gridDim.y) {
        const qsa_i64 o = t * hcH + (qsa_i64)s * H;
        const float *kr = keyp + o, *xr = X + o;
        const float *wk = nk + (qsa_i64)s * H, *wq = nq + (qsa_i64)s * H, *wc = nc + (qsa_i64)s * H;
        float sk = 0.0f, sq = 0.0f;
        for (int j = threadIdx.x; j < H; j += blockDim.x) {
            sk += kr[j] * kr[j];
            sq += xr[j] * xr[j];
        }
        float ik = 1.0f / sqrtf(qsa_block_sum(sk, scratch) / (float)H + eps);
        float iq = 1.0f / sqrtf(qsa_block_sum(sq, scratch) / (float)H + eps);
        float dot = 0.0f;
        for (int j = threadIdx.x; j < H; j += blockDim.x)
            dot += (kr[j] * ik * (1.0f + wk[j])) * (xr[j] * iq * (1.0f + wq[j]));
        float gate = qsa_block_sum(dot, scratch) / sqrtf((float)H);
        float mag = sqrtf(fmaxf(fabsf(gate), 1e-6f));
        gate = gate > 0.0f ? mag : gate < 0.0f ? -mag : 0.0f;
        float sg = qsa_sigmoid(gate);
        float sv = 0.0f;
        for (int j = threadIdx.x; j < H; j += blockDim.x) {
            float v = sg * valp[t * H + j];
            gv[o + j] = v;
            sv += v * v;
        }
        float iv = 1.0f / sqrtf(qsa_block_sum(sv, scratch) / (float)H + eps);
        for (int j = threadIdx.x; j < H; j += blockDim.x) gvn[o + j] = gv[o + j] * iv * (1.0f + wc[j]);
    }
}
#endif

/* Causal dilated depthwise conv of the normed PLE values, plus the residual add, for the M tokens
 * of ONE sequence in order.  Channel c (< hcH), history h = [state rows (L = (Kc-1)*dil, oldest
 * first); gvn rows of this chunk]:
 *   X[t][c] += gv[t][c] + silu(sum over k ascending of w[c][k] * h[t + k*dil][c])
 * (the CPU's expressions, no fused multiply-add); then state = the last L rows of h.  Each channel
 * is one thread walking the tokens in order, so splitting a prompt into chunks gives the same bits.
 * Launch: grid (ceil(hcH / 256)), block 256 (any). */
static __device__ __forceinline__ void qsa_ple_conv_body(float *__restrict__ X, const float *__restrict__ gv,
                                          const float *__restrict__ gvn, float *__restrict__ state,
                                          const float *__restrict__ w, int M, int hcH, int Kc, int dil) {
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= hcH) return;
    const int L = (Kc - 1) * dil;
    const float *wc = w + (qsa_i64)c * Kc;
    for (int t = 0; t < M; t++) {
        float acc = 0.0f;
        for (int k = 0; k < Kc; k++) {
            int i = t + k * dil;
            float h = i < L ? state[(qsa_i64)i * hcH + c] : gvn[(qsa_i64)(i - L) * hcH + c];
            acc = __fadd_rn(acc, __fmul_rn(wc[k], h));
        }
        qsa_i64 o = (qsa_i64)t * hcH + c;
        X[o] = __fadd_rn(X[o], __fadd_rn(gv[o], qsa_silu(acc)));
    }
    /* new state row i = h[M + i]: ascending i reads row M + i > i before it is overwritten */
    for (int i = 0; i < L; i++) {
        int src = M + i;
        state[(qsa_i64)i * hcH + c] = src < L ? state[(qsa_i64)src * hcH + c] : gvn[(qsa_i64)(src - L) * hcH + c];
    }
}
#if QSA_IN_PART(4)
extern "C" __global__ void qsa_k_ple_conv(float *__restrict__ X, const float *__restrict__ gv,
                                          const float *__restrict__ gvn, float *__restrict__ state,
                                          const float *__restrict__ w, int M, int hcH, int Kc, int dil) {
    QSA_PDL_ENTRY();
    qsa_ple_conv_body(X, gv, gvn, state, w, M, hcH, Kc, dil);
}
#endif

/* ---------------------------------------------------------------------------------------------- */
/* Gated DeltaNet and QSA (sparse attention) kernels                                               */
/* ---------------------------------------------------------------------------------------------- */
/* Written to follow kernels.cu (uses its qsa_f16 typedef and the qsa_f16_to_f32 / qsa_f32_to_f16
 * conversions); every other helper of this part is prefixed k2_.  Contract: .dev/KERNELS.md.
 *
 * Determinism (SPEC section 4): no float atomics (the top-k histograms count with integer shared
 * atomics, whose results do not depend on timing); every float reduction runs in an order fixed
 * by the dimensions of ONE token/row (never by M, the launch size or where pages sit).  The sparse
 * attention visits a query's selected tokens in ascending logical order, splits them every `split`
 * selected tokens by logical index and merges the split partials left to right, exactly like the
 * CPU qsa__attn_head_plan; the block table is only used to find where a token lives.
 *
 * RoPE: angle = fp32(pos * inv_freq[i]); cos/sin are computed in double precision of that fp32
 * angle and rounded to fp32 (`(float)cos((double)angle)`, a builtin of NVRTC, no header needed),
 * as the CPU reference does; the rotation products use __fmul_rn/__fadd_rn so they are not fused,
 * which makes the rotation itself bitwise equal to the CPU's for equal inputs.
 *
 * Norms use the CPU formula `1.0f / sqrtf(mean + eps)` (IEEE sqrt and division, NVRTC defaults)
 * rather than rsqrtf; sums of squares are fixed-order block/warp trees.
 */

#define K2_MAX_HD 1024 /* largest head (or indexer head) handled by the per-head prep kernels */

/* Zero-centred RMSNorm of the n values xs[] (shared memory) in place: x * (1/sqrt(mean(x^2)+eps)) * (1+w). */
static __device__ void k2_rmsnorm_1p_smem(float *xs, const float *w, int n, float eps, float *scratch) {
    float ss = 0.0f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) ss = fmaf(xs[i], xs[i], ss);
    float inv = 1.0f / sqrtf(qsa_block_sum(ss, scratch) / (float)n + eps);
    for (int i = threadIdx.x; i < n; i += blockDim.x) xs[i] = __fmul_rn(__fmul_rn(xs[i], inv), 1.0f + w[i]);
    __syncthreads();
}

/* rotate_half RoPE of the first rd values of xs[] (shared memory) at position pos, written to y[]
   (all n values; the ones past rd are copied). */
static __device__ void k2_rope_store(const float *xs, float *y, int n, int rd, const float *inv_freq, long long pos) {
    int half = rd / 2;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        float out;
        if (i < rd) {
            int p = i < half ? i : i - half;
            float f = __fmul_rn((float)pos, inv_freq[p]);
            float c = (float)cos((double)f), s = (float)sin((double)f);
            float a = xs[p], b = xs[p + half];
            out = i < half ? __fsub_rn(__fmul_rn(a, c), __fmul_rn(b, s)) : __fadd_rn(__fmul_rn(b, c), __fmul_rn(a, s));
        } else {
            out = xs[i];
        }
        y[i] = out;
    }
}

/* ============================================================================================== */
/* Gated DeltaNet                                                                                   */
/* ============================================================================================== */

/* The GDN gates of one (token, value head), folded into the conv launch: beta = sigmoid(b);
 * g = -exp(A_log) * softplus(a + dt_bias) (softplus threshold 20, as torch).  b, a, beta, g
 * [M][nv] (row-major), A_log, dt_bias [nv]; b == NULL: no gates in this launch. */
typedef struct {
    const float *b, *a, *A_log, *dt_bias;
    float *beta, *g;
    int nv;
} qsa_gdn_gate_args;
/* beta and g of one (token, head) from its b and a and the head's A_log and dt_bias */
static __device__ __forceinline__ void qsa_gdn_gate_of(float b, float a, float A_log, float dt_bias, float &beta, float &g) {
    beta = qsa_sigmoid(b);
    float x = a + dt_bias;
    float sp = x > 20.0f ? x : log1pf(expf(x));
    g = -expf(A_log) * sp;
}
static __device__ __forceinline__ void qsa_gdn_gate(const qsa_gdn_gate_args &ga, qsa_i64 i, int h) {
    qsa_gdn_gate_of(ga.b[i], ga.a[i], ga.A_log[h], ga.dt_bias[h], ga.beta[i], ga.g[i]);
}

/* One head's L2 norm in place by one warp (x / sqrt(sum x^2 + 1e-6), then times qscale unless it is 0):
   the lane's squares in ascending i, then qsa_warp_sum */
static __device__ __forceinline__ void qsa_gdn_head_norm(float *x, int dk, int lane, float qscale) {
    float ss = 0.0f;
    for (int i = lane; i < dk; i += 32) ss = fmaf(x[i], x[i], ss);
    float inv = 1.0f / sqrtf(qsa_warp_sum(ss) + 1e-6f);
    for (int i = lane; i < dk; i += 32) {
        float y = __fmul_rn(x[i], inv);
        x[i] = qscale != 0.0f ? __fmul_rn(y, qscale) : y;
    }
}

/* Causal depthwise conv + activation + split + per-head L2 norm, for token t = blockIdx.x.
 *
 *   qkv    [M][conv_dim] fp32: the in_proj_qkv outputs (conv_dim = 2*key_dim + value_dim)
 *   state  [Kc-1][conv_dim] fp32: the previous Kc-1 conv inputs, oldest first; upd (M == 1 only):
 *          advanced here (each channel's thread reads its rows, then shifts them and appends the
 *          token: what qsa_k_gdn_conv_state does); otherwise read only, and qsa_k_gdn_conv_state
 *          advances it afterwards
 *   ga     the gates (qsa_gdn_gate_args; block (t, 0) computes token t's), or ga.b == NULL
 *   w      [conv_dim][Kc] fp32 depthwise weights
 *   q, k   [M][key_dim] out (key_dim = nk*dk): act(conv), L2-normalised per head
 *          (x / sqrt(sum x^2 + 1e-6)), q also times dk^-0.5;   v [M][conv_dim - 2*key_dim] out: act(conv)
 *   act    0 silu, 1 sigmoid
 * conv: acc = sum_{j<Kc} w[ch][j] * x[t+j] over the concatenation [state; qkv] (j ascending, fmaf).
 * The work of a token is cut into units: the 2*nk q and k heads (conv, then the head's L2 norm by
 * one warp), then the v channels in pieces of 256; block y does units y, y + gridDim.y, ...  A
 * channel's conv and a head's norm are computed the same way whatever the grid, so any Y gives the
 * same bits; Y = 2*nk + ceil(value_dim / 256) (one unit per block) is the fastest for decode.
 * Launch: grid (M, Y), block 256 (any multiple of 32). */
static __device__ __forceinline__ void qsa_gdn_conv_body(const float *__restrict__ qkv, float *state,
                                                         const float *__restrict__ w, float *q, float *k, float *v,
                                                         int M, int conv_dim, int key_dim, int Kc, int act, int nk,
                                                         int dk, const qsa_gdn_gate_args &ga, int upd) {
    int t = blockIdx.x;
    if (t >= M) return;
    if (ga.b && blockIdx.y == 0) /* the gates of token t (qsa_k_gdn_gates folded in) */
        for (int h = threadIdx.x; h < ga.nv; h += blockDim.x) qsa_gdn_gate(ga, (qsa_i64)t * ga.nv + h, h);
    int value_dim = conv_dim - 2 * key_dim, nhu = 2 * nk, units = nhu + (value_dim + 255) / 256;
    for (int u = blockIdx.y; u < units; u += gridDim.y) {
        int c0 = u < nhu ? u * dk : 2 * key_dim + (u - nhu) * 256;
        int c1 = u < nhu ? c0 + dk : min(conv_dim, c0 + 256);
        for (int ch = c0 + threadIdx.x; ch < c1; ch += blockDim.x) {
            float acc = 0.0f;
            for (int j = 0; j < Kc; j++) {
                int src = t + j - (Kc - 1); /* < 0: carried state row Kc-1+src */
                float x = src < 0 ? state[(long long)(Kc - 1 + src) * conv_dim + ch] : qkv[(long long)src * conv_dim + ch];
                acc = fmaf(w[(long long)ch * Kc + j], x, acc); /* (qsa_gdn_fuse: the same chain) */
            }
            if (upd) /* M == 1: this thread alone reads and writes channel ch of the state (ascending rows) */
                for (int i = 0; i < Kc - 1; i++)
                    state[(long long)i * conv_dim + ch] = i + 1 < Kc - 1 ? state[(long long)(i + 1) * conv_dim + ch] : qkv[ch];
            float y = qsa_act(act, acc);
            if (ch < key_dim) q[(long long)t * key_dim + ch] = y;
            else if (ch < 2 * key_dim) k[(long long)t * key_dim + ch - key_dim] = y;
            else v[(long long)t * value_dim + ch - 2 * key_dim] = y;
        }
    }
    __syncthreads(); /* the block's global writes are visible to the block after the barrier */
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    float qscale = 1.0f / sqrtf((float)dk);
    /* the block's head units, one warp each */
    int mine = blockIdx.y < nhu ? (nhu - 1 - (int)blockIdx.y) / (int)gridDim.y + 1 : 0;
    for (int i = warp; i < mine; i += nw) {
        int hh = blockIdx.y + i * gridDim.y;
        float *x = hh < nk ? q + (long long)t * key_dim + hh * dk : k + (long long)t * key_dim + (hh - nk) * dk;
        qsa_gdn_head_norm(x, dk, lane, hh < nk ? qscale : 0.0f);
    }
}
#if QSA_IN_PART(2)
extern "C" __global__ void __launch_bounds__(256) qsa_k_gdn_conv(const float *__restrict__ qkv, float *state,
                                                                 const float *__restrict__ w, float *q, float *k,
                                                                 float *v, int M, int conv_dim, int key_dim, int Kc,
                                                                 int act, int nk, int dk, qsa_gdn_gate_args ga,
                                                                 int upd) {
    QSA_PDL_ENTRY();
    if (upd && M != 1) __trap(); /* the host advances a longer chunk's state with qsa_k_gdn_conv_state */
    qsa_gdn_conv_body(qkv, state, w, q, k, v, M, conv_dim, key_dim, Kc, act, nk, dk, ga, upd);
}
#endif

/* Advances the conv state past the M tokens of qkv: state = the last Kc-1 rows of [state; qkv].
 * Launch after qsa_k_gdn_conv (same stream): grid (ceil(conv_dim / 256)), block 256. */
static __device__ __forceinline__ void qsa_gdn_conv_state_body(const float *__restrict__ qkv, float *state, int M, int conv_dim,
                                                int Kc) {
    int ch = blockIdx.x * blockDim.x + threadIdx.x;
    if (ch >= conv_dim) return;
    /* ascending i reads row i+M >= i of the old state before anything at or after it is written */
    for (int i = 0; i < Kc - 1; i++) {
        int src = i + M; /* index in [state; qkv] */
        float x = src < Kc - 1 ? state[(long long)src * conv_dim + ch] : qkv[(long long)(src - (Kc - 1)) * conv_dim + ch];
        state[(long long)i * conv_dim + ch] = x;
    }
}
#if QSA_IN_PART(2)
extern "C" __global__ void qsa_k_gdn_conv_state(const float *__restrict__ qkv, float *state, int M, int conv_dim,
                                                int Kc) {
    QSA_PDL_ENTRY();
    qsa_gdn_conv_state_body(qkv, state, M, conv_dim, Kc);
}
#endif

#define K2_GDN_MAX_DK 512

/* The recurrence for value head h = blockIdx.x.  A column j of S only ever meets itself (kv[j],
 * d[j], o[j]), so each column is owned by P adjacent lanes (P = 4 for dk <= 128, 8 up to 256, 16
 * up to 512: a function of dk alone), lane p holding the rows i = u*P + p (u ascending) of the
 * column in registers for the whole launch; columns j = (blockIdx.y + c*gridDim.y)*(blockDim.x/P)
 * + threadIdx.x/P.  Per token and column:
 *   s_i = S[i][j]*exp(g);  kv = sum_i s_i k_i;  d = (v_j - kv)*beta;  S[i][j] = s_i + k_i d;  o_j = sum_i S[i][j] q_i
 * where each lane sums its rows in ascending u with fmaf and the P partial sums are combined by an
 * xor butterfly (every lane gets the same bits: each step adds the same two numbers).  That order
 * depends on dk only: nothing depends on M, on the grid/block shape or on where the state is kept,
 * so tokens fed one launch at a time or all at once give the same bits (outputs and state).  It is
 * not the CPU's single ascending chain (the GPU agrees with it within rounding, tested).  The
 * inputs come through a shared-memory staging of T tokens (below).
 * F16: the state is fp16 between tokens (rounded once per token after the update; o uses the fp32
 * value before that rounding). */
#define K2_GDN_ROWS 32 /* rows of a column per lane */
/* Tokens are staged in chunks of T: the block loads the chunk's q, k (T x dk each), the v of its
 * columns (T x B/P), g and beta (T each) with coalesced loads into shared memory, one pair of
 * barriers per chunk, the next chunk's loads in flight (registers) while the current one is
 * computed.  Each thread loads K2_GDN_PF elements per chunk, so T is the largest count (<= 16, <= M)
 * whose 2*T*dk + T*B/P + 2*T elements fit K2_GDN_PF*B and the staging; T changes when and where the inputs
 * are read, never the arithmetic. */
#define K2_GDN_PF 20 /* with blocks of 128 and dk = 128: T = 8 */
/* The batched decode forms (one token per sequence, T = 1 whatever PF allows): 9 covers one token
   for every dk <= 512 with blocks of 128 (2 dk + B/P + 2 <= 9 * 128) and does not issue the 11
   predicated staging loads past it: batch 32 at the real shape 93.4 -> 83.2 us per layer (H200).
   (nvcc -Xptxas -v: 151 -> 128 registers; the driver's build of the NVRTC PTX already used 128.) */
#define K2_GDN_PF1 9
#define K2_GDN_STG 4096 /* floats of shared staging (16 KB: with 32 KB of dynamic memory, 48 KB) */
#define K2_GDN_TMAX 16
/* PC = 4: the form for dk = 4 * K2_GDN_ROWS = 128 alone (the lanes per column and every lane's row count known
 * at compile time), with q and k staged lane-major: a token's row i = u * 4 + p at p * K2_GDN_QKS + u, so that a
 * lane's 32 rows of k and of q are 8 16-byte loads each (the 4 lanes of a column 36 floats apart: no bank
 * conflicts) instead of 32 loads with an address computation each, and no row predicates.  The same operations in
 * the same order as the general form (PC = 0): the same bits. */
#define K2_GDN_QKS (K2_GDN_ROWS + 4)
/* 16 aligned bytes of shared memory as one load (an asm: the compiler's own vector loads of these rows came out
   split and masked differently in the whole program and in its part, which the parts test forbids) */
static __device__ __forceinline__ float4 k2_lds4(const float *p) {
    float4 r;
    asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];" : "=f"(r.x), "=f"(r.y), "=f"(r.z), "=f"(r.w) : "r"(qsa_smem_u32(p)));
    return r;
}
/* (stg: the entry point's K2_GDN_STG floats of shared memory, 16-byte aligned: one array for both forms) */
#define K2_GDN_STAGING __shared__ __align__(16) float stg[K2_GDN_STG]
template <bool F16, int PF = K2_GDN_PF, bool late = false, int PC = 0>
static __device__ void k2_gdn_recurrent(float *stg, float *S32, qsa_f16 *S16, const float *__restrict__ q,
                                        const float *__restrict__ k, const float *__restrict__ v,
                                        const float *__restrict__ beta, const float *__restrict__ g, float *o, int M,
                                        int nk, int nv, int dk, int dv) {
    const int P = PC ? PC : dk <= 128 ? 4 : dk <= 256 ? 8 : 16, B = blockDim.x, cpb = B / P;
    const int per = 2 * dk + cpb + 2, cap = min(PF * B, K2_GDN_STG);
    if (dk > K2_GDN_MAX_DK || (B & 31) || per > cap || (PC && dk != PC * K2_GDN_ROWS)) __trap(); /* the host validates dk and the block */
    const int qks = PC ? PC * K2_GDN_QKS : dk; /* a token's q (and k) in the staging */
    int T = max(1, min(min(K2_GDN_TMAX, cap / per), M));
    while (T > 1 && 2 * T * qks + T * (cpb + 2) > K2_GDN_STG) T--; /* (PC's padding) */
    if (2 * T * qks + T * (cpb + 2) > K2_GDN_STG) __trap();
    const int L = T * per;
    const int h = blockIdx.x, p = threadIdx.x % P, jc = threadIdx.x / P, kh = h / (nv / nk);
    const int nu = PC ? K2_GDN_ROWS : (dk - p + P - 1) / P; /* this lane's rows i = u*P + p < dk: u < nu */
    const int ncols = (dv + gridDim.y * cpb - 1) / (gridDim.y * cpb);
    const long long hbase = (long long)h * dk * dv;
    /* the staging: qs [T][qks], ks [T][qks], vs [T][cpb], gs [T], bs [T] */
    const float *qs = stg, *ks = stg + T * qks, *vs = stg + 2 * T * qks, *gs = vs + T * cpb, *bs = gs + T;
    for (int c = 0; c < ncols; c++) {
        const int jb = (blockIdx.y + c * gridDim.y) * cpb, j = jb + jc;
        const bool live = j < dv;
        float st[K2_GDN_ROWS];
#pragma unroll
        for (int u = 0; u < K2_GDN_ROWS; u++) {
            const int i = u * P + p;
            const long long gi = hbase + (long long)i * dv + j;
            st[u] = live && i < dk ? (F16 ? qsa_f16_to_f32(S16[gi]) : S32[gi]) : 0.0f;
        }
        if (late && c == 0) QSA_PDL_ENTRY(); /* (late: the caller is QSA_PDL_LATE; S is read before the wait) */
        float pf[PF];
        /* element e of the chunk starting at token t0 (zero past M or past dv) */
#define K2_GDN_FETCH(t0)                                                                          \
        do {                                                                                      \
            _Pragma("unroll") for (int r = 0; r < PF; r++) {                                      \
                int e = threadIdx.x + r * B;                                                      \
                float x = 0.0f;                                                                   \
                if (e < 2 * T * dk) {                                                             \
                    const float *src = e < T * dk ? q : k;                                        \
                    e = e < T * dk ? e : e - T * dk;                                              \
                    const int tt = e / dk, t = (t0) + tt;                                         \
                    if (t < M) x = src[((long long)t * nk + kh) * dk + (e - tt * dk)];            \
                } else if (e < 2 * T * dk + T * cpb) {                                            \
                    e -= 2 * T * dk;                                                              \
                    const int tt = e / cpb, t = (t0) + tt, jj = jb + (e - tt * cpb);              \
                    if (t < M && jj < dv) x = v[((long long)t * nv + h) * dv + jj];               \
                } else if (e < L) {                                                               \
                    e -= 2 * T * dk + T * cpb;                                                    \
                    const int t = (t0) + (e < T ? e : e - T);                                     \
                    if (t < M) x = (e < T ? g : beta)[(long long)t * nv + h];                     \
                }                                                                                 \
                pf[r] = x;                                                                        \
            }                                                                                     \
        } while (0)
        if (M > 0) K2_GDN_FETCH(0);
        for (int t0 = 0; t0 < M; t0 += T) {
            __syncthreads(); /* the previous chunk is no longer read */
#pragma unroll
            for (int r = 0; r < PF; r++) {
                int e = threadIdx.x + r * B;
                if (PC) { /* (q and k lane-major; the rest after them) */
                    const int pc = PC ? PC : 1 /* (PC = 0 never comes here) */, qk = e >= T * dk, e2 = qk ? e - T * dk : e, tt = e2 / (pc * K2_GDN_ROWS),
                              i = e2 - tt * (pc * K2_GDN_ROWS);
                    e = e < 2 * T * dk ? (qk * T + tt) * qks + (i % pc) * K2_GDN_QKS + i / pc : e - 2 * T * dk + 2 * T * qks;
                }
                if (threadIdx.x + r * B < L) stg[e] = pf[r];
            }
            __syncthreads();
            if (t0 + T < M) K2_GDN_FETCH(t0 + T);
            const int nt = min(T, M - t0);
            for (int tt = 0; tt < nt; tt++) {
                /* this lane's row u: [u * P] (PC: [u]) */
                const float *qt = qs + tt * qks + (PC ? p * K2_GDN_QKS : p), *kt = ks + tt * qks + (PC ? p * K2_GDN_QKS : p);
                const float decay = expf(gs[tt]), bt = bs[tt], vj = vs[tt * cpb + jc];
                float kr[PC ? K2_GDN_ROWS : 1], qr[PC ? K2_GDN_ROWS : 1];
                if (PC)
#pragma unroll
                    for (int c = 0; c < K2_GDN_ROWS / 4; c++) {
                        const float4 x = k2_lds4(kt + 4 * c), y = k2_lds4(qt + 4 * c);
                        kr[4 * c] = x.x, kr[4 * c + 1] = x.y, kr[4 * c + 2] = x.z, kr[4 * c + 3] = x.w;
                        qr[4 * c] = y.x, qr[4 * c + 1] = y.y, qr[4 * c + 2] = y.z, qr[4 * c + 3] = y.w;
                    }
#define K2_GDN_K(u) (PC ? kr[PC ? (u) : 0] : kt[(u) * P])
#define K2_GDN_Q(u) (PC ? qr[PC ? (u) : 0] : qt[(u) * P])
                float kv = 0.0f;
#pragma unroll
                for (int u = 0; u < K2_GDN_ROWS; u++)
                    if (u < nu) {
                        st[u] = __fmul_rn(st[u], decay); /* s_i = S[i][j] exp(g), kept for the update */
                        kv = fmaf(st[u], K2_GDN_K(u), kv);
                    }
#pragma unroll
                for (int m = 1; m < P; m <<= 1) kv += __shfl_xor_sync(QSA_FULL_MASK, kv, m);
                const float d = __fmul_rn(vj - kv, bt);
                float oj = 0.0f;
#pragma unroll
                for (int u = 0; u < K2_GDN_ROWS; u++)
                    if (u < nu) {
                        const float sn = fmaf(K2_GDN_K(u), d, st[u]);
                        st[u] = F16 ? qsa_f16_to_f32(qsa_f32_to_f16(sn)) : sn;
                        oj = fmaf(sn, K2_GDN_Q(u), oj);
                    }
#undef K2_GDN_K
#undef K2_GDN_Q
#pragma unroll
                for (int m = 1; m < P; m <<= 1) oj += __shfl_xor_sync(QSA_FULL_MASK, oj, m);
                if (live && p == 0) o[((long long)(t0 + tt) * nv + h) * dv + j] = oj;
            }
        }
#undef K2_GDN_FETCH
#pragma unroll
        for (int u = 0; u < K2_GDN_ROWS; u++) {
            const int i = u * P + p;
            const long long gi = hbase + (long long)i * dv + j;
            if (live && i < dk) {
                if (F16) S16[gi] = qsa_f32_to_f16(st[u]);
                else S32[gi] = st[u];
            }
        }
        __syncthreads(); /* the next column pass restages */
    }
}

/* The decode step's conv in the batched recurrence's launch (qsa_k_gdn_recurrent_batch on K2_GDN_SMEM archs; the
 * host: qsa__gdn_fused): instead of reading q, k, v, beta and g that a qsa_k_gdn_conv_batch launch wrote, each
 * block computes what it reads of them from the input projection's row — its key head's 2 dk q and k channels
 * (conv, activation, then the head's L2 norm by one warp each: qsa_gdn_head_norm), its columns' v channels and
 * its head's gates — with qsa_gdn_conv_body's and qsa_gdn_gate's operations in their order: the same bits (tested
 * against the two launches).  A conv's chain takes the Kc - 1 state rows first and the input last, so the state's
 * links run before the PDL wait (the state was last written by this layer's previous step) and only the input's
 * after it.  The conv state advances as there, a v channel's here by the lane that alone reads it (its column's
 * p = 0), the q and k channels' (which all the key head's (nv / nk)
 * gridDim.y blocks read) by the next launch, qsa_k_gdn_norm_gate (its qsa_gdn_shift).  Needs dk <= 128 and
 * Kc <= QSA_GDN_KC (the host checks; traps otherwise). */
#define QSA_GDN_KC 4 /* the fused conv's largest kernel */
typedef struct {
    const float *qkv;                /* [B][conv_dim]: the in_proj_qkv rows; NULL: q, k, v, beta and g are given */
    const unsigned long long *st;    /* [B]: sequence b's conv state [Kc-1][conv_dim] */
    const float *w;                  /* [conv_dim][Kc] */
    const float *b, *a;              /* [B][nv]: the gate projections */
    const float *A_log, *dt_bias;    /* [nv] */
    int conv_dim, Kc, act;
} qsa_gdn_fuse;

/* K2_GDN_SMEM: k2_gdn_rec_dec where an SM holds at least as many of its blocks (20 KB of shared memory
   each) as of the register form's (6, bound by registers): sm_80 and sm_87 (164 KB per SM: 7), sm_90 up
   to sm_11x (228 KB: 10); not sm_86, sm_89 or sm_12x (100 KB: 4), which keep the register form. */
#if QSA_CPA && (__CUDA_ARCH__ == 800 || __CUDA_ARCH__ == 870 || (__CUDA_ARCH__ >= 900 && __CUDA_ARCH__ < 1200))
#define K2_GDN_SMEM 1
#else
#define K2_GDN_SMEM 0
#endif
#if K2_GDN_SMEM
/* The batched decode recurrence (one token per sequence) on K2_GDN_SMEM archs: k2_gdn_recurrent's lanes, rows,
 * operations and order for M = 1 (the same bits: gpu/k2_gdn_recurrent runs it against the
 * single-sequence kernel), with the block's slice of S (dk rows x cpb = 128 / P columns, at most 16 KB)
 * in shared memory instead of registers: copied in by cp.async before the PDL wait (pieces of 16 bytes,
 * 8 for P = 16, 4 where dv or the state's alignment do not allow them; columns past dv zero-filled),
 * read by the first pass (s_i = S[i][j] exp(g), kv), read again by the second (the same s_i, the update
 * written back in place, o) and stored back by the same pieces.  Row i's columns sit at positions
 * jc ^ swz, swz = (cpb / 4) ((i / (32 / cpb)) % 4): a warp's 32 lanes read 32 distinct banks.  48
 * registers (nvcc 13, sm_90) and 20 KB of shared memory: 10 blocks (40 warps) per SM on sm_90 where the
 * register form ran 6.
 * Block 128 (trap otherwise). */
#define K2_GDN_DEC_TILE 4096 /* floats: dk x 128 / P <= 4096 for every dk <= K2_GDN_MAX_DK */
/* w (4, 2 or 1) floats from src (ok) or zeros into the shared address dst */
static __device__ __forceinline__ void k2_cpa(qsa_u32 dst, const float *src, int w, bool ok) {
    if (w == 4)
        qsa_cp16z(dst, src, ok);
    else if (w == 2)
        asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;" ::"r"(dst), "l"(src), "r"(ok ? 8 : 0) : "memory");
    else
        asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"(dst), "l"(src), "r"(ok ? 4 : 0) : "memory");
}
/* fz.qkv not NULL: the fused conv (above), fz's arrays already at sequence b (st: its state) */
static __device__ void k2_gdn_rec_dec(float *S, const float *__restrict__ q, const float *__restrict__ k,
                                      const float *__restrict__ v, const float *__restrict__ beta,
                                      const float *__restrict__ g, float *o, int nk, int nv, int dk, int dv,
                                      const qsa_gdn_fuse &fz, float *st) {
    __shared__ __align__(16) float tile[K2_GDN_DEC_TILE];
    __shared__ float qks[2 * K2_GDN_MAX_DK];
    const int P = dk <= 128 ? 4 : dk <= 256 ? 8 : 16, cpb = 128 / P;
    const bool fused = fz.qkv != 0;
    if (dk > K2_GDN_MAX_DK || blockDim.x != 128 || (fused && (dk > 128 || fz.Kc < 1 || fz.Kc > QSA_GDN_KC)))
        __trap(); /* the host validates these */
    const int h = blockIdx.x, p = threadIdx.x % P, jc = threadIdx.x / P, kh = h / (nv / nk);
    const int nu = (dk - p + P - 1) / P; /* this lane's rows i = u*P + p < dk: u < nu */
    const int ncols = (dv + gridDim.y * cpb - 1) / (gridDim.y * cpb);
    const qsa_i64 hbase = (qsa_i64)h * dk * dv;
    /* pieces of w floats (a multiple of 4 bytes that keeps every piece aligned at both ends) */
    const int wmax = cpb / 4 < 4 ? cpb / 4 : 4;
    const int w = dv % wmax == 0 && ((qsa_u64)S & (4u * wmax - 1u)) == 0 ? wmax : 1, pr = cpb / w;
    const int sh = 32 / cpb, swm = cpb / 4; /* the swizzle of row i: swm * ((i / sh) % 4) */
    const int pos = jc ^ (swm * ((p / sh) & 3)); /* (i = u P + p: i / sh % 4 = p / sh % 4, P a multiple of 4 sh) */
    /* this thread's pieces of a column pass: piece column cc of the rows r0, r0 + dr, ... < dk, at tile position
       i cpb + sc: the swizzle is the same for all of them (dr / sh = 4 w, a multiple of 4).  pr, sh and dr are
       powers of two; the copy loops step addresses (divisions there bound the launch's issue at batch 32). */
    const int lpr = __ffs(pr) - 1, r0 = threadIdx.x >> lpr, dr = 128 >> lpr, cc = (threadIdx.x & (pr - 1)) * w;
    const int sc = cc ^ (swm * ((r0 / sh) & 3));
    const qsa_u32 t0 = qsa_smem_u32(tile) + 4u * (r0 * cpb + sc), tstep = 4u * dr * cpb;
    const qsa_i64 gstep = (qsa_i64)dr * dv;
    /* the fused conv before the wait: this thread's q / k channels tid, tid + 128 (< 2 dk): their conv chains over
       the state rows (the first Kc - 1 of its Kc links: the input's comes last) and the last weight; the head's
       A_log and dt_bias */
    const int Kc = fused ? fz.Kc : 1, cd = fz.conv_dim, key_dim = nk * dk;
    float qa[2] = {0.0f, 0.0f}, ql[2] = {0.0f, 0.0f}, gA = 0.0f, gdt = 0.0f;
    if (fused) {
#pragma unroll
        for (int ci = 0; ci < 2; ci++) {
            const int i = threadIdx.x + 128 * ci, ch = (i < dk ? 0 : key_dim - dk) + kh * dk + i;
            if (i >= 2 * dk) continue;
#pragma unroll
            for (int jj = 0; jj + 1 < QSA_GDN_KC; jj++)
                if (jj < Kc - 1) qa[ci] = fmaf(fz.w[(qsa_i64)ch * Kc + jj], st[(qsa_i64)jj * cd + ch], qa[ci]);
            ql[ci] = fz.w[(qsa_i64)ch * Kc + Kc - 1];
        }
        gA = fz.A_log[h];
        gdt = fz.dt_bias[h];
    }
    float decay = 0.0f, bt = 0.0f;
    for (int c = 0; c < ncols; c++) {
        const int jb = (blockIdx.y + c * gridDim.y) * cpb, j = jb + jc;
        const bool live = j < dv;
        const int jp = jb + cc; /* this thread's piece column */
        const bool ok = jp < dv;
        float *const s0 = S + hbase + (qsa_i64)r0 * dv + (ok ? jp : 0);
        {
            const float *src = s0;
            qsa_u32 dst = t0;
            for (int i = r0; i < dk; i += dr, src += gstep, dst += tstep) k2_cpa(dst, src, w, ok);
        }
        asm volatile("cp.async.commit_group;" ::: "memory");
        /* (fused) the pass's v channel, by its column's lane p = 0 alone (it reads and writes the channel's state):
           its chain over the state rows before the wait, the rows that move up kept for after it (no store before) */
        const int cv = 2 * key_dim + h * dv + j;
        float va = 0.0f, vl = 0.0f, vr[QSA_GDN_KC - 1];
        if (fused && live && p == 0) {
#pragma unroll
            for (int jj = 0; jj + 1 < QSA_GDN_KC; jj++) {
                vr[jj] = jj < Kc - 1 ? st[(qsa_i64)jj * cd + cv] : 0.0f;
                if (jj < Kc - 1) va = fmaf(fz.w[(qsa_i64)cv * Kc + jj], vr[jj], va);
            }
            vl = fz.w[(qsa_i64)cv * Kc + Kc - 1];
        }
        if (c == 0) QSA_PDL_ENTRY(); /* (the caller is QSA_PDL_LATE: S is copied before the wait) */
        float vj = 0.0f;
        if (!fused) {
            for (int i = threadIdx.x; i < 2 * dk; i += 128)
                qks[i] = (i < dk ? q : k)[(qsa_i64)kh * dk + (i < dk ? i : i - dk)];
            decay = expf(g[h]);
            bt = beta[h];
            vj = live ? v[(qsa_i64)h * dv + j] : 0.0f;
        } else {
            if (c == 0) { /* the key head's q and k (before their norms) and the head's gates */
#pragma unroll
                for (int ci = 0; ci < 2; ci++) {
                    const int i = threadIdx.x + 128 * ci;
                    if (i < 2 * dk)
                        qks[i] = qsa_act(fz.act, fmaf(ql[ci], fz.qkv[(i < dk ? 0 : key_dim - dk) + kh * dk + i], qa[ci]));
                }
                float gv;
                qsa_gdn_gate_of(fz.b[h], fz.a[h], gA, gdt, bt, gv);
                decay = expf(gv);
            }
            if (live && p == 0) {
                const float xv = fz.qkv[cv];
                vj = qsa_act(fz.act, fmaf(vl, xv, va));
#pragma unroll
                for (int jj = 0; jj + 1 < QSA_GDN_KC; jj++)
                    if (jj < Kc - 1) st[(qsa_i64)jj * cd + cv] = jj + 2 < Kc ? vr[jj + 1] : xv;
            }
            vj = __shfl_sync(QSA_FULL_MASK, vj, (threadIdx.x & 31) & ~(P - 1)); /* to the column's P lanes */
        }
        asm volatile("cp.async.wait_group 0;" ::: "memory");
        __syncthreads(); /* the slice and q, k in shared memory */
        if (fused && c == 0) { /* the two heads' norms, as qsa_gdn_conv_body's */
            const int wp = threadIdx.x >> 5, ln = threadIdx.x & 31;
            if (wp < 2) qsa_gdn_head_norm(qks + wp * dk, dk, ln, wp == 0 ? 1.0f / sqrtf((float)dk) : 0.0f);
            __syncthreads();
        }
        const float *ts = tile + pos, *qt = qks + p, *kt = qks + dk + p; /* row u: [u * P * cpb], [u * P] */
        float kv = 0.0f;
#pragma unroll 8
        for (int u = 0; u < nu; u++) kv = fmaf(__fmul_rn(ts[(u * P + p) * cpb], decay), kt[u * P], kv);
        for (int m = 1; m < P; m <<= 1) kv += __shfl_xor_sync(QSA_FULL_MASK, kv, m);
        const float d = __fmul_rn(vj - kv, bt);
        float oj = 0.0f;
#pragma unroll 8
        for (int u = 0; u < nu; u++) {
            float *e = tile + (u * P + p) * cpb + pos;
            const float sn = fmaf(kt[u * P], d, __fmul_rn(*e, decay));
            *e = sn;
            oj = fmaf(sn, qt[u * P], oj);
        }
        for (int m = 1; m < P; m <<= 1) oj += __shfl_xor_sync(QSA_FULL_MASK, oj, m);
        if (live && p == 0) o[(qsa_i64)h * dv + j] = oj;
        __syncthreads(); /* the slice updated */
        if (ok) {
            const float *src = tile + r0 * cpb + sc;
            float *dst = s0;
            for (int i = r0; i < dk; i += dr, src += dr * cpb, dst += gstep) {
                if (w == 4) *(float4 *)dst = *(const float4 *)src;
                else if (w == 2) *(float2 *)dst = *(const float2 *)src;
                else *dst = *src;
            }
        }
        if (c + 1 < ncols) __syncthreads(); /* the next column pass copies over the slice */
    }
}
#endif

/* S [nv][dk][dv] fp32 (in/out); q, k [M][nk*dk] (normalised, q scaled); v [M][nv*dv];
 * beta, g [M][nv]; o [M][nv*dv] out.  Value head h uses key head h / (nv/nk).  dk <= 512.
 * Launch: grid (nv, Y), block B (multiple of 32), no dynamic shared memory (any given is unused).
 * Recommended: Y = ceil(dv / (B/P)) with B = 128: P lanes per column (4 for dk <= 128), so
 * nv*dv*P/128 blocks.  Any (Y, B) gives the same bits (64 <= B when dk > 256: the staging; B <= 256:
 * ~190 registers per thread). */
#if QSA_IN_PART(2)
extern "C" __global__ void qsa_k_gdn_recurrent(float *S, const float *__restrict__ q, const float *__restrict__ k,
                                               const float *__restrict__ v, const float *__restrict__ beta,
                                               const float *__restrict__ g, float *o, int M, int nk, int nv, int dk,
                                               int dv) {
    QSA_PDL_ENTRY();
    K2_GDN_STAGING;
    if (dk == 4 * K2_GDN_ROWS) k2_gdn_recurrent<false, K2_GDN_PF, false, 4>(stg, S, 0, q, k, v, beta, g, o, M, nk, nv, dk, dv);
    else k2_gdn_recurrent<false>(stg, S, 0, q, k, v, beta, g, o, M, nk, nv, dk, dv);
}
#endif

/* The same with the state stored as fp16 [nv][dk][dv] (the "fp16 state" comparison option). */
#if QSA_IN_PART(6)
extern "C" __global__ void qsa_k_gdn_recurrent_f16state(qsa_f16 *S, const float *__restrict__ q,
                                                        const float *__restrict__ k, const float *__restrict__ v,
                                                        const float *__restrict__ beta, const float *__restrict__ g,
                                                        float *o, int M, int nk, int nv, int dk, int dv) {
    QSA_PDL_ENTRY();
    K2_GDN_STAGING;
    if (dk == 4 * K2_GDN_ROWS) k2_gdn_recurrent<true, K2_GDN_PF, false, 4>(stg, 0, S, q, k, v, beta, g, o, M, nk, nv, dk, dv);
    else k2_gdn_recurrent<true>(stg, 0, S, q, k, v, beta, g, o, M, nk, nv, dk, dv);
}
#endif

/* Gated RMSNorm per value head, in place: o = w * (o / sqrt(mean(o^2) + eps)) * act(z).
 *   o [M][nv*dv] fp32 (in/out); z [M][nv*dv]; w [dv] plain weight; o16 (optional)
 *   receives the fp16 copy for out_proj.  act: 0 silu, 1 sigmoid.
 * Launch: grid (M*nv), block 128. */
/* The q and k channels' conv state advance of a decode step whose conv ran inside the recurrence's launch
   (qsa_gdn_fuse): sequence b's rows [Kc - 1][conv_dim] shift up by one, its input row's channel last; channel
   h * blockDim.x + threadIdx.x < kd2 (= 2 key_dim <= nv blockDim.x, the host checks; traps otherwise) of
   value head h's block.  The recurrence has read the rows when this launch's wait returns. */
typedef struct {
    const unsigned long long *st; /* [B]: sequence b's conv state; NULL: nothing to advance */
    const float *qkv;             /* [B][conv_dim]: the in_proj_qkv rows */
    int conv_dim, Kc, kd2;
} qsa_gdn_shift;
#if QSA_IN_PART(1)
extern "C" __global__ void __launch_bounds__(128) qsa_k_gdn_norm_gate(float *o, const float *__restrict__ z,
                                                                      const float *__restrict__ w, qsa_f16 *o16,
                                                                      int nv, int dv, float eps, int act,
                                                                      qsa_gdn_shift sh) {
    QSA_PDL_LATE();
    __shared__ float scratch[33];
    long long row = blockIdx.x;
    /* (sh.st) this thread's channel's new rows before the wait (the old ones are read by the recurrence alone,
       the input row was written before it), stored after */
    float nr[QSA_GDN_KC - 1];
    float *cs = 0;
    const int b = (int)(row / nv), ch = (int)(row - (long long)b * nv) * blockDim.x + threadIdx.x,
              cd = sh.conv_dim, Kc = sh.Kc;
    if (sh.st) {
        if (Kc < 1 || Kc > QSA_GDN_KC || sh.kd2 > nv * (int)blockDim.x) __trap();
        cs = (float *)sh.st[b];
#pragma unroll
        for (int jj = 0; jj + 1 < QSA_GDN_KC; jj++)
            nr[jj] = ch < sh.kd2 && jj < Kc - 1 ? (jj + 2 < Kc ? cs[(qsa_i64)(jj + 1) * cd + ch] : sh.qkv[(qsa_i64)b * cd + ch]) : 0.0f;
    }
    float *orow = o + row * dv;
    const float *zrow = z + row * dv;
    /* this thread's first gate value and weight before the wait (z: the GDN input projections, with the
       conv and the recurrence launched between) */
    const bool one = (int)threadIdx.x < dv;
    const float z0 = one ? zrow[threadIdx.x] : 0.0f, w0 = one ? w[threadIdx.x] : 0.0f;
    QSA_PDL_ENTRY();
    float ss = 0.0f;
    for (int i = threadIdx.x; i < dv; i += blockDim.x) ss = fmaf(orow[i], orow[i], ss);
    float inv = 1.0f / sqrtf(qsa_block_sum(ss, scratch) / (float)dv + eps);
    for (int i = threadIdx.x; i < dv; i += blockDim.x) {
        const bool first = i == (int)threadIdx.x;
        float y =
            __fmul_rn(__fmul_rn(first ? w0 : w[i], __fmul_rn(orow[i], inv)), qsa_act(act, first ? z0 : zrow[i]));
        orow[i] = y;
        if (o16) o16[row * dv + i] = qsa_f32_to_f16(y);
    }
    if (cs && ch < sh.kd2)
#pragma unroll
        for (int jj = 0; jj + 1 < QSA_GDN_KC; jj++)
            if (jj < Kc - 1) cs[(qsa_i64)jj * cd + ch] = nr[jj];
}
#endif

/* ============================================================================================== */
/* QSA: projections' epilogues, block keys, scores, selection                                      */
/* ============================================================================================== */
/* Paged pools of one QSA layer: K, V fp16 [n_pages][page_size][nkv*hd]; indexer raw keys fp32
 * [n_pages][page_size][ihd].  The sequence's block table bt maps logical page -> physical page;
 * token p lives at (bt[p / page_size], p % page_size).  page_size is any value >= 1. */

/* Per head y of token t = blockIdx.x (heads y = blockIdx.y, blockIdx.y + gridDim.y, ...):
 *   y <  nh : q half of q[t][y] ([q | gate] per head, row nh*2*hd): q_norm (1+w), RoPE at pos0+t, in place
 *   y >= nh : KV head y-nh: K = RoPE(k_norm(k_in)), stored fp16 in Kpool; V stored fp16 in Vpool.
 * k_in, v_in [M][nkv*hd]; qn, kn [hd] fp32 weights; inv_freq [rd/2]; rd <= hd <= 1024.
 * Launch: grid (M, Y) with any Y (nh + nkv: one block per head), block 128.  (The body: heads y0, y0 +
 * ys, ... of token blockIdx.x.) */
static __device__ __forceinline__ void qsa_attn_qk_prep_body(
    float *q, const float *__restrict__ k_in, const float *__restrict__ v_in, const float *__restrict__ qn,
    const float *__restrict__ kn, const float *__restrict__ inv_freq, const int *__restrict__ bt, qsa_f16 *Kpool,
    qsa_f16 *Vpool, int pos0, int M, int nh, int nkv, int hd, int rd, int page_size, float eps, int y0, int ys) {
    __shared__ float xs[K2_MAX_HD];
    __shared__ float scratch[33];
    int t = blockIdx.x;
    if (t >= M) return;
    long long pos = (long long)pos0 + t;
    int kvd = nkv * hd;
    long long slot = (long long)bt[pos / page_size] * page_size + pos % page_size;
    for (int y = y0; y < nh + nkv; y += ys) {
        __syncthreads(); /* xs of the previous head is no longer read */
        if (y < nh) {
            float *qh = q + ((long long)t * nh + y) * 2 * hd;
            for (int i = threadIdx.x; i < hd; i += blockDim.x) xs[i] = qh[i];
            __syncthreads();
            k2_rmsnorm_1p_smem(xs, qn, hd, eps, scratch);
            k2_rope_store(xs, qh, hd, rd, inv_freq, pos);
            continue;
        }
        int h = y - nh;
        const float *kin = k_in + (long long)t * kvd + h * hd;
        const float *vin = v_in + (long long)t * kvd + h * hd;
        qsa_f16 *kout = Kpool + slot * kvd + h * hd, *vout = Vpool + slot * kvd + h * hd;
        for (int i = threadIdx.x; i < hd; i += blockDim.x) {
            xs[i] = kin[i];
            vout[i] = qsa_f32_to_f16(vin[i]);
        }
        __syncthreads();
        k2_rmsnorm_1p_smem(xs, kn, hd, eps, scratch);
        int half = rd / 2;
        for (int i = threadIdx.x; i < hd; i += blockDim.x) {
            float out = xs[i];
            if (i < rd) {
                int p = i < half ? i : i - half;
                float f = __fmul_rn((float)pos, inv_freq[p]);
                float c = (float)cos((double)f), s = (float)sin((double)f);
                float a = xs[p], b = xs[p + half];
                out = i < half ? __fsub_rn(__fmul_rn(a, c), __fmul_rn(b, s)) : __fadd_rn(__fmul_rn(b, c), __fmul_rn(a, s));
            }
            kout[i] = qsa_f32_to_f16(out);
        }
    }
}
#if QSA_IN_PART(1)
extern "C" __global__ void __launch_bounds__(128) qsa_k_attn_qk_prep(
    float *q, const float *__restrict__ k_in, const float *__restrict__ v_in, const float *__restrict__ qn,
    const float *__restrict__ kn, const float *__restrict__ inv_freq, const int *__restrict__ bt, qsa_f16 *Kpool,
    qsa_f16 *Vpool, int pos0, int M, int nh, int nkv, int hd, int rd, int page_size, float eps) {
    QSA_PDL_ENTRY();
    qsa_attn_qk_prep_body(q, k_in, v_in, qn, kn, inv_freq, bt, Kpool, Vpool, pos0, M, nh, nkv, hd, rd, page_size, eps,
                          blockIdx.y, gridDim.y);
}
#endif

/* Indexer epilogue for token t = blockIdx.x, row iq[t] = [ih query heads | 1 raw key] of ihd:
 *   y < ih : q_layernorm (1+w, qln [ihd]) then RoPE (rd dims, rd <= ihd) at pos0+t, in place
 *   y == ih: the raw (un-normed) key is copied to Ipool at the token's slot.
 * Launch: grid (M, Y) with any Y (ih + 1: one block per head), block 128.  (The body: heads y0, y0 + ys, ...) */
static __device__ __forceinline__ void qsa_indexer_prep_body(float *iq, const float *__restrict__ qln,
                                                                     const float *__restrict__ inv_freq,
                                                                     const int *__restrict__ bt, float *Ipool,
                                                                     int pos0, int M, int ih, int ihd, int rd,
                                                                     int page_size, float eps, int y0, int ys) {
    __shared__ float xs[K2_MAX_HD];
    __shared__ float scratch[33];
    int t = blockIdx.x;
    if (t >= M) return;
    long long pos = (long long)pos0 + t;
    for (int y = y0; y <= ih; y += ys) {
        __syncthreads();
        float *row = iq + (long long)t * (ih + 1) * ihd + (long long)y * ihd;
        if (y == ih) {
            long long slot = (long long)bt[pos / page_size] * page_size + pos % page_size;
            for (int i = threadIdx.x; i < ihd; i += blockDim.x) Ipool[slot * ihd + i] = row[i];
            continue;
        }
        for (int i = threadIdx.x; i < ihd; i += blockDim.x) xs[i] = row[i];
        __syncthreads();
        k2_rmsnorm_1p_smem(xs, qln, ihd, eps, scratch);
        k2_rope_store(xs, row, ihd, rd, inv_freq, pos);
    }
}
#if QSA_IN_PART(7)
extern "C" __global__ void __launch_bounds__(128) qsa_k_indexer_prep(float *iq, const float *__restrict__ qln,
                                                                     const float *__restrict__ inv_freq,
                                                                     const int *__restrict__ bt, float *Ipool,
                                                                     int pos0, int M, int ih, int ihd, int rd,
                                                                     int page_size, float eps) {
    QSA_PDL_ENTRY();
    qsa_indexer_prep_body(iq, qln, inv_freq, bt, Ipool, pos0, M, ih, ihd, rd, page_size, eps, blockIdx.y, gridDim.y);
}
#endif

/* Keys of the complete blocks b in [b0, b1): fp32 mean of the r raw keys (ascending, then / r, as
 * the CPU), k_layernorm (1+w, kln [ihd]), RoPE at position b*r.  bkeys [max_blocks][ihd] is the
 * sequence's logical block-key cache (a completed block's key never changes).
 * Launch: grid (b1 - b0), block 128.  (The body: block b0 + bi.) */
static __device__ __forceinline__ void qsa_block_keys_body(const float *__restrict__ Ipool,
                                                                   const int *__restrict__ bt,
                                                                   const float *__restrict__ kln,
                                                                   const float *__restrict__ inv_freq, float *bkeys,
                                                                   int b0, int b1, int r, int ihd, int rd,
                                                                   int page_size, float eps, int bi) {
    __shared__ float xs[K2_MAX_HD];
    __shared__ float scratch[33];
    long long b = (long long)b0 + bi;
    if (b >= b1) return;
    for (int i = threadIdx.x; i < ihd; i += blockDim.x) {
        float s = 0.0f;
        for (int j = 0; j < r; j++) {
            long long p = b * r + j;
            s += Ipool[((long long)bt[p / page_size] * page_size + p % page_size) * ihd + i];
        }
        xs[i] = s / (float)r;
    }
    __syncthreads();
    k2_rmsnorm_1p_smem(xs, kln, ihd, eps, scratch);
    k2_rope_store(xs, bkeys + b * ihd, ihd, rd, inv_freq, b * r);
}
#if QSA_IN_PART(4)
extern "C" __global__ void __launch_bounds__(128) qsa_k_block_keys(const float *__restrict__ Ipool,
                                                                   const int *__restrict__ bt,
                                                                   const float *__restrict__ kln,
                                                                   const float *__restrict__ inv_freq, float *bkeys,
                                                                   int b0, int b1, int r, int ihd, int rd,
                                                                   int page_size, float eps) {
    QSA_PDL_ENTRY();
    qsa_block_keys_body(Ipool, bt, kln, inv_freq, bkeys, b0, b1, r, ihd, rd, page_size, eps, blockIdx.x);
}
#endif

/* Block scores of query t = blockIdx.x (position pos0+t) against its complete blocks
 * b < (pos0+t+1)/r:  score = (sum_h relu(q_h . key_b)) / sqrt(ihd), h ascending; each dot is a
 * fixed lane split (lane owns dims lane, lane+32, ..., ascending) plus the warp butterfly.
 *   iq [M][(ih+1)*ihd] (prepped queries), bkeys [*][ihd], scores [M][ld] out (entries at or past
 *   the query's block count are not written).
 * Launch: grid (M, Y) with any Y (the runtime: for decode a block per 32 block keys, qsa__score_ys),
 * block 256 (a multiple of 32): the Y*8 warps of a query take blocks round robin.  Each score is
 * independent of the launch. */
#define QSA_BS_KC 4 /* key elements per lane in registers (4: the index head of 128) */
static __device__ __forceinline__ void qsa_block_scores_body(const float *__restrict__ iq,
                                                                     const float *__restrict__ bkeys,
                                                                     float *__restrict__ scores, int pos0, int M,
                                                                     int ih, int ihd, int r, int ld) {
    int t = blockIdx.x;
    if (t >= M) return;
    int nb = (int)(((long long)pos0 + t + 1) / r);
    int lane = threadIdx.x & 31, nw = blockDim.x >> 5;
    int w0 = blockIdx.y * nw + (threadIdx.x >> 5), W = gridDim.y * nw;
    const float *qt = iq + (long long)t * (ih + 1) * ihd;
    float root = sqrtf((float)ihd);
    /* four blocks per warp at a time: four independent dot/butterfly chains (same math per score); a
       lane keeps its first QSA_BS_KC elements of each key in registers (all of them for ihd <= 128)
       and reads the rest again per head (the same values in the same order) */
    for (int b0 = w0; b0 < nb; b0 += 4 * W) {
        const float *kb[4];
        float kr[4][QSA_BS_KC], s[4];
#pragma unroll
        for (int u = 0; u < 4; u++) {
            int b = b0 + u * W < nb ? b0 + u * W : b0; /* past the end: recompute b0, not stored */
            kb[u] = bkeys + (long long)b * ihd;
            s[u] = 0.0f;
#pragma unroll
            for (int c = 0; c < QSA_BS_KC; c++) kr[u][c] = lane + 32 * c < ihd ? kb[u][lane + 32 * c] : 0.0f;
        }
        for (int h = 0; h < ih; h++) {
            const float *qh = qt + (long long)h * ihd;
            float p[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
            for (int c = 0; c < QSA_BS_KC; c++) {
                if (lane + 32 * c >= ihd) break;
                float qv = qh[lane + 32 * c];
#pragma unroll
                for (int u = 0; u < 4; u++) p[u] = fmaf(qv, kr[u][c], p[u]);
            }
            for (int c = QSA_BS_KC; lane + 32 * c < ihd; c++) { /* ihd > 32 * QSA_BS_KC */
                float qv = qh[lane + 32 * c];
#pragma unroll
                for (int u = 0; u < 4; u++) p[u] = fmaf(qv, kb[u][lane + 32 * c], p[u]);
            }
#pragma unroll
            for (int u = 0; u < 4; u++) {
                float d = qsa_warp_sum(p[u]);
                s[u] += d > 0.0f ? d : 0.0f;
            }
        }
#pragma unroll
        for (int u = 0; u < 4; u++)
            if (lane == 0 && b0 + u * W < nb) scores[(long long)t * ld + b0 + u * W] = s[u] / root;
    }
}
#if QSA_IN_PART(3)
extern "C" __global__ void __launch_bounds__(256) qsa_k_block_scores(const float *__restrict__ iq,
                                                                     const float *__restrict__ bkeys,
                                                                     float *__restrict__ scores, int pos0, int M,
                                                                     int ih, int ihd, int r, int ld) {
    QSA_PDL_ENTRY();
    qsa_block_scores_body(iq, bkeys, scores, pos0, M, ih, ihd, r, ld);
}
#endif

/* Exclusive prefix sum of one int per thread in thread order (block size a multiple of 32);
   `scratch` holds 33 ints of shared memory. */
static __device__ int k2_block_excl_scan(int v, int *scratch) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    int x = v; /* inclusive scan within the warp */
    for (int off = 1; off < 32; off <<= 1) {
        int y = __shfl_up_sync(QSA_FULL_MASK, x, off);
        if (lane >= off) x += y;
    }
    __syncthreads(); /* scratch may still be read by a previous call */
    if (lane == 31) scratch[warp] = x;
    __syncthreads();
    if (warp == 0) {
        int w = lane < nw ? scratch[lane] : 0;
        for (int off = 1; off < 32; off <<= 1) {
            int y = __shfl_up_sync(QSA_FULL_MASK, w, off);
            if (lane >= off) w += y;
        }
        scratch[lane] = w - (lane < nw ? scratch[lane] : 0); /* exclusive over warps */
    }
    __syncthreads();
    return scratch[warp] + x - v;
}

/* Order-preserving map of a float to uint32 (a > b as floats <=> key(a) > key(b); -0 == +0). */
static __device__ __forceinline__ unsigned k2_order_key(float f) {
    unsigned u = f == 0.0f ? 0u : __float_as_uint(f);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

/* Top-k block selection.  The k-th largest key T is found in three steps, each exact:
 *   1. lo/hi: the minimum and maximum score (a block reduction; min and max are exact in any order);
 *   2. a 1024-bin linear histogram over [lo, hi]: bin(s) = (int)((s - lo) * (1024 / (hi - lo))), both
 *      rounded operations monotone in s, so a higher bin holds only larger scores; the bin holding
 *      the k-th largest key is found by a block scan, and its keys become the candidates;
 *   3. a radix select (8-bit digits from the candidates' first differing bit) over the candidates:
 *      from shared memory when they fit (K2_TOPK_CAP keys), else over the scores in the bin's key range;
 *      up to 32 candidates, a warp's counts instead (k2_small_select).
 * Scores that spread over the bins (the indexer's) cost three passes over the scores with few
 * shared-atomic conflicts, where a radix select from the top bit (the exponent: 2-3 live bins)
 * serialised ~65,000 atomics on a few counters.  All-equal scores, ranges that overflow and ties
 * at the threshold are exact through the same steps (the radix path takes the rest).  The three
 * passes read 16 bytes per load where the scores are 16-byte aligned (k2_ld8), and the compaction
 * after them reads the scores once, keeping its counting pass's ballots for the taking pass
 * (qsa_topk_blocks_body).  (On the H200 at context 262,063, one query, ~65,500 blocks: 49.8 -> 42.4 us
 * per launch, eager; 262K decode 126.1 / 126.3 -> 126.5-128.3 tok/s.) */
#define K2_TOPK_BINS 1024 /* = the block size */
#define K2_TOPK_CAP 2048

typedef struct {
    int hist[256];
    int wcount[33];
    int whist[32 * 257]; /* per-warp radix histograms (rows padded), or the 8 copies of the linear histogram */
    unsigned cand[K2_TOPK_CAP];
    unsigned pick_prefix, kmin, kmax;
    int pick_need, pick_bin, ncand;
    float lo, hi;
} k2_topk_smem;

static __device__ __forceinline__ int k2_lin_bin(float s, float lo, float scale) {
    int b = (int)__fmul_rn(__fsub_rn(s, lo), scale); /* s >= lo: the product is >= 0 */
    return b < K2_TOPK_BINS - 1 ? b : K2_TOPK_BINS - 1;
}

/* The need-th largest key (1 <= need <= the number of keys) among the keys in [kmin, kmax]: from
 * cand[0..n) when cand is not NULL, else from the order keys of sc[0..n) inside that range.  Returns
 * it, and *need becomes the number of keys equal to it that complete the selection. */
static __device__ unsigned k2_radix_select(const float *__restrict__ sc, const unsigned *cand, int n, unsigned kmin,
                                           unsigned kmax, int *need_io, k2_topk_smem *sm) {
    int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    int top = kmin == kmax ? 0 : 32 - __clz(kmin ^ kmax); /* bits below the common prefix */
    unsigned mask = top == 32 ? 0u : ~((1u << top) - 1u), prefix = kmin & mask;
    int need = *need_io;
    while (top > 0) {
        int w = top < 8 ? top : 8, shift = top - w;
        for (int i = tid; i < 32 * 257; i += blockDim.x) sm->whist[i] = 0;
        __syncthreads();
        /* 8 loads in flight per thread; the trip count is uniform, so whole warps take part */
        for (int base = 0; base < n; base += 8 * blockDim.x) {
            unsigned key[8];
#pragma unroll
            for (int u = 0; u < 8; u++) {
                int b = base + u * blockDim.x + tid;
                key[u] = b < n ? (cand ? cand[b] : k2_order_key(sc[b])) : 0u;
            }
#pragma unroll
            for (int u = 0; u < 8; u++) {
                int b = base + u * blockDim.x + tid;
                bool in = b < n && key[u] >= kmin && key[u] <= kmax && (key[u] & mask) == prefix;
                if (in) atomicAdd(&sm->whist[warp * 257 + ((key[u] >> shift) & 255u)], 1); /* the warp's own copy */
            }
        }
        __syncthreads();
        for (int d = tid; d < 256; d += blockDim.x) { /* integer sums: any order gives the same counts */
            int c = 0;
            for (int v = 0; v < (int)(blockDim.x >> 5); v++) c += sm->whist[v * 257 + d];
            sm->hist[d] = c;
        }
        __syncthreads();
        if (warp == 0) { /* the digit d with (count above d) < need <= (count above d) + hist[d] */
            int c[8], tot = 0;
#pragma unroll
            for (int i = 0; i < 8; i++) {
                c[i] = sm->hist[lane * 8 + i];
                tot += c[i];
            }
            int v = tot; /* suffix sum over lanes >= lane */
            for (int off = 1; off < 32; off <<= 1) {
                int x = __shfl_down_sync(QSA_FULL_MASK, v, off);
                if (lane + off < 32) v += x;
            }
            int cum = v - tot; /* keys in the digits of higher lanes */
#pragma unroll
            for (int i = 7; i >= 0; i--) {
                if (cum < need && need <= cum + c[i]) {
                    sm->pick_prefix = prefix | ((unsigned)(lane * 8 + i) << shift);
                    sm->pick_need = need - cum;
                }
                cum += c[i];
            }
        }
        __syncthreads();
        prefix = sm->pick_prefix;
        need = sm->pick_need;
        mask |= ((1u << w) - 1u) << shift;
        top = shift;
    }
    *need_io = need;
    return prefix;
}

/* The need-th largest key (1 <= need <= n <= 32) among cand[0..n), as k2_radix_select returns it (and *need
 * likewise becomes the number of keys equal to it that complete the selection): warp 0 holds a key a lane and
 * counts, for each, the keys above and equal to it (32 shuffles); the lane whose key's rank spans need names it
 * (lanes of equal keys name the same).  For the threshold bin of the indexer's scores, which spread over the
 * linear histogram (a few keys a bin at 2,048 blocks), where the radix select took two or three rounds of
 * four block barriers each.  The whole block calls it. */
static __device__ unsigned k2_small_select(const unsigned *cand, int n, int *need_io, k2_topk_smem *sm) {
    const int lane = threadIdx.x & 31;
    if (threadIdx.x < 32) {
        const unsigned key = lane < n ? cand[lane] : 0u;
        int gt = 0, eq = 0;
        for (int j = 0; j < n; j++) {
            const unsigned kj = __shfl_sync(QSA_FULL_MASK, key, j);
            gt += kj > key;
            eq += kj == key;
        }
        if (lane < n && gt < *need_io && *need_io <= gt + eq) {
            sm->pick_prefix = key;
            sm->pick_need = *need_io - gt;
        }
    }
    __syncthreads();
    *need_io = sm->pick_need;
    return sm->pick_prefix;
}

/* This thread's 8 scores of the span [base, base + 8 blockDim.x) of sc, s[u] at position b[u] (past nb:
   `fill`): two 16-byte loads (vec: sc 16-byte aligned) or 8 strided 4-byte ones.  For the passes that
   need every score once in any order (the range, the histogram, the bin's candidates): the wide loads
   put 4x the bytes in flight per load of the one block. */
static __device__ __forceinline__ void k2_ld8(const float *__restrict__ sc, int nb, int base, bool vec, float fill,
                                              float *s, int *b) {
    if (vec) {
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int b0 = base + 4 * (h * (int)blockDim.x + (int)threadIdx.x);
            if (b0 + 3 < nb) {
                const float4 v = *(const float4 *)(sc + b0);
                s[4 * h] = v.x;
                s[4 * h + 1] = v.y;
                s[4 * h + 2] = v.z;
                s[4 * h + 3] = v.w;
            } else {
#pragma unroll
                for (int j = 0; j < 4; j++) s[4 * h + j] = b0 + j < nb ? sc[b0 + j] : fill;
            }
#pragma unroll
            for (int j = 0; j < 4; j++) b[4 * h + j] = b0 + j;
        }
    } else {
#pragma unroll
        for (int u = 0; u < 8; u++) {
            b[u] = base + u * (int)blockDim.x + (int)threadIdx.x;
            s[u] = b[u] < nb ? sc[b[u]] : fill;
        }
    }
}

/* k2_ld8's 8 scores of the span at base: from s1 / b1 (one: every score in one span, loaded once for the passes,
   with a fill that each pass accepts: a real score, and the passes that need more test b < nb) or loaded. */
static __device__ __forceinline__ void k2_ld8k(bool one, const float *s1, const int *b1, const float *__restrict__ sc,
                                               int nb, int base, bool vec, float fill, float *s, int *b) {
    if (one) {
#pragma unroll
        for (int u = 0; u < 8; u++) {
            s[u] = s1[u];
            b[u] = b1[u];
        }
    } else {
        k2_ld8(sc, nb, base, vec, fill, s, b);
    }
}

/* Top-k blocks of query t = blockIdx.x: k = min(topk, nb) blocks with nb = (pos0+t+1)/r, by score
 * descending, ties to the lower block index (as the CPU qsa__select_blocks), written in ascending
 * block order to sel[t][0..k) (sel[t][k..topk) = -1), nsel[t] = k.
 * O(nb): the threshold key T as above, then a compaction in ascending index order (contiguous
 * chunks per warp, two block-wide exclusive scans) taking every block above T and the
 * lowest-index blocks equal to it.  Scores must not be NaN.
 * Launch: grid (M), block 1024 (= K2_TOPK_BINS). */
static __device__ __forceinline__ void qsa_topk_select(const float *__restrict__ sc, int nb, int k, int *out, k2_topk_smem &sm);
static __device__ __forceinline__ void qsa_topk_blocks_body(const float *__restrict__ scores, int *sel,
                                                                     int *nsel, int pos0, int M, int r, int topk,
                                                                     int ld) {
    __shared__ k2_topk_smem sm;
    int t = blockIdx.x;
    if (t >= M) return;
    int nb = (int)(((long long)pos0 + t + 1) / r);
    int k = topk < nb ? topk : nb;
    const float *sc = scores + (long long)t * ld;
    int *out = sel + (long long)t * topk;
    int tid = threadIdx.x;
    for (int i = k + tid; i < topk; i += blockDim.x) out[i] = -1;
    if (tid == 0) nsel[t] = k;
    if (k == nb) { /* everything is selected */
        for (int b = tid; b < nb; b += blockDim.x) out[b] = b;
        return;
    }
    if (k <= 0) return;
    qsa_topk_select(sc, nb, k, out, sm);
}

/* The k (1 <= k < nb) largest of sc[0..nb) (no NaN), ties to the lower index, their indices written to out[0..k)
 * in ascending order: qsa_topk_blocks_body's selection (above), by the whole block (1024 threads). */
static __device__ __forceinline__ void qsa_topk_select(const float *__restrict__ sc, int nb, int k, int *out, k2_topk_smem &sm) {
    int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    /* 1. lo, hi (up to 8 blockDim.x blocks, 32,768 tokens at r = 4: the scores loaded once for the three passes,
       the fill sc[0]) */
    const bool vec = (((unsigned long long)sc) & 15u) == 0, one = nb <= 8 * (int)blockDim.x;
    float lo = QSA_INF, hi = -QSA_INF, s1[8];
    int b1[8];
    if (one) k2_ld8(sc, nb, 0, vec, sc[0], s1, b1);
    for (int base = 0; base < nb; base += 8 * blockDim.x) {
        float s[8];
        int bi[8];
        k2_ld8k(one, s1, b1, sc, nb, base, vec, sc[0], s, bi);
#pragma unroll
        for (int u = 0; u < 8; u++) {
            lo = fminf(lo, s[u]);
            hi = fmaxf(hi, s[u]);
        }
    }
    for (int m = 16; m > 0; m >>= 1) {
        lo = fminf(lo, __shfl_xor_sync(QSA_FULL_MASK, lo, m));
        hi = fmaxf(hi, __shfl_xor_sync(QSA_FULL_MASK, hi, m));
    }
    if (lane == 0) {
        sm.whist[warp] = __float_as_int(lo);
        sm.whist[32 + warp] = __float_as_int(hi);
    }
    if (tid == 0) sm.ncand = 0;
    __syncthreads();
    if (warp == 0) {
        int nw = blockDim.x >> 5;
        lo = __int_as_float(sm.whist[lane < nw ? lane : 0]);
        hi = __int_as_float(sm.whist[32 + (lane < nw ? lane : 0)]);
        for (int m = 16; m > 0; m >>= 1) {
            lo = fminf(lo, __shfl_xor_sync(QSA_FULL_MASK, lo, m));
            hi = fmaxf(hi, __shfl_xor_sync(QSA_FULL_MASK, hi, m));
        }
        if (lane == 0) {
            sm.lo = lo;
            sm.hi = hi;
            sm.kmin = 0xffffffffu;
            sm.kmax = 0u;
        }
    }
    __syncthreads();
    lo = sm.lo;
    hi = sm.hi;
    unsigned kmin = k2_order_key(lo), kmax = k2_order_key(hi), T;
    int need = k;
    float range = __fsub_rn(hi, lo), scale = __fdiv_rn((float)K2_TOPK_BINS, range);
    if (kmin == kmax) {
        T = kmin; /* all scores equal */
    } else if (range > 0.0f && range < QSA_INF && scale < QSA_INF) {
        /* 2. the linear histogram, 8 copies (warp & 7) */
        for (int i = tid; i < 8 * K2_TOPK_BINS; i += blockDim.x) sm.whist[i] = 0;
        __syncthreads();
        int *hcopy = sm.whist + (warp & 7) * K2_TOPK_BINS;
        for (int base = 0; base < nb; base += 8 * blockDim.x) {
            float s[8];
            int bi[8];
            k2_ld8k(one, s1, b1, sc, nb, base, vec, lo, s, bi);
#pragma unroll
            for (int u = 0; u < 8; u++)
                if (bi[u] < nb) atomicAdd(&hcopy[k2_lin_bin(s[u], lo, scale)], 1);
        }
        __syncthreads();
        int bin = K2_TOPK_BINS - 1 - tid, h = 0; /* thread order = bins descending */
        for (int c = 0; c < 8; c++) h += sm.whist[c * K2_TOPK_BINS + bin];
        int above = k2_block_excl_scan(h, sm.wcount);
        if (above < need && need <= above + h) {
            sm.pick_bin = bin;
            sm.pick_need = need - above;
        }
        __syncthreads();
        bin = sm.pick_bin;
        need = sm.pick_need;
        /* the bin's keys: count, range, and the first K2_TOPK_CAP of them (any order: only their
           multiset is used) */
        unsigned bmin = 0xffffffffu, bmax = 0u;
        for (int base = 0; base < nb; base += 8 * blockDim.x) {
            float s[8];
            int bi[8];
            k2_ld8k(one, s1, b1, sc, nb, base, vec, lo, s, bi);
#pragma unroll
            for (int u = 0; u < 8; u++) {
                bool in = bi[u] < nb && k2_lin_bin(s[u], lo, scale) == bin;
                unsigned key = k2_order_key(s[u]), ball = __ballot_sync(QSA_FULL_MASK, in);
                if (ball == 0u) continue;
                int first = 0;
                if (lane == 0) first = atomicAdd(&sm.ncand, __popc(ball));
                first = __shfl_sync(QSA_FULL_MASK, first, 0) + __popc(ball & ((1u << lane) - 1u));
                if (in) {
                    if (first < K2_TOPK_CAP) sm.cand[first] = key;
                    bmin = min(bmin, key);
                    bmax = max(bmax, key);
                }
            }
        }
        for (int m = 16; m > 0; m >>= 1) {
            bmin = min(bmin, __shfl_xor_sync(QSA_FULL_MASK, bmin, m));
            bmax = max(bmax, __shfl_xor_sync(QSA_FULL_MASK, bmax, m));
        }
        if (lane == 0) {
            atomicMin(&sm.kmin, bmin);
            atomicMax(&sm.kmax, bmax);
        }
        __syncthreads();
        kmin = sm.kmin;
        kmax = sm.kmax;
        int n = sm.ncand;
        /* 3. */
        if (kmin == kmax) T = kmin;
        else if (n <= 32) T = k2_small_select(sm.cand, n, &need, &sm);
        else if (n <= K2_TOPK_CAP) T = k2_radix_select(sc, sm.cand, n, kmin, kmax, &need, &sm);
        else T = k2_radix_select(sc, NULL, nb, kmin, kmax, &need, &sm);
    } else {
        T = k2_radix_select(sc, NULL, nb, kmin, kmax, &need, &sm); /* infinities, or a range that overflows */
    }
    /* compaction: warp w owns the contiguous blocks [w*per, (w+1)*per) (per a multiple of 32) and
       reads them 32 at a time, lane order = block order (coalesced: with a contiguous chunk per
       thread every load of a warp touched 32 cache lines); two block-wide exclusive scans
       of the warps' counts give each warp the number of equal keys and of taken blocks before its
       chunk; a warp takes all its keys > T and its equal keys while fewer than `need` precede them */
    int nw = blockDim.x >> 5, per = ((nb + nw - 1) / nw + 31) & ~31;
    int c0 = warp * per, c1 = c0 + per < nb ? c0 + per : nb;
    int n_gt = 0, n_eq = 0; /* warp-uniform */
    /* the counting pass keeps its ballots (gt and eq per 32 blocks: 2 words) in the histograms' shared
       memory, free by now, when the warp's chunk fits (contexts of up to ~131,000 blocks at 1,024
       threads): the taking pass then reads no score */
    const int wq = (per + 255) / 256 * 16; /* words per warp: 16 per 256 blocks */
    const bool keep = wq * nw <= 32 * 257;
    unsigned *bal = (unsigned *)sm.whist + warp * wq;
    for (int b0 = c0; b0 < c1; b0 += 256) {
        unsigned key[8];
#pragma unroll
        for (int u = 0; u < 8; u++) key[u] = b0 + 32 * u + lane < c1 ? k2_order_key(sc[b0 + 32 * u + lane]) : 0u;
#pragma unroll
        for (int u = 0; u < 8; u++) {
            bool in = b0 + 32 * u + lane < c1;
            const unsigned gt = __ballot_sync(QSA_FULL_MASK, in && key[u] > T),
                           eq = __ballot_sync(QSA_FULL_MASK, in && key[u] == T);
            n_gt += __popc(gt);
            n_eq += __popc(eq);
            if (keep && lane == 0) {
                bal[(b0 - c0) / 16 + 2 * u] = gt;
                bal[(b0 - c0) / 16 + 2 * u + 1] = eq;
            }
        }
    }
    int eq_before = __shfl_sync(QSA_FULL_MASK, k2_block_excl_scan(lane == 0 ? n_eq : 0, sm.wcount), 0);
    int take_eq = need - eq_before < 0 ? 0 : (need - eq_before < n_eq ? need - eq_before : n_eq);
    int at = __shfl_sync(QSA_FULL_MASK, k2_block_excl_scan(lane == 0 ? n_gt + take_eq : 0, sm.wcount), 0);
    const unsigned below = (1u << lane) - 1u;
    __syncwarp(); /* lane 0's ballots are visible to the warp */
    for (int b0 = c0; b0 < c1; b0 += 256) {
        unsigned key[8];
#pragma unroll
        for (int u = 0; u < 8; u++) key[u] = !keep && b0 + 32 * u + lane < c1 ? k2_order_key(sc[b0 + 32 * u + lane]) : 0u;
#pragma unroll
        for (int u = 0; u < 8; u++) {
            int b = b0 + 32 * u + lane;
            unsigned gt = keep ? bal[(b0 - c0) / 16 + 2 * u] : __ballot_sync(QSA_FULL_MASK, b < c1 && key[u] > T);
            unsigned eq = keep ? bal[(b0 - c0) / 16 + 2 * u + 1] : __ballot_sync(QSA_FULL_MASK, b < c1 && key[u] == T);
            while (__popc(eq) > take_eq) eq &= ~(1u << (31 - __clz(eq))); /* the lowest take_eq of them */
            take_eq -= __popc(eq);
            unsigned mask = gt | eq;
            if ((mask >> lane) & 1u) out[at + __popc(mask & below)] = b;
            at += __popc(mask);
        }
    }
}
#if QSA_IN_PART(7)
extern "C" __global__ void __launch_bounds__(1024, 1) qsa_k_topk_blocks(const float *__restrict__ scores, int *sel,
                                                                     int *nsel, int pos0, int M, int r, int topk,
                                                                     int ld) {
    QSA_PDL_ENTRY();
    qsa_topk_blocks_body(scores, sel, nsel, pos0, M, r, topk, ld);
}
#endif

/* ============================================================================================== */
/* sampling candidates                                                                             */
/* ============================================================================================== */

/* A row's sampling parameters (the host's qsa__cand_row, the same layout) */
struct qsa_cand_row {
    float temp, pen; /* temperature (<= 0: greedy, the arg-max alone); the repetition penalty (where pen_n > 0) */
    int k;           /* top-k at temperature > 0: 1 <= k < V, k <= kmax */
    int pen_off, pen_n; /* the row's distinct penalised ids: pid[pen_off .. pen_off + pen_n) */
    int z;           /* a draw over the whole row (no top-k): its k candidates and the row's sum
                        (qsa_k_sample_z), which the host's draw normalises by */
};

/* One term of a whole row's sum (the host's qsa__zterm, the same integer function): about 2^44 e^d, d = t - tmax
 * (t, tmax tempered logits; d <= 0), from -d log2(e) = I + F / 2^32 in 32.32 fixed point (two IEEE operations, then
 * integers): 2^(-F / 2^32) by a table of 16 (F's top 4 bits) and a degree-5 series in 31-bit fixed point, shifted
 * by I. */
static __device__ __forceinline__ qsa_u64 qsa_zterm(float t, float tmax) {
    const float d = __fsub_rn(t, tmax);
    if (!(d > -64.0f)) return 0ull;
    const qsa_i64 y = (qsa_i64)__fmul_rn(__fmul_rn(d, 1.44269504088896341f), 4294967296.0f); /* (truncated) */
    const qsa_u64 zf = (qsa_u64)(-y), I = zf >> 32;
    if (I >= 44) return 0ull;
    const unsigned T[16] = {0x80000000u, 0x7a92be8bu, 0x75606374u, 0x70666f76u, 0x6ba27e65u, 0x6712460bu,
                            0x62b39509u, 0x5e8451d0u, 0x5a82799au, 0x56ac1f75u, 0x52ff6b55u, 0x4f7a9930u,
                            0x4c1bf829u, 0x48e1e9bau, 0x45cae0f2u, 0x42d561b4u};
    const unsigned b[6] = {0x80000000u, 0x58b90bfcu, 0x1ebfbe00u, 0x71ac236u, 0x13b2ab7u, 0x2bb100u};
    const unsigned F = (unsigned)zf, f = F & 0x0fffffffu;
    unsigned acc = b[5];
#pragma unroll
    for (int k = 4; k >= 0; k--) acc = b[k] - __umulhi(acc, f);
    const qsa_u64 R = ((qsa_u64)T[F >> 28] * acc) >> 31;
    return I <= 13 ? R << (13 - I) : R >> (I - 13);
}

#define QSA_CAND_CHUNK 8192 /* ids of a row per block of qsa_k_sample_cand1 (= qsa_topk_select's one-load span) */

/* The device half of qsa_sampler_sample's draw for a greedy or top-k sampler, in two launches (the host's
 * qsa__sampler_from_cand does the rest, on k candidates instead of V logits).  Row b = b0 + blockIdx.y of the M
 * logits rows, stored in vocabulary slices of W columns (the batched step's lm_head: slice c, columns c W ..
 * min(V, (c + 1) W) - 1 of every row, is [M][wc] at c W M floats; W >= V or <= 0: the plain [M][V]), with the row's parameters rp[b],
 * in chunks c = blockIdx.x of QSA_CAND_CHUNK ids (P = gridDim.x of them; part row r = blockIdx.y):
 *   1. the repetition penalty, in place, on each listed id of the chunk: l > 0 ? l / pen : l * pen;
 *   2. NaN -> -inf (not for a greedy row: temperature <= 0); the chunk's largest logit and arg-max (the lowest id
 *      among the largest, NaN never winning: qsa__argmax) into am[r][c];
 *   3. (temperature > 0) the tempered logits l / T into v's row r ([G][V]), and the chunk's top min(k, n) of them,
 *      ties to the lower id (qsa_topk_select: every id of the row's top k is among its chunk's), into cv / ci
 *      [r][c k ..], ids ascending (the chunks in order: the row's candidates in ascending id order).
 * Every step is one IEEE operation of the host's (divisions __fdiv_rn).  Launch: grid (P, rows), block 1024. */
#if QSA_IN_PART(1)
extern "C" __global__ void __launch_bounds__(1024, 1) qsa_k_sample_cand1(float *logits, int V, int W, int M, int b0,
                                                                         const qsa_cand_row *__restrict__ rp,
                                                                         const int *__restrict__ pid, float *v, float *am,
                                                                         float *cv, int *ci, int kmax) {
    QSA_PDL_ENTRY();
    __shared__ k2_topk_smem sm;
    __shared__ float sv[33];
    __shared__ int si[33];
    const int r = blockIdx.y, b = b0 + r, tid = threadIdx.x, P = gridDim.x, c0 = (int)blockIdx.x * QSA_CAND_CHUNK,
              n = min(QSA_CAND_CHUNK, V - c0);
    if (W <= 0 || W > V) W = V;
    const qsa_cand_row q = rp[b];
    const bool greedy = !(q.temp > 0.0f);
    if (blockDim.x != 1024 || n <= 0 || (!greedy && (q.k < 1 || q.k >= V || q.k > kmax))) __trap(); /* the host checks them */
    /* 1. (the ids are distinct: no two threads write one logit) */
    for (int j = tid; j < q.pen_n; j += blockDim.x) {
        const int id = pid[q.pen_off + j];
        if (id < c0 || id >= c0 + n) continue;
        const int s0 = id / W * W, wc = min(W, V - s0);
        float *l = logits + (qsa_i64)s0 * M + (qsa_i64)b * wc + (id - s0);
        const float x = *l;
        *l = x > 0.0f ? __fdiv_rn(x, q.pen) : __fmul_rn(x, q.pen);
    }
    __syncthreads(); /* (the block's global writes are visible to the block after it) */
    /* 2. */
    float *vr = v + (qsa_i64)r * V + c0;
    float bv = QSA_NEG_INF;
    int bi = 0x7fffffff;
    for (int i = tid; i < n; i += blockDim.x) {
        const int id = c0 + i, s0 = id / W * W, wc = min(W, V - s0);
        float x = logits[(qsa_i64)s0 * M + (qsa_i64)b * wc + (id - s0)];
        if (!greedy) x = x != x ? QSA_NEG_INF : x;
        if (qsa_better(x, id, bv, bi)) {
            bv = x;
            bi = id;
        }
        if (!greedy) vr[i] = __fdiv_rn(x, q.temp);
    }
    qsa_block_argmax(&bv, &bi, sv, si); /* (its barriers also make vr visible to the block) */
    if (tid == 0) {
        am[((qsa_i64)r * P + blockIdx.x) * 2] = bv;
        am[((qsa_i64)r * P + blockIdx.x) * 2 + 1] = __int_as_float(bi);
    }
    if (greedy) return;
    /* 3. */
    float *cvr = cv + (qsa_i64)r * P * kmax + (qsa_i64)blockIdx.x * q.k;
    int *cir = ci + (qsa_i64)r * P * kmax + (qsa_i64)blockIdx.x * q.k;
    if (q.k >= n) {
        for (int i = tid; i < n; i += blockDim.x) cir[i] = i;
    } else {
        qsa_topk_select(vr, n, q.k, cir, sm);
    }
    __syncthreads();
    for (int j = tid; j < min(q.k, n); j += blockDim.x) {
        const int i = cir[j];
        cvr[j] = vr[i];
        cir[j] = c0 + i;
    }
}
#endif

/* The whole-row sum of a whole-row draw's row (rp[b].z, temperature > 0), chunk c = blockIdx.x of QSA_CAND_CHUNK ids of
 * part row r = blockIdx.y (b = b0 + r): sum of qsa_zterm(t, tmax) over the chunk's tempered logits t (qsa_k_sample_cand1's
 * v), tmax the row's largest (from am[r], its chunks' largest raw logits: T > 0 keeps the order), into zp[r][c] (an
 * integer sum: the same in any order).  Other rows: nothing.  Launch: grid (P, rows), block 1024. */
#if QSA_IN_PART(1)
extern "C" __global__ void __launch_bounds__(1024, 1) qsa_k_sample_z(int V, int b0, const qsa_cand_row *__restrict__ rp,
                                                                      const float *__restrict__ v,
                                                                      const float *__restrict__ am, qsa_u64 *zp) {
    QSA_PDL_ENTRY();
    __shared__ qsa_u64 sw[32];
    const int r = blockIdx.y, tid = threadIdx.x, P = gridDim.x, c0 = (int)blockIdx.x * QSA_CAND_CHUNK,
              n = min(QSA_CAND_CHUNK, V - c0);
    const qsa_cand_row q = rp[b0 + r];
    if (!q.z || !(q.temp > 0.0f)) return;
    float bv = QSA_NEG_INF;
    for (int c = 0; c < P; c++) bv = fmaxf(bv, am[((qsa_i64)r * P + c) * 2]); /* (NaN is -inf by now) */
    const float tmax = __fdiv_rn(bv, q.temp);
    if (!(fabsf(tmax) < QSA_INF)) return; /* (a degenerate row: the arg-max alone, qsa_k_sample_cand2) */
    const float *vr = v + (qsa_i64)r * V + c0;
    qsa_u64 s = 0ull;
    for (int i = tid; i < n; i += blockDim.x) s += qsa_zterm(vr[i], tmax);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) s += __shfl_down_sync(QSA_FULL_MASK, s, o);
    if ((tid & 31) == 0) sw[tid >> 5] = s;
    __syncthreads();
    if (tid < 32) {
        s = tid < (int)(blockDim.x >> 5) ? sw[tid] : 0ull;
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) s += __shfl_down_sync(QSA_FULL_MASK, s, o);
        if (tid == 0) zp[(qsa_i64)r * P + blockIdx.x] = s;
    }
}
#endif

/* The rows' candidates from qsa_k_sample_cand1's chunks (row b = b0 + blockIdx.x, part row r = blockIdx.x, P chunks):
 * the arg-max and the largest logit lmax of the row from am[r] (exact in any order); a greedy row, or where lmax is
 * -inf or lmax / T infinite (the limit of a vanishing temperature): out[b] = {arg-max, 0}; else the top k of the
 * chunks' candidates (ascending ids, so ties go to the lower id as before), out[b] = {arg-max, k, the k ids in
 * the draw's order, their tempered logits' bits, then the row's sum (qsa_k_sample_z: zp[r], P chunks added in order)
 * as two words, low first, 0 unless rp[b].z}: a row of 4 + 2 kmax words.  The draw's order is the host's
 * qsa__cand_sort's: tempered logit descending (-0 as +0), the lower id first among equals; each thread ranks one
 * candidate against all k (qsa_cand_key: distinct keys, so the ranks are a permutation), and the host draws from the
 * row as it comes.  k <= QSA_CAND_MAX.  Launch: grid (rows), block 1024. */
#define QSA_CAND_MAX 1024 /* the host's QSA__CAND_MAX: at most one candidate per thread of qsa_k_sample_cand2 */
/* the host's qsa__cand_key: ascending keys order the logits descending (-0 as +0), positions i ascending among equals */
static __device__ __forceinline__ qsa_u64 qsa_cand_key(float f, unsigned i) {
    unsigned u = __float_as_uint(f == 0.0f ? 0.0f : f);
    u = u & 0x80000000u ? ~u : u | 0x80000000u;
    return (qsa_u64)~u << 32 | i;
}
#if QSA_IN_PART(1)
extern "C" __global__ void __launch_bounds__(1024, 1) qsa_k_sample_cand2(int V, int b0, int P,
                                                                         const qsa_cand_row *__restrict__ rp,
                                                                         const float *__restrict__ am, const float *cv,
                                                                         const int *__restrict__ ci,
                                                                         const qsa_u64 *__restrict__ zp, int *out, int kmax) {
    QSA_PDL_ENTRY();
    __shared__ union {
        k2_topk_smem t;            /* the selection's */
        qsa_u64 key[QSA_CAND_MAX]; /* then the candidates' keys */
    } sm;
    __shared__ float sv[33];
    __shared__ int si[33];
    const int r = blockIdx.x, b = b0 + r, tid = threadIdx.x;
    const qsa_cand_row q = rp[b];
    const bool greedy = !(q.temp > 0.0f);
    if (blockDim.x != 1024 || (!greedy && q.k > QSA_CAND_MAX)) __trap(); /* (the host checks it) */
    int *o = out + (qsa_i64)b * (4 + 2 * kmax);
    float bv = QSA_NEG_INF;
    int bi = 0x7fffffff;
    for (int c = tid; c < P; c += blockDim.x) {
        const float x = am[((qsa_i64)r * P + c) * 2];
        const int id = __float_as_int(am[((qsa_i64)r * P + c) * 2 + 1]);
        if (qsa_better(x, id, bv, bi)) {
            bv = x;
            bi = id;
        }
    }
    qsa_block_argmax(&bv, &bi, sv, si);
    const int amx = bi == 0x7fffffff ? 0 : bi;
    if (greedy || bv == QSA_NEG_INF || fabsf(__fdiv_rn(bv, q.temp)) == QSA_INF) {
        if (tid == 0) {
            o[0] = amx;
            o[1] = 0;
            o[2 + 2 * kmax] = o[3 + 2 * kmax] = 0;
        }
        return;
    }
    if (tid == 0) { /* (qsa_k_sample_z's chunks, in order) */
        qsa_u64 z = 0ull;
        for (int c = 0; q.z && c < P; c++) z += zp[(qsa_i64)r * P + c];
        o[2 + 2 * kmax] = (int)(unsigned)z;
        o[3 + 2 * kmax] = (int)(unsigned)(z >> 32);
    }
    /* the chunks' candidates: k each, the last min(k, its ids) */
    const int nc = (P - 1) * q.k + min(q.k, V - (P - 1) * QSA_CAND_CHUNK);
    const float *cvr = cv + (qsa_i64)r * P * kmax;
    const int *cir = ci + (qsa_i64)r * P * kmax;
    if (nc != q.k) qsa_topk_select(cvr, nc, q.k, o + 2, sm.t); /* (positions ascending; all nc where nc == k) */
    __syncthreads();
    const int i = tid < q.k ? (nc == q.k ? tid : o[2 + tid]) : 0; /* thread j < k: the j-th by id */
    const qsa_u64 key = qsa_cand_key(cvr[i], (unsigned)tid);
    if (tid < q.k) sm.key[tid] = key;
    __syncthreads(); /* (every thread has read its position) */
    if (tid < q.k) {
        int rank = 0;
        for (int j = 0; j < q.k; j++) rank += sm.key[j] < key;
        o[2 + kmax + rank] = __float_as_int(cvr[i]);
        o[2 + rank] = cir[i];
    }
    if (tid == 0) {
        o[0] = amx;
        o[1] = q.k;
    }
}
#endif

/* ============================================================================================== */
/* QSA sparse attention                                                                            */
/* ============================================================================================== */

/* Debug (SPEC 4.5): the selected tokens of query t = blockIdx.x listed in PHYSICAL order, i.e.
 * sorted by (physical page, offset), as logical positions: tokpos[t][0..ntok).  Passed to
 * qsa_k_sparse_attn, this is the plan order that must break allocation invariance.  Slow by design
 * (O(units^2) ranking in shared memory).  Units are the pieces of each selected range (a block of
 * r tokens, then the tail) within one page; at most K2_PHYS_MAX_UNITS per query: with r <=
 * page_size that is (topk + 1) * 2 <= 2560 (topk <= 1279).  The kernel traps when exceeded.
 * Launch: grid (M), block 256. */
#define K2_PHYS_MAX_UNITS 2560
#if QSA_IN_PART(1)
extern "C" __global__ void __launch_bounds__(256) qsa_k_attn_phys_order(const int *__restrict__ bt,
                                                                        const int *__restrict__ sel,
                                                                        const int *__restrict__ nsel, int *tokpos,
                                                                        int pos0, int M, int r, int topk,
                                                                        int page_size, int ld_tok) {
    QSA_PDL_ENTRY();
    __shared__ long long ustart[K2_PHYS_MAX_UNITS]; /* physical slot of the unit's first token */
    __shared__ int ulog[K2_PHYS_MAX_UNITS];         /* logical position of its first token */
    __shared__ int ulen[K2_PHYS_MAX_UNITS];
    __shared__ int cnt[257];
    int t = blockIdx.x;
    if (t >= M) return;
    long long pos = (long long)pos0 + t;
    int nb = r > 0 ? (int)((pos + 1) / r) : 0;
    int ns = (r > 0 && nsel) ? nsel[t] : 0;
    int nr = ns + 1; /* ranges: ns blocks, then the tail */
    int per = (nr + blockDim.x - 1) / blockDim.x;
    int r0 = threadIdx.x * per, r1 = r0 + per < nr ? r0 + per : nr;
    /* pieces of this thread's ranges */
    int mine = 0;
    for (int i = r0; i < r1; i++) {
        long long a = i < ns ? (long long)sel[(long long)t * topk + i] * r : (long long)nb * r;
        long long e = i < ns ? a + r : pos + 1;
        if (e > a) mine += (int)((e - 1) / page_size - a / page_size + 1);
    }
    cnt[threadIdx.x] = mine;
    __syncthreads();
    if (threadIdx.x == 0) {
        int s = 0;
        for (int i = 0; i < (int)blockDim.x; i++) {
            int c = cnt[i];
            cnt[i] = s;
            s += c;
        }
        cnt[256] = s;
    }
    __syncthreads();
    int nunits = cnt[256];
    if (nunits > K2_PHYS_MAX_UNITS) __trap();
    int u = cnt[threadIdx.x];
    for (int i = r0; i < r1; i++) {
        long long a = i < ns ? (long long)sel[(long long)t * topk + i] * r : (long long)nb * r;
        long long e = i < ns ? a + r : pos + 1;
        while (a < e) {
            long long lp = a / page_size, off = a % page_size;
            long long len = page_size - off < e - a ? page_size - off : e - a;
            ustart[u] = (long long)bt[lp] * page_size + off;
            ulog[u] = (int)a;
            ulen[u] = (int)len;
            u++;
            a += len;
        }
    }
    __syncthreads();
    int *outp = tokpos + (long long)t * ld_tok;
    for (int x = threadIdx.x; x < nunits; x += blockDim.x) {
        long long key = ustart[x];
        int before = 0;
        for (int y = 0; y < nunits; y++) before += ustart[y] < key ? ulen[y] : 0;
        for (int j = 0; j < ulen[x]; j++) outp[before + j] = ulog[x] + j;
    }
}
#endif

#ifndef K2_ATTN_G
#define K2_ATTN_G 4 /* tokens per group of the attention's software pipeline (one group in flight) */
#endif

/* C consecutive fp16 values as raw bits, two per word (vector loads when VEC: p is then 2*C-byte
 * aligned), and their conversion to fp32.  The raw form keeps a prefetched group in C/2 registers. */
template <int C, bool VEC>
static __device__ __forceinline__ void k2_load_raw(unsigned *w, const qsa_f16 *p) {
    if (VEC && C == 8) {
        uint4 u = *(const uint4 *)p;
        w[0] = u.x;
        w[1 % ((C + 1) / 2)] = u.y;
        w[2 % ((C + 1) / 2)] = u.z;
        w[3 % ((C + 1) / 2)] = u.w;
    } else if (VEC && C == 4) {
        uint2 u = *(const uint2 *)p;
        w[0] = u.x;
        w[1 % ((C + 1) / 2)] = u.y;
    } else if (VEC && C == 2) {
        w[0] = *(const unsigned *)p;
    } else {
#pragma unroll
        for (int i = 0; i < (C + 1) / 2; i++)
            w[i] = (unsigned)p[2 * i] | (2 * i + 1 < C ? (unsigned)p[2 * i + 1 < C ? 2 * i + 1 : 0] << 16 : 0u);
    }
}
template <int C>
static __device__ __forceinline__ void k2_raw_f32(float *f, const unsigned *w) {
#pragma unroll
    for (int c = 0; c < C; c++) f[c] = qsa_f16_to_f32((qsa_f16)((w[c >> 1] >> (16 * (c & 1))) & 0xffffu));
}

/* One warp: the online softmax over the selected tokens k0..k1-1 (visit order) of H query heads of
 * one KV head (qh, qh + 2*hd, ...), token after token exactly as the CPU, each head with its own
 * (m, l, acc) and the same arithmetic as when it is computed alone (H only shares the loads and the
 * fp16 conversions of K and V).  Lane owns dims lane*C .. lane*C+C-1 (hd = 32*C).  tsl[kk] (shared
 * memory, kk relative to the round) is the pool slot of visit index kk, found by the whole block
 * before.  Software pipeline: the K and V of the next K2_ATTN_G tokens are in flight (raw fp16 in
 * registers) while the scores and the softmax of the current K2_ATTN_G run, so a warp waits on
 * memory once per split, not once per group; the order of the arithmetic is unchanged.
 * Writes slot + hh*sstride = [m, l, acc[hd]] for head hh. */
template <int C, bool VEC, int H>
static __device__ __noinline__ void k2_attn_split(const float *__restrict__ qh, const qsa_f16 *__restrict__ Kp,
                                     const qsa_f16 *__restrict__ Vp, const int *tsl, int kvd, int kvoff, int k0,
                                     int k1, float scale, float *slot, int sstride, int hd) {
    enum { G = H == 1 ? K2_ATTN_G : 2, W = (C + 1) / 2 }; /* G: when loads are issued, never the arithmetic */
    int lane = threadIdx.x & 31;
    bool live = lane * C < hd; /* false only for lanes past a head narrower than a warp */
    float qr[H][C], acc[H][C], m[H], l[H];
#pragma unroll
    for (int hh = 0; hh < H; hh++) {
#pragma unroll
        for (int c = 0; c < C; c++) {
            qr[hh][c] = live ? qh[hh * 2 * hd + lane * C + c] : 0.0f;
            acc[hh][c] = 0.0f;
        }
        m[hh] = QSA_NEG_INF;
        l[hh] = 0.0f;
    }
    unsigned kr[G][W], vr[G][W]; /* the group being computed */
#pragma unroll
    for (int g = 0; g < G; g++) { /* prologue: the first group (indices past k1 repeat k0: never used) */
        const long long b = (long long)tsl[k0 + (k0 + g < k1 ? g : 0)] * kvd + kvoff + lane * C;
#pragma unroll
        for (int i = 0; i < W; i++) kr[g][i] = vr[g][i] = 0u;
        if (live) {
            k2_load_raw<C, VEC>(kr[g], Kp + b);
            k2_load_raw<C, VEC>(vr[g], Vp + b);
        }
    }
    for (int k = k0; k < k1; k += G) {
        const int n = k1 - k < G ? k1 - k : G, kn = k + G;
        unsigned kq[G][W], vq[G][W]; /* the next group, in flight during this one */
#pragma unroll
        for (int g = 0; g < G; g++) {
#pragma unroll
            for (int i = 0; i < W; i++) kq[g][i] = vq[g][i] = 0u;
            if (live && kn < k1) {
                const long long b = (long long)tsl[kn + (kn + g < k1 ? g : 0)] * kvd + kvoff + lane * C;
                k2_load_raw<C, VEC>(kq[g], Kp + b);
                k2_load_raw<C, VEC>(vq[g], Vp + b);
            }
        }
        float sc[G][H];
#pragma unroll
        for (int g = 0; g < G; g++) {
            float kf[C];
            k2_raw_f32<C>(kf, kr[g]);
#pragma unroll
            for (int hh = 0; hh < H; hh++) {
                float p = 0.0f;
#pragma unroll
                for (int c = 0; c < C; c++) p = fmaf(qr[hh][c], kf[c], p);
                sc[g][hh] = __fmul_rn(qsa_warp_sum(p), scale);
            }
        }
#pragma unroll
        for (int g = 0; g < G; g++) {
            if (g >= n) break;
            float vf[C];
            k2_raw_f32<C>(vf, vr[g]);
#pragma unroll
            for (int hh = 0; hh < H; hh++) {
                const float s = sc[g][hh];
                if (s > m[hh]) { /* online softmax within the split, as qsa__attn_head_plan */
                    float f = expf(__fsub_rn(m[hh], s));
                    l[hh] = __fmul_rn(l[hh], f);
#pragma unroll
                    for (int c = 0; c < C; c++) acc[hh][c] = __fmul_rn(acc[hh][c], f);
                    m[hh] = s;
                }
                float e = expf(__fsub_rn(s, m[hh]));
                l[hh] = __fadd_rn(l[hh], e); /* the rounding explicit: the same bits for every H */
#pragma unroll
                for (int c = 0; c < C; c++) acc[hh][c] = fmaf(e, vf[c], acc[hh][c]);
            }
        }
#pragma unroll
        for (int g = 0; g < G; g++)
#pragma unroll
            for (int i = 0; i < W; i++) {
                kr[g][i] = kq[g][i];
                vr[g][i] = vq[g][i];
            }
    }
#pragma unroll
    for (int hh = 0; hh < H; hh++) {
        float *sl = slot + hh * sstride;
        if (lane == 0) {
            sl[0] = m[hh];
            sl[1] = l[hh];
        }
        if (live)
#pragma unroll
            for (int c = 0; c < C; c++) sl[2 + lane * C + c] = acc[hh][c];
    }
}

/* The weights with which an attention merge takes the next split's (m, l, o) into the running (Mx, Ls,
   o): Ls fa + l fb and o fa + o_split fb (each product rounded, then the sum: no contraction, so the
   same bits in every kernel that merges); returns the new maximum. */
static __device__ __forceinline__ float qsa_attn_merge_w(float Mx, float m, float &fa, float &fb) {
    const float Mn = m > Mx ? m : Mx;
    fa = expf(Mx - Mn);
    fb = expf(m - Mn);
    return Mn;
}
/* Gated sparse attention of query t = blockIdx.x (position pos0+t), query heads h0 .. h0+H-1 with
 * H = nh / gridDim.y and h0 = blockIdx.y * H.
 *
 *   q      [M][nh*2*hd] prepped ([q | gate] per head); out [M][nh*hd] fp32 and/or out16 (fp16)
 *   Kpool, Vpool  this layer's fp16 pages; bt the sequence's block table
 *   sel    [M][topk] ascending selected blocks, nsel [M] their number (qsa_k_topk_blocks);
 *          r = 0 means no indexer: every token 0..pos is attended (sel/nsel not read)
 *   tokpos NULL: logical order (the selected blocks, r tokens each, then the tail nb*r..pos);
 *          else [M][ld_tok] the visit order as logical positions (qsa_k_attn_phys_order: debug)
 * The visit list is cut every `split` (QSA_ATTN_SPLIT = 128) tokens by visit index.  In rounds of
 * nw = blockDim.x/32 splits, warp w computes split round*nw + w ((max, sum, acc) with the CPU's
 * online softmax, scale hd^-0.5) into shared memory, and warp 0 merges them into its running
 * (M, Lsum, o) strictly left to right, as qsa__attn_head_plan; at the end o / Lsum * sigmoid(gate).
 * Nothing depends on other queries, on M, on the block size or on which physical pages hold the
 * tokens.  Requires hd % 32 == 0 and hd <= 256 (else trap; the host validates).
 * GQA: query head h reads KV head h / (nh/nkv).  H heads of one KV head in a block share the loads
 * of K and V (each head's arithmetic is that of the head alone: the same bits for any H).
 * Launch: grid (M, nh / H), block any multiple of 32 up to 512 with H * blockDim.x <= 512; H = 1, or
 * H = 2 when hd is 128 or 256 and 2 divides nh/nkv.  The runtime: 512 threads and H = 1 for few
 * queries (16 splits at once: a decode query's 2048 tokens in one round, its tail in a second), 256 threads and
 * H = 2 for prefill (K and V read once per pair of heads). */
#define K2_ATTN_MAX_WARPS 16
#define K2_ATTN_MAX_SPLIT 256 /* at least the runtime's QSA_ATTN_SPLIT */
static __device__ __forceinline__ void qsa_sparse_attn_body(
    const float *__restrict__ q, const qsa_f16 *__restrict__ Kpool, const qsa_f16 *__restrict__ Vpool,
    const int *__restrict__ bt, const int *__restrict__ sel, const int *__restrict__ nsel, float *out,
    qsa_f16 *out16, int pos0, int M, int nh, int nkv, int hd, int r, int topk, int page_size, int split,
    const int *__restrict__ tokpos, int ld_tok) {
    __shared__ float slots[K2_ATTN_MAX_WARPS][256 + 2];
    __shared__ int tslot[K2_ATTN_MAX_WARPS * K2_ATTN_MAX_SPLIT]; /* pool slot of each visit index of a round */
    const int H = nh / (int)gridDim.y, C = hd < 32 ? 1 : hd / 32; /* C: dims per lane (heads narrower than a warp leave lanes >= hd idle) */
    int t = blockIdx.x, h0 = blockIdx.y * H;
    if ((hd > 32 && hd % 32 != 0) || hd > 256 || H * (int)blockDim.x > 32 * K2_ATTN_MAX_WARPS || split < 1 ||
        split > K2_ATTN_MAX_SPLIT || H < 1 || H > 2 || H * (int)gridDim.y != nh || (nh / nkv) % H != 0 ||
        (H == 2 && C != 4 && C != 8))
        __trap();
    if (t >= M) return;
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    long long pos = (long long)pos0 + t;
    int nb = r > 0 ? (int)((pos + 1) / r) : 0;
    int ns = r > 0 ? nsel[t] : 0;
    int ntok = (int)(ns * (long long)r + (pos + 1 - (long long)nb * r));
    int nsplit = (ntok + split - 1) / split;
    int kvh = h0 / (nh / nkv), kvd = nkv * hd;
    const float *qh = q + ((long long)t * nh + h0) * 2 * hd;
    const int *selq = r > 0 ? sel + (long long)t * topk : sel;
    const int *tokq = tokpos ? tokpos + (long long)t * ld_tok : tokpos;
    float scale = 1.0f / sqrtf((float)hd);
    float Mx = QSA_NEG_INF, Ls = 0.0f, o[8];
#pragma unroll
    for (int c = 0; c < 8; c++) o[c] = 0.0f;
    for (int s0 = 0; s0 < nsplit; s0 += nw) {
        /* the pool slots of this round's visit indices, by the whole block */
        const int t0 = s0 * split, t1 = (s0 + nw) * split < ntok ? (s0 + nw) * split : ntok, nsr = ns * r;
        for (int kk = t0 + (int)threadIdx.x; kk < t1; kk += blockDim.x) {
            long long lp = tokq ? (long long)tokq[kk] : (kk < nsr ? (long long)selq[kk / r] * r + kk % r : (long long)nb * r + (kk - nsr));
            tslot[kk - t0] = (int)((long long)bt[lp / page_size] * page_size + lp % page_size);
        }
        __syncthreads();
        int s = s0 + warp;
        if (s < nsplit) {
            int k0 = s * split - t0, k1 = (k0 + t0) + split < ntok ? k0 + split : ntok - t0;
            float *slot = slots[warp * H]; /* head hh: slots[warp * H + hh] */
#define K2_SPLIT(CC, V) k2_attn_split<CC, V, 1>(qh, Kpool, Vpool, tslot, kvd, kvh * hd, k0, k1, scale, slot, 258, hd)
            if (H == 2) {
                if (C == 8) k2_attn_split<8, true, 2>(qh, Kpool, Vpool, tslot, kvd, kvh * hd, k0, k1, scale, slot, 258, hd);
                else k2_attn_split<4, true, 2>(qh, Kpool, Vpool, tslot, kvd, kvh * hd, k0, k1, scale, slot, 258, hd);
            } else switch (C) {
            case 1: if (hd < 32) K2_SPLIT(1, false); else K2_SPLIT(1, true); break;
            case 2: K2_SPLIT(2, true); break;
            case 3: K2_SPLIT(3, false); break;
            case 4: K2_SPLIT(4, true); break;
            case 5: K2_SPLIT(5, false); break;
            case 6: K2_SPLIT(6, false); break;
            case 7: K2_SPLIT(7, false); break;
            default: K2_SPLIT(8, true); break;
            }
#undef K2_SPLIT
        }
        __syncthreads();
        if (warp < H) { /* warp hh merges head hh's splits of this round left to right: (M, Lsum, o) as qsa__attn_head_plan */
            int n = nsplit - s0 < nw ? nsplit - s0 : nw;
            for (int i = 0; i < n; i++) {
                const float *sl = slots[i * H + warp];
                float fa, fb;
                const float l = sl[1], Mn = qsa_attn_merge_w(Mx, sl[0], fa, fb);
                Ls = __fadd_rn(__fmul_rn(Ls, fa), __fmul_rn(l, fb)); /* no contraction: the same bits in every entry point */
#pragma unroll
                for (int c = 0; c < 8; c++)
                    if (lane + 32 * c < hd) o[c] = __fadd_rn(__fmul_rn(o[c], fa), __fmul_rn(sl[2 + lane + 32 * c], fb));
                Mx = Mn;
            }
        }
        __syncthreads(); /* the slots are free again */
    }
    if (warp >= H) return;
#pragma unroll
    for (int c = 0; c < 8; c++) {
        int d = lane + 32 * c;
        if (d >= hd) break;
        float y = __fmul_rn(o[c] / Ls, qsa_sigmoid(qh[warp * 2 * hd + hd + d]));
        long long at = ((long long)t * nh + h0 + warp) * hd + d;
        if (out) out[at] = y;
        if (out16) out16[at] = qsa_f32_to_f16(y);
    }
}
#if QSA_IN_PART(2)
extern "C" __global__ void __launch_bounds__(512, 1) qsa_k_sparse_attn(
    const float *__restrict__ q, const qsa_f16 *__restrict__ Kpool, const qsa_f16 *__restrict__ Vpool,
    const int *__restrict__ bt, const int *__restrict__ sel, const int *__restrict__ nsel, float *out,
    qsa_f16 *out16, int pos0, int M, int nh, int nkv, int hd, int r, int topk, int page_size, int split,
    const int *__restrict__ tokpos, int ld_tok) {
    QSA_PDL_ENTRY();
    qsa_sparse_attn_body(q, Kpool, Vpool, bt, sel, nsel, out, out16, pos0, M, nh, nkv, hd, r, topk, page_size, split, tokpos, ld_tok);
}
#endif

/* Decode attention spread over the splits (one query per sequence): block (s, y) computes split s
 * (visit indices s*split .. s*split+split-1, as qsa_sparse_attn_body cuts them) of the HB = nh /
 * gridDim.y query heads y*HB .. y*HB+HB-1 (HB divides nh / nkv, so they share KV head g), HW = 1 or
 * 2 heads per warp (blockDim.x = 32 HB / HW), with the split's K and V staged in shared memory by
 * the whole block in chunks of K2_DEC_T tokens (cp.async, the next chunk in flight, on sm_80+), so
 * the HB heads share one read of them and a warp never waits on global memory between tokens, and
 * a warp's heads share its fp16 -> fp32 conversions.  Each head's arithmetic is k2_attn_split's:
 * every score the same lane partials (C dims in order) summed in qsa_warp_sum's order (all of a
 * chunk's at once, k2_warp_sums), then the online softmax token after token, its running max, rescale
 * factors and exponentials worked out lane-parallel per (head, token) and broadcast: the same
 * operations on the same values.  Written as [m, l, acc[hd]] to part [nh][smax][hd + 2];
 * qsa_k_sparse_attn_merge, the next launch, merges each head's splits left to right as
 * qsa_sparse_attn_body's warp 0 does (a thread per output element) and writes out / out16.  So the
 * bits of qsa_k_sparse_attn whatever HB and HW (tested), with nsplit * nh / HB blocks instead of nh.
 * (Until the fifty-second session the block that completed a row, by a ticket, merged its heads'
 * splits alone: the serial tail the tensor-core form lost in the fifty-first.)
 * Requires hd 128 or 256 (C = hd / 32 of 4 or 8), r >= 1, split <= 256 (else trap; the host uses
 * qsa_k_sparse_attn otherwise).  smax >= the splits of any query: (topk r + r - 1) / split rounded
 * up (blocks past a query's splits return at once). */
#define K2_DEC_T 16 /* tokens per staged chunk */
static __device__ __forceinline__ void k2_cp16(void *dst, const void *src) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(qsa_smem_u32(dst)), "l"(src) : "memory");
#else
    *(uint4 *)dst = *(const uint4 *)src;
#endif
}
static __device__ __forceinline__ void k2_cp_commit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.commit_group;" ::: "memory");
#endif
}
/* waits until at most `pending` (0 or 1) committed groups of this thread are in flight */
static __device__ __forceinline__ void k2_cp_wait(int pending) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    if (pending) asm volatile("cp.async.wait_group 1;" ::: "memory");
    else asm volatile("cp.async.wait_group 0;" ::: "memory");
#else
    (void)pending;
#endif
}
/* The warp sums of N (16 or 32) values v[0..N-1] at once, each the value qsa_warp_sum gives (at
   offset o = 16, 8, .., 1 a lane adds lane (i ^ o)'s partial to its own), but at each offset a lane
   keeps only the half of the values it still holds that its lane bit o picks, adding the partner's
   copy of them, and sends the other half: N - 1 shuffles in all (N = 16: one more at offset 1)
   instead of 5 N.  On return v[0] of lane i is the sum of value i >> (5 - log2 N). */
template <int n> /* one offset o of k2_warp_sums with n values still held (n = 1: a plain add) */
static __device__ __forceinline__ void k2_warp_sums_at(float *v, int o) {
    if (n == 1) {
        v[0] += __shfl_xor_sync(QSA_FULL_MASK, v[0], o);
        return;
    }
    /* the choice by bits, not by a conditional on the array's elements (which the compiler may turn
       into a choice of addresses and so put v in local memory) */
    const int hi = (threadIdx.x & o) ? -1 : 0;
#pragma unroll
    for (int j = 0; j < n / 2; j++) {
        const int a = __float_as_int(v[j]), b = __float_as_int(v[j + n / 2]);
        const float keep = __int_as_float((a & ~hi) | (b & hi)), send = __int_as_float((b & ~hi) | (a & hi));
        v[j] = keep + __shfl_xor_sync(QSA_FULL_MASK, send, o);
    }
}
template <int N>
static __device__ __forceinline__ void k2_warp_sums(float *v) {
    k2_warp_sums_at<N>(v, 16);
    k2_warp_sums_at<N / 2>(v, 8);
    k2_warp_sums_at<N / 4>(v, 4);
    k2_warp_sums_at<N / 8>(v, 2);
    k2_warp_sums_at<(N / 16 > 1 ? N / 16 : 1)>(v, 1);
}
/* One warp's HW heads over a staged chunk of cnt (<= K2_DEC_T) tokens (Kc, Vc: [token][HD] fp16),
   continuing their online softmax (m, l, acc), with k2_attn_split's arithmetic per head.  FULL: cnt
   is K2_DEC_T (no bounds tests).  Lane owns dims lane*C .. lane*C+C-1. */
template <int C, int HW, bool FULL>
static __device__ __forceinline__ void k2_attn_dec_chunk(const qsa_f16 *Kc, const qsa_f16 *Vc, int cnt, float scale,
                                                         const float (&qr)[HW][C], float (&acc)[HW][C], float (&m)[HW],
                                                         float (&l)[HW]) {
    enum { HD = 32 * C, W = C / 2, T = K2_DEC_T, N = HW * T, LS = 32 / N };
    const int lane = threadIdx.x & 31;
    /* each lane's partial dot products (its C dims, in order) of every (head, token), value hw * T + t,
       summed across the warp by k2_warp_sums (tokens past cnt give 0 and are never used); with two
       heads the first offset's exchange pairs the heads of one token, so it is done as the token's
       partials are made (16 values live, not 32) */
    float p[HW == 2 ? T : N];
    const int hi = (lane & 16) ? -1 : 0;
#pragma unroll
    for (int t = 0; t < T; t++) {
        float d[HW];
#pragma unroll
        for (int hw = 0; hw < HW; hw++) d[hw] = 0.0f;
        if (FULL || t < cnt) {
            unsigned w[W];
            float kf[C];
            k2_load_raw<C, true>(w, Kc + t * HD + lane * C);
            k2_raw_f32<C>(kf, w);
#pragma unroll
            for (int hw = 0; hw < HW; hw++)
#pragma unroll
                for (int c = 0; c < C; c++) d[hw] = fmaf(qr[hw][c], kf[c], d[hw]);
        }
        if (HW == 2) { /* k2_warp_sums_at<32>(.., 16) for values t and T + t */
            const int a = __float_as_int(d[0]), b = __float_as_int(d[HW - 1]);
            const float keep = __int_as_float((a & ~hi) | (b & hi)), send = __int_as_float((b & ~hi) | (a & hi));
            p[t] = keep + __shfl_xor_sync(QSA_FULL_MASK, send, 16);
        } else {
            p[t] = d[0];
        }
    }
    if (HW == 2) {
        k2_warp_sums_at<16>(p, 8);
        k2_warp_sums_at<8>(p, 4);
        k2_warp_sums_at<4>(p, 2);
        k2_warp_sums_at<2>(p, 1);
    } else {
        k2_warp_sums<(HW == 2 ? T : N)>(p); /* (HW == 2: never; keeps p in bounds) */
    }
    /* Lane-parallel online softmax bookkeeping (k2_attn_split's, token after token, per head): the
       running max before token t is the max of the head's max before the chunk and its scores
       0..t-1 (a strict > keeps the earlier of equal values and never takes a NaN, as the sequential
       update; tokens past cnt count as -inf), so every lane works out for its (head, token) = value
       lane / LS the rescale flag, the factor f = exp(m - s) and e = exp(s - m'), broadcast below. */
    const int my_t = (lane / LS) % T, my_hw = lane / LS / T;
    const float sv = __fmul_rn(p[0], scale);
    float mb = m[0];
#pragma unroll
    for (int hw = 1; hw < HW; hw++)
        if (my_hw == hw) mb = m[hw];
    const bool ok = FULL || my_t < cnt;
    float x = ok && sv == sv ? sv : QSA_NEG_INF; /* the inclusive max over tokens 0..t */
#pragma unroll
    for (int d = 1; d < T; d <<= 1) {
        const float y = __shfl_up_sync(QSA_FULL_MASK, x, d * LS);
        if (my_t >= d && !(x > y)) x = y;
    }
    float mp = __shfl_up_sync(QSA_FULL_MASK, x, LS); /* over tokens 0..t-1 */
    if (my_t == 0 || !(mp > mb)) mp = mb;
    const bool up = ok && sv > mp;
    const float mt = up ? sv : mp, fv = expf(__fsub_rn(mp, sv)), ev = expf(__fsub_rn(sv, mt));
    const unsigned ups = __ballot_sync(QSA_FULL_MASK, up);
#pragma unroll
    for (int t = 0; t < T; t++) {
        if (!FULL && t >= cnt) break;
        unsigned w[W];
        float vf[C];
        k2_load_raw<C, true>(w, Vc + t * HD + lane * C);
        k2_raw_f32<C>(vf, w);
#pragma unroll
        for (int hw = 0; hw < HW; hw++) {
            const int src = (hw * T + t) * LS;
            /* both broadcasts outside the branch: a shuffle under a condition the compiler cannot
               prove warp-uniform is compiled as a collective loop */
            const float f = __shfl_sync(QSA_FULL_MASK, fv, src), e = __shfl_sync(QSA_FULL_MASK, ev, src);
            if (ups >> src & 1u) { /* a new max: rescale, as k2_attn_split */
                l[hw] = __fmul_rn(l[hw], f);
#pragma unroll
                for (int c = 0; c < C; c++) acc[hw][c] = __fmul_rn(acc[hw][c], f);
            }
            l[hw] = __fadd_rn(l[hw], e);
#pragma unroll
            for (int c = 0; c < C; c++) acc[hw][c] = fmaf(e, vf[c], acc[hw][c]);
        }
    }
#pragma unroll
    for (int hw = 0; hw < HW; hw++) /* the max after the chunk: that of its last token */
        m[hw] = __shfl_sync(QSA_FULL_MASK, mt, (hw * T + T - 1) * LS);
}
template <int C, int HW>
static __device__ void k2_attn_dec_body(const float *__restrict__ q, const qsa_f16 *__restrict__ Kpool,
                                        const qsa_f16 *__restrict__ Vpool, const int *__restrict__ bt,
                                        const int *__restrict__ selq, int ns, long long pos, int nh, int nkv, int r,
                                        int page_size, int split, float *part, int smax,
                                        qsa_f16 *kv, int *tsl) {
    enum { HD = 32 * C };
#define K2_KV(buf, isv, tok) (kv + ((((buf) * 2 + (isv)) * K2_DEC_T + (tok)) * HD)) /* [buffer][K, V][token][dim] */
    const int NQ = nh / nkv, HB = nh / (int)gridDim.y, s = blockIdx.x, tid = threadIdx.x, bd = blockDim.x;
    const int lane = tid & 31, warp = tid >> 5, h0 = blockIdx.y * HB + warp * HW, g = h0 / NQ, kvd = nkv * HD;
    if (nh % nkv || HB > K2_ATTN_MAX_WARPS || (int)bd * HW != 32 * HB || NQ % HB || HB * (int)gridDim.y != nh ||
        r < 1 || split < 1 || split > K2_ATTN_MAX_SPLIT)
        __trap();
    const int nb = (int)((pos + 1) / r), nsr = ns * r;
    const int ntok = (int)(nsr + (pos + 1 - (long long)nb * r)), nsplit = (ntok + split - 1) / split;
    if (nsplit > smax) __trap();
    const float scale = 1.0f / sqrtf((float)HD);
    if (s >= nsplit) return; /* past this query's splits */
    const int k0 = s * split, n = min(ntok - k0, split);
    for (int kk = tid; kk < n; kk += bd) {
        const int v = k0 + kk;
        const long long lp = v < nsr ? (long long)selq[v / r] * r + v % r : (long long)nb * r + (v - nsr);
        tsl[kk] = (int)((long long)bt[lp / page_size] * page_size + lp % page_size);
    }
    __syncthreads();
    float qr[HW][C], acc[HW][C], m[HW], l[HW];
#pragma unroll
    for (int hw = 0; hw < HW; hw++) {
        m[hw] = QSA_NEG_INF;
        l[hw] = 0.0f;
#pragma unroll
        for (int c = 0; c < C; c++) {
            qr[hw][c] = q[(long long)(h0 + hw) * 2 * HD + lane * C + c];
            acc[hw][c] = 0.0f;
        }
    }
    const int nch = (n + K2_DEC_T - 1) / K2_DEC_T, pieces = K2_DEC_T * 2 * (HD / 8);
    for (int c0 = -1; c0 < nch; c0++) {
        if (c0 + 1 < nch) { /* stage chunk c0 + 1 (its buffer was last read in chunk c0 - 1) */
            const int base = (c0 + 1) * K2_DEC_T, buf = (c0 + 1) & 1;
            for (int i = tid; i < pieces; i += bd) {
                const int tok = i / (2 * (HD / 8)), rem = i % (2 * (HD / 8)), isv = rem / (HD / 8), pc = rem % (HD / 8);
                if (base + tok < n)
                    k2_cp16(K2_KV(buf, isv, tok) + pc * 8,
                            (isv ? Vpool : Kpool) + (long long)tsl[base + tok] * kvd + (long long)g * HD + pc * 8);
            }
            k2_cp_commit();
        }
        if (c0 < 0) continue;
        k2_cp_wait(c0 + 1 < nch);
        __syncthreads(); /* chunk c0 is in shared memory for every warp */
        const int buf = c0 & 1, cnt = min(K2_DEC_T, n - c0 * K2_DEC_T);
        if (cnt == K2_DEC_T) k2_attn_dec_chunk<C, HW, true>(K2_KV(buf, 0, 0), K2_KV(buf, 1, 0), cnt, scale, qr, acc, m, l);
        else k2_attn_dec_chunk<C, HW, false>(K2_KV(buf, 0, 0), K2_KV(buf, 1, 0), cnt, scale, qr, acc, m, l);
        __syncthreads(); /* every warp is done with this buffer before it is staged again */
    }
#pragma unroll
    for (int hw = 0; hw < HW; hw++) {
        float *sl = part + ((long long)(h0 + hw) * smax + s) * (HD + 2);
        if (lane == 0) {
            sl[0] = m[hw];
            sl[1] = l[hw];
        }
#pragma unroll
        for (int c = 0; c < C; c++) sl[2 + lane * C + c] = acc[hw][c];
    }
#undef K2_KV
}
/* the entry points' shared memory (one allocation for both head widths) and the dispatch on hd and
   on the heads per warp (HB = nh / gridDim.y heads per block over blockDim.x / 32 warps) */
#define K2_DEC_CALL(...)                                                                                    \
    do {                                                                                                    \
        __shared__ __align__(16) qsa_f16 kv_[2 * 2 * K2_DEC_T * 256];                                        \
        __shared__ int tsl_[K2_ATTN_MAX_SPLIT];                                                             \
        const bool two_ = (int)blockDim.x * 2 == 32 * (nh / (int)gridDim.y);                                \
        if (hd == 256 && two_) k2_attn_dec_body<8, 2>(__VA_ARGS__, kv_, tsl_);                              \
        else if (hd == 256) k2_attn_dec_body<8, 1>(__VA_ARGS__, kv_, tsl_);                                 \
        else if (hd == 128 && two_) k2_attn_dec_body<4, 2>(__VA_ARGS__, kv_, tsl_);                         \
        else if (hd == 128) k2_attn_dec_body<4, 1>(__VA_ARGS__, kv_, tsl_);                                 \
        else __trap();                                                                                      \
    } while (0)
/* One query (M = 1) at position pos0: q [nh][2 hd], sel [topk], nsel [1].  part [nh][smax][hd + 2]
 * fp32 scratch (out: qsa_k_sparse_attn_merge's, the next launch).  Launch: grid (smax, nh / HB),
 * block 32 HB (a head per warp) or 16 HB (two; HB even) with HB dividing nh / nkv, at most 384 threads
 * (the launch bound, for 80 registers: 2 blocks of 12 warps or 4 of 6 per SM on sm_90). */
#if QSA_IN_PART(1)
extern "C" __global__ void __launch_bounds__(384, 2) qsa_k_sparse_attn_dec(
    const float *__restrict__ q, const qsa_f16 *__restrict__ Kpool, const qsa_f16 *__restrict__ Vpool,
    const int *__restrict__ bt, const int *__restrict__ sel, const int *__restrict__ nsel, int pos0, int nh, int nkv,
    int hd, int r, int page_size, int split, float *part, int smax) {
    QSA_PDL_ENTRY();
    K2_DEC_CALL(q, Kpool, Vpool, bt, sel, nsel[0], (long long)pos0, nh, nkv, r, page_size, split, part, smax);
}
#endif

/* ============================================================================================== */
/* Batched decode: one token of each of B sequences in one launch                                  */
/* ============================================================================================== */
/* Sequence b = blockIdx.z (grid z = B).  Each kernel below runs, for its token, the body of the
 * single-sequence kernel (the qsa_<op>_body functions above, shared with the qsa_k_<op> entry points)
 * with M = 1, pos0 = pos[b], the sequence's block table / state, and pointers to row b of the
 * per-token arrays: the arithmetic of every value is that of feeding the token alone, whatever the
 * other sequences of the batch, their number or the token's slot (batch invariance, SPEC 4.3).
 * Everything that changes from step to step (positions, block-table and state pointers) is read
 * from device arrays, and every grid depends only on B and the model, so a captured CUDA graph
 * stays valid while the host rewrites those arrays between replays.
 *   pos  [B] int: the token's position (the sequence's length before this step)
 *   bts  [B] device pointers (as 64-bit integers) to each sequence's block table (int [pages])
 *   st   [B] device pointers to the sequence's state of this layer (conv, S, PLE conv or block keys)
 * Per-token rows are those of the single-sequence kernels with t = b. */

#define QSA_BPTR(T, arr) ((T *)(arr)[blockIdx.z])

/* A decode step's attention epilogues, one launch (what qsa_k_attn_qk_prep, qsa_k_indexer_prep and
 * qsa_k_block_keys do for the token, each block one of their blocks' work: the same bits).  Block y of
 * sequence b = blockIdx.z:
 *   y < nh + nkv: qsa_attn_qk_prep_body's head y (q in place; K and V into the pools);
 *   with the indexer (iq != NULL), y = nh + nkv + i: i < ih, indexer query head i (in place); i == ih, the
 *     token's raw indexer key into Ipool, then (after the block's barrier: its own stores) the key of
 *     the block the token completes, if any: blocks [pos / r, (pos + 1) / r), at most one, into the
 *     sequence's block keys bkeys[b] (qsa_block_keys_body; the block's other r - 1 raw keys were
 *     written by earlier steps).
 * This replaced three launches per QSA layer and step (the indexer's two after the q/k prep).
 * Launch: grid (1, nh + nkv (+ ih + 1 with the indexer), B), block 128. */
#if QSA_IN_PART(5)
extern "C" __global__ void __launch_bounds__(128) qsa_k_attn_prep_batch(
    float *q, const float *__restrict__ k_in, const float *__restrict__ v_in, const float *__restrict__ qn,
    const float *__restrict__ kn, const float *__restrict__ inv_freq, const unsigned long long *__restrict__ bts,
    qsa_f16 *Kpool, qsa_f16 *Vpool, const int *__restrict__ pos, int nh, int nkv, int hd, int rd, int page_size,
    float eps, float *iq, const float *__restrict__ qln, const float *__restrict__ kln, float *Ipool,
    const unsigned long long *__restrict__ bkeys, int ih, int ihd, int r) {
    QSA_PDL_ENTRY();
    const qsa_i64 b = blockIdx.z, kvd = (qsa_i64)nkv * hd;
    const int y = blockIdx.y, p = pos[b];
    const int *bt = QSA_BPTR(const int, bts);
    if (y < nh + nkv) {
        qsa_attn_qk_prep_body(q + b * nh * 2 * hd, k_in + b * kvd, v_in + b * kvd, qn, kn, inv_freq, bt, Kpool, Vpool, p,
                              1, nh, nkv, hd, rd, page_size, eps, y, nh + nkv);
        return;
    }
    const int i = y - nh - nkv;
    if (!iq || i > ih) return;
    if (r < 1) __trap(); /* (the host passes the indexer with its ratio) */
    qsa_indexer_prep_body(iq + b * (ih + 1) * ihd, qln, inv_freq, bt, Ipool, p, 1, ih, ihd, rd, page_size, eps, i,
                          ih + 1);
    if (i < ih) return;
    __syncthreads(); /* the raw key just stored */
    qsa_block_keys_body(Ipool, bt, kln, inv_freq, QSA_BPTR(float, bkeys), p / r, (p + 1) / r, r, ihd, rd, page_size, eps,
                        0);
}
#endif

/* scores [B][ld].  Launch: grid (1, Y, B) with any Y (qsa__score_ys of max_blocks: an upper bound fixed
 * by the model, so the grid does not depend on the positions; warps past a query's blocks idle).
 * A query with at most topk blocks selects all of them (qsa_k_topk_blocks_batch reads no score):
 * its scores are not computed. */
#if QSA_IN_PART(6)
extern "C" __global__ void __launch_bounds__(256) qsa_k_block_scores_batch(
    const float *__restrict__ iq, const unsigned long long *__restrict__ bkeys, float *__restrict__ scores,
    const int *__restrict__ pos, int ih, int ihd, int r, int ld, int topk) {
    QSA_PDL_ENTRY();
    const qsa_i64 b = blockIdx.z;
    if ((pos[b] + 1) / r <= topk) return;
    qsa_block_scores_body(iq + b * (ih + 1) * ihd, QSA_BPTR(const float, bkeys), scores + b * ld, pos[b], 1, ih, ihd, r,
                          ld);
}
#endif

/* sel [B][topk], nsel [B].  Launch: grid (1, 1, B), block 1024. */
#if QSA_IN_PART(1)
extern "C" __global__ void __launch_bounds__(1024, 1) qsa_k_topk_blocks_batch(
    const float *__restrict__ scores, int *sel, int *nsel, const int *__restrict__ pos, int r, int topk, int ld) {
    QSA_PDL_ENTRY();
    const qsa_i64 b = blockIdx.z;
    qsa_topk_blocks_body(scores + b * ld, sel + b * topk, nsel + b, pos[b], 1, r, topk, ld);
}
#endif

/* Logical visit order only (the physical-order debug switch is not batched).
 * Launch: grid (1, nh, B), block 256. */
#if QSA_IN_PART(5)
extern "C" __global__ void __launch_bounds__(512, 1) qsa_k_sparse_attn_batch(
    const float *__restrict__ q, const qsa_f16 *__restrict__ Kpool, const qsa_f16 *__restrict__ Vpool,
    const unsigned long long *__restrict__ bts, const int *__restrict__ sel, const int *__restrict__ nsel, float *out,
    qsa_f16 *out16, const int *__restrict__ pos, int nh, int nkv, int hd, int r, int topk, int page_size, int split) {
    QSA_PDL_ENTRY();
    const qsa_i64 b = blockIdx.z, o = b * nh * hd;
    qsa_sparse_attn_body(q + b * nh * 2 * hd, Kpool, Vpool, QSA_BPTR(const int, bts), sel + b * topk, nsel + b,
                         out ? out + o : out, out16 ? out16 + o : out16, pos[b], 1, nh, nkv, hd, r, topk, page_size,
                         split, 0, 0);
}
#endif

/* qsa_k_sparse_attn_dec for sequence b = blockIdx.z: part [B][nh][smax][hd + 2].
 * Launch: grid (smax, nh / HB, B), block 32 HB or 16 HB as qsa_k_sparse_attn_dec. */
#if QSA_IN_PART(2)
extern "C" __global__ void __launch_bounds__(384, 2) qsa_k_sparse_attn_dec_batch(
    const float *__restrict__ q, const qsa_f16 *__restrict__ Kpool, const qsa_f16 *__restrict__ Vpool,
    const unsigned long long *__restrict__ bts, const int *__restrict__ sel, const int *__restrict__ nsel,
    const int *__restrict__ pos, int nh, int nkv, int hd, int r, int topk, int page_size, int split, float *part,
    int smax) {
    QSA_PDL_ENTRY();
    const qsa_i64 b = blockIdx.z;
    K2_DEC_CALL(q + b * nh * 2 * hd, Kpool, Vpool, QSA_BPTR(const int, bts), sel + b * topk, nsel[b], (long long)pos[b], nh,
                nkv, r, page_size, split, part + b * nh * smax * (hd + 2), smax);
}
#endif

/* ============================================================================================== */
/* Sparse attention on the tensor cores (sm_80+)                                                   */
/* ============================================================================================== */
/* One query's G = nh / nkv heads of KV head g = blockIdx.y over its selected tokens, visited as
 * qsa_sparse_attn_body visits them (ascending logical order, the debug visit list when tokpos is
 * given) and cut every K3_SPLIT (= QSA_ATTN_SPLIT, 128) visit indices.  A split's arithmetic, fixed
 * whatever the launch (so prefill, a one-token feed and batched decode give the same bits):
 *   - q is split into fp16 hi = fp16(q) and lo = fp16(q - hi) (K and V are fp16 already, so the
 *     products lose nothing but lo's last bits); a score is the mma m16n8k16 chain over the head's
 *     dims in 16-dim steps from 0 up, at each step hi then lo, accumulated in fp32 from zero; then
 *     times hd^-0.5 (a NaN or a token past the split counts as -inf);
 *   - m = the split's largest score (exact in any order); p = exp(score - m) (0 when m is -inf), split
 *     the same way into fp16 hi and lo;
 *   - l and every output dim are mma chains over the split's tokens in 16-token steps from 0 up (hi
 *     then lo at each step), l against a column of ones, the outputs against V;
 *   - the splits' (m, l, o) merge left to right as qsa_sparse_attn_body merges them, then o / l times
 *     sigmoid(gate).
 * Rows of the mma are independent, so the padding rows (heads G..15, zero) change nothing.  Against
 * the fp32 kernels above: the same visit order and splits, the scores and sums in another order (the
 * CPU tolerance of the tests holds).
 * Block: 4 warps.  Warp w computes the scores of the split's tokens 32 w .. 32 w + 31 and the outputs
 * of dims 64 v + 16 w .. 64 v + 16 w + 15 of every 64-dim slice v (so each score and output is one
 * warp's chain: the same bits for any number of warps).  K then V pass through shared memory in
 * slices of K3_SLT tokens x hd (cp.async, two or three slices in flight, the next split's first ones
 * while this one ends; the K slices scored in pairs: k3_scores), q (hi, lo) and the split's p (hi, lo)
 * are staged there for ldmatrix.
 * Two forms by gridDim.x: 1 — the block runs all the query's splits, merging each into registers as
 * it ends (prefill); smax — block x runs split x and writes its threads' (m, l, o) fragments to part
 * [nkv][smax][128][K3_PW(hd)], and qsa_k_sparse_attn_merge, the next launch, merges them in the same
 * order, a thread per output element (decode: more blocks per query). */
#define K3_SPLIT 128
#define K3_SLT 32   /* tokens per staged slice (of K, then of V): 4 + 4 slices per split */
#define K3_RING 4   /* slices in the ring (the loop's staging schedule: two or three in flight) */
#define K3_PW(hd) ((hd) / 8 + 4) /* floats of a thread's partial: its o fragments, m and l of its two rows */
#define K3_QLD 264  /* q rows and slice rows: up to 256 dims + 8 halves (ldmatrix rows on distinct banks) */
#define K3_PLD 136  /* p rows: 128 tokens + 8 */
#define K3_SMEM_BYTES 98304 /* the dynamic shared memory a launch gives (the host's QSA__ATTN_TC_SMEM) */
typedef struct k3_smem {
    qsa_f16 ring[K3_RING][K3_SLT * K3_QLD];
    qsa_f16 q[2][16 * K3_QLD]; /* hi, lo */
    qsa_f16 p[2][16 * K3_PLD]; /* hi, lo */
    int tsl[2][K3_SPLIT];      /* the pool slots of a split's visit indices (this split's and the next one's) */
    float wmax[4][16];
} k3_smem;
#if QSA_CPA
extern __shared__ __align__(16) unsigned char k3_dyn[];
static __device__ __forceinline__ void qsa_ldsm4t(qsa_u32 a, qsa_u32 *r) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a)
                 : "memory");
}
/* the pool slots of split s's visit indices into tsl, by the whole block */
static __device__ __forceinline__ void k3_slots(int *tsl, int s, int ntok, const int *__restrict__ tokq,
                                                const int *__restrict__ selq, int r, int nsr, int nb,
                                                const int *__restrict__ bt, int page_size) {
    const int k0 = s * K3_SPLIT, n = min(ntok - k0, K3_SPLIT);
    for (int kk = threadIdx.x; kk < n; kk += blockDim.x) {
        const int v = k0 + kk;
        const int lp = tokq ? tokq[v] : v < nsr ? selq[v / r] * r + v % r : nb * r + (v - nsr);
        tsl[kk] = bt[lp / page_size] * page_size + lp % page_size;
    }
}
/* slice z of a split (z < 4: K of its tokens 32 z .. 32 z + 31; else V of tokens 32 (z - 4) ..; tokens
   past n zero) into the ring buffer at dst, one cp.async group (committed even when empty, so that
   the groups in flight count slices) */
template <int HD>
static __device__ __forceinline__ void k3_stage(qsa_u32 dst, const int *tsl, int n, int z, const qsa_f16 *Kpool,
                                                const qsa_f16 *Vpool, int kvd, int g) {
    enum { PT = HD / 8 }; /* 16-byte pieces per token */
    if (z < 2 * K3_SPLIT / K3_SLT) {
        const qsa_f16 *src = (z < K3_SPLIT / K3_SLT ? Kpool : Vpool) + (long long)g * HD;
        const int t0 = K3_SLT * (z % (K3_SPLIT / K3_SLT));
#pragma unroll
        for (int j = 0; j < K3_SLT * PT / 128; j++) {
            const int i = (int)threadIdx.x + 128 * j, tok = i / PT, pc = i % PT;
            const bool ok = t0 + tok < n;
            qsa_cp16z(dst + (qsa_u32)(tok * K3_QLD + 8 * pc) * 2, ok ? src + (long long)tsl[t0 + tok] * kvd + 8 * pc : src, ok);
        }
    }
    asm volatile("cp.async.commit_group;" ::: "memory");
}
/* The scores of one 8-token group of a K slice (its B operand at kb0) against q (hi at qa, lo at qa + qlo)
   into s0: the chain over the head's dims in 16-dim steps, hi then lo; TWO: a second group (kb1) into
   s1 beside it, the two chains' mma interleaved (q's fragments loaded once; each chain's order unchanged) */
template <int KS, bool TWO>
static __device__ __forceinline__ void k3_scores(qsa_u32 qa, qsa_u32 qlo, qsa_u32 kb0, qsa_u32 kb1, float *s0, float *s1) {
#pragma unroll
    for (int kp = 0; kp < KS / 2; kp++) {
        qsa_u32 ah0[4], al0[4], ah1[4], al1[4], b[4], c[4];
        qsa_ldsm4(qa + 64 * kp, ah0);
        qsa_ldsm4(qa + qlo + 64 * kp, al0);
        qsa_ldsm4(qa + 64 * kp + 32, ah1);
        qsa_ldsm4(qa + qlo + 64 * kp + 32, al1);
        qsa_ldsm4(kb0 + 64 * kp, b);
        if (TWO) qsa_ldsm4(kb1 + 64 * kp, c);
        qsa_mma16816(s0, ah0, b[0], b[1]);
        if (TWO) qsa_mma16816(s1, ah0, c[0], c[1]);
        qsa_mma16816(s0, al0, b[0], b[1]);
        if (TWO) qsa_mma16816(s1, al0, c[0], c[1]);
        qsa_mma16816(s0, ah1, b[2], b[3]);
        if (TWO) qsa_mma16816(s1, ah1, c[2], c[3]);
        qsa_mma16816(s0, al1, b[2], b[3]);
        if (TWO) qsa_mma16816(s1, al1, c[2], c[3]);
    }
}
/* (Mx, Ls, ro) of row half rr <- the next split's (m, l, o), as qsa_sparse_attn_body's merge */
template <int NT>
static __device__ __forceinline__ void k3_merge(float &Mx, float &Ls, float (&ro)[NT][4], int rr, float m, float l,
                                                const float (&o)[NT][4]) {
    float fa, fb;
    const float Mn = qsa_attn_merge_w(Mx, m, fa, fb);
    Ls = __fadd_rn(__fmul_rn(Ls, fa), __fmul_rn(l, fb));
#pragma unroll
    for (int nt = 0; nt < NT; nt++)
#pragma unroll
        for (int e = 0; e < 2; e++) ro[nt][2 * rr + e] = __fadd_rn(__fmul_rn(ro[nt][2 * rr + e], fa), __fmul_rn(o[nt][2 * rr + e], fb));
    Mx = Mn;
}
template <int HD>
static __device__ __forceinline__ void k3_attn_body(const float *__restrict__ q, const qsa_f16 *__restrict__ Kpool,
                                                    const qsa_f16 *__restrict__ Vpool, const int *__restrict__ bt,
                                                    const int *__restrict__ selq, int ns, long long pos,
                                                    const int *__restrict__ tokq, float *out, qsa_f16 *out16, int nh,
                                                    int nkv, int r, int page_size, float *part, int smax) {
    enum { NZ = 2 * K3_SPLIT / K3_SLT, NK = K3_SPLIT / K3_SLT, NT = HD / 32, KS = HD / 16 };
    QSA_CT_CHECK(NK == 4 && K3_RING == 4); /* (the staging schedule in the loop below) */
    k3_smem &sm = *(k3_smem *)k3_dyn;
    const int tid = threadIdx.x, lane = tid & 31, w = tid >> 5, g = blockIdx.y, G = nh / nkv, kvd = nkv * HD;
    if (blockDim.x != 128 || G > 16 || nh % nkv || r < 0 || (part && (int)gridDim.x != smax) || (!part && gridDim.x != 1))
        __trap();
    const int nb = r > 0 ? (int)((pos + 1) / r) : 0, nsr = ns * r;
    const int ntok = (int)(nsr + (pos + 1 - (long long)nb * r)), nsplit = (ntok + K3_SPLIT - 1) / K3_SPLIT;
    if (part && nsplit > smax) __trap();
    const int sb = part ? (int)blockIdx.x : 0, se = part ? min((int)blockIdx.x + 1, nsplit) : nsplit;
    if (part && sb >= nsplit && !(nsplit == 0 && sb == 0)) return; /* past the query's splits */
    /* q of the G heads loaded (all of a thread's loads in flight: they and the slots' look-ups are the
       block's first latency), the first split's slots and slices in flight, then q into shared memory
       as fp16 hi and lo (rows G..15 zero) */
    enum { QJ = 16 * HD / 4 / 128 };
    const float *qg = q + (long long)g * G * 2 * HD;
    float4 qx[QJ];
#pragma unroll
    for (int j = 0; j < QJ; j++) {
        const int i = 4 * (tid + 128 * j), row = i / HD, d = i % HD;
        qx[j] = row < G ? *(const float4 *)(qg + (long long)row * 2 * HD + d) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
    const qsa_u32 ring = qsa_smem_u32(sm.ring[0]), RB = K3_SLT * K3_QLD * 2;
    if (sb < se) {
        k3_slots(sm.tsl[0], sb, ntok, tokq, selq, r, nsr, nb, bt, page_size);
        __syncthreads();
        const int n0 = min(ntok - sb * K3_SPLIT, K3_SPLIT);
#pragma unroll
        for (int z = 0; z < K3_RING - 1; z++) k3_stage<HD>(ring + z * RB, sm.tsl[0], n0, z, Kpool, Vpool, kvd, g);
    }
#pragma unroll
    for (int j = 0; j < QJ; j++) {
        const int i = 4 * (tid + 128 * j), row = i / HD, d = i % HD;
        const float x[4] = {qx[j].x, qx[j].y, qx[j].z, qx[j].w};
        qsa_u32 hi2[2], lo2[2];
#pragma unroll
        for (int e = 0; e < 4; e += 2) {
            const qsa_f16 h0 = qsa_f32_to_f16(x[e]), h1 = qsa_f32_to_f16(x[e + 1]);
            const qsa_f16 l0 = qsa_f32_to_f16(__fsub_rn(x[e], qsa_f16_to_f32(h0)));
            const qsa_f16 l1 = qsa_f32_to_f16(__fsub_rn(x[e + 1], qsa_f16_to_f32(h1)));
            hi2[e / 2] = (qsa_u32)h0 | (qsa_u32)h1 << 16;
            lo2[e / 2] = (qsa_u32)l0 | (qsa_u32)l1 << 16;
        }
        *(uint2 *)&sm.q[0][row * K3_QLD + d] = make_uint2(hi2[0], hi2[1]);
        *(uint2 *)&sm.q[1][row * K3_QLD + d] = make_uint2(lo2[0], lo2[1]);
    }
    const float scale = 1.0f / sqrtf((float)HD);
    const int r0 = lane >> 2, cq = 2 * (lane & 3);
    /* ldmatrix lane addresses: A rows lane % 16 at column 8 (lane / 16); K rows (B of the scores) token
       8 w + lane % 8 at dim 8 (lane / 8); V rows (B of the outputs, transposed) token lane % 8 + 8 (lane / 8
       % 2) at dim HD / 4 w + 8 (lane / 16) */
    const qsa_u32 qa = qsa_smem_u32(&sm.q[0][(lane & 15) * K3_QLD + 8 * (lane >> 4)]), qlo = 16 * K3_QLD * 2;
    const qsa_u32 pa = qsa_smem_u32(&sm.p[0][(lane & 15) * K3_PLD + 8 * (lane >> 4)]), plo = 16 * K3_PLD * 2;
    const qsa_u32 kb = (qsa_u32)((8 * w + (lane & 7)) * K3_QLD + 8 * (lane >> 3)) * 2;
    const qsa_u32 vb = (qsa_u32)(((lane & 7) + 8 * ((lane >> 3) & 1)) * K3_QLD + HD / 4 * w + 8 * (lane >> 4)) * 2;
    const qsa_u32 ONES = 0x3C003C00u;
    float Mx[2] = {QSA_NEG_INF, QSA_NEG_INF}, Ls[2] = {0.0f, 0.0f}, ro[NT][4];
    float o[NT][4], sc[NK][4], lacc[4], mrow[2];
#pragma unroll
    for (int nt = 0; nt < NT; nt++)
#pragma unroll
        for (int e = 0; e < 4; e++) ro[nt][e] = 0.0f;
    for (int s = sb; s < se; s++) {
        const int tb = (s - sb) & 1, n = min(ntok - s * K3_SPLIT, K3_SPLIT);
        const bool more = s + 1 < se;
        const int n1 = more ? min(ntok - (s + 1) * K3_SPLIT, K3_SPLIT) : 0;
#pragma unroll
        for (int z = 0; z < NZ; z++) {
            asm volatile("cp.async.wait_group %0;" ::"n"(K3_RING - 2) : "memory"); /* slice z is in */
            if (z == 0 && more) k3_slots(sm.tsl[tb ^ 1], s + 1, ntok, tokq, selq, r, nsr, nb, bt, page_size);
            __syncthreads(); /* slice z is in for every thread; the buffers of the slices computed before are free */
            { /* slice j of a split lives in buffer j % K3_RING; step z stages: 0 slice 3; 2 slices 4 and 5; 4
                 slices 6 and 7; 5, 6, 7 the next split's 0, 1, 2 — nothing at 1 and 3, where the pair of K slices
                 being scored still holds the buffers (an empty group keeps the groups counting slices) */
                const int za0 = z == 0 ? K3_RING - 1 : z <= NK ? z + 2 : z + K3_RING - 1;
                const int nza = z == 0 || z > NK ? 1 : (z & 1) ? 0 : 2;
                if (!nza) k3_stage<HD>(ring, sm.tsl[tb], n, NZ, Kpool, Vpool, kvd, g);
#pragma unroll
                for (int i = 0; i < nza; i++) {
                    const int za = za0 + i;
                    if (za < NZ) k3_stage<HD>(ring + (za % K3_RING) * RB, sm.tsl[tb], n, za, Kpool, Vpool, kvd, g);
                    else k3_stage<HD>(ring + (za % K3_RING) * RB, sm.tsl[tb ^ 1], n1, more ? za - NZ : NZ, Kpool, Vpool, kvd, g);
                }
            }
            const qsa_u32 cur = ring + (z % K3_RING) * RB;
            if (z < NK) {
                if (z & 1) { /* scores of tokens 32 j + 8 w .. + 7 of slices j = z - 1 and z: two chains interleaved */
                    const qsa_u32 prv = ring + ((z - 1) % K3_RING) * RB;
#pragma unroll
                    for (int e = 0; e < 4; e++) sc[z - 1][e] = sc[z][e] = 0.0f;
                    if (K3_SLT * z + 8 * w < n) k3_scores<KS, true>(qa, qlo, prv + kb, cur + kb, sc[z - 1], sc[z]);
                    else if (K3_SLT * (z - 1) + 8 * w < n) k3_scores<KS, false>(qa, qlo, prv + kb, 0, sc[z - 1], sc[z]);
                }
                if (z == NK - 1) { /* the split's max, p = exp(score - m) as fp16 hi and lo */
                    float mx0 = QSA_NEG_INF, mx1 = QSA_NEG_INF;
#pragma unroll
                    for (int j = 0; j < NK; j++)
#pragma unroll
                        for (int e = 0; e < 4; e++) {
                            float v = __fmul_rn(sc[j][e], scale);
                            if (K3_SLT * j + 8 * w + cq + (e & 1) >= n || v != v) v = QSA_NEG_INF;
                            sc[j][e] = v;
                            if (e < 2) mx0 = fmaxf(mx0, v);
                            else mx1 = fmaxf(mx1, v);
                        }
#pragma unroll
                    for (int o2 = 1; o2 <= 2; o2 <<= 1) {
                        mx0 = fmaxf(mx0, __shfl_xor_sync(QSA_FULL_MASK, mx0, o2));
                        mx1 = fmaxf(mx1, __shfl_xor_sync(QSA_FULL_MASK, mx1, o2));
                    }
                    if ((lane & 3) == 0) {
                        sm.wmax[w][r0] = mx0;
                        sm.wmax[w][r0 + 8] = mx1;
                    }
                    __syncthreads();
                    mrow[0] = fmaxf(fmaxf(sm.wmax[0][r0], sm.wmax[1][r0]), fmaxf(sm.wmax[2][r0], sm.wmax[3][r0]));
                    mrow[1] = fmaxf(fmaxf(sm.wmax[0][r0 + 8], sm.wmax[1][r0 + 8]), fmaxf(sm.wmax[2][r0 + 8], sm.wmax[3][r0 + 8]));
#pragma unroll
                    for (int j = 0; j < NK; j++)
#pragma unroll
                        for (int rr = 0; rr < 2; rr++) {
                            qsa_u32 hi2 = 0, lo2 = 0;
#pragma unroll
                            for (int e = 0; e < 2; e++) {
                                const float m = mrow[rr], v = sc[j][2 * rr + e];
                                const float p = m == QSA_NEG_INF ? 0.0f : expf(__fsub_rn(v, m));
                                const qsa_f16 hi = qsa_f32_to_f16(p), lo = qsa_f32_to_f16(__fsub_rn(p, qsa_f16_to_f32(hi)));
                                hi2 |= (qsa_u32)hi << (16 * e);
                                lo2 |= (qsa_u32)lo << (16 * e);
                            }
                            const int at = (r0 + 8 * rr) * K3_PLD + K3_SLT * j + 8 * w + cq;
                            *(qsa_u32 *)&sm.p[0][at] = hi2;
                            *(qsa_u32 *)&sm.p[1][at] = lo2;
                        }
                }
            } else { /* outputs of dims HD / 4 w .. over V tokens 32 (z - NK) .. (two 16-token steps), l with them */
                if (z == NK) {
#pragma unroll
                    for (int nt = 0; nt < NT; nt++)
#pragma unroll
                        for (int e = 0; e < 4; e++) o[nt][e] = 0.0f;
#pragma unroll
                    for (int e = 0; e < 4; e++) lacc[e] = 0.0f;
                }
#pragma unroll
                for (int kh = 0; kh < K3_SLT / 16; kh++) {
                    const int kt = (K3_SLT / 16) * (z - NK) + kh;
                    if (16 * kt >= n) break; /* p and V are zero there */
                    qsa_u32 ph[4], pl[4];
                    qsa_ldsm4(pa + 32 * kt, ph);
                    qsa_ldsm4(pa + plo + 32 * kt, pl);
                    qsa_mma16816(lacc, ph, ONES, ONES);
                    qsa_mma16816(lacc, pl, ONES, ONES);
#pragma unroll
                    for (int np = 0; np < NT / 2; np++) {
                        qsa_u32 b[4];
                        qsa_ldsm4t(cur + vb + (qsa_u32)(kh * 16 * K3_QLD + 16 * np) * 2, b);
                        qsa_mma16816(o[2 * np], ph, b[0], b[1]);
                        qsa_mma16816(o[2 * np], pl, b[0], b[1]);
                        qsa_mma16816(o[2 * np + 1], ph, b[2], b[3]);
                        qsa_mma16816(o[2 * np + 1], pl, b[2], b[3]);
                    }
                }
            }
        }
        /* split s is done: (mrow, l, o) of rows r0 and r0 + 8 */
        const float lrow[2] = {lacc[0], lacc[2]};
        if (!part) {
            k3_merge<NT>(Mx[0], Ls[0], ro, 0, mrow[0], lrow[0], o);
            k3_merge<NT>(Mx[1], Ls[1], ro, 1, mrow[1], lrow[1], o);
            continue;
        }
        { /* this thread's (m, l, o), K3_PW floats, in split s's slot of KV head g */
            float4 *pt = (float4 *)(part + (((long long)g * smax + s) * 128 + tid) * K3_PW(HD));
#pragma unroll
            for (int nt = 0; nt < NT; nt++) pt[nt] = make_float4(o[nt][0], o[nt][1], o[nt][2], o[nt][3]);
            pt[NT] = make_float4(mrow[0], mrow[1], lrow[0], lrow[1]);
        }
        return; /* (qsa_k_sparse_attn_merge merges the splits) */
    }
    if (part) return; /* (no split: the merge writes the outputs) */
#pragma unroll
    for (int rr = 0; rr < 2; rr++) {
        const int row = r0 + 8 * rr;
        if (row >= G) continue;
        const int h = g * G + row;
        float2 gt[NT]; /* the gates, loaded together */
#pragma unroll
        for (int nt = 0; nt < NT; nt++) gt[nt] = *(const float2 *)(q + (long long)h * 2 * HD + HD + HD / 4 * w + 8 * nt + cq);
#pragma unroll
        for (int nt = 0; nt < NT; nt++) {
            const int d = HD / 4 * w + 8 * nt + cq;
            const float y0 = __fmul_rn(ro[nt][2 * rr] / Ls[rr], qsa_sigmoid(gt[nt].x));
            const float y1 = __fmul_rn(ro[nt][2 * rr + 1] / Ls[rr], qsa_sigmoid(gt[nt].y));
            if (out) *(float2 *)(out + (long long)h * HD + d) = make_float2(y0, y1);
            if (out16) *(qsa_u32 *)(out16 + (long long)h * HD + d) = (qsa_u32)qsa_f32_to_f16(y0) | (qsa_u32)qsa_f32_to_f16(y1) << 16;
        }
    }
}
#endif
/* M queries at positions pos0 + t (t = blockIdx.z): q [M][nh][2 hd], sel [M][topk], nsel [M], out
 * [M][nh][hd]; tokpos NULL or [M][ld_tok] the debug visit order (qsa_k_attn_phys_order).  part NULL
 * (gridDim.x 1: out written) or [M][nkv][smax][128][K3_PW(hd)] fp32 scratch (gridDim.x smax >= any query's
 * splits: the splits' partials written, out left to qsa_k_sparse_attn_merge).  hd 128 or 256, nh / nkv <= 16.
 * Launch: grid (1 or smax, nkv, M), block 128, K3_SMEM_BYTES of dynamic shared memory; sm_80+ (traps below). */
#if QSA_IN_PART(4)
extern "C" __global__ void __launch_bounds__(128, 2) qsa_k_sparse_attn_tc(
    const float *__restrict__ q, const qsa_f16 *__restrict__ Kpool, const qsa_f16 *__restrict__ Vpool,
    const int *__restrict__ bt, const int *__restrict__ sel, const int *__restrict__ nsel, float *out, qsa_f16 *out16,
    int pos0, int nh, int nkv, int hd, int r, int topk, int page_size, const int *__restrict__ tokpos, int ld_tok,
    float *part, int smax) {
    QSA_PDL_ENTRY();
#if QSA_CPA
    QSA_CT_CHECK(sizeof(k3_smem) <= K3_SMEM_BYTES);
    const qsa_i64 t = blockIdx.z, o = t * nh * hd;
    const int *selq = r > 0 ? sel + t * topk : sel;
    const int *tokq = tokpos ? tokpos + t * ld_tok : tokpos;
    const int ns = r > 0 ? nsel[t] : 0;
    float *pt = part ? part + t * nkv * smax * 128 * K3_PW(hd) : part;
    if (hd == 128)
        k3_attn_body<128>(q + t * nh * 2 * hd, Kpool, Vpool, bt, selq, ns, (long long)pos0 + t, tokq, out ? out + o : out,
                          out16 ? out16 + o : out16, nh, nkv, r, page_size, pt, smax);
    else if (hd == 256)
        k3_attn_body<256>(q + t * nh * 2 * hd, Kpool, Vpool, bt, selq, ns, (long long)pos0 + t, tokq, out ? out + o : out,
                          out16 ? out16 + o : out16, nh, nkv, r, page_size, pt, smax);
    else
        __trap();
#else
    __trap();
#endif
}
#endif
/* One token of each of B sequences (b = blockIdx.z; pos, bts as the other batched kernels): q [B][nh][2 hd],
 * sel [B][topk], nsel [B], out [B][nh][hd], part [B][nkv][smax][128][K3_PW(hd)] or NULL (as above).
 * Launch: grid (1 or smax, nkv, B), block 128, K3_SMEM_BYTES of dynamic shared memory; sm_80+. */
#if QSA_IN_PART(3)
extern "C" __global__ void __launch_bounds__(128, 2) qsa_k_sparse_attn_tc_batch(
    const float *__restrict__ q, const qsa_f16 *__restrict__ Kpool, const qsa_f16 *__restrict__ Vpool,
    const unsigned long long *__restrict__ bts, const int *__restrict__ sel, const int *__restrict__ nsel, float *out,
    qsa_f16 *out16, const int *__restrict__ pos, int nh, int nkv, int hd, int r, int topk, int page_size, float *part,
    int smax) {
    QSA_PDL_ENTRY();
#if QSA_CPA
    const qsa_i64 b = blockIdx.z, o = b * nh * hd;
    const int *selq = r > 0 ? sel + b * topk : sel;
    const int ns = r > 0 ? nsel[b] : 0;
    float *pt = part ? part + b * nkv * smax * 128 * K3_PW(hd) : part;
    if (hd == 128)
        k3_attn_body<128>(q + b * nh * 2 * hd, Kpool, Vpool, QSA_BPTR(const int, bts), selq, ns, (long long)pos[b], NULL,
                          out ? out + o : out, out16 ? out16 + o : out16, nh, nkv, r, page_size, pt, smax);
    else if (hd == 256)
        k3_attn_body<256>(q + b * nh * 2 * hd, Kpool, Vpool, QSA_BPTR(const int, bts), selq, ns, (long long)pos[b], NULL,
                          out ? out + o : out, out16 ? out16 + o : out16, nh, nkv, r, page_size, pt, smax);
    else
        __trap();
#else
    __trap();
#endif
}
#endif

/* The merge of a split decode attention's partials along its splits, left to right from (-inf, 0, 0) by
 * qsa_attn_merge_w's operations (those of every merge: qsa_sparse_attn_body's, k3_merge), then o / l times
 * sigmoid(gate): per output element what a block that ran all of the query's splits computes for it, so the
 * same bits (gpu/k3_sparse_attn_tc, gpu/k2_sparse_attn_decode_splits).  q, nsel, r, split and the position as
 * the attention launch had them (pos NULL: pos0 + t; else pos[t]).  Two layouts of the partials, a kernel each:
 *   qsa_k_sparse_attn_merge: qsa_k_sparse_attn_dec[_batch]'s, part [T][nh][smax][hd + 2] (m, l, o[hd] of a
 *     (head, split)), a thread per output element: query t = blockIdx.y, head h = blockIdx.x, dim d =
 *     threadIdx.x.  Launch: grid (nh, T), block hd (128 or 256).
 *   qsa_k_sparse_attn_merge_tc: qsa_k_sparse_attn_tc[_batch]'s, part [T][nkv][smax][128][K3_PW(hd)] (split
 *     must be K3_SPLIT, at most 16 query heads per KV head): what fragment thread f of the split's block
 *     left, its o fragments (value j < pw - 4 = hd / 8) then m and l of its two rows.  A thread per partial
 *     value, so that a warp reads 32 consecutive floats of a split (a thread per element read a fragment
 *     thread's 8 values of each 36: four rows of 144 bytes, ~4x the L2 sectors; batch 32 took 17.2 us a QSA
 *     layer for ~10 MB): block (g, t, z) takes values v = 128 z .. 128 z + 127 of KV head g's slab, f = v / pw,
 *     j = v % pw, which for j < hd / 8 is element (row, d) of the mma's fragments: w = f / 32, row = (f % 32)
 *     / 4 + 8 ((j / 2) % 2), d = w hd / 4 + 8 (j / 4) + 2 (f % 4) + j % 2; its row's m and l are f's values
 *     pw - 4 + row / 8 and pw - 2 + row / 8.  Rows past the G = nh / nkv heads of g, and m and l, idle.
 *     Launch: grid (nkv, T, K3_PW(hd)), block 128.
 * (This launch replaced the last split block's merge of all: the tensor-core form's 32 elements per thread,
 * 17 splits in a row, ~38k cycles of a 60k-cycle launch for one decode query on the H200.) */
static __device__ __forceinline__ void qsa_attn_merge_splits(const float *__restrict__ q, const float *pe, long long ss,
                                                             int mo, int lo, int at, int nsplit, long long qi, long long oi,
                                                             float *out, qsa_f16 *out16) {
    float Mx = QSA_NEG_INF, Ls = 0.0f, ro = 0.0f;
    enum { S = 8 }; /* splits loaded ahead of their merges */
    for (int s0 = 0; s0 < nsplit; s0 += S) {
        float ms[S], ls[S], os[S];
#pragma unroll
        for (int i = 0; i < S; i++) {
            const float *ps = pe + (s0 + i) * ss;
            const bool ok = s0 + i < nsplit;
            ms[i] = ok ? ps[mo] : 0.0f;
            ls[i] = ok ? ps[lo] : 0.0f;
            os[i] = ok ? ps[at] : 0.0f;
        }
#pragma unroll
        for (int i = 0; i < S; i++) {
            if (s0 + i >= nsplit) break;
            float fa, fb;
            const float Mn = qsa_attn_merge_w(Mx, ms[i], fa, fb);
            Ls = __fadd_rn(__fmul_rn(Ls, fa), __fmul_rn(ls[i], fb));
            ro = __fadd_rn(__fmul_rn(ro, fa), __fmul_rn(os[i], fb));
            Mx = Mn;
        }
    }
    const float y = __fmul_rn(ro / Ls, qsa_sigmoid(q[qi]));
    if (out) out[oi] = y;
    if (out16) out16[oi] = qsa_f32_to_f16(y);
}
/* query t's splits (its selection and position) */
static __device__ __forceinline__ int qsa_attn_nsplit(const int *__restrict__ nsel, const int *__restrict__ pos, int pos0,
                                                      int t, int r, int split, int smax) {
    const long long p = pos ? (long long)pos[t] : (long long)pos0 + t;
    const int nb = r > 0 ? (int)((p + 1) / r) : 0, ns = r > 0 ? nsel[t] : 0;
    const int ntok = (int)(ns * r + (p + 1 - (long long)nb * r)), nsplit = (ntok + split - 1) / split;
    if (nsplit > smax) __trap();
    return nsplit;
}
#if QSA_IN_PART(7)
extern "C" __global__ void __launch_bounds__(256) qsa_k_sparse_attn_merge(const float *__restrict__ q,
                                                                          const float *__restrict__ part,
                                                                          const int *__restrict__ nsel,
                                                                          const int *__restrict__ pos, int pos0, float *out,
                                                                          qsa_f16 *out16, int nh, int nkv, int hd, int r,
                                                                          int split, int smax) {
    QSA_PDL_ENTRY();
    const int h = blockIdx.x, t = blockIdx.y, d = threadIdx.x;
    if ((hd != 128 && hd != 256) || (int)blockDim.x != hd || nh % nkv || r < 0 || split < 1) __trap();
    const int nsplit = qsa_attn_nsplit(nsel, pos, pos0, t, r, split, smax);
    const long long th = (long long)t * nh + h;
    qsa_attn_merge_splits(q, part + th * smax * (hd + 2), hd + 2, 0, 1, 2 + d, nsplit, th * 2 * hd + hd + d, th * hd + d,
                          out, out16);
}
#endif
#if QSA_IN_PART(5)
extern "C" __global__ void __launch_bounds__(128) qsa_k_sparse_attn_merge_tc(const float *__restrict__ q,
                                                                             const float *__restrict__ part,
                                                                             const int *__restrict__ nsel,
                                                                             const int *__restrict__ pos, int pos0,
                                                                             float *out, qsa_f16 *out16, int nh, int nkv,
                                                                             int hd, int r, int split, int smax) {
    QSA_PDL_ENTRY();
    const int g = blockIdx.x, t = blockIdx.y, G = nh / nkv, pw = K3_PW(hd);
    if ((hd != 128 && hd != 256) || blockDim.x != 128 || nh % nkv || G > 16 || r < 0 || split != K3_SPLIT) __trap();
    const int v = blockIdx.z * 128 + threadIdx.x, f = v / pw, j = v - f * pw;
    if (f >= 128 || j >= pw - 4) return; /* past the slab, or m and l */
    const int rh = (j >> 1) & 1, row = ((f & 31) >> 2) + 8 * rh;
    if (row >= G) return;
    const int d = (f >> 5) * (hd / 4) + 8 * (j >> 2) + 2 * (f & 3) + (j & 1), nsplit = qsa_attn_nsplit(nsel, pos, pos0, t, r, split, smax);
    const long long th = (long long)t * nh + g * G + row;
    qsa_attn_merge_splits(q, part + ((long long)t * nkv + g) * smax * 128 * pw, 128LL * pw, f * pw + pw - 4 + rh,
                          f * pw + pw - 2 + rh, v, nsplit, th * 2 * hd + hd + d, th * hd + d, out, out16);
}
#endif

/* conv state: st, advanced here (one token per sequence); the gates of sequence b: ga's rows b.
   Launch: grid (1, Y, B) with Y as qsa_k_gdn_conv, block 256. */
#if QSA_IN_PART(6)
extern "C" __global__ void __launch_bounds__(256) qsa_k_gdn_conv_batch(
    const float *__restrict__ qkv, const unsigned long long *__restrict__ st, const float *__restrict__ w, float *q,
    float *k, float *v, int conv_dim, int key_dim, int Kc, int act, int nk, int dk, qsa_gdn_gate_args ga) {
    QSA_PDL_ENTRY();
    const qsa_i64 b = blockIdx.z;
    qsa_gdn_gate_args gb = ga;
    if (ga.b) {
        gb.b += b * ga.nv;
        gb.a += b * ga.nv;
        gb.beta += b * ga.nv;
        gb.g += b * ga.nv;
    }
    qsa_gdn_conv_body(qkv + b * conv_dim, QSA_BPTR(float, st), w, q + b * key_dim, k + b * key_dim,
                      v + b * (conv_dim - 2 * key_dim), 1, conv_dim, key_dim, Kc, act, nk, dk, gb, 1);
}
#endif

/* S: st.  Launch: grid (nv, Y, B), block 128, no dynamic shared memory.  K2_GDN_SMEM: k2_gdn_rec_dec, 10
   blocks per SM on sm_90 (batch 32 +0.6% on the H200 against the register form below).  Else the register form,
   bound to six blocks per SM (80 registers, a few spilled, against 128-138 unbounded and three or four
   blocks — batch 32 at the real shape 83.3 -> 66.7 us per layer, batch 8 25.8 -> 21.6 on the H200; five
   blocks: 68.7 and 23.2). */
#if QSA_IN_PART(7)
extern "C" __global__ void __launch_bounds__(128, K2_GDN_SMEM ? 10 : 6)
    qsa_k_gdn_recurrent_batch(const unsigned long long *__restrict__ st, const float *__restrict__ q,
                              const float *__restrict__ k, const float *__restrict__ v, const float *__restrict__ beta,
                              const float *__restrict__ g, float *o, int nk, int nv, int dk, int dv, qsa_gdn_fuse fz) {
    QSA_PDL_LATE(); /* (late: the state's first column pass before the wait; the state was last written by
                       this layer's previous step, the conv launch comes between) */
    const qsa_i64 b = blockIdx.z, kd = (qsa_i64)nk * dk, vd = (qsa_i64)nv * dv;
#if K2_GDN_SMEM
    float *cst = 0;
    if (fz.qkv) { /* sequence b's rows of the fused conv's inputs */
        cst = QSA_BPTR(float, fz.st);
        fz.qkv += b * fz.conv_dim;
        fz.b += b * nv;
        fz.a += b * nv;
    }
    k2_gdn_rec_dec(QSA_BPTR(float, st), q + b * kd, k + b * kd, v + b * vd, beta + b * nv, g + b * nv, o + b * vd, nk, nv,
                   dk, dv, fz, cst);
#else
    if (fz.qkv) __trap(); /* (the host fuses the conv on K2_GDN_SMEM modules only: qsa__gdn_fused) */
    K2_GDN_STAGING;
    k2_gdn_recurrent<false, K2_GDN_PF1, true>(stg, QSA_BPTR(float, st), 0, q + b * kd, k + b * kd, v + b * vd,
                                              beta + b * nv, g + b * nv, o + b * vd, 1, nk, nv, dk, dv);
#endif
}
#endif

#if QSA_IN_PART(5)
extern "C" __global__ void __launch_bounds__(128, 6)
    qsa_k_gdn_recurrent_f16state_batch(const unsigned long long *__restrict__ st, const float *__restrict__ q,
                                       const float *__restrict__ k, const float *__restrict__ v,
                                       const float *__restrict__ beta, const float *__restrict__ g, float *o, int nk,
                                       int nv, int dk, int dv) {
    QSA_PDL_ENTRY();
    const qsa_i64 b = blockIdx.z, kd = (qsa_i64)nk * dk, vd = (qsa_i64)nv * dv;
    K2_GDN_STAGING;
    k2_gdn_recurrent<true, K2_GDN_PF1>(stg, 0, QSA_BPTR(qsa_f16, st), q + b * kd, k + b * kd, v + b * vd, beta + b * nv,
                                       g + b * nv, o + b * vd, 1, nk, nv, dk, dv);
}
#endif

/* PLE conv state: st.  Launch: grid (ceil(hcH / 256), 1, B), block 256. */
#if QSA_IN_PART(2)
extern "C" __global__ void qsa_k_ple_conv_batch(float *__restrict__ X, const float *__restrict__ gv,
                                                const float *__restrict__ gvn,
                                                const unsigned long long *__restrict__ st,
                                                const float *__restrict__ w, int hcH, int Kc, int dil) {
    QSA_PDL_ENTRY();
    const qsa_i64 o = (qsa_i64)blockIdx.z * hcH;
    qsa_ple_conv_body(X + o, gv + o, gvn + o, QSA_BPTR(float, st), w, 1, hcH, Kc, dil);
}
#endif

#undef QSA_BPTR

/* ============================================================================================== */
/* Tensor parallelism (qsa_runtime.h >>tp): what the ranks do with all-gathered data.              */
/* ============================================================================================== */

/* The deterministic reduction of row-parallel partial sums: parts [tp][n] fp32 (rank r's partial
 * sums at parts + r * n, as ncclAllGather leaves them), out[i] = ((p0 + p1) + p2) + ... in rank
 * order, unfused adds.  Every rank runs it on the same bytes, so every rank gets the same bits,
 * whatever algorithm NCCL used to move them.  Launch: grid any (ceil(n / 256)), block any (256). */
#if QSA_IN_PART(3)
extern "C" __global__ void qsa_k_tp_sum(const float *__restrict__ parts, float *__restrict__ out, int n, int tp) {
    QSA_PDL_ENTRY();
    for (qsa_i64 i = (qsa_i64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (qsa_i64)gridDim.x * blockDim.x) {
        float s = parts[i];
        for (int r = 1; r < tp; r++) s = __fadd_rn(s, parts[(qsa_i64)r * n + i]);
        out[i] = s;
    }
}
#endif

/* PLE rows: rank r gathered columns [r * dl, (r + 1) * dl) of every head's row, parts [tp][M][nh][dl];
 * e [M][nh * tp * dl] is the full concatenated row (head h, column c = r * dl + j at h * tp * dl + c).
 * A copy.  Launch: grid any (ceil(M * nh * tp * dl / 256)), block any (256). */
#if QSA_IN_PART(5)
extern "C" __global__ void qsa_k_tp_ple_unshard(const float *__restrict__ parts, float *__restrict__ e, int M, int nh,
                                                int dl, int tp) {
    QSA_PDL_ENTRY();
    const qsa_i64 D = (qsa_i64)nh * tp * dl, n = (qsa_i64)M * D;
    for (qsa_i64 i = (qsa_i64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (qsa_i64)gridDim.x * blockDim.x) {
        qsa_i64 t = i / D, c = i % D, h = c / ((qsa_i64)tp * dl), w = c % ((qsa_i64)tp * dl), r = w / dl, j = w % dl;
        e[i] = parts[((r * M + t) * nh + h) * dl + j];
    }
}
#endif
