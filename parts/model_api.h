/* ---- models, sequences, sampling, generation ---- */

typedef enum qsa_backend { QSA_BACKEND_AUTO = 0, QSA_BACKEND_CPU, QSA_BACKEND_CUDA } qsa_backend;

/* Zero-initialise, set what you need; qsa_model_load fills the rest with defaults. */
typedef struct qsa_model_params {
    qsa_backend backend;     /* AUTO: CUDA when usable, else CPU */
    int n_threads;           /* CPU threads (0: number of online CPUs, at most 16) */
    int gdn_chunked_prefill; /* 1: prefill Gated DeltaNet with the chunked (UT transform) form; 0: recurrence */
    int gdn_chunk_size;      /* chunk length of that form (0: 64, as the reference) */
    int no_tokenizer;        /* 1: do not load tokenizer files even if present */
    int kv_page_size;        /* tokens per KV page (any value >= 16; 0: the hybrid rule of docs/DETERMINISM.md) */
    int kv_pool_tokens;      /* KV pool capacity in tokens, shared by all sequences (0: min(context, 32768)) */
    int debug_physical_order;/* 1: order attention plans by physical page (breaks allocation invariance; tests only) */
    int device;              /* CUDA device ordinal */
    const char *arch;        /* NVRTC target ("compute_70", "sm_90", ...; NULL: $QSA_ARCH, else compute_70 when the
                                NVRTC supports it, else the device's own) */
    int max_chunk;           /* most tokens per forward call on the GPU; longer feeds are split (0: 512) */
    int gdn_state_f16;       /* 1: keep the GDN recurrent state in FP16 on the GPU (comparison option; default FP32) */
} qsa_model_params;

typedef struct qsa_model qsa_model;

QSA_API qsa_result qsa_model_load(const char *model_dir, const qsa_model_params *params, qsa_model **out);
QSA_API void qsa_model_free(qsa_model *model);
QSA_API const qsa_model_config *qsa_model_get_config(const qsa_model *model);
/* The tokenizer loaded from the model directory, or NULL when the directory has none. */
QSA_API const qsa_tokenizer *qsa_model_get_tokenizer(const qsa_model *model);
QSA_API const qsa_generation_config *qsa_model_get_generation_config(const qsa_model *model);

/* A sequence: one request's recurrent state, KV cache and position.  Tokens are fed in order;
   any split into chunks gives the same result as feeding them at once. */
typedef struct qsa_seq qsa_seq;
typedef struct qsa_seq_params {
    int n_ctx;               /* maximum tokens (prompt + generated); 0: max_position_embeddings */
} qsa_seq_params;

QSA_API qsa_result qsa_seq_create(qsa_model *model, const qsa_seq_params *params, qsa_seq **out);
QSA_API void qsa_seq_free(qsa_seq *seq);
/* Forget everything fed so far (keeps the allocation). */
QSA_API void qsa_seq_reset(qsa_seq *seq);
QSA_API int qsa_seq_pos(const qsa_seq *seq); /* tokens fed so far */
/* Feed n tokens.  logits (may be NULL): receives vocab_size floats for the last token, or
   n * vocab_size floats (row i for token i) when all_logits is non-zero. */
QSA_API qsa_result qsa_seq_feed(qsa_seq *seq, const int32_t *ids, int n, float *logits, int all_logits);

/* Sampling.  Zero-initialised = greedy.  temperature 0 = greedy (argmax, lowest id on ties). */
typedef struct qsa_sampling_params {
    float temperature;        /* 0: greedy */
    int top_k;                /* 0: off */
    float top_p;              /* 0 or 1: off */
    float min_p;              /* 0: off */
    float repetition_penalty; /* 0 or 1: off (CTRL-style: logit/p if > 0 else logit*p) */
    int penalty_last_n;       /* tokens looked back for the penalty (0: 64, -1: whole history) */
    uint64_t seed;            /* RNG seed (same seed + same logits = same tokens) */
} qsa_sampling_params;

typedef struct qsa_sampler qsa_sampler;
QSA_API qsa_result qsa_sampler_create(const qsa_sampling_params *params, qsa_sampler **out);
QSA_API void qsa_sampler_free(qsa_sampler *s);
/* Pick a token from logits[vocab] given the history (for the repetition penalty).  logits are
   modified in place. */
QSA_API int32_t qsa_sampler_sample(qsa_sampler *s, float *logits, int vocab, const int32_t *history, int n_history);

/* Generation. */
typedef struct qsa_stats {
    int n_prompt, n_generated;
    double prefill_s;     /* time to feed the prompt (and produce the first token's logits) */
    double decode_s;      /* time from the first to the last generated token */
    double ttft_s;        /* time to first token */
    double prefill_tok_s; /* n_prompt / prefill_s */
    double decode_tok_s;  /* (n_generated - 1) / decode_s */
} qsa_stats;

typedef enum qsa_stop_reason { QSA_STOP_NONE = 0, QSA_STOP_EOS, QSA_STOP_STRING, QSA_STOP_MAX_TOKENS, QSA_STOP_CALLBACK } qsa_stop_reason;

/* Called for every generated token except an EOS with its decoded text (complete UTF-8 only; may
   be empty; text that could be the start of a stop string is held back), and once more with
   token -1 for text still held at the end.  Return non-zero to stop. */
typedef int (*qsa_token_callback)(void *user, int32_t token, const char *text, size_t len);

typedef struct qsa_generate_params {
    qsa_sampling_params sampling;
    int max_tokens;                   /* 0: until EOS or the context is full */
    const char *const *stop_strings;  /* generation stops when the text ends with one of these */
    int n_stop_strings;
    const int32_t *eos_ids;           /* NULL: the model's EOS ids (generation_config, else config) */
    int n_eos_ids;
    int ignore_eos;
    qsa_token_callback on_token;
    void *user;
} qsa_generate_params;

typedef struct qsa_generation {
    int32_t *tokens;          /* generated tokens (free with qsa_free) */
    int n_tokens;
    char *text;               /* their text, without a matched stop string (free with qsa_free) */
    size_t text_len;
    qsa_stop_reason stop;
    qsa_stats stats;
} qsa_generation;

/* Feed the prompt, then sample and feed tokens until a stop condition.  The last generated
   token is not fed to the sequence (the caller feeds it, e.g. as the start of the next turn). */
QSA_API qsa_result qsa_generate(qsa_seq *seq, const int32_t *prompt, int n_prompt, const qsa_generate_params *params,
                                qsa_generation *out);
QSA_API void qsa_generation_free(qsa_generation *g);

/* Capture/replay (debugging the determinism contract; see docs/DETERMINISM.md).  Record QSA layer
   `layer` of a sequence from now on: each query's q|gate, block selection, attention plan and gated
   output.  _end writes them with the layer's K/V pages and block table to a safetensors file. */
QSA_API qsa_result qsa_seq_capture_begin(qsa_seq *seq, int layer);
QSA_API qsa_result qsa_seq_capture_end(qsa_seq *seq, const char *path);

typedef enum qsa_replay_mode {
    QSA_REPLAY_FROZEN_PLAN = 0, /* the plan segments as captured */
    QSA_REPLAY_PLANNER,         /* re-planned from the captured selections by today's planner */
    QSA_REPLAY_PHYSICAL_ORDER   /* re-planned in physical page order (the debug switch) */
} qsa_replay_mode;

typedef struct qsa_replay_report {
    int n_queries;
    long long n_values, n_differ;    /* output values compared / not bitwise equal */
    int first_query, first_index;    /* first differing value: query number, index in [nh*hd] (-1: none) */
    float first_captured, first_replayed;
} qsa_replay_report;

/* Recompute a captured layer's attention on the CPU with `mode` and compare with the captured
   output bit for bit. */
QSA_API qsa_result qsa_replay_capture(const char *path, qsa_replay_mode mode, qsa_replay_report *report);
