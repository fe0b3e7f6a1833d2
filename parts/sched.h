/* ============================================================================================== */
/* >>scheduler  requests, continuous batching, chunked prefill, admission by KV pages              */
/* ============================================================================================== */
/* Every request is an independent qsa_seq with its own sampler.  A step:
     1. admit queued requests in id order (first come, first served: the first one that does not
        fit stops admission, so a large request is never overtaken forever);
     2. decode: feed every decoding request its last sampled token in one batch
        (qsa__sched_decode_batch), sample the next one with the request's sampler, apply stops;
     3. prefill: feed every prefilling request its next prompt chunk (at most prefill_chunk
        tokens); after the last chunk sample the first token.
   Everything runs in ascending id order, so a run is deterministic; each sequence is fed on its
   own, so its logits cannot depend on its neighbours (batch invariance by construction).

   Memory.  A request's budget is the tokens its sequence may hold: what it held at submit +
   prompt + max_tokens - 1 (the last generated token is never fed, as in qsa_generate), or its
   whole context when max_tokens is 0; that is ceil(budget / page_size) pages of the model's KV
   pool.  Sequences take pages lazily as they are fed (qsa__seq_reserve), so the scheduler keeps
   `reserved`: the pages admitted requests may still take.  A request is
   admitted only when pool.n_free - reserved covers its pages, and every feed moves what its
   sequence took from its reservation to the pool's count, so the free pages never drop below
   what running requests were promised: admitted requests cannot run out of pages.  A request
   needing more pages than the whole pool, or more tokens than its context, is refused at submit;
   a queued one is refused when nothing is running and it still does not fit (the pages are held
   by sequences outside the scheduler, and nothing the scheduler does will free them).  The
   reservation protects requests from each other, not from sequences fed directly with
   qsa_seq_feed meanwhile: use one scheduler per model. */

typedef struct qsa__sched_req {
    int64_t id;
    qsa_request_status status;
    qsa_result error;
    char *message;
    qsa_seq *seq;              /* NULL while queued (own) and once finished */
    int own_seq;
    int32_t *prompt;
    int n_prompt, n_fed;
    int pos0;                  /* tokens the sequence held at submit */
    int budget;                /* tokens the sequence may hold: pos0 + prompt + max_tokens - 1, or its n_ctx */
    int max_new;               /* most tokens generated */
    int reserved;              /* pages reserved at admission, not yet taken by the sequence */
    int pages_held;            /* seq->n_pages when last accounted */
    qsa_sampler *smp;
    char **stops;
    int n_stops;
    size_t max_stop;           /* longest stop string */
    int32_t *eos;
    int n_eos, ignore_eos;
    qsa_token_callback on_token;
    void *user;
    int32_t *tokens;           /* generated */
    int n_tokens, cap_tokens;
    qsa__buf text;
    size_t emitted;            /* text bytes given to on_token */
    int has_ds;
    qsa_detok_stream ds;
    qsa_stop_reason stop;
    double t_submit, t_admit, t_first, t_last, t_end;
} qsa__sched_req;

/* Observer of the logits each request samples from (tests: batch invariance). */
typedef void (*qsa__sched_logits_hook)(void *user, int64_t id, int token_index, const float *logits, int vocab);

struct qsa_sched {
    qsa_model *m;
    qsa_sched_params p;
    qsa__sched_req **reqs;     /* every record, ascending id */
    int n_reqs, cap_reqs;
    int64_t next_id;
    int reserved;              /* sum of the running requests' reserved pages */
    int n_running;
    int in_step;
    float *logits;             /* [max_batch][vocab] */
    qsa_seq **b_seq;           /* decode batch [max_batch] */
    int32_t *b_tok;
    qsa_result *b_res;
    qsa__sched_req **b_req;
    long long n_steps, n_prefill_tokens, n_decode_tokens;
    qsa__sched_logits_hook logits_hook;
    void *hook_user;
};

QSA_IMPL const char *qsa_request_status_string(qsa_request_status st) {
    switch (st) {
    case QSA_REQ_QUEUED: return "queued";
    case QSA_REQ_PREFILL: return "prefill";
    case QSA_REQ_DECODE: return "decode";
    case QSA_REQ_DONE: return "done";
    case QSA_REQ_REFUSED: return "refused";
    case QSA_REQ_CANCELLED: return "cancelled";
    case QSA_REQ_ERROR: return "error";
    }
    return "unknown";
}

QSA_PRIV int qsa__sched_live(const qsa__sched_req *q) {
    return q->status == QSA_REQ_QUEUED || q->status == QSA_REQ_PREFILL || q->status == QSA_REQ_DECODE;
}
QSA_PRIV int qsa__sched_running(const qsa__sched_req *q) { return q->status == QSA_REQ_PREFILL || q->status == QSA_REQ_DECODE; }

/* Pages of the pool that `tokens` tokens occupy (none when the model has no QSA layer). */
QSA_PRIV int qsa__sched_pages(const qsa_sched *s, int64_t tokens) {
    const qsa__pool *pl = &s->m->pool;
    if (!pl->n_qsa || tokens <= 0) return 0;
    return (int)((tokens + pl->page_size - 1) / pl->page_size);
}

QSA_PRIV void qsa__sched_fill_params(qsa_sched_params *p, const qsa_model *m) {
    QSA__DEF(p->max_batch, 32);
    QSA__DEF(p->prefill_chunk, 8192);
    QSA__DEF(p->max_queued, 1024);
    QSA__DEF(p->n_ctx_default, m->cfg.max_position_embeddings < 4096 ? m->cfg.max_position_embeddings : 4096);
}

QSA_IMPL qsa_result qsa_sched_create(qsa_model *m, const qsa_sched_params *params, qsa_sched **out) {
    if (!m || !out) return qsa__fail(QSA_ERR_INVALID_ARGUMENT, "qsa_sched_create: NULL argument");
    *out = NULL;
    qsa_sched_params p;
    memset(&p, 0, sizeof p);
    if (params) p = *params;
    if (p.max_batch < 0 || p.prefill_chunk < 0 || p.max_queued < 0 || p.n_ctx_default < 0)
        return qsa__fail(QSA_ERR_INVALID_ARGUMENT,
                         "qsa_sched_create: max_batch %d, prefill_chunk %d, max_queued %d, n_ctx_default %d: expected >= 0 "
                         "(0: default)", p.max_batch, p.prefill_chunk, p.max_queued, p.n_ctx_default);
    qsa__sched_fill_params(&p, m);
    qsa_sched *s = QSA__CALLOC(qsa_sched, 1);
    if (!s) return qsa__fail(QSA_ERR_OUT_OF_MEMORY, "qsa_sched_create: out of memory");
    s->m = m;
    s->p = p;
    s->next_id = 1;
    s->logits = QSA__ALLOC(float, (size_t)p.max_batch * (size_t)m->cfg.vocab_size);
    s->b_seq = QSA__ALLOC(qsa_seq *, p.max_batch);
    s->b_tok = QSA__ALLOC(int32_t, p.max_batch);
    s->b_res = QSA__ALLOC(qsa_result, p.max_batch);
    s->b_req = QSA__ALLOC(qsa__sched_req *, p.max_batch);
    if (!s->logits || !s->b_seq || !s->b_tok || !s->b_res || !s->b_req) {
        qsa_sched_free(s);
        return qsa__fail(QSA_ERR_OUT_OF_MEMORY, "qsa_sched_create: out of memory for a batch of %d x %d logits",
                         p.max_batch, m->cfg.vocab_size);
    }
    *out = s;
    return QSA_OK;
}

/* ---- request records ---- */

QSA_PRIV qsa__sched_req *qsa__sched_find(const qsa_sched *s, int64_t id, int *index) {
    int lo = 0, hi = s->n_reqs - 1;
    while (lo <= hi) {
        int mid = lo + (hi - lo) / 2;
        if (s->reqs[mid]->id == id) { if (index) *index = mid; return s->reqs[mid]; }
        if (s->reqs[mid]->id < id) lo = mid + 1;
        else hi = mid - 1;
    }
    return NULL;
}

/* Give back what a running request holds: the rest of its reservation, its sequence (an owned
   one is freed: its pages return to the pool now; a caller's is detached), its sampler and
   stream.  Tokens, text and statistics stay for qsa_sched_poll. */
QSA_PRIV void qsa__sched_leave(qsa_sched *s, qsa__sched_req *q, int was_running) {
    if (was_running) s->n_running--;
    s->reserved -= q->reserved;
    q->reserved = 0;
    if (q->seq && q->own_seq) qsa_seq_free(q->seq);
    q->seq = NULL;
    qsa_sampler_free(q->smp);
    q->smp = NULL;
    if (q->has_ds) qsa_detok_stream_free(&q->ds);
    q->has_ds = 0;
    qsa__free(q->prompt);
    q->prompt = NULL;
    q->t_end = qsa__now();
}

QSA_PRIV void qsa__sched_req_free(qsa__sched_req *q) {
    if (!q) return;
    if (q->seq && q->own_seq) qsa_seq_free(q->seq);
    qsa_sampler_free(q->smp);
    if (q->has_ds) qsa_detok_stream_free(&q->ds);
    for (int i = 0; i < q->n_stops; i++) qsa__free(q->stops[i]);
    qsa__free(q->stops);
    qsa__free(q->eos);
    qsa__free(q->prompt);
    qsa__free(q->tokens);
    qsa__buf_free(&q->text);
    qsa__free(q->message);
    qsa__free(q);
}

/* End a request with a failure (ERROR while running, REFUSED while queued); the message is
   kept in the request. */
QSA_PRIV void qsa__sched_end_failed(qsa_sched *s, qsa__sched_req *q, qsa_request_status st, qsa_result r, const char *msg) {
    int was_running = qsa__sched_running(q);
    q->status = st;
    q->error = r;
    qsa__free(q->message);
    q->message = qsa__strdup(msg ? msg : "");
    qsa__log(QSA_LOG_INFO, "request %lld %s: %s", (long long)q->id, qsa_request_status_string(st), msg ? msg : "");
    qsa__sched_leave(s, q, was_running);
}

/* Move the pages the request's sequence took since the last look from its reservation to the
   pool's own count. */
QSA_PRIV void qsa__sched_account(qsa_sched *s, qsa__sched_req *q) {
    if (!q->seq) return;
    int taken = q->seq->n_pages - q->pages_held;
    q->pages_held = q->seq->n_pages;
    if (taken <= 0) return;
    if (taken > q->reserved) taken = q->reserved; /* cannot happen: the budget bounds every feed */
    q->reserved -= taken;
    s->reserved -= taken;
}

/* ---- submit ---- */

QSA_PRIV qsa_result qsa__sched_tokenize(qsa_sched *s, const qsa_request_params *p, int32_t **ids, int *n) {
    const qsa_tokenizer *tok = s->m->tok;
    *ids = NULL;
    *n = 0;
    if (p->prompt) {
        if (p->n_prompt <= 0) return qsa__fail(QSA_ERR_INVALID_ARGUMENT, "qsa_sched_submit: n_prompt %d: expected > 0", p->n_prompt);
        *ids = QSA__ALLOC(int32_t, p->n_prompt);
        if (!*ids) return qsa__fail(QSA_ERR_OUT_OF_MEMORY, "qsa_sched_submit: out of memory");
        memcpy(*ids, p->prompt, sizeof(int32_t) * (size_t)p->n_prompt);
        *n = p->n_prompt;
        return QSA_OK;
    }
    if (!p->text && !p->messages)
        return qsa__fail(QSA_ERR_INVALID_ARGUMENT, "qsa_sched_submit: no prompt (set prompt, text or messages)");
    if (!tok)
        return qsa__fail(QSA_ERR_INVALID_ARGUMENT, "qsa_sched_submit: a %s prompt needs a tokenizer and the model has none: "
                         "pass token ids", p->text ? "text" : "messages");
    char *chat = NULL;
    const char *text = p->text;
    int special = p->parse_special;
    if (!p->text || p->chat) {
        qsa_chat_message one;
        one.role = "user";
        one.content = p->text;
        QSA__TRY(qsa_chat_apply_template(tok, p->text ? &one : p->messages, p->text ? 1 : (size_t)(p->n_messages > 0 ? p->n_messages : 0),
                                         1, &chat));
        text = chat;
        special = 1;
    }
    size_t len = 0;
    qsa_result r = qsa_tokenize(tok, text, strlen(text), special, ids, &len);
    qsa__free(chat);
    if (r != QSA_OK) return r;
    if (len == 0 || len > (size_t)INT32_MAX) {
        qsa__free(*ids);
        *ids = NULL;
        return qsa__fail(QSA_ERR_INVALID_ARGUMENT, "qsa_sched_submit: the prompt text gives %zu tokens: expected 1 .. 2^31-1", len);
    }
    *n = (int)len;
    return QSA_OK;
}

QSA_PRIV qsa_result qsa__sched_copy_stops(qsa__sched_req *q, const qsa_request_params *p) {
    if (p->n_stop_strings <= 0) return QSA_OK;
    if (!p->stop_strings) return qsa__fail(QSA_ERR_INVALID_ARGUMENT, "qsa_sched_submit: n_stop_strings %d with NULL stop_strings", p->n_stop_strings);
    q->stops = QSA__CALLOC(char *, p->n_stop_strings);
    if (!q->stops) return qsa__fail(QSA_ERR_OUT_OF_MEMORY, "qsa_sched_submit: out of memory");
    for (int i = 0; i < p->n_stop_strings; i++) {
        if (!p->stop_strings[i]) return qsa__fail(QSA_ERR_INVALID_ARGUMENT, "qsa_sched_submit: stop string %d is NULL", i);
        if (!p->stop_strings[i][0]) continue; /* an empty stop string never matches (as in qsa_generate) */
        char *d = qsa__strdup(p->stop_strings[i]);
        if (!d) return qsa__fail(QSA_ERR_OUT_OF_MEMORY, "qsa_sched_submit: out of memory");
        q->stops[q->n_stops++] = d;
        if (strlen(d) > q->max_stop) q->max_stop = strlen(d);
    }
    return QSA_OK;
}

/* Check the request against its context and the pool and set its budget; the messages are the
   refusals a caller sees. */
QSA_PRIV qsa_result qsa__sched_budget(qsa_sched *s, qsa__sched_req *q, const qsa_request_params *p, int *n_ctx_out) {
    const qsa_model_config *c = &s->m->cfg;
    const qsa__pool *pl = &s->m->pool;
    int n_ctx;
    if (p->seq) n_ctx = p->seq->n_ctx;
    else {
        n_ctx = p->n_ctx > 0 ? p->n_ctx : p->max_tokens > 0 ? c->max_position_embeddings : s->p.n_ctx_default;
        if (n_ctx > c->max_position_embeddings)
            return qsa__fail(QSA_ERR_CONTEXT_FULL, "qsa_sched_submit: n_ctx %d exceeds the model's context of %d tokens "
                             "(max_position_embeddings)", n_ctx, c->max_position_embeddings);
    }
    /* the last generated token is never fed: P prompt tokens and M new ones hold P + M - 1 */
    int64_t want = (int64_t)q->pos0 + q->n_prompt + p->max_tokens - 1;
    char held[64] = "";
    if (q->pos0) snprintf(held, sizeof held, "%d tokens already in the sequence + ", q->pos0);
    if ((int64_t)q->pos0 + q->n_prompt >= n_ctx) /* as qsa_generate: room for at least one token to be fed */
        return qsa__fail(QSA_ERR_CONTEXT_FULL, "qsa_sched_submit: %sa prompt of %d tokens leaves no room to generate in the "
                         "context of %d", held, q->n_prompt, n_ctx);
    if (p->max_tokens > 0 && want > n_ctx)
        return qsa__fail(QSA_ERR_CONTEXT_FULL, "qsa_sched_submit: %sa prompt of %d tokens + max_tokens %d need %lld tokens of "
                         "context (the last generated token is not fed), more than the context of %d", held, q->n_prompt,
                         p->max_tokens, (long long)want, n_ctx);
    q->budget = p->max_tokens > 0 ? (int)want : n_ctx;
    q->max_new = p->max_tokens > 0 ? p->max_tokens : n_ctx - q->pos0 - q->n_prompt + 1;
    int pages = qsa__sched_pages(s, q->budget);
    if (pages > pl->n_pages)
        return qsa__fail(QSA_ERR_CONTEXT_FULL, "qsa_sched_submit: the request needs %d tokens = %d KV pages of %d tokens, the "
                         "whole pool has %d pages (%d tokens: raise kv_pool_tokens or lower max_tokens)", q->budget, pages,
                         pl->page_size, pl->n_pages, pl->n_pages * pl->page_size);
    *n_ctx_out = n_ctx;
    return QSA_OK;
}

QSA_PRIV qsa_result qsa__sched_prepare(qsa_sched *s, qsa__sched_req *q, const qsa_request_params *p) {
    const qsa_model_config *c = &s->m->cfg;
    QSA__TRY(qsa__sched_tokenize(s, p, &q->prompt, &q->n_prompt));
    for (int i = 0; i < q->n_prompt; i++)
        if (q->prompt[i] < 0 || q->prompt[i] >= c->vocab_size)
            return qsa__fail(QSA_ERR_INVALID_ARGUMENT, "qsa_sched_submit: prompt token %d at index %d is outside the vocabulary "
                             "[0, %d)", q->prompt[i], i, c->vocab_size);
    if (p->seq) {
        if (p->seq->m != s->m)
            return qsa__fail(QSA_ERR_INVALID_ARGUMENT, "qsa_sched_submit: the sequence belongs to another model");
        for (int i = 0; i < s->n_reqs; i++) /* a record points to a caller's sequence only while live */
            if (s->reqs[i]->seq == p->seq)
                return qsa__fail(QSA_ERR_INVALID_ARGUMENT, "qsa_sched_submit: the sequence is already used by live request %lld",
                                 (long long)s->reqs[i]->id);
        q->seq = p->seq;
        q->pos0 = p->seq->pos;
    } else q->own_seq = 1;
    int n_ctx = 0;
    QSA__TRY(qsa__sched_budget(s, q, p, &n_ctx));
    QSA__TRY(qsa_sampler_create(&p->sampling, &q->smp));
    QSA__TRY(qsa__sched_copy_stops(q, p));
    const int32_t *eos = p->eos_ids;
    int n_eos = p->n_eos_ids;
    if (!eos) {
        if (s->m->gen.n_eos) { eos = s->m->gen.eos_token_ids; n_eos = s->m->gen.n_eos; }
        else { eos = c->eos_token_ids; n_eos = c->n_eos; }
    }
    if (n_eos < 0) return qsa__fail(QSA_ERR_INVALID_ARGUMENT, "qsa_sched_submit: n_eos_ids %d: expected >= 0", n_eos);
    q->eos = QSA__ALLOC(int32_t, n_eos);
    q->cap_tokens = q->max_new < 64 ? q->max_new : 64;
    q->tokens = QSA__ALLOC(int32_t, q->cap_tokens);
    if (!q->eos || !q->tokens || !qsa__buf_reserve(&q->text, 64))
        return qsa__fail(QSA_ERR_OUT_OF_MEMORY, "qsa_sched_submit: out of memory");
    if (n_eos) memcpy(q->eos, eos, sizeof(int32_t) * (size_t)n_eos);
    q->n_eos = n_eos;
    q->ignore_eos = p->ignore_eos;
    q->on_token = p->on_token;
    q->user = p->user;
    if (s->m->tok) {
        qsa_detok_stream_init(&q->ds, s->m->tok, QSA_DETOK_SKIP_SPECIAL);
        q->has_ds = 1;
    }
    return QSA_OK;
}

QSA_IMPL qsa_result qsa_sched_submit(qsa_sched *s, const qsa_request_params *p, int64_t *id) {
    if (id) *id = 0;
    if (!s || !p || !id) return qsa__fail(QSA_ERR_INVALID_ARGUMENT, "qsa_sched_submit: NULL argument");
    if (p->max_tokens < 0 || p->n_ctx < 0)
        return qsa__fail(QSA_ERR_INVALID_ARGUMENT, "qsa_sched_submit: max_tokens %d, n_ctx %d: expected >= 0", p->max_tokens, p->n_ctx);
    int queued = 0;
    for (int i = 0; i < s->n_reqs; i++) queued += s->reqs[i]->status == QSA_REQ_QUEUED;
    if (queued >= s->p.max_queued)
        return qsa__fail(QSA_ERR_CONTEXT_FULL, "qsa_sched_submit: the queue is full (%d requests waiting, max_queued %d)", queued,
                         s->p.max_queued);
    if (s->n_reqs == s->cap_reqs) {
        int cap = s->cap_reqs ? 2 * s->cap_reqs : 16;
        qsa__sched_req **r = (qsa__sched_req **)qsa__realloc(s->reqs, sizeof(qsa__sched_req *) * (size_t)cap);
        if (!r) return qsa__fail(QSA_ERR_OUT_OF_MEMORY, "qsa_sched_submit: out of memory");
        s->reqs = r;
        s->cap_reqs = cap;
    }
    qsa__sched_req *q = QSA__CALLOC(qsa__sched_req, 1);
    if (!q) return qsa__fail(QSA_ERR_OUT_OF_MEMORY, "qsa_sched_submit: out of memory");
    qsa_result r = qsa__sched_prepare(s, q, p);
    if (r != QSA_OK) {
        q->seq = NULL; /* never the caller's to free */
        qsa__sched_req_free(q);
        return r;
    }
    /* q->seq: the caller's sequence, or NULL until admission creates the request's own */
    q->id = s->next_id++;
    q->status = QSA_REQ_QUEUED;
    q->t_submit = qsa__now();
    s->reqs[s->n_reqs++] = q;
    *id = q->id;
    return QSA_OK;
}

/* ---- one step ---- */

/* Sample from logits (modified in place) with the request's sampler. */
QSA_PRIV int32_t qsa__sched_sample(qsa_sched *s, qsa__sched_req *q, float *logits) {
    int V = s->m->cfg.vocab_size;
    if (s->logits_hook) s->logits_hook(s->hook_user, q->id, q->n_tokens, logits, V);
    return qsa_sampler_sample(q->smp, logits, V, q->seq->tokens, q->seq->pos);
}

/* First position of needle in hay, or -1 (the text may hold NUL bytes). */
QSA_PRIV int64_t qsa__memfind(const char *hay, size_t hl, const char *needle, size_t nl, size_t from) {
    if (nl == 0 || hl < nl) return -1;
    for (size_t i = from; i + nl <= hl; i++)
        if (hay[i] == needle[0] && memcmp(hay + i, needle, nl) == 0) return (int64_t)i;
    return -1;
}

/* Finish normally: text held back for a stop string that never came and an incomplete UTF-8
   tail are flushed to the text and the callback (not after a stop string or a callback stop). */
QSA_PRIV void qsa__sched_finish(qsa_sched *s, qsa__sched_req *q, qsa_stop_reason stop) {
    if (q->has_ds && stop != QSA_STOP_STRING && stop != QSA_STOP_CALLBACK) {
        const char *piece;
        size_t plen;
        if (qsa_detok_stream_flush(&q->ds, &piece, &plen) == QSA_OK && plen) qsa__buf_put(&q->text, piece, plen);
    }
    q->stop = stop;
    q->status = QSA_REQ_DONE;
    qsa__sched_leave(s, q, 1);
    int flush = q->on_token && stop != QSA_STOP_STRING && stop != QSA_STOP_CALLBACK && q->text.len > q->emitted;
    size_t from = q->emitted;
    q->emitted = q->text.len;
    if (flush) q->on_token(q->user, -1, q->text.data + from, q->text.len - from);
}

/* A sampled token: record it, stream its text, apply the stop conditions (as qsa_generate). */
QSA_PRIV void qsa__sched_accept(qsa_sched *s, qsa__sched_req *q, int32_t t) {
    if (q->n_tokens == q->cap_tokens) {
        int cap = q->cap_tokens * 2 < q->max_new ? q->cap_tokens * 2 : q->max_new;
        int32_t *nt = (int32_t *)qsa__realloc(q->tokens, sizeof(int32_t) * (size_t)cap);
        if (!nt) {
            qsa__fail(QSA_ERR_OUT_OF_MEMORY, "request %lld: out of memory for %d tokens", (long long)q->id, cap);
            qsa__sched_end_failed(s, q, QSA_REQ_ERROR, QSA_ERR_OUT_OF_MEMORY, qsa_last_error());
            return;
        }
        q->tokens = nt;
        q->cap_tokens = cap;
    }
    q->tokens[q->n_tokens++] = t;
    q->t_last = qsa__now();
    if (q->n_tokens == 1) q->t_first = q->t_last;
    int is_eos = 0;
    for (int i = 0; i < q->n_eos; i++) is_eos |= q->eos[i] == t;
    if (is_eos && !q->ignore_eos) { qsa__sched_finish(s, q, QSA_STOP_EOS); return; }
    size_t old = q->text.len;
    if (q->has_ds) {
        const char *piece;
        size_t plen;
        qsa_result r = qsa_detok_stream_push(&q->ds, t, &piece, &plen);
        if (r == QSA_OK && !qsa__buf_put(&q->text, piece, plen)) r = qsa__fail(QSA_ERR_OUT_OF_MEMORY, "request %lld: out of memory", (long long)q->id);
        if (r != QSA_OK) { qsa__sched_end_failed(s, q, QSA_REQ_ERROR, r, qsa_last_error()); return; }
    }
    /* a stop string ends in the new text: look from max_stop - 1 bytes before it; cut at the earliest */
    int stopped = 0;
    if (q->n_stops && q->text.len > old) {
        size_t from = old > q->max_stop - 1 ? old - (q->max_stop - 1) : 0;
        int64_t best = -1;
        for (int i = 0; i < q->n_stops; i++) {
            int64_t at = qsa__memfind(q->text.data, q->text.len, q->stops[i], strlen(q->stops[i]), from);
            if (at >= 0 && (best < 0 || at < best)) best = at;
        }
        if (best >= 0) {
            q->text.len = (size_t)best;
            q->text.data[q->text.len] = 0;
            stopped = 1;
        }
    }
    size_t hold = stopped ? 0 : qsa__stop_holdback(q->text.data, q->text.len, (const char *const *)q->stops, q->n_stops);
    size_t upto = q->text.len > hold ? q->text.len - hold : 0;
    if (q->on_token && upto >= q->emitted) {
        size_t from = q->emitted;
        q->emitted = upto;
        int stop_cb = q->on_token(q->user, t, q->text.data + from, upto - from);
        if (q->status != QSA_REQ_DECODE) return; /* the callback cancelled this request */
        if (stop_cb) { qsa__sched_finish(s, q, QSA_STOP_CALLBACK); return; }
    }
    if (stopped) { qsa__sched_finish(s, q, QSA_STOP_STRING); return; }
    if (q->n_tokens >= q->max_new) { qsa__sched_finish(s, q, QSA_STOP_MAX_TOKENS); return; }
}

/* One decode step for n sequences: feed tokens[i] to seqs[i]; the logits of that token go to
   logits_out + i * vocab; res[i] is sequence i's result and the return value the first failure.
   Today a loop over qsa_seq_feed: each sequence is fed on its own, so its logits cannot depend on
   the batch.  This is the one place to put a batched forward (one GPU pass for the batch). */
QSA_PRIV qsa_result qsa__sched_decode_batch(qsa_sched *s, qsa_seq *const *seqs, const int32_t *tokens, int n, float *logits_out,
                                            qsa_result *res) {
    size_t V = (size_t)s->m->cfg.vocab_size;
    qsa_result first = QSA_OK;
    char msg[1024];
    msg[0] = 0;
    for (int i = 0; i < n; i++) {
        res[i] = qsa_seq_feed(seqs[i], &tokens[i], 1, logits_out + (size_t)i * V, 0);
        if (res[i] != QSA_OK && first == QSA_OK) {
            first = res[i];
            snprintf(msg, sizeof msg, "%s", qsa_last_error());
        }
    }
    if (first != QSA_OK) qsa__fail(first, "%s", msg); /* the first failure's message, not a later one's */
    return first;
}

/* Admit queued requests in id order while a batch slot and their pages are free. */
QSA_PRIV void qsa__sched_admit(qsa_sched *s) {
    const qsa__pool *pl = &s->m->pool;
    for (int i = 0; i < s->n_reqs && s->n_running < s->p.max_batch; i++) {
        qsa__sched_req *q = s->reqs[i];
        if (q->status != QSA_REQ_QUEUED) continue;
        int held = q->seq ? q->seq->n_pages : 0;
        int need = qsa__sched_pages(s, q->budget) - held;
        if (need < 0) need = 0;
        int avail = pl->n_free - s->reserved;
        if (need > avail) {
            if (s->n_running > 0) break; /* first come, first served: wait for pages */
            char msg[512];
            snprintf(msg, sizeof msg, "request %lld needs %d more KV pages of %d tokens, %d of %d are free and no request is "
                     "running that could free more (the rest are held by sequences outside the scheduler)",
                     (long long)q->id, need, pl->page_size, avail, pl->n_pages);
            qsa__sched_end_failed(s, q, QSA_REQ_REFUSED, QSA_ERR_CONTEXT_FULL, msg);
            continue;
        }
        if (q->own_seq) {
            qsa_seq_params sp;
            memset(&sp, 0, sizeof sp);
            sp.n_ctx = q->budget;
            qsa_result r = qsa_seq_create(s->m, &sp, &q->seq);
            if (r != QSA_OK) {
                q->seq = NULL;
                qsa__sched_end_failed(s, q, QSA_REQ_ERROR, r, qsa_last_error());
                continue;
            }
        }
        q->pages_held = q->seq->n_pages;
        q->reserved = need;
        s->reserved += need;
        s->n_running++;
        q->status = QSA_REQ_PREFILL;
        q->t_admit = qsa__now();
    }
}

/* One token for every request that was decoding when the step began. */
QSA_PRIV void qsa__sched_decode(qsa_sched *s) {
    int n = 0;
    for (int i = 0; i < s->n_reqs && n < s->p.max_batch; i++) {
        qsa__sched_req *q = s->reqs[i];
        if (q->status != QSA_REQ_DECODE) continue;
        s->b_req[n] = q;
        s->b_seq[n] = q->seq;
        s->b_tok[n] = q->tokens[q->n_tokens - 1];
        n++;
    }
    if (!n) return;
    qsa_result first = qsa__sched_decode_batch(s, s->b_seq, s->b_tok, n, s->logits, s->b_res);
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", first != QSA_OK ? qsa_last_error() : "");
    for (int i = 0; i < n; i++) qsa__sched_account(s, s->b_req[i]);
    size_t V = (size_t)s->m->cfg.vocab_size;
    for (int i = 0; i < n; i++) {
        qsa__sched_req *q = s->b_req[i];
        if (q->status != QSA_REQ_DECODE) continue; /* cancelled by an earlier request's callback */
        if (s->b_res[i] != QSA_OK) { qsa__sched_end_failed(s, q, QSA_REQ_ERROR, s->b_res[i], msg); continue; }
        s->n_decode_tokens++;
        qsa__sched_accept(s, q, qsa__sched_sample(s, q, s->logits + (size_t)i * V));
    }
}

/* One prompt chunk for every prefilling request; the first token after the last chunk. */
QSA_PRIV void qsa__sched_prefill(qsa_sched *s) {
    for (int i = 0; i < s->n_reqs; i++) {
        qsa__sched_req *q = s->reqs[i];
        if (q->status != QSA_REQ_PREFILL) continue;
        int k = q->n_prompt - q->n_fed < s->p.prefill_chunk ? q->n_prompt - q->n_fed : s->p.prefill_chunk;
        int last = q->n_fed + k == q->n_prompt;
        qsa_result r = qsa_seq_feed(q->seq, q->prompt + q->n_fed, k, last ? s->logits : NULL, 0);
        qsa__sched_account(s, q);
        if (r != QSA_OK) { qsa__sched_end_failed(s, q, QSA_REQ_ERROR, r, qsa_last_error()); continue; }
        q->n_fed += k;
        s->n_prefill_tokens += k;
        if (!last) continue;
        q->status = QSA_REQ_DECODE;
        qsa__sched_accept(s, q, qsa__sched_sample(s, q, s->logits));
    }
}

QSA_IMPL qsa_result qsa_sched_step(qsa_sched *s) {
    if (!s) return qsa__fail(QSA_ERR_INVALID_ARGUMENT, "qsa_sched_step: NULL scheduler");
    if (s->in_step) return qsa__fail(QSA_ERR_INVALID_ARGUMENT, "qsa_sched_step: called from inside a step (a callback)");
    s->in_step = 1;
    s->n_steps++;
    qsa__sched_admit(s);
    qsa__sched_decode(s);
    qsa__sched_prefill(s);
    s->in_step = 0;
    return QSA_OK;
}

QSA_IMPL int qsa_sched_active(const qsa_sched *s) {
    int n = 0;
    if (s)
        for (int i = 0; i < s->n_reqs; i++) n += qsa__sched_live(s->reqs[i]);
    return n;
}

QSA_IMPL qsa_result qsa_sched_run(qsa_sched *s) {
    if (!s) return qsa__fail(QSA_ERR_INVALID_ARGUMENT, "qsa_sched_run: NULL scheduler");
    while (qsa_sched_active(s)) QSA__TRY(qsa_sched_step(s));
    return QSA_OK;
}

/* ---- cancel, poll, release ---- */

QSA_IMPL qsa_result qsa_sched_cancel(qsa_sched *s, int64_t id) {
    if (!s) return qsa__fail(QSA_ERR_INVALID_ARGUMENT, "qsa_sched_cancel: NULL scheduler");
    qsa__sched_req *q = qsa__sched_find(s, id, NULL);
    if (!q) return qsa__fail(QSA_ERR_NOT_FOUND, "qsa_sched_cancel: no request %lld", (long long)id);
    if (!qsa__sched_live(q)) return QSA_OK;
    int was_running = qsa__sched_running(q);
    q->status = QSA_REQ_CANCELLED;
    q->error = QSA_ERR_CANCELLED;
    qsa__sched_leave(s, q, was_running);
    return QSA_OK;
}

QSA_IMPL qsa_result qsa_sched_poll(qsa_sched *s, int64_t id, qsa_request_result *out) {
    if (!s || !out) return qsa__fail(QSA_ERR_INVALID_ARGUMENT, "qsa_sched_poll: NULL argument");
    memset(out, 0, sizeof *out);
    const qsa__sched_req *q = qsa__sched_find(s, id, NULL);
    if (!q) return qsa__fail(QSA_ERR_NOT_FOUND, "qsa_sched_poll: no request %lld (never submitted, or released)", (long long)id);
    out->status = q->status;
    out->error = q->error;
    out->message = q->message ? q->message : "";
    out->tokens = q->tokens;
    out->n_tokens = q->n_tokens;
    out->text = q->text.data ? q->text.data : "";
    out->text_len = q->text.len;
    out->stop = q->stop;
    out->n_prompt_fed = q->n_fed;
    double now = qsa__sched_live(q) ? qsa__now() : q->t_end;
    qsa_stats *st = &out->stats;
    st->n_prompt = q->n_prompt;
    st->n_generated = q->n_tokens;
    int admitted = q->t_admit > 0;
    out->queue_s = (admitted ? q->t_admit : now) - q->t_submit;
    out->total_s = now - q->t_submit;
    if (q->n_tokens > 0) {
        st->ttft_s = q->t_first - q->t_submit;
        st->prefill_s = q->t_first - q->t_admit;
        st->decode_s = q->t_last - q->t_first;
        st->prefill_tok_s = st->prefill_s > 0 ? q->n_prompt / st->prefill_s : 0;
        st->decode_tok_s = st->decode_s > 0 ? (q->n_tokens - 1) / st->decode_s : 0;
    } else if (admitted) st->prefill_s = now - q->t_admit;
    return QSA_OK;
}

QSA_IMPL qsa_result qsa_sched_release(qsa_sched *s, int64_t id) {
    if (!s) return qsa__fail(QSA_ERR_INVALID_ARGUMENT, "qsa_sched_release: NULL scheduler");
    if (s->in_step) return qsa__fail(QSA_ERR_INVALID_ARGUMENT, "qsa_sched_release: not from inside a step (cancel instead)");
    int idx = 0;
    qsa__sched_req *q = qsa__sched_find(s, id, &idx);
    if (!q) return qsa__fail(QSA_ERR_NOT_FOUND, "qsa_sched_release: no request %lld", (long long)id);
    qsa_sched_cancel(s, id);
    qsa__sched_req_free(q);
    memmove(s->reqs + idx, s->reqs + idx + 1, sizeof(qsa__sched_req *) * (size_t)(s->n_reqs - idx - 1));
    s->n_reqs--;
    return QSA_OK;
}

QSA_IMPL void qsa_sched_get_info(const qsa_sched *s, qsa_sched_info *info) {
    if (!info) return;
    memset(info, 0, sizeof *info);
    if (!s) return;
    for (int i = 0; i < s->n_reqs; i++) {
        qsa_request_status st = s->reqs[i]->status;
        if (st == QSA_REQ_QUEUED) info->n_queued++;
        else if (st == QSA_REQ_PREFILL) info->n_prefill++;
        else if (st == QSA_REQ_DECODE) info->n_decode++;
        else info->n_finished++;
    }
    const qsa__pool *pl = &s->m->pool;
    info->pages_total = pl->n_pages;
    info->pages_free = pl->n_free;
    info->pages_reserved = s->reserved;
    info->page_size = pl->page_size;
    info->n_steps = s->n_steps;
    info->n_prefill_tokens = s->n_prefill_tokens;
    info->n_decode_tokens = s->n_decode_tokens;
}

QSA_IMPL void qsa_sched_free(qsa_sched *s) {
    if (!s) return;
    for (int i = 0; i < s->n_reqs; i++) qsa_sched_cancel(s, s->reqs[i]->id);
    for (int i = 0; i < s->n_reqs; i++) qsa__sched_req_free(s->reqs[i]);
    qsa__free(s->reqs);
    qsa__free(s->logits);
    qsa__free(s->b_seq);
    qsa__free(s->b_tok);
    qsa__free(s->b_res);
    qsa__free(s->b_req);
    qsa__free(s);
}
