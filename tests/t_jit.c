/* tests/t_jit.c - runtime loading of the GPU stack, NVRTC compilation of kernels.cu (group jit) and
 * every kernel against a plain C reference on the GPU (group gpu).
 *
 *   cpu  loader failures are QSA_ERR_NO_DEVICE with a reason; check-macro messages; the embedded
 *        source equals kernels.cu.
 *   jit  needs an NVRTC (QSA_NVRTC_LIB or the default names): compute_70 PTX when the library can,
 *        native (device arch, or the newest the NVRTC knows up to 9.0) PTX and CUBIN, target
 *        selection, and a planted syntax error reported as kernels.cu(LINE).
 *   gpu  needs libcuda, a device and an NVRTC: the module is built with the runtime's own target
 *        choice (compute_70 when possible) and each kernel is compared with a C reference on random
 *        inputs: |gpu - ref| <= atol + rtol * |ref|, tolerances documented next to each check.
 */
#ifndef QSA_NO_CUDA

/* ---------------------------------------------------------------------------------------------- */
/* helpers                                                                                         */
/* ---------------------------------------------------------------------------------------------- */

/* Does [hay, hay+n) contain the n2 bytes of needle? (PTX is text, a CUBIN is binary.) */
static int jit_mem_has(const char *hay, size_t n, const char *needle, size_t n2) {
    if (n2 == 0) return 1;
    for (size_t i = 0; i + n2 <= n; i++)
        if (hay[i] == needle[0] && !memcmp(hay + i, needle, n2)) return 1;
    return 0;
}

/* The kernel entry points, read from the embedded source: every `extern "C" __global__ void NAME(`. */
#define JIT_MAX_KERNELS 64
static int jit_kernel_names(char names[][64], int cap) {
    char *src = qsa__kernels_source();
    int n = 0;
    const char *key = "extern \"C\" __global__ void ";
    for (const char *p = src ? strstr(src, key) : NULL; p && n < cap; p = strstr(p + 1, key)) {
        const char *s = p + strlen(key);
        size_t k = 0;
        while (k < 63 && (s[k] == '_' || (s[k] >= 'a' && s[k] <= 'z') || (s[k] >= 'A' && s[k] <= 'Z') ||
                          (s[k] >= '0' && s[k] <= '9')))
            k++;
        if (s[k] != '(') continue; /* e.g. the `qsa_k_<op>` of a comment */
        memcpy(names[n], s, k);
        names[n][k] = 0;
        n++;
    }
    qsa_free(src);
    return n;
}

/* Checks that every kernel entry is in a PTX (".entry NAME(") or a CUBIN (symbol "NAME\0"). */
static void jit_check_entries(const char *image, size_t len, int cubin) {
    char names[JIT_MAX_KERNELS][64];
    int n = jit_kernel_names(names, JIT_MAX_KERNELS);
    CHECKF(n >= 5, "found only %d kernels in kernels.cu", n);
    for (int i = 0; i < n; i++) {
        char needle[128];
        size_t k;
        if (cubin) {
            k = strlen(names[i]) + 1; /* with its NUL: no prefix matches */
            memcpy(needle, names[i], k);
        } else {
            snprintf(needle, sizeof needle, ".entry %.63s(", names[i]);
            k = strlen(needle);
        }
        CHECKF(jit_mem_has(image, len, needle, k), "%s has no entry %s", cubin ? "CUBIN" : "PTX", names[i]);
    }
}

/* The environment variable `name` is unset for the duration of a test and restored afterwards. */
typedef struct jit_env_saved { const char *name; char value[1024]; int was_set; } jit_env_saved;
static void jit_env_unset(jit_env_saved *s, const char *name) {
    const char *v = getenv(name);
    s->name = name;
    s->was_set = v != NULL;
    snprintf(s->value, sizeof s->value, "%s", v ? v : "");
    unsetenv(name);
}
static void jit_env_restore(jit_env_saved *s) {
    if (s->was_set) setenv(s->name, s->value, 1);
    else unsetenv(s->name);
}

/* The newest target the loaded NVRTC knows that does not exceed `cc` (70 when it has no list). */
static int jit_native_cc(int cc) {
    int best = 0;
    if (qsa__nvrtc.narchs == 0) return cc;
    for (int i = 0; i < qsa__nvrtc.narchs; i++)
        if (qsa__nvrtc.archs[i] <= cc && qsa__nvrtc.archs[i] > best) best = qsa__nvrtc.archs[i];
    return best;
}

/* ---------------------------------------------------------------------------------------------- */
/* cpu: loading failures and messages (no GPU stack needed)                                        */
/* ---------------------------------------------------------------------------------------------- */

TEST(cpu, dynload_missing_library_is_no_device) {
    static const char *const bogus[] = {"/nonexistent/qsa/libnvrtc.so.99", "libqsa-no-such-lib.so.7"};
    qsa__nvrtc_api nv;
    CHECK_ERR(qsa__nvrtc_load_from(NULL, bogus, 2, &nv), QSA_ERR_NO_DEVICE, "/nonexistent/qsa/libnvrtc.so.99");
    CHECK(strstr(qsa_last_error(), "libqsa-no-such-lib.so.7") != NULL);
    CHECK(nv.lib == NULL);
    qsa__cuda_api cu;
    CHECK_ERR(qsa__cuda_load_from(NULL, bogus, 2, &cu), QSA_ERR_NO_DEVICE, "libcuda");
    qsa__nccl_api nc;
    CHECK_ERR(qsa__nccl_load_from(NULL, bogus + 1, 1, &nc), QSA_ERR_NO_DEVICE, "libqsa-no-such-lib.so.7");
    /* a forced path (the QSA_*_LIB variables) is the only candidate and is named in the message */
    setenv("QSA_TEST_FORCED_LIB", "/nonexistent/forced/libnccl.so.2", 1);
    static const char *const real[] = {"libm.so.6"};
    CHECK_ERR(qsa__nccl_load_from("QSA_TEST_FORCED_LIB", real, 1, &nc), QSA_ERR_NO_DEVICE,
              "QSA_TEST_FORCED_LIB=/nonexistent/forced/libnccl.so.2");
    unsetenv("QSA_TEST_FORCED_LIB");
}

TEST(cpu, dynload_missing_symbol_is_no_device) {
    /* a library that exists but is not what we asked for */
    static const char *const libm[] = {"libm.so.6"};
    qsa__nvrtc_api nv;
    CHECK_ERR(qsa__nvrtc_load_from(NULL, libm, 1, &nv), QSA_ERR_NO_DEVICE, "missing symbol nvrtcVersion");
    qsa__cuda_api cu;
    CHECK_ERR(qsa__cuda_load_from(NULL, libm, 1, &cu), QSA_ERR_NO_DEVICE, "missing symbol cuInit");
    CHECK(cu.lib == NULL && cu.cuInit == NULL);
}

TEST(cpu, dynload_stub_driver_is_no_device) {
    /* The toolkit's stub libcuda exports everything but cuInit fails: like a machine without a GPU. */
    static const char *const stubs[] = {"/usr/local/cuda/lib64/stubs/libcuda.so"};
    if (!qsa__file_exists(stubs[0])) SKIP("no CUDA toolkit stub libcuda at %s", stubs[0]);
    qsa__cuda_api cu;
    qsa_result r = qsa__cuda_load_from(NULL, stubs, 1, &cu);
    CHECK(r == QSA_ERR_NO_DEVICE);
    CHECKF(strstr(qsa_last_error(), "cuInit") != NULL, "message: %s", qsa_last_error());
}

TEST(cpu, dynload_check_macro_messages) {
    /* The messages name the call (without the table prefix), the error and the line. */
    CHECK(qsa__cu_check(0, "x", 1) == QSA_OK);
    CHECK_ERR(qsa__cu_check(2, "qsa__cu.cuMemAlloc_v2(&p, bytes)", 123), QSA_ERR_OUT_OF_MEMORY,
              "cuMemAlloc_v2(&p, bytes) failed");
    CHECK(strstr(qsa_last_error(), "line 123") != NULL);
    CHECK(strstr(qsa_last_error(), "qsa__cu.") == NULL);
    CHECK_ERR(qsa__cu_check(700, "qsa__cu.cuCtxSynchronize()", 7), QSA_ERR_CUDA, "cuCtxSynchronize() failed");
    CHECK_ERR(qsa__nccl_check(5, "qsa__nccl.ncclGroupEnd()", 9), QSA_ERR_NCCL, "ncclGroupEnd() failed: ncclInvalidUsage");
    CHECK_ERR(qsa__nvrtc_check(6, "qsa__nvrtc.nvrtcCompileProgram(p, 1, o)", 11), QSA_ERR_NVRTC,
              "nvrtcCompileProgram(p, 1, o) failed");
}

TEST(cpu, kernels_source_matches_kernels_cu) {
    char *src = qsa__kernels_source();
    const char *head = "#line 1 \"kernels.cu\"\n";
    CHECK(src != NULL);
    if (!src) return;
    CHECKF(!strncmp(src, head, strlen(head)), "the embedded source must start with %s", head);
    char *file = NULL;
    size_t len = 0;
    if (qsa__read_file(test_path("kernels.cu"), &file, &len) == QSA_OK) {
        CHECKF(strlen(src) == strlen(head) + len && !memcmp(src + strlen(head), file, len),
               "kernels.cu.inc is stale: run make (the embedded source differs from kernels.cu)");
        qsa_free(file);
    } else {
        qsa_clear_error(); /* not run from the repository root: only the header is checked */
    }
    qsa_free(src);
}

/* ---------------------------------------------------------------------------------------------- */
/* jit: NVRTC                                                                                      */
/* ---------------------------------------------------------------------------------------------- */

#define JIT_NEED_NVRTC() do { if (qsa__nvrtc_load() != QSA_OK) SKIP("no NVRTC: %s", qsa_last_error()); } while (0)

TEST(jit, nvrtc_loads) {
    JIT_NEED_NVRTC();
    printf("    NVRTC %d.%d from %s; targets:", qsa__nvrtc.major, qsa__nvrtc.minor, qsa__nvrtc.path);
    for (int i = 0; i < qsa__nvrtc.narchs; i++) printf(" %d", qsa__nvrtc.archs[i]);
    printf("%s\n", qsa__nvrtc.narchs ? "" : " (no list: nvrtcGetSupportedArchs absent)");
    CHECK(qsa__nvrtc.major >= 11);
    CHECK(qsa__nvrtc.nvrtcCompileProgram != NULL);
}

TEST(jit, compile_compute_70) {
    JIT_NEED_NVRTC();
    if (!qsa__nvrtc_supports(70))
        SKIP("NVRTC %d.%d (%s) cannot target compute_70; set QSA_NVRTC_LIB to an NVRTC 11.8-12.x", qsa__nvrtc.major,
             qsa__nvrtc.minor, qsa__nvrtc.path);
    char *ptx = NULL, *log = NULL;
    size_t len = 0;
    double t0 = qsa__now();
    CHECK_OK(qsa__kernels_compile("compute_70", 0, NULL, 0, &ptx, &len, &log, NULL, 0));
    if (!ptx) { qsa_free(log); return; }
    printf("    NVRTC %d.%d (%s): compute_70 PTX, %zu bytes in %.0f ms\n", qsa__nvrtc.major, qsa__nvrtc.minor,
           qsa__nvrtc.path, len, 1e3 * (qsa__now() - t0));
    CHECK(len == strlen(ptx));
    CHECK(strstr(ptx, ".target sm_70") != NULL);
    jit_check_entries(ptx, len, 0);
    /* the sm_70 path must not use instructions of later architectures (SPEC section 6) */
    CHECK(strstr(ptx, "ldmatrix") == NULL);
    CHECK(strstr(ptx, "cp.async") == NULL);
    CHECK(strstr(ptx, ".bf16") == NULL);
    CHECK(strstr(ptx, "mma.sync.aligned.m8n8k4") == NULL);
    CHECK(strstr(ptx, "wmma.mma.sync.aligned.row.col.m16n16k16.f32.f32") != NULL);
    CHECKF(!log || !strstr(log, "kernels.cu("), "NVRTC warnings:\n%s", log);
    qsa_free(ptx);
    qsa_free(log);
}

TEST(jit, compile_native) {
    JIT_NEED_NVRTC();
    /* the device's arch when there is one, else the newest target up to 9.0 the NVRTC knows */
    qsa__gpu_info gi;
    int cc = qsa__cu_device_info(0, &gi) == QSA_OK ? gi.cc_major * 10 + gi.cc_minor : 90;
    qsa_clear_error();
    int native = jit_native_cc(cc);
    if (!native) SKIP("NVRTC %d.%d knows no target up to compute %d", qsa__nvrtc.major, qsa__nvrtc.minor, cc);
    char arch[32], *image = NULL, *log = NULL;
    size_t len = 0;
    snprintf(arch, sizeof arch, "compute_%d", native);
    CHECK_OK(qsa__kernels_compile(arch, 0, NULL, 0, &image, &len, &log, NULL, 0));
    if (image) {
        char target[32];
        snprintf(target, sizeof target, ".target sm_%d", native);
        CHECK(strstr(image, target) != NULL);
        jit_check_entries(image, len, 0);
        printf("    %s: PTX %zu bytes\n", arch, len);
    }
    qsa_free(image);
    qsa_free(log);
    image = log = NULL;
    /* sm_XY: a CUBIN (ELF) when the NVRTC can produce one */
    snprintf(arch, sizeof arch, "sm_%d", native);
    CHECK_OK(qsa__kernels_compile(arch, 0, NULL, 0, &image, &len, &log, NULL, 0));
    if (image && qsa__nvrtc.nvrtcGetCUBIN) {
        CHECK(len > 4 && !memcmp(image, "\177ELF", 4));
        jit_check_entries(image, len, 1);
        printf("    %s: CUBIN %zu bytes\n", arch, len);
    }
    qsa_free(image);
    qsa_free(log);
}

TEST(jit, pick_arch) {
    JIT_NEED_NVRTC();
    jit_env_saved saved;
    char arch[32];
    jit_env_unset(&saved, "QSA_ARCH");
    CHECK_OK(qsa__nvrtc_pick_arch(NULL, 0, arch, sizeof arch));
    CHECK(!strcmp(arch, qsa__nvrtc_supports(70) ? "compute_70" : "compute_90"));
    CHECK_OK(qsa__nvrtc_pick_arch(NULL, 86, arch, sizeof arch));
    if (qsa__nvrtc_supports(70)) CHECK(!strcmp(arch, "compute_70"));
    else if (qsa__nvrtc_supports(86)) CHECK(!strcmp(arch, "compute_86"));
    CHECK_OK(qsa__nvrtc_pick_arch("sm_80", 0, arch, sizeof arch));
    CHECK(!strcmp(arch, "sm_80"));
    CHECK_OK(qsa__nvrtc_pick_arch("75", 0, arch, sizeof arch));
    CHECK(!strcmp(arch, "compute_75"));
    CHECK_OK(qsa__nvrtc_pick_arch("sm_90a", 0, arch, sizeof arch));
    CHECK(!strcmp(arch, "sm_90a"));
    CHECK_ERR(qsa__nvrtc_pick_arch("volta", 0, arch, sizeof arch), QSA_ERR_INVALID_ARGUMENT, "'volta'");
    CHECK_ERR(qsa__nvrtc_pick_arch("compute_7", 0, arch, sizeof arch), QSA_ERR_INVALID_ARGUMENT, "compute_7");
    setenv("QSA_ARCH", "sm_90", 1);
    CHECK_OK(qsa__nvrtc_pick_arch(NULL, 70, arch, sizeof arch));
    CHECK(!strcmp(arch, "sm_90"));
    CHECK_OK(qsa__nvrtc_pick_arch("compute_80", 70, arch, sizeof arch)); /* the parameter wins */
    CHECK(!strcmp(arch, "compute_80"));
    jit_env_restore(&saved);
}

TEST(jit, syntax_error_names_line) {
    JIT_NEED_NVRTC();
    char *src = qsa__kernels_source();
    CHECK(src != NULL);
    if (!src) return;
    /* Plant a bad line just before the third kernel: it becomes line N of kernels.cu, at file scope. */
    const char *bad = "__device__ int qsa_planted_error = ;\n";
    int line = 0, kernels = 0, n = 0;
    size_t at = 0;
    for (size_t i = 0; src[i]; i++) {
        if (i > 0 && src[i - 1] != '\n') continue;
        if (i > 0) line++; /* src line 0 is the #line directive; then kernels.cu lines 1, 2, ... */
        if (!strncmp(src + i, "extern \"C\" __global__", 21) && ++kernels == 3) {
            n = line;
            at = i;
            break;
        }
    }
    CHECKF(n > 100, "third kernel at line %d", n);
    size_t len = strlen(src), blen = strlen(bad);
    char *planted = QSA__ALLOC(char, len + blen + 1);
    memcpy(planted, src, at);
    memcpy(planted + at, bad, blen);
    memcpy(planted + at + blen, src + at, len - at + 1);
    char arch[32], *image = NULL, *log = NULL, want[64];
    size_t ilen = 0;
    CHECK_OK(qsa__nvrtc_pick_arch(NULL, 0, arch, sizeof arch));
    snprintf(want, sizeof want, "kernels.cu(%d)", n);
    CHECK_ERR(qsa__nvrtc_compile(planted, "kernels.cu", NULL, 0, arch, &image, &ilen, &log), QSA_ERR_NVRTC, want);
    CHECK(strstr(qsa_last_error(), "error") != NULL);
    CHECK(log && strstr(log, want));
    CHECK(image == NULL && ilen == 0);
    if (T_.verbose) printf("    %s\n", qsa_last_error());
    qsa_free(log);
    qsa_free(planted);
    qsa_free(src);
}

/* ---------------------------------------------------------------------------------------------- */
/* gpu: each kernel against a C reference                                                          */
/* ---------------------------------------------------------------------------------------------- */

typedef struct jit_gpu {
    int tried;
    qsa_result status;
    char why[1024];
    CUcontext ctx;
    CUmodule mod;
    qsa__gpu_info info;
    char arch[32];
} jit_gpu;
static jit_gpu G_;

static qsa_result jit_gpu_init_(void) {
    CUdevice dev;
    char *image = NULL, *log = NULL;
    size_t len = 0;
    QSA__TRY(qsa__cuda_load());
    QSA__TRY(qsa__nvrtc_load());
    QSA__TRY(qsa__cu_device_info(0, &G_.info));
    QSA__CU(qsa__cu.cuDeviceGet(&dev, 0));
    QSA__CU(qsa__cu.cuDevicePrimaryCtxRetain(&G_.ctx, dev));
    QSA__CU(qsa__cu.cuCtxSetCurrent(G_.ctx));
    QSA__TRY(qsa__kernels_compile(NULL, G_.info.cc_major * 10 + G_.info.cc_minor, NULL, 0, &image, &len, &log,
                                  G_.arch, sizeof G_.arch));
    qsa_result r = QSA__CU_R(qsa__cu.cuModuleLoadData(&G_.mod, image));
    qsa_free(image);
    qsa_free(log);
    if (r == QSA_OK)
        printf("    GPU 0: %s (sm_%d%d, %d SMs, %.1f GiB); kernels built for %s by NVRTC %d.%d\n", G_.info.name,
               G_.info.cc_major, G_.info.cc_minor, G_.info.sm_count, (double)G_.info.total_mem / (1 << 30), G_.arch,
               qsa__nvrtc.major, qsa__nvrtc.minor);
    return r;
}

/* 1: ready; 0: no GPU stack (skip); -1: a GPU is there but setting it up failed (a real failure). */
static int jit_gpu_state(void) {
    if (!G_.tried) {
        G_.tried = 1;
        G_.status = jit_gpu_init_();
        snprintf(G_.why, sizeof G_.why, "%s", G_.status == QSA_OK ? "" : qsa_last_error());
    }
    return G_.status == QSA_OK ? 1 : G_.status == QSA_ERR_NO_DEVICE ? 0 : -1;
}
#define JIT_NEED_GPU() do { int s_ = jit_gpu_state(); \
    if (s_ == 0) SKIP("no GPU: %s", G_.why); \
    if (s_ < 0) { T_.failed++; printf("    GPU set-up failed: %s\n", G_.why); return; } } while (0)

/* Device buffers of one test, freed together. */
typedef struct jit_arena { CUdeviceptr p[16]; int n; } jit_arena;
/* Allocates `bytes`, then copies `host` in, or fills with 0xFF bytes (NaN in fp16 and fp32) so that
   an element the kernel forgot to write cannot pass. */
static qsa_result jit_dev(jit_arena *a, CUdeviceptr *d, const void *host, size_t bytes) {
    *d = 0;
    if (a->n >= 16) return qsa__fail(QSA_ERR_INTERNAL, "test arena full");
    QSA__CU(qsa__cu.cuMemAlloc_v2(d, bytes ? bytes : 1));
    a->p[a->n++] = *d;
    if (host) QSA__CU(qsa__cu.cuMemcpyHtoD_v2(*d, host, bytes));
    else QSA__CU(qsa__cu.cuMemsetD8_v2(*d, 0xFF, bytes ? bytes : 1));
    return QSA_OK;
}
static void jit_arena_free(jit_arena *a) {
    for (int i = 0; i < a->n; i++) qsa__cu.cuMemFree_v2(a->p[i]);
    a->n = 0;
}
static qsa_result jit_get(void *host, CUdeviceptr d, size_t bytes) {
    QSA__CU(qsa__cu.cuMemcpyDtoH_v2(host, d, bytes));
    return QSA_OK;
}
static qsa_result jit_launch(const char *name, unsigned gx, unsigned gy, unsigned block, void **args) {
    CUfunction fn;
    QSA__CU(qsa__cu.cuModuleGetFunction(&fn, G_.mod, name));
    QSA__TRY(qsa__cu_launch(fn, name, gx, gy, 1, block, 1, 1, 0, NULL, args));
    QSA__CU(qsa__cu.cuCtxSynchronize());
    return QSA_OK;
}

/* Deterministic inputs: xorshift64*, uniform in [lo, hi). */
static uint64_t jit_rng_state = 0x9E3779B97F4A7C15ull;
static double jit_uniform(double lo, double hi) {
    jit_rng_state ^= jit_rng_state >> 12;
    jit_rng_state ^= jit_rng_state << 25;
    jit_rng_state ^= jit_rng_state >> 27;
    uint64_t x = jit_rng_state * 2685821657736338717ull;
    return lo + (hi - lo) * (double)(x >> 11) * (1.0 / 9007199254740992.0);
}
/* n random fp16 values in [lo, hi): the bits go to the GPU, the exact values to the reference. */
static void jit_rand_f16(uint16_t *h, float *f, size_t n, double lo, double hi) {
    for (size_t i = 0; i < n; i++) {
        h[i] = qsa__f32_to_f16((float)jit_uniform(lo, hi));
        f[i] = qsa__f16_to_f32(h[i]);
    }
}

/* Counts elements outside |got - want| <= atol[i] + rtol*|want| (NaN counts); prints the first few. */
static int jit_compare(const char *what, const float *got, const double *want, const double *atol, double rtol,
                       size_t n) {
    int bad = 0;
    double worst = 0;
    for (size_t i = 0; i < n; i++) {
        double err = fabs((double)got[i] - want[i]), tol = atol[i] + rtol * fabs(want[i]);
        if (!(err <= tol)) {
            if (bad < 5) printf("    %s[%zu]: gpu %.9g, reference %.9g, |diff| %.3g > tol %.3g\n", what, i, got[i], want[i], err, tol);
            bad++;
        }
        if (tol > 0 && err / tol > worst) worst = err / tol;
    }
    if (T_.verbose) printf("    %s: %zu values, worst |diff|/tol = %.3f\n", what, n, worst);
    return bad;
}
static void jit_f16_to_f32_array(const uint16_t *h, float *f, size_t n) {
    for (size_t i = 0; i < n; i++) f[i] = qsa__f16_to_f32(h[i]);
}

/* --- rmsnorm --- */
static qsa_result jit_run_rmsnorm(const uint16_t *x, const uint16_t *w, uint16_t *y, uint16_t *y_inplace, int rows,
                                  int n, float w_offset, float eps) {
    jit_arena a = {{0}, 0};
    CUdeviceptr dx, dw, dy, dxi;
    size_t bytes = (size_t)rows * n * 2;
    qsa_result r = jit_dev(&a, &dx, x, bytes);
    if (r == QSA_OK) r = jit_dev(&a, &dw, w, (size_t)n * 2);
    if (r == QSA_OK) r = jit_dev(&a, &dy, NULL, bytes);
    if (r == QSA_OK) r = jit_dev(&a, &dxi, x, bytes);
    if (r == QSA_OK) {
        void *args[] = {&dy, &dx, &dw, &w_offset, &n, &eps};
        r = jit_launch("qsa_k_rmsnorm", (unsigned)rows, 1, 256, args);
    }
    if (r == QSA_OK) {
        void *args[] = {&dxi, &dxi, &dw, &w_offset, &n, &eps}; /* in place */
        r = jit_launch("qsa_k_rmsnorm", (unsigned)rows, 1, 256, args);
    }
    if (r == QSA_OK) r = jit_get(y, dy, bytes);
    if (r == QSA_OK) r = jit_get(y_inplace, dxi, bytes);
    jit_arena_free(&a);
    return r;
}

TEST(gpu, rmsnorm) {
    JIT_NEED_GPU();
    enum { ROWS = 4, N = 1000 }; /* N not a multiple of the block: partial strides */
    static uint16_t xh[ROWS * N], wh[N], yh[ROWS * N], yi[ROWS * N];
    static float xf[ROWS * N], wf[N], got[ROWS * N];
    static double want[ROWS * N], atol[ROWS * N];
    jit_rand_f16(xh, xf, ROWS * N, -3, 3);
    jit_rand_f16(wh, wf, N, -0.5, 0.5);
    for (int variant = 0; variant < 2; variant++) {
        float w_offset = variant == 0 ? 1.0f : 0.0f; /* zero-centred (1 + w) and plain w */
        float eps = 1e-6f;
        CHECK_OK(jit_run_rmsnorm(xh, wh, yh, yi, ROWS, N, w_offset, eps));
        for (int r = 0; r < ROWS; r++) {
            double ss = 0;
            for (int i = 0; i < N; i++) ss += (double)xf[r * N + i] * xf[r * N + i];
            double inv = 1.0 / sqrt(ss / N + eps);
            for (int i = 0; i < N; i++) {
                want[r * N + i] = xf[r * N + i] * inv * (w_offset + wf[i]);
                /* atol: below fp16's normal range the output spacing is absolute (6e-8) */
                atol[r * N + i] = 1e-6;
            }
        }
        /* rtol 1e-3: the fp16 output is rounded (<= 2^-11 = 4.9e-4 relative); fp32 math, rsqrtf
           (2 ulp) and the summation order add < 1e-5. */
        jit_f16_to_f32_array(yh, got, ROWS * N);
        int bad = jit_compare(variant ? "rmsnorm(w)" : "rmsnorm(1+w)", got, want, atol, 1e-3, ROWS * N);
        CHECKF(bad == 0, "%d of %d values out of tolerance", bad, ROWS * N);
        CHECKF(!memcmp(yh, yi, sizeof yh), "in-place result differs from out-of-place");
    }
}

/* --- embed_gather --- */
TEST(gpu, embed_gather) {
    JIT_NEED_GPU();
    enum { VOCAB = 50, DIM = 300, NTOK = 7 };
    static uint16_t table[VOCAB * DIM], out[NTOK * DIM], want[NTOK * DIM];
    static float tf[VOCAB * DIM];
    int ids[NTOK] = {3, 0, 49, -1, 50, 3, 17}; /* -1 and 50 are out of range: zero rows */
    long long vocab = VOCAB;
    int ntok = NTOK, dim = DIM;
    jit_rand_f16(table, tf, VOCAB * DIM, -1, 1);
    for (int t = 0; t < NTOK; t++)
        for (int j = 0; j < DIM; j++)
            want[t * DIM + j] = (ids[t] >= 0 && ids[t] < VOCAB) ? table[ids[t] * DIM + j] : 0;
    jit_arena a = {{0}, 0};
    CUdeviceptr dout, dtab, dids;
    qsa_result r = jit_dev(&a, &dout, NULL, sizeof out);
    if (r == QSA_OK) r = jit_dev(&a, &dtab, table, sizeof table);
    if (r == QSA_OK) r = jit_dev(&a, &dids, ids, sizeof ids);
    if (r == QSA_OK) {
        void *args[] = {&dout, &dtab, &dids, &ntok, &dim, &vocab};
        r = jit_launch("qsa_k_embed_gather", (DIM + 255) / 256, NTOK, 256, args);
    }
    if (r == QSA_OK) r = jit_get(out, dout, sizeof out);
    jit_arena_free(&a);
    CHECK_OK(r);
    CHECKF(!memcmp(out, want, sizeof out), "gathered rows differ (a copy must be exact)");
}

/* --- gemv_f16 --- */
/* y = W x for `batch` vectors; `x_offset` elements of misalignment exercise the scalar loads. */
static void jit_gemv_case(int rows, int cols, int batch, int x_offset) {
    size_t nw = (size_t)rows * cols, nx = (size_t)batch * cols, ny = (size_t)batch * rows;
    uint16_t *wh = QSA__ALLOC(uint16_t, nw), *xh = QSA__ALLOC(uint16_t, nx + x_offset), *yh = QSA__ALLOC(uint16_t, ny);
    float *wf = QSA__ALLOC(float, nw), *xf = QSA__ALLOC(float, nx + x_offset), *y32 = QSA__CALLOC(float, ny),
          *y32b = QSA__CALLOC(float, ny), *got = QSA__CALLOC(float, ny);
    double *want = QSA__ALLOC(double, ny), *atol = QSA__ALLOC(double, ny);
    CHECK(wh && xh && yh && wf && xf && y32 && y32b && got && want && atol);
    if (!(wh && xh && yh && wf && xf && y32 && y32b && got && want && atol)) {
        qsa_free(wh); qsa_free(xh); qsa_free(yh); qsa_free(wf); qsa_free(xf); qsa_free(y32); qsa_free(y32b);
        qsa_free(got); qsa_free(want); qsa_free(atol);
        return;
    }
    jit_rand_f16(wh, wf, nw, -1, 1);
    jit_rand_f16(xh, xf, nx + x_offset, -1, 1);
    for (int b = 0; b < batch; b++)
        for (int r = 0; r < rows; r++) {
            double s = 0, mag = 0;
            for (int c = 0; c < cols; c++) {
                double p = (double)wf[(size_t)r * cols + c] * xf[x_offset + (size_t)b * cols + c];
                s += p;
                mag += fabs(p);
            }
            want[(size_t)b * rows + r] = s;
            /* fp32 accumulation: each lane adds ~cols/32 products then 5 butterfly steps, error
               <= (cols/32 + 5) * 2^-24 * sum|w x|; 1e-5 * sum|w x| covers cols up to ~5000 */
            atol[(size_t)b * rows + r] = 1e-5 * mag + 1e-30;
        }
    jit_arena a = {{0}, 0};
    CUdeviceptr dy = 0, dy32 = 0, dw = 0, dx = 0;
    qsa_result r = jit_dev(&a, &dy, NULL, ny * 2);
    if (r == QSA_OK) r = jit_dev(&a, &dy32, NULL, ny * 4);
    if (r == QSA_OK) r = jit_dev(&a, &dw, wh, nw * 2);
    if (r == QSA_OK) r = jit_dev(&a, &dx, xh, (nx + x_offset) * 2);
    CUdeviceptr dxo = dx + (CUdeviceptr)x_offset * 2;
    for (int rep = 0; rep < 2 && r == QSA_OK; rep++) {
        void *args[] = {&dy, &dy32, &dw, &dxo, &rows, &cols};
        r = jit_launch("qsa_k_gemv_f16", (unsigned)(rows + 7) / 8, (unsigned)batch, 256, args);
        if (r == QSA_OK) r = jit_get(rep ? y32b : y32, dy32, ny * 4);
    }
    if (r == QSA_OK) r = jit_get(yh, dy, ny * 2);
    jit_arena_free(&a);
    CHECK_OK(r);
    if (r == QSA_OK) {
        char what[64];
        snprintf(what, sizeof what, "gemv %dx%d y32", rows, cols);
        int bad = jit_compare(what, y32, want, atol, 0.0, ny);
        CHECKF(bad == 0, "%s: %d values out of tolerance", what, bad);
        /* fp16 output: the same atol plus the fp16 rounding (<= 4.9e-4 relative), rtol 1e-3 */
        jit_f16_to_f32_array(yh, got, ny);
        snprintf(what, sizeof what, "gemv %dx%d y16", rows, cols);
        bad = jit_compare(what, got, want, atol, 1e-3, ny);
        CHECKF(bad == 0, "%s: %d values out of tolerance", what, bad);
        CHECKF(!memcmp(y32, y32b, ny * 4), "gemv %dx%d: two runs differ (must be bitwise identical)", rows, cols);
    }
    qsa_free(wh); qsa_free(xh); qsa_free(yh); qsa_free(wf); qsa_free(xf); qsa_free(y32); qsa_free(y32b);
    qsa_free(got); qsa_free(want); qsa_free(atol);
}

TEST(gpu, gemv_f16) {
    JIT_NEED_GPU();
    jit_gemv_case(300, 1024, 3, 0); /* aligned: 16-byte vector loads */
    jit_gemv_case(37, 1001, 2, 0);  /* odd row length: unaligned rows, partial last chunk */
    jit_gemv_case(8, 64, 1, 1);     /* misaligned x: scalar loads */
}

/* --- nvfp4_gemv --- */
static double jit_ref_e2m1(unsigned code) {
    static const double mag[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
    return (code & 8) ? -mag[code & 7] : mag[code & 7];
}
static double jit_ref_e4m3(unsigned b) {
    unsigned e = (b >> 3) & 15, m = b & 7;
    double v = e == 0 ? ldexp(m / 8.0, -6) : ldexp(1 + m / 8.0, (int)e - 7);
    return (b & 0x80) ? -v : v;
}
/* `misalign` offsets the weight bytes by 1 and x by one element to exercise the byte/scalar loads. */
static void jit_nvfp4_case(int rows, int cols, int batch, int misalign) {
    int groups = cols / 16;
    size_t nq = (size_t)rows * cols / 2, ns = (size_t)rows * groups, nx = (size_t)batch * cols, ny = (size_t)batch * rows;
    uint8_t *q = QSA__ALLOC(uint8_t, nq + 1), *sc = QSA__ALLOC(uint8_t, ns);
    uint16_t *xh = QSA__ALLOC(uint16_t, nx + 1), *yh = QSA__ALLOC(uint16_t, ny);
    float *xf = QSA__ALLOC(float, nx + 1), *y32 = QSA__CALLOC(float, ny), *got = QSA__ALLOC(float, ny);
    double *want = QSA__ALLOC(double, ny), *atol = QSA__ALLOC(double, ny);
    float scale2 = 0.0125f;
    CHECK(q && sc && xh && yh && xf && y32 && got && want && atol && ns > 0);
    if (!(q && sc && xh && yh && xf && y32 && got && want && atol && ns > 0)) {
        qsa_free(q); qsa_free(sc); qsa_free(xh); qsa_free(yh); qsa_free(xf); qsa_free(y32); qsa_free(got);
        qsa_free(want); qsa_free(atol);
        return;
    }
    for (size_t i = 0; i < nq + 1; i++) q[i] = (uint8_t)(jit_uniform(0, 256));
    for (size_t i = 0; i < ns; i++) {
        unsigned e = 1 + (unsigned)jit_uniform(0, 14), m = (unsigned)jit_uniform(0, 8); /* normal, never NaN */
        sc[i] = (uint8_t)((e << 3) | m);
    }
    sc[0] = 0x05;        /* a subnormal scale: 5/8 * 2^-6 */
    sc[ns - 1] |= 0x80;  /* a negative scale */
    jit_rand_f16(xh, xf, nx + 1, -1, 1);
    const uint8_t *qw = q + misalign;
    const float *xw = xf + misalign;
    for (int b = 0; b < batch; b++)
        for (int r = 0; r < rows; r++) {
            double s = 0, mag = 0;
            for (int c = 0; c < cols; c++) {
                uint8_t byte = qw[(size_t)r * cols / 2 + c / 2];
                unsigned code = (c & 1) ? byte >> 4 : byte & 15; /* element 2i = low nibble */
                double w = jit_ref_e2m1(code) * jit_ref_e4m3(sc[(size_t)r * groups + c / 16]) * scale2;
                double p = w * xw[(size_t)b * cols + c];
                s += p;
                mag += fabs(p);
            }
            want[(size_t)b * rows + r] = s;
            /* e2m1 * x is exact in fp32; per group 16 fmas, one scale fma per group and the butterfly:
               error <= (16 + groups/32 + 6) * 2^-24 * sum|w x|; 1e-5 * sum|w x| is ~7x that here */
            atol[(size_t)b * rows + r] = 1e-5 * mag + 1e-30;
        }
    jit_arena a = {{0}, 0};
    CUdeviceptr dy, dy32, dq, ds, dx;
    qsa_result r = jit_dev(&a, &dy, NULL, ny * 2);
    if (r == QSA_OK) r = jit_dev(&a, &dy32, NULL, ny * 4);
    if (r == QSA_OK) r = jit_dev(&a, &dq, q, nq + 1);
    if (r == QSA_OK) r = jit_dev(&a, &ds, sc, ns);
    if (r == QSA_OK) r = jit_dev(&a, &dx, xh, (nx + 1) * 2);
    if (r == QSA_OK) {
        CUdeviceptr dqo = dq + (CUdeviceptr)misalign, dxo = dx + (CUdeviceptr)misalign * 2;
        void *args[] = {&dy, &dy32, &dqo, &ds, &scale2, &dxo, &rows, &cols};
        r = jit_launch("qsa_k_nvfp4_gemv", (unsigned)(rows + 7) / 8, (unsigned)batch, 256, args);
    }
    if (r == QSA_OK) r = jit_get(y32, dy32, ny * 4);
    if (r == QSA_OK) r = jit_get(yh, dy, ny * 2);
    jit_arena_free(&a);
    CHECK_OK(r);
    if (r == QSA_OK) {
        char what[64];
        snprintf(what, sizeof what, "nvfp4 %dx%d%s y32", rows, cols, misalign ? " misaligned" : "");
        int bad = jit_compare(what, y32, want, atol, 0.0, ny);
        CHECKF(bad == 0, "%s: %d values out of tolerance", what, bad);
        jit_f16_to_f32_array(yh, got, ny);
        snprintf(what, sizeof what, "nvfp4 %dx%d%s y16", rows, cols, misalign ? " misaligned" : "");
        bad = jit_compare(what, got, want, atol, 1e-3, ny); /* + fp16 output rounding */
        CHECKF(bad == 0, "%s: %d values out of tolerance", what, bad);
    }
    qsa_free(q); qsa_free(sc); qsa_free(xh); qsa_free(yh); qsa_free(xf); qsa_free(y32); qsa_free(got);
    qsa_free(want); qsa_free(atol);
}

TEST(gpu, nvfp4_gemv) {
    JIT_NEED_GPU();
    jit_nvfp4_case(40, 512, 2, 0);  /* 32 groups: one per lane */
    jit_nvfp4_case(19, 1040, 3, 1); /* 65 groups: uneven lanes; misaligned weights and x */
}

/* --- gemm_f16_wmma --- */
TEST(gpu, gemm_f16_wmma) {
    JIT_NEED_GPU();
    enum { M = 32, N = 80, K = 64 }; /* N = 5 tiles: the second block has 3 idle warps */
    static uint16_t ah[M * K], bh[N * K], c16[M * N];
    static float af[M * K], bf[N * K], c32[M * N], got[M * N];
    static double want[M * N], atol[M * N];
    int m = M, n = N, k = K;
    jit_rand_f16(ah, af, M * K, -1, 1);
    jit_rand_f16(bh, bf, N * K, -1, 1);
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            double s = 0, mag = 0;
            for (int t = 0; t < K; t++) {
                double p = (double)af[i * K + t] * bf[j * K + t];
                s += p;
                mag += fabs(p);
            }
            want[i * N + j] = s;
            /* fp16 products are exact; tensor-core fp32 accumulation may truncate instead of
               rounding (Volta), so allow ~K * 2^-23 * sum|a b| plus margin: 1e-4 * sum|a b|.  A
               layout error would be off by O(sum|a b|). */
            atol[i * N + j] = 1e-4 * mag + 1e-30;
        }
    jit_arena a = {{0}, 0};
    CUdeviceptr d32, d16, da, db;
    qsa_result r = jit_dev(&a, &d32, NULL, sizeof c32);
    if (r == QSA_OK) r = jit_dev(&a, &d16, NULL, sizeof c16);
    if (r == QSA_OK) r = jit_dev(&a, &da, ah, sizeof ah);
    if (r == QSA_OK) r = jit_dev(&a, &db, bh, sizeof bh);
    if (r == QSA_OK) {
        void *args[] = {&d32, &d16, &da, &db, &m, &n, &k};
        r = jit_launch("qsa_k_gemm_f16_wmma", (N + 63) / 64, M / 16, 128, args);
    }
    if (r == QSA_OK) r = jit_get(c32, d32, sizeof c32);
    if (r == QSA_OK) r = jit_get(c16, d16, sizeof c16);
    jit_arena_free(&a);
    CHECK_OK(r);
    if (r != QSA_OK) return;
    int bad = jit_compare("wmma C32", c32, want, atol, 0.0, M * N);
    CHECKF(bad == 0, "C32: %d values out of tolerance", bad);
    jit_f16_to_f32_array(c16, got, M * N);
    bad = jit_compare("wmma C16", got, want, atol, 1e-3, M * N); /* + fp16 output rounding */
    CHECKF(bad == 0, "C16: %d values out of tolerance", bad);
    /* the fp16 output is exactly the rounded fp32 output */
    int mism = 0;
    for (int i = 0; i < M * N; i++) mism += c16[i] != qsa__f32_to_f16(c32[i]);
    CHECKF(mism == 0, "%d fp16 outputs are not the rounded fp32 outputs", mism);
}

/* ---------------------------------------------------------------------------------------------- */
/* nccl: the library loads (collectives are tested with the TP code)                               */
/* ---------------------------------------------------------------------------------------------- */

TEST(nccl, library_loads) {
    if (qsa__nccl_load() != QSA_OK) SKIP("no NCCL: %s", qsa_last_error());
    printf("    NCCL %d from %s\n", qsa__nccl.version, qsa__nccl.path);
    CHECK(qsa__nccl.version >= 2000);
    CHECK(qsa__nccl.ncclAllReduce != NULL && qsa__nccl.ncclCommInitAll != NULL);
}

#endif /* QSA_NO_CUDA */
