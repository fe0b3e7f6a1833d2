/* tests/t_planner.c - page pool, QSA planner, allocation and page-size invariance (CPU).
 *
 * The determinism contract (docs/DETERMINISM.md): the same request gives bitwise-identical logits,
 * final hidden states and tokens whatever physical pages it gets and whatever the page size.  The
 * physical-order plan (debug switch) must change the plans - and, as it reorders the reductions,
 * the bits.
 */

/* Reference planner: every selected token in logical order, mapped through the block table, grouped
   into maximal runs (same page, consecutive offsets and positions). */
static int ref_plan(const int32_t *blocks, int nsel, int nb, int r, int64_t pos, int ps, const int32_t *bt,
                    qsa__seg *out, int max) {
    int n = 0;
    int64_t ntok = (int64_t)nsel * r + (pos + 1 - (int64_t)nb * r);
    for (int64_t i = 0; i < ntok; i++) {
        int64_t t = i < (int64_t)nsel * r ? (int64_t)blocks[i / r] * r + i % r : (int64_t)nb * r + (i - (int64_t)nsel * r);
        int32_t page = bt[t / ps], off = (int32_t)(t % ps);
        if (n && out[n - 1].page == page && out[n - 1].offset + out[n - 1].len == off && out[n - 1].logical + out[n - 1].len == t)
            out[n - 1].len++;
        else {
            if (n == max) return -1;
            out[n].page = page; out[n].offset = off; out[n].len = 1; out[n].logical = (int32_t)t;
            n++;
        }
    }
    return n;
}

static uint64_t lcg(uint64_t *s) { *s = *s * 6364136223846793005ull + 1442695040888963407ull; return *s >> 33; }

TEST(cpu, planner_matches_reference_planner) {
    static const int page_sizes[] = {16, 400, 784, 17};
    static const int64_t lengths[] = {1, 3, 4, 5, 64, 1000, 8192, 262144};
    uint64_t seed = 7;
    qsa__plan pl;
    memset(&pl, 0, sizeof pl);
    int cases = 0;
    for (int pi = 0; pi < 4; pi++)
        for (int li = 0; li < 8; li++)
            for (int r = 1; r <= 8; r *= 2)
                for (int topk = 1; topk <= 512; topk *= 8) {
                    int ps = page_sizes[pi];
                    int64_t pos = lengths[li] - 1;
                    int nb = (int)((pos + 1) / r);
                    int npages = (int)(pos / ps) + 1;
                    int32_t *bt = (int32_t *)malloc(sizeof(int32_t) * (size_t)npages);
                    for (int i = 0; i < npages; i++) bt[i] = i;
                    for (int i = npages - 1; i > 0; i--) { int j = (int)(lcg(&seed) % (uint64_t)(i + 1)); int32_t t = bt[i]; bt[i] = bt[j]; bt[j] = t; }
                    /* a random ascending selection of min(topk, nb) blocks (sometimes adjacent runs) */
                    int k = topk < nb ? topk : nb, nsel = 0;
                    int32_t *blocks = (int32_t *)malloc(sizeof(int32_t) * (size_t)(k + 1));
                    for (int b = 0; b < nb && nsel < k; b++)
                        if ((int64_t)(lcg(&seed) % (uint64_t)nb) < (int64_t)k * 2 || nb - b <= k - nsel) blocks[nsel++] = b;
                    int max = (int)(nsel * r + r + 8);
                    qsa__seg *want = (qsa__seg *)malloc(sizeof(qsa__seg) * (size_t)max);
                    int nw = ref_plan(blocks, nsel, nb, r, pos, ps, bt, want, max);
                    CHECK_OK(qsa__plan_build(&pl, blocks, nsel, nb, r, pos, ps, bt, 0));
                    int same = nw == pl.n_seg && pl.n_tokens == nsel * r + (int)(pos + 1 - (int64_t)nb * r);
                    for (int i = 0; same && i < nw; i++)
                        same = want[i].page == pl.seg[i].page && want[i].offset == pl.seg[i].offset &&
                               want[i].len == pl.seg[i].len && want[i].logical == pl.seg[i].logical;
                    CHECKF(same, "ps %d len %lld r %d topk %d: plan differs from the reference planner", ps, (long long)(pos + 1), r, topk);
                    /* segments never cross a page and are in ascending logical order */
                    for (int i = 0; i < pl.n_seg; i++) {
                        CHECK(pl.seg[i].offset + pl.seg[i].len <= ps);
                        if (i) CHECK(pl.seg[i].logical > pl.seg[i - 1].logical);
                    }
                    /* the physical-order plan has the same segments sorted by address */
                    CHECK_OK(qsa__plan_build(&pl, blocks, nsel, nb, r, pos, ps, bt, 1));
                    for (int i = 1; i < pl.n_seg; i++) CHECK(!qsa__seg_phys_before(&pl.seg[i], &pl.seg[i - 1]));
                    CHECK(pl.n_tokens == nsel * r + (int)(pos + 1 - (int64_t)nb * r));
                    free(bt); free(blocks); free(want);
                    cases++;
                }
    free(pl.seg);
    CHECK(cases == 4 * 8 * 4 * 4);
}

TEST(cpu, planner_edge_cases) {
    qsa__plan pl;
    memset(&pl, 0, sizeof pl);
    int32_t bt[4] = {3, 1, 2, 0};
    /* no complete block: tail only */
    CHECK_OK(qsa__plan_build(&pl, NULL, 0, 0, 4, 2, 16, bt, 0));
    CHECK(pl.n_seg == 1 && pl.seg[0].page == 3 && pl.seg[0].offset == 0 && pl.seg[0].len == 3 && pl.n_tokens == 3);
    /* all blocks selected and contiguous: one range per page, cut at the page boundary */
    int32_t all[8] = {0, 1, 2, 3, 4, 5, 6, 7};
    CHECK_OK(qsa__plan_build(&pl, all, 8, 8, 4, 33, 16, bt, 0));
    CHECK(pl.n_seg == 3 && pl.n_tokens == 34);
    CHECK(pl.seg[0].page == 3 && pl.seg[0].len == 16 && pl.seg[1].page == 1 && pl.seg[1].len == 16 && pl.seg[2].page == 2 && pl.seg[2].len == 2);
    CHECK_OK(qsa__plan_build(&pl, all, 8, 8, 4, 33, 16, bt, 1));
    CHECK(pl.seg[0].page == 1 && pl.seg[1].page == 2 && pl.seg[2].page == 3);
    free(pl.seg);
}

TEST(cpu, default_page_size_rule) {
    qsa_model_config c;
    memset(&c, 0, sizeof c);
    /* Qwen3.8-Flash-Next-like: 48 value heads of 128x128 (fp32 state: 3 MiB per layer), 2 KV heads of
       256 (fp16 K+V: 2 KiB per token) + a 128-wide fp32 indexer key (512 B) */
    c.linear_num_value_heads = 48; c.linear_key_head_dim = 128; c.linear_value_head_dim = 128;
    c.num_key_value_heads = 2; c.head_dim = 256; c.has_qsa = 1; c.indexer_head_dim = 128;
    CHECK(qsa__default_page_size(&c) == 16 * 77); /* 16 * ceil(3145728 / (16 * 2560)) */
    c.has_qsa = 0; c.linear_num_value_heads = 1; c.linear_key_head_dim = 8; c.linear_value_head_dim = 8;
    CHECK(qsa__default_page_size(&c) == 16);      /* at least one group of 16 */
}

/* ---- allocation and page-size invariance on the CPU backend ---- */

typedef struct inv_result {
    float *logits;   /* [n][V] prefill + [steps][V] decode */
    float *hidden;   /* [n][H] */
    int32_t tokens[16];
} inv_result;

#define INV_STEPS 8

/* Run prompt (fed in chunks of 37) + INV_STEPS greedy steps on `s`.  Between chunks `disturb` gets a
   chance to allocate / free other sequences. */
typedef void (*inv_disturb)(qsa_model *m, int step, void *state);

static void inv_run(qsa_model *m, qsa_seq *s, const int32_t *ids, int n, inv_result *out, inv_disturb dist, void *st) {
    int V = m->cfg.vocab_size;
    for (int p = 0, step = 0; p < n; step++) {
        int k = 37 < n - p ? 37 : n - p;
        if (dist) dist(m, step, st);
        s->hidden_out = out->hidden + (size_t)p * m->cfg.hidden_size;
        CHECK_OK(qsa_seq_feed(s, ids + p, k, out->logits + (size_t)p * V, 1));
        p += k;
    }
    s->hidden_out = NULL;
    const float *last = out->logits + (size_t)(n - 1) * V;
    for (int i = 0; i < INV_STEPS; i++) {
        out->tokens[i] = qsa__argmax(last, V);
        if (dist) dist(m, 100 + i, st);
        CHECK_OK(qsa_seq_feed(s, &out->tokens[i], 1, out->logits + (size_t)(n + i) * V, 0));
        last = out->logits + (size_t)(n + i) * V;
    }
}

/* Other requests coming and going: a few sequences fed different prompts, some freed midway. */
typedef struct inv_crowd { qsa_seq *other[8]; int n; uint64_t seed; int mode; } inv_crowd;

static void inv_crowd_step(qsa_model *m, int step, void *state) {
    inv_crowd *c = (inv_crowd *)state;
    int32_t ids[64];
    for (int i = 0; i < 64; i++) ids[i] = (int32_t)(lcg(&c->seed) % (uint64_t)m->cfg.vocab_size);
    if (c->mode == 1 && c->n < 8) { /* interleave: a new request every step, fed a little */
        if (qsa_seq_create(m, NULL, &c->other[c->n]) == QSA_OK) {
            qsa_seq_feed(c->other[c->n], ids, 5 + (int)(lcg(&c->seed) % 40), NULL, 0);
            c->n++;
        }
    }
    if (c->mode == 1 && c->n > 2 && step % 2) { qsa_seq_free(c->other[0]); memmove(c->other, c->other + 1, sizeof(qsa_seq *) * (size_t)--c->n); }
    if (c->mode == 2 && step % 3 == 0) qsa__pool_shuffle(&m->pool, c->seed + (uint64_t)step);
}

static void inv_crowd_free(inv_crowd *c) {
    for (int i = 0; i < c->n; i++) qsa_seq_free(c->other[i]);
    c->n = 0;
}

static int inv_same(const inv_result *a, const inv_result *b, int n, int V, int H) {
    return !memcmp(a->logits, b->logits, sizeof(float) * (size_t)(n + INV_STEPS) * V) &&
           !memcmp(a->hidden, b->hidden, sizeof(float) * (size_t)n * H) && !memcmp(a->tokens, b->tokens, sizeof(int32_t) * INV_STEPS);
}

/* One request of n_tokens prompt tokens (0: 8x the QSA budget + 13) + INV_STEPS greedy steps under the
   allocation scenarios 0, stride, 2*stride, ... of 0..20 (below) for each page size; the first page size's
   scenario 0 (a fresh pool, pages in ascending order) is the reference. */
static int inv_allocations_ex(const char *fixture, qsa_backend backend, int physical_order, int tp, const int *page_sizes,
                              int n_ps, int n_tokens, int stride, int *n_differ) {
    char dir[600];
    snprintf(dir, sizeof dir, "%s/%s", test_path("tests/fixtures"), fixture);
    inv_result ref, cur;
    memset(&ref, 0, sizeof ref);
    int n = 0, V = 0, H = 0, runs = 0;
    int32_t *ids = NULL;
    *n_differ = 0;
    for (int pi = 0; pi < n_ps; pi++) {
        qsa_model_params mp;
        memset(&mp, 0, sizeof mp);
        mp.backend = backend;
        mp.kv_page_size = page_sizes[pi];
        mp.kv_pool_tokens = 8 * 784 * 4;
        mp.debug_physical_order = physical_order;
        mp.tp = tp;
        qsa_model *m = NULL;
        CHECK_OK(qsa_model_load(dir, &mp, &m));
        if (!m) return runs;
        if (!ids) {
            V = m->cfg.vocab_size; H = m->cfg.hidden_size;
            n = n_tokens > 0 ? n_tokens : 8 * m->cfg.indexer_budget + 13; /* >= 8x the QSA budget, not a multiple of anything */
            ids = (int32_t *)malloc(sizeof(int32_t) * (size_t)n);
            uint64_t sd = 99;
            for (int i = 0; i < n; i++) ids[i] = (int32_t)(lcg(&sd) % (uint64_t)V);
            ref.logits = (float *)malloc(sizeof(float) * (size_t)(n + INV_STEPS) * V);
            ref.hidden = (float *)malloc(sizeof(float) * (size_t)n * H);
        }
        cur.logits = (float *)malloc(sizeof(float) * (size_t)(n + INV_STEPS) * V);
        cur.hidden = (float *)malloc(sizeof(float) * (size_t)n * H);
        for (int a = 0; a < 21; a += stride) {
            inv_crowd crowd;
            memset(&crowd, 0, sizeof crowd);
            crowd.seed = 1000 + (uint64_t)a;
            qsa_seq *hold[64];
            int nhold = 0;
            /* allocation scenario a */
            if (a >= 1 && a <= 6) qsa__pool_shuffle(&m->pool, (uint64_t)a);           /* shuffled free list */
            if (a >= 7 && a <= 11) crowd.mode = 1;                                    /* requests interleaved and freed */
            if (a >= 12 && a <= 16) {                                                 /* fragmented pool */
                for (int i = 0; i < 16 && nhold < 64; i++) {
                    if (qsa_seq_create(m, NULL, &hold[nhold]) != QSA_OK) break;
                    int32_t few[40];
                    for (int j = 0; j < 40; j++) few[j] = (int32_t)(j % V);
                    qsa_seq_feed(hold[nhold], few, 1 + (int)((i * 7 + a) % 40), NULL, 0);
                    nhold++;
                }
                for (int i = 0; i < nhold; i += 2) qsa_seq_free(hold[i]);               /* free every other */
                for (int i = 1, j = 0; i < nhold; i += 2) hold[j++] = hold[i];
                nhold /= 2;
            }
            if (a >= 17) { crowd.mode = 2; qsa__pool_shuffle(&m->pool, 77 + (uint64_t)a); } /* pages scattered as it grows */
            qsa_seq *s = NULL;
            CHECK_OK(qsa_seq_create(m, NULL, &s));
            if (!s) break;
            inv_run(m, s, ids, n, pi == 0 && a == 0 ? &ref : &cur, crowd.mode ? inv_crowd_step : NULL, &crowd);
            if (!(pi == 0 && a == 0)) {
                if (!inv_same(&ref, &cur, n, V, H)) (*n_differ)++;
                runs++;
            }
            qsa_seq_free(s);
            inv_crowd_free(&crowd);
            for (int i = 0; i < nhold; i++) qsa_seq_free(hold[i]);
        }
        free(cur.logits); free(cur.hidden);
        qsa_model_free(m);
    }
    free(ref.logits); free(ref.hidden); free(ids);
    return runs;
}

/* One request, >= 20 allocations per page size, page sizes 16, 400 and 784: bitwise identical.  (The
   request, 8 x 16 + 13 prompt tokens and 8 steps, fits one page of 400 or 784: there these runs check
   page-size invariance; allocation_invariance_across_page_boundaries below puts a request on several
   pages of every size.) */
static int inv_allocations(const char *fixture, qsa_backend backend, int physical_order, int tp, int *n_differ) {
    static const int page_sizes[] = {16, 400, 784};
    return inv_allocations_ex(fixture, backend, physical_order, tp, page_sizes, 3, 0, 1, n_differ);
}

TEST(cpu, allocation_and_page_size_invariance) {
    int differ, runs = inv_allocations("qsa_hc4_ple_sharded", QSA_BACKEND_CPU, 0, 0, &differ);
    CHECKF(runs >= 60, "only %d runs", runs);
    CHECKF(differ == 0, "%d of %d allocations/page sizes changed the bits", differ, runs);
}

/* Allocation invariance where a request sits on several pages of every size (the test above places its
   request on one page of 400 or 784 tokens, so any allocation gives the same bits there) and where QSA
   blocks (4 tokens in the fixture) straddle pages: 17 and 19 are no multiples of 4, so a block's raw
   indexer keys, and a selected block's K and V, are read from two pages.  The request: a page of 784
   + 29 prompt tokens and 8 steps; scenarios 0, 5, 10, 15, 20 (fresh, shuffled, interleaved,
   fragmented, scattered while growing) per page size. */
TEST(cpu, allocation_invariance_across_page_boundaries) {
    static const int page_sizes[] = {16, 17, 19, 400, 784};
    int differ, runs = inv_allocations_ex("qsa_hc4_ple_sharded", QSA_BACKEND_CPU, 0, 0, page_sizes, 5, 784 + 29, 5, &differ);
    CHECKF(runs >= 24, "only %d runs", runs);
    CHECKF(differ == 0, "%d of %d allocations/page sizes changed the bits", differ, runs);
}

/* The physical-order switch: plans differ whenever a query's pages are out of address order, and
   the reordered reductions change the bits for some allocations. */
TEST(cpu, physical_order_plan_breaks_invariance) {
    qsa__plan a, b;
    memset(&a, 0, sizeof a); memset(&b, 0, sizeof b);
    int32_t bt[4] = {2, 0, 3, 1}, blocks[3] = {0, 5, 9};
    CHECK_OK(qsa__plan_build(&a, blocks, 3, 12, 4, 60, 16, bt, 0));
    CHECK_OK(qsa__plan_build(&b, blocks, 3, 12, 4, 60, 16, bt, 1));
    int same = a.n_seg == b.n_seg;
    for (int i = 0; same && i < a.n_seg; i++) same = a.seg[i].page == b.seg[i].page && a.seg[i].offset == b.seg[i].offset;
    CHECK(!same);
    free(a.seg); free(b.seg);
    int differ, runs = inv_allocations("qsa_hc4_ple_sharded", QSA_BACKEND_CPU, 1, 0, &differ);
    printf("    physical-order plans: %d of %d allocations/page sizes changed the bits\n", differ, runs);
    CHECKF(differ > 0, "the physical-order plan changed nothing in %d runs", runs);
    /* and at the large page sizes, with a request over several pages of each */
    static const int large[] = {400, 784};
    runs = inv_allocations_ex("qsa_hc4_ple_sharded", QSA_BACKEND_CPU, 1, 0, large, 2, 784 + 29, 5, &differ);
    printf("    at pages of 400 and 784: %d of %d changed the bits\n", differ, runs);
    CHECKF(differ > 0, "the physical-order plan changed nothing in %d runs at pages of 400 and 784", runs);
}

/* Capture a QSA layer on scattered pages, replay it: the frozen plan and today's planner reproduce
   the output bit for bit, the physical-order plan does not. */
TEST(cpu, capture_replay_reproduces_and_detects) {
    char dir[600], path[700];
    snprintf(dir, sizeof dir, "%s/qsa_hc4_ple_sharded", test_path("tests/fixtures"));
    qsa_model_params mp;
    memset(&mp, 0, sizeof mp);
    mp.backend = QSA_BACKEND_CPU;
    mp.kv_page_size = 16;
    qsa_model *m = NULL;
    CHECK_OK(qsa_model_load(dir, &mp, &m));
    if (!m) return;
    qsa__pool_shuffle(&m->pool, 5);
    qsa_seq *s = NULL;
    CHECK_OK(qsa_seq_create(m, NULL, &s));
    int32_t ids[150];
    for (int i = 0; i < 150; i++) ids[i] = (int32_t)((i * 37 + 11) % m->cfg.vocab_size);
    CHECK_ERR(qsa_seq_capture_begin(s, 0), QSA_ERR_INVALID_ARGUMENT, "not a QSA layer");
    CHECK_OK(qsa_seq_capture_begin(s, 1));
    CHECK_OK(qsa_seq_feed(s, ids, 100, NULL, 0));
    CHECK_OK(qsa_seq_feed(s, ids + 100, 50, NULL, 0));
    snprintf(path, sizeof path, "/tmp/qsa_test_capture_%d.safetensors", (int)getpid());
    CHECK_OK(qsa_seq_capture_end(s, path));
    qsa_replay_report rep;
    CHECK_OK(qsa_replay_capture(path, QSA_REPLAY_FROZEN_PLAN, &rep));
    CHECK(rep.n_queries == 150 && rep.n_values == 150LL * m->cfg.num_attention_heads * m->cfg.head_dim && rep.n_differ == 0);
    CHECK_OK(qsa_replay_capture(path, QSA_REPLAY_PLANNER, &rep));
    CHECK(rep.n_queries == 150 && rep.n_differ == 0);
    CHECK_OK(qsa_replay_capture(path, QSA_REPLAY_PHYSICAL_ORDER, &rep));
    CHECK(rep.n_differ > 0 && rep.first_query >= 0);
    /* a file that is not a capture is refused clearly */
    CHECK_ERR(qsa_replay_capture(test_path("tests/fixtures/qsa_hc4_ple_sharded/golden.safetensors"), QSA_REPLAY_PLANNER, &rep),
              QSA_ERR_NOT_FOUND, "not a capture file");
    remove(path);
    qsa_seq_free(s);
    qsa_model_free(m);
}

/* Top-k block selection: the k best by (score desc, index asc), returned in ascending index order;
   checked against a brute-force ranking with many ties, and at 65,536 blocks. */
static int topk_ref_better(const float *s, int a, int b) { return s[a] > s[b] || (s[a] == s[b] && a < b); }

TEST(cpu, select_blocks_matches_brute_force) {
    static float scores[65536];
    static int32_t sel[1024];
    static unsigned char chosen[65536];
    uint64_t seed = 11;
    static const int nbs[] = {0, 1, 3, 4, 5, 17, 100, 1000, 65536};
    static const int ks[] = {1, 4, 5, 64, 512};
    for (int ni = 0; ni < 9; ni++)
        for (int ki = 0; ki < 5; ki++)
            for (int mode = 0; mode < 3; mode++) {
                int nb = nbs[ni], k = ks[ki];
                for (int b = 0; b < nb; b++) {
                    uint64_t r = lcg(&seed);
                    /* mode 0: continuous; 1: few distinct values (ties); 2: increasing (worst case for insertion) */
                    scores[b] = mode == 0 ? (float)(r % 100000) / 1000.0f : mode == 1 ? (float)(r % 5) : (float)b * 0.5f;
                    if (mode == 1 && r % 7 == 0) scores[b] = -0.0f;
                }
                int n = qsa__select_blocks(scores, nb, k, sel);
                int want = k < nb ? k : nb;
                CHECKF(n == want, "nb %d k %d: %d selected", nb, k, n);
                memset(chosen, 0, (size_t)nb);
                for (int i = 0; i < n; i++) {
                    if (i) CHECK(sel[i] > sel[i - 1]);
                    chosen[sel[i]] = 1;
                }
                /* every chosen block beats every unchosen one */
                int worst = -1, best_out = -1;
                for (int b = 0; b < nb; b++) {
                    if (chosen[b] && (worst < 0 || topk_ref_better(scores, worst, b))) worst = b;
                    if (!chosen[b] && (best_out < 0 || topk_ref_better(scores, b, best_out))) best_out = b;
                }
                if (worst >= 0 && best_out >= 0)
                    CHECKF(topk_ref_better(scores, worst, best_out), "nb %d k %d mode %d: a better block was left out", nb, k, mode);
            }
}

/* A copy of the capture at `src` with one change: tensor `name`'s dtype (if dt >= 0) or the int32/int64
   element `idx` set to `val` (meta: the values that make every size wrap to 0 when `wrap`). */
static int capture_mutant(const char *src, const char *dst, const char *name, int dt, size_t idx, int64_t val, int wrap) {
    static const char *names[11] = {"meta", "pos", "q", "sel", "nsel", "out", "plan", "plan_off", "bt", "k", "v"};
    qsa__st_set st;
    if (qsa__st_open_file(src, &st) != QSA_OK) return 0;
    qsa__st_out t[11];
    void *copy[11];
    int ok = 1;
    memset(t, 0, sizeof t);
    for (int i = 0; i < 11; i++) {
        const qsa__tensor *T = qsa__st_find(&st, names[i]);
        copy[i] = malloc(T->nbytes + 8);
        memcpy(copy[i], T->data, T->nbytes);
        t[i].name = names[i]; t[i].dtype = T->dtype; t[i].ndim = T->ndim; t[i].data = copy[i];
        for (int d = 0; d < T->ndim; d++) t[i].shape[d] = T->shape[d];
        if (strcmp(names[i], name)) continue;
        if (dt >= 0) t[i].dtype = (qsa__dtype)dt;
        else if (T->dtype == QSA__I64) ((int64_t *)copy[i])[idx] = val;
        else ((int32_t *)copy[i])[idx] = (int32_t)val;
    }
    if (wrap) { /* n 256, nh 2^30, hd 2^24: q and out have 2^65 and 2^64 bytes, i.e. none; no pages */
        int64_t n = 256, meta[12] = {1, 1, 1 << 30, 1, 1 << 24, 1, 0, n, 0, 1 << 24, 128, 0};
        static int64_t pos[256];
        static int32_t zeros[257];
        for (int i = 0; i < n; i++) pos[i] = i;
        memcpy(copy[0], meta, sizeof meta);
        for (int i = 1; i < 11; i++) { t[i].ndim = 1; t[i].shape[0] = 0; t[i].data = zeros; }
        t[1].shape[0] = n; t[1].data = pos;
        t[4].shape[0] = n;
        t[7].shape[0] = n + 1;
        t[6].ndim = 2; t[6].shape[1] = 4;
    }
    ok = qsa__st_write(dst, t, 11) == QSA_OK;
    for (int i = 0; i < 11; i++) free(copy[i]);
    qsa__st_close(&st);
    return ok;
}

/* Hostile captures are refused with a clear error (each one crashed the replay: a selected block past
   the block table, a plan segment whose offset + len wraps, sizes that wrap to 0 in the meta check;
   a wrong dtype was read as raw bytes; a page id of 2^24 asked for 2^24 pages, a repeated one replaced
   the page before); and a capture's pages hold nothing past the sequence's last token (they held the
   KV of the page's previous user). */
TEST(cpu, replay_refuses_hostile_captures) {
    char dir[600], path[700], bad[720];
    snprintf(dir, sizeof dir, "%s/qsa_hc4_ple_sharded", test_path("tests/fixtures"));
    qsa_model_params mp;
    memset(&mp, 0, sizeof mp);
    mp.backend = QSA_BACKEND_CPU;
    mp.kv_page_size = 16;
    qsa_model *m = NULL;
    CHECK_OK(qsa_model_load(dir, &mp, &m));
    if (!m) return;
    qsa_seq *a = NULL, *s = NULL;
    CHECK_OK(qsa_seq_create(m, NULL, &a));
    CHECK_OK(qsa_seq_create(m, NULL, &s));
    int32_t ids[40];
    for (int i = 0; i < 40; i++) ids[i] = (int32_t)((i * 37 + 11) % m->cfg.vocab_size);
    CHECK_OK(qsa_seq_feed(a, ids, 16, NULL, 0)); /* a fills a page, then gives it back */
    float akey[32];
    memcpy(akey, qsa__pool_k(&m->pool, m->pool.slot[1], a->bt[0], 10), sizeof akey);
    qsa_seq_free(a);
    CHECK_OK(qsa_seq_capture_begin(s, 1));
    CHECK_OK(qsa_seq_feed(s, ids, 3, NULL, 0)); /* s gets that page, writes 3 slots */
    snprintf(path, sizeof path, "/tmp/qsa_test_capture_leak_%d.safetensors", (int)getpid());
    CHECK_OK(qsa_seq_capture_end(s, path));
    qsa__st_set st;
    CHECK_OK(qsa__st_open_file(path, &st));
    const qsa__tensor *k = qsa__st_find(&st, "k");
    CHECKF(k && memcmp(k->data + (size_t)10 * m->pool.kvd * 4, akey, sizeof akey) != 0, "the capture holds the page's previous user's keys");
    qsa__st_close(&st);
    CHECK_OK(qsa_seq_capture_begin(s, 1));
    CHECK_OK(qsa_seq_feed(s, ids + 3, 37, NULL, 0));
    CHECK_OK(qsa_seq_capture_end(s, path));
    qsa_replay_report rep;
    CHECK_OK(qsa_replay_capture(path, QSA_REPLAY_PLANNER, &rep));
    CHECK(rep.n_queries == 37 && rep.n_differ == 0);
    snprintf(bad, sizeof bad, "%s.bad", path);
    CHECK(capture_mutant(path, bad, "sel", -1, 36 * 4, 50000000, 0));
    CHECK_ERR(qsa_replay_capture(bad, QSA_REPLAY_PLANNER, &rep), QSA_ERR_FORMAT, "selected block 50000000");
    CHECK(capture_mutant(path, bad, "sel", -1, 36 * 4, -3, 0));
    CHECK_ERR(qsa_replay_capture(bad, QSA_REPLAY_PLANNER, &rep), QSA_ERR_FORMAT, "selected block -3");
    CHECK(capture_mutant(path, bad, "pos", -1, 5, -7, 0));
    CHECK_ERR(qsa_replay_capture(bad, QSA_REPLAY_PLANNER, &rep), QSA_ERR_FORMAT, "query 5 does not fit");
    CHECK(capture_mutant(path, bad, "plan", -1, 1, 1, 0) && capture_mutant(bad, bad, "plan", -1, 2, INT32_MAX, 0));
    CHECK_ERR(qsa_replay_capture(bad, QSA_REPLAY_FROZEN_PLAN, &rep), QSA_ERR_FORMAT, "plan segment 0 out of range");
    CHECK(capture_mutant(path, bad, "sel", QSA__F32, 0, 0, 0));
    CHECK_ERR(qsa_replay_capture(bad, QSA_REPLAY_PLANNER, &rep), QSA_ERR_FORMAT, "'sel' is F32");
    CHECK(capture_mutant(path, bad, "meta", -1, 7, ((int64_t)1 << 32) + 37, 0));
    CHECK_ERR(qsa_replay_capture(bad, QSA_REPLAY_PLANNER, &rep), QSA_ERR_FORMAT, "meta[7]");
    CHECK(capture_mutant(path, bad, "meta", -1, 7, INT32_MAX, 0)); /* (n + 1 overflowed int: the fuzzer's, s82) */
    CHECK_ERR(qsa_replay_capture(bad, QSA_REPLAY_PLANNER, &rep), QSA_ERR_SHAPE, "tensor 'pos' has 296 bytes, expected 17179869176");
    CHECK(capture_mutant(path, bad, "bt", -1, 0, (int64_t)1 << 30, 0)); /* a far page id: replayed as it was */
    CHECK_OK(qsa_replay_capture(bad, QSA_REPLAY_PLANNER, &rep));
    CHECK(rep.n_queries == 37 && rep.n_differ == 0);
    CHECK_ERR(qsa_replay_capture(bad, QSA_REPLAY_FROZEN_PLAN, &rep), QSA_ERR_FORMAT, "out of range"); /* its plan names the old id */
    int32_t bt1 = s->bt[1];
    CHECK(capture_mutant(path, bad, "bt", -1, 0, bt1, 0));
    CHECK_ERR(qsa_replay_capture(bad, QSA_REPLAY_PLANNER, &rep), QSA_ERR_FORMAT, "is in the block table twice");
    CHECK_ERR(qsa_replay_capture(path, (qsa_replay_mode)7, &rep), QSA_ERR_INVALID_ARGUMENT, "unknown mode 7");
    CHECK(capture_mutant(path, bad, "meta", -1, 0, 1, 1));
    CHECK_ERR(qsa_replay_capture(bad, QSA_REPLAY_FROZEN_PLAN, &rep), QSA_ERR_SHAPE, "tensor 'q'");
    remove(bad);
    remove(path);
    qsa_seq_free(s);
    qsa_model_free(m);
}
