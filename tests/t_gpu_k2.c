/* tests/t_gpu_k2.c - the Gated DeltaNet and QSA kernels against the CPU reference in qsa_runtime.h,
 * and the determinism contract (SPEC section 4) on the GPU.  Group gpu: skips without libcuda, a
 * device or an NVRTC.
 *
 * The kernels are compiled from the embedded kernels.cu.
 *
 * Tolerances: |gpu - cpu| <= atol + rtol * |cpu|, stated next to each comparison with the reason.
 * Determinism checks are bitwise: chunking (GDN), batch composition, page placement and page size,
 * block size (attention), and exact equality of the top-k selection with qsa__select_blocks.
 */
#ifndef QSA_NO_CUDA

/* ---------------------------------------------------------------------------------------------- */
/* device, module, buffers                                                                         */
/* ---------------------------------------------------------------------------------------------- */

typedef struct k2t_gpu {
    int tried;
    qsa_result status;
    char why[1024];
    CUcontext ctx;
    CUmodule mod;
    qsa__gpu_info info;
    char arch[32];
} k2t_gpu;
static k2t_gpu K2G_;

static qsa_result k2t_init_(void) {
    CUdevice dev;
    char *src = NULL, *all = NULL, *image = NULL, *log = NULL;
    size_t len = 0;
    QSA__TRY(qsa__cuda_load());
    QSA__TRY(qsa__nvrtc_load());
    QSA__TRY(qsa__cu_device_info(0, &K2G_.info));
    QSA__CU(qsa__cu.cuDeviceGet(&dev, 0));
    QSA__CU(qsa__cu.cuDevicePrimaryCtxRetain(&K2G_.ctx, dev));
    QSA__CU(qsa__cu.cuCtxSetCurrent(K2G_.ctx));
    src = qsa__kernels_source();
    if (!src) return qsa__fail(QSA_ERR_OUT_OF_MEMORY, "kernel source: out of memory");
    all = src;
    qsa_result r = qsa__nvrtc_pick_arch(NULL, K2G_.info.cc_major * 10 + K2G_.info.cc_minor, K2G_.arch, sizeof K2G_.arch);
    if (r == QSA_OK) r = qsa__nvrtc_compile(all, "kernels.cu", NULL, 0, K2G_.arch, &image, &len, &log);
    if (r == QSA_OK) r = QSA__CU_R(qsa__cu.cuModuleLoadData(&K2G_.mod, image));
    if (r == QSA_OK)
        printf("    GPU 0: %s (sm_%d%d); GDN/QSA kernels built for %s by NVRTC %d.%d\n", K2G_.info.name,
               K2G_.info.cc_major, K2G_.info.cc_minor, K2G_.arch, qsa__nvrtc.major, qsa__nvrtc.minor);
    qsa_free(all);
    qsa_free(image);
    qsa_free(log);
    return r;
}

/* 1: ready; 0: no GPU stack (skip); -1: a GPU is there but the set-up failed. */
static int k2t_state(void) {
    if (!K2G_.tried) {
        K2G_.tried = 1;
        K2G_.status = k2t_init_();
        snprintf(K2G_.why, sizeof K2G_.why, "%s", K2G_.status == QSA_OK ? "" : qsa_last_error());
    }
    return K2G_.status == QSA_OK ? 1 : K2G_.status == QSA_ERR_NO_DEVICE ? 0 : -1;
}
#define K2_NEED_GPU() do { int s_ = k2t_state(); \
    if (s_ == 0) SKIP("no GPU: %s", K2G_.why); \
    if (s_ < 0) { T_.failed++; printf("    GPU set-up failed: %s\n", K2G_.why); return; } } while (0)

/* Device buffers of one test, freed together.  A buffer without host data is poisoned with 0xFF
   bytes (NaN in fp16 and fp32) so that an element a kernel forgot to write cannot pass. */
typedef struct k2t_mem { CUdeviceptr p[48]; int n; } k2t_mem;
static qsa_result k2t_dev(k2t_mem *a, CUdeviceptr *d, const void *host, size_t bytes) {
    *d = 0;
    if (a->n >= 48) return qsa__fail(QSA_ERR_INTERNAL, "test arena full");
    QSA__CU(qsa__cu.cuMemAlloc_v2(d, bytes ? bytes : 4));
    a->p[a->n++] = *d;
    if (host) QSA__CU(qsa__cu.cuMemcpyHtoD_v2(*d, host, bytes));
    else QSA__CU(qsa__cu.cuMemsetD8_v2(*d, 0xFF, bytes ? bytes : 4));
    return QSA_OK;
}
static void k2t_free(k2t_mem *a) {
    for (int i = 0; i < a->n; i++) qsa__cu.cuMemFree_v2(a->p[i]);
    a->n = 0;
}
static qsa_result k2t_get(void *host, CUdeviceptr d, size_t bytes) {
    QSA__CU(qsa__cu.cuMemcpyDtoH_v2(host, d, bytes));
    return QSA_OK;
}
static qsa_result k2t_put(CUdeviceptr d, const void *host, size_t bytes) {
    QSA__CU(qsa__cu.cuMemcpyHtoD_v2(d, host, bytes));
    return QSA_OK;
}
static qsa_result k2t_poison(CUdeviceptr d, size_t bytes) {
    QSA__CU(qsa__cu.cuMemsetD8_v2(d, 0xFF, bytes));
    return QSA_OK;
}
static qsa_result k2t_launch3(const char *name, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned shmem,
                              void **args) {
    CUfunction fn;
    QSA__CU(qsa__cu.cuModuleGetFunction(&fn, K2G_.mod, name));
    if (shmem > 48 * 1024) QSA__CU(qsa__cu.cuFuncSetAttribute(fn, QSA__CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, (int)shmem));
    QSA__TRY(qsa__cu_launch(fn, name, gx, gy, gz, bx, 1, 1, shmem, NULL, args));
    QSA__CU(qsa__cu.cuCtxSynchronize());
    return QSA_OK;
}
static qsa_result k2t_launch(const char *name, unsigned gx, unsigned gy, unsigned bx, unsigned shmem, void **args) {
    return k2t_launch3(name, gx, gy, 1, bx, shmem, args);
}

/* Deterministic inputs: xorshift64*, uniform in [lo, hi). */
static uint64_t k2t_rng = 0x2545F4914F6CDD1Dull;
static void k2t_seed(uint64_t s) { k2t_rng = s * 0x9E3779B97F4A7C15ull + 0x632BE59BD9B4E019ull; }
static double k2t_uniform(double lo, double hi) {
    k2t_rng ^= k2t_rng >> 12;
    k2t_rng ^= k2t_rng << 25;
    k2t_rng ^= k2t_rng >> 27;
    uint64_t x = k2t_rng * 2685821657736338717ull;
    return lo + (hi - lo) * (double)(x >> 11) * (1.0 / 9007199254740992.0);
}
static void k2t_fill(float *x, size_t n, double lo, double hi) {
    for (size_t i = 0; i < n; i++) x[i] = (float)k2t_uniform(lo, hi);
}
static float k2t_f16_round(float x) { return qsa__f16_to_f32(qsa__f32_to_f16(x)); }

/* Counts elements outside |got - want| <= atol + rtol*|want| (NaN counts); prints the first few. */
static int k2t_compare(const char *what, const float *got, const float *want, size_t n, double atol, double rtol) {
    int bad = 0;
    double worst = 0, maxd = 0;
    for (size_t i = 0; i < n; i++) {
        double err = fabs((double)got[i] - (double)want[i]), tol = atol + rtol * fabs((double)want[i]);
        if (!(err <= tol)) {
            if (bad < 5) printf("    %s[%zu]: gpu %.9g, cpu %.9g, |diff| %.3g > tol %.3g\n", what, i, got[i], want[i], err, tol);
            bad++;
        }
        if (err / tol > worst) worst = err / tol;
        if (err > maxd) maxd = err;
    }
    if (T_.verbose) printf("    %s: %zu values, max |diff| %.3g, worst |diff|/tol %.3f\n", what, n, maxd, worst);
    return bad;
}
static int k2t_same_bits(const void *a, const void *b, size_t bytes) { return memcmp(a, b, bytes) == 0; }

/* ---------------------------------------------------------------------------------------------- */
/* Gated DeltaNet                                                                                  */
/* ---------------------------------------------------------------------------------------------- */

enum { K2T_NK = 2, K2T_NV = 4, K2T_DK = 128, K2T_DV = 128, K2T_KC = 4, K2T_M = 37 };

/* CPU: the conv/act/split/L2 part of qsa__gdn_fwd on [state; qkv]; updates state. */
static void k2t_cpu_conv(const float *qkv, float *state, const float *w, float *q, float *k, float *v, int M, int nk,
                         int dk, int conv_dim, int Kc, qsa_act act) {
    int key_dim = nk * dk, value_dim = conv_dim - 2 * key_dim;
    float *x = QSA__ALLOC(float, (size_t)(Kc - 1 + M) * conv_dim);
    memcpy(x, state, sizeof(float) * (size_t)(Kc - 1) * conv_dim);
    memcpy(x + (size_t)(Kc - 1) * conv_dim, qkv, sizeof(float) * (size_t)M * conv_dim);
    for (int t = 0; t < M; t++) {
        for (int ch = 0; ch < conv_dim; ch++) {
            float acc = 0.0f;
            for (int j = 0; j < Kc; j++) acc += w[ch * Kc + j] * x[(size_t)(t + j) * conv_dim + ch];
            float y = qsa__act(act, acc);
            if (ch < key_dim) q[(size_t)t * key_dim + ch] = y;
            else if (ch < 2 * key_dim) k[(size_t)t * key_dim + ch - key_dim] = y;
            else v[(size_t)t * value_dim + ch - 2 * key_dim] = y;
        }
        for (int h = 0; h < nk; h++) {
            float *qh = q + (size_t)t * key_dim + h * dk, *kh = k + (size_t)t * key_dim + h * dk;
            qsa__l2norm(qh, dk);
            qsa__l2norm(kh, dk);
            float sc = 1.0f / sqrtf((float)dk);
            for (int i = 0; i < dk; i++) qh[i] *= sc;
        }
    }
    memcpy(state, x + (size_t)M * conv_dim, sizeof(float) * (size_t)(Kc - 1) * conv_dim);
    qsa_free(x);
}

TEST(gpu, k2_gdn_conv_gates_norm) {
    K2_NEED_GPU();
    int nk = K2T_NK, nv = K2T_NV, dk = K2T_DK, dv = K2T_DV, Kc = K2T_KC, M = K2T_M;
    int key_dim = nk * dk, value_dim = nv * dv, conv_dim = 2 * key_dim + value_dim;
    size_t nqkv = (size_t)M * conv_dim, nst = (size_t)(Kc - 1) * conv_dim;
    float *qkv = QSA__ALLOC(float, nqkv), *st = QSA__ALLOC(float, nst), *st0 = QSA__ALLOC(float, nst),
          *w = QSA__ALLOC(float, (size_t)conv_dim * Kc);
    float *q = QSA__ALLOC(float, (size_t)M * key_dim), *k = QSA__ALLOC(float, (size_t)M * key_dim),
          *v = QSA__ALLOC(float, (size_t)M * value_dim);
    float *gq = QSA__ALLOC(float, (size_t)M * key_dim), *gk = QSA__ALLOC(float, (size_t)M * key_dim),
          *gv = QSA__ALLOC(float, (size_t)M * value_dim), *gst = QSA__ALLOC(float, nst);
    float *gq2 = QSA__ALLOC(float, (size_t)M * key_dim), *gk2 = QSA__ALLOC(float, (size_t)M * key_dim),
          *gv2 = QSA__ALLOC(float, (size_t)M * value_dim), *gst2 = QSA__ALLOC(float, nst);
    k2t_seed(11);
    k2t_fill(qkv, nqkv, -2, 2);
    k2t_fill(st0, nst, -2, 2);
    k2t_fill(w, (size_t)conv_dim * Kc, -0.7, 0.7);
    for (int act = 0; act < 2; act++) {
        memcpy(st, st0, sizeof(float) * nst);
        k2t_cpu_conv(qkv, st, w, q, k, v, M, nk, dk, conv_dim, Kc, act ? QSA_ACT_SIGMOID : QSA_ACT_SILU);
        k2t_mem a = {{0}, 0};
        CUdeviceptr dqkv, dst, dw, dq, dk_, dv_;
        qsa_result r = k2t_dev(&a, &dqkv, qkv, nqkv * 4);
        if (r == QSA_OK) r = k2t_dev(&a, &dst, st0, nst * 4);
        if (r == QSA_OK) r = k2t_dev(&a, &dw, w, (size_t)conv_dim * Kc * 4);
        if (r == QSA_OK) r = k2t_dev(&a, &dq, NULL, (size_t)M * key_dim * 4);
        if (r == QSA_OK) r = k2t_dev(&a, &dk_, NULL, (size_t)M * key_dim * 4);
        if (r == QSA_OK) r = k2t_dev(&a, &dv_, NULL, (size_t)M * value_dim * 4);
        /* one launch of M tokens, then the state update */
        qsa__gdn_gate_args nog;
        memset(&nog, 0, sizeof nog);
        int upd0 = 0, upd1 = 1;
        if (r == QSA_OK) {
            void *args[] = {&dqkv, &dst, &dw, &dq, &dk_, &dv_, &M, &conv_dim, &key_dim, &Kc, &act, &nk, &dk, &nog, &upd0};
            r = k2t_launch("qsa_k_gdn_conv", (unsigned)M, 1, 256, 0, args);
        }
        if (r == QSA_OK) {
            void *args[] = {&dqkv, &dst, &M, &conv_dim, &Kc};
            r = k2t_launch("qsa_k_gdn_conv_state", (unsigned)(conv_dim + 255) / 256, 1, 256, 0, args);
        }
        if (r == QSA_OK) r = k2t_get(gq, dq, (size_t)M * key_dim * 4);
        if (r == QSA_OK) r = k2t_get(gk, dk_, (size_t)M * key_dim * 4);
        if (r == QSA_OK) r = k2t_get(gv, dv_, (size_t)M * value_dim * 4);
        if (r == QSA_OK) r = k2t_get(gst, dst, nst * 4);
        /* the same tokens fed in chunks of 1, 2, 5, 29 (state carried; the chunk of one advances it in
           the conv launch itself): bitwise equal */
        if (r == QSA_OK) r = k2t_put(dst, st0, nst * 4);
        if (r == QSA_OK) r = k2t_poison(dq, (size_t)M * key_dim * 4);
        if (r == QSA_OK) r = k2t_poison(dk_, (size_t)M * key_dim * 4);
        if (r == QSA_OK) r = k2t_poison(dv_, (size_t)M * value_dim * 4);
        static const int chunks[] = {1, 2, 5, 29};
        for (int c = 0, t0 = 0; c < 4 && r == QSA_OK; t0 += chunks[c], c++) {
            int mc = chunks[c];
            CUdeviceptr x = dqkv + (size_t)t0 * conv_dim * 4, qo = dq + (size_t)t0 * key_dim * 4,
                        ko = dk_ + (size_t)t0 * key_dim * 4, vo = dv_ + (size_t)t0 * value_dim * 4;
            void *args[] = {&x, &dst, &dw, &qo, &ko, &vo, &mc, &conv_dim, &key_dim, &Kc, &act, &nk, &dk, &nog, mc == 1 ? &upd1 : &upd0};
            r = k2t_launch("qsa_k_gdn_conv", (unsigned)mc, 1, 256, 0, args);
            void *args2[] = {&x, &dst, &mc, &conv_dim, &Kc};
            if (r == QSA_OK && mc > 1) r = k2t_launch("qsa_k_gdn_conv_state", (unsigned)(conv_dim + 255) / 256, 1, 256, 0, args2);
        }
        if (r == QSA_OK) r = k2t_get(gq2, dq, (size_t)M * key_dim * 4);
        if (r == QSA_OK) r = k2t_get(gk2, dk_, (size_t)M * key_dim * 4);
        if (r == QSA_OK) r = k2t_get(gv2, dv_, (size_t)M * value_dim * 4);
        if (r == QSA_OK) r = k2t_get(gst2, dst, nst * 4);
        k2t_free(&a);
        CHECK_OK(r);
        if (r != QSA_OK) break;
        /* conv: 4 products (fma vs mul+add: <= 4 ulp of sum|w x|); act and the L2 norm add a few
           ulp; q, k are unit-scale: atol 2e-6, rtol 1e-5 */
        CHECK(k2t_compare("gdn_conv q", gq, q, (size_t)M * key_dim, 2e-6, 1e-5) == 0);
        CHECK(k2t_compare("gdn_conv k", gk, k, (size_t)M * key_dim, 2e-6, 1e-5) == 0);
        CHECK(k2t_compare("gdn_conv v", gv, v, (size_t)M * value_dim, 2e-6, 1e-5) == 0);
        CHECKF(k2t_same_bits(gst, st, nst * 4), "conv state: must be the exact last Kc-1 inputs");
        CHECKF(k2t_same_bits(gq, gq2, (size_t)M * key_dim * 4) && k2t_same_bits(gk, gk2, (size_t)M * key_dim * 4) &&
                   k2t_same_bits(gv, gv2, (size_t)M * value_dim * 4) && k2t_same_bits(gst, gst2, nst * 4),
               "act %d: chunked conv differs from one launch (must be bitwise identical)", act);
    }
    /* gates and the gated norm */
    {
        int n = M * nv;
        float eps = 1e-6f;
        float *b = QSA__ALLOC(float, n), *aa = QSA__ALLOC(float, n), *Al = QSA__ALLOC(float, nv), *dtb = QSA__ALLOC(float, nv);
        float *beta = QSA__ALLOC(float, n), *g = QSA__ALLOC(float, n), *gb = QSA__ALLOC(float, n), *gg = QSA__ALLOC(float, n);
        float *o = QSA__ALLOC(float, (size_t)M * value_dim), *z = QSA__ALLOC(float, (size_t)M * value_dim),
              *nw = QSA__ALLOC(float, dv), *oref = QSA__ALLOC(float, (size_t)M * value_dim),
              *og = QSA__ALLOC(float, (size_t)M * value_dim);
        uint16_t *o16 = QSA__ALLOC(uint16_t, (size_t)M * value_dim);
        k2t_fill(b, n, -6, 6);
        k2t_fill(aa, n, -8, 8);
        aa[3] = 30.0f; /* softplus past its threshold 20 */
        k2t_fill(Al, nv, -2, 1);
        k2t_fill(dtb, nv, -1, 1);
        k2t_fill(o, (size_t)M * value_dim, -3, 3);
        k2t_fill(z, (size_t)M * value_dim, -4, 4);
        k2t_fill(nw, dv, 0.5, 1.5);
        for (int i = 0; i < n; i++) {
            beta[i] = qsa__sigmoid(b[i]);
            g[i] = -expf(Al[i % nv]) * qsa__softplus(aa[i] + dtb[i % nv]);
        }
        for (int gact = 0; gact < 2; gact++) {
            for (int rr = 0; rr < M * nv; rr++) {
                const float *orow = o + (size_t)rr * dv, *zrow = z + (size_t)rr * dv;
                float ss = 0.0f;
                for (int j = 0; j < dv; j++) ss += orow[j] * orow[j];
                float inv = 1.0f / sqrtf(ss / (float)dv + eps);
                for (int j = 0; j < dv; j++)
                    oref[(size_t)rr * dv + j] = nw[j] * (orow[j] * inv) * qsa__act(gact ? QSA_ACT_SIGMOID : QSA_ACT_SILU, zrow[j]);
            }
            k2t_mem a = {{0}, 0};
            CUdeviceptr db, da, dAl, ddt, dbeta, dg, dO, dz, dnw, do16;
            qsa_result r = k2t_dev(&a, &db, b, n * 4);
            if (r == QSA_OK) r = k2t_dev(&a, &da, aa, n * 4);
            if (r == QSA_OK) r = k2t_dev(&a, &dAl, Al, nv * 4);
            if (r == QSA_OK) r = k2t_dev(&a, &ddt, dtb, nv * 4);
            if (r == QSA_OK) r = k2t_dev(&a, &dbeta, NULL, n * 4);
            if (r == QSA_OK) r = k2t_dev(&a, &dg, NULL, n * 4);
            if (r == QSA_OK) r = k2t_dev(&a, &dO, o, (size_t)M * value_dim * 4);
            if (r == QSA_OK) r = k2t_dev(&a, &dz, z, (size_t)M * value_dim * 4);
            if (r == QSA_OK) r = k2t_dev(&a, &dnw, nw, dv * 4);
            if (r == QSA_OK) r = k2t_dev(&a, &do16, NULL, (size_t)M * value_dim * 2);
            /* the gates come out of the conv launch (block y = 0 of each token; its conv inputs are poison and unchecked) */
            CUdeviceptr cqkv, cst, cw, cq, ck, cv;
            if (r == QSA_OK) r = k2t_dev(&a, &cqkv, NULL, nqkv * 4);
            if (r == QSA_OK) r = k2t_dev(&a, &cst, NULL, nst * 4);
            if (r == QSA_OK) r = k2t_dev(&a, &cw, NULL, (size_t)conv_dim * Kc * 4);
            if (r == QSA_OK) r = k2t_dev(&a, &cq, NULL, (size_t)M * key_dim * 4);
            if (r == QSA_OK) r = k2t_dev(&a, &ck, NULL, (size_t)M * key_dim * 4);
            if (r == QSA_OK) r = k2t_dev(&a, &cv, NULL, (size_t)M * value_dim * 4);
            if (r == QSA_OK) {
                qsa__gdn_gate_args ga = {db, da, dAl, ddt, dbeta, dg, nv};
                int upd = 0, cact = 0;
                void *args[] = {&cqkv, &cst, &cw, &cq, &ck, &cv, &M, &conv_dim, &key_dim, &Kc, &cact, &nk, &dk, &ga, &upd};
                r = k2t_launch("qsa_k_gdn_conv", (unsigned)M, 2, 256, 0, args);
            }
            if (r == QSA_OK) {
                qsa__gdn_shift nosh = {0, 0, 0, 0, 0};
                void *args[] = {&dO, &dz, &dnw, &do16, &nv, &dv, &eps, &gact, &nosh};
                r = k2t_launch("qsa_k_gdn_norm_gate", (unsigned)(M * nv), 1, 128, 0, args);
            }
            if (r == QSA_OK) r = k2t_get(gb, dbeta, n * 4);
            if (r == QSA_OK) r = k2t_get(gg, dg, n * 4);
            if (r == QSA_OK) r = k2t_get(og, dO, (size_t)M * value_dim * 4);
            if (r == QSA_OK) r = k2t_get(o16, do16, (size_t)M * value_dim * 2);
            k2t_free(&a);
            CHECK_OK(r);
            if (r != QSA_OK) break;
            /* expf/log1pf of CUDA vs glibc: <= 2 ulp each, a few roundings: rtol 4e-6 */
            CHECK(k2t_compare("gdn beta", gb, beta, n, 1e-7, 4e-6) == 0);
            CHECK(k2t_compare("gdn g", gg, g, n, 1e-7, 4e-6) == 0);
            /* a 128-term sum of squares (tree vs sequential), sqrt, act: rtol 1e-5 */
            CHECK(k2t_compare("gdn norm_gate", og, oref, (size_t)M * value_dim, 1e-6, 1e-5) == 0);
            int mism = 0;
            for (size_t i = 0; i < (size_t)M * value_dim; i++) mism += o16[i] != qsa__f32_to_f16(og[i]);
            CHECKF(mism == 0, "%d fp16 outputs are not the rounded fp32 outputs", mism);
        }
        qsa_free(b); qsa_free(aa); qsa_free(Al); qsa_free(dtb); qsa_free(beta); qsa_free(g); qsa_free(gb); qsa_free(gg);
        qsa_free(o); qsa_free(z); qsa_free(nw); qsa_free(oref); qsa_free(og); qsa_free(o16);
    }
    qsa_free(qkv); qsa_free(st); qsa_free(st0); qsa_free(w); qsa_free(q); qsa_free(k); qsa_free(v);
    qsa_free(gq); qsa_free(gk); qsa_free(gv); qsa_free(gst); qsa_free(gq2); qsa_free(gk2); qsa_free(gv2); qsa_free(gst2);
}

/* Runs the recurrence on the device: tokens [0, M) in launches of `chunk` tokens (0: one launch),
   grid (nv, Y) block B, given dynamic shared memory when `smem` (the kernel must not depend on it).
   S is in/out (fp32, or fp16 bits when f16). */
static qsa_result k2t_gdn_run(int f16, void *S, const float *q, const float *k, const float *v, const float *beta,
                              const float *g, float *o, int M, int nk, int nv, int dk, int dv, int chunk, int Y, int B,
                              int smem) {
    k2t_mem a = {{0}, 0};
    size_t ns = (size_t)nv * dk * dv * (f16 ? 2 : 4);
    CUdeviceptr dS, dq, dk_, dv_, db, dg, dO;
    qsa_result r = k2t_dev(&a, &dS, S, ns);
    if (r == QSA_OK) r = k2t_dev(&a, &dq, q, (size_t)M * nk * dk * 4);
    if (r == QSA_OK) r = k2t_dev(&a, &dk_, k, (size_t)M * nk * dk * 4);
    if (r == QSA_OK) r = k2t_dev(&a, &dv_, v, (size_t)M * nv * dv * 4);
    if (r == QSA_OK) r = k2t_dev(&a, &db, beta, (size_t)M * nv * 4);
    if (r == QSA_OK) r = k2t_dev(&a, &dg, g, (size_t)M * nv * 4);
    if (r == QSA_OK) r = k2t_dev(&a, &dO, NULL, (size_t)M * nv * dv * 4);
    int ncols = (dv + Y * B - 1) / (Y * B);
    unsigned shmem = smem && 4 * dk * B * ncols <= 32768 ? (unsigned)(4 * dk * B * ncols) : 0; /* within 48 KB */
    if (chunk <= 0) chunk = M;
    for (int t0 = 0; t0 < M && r == QSA_OK; t0 += chunk) {
        int mc = M - t0 < chunk ? M - t0 : chunk;
        CUdeviceptr qo = dq + (size_t)t0 * nk * dk * 4, ko = dk_ + (size_t)t0 * nk * dk * 4,
                    vo = dv_ + (size_t)t0 * nv * dv * 4, bo = db + (size_t)t0 * nv * 4, go = dg + (size_t)t0 * nv * 4,
                    oo = dO + (size_t)t0 * nv * dv * 4;
        void *args[] = {&dS, &qo, &ko, &vo, &bo, &go, &oo, &mc, &nk, &nv, &dk, &dv};
        r = k2t_launch(f16 ? "qsa_k_gdn_recurrent_f16state" : "qsa_k_gdn_recurrent", (unsigned)nv, (unsigned)Y,
                       (unsigned)B, shmem, args);
    }
    if (r == QSA_OK) r = k2t_get(o, dO, (size_t)M * nv * dv * 4);
    if (r == QSA_OK) r = k2t_get(S, dS, ns);
    k2t_free(&a);
    return r;
}

/* dk = 128 (4 lanes per column, every lane all its rows: the model's head size), 48 (rows past dk),
   256 (8 lanes), 512 (16 lanes; blocks of 32 threads cannot stage its tokens: those shapes skipped) */
static void k2_gdn_case(int dk) {
    int nk = K2T_NK, nv = K2T_NV, dv = K2T_DV, M = K2T_M;
    size_t nS = (size_t)nv * dk * dv, nq = (size_t)M * nk * dk, nvv = (size_t)M * nv * dv;
    float *S0 = QSA__ALLOC(float, nS), *Sc = QSA__ALLOC(float, nS), *Sg = QSA__ALLOC(float, nS), *Sg2 = QSA__ALLOC(float, nS);
    float *q = QSA__ALLOC(float, nq), *k = QSA__ALLOC(float, nq), *v = QSA__ALLOC(float, nvv);
    float *beta = QSA__ALLOC(float, (size_t)M * nv), *g = QSA__ALLOC(float, (size_t)M * nv);
    float *oc = QSA__ALLOC(float, nvv), *og = QSA__ALLOC(float, nvv), *og2 = QSA__ALLOC(float, nvv);
    uint16_t *S16 = QSA__ALLOC(uint16_t, nS), *S16b = QSA__ALLOC(uint16_t, nS), *S16c = QSA__ALLOC(uint16_t, nS);
    float *S16f = QSA__ALLOC(float, nS);
    k2t_seed(23);
    for (size_t i = 0; i < nS; i++) S0[i] = k2t_f16_round((float)k2t_uniform(-0.5, 0.5)); /* exact in fp16 too */
    k2t_fill(q, nq, -1, 1);
    k2t_fill(k, nq, -1, 1);
    k2t_fill(v, nvv, -1, 1);
    for (int t = 0; t < M; t++)
        for (int h = 0; h < nk; h++) {
            qsa__l2norm(q + ((size_t)t * nk + h) * dk, dk);
            qsa__l2norm(k + ((size_t)t * nk + h) * dk, dk);
            for (int i = 0; i < dk; i++) q[((size_t)t * nk + h) * dk + i] *= 1.0f / sqrtf((float)dk);
        }
    for (int i = 0; i < M * nv; i++) {
        beta[i] = qsa__sigmoid((float)k2t_uniform(-4, 4));
        g[i] = -expf((float)k2t_uniform(-3, 0.5)) * qsa__softplus((float)k2t_uniform(-4, 2));
    }
    qsa_model_config c;
    memset(&c, 0, sizeof c);
    c.linear_num_key_heads = nk;
    c.linear_num_value_heads = nv;
    c.linear_key_head_dim = dk;
    c.linear_value_head_dim = dv;
    /* fp32 state: CPU reference */
    memcpy(Sc, S0, sizeof(float) * nS);
    CHECK_OK(qsa__gdn_recurrent(&c, Sc, q, k, v, beta, g, oc, M));
    /* the runtime's launch: blocks of 128 threads, 4 lanes per column (dk <= 128) */
    memcpy(Sg, S0, sizeof(float) * nS);
    qsa_result r = k2t_gdn_run(0, Sg, q, k, v, beta, g, og, M, nk, nv, dk, dv, 0, (dv + 31) / 32, 128, 0);
    CHECK_OK(r);
    if (r == QSA_OK) {
        /* per token and column: 2*dk fmas in 4 partial chains against the CPU's one mul+add chain
           (<= 1 ulp each of the running sums), expf within 2 ulp; 37 tokens of state carry these
           forward with |decay| < 1:
           measured max |diff| ~1e-6 on O(1) values; atol 2e-5, rtol 1e-4 */
        CHECK(k2t_compare("gdn_recurrent o", og, oc, nvv, 2e-5, 1e-4) == 0);
        CHECK(k2t_compare("gdn_recurrent S", Sg, Sc, nS, 2e-5, 1e-4) == 0);
    }
    /* chunk invariance: one token per launch, and chunks of 5; other launch shapes (32-thread
       blocks, one block of 256 threads per head, 64-thread blocks, several column passes per
       thread; with and without dynamic shared memory, which the kernel does not use) */
    static const int shapes[5][4] = {{1, 4, 32, 1}, {5, 4, 32, 1}, {0, 1, 256, 0}, {7, 2, 64, 1}, {3, 1, 32, 1}}; /* chunk, Y, B, smem */
    for (int s = 0; s < 5 && r == QSA_OK; s++) {
        if (dk > 256 && shapes[s][2] < 64) continue;
        memcpy(Sg2, S0, sizeof(float) * nS);
        r = k2t_gdn_run(0, Sg2, q, k, v, beta, g, og2, M, nk, nv, dk, dv, shapes[s][0], shapes[s][1], shapes[s][2], shapes[s][3]);
        CHECK_OK(r);
        CHECKF(r != QSA_OK || (k2t_same_bits(og, og2, nvv * 4) && k2t_same_bits(Sg, Sg2, nS * 4)),
               "chunk %d, grid y %d, block %d, smem %d: outputs/state differ from the single launch (must be bitwise)",
               shapes[s][0], shapes[s][1], shapes[s][2], shapes[s][3]);
    }
    /* fp16 state: reference = the CPU recurrence one token at a time, state rounded to fp16 after
       each token (o from the fp32 state before the rounding) */
    memcpy(Sc, S0, sizeof(float) * nS);
    for (int t = 0; t < M; t++) {
        CHECK_OK(qsa__gdn_recurrent(&c, Sc, q + (size_t)t * nk * dk, k + (size_t)t * nk * dk, v + (size_t)t * nv * dv,
                                    beta + (size_t)t * nv, g + (size_t)t * nv, oc + (size_t)t * nv * dv, 1));
        for (size_t i = 0; i < nS; i++) Sc[i] = k2t_f16_round(Sc[i]);
    }
    for (size_t i = 0; i < nS; i++) S16[i] = qsa__f32_to_f16(S0[i]);
    memcpy(S16b, S16, nS * 2);
    if (r == QSA_OK) r = k2t_gdn_run(1, S16, q, k, v, beta, g, og, M, nk, nv, dk, dv, 0, (dv + 31) / 32, 128, 0);
    CHECK_OK(r);
    if (r == QSA_OK) {
        for (size_t i = 0; i < nS; i++) S16f[i] = qsa__f16_to_f32(S16[i]);
        /* a 1e-7 difference before a rounding can flip an fp16 rounding (4.9e-4 relative) and the
           flip is carried to later tokens: atol 1e-3, rtol 2e-3 (two fp16 ulps) */
        CHECK(k2t_compare("gdn_recurrent_f16state o", og, oc, nvv, 1e-3, 2e-3) == 0);
        CHECK(k2t_compare("gdn_recurrent_f16state S", S16f, Sc, nS, 1e-3, 2e-3) == 0);
        for (int s = 0; s < 3 && r == QSA_OK; s++) {
            if (dk > 256 && shapes[s][2] < 64) continue;
            memcpy(S16c, S16b, nS * 2);
            r = k2t_gdn_run(1, S16c, q, k, v, beta, g, og2, M, nk, nv, dk, dv, shapes[s][0], shapes[s][1], shapes[s][2],
                            shapes[s][3]);
            CHECK_OK(r);
            CHECKF(r != QSA_OK || (k2t_same_bits(og, og2, nvv * 4) && k2t_same_bits(S16, S16c, nS * 2)),
                   "fp16 state, chunk %d: differs from the single launch (must be bitwise)", shapes[s][0]);
        }
    }
    qsa_free(S0); qsa_free(Sc); qsa_free(Sg); qsa_free(Sg2); qsa_free(q); qsa_free(k); qsa_free(v); qsa_free(beta);
    qsa_free(g); qsa_free(oc); qsa_free(og); qsa_free(og2); qsa_free(S16); qsa_free(S16b); qsa_free(S16c); qsa_free(S16f);
}

/* The batched decode kernel (qsa_k_gdn_recurrent_batch: one token of each of NB sequences per launch,
   each sequence's state through the pointer array, grid (nv, Y, NB), block 128) against the
   single-sequence kernel fed each sequence's tokens one launch at a time: the same bits (outputs and
   states).  Y = 0: the runtime's (every column in one pass), else Y blocks with several column passes.
   Sequence b's state starts b floats past a 16-byte boundary (sm_80+: 16-, 8- or 4-byte copies), in a
   slot of nS + 4 floats. */
static void k2_gdn_batch_case(int dk, int dv, int Y) {
    enum { NB = 3, T = 4 };
    int nk = K2T_NK, nv = K2T_NV, P = dk <= 128 ? 4 : dk <= 256 ? 8 : 16;
    if (Y <= 0) Y = (dv + 128 / P - 1) / (128 / P);
    size_t nS = (size_t)nv * dk * dv, kd = (size_t)nk * dk, vd = (size_t)nv * dv, n = (size_t)T * NB;
    float *q = QSA__ALLOC(float, n * kd), *k = QSA__ALLOC(float, n * kd), *v = QSA__ALLOC(float, n * vd);
    float *beta = QSA__ALLOC(float, n * nv), *g = QSA__ALLOC(float, n * nv), *ob = QSA__ALLOC(float, n * vd);
    float *S = QSA__ALLOC(float, NB * (nS + 4)), *Sb = QSA__ALLOC(float, NB * (nS + 4)), *Sr = QSA__ALLOC(float, nS);
    float *qs = QSA__ALLOC(float, T * kd), *ks = QSA__ALLOC(float, T * kd), *vs = QSA__ALLOC(float, T * vd);
    float *bs = QSA__ALLOC(float, T * nv), *gs = QSA__ALLOC(float, T * nv), *os = QSA__ALLOC(float, T * vd);
    k2t_seed(29 + dk + dv);
    k2t_fill(S, NB * (nS + 4), -0.5, 0.5);
    k2t_fill(q, n * kd, -1, 1);
    k2t_fill(k, n * kd, -1, 1);
    k2t_fill(v, n * vd, -1, 1);
    for (size_t r = 0; r < n * nk; r++) {
        qsa__l2norm(q + r * dk, dk);
        qsa__l2norm(k + r * dk, dk);
        for (int i = 0; i < dk; i++) q[r * dk + i] *= 1.0f / sqrtf((float)dk);
    }
    for (size_t i = 0; i < n * nv; i++) {
        beta[i] = qsa__sigmoid((float)k2t_uniform(-4, 4));
        g[i] = -expf((float)k2t_uniform(-3, 0.5)) * qsa__softplus((float)k2t_uniform(-4, 2));
    }
    memcpy(Sb, S, sizeof(float) * NB * (nS + 4));
    /* the batch: T launches, token t of sequence b in row t * NB + b */
    k2t_mem a = {{0}, 0};
    CUdeviceptr dS, dq, dk_, dv_, db, dg, dO, dp;
    qsa_result r = k2t_dev(&a, &dS, Sb, sizeof(float) * NB * (nS + 4));
    unsigned long long ptr[NB];
    for (int b = 0; b < NB; b++) ptr[b] = (unsigned long long)dS + 4ull * (b * (nS + 4) + (size_t)b);
    if (r == QSA_OK) r = k2t_dev(&a, &dp, ptr, sizeof ptr);
    if (r == QSA_OK) r = k2t_dev(&a, &dq, q, n * kd * 4);
    if (r == QSA_OK) r = k2t_dev(&a, &dk_, k, n * kd * 4);
    if (r == QSA_OK) r = k2t_dev(&a, &dv_, v, n * vd * 4);
    if (r == QSA_OK) r = k2t_dev(&a, &db, beta, n * nv * 4);
    if (r == QSA_OK) r = k2t_dev(&a, &dg, g, n * nv * 4);
    if (r == QSA_OK) r = k2t_dev(&a, &dO, NULL, n * vd * 4);
    for (int t = 0; t < T && r == QSA_OK; t++) {
        CUdeviceptr qo = dq + (size_t)t * NB * kd * 4, ko = dk_ + (size_t)t * NB * kd * 4, vo = dv_ + (size_t)t * NB * vd * 4,
                    bo = db + (size_t)t * NB * nv * 4, go = dg + (size_t)t * NB * nv * 4, oo = dO + (size_t)t * NB * vd * 4;
        qsa__gdn_fuse nofz;
        memset(&nofz, 0, sizeof nofz); /* (q, k, v, beta and g given) */
        void *args[] = {&dp, &qo, &ko, &vo, &bo, &go, &oo, &nk, &nv, &dk, &dv, &nofz};
        r = k2t_launch3("qsa_k_gdn_recurrent_batch", (unsigned)nv, (unsigned)Y, NB, 128, 0, args);
    }
    if (r == QSA_OK) r = k2t_get(ob, dO, n * vd * 4);
    if (r == QSA_OK) r = k2t_get(Sb, dS, sizeof(float) * NB * (nS + 4));
    k2t_free(&a);
    CHECK_OK(r);
    /* each sequence alone through the single-sequence kernel, one token per launch */
    for (int b = 0; b < NB && r == QSA_OK; b++) {
        for (int t = 0; t < T; t++) {
            size_t row = (size_t)t * NB + b;
            memcpy(qs + t * kd, q + row * kd, kd * 4);
            memcpy(ks + t * kd, k + row * kd, kd * 4);
            memcpy(vs + t * vd, v + row * vd, vd * 4);
            memcpy(bs + t * nv, beta + row * nv, (size_t)nv * 4);
            memcpy(gs + t * nv, g + row * nv, (size_t)nv * 4);
        }
        memcpy(Sr, S + b * (nS + 4) + b, nS * 4);
        r = k2t_gdn_run(0, Sr, qs, ks, vs, bs, gs, os, T, nk, nv, dk, dv, 1, (dv + 128 / P - 1) / (128 / P), 128, 0);
        CHECK_OK(r);
        int same = r == QSA_OK && k2t_same_bits(Sr, Sb + b * (nS + 4) + b, nS * 4);
        for (int t = 0; t < T && same; t++) same = k2t_same_bits(os + t * vd, ob + ((size_t)t * NB + b) * vd, vd * 4);
        CHECKF(r != QSA_OK || same, "dk %d dv %d grid y %d, sequence %d: the batched kernel differs from the single one",
               dk, dv, Y, b);
    }
    qsa_free(q); qsa_free(k); qsa_free(v); qsa_free(beta); qsa_free(g); qsa_free(ob); qsa_free(S); qsa_free(Sb);
    qsa_free(Sr); qsa_free(qs); qsa_free(ks); qsa_free(vs); qsa_free(bs); qsa_free(gs); qsa_free(os);
}

/* The decode step's conv inside the batched recurrence's launch (qsa_gdn_fuse: K2_GDN_SMEM modules) against
   qsa_k_gdn_conv_batch then the recurrence on its q, k, v, beta and g, each followed by qsa_k_gdn_norm_gate (which
   advances the fused conv's q and k state rows): the same bits in the outputs, the recurrent states and the conv
   states, over T steps of NB sequences.  Y = 0: the runtime's grid, else Y blocks (column passes); dv = 37: dead
   columns; conv kernels Kc of 4, 2 and 3. */
static void k2_gdn_fused_case(int dv, int Y, int act, int Kc) {
    enum { NB = 3, T = 3 };
    int nk = K2T_NK, nv = K2T_NV, dk = K2T_DK, P = 4;
    if (Y <= 0) Y = (dv + 128 / P - 1) / (128 / P);
    int key_dim = nk * dk, conv_dim = 2 * key_dim + nv * dv, value_dim = nv * dv;
    size_t nS = (size_t)nv * dk * dv, nC = (size_t)(Kc - 1) * conv_dim;
    float *qkv = QSA__ALLOC(float, (size_t)T * NB * conv_dim), *w = QSA__ALLOC(float, (size_t)conv_dim * Kc);
    float *gb = QSA__ALLOC(float, (size_t)T * NB * nv), *ga = QSA__ALLOC(float, (size_t)T * NB * nv);
    float *Alog = QSA__ALLOC(float, nv), *dtb = QSA__ALLOC(float, nv), *nw = QSA__ALLOC(float, dv);
    float *z = QSA__ALLOC(float, (size_t)T * NB * value_dim);
    float *S0 = QSA__ALLOC(float, NB * nS), *C0 = QSA__ALLOC(float, NB * nC);
    float *oA = QSA__ALLOC(float, (size_t)T * NB * value_dim), *oB = QSA__ALLOC(float, (size_t)T * NB * value_dim);
    float *SA = QSA__ALLOC(float, NB * nS), *SB = QSA__ALLOC(float, NB * nS), *CA = QSA__ALLOC(float, NB * nC),
          *CB = QSA__ALLOC(float, NB * nC);
    k2t_seed(71 + dv + Y + act + 5 * Kc);
    k2t_fill(qkv, (size_t)T * NB * conv_dim, -1, 1);
    k2t_fill(w, (size_t)conv_dim * Kc, -0.6, 0.6);
    k2t_fill(gb, (size_t)T * NB * nv, -4, 4);
    k2t_fill(ga, (size_t)T * NB * nv, -4, 2);
    k2t_fill(Alog, nv, -3, 0.5);
    k2t_fill(dtb, nv, -1, 1);
    k2t_fill(nw, dv, 0.5, 1.5);
    k2t_fill(z, (size_t)T * NB * value_dim, -3, 3);
    k2t_fill(S0, NB * nS, -0.5, 0.5);
    k2t_fill(C0, NB * nC, -1, 1);
    qsa_result r = QSA_OK;
    for (int fused = 0; fused < 2 && r == QSA_OK; fused++) {
        k2t_mem a = {{0}, 0};
        CUdeviceptr dS, dC, dSp, dCp, dqkv, dw, dgb, dga, dAl, ddt, dq, dk_, dv_, dbeta, dg, dO, dz, dnw, no16 = 0;
        r = k2t_dev(&a, &dS, S0, NB * nS * 4);
        if (r == QSA_OK) r = k2t_dev(&a, &dC, C0, NB * nC * 4);
        unsigned long long sp[NB], cp[NB];
        for (int b = 0; b < NB; b++) {
            sp[b] = (unsigned long long)dS + 4ull * b * nS;
            cp[b] = (unsigned long long)dC + 4ull * b * nC;
        }
        if (r == QSA_OK) r = k2t_dev(&a, &dSp, sp, sizeof sp);
        if (r == QSA_OK) r = k2t_dev(&a, &dCp, cp, sizeof cp);
        if (r == QSA_OK) r = k2t_dev(&a, &dqkv, qkv, (size_t)T * NB * conv_dim * 4);
        if (r == QSA_OK) r = k2t_dev(&a, &dw, w, (size_t)conv_dim * Kc * 4);
        if (r == QSA_OK) r = k2t_dev(&a, &dgb, gb, (size_t)T * NB * nv * 4);
        if (r == QSA_OK) r = k2t_dev(&a, &dga, ga, (size_t)T * NB * nv * 4);
        if (r == QSA_OK) r = k2t_dev(&a, &dAl, Alog, (size_t)nv * 4);
        if (r == QSA_OK) r = k2t_dev(&a, &ddt, dtb, (size_t)nv * 4);
        if (r == QSA_OK) r = k2t_dev(&a, &dq, NULL, (size_t)NB * key_dim * 4);
        if (r == QSA_OK) r = k2t_dev(&a, &dk_, NULL, (size_t)NB * key_dim * 4);
        if (r == QSA_OK) r = k2t_dev(&a, &dv_, NULL, (size_t)NB * value_dim * 4);
        if (r == QSA_OK) r = k2t_dev(&a, &dbeta, NULL, (size_t)NB * nv * 4);
        if (r == QSA_OK) r = k2t_dev(&a, &dg, NULL, (size_t)NB * nv * 4);
        if (r == QSA_OK) r = k2t_dev(&a, &dO, NULL, (size_t)T * NB * value_dim * 4);
        if (r == QSA_OK) r = k2t_dev(&a, &dz, z, (size_t)T * NB * value_dim * 4);
        if (r == QSA_OK) r = k2t_dev(&a, &dnw, nw, (size_t)dv * 4);
        for (int t = 0; t < T && r == QSA_OK; t++) {
            CUdeviceptr xo = dqkv + (size_t)t * NB * conv_dim * 4, bo = dgb + (size_t)t * NB * nv * 4,
                        ao = dga + (size_t)t * NB * nv * 4, oo = dO + (size_t)t * NB * value_dim * 4,
                        zo = dz + (size_t)t * NB * value_dim * 4;
            qsa__gdn_fuse fz = {fused ? xo : 0, dCp, dw, bo, ao, dAl, ddt, conv_dim, Kc, act};
            qsa__gdn_shift sh = {fused ? dCp : 0, xo, conv_dim, Kc, 2 * key_dim};
            if (!fused) {
                qsa__gdn_gate_args gg = {bo, ao, dAl, ddt, dbeta, dg, nv};
                void *args[] = {&xo, &dCp, &dw, &dq, &dk_, &dv_, &conv_dim, &key_dim, &Kc, &act, &nk, &dk, &gg};
                r = k2t_launch3("qsa_k_gdn_conv_batch", 1, (unsigned)(2 * nk + (value_dim + 255) / 256), NB, 256, 0, args);
            }
            void *args[] = {&dSp, &dq, &dk_, &dv_, &dbeta, &dg, &oo, &nk, &nv, &dk, &dv, &fz};
            if (r == QSA_OK) r = k2t_launch3("qsa_k_gdn_recurrent_batch", (unsigned)nv, (unsigned)Y, NB, 128, 0, args);
            float eps = 1e-6f;
            int gact = 0;
            void *nargs[] = {&oo, &zo, &dnw, &no16, &nv, &dv, &eps, &gact, &sh};
            if (r == QSA_OK) r = k2t_launch("qsa_k_gdn_norm_gate", (unsigned)(NB * nv), 1, 128, 0, nargs);
        }
        if (r == QSA_OK) r = k2t_get(fused ? oB : oA, dO, (size_t)T * NB * value_dim * 4);
        if (r == QSA_OK) r = k2t_get(fused ? SB : SA, dS, NB * nS * 4);
        if (r == QSA_OK) r = k2t_get(fused ? CB : CA, dC, NB * nC * 4);
        k2t_free(&a);
    }
    CHECK_OK(r);
    if (r == QSA_OK) {
        CHECKF(k2t_same_bits(oA, oB, (size_t)T * NB * value_dim * 4), "dv %d Y %d act %d Kc %d: outputs differ", dv, Y, act, Kc);
        CHECKF(k2t_same_bits(SA, SB, NB * nS * 4), "dv %d Y %d act %d Kc %d: recurrent states differ", dv, Y, act, Kc);
        CHECKF(k2t_same_bits(CA, CB, NB * nC * 4), "dv %d Y %d act %d Kc %d: conv states differ", dv, Y, act, Kc);
    }
    qsa_free(qkv); qsa_free(w); qsa_free(gb); qsa_free(ga); qsa_free(Alog); qsa_free(dtb); qsa_free(nw); qsa_free(z);
    qsa_free(S0); qsa_free(C0);
    qsa_free(oA); qsa_free(oB); qsa_free(SA); qsa_free(SB); qsa_free(CA); qsa_free(CB);
}

TEST(gpu, k2_gdn_conv_fused) {
    K2_NEED_GPU();
    const char *us = strchr(K2G_.arch, '_');
    int a = us ? atoi(us + 1) : 0;
    if (!(a == 80 || a == 87 || (a >= 90 && a < 120))) SKIP("the fused conv needs a K2_GDN_SMEM module (this: %s)", K2G_.arch);
    static const int cs[][4] = {{128, 0, 0, K2T_KC}, {37, 0, 1, K2T_KC}, {128, 1, 0, K2T_KC}, {128, 0, 1, 2}, {37, 1, 0, 3}};
    for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++) k2_gdn_fused_case(cs[i][0], cs[i][1], cs[i][2], cs[i][3]);
}

TEST(gpu, k2_gdn_recurrent) {
    K2_NEED_GPU();
    static const int dks[] = {K2T_DK, 48, 256, 512};
    for (size_t i = 0; i < sizeof dks / sizeof dks[0]; i++) k2_gdn_case(dks[i]);
    /* the batched decode kernel: the model's head (16-byte copies), dv not a multiple of 4 (4-byte copies,
       dead columns), column passes (grid y 1), rows past dk, 8 and 16 lanes per column */
    static const int bc[][3] = {{128, 128, 0}, {128, 37, 0}, {128, 128, 1}, {48, 64, 0}, {256, 24, 0}, {512, 18, 0}, {512, 20, 1}};
    for (size_t i = 0; i < sizeof bc / sizeof bc[0]; i++) k2_gdn_batch_case(bc[i][0], bc[i][1], bc[i][2]);
}

/* ---------------------------------------------------------------------------------------------- */
/* QSA: prep kernels, block keys, scores, top-k                                                    */
/* ---------------------------------------------------------------------------------------------- */

/* A model with just what qsa__rope / qsa__block_key read. */
static qsa_model *k2t_fake_model(int rd, int ihd, int r, float eps) {
    qsa_model *m = QSA__CALLOC(qsa_model, 1);
    m->cfg.rotary_dim = rd;
    m->cfg.indexer_head_dim = ihd;
    m->cfg.indexer_compress_ratio = r;
    m->cfg.rms_norm_eps = eps;
    m->rope_inv_freq = QSA__ALLOC(float, rd / 2 + 1);
    for (int i = 0; i < rd / 2; i++) m->rope_inv_freq[i] = 1.0f / (float)pow(1e7, (double)(2 * i) / rd);
    return m;
}
static void k2t_fake_model_free(qsa_model *m) {
    qsa_free(m->rope_inv_freq);
    qsa_free(m);
}

/* A block table of `np` logical pages on random distinct physical pages of a pool of n_pages
   (seed 0: identity). */
static void k2t_block_table(int32_t *bt, int np, int n_pages, uint64_t seed) {
    int32_t *all = QSA__ALLOC(int32_t, n_pages);
    for (int i = 0; i < n_pages; i++) all[i] = i;
    if (seed) {
        k2t_seed(seed);
        for (int i = n_pages - 1; i > 0; i--) {
            int j = (int)k2t_uniform(0, i + 1);
            int32_t x = all[i];
            all[i] = all[j];
            all[j] = x;
        }
    }
    memcpy(bt, all, sizeof(int32_t) * (size_t)np);
    qsa_free(all);
}

TEST(gpu, k2_attn_and_indexer_prep_block_keys) {
    K2_NEED_GPU();
    enum { NH = 4, NKV = 2, HD = 128, RD = 64, IH = 4, IHD = 128, R = 4, PS = 16, M = 37, POS0 = 100, NPAGES = 64 };
    float eps = 1e-6f;
    int nh = NH, nkv = NKV, hd = HD, rd = RD, ih = IH, ihd = IHD, r = R, ps = PS, Mq = M, pos0 = POS0;
    int kvd = NKV * HD, ntok = POS0 + M, np = (ntok + PS - 1) / PS;
    qsa_model *m = k2t_fake_model(RD, IHD, R, eps);
    size_t nq = (size_t)M * NH * 2 * HD, nkvv = (size_t)M * kvd, niq = (size_t)M * (IH + 1) * IHD;
    size_t slots = (size_t)NPAGES * PS;
    float *q = QSA__ALLOC(float, nq), *qref = QSA__ALLOC(float, nq), *qg = QSA__ALLOC(float, nq);
    float *kin = QSA__ALLOC(float, nkvv), *vin = QSA__ALLOC(float, nkvv), *qn = QSA__ALLOC(float, HD),
          *kn = QSA__ALLOC(float, HD), *kref = QSA__ALLOC(float, nkvv), *kgot = QSA__ALLOC(float, nkvv);
    float *iq = QSA__ALLOC(float, niq), *iqref = QSA__ALLOC(float, niq), *iqg = QSA__ALLOC(float, niq),
          *qln = QSA__ALLOC(float, IHD), *kln = QSA__ALLOC(float, IHD);
    uint16_t *Kp = QSA__ALLOC(uint16_t, slots * kvd), *Vp = QSA__ALLOC(uint16_t, slots * kvd);
    float *Ip = QSA__ALLOC(float, slots * IHD), *Ipg = QSA__ALLOC(float, slots * IHD);
    int32_t bt[64];
    k2t_block_table(bt, np, NPAGES, 5);
    k2t_seed(31);
    k2t_fill(q, nq, -2, 2);
    k2t_fill(kin, nkvv, -2, 2);
    k2t_fill(vin, nkvv, -2, 2);
    k2t_fill(qn, HD, -0.3, 0.3);
    k2t_fill(kn, HD, -0.3, 0.3);
    k2t_fill(iq, niq, -2, 2);
    k2t_fill(qln, IHD, -0.3, 0.3);
    k2t_fill(kln, IHD, -0.3, 0.3);
    /* the raw keys of the earlier tokens are already in the pool (random), these M are written now */
    for (size_t i = 0; i < slots * IHD; i++) Ip[i] = (float)k2t_uniform(-2, 2);
    /* CPU reference */
    memcpy(qref, q, sizeof(float) * nq);
    memcpy(iqref, iq, sizeof(float) * niq);
    for (int t = 0; t < M; t++) {
        int64_t pos = POS0 + t;
        for (int h = 0; h < NH; h++) {
            float *qh = qref + ((size_t)t * NH + h) * 2 * HD;
            qsa__rmsnorm_1p(qh, qn, qh, HD, HD, eps);
            qsa__rope(m, qh, pos);
        }
        for (int h = 0; h < NKV; h++) {
            float *kh = kref + (size_t)t * kvd + h * HD;
            qsa__rmsnorm_1p(kin + (size_t)t * kvd + h * HD, kn, kh, HD, HD, eps);
            qsa__rope(m, kh, pos);
        }
        for (int h = 0; h < IH; h++) {
            float *ih_ = iqref + (size_t)t * (IH + 1) * IHD + h * IHD;
            qsa__rmsnorm_1p(ih_, qln, ih_, IHD, IHD, eps);
            qsa__rope(m, ih_, pos);
        }
        int64_t slot = (int64_t)bt[pos / PS] * PS + pos % PS;
        memcpy(Ip + slot * IHD, iq + (size_t)t * (IH + 1) * IHD + IH * IHD, sizeof(float) * IHD);
    }
    int b0 = 3, b1 = ntok / R, nbk = b1 - b0;
    float *bk = QSA__ALLOC(float, (size_t)b1 * IHD), *bkg = QSA__ALLOC(float, (size_t)b1 * IHD), keys[R * IHD];
    qsa__attn_w aw;
    memset(&aw, 0, sizeof aw);
    aw.idx_k_norm = kln;
    for (int b = b0; b < b1; b++) {
        for (int j = 0; j < R; j++) {
            int64_t p = (int64_t)b * R + j;
            memcpy(keys + j * IHD, Ip + ((int64_t)bt[p / PS] * PS + p % PS) * IHD, sizeof(float) * IHD);
        }
        qsa__block_key(m, &aw, keys, b, bk + (size_t)b * IHD);
    }
    /* GPU: the raw keys of tokens < POS0 uploaded; the prep kernels add the new ones */
    float *Ip_before = QSA__ALLOC(float, slots * IHD);
    memcpy(Ip_before, Ip, sizeof(float) * slots * IHD);
    for (int t = 0; t < M; t++) {
        int64_t pos = POS0 + t, slot = (int64_t)bt[pos / PS] * PS + pos % PS;
        for (int i = 0; i < IHD; i++) Ip_before[slot * IHD + i] = qsa__f16_to_f32(0x7e00); /* NaN: must be overwritten */
    }
    k2t_mem a = {{0}, 0};
    CUdeviceptr dq, dk_, dv_, dqn, dkn, dinv, dbt, dK, dV, diq, dqln, dkln, dI, dbk;
    qsa_result res = k2t_dev(&a, &dq, q, nq * 4);
    if (res == QSA_OK) res = k2t_dev(&a, &dk_, kin, nkvv * 4);
    if (res == QSA_OK) res = k2t_dev(&a, &dv_, vin, nkvv * 4);
    if (res == QSA_OK) res = k2t_dev(&a, &dqn, qn, HD * 4);
    if (res == QSA_OK) res = k2t_dev(&a, &dkn, kn, HD * 4);
    if (res == QSA_OK) res = k2t_dev(&a, &dinv, m->rope_inv_freq, RD / 2 * 4);
    if (res == QSA_OK) res = k2t_dev(&a, &dbt, bt, sizeof bt);
    if (res == QSA_OK) res = k2t_dev(&a, &dK, NULL, slots * kvd * 2);
    if (res == QSA_OK) res = k2t_dev(&a, &dV, NULL, slots * kvd * 2);
    if (res == QSA_OK) res = k2t_dev(&a, &diq, iq, niq * 4);
    if (res == QSA_OK) res = k2t_dev(&a, &dqln, qln, IHD * 4);
    if (res == QSA_OK) res = k2t_dev(&a, &dkln, kln, IHD * 4);
    if (res == QSA_OK) res = k2t_dev(&a, &dI, Ip_before, slots * IHD * 4);
    if (res == QSA_OK) res = k2t_dev(&a, &dbk, NULL, (size_t)b1 * IHD * 4);
    if (res == QSA_OK) {
        void *args[] = {&dq, &dk_, &dv_, &dqn, &dkn, &dinv, &dbt, &dK, &dV, &pos0, &Mq, &nh, &nkv, &hd, &rd, &ps, &eps};
        res = k2t_launch("qsa_k_attn_qk_prep", M, NH + NKV, 128, 0, args);
    }
    if (res == QSA_OK) {
        void *args[] = {&diq, &dqln, &dinv, &dbt, &dI, &pos0, &Mq, &ih, &ihd, &rd, &ps, &eps};
        res = k2t_launch("qsa_k_indexer_prep", M, 2, 128, 0, args); /* Y = 2 < ih + 1: heads loop */
    }
    if (res == QSA_OK) {
        void *args[] = {&dI, &dbt, &dkln, &dinv, &dbk, &b0, &b1, &r, &ihd, &rd, &ps, &eps};
        res = k2t_launch("qsa_k_block_keys", (unsigned)nbk, 1, 128, 0, args);
    }
    if (res == QSA_OK) res = k2t_get(qg, dq, nq * 4);
    if (res == QSA_OK) res = k2t_get(Kp, dK, slots * kvd * 2);
    if (res == QSA_OK) res = k2t_get(Vp, dV, slots * kvd * 2);
    if (res == QSA_OK) res = k2t_get(iqg, diq, niq * 4);
    if (res == QSA_OK) res = k2t_get(Ipg, dI, slots * IHD * 4);
    if (res == QSA_OK) res = k2t_get(bkg, dbk, (size_t)b1 * IHD * 4);
    /* the same q prep with one block per token (Y = 1): same bits */
    float *qg1 = QSA__ALLOC(float, nq);
    if (res == QSA_OK) res = k2t_put(dq, q, nq * 4);
    if (res == QSA_OK) {
        void *args[] = {&dq, &dk_, &dv_, &dqn, &dkn, &dinv, &dbt, &dK, &dV, &pos0, &Mq, &nh, &nkv, &hd, &rd, &ps, &eps};
        res = k2t_launch("qsa_k_attn_qk_prep", M, 1, 128, 0, args);
    }
    if (res == QSA_OK) res = k2t_get(qg1, dq, nq * 4);
    /* The decode step's one launch, qsa_k_attn_prep_batch: the M tokens as one-token sequences that share
       the block table, a launch per place in an indexer block (pos % R = 0, 1, .., R - 1: a completing
       token's block-mates are in the pool before it), each a batch of about M / R; then phase 0 again
       without the indexer.  Every output must be bitwise the three kernels' above. */
    enum { NB = (M + R - 1) / R + 1 };
    float *qf = QSA__ALLOC(float, nq), *iqf = QSA__ALLOC(float, niq), *q0 = QSA__ALLOC(float, (size_t)NB * NH * 2 * HD);
    float *qb = QSA__ALLOC(float, (size_t)NB * NH * 2 * HD), *kb = QSA__ALLOC(float, (size_t)NB * kvd),
          *vb = QSA__ALLOC(float, (size_t)NB * kvd), *iqb = QSA__ALLOC(float, (size_t)NB * (IH + 1) * IHD);
    uint16_t *Kf = QSA__ALLOC(uint16_t, slots * kvd), *Vf = QSA__ALLOC(uint16_t, slots * kvd);
    float *Ipf = QSA__ALLOC(float, slots * IHD), *bkf = QSA__ALLOC(float, (size_t)b1 * IHD);
    int tok[NB], posb[NB], n0 = 0;
    unsigned long long btsb[NB], bksb[NB];
    CUdeviceptr dK2, dV2, dI2, dbk2, dqb, dkb, dvb, diqb, dposb, dbtsb, dbksb, none = 0;
    if (res == QSA_OK) res = k2t_dev(&a, &dK2, NULL, slots * kvd * 2);
    if (res == QSA_OK) res = k2t_dev(&a, &dV2, NULL, slots * kvd * 2);
    if (res == QSA_OK) res = k2t_dev(&a, &dI2, Ip_before, slots * IHD * 4);
    if (res == QSA_OK) res = k2t_dev(&a, &dbk2, NULL, (size_t)b1 * IHD * 4);
    if (res == QSA_OK) res = k2t_dev(&a, &dqb, NULL, (size_t)NB * NH * 2 * HD * 4);
    if (res == QSA_OK) res = k2t_dev(&a, &dkb, NULL, (size_t)NB * kvd * 4);
    if (res == QSA_OK) res = k2t_dev(&a, &dvb, NULL, (size_t)NB * kvd * 4);
    if (res == QSA_OK) res = k2t_dev(&a, &diqb, NULL, (size_t)NB * (IH + 1) * IHD * 4);
    if (res == QSA_OK) res = k2t_dev(&a, &dposb, NULL, sizeof posb);
    if (res == QSA_OK) res = k2t_dev(&a, &dbtsb, NULL, sizeof btsb);
    if (res == QSA_OK) res = k2t_dev(&a, &dbksb, NULL, sizeof bksb);
    size_t qr = (size_t)NH * 2 * HD, ir = (size_t)(IH + 1) * IHD;
    for (int c = 0; c <= R && res == QSA_OK; c++) { /* c == R: phase 0 again, no indexer */
        int n = 0, phase = c % R;
        for (int t = 0; t < M; t++)
            if ((POS0 + t) % R == phase) {
                tok[n] = t;
                posb[n] = POS0 + t;
                btsb[n] = dbt;
                bksb[n] = dbk2;
                memcpy(qb + n * qr, q + t * qr, sizeof(float) * qr);
                memcpy(kb + (size_t)n * kvd, kin + (size_t)t * kvd, sizeof(float) * kvd);
                memcpy(vb + (size_t)n * kvd, vin + (size_t)t * kvd, sizeof(float) * kvd);
                memcpy(iqb + n * ir, iq + t * ir, sizeof(float) * ir);
                n++;
            }
        if (c == 0) n0 = n;
        res = k2t_put(dqb, qb, sizeof(float) * n * qr);
        if (res == QSA_OK) res = k2t_put(dkb, kb, sizeof(float) * n * kvd);
        if (res == QSA_OK) res = k2t_put(dvb, vb, sizeof(float) * n * kvd);
        if (res == QSA_OK) res = k2t_put(diqb, iqb, sizeof(float) * n * ir);
        if (res == QSA_OK) res = k2t_put(dposb, posb, sizeof(int) * n);
        if (res == QSA_OK) res = k2t_put(dbtsb, btsb, sizeof(btsb[0]) * n);
        if (res == QSA_OK) res = k2t_put(dbksb, bksb, sizeof(bksb[0]) * n);
        CUdeviceptr *piq = c < R ? &diqb : &none;
        if (res == QSA_OK) {
            void *args[] = {&dqb, &dkb, &dvb, &dqn, &dkn, &dinv, &dbtsb, &dK2, &dV2, &dposb, &nh, &nkv, &hd, &rd, &ps, &eps,
                            piq, &dqln, &dkln, &dI2, &dbksb, &ih, &ihd, &r};
            res = k2t_launch3("qsa_k_attn_prep_batch", 1, (unsigned)(NH + NKV + (c < R ? IH + 1 : 0)), (unsigned)n, 128, 0,
                              args);
        }
        if (res == QSA_OK) res = k2t_get(c < R ? qb : q0, dqb, sizeof(float) * n * qr);
        if (res == QSA_OK && c < R) res = k2t_get(iqb, diqb, sizeof(float) * n * ir);
        for (int j = 0; j < n && c < R; j++) {
            memcpy(qf + tok[j] * qr, qb + j * qr, sizeof(float) * qr);
            memcpy(iqf + tok[j] * ir, iqb + j * ir, sizeof(float) * ir);
        }
    }
    if (res == QSA_OK) res = k2t_get(Kf, dK2, slots * kvd * 2);
    if (res == QSA_OK) res = k2t_get(Vf, dV2, slots * kvd * 2);
    if (res == QSA_OK) res = k2t_get(Ipf, dI2, slots * IHD * 4);
    if (res == QSA_OK) res = k2t_get(bkf, dbk2, (size_t)b1 * IHD * 4);
    k2t_free(&a);
    CHECK_OK(res);
    if (res == QSA_OK) {
        int bn = POS0 / R, badq0 = 0, unwritten = 0; /* blocks bn .. b1 - 1: completed by these tokens */
        CHECKF(k2t_same_bits(qf, qg, nq * 4), "attn_prep_batch: q differs from qsa_k_attn_qk_prep's");
        CHECKF(k2t_same_bits(iqf, iqg, niq * 4), "attn_prep_batch: indexer q differs from qsa_k_indexer_prep's");
        CHECKF(k2t_same_bits(Kf, Kp, slots * kvd * 2) && k2t_same_bits(Vf, Vp, slots * kvd * 2),
               "attn_prep_batch: the K / V pools differ from qsa_k_attn_qk_prep's");
        CHECKF(k2t_same_bits(Ipf, Ipg, slots * IHD * 4), "attn_prep_batch: raw indexer keys differ");
        CHECKF(k2t_same_bits(bkf + (size_t)bn * IHD, bkg + (size_t)bn * IHD, (size_t)(b1 - bn) * IHD * 4),
               "attn_prep_batch: block keys %d..%d differ from qsa_k_block_keys'", bn, b1 - 1);
        for (size_t i = 0; i < (size_t)bn * IHD; i++) unwritten += bkf[i] != bkf[i];
        CHECKF(unwritten == bn * IHD, "attn_prep_batch wrote %d key values of blocks no token completed", bn * IHD - unwritten);
        for (int j = 0; j < n0; j++) badq0 += !k2t_same_bits(q0 + j * qr, qf + tok[j] * qr, qr * 4); /* (tok: phase 0's) */
        CHECKF(badq0 == 0, "attn_prep_batch without the indexer: q of %d of %d tokens differs", badq0, n0);
    }
    qsa_free(qf); qsa_free(iqf); qsa_free(q0); qsa_free(qb); qsa_free(kb); qsa_free(vb); qsa_free(iqb); qsa_free(Kf);
    qsa_free(Vf); qsa_free(Ipf); qsa_free(bkf);
    if (res == QSA_OK) {
        /* RMSNorm over 128 values (tree vs sequential sum: a few ulp), the RoPE rotation is
           computed like the CPU (same cos/sin, unfused products): atol 1e-6, rtol 1e-5 */
        CHECK(k2t_compare("attn_qk_prep q", qg, qref, nq, 1e-6, 1e-5) == 0);
        CHECKF(k2t_same_bits(qg, qg1, nq * 4), "q prep with one block per token differs");
        int badv = 0;
        for (int t = 0; t < M; t++) {
            int64_t pos = POS0 + t, slot = (int64_t)bt[pos / PS] * PS + pos % PS;
            for (int i = 0; i < kvd; i++) {
                kgot[(size_t)t * kvd + i] = qsa__f16_to_f32(Kp[slot * kvd + i]);
                badv += Vp[slot * kvd + i] != qsa__f32_to_f16(vin[(size_t)t * kvd + i]);
            }
        }
        /* K is stored in fp16: half an fp16 ulp (4.9e-4) plus the fp32 noise above */
        CHECK(k2t_compare("attn_qk_prep K (fp16 page)", kgot, kref, nkvv, 1e-6, 1e-3) == 0);
        CHECKF(badv == 0, "%d V values are not the fp16 rounding of v_in at the token's page slot", badv);
        CHECK(k2t_compare("indexer_prep q", iqg, iqref, niq, 1e-6, 1e-5) == 0);
        CHECKF(k2t_same_bits(Ipg, Ip, slots * IHD * 4), "raw indexer keys: not copied exactly to their page slots");
        /* the mean is bitwise the CPU's; the norm adds a few ulp */
        CHECK(k2t_compare("block_keys", bkg + (size_t)b0 * IHD, bk + (size_t)b0 * IHD, (size_t)nbk * IHD, 1e-6, 1e-5) == 0);
    }
    qsa_free(qg1); qsa_free(Ip_before);
    qsa_free(q); qsa_free(qref); qsa_free(qg); qsa_free(kin); qsa_free(vin); qsa_free(qn); qsa_free(kn); qsa_free(kref);
    qsa_free(kgot); qsa_free(iq); qsa_free(iqref); qsa_free(iqg); qsa_free(qln); qsa_free(kln); qsa_free(Kp); qsa_free(Vp);
    qsa_free(Ip); qsa_free(Ipg); qsa_free(bk); qsa_free(bkg);
    k2t_fake_model_free(m);
}

TEST(gpu, k2_block_scores) {
    K2_NEED_GPU();
    enum { IH = 4, IHD = 128, R = 4, M = 37, POS0 = 1000 };
    int ih = IH, ihd = IHD, r = R, Mq = M, pos0 = POS0;
    int maxb = (POS0 + M) / R, ld = maxb + 3;
    size_t niq = (size_t)M * (IH + 1) * IHD;
    float *iq = QSA__ALLOC(float, niq), *bk = QSA__ALLOC(float, (size_t)maxb * IHD);
    float *ref = QSA__ALLOC(float, (size_t)M * ld), *tol = QSA__ALLOC(float, (size_t)M * ld),
          *got = QSA__ALLOC(float, (size_t)M * ld), *got2 = QSA__ALLOC(float, (size_t)M * ld),
          *got1 = QSA__ALLOC(float, (size_t)ld);
    k2t_seed(41);
    k2t_fill(iq, niq, -1.5, 1.5);
    k2t_fill(bk, (size_t)maxb * IHD, -1.5, 1.5);
    int bad = 0;
    for (int t = 0; t < M; t++) {
        int nb = (POS0 + t + 1) / R;
        const float *it = iq + (size_t)t * (IH + 1) * IHD;
        for (int b = 0; b < nb; b++) {
            const float *kb = bk + (size_t)b * IHD;
            float s = 0.0f;
            double mag = 0;
            for (int h = 0; h < IH; h++) {
                float d = 0.0f;
                for (int i = 0; i < IHD; i++) {
                    d += it[h * IHD + i] * kb[i];
                    mag += fabs((double)it[h * IHD + i] * kb[i]);
                }
                s += d > 0.0f ? d : 0.0f;
            }
            ref[(size_t)t * ld + b] = s / sqrtf((float)IHD);
            /* a 128-term dot in another order: <= ~8 ulp of sum|q k| in practice; 1e-6 * sum|q k| */
            tol[(size_t)t * ld + b] = (float)(1e-6 * mag / sqrt((double)IHD) + 1e-7);
        }
    }
    k2t_mem a = {{0}, 0};
    CUdeviceptr diq, dbk, dsc;
    qsa_result res = k2t_dev(&a, &diq, iq, niq * 4);
    if (res == QSA_OK) res = k2t_dev(&a, &dbk, bk, (size_t)maxb * IHD * 4);
    if (res == QSA_OK) res = k2t_dev(&a, &dsc, NULL, (size_t)M * ld * 4);
    if (res == QSA_OK) {
        void *args[] = {&diq, &dbk, &dsc, &pos0, &Mq, &ih, &ihd, &r, &ld};
        res = k2t_launch("qsa_k_block_scores", M, (unsigned)(maxb + 255) / 256, 256, 0, args);
    }
    if (res == QSA_OK) res = k2t_get(got, dsc, (size_t)M * ld * 4);
    if (res == QSA_OK) res = k2t_poison(dsc, (size_t)M * ld * 4);
    if (res == QSA_OK) { /* another grid: 3 blocks of 64 threads per query */
        void *args[] = {&diq, &dbk, &dsc, &pos0, &Mq, &ih, &ihd, &r, &ld};
        res = k2t_launch("qsa_k_block_scores", M, 3, 64, 0, args);
    }
    if (res == QSA_OK) res = k2t_get(got2, dsc, (size_t)M * ld * 4);
    /* query 20 alone (M = 1) */
    int t1 = 20, p1 = POS0 + t1, one = 1;
    CUdeviceptr iq1 = diq + (size_t)t1 * (IH + 1) * IHD * 4;
    if (res == QSA_OK) res = k2t_poison(dsc, (size_t)ld * 4);
    if (res == QSA_OK) {
        void *args[] = {&iq1, &dbk, &dsc, &p1, &one, &ih, &ihd, &r, &ld};
        res = k2t_launch("qsa_k_block_scores", 1, 1, 256, 0, args);
    }
    if (res == QSA_OK) res = k2t_get(got1, dsc, (size_t)ld * 4);
    /* the batched kernel (qsa_k_block_scores_batch), bitwise against the M-query launch: queries 3 (position
       1,003: its token completes block 250), 20 and 35 (block 258) as sequences of their own, and one whose
       blocks all fit the top-k (position 10, topk 8: no score written), every sequence's keys pointer at the
       same keys, in two grids */
    enum { NBS = 4 };
    const int bt[NBS] = {3, 20, 35, -1};
    int bpos[NBS], topk8 = 8, mism_b = 0, unwritten = 0;
    float *iqb = QSA__ALLOC(float, (size_t)NBS * (IH + 1) * IHD), *gotb = QSA__ALLOC(float, (size_t)NBS * ld);
    unsigned long long bptr[NBS];
    CUdeviceptr diqb = 0, dptr = 0, dpos = 0, dscb = 0;
    for (int i = 0; i < NBS; i++) {
        bpos[i] = bt[i] >= 0 ? POS0 + bt[i] : 10;
        memcpy(iqb + (size_t)i * (IH + 1) * IHD, iq + (size_t)(bt[i] >= 0 ? bt[i] : 0) * (IH + 1) * IHD,
               (size_t)(IH + 1) * IHD * 4);
        bptr[i] = (unsigned long long)dbk;
    }
    if (res == QSA_OK) res = k2t_dev(&a, &diqb, iqb, (size_t)NBS * (IH + 1) * IHD * 4);
    if (res == QSA_OK) res = k2t_dev(&a, &dptr, bptr, sizeof bptr);
    if (res == QSA_OK) res = k2t_dev(&a, &dpos, bpos, sizeof bpos);
    if (res == QSA_OK) res = k2t_dev(&a, &dscb, NULL, (size_t)NBS * ld * 4);
    for (int gy = 0; gy < 2 && res == QSA_OK; gy++) {
        void *args[] = {&diqb, &dptr, &dscb, &dpos, &ih, &ihd, &r, &ld, &topk8};
        res = k2t_poison(dscb, (size_t)NBS * ld * 4);
        if (res == QSA_OK) res = k2t_launch3("qsa_k_block_scores_batch", 1, gy ? 13 : 2, NBS, 256, 0, args);
        if (res == QSA_OK) res = k2t_get(gotb, dscb, (size_t)NBS * ld * 4);
        for (int i = 0; i < NBS && res == QSA_OK; i++) {
            int nb = (bpos[i] + 1) / R;
            for (int b = 0; b < nb; b++) {
                const float *g = gotb + (size_t)i * ld + b;
                if (bt[i] >= 0) mism_b += memcmp(g, got + (size_t)bt[i] * ld + b, 4) != 0;
                else unwritten += *g != *g; /* (poison: NaN) */
            }
        }
    }
    k2t_free(&a);
    CHECK_OK(res);
    if (res == QSA_OK) {
        CHECKF(mism_b == 0, "%d scores of the batched kernel differ from the M=%d launch's", mism_b, M);
        CHECKF(unwritten == (10 + 1) / R * 2, "a sequence with no more blocks than the top-k: %d of %d scores unwritten",
               unwritten, (10 + 1) / R * 2);
    }
    qsa_free(iqb); qsa_free(gotb);
    if (res == QSA_OK) {
        int mism = 0, mism1 = 0;
        for (int t = 0; t < M; t++) {
            int nb = (POS0 + t + 1) / R;
            for (int b = 0; b < nb; b++) {
                size_t i = (size_t)t * ld + b;
                double err = fabs((double)got[i] - ref[i]);
                if (!(err <= tol[i])) {
                    if (bad < 5) printf("    block_scores[%d][%d]: gpu %.9g cpu %.9g tol %.3g\n", t, b, got[i], ref[i], tol[i]);
                    bad++;
                }
                mism += memcmp(&got[i], &got2[i], 4) != 0;
                if (t == t1) mism1 += memcmp(&got[i], &got1[b], 4) != 0;
            }
        }
        CHECKF(bad == 0, "%d scores out of tolerance", bad);
        CHECKF(mism == 0, "%d scores differ with another launch shape (must be bitwise)", mism);
        CHECKF(mism1 == 0, "%d scores of query %d differ between M=%d and M=1 (batch invariance)", mism1, t1, M);
    }
    qsa_free(iq); qsa_free(bk); qsa_free(ref); qsa_free(tol); qsa_free(got); qsa_free(got2); qsa_free(got1);
}

/* One top-k case: M queries at pos0.. with scores from `kind`; exact equality with qsa__select_blocks. */
static void k2t_topk_case(const char *what, int kind, int pos0, int M, int r, int topk) {
    int maxb = (pos0 + M) / r, ld = maxb + 1;
    float *sc = QSA__ALLOC(float, (size_t)M * ld);
    int32_t *want = QSA__ALLOC(int32_t, (size_t)topk + 1), *got = QSA__ALLOC(int32_t, (size_t)M * topk + 1);
    int32_t *nsel = QSA__ALLOC(int32_t, M);
    for (size_t i = 0; i < (size_t)M * ld; i++) {
        double u = k2t_uniform(0, 1);
        float x;
        switch (kind) {
        case 0: x = (float)k2t_uniform(0, 10); break;                     /* distinct (almost surely) */
        case 1: x = (float)floor(u * 6) * 0.25f; break;                   /* six values: ties at the threshold */
        case 2: x = 1.5f; break;                                          /* all equal */
        case 3: x = u < 0.5 ? (u < 0.25 ? 0.0f : -0.0f) : (float)u; break; /* +0 and -0 are equal */
        case 4: x = (float)k2t_uniform(-5, 5); break;                     /* negative scores */
        case 5: x = u < 0.001 ? 1e30f : (float)(u * 3); break;            /* outliers: one linear bin holds almost all */
        case 6: x = 1.0f + (float)(u * 1e-5); break;                      /* a narrow cluster: few distinct values */
        case 7: x = u < 0.01 ? INFINITY : (u < 0.02 ? -INFINITY : (float)u); break; /* infinities */
        default: x = u < 0.03 ? 9.995f + (float)(u * 0.1) : (float)(u * 9.99); break; /* 1-2k keys in the threshold bin */
        }
        sc[i] = x;
    }
    k2t_mem a = {{0}, 0};
    CUdeviceptr dsc, dsel, dns;
    qsa_result res = k2t_dev(&a, &dsc, sc, (size_t)M * ld * 4);
    if (res == QSA_OK) res = k2t_dev(&a, &dsel, NULL, (size_t)M * topk * 4 + 4);
    if (res == QSA_OK) res = k2t_dev(&a, &dns, NULL, (size_t)M * 4);
    if (res == QSA_OK) {
        void *args[] = {&dsc, &dsel, &dns, &pos0, &M, &r, &topk, &ld};
        res = k2t_launch("qsa_k_topk_blocks", (unsigned)M, 1, 1024, 0, args);
    }
    if (res == QSA_OK && topk) res = k2t_get(got, dsel, (size_t)M * topk * 4);
    if (res == QSA_OK) res = k2t_get(nsel, dns, (size_t)M * 4);
    k2t_free(&a);
    CHECK_OK(res);
    int bad = 0;
    for (int t = 0; res == QSA_OK && t < M; t++) {
        int nb = (pos0 + t + 1) / r;
        int n = qsa__select_blocks(sc + (size_t)t * ld, nb, topk, want);
        int same = nsel[t] == n;
        for (int i = 0; same && i < n; i++) same = got[(size_t)t * topk + i] == want[i];
        for (int i = n; same && i < topk; i++) same = got[(size_t)t * topk + i] == -1;
        if (!same) {
            if (bad < 3) printf("    topk %s: query %d (nb %d, k %d): gpu n=%d first %d, cpu n=%d first %d\n", what, t, nb, topk,
                                nsel[t], topk ? got[(size_t)t * topk] : -1, n, n ? want[0] : -1);
            bad++;
        }
    }
    CHECKF(bad == 0, "topk %s: %d of %d queries select differently from qsa__select_blocks", what, bad, M);
    qsa_free(sc); qsa_free(want); qsa_free(got); qsa_free(nsel);
}

TEST(gpu, k2_topk_blocks_exact) {
    K2_NEED_GPU();
    k2t_seed(53);
    k2t_topk_case("65536 blocks, top 512", 0, 262144 - 3, 3, 4, 512);     /* nb = 65535, 65536, 65536 */
    k2t_topk_case("ties", 1, 20000, 5, 4, 512);
    k2t_topk_case("all equal", 2, 9000, 3, 4, 300);
    k2t_topk_case("+0/-0", 3, 5000, 4, 4, 200);
    k2t_topk_case("negative", 4, 3000, 4, 4, 100);
    k2t_topk_case("outliers", 5, 262144 - 2, 2, 4, 2048);
    k2t_topk_case("narrow cluster", 6, 200000, 2, 4, 2048);
    k2t_topk_case("infinities", 7, 100000, 2, 4, 1000);
    k2t_topk_case("dense threshold bin", 8, 262144 - 2, 2, 4, 512);
    k2t_topk_case("k >= nb, nb = 0", 0, 0, 40, 4, 8);                    /* nb 0..10: all, then top 8 */
    k2t_topk_case("r = 1, k = 1", 1, 700, 3, 1, 1);
    /* more blocks than the counting pass's ballots can keep in shared memory: the taking pass reads the
       scores again (and row 1 is not 16-byte aligned: 4-byte loads throughout) */
    k2t_topk_case("140,000 blocks", 0, 140000, 2, 1, 2048);
    /* short contexts (the decode bench's 8,192 tokens: 2,048 blocks) over the distributions above */
    k2t_topk_case("short: distinct, nb 2047-2049", 0, 8187, 10, 4, 512);
    k2t_topk_case("short: ties", 1, 8187, 10, 4, 512);
    k2t_topk_case("short: all equal", 2, 8187, 6, 4, 512);
    k2t_topk_case("short: +0/-0", 3, 8187, 6, 4, 700);
    k2t_topk_case("short: infinities", 7, 8187, 6, 4, 100);
    k2t_topk_case("short: dense threshold bin", 8, 8187, 6, 4, 2000);
    k2t_topk_case("short: nb 1022-1027, r = 1", 4, 1021, 6, 1, 1000);
    k2t_topk_case("short: k = 1 of ties", 1, 3000, 3, 4, 1);
}

/* ---------------------------------------------------------------------------------------------- */
/* QSA sparse attention                                                                            */
/* ---------------------------------------------------------------------------------------------- */

typedef struct k2t_attn {
    int nh, nkv, hd, r, topk, M, pos0, ntok; /* ntok: tokens 0..ntok-1 hold K/V */
    float *q;          /* [M][nh*2*hd] */
    float *K, *V;      /* [ntok][kvd] logical, fp16-exact values */
    int32_t *sel, *nsel; /* [M][topk], [M] */
} k2t_attn;

static void k2t_attn_init(k2t_attn *c, int nh, int nkv, int hd, int r, int topk, int M, int pos0, uint64_t seed) {
    int kvd = nkv * hd;
    memset(c, 0, sizeof *c);
    c->nh = nh; c->nkv = nkv; c->hd = hd; c->r = r; c->topk = topk; c->M = M; c->pos0 = pos0; c->ntok = pos0 + M;
    c->q = QSA__ALLOC(float, (size_t)M * nh * 2 * hd);
    c->K = QSA__ALLOC(float, (size_t)c->ntok * kvd);
    c->V = QSA__ALLOC(float, (size_t)c->ntok * kvd);
    c->sel = QSA__ALLOC(int32_t, (size_t)M * (topk ? topk : 1));
    c->nsel = QSA__ALLOC(int32_t, M);
    k2t_seed(seed);
    k2t_fill(c->q, (size_t)M * nh * 2 * hd, -1, 1);
    for (size_t i = 0; i < (size_t)M * nh * 2 * hd; i++) if ((i / hd) % 2 == 0) c->q[i] *= 3.0f; /* sharper softmax */
    for (size_t i = 0; i < (size_t)c->ntok * kvd; i++) {
        c->K[i] = k2t_f16_round((float)k2t_uniform(-1, 1));
        c->V[i] = k2t_f16_round((float)k2t_uniform(-1, 1));
    }
    float *sc = QSA__ALLOC(float, (size_t)(c->ntok / (r ? r : 1)) + 1);
    for (int t = 0; t < M; t++) {
        int nb = r ? (pos0 + t + 1) / r : 0;
        for (int b = 0; b < nb; b++) sc[b] = (float)k2t_uniform(0, 1);
        c->nsel[t] = r ? qsa__select_blocks(sc, nb, topk, c->sel + (size_t)t * topk) : 0;
    }
    qsa_free(sc);
}

/* One case of the decode-form tests' tables: the shape, the seed and what it covers. */
typedef struct k2t_attn_case {
    int nh, nkv, hd, r, topk, M, pos0;
    uint64_t seed;
    const char *what;
} k2t_attn_case;
static void k2t_attn_init_case(k2t_attn *c, const k2t_attn_case *k) {
    k2t_attn_init(c, k->nh, k->nkv, k->hd, k->r, k->topk, k->M, k->pos0, k->seed);
}
static void k2t_attn_free(k2t_attn *c) {
    qsa_free(c->q); qsa_free(c->K); qsa_free(c->V); qsa_free(c->sel); qsa_free(c->nsel);
}

/* CPU reference through the planner and qsa__attn_head_plan (pool filled from the logical K/V at
   the block table's pages); physical_order as the debug switch. */
static void k2t_attn_cpu(const k2t_attn *c, int ps, int n_pages, const int32_t *bt, int phys, float *out,
                         int32_t *order /* [M][ld] visit order as logical positions, or NULL */, int ld) {
    int kvd = c->nkv * c->hd, grp = c->nh / c->nkv;
    qsa__pool pool;
    memset(&pool, 0, sizeof pool);
    pool.page_size = ps;
    pool.n_pages = n_pages;
    pool.n_qsa = 1;
    pool.kvd = kvd;
    pool.k = QSA__ALLOC(float, (size_t)n_pages * ps * kvd);
    pool.v = QSA__ALLOC(float, (size_t)n_pages * ps * kvd);
    for (size_t i = 0; i < (size_t)n_pages * ps * kvd; i++) pool.k[i] = pool.v[i] = qsa__f16_to_f32(0x7e00); /* NaN */
    for (int p = 0; p < c->ntok; p++) {
        memcpy(qsa__pool_k(&pool, 0, bt[p / ps], p % ps), c->K + (size_t)p * kvd, sizeof(float) * kvd);
        memcpy(qsa__pool_v(&pool, 0, bt[p / ps], p % ps), c->V + (size_t)p * kvd, sizeof(float) * kvd);
    }
    qsa__plan pl;
    memset(&pl, 0, sizeof pl);
    float *acc = QSA__ALLOC(float, c->hd);
    for (int t = 0; t < c->M; t++) {
        int64_t pos = c->pos0 + t;
        int nb = c->r ? (int)((pos + 1) / c->r) : 0;
        qsa__plan_build(&pl, c->sel + (size_t)t * c->topk, c->nsel[t], nb, c->r ? c->r : 1, pos, ps, bt, phys);
        if (order) {
            int k = 0;
            for (int s = 0; s < pl.n_seg; s++)
                for (int j = 0; j < pl.seg[s].len; j++) order[(size_t)t * ld + k++] = pl.seg[s].logical + j;
        }
        for (int h = 0; h < c->nh; h++) {
            const float *qh = c->q + ((size_t)t * c->nh + h) * 2 * c->hd, *gate = qh + c->hd;
            float *oh = out + ((size_t)t * c->nh + h) * c->hd;
            qsa__attn_head_plan(&pool, 0, &pl, qh, h / grp, c->hd, oh, acc);
            for (int d = 0; d < c->hd; d++) oh[d] *= qsa__sigmoid(gate[d]);
        }
    }
    qsa_free(acc);
    qsa_free(pl.seg);
    qsa__pool_destroy(&pool);
}

/* The fp16 pool of n_pages pages of ps tokens holding the case's K or V (src) at block table bt,
   NaN in the slots no token uses. */
static uint16_t *k2t_attn_pool(const k2t_attn *c, int ps, int n_pages, const int32_t *bt, const float *src) {
    int kvd = c->nkv * c->hd;
    size_t slots = (size_t)n_pages * ps;
    uint16_t *P = QSA__ALLOC(uint16_t, slots * kvd);
    if (!P) return NULL;
    memset(P, 0xFF, slots * kvd * 2);
    for (int p = 0; p < c->ntok; p++)
        for (int i = 0; i < kvd; i++)
            P[((size_t)bt[p / ps] * ps + p % ps) * kvd + i] = qsa__f32_to_f16(src[(size_t)p * kvd + i]);
    return P;
}

static int k2t_attn_heads = 1; /* query heads per block (grid y = nh / heads) */

/* GPU: pages of `ps` tokens in a pool of n_pages, block table bt; queries [t0, t0+M) of the case
   in one launch (block threads); phys: visit in physical order (qsa_k_attn_phys_order first,
   whose list is returned in order [M][ld] when not NULL).  out [M][nh*hd]. */
static qsa_result k2t_attn_gpu(const k2t_attn *c, int ps, int n_pages, const int32_t *bt, int t0, int M, int block,
                               int phys, float *out, int32_t *order, int ld) {
    int kvd = c->nkv * c->hd, np = (c->ntok + ps - 1) / ps;
    size_t slots = (size_t)n_pages * ps;
    uint16_t *Kp = k2t_attn_pool(c, ps, n_pages, bt, c->K), *Vp = k2t_attn_pool(c, ps, n_pages, bt, c->V);
    uint16_t *o16 = QSA__ALLOC(uint16_t, (size_t)M * c->nh * c->hd);
    if (!Kp || !Vp || !o16) {
        qsa_free(Kp); qsa_free(Vp); qsa_free(o16);
        return qsa__fail(QSA_ERR_OUT_OF_MEMORY, "test: out of memory");
    }
    k2t_mem a = {{0}, 0};
    CUdeviceptr dq, dK, dV, dbt, dsel, dns, dout, do16, dtok = 0;
    int topk = c->topk, nh = c->nh, nkv = c->nkv, hd = c->hd, r = c->r, split = QSA_ATTN_SPLIT, pos0 = c->pos0 + t0;
    int ldt = ld > 0 ? ld : 1;
    qsa_result res = k2t_dev(&a, &dq, c->q + (size_t)t0 * nh * 2 * hd, (size_t)M * nh * 2 * hd * 4);
    if (res == QSA_OK) res = k2t_dev(&a, &dK, Kp, slots * kvd * 2);
    if (res == QSA_OK) res = k2t_dev(&a, &dV, Vp, slots * kvd * 2);
    if (res == QSA_OK) res = k2t_dev(&a, &dbt, bt, (size_t)np * 4);
    if (res == QSA_OK) res = k2t_dev(&a, &dsel, c->sel + (size_t)t0 * topk, (size_t)M * (topk ? topk : 1) * 4);
    if (res == QSA_OK) res = k2t_dev(&a, &dns, c->nsel + t0, (size_t)M * 4);
    if (res == QSA_OK) res = k2t_dev(&a, &dout, NULL, (size_t)M * nh * hd * 4);
    if (res == QSA_OK) res = k2t_dev(&a, &do16, NULL, (size_t)M * nh * hd * 2);
    if (res == QSA_OK && phys) {
        res = k2t_dev(&a, &dtok, NULL, (size_t)M * ldt * 4);
        if (res == QSA_OK) {
            void *args[] = {&dbt, &dsel, &dns, &dtok, &pos0, &M, &r, &topk, &ps, &ldt};
            res = k2t_launch("qsa_k_attn_phys_order", (unsigned)M, 1, 256, 0, args);
        }
        if (res == QSA_OK && order) res = k2t_get(order, dtok, (size_t)M * ldt * 4);
    }
    if (res == QSA_OK) {
        void *args[] = {&dq, &dK, &dV, &dbt, &dsel, &dns, &dout, &do16, &pos0, &M, &nh, &nkv, &hd, &r, &topk, &ps, &split,
                        &dtok, &ldt};
        res = k2t_launch("qsa_k_sparse_attn", (unsigned)M, (unsigned)(nh / k2t_attn_heads), (unsigned)block, 0, args);
    }
    if (res == QSA_OK) res = k2t_get(out, dout, (size_t)M * nh * hd * 4);
    if (res == QSA_OK) res = k2t_get(o16, do16, (size_t)M * nh * hd * 2);
    k2t_free(&a);
    if (res == QSA_OK) {
        int mism = 0;
        for (size_t i = 0; i < (size_t)M * nh * hd; i++) mism += o16[i] != qsa__f32_to_f16(out[i]);
        if (mism) res = qsa__fail(QSA_ERR_INTERNAL, "sparse_attn: %d fp16 outputs are not the rounded fp32 outputs", mism);
    }
    qsa_free(Kp); qsa_free(Vp); qsa_free(o16);
    return res;
}

/* Attention output tolerance: scores are 128-term dots of O(1) values in another order, expf within
   2 ulp, fmas: relative errors ~1e-6 on weights of an average of values in [-1, 1]; measured max
   |diff| ~1e-7.  atol 1e-5, rtol 1e-4. */
#define K2T_ATTN_ATOL 1e-5
#define K2T_ATTN_RTOL 1e-4

/* GPU vs CPU for a case at one page size (random pages). */
static void k2t_attn_vs_cpu(const char *what, const k2t_attn *c, int ps, int block) {
    int np = (c->ntok + ps - 1) / ps, n_pages = 2 * np + 3;
    int32_t *bt = QSA__ALLOC(int32_t, n_pages);
    size_t no = (size_t)c->M * c->nh * c->hd;
    float *ref = QSA__ALLOC(float, no), *got = QSA__ALLOC(float, no);
    k2t_block_table(bt, np, n_pages, 77);
    k2t_attn_cpu(c, ps, n_pages, bt, 0, ref, NULL, 0);
    qsa_result r = k2t_attn_gpu(c, ps, n_pages, bt, 0, c->M, block, 0, got, NULL, 0);
    CHECK_OK(r);
    if (r == QSA_OK) CHECKF(k2t_compare(what, got, ref, no, K2T_ATTN_ATOL, K2T_ATTN_RTOL) == 0, "%s: out of tolerance", what);
    qsa_free(bt); qsa_free(ref); qsa_free(got);
}

TEST(gpu, k2_sparse_attn_vs_cpu) {
    K2_NEED_GPU();
    k2t_attn c;
    /* long context: 512 selected blocks of 4 = 2048 tokens + tail = 17 splits (two rounds of a
       512-thread block); GQA 4:2; hd 128 */
    k2t_attn_init(&c, 4, 2, 128, 4, 512, 37, 4963, 61);
    k2t_attn_vs_cpu("sparse_attn hd128 topk512", &c, 16, 256);
    k2t_attn_vs_cpu("sparse_attn hd128 topk512 block128", &c, 400, 128);
    k2t_attn_vs_cpu("sparse_attn hd128 topk512 block512", &c, 400, 512);
    k2t_attn_heads = 2; /* the prefill launch: two query heads of one KV head per block */
    k2t_attn_vs_cpu("sparse_attn hd128 topk512, 2 heads per block", &c, 16, 256);
    k2t_attn_heads = 1;
    k2t_attn_free(&c);
    /* early positions: fewer blocks than topk (all selected), tails of 0..3 tokens; hd 64 */
    k2t_attn_init(&c, 4, 1, 64, 4, 128, 37, 0, 62);
    k2t_attn_vs_cpu("sparse_attn hd64 early", &c, 16, 256);
    k2t_attn_free(&c);
    /* hd 256 (8 dims per lane), 2 splits */
    k2t_attn_init(&c, 2, 2, 256, 4, 100, 9, 2000, 63);
    k2t_attn_vs_cpu("sparse_attn hd256", &c, 784, 256);
    k2t_attn_free(&c);
    /* hd 256, 12 query heads on 2 KV heads (the real shape's grouping), 2 heads per block */
    k2t_attn_init(&c, 24, 2, 256, 4, 100, 5, 2000, 66);
    k2t_attn_heads = 2;
    k2t_attn_vs_cpu("sparse_attn hd256 GQA 12:1, 2 heads per block", &c, 400, 256);
    k2t_attn_heads = 1;
    k2t_attn_free(&c);
    /* hd 96 (3 dims per lane: scalar loads), r = 8 */
    k2t_attn_init(&c, 3, 3, 96, 8, 64, 11, 1500, 64);
    k2t_attn_vs_cpu("sparse_attn hd96 r8", &c, 400, 256);
    k2t_attn_free(&c);
    /* r = 0: no indexer, every token attended (dense causal), 2 splits */
    k2t_attn_init(&c, 2, 1, 128, 0, 0, 13, 300, 65);
    k2t_attn_vs_cpu("sparse_attn dense", &c, 16, 256);
    k2t_attn_free(&c);
}

/* The device side of a decode-form attention launch (k2t_attn_dec_gpu, k3t_attn_tc_gpu): queries [t0, t0+M)
   of the case as M sequences of one token each on one block table (positions pos0 + t), the output
   poisoned, part_bytes of partials (none: 0), and for the debug visit order (phys)
   qsa_k_attn_phys_order's list, ld per query. */
typedef struct k2t_attn_dev {
    k2t_mem a;
    CUdeviceptr q, K, V, bt, bts, sel, ns, pos, out, o16, part, tok;
    int M, pos0, ld;
} k2t_attn_dev;
static qsa_result k2t_attn_dev_init(k2t_attn_dev *d, const k2t_attn *c, int ps, int n_pages, const int32_t *bt, int t0, int M,
                                    size_t part_bytes, int phys) {
    int kvd = c->nkv * c->hd, np = (c->ntok + ps - 1) / ps, nh = c->nh, hd = c->hd, topk = c->topk, r = c->r;
    size_t slots = (size_t)n_pages * ps, ts = topk ? (size_t)topk : 1;
    memset(d, 0, sizeof *d);
    d->M = M;
    d->pos0 = c->pos0 + t0;
    d->ld = topk * r + r > 0 ? topk * r + r : 1;
    uint16_t *Kp = k2t_attn_pool(c, ps, n_pages, bt, c->K), *Vp = k2t_attn_pool(c, ps, n_pages, bt, c->V);
    int32_t *pos = QSA__ALLOC(int32_t, M);
    uint64_t *bts = QSA__ALLOC(uint64_t, M);
    qsa_result res = Kp && Vp && pos && bts ? QSA_OK : qsa__fail(QSA_ERR_OUT_OF_MEMORY, "test: out of memory");
    if (res == QSA_OK) {
        for (int b = 0; b < M; b++) pos[b] = d->pos0 + b;
        res = k2t_dev(&d->a, &d->q, c->q + (size_t)t0 * nh * 2 * hd, (size_t)M * nh * 2 * hd * 4);
    }
    if (res == QSA_OK) res = k2t_dev(&d->a, &d->K, Kp, slots * kvd * 2);
    if (res == QSA_OK) res = k2t_dev(&d->a, &d->V, Vp, slots * kvd * 2);
    if (res == QSA_OK) res = k2t_dev(&d->a, &d->bt, bt, (size_t)np * 4);
    if (res == QSA_OK) {
        for (int b = 0; b < M; b++) bts[b] = (uint64_t)d->bt;
        res = k2t_dev(&d->a, &d->bts, bts, (size_t)M * 8);
    }
    if (res == QSA_OK) res = k2t_dev(&d->a, &d->sel, c->sel + (size_t)t0 * ts, (size_t)M * ts * 4);
    if (res == QSA_OK) res = k2t_dev(&d->a, &d->ns, c->nsel + t0, (size_t)M * 4);
    if (res == QSA_OK) res = k2t_dev(&d->a, &d->pos, pos, (size_t)M * 4);
    if (res == QSA_OK) res = k2t_dev(&d->a, &d->out, NULL, (size_t)M * nh * hd * 4);
    if (res == QSA_OK) res = k2t_dev(&d->a, &d->o16, NULL, (size_t)M * nh * hd * 2);
    if (res == QSA_OK && part_bytes) res = k2t_dev(&d->a, &d->part, NULL, part_bytes);
    if (res == QSA_OK && phys) {
        res = k2t_dev(&d->a, &d->tok, NULL, (size_t)M * d->ld * 4);
        if (res == QSA_OK) {
            void *args[] = {&d->bt, &d->sel, &d->ns, &d->tok, &d->pos0, &d->M, &r, &topk, &ps, &d->ld};
            res = k2t_launch("qsa_k_attn_phys_order", (unsigned)M, 1, 256, 0, args);
        }
    }
    qsa_free(Kp); qsa_free(Vp); qsa_free(pos); qsa_free(bts);
    return res;
}
/* res of the launches, then the outputs into out [M][nh*hd], checked: out16 the rounded out; the device
   buffers freed */
static qsa_result k2t_attn_dev_finish(k2t_attn_dev *d, qsa_result res, const k2t_attn *c, const char *what, float *out) {
    size_t no = (size_t)d->M * c->nh * c->hd;
    uint16_t *o16 = QSA__ALLOC(uint16_t, no);
    if (res == QSA_OK && !o16) res = qsa__fail(QSA_ERR_OUT_OF_MEMORY, "test: out of memory");
    if (res == QSA_OK) res = k2t_get(out, d->out, no * 4);
    if (res == QSA_OK) res = k2t_get(o16, d->o16, no * 2);
    k2t_free(&d->a);
    if (res == QSA_OK) {
        int mism = 0;
        for (size_t i = 0; i < no; i++) mism += o16[i] != qsa__f32_to_f16(out[i]);
        if (mism) res = qsa__fail(QSA_ERR_INTERNAL, "%s: %d fp16 outputs are not the rounded fp32 outputs", what, mism);
    }
    qsa_free(o16);
    return res;
}

/* GPU, the decode kernels: queries [t0, t0+M) of the case as M sequences of one query each (the same
   block table, positions pos0 + t) through qsa_k_sparse_attn_dec_batch, or query t0 alone through
   qsa_k_sparse_attn_dec (single), hb query heads per block, hw per warp, then qsa_k_sparse_attn_merge.
   Launched twice over a poisoned output.  out [M][nh*hd]. */
static qsa_result k2t_attn_dec_gpu(const k2t_attn *c, int ps, int n_pages, const int32_t *bt, int t0, int M, int single,
                                   int hb, int hw, float *out) {
    int nh = c->nh, nkv = c->nkv, hd = c->hd, r = c->r, topk = c->topk, split = QSA_ATTN_SPLIT;
    int smax = (topk * r + r - 1 + split - 1) / split, rows = nh / hb; /* grid y: groups of hb query heads */
    unsigned threads = 32u * (unsigned)(hb / hw);
    k2t_attn_dev d;
    qsa_result res = k2t_attn_dev_init(&d, c, ps, n_pages, bt, t0, M, (size_t)M * nh * smax * (hd + 2) * 4, 0);
    for (int rep = 0; rep < 2 && res == QSA_OK; rep++) {
        if (rep) res = k2t_poison(d.out, (size_t)M * nh * hd * 4);
        if (res == QSA_OK && single) {
            void *args[] = {&d.q, &d.K, &d.V, &d.bt, &d.sel, &d.ns, &d.pos0, &nh, &nkv, &hd, &r, &ps, &split, &d.part, &smax};
            res = k2t_launch("qsa_k_sparse_attn_dec", (unsigned)smax, (unsigned)rows, threads, 0, args);
        } else if (res == QSA_OK) {
            void *args[] = {&d.q, &d.K, &d.V, &d.bts, &d.sel, &d.ns, &d.pos, &nh, &nkv, &hd, &r, &topk, &ps, &split, &d.part,
                            &smax};
            res = k2t_launch3("qsa_k_sparse_attn_dec_batch", (unsigned)smax, (unsigned)rows, (unsigned)M, threads, 0, args);
        }
        if (res == QSA_OK) { /* positions pos0 + t (single) or pos[t] */
            CUdeviceptr pos = single ? 0 : d.pos;
            void *args[] = {&d.q, &d.part, &d.ns, &pos, &d.pos0, &d.out, &d.o16, &nh, &nkv, &hd, &r, &split, &smax};
            res = k2t_launch("qsa_k_sparse_attn_merge", (unsigned)nh, (unsigned)M, (unsigned)hd, 0, args);
        }
    }
    return k2t_attn_dev_finish(&d, res, c, "sparse_attn_dec", out);
}

/* The decode kernels give qsa_k_sparse_attn's bits: each query of a case as its own sequence (one
   batched launch) and one query through the single-sequence entry, with all the query heads of a KV
   head per block, half of them, two and one (where they divide), each with one head per warp and,
   for an even number of them, two per warp (blocks of up to QSA__ATTN_DEC_THREADS), at hd 128 (GQA 2:1, 17
   splits), hd 256 with the real shape's 12 query heads per KV head, early positions (all blocks selected, tails
   of 0..3 tokens, one split) and 32 query heads on one KV head (more than the tensor-core form takes). */
TEST(gpu, k2_sparse_attn_decode_splits) {
    K2_NEED_GPU();
    static const k2t_attn_case cases[] = {
        {4, 2, 128, 4, 512, 9, 4963, 81, "hd 128, 17 splits"},
        {24, 2, 256, 4, 512, 3, 2500, 82, "hd 256, 12 query heads per KV head"},
        {4, 1, 128, 4, 128, 12, 0, 83, "hd 128, early positions"},
        {32, 1, 128, 4, 128, 3, 700, 84, "hd 128, 32 query heads per KV head (the merge launch past 16)"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        k2t_attn c;
        k2t_attn_init_case(&c, &cases[i]);
        int ps = 16, np = (c.ntok + ps - 1) / ps, n_pages = 2 * np + 5, nq = c.nh / c.nkv;
        size_t no = (size_t)c.M * c.nh * c.hd, per = (size_t)c.nh * c.hd;
        int32_t *bt = QSA__ALLOC(int32_t, n_pages);
        float *ref = QSA__ALLOC(float, no), *got = QSA__ALLOC(float, no);
        k2t_block_table(bt, np, n_pages, 5 + i);
        qsa_result r = k2t_attn_gpu(&c, ps, n_pages, bt, 0, c.M, 512, 0, ref, NULL, 0);
        CHECK_OK(r);
        const int hbs[4] = {nq, nq / 2, 2, 1};
        for (int k = 0; k < 8 && r == QSA_OK; k++) {
            const int hb = hbs[k / 2], hw = 1 + k % 2;
            int seen = 0;
            for (int j = 0; j < k / 2; j++) seen |= hbs[j] == hb;
            if (seen || hb < 1 || nq % hb || hb % hw || 32 * hb / hw > QSA__ATTN_DEC_THREADS) continue;
            r = k2t_attn_dec_gpu(&c, ps, n_pages, bt, 0, c.M, 0, hb, hw, got);
            CHECK_OK(r);
            CHECKF(r != QSA_OK || k2t_same_bits(ref, got, no * 4),
                   "%s, %d heads per block, %d per warp: the batched decode kernel's bits differ", cases[i].what, hb, hw);
            const int t = c.M - 1;
            if (r == QSA_OK) r = k2t_attn_dec_gpu(&c, ps, n_pages, bt, t, 1, 1, hb, hw, got);
            CHECK_OK(r);
            CHECKF(r != QSA_OK || k2t_same_bits(ref + (size_t)t * per, got, per * 4),
                   "%s, %d heads per block, %d per warp: the single-sequence decode kernel's bits differ", cases[i].what,
                   hb, hw);
        }
        qsa_free(bt); qsa_free(ref); qsa_free(got);
        k2t_attn_free(&c);
    }
}

TEST(gpu, k2_sparse_attn_determinism) {
    K2_NEED_GPU();
    k2t_attn c;
    k2t_attn_init(&c, 4, 2, 128, 4, 512, 37, 4963, 71);
    size_t no = (size_t)c.M * c.nh * c.hd, per = (size_t)c.nh * c.hd;
    float *base = QSA__ALLOC(float, no), *got = QSA__ALLOC(float, no), *ref = QSA__ALLOC(float, no),
          *logical = QSA__ALLOC(float, no);
    int32_t *bt = QSA__ALLOC(int32_t, 2 * c.ntok + 8);
    int ld = c.topk * c.r + c.r, first = 1;
    int32_t *order = QSA__ALLOC(int32_t, (size_t)c.M * ld), *order_cpu = QSA__ALLOC(int32_t, (size_t)c.M * ld);
    static const int sizes[3] = {16, 400, 784};
    qsa_result r = QSA_OK;
    /* (1) allocation and page-size invariance: two random placements at each of three page sizes,
       plus the identity placement, all bitwise equal */
    for (int si = 0; si < 3 && r == QSA_OK; si++)
        for (int perm = 0; perm < 3 && r == QSA_OK; perm++) {
            int ps = sizes[si], np = (c.ntok + ps - 1) / ps, n_pages = 2 * np + 5;
            k2t_block_table(bt, np, n_pages, perm ? (uint64_t)(100 * si + perm) : 0);
            r = k2t_attn_gpu(&c, ps, n_pages, bt, 0, c.M, 256, 0, first ? base : got, NULL, 0);
            CHECK_OK(r);
            if (r == QSA_OK && !first)
                CHECKF(k2t_same_bits(base, got, no * 4), "page size %d, placement %d: output bits differ", ps, perm);
            first = 0;
        }
    /* neither the block size nor the query heads per block matter (the prefill launch computes two
       heads of one KV head per block, decode one) */
    if (r == QSA_OK) {
        int np = (c.ntok + 16 - 1) / 16;
        k2t_block_table(bt, np, 2 * np + 5, 1);
        static const struct { int heads, block; const char *what; } shapes[] = {
            {1, 128, "block of 128 threads"},
            {1, 512, "block of 512 threads (the decode launch)"},
            {2, 256, "2 query heads per block (the prefill launch)"},
            {2, 64, "2 query heads per block of 64 threads"},
        };
        for (size_t i = 0; i < sizeof shapes / sizeof shapes[0] && r == QSA_OK; i++) {
            k2t_attn_heads = shapes[i].heads;
            r = k2t_attn_gpu(&c, 16, 2 * np + 5, bt, 0, c.M, shapes[i].block, 0, got, NULL, 0);
            CHECK_OK(r);
            CHECKF(r != QSA_OK || k2t_same_bits(base, got, no * 4), "%s: output bits differ from 1 head per block of 256",
                   shapes[i].what);
        }
        k2t_attn_heads = 1;
    }
    /* (3) batch invariance: a query alone (M = 1) gives the bits it has inside M = 37 */
    static const int alone[3] = {0, 17, 36};
    for (int i = 0; i < 3 && r == QSA_OK; i++) {
        int np = (c.ntok + 400 - 1) / 400;
        k2t_block_table(bt, np, 2 * np + 5, 9);
        r = k2t_attn_gpu(&c, 400, 2 * np + 5, bt, alone[i], 1, 256, 0, got, NULL, 0);
        CHECK_OK(r);
        CHECKF(r != QSA_OK || k2t_same_bits(base + (size_t)alone[i] * per, got, per * 4),
               "query %d alone differs from the same query in a batch of %d", alone[i], c.M);
    }
    /* (2) the physical-order debug switch: its visit order is the CPU planner's physical order, its
       output matches the CPU's physical-order output, and with scattered pages it changes the bits
       (the test of allocation invariance can fail); with pages in logical order it changes nothing */
    for (int perm = 0; perm < 2 && r == QSA_OK; perm++) {
        int ps = 16, np = (c.ntok + ps - 1) / ps, n_pages = 2 * np + 5;
        k2t_block_table(bt, np, n_pages, perm ? 4242 : 0);
        memset(order, 0xFF, sizeof(int32_t) * (size_t)c.M * ld);
        r = k2t_attn_gpu(&c, ps, n_pages, bt, 0, c.M, 256, 1, got, order, ld);
        CHECK_OK(r);
        if (r != QSA_OK) break;
        k2t_attn_cpu(&c, ps, n_pages, bt, 1, ref, order_cpu, ld);
        int bado = 0;
        for (int t = 0; t < c.M; t++) {
            int64_t pos = c.pos0 + t;
            int nb = (int)((pos + 1) / c.r), ntok = c.nsel[t] * c.r + (int)(pos + 1 - (int64_t)nb * c.r);
            for (int k = 0; k < ntok; k++) bado += order[(size_t)t * ld + k] != order_cpu[(size_t)t * ld + k];
        }
        CHECKF(bado == 0, "placement %d: %d tokens of the physical visit order differ from qsa__plan_build's", perm, bado);
        CHECKF(k2t_compare("sparse_attn physical order", got, ref, no, K2T_ATTN_ATOL, K2T_ATTN_RTOL) == 0,
               "physical order: out of tolerance against the CPU physical-order plan");
        if (perm == 0) {
            CHECKF(k2t_same_bits(got, base, no * 4), "pages in logical order: physical order must give the logical bits");
            memcpy(logical, base, no * 4);
        } else {
            size_t diff = 0;
            for (size_t i = 0; i < no; i++) diff += memcmp(&got[i], &logical[i], 4) != 0;
            printf("    physical order on scattered pages: %zu of %zu outputs change bits (must be > 0)\n", diff, no);
            CHECKF(diff > 0, "the physical-order switch did not change any output bit: the invariance test could not fail");
        }
    }
    k2t_attn_free(&c);
    qsa_free(base); qsa_free(got); qsa_free(ref); qsa_free(logical); qsa_free(bt); qsa_free(order); qsa_free(order_cpu);
}

/* GPU, the tensor-core attention: queries [t0, t0+M) of the case through qsa_k_sparse_attn_tc (form
   0: grid x 1, a block per (query, KV head) running all the splits; form 1: grid x smax, a block per
   split, its partials merged by a qsa_k_sparse_attn_merge_tc launch) or qsa_k_sparse_attn_tc_batch (forms
   2 and 3 likewise: the queries as M sequences of one token, one block table); phys: the debug visit
   order (form 0 only, qsa_k_attn_phys_order first).  Launched twice over a poisoned output.  out
   [M][nh*hd]. */
static qsa_result k3t_attn_tc_gpu(const k2t_attn *c, int ps, int n_pages, const int32_t *bt, int t0, int M, int form,
                                  int phys, float *out) {
    int nh = c->nh, nkv = c->nkv, hd = c->hd, r = c->r, topk = c->topk, split = QSA_ATTN_SPLIT;
    int smax = form % 2 ? (topk * r + r - 1 + split - 1) / split : 1;
    if (smax < 1) smax = 1;
    k2t_attn_dev d;
    qsa_result res = k2t_attn_dev_init(&d, c, ps, n_pages, bt, t0, M, form % 2 ? (size_t)M * QSA__ATTN_TC_PART(nkv, smax, hd) : 0,
                                       phys);
    for (int rep = 0; rep < 2 && res == QSA_OK; rep++) {
        if (rep) res = k2t_poison(d.out, (size_t)M * nh * hd * 4);
        if (res == QSA_OK && form < 2) {
            void *args[] = {&d.q, &d.K, &d.V, &d.bt, &d.sel, &d.ns, &d.out, &d.o16, &d.pos0, &nh, &nkv, &hd, &r, &topk, &ps,
                            &d.tok, &d.ld, &d.part, &smax};
            res = k2t_launch3("qsa_k_sparse_attn_tc", (unsigned)smax, (unsigned)nkv, (unsigned)M, 128, QSA__ATTN_TC_SMEM, args);
        } else if (res == QSA_OK) {
            void *args[] = {&d.q, &d.K, &d.V, &d.bts, &d.sel, &d.ns, &d.out, &d.o16, &d.pos, &nh, &nkv, &hd, &r, &topk, &ps,
                            &d.part, &smax};
            res = k2t_launch3("qsa_k_sparse_attn_tc_batch", (unsigned)smax, (unsigned)nkv, (unsigned)M, 128,
                              QSA__ATTN_TC_SMEM, args);
        }
        if (res == QSA_OK && form % 2) { /* the split forms' merge: positions pos0 + t (form 1) or pos[t] (form 3) */
            CUdeviceptr pos = form == 3 ? d.pos : 0;
            void *args[] = {&d.q, &d.part, &d.ns, &pos, &d.pos0, &d.out, &d.o16, &nh, &nkv, &hd, &r, &split, &smax};
            res = k2t_launch3("qsa_k_sparse_attn_merge_tc", (unsigned)nkv, (unsigned)M, (unsigned)(hd / 8 + 4), 128, 0, args);
        }
    }
    return k2t_attn_dev_finish(&d, res, c, "sparse_attn_tc", out);
}

/* The tensor-core attention (sm_80+ modules): against the CPU reference within the fp32 kernels'
   tolerance; one set of bits for its four launch forms (prefill's block per query, decode's block per
   split, the batched entry's two), for a query alone and inside a chunk, and for any page size and
   placement; the physical-order debug switch changes them on scattered pages (and matches the CPU's
   physical-order plan).  Cases: hd 128 with 17 splits (GQA 2:1), hd 256 with the real shape's 12
   query heads per KV head, 16 query heads on one KV head, early positions (one split, tails of 0..3
   tokens), no indexer (r = 0: every token, the block-per-query forms only). */
TEST(gpu, k3_sparse_attn_tc) {
    K2_NEED_GPU();
    if (atoi(strchr(K2G_.arch, '_') + 1) < 80) SKIP("needs an sm_80+ module (this one is %s)", K2G_.arch);
    static const k2t_attn_case cases[] = {
        {4, 2, 128, 4, 512, 9, 4963, 91, "hd 128, 17 splits"},
        {24, 2, 256, 4, 512, 3, 2500, 92, "hd 256, 12 query heads per KV head"},
        {16, 1, 128, 4, 100, 5, 1000, 93, "hd 128, 16 query heads per KV head"},
        {4, 1, 128, 4, 128, 12, 0, 94, "hd 128, early positions"},
        {2, 1, 256, 0, 0, 6, 300, 95, "hd 256, no indexer"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        k2t_attn c;
        k2t_attn_init_case(&c, &cases[i]);
        size_t no = (size_t)c.M * c.nh * c.hd, per = (size_t)c.nh * c.hd;
        int np16 = (c.ntok + 15) / 16, cap = 2 * np16 + 5, forms = c.r ? 4 : 1;
        int32_t *bt = QSA__ALLOC(int32_t, cap);
        float *ref = QSA__ALLOC(float, no), *base = QSA__ALLOC(float, no), *got = QSA__ALLOC(float, no);
        k2t_block_table(bt, np16, cap, 7 + i);
        k2t_attn_cpu(&c, 16, cap, bt, 0, ref, NULL, 0);
        qsa_result r = k3t_attn_tc_gpu(&c, 16, cap, bt, 0, c.M, 0, 0, base);
        CHECK_OK(r);
        if (r == QSA_OK)
            CHECKF(k2t_compare(cases[i].what, base, ref, no, K2T_ATTN_ATOL, K2T_ATTN_RTOL) == 0, "%s: out of tolerance", cases[i].what);
        for (int f = 1; f < forms && r == QSA_OK; f++) {
            r = k3t_attn_tc_gpu(&c, 16, cap, bt, 0, c.M, f, 0, got);
            CHECK_OK(r);
            CHECKF(r != QSA_OK || k2t_same_bits(base, got, no * 4), "%s, form %d: the bits differ from form 0", cases[i].what, f);
        }
        for (int f = 0; f < forms && r == QSA_OK; f++) { /* the last query alone */
            const int t = c.M - 1;
            r = k3t_attn_tc_gpu(&c, 16, cap, bt, t, 1, f, 0, got);
            CHECK_OK(r);
            CHECKF(r != QSA_OK || k2t_same_bits(base + (size_t)t * per, got, per * 4),
                   "%s, form %d: query %d alone differs from the chunk", cases[i].what, f, t);
        }
        static const int sizes[3] = {16, 400, 784};
        for (int si = 0; si < 3 && r == QSA_OK; si++)
            for (int perm = 0; perm < 2 && r == QSA_OK; perm++) {
                int ps = sizes[si], np = (c.ntok + ps - 1) / ps;
                k2t_block_table(bt, np, 2 * np + 5, perm ? (uint64_t)(300 + 10 * si + i) : 0);
                r = k3t_attn_tc_gpu(&c, ps, 2 * np + 5, bt, 0, c.M, (si + perm) % forms, 0, got);
                CHECK_OK(r);
                CHECKF(r != QSA_OK || k2t_same_bits(base, got, no * 4), "%s, pages of %d, placement %d: the bits differ",
                       cases[i].what, ps, perm);
            }
        if (i == 0 && r == QSA_OK) { /* the physical-order switch */
            k2t_block_table(bt, np16, cap, 4242);
            r = k3t_attn_tc_gpu(&c, 16, cap, bt, 0, c.M, 0, 1, got);
            CHECK_OK(r);
            if (r == QSA_OK) {
                k2t_attn_cpu(&c, 16, cap, bt, 1, ref, NULL, 0);
                CHECKF(k2t_compare("sparse_attn_tc physical order", got, ref, no, K2T_ATTN_ATOL, K2T_ATTN_RTOL) == 0,
                       "physical order: out of tolerance against the CPU physical-order plan");
                size_t diff = 0;
                for (size_t k = 0; k < no; k++) diff += memcmp(&got[k], &base[k], 4) != 0;
                printf("    tensor-core attention, physical order on scattered pages: %zu of %zu outputs change bits (must be > 0)\n",
                       diff, no);
                CHECKF(diff > 0, "the physical-order switch did not change any output bit");
                k2t_block_table(bt, np16, cap, 0);
                r = k3t_attn_tc_gpu(&c, 16, cap, bt, 0, c.M, 0, 1, got);
                CHECK_OK(r);
                CHECKF(r != QSA_OK || k2t_same_bits(base, got, no * 4), "pages in logical order: physical order must give the logical bits");
            }
        }
        qsa_free(bt); qsa_free(ref); qsa_free(base); qsa_free(got);
        k2t_attn_free(&c);
    }
}

#endif /* QSA_NO_CUDA */
