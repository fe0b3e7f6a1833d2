/* tests/t_oom.c - out of memory at each host allocation of a call, through test_qsa.c's allocator
 * (tq_fail_at fails the allocation it names, tq_live counts the blocks held).
 *
 * A call that cannot allocate must return QSA_ERR_OUT_OF_MEMORY with a message, hold none of the
 * blocks it took, and leave what existed before it usable: a model that loads after the failures gives
 * the same tokens, a sequence whose generation failed generates the same tokens once reset, and a
 * scheduler serves the next requests exactly.  Models: models/tiny (tokenizer, PLE, HC, both layer
 * kinds), the CPU backend on one thread; the loads, the generation and the scheduler again on the CUDA
 * backend (group gpu), where the host code also uploads, plans batches, captures graphs, and no device
 * memory may be left behind either. */

#define TO_MODEL "models/tiny"
/* Every allocation in the plain build; under AddressSanitizer (ten times slower) every fifth, which
   still puts its checks on each kind of failure path. */
#if defined(__SANITIZE_ADDRESS__)
#define TO_STRIDE 5
#else
#define TO_STRIDE 1
#endif
/* On the GPU (a load ~50 ms even with the kernels cached): every third */
#define TO_GPU_STRIDE 3
static const char *to_which(long stride) { return stride == 1 ? "each" : stride == 3 ? "every third" : "every fifth"; }

static qsa_model *to_load_dir(const char *dir, qsa_backend backend, qsa_result *r) {
    qsa_model_params mp;
    memset(&mp, 0, sizeof mp);
    mp.backend = backend;
    mp.n_threads = backend == QSA_BACKEND_CPU ? 1 : 0;
    qsa_model *m = (qsa_model *)1;
    *r = qsa_model_load(test_path(dir), &mp, &m);
    return m;
}
static qsa_model *to_load(qsa_result *r) { return to_load_dir(TO_MODEL, QSA_BACKEND_CPU, r); }
/* The model in dir (TO_MODEL: the tiny one) on the backend into m, or the test skips (no device; on the CPU
   no models/tiny, which make builds) or fails (a load on the device that fails otherwise) */
#define TO_LOAD_OR_SKIP(dir, backend, m)                                                                    \
    do {                                                                                                    \
        qsa_result r_;                                                                                      \
        (m) = to_load_dir((dir), (backend), &r_);                                                           \
        if (r_ == QSA_ERR_NO_DEVICE || (r_ != QSA_OK && (backend) == QSA_BACKEND_CPU))                      \
            SKIP("%s: %s", (dir), qsa_last_error());                                                        \
        CHECK_OK(r_);                                                                                       \
        if (r_ != QSA_OK) return;                                                                           \
    } while (0)
#define TO_MODEL_OR_SKIP(backend, m) TO_LOAD_OR_SKIP(TO_MODEL, backend, m)

/* The device memory free in the context of m (a model on the CUDA backend), to see that failures leave
   none of it behind; 0 for a model on the CPU.  A leak of a failed load's weights or scratch (MiBs to
   tens of MiBs, over dozens of failures) would show far past TO_DEV_SLACK. */
#define TO_DEV_SLACK ((long long)16 << 20)
static long long to_dev_free(const qsa_model *m) {
#ifndef QSA_NO_CUDA
    size_t fr = 0, tot = 0;
    if (m && m->cuda && qsa__cu.cuCtxSetCurrent(m->cuda->ctx) == 0 && qsa__cu.cuMemGetInfo_v2(&fr, &tot) == 0) return (long long)fr;
#else
    (void)m;
#endif
    return 0;
}
#define TO_DEV_EXPECT(m, before, what)                                                                            \
    CHECKF(llabs(to_dev_free(m) - (before)) <= TO_DEV_SLACK, "%s: device memory free %.1f MiB before, %.1f after", \
           what, (double)(before) / 1048576.0, (double)to_dev_free(m) / 1048576.0)

/* The tokens of a short chat answer: the oracle the failures are compared with. */
static qsa_result to_generate(qsa_seq *s, const int32_t *prompt, int n, qsa_generation *g) {
    qsa_generate_params gp;
    memset(&gp, 0, sizeof gp);
    gp.max_tokens = 3;
    gp.ignore_eos = 1;
    const char *stops[1] = {"\x01never\x01"};
    gp.stop_strings = stops;
    gp.n_stop_strings = 1;
    return qsa_generate(s, prompt, n, &gp, g);
}

/* A check of the failure at allocation k of n (the loops stop at the first: `bad`). */
#define TO_EXPECT(cond, k, n, what)                                                                              \
    CHECKF(cond, "%s, allocation %ld of %ld failed: %s: %s (%ld blocks held)", what, (long)(k), (long)(n),   \
           qsa_result_string(r), qsa_last_error(), tq_live - live0)

/* The tiny model (tokenizer, generation config), NVFP4 experts (hf_quant_config.json) and a sharded
   checkpoint (model.safetensors.index.json), loaded on the backend with every stride-th allocation made
   to fail in turn: QSA_ERR_OUT_OF_MEMORY with a message, no model, no block held.  The allocations are
   counted on a second load (the first on a backend may set up what the process keeps).  dev: a model
   held on the CUDA backend throughout (its context stays, and the device memory is compared in it). */
static void to_sweep_loads(qsa_backend backend, long stride, const qsa_model *dev) {
    static const char *const dirs[3] = {TO_MODEL, "tests/fixtures/nvfp4_experts", "tests/fixtures/qsa_hc4_ple_sharded"};
    for (int d = 0; d < 3; d++) {
        qsa_result r;
        qsa_model *m;
        TO_LOAD_OR_SKIP(dirs[d], backend, m);
        qsa_model_free(m);
        long live0 = tq_live, a0 = tq_allocs;
        m = to_load_dir(dirs[d], backend, &r);
        CHECK_OK(r);
        if (r != QSA_OK) return;
        long n = tq_allocs - a0;
        qsa_model_free(m);
        CHECKF(tq_live == live0, "%s: a load and a free hold %ld blocks", dirs[d], tq_live - live0);
        long long free0 = to_dev_free(dev);
        int bad = 0;
        for (long k = 0; k < n && !bad; k += stride) {
            tq_fail_at = k;
            m = to_load_dir(dirs[d], backend, &r);
            long left = tq_fail_at; /* (-1 once allocation k was made to fail) */
            tq_fail_at = -1;
            if (r == QSA_OK) qsa_model_free(m);
            bad = left >= 0 || r != QSA_ERR_OUT_OF_MEMORY || m != NULL || tq_live != live0 || !qsa_last_error()[0];
            TO_EXPECT(!bad, k, n, dirs[d]);
        }
        if (free0) TO_DEV_EXPECT(dev, free0, dirs[d]);
        printf("    %ld allocations in a load of %s, %s made to fail\n", n, dirs[d], to_which(stride));
    }
}
TEST(cpu, out_of_memory_at_each_allocation_of_a_load) { to_sweep_loads(QSA_BACKEND_CPU, TO_STRIDE, NULL); }

/* A sequence and a short generation on m, every stride-th allocation made to fail in turn */
static void to_sweep_generation(qsa_model *m, long stride) {
    qsa_result r;
    const qsa_tokenizer *tok = qsa_model_get_tokenizer(m);
    qsa_chat_message msg = {"user", "What is a page pool?"};
    char *text = NULL;
    int32_t *ids = NULL;
    size_t np = 0;
    CHECK_OK(qsa_chat_apply_template(tok, &msg, 1, 1, &text));
    CHECK_OK(qsa_tokenize(tok, text, strlen(text), 1, &ids, &np));
    qsa_free(text);
    /* the oracle, then how many allocations a sequence and a generation make, counted on a second one (the
       first makes what the model keeps for later ones: on CUDA the batched step's buffers and its graph) */
    qsa_seq *s = NULL;
    qsa_generation ref, second;
    CHECK_OK(qsa_seq_create(m, NULL, &s));
    CHECK_OK(to_generate(s, ids, (int)np, &ref));
    qsa_seq_free(s);
    s = NULL;
    long a0 = tq_allocs;
    CHECK_OK(qsa_seq_create(m, NULL, &s));
    CHECK_OK(to_generate(s, ids, (int)np, &second));
    long n = tq_allocs - a0;
    qsa_seq_free(s);
    qsa_generation_free(&second);
    long live0 = tq_live;
    long long free0 = to_dev_free(m);
    int bad = 0;
    for (long k = 0; k < n && !bad; k += stride) {
        qsa_generation g;
        memset(&g, 0, sizeof g);
        s = NULL;
        tq_fail_at = k;
        r = qsa_seq_create(m, NULL, &s);
        if (r == QSA_OK) r = to_generate(s, ids, (int)np, &g);
        long left = tq_fail_at; /* (-1 once allocation k was made to fail) */
        tq_fail_at = -1;
        TO_EXPECT(left < 0, k, n, "fewer allocations than counted");
        qsa_generation_free(&g); /* (a failure part-way leaves the tokens generated) */
        int failed = r == QSA_ERR_OUT_OF_MEMORY && qsa_last_error()[0], refused = 1, again_same = 1;
        TO_EXPECT(failed, k, n, "qsa_seq_create + qsa_generate");
        if (s) { /* the sequence that failed: refused while broken, the oracle's tokens once reset */
            if (s->broken) {
                refused = qsa_seq_feed(s, ids, 1, NULL, 0) == QSA_ERR_INVALID_ARGUMENT && strstr(qsa_last_error(), "qsa_seq_reset");
                TO_EXPECT(refused, k, n, "a feed of the broken sequence");
            }
            qsa_seq_reset(s);
            qsa_generation again;
            r = to_generate(s, ids, (int)np, &again);
            again_same = r == QSA_OK && again.n_tokens == ref.n_tokens &&
                         !memcmp(again.tokens, ref.tokens, sizeof(int32_t) * (size_t)ref.n_tokens);
            TO_EXPECT(again_same, k, n, "the same sequence, reset, without the failure");
            qsa_generation_free(&again);
            qsa_seq_free(s);
        }
        TO_EXPECT(tq_live == live0, k, n, "blocks held after the sequence is freed");
        bad = left >= 0 || !failed || !refused || !again_same || tq_live != live0;
    }
    if (free0) TO_DEV_EXPECT(m, free0, "sequences and generations that failed");
    printf("    %ld allocations in a sequence and a generation, %s made to fail\n", n, to_which(stride));
    qsa_generation_free(&ref);
    qsa_free(ids);
}
TEST(cpu, out_of_memory_at_each_allocation_of_a_generation) {
    qsa_model *m;
    TO_MODEL_OR_SKIP(QSA_BACKEND_CPU, m);
    to_sweep_generation(m, TO_STRIDE);
    qsa_model_free(m);
}

/* Two scheduler requests on m, one on a sequence of the caller's, every stride-th allocation made to fail
   in turn */
static void to_sweep_sched(qsa_model *m, long stride) {
    qsa_result r;
    qsa_request_params rp[2];
    memset(rp, 0, sizeof rp);
    rp[0].text = "Two requests share";
    rp[0].chat = 1;
    rp[1].text = "one batch";
    for (int i = 0; i < 2; i++) {
        rp[i].max_tokens = 3;
        rp[i].ignore_eos = 1;
        rp[i].sampling.temperature = 0.7f;
        rp[i].sampling.seed = 11u + (unsigned)i;
    }
    /* request 1 runs on a sequence of the caller's (made before the failures, freed after them) */
    qsa_seq *own = NULL;
    CHECK_OK(qsa_seq_create(m, NULL, &own));
    if (!own) return;
    rp[1].seq = own;
    long live0 = tq_live;
    /* k = -1: the oracle, both requests without failures; then allocation k fails during the calls,
       after which the scheduler runs on without failures: each request that was taken ends as the
       oracle's, or in QSA_REQ_ERROR with QSA_ERR_OUT_OF_MEMORY; the caller's sequence then holds the
       prompt and the tokens fed, or refuses feeds until reset */
    int32_t want[2][3];
    int nwant[2] = {0, 0};
    long n = 0;
    long long free0 = 0;
    for (long k = -1; k < n; k = k < 0 ? 0 : k + stride) {
        long a0 = tq_allocs;
        qsa_sched *s = NULL;
        int64_t id[2] = {0, 0};
        qsa_seq_reset(own);
        tq_fail_at = k;
        r = qsa_sched_create(m, NULL, &s);
        for (int i = 0; i < 2 && r == QSA_OK; i++) r = qsa_sched_submit(s, &rp[i], &id[i]);
        if (r == QSA_OK) r = qsa_sched_run(s);
        tq_fail_at = -1;
        if (k < 0) n = tq_allocs - a0;
        int failed = r != QSA_OK;
        if (failed) CHECKF(r == QSA_ERR_OUT_OF_MEMORY && qsa_last_error()[0], "allocation %ld: %s: %s", k, qsa_result_string(r), qsa_last_error());
        if (s) CHECKF(qsa_sched_run(s) == QSA_OK, "allocation %ld: the run after it: %s", k, qsa_last_error());
        for (int i = 0; i < 2 && s; i++) {
            qsa_request_result res;
            if (!id[i]) continue; /* its submit failed: no record */
            CHECK_OK(qsa_sched_poll(s, id[i], &res));
            if (k < 0) {
                CHECK(res.status == QSA_REQ_DONE && res.n_tokens == 3);
                nwant[i] = res.n_tokens;
                memcpy(want[i], res.tokens, sizeof(int32_t) * (size_t)res.n_tokens);
            } else if (res.status == QSA_REQ_ERROR) {
                failed = 1;
                CHECKF(res.error == QSA_ERR_OUT_OF_MEMORY && res.message[0], "request %d, allocation %ld: %s", i, k, res.message);
                if (i == 1 && own->broken)
                    CHECK_ERR(qsa_seq_feed(own, want[1], 1, NULL, 0), QSA_ERR_INVALID_ARGUMENT, "qsa_seq_reset");
            } else {
                int same = res.status == QSA_REQ_DONE && res.n_tokens == nwant[i] &&
                           !memcmp(res.tokens, want[i], sizeof(int32_t) * (size_t)nwant[i]);
                CHECKF(same, "request %d, allocation %ld: %s, %d tokens", i, k, qsa_request_status_string(res.status), res.n_tokens);
            }
            if (i == 1 && res.status == QSA_REQ_DONE) /* the prompt and every generated token but the last */
                CHECKF(qsa_seq_pos(own) == res.n_prompt_fed + res.n_tokens - 1 && !own->broken, "allocation %ld: the caller's "
                       "sequence at %d after %d prompt tokens and %d generated", k, qsa_seq_pos(own), res.n_prompt_fed, res.n_tokens);
        }
        if (k >= 0) CHECKF(failed, "allocation %ld of %ld failed and nothing said so", k, n);
        qsa_sched_free(s);
        CHECKF(tq_live == live0, "allocation %ld: %ld blocks held after qsa_sched_free", k, tq_live - live0);
        if (k < 0) free0 = to_dev_free(m);
        if (T_.failed) break;
    }
    if (free0) TO_DEV_EXPECT(m, free0, "scheduler runs that failed");
    printf("    %ld allocations in two requests through the scheduler, %s made to fail\n", n, to_which(stride));
    qsa_seq_free(own);
}
TEST(cpu, out_of_memory_at_each_allocation_of_the_scheduler) {
    qsa_model *m;
    TO_MODEL_OR_SKIP(QSA_BACKEND_CPU, m);
    to_sweep_sched(m, TO_STRIDE);
    qsa_model_free(m);
}

/* The sampler's first call at temperature > 0 allocates its work buffers: each allocation made to fail in turn, with
   top-k (a heap) and without (every id sorted), the call gives -1 and the logits as they came (the repetition penalty
   not yet applied); the next call samples as a fresh sampler of the same seed does.  Later calls allocate nothing,
   however long the history grows (the penalty's ids live in the first call's buffers). */
TEST(cpu, out_of_memory_in_the_sampler) {
    enum { V = 64, NH = 300 };
    float base[V], l[V], l2[V];
    for (int i = 0; i < V; i++) base[i] = (float)((i * 37) % V) / 8.0f;
    int32_t hist[NH];
    for (int i = 0; i < NH; i++) hist[i] = (i * 7) % (V + 3); /* (some past the vocabulary) */
    for (int topk = 0; topk <= 20; topk += 20) {
        int fails = 0;
        for (int at = 0; at < 8; at++) {
            qsa_sampling_params p;
            memset(&p, 0, sizeof p);
            p.temperature = 0.8f;
            p.top_k = topk;
            p.top_p = 0.9f;
            p.repetition_penalty = 1.5f;
            p.penalty_last_n = -1;
            p.seed = 3;
            qsa_sampler *a = NULL, *b = NULL;
            CHECK_OK(qsa_sampler_create(&p, &a));
            CHECK_OK(qsa_sampler_create(&p, &b));
            if (!a || !b) { qsa_sampler_free(a); qsa_sampler_free(b); return; }
            memcpy(l, base, sizeof l);
            tq_fail_at = at;
            int32_t t = qsa_sampler_sample(a, l, V, hist, 3);
            int failed = tq_fail_at < 0; /* (the allocation `at` came and failed) */
            tq_fail_at = -1;
            memcpy(l2, base, sizeof l2);
            if (failed) {
                fails++;
                CHECKF(t == -1 && strstr(qsa_last_error(), "out of memory") && !memcmp(l, base, sizeof l),
                       "top-k %d, allocation %d refused: %d (%s)", topk, at, t, qsa_last_error());
                memcpy(l, base, sizeof l);
                CHECK(qsa_sampler_sample(a, l, V, hist, 3) == qsa_sampler_sample(b, l2, V, hist, 3));
            } else {
                CHECK(t == qsa_sampler_sample(b, l2, V, hist, 3));
            }
            /* the history grows: nothing more to allocate */
            long before = tq_allocs;
            for (int n = 4; n <= NH; n += 37) {
                memcpy(l, base, sizeof l);
                memcpy(l2, base, sizeof l2);
                CHECK(qsa_sampler_sample(a, l, V, hist, n) == qsa_sampler_sample(b, l2, V, hist, n));
            }
            CHECKF(tq_allocs == before, "top-k %d: %ld allocations as the history grew", topk, tq_allocs - before);
            qsa_sampler_free(a);
            qsa_sampler_free(b);
            if (!failed) break;
        }
        CHECKF(fails == (topk ? 2 : 3), "top-k %d: %d allocations of a first call", topk, fails);
    }
}

/* The real Qwen3 tokenizer (151,669 ids; skipped without it): its load, then encoding and decoding a
   chat prompt with special tokens, non-ASCII text and a streaming decoder. */
TEST(cpu, out_of_memory_at_each_allocation_of_the_tokenizer) {
    const char *path = tok_real_path("QSA_QWEN3_TOKENIZER", "../shared/data/qwen3-tokenizer/tokenizer.json");
    if (!path || !qsa__file_exists(path)) SKIP("no Qwen3 tokenizer.json (QSA_QWEN3_TOKENIZER)");
    long live0 = tq_live, a0 = tq_allocs;
    qsa_tokenizer *t = NULL;
    CHECK_OK(qsa_tokenizer_load(path, &t));
    if (!t) return;
    long n = tq_allocs - a0;
    qsa_tokenizer_free(t);
    int bad = 0;
    for (long k = 0; k < n && !bad; k += TO_STRIDE) {
        qsa_tokenizer *f = (qsa_tokenizer *)1;
        tq_fail_at = k;
        qsa_result r = qsa_tokenizer_load(path, &f);
        tq_fail_at = -1;
        if (r == QSA_OK) qsa_tokenizer_free(f);
        bad = r != QSA_ERR_OUT_OF_MEMORY || f != NULL || tq_live != live0 || !qsa_last_error()[0];
        TO_EXPECT(!bad, k, n, "qsa_tokenizer_load");
    }
    printf("    %ld allocations in a load of the Qwen3 tokenizer, %s made to fail\n", n, to_which(TO_STRIDE));
    CHECK_OK(qsa_tokenizer_load(path, &t));
    if (!t) return;
    /* encode a conversation and decode it back, in one piece and streamed */
    qsa_chat_message msgs[2] = {{"system", "Réponds en français. 你好!"}, {"user", "What is 2+2? <|im_end|> stays text"}};
    live0 = tq_live;
    long m = 0;
    for (long k = -1; k < m && !bad; k = k < 0 ? 0 : k + TO_STRIDE) {
        a0 = tq_allocs;
        tq_fail_at = k;
        char *text = NULL, *back = NULL;
        int32_t *ids = NULL;
        size_t nids = 0, nback = 0;
        qsa_result r = qsa_chat_apply_template(t, msgs, 2, 1, &text);
        if (r == QSA_OK) r = qsa_tokenize(t, text, strlen(text), 1, &ids, &nids);
        if (r == QSA_OK) r = qsa_detokenize(t, ids, nids, 0, &back, &nback);
        qsa_detok_stream ds;
        qsa_detok_stream_init(&ds, t, 0);
        qsa__buf streamed;
        memset(&streamed, 0, sizeof streamed);
        for (size_t i = 0; r == QSA_OK && i <= nids; i++) {
            const char *piece;
            size_t plen;
            r = i < nids ? qsa_detok_stream_push(&ds, ids[i], &piece, &plen) : qsa_detok_stream_flush(&ds, &piece, &plen);
            if (r == QSA_OK && !qsa__buf_put(&streamed, piece, plen)) r = QSA_ERR_OUT_OF_MEMORY;
        }
        qsa_detok_stream_free(&ds);
        tq_fail_at = -1;
        if (k < 0) {
            m = tq_allocs - a0;
            CHECK(r == QSA_OK && nback == strlen(text) && !memcmp(back, text, nback) && streamed.len == nback &&
                  !memcmp(streamed.data, text, nback));
        } else {
            bad = r != QSA_ERR_OUT_OF_MEMORY || !qsa_last_error()[0];
            TO_EXPECT(!bad, k, m, "template, tokenize, detokenize, stream");
        }
        qsa__buf_free(&streamed);
        qsa_free(back);
        qsa_free(ids);
        qsa_free(text);
        TO_EXPECT(tq_live == live0, k, m, "blocks held after the texts are freed");
        bad |= tq_live != live0;
    }
    printf("    %ld allocations in a chat prompt's template, encoding and decoding, %s made to fail\n", m, to_which(TO_STRIDE));
    qsa_tokenizer_free(t);
}

#ifndef QSA_NO_CUDA
/* The same on the CUDA backend: the load's host side now also builds the device tables, uploads and sets up
   the scratch; a generation's also plans its launches, the scheduler's batched steps capture and replay
   graphs.  Each failure also leaves the device memory as it was.  The model for the generation and the
   scheduler is loaded once (their graphs captured by the oracle's run); ref holds the context during the
   loads. */
TEST(gpu, out_of_memory_at_each_host_allocation_of_a_cuda_load) {
    qsa_model *ref;
    TO_MODEL_OR_SKIP(QSA_BACKEND_CUDA, ref);
    to_sweep_loads(QSA_BACKEND_CUDA, TO_GPU_STRIDE, ref);
    qsa_model_free(ref);
}
TEST(gpu, out_of_memory_at_each_host_allocation_of_a_cuda_generation) {
    qsa_model *m;
    TO_MODEL_OR_SKIP(QSA_BACKEND_CUDA, m);
    to_sweep_generation(m, TO_GPU_STRIDE);
    to_sweep_sched(m, TO_GPU_STRIDE);
    qsa_model_free(m);
}
#endif

#ifndef QSA_NO_CUDA
/* Device memory, not host memory, running out at the first batched step: two sequences hold their prompts,
   then the test takes all that cuMemAlloc still gives, and qsa_seq_feed_batch feeds both a token.  The
   step must not cost the sequences their contexts: it is served (one at a time: the chunked forward) or refused
   with QSA_ERR_OUT_OF_MEMORY, both sequences unbroken either way and where the step left them.  Once the memory
   is back, two more steps give the logits of sequences that never met the failure, bit for bit.  (Before the
   fix every sequence of the group was left broken, and the next step was refused.) */
TEST(gpu, device_out_of_memory_at_the_first_batched_step) {
    qsa_model *m;
    TO_MODEL_OR_SKIP(QSA_BACKEND_CUDA, m);
    int V = m->cfg.vocab_size, H = m->cfg.hidden_size;
    int32_t prompt[2][6], tok[3][2];
    for (int i = 0; i < 2; i++) {
        for (int k = 0; k < 6; k++) prompt[i][k] = (int32_t)((k * 37 + 11 + 5 * i) % V);
        for (int k = 0; k < 3; k++) tok[k][i] = (int32_t)((k * 53 + 7 + 3 * i) % V);
    }
    float *lg = (float *)malloc(sizeof(float) * 2 * (size_t)V * 3), *ref = (float *)malloc(sizeof(float) * 2 * (size_t)V * 3),
          *hid = (float *)malloc(sizeof(float) * (size_t)H);
    qsa_seq *s[2] = {NULL, NULL}, *o[2] = {NULL, NULL}, *warm = NULL;
    CUdeviceptr hog[4096];
    int nh = 0;
    if (!lg || !ref || !hid) { CHECK(0); goto out; }
    for (int i = 0; i < 2; i++) {
        CHECK_OK(qsa_seq_create(m, NULL, &s[i]));
        if (s[i]) CHECK_OK(qsa_seq_feed(s[i], prompt[i], 6, NULL, 0));
    }
    /* the chunked forward of one token once (the kernels a decode launches loaded), without the batched
       step: a sequence with hidden_out set is not batchable */
    CHECK_OK(qsa_seq_create(m, NULL, &warm));
    if (warm) {
        warm->hidden_out = hid;
        CHECK_OK(qsa_seq_feed(warm, prompt[0], 1, lg, 0));
        warm->hidden_out = NULL;
    }
    if (T_.failed) goto out;
    if (m->cuda->batch) {
        T_.skipped = 1;
        printf("  SKIP the batched step's buffers were made before the step\n");
        goto out;
    }
    /* fill the device (down to pieces of 64 KiB: the batched step's buffers of this small model, the column
       slices' output made at load, would fit in more) */
    qsa__cu.cuCtxSetCurrent(m->cuda->ctx);
    for (size_t sz = (size_t)1 << 36; sz >= ((size_t)1 << 16) && nh < 4096;)
        if (qsa__cu.cuMemAlloc_v2(&hog[nh], sz) == 0) nh++;
        else sz /= 2;
    int pos0[2] = {qsa_seq_pos(s[0]), qsa_seq_pos(s[1])};
    qsa_result r = qsa_seq_feed_batch(s, tok[0], 2, lg);
    int made = m->cuda->batch != NULL;
    while (nh > 0) qsa__cu.cuMemFree_v2(hog[--nh]);
    if (made) {
        T_.skipped = 1;
        printf("  SKIP the batched step's buffers fitted in what the device had left\n");
        goto out;
    }
    for (int i = 0; i < 2; i++)
        CHECKF(!s[i]->broken && qsa_seq_pos(s[i]) == pos0[i] + (r == QSA_OK), "sequence %d after the step (%s: %s): broken %d, at "
               "%d (was %d)", i, qsa_result_string(r), qsa_last_error(), s[i]->broken, qsa_seq_pos(s[i]), pos0[i]);
    CHECKF(r == QSA_OK || (r == QSA_ERR_OUT_OF_MEMORY && qsa_last_error()[0]), "the step: %s (%s)", qsa_result_string(r),
           qsa_last_error());
    if (T_.failed) goto out;
    int from = r == QSA_OK; /* the steps still to feed (the first, if it was refused) */
    for (int k = from; k < 3; k++) CHECK_OK(qsa_seq_feed_batch(s, tok[k], 2, lg + (size_t)k * 2 * V));
    /* the oracle: two sequences that never met the failure */
    for (int i = 0; i < 2; i++) {
        CHECK_OK(qsa_seq_create(m, NULL, &o[i]));
        if (o[i]) CHECK_OK(qsa_seq_feed(o[i], prompt[i], 6, NULL, 0));
    }
    for (int k = 0; k < 3 && !T_.failed; k++) CHECK_OK(qsa_seq_feed_batch(o, tok[k], 2, ref + (size_t)k * 2 * V));
    CHECKF(!T_.failed && !memcmp(lg, ref, sizeof(float) * 2 * (size_t)V * 3), "the steps' logits differ from the oracle's");
out:
    while (nh > 0) qsa__cu.cuMemFree_v2(hog[--nh]);
    for (int i = 0; i < 2; i++) { qsa_seq_free(s[i]); qsa_seq_free(o[i]); }
    qsa_seq_free(warm);
    free(lg);
    free(ref);
    free(hid);
    qsa_model_free(m);
}
#endif

#ifndef QSA_NO_CUDA
/* Device memory running out at a chunk's first column-sliced GEMV (the real shape's lm_head for 2-16 rows of
   logits; here every dense GEMV of the tiny model, its scratch limit lowered as gpu/gemv_column_slices_equal_whole
   does): a sequence holding a prompt is fed 6 more tokens with every token's logits while the device holds but
   TO_ROOM free.  The slices' output must not be made there (before the fix: at the first slice, after the chunk's
   earlier launches, its failure leaving the sequence broken): the feed succeeds with the logits of the
   default limit, or fails with QSA_ERR_OUT_OF_MEMORY and the sequence unbroken where it was. */
#define TO_ROOM ((size_t)12 << 20)
TEST(gpu, device_out_of_memory_at_a_chunks_first_sliced_gemv) {
    qsa_model *m;
    TO_MODEL_OR_SKIP(QSA_BACKEND_CUDA, m);
    int V = m->cfg.vocab_size;
    int32_t p[8], q[6];
    for (int k = 0; k < 8; k++) p[k] = (int32_t)((k * 37 + 11) % V);
    for (int k = 0; k < 6; k++) q[k] = (int32_t)((k * 53 + 7) % V);
    float *lg = (float *)malloc(sizeof(float) * 6 * (size_t)V), *ref = (float *)malloc(sizeof(float) * 6 * (size_t)V);
    qsa_seq *s = NULL, *o = NULL;
    CUdeviceptr hog[4096];
    int nh = 0;
    size_t keep = m->cuda->sc.gemv_limit;
    if (!lg || !ref) { CHECK(0); goto out; }
    CHECK_OK(qsa_seq_create(m, NULL, &s));
    CHECK_OK(qsa_seq_create(m, NULL, &o));
    if (T_.failed) goto out;
    CHECK_OK(qsa_seq_feed(s, p, 8, NULL, 0));
    CHECK_OK(qsa_seq_feed(o, p, 8, NULL, 0));
    CHECK_OK(qsa_seq_feed(o, q, 6, ref, 1)); /* the oracle at the default limit (the same bits: column slices) */
    if (T_.failed) goto out;
    long long sliced = m->cuda->sc.n_sliced;
    m->cuda->sc.gemv_limit = 4096;
    qsa__cu.cuCtxSetCurrent(m->cuda->ctx);
    for (size_t sz = (size_t)1 << 36; sz >= ((size_t)1 << 20) && nh < 4096;)
        if (qsa__cu.cuMemAlloc_v2(&hog[nh], sz) == 0) nh++;
        else sz /= 2;
    while (nh > 0 && to_dev_free(m) < (long long)TO_ROOM) qsa__cu.cuMemFree_v2(hog[--nh]);
    qsa_result r = qsa_seq_feed(s, q, 6, lg, 1);
    while (nh > 0) qsa__cu.cuMemFree_v2(hog[--nh]);
    m->cuda->sc.gemv_limit = keep;
    CHECKF(!s->broken && qsa_seq_pos(s) == 8 + (r == QSA_OK ? 6 : 0), "after the feed (%s: %s): broken %d, at %d",
           qsa_result_string(r), qsa_last_error(), s->broken, qsa_seq_pos(s));
    CHECKF(r == QSA_OK || (r == QSA_ERR_OUT_OF_MEMORY && qsa_last_error()[0]), "the feed: %s (%s)", qsa_result_string(r),
           qsa_last_error());
    if (r == QSA_OK) {
        CHECKF(m->cuda->sc.n_sliced > sliced, "no GEMV was sliced under the lowered limit");
        CHECKF(!memcmp(lg, ref, sizeof(float) * 6 * (size_t)V), "the sliced feed's logits differ from the default limit's");
    }
out:
    while (nh > 0) qsa__cu.cuMemFree_v2(hog[--nh]);
    m->cuda->sc.gemv_limit = keep;
    qsa_seq_free(s);
    qsa_seq_free(o);
    free(lg);
    free(ref);
    qsa_model_free(m);
}
#endif

/* Capture and replay of a QSA layer (tests/t_planner.c has the same flow without failures), and a
   prefill through the chunked GDN form: each allocation made to fail gives QSA_ERR_OUT_OF_MEMORY,
   no file is left half-written under the capture's name, and nothing is held after. */
TEST(cpu, out_of_memory_at_each_allocation_of_a_capture_and_replay) {
    qsa_model_params mp;
    memset(&mp, 0, sizeof mp);
    mp.backend = QSA_BACKEND_CPU;
    mp.n_threads = 1;
    mp.kv_page_size = 16;
    mp.gdn_chunked_prefill = 1;
    mp.gdn_chunk_size = 16;
    qsa_model *m = NULL;
    CHECK_OK(qsa_model_load(test_path("tests/fixtures/qsa_hc4_ple_sharded"), &mp, &m));
    if (!m) return;
    int32_t ids[40];
    for (int i = 0; i < 40; i++) ids[i] = (int32_t)((i * 37 + 11) % m->cfg.vocab_size);
    char path[128];
    snprintf(path, sizeof path, "/tmp/qsa_test_oom_capture_%d.safetensors", (int)getpid());
    long live0 = tq_live, n = 0;
    int bad = 0;
    for (long k = -1; k < n && !bad; k = k < 0 ? 0 : k + TO_STRIDE) {
        long a0 = tq_allocs;
        remove(path);
        qsa_seq *s = NULL;
        qsa_replay_report rep;
        memset(&rep, 0, sizeof rep);
        tq_fail_at = k;
        int stage = 0; /* calls that succeeded */
        qsa_result r = qsa_seq_create(m, NULL, &s);
        if (r == QSA_OK && ++stage) r = qsa_seq_capture_begin(s, 1);
        if (r == QSA_OK && ++stage) r = qsa_seq_feed(s, ids, 40, NULL, 0);
        if (r == QSA_OK && ++stage) r = qsa_seq_capture_end(s, path);
        if (r == QSA_OK && ++stage) r = qsa_replay_capture(path, QSA_REPLAY_PLANNER, &rep);
        tq_fail_at = -1;
        if (r != QSA_OK && stage <= 3) {
            bad = qsa__file_exists(path);
            TO_EXPECT(!bad, k, n, "a capture file left by a failed capture");
        }
        int left = bad;
        if (k < 0) {
            n = tq_allocs - a0;
            CHECK(r == QSA_OK && rep.n_queries == 40 && rep.n_differ == 0);
        } else {
            bad = r != QSA_ERR_OUT_OF_MEMORY || !qsa_last_error()[0];
            TO_EXPECT(!bad, k, n, "capture, chunked prefill, replay");
            bad |= left;
        }
        qsa_seq_free(s);
        TO_EXPECT(tq_live == live0, k, n, "blocks held after the sequence is freed");
        bad |= tq_live != live0;
    }
    printf("    %ld allocations in a captured chunked prefill and its replay, %s made to fail\n", n, to_which(TO_STRIDE));
    remove(path);
    qsa_model_free(m);
}

#ifndef QSA_NO_CUDA
/* The kernel cache's read (qsa__cache_read): a hit gives the image written; each host allocation of the
   read made to fail (the mapping's path, the image's copy) gives QSA_ERR_OUT_OF_MEMORY with a message and
   no image, never a miss (a miss compiles every kernel again); an absent file is a miss. */
TEST(cpu, out_of_memory_at_each_allocation_of_a_kernel_cache_read) {
    char path[256];
    snprintf(path, sizeof path, "/tmp/qsa_test_oom_cache_%d.ptx", (int)getpid());
    static const char image[] = "// a module's image";
    const uint64_t key = 0x1234abcdull;
    qsa__cache_write(path, key, image, sizeof image - 1);
    char *img = NULL;
    size_t len = 0;
    long a0 = tq_allocs, live0 = tq_live;
    qsa_result r = qsa__cache_read(path, key, &img, &len);
    long n = tq_allocs - a0;
    CHECK(r == QSA_OK && img && len == sizeof image - 1 && !memcmp(img, image, len));
    qsa_free(img);
    CHECKF(n >= 2, "%ld allocations in a cache read (the path's copy, the image's)", n);
    int bad = 0;
    for (long k = 0; k < n && !bad; k++) {
        img = NULL;
        tq_fail_at = k;
        r = qsa__cache_read(path, key, &img, &len);
        tq_fail_at = -1;
        bad = r != QSA_ERR_OUT_OF_MEMORY || img != NULL || !qsa_last_error()[0] || tq_live != live0;
        TO_EXPECT(!bad, k, n, "qsa__cache_read");
        qsa_free(img);
    }
    remove(path);
    img = (char *)1;
    r = qsa__cache_read(path, key, &img, &len);
    CHECKF(r == QSA_OK && img == NULL, "an absent cache file: %s, image %p", qsa_result_string(r), (void *)img);
    printf("    %ld allocations in a kernel cache read, each made to fail\n", n);
}

/* The CUDA upload's host side (tests/t_tp.c's driver entries: device memory in host memory), the tiny
   model from its file through a pinned stage of 1,000-value pieces: each host allocation made to fail
   gives QSA_ERR_OUT_OF_MEMORY, with every copy it queued run before it returns (a copy still queued
   would read a freed stage on a GPU), no pinned buffer left and no block held once the caller has
   freed the backend's tables. */
TEST(cpu, out_of_memory_at_each_allocation_of_an_upload) {
    qsa_result r;
    qsa_model *m = to_load(&r);
    if (r != QSA_OK) SKIP("%s: %s (built by make)", TO_MODEL, qsa_last_error());
    qsa__cuda_api saved;
    if (!fd_install(&saved)) { CHECK(0); qsa_model_free(m); return; }
    long live0 = tq_live, n = 0;
    int bad = 0;
    for (long k = -1; k < n && !bad; k = k < 0 ? 0 : k + TO_STRIDE) {
        qsa__cuda g;
        memset(&g, 0, sizeof g);
        g.host_threads = 2;
        g.upload_piece = 1000;
        memset(fd_mem, 0, fd_used);
        memset(fd_wmem, 0, fd_used);
        fd_used = 0;
        fd_launches = 0;
        fd_pinned = 1;
        fd_hosts = fd_queued = fd_ran = fd_overflow = fd_raced = fd_unwritten = 0;
        long a0 = tq_allocs;
        tq_fail_at = k;
        r = qsa__cuda_upload(m, &g);
        tq_fail_at = -1;
        int drained = fd_ran == fd_queued;
        fd_run_to(fd_queued);
        if (k < 0) {
            n = tq_allocs - a0;
            CHECK(r == QSA_OK);
        } else {
            bad = r != QSA_ERR_OUT_OF_MEMORY || !qsa_last_error()[0];
            TO_EXPECT(!bad, k, n, "qsa__cuda_upload");
            TO_EXPECT(drained, k, n, "copies still queued when the upload returned");
            bad |= !drained;
        }
        TO_EXPECT(fd_hosts == 0 && !g.stage[0] && !g.stage_cap, k, n, "pinned stage left");
        bad |= fd_hosts != 0 || g.stage[0] || g.stage_cap;
        qsa__free(g.allocs);
        qsa__free(g.layers);
        TO_EXPECT(tq_live == live0, k, n, "blocks held after the backend's tables are freed");
        bad |= tq_live != live0;
    }
    printf("    %ld allocations in an upload of %s, %s made to fail\n", n, TO_MODEL, to_which(TO_STRIDE));
    fd_remove(&saved);
    qsa_model_free(m);
}
#endif

#ifndef QSA_NO_CUDA
/* A tensor-parallel rank's view of a model bound from its file (every fixture with PLE, HC, QSA and
   GDN layers split two ways; slices of file-bound matrices are converted here): each allocation made
   to fail gives QSA_ERR_OUT_OF_MEMORY, and once the caller frees what the view owns, nothing is held. */
TEST(cpu, out_of_memory_at_each_allocation_of_a_tp_view) {
    qsa_model *m = tp_host_model(test_path("tests/fixtures/qsa_hc4_ple_sharded"), 0);
    if (!m) return;
    CHECK_OK(qsa_tp_check(&m->cfg, 2));
    long live0 = tq_live, n = 0;
    int bad = 0;
    for (int rank = 0; rank < 2 && !bad; rank++) {
        for (long k = -1; k < n && !bad; k = k < 0 ? 0 : k + TO_STRIDE) {
            qsa_model v;
            qsa__tp_own copies, keep;
            memset(&copies, 0, sizeof copies);
            memset(&keep, 0, sizeof keep);
            long a0 = tq_allocs;
            tq_fail_at = k;
            qsa_result r = qsa__tp_view(m, 2, rank, &copies, &keep, &v);
            tq_fail_at = -1;
            if (k < 0) {
                n = tq_allocs - a0;
                CHECK(r == QSA_OK);
            } else {
                bad = r != QSA_ERR_OUT_OF_MEMORY || !qsa_last_error()[0];
                TO_EXPECT(!bad, k, n, rank ? "qsa__tp_view, rank 1" : "qsa__tp_view, rank 0");
            }
            qsa__tp_own_free(&copies);
            qsa__tp_own_free(&keep);
            TO_EXPECT(tq_live == live0, k, n, "blocks held after the view's own arrays are freed");
            bad |= tq_live != live0;
        }
        printf("    rank %d: %ld allocations in its view, %s made to fail\n", rank, n, to_which(TO_STRIDE));
        n = 0;
    }
    qsa_model_free(m);
}
#endif
