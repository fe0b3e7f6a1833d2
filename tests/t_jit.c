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

#include <signal.h>
#include <sys/wait.h>

/* ---------------------------------------------------------------------------------------------- */
/* helpers                                                                                         */
/* ---------------------------------------------------------------------------------------------- */

#include "kernel_entries.h" /* kernel_entry_names, kernel_entry_in_image (shared with make nvrtc-check) */

/* Checks that every kernel entry is in a PTX (".entry NAME(") or a CUBIN (symbol "NAME\0"). */
static void jit_check_entries(const char *image, size_t len, int cubin) {
    char names[KERNEL_ENTRIES_MAX][64];
    int n = kernel_entry_names(names, KERNEL_ENTRIES_MAX);
    CHECKF(n >= 5 && n < KERNEL_ENTRIES_MAX, "found %d kernels in kernels.cu (5 to %d expected)", n,
           KERNEL_ENTRIES_MAX - 1);
    for (int i = 0; i < n; i++)
        CHECKF(kernel_entry_in_image(image, len, cubin, names[i]), "%s has no entry %s", cubin ? "CUBIN" : "PTX",
               names[i]);
}

/* Whether kernel `name` opens with QSA_PDL_LATE() in the embedded source (it loads weights before
   its programmatic-dependency wait). */
static int jit_pdl_late(const char name[64]) {
    char *src = qsa__kernels_source(), key[96];
    snprintf(key, sizeof key, " %.63s(", name);
    const char *p = src ? strstr(src, key) : NULL, *body = p ? strchr(p, '{') : NULL;
    while (body && (*++body == ' ' || *body == '\n')) {}
    int late = body && !strncmp(body, "QSA_PDL_LATE();", 15);
    qsa_free(src);
    return late;
}

/* For a PTX of compute_90+: every entry point waits for its programmatic predecessor
   (griddepcontrol.wait, QSA_PDL_ENTRY) before any memory access other than its parameters, or a
   kernel launched early by qsa__cu_launch_ex could read what the previous kernel is still writing.
   A QSA_PDL_LATE kernel may load first (weights, or what kernels two or more launches back wrote:
   kernels.cu's QSA_PDL_ENTRY), but stores nothing before the wait. */
static void jit_check_pdl_waits(const char *ptx) {
    char names[KERNEL_ENTRIES_MAX][64];
    int n = kernel_entry_names(names, KERNEL_ENTRIES_MAX), bad = 0, nlate = 0;
    for (int i = 0; i < n; i++) {
        int late = jit_pdl_late(names[i]);
        nlate += late;
        char needle[128];
        snprintf(needle, sizeof needle, ".entry %.63s(", names[i]);
        const char *b = strstr(ptx, needle), *w = b ? strstr(b, "griddepcontrol.wait") : NULL;
        if (!b) continue; /* jit_check_entries reports it */
        const char *next = strstr(b + 1, ".entry ");
        if (!w || (next && w > next)) {
            CHECKF(0, "%s: no griddepcontrol.wait (QSA_PDL_ENTRY must open every kernel)", names[i]);
            bad++;
            continue;
        }
        /* no global (or generic) load, store, atomic or reduction before the wait: parameters,
           shared and local memory are the block's own */
        for (const char *p = b; p < w; p++) {
            int own = !strncmp(p + 4, "param", 5) || !strncmp(p + 4, "shared", 6) || !strncmp(p + 4, "local", 5);
            int mem = (!late && !strncmp(p, "\tld.", 4) && !own) || (!strncmp(p, "\tst.", 4) && !own) ||
                      !strncmp(p, "\tatom.", 6) || !strncmp(p, "\tred.", 5);
            if (mem) {
                CHECKF(0, "%s: a memory access before griddepcontrol.wait: %.40s", names[i], p + 1);
                bad++;
                break;
            }
        }
    }
    CHECKF(n >= 5 && bad == 0, "%d of %d kernels", bad, n);
    printf("    compute_90+ PTX: all %d entry points wait for their predecessor (%d load weights first)\n", n, nlate);
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

/* The kernel cache: no file, a FIFO, a directory or a truncated file in an entry's place is a miss (never a hang,
   never trusted; no file, the first run's case, logs nothing even at debug level), and a cache directory that
   cannot be made turns the cache off instead of failing every write silently. */
static int cache_logs;
static void cache_logger(void *user, qsa_log_level level, const char *msg) {
    (void)user, (void)level, (void)msg;
    cache_logs++;
}
TEST(cpu, kernel_cache_odd_entries_are_misses) {
    char dir[64], path[128];
    snprintf(dir, sizeof dir, "/tmp/qsa_cache_odd_%d", (int)getpid());
    mkdir(dir, 0700);
    snprintf(path, sizeof path, "%s/kernels-0000000000001234.ptx", dir);
    const uint64_t key = 0x1234;
    char *img = NULL;
    size_t len = 0;
    /* no file: a quiet miss */
    remove(path);
    cache_logs = 0;
    qsa_set_logger(cache_logger, NULL, QSA_LOG_DEBUG);
    CHECK(qsa__cache_read(path, key, &img, &len) == QSA_OK && !img);
    qsa_set_logger(T_.verbose ? qsa_log_stderr : NULL, NULL, QSA_LOG_DEBUG);
    CHECKF(cache_logs == 0, "a missing cache entry logged %d lines", cache_logs);
    CHECK(qsa_last_error()[0] == 0);
    /* a FIFO: the read runs in a child so that a regression is a failure, not a hung suite */
    CHECK(mkfifo(path, 0600) == 0);
    pid_t pid = fork();
    if (pid == 0) _exit(qsa__cache_read(path, key, &img, &len) == QSA_OK && !img ? 0 : 1);
    int st = -1, waited = 0;
    for (int i = 0; i < 500 && !(waited = waitpid(pid, &st, WNOHANG) == pid); i++) usleep(10000);
    if (!waited) { kill(pid, SIGKILL); waitpid(pid, &st, 0); }
    CHECKF(waited && WIFEXITED(st) && WEXITSTATUS(st) == 0, "a FIFO in the cache entry's place: %s",
           waited ? "not a miss" : "the read blocked (5 s)");
    remove(path);
    /* a directory */
    CHECK(mkdir(path, 0700) == 0);
    CHECK(qsa__cache_read(path, key, &img, &len) == QSA_OK && !img);
    rmdir(path);
    /* every truncation of a good entry */
    static const char image[] = "// ptx";
    qsa__cache_write(path, key, image, sizeof image - 1);
    char *file = NULL;
    size_t flen = 0, trusted = 0;
    CHECK_OK(qsa__read_file(path, &file, &flen));
    CHECK(qsa__cache_read(path, key, &img, &len) == QSA_OK && img && len == sizeof image - 1);
    qsa_free(img);
    for (size_t t = 0; file && t < flen; t++) {
        FILE *f = fopen(path, "wb");
        if (f) { fwrite(file, 1, t, f); fclose(f); }
        img = NULL;
        CHECK(qsa__cache_read(path, key, &img, &len) == QSA_OK);
        trusted += img != NULL;
        qsa_free(img);
    }
    CHECKF(trusted == 0, "%zu truncations of a cache entry were trusted", trusted);
    qsa_free(file);
    remove(path);
    /* a cache directory under a regular file cannot be made: the cache is off */
    jit_env_saved saved;
    jit_env_unset(&saved, "QSA_CACHE_DIR");
    char under[128], out[1024];
    snprintf(under, sizeof under, "%s/file", dir);
    FILE *f = fopen(under, "wb");
    if (f) fclose(f);
    snprintf(under, sizeof under, "%s/file/cache", dir);
    setenv("QSA_CACHE_DIR", under, 1);
    CHECKF(!qsa__cache_dir(out, sizeof out), "QSA_CACHE_DIR=%s (under a file) was taken as a cache", under);
    jit_env_restore(&saved);
    char cmd[96];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    CHECK(system(cmd) == 0);
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
    CHECK(strstr(ptx, "griddepcontrol") == NULL); /* QSA_PDL_ENTRY is empty below sm_90 */
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
        if (native >= 90) jit_check_pdl_waits(image);
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

/* Entry point `name`'s text in a PTX module (from ".entry name(" to its closing brace) without what depends
   on which other functions the module holds: the numbers of its place ($L__BB<f>_ labels, __local_depot<f>,
   the "// callseq <n>" comments of its calls),
   the compilation's hash in internal names (_INTERNAL_<n>_kernels_cu_<hash>), the shared variables NVVM
   declares inside the one entry that uses them ("// demoted variable" and the line after) and empty lines.
   A copy (qsa_free), or NULL when the module does not hold it. */
static char *jit_ptx_entry(const char *ptx, const char *name) {
    char key[96];
    snprintf(key, sizeof key, ".entry %s(", name);
    const char *a = strstr(ptx, key), *e = a ? strstr(a, "\n}\n") : NULL;
    if (!a || !e) return NULL;
    e += 3;
    char *t = QSA__ALLOC(char, (size_t)(e - a) + 1);
    if (!t) return NULL;
    size_t o = 0;
    for (const char *l = a; l < e;) {
        const char *nl = memchr(l, '\n', (size_t)(e - l)), *end = nl ? nl + 1 : e;
        if (!strncmp(l, "\t// demoted variable", 20)) { /* it and its declaration */
            l = end;
            nl = memchr(l, '\n', (size_t)(e - l));
            l = nl ? nl + 1 : e;
            continue;
        }
        if (*l == '\n') { l = end; continue; }
        for (const char *c = l; c < end;) {
            static const char *const num[3] = {"$L__BB", "__local_depot", "// callseq "};
            int hit = 0;
            for (int k = 0; k < 3 && !hit; k++) {
                size_t pl = strlen(num[k]);
                if (!strncmp(c, num[k], pl)) {
                    memcpy(t + o, num[k], pl);
                    o += pl;
                    c += pl;
                    while (*c >= '0' && *c <= '9') c++;
                    hit = 1;
                }
            }
            const char *kc = !hit && !strncmp(c, "_INTERNAL_", 10) ? strstr(c, "_kernels_cu_") : NULL;
            if (kc && kc < end && kc + 20 <= end) { /* _INTERNAL_<n>_kernels_cu_<8 hex> */
                memcpy(t + o, "_INTERNAL_kernels_cu_", 21);
                o += 21;
                c = kc + 20;
                hit = 1;
            }
            if (!hit) t[o++] = *c++;
        }
        l = end;
    }
    t[o] = 0;
    return t;
}

/* a and b hold the same lines, in any order (NVRTC 11.8 may order independent instructions differently from
   one compile of the same program to the next; 13.0 has not been seen to) */
static int jit_line_cmp(const void *x, const void *y) { return strcmp(*(char *const *)x, *(char *const *)y); }
static int jit_same_lines(char *a, char *b) {
    char *t[2] = {a, b}, **l[2] = {NULL, NULL};
    size_t n[2] = {0, 0};
    int same = 1;
    for (int k = 0; k < 2; k++) {
        for (char *c = t[k]; *c; c++) n[k] += *c == '\n';
        l[k] = QSA__ALLOC(char *, n[k] + 1);
        if (!l[k]) { same = 0; continue; }
        size_t i = 0;
        for (char *c = strtok(t[k], "\n"); c; c = strtok(NULL, "\n")) l[k][i++] = c;
        n[k] = i;
        qsort(l[k], n[k], sizeof(char *), jit_line_cmp);
    }
    same = same && n[0] == n[1];
    for (size_t i = 0; same && i < n[0]; i++) same = !strcmp(l[0][i], l[1][i]);
    qsa_free(l[0]);
    qsa_free(l[1]);
    return same;
}

/* The module in parts (kernels.cu's QSA_IN_PART, qsa__cuda_module's QSA__PARTS programs) as the runtime
   makes their images — compiled over two threads into an empty cache directory, then read back from it:
   every entry point of the source in exactly one part, with the whole program's PTX (the same instructions,
   whichever program compiles it), no part empty, and the second pass all from the cache with the same images. */
TEST(jit, module_parts_hold_the_whole_programs_kernels) {
    JIT_NEED_NVRTC();
    int native = jit_native_cc(90);
    if (!native) SKIP("NVRTC %d.%d knows no target up to compute 90", qsa__nvrtc.major, qsa__nvrtc.minor);
    char arch[32], dir[64], names[KERNEL_ENTRIES_MAX][64];
    snprintf(arch, sizeof arch, "compute_%d", native);
    snprintf(dir, sizeof dir, "/tmp/qsa_parts_cache_%d", (int)getpid());
    mkdir(dir, 0755);
    static const char *const opts[2] = {"--std=c++14", "-default-device"};
    int n = kernel_entry_names(names, KERNEL_ENTRIES_MAX), found[KERNEL_ENTRIES_MAX] = {0};
    char *whole = NULL, *log = NULL, *src = qsa__kernels_source();
    size_t len = 0;
    double t0 = qsa__now(), tw;
    CHECK_OK(qsa__kernels_compile(arch, 0, opts, 2, &whole, &len, &log, NULL, 0));
    tw = qsa__now() - t0;
    qsa_free(log);
    qsa__part_job jobs[2][QSA__PARTS];
    memset(jobs, 0, sizeof jobs);
    double tp[2] = {0, 0};
    for (int pass = 0; pass < 2 && whole && src; pass++) {
        for (int p = 0; p < QSA__PARTS; p++) {
            qsa__part_job *j = &jobs[pass][p];
            j->src = src;
            j->arch = arch;
            j->dir = dir;
            j->opts = opts;
            j->nopts = 2;
            j->part = p;
            j->key = 0x5eed;
        }
        t0 = qsa__now();
        CHECK_OK(qsa__parts_run(jobs[pass], 2, qsa__part_images));
        tp[pass] = qsa__now() - t0;
    }
    for (int p = 0; p < QSA__PARTS; p++) {
        const qsa__part_job *j = &jobs[0][p], *c = &jobs[1][p];
        CHECKF(!j->from_cache && c->from_cache && j->img && c->img && j->len == c->len && !memcmp(j->img, c->img, j->len),
               "part %d: compiled (from the cache %d), then read back (from the cache %d) with the same image", p,
               j->from_cache, c->from_cache);
        int here = 0;
        for (int i = 0; j->img && i < n; i++) {
            char *a = jit_ptx_entry(j->img, names[i]), *b = a ? jit_ptx_entry(whole, names[i]) : NULL;
            if (!a) continue;
            found[i]++;
            here++;
            CHECKF(b && jit_same_lines(a, b), "%s: part %d's PTX differs from the whole program's", names[i], p);
            qsa_free(a);
            qsa_free(b);
        }
        CHECKF(!j->img || here > 0, "part %d holds no entry point", p);
    }
    for (int i = 0; i < n; i++) CHECKF(found[i] == 1, "%s is in %d parts", names[i], found[i]);
    printf("    %d entry points in %d parts (%s): the whole program %.1f s, the parts over 2 threads %.1f s, "
           "read back from the cache %.3f s\n", n, QSA__PARTS, arch, tw, tp[0], tp[1]);
    for (int pass = 0; pass < 2; pass++)
        for (int p = 0; p < QSA__PARTS; p++) qsa_free(jobs[pass][p].img);
    qsa_free(whole);
    qsa_free(src);
    char cmd[96];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    CHECK(system(cmd) == 0);
}

/* A compile error after many warnings: the message (about 1 KB) still names the error, not only the warnings. */
TEST(jit, error_after_warnings_is_in_the_message) {
    JIT_NEED_NVRTC();
    qsa__buf b = {NULL, 0, 0};
    for (int i = 0; i < 30; i++) {
        char l[128];
        snprintf(l, sizeof l, "__device__ void f%d() { int unused_variable_number_%d; }\n", i, i);
        qsa__buf_puts(&b, l);
    }
    qsa__buf_puts(&b, "extern \"C\" __global__ void qsa_k_t(float *x) { x[0] = QSA_PLANTED_ERROR; }\n");
    char arch[32], *img = NULL;
    size_t len = 0;
    snprintf(arch, sizeof arch, "compute_%d", jit_native_cc(90));
    CHECK(qsa__nvrtc_compile(b.data, "kernels.cu", NULL, 0, arch, &img, &len, NULL) == QSA_ERR_NVRTC);
    CHECKF(strstr(qsa_last_error(), "QSA_PLANTED_ERROR") != NULL, "the message lost the error: %.300s", qsa_last_error());
    qsa_free(img);
    qsa__buf_free(&b);
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
    else if (qsa__nvrtc_supports(86)) CHECK(!strcmp(arch, qsa__nvrtc.nvrtcGetCUBIN ? "sm_86" : "compute_86"));
    if (!qsa__nvrtc_supports(70) && qsa__nvrtc_supports(80) && qsa__nvrtc_supports(86) && !qsa__nvrtc_supports(85)) {
        CHECK_OK(qsa__nvrtc_pick_arch(NULL, 85, arch, sizeof arch)); /* no exact target: the newest PTX below */
        CHECK(!strcmp(arch, "compute_80"));
    }
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
/* nccl: the library loads (collectives are tested with the TP code)                               */
/* ---------------------------------------------------------------------------------------------- */

TEST(nccl, library_loads) {
    if (qsa__nccl_load() != QSA_OK) SKIP("no NCCL: %s", qsa_last_error());
    printf("    NCCL %d from %s\n", qsa__nccl.version, qsa__nccl.path);
    CHECK(qsa__nccl.version >= 2000);
    CHECK(qsa__nccl.ncclAllGather != NULL && qsa__nccl.ncclCommInitAll != NULL);
}

#endif /* QSA_NO_CUDA */

/* The decode launch rules at the real shape (hidden 2560, 512 experts of width 640, top 10, GDN input
   projections of 10240 + 6144 + 48 + 48 rows, lm_head 248,320, an H200's 132 SMs), host arithmetic
   only: every decode batch up to 204 tokens (fewer than 4 pairs per expert) takes the cross-warp
   expert kernels — whole down from batch 1, whole gate/up from batch 8 (batch 128 once fell back to
   the one-block kernels: 613 against 1,100 tok/s) — and batches of 17+ take the tiled kernel for
   the wide projections only. */
TEST(cpu, cuda_decode_launch_rules_real_shape) {
    qsa__cuda g;
    memset(&g, 0, sizeof g);
    g.sm_count = 132;
    g.sc.gemv_part = 1; /* (never dereferenced: the rules only ask whether the scratch exists) */
    g.sc.gemv_limit = QSA__GEMV_PART_BYTES;
    g.xw_whole_per_sm = QSA__XW_WHOLE_PER_SM;
    g.moe64_pairs = QSA__MOE64_PAIRS;
    g.tiled_min_m = QSA__TILED_M;
    const int H = 2560, I = 640, E = 512, K = 10;
    static const int batches[] = {1, 8, 32, 128, 204};
    for (int i = 0; i < 5; i++) {
        int B = batches[i], MK = B * K, tr = qsa__moe_tr(&g, MK, E);
        int max_tiles = (MK + tr - 1) / tr + (E < MK ? E : MK);
        CHECKF(tr == 16, "B %d: %d-pair expert tiles", B, tr);
        CHECKF(qsa__moe_xwarp(&g, MK, max_tiles, H, I), "B %d: the cross-warp expert kernels refused", B);
        CHECKF(qsa__xw_whole(&g, (long long)max_tiles * (H / 16)), "B %d: down not whole", B);
        CHECKF(qsa__xw_whole(&g, (long long)max_tiles * (I / 16)) == (B >= 8), "B %d: gate/up whole is %d", B,
               qsa__xw_whole(&g, (long long)max_tiles * (I / 16)));
    }
    /* below whole gate/up tiles, segment ranges for ~20 warps per SM: 3 of the 10 segments at B = 1 (11 tiles x 40
       column tiles x 2 matrices), 2 at B = 2 (22 tiles); one segment per warp (the split form) when the count says so */
    g.xw_range_per_sm = QSA__XW_RANGE_PER_SM;
    CHECK(qsa__xw_ranges(&g, 11 * 40 * 2, 10) == 3);
    CHECK(qsa__xw_ranges(&g, 22 * 40 * 2, 10) == 2);
    CHECK(qsa__xw_ranges(&g, 1, 10) == 10 && qsa__xw_ranges(&g, 1000000, 10) == 1);
    CHECK(qsa__moe_tr(&g, 205 * K, E) == 64); /* 4 pairs per expert: the 64-pair kernels */
    long long gdn = (10240 + 63) / 64 + (6144 + 63) / 64 + 1 + 1, lm = (248320 + 63) / 64, out = 2560 / 64;
    for (int M = 1; M <= 64; M++) {
        CHECKF(qsa__tiled_small(&g, M, gdn) == (M >= 17), "M %d: GDN input group tiled %d", M, qsa__tiled_small(&g, M, gdn));
        CHECKF(qsa__tiled_small(&g, M, lm) == (M >= 17), "M %d: lm_head tiled %d", M, qsa__tiled_small(&g, M, lm));
        CHECKF(!qsa__tiled_small(&g, M, out), "M %d: the out projection (40 tiles) tiled", M);
    }
    CHECK(!qsa__tiled_small(&g, 65, lm)); /* prefill chunks: the GEMM kernels' own tiling */
}
