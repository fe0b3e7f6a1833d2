/* tests/t_sched.c - the request scheduler (issue 6): memory pressure, refusals, cancellation, stop
 * conditions, seeds, statistics, continuing a sequence, batch invariance on the CPU backend.
 *
 * The oracle for "completes correctly" is qsa_generate on a fresh sequence of a second instance of
 * the model (its own, unconstrained page pool): a request served by the scheduler must give the
 * same tokens bit for bit, whatever else ran beside it and whichever pages it got.
 * Models: the golden fixture qsa_first_no_ple (3 layers, 2 of them QSA, vocab 512, no tokenizer),
 * and models/tiny (built by `make`; has a tokenizer) for text, chat and stop strings.
 *
 * Every test body takes the backend: TEST(cpu, sched_X) runs it on the CPU reference, TEST(gpu,
 * sched_X) the same body on the CUDA backend with the serving configuration (cuda_batch_decode = 1,
 * cuda_graphs = 1: decode steps are batched forward passes replayed as CUDA graphs), skipped when
 * there is no CUDA device.  On the GPU the oracle is qsa_generate on the GPU (same backend, one
 * sequence at a time, the single-sequence path): the scheduler's batched decode must give the same
 * tokens bit for bit.
 */

#define TS_FIXTURE "tests/fixtures/qsa_first_no_ple"

static qsa_result ts_load_status; /* of the last ts_load */

static qsa_model *ts_load(qsa_backend be, const char *rel, int page_size, int pool_tokens) {
    qsa_model_params mp;
    memset(&mp, 0, sizeof mp);
    mp.backend = be;
    mp.n_threads = 1;
    mp.kv_page_size = page_size;
    mp.kv_pool_tokens = pool_tokens;
    if (be == QSA_BACKEND_CUDA) {
        mp.cuda_batch_decode = 1;
        mp.cuda_graphs = 1;
    }
    qsa_model *m = NULL;
    ts_load_status = qsa_model_load(test_path(rel), &mp, &m);
    return ts_load_status == QSA_OK ? m : NULL;
}

/* A model that did not load: skip on the CPU (a missing fixture or models/tiny) and on the GPU
   without a device; any other failure on the GPU fails the test. */
#define TS_UNAVAILABLE(be, ...)                                                                               \
    do {                                                                                                      \
        if ((be) == QSA_BACKEND_CUDA && ts_load_status == QSA_ERR_NO_DEVICE) SKIP("no CUDA device: %s", qsa_last_error()); \
        if ((be) == QSA_BACKEND_CUDA) { CHECKF(0, __VA_ARGS__); return; }                                     \
        SKIP(__VA_ARGS__);                                                                                    \
    } while (0)

/* TEST(cpu, sched_X) and TEST(gpu, sched_X) running the body ts_X(backend). */
#define TS_BOTH(name)                                                   \
    TEST(cpu, sched_##name) { ts_##name(QSA_BACKEND_CPU); }             \
    TEST(gpu, sched_##name) { ts_##name(QSA_BACKEND_CUDA); }

/* a deterministic prompt of n ids in [6, vocab) (avoids the fixture's EOS id 5) */
static void ts_prompt(int32_t *ids, int n, int salt, int vocab) {
    uint64_t x = 0x9e3779b97f4a7c15ull * (uint64_t)(salt + 1);
    for (int i = 0; i < n; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        ids[i] = 6 + (int32_t)((x >> 33) % (uint64_t)(vocab - 6));
    }
}

/* The oracle: the same request through qsa_generate on a fresh sequence. */
static qsa_result ts_generate(qsa_model *m, const int32_t *prompt, int n, const qsa_request_params *rp, qsa_generation *g) {
    qsa_seq *s = NULL;
    qsa_result r = qsa_seq_create(m, NULL, &s);
    if (r != QSA_OK) return r;
    qsa_generate_params gp;
    memset(&gp, 0, sizeof gp);
    gp.sampling = rp->sampling;
    gp.max_tokens = rp->max_tokens;
    gp.stop_strings = rp->stop_strings;
    gp.n_stop_strings = rp->n_stop_strings;
    gp.eos_ids = rp->eos_ids;
    gp.n_eos_ids = rp->n_eos_ids;
    gp.ignore_eos = rp->ignore_eos;
    r = qsa_generate(s, prompt, n, &gp, g);
    qsa_seq_free(s);
    return r;
}

static int ts_same_tokens(const qsa_request_result *a, const qsa_generation *g) {
    return a->n_tokens == g->n_tokens && memcmp(a->tokens, g->tokens, sizeof(int32_t) * (size_t)g->n_tokens) == 0 &&
           a->stop == g->stop;
}

/* Scheduler invariants that must hold between any two steps. */
static void ts_check_invariants(const qsa_sched *s, int max_batch) {
    qsa_sched_info in;
    qsa_sched_get_info(s, &in);
    CHECKF(in.pages_reserved >= 0 && in.pages_free - in.pages_reserved >= 0, "pages: %d free, %d reserved", in.pages_free,
           in.pages_reserved);
    CHECKF(in.n_prefill + in.n_decode <= max_batch, "%d running > max_batch %d", in.n_prefill + in.n_decode, max_batch);
}

/* 64 requests into a pool that holds a fraction of them: each completes exactly as alone, or is
   refused at submit with a status and a message; none is corrupted; the pool is whole at the end. */
static void ts_memory_pressure(qsa_backend be) {
    qsa_model *m = ts_load(be, TS_FIXTURE, 16, 160); /* 10 pages of 16 tokens */
    qsa_model *ref = ts_load(be, TS_FIXTURE, 0, 0);
    if (!m || !ref) { qsa_model_free(m); qsa_model_free(ref); TS_UNAVAILABLE(be, "fixture %s: %s", TS_FIXTURE, qsa_last_error()); }
    int V = qsa_model_get_config(m)->vocab_size;
    qsa_sched_params sp;
    memset(&sp, 0, sizeof sp);
    sp.prefill_chunk = 16;
    qsa_sched *s = NULL;
    CHECK_OK(qsa_sched_create(m, &sp, &s));
    if (!s) { qsa_model_free(m); qsa_model_free(ref); return; }
    enum { N = 64 };
    static int32_t prompts[N][200];
    static qsa_request_params rp[N];
    int64_t ids[N];
    int lens[N], refused = 0;
    for (int i = 0; i < N; i++) {
        lens[i] = i % 16 == 5 ? 170 : 3 + (i * 7) % 38; /* 170 + max_tokens: 11+ pages > the pool's 10 */
        ts_prompt(prompts[i], lens[i], i, V);
        memset(&rp[i], 0, sizeof rp[i]);
        rp[i].prompt = prompts[i];
        rp[i].n_prompt = lens[i];
        rp[i].max_tokens = 3 + i % 6;
        if (i % 2) { rp[i].sampling.temperature = 0.9f; rp[i].sampling.top_p = 0.95f; rp[i].sampling.seed = (uint64_t)i; }
        if (i % 4 >= 2) { rp[i].sampling.repetition_penalty = 1.5f; rp[i].sampling.penalty_last_n = -1; } /* uses the history */
        qsa_result r = qsa_sched_submit(s, &rp[i], &ids[i]);
        if (lens[i] == 170) {
            CHECK_ERR(r, QSA_ERR_CONTEXT_FULL, "the whole pool has 10 pages");
            CHECK(ids[i] == 0);
            refused++;
        } else CHECK_OK(r);
    }
    CHECK(refused == 4);
    int saw_queued_behind_memory = 0, steps = 0;
    while (qsa_sched_active(s) && steps < 10000) {
        CHECK_OK(qsa_sched_step(s));
        steps++;
        ts_check_invariants(s, 32);
        qsa_sched_info in;
        qsa_sched_get_info(s, &in);
        if (in.n_queued > 0 && in.n_prefill + in.n_decode < 32) saw_queued_behind_memory = 1;
    }
    CHECK(saw_queued_behind_memory); /* the pool, not max_batch, held requests back */
    int done = 0;
    for (int i = 0; i < N; i++) {
        if (!ids[i]) continue;
        qsa_request_result res;
        CHECK_OK(qsa_sched_poll(s, ids[i], &res));
        CHECKF(res.status == QSA_REQ_DONE, "request %d: %s %s", i, qsa_request_status_string(res.status), res.message);
        qsa_generation g;
        CHECK_OK(ts_generate(ref, prompts[i], lens[i], &rp[i], &g));
        CHECKF(ts_same_tokens(&res, &g), "request %d (prompt %d, max %d): %d tokens vs %d alone", i, lens[i], rp[i].max_tokens,
               res.n_tokens, g.n_tokens);
        qsa_generation_free(&g);
        done += res.status == QSA_REQ_DONE;
        CHECK_OK(qsa_sched_release(s, ids[i]));
    }
    CHECK(done == N - refused);
    qsa_sched_info in;
    qsa_sched_get_info(s, &in);
    CHECKF(in.pages_free == in.pages_total && in.pages_reserved == 0, "pool: %d of %d free, %d reserved", in.pages_free,
           in.pages_total, in.pages_reserved);
    CHECK(in.n_queued + in.n_prefill + in.n_decode + in.n_finished == 0);
    if (T_.verbose) printf("    %d steps, %lld prefill + %lld decode tokens\n", steps, in.n_prefill_tokens, in.n_decode_tokens);
    qsa_sched_free(s);
    qsa_model_free(m);
    qsa_model_free(ref);
}
TS_BOTH(memory_pressure)

/* What can never fit is refused at once with a message; what cannot fit because pages are held
   outside the scheduler is refused when nothing running could free them; others are unaffected. */
static void ts_refusals(qsa_backend be) {
    qsa_model *m = ts_load(be, TS_FIXTURE, 16, 160);
    qsa_model *ref = ts_load(be, TS_FIXTURE, 0, 0);
    if (!m || !ref) { qsa_model_free(m); qsa_model_free(ref); TS_UNAVAILABLE(be, "fixture %s: %s", TS_FIXTURE, qsa_last_error()); }
    int V = qsa_model_get_config(m)->vocab_size;
    qsa_sched_params sp;
    memset(&sp, 0, sizeof sp);
    sp.max_queued = 3;
    qsa_sched *s = NULL;
    CHECK_OK(qsa_sched_create(m, &sp, &s));
    if (!s) { qsa_model_free(m); qsa_model_free(ref); return; }
    int32_t p[200];
    ts_prompt(p, 200, 1, V);
    qsa_request_params rp;
    memset(&rp, 0, sizeof rp);
    rp.prompt = p;
    int64_t id = -1;
    rp.n_prompt = 150; rp.max_tokens = 20;
    CHECK_ERR(qsa_sched_submit(s, &rp, &id), QSA_ERR_CONTEXT_FULL, "needs 169 tokens = 11 KV pages of 16 tokens");
    CHECK(id == 0);
    rp.n_prompt = 30; rp.max_tokens = 8; rp.n_ctx = 32;
    CHECK_ERR(qsa_sched_submit(s, &rp, &id), QSA_ERR_CONTEXT_FULL, "more than the context of 32");
    rp.n_ctx = 100000;
    CHECK_ERR(qsa_sched_submit(s, &rp, &id), QSA_ERR_CONTEXT_FULL, "max_position_embeddings");
    rp.n_ctx = 30; rp.max_tokens = 0;
    CHECK_ERR(qsa_sched_submit(s, &rp, &id), QSA_ERR_CONTEXT_FULL, "leaves no room");
    rp.n_ctx = 0; /* max_tokens 0 keeps the default context (4,096 tokens) whole: past the pool, and n_ctx is the remedy */
    CHECK_ERR(qsa_sched_submit(s, &rp, &id), QSA_ERR_CONTEXT_FULL, "lower n_ctx (with max_tokens 0");
    rp.max_tokens = 600;
    CHECK_ERR(qsa_sched_submit(s, &rp, &id), QSA_ERR_CONTEXT_FULL, "or lower max_tokens)");
    rp.n_ctx = 0; rp.max_tokens = 4;
    rp.sampling.top_p = 3.0f;
    CHECK_ERR(qsa_sched_submit(s, &rp, &id), QSA_ERR_INVALID_ARGUMENT, "top_p");
    rp.sampling.top_p = 0;
    rp.n_prompt = 0;
    CHECK_ERR(qsa_sched_submit(s, &rp, &id), QSA_ERR_INVALID_ARGUMENT, "n_prompt 0");
    int32_t bad[2] = {7, 100000};
    rp.prompt = bad; rp.n_prompt = 2;
    CHECK_ERR(qsa_sched_submit(s, &rp, &id), QSA_ERR_INVALID_ARGUMENT, "outside the vocabulary");
    rp.prompt = NULL; rp.text = "hello";
    CHECK_ERR(qsa_sched_submit(s, &rp, &id), QSA_ERR_INVALID_ARGUMENT, "has none");
    rp.text = NULL;
    rp.max_tokens = -1;
    CHECK_ERR(qsa_sched_submit(s, &rp, &id), QSA_ERR_INVALID_ARGUMENT, "max_tokens -1");
    /* negative counts (they meant none), messages without a count (it ran the empty conversation), a
       caller's sequence that refuses feeds (it took a slot and pages, then failed) */
    rp.prompt = p; rp.n_prompt = 4; rp.max_tokens = 2;
    const char *stops[1] = {"x"};
    rp.stop_strings = stops; rp.n_stop_strings = -1;
    CHECK_ERR(qsa_sched_submit(s, &rp, &id), QSA_ERR_INVALID_ARGUMENT, "n_stop_strings -1");
    /* a stop string that is not UTF-8 (it cut "\xc3\xa9" after its first byte and streamed half a character) */
    const char *half[2] = {"x", "\xa9"};
    rp.stop_strings = half; rp.n_stop_strings = 2;
    CHECK_ERR(qsa_sched_submit(s, &rp, &id), QSA_ERR_INVALID_ARGUMENT, "stop string: invalid UTF-8");
    rp.stop_strings = NULL; rp.n_stop_strings = 0;
    qsa_chat_message msg = {"user", "hi"};
    rp.prompt = NULL; rp.messages = &msg; rp.n_messages = -7;
    CHECK_ERR(qsa_sched_submit(s, &rp, &id), QSA_ERR_INVALID_ARGUMENT, "messages with n_messages -7");
    rp.messages = NULL; rp.n_messages = 0; rp.prompt = p;
    qsa_seq *own = NULL;
    CHECK_OK(qsa_seq_create(m, NULL, &own));
    if (own) {
        own->broken = 1; /* (what a feed that failed part-way leaves) */
        rp.seq = own;
        CHECK_ERR(qsa_sched_submit(s, &rp, &id), QSA_ERR_INVALID_ARGUMENT, "qsa_seq_reset it first");
        qsa_seq_reset(own);
        rp.max_tokens = 0; /* keeps the sequence's 4,096 tokens: past the pool; its n_ctx is not the request's */
        CHECK_ERR(qsa_sched_submit(s, &rp, &id), QSA_ERR_CONTEXT_FULL, "set max_tokens (with max_tokens 0 the request keeps its sequence's");
        rp.seq = NULL;
        qsa_seq_free(own);
    }
    rp.max_tokens = -1;
    CHECK(qsa_sched_active(s) == 0);
    /* a default context past the model's is refused at create (not at each request that would use it) */
    qsa_sched *s2 = NULL;
    sp.n_ctx_default = qsa_model_get_config(m)->max_position_embeddings + 1;
    CHECK_ERR(qsa_sched_create(m, &sp, &s2), QSA_ERR_INVALID_ARGUMENT, "exceeds the model's context");
    CHECK(s2 == NULL);
    /* a sequence outside the scheduler holds 8 of the 10 pages */
    qsa_seq *outside = NULL;
    CHECK_OK(qsa_seq_create(m, NULL, &outside));
    CHECK_OK(qsa_seq_feed(outside, p, 8 * 16, NULL, 0));
    rp.prompt = p; rp.max_tokens = 4;
    int64_t small = 0, big = 0, after = 0;
    rp.n_prompt = 20;  /* 23 tokens: 2 pages, fits */
    CHECK_OK(qsa_sched_submit(s, &rp, &small));
    rp.n_prompt = 40;  /* 43 tokens: 3 pages, never fits while `outside` lives */
    CHECK_OK(qsa_sched_submit(s, &rp, &big));
    rp.n_prompt = 10;
    CHECK_OK(qsa_sched_submit(s, &rp, &after));
    CHECK_ERR(qsa_sched_submit(s, &rp, &id), QSA_ERR_CONTEXT_FULL, "queue is full");
    rp.max_tokens = 0; rp.n_ctx = 0; /* a bad request to a full queue is told it is bad (it was told the queue is full) */
    CHECK_ERR(qsa_sched_submit(s, &rp, &id), QSA_ERR_CONTEXT_FULL, "lower n_ctx (with max_tokens 0");
    rp.max_tokens = 4;
    CHECK_OK(qsa_sched_run(s));
    qsa_request_result res;
    CHECK_OK(qsa_sched_poll(s, big, &res));
    CHECK(res.status == QSA_REQ_REFUSED && res.error == QSA_ERR_CONTEXT_FULL);
    CHECKF(strstr(res.message, "held by sequences outside the scheduler") != NULL, "message '%s'", res.message);
    int64_t ok_ids[2] = {small, after};
    int ok_lens[2] = {20, 10};
    for (int k = 0; k < 2; k++) {
        CHECK_OK(qsa_sched_poll(s, ok_ids[k], &res));
        CHECK(res.status == QSA_REQ_DONE);
        qsa_generation g;
        rp.n_prompt = ok_lens[k];
        CHECK_OK(ts_generate(ref, p, ok_lens[k], &rp, &g));
        CHECK(ts_same_tokens(&res, &g));
        qsa_generation_free(&g);
    }
    CHECK(qsa_seq_pos(outside) == 128);
    qsa_seq_free(outside);
    qsa_sched_info in;
    qsa_sched_get_info(s, &in);
    CHECK(in.pages_free == in.pages_total && in.pages_reserved == 0);
    CHECK_ERR(qsa_sched_poll(s, 999, &res), QSA_ERR_NOT_FOUND, "no request 999");
    qsa_sched_free(s);
    qsa_model_free(m);
    qsa_model_free(ref);
}
TS_BOTH(refusals)

typedef struct ts_cb {
    qsa_sched *s;
    int64_t cancel_id;   /* cancel this request when called the cancel_at-th time */
    int cancel_at, calls, stop_at, free_at; /* free_at: call qsa_sched_free (refused inside a step) */
    qsa__buf text;
} ts_cb;

static int ts_on_token(void *user, int32_t token, const char *text, size_t len) {
    ts_cb *c = (ts_cb *)user;
    (void)token;
    c->calls++;
    qsa__buf_put(&c->text, text, len);
    if (c->cancel_id && c->calls == c->cancel_at) qsa_sched_cancel(c->s, c->cancel_id);
    if (c->free_at && c->calls == c->free_at) {
        qsa_sched_free(c->s);
        CHECKF(strstr(qsa_last_error(), "inside a step") != NULL, "qsa_sched_free inside a step: '%s'", qsa_last_error());
    }
    return c->stop_at && c->calls == c->stop_at;
}

/* Cancelling a queued, a prefilling and a decoding request gives their pages back at once. */
static void ts_cancel_frees_pages(qsa_backend be) {
    qsa_model *m = ts_load(be, TS_FIXTURE, 16, 160);
    qsa_model *ref = ts_load(be, TS_FIXTURE, 0, 0);
    if (!m || !ref) { qsa_model_free(m); qsa_model_free(ref); TS_UNAVAILABLE(be, "fixture %s: %s", TS_FIXTURE, qsa_last_error()); }
    int V = qsa_model_get_config(m)->vocab_size;
    qsa_sched_params sp;
    memset(&sp, 0, sizeof sp);
    sp.max_batch = 2;
    sp.prefill_chunk = 8;
    qsa_sched *s = NULL;
    CHECK_OK(qsa_sched_create(m, &sp, &s));
    if (!s) { qsa_model_free(m); qsa_model_free(ref); return; }
    qsa_sched_info in0, in;
    qsa_sched_get_info(s, &in0);
    int32_t p[64];
    ts_prompt(p, 64, 3, V);
    qsa_request_params rp;
    memset(&rp, 0, sizeof rp);
    rp.prompt = p;
    rp.max_tokens = 20;
    int64_t a, b, c;
    rp.n_prompt = 40; CHECK_OK(qsa_sched_submit(s, &rp, &a)); /* 59 tokens: 4 pages, 5 prefill steps */
    rp.n_prompt = 6;  CHECK_OK(qsa_sched_submit(s, &rp, &b)); /* 25 tokens: 2 pages, decoding after step 1 */
    rp.n_prompt = 10; CHECK_OK(qsa_sched_submit(s, &rp, &c)); /* waits: max_batch 2 */
    CHECK_OK(qsa_sched_step(s));
    CHECK_OK(qsa_sched_step(s));
    qsa_request_result ra, rb, rc;
    CHECK_OK(qsa_sched_poll(s, a, &ra));
    CHECK_OK(qsa_sched_poll(s, b, &rb));
    CHECK_OK(qsa_sched_poll(s, c, &rc));
    CHECK(ra.status == QSA_REQ_PREFILL && ra.n_prompt_fed == 16);
    CHECK(rb.status == QSA_REQ_DECODE && rb.n_tokens == 2);
    CHECK(rc.status == QSA_REQ_QUEUED);
    qsa_sched_get_info(s, &in);
    CHECK(in.pages_reserved + (in0.pages_free - in.pages_free) == 6); /* 4 + 2 pages promised */
    CHECK_OK(qsa_sched_cancel(s, c));
    qsa_sched_get_info(s, &in);
    CHECK(in.pages_reserved + (in0.pages_free - in.pages_free) == 6);
    CHECK_OK(qsa_sched_cancel(s, a)); /* its 1 page taken goes back to the pool, its 3 reserved are dropped */
    qsa_sched_get_info(s, &in);
    CHECK(in.pages_reserved + (in0.pages_free - in.pages_free) == 2);
    CHECK_OK(qsa_sched_cancel(s, b));
    qsa_sched_get_info(s, &in);
    CHECK(in.pages_free == in0.pages_free && in.pages_reserved == 0 && qsa_sched_active(s) == 0);
    CHECK_OK(qsa_sched_poll(s, a, &ra));
    CHECK_OK(qsa_sched_poll(s, b, &rb));
    CHECK_OK(qsa_sched_poll(s, c, &rc));
    CHECK(ra.status == QSA_REQ_CANCELLED && rb.status == QSA_REQ_CANCELLED && rc.status == QSA_REQ_CANCELLED);
    CHECK(ra.error == QSA_ERR_CANCELLED && rb.error == QSA_ERR_CANCELLED && rc.error == QSA_ERR_CANCELLED);
    CHECK(rb.n_tokens == 2 && ra.n_tokens == 0 && rc.n_prompt_fed == 0);
    CHECK_OK(qsa_sched_cancel(s, a)); /* no effect on a finished request */
    CHECK_ERR(qsa_sched_cancel(s, 12345), QSA_ERR_NOT_FOUND, "no request 12345");
    /* from a callback: request d cancels itself at its 3rd token, e cancels f (decoding beside it),
       g stops by returning non-zero; h runs on, unaffected */
    ts_cb cd, ce, cg;
    memset(&cd, 0, sizeof cd); memset(&ce, 0, sizeof ce); memset(&cg, 0, sizeof cg);
    cd.s = ce.s = cg.s = s;
    int64_t d, e, f, g, h;
    rp.on_token = ts_on_token;
    rp.n_prompt = 5; rp.user = &cd; CHECK_OK(qsa_sched_submit(s, &rp, &d));
    cd.cancel_id = d; cd.cancel_at = 3;
    rp.n_prompt = 7; rp.user = &ce; CHECK_OK(qsa_sched_submit(s, &rp, &e));
    rp.n_prompt = 9; rp.user = NULL; rp.on_token = NULL; CHECK_OK(qsa_sched_submit(s, &rp, &f));
    ce.cancel_id = f; ce.cancel_at = 4;
    rp.n_prompt = 11; rp.user = &cg; rp.on_token = ts_on_token; CHECK_OK(qsa_sched_submit(s, &rp, &g));
    cg.stop_at = 5;
    cg.free_at = 2; /* (refused: the steps go on) */
    rp.n_prompt = 13; rp.user = NULL; rp.on_token = NULL; CHECK_OK(qsa_sched_submit(s, &rp, &h));
    CHECK_OK(qsa_sched_run(s));
    qsa_request_result r;
    CHECK_OK(qsa_sched_poll(s, d, &r)); CHECK(r.status == QSA_REQ_CANCELLED && r.n_tokens == 3);
    CHECK_OK(qsa_sched_poll(s, f, &r)); CHECK(r.status == QSA_REQ_CANCELLED && r.n_tokens < 20);
    CHECK_OK(qsa_sched_poll(s, e, &r)); CHECK(r.status == QSA_REQ_DONE && r.stop == QSA_STOP_MAX_TOKENS && r.n_tokens == 20);
    CHECK_OK(qsa_sched_poll(s, g, &r)); CHECK(r.status == QSA_REQ_DONE && r.stop == QSA_STOP_CALLBACK && r.n_tokens == 5);
    CHECK_OK(qsa_sched_poll(s, h, &r));
    CHECK(r.status == QSA_REQ_DONE);
    qsa_generation gen;
    rp.n_prompt = 13;
    CHECK_OK(ts_generate(ref, p, 13, &rp, &gen));
    CHECK(ts_same_tokens(&r, &gen));
    qsa_generation_free(&gen);
    /* release a live request: cancelled and forgotten */
    int64_t i2;
    rp.n_prompt = 5; CHECK_OK(qsa_sched_submit(s, &rp, &i2));
    CHECK_OK(qsa_sched_step(s));
    CHECK_OK(qsa_sched_release(s, i2));
    CHECK_ERR(qsa_sched_poll(s, i2, &r), QSA_ERR_NOT_FOUND, "released");
    qsa_sched_get_info(s, &in);
    CHECK(in.pages_free == in0.pages_free && in.pages_reserved == 0);
    /* freeing the scheduler with live requests gives everything back */
    rp.n_prompt = 30; CHECK_OK(qsa_sched_submit(s, &rp, &i2));
    rp.n_prompt = 20; CHECK_OK(qsa_sched_submit(s, &rp, &i2));
    CHECK_OK(qsa_sched_step(s));
    qsa_sched_free(s);
    CHECK(m->pool.n_free == in0.pages_free);
    qsa__buf_free(&cd.text); qsa__buf_free(&ce.text); qsa__buf_free(&cg.text);
    qsa_model_free(m);
    qsa_model_free(ref);
}
TS_BOTH(cancel_frees_pages)

/* EOS (the model's or an override, and ignore_eos), max_tokens, stop strings; streamed text. */
static void ts_stop_conditions(qsa_backend be) {
    qsa_model *m = ts_load(be, TS_FIXTURE, 16, 0);
    if (!m) TS_UNAVAILABLE(be, "fixture %s: %s", TS_FIXTURE, qsa_last_error());
    int V = qsa_model_get_config(m)->vocab_size;
    qsa_sched *s = NULL;
    CHECK_OK(qsa_sched_create(m, NULL, &s));
    if (!s) { qsa_model_free(m); return; }
    int32_t p[16];
    ts_prompt(p, 16, 5, V);
    qsa_request_params rp;
    memset(&rp, 0, sizeof rp);
    rp.prompt = p; rp.n_prompt = 16; rp.max_tokens = 12;
    rp.eos_ids = NULL; rp.ignore_eos = 1;
    int64_t base;
    CHECK_OK(qsa_sched_submit(s, &rp, &base));
    CHECK_OK(qsa_sched_run(s));
    qsa_request_result r0;
    CHECK_OK(qsa_sched_poll(s, base, &r0));
    CHECK(r0.status == QSA_REQ_DONE && r0.stop == QSA_STOP_MAX_TOKENS && r0.n_tokens == 12);
    int32_t t4 = r0.tokens[4];
    int first = 0;
    while (r0.tokens[first] != t4) first++;
    /* EOS override: stops at the first occurrence, the EOS token included */
    int64_t ie, ii, im;
    rp.eos_ids = &t4; rp.n_eos_ids = 1; rp.ignore_eos = 0;
    CHECK_OK(qsa_sched_submit(s, &rp, &ie));
    rp.ignore_eos = 1;
    CHECK_OK(qsa_sched_submit(s, &rp, &ii));
    rp.ignore_eos = 0; rp.max_tokens = 3; rp.eos_ids = NULL; rp.n_eos_ids = 0;
    CHECK_OK(qsa_sched_submit(s, &rp, &im));
    CHECK_OK(qsa_sched_run(s));
    qsa_request_result r;
    CHECK_OK(qsa_sched_poll(s, ie, &r));
    CHECK(r.stop == QSA_STOP_EOS && r.n_tokens == first + 1 && r.tokens[first] == t4);
    CHECK_OK(qsa_sched_poll(s, ii, &r));
    CHECK(r.stop == QSA_STOP_MAX_TOKENS && r.n_tokens == 12 && memcmp(r.tokens, r0.tokens, 12 * sizeof(int32_t)) == 0);
    CHECK_OK(qsa_sched_poll(s, im, &r));
    CHECK(r.stop == QSA_STOP_MAX_TOKENS && r.n_tokens == 3 && memcmp(r.tokens, r0.tokens, 3 * sizeof(int32_t)) == 0);
    qsa_sched_free(s);
    qsa_model_free(m);

    /* stop strings need text: models/tiny */
    m = ts_load(be, "models/tiny", 0, 0);
    if (!m) TS_UNAVAILABLE(be, "models/tiny (run make): %s", qsa_last_error());
    CHECK_OK(qsa_sched_create(m, NULL, &s));
    if (!s) { qsa_model_free(m); return; }
    memset(&rp, 0, sizeof rp);
    rp.text = "Tell me a story about a cat.";
    rp.chat = 1;
    rp.max_tokens = 24;
    rp.ignore_eos = 1;
    ts_cb cb;
    memset(&cb, 0, sizeof cb);
    rp.on_token = ts_on_token; rp.user = &cb;
    CHECK_OK(qsa_sched_submit(s, &rp, &base));
    CHECK_OK(qsa_sched_run(s));
    CHECK_OK(qsa_sched_poll(s, base, &r0));
    CHECK(r0.status == QSA_REQ_DONE && r0.n_tokens == 24);
    CHECKF(cb.text.len == r0.text_len && (!r0.text_len || memcmp(cb.text.data, r0.text, r0.text_len) == 0),
           "streamed %zu bytes, text %zu", cb.text.len, r0.text_len);
    /* the same request through the messages form and through pre-tokenised ids */
    qsa_chat_message msg;
    msg.role = "user"; msg.content = rp.text;
    char *chat = NULL;
    int32_t *ids = NULL;
    size_t nids = 0;
    CHECK_OK(qsa_chat_apply_template(qsa_model_get_tokenizer(m), &msg, 1, 1, &chat));
    CHECK_OK(qsa_tokenize(qsa_model_get_tokenizer(m), chat, strlen(chat), 1, &ids, &nids));
    int64_t imsg, iids;
    rp.on_token = NULL; rp.text = NULL; rp.chat = 0;
    rp.messages = &msg; rp.n_messages = 1;
    CHECK_OK(qsa_sched_submit(s, &rp, &imsg));
    rp.messages = NULL; rp.prompt = ids; rp.n_prompt = (int)nids;
    CHECK_OK(qsa_sched_submit(s, &rp, &iids));
    CHECK_OK(qsa_sched_run(s));
    CHECK_OK(qsa_sched_poll(s, base, &r0));
    CHECK_OK(qsa_sched_poll(s, imsg, &r));
    CHECK(r.n_tokens == 24 && memcmp(r.tokens, r0.tokens, 24 * sizeof(int32_t)) == 0);
    CHECK_OK(qsa_sched_poll(s, iids, &r));
    CHECK(r.n_tokens == 24 && memcmp(r.tokens, r0.tokens, 24 * sizeof(int32_t)) == 0);
    CHECK(r.stats.n_prompt == (int)nids);
    /* a stop string cut from the middle of that text */
    size_t L = r0.text_len;
    if (L < 6) {
        printf("    note: models/tiny produced only %zu bytes of text: stop-string check skipped\n", L);
    } else {
        size_t at = L / 2;
        while (at > 0 && ((unsigned char)r0.text[at] & 0xc0) == 0x80) at--;
        size_t end = at + 1;
        while (end < L && ((unsigned char)r0.text[end] & 0xc0) == 0x80) end++;
        if (end < L) { end++; while (end < L && ((unsigned char)r0.text[end] & 0xc0) == 0x80) end++; }
        char stop[64];
        snprintf(stop, sizeof stop, "%.*s", (int)(end - at), r0.text + at);
        const char *stops[2] = {"\x01never\x01", stop};
        size_t cut = (size_t)(strstr(r0.text, stop) - r0.text);
        qsa__buf_free(&cb.text);
        memset(&cb, 0, sizeof cb);
        rp.stop_strings = stops; rp.n_stop_strings = 2;
        rp.on_token = ts_on_token; rp.user = &cb;
        int64_t is;
        CHECK_OK(qsa_sched_submit(s, &rp, &is));
        CHECK_OK(qsa_sched_run(s));
        CHECK_OK(qsa_sched_poll(s, is, &r));
        CHECKF(r.stop == QSA_STOP_STRING && r.text_len == cut && memcmp(r.text, r0.text, cut) == 0,
               "stop '%s': stop %d, text %zu bytes, expected cut at %zu", stop, (int)r.stop, r.text_len, cut);
        CHECK(cb.text.len == r.text_len && (!cut || memcmp(cb.text.data, r.text, cut) == 0)); /* never streamed past the cut */
        CHECK(r.n_tokens < 24 && memcmp(r.tokens, r0.tokens, sizeof(int32_t) * (size_t)r.n_tokens) == 0);
        /* as qsa_generate does it */
        qsa_generation g;
        CHECK_OK(ts_generate(m, ids, (int)nids, &rp, &g));
        CHECK(ts_same_tokens(&r, &g) && g.text_len == r.text_len && memcmp(g.text, r.text, r.text_len) == 0);
        qsa_generation_free(&g);
    }
    qsa_free(ids);
    qsa_free(chat);
    qsa__buf_free(&cb.text);
    qsa_sched_free(s);
    qsa_model_free(m);
}
TS_BOTH(stop_conditions)

/* Stop strings found in text with NUL bytes (a byte-level token can decode to one), the earliest of
   several, only among matches that end in the new text; and qsa_generate with stop strings on a model
   without a tokenizer (no text at all: its buffer was read as a C string before it held one). */
TEST(cpu, generate_stop_strings) {
    const char text[] = "ab\0cd\nef";
    const char *nl[1] = {"\n"}, *three[3] = {"zz", "cd", "b"}, *empty[1] = {""};
    CHECK(qsa__stop_find(text, 8, 0, nl, 1) == 5);        /* past the NUL */
    CHECK(qsa__stop_find(text, 8, 0, three, 3) == 1);     /* "b" starts before "cd" */
    CHECK(qsa__stop_find(text, 8, 5, three, 3) == -1);    /* both end by the old length */
    CHECK(qsa__stop_find(text, 8, 4, three, 3) == 3);     /* "cd" ends past it, "b" does not */
    CHECK(qsa__stop_find(text, 8, 1, three, 3) == 1);
    CHECK(qsa__stop_find(text, 8, 0, empty, 1) == -1);
    CHECK(qsa__stop_find(text, 1, 0, nl, 1) == -1);
    const char *abc[1] = {"abc"};
    CHECK(qsa__stop_find("abcabc", 6, 3, abc, 1) == 3 && qsa__stop_find("abcabc", 6, 2, abc, 1) == 0);

    qsa_model *m = ts_load(QSA_BACKEND_CPU, TS_FIXTURE, 0, 0);
    if (!m) SKIP("fixture %s: %s", TS_FIXTURE, qsa_last_error());
    CHECK(qsa_model_get_tokenizer(m) == NULL);
    qsa_seq *s = NULL;
    CHECK_OK(qsa_seq_create(m, NULL, &s));
    int32_t p[6];
    ts_prompt(p, 6, 3, qsa_model_get_config(m)->vocab_size);
    qsa_generate_params gp;
    memset(&gp, 0, sizeof gp);
    gp.max_tokens = 3;
    gp.ignore_eos = 1;
    const char *stops[2] = {"\n", NULL};
    gp.stop_strings = stops;
    gp.n_stop_strings = 1;
    qsa_generation g;
    CHECK_OK(qsa_generate(s, p, 6, &gp, &g));
    CHECK(g.stop == QSA_STOP_MAX_TOKENS && g.n_tokens == 3 && g.text_len == 0 && g.text && g.text[0] == 0);
    qsa_generation_free(&g);
    qsa_seq_reset(s);
    gp.n_stop_strings = 2;
    CHECK_ERR(qsa_generate(s, p, 6, &gp, &g), QSA_ERR_INVALID_ARGUMENT, "stop string 1 is NULL");
    const char *half[1] = {"\xc3"}; /* not UTF-8: refused */
    gp.stop_strings = half; gp.n_stop_strings = 1;
    CHECK_ERR(qsa_generate(s, p, 6, &gp, &g), QSA_ERR_INVALID_ARGUMENT, "stop string: invalid UTF-8");
    gp.stop_strings = stops; gp.n_stop_strings = 2;
    gp.stop_strings = NULL;
    CHECK_ERR(qsa_generate(s, p, 6, &gp, &g), QSA_ERR_INVALID_ARGUMENT, "n_stop_strings 2 with NULL stop_strings");
    CHECK(qsa_seq_pos(s) == 0);
    qsa_seq_free(s);
    qsa_model_free(m);
}

/* Same seed, same tokens (also beside each other in one batch); another seed, other tokens. */
static void ts_seeds(qsa_backend be) {
    qsa_model *m = ts_load(be, TS_FIXTURE, 16, 0);
    qsa_model *ref = ts_load(be, TS_FIXTURE, 0, 0);
    if (!m || !ref) { qsa_model_free(m); qsa_model_free(ref); TS_UNAVAILABLE(be, "fixture %s: %s", TS_FIXTURE, qsa_last_error()); }
    int V = qsa_model_get_config(m)->vocab_size;
    qsa_sched *s = NULL;
    CHECK_OK(qsa_sched_create(m, NULL, &s));
    if (!s) { qsa_model_free(m); qsa_model_free(ref); return; }
    int32_t p[12];
    ts_prompt(p, 12, 9, V);
    qsa_request_params rp;
    memset(&rp, 0, sizeof rp);
    rp.prompt = p; rp.n_prompt = 12; rp.max_tokens = 16; rp.ignore_eos = 1;
    rp.sampling.temperature = 1.0f;
    int64_t id[4];
    rp.sampling.seed = 1234; CHECK_OK(qsa_sched_submit(s, &rp, &id[0]));
    rp.sampling.seed = 1234; CHECK_OK(qsa_sched_submit(s, &rp, &id[1]));
    rp.sampling.seed = 99;   CHECK_OK(qsa_sched_submit(s, &rp, &id[2]));
    rp.sampling.temperature = 0; CHECK_OK(qsa_sched_submit(s, &rp, &id[3]));
    CHECK_OK(qsa_sched_run(s));
    qsa_request_result r[4];
    for (int i = 0; i < 4; i++) { CHECK_OK(qsa_sched_poll(s, id[i], &r[i])); CHECK(r[i].n_tokens == 16); }
    CHECK(memcmp(r[0].tokens, r[1].tokens, 16 * sizeof(int32_t)) == 0);
    CHECK(memcmp(r[0].tokens, r[2].tokens, 16 * sizeof(int32_t)) != 0);
    CHECK(memcmp(r[0].tokens, r[3].tokens, 16 * sizeof(int32_t)) != 0);
    qsa_generation g;
    rp.sampling.temperature = 1.0f; rp.sampling.seed = 1234;
    CHECK_OK(ts_generate(ref, p, 12, &rp, &g));
    CHECK(ts_same_tokens(&r[0], &g));
    qsa_generation_free(&g);
    qsa_sched_free(s);
    qsa_model_free(m);
    qsa_model_free(ref);
}
TS_BOTH(seeds)

/* Statistics: ttft <= total, prefill and decode rates as specified. */
static void ts_statistics(qsa_backend be) {
    qsa_model *m = ts_load(be, TS_FIXTURE, 16, 0);
    if (!m) TS_UNAVAILABLE(be, "fixture %s: %s", TS_FIXTURE, qsa_last_error());
    int V = qsa_model_get_config(m)->vocab_size;
    qsa_sched_params sp;
    memset(&sp, 0, sizeof sp);
    sp.max_batch = 3;
    sp.prefill_chunk = 32;
    qsa_sched *s = NULL;
    CHECK_OK(qsa_sched_create(m, &sp, &s));
    if (!s) { qsa_model_free(m); return; }
    int32_t p[100];
    ts_prompt(p, 100, 11, V);
    qsa_request_params rp;
    memset(&rp, 0, sizeof rp);
    rp.prompt = p; rp.ignore_eos = 1;
    int64_t id[6];
    for (int i = 0; i < 6; i++) {
        rp.n_prompt = 20 + 15 * i;
        rp.max_tokens = i == 0 ? 1 : 5 + 3 * i;
        CHECK_OK(qsa_sched_submit(s, &rp, &id[i]));
    }
    CHECK_OK(qsa_sched_run(s));
    for (int i = 0; i < 6; i++) {
        qsa_request_result r;
        CHECK_OK(qsa_sched_poll(s, id[i], &r));
        const qsa_stats *st = &r.stats;
        CHECK(r.status == QSA_REQ_DONE);
        CHECK(st->n_prompt == 20 + 15 * i && st->n_generated == r.n_tokens && r.n_tokens == (i == 0 ? 1 : 5 + 3 * i));
        CHECK(r.n_prompt_fed == st->n_prompt);
        CHECKF(r.queue_s >= 0 && st->prefill_s > 0 && st->ttft_s >= st->prefill_s && st->ttft_s >= r.queue_s &&
               st->ttft_s <= r.total_s && st->decode_s >= 0 && st->ttft_s + st->decode_s <= r.total_s + 1e-9,
               "request %d: queue %g prefill %g ttft %g decode %g total %g", i, r.queue_s, st->prefill_s, st->ttft_s,
               st->decode_s, r.total_s);
        CHECK(fabs(st->prefill_tok_s - st->n_prompt / st->prefill_s) <= 1e-9 * st->prefill_tok_s);
        if (r.n_tokens == 1) CHECK(st->decode_s == 0 && st->decode_tok_s == 0);
        else CHECK(st->decode_s > 0 && fabs(st->decode_tok_s - (r.n_tokens - 1) / st->decode_s) <= 1e-9 * st->decode_tok_s);
        if (i >= 3) CHECK(r.queue_s > 0); /* waited for a batch slot */
    }
    qsa_sched_free(s);
    qsa_model_free(m);
}
TS_BOTH(statistics)

/* Continuing a caller's sequence: turn after turn without recomputing the history, exactly as
   qsa_generate on one sequence; a sequence serves one live request at a time. */
static void ts_continue_sequence(qsa_backend be) {
    qsa_model *m = ts_load(be, TS_FIXTURE, 16, 0);
    if (!m) TS_UNAVAILABLE(be, "fixture %s: %s", TS_FIXTURE, qsa_last_error());
    int V = qsa_model_get_config(m)->vocab_size;
    qsa_sched *s = NULL;
    CHECK_OK(qsa_sched_create(m, NULL, &s));
    qsa_seq *mine = NULL, *theirs = NULL;
    qsa_seq_params sqp;
    memset(&sqp, 0, sizeof sqp);
    sqp.n_ctx = 96;
    CHECK_OK(qsa_seq_create(m, &sqp, &mine));
    CHECK_OK(qsa_seq_create(m, &sqp, &theirs));
    if (!s || !mine || !theirs) { qsa_seq_free(mine); qsa_seq_free(theirs); qsa_sched_free(s); qsa_model_free(m); return; }
    int32_t turns[3][10];
    for (int t = 0; t < 3; t++) ts_prompt(turns[t], 10, 20 + t, V);
    int32_t pending_a = -1, pending_b = -1;
    for (int t = 0; t < 3; t++) {
        int32_t prompt[11];
        int np = 0;
        qsa_request_params rp;
        memset(&rp, 0, sizeof rp);
        rp.max_tokens = 8; rp.sampling.temperature = 0.7f; rp.sampling.seed = (uint64_t)t;
        /* scheduler on `mine` */
        if (pending_a >= 0) prompt[np++] = pending_a;
        memcpy(prompt + np, turns[t], sizeof turns[t]);
        np += 10;
        rp.prompt = prompt; rp.n_prompt = np; rp.seq = mine;
        int64_t id, id2;
        CHECK_OK(qsa_sched_submit(s, &rp, &id));
        CHECK_ERR(qsa_sched_submit(s, &rp, &id2), QSA_ERR_INVALID_ARGUMENT, "already used by live request");
        CHECK_OK(qsa_sched_run(s));
        qsa_request_result r;
        CHECK_OK(qsa_sched_poll(s, id, &r));
        CHECK(r.status == QSA_REQ_DONE);
        pending_a = r.tokens[r.n_tokens - 1];
        /* qsa_generate on `theirs` */
        np = 0;
        if (pending_b >= 0) prompt[np++] = pending_b;
        memcpy(prompt + np, turns[t], sizeof turns[t]);
        np += 10;
        qsa_generate_params gp;
        memset(&gp, 0, sizeof gp);
        gp.sampling = rp.sampling; gp.max_tokens = 8;
        qsa_generation g;
        CHECK_OK(qsa_generate(theirs, prompt, np, &gp, &g));
        CHECK(ts_same_tokens(&r, &g));
        pending_b = g.n_tokens ? g.tokens[g.n_tokens - 1] : -1;
        qsa_generation_free(&g);
        CHECK(qsa_seq_pos(mine) == qsa_seq_pos(theirs));
        CHECK(memcmp(mine->tokens, theirs->tokens, sizeof(int32_t) * (size_t)qsa_seq_pos(mine)) == 0);
        CHECK_OK(qsa_sched_release(s, id));
    }
    /* the context of the caller's sequence bounds the request */
    qsa_request_params rp;
    memset(&rp, 0, sizeof rp);
    int32_t more[40];
    ts_prompt(more, 40, 30, V);
    rp.prompt = more; rp.n_prompt = 40; rp.max_tokens = 30; rp.seq = mine;
    int64_t id;
    CHECK_ERR(qsa_sched_submit(s, &rp, &id), QSA_ERR_CONTEXT_FULL, "more than the context of 96");
    qsa_sched_free(s);
    CHECK(qsa_seq_pos(mine) > 0); /* the scheduler never frees or resets a caller's sequence */
    qsa_seq_free(mine);
    qsa_seq_free(theirs);
    CHECK(m->pool.n_free == m->pool.n_pages);
    qsa_model_free(m);
}
TS_BOTH(continue_sequence)

/* Batch invariance (CPU): a request's logits and tokens are bitwise identical alone and with
   1..31 other requests of different lengths, whatever its slot in the batch. */
typedef struct ts_logits_rec {
    int64_t id;
    int n, vocab;
    float *data; /* [n][vocab] */
} ts_logits_rec;

static void ts_logits_hook(void *user, int64_t id, int index, const float *logits, int vocab) {
    ts_logits_rec *r = (ts_logits_rec *)user;
    if (id != r->id || index >= r->n) return;
    memcpy(r->data + (size_t)index * vocab, logits, sizeof(float) * (size_t)vocab);
}

static void ts_batch_invariance(qsa_backend be) {
    qsa_model *m = ts_load(be, TS_FIXTURE, 16, 0);
    if (!m) TS_UNAVAILABLE(be, "fixture %s: %s", TS_FIXTURE, qsa_last_error());
    int V = qsa_model_get_config(m)->vocab_size;
    enum { NT = 6 };
    int32_t target[23], others[32][64];
    ts_prompt(target, 23, 100, V);
    for (int i = 0; i < 32; i++) ts_prompt(others[i], 64, 200 + i, V);
    float *ref = (float *)calloc((size_t)NT * V, sizeof(float)), *got = (float *)calloc((size_t)NT * V, sizeof(float));
    int32_t ref_tok[NT];
    int ref_n = 0;
    static const int sizes[] = {1, 2, 7, 8, 31, 32};
    int checked = 0;
    for (int si = 0; si < 6; si++) {
        int B = sizes[si];
        int slots[3] = {0, B / 2, B - 1};
        for (int k = 0; k < 3; k++) {
            if (k && slots[k] == slots[k - 1]) continue;
            qsa_sched_params sp;
            memset(&sp, 0, sizeof sp);
            sp.prefill_chunk = 16;
            qsa_sched *s = NULL;
            CHECK_OK(qsa_sched_create(m, &sp, &s));
            if (!s) break;
            ts_logits_rec rec;
            rec.n = NT; rec.vocab = V; rec.data = B == 1 ? ref : got;
            s->logits_hook = ts_logits_hook;
            s->hook_user = &rec;
            qsa_request_params rp;
            int64_t tid = 0, oid;
            for (int j = 0, o = 0; j < B; j++) {
                memset(&rp, 0, sizeof rp);
                rp.ignore_eos = 1;
                if (j == slots[k]) {
                    rp.prompt = target; rp.n_prompt = 23; rp.max_tokens = NT;
                    rp.sampling.temperature = 0.8f; rp.sampling.seed = 7;
                    CHECK_OK(qsa_sched_submit(s, &rp, &tid));
                    continue;
                }
                rp.prompt = others[o]; rp.n_prompt = 3 + (o * 13) % 60; rp.max_tokens = 1 + (o * 5) % 10;
                if (o % 3 == 0) { rp.sampling.temperature = 1.0f; rp.sampling.seed = (uint64_t)o; }
                CHECK_OK(qsa_sched_submit(s, &rp, &oid));
                o++;
            }
            rec.id = tid;
            CHECK_OK(qsa_sched_run(s));
            qsa_request_result r;
            CHECK_OK(qsa_sched_poll(s, tid, &r));
            CHECK(r.status == QSA_REQ_DONE && r.n_tokens == NT);
            if (B == 1) {
                memcpy(ref_tok, r.tokens, sizeof ref_tok);
                ref_n = r.n_tokens;
            } else {
                CHECKF(r.n_tokens == ref_n && memcmp(r.tokens, ref_tok, sizeof ref_tok) == 0, "batch %d slot %d: tokens differ", B,
                       slots[k]);
                CHECKF(memcmp(got, ref, sizeof(float) * (size_t)NT * V) == 0, "batch %d slot %d: logits differ", B, slots[k]);
                checked++;
            }
            qsa_sched_free(s);
        }
    }
    CHECK(checked == 14);
    CHECK(m->pool.n_free == m->pool.n_pages);
    free(ref);
    free(got);
    qsa_model_free(m);
}
TS_BOTH(batch_invariance)

/* A decode step whose requests are all greedy, with no logits hook, takes their tokens from
   qsa_seq_feed_batch_greedy (on CUDA the arg-max on the device): the same tokens as the logits path
   (forced by a hook that reads nothing), 8 requests; with a sampled request among them its decode
   steps keep the logits, and the greedy requests' tokens do not change. */
static void ts_nop_hook(void *user, int64_t id, int index, const float *logits, int vocab) {
    (void)user; (void)id; (void)index; (void)logits; (void)vocab;
}
static void ts_greedy_steps(qsa_backend be) {
    qsa_model *m = ts_load(be, TS_FIXTURE, 16, 0);
    if (!m) TS_UNAVAILABLE(be, "fixture %s: %s", TS_FIXTURE, qsa_last_error());
    int V = qsa_model_get_config(m)->vocab_size;
    enum { N = 8, MAXT = 12 };
    int32_t prompts[N][40], tok[3][N][MAXT];
    int ntok[3][N];
    long long greedy[3] = {0, 0, 0};
    memset(tok, 0, sizeof tok);
    for (int i = 0; i < N; i++) ts_prompt(prompts[i], 40, 300 + i, V);
    for (int pass = 0; pass < 3; pass++) {
        qsa_sched_params sp;
        memset(&sp, 0, sizeof sp);
        qsa_sched *s = NULL;
        CHECK_OK(qsa_sched_create(m, &sp, &s));
        if (!s) break;
        if (pass == 1) s->logits_hook = ts_nop_hook;
        int64_t id[N];
        for (int i = 0; i < N; i++) {
            qsa_request_params rp;
            memset(&rp, 0, sizeof rp);
            rp.prompt = prompts[i];
            rp.n_prompt = 10 + 3 * i;
            rp.max_tokens = 6 + i % 4;
            rp.ignore_eos = 1;
            if (pass == 2 && i == 3) { rp.sampling.temperature = 0.7f; rp.sampling.seed = 5; }
            CHECK_OK(qsa_sched_submit(s, &rp, &id[i]));
        }
        CHECK_OK(qsa_sched_run(s));
        for (int i = 0; i < N; i++) {
            qsa_request_result r;
            CHECK_OK(qsa_sched_poll(s, id[i], &r));
            CHECK(r.status == QSA_REQ_DONE && r.n_tokens == 6 + i % 4);
            ntok[pass][i] = r.n_tokens;
            memcpy(tok[pass][i], r.tokens, sizeof(int32_t) * (size_t)(r.n_tokens < MAXT ? r.n_tokens : MAXT));
        }
        greedy[pass] = s->n_greedy_steps;
        qsa_sched_free(s);
    }
    CHECKF(greedy[0] > 0 && greedy[1] == 0 && greedy[2] < greedy[0], "greedy steps: %lld, %lld with a hook, %lld with a sampled request",
           greedy[0], greedy[1], greedy[2]);
    for (int i = 0; i < N; i++) {
        CHECKF(ntok[0][i] == ntok[1][i] && !memcmp(tok[0][i], tok[1][i], sizeof tok[0][i]), "request %d: greedy ids differ from the logits' arg-max", i);
        if (i != 3) CHECKF(!memcmp(tok[0][i], tok[2][i], sizeof tok[0][i]), "request %d: tokens changed beside a sampled request", i);
    }
    qsa_model_free(m);
}
TS_BOTH(greedy_steps)

/* An allocation failure inside a decode step of three requests ends at most one of them: the one whose
   feed it hit.  The others, not fed that step (the CPU loop stops at a failure) or fed before it, go on
   and give the tokens of a run without the failure; the pool is whole after each.  Every allocation of
   one such step is made to fail in turn, on the CPU backend; then again with request 0's callback
   cancelling request 1 in that step, when request 2 must not take the blame for a failure in request 1's
   feed (nor end in error where it did not without the cancel).  (Before, the scheduler's own arrays and any failure in the loop ended all three.) */
static qsa_sched *ts_three_decoding(qsa_model *m, int64_t id[3], ts_cb *cb) {
    static int32_t p[3][16];
    qsa_sched *s = NULL;
    if (qsa_sched_create(m, NULL, &s) != QSA_OK) return NULL;
    for (int i = 0; i < 3; i++) {
        ts_prompt(p[i], 16, 40 + i, qsa_model_get_config(m)->vocab_size);
        qsa_request_params rp;
        memset(&rp, 0, sizeof rp);
        rp.prompt = p[i];
        rp.n_prompt = 8 + i;
        rp.max_tokens = 6;
        rp.ignore_eos = 1;
        if (i == 2) rp.sampling.temperature = 0.8f, rp.sampling.seed = 7; /* (a sampled one: the step takes logits) */
        if (i == 0 && cb) rp.on_token = ts_on_token, rp.user = cb;
        if (qsa_sched_submit(s, &rp, &id[i]) != QSA_OK) { qsa_sched_free(s); return NULL; }
    }
    if (cb) { /* (its first call is for the first token, after the prompt: the second in the decode step) */
        memset(cb, 0, sizeof *cb);
        cb->s = s;
        cb->cancel_id = id[1];
        cb->cancel_at = 2;
    }
    if (qsa_sched_step(s) != QSA_OK) { qsa_sched_free(s); return NULL; } /* prompts and first tokens: all three decoding */
    return s;
}
TEST(cpu, sched_decode_failure_ends_only_its_request) {
    qsa_model *m = ts_load(QSA_BACKEND_CPU, TS_FIXTURE, 16, 0);
    if (!m) SKIP("fixture %s: %s", TS_FIXTURE, qsa_last_error());
    int64_t id[3];
    int32_t want[3][6];
    qsa_sched *s = ts_three_decoding(m, id, NULL);
    CHECK(s != NULL);
    if (!s) { qsa_model_free(m); return; }
    long a0 = tq_allocs;
    CHECK_OK(qsa_sched_step(s));
    long n = tq_allocs - a0; /* the allocations of one decode step of the three */
    CHECK_OK(qsa_sched_run(s));
    for (int i = 0; i < 3; i++) {
        qsa_request_result r;
        CHECK_OK(qsa_sched_poll(s, id[i], &r));
        CHECK(r.status == QSA_REQ_DONE && r.n_tokens == 6);
        memcpy(want[i], r.tokens, sizeof want[i]);
    }
    qsa_sched_free(s);
    char *own = (char *)calloc((size_t)n + 1, 1); /* did failure k end request 2 without the cancel? */
    int spared = 0, spared_cancel = 0; /* failures after which a request not fed that step went on */
    for (int pass = 0; pass < 2 && own; pass++)
        for (long k = 0; k < n && !T_.failed; k++) {
            ts_cb cb;
            s = ts_three_decoding(m, id, pass ? &cb : NULL);
            if (!s) { CHECK(0); break; }
            tq_fail_at = k;
            CHECK_OK(qsa_sched_step(s));
            tq_fail_at = -1;
            CHECK_OK(qsa_sched_run(s));
            int n_err = 0, first_err = -1;
            for (int i = 0; i < 3; i++) {
                qsa_request_result r;
                CHECK_OK(qsa_sched_poll(s, id[i], &r));
                if (pass && i == 1 && r.status == QSA_REQ_CANCELLED) continue; /* (when request 0's step went well) */
                if (r.status == QSA_REQ_ERROR) {
                    n_err++;
                    if (first_err < 0) first_err = i;
                    CHECKF(r.error == QSA_ERR_OUT_OF_MEMORY, "allocation %ld: request %d ended in %s (%s)", k, i,
                           qsa_result_string(r.error), r.message);
                    if (!pass) own[k] |= (char)(1 << i);
                    CHECKF(i != 2 || !pass || (own[k] & 4), "allocation %ld: with request 1 cancelled by a callback, request 2 "
                           "took the blame for another's failure (%s)", k, r.message);
                    continue;
                }
                CHECKF(r.status == QSA_REQ_DONE && r.n_tokens == 6 && !memcmp(r.tokens, want[i], sizeof want[i]),
                       "allocation %ld of the step: request %d %s with %d tokens, or not those of the run without failures", k,
                       i, qsa_request_status_string(r.status), r.n_tokens);
            }
            CHECKF(n_err <= 1, "allocation %ld of %ld in a decode step: %d of 3 requests ended in ERROR", k, n, n_err);
            if (pass) spared_cancel += (own[k] & 2) && first_err < 0; /* request 1's failure, request 2 fed the step after */
            else spared += n_err == 1 && first_err < 2;
            qsa_sched_info in;
            qsa_sched_get_info(s, &in);
            CHECKF(in.pages_free == in.pages_total && in.pages_reserved == 0, "allocation %ld: %d of %d pages free, %d reserved",
                   k, in.pages_free, in.pages_total, in.pages_reserved);
            qsa_sched_free(s);
            if (pass) qsa__buf_free(&cb.text);
        }
    free(own);
    CHECKF(spared > 0 && spared_cancel > 0, "no failure ended a request before the last of the batch (%ld allocations in the "
           "step), or none of request 1's with it cancelled left request 2 going on (%d)", n, spared_cancel);
    if (T_.verbose)
        printf("    %ld allocations in a decode step of three, each made to fail; %d spared a later request; with request 1 "
               "cancelled, %d of its failures left request 2 going on\n", n, spared, spared_cancel);
    qsa_model_free(m);
}
