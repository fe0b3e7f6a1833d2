/* t_api.c - the public sequence API after a refusal or a failure: nothing lost, nothing kept that was
 * taken, messages naming the call and the sequence (CPU backend, fixture qsa_hc4_ple_sharded: QSA layers,
 * a KV page pool).  Found by a review; each test fails on the tree before. */

/* The context check cannot overflow (pos + INT_MAX wrapped and the id loop read past the caller's array);
   a context past max_position_embeddings is refused at create (the CUDA block-score rows are sized by it);
   a batch's refusal names the batch call and the sequence. */
TEST(cpu, seq_refusals_name_the_call_and_the_sequence) {
    qsa_model *m = cpu_fixture("qsa_hc4_ple_sharded");
    if (!m) return;
    qsa_seq *s[3] = {NULL, NULL, NULL};
    qsa_seq_params sp;
    memset(&sp, 0, sizeof sp);
    sp.n_ctx = m->cfg.max_position_embeddings + 1;
    CHECK_ERR(qsa_seq_create(m, &sp, &s[0]), QSA_ERR_INVALID_ARGUMENT, "n_ctx");
    CHECK(s[0] == NULL);
    sp.n_ctx = 64;
    for (int i = 0; i < 3; i++) CHECK_OK(qsa_seq_create(m, &sp, &s[i]));
    if (!s[0] || !s[1] || !s[2]) goto out;
    int32_t ids[3] = {1, 2, 3};
    CHECK_OK(qsa_seq_feed(s[0], ids, 1, NULL, 0));
    CHECK_ERR(qsa_seq_feed(s[0], ids, INT_MAX, NULL, 0), QSA_ERR_CONTEXT_FULL, "1 + 2147483647 tokens exceed the context of 64");
    CHECK(qsa_seq_pos(s[0]) == 1);
    int32_t bad[3] = {1, 2, m->cfg.vocab_size + 7};
    char want[160];
    snprintf(want, sizeof want, "qsa_seq_feed_batch: sequence 2: token %d is outside the vocabulary", m->cfg.vocab_size + 7);
    CHECK_ERR(qsa_seq_feed_batch(s, bad, 3, NULL), QSA_ERR_INVALID_ARGUMENT, want);
    int32_t nx[3];
    CHECK_ERR(qsa_seq_feed_batch_greedy(s, bad, 3, nx), QSA_ERR_INVALID_ARGUMENT, "qsa_seq_feed_batch_greedy: sequence 2: token");
    CHECK(qsa_seq_pos(s[0]) == 1 && qsa_seq_pos(s[1]) == 0 && qsa_seq_pos(s[2]) == 0);
out:
    for (int i = 0; i < 3; i++) qsa_seq_free(s[i]);
    qsa_model_free(m);
}

/* A feed that runs out of memory before its layers gives back the KV pages it took (it kept them: 7 of
   the pool's pages for a 200-token feed); so do a CPU batch's sequences that were not fed.  Every
   allocation of each call made to fail in turn. */
TEST(cpu, failed_feeds_give_back_their_pages) {
    qsa_model *m = cpu_fixture("qsa_hc4_ple_sharded");
    if (!m) return;
    const qsa__pool *pl = &m->pool;
    int32_t ids[200];
    for (int i = 0; i < 200; i++) ids[i] = (int32_t)((i * 37 + 11) % m->cfg.vocab_size);
    int failures = 0, bad = 0;
    for (long k = 0; !bad; k++) {
        qsa_seq *s = NULL;
        CHECK_OK(qsa_seq_create(m, NULL, &s));
        if (!s) break;
        int free0 = pl->n_free;
        tq_fail_at = k;
        qsa_result r = qsa_seq_feed(s, ids, 200, NULL, 0);
        tq_fail_at = -1;
        if (r == QSA_OK) { qsa_seq_free(s); break; }
        failures++;
        bad = !s->broken && (s->n_pages != 0 || pl->n_free != free0 || qsa_seq_pos(s) != 0);
        CHECKF(!bad, "allocation %ld: a feed refused for memory kept %d pages (pool %d free of %d before)", k, s->n_pages,
               pl->n_free, free0);
        qsa_seq_free(s);
    }
    CHECK(failures > 0);
    /* a batch of three, fed one by one on the CPU: a failure in any sequence's feed */
    int batch_failures = 0;
    bad = 0;
    for (long k = 0; !bad; k++) {
        qsa_seq *s[3] = {NULL, NULL, NULL};
        for (int i = 0; i < 3; i++) CHECK_OK(qsa_seq_create(m, NULL, &s[i]));
        if (!s[0] || !s[1] || !s[2]) { for (int i = 0; i < 3; i++) qsa_seq_free(s[i]); break; }
        int free0 = pl->n_free;
        tq_fail_at = k;
        qsa_result r = qsa_seq_feed_batch(s, ids, 3, NULL);
        tq_fail_at = -1;
        int held = 0, fed = 0; /* pages of the sequences not fed and whole; the pages of those fed */
        for (int i = 0; i < 3; i++) {
            if (qsa_seq_pos(s[i]) == 0 && !s[i]->broken) held += s[i]->n_pages;
            else fed += s[i]->n_pages;
        }
        if (r == QSA_OK) { for (int i = 0; i < 3; i++) qsa_seq_free(s[i]); break; }
        batch_failures++;
        bad = held != 0 || pl->n_free != free0 - fed;
        CHECKF(!bad, "allocation %ld: %d pages held by sequences the failed batch did not feed", k, held);
        for (int i = 0; i < 3; i++) qsa_seq_free(s[i]);
    }
    printf("    %d failed feeds and %d failed batches gave back their pages\n", failures, batch_failures);
    CHECK(batch_failures > 0);
    qsa_model_free(m);
}

/* The sampler at temperature > 0: a NaN logit is never picked (NaN made every probability NaN and the
   draw fell to the last candidate: the NaN itself, or the worst token); an infinite logit or a temperature
   or penalty so small that logits overflow picks the arg-max; bad arguments are refused (vocab 0
   dereferenced NULL). */
TEST(cpu, sampler_nonfinite_logits_and_bad_arguments) {
    qsa_sampling_params sp;
    memset(&sp, 0, sizeof sp);
    sp.temperature = 1.0f;
    sp.seed = 3;
    qsa_sampler *smp = NULL;
    CHECK_OK(qsa_sampler_create(&sp, &smp));
    if (!smp) return;
    float l[5];
    int hits[5] = {0};
    for (int i = 0; i < 1000; i++) {
        float v[5] = {NAN, 1.0f, 0.5f, 0.0f, -1.0f};
        memcpy(l, v, sizeof l);
        int t = qsa_sampler_sample(smp, l, 5, NULL, 0);
        if (t >= 0 && t < 5) hits[t]++;
    }
    CHECKF(hits[0] == 0 && hits[1] > hits[2] && hits[2] > hits[3] && hits[4] > 0, "draws %d %d %d %d %d", hits[0], hits[1],
           hits[2], hits[3], hits[4]);
    float v2[5] = {0.0f, 1.0f, 5.0f, NAN, -3.0f};
    memcpy(l, v2, sizeof l);
    int t = qsa_sampler_sample(smp, l, 5, NULL, 0);
    CHECK(t == 2 || t == 1 || t == 0 || t == 4);
    float v3[5] = {0.0f, INFINITY, 5.0f, INFINITY, -3.0f};
    memcpy(l, v3, sizeof l);
    CHECK(qsa_sampler_sample(smp, l, 5, NULL, 0) == 1);
    qsa_sampler_free(smp);
    sp.temperature = 1e-40f; /* 5 / 1e-40 overflows: the limit, greedy */
    CHECK_OK(qsa_sampler_create(&sp, &smp));
    if (!smp) return;
    for (int i = 0; i < 20; i++) {
        float v4[5] = {5.0f, 4.0f, 3.0f, 2.0f, 1.0f};
        memcpy(l, v4, sizeof l);
        CHECK(qsa_sampler_sample(smp, l, 5, NULL, 0) == 0);
    }
    qsa_sampler_free(smp);
    sp.temperature = 1.0f;
    sp.repetition_penalty = 1e-40f; /* a seen negative logit times 1e-40 is tiny; a seen positive one / 1e-40 inf */
    CHECK_OK(qsa_sampler_create(&sp, &smp));
    if (!smp) return;
    int32_t hist[1] = {3};
    float v5[5] = {2.0f, 1.0f, 0.0f, 0.5f, -1.0f};
    memcpy(l, v5, sizeof l);
    CHECK(qsa_sampler_sample(smp, l, 5, hist, 1) == 3);
    CHECK(qsa_sampler_sample(smp, l, 0, NULL, 0) == -1 && strstr(qsa_last_error(), "vocab < 1"));
    CHECK(qsa_sampler_sample(smp, NULL, 5, NULL, 0) == -1 && strstr(qsa_last_error(), "NULL"));
    CHECK(qsa_sampler_sample(NULL, l, 5, NULL, 0) == -1);
    qsa_sampler_free(smp);
}

/* A capture whose end fails (a path that cannot be written) goes on, and ends with a good path; a begin
   that runs out of memory leaves the capture in progress (both threw the capture away). */
TEST(cpu, capture_survives_a_failed_end_and_begin) {
    qsa_model *m = cpu_fixture("qsa_hc4_ple_sharded");
    if (!m) return;
    qsa_seq *s = NULL;
    CHECK_OK(qsa_seq_create(m, NULL, &s));
    if (!s) { qsa_model_free(m); return; }
    int32_t ids[24];
    for (int i = 0; i < 24; i++) ids[i] = (int32_t)((i * 37 + 11) % m->cfg.vocab_size);
    CHECK_ERR(qsa_seq_capture_begin(NULL, 1), QSA_ERR_INVALID_ARGUMENT, "NULL sequence");
    CHECK_OK(qsa_seq_capture_begin(s, 1));
    CHECK_OK(qsa_seq_feed(s, ids, 24, NULL, 0));
    CHECK_ERR(qsa_seq_capture_end(s, NULL), QSA_ERR_INVALID_ARGUMENT, "NULL path");
    tq_fail_at = 0;
    qsa_result r = qsa_seq_capture_begin(s, 1);
    tq_fail_at = -1;
    CHECK(r == QSA_ERR_OUT_OF_MEMORY && s->cap && s->cap->n == 24);
    CHECK_ERR(qsa_seq_capture_end(s, "/nonexistent_dir_qsa/x.safetensors"), QSA_ERR_IO, "nonexistent_dir_qsa");
    CHECK(s->cap && s->cap->n == 24);
    char path[128];
    snprintf(path, sizeof path, "/tmp/qsa_test_capture_again_%d.safetensors", (int)getpid());
    CHECK_OK(qsa_seq_capture_end(s, path));
    CHECK(s->cap == NULL);
    qsa_replay_report rep;
    CHECK_OK(qsa_replay_capture(path, QSA_REPLAY_PLANNER, &rep));
    CHECK(rep.n_queries == 24 && rep.n_differ == 0);
    remove(path);
    qsa_seq_free(s);
    qsa_model_free(m);
}

/* qsa_generate that runs out of KV pages part-way (the pool is shared, taken a page at a time) returns
   the error with the tokens it generated, their text and the sequence holding them (it freed them). */
TEST(cpu, generate_keeps_its_tokens_when_the_pool_runs_out) {
    char dir[600];
    snprintf(dir, sizeof dir, "%s/qsa_hc4_ple_sharded", test_path("tests/fixtures"));
    qsa_model_params mp;
    memset(&mp, 0, sizeof mp);
    mp.backend = QSA_BACKEND_CPU;
    mp.kv_page_size = 16;
    mp.kv_pool_tokens = 128;
    qsa_model *m = NULL;
    CHECK_OK(qsa_model_load(dir, &mp, &m));
    if (!m) return;
    qsa_seq *a = NULL, *b = NULL;
    CHECK_OK(qsa_seq_create(m, NULL, &a));
    CHECK_OK(qsa_seq_create(m, NULL, &b));
    if (!a || !b) goto out;
    int32_t ids[100];
    for (int i = 0; i < 100; i++) ids[i] = (int32_t)((i * 37 + 11) % m->cfg.vocab_size);
    CHECK_OK(qsa_seq_feed(a, ids, 100, NULL, 0)); /* 7 of the 8 pages */
    qsa_generate_params gp;
    memset(&gp, 0, sizeof gp);
    gp.ignore_eos = 1; /* until the context or the pool is full */
    qsa_generation g;
    qsa_result r = qsa_generate(b, ids, 8, &gp, &g);
    CHECKF(r == QSA_ERR_CONTEXT_FULL && strstr(qsa_last_error(), "KV page pool") && g.n_tokens == 9 && g.tokens && g.text &&
               g.stop == QSA_STOP_NONE && qsa_seq_pos(b) == 16,
           "result %d ('%s'), %d tokens, position %d", (int)r, qsa_last_error(), g.n_tokens, qsa_seq_pos(b));
    for (int i = 0; g.tokens && i < 8; i++) CHECK(b->tokens[8 + i] == g.tokens[i]);
    qsa_generation_free(&g);
out:
    qsa_seq_free(a);
    qsa_seq_free(b);
    qsa_model_free(m);
}

/* A sequence a failed feed left broken refuses a feed of 0 tokens too (it returned OK, as if the
   sequence could go on); negative counts in the generation and sampling parameters are refused (a
   negative max_tokens meant no limit, penalty_last_n -5 looked back over the whole history). */
TEST(cpu, broken_sequences_and_negative_counts_are_refused) {
    qsa_model *m = cpu_fixture("qsa_hc4_ple_sharded");
    if (!m) return;
    int32_t ids[40];
    for (int i = 0; i < 40; i++) ids[i] = (int32_t)((i * 37 + 11) % m->cfg.vocab_size);
    qsa_seq *s = NULL;
    int broke = 0;
    for (long k = 0; !broke; k++) { /* fail each allocation of a feed in turn until one breaks the sequence */
        qsa_seq_free(s);
        s = NULL;
        CHECK_OK(qsa_seq_create(m, NULL, &s));
        if (!s) break;
        tq_fail_at = k;
        qsa_result r = qsa_seq_feed(s, ids, 40, NULL, 0);
        tq_fail_at = -1;
        if (r == QSA_OK) break;
        broke = s->broken;
    }
    CHECK(broke);
    if (broke) {
        CHECK_ERR(qsa_seq_feed(s, ids, 0, NULL, 0), QSA_ERR_INVALID_ARGUMENT, "qsa_seq_reset it first");
        qsa_seq_reset(s);
        CHECK_OK(qsa_seq_feed(s, ids, 0, NULL, 0));
        CHECK_OK(qsa_seq_feed(s, ids, 4, NULL, 0));
    }
    qsa_generate_params gp;
    memset(&gp, 0, sizeof gp);
    qsa_generation g;
    gp.max_tokens = -1;
    if (s) CHECK_ERR(qsa_generate(s, ids, 4, &gp, &g), QSA_ERR_INVALID_ARGUMENT, "max_tokens -1");
    gp.max_tokens = 2;
    gp.n_stop_strings = -1;
    if (s) CHECK_ERR(qsa_generate(s, ids, 4, &gp, &g), QSA_ERR_INVALID_ARGUMENT, "n_stop_strings -1");
    gp.n_stop_strings = 0;
    gp.eos_ids = ids;
    gp.n_eos_ids = -2;
    if (s) CHECK_ERR(qsa_generate(s, ids, 4, &gp, &g), QSA_ERR_INVALID_ARGUMENT, "n_eos_ids -2");
    gp.n_eos_ids = 0;
    gp.sampling.penalty_last_n = -5;
    if (s) CHECK_ERR(qsa_generate(s, ids, 4, &gp, &g), QSA_ERR_INVALID_ARGUMENT, "penalty_last_n -5");
    if (s) CHECK(qsa_seq_pos(s) == 4);
    gp.sampling.penalty_last_n = -1; /* the whole history: allowed */
    /* an empty prompt is refused on a sequence that holds tokens too (the first draw needs the prompt's logits),
       with one message, before anything is fed or allocated */
    if (s) CHECK_ERR(qsa_generate(s, ids, 0, &gp, &g), QSA_ERR_INVALID_ARGUMENT, "qsa_generate: n_prompt 0: a prompt of at least one token");
    if (s) CHECK(qsa_seq_pos(s) == 4 && g.n_tokens == 0 && !g.tokens);
    if (s) {
        CHECK_OK(qsa_generate(s, ids, 4, &gp, &g));
        CHECK(g.n_tokens == 2);
        qsa_generation_free(&g);
    }
    qsa_seq_free(s);
    qsa_model_free(m);
}

/* qsa_seq_reset during a capture drops the queries recorded before it: they attended to KV pages the
   reset gave back, and the capture file held them beside the new sequence's pages (its replay then
   disagreed with the capture).  The capture goes on over the sequence fed after the reset. */
TEST(cpu, reset_during_a_capture_drops_the_queries_before_it) {
    qsa_model *m = cpu_fixture("qsa_hc4_ple_sharded");
    if (!m) return;
    qsa_seq *s = NULL;
    CHECK_OK(qsa_seq_create(m, NULL, &s));
    if (!s) { qsa_model_free(m); return; }
    int32_t a[40], b[24];
    for (int i = 0; i < 40; i++) a[i] = (int32_t)((i * 37 + 11) % m->cfg.vocab_size);
    for (int i = 0; i < 24; i++) b[i] = (int32_t)((i * 53 + 5) % m->cfg.vocab_size);
    CHECK_OK(qsa_seq_capture_begin(s, 1));
    CHECK_OK(qsa_seq_feed(s, a, 40, NULL, 0));
    qsa_seq_reset(s);
    CHECK(s->cap && s->cap->n == 0);
    CHECK_OK(qsa_seq_feed(s, b, 24, NULL, 0));
    char path[128];
    snprintf(path, sizeof path, "/tmp/qsa_test_capture_reset_%d.safetensors", (int)getpid());
    CHECK_OK(qsa_seq_capture_end(s, path));
    qsa_replay_report rep;
    memset(&rep, 0, sizeof rep);
    CHECK_OK(qsa_replay_capture(path, QSA_REPLAY_FROZEN_PLAN, &rep));
    CHECKF(rep.n_queries == 24 && rep.n_differ == 0, "%lld queries, %lld differ", (long long)rep.n_queries, (long long)rep.n_differ);
    remove(path);
    qsa_seq_free(s);
    qsa_model_free(m);
}

/* The KV page pool is the model's, shared by its sequences: sequences of one model fed from several
   threads (the header allows it on the CPU backend) took and gave back pages without a lock (a free
   list of 2043 entries for 2048 pages after this test, or one page listed twice; ThreadSanitizer
   reported the race).  Four threads create, feed one token to and free 4000 sequences each (a page
   taken and given back every time); each gets the single-threaded logits and the free list ends whole. */
typedef struct api_thr { qsa_model *m; const float *want; int rounds, bad; } api_thr;
static void api_thr_run(qsa_model *m, float *lg) {
    qsa_seq_params sp;
    memset(&sp, 0, sizeof sp);
    sp.n_ctx = 16;
    qsa_seq *s = NULL;
    memset(lg, 0, sizeof(float) * (size_t)m->cfg.vocab_size);
    if (qsa_seq_create(m, &sp, &s) != QSA_OK) return;
    for (int t = 0; t < 1; t++) {
        int32_t id = (int32_t)((t * 37 + 11) % m->cfg.vocab_size);
        if (qsa_seq_feed(s, &id, 1, lg, 0) != QSA_OK) break;
    }
    qsa_seq_free(s);
}
static void *api_thr_main(void *arg) {
    api_thr *a = (api_thr *)arg;
    float *lg = (float *)malloc(sizeof(float) * (size_t)a->m->cfg.vocab_size);
    for (int r = 0; lg && r < a->rounds; r++) {
        api_thr_run(a->m, lg);
        a->bad += memcmp(lg, a->want, sizeof(float) * (size_t)a->m->cfg.vocab_size) != 0;
    }
    free(lg);
    return NULL;
}
TEST(cpu, sequences_of_one_model_on_several_threads) {
    qsa_model_params mp;
    memset(&mp, 0, sizeof mp);
    mp.backend = QSA_BACKEND_CPU;
    mp.n_threads = 1;
    mp.kv_page_size = 16;
    qsa_model *m = NULL;
    char dir[600];
    snprintf(dir, sizeof dir, "%s/qsa_hc4_ple_sharded", test_path("tests/fixtures"));
    CHECK_OK(qsa_model_load(dir, &mp, &m));
    if (!m) return;
    float *want = (float *)malloc(sizeof(float) * (size_t)m->cfg.vocab_size);
    if (!want) { qsa_model_free(m); return; }
    api_thr_run(m, want);
    enum { NT = 4 };
    api_thr a[NT];
    pthread_t th[NT];
    int started[NT];
    for (int i = 0; i < NT; i++) {
        a[i].m = m; a[i].want = want; a[i].rounds = 4000; a[i].bad = 0;
        started[i] = pthread_create(&th[i], NULL, api_thr_main, &a[i]) == 0;
    }
    int bad = 0;
    for (int i = 0; i < NT; i++) {
        if (started[i]) pthread_join(th[i], NULL);
        bad += a[i].bad;
    }
    CHECKF(bad == 0, "%d runs gave other logits than the single-threaded one", bad);
    const qsa__pool *pl = &m->pool;
    int dup = 0, *seen = (int *)calloc((size_t)pl->n_pages, sizeof(int));
    for (int i = 0; seen && i < pl->n_free && i < pl->n_pages; i++) dup += seen[pl->free_pages[i]]++ > 0;
    CHECKF(pl->n_free == pl->n_pages && dup == 0, "free list: %d entries for %d pages, %d repeated", pl->n_free, pl->n_pages, dup);
    free(seen);
    free(want);
    qsa_model_free(m);
}

/* NULL handles are refused or ignored, never dereferenced (qsa_seq_reset, qsa_seq_pos, the model getters
   and qsa_model_tp_info's out crashed), and a refused qsa_generate or qsa_sampler_create leaves its output
   empty: "free out with qsa_generation_free whatever the result" freed the caller's uninitialised
   pointers when the arguments were refused. */
TEST(cpu, null_handles_and_outputs_of_refused_calls) {
    qsa_seq_reset(NULL);
    CHECK(qsa_seq_pos(NULL) == 0);
    CHECK(qsa_model_get_config(NULL) == NULL && qsa_model_get_tokenizer(NULL) == NULL &&
          qsa_model_get_generation_config(NULL) == NULL);
    qsa_model_tp_info(NULL, NULL);
    qsa_generation g;
    memset(&g, 0xAB, sizeof g);
    int32_t p = 1;
    CHECK_ERR(qsa_generate(NULL, &p, 1, NULL, &g), QSA_ERR_INVALID_ARGUMENT, "qsa_generate");
    CHECK(g.tokens == NULL && g.text == NULL && g.n_tokens == 0);
    qsa_generation_free(&g);
    qsa_sampler *smp = (qsa_sampler *)&g;
    qsa_sampling_params sp;
    memset(&sp, 0, sizeof sp);
    sp.top_k = -1;
    CHECK_ERR(qsa_sampler_create(&sp, &smp), QSA_ERR_INVALID_ARGUMENT, "top_k");
    CHECK(smp == NULL);
}
