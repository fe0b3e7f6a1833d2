/* ---- tokenizer: byte-level BPE from tokenizer.json, streaming detokenizer, ChatML ---- */

/* A loaded tokenizer (read-only after load: may be shared between threads). */
typedef struct qsa_tokenizer qsa_tokenizer;

/* Load a Hugging Face `tokenizers` file (tokenizer.json): byte-level BPE model, added/special tokens,
   NFC normaliser, the Qwen2/Qwen3 or Qwen3.5 Split regex + ByteLevel pre-tokenizer.  Anything else
   (another model type, another regex, byte_fallback, ...) is refused with QSA_ERR_UNSUPPORTED. */
QSA_API qsa_result qsa_tokenizer_load(const char *tokenizer_json_path, qsa_tokenizer **out);
/* Load <dir>/tokenizer.json and, if present, <dir>/tokenizer_config.json (eos/bos/pad tokens). */
QSA_API qsa_result qsa_tokenizer_load_dir(const char *model_dir, qsa_tokenizer **out);
QSA_API void qsa_tokenizer_free(qsa_tokenizer *tok);

/* Number of token ids: 1 + the largest id of the vocabulary and the added tokens (the model's
   embedding table may be larger: it is padded). */
QSA_API int32_t qsa_tokenizer_vocab_size(const qsa_tokenizer *tok);
/* Id of a token given its text (an added token's content, or a vocabulary entry's bytes), or -1. */
QSA_API int32_t qsa_tokenizer_find(const qsa_tokenizer *tok, const char *text);
/* 1 when id is an added token marked "special" (e.g. <|im_end|>), else 0. */
QSA_API int qsa_tokenizer_is_special(const qsa_tokenizer *tok, int32_t id);
/* End-of-sequence ids: eos_token of tokenizer_config.json when it was read, else whichever of
   <|im_end|> and <|endoftext|> exist.  Returns the count; *ids points into the tokenizer. */
QSA_API int qsa_tokenizer_eos(const qsa_tokenizer *tok, const int32_t **ids);
/* bos_token / pad_token of tokenizer_config.json, or -1. */
QSA_API int32_t qsa_tokenizer_bos(const qsa_tokenizer *tok);
QSA_API int32_t qsa_tokenizer_pad(const qsa_tokenizer *tok);

/* Text -> ids, exactly as `tokenizers` Tokenizer.encode(text, add_special_tokens=False).  `text`
   must be valid UTF-8 (else QSA_ERR_INVALID_ARGUMENT naming the byte offset).  parse_special = 0
   treats special added tokens (special: true, e.g. <|im_start|>) as plain text, like
   `split_special_tokens=True` in transformers; non-special added tokens are still matched.
   *ids is allocated (free with qsa_free; NULL when *n == 0). */
QSA_API qsa_result qsa_tokenize(const qsa_tokenizer *tok, const char *text, size_t len, int parse_special,
                                int32_t **ids, size_t *n);

/* Raw bytes of one token (byte-level decoded; may be an incomplete UTF-8 sequence).  *piece points
   into the tokenizer and is not NUL-terminated. */
QSA_API qsa_result qsa_token_to_piece(const qsa_tokenizer *tok, int32_t id, const char **piece, size_t *len);

#define QSA_DETOK_SKIP_SPECIAL 1 /* leave out special added tokens (skip_special_tokens=True) */
/* Ids -> text like `tokenizers` decode: pieces concatenated, invalid UTF-8 replaced by U+FFFD
   (maximal subparts).  *text is allocated and NUL-terminated (free with qsa_free). */
QSA_API qsa_result qsa_detokenize(const qsa_tokenizer *tok, const int32_t *ids, size_t n, int flags,
                                  char **text, size_t *len);

/* Streaming detokenizer: push ids one at a time and get back only complete UTF-8 text; a
   multi-byte character split over several tokens is held back until complete.  Bytes that can
   never become valid are replaced by U+FFFD at once; an incomplete tail becomes U+FFFD at flush.
   The concatenation of all outputs equals qsa_detokenize of all ids.  Zero-initialise, then init;
   returned text stays valid until the next call on the stream.  Free with qsa_detok_stream_free. */
typedef struct qsa_detok_stream {
    const qsa_tokenizer *tok;
    int flags;                 /* QSA_DETOK_* */
    unsigned char pending[4];  /* an incomplete UTF-8 sequence */
    int n_pending;
    char *buf;                 /* output buffer (owned) */
    size_t cap;
} qsa_detok_stream;
QSA_API void qsa_detok_stream_init(qsa_detok_stream *s, const qsa_tokenizer *tok, int flags);
QSA_API qsa_result qsa_detok_stream_push(qsa_detok_stream *s, int32_t id, const char **text, size_t *len);
QSA_API qsa_result qsa_detok_stream_flush(qsa_detok_stream *s, const char **text, size_t *len);
QSA_API void qsa_detok_stream_free(qsa_detok_stream *s);

/* ChatML: "<|im_start|>ROLE\nCONTENT<|im_end|>\n" per message, then "<|im_start|>assistant\n" when
   add_generation_prompt.  The marker strings are the tokenizer's own added tokens (QSA_ERR_NOT_FOUND
   when it has none).  *out is allocated and NUL-terminated (free with qsa_free); tokenize it with
   parse_special = 1. */
typedef struct qsa_chat_message {
    const char *role;
    const char *content;
} qsa_chat_message;
QSA_API qsa_result qsa_chat_apply_template(const qsa_tokenizer *tok, const qsa_chat_message *msgs, size_t n,
                                           int add_generation_prompt, char **out);
