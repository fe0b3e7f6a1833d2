/* long_context.c - one long request through the scheduler: speed and memory against the formula
 * (issue 6, docs/SERVING.md "Long context").
 *
 *   tools/long_context [--tokens N] [--chunk N] [--gen N] [--backend cuda|cpu] [--model DIR] ...
 *   tools/long_context --help
 *
 * Runs ONE request of --tokens prompt tokens (default 262,144; deterministic pseudo-random ids) and
 * --gen greedy tokens (default 32, EOS ignored) through qsa_sched_*, so the prompt is prefilled in
 * the scheduler's chunks (--chunk, default 8192) and decoded by its batched decode step (CUDA:
 * cuda_batch_decode = 1 and cuda_graphs = 1 unless --eager).  Without --model it writes the built-in
 * tiny random model (tools/make_tiny_model --max-position-embeddings tokens + gen) to a temporary
 * directory.  The KV pool holds exactly the request (--pool-tokens to change that).
 *
 * Prints the scheduler's statistics for the request (time to first token, prefill tok/s, decode
 * tok/s), and its memory next to the formula of docs/SERVING.md, computed here from config.json
 * alone:
 *   * KV pages the request's sequence holds at the end of the run (and the pages reserved for it at
 *     admission) against ceil(n / page_size), n = prompt + gen - 1 (the last token is never fed);
 *     the bytes of one page (from the size of the runtime's pool) against the per-token formula;
 *   * per-sequence state: on CUDA the sequence's one device allocation, on the CPU the sizes of its
 *     host buffers (counted by this tool's allocator: QSA_MALLOC/QSA_REALLOC/QSA_FREE), against the
 *     formula with the documented allocation rules;
 *   * the runtime's host heap after the load and at its peak during it (its allocations, counted by
 *     this tool's allocator; the mapped checkpoint is not among them);
 *   * device memory in use (cuMemGetInfo) before the model is loaded, after, at the peak of the
 *     request (sampled after every scheduler step) and after the request, plus the runtime's own
 *     counters (weights, KV pool, scratch, sequence state).
 *
 * Exit status: 0 when the request completed and every memory figure equals the formula; 1 when the
 * request did not complete (refused, error, wrong number of tokens) or a figure differs ("FAIL"
 * lines say which); 2 for bad arguments or when the model / device cannot be set up.
 */
#define _GNU_SOURCE /* mkdtemp; the header wants it before the first system header (see its top) */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- counting allocator: every host allocation of the runtime carries its size ---- */
static size_t lc_live, lc_peak; /* (the peak: of the live bytes after each growth, racy between threads) */
static void lc_grew(size_t live) {
    if (live > __atomic_load_n(&lc_peak, __ATOMIC_RELAXED)) __atomic_store_n(&lc_peak, live, __ATOMIC_RELAXED);
}
static void *lc_malloc(size_t n) {
    unsigned char *p = (unsigned char *)malloc(n + 16);
    if (!p) return NULL;
    memcpy(p, &n, sizeof n);
    lc_grew(__atomic_add_fetch(&lc_live, n, __ATOMIC_RELAXED));
    return p + 16;
}
static void lc_free(void *q) {
    if (!q) return;
    unsigned char *p = (unsigned char *)q - 16;
    size_t n;
    memcpy(&n, p, sizeof n);
    __atomic_sub_fetch(&lc_live, n, __ATOMIC_RELAXED);
    free(p);
}
static void *lc_realloc(void *q, size_t n) {
    if (!q) return lc_malloc(n);
    unsigned char *p = (unsigned char *)q - 16;
    size_t old;
    memcpy(&old, p, sizeof old);
    unsigned char *np = (unsigned char *)realloc(p, n + 16);
    if (!np) return NULL;
    memcpy(np, &n, sizeof n);
    __atomic_sub_fetch(&lc_live, old, __ATOMIC_RELAXED);
    lc_grew(__atomic_add_fetch(&lc_live, n, __ATOMIC_RELAXED));
    return np + 16;
}
/* bytes requested for a block of the runtime (0 for NULL) */
static size_t lc_size(const void *q) {
    size_t n = 0;
    if (q) memcpy(&n, (const unsigned char *)q - 16, sizeof n);
    return n;
}
#define QSA_MALLOC(sz) lc_malloc(sz)
#define QSA_REALLOC(p, sz) lc_realloc(p, sz)
#define QSA_FREE(p) lc_free(p)

#define QSA_RUNTIME_IMPLEMENTATION
#include "../qsa_runtime.h"

#include <signal.h>
#include <sys/stat.h>

#include "../examples/cli.h"

typedef struct lc_opt {
    long long tokens, pool_tokens;
    int chunk, gen, page_size, threads, device, max_chunk, eager, keep_model, verbose;
    qsa_backend backend;
    const char *model;
    unsigned long long seed;
} lc_opt;

static void usage(FILE *f) {
    fprintf(f,
            "usage: tools/long_context [options]\n"
            "One request through the scheduler: prefill/decode speed, time to first token, and its KV pages and\n"
            "sequence state against the memory formula of docs/SERVING.md (exit 1 when they differ).\n"
            "  --tokens N        prompt tokens (default 262144)\n"
            "  --chunk N         the scheduler's prefill chunk (default 8192)\n"
            "  --gen N           tokens generated, greedy, EOS ignored (default 32; at least 2: the request is measured between steps)\n"
            "  --backend B       cuda or cpu (default cuda)\n"
            "  --model DIR       a model directory (default: the tiny random model written by tools/make_tiny_model\n"
            "                    with max_position_embeddings = tokens + gen, in a temporary directory)\n"
            "  --keep-model      keep that temporary directory\n"
            "  --page-size N     KV page size (default: the runtime's hybrid rule)\n"
            "  --pool-tokens N   KV pool capacity (default: exactly the request, prompt + gen - 1 tokens)\n"
            "  --eager           CUDA: decode without the batched path and CUDA graphs (cuda_batch_decode 0)\n"
            "  --max-chunk N     CUDA: tokens per forward call (qsa_model_params.max_chunk; default 512)\n"
            "  --threads N       CPU threads (default: the runtime's)\n"
            "  --device N        CUDA device (default 0)\n"
            "  --seed N          prompt seed (default 1)\n"
            "  -v                runtime log on stderr\n");
}

static int parse_ll(const char *s, long long lo, long long hi, long long *v) {
    char *end = NULL;
    long long x = strtoll(s, &end, 10);
    if (!s[0] || !end || *end || x < lo || x > hi) return 0;
    *v = x;
    return 1;
}

static int parse_args(int argc, char **argv, lc_opt *o) {
    memset(o, 0, sizeof *o);
    o->tokens = 262144;
    o->chunk = 8192;
    o->gen = 32;
    o->backend = QSA_BACKEND_CUDA;
    o->seed = 1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        long long x = 0;
#define LC_INT(name, lo, hi, dst)                                                                                           \
    if (!strcmp(a, name)) {                                                                                                 \
        if (!v || !parse_ll(v, lo, hi, &x)) { fprintf(stderr, "long_context: %s expects an integer in %lld .. %lld\n", name, \
                                                      (long long)(lo), (long long)(hi)); return 0; }                        \
        dst = x;                                                                                                            \
        i++;                                                                                                                \
        continue;                                                                                                           \
    }
        LC_INT("--tokens", 1, 1LL << 30, o->tokens)
        LC_INT("--chunk", 1, 1LL << 30, o->chunk)
        LC_INT("--gen", 2, 1 << 20, o->gen) /* (a request of one token ends in its prefill step, before it is measured) */
        LC_INT("--page-size", 16, 1 << 20, o->page_size)
        LC_INT("--pool-tokens", 1, 0x7fffffffLL, o->pool_tokens)
        LC_INT("--max-chunk", 1, 1 << 20, o->max_chunk)
        LC_INT("--threads", 1, 1024, o->threads)
        LC_INT("--device", 0, 64, o->device)
        LC_INT("--seed", 0, 1LL << 62, o->seed)
#undef LC_INT
        if (!strcmp(a, "--backend") && v) {
            if (!strcmp(v, "cuda")) o->backend = QSA_BACKEND_CUDA;
            else if (!strcmp(v, "cpu")) o->backend = QSA_BACKEND_CPU;
            else { fprintf(stderr, "long_context: --backend cuda or cpu, not '%s'\n", v); return 0; }
            i++;
        } else if (!strcmp(a, "--model") && v) { o->model = v; i++; }
        else if (!strcmp(a, "--keep-model")) o->keep_model = 1;
        else if (!strcmp(a, "--eager")) o->eager = 1;
        else if (!strcmp(a, "-v")) o->verbose = 1;
        else if (!strcmp(a, "-h") || !strcmp(a, "--help")) { usage(stdout); exit(0); }
        else { fprintf(stderr, "long_context: unknown or incomplete option '%s'\n", a); usage(stderr); return 0; }
    }
    return 1;
}

/* ---- the memory formula of docs/SERVING.md, from the config alone ---- */

typedef struct lc_formula {
    long long n, n_ctx;                       /* tokens held (prompt + gen - 1), the sequence's context */
    int page_size, n_qsa, n_gdn, n_ple;
    long long pages;                          /* ceil(n / page_size) */
    long long page_bytes;                     /* one page of every QSA layer: K, V, raw indexer keys */
    long long kv_bytes;                       /* pages * page_bytes */
    long long gdn_S, gdn_conv, ple_conv, bkeys, btable; /* per-sequence state, as allocated */
    long long state_bytes;
} lc_formula;

static long long r256(long long b) { return (b + 255) / 256 * 256; }

/* gpu: the CUDA backend's layout (K, V FP16; one device allocation per sequence, every part on a
   256-byte boundary; the conv parts carry 16 bytes of slack); else the CPU backend's (K, V FP32;
   separate host buffers; the PLE conv state one float of slack). */
static void lc_formula_compute(const qsa_model_config *c, int page_size, long long n, int gpu, lc_formula *f) {
    memset(f, 0, sizeof *f);
    f->n = n;
    f->n_ctx = n; /* the scheduler creates the sequence with n_ctx = its budget */
    f->page_size = page_size;
    for (int l = 0; l < c->num_hidden_layers; l++) {
        if (c->layer_types[l] == QSA_LAYER_QSA) f->n_qsa++;
        else f->n_gdn++;
    }
    f->n_ple = c->n_ple_layers;
    long long kvd = (long long)c->num_key_value_heads * c->head_dim, ihd = c->has_qsa ? c->indexer_head_dim : 0;
    long long r = c->has_qsa ? c->indexer_compress_ratio : 1;
    f->pages = f->n_qsa ? (n + page_size - 1) / page_size : 0;
    f->page_bytes = (long long)f->n_qsa * page_size * (2 * (gpu ? 2 : 4) * kvd + 4 * ihd);
    f->kv_bytes = f->pages * f->page_bytes;
    long long conv_dim = 2LL * c->linear_num_key_heads * c->linear_key_head_dim + (long long)c->linear_num_value_heads * c->linear_value_head_dim;
    long long S = 4LL * c->linear_num_value_heads * c->linear_key_head_dim * c->linear_value_head_dim;
    long long conv = 4LL * (c->linear_conv_kernel_dim - 1) * conv_dim;
    long long ple = 4LL * (c->ple_conv_kernel_size - 1) * c->ngram_size * c->hc_count * c->hidden_size;
    long long bk = c->has_qsa ? 4LL * (f->n_ctx / r + 1) * ihd : 0;
    long long bt = 4LL * (f->n_ctx / page_size + 1);
    if (gpu) {
        f->gdn_S = f->n_gdn * r256(S);
        f->gdn_conv = f->n_gdn * r256(conv + 16);
        f->ple_conv = f->n_ple * r256(ple + 16);
        f->bkeys = f->n_qsa * r256(c->has_qsa ? bk : 16);
        f->btable = r256(bt);
    } else {
        f->gdn_S = f->n_gdn * S;
        f->gdn_conv = f->n_gdn * conv;
        f->ple_conv = f->n_ple * (ple + 4);
        f->bkeys = f->n_qsa * bk;
        f->btable = bt;
    }
    f->state_bytes = f->gdn_S + f->gdn_conv + f->ple_conv + f->bkeys + f->btable;
}

/* The per-sequence state a CPU sequence actually holds: the sizes of its host buffers. */
static long long lc_cpu_state_bytes(const qsa_seq *s) {
    const qsa_model_config *c = &s->m->cfg;
    long long b = (long long)lc_size(s->bt);
    for (int l = 0; l < c->num_hidden_layers; l++) {
        const qsa__seq_layer *sl = &s->L[l];
        b += (long long)(lc_size(sl->conv) + lc_size(sl->S) + lc_size(sl->bkey) + lc_size(sl->ple_conv));
    }
    return b;
}

/* ---- device memory ---- */

typedef struct lc_dev {
    int on;
#ifndef QSA_NO_CUDA
    CUdevice dev;
    CUcontext ctx;
#endif
    size_t total, used_before, used_loaded, used_peak, used_after;
    char name[160];
} lc_dev;

static size_t lc_dev_used(lc_dev *d) {
#ifdef QSA_NO_CUDA
    (void)d;
    return 0;
#else
    size_t fr = 0, tot = 0;
    if (!d->on || qsa__cu.cuMemGetInfo_v2(&fr, &tot) != 0) return 0;
    d->total = tot;
    return tot - fr;
#endif
}

static int lc_dev_open(lc_dev *d, int ordinal) {
#ifdef QSA_NO_CUDA
    (void)d; (void)ordinal;
    fprintf(stderr, "long_context: built with QSA_NO_CUDA: use --backend cpu\n");
    return 0;
#else
    memset(d, 0, sizeof *d);
    if (qsa__cuda_load() != QSA_OK || qsa__cu.device_count <= ordinal) {
        fprintf(stderr, "long_context: no CUDA device %d: %s\n", ordinal, qsa_last_error());
        return 0;
    }
    qsa__gpu_info info;
    if (qsa__cu_device_info(ordinal, &info) != QSA_OK || qsa__cu.cuDeviceGet(&d->dev, ordinal) != 0 ||
        qsa__cu.cuDevicePrimaryCtxRetain(&d->ctx, d->dev) != 0 || qsa__cu.cuCtxSetCurrent(d->ctx) != 0) {
        fprintf(stderr, "long_context: cannot open CUDA device %d: %s\n", ordinal, qsa_last_error());
        return 0;
    }
    snprintf(d->name, sizeof d->name, "%s (cc %d.%d)", info.name, info.cc_major, info.cc_minor);
    d->on = 1;
    d->used_before = lc_dev_used(d);
    return 1;
#endif
}

/* ---- the model ---- */

/* tools/make_tiny_model next to this program (or in tools/ when run through $PATH) */
static int lc_write_model(const char *argv0, const char *dir, long long max_pos) {
    char gen[4096];
    const char *slash = strrchr(argv0, '/');
    if (slash) snprintf(gen, sizeof gen, "%.*s/make_tiny_model", (int)(slash - argv0), argv0);
    else snprintf(gen, sizeof gen, "tools/make_tiny_model");
    struct stat st;
    if (stat(gen, &st) != 0) {
        fprintf(stderr, "long_context: %s not found (run make, or pass --model DIR)\n", gen);
        return 0;
    }
    char cmd[8400];
    snprintf(cmd, sizeof cmd, "'%s' '%s' --max-position-embeddings %lld >&2", gen, dir, max_pos);
    if (system(cmd) != 0) {
        fprintf(stderr, "long_context: '%s' failed\n", cmd);
        return 0;
    }
    return 1;
}

static void lc_prompt(int32_t *ids, long long n, unsigned long long seed, const qsa_model_config *c) {
    uint64_t x = 0x9e3779b97f4a7c15ull * (seed + 1);
    for (long long i = 0; i < n; i++) {
        int32_t t;
        for (;;) { /* never an EOS id: the prompt is one document */
            x = x * 6364136223846793005ull + 1442695040888963407ull;
            t = (int32_t)((x >> 33) % (uint64_t)c->vocab_size);
            int eos = 0;
            for (int k = 0; k < c->n_eos; k++) eos |= c->eos_token_ids[k] == t;
            if (!eos) break;
        }
        ids[i] = t;
    }
}

static double mib(double b) { return b / 1048576.0; }

static int g_fail;
static void check(int ok, const char *what, const char *fmt, ...) QSA__PRINTF(3, 4);
static void check(int ok, const char *what, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    printf("  %-22s ", what);
    vprintf(fmt, ap);
    printf("  %s\n", ok ? "[= formula]" : "[DIFFERS: FAIL]");
    va_end(ap);
    if (!ok) g_fail++;
}

/* the generated model's directory, removed at exit unless --keep-model */
static char g_tmpdir[64];
static void lc_cleanup(void) {
    if (!g_tmpdir[0]) return;
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_tmpdir);
    if (system(cmd) != 0) fprintf(stderr, "long_context: could not remove %s\n", g_tmpdir);
}

/* On SIGINT / SIGTERM / SIGHUP (atexit does not run): the generated model's files, unlinked by their
   names (async-signal-safe), then the directory; the signal is raised again to end the program. */
static char g_tmpfiles[5][320];
static void lc_on_signal(int sig) {
    for (int i = 0; i < 5; i++) unlink(g_tmpfiles[i]);
    rmdir(g_tmpdir);
    signal(sig, SIG_DFL);
    raise(sig);
}

static const char *lc_stop_name(qsa_stop_reason r) {
    static const char *const names[] = {"none", "eos", "stop string", "max_tokens", "callback"};
    return (unsigned)r < 5 ? names[r] : "?";
}

int main(int argc, char **argv) {
    cli_check_stdout("long_context");
    lc_opt o;
    if (!parse_args(argc, argv, &o)) return 2;
    if (o.verbose) qsa_set_logger(qsa_log_stderr, NULL, QSA_LOG_INFO);
    int gpu = o.backend == QSA_BACKEND_CUDA;
    long long n_held = o.tokens + o.gen - 1; /* the last generated token is never fed */
    if (n_held > INT32_MAX / 2) { fprintf(stderr, "long_context: --tokens + --gen too large\n"); return 2; }

    lc_dev dev;
    memset(&dev, 0, sizeof dev);
    if (gpu && !lc_dev_open(&dev, o.device)) return 2;

    /* the model */
    char tmpdir[] = "/tmp/qsa_long_context_XXXXXX";
    const char *dir = o.model;
    if (!dir) {
        if (!mkdtemp(tmpdir)) { perror("long_context: mkdtemp"); return 2; }
        dir = tmpdir;
        if (!o.keep_model) {
            snprintf(g_tmpdir, sizeof g_tmpdir, "%s", tmpdir);
            atexit(lc_cleanup);
            static const char *const names[5] = {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
                                                 "tokenizer_config.json"};
            for (int i = 0; i < 5; i++) snprintf(g_tmpfiles[i], sizeof g_tmpfiles[i], "%s/%s", tmpdir, names[i]);
            signal(SIGINT, lc_on_signal);
            signal(SIGTERM, lc_on_signal);
            signal(SIGHUP, lc_on_signal);
        }
        /* (make_tiny_model's context is at least 16 tokens) */
        if (!lc_write_model(argv[0], dir, o.tokens + o.gen < 16 ? 16 : o.tokens + o.gen)) return 2;
    }
    qsa_model_config cfg;
    if (qsa_config_load_dir(dir, &cfg) != QSA_OK) { fprintf(stderr, "long_context: %s\n", qsa_last_error()); return 2; }
    if (cfg.max_position_embeddings < n_held || cfg.max_position_embeddings <= o.tokens) {
        fprintf(stderr, "long_context: the model's context is %d tokens; the request needs %lld (prompt %lld + gen %d - 1)\n",
                cfg.max_position_embeddings, n_held, o.tokens, o.gen);
        return 2;
    }
    qsa_model_params mp;
    memset(&mp, 0, sizeof mp);
    mp.backend = o.backend;
    mp.n_threads = o.threads;
    mp.device = o.device;
    mp.kv_page_size = o.page_size;
    mp.max_chunk = o.max_chunk;
    mp.no_tokenizer = 1;
    mp.cuda_batch_decode = !o.eager;
    mp.cuda_graphs = !o.eager;
    mp.max_batch = 1;
    int page_size = o.page_size ? o.page_size : qsa__default_page_size(&cfg);
    mp.kv_pool_tokens = (int)(o.pool_tokens ? o.pool_tokens : (n_held + page_size - 1) / page_size * page_size);
    qsa_model *m = NULL;
    double t_load = qsa__now();
    if (qsa_model_load(dir, &mp, &m) != QSA_OK) {
        fprintf(stderr, "long_context: loading %s: %s\n", dir, qsa_last_error());
        return 2;
    }
    t_load = qsa__now() - t_load;
    size_t host_loaded = __atomic_load_n(&lc_live, __ATOMIC_RELAXED), host_load_peak = __atomic_load_n(&lc_peak, __ATOMIC_RELAXED);
    dev.used_loaded = lc_dev_used(&dev);
    lc_formula f;
    lc_formula_compute(&cfg, m->pool.page_size, n_held, gpu, &f);

    printf("long_context: %s backend%s%s, model %s\n", gpu ? "CUDA" : "CPU", gpu ? " on " : "", gpu ? dev.name : "", o.model ? dir : "(tiny random, generated)");
    printf("  model: %d layers (%d QSA, %d GDN, %d PLE), hidden %d, context %d, QSA r %d budget %d, loaded in %.2f s\n",
           cfg.num_hidden_layers, f.n_qsa, f.n_gdn, f.n_ple, cfg.hidden_size, cfg.max_position_embeddings,
           cfg.indexer_compress_ratio, cfg.indexer_budget, t_load);
    printf("  host heap: the runtime's allocations %.1f MiB after the load (%.1f MiB at its peak); the checkpoint is "
           "mapped, not counted\n", mib((double)host_loaded), mib((double)host_load_peak));
    printf("  KV pool: %d pages of %d tokens (%d tokens)%s\n", m->pool.n_pages, m->pool.page_size,
           m->pool.n_pages * m->pool.page_size, gpu ? (o.eager ? "; decode: eager" : "; decode: batched path + CUDA graphs") : "");
    printf("  request: %lld prompt tokens in chunks of %d, %d generated (greedy, EOS ignored)\n", o.tokens, o.chunk, o.gen);
    fflush(stdout);

    int32_t *prompt = (int32_t *)malloc(sizeof(int32_t) * (size_t)o.tokens);
    if (!prompt) { fprintf(stderr, "long_context: out of memory\n"); return 2; }
    lc_prompt(prompt, o.tokens, o.seed, &cfg);

    qsa_sched_params sp;
    memset(&sp, 0, sizeof sp);
    sp.prefill_chunk = o.chunk;
    sp.max_batch = 1;
    qsa_sched *s = NULL;
    if (qsa_sched_create(m, &sp, &s) != QSA_OK) { fprintf(stderr, "long_context: %s\n", qsa_last_error()); return 2; }
    qsa_request_params rp;
    memset(&rp, 0, sizeof rp);
    rp.prompt = prompt;
    rp.n_prompt = (int)o.tokens;
    rp.max_tokens = o.gen;
    rp.ignore_eos = 1;
    int64_t id = 0;
    if (qsa_sched_submit(s, &rp, &id) != QSA_OK) {
        printf("FAIL: the request was refused at submit: %s\n", qsa_last_error());
        return 1;
    }

    /* step, watching the request's sequence and the device */
    long long pages_held = 0, pages_promised = -1, state_measured = -1;
    size_t state_counter = 0;
    (void)state_counter; /* CUDA only */
    double t_prev = qsa__now(), first_chunk_s = 0, last_chunk_s = 0;
    int prev_fed = 0, n_chunks = 0;
    dev.used_peak = dev.used_loaded;
    while (qsa_sched_active(s)) {
        if (qsa_sched_step(s) != QSA_OK) { printf("FAIL: qsa_sched_step: %s\n", qsa_last_error()); return 1; }
        const qsa__sched_req *q = qsa__sched_find(s, id, NULL);
        if (q && q->seq) {
            if (pages_promised < 0) pages_promised = q->reserved + q->seq->n_pages;
            if (q->seq->n_pages > pages_held) pages_held = q->seq->n_pages;
#ifndef QSA_NO_CUDA
            if (gpu) {
                state_measured = (long long)q->seq->cuda->mem_bytes;
                state_counter = m->cuda->bytes_state;
            } else
#endif
                state_measured = lc_cpu_state_bytes(q->seq);
        }
        size_t used = lc_dev_used(&dev);
        if (used > dev.used_peak) dev.used_peak = used;
        double now = qsa__now();
        if (q && q->n_fed > prev_fed) {
            double dt = now - t_prev;
            if (!n_chunks++) first_chunk_s = dt;
            last_chunk_s = dt;
            fprintf(stderr, "  prefill %d / %lld tokens: chunk of %d in %.3f s (%.0f tok/s)\n", q->n_fed, o.tokens,
                    q->n_fed - prev_fed, dt, (q->n_fed - prev_fed) / (dt > 0 ? dt : 1e-9));
            prev_fed = q->n_fed;
        }
        t_prev = now;
    }
    qsa_request_result res;
    if (qsa_sched_poll(s, id, &res) != QSA_OK) { printf("FAIL: qsa_sched_poll: %s\n", qsa_last_error()); return 1; }
    dev.used_after = lc_dev_used(&dev);

    /* the request */
    int complete = res.status == QSA_REQ_DONE && res.n_tokens == o.gen && res.stop == QSA_STOP_MAX_TOKENS &&
                   res.n_prompt_fed == o.tokens;
    uint64_t h = 1469598103934665603ull;
    for (int i = 0; i < res.n_tokens; i++) h = (h ^ (uint64_t)(uint32_t)res.tokens[i]) * 1099511628211ull;
    printf("result: %s, %d of %d tokens, stop %s%s%s (tokens fnv1a 0x%016llx:", qsa_request_status_string(res.status),
           res.n_tokens, o.gen, lc_stop_name(res.stop), res.message && res.message[0] ? ": " : "", res.message ? res.message : "",
           (unsigned long long)h);
    for (int i = 0; i < res.n_tokens && i < 8; i++) printf(" %d", res.tokens[i]);
    printf("%s)\n", res.n_tokens > 8 ? " ..." : "");
    if (!complete) { printf("FAIL: the request did not complete\n"); g_fail++; }
    const qsa_stats *st = &res.stats;
    printf("  time to first token  %.3f s (queued %.3f s)\n", st->ttft_s, res.queue_s);
    printf("  prefill              %.1f tok/s (%d tokens in %.3f s, %d chunks; first chunk %.3f s, last %.3f s)\n",
           st->prefill_tok_s, st->n_prompt, st->prefill_s, n_chunks, first_chunk_s, last_chunk_s);
    printf("  decode               %.1f tok/s (%d tokens after the first in %.3f s, context %lld)\n", st->decode_tok_s,
           res.n_tokens > 0 ? res.n_tokens - 1 : 0, st->decode_s, o.tokens);

    /* memory against the formula */
    printf("memory (n = %lld tokens held = prompt + gen - 1; %s layout):\n", n_held, gpu ? "CUDA" : "CPU");
    long long pool_bytes;
#ifndef QSA_NO_CUDA
    if (gpu) pool_bytes = (long long)m->cuda->bytes_kv;
    else
#endif
        pool_bytes = m->pool.ik ? (long long)(lc_size(m->pool.k) + lc_size(m->pool.v) + lc_size(m->pool.ik)) - 4 : 0; /* ik: one float of slack */
    long long page_bytes = m->pool.n_pages ? pool_bytes / m->pool.n_pages : 0;
    check(pages_held == f.pages, "KV pages held", "%lld (ceil(%lld / %d) = %lld)", pages_held, n_held, f.page_size, f.pages);
    check(pages_promised == f.pages, "KV pages reserved", "%lld at admission", pages_promised);
    check(page_bytes == f.page_bytes && pool_bytes == f.page_bytes * m->pool.n_pages, "KV bytes per page",
          "%lld (pool %.2f MiB / %d pages; formula %d QSA x %d tokens x %lld B)", page_bytes, mib((double)pool_bytes),
          m->pool.n_pages, f.n_qsa, f.page_size, f.n_qsa && f.page_size ? f.page_bytes / f.n_qsa / f.page_size : 0);
    check(pages_held * page_bytes == f.kv_bytes, "KV bytes of request", "%lld = %.2f MiB (%.1f B per token)",
          pages_held * page_bytes, mib((double)(pages_held * page_bytes)), n_held ? (double)(pages_held * page_bytes) / n_held : 0.0);
    check(state_measured == f.state_bytes, "sequence state", "%lld B = %.3f MiB measured (%s), formula %lld B", state_measured,
          mib((double)state_measured), gpu ? "its device allocation" : "its host buffers", f.state_bytes);
    printf("  %-22s GDN recurrent %lld, GDN conv %lld, PLE conv %lld, block keys %lld, block table %lld\n", "  formula parts", f.gdn_S,
           f.gdn_conv, f.ple_conv, f.bkeys, f.btable);
    printf("  %-22s %.2f MiB (KV pages + state)\n", "request total", mib((double)(f.kv_bytes + f.state_bytes)));
    if (gpu) {
#ifndef QSA_NO_CUDA
        check(state_counter == (size_t)f.state_bytes, "runtime state counter", "%zu B while the request ran", state_counter);
        check(m->cuda->bytes_state == 0, "state after the request", "%zu B", m->cuda->bytes_state);
        printf("  device memory in use  before load %.1f MiB, after load %.1f MiB, peak during the request %.1f MiB (+%.1f), "
               "after %.1f MiB; of %.1f MiB (cuMemGetInfo)\n", mib((double)dev.used_before), mib((double)dev.used_loaded),
               mib((double)dev.used_peak), mib((double)dev.used_peak - (double)dev.used_loaded), mib((double)dev.used_after),
               mib((double)dev.total));
        printf("  runtime counters      weights %.1f MiB, KV pool %.1f MiB, scratch %.1f MiB (batched decode buffers included)\n",
               mib((double)m->cuda->bytes_weights), mib((double)m->cuda->bytes_kv), mib((double)m->cuda->bytes_scratch));
#endif
    }
    qsa_sched_info in;
    qsa_sched_get_info(s, &in);
    if (in.pages_free != in.pages_total || in.pages_reserved != 0) {
        printf("FAIL: after the request the pool has %d of %d pages free, %d reserved\n", in.pages_free, in.pages_total, in.pages_reserved);
        g_fail++;
    }
    qsa_sched_free(s);
    qsa_model_free(m);
    free(prompt);
    if (!o.model && o.keep_model) printf("model kept in %s\n", tmpdir);
#ifndef QSA_NO_CUDA
    if (dev.on) qsa__cu.cuDevicePrimaryCtxRelease_v2(dev.dev);
#endif
    printf("long_context: %s\n", g_fail ? "FAIL" : "PASS");
    return g_fail ? 1 : 0;
}
