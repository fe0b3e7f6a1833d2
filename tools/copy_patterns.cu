// copy_patterns.cu - how fast the direct expert fold's weight copies can stream, by copy mapping and layout.
//
//   make tools/copy_patterns && tools/copy_patterns        (nvcc, sm_90: an H100 / H200; not part of `all`)
//   ncu --kernel-name regex:"pat|bulk|boxes" tools/copy_patterns --once  (each kernel once, for the profiler)
//
// Batch 32's routed gate/up at the real shape reads ~240 experts x 2 matrices x 640 rows x 2560 NVFP4 (393 MB of
// packed weights, 49 MB of block scales) per layer.  qsa_segs16_nvd copies each warp's tile (16 rows, both
// matrices) segment by segment (256 elements: 128 bytes of a row) into a double buffer of rows of 144 bytes, by
// cp.async, 8 lanes a row, 4 rows an instruction; the scales 16 bytes a row from rows 160 bytes apart.  Each
// kernel here moves the same bytes with the same tasks (a warp per tile, two warps per block, the buffer and the
// wait of the fold) and a few shared-memory reads per segment in place of the fold's arithmetic, so that the
// copy is all it measures:
//
//   cg           the kernel's copy (cp.async.cg, 16 bytes a lane, row-major layout)
//   seg-major cg the same instructions from a segment-major layout: a tile's segment is 2,048 contiguous bytes
//                of weights (16 rows x 128) and 256 of scales
//   ca           cp.async.ca for the weights (allocating in L1)
//   2 segs       row-major, 2 rows x 256 bytes an instruction (two segments a copy, every other segment; the
//                two halves are both overwritten: a timing of the access pattern only)
//   ca L2::128B, cg L2::256B, ca L2::256B: with the L2 prefetch-size hint
//   ca+ca scales the scales by cp.async.ca too
//   seg-major ca segment-major layout, weights by cp.async.ca
//   tile pf      cg, and one bulk L2 prefetch of the warp's whole tile (weights and scales) at its start
//   scale pf     cg, and one bulk L2 prefetch of the tile's scales
//   TMA 128 B    row-major, cp.async.bulk: a 128-byte copy per row and a 16-byte one per scale row (mbarrier)
//   TMA 2 KB     segment-major, cp.async.bulk: one 2,048-byte and one 256-byte copy per matrix and segment
//   TMA boxes    the row-major layout as it is, by tensor maps (cp.async.bulk.tensor): one 16 x 128-byte box of
//                weights (128-byte swizzle) and one 16 x 16-byte box of scales per matrix and segment
//
// Ceilings measured in the same run: cudaMemcpy device to device (bytes read + written) and a read-only
// streaming kernel.  Each kernel: median of 30 launches after 5.
#include <cuda.h>
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <algorithm>
#include <vector>

#define CK(x)                                                                                                  \
    do {                                                                                                       \
        cudaError_t e_ = (x);                                                                                  \
        if (e_ != cudaSuccess) {                                                                               \
            fprintf(stderr, "copy_patterns: %s: %s\n", #x, cudaGetErrorString(e_));                            \
            exit(1);                                                                                           \
        }                                                                                                      \
    } while (0)

enum { E = 240, I = 640, K = 2560, RB = K / 2, SB = K / 16, NSEG = K / 256, TILES = I / 16, PKD = 144 };
enum { CG, SEG_CG, CA, TWO_SEGS, CA_L2_128, CG_L2_256, CA_L2_256, CA_SCALES_CA, SEG_CA, TILE_PF, SCALE_PF };
enum { TMA_ROWS, TMA_SEG };

static __device__ __forceinline__ unsigned smem_u32(const void *p) { return (unsigned)__cvta_generic_to_shared(p); }

// One 16-byte piece by cp.async in the pattern's flavour
template <int P>
static __device__ __forceinline__ void cp16(unsigned dst, const void *src) {
    if (P == CA || P == CA_SCALES_CA || P == SEG_CA)
        asm volatile("cp.async.ca.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(src) : "memory");
    else if (P == CA_L2_128)
        asm volatile("cp.async.ca.shared.global.L2::128B [%0], [%1], 16;" ::"r"(dst), "l"(src) : "memory");
    else if (P == CG_L2_256)
        asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16;" ::"r"(dst), "l"(src) : "memory");
    else if (P == CA_L2_256)
        asm volatile("cp.async.ca.shared.global.L2::256B [%0], [%1], 16;" ::"r"(dst), "l"(src) : "memory");
    else
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(src) : "memory");
}
static __device__ __forceinline__ void cp16_cg(unsigned dst, const void *src) { cp16<CG>(dst, src); }
static __device__ __forceinline__ void cp16_ca(unsigned dst, const void *src) { cp16<CA>(dst, src); }

// The stand-in for the fold: the words the fold reads per segment (rows g and g + 8, the scale words)
static __device__ __forceinline__ unsigned touch(const unsigned char *pw, unsigned acc) {
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int m = 0; m < 2; m++)
#pragma unroll
        for (int J = 0; J < 4; J++)
            acc ^= *(const unsigned *)(pw + m * 16 * PKD + 32 * J + 4 * (lane & 3)) +
                   *(const unsigned *)(pw + m * 16 * PKD + 8 * PKD + 32 * J + 16 + 4 * (lane & 3)) +
                   *(const unsigned *)(pw + m * 16 * PKD + 128 + 4 * J);
    return acc;
}

static __device__ __forceinline__ size_t row_of(int e, int m, int t) { return (size_t)(e * 2 + m) * I + t * 16; }
static __device__ __forceinline__ size_t seg_of(int e, int m, int t, int sn) {
    return ((size_t)((e * 2 + m) * TILES + t) * NSEG + sn);
}

// The cp.async patterns: a warp per tile (expert e, column tile t: both matrices), two segments in flight
template <int P>
__global__ void __launch_bounds__(64) pat(const unsigned char *__restrict__ q, const unsigned char *__restrict__ s,
                                          unsigned *__restrict__ out) {
    __shared__ __align__(128) unsigned char pk[2][2 * 2 * 16 * PKD];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, pr = lane >> 3, pc = lane & 7;
    const int task = blockIdx.x * 2 + warp, e = task / TILES, t = task % TILES;
    const unsigned base = smem_u32(pk[warp]);
    if ((P == TILE_PF || P == SCALE_PF) && lane == 0)
        for (int m = 0; m < 2; m++) {
            if (P == TILE_PF)
                asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(q + row_of(e, m, t) * RB), "r"(16 * RB)
                             : "memory");
            asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(s + row_of(e, m, t) * SB), "r"(16 * SB)
                         : "memory");
        }
    auto copy = [&](int sn) {
        for (int m = 0; m < 2 && sn < NSEG; m++) {
            const unsigned dst = base + (sn & 1) * 2 * 16 * PKD + m * 16 * PKD;
            if (P == SEG_CG || P == SEG_CA) {
                const unsigned char *g = q + seg_of(e, m, t, sn) * 2048;
                for (int i = 0; i < 4; i++) cp16<P>(dst + (4 * i + pr) * PKD + 16 * pc, g + i * 512 + 16 * lane);
                if (lane < 16) cp16_cg(dst + lane * PKD + 128, s + seg_of(e, m, t, sn) * 256 + 16 * lane);
            } else if (P == TWO_SEGS) {
                if (sn & 1) continue;
                const unsigned char *g = q + row_of(e, m, t) * RB + sn * 128;
                for (int i = 0; i < 8; i++) { /* rows lane / 16 + 2 i, piece lane % 16 of the two segments */
                    const int r = (lane >> 4) + 2 * i, c = lane & 15;
                    cp16_cg(base + (c >> 3) * 2 * 16 * PKD + m * 16 * PKD + r * PKD + 16 * (c & 7), g + (size_t)r * RB + 16 * c);
                }
                cp16_cg(base + (lane >> 4) * 2 * 16 * PKD + m * 16 * PKD + (lane & 15) * PKD + 128,
                        s + (row_of(e, m, t) + (lane & 15)) * SB + sn * 16 + 16 * (lane >> 4));
            } else {
                const unsigned char *g = q + (row_of(e, m, t) + pr) * RB + sn * 128 + 16 * pc;
                for (int i = 0; i < 4; i++) cp16<P>(dst + (4 * i + pr) * PKD + 16 * pc, g + (size_t)4 * i * RB);
                const unsigned char *gs = s + (row_of(e, m, t) + (lane & 15)) * SB + sn * 16;
                if (lane < 16) {
                    if (P == CA_SCALES_CA) cp16_ca(dst + lane * PKD + 128, gs);
                    else cp16_cg(dst + lane * PKD + 128, gs);
                }
            }
        }
        asm volatile("cp.async.commit_group;" ::: "memory");
    };
    unsigned acc = 0;
    copy(0);
    for (int seg = 0; seg < NSEG; seg++) {
        __syncwarp();
        copy(seg + 1);
        asm volatile("cp.async.wait_group 1;" ::: "memory");
        __syncwarp();
        acc = touch(pk[warp] + (seg & 1) * 2 * 16 * PKD + (lane >> 2) * PKD, acc);
    }
    if (acc == 0x12345678u) out[task * 32 + lane] = acc; /* (never: keeps the reads) */
}

// The two mbarriers at b0 and b0 + 8 (one arrival and the transaction bytes a phase), by lane 0, for the warp
static __device__ __forceinline__ void bars_init(unsigned b0) {
    if ((threadIdx.x & 31) == 0) {
        asm volatile("mbarrier.init.shared.b64 [%0], 1;" ::"r"(b0));
        asm volatile("mbarrier.init.shared.b64 [%0], 1;" ::"r"(b0 + 8));
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncwarp();
}
// Until the phase of parity ph of the mbarrier at bar completes
static __device__ __forceinline__ void bar_wait(unsigned bar, unsigned ph) {
    asm volatile("{\n .reg .pred p;\n W: mbarrier.try_wait.parity.shared.b64 p, [%0], %1;\n @!p bra W;\n}" ::"r"(bar), "r"(ph)
                 : "memory");
}
// The bulk kernels' double buffer: copy(sn) asks for segment sn's bytes on half sn % 2's mbarrier, fold(seg, acc)
// reads segment seg once they have landed
template <class Copy, class Fold>
static __device__ __forceinline__ unsigned bulk_segments(unsigned b0, Copy copy, Fold fold) {
    unsigned acc = 0;
    copy(0);
    for (int seg = 0; seg < NSEG; seg++) {
        __syncwarp();
        copy(seg + 1);
        bar_wait(b0 + 8 * (seg & 1), (seg >> 1) & 1);
        acc = fold(seg, acc);
    }
    return acc;
}

// The TMA patterns: bulk copies into the same buffer, completion on an mbarrier per half
template <int P>
__global__ void __launch_bounds__(64) bulk(const unsigned char *__restrict__ q, const unsigned char *__restrict__ s,
                                           unsigned *__restrict__ out) {
    __shared__ __align__(128) unsigned char pk[2][2 * 2 * 16 * PKD + 2 * 2 * 256];
    __shared__ __align__(8) unsigned long long bar[2][2];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int task = blockIdx.x * 2 + warp, e = task / TILES, t = task % TILES;
    const unsigned base = smem_u32(pk[warp]), b0 = smem_u32(&bar[warp][0]);
    bars_init(b0);
    auto copy = [&](int sn) {
        if (sn >= NSEG) return;
        const unsigned half = (sn & 1) * 2 * 16 * PKD, bb = b0 + 8 * (sn & 1);
        asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
        if (lane == 0)
            asm volatile("mbarrier.arrive.expect_tx.shared.b64 _, [%0], %1;" ::"r"(bb), "r"(2 * (16 * 128 + 16 * 16))
                         : "memory");
        __syncwarp();
        for (int m = 0; m < 2; m++) {
            const unsigned dst = base + half + m * 16 * PKD;
            const unsigned char *src = 0;
            unsigned d = 0, n = 0;
            if (P == TMA_SEG) {
                if (lane == 0) src = q + seg_of(e, m, t, sn) * 2048, d = dst, n = 2048;
                if (lane == 1) src = s + seg_of(e, m, t, sn) * 256, d = base + 2 * 2 * 16 * PKD + (sn & 1) * 512 + m * 256, n = 256;
            } else if (lane < 16) {
                src = q + (row_of(e, m, t) + lane) * RB + sn * 128, d = dst + lane * PKD, n = 128;
            } else {
                src = s + (row_of(e, m, t) + lane - 16) * SB + sn * 16, d = dst + (lane - 16) * PKD + 128, n = 16;
            }
            if (n)
                asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(d),
                             "l"(src), "r"(n), "r"(bb)
                             : "memory");
        }
    };
    const unsigned acc = bulk_segments(b0, copy, [&](int seg, unsigned a) {
        return touch(pk[warp] + (seg & 1) * 2 * 16 * PKD + (lane >> 2) * PKD, a);
    });
    if (acc == 0x12345678u) out[task * 32 + lane] = acc;
}

// The tensor-map pattern: the row-major layout as it is, each segment of a tile one 2D box of 16 rows x 128
// bytes (the weights, 128-byte swizzle: 16-byte piece c of row r at piece c ^ (r % 8)) and one of 16 rows x 16
// bytes (the scales), by cp.async.bulk.tensor; completion on an mbarrier per half
__global__ void __launch_bounds__(64) boxes(const __grid_constant__ CUtensorMap qmap, const __grid_constant__ CUtensorMap smap,
                                            unsigned *__restrict__ out) {
    enum { WB = 10240 }; /* per warp: 4 boxes of weights (half, matrix), 1,024-aligned, then 4 of scales */
    extern __shared__ __align__(1024) unsigned char dyn[];
    __shared__ __align__(8) unsigned long long bar[2][2];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t4 = lane & 3;
    const int task = blockIdx.x * 2 + warp, e = task / TILES, t = task % TILES;
    unsigned char *wp = (unsigned char *)(((size_t)dyn + 1023) & ~(size_t)1023) + warp * WB;
    const unsigned base = smem_u32(wp), b0 = smem_u32(&bar[warp][0]);
    bars_init(b0);
    auto copy = [&](int sn) {
        if (sn >= NSEG) return;
        const unsigned bb = b0 + 8 * (sn & 1);
        asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
        if (lane == 0) {
            asm volatile("mbarrier.arrive.expect_tx.shared.b64 _, [%0], %1;" ::"r"(bb), "r"(2 * (16 * 128 + 16 * 16))
                         : "memory");
            for (int m = 0; m < 2; m++) {
                const int row = (int)row_of(e, m, t), h = (sn & 1) * 2 + m;
                asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];"
                             ::"r"(base + h * 2048), "l"(&qmap), "r"(sn * 128), "r"(row), "r"(bb) : "memory");
                asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];"
                             ::"r"(base + 8192 + h * 256), "l"(&smap), "r"(sn * 16), "r"(row), "r"(bb) : "memory");
            }
        }
    };
    const unsigned acc = bulk_segments(b0, copy, [&](int seg, unsigned a) {
#pragma unroll
        for (int m = 0; m < 2; m++) { /* the fold's words: rows g and g + 8, pieces 2 J and 2 J + 1, swizzled */
            const unsigned char *pq = wp + ((seg & 1) * 2 + m) * 2048, *ps = wp + 8192 + ((seg & 1) * 2 + m) * 256;
#pragma unroll
            for (int J = 0; J < 4; J++)
                a ^= *(const unsigned *)(pq + g * 128 + 16 * ((2 * J) ^ g) + 4 * t4) +
                     *(const unsigned *)(pq + (g + 8) * 128 + 16 * ((2 * J + 1) ^ g) + 4 * t4) +
                     *(const unsigned *)(ps + g * 16 + 4 * J);
        }
        return a;
    });
    if (acc == 0x12345678u) out[task * 32 + lane] = acc;
}

static CUtensorMap box_map(void *p, unsigned long long cols, unsigned long long rows, unsigned box_cols, bool swz) {
    CUtensorMap m;
    const cuuint64_t dim[2] = {cols, rows}, stride[1] = {cols};
    const cuuint32_t box[2] = {box_cols, 16}, es[2] = {1, 1};
    const CUresult r = cuTensorMapEncodeTiled(&m, CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, p, dim, stride, box, es,
                                              CU_TENSOR_MAP_INTERLEAVE_NONE,
                                              swz ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_NONE,
                                              CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS) {
        fprintf(stderr, "copy_patterns: cuTensorMapEncodeTiled: error %d\n", (int)r);
        exit(1);
    }
    return m;
}

__global__ void read_stream(const uint4 *__restrict__ p, size_t n, unsigned *out) {
    unsigned acc = 0;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        const uint4 v = __ldcs(p + i);
        acc ^= v.x + v.y + v.z + v.w;
    }
    if (acc == 0x12345678u) out[threadIdx.x] = acc;
}

int main(int argc, char **argv) {
    const bool once = argc > 1 && !strcmp(argv[1], "--once");
    if (argc > 1 && !once) {
        fprintf(stderr, "usage: copy_patterns [--once]\n");
        return 2;
    }
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    if (prop.major < 9) {
        fprintf(stderr, "copy_patterns: needs sm_90 (bulk copies and prefetches); device 0 is sm_%d%d\n", prop.major,
                prop.minor);
        return 1;
    }
    const size_t qb = (size_t)E * 2 * I * RB, sb = (size_t)E * 2 * I * SB, cb = (size_t)1 << 30;
    unsigned char *q, *s;
    unsigned *out;
    void *big, *big2;
    CK(cudaMalloc(&q, qb));
    CK(cudaMalloc(&s, sb));
    CK(cudaMalloc(&out, 1 << 24));
    CK(cudaMalloc(&big, cb));
    CK(cudaMalloc(&big2, cb));
    CK(cudaMemset(q, 0x35, qb));
    CK(cudaMemset(s, 0x38, sb));
    CK(cudaMemset(big, 1, cb));
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    const int warm = once ? 0 : 5, reps = once ? 1 : 30;
    double copy_gbs = 0.0;
    auto timeit = [&](const char *name, double bytes, auto fn) {
        std::vector<float> ts;
        for (int r = 0; r < warm + reps; r++) {
            CK(cudaEventRecord(a));
            fn();
            CK(cudaEventRecord(b));
            CK(cudaEventSynchronize(b));
            CK(cudaGetLastError());
            float ms;
            CK(cudaEventElapsedTime(&ms, a, b));
            if (r >= warm) ts.push_back(ms);
        }
        std::sort(ts.begin(), ts.end());
        const double us = ts[ts.size() / 2] * 1e3, gbs = bytes / us / 1e3;
        if (!copy_gbs) copy_gbs = gbs;
        printf("%-28s %9.2f us %9.1f MB %8.1f GB/s %6.1f%% of copy\n", name, us, bytes / 1e6, gbs, 100.0 * gbs / copy_gbs);
    };
    const int blocks = E * TILES / 2;
    const double tb = (double)qb + (double)sb;
    printf("%s, %d SMs; %d experts x 2 matrices x %d x %d NVFP4, a warp per 16-row tile\n", prop.name,
           prop.multiProcessorCount, E, I, K);
    timeit("memcpy (read + write)", 2.0 * cb, [&] { CK(cudaMemcpyAsync(big2, big, cb, cudaMemcpyDeviceToDevice)); });
    timeit("read-only stream", (double)cb, [&] { read_stream<<<prop.multiProcessorCount * 16, 256>>>((const uint4 *)big, cb / 16, out); });
    typedef void (*copy_kernel)(const unsigned char *, const unsigned char *, unsigned *);
    const struct {
        const char *name;
        copy_kernel k;
    } kernels[] = {{"cg (the kernel's)", pat<CG>}, {"seg-major cg", pat<SEG_CG>}, {"ca", pat<CA>},
                   {"2 segs", pat<TWO_SEGS>}, {"ca L2::128B", pat<CA_L2_128>}, {"cg L2::256B", pat<CG_L2_256>},
                   {"ca L2::256B", pat<CA_L2_256>}, {"ca+ca scales", pat<CA_SCALES_CA>}, {"seg-major ca", pat<SEG_CA>},
                   {"tile pf", pat<TILE_PF>}, {"scale pf", pat<SCALE_PF>}, {"TMA 128 B", bulk<TMA_ROWS>},
                   {"TMA 2 KB", bulk<TMA_SEG>}};
    for (const auto &kn : kernels) timeit(kn.name, tb, [&] { kn.k<<<blocks, 64>>>(q, s, out); });
    const CUtensorMap qmap = box_map(q, RB, (unsigned long long)E * 2 * I, 128, true);
    const CUtensorMap smap = box_map(s, SB, (unsigned long long)E * 2 * I, 16, false);
    CK(cudaFuncSetAttribute(boxes, cudaFuncAttributeMaxDynamicSharedMemorySize, 2 * 10240 + 1024));
    timeit("TMA boxes, row-major", tb, [&] { boxes<<<blocks, 64, 2 * 10240 + 1024>>>(qmap, smap, out); });
    timeit("cg (the kernel's), again", tb, [&] { pat<CG><<<blocks, 64>>>(q, s, out); });
    CK(cudaDeviceSynchronize());
    return 0;
}
