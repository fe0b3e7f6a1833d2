/* tests/t_gpu.c - the whole model on the CUDA backend (group gpu; skipped without a device).
 *
 * Tolerances (docs/CUDA.md): GEMM operands are FP16 (activations rounded to 11 significant bits
 * before every projection, FP16 weights), accumulation and everything else FP32.  Against the fp32
 * reference that gives logit errors of a few 1e-3 relative to the logit scale on the tiny golden
 * models, so logits must satisfy max |d| <= 2e-2 + 5e-3 * max(1, max |logit|).  Greedy tokens must
 * be equal (the goldens have top-1/top-2 gaps >= 0.011, checked by the generator).  QSA selections
 * may differ only where the reference's score gap is below 2e-3 (FP16 activations move indexer
 * scores by about that much).  Logits rows of tokens whose MoE routing has a near-tie on the CPU
 * (k-th and (k+1)-th expert probabilities within 1e-3 at some layer) are excused from the logits
 * tolerance and counted: FP16 can pick the other expert there (the random golden models have a few
 * such ties; tools/make_goldens.py reports the smallest margin).  After the first such tie, rows that
 * miss the tolerance are held to 0.1 * max(1, max |logit|) and counted (one token routed to another
 * expert changes the GDN state and the keys of every later token); their QSA selections likewise.
 * Greedy tokens must still be equal everywhere.
 */

static int gpu_model(const char *fixture, qsa_model_params *mp, qsa_model **m) {
    char dir[600];
    snprintf(dir, sizeof dir, "%s/%s", test_path("tests/fixtures"), fixture);
    mp->backend = QSA_BACKEND_CUDA;
    qsa_result r = qsa_model_load(dir, mp, m);
    if (r == QSA_ERR_NO_DEVICE) return 0;
    CHECK_OK(r);
    return r == QSA_OK;
}

#define GPU_OR_SKIP(fixture, mp, m) \
    do { if (!gpu_model(fixture, mp, m)) { if (T_.failed) return; SKIP("no CUDA device: %s", qsa_last_error()); } } while (0)
/* The tiny sharded model (hyper-connections, PLE shards) on the GPU with the batched decode and CUDA
   graph parameters given (0: the defaults) */
#define SHARDED_OR_SKIP(batch_decode, graphs, m)             \
    do {                                                     \
        qsa_model_params mp_;                                \
        memset(&mp_, 0, sizeof mp_);                         \
        mp_.cuda_batch_decode = (batch_decode);              \
        mp_.cuda_graphs = (graphs);                          \
        GPU_OR_SKIP("qsa_hc4_ple_sharded", &mp_, m);         \
    } while (0)

static void gpu_tolerances(void) {
    g_backend = QSA_BACKEND_CUDA;
    g_atol = 2e-2f;
    g_rtol = 5e-3f;
    g_sel_eps = 2e-3f;
    g_route_eps = 1e-3f;
    g_after_tie_rtol = 0.1f;
}
static void cpu_tolerances(void) {
    g_backend = QSA_BACKEND_CPU;
    g_atol = 1e-5f;
    g_rtol = 1e-4f;
    g_sel_eps = QSA_SEL_EPS;
    g_route_eps = 0.0f;
}

TEST(gpu, golden_fixtures_match_reference) {
    qsa_model_params mp;
    memset(&mp, 0, sizeof mp);
    qsa_model *m = NULL;
    GPU_OR_SKIP("qsa_first_no_ple", &mp, &m);
    qsa_model_free(m);
    char names[32][256];
    int nf = fixture_dirs(names, 32);
    gpu_tolerances();
    for (int i = 0; i < nf; i++) {
        printf("    fixture %s\n", names[i]);
        run_golden(names[i], 0, 0);
        run_golden(names[i], 7, 0);
    }
    cpu_tolerances();
}

/* Greedy generation gives the same tokens on the GPU as on the CPU, for every fixture, the GPU's
   model holding no host copies of its dense weights. */
TEST(gpu, greedy_tokens_equal_cpu) {
    qsa_model_params mp;
    memset(&mp, 0, sizeof mp);
    qsa_model *gm = NULL;
    GPU_OR_SKIP("qsa_first_no_ple", &mp, &gm);
    qsa_model_free(gm);
    char names[32][256];
    int nf = fixture_dirs(names, 32);
    for (int i = 0; i < nf; i++) {
        qsa_generation out[2];
        for (int b = 0; b < 2; b++) {
            char dir[600];
            if (snprintf(dir, sizeof dir, "%s/%s", test_path("tests/fixtures"), names[i]) >= (int)sizeof dir) return;
            memset(&mp, 0, sizeof mp);
            mp.backend = b ? QSA_BACKEND_CUDA : QSA_BACKEND_CPU;
            qsa_model *m = NULL;
            CHECK_OK(qsa_model_load(dir, &mp, &m));
            if (!m) return;
            if (b) /* uploaded to one GPU: the host's fp32 copies are gone, its PLE tables kept (qsa__model_drop_dense) */
                for (int l = 0; l < m->cfg.num_hidden_layers; l++)
                    CHECKF(m->n_owned == 0 && m->bytes_f32 == 0 && !m->embed && !m->layers[l].gdn.in_qkv.w &&
                               (!m->layers[l].ple || m->layers[l].ple->head_vocab),
                           "%s layer %d: host weights left after the upload", names[i], l);
            qsa__st_set g;
            char gpath[700];
            if (snprintf(gpath, sizeof gpath, "%s/golden.safetensors", dir) >= (int)sizeof gpath) return;
            CHECK_OK(qsa__st_open_file(gpath, &g));
            const qsa__tensor *pt = qsa__st_find(&g, "prompt_ids");
            int n = (int)pt->shape[0];
            int32_t *ids = (int32_t *)malloc(sizeof(int32_t) * (size_t)n);
            for (int k = 0; k < n; k++) { int64_t v; memcpy(&v, pt->data + 8 * k, 8); ids[k] = (int32_t)v; }
            qsa_seq *s = NULL;
            CHECK_OK(qsa_seq_create(m, NULL, &s));
            qsa_generate_params gp;
            memset(&gp, 0, sizeof gp);
            gp.max_tokens = 24;
            gp.ignore_eos = 1;
            CHECK_OK(qsa_generate(s, ids, n, &gp, &out[b]));
            qsa_seq_free(s);
            free(ids);
            qsa__st_close(&g);
            qsa_model_free(m);
        }
        CHECKF(out[0].n_tokens == out[1].n_tokens && !memcmp(out[0].tokens, out[1].tokens, sizeof(int32_t) * (size_t)out[0].n_tokens),
               "%s: greedy tokens differ between CPU and GPU", names[i]);
        if (T_.verbose) printf("    %s: %d greedy tokens equal; GPU decode %.0f tok/s\n", names[i], out[1].n_tokens, out[1].stats.decode_tok_s);
        qsa_generation_free(&out[0]);
        qsa_generation_free(&out[1]);
    }
}

/* On the GPU too, feeding a prompt in chunks of any size gives the same bits as one pass. */
TEST(gpu, chunked_prefill_bitwise) {
    qsa_model *m = NULL;
    SHARDED_OR_SKIP(0, 0, &m);
    int n = 150, V = m->cfg.vocab_size;
    int32_t ids[150];
    for (int i = 0; i < n; i++) ids[i] = (int32_t)((i * 37 + 11) % V);
    ids[20] = ids[21] = m->cfg.eos_token_ids[0];
    static const int chunks[] = {0, 1, 7, 64};
    float *ref = (float *)malloc(sizeof(float) * (size_t)n * V), *lg = (float *)malloc(sizeof(float) * (size_t)n * V);
    for (int k = 0; k < 4; k++) {
        qsa_seq *s = NULL;
        CHECK_OK(qsa_seq_create(m, NULL, &s));
        if (!s) break;
        for (int p = 0; p < n;) {
            int len = chunks[k] > 0 && chunks[k] < n - p ? chunks[k] : n - p;
            CHECK_OK(qsa_seq_feed(s, ids + p, len, (k ? lg : ref) + (size_t)p * V, 1));
            p += len;
        }
        if (k) CHECKF(!memcmp(lg, ref, sizeof(float) * (size_t)n * V), "GPU chunk %d: logits differ from one pass", chunks[k]);
        qsa_seq_free(s);
    }
    free(ref);
    free(lg);
    qsa_model_free(m);
}

TEST(gpu, allocation_and_page_size_invariance) {
    qsa_model_params mp;
    memset(&mp, 0, sizeof mp);
    qsa_model *m = NULL;
    GPU_OR_SKIP("qsa_first_no_ple", &mp, &m);
    qsa_model_free(m);
    int differ, runs = inv_allocations("qsa_hc4_ple_sharded", QSA_BACKEND_CUDA, 0, 0, &differ);
    CHECKF(runs >= 60, "only %d runs", runs);
    CHECKF(differ == 0, "GPU: %d of %d allocations/page sizes changed the bits", differ, runs);
    printf("    GPU: %d allocations/page sizes, %d differ\n", runs, differ);
}

/* cpu/allocation_invariance_across_page_boundaries on the GPU: a request over several pages of every size */
TEST(gpu, allocation_invariance_across_page_boundaries) {
    qsa_model_params mp;
    memset(&mp, 0, sizeof mp);
    qsa_model *m = NULL;
    GPU_OR_SKIP("qsa_first_no_ple", &mp, &m);
    qsa_model_free(m);
    static const int page_sizes[] = {16, 17, 19, 400, 784};
    int differ, runs = inv_allocations_ex("qsa_hc4_ple_sharded", QSA_BACKEND_CUDA, 0, 0, page_sizes, 5, 784 + 29, 5, &differ);
    CHECKF(runs >= 24, "only %d runs", runs);
    CHECKF(differ == 0, "GPU: %d of %d allocations/page sizes changed the bits", differ, runs);
    printf("    GPU: %d allocations/page sizes over several pages each, %d differ\n", runs, differ);
}

TEST(gpu, physical_order_plan_breaks_invariance) {
    qsa_model_params mp;
    memset(&mp, 0, sizeof mp);
    qsa_model *m = NULL;
    GPU_OR_SKIP("qsa_first_no_ple", &mp, &m);
    qsa_model_free(m);
    int differ, runs = inv_allocations("qsa_hc4_ple_sharded", QSA_BACKEND_CUDA, 1, 0, &differ);
    printf("    GPU physical-order plans: %d of %d allocations/page sizes changed the bits\n", differ, runs);
    CHECKF(differ > 0, "GPU: the physical-order plan changed nothing in %d runs", runs);
}

/* The kernel module comes from the disk cache the second time; report cold and warm times. */
TEST(gpu, jit_disk_cache_cold_warm) {
    char dir[64];
    snprintf(dir, sizeof dir, "/tmp/qsa_jit_cache_%d", (int)getpid());
    setenv("QSA_CACHE_DIR", dir, 1);
    double t[2] = {0, 0};
    int cached[2] = {0, 0};
    for (int i = 0; i < 2; i++) {
        qsa_model_params mp;
        memset(&mp, 0, sizeof mp);
        qsa_model *m = NULL;
        if (!gpu_model("qsa_first_no_ple", &mp, &m)) { unsetenv("QSA_CACHE_DIR"); if (T_.failed) return; SKIP("no CUDA device"); }
        t[i] = m->cuda->jit_seconds;
        cached[i] = m->cuda->jit_from_cache;
        if (i == 0)
            printf("    arch %s; memory: weights %.2f MiB, KV %.2f MiB, scratch %.2f MiB\n", m->cuda->arch,
                   m->cuda->bytes_weights / 1048576.0, m->cuda->bytes_kv / 1048576.0, m->cuda->bytes_scratch / 1048576.0);
        qsa_model_free(m);
    }
    printf("    kernels: cold %.3f s (compiled), warm %.3f s (%s)\n", t[0], t[1], cached[1] ? "disk cache" : "compiled again");
    CHECK(!cached[0] && cached[1]);
    /* a corrupt cache entry is a miss, not an error */
    char cmd[256];
    snprintf(cmd, sizeof cmd, "for f in %s/kernels-*; do printf garbage > \"$f\"; done", dir);
    CHECK(system(cmd) == 0);
    qsa_model_params mp;
    memset(&mp, 0, sizeof mp);
    qsa_model *m = NULL;
    CHECK(gpu_model("qsa_first_no_ple", &mp, &m));
    if (m) { CHECK(!m->cuda->jit_from_cache); qsa_model_free(m); }
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    CHECK(system(cmd) == 0);
    unsetenv("QSA_CACHE_DIR");
}

/* ============================================================================================== */
/* Batched decode and CUDA graphs (issue 6; ./tests/test_qsa --group gpu --filter batch -v).          */
/* Requests have prompts of different lengths (3..99 tokens); each is prefilled alone, then decoded */
/* greedily BD_STEPS steps.  "Alone" = qsa_seq_feed one token at a time; every batched run must     */
/* give every request the same logits and tokens, bit for bit, whatever its batch and slot.         */
/* ============================================================================================== */
#define BD_MAXREQ 40
#define BD_STEPS 6

static int bd_prompt(int q, int V, int32_t *ids) {
    int n = 3 + (q * 29) % 97;
    for (int i = 0; i < n; i++) ids[i] = (int32_t)((q * 131 + i * 37 + 11) % V);
    return n;
}

static int32_t bd_argmax(const float *x, int V) {
    int b = 0;
    for (int i = 1; i < V; i++) if (x[i] > x[b]) b = i;
    return b;
}

/* Runs requests reqs[0..nreq) (ids of bd_prompt) in that slot order; batched 1: qsa_seq_feed_batch
   steps; 0: qsa_seq_feed per request through the chunked forward (cuda_batch_decode off for those
   feeds: the reference); 2: qsa_seq_feed per request with the model's parameters (one token: the
   batched step for a batch of one); 3: qsa_seq_feed_batch_greedy steps (the tokens only: lg is not
   written).  Writes lg[req][step][V] and tok[req][step] by request id.
   shuffle: permute the pool's free list with this seed first (0: no), and hold pages with a filler
   sequence between the prefills (allocation invariance). */
static int bd_host_rows; /* bd_run's logits rows in qsa_host_alloc's memory (else malloc's) */
static void bd_run(qsa_model *m, const int *reqs, int nreq, int batched, uint64_t shuffle, float *lg, int32_t *tok) {
    int V = m->cfg.vocab_size;
    qsa_seq *seqs[BD_MAXREQ] = {0}, *filler = NULL;
    int32_t cur[BD_MAXREQ], ids[128];
    size_t rb = sizeof(float) * (size_t)V * BD_MAXREQ;
    float *row = (float *)(bd_host_rows ? qsa_host_alloc(m, rb) : malloc(rb));
    if (!row) { CHECK(row != NULL); return; }
    if (shuffle) {
        qsa__pool_shuffle(&m->pool, shuffle);
        CHECK_OK(qsa_seq_create(m, NULL, &filler));
    }
    for (int k = 0; k < nreq; k++) {
        CHECK_OK(qsa_seq_create(m, NULL, &seqs[k]));
        if (!seqs[k]) goto done;
        int n = bd_prompt(reqs[k], V, ids);
        CHECK_OK(qsa_seq_feed(seqs[k], ids, n, row, 0));
        cur[k] = bd_argmax(row, V);
        if (filler) CHECK_OK(qsa_seq_feed(filler, ids, 1 + k % 5, NULL, 0)); /* pages taken between requests */
    }
    for (int st = 0; st < BD_STEPS && !T_.failed; st++) {
        if (batched == 3) {
            int32_t next[BD_MAXREQ];
            CHECK_OK(qsa_seq_feed_batch_greedy(seqs, cur, nreq, next));
            for (int k = 0; k < nreq; k++) cur[k] = tok[reqs[k] * BD_STEPS + st] = next[k];
            continue;
        }
        if (batched == 1) CHECK_OK(qsa_seq_feed_batch(seqs, cur, nreq, row));
        else {
            int keep = m->params.cuda_batch_decode;
            if (batched == 0) m->params.cuda_batch_decode = 0;
            for (int k = 0; k < nreq; k++) CHECK_OK(qsa_seq_feed(seqs[k], &cur[k], 1, row + (size_t)k * V, 0));
            m->params.cuda_batch_decode = keep;
        }
        for (int k = 0; k < nreq; k++) {
            memcpy(lg + ((size_t)reqs[k] * BD_STEPS + st) * V, row + (size_t)k * V, sizeof(float) * (size_t)V);
            cur[k] = tok[reqs[k] * BD_STEPS + st] = bd_argmax(row + (size_t)k * V, V);
        }
    }
done:
    for (int k = 0; k < nreq; k++) qsa_seq_free(seqs[k]);
    qsa_seq_free(filler);
    if (bd_host_rows) qsa_host_free(row);
    else free(row);
}

/* Do requests reqs[0..n) have the same tokens as in the reference? */
static int bd_tok_same(const int *reqs, int n, const int32_t *rtok, const int32_t *tok) {
    for (int k = 0; k < n; k++)
        if (memcmp(tok + (size_t)reqs[k] * BD_STEPS, rtok + (size_t)reqs[k] * BD_STEPS, sizeof(int32_t) * BD_STEPS)) return 0;
    return 1;
}

/* Do requests reqs[0..n) have the same bits in (lg, tok) as in the reference? */
static int bd_same(const qsa_model *m, const int *reqs, int n, const float *ref, const int32_t *rtok, const float *lg,
                   const int32_t *tok) {
    size_t V = (size_t)m->cfg.vocab_size;
    for (int k = 0; k < n; k++) {
        size_t o = (size_t)reqs[k] * BD_STEPS;
        if (memcmp(lg + o * V, ref + o * V, sizeof(float) * V * BD_STEPS) || memcmp(tok + o, rtok + o, sizeof(int32_t) * BD_STEPS))
            return 0;
    }
    return 1;
}

/* The batches of the acceptance test: B requests containing `target`, target in slot `slot`. */
static int bd_batch(int B, int target, int slot, int *reqs) {
    for (int k = 0, q = 0; k < B; k++) {
        if (k == slot) { reqs[k] = target; continue; }
        if (q == target) q++;
        reqs[k] = q++;
    }
    return B;
}

/* Two runs of the batch tests: the reference's logits and tokens (ref, rtok) and the run compared
   with it (lg, tok), for up to BD_MAXREQ requests of BD_STEPS steps. */
typedef struct bd_pair {
    float *ref, *lg;
    int32_t rtok[BD_MAXREQ * BD_STEPS], tok[BD_MAXREQ * BD_STEPS];
} bd_pair;

static void bd_pair_free(bd_pair *p) {
    if (!p) return;
    free(p->ref);
    free(p->lg);
    free(p);
}
/* NULL (a failed check) when out of memory. */
static bd_pair *bd_pair_new(const qsa_model *m) {
    size_t n = (size_t)BD_MAXREQ * BD_STEPS * (size_t)m->cfg.vocab_size;
    bd_pair *p = (bd_pair *)calloc(1, sizeof *p);
    if (p) {
        p->ref = (float *)calloc(n, sizeof(float));
        p->lg = (float *)calloc(n, sizeof(float));
    }
    if (!p || !p->ref || !p->lg) {
        bd_pair_free(p);
        CHECKF(0, "out of host memory for the batch tests' logits");
        return NULL;
    }
    return p;
}
/* Do requests reqs[0..n) have the same bits in both runs? */
static int bd_pair_same(const qsa_model *m, const int *reqs, int n, const bd_pair *p) {
    return bd_same(m, reqs, n, p->ref, p->rtok, p->lg, p->tok);
}
/* The reference of the invariance tests: requests 0..nreq-1, each alone. */
static void bd_reference(qsa_model *m, int nreq, bd_pair *p) {
    for (int q = 0; q < nreq; q++) bd_run(m, &q, 1, 0, 0, p->ref, p->rtok);
}

/* (a) Issue 6 acceptance: a request's per-step logits and tokens are bitwise identical alone and in
   batches of 1, 2, 7, 8, 31, 32 with requests of other lengths, in the first, a middle and the last slot. */
/* A target request's per-step logits and tokens are bitwise those of feeding it alone, in batched
   steps of 1, 2, 7, 8, 31, 32 requests of other lengths, in the first, a middle and the last slot.
   `what` names the configuration in the messages. */
static void bd_check_invariance(qsa_model *m, const char *what) {
    bd_pair *p = bd_pair_new(m);
    if (!p) return;
    bd_reference(m, 33, p);
    static const int sizes[] = {1, 2, 7, 8, 31, 32};
    int runs = 0, differ = 0;
    for (int si = 0; si < 6 && !T_.failed; si++) {
        int B = sizes[si], slots[3] = {0, B / 2, B - 1};
        for (int sj = 0; sj < 3; sj++) {
            if (sj && slots[sj] == slots[sj - 1]) continue;
            int reqs[BD_MAXREQ], target = 5;
            bd_batch(B, target, slots[sj], reqs);
            bd_run(m, reqs, B, 1, 0, p->lg, p->tok);
            runs++;
            if (!bd_pair_same(m, &target, 1, p)) { differ++; printf("    B %d slot %d: request %d differs\n", B, slots[sj], target); }
            CHECKF(bd_pair_same(m, reqs, B, p), "%s, B %d slot %d: some request's bits depend on the batch", what, B, slots[sj]);
        }
    }
    printf("    %s: %d batches, the target differed in %d\n", what, runs, differ);
    bd_pair_free(p);
}

TEST(gpu, batch_invariance_decode) {
    qsa_model *m = NULL;
    SHARDED_OR_SKIP(1, 0, &m);
    bd_check_invariance(m, "batched decode");
    qsa_model_free(m);
}

/* (b) Batched decode == single-sequence qsa_seq_feed, bitwise, for every token of 32 requests. */
TEST(gpu, batch_decode_equals_single_feed) {
    qsa_model *m = NULL;
    SHARDED_OR_SKIP(1, 0, &m);
    bd_pair *p = bd_pair_new(m);
    int reqs[32];
    for (int k = 0; k < 32; k++) reqs[k] = 31 - k;
    if (p) {
        bd_run(m, reqs, 32, 0, 0, p->ref, p->rtok); /* the same requests, fed one by one */
        bd_run(m, reqs, 32, 1, 0, p->lg, p->tok);
        CHECKF(bd_pair_same(m, reqs, 32, p), "batched decode differs from qsa_seq_feed");
    }
    bd_pair_free(p);
    qsa_model_free(m);
}

/* (b0) qsa_seq_feed_batch_greedy: the arg-max on the device gives, step after step, the tokens that
   the host's arg-max of qsa_seq_feed_batch's logits gives (graphs on: eager first steps, then
   replays; the arg-max kernel runs after either), 12 requests. */
/* 12 requests (order (7 k + off) % 12) step after step: mg's qsa_seq_feed_batch_greedy tokens are the
   host's arg-max of m's qsa_seq_feed_batch logits. */
static void bd_check_greedy_equal(qsa_model *m, qsa_model *mg, int off, const char *what) {
    bd_pair *p = bd_pair_new(m);
    int reqs[12];
    for (int k = 0; k < 12; k++) reqs[k] = (k * 7 + off) % 12;
    if (p) {
        bd_run(m, reqs, 12, 1, 0, p->ref, p->rtok);
        bd_run(mg, reqs, 12, 3, 0, p->lg, p->tok);
        CHECKF(bd_tok_same(reqs, 12, p->rtok, p->tok), "%s: the device arg-max picked other tokens than the host's", what);
    }
    bd_pair_free(p);
}
TEST(gpu, batch_greedy_equals_host_argmax) {
    qsa_model *m = NULL;
    SHARDED_OR_SKIP(1, 1, &m);
    bd_check_greedy_equal(m, m, 2, "one model");
    qsa_model_free(m);
}

/* (b0') Logits copied into qsa_host_alloc's page-locked memory are the bits copied into malloc's
   (prompts by qsa_seq_feed, then batched steps, graphs on), 12 requests; the block outlives its model. */
TEST(gpu, host_alloc_logits_equal_pageable) {
    qsa_model *m = NULL;
    SHARDED_OR_SKIP(1, 1, &m);
    unsigned char *keep = (unsigned char *)qsa_host_alloc(m, 1000);
    CHECKF(keep && ((const qsa__host_hdr *)(keep - QSA__HOST_HDR))->pinned == 1,
           "qsa_host_alloc on a CUDA model gave no page-locked block: %s", qsa_last_error());
    bd_pair *p = bd_pair_new(m);
    int reqs[12];
    for (int k = 0; k < 12; k++) reqs[k] = (k * 5 + 1) % 12;
    if (p) {
        bd_run(m, reqs, 12, 1, 0, p->ref, p->rtok);
        bd_host_rows = 1;
        bd_run(m, reqs, 12, 1, 0, p->lg, p->tok);
        bd_host_rows = 0;
        CHECKF(bd_pair_same(m, reqs, 12, p), "logits in page-locked memory differ from those in pageable memory");
    }
    bd_pair_free(p);
    qsa_model_free(m);
    if (keep) { /* still mapped, and freed without the model */
        memset(keep, 0x5a, 1000);
        CHECK(keep[999] == 0x5a);
        qsa_host_free(keep);
    }
}

/* (b') qsa_seq_feed of one token with the default parameters runs the batched step for a batch of
   one, replayed as a CUDA graph: bitwise the chunked forward's logits and tokens, 12 requests. */
TEST(gpu, single_token_feed_equals_chunk_path) {
    qsa_model *m = NULL;
    SHARDED_OR_SKIP(0, 0, &m); /* defaults: batched decode and graphs on */
    bd_pair *p = bd_pair_new(m);
    int reqs[12];
    for (int k = 0; k < 12; k++) reqs[k] = (k * 5 + 3) % 12;
    if (p) {
        bd_run(m, reqs, 12, 0, 0, p->ref, p->rtok);
        CHECKF(m->cuda->batch == NULL, "the chunked reference made the batched step's buffers");
        bd_run(m, reqs, 12, 2, 0, p->lg, p->tok);
        CHECKF(m->cuda->batch != NULL && (!qsa__cuda_graphs_on(m) || m->cuda->batch->graphs[1].exec != NULL),
               "single-token feeds did not run the batched step as a graph");
        CHECKF(bd_pair_same(m, reqs, 12, p), "single-token feeds through the batched step differ from the chunked forward");
    }
    bd_pair_free(p);
    qsa_model_free(m);
}

/* (b'') A dense GEMV whose partial tiles exceed the cross-warp scratch (the real shape's lm_head for a
   batch) runs on column slices, each copied into its columns: with the scratch limit lowered so
   that the tiny model's GEMVs slice (or take the one-block GEMM), prefills and batched decode steps
   (graphs captured anew) give the bits of the default run, 8 requests. */
TEST(gpu, gemv_column_slices_equal_whole) {
    qsa_model *m = NULL;
    SHARDED_OR_SKIP(1, 1, &m);
    bd_pair *p = bd_pair_new(m);
    int reqs[8] = {6, 1, 4, 7, 0, 3, 2, 5};
    if (p) {
        bd_run(m, reqs, 8, 1, 0, p->ref, p->rtok);
        CHECKF(m->cuda->sc.n_sliced == 0, "the default run sliced a GEMV of the tiny model");
        size_t keep = m->cuda->sc.gemv_limit;
        m->cuda->sc.gemv_limit = 4096;
        qsa__cuda_batch_drop_graphs(m->cuda);
        bd_run(m, reqs, 8, 1, 0, p->lg, p->tok);
        m->cuda->sc.gemv_limit = keep;
        CHECKF(m->cuda->sc.n_sliced != 0, "no GEMV was sliced under the lowered limit");
        CHECKF(bd_pair_same(m, reqs, 8, p), "column-sliced GEMVs give other bits than whole ones");
    }
    bd_pair_free(p);
    qsa_model_free(m);
}

/* (b''-bis) The first sliced GEMV inside a step's capture: the prefills at the default limit (nothing sliced), then
   the limit lowered and the first batched step of 4 captured as a graph.  The driver refuses allocations in a
   capture, so the slices' output must exist before it: the step succeeds, and its logits are those of the same
   step run eagerly. */
TEST(gpu, first_sliced_gemv_inside_a_capture) {
    qsa_model *m = NULL;
    SHARDED_OR_SKIP(1, 1, &m);
    if (!qsa__cuda_graphs_on(m)) { qsa_model_free(m); return; }
    int V = m->cfg.vocab_size;
    qsa_seq *s[4] = {NULL, NULL, NULL, NULL};
    float *lg = (float *)malloc(sizeof(float) * 4 * (size_t)V), *ref = (float *)malloc(sizeof(float) * 4 * (size_t)V);
    int32_t p[3] = {5, 9, 2}, t[4] = {3, 4, 5, 6};
    size_t keep = m->cuda->sc.gemv_limit;
    for (int run = 0; run < 2 && lg && ref && !T_.failed; run++) { /* run 0: graphs; 1: eager */
        m->params.cuda_graphs = run ? 0 : 1;
        for (int i = 0; i < 4; i++) {
            if (!s[i]) CHECK_OK(qsa_seq_create(m, NULL, &s[i]));
            else qsa_seq_reset(s[i]);
            if (!T_.failed) CHECK_OK(qsa_seq_feed(s[i], p, 1 + i % 3, NULL, 0));
        }
        long long sliced = m->cuda->sc.n_sliced;
        if (run == 0) CHECKF(sliced == 0, "a prefill at the default limit sliced a GEMV");
        m->cuda->sc.gemv_limit = 4096;
        if (!T_.failed) CHECKF(qsa_seq_feed_batch(s, t, 4, run ? ref : lg) == QSA_OK, "%s step of 4 with sliced GEMVs: %s",
                               run ? "eager" : "the first captured", qsa_last_error());
        if (!T_.failed) CHECKF(m->cuda->sc.n_sliced > sliced, "the %s step sliced no GEMV", run ? "eager" : "captured");
        m->cuda->sc.gemv_limit = keep;
    }
    if (!T_.failed) CHECKF(!memcmp(lg, ref, sizeof(float) * 4 * (size_t)V), "the captured step's logits differ from the eager step's");
    for (int i = 0; i < 4; i++) qsa_seq_free(s[i]);
    free(lg);
    free(ref);
    qsa_model_free(m);
}

/* (b''-ter) A batched step that cannot be captured runs eagerly on one GPU, with a warning, and its size is not
   captured again: the driver's entries wrapped so that the capture ends refused (CUDA_ERROR_STREAM_CAPTURE_INVALIDATED),
   or so that the first, the middle, or the first side-stream launch inside the capture is refused (the last
   leaves a fork unjoined: the side stream must leave capture mode with the origin); each time the steps of 4
   requests succeed with the bits of steps run without graphs, and one capture was tried.  (Before, the step
   failed, and every later step of that size tried again and failed.) */
static qsa__cuda_api gc_real;
static CUstream gc_origin;
static int gc_mode, gc_fail_at, gc_in_capture, gc_launches, gc_side, gc_begins, gc_warned, gc_refused;
static CUresult gc_begin(CUstream s, int mode) {
    gc_begins++;
    gc_in_capture = 1;
    gc_launches = gc_side = 0;
    gc_origin = s;
    return gc_real.cuStreamBeginCapture_v2(s, mode);
}
static CUresult gc_end(CUstream s, CUgraph *graph) {
    gc_in_capture = 0;
    CUresult r = gc_real.cuStreamEndCapture(s, graph);
    if (r == 0 && gc_mode == 1) {
        gc_real.cuGraphDestroy(*graph);
        *graph = NULL;
        gc_refused++;
        return 901; /* CUDA_ERROR_STREAM_CAPTURE_INVALIDATED */
    }
    return r;
}
/* mode 2: refuse the gc_fail_at-th launch of the capture; 3: its first launch on another stream than the origin */
static int gc_refuse(CUstream s) {
    if (!gc_in_capture) return 0;
    int side = s != gc_origin && ++gc_side == 1, refuse = (++gc_launches == gc_fail_at && gc_mode == 2) || (side && gc_mode == 3);
    gc_refused += refuse;
    return refuse;
}
static CUresult gc_launch(CUfunction fn, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                          unsigned sh, CUstream s, void **args, void **extra) {
    return gc_refuse(s) ? 1 /* CUDA_ERROR_INVALID_VALUE */ : gc_real.cuLaunchKernel(fn, gx, gy, gz, bx, by, bz, sh, s, args, extra);
}
static CUresult gc_launch_ex(const qsa__cu_launch_cfg *cfg, CUfunction fn, void **params, void **extra) {
    return gc_refuse(cfg->stream) ? 1 : gc_real.cuLaunchKernelEx(cfg, fn, params, extra);
}
static void gc_logger(void *user, qsa_log_level level, const char *msg) {
    (void)user;
    gc_warned += level == QSA_LOG_WARN && strstr(msg, "capturing the batched decode graph") && strstr(msg, "without a graph");
}
TEST(gpu, step_that_cannot_be_captured_runs_eagerly) {
    qsa_model *m = NULL;
    SHARDED_OR_SKIP(1, 1, &m);
    if (!qsa__cuda_graphs_on(m)) { qsa_model_free(m); SKIP("CUDA graphs are off in this build"); }
    bd_pair *p = bd_pair_new(m);
    int reqs[4] = {2, 5, 0, 7}, counted = 0, side = 0;
    if (p) { /* the reference: the same steps without graphs */
        m->params.cuda_graphs = 0;
        bd_run(m, reqs, 4, 1, 0, p->ref, p->rtok);
        m->params.cuda_graphs = 1;
    }
    gc_real = qsa__cu;
    qsa__cu.cuStreamBeginCapture_v2 = gc_begin;
    qsa__cu.cuStreamEndCapture = gc_end;
    qsa__cu.cuLaunchKernel = gc_launch;
    if (gc_real.cuLaunchKernelEx) qsa__cu.cuLaunchKernelEx = gc_launch_ex;
    qsa_set_logger(gc_logger, NULL, QSA_LOG_WARN);
    /* case 0 captures as usual (and counts the capture's launches); 1: the capture's end refused; 2, 3: its first,
       its middle launch refused; 4: its first launch on the side stream (when the step has one) */
    for (int c = 0; c < 5 && p && !T_.failed; c++) {
        if (c == 4 && !side) break;
        gc_mode = c == 0 ? 0 : c == 1 ? 1 : c < 4 ? 2 : 3;
        gc_fail_at = c == 2 ? 1 : counted / 2;
        gc_begins = gc_warned = gc_refused = 0;
        qsa__cuda_batch_drop_graphs(m->cuda);
        bd_run(m, reqs, 4, 1, 0, p->lg, p->tok);
        if (c == 0) counted = gc_launches, side = gc_side;
        const qsa__dgraph *gr = m->cuda->batch ? &m->cuda->batch->graphs[4] : NULL;
        CHECKF(gr && gc_begins == 1 && (c == 0 ? gr->exec && !gr->eager && !gc_warned && !gc_refused
                                               : !gr->exec && gr->eager && gc_warned == 1 && gc_refused == 1),
               "case %d: %d capture(s) begun, %d refusal(s), graph %s, eager %d, %d warning(s)", c, gc_begins, gc_refused,
               gr && gr->exec ? "made" : "none", gr ? gr->eager : -1, gc_warned);
        CHECKF(bd_pair_same(m, reqs, 4, p), "case %d: the steps' bits differ from those run without graphs", c);
        if (T_.verbose) printf("    case %d: %d launches in the capture (%d on the side stream); refused: %d\n", c, counted, side,
                               gc_refused);
    }
    CHECKF(counted > 4, "the capture counted %d launches", counted);
    qsa_set_logger(T_.verbose ? qsa_log_stderr : NULL, NULL, QSA_LOG_DEBUG);
    qsa__cu = gc_real;
    if (m->cuda) qsa__cuda_batch_drop_graphs(m->cuda);
    bd_pair_free(p);
    qsa_model_free(m);
}

/* Batched steps of the n requests reqs (graphs captured anew) with the launch-shape switches knob[i]
   (fields of qsa__cuda) at ref[i], then at alt[i] (each restored after): whether they give the same
   bits (p: the two runs' logits and tokens). */
static int bd_knobs_same(qsa_model *m, const int *reqs, int n, bd_pair *p, int *const *knob, const int *ref,
                         const int *alt, int nk) {
    int keep[4];
    for (int i = 0; i < nk; i++) keep[i] = *knob[i];
    for (int run = 0; run < 2; run++) {
        for (int i = 0; i < nk; i++) *knob[i] = run ? alt[i] : ref[i];
        qsa__cuda_batch_drop_graphs(m->cuda);
        bd_run(m, reqs, n, 1, 0, run ? p->lg : p->ref, run ? p->tok : p->rtok);
    }
    for (int i = 0; i < nk; i++) *knob[i] = keep[i];
    qsa__cuda_batch_drop_graphs(m->cuda);
    return bd_pair_same(m, reqs, n, p);
}

/* (b''') Decode batches' dense projections through the 64 x 64 tiled kernel (qsa__tiled_small, for
   wide projections of a batch on the real shape) instead of the cross-warp GEMV: with its thresholds
   lowered so that every dense projection of every batched step (batches 1 and 8; graphs captured
   anew) takes it, the bits of the default run, 8 requests. */
TEST(gpu, tiled_decode_projections_equal_gemv) {
    qsa_model *m = NULL;
    SHARDED_OR_SKIP(1, 1, &m);
    bd_pair *p = bd_pair_new(m);
    int reqs[8] = {3, 6, 0, 5, 2, 7, 4, 1};
    qsa__cuda *g = m->cuda;
    int *const knob[2] = {&g->tiled_min_m, &g->tiled_min_tiles};
    const int ref[2] = {g->tiled_min_m, g->tiled_min_tiles}, alt[2] = {1, 1};
    for (int B = 1; B <= 8 && p && !T_.failed; B += 7) {
        CHECKF(!qsa__tiled_small(g, B, 4), "the default thresholds take the tiled kernel for the tiny model");
        CHECKF(bd_knobs_same(m, reqs, B, p, knob, ref, alt, 2), "B %d: tiled decode projections give other bits than the GEMV",
               B);
    }
    bd_pair_free(p);
    qsa_model_free(m);
}

/* (b'''') The block form's split groups folded in a launch of their own (qsa_k_gemv_fold, no tickets)
   instead of by the warps that complete the tiles: with gemv_fold_min_m at 1 every split block-form
   launch of batches 1 and 8 takes it, at 65 none does — the same bits, 8 requests, graphs captured
   anew for each. */
TEST(gpu, gemv_fold_launch_equals_ticket_fold) {
    qsa_model *m = NULL;
    SHARDED_OR_SKIP(1, 1, &m);
    qsa__cuda *g = m->cuda;
    bd_pair *p = bd_pair_new(m);
    int reqs[8] = {5, 2, 7, 0, 3, 6, 1, 4};
    /* (no whole-K groups: the tiny model's short K would take them) */
    int *const knob[2] = {&g->gemv_fold_min_m, &g->gemv_whole_segs};
    const int ref[2] = {65, 0}, alt[2] = {1, 0};
    for (int B = 1; B <= 8 && p && !T_.failed; B += 7)
        CHECKF(bd_knobs_same(m, reqs, B, p, knob, ref, alt, 2), "B %d: qsa_k_gemv_fold gives other bits than the completing warps",
               B);
    bd_pair_free(p);
    qsa_model_free(m);
}

/* (c) CUDA-graph decode gives the bits of eager decode (graphs captured at B's first step, then
   replayed while positions, pages, selections and slots change; more than max_batch requests run
   in groups). */
/* Batched steps of 1, 7, 16, 7 again and 33 requests (groups of max_batch 16; new positions, pages
   and slots between replays): the graph model mg gives the bits of the eager model m.  `what` names
   the configuration in the messages. */
static void bd_check_graphs_equal_eager(qsa_model *m, qsa_model *mg, const char *what) {
    bd_pair *p = bd_pair_new(m);
    static const int sizes[] = {1, 7, 16, 7, 33};
    for (int si = 0; si < 5 && p && !T_.failed; si++) {
        int B = sizes[si], reqs[BD_MAXREQ];
        for (int k = 0; k < B; k++) reqs[k] = (k * 7 + si) % 37;
        for (int k = 1; k < B; k++) /* distinct request ids */
            for (int j = 0; j < k; j++) if (reqs[j] == reqs[k]) { reqs[k] = (reqs[k] + 1) % 37; j = -1; }
        bd_run(m, reqs, B, 1, 0, p->ref, p->rtok);
        bd_run(mg, reqs, B, 1, 0, p->lg, p->tok);
        CHECKF(bd_pair_same(m, reqs, B, p), "%s, B %d: graph replay differs from eager batched decode", what, B);
    }
    bd_pair_free(p);
}

TEST(gpu, batch_cuda_graphs_equal_eager) {
    qsa_model_params mp;
    memset(&mp, 0, sizeof mp);
    mp.cuda_batch_decode = 1;
    mp.cuda_graphs = -1; /* eager (0 is the default: graphs on) */
    qsa_model *m = NULL, *mg = NULL;
    GPU_OR_SKIP("qsa_hc4_ple_sharded", &mp, &m);
    memset(&mp, 0, sizeof mp);
    mp.cuda_batch_decode = 1;
    mp.cuda_graphs = 1;
    mp.max_batch = 16;
    GPU_OR_SKIP("qsa_hc4_ple_sharded", &mp, &mg);
    bd_check_graphs_equal_eager(m, mg, "one GPU");
    qsa_model_free(m);
    qsa_model_free(mg);
}

/* The all-position logits of one 150-token prompt (ids (i * mul + 7) % V) fed to m and to m0 are
   bitwise equal. */
static void gpu_check_prefill_same(qsa_model *m, qsa_model *m0, int mul, const char *what) {
    int n = 150, V = m->cfg.vocab_size;
    int32_t ids[150];
    for (int i = 0; i < n; i++) ids[i] = (int32_t)((i * mul + 7) % V);
    float *a = (float *)malloc(sizeof(float) * (size_t)n * V), *b = (float *)malloc(sizeof(float) * (size_t)n * V);
    qsa_seq *sa = NULL, *sb = NULL;
    CHECK_OK(qsa_seq_create(m, NULL, &sa));
    CHECK_OK(qsa_seq_create(m0, NULL, &sb));
    if (a && b && sa && sb) {
        CHECK_OK(qsa_seq_feed(sa, ids, n, a, 1));
        CHECK_OK(qsa_seq_feed(sb, ids, n, b, 1));
        CHECKF(!memcmp(a, b, sizeof(float) * (size_t)n * V), "prefill logits differ %s", what);
    }
    qsa_seq_free(sa);
    qsa_seq_free(sb);
    free(a);
    free(b);
}

/* gpu_model with the environment switch `var` set to `value` for the load (restored after it) */
static int gpu_model_env(const char *fixture, qsa_model_params *mp, const char *var, const char *value, qsa_model **m) {
    jit_env_saved saved;
    jit_env_unset(&saved, var);
    setenv(var, value, 1);
    int ok = gpu_model(fixture, mp, m);
    jit_env_restore(&saved);
    return ok;
}
static int gpu_model_switched_off(const char *fixture, qsa_model_params *mp, const char *var, qsa_model **m) {
    return gpu_model_env(fixture, mp, var, "0", m);
}
/* A switch that must not change the bits: m (on) and m0 (off) give the same prefill logits, and
   graph-replayed batched decode on m the bits of eager batched decode on m0; frees both. */
static void gpu_check_switch_same(qsa_model *m, qsa_model *m0, int mul, const char *what) {
    gpu_check_prefill_same(m, m0, mul, what);
    bd_check_graphs_equal_eager(m0, m, what);
    qsa_model_free(m);
    qsa_model_free(m0);
}

/* The batched step's lm_head in vocabulary slices, each slice's logits copied to the host while the
   next is computed ($QSA_LOGIT_SLICE_BYTES=1: every batch of this model; its 320 columns in slices of
   128, 128 and 64), gives the bits of one GEMM and one copy: batched decode eager and replayed as
   graphs (B 1, 7, 16, 7, 33), and the device arg-max over the sliced layout the same greedy tokens. */
TEST(gpu, logit_slices_equal_whole) {
    qsa_model_params mp;
    memset(&mp, 0, sizeof mp);
    mp.cuda_batch_decode = 1;
    mp.cuda_graphs = -1;
    qsa_model *m0 = NULL, *me = NULL, *mg = NULL;
    if (!gpu_model_env("qsa_hc4_ple_sharded", &mp, "QSA_LOGIT_SLICE_BYTES", "0", &m0)) {
        if (T_.failed) return;
        SKIP("no CUDA device: %s", qsa_last_error());
    }
    if (!qsa__cu.cuEventRecordWithFlags) {
        qsa_model_free(m0);
        SKIP("the driver has no cuEventRecordWithFlags: the logits are never sliced");
    }
    if (!gpu_model_env("qsa_hc4_ple_sharded", &mp, "QSA_LOGIT_SLICE_BYTES", "1", &me)) { qsa_model_free(m0); return; }
    mp.cuda_graphs = 1;
    if (!gpu_model_env("qsa_hc4_ple_sharded", &mp, "QSA_LOGIT_SLICE_BYTES", "1", &mg)) {
        qsa_model_free(m0);
        qsa_model_free(me);
        return;
    }
    CHECK(qsa__logit_slices(m0, 33) == 1 && qsa__logit_slices(me, 1) == QSA__LOGIT_SLICES &&
          qsa__logit_slice_w(me->cfg.vocab_size, QSA__LOGIT_SLICES) == 128);
    bd_check_graphs_equal_eager(m0, me, "logits in slices (eager) vs whole");
    bd_check_graphs_equal_eager(m0, mg, "logits in slices (graphs) vs whole");
    bd_check_greedy_equal(m0, mg, 3, "logits in slices (graphs)");
    qsa_model_free(m0);
    qsa_model_free(me);
    qsa_model_free(mg);
}

/* Programmatic dependent launches (qsa__cu_launch_ex, sm_90+ modules on sm_90+ GPUs) change only
   when a kernel may start, never what it computes: a prefill's logits and graph-replayed batched
   decode give the bits of a model loaded with QSA_PDL=0. */
TEST(gpu, pdl_launches_equal_plain) {
    qsa_model_params mp;
    memset(&mp, 0, sizeof mp);
    mp.cuda_batch_decode = 1;
    qsa_model *m = NULL, *m0 = NULL;
    GPU_OR_SKIP("qsa_hc4_ple_sharded", &mp, &m);
    if (!m->cuda->pdl) {
        int cc = m->cuda->cc;
        char arch[32];
        snprintf(arch, sizeof arch, "%s", m->cuda->arch);
        qsa_model_free(m);
        SKIP("no programmatic dependent launch here (device cc %d, module %s, cuLaunchKernelEx %s)", cc, arch,
             qsa__cu.cuLaunchKernelEx ? "present" : "absent");
    }
    if (!gpu_model_switched_off("qsa_hc4_ple_sharded", &mp, "QSA_PDL", &m0)) { qsa_model_free(m); return; }
    CHECK(m->cuda->pdl == 1 && m0->cuda->pdl == 0);
    gpu_check_switch_same(m, m0, 53, "PDL on vs QSA_PDL=0");
}

/* The shared expert's down projection on the side stream (forked after the router, joined before
   the combine; the default where its launch needs no scratch) gives the bits of the single-stream
   chain ($QSA_SHARED_SIDE=0): prefill logits, and batched decode eager and through graphs. */
TEST(gpu, shared_side_stream_equals_chain) {
    qsa_model_params mp;
    memset(&mp, 0, sizeof mp);
    mp.cuda_batch_decode = 1;
    qsa_model *m = NULL, *m0 = NULL;
    GPU_OR_SKIP("qsa_hc4_ple_sharded", &mp, &m);
    if (m->cuda->arch_num < 80) { /* (sm_70/75 modules: no block-form GEMV, and this model's projections
                                     are too narrow for the tiled GEMM: its down projection stays in the chain) */
        char arch[32];
        snprintf(arch, sizeof arch, "%s", m->cuda->arch);
        qsa_model_free(m);
        SKIP("no side-stream launch for this model with a %s module (the block-form GEMV is sm_80+)", arch);
    }
    if (!gpu_model_switched_off("qsa_hc4_ple_sharded", &mp, "QSA_SHARED_SIDE", &m0)) { qsa_model_free(m); return; }
    gpu_check_prefill_same(m, m0, 29, "with the side stream and without");
    bd_check_graphs_equal_eager(m0, m, "side stream vs QSA_SHARED_SIDE=0 (graphs)");
    qsa_model *me = NULL;
    mp.cuda_graphs = -1; /* eager: the fork and join on live streams */
    if (gpu_model("qsa_hc4_ple_sharded", &mp, &me)) {
        bd_check_graphs_equal_eager(m0, me, "side stream (eager) vs QSA_SHARED_SIDE=0 (graphs)");
        CHECKF(me->cuda->side_launches > 0, "eager: no side launches");
        qsa_model_free(me);
    }
    /* the switch took effect: decode steps went to the side stream, none without it */
    CHECKF(m->cuda->side_launches > 0 && m0->cuda->side_launches == 0, "side launches %lld / %lld",
           m->cuda->side_launches, m0->cuda->side_launches);
    qsa_model_free(m);
    qsa_model_free(m0);
}

/* Sampling on the device (qsa__cand_req: a batched step reduces each row to its sampler's candidates, the host draws
   from those) gives the tokens of the host's draws over the logits ($QSA_SAMPLE_DEVICE=0): scheduler batches of top-k
   draws with top-p, min-p and repetition penalties above and below 1, a greedy row with a penalty beside them, and
   k = vocab - 1; in vocabulary slices too ($QSA_LOGIT_SLICE_BYTES=1); a batch with a top-p-only request and one by the
   temperature alone with a penalty (whole-row draws: their QSA__CAND_Z best of the fixture's 320 ids and the row's sum,
   or their penalised logits where those do not decide them); and qsa_generate.  The prompt's last row is reduced as a
   decode step's (the first token's draw: after a chunk of several tokens, or of one, a decode step's): every token of
   the first batch came from candidates, and every row of the second was reduced. */
enum { SD_N = 8, SD_T = 10, SD_WHOLE = 2 /* (the last SD_WHOLE of sd_params: whole-row draws) */ };
static void sd_params(int i, int V, qsa_sampling_params *sp) {
    memset(sp, 0, sizeof *sp);
    sp->seed = 1 + (uint64_t)i;
    switch (i) {
    case 0: sp->temperature = 0.8f; sp->top_k = 20; sp->top_p = 0.9f; break;
    case 1: sp->temperature = 1.3f; sp->top_k = 5; break;
    case 2: sp->temperature = 0.6f; sp->top_k = 40; sp->top_p = 0.95f; sp->min_p = 0.05f; sp->repetition_penalty = 1.3f;
            sp->penalty_last_n = 8; break;
    case 3: sp->repetition_penalty = 1.2f; break;
    case 4: sp->temperature = 1.0f; sp->top_k = V - 1; break;
    case 5: sp->temperature = 0.7f; sp->top_k = 20; sp->repetition_penalty = 0.9f; sp->penalty_last_n = -1; break;
    case 6: sp->temperature = 0.8f; sp->repetition_penalty = 1.2f; sp->penalty_last_n = 16; break;
    default: sp->temperature = 1.0f; sp->top_p = 0.9f; break;
    }
}
static void sd_prompt(int i, int V, int32_t *p, int n) {
    for (int j = 0; j < n; j++) p[j] = (int32_t)((7 + 31 * i + 13 * j) % V);
}
/* n requests of sd_params through a scheduler: their tokens, and the decode tokens drawn from candidates */
static int sd_sched(qsa_model *m, int n, int32_t tok[SD_N][SD_T], long long *ncand, long long *ndecode) {
    int V = qsa_model_get_config(m)->vocab_size, ok = 1;
    qsa_sched *s = NULL;
    qsa_sched_params sp;
    memset(&sp, 0, sizeof sp);
    sp.prefill_chunk = 4; /* (prompts of 6 to 13 tokens: last chunks of 1 token, a decode step's, and of 2 to 4) */
    CHECK_OK(qsa_sched_create(m, &sp, &s));
    if (!s) return 0;
    int32_t prompt[SD_N][16];
    int64_t id[SD_N];
    for (int i = 0; i < n; i++) {
        qsa_request_params rp;
        memset(&rp, 0, sizeof rp);
        sd_prompt(i, V, prompt[i], 16);
        rp.prompt = prompt[i];
        rp.n_prompt = 6 + i;
        rp.max_tokens = SD_T;
        rp.ignore_eos = 1;
        sd_params(i, V, &rp.sampling);
        CHECK_OK(qsa_sched_submit(s, &rp, &id[i]));
    }
    CHECK_OK(qsa_sched_run(s));
    for (int i = 0; i < n; i++) {
        qsa_request_result r;
        memset(tok[i], 0, sizeof tok[i]);
        CHECK_OK(qsa_sched_poll(s, id[i], &r));
        ok &= r.status == QSA_REQ_DONE && r.n_tokens == SD_T;
        if (r.tokens && r.n_tokens == SD_T) memcpy(tok[i], r.tokens, sizeof tok[i]);
    }
    CHECK(ok);
    *ncand = s->n_cand_tokens;
    *ndecode = s->n_decode_tokens;
    qsa_sched_free(s);
    return ok;
}
/* qsa_generate of SD_T tokens with sampler i of sd_params on a new sequence of m, from the prompt p[n] into g (freed by
   the caller whatever happens): the rows m's device reduced meanwhile */
static long long sd_generate(qsa_model *m, int i, const int32_t *p, int n, qsa_generation *g) {
    long long c0 = m->cuda->n_cand_rows;
    qsa_seq *sq = NULL;
    qsa_generate_params gp;
    memset(&gp, 0, sizeof gp);
    memset(g, 0, sizeof *g);
    sd_params(i, m->cfg.vocab_size, &gp.sampling);
    gp.max_tokens = SD_T;
    gp.ignore_eos = 1;
    CHECK_OK(qsa_seq_create(m, NULL, &sq));
    if (sq) CHECK_OK(qsa_generate(sq, p, n, &gp, g));
    qsa_seq_free(sq);
    return m->cuda->n_cand_rows - c0;
}
TEST(gpu, sampling_on_the_device_draws_as_the_host) {
    qsa_model_params mp;
    memset(&mp, 0, sizeof mp);
    mp.cuda_batch_decode = 1;
    qsa_model *m = NULL, *m0 = NULL, *ms = NULL;
    GPU_OR_SKIP("qsa_hc4_ple_sharded", &mp, &m);
    if (!gpu_model_switched_off("qsa_hc4_ple_sharded", &mp, "QSA_SAMPLE_DEVICE", &m0) ||
        !gpu_model_env("qsa_hc4_ple_sharded", &mp, "QSA_LOGIT_SLICE_BYTES", "1", &ms)) {
        qsa_model_free(m);
        qsa_model_free(m0);
        return;
    }
    CHECK(m->cuda->sample_dev == 1 && m0->cuda->sample_dev == 0 && ms->cuda->sample_dev == 1);
    int V = m->cfg.vocab_size;
    int32_t t[3][SD_N][SD_T];
    long long nc[3], nd[3];
    qsa_model *ms3[3] = {m0, m, ms};
    for (int k = 0; k < 3; k++)
        if (!sd_sched(ms3[k], SD_N - SD_WHOLE, t[k], &nc[k], &nd[k])) goto done;
    /* (every decode token and each prompt's first from candidates: the prompt's last row is reduced too) */
    CHECKF(nc[0] == 0 && nd[1] == (SD_N - SD_WHOLE) * (SD_T - 1) && nc[1] == nd[1] + SD_N - SD_WHOLE &&
           nc[2] == nd[2] + SD_N - SD_WHOLE,
           "tokens from candidates: %lld (%lld decode) off, %lld (%lld) on, %lld (%lld) in slices", nc[0], nd[0], nc[1], nd[1],
           nc[2], nd[2]);
    for (int i = 0; i < SD_N - SD_WHOLE; i++) {
        CHECKF(!memcmp(t[0][i], t[1][i], sizeof t[0][i]), "request %d: the device's candidates drew other tokens", i);
        CHECKF(!memcmp(t[0][i], t[2][i], sizeof t[0][i]), "request %d: the device's candidates (logits in slices) drew other tokens", i);
    }
    /* with whole-row draws beside them (top-p alone, the temperature alone: from candidates where they decide them) */
    long long w0 = m->cuda->n_cand_whole, r0 = m->cuda->n_cand_rows;
    for (int k = 0; k < 2; k++)
        if (!sd_sched(ms3[k], SD_N, t[k], &nc[k], &nd[k])) goto done;
    long long whole = m->cuda->n_cand_whole - w0;
    CHECKF(nc[1] + whole == nd[1] + SD_N && nd[1] == SD_N * (SD_T - 1) && m->cuda->n_cand_rows - r0 == nd[1] + SD_N,
           "beside whole-row draws: %lld of %lld tokens from candidates, %lld from the penalised row", nc[1], nd[1] + SD_N, whole);
    printf("    beside whole-row draws: %lld of %lld tokens from candidates, %lld from the penalised row\n", nc[1], nd[1] + SD_N, whole);
    for (int i = 0; i < SD_N; i++) CHECKF(!memcmp(t[0][i], t[1][i], sizeof t[0][i]), "request %d beside whole-row draws: other tokens", i);
    /* qsa_generate: its prompt's last row and its decode steps reduce the rows of every sampler */
    for (int i = 0; i < SD_N; i++) {
        qsa_generation g[2];
        int32_t p[16];
        sd_prompt(i, V, p, 16);
        long long d0 = sd_generate(m0, i, p, 6 + i, &g[0]), d1 = sd_generate(m, i, p, 6 + i, &g[1]);
        CHECKF(g[0].n_tokens == SD_T && g[1].n_tokens == SD_T && !memcmp(g[0].tokens, g[1].tokens, sizeof(int32_t) * SD_T),
               "qsa_generate, sampler %d: the device's candidates drew other tokens", i);
        CHECKF(d0 == 0 && d1 == SD_T, "qsa_generate, sampler %d: %lld / %lld rows reduced (off / on)", i, d0, d1);
        qsa_generation_free(&g[0]);
        qsa_generation_free(&g[1]);
    }
done:
    qsa_model_free(m);
    qsa_model_free(m0);
    qsa_model_free(ms);
}

/* qsa_generate's first token from the prompt's last row reduced on the device (qsa__seq_feed with its qsa__cand_req:
   the row after the last chunk of the feed's split, max_chunk 64 here) for prompts of 1, 2, 63, 64, 65 (a last chunk of
   one token: a decode step's) and 130 tokens, each sampler of sd_params: the tokens of the host's draws
   ($QSA_SAMPLE_DEVICE=0), and those of a model with batched decode off (cuda_batch_decode -1: no batch buffers, so the
   logits come); the rows reduced: every token's with the device on (prompt and decode steps), none otherwise. */
TEST(gpu, sampling_on_the_device_from_the_prompt) {
    qsa_model_params mp;
    memset(&mp, 0, sizeof mp);
    mp.max_chunk = 64;
    qsa_model *m = NULL, *m0 = NULL, *mb = NULL;
    GPU_OR_SKIP("qsa_hc4_ple_sharded", &mp, &m);
    qsa_model_params mpb = mp;
    mpb.cuda_batch_decode = -1;
    if (!gpu_model_switched_off("qsa_hc4_ple_sharded", &mp, "QSA_SAMPLE_DEVICE", &m0) ||
        !gpu_model("qsa_hc4_ple_sharded", &mpb, &mb)) {
        qsa_model_free(m);
        qsa_model_free(m0);
        return;
    }
    qsa_model *ms[3] = {m0, m, mb};
    int V = m->cfg.vocab_size;
    static const int lens[] = {1, 2, 63, 64, 65, 130};
    int32_t p[130];
    for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++)
        for (int i = 0; i < SD_N; i++) {
            int n = lens[li];
            qsa_generation g[3];
            long long c0[3];
            sd_prompt(i + (int)li, V, p, n);
            for (int k = 0; k < 3; k++) c0[k] = sd_generate(ms[k], i, p, n, &g[k]);
            CHECKF(g[0].n_tokens == SD_T && g[1].n_tokens == SD_T && g[2].n_tokens == SD_T &&
                       !memcmp(g[0].tokens, g[1].tokens, sizeof(int32_t) * SD_T) &&
                       !memcmp(g[0].tokens, g[2].tokens, sizeof(int32_t) * SD_T),
                   "prompt of %d, sampler %d: other tokens from the device's candidates or with batched decode off", n, i);
            CHECKF(c0[0] == 0 && c0[1] == SD_T && c0[2] == 0, "prompt of %d, sampler %d: %lld / %lld / %lld rows reduced (off / "
                   "on / batched decode off)", n, i, c0[0], c0[1], c0[2]);
            for (int k = 0; k < 3; k++) qsa_generation_free(&g[k]);
        }
    CHECKF(mb->cuda->batch == NULL, "batched decode off: the batch's buffers were made");
    qsa_model_free(m);
    qsa_model_free(m0);
    qsa_model_free(mb);
}

/* qsa_seq_feed_batch's steps with the rows' samplers (struct qsa__cand_req) over 20 sequences: in one group of 20
   (launches of 16 rows, then the rows from 16) and, on a model of max_batch 8, in groups of 8, 8 and 4; the tokens of
   the host's draws from the logits ($QSA_SAMPLE_DEVICE=0), every row reduced on the device. */
enum { SDD_N = 20, SDD_STEPS = 4 };
static int sdd_run(qsa_model *m, int32_t out[SDD_STEPS][SDD_N]) {
    int V = m->cfg.vocab_size, ok = 1;
    qsa_seq *seqs[SDD_N] = {0};
    qsa_sampler *smp[SDD_N] = {0};
    float *logits = (float *)malloc(sizeof(float) * (size_t)SDD_N * V);
    int32_t *cand = (int32_t *)malloc(sizeof(int32_t) * (size_t)SDD_N * QSA__CAND_STRIDE(QSA__CAND_MAX)), tok[SDD_N];
    ok = logits && cand;
    for (int i = 0; ok && i < SDD_N; i++) {
        int32_t p[16];
        qsa_sampling_params sp;
        sd_params(i % SD_N, V, &sp);
        sp.seed = 50 + (uint64_t)i;
        sd_prompt(i, V, p, 16);
        CHECK_OK(qsa_seq_create(m, NULL, &seqs[i]));
        CHECK_OK(qsa_sampler_create(&sp, &smp[i]));
        ok = seqs[i] && smp[i];
        if (ok) CHECK_OK(qsa_seq_feed(seqs[i], p, 3 + i % 5, logits, 0));
        if (ok) tok[i] = qsa_sampler_sample(smp[i], logits, V, seqs[i]->tokens, seqs[i]->pos);
    }
    qsa__cand_req cq = {smp, cand, QSA__CAND_MAX};
    for (int st = 0; ok && st < SDD_STEPS; st++) {
        CHECK_OK(qsa__feed_batch_locked(seqs, tok, SDD_N, logits, NULL, &cq));
        for (int i = 0; i < SDD_N; i++) {
            const int32_t *row = cand + (size_t)i * QSA__CAND_STRIDE(QSA__CAND_MAX);
            int pen = row[1] == -2; /* (the penalised logits of a whole-row draw) */
            tok[i] = out[st][i] = row[1] >= 0 ? qsa__sampler_from_cand(smp[i], row, QSA__CAND_MAX)
                                              : qsa__sampler_sample_z(smp[i], logits + (size_t)i * V, V, pen ? NULL : seqs[i]->tokens,
                                                                      pen ? 0 : seqs[i]->pos, pen ? qsa__cand_z(row, QSA__CAND_MAX) : 0);
        }
    }
    for (int i = 0; i < SDD_N; i++) {
        qsa_seq_free(seqs[i]);
        qsa_sampler_free(smp[i]);
    }
    free(logits);
    free(cand);
    return ok;
}
/* qsa_seq_feed_batch_greedy with next the tokens array itself (a greedy loop's one array): each sequence records the
   token it was fed, not the id that the step wrote over it, and the ids are those of separate arrays. */
TEST(gpu, batch_greedy_next_may_be_the_tokens) {
    enum { N = 5, STEPS = 4 };
    qsa_model *m = NULL;
    SHARDED_OR_SKIP(1, 0, &m);
    int V = m->cfg.vocab_size, ok = 1;
    qsa_seq *sa[N] = {0}, *sb[N] = {0};
    int32_t ta[N], tb[N], na[N];
    float *logits = (float *)malloc(sizeof(float) * (size_t)V);
    for (int i = 0; ok && i < N; i++) {
        int32_t p[16];
        sd_prompt(i, V, p, 16);
        CHECK_OK(qsa_seq_create(m, NULL, &sa[i]));
        CHECK_OK(qsa_seq_create(m, NULL, &sb[i]));
        ok = sa[i] && sb[i] && logits;
        if (ok) CHECK_OK(qsa_seq_feed(sa[i], p, 4 + i, logits, 0));
        if (ok) CHECK_OK(qsa_seq_feed(sb[i], p, 4 + i, NULL, 0));
        if (ok) ta[i] = tb[i] = qsa__argmax(logits, V);
    }
    for (int st = 0; ok && st < STEPS; st++) {
        CHECK_OK(qsa_seq_feed_batch_greedy(sa, ta, N, na));
        CHECK_OK(qsa_seq_feed_batch_greedy(sb, tb, N, tb));
        ok = !memcmp(na, tb, sizeof na);
        CHECKF(ok, "step %d: the ids written over their tokens differ", st);
        memcpy(ta, na, sizeof ta);
    }
    for (int i = 0; ok && i < N; i++)
        CHECKF(sa[i]->pos == sb[i]->pos && !memcmp(sa[i]->tokens, sb[i]->tokens, sizeof(int32_t) * (size_t)sa[i]->pos),
               "sequence %d: its history differs (positions %d, %d)", i, sa[i]->pos, sb[i]->pos);
    for (int i = 0; i < N; i++) {
        qsa_seq_free(sa[i]);
        qsa_seq_free(sb[i]);
    }
    free(logits);
    qsa_model_free(m);
}
TEST(gpu, sampling_on_the_device_in_groups_of_rows) {
    qsa_model_params mp;
    memset(&mp, 0, sizeof mp);
    mp.cuda_batch_decode = 1;
    mp.max_batch = 32;
    qsa_model *m = NULL, *m0 = NULL, *m8 = NULL;
    GPU_OR_SKIP("qsa_hc4_ple_sharded", &mp, &m);
    int ok = gpu_model_switched_off("qsa_hc4_ple_sharded", &mp, "QSA_SAMPLE_DEVICE", &m0);
    mp.max_batch = 8;
    ok = ok && gpu_model("qsa_hc4_ple_sharded", &mp, &m8);
    int32_t t[3][SDD_STEPS][SDD_N];
    qsa_model *ms3[3] = {m0, m, m8};
    for (int k = 0; ok && k < 3; k++) ok = sdd_run(ms3[k], t[k]);
    if (ok) {
        CHECKF(m0->cuda->n_cand_rows == 0 && m->cuda->n_cand_rows == SDD_N * SDD_STEPS && m8->cuda->n_cand_rows == SDD_N * SDD_STEPS,
               "rows reduced: %lld off, %lld in one group, %lld in groups of 8", m0->cuda->n_cand_rows, m->cuda->n_cand_rows,
               m8->cuda->n_cand_rows);
        CHECK(qsa__cuda_batch_ready(m) && m->cuda->batch->max_batch == 32 && m8->cuda->batch->max_batch == 8);
        CHECK(!memcmp(t[0], t[1], sizeof t[0]) && !memcmp(t[0], t[2], sizeof t[0]));
    }
    qsa_model_free(m);
    qsa_model_free(m0);
    qsa_model_free(m8);
}

/* One token's router inside its gate/up launch (qsa__moe_route1, the default) gives the bits of the
   router's own launch ($QSA_MOE_ROUTE1=0): one-token feeds through the chunked forward (the
   reference's path, and the route's), batched decode eager and through graphs (its batches of one
   route inside), and prefill (no token routes inside: the same launches). */
TEST(gpu, moe_route1_equals_router_launch) {
    qsa_model_params mp;
    memset(&mp, 0, sizeof mp);
    mp.cuda_batch_decode = 1;
    qsa_model *m = NULL, *m0 = NULL;
    GPU_OR_SKIP("qsa_hc4_ple_sharded", &mp, &m);
    if (!gpu_model_switched_off("qsa_hc4_ple_sharded", &mp, "QSA_MOE_ROUTE1", &m0)) { qsa_model_free(m); return; }
    CHECKF(qsa__moe_route1(m, 1) && !qsa__moe_route1(m, 2) && !qsa__moe_route1(m0, 1),
           "route1: one token %d, two %d, switched off %d", qsa__moe_route1(m, 1), qsa__moe_route1(m, 2),
           qsa__moe_route1(m0, 1));
    bd_pair *p = bd_pair_new(m);
    static const int reqs[3] = {4, 17, 30};
    for (int i = 0; i < 3 && p && !T_.failed; i++) {
        bd_run(m0, reqs + i, 1, 0, 0, p->ref, p->rtok);
        bd_run(m, reqs + i, 1, 0, 0, p->lg, p->tok);
        CHECKF(bd_pair_same(m, reqs + i, 1, p), "request %d fed one token at a time: route1 differs from the router's launch",
               reqs[i]);
    }
    bd_pair_free(p);
    gpu_check_switch_same(m, m0, 41, "route1 vs QSA_MOE_ROUTE1=0");
}

/* A decode step's GDN conv inside the batched recurrence's launch (qsa__gdn_fused, the default on
   K2_GDN_SMEM modules) gives the bits of its own launch ($QSA_GDN_FUSE=0): prefill (not fused: the
   same launches), and graph-replayed batched decode against eager batched decode without it. */
TEST(gpu, gdn_fused_conv_equals_conv_launch) {
    qsa_model_params mp;
    memset(&mp, 0, sizeof mp);
    mp.cuda_batch_decode = 1;
    qsa_model *m = NULL, *m0 = NULL;
    GPU_OR_SKIP("qsa_hc4_ple_sharded", &mp, &m);
    if (!qsa__gdn_fused(m)) {
        char arch[32];
        snprintf(arch, sizeof arch, "%s", m->cuda->arch);
        qsa_model_free(m);
        SKIP("no fused GDN conv with a %s module (its recurrence is the register form)", arch);
    }
    if (!gpu_model_switched_off("qsa_hc4_ple_sharded", &mp, "QSA_GDN_FUSE", &m0)) { qsa_model_free(m); return; }
    CHECK(!qsa__gdn_fused(m0));
    gpu_check_switch_same(m, m0, 43, "fused GDN conv vs QSA_GDN_FUSE=0");
}

/* Whole-K groups in the block-form GEMV (qsa_k_gemv_blk_whole), which the runtime takes for launches
   with at least one whole group per SM (none of this model's), give the bits of the split form: every
   block-form launch whole ($QSA_GEMV_WHOLE_MIN_GROUPS=1) against none (=0), prefill logits and
   batched decode eager against graphs. */
TEST(gpu, gemv_whole_groups_equal_split) {
    qsa_model_params mp;
    memset(&mp, 0, sizeof mp);
    mp.cuda_batch_decode = 1;
    qsa_model *m = NULL, *m0 = NULL;
    if (!gpu_model_env("qsa_hc4_ple_sharded", &mp, "QSA_GEMV_WHOLE_MIN_GROUPS", "1", &m)) {
        if (T_.failed) return;
        SKIP("no CUDA device: %s", qsa_last_error());
    }
    if (!gpu_model_switched_off("qsa_hc4_ple_sharded", &mp, "QSA_GEMV_WHOLE_MIN_GROUPS", &m0)) { qsa_model_free(m); return; }
    CHECK(m->cuda->gemv_whole_min_groups == 1 && m0->cuda->gemv_whole_min_groups == 0);
    gpu_check_switch_same(m, m0, 31, "every block-form GEMV whole vs none");
}

/* (d) Allocation and page-size invariance still hold with batching: shuffled free lists with pages
   taken between the requests, and page sizes 16 and 400, against each request alone. */
TEST(gpu, batch_allocation_invariance) {
    qsa_model_params mp;
    memset(&mp, 0, sizeof mp);
    mp.cuda_batch_decode = 1;
    qsa_model *m = NULL;
    GPU_OR_SKIP("qsa_hc4_ple_sharded", &mp, &m);
    bd_pair *p = bd_pair_new(m);
    if (p) bd_reference(m, 8, p);
    int reqs[8] = {3, 0, 7, 1, 6, 2, 5, 4};
    for (int seed = 1; seed <= 4 && p; seed++) {
        bd_run(m, reqs, 8, 1, (uint64_t)seed, p->lg, p->tok);
        CHECKF(bd_pair_same(m, reqs, 8, p), "shuffle seed %d: batched decode depends on the pages", seed);
    }
    static const int pages[] = {16, 400};
    for (int pi = 0; pi < 2 && p; pi++) {
        qsa_model *mp2 = NULL;
        memset(&mp, 0, sizeof mp);
        mp.cuda_batch_decode = 1;
        mp.kv_page_size = pages[pi];
        if (!gpu_model("qsa_hc4_ple_sharded", &mp, &mp2)) break;
        bd_run(mp2, reqs, 8, 1, 7, p->lg, p->tok);
        CHECKF(bd_pair_same(m, reqs, 8, p), "page size %d: batched decode differs", pages[pi]);
        qsa_model_free(mp2);
    }
    bd_pair_free(p);
    qsa_model_free(m);
}

/* The CPU backend: qsa_seq_feed_batch is a loop over qsa_seq_feed (same bits), and a batch with one
   sequence that cannot take its token is refused as a whole, leaving every sequence unchanged. */
TEST(cpu, seq_feed_batch_equals_feed_and_refuses_whole) {
    qsa_model *m = cpu_fixture("qsa_hc4_ple_sharded");
    if (!m) return;
    bd_pair *p = bd_pair_new(m);
    int reqs[3] = {2, 0, 1};
    if (p) {
        bd_run(m, reqs, 3, 0, 0, p->ref, p->rtok);
        bd_run(m, reqs, 3, 1, 0, p->lg, p->tok);
        CHECK(bd_pair_same(m, reqs, 3, p));
        memset(p->tok, 0, sizeof p->tok);
        bd_run(m, reqs, 3, 3, 0, p->lg, p->tok);
        CHECKF(bd_tok_same(reqs, 3, p->rtok, p->tok), "qsa_seq_feed_batch_greedy: other tokens than the logits' arg-max");
    }
    /* refusal: the second sequence is full */
    qsa_seq_params sp = {4};
    qsa_seq *a = NULL, *b = NULL;
    CHECK_OK(qsa_seq_create(m, NULL, &a));
    CHECK_OK(qsa_seq_create(m, &sp, &b));
    int32_t ids[4] = {1, 2, 3, 4};
    if (a && b) {
        CHECK_OK(qsa_seq_feed(b, ids, 4, NULL, 0));
        qsa_seq *both[2] = {a, b};
        int free0 = m->pool.n_free;
        CHECK_ERR(qsa_seq_feed_batch(both, ids, 2, p ? p->lg : NULL), QSA_ERR_CONTEXT_FULL, "context");
        CHECK(qsa_seq_pos(a) == 0 && qsa_seq_pos(b) == 4 && m->pool.n_free == free0);
        int32_t next[2];
        CHECK_ERR(qsa_seq_feed_batch_greedy(both, ids, 2, next), QSA_ERR_CONTEXT_FULL, "context");
        CHECK(qsa_seq_pos(a) == 0 && qsa_seq_pos(b) == 4 && m->pool.n_free == free0);
        CHECK_ERR(qsa_seq_feed_batch_greedy(both, ids, 2, NULL), QSA_ERR_INVALID_ARGUMENT, "NULL");
        both[1] = a;
        CHECK_ERR(qsa_seq_feed_batch(both, ids, 2, p ? p->lg : NULL), QSA_ERR_INVALID_ARGUMENT, "same");
    }
    qsa_seq_free(a);
    qsa_seq_free(b);
    bd_pair_free(p);
    qsa_model_free(m);
}

/* Threads sharing a CUDA model, each with its own sequences: the model's one stream and scratch serve every
   call, so its device calls take turns under the model's lock (without it two feeds ran in the same
   buffers).  Four threads, each creating a sequence, feeding a 40-token prompt in two chunks and a decode
   step, and freeing it, 50 times: every run's logits equal the single-threaded run's, bit for bit, and the
   pool ends whole. */
typedef struct gpu_thr { qsa_model *m; const float *want; int rounds, bad; } gpu_thr;
static void gpu_thr_run(qsa_model *m, float *lg) {
    int V = m->cfg.vocab_size;
    int32_t ids[41];
    for (int i = 0; i < 41; i++) ids[i] = (int32_t)((i * 37 + 11) % V);
    memset(lg, 0, sizeof(float) * (size_t)V);
    qsa_seq *s = NULL;
    if (qsa_seq_create(m, NULL, &s) != QSA_OK) return;
    if (qsa_seq_feed(s, ids, 25, NULL, 0) == QSA_OK && qsa_seq_feed(s, ids + 25, 15, NULL, 0) == QSA_OK)
        qsa_seq_feed(s, ids + 40, 1, lg, 0);
    qsa_seq_free(s);
}
static void *gpu_thr_main(void *arg) {
    gpu_thr *a = (gpu_thr *)arg;
    float *lg = (float *)malloc(sizeof(float) * (size_t)a->m->cfg.vocab_size);
    for (int r = 0; lg && r < a->rounds; r++) {
        gpu_thr_run(a->m, lg);
        a->bad += memcmp(lg, a->want, sizeof(float) * (size_t)a->m->cfg.vocab_size) != 0;
    }
    free(lg);
    return NULL;
}
TEST(gpu, threads_sharing_a_model_take_turns) {
    qsa_model *m = NULL;
    SHARDED_OR_SKIP(0, 0, &m);
    float *want = (float *)malloc(sizeof(float) * (size_t)m->cfg.vocab_size);
    if (!want) { qsa_model_free(m); return; }
    gpu_thr_run(m, want);
    enum { NT = 4 };
    gpu_thr a[NT];
    pthread_t th[NT];
    int started[NT];
    for (int i = 0; i < NT; i++) {
        a[i].m = m; a[i].want = want; a[i].rounds = 50; a[i].bad = 0;
        started[i] = pthread_create(&th[i], NULL, gpu_thr_main, &a[i]) == 0;
    }
    int bad = 0;
    for (int i = 0; i < NT; i++) {
        if (started[i]) pthread_join(th[i], NULL);
        bad += a[i].bad;
    }
    CHECKF(bad == 0, "%d of %d runs gave other logits than the single-threaded one", bad, NT * 50);
    CHECKF(m->pool.n_free == m->pool.n_pages, "free list: %d entries for %d pages", m->pool.n_free, m->pool.n_pages);
    free(want);
    qsa_model_free(m);
}
