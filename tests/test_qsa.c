/* test_qsa.c - the one test binary of qsa_runtime.
 *
 *   tests/test_qsa [--group cpu|jit|gpu|nccl]... [--filter SUBSTRING] [--list] [-v]
 *
 * Groups: cpu (always runs), jit (needs an NVRTC), gpu (needs a CUDA device), nccl (needs >= 2 GPUs
 * and libnccl).  A test whose library or device is missing prints a SKIP line with the reason.
 * The last line is always "N passed, M failed" (plus ", K skipped"); the exit status is non-zero
 * when anything failed.  Fixture paths are relative to the repository root unless QSA_TEST_ROOT is set.
 * A test still running after QSA_TEST_TIMEOUT seconds (default 900, 0 for none) fails and ends the run
 * (group selftest holds a hung test for the watchdog's own test; it runs only where it is named).
 */
#include <stddef.h>

/* The library's host allocator in this binary (defined below): it counts the blocks it holds and fails
   the allocation tq_fail_at names, so that tests/t_oom.c can run out of memory at each allocation of a
   call. */
static void *tq_malloc(size_t n);
static void *tq_realloc(void *p, size_t n);
static void tq_free(void *p);
#define QSA_MALLOC(sz) tq_malloc(sz)
#define QSA_REALLOC(p, sz) tq_realloc(p, sz)
#define QSA_FREE(p) tq_free(p)

#define QSA_RUNTIME_IMPLEMENTATION
#include "../qsa_runtime.h"

#include <execinfo.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static long tq_live;          /* blocks allocated and not yet freed */
static long tq_fail_at = -1;  /* allocations left before one fails; -1: none fails */
static long tq_allocs;        /* allocations so far (also those that failed) */
/* With QSA_TEST_OOM_TRACE set, each allocation made to fail prints its call stack to stderr ("oom-trace:"
   lines of module(+offset) addresses, for addr2line -f -e tests/test_qsa): which allocation a sweep's
   failure names. */
static int tq_fail_now(void) {
    __atomic_fetch_add(&tq_allocs, 1, __ATOMIC_RELAXED);
    int fail = __atomic_load_n(&tq_fail_at, __ATOMIC_RELAXED) >= 0 && __atomic_fetch_sub(&tq_fail_at, 1, __ATOMIC_RELAXED) == 0;
    if (fail && getenv("QSA_TEST_OOM_TRACE")) {
        void *at[24];
        int n = backtrace(at, 24);
        fprintf(stderr, "oom-trace: the allocation made to fail:\n");
        fflush(stderr);
        backtrace_symbols_fd(at, n, 2);
    }
    return fail;
}
static void *tq_malloc(size_t n) {
    if (tq_fail_now()) return NULL;
    void *p = malloc(n);
    if (p) __atomic_fetch_add(&tq_live, 1, __ATOMIC_RELAXED);
    return p;
}
static void *tq_realloc(void *p, size_t n) {
    if (!p) return tq_malloc(n);
    return tq_fail_now() ? NULL : realloc(p, n);
}
static void tq_free(void *p) {
    if (p) __atomic_fetch_sub(&tq_live, 1, __ATOMIC_RELAXED);
    free(p);
}

typedef struct test_ctx {
    int failed;   /* checks failed in the current test */
    int skipped;  /* the current test called SKIP */
    int verbose;
} test_ctx;

static test_ctx T_;

#define CHECK(cond) do { if (!(cond)) { T_.failed++; \
    printf("    CHECK failed %s:%d: %s\n", __FILE__, __LINE__, #cond); } } while (0)
#define CHECKF(cond, ...) do { if (!(cond)) { T_.failed++; \
    printf("    CHECK failed %s:%d: %s: ", __FILE__, __LINE__, #cond); printf(__VA_ARGS__); printf("\n"); } } while (0)
#define CHECK_OK(expr) do { qsa_result r_ = (expr); if (r_ != QSA_OK) { T_.failed++; \
    printf("    CHECK_OK failed %s:%d: %s -> %s: %s\n", __FILE__, __LINE__, #expr, qsa_result_string(r_), qsa_last_error()); } } while (0)
/* Expect a specific failure and that the error message contains `needle`. */
#define CHECK_ERR(expr, code, needle) do { qsa_result r_ = (expr); \
    if (r_ != (code) || !strstr(qsa_last_error(), (needle))) { T_.failed++; \
    printf("    CHECK_ERR failed %s:%d: %s -> %s (want %s), message '%s' (want '%s')\n", __FILE__, __LINE__, \
           #expr, qsa_result_string(r_), qsa_result_string(code), qsa_last_error(), (needle)); } } while (0)
#define SKIP(...) do { T_.skipped = 1; printf("  SKIP "); printf(__VA_ARGS__); printf("\n"); return; } while (0)

typedef void (*test_fn)(void);
typedef struct test_case { const char *group, *name; test_fn fn; } test_case;

#define TEST_MAX 1024
static test_case g_tests[TEST_MAX];
static int g_ntests;
static void test_register(const char *group, const char *name, test_fn fn) {
    if (g_ntests < TEST_MAX) { g_tests[g_ntests].group = group; g_tests[g_ntests].name = name; g_tests[g_ntests].fn = fn; g_ntests++; }
}
/* TEST(group, name) { body } registers itself before main runs. */
#define TEST(group, name) \
    static void test_##group##_##name(void); \
    __attribute__((constructor)) static void reg_##group##_##name(void) { test_register(#group, #name, test_##group##_##name); } \
    static void test_##group##_##name(void)

/* Path of a repository file (fixtures, tools output). */
static QSA__UNUSED const char *test_path(const char *rel) {
    static char buf[4][4096];
    static int k;
    const char *root = getenv("QSA_TEST_ROOT");
    k = (k + 1) & 3;
    snprintf(buf[k], sizeof buf[k], "%s/%s", root ? root : ".", rel);
    return buf[k];
}

/* A tensor of the given dtype over data: d0 elements (d1 0), or d0 x d1 */
static QSA__UNUSED qsa__tensor test_tensor(const char *name, qsa__dtype dtype, const void *data, int64_t d0, int64_t d1) {
    qsa__tensor t;
    memset(&t, 0, sizeof t);
    t.name = name;
    t.dtype = dtype;
    t.ndim = d1 > 0 ? 2 : 1;
    t.shape[0] = d0;
    t.shape[1] = d1;
    t.data = (const uint8_t *)data;
    t.nbytes = (size_t)d0 * (size_t)(d1 > 0 ? d1 : 1) * qsa__dtype_size(dtype);
    return t;
}

/* ---- test groups (one file each) ---- */
#include "t_platform.c"
#include "t_loader.c"
#include "t_tokenizer.c"
#include "t_jit.c"
#include "t_gpu_k1.c"
#include "t_gpu_k2.c"
#include "t_model.c"
#include "t_planner.c"
#include "t_gpu.c"
#include "t_tp.c"
#include "t_tp_rdv.c"
#include "t_sched.c"
#include "t_cli.c"
#include "t_api.c"
#include "t_oom.c"

/* The watchdog: a test still running after QSA_TEST_TIMEOUT seconds (default 900; 0: none) is a hang.  It
   is named as failed, the summary line is printed, and the run ends there, with status 1 (a hung test held
   CI until its time limit, which printed nothing). */
static const test_case *g_current; /* the test that runs, NULL between tests (atomic loads and stores) */
static long g_current_start;       /* its start, on CLOCK_MONOTONIC, in seconds */
static int g_passed, g_failed, g_skipped;
static long test_now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long)ts.tv_sec;
}
static void *test_watchdog(void *arg) {
    long limit = (long)(intptr_t)arg;
    for (;;) {
        struct timespec ts = {1, 0};
        nanosleep(&ts, NULL);
        const test_case *t = __atomic_load_n(&g_current, __ATOMIC_ACQUIRE);
        if (!t || test_now_s() - __atomic_load_n(&g_current_start, __ATOMIC_RELAXED) < limit) continue;
        printf("\n  FAIL %s/%s: still running after %ld s (QSA_TEST_TIMEOUT); the run stops here\n", t->group, t->name, limit);
        if (g_skipped) printf("%d passed, %d failed, %d skipped\n", g_passed, g_failed + 1, g_skipped);
        else printf("%d passed, %d failed\n", g_passed, g_failed + 1);
        fflush(stdout);
        _exit(1);
    }
    return NULL;
}

/* selftest/hangs runs only where its group is named: the hung test of the next one. */
TEST(selftest, hangs) {
    for (int i = 0; i < 30; i++) {
        struct timespec ts = {1, 0};
        nanosleep(&ts, NULL);
    }
    CHECKF(0, "the watchdog let this test run for 30 s");
}

/* A hung test ends the run about QSA_TEST_TIMEOUT seconds in, named as failed, with the summary line last and
   status 1 (the binary run again on selftest/hangs with a limit of 1 s). */
TEST(cpu, test_watchdog_ends_a_hung_test) {
    char path[] = "/tmp/qsa_dog_XXXXXX";
    int fd = mkstemp(path);
    if (fd < 0) SKIP("mkstemp");
    fflush(stdout);
    double t0 = qsa__now();
    pid_t pid = fork();
    if (pid == 0) {
        dup2(fd, 1);
        setenv("QSA_TEST_TIMEOUT", "1", 1);
        execl("/proc/self/exe", "test_qsa", "--group", "selftest", (char *)NULL);
        _exit(127);
    }
    close(fd);
    int st = 0;
    if (pid > 0) waitpid(pid, &st, 0); /* (bounded: the hung test ends itself after 30 s) */
    double dt = qsa__now() - t0;
    char *text = NULL;
    size_t n = 0;
    CHECK_OK(qsa__read_file(path, &text, &n));
    remove(path);
    CHECKF(pid > 0 && WIFEXITED(st) && WEXITSTATUS(st) == 1, "status %d", st);
    CHECKF(dt < 10.0, "the run ended after %.1f s", dt);
    CHECKF(text && strstr(text, "FAIL selftest/hangs: still running after 1 s"), "output '%.300s'", text ? text : "");
    const char *last = text && n > 1 ? text + n - 1 : NULL; /* the last line */
    while (last && last > text && last[-1] != '\n') last--;
    CHECKF(last && !strcmp(last, "0 passed, 1 failed\n"), "last line '%s'", last ? last : "");
    qsa_free(text);
}

int main(int argc, char **argv) {
    if (getenv("QSA_TEST_TP_CHILD")) return tp_child_main(getenv("QSA_TEST_TP_CHILD")); /* a rank of nccl/tp2_two_processes */
    const char *groups[8];
    int ngroups = 0, list = 0;
    const char *filter = NULL, *from = NULL; /* --from S: start at the first selected test whose name contains S
                                                (resumes a run that a time limit stopped) */
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--group") && i + 1 < argc && ngroups < 8) groups[ngroups++] = argv[++i];
        else if (!strcmp(argv[i], "--filter") && i + 1 < argc) filter = argv[++i];
        else if (!strcmp(argv[i], "--from") && i + 1 < argc) from = argv[++i];
        else if (!strcmp(argv[i], "--list")) list = 1;
        else if (!strcmp(argv[i], "-v")) T_.verbose = 1;
        else { fprintf(stderr, "usage: %s [--group G]... [--filter S] [--from S] [--list] [-v]\n", argv[0]); return 2; }
    }
    if (T_.verbose) qsa_set_logger(qsa_log_stderr, NULL, QSA_LOG_DEBUG);
    const char *tl = getenv("QSA_TEST_TIMEOUT");
    long limit = tl ? atol(tl) : 900;
    pthread_t dog;
    if (limit > 0 && !list && pthread_create(&dog, NULL, test_watchdog, (void *)(intptr_t)limit) == 0) pthread_detach(dog);
    for (int i = 0; i < g_ntests; i++) {
        test_case *t = &g_tests[i];
        int want = ngroups == 0 && strcmp(t->group, "selftest") != 0; /* (selftest only where named) */
        for (int g = 0; g < ngroups; g++) if (!strcmp(groups[g], t->group)) want = 1;
        if (!want || (filter && !strstr(t->name, filter) && !strstr(t->group, filter))) continue;
        if (from && !strstr(t->name, from)) continue;
        from = NULL;
        if (list) { printf("%s/%s\n", t->group, t->name); continue; }
        printf("[%s] %s\n", t->group, t->name);
        fflush(stdout);
        T_.failed = 0; T_.skipped = 0;
        qsa_clear_error();
        __atomic_store_n(&g_current_start, test_now_s(), __ATOMIC_RELAXED);
        __atomic_store_n(&g_current, t, __ATOMIC_RELEASE);
        t->fn();
        __atomic_store_n(&g_current, NULL, __ATOMIC_RELEASE);
        if (T_.failed) { g_failed++; printf("  FAIL %s/%s (%d checks)\n", t->group, t->name, T_.failed); }
        else if (T_.skipped) g_skipped++;
        else g_passed++;
        fflush(stdout);
    }
    if (list) return 0;
    if (g_skipped) printf("%d passed, %d failed, %d skipped\n", g_passed, g_failed, g_skipped);
    else printf("%d passed, %d failed\n", g_passed, g_failed);
    return g_failed ? 1 : 0;
}
