/* tests/t_gpu_k1.c - the dense forward-pass kernels of kernels.cu (embedding, norms, hyper-connection
 * mixing, GEMMs, MoE, PLE) against plain C references, on the GPU (group gpu).
 *
 * Each test: random inputs from a fixed seed; outputs poisoned (0xFF bytes: NaN in fp32 and fp16,
 * -1 in int32) before every launch so an element a kernel forgets to write cannot pass; results
 * compared with |gpu - ref| <= atol + rtol * |ref| (tolerances explained next to each check) or
 * bitwise where both sides do the same IEEE operations; and batch invariance: a token computed
 * alone (M = 1) gives the same bits as the same token inside a launch of M = 37 (and M = 100 for
 * the GEMMs, whose tiling changes with M).
 *
 * Module: the embedded kernels.cu, compiled with NVRTC for the runtime's own target choice.
 * Skips (no failure) when there is no libcuda, no device or no NVRTC.
 */
#ifndef QSA_NO_CUDA

/* ---------------------------------------------------------------------------------------------- */
/* harness                                                                                         */
/* ---------------------------------------------------------------------------------------------- */

typedef struct k1_state {
    int tried;
    qsa_result status;
    char why[2048];
    CUcontext ctx;
    CUmodule mod;
    char arch[32];
    const char *src;
} k1_state;
static k1_state K1_;

static qsa_result k1_init_(void) {
    CUdevice dev;
    qsa__gpu_info gi;
    char *src = NULL, *image = NULL, *log = NULL;
    size_t ilen = 0;
    QSA__TRY(qsa__cuda_load());
    QSA__TRY(qsa__nvrtc_load());
    QSA__TRY(qsa__cu_device_info(0, &gi));
    QSA__CU(qsa__cu.cuDeviceGet(&dev, 0));
    QSA__CU(qsa__cu.cuDevicePrimaryCtxRetain(&K1_.ctx, dev));
    QSA__CU(qsa__cu.cuCtxSetCurrent(K1_.ctx));
    src = qsa__kernels_source();
    if (!src) return qsa__fail(QSA_ERR_OUT_OF_MEMORY, "kernels: out of memory");
    K1_.src = "kernels.cu (embedded)";
    static const char *const opts[] = {"--std=c++14", "-default-device"};
    qsa_result r = qsa__nvrtc_pick_arch(NULL, gi.cc_major * 10 + gi.cc_minor, K1_.arch, sizeof K1_.arch);
    if (r == QSA_OK) r = qsa__nvrtc_compile(src, "kernels.cu", opts, 2, K1_.arch, &image, &ilen, &log);
    if (r == QSA_OK && log && strstr(log, "warning"))
        printf("    NVRTC warnings:\n%s\n", log);
    if (r == QSA_OK) r = QSA__CU_R(qsa__cu.cuModuleLoadData(&K1_.mod, image));
    if (r == QSA_OK)
        printf("    GPU 0: %s (sm_%d%d); k1 kernels from %s built for %s by NVRTC %d.%d\n", gi.name, gi.cc_major,
               gi.cc_minor, K1_.src, K1_.arch, qsa__nvrtc.major, qsa__nvrtc.minor);
    qsa_free(src);
    qsa_free(image);
    qsa_free(log);
    return r;
}

/* 1: ready; 0: no GPU stack (skip); -1: a GPU is there but the set-up failed (a real failure). */
static int k1_state_get(void) {
    if (!K1_.tried) {
        K1_.tried = 1;
        K1_.status = k1_init_();
        snprintf(K1_.why, sizeof K1_.why, "%s", K1_.status == QSA_OK ? "" : qsa_last_error());
        qsa_clear_error();
    }
    if (K1_.status == QSA_OK) qsa__cu.cuCtxSetCurrent(K1_.ctx);
    return K1_.status == QSA_OK ? 1 : K1_.status == QSA_ERR_NO_DEVICE ? 0 : -1;
}
#define K1_NEED_GPU() do { int s_ = k1_state_get(); \
    if (s_ == 0) SKIP("no GPU: %s", K1_.why); \
    if (s_ < 0) { T_.failed++; printf("    k1 GPU set-up failed: %s\n", K1_.why); return; } } while (0)

/* Device and host buffers of one test, freed together at `done:`. */
#define K1_MAXBUF 96
typedef struct k1_mem {
    CUdeviceptr d[K1_MAXBUF];
    int nd;
    void *h[K1_MAXBUF];
    int nh;
} k1_mem;
static void k1_free(k1_mem *m) {
    for (int i = 0; i < m->nd; i++) qsa__cu.cuMemFree_v2(m->d[i]);
    for (int i = 0; i < m->nh; i++) free(m->h[i]);
    m->nd = m->nh = 0;
}
/* zeroed host memory owned by m (NULL when out of memory or out of slots) */
static void *k1_host(k1_mem *m, size_t bytes) {
    if (m->nh >= K1_MAXBUF) return NULL;
    void *p = calloc(bytes ? bytes : 1, 1);
    if (p) m->h[m->nh++] = p;
    return p;
}
/* device memory owned by m: a copy of `host`, or poison (0xFF bytes) when host is NULL */
static qsa_result k1_dev(k1_mem *m, CUdeviceptr *d, const void *host, size_t bytes) {
    *d = 0;
    if (m->nd >= K1_MAXBUF) return qsa__fail(QSA_ERR_INTERNAL, "k1 test: too many buffers");
    QSA__CU(qsa__cu.cuMemAlloc_v2(d, bytes ? bytes : 1));
    m->d[m->nd++] = *d;
    if (host) QSA__CU(qsa__cu.cuMemcpyHtoD_v2(*d, host, bytes));
    else QSA__CU(qsa__cu.cuMemsetD8_v2(*d, 0xFF, bytes ? bytes : 1));
    return QSA_OK;
}
static qsa_result k1_put(CUdeviceptr d, const void *host, size_t bytes) {
    QSA__CU(qsa__cu.cuMemcpyHtoD_v2(d, host, bytes));
    return QSA_OK;
}
static qsa_result k1_get(void *host, CUdeviceptr d, size_t bytes) {
    QSA__CU(qsa__cu.cuMemcpyDtoH_v2(host, d, bytes));
    return QSA_OK;
}
static qsa_result k1_poison(CUdeviceptr d, size_t bytes) {
    QSA__CU(qsa__cu.cuMemsetD8_v2(d, 0xFF, bytes));
    return QSA_OK;
}
static qsa_result k1_launch(const char *name, unsigned gx, unsigned gy, unsigned block, void **args) {
    CUfunction fn;
    if (qsa__cu.cuModuleGetFunction(&fn, K1_.mod, name) != 0)
        return qsa__fail(QSA_ERR_NOT_FOUND, "kernel %s is not in the k1 module", name);
    QSA__TRY(qsa__cu_launch(fn, name, gx, gy, 1, block, 1, 1, 0, NULL, args));
    QSA__CU(qsa__cu.cuCtxSynchronize());
    return QSA_OK;
}

/* k1_launch with `sh` bytes of dynamic shared memory (the function's limit raised to them) */
static qsa_result k1_launch_sh(const char *name, unsigned gx, unsigned block, unsigned sh, void **args) {
    CUfunction fn;
    if (qsa__cu.cuModuleGetFunction(&fn, K1_.mod, name) != 0)
        return qsa__fail(QSA_ERR_NOT_FOUND, "kernel %s is not in the k1 module", name);
    QSA__CU(qsa__cu.cuFuncSetAttribute(fn, QSA__CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, (int)sh));
    QSA__TRY(qsa__cu_launch(fn, name, gx, 1, 1, block, 1, 1, sh, NULL, args));
    QSA__CU(qsa__cu.cuCtxSynchronize());
    return QSA_OK;
}

/* A failed set-up step fails the test and jumps to its cleanup. */
#define K1_TRY(expr) do { qsa_result k1_r_ = (expr); if (k1_r_ != QSA_OK) { T_.failed++; \
    printf("    %s:%d: %s -> %s: %s\n", __FILE__, __LINE__, #expr, qsa_result_string(k1_r_), qsa_last_error()); \
    goto done; } } while (0)
#define K1_ALLOC(ptr, T, n) do { (ptr) = (T *)k1_host(&mem, sizeof(T) * (size_t)(n)); \
    if (!(ptr)) { T_.failed++; printf("    %s:%d: out of host memory\n", __FILE__, __LINE__); goto done; } } while (0)

/* Deterministic inputs: xorshift64*, reseeded by each test. */
static uint64_t k1_rng = 1;
static void k1_seed(uint64_t s) { k1_rng = s * 0x9E3779B97F4A7C15ull + 0x632BE59BD9B4E019ull; }
static double k1_u(double lo, double hi) {
    k1_rng ^= k1_rng >> 12;
    k1_rng ^= k1_rng << 25;
    k1_rng ^= k1_rng >> 27;
    return lo + (hi - lo) * (double)((k1_rng * 2685821657736338717ull) >> 11) * (1.0 / 9007199254740992.0);
}
static void k1_fill(float *x, size_t n, double lo, double hi) {
    for (size_t i = 0; i < n; i++) x[i] = (float)k1_u(lo, hi);
}
/* random fp16 values: bits in h (to the GPU), exact values in f (for the reference) */
static void k1_fill16(uint16_t *h, float *f, size_t n, double lo, double hi) {
    for (size_t i = 0; i < n; i++) {
        h[i] = qsa__f32_to_f16((float)k1_u(lo, hi));
        f[i] = qsa__f16_to_f32(h[i]);
    }
}

/* Counts i with !(|got - want| <= atol_i + rtol |want|) (NaN fails), atol_i = atolv ? atolv[i] : atol;
   prints the first five and, with -v, the worst |diff| / tol. */
static int k1_cmp(const char *what, const float *got, const double *want, size_t n, const double *atolv, double atol,
                  double rtol) {
    int bad = 0;
    double worst = 0;
    for (size_t i = 0; i < n; i++) {
        double tol = (atolv ? atolv[i] : atol) + rtol * fabs(want[i]), err = fabs((double)got[i] - want[i]);
        if (!(err <= tol)) {
            if (bad < 5)
                printf("    %s[%zu]: gpu %.9g, reference %.9g, |diff| %.3g > tol %.3g\n", what, i, (double)got[i], want[i],
                       err, tol);
            bad++;
        }
        if (tol > 0 && err / tol > worst) worst = err / tol;
    }
    if (bad) printf("    %s: %d of %zu values out of tolerance\n", what, bad, n);
    if (T_.verbose) printf("    %s: %zu values, worst |diff|/tol %.3g\n", what, n, worst);
    return bad;
}
/* Bitwise equality of two arrays of 4-byte (or, with word 2, 2-byte) elements; reports the first difference. */
static int k1_same(const char *what, const void *a, const void *b, size_t n, int word) {
    const unsigned char *x = (const unsigned char *)a, *y = (const unsigned char *)b;
    for (size_t i = 0; i < n; i++)
        if (memcmp(x + i * word, y + i * word, (size_t)word)) {
            uint32_t u = 0, v = 0;
            memcpy(&u, x + i * word, (size_t)word);
            memcpy(&v, y + i * word, (size_t)word);
            printf("    %s: element %zu differs (0x%08x vs 0x%08x) - must be bitwise identical\n", what, i, u, v);
            return 1;
        }
    return 0;
}
static void k1_h2f(const uint16_t *h, float *f, size_t n) {
    for (size_t i = 0; i < n; i++) f[i] = qsa__f16_to_f32(h[i]);
}

/* The host mirror of `struct qsa_expert_w` (kernels) = qsa__dexpert (qsa_runtime.h, >>cuda): 88 bytes. */
typedef struct k1_expert {
    unsigned long long gate_q, gate_s, up_q, up_s, down_q, down_s, gate16, up16, down16;
    float gate_s2, up_s2, down_s2, pad;
} k1_expert;

/* ---------------------------------------------------------------------------------------------- */
/* embedding                                                                                       */
/* ---------------------------------------------------------------------------------------------- */

TEST(gpu, k1_embed) {
    K1_NEED_GPU();
    enum { V = 50, H = 72, HC = 4, M = 6 };
    k1_mem mem = {{0}, 0, {0}, 0};
    uint16_t *tab;
    float *tf, *X, *want;
    int ids[M] = {3, 0, 49, -1, 50, 17}; /* -1 and 50 are out of range: zero rows */
    int h = H, hc = HC, v = V;
    CUdeviceptr dt, di, dx;
    K1_ALLOC(tab, uint16_t, V * H);
    K1_ALLOC(tf, float, V * H);
    K1_ALLOC(X, float, M * HC * H);
    K1_ALLOC(want, float, M * HC * H);
    k1_seed(1);
    k1_fill16(tab, tf, V * H, -2, 2);
    for (int t = 0; t < M; t++)
        for (int s = 0; s < HC; s++)
            for (int j = 0; j < H; j++)
                want[(t * HC + s) * H + j] = ids[t] >= 0 && ids[t] < V ? tf[ids[t] * H + j] : 0.0f;
    K1_TRY(k1_dev(&mem, &dt, tab, sizeof(uint16_t) * V * H));
    K1_TRY(k1_dev(&mem, &di, ids, sizeof ids));
    K1_TRY(k1_dev(&mem, &dx, NULL, sizeof(float) * M * HC * H));
    {
        void *args[] = {&dt, &di, &dx, &h, &hc, &v};
        K1_TRY(k1_launch("qsa_k_embed", M, 1, 256, args));
    }
    K1_TRY(k1_get(X, dx, sizeof(float) * M * HC * H));
    /* an fp16 -> fp32 copy is exact */
    CHECK(!k1_same("embed", X, want, (size_t)M * HC * H, 4));
done:
    k1_free(&mem);
}

/* ---------------------------------------------------------------------------------------------- */
/* rmsnorm                                                                                         */
/* ---------------------------------------------------------------------------------------------- */

static qsa_result k1_run_rmsnorm(const float *x, const float *w, float *y, uint16_t *y16, int M, int dim, int group,
                                 float eps, int one_plus) {
    k1_mem mem = {{0}, 0, {0}, 0};
    CUdeviceptr dx, dw, dy, dy16;
    size_t n = (size_t)M * dim;
    qsa_result r = k1_dev(&mem, &dx, x, n * 4);
    if (r == QSA_OK) r = k1_dev(&mem, &dw, w, (size_t)dim * 4);
    if (r == QSA_OK) r = k1_dev(&mem, &dy, NULL, n * 4);
    if (r == QSA_OK) r = k1_dev(&mem, &dy16, NULL, n * 2);
    if (r == QSA_OK) {
        void *args[] = {&dx, &dw, &dy, &dy16, &dim, &group, &eps, &one_plus};
        r = k1_launch("qsa_k_rmsnorm", (unsigned)(M * (dim / group)), 1, 256, args);
    }
    if (r == QSA_OK) r = k1_get(y, dy, n * 4);
    if (r == QSA_OK) r = k1_get(y16, dy16, n * 2);
    k1_free(&mem);
    return r;
}

TEST(gpu, k1_rmsnorm) {
    K1_NEED_GPU();
    enum { M = 37, DIM = 4 * 200, POS = 21 };
    k1_mem mem = {{0}, 0, {0}, 0};
    float *x, *w, *y, *y1, *ref, *x1;
    uint16_t *y16, *y16b;
    double *want;
    float eps = 1e-6f;
    K1_ALLOC(x, float, M * DIM);
    K1_ALLOC(x1, float, DIM);
    K1_ALLOC(w, float, DIM);
    K1_ALLOC(y, float, M * DIM);
    K1_ALLOC(y1, float, DIM);
    K1_ALLOC(ref, float, M * DIM);
    K1_ALLOC(y16, uint16_t, M * DIM);
    K1_ALLOC(y16b, uint16_t, DIM);
    K1_ALLOC(want, double, M * DIM);
    k1_seed(2);
    k1_fill(x, (size_t)M * DIM, -3, 3);
    k1_fill(w, DIM, -0.5, 0.5);
    for (int gi = 0; gi < 2; gi++) {
        int group = gi == 0 ? 200 : DIM; /* hyper-connection groups of H, and a whole-row norm */
        for (int one_plus = 0; one_plus < 2; one_plus++) {
            char what[64];
            snprintf(what, sizeof what, "rmsnorm group %d %s", group, one_plus ? "(1+w)" : "(w)");
            K1_TRY(k1_run_rmsnorm(x, w, y, y16, M, DIM, group, eps, one_plus));
            for (int t = 0; t < M; t++) {
                if (one_plus) {
                    qsa__rmsnorm_1p(x + (size_t)t * DIM, w, ref + (size_t)t * DIM, DIM, group, eps); /* the CPU backend */
                } else {
                    for (int g0 = 0; g0 < DIM; g0 += group) {
                        const float *xr = x + (size_t)t * DIM + g0;
                        float ss = 0.0f;
                        for (int i = 0; i < group; i++) ss += xr[i] * xr[i];
                        float inv = 1.0f / sqrtf(ss / (float)group + eps);
                        for (int i = 0; i < group; i++) ref[(size_t)t * DIM + g0 + i] = xr[i] * inv * w[g0 + i];
                    }
                }
            }
            for (size_t i = 0; i < (size_t)M * DIM; i++) want[i] = ref[i];
            /* The only difference from the CPU is the order of the sum of squares (a block tree instead
               of a sequential sum): relative error of the sum <= group * 2^-24 in the worst case
               (1.2e-5 / 4.8e-5 for groups of 200 / 800), typically sqrt(group) * 2^-24; the inverse square
               root halves it.  rtol 2e-5 plus 1e-7 absolute for values near zero. */
            CHECK(k1_cmp(what, y, want, (size_t)M * DIM, NULL, 1e-7, 2e-5) == 0);
            /* the fp16 copy is the rounded fp32 output */
            int mism = 0;
            for (size_t i = 0; i < (size_t)M * DIM; i++) mism += y16[i] != qsa__f32_to_f16(y[i]);
            CHECKF(mism == 0, "%s: %d fp16 outputs are not the rounded fp32 outputs", what, mism);
            /* batch invariance: row POS alone */
            memcpy(x1, x + (size_t)POS * DIM, sizeof(float) * DIM);
            K1_TRY(k1_run_rmsnorm(x1, w, y1, y16b, 1, DIM, group, eps, one_plus));
            CHECK(!k1_same(what, y1, y + (size_t)POS * DIM, DIM, 4));
        }
    }
done:
    k1_free(&mem);
}

/* ---------------------------------------------------------------------------------------------- */
/* hyper-connection mixing and elementwise kernels                                                 */
/* ---------------------------------------------------------------------------------------------- */

TEST(gpu, k1_gres_mix) {
    K1_NEED_GPU();
    enum { M = 5, H = 300, HC = 4 };
    k1_mem mem = {{0}, 0, {0}, 0};
    float *mw, *xn, *inp;
    uint16_t *inp16;
    double *want, *atol;
    int h = H, hc = HC;
    CUdeviceptr dmw, dxn, dinp, dinp16;
    K1_ALLOC(mw, float, M * HC * H);
    K1_ALLOC(xn, float, M * HC * H);
    K1_ALLOC(inp, float, M * H);
    K1_ALLOC(inp16, uint16_t, M * H);
    K1_ALLOC(want, double, M * H);
    K1_ALLOC(atol, double, M * H);
    k1_seed(3);
    k1_fill(mw, (size_t)M * HC * H, -6, 6);
    k1_fill(xn, (size_t)M * HC * H, -3, 3);
    for (int t = 0; t < M; t++)
        for (int j = 0; j < H; j++) {
            float acc = 0.0f; /* the CPU backend's loop (qsa__gres_chunk) */
            double mag = 0;
            for (int s = 0; s < HC; s++) {
                /* the device's mix weights are interleaved by stream: [t][j][s] (qsa__dlin_up_hc) */
                float p = qsa__sigmoid(mw[(t * H + j) * HC + s]) * xn[(t * HC + s) * H + j];
                acc += p;
                mag += fabs(p);
            }
            want[t * H + j] = acc / (float)HC;
            /* same operations; only expf may differ by ~2 ulp between libm and CUDA: 1e-6 of the
               magnitude of the terms */
            atol[t * H + j] = 1e-6 * mag / HC + 1e-30;
        }
    K1_TRY(k1_dev(&mem, &dmw, mw, sizeof(float) * M * HC * H));
    K1_TRY(k1_dev(&mem, &dxn, xn, sizeof(float) * M * HC * H));
    K1_TRY(k1_dev(&mem, &dinp, NULL, sizeof(float) * M * H));
    K1_TRY(k1_dev(&mem, &dinp16, NULL, sizeof(uint16_t) * M * H));
    {
        void *args[] = {&dmw, &dxn, &dinp, &dinp16, &h, &hc};
        K1_TRY(k1_launch("qsa_k_gres_mix", M, 1, 256, args));
    }
    K1_TRY(k1_get(inp, dinp, sizeof(float) * M * H));
    K1_TRY(k1_get(inp16, dinp16, sizeof(uint16_t) * M * H));
    CHECK(k1_cmp("gres_mix", inp, want, (size_t)M * H, atol, 0, 0) == 0);
    {
        int mism = 0;
        for (int i = 0; i < M * H; i++) mism += inp16[i] != qsa__f32_to_f16(inp[i]);
        CHECKF(mism == 0, "%d fp16 outputs are not the rounded fp32 outputs", mism);
    }
done:
    k1_free(&mem);
}

TEST(gpu, k1_elementwise) {
    K1_NEED_GPU();
    enum { N = 3001, M = 7, H = 130, HC = 4 };
    k1_mem mem = {{0}, 0, {0}, 0};
    float *x, *y, *inj, *out, *X, *Xw;
    uint16_t *x16, *h16;
    double *want, *wantX;
    int n = N, hc = HC, h = H;
    float scale = 0.25f;
    CUdeviceptr dx, dx16, dinj, dout, dX;
    K1_ALLOC(x, float, N);
    K1_ALLOC(y, float, N);
    K1_ALLOC(x16, uint16_t, N);
    K1_ALLOC(h16, uint16_t, N);
    K1_ALLOC(want, double, N);
    K1_ALLOC(inj, float, M * HC);
    K1_ALLOC(out, float, M * H);
    K1_ALLOC(X, float, M * HC * H);
    K1_ALLOC(Xw, float, M * HC * H);
    K1_ALLOC(wantX, double, M * HC * H);
    k1_seed(4);
    k1_fill(x, N, -30, 30);
    x[0] = -90.0f; /* silu underflows towards -0 */
    x[1] = 0.0f;
    /* silu_scale: x = silu(x * scale), in place, plus the fp16 copy */
    K1_TRY(k1_dev(&mem, &dx, x, sizeof(float) * N));
    K1_TRY(k1_dev(&mem, &dx16, NULL, sizeof(uint16_t) * N));
    {
        void *args[] = {&dx, &dx16, &n, &scale};
        K1_TRY(k1_launch("qsa_k_silu_scale", (N + 255) / 256, 1, 256, args));
    }
    K1_TRY(k1_get(y, dx, sizeof(float) * N));
    K1_TRY(k1_get(x16, dx16, sizeof(uint16_t) * N));
    for (int i = 0; i < N; i++) want[i] = qsa__silu(x[i] / 4.0f); /* the CPU's silu(x / hc), hc = 4 */
    /* x*0.25 == x/4 exactly; expf differs by <= 2 ulp between libm and CUDA, the division is exact
       rounding on both: rtol 1e-6; atol covers results that underflow to (sub)normal tiny values */
    CHECK(k1_cmp("silu_scale", y, want, N, NULL, 1e-37, 1e-6) == 0);
    {
        int mism = 0;
        for (int i = 0; i < N; i++) mism += x16[i] != qsa__f32_to_f16(y[i]);
        CHECKF(mism == 0, "silu_scale: %d fp16 outputs are not the rounded fp32 outputs", mism);
    }
    /* to_f16: round to nearest even, overflow to inf, subnormals: bitwise against the host's conversion */
    x[2] = 70000.0f;
    x[3] = -65520.0f; /* rounds to -inf */
    x[4] = 65519.0f;  /* rounds to 65504 */
    x[5] = 3e-6f;     /* fp16 subnormal */
    x[6] = 1e-9f;     /* underflows to 0 */
    x[7] = 2.9802322e-08f; /* exactly half the smallest subnormal: ties to even (0) */
    K1_TRY(k1_put(dx, x, sizeof(float) * N));
    K1_TRY(k1_poison(dx16, sizeof(uint16_t) * N));
    {
        void *args[] = {&dx, &dx16, &n};
        K1_TRY(k1_launch("qsa_k_to_f16", (N + 255) / 256, 1, 256, args));
    }
    K1_TRY(k1_get(x16, dx16, sizeof(uint16_t) * N));
    for (int i = 0; i < N; i++) h16[i] = qsa__f32_to_f16(x[i]);
    CHECK(!k1_same("to_f16", x16, h16, N, 2));
    /* inject: X[t][s*H+j] += w * out[t][j], w = 2 * sigmoid(inj[t][s] / hc) from the raw projection
       (the CPU's qsa__gres_chunk weight, then its qsa__inject loop): the weight to expf's ulps (as
       silu_scale above), then one IEEE multiply and one add */
    k1_fill(inj, M * HC, -3, 3);
    k1_fill(out, (size_t)M * H, -4, 4);
    k1_fill(X, (size_t)M * HC * H, -4, 4);
    memcpy(Xw, X, sizeof(float) * M * HC * H);
    for (int t = 0; t < M; t++)
        for (int s = 0; s < HC; s++) {
            float w = 2.0f * qsa__sigmoid(inj[t * HC + s] / (float)HC);
            for (int j = 0; j < H; j++) Xw[(t * HC + s) * H + j] += w * out[t * H + j];
        }
    K1_TRY(k1_dev(&mem, &dX, X, sizeof(float) * M * HC * H));
    K1_TRY(k1_dev(&mem, &dinj, inj, sizeof(float) * M * HC));
    K1_TRY(k1_dev(&mem, &dout, out, sizeof(float) * M * H));
    {
        void *args[] = {&dX, &dinj, &dout, &h, &hc};
        K1_TRY(k1_launch("qsa_k_inject", M, 1, 256, args));
    }
    K1_TRY(k1_get(X, dX, sizeof(float) * M * HC * H));
    for (int i = 0; i < M * HC * H; i++) wantX[i] = Xw[i];
    CHECK(k1_cmp("inject", X, wantX, (size_t)M * HC * H, NULL, 1e-5, 1e-6) == 0); /* |w| < 2, |out| <= 4: ulps of w */
done:
    k1_free(&mem);
}

/* qsa_k_inject_rmsnorm: the bits of qsa_k_inject then qsa_k_rmsnorm (group H, one_plus) — the
   updated streams, their norm and its fp16 copy (H 2560 as the real model, 130 ragged, 5000 long). */
static void k1_inject_norm_case(int M, int H) {
    enum { HC = 4 };
    k1_mem mem = {{0}, 0, {0}, 0};
    float *X, *inj, *out, *nw, *Xa, *Xb, *ya, *yb, eps = 1e-6f;
    uint16_t *ha, *hb;
    int hc = HC, hcH = HC * H, one = 1, n = M * HC * H;
    CUdeviceptr dXa, dXb, dinj, dout, dnw, dya, dyb, dha, dhb;
    K1_ALLOC(X, float, n);
    K1_ALLOC(inj, float, M * HC);
    K1_ALLOC(out, float, M * H);
    K1_ALLOC(nw, float, HC * H);
    K1_ALLOC(Xa, float, n);
    K1_ALLOC(Xb, float, n);
    K1_ALLOC(ya, float, n);
    K1_ALLOC(yb, float, n);
    K1_ALLOC(ha, uint16_t, n);
    K1_ALLOC(hb, uint16_t, n);
    k1_seed(77 + (uint64_t)H);
    k1_fill(X, (size_t)n, -3, 3);
    k1_fill(inj, (size_t)M * HC, -3, 3);
    k1_fill(out, (size_t)M * H, -2, 2);
    k1_fill(nw, (size_t)HC * H, -0.5, 0.5);
    K1_TRY(k1_dev(&mem, &dXa, X, sizeof(float) * n));
    K1_TRY(k1_dev(&mem, &dXb, X, sizeof(float) * n));
    K1_TRY(k1_dev(&mem, &dinj, inj, sizeof(float) * M * HC));
    K1_TRY(k1_dev(&mem, &dout, out, sizeof(float) * M * H));
    K1_TRY(k1_dev(&mem, &dnw, nw, sizeof(float) * HC * H));
    K1_TRY(k1_dev(&mem, &dya, NULL, sizeof(float) * n));
    K1_TRY(k1_dev(&mem, &dyb, NULL, sizeof(float) * n));
    K1_TRY(k1_dev(&mem, &dha, NULL, sizeof(uint16_t) * n));
    K1_TRY(k1_dev(&mem, &dhb, NULL, sizeof(uint16_t) * n));
    {
        void *a1[] = {&dXa, &dinj, &dout, &H, &hc};
        K1_TRY(k1_launch("qsa_k_inject", M, (H + 255) / 256, 256, a1));
        void *a2[] = {&dXa, &dnw, &dya, &dha, &hcH, &H, &eps, &one};
        K1_TRY(k1_launch("qsa_k_rmsnorm", M * HC, 1, 256, a2));
        void *a3[] = {&dXb, &dinj, &dout, &dnw, &dyb, &dhb, &H, &hc, &eps};
        K1_TRY(k1_launch("qsa_k_inject_rmsnorm", M * HC, 1, 256, a3));
    }
    K1_TRY(k1_get(Xa, dXa, sizeof(float) * n));
    K1_TRY(k1_get(Xb, dXb, sizeof(float) * n));
    K1_TRY(k1_get(ya, dya, sizeof(float) * n));
    K1_TRY(k1_get(yb, dyb, sizeof(float) * n));
    K1_TRY(k1_get(ha, dha, sizeof(uint16_t) * n));
    K1_TRY(k1_get(hb, dhb, sizeof(uint16_t) * n));
    CHECK(!k1_same("inject_rmsnorm: streams", Xa, Xb, (size_t)n, 4));
    CHECK(!k1_same("inject_rmsnorm: norm", ya, yb, (size_t)n, 4));
    CHECK(!k1_same("inject_rmsnorm: fp16 norm", ha, hb, (size_t)n, 2));
done:
    k1_free(&mem);
}

TEST(gpu, k1_inject_rmsnorm_equals_two_kernels) {
    K1_NEED_GPU();
    k1_inject_norm_case(7, 2560);
    k1_inject_norm_case(3, 130);
    k1_inject_norm_case(2, 5000); /* past the 16 * 256 values held in registers: the loop form */
}

/* The greedy ids of the batched step: greedy rows of qsa_k_sample_cand1 and 2 (temperature 0: the arg-max alone) give
   qsa__argmax of each row (the lowest index among the maxima; NaN never wins; a row without a number gives 0), in the
   plain layout and in vocabulary slices of W columns (as the batched step's lm_head writes them: 1280, 64, 5000, the
   last slice narrower), over three chunks of ids. */
TEST(gpu, k1_argmax) {
    K1_NEED_GPU();
    enum { M = 5, V = 20003 };
    k1_mem mem = {{0}, 0, {0}, 0};
    float *l, *sl;
    int32_t out[M * QSA__CAND_STRIDE(1)];
    int want[M], v = V, Mv = M, b0 = 0, kmax = 1, P = QSA__CAND_CHUNKS(V), zero = 0;
    qsa__cand_row rows[M];
    CUdeviceptr dl, dout, drows, dpid, dv, dam, dcv, dci, dzp;
    K1_ALLOC(l, float, M * V);
    k1_seed(5);
    k1_fill(l, (size_t)M * V, -10, 10);
    l[0 * V + 16000] = 20.0f; /* row 0: a tie between 1234 and 16000 (another chunk): the lower index wins */
    l[0 * V + 1234] = 20.0f;
    for (int i = 0; i < V; i++) l[1 * V + i] = 1.5f; /* row 1: all equal: 0 */
    for (int i = 0; i < V; i++) l[2 * V + i] = -INFINITY; /* row 2: all -inf but one: 8777 */
    l[2 * V + 8777] = -1e30f;
    l[3 * V + V - 1] = 50.0f; /* row 3: the last element */
    for (int t = 0; t < M; t++) want[t] = qsa__argmax(l + (size_t)t * V, V);
    l[4 * V + 10] = NAN; /* row 4: NaNs never win (the CPU would keep index 0 if l[0] were NaN) */
    l[4 * V + 0] = NAN;
    {
        int b = 1;
        for (int i = 2; i < V; i++) if (l[4 * V + i] > l[4 * V + b]) b = i;
        want[4] = b;
    }
    memset(rows, 0, sizeof rows);
    for (int t = 0; t < M; t++) rows[t].pen = 1.0f;
    K1_ALLOC(sl, float, M * V);
    K1_TRY(k1_dev(&mem, &dout, NULL, sizeof out));
    K1_TRY(k1_dev(&mem, &dl, NULL, sizeof(float) * M * V));
    K1_TRY(k1_dev(&mem, &drows, rows, sizeof rows));
    K1_TRY(k1_dev(&mem, &dpid, NULL, 4));
    K1_TRY(k1_dev(&mem, &dv, NULL, sizeof(float) * M * V));
    K1_TRY(k1_dev(&mem, &dam, NULL, sizeof(float) * 2 * M * P));
    K1_TRY(k1_dev(&mem, &dcv, NULL, sizeof(float) * M * P));
    K1_TRY(k1_dev(&mem, &dci, NULL, sizeof(int32_t) * M * P));
    K1_TRY(k1_dev(&mem, &dzp, NULL, sizeof(uint64_t) * M * P));
    static const int widths[] = {V, 0, 1280, 64, 5000};
    for (size_t wi = 0; wi < sizeof widths / sizeof widths[0]; wi++) {
        int w = widths[wi], W = w > 0 && w < V ? w : V;
        for (int c0 = 0; c0 < V; c0 += W) {
            int wc = V - c0 < W ? V - c0 : W;
            for (int t = 0; t < M; t++) memcpy(sl + (size_t)c0 * M + (size_t)t * wc, l + (size_t)t * V + c0, sizeof(float) * wc);
        }
        K1_TRY(k1_put(dl, sl, sizeof(float) * M * V));
        void *a1[] = {&dl, &v, &w, &Mv, &b0, &drows, &dpid, &dv, &dam, &dcv, &dci, &kmax};
        K1_TRY(k1_launch("qsa_k_sample_cand1", P, M, 1024, a1));
        void *a2[] = {&v, &b0, &P, &drows, &dam, &dcv, &dci, &dzp, &dout, &kmax};
        K1_TRY(k1_launch("qsa_k_sample_cand2", M, 1, 1024, a2));
        K1_TRY(k1_get(out, dout, sizeof out));
        for (int t = 0; t < M; t++)
            CHECKF(out[t * QSA__CAND_STRIDE(1)] == want[t] && out[t * QSA__CAND_STRIDE(1) + 1] == zero,
                   "argmax W %d row %d: gpu %d (%d candidates), reference %d", w, t, out[t * QSA__CAND_STRIDE(1)],
                   out[t * QSA__CAND_STRIDE(1) + 1], want[t]);
    }
    CHECK(want[0] == 1234 && want[1] == 0 && want[2] == 8777 && want[3] == V - 1);
done:
    k1_free(&mem);
}

/* qsa_k_sample_cand1 and 2 reduce a row to the candidates of its sampler's draw and qsa__sampler_from_cand finishes it: the
   draws of qsa_sampler_sample on the whole row, at the real vocabulary, in the plain layout and in vocabulary slices,
   over repeated draws (each sampler's RNG advancing as its twin's).  The rows: a repetition penalty above and below 1
   (over a window, and the whole history) on the top ids, NaNs, ties at the threshold, k = QSA__CAND_MAX, a greedy row
   with a penalty and a NaN at id 0, an infinite logit, a row of -inf and NaN, a temperature so small that the largest
   logit over it overflows, a row of equal logits, zeros of both signs at the top; and whole-row draws (no top-k): top-p
   and min-p (with a penalty) over rows whose best ids decide them, and top-p over a flat row that its QSA__CAND_Z best
   cannot decide (but where its draw falls among them at both ends of its sum's bounds: ~half the draws at 8,792 ids),
   drawn from the penalised logits the kernels leave (as qsa__cuda_decode_batch sends them); the
   temperature alone over a row whose best decide it (with a penalty) and over a flat row (at the real vocabulary, its
   best decide ~3% of the draws).  Where the
   draw is not the arg-max, the candidates are qsa__cand_topk's ids of the host's tempered row in its order (the draw's) with their
   bits, and a
   whole-row draw's sum (qsa_k_sample_z) is the host's qsa__zsum of that row.  The rows go in launches of G
   (a row of the batch at b0 + its row in the launch); a vocabulary of 8,792 ids has a last chunk of 600, shorter
   than k = 1,024. */
typedef struct {
    float temp, top_p, min_p, pen;
    int top_k, last_n;
} k1_sc_case;
static void k1_sample_cand_case(int V, int G) {
    enum { M = 15, DRAWS = 6, NH = 200 };
    static const k1_sc_case cs[M] = {
        {0.7f, 0.8f, 0.0f, 1.3f, 20, 64}, {1.0f, 0.95f, 0.05f, 1.0f, 50, 0}, {0.5f, 0.0f, 0.0f, 1.0f, QSA__CAND_MAX, 0},
        {0.0f, 0.0f, 0.0f, 1.2f, 0, 64},  {0.6f, 0.0f, 0.0f, 1.0f, 20, 0},   {0.9f, 0.0f, 0.0f, 1.0f, 20, 0},
        {2e-38f, 0.0f, 0.0f, 1.0f, 20, 0}, {0.8f, 0.5f, 0.0f, 1.0f, 20, 0},  {1.0f, 0.0f, 0.0f, 1.0f, 8, 0},
        {1.1f, 0.9f, 0.0f, 0.8f, 30, -1}, {1.0f, 0.9f, 0.0f, 1.0f, 0, 0},  {1.0f, 0.0f, 0.1f, 1.2f, 0, 64},
        {1.0f, 0.95f, 0.0f, 1.0f, 0, 0},  {0.5f, 0.0f, 0.0f, 1.3f, 0, 64}, {0.7f, 0.0f, 0.0f, 1.0f, 0, 0},
    };
    k1_mem mem = {{0}, 0, {0}, 0};
    qsa_sampler *a[M] = {0}, *b[M] = {0};
    float *l, *sl, *row, *dlh, *prow;
    int32_t *hist, *pid, *out, *idx;
    qsa__cand_row rows[M];
    int v = V, Mv = M, b0 = 0, kmax = QSA__CAND_MAX, stride = QSA__CAND_STRIDE(QSA__CAND_MAX), npid = 0, ncand = 0;
    int P = QSA__CAND_CHUNKS(V), zdecided = 0, zrow = 0, flat = 0, bounded = 0;
    CUdeviceptr dl, drows, dpid, dv, dout, dam, dcv, dci, dzp;
    K1_ALLOC(l, float, (size_t)M * V);
    K1_ALLOC(sl, float, (size_t)M * V);
    K1_ALLOC(dlh, float, (size_t)M * V);
    K1_ALLOC(prow, float, V);
    K1_ALLOC(row, float, V);
    K1_ALLOC(idx, int32_t, V);
    K1_ALLOC(hist, int32_t, NH);
    K1_ALLOC(pid, int32_t, (size_t)M * NH);
    K1_ALLOC(out, int32_t, (size_t)M * stride);
    k1_seed(11);
    k1_fill(l, (size_t)M * V, -12, 12);
    for (int i = 0; i < NH; i++) hist[i] = (int32_t)k1_u(0, V); /* the penalised ids: some of the top ones below */
    for (int i = 0; i < 40; i++) { /* rows 0, 3, 9: top logits (of both signs of effect), some in the history */
        int id = 1000 + 37 * i;
        l[0 * V + id] = 14.0f + 0.25f * (float)(i % 8);
        l[3 * V + id] = 14.0f + 0.25f * (float)(i % 8);
        l[9 * V + id] = (i & 1 ? -0.5f : 13.0f) + 0.125f * (float)(i % 4);
        l[10 * V + id] = l[11 * V + id] = l[13 * V + id] = 20.0f + 0.25f * (float)(i % 8); /* rows 10, 11, 13: their best decide them */
        if (i % 3 == 0) hist[NH - 1 - i] = id;
    }
    for (int i = 0; i < V; i += 97) l[1 * V + i] = NAN; /* row 1: NaNs, and 60 equal logits at the threshold */
    for (int i = 0; i < 60; i++) l[1 * V + 5000 + 13 * i] = 15.0f;
    l[3 * V + 0] = NAN;
    l[4 * V + 777] = INFINITY;
    for (int i = 0; i < V; i++) l[5 * V + i] = i % 5 ? -INFINITY : NAN;
    for (int i = 0; i < V; i++) l[7 * V + i] = 1.5f;
    for (int i = 0; i < V; i++) l[8 * V + i] = l[8 * V + i] > 0 ? -l[8 * V + i] : l[8 * V + i];
    for (int i = 0; i < 12; i++) l[8 * V + (3000 + 1000 * i) % V] = i & 1 ? -0.0f : 0.0f;
    for (int r = 0; r < M; r++) {
        qsa_sampling_params sp;
        memset(&sp, 0, sizeof sp);
        sp.temperature = cs[r].temp;
        sp.top_p = cs[r].top_p;
        sp.min_p = cs[r].min_p;
        sp.repetition_penalty = cs[r].pen;
        sp.top_k = cs[r].top_k;
        sp.penalty_last_n = cs[r].last_n;
        sp.seed = 100 + (uint64_t)r;
        CHECK_OK(qsa_sampler_create(&sp, &a[r]));
        CHECK_OK(qsa_sampler_create(&sp, &b[r]));
        if (!a[r] || !b[r]) goto done;
        int k = qsa__sampler_cand_k(b[r], V);
        CHECKF(k == (cs[r].temp > 0 ? (cs[r].top_k ? cs[r].top_k : QSA__CAND_Z) : 0), "row %d: candidates %d", r, k);
        int np = qsa__sampler_pen_ids(b[r], hist, NH, V, pid + npid, M * NH - npid);
        CHECKF(np >= 0 && (np > 0) == (cs[r].pen != 1.0f), "row %d: %d penalised ids", r, np);
        if (np < 0) goto done;
        rows[r].temp = cs[r].temp;
        rows[r].pen = cs[r].pen;
        rows[r].k = k;
        rows[r].pen_off = npid;
        rows[r].pen_n = np;
        rows[r].z = qsa__sampler_whole_z(b[r], V);
        CHECK(rows[r].z == (r >= 10));
        npid += np;
    }
    K1_TRY(k1_dev(&mem, &dl, NULL, sizeof(float) * (size_t)M * V));
    K1_TRY(k1_dev(&mem, &dv, NULL, sizeof(float) * (size_t)G * V));
    K1_TRY(k1_dev(&mem, &drows, rows, sizeof rows));
    K1_TRY(k1_dev(&mem, &dpid, pid, sizeof(int32_t) * (size_t)(npid ? npid : 1)));
    K1_TRY(k1_dev(&mem, &dout, NULL, sizeof(int32_t) * (size_t)M * stride));
    K1_TRY(k1_dev(&mem, &dam, NULL, sizeof(float) * 2 * (size_t)G * P));
    K1_TRY(k1_dev(&mem, &dcv, NULL, sizeof(float) * (size_t)G * P * QSA__CAND_MAX));
    K1_TRY(k1_dev(&mem, &dci, NULL, sizeof(int32_t) * (size_t)G * P * QSA__CAND_MAX));
    K1_TRY(k1_dev(&mem, &dzp, NULL, sizeof(uint64_t) * (size_t)G * P));
    static const int widths[] = {0, 4096};
    for (size_t wi = 0; wi < sizeof widths / sizeof widths[0]; wi++) {
        int w = widths[wi], W = w > 0 ? w : V;
        for (int c0 = 0; c0 < V; c0 += W) {
            int wc = V - c0 < W ? V - c0 : W;
            for (int t = 0; t < M; t++) memcpy(sl + (size_t)c0 * M + (size_t)t * wc, l + (size_t)t * V + c0, sizeof(float) * wc);
        }
        for (int d = 0; d < DRAWS; d++) {
            K1_TRY(k1_put(dl, sl, sizeof(float) * (size_t)M * V)); /* (the penalty changes them in place) */
            for (b0 = 0; b0 < M; b0 += G) {
                unsigned nb = (unsigned)(M - b0 < G ? M - b0 : G);
                void *a1[] = {&dl, &v, &w, &Mv, &b0, &drows, &dpid, &dv, &dam, &dcv, &dci, &kmax};
                K1_TRY(k1_launch("qsa_k_sample_cand1", P, nb, 1024, a1));
                void *az[] = {&v, &b0, &drows, &dv, &dam, &dzp};
                K1_TRY(k1_launch("qsa_k_sample_z", P, nb, 1024, az));
                void *a2[] = {&v, &b0, &P, &drows, &dam, &dcv, &dci, &dzp, &dout, &kmax};
                K1_TRY(k1_launch("qsa_k_sample_cand2", nb, 1, 1024, a2));
            }
            K1_TRY(k1_get(out, dout, sizeof(int32_t) * (size_t)M * stride));
            K1_TRY(k1_get(dlh, dl, sizeof(float) * (size_t)M * V)); /* (the penalised logits) */
            for (int r = 0; r < M; r++) {
                const int32_t *o = out + (size_t)r * stride;
                memcpy(row, l + (size_t)r * V, sizeof(float) * V);
                int32_t want = qsa_sampler_sample(a[r], row, V, hist, NH), got;
                int32_t cut = qsa__sampler_cand_draw(b[r], o, kmax, 0); /* (the step's test) */
                CHECKF(cut != -1 && (cut != -2 || r == 12 || r == 14), "W %d draw %d row %d: cut %d", w, d, r, cut);
                CHECKF(o[1] <= 0 || qsa__sampler_cand_decides(b[r], o, kmax) == (cut >= 0), "W %d draw %d row %d: the step's test "
                       "differs from the draw's (%d)", w, d, r, cut);
                if (cut == -2) { /* the row as the step sends it: the penalised logits, out of their slices */
                    for (int c0 = 0; c0 < V; c0 += W) {
                        int wc = V - c0 < W ? V - c0 : W;
                        memcpy(prow + c0, dlh + (size_t)c0 * M + (size_t)r * wc, sizeof(float) * wc);
                    }
                    got = qsa__sampler_sample_z(b[r], prow, V, NULL, 0, qsa__cand_z(o, kmax));
                } else {
                    got = qsa__sampler_from_cand(b[r], o, kmax);
                }
                CHECKF(cut == -2 || cut == got, "W %d draw %d row %d: the test's id %d, the draw %d", w, d, r, cut, got);
                zdecided += (r == 10 || r == 11 || r == 13) && cut >= 0;
                flat += r == 14 && cut == -2;
                bounded += r == 12 && cut >= 0; /* (top-p 0.95 over a flat row: its cut passes the best QSA__CAND_Z) */
                CHECKF(got == want, "W %d draw %d row %d: device candidates draw %d, the host %d", w, d, r, got, want);
                if (d || o[1] == 0) continue;
                if (rows[r].z) { /* row holds the host's tempered logits now */
                    float tmax = -INFINITY;
                    for (int i = 0; i < V; i++) tmax = row[i] > tmax ? row[i] : tmax;
                    uint64_t zh = qsa__zsum(row, V, tmax), zd = (uint64_t)(uint32_t)o[2 + 2 * kmax] | (uint64_t)(uint32_t)o[3 + 2 * kmax] << 32;
                    CHECKF(zh == zd && zd > 0, "W %d row %d: the row's sum %llu on the device, %llu on the host", w, r,
                           (unsigned long long)zd, (unsigned long long)zh);
                    zrow++;
                }
                /* the candidates: row holds the host's tempered logits now */
                ncand++;
                qsa__cand_topk(row, idx, V, o[1]); /* (in the draw's order, as the kernel ranks them) */
                int same = o[1] == (cs[r].top_k ? cs[r].top_k : QSA__CAND_Z);
                for (int i = 0; same && i < o[1]; i++) {
                    float f;
                    memcpy(&f, &o[2 + kmax + i], 4);
                    same = o[2 + i] == idx[i] && !memcmp(&f, &row[idx[i]], 4);
                }
                CHECKF(same, "W %d row %d: the %d candidates are not the host's top-k", w, r, o[1]);
            }
        }
    }
    /* the rows that must reduce to their arg-max did, and the others to candidates */
    CHECKF(ncand == 2 * 11, "%d rows of candidates (expected 11 in each layout)", ncand);
    CHECKF(zrow == 2 * 5 && zdecided == 2 * 3 * DRAWS && (V < 100000 ? bounded > 0 : flat > 0),
           "%d whole-row sums compared, %d whole-row draws decided by their candidates, %d of the flat row's by the temperature "
           "alone not, %d of its top-p draws decided", zrow, zdecided, flat, bounded);
    printf("    V %d: of a flat row's %d draws, %d by the temperature alone from the penalised row, %d with top-p 0.95 from "
           "the candidates\n", V, 2 * DRAWS, flat, bounded);
    CHECK(out[3 * stride + 1] == 0 && out[4 * stride + 1] == 0 && out[4 * stride] == 777 && out[5 * stride + 1] == 0 &&
          out[6 * stride + 1] == 0 && out[2 * stride + 1] == QSA__CAND_MAX);
done:
    for (int r = 0; r < M; r++) {
        qsa_sampler_free(a[r]);
        qsa_sampler_free(b[r]);
    }
    k1_free(&mem);
}
TEST(gpu, k1_sample_cand_draws_as_the_host) {
    K1_NEED_GPU();
    k1_sample_cand_case(248320, 16);
    k1_sample_cand_case(248320, 4); /* rows at b0 4 and 8 */
    k1_sample_cand_case(8792, 3);
}

/* ---------------------------------------------------------------------------------------------- */
/* GEMM                                                                                            */
/* ---------------------------------------------------------------------------------------------- */

/* Blocks for the recommended launch of qsa_k_gemm_* (any grid is correct). */
static unsigned k1_gemm_grid(int M, int N) {
    return M <= 64 ? (unsigned)(((M + 15) / 16) * ((N + 15) / 16)) : (unsigned)(((M + 63) / 64) * ((N + 63) / 64));
}

/* The dequantised values of NVFP4 weights [N][K] with global scale s2, by the CPU backend's qsa__lin_row
   (fp32: e2m1 * e4m3 * s2). */
static void k1_dequant_nvfp4(const uint8_t *q, const uint8_t *s, float s2, float *wf, int N, int K) {
    qsa__lin l;
    memset(&l, 0, sizeof l);
    l.out = N;
    l.in = K;
    l.q = q;
    l.qscale = s;
    l.qscale2 = s2;
    float *tmp = (float *)malloc(sizeof(float) * (size_t)K);
    for (int n = 0; n < N && tmp; n++) {
        const float *row = qsa__lin_row(&l, n, tmp);
        memcpy(wf + (size_t)n * K, row, sizeof(float) * (size_t)K);
    }
    free(tmp);
}

/* Packed NVFP4 weights in the device order (kernels.cu: qsa_dq8; the runtime's qsa_k_nvfp4_order on
   upload): element j < 4 of a device word with code c (sign bit 3) in byte 1, 3, 0, 2 (j = 0..3) at bits
   7 (sign) and 3-1 (magnitude), element j >= 4 in the byte of j - 4 at bits 6-4 (magnitude) and 0
   (sign), as k1_code_bits writes it.  Rows of K elements (the checkpoint's byte i of a row holds
   elements 2i and 2i + 1); K % 32 == 0, the fragment order: word t of each 16-byte block holds the
   block's elements 2t + 8 (j / 2) + j % 2; otherwise word i the elements 8i .. 8i + 7.  bytes: whole
   rows. */
static unsigned k1_nib(const uint8_t *src, size_t e) { return (src[e / 2] >> (4 * (e & 1))) & 15u; }
static uint32_t k1_code_bits(int j, unsigned c) {
    static const int byte_of[4] = {1, 3, 0, 2};
    uint32_t v = j < 4 ? ((c & 8u) << 4) | ((c & 7u) << 1) : ((c & 7u) << 4) | (c >> 3);
    return v << (8 * byte_of[j & 3]);
}
static void k1_order_q(uint8_t *dst, const uint8_t *src, size_t bytes, int K) {
    const int frag = K % 32 == 0;
    for (size_t i = 0; i + 4 <= bytes; i += 4) {
        size_t w = i / 4, base = frag ? (w / 4) * 32 : w * 8; /* the first element of the block / word */
        unsigned t = frag ? (unsigned)(w % 4) : 0u;
        uint32_t v = 0;
        for (int j = 0; j < 8; j++) {
            size_t e = frag ? base + 2 * t + 8 * (j / 2) + (j % 2) : base + (size_t)j;
            v |= k1_code_bits(j, k1_nib(src, e));
        }
        for (int b = 0; b < 4; b++) dst[i + b] = (uint8_t)(v >> (8 * b));
    }
}
/* device memory owned by m: checkpoint-order packed weights q (bytes, rows of K elements) in the device
   order, `off` bytes into the allocation (*d is its start) */
static qsa_result k1_dev_q(k1_mem *m, CUdeviceptr *d, const uint8_t *q, size_t bytes, size_t off, int K) {
    uint8_t *t = (uint8_t *)calloc(bytes + off + 1, 1);
    if (!t) return qsa__fail(QSA_ERR_OUT_OF_MEMORY, "k1 test: out of host memory");
    k1_order_q(t + off, q, bytes, K);
    qsa_result r = k1_dev(m, d, t, bytes + off);
    free(t);
    return r;
}

/* The runtime's reordering kernel (run on every packed tensor it uploads) against k1_order_q, in both
   orders (per word; the fragment order), on random bytes over a grid that loops, and on all 16 codes in
   every element position of a block. */
TEST(gpu, k1_nvfp4_order) {
    K1_NEED_GPU();
    enum { NW = 70000 }; /* whole blocks of 4 words */
    k1_mem mem = {{0}, 0, {0}, 0};
    uint8_t *q, *want, *got;
    CUdeviceptr dq;
    long long n = NW;
    K1_ALLOC(q, uint8_t, 4 * NW);
    K1_ALLOC(want, uint8_t, 4 * NW);
    K1_ALLOC(got, uint8_t, 4 * NW);
    k1_seed(77);
    for (size_t i = 0; i < 4 * (size_t)NW; i++) q[i] = (uint8_t)k1_u(0, 256);
    for (int e = 0; e < 32; e++) /* blocks 0-15: code c in element e of block c (words 4c .. 4c + 3), the rest 0 */
        for (int c = 0; c < 16; c++) {
            memset(q + 16 * (16 * e + c), 0, 16);
            q[16 * (16 * e + c) + e / 2] = (uint8_t)(c << (4 * (e & 1)));
        }
    for (int frag = 0; frag < 2; frag++) { /* rows of K = 32 * 7 (blocks) and 16 * 7 elements */
        const int K = frag ? 224 : 112;
        k1_order_q(want, q, 4 * (size_t)NW, K);
        K1_TRY(k1_dev(&mem, &dq, q, 4 * (size_t)NW));
        {
            void *args[] = {&dq, &n, &frag};
            K1_TRY(k1_launch("qsa_k_nvfp4_order", 37, 1, 128, args));
        }
        K1_TRY(k1_get(got, dq, 4 * (size_t)NW));
        CHECKF(memcmp(got, want, 4 * (size_t)NW) == 0, "frag %d: the device order differs from k1_order_q", frag);
        /* element e of a block lands where qsa_dq8 takes it: in word e / 8 (frag: word (e % 8) / 2, as
           element 2 (e / 8) + e % 2), at k1_code_bits's bits */
        int bad = -1;
        for (int e = 0; e < 32 && bad < 0; e++)
            for (int c = 0; c < 16 && bad < 0; c++) {
                const uint8_t *b = got + 16 * (16 * e + c);
                const int wi = frag ? (e % 8) / 2 : e / 8, j = frag ? 2 * (e / 8) + e % 2 : e % 8;
                for (int x = 0; x < 4; x++) {
                    uint32_t v = (uint32_t)b[4 * x] | (uint32_t)b[4 * x + 1] << 8 | (uint32_t)b[4 * x + 2] << 16 |
                                 (uint32_t)b[4 * x + 3] << 24;
                    uint32_t w = x == wi ? k1_code_bits(j, (unsigned)c) : 0u;
                    if (v != w) bad = 16 * e + c;
                }
            }
        CHECKF(bad < 0, "frag %d: element %d code %d lands elsewhere", frag, bad / 16, bad % 16);
    }
done:
    k1_free(&mem);
}

/* Random NVFP4 weights [N][K]: q, s, and their dequantised values wf with global scale s2. */
static void k1_rand_nvfp4(uint8_t *q, uint8_t *s, float s2, float *wf, int N, int K) {
    for (size_t i = 0; i < (size_t)N * K / 2; i++) q[i] = (uint8_t)k1_u(0, 256);
    for (size_t i = 0; i < (size_t)N * K / 16; i++) {
        unsigned e = 1 + (unsigned)k1_u(0, 14), m = (unsigned)k1_u(0, 8); /* normal, never NaN */
        s[i] = (uint8_t)((e << 3) | m | (k1_u(0, 1) < 0.1 ? 0x80 : 0));
    }
    s[0] = 0x05; /* a subnormal scale */
    k1_dequant_nvfp4(q, s, s2, wf, N, K);
}

/* want = A W^T (+ bias) in double; atol = the accumulation bound times sum |a w|.
 * Tolerance: the fp16 products are exact; the tensor cores accumulate in fp32 and may truncate
 * rather than round (Volta), so the error can grow like K * 2^-23 * sum|a w| without cancelling;
 * we allow max(1e-5, K * 2^-23) * sum|a w|.  A wrong index or layout is off by O(sum|a w|). */
static void k1_ref_gemm(const float *a, const float *w, const float *bias, int M, int N, int K, double *want,
                        double *atol) {
    double c = (double)K * ldexp(1.0, -23);
    if (c < 1e-5) c = 1e-5;
    for (int m = 0; m < M; m++)
        for (int n = 0; n < N; n++) {
            double s = 0, mag = 0;
            for (int k = 0; k < K; k++) {
                double p = (double)a[(size_t)m * K + k] * w[(size_t)n * K + k];
                s += p;
                mag += fabs(p);
            }
            want[(size_t)m * N + n] = s + (bias ? bias[n] : 0.0);
            atol[(size_t)m * N + n] = c * mag + (bias ? 1e-7 * fabs(bias[n]) : 0.0) + 1e-30;
        }
}

/* One GEMM shape, fp16 (nvfp4 = 0) or NVFP4 weights: reference, determinism, any grid,
   accumulate, misaligned operands, and (NVFP4) equality with the fp16 GEMM on the same weights. */
static void k1_gemm_case(int M, int N, int K, int nvfp4) {
    k1_mem mem = {{0}, 0, {0}, 0};
    uint16_t *a16, *w16 = NULL;
    uint8_t *q = NULL, *s = NULL;
    float *af, *wf, *bias = NULL, *Y, *Y2, *Y0;
    double *want, *atol;
    float s2 = 0.0173f;
    int acc0 = 0, acc1 = 1;
    char what[96];
    size_t ny = (size_t)M * N;
    CUdeviceptr dA, dA1, dW = 0, dq = 0, ds = 0, dq1 = 0, dB = 0, dY, dnull = 0;
    snprintf(what, sizeof what, "gemm_%s M=%d N=%d K=%d", nvfp4 ? "nvfp4" : "f16", M, N, K);
    K1_ALLOC(a16, uint16_t, (size_t)M * K + 8);
    K1_ALLOC(af, float, (size_t)M * K);
    K1_ALLOC(wf, float, (size_t)N * K);
    K1_ALLOC(Y, float, ny);
    K1_ALLOC(Y2, float, ny);
    K1_ALLOC(Y0, float, ny);
    K1_ALLOC(want, double, ny);
    K1_ALLOC(atol, double, ny);
    k1_seed(100 + (uint64_t)M * 7 + (uint64_t)N * 13 + (uint64_t)K + (uint64_t)nvfp4);
    k1_fill16(a16, af, (size_t)M * K, -1, 1);
    if (nvfp4) {
        K1_ALLOC(q, uint8_t, (size_t)N * K / 2);
        K1_ALLOC(s, uint8_t, (size_t)N * K / 16);
        k1_rand_nvfp4(q, s, s2, wf, N, K);
    } else {
        K1_ALLOC(w16, uint16_t, (size_t)N * K);
        K1_ALLOC(bias, float, N);
        k1_fill16(w16, wf, (size_t)N * K, -1, 1);
        k1_fill(bias, N, -2, 2);
    }
    k1_ref_gemm(af, wf, bias, M, N, K, want, atol);
    K1_TRY(k1_dev(&mem, &dA, a16, sizeof(uint16_t) * M * K));
    K1_TRY(k1_dev(&mem, &dY, NULL, sizeof(float) * ny));
    if (nvfp4) {
        K1_TRY(k1_dev_q(&mem, &dq, q, (size_t)N * K / 2, 0, K));
        K1_TRY(k1_dev(&mem, &ds, s, (size_t)N * K / 16));
    } else {
        K1_TRY(k1_dev(&mem, &dW, w16, sizeof(uint16_t) * N * K));
        K1_TRY(k1_dev(&mem, &dB, bias, sizeof(float) * N));
    }
#define K1_GEMM(grid, dAx, dqx, accp) do { \
        if (nvfp4) { void *args_[] = {&(dAx), &(dqx), &ds, &s2, &dY, &M, &N, &K, (accp)}; \
            K1_TRY(k1_launch("qsa_k_gemm_nvfp4", (grid), 1, 256, args_)); } \
        else { void *args_[] = {&(dAx), &dW, &dB, &dY, &M, &N, &K, (accp)}; \
            K1_TRY(k1_launch("qsa_k_gemm_f16", (grid), 1, 256, args_)); } } while (0)
    K1_GEMM(k1_gemm_grid(M, N), dA, dq, &acc0);
    K1_TRY(k1_get(Y, dY, sizeof(float) * ny));
    CHECK(k1_cmp(what, Y, want, ny, atol, 0, 0) == 0);
    /* run to run: bitwise identical */
    K1_TRY(k1_poison(dY, sizeof(float) * ny));
    K1_GEMM(k1_gemm_grid(M, N), dA, dq, &acc0);
    K1_TRY(k1_get(Y2, dY, sizeof(float) * ny));
    CHECK(!k1_same("gemm: second run", Y, Y2, ny, 4));
    /* any grid: 3 blocks looping over all tiles give the same bits */
    K1_TRY(k1_poison(dY, sizeof(float) * ny));
    K1_GEMM(3, dA, dq, &acc0);
    K1_TRY(k1_get(Y2, dY, sizeof(float) * ny));
    CHECK(!k1_same("gemm: grid of 3 blocks", Y, Y2, ny, 4));
    /* accumulate: Y = Y0 + (the same result), one fp32 add */
    k1_fill(Y0, ny, -5, 5);
    K1_TRY(k1_put(dY, Y0, sizeof(float) * ny));
    K1_GEMM(k1_gemm_grid(M, N), dA, dq, &acc1);
    K1_TRY(k1_get(Y2, dY, sizeof(float) * ny));
    for (size_t i = 0; i < ny; i++) Y0[i] = Y0[i] + Y[i];
    CHECK(!k1_same("gemm: accumulate", Y0, Y2, ny, 4));
    /* A one element off 16-byte alignment: scalar loads, same values, same bits */
    memmove(a16 + 1, a16, sizeof(uint16_t) * M * K);
    K1_TRY(k1_dev(&mem, &dA1, a16, sizeof(uint16_t) * ((size_t)M * K + 1)));
    dA1 += 2;
    K1_TRY(k1_poison(dY, sizeof(float) * ny));
    K1_GEMM(k1_gemm_grid(M, N), dA1, dq, &acc0);
    K1_TRY(k1_get(Y2, dY, sizeof(float) * ny));
    CHECK(!k1_same("gemm: misaligned A", Y, Y2, ny, 4));
    if (nvfp4) {
        /* packed weights one byte off 4-byte alignment: byte loads, same bits */
        K1_TRY(k1_dev_q(&mem, &dq1, q, (size_t)N * K / 2, 1, K));
        dq1 += 1;
        K1_TRY(k1_poison(dY, sizeof(float) * ny));
        K1_GEMM(k1_gemm_grid(M, N), dA, dq1, &acc0);
        K1_TRY(k1_get(Y2, dY, sizeof(float) * ny));
        CHECK(!k1_same("gemm_nvfp4: misaligned weights", Y, Y2, ny, 4));
        /* with s2 = 2^-14 the segments' factor s2 * 2^14 is 1: the NVFP4 GEMM is then the fp16 GEMM on the
           weights e2m1 * e4m3 * 2^-14 (exact in fp32 and in fp16), bit for bit */
        float s2u = ldexpf(1.0f, -14);
        K1_ALLOC(w16, uint16_t, (size_t)N * K);
        k1_dequant_nvfp4(q, s, s2u, wf, N, K);
        for (size_t i = 0; i < (size_t)N * K; i++) {
            w16[i] = qsa__f32_to_f16(wf[i]);
            if (qsa__f16_to_f32(w16[i]) != wf[i]) {
                CHECKF(0, "gemm_nvfp4: weight %zu (%g) is not an fp16", i, (double)wf[i]);
                break;
            }
        }
        K1_TRY(k1_dev(&mem, &dW, w16, sizeof(uint16_t) * N * K));
        K1_TRY(k1_poison(dY, sizeof(float) * ny));
        {
            void *args[] = {&dA, &dq, &ds, &s2u, &dY, &M, &N, &K, &acc0};
            K1_TRY(k1_launch("qsa_k_gemm_nvfp4", k1_gemm_grid(M, N), 1, 256, args));
        }
        K1_TRY(k1_get(Y, dY, sizeof(float) * ny));
        K1_TRY(k1_poison(dY, sizeof(float) * ny));
        {
            void *args[] = {&dA, &dW, &dnull, &dY, &M, &N, &K, &acc0};
            K1_TRY(k1_launch("qsa_k_gemm_f16", k1_gemm_grid(M, N), 1, 256, args));
        }
        K1_TRY(k1_get(Y2, dY, sizeof(float) * ny));
        CHECK(!k1_same("gemm_nvfp4 (s2 = 2^-14) vs gemm_f16 on e2m1 * e4m3 * 2^-14", Y, Y2, ny, 4));
    }
#undef K1_GEMM
done:
    k1_free(&mem);
}

TEST(gpu, k1_gemm_f16) {
    K1_NEED_GPU();
    k1_gemm_case(1, 300, 1024, 0);  /* decode: split-K, 4 segments, one round */
    k1_gemm_case(5, 17, 48, 0);     /* N and M edges, K below one segment */
    k1_gemm_case(37, 100, 2320, 0); /* 9 full segments + 16: two rounds, a one-chunk segment */
    k1_gemm_case(64, 33, 272, 0);   /* the largest split-K M */
    k1_gemm_case(100, 70, 528, 0);  /* tiled: partial 64x64 tiles, 3 segments */
    k1_gemm_case(130, 129, 80, 0);  /* tiled: three M tiles, N edge, K % 32 == 16 */
}

TEST(gpu, k1_gemm_nvfp4) {
    K1_NEED_GPU();
    k1_gemm_case(1, 40, 512, 1);
    k1_gemm_case(37, 33, 1040, 1);
    k1_gemm_case(100, 70, 272, 1);
}

/* Batch invariance: one row of A computed with M = 1, 37, 64 (split-K), 65 and 100 (tiled), at
   different positions inside its tile, gives the same bits. */
static void k1_gemm_batch(int nvfp4, int K) { /* K 784: 4 segments, 256, 256, 256, 16 */
    enum { N = 72 };
    static const int Ms[] = {1, 37, 64, 65, 100};
    static const int pos[] = {0, 21, 63, 64, 70};
    k1_mem mem = {{0}, 0, {0}, 0};
    uint16_t *a16, *w16 = NULL, *row;
    uint8_t *q = NULL, *s = NULL;
    float *af, *wf, *Y, *first;
    float s2 = 0.031f;
    int acc0 = 0, n = N, k = K;
    CUdeviceptr dA, dW = 0, dq = 0, ds = 0, dY, dB = 0;
    K1_ALLOC(a16, uint16_t, 100 * K);
    K1_ALLOC(af, float, 100 * K);
    K1_ALLOC(row, uint16_t, K);
    K1_ALLOC(wf, float, N * K);
    K1_ALLOC(Y, float, 100 * N);
    K1_ALLOC(first, float, N);
    k1_seed(7 + (uint64_t)nvfp4);
    k1_fill16(row, wf, K, -1, 1); /* wf as scratch for the row's values */
    if (nvfp4) {
        K1_ALLOC(q, uint8_t, N * K / 2);
        K1_ALLOC(s, uint8_t, N * K / 16);
        k1_rand_nvfp4(q, s, s2, wf, N, K);
        K1_TRY(k1_dev_q(&mem, &dq, q, (size_t)N * K / 2, 0, K));
        K1_TRY(k1_dev(&mem, &ds, s, N * K / 16));
    } else {
        K1_ALLOC(w16, uint16_t, N * K);
        k1_fill16(w16, wf, N * K, -1, 1);
        K1_TRY(k1_dev(&mem, &dW, w16, sizeof(uint16_t) * N * K));
    }
    K1_TRY(k1_dev(&mem, &dA, NULL, sizeof(uint16_t) * 100 * K));
    K1_TRY(k1_dev(&mem, &dY, NULL, sizeof(float) * 100 * N));
    for (int c = 0; c < 5; c++) {
        int M = Ms[c];
        k1_fill16(a16, af, (size_t)M * K, -1, 1);
        memcpy(a16 + (size_t)pos[c] * K, row, sizeof(uint16_t) * K);
        K1_TRY(k1_put(dA, a16, sizeof(uint16_t) * M * K));
        K1_TRY(k1_poison(dY, sizeof(float) * 100 * N));
        if (nvfp4) {
            void *args[] = {&dA, &dq, &ds, &s2, &dY, &M, &n, &k, &acc0};
            K1_TRY(k1_launch("qsa_k_gemm_nvfp4", k1_gemm_grid(M, N), 1, 256, args));
        } else {
            void *args[] = {&dA, &dW, &dB, &dY, &M, &n, &k, &acc0};
            K1_TRY(k1_launch("qsa_k_gemm_f16", k1_gemm_grid(M, N), 1, 256, args));
        }
        K1_TRY(k1_get(Y, dY, sizeof(float) * M * N));
        if (c == 0) memcpy(first, Y, sizeof(float) * N);
        else {
            char what[96];
            snprintf(what, sizeof what, "gemm_%s batch invariance: row %d of M=%d vs M=1", nvfp4 ? "nvfp4" : "f16",
                     pos[c], M);
            CHECK(!k1_same(what, first, Y + (size_t)pos[c] * N, N, 4));
        }
    }
done:
    k1_free(&mem);
}

TEST(gpu, k1_gemm_batch_invariance) {
    K1_NEED_GPU();
    k1_gemm_batch(0, 784);
    k1_gemm_batch(1, 784);
    k1_gemm_batch(0, 787); /* FP16 rows not 16-byte aligned, a ragged last sub-step */
}

/* The cross-warp GEMV (qsa_k_gemv_*: (tile, segment) tasks spread over warps, partial tiles summed
   by the warp that completes a tile) against the one-block split-K GEMM: bitwise equal for every
   M <= 64, with bias and accumulation, and again on a second launch (the tickets must have been
   reset to zero by the first). */
/* The block form of the dense GEMVs (qsa_k_gemv_blk) applies: an sm_80+ module, K % 8 == 0 (the
   tests' buffers are 16-byte aligned), any M (the host takes it from QSA__GEMV_BLK_MIN_M rows). */
static int k1_arch_num(void) {
    const char *a = K1_.arch;
    while (*a && (*a < '0' || *a > '9')) a++;
    return atoi(a);
}
#define K1_BLOCK_FORM(K) (k1_arch_num() >= 80 && (K) % 8 == 0)
#define K1_GEMV_LOOP_GRID 3 /* a grid smaller than the work: every block of qsa_k_gemv_blk loops */
/* The block form's row tiles per split group for M rows: 2 (qsa_k_gemv_blk32) from 17 rows on, as the
   host (qsa__gemv_rp), else 1; with k1_blk_other set the other kernel (either gives every M the same
   bits).  Whole-K groups are of 16 rows (qsa_k_gemv_blk_whole) either way. */
static int k1_blk_other;
static int k1_blk_rp(int M) { return (M > 16) != (k1_blk_other != 0) ? 2 : 1; }
static int k1_blk_rp_of(int whole, int M) { return whole ? 1 : k1_blk_rp(M); }
static unsigned k1_gemv_groups(int whole, int M, int N, int K) { /* (the host's qsa__gemv_groups) */
    int rows = 16 * k1_blk_rp_of(whole, M);
    return (unsigned)(((M + rows - 1) / rows) * (((N + 15) / 16 + 3) / 4) * ((K + 255) / 256));
}
/* a launch of the block form over M rows, split (whole 0) or whole-K groups: the kernel of
   k1_blk_rp_of(whole, M) row tiles with its dynamic shared memory */
static qsa_result k1_launch_blk(int whole, unsigned gx, int M, void **args) {
    int rp = k1_blk_rp_of(whole, M);
    const char *name = whole ? "qsa_k_gemv_blk_whole" : rp == 2 ? "qsa_k_gemv_blk32" : "qsa_k_gemv_blk";
    return k1_launch_sh(name, gx, 128, QSA__GB_SMEM(rp), args);
}
/* qsa_k_gemv_blk's parameter for one member */
static qsa__gemv_group k1_gemv_one(CUdeviceptr W, CUdeviceptr bias, CUdeviceptr Y, CUdeviceptr Y16, int N) {
    qsa__gemv_group grp;
    memset(&grp, 0, sizeof grp);
    grp.n = 1;
    grp.m[0].W = W;
    grp.m[0].bias = bias;
    grp.m[0].Y = Y;
    grp.m[0].Y16 = Y16;
    grp.m[0].N = N;
    return grp;
}
/* qsa_k_gemv_blk without tickets (count NULL) on `grid` blocks, then qsa_k_gemv_fold over its partial
   tiles (the host's qsa__gemv_blk from QSA__GEMV_FOLD_MIN_M rows) */
static qsa_result k1_blk_fold(CUdeviceptr A, qsa__gemv_group *grp, int M, int K, int acc, CUdeviceptr part,
                              CUdeviceptr xn, int hc, unsigned grid) {
    CUdeviceptr none = 0;
    long long items = qsa__gemv_fold_items(grp, M, xn, hc);
    void *a1[] = {&A, grp, &M, &K, &acc, &part, &none, &xn, &hc};
    QSA__TRY(k1_launch_blk(0, grid, M, a1));
    void *a2[] = {grp, &M, &K, &acc, &part, &xn, &hc};
    return k1_launch("qsa_k_gemv_fold", (unsigned)((items + 255) / 256), 1, 256, a2);
}

static void k1_gemv_case(int M, int N, int K, int nvfp4) {
    k1_mem mem = {{0}, 0, {0}, 0};
    uint16_t *a16, *w16 = NULL;
    uint8_t *q = NULL, *s = NULL;
    float *af, *wf, *bias, *Y0, *Y1, *Yacc;
    float s2 = 0.017f, noact = 0.0f, act = 0.25f;
    int acc0 = 0, acc1 = 1, nseg = (K + 255) / 256, prow = M < 16 ? M : 16, MN = M * N;
    int tiles = ((M + 15) / 16) * ((N + 15) / 16);
    unsigned gx = (unsigned)((tiles * nseg + 3) / 4), bx = 32 * 4; /* QSA_GEMV_WARPS = 4 */
    CUdeviceptr dA, dW = 0, dq = 0, ds = 0, dB = 0, dnull = 0, dY, dY16, dZ16, dpart, dcnt;
    uint16_t *Y16, *Z16;
    K1_ALLOC(a16, uint16_t, M * K);
    K1_ALLOC(af, float, M * K);
    K1_ALLOC(wf, float, N * K);
    K1_ALLOC(bias, float, N);
    K1_ALLOC(Y0, float, M * N);
    K1_ALLOC(Y1, float, M * N);
    K1_ALLOC(Yacc, float, M * N);
    K1_ALLOC(Y16, uint16_t, M * N);
    K1_ALLOC(Z16, uint16_t, M * N);
    k1_seed(1000 + (uint64_t)(M * 7 + N * 13 + K + nvfp4));
    k1_fill16(a16, af, (size_t)M * K, -1, 1);
    for (int n = 0; n < N; n++) bias[n] = (float)(n % 7) * 0.25f - 0.75f;
    if (nvfp4) {
        K1_ALLOC(q, uint8_t, N * K / 2);
        K1_ALLOC(s, uint8_t, N * K / 16);
        k1_rand_nvfp4(q, s, s2, wf, N, K);
        K1_TRY(k1_dev_q(&mem, &dq, q, (size_t)N * K / 2, 0, K));
        K1_TRY(k1_dev(&mem, &ds, s, (size_t)N * K / 16));
    } else {
        K1_ALLOC(w16, uint16_t, N * K);
        k1_fill16(w16, wf, (size_t)N * K, -1, 1);
        K1_TRY(k1_dev(&mem, &dW, w16, sizeof(uint16_t) * N * K));
        K1_TRY(k1_dev(&mem, &dB, bias, sizeof(float) * N));
    }
    K1_TRY(k1_dev(&mem, &dA, a16, sizeof(uint16_t) * M * K));
    K1_TRY(k1_dev(&mem, &dY, NULL, sizeof(float) * M * N));
    K1_TRY(k1_dev(&mem, &dY16, NULL, sizeof(uint16_t) * M * N));
    K1_TRY(k1_dev(&mem, &dZ16, NULL, sizeof(uint16_t) * M * N));
    K1_TRY(k1_dev(&mem, &dpart, NULL, sizeof(float) * (size_t)tiles * nseg * prow * 16));
    K1_TRY(k1_dev(&mem, &dcnt, NULL, sizeof(unsigned) * (size_t)tiles));
    K1_TRY(QSA__CU_R(qsa__cu.cuMemsetD8_v2(dcnt, 0, sizeof(unsigned) * (size_t)tiles)));
    /* reference: the one-block GEMM, then the same accumulating into its own output */
    K1_TRY(k1_poison(dY, sizeof(float) * M * N));
    if (nvfp4) {
        void *args[] = {&dA, &dq, &ds, &s2, &dY, &M, &N, &K, &acc0};
        K1_TRY(k1_launch("qsa_k_gemm_nvfp4", k1_gemm_grid(M, N), 1, 256, args));
        K1_TRY(k1_get(Y0, dY, sizeof(float) * M * N));
        void *args2[] = {&dA, &dq, &ds, &s2, &dY, &M, &N, &K, &acc1};
        K1_TRY(k1_launch("qsa_k_gemm_nvfp4", k1_gemm_grid(M, N), 1, 256, args2));
    } else {
        void *args[] = {&dA, &dW, &dB, &dY, &M, &N, &K, &acc0};
        K1_TRY(k1_launch("qsa_k_gemm_f16", k1_gemm_grid(M, N), 1, 256, args));
        K1_TRY(k1_get(Y0, dY, sizeof(float) * M * N));
        void *args2[] = {&dA, &dW, &dB, &dY, &M, &N, &K, &acc1};
        K1_TRY(k1_launch("qsa_k_gemm_f16", k1_gemm_grid(M, N), 1, 256, args2));
    }
    K1_TRY(k1_get(Yacc, dY, sizeof(float) * M * N));
    /* one cross-warp launch: accumulate flag, silu store (Y16 or dnull) and its scale */
#define K1_GEMV(accp, y16p, actp)                                                                       \
    do {                                                                                                \
        gx = form == 1 || form == 5 ? k1_gemv_groups(0, M, N, K) : form == 3 ? k1_gemv_groups(1, M, N, K) / nseg \
             : form == 2 || form == 4 || form == 6 ? K1_GEMV_LOOP_GRID : (unsigned)((tiles * nseg + 3) / 4); \
        if (form) {                                                                                     \
            CUdeviceptr xn0 = 0;                                                                        \
            int hc0 = 0;                                                                                \
            grp.m[0].Y16 = *(CUdeviceptr *)(y16p);                                                      \
            grp.m[0].act_scale = *(float *)(actp);                                                      \
            void *a_[] = {&dA, &grp, &M, &K, (accp), &dpart, &dcnt, &xn0, &hc0};                        \
            if (form >= 5)                                                                              \
                K1_TRY(k1_blk_fold(dA, &grp, M, K, *(int *)(accp), dpart, xn0, hc0, gx));               \
            else                                                                                        \
                K1_TRY(k1_launch_blk(form >= 3, gx, M, a_));                                              \
        } else if (nvfp4) {                                                                             \
            void *a_[] = {&dA, &dq, &ds, &s2, &dY, &M, &N, &K, (accp), &dpart, &dcnt, (y16p), (actp)};  \
            K1_TRY(k1_launch("qsa_k_gemv_nvfp4", gx, 1, bx, a_));                                      \
        } else {                                                                                        \
            void *a_[] = {&dA, &dW, &dB, &dY, &M, &N, &K, (accp), &dpart, &dcnt, (y16p), (actp)};       \
            K1_TRY(k1_launch("qsa_k_gemv_f16", gx, 1, bx, a_));                                        \
        }                                                                                               \
    } while (0)
    /* form 0: the per-warp kernel, twice (the tickets must be back at zero); where the block form
       applies (qsa_k_gemv_blk) forms 1 and 2: it on its full grid and on K1_GEMV_LOOP_GRID blocks,
       3 and 4: the same with whole-K groups (no tickets), 5 and 6: as 1 and 2 without tickets, folded by
       qsa_k_gemv_fold */
    int forms = !nvfp4 && K1_BLOCK_FORM(K) ? 7 : 1;
    qsa__gemv_group grp = k1_gemv_one(dW, dB, dY, 0, N);
    for (int form = 0; form < forms; form++)
        for (int rep = 0; rep < (form ? 1 : 2); rep++) {
            char what[160];
            const char *kn = form >= 5 ? "blk + fold" : form >= 3 ? "blk whole" : form ? "blk" : nvfp4 ? "nvfp4" : "f16";
            K1_TRY(k1_poison(dY, sizeof(float) * M * N));
            K1_GEMV(&acc0, &dnull, &noact);
            K1_TRY(k1_get(Y1, dY, sizeof(float) * M * N));
            snprintf(what, sizeof what, "gemv_%s M=%d N=%d K=%d launch %d grid %u rp %d vs gemm", kn, M, N, K, rep + 1, gx,
                     k1_blk_rp_of(form == 3 || form == 4, M));
            CHECK(!k1_same(what, Y0, Y1, (size_t)M * N, 4));
            K1_GEMV(&acc1, &dnull, &noact);
            K1_TRY(k1_get(Y1, dY, sizeof(float) * M * N));
            snprintf(what, sizeof what, "gemv_%s M=%d N=%d K=%d grid %u rp %d accumulate vs gemm", kn, M, N, K, gx,
                     k1_blk_rp_of(form == 3 || form == 4, M));
            CHECK(!k1_same(what, Yacc, Y1, (size_t)M * N, 4));
        }
    /* the fused silu epilogue (HC down projection): the bits of the GEMM then qsa_k_silu_scale */
    for (int form = 0; form < forms; form++) {
        char what[160];
        K1_TRY(k1_put(dY, Y0, sizeof(float) * M * N));
        void *sargs[] = {&dY, &dZ16, &MN, &act};
        K1_TRY(k1_launch("qsa_k_silu_scale", (MN + 255) / 256, 1, 256, sargs));
        K1_TRY(k1_get(Yacc, dY, sizeof(float) * M * N));
        K1_TRY(k1_get(Z16, dZ16, sizeof(uint16_t) * M * N));
        K1_TRY(k1_poison(dY, sizeof(float) * M * N));
        K1_TRY(k1_poison(dY16, sizeof(uint16_t) * M * N));
        K1_GEMV(&acc0, &dY16, &act);
        K1_TRY(k1_get(Y1, dY, sizeof(float) * M * N));
        K1_TRY(k1_get(Y16, dY16, sizeof(uint16_t) * M * N));
        snprintf(what, sizeof what, "gemv_%s M=%d N=%d K=%d grid %u rp %d silu epilogue vs gemm + silu_scale",
                 form >= 5 ? "blk + fold" : form >= 3 ? "blk whole" : form ? "blk" : nvfp4 ? "nvfp4" : "f16", M, N, K, gx,
                 k1_blk_rp_of(form == 3 || form == 4, M));
        CHECK(!k1_same(what, Yacc, Y1, (size_t)M * N, 4));
        CHECK(!k1_same(what, Z16, Y16, (size_t)M * N, 2));
    }
#undef K1_GEMV
done:
    k1_free(&mem);
}

/* qsa_k_gemv_f16_group: members of different N (bias on two, the silu store on one) over one
   input give each the bits of its own qsa_k_gemv_f16 launch, twice in a row (the tickets of every
   member's region back at zero). */
static void k1_gemv_group_case(int M, int K, int n) {
    k1_mem mem = {{0}, 0, {0}, 0};
    static const int Ns[QSA__GEMV_GROUP] = {300, 17, 1000, 1};
    uint16_t *a16, *w16[QSA__GEMV_GROUP], *r16, *g16;
    float *af, *wf, *bias, *ref, *got, act = 0.25f, noact = 0.0f;
    int acc0 = 0, nseg = (K + 255) / 256, prow = M < 16 ? M : 16, tiles = 0;
    CUdeviceptr dA, dW[QSA__GEMV_GROUP], dB, dY[QSA__GEMV_GROUP], dY16[QSA__GEMV_GROUP], dpart, dcnt, dnull = 0;
    K1_ALLOC(a16, uint16_t, M * K);
    K1_ALLOC(af, float, M * K);
    K1_ALLOC(wf, float, 1000 * K);
    K1_ALLOC(bias, float, 1000);
    K1_ALLOC(ref, float, M * 1000);
    K1_ALLOC(got, float, M * 1000);
    K1_ALLOC(r16, uint16_t, M * 1000);
    K1_ALLOC(g16, uint16_t, M * 1000);
    k1_seed(2000 + (uint64_t)(M * 7 + K + n));
    k1_fill16(a16, af, (size_t)M * K, -1, 1);
    for (int j = 0; j < 1000; j++) bias[j] = (float)(j % 5) * 0.25f - 0.5f;
    K1_TRY(k1_dev(&mem, &dA, a16, sizeof(uint16_t) * M * K));
    K1_TRY(k1_dev(&mem, &dB, bias, sizeof(float) * 1000));
    for (int b = 0; b < n; b++) {
        K1_ALLOC(w16[b], uint16_t, Ns[b] * K);
        k1_fill16(w16[b], wf, (size_t)Ns[b] * K, -1, 1);
        K1_TRY(k1_dev(&mem, &dW[b], w16[b], sizeof(uint16_t) * Ns[b] * K));
        K1_TRY(k1_dev(&mem, &dY[b], NULL, sizeof(float) * M * Ns[b]));
        K1_TRY(k1_dev(&mem, &dY16[b], NULL, sizeof(uint16_t) * M * Ns[b]));
        tiles += ((M + 15) / 16) * ((Ns[b] + 15) / 16);
    }
    K1_TRY(k1_dev(&mem, &dpart, NULL, sizeof(float) * (size_t)tiles * nseg * prow * 16));
    K1_TRY(k1_dev(&mem, &dcnt, NULL, sizeof(unsigned) * (size_t)tiles));
    K1_TRY(QSA__CU_R(qsa__cu.cuMemsetD8_v2(dcnt, 0, sizeof(unsigned) * (size_t)tiles)));
    qsa__gemv_group grp;
    memset(&grp, 0, sizeof grp);
    grp.n = n;
    for (int b = 0; b < n; b++) {
        grp.m[b].W = dW[b];
        grp.m[b].bias = b == 0 || b == 2 ? dB : 0;
        grp.m[b].Y = dY[b];
        grp.m[b].Y16 = b == 1 ? dY16[b] : 0;
        grp.m[b].N = Ns[b];
        grp.m[b].act_scale = b == 1 ? act : 0.0f;
    }
    /* reps 0 and 1: the per-warp kernel (the tickets must be back at zero); where the block form
       applies, 2 and 3: qsa_k_gemv_blk on its full grid and on K1_GEMV_LOOP_GRID blocks, 4 and 5:
       the same with whole-K groups, 6 and 7: as 2 and 3 without tickets, folded by qsa_k_gemv_fold */
    for (int rep = 0; rep < (K1_BLOCK_FORM(K) ? 8 : 2); rep++) {
        for (int b = 0; b < n; b++) {
            K1_TRY(k1_poison(dY[b], sizeof(float) * M * Ns[b]));
            K1_TRY(k1_poison(dY16[b], sizeof(uint16_t) * M * Ns[b]));
        }
        unsigned gx = (unsigned)((tiles * nseg + 3) / 4);
        if (rep < 2) {
            void *args[] = {&dA, &grp, &M, &K, &dpart, &dcnt};
            K1_TRY(k1_launch("qsa_k_gemv_f16_group", gx, 1, 128, args));
        } else {
            CUdeviceptr xn0 = 0;
            int hc0 = 0, whole = rep == 4 || rep == 5;
            gx = K1_GEMV_LOOP_GRID;
            if (rep == 2 || rep == 4 || rep == 6)
                for (int b = gx = 0; b < n; b++) gx += k1_gemv_groups(whole, M, Ns[b], K) / (whole ? nseg : 1);
            void *args[] = {&dA, &grp, &M, &K, &acc0, &dpart, &dcnt, &xn0, &hc0};
            if (rep >= 6) K1_TRY(k1_blk_fold(dA, &grp, M, K, acc0, dpart, xn0, hc0, gx));
            else K1_TRY(k1_launch_blk(whole, gx, M, args));
        }
        for (int b = 0; b < n; b++) {
            char what[128];
            int N = Ns[b], t1 = ((M + 15) / 16) * ((N + 15) / 16);
            CUdeviceptr bb = grp.m[b].bias, y16 = grp.m[b].Y16;
            float sc = b == 1 ? act : noact;
            K1_TRY(k1_get(got, dY[b], sizeof(float) * M * N));
            if (y16) K1_TRY(k1_get(g16, y16, sizeof(uint16_t) * M * N));
            K1_TRY(k1_poison(dY[b], sizeof(float) * M * N));
            unsigned gx1 = (unsigned)((t1 * nseg + 3) / 4);
            void *a1[] = {&dA, &dW[b], &bb, &dY[b], &M, &N, &K, &acc0, &dpart, &dcnt, y16 ? &y16 : &dnull, &sc};
            K1_TRY(k1_launch("qsa_k_gemv_f16", gx1, 1, 128, a1));
            K1_TRY(k1_get(ref, dY[b], sizeof(float) * M * N));
            if (y16) K1_TRY(k1_get(r16, y16, sizeof(uint16_t) * M * N));
            snprintf(what, sizeof what, "gemv_%s M=%d K=%d member %d of %d (N=%d) launch %d grid %u rp %d",
                     rep < 2 ? "f16_group" : rep < 4 ? "blk" : rep < 6 ? "blk whole" : "blk + fold", M, K, b, n, N, rep + 1,
                     gx, k1_blk_rp_of(rep == 4 || rep == 5, M));
            CHECK(!k1_same(what, ref, got, (size_t)M * N, 4));
            if (y16) CHECK(!k1_same(what, r16, g16, (size_t)M * N, 2));
        }
    }
done:
    k1_free(&mem);
}

TEST(gpu, k1_gemv_group_equals_single) {
    K1_NEED_GPU();
    static const int cases[][3] = {{1, 2560, 4},  {1, 300, 2},  {5, 48, 3},   {16, 2560, 4},
                                   {32, 2560, 4}, {25, 640, 3}, {37, 640, 4}, {64, 272, 4}, {4, 640, 3}};
    for (k1_blk_other = 0; k1_blk_other < 2; k1_blk_other++) /* (the block form: either kernel) */
        for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) k1_gemv_group_case(cases[i][0], cases[i][1], cases[i][2]);
    k1_blk_other = 0;
}

/* qsa_k_gemm_f16_group (the tiled group): each member (different N, bias on two) gets the bits of
   its own qsa_k_gemm_f16 launch — tiled too for M > 64, the split-K tiles for M <= 64 (decode batches'
   wide projections) — with a full grid and with fewer blocks than tiles; and so does qsa_k_gemv_deep
   (M <= 32, sm_80+, K % 8 == 0) with rings of 2, 3 and 8 stages — blocks of 4, 8 and 4 warps, the last
   on a looping grid — and in two K halves (odd and even segment counts, partial last segments) with
   rings of 3, 2 and 5 stages — blocks of 8, 4 (looping grid) and 8 warps. */
static void k1_gemm_group_case(int M, int K, int n) {
    k1_mem mem = {{0}, 0, {0}, 0};
    static const int Ns[QSA__GEMV_GROUP] = {300, 4, 130, 1};
    uint16_t *a16, *w16;
    float *af, *wf, *bias, *ref, *got;
    int acc0 = 0, t64 = 0;
    CUdeviceptr dA, dW[QSA__GEMV_GROUP], dB, dY[QSA__GEMV_GROUP];
    K1_ALLOC(a16, uint16_t, M * K);
    K1_ALLOC(af, float, M * K);
    K1_ALLOC(w16, uint16_t, 300 * K);
    K1_ALLOC(wf, float, 300 * K);
    K1_ALLOC(bias, float, 300);
    K1_ALLOC(ref, float, M * 300);
    K1_ALLOC(got, float, M * 300);
    k1_seed(3000 + (uint64_t)(M * 7 + K + n));
    k1_fill16(a16, af, (size_t)M * K, -1, 1);
    for (int j = 0; j < 300; j++) bias[j] = (float)(j % 7) * 0.125f - 0.375f;
    K1_TRY(k1_dev(&mem, &dA, a16, sizeof(uint16_t) * M * K));
    K1_TRY(k1_dev(&mem, &dB, bias, sizeof(float) * 300));
    qsa__gemv_group grp;
    memset(&grp, 0, sizeof grp);
    grp.n = n;
    for (int b = 0; b < n; b++) {
        k1_fill16(w16, wf, (size_t)Ns[b] * K, -1, 1);
        K1_TRY(k1_dev(&mem, &dW[b], w16, sizeof(uint16_t) * Ns[b] * K));
        K1_TRY(k1_dev(&mem, &dY[b], NULL, sizeof(float) * M * Ns[b]));
        grp.m[b].W = dW[b];
        grp.m[b].bias = b == 0 || b == 2 ? dB : 0;
        grp.m[b].Y = dY[b];
        grp.m[b].N = Ns[b];
        t64 += ((M + 63) / 64) * ((Ns[b] + 63) / 64);
    }
    for (int rep = 0; rep < (M <= 32 && K1_BLOCK_FORM(K) ? 8 : 2); rep++) {
        static const int stages[6] = {2, 3, 8, 3, 2, 5};
        for (int b = 0; b < n; b++) K1_TRY(k1_poison(dY[b], sizeof(float) * M * Ns[b]));
        void *args[] = {&dA, &grp, &M, &K};
        if (rep < 2) {
            K1_TRY(k1_launch("qsa_k_gemm_f16_group", rep ? 7u : (unsigned)t64, 1, 256, args));
        } else {
            int st = stages[rep - 2], nw = rep == 3 || rep == 5 || rep == 7 ? 8 : 4, kh = rep >= 5 ? 2 : 1;
            void *dargs[] = {&dA, &grp, &M, &K, &st, &kh};
            K1_TRY(k1_launch_sh("qsa_k_gemv_deep", rep == 4 || rep == 6 ? 3u : (unsigned)t64, 32 * nw,
                                (unsigned)(st * QSA__DEEP_STAGE_BYTES(nw, kh) + (kh - 1) * QSA__DEEP_X_BYTES(nw / kh)),
                                dargs));
        }
        for (int b = 0; b < n; b++) {
            char what[128];
            int N = Ns[b];
            CUdeviceptr bb = grp.m[b].bias;
            K1_TRY(k1_get(got, dY[b], sizeof(float) * M * N));
            K1_TRY(k1_poison(dY[b], sizeof(float) * M * N));
            void *a1[] = {&dA, &dW[b], &bb, &dY[b], &M, &N, &K, &acc0};
            K1_TRY(k1_launch("qsa_k_gemm_f16", (unsigned)(((M + 63) / 64) * ((N + 63) / 64)), 1, 256, a1));
            K1_TRY(k1_get(ref, dY[b], sizeof(float) * M * N));
            snprintf(what, sizeof what, "%s M=%d K=%d member %d of %d (N=%d) launch %d", rep < 2 ? "gemm_f16_group" : "gemv_deep",
                     M, K, b, n, N, rep + 1);
            CHECK(!k1_same(what, ref, got, (size_t)M * N, 4));
        }
    }
done:
    k1_free(&mem);
}

TEST(gpu, k1_gemm_group_equals_single) {
    K1_NEED_GPU();
    static const int cases[][3] = {{65, 300, 2}, {200, 2560, 4}, {130, 48, 3}, {1, 2560, 4}, {8, 640, 3},
                                   {32, 2560, 4}, {17, 48, 2},  {64, 272, 4}, {24, 328, 3}, {31, 520, 4}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) k1_gemm_group_case(cases[i][0], cases[i][1], cases[i][2]);
}

/* qsa_k_gemv_gres: the up projection with the input mix in its epilogue gives the bits of
   qsa_k_gemv_f16 into mw followed by qsa_k_gres_mix, twice in a row (tickets back at zero). */
static void k1_gemv_gres_case(int M, int H, int hc, int K, int with_bias) {
    k1_mem mem = {{0}, 0, {0}, 0};
    int N = hc * H, acc0 = 0, tiles = ((M + 15) / 16) * ((N + 15) / 16), nseg = (K + 255) / 256, prow = M < 16 ? M : 16;
    uint16_t *a16, *w16, *r16, *g16;
    float *af, *wf, *bias, *xn, *ref, *got, noact = 0.0f;
    CUdeviceptr dA, dW, dB = 0, dxn, dmw, dinp, dinp16, dpart, dcnt, dnull = 0;
    K1_ALLOC(a16, uint16_t, M * K);
    K1_ALLOC(af, float, M * K);
    K1_ALLOC(w16, uint16_t, N * K);
    K1_ALLOC(wf, float, N * K);
    K1_ALLOC(bias, float, N);
    K1_ALLOC(xn, float, M * N);
    K1_ALLOC(ref, float, M * H);
    K1_ALLOC(got, float, M * H);
    K1_ALLOC(r16, uint16_t, M * H);
    K1_ALLOC(g16, uint16_t, M * H);
    k1_seed(4000 + (uint64_t)(M * 13 + H + hc + K));
    k1_fill16(a16, af, (size_t)M * K, -1, 1);
    k1_fill16(w16, wf, (size_t)N * K, -0.5, 0.5);
    k1_fill(bias, (size_t)N, -1, 1);
    k1_fill(xn, (size_t)M * N, -3, 3);
    K1_TRY(k1_dev(&mem, &dA, a16, sizeof(uint16_t) * M * K));
    K1_TRY(k1_dev(&mem, &dW, w16, sizeof(uint16_t) * N * K));
    if (with_bias) K1_TRY(k1_dev(&mem, &dB, bias, sizeof(float) * N));
    K1_TRY(k1_dev(&mem, &dxn, xn, sizeof(float) * M * N));
    K1_TRY(k1_dev(&mem, &dmw, NULL, sizeof(float) * M * N));
    K1_TRY(k1_dev(&mem, &dinp, NULL, sizeof(float) * M * H));
    K1_TRY(k1_dev(&mem, &dinp16, NULL, sizeof(uint16_t) * M * H));
    K1_TRY(k1_dev(&mem, &dpart, NULL, sizeof(float) * (size_t)tiles * nseg * prow * 16));
    K1_TRY(k1_dev(&mem, &dcnt, NULL, sizeof(unsigned) * (size_t)tiles));
    K1_TRY(QSA__CU_R(qsa__cu.cuMemsetD8_v2(dcnt, 0, sizeof(unsigned) * (size_t)tiles)));
    unsigned gx = (unsigned)((tiles * nseg + 3) / 4);
    { /* the reference: the GEMV into mw, then the mix */
        void *a1[] = {&dA, &dW, &dB, &dmw, &M, &N, &K, &acc0, &dpart, &dcnt, &dnull, &noact};
        K1_TRY(k1_launch("qsa_k_gemv_f16", gx, 1, 128, a1));
        void *a2[] = {&dmw, &dxn, &dinp, &dinp16, &H, &hc};
        K1_TRY(k1_launch("qsa_k_gres_mix", (unsigned)M, 1, 256, a2));
        K1_TRY(k1_get(ref, dinp, sizeof(float) * M * H));
        K1_TRY(k1_get(r16, dinp16, sizeof(uint16_t) * M * H));
    }
    /* reps 0 and 1: qsa_k_gemv_gres (the tickets must be back at zero); where the block form applies,
       2 and 3: qsa_k_gemv_blk with the mix, on its full grid and on K1_GEMV_LOOP_GRID blocks, 4 and
       5: the same with whole-K groups, 6 and 7: as 2 and 3 without tickets, folded by qsa_k_gemv_fold */
    for (int rep = 0; rep < (K1_BLOCK_FORM(K) ? 8 : 2); rep++) {
        char what[160];
        unsigned grid = gx;
        K1_TRY(k1_poison(dinp, sizeof(float) * M * H));
        K1_TRY(k1_poison(dinp16, sizeof(uint16_t) * M * H));
        if (rep < 2) {
            void *args[] = {&dA, &dW, &dB, &dxn, &dinp, &dinp16, &M, &N, &K, &hc, &dpart, &dcnt};
            K1_TRY(k1_launch("qsa_k_gemv_gres", grid, 1, 128, args));
        } else {
            qsa__gemv_group grp = k1_gemv_one(dW, dB, dinp, dinp16, N);
            int whole = rep == 4 || rep == 5;
            grid = rep == 2 || rep == 6 ? k1_gemv_groups(0, M, N, K) : rep == 4 ? k1_gemv_groups(1, M, N, K) / nseg
                                                                               : K1_GEMV_LOOP_GRID;
            void *args[] = {&dA, &grp, &M, &K, &acc0, &dpart, &dcnt, &dxn, &hc};
            if (rep >= 6) K1_TRY(k1_blk_fold(dA, &grp, M, K, acc0, dpart, dxn, hc, grid));
            else K1_TRY(k1_launch_blk(whole, grid, M, args));
        }
        K1_TRY(k1_get(got, dinp, sizeof(float) * M * H));
        K1_TRY(k1_get(g16, dinp16, sizeof(uint16_t) * M * H));
        snprintf(what, sizeof what, "gemv_%s M=%d H=%d hc=%d K=%d bias %d launch %d grid %u rp %d",
                 rep < 2 ? "gres" : rep < 4 ? "blk" : rep < 6 ? "blk whole" : "blk + fold", M,
                 H, hc, K, with_bias, rep + 1, grid, k1_blk_rp_of(rep == 4 || rep == 5, M));
        CHECK(!k1_same(what, ref, got, (size_t)M * H, 4));
        CHECK(!k1_same(what, r16, g16, (size_t)M * H, 2));
    }
done:
    k1_free(&mem);
}

TEST(gpu, k1_gemv_gres_equals_gemv_and_mix) {
    K1_NEED_GPU();
    static const int cases[][5] = {{1, 2560 / 8, 4, 320, 0}, {5, 40, 4, 320, 1}, {16, 24, 2, 100, 0}, {37, 20, 8, 48, 1},
                                   {64, 33, 1, 272, 0},      {3, 4, 16, 600, 1}, {32, 20, 4, 320, 1}, {17, 40, 8, 48, 0}};
    for (k1_blk_other = 0; k1_blk_other < 2; k1_blk_other++) /* (the block form: either kernel) */
        for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
            k1_gemv_gres_case(cases[i][0], cases[i][1], cases[i][2], cases[i][3], cases[i][4]);
    k1_blk_other = 0;
}

TEST(gpu, k1_gemv_cross_warp_equals_gemm) {
    K1_NEED_GPU();
    /* (the dense block form (sm_80+) at every M, ragged K (3000: a last segment of 184, half a chunk
       past its last whole one) and N (column groups of fewer than 4 tiles) included; K = 100 is not a
       multiple of 8: the per-warp one-tile path; up to QSA_GEMV_TR_ROWS = 4 rows the per-warp form
       is the swapped-operand one, with a ragged last segment and N) */
    static const int shapes[][3] = {{1, 300, 1024}, {1, 4, 10240}, {1, 320, 2560}, {5, 17, 48},   {37, 100, 2320},
                                    {64, 33, 272},  {16, 50, 6144}, {2, 2560, 640}, {1, 7, 100},   {9, 1000, 3000},
                                    {32, 100, 2320}, {20, 33, 272}, {24, 17, 100},  {32, 2560, 640}, {3, 50, 2320},
                                    {4, 33, 272}};
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
        for (int nv = 0; nv < 2; nv++) {
            if (nv && shapes[i][2] % 16) continue;
            k1_gemv_case(shapes[i][0], shapes[i][1], shapes[i][2], nv);
        }
    /* the block form's other kernel (groups of 32 rows up to 16 rows, of 16 from 17 on): the same bits */
    k1_blk_other = 1;
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
        if (K1_BLOCK_FORM(shapes[i][2])) k1_gemv_case(shapes[i][0], shapes[i][1], shapes[i][2], 0);
    k1_blk_other = 0;
}

/* ---------------------------------------------------------------------------------------------- */
/* MoE                                                                                             */
/* ---------------------------------------------------------------------------------------------- */

/* The CPU backend's router (qsa__moe_fwd): softmax, K repeated arg-maxes (ties: lower id),
   optional renormalisation; then sorted by ascending id.  gap: p_K - p_{K+1} relative to p_K. */
static void k1_ref_router(const float *logits, int E, int K, int norm, int *ids, float *w, double *gap) {
    float *p = (float *)malloc(sizeof(float) * (size_t)E);
    int top[64];
    float topw[64];
    float mx = -INFINITY, sum = 0.0f;
    for (int e = 0; e < E; e++) mx = logits[e] > mx ? logits[e] : mx;
    for (int e = 0; e < E; e++) { p[e] = expf(logits[e] - mx); sum += p[e]; }
    for (int e = 0; e < E; e++) p[e] /= sum;
    for (int k = 0; k <= K && k < E; k++) {
        int best = -1;
        for (int e = 0; e < E; e++) {
            int used = 0;
            for (int j = 0; j < k; j++) used |= top[j] == e;
            if (!used && (best < 0 || p[e] > p[best])) best = e;
        }
        top[k] = best;
        topw[k] = p[best];
    }
    *gap = K < E ? (topw[K - 1] - topw[K]) / topw[K - 1] : 1.0;
    if (norm) {
        float s = 0.0f;
        for (int k = 0; k < K; k++) s += topw[k];
        for (int k = 0; k < K; k++) topw[k] /= s;
    }
    for (int i = 0; i < K; i++) { /* sort by id */
        int b = i;
        for (int j = i + 1; j < K; j++) if (top[j] < top[b]) b = j;
        int ti = top[i]; top[i] = top[b]; top[b] = ti;
        float tw = topw[i]; topw[i] = topw[b]; topw[b] = tw;
        ids[i] = top[i];
        w[i] = topw[i];
    }
    free(p);
}

static qsa_result k1_run_router(const float *logits, int M, int E, int K, int norm, int *ids, float *w) {
    k1_mem mem = {{0}, 0, {0}, 0};
    CUdeviceptr dl, di, dw;
    qsa_result r = k1_dev(&mem, &dl, logits, sizeof(float) * (size_t)M * E);
    if (r == QSA_OK) r = k1_dev(&mem, &di, NULL, sizeof(int) * (size_t)M * K);
    if (r == QSA_OK) r = k1_dev(&mem, &dw, NULL, sizeof(float) * (size_t)M * K);
    if (r == QSA_OK) {
        qsa__router_extra none;
        memset(&none, 0, sizeof none);
        void *args[] = {&dl, &di, &dw, &E, &K, &norm, &none};
        r = k1_launch("qsa_k_router_topk", (unsigned)M, 1, 256, args);
    }
    if (r == QSA_OK) r = k1_get(ids, di, sizeof(int) * (size_t)M * K);
    if (r == QSA_OK) r = k1_get(w, dw, sizeof(float) * (size_t)M * K);
    k1_free(&mem);
    return r;
}

static void k1_router_case(int M, int E, int K, int norm) {
    k1_mem mem = {{0}, 0, {0}, 0};
    float *l, *w, *rw, *w1;
    int *ids, *rid, *id1;
    double *want, gap;
    const int pos = M > 21 ? 21 : M - 1;
    K1_ALLOC(l, float, M * E);
    K1_ALLOC(w, float, M * K);
    K1_ALLOC(rw, float, K);
    K1_ALLOC(w1, float, K);
    K1_ALLOC(ids, int, M * K);
    K1_ALLOC(rid, int, K);
    K1_ALLOC(id1, int, K);
    K1_ALLOC(want, double, K);
    k1_seed(11 + (uint64_t)E);
    k1_fill(l, (size_t)M * E, -4, 4);
    /* row 0: exact ties (equal logits give equal probabilities on both sides): lower ids first */
    l[5] = l[9] = l[40 % E] = 5.0f;
    l[7] = l[8] = 4.5f;
    K1_TRY(k1_run_router(l, M, E, K, norm, ids, w));
    for (int t = 0; t < M; t++) {
        char what[64];
        k1_ref_router(l + (size_t)t * E, E, K, norm, rid, rw, &gap);
        snprintf(what, sizeof what, "router E=%d K=%d norm=%d token %d", E, K, norm, t);
        int sorted = 1;
        for (int k = 1; k < K; k++) sorted &= ids[t * K + k - 1] < ids[t * K + k];
        CHECKF(sorted, "%s: ids not strictly ascending", what);
        /* the selection may only differ where the reference's K-th and (K+1)-th probabilities are
           within fp32 noise of each other (sum order, expf ulps) */
        if (gap > 1e-5 || t == 0) {
            CHECKF(!memcmp(ids + t * K, rid, sizeof(int) * K), "%s: selected experts differ (gap %.3g)", what, gap);
            for (int k = 0; k < K; k++) want[k] = rw[k];
            /* the softmax sum is a block tree instead of a sequential sum: each side is within
               (E-1) * 2^-24 of the exact sum, so rtol 2 E 2^-24 + 1e-6 (expf ulps, the division) */
            CHECK(k1_cmp(what, w + t * K, want, K, NULL, 0, 2.0 * E * ldexp(1.0, -24) + 1e-6) == 0);
        }
    }
    CHECKF(ids[0] == 5 || ids[1] == 5, "row 0 must select expert 5");
    /* batch invariance: row pos alone */
    K1_TRY(k1_run_router(l + (size_t)pos * E, 1, E, K, norm, id1, w1));
    CHECK(!k1_same("router batch invariance (ids)", id1, ids + pos * K, K, 4));
    CHECK(!k1_same("router batch invariance (weights)", w1, w + pos * K, K, 4));
done:
    k1_free(&mem);
}

TEST(gpu, k1_router_topk) {
    K1_NEED_GPU();
    k1_router_case(37, 64, 6, 1);
    k1_router_case(5, 300, 10, 0);
    k1_router_case(3, 512, 10, 1);
    k1_router_case(2, 1100, 8, 1); /* E > 4 * 256: the general selection loop */
}

/* Exact expectations on rows whose selection is fixed: all logits equal (ids 0 .. K-1, equal weights),
   the top K all in one warp's threads (the rank selection's per-warp candidates), equal logits across
   the K-th place (lower ids first), and a NaN logit (every probability NaN: no candidate, so ids 0
   and weight -inf, NaN after the norm) — in the rank selection (E <= 1,024) and the repeated
   arg-max (E > 1,024). */
static void k1_router_edges(int E, int norm) {
    enum { M = 4, K = 10 };
    k1_mem mem = {{0}, 0, {0}, 0};
    static const int tie[12] = {3, 60, 100, 130, 200, 257, 300, 333, 400, 450, 480, 511};
    float *l, w[M * K];
    int ids[M * K];
    K1_ALLOC(l, float, (size_t)M * E);
    k1_seed(5 + (uint64_t)E);
    k1_fill(l, (size_t)M * E, -4, 4);
    for (int e = 0; e < E; e++) l[e] = 0.5f;
    for (int k = 0; k < K; k++) l[(size_t)E + 32 + k] = 6.0f + 0.01f * (float)k;
    for (int i = 0; i < 12; i++) l[2 * (size_t)E + tie[i]] = 5.0f;
    l[3 * (size_t)E + 77] = NAN;
    K1_TRY(k1_run_router(l, M, E, K, norm, ids, w));
    {
        const float p = 1.0f / (float)E;
        float s = 0.0f;
        for (int k = 0; k < K; k++) s += p;
        for (int k = 0; k < K; k++) {
            CHECKF(ids[k] == k, "router edges E=%d: equal logits: id %d at %d", E, ids[k], k);
            CHECKF(w[k] == (norm ? p / s : p), "router edges E=%d: equal logits: weight %.9g", E, w[k]);
            CHECKF(ids[K + k] == 32 + k, "router edges E=%d: one warp's top K: id %d at %d", E, ids[K + k], k);
            CHECKF(ids[2 * K + k] == tie[k], "router edges E=%d: ties at the K-th place: id %d at %d", E, ids[2 * K + k], k);
            CHECKF(ids[3 * K + k] == 0 && (norm ? w[3 * K + k] != w[3 * K + k] : isinf(w[3 * K + k]) && w[3 * K + k] < 0),
                   "router edges E=%d: NaN row: id %d weight %g", E, ids[3 * K + k], w[3 * K + k]);
        }
    }
done:
    k1_free(&mem);
}

TEST(gpu, k1_router_topk_edges) {
    K1_NEED_GPU();
    k1_router_edges(512, 1);
    k1_router_edges(512, 0);
    k1_router_edges(1100, 1); /* the repeated arg-max */
}

/* Runs plan -> gate_up -> down -> combine for M tokens with the given routing; returns h16, y, out
   and the plan (pairs, tiles, ntiles). */
typedef struct k1_moe_dev {
    CUdeviceptr ex;
    int E, H, I;
} k1_moe_dev;
static qsa_result k1_run_moe(const k1_moe_dev *md, const uint16_t *x16, const int *ids, const float *tw, int M, int K,
                             int act, int tr, uint16_t *h16, float *y, float *out, int *pairs, int *tiles, int *ntiles) {
    k1_mem mem = {{0}, 0, {0}, 0};
    /* tr = -16: 16-pair tiles through the cross-warp kernels (qsa_k_moe_*_xw), a K segment of one matrix per warp;
       tr = -1 .. -15: the same kernels with -tr ranges of segments per tile (ranged forms, split where -tr
       reaches the segment count); tr = -256: the whole-tile forms (qsa_k_moe_*_xwk); tr = -512 - c: their lean
       forms (qsa_k_moe_*_xwn: NVFP4 experts, H and I multiples of 64, sm_80+) with 2^c tasks per warp */
    int xw = tr < 0, lean = tr <= -512 && tr >= -514, whole = tr == -256 || lean;
    int nrange = tr < 0 && tr > -16 ? -tr : 1 << 20, ctw = lean ? 1 << (-512 - tr) : 1;
    if (xw) tr = 16;
    int MK = M * K, E = md->E, H = md->H, I = md->I, t64 = tr == 64;
    int max_tiles = (MK + tr - 1) / tr + (E < MK ? E : MK);
    int nsh = (H + 255) / 256, nsi = (I + 255) / 256, ncol = (H > I ? H : I) / 16;
    int nuh = nrange < nsh ? nrange : nsh, nui = nrange < nsi ? nrange : nsi; /* warps per tile and matrix */
    size_t nparts = (size_t)MK * ((size_t)(I / 16) * nsh * 2 > (size_t)(H / 16) * nsi ? (size_t)(I / 16) * nsh * 2 : (size_t)(H / 16) * nsi) * 16;
    CUdeviceptr dpart = 0, dcnt = 0;
    CUdeviceptr dx, di, dw, dp, dt, dn, dwc, dh, dy, dout, dex = md->ex;
    qsa_result r = k1_dev(&mem, &dx, x16, sizeof(uint16_t) * (size_t)M * H);
    if (r == QSA_OK) r = k1_dev(&mem, &di, ids, sizeof(int) * (size_t)MK);
    if (r == QSA_OK) r = k1_dev(&mem, &dw, tw, sizeof(float) * (size_t)MK);
    if (r == QSA_OK) r = k1_dev(&mem, &dp, NULL, sizeof(int) * (size_t)MK);
    if (r == QSA_OK) r = k1_dev(&mem, &dt, NULL, sizeof(int) * 3 * (size_t)max_tiles);
    if (r == QSA_OK) r = k1_dev(&mem, &dn, NULL, sizeof(int));
    if (r == QSA_OK) r = k1_dev(&mem, &dwc, NULL, sizeof(int) * 32 * (size_t)E);
    if (r == QSA_OK) r = k1_dev(&mem, &dh, NULL, sizeof(uint16_t) * (size_t)MK * I);
    if (r == QSA_OK) r = k1_dev(&mem, &dy, NULL, sizeof(float) * (size_t)MK * H);
    if (r == QSA_OK) r = k1_dev(&mem, &dout, NULL, sizeof(float) * (size_t)M * H);
    if (r == QSA_OK && xw) r = k1_dev(&mem, &dpart, NULL, sizeof(float) * nparts);
    if (r == QSA_OK && xw) r = k1_dev(&mem, &dcnt, NULL, sizeof(unsigned) * (size_t)max_tiles * ncol);
    if (r == QSA_OK && xw) r = QSA__CU_R(qsa__cu.cuMemsetD8_v2(dcnt, 0, sizeof(unsigned) * (size_t)max_tiles * ncol));
    if (r == QSA_OK) {
        void *args[] = {&di, &MK, &E, &dp, &dt, &dn, &tr, &dwc};
        r = k1_launch("qsa_k_moe_plan", 1, 1, 1024, args);
    }
    for (int rep = 0; rep < (xw ? 2 : 1); rep++) { /* xw twice: the tickets must be back at zero */
        if (r == QSA_OK && xw && whole) {
            void *args[] = {&dx, &dp, &dt, &dn, &dex, &dh, &H, &I, &K, &act, &dpart, &dcnt, &ctw};
            int w = lean ? QSA__LEAN_WARPS : 4; /* warps per block */
            r = k1_launch(lean ? "qsa_k_moe_gate_up_xwn" : "qsa_k_moe_gate_up_xwk",
                          (unsigned)(((size_t)max_tiles * (I / 16) * 2 + w * ctw - 1) / (w * ctw)), 1, 32 * w, args);
        } else if (r == QSA_OK && xw) {
            void *args[] = {&dx, &dp, &dt, &dn, &dex, &dh, &H, &I, &K, &act, &dpart, &dcnt, &nrange};
            r = k1_launch("qsa_k_moe_gate_up_xw", (unsigned)(((size_t)max_tiles * (I / 16) * 2 * nuh + 3) / 4), 1, 128, args);
        } else if (r == QSA_OK) {
            void *args[] = {&dx, &dp, &dt, &dn, &dex, &dh, &H, &I, &K, &act};
            r = k1_launch(t64 ? "qsa_k_moe_gate_up64" : "qsa_k_moe_gate_up", (unsigned)max_tiles,
                          (unsigned)(t64 ? (I + 31) / 32 : (I + 15) / 16), 256, args);
        }
        if (r == QSA_OK && xw && whole) {
            /* the lean down kernel's look-ups before its PDL wait (a plain launch here) at 1 and 4 tasks per warp
               (its first fold's rows of one task and of two), not at 2 */
            int early = ctw != 2;
            void *args[] = {&dh, &dp, &dt, &dn, &dex, &dy, &H, &I, &ctw, &early};
            int w = lean ? QSA__LEAN_WARPS : 4; /* warps per block */
            r = k1_launch(lean ? "qsa_k_moe_down_xwn" : "qsa_k_moe_down_xwk",
                          (unsigned)(((size_t)max_tiles * (H / 16) + w * ctw - 1) / (w * ctw)), 1, 32 * w, args);
        } else if (r == QSA_OK && xw) {
            void *args[] = {&dh, &dp, &dt, &dn, &dex, &dy, &H, &I, &dpart, &dcnt, &nrange};
            r = k1_launch("qsa_k_moe_down_xw", (unsigned)(((size_t)max_tiles * (H / 16) * nui + 3) / 4), 1, 128, args);
        } else if (r == QSA_OK) {
            void *args[] = {&dh, &dp, &dt, &dn, &dex, &dy, &H, &I};
            r = k1_launch(t64 ? "qsa_k_moe_down64" : "qsa_k_moe_down", (unsigned)max_tiles,
                          (unsigned)(t64 ? (H + 63) / 64 : (H + 15) / 16), 256, args);
        }
    }
    if (r == QSA_OK) {
        CUdeviceptr nosh = 0;
        void *args[] = {&dy, &dw, &dout, &H, &K, &nosh, &nosh};
        r = k1_launch("qsa_k_moe_combine", (unsigned)M, 1, 256, args);
    }
    if (r == QSA_OK) r = k1_get(h16, dh, sizeof(uint16_t) * (size_t)MK * I);
    if (r == QSA_OK) r = k1_get(y, dy, sizeof(float) * (size_t)MK * H);
    if (r == QSA_OK) r = k1_get(out, dout, sizeof(float) * (size_t)M * H);
    if (r == QSA_OK && pairs) r = k1_get(pairs, dp, sizeof(int) * (size_t)MK);
    if (r == QSA_OK && tiles) r = k1_get(ntiles, dn, sizeof(int));
    if (r == QSA_OK && tiles && *ntiles >= 0 && *ntiles <= max_tiles)
        r = k1_get(tiles, dt, sizeof(int) * 3 * (size_t)*ntiles);
    k1_free(&mem);
    return r;
}

/* Experts: even ids dense fp16, odd ids NVFP4 (the kernels choose per matrix), or all NVFP4 (allnv; with H
   and I multiples of 64 on sm_80+ also through the lean whole forms).  Checks the plan,
   h = act(gate x) * up x, y = down h, the combine, and batch invariance (token `pos` alone). */
static void k1_moe_case(int M, int E, int K, int H, int I, int act, int allnv) {
    k1_mem mem = {{0}, 0, {0}, 0};
    int MK = M * K, pos = M > 21 ? 21 : M - 1;
    int max_tiles = (MK + 15) / 16 + (E < MK ? E : MK);
    uint16_t *x16, *h16, *h16b;
    float *xf, *tw, *y, *out, *yb, *outb, *hf, *got, **wg, **wu, **wd, *cpu;
    int *ids, *pairs, *tiles, ntiles = -1, nt1 = 0;
    double *want, *atol;
    k1_expert *ex;
    k1_moe_dev md;
    char what[96];
    md.E = E;
    md.H = H;
    md.I = I;
    K1_ALLOC(x16, uint16_t, M * H);
    K1_ALLOC(xf, float, M * H);
    K1_ALLOC(ids, int, MK);
    K1_ALLOC(tw, float, MK);
    K1_ALLOC(h16, uint16_t, (size_t)MK * I);
    K1_ALLOC(h16b, uint16_t, (size_t)K * I);
    K1_ALLOC(hf, float, (size_t)MK * I);
    K1_ALLOC(y, float, (size_t)MK * H);
    K1_ALLOC(yb, float, (size_t)K * H);
    K1_ALLOC(out, float, M * H);
    K1_ALLOC(outb, float, H);
    K1_ALLOC(cpu, float, M * H);
    K1_ALLOC(got, float, (size_t)MK * (I > H ? I : H));
    K1_ALLOC(want, double, (size_t)MK * (I > H ? I : H));
    K1_ALLOC(atol, double, (size_t)MK * (I > H ? I : H));
    K1_ALLOC(pairs, int, MK);
    K1_ALLOC(tiles, int, 3 * max_tiles);
    K1_ALLOC(ex, k1_expert, E);
    K1_ALLOC(wg, float *, E);
    K1_ALLOC(wu, float *, E);
    K1_ALLOC(wd, float *, E);
    CHECKF(sizeof(k1_expert) == 88, "expert table entry is %zu bytes, the kernels expect 88", sizeof(k1_expert));
    k1_seed(21 + (uint64_t)E * 3 + (uint64_t)act);
    k1_fill16(x16, xf, (size_t)M * H, -1, 1);
    for (int t = 0; t < M; t++) { /* K distinct ascending experts, positive weights */
        int chosen = 0;
        while (chosen < K) {
            int e = (int)k1_u(0, E), dup = 0;
            for (int j = 0; j < chosen; j++) dup |= ids[t * K + j] == e;
            if (!dup) ids[t * K + chosen++] = e;
        }
        for (int i = 1; i < K; i++)
            for (int j = i; j > 0 && ids[t * K + j - 1] > ids[t * K + j]; j--) {
                int tmp = ids[t * K + j]; ids[t * K + j] = ids[t * K + j - 1]; ids[t * K + j - 1] = tmp;
            }
        for (int k = 0; k < K; k++) tw[t * K + k] = (float)k1_u(0.05, 1);
    }
    /* all experts' matrices in one host/device array per kind (gate, up, down) */
    for (int m = 0; m < 3; m++) {
        size_t n = (size_t)(m < 2 ? I : H) * (m < 2 ? H : I);
        CUdeviceptr d16, dq, ds;
        uint16_t *w16;
        uint8_t *q, *s;
        float *wall;
        K1_ALLOC(wall, float, n * E);
        K1_ALLOC(w16, uint16_t, n * E);
        K1_ALLOC(q, uint8_t, n / 2 * E);
        K1_ALLOC(s, uint8_t, n / 16 * E);
        float s2 = 0.004f + 0.001f * (float)m;
        for (int e = 0; e < E; e++) {
            if (e % 2 == 0 && !allnv) k1_fill16(w16 + n * e, wall + n * e, n, -0.3, 0.3);
            else k1_rand_nvfp4(q + n / 2 * e, s + n / 16 * e, s2, wall + n * e, m < 2 ? I : H, m < 2 ? H : I);
        }
        K1_TRY(k1_dev(&mem, &d16, w16, n * 2 * E));
        K1_TRY(k1_dev_q(&mem, &dq, q, n / 2 * E, 0, m < 2 ? H : I));
        K1_TRY(k1_dev(&mem, &ds, s, n / 16 * E));
        for (int e = 0; e < E; e++) {
            int nv = e % 2 || allnv;
            unsigned long long p16 = nv ? 0 : d16 + n * 2 * e, pq = nv ? dq + n / 2 * e : 0,
                               ps = nv ? ds + n / 16 * e : 0;
            float ps2 = nv ? s2 : 0.0f;
            if (m == 0) { ex[e].gate16 = p16; ex[e].gate_q = pq; ex[e].gate_s = ps; ex[e].gate_s2 = ps2; wg[e] = wall + n * e; }
            if (m == 1) { ex[e].up16 = p16; ex[e].up_q = pq; ex[e].up_s = ps; ex[e].up_s2 = ps2; wu[e] = wall + n * e; }
            if (m == 2) { ex[e].down16 = p16; ex[e].down_q = pq; ex[e].down_s = ps; ex[e].down_s2 = ps2; wd[e] = wall + n * e; }
        }
    }
    K1_TRY(k1_dev(&mem, &md.ex, ex, sizeof(k1_expert) * (size_t)E));
    K1_TRY(k1_run_moe(&md, x16, ids, tw, M, K, act, 16, h16, y, out, pairs, tiles, &ntiles));
    /* the plan: tiles in ascending expert order, consecutive, <= 16 pairs each, every pair once */
    {
        int ok = ntiles > 0 && ntiles <= max_tiles, next = 0, laste = -1;
        for (int i = 0; ok && i < ntiles; i++) {
            int e = tiles[3 * i], first = tiles[3 * i + 1], cnt = tiles[3 * i + 2];
            ok = e >= laste && first == next && cnt >= 1 && cnt <= 16 && e < E;
            for (int j = 0; ok && j < cnt; j++) {
                int p = pairs[first + j];
                ok = p >= 0 && p < MK && ids[p] == e && (j == 0 || pairs[first + j - 1] < p);
            }
            next = first + cnt;
            laste = e;
        }
        CHECKF(ok && next == MK, "moe_plan: bad plan (%d tiles, %d of %d pairs covered)", ntiles, next, MK);
    }
    /* h: act(gate x) * up x from fp16 x and fp16(-rounded) weights, in double.  Tolerance: the GEMM
       bound c * sum|x w| on each of g and u (see k1_ref_gemm), propagated through act(g) * u
       (|silu'| <= 1.1, |sigmoid'| <= 0.25), plus the fp16 rounding of h (rtol 2^-11 -> 1e-3). */
    {
        double c = (double)H * ldexp(1.0, -23);
        if (c < 1e-5) c = 1e-5;
        for (int p = 0; p < MK; p++) {
            int e = ids[p], t = p / K;
            for (int i = 0; i < I; i++) {
                double g = 0, u = 0, mg = 0, mu = 0;
                for (int j = 0; j < H; j++) {
                    double a = xf[(size_t)t * H + j];
                    g += a * wg[e][(size_t)i * H + j];
                    u += a * wu[e][(size_t)i * H + j];
                    mg += fabs(a * wg[e][(size_t)i * H + j]);
                    mu += fabs(a * wu[e][(size_t)i * H + j]);
                }
                double ag = act ? 1.0 / (1.0 + exp(-g)) : g / (1.0 + exp(-g));
                want[(size_t)p * I + i] = ag * u;
                atol[(size_t)p * I + i] = c * ((act ? 0.25 : 1.1) * mg * fabs(u) + fabs(ag) * mu) + 1e-7;
            }
        }
        k1_h2f(h16, hf, (size_t)MK * I);
        snprintf(what, sizeof what, "moe_gate_up E=%d H=%d I=%d act=%d", E, H, I, act);
        CHECK(k1_cmp(what, hf, want, (size_t)MK * I, atol, 0, 1e-3) == 0);
    }
    /* y = down h, from the GPU's own h (fp16), in double; the GEMM tolerance over I terms */
    {
        double c = (double)I * ldexp(1.0, -23);
        if (c < 1e-5) c = 1e-5;
        for (int p = 0; p < MK; p++) {
            int e = ids[p];
            for (int j = 0; j < H; j++) {
                double s = 0, mag = 0;
                for (int i = 0; i < I; i++) {
                    double v = (double)hf[(size_t)p * I + i] * wd[e][(size_t)j * I + i];
                    s += v;
                    mag += fabs(v);
                }
                want[(size_t)p * H + j] = s;
                atol[(size_t)p * H + j] = c * mag + 1e-30;
            }
        }
        snprintf(what, sizeof what, "moe_down E=%d H=%d I=%d", E, H, I);
        CHECK(k1_cmp(what, y, want, (size_t)MK * H, atol, 0, 0) == 0);
    }
    /* combine: the CPU's `out[j] += y[j] * topw[k]` in slot order from 0, on the GPU's y: bitwise */
    for (int t = 0; t < M; t++)
        for (int j = 0; j < H; j++) {
            float acc = 0.0f;
            for (int k = 0; k < K; k++) acc += y[((size_t)t * K + k) * H + j] * tw[t * K + k];
            cpu[(size_t)t * H + j] = acc;
        }
    CHECK(!k1_same("moe_combine vs the CPU expression", out, cpu, (size_t)M * H, 4));
    /* batch invariance: token pos alone */
    K1_TRY(k1_run_moe(&md, x16 + (size_t)pos * H, ids + pos * K, tw + pos * K, 1, K, act, 16, h16b, yb, outb, NULL, NULL,
                      &nt1));
    CHECK(!k1_same("moe batch invariance (h16)", h16b, h16 + (size_t)pos * K * I, (size_t)K * I, 2));
    CHECK(!k1_same("moe batch invariance (y)", yb, y + (size_t)pos * K * H, (size_t)K * H, 4));
    CHECK(!k1_same("moe batch invariance (out)", outb, out + (size_t)pos * H, H, 4));
    /* 64-pair tiles (the prefill kernels): a valid plan and the same bits for every pair */
    {
        uint16_t *h64;
        float *y64, *out64;
        int *tiles64, nt64 = -1, max64 = (MK + 63) / 64 + (E < MK ? E : MK);
        K1_ALLOC(h64, uint16_t, (size_t)MK * I);
        K1_ALLOC(y64, float, (size_t)MK * H);
        K1_ALLOC(out64, float, M * H);
        K1_ALLOC(tiles64, int, 3 * max64);
        K1_TRY(k1_run_moe(&md, x16, ids, tw, M, K, act, 64, h64, y64, out64, pairs, tiles64, &nt64));
        int ok = nt64 > 0 && nt64 <= max64, covered = 0;
        for (int i = 0; ok && i < nt64; i++) {
            ok = tiles64[3 * i + 1] == covered && tiles64[3 * i + 2] >= 1 && tiles64[3 * i + 2] <= 64;
            covered += tiles64[3 * i + 2];
        }
        CHECKF(ok && covered == MK, "moe_plan tr=64: bad plan (%d tiles, %d of %d pairs)", nt64, covered, MK);
        CHECK(!k1_same("moe 64-pair tiles == 16-pair tiles (h16)", h64, h16, (size_t)MK * I, 2));
        CHECK(!k1_same("moe 64-pair tiles == 16-pair tiles (y)", y64, y, (size_t)MK * H, 4));
        CHECK(!k1_same("moe 64-pair tiles == 16-pair tiles (out)", out64, out, (size_t)M * H, 4));
        /* the cross-warp kernels (decode): the same bits, launched twice */
        K1_TRY(k1_run_moe(&md, x16, ids, tw, M, K, act, -16, h64, y64, out64, NULL, NULL, &nt64));
        CHECK(!k1_same("moe cross-warp == one-block kernels (h16)", h64, h16, (size_t)MK * I, 2));
        CHECK(!k1_same("moe cross-warp == one-block kernels (y)", y64, y, (size_t)MK * H, 4));
        CHECK(!k1_same("moe cross-warp == one-block kernels (out)", out64, out, (size_t)M * H, 4));
        K1_TRY(k1_run_moe(&md, x16, ids, tw, M, K, act, -256, h64, y64, out64, NULL, NULL, &nt64));
        CHECK(!k1_same("moe cross-warp, whole tiles == one-block kernels (h16)", h64, h16, (size_t)MK * I, 2));
        CHECK(!k1_same("moe cross-warp, whole tiles == one-block kernels (y)", y64, y, (size_t)MK * H, 4));
        CHECK(!k1_same("moe cross-warp, whole tiles == one-block kernels (out)", out64, out, (size_t)M * H, 4));
        for (int c = 0; allnv && H % 64 == 0 && I % 64 == 0 && k1_arch_num() >= 80 && c <= 2; c++) {
            /* 1, 2 and 4 tasks per warp (2 and 4: gate and up of a column tile in one warp, no ticket) */
            K1_TRY(k1_run_moe(&md, x16, ids, tw, M, K, act, -512 - c, h64, y64, out64, NULL, NULL, &nt64));
            snprintf(what, sizeof what, "moe cross-warp, lean whole tiles, %d task(s) per warp == one-block kernels",
                     1 << c);
            CHECK(!k1_same(what, h64, h16, (size_t)MK * I, 2));
            CHECK(!k1_same(what, y64, y, (size_t)MK * H, 4));
            CHECK(!k1_same(what, out64, out, (size_t)M * H, 4));
        }
        for (int nr = 1; nr <= 2; nr++) { /* segment ranges: one range of all segments, and two */
            K1_TRY(k1_run_moe(&md, x16, ids, tw, M, K, act, -nr, h64, y64, out64, NULL, NULL, &nt64));
            snprintf(what, sizeof what, "moe cross-warp, %d segment range(s) == one-block kernels", nr);
            CHECK(!k1_same(what, h64, h16, (size_t)MK * I, 2));
            CHECK(!k1_same(what, y64, y, (size_t)MK * H, 4));
            CHECK(!k1_same(what, out64, out, (size_t)M * H, 4));
        }
    }
done:
    k1_free(&mem);
}

/* The router's launch with its extras (qsa_router_extra): the same ids and weights as the plain
   top-k, the same pairs, tiles and tile count as a separate qsa_k_moe_plan launch on those ids
   (1,024 threads there, 256 here), the shared expert's middle within an fp16 rounding of the CPU's
   act(gate) * up; twice in a row (the ticket back at zero). */
static void k1_router_extra_case(int M, int E, int K, int Is, int act) {
    k1_mem mem = {{0}, 0, {0}, 0};
    int MK = M * K, tr = MK >= 16 * E ? 64 : 16, max_tiles = (MK + tr - 1) / tr + (E < MK ? E : MK), norm = 1;
    int nt0 = -1, nt1 = -2, *ids0, *ids1, *pairs0, *pairs1, *tiles0, *tiles1;
    float *logits, *sa, *sb, *w0, *w1;
    uint16_t *h16;
    unsigned ticket = 1;
    CUdeviceptr dl, di, dw, dsa, dsb, dh, dp, dt, dn, dwc, dtk;
    char what[128];
    K1_ALLOC(logits, float, M * E);
    K1_ALLOC(sa, float, M * Is);
    K1_ALLOC(sb, float, M * Is);
    K1_ALLOC(h16, uint16_t, M * Is);
    K1_ALLOC(ids0, int, MK);
    K1_ALLOC(ids1, int, MK);
    K1_ALLOC(w0, float, MK);
    K1_ALLOC(w1, float, MK);
    K1_ALLOC(pairs0, int, MK);
    K1_ALLOC(pairs1, int, MK);
    K1_ALLOC(tiles0, int, 3 * max_tiles);
    K1_ALLOC(tiles1, int, 3 * max_tiles);
    k1_seed(4242 + (uint64_t)(M * 31 + E + K));
    k1_fill(logits, (size_t)M * E, -4, 4);
    k1_fill(sa, (size_t)M * Is, -5, 5);
    k1_fill(sb, (size_t)M * Is, -3, 3);
    K1_TRY(k1_dev(&mem, &dl, logits, sizeof(float) * M * E));
    K1_TRY(k1_dev(&mem, &di, NULL, sizeof(int) * MK));
    K1_TRY(k1_dev(&mem, &dw, NULL, sizeof(float) * MK));
    K1_TRY(k1_dev(&mem, &dsa, sa, sizeof(float) * M * Is));
    K1_TRY(k1_dev(&mem, &dsb, sb, sizeof(float) * M * Is));
    K1_TRY(k1_dev(&mem, &dh, NULL, sizeof(uint16_t) * M * Is));
    K1_TRY(k1_dev(&mem, &dp, NULL, sizeof(int) * MK));
    K1_TRY(k1_dev(&mem, &dt, NULL, sizeof(int) * 3 * max_tiles));
    K1_TRY(k1_dev(&mem, &dn, NULL, sizeof(int)));
    K1_TRY(k1_dev(&mem, &dwc, NULL, sizeof(int) * 32 * E));
    K1_TRY(k1_dev(&mem, &dtk, NULL, sizeof(unsigned)));
    K1_TRY(QSA__CU_R(qsa__cu.cuMemsetD8_v2(dtk, 0, sizeof(unsigned))));
    { /* reference: the plain top-k, then the separate plan */
        qsa__router_extra none;
        memset(&none, 0, sizeof none);
        void *a1[] = {&dl, &di, &dw, &E, &K, &norm, &none};
        K1_TRY(k1_launch("qsa_k_router_topk", (unsigned)M, 1, 256, a1));
        void *a2[] = {&di, &MK, &E, &dp, &dt, &dn, &tr, &dwc};
        K1_TRY(k1_launch("qsa_k_moe_plan", 1, 1, 1024, a2));
        K1_TRY(k1_get(ids0, di, sizeof(int) * MK));
        K1_TRY(k1_get(w0, dw, sizeof(float) * MK));
        K1_TRY(k1_get(pairs0, dp, sizeof(int) * MK));
        K1_TRY(k1_get(&nt0, dn, sizeof(int)));
        K1_TRY(k1_get(tiles0, dt, sizeof(int) * 3 * max_tiles));
    }
    for (int rep = 0; rep < 2; rep++) {
        K1_TRY(k1_poison(di, sizeof(int) * MK));
        K1_TRY(k1_poison(dw, sizeof(float) * MK));
        K1_TRY(k1_poison(dp, sizeof(int) * MK));
        K1_TRY(k1_poison(dt, sizeof(int) * 3 * max_tiles));
        K1_TRY(k1_poison(dn, sizeof(int)));
        K1_TRY(k1_poison(dh, sizeof(uint16_t) * M * Is));
        qsa__router_extra x = {dsa, dsb, dh, Is, act, dp, dt, dn, dwc, dtk, tr};
        void *a[] = {&dl, &di, &dw, &E, &K, &norm, &x};
        K1_TRY(k1_launch("qsa_k_router_topk", (unsigned)M, 1, 256, a));
        K1_TRY(k1_get(ids1, di, sizeof(int) * MK));
        K1_TRY(k1_get(w1, dw, sizeof(float) * MK));
        K1_TRY(k1_get(pairs1, dp, sizeof(int) * MK));
        K1_TRY(k1_get(&nt1, dn, sizeof(int)));
        K1_TRY(k1_get(tiles1, dt, sizeof(int) * 3 * max_tiles));
        K1_TRY(k1_get(h16, dh, sizeof(uint16_t) * M * Is));
        K1_TRY(k1_get(&ticket, dtk, sizeof(unsigned)));
        snprintf(what, sizeof what, "router + extras M=%d E=%d K=%d launch %d", M, E, K, rep + 1);
        CHECKF(!memcmp(ids0, ids1, sizeof(int) * MK) && !memcmp(w0, w1, sizeof(float) * MK), "%s: ids / weights", what);
        CHECKF(nt0 == nt1 && nt0 >= 1 && nt0 <= max_tiles, "%s: %d tiles, the plan kernel %d", what, nt1, nt0);
        CHECKF(!memcmp(pairs0, pairs1, sizeof(int) * MK), "%s: pairs", what);
        CHECKF(nt0 == nt1 && nt0 >= 1 && nt0 <= max_tiles && !memcmp(tiles0, tiles1, sizeof(int) * 3 * (size_t)nt0), "%s: tiles", what);
        CHECKF(ticket == 0u, "%s: ticket left at %u", what, ticket);
        int bad = 0;
        for (int i = 0; i < M * Is; i++) {
            const float want = qsa__act(act ? QSA_ACT_SIGMOID : QSA_ACT_SILU, sa[i]) * sb[i], got = qsa__f16_to_f32(h16[i]);
            bad += !(fabsf(got - want) <= fabsf(want) * (1.0f / 1024.0f) + 1e-7f);
        }
        CHECKF(bad == 0, "%s: %d of %d shared-expert middle values off by more than an fp16 rounding", what, bad, M * Is);
    }
done:
    k1_free(&mem);
}

TEST(gpu, k1_router_extras) {
    K1_NEED_GPU();
    k1_router_extra_case(1, 512, 10, 640, 0); /* decode: one token, the real routing */
    k1_router_extra_case(5, 512, 10, 100, 1);
    k1_router_extra_case(2, 64, 4, 1100, 1); /* more shared-expert values than the block loads ahead */
    k1_router_extra_case(37, 64, 4, 72, 0);
    k1_router_extra_case(300, 64, 4, 40, 0); /* 1,200 pairs >= 16 E: tiles of 64 */
}

/* One token's router inside its gate/up launch (qsa_k_moe_gate_up_xwr, 128 threads a block) against the
   router's own launch (256 threads, with the shared expert's middle and the plan) followed by
   qsa_k_moe_gate_up_xw with the same segment ranges: the same ids, weights, pairs, tiles, tile count,
   shared-expert middle and h16, bit for bit, launched twice over poisoned outputs (the tickets back at
   zero).  Rows: random logits, the K-th place among exact ties (edge 1), every logit NaN (edge 2: ids
   all 0, one tile of K pairs).  Experts all NVFP4. */
static void k1_route1_case(int E, int K, int H, int I, int Is, int act, int norm, int edge, int nrange) {
    k1_mem mem = {{0}, 0, {0}, 0};
    const int max_tiles = 1 + (E < K ? E : K), ncol = I / 16, nseg = (H + 255) / 256, nu = nrange < nseg ? nrange : nseg;
    const unsigned grid0 = (unsigned)((max_tiles * ncol * 2 * nu + 3) / 4), grid1 = (unsigned)((K * ncol * 2 * nu + 3) / 4);
    int nt0 = -1, nt1 = -2, tr = 16, *ids0, *ids1, *pairs0, *pairs1, *tiles0, *tiles1;
    float *logits, *sa, *sb, *w0, *w1, *xf;
    uint16_t *x16, *h0, *h1, *sh0, *sh1;
    uint8_t *q, *s;
    k1_expert *ex;
    unsigned tk[64];
    CUdeviceptr dl, dx, di, dw, dsa, dsb, dsh, dp, dt, dn, dwc, dtk, dh, dpart, dcnt, dex;
    char what[160];
    K1_ALLOC(logits, float, E);
    K1_ALLOC(sa, float, Is);
    K1_ALLOC(sb, float, Is);
    K1_ALLOC(x16, uint16_t, H);
    K1_ALLOC(xf, float, (size_t)I * H);
    K1_ALLOC(h0, uint16_t, (size_t)K * I);
    K1_ALLOC(h1, uint16_t, (size_t)K * I);
    K1_ALLOC(sh0, uint16_t, Is);
    K1_ALLOC(sh1, uint16_t, Is);
    K1_ALLOC(ids0, int, K);
    K1_ALLOC(ids1, int, K);
    K1_ALLOC(w0, float, K);
    K1_ALLOC(w1, float, K);
    K1_ALLOC(pairs0, int, K);
    K1_ALLOC(pairs1, int, K);
    K1_ALLOC(tiles0, int, 3 * max_tiles);
    K1_ALLOC(tiles1, int, 3 * max_tiles);
    K1_ALLOC(q, uint8_t, (size_t)I * H / 2);
    K1_ALLOC(s, uint8_t, (size_t)I * H / 16);
    K1_ALLOC(ex, k1_expert, E);
    k1_seed(777 + (uint64_t)(E * 7 + K * 3 + edge));
    k1_fill(logits, (size_t)E, -4, 4);
    if (edge == 1) /* K + 2 equal logits across the K-th place, spread over the block's threads */
        for (int i = 0; i < K + 2; i++) logits[(i * 37 + 5) % E] = 6.0f;
    if (edge == 2)
        for (int e = 0; e < E; e++) logits[e] = NAN;
    k1_fill(sa, (size_t)Is, -5, 5);
    k1_fill(sb, (size_t)Is, -3, 3);
    k1_fill16(x16, xf, (size_t)H, -1, 1);
    /* experts: gate and up [I][H], down [H][I] per expert, all NVFP4 */
    for (int m = 0; m < 3; m++) {
        const size_t n = (size_t)I * H;
        const float s2 = 0.004f + 0.001f * (float)m;
        CUdeviceptr dq, ds;
        uint8_t *qa, *sa_;
        K1_ALLOC(qa, uint8_t, n / 2 * E);
        K1_ALLOC(sa_, uint8_t, n / 16 * E);
        for (int e = 0; e < E; e++) {
            k1_rand_nvfp4(q, s, s2, xf, m < 2 ? I : H, m < 2 ? H : I);
            memcpy(qa + n / 2 * e, q, n / 2);
            memcpy(sa_ + n / 16 * e, s, n / 16);
        }
        K1_TRY(k1_dev_q(&mem, &dq, qa, n / 2 * E, 0, m < 2 ? H : I));
        K1_TRY(k1_dev(&mem, &ds, sa_, n / 16 * E));
        for (int e = 0; e < E; e++) {
            unsigned long long pq = dq + n / 2 * e, ps = ds + n / 16 * e;
            if (m == 0) { ex[e].gate_q = pq; ex[e].gate_s = ps; ex[e].gate_s2 = s2; }
            if (m == 1) { ex[e].up_q = pq; ex[e].up_s = ps; ex[e].up_s2 = s2; }
            if (m == 2) { ex[e].down_q = pq; ex[e].down_s = ps; ex[e].down_s2 = s2; }
        }
    }
    K1_TRY(k1_dev(&mem, &dex, ex, sizeof(k1_expert) * (size_t)E));
    K1_TRY(k1_dev(&mem, &dl, logits, sizeof(float) * E));
    K1_TRY(k1_dev(&mem, &dx, x16, sizeof(uint16_t) * H));
    K1_TRY(k1_dev(&mem, &dsa, sa, sizeof(float) * Is));
    K1_TRY(k1_dev(&mem, &dsb, sb, sizeof(float) * Is));
    K1_TRY(k1_dev(&mem, &di, NULL, sizeof(int) * K));
    K1_TRY(k1_dev(&mem, &dw, NULL, sizeof(float) * K));
    K1_TRY(k1_dev(&mem, &dsh, NULL, sizeof(uint16_t) * Is));
    K1_TRY(k1_dev(&mem, &dp, NULL, sizeof(int) * K));
    K1_TRY(k1_dev(&mem, &dt, NULL, sizeof(int) * 3 * max_tiles));
    K1_TRY(k1_dev(&mem, &dn, NULL, sizeof(int)));
    K1_TRY(k1_dev(&mem, &dwc, NULL, sizeof(int) * 32 * E));
    K1_TRY(k1_dev(&mem, &dtk, NULL, sizeof(unsigned)));
    K1_TRY(k1_dev(&mem, &dh, NULL, sizeof(uint16_t) * (size_t)K * I));
    K1_TRY(k1_dev(&mem, &dpart, NULL, sizeof(float) * (size_t)K * ncol * nseg * 2 * 16));
    K1_TRY(k1_dev(&mem, &dcnt, NULL, sizeof(unsigned) * (size_t)max_tiles * ncol));
    K1_TRY(QSA__CU_R(qsa__cu.cuMemsetD8_v2(dtk, 0, sizeof(unsigned))));
    K1_TRY(QSA__CU_R(qsa__cu.cuMemsetD8_v2(dcnt, 0, sizeof(unsigned) * (size_t)max_tiles * ncol)));
    { /* the router's own launch, then the gate/up launch on its plan */
        qsa__router_extra x = {dsa, dsb, dsh, Is, act, dp, dt, dn, dwc, dtk, tr};
        void *a1[] = {&dl, &di, &dw, &E, &K, &norm, &x};
        K1_TRY(k1_launch("qsa_k_router_topk", 1, 1, 256, a1));
        void *a2[] = {&dx, &dp, &dt, &dn, &dex, &dh, &H, &I, &K, &act, &dpart, &dcnt, &nrange};
        K1_TRY(k1_launch("qsa_k_moe_gate_up_xw", grid0, 1, 128, a2));
        K1_TRY(k1_get(ids0, di, sizeof(int) * K));
        K1_TRY(k1_get(w0, dw, sizeof(float) * K));
        K1_TRY(k1_get(pairs0, dp, sizeof(int) * K));
        K1_TRY(k1_get(&nt0, dn, sizeof(int)));
        K1_TRY(k1_get(tiles0, dt, sizeof(int) * 3 * max_tiles));
        K1_TRY(k1_get(sh0, dsh, sizeof(uint16_t) * Is));
        K1_TRY(k1_get(h0, dh, sizeof(uint16_t) * (size_t)K * I));
    }
    CHECKF(nt0 >= 1 && nt0 <= K, "route1 E=%d K=%d edge %d: the router's plan has %d tiles", E, K, edge, nt0);
    if (edge == 2)
        CHECKF(nt0 == (K + 15) / 16 && ids0[0] == 0 && ids0[K - 1] == 0, "route1 NaN row: %d tiles, ids %d..%d", nt0, ids0[0],
               ids0[K - 1]);
    for (int rep = 0; rep < 2 && nt0 >= 1 && nt0 <= K; rep++) {
        K1_TRY(k1_poison(di, sizeof(int) * K));
        K1_TRY(k1_poison(dw, sizeof(float) * K));
        K1_TRY(k1_poison(dp, sizeof(int) * K));
        K1_TRY(k1_poison(dt, sizeof(int) * 3 * max_tiles));
        K1_TRY(k1_poison(dn, sizeof(int)));
        K1_TRY(k1_poison(dsh, sizeof(uint16_t) * Is));
        K1_TRY(k1_poison(dh, sizeof(uint16_t) * (size_t)K * I));
        qsa__route1 rt = {dl, E, K, norm, di, dw, dp, dt, dn, dsa, dsb, dsh, Is, act};
        void *a[] = {&dx, &dex, &dh, &H, &I, &act, &dpart, &dcnt, &nrange, &rt};
        K1_TRY(k1_launch("qsa_k_moe_gate_up_xwr", grid1, 1, 128, a));
        K1_TRY(k1_get(ids1, di, sizeof(int) * K));
        K1_TRY(k1_get(w1, dw, sizeof(float) * K));
        K1_TRY(k1_get(pairs1, dp, sizeof(int) * K));
        K1_TRY(k1_get(&nt1, dn, sizeof(int)));
        K1_TRY(k1_get(tiles1, dt, sizeof(int) * 3 * max_tiles));
        K1_TRY(k1_get(sh1, dsh, sizeof(uint16_t) * Is));
        K1_TRY(k1_get(h1, dh, sizeof(uint16_t) * (size_t)K * I));
        K1_TRY(k1_get(tk, dcnt, sizeof(unsigned) * (size_t)(max_tiles * ncol < 64 ? max_tiles * ncol : 64)));
        snprintf(what, sizeof what, "route1 E=%d K=%d H=%d I=%d Is=%d act=%d norm=%d edge %d ranges %d launch %d", E, K, H,
                 I, Is, act, norm, edge, nrange, rep + 1);
        CHECKF(!memcmp(ids0, ids1, sizeof(int) * K), "%s: ids", what);
        CHECK(!k1_same(what, w1, w0, (size_t)K, 4));
        CHECKF(nt1 == nt0 && !memcmp(pairs0, pairs1, sizeof(int) * K) &&
                   !memcmp(tiles0, tiles1, sizeof(int) * 3 * (size_t)nt0), "%s: the plan (%d tiles, want %d)", what, nt1, nt0);
        CHECK(!k1_same(what, sh1, sh0, (size_t)Is, 2));
        CHECK(!k1_same(what, h1, h0, (size_t)K * I, 2));
        int left = 0;
        for (int i = 0; i < max_tiles * ncol && i < 64; i++) left += tk[i] != 0u;
        CHECKF(left == 0, "%s: %d tickets left non-zero", what, left);
    }
done:
    k1_free(&mem);
}

TEST(gpu, k1_moe_route1) {
    K1_NEED_GPU();
    k1_route1_case(512, 10, 256, 128, 640, 0, 1, 0, 3); /* the real routing: 512 experts, 10 of them; 3 ranges */
    k1_route1_case(512, 10, 512, 64, 640, 1, 0, 1, 1);  /* ties across the K-th place; one range */
    k1_route1_case(512, 10, 256, 64, 100, 0, 1, 2, 2);  /* every logit NaN: ids 0, one tile of 10 pairs */
    k1_route1_case(300, 32, 256, 32, 64, 1, 1, 0, 2);   /* 32 pairs (the one-warp plan's most), E not a multiple of 128 */
    k1_route1_case(300, 32, 256, 32, 64, 0, 0, 2, 1);   /* ... every logit NaN: 32 pairs of expert 0, two tiles of 16 */
    k1_route1_case(20, 2, 256, 16, 1100, 0, 1, 0, 1);   /* one block: the shared expert's middle in a loop */
}

/* qsa_k_moe_plan against the plan built here (a stable counting sort): pairs, tiles, tile count
   equal for random routings with invalid ids, skewed and uniform expert choices, prefill-sized
   MK, both tile sizes and several block sizes (the plan must not depend on the block). */
TEST(gpu, k1_moe_plan) {
    K1_NEED_GPU();
    /* (MK, E, skew): skew 1 crowds the low ids, skew 2 makes a fifth of the ids invalid; MK <= 32
       takes the one-warp plan (qsa_moe_plan_small), {32, 2}: experts with more than 16 pairs */
    static const int cases[][3] = {{10, 512, 0}, {320, 512, 0}, {20480, 512, 0}, {20480, 512, 1}, {777, 7, 0}, {5000, 1100, 0},
                                   {1, 3, 0}, {32, 2, 0}, {30, 512, 2}, {20, 5, 2}, {33, 4, 2}};
    static const int blocks[] = {1024, 256, 128, 32};
    k1_seed(91);
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        const int MK = cases[ci][0], E = cases[ci][1], skew = cases[ci][2];
        k1_mem mem = {{0}, 0, {0}, 0};
        int *ids = NULL, *want_p = NULL, *want_t = NULL, *got_p = NULL, *got_t = NULL, *cnt = NULL;
        int maxt = MK + (E < MK ? E : MK);
        K1_ALLOC(ids, int, MK);
        K1_ALLOC(want_p, int, MK);
        K1_ALLOC(got_p, int, MK);
        K1_ALLOC(want_t, int, 3 * maxt);
        K1_ALLOC(got_t, int, 3 * maxt);
        K1_ALLOC(cnt, int, E + 1);
        for (int i = 0; i < MK; i++) {
            double u = k1_u(0, 1);
            ids[i] = skew == 1 ? (int)(E * u * u * u) : (int)(E * u);
            if (ids[i] >= E) ids[i] = E - 1;
            if (k1_u(0, 1) < (skew == 2 ? 0.2 : 0.01)) ids[i] = k1_u(0, 1) < 0.5 ? -1 - (int)(5 * k1_u(0, 1)) : E + (int)(5 * k1_u(0, 1));
        }
        CUdeviceptr di, dp, dt, dn, dwc;
        qsa_result r = k1_dev(&mem, &di, ids, sizeof(int) * (size_t)MK);
        if (r == QSA_OK) r = k1_dev(&mem, &dp, NULL, sizeof(int) * (size_t)MK);
        if (r == QSA_OK) r = k1_dev(&mem, &dt, NULL, sizeof(int) * 3 * (size_t)maxt);
        if (r == QSA_OK) r = k1_dev(&mem, &dn, NULL, sizeof(int));
        if (r == QSA_OK) r = k1_dev(&mem, &dwc, NULL, sizeof(int) * 32 * (size_t)E);
        for (int tr = 16; tr <= 64 && r == QSA_OK; tr += 48) {
            int nwant = 0, np = 0;
            memset(cnt, 0, sizeof(int) * (size_t)(E + 1));
            for (int i = 0; i < MK; i++)
                if (ids[i] >= 0 && ids[i] < E) cnt[ids[i]]++;
            for (int e = 0; e < E; e++) {
                for (int j = 0; j * tr < cnt[e]; j++) {
                    want_t[3 * nwant] = e;
                    want_t[3 * nwant + 1] = np + tr * j;
                    want_t[3 * nwant + 2] = cnt[e] - tr * j < tr ? cnt[e] - tr * j : tr;
                    nwant++;
                }
                for (int i = 0; i < MK; i++)
                    if (ids[i] == e) want_p[np++] = i;
            }
            for (size_t bi = 0; bi < sizeof blocks / sizeof blocks[0] && r == QSA_OK; bi++) {
                int ngot = -1, mk = MK, e_ = E, tr_ = tr;
                void *args[] = {&di, &mk, &e_, &dp, &dt, &dn, &tr_, &dwc};
                r = k1_launch("qsa_k_moe_plan", 1, 1, (unsigned)blocks[bi], args);
                if (r == QSA_OK) r = k1_get(got_p, dp, sizeof(int) * (size_t)np);
                if (r == QSA_OK) r = k1_get(&ngot, dn, sizeof(int));
                if (r == QSA_OK && ngot == nwant) r = k1_get(got_t, dt, sizeof(int) * 3 * (size_t)nwant);
                CHECK_OK(r);
                CHECKF(r != QSA_OK || (ngot == nwant && !memcmp(got_p, want_p, sizeof(int) * (size_t)np) &&
                                       !memcmp(got_t, want_t, sizeof(int) * 3 * (size_t)nwant)),
                       "moe_plan MK %d E %d tr %d block %d: %d tiles (want %d) or pairs/tiles differ", MK, E, tr,
                       blocks[bi], ngot, nwant);
            }
        }
    done:
        k1_free(&mem);
    }
}

TEST(gpu, k1_moe) {
    K1_NEED_GPU();
    k1_moe_case(37, 5, 3, 320, 272, 0, 0); /* ~22 pairs per expert: 2 tiles each; 2 segments on both GEMMs */
    k1_moe_case(150, 4, 2, 528, 80, 1, 0); /* ~75 pairs per expert: 2 tiles of 64; 3 segments; columns past 64 */
    k1_moe_case(5, 3, 2, 64, 48, 1, 0);    /* sigmoid act; small shapes */
    k1_moe_case(1, 512, 10, 64, 32, 0, 0); /* decode-like routing: 10 single-pair tiles among 512 experts */
    k1_moe_case(7, 8, 3, 256, 384, 0, 0);  /* aligned 16-byte rows both ways, down's last segment half full */
    k1_moe_case(4, 16, 4, 704, 640, 1, 0); /* tiles of 1-4 pairs, 3 segments each way, K % 64 == 0: the ranges pipelined */
    k1_moe_case(6, 24, 4, 1344, 576, 0, 0); /* the same with 6 segments into gate_up: the 3-stage ring wraps */
    k1_moe_case(40, 6, 3, 832, 704, 1, 0);  /* tiles of 16 and ~4 pairs, 4 and 3 segments: both pipelined folds wrap */
    /* all experts NVFP4, H and I multiples of 64: also the lean whole forms, in passes of 8 pairs */
    k1_moe_case(40, 6, 3, 832, 704, 1, 1);  /* tiles of 16 (two full passes) and ~4 pairs */
    k1_moe_case(9, 4, 3, 320, 192, 0, 1);   /* ~7 pairs per expert (second rows of a pass part-live); a last
                                               segment of one sub-step; scales copied in 4-byte words */
    k1_moe_case(3, 2, 2, 1024, 256, 1, 1);  /* scales copied 16 bytes per row (K % 256 == 0) both ways */
    k1_moe_case(9, 4, 3, 384, 640, 0, 1);   /* 8 bytes per row (K % 128 == 0) both ways, the last segments
                                               half full (down's K the real shape's 640) */
    k1_moe_case(1, 512, 10, 128, 64, 0, 1); /* decode-like: single-pair tiles */
}

/* qsa_k_moe_combine with the shared expert: out = (sum over slots of w * y) + sigmoid(gl) * sh,
   the CPU's expressions in its order (routed sum from 0 in ascending slot, then the shared term). */
TEST(gpu, k1_moe_combine_shared) {
    K1_NEED_GPU();
    enum { M = 6, H = 200, K = 3 };
    k1_mem mem = {{0}, 0, {0}, 0};
    float *y, *tw, *sh, *gl, *got;
    double *want, *atol;
    int h = H, kk = K;
    CUdeviceptr dy, dtw, dout, dsh, dgl;
    K1_ALLOC(y, float, M * K * H);
    K1_ALLOC(tw, float, M * K);
    K1_ALLOC(sh, float, M * H);
    K1_ALLOC(gl, float, M);
    K1_ALLOC(got, float, M * H);
    K1_ALLOC(want, double, M * H);
    K1_ALLOC(atol, double, M * H);
    k1_seed(31);
    k1_fill(y, (size_t)M * K * H, -3, 3);
    k1_fill(tw, (size_t)M * K, 0, 1);
    k1_fill(sh, (size_t)M * H, -3, 3);
    k1_fill(gl, M, -5, 5);
    for (int t = 0; t < M; t++)
        for (int j = 0; j < H; j++) {
            float acc = 0.0f, g = qsa__sigmoid(gl[t]);
            for (int k = 0; k < K; k++) acc += y[((size_t)t * K + k) * H + j] * tw[t * K + k]; /* the CPU's loop */
            want[t * H + j] = acc + g * sh[t * H + j]; /* then out += sigmoid(gl) * y_shared */
            /* only the sigmoid's expf may differ (~2 ulp): 1e-6 of the magnitudes */
            atol[t * H + j] = 1e-6 * (fabs(acc) + fabs(g * sh[t * H + j]));
        }
    K1_TRY(k1_dev(&mem, &dy, y, sizeof(float) * M * K * H));
    K1_TRY(k1_dev(&mem, &dtw, tw, sizeof(float) * M * K));
    K1_TRY(k1_dev(&mem, &dout, NULL, sizeof(float) * M * H));
    K1_TRY(k1_dev(&mem, &dsh, sh, sizeof(float) * M * H));
    K1_TRY(k1_dev(&mem, &dgl, gl, sizeof(float) * M));
    K1_TRY(k1_poison(dout, sizeof(float) * M * H));
    {
        void *args[] = {&dy, &dtw, &dout, &h, &kk, &dsh, &dgl};
        K1_TRY(k1_launch("qsa_k_moe_combine", M, 1, 256, args));
    }
    K1_TRY(k1_get(got, dout, sizeof(float) * M * H));
    CHECK(k1_cmp("moe_combine + shared expert", got, want, (size_t)M * H, atol, 0, 0) == 0);
done:
    k1_free(&mem);
}

/* ---------------------------------------------------------------------------------------------- */
/* PLE                                                                                             */
/* ---------------------------------------------------------------------------------------------- */

/* grid (M, ys): ys blocks share a token's streams */
static qsa_result k1_run_ple_gate(const float *keyp, const float *X, const float *valp, const float *nk,
                                  const float *nq, const float *nc, float *gv, float *gvn, int M, int H, int hc,
                                  float eps, int ys) {
    k1_mem mem = {{0}, 0, {0}, 0};
    size_t n = (size_t)M * hc * H;
    CUdeviceptr dk, dX, dv, dnk, dnq, dnc, dgv, dgvn;
    qsa_result r = k1_dev(&mem, &dk, keyp, n * 4);
    if (r == QSA_OK) r = k1_dev(&mem, &dX, X, n * 4);
    if (r == QSA_OK) r = k1_dev(&mem, &dv, valp, (size_t)M * H * 4);
    if (r == QSA_OK) r = k1_dev(&mem, &dnk, nk, (size_t)hc * H * 4);
    if (r == QSA_OK) r = k1_dev(&mem, &dnq, nq, (size_t)hc * H * 4);
    if (r == QSA_OK) r = k1_dev(&mem, &dnc, nc, (size_t)hc * H * 4);
    if (r == QSA_OK) r = k1_dev(&mem, &dgv, NULL, n * 4);
    if (r == QSA_OK) r = k1_dev(&mem, &dgvn, NULL, n * 4);
    if (r == QSA_OK) {
        void *args[] = {&dk, &dX, &dv, &dnk, &dnq, &dnc, &dgv, &dgvn, &H, &hc, &eps};
        r = k1_launch("qsa_k_ple_gate", (unsigned)M, (unsigned)ys, 256, args);
    }
    if (r == QSA_OK) r = k1_get(gv, dgv, n * 4);
    if (r == QSA_OK) r = k1_get(gvn, dgvn, n * 4);
    k1_free(&mem);
    return r;
}

TEST(gpu, k1_ple_gate) {
    K1_NEED_GPU();
    enum { M = 37, H = 96, HC = 4, HCH = HC * H, POS = 21 };
    k1_mem mem = {{0}, 0, {0}, 0};
    float *keyp, *X, *valp, *nk, *nq, *nc, *gv, *gvn, *gv1, *gvn1, *key, *xn, *ref;
    double *want, *atol;
    float eps = 1e-6f;
    K1_ALLOC(keyp, float, M * HCH);
    K1_ALLOC(X, float, M * HCH);
    K1_ALLOC(valp, float, M * H);
    K1_ALLOC(nk, float, HCH);
    K1_ALLOC(nq, float, HCH);
    K1_ALLOC(nc, float, HCH);
    K1_ALLOC(gv, float, M * HCH);
    K1_ALLOC(gvn, float, M * HCH);
    K1_ALLOC(gv1, float, HCH);
    K1_ALLOC(gvn1, float, HCH);
    K1_ALLOC(key, float, HCH);
    K1_ALLOC(xn, float, HCH);
    K1_ALLOC(ref, float, M * HCH);
    K1_ALLOC(want, double, M * HCH);
    K1_ALLOC(atol, double, M * HCH);
    k1_seed(41);
    k1_fill(keyp, (size_t)M * HCH, -2, 2);
    k1_fill(X, (size_t)M * HCH, -2, 2);
    k1_fill(valp, (size_t)M * H, -2, 2);
    k1_fill(nk, HCH, -0.5, 0.5);
    k1_fill(nq, HCH, -0.5, 0.5);
    k1_fill(nc, HCH, -0.5, 0.5);
    K1_TRY(k1_run_ple_gate(keyp, X, valp, nk, nq, nc, gv, gvn, M, H, HC, eps, HC)); /* a block per stream (the runtime's) */
    for (int t = 0; t < M; t++) {
        /* the CPU backend's steps (qsa__ple_fwd) */
        qsa__rmsnorm_1p(keyp + (size_t)t * HCH, nk, key, HCH, H, eps);
        qsa__rmsnorm_1p(X + (size_t)t * HCH, nq, xn, HCH, H, eps);
        for (int s = 0; s < HC; s++) {
            float dot = 0.0f;
            double mag = 0;
            for (int j = 0; j < H; j++) {
                dot += key[s * H + j] * xn[s * H + j];
                mag += fabs((double)key[s * H + j] * xn[s * H + j]);
            }
            float gate = dot / sqrtf((float)H);
            float m = sqrtf(fmaxf(fabsf(gate), 1e-6f));
            gate = gate > 0 ? m : gate < 0 ? -m : 0.0f;
            float sg = qsa__sigmoid(gate);
            /* error budget: the dot product (sum order, and the two norms' sums) is within ~2e-6 of
               sum|key q| (1e-5 with margin), divided by sqrt(H); sqrt(|g|) turns an error d into
               d / (2 sqrt(max(|g|, 1e-6))); the sigmoid's slope is <= 1/4. */
            double dg = 1e-5 * mag / sqrt((double)H) / (2.0 * sqrt(fmax(fabs((double)dot / sqrt((double)H)), 1e-6)));
            for (int j = 0; j < H; j++) {
                want[(size_t)t * HCH + s * H + j] = sg * valp[t * H + j];
                atol[(size_t)t * HCH + s * H + j] = (0.25 * dg + 1e-6) * fabs(valp[t * H + j]) + 1e-30;
            }
        }
        /* gvn from the GPU's own gv: only the norm's sum order differs (H = 96: rtol 2e-5) */
        qsa__rmsnorm_1p(gv + (size_t)t * HCH, nc, ref + (size_t)t * HCH, HCH, H, eps);
    }
    CHECK(k1_cmp("ple_gate gv", gv, want, (size_t)M * HCH, atol, 0, 0) == 0);
    for (size_t i = 0; i < (size_t)M * HCH; i++) want[i] = ref[i];
    CHECK(k1_cmp("ple_gate gvn", gvn, want, (size_t)M * HCH, NULL, 1e-7, 2e-5) == 0);
    /* batch invariance, and the same bits with one block walking a token's streams */
    K1_TRY(k1_run_ple_gate(keyp + (size_t)POS * HCH, X + (size_t)POS * HCH, valp + (size_t)POS * H, nk, nq, nc, gv1,
                           gvn1, 1, H, HC, eps, 1));
    CHECK(!k1_same("ple_gate batch invariance (gv)", gv1, gv + (size_t)POS * HCH, HCH, 4));
    CHECK(!k1_same("ple_gate batch invariance (gvn)", gvn1, gvn + (size_t)POS * HCH, HCH, 4));
done:
    k1_free(&mem);
}

TEST(gpu, k1_ple_conv) {
    K1_NEED_GPU();
    enum { M = 37, HCH = 200, KC = 4, DIL = 3, L = (KC - 1) * DIL };
    k1_mem mem = {{0}, 0, {0}, 0};
    float *X0, *X, *X2, *gv, *gvn, *st0, *st, *st2, *w, *hist, *wst;
    double *want, *atol;
    int m = M, hch = HCH, kc = KC, dil = DIL, m1 = 1, m36 = M - 1;
    CUdeviceptr dX, dgv, dgvn, dst, dw, dgv1, dgvn1, dX1;
    K1_ALLOC(X0, float, M * HCH);
    K1_ALLOC(X, float, M * HCH);
    K1_ALLOC(X2, float, M * HCH);
    K1_ALLOC(gv, float, M * HCH);
    K1_ALLOC(gvn, float, M * HCH);
    K1_ALLOC(st0, float, L * HCH);
    K1_ALLOC(st, float, L * HCH);
    K1_ALLOC(st2, float, L * HCH);
    K1_ALLOC(wst, float, L * HCH);
    K1_ALLOC(w, float, HCH * KC);
    K1_ALLOC(hist, float, (L + M) * HCH);
    K1_ALLOC(want, double, M * HCH);
    K1_ALLOC(atol, double, M * HCH);
    k1_seed(51);
    k1_fill(X0, (size_t)M * HCH, -2, 2);
    k1_fill(gv, (size_t)M * HCH, -2, 2);
    k1_fill(gvn, (size_t)M * HCH, -2, 2);
    k1_fill(st0, (size_t)L * HCH, -2, 2);
    k1_fill(w, (size_t)HCH * KC, -1, 1);
    /* reference: the CPU backend's loop (qsa__ple_fwd) over history = state rows then gvn rows */
    memcpy(hist, st0, sizeof(float) * L * HCH);
    memcpy(hist + (size_t)L * HCH, gvn, sizeof(float) * M * HCH);
    for (int t = 0; t < M; t++)
        for (int c = 0; c < HCH; c++) {
            float acc = 0.0f;
            for (int k = 0; k < KC; k++) acc += w[c * KC + k] * hist[(size_t)(t + k * DIL) * HCH + c];
            float sl = qsa__silu(acc);
            want[(size_t)t * HCH + c] = X0[(size_t)t * HCH + c] + (gv[(size_t)t * HCH + c] + sl);
            /* the same operations; only silu's expf may differ (~2 ulp): 1e-6 of the magnitudes */
            atol[(size_t)t * HCH + c] = 1e-6 * (fabs(X0[(size_t)t * HCH + c]) + fabs(gv[(size_t)t * HCH + c]) + fabs(sl)) + 1e-30;
        }
    memcpy(wst, hist + (size_t)M * HCH, sizeof(float) * L * HCH);
    K1_TRY(k1_dev(&mem, &dX, X0, sizeof(float) * M * HCH));
    K1_TRY(k1_dev(&mem, &dgv, gv, sizeof(float) * M * HCH));
    K1_TRY(k1_dev(&mem, &dgvn, gvn, sizeof(float) * M * HCH));
    K1_TRY(k1_dev(&mem, &dst, st0, sizeof(float) * L * HCH));
    K1_TRY(k1_dev(&mem, &dw, w, sizeof(float) * HCH * KC));
    {
        void *args[] = {&dX, &dgv, &dgvn, &dst, &dw, &m, &hch, &kc, &dil};
        K1_TRY(k1_launch("qsa_k_ple_conv", (HCH + 255) / 256, 1, 256, args));
    }
    K1_TRY(k1_get(X, dX, sizeof(float) * M * HCH));
    K1_TRY(k1_get(st, dst, sizeof(float) * L * HCH));
    CHECK(k1_cmp("ple_conv X", X, want, (size_t)M * HCH, atol, 0, 0) == 0);
    CHECK(!k1_same("ple_conv new state (a copy of the last rows)", st, wst, (size_t)L * HCH, 4));
    /* chunking: 1 token then 36 (the first chunk is shorter than the state: in-place shift) gives
       the same X and state bits as one pass */
    K1_TRY(k1_put(dX, X0, sizeof(float) * M * HCH));
    K1_TRY(k1_put(dst, st0, sizeof(float) * L * HCH));
    {
        void *args[] = {&dX, &dgv, &dgvn, &dst, &dw, &m1, &hch, &kc, &dil};
        K1_TRY(k1_launch("qsa_k_ple_conv", (HCH + 255) / 256, 1, 256, args));
    }
    dX1 = dX + sizeof(float) * HCH;
    dgv1 = dgv + sizeof(float) * HCH;
    dgvn1 = dgvn + sizeof(float) * HCH;
    {
        void *args[] = {&dX1, &dgv1, &dgvn1, &dst, &dw, &m36, &hch, &kc, &dil};
        K1_TRY(k1_launch("qsa_k_ple_conv", (HCH + 255) / 256, 1, 256, args));
    }
    K1_TRY(k1_get(X2, dX, sizeof(float) * M * HCH));
    K1_TRY(k1_get(st2, dst, sizeof(float) * L * HCH));
    CHECK(!k1_same("ple_conv chunked X", X2, X, (size_t)M * HCH, 4));
    CHECK(!k1_same("ple_conv chunked state", st2, st, (size_t)L * HCH, 4));
done:
    k1_free(&mem);
}

#endif /* QSA_NO_CUDA */
