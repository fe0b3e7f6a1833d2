/* ---- scheduler: many requests, continuous batching, chunked prefill, KV-page admission ---- */

/* A scheduler serves many requests on one model: requests join and leave between steps
   (continuous batching); each step feeds at most one prompt chunk to every prefilling request and
   one token to every decoding request, always in ascending request id order, so a run is
   deterministic and a request's tokens do not depend on the others (batch invariance).
   Admission is first come, first served and by memory: a request is admitted only when the
   model's KV page pool can hold its whole budget, ceil((tokens already in its sequence + prompt +
   max_tokens - 1) / page_size) pages (the last generated token is never fed), reserved at
   admission, so running requests can never be starved of pages.  A request that can never fit is
   refused at submit with QSA_ERR_CONTEXT_FULL; one that cannot fit yet waits (QUEUED).  Every
   call runs on the caller's thread and callbacks are called from inside qsa_sched_step (they may
   submit and cancel, not step, release or free).  One thread at a time per scheduler; use one
   scheduler per model: reservations are the scheduler's own (sequences fed directly meanwhile
   take pages it does not know about). */
typedef struct qsa_sched qsa_sched;

/* Zero-initialise, set what you need; qsa_sched_create fills the rest with defaults. */
typedef struct qsa_sched_params {
    int max_batch;     /* most requests running (prefilling or decoding) at once (0: 32) */
    int prefill_chunk; /* most prompt tokens fed to one request in one step (0: 8192) */
    int max_queued;    /* most requests waiting for admission; beyond, submit refuses (0: 1024) */
    int n_ctx_default; /* context of a request that sets neither n_ctx nor max_tokens
                          (0: min(4096, max_position_embeddings)) */
} qsa_sched_params;

typedef enum qsa_request_status {
    QSA_REQ_QUEUED = 0, /* waiting for admission (memory or max_batch) */
    QSA_REQ_PREFILL,    /* admitted, prompt being fed in chunks */
    QSA_REQ_DECODE,     /* generating, one token per step */
    QSA_REQ_DONE,       /* finished: see stop */
    QSA_REQ_REFUSED,    /* could never be admitted (error, message say why) */
    QSA_REQ_CANCELLED,  /* qsa_sched_cancel */
    QSA_REQ_ERROR       /* a failure while running (error, message); other requests are unaffected */
} qsa_request_status;

typedef struct qsa_request_params {
    /* The prompt: token ids, or text for the model's tokenizer, or a conversation. */
    const int32_t *prompt;             /* ids (copied at submit) */
    int n_prompt;
    const char *text;                  /* used when prompt is NULL: UTF-8 text */
    int chat;                          /* 1: text is one user message, wrapped in the ChatML template */
    int parse_special;                 /* plain text: 1 matches special tokens (<|im_start|>, ...) */
    const qsa_chat_message *messages;  /* used when prompt and text are NULL: ChatML template */
    int n_messages;                    /* (with the assistant generation prompt appended) */
    /* Generation, as qsa_generate_params. */
    qsa_sampling_params sampling;      /* with its own seed */
    int max_tokens;                    /* 0: until EOS or the context is full */
    int n_ctx;                         /* context of a new sequence (0: max_position_embeddings when max_tokens
                                          is set, else the scheduler's n_ctx_default) */
    const char *const *stop_strings;   /* copied at submit */
    int n_stop_strings;
    const int32_t *eos_ids;            /* NULL: the model's EOS ids (copied at submit) */
    int n_eos_ids;
    int ignore_eos;
    qsa_token_callback on_token;       /* streamed text, as in qsa_generate (called inside qsa_sched_step) */
    void *user;
    /* Continue a caller-owned sequence (multi-turn chat without recomputing history): the prompt
       is fed after what the sequence holds, within its n_ctx.  NULL: a new sequence, owned and
       freed by the scheduler.  The caller must not use the sequence while the request is live;
       afterwards it holds everything fed (as with qsa_generate, not the last generated token). */
    qsa_seq *seq;
} qsa_request_params;

typedef struct qsa_request_result {
    qsa_request_status status;
    qsa_result error;        /* REFUSED / ERROR: why; CANCELLED: QSA_ERR_CANCELLED; else QSA_OK */
    const char *message;     /* REFUSED / ERROR: detail message ("" otherwise) */
    const int32_t *tokens;   /* generated tokens so far (including an EOS that stopped it) */
    int n_tokens;
    const char *text;        /* their text (without a matched stop string; "" without a tokenizer) */
    size_t text_len;
    qsa_stop_reason stop;    /* DONE: why it stopped */
    int n_prompt_fed;        /* prompt tokens fed so far */
    qsa_stats stats;         /* ttft_s counts from submit (queueing included); prefill_s from admission
                                to the first token; decode_s from the first to the last token */
    double queue_s;          /* submit -> admission */
    double total_s;          /* submit -> finished (or now) */
} qsa_request_result;

typedef struct qsa_sched_info {
    int n_queued, n_prefill, n_decode;  /* live requests by state */
    int n_finished;                     /* records kept until qsa_sched_release */
    int pages_total, pages_free;        /* the model's KV page pool */
    int pages_reserved;                 /* reserved by running requests, not yet taken from the pool */
    int page_size;
    long long n_steps, n_prefill_tokens, n_decode_tokens;
} qsa_sched_info;

QSA_API qsa_result qsa_sched_create(qsa_model *model, const qsa_sched_params *params, qsa_sched **out);
/* Cancels every live request (caller-owned sequences keep what was fed), frees all records. */
QSA_API void qsa_sched_free(qsa_sched *s);
/* Queue a request.  *id (> 0) names it.  Refused at once, with no record: bad arguments
   (QSA_ERR_INVALID_ARGUMENT), a prompt that does not tokenize, and a request that can never fit
   (QSA_ERR_CONTEXT_FULL: longer than its context, more KV pages than the whole pool, or the queue
   is full).  qsa_last_error() says why. */
QSA_API qsa_result qsa_sched_submit(qsa_sched *s, const qsa_request_params *params, int64_t *id);
/* Stop a queued or running request now: its sequence (if owned) and its pages go back to the
   pool at once.  No effect on a finished request.  QSA_ERR_NOT_FOUND for an unknown id. */
QSA_API qsa_result qsa_sched_cancel(qsa_sched *s, int64_t id);
/* One step: admit, then one decode token for every request that was decoding, then one prompt
   chunk for every prefilling request.  A request's failure is recorded in it (QSA_REQ_ERROR);
   the return value is for failures of the scheduler itself. */
QSA_API qsa_result qsa_sched_step(qsa_sched *s);
/* Step until no request is queued or running. */
QSA_API qsa_result qsa_sched_run(qsa_sched *s);
/* State of a request.  Pointers in *out stay valid until the next step, cancel or release. */
QSA_API qsa_result qsa_sched_poll(qsa_sched *s, int64_t id, qsa_request_result *out);
/* Forget a request (a live one is cancelled first).  Not from inside a callback. */
QSA_API qsa_result qsa_sched_release(qsa_sched *s, int64_t id);
/* Queued + running requests. */
QSA_API int qsa_sched_active(const qsa_sched *s);
QSA_API void qsa_sched_get_info(const qsa_sched *s, qsa_sched_info *info);
QSA_API const char *qsa_request_status_string(qsa_request_status st);
