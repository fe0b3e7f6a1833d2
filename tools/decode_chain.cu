// decode_chain.cu - what batch-1 decode's chain of dependent projections costs as one launch each and as one
// persistent kernel whose warps wait on counters instead of kernel boundaries.
//
//   make tools/decode_chain && tools/decode_chain [--layers L] [--reps N] [--no-lm-head]
//        (nvcc, sm_90: an H100 / H200; not part of `all`)
//
// docs/PERFORMANCE.md reads batch 1's step as a chain of ~770 dependent launches that no faster small kernel can
// bring to 70% of the copy rate, and calls for a persistent decode kernel.  Before building one into the runtime,
// this measures what the idea gives on the part of the step that dominates its bytes: the dense projections of the
// real shape in the step's order, each one's input the whole output of the one before (as HC down -> HC up ->
// the mixer's input group -> out projection -> ... -> lm_head), FP16 weights, FP32 accumulation.  Per layer:
//
//   HC down 320 x 10240, HC up 10240 x 320, input group (GDN 16480 x 2560, QSA q/k/v + indexer 14080 x 2560),
//   out projection 2560 x 6144, HC down, HC up, router + shared gate/up 1792 x 2560, routed gate/up 3600 x 2560
//   (the ten experts' 18.4 MB of NVFP4 as FP16 rows of the same bytes), routed + shared down 2560 x 2432 (12.5 MB);
//   then lm_head 248320 x 2560.  48 layers (every fourth QSA): 9.85 GB a step, against the bench's 10.26 GB
//   counted (which adds the GDN states, the KV reads and the NVFP4 scales).  Not modelled: the attention, the
//   recurrence, the routing's top-k, the norms: each would add a dependency point and a little time to both forms.
//
// Every projection is cut into tasks of 8 rows x 512 columns, a warp each (its 8 KB of weights in registers by
// 16-byte loads, the input from L2); a row group's partial sums are folded in column order by the warp that
// arrives last at its ticket (as the runtime's split GEMVs), so every form gives the same bits (checked, with the
// outputs filled with NaN before each form).  Both kernels at 5 blocks of 4 warps a SM (the launch kernel spills 4
// bytes at that bound); the chain's table in constant memory.
//
//   launches        a kernel per projection in a CUDA graph, with programmatic dependent launch: each warp loads
//                   its first task's weights, then waits for the kernel before (griddepcontrol.wait); a kernel lets
//                   the next be scheduled from its start (griddepcontrol.launch_dependents first)
//   launches, late trigger  the same, but a kernel lets the next be scheduled only once it has passed its wait, as
//                   the runtime's kernels do (QSA_PDL_ENTRY), so that a kernel may load before its wait what the
//                   launch before its predecessor wrote
//   launches, no PDL  the same graph without the attribute
//   persistent      one kernel of one wave, launched cooperatively (refused rather than hung where its blocks
//                   cannot all be resident); warp w takes tasks w, w + W, ... of each projection in turn (w counted
//                   from a block that moves on by 61 a projection), loads a task's weights, and waits (first task
//                   of a projection) until every row group of the projection before has been folded (a counter
//                   per projection on its own 128-byte line: relaxed polls, then an acquire fence; a wait past
//                   ~10 s traps)
//   persistent, by chunk  the same kernel, every task waiting instead for the 512-output chunks of the projection
//                   before that its 512 columns read (a counter per chunk, bumped at each row group's fold): a task
//                   starts as soon as its own inputs are there, while the rest of the projection before runs
//   persistent, flags  as persistent, but a warp polls its own SM's copy of the counter's flag (each on its own 32
//                   bytes), which the warp whose count completes the counter sets for every SM: the counter's line is
//                   no longer polled by every waiting warp of the grid while the folds' atomics queue behind the polls
//   persistent, chunk, flags  the by-chunk form with such flags
//   persistent, no waits  the same kernel without the waits (reads inputs being written): what its loads and
//                   arithmetic cost without the dependencies
//
// Every projection writes its own output and partial sums (none shared), so no task overwrites what a task of an
// earlier projection may still read, however far the by-chunk form lets the projections overlap.
//
// Then the same number of projections of one task each (8 x 512): what a dependency alone costs in each form; and
// as many empty launches (wait and trigger only) in the three launch forms: what a launch costs with no data.
// Ceiling measured in the same run: cudaMemcpy device to device of 4 GiB, bytes read + written (tools/bench's
// copy row).  Median of --reps steps after 3, each timed from the host's submission (a graph's or a kernel's).
// Exit status 1 where the forms' last outputs differ or are not finite.
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <algorithm>
#include <vector>

#define CK(x)                                                                                                  \
    do {                                                                                                       \
        cudaError_t e_ = (x);                                                                                  \
        if (e_ != cudaSuccess) {                                                                               \
            fprintf(stderr, "decode_chain: %s: %s\n", #x, cudaGetErrorString(e_));                             \
            exit(1);                                                                                           \
        }                                                                                                      \
    } while (0)

enum { ROWS = 8, COLS = 512, PIECES = COLS / 8 / 32, WARPS = 4 }; /* a task: 8 rows x 512 columns; 2 pieces a lane */

struct Phase {
    int N, K;          /* rows, columns (multiples of 8) */
    int C, G;          /* column chunks ceil(K / 512), row groups N / 8 */
    long long tasks;   /* G * C */
    size_t w;          /* first weight (halves) */
    size_t tick;       /* first ticket (ints): G of them */
    size_t part;       /* first partial sum (floats): G * C * 8 of them */
    long long in, out; /* its input's and its output's offsets in y (in = -1: the step's input) */
    int nin;           /* the input's length */
    int chunk;         /* first of its ceil(N / 512) output-chunk counters */
};

enum { MAXPH = 512, DSTRIDE = 32 }; /* projections at most; a done counter every 128 bytes */
enum { MAXSM = 256, FSTRIDE = 8 };  /* the flags' rows: a flag per SM (%smid < MAXSM) every 32 bytes */
__constant__ Phase kph[MAXPH];      /* the chain (constant memory: a field costs no L2 trip after a fence) */
struct Chain {
    int n;
    const __half *W;
    float *y;          /* every projection's output (each its own: no form overwrites what another task reads) */
    const float *x0;
    float *part;       /* every projection's [G][C][8] partial sums (each its own, as y) */
    unsigned *tick;    /* all projections' tickets, left zero */
    unsigned *done;    /* [n][DSTRIDE]: row groups folded, cumulative over steps */
    unsigned *cdone;   /* [output chunks of all projections][DSTRIDE]: the same per 512 outputs (64 row groups) */
    unsigned *flag;    /* [counters][MAXSM][FSTRIDE]: a counter's generation once complete, a copy per SM */
};

static __device__ __forceinline__ unsigned ld_relaxed(const unsigned *p) {
    unsigned v;
    asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}
static __device__ __forceinline__ uint4 ld_stream(const __half *p) {
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
}

// A task's weights: lane l holds pieces l and l + 32 (8 columns each) of its 8 rows
struct TaskW {
    uint4 w[ROWS][PIECES];
};
static __device__ __forceinline__ void task_load(const Chain &c, const Phase &p, long long t, TaskW &tw) {
    const int lane = threadIdx.x & 31, g = (int)(t / p.C), ch = (int)(t % p.C);
#pragma unroll
    for (int j = 0; j < PIECES; j++) {
        const int col = ch * COLS + (lane + 32 * j) * 8;
#pragma unroll
        for (int r = 0; r < ROWS; r++)
            tw.w[r][j] = col < p.K ? ld_stream(c.W + p.w + (size_t)(g * ROWS + r) * p.K + col) : make_uint4(0, 0, 0, 0);
    }
}
// The task's partial sums, its row group folded by the last of its C warps; returns whether this warp folded
static __device__ __forceinline__ bool task_run(const Chain &c, const Phase &p, long long t, const TaskW &tw) {
    const int lane = threadIdx.x & 31, g = (int)(t / p.C), ch = (int)(t % p.C);
    const float *in = p.in < 0 ? c.x0 : c.y + p.in;
    float acc[ROWS];
#pragma unroll
    for (int r = 0; r < ROWS; r++) acc[r] = 0.0f;
#pragma unroll
    for (int j = 0; j < PIECES; j++) {
        const int col = ch * COLS + (lane + 32 * j) * 8;
        if (col >= p.K) continue;
        const int src = col % p.nin; /* (the input's length is a multiple of 8: a piece never wraps) */
        const float4 a = __ldcg((const float4 *)(in + src)), b = __ldcg((const float4 *)(in + src + 4));
        const float x[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
#pragma unroll
        for (int r = 0; r < ROWS; r++) {
            const __half2 *h = (const __half2 *)&tw.w[r][j];
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const float2 f = __half22float2(h[i]);
                acc[r] = fmaf(f.x, x[2 * i], acc[r]);
                acc[r] = fmaf(f.y, x[2 * i + 1], acc[r]);
            }
        }
    }
#pragma unroll
    for (int r = 0; r < ROWS; r++)
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) acc[r] += __shfl_xor_sync(0xffffffffu, acc[r], o);
    float mine = 0.0f;
#pragma unroll
    for (int r = 0; r < ROWS; r++)
        if (lane == r) mine = acc[r];
    float *y = c.y + p.out;
    if (p.C == 1) {
        if (lane < ROWS) y[g * ROWS + lane] = mine;
        return true;
    }
    if (lane < ROWS) c.part[p.part + ((size_t)g * p.C + ch) * ROWS + lane] = mine;
    __syncwarp(); /* the lanes' partials, then the release by the lane that takes the ticket */
    unsigned last = 0;
    if (lane == 0) {
        __threadfence();
        last = atomicAdd(c.tick + p.tick + g, 1u) == (unsigned)p.C - 1;
        if (last) __threadfence();
    }
    if (!__shfl_sync(0xffffffffu, last, 0)) return false;
    __syncwarp(); /* (the acquire of lane 0 orders the other lanes' reads) */
    if (lane < ROWS) {
        const float *pp = c.part + p.part + (size_t)g * p.C * ROWS + lane;
        float s = 0.0f;
        for (int k0 = 0; k0 < p.C; k0 += 8) { /* eight loads in flight, added in column order */
            float v[8];
#pragma unroll
            for (int u = 0; u < 8; u++) v[u] = k0 + u < p.C ? __ldcg(pp + (size_t)(k0 + u) * ROWS) : 0.0f;
#pragma unroll
            for (int u = 0; u < 8; u++)
                if (k0 + u < p.C) s += v[u];
        }
        y[g * ROWS + lane] = s;
    }
    if (lane == 0) c.tick[p.tick + g] = 0u;
    return true;
}

// One projection per launch: grid-strided tasks, the first one's weights before the wait on the kernel before.
// EARLY: the next launch may be scheduled from this one's start (griddepcontrol.launch_dependents first); else
// only once this one has passed its wait, as the runtime's kernels (QSA_PDL_ENTRY: wait, then launch_dependents)
template <bool EARLY>
__global__ void __launch_bounds__(32 * WARPS, 5) chain_phase(Chain c, int i) {
    if (EARLY) asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    const Phase &p = kph[i];
    const long long W = (long long)gridDim.x * WARPS;
    long long t = (long long)blockIdx.x * WARPS + (threadIdx.x >> 5);
    TaskW tw;
    if (t < p.tasks) task_load(c, p, t, tw);
    asm volatile("griddepcontrol.wait;" ::: "memory");
    if (!EARLY) asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    for (; t < p.tasks; t += W) {
        if (t != (long long)blockIdx.x * WARPS + (threadIdx.x >> 5)) task_load(c, p, t, tw);
        task_run(c, p, t, tw);
    }
}

// Nothing but the launch: the wait on the kernel before and the trigger for the next (EARLY: as chain_phase's);
// a chain of them is what a dependent launch costs without a load, a store or a fold
template <bool EARLY>
__global__ void chain_empty(void) {
    if (EARLY) asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    asm volatile("griddepcontrol.wait;" ::: "memory");
    if (!EARLY) asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
}

static __device__ __forceinline__ unsigned sm_id(void) {
    unsigned v;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(v));
    return v;
}
static __device__ __forceinline__ unsigned sm_count(void) {
    unsigned v;
    asm volatile("mov.u32 %0, %%nsmid;" : "=r"(v));
    return v;
}
// Until the counter at p (cumulative over steps) reaches want: relaxed polls, then an acquire fence (lane 0); a
// wait past ~10 s at 2 GHz is a bug: stop (the host's next call fails) rather than hang.  FLAGS: the poll reads
// instead this SM's copy of the counter's flag (k: the counter's index), which the warp that completes the
// counter sets to the step's generation: each line is polled by the warps of one SM, not by every warp of the grid
template <bool FLAGS>
static __device__ __forceinline__ void wait_count(const Chain &c, const unsigned *p, size_t k, unsigned want,
                                                  unsigned gen) {
    const long long t0 = clock64();
    if (FLAGS) {
        const unsigned *f = c.flag + (k * MAXSM + sm_id()) * FSTRIDE;
        while ((int)(ld_relaxed(f) - gen) < 0)
            if (clock64() - t0 > 20000000000LL) __trap();
    } else {
        while ((int)(ld_relaxed(p) - want) < 0)
            if (clock64() - t0 > 20000000000LL) __trap();
    }
    asm volatile("fence.acq_rel.gpu;" ::: "memory");
}
// A folded row group counted (lane 0, after the warp's __syncwarp) in the counter k of c.done (ck = 0) or c.cdone;
// FLAGS: the warp whose count completes it (want, cumulative) writes the generation to every SM's flag
template <bool FLAGS>
static __device__ __forceinline__ void signal_count(const Chain &c, int ck, size_t k, unsigned want, unsigned gen) {
    const int lane = threadIdx.x & 31;
    unsigned *p = (ck ? c.cdone : c.done) + k * DSTRIDE;
    unsigned old = 0;
    if (lane == 0) {
        __threadfence();
        old = atomicAdd(p, 1u);
    }
    if (!FLAGS) return;
    if (__shfl_sync(0xffffffffu, old, 0) + 1u != want) return; /* (warp-uniform) */
    __syncwarp();    /* (orders lane 0's atomic before the other lanes' fences and stores) */
    __threadfence(); /* (every lane: each orders its flag stores after the counts that lane 0's atomic saw) */
    const unsigned n = sm_count();
    if (n > MAXSM) __trap();
    const size_t f = (ck ? (size_t)c.n : 0) + k; /* the flag row: the projections' counters, then the chunks' */
    for (unsigned s = lane; s < n; s += 32)
        asm volatile("st.relaxed.gpu.global.u32 [%0], %1;" ::"l"(c.flag + (f * MAXSM + s) * FSTRIDE), "r"(gen) : "memory");
}
// By chunk: until the row groups of projection i - 1 that make the input columns [lo, lo + len) of projection i
// (the input wraps at its length nin) are folded: the output chunks of 512 that hold them, each at its row groups
template <bool FLAGS>
static __device__ __forceinline__ void wait_chunks(const Chain &c, int i, int lo, int len, unsigned gen) {
    const Phase &q = kph[i - 1];
    const int nin = kph[i].nin;
    int a0 = lo, b0 = lo + len, a1 = 0, b1 = 0; /* [a0, b0) and the wrapped [a1, b1) */
    if (len >= nin) {
        a0 = 0;
        b0 = nin;
    } else if (b0 > nin) {
        b1 = b0 - nin;
        b0 = nin;
    }
    for (int r = 0; r < 2; r++) {
        const int a = r ? a1 : a0, b = r ? b1 : b0;
        for (int k = a / COLS; k * COLS < b; k++) {
            const unsigned groups = (unsigned)(min(q.N, (k + 1) * COLS) - k * COLS) / ROWS;
            const size_t ck = (size_t)(q.chunk + k);
            wait_count<FLAGS>(c, c.cdone + ck * DSTRIDE, c.n + ck, gen * groups, gen);
        }
    }
}

// All projections in one launch of one wave.  WAIT 0: no waits; 1: a projection's first task waits for the one
// before to be folded; 2: every task waits for the output chunks of the projection before that its columns read.
// FLAGS: the waits poll per-SM flags (wait_count)
template <int WAIT, bool FLAGS>
__global__ void __launch_bounds__(32 * WARPS, 5) chain_persistent(Chain c, unsigned gen) {
    const int lane = threadIdx.x & 31;
    const long long W = (long long)gridDim.x * WARPS, w0 = (long long)blockIdx.x * WARPS + (threadIdx.x >> 5);
    for (int i = 0; i < c.n; i++) {
        const Phase &p = kph[i];
        /* each projection's tasks start 61 blocks further on: a projection of a few tasks lands on other SMs than
           the one before (no warp runs all of a chain of one-task projections) */
        const long long first = (w0 + W - (long long)i * 61 * WARPS % W) % W;
        for (long long t = first; t < p.tasks; t += W) {
            TaskW tw;
            task_load(c, p, t, tw);
            if (WAIT == 1 && t == first && i > 0) {
                if (lane == 0) wait_count<FLAGS>(c, c.done + (size_t)(i - 1) * DSTRIDE, i - 1, gen * (unsigned)kph[i - 1].G, gen);
                __syncwarp();
            }
            if (WAIT == 2 && i > 0) {
                const int col = (int)(t % p.C) * COLS;
                if (lane == 0) wait_chunks<FLAGS>(c, i, col % p.nin, min(COLS, p.K - col), gen);
                __syncwarp();
            }
            if (task_run(c, p, t, tw)) { /* (warp-uniform) the row group is folded: count it */
                __syncwarp();
                if (WAIT == 1) signal_count<FLAGS>(c, 0, i, gen * (unsigned)p.G, gen);
                if (WAIT == 2) {
                    const int k = (int)(t / p.C) * ROWS / COLS;
                    signal_count<FLAGS>(c, 1, p.chunk + k, gen * (unsigned)((min(p.N, (k + 1) * COLS) - k * COLS) / ROWS), gen);
                }
            }
        }
    }
}

// Uniform weights of variance 1 / K: a projection keeps its input's scale, so 400 of them neither vanish nor overflow
__global__ void fill_halves(__half *w, size_t n, float a, unsigned seed) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        unsigned h = (unsigned)i * 2654435761u ^ seed;
        h ^= h >> 15;
        h *= 2246822519u;
        h ^= h >> 13;
        w[i] = __float2half(((float)(h & 0xffff) / 32768.0f - 1.0f) * a);
    }
}

static void usage(void) {
    fprintf(stderr, "usage: decode_chain [--layers L (1-48)] [--reps N] [--no-lm-head]\n");
    exit(2);
}

static cudaStream_t st;
static cudaEvent_t e0, e1;
static int reps = 20;
template <class F>
static double median_ms(F fn) {
    std::vector<float> ts;
    for (int r = 0; r < 3 + reps; r++) {
        CK(cudaEventRecord(e0, st));
        fn();
        CK(cudaEventRecord(e1, st));
        CK(cudaEventSynchronize(e1));
        CK(cudaGetLastError());
        float ms;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        if (r >= 3) ts.push_back(ms);
    }
    std::sort(ts.begin(), ts.end());
    return (double)ts[ts.size() / 2];
}

// A graph of n launches on st: launch i of grid(i) blocks of 32 * WARPS threads, made by go(cfg, i); with pdl each a
// programmatic dependent of the one before
static const char *const lname[3] = {"launches", "launches, late trigger", "launches, no PDL"}; /* the three forms */
template <class G, class F>
static cudaGraphExec_t launch_graph(int n, bool pdl, G grid, F go) {
    cudaGraph_t g;
    cudaGraphExec_t ge;
    CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
    for (int i = 0; i < n; i++) {
        cudaLaunchConfig_t cfg;
        memset(&cfg, 0, sizeof cfg);
        cudaLaunchAttribute at[1];
        at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        at[0].val.programmaticStreamSerializationAllowed = 1;
        cfg.gridDim = dim3(grid(i));
        cfg.blockDim = dim3(32 * WARPS);
        cfg.stream = st;
        cfg.attrs = pdl ? at : NULL;
        cfg.numAttrs = pdl ? 1 : 0;
        go(cfg, i);
    }
    CK(cudaStreamEndCapture(st, &g));
    CK(cudaGraphInstantiate(&ge, g, 0));
    CK(cudaGraphDestroy(g));
    return ge;
}

// The eight forms of the chain of projections shape[i] = (N, K), each row its time a step, the weights' rate and
// its fraction of copy_gbs (0: the time a projection instead); returns whether the forms with waits agree
static bool run_chain(const std::vector<std::pair<int, int>> &shape, const char *what, double copy_gbs, int sms) {
    std::vector<Phase> ph;
    size_t nw = 0, nt = 0, npart = 0, ny = 0;
    int nchunk = 0;
    for (const auto &sk : shape) {
        Phase p;
        memset(&p, 0, sizeof p);
        p.N = sk.first;
        p.K = sk.second;
        p.C = (p.K + COLS - 1) / COLS;
        p.G = p.N / ROWS;
        p.tasks = (long long)p.G * p.C;
        p.w = nw;
        p.tick = nt;
        p.in = ph.empty() ? -1 : ph.back().out;
        p.out = (long long)ny;
        ny += (size_t)p.N;
        p.part = npart;
        npart += (size_t)p.G * p.C * ROWS;
        p.nin = ph.empty() ? p.K : ph.back().N;
        p.chunk = nchunk;
        nchunk += (p.N + COLS - 1) / COLS;
        nw += (size_t)p.N * p.K;
        nt += p.G;
        ph.push_back(p);
    }
    const double bytes = 2.0 * (double)nw;
    const int n = (int)ph.size(), nlast = ph.back().N;
    if (n > MAXPH) {
        fprintf(stderr, "decode_chain: %d projections, at most %d\n", n, MAXPH);
        exit(2);
    }
    Chain c;
    memset(&c, 0, sizeof c);
    __half *W;
    float *x0, *part;
    unsigned *tick, *done, *cdone, *flag;
    CK(cudaMemcpyToSymbol(kph, ph.data(), sizeof(Phase) * n));
    CK(cudaMalloc(&W, sizeof(__half) * nw));
    for (int i = 0; i < n; i++)
        fill_halves<<<4 * sms, 256>>>(W + ph[i].w, (size_t)ph[i].N * ph[i].K, sqrtf(3.0f / ph[i].K), 12345u + (unsigned)i);
    CK(cudaGetLastError());
    CK(cudaMalloc(&c.y, sizeof(float) * ny));
    std::vector<float> hx(ph[0].K);
    for (int i = 0; i < ph[0].K; i++) hx[i] = (float)((i * 37) % 101) / 101.0f - 0.5f;
    CK(cudaMalloc(&x0, sizeof(float) * ph[0].K));
    CK(cudaMemcpy(x0, hx.data(), sizeof(float) * ph[0].K, cudaMemcpyHostToDevice));
    CK(cudaMalloc(&part, sizeof(float) * npart));
    CK(cudaMalloc(&tick, sizeof(unsigned) * nt));
    CK(cudaMemset(tick, 0, sizeof(unsigned) * nt));
    CK(cudaMalloc(&done, sizeof(unsigned) * n * DSTRIDE));
    CK(cudaMemset(done, 0, sizeof(unsigned) * n * DSTRIDE));
    CK(cudaMalloc(&cdone, sizeof(unsigned) * nchunk * DSTRIDE));
    CK(cudaMemset(cdone, 0, sizeof(unsigned) * nchunk * DSTRIDE));
    const size_t nflag = (size_t)(n + nchunk) * MAXSM * FSTRIDE; /* the projections' counters, then the chunks' */
    CK(cudaMalloc(&flag, sizeof(unsigned) * nflag));
    CK(cudaMemset(flag, 0, sizeof(unsigned) * nflag));
    CK(cudaDeviceSynchronize());
    c.n = n;
    c.W = W;
    c.x0 = x0;
    c.part = part;
    c.tick = tick;
    c.done = done;
    c.cdone = cdone;
    c.flag = flag;

    printf("\n%s: %d projections, %.3f GB of FP16 weights a step\n", what, n, bytes / 1e9);
    if (copy_gbs > 0) printf("%-24s %12s %12s %10s\n", "", "us a step", "GB/s", "of copy");
    else printf("%-24s %12s %16s\n", "", "us a step", "us a projection");
    auto row = [&](const char *name, double ms) {
        if (copy_gbs > 0)
            printf("%-24s %12.1f %12.1f %9.1f%%\n", name, ms * 1e3, bytes / (ms * 1e6), 100.0 * bytes / (ms * 1e6) / copy_gbs);
        else printf("%-24s %12.1f %16.2f\n", name, ms * 1e3, ms * 1e3 / n);
        fflush(stdout);
    };

    /* the grids: one wave of the launch kernel; one wave of the persistent kernel that fits fewest blocks a SM */
    int ps = 0, pp = 0;
    CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&ps, chain_phase<true>, 32 * WARPS, 0));
    const void *pk[5] = {(const void *)chain_persistent<0, false>, (const void *)chain_persistent<1, false>,
                         (const void *)chain_persistent<2, false>, (const void *)chain_persistent<1, true>,
                         (const void *)chain_persistent<2, true>};
    pp = 1 << 30;
    for (int f = 0; f < 5; f++) { /* one grid for them all */
        int b = 0;
        CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&b, pk[f], 32 * WARPS, 0));
        pp = std::min(pp, b);
    }
    const int wave = ps * sms, pwave = pp * sms;
    /* each form's last outputs (the y buffers filled with NaN before it: a row group it missed shows) */
    std::vector<std::vector<float>> outs;
    auto poison = [&] {
        CK(cudaMemset(c.y, 0xff, sizeof(float) * ny));
        CK(cudaDeviceSynchronize());
    };
    auto keep = [&] {
        CK(cudaStreamSynchronize(st));
        outs.emplace_back(nlast);
        CK(cudaMemcpy(outs.back().data(), c.y + ph.back().out, sizeof(float) * nlast, cudaMemcpyDeviceToHost));
    };

    /* launches: a graph of one kernel per projection, with programmatic dependent launch (the next launch scheduled
       from a launch's start, or once it has passed its wait) and without */
    for (int form = 0; form < 3; form++) {
        const bool early = form == 0;
        cudaGraphExec_t ge = launch_graph(
            n, form < 2,
            [&](int i) { return (unsigned)std::min<long long>((ph[i].tasks + WARPS - 1) / WARPS, (long long)wave); },
            [&](cudaLaunchConfig_t &cfg, int i) {
                if (early) CK(cudaLaunchKernelEx(&cfg, chain_phase<true>, c, i));
                else CK(cudaLaunchKernelEx(&cfg, chain_phase<false>, c, i));
            });
        poison();
        row(lname[form], median_ms([&] { CK(cudaGraphLaunch(ge, st)); }));
        keep();
        CK(cudaGraphExecDestroy(ge));
    }

    /* persistent: one wave, launched cooperatively (refused, not hung, where its blocks cannot all be resident); the
       counters' generation is the step's number */
    unsigned gen = 0;
    auto persistent = [&](int f) {
        void *args[2] = {&c, &gen};
        CK(cudaLaunchCooperativeKernel(pk[f], dim3(pwave), dim3(32 * WARPS), args, 0, st));
    };
    const char *pname[5] = {"", "persistent", "persistent, by chunk", "persistent, flags", "persistent, chunk, flags"};
    for (int f = 1; f < 5; f++) { /* (each form's counters and flags advance by one generation a step) */
        poison();
        gen = 0;
        row(pname[f], median_ms([&] {
                ++gen;
                persistent(f);
            }));
        keep();
        CK(cudaMemset(done, 0, sizeof(unsigned) * n * DSTRIDE));
        CK(cudaMemset(cdone, 0, sizeof(unsigned) * nchunk * DSTRIDE));
        CK(cudaMemset(flag, 0, sizeof(unsigned) * nflag));
    }
    row("persistent, no waits", median_ms([&] { persistent(0); }));
    int bad = 0;
    for (size_t f = 0; f < outs.size(); f++)
        for (int j = 0; j < nlast; j++) bad += !isfinite(outs[f][j]);
    bool same = !bad;
    for (size_t f = 1; f < outs.size(); f++) same &= !memcmp(outs[0].data(), outs[f].data(), sizeof(float) * nlast);
    printf("grids: launches up to %d blocks (%d a SM), persistent %d (%d a SM); the last projection's %d outputs of the "
           "%d forms with waits: %s (%d not finite)\n",
           wave, ps, pwave, pp, nlast, (int)outs.size(), same ? "the same bits" : "DIFFERENT", bad);
    CK(cudaFree(W));
    CK(cudaFree(c.y));
    CK(cudaFree(x0));
    CK(cudaFree(part));
    CK(cudaFree(tick));
    CK(cudaFree(done));
    CK(cudaFree(cdone));
    CK(cudaFree(flag));
    return same;
}

int main(int argc, char **argv) {
    int layers = 48, lm_head = 1;
    for (int a = 1; a < argc; a++) {
        if (!strcmp(argv[a], "--layers") && a + 1 < argc) layers = atoi(argv[++a]);
        else if (!strcmp(argv[a], "--reps") && a + 1 < argc) reps = atoi(argv[++a]);
        else if (!strcmp(argv[a], "--no-lm-head")) lm_head = 0;
        else usage();
    }
    if (layers < 1 || layers > 48 || reps < 1) usage();
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    if (prop.major < 9) {
        fprintf(stderr, "decode_chain: needs sm_90 (griddepcontrol); device 0 is sm_%d%d\n", prop.major, prop.minor);
        return 1;
    }
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));

    /* the ceiling: 4 GiB device to device, read + written */
    const size_t cb = (size_t)4 << 30;
    void *big, *big2;
    CK(cudaMalloc(&big, cb));
    CK(cudaMalloc(&big2, cb));
    CK(cudaMemset(big, 1, cb));
    const double copy_ms = median_ms([&] { CK(cudaMemcpyAsync(big2, big, cb, cudaMemcpyDeviceToDevice, st)); });
    const double copy_gbs = 2.0 * cb / (copy_ms * 1e6);
    CK(cudaFree(big));
    CK(cudaFree(big2));
    printf("decode_chain: %s, %d SMs; copy %.1f GB/s (4 GiB, read + written); tasks of %d x %d, blocks of %d warps; "
           "median of %d steps\n",
           prop.name, prop.multiProcessorCount, copy_gbs, ROWS, COLS, WARPS, reps);

    /* the step's projections */
    std::vector<std::pair<int, int>> shape, tiny;
    for (int l = 0; l < layers; l++) {
        const int mixer = l % 4 == 3 ? 14080 : 16480; /* QSA q/k/v + indexer, GDN input group */
        const int ly[9][2] = {{320, 10240}, {10240, 320}, {mixer, 2560}, {2560, 6144}, {320, 10240},
                              {10240, 320}, {1792, 2560}, {3600, 2560}, {2560, 2432}};
        for (const auto &p : ly) shape.push_back({p[0], p[1]});
    }
    if (lm_head) shape.push_back({248320, 2560});
    char what[128];
    snprintf(what, sizeof what, "%d layers%s of the real shape", layers, lm_head ? " + lm_head" : "");
    bool ok = run_chain(shape, what, copy_gbs, prop.multiProcessorCount);
    /* what a dependency costs: as many projections of one task each (8 x 512) */
    tiny.assign(shape.size(), {ROWS, COLS});
    ok &= run_chain(tiny, "the same number of one-task projections (8 x 512): what a dependency costs", 0.0,
                    prop.multiProcessorCount);
    /* and as many launches that do nothing but wait and trigger (one block of 128 threads, or a wave of them) */
    printf("\nthe same number of empty launches (wait and trigger only): us a launch\n%-24s %12s %12s\n", "", "1 block",
           "a wave");
    for (int form = 0; form < 3; form++) {
        const bool early = form == 0;
        const int n = (int)tiny.size();
        double us[2];
        for (int wv = 0; wv < 2; wv++) {
            cudaGraphExec_t ge = launch_graph(
                n, form < 2, [&](int) { return wv ? (unsigned)prop.multiProcessorCount : 1u; },
                [&](cudaLaunchConfig_t &cfg, int) {
                    if (early) CK(cudaLaunchKernelEx(&cfg, chain_empty<true>));
                    else CK(cudaLaunchKernelEx(&cfg, chain_empty<false>));
                });
            us[wv] = median_ms([&] { CK(cudaGraphLaunch(ge, st)); }) * 1e3 / n;
            CK(cudaGraphExecDestroy(ge));
        }
        printf("%-24s %12.2f %12.2f\n", lname[form], us[0], us[1]);
    }
    return ok ? 0 : 1;
}
