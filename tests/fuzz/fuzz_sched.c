/* fuzz_sched.c - libFuzzer harness for the request scheduler: the input is a program of calls.
 *
 *   clang -g -O1 -fsanitize=fuzzer,address,undefined -o fuzz_sched tests/fuzz/fuzz_sched.c -lm -ldl -lpthread
 *   ./fuzz_sched -max_total_time=60 corpus/
 *
 * Run from the repository root: the model is models/tiny (built by `make`; it has a tokenizer), loaded
 * twice on the CPU backend, once with a KV pool of ten 16-token pages (the scheduler's) and once
 * unconstrained (the oracle's).  The input's bytes are read as a sequence of calls: submit (a prompt of
 * ids, some past the vocabulary, or of raw text, chat text or two messages; the context, token limit,
 * sampling, seed, stop strings and EOS handling from the next bytes; a streaming callback that may
 * stop its request or cancel one; a fresh sequence of the caller's to run on), cancel, release, poll
 * and step, with the scheduler's invariants checked after each call.  Then every
 * request runs to its end and each one that finished normally must equal the same request through
 * qsa_generate on a fresh sequence of the oracle model, token for token and byte for byte: whatever
 * ran beside it, whichever pages it got, however it was cancelled around; a caller's sequence then
 * holds its prompt and the tokens fed.  At the end, with every record released, the pool must be whole. */
#define QSA_RUNTIME_IMPLEMENTATION
#include "../../qsa_runtime.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FZ_ASSERT(c) do { if (!(c)) { fprintf(stderr, "invariant failed: %s (line %d): %s\n", #c, __LINE__, qsa_last_error()); abort(); } } while (0)

static qsa_model *fz_m, *fz_ref;
static int fz_vocab;
static int fz_verbose; /* $QSA_FUZZ_VERBOSE: each input's requests and how they ended, on stderr */

static qsa_model *fz_load(int page_size, int pool_tokens) {
    qsa_model_params mp;
    memset(&mp, 0, sizeof mp);
    mp.backend = QSA_BACKEND_CPU;
    mp.n_threads = 1;
    mp.kv_page_size = page_size;
    mp.kv_pool_tokens = pool_tokens;
    qsa_model *m = NULL;
    if (qsa_model_load("models/tiny", &mp, &m) != QSA_OK) {
        fprintf(stderr, "fuzz_sched: models/tiny: %s (run `make` in the repository root first)\n", qsa_last_error());
        abort();
    }
    return m;
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc; (void)argv;
    fz_m = fz_load(16, 160);
    fz_ref = fz_load(0, 0);
    fz_vocab = qsa_model_get_config(fz_m)->vocab_size;
    fz_verbose = getenv("QSA_FUZZ_VERBOSE") != NULL;
    return 0;
}

/* The input as a stream of bytes (zeros once it is used up). */
typedef struct { const uint8_t *p; size_t n, at; } fz_in;
static unsigned fz_b(fz_in *in) { return in->at < in->n ? in->p[in->at++] : 0u; }

/* One request as submitted, kept to replay it through qsa_generate. */
#define FZ_MAXREQ ((int)(sizeof fz_reqs / sizeof fz_reqs[0]))
typedef struct {
    int64_t id;
    int released;
    int32_t ids[48];
    int n_ids;
    int kind;                  /* 0 ids, 1 text, 2 chat text, 3 messages */
    char text[40], text2[24];
    qsa_chat_message msgs[2];
    char stop[2][4];
    const char *stops[2];
    int32_t eos[2];
    qsa_request_params rp;
    int cb_stop_after;         /* the callback asks to stop on this call (0: never) */
    int cb_calls;
    qsa_sched *sched;          /* the callback's first call cancels request cancel_target there (-1: none) */
    int cancel_target;
    qsa_seq *own;              /* a sequence of the caller's the request runs on, or NULL */
    qsa__buf streamed;         /* what the callback received */
} fz_req;

static fz_req fz_reqs[8];
static int fz_nreq;

static int fz_on_token(void *user, int32_t token, const char *text, size_t len) {
    fz_req *q = (fz_req *)user;
    FZ_ASSERT(token >= -1 && token < fz_vocab);
    FZ_ASSERT(qsa__buf_put(&q->streamed, text, len));
    if (q->cb_calls == 0 && q->cancel_target >= 0 && q->cancel_target < fz_nreq && !fz_reqs[q->cancel_target].released) {
        qsa_result r = qsa_sched_cancel(q->sched, fz_reqs[q->cancel_target].id); /* callbacks may cancel, themselves too */
        FZ_ASSERT(r == QSA_OK);
    }
    return ++q->cb_calls == q->cb_stop_after;
}

static void fz_fill(fz_req *q, fz_in *in, qsa_sched *s) {
    memset(q, 0, sizeof *q);
    q->sched = s;
    q->cancel_target = -1;
    q->kind = (int)(fz_b(in) % 4);
    qsa_request_params *rp = &q->rp;
    if (q->kind == 0) {
        q->n_ids = (int)(fz_b(in) % 49);
        for (int i = 0; i < q->n_ids; i++) {
            unsigned v = fz_b(in) | fz_b(in) << 8;
            q->ids[i] = (int32_t)(v % (unsigned)(fz_vocab + 4)) - (v >> 15 ? 2 : 0); /* some outside [0, vocab) */
        }
        rp->prompt = q->ids;
        rp->n_prompt = q->n_ids;
    } else {
        int n = (int)(fz_b(in) % 40);
        for (int i = 0; i < n; i++) q->text[i] = (char)(fz_b(in) | 1); /* raw bytes, no NUL */
        rp->text = q->text;
        rp->chat = q->kind == 2;
        rp->parse_special = (int)(fz_b(in) & 1);
        if (q->kind == 3) {
            int n2 = (int)(fz_b(in) % 24);
            for (int i = 0; i < n2; i++) q->text2[i] = (char)('a' + fz_b(in) % 26);
            q->msgs[0].role = "system"; q->msgs[0].content = q->text2;
            q->msgs[1].role = "user"; q->msgs[1].content = q->text;
            rp->text = NULL;
            rp->messages = q->msgs;
            rp->n_messages = 2;
        }
    }
    rp->max_tokens = (int)(fz_b(in) % 12);
    rp->n_ctx = (int)(fz_b(in) % 96);
    if (rp->max_tokens == 0 && rp->n_ctx == 0) rp->n_ctx = 48; /* not the default 4,096 tokens of generation */
    unsigned smp = fz_b(in);
    rp->sampling.temperature = smp % 3 ? 0.0f : 0.9f;
    rp->sampling.top_k = (int)(smp >> 2) % 5;
    rp->sampling.top_p = smp & 0x40 ? 0.8f : 0.0f;
    rp->sampling.repetition_penalty = smp & 0x80 ? 1.3f : 0.0f;
    rp->sampling.seed = fz_b(in);
    unsigned st = fz_b(in);
    rp->n_stop_strings = (int)(st % 3);
    for (int i = 0; i < rp->n_stop_strings; i++) {
        int len = (int)(fz_b(in) % 4); /* an empty one never matches */
        for (int k = 0; k < len; k++) q->stop[i][k] = (char)(fz_b(in) | 1);
        q->stops[i] = q->stop[i];
    }
    rp->stop_strings = q->stops;
    if (st & 0x10) {
        q->eos[0] = (int32_t)(fz_b(in) % (unsigned)fz_vocab);
        q->eos[1] = (int32_t)(fz_b(in) % (unsigned)fz_vocab);
        rp->eos_ids = q->eos;
        rp->n_eos_ids = 2;
    }
    rp->ignore_eos = (int)(st >> 5 & 1);
    if (st & 0x40) {
        rp->on_token = fz_on_token;
        rp->user = q;
        unsigned cb = fz_b(in);
        q->cb_stop_after = (int)(cb % 6);
        if (cb & 0x80) q->cancel_target = (int)(cb >> 3 & 7);
    }
    if (st & 0x80) { /* on a fresh sequence of the caller's, of the request's context */
        qsa_seq_params sp = {rp->n_ctx};
        FZ_ASSERT(qsa_seq_create(fz_m, rp->n_ctx ? &sp : NULL, &q->own) == QSA_OK);
        rp->seq = q->own;
    }
}

static void fz_invariants(const qsa_sched *s, int max_batch) {
    qsa_sched_info in;
    qsa_sched_get_info(s, &in);
    FZ_ASSERT(in.pages_reserved >= 0 && in.pages_free >= in.pages_reserved && in.pages_free <= in.pages_total);
    FZ_ASSERT(in.n_prefill + in.n_decode <= max_batch);
    FZ_ASSERT(qsa_sched_active(s) == in.n_queued + in.n_prefill + in.n_decode);
}

/* The oracle: the request's prompt as ids (the same tokenizer and template) through qsa_generate on a
   fresh sequence of the unconstrained model. */
static void fz_check_alone(fz_req *q, const qsa_request_result *r) {
    const qsa_tokenizer *tok = qsa_model_get_tokenizer(fz_ref);
    int32_t *ids = NULL;
    size_t n = 0;
    if (q->kind == 0) {
        ids = q->ids;
        n = (size_t)q->n_ids;
    } else {
        char *text = NULL;
        if (q->kind == 1) FZ_ASSERT(qsa_tokenize(tok, q->text, strlen(q->text), q->rp.parse_special, &ids, &n) == QSA_OK);
        else {
            qsa_chat_message one = {"user", q->text};
            FZ_ASSERT(qsa_chat_apply_template(tok, q->kind == 2 ? &one : q->msgs, q->kind == 2 ? 1 : 2, 1, &text) == QSA_OK);
            FZ_ASSERT(qsa_tokenize(tok, text, strlen(text), 1, &ids, &n) == QSA_OK);
            qsa_free(text);
        }
    }
    FZ_ASSERT(r->n_prompt_fed == (int)n);
    qsa_seq_params sp = {q->rp.n_ctx};
    qsa_seq *s = NULL;
    FZ_ASSERT(qsa_seq_create(fz_ref, sp.n_ctx ? &sp : NULL, &s) == QSA_OK);
    qsa_generate_params gp;
    memset(&gp, 0, sizeof gp);
    gp.sampling = q->rp.sampling;
    gp.max_tokens = q->rp.max_tokens;
    gp.stop_strings = q->rp.stop_strings;
    gp.n_stop_strings = q->rp.n_stop_strings;
    gp.eos_ids = q->rp.eos_ids;
    gp.n_eos_ids = q->rp.n_eos_ids;
    gp.ignore_eos = q->rp.ignore_eos;
    qsa_generation g;
    FZ_ASSERT(qsa_generate(s, ids, (int)n, &gp, &g) == QSA_OK);
    FZ_ASSERT(g.n_tokens == r->n_tokens && !memcmp(g.tokens, r->tokens, sizeof(int32_t) * (size_t)g.n_tokens));
    FZ_ASSERT(g.stop == r->stop);
    FZ_ASSERT(g.text_len == r->text_len && !memcmp(g.text, r->text, g.text_len));
    qsa_generation_free(&g);
    qsa_seq_free(s);
    if (ids != q->ids) qsa_free(ids);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fz_in in = {data, size, 0};
    qsa_sched_params sp;
    memset(&sp, 0, sizeof sp);
    sp.max_batch = 1 + (int)(fz_b(&in) % 4);
    sp.prefill_chunk = 1 + (int)(fz_b(&in) % 40);
    sp.max_queued = 1 + (int)(fz_b(&in) % 8);
    qsa_sched *s = NULL;
    FZ_ASSERT(qsa_sched_create(fz_m, &sp, &s) == QSA_OK);
    fz_nreq = 0;
    for (int ops = 0; in.at < in.n && ops < 64; ops++) {
        unsigned op = fz_b(&in) % 8, pick = fz_b(&in);
        fz_req *q = fz_nreq ? &fz_reqs[pick % (unsigned)fz_nreq] : NULL;
        if (op <= 1 && fz_nreq < FZ_MAXREQ) {
            fz_req *n = &fz_reqs[fz_nreq];
            fz_fill(n, &in, s);
            qsa_sched_info before, after;
            qsa_sched_get_info(s, &before);
            int64_t id = -7;
            if (qsa_sched_submit(s, &n->rp, &id) == QSA_OK) {
                FZ_ASSERT(id > 0);
                n->id = id;
                fz_nreq++;
            } else { /* refused at once, with no record and nothing taken */
                FZ_ASSERT(qsa_last_error()[0] != 0);
                qsa_sched_get_info(s, &after);
                FZ_ASSERT(after.n_queued == before.n_queued && after.pages_free == before.pages_free &&
                          after.pages_reserved == before.pages_reserved);
                qsa__buf_free(&n->streamed);
                if (n->own) FZ_ASSERT(qsa_seq_pos(n->own) == 0);
                qsa_seq_free(n->own);
            }
        } else if (op == 2 && q && !q->released) {
            FZ_ASSERT(qsa_sched_cancel(s, q->id) == QSA_OK);
            qsa_request_result r;
            FZ_ASSERT(qsa_sched_poll(s, q->id, &r) == QSA_OK);
            FZ_ASSERT(r.status == QSA_REQ_CANCELLED || r.status == QSA_REQ_DONE || r.status == QSA_REQ_ERROR);
        } else if (op == 3 && q && !q->released) {
            FZ_ASSERT(qsa_sched_release(s, q->id) == QSA_OK);
            q->released = 1;
            qsa_request_result r;
            FZ_ASSERT(qsa_sched_poll(s, q->id, &r) == QSA_ERR_NOT_FOUND);
        } else if (op == 4 && q && !q->released) {
            qsa_request_result r;
            FZ_ASSERT(qsa_sched_poll(s, q->id, &r) == QSA_OK);
            FZ_ASSERT(r.n_tokens >= 0 && (q->rp.max_tokens == 0 || r.n_tokens <= q->rp.max_tokens));
            FZ_ASSERT(r.text != NULL && strlen(r.text) <= r.text_len);
        } else {
            FZ_ASSERT(qsa_sched_step(s) == QSA_OK);
        }
        fz_invariants(s, sp.max_batch);
    }
    FZ_ASSERT(qsa_sched_run(s) == QSA_OK);
    FZ_ASSERT(qsa_sched_active(s) == 0);
    for (int i = 0; i < fz_nreq; i++) {
        fz_req *q = &fz_reqs[i];
        qsa_request_result r;
        if (!q->released) {
            FZ_ASSERT(qsa_sched_poll(s, q->id, &r) == QSA_OK);
            FZ_ASSERT(r.status == QSA_REQ_DONE || r.status == QSA_REQ_CANCELLED);
            /* the callback saw exactly the text, unless it stopped the request */
            if (q->rp.on_token && r.status == QSA_REQ_DONE && r.stop != QSA_STOP_CALLBACK)
                FZ_ASSERT(q->streamed.len == r.text_len && !memcmp(q->streamed.data ? q->streamed.data : "", r.text, r.text_len));
            if (r.status == QSA_REQ_DONE && r.stop != QSA_STOP_CALLBACK) fz_check_alone(q, &r);
            /* a caller's sequence holds the prompt and every generated token but the last */
            if (q->own && r.status == QSA_REQ_DONE)
                FZ_ASSERT(qsa_seq_pos(q->own) == r.n_prompt_fed + r.n_tokens - 1 && !q->own->broken);
            if (fz_verbose)
                fprintf(stderr, "fuzz_sched: request %d (kind %d%s): %s, stop %d, %d prompt tokens, %d generated%s\n", i,
                        q->kind, q->own ? ", the caller's sequence" : "", qsa_request_status_string(r.status), (int)r.stop,
                        r.n_prompt_fed, r.n_tokens,
                        r.status == QSA_REQ_DONE && r.stop != QSA_STOP_CALLBACK ? ", equal to qsa_generate alone" : "");
            FZ_ASSERT(qsa_sched_release(s, q->id) == QSA_OK);
        }
        qsa__buf_free(&q->streamed);
    }
    for (int i = 0; i < fz_nreq; i++) qsa_seq_free(fz_reqs[i].own); /* after every request is released */
    qsa_sched_info end;
    qsa_sched_get_info(s, &end);
    FZ_ASSERT(end.pages_free == end.pages_total && end.pages_reserved == 0 && end.n_finished == 0);
    qsa_sched_free(s);
    return 0;
}
