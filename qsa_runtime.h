/* qsa_runtime.h - v0.1.0 - Qwen4-Exp inference runtime (CPU reference + CUDA via NVRTC) - MIT licence
 *
 * USAGE
 *   In exactly one C or C++ file:
 *       #define QSA_RUNTIME_IMPLEMENTATION
 *       #include "qsa_runtime.h"
 *   Everywhere else just #include "qsa_runtime.h".  Put kernels.cu.inc next to the header (the
 *   implementation includes it for the CUDA backend).  Link with -ldl -lm -lpthread; nothing else:
 *   libcuda.so.1, libnvrtc and libnccl.so.2 are opened at run time with dlopen.
 *
 * CONFIGURATION MACROS (define before the implementation include)
 *   QSA_MALLOC(sz) / QSA_REALLOC(p,sz) / QSA_FREE(p)   all three or none: the allocator.
 *   QSA_STATIC      make every function static (several copies in one program are fine).
 *   QSA_NO_CUDA     compile without the CUDA backend (no CUDA types, no dlopen of CUDA libraries).
 *   QSA_DEBUG       extra checks; synchronise after every kernel launch.
 *
 * QUICK START
 *       qsa_model *m;
 *       qsa_model_params mp = {0};                        // zero = defaults (backend AUTO)
 *       if (qsa_model_load("path/to/model_dir", &mp, &m) != QSA_OK) { puts(qsa_last_error()); ... }
 *       qsa_seq *s;  qsa_seq_create(m, NULL, &s);         // one request's state
 *       int32_t *ids; size_t n;
 *       qsa_tokenize(qsa_model_get_tokenizer(m), "Hello", 5, 1, &ids, &n);
 *       qsa_generate_params gp = {0};  gp.max_tokens = 64; // greedy
 *       qsa_generation g;  qsa_generate(s, ids, (int)n, &gp, &g);  puts(g.text);
 *       qsa_generation_free(&g); qsa_free(ids); qsa_seq_free(s); qsa_model_free(m);
 *   Many requests at once: qsa_sched_* (continuous batching, chunked prefill, admission by KV
 *   pages).  Full programs: examples/chat.c, examples/batch.c.
 *
 * MODEL FILES
 *   A Hugging Face directory: config.json (model_type qwen4_exp or qwen4_exp_text), model.safetensors
 *   or model.safetensors.index.json + shards, tokenizer.json, tokenizer_config.json, optionally
 *   generation_config.json and hf_quant_config.json (NVFP4 experts, ModelOpt format).  Tensor names
 *   may carry the `model.language_model.` or `model.` prefix; vision and MTP tensors are ignored.
 *
 * GPU REQUIREMENTS
 *   An NVIDIA GPU of compute capability 7.0 (V100) or newer, the driver's libcuda.so.1 and an NVRTC
 *   (libnvrtc.so.13/.12/.11.2, or $QSA_NVRTC_LIB).  Kernels are compiled for compute_70 PTX when the
 *   NVRTC can (11.8 through 12.x), else for the device's own arch ($QSA_ARCH or
 *   qsa_model_params.arch override).  Nothing CUDA is needed at build time; without a usable GPU the
 *   AUTO backend logs why and runs on the CPU.
 *
 * ERRORS AND LOGGING
 *   Every fallible call returns a qsa_result.  qsa_last_error() (thread-local) gives a message that
 *   names the call, the file/tensor/field and what was expected vs found.  The library never exits.
 *   A refused call changes nothing; a host allocation that fails gives QSA_ERR_OUT_OF_MEMORY and
 *   holds nothing it took (tests/t_oom.c fails each allocation in turn); a feed that fails part-way
 *   through its forward pass leaves its sequence refusing feeds until qsa_seq_reset.
 *   Logging goes to a callback set with qsa_set_logger(); without one the library is silent.
 *   qsa_log_stderr is a ready-made callback.
 *
 * MEMORY
 *   Checkpoints are memory-mapped, and no host copy of a weight matrix is made: the CPU backend
 *   reads dense BF16/F16/F32 matrices from the mapping (each value widened exactly to fp32 as it is
 *   used), keeps NVFP4 experts packed and reads the PLE tables there too; only vectors (norms,
 *   biases, conv taps) get fp32 copies.  The CUDA backend uploads dense weights as FP16, narrowed
 *   from the mapping (values beyond the FP16 range are reported), NVFP4 experts packed (each 4-byte
 *   word's nibbles reordered on the device for the kernels' dequantisation), each layer's experts
 *   in one device allocation; everything travels through two 64 MiB slots of pinned host memory
 *   held for the upload alone (one filled while the other's copies run).  The PLE tables stay in
 *   host memory (only gathered rows travel); on one GPU the vectors' fp32 copies are freed once
 *   uploaded.  KV pages come from one pool per model (qsa_model_params.kv_pool_tokens);
 *   per-sequence recurrent state is allocated when a sequence is created.  Under tensor
 *   parallelism replicated dense tensors are uploaded from the mapping the same way; each rank's
 *   slices of the split ones are converted to fp32 from the mapping, uploaded and freed (docs/TP.md).
 *   The CUDA backend's scratch is sized for one forward call of max_chunk
 *   tokens (qsa_model_params.max_chunk, default 512; 2048 doubles prefill speed on the real shape,
 *   docs/PERFORMANCE-LOG.md), the routed experts' outputs taking up to 256 MiB of it per sub-chunk.
 *   Host allocations go through QSA_MALLOC/QSA_REALLOC/QSA_FREE.
 *
 * KERNEL CACHE
 *   Compiled kernel modules are cached in $QSA_CACHE_DIR (default ~/.cache/qsa_runtime; "off" or
 *   "0" disables it), keyed by the kernel source, compile options, NVRTC version, target arch, driver
 *   version and library version.  Files are written to a temporary name and renamed; a corrupt or
 *   stale entry is a miss.
 *
 * THREAD SAFETY
 *   A model may be shared between threads, each with its own sequences: its weights are read-only
 *   after load, and its KV page pool, which its sequences share, has a mutex.  On the CPU backend
 *   such threads run their forward passes at the same time; on the CUDA backend a model has one
 *   stream and one set of scratch buffers, so the calls that use the device (qsa_seq_create, _free,
 *   _reset, _feed*, qsa_generate, and the scheduler's through them) hold a lock of the model and take
 *   turns (a streaming callback that waits for another thread's call on the same model deadlocks).
 *   A sequence or a scheduler must be used by one thread at a time.  The error message is per thread.
 *
 * LIFETIMES
 *   Free a model's sequences and schedulers (qsa_seq_free, qsa_sched_free) before the model: they
 *   give their KV pages back to its pool.  The tokenizer of qsa_model_get_tokenizer lives as long as
 *   the model.  Samplers and qsa_host_alloc blocks are independent of it.
 *
 * LIMITATIONS
 *   Text model only.  Tensor parallelism over NCCL (qsa_model_params.tp, docs/TP.md): one process
 *   driving several GPUs or one process per GPU; batched decode and CUDA graphs run on every rank
 *   (TP = 2 verified on two H200s, docs/TP.md); a device failure in the middle of a step is fatal to the model (the
 *   other ranks wait in their collectives).  See docs/ for what is implemented and measured
 *   (docs/PERFORMANCE.md: decode is far from the bandwidth limit today).
 *
 * SECTIONS (grep for the tag), in the order data flows
 *   >>api          public declarations
 *   >>platform     allocation, errors, logging, files, clocks, fp16/bf16
 *   >>dynload      dlopen tables for libcuda / libnvrtc / libnccl, check macros
 *   >>nvrtc        the embedded kernels (kernels.cu.inc) and their compilation, arch choice
 *   >>json         bounded, strict JSON parser
 *   >>config       config.json / generation_config.json / quantisation config
 *   >>safetensors  safetensors files and sharded indexes, dtype conversion, NVFP4 groups
 *   >>unicode      Unicode tables (regex classes, NFC) for the tokenizer (generated)
 *   >>tokenizer    byte-level BPE, added tokens, streaming decode, ChatML
 *   >>weights      binding checkpoint tensors to the model structure
 *   >>kv-pool      KV pages and the free list
 *   >>planner      QSA selections -> attention plans in logical order
 *   >>cpu-forward  the CPU reference forward pass
 *   >>sampler      greedy and seeded sampling
 *   >>generate     sequences, prefill/decode, stop conditions, statistics
 *   >>capture      capture and replay of one QSA layer
 *   >>tp-plan      how every tensor is split over TP ranks (the sharding plan)
 *   >>cuda         the CUDA backend: kernel module + disk cache, weights, device KV pool, forward
 *   >>host-memory  page-locked host buffers for what the device copies out (qsa_host_alloc)
 *   >>tp           tensor-parallel ranks: per-rank model views, threads, the rendezvous (file or TCP),
 *                  NCCL group, reductions
 *   >>scheduler    requests, continuous batching, chunked prefill, KV-page admission
 */
#ifndef QSA_RUNTIME_H
#define QSA_RUNTIME_H

/* The implementation needs POSIX (mmap, dlopen, clock_gettime); ask for it before any system
   header is seen.  Include this header first in the implementation file, or define _GNU_SOURCE. */
#if defined(QSA_RUNTIME_IMPLEMENTATION) && defined(__linux__) && !defined(_GNU_SOURCE)
#define _GNU_SOURCE
#endif

#define QSA_VERSION_MAJOR 0
#define QSA_VERSION_MINOR 1
#define QSA_VERSION_PATCH 0
#define QSA_VERSION_STRING "0.1.0"

#include <stddef.h>
#include <stdint.h>

#ifdef QSA_STATIC
#define QSA_API static
#else
#define QSA_API extern
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* ============================================================================================== */
/* >>api  public declarations                                                                      */
/* ============================================================================================== */

typedef enum qsa_result {
    QSA_OK = 0,
    QSA_ERR_INVALID_ARGUMENT, /* a parameter the caller passed is wrong */
    QSA_ERR_IO,               /* a file could not be opened/read/mapped */
    QSA_ERR_FORMAT,           /* a file is malformed (JSON, safetensors, tokenizer) */
    QSA_ERR_UNSUPPORTED,      /* valid input we do not support (dtype, model type, regex) */
    QSA_ERR_NOT_FOUND,        /* a tensor / file / token that must exist does not */
    QSA_ERR_SHAPE,            /* a tensor has the wrong shape or dtype */
    QSA_ERR_OUT_OF_MEMORY,    /* host or device allocation failed */
    QSA_ERR_CONTEXT_FULL,     /* the request does not fit the context / memory budget */
    QSA_ERR_NO_DEVICE,        /* the GPU stack is missing or has no usable device */
    QSA_ERR_CUDA,             /* a CUDA driver call failed */
    QSA_ERR_NVRTC,            /* kernel compilation failed */
    QSA_ERR_NCCL,             /* a NCCL call failed */
    QSA_ERR_CANCELLED,        /* the request was cancelled */
    QSA_ERR_INTERNAL          /* a bug: please report */
} qsa_result;

QSA_API const char *qsa_result_string(qsa_result r);
/* Detail message of the last failure on this thread ("" when none). */
QSA_API const char *qsa_last_error(void);
QSA_API void qsa_clear_error(void);

typedef enum qsa_log_level { QSA_LOG_ERROR = 0, QSA_LOG_WARN, QSA_LOG_INFO, QSA_LOG_DEBUG } qsa_log_level;
typedef void (*qsa_logger)(void *user, qsa_log_level level, const char *message);
/* Install a logger (NULL: silent).  max_level filters: QSA_LOG_INFO shows errors, warnings, info.  The
   library's worker threads log too (the kernels' parts compiling, tensor-parallel ranks): fn must be
   thread-safe. */
QSA_API void qsa_set_logger(qsa_logger fn, void *user, qsa_log_level max_level);
QSA_API void qsa_log_stderr(void *user, qsa_log_level level, const char *message);

/* Frees memory the library returned to the caller (token arrays, strings). */
QSA_API void qsa_free(void *p);


/* ---- model configuration (config.json) ---- */
#define QSA_MAX_LAYERS 512
#define QSA_MAX_EOS 16

typedef enum qsa_act { QSA_ACT_SILU = 0, QSA_ACT_SIGMOID = 1 } qsa_act;
typedef enum qsa_quant_format {
    QSA_QUANT_NONE = 0,
    QSA_QUANT_MODELOPT,          /* <base>.weight U8, .weight_scale F8_E4M3, .weight_scale_2 F32, [.input_scale] */
    QSA_QUANT_COMPRESSED_TENSORS /* <base>.weight_packed U8, .weight_scale F8_E4M3, .weight_global_scale F32 (= 1/scale_2) */
} qsa_quant_format;
#define QSA_QUANT_EXCLUDE_BYTES 8192
typedef enum qsa_layer_type { QSA_LAYER_LINEAR = 0, QSA_LAYER_QSA = 1 } qsa_layer_type;

/* Hyper-parameters of a Qwen4-Exp text model, as read from config.json (flat, or the nested
   text_config of a multimodal qwen4_exp config).  Field names follow the reference config class. */
typedef struct qsa_model_config {
    char model_type[32];               /* "qwen4_exp_text" after unwrapping */
    int vocab_size, hidden_size, num_hidden_layers;
    int num_attention_heads, num_key_value_heads, head_dim;
    int max_position_embeddings;
    float rms_norm_eps;
    qsa_act hidden_act;
    char hidden_act_name[32];
    int attention_bias, tie_word_embeddings;
    /* RoPE */
    double rope_theta;
    float partial_rotary_factor;
    int rotary_dim;                    /* int(head_dim * partial_rotary_factor), even */
    /* Gated DeltaNet */
    int linear_conv_kernel_dim, linear_key_head_dim, linear_value_head_dim;
    int linear_num_key_heads, linear_num_value_heads;
    qsa_act output_gate_act;           /* output_gate_type, else hidden_act */
    /* MoE */
    int num_experts, num_experts_per_tok, moe_intermediate_size, shared_expert_intermediate_size;
    int norm_topk_prob;
    /* hyper-connections */
    int hc_count, hc_lowrank;
    /* PLE (hashed n-gram embeddings) */
    int n_ple_layers;
    int ple_layer_ids[QSA_MAX_LAYERS]; /* one-indexed, sorted, unique */
    int ple_embed_dim, ple_conv_kernel_size, ngram_size, heads_per_ngram;
    int64_t ngram_vocab_size_base;
    int make_ngram_vocab_size_divisible_by;
    int64_t seed;
    int split_ngram_parts;
    /* QSA indexer (has_qsa = 0 when the indexer fields are absent) */
    int has_qsa;
    int indexer_n_heads, indexer_kv_heads, indexer_head_dim, indexer_budget, indexer_compress_ratio;
    /* (an indexer_budget past max_position_embeddings is lowered to the whole context's blocks at
       parse: every block is selected either way) */
    /* layers */
    uint8_t layer_types[QSA_MAX_LAYERS]; /* qsa_layer_type */
    /* special tokens (-1 when absent) */
    int n_eos;
    int32_t eos_token_ids[QSA_MAX_EOS];
    int32_t bos_token_id, pad_token_id; /* eos_token_ids[0] is the id PLE uses */
    /* quantisation: 1 when quantization_config / hf_quant_config.json announce NVFP4 */
    int nvfp4;
    int quant_group_size;              /* 16 for NVFP4 */
    qsa_quant_format quant_format;
    /* module-name patterns left unquantised (exclude_modules / ignore), NUL-separated; informative:
       whether a linear is NVFP4 is decided by the presence of its weight_scale tensor */
    int n_quant_exclude, quant_exclude_truncated;
    char quant_exclude[QSA_QUANT_EXCLUDE_BYTES];
} qsa_model_config;

/* Generation defaults from generation_config.json (absent fields keep the zero/"unset" value). */
typedef struct qsa_generation_config {
    int has_temperature, has_top_p, has_top_k, has_min_p, has_repetition_penalty, has_do_sample;
    float temperature, top_p, min_p, repetition_penalty;
    int top_k, do_sample, max_new_tokens;
    int n_eos;
    int32_t eos_token_ids[QSA_MAX_EOS];
} qsa_generation_config;

/* Parse and validate config.json text (same rules as the reference config class).  `quant_json`
   (may be NULL) is the text of hf_quant_config.json.  `source` names the file in error messages. */
QSA_API qsa_result qsa_config_parse(const char *json, size_t len, const char *quant_json, size_t quant_len,
                                    const char *source, qsa_model_config *out);
/* Reads <dir>/config.json and, if present, <dir>/hf_quant_config.json. */
QSA_API qsa_result qsa_config_load_dir(const char *dir, qsa_model_config *out);
/* 1 when `module` (e.g. "model.layers.0.mlp.gate") matches one of the glob exclude patterns ("re:" patterns of
   compressed-tensors are not evaluated). */
QSA_API int qsa_config_quant_excluded(const qsa_model_config *c, const char *module);
QSA_API qsa_result qsa_generation_config_parse(const char *json, size_t len, const char *source,
                                               qsa_generation_config *out);

/* ---- tensor parallelism: the sharding plan (docs/TP.md; the TP forward: qsa_model_params.tp) ---- */

#define QSA_TP_MAX 64      /* most ranks qsa_tp_check accepts */
#define QSA_TP_MAX_RUNS 3

/* How a tensor is split over the ranks.  Matrices are nn.Linear weights [out, in]. */
typedef enum qsa_tp_kind {
    QSA_TP_REPLICATED, /* every rank holds the whole tensor */
    QSA_TP_ROWS,       /* split dim 0 (output rows): colwise */
    QSA_TP_COLS        /* split dim 1 (input columns): rowwise */
} qsa_tp_kind;

/* One rank's slice of one checkpoint tensor.  The rank holds, along dimension `dim`, the indices
   [run_begin[i], run_begin[i] + run_count[i]) for i < n_runs, in that order, and every index of the
   other dimensions.  For NVFP4 tensors the runs are in the stored tensor's units: the packed weight
   [out, in/2] and the block scales [out, in/16] of a column split cover exactly the logical columns
   [2*begin, ...) and [16*begin, ...) of the matrix. */
typedef struct qsa_tp_slice {
    qsa_tp_kind kind;
    int64_t begin, count;  /* along the split dim: the first run's start, and the indices held in all
                              (the sum of run_count); 0, 0 when REPLICATED */
    int64_t shape[3];      /* the rank's local shape (ndim entries, then 1s; a scalar is [1]) */
    int64_t global[3];     /* the whole tensor's shape, same convention */
    int ndim;              /* the tensor's rank: 0 (scalar), 1, 2 or 3 (conv1d [C, 1, K], fused experts) */
    int dim;               /* index of the split dim in the shape (-1 when REPLICATED): 0 for ROWS of a
                              matrix or vector, 1 for COLS; 1 / 2 for the fused [E, out, in] experts */
    int copies;            /* ranks that hold this same slice: 1 for a split, tp when REPLICATED,
                              tp / num_key_value_heads for k_proj / v_proj when tp > num_key_value_heads */
    int n_runs;            /* 0 when REPLICATED; 2 for experts.gate_up_proj (gate rows, up rows); 3 for
                              the GDN q | k | v channels (in_proj_qkv, conv1d) */
    int64_t run_begin[QSA_TP_MAX_RUNS], run_count[QSA_TP_MAX_RUNS];
} qsa_tp_slice;

/* QSA_OK when the model can be split over `tp` ranks (1..QSA_TP_MAX; any count for which every split
   below divides, not only powers of two).  Otherwise QSA_ERR_INVALID_ARGUMENT with a message naming
   every config field that does not divide.  The rules: query heads split evenly and each rank's heads
   use whole KV heads (num_key_value_heads % tp == 0) or share one (tp % num_key_value_heads == 0: the
   KV head is replicated on tp / num_key_value_heads ranks); linear_num_key_heads % tp == 0 (value
   heads follow their key heads); moe_intermediate_size and shared_expert_intermediate_size % tp == 0;
   the PLE columns per n-gram head (ple_embed_dim / n_heads) % tp == 0; vocab_size >= tp (a remainder
   goes to the last ranks); and every column-split linear that the config quantises to NVFP4 keeps
   whole groups of quant_group_size (16) columns per rank. */
QSA_API qsa_result qsa_tp_check(const qsa_model_config *c, int tp);
/* The slice rank `rank` of `tp` holds of checkpoint tensor `tensor`, named relative to the text model
   ("layers.3.self_attn.q_proj.weight", "lm_head.weight"; a "model." or "model.language_model."
   prefix is accepted).  Covers every tensor the loader binds, dense or NVFP4 (ModelOpt .weight,
   .weight_scale, .weight_scale_2, .input_scale; compressed-tensors .weight_packed,
   .weight_global_scale, .input_global_scale), per-expert or fused experts, PLE tables whole or in
   shards.  Whether a `.weight` is packed NVFP4 is decided from the config (quantization_config and
   its exclude list).  QSA_ERR_NOT_FOUND for names the model does not have (unknown, wrong layer type,
   layer or expert out of range), the qsa_tp_check error when tp does not fit. */
QSA_API qsa_result qsa_tp_slice_for(const qsa_model_config *c, int tp, int rank, const char *tensor, qsa_tp_slice *out);
/* Communication of one forward step per token that produces logits, per rank, under the runtime's
   deterministic scheme: an all-gather of fp32 partial sums after each row-parallel block (2 per
   layer: the mixer's o_proj / out_proj, and the MoE's expert + shared-expert down projections summed
   locally), an all-gather of the PLE embedding columns per PLE layer, and an all-gather of the
   vocab-parallel logits.  *bytes = bytes each rank sends (ring or direct all-gather:
   (tp - 1) * its contribution), *collectives = collective calls.  Both 0 when tp == 1. */
QSA_API qsa_result qsa_tp_comm_per_token(const qsa_model_config *c, int tp, int64_t *bytes, int *collectives);

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
#define QSA_DETOK_SKIP_UNKNOWN 2 /* ids >= 0 the tokenizer has no token for give no text (as `tokenizers`
                                    decode drops them): a model's padded vocabulary rows (config vocab_size
                                    past the tokenizer's ids) are real outputs; without it, an error */
/* Ids -> text like `tokenizers` decode: pieces concatenated, invalid UTF-8 replaced by U+FFFD
   (maximal subparts).  *text is allocated and NUL-terminated (free with qsa_free). */
QSA_API qsa_result qsa_detokenize(const qsa_tokenizer *tok, const int32_t *ids, size_t n, int flags,
                                  char **text, size_t *len);

/* Streaming detokenizer: push ids one at a time and get back only complete UTF-8 text; a
   multi-byte character split over several tokens is held back until complete.  Bytes that can
   never become valid are replaced by U+FFFD at once; an incomplete tail becomes U+FFFD at flush.
   The concatenation of all outputs equals qsa_detokenize of all ids.  init sets every field (a
   stream used before must have been freed); returned text stays valid until the next call on the
   stream.  Free with qsa_detok_stream_free. */
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
   when it has none).  A role or content that is not well-formed UTF-8 is refused, the error naming
   the message and the byte offset in it.  *out is allocated and NUL-terminated (free with qsa_free);
   tokenize it with parse_special = 1. */
typedef struct qsa_chat_message {
    const char *role;
    const char *content;
} qsa_chat_message;
QSA_API qsa_result qsa_chat_apply_template(const qsa_tokenizer *tok, const qsa_chat_message *msgs, size_t n,
                                           int add_generation_prompt, char **out);

/* ---- models, sequences, sampling, generation ---- */

typedef enum qsa_backend { QSA_BACKEND_AUTO = 0, QSA_BACKEND_CPU, QSA_BACKEND_CUDA } qsa_backend;

/* Zero-initialise, set what you need; qsa_model_load fills the rest with defaults. */
typedef struct qsa_model_params {
    qsa_backend backend;     /* AUTO: CUDA when usable, else CPU */
    int n_threads;           /* CPU threads (0: number of online CPUs, at most 16) */
    int gdn_chunked_prefill; /* 1: prefill Gated DeltaNet with the chunked (UT transform) form; 0: recurrence.
                                CPU backend only: the CUDA backend always runs the recurrence */
    int gdn_chunk_size;      /* chunk length of that form (0: 64, as the reference) */
    int no_tokenizer;        /* 1: do not load tokenizer files even if present */
    int kv_page_size;        /* tokens per KV page (any value >= 16; 0: the hybrid rule of docs/DETERMINISM.md) */
    int kv_pool_tokens;      /* KV pool capacity in tokens, shared by all sequences (0: min(context, 32768)) */
    int debug_physical_order;/* 1: order attention plans by physical page (breaks allocation invariance; tests only) */
    int device;              /* CUDA device ordinal */
    const char *arch;        /* NVRTC target ("compute_70", "sm_90", ...; NULL: $QSA_ARCH, else compute_70 when the
                                NVRTC supports it, else the device's own: sm_NN, a CUBIN, where the NVRTC makes one) */
    int max_chunk;           /* most tokens per forward call on the GPU; longer feeds are split (0: 512) */
    int gdn_state_f16;       /* 1: keep the GDN recurrent state in FP16 on the GPU (comparison option; default FP32) */
    int max_batch;           /* most sequences per batched decode step on the GPU (qsa_seq_feed_batch; larger
                                batches run in groups of this size; 0: 32).  Sizes the per-step device buffers */
    int cuda_batch_decode;   /* 0 or 1 (default: on): qsa_seq_feed_batch runs one batched forward for all its
                                sequences on the GPU (same bits per sequence as feeding it alone: batch invariance,
                                tests/t_gpu.c), and so does qsa_seq_feed of one token (a batch of one: with
                                cuda_graphs, a graph replay); -1: sequences are fed one at a time through the
                                chunked forward */
    int cuda_graphs;         /* 0 or 1 (default: on, with cuda_batch_decode): replay batched decode steps as CUDA
                                graphs (one per batch size, captured at first use; same bits as eager; on one GPU a
                                size whose capture fails runs eagerly, with a warning); -1: eager.  Ignored with
                                QSA_DEBUG */
    /* Tensor parallelism over NCCL (docs/TP.md; CUDA backend).  tp ranks split the model; every rank ends
       each step with bitwise-identical hidden states and logits.  Two ways to form the group:
         one process:   tp GPUs of this process (tp_devices, else device, device+1, ...), one host thread
                        per GPU, communicator from ncclCommInitAll.  Leave tp_rendezvous NULL.
         one process per rank (several processes or hosts): set tp_rendezvous and tp_rank; this process is
                        rank tp_rank on GPU `device`.  Every process must run the same requests in the same
                        order (SPMD, like torchrun); each gets the same logits. */
    int tp;                     /* ranks in the group (0 or 1: no tensor parallelism) */
    const int *tp_devices;      /* one process: tp CUDA ordinals, rank i on tp_devices[i] (NULL: consecutive from `device`) */
    const char *tp_rendezvous;  /* several processes: where the ranks meet, new for each launch.  Either a file path
                                   every rank can see (rank 0 writes the NCCL unique id there and removes it once the
                                   group is formed; the others wait for it), or "tcp://HOST:PORT": rank 0 listens on
                                   the address HOST resolves to ("*" or 0.0.0.0: every IPv4 interface, [::]: every
                                   IPv6 one) and hands the id to each other rank, which connects to HOST; an IPv6
                                   literal goes in brackets (tcp://[::1]:29500).  NULL: one process drives all ranks */
    int tp_rank;                /* with tp_rendezvous: this process's rank, 0 .. tp-1 */
    int tp_timeout_s;           /* with tp_rendezvous: seconds a rank waits for the id; with tcp://, also how long
                                   rank 0 waits for every other rank to take it (0: 300) */
} qsa_model_params;

typedef struct qsa_model qsa_model;

QSA_API qsa_result qsa_model_load(const char *model_dir, const qsa_model_params *params, qsa_model **out);
QSA_API void qsa_model_free(qsa_model *model);
/* NULL for a NULL model. */
QSA_API const qsa_model_config *qsa_model_get_config(const qsa_model *model);
/* The tokenizer loaded from the model directory, or NULL when the directory has none. */
QSA_API const qsa_tokenizer *qsa_model_get_tokenizer(const qsa_model *model);
QSA_API const qsa_generation_config *qsa_model_get_generation_config(const qsa_model *model);
/* Host memory for the buffers a model's calls fill, logits above all.  On the CUDA backend it is
   page-locked, so the device's copies into it run by DMA at the link's rate (into pageable memory
   the driver stages them at a fraction of it: 32 MiB, a batch of 32 rows of logits at the real
   vocabulary, took 2.0-3.9 ms against 0.61-0.64 ms on the H200 host of docs/PERFORMANCE-LOG.md, and
   batch 32 decoded ~7% faster); on the CPU backend, or when page-locking fails (logged as a
   warning), ordinary memory.  16-byte aligned, usable like malloc's (any thread, any model); free it
   with qsa_host_free, before or after the model is freed.  NULL (with qsa_last_error) for 0 bytes or
   when out of memory.  qsa_generate and the scheduler take their logits from it. */
QSA_API void *qsa_host_alloc(const qsa_model *model, size_t bytes);
/* Frees a block of qsa_host_alloc (NULL: nothing). */
QSA_API void qsa_host_free(void *p);

/* Tensor-parallel state of a model and the runtime's count of its communication (docs/TP.md). */
typedef struct qsa_tp_info {
    int tp;                 /* ranks in the group (1 without tensor parallelism) */
    int first_rank, n_local;/* the ranks this process drives: first_rank .. first_rank + n_local - 1 */
    long long collectives;  /* NCCL collectives one rank issued since load or the last reset */
    long long bytes_sent;   /* bytes one rank sent in them: (tp - 1) x its contribution to each all-gather */
    long long bytes_contributed; /* bytes one rank contributed (the send buffers' sizes) */
} qsa_tp_info;
QSA_API void qsa_model_tp_info(const qsa_model *model, qsa_tp_info *out);
QSA_API void qsa_model_tp_reset_counters(qsa_model *model);

/* A sequence: one request's recurrent state, KV cache and position.  Tokens are fed in order;
   any split into chunks gives the same result as feeding them at once. */
typedef struct qsa_seq qsa_seq;
typedef struct qsa_seq_params {
    int n_ctx;               /* maximum tokens (prompt + generated), at most max_position_embeddings (more is
                                refused); 0: max_position_embeddings */
} qsa_seq_params;

QSA_API qsa_result qsa_seq_create(qsa_model *model, const qsa_seq_params *params, qsa_seq **out);
QSA_API void qsa_seq_free(qsa_seq *seq);
/* Forget everything fed so far (keeps the allocation).  Should the device state's zeroing fail (a
   device error), the sequence refuses feeds, as after a failed feed, until a reset succeeds. */
QSA_API void qsa_seq_reset(qsa_seq *seq);
QSA_API int qsa_seq_pos(const qsa_seq *seq); /* tokens fed so far (0 for NULL) */
/* Feed n tokens.  logits (may be NULL): receives vocab_size floats for the last token, or
   n * vocab_size floats (row i for token i) when all_logits is non-zero.  A refusal (bad ids, a full
   context, no KV pages) changes nothing.  A failure part-way through the forward pass (out of memory,
   a device error) leaves some layers' states advanced: the sequence then refuses every feed (of 0
   tokens too), saying so, until qsa_seq_reset. */
QSA_API qsa_result qsa_seq_feed(qsa_seq *seq, const int32_t *ids, int n, float *logits, int all_logits);
/* One decode step for n sequences of one model: tokens[i] is fed to seqs[i] (distinct sequences);
   logits (may be NULL) receives n * vocab_size floats, row i for sequence i.  Bitwise the same as
   qsa_seq_feed(seqs[i], &tokens[i], 1, row i, 0) for each i, whatever the other sequences and their
   order (on the CPU backend it is that loop; on CUDA one forward pass for the batch).  Every
   sequence is checked (context, vocabulary, KV pages) before anything changes: a refusal leaves all
   of them as they were.  A failure during the forward pass (device error, out of memory) may leave
   some sequences advanced (qsa_seq_pos tells which) and others refusing feeds until qsa_seq_reset,
   as qsa_seq_feed does. */
QSA_API qsa_result qsa_seq_feed_batch(qsa_seq **seqs, const int32_t *tokens, int n, float *logits);
/* The same step, returning each sequence's greedy next token instead of its logits: next[i] = the
   id of the largest logit of row i (the lowest id among equal maxima; NaN never wins), the token
   qsa_sampler_sample picks at temperature 0.  On CUDA the arg-max runs on the device and n ids cross
   to the host instead of n * vocab_size floats.  next may be tokens itself (a greedy loop's one array). */
QSA_API qsa_result qsa_seq_feed_batch_greedy(qsa_seq **seqs, const int32_t *tokens, int n, int32_t *next);

/* Sampling.  Zero-initialised = greedy.  temperature 0 = greedy (argmax, lowest id on ties). */
typedef struct qsa_sampling_params {
    float temperature;        /* 0: greedy */
    int top_k;                /* 0: off */
    float top_p;              /* 0 or 1: off */
    float min_p;              /* 0: off */
    float repetition_penalty; /* 0 or 1: off (CTRL-style: logit/p if > 0 else logit*p) */
    int penalty_last_n;       /* tokens looked back for the penalty (0: 64, -1: whole history; < -1 refused) */
    uint64_t seed;            /* RNG seed (same seed + same logits = same tokens) */
} qsa_sampling_params;

typedef struct qsa_sampler qsa_sampler;
QSA_API qsa_result qsa_sampler_create(const qsa_sampling_params *params, qsa_sampler **out);
QSA_API void qsa_sampler_free(qsa_sampler *s);
/* Pick a token from logits[vocab] given the history (for the repetition penalty).  logits are
   modified in place.  A NaN logit is never picked; where a logit is infinite, or the temperature (or the
   penalty) so small that a logit over it overflows, the pick is the arg-max, the limit of a vanishing
   temperature.  -1 on a NULL sampler or logits or vocab < 1 (QSA_ERR_INVALID_ARGUMENT), or when it cannot
   allocate its work buffers (a first sampling call at temperature > 0 or with a repetition penalty, at
   this vocabulary size: QSA_ERR_OUT_OF_MEMORY, in qsa_last_error()); the logits are then as they came.
   The draw: repetition penalty, temperature, the ids ordered by logit (lower id first on ties) and cut to the top-k,
   probabilities exp(l - max) over their sum (in order; a top-p or min-p draw without a top-k below the vocabulary, at
   fewer than 2^20 ids: over the whole row's sum of integers ~2^44 e^(l - max) (qsa__zterm's definition, in units of
   2^-44), which a GPU adds in any order),
   then top-p, then min-p, then one uniform draw from the seeded generator.  A draw with neither a top-k below the
   vocabulary nor top-p nor min-p (the temperature alone), at fewer than 2^20 ids, is made in those integers: the
   uniform draw u times the row's sum, rounded down, taken against the running sum of the ids' integers in order (the
   first id that passes it). */
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
   token -1 for text still held at the end.  Return non-zero to stop: no call follows, and text held
   back by then is not passed (it is in the generation's text). */
typedef int (*qsa_token_callback)(void *user, int32_t token, const char *text, size_t len);

typedef struct qsa_generate_params {
    qsa_sampling_params sampling;
    int max_tokens;                   /* 0: until EOS or the context is full (negative: refused) */
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
    char *text;               /* their text, without a matched stop string; special tokens and ids past the
                                 tokenizer (padded vocabulary rows) give none (free with qsa_free) */
    size_t text_len;
    qsa_stop_reason stop;
    qsa_stats stats;
} qsa_generation;

/* Feed the prompt, then sample and feed tokens until a stop condition.  The last generated
   token is not fed to the sequence (the caller feeds it, e.g. as the start of the next turn).
   On one GPU a decode step of a greedy or top-k (<= 1,024) sampler reduces the logits to the draw's
   candidates on the device (qsa_sched_step's steps do the same; $QSA_SAMPLE_DEVICE=0: off): the same tokens.
   A failure part-way through the generation (the KV page pool runs out: it is shared and taken a page
   at a time; the device) returns its error with out holding the tokens generated so far, their text
   and statistics (stop QSA_STOP_NONE), and the sequence holding everything fed; otherwise a failure
   leaves out empty.  Free out with qsa_generation_free whatever the result. */
QSA_API qsa_result qsa_generate(qsa_seq *seq, const int32_t *prompt, int n_prompt, const qsa_generate_params *params,
                                qsa_generation *out);
QSA_API void qsa_generation_free(qsa_generation *g);

/* Capture/replay (debugging the determinism contract; see docs/DETERMINISM.md).  Record QSA layer
   `layer` of a sequence from now on: each query's q|gate, block selection, attention plan and gated
   output.  _end writes them with the layer's K/V pages and block table to a safetensors file and ends
   the capture; when it fails (a path it cannot write, out of memory) the capture goes on and _end can
   be called again.  A _begin that fails leaves a capture in progress as it was; qsa_seq_reset drops
   the queries recorded so far (their KV pages are given back) and the capture goes on. */
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
                          (0: min(4096, max_position_embeddings); more than max_position_embeddings
                          is refused) */
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
    int n_messages;                    /* > 0 (with the assistant generation prompt appended) */
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
       is fed after what the sequence holds, within its n_ctx (n_ctx above is not used).  A sequence
       that refuses feeds (below) is refused at submit.  NULL: a new sequence, owned and
       freed by the scheduler.  The caller must not use the sequence while the request is live;
       afterwards it holds everything fed (as with qsa_generate, not the last generated token), or,
       after a failure part-way through a feed, refuses feeds until qsa_seq_reset. */
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
/* Cancels every live request (caller-owned sequences keep what was fed), frees all records.  Not
   from inside a step (a callback): there it frees nothing and says so (log and qsa_last_error). */
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

#ifdef __cplusplus
}
#endif
#endif /* QSA_RUNTIME_H */

/* ============================================================================================== */
/*                                        IMPLEMENTATION                                          */
/* ============================================================================================== */
#ifdef QSA_RUNTIME_IMPLEMENTATION
#ifndef QSA_RUNTIME_IMPLEMENTATION_DONE
#define QSA_RUNTIME_IMPLEMENTATION_DONE

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <pthread.h>
#include <dlfcn.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#ifndef O_CLOEXEC
#define O_CLOEXEC 0
#endif
#ifndef MSG_NOSIGNAL /* systems without it have SO_NOSIGPIPE, set on every socket (>>tp) */
#define MSG_NOSIGNAL 0
#endif

#if defined(QSA_MALLOC) && defined(QSA_REALLOC) && defined(QSA_FREE)
#elif !defined(QSA_MALLOC) && !defined(QSA_REALLOC) && !defined(QSA_FREE)
#define QSA_MALLOC(sz) malloc(sz)
#define QSA_REALLOC(p, sz) realloc(p, sz)
#define QSA_FREE(p) free(p)
#else
#error "qsa_runtime.h: define all of QSA_MALLOC, QSA_REALLOC and QSA_FREE, or none"
#endif

#if defined(__GNUC__) || defined(__clang__)
#define QSA__PRINTF(a, b) __attribute__((format(printf, a, b)))
#define QSA__UNUSED __attribute__((unused))
#define QSA__TLS __thread
#define QSA__RESTRICT __restrict__
#else
#define QSA__PRINTF(a, b)
#define QSA__UNUSED
#define QSA__TLS _Thread_local
#define QSA__RESTRICT
#endif

#ifdef QSA_STATIC
#define QSA_IMPL static QSA__UNUSED
#else
#define QSA_IMPL
#endif
/* private helpers are always static (and may be unused in a given configuration) */
#define QSA_PRIV static QSA__UNUSED


#ifdef __cplusplus
#define QSA__CAST(T, x) (static_cast<T>(x))
#else
#define QSA__CAST(T, x) ((T)(x))
#endif
/* typed allocation: works in C and C++ */
#define QSA__ALLOC(T, n) ((T *)qsa__malloc(sizeof(T) * (size_t)(n)))
#define QSA__CALLOC(T, n) ((T *)qsa__calloc((size_t)(n), sizeof(T)))
#define QSA__DEF(v, d) do { if (!(v)) (v) = (d); } while (0)

/* ============================================================================================== */
/* >>platform  allocation, errors, logging, files, clocks                                          */
/* ============================================================================================== */

static QSA__TLS char qsa__err_buf[1024];
static qsa_logger qsa__logger_fn;
static void *qsa__logger_user;
static qsa_log_level qsa__logger_max = QSA_LOG_INFO;

QSA_PRIV void *qsa__malloc(size_t n) { return QSA_MALLOC(n ? n : 1); }
QSA_PRIV void *qsa__realloc(void *p, size_t n) { return QSA_REALLOC(p, n ? n : 1); }
QSA_PRIV void qsa__free(void *p) { if (p) QSA_FREE(p); }
QSA_PRIV void *qsa__calloc(size_t n, size_t sz) {
    if (sz && n > SIZE_MAX / sz) return NULL;
    void *p = qsa__malloc(n * sz);
    if (p) memset(p, 0, n * sz);
    return p;
}
QSA_PRIV char *qsa__strdup(const char *s) {
    size_t n = strlen(s) + 1;
    char *d = QSA__ALLOC(char, n);
    if (d) memcpy(d, s, n);
    return d;
}
QSA_PRIV char *qsa__strndup(const char *s, size_t n) {
    char *d = QSA__ALLOC(char, n + 1);
    if (d) { memcpy(d, s, n); d[n] = 0; }
    return d;
}

QSA_IMPL void qsa_free(void *p) { qsa__free(p); }

QSA_IMPL const char *qsa_result_string(qsa_result r) {
    switch (r) {
    case QSA_OK: return "ok";
    case QSA_ERR_INVALID_ARGUMENT: return "invalid argument";
    case QSA_ERR_IO: return "i/o error";
    case QSA_ERR_FORMAT: return "malformed input";
    case QSA_ERR_UNSUPPORTED: return "unsupported";
    case QSA_ERR_NOT_FOUND: return "not found";
    case QSA_ERR_SHAPE: return "wrong shape or dtype";
    case QSA_ERR_OUT_OF_MEMORY: return "out of memory";
    case QSA_ERR_CONTEXT_FULL: return "context or memory budget exceeded";
    case QSA_ERR_NO_DEVICE: return "no usable GPU";
    case QSA_ERR_CUDA: return "CUDA error";
    case QSA_ERR_NVRTC: return "NVRTC error";
    case QSA_ERR_NCCL: return "NCCL error";
    case QSA_ERR_CANCELLED: return "cancelled";
    case QSA_ERR_INTERNAL: return "internal error";
    }
    return "unknown result";
}

QSA_IMPL const char *qsa_last_error(void) { return qsa__err_buf; }
QSA_IMPL void qsa_clear_error(void) { qsa__err_buf[0] = 0; }

QSA_PRIV void qsa__log(qsa_log_level level, const char *fmt, ...) QSA__PRINTF(2, 3);
QSA_PRIV void qsa__log(qsa_log_level level, const char *fmt, ...) {
    if (!qsa__logger_fn || level > qsa__logger_max) return;
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    qsa__logger_fn(qsa__logger_user, level, buf);
}

/* Record a failure: the message is kept per thread and logged at debug level; returns r so that
   callers can write `return qsa__fail(QSA_ERR_IO, "open %s: %s", path, strerror(errno));`. */
QSA_PRIV qsa_result qsa__fail(qsa_result r, const char *fmt, ...) QSA__PRINTF(2, 3);
QSA_PRIV qsa_result qsa__fail(qsa_result r, const char *fmt, ...) {
    char msg[sizeof qsa__err_buf]; /* (an argument may be the message before: qsa_last_error()) */
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    memcpy(qsa__err_buf, msg, sizeof msg);
    qsa__log(QSA_LOG_DEBUG, "error (%s): %s", qsa_result_string(r), qsa__err_buf);
    return r;
}
/* For clang's static analyzer (`make analyze`): qsa__fail returns its code (the analyzer does not follow a
   variadic call, and took error paths for successes); QSA__INVARIANT(c), an invariant the code relies on
   that the analyzer cannot derive (a bound the config's checks established, a pointer every successful
   path sets), is its premise.  Nothing in a build. */
#ifdef __clang_analyzer__
#define qsa__fail(r, ...) (qsa__fail((r), __VA_ARGS__), (r))
#define QSA__INVARIANT(c) do { if (!(c)) __builtin_unreachable(); } while (0)
#else
#define QSA__INVARIANT(c) ((void)0)
#endif
#define QSA__TRY(expr) do { qsa_result qsa__r_ = (expr); if (qsa__r_ != QSA_OK) return qsa__r_; } while (0)

QSA_IMPL void qsa_set_logger(qsa_logger fn, void *user, qsa_log_level max_level) {
    qsa__logger_fn = fn;
    qsa__logger_user = user;
    qsa__logger_max = max_level;
}
QSA_IMPL void qsa_log_stderr(void *user, qsa_log_level level, const char *message) {
    static const char *names[] = {"error", "warn", "info", "debug"};
    (void)user;
    fprintf(stderr, "qsa %s: %s\n", names[level <= QSA_LOG_DEBUG ? level : QSA_LOG_DEBUG], message);
}

QSA_PRIV double qsa__now(void) {
    struct timespec ts;
#ifdef CLOCK_MONOTONIC
    clock_gettime(CLOCK_MONOTONIC, &ts);
#else
    timespec_get(&ts, TIME_UTC);
#endif
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* A read-only file mapping.  Empty files map to a NULL pointer with size 0. */
typedef struct qsa__map {
    const uint8_t *data;
    size_t size;
    char *path;
} qsa__map;

QSA_PRIV qsa_result qsa__map_file(const char *path, qsa__map *m) {
    memset(m, 0, sizeof *m);
    /* O_NONBLOCK: a FIFO in the file's place opens at once and fails the S_ISREG check below instead of
       blocking open() until some writer appears (no effect on a regular file or its mapping) */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) return qsa__fail(QSA_ERR_IO, "open '%s': %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return qsa__fail(QSA_ERR_IO, "'%s' is not a regular file", path);
    }
    m->size = (size_t)st.st_size;
    if (m->size) {
        void *p = mmap(NULL, m->size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (p == MAP_FAILED) {
            close(fd);
            return qsa__fail(QSA_ERR_IO, "mmap '%s' (%zu bytes): %s", path, m->size, strerror(errno));
        }
        m->data = (const uint8_t *)p;
    }
    close(fd);
    m->path = qsa__strdup(path);
    if (!m->path) {
        if (m->size) munmap((void *)m->data, m->size);
        return qsa__fail(QSA_ERR_OUT_OF_MEMORY, "map '%s': out of memory", path);
    }
    return QSA_OK;
}
QSA_PRIV void qsa__unmap(qsa__map *m) {
    if (m->data && m->size) munmap((void *)m->data, m->size);
    qsa__free(m->path);
    memset(m, 0, sizeof *m);
}

/* Whole file into a NUL-terminated buffer (for small JSON files). */
QSA_PRIV qsa_result qsa__read_file(const char *path, char **out, size_t *len) {
    qsa__map m;
    QSA__TRY(qsa__map_file(path, &m));
    char *buf = QSA__ALLOC(char, m.size + 1);
    if (!buf) { qsa__unmap(&m); return qsa__fail(QSA_ERR_OUT_OF_MEMORY, "read '%s': out of memory", path); }
    if (m.size) memcpy(buf, m.data, m.size);
    buf[m.size] = 0;
    *out = buf;
    if (len) *len = m.size;
    qsa__unmap(&m);
    return QSA_OK;
}

/* Environment switches read strictly (the CUDA backend's tuning, QSA_PDL): a value that is not a whole
   number in [lo, hi] (for a switch: "0" or "1") is named in a warning and the default stands (atoi read
   "8M" as 8, "auto" as 0, 99999999999 as 1215752191, and "off" did not turn a switch off). */
QSA_PRIV long long qsa__env_int(const char *name, long long lo, long long hi, long long def) {
    const char *e = getenv(name);
    if (!e || !e[0]) return def;
    char *end = NULL;
    errno = 0;
    long long v = strtoll(e, &end, 10);
    if (errno || end == e || *end || v < lo || v > hi) {
        qsa__log(QSA_LOG_WARN, "%s=%.40s is not a whole number from %lld to %lld: using %lld", name, e, lo, hi, def);
        return def;
    }
    return v;
}
QSA_PRIV int qsa__env_flag(const char *name, int def) { return (int)qsa__env_int(name, 0, 1, def); }

QSA_PRIV int qsa__file_exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

/* dir + "/" + name into a new string */
QSA_PRIV char *qsa__path_join(const char *dir, const char *name) {
    size_t a = strlen(dir), b = strlen(name);
    char *p = QSA__ALLOC(char, a + b + 2);
    if (!p) return NULL;
    memcpy(p, dir, a);
    size_t k = a;
    if (a && dir[a - 1] != '/') p[k++] = '/';
    memcpy(p + k, name, b + 1);
    return p;
}

/* Growable array of bytes, used to build strings and buffers. */
typedef struct qsa__buf {
    char *data;
    size_t len, cap;
} qsa__buf;
QSA_PRIV int qsa__buf_reserve(qsa__buf *b, size_t extra) {
    if (b->len + extra + 1 <= b->cap) return 1;
    size_t cap = b->cap ? b->cap : 64;
    while (cap < b->len + extra + 1) cap *= 2;
    char *d = (char *)qsa__realloc(b->data, cap);
    if (!d) return 0;
    d[b->len] = 0; /* data is a C string at every moment, also before the first put */
    b->data = d;
    b->cap = cap;
    return 1;
}
QSA_PRIV int qsa__buf_put(qsa__buf *b, const void *p, size_t n) {
    if (!qsa__buf_reserve(b, n)) return 0;
    if (n) memcpy(b->data + b->len, p, n);
    b->len += n;
    b->data[b->len] = 0;
    return 1;
}
QSA_PRIV int qsa__buf_puts(qsa__buf *b, const char *s) { return qsa__buf_put(b, s, strlen(s)); }
QSA_PRIV void qsa__buf_free(qsa__buf *b) { qsa__free(b->data); memset(b, 0, sizeof *b); }

/* fp16 / bf16 <-> fp32 (bit exact, round to nearest even) */
QSA_PRIV float qsa__f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h >> 15) << 31, exp = (h >> 10) & 0x1f, man = h & 0x3ff, bits;
    if (exp == 0) {
        if (man == 0) bits = sign;
        else { /* subnormal */
            int e = -1;
            do { e++; man <<= 1; } while (!(man & 0x400));
            bits = sign | ((uint32_t)(127 - 15 - e) << 23) | ((man & 0x3ff) << 13);
        }
    } else if (exp == 31) bits = sign | 0x7f800000u | (man << 13);
    else bits = sign | ((exp + 112) << 23) | (man << 13);
    float f;
    memcpy(&f, &bits, 4);
    return f;
}
QSA_PRIV uint16_t qsa__f32_to_f16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000, ax = x & 0x7fffffffu;
    if (ax >= 0x7f800000u) return (uint16_t)(sign | 0x7c00 | (ax > 0x7f800000u ? 0x200 : 0));
    if (ax >= 0x477ff000u) return (uint16_t)(sign | 0x7c00); /* rounds to >= 65520: inf */
    if (ax < 0x38800000u) { /* subnormal or zero in fp16 */
        if (ax < 0x33000000u) return (uint16_t)sign; /* < 2^-25 rounds to zero */
        uint32_t e = ax >> 23, man = (ax & 0x7fffff) | 0x800000;
        uint32_t shift = 126 - e; /* 14..24 */
        uint32_t half = man >> shift, rem = man & ((1u << shift) - 1), mid = 1u << (shift - 1);
        if (rem > mid || (rem == mid && (half & 1))) half++;
        return (uint16_t)(sign | half);
    }
    uint32_t r = ax + 0xfff + ((ax >> 13) & 1) - 0x38000000u; /* rebias 127->15, round to nearest even */
    return (uint16_t)(sign | (r >> 13));
}
QSA_PRIV float qsa__bf16_to_f32(uint16_t h) {
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}
QSA_PRIV uint16_t qsa__f32_to_bf16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40);
    x += 0x7fff + ((x >> 16) & 1);
    return (uint16_t)(x >> 16);
}

/* fn(ctx, k, i0, i1) over [0, n) cut in nt slices k = 0 .. nt - 1 (at most QSA__PAR_MAX), each on a thread
   of its own; this thread takes slice 0 and any whose thread did not start.  For a load's bulk
   conversions each slice's thread is also the first to touch its part of a fresh buffer, so the kernel's
   zeroing of those pages (most of a large load's time) runs in parallel too; the CPU matmuls split rows. */
#define QSA__PAR_MAX 16
typedef void (*qsa__range_fn)(void *ctx, int k, size_t i0, size_t i1);
typedef struct qsa__range_job {
    qsa__range_fn fn;
    void *ctx;
    int k;
    size_t i0, i1;
} qsa__range_job;
QSA_PRIV void *qsa__range_thread(void *a) {
    const qsa__range_job *j = (const qsa__range_job *)a;
    j->fn(j->ctx, j->k, j->i0, j->i1);
    return NULL;
}
QSA_PRIV void qsa__par_ranges(size_t n, int nt, qsa__range_fn fn, void *ctx) {
    if (nt > QSA__PAR_MAX) nt = QSA__PAR_MAX;
    if (nt < 1) nt = 1;
    pthread_t th[QSA__PAR_MAX];
    qsa__range_job jobs[QSA__PAR_MAX];
    int started[QSA__PAR_MAX] = {0};
    for (int k = 0; k < nt; k++) {
        jobs[k].fn = fn;
        jobs[k].ctx = ctx;
        jobs[k].k = k;
        jobs[k].i0 = n * (size_t)k / (size_t)nt;
        jobs[k].i1 = n * (size_t)(k + 1) / (size_t)nt;
        if (k) started[k] = pthread_create(&th[k], NULL, qsa__range_thread, &jobs[k]) == 0;
    }
    for (int k = 0; k < nt; k++)
        if (!started[k]) qsa__range_thread(&jobs[k]);
    for (int k = 1; k < nt; k++)
        if (started[k]) pthread_join(th[k], NULL);
}
/* Threads for a bulk conversion of n elements: one below 4 M elements, else up to nt */
QSA_PRIV int qsa__par_threads(size_t n, int nt) { return n < ((size_t)4 << 20) ? 1 : nt; }

/* ============================================================================================== */
/* >>dynload  dlopen tables for libcuda / libnvrtc / libnccl                                       */
/* ============================================================================================== */
/* The GPU stack is never linked: libcuda.so.1, libnvrtc and libnccl.so.2 are opened with dlopen
 * at first use and their entry points bound into function tables generated from X-macro lists
 * `X(ret, name, args)`.  Table members carry the exported symbol names, including the `_v2`
 * suffixes that cuda.h's macros would select (cuMemAlloc_v2, ...), so calls read as
 * `qsa__cu.cuMemAlloc_v2(&p, n)`.  The few CUDA/NVRTC/NCCL types needed are declared here: no
 * CUDA header is ever included, and the implementation must not be compiled in a translation unit
 * that includes cuda.h, nvrtc.h or nccl.h (their names would clash).  A missing library, symbol,
 * driver or device is an info log line plus QSA_ERR_NO_DEVICE, never a crash.
 *
 * Environment: QSA_CUDA_LIB, QSA_NVRTC_LIB, QSA_NCCL_LIB (a full path: only that file is tried),
 * QSA_ARCH (NVRTC target, e.g. compute_70 or sm_90; see qsa__nvrtc_pick_arch), QSA_PDL ("0": no
 * programmatic dependent launches, qsa__pdl_on), QSA_XW_WHOLE_PER_SM, QSA_XW_RANGE_PER_SM, QSA_MOE64_PAIRS,
 * QSA_MOE_LEAN, QSA_GDN_FUSE, QSA_LEAN_TASKS, QSA_ATTN_DEC, QSA_ATTN_DEC_HEADS, QSA_ATTN_DEC_WARP, QSA_SCORE_KEYS,
 * QSA_TILED_M, QSA_TILED_TILES, QSA_GEMV_BLOCKS_PER_SM, QSA_GEMV_BLK_MIN_M and QSA_LOGIT_SLICE_BYTES (launch
 * shapes, qsa__cuda_tuning: tuning switches, the bits do not depend on them). */
#ifndef QSA_NO_CUDA

#if defined(__cuda_cuda_h__) || defined(__NVRTC_H__) || defined(NCCL_H_)
#error "qsa_runtime.h: compile the implementation in a file that does not include cuda.h/nvrtc.h/nccl.h"
#endif

/* ---- the foreign types (ABI-identical to the CUDA/NVRTC/NCCL headers) ---- */
typedef int CUresult; /* CUDA_SUCCESS = 0 */
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef struct CUctx_st *CUcontext;
typedef struct CUmod_st *CUmodule;
typedef struct CUfunc_st *CUfunction;
typedef struct CUstream_st *CUstream; /* also NCCL's cudaStream_t */
typedef struct CUevent_st *CUevent;
typedef struct CUgraph_st *CUgraph;
typedef struct CUgraphExec_st *CUgraphExec;
/* cuLaunchKernelEx's configuration: an attribute is an 8-byte id slot and a 64-byte value union */
typedef struct qsa__cu_launch_attr {
    int id;
    char pad[4];
    union { int i; char pad[64]; } value;
} qsa__cu_launch_attr;
typedef struct qsa__cu_launch_cfg {
    unsigned gx, gy, gz, bx, by, bz, shmem;
    CUstream stream;
    qsa__cu_launch_attr *attrs;
    unsigned nattrs;
} qsa__cu_launch_cfg;
typedef char qsa__cu_launch_attr_is_72_bytes[sizeof(qsa__cu_launch_attr) == 72 ? 1 : -1]; /* CUlaunchAttribute */
/* cuMemcpy2DAsync's CUDA_MEMCPY2D (memory types: 1 host, 2 device) */
typedef struct qsa__cu_memcpy2d {
    size_t src_x, src_y;
    int src_type;
    const void *src_host;
    CUdeviceptr src_dev;
    void *src_array;
    size_t src_pitch, dst_x, dst_y;
    int dst_type;
    void *dst_host;
    CUdeviceptr dst_dev;
    void *dst_array;
    size_t dst_pitch, width, height;
} qsa__cu_memcpy2d;
typedef char qsa__cu_memcpy2d_is_128_bytes[sizeof(qsa__cu_memcpy2d) == 128 ? 1 : -1];

typedef int nvrtcResult; /* NVRTC_SUCCESS = 0 */
typedef struct _nvrtcProgram *nvrtcProgram;

typedef int ncclResult_t; /* ncclSuccess = 0 */
typedef int ncclDataType_t;
typedef struct ncclComm *ncclComm_t;
typedef struct { char internal[128]; } ncclUniqueId;

/* the constants we use, under our own names (values from the CUDA 11-13 / NCCL 2 headers) */
#define QSA__CUDA_ERROR_OUT_OF_MEMORY 2
#define QSA__CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK 1
#define QSA__CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT 16
#define QSA__CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY 19
#define QSA__CU_DEVICE_ATTRIBUTE_PCI_BUS_ID 33
#define QSA__CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH 37
#define QSA__CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE 38
#define QSA__CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING 41
#define QSA__CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR 75
#define QSA__CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR 76
#define QSA__CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR 81
#define QSA__CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN 97
#define QSA__CU_FUNC_ATTRIBUTE_NUM_REGS 4
#define QSA__CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES 8
#define QSA__CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT 9
#define QSA__CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION 6
#define QSA__CU_STREAM_NON_BLOCKING 0x1
#define QSA__CU_STREAM_CAPTURE_MODE_THREAD_LOCAL 1
#define QSA__CU_EVENT_DISABLE_TIMING 0x2
#define QSA__CU_EVENT_RECORD_EXTERNAL 0x1 /* cuEventRecordWithFlags in a capture: an event record node */
#define QSA__CU_MEMHOSTALLOC_PORTABLE 0x1
#define QSA__CU_MEMHOSTALLOC_DEVICEMAP 0x2
#define QSA__CU_MEMHOSTREGISTER_PORTABLE 0x1
#define QSA__CU_MEMHOSTREGISTER_DEVICEMAP 0x2
#define QSA__CU_MEMHOSTREGISTER_READ_ONLY 0x8
#define QSA__CU_STREAM_CAPTURE_MODE_GLOBAL 0
#define QSA__CU_STREAM_CAPTURE_MODE_THREAD_LOCAL 1
#define QSA__CU_STREAM_CAPTURE_MODE_RELAXED 2
#define QSA__NCCL_INT8 0
#define QSA__NCCL_UINT8 1
#define QSA__NCCL_INT32 2
#define QSA__NCCL_UINT32 3
#define QSA__NCCL_INT64 4
#define QSA__NCCL_UINT64 5
#define QSA__NCCL_FLOAT16 6
#define QSA__NCCL_FLOAT32 7
#define QSA__NCCL_FLOAT64 8
#define QSA__NCCL_SUM 0
#define QSA__NCCL_MAX 2

/* ---- the function lists ---- */
/* Driver API.  Every entry exists in every driver that can run NVRTC 11.8 PTX (R520+):
   cuGraphInstantiateWithFlags (11.4+) is what cuda.h 12+ calls cuGraphInstantiate;
   cuEventElapsedTime is the v1 entry, still exported by 13.x drivers. */
#define QSA__CU_FUNCS(X) \
    X(CUresult, cuInit, (unsigned int flags)) \
    X(CUresult, cuDriverGetVersion, (int *version)) \
    X(CUresult, cuGetErrorName, (CUresult error, const char **name)) \
    X(CUresult, cuGetErrorString, (CUresult error, const char **text)) \
    X(CUresult, cuDeviceGetCount, (int *count)) \
    X(CUresult, cuDeviceGet, (CUdevice *dev, int ordinal)) \
    X(CUresult, cuDeviceGetName, (char *name, int len, CUdevice dev)) \
    X(CUresult, cuDeviceGetAttribute, (int *value, int attrib, CUdevice dev)) \
    X(CUresult, cuDeviceTotalMem_v2, (size_t *bytes, CUdevice dev)) \
    X(CUresult, cuDevicePrimaryCtxRetain, (CUcontext *ctx, CUdevice dev)) \
    X(CUresult, cuDevicePrimaryCtxRelease_v2, (CUdevice dev)) \
    X(CUresult, cuCtxSetCurrent, (CUcontext ctx)) \
    X(CUresult, cuCtxGetCurrent, (CUcontext *ctx)) \
    X(CUresult, cuCtxSynchronize, (void)) \
    X(CUresult, cuMemGetInfo_v2, (size_t *free_bytes, size_t *total_bytes)) \
    X(CUresult, cuMemAlloc_v2, (CUdeviceptr *dptr, size_t bytes)) \
    X(CUresult, cuMemFree_v2, (CUdeviceptr dptr)) \
    X(CUresult, cuMemHostAlloc, (void **pp, size_t bytes, unsigned int flags)) \
    X(CUresult, cuMemFreeHost, (void *p)) \
    X(CUresult, cuMemcpyHtoD_v2, (CUdeviceptr dst, const void *src, size_t bytes)) \
    X(CUresult, cuMemcpyDtoH_v2, (void *dst, CUdeviceptr src, size_t bytes)) \
    X(CUresult, cuMemcpyHtoDAsync_v2, (CUdeviceptr dst, const void *src, size_t bytes, CUstream s)) \
    X(CUresult, cuMemcpyDtoHAsync_v2, (void *dst, CUdeviceptr src, size_t bytes, CUstream s)) \
    X(CUresult, cuMemcpyDtoDAsync_v2, (CUdeviceptr dst, CUdeviceptr src, size_t bytes, CUstream s)) \
    X(CUresult, cuMemcpy2DAsync_v2, (const qsa__cu_memcpy2d *copy, CUstream s)) \
    X(CUresult, cuMemsetD8_v2, (CUdeviceptr dst, unsigned char value, size_t n)) \
    X(CUresult, cuMemsetD8Async, (CUdeviceptr dst, unsigned char value, size_t n, CUstream s)) \
    X(CUresult, cuModuleLoadData, (CUmodule *mod, const void *image)) \
    X(CUresult, cuModuleUnload, (CUmodule mod)) \
    X(CUresult, cuModuleGetFunction, (CUfunction *fn, CUmodule mod, const char *name)) \
    X(CUresult, cuFuncSetAttribute, (CUfunction fn, int attrib, int value)) \
    X(CUresult, cuLaunchKernel, (CUfunction fn, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx, \
                                 unsigned int by, unsigned int bz, unsigned int shmem, CUstream s, void **params, \
                                 void **extra)) \
    X(CUresult, cuStreamCreate, (CUstream *s, unsigned int flags)) \
    X(CUresult, cuStreamDestroy_v2, (CUstream s)) \
    X(CUresult, cuStreamSynchronize, (CUstream s)) \
    X(CUresult, cuStreamWaitEvent, (CUstream s, CUevent e, unsigned int flags)) \
    X(CUresult, cuEventCreate, (CUevent *e, unsigned int flags)) \
    X(CUresult, cuEventRecord, (CUevent e, CUstream s)) \
    X(CUresult, cuEventSynchronize, (CUevent e)) \
    X(CUresult, cuEventElapsedTime, (float *ms, CUevent start, CUevent end)) \
    X(CUresult, cuEventDestroy_v2, (CUevent e)) \
    X(CUresult, cuStreamBeginCapture_v2, (CUstream s, int mode)) \
    X(CUresult, cuStreamEndCapture, (CUstream s, CUgraph *graph)) \
    X(CUresult, cuGraphInstantiateWithFlags, (CUgraphExec *exec, CUgraph graph, unsigned long long flags)) \
    X(CUresult, cuGraphLaunch, (CUgraphExec exec, CUstream s)) \
    X(CUresult, cuGraphExecDestroy, (CUgraphExec exec)) \
    X(CUresult, cuGraphDestroy, (CUgraph graph))

/* optional driver entries: NULL when the driver predates them (cuLaunchKernelEx: 12.0+,
   cuEventRecordWithFlags: 11.1+) */
#define QSA__CU_FUNCS_OPT(X) \
    X(CUresult, cuLaunchKernelEx, (const qsa__cu_launch_cfg *cfg, CUfunction fn, void **params, void **extra)) \
    X(CUresult, cuEventRecordWithFlags, (CUevent e, CUstream s, unsigned int flags))

#define QSA__NVRTC_FUNCS(X) \
    X(nvrtcResult, nvrtcVersion, (int *major, int *minor)) \
    X(const char *, nvrtcGetErrorString, (nvrtcResult result)) \
    X(nvrtcResult, nvrtcCreateProgram, (nvrtcProgram *prog, const char *src, const char *name, int nheaders, \
                                        const char *const *headers, const char *const *include_names)) \
    X(nvrtcResult, nvrtcCompileProgram, (nvrtcProgram prog, int nopts, const char *const *opts)) \
    X(nvrtcResult, nvrtcGetPTXSize, (nvrtcProgram prog, size_t *size)) \
    X(nvrtcResult, nvrtcGetPTX, (nvrtcProgram prog, char *ptx)) \
    X(nvrtcResult, nvrtcGetProgramLogSize, (nvrtcProgram prog, size_t *size)) \
    X(nvrtcResult, nvrtcGetProgramLog, (nvrtcProgram prog, char *log)) \
    X(nvrtcResult, nvrtcDestroyProgram, (nvrtcProgram *prog))
/* optional: NULL when the library predates them */
#define QSA__NVRTC_FUNCS_OPT(X) \
    X(nvrtcResult, nvrtcGetNumSupportedArchs, (int *count)) \
    X(nvrtcResult, nvrtcGetSupportedArchs, (int *archs)) \
    X(nvrtcResult, nvrtcGetCUBINSize, (nvrtcProgram prog, size_t *size)) \
    X(nvrtcResult, nvrtcGetCUBIN, (nvrtcProgram prog, char *cubin))

/* what the tensor-parallel code calls (its sums are all-gathers folded in rank order by qsa_k_tp_sum, never
   NCCL's reductions, whose order is NCCL's) */
#define QSA__NCCL_FUNCS(X) \
    X(ncclResult_t, ncclGetVersion, (int *version)) \
    X(const char *, ncclGetErrorString, (ncclResult_t result)) \
    X(ncclResult_t, ncclGetUniqueId, (ncclUniqueId *id)) \
    X(ncclResult_t, ncclCommInitRank, (ncclComm_t *comm, int nranks, ncclUniqueId id, int rank)) \
    X(ncclResult_t, ncclCommInitAll, (ncclComm_t *comms, int ndev, const int *devlist)) \
    X(ncclResult_t, ncclCommDestroy, (ncclComm_t comm)) \
    X(ncclResult_t, ncclAllGather, (const void *send, void *recv, size_t send_count, ncclDataType_t type, \
                                    ncclComm_t comm, CUstream s))

/* ---- expansion: typedefs, tables ---- */
#define QSA__DL_TYPEDEF(ret, name, args) typedef ret(*qsa__pfn_##name) args;
#define QSA__DL_MEMBER(ret, name, args) qsa__pfn_##name name;
QSA__CU_FUNCS(QSA__DL_TYPEDEF)
QSA__CU_FUNCS_OPT(QSA__DL_TYPEDEF)
QSA__NVRTC_FUNCS(QSA__DL_TYPEDEF)
QSA__NVRTC_FUNCS_OPT(QSA__DL_TYPEDEF)
QSA__NCCL_FUNCS(QSA__DL_TYPEDEF)

typedef struct qsa__cuda_api {
    void *lib;
    char path[256];     /* the name or path that was opened */
    int driver_version; /* e.g. 12040 for 12.4 */
    int device_count;
    QSA__CU_FUNCS(QSA__DL_MEMBER)
    QSA__CU_FUNCS_OPT(QSA__DL_MEMBER)
} qsa__cuda_api;

typedef struct qsa__nvrtc_api {
    void *lib, *builtins; /* builtins: libnvrtc-builtins preloaded from QSA_NVRTC_LIB's directory */
    char path[512];
    int major, minor;
    int narchs;    /* 0 when nvrtcGetSupportedArchs is absent */
    int archs[64]; /* e.g. 70, 75, 80, ... */
    QSA__NVRTC_FUNCS(QSA__DL_MEMBER)
    QSA__NVRTC_FUNCS_OPT(QSA__DL_MEMBER)
} qsa__nvrtc_api;

typedef struct qsa__nccl_api {
    void *lib;
    char path[512];
    int version; /* e.g. 22105 for 2.21.5 */
    QSA__NCCL_FUNCS(QSA__DL_MEMBER)
} qsa__nccl_api;

/* One symbol to bind: its name and where its pointer goes in the table. */
typedef struct qsa__dl_entry {
    const char *name;
    size_t offset;
    int required;
} qsa__dl_entry;

#define QSA__CU_ENTRY(ret, name, args) {#name, offsetof(qsa__cuda_api, name), 1},
#define QSA__CU_ENTRY_OPT(ret, name, args) {#name, offsetof(qsa__cuda_api, name), 0},
#define QSA__NVRTC_ENTRY(ret, name, args) {#name, offsetof(qsa__nvrtc_api, name), 1},
#define QSA__NVRTC_ENTRY_OPT(ret, name, args) {#name, offsetof(qsa__nvrtc_api, name), 0},
#define QSA__NCCL_ENTRY(ret, name, args) {#name, offsetof(qsa__nccl_api, name), 1},
static const qsa__dl_entry qsa__cu_entries[] = {QSA__CU_FUNCS(QSA__CU_ENTRY) QSA__CU_FUNCS_OPT(QSA__CU_ENTRY_OPT)};
static const qsa__dl_entry qsa__nvrtc_entries[] = {QSA__NVRTC_FUNCS(QSA__NVRTC_ENTRY)
                                                       QSA__NVRTC_FUNCS_OPT(QSA__NVRTC_ENTRY_OPT)};
static const qsa__dl_entry qsa__nccl_entries[] = {QSA__NCCL_FUNCS(QSA__NCCL_ENTRY)};

/* The process-wide tables, filled once by qsa__cuda_load / qsa__nvrtc_load / qsa__nccl_load. */
static qsa__cuda_api qsa__cu;
static qsa__nvrtc_api qsa__nvrtc;
static qsa__nccl_api qsa__nccl;

/* ---- loading ---- */

/* Opens the first library of `names` that dlopen accepts, or only getenv(env) when that is set.
   On failure records QSA_ERR_NO_DEVICE with every name tried and dlerror's reason. */
QSA_PRIV void *qsa__dl_open_first(const char *what, const char *env, const char *const *names, int n, char *opened,
                                  size_t cap) {
    const char *forced = env ? getenv(env) : NULL;
    const char *one[1];
    if (forced && forced[0]) {
        one[0] = forced;
        names = one;
        n = 1;
    }
    char tried[768];
    size_t len = 0;
    tried[0] = 0;
    for (int i = 0; i < n; i++) {
        void *h = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
        if (h) {
            snprintf(opened, cap, "%s", names[i]);
            return h;
        }
        const char *why = dlerror();
        if (len < sizeof tried) {
            int k = snprintf(tried + len, sizeof tried - len, "%s%s", len ? "; " : "", why ? why : names[i]);
            if (k > 0) len += (size_t)k;
        }
    }
    if (forced && forced[0])
        qsa__fail(QSA_ERR_NO_DEVICE, "%s: cannot open %s=%s (%s)", what, env, forced, tried);
    else
        qsa__fail(QSA_ERR_NO_DEVICE, "%s not found (%s)", what, tried);
    return NULL;
}

/* Resolves every entry into `table`; a missing required symbol fails, a missing optional one
   stays NULL.  dlsym's void* goes through memcpy: ISO C has no object-to-function pointer cast. */
QSA_PRIV qsa_result qsa__dl_bind(void *lib, const char *path, void *table, const qsa__dl_entry *e, size_t n) {
    for (size_t i = 0; i < n; i++) {
        void *sym = dlsym(lib, e[i].name);
        if (!sym && e[i].required)
            return qsa__fail(QSA_ERR_NO_DEVICE, "%s: missing symbol %s (library too old?)", path, e[i].name);
        memcpy((char *)table + e[i].offset, &sym, sizeof sym);
    }
    return QSA_OK;
}

/* Loads libcuda into *api from the first of `names` (or only getenv(env) when env names a set
   variable), initialises the driver and counts devices.  No device or a stub/broken driver is
   QSA_ERR_NO_DEVICE.  The qsa__*_load_from functions are the uncached loaders behind the
   process-wide qsa__*_load (tests call them directly with env = NULL). */
QSA_PRIV qsa_result qsa__cuda_load_from(const char *env, const char *const *names, int n, qsa__cuda_api *api) {
    memset(api, 0, sizeof *api);
    void *lib = qsa__dl_open_first("libcuda (NVIDIA driver)", env, names, n, api->path, sizeof api->path);
    if (!lib) return QSA_ERR_NO_DEVICE;
    qsa_result r = qsa__dl_bind(lib, api->path, api, qsa__cu_entries, sizeof qsa__cu_entries / sizeof qsa__cu_entries[0]);
    if (r == QSA_OK) {
        CUresult cr = api->cuInit(0);
        if (cr != 0) {
            const char *name = NULL;
            if (api->cuGetErrorName(cr, &name) != 0 || !name) name = "?";
            r = qsa__fail(QSA_ERR_NO_DEVICE, "%s: cuInit(0) failed: %s (%d): no usable driver or device", api->path,
                          name, (int)cr);
        }
    }
    if (r == QSA_OK && (api->cuDriverGetVersion(&api->driver_version) != 0 ||
                        api->cuDeviceGetCount(&api->device_count) != 0 || api->device_count <= 0))
        r = qsa__fail(QSA_ERR_NO_DEVICE, "%s: the driver reports no CUDA device", api->path);
    if (r != QSA_OK) {
        dlclose(lib);
        memset(api, 0, sizeof *api);
        return r;
    }
    api->lib = lib;
    return QSA_OK;
}

/* Loads an NVRTC into *api from the first of `names` (or getenv(env)).  When the library is
   given as a path, its libnvrtc-builtins.so.MAJOR.MINOR is preloaded from the same directory:
   NVRTC dlopens it by soname at compile time, which would otherwise fail outside the loader path. */
QSA_PRIV qsa_result qsa__nvrtc_load_from(const char *env, const char *const *names, int n, qsa__nvrtc_api *api) {
    memset(api, 0, sizeof *api);
    void *lib = qsa__dl_open_first("libnvrtc (CUDA runtime compiler)", env, names, n, api->path,
                                   sizeof api->path);
    if (!lib) return QSA_ERR_NO_DEVICE;
    qsa_result r = qsa__dl_bind(lib, api->path, api, qsa__nvrtc_entries,
                                sizeof qsa__nvrtc_entries / sizeof qsa__nvrtc_entries[0]);
    if (r == QSA_OK && api->nvrtcVersion(&api->major, &api->minor) != 0)
        r = qsa__fail(QSA_ERR_NO_DEVICE, "%s: nvrtcVersion failed", api->path);
    if (r != QSA_OK) {
        dlclose(lib);
        memset(api, 0, sizeof *api);
        return r;
    }
    api->lib = lib;
    const char *slash = strrchr(api->path, '/');
    if (slash) {
        char b[600];
        snprintf(b, sizeof b, "%.*s/libnvrtc-builtins.so.%d.%d", (int)(slash - api->path), api->path, api->major,
                 api->minor);
        api->builtins = dlopen(b, RTLD_NOW | RTLD_LOCAL);
        if (!api->builtins) qsa__log(QSA_LOG_DEBUG, "nvrtc: no %s next to the library (NVRTC will search)", b);
    }
    int na = 0;
    if (api->nvrtcGetNumSupportedArchs && api->nvrtcGetSupportedArchs && api->nvrtcGetNumSupportedArchs(&na) == 0 &&
        na > 0 && na <= (int)(sizeof api->archs / sizeof api->archs[0]) && api->nvrtcGetSupportedArchs(api->archs) == 0)
        api->narchs = na;
    return QSA_OK;
}

/* Loads NCCL into *api from the first of `names` (or getenv(env)). */
QSA_PRIV qsa_result qsa__nccl_load_from(const char *env, const char *const *names, int n, qsa__nccl_api *api) {
    memset(api, 0, sizeof *api);
    void *lib = qsa__dl_open_first("libnccl (NCCL)", env, names, n, api->path, sizeof api->path);
    if (!lib) return QSA_ERR_NO_DEVICE;
    qsa_result r = qsa__dl_bind(lib, api->path, api, qsa__nccl_entries,
                                sizeof qsa__nccl_entries / sizeof qsa__nccl_entries[0]);
    if (r == QSA_OK && api->ncclGetVersion(&api->version) != 0)
        r = qsa__fail(QSA_ERR_NO_DEVICE, "%s: ncclGetVersion failed", api->path);
    if (r != QSA_OK) {
        dlclose(lib);
        memset(api, 0, sizeof *api);
        return r;
    }
    api->lib = lib;
    return QSA_OK;
}

/* Process-wide, thread-safe, once: the outcome (and its message) is remembered and every later
   call returns the same result and re-records the same message for the calling thread. */
typedef struct qsa__dl_once {
    pthread_once_t once;
    qsa_result status;
    char message[1024];
} qsa__dl_once;
static qsa__dl_once qsa__cu_once = {PTHREAD_ONCE_INIT, QSA_ERR_INTERNAL, ""};
static qsa__dl_once qsa__nvrtc_once = {PTHREAD_ONCE_INIT, QSA_ERR_INTERNAL, ""};
static qsa__dl_once qsa__nccl_once = {PTHREAD_ONCE_INIT, QSA_ERR_INTERNAL, ""};

QSA_PRIV void qsa__dl_once_done(qsa__dl_once *o, qsa_result r, const char *what) {
    o->status = r;
    if (r != QSA_OK) {
        snprintf(o->message, sizeof o->message, "%s", qsa__err_buf);
        qsa__log(QSA_LOG_INFO, "%s unavailable: %s", what, o->message);
    }
}
QSA_PRIV qsa_result qsa__dl_once_result(const qsa__dl_once *o) {
    return o->status == QSA_OK ? QSA_OK : qsa__fail(o->status, "%s", o->message);
}

QSA_PRIV void qsa__cuda_load_once(void) {
    static const char *const names[] = {"libcuda.so.1", "libcuda.so"};
    qsa_result r = qsa__cuda_load_from("QSA_CUDA_LIB", names, 2, &qsa__cu);
    qsa__dl_once_done(&qsa__cu_once, r, "CUDA backend");
    if (r == QSA_OK)
        qsa__log(QSA_LOG_INFO, "libcuda: %s, driver API %d.%d, %d device(s)", qsa__cu.path,
                 qsa__cu.driver_version / 1000, qsa__cu.driver_version % 1000 / 10, qsa__cu.device_count);
}
QSA_PRIV void qsa__nvrtc_load_once(void) {
    static const char *const names[] = {"libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so.11.2", "libnvrtc.so"};
    qsa_result r = qsa__nvrtc_load_from("QSA_NVRTC_LIB", names, 4, &qsa__nvrtc);
    qsa__dl_once_done(&qsa__nvrtc_once, r, "NVRTC");
    if (r == QSA_OK) qsa__log(QSA_LOG_INFO, "nvrtc: %s, version %d.%d", qsa__nvrtc.path, qsa__nvrtc.major, qsa__nvrtc.minor);
}
QSA_PRIV void qsa__nccl_load_once(void) {
    static const char *const names[] = {"libnccl.so.2", "libnccl.so"};
    qsa_result r = qsa__nccl_load_from("QSA_NCCL_LIB", names, 2, &qsa__nccl);
    qsa__dl_once_done(&qsa__nccl_once, r, "NCCL");
    if (r == QSA_OK)
        qsa__log(QSA_LOG_INFO, "nccl: %s, version %d", qsa__nccl.path, qsa__nccl.version);
}

/* Load (once per process) and report: QSA_OK, or QSA_ERR_NO_DEVICE with the reason. */
QSA_PRIV qsa_result qsa__cuda_load(void) {
    pthread_once(&qsa__cu_once.once, qsa__cuda_load_once);
    return qsa__dl_once_result(&qsa__cu_once);
}
QSA_PRIV qsa_result qsa__nvrtc_load(void) {
    pthread_once(&qsa__nvrtc_once.once, qsa__nvrtc_load_once);
    return qsa__dl_once_result(&qsa__nvrtc_once);
}
QSA_PRIV qsa_result qsa__nccl_load(void) {
    pthread_once(&qsa__nccl_once.once, qsa__nccl_load_once);
    return qsa__dl_once_result(&qsa__nccl_once);
}

/* ---- error checks: one macro per foreign API ---- */
/* QSA__CU(call) / QSA__NVRTC(call) / QSA__NCCL(call): on failure record the call text, the error
   name and the line with qsa__fail and return the qsa_result from the enclosing function.
   QSA__CU_R(call) etc. are the expression forms (for cleanup paths): they give QSA_OK or the
   recorded failure. */
QSA_PRIV const char *qsa__dl_call_text(const char *call, const char *prefix) {
    size_t n = strlen(prefix);
    return strncmp(call, prefix, n) == 0 ? call + n : call;
}
QSA_PRIV qsa_result qsa__cu_check(CUresult r, const char *call, int line) {
    if (r == 0) return QSA_OK;
    const char *name = NULL, *text = NULL;
    if (qsa__cu.cuGetErrorName && qsa__cu.cuGetErrorName(r, &name) != 0) name = NULL;
    if (qsa__cu.cuGetErrorString && qsa__cu.cuGetErrorString(r, &text) != 0) text = NULL;
    return qsa__fail(r == QSA__CUDA_ERROR_OUT_OF_MEMORY ? QSA_ERR_OUT_OF_MEMORY : QSA_ERR_CUDA,
                     "%s failed: %s (%d%s%s) at line %d", qsa__dl_call_text(call, "qsa__cu."),
                     name ? name : "CUDA_ERROR", (int)r, text ? ": " : "", text ? text : "", line);
}
QSA_PRIV qsa_result qsa__nvrtc_check(nvrtcResult r, const char *call, int line) {
    if (r == 0) return QSA_OK;
    const char *name = qsa__nvrtc.nvrtcGetErrorString ? qsa__nvrtc.nvrtcGetErrorString(r) : NULL;
    return qsa__fail(r == 1 ? QSA_ERR_OUT_OF_MEMORY : QSA_ERR_NVRTC, "%s failed: %s (%d) at line %d",
                     qsa__dl_call_text(call, "qsa__nvrtc."), name ? name : "NVRTC_ERROR", (int)r, line);
}
QSA_PRIV const char *qsa__nccl_result_name(ncclResult_t r) {
    static const char *const names[] = {"ncclSuccess",        "ncclUnhandledCudaError", "ncclSystemError",
                                        "ncclInternalError",  "ncclInvalidArgument",    "ncclInvalidUsage",
                                        "ncclRemoteError",    "ncclInProgress"};
    return r >= 0 && r < (int)(sizeof names / sizeof names[0]) ? names[r] : "ncclError";
}
QSA_PRIV qsa_result qsa__nccl_check(ncclResult_t r, const char *call, int line) {
    if (r == 0) return QSA_OK;
    const char *text = qsa__nccl.ncclGetErrorString ? qsa__nccl.ncclGetErrorString(r) : NULL;
    return qsa__fail(QSA_ERR_NCCL, "%s failed: %s (%d%s%s) at line %d", qsa__dl_call_text(call, "qsa__nccl."),
                     qsa__nccl_result_name(r), (int)r, text ? ": " : "", text ? text : "", line);
}
#define QSA__CU_R(call) qsa__cu_check((call), #call, __LINE__)
#define QSA__NVRTC_R(call) qsa__nvrtc_check((call), #call, __LINE__)
#define QSA__NCCL_R(call) qsa__nccl_check((call), #call, __LINE__)
#define QSA__CU(call) do { qsa_result qsa__cu_r_ = QSA__CU_R(call); if (qsa__cu_r_ != QSA_OK) return qsa__cu_r_; } while (0)
#define QSA__NVRTC(call) do { qsa_result qsa__nv_r_ = QSA__NVRTC_R(call); if (qsa__nv_r_ != QSA_OK) return qsa__nv_r_; } while (0)
#define QSA__NCCL(call) do { qsa_result qsa__nc_r_ = QSA__NCCL_R(call); if (qsa__nc_r_ != QSA_OK) return qsa__nc_r_; } while (0)

/* ---- kernel profile: a CUDA event pair around every launch of this thread ----
   For tools (tools/bench --profile): qsa__prof_begin() on the thread that drives a model,
   qsa__prof_report() prints the time per kernel and launch shape, qsa__prof_end() frees.  Launches
   inside a graph capture (qsa__prof_capturing) are not timed.  Per thread (TLS): TP ranks each
   profile their own GPU.  The events serialise nothing, but their recording costs ~1 us per
   launch of host time, so profiled runs are slower than real ones; the per-kernel times are GPU
   times. */
#define QSA__PROF_PAIRS 4096
#define QSA__PROF_KEYS 512
typedef struct qsa__prof_key {
    const char *name;
    unsigned gx, gy, gz, bx;
    double ms;
    long long calls;
} qsa__prof_key;
typedef struct qsa__prof_state {
    CUevent ev[2 * QSA__PROF_PAIRS];
    int key[QSA__PROF_PAIRS];
    int n, created;
    qsa__prof_key keys[QSA__PROF_KEYS];
    int nkeys;
} qsa__prof_state;
static QSA__TLS qsa__prof_state *qsa__prof;
static QSA__TLS int qsa__prof_capturing;
/* Marginal cost (tools/bench --marginal): while set, this thread's launches of that kernel and launch
   shape (name, gx, gy, gz, bx as a profile key) are left out, so a step captured then shows what the
   kernel costs inside the replayed graph.  Timing only: the outputs of such steps are garbage. */
static QSA__TLS const qsa__prof_key *qsa__prof_skip;

/* Adds the finished pairs to their keys. */
QSA_PRIV void qsa__prof_flush(void) {
    qsa__prof_state *p = qsa__prof;
    if (!p || !p->n) return;
    qsa__cu.cuEventSynchronize(p->ev[2 * p->n - 1]);
    for (int i = 0; i < p->n; i++) {
        float ms = 0.0f;
        if (qsa__cu.cuEventElapsedTime(&ms, p->ev[2 * i], p->ev[2 * i + 1]) == 0) p->keys[p->key[i]].ms += ms;
        p->keys[p->key[i]].calls++;
    }
    p->n = 0;
}

QSA_PRIV void qsa__prof_end(void) {
    qsa__prof_state *p = qsa__prof;
    if (!p) return;
    qsa__prof_flush();
    for (int i = 0; i < p->created; i++) qsa__cu.cuEventDestroy_v2(p->ev[i]);
    qsa__free(p);
    qsa__prof = NULL;
}

QSA_PRIV qsa_result qsa__prof_begin(void) {
    qsa__prof_end();
    qsa__prof = QSA__CALLOC(qsa__prof_state, 1);
    return qsa__prof ? QSA_OK : qsa__fail(QSA_ERR_OUT_OF_MEMORY, "profile: out of host memory");
}

QSA_PRIV int qsa__prof_cmp(const void *a, const void *b) {
    double x = ((const qsa__prof_key *)a)->ms, y = ((const qsa__prof_key *)b)->ms;
    return x < y ? 1 : x > y ? -1 : 0;
}

/* Prints the kernels by total time, per `steps` (e.g. decode steps), and returns the total ms per step. */
QSA_PRIV double qsa__prof_report(FILE *f, int steps, int max_rows) {
    qsa__prof_state *p = qsa__prof;
    if (!p) return 0.0;
    qsa__prof_flush();
    if (steps < 1) steps = 1;
    qsort(p->keys, (size_t)p->nkeys, sizeof p->keys[0], qsa__prof_cmp);
    double total = 0.0, calls = 0.0;
    for (int i = 0; i < p->nkeys; i++) {
        total += p->keys[i].ms;
        calls += (double)p->keys[i].calls;
    }
    fprintf(f, "| kernel | grid | block | launches/step | us/step | us/launch | share |\n|---|---|---:|---:|---:|---:|---:|\n");
    for (int i = 0; i < p->nkeys && i < max_rows; i++) {
        const qsa__prof_key *k = &p->keys[i];
        fprintf(f, "| %s | %u,%u,%u | %u | %.1f | %.1f | %.2f | %.1f%% |\n", k->name + (strncmp(k->name, "qsa_k_", 6) ? 0 : 6),
                k->gx, k->gy, k->gz, k->bx, (double)k->calls / steps, 1000.0 * k->ms / steps, 1000.0 * k->ms / (double)k->calls,
                100.0 * k->ms / (total > 0 ? total : 1));
    }
    fprintf(f, "| all kernels (%d shapes) | | | %.1f | %.1f | | 100%% |\n", p->nkeys, calls / steps, 1000.0 * total / steps);
    return total / steps;
}

/* Launch a kernel; the message names the kernel and the launch shape.  With QSA_DEBUG the stream
   is synchronised afterwards so that a faulting kernel is reported at its own launch.  pdl != 0
   launches it as a programmatic dependent of the stream's previous kernel (sm_90+, cuLaunchKernelEx):
   it may start as soon as every block of that kernel has begun, and waits in QSA_PDL_ENTRY (at the
   top of every kernel of kernels.cu; after the weight loads in the QSA_PDL_LATE GEMVs) until that
   kernel has completed and its writes are visible — so it hides the launch latency and changes
   nothing else. */
QSA_PRIV qsa_result qsa__cu_launch_ex(CUfunction fn, const char *name, unsigned gx, unsigned gy, unsigned gz,
                                      unsigned bx, unsigned by, unsigned bz, unsigned shmem, CUstream s, void **args,
                                      int pdl) {
    const qsa__prof_key *skip = qsa__prof_skip;
    if (skip && skip->name == name && skip->gx == gx && skip->gy == gy && skip->gz == gz && skip->bx == bx) return QSA_OK;
    qsa__prof_state *p = qsa__prof_capturing ? NULL : qsa__prof;
    int slot = -1;
    if (p) {
        int k = 0;
        while (k < p->nkeys && !(p->keys[k].name == name && p->keys[k].gx == gx && p->keys[k].gy == gy &&
                                 p->keys[k].gz == gz && p->keys[k].bx == bx))
            k++;
        if (k == p->nkeys && k < QSA__PROF_KEYS) {
            memset(&p->keys[k], 0, sizeof p->keys[k]);
            p->keys[k].name = name;
            p->keys[k].gx = gx;
            p->keys[k].gy = gy;
            p->keys[k].gz = gz;
            p->keys[k].bx = bx;
            p->nkeys++;
        }
        if (k < p->nkeys) {
            if (p->n == QSA__PROF_PAIRS) qsa__prof_flush();
            slot = p->n;
            while (p->created < 2 * slot + 2 && qsa__cu.cuEventCreate(&p->ev[p->created], 0) == 0) p->created++;
            if (p->created >= 2 * slot + 2 && qsa__cu.cuEventRecord(p->ev[2 * slot], s) == 0) p->key[slot] = k;
            else slot = -1;
        }
    }
    CUresult r;
    if (pdl && qsa__cu.cuLaunchKernelEx) {
        qsa__cu_launch_attr at;
        memset(&at, 0, sizeof at);
        at.id = QSA__CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
        at.value.i = 1;
        qsa__cu_launch_cfg cfg = {gx, gy, gz, bx, by, bz, shmem, s, &at, 1};
        r = qsa__cu.cuLaunchKernelEx(&cfg, fn, args, NULL);
    } else {
        r = qsa__cu.cuLaunchKernel(fn, gx, gy, gz, bx, by, bz, shmem, s, args, NULL);
    }
    if (slot >= 0 && qsa__cu.cuEventRecord(p->ev[2 * slot + 1], s) == 0) p->n++;
#ifdef QSA_DEBUG
    if (r == 0) r = qsa__cu.cuStreamSynchronize(s);
#endif
    if (r == 0) return QSA_OK;
    char what[256];
    snprintf(what, sizeof what, "launch %s grid (%u,%u,%u) block (%u,%u,%u) smem %u", name, gx, gy, gz, bx, by, bz,
             shmem);
    return qsa__cu_check(r, what, __LINE__);
}

QSA_PRIV qsa_result qsa__cu_launch(CUfunction fn, const char *name, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                                   unsigned by, unsigned bz, unsigned shmem, CUstream s, void **args) {
    return qsa__cu_launch_ex(fn, name, gx, gy, gz, bx, by, bz, shmem, s, args, 0);
}

/* What the runtime needs to know about a device. */
typedef struct qsa__gpu_info {
    int ordinal;
    char name[128];
    int cc_major, cc_minor; /* 7.0 for V100 */
    int sm_count;
    int smem_optin;         /* max shared memory per block with opt-in, bytes */
    int smem_per_sm;
    int unified_addressing, can_map_host;
    size_t total_mem;
} qsa__gpu_info;

QSA_PRIV qsa_result qsa__cu_device_info(int ordinal, qsa__gpu_info *info) {
    CUdevice dev;
    memset(info, 0, sizeof *info);
    QSA__TRY(qsa__cuda_load());
    if (ordinal < 0 || ordinal >= qsa__cu.device_count)
        return qsa__fail(QSA_ERR_INVALID_ARGUMENT, "GPU %d does not exist (%d device(s))", ordinal, qsa__cu.device_count);
    info->ordinal = ordinal;
    QSA__CU(qsa__cu.cuDeviceGet(&dev, ordinal));
    QSA__CU(qsa__cu.cuDeviceGetName(info->name, (int)sizeof info->name, dev));
    QSA__CU(qsa__cu.cuDeviceGetAttribute(&info->cc_major, QSA__CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev));
    QSA__CU(qsa__cu.cuDeviceGetAttribute(&info->cc_minor, QSA__CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev));
    QSA__CU(qsa__cu.cuDeviceGetAttribute(&info->sm_count, QSA__CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev));
    QSA__CU(qsa__cu.cuDeviceGetAttribute(&info->smem_optin, QSA__CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, dev));
    QSA__CU(qsa__cu.cuDeviceGetAttribute(&info->smem_per_sm, QSA__CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR, dev));
    QSA__CU(qsa__cu.cuDeviceGetAttribute(&info->unified_addressing, QSA__CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING, dev));
    QSA__CU(qsa__cu.cuDeviceGetAttribute(&info->can_map_host, QSA__CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY, dev));
    QSA__CU(qsa__cu.cuDeviceTotalMem_v2(&info->total_mem, dev));
    return QSA_OK;
}

/* ============================================================================================== */
/* >>nvrtc  the embedded kernels and their compilation                                             */
/* ============================================================================================== */

/* kernels.cu, one string per line, after `#line 1 "kernels.cu"` (generated by make).  A list of
   short literals rather than one long one: ISO C only promises 4095 characters per literal. */
static const char *const qsa__kernel_lines[] = {
#include "kernels.cu.inc"
};

/* The kernel source as one NUL-terminated string (caller frees), NULL when out of memory. */
QSA_PRIV char *qsa__kernels_source(void) {
    size_t n = sizeof qsa__kernel_lines / sizeof qsa__kernel_lines[0], len = 0;
    for (size_t i = 0; i < n; i++) len += strlen(qsa__kernel_lines[i]);
    char *s = QSA__ALLOC(char, len + 1);
    if (!s) return NULL;
    len = 0;
    for (size_t i = 0; i < n; i++) {
        size_t k = strlen(qsa__kernel_lines[i]);
        memcpy(s + len, qsa__kernel_lines[i], k);
        len += k;
    }
    s[len] = 0;
    return s;
}

/* Does the loaded NVRTC accept compute_<sm>?  Its own list when it has one (11.2+); otherwise
   NVRTC before 13 still targets Volta. */
QSA_PRIV int qsa__nvrtc_supports(int sm) {
    if (qsa__nvrtc.narchs > 0) {
        for (int i = 0; i < qsa__nvrtc.narchs; i++)
            if (qsa__nvrtc.archs[i] == sm) return 1;
        return 0;
    }
    return sm >= 70 && qsa__nvrtc.major < 13;
}

/* "70" / "compute_70" / "sm_90" / "sm_90a" -> normalised into out; 0 when malformed. */
QSA_PRIV int qsa__nvrtc_parse_arch(const char *s, char *out, size_t cap) {
    const char *p = s;
    const char *prefix = "compute_";
    if (!strncmp(s, "compute_", 8)) p = s + 8;
    else if (!strncmp(s, "sm_", 3)) { p = s + 3; prefix = "sm_"; }
    size_t digits = 0;
    while (p[digits] >= '0' && p[digits] <= '9') digits++;
    if (digits < 2 || digits > 3) return 0;
    if (p[digits] && !(p[digits] >= 'a' && p[digits] <= 'z' && !p[digits + 1])) return 0;
    snprintf(out, cap, "%s%s", prefix, p);
    return 1;
}

/* Chooses the NVRTC target.  In order: `want` (a parameter), $QSA_ARCH, compute_70 when the loaded
   NVRTC supports it (the sm_70 path of SPEC section 6), else the device's own arch `device_cc`
   (major*10+minor): sm_NN (a CUBIN) when the NVRTC targets exactly that arch and makes CUBINs, else PTX
   for the newest arch it supports that does not exceed it; else compute_90 when there is no device
   (compile checks).  The choice and the reason are logged. */
QSA_PRIV qsa_result qsa__nvrtc_pick_arch(const char *want, int device_cc, char *arch, size_t cap) {
    QSA__TRY(qsa__nvrtc_load());
    const char *why;
    if (!want || !want[0]) want = getenv("QSA_ARCH");
    if (want && want[0]) {
        if (!qsa__nvrtc_parse_arch(want, arch, cap))
            return qsa__fail(QSA_ERR_INVALID_ARGUMENT, "NVRTC target '%s': expected compute_NN, sm_NN or NN", want);
        why = "requested (parameter or QSA_ARCH)";
    } else if (qsa__nvrtc_supports(70)) {
        snprintf(arch, cap, "compute_70");
        why = "default: Volta PTX, runs on sm_70 and newer";
    } else if (device_cc > 0) {
        int best = device_cc;
        if (qsa__nvrtc.narchs > 0) {
            best = 0;
            for (int i = 0; i < qsa__nvrtc.narchs; i++)
                if (qsa__nvrtc.archs[i] <= device_cc && qsa__nvrtc.archs[i] > best) best = qsa__nvrtc.archs[i];
            if (!best)
                return qsa__fail(QSA_ERR_UNSUPPORTED,
                                 "NVRTC %d.%d (%s) supports no target for a compute %d.%d device: point QSA_NVRTC_LIB "
                                 "at an NVRTC 11.8-12.x",
                                 qsa__nvrtc.major, qsa__nvrtc.minor, qsa__nvrtc.path, device_cc / 10, device_cc % 10);
        }
        /* the device's own arch as a CUBIN where NVRTC makes one for it: the machine code comes out of the
           compile threads, and a load (cold or from the disk cache) runs no driver JIT; else PTX */
        int cubin = best == device_cc && qsa__nvrtc.nvrtcGetCUBINSize && qsa__nvrtc.nvrtcGetCUBIN;
        snprintf(arch, cap, "%s_%d", cubin ? "sm" : "compute", best);
        why = cubin ? "this NVRTC cannot target compute_70: the device's own arch, machine code"
                    : "this NVRTC cannot target compute_70: the newest PTX the device runs";
    } else {
        snprintf(arch, cap, "compute_90");
        why = "this NVRTC cannot target compute_70 and there is no device";
    }
    qsa__log(QSA_LOG_INFO, "nvrtc: target %s (%s; NVRTC %d.%d)", arch, why, qsa__nvrtc.major, qsa__nvrtc.minor);
    return QSA_OK;
}

/* Compiles `src` (named `name` in diagnostics) for `arch` ("compute_70": PTX; "sm_90": a CUBIN when
 * the NVRTC can produce one, else PTX) with the extra options `opts`.  On success *image is the
 * NUL-terminated PTX (or the CUBIN) for cuModuleLoadData and *image_len its size without the NUL;
 * *log (when log is not NULL) receives NVRTC's log, possibly empty.  Both are freed with qsa_free.
 * On a compilation error the message holds NVRTC's log, whose lines name `kernels.cu(LINE)`. */
QSA_PRIV qsa_result qsa__nvrtc_compile(const char *src, const char *name, const char *const *opts, int nopts,
                                       const char *arch, char **image, size_t *image_len, char **log) {
    *image = NULL;
    *image_len = 0;
    if (log) *log = NULL;
    QSA__TRY(qsa__nvrtc_load());
    if (nopts < 0 || (nopts > 0 && !opts) || !src || !name || !arch)
        return qsa__fail(QSA_ERR_INVALID_ARGUMENT, "qsa__nvrtc_compile: bad arguments");
    const char **all = QSA__ALLOC(const char *, nopts + 1);
    char archopt[64];
    char *logbuf = NULL, *out = NULL;
    size_t loglen = 0, outlen = 0;
    nvrtcProgram prog = NULL;
    qsa_result r = QSA_OK;
    int cubin = !strncmp(arch, "sm_", 3) && qsa__nvrtc.nvrtcGetCUBINSize && qsa__nvrtc.nvrtcGetCUBIN;
    double t0 = qsa__now();
    if (!all) return qsa__fail(QSA_ERR_OUT_OF_MEMORY, "nvrtc: out of memory");
    snprintf(archopt, sizeof archopt, "--gpu-architecture=%s", arch);
    all[0] = archopt;
    for (int i = 0; i < nopts; i++) all[i + 1] = opts[i];

    r = QSA__NVRTC_R(qsa__nvrtc.nvrtcCreateProgram(&prog, src, name, 0, NULL, NULL));
    if (r != QSA_OK) goto done;
    {
        nvrtcResult cr = qsa__nvrtc.nvrtcCompileProgram(prog, nopts + 1, all);
        if (qsa__nvrtc.nvrtcGetProgramLogSize(prog, &loglen) == 0 && loglen > 0 &&
            (logbuf = QSA__ALLOC(char, loglen + 1)) != NULL) {
            if (qsa__nvrtc.nvrtcGetProgramLog(prog, logbuf) != 0) logbuf[0] = 0;
            logbuf[loglen] = 0;
        }
        if (cr != 0) {
            /* the error lines first: the message keeps about 1 KB, and warnings above an error would push it out */
            qsa__buf eb = {NULL, 0, 0};
            for (int pass = 0; logbuf && pass < 2; pass++)
                for (const char *p = logbuf; *p;) {
                    const char *e = strchr(p, '\n');
                    size_t n = e ? (size_t)(e - p) + 1 : strlen(p), k = 0;
                    while (k + 5 <= n && strncmp(p + k, "error", 5)) k++;
                    if ((k + 5 <= n) == !pass) qsa__buf_put(&eb, p, n);
                    p += n;
                }
            r = qsa__fail(QSA_ERR_NVRTC, "NVRTC %d.%d: compiling %s for %s failed (%s):\n%s", qsa__nvrtc.major,
                          qsa__nvrtc.minor, name, arch, qsa__nvrtc.nvrtcGetErrorString(cr),
                          eb.data ? eb.data : logbuf ? logbuf : "");
            qsa__buf_free(&eb);
            goto done;
        }
    }
    if (cubin) r = QSA__NVRTC_R(qsa__nvrtc.nvrtcGetCUBINSize(prog, &outlen));
    else r = QSA__NVRTC_R(qsa__nvrtc.nvrtcGetPTXSize(prog, &outlen));
    if (r != QSA_OK) goto done;
    if (outlen == 0) {
        r = qsa__fail(QSA_ERR_NVRTC, "NVRTC %d.%d: compiling %s for %s produced no %s", qsa__nvrtc.major,
                      qsa__nvrtc.minor, name, arch, cubin ? "CUBIN" : "PTX");
        goto done;
    }
    out = QSA__ALLOC(char, outlen + 1);
    if (!out) {
        r = qsa__fail(QSA_ERR_OUT_OF_MEMORY, "nvrtc: out of memory for %zu bytes of output", outlen);
        goto done;
    }
    if (cubin) r = QSA__NVRTC_R(qsa__nvrtc.nvrtcGetCUBIN(prog, out));
    else r = QSA__NVRTC_R(qsa__nvrtc.nvrtcGetPTX(prog, out));
    if (r != QSA_OK) goto done;
    out[outlen] = 0;
    if (!cubin) outlen = strlen(out); /* the PTX size counts its NUL */
    qsa__log(QSA_LOG_INFO, "nvrtc: compiled %s for %s in %.0f ms (%zu bytes of %s, NVRTC %d.%d)", name, arch,
             1e3 * (qsa__now() - t0), outlen, cubin ? "CUBIN" : "PTX", qsa__nvrtc.major, qsa__nvrtc.minor);
    *image = out;
    *image_len = outlen;
    out = NULL;
done:
    if (prog) qsa__nvrtc.nvrtcDestroyProgram(&prog);
    if (log && logbuf) {
        *log = logbuf;
        logbuf = NULL;
    }
    qsa__free(logbuf);
    qsa__free(out);
    qsa__free((void *)all);
    return r;
}

/* Compiles the embedded kernels (kernels.cu) for `arch` (NULL: qsa__nvrtc_pick_arch(NULL, device_cc)).
   `arch_out` (may be NULL) receives the target used. */
QSA_PRIV qsa_result qsa__kernels_compile(const char *arch, int device_cc, const char *const *opts, int nopts,
                                         char **image, size_t *image_len, char **log, char *arch_out,
                                         size_t arch_cap) {
    char picked[32];
    *image = NULL;
    *image_len = 0;
    if (log) *log = NULL;
    QSA__TRY(qsa__nvrtc_pick_arch(arch, device_cc, picked, sizeof picked));
    if (arch_out) snprintf(arch_out, arch_cap, "%s", picked);
    char *src = qsa__kernels_source();
    if (!src) return qsa__fail(QSA_ERR_OUT_OF_MEMORY, "kernels.cu: out of memory");
    qsa_result r = qsa__nvrtc_compile(src, "kernels.cu", opts, nopts, picked, image, image_len, log);
    qsa__free(src);
    return r;
}

#endif /* QSA_NO_CUDA */

/* ============================================================================================== */
/* >>json  bounded, strict JSON parser (RFC 8259)                                                  */
/* ============================================================================================== */
/* The whole document is parsed into a tree of qsa__json nodes that live in an arena owned by the
   qsa__json_doc (a few large blocks, no per-node allocation).  Strict: UTF-8 is validated
   (overlongs, surrogates and code points above U+10FFFF are rejected), \u escapes are decoded
   (surrogate pairs joined, lone surrogates rejected), no trailing commas, no leading zeros, no
   trailing garbage, nesting bounded by QSA__JSON_MAX_DEPTH (the parser recurses at most that deep,
   so hostile input cannot overflow the stack).  Errors are QSA_ERR_FORMAT with
   "<source>: line L col C: <what>" (columns count bytes, from 1). */

#define QSA__JSON_MAX_DEPTH 128

typedef enum qsa__json_type {
    QSA__JSON_NULL, QSA__JSON_FALSE, QSA__JSON_TRUE, QSA__JSON_NUMBER, QSA__JSON_STRING, QSA__JSON_ARRAY,
    QSA__JSON_OBJECT
} qsa__json_type;

typedef struct qsa__json qsa__json;
struct qsa__json {
    qsa__json_type type;
    const char *key;     /* member name when inside an object (decoded, NUL-terminated), else NULL */
    size_t key_len;
    const char *str;     /* decoded string value (NUL-terminated; may contain NULs from \u0000) */
    size_t len;
    double num;          /* number value (also set for integers) */
    int64_t i64;         /* exact integer value when is_int; with is_u64 alone, the bits of the uint64 value */
    int is_int;          /* integral and exactly representable in int64 */
    int is_u64;          /* integral, not negative and exactly representable in uint64: qsa__json_u64 */
    qsa__json *child;    /* first element / member */
    qsa__json *next;     /* next sibling */
    size_t count;        /* number of children */
};

typedef struct qsa__json_block qsa__json_block;
struct qsa__json_block {
    qsa__json_block *prev;
    size_t size, used;
    /* data follows (aligned to 16) */
};

typedef struct qsa__json_doc {
    qsa__json *root;
    qsa__json_block *blocks; /* private: arena */
    size_t total;            /* private: bytes reserved in all blocks */
} qsa__json_doc;

typedef struct qsa__json_parser {
    const char *start, *p, *end;
    const char *source;
    qsa__json_doc *doc;
    const char *err_at;
    qsa_result err;
} qsa__json_parser;

QSA_PRIV void qsa__json_free(qsa__json_doc *doc) {
    if (!doc) return;
    qsa__json_block *b = doc->blocks;
    while (b) {
        qsa__json_block *prev = b->prev;
        qsa__free(b);
        b = prev;
    }
    memset(doc, 0, sizeof *doc);
}

#define QSA__JSON_HDR ((sizeof(qsa__json_block) + 15) & ~(size_t)15)

/* n bytes from the arena, 8-aligned; NULL when out of memory */
QSA_PRIV void *qsa__json_alloc(qsa__json_doc *doc, size_t n) {
    n = (n + 7) & ~(size_t)7;
    qsa__json_block *b = doc->blocks;
    if (!b || b->size - b->used < n) {
        size_t size = doc->total < ((size_t)64 << 10) ? ((size_t)64 << 10) : doc->total; /* doubling */
        if (size < n) size = n;
        if (size > SIZE_MAX - QSA__JSON_HDR) return NULL;
        qsa__json_block *nb = (qsa__json_block *)qsa__malloc(QSA__JSON_HDR + size);
        if (!nb) return NULL;
        nb->prev = b;
        nb->size = size;
        nb->used = 0;
        doc->blocks = nb;
        doc->total += size;
        b = nb;
    }
    void *p = (char *)b + QSA__JSON_HDR + b->used;
    b->used += n;
    return p;
}

QSA_PRIV qsa_result qsa__json_error(qsa__json_parser *ps, const char *at, const char *what) {
    if (ps->err != QSA_OK) return ps->err; /* keep the first (innermost) error */
    long line = 1, col = 1;
    for (const char *q = ps->start; q < at && q < ps->end; q++) {
        if (*q == '\n') { line++; col = 1; }
        else col++;
    }
    ps->err_at = at;
    ps->err = qsa__fail(QSA_ERR_FORMAT, "%s: line %ld col %ld: %s", ps->source, line, col, what);
    return ps->err;
}

QSA_PRIV qsa_result qsa__json_oom(qsa__json_parser *ps) {
    if (ps->err != QSA_OK) return ps->err;
    ps->err = qsa__fail(QSA_ERR_OUT_OF_MEMORY, "%s: out of memory while parsing JSON (%zu bytes)", ps->source,
                        (size_t)(ps->end - ps->start));
    return ps->err;
}

QSA_PRIV void qsa__json_skip_ws(qsa__json_parser *ps) {
    const char *p = ps->p, *e = ps->end;
    while (p < e && (*p == ' ' || *p == '\n' || *p == '\r' || *p == '\t')) p++;
    ps->p = p;
}

QSA_PRIV int qsa__json_hex4(const char *p, uint32_t *out) {
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) {
        char c = p[i];
        v <<= 4;
        if (c >= '0' && c <= '9') v |= (uint32_t)(c - '0');
        else if (c >= 'a' && c <= 'f') v |= (uint32_t)(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F') v |= (uint32_t)(c - 'A' + 10);
        else return 0;
    }
    *out = v;
    return 1;
}

/* ---- UTF-8 (the JSON parser's strings and the tokenizer) ------------------------------------- */

/* The sequence at s (n >= 1 bytes available): returns its length 1..4 and *cp when well-formed
   (Unicode table 3-7: no overlongs, no surrogates, <= U+10FFFF); 0 when ill-formed, with *sub =
   length of the maximal subpart to replace by one U+FFFD; -k when the k remaining bytes are a valid
   but truncated prefix. */
QSA_PRIV int qsa__u8_next(const uint8_t *s, size_t n, uint32_t *cp, int *sub) {
    uint8_t b = s[0], lo = 0x80, hi = 0xbf;
    int len;
    uint32_t c;
    if (b < 0x80) { *cp = b; return 1; }
    if (b >= 0xc2 && b <= 0xdf) { len = 2; c = b & 0x1fu; }
    else if (b >= 0xe0 && b <= 0xef) { len = 3; c = b & 0x0fu; if (b == 0xe0) lo = 0xa0; else if (b == 0xed) hi = 0x9f; }
    else if (b >= 0xf0 && b <= 0xf4) { len = 4; c = b & 0x07u; if (b == 0xf0) lo = 0x90; else if (b == 0xf4) hi = 0x8f; }
    else { *sub = 1; return 0; }
    for (int k = 1; k < len; k++) {
        if ((size_t)k >= n) { *sub = k; return -k; }
        uint8_t t = s[k];
        if (t < lo || t > hi) { *sub = k; return 0; }
        lo = 0x80; hi = 0xbf;
        c = (c << 6) | (t & 0x3fu);
    }
    *cp = c;
    return len;
}

QSA_PRIV int qsa__u8_put(char *d, uint32_t c) {
    if (c < 0x80) { d[0] = (char)c; return 1; }
    if (c < 0x800) { d[0] = (char)(0xc0 | (c >> 6)); d[1] = (char)(0x80 | (c & 0x3f)); return 2; }
    if (c < 0x10000) {
        d[0] = (char)(0xe0 | (c >> 12)); d[1] = (char)(0x80 | ((c >> 6) & 0x3f)); d[2] = (char)(0x80 | (c & 0x3f));
        return 3;
    }
    d[0] = (char)(0xf0 | (c >> 18)); d[1] = (char)(0x80 | ((c >> 12) & 0x3f));
    d[2] = (char)(0x80 | ((c >> 6) & 0x3f)); d[3] = (char)(0x80 | (c & 0x3f));
    return 4;
}

/* Length of the valid UTF-8 sequence at p (lead byte >= 0x80), 0 when invalid or cut short by e. */
QSA_PRIV int qsa__utf8_valid_seq(const unsigned char *p, const unsigned char *e) {
    uint32_t cp;
    int sub = 0, n = qsa__u8_next(p, (size_t)(e - p), &cp, &sub);
    return n > 0 ? n : 0;
}

/* Parses the string starting at ps->p (on the opening quote) into arena memory. */
QSA_PRIV qsa_result qsa__json_string(qsa__json_parser *ps, const char **out, size_t *out_len) {
    const char *open = ps->p, *q = ps->p + 1, *e = ps->end;
    /* pass 1: find the closing quote (escapes only shrink when decoded) */
    unsigned plain = 1; /* only printable ASCII without escapes: copy as is */
    while (q < e && *q != '"') {
        unsigned char c = (unsigned char)*q;
        plain &= (c >= 0x20) & (c < 0x80);
        if (c == '\\') {
            plain = 0;
            if (e - q < 2) { q = e; break; }
            q += 2;
        } else q++;
    }
    if (q >= e) return qsa__json_error(ps, open, "unterminated string");
    size_t raw = (size_t)(q - open - 1);
    char *dst = (char *)qsa__json_alloc(ps->doc, raw + 1);
    if (!dst) return qsa__json_oom(ps);
    if (plain) {
        memcpy(dst, open + 1, raw);
        dst[raw] = 0;
        *out = dst;
        *out_len = raw;
        ps->p = q + 1;
        return QSA_OK;
    }
    /* pass 2: validate and decode */
    const unsigned char *s = (const unsigned char *)open + 1, *se = (const unsigned char *)q;
    const unsigned char *ue = (const unsigned char *)e;
    char *d = dst;
    while (s < se) {
        unsigned c = *s;
        if (c >= 0x20 && c < 0x80 && c != '\\') { *d++ = (char)c; s++; continue; }
        if (c < 0x20) return qsa__json_error(ps, (const char *)s, "control character in string (must be escaped)");
        if (c >= 0x80) {
            int n = qsa__utf8_valid_seq(s, ue);
            if (!n || s + n > se) return qsa__json_error(ps, (const char *)s, "invalid UTF-8 in string");
            memcpy(d, s, (size_t)n);
            d += n;
            s += n;
            continue;
        }
        /* escape */
        const char *esc = (const char *)s;
        s++;
        switch (*s) {
        case '"': *d++ = '"'; s++; break;
        case '\\': *d++ = '\\'; s++; break;
        case '/': *d++ = '/'; s++; break;
        case 'b': *d++ = '\b'; s++; break;
        case 'f': *d++ = '\f'; s++; break;
        case 'n': *d++ = '\n'; s++; break;
        case 'r': *d++ = '\r'; s++; break;
        case 't': *d++ = '\t'; s++; break;
        case 'u': {
            uint32_t cp, lo;
            if (se - s < 5 || !qsa__json_hex4((const char *)s + 1, &cp))
                return qsa__json_error(ps, esc, "bad \\u escape (want 4 hex digits)");
            s += 5;
            if (cp >= 0xdc00 && cp <= 0xdfff) return qsa__json_error(ps, esc, "lone low surrogate in \\u escape");
            if (cp >= 0xd800 && cp <= 0xdbff) {
                if (se - s < 6 || s[0] != '\\' || s[1] != 'u' || !qsa__json_hex4((const char *)s + 2, &lo) ||
                    lo < 0xdc00 || lo > 0xdfff)
                    return qsa__json_error(ps, esc, "lone high surrogate in \\u escape (no low surrogate follows)");
                s += 6;
                cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
            }
            d += qsa__u8_put(d, cp);
            break;
        }
        default: return qsa__json_error(ps, esc, "invalid escape in string");
        }
    }
    *d = 0;
    *out = dst;
    *out_len = (size_t)(d - dst);
    ps->p = q + 1;
    return QSA_OK;
}

/* Decimal point of the C library's current locale (strtod honours it). */
QSA_PRIV char qsa__json_decimal_point(void) {
    char b[8];
    snprintf(b, sizeof b, "%.1f", 1.5);
    return b[1];
}

QSA_PRIV qsa_result qsa__json_number(qsa__json_parser *ps, qsa__json *n) {
    const char *p = ps->p, *e = ps->end, *b = p;
    int neg = 0, frac = 0, expo = 0;
    if (p < e && *p == '-') { neg = 1; p++; }
    if (p >= e || *p < '0' || *p > '9') return qsa__json_error(ps, b, "invalid number (digit expected)");
    const char *ds = p;
    if (*p == '0') {
        p++;
        if (p < e && *p >= '0' && *p <= '9') return qsa__json_error(ps, b, "invalid number (leading zero)");
    } else {
        while (p < e && *p >= '0' && *p <= '9') p++;
    }
    const char *de = p;
    if (p < e && *p == '.') {
        frac = 1;
        p++;
        if (p >= e || *p < '0' || *p > '9') return qsa__json_error(ps, b, "invalid number (digit expected after '.')");
        while (p < e && *p >= '0' && *p <= '9') p++;
    }
    if (p < e && (*p == 'e' || *p == 'E')) {
        expo = 1;
        p++;
        if (p < e && (*p == '+' || *p == '-')) p++;
        if (p >= e || *p < '0' || *p > '9') return qsa__json_error(ps, b, "invalid number (digit expected in exponent)");
        while (p < e && *p >= '0' && *p <= '9') p++;
    }
    ps->p = p;
    n->type = QSA__JSON_NUMBER;
    if (!frac && !expo) {
        /* exact integer from the digits */
        uint64_t v = 0;
        int ok = 1;
        for (const char *q = ds; q < de; q++) {
            unsigned dg = (unsigned)(*q - '0');
            if (v > (UINT64_MAX - dg) / 10) { ok = 0; break; }
            v = v * 10 + dg;
        }
        if (ok && (!neg || v == 0)) {
            n->is_u64 = 1;
            n->i64 = (int64_t)v; /* two's complement: the conversion keeps the bits (C11 6.3.1.3, as every
                                    compiler this header supports defines it) */
            n->num = (double)v;
        }
        if (ok && (neg ? v <= (uint64_t)INT64_MAX + 1 : v <= (uint64_t)INT64_MAX)) {
            n->is_int = 1;
            n->i64 = neg ? (v == (uint64_t)INT64_MAX + 1 ? INT64_MIN : -(int64_t)v) : (int64_t)v;
            n->num = neg ? -(double)v : (double)v;
            if (neg && v == 0) n->num = -0.0;
            return QSA_OK; /* integer to double conversion rounds correctly */
        }
    }
    /* general case: strtod on a NUL-terminated copy, with the locale's decimal point */
    size_t len = (size_t)(p - b);
    char small[128], *buf = small;
    if (len >= sizeof small) {
        buf = QSA__ALLOC(char, len + 1);
        if (!buf) return qsa__json_oom(ps);
    }
    memcpy(buf, b, len);
    buf[len] = 0;
    char dp = qsa__json_decimal_point();
    if (dp != '.')
        for (size_t i = 0; i < len; i++) if (buf[i] == '.') buf[i] = dp;
    n->num = strtod(buf, NULL);
    if (buf != small) qsa__free(buf);
    if (!n->is_int && (frac || expo) && n->num == floor(n->num) && fabs(n->num) <= 9007199254740992.0) {
        n->is_int = 1; /* e.g. 1.0 or 1e3: integral and exact */
        n->i64 = (int64_t)n->num;
        n->is_u64 = n->i64 >= 0;
    }
    return QSA_OK;
}

QSA_PRIV int qsa__json_lit(qsa__json_parser *ps, const char *word, size_t n) {
    if ((size_t)(ps->end - ps->p) < n || memcmp(ps->p, word, n) != 0) return 0;
    ps->p += n;
    return 1;
}

QSA_PRIV qsa_result qsa__json_value(qsa__json_parser *ps, qsa__json *n, int depth);

QSA_PRIV qsa_result qsa__json_container(qsa__json_parser *ps, qsa__json *n, int depth, int is_obj) {
    const char *open = ps->p;
    if (depth >= QSA__JSON_MAX_DEPTH) {
        char what[96];
        snprintf(what, sizeof what, "nesting depth exceeds %d", QSA__JSON_MAX_DEPTH);
        return qsa__json_error(ps, open, what);
    }
    n->type = is_obj ? QSA__JSON_OBJECT : QSA__JSON_ARRAY;
    ps->p++;
    qsa__json_skip_ws(ps);
    char close = is_obj ? '}' : ']';
    if (ps->p < ps->end && *ps->p == close) { ps->p++; return QSA_OK; }
    qsa__json *tail = NULL;
    for (;;) {
        qsa__json *c = (qsa__json *)qsa__json_alloc(ps->doc, sizeof(qsa__json));
        if (!c) return qsa__json_oom(ps);
        memset(c, 0, sizeof *c);
        if (is_obj) {
            if (ps->p >= ps->end) return qsa__json_error(ps, ps->p, "unexpected end of input in object (member name expected)");
            if (*ps->p != '"') return qsa__json_error(ps, ps->p, "member name (string) expected in object");
            QSA__TRY(qsa__json_string(ps, &c->key, &c->key_len));
            qsa__json_skip_ws(ps);
            if (ps->p >= ps->end || *ps->p != ':') return qsa__json_error(ps, ps->p, "':' expected after member name");
            ps->p++;
            qsa__json_skip_ws(ps);
        }
        QSA__TRY(qsa__json_value(ps, c, depth + 1));
        if (tail) tail->next = c;
        else n->child = c;
        tail = c;
        n->count++;
        qsa__json_skip_ws(ps);
        if (ps->p >= ps->end)
            return qsa__json_error(ps, ps->p, is_obj ? "unexpected end of input in object (',' or '}' expected)"
                                                     : "unexpected end of input in array (',' or ']' expected)");
        if (*ps->p == close) { ps->p++; return QSA_OK; }
        if (*ps->p != ',') return qsa__json_error(ps, ps->p, is_obj ? "',' or '}' expected in object" : "',' or ']' expected in array");
        ps->p++;
        qsa__json_skip_ws(ps);
        if (ps->p < ps->end && *ps->p == close) return qsa__json_error(ps, ps->p, "trailing comma");
    }
}

QSA_PRIV qsa_result qsa__json_value(qsa__json_parser *ps, qsa__json *n, int depth) {
    if (ps->p >= ps->end) return qsa__json_error(ps, ps->p, "unexpected end of input (value expected)");
    switch (*ps->p) {
    case '{': return qsa__json_container(ps, n, depth, 1);
    case '[': return qsa__json_container(ps, n, depth, 0);
    case '"': n->type = QSA__JSON_STRING; return qsa__json_string(ps, &n->str, &n->len);
    case 't': if (qsa__json_lit(ps, "true", 4)) { n->type = QSA__JSON_TRUE; return QSA_OK; } break;
    case 'f': if (qsa__json_lit(ps, "false", 5)) { n->type = QSA__JSON_FALSE; return QSA_OK; } break;
    case 'n': if (qsa__json_lit(ps, "null", 4)) { n->type = QSA__JSON_NULL; return QSA_OK; } break;
    default:
        if (*ps->p == '-' || (*ps->p >= '0' && *ps->p <= '9')) return qsa__json_number(ps, n);
        break;
    }
    if ((unsigned char)*ps->p >= 0x80 && !qsa__utf8_valid_seq((const unsigned char *)ps->p, (const unsigned char *)ps->end))
        return qsa__json_error(ps, ps->p, "invalid UTF-8");
    return qsa__json_error(ps, ps->p, "unexpected character (value expected)");
}

/* Parse `len` bytes of `text` (need not be NUL-terminated).  `source` names the file in errors.
   On failure the doc is left empty (nothing to free). */
QSA_PRIV qsa_result qsa__json_parse(const char *text, size_t len, const char *source, qsa__json_doc *doc) {
    memset(doc, 0, sizeof *doc);
    qsa__json_parser ps;
    memset(&ps, 0, sizeof ps);
    ps.start = ps.p = text ? text : "";
    ps.end = ps.start + (text ? len : 0);
    ps.source = source ? source : "JSON";
    ps.doc = doc;
    /* a UTF-8 byte order mark is not JSON (RFC 8259 section 8.1: parsers MAY ignore it); we skip it */
    if (ps.end - ps.p >= 3 && (unsigned char)ps.p[0] == 0xef && (unsigned char)ps.p[1] == 0xbb && (unsigned char)ps.p[2] == 0xbf)
        ps.p += 3;
    qsa__json *root = (qsa__json *)qsa__json_alloc(doc, sizeof(qsa__json));
    if (!root) { qsa__json_oom(&ps); qsa__json_free(doc); return ps.err; }
    memset(root, 0, sizeof *root);
    qsa__json_skip_ws(&ps);
    qsa_result r = qsa__json_value(&ps, root, 0);
    if (r == QSA_OK) {
        qsa__json_skip_ws(&ps);
        if (ps.p != ps.end) r = qsa__json_error(&ps, ps.p, "trailing characters after the JSON value");
    }
    if (r != QSA_OK) { qsa__json_free(doc); return r; }
    doc->root = root;
    return QSA_OK;
}

/* Member `key` of an object (the last one if the name repeats, like Python's json); NULL if absent
   or obj is not an object. */
QSA_PRIV const qsa__json *qsa__json_get(const qsa__json *obj, const char *key) {
    if (!obj || obj->type != QSA__JSON_OBJECT || !key) return NULL;
    size_t kl = strlen(key);
    const qsa__json *found = NULL;
    for (const qsa__json *c = obj->child; c; c = c->next)
        if (c->key_len == kl && memcmp(c->key, key, kl) == 0) found = c;
    return found;
}

/* A JSON number that is an integer in 0 .. UINT64_MAX (a seed, say): 1 and *out, else 0. */
QSA_PRIV int qsa__json_u64(const qsa__json *v, uint64_t *out) {
    if (!v || v->type != QSA__JSON_NUMBER || !v->is_u64) return 0;
    *out = (uint64_t)v->i64;
    return 1;
}

/* Small typed accessors used by the config and safetensors readers. */
QSA_PRIV int qsa__json_is_str(const qsa__json *v, const char *s) {
    return v && v->type == QSA__JSON_STRING && strlen(s) == v->len && memcmp(v->str, s, v->len) == 0;
}
QSA_PRIV const char *qsa__json_type_name(const qsa__json *v) {
    if (!v) return "absent";
    switch (v->type) {
    case QSA__JSON_NULL: return "null";
    case QSA__JSON_FALSE: case QSA__JSON_TRUE: return "boolean";
    case QSA__JSON_NUMBER: return v->is_int ? "integer" : "number";
    case QSA__JSON_STRING: return "string";
    case QSA__JSON_ARRAY: return "array";
    case QSA__JSON_OBJECT: return "object";
    }
    return "?";
}

/* ============================================================================================== */
/* >>config  config.json / generation_config.json / quantisation config                           */
/* ============================================================================================== */
/* Mirrors transformers' Qwen4ExpTextConfig (configuration_qwen4_exp.py): the same defaults, the
   same __post_init__ normalisation (ple_layer_ids sorted and unique, ple_embed_dim defaulting to
   hidden_size, layer_types from full_attention_interval, "full_attention" meaning
   "qwen_sparse_attention", legacy top-level rope_theta / partial_rotary_factor) and every rule of
   validate_architecture, in the same order.  After them come bounds that protect the runtime
   (positive sizes, divisibility of head counts, at most QSA_MAX_LAYERS layers, ...).
   Error codes: QSA_ERR_FORMAT for malformed or invalid values, QSA_ERR_UNSUPPORTED for valid
   configurations this runtime does not run (other model types, rope types, quantisation methods,
   layer types, activations).  JSON null counts as "absent" (HF writes null for unset options). */

typedef struct qsa__cfgr {
    const qsa__json *obj;
    const char *src; /* file name for messages */
    const char *pfx; /* "" or "text_config." */
} qsa__cfgr;

/* short description of a JSON value for "found ..." in messages */
QSA_PRIV const char *qsa__cfg_found(const qsa__json *v, char *buf, size_t n) {
    if (!v) snprintf(buf, n, "nothing");
    else if (v->type == QSA__JSON_NUMBER && v->is_int) snprintf(buf, n, "%lld", (long long)v->i64);
    else if (v->type == QSA__JSON_NUMBER) snprintf(buf, n, "%.17g", v->num);
    else if (v->type == QSA__JSON_STRING) snprintf(buf, n, "\"%.40s%s\"", v->str, v->len > 40 ? "..." : "");
    else if (v->type == QSA__JSON_TRUE) snprintf(buf, n, "true");
    else if (v->type == QSA__JSON_FALSE) snprintf(buf, n, "false");
    else snprintf(buf, n, "%s", qsa__json_type_name(v));
    return buf;
}

/* member `name`, NULL when absent or null */
QSA_PRIV const qsa__json *qsa__cfg_node(const qsa__cfgr *r, const char *name) {
    const qsa__json *v = qsa__json_get(r->obj, name);
    return (v && v->type == QSA__JSON_NULL) ? NULL : v;
}

QSA_PRIV qsa_result qsa__cfg_type_error(const qsa__cfgr *r, const char *name, const char *want, const qsa__json *v) {
    char f[96];
    return qsa__fail(QSA_ERR_FORMAT, "%s: %s%s: expected %s, found %s", r->src, r->pfx, name, want, qsa__cfg_found(v, f, sizeof f));
}

QSA_PRIV qsa_result qsa__cfg_i64(const qsa__cfgr *r, const char *name, int64_t def, int64_t lo, int64_t hi, int64_t *out,
                                 int *present) {
    const qsa__json *v = qsa__cfg_node(r, name);
    if (present) *present = v != NULL;
    if (!v) { *out = def; return QSA_OK; }
    if (v->type != QSA__JSON_NUMBER || !v->is_int) return qsa__cfg_type_error(r, name, "an integer", v);
    if (v->i64 < lo || v->i64 > hi) {
        char want[96];
        snprintf(want, sizeof want, "an integer in [%lld, %lld]", (long long)lo, (long long)hi);
        return qsa__cfg_type_error(r, name, want, v);
    }
    *out = v->i64;
    return QSA_OK;
}
/* an int field; any value that fits a C int is read (the rules below judge it) */
QSA_PRIV qsa_result qsa__cfg_int(const qsa__cfgr *r, const char *name, int def, int *out, int *present) {
    int64_t v;
    QSA__TRY(qsa__cfg_i64(r, name, def, INT32_MIN, INT32_MAX, &v, present));
    *out = (int)v;
    return QSA_OK;
}
QSA_PRIV qsa_result qsa__cfg_num(const qsa__cfgr *r, const char *name, double def, double *out) {
    const qsa__json *v = qsa__cfg_node(r, name);
    if (!v) { *out = def; return QSA_OK; }
    if (v->type != QSA__JSON_NUMBER) return qsa__cfg_type_error(r, name, "a number", v);
    *out = v->num;
    return QSA_OK;
}
QSA_PRIV qsa_result qsa__cfg_bool(const qsa__cfgr *r, const char *name, int def, int *out) {
    const qsa__json *v = qsa__cfg_node(r, name);
    if (!v) { *out = def; return QSA_OK; }
    if (v->type == QSA__JSON_TRUE || v->type == QSA__JSON_FALSE) { *out = v->type == QSA__JSON_TRUE; return QSA_OK; }
    if (v->type == QSA__JSON_NUMBER && v->is_int && (v->i64 == 0 || v->i64 == 1)) { *out = (int)v->i64; return QSA_OK; }
    return qsa__cfg_type_error(r, name, "a boolean", v);
}
/* string field: NULL when absent */
QSA_PRIV qsa_result qsa__cfg_str(const qsa__cfgr *r, const char *name, const qsa__json **out) {
    const qsa__json *v = qsa__cfg_node(r, name);
    *out = NULL;
    if (!v) return QSA_OK;
    if (v->type != QSA__JSON_STRING) return qsa__cfg_type_error(r, name, "a string", v);
    *out = v;
    return QSA_OK;
}

QSA_PRIV int qsa__cfg_act(const qsa__json *s, qsa_act *out) {
    if (qsa__json_is_str(s, "silu") || qsa__json_is_str(s, "swish")) { *out = QSA_ACT_SILU; return 1; }
    if (qsa__json_is_str(s, "sigmoid")) { *out = QSA_ACT_SIGMOID; return 1; }
    return 0;
}

/* eos_token_id: an integer or a list of integers (each in [0, 2^31)) */
QSA_PRIV qsa_result qsa__cfg_eos(const qsa__cfgr *r, int *n_eos, int32_t *ids, int *present) {
    const qsa__json *v = qsa__cfg_node(r, "eos_token_id");
    *n_eos = 0;
    *present = v != NULL;
    if (!v) return QSA_OK;
    const qsa__json *e = v->type == QSA__JSON_ARRAY ? v->child : v;
    if (v->type == QSA__JSON_ARRAY && v->count > QSA_MAX_EOS) {
        return qsa__fail(QSA_ERR_FORMAT, "%s: %seos_token_id: expected at most %d ids, found %zu", r->src, r->pfx,
                         QSA_MAX_EOS, v->count);
    }
    for (; e; e = (v->type == QSA__JSON_ARRAY) ? e->next : NULL) {
        if (e->type != QSA__JSON_NUMBER || !e->is_int || e->i64 < 0 || e->i64 > INT32_MAX)
            return qsa__cfg_type_error(r, "eos_token_id", "a token id (integer in [0, 2^31)) or a list of them", e);
        ids[(*n_eos)++] = (int32_t)e->i64;
    }
    return QSA_OK;
}

/* glob match with '*' and '?' (ModelOpt exclude patterns are fnmatch patterns) */
QSA_PRIV int qsa__glob(const char *pat, const char *s) {
    const char *star = NULL, *ss = NULL;
    while (*s) {
        if (*pat == '?' || *pat == *s) { pat++; s++; }
        else if (*pat == '*') { star = pat++; ss = s; }
        else if (star) { pat = star + 1; s = ++ss; }
        else return 0;
    }
    while (*pat == '*') pat++;
    return *pat == 0;
}

QSA_IMPL int qsa_config_quant_excluded(const qsa_model_config *c, const char *module) {
    const char *p = c->quant_exclude;
    for (int i = 0; i < c->n_quant_exclude; i++) {
        if (strncmp(p, "re:", 3) != 0 && qsa__glob(p, module)) return 1;
        p += strlen(p) + 1;
    }
    return 0;
}

/* appends the strings of a JSON array to out->quant_exclude */
QSA_PRIV qsa_result qsa__cfg_add_excludes(qsa_model_config *out, const qsa__json *arr, const char *src, const char *field) {
    if (!arr || arr->type == QSA__JSON_NULL) return QSA_OK;
    if (arr->type != QSA__JSON_ARRAY)
        return qsa__fail(QSA_ERR_FORMAT, "%s: %s: expected a list of module name patterns, found %s", src, field,
                         qsa__json_type_name(arr));
    size_t used = 0;
    for (int i = 0; i < out->n_quant_exclude; i++) used += strlen(out->quant_exclude + used) + 1;
    for (const qsa__json *e = arr->child; e; e = e->next) {
        if (e->type != QSA__JSON_STRING)
            return qsa__fail(QSA_ERR_FORMAT, "%s: %s: expected strings, found %s", src, field, qsa__json_type_name(e));
        if (strlen(e->str) != e->len) continue; /* embedded NUL: cannot match a module name */
        int dup = 0;
        for (size_t k = 0; k < used && !dup; k += strlen(out->quant_exclude + k) + 1) dup = !strcmp(out->quant_exclude + k, e->str);
        if (dup) continue; /* the same list in quantization_config and hf_quant_config.json */
        if (used + e->len + 1 > sizeof out->quant_exclude) {
            if (!out->quant_exclude_truncated)
                qsa__log(QSA_LOG_WARN, "%s: %s: more patterns than fit (%zu bytes); the rest are not kept (tensors "
                         "without weight_scale are treated as unquantised anyway)", src, field, sizeof out->quant_exclude);
            out->quant_exclude_truncated = 1;
            return QSA_OK;
        }
        memcpy(out->quant_exclude + used, e->str, e->len + 1);
        used += e->len + 1;
        out->n_quant_exclude++;
    }
    return QSA_OK;
}

/* "NVFP4" (ok), "MIXED_PRECISION" with only NVFP4 layers (ok), anything else unsupported */
QSA_PRIV qsa_result qsa__cfg_quant_algo(const qsa__json *q, const char *src, const char *where) {
    const qsa__json *algo = qsa__json_get(q, "quant_algo");
    char f[96];
    if (qsa__json_is_str(algo, "NVFP4")) return QSA_OK;
    if (qsa__json_is_str(algo, "MIXED_PRECISION")) {
        const qsa__json *layers = qsa__json_get(q, "quantized_layers");
        if (!layers || layers->type != QSA__JSON_OBJECT)
            return qsa__fail(QSA_ERR_FORMAT, "%s: %s.quantized_layers: expected an object for MIXED_PRECISION, found %s",
                             src, where, qsa__json_type_name(layers));
        for (const qsa__json *l = layers->child; l; l = l->next) {
            const qsa__json *a = qsa__json_get(l, "quant_algo");
            if (!qsa__json_is_str(a, "NVFP4"))
                return qsa__fail(QSA_ERR_UNSUPPORTED, "%s: %s.quantized_layers.%s.quant_algo: only NVFP4 is supported, found %s",
                                 src, where, l->key, qsa__cfg_found(a, f, sizeof f));
        }
        return QSA_OK;
    }
    return qsa__fail(QSA_ERR_UNSUPPORTED, "%s: %s.quant_algo: only NVFP4 (ModelOpt) is supported, found %s", src, where,
                     qsa__cfg_found(algo, f, sizeof f));
}

/* group size from `group_size` or config_groups.*.weights.group_size; 16 when absent */
QSA_PRIV qsa_result qsa__cfg_group_size(const qsa__json *q, const char *src, const char *where, qsa_model_config *out) {
    const qsa__json *g = qsa__json_get(q, "group_size");
    const qsa__json *groups = qsa__json_get(q, "config_groups");
    if ((!g || g->type == QSA__JSON_NULL) && groups && groups->type == QSA__JSON_OBJECT)
        for (const qsa__json *grp = groups->child; grp; grp = grp->next) {
            const qsa__json *w = qsa__json_get(grp, "weights");
            const qsa__json *gs = qsa__json_get(w, "group_size");
            if (gs && gs->type != QSA__JSON_NULL) { g = gs; break; }
        }
    if (!g || g->type == QSA__JSON_NULL) { out->quant_group_size = 16; return QSA_OK; }
    if (g->type != QSA__JSON_NUMBER || !g->is_int || g->i64 != 16) {
        char f[96];
        return qsa__fail(QSA_ERR_UNSUPPORTED, "%s: %s group_size: NVFP4 needs 16, found %s", src, where, qsa__cfg_found(g, f, sizeof f));
    }
    out->quant_group_size = 16;
    return QSA_OK;
}

/* quantization_config inside config.json */
QSA_PRIV qsa_result qsa__cfg_quant_config(const qsa__json *qc, const char *src, qsa_model_config *out) {
    char f[96];
    if (qc->type != QSA__JSON_OBJECT)
        return qsa__fail(QSA_ERR_FORMAT, "%s: quantization_config: expected an object, found %s", src, qsa__json_type_name(qc));
    const qsa__json *method = qsa__json_get(qc, "quant_method");
    if (qsa__json_is_str(method, "modelopt") || qsa__json_is_str(method, "modelopt_fp4") || !method ||
        method->type == QSA__JSON_NULL) {
        /* ModelOpt: either flat {quant_algo, group_size, exclude_modules|ignore} or nested "quantization" */
        const qsa__json *inner = qsa__json_get(qc, "quantization");
        const qsa__json *q = (inner && inner->type == QSA__JSON_OBJECT) ? inner : qc;
        if (!qsa__json_get(q, "quant_algo") && !method)
            return qsa__fail(QSA_ERR_FORMAT, "%s: quantization_config: neither quant_method nor quant_algo is set", src);
        QSA__TRY(qsa__cfg_quant_algo(q, src, "quantization_config"));
        QSA__TRY(qsa__cfg_group_size(q, src, "quantization_config", out));
        QSA__TRY(qsa__cfg_add_excludes(out, qsa__json_get(q, "exclude_modules"), src, "quantization_config.exclude_modules"));
        QSA__TRY(qsa__cfg_add_excludes(out, qsa__json_get(q, "ignore"), src, "quantization_config.ignore"));
        out->nvfp4 = 1;
        if (out->quant_format != QSA_QUANT_COMPRESSED_TENSORS) out->quant_format = QSA_QUANT_MODELOPT;
        return QSA_OK;
    }
    if (qsa__json_is_str(method, "compressed-tensors")) {
        /* llm-compressor NVFP4: format "nvfp4-pack-quantized" (weight_packed, weight_scale, weight_global_scale) */
        const qsa__json *fmt = qsa__json_get(qc, "format");
        const qsa__json *groups = qsa__json_get(qc, "config_groups");
        if (!qsa__json_is_str(fmt, "nvfp4-pack-quantized") && groups && groups->type == QSA__JSON_OBJECT)
            for (const qsa__json *g = groups->child; g; g = g->next) {
                const qsa__json *gf = qsa__json_get(g, "format");
                if (gf && gf->type == QSA__JSON_STRING) { fmt = gf; break; }
            }
        if (!qsa__json_is_str(fmt, "nvfp4-pack-quantized"))
            return qsa__fail(QSA_ERR_UNSUPPORTED, "%s: quantization_config.format: only nvfp4-pack-quantized is supported "
                             "for compressed-tensors, found %s", src, qsa__cfg_found(fmt, f, sizeof f));
        QSA__TRY(qsa__cfg_group_size(qc, src, "quantization_config", out));
        QSA__TRY(qsa__cfg_add_excludes(out, qsa__json_get(qc, "ignore"), src, "quantization_config.ignore"));
        out->nvfp4 = 1;
        out->quant_format = QSA_QUANT_COMPRESSED_TENSORS;
        return QSA_OK;
    }
    return qsa__fail(QSA_ERR_UNSUPPORTED, "%s: quantization_config.quant_method: only modelopt (NVFP4) and compressed-tensors "
                     "(nvfp4-pack-quantized) are supported, found %s", src, qsa__cfg_found(method, f, sizeof f));
}

/* hf_quant_config.json: {"producer": {...}, "quantization": {"quant_algo": "NVFP4", "group_size": 16, "exclude_modules": [...]}} */
QSA_PRIV qsa_result qsa__cfg_hf_quant(const char *text, size_t len, const char *src, qsa_model_config *out) {
    qsa__json_doc doc;
    QSA__TRY(qsa__json_parse(text, len, src, &doc));
    qsa_result r = QSA_OK;
    const qsa__json *q = qsa__json_get(doc.root, "quantization");
    if (!q || q->type != QSA__JSON_OBJECT)
        r = qsa__fail(QSA_ERR_FORMAT, "%s: quantization: expected an object, found %s", src, qsa__json_type_name(q));
    if (r == QSA_OK) r = qsa__cfg_quant_algo(q, src, "quantization");
    if (r == QSA_OK) r = qsa__cfg_group_size(q, src, "quantization", out);
    if (r == QSA_OK) r = qsa__cfg_add_excludes(out, qsa__json_get(q, "exclude_modules"), src, "quantization.exclude_modules");
    if (r == QSA_OK) {
        out->nvfp4 = 1;
        if (out->quant_format == QSA_QUANT_NONE) out->quant_format = QSA_QUANT_MODELOPT;
    }
    qsa__json_free(&doc);
    return r;
}

static int qsa__cfg_cmp_i64(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* the text-config fields; r->obj is the (flat or nested) text config */
QSA_PRIV qsa_result qsa__cfg_text(const qsa__cfgr *r, qsa_model_config *c) {
    const char *src = r->src, *pfx = r->pfx;
    /* ---- fields and defaults of Qwen4ExpTextConfig ---- */
    QSA__TRY(qsa__cfg_int(r, "vocab_size", 248320, &c->vocab_size, NULL));
    QSA__TRY(qsa__cfg_int(r, "hidden_size", 2048, &c->hidden_size, NULL));
    QSA__TRY(qsa__cfg_int(r, "num_hidden_layers", 40, &c->num_hidden_layers, NULL));
    QSA__TRY(qsa__cfg_int(r, "num_attention_heads", 16, &c->num_attention_heads, NULL));
    QSA__TRY(qsa__cfg_int(r, "num_key_value_heads", 2, &c->num_key_value_heads, NULL));
    QSA__TRY(qsa__cfg_int(r, "head_dim", 256, &c->head_dim, NULL));
    QSA__TRY(qsa__cfg_int(r, "max_position_embeddings", 32768, &c->max_position_embeddings, NULL));
    double eps;
    QSA__TRY(qsa__cfg_num(r, "rms_norm_eps", 1e-6, &eps));
    c->rms_norm_eps = (float)eps;
    QSA__TRY(qsa__cfg_bool(r, "tie_word_embeddings", 0, &c->tie_word_embeddings));
    QSA__TRY(qsa__cfg_bool(r, "attention_bias", 0, &c->attention_bias));
    QSA__TRY(qsa__cfg_int(r, "linear_conv_kernel_dim", 4, &c->linear_conv_kernel_dim, NULL));
    QSA__TRY(qsa__cfg_int(r, "linear_key_head_dim", 128, &c->linear_key_head_dim, NULL));
    QSA__TRY(qsa__cfg_int(r, "linear_value_head_dim", 128, &c->linear_value_head_dim, NULL));
    QSA__TRY(qsa__cfg_int(r, "linear_num_key_heads", 16, &c->linear_num_key_heads, NULL));
    QSA__TRY(qsa__cfg_int(r, "linear_num_value_heads", 32, &c->linear_num_value_heads, NULL));
    QSA__TRY(qsa__cfg_int(r, "moe_intermediate_size", 512, &c->moe_intermediate_size, NULL));
    QSA__TRY(qsa__cfg_int(r, "shared_expert_intermediate_size", 512, &c->shared_expert_intermediate_size, NULL));
    QSA__TRY(qsa__cfg_int(r, "num_experts_per_tok", 10, &c->num_experts_per_tok, NULL));
    QSA__TRY(qsa__cfg_int(r, "num_experts", 512, &c->num_experts, NULL));
    QSA__TRY(qsa__cfg_bool(r, "norm_topk_prob", 1, &c->norm_topk_prob));
    QSA__TRY(qsa__cfg_int(r, "hc_count", 4, &c->hc_count, NULL));
    QSA__TRY(qsa__cfg_int(r, "hc_lowrank", 320, &c->hc_lowrank, NULL));
    int ple_embed_present;
    QSA__TRY(qsa__cfg_int(r, "ple_embed_dim", 0, &c->ple_embed_dim, &ple_embed_present));
    if (!ple_embed_present) c->ple_embed_dim = c->hidden_size;
    QSA__TRY(qsa__cfg_int(r, "ple_conv_kernel_size", 4, &c->ple_conv_kernel_size, NULL));
    QSA__TRY(qsa__cfg_int(r, "ngram_size", 3, &c->ngram_size, NULL));
    QSA__TRY(qsa__cfg_int(r, "heads_per_ngram", 8, &c->heads_per_ngram, NULL));
    QSA__TRY(qsa__cfg_i64(r, "ngram_vocab_size_base", 20000000, INT64_MIN, INT64_MAX, &c->ngram_vocab_size_base, NULL));
    QSA__TRY(qsa__cfg_int(r, "make_ngram_vocab_size_divisible_by", 128, &c->make_ngram_vocab_size_divisible_by, NULL));
    QSA__TRY(qsa__cfg_i64(r, "seed", 1234, INT64_MIN, INT64_MAX, &c->seed, NULL));
    QSA__TRY(qsa__cfg_int(r, "split_ngram_parts", 512, &c->split_ngram_parts, NULL));
    int64_t bos, pad;
    QSA__TRY(qsa__cfg_i64(r, "bos_token_id", -1, INT64_MIN, INT64_MAX, &bos, NULL));
    QSA__TRY(qsa__cfg_i64(r, "pad_token_id", -1, INT64_MIN, INT64_MAX, &pad, NULL));
    c->bos_token_id = (bos >= 0 && bos <= INT32_MAX) ? (int32_t)bos : -1; /* HF tolerates e.g. -1: "absent" */
    c->pad_token_id = (pad >= 0 && pad <= INT32_MAX) ? (int32_t)pad : -1;
    int eos_present;
    QSA__TRY(qsa__cfg_eos(r, &c->n_eos, c->eos_token_ids, &eos_present));

    /* activations */
    const qsa__json *act, *gate;
    QSA__TRY(qsa__cfg_str(r, "hidden_act", &act));
    QSA__TRY(qsa__cfg_str(r, "output_gate_type", &gate));
    snprintf(c->hidden_act_name, sizeof c->hidden_act_name, "%s", act ? act->str : "silu");
    int hidden_act_ok = act ? qsa__cfg_act(act, &c->hidden_act) : (c->hidden_act = QSA_ACT_SILU, 1);

    /* RoPE: rope_parameters (or legacy rope_scaling), then legacy top-level rope_theta / partial_rotary_factor */
    const qsa__json *rp = qsa__cfg_node(r, "rope_parameters");
    if (!rp) rp = qsa__cfg_node(r, "rope_scaling");
    if (rp && rp->type != QSA__JSON_OBJECT) return qsa__cfg_type_error(r, "rope_parameters", "an object", rp);
    if (rp) { /* per-layer-type form: take the attention layers' parameters */
        const qsa__json *per = qsa__json_get(rp, "qwen_sparse_attention");
        if (!per) per = qsa__json_get(rp, "full_attention");
        if (per && per->type == QSA__JSON_OBJECT) rp = per;
    }
    qsa__cfgr rr = *r;
    char rpfx[64];
    snprintf(rpfx, sizeof rpfx, "%srope_parameters.", pfx);
    rr.obj = rp;
    rr.pfx = rpfx;
    double theta_legacy, prf_legacy;
    QSA__TRY(qsa__cfg_num(r, "rope_theta", 10000.0, &theta_legacy));
    QSA__TRY(qsa__cfg_num(r, "partial_rotary_factor", 1.0, &prf_legacy));
    double prf = prf_legacy;
    c->rope_theta = theta_legacy;
    if (rp) {
        QSA__TRY(qsa__cfg_num(&rr, "rope_theta", theta_legacy, &c->rope_theta));
        QSA__TRY(qsa__cfg_num(&rr, "partial_rotary_factor", prf_legacy, &prf));
        const qsa__json *type = qsa__json_get(rp, "rope_type");
        if (!type || type->type == QSA__JSON_NULL) type = qsa__json_get(rp, "type");
        if (type && type->type != QSA__JSON_NULL && !qsa__json_is_str(type, "default")) {
            char f[96];
            return qsa__fail(QSA_ERR_UNSUPPORTED, "%s: %srope_parameters.rope_type: only \"default\" RoPE is supported, found %s",
                             src, pfx, qsa__cfg_found(type, f, sizeof f));
        }
    }
    c->partial_rotary_factor = (float)prf;
    double rd = (double)c->head_dim * prf;
    c->rotary_dim = (rd >= 0 && rd < 2147483647.0) ? (int)rd : -1;

    /* QSA indexer (all or none) */
    static const char *const qsa_names[5] = {"indexer_n_heads", "indexer_kv_heads", "indexer_head_dim", "indexer_budget",
                                             "indexer_compress_ratio"};
    int *qsa_vals[5];
    qsa_vals[0] = &c->indexer_n_heads; qsa_vals[1] = &c->indexer_kv_heads; qsa_vals[2] = &c->indexer_head_dim;
    qsa_vals[3] = &c->indexer_budget; qsa_vals[4] = &c->indexer_compress_ratio;
    int qsa_present[5], n_qsa = 0;
    for (int i = 0; i < 5; i++) {
        QSA__TRY(qsa__cfg_int(r, qsa_names[i], 0, qsa_vals[i], &qsa_present[i]));
        n_qsa += qsa_present[i];
    }
    c->has_qsa = n_qsa > 0;

    /* ---- sizes the layer arrays depend on ---- */
    if (c->num_hidden_layers < 1 || c->num_hidden_layers > QSA_MAX_LAYERS)
        return qsa__fail(QSA_ERR_FORMAT, "%s: %snum_hidden_layers: expected 1..%d (QSA_MAX_LAYERS), found %d", src, pfx,
                         QSA_MAX_LAYERS, c->num_hidden_layers);
    int L = c->num_hidden_layers;

    /* layer_types, or every full_attention_interval-th layer */
    const qsa__json *lt = qsa__cfg_node(r, "layer_types");
    const char *bad_type = NULL;
    char bad_buf[96];
    if (lt) {
        if (lt->type != QSA__JSON_ARRAY) return qsa__cfg_type_error(r, "layer_types", "a list of strings", lt);
        int i = 0;
        for (const qsa__json *e = lt->child; e; e = e->next, i++) {
            if (e->type != QSA__JSON_STRING) return qsa__cfg_type_error(r, "layer_types", "a list of strings", e);
            uint8_t t = QSA_LAYER_LINEAR;
            if (qsa__json_is_str(e, "linear_attention")) t = QSA_LAYER_LINEAR;
            else if (qsa__json_is_str(e, "qwen_sparse_attention") || qsa__json_is_str(e, "full_attention")) t = QSA_LAYER_QSA;
            else if (!bad_type) bad_type = qsa__cfg_found(e, bad_buf, sizeof bad_buf);
            if (i < QSA_MAX_LAYERS) c->layer_types[i] = t;
        }
    } else {
        int interval;
        QSA__TRY(qsa__cfg_int(r, "full_attention_interval", 4, &interval, NULL));
        if (interval <= 0)
            return qsa__fail(QSA_ERR_FORMAT, "%s: %sfull_attention_interval: expected a positive integer, found %d", src, pfx, interval);
        for (int i = 0; i < L; i++) c->layer_types[i] = ((i + 1) % interval) ? QSA_LAYER_LINEAR : QSA_LAYER_QSA;
    }

    /* ple_layer_ids: sorted(set(...)) */
    const qsa__json *pl = qsa__cfg_node(r, "ple_layer_ids");
    int64_t bad_ple = 0;
    int n_bad_ple = 0;
    if (pl) {
        if (pl->type != QSA__JSON_ARRAY) return qsa__cfg_type_error(r, "ple_layer_ids", "a list of integers", pl);
        int64_t *ids = QSA__ALLOC(int64_t, pl->count);
        if (!ids) return qsa__fail(QSA_ERR_OUT_OF_MEMORY, "%s: ple_layer_ids: out of memory", src);
        size_t n = 0;
        for (const qsa__json *e = pl->child; e; e = e->next) {
            if (e->type != QSA__JSON_NUMBER || !e->is_int) {
                qsa__free(ids);
                return qsa__cfg_type_error(r, "ple_layer_ids", "a list of integers", e);
            }
            ids[n++] = e->i64;
        }
        if (n) qsort(ids, n, sizeof *ids, qsa__cfg_cmp_i64);
        size_t u = 0;
        for (size_t i = 0; i < n; i++)
            if (u == 0 || ids[u - 1] != ids[i]) ids[u++] = ids[i];
        c->n_ple_layers = 0;
        for (size_t i = 0; i < u; i++) {
            if (ids[i] < 1 || ids[i] > L) { if (!n_bad_ple++) bad_ple = ids[i]; continue; }
            c->ple_layer_ids[c->n_ple_layers++] = (int)ids[i];
        }
        c->n_ple_layers += n_bad_ple; /* "PLE enabled" even if every id is invalid (reported below) */
        qsa__free(ids);
    }

    /* ---- validate_architecture, in the reference's order ---- */
    if (bad_type)
        return qsa__fail(QSA_ERR_UNSUPPORTED, "%s: %slayer_types: unsupported Qwen4-Exp layer type %s (expected "
                         "\"linear_attention\" or \"qwen_sparse_attention\"/\"full_attention\")", src, pfx, bad_type);
    {
        const qsa__json *g = gate ? gate : act;
        if (g ? !qsa__cfg_act(g, &c->output_gate_act) : (c->output_gate_act = QSA_ACT_SILU, 0)) {
            char f[96];
            return qsa__fail(QSA_ERR_UNSUPPORTED, "%s: %s%s: unsupported Qwen4-Exp output gate activation %s (expected \"silu\" or "
                             "\"sigmoid\")", src, pfx, gate ? "output_gate_type" : "hidden_act", qsa__cfg_found(g, f, sizeof f));
        }
    }
    if (c->hc_count <= 1)
        return qsa__fail(QSA_ERR_FORMAT, "%s: %shc_count: Qwen4-Exp requires hc_count > 1, found %d", src, pfx, c->hc_count);
    if (c->num_experts <= 0)
        return qsa__fail(QSA_ERR_FORMAT, "%s: %snum_experts: must be > 0, found %d", src, pfx, c->num_experts);
    if (c->num_experts_per_tok <= 0 || c->num_experts_per_tok > c->num_experts)
        return qsa__fail(QSA_ERR_FORMAT, "%s: %snum_experts_per_tok: must be in [1, num_experts=%d], found %d", src, pfx,
                         c->num_experts, c->num_experts_per_tok);
    if (c->moe_intermediate_size <= 0 || c->shared_expert_intermediate_size <= 0)
        return qsa__fail(QSA_ERR_FORMAT, "%s: %smoe_intermediate_size and shared_expert_intermediate_size must be > 0, found %d "
                         "and %d", src, pfx, c->moe_intermediate_size, c->shared_expert_intermediate_size);
    if (c->has_qsa) {
        char missing[160] = "";
        for (int i = 0; i < 5; i++)
            if (!qsa_present[i]) {
                size_t k = strlen(missing);
                snprintf(missing + k, sizeof missing - k, "%s%s", k ? ", " : "", qsa_names[i]);
            }
        if (missing[0])
            return qsa__fail(QSA_ERR_FORMAT, "%s: QSA config is missing required fields: %s (set all five indexer_* fields or none)",
                             src, missing);
        for (int i = 0; i < 5; i++)
            if (*qsa_vals[i] <= 0)
                return qsa__fail(QSA_ERR_FORMAT, "%s: %s%s: QSA config values must be positive, found %d", src, pfx, qsa_names[i],
                                 *qsa_vals[i]);
        if (c->indexer_kv_heads != 1)
            return qsa__fail(QSA_ERR_FORMAT, "%s: %sindexer_kv_heads: Qwen4-Exp QSA requires 1, found %d", src, pfx, c->indexer_kv_heads);
        if (c->indexer_budget % c->indexer_compress_ratio != 0)
            return qsa__fail(QSA_ERR_FORMAT, "%s: %sindexer_budget (%d) must be divisible by indexer_compress_ratio (%d)", src, pfx,
                             c->indexer_budget, c->indexer_compress_ratio);
        if (c->rotary_dim > c->indexer_head_dim)
            return qsa__fail(QSA_ERR_FORMAT, "%s: %sindexer_head_dim: attention RoPE dimensions must fit the QSA index head: "
                             "rotary_dim=%d (head_dim %d * partial_rotary_factor %g) > indexer_head_dim=%d", src, pfx,
                             c->rotary_dim, c->head_dim, prf, c->indexer_head_dim);
    }
    if (c->n_ple_layers) {
        int64_t ngram_heads = ((int64_t)c->ngram_size - 1) * c->heads_per_ngram;
        if (ngram_heads <= 0 || c->ple_embed_dim <= 0 || c->ple_embed_dim % ngram_heads != 0)
            return qsa__fail(QSA_ERR_FORMAT, "%s: %sple_embed_dim: must be positive and divisible by the number of n-gram heads "
                             "(ngram_size-1)*heads_per_ngram = %lld, found %d", src, pfx, (long long)ngram_heads, c->ple_embed_dim);
        if (n_bad_ple)
            return qsa__fail(QSA_ERR_FORMAT, "%s: %sple_layer_ids: must contain one-indexed ids in [1, %d], found %lld (%d invalid)",
                             src, pfx, L, (long long)bad_ple, n_bad_ple);
        for (int i = 0; i < c->n_ple_layers; i++)
            if (c->layer_types[c->ple_layer_ids[i] - 1] != QSA_LAYER_LINEAR)
                return qsa__fail(QSA_ERR_FORMAT, "%s: %sple_layer_ids: Qwen4-Exp PLE is only supported on linear_attention layers, "
                                 "found PLE on layer %d (a qwen_sparse_attention layer)", src, pfx, c->ple_layer_ids[i]);
        if (!eos_present || c->n_eos == 0)
            return qsa__fail(QSA_ERR_FORMAT, "%s: %seos_token_id: must be set when Qwen4-Exp PLE layers are enabled", src, pfx);
    }
    /* PreTrainedConfig.validate_layer_type */
    if (lt && lt->count != (size_t)L)
        return qsa__fail(QSA_ERR_FORMAT, "%s: %slayer_types: num_hidden_layers (%d) must equal the number of layer_types (%zu)",
                         src, pfx, L, lt->count);

    /* ---- bounds the runtime relies on ---- */
#define QSA__MAX_HASH_HEADS (1 << 20)
#define QSA__CFG_POS(field, hi) do { if (c->field < 1 || c->field > (hi)) \
        return qsa__fail(QSA_ERR_FORMAT, "%s: %s" #field ": expected 1..%d, found %d", src, pfx, (int)(hi), c->field); } while (0)
    QSA__CFG_POS(vocab_size, INT32_MAX);
    QSA__CFG_POS(hidden_size, 1 << 20);
    QSA__CFG_POS(num_attention_heads, 1 << 12);
    QSA__CFG_POS(num_key_value_heads, 1 << 12);
    QSA__CFG_POS(head_dim, 1 << 14);
    QSA__CFG_POS(max_position_embeddings, INT32_MAX);
    QSA__CFG_POS(linear_conv_kernel_dim, 64);
    QSA__CFG_POS(linear_key_head_dim, 1 << 14);
    QSA__CFG_POS(linear_value_head_dim, 1 << 14);
    QSA__CFG_POS(linear_num_key_heads, 1 << 12);
    QSA__CFG_POS(linear_num_value_heads, 1 << 12);
    QSA__CFG_POS(hc_count, 64);
    QSA__CFG_POS(hc_lowrank, 1 << 20);
    QSA__CFG_POS(num_experts, 1 << 16);
    QSA__CFG_POS(moe_intermediate_size, 1 << 20);
    QSA__CFG_POS(shared_expert_intermediate_size, 1 << 20);
    if (c->num_attention_heads % c->num_key_value_heads)
        return qsa__fail(QSA_ERR_FORMAT, "%s: %snum_attention_heads (%d) must be a multiple of num_key_value_heads (%d)", src, pfx,
                         c->num_attention_heads, c->num_key_value_heads);
    if (c->linear_num_value_heads % c->linear_num_key_heads)
        return qsa__fail(QSA_ERR_FORMAT, "%s: %slinear_num_value_heads (%d) must be a multiple of linear_num_key_heads (%d)", src,
                         pfx, c->linear_num_value_heads, c->linear_num_key_heads);
    if (!(c->rms_norm_eps > 0) || !(c->rms_norm_eps < 1))
        return qsa__fail(QSA_ERR_FORMAT, "%s: %srms_norm_eps: expected a value in (0, 1), found %g", src, pfx, (double)c->rms_norm_eps);
    if (!((float)c->rope_theta >= 1.17549435e-38f) || c->rope_theta > 1e30) /* (RoPE runs in fp32: a normal float, FLT_MIN, keeps 1 / theta^e finite) */
        return qsa__fail(QSA_ERR_FORMAT, "%s: %srope_parameters.rope_theta: expected a positive number, found %g", src, pfx, c->rope_theta);
    if (!(prf > 0) || prf > 1)
        return qsa__fail(QSA_ERR_FORMAT, "%s: %srope_parameters.partial_rotary_factor: expected a value in (0, 1], found %g", src, pfx, prf);
    if (c->rotary_dim < 2 || c->rotary_dim % 2)
        return qsa__fail(QSA_ERR_FORMAT, "%s: %srotary_dim = int(head_dim %d * partial_rotary_factor %g) = %d: expected an even "
                         "number >= 2", src, pfx, c->head_dim, prf, c->rotary_dim);
    if (!hidden_act_ok)
        return qsa__fail(QSA_ERR_UNSUPPORTED, "%s: %shidden_act: the runtime supports \"silu\" (and \"sigmoid\"), found \"%s\"", src,
                         pfx, c->hidden_act_name);
    int n_qsa_layers = 0;
    for (int i = 0; i < L; i++) n_qsa_layers += c->layer_types[i] == QSA_LAYER_QSA;
    if (n_qsa_layers && !c->has_qsa)
        return qsa__fail(QSA_ERR_FORMAT, "%s: %slayer_types has %d qwen_sparse_attention layers but the QSA indexer fields "
                         "(indexer_n_heads, ...) are missing", src, pfx, n_qsa_layers);
    if (c->has_qsa) {
        QSA__CFG_POS(indexer_n_heads, 1 << 12);
        QSA__CFG_POS(indexer_head_dim, 1 << 14);
        QSA__CFG_POS(indexer_compress_ratio, 1 << 20);
        QSA__CFG_POS(indexer_budget, INT32_MAX);
        /* A budget past the context selects every block, as this one does: the selection buffers are
           sized by it (an INT32_MAX budget asked for 8 GiB per query). */
        int64_t all_blocks = ((int64_t)c->max_position_embeddings / c->indexer_compress_ratio + 1) * c->indexer_compress_ratio;
        if (c->indexer_budget > all_blocks) c->indexer_budget = (int)all_blocks;
        if (c->indexer_head_dim % 2)
            return qsa__fail(QSA_ERR_FORMAT, "%s: %sindexer_head_dim: expected an even number (RoPE), found %d", src, pfx, c->indexer_head_dim);
    }
    if (c->n_ple_layers) {
        QSA__CFG_POS(ple_embed_dim, 1 << 20);
        QSA__CFG_POS(ple_conv_kernel_size, 64);
        QSA__CFG_POS(ngram_size, 64);
        QSA__CFG_POS(heads_per_ngram, 1 << 12);
        QSA__CFG_POS(make_ngram_vocab_size_divisible_by, 1 << 20);
        QSA__CFG_POS(split_ngram_parts, 1 << 20);
        if (c->ngram_size < 2)
            return qsa__fail(QSA_ERR_FORMAT, "%s: %sngram_size: expected >= 2, found %d", src, pfx, c->ngram_size);
        if (c->ngram_vocab_size_base < 2 || c->ngram_vocab_size_base > ((int64_t)1 << 40))
            return qsa__fail(QSA_ERR_FORMAT, "%s: %sngram_vocab_size_base: expected 2..2^40, found %lld", src, pfx,
                             (long long)c->ngram_vocab_size_base);
        /* every hashing head of every PLE layer has a prime vocabulary found at load (qsa__load_ple) */
        int64_t hash_heads = (int64_t)c->n_ple_layers * (c->ngram_size - 1) * c->heads_per_ngram;
        if (hash_heads > QSA__MAX_HASH_HEADS)
            return qsa__fail(QSA_ERR_FORMAT, "%s: %sPLE: %d layers x (ngram_size - 1) x heads_per_ngram = %lld hashing heads, "
                             "expected at most %d", src, pfx, c->n_ple_layers, (long long)hash_heads, QSA__MAX_HASH_HEADS);
    }
#undef QSA__CFG_POS
    return QSA_OK;
}

QSA_IMPL qsa_result qsa_config_parse(const char *json, size_t len, const char *quant_json, size_t quant_len,
                                     const char *source, qsa_model_config *out) {
    if (!out || (!json && len)) return qsa__fail(QSA_ERR_INVALID_ARGUMENT, "qsa_config_parse: NULL argument");
    const char *src = source ? source : "config.json";
    memset(out, 0, sizeof *out);
    qsa__json_doc doc;
    QSA__TRY(qsa__json_parse(json, len, src, &doc));
    qsa_result r = QSA_OK;
    const qsa__json *root = doc.root, *text = root;
    qsa__cfgr rd;
    rd.src = src;
    rd.pfx = "";
    if (root->type != QSA__JSON_OBJECT) {
        r = qsa__fail(QSA_ERR_FORMAT, "%s: expected a JSON object at the top level, found %s", src, qsa__json_type_name(root));
        goto done;
    }
    {
        const qsa__json *mt = qsa__json_get(root, "model_type");
        if (mt && mt->type == QSA__JSON_NULL) mt = NULL;
        if (qsa__json_is_str(mt, "qwen4_exp")) {
            const qsa__json *tc = qsa__json_get(root, "text_config");
            static const qsa__json empty_obj = {QSA__JSON_OBJECT, NULL, 0, NULL, 0, 0, 0, 0, 0, NULL, NULL, 0};
            if (!tc || tc->type == QSA__JSON_NULL) text = &empty_obj; /* Qwen4ExpConfig: default text config */
            else if (tc->type != QSA__JSON_OBJECT) {
                r = qsa__fail(QSA_ERR_FORMAT, "%s: text_config: expected an object, found %s", src, qsa__json_type_name(tc));
                goto done;
            } else text = tc;
            rd.pfx = "text_config.";
            const qsa__json *tmt = qsa__json_get(text, "model_type");
            if (tmt && tmt->type != QSA__JSON_NULL && !qsa__json_is_str(tmt, "qwen4_exp_text")) {
                char f[96];
                r = qsa__fail(QSA_ERR_UNSUPPORTED, "%s: text_config.model_type: expected \"qwen4_exp_text\", found %s", src,
                              qsa__cfg_found(tmt, f, sizeof f));
                goto done;
            }
        } else if (!qsa__json_is_str(mt, "qwen4_exp_text")) {
            char f[96];
            r = qsa__fail(mt ? QSA_ERR_UNSUPPORTED : QSA_ERR_FORMAT, "%s: model_type: expected \"qwen4_exp\" or \"qwen4_exp_text\", "
                          "found %s", src, qsa__cfg_found(mt, f, sizeof f));
            goto done;
        }
    }
    snprintf(out->model_type, sizeof out->model_type, "qwen4_exp_text");
    rd.obj = text;
    r = qsa__cfg_text(&rd, out);
    if (r != QSA_OK) goto done;
    /* quantisation: quantization_config (top level, or in text_config), then hf_quant_config.json */
    {
        const qsa__json *qc = qsa__json_get(root, "quantization_config");
        if (!qc || qc->type == QSA__JSON_NULL) qc = qsa__json_get(text, "quantization_config");
        if (qc && qc->type != QSA__JSON_NULL) r = qsa__cfg_quant_config(qc, src, out);
        if (r == QSA_OK && quant_json) r = qsa__cfg_hf_quant(quant_json, quant_len, "hf_quant_config.json", out);
    }
done:
    qsa__json_free(&doc);
    if (r != QSA_OK) {
        memset(out, 0, sizeof *out);
        return r;
    }
    return QSA_OK;
}

QSA_IMPL qsa_result qsa_config_load_dir(const char *dir, qsa_model_config *out) {
    if (!dir || !out) return qsa__fail(QSA_ERR_INVALID_ARGUMENT, "qsa_config_load_dir: NULL argument");
    char *cpath = qsa__path_join(dir, "config.json"), *qpath = qsa__path_join(dir, "hf_quant_config.json");
    char *text = NULL, *qtext = NULL;
    size_t len = 0, qlen = 0;
    qsa_result r = QSA_OK;
    if (!cpath || !qpath) r = qsa__fail(QSA_ERR_OUT_OF_MEMORY, "qsa_config_load_dir: out of memory");
    if (r == QSA_OK) r = qsa__read_file(cpath, &text, &len);
    if (r == QSA_OK && qsa__file_exists(qpath)) r = qsa__read_file(qpath, &qtext, &qlen);
    if (r == QSA_OK) {
        r = qsa_config_parse(text, len, NULL, 0, cpath, out);
        if (r == QSA_OK && qtext) r = qsa__cfg_hf_quant(qtext, qlen, qpath, out);
        if (r != QSA_OK) memset(out, 0, sizeof *out);
    }
    qsa__free(text);
    qsa__free(qtext);
    qsa__free(cpath);
    qsa__free(qpath);
    return r;
}

QSA_IMPL qsa_result qsa_generation_config_parse(const char *json, size_t len, const char *source, qsa_generation_config *out) {
    if (!out || (!json && len)) return qsa__fail(QSA_ERR_INVALID_ARGUMENT, "qsa_generation_config_parse: NULL argument");
    const char *src = source ? source : "generation_config.json";
    memset(out, 0, sizeof *out);
    qsa__json_doc doc;
    QSA__TRY(qsa__json_parse(json, len, src, &doc));
    qsa_result r = QSA_OK;
    qsa__cfgr rd;
    rd.obj = doc.root;
    rd.src = src;
    rd.pfx = "";
    if (doc.root->type != QSA__JSON_OBJECT) {
        r = qsa__fail(QSA_ERR_FORMAT, "%s: expected a JSON object at the top level, found %s", src, qsa__json_type_name(doc.root));
        goto done;
    }
    {
        double v;
        int present;
#define QSA__GEN_NUM(field) \
        if (r == QSA_OK && qsa__cfg_node(&rd, #field)) { \
            r = qsa__cfg_num(&rd, #field, 0, &v); \
            if (r == QSA_OK) { out->field = (float)v; out->has_##field = 1; } }
        QSA__GEN_NUM(temperature)
        QSA__GEN_NUM(top_p)
        QSA__GEN_NUM(min_p)
        QSA__GEN_NUM(repetition_penalty)
#undef QSA__GEN_NUM
        if (r == QSA_OK) r = qsa__cfg_int(&rd, "top_k", 0, &out->top_k, &out->has_top_k);
        if (r == QSA_OK && qsa__cfg_node(&rd, "do_sample")) {
            r = qsa__cfg_bool(&rd, "do_sample", 0, &out->do_sample);
            out->has_do_sample = 1;
        }
        if (r == QSA_OK) r = qsa__cfg_int(&rd, "max_new_tokens", 0, &out->max_new_tokens, &present);
        if (r == QSA_OK) r = qsa__cfg_eos(&rd, &out->n_eos, out->eos_token_ids, &present);
        if (r == QSA_OK && out->has_temperature && !(out->temperature >= 0))
            r = qsa__fail(QSA_ERR_FORMAT, "%s: temperature: expected >= 0, found %g", src, (double)out->temperature);
        if (r == QSA_OK && out->has_top_p && !(out->top_p >= 0 && out->top_p <= 1))
            r = qsa__fail(QSA_ERR_FORMAT, "%s: top_p: expected a value in [0, 1], found %g", src, (double)out->top_p);
        if (r == QSA_OK && out->has_min_p && !(out->min_p >= 0 && out->min_p <= 1))
            r = qsa__fail(QSA_ERR_FORMAT, "%s: min_p: expected a value in [0, 1], found %g", src, (double)out->min_p);
        if (r == QSA_OK && out->has_top_k && out->top_k < 0)
            r = qsa__fail(QSA_ERR_FORMAT, "%s: top_k: expected >= 0, found %d", src, out->top_k);
        if (r == QSA_OK && out->has_repetition_penalty && !(out->repetition_penalty > 0))
            r = qsa__fail(QSA_ERR_FORMAT, "%s: repetition_penalty: expected > 0, found %g", src, (double)out->repetition_penalty);
        if (r == QSA_OK && out->max_new_tokens < 0)
            r = qsa__fail(QSA_ERR_FORMAT, "%s: max_new_tokens: expected >= 0, found %d", src, out->max_new_tokens);
    }
done:
    qsa__json_free(&doc);
    if (r != QSA_OK) memset(out, 0, sizeof *out);
    return r;
}

/* ============================================================================================== */
/* >>safetensors  safetensors files and sharded indexes                                           */
/* ============================================================================================== */
/* A safetensors file: 8-byte little-endian header length N, N bytes of JSON
   {"name": {"dtype": "BF16", "shape": [..], "data_offsets": [begin, end]}, "__metadata__": {..}},
   then the data (offsets are relative to its start).  Everything is checked before use: header
   length against the file size (and a 100 MB cap, like the reference implementation), shapes
   (non-negative, no overflow), offsets (begin <= end <= data size, end - begin == elements * dtype
   size, no two tensors overlapping), dtypes (F32 F16 BF16 F8_E4M3 U8 I64 I32; others are
   QSA_ERR_UNSUPPORTED), names unique across all shards.  Files are mapped read-only; tensors point
   into the mappings.  Vision ("model.visual.*", "visual.*") and MTP ("mtp.*") tensors are checked
   for structure but not indexed. */

typedef enum qsa__dtype {
    QSA__DTYPE_ANY = -1, /* "any dtype" for qsa__st_get */
    QSA__F32 = 0, QSA__F16, QSA__BF16, QSA__F8_E4M3, QSA__U8, QSA__I64, QSA__I32, QSA__DTYPE_COUNT
} qsa__dtype;

/* One tensor of a mapped safetensors file.  `data` points into the mapping (not aligned in general:
   read through memcpy or byte loads).  `name` is the full name as stored in the file. */
typedef struct qsa__tensor {
    const char *name;
    qsa__dtype dtype;
    int ndim;
    int64_t shape[8];
    const uint8_t *data;
    size_t nbytes;
    int file;           /* index of the file in the set */
} qsa__tensor;

/* All tensors of a model directory (single file or sharded index), sorted by name. */
typedef struct qsa__st_set {
    int nfiles;
    qsa__map *files;
    int ntensors;
    qsa__tensor *tensors;
    char *prefix;       /* "model.language_model." or "model." or "" as detected */
    /* private */
    int cap_tensors;
    int nnames;
    char **names;       /* one block of tensor names per file */
    int borrowed;       /* files[] are not ours to unmap (qsa__st_open_memory) */
} qsa__st_set;

#define QSA__ST_MAX_HEADER ((uint64_t)100 << 20)

QSA_PRIV const char *qsa__dtype_name(qsa__dtype t) {
    switch (t) {
    case QSA__F32: return "F32";
    case QSA__F16: return "F16";
    case QSA__BF16: return "BF16";
    case QSA__F8_E4M3: return "F8_E4M3";
    case QSA__U8: return "U8";
    case QSA__I64: return "I64";
    case QSA__I32: return "I32";
    default: return "?";
    }
}
QSA_PRIV size_t qsa__dtype_size(qsa__dtype t) {
    switch (t) {
    case QSA__F32: case QSA__I32: return 4;
    case QSA__F16: case QSA__BF16: return 2;
    case QSA__F8_E4M3: case QSA__U8: return 1;
    case QSA__I64: return 8;
    default: return 0;
    }
}
QSA_PRIV int qsa__dtype_parse(const qsa__json *s, qsa__dtype *out) {
    for (int t = 0; t < QSA__DTYPE_COUNT; t++)
        if (qsa__json_is_str(s, qsa__dtype_name((qsa__dtype)t))) { *out = (qsa__dtype)t; return 1; }
    return 0;
}

/* FP8 E4M3FN: 1 sign, 4 exponent (bias 7), 3 mantissa bits; no infinities, S.1111.111 is NaN. */
QSA_PRIV float qsa__e4m3_to_f32(uint8_t v) {
    int sign = v >> 7, e = (v >> 3) & 15, m = v & 7;
    float f;
    if (e == 15 && m == 7) return sign ? -NAN : NAN;
    if (e == 0) f = ldexpf((float)m, -9); /* subnormal: m/8 * 2^-6 */
    else f = ldexpf((float)(8 + m), e - 10);
    return sign ? -f : f;
}

QSA_PRIV int qsa__st_ignored(const char *name) {
    return !strncmp(name, "model.visual.", 13) || !strncmp(name, "visual.", 7) || !strncmp(name, "mtp.", 4);
}

static int qsa__st_cmp_tensor(const void *a, const void *b) {
    return strcmp(((const qsa__tensor *)a)->name, ((const qsa__tensor *)b)->name);
}

typedef struct qsa__st_range { uint64_t begin, end; const char *name; } qsa__st_range;
static int qsa__st_cmp_range(const void *a, const void *b) {
    const qsa__st_range *x = (const qsa__st_range *)a, *y = (const qsa__st_range *)b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    return (x->end > y->end) - (x->end < y->end);
}

QSA_PRIV void qsa__st_close(qsa__st_set *set) {
    if (!set) return;
    if (set->files) {
        for (int i = 0; i < set->nfiles; i++) {
            if (set->borrowed) qsa__free(set->files[i].path);
            else qsa__unmap(&set->files[i]);
        }
        qsa__free(set->files);
    }
    for (int i = 0; i < set->nnames; i++) qsa__free(set->names[i]);
    qsa__free(set->names);
    qsa__free(set->tensors);
    qsa__free(set->prefix);
    memset(set, 0, sizeof *set);
}

/* shape [a, b, ...] into buf */
QSA_PRIV const char *qsa__shape_str(int ndim, const int64_t *shape, char *buf, size_t n) {
    size_t k = 0;
    k += (size_t)snprintf(buf, n, "[");
    for (int i = 0; i < ndim && k < n; i++) k += (size_t)snprintf(buf + k, n - k, "%s%lld", i ? ", " : "", (long long)shape[i]);
    if (k < n) snprintf(buf + k, n - k, "]");
    return buf;
}

/* Parses the header of file `fi` (already in set->files) and appends its text tensors. */
QSA_PRIV qsa_result qsa__st_parse_file(qsa__st_set *set, int fi) {
    const qsa__map *m = &set->files[fi];
    const char *path = m->path;
    if (m->size < 8)
        return qsa__fail(QSA_ERR_FORMAT, "%s: file too short (%zu bytes) for the 8-byte safetensors header length", path, m->size);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | m->data[i];
    if (hlen > m->size - 8)
        return qsa__fail(QSA_ERR_FORMAT, "%s: header length %llu exceeds the file size (%zu bytes): truncated or not a safetensors file",
                         path, (unsigned long long)hlen, m->size);
    if (hlen > QSA__ST_MAX_HEADER)
        return qsa__fail(QSA_ERR_FORMAT, "%s: header length %llu exceeds the 100 MB limit", path, (unsigned long long)hlen);
    const uint8_t *base = m->data + 8 + hlen;
    uint64_t data_size = (uint64_t)(m->size - 8 - hlen);
    char where[600];
    snprintf(where, sizeof where, "%s (safetensors header)", path);
    qsa__json_doc doc;
    QSA__TRY(qsa__json_parse((const char *)m->data + 8, (size_t)hlen, where, &doc));
    qsa_result r = QSA_OK;
    const qsa__json *root = doc.root;
    qsa__st_range *ranges = NULL;
    char *names = NULL;
    size_t nr = 0;
    char sb[128];
    if (root->type != QSA__JSON_OBJECT) {
        r = qsa__fail(QSA_ERR_FORMAT, "%s: header is not a JSON object (found %s)", path, qsa__json_type_name(root));
        goto done;
    }
    {
        /* room for every entry, and one block for the kept names */
        size_t names_len = 0;
        for (const qsa__json *e = root->child; e; e = e->next) names_len += e->key_len + 1;
        ranges = QSA__ALLOC(qsa__st_range, root->count);
        names = QSA__ALLOC(char, names_len);
        size_t need = (size_t)set->ntensors + root->count;
        if (need > (size_t)INT32_MAX) { r = qsa__fail(QSA_ERR_FORMAT, "%s: too many tensors", path); goto done; }
        if ((int)need > set->cap_tensors) {
            int cap = set->cap_tensors ? set->cap_tensors : 256;
            while ((size_t)cap < need) cap = cap > INT32_MAX / 2 ? INT32_MAX : cap * 2;
            qsa__tensor *nt = (qsa__tensor *)qsa__realloc(set->tensors, sizeof(qsa__tensor) * (size_t)cap);
            if (nt) { set->tensors = nt; set->cap_tensors = cap; }
            else need = 0;
        }
        char **nn = (char **)qsa__realloc(set->names, sizeof(char *) * (size_t)(set->nnames + 1));
        if (nn) set->names = nn;
        if (!ranges || !names || !nn || (need == 0 && root->count)) {
            r = qsa__fail(QSA_ERR_OUT_OF_MEMORY, "%s: out of memory reading the header (%zu entries)", path, root->count);
            goto done;
        }
        set->names[set->nnames++] = names; /* owned by the set from here on */
        size_t name_off = 0;
        for (const qsa__json *e = root->child; e; e = e->next) {
            const char *name = e->key;
            if (!strcmp(name, "__metadata__") && e->key_len == 12) {
                if (e->type != QSA__JSON_OBJECT) {
                    r = qsa__fail(QSA_ERR_FORMAT, "%s: __metadata__: expected an object, found %s", path, qsa__json_type_name(e));
                    goto done;
                }
                continue;
            }
            if (strlen(name) != e->key_len) {
                r = qsa__fail(QSA_ERR_FORMAT, "%s: a tensor name contains a NUL character ('%s...')", path, name);
                goto done;
            }
            if (e->type != QSA__JSON_OBJECT) {
                r = qsa__fail(QSA_ERR_FORMAT, "%s: tensor '%s': expected an object {dtype, shape, data_offsets}, found %s", path,
                              name, qsa__json_type_name(e));
                goto done;
            }
            const qsa__json *dt = qsa__json_get(e, "dtype"), *sh = qsa__json_get(e, "shape"), *off = qsa__json_get(e, "data_offsets");
            if (!dt || dt->type != QSA__JSON_STRING) {
                r = qsa__fail(QSA_ERR_FORMAT, "%s: tensor '%s': dtype: expected a string, found %s", path, name, qsa__json_type_name(dt));
                goto done;
            }
            if (!sh || sh->type != QSA__JSON_ARRAY || sh->count > 8) {
                r = qsa__fail(QSA_ERR_FORMAT, "%s: tensor '%s': shape: expected a list of at most 8 dimensions, found %s%s", path,
                              name, qsa__json_type_name(sh), sh && sh->type == QSA__JSON_ARRAY ? " (too many dimensions)" : "");
                goto done;
            }
            if (!off || off->type != QSA__JSON_ARRAY || off->count != 2 || off->child->type != QSA__JSON_NUMBER ||
                off->child->next->type != QSA__JSON_NUMBER || !off->child->is_int || !off->child->next->is_int ||
                off->child->i64 < 0 || off->child->next->i64 < 0) {
                r = qsa__fail(QSA_ERR_FORMAT, "%s: tensor '%s': data_offsets: expected [begin, end] (two non-negative integers)", path, name);
                goto done;
            }
            qsa__tensor t;
            memset(&t, 0, sizeof t);
            t.ndim = (int)sh->count;
            uint64_t count = 1;
            int overflow = 0, i = 0;
            for (const qsa__json *d = sh->child; d; d = d->next, i++) {
                if (d->type != QSA__JSON_NUMBER || !d->is_int || d->i64 < 0) {
                    char f[96];
                    r = qsa__fail(QSA_ERR_FORMAT, "%s: tensor '%s': shape[%d]: expected a non-negative integer, found %s", path, name,
                                  i, qsa__cfg_found(d, f, sizeof f));
                    goto done;
                }
                t.shape[i] = d->i64;
                if (d->i64 && count > UINT64_MAX / (uint64_t)d->i64) overflow = 1;
                else count *= (uint64_t)d->i64;
            }
            uint64_t b = (uint64_t)off->child->i64, en = (uint64_t)off->child->next->i64;
            if (b > en || en > data_size) {
                r = qsa__fail(QSA_ERR_FORMAT, "%s: tensor '%s': data_offsets [%llu, %llu] out of range (data section is %llu bytes)",
                              path, name, (unsigned long long)b, (unsigned long long)en, (unsigned long long)data_size);
                goto done;
            }
            ranges[nr].begin = b;
            ranges[nr].end = en;
            ranges[nr].name = name;
            nr++;
            int ignored = qsa__st_ignored(name);
            if (!qsa__dtype_parse(dt, &t.dtype)) {
                if (ignored) continue; /* a vision/MTP tensor in a dtype we never read */
                r = qsa__fail(QSA_ERR_UNSUPPORTED, "%s: tensor '%s': dtype %.32s is not supported (F32, F16, BF16, F8_E4M3, U8, I64, I32)",
                              path, name, dt->str);
                goto done;
            }
            size_t es = qsa__dtype_size(t.dtype);
            if (overflow || count > UINT64_MAX / es || count * es != en - b) {
                r = qsa__fail(QSA_ERR_FORMAT, "%s: tensor '%s': shape %s of %s needs %s%llu bytes but data_offsets [%llu, %llu] span %llu",
                              path, name, qsa__shape_str(t.ndim, t.shape, sb, sizeof sb), qsa__dtype_name(t.dtype),
                              overflow || count > UINT64_MAX / es ? "more than 2^64 (overflow), not " : "",
                              (unsigned long long)(overflow || count > UINT64_MAX / es ? 0 : count * es), (unsigned long long)b,
                              (unsigned long long)en, (unsigned long long)(en - b));
                goto done;
            }
            if (ignored) continue;
            memcpy(names + name_off, name, e->key_len + 1);
            t.name = names + name_off;
            name_off += e->key_len + 1;
            t.data = base + b;
            t.nbytes = (size_t)(en - b);
            t.file = fi;
            set->tensors[set->ntensors++] = t;
        }
        /* no two tensors may share bytes */
        if (nr > 1) qsort(ranges, nr, sizeof *ranges, qsa__st_cmp_range);
        uint64_t max_end = 0;
        const char *max_name = NULL;
        for (size_t k = 0; k < nr; k++) {
            if (ranges[k].begin == ranges[k].end) continue;
            if (max_name && ranges[k].begin < max_end) {
                r = qsa__fail(QSA_ERR_FORMAT, "%s: tensors '%s' and '%s' overlap (data_offsets begin %llu < end %llu)", path, max_name,
                              ranges[k].name, (unsigned long long)ranges[k].begin, (unsigned long long)max_end);
                goto done;
            }
            max_end = ranges[k].end;
            max_name = ranges[k].name;
        }
    }
done:
    qsa__free(ranges);
    qsa__json_free(&doc); /* names were copied */
    if (r != QSA_OK && names && (set->nnames == 0 || set->names[set->nnames - 1] != names)) qsa__free(names);
    return r;
}

/* binary search for an exact full name */
QSA_PRIV const qsa__tensor *qsa__st_find_exact(const qsa__st_set *set, const char *name) {
    int lo = 0, hi = set->ntensors - 1;
    while (lo <= hi) {
        int mid = lo + (hi - lo) / 2;
        int c = strcmp(set->tensors[mid].name, name);
        if (c == 0) return &set->tensors[mid];
        if (c < 0) lo = mid + 1;
        else hi = mid - 1;
    }
    return NULL;
}
/* index of the first tensor whose name is >= s */
QSA_PRIV int qsa__st_lower_bound(const qsa__st_set *set, const char *s) {
    int lo = 0, hi = set->ntensors;
    while (lo < hi) {
        int mid = lo + (hi - lo) / 2;
        if (strcmp(set->tensors[mid].name, s) < 0) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}
QSA_PRIV int qsa__st_has_prefix(const qsa__st_set *set, const char *p) {
    int i = qsa__st_lower_bound(set, p);
    return i < set->ntensors && !strncmp(set->tensors[i].name, p, strlen(p));
}

/* sort, reject duplicate names, detect the key prefix */
QSA_PRIV qsa_result qsa__st_finish(qsa__st_set *set) {
    if (set->ntensors > 1) qsort(set->tensors, (size_t)set->ntensors, sizeof(qsa__tensor), qsa__st_cmp_tensor);
    for (int i = 1; i < set->ntensors; i++)
        if (!strcmp(set->tensors[i - 1].name, set->tensors[i].name)) {
            const qsa__tensor *a = &set->tensors[i - 1], *b = &set->tensors[i];
            return qsa__fail(QSA_ERR_FORMAT, "tensor '%s' is stored twice (in %s and %s)", a->name, set->files[a->file].path,
                             set->files[b->file].path);
        }
    const char *p = qsa__st_has_prefix(set, "model.language_model.") ? "model.language_model."
                  : qsa__st_has_prefix(set, "model.") ? "model." : "";
    set->prefix = qsa__strdup(p);
    if (!set->prefix) return qsa__fail(QSA_ERR_OUT_OF_MEMORY, "safetensors: out of memory");
    return QSA_OK;
}

/* One safetensors image already in memory (not copied; must outlive the set).  Used by the fuzzer
   and by callers that hold the bytes themselves. */
QSA_PRIV qsa_result qsa__st_open_memory(const void *data, size_t size, const char *name, qsa__st_set *set) {
    memset(set, 0, sizeof *set);
    set->borrowed = 1;
    set->files = QSA__CALLOC(qsa__map, 1);
    if (!set->files || !(set->files[0].path = qsa__strdup(name ? name : "<memory>"))) {
        qsa__st_close(set);
        return qsa__fail(QSA_ERR_OUT_OF_MEMORY, "safetensors: out of memory");
    }
    set->files[0].data = (const uint8_t *)data;
    set->files[0].size = data ? size : 0;
    set->nfiles = 1;
    qsa_result r = qsa__st_parse_file(set, 0);
    if (r == QSA_OK) r = qsa__st_finish(set);
    if (r != QSA_OK) qsa__st_close(set);
    return r;
}

QSA_PRIV qsa_result qsa__st_open_file(const char *path, qsa__st_set *set) {
    memset(set, 0, sizeof *set);
    set->files = QSA__CALLOC(qsa__map, 1);
    if (!set->files) return qsa__fail(QSA_ERR_OUT_OF_MEMORY, "safetensors: out of memory");
    qsa_result r = qsa__map_file(path, &set->files[0]);
    if (r == QSA_OK) {
        set->nfiles = 1;
        r = qsa__st_parse_file(set, 0);
    }
    if (r == QSA_OK) r = qsa__st_finish(set);
    if (r != QSA_OK) qsa__st_close(set);
    return r;
}

static int qsa__st_cmp_str(const void *a, const void *b) { return strcmp(*(const char *const *)a, *(const char *const *)b); }

/* model.safetensors.index.json {"metadata": {...}, "weight_map": {"tensor": "shard file", ...}} */
QSA_PRIV qsa_result qsa__st_open_index(const char *dir, const char *index_path, qsa__st_set *set) {
    char *text = NULL;
    size_t len = 0;
    QSA__TRY(qsa__read_file(index_path, &text, &len));
    qsa__json_doc doc;
    qsa_result r = qsa__json_parse(text, len, index_path, &doc);
    const char **shards = NULL;
    size_t nshards = 0;
    if (r != QSA_OK) { qsa__free(text); return r; }
    const qsa__json *wm = qsa__json_get(doc.root, "weight_map");
    if (!wm || wm->type != QSA__JSON_OBJECT) {
        r = qsa__fail(QSA_ERR_FORMAT, "%s: weight_map: expected an object, found %s", index_path, qsa__json_type_name(wm));
        goto done;
    }
    /* the distinct shard names, validated */
    shards = QSA__ALLOC(const char *, wm->count);
    if (!shards) { r = qsa__fail(QSA_ERR_OUT_OF_MEMORY, "%s: out of memory", index_path); goto done; }
    for (const qsa__json *e = wm->child; e; e = e->next) {
        if (e->type != QSA__JSON_STRING) {
            r = qsa__fail(QSA_ERR_FORMAT, "%s: weight_map['%s']: expected a shard file name, found %s", index_path, e->key,
                          qsa__json_type_name(e));
            goto done;
        }
        if (e->len == 0 || strlen(e->str) != e->len || strchr(e->str, '/') || e->str[0] == '.') {
            r = qsa__fail(QSA_ERR_FORMAT, "%s: weight_map['%s']: shard name '%s' must be a plain file name in the model directory",
                          index_path, e->key, e->str);
            goto done;
        }
        shards[nshards++] = e->str;
    }
    if (nshards > 1) qsort(shards, nshards, sizeof *shards, qsa__st_cmp_str);
    {
        size_t u = 0;
        for (size_t i = 0; i < nshards; i++)
            if (!u || strcmp(shards[u - 1], shards[i])) shards[u++] = shards[i];
        nshards = u;
    }
    if (nshards == 0) { r = qsa__fail(QSA_ERR_FORMAT, "%s: weight_map is empty", index_path); goto done; }
    if (nshards > 100000) { r = qsa__fail(QSA_ERR_FORMAT, "%s: too many shards (%zu)", index_path, nshards); goto done; }
    set->files = QSA__CALLOC(qsa__map, nshards);
    if (!set->files) { r = qsa__fail(QSA_ERR_OUT_OF_MEMORY, "%s: out of memory", index_path); goto done; }
    for (size_t i = 0; i < nshards && r == QSA_OK; i++) {
        char *p = qsa__path_join(dir, shards[i]);
        if (!p) { r = qsa__fail(QSA_ERR_OUT_OF_MEMORY, "%s: out of memory", index_path); break; }
        if (!qsa__file_exists(p)) r = qsa__fail(QSA_ERR_NOT_FOUND, "%s: shard '%s' named by weight_map is missing (%s)", index_path, shards[i], p);
        else r = qsa__map_file(p, &set->files[i]);
        qsa__free(p);
        if (r != QSA_OK) break;
        set->nfiles = (int)i + 1;
        r = qsa__st_parse_file(set, (int)i);
        if (nshards > 4) qsa__log(QSA_LOG_INFO, "safetensors: shard %zu/%zu %s", i + 1, nshards, shards[i]);
    }
    if (r == QSA_OK) r = qsa__st_finish(set);
    /* every text tensor the index names must be in the shard it names */
    for (const qsa__json *e = wm->child; e && r == QSA_OK; e = e->next) {
        if (qsa__st_ignored(e->key)) continue;
        const qsa__tensor *t = strlen(e->key) == e->key_len ? qsa__st_find_exact(set, e->key) : NULL;
        const char *key = e->str;
        const char **sh = (const char **)bsearch(&key, shards, nshards, sizeof *shards, qsa__st_cmp_str);
        if (!t || !sh || t->file != (int)(sh - shards))
            r = qsa__fail(QSA_ERR_FORMAT, "%s: tensor '%s' is listed for shard '%s' but that shard does not contain it", index_path,
                          e->key, e->str);
    }
done:
    qsa__free(shards);
    qsa__json_free(&doc);
    qsa__free(text);
    return r;
}

QSA_PRIV qsa_result qsa__st_open_dir(const char *dir, qsa__st_set *set) {
    memset(set, 0, sizeof *set);
    char *index = qsa__path_join(dir, "model.safetensors.index.json"), *single = qsa__path_join(dir, "model.safetensors");
    qsa_result r;
    if (!index || !single) r = qsa__fail(QSA_ERR_OUT_OF_MEMORY, "safetensors: out of memory");
    else if (qsa__file_exists(index)) r = qsa__st_open_index(dir, index, set);
    else if (qsa__file_exists(single)) r = qsa__st_open_file(single, set);
    else r = qsa__fail(QSA_ERR_NOT_FOUND, "%s: neither model.safetensors nor model.safetensors.index.json exists", dir);
    if (r != QSA_OK) qsa__st_close(set);
    qsa__free(index);
    qsa__free(single);
    return r;
}

/* `name` relative to the text model ("layers.0.mlp.gate.weight"): tries prefix + name, then name. */
QSA_PRIV const qsa__tensor *qsa__st_find(const qsa__st_set *set, const char *name) {
    if (!set || !name || !set->ntensors) return NULL;
    const char *pfx = set->prefix ? set->prefix : "";
    if (pfx[0]) {
        char small[512];
        size_t a = strlen(pfx), b = strlen(name);
        char *full = a + b + 1 <= sizeof small ? small : QSA__ALLOC(char, a + b + 1);
        if (full) {
            memcpy(full, pfx, a);
            memcpy(full + a, name, b + 1);
            const qsa__tensor *t = qsa__st_find_exact(set, full);
            if (full != small) qsa__free(full);
            if (t) return t;
        }
    }
    return qsa__st_find_exact(set, name);
}

QSA_PRIV qsa_result qsa__st_get(const qsa__st_set *set, const char *name, qsa__dtype dtype_or_minus1, int ndim,
                                const int64_t *shape, const qsa__tensor **out) {
    const qsa__tensor *t = qsa__st_find(set, name);
    char a[128], b[128];
    if (out) *out = NULL;
    if (!t)
        return qsa__fail(QSA_ERR_NOT_FOUND, "tensor '%s%s' not found in the checkpoint (%d tensors)", set && set->prefix ? set->prefix : "",
                         name, set ? set->ntensors : 0);
    if ((int)dtype_or_minus1 >= 0 && t->dtype != dtype_or_minus1)
        return qsa__fail(QSA_ERR_SHAPE, "tensor '%s' (%s): expected dtype %s, found %s", t->name, set->files[t->file].path,
                         qsa__dtype_name(dtype_or_minus1), qsa__dtype_name(t->dtype));
    int ok = t->ndim == ndim;
    for (int i = 0; ok && i < ndim; i++)
        if (shape && shape[i] >= 0 && shape[i] != t->shape[i]) ok = 0;
    if (!ok) {
        int64_t want[8];
        for (int i = 0; i < ndim && i < 8; i++) want[i] = shape ? shape[i] : -1;
        return qsa__fail(QSA_ERR_SHAPE, "tensor '%s' (%s): expected shape %s (-1 = any), found %s", t->name, set->files[t->file].path,
                         qsa__shape_str(ndim < 8 ? ndim : 8, want, a, sizeof a), qsa__shape_str(t->ndim, t->shape, b, sizeof b));
    }
    if (out) *out = t;
    return QSA_OK;
}

QSA_PRIV size_t qsa__tensor_numel(const qsa__tensor *t) {
    size_t es = qsa__dtype_size(t->dtype);
    return es ? t->nbytes / es : 0;
}

/* element i of F32/F16/BF16/F8_E4M3/U8/I64/I32 as float (NaN when i is out of range) */
QSA_PRIV float qsa__tensor_f32(const qsa__tensor *t, size_t i) {
    if (i >= qsa__tensor_numel(t)) return NAN;
    const uint8_t *p = t->data + i * qsa__dtype_size(t->dtype);
    switch (t->dtype) {
    case QSA__F32: { float f; memcpy(&f, p, 4); return f; }
    case QSA__F16: { uint16_t h; memcpy(&h, p, 2); return qsa__f16_to_f32(h); }
    case QSA__BF16: { uint16_t h; memcpy(&h, p, 2); return qsa__bf16_to_f32(h); }
    case QSA__F8_E4M3: return qsa__e4m3_to_f32(*p);
    case QSA__U8: return (float)*p;
    case QSA__I64: { int64_t v; memcpy(&v, p, 8); return (float)v; }
    case QSA__I32: { int32_t v; memcpy(&v, p, 4); return (float)v; }
    default: return NAN;
    }
}

/* Elements i0 .. i0 + n - 1 of a BF16/F16/F32 tensor -> fp32 at dst[0 .. n), a loop per dtype (a
   checkpoint's dense weights at load: billions of elements at the real shape, where qsa__tensor_f32 per
   element took ~4 ns each) */
QSA_PRIV void qsa__tensor_to_f32_range(const qsa__tensor *t, size_t i0, size_t n, float *dst) {
    const uint8_t *p = t->data;
    if (t->dtype == QSA__F32) {
        if (n) memcpy(dst, p + 4 * i0, n * 4);
    } else if (t->dtype == QSA__BF16) { /* in blocks of 16 (a fixed count the compiler vectorises), then the rest */
        const uint8_t *q = p + 2 * i0;
        size_t i = 0;
        for (; i + 16 <= n; i += 16) {
            uint32_t v[16];
            for (int k = 0; k < 16; k++) {
                uint16_t h;
                memcpy(&h, q + 2 * (i + (size_t)k), 2);
                v[k] = (uint32_t)h << 16;
            }
            memcpy(dst + i, v, sizeof v);
        }
        for (; i < n; i++) {
            uint16_t h;
            memcpy(&h, q + 2 * i, 2);
            dst[i] = qsa__bf16_to_f32(h);
        }
    } else {
        for (size_t i = 0; i < n; i++) dst[i] = qsa__tensor_f32(t, i0 + i);
    }
}

/* A whole tensor widened over up to nt threads (qsa__par_ranges): the same values however it is split */
typedef struct qsa__widen_ctx {
    const qsa__tensor *t;
    float *dst;
} qsa__widen_ctx;
QSA_PRIV void qsa__widen_range(void *c, int k, size_t i0, size_t i1) {
    const qsa__widen_ctx *x = (const qsa__widen_ctx *)c;
    (void)k;
    qsa__tensor_to_f32_range(x->t, i0, i1 - i0, x->dst + i0);
}
QSA_PRIV void qsa__tensor_to_f32_mt(const qsa__tensor *t, float *dst, int nt) {
    size_t n = qsa__tensor_numel(t);
    qsa__widen_ctx x = {t, dst};
    qsa__par_ranges(n, qsa__par_threads(n, nt), qsa__widen_range, &x);
}

/* Narrowing to FP16 (qsa__f32_to_f16 of the fp32 value, so a tensor narrowed straight from the mapping
   gets the bits its fp32 copy would) over up to nt threads, from fp32 values or from elements off ..
   off + n - 1 of a BF16/F16/F32 tensor; returns how many finite values became inf */
typedef struct qsa__narrow_ctx {
    const float *src;     /* fp32 values, or NULL: */
    const qsa__tensor *t; /* the tensor's elements from off */
    size_t off;
    uint16_t *dst;
    size_t over[QSA__PAR_MAX];
} qsa__narrow_ctx;
#define QSA__NARROW_CHUNK 1024
/* The common case of a chunk of QSA__NARROW_CHUNK values without a branch per value, so that the compiler
   vectorises it (a constant trip count and no aliasing: GCC's -O2 cost model asks both; the load's narrowing
   ran at ~0.9 GB/s a thread per value through qsa__f32_to_f16): BF16 values in FP16's normal range, exactly
   representable there (a BF16 has 7 fraction bits), and fp32 ones with qsa__f32_to_f16's normal-range
   rounding; zeros either way.  Returns 0 when some value lies outside (FP16 subnormals, overflow, infinities,
   NaNs): then the caller narrows the chunk value by value with qsa__f32_to_f16, so the bits are that
   function's whatever the path (tested exhaustively for BF16). */
QSA_PRIV int qsa__narrow_bf16_fast(const uint8_t *QSA__RESTRICT q, uint16_t *QSA__RESTRICT dst) {
    uint16_t bad = 0;
    for (int i = 0; i < QSA__NARROW_CHUNK; i++) {
        uint16_t h;
        memcpy(&h, q + 2 * i, 2);
        uint16_t ax = (uint16_t)(h & 0x7fffu), s = (uint16_t)(h & 0x8000u);
        bad |= (uint16_t)((ax != 0) & ((uint16_t)(ax - 0x3880u) > 0x477fu - 0x3880u)); /* not 0, not in [2^-14, 65504] */
        dst[i] = ax ? (uint16_t)(s | (uint16_t)((ax - 0x3800u) << 3)) : s;
    }
    return !bad;
}
QSA_PRIV int qsa__narrow_f32_fast(const uint8_t *QSA__RESTRICT f, uint16_t *QSA__RESTRICT dst) {
    uint32_t bad = 0;
    for (int i = 0; i < QSA__NARROW_CHUNK; i++) {
        uint32_t x;
        memcpy(&x, f + 4 * i, 4);
        uint32_t ax = x & 0x7fffffffu, s = (x >> 16) & 0x8000u;
        bad |= (uint32_t)(ax != 0) & (uint32_t)(ax - 0x38800000u >= 0x477ff000u - 0x38800000u);
        uint32_t r = ax + 0xfffu + ((ax >> 13) & 1u) - 0x38000000u;
        dst[i] = (uint16_t)(ax ? s | (r >> 13) : s);
    }
    return !bad;
}
QSA_PRIV void qsa__narrow_range(void *c, int k, size_t i0, size_t i1) {
    qsa__narrow_ctx *x = (qsa__narrow_ctx *)c;
    size_t over = 0;
    float buf[QSA__NARROW_CHUNK];
    for (size_t a = i0; a < i1; a += QSA__NARROW_CHUNK) {
        size_t n = i1 - a < QSA__NARROW_CHUNK ? i1 - a : QSA__NARROW_CHUNK;
        if (n == QSA__NARROW_CHUNK &&
            (x->src ? qsa__narrow_f32_fast((const uint8_t *)(x->src + a), x->dst + a)
                    : x->t->dtype == QSA__BF16 ? qsa__narrow_bf16_fast(x->t->data + 2 * (x->off + a), x->dst + a)
                    : x->t->dtype == QSA__F32 && qsa__narrow_f32_fast(x->t->data + 4 * (x->off + a), x->dst + a)))
            continue; /* (every value in range: none became inf) */
        const float *f = x->src ? x->src + a : buf;
        if (!x->src) qsa__tensor_to_f32_range(x->t, x->off + a, n, buf);
        for (size_t i = 0; i < n; i++) {
            uint16_t h = qsa__f32_to_f16(f[i]);
            x->dst[a + i] = h;
            if ((h & 0x7c00) == 0x7c00 && isfinite(f[i])) over++;
        }
    }
    x->over[k] = over;
}
QSA_PRIV size_t qsa__narrow_mt(qsa__narrow_ctx *x, size_t n, int nt) {
    qsa__par_ranges(n, qsa__par_threads(n, nt), qsa__narrow_range, x);
    size_t over = 0;
    for (int k = 0; k < QSA__PAR_MAX; k++) over += x->over[k];
    return over;
}
QSA_PRIV size_t qsa__f32_to_f16_mt(const float *src, uint16_t *dst, size_t n, int nt) {
    qsa__narrow_ctx x;
    memset(&x, 0, sizeof x);
    x.src = src;
    x.dst = dst;
    return qsa__narrow_mt(&x, n, nt);
}
/* The caller checks the dtype (BF16, F16 or F32) and that off + n elements exist. */
QSA_PRIV size_t qsa__tensor_to_f16_mt(const qsa__tensor *t, size_t off, size_t n, uint16_t *dst, int nt) {
    qsa__narrow_ctx x;
    memset(&x, 0, sizeof x);
    x.t = t;
    x.off = off;
    x.dst = dst;
    return qsa__narrow_mt(&x, n, nt);
}

/* ---- row views over tables split along dim 0 (PLE n-gram embeddings) ---- */

typedef struct qsa__rows_view {
    int nparts;
    const qsa__tensor **parts;
    int64_t *row_start;  /* nparts + 1 entries */
    int64_t rows, cols;
    qsa__dtype dtype;
} qsa__rows_view;

QSA_PRIV void qsa__rows_view_free(qsa__rows_view *v) {
    if (!v) return;
    qsa__free((void *)v->parts);
    qsa__free(v->row_start);
    memset(v, 0, sizeof *v);
}

/* `<base>.weight`, or `<base>.shard_0.weight` .. `<base>.shard_{n-1}.weight` concatenated along dim 0 */
QSA_PRIV qsa_result qsa__st_rows_view(const qsa__st_set *set, const char *base, qsa__rows_view *out) {
    memset(out, 0, sizeof *out);
    size_t bl = strlen(base);
    char *name = QSA__ALLOC(char, bl + 64);
    if (!name) return qsa__fail(QSA_ERR_OUT_OF_MEMORY, "rows view '%s': out of memory", base);
    qsa_result r = QSA_OK;
    snprintf(name, bl + 64, "%s.weight", base);
    const qsa__tensor *single = qsa__st_find(set, name);
    int n = 0;
    if (single) n = 1;
    else {
        snprintf(name, bl + 64, "%s.shard_0.weight", base);
        const qsa__tensor *t0 = qsa__st_find(set, name);
        if (!t0) {
            qsa__free(name);
            return qsa__fail(QSA_ERR_NOT_FOUND, "tensor '%s%s.weight' (or its shards %s.shard_{i}.weight) not found", set->prefix, base, base);
        }
        /* count all "<full base>.shard_*" names: they must be exactly shard_0..shard_{n-1} */
        size_t fl = strlen(t0->name) - strlen("0.weight");
        char *fullp = qsa__strndup(t0->name, fl);
        if (!fullp) { qsa__free(name); return qsa__fail(QSA_ERR_OUT_OF_MEMORY, "out of memory"); }
        int count = 0;
        for (int i = qsa__st_lower_bound(set, fullp); i < set->ntensors && !strncmp(set->tensors[i].name, fullp, fl); i++) count++;
        for (n = 0; n < count; n++) {
            snprintf(name, bl + 64, "%s.shard_%d.weight", base, n);
            const qsa__tensor *t = qsa__st_find(set, name);
            if (!t || strncmp(t->name, fullp, fl)) break;
        }
        if (n != count)
            r = qsa__fail(QSA_ERR_FORMAT, "tensor '%sN.weight': %d names match but shard_%d is missing (shards must be numbered 0..n-1)",
                          fullp, count, n);
        qsa__free(fullp);
    }
    if (r == QSA_OK) {
        out->parts = QSA__CALLOC(const qsa__tensor *, n);
        out->row_start = QSA__CALLOC(int64_t, n + 1);
        if (!out->parts || !out->row_start) r = qsa__fail(QSA_ERR_OUT_OF_MEMORY, "rows view '%s': out of memory", base);
    }
    for (int i = 0; i < n && r == QSA_OK; i++) {
        const qsa__tensor *t;
        if (single) t = single;
        else {
            snprintf(name, bl + 64, "%s.shard_%d.weight", base, i);
            t = qsa__st_find(set, name);
        }
        char sb[128];
        if (t->ndim != 2) {
            r = qsa__fail(QSA_ERR_SHAPE, "tensor '%s': expected 2 dimensions [rows, cols], found %s", t->name, qsa__shape_str(t->ndim, t->shape, sb, sizeof sb));
            break;
        }
        if (i == 0) { out->cols = t->shape[1]; out->dtype = t->dtype; }
        else if (t->shape[1] != out->cols || t->dtype != out->dtype) {
            r = qsa__fail(QSA_ERR_SHAPE, "tensor '%s': expected [*, %lld] %s like shard 0, found %s %s", t->name, (long long)out->cols,
                          qsa__dtype_name(out->dtype), qsa__shape_str(t->ndim, t->shape, sb, sizeof sb), qsa__dtype_name(t->dtype));
            break;
        }
        if (t->shape[0] > INT64_MAX - out->row_start[i]) { /* (zero-width shards hold any row count in no bytes) */
            r = qsa__fail(QSA_ERR_SHAPE, "tensor '%s': shape %s: the shards' row count overflows", t->name,
                          qsa__shape_str(t->ndim, t->shape, sb, sizeof sb));
            break;
        }
        out->parts[i] = t;
        out->row_start[i + 1] = out->row_start[i] + t->shape[0];
        out->nparts = i + 1;
    }
    qsa__free(name);
    if (r != QSA_OK) { qsa__rows_view_free(out); return r; }
    out->rows = out->row_start[n];
    return QSA_OK;
}

/* bytes of row `row` (NULL when out of range) */
QSA_PRIV const uint8_t *qsa__rows_view_row(const qsa__rows_view *v, int64_t row) {
    if (!v || row < 0 || row >= v->rows) return NULL;
    int lo = 0, hi = v->nparts - 1;
    while (lo < hi) { /* last part with row_start <= row */
        int mid = (lo + hi + 1) / 2;
        if (v->row_start[mid] <= row) lo = mid;
        else hi = mid - 1;
    }
    return v->parts[lo]->data + (size_t)(row - v->row_start[lo]) * (size_t)v->cols * qsa__dtype_size(v->dtype);
}

/* ---- NVFP4 linears ---- */
/* ModelOpt: <base>.weight U8 [out, in/2] (element 2i in the low nibble), .weight_scale F8_E4M3 [out, in/16],
   .weight_scale_2 F32 [] or [1], optional .input_scale.  compressed-tensors (nvfp4-pack-quantized):
   .weight_packed, .weight_scale, .weight_global_scale (global_scale = 1 / weight_global_scale),
   optional .input_global_scale.  Dequantised: w = e2m1 * e4m3(scale) * global_scale. */
typedef struct qsa__nvfp4 {
    const qsa__tensor *weight, *scale, *scale2, *input_scale;
    int64_t out, in;
    float global_scale;
} qsa__nvfp4;

QSA_PRIV const qsa__tensor *qsa__st_find_suffix(const qsa__st_set *set, const char *base, const char *suffix) {
    char small[512];
    size_t a = strlen(base), b = strlen(suffix);
    char *n = a + b + 1 <= sizeof small ? small : QSA__ALLOC(char, a + b + 1);
    if (!n) return NULL;
    memcpy(n, base, a);
    memcpy(n + a, suffix, b + 1);
    const qsa__tensor *t = qsa__st_find(set, n);
    if (n != small) qsa__free(n);
    return t;
}

QSA_PRIV int qsa__st_is_nvfp4(const qsa__st_set *set, const char *base) {
    return qsa__st_find_suffix(set, base, ".weight_scale") != NULL;
}

QSA_PRIV qsa_result qsa__st_nvfp4_scalar(const qsa__tensor *t, float *v) {
    char sb[128];
    if (t->dtype != QSA__F32 || !(t->ndim == 0 || (t->ndim == 1 && t->shape[0] == 1)))
        return qsa__fail(QSA_ERR_SHAPE, "tensor '%s': expected an F32 scalar ([] or [1]), found %s %s", t->name,
                         qsa__dtype_name(t->dtype), qsa__shape_str(t->ndim, t->shape, sb, sizeof sb));
    *v = qsa__tensor_f32(t, 0);
    if (!(*v > 0) || *v > 3.4e38f)
        return qsa__fail(QSA_ERR_FORMAT, "tensor '%s': expected a positive finite scale, found %g", t->name, (double)*v);
    return QSA_OK;
}

QSA_PRIV qsa_result qsa__st_get_nvfp4(const qsa__st_set *set, const char *base, int64_t out, int64_t in, qsa__nvfp4 *q) {
    memset(q, 0, sizeof *q);
    if (out <= 0 || in <= 0 || in % 16)
        return qsa__fail(QSA_ERR_SHAPE, "NVFP4 linear '%s': in_features %lld must be a positive multiple of 16 (out %lld)", base,
                         (long long)in, (long long)out);
    int compressed = qsa__st_find_suffix(set, base, ".weight_packed") != NULL;
    const char *wname = compressed ? ".weight_packed" : ".weight", *gname = compressed ? ".weight_global_scale" : ".weight_scale_2";
    size_t bl = strlen(base);
    char *n = QSA__ALLOC(char, bl + 32);
    if (!n) return qsa__fail(QSA_ERR_OUT_OF_MEMORY, "out of memory");
    int64_t wshape[2], sshape[2];
    wshape[0] = out; wshape[1] = in / 2;
    sshape[0] = out; sshape[1] = in / 16;
    qsa_result r;
    snprintf(n, bl + 32, "%s%s", base, wname);
    r = qsa__st_get(set, n, QSA__U8, 2, wshape, &q->weight);
    if (r == QSA_OK) {
        snprintf(n, bl + 32, "%s.weight_scale", base);
        r = qsa__st_get(set, n, QSA__F8_E4M3, 2, sshape, &q->scale);
    }
    if (r == QSA_OK) {
        snprintf(n, bl + 32, "%s%s", base, gname);
        q->scale2 = qsa__st_find(set, n);
        if (!q->scale2) r = qsa__fail(QSA_ERR_NOT_FOUND, "tensor '%s%s' (NVFP4 global scale) not found", set->prefix, n);
    }
    if (r == QSA_OK) r = qsa__st_nvfp4_scalar(q->scale2, &q->global_scale);
    if (r == QSA_OK && compressed) q->global_scale = 1.0f / q->global_scale;
    if (r == QSA_OK) q->input_scale = qsa__st_find_suffix(set, base, compressed ? ".input_global_scale" : ".input_scale");
    qsa__free(n);
    if (r != QSA_OK) {
        memset(q, 0, sizeof *q);
        return r;
    }
    q->out = out;
    q->in = in;
    return QSA_OK;
}

/* >>unicode-generated-begin (tools/gen_unicode.py --splice qsa_runtime.h rewrites this block) */
/* ============================================================================================== */
/* >>unicode  Unicode tables for the tokenizer: regex classes (Unicode 16.0.0) and NFC (Unicode 9.0) */
/* GENERATED by tools/gen_unicode.py from unicodedata2 16.0.0; do not edit.                           */
/* ============================================================================================== */

#define QSA__UNI_L 1u  /* \p{L} */
#define QSA__UNI_N 2u  /* \p{N} */
#define QSA__UNI_M 4u  /* \p{M} */
#define QSA__UNI_WS 8u /* \s (White_Space) */
#define QSA__UNI_CLASS_VERSION "16.0.0"
#define QSA__UNI_NFC_VERSION "9.0.0"

/* {lo | flags << 24, hi}, sorted */
static const uint32_t qsa__uni_cls[][2] = {
    {0x8000009,0xd},{0x8000020,0x20},{0x2000030,0x39},{0x1000041,0x5a},{0x1000061,0x7a},{0x8000085,0x85},{0x80000a0,0xa0},{0x10000aa,0xaa},
    {0x20000b2,0xb3},{0x10000b5,0xb5},{0x20000b9,0xb9},{0x10000ba,0xba},{0x20000bc,0xbe},{0x10000c0,0xd6},{0x10000d8,0xf6},{0x10000f8,0x2c1},
    {0x10002c6,0x2d1},{0x10002e0,0x2e4},{0x10002ec,0x2ec},{0x10002ee,0x2ee},{0x4000300,0x36f},{0x1000370,0x374},{0x1000376,0x377},{0x100037a,0x37d},
    {0x100037f,0x37f},{0x1000386,0x386},{0x1000388,0x38a},{0x100038c,0x38c},{0x100038e,0x3a1},{0x10003a3,0x3f5},{0x10003f7,0x481},{0x4000483,0x489},
    {0x100048a,0x52f},{0x1000531,0x556},{0x1000559,0x559},{0x1000560,0x588},{0x4000591,0x5bd},{0x40005bf,0x5bf},{0x40005c1,0x5c2},{0x40005c4,0x5c5},
    {0x40005c7,0x5c7},{0x10005d0,0x5ea},{0x10005ef,0x5f2},{0x4000610,0x61a},{0x1000620,0x64a},{0x400064b,0x65f},{0x2000660,0x669},{0x100066e,0x66f},
    {0x4000670,0x670},{0x1000671,0x6d3},{0x10006d5,0x6d5},{0x40006d6,0x6dc},{0x40006df,0x6e4},{0x10006e5,0x6e6},{0x40006e7,0x6e8},{0x40006ea,0x6ed},
    {0x10006ee,0x6ef},{0x20006f0,0x6f9},{0x10006fa,0x6fc},{0x10006ff,0x6ff},{0x1000710,0x710},{0x4000711,0x711},{0x1000712,0x72f},{0x4000730,0x74a},
    {0x100074d,0x7a5},{0x40007a6,0x7b0},{0x10007b1,0x7b1},{0x20007c0,0x7c9},{0x10007ca,0x7ea},{0x40007eb,0x7f3},{0x10007f4,0x7f5},{0x10007fa,0x7fa},
    {0x40007fd,0x7fd},{0x1000800,0x815},{0x4000816,0x819},{0x100081a,0x81a},{0x400081b,0x823},{0x1000824,0x824},{0x4000825,0x827},{0x1000828,0x828},
    {0x4000829,0x82d},{0x1000840,0x858},{0x4000859,0x85b},{0x1000860,0x86a},{0x1000870,0x887},{0x1000889,0x88e},{0x4000897,0x89f},{0x10008a0,0x8c9},
    {0x40008ca,0x8e1},{0x40008e3,0x903},{0x1000904,0x939},{0x400093a,0x93c},{0x100093d,0x93d},{0x400093e,0x94f},{0x1000950,0x950},{0x4000951,0x957},
    {0x1000958,0x961},{0x4000962,0x963},{0x2000966,0x96f},{0x1000971,0x980},{0x4000981,0x983},{0x1000985,0x98c},{0x100098f,0x990},{0x1000993,0x9a8},
    {0x10009aa,0x9b0},{0x10009b2,0x9b2},{0x10009b6,0x9b9},{0x40009bc,0x9bc},{0x10009bd,0x9bd},{0x40009be,0x9c4},{0x40009c7,0x9c8},{0x40009cb,0x9cd},
    {0x10009ce,0x9ce},{0x40009d7,0x9d7},{0x10009dc,0x9dd},{0x10009df,0x9e1},{0x40009e2,0x9e3},{0x20009e6,0x9ef},{0x10009f0,0x9f1},{0x20009f4,0x9f9},
    {0x10009fc,0x9fc},{0x40009fe,0x9fe},{0x4000a01,0xa03},{0x1000a05,0xa0a},{0x1000a0f,0xa10},{0x1000a13,0xa28},{0x1000a2a,0xa30},{0x1000a32,0xa33},
    {0x1000a35,0xa36},{0x1000a38,0xa39},{0x4000a3c,0xa3c},{0x4000a3e,0xa42},{0x4000a47,0xa48},{0x4000a4b,0xa4d},{0x4000a51,0xa51},{0x1000a59,0xa5c},
    {0x1000a5e,0xa5e},{0x2000a66,0xa6f},{0x4000a70,0xa71},{0x1000a72,0xa74},{0x4000a75,0xa75},{0x4000a81,0xa83},{0x1000a85,0xa8d},{0x1000a8f,0xa91},
    {0x1000a93,0xaa8},{0x1000aaa,0xab0},{0x1000ab2,0xab3},{0x1000ab5,0xab9},{0x4000abc,0xabc},{0x1000abd,0xabd},{0x4000abe,0xac5},{0x4000ac7,0xac9},
    {0x4000acb,0xacd},{0x1000ad0,0xad0},{0x1000ae0,0xae1},{0x4000ae2,0xae3},{0x2000ae6,0xaef},{0x1000af9,0xaf9},{0x4000afa,0xaff},{0x4000b01,0xb03},
    {0x1000b05,0xb0c},{0x1000b0f,0xb10},{0x1000b13,0xb28},{0x1000b2a,0xb30},{0x1000b32,0xb33},{0x1000b35,0xb39},{0x4000b3c,0xb3c},{0x1000b3d,0xb3d},
    {0x4000b3e,0xb44},{0x4000b47,0xb48},{0x4000b4b,0xb4d},{0x4000b55,0xb57},{0x1000b5c,0xb5d},{0x1000b5f,0xb61},{0x4000b62,0xb63},{0x2000b66,0xb6f},
    {0x1000b71,0xb71},{0x2000b72,0xb77},{0x4000b82,0xb82},{0x1000b83,0xb83},{0x1000b85,0xb8a},{0x1000b8e,0xb90},{0x1000b92,0xb95},{0x1000b99,0xb9a},
    {0x1000b9c,0xb9c},{0x1000b9e,0xb9f},{0x1000ba3,0xba4},{0x1000ba8,0xbaa},{0x1000bae,0xbb9},{0x4000bbe,0xbc2},{0x4000bc6,0xbc8},{0x4000bca,0xbcd},
    {0x1000bd0,0xbd0},{0x4000bd7,0xbd7},{0x2000be6,0xbf2},{0x4000c00,0xc04},{0x1000c05,0xc0c},{0x1000c0e,0xc10},{0x1000c12,0xc28},{0x1000c2a,0xc39},
    {0x4000c3c,0xc3c},{0x1000c3d,0xc3d},{0x4000c3e,0xc44},{0x4000c46,0xc48},{0x4000c4a,0xc4d},{0x4000c55,0xc56},{0x1000c58,0xc5a},{0x1000c5d,0xc5d},
    {0x1000c60,0xc61},{0x4000c62,0xc63},{0x2000c66,0xc6f},{0x2000c78,0xc7e},{0x1000c80,0xc80},{0x4000c81,0xc83},{0x1000c85,0xc8c},{0x1000c8e,0xc90},
    {0x1000c92,0xca8},{0x1000caa,0xcb3},{0x1000cb5,0xcb9},{0x4000cbc,0xcbc},{0x1000cbd,0xcbd},{0x4000cbe,0xcc4},{0x4000cc6,0xcc8},{0x4000cca,0xccd},
    {0x4000cd5,0xcd6},{0x1000cdd,0xcde},{0x1000ce0,0xce1},{0x4000ce2,0xce3},{0x2000ce6,0xcef},{0x1000cf1,0xcf2},{0x4000cf3,0xcf3},{0x4000d00,0xd03},
    {0x1000d04,0xd0c},{0x1000d0e,0xd10},{0x1000d12,0xd3a},{0x4000d3b,0xd3c},{0x1000d3d,0xd3d},{0x4000d3e,0xd44},{0x4000d46,0xd48},{0x4000d4a,0xd4d},
    {0x1000d4e,0xd4e},{0x1000d54,0xd56},{0x4000d57,0xd57},{0x2000d58,0xd5e},{0x1000d5f,0xd61},{0x4000d62,0xd63},{0x2000d66,0xd78},{0x1000d7a,0xd7f},
    {0x4000d81,0xd83},{0x1000d85,0xd96},{0x1000d9a,0xdb1},{0x1000db3,0xdbb},{0x1000dbd,0xdbd},{0x1000dc0,0xdc6},{0x4000dca,0xdca},{0x4000dcf,0xdd4},
    {0x4000dd6,0xdd6},{0x4000dd8,0xddf},{0x2000de6,0xdef},{0x4000df2,0xdf3},{0x1000e01,0xe30},{0x4000e31,0xe31},{0x1000e32,0xe33},{0x4000e34,0xe3a},
    {0x1000e40,0xe46},{0x4000e47,0xe4e},{0x2000e50,0xe59},{0x1000e81,0xe82},{0x1000e84,0xe84},{0x1000e86,0xe8a},{0x1000e8c,0xea3},{0x1000ea5,0xea5},
    {0x1000ea7,0xeb0},{0x4000eb1,0xeb1},{0x1000eb2,0xeb3},{0x4000eb4,0xebc},{0x1000ebd,0xebd},{0x1000ec0,0xec4},{0x1000ec6,0xec6},{0x4000ec8,0xece},
    {0x2000ed0,0xed9},{0x1000edc,0xedf},{0x1000f00,0xf00},{0x4000f18,0xf19},{0x2000f20,0xf33},{0x4000f35,0xf35},{0x4000f37,0xf37},{0x4000f39,0xf39},
    {0x4000f3e,0xf3f},{0x1000f40,0xf47},{0x1000f49,0xf6c},{0x4000f71,0xf84},{0x4000f86,0xf87},{0x1000f88,0xf8c},{0x4000f8d,0xf97},{0x4000f99,0xfbc},
    {0x4000fc6,0xfc6},{0x1001000,0x102a},{0x400102b,0x103e},{0x100103f,0x103f},{0x2001040,0x1049},{0x1001050,0x1055},{0x4001056,0x1059},{0x100105a,0x105d},
    {0x400105e,0x1060},{0x1001061,0x1061},{0x4001062,0x1064},{0x1001065,0x1066},{0x4001067,0x106d},{0x100106e,0x1070},{0x4001071,0x1074},{0x1001075,0x1081},
    {0x4001082,0x108d},{0x100108e,0x108e},{0x400108f,0x108f},{0x2001090,0x1099},{0x400109a,0x109d},{0x10010a0,0x10c5},{0x10010c7,0x10c7},{0x10010cd,0x10cd},
    {0x10010d0,0x10fa},{0x10010fc,0x1248},{0x100124a,0x124d},{0x1001250,0x1256},{0x1001258,0x1258},{0x100125a,0x125d},{0x1001260,0x1288},{0x100128a,0x128d},
    {0x1001290,0x12b0},{0x10012b2,0x12b5},{0x10012b8,0x12be},{0x10012c0,0x12c0},{0x10012c2,0x12c5},{0x10012c8,0x12d6},{0x10012d8,0x1310},{0x1001312,0x1315},
    {0x1001318,0x135a},{0x400135d,0x135f},{0x2001369,0x137c},{0x1001380,0x138f},{0x10013a0,0x13f5},{0x10013f8,0x13fd},{0x1001401,0x166c},{0x100166f,0x167f},
    {0x8001680,0x1680},{0x1001681,0x169a},{0x10016a0,0x16ea},{0x20016ee,0x16f0},{0x10016f1,0x16f8},{0x1001700,0x1711},{0x4001712,0x1715},{0x100171f,0x1731},
    {0x4001732,0x1734},{0x1001740,0x1751},{0x4001752,0x1753},{0x1001760,0x176c},{0x100176e,0x1770},{0x4001772,0x1773},{0x1001780,0x17b3},{0x40017b4,0x17d3},
    {0x10017d7,0x17d7},{0x10017dc,0x17dc},{0x40017dd,0x17dd},{0x20017e0,0x17e9},{0x20017f0,0x17f9},{0x400180b,0x180d},{0x400180f,0x180f},{0x2001810,0x1819},
    {0x1001820,0x1878},{0x1001880,0x1884},{0x4001885,0x1886},{0x1001887,0x18a8},{0x40018a9,0x18a9},{0x10018aa,0x18aa},{0x10018b0,0x18f5},{0x1001900,0x191e},
    {0x4001920,0x192b},{0x4001930,0x193b},{0x2001946,0x194f},{0x1001950,0x196d},{0x1001970,0x1974},{0x1001980,0x19ab},{0x10019b0,0x19c9},{0x20019d0,0x19da},
    {0x1001a00,0x1a16},{0x4001a17,0x1a1b},{0x1001a20,0x1a54},{0x4001a55,0x1a5e},{0x4001a60,0x1a7c},{0x4001a7f,0x1a7f},{0x2001a80,0x1a89},{0x2001a90,0x1a99},
    {0x1001aa7,0x1aa7},{0x4001ab0,0x1ace},{0x4001b00,0x1b04},{0x1001b05,0x1b33},{0x4001b34,0x1b44},{0x1001b45,0x1b4c},{0x2001b50,0x1b59},{0x4001b6b,0x1b73},
    {0x4001b80,0x1b82},{0x1001b83,0x1ba0},{0x4001ba1,0x1bad},{0x1001bae,0x1baf},{0x2001bb0,0x1bb9},{0x1001bba,0x1be5},{0x4001be6,0x1bf3},{0x1001c00,0x1c23},
    {0x4001c24,0x1c37},{0x2001c40,0x1c49},{0x1001c4d,0x1c4f},{0x2001c50,0x1c59},{0x1001c5a,0x1c7d},{0x1001c80,0x1c8a},{0x1001c90,0x1cba},{0x1001cbd,0x1cbf},
    {0x4001cd0,0x1cd2},{0x4001cd4,0x1ce8},{0x1001ce9,0x1cec},{0x4001ced,0x1ced},{0x1001cee,0x1cf3},{0x4001cf4,0x1cf4},{0x1001cf5,0x1cf6},{0x4001cf7,0x1cf9},
    {0x1001cfa,0x1cfa},{0x1001d00,0x1dbf},{0x4001dc0,0x1dff},{0x1001e00,0x1f15},{0x1001f18,0x1f1d},{0x1001f20,0x1f45},{0x1001f48,0x1f4d},{0x1001f50,0x1f57},
    {0x1001f59,0x1f59},{0x1001f5b,0x1f5b},{0x1001f5d,0x1f5d},{0x1001f5f,0x1f7d},{0x1001f80,0x1fb4},{0x1001fb6,0x1fbc},{0x1001fbe,0x1fbe},{0x1001fc2,0x1fc4},
    {0x1001fc6,0x1fcc},{0x1001fd0,0x1fd3},{0x1001fd6,0x1fdb},{0x1001fe0,0x1fec},{0x1001ff2,0x1ff4},{0x1001ff6,0x1ffc},{0x8002000,0x200a},{0x8002028,0x2029},
    {0x800202f,0x202f},{0x800205f,0x205f},{0x2002070,0x2070},{0x1002071,0x2071},{0x2002074,0x2079},{0x100207f,0x207f},{0x2002080,0x2089},{0x1002090,0x209c},
    {0x40020d0,0x20f0},{0x1002102,0x2102},{0x1002107,0x2107},{0x100210a,0x2113},{0x1002115,0x2115},{0x1002119,0x211d},{0x1002124,0x2124},{0x1002126,0x2126},
    {0x1002128,0x2128},{0x100212a,0x212d},{0x100212f,0x2139},{0x100213c,0x213f},{0x1002145,0x2149},{0x100214e,0x214e},{0x2002150,0x2182},{0x1002183,0x2184},
    {0x2002185,0x2189},{0x2002460,0x249b},{0x20024ea,0x24ff},{0x2002776,0x2793},{0x1002c00,0x2ce4},{0x1002ceb,0x2cee},{0x4002cef,0x2cf1},{0x1002cf2,0x2cf3},
    {0x2002cfd,0x2cfd},{0x1002d00,0x2d25},{0x1002d27,0x2d27},{0x1002d2d,0x2d2d},{0x1002d30,0x2d67},{0x1002d6f,0x2d6f},{0x4002d7f,0x2d7f},{0x1002d80,0x2d96},
    {0x1002da0,0x2da6},{0x1002da8,0x2dae},{0x1002db0,0x2db6},{0x1002db8,0x2dbe},{0x1002dc0,0x2dc6},{0x1002dc8,0x2dce},{0x1002dd0,0x2dd6},{0x1002dd8,0x2dde},
    {0x4002de0,0x2dff},{0x1002e2f,0x2e2f},{0x8003000,0x3000},{0x1003005,0x3006},{0x2003007,0x3007},{0x2003021,0x3029},{0x400302a,0x302f},{0x1003031,0x3035},
    {0x2003038,0x303a},{0x100303b,0x303c},{0x1003041,0x3096},{0x4003099,0x309a},{0x100309d,0x309f},{0x10030a1,0x30fa},{0x10030fc,0x30ff},{0x1003105,0x312f},
    {0x1003131,0x318e},{0x2003192,0x3195},{0x10031a0,0x31bf},{0x10031f0,0x31ff},{0x2003220,0x3229},{0x2003248,0x324f},{0x2003251,0x325f},{0x2003280,0x3289},
    {0x20032b1,0x32bf},{0x1003400,0x4dbf},{0x1004e00,0xa48c},{0x100a4d0,0xa4fd},{0x100a500,0xa60c},{0x100a610,0xa61f},{0x200a620,0xa629},{0x100a62a,0xa62b},
    {0x100a640,0xa66e},{0x400a66f,0xa672},{0x400a674,0xa67d},{0x100a67f,0xa69d},{0x400a69e,0xa69f},{0x100a6a0,0xa6e5},{0x200a6e6,0xa6ef},{0x400a6f0,0xa6f1},
    {0x100a717,0xa71f},{0x100a722,0xa788},{0x100a78b,0xa7cd},{0x100a7d0,0xa7d1},{0x100a7d3,0xa7d3},{0x100a7d5,0xa7dc},{0x100a7f2,0xa801},{0x400a802,0xa802},
    {0x100a803,0xa805},{0x400a806,0xa806},{0x100a807,0xa80a},{0x400a80b,0xa80b},{0x100a80c,0xa822},{0x400a823,0xa827},{0x400a82c,0xa82c},{0x200a830,0xa835},
    {0x100a840,0xa873},{0x400a880,0xa881},{0x100a882,0xa8b3},{0x400a8b4,0xa8c5},{0x200a8d0,0xa8d9},{0x400a8e0,0xa8f1},{0x100a8f2,0xa8f7},{0x100a8fb,0xa8fb},
    {0x100a8fd,0xa8fe},{0x400a8ff,0xa8ff},{0x200a900,0xa909},{0x100a90a,0xa925},{0x400a926,0xa92d},{0x100a930,0xa946},{0x400a947,0xa953},{0x100a960,0xa97c},
    {0x400a980,0xa983},{0x100a984,0xa9b2},{0x400a9b3,0xa9c0},{0x100a9cf,0xa9cf},{0x200a9d0,0xa9d9},{0x100a9e0,0xa9e4},{0x400a9e5,0xa9e5},{0x100a9e6,0xa9ef},
    {0x200a9f0,0xa9f9},{0x100a9fa,0xa9fe},{0x100aa00,0xaa28},{0x400aa29,0xaa36},{0x100aa40,0xaa42},{0x400aa43,0xaa43},{0x100aa44,0xaa4b},{0x400aa4c,0xaa4d},
    {0x200aa50,0xaa59},{0x100aa60,0xaa76},{0x100aa7a,0xaa7a},{0x400aa7b,0xaa7d},{0x100aa7e,0xaaaf},{0x400aab0,0xaab0},{0x100aab1,0xaab1},{0x400aab2,0xaab4},
    {0x100aab5,0xaab6},{0x400aab7,0xaab8},{0x100aab9,0xaabd},{0x400aabe,0xaabf},{0x100aac0,0xaac0},{0x400aac1,0xaac1},{0x100aac2,0xaac2},{0x100aadb,0xaadd},
    {0x100aae0,0xaaea},{0x400aaeb,0xaaef},{0x100aaf2,0xaaf4},{0x400aaf5,0xaaf6},{0x100ab01,0xab06},{0x100ab09,0xab0e},{0x100ab11,0xab16},{0x100ab20,0xab26},
    {0x100ab28,0xab2e},{0x100ab30,0xab5a},{0x100ab5c,0xab69},{0x100ab70,0xabe2},{0x400abe3,0xabea},{0x400abec,0xabed},{0x200abf0,0xabf9},{0x100ac00,0xd7a3},
    {0x100d7b0,0xd7c6},{0x100d7cb,0xd7fb},{0x100f900,0xfa6d},{0x100fa70,0xfad9},{0x100fb00,0xfb06},{0x100fb13,0xfb17},{0x100fb1d,0xfb1d},{0x400fb1e,0xfb1e},
    {0x100fb1f,0xfb28},{0x100fb2a,0xfb36},{0x100fb38,0xfb3c},{0x100fb3e,0xfb3e},{0x100fb40,0xfb41},{0x100fb43,0xfb44},{0x100fb46,0xfbb1},{0x100fbd3,0xfd3d},
    {0x100fd50,0xfd8f},{0x100fd92,0xfdc7},{0x100fdf0,0xfdfb},{0x400fe00,0xfe0f},{0x400fe20,0xfe2f},{0x100fe70,0xfe74},{0x100fe76,0xfefc},{0x200ff10,0xff19},
    {0x100ff21,0xff3a},{0x100ff41,0xff5a},{0x100ff66,0xffbe},{0x100ffc2,0xffc7},{0x100ffca,0xffcf},{0x100ffd2,0xffd7},{0x100ffda,0xffdc},{0x1010000,0x1000b},
    {0x101000d,0x10026},{0x1010028,0x1003a},{0x101003c,0x1003d},{0x101003f,0x1004d},{0x1010050,0x1005d},{0x1010080,0x100fa},{0x2010107,0x10133},{0x2010140,0x10178},
    {0x201018a,0x1018b},{0x40101fd,0x101fd},{0x1010280,0x1029c},{0x10102a0,0x102d0},{0x40102e0,0x102e0},{0x20102e1,0x102fb},{0x1010300,0x1031f},{0x2010320,0x10323},
    {0x101032d,0x10340},{0x2010341,0x10341},{0x1010342,0x10349},{0x201034a,0x1034a},{0x1010350,0x10375},{0x4010376,0x1037a},{0x1010380,0x1039d},{0x10103a0,0x103c3},
    {0x10103c8,0x103cf},{0x20103d1,0x103d5},{0x1010400,0x1049d},{0x20104a0,0x104a9},{0x10104b0,0x104d3},{0x10104d8,0x104fb},{0x1010500,0x10527},{0x1010530,0x10563},
    {0x1010570,0x1057a},{0x101057c,0x1058a},{0x101058c,0x10592},{0x1010594,0x10595},{0x1010597,0x105a1},{0x10105a3,0x105b1},{0x10105b3,0x105b9},{0x10105bb,0x105bc},
    {0x10105c0,0x105f3},{0x1010600,0x10736},{0x1010740,0x10755},{0x1010760,0x10767},{0x1010780,0x10785},{0x1010787,0x107b0},{0x10107b2,0x107ba},{0x1010800,0x10805},
    {0x1010808,0x10808},{0x101080a,0x10835},{0x1010837,0x10838},{0x101083c,0x1083c},{0x101083f,0x10855},{0x2010858,0x1085f},{0x1010860,0x10876},{0x2010879,0x1087f},
    {0x1010880,0x1089e},{0x20108a7,0x108af},{0x10108e0,0x108f2},{0x10108f4,0x108f5},{0x20108fb,0x108ff},{0x1010900,0x10915},{0x2010916,0x1091b},{0x1010920,0x10939},
    {0x1010980,0x109b7},{0x20109bc,0x109bd},{0x10109be,0x109bf},{0x20109c0,0x109cf},{0x20109d2,0x109ff},{0x1010a00,0x10a00},{0x4010a01,0x10a03},{0x4010a05,0x10a06},
    {0x4010a0c,0x10a0f},{0x1010a10,0x10a13},{0x1010a15,0x10a17},{0x1010a19,0x10a35},{0x4010a38,0x10a3a},{0x4010a3f,0x10a3f},{0x2010a40,0x10a48},{0x1010a60,0x10a7c},
    {0x2010a7d,0x10a7e},{0x1010a80,0x10a9c},{0x2010a9d,0x10a9f},{0x1010ac0,0x10ac7},{0x1010ac9,0x10ae4},{0x4010ae5,0x10ae6},{0x2010aeb,0x10aef},{0x1010b00,0x10b35},
    {0x1010b40,0x10b55},{0x2010b58,0x10b5f},{0x1010b60,0x10b72},{0x2010b78,0x10b7f},{0x1010b80,0x10b91},{0x2010ba9,0x10baf},{0x1010c00,0x10c48},{0x1010c80,0x10cb2},
    {0x1010cc0,0x10cf2},{0x2010cfa,0x10cff},{0x1010d00,0x10d23},{0x4010d24,0x10d27},{0x2010d30,0x10d39},{0x2010d40,0x10d49},{0x1010d4a,0x10d65},{0x4010d69,0x10d6d},
    {0x1010d6f,0x10d85},{0x2010e60,0x10e7e},{0x1010e80,0x10ea9},{0x4010eab,0x10eac},{0x1010eb0,0x10eb1},{0x1010ec2,0x10ec4},{0x4010efc,0x10eff},{0x1010f00,0x10f1c},
    {0x2010f1d,0x10f26},{0x1010f27,0x10f27},{0x1010f30,0x10f45},{0x4010f46,0x10f50},{0x2010f51,0x10f54},{0x1010f70,0x10f81},{0x4010f82,0x10f85},{0x1010fb0,0x10fc4},
    {0x2010fc5,0x10fcb},{0x1010fe0,0x10ff6},{0x4011000,0x11002},{0x1011003,0x11037},{0x4011038,0x11046},{0x2011052,0x1106f},{0x4011070,0x11070},{0x1011071,0x11072},
    {0x4011073,0x11074},{0x1011075,0x11075},{0x401107f,0x11082},{0x1011083,0x110af},{0x40110b0,0x110ba},{0x40110c2,0x110c2},{0x10110d0,0x110e8},{0x20110f0,0x110f9},
    {0x4011100,0x11102},{0x1011103,0x11126},{0x4011127,0x11134},{0x2011136,0x1113f},{0x1011144,0x11144},{0x4011145,0x11146},{0x1011147,0x11147},{0x1011150,0x11172},
    {0x4011173,0x11173},{0x1011176,0x11176},{0x4011180,0x11182},{0x1011183,0x111b2},{0x40111b3,0x111c0},{0x10111c1,0x111c4},{0x40111c9,0x111cc},{0x40111ce,0x111cf},
    {0x20111d0,0x111d9},{0x10111da,0x111da},{0x10111dc,0x111dc},{0x20111e1,0x111f4},{0x1011200,0x11211},{0x1011213,0x1122b},{0x401122c,0x11237},{0x401123e,0x1123e},
    {0x101123f,0x11240},{0x4011241,0x11241},{0x1011280,0x11286},{0x1011288,0x11288},{0x101128a,0x1128d},{0x101128f,0x1129d},{0x101129f,0x112a8},{0x10112b0,0x112de},
    {0x40112df,0x112ea},{0x20112f0,0x112f9},{0x4011300,0x11303},{0x1011305,0x1130c},{0x101130f,0x11310},{0x1011313,0x11328},{0x101132a,0x11330},{0x1011332,0x11333},
    {0x1011335,0x11339},{0x401133b,0x1133c},{0x101133d,0x1133d},{0x401133e,0x11344},{0x4011347,0x11348},{0x401134b,0x1134d},{0x1011350,0x11350},{0x4011357,0x11357},
    {0x101135d,0x11361},{0x4011362,0x11363},{0x4011366,0x1136c},{0x4011370,0x11374},{0x1011380,0x11389},{0x101138b,0x1138b},{0x101138e,0x1138e},{0x1011390,0x113b5},
    {0x10113b7,0x113b7},{0x40113b8,0x113c0},{0x40113c2,0x113c2},{0x40113c5,0x113c5},{0x40113c7,0x113ca},{0x40113cc,0x113d0},{0x10113d1,0x113d1},{0x40113d2,0x113d2},
    {0x10113d3,0x113d3},{0x40113e1,0x113e2},{0x1011400,0x11434},{0x4011435,0x11446},{0x1011447,0x1144a},{0x2011450,0x11459},{0x401145e,0x1145e},{0x101145f,0x11461},
    {0x1011480,0x114af},{0x40114b0,0x114c3},{0x10114c4,0x114c5},{0x10114c7,0x114c7},{0x20114d0,0x114d9},{0x1011580,0x115ae},{0x40115af,0x115b5},{0x40115b8,0x115c0},
    {0x10115d8,0x115db},{0x40115dc,0x115dd},{0x1011600,0x1162f},{0x4011630,0x11640},{0x1011644,0x11644},{0x2011650,0x11659},{0x1011680,0x116aa},{0x40116ab,0x116b7},
    {0x10116b8,0x116b8},{0x20116c0,0x116c9},{0x20116d0,0x116e3},{0x1011700,0x1171a},{0x401171d,0x1172b},{0x2011730,0x1173b},{0x1011740,0x11746},{0x1011800,0x1182b},
    {0x401182c,0x1183a},{0x10118a0,0x118df},{0x20118e0,0x118f2},{0x10118ff,0x11906},{0x1011909,0x11909},{0x101190c,0x11913},{0x1011915,0x11916},{0x1011918,0x1192f},
    {0x4011930,0x11935},{0x4011937,0x11938},{0x401193b,0x1193e},{0x101193f,0x1193f},{0x4011940,0x11940},{0x1011941,0x11941},{0x4011942,0x11943},{0x2011950,0x11959},
    {0x10119a0,0x119a7},{0x10119aa,0x119d0},{0x40119d1,0x119d7},{0x40119da,0x119e0},{0x10119e1,0x119e1},{0x10119e3,0x119e3},{0x40119e4,0x119e4},{0x1011a00,0x11a00},
    {0x4011a01,0x11a0a},{0x1011a0b,0x11a32},{0x4011a33,0x11a39},{0x1011a3a,0x11a3a},{0x4011a3b,0x11a3e},{0x4011a47,0x11a47},{0x1011a50,0x11a50},{0x4011a51,0x11a5b},
    {0x1011a5c,0x11a89},{0x4011a8a,0x11a99},{0x1011a9d,0x11a9d},{0x1011ab0,0x11af8},{0x1011bc0,0x11be0},{0x2011bf0,0x11bf9},{0x1011c00,0x11c08},{0x1011c0a,0x11c2e},
    {0x4011c2f,0x11c36},{0x4011c38,0x11c3f},{0x1011c40,0x11c40},{0x2011c50,0x11c6c},{0x1011c72,0x11c8f},{0x4011c92,0x11ca7},{0x4011ca9,0x11cb6},{0x1011d00,0x11d06},
    {0x1011d08,0x11d09},{0x1011d0b,0x11d30},{0x4011d31,0x11d36},{0x4011d3a,0x11d3a},{0x4011d3c,0x11d3d},{0x4011d3f,0x11d45},{0x1011d46,0x11d46},{0x4011d47,0x11d47},
    {0x2011d50,0x11d59},{0x1011d60,0x11d65},{0x1011d67,0x11d68},{0x1011d6a,0x11d89},{0x4011d8a,0x11d8e},{0x4011d90,0x11d91},{0x4011d93,0x11d97},{0x1011d98,0x11d98},
    {0x2011da0,0x11da9},{0x1011ee0,0x11ef2},{0x4011ef3,0x11ef6},{0x4011f00,0x11f01},{0x1011f02,0x11f02},{0x4011f03,0x11f03},{0x1011f04,0x11f10},{0x1011f12,0x11f33},
    {0x4011f34,0x11f3a},{0x4011f3e,0x11f42},{0x2011f50,0x11f59},{0x4011f5a,0x11f5a},{0x1011fb0,0x11fb0},{0x2011fc0,0x11fd4},{0x1012000,0x12399},{0x2012400,0x1246e},
    {0x1012480,0x12543},{0x1012f90,0x12ff0},{0x1013000,0x1342f},{0x4013440,0x13440},{0x1013441,0x13446},{0x4013447,0x13455},{0x1013460,0x143fa},{0x1014400,0x14646},
    {0x1016100,0x1611d},{0x401611e,0x1612f},{0x2016130,0x16139},{0x1016800,0x16a38},{0x1016a40,0x16a5e},{0x2016a60,0x16a69},{0x1016a70,0x16abe},{0x2016ac0,0x16ac9},
    {0x1016ad0,0x16aed},{0x4016af0,0x16af4},{0x1016b00,0x16b2f},{0x4016b30,0x16b36},{0x1016b40,0x16b43},{0x2016b50,0x16b59},{0x2016b5b,0x16b61},{0x1016b63,0x16b77},
    {0x1016b7d,0x16b8f},{0x1016d40,0x16d6c},{0x2016d70,0x16d79},{0x1016e40,0x16e7f},{0x2016e80,0x16e96},{0x1016f00,0x16f4a},{0x4016f4f,0x16f4f},{0x1016f50,0x16f50},
    {0x4016f51,0x16f87},{0x4016f8f,0x16f92},{0x1016f93,0x16f9f},{0x1016fe0,0x16fe1},{0x1016fe3,0x16fe3},{0x4016fe4,0x16fe4},{0x4016ff0,0x16ff1},{0x1017000,0x187f7},
    {0x1018800,0x18cd5},{0x1018cff,0x18d08},{0x101aff0,0x1aff3},{0x101aff5,0x1affb},{0x101affd,0x1affe},{0x101b000,0x1b122},{0x101b132,0x1b132},{0x101b150,0x1b152},
    {0x101b155,0x1b155},{0x101b164,0x1b167},{0x101b170,0x1b2fb},{0x101bc00,0x1bc6a},{0x101bc70,0x1bc7c},{0x101bc80,0x1bc88},{0x101bc90,0x1bc99},{0x401bc9d,0x1bc9e},
    {0x201ccf0,0x1ccf9},{0x401cf00,0x1cf2d},{0x401cf30,0x1cf46},{0x401d165,0x1d169},{0x401d16d,0x1d172},{0x401d17b,0x1d182},{0x401d185,0x1d18b},{0x401d1aa,0x1d1ad},
    {0x401d242,0x1d244},{0x201d2c0,0x1d2d3},{0x201d2e0,0x1d2f3},{0x201d360,0x1d378},{0x101d400,0x1d454},{0x101d456,0x1d49c},{0x101d49e,0x1d49f},{0x101d4a2,0x1d4a2},
    {0x101d4a5,0x1d4a6},{0x101d4a9,0x1d4ac},{0x101d4ae,0x1d4b9},{0x101d4bb,0x1d4bb},{0x101d4bd,0x1d4c3},{0x101d4c5,0x1d505},{0x101d507,0x1d50a},{0x101d50d,0x1d514},
    {0x101d516,0x1d51c},{0x101d51e,0x1d539},{0x101d53b,0x1d53e},{0x101d540,0x1d544},{0x101d546,0x1d546},{0x101d54a,0x1d550},{0x101d552,0x1d6a5},{0x101d6a8,0x1d6c0},
    {0x101d6c2,0x1d6da},{0x101d6dc,0x1d6fa},{0x101d6fc,0x1d714},{0x101d716,0x1d734},{0x101d736,0x1d74e},{0x101d750,0x1d76e},{0x101d770,0x1d788},{0x101d78a,0x1d7a8},
    {0x101d7aa,0x1d7c2},{0x101d7c4,0x1d7cb},{0x201d7ce,0x1d7ff},{0x401da00,0x1da36},{0x401da3b,0x1da6c},{0x401da75,0x1da75},{0x401da84,0x1da84},{0x401da9b,0x1da9f},
    {0x401daa1,0x1daaf},{0x101df00,0x1df1e},{0x101df25,0x1df2a},{0x401e000,0x1e006},{0x401e008,0x1e018},{0x401e01b,0x1e021},{0x401e023,0x1e024},{0x401e026,0x1e02a},
    {0x101e030,0x1e06d},{0x401e08f,0x1e08f},{0x101e100,0x1e12c},{0x401e130,0x1e136},{0x101e137,0x1e13d},{0x201e140,0x1e149},{0x101e14e,0x1e14e},{0x101e290,0x1e2ad},
    {0x401e2ae,0x1e2ae},{0x101e2c0,0x1e2eb},{0x401e2ec,0x1e2ef},{0x201e2f0,0x1e2f9},{0x101e4d0,0x1e4eb},{0x401e4ec,0x1e4ef},{0x201e4f0,0x1e4f9},{0x101e5d0,0x1e5ed},
    {0x401e5ee,0x1e5ef},{0x101e5f0,0x1e5f0},{0x201e5f1,0x1e5fa},{0x101e7e0,0x1e7e6},{0x101e7e8,0x1e7eb},{0x101e7ed,0x1e7ee},{0x101e7f0,0x1e7fe},{0x101e800,0x1e8c4},
    {0x201e8c7,0x1e8cf},{0x401e8d0,0x1e8d6},{0x101e900,0x1e943},{0x401e944,0x1e94a},{0x101e94b,0x1e94b},{0x201e950,0x1e959},{0x201ec71,0x1ecab},{0x201ecad,0x1ecaf},
    {0x201ecb1,0x1ecb4},{0x201ed01,0x1ed2d},{0x201ed2f,0x1ed3d},{0x101ee00,0x1ee03},{0x101ee05,0x1ee1f},{0x101ee21,0x1ee22},{0x101ee24,0x1ee24},{0x101ee27,0x1ee27},
    {0x101ee29,0x1ee32},{0x101ee34,0x1ee37},{0x101ee39,0x1ee39},{0x101ee3b,0x1ee3b},{0x101ee42,0x1ee42},{0x101ee47,0x1ee47},{0x101ee49,0x1ee49},{0x101ee4b,0x1ee4b},
    {0x101ee4d,0x1ee4f},{0x101ee51,0x1ee52},{0x101ee54,0x1ee54},{0x101ee57,0x1ee57},{0x101ee59,0x1ee59},{0x101ee5b,0x1ee5b},{0x101ee5d,0x1ee5d},{0x101ee5f,0x1ee5f},
    {0x101ee61,0x1ee62},{0x101ee64,0x1ee64},{0x101ee67,0x1ee6a},{0x101ee6c,0x1ee72},{0x101ee74,0x1ee77},{0x101ee79,0x1ee7c},{0x101ee7e,0x1ee7e},{0x101ee80,0x1ee89},
    {0x101ee8b,0x1ee9b},{0x101eea1,0x1eea3},{0x101eea5,0x1eea9},{0x101eeab,0x1eebb},{0x201f100,0x1f10c},{0x201fbf0,0x1fbf9},{0x1020000,0x2a6df},{0x102a700,0x2b739},
    {0x102b740,0x2b81d},{0x102b820,0x2cea1},{0x102ceb0,0x2ebe0},{0x102ebf0,0x2ee5d},{0x102f800,0x2fa1d},{0x1030000,0x3134a},{0x1031350,0x323af},{0x40e0100,0xe01ef},
};
#define QSA__UNI_CLS_N 1152

/* {lo | ccc << 24, hi}, sorted; code points not listed have class 0 */
static const uint32_t qsa__uni_ccc[][2] = {
    {0xe6000300,0x314},{0xe8000315,0x315},{0xdc000316,0x319},{0xe800031a,0x31a},{0xd800031b,0x31b},{0xdc00031c,0x320},{0xca000321,0x322},{0xdc000323,0x326},
    {0xca000327,0x328},{0xdc000329,0x333},{0x1000334,0x338},{0xdc000339,0x33c},{0xe600033d,0x344},{0xf0000345,0x345},{0xe6000346,0x346},{0xdc000347,0x349},
    {0xe600034a,0x34c},{0xdc00034d,0x34e},{0xe6000350,0x352},{0xdc000353,0x356},{0xe6000357,0x357},{0xe8000358,0x358},{0xdc000359,0x35a},{0xe600035b,0x35b},
    {0xe900035c,0x35c},{0xea00035d,0x35e},{0xe900035f,0x35f},{0xea000360,0x361},{0xe9000362,0x362},{0xe6000363,0x36f},{0xe6000483,0x487},{0xdc000591,0x591},
    {0xe6000592,0x595},{0xdc000596,0x596},{0xe6000597,0x599},{0xde00059a,0x59a},{0xdc00059b,0x59b},{0xe600059c,0x5a1},{0xdc0005a2,0x5a7},{0xe60005a8,0x5a9},
    {0xdc0005aa,0x5aa},{0xe60005ab,0x5ac},{0xde0005ad,0x5ad},{0xe40005ae,0x5ae},{0xe60005af,0x5af},{0xa0005b0,0x5b0},{0xb0005b1,0x5b1},{0xc0005b2,0x5b2},
    {0xd0005b3,0x5b3},{0xe0005b4,0x5b4},{0xf0005b5,0x5b5},{0x100005b6,0x5b6},{0x110005b7,0x5b7},{0x120005b8,0x5b8},{0x130005b9,0x5ba},{0x140005bb,0x5bb},
    {0x150005bc,0x5bc},{0x160005bd,0x5bd},{0x170005bf,0x5bf},{0x180005c1,0x5c1},{0x190005c2,0x5c2},{0xe60005c4,0x5c4},{0xdc0005c5,0x5c5},{0x120005c7,0x5c7},
    {0xe6000610,0x617},{0x1e000618,0x618},{0x1f000619,0x619},{0x2000061a,0x61a},{0x1b00064b,0x64b},{0x1c00064c,0x64c},{0x1d00064d,0x64d},{0x1e00064e,0x64e},
    {0x1f00064f,0x64f},{0x20000650,0x650},{0x21000651,0x651},{0x22000652,0x652},{0xe6000653,0x654},{0xdc000655,0x656},{0xe6000657,0x65b},{0xdc00065c,0x65c},
    {0xe600065d,0x65e},{0xdc00065f,0x65f},{0x23000670,0x670},{0xe60006d6,0x6dc},{0xe60006df,0x6e2},{0xdc0006e3,0x6e3},{0xe60006e4,0x6e4},{0xe60006e7,0x6e8},
    {0xdc0006ea,0x6ea},{0xe60006eb,0x6ec},{0xdc0006ed,0x6ed},{0x24000711,0x711},{0xe6000730,0x730},{0xdc000731,0x731},{0xe6000732,0x733},{0xdc000734,0x734},
    {0xe6000735,0x736},{0xdc000737,0x739},{0xe600073a,0x73a},{0xdc00073b,0x73c},{0xe600073d,0x73d},{0xdc00073e,0x73e},{0xe600073f,0x741},{0xdc000742,0x742},
    {0xe6000743,0x743},{0xdc000744,0x744},{0xe6000745,0x745},{0xdc000746,0x746},{0xe6000747,0x747},{0xdc000748,0x748},{0xe6000749,0x74a},{0xe60007eb,0x7f1},
    {0xdc0007f2,0x7f2},{0xe60007f3,0x7f3},{0xe6000816,0x819},{0xe600081b,0x823},{0xe6000825,0x827},{0xe6000829,0x82d},{0xdc000859,0x85b},{0xe60008d4,0x8e1},
    {0xdc0008e3,0x8e3},{0xe60008e4,0x8e5},{0xdc0008e6,0x8e6},{0xe60008e7,0x8e8},{0xdc0008e9,0x8e9},{0xe60008ea,0x8ec},{0xdc0008ed,0x8ef},{0x1b0008f0,0x8f0},
    {0x1c0008f1,0x8f1},{0x1d0008f2,0x8f2},{0xe60008f3,0x8f5},{0xdc0008f6,0x8f6},{0xe60008f7,0x8f8},{0xdc0008f9,0x8fa},{0xe60008fb,0x8ff},{0x700093c,0x93c},
    {0x900094d,0x94d},{0xe6000951,0x951},{0xdc000952,0x952},{0xe6000953,0x954},{0x70009bc,0x9bc},{0x90009cd,0x9cd},{0x7000a3c,0xa3c},{0x9000a4d,0xa4d},
    {0x7000abc,0xabc},{0x9000acd,0xacd},{0x7000b3c,0xb3c},{0x9000b4d,0xb4d},{0x9000bcd,0xbcd},{0x9000c4d,0xc4d},{0x54000c55,0xc55},{0x5b000c56,0xc56},
    {0x7000cbc,0xcbc},{0x9000ccd,0xccd},{0x9000d4d,0xd4d},{0x9000dca,0xdca},{0x67000e38,0xe39},{0x9000e3a,0xe3a},{0x6b000e48,0xe4b},{0x76000eb8,0xeb9},
    {0x7a000ec8,0xecb},{0xdc000f18,0xf19},{0xdc000f35,0xf35},{0xdc000f37,0xf37},{0xd8000f39,0xf39},{0x81000f71,0xf71},{0x82000f72,0xf72},{0x84000f74,0xf74},
    {0x82000f7a,0xf7d},{0x82000f80,0xf80},{0xe6000f82,0xf83},{0x9000f84,0xf84},{0xe6000f86,0xf87},{0xdc000fc6,0xfc6},{0x7001037,0x1037},{0x9001039,0x103a},
    {0xdc00108d,0x108d},{0xe600135d,0x135f},{0x9001714,0x1714},{0x9001734,0x1734},{0x90017d2,0x17d2},{0xe60017dd,0x17dd},{0xe40018a9,0x18a9},{0xde001939,0x1939},
    {0xe600193a,0x193a},{0xdc00193b,0x193b},{0xe6001a17,0x1a17},{0xdc001a18,0x1a18},{0x9001a60,0x1a60},{0xe6001a75,0x1a7c},{0xdc001a7f,0x1a7f},{0xe6001ab0,0x1ab4},
    {0xdc001ab5,0x1aba},{0xe6001abb,0x1abc},{0xdc001abd,0x1abd},{0x7001b34,0x1b34},{0x9001b44,0x1b44},{0xe6001b6b,0x1b6b},{0xdc001b6c,0x1b6c},{0xe6001b6d,0x1b73},
    {0x9001baa,0x1bab},{0x7001be6,0x1be6},{0x9001bf2,0x1bf3},{0x7001c37,0x1c37},{0xe6001cd0,0x1cd2},{0x1001cd4,0x1cd4},{0xdc001cd5,0x1cd9},{0xe6001cda,0x1cdb},
    {0xdc001cdc,0x1cdf},{0xe6001ce0,0x1ce0},{0x1001ce2,0x1ce8},{0xdc001ced,0x1ced},{0xe6001cf4,0x1cf4},{0xe6001cf8,0x1cf9},{0xe6001dc0,0x1dc1},{0xdc001dc2,0x1dc2},
    {0xe6001dc3,0x1dc9},{0xdc001dca,0x1dca},{0xe6001dcb,0x1dcc},{0xea001dcd,0x1dcd},{0xd6001dce,0x1dce},{0xdc001dcf,0x1dcf},{0xca001dd0,0x1dd0},{0xe6001dd1,0x1df5},
    {0xe6001dfb,0x1dfb},{0xe9001dfc,0x1dfc},{0xdc001dfd,0x1dfd},{0xe6001dfe,0x1dfe},{0xdc001dff,0x1dff},{0xe60020d0,0x20d1},{0x10020d2,0x20d3},{0xe60020d4,0x20d7},
    {0x10020d8,0x20da},{0xe60020db,0x20dc},{0xe60020e1,0x20e1},{0x10020e5,0x20e6},{0xe60020e7,0x20e7},{0xdc0020e8,0x20e8},{0xe60020e9,0x20e9},{0x10020ea,0x20eb},
    {0xdc0020ec,0x20ef},{0xe60020f0,0x20f0},{0xe6002cef,0x2cf1},{0x9002d7f,0x2d7f},{0xe6002de0,0x2dff},{0xda00302a,0x302a},{0xe400302b,0x302b},{0xe800302c,0x302c},
    {0xde00302d,0x302d},{0xe000302e,0x302f},{0x8003099,0x309a},{0xe600a66f,0xa66f},{0xe600a674,0xa67d},{0xe600a69e,0xa69f},{0xe600a6f0,0xa6f1},{0x900a806,0xa806},
    {0x900a8c4,0xa8c4},{0xe600a8e0,0xa8f1},{0xdc00a92b,0xa92d},{0x900a953,0xa953},{0x700a9b3,0xa9b3},{0x900a9c0,0xa9c0},{0xe600aab0,0xaab0},{0xe600aab2,0xaab3},
    {0xdc00aab4,0xaab4},{0xe600aab7,0xaab8},{0xe600aabe,0xaabf},{0xe600aac1,0xaac1},{0x900aaf6,0xaaf6},{0x900abed,0xabed},{0x1a00fb1e,0xfb1e},{0xe600fe20,0xfe26},
    {0xdc00fe27,0xfe2d},{0xe600fe2e,0xfe2f},{0xdc0101fd,0x101fd},{0xdc0102e0,0x102e0},{0xe6010376,0x1037a},{0xdc010a0d,0x10a0d},{0xe6010a0f,0x10a0f},{0xe6010a38,0x10a38},
    {0x1010a39,0x10a39},{0xdc010a3a,0x10a3a},{0x9010a3f,0x10a3f},{0xe6010ae5,0x10ae5},{0xdc010ae6,0x10ae6},{0x9011046,0x11046},{0x901107f,0x1107f},{0x90110b9,0x110b9},
    {0x70110ba,0x110ba},{0xe6011100,0x11102},{0x9011133,0x11134},{0x7011173,0x11173},{0x90111c0,0x111c0},{0x70111ca,0x111ca},{0x9011235,0x11235},{0x7011236,0x11236},
    {0x70112e9,0x112e9},{0x90112ea,0x112ea},{0x701133c,0x1133c},{0x901134d,0x1134d},{0xe6011366,0x1136c},{0xe6011370,0x11374},{0x9011442,0x11442},{0x7011446,0x11446},
    {0x90114c2,0x114c2},{0x70114c3,0x114c3},{0x90115bf,0x115bf},{0x70115c0,0x115c0},{0x901163f,0x1163f},{0x90116b6,0x116b6},{0x70116b7,0x116b7},{0x901172b,0x1172b},
    {0x9011c3f,0x11c3f},{0x1016af0,0x16af4},{0xe6016b30,0x16b36},{0x101bc9e,0x1bc9e},{0xd801d165,0x1d166},{0x101d167,0x1d169},{0xe201d16d,0x1d16d},{0xd801d16e,0x1d172},
    {0xdc01d17b,0x1d182},{0xe601d185,0x1d189},{0xdc01d18a,0x1d18b},{0xe601d1aa,0x1d1ad},{0xe601d242,0x1d244},{0xe601e000,0x1e006},{0xe601e008,0x1e018},{0xe601e01b,0x1e021},
    {0xe601e023,0x1e024},{0xe601e026,0x1e02a},{0xdc01e8d0,0x1e8d6},{0xe601e944,0x1e949},{0x701e94a,0x1e94a},
};
#define QSA__UNI_CCC_N 333

/* {cp | primary_composite << 31, first, second (0 for a singleton)}, sorted by cp */
static const uint32_t qsa__uni_dec[][3] = {
    {0x800000c0,0x41,0x300},{0x800000c1,0x41,0x301},{0x800000c2,0x41,0x302},{0x800000c3,0x41,0x303},{0x800000c4,0x41,0x308},{0x800000c5,0x41,0x30a},
    {0x800000c7,0x43,0x327},{0x800000c8,0x45,0x300},{0x800000c9,0x45,0x301},{0x800000ca,0x45,0x302},{0x800000cb,0x45,0x308},{0x800000cc,0x49,0x300},
    {0x800000cd,0x49,0x301},{0x800000ce,0x49,0x302},{0x800000cf,0x49,0x308},{0x800000d1,0x4e,0x303},{0x800000d2,0x4f,0x300},{0x800000d3,0x4f,0x301},
    {0x800000d4,0x4f,0x302},{0x800000d5,0x4f,0x303},{0x800000d6,0x4f,0x308},{0x800000d9,0x55,0x300},{0x800000da,0x55,0x301},{0x800000db,0x55,0x302},
    {0x800000dc,0x55,0x308},{0x800000dd,0x59,0x301},{0x800000e0,0x61,0x300},{0x800000e1,0x61,0x301},{0x800000e2,0x61,0x302},{0x800000e3,0x61,0x303},
    {0x800000e4,0x61,0x308},{0x800000e5,0x61,0x30a},{0x800000e7,0x63,0x327},{0x800000e8,0x65,0x300},{0x800000e9,0x65,0x301},{0x800000ea,0x65,0x302},
    {0x800000eb,0x65,0x308},{0x800000ec,0x69,0x300},{0x800000ed,0x69,0x301},{0x800000ee,0x69,0x302},{0x800000ef,0x69,0x308},{0x800000f1,0x6e,0x303},
    {0x800000f2,0x6f,0x300},{0x800000f3,0x6f,0x301},{0x800000f4,0x6f,0x302},{0x800000f5,0x6f,0x303},{0x800000f6,0x6f,0x308},{0x800000f9,0x75,0x300},
    {0x800000fa,0x75,0x301},{0x800000fb,0x75,0x302},{0x800000fc,0x75,0x308},{0x800000fd,0x79,0x301},{0x800000ff,0x79,0x308},{0x80000100,0x41,0x304},
    {0x80000101,0x61,0x304},{0x80000102,0x41,0x306},{0x80000103,0x61,0x306},{0x80000104,0x41,0x328},{0x80000105,0x61,0x328},{0x80000106,0x43,0x301},
    {0x80000107,0x63,0x301},{0x80000108,0x43,0x302},{0x80000109,0x63,0x302},{0x8000010a,0x43,0x307},{0x8000010b,0x63,0x307},{0x8000010c,0x43,0x30c},
    {0x8000010d,0x63,0x30c},{0x8000010e,0x44,0x30c},{0x8000010f,0x64,0x30c},{0x80000112,0x45,0x304},{0x80000113,0x65,0x304},{0x80000114,0x45,0x306},
    {0x80000115,0x65,0x306},{0x80000116,0x45,0x307},{0x80000117,0x65,0x307},{0x80000118,0x45,0x328},{0x80000119,0x65,0x328},{0x8000011a,0x45,0x30c},
    {0x8000011b,0x65,0x30c},{0x8000011c,0x47,0x302},{0x8000011d,0x67,0x302},{0x8000011e,0x47,0x306},{0x8000011f,0x67,0x306},{0x80000120,0x47,0x307},
    {0x80000121,0x67,0x307},{0x80000122,0x47,0x327},{0x80000123,0x67,0x327},{0x80000124,0x48,0x302},{0x80000125,0x68,0x302},{0x80000128,0x49,0x303},
    {0x80000129,0x69,0x303},{0x8000012a,0x49,0x304},{0x8000012b,0x69,0x304},{0x8000012c,0x49,0x306},{0x8000012d,0x69,0x306},{0x8000012e,0x49,0x328},
    {0x8000012f,0x69,0x328},{0x80000130,0x49,0x307},{0x80000134,0x4a,0x302},{0x80000135,0x6a,0x302},{0x80000136,0x4b,0x327},{0x80000137,0x6b,0x327},
    {0x80000139,0x4c,0x301},{0x8000013a,0x6c,0x301},{0x8000013b,0x4c,0x327},{0x8000013c,0x6c,0x327},{0x8000013d,0x4c,0x30c},{0x8000013e,0x6c,0x30c},
    {0x80000143,0x4e,0x301},{0x80000144,0x6e,0x301},{0x80000145,0x4e,0x327},{0x80000146,0x6e,0x327},{0x80000147,0x4e,0x30c},{0x80000148,0x6e,0x30c},
    {0x8000014c,0x4f,0x304},{0x8000014d,0x6f,0x304},{0x8000014e,0x4f,0x306},{0x8000014f,0x6f,0x306},{0x80000150,0x4f,0x30b},{0x80000151,0x6f,0x30b},
    {0x80000154,0x52,0x301},{0x80000155,0x72,0x301},{0x80000156,0x52,0x327},{0x80000157,0x72,0x327},{0x80000158,0x52,0x30c},{0x80000159,0x72,0x30c},
    {0x8000015a,0x53,0x301},{0x8000015b,0x73,0x301},{0x8000015c,0x53,0x302},{0x8000015d,0x73,0x302},{0x8000015e,0x53,0x327},{0x8000015f,0x73,0x327},
    {0x80000160,0x53,0x30c},{0x80000161,0x73,0x30c},{0x80000162,0x54,0x327},{0x80000163,0x74,0x327},{0x80000164,0x54,0x30c},{0x80000165,0x74,0x30c},
    {0x80000168,0x55,0x303},{0x80000169,0x75,0x303},{0x8000016a,0x55,0x304},{0x8000016b,0x75,0x304},{0x8000016c,0x55,0x306},{0x8000016d,0x75,0x306},
    {0x8000016e,0x55,0x30a},{0x8000016f,0x75,0x30a},{0x80000170,0x55,0x30b},{0x80000171,0x75,0x30b},{0x80000172,0x55,0x328},{0x80000173,0x75,0x328},
    {0x80000174,0x57,0x302},{0x80000175,0x77,0x302},{0x80000176,0x59,0x302},{0x80000177,0x79,0x302},{0x80000178,0x59,0x308},{0x80000179,0x5a,0x301},
    {0x8000017a,0x7a,0x301},{0x8000017b,0x5a,0x307},{0x8000017c,0x7a,0x307},{0x8000017d,0x5a,0x30c},{0x8000017e,0x7a,0x30c},{0x800001a0,0x4f,0x31b},
    {0x800001a1,0x6f,0x31b},{0x800001af,0x55,0x31b},{0x800001b0,0x75,0x31b},{0x800001cd,0x41,0x30c},{0x800001ce,0x61,0x30c},{0x800001cf,0x49,0x30c},
    {0x800001d0,0x69,0x30c},{0x800001d1,0x4f,0x30c},{0x800001d2,0x6f,0x30c},{0x800001d3,0x55,0x30c},{0x800001d4,0x75,0x30c},{0x800001d5,0xdc,0x304},
    {0x800001d6,0xfc,0x304},{0x800001d7,0xdc,0x301},{0x800001d8,0xfc,0x301},{0x800001d9,0xdc,0x30c},{0x800001da,0xfc,0x30c},{0x800001db,0xdc,0x300},
    {0x800001dc,0xfc,0x300},{0x800001de,0xc4,0x304},{0x800001df,0xe4,0x304},{0x800001e0,0x226,0x304},{0x800001e1,0x227,0x304},{0x800001e2,0xc6,0x304},
    {0x800001e3,0xe6,0x304},{0x800001e6,0x47,0x30c},{0x800001e7,0x67,0x30c},{0x800001e8,0x4b,0x30c},{0x800001e9,0x6b,0x30c},{0x800001ea,0x4f,0x328},
    {0x800001eb,0x6f,0x328},{0x800001ec,0x1ea,0x304},{0x800001ed,0x1eb,0x304},{0x800001ee,0x1b7,0x30c},{0x800001ef,0x292,0x30c},{0x800001f0,0x6a,0x30c},
    {0x800001f4,0x47,0x301},{0x800001f5,0x67,0x301},{0x800001f8,0x4e,0x300},{0x800001f9,0x6e,0x300},{0x800001fa,0xc5,0x301},{0x800001fb,0xe5,0x301},
    {0x800001fc,0xc6,0x301},{0x800001fd,0xe6,0x301},{0x800001fe,0xd8,0x301},{0x800001ff,0xf8,0x301},{0x80000200,0x41,0x30f},{0x80000201,0x61,0x30f},
    {0x80000202,0x41,0x311},{0x80000203,0x61,0x311},{0x80000204,0x45,0x30f},{0x80000205,0x65,0x30f},{0x80000206,0x45,0x311},{0x80000207,0x65,0x311},
    {0x80000208,0x49,0x30f},{0x80000209,0x69,0x30f},{0x8000020a,0x49,0x311},{0x8000020b,0x69,0x311},{0x8000020c,0x4f,0x30f},{0x8000020d,0x6f,0x30f},
    {0x8000020e,0x4f,0x311},{0x8000020f,0x6f,0x311},{0x80000210,0x52,0x30f},{0x80000211,0x72,0x30f},{0x80000212,0x52,0x311},{0x80000213,0x72,0x311},
    {0x80000214,0x55,0x30f},{0x80000215,0x75,0x30f},{0x80000216,0x55,0x311},{0x80000217,0x75,0x311},{0x80000218,0x53,0x326},{0x80000219,0x73,0x326},
    {0x8000021a,0x54,0x326},{0x8000021b,0x74,0x326},{0x8000021e,0x48,0x30c},{0x8000021f,0x68,0x30c},{0x80000226,0x41,0x307},{0x80000227,0x61,0x307},
    {0x80000228,0x45,0x327},{0x80000229,0x65,0x327},{0x8000022a,0xd6,0x304},{0x8000022b,0xf6,0x304},{0x8000022c,0xd5,0x304},{0x8000022d,0xf5,0x304},
    {0x8000022e,0x4f,0x307},{0x8000022f,0x6f,0x307},{0x80000230,0x22e,0x304},{0x80000231,0x22f,0x304},{0x80000232,0x59,0x304},{0x80000233,0x79,0x304},
    {0x340,0x300,0x0},{0x341,0x301,0x0},{0x343,0x313,0x0},{0x344,0x308,0x301},{0x374,0x2b9,0x0},{0x37e,0x3b,0x0},
    {0x80000385,0xa8,0x301},{0x80000386,0x391,0x301},{0x387,0xb7,0x0},{0x80000388,0x395,0x301},{0x80000389,0x397,0x301},{0x8000038a,0x399,0x301},
    {0x8000038c,0x39f,0x301},{0x8000038e,0x3a5,0x301},{0x8000038f,0x3a9,0x301},{0x80000390,0x3ca,0x301},{0x800003aa,0x399,0x308},{0x800003ab,0x3a5,0x308},
    {0x800003ac,0x3b1,0x301},{0x800003ad,0x3b5,0x301},{0x800003ae,0x3b7,0x301},{0x800003af,0x3b9,0x301},{0x800003b0,0x3cb,0x301},{0x800003ca,0x3b9,0x308},
    {0x800003cb,0x3c5,0x308},{0x800003cc,0x3bf,0x301},{0x800003cd,0x3c5,0x301},{0x800003ce,0x3c9,0x301},{0x800003d3,0x3d2,0x301},{0x800003d4,0x3d2,0x308},
    {0x80000400,0x415,0x300},{0x80000401,0x415,0x308},{0x80000403,0x413,0x301},{0x80000407,0x406,0x308},{0x8000040c,0x41a,0x301},{0x8000040d,0x418,0x300},
    {0x8000040e,0x423,0x306},{0x80000419,0x418,0x306},{0x80000439,0x438,0x306},{0x80000450,0x435,0x300},{0x80000451,0x435,0x308},{0x80000453,0x433,0x301},
    {0x80000457,0x456,0x308},{0x8000045c,0x43a,0x301},{0x8000045d,0x438,0x300},{0x8000045e,0x443,0x306},{0x80000476,0x474,0x30f},{0x80000477,0x475,0x30f},
    {0x800004c1,0x416,0x306},{0x800004c2,0x436,0x306},{0x800004d0,0x410,0x306},{0x800004d1,0x430,0x306},{0x800004d2,0x410,0x308},{0x800004d3,0x430,0x308},
    {0x800004d6,0x415,0x306},{0x800004d7,0x435,0x306},{0x800004da,0x4d8,0x308},{0x800004db,0x4d9,0x308},{0x800004dc,0x416,0x308},{0x800004dd,0x436,0x308},
    {0x800004de,0x417,0x308},{0x800004df,0x437,0x308},{0x800004e2,0x418,0x304},{0x800004e3,0x438,0x304},{0x800004e4,0x418,0x308},{0x800004e5,0x438,0x308},
    {0x800004e6,0x41e,0x308},{0x800004e7,0x43e,0x308},{0x800004ea,0x4e8,0x308},{0x800004eb,0x4e9,0x308},{0x800004ec,0x42d,0x308},{0x800004ed,0x44d,0x308},
    {0x800004ee,0x423,0x304},{0x800004ef,0x443,0x304},{0x800004f0,0x423,0x308},{0x800004f1,0x443,0x308},{0x800004f2,0x423,0x30b},{0x800004f3,0x443,0x30b},
    {0x800004f4,0x427,0x308},{0x800004f5,0x447,0x308},{0x800004f8,0x42b,0x308},{0x800004f9,0x44b,0x308},{0x80000622,0x627,0x653},{0x80000623,0x627,0x654},
    {0x80000624,0x648,0x654},{0x80000625,0x627,0x655},{0x80000626,0x64a,0x654},{0x800006c0,0x6d5,0x654},{0x800006c2,0x6c1,0x654},{0x800006d3,0x6d2,0x654},
    {0x80000929,0x928,0x93c},{0x80000931,0x930,0x93c},{0x80000934,0x933,0x93c},{0x958,0x915,0x93c},{0x959,0x916,0x93c},{0x95a,0x917,0x93c},
    {0x95b,0x91c,0x93c},{0x95c,0x921,0x93c},{0x95d,0x922,0x93c},{0x95e,0x92b,0x93c},{0x95f,0x92f,0x93c},{0x800009cb,0x9c7,0x9be},
    {0x800009cc,0x9c7,0x9d7},{0x9dc,0x9a1,0x9bc},{0x9dd,0x9a2,0x9bc},{0x9df,0x9af,0x9bc},{0xa33,0xa32,0xa3c},{0xa36,0xa38,0xa3c},
    {0xa59,0xa16,0xa3c},{0xa5a,0xa17,0xa3c},{0xa5b,0xa1c,0xa3c},{0xa5e,0xa2b,0xa3c},{0x80000b48,0xb47,0xb56},{0x80000b4b,0xb47,0xb3e},
    {0x80000b4c,0xb47,0xb57},{0xb5c,0xb21,0xb3c},{0xb5d,0xb22,0xb3c},{0x80000b94,0xb92,0xbd7},{0x80000bca,0xbc6,0xbbe},{0x80000bcb,0xbc7,0xbbe},
    {0x80000bcc,0xbc6,0xbd7},{0x80000c48,0xc46,0xc56},{0x80000cc0,0xcbf,0xcd5},{0x80000cc7,0xcc6,0xcd5},{0x80000cc8,0xcc6,0xcd6},{0x80000cca,0xcc6,0xcc2},
    {0x80000ccb,0xcca,0xcd5},{0x80000d4a,0xd46,0xd3e},{0x80000d4b,0xd47,0xd3e},{0x80000d4c,0xd46,0xd57},{0x80000dda,0xdd9,0xdca},{0x80000ddc,0xdd9,0xdcf},
    {0x80000ddd,0xddc,0xdca},{0x80000dde,0xdd9,0xddf},{0xf43,0xf42,0xfb7},{0xf4d,0xf4c,0xfb7},{0xf52,0xf51,0xfb7},{0xf57,0xf56,0xfb7},
    {0xf5c,0xf5b,0xfb7},{0xf69,0xf40,0xfb5},{0xf73,0xf71,0xf72},{0xf75,0xf71,0xf74},{0xf76,0xfb2,0xf80},{0xf78,0xfb3,0xf80},
    {0xf81,0xf71,0xf80},{0xf93,0xf92,0xfb7},{0xf9d,0xf9c,0xfb7},{0xfa2,0xfa1,0xfb7},{0xfa7,0xfa6,0xfb7},{0xfac,0xfab,0xfb7},
    {0xfb9,0xf90,0xfb5},{0x80001026,0x1025,0x102e},{0x80001b06,0x1b05,0x1b35},{0x80001b08,0x1b07,0x1b35},{0x80001b0a,0x1b09,0x1b35},{0x80001b0c,0x1b0b,0x1b35},
    {0x80001b0e,0x1b0d,0x1b35},{0x80001b12,0x1b11,0x1b35},{0x80001b3b,0x1b3a,0x1b35},{0x80001b3d,0x1b3c,0x1b35},{0x80001b40,0x1b3e,0x1b35},{0x80001b41,0x1b3f,0x1b35},
    {0x80001b43,0x1b42,0x1b35},{0x80001e00,0x41,0x325},{0x80001e01,0x61,0x325},{0x80001e02,0x42,0x307},{0x80001e03,0x62,0x307},{0x80001e04,0x42,0x323},
    {0x80001e05,0x62,0x323},{0x80001e06,0x42,0x331},{0x80001e07,0x62,0x331},{0x80001e08,0xc7,0x301},{0x80001e09,0xe7,0x301},{0x80001e0a,0x44,0x307},
    {0x80001e0b,0x64,0x307},{0x80001e0c,0x44,0x323},{0x80001e0d,0x64,0x323},{0x80001e0e,0x44,0x331},{0x80001e0f,0x64,0x331},{0x80001e10,0x44,0x327},
    {0x80001e11,0x64,0x327},{0x80001e12,0x44,0x32d},{0x80001e13,0x64,0x32d},{0x80001e14,0x112,0x300},{0x80001e15,0x113,0x300},{0x80001e16,0x112,0x301},
    {0x80001e17,0x113,0x301},{0x80001e18,0x45,0x32d},{0x80001e19,0x65,0x32d},{0x80001e1a,0x45,0x330},{0x80001e1b,0x65,0x330},{0x80001e1c,0x228,0x306},
    {0x80001e1d,0x229,0x306},{0x80001e1e,0x46,0x307},{0x80001e1f,0x66,0x307},{0x80001e20,0x47,0x304},{0x80001e21,0x67,0x304},{0x80001e22,0x48,0x307},
    {0x80001e23,0x68,0x307},{0x80001e24,0x48,0x323},{0x80001e25,0x68,0x323},{0x80001e26,0x48,0x308},{0x80001e27,0x68,0x308},{0x80001e28,0x48,0x327},
    {0x80001e29,0x68,0x327},{0x80001e2a,0x48,0x32e},{0x80001e2b,0x68,0x32e},{0x80001e2c,0x49,0x330},{0x80001e2d,0x69,0x330},{0x80001e2e,0xcf,0x301},
    {0x80001e2f,0xef,0x301},{0x80001e30,0x4b,0x301},{0x80001e31,0x6b,0x301},{0x80001e32,0x4b,0x323},{0x80001e33,0x6b,0x323},{0x80001e34,0x4b,0x331},
    {0x80001e35,0x6b,0x331},{0x80001e36,0x4c,0x323},{0x80001e37,0x6c,0x323},{0x80001e38,0x1e36,0x304},{0x80001e39,0x1e37,0x304},{0x80001e3a,0x4c,0x331},
    {0x80001e3b,0x6c,0x331},{0x80001e3c,0x4c,0x32d},{0x80001e3d,0x6c,0x32d},{0x80001e3e,0x4d,0x301},{0x80001e3f,0x6d,0x301},{0x80001e40,0x4d,0x307},
    {0x80001e41,0x6d,0x307},{0x80001e42,0x4d,0x323},{0x80001e43,0x6d,0x323},{0x80001e44,0x4e,0x307},{0x80001e45,0x6e,0x307},{0x80001e46,0x4e,0x323},
    {0x80001e47,0x6e,0x323},{0x80001e48,0x4e,0x331},{0x80001e49,0x6e,0x331},{0x80001e4a,0x4e,0x32d},{0x80001e4b,0x6e,0x32d},{0x80001e4c,0xd5,0x301},
    {0x80001e4d,0xf5,0x301},{0x80001e4e,0xd5,0x308},{0x80001e4f,0xf5,0x308},{0x80001e50,0x14c,0x300},{0x80001e51,0x14d,0x300},{0x80001e52,0x14c,0x301},
    {0x80001e53,0x14d,0x301},{0x80001e54,0x50,0x301},{0x80001e55,0x70,0x301},{0x80001e56,0x50,0x307},{0x80001e57,0x70,0x307},{0x80001e58,0x52,0x307},
    {0x80001e59,0x72,0x307},{0x80001e5a,0x52,0x323},{0x80001e5b,0x72,0x323},{0x80001e5c,0x1e5a,0x304},{0x80001e5d,0x1e5b,0x304},{0x80001e5e,0x52,0x331},
    {0x80001e5f,0x72,0x331},{0x80001e60,0x53,0x307},{0x80001e61,0x73,0x307},{0x80001e62,0x53,0x323},{0x80001e63,0x73,0x323},{0x80001e64,0x15a,0x307},
    {0x80001e65,0x15b,0x307},{0x80001e66,0x160,0x307},{0x80001e67,0x161,0x307},{0x80001e68,0x1e62,0x307},{0x80001e69,0x1e63,0x307},{0x80001e6a,0x54,0x307},
    {0x80001e6b,0x74,0x307},{0x80001e6c,0x54,0x323},{0x80001e6d,0x74,0x323},{0x80001e6e,0x54,0x331},{0x80001e6f,0x74,0x331},{0x80001e70,0x54,0x32d},
    {0x80001e71,0x74,0x32d},{0x80001e72,0x55,0x324},{0x80001e73,0x75,0x324},{0x80001e74,0x55,0x330},{0x80001e75,0x75,0x330},{0x80001e76,0x55,0x32d},
    {0x80001e77,0x75,0x32d},{0x80001e78,0x168,0x301},{0x80001e79,0x169,0x301},{0x80001e7a,0x16a,0x308},{0x80001e7b,0x16b,0x308},{0x80001e7c,0x56,0x303},
    {0x80001e7d,0x76,0x303},{0x80001e7e,0x56,0x323},{0x80001e7f,0x76,0x323},{0x80001e80,0x57,0x300},{0x80001e81,0x77,0x300},{0x80001e82,0x57,0x301},
    {0x80001e83,0x77,0x301},{0x80001e84,0x57,0x308},{0x80001e85,0x77,0x308},{0x80001e86,0x57,0x307},{0x80001e87,0x77,0x307},{0x80001e88,0x57,0x323},
    {0x80001e89,0x77,0x323},{0x80001e8a,0x58,0x307},{0x80001e8b,0x78,0x307},{0x80001e8c,0x58,0x308},{0x80001e8d,0x78,0x308},{0x80001e8e,0x59,0x307},
    {0x80001e8f,0x79,0x307},{0x80001e90,0x5a,0x302},{0x80001e91,0x7a,0x302},{0x80001e92,0x5a,0x323},{0x80001e93,0x7a,0x323},{0x80001e94,0x5a,0x331},
    {0x80001e95,0x7a,0x331},{0x80001e96,0x68,0x331},{0x80001e97,0x74,0x308},{0x80001e98,0x77,0x30a},{0x80001e99,0x79,0x30a},{0x80001e9b,0x17f,0x307},
    {0x80001ea0,0x41,0x323},{0x80001ea1,0x61,0x323},{0x80001ea2,0x41,0x309},{0x80001ea3,0x61,0x309},{0x80001ea4,0xc2,0x301},{0x80001ea5,0xe2,0x301},
    {0x80001ea6,0xc2,0x300},{0x80001ea7,0xe2,0x300},{0x80001ea8,0xc2,0x309},{0x80001ea9,0xe2,0x309},{0x80001eaa,0xc2,0x303},{0x80001eab,0xe2,0x303},
    {0x80001eac,0x1ea0,0x302},{0x80001ead,0x1ea1,0x302},{0x80001eae,0x102,0x301},{0x80001eaf,0x103,0x301},{0x80001eb0,0x102,0x300},{0x80001eb1,0x103,0x300},
    {0x80001eb2,0x102,0x309},{0x80001eb3,0x103,0x309},{0x80001eb4,0x102,0x303},{0x80001eb5,0x103,0x303},{0x80001eb6,0x1ea0,0x306},{0x80001eb7,0x1ea1,0x306},
    {0x80001eb8,0x45,0x323},{0x80001eb9,0x65,0x323},{0x80001eba,0x45,0x309},{0x80001ebb,0x65,0x309},{0x80001ebc,0x45,0x303},{0x80001ebd,0x65,0x303},
    {0x80001ebe,0xca,0x301},{0x80001ebf,0xea,0x301},{0x80001ec0,0xca,0x300},{0x80001ec1,0xea,0x300},{0x80001ec2,0xca,0x309},{0x80001ec3,0xea,0x309},
    {0x80001ec4,0xca,0x303},{0x80001ec5,0xea,0x303},{0x80001ec6,0x1eb8,0x302},{0x80001ec7,0x1eb9,0x302},{0x80001ec8,0x49,0x309},{0x80001ec9,0x69,0x309},
    {0x80001eca,0x49,0x323},{0x80001ecb,0x69,0x323},{0x80001ecc,0x4f,0x323},{0x80001ecd,0x6f,0x323},{0x80001ece,0x4f,0x309},{0x80001ecf,0x6f,0x309},
    {0x80001ed0,0xd4,0x301},{0x80001ed1,0xf4,0x301},{0x80001ed2,0xd4,0x300},{0x80001ed3,0xf4,0x300},{0x80001ed4,0xd4,0x309},{0x80001ed5,0xf4,0x309},
    {0x80001ed6,0xd4,0x303},{0x80001ed7,0xf4,0x303},{0x80001ed8,0x1ecc,0x302},{0x80001ed9,0x1ecd,0x302},{0x80001eda,0x1a0,0x301},{0x80001edb,0x1a1,0x301},
    {0x80001edc,0x1a0,0x300},{0x80001edd,0x1a1,0x300},{0x80001ede,0x1a0,0x309},{0x80001edf,0x1a1,0x309},{0x80001ee0,0x1a0,0x303},{0x80001ee1,0x1a1,0x303},
    {0x80001ee2,0x1a0,0x323},{0x80001ee3,0x1a1,0x323},{0x80001ee4,0x55,0x323},{0x80001ee5,0x75,0x323},{0x80001ee6,0x55,0x309},{0x80001ee7,0x75,0x309},
    {0x80001ee8,0x1af,0x301},{0x80001ee9,0x1b0,0x301},{0x80001eea,0x1af,0x300},{0x80001eeb,0x1b0,0x300},{0x80001eec,0x1af,0x309},{0x80001eed,0x1b0,0x309},
    {0x80001eee,0x1af,0x303},{0x80001eef,0x1b0,0x303},{0x80001ef0,0x1af,0x323},{0x80001ef1,0x1b0,0x323},{0x80001ef2,0x59,0x300},{0x80001ef3,0x79,0x300},
    {0x80001ef4,0x59,0x323},{0x80001ef5,0x79,0x323},{0x80001ef6,0x59,0x309},{0x80001ef7,0x79,0x309},{0x80001ef8,0x59,0x303},{0x80001ef9,0x79,0x303},
    {0x80001f00,0x3b1,0x313},{0x80001f01,0x3b1,0x314},{0x80001f02,0x1f00,0x300},{0x80001f03,0x1f01,0x300},{0x80001f04,0x1f00,0x301},{0x80001f05,0x1f01,0x301},
    {0x80001f06,0x1f00,0x342},{0x80001f07,0x1f01,0x342},{0x80001f08,0x391,0x313},{0x80001f09,0x391,0x314},{0x80001f0a,0x1f08,0x300},{0x80001f0b,0x1f09,0x300},
    {0x80001f0c,0x1f08,0x301},{0x80001f0d,0x1f09,0x301},{0x80001f0e,0x1f08,0x342},{0x80001f0f,0x1f09,0x342},{0x80001f10,0x3b5,0x313},{0x80001f11,0x3b5,0x314},
    {0x80001f12,0x1f10,0x300},{0x80001f13,0x1f11,0x300},{0x80001f14,0x1f10,0x301},{0x80001f15,0x1f11,0x301},{0x80001f18,0x395,0x313},{0x80001f19,0x395,0x314},
    {0x80001f1a,0x1f18,0x300},{0x80001f1b,0x1f19,0x300},{0x80001f1c,0x1f18,0x301},{0x80001f1d,0x1f19,0x301},{0x80001f20,0x3b7,0x313},{0x80001f21,0x3b7,0x314},
    {0x80001f22,0x1f20,0x300},{0x80001f23,0x1f21,0x300},{0x80001f24,0x1f20,0x301},{0x80001f25,0x1f21,0x301},{0x80001f26,0x1f20,0x342},{0x80001f27,0x1f21,0x342},
    {0x80001f28,0x397,0x313},{0x80001f29,0x397,0x314},{0x80001f2a,0x1f28,0x300},{0x80001f2b,0x1f29,0x300},{0x80001f2c,0x1f28,0x301},{0x80001f2d,0x1f29,0x301},
    {0x80001f2e,0x1f28,0x342},{0x80001f2f,0x1f29,0x342},{0x80001f30,0x3b9,0x313},{0x80001f31,0x3b9,0x314},{0x80001f32,0x1f30,0x300},{0x80001f33,0x1f31,0x300},
    {0x80001f34,0x1f30,0x301},{0x80001f35,0x1f31,0x301},{0x80001f36,0x1f30,0x342},{0x80001f37,0x1f31,0x342},{0x80001f38,0x399,0x313},{0x80001f39,0x399,0x314},
    {0x80001f3a,0x1f38,0x300},{0x80001f3b,0x1f39,0x300},{0x80001f3c,0x1f38,0x301},{0x80001f3d,0x1f39,0x301},{0x80001f3e,0x1f38,0x342},{0x80001f3f,0x1f39,0x342},
    {0x80001f40,0x3bf,0x313},{0x80001f41,0x3bf,0x314},{0x80001f42,0x1f40,0x300},{0x80001f43,0x1f41,0x300},{0x80001f44,0x1f40,0x301},{0x80001f45,0x1f41,0x301},
    {0x80001f48,0x39f,0x313},{0x80001f49,0x39f,0x314},{0x80001f4a,0x1f48,0x300},{0x80001f4b,0x1f49,0x300},{0x80001f4c,0x1f48,0x301},{0x80001f4d,0x1f49,0x301},
    {0x80001f50,0x3c5,0x313},{0x80001f51,0x3c5,0x314},{0x80001f52,0x1f50,0x300},{0x80001f53,0x1f51,0x300},{0x80001f54,0x1f50,0x301},{0x80001f55,0x1f51,0x301},
    {0x80001f56,0x1f50,0x342},{0x80001f57,0x1f51,0x342},{0x80001f59,0x3a5,0x314},{0x80001f5b,0x1f59,0x300},{0x80001f5d,0x1f59,0x301},{0x80001f5f,0x1f59,0x342},
    {0x80001f60,0x3c9,0x313},{0x80001f61,0x3c9,0x314},{0x80001f62,0x1f60,0x300},{0x80001f63,0x1f61,0x300},{0x80001f64,0x1f60,0x301},{0x80001f65,0x1f61,0x301},
    {0x80001f66,0x1f60,0x342},{0x80001f67,0x1f61,0x342},{0x80001f68,0x3a9,0x313},{0x80001f69,0x3a9,0x314},{0x80001f6a,0x1f68,0x300},{0x80001f6b,0x1f69,0x300},
    {0x80001f6c,0x1f68,0x301},{0x80001f6d,0x1f69,0x301},{0x80001f6e,0x1f68,0x342},{0x80001f6f,0x1f69,0x342},{0x80001f70,0x3b1,0x300},{0x1f71,0x3ac,0x0},
    {0x80001f72,0x3b5,0x300},{0x1f73,0x3ad,0x0},{0x80001f74,0x3b7,0x300},{0x1f75,0x3ae,0x0},{0x80001f76,0x3b9,0x300},{0x1f77,0x3af,0x0},
    {0x80001f78,0x3bf,0x300},{0x1f79,0x3cc,0x0},{0x80001f7a,0x3c5,0x300},{0x1f7b,0x3cd,0x0},{0x80001f7c,0x3c9,0x300},{0x1f7d,0x3ce,0x0},
    {0x80001f80,0x1f00,0x345},{0x80001f81,0x1f01,0x345},{0x80001f82,0x1f02,0x345},{0x80001f83,0x1f03,0x345},{0x80001f84,0x1f04,0x345},{0x80001f85,0x1f05,0x345},
    {0x80001f86,0x1f06,0x345},{0x80001f87,0x1f07,0x345},{0x80001f88,0x1f08,0x345},{0x80001f89,0x1f09,0x345},{0x80001f8a,0x1f0a,0x345},{0x80001f8b,0x1f0b,0x345},
    {0x80001f8c,0x1f0c,0x345},{0x80001f8d,0x1f0d,0x345},{0x80001f8e,0x1f0e,0x345},{0x80001f8f,0x1f0f,0x345},{0x80001f90,0x1f20,0x345},{0x80001f91,0x1f21,0x345},
    {0x80001f92,0x1f22,0x345},{0x80001f93,0x1f23,0x345},{0x80001f94,0x1f24,0x345},{0x80001f95,0x1f25,0x345},{0x80001f96,0x1f26,0x345},{0x80001f97,0x1f27,0x345},
    {0x80001f98,0x1f28,0x345},{0x80001f99,0x1f29,0x345},{0x80001f9a,0x1f2a,0x345},{0x80001f9b,0x1f2b,0x345},{0x80001f9c,0x1f2c,0x345},{0x80001f9d,0x1f2d,0x345},
    {0x80001f9e,0x1f2e,0x345},{0x80001f9f,0x1f2f,0x345},{0x80001fa0,0x1f60,0x345},{0x80001fa1,0x1f61,0x345},{0x80001fa2,0x1f62,0x345},{0x80001fa3,0x1f63,0x345},
    {0x80001fa4,0x1f64,0x345},{0x80001fa5,0x1f65,0x345},{0x80001fa6,0x1f66,0x345},{0x80001fa7,0x1f67,0x345},{0x80001fa8,0x1f68,0x345},{0x80001fa9,0x1f69,0x345},
    {0x80001faa,0x1f6a,0x345},{0x80001fab,0x1f6b,0x345},{0x80001fac,0x1f6c,0x345},{0x80001fad,0x1f6d,0x345},{0x80001fae,0x1f6e,0x345},{0x80001faf,0x1f6f,0x345},
    {0x80001fb0,0x3b1,0x306},{0x80001fb1,0x3b1,0x304},{0x80001fb2,0x1f70,0x345},{0x80001fb3,0x3b1,0x345},{0x80001fb4,0x3ac,0x345},{0x80001fb6,0x3b1,0x342},
    {0x80001fb7,0x1fb6,0x345},{0x80001fb8,0x391,0x306},{0x80001fb9,0x391,0x304},{0x80001fba,0x391,0x300},{0x1fbb,0x386,0x0},{0x80001fbc,0x391,0x345},
    {0x1fbe,0x3b9,0x0},{0x80001fc1,0xa8,0x342},{0x80001fc2,0x1f74,0x345},{0x80001fc3,0x3b7,0x345},{0x80001fc4,0x3ae,0x345},{0x80001fc6,0x3b7,0x342},
    {0x80001fc7,0x1fc6,0x345},{0x80001fc8,0x395,0x300},{0x1fc9,0x388,0x0},{0x80001fca,0x397,0x300},{0x1fcb,0x389,0x0},{0x80001fcc,0x397,0x345},
    {0x80001fcd,0x1fbf,0x300},{0x80001fce,0x1fbf,0x301},{0x80001fcf,0x1fbf,0x342},{0x80001fd0,0x3b9,0x306},{0x80001fd1,0x3b9,0x304},{0x80001fd2,0x3ca,0x300},
    {0x1fd3,0x390,0x0},{0x80001fd6,0x3b9,0x342},{0x80001fd7,0x3ca,0x342},{0x80001fd8,0x399,0x306},{0x80001fd9,0x399,0x304},{0x80001fda,0x399,0x300},
    {0x1fdb,0x38a,0x0},{0x80001fdd,0x1ffe,0x300},{0x80001fde,0x1ffe,0x301},{0x80001fdf,0x1ffe,0x342},{0x80001fe0,0x3c5,0x306},{0x80001fe1,0x3c5,0x304},
    {0x80001fe2,0x3cb,0x300},{0x1fe3,0x3b0,0x0},{0x80001fe4,0x3c1,0x313},{0x80001fe5,0x3c1,0x314},{0x80001fe6,0x3c5,0x342},{0x80001fe7,0x3cb,0x342},
    {0x80001fe8,0x3a5,0x306},{0x80001fe9,0x3a5,0x304},{0x80001fea,0x3a5,0x300},{0x1feb,0x38e,0x0},{0x80001fec,0x3a1,0x314},{0x80001fed,0xa8,0x300},
    {0x1fee,0x385,0x0},{0x1fef,0x60,0x0},{0x80001ff2,0x1f7c,0x345},{0x80001ff3,0x3c9,0x345},{0x80001ff4,0x3ce,0x345},{0x80001ff6,0x3c9,0x342},
    {0x80001ff7,0x1ff6,0x345},{0x80001ff8,0x39f,0x300},{0x1ff9,0x38c,0x0},{0x80001ffa,0x3a9,0x300},{0x1ffb,0x38f,0x0},{0x80001ffc,0x3a9,0x345},
    {0x1ffd,0xb4,0x0},{0x2000,0x2002,0x0},{0x2001,0x2003,0x0},{0x2126,0x3a9,0x0},{0x212a,0x4b,0x0},{0x212b,0xc5,0x0},
    {0x8000219a,0x2190,0x338},{0x8000219b,0x2192,0x338},{0x800021ae,0x2194,0x338},{0x800021cd,0x21d0,0x338},{0x800021ce,0x21d4,0x338},{0x800021cf,0x21d2,0x338},
    {0x80002204,0x2203,0x338},{0x80002209,0x2208,0x338},{0x8000220c,0x220b,0x338},{0x80002224,0x2223,0x338},{0x80002226,0x2225,0x338},{0x80002241,0x223c,0x338},
    {0x80002244,0x2243,0x338},{0x80002247,0x2245,0x338},{0x80002249,0x2248,0x338},{0x80002260,0x3d,0x338},{0x80002262,0x2261,0x338},{0x8000226d,0x224d,0x338},
    {0x8000226e,0x3c,0x338},{0x8000226f,0x3e,0x338},{0x80002270,0x2264,0x338},{0x80002271,0x2265,0x338},{0x80002274,0x2272,0x338},{0x80002275,0x2273,0x338},
    {0x80002278,0x2276,0x338},{0x80002279,0x2277,0x338},{0x80002280,0x227a,0x338},{0x80002281,0x227b,0x338},{0x80002284,0x2282,0x338},{0x80002285,0x2283,0x338},
    {0x80002288,0x2286,0x338},{0x80002289,0x2287,0x338},{0x800022ac,0x22a2,0x338},{0x800022ad,0x22a8,0x338},{0x800022ae,0x22a9,0x338},{0x800022af,0x22ab,0x338},
    {0x800022e0,0x227c,0x338},{0x800022e1,0x227d,0x338},{0x800022e2,0x2291,0x338},{0x800022e3,0x2292,0x338},{0x800022ea,0x22b2,0x338},{0x800022eb,0x22b3,0x338},
    {0x800022ec,0x22b4,0x338},{0x800022ed,0x22b5,0x338},{0x2329,0x3008,0x0},{0x232a,0x3009,0x0},{0x2adc,0x2add,0x338},{0x8000304c,0x304b,0x3099},
    {0x8000304e,0x304d,0x3099},{0x80003050,0x304f,0x3099},{0x80003052,0x3051,0x3099},{0x80003054,0x3053,0x3099},{0x80003056,0x3055,0x3099},{0x80003058,0x3057,0x3099},
    {0x8000305a,0x3059,0x3099},{0x8000305c,0x305b,0x3099},{0x8000305e,0x305d,0x3099},{0x80003060,0x305f,0x3099},{0x80003062,0x3061,0x3099},{0x80003065,0x3064,0x3099},
    {0x80003067,0x3066,0x3099},{0x80003069,0x3068,0x3099},{0x80003070,0x306f,0x3099},{0x80003071,0x306f,0x309a},{0x80003073,0x3072,0x3099},{0x80003074,0x3072,0x309a},
    {0x80003076,0x3075,0x3099},{0x80003077,0x3075,0x309a},{0x80003079,0x3078,0x3099},{0x8000307a,0x3078,0x309a},{0x8000307c,0x307b,0x3099},{0x8000307d,0x307b,0x309a},
    {0x80003094,0x3046,0x3099},{0x8000309e,0x309d,0x3099},{0x800030ac,0x30ab,0x3099},{0x800030ae,0x30ad,0x3099},{0x800030b0,0x30af,0x3099},{0x800030b2,0x30b1,0x3099},
    {0x800030b4,0x30b3,0x3099},{0x800030b6,0x30b5,0x3099},{0x800030b8,0x30b7,0x3099},{0x800030ba,0x30b9,0x3099},{0x800030bc,0x30bb,0x3099},{0x800030be,0x30bd,0x3099},
    {0x800030c0,0x30bf,0x3099},{0x800030c2,0x30c1,0x3099},{0x800030c5,0x30c4,0x3099},{0x800030c7,0x30c6,0x3099},{0x800030c9,0x30c8,0x3099},{0x800030d0,0x30cf,0x3099},
    {0x800030d1,0x30cf,0x309a},{0x800030d3,0x30d2,0x3099},{0x800030d4,0x30d2,0x309a},{0x800030d6,0x30d5,0x3099},{0x800030d7,0x30d5,0x309a},{0x800030d9,0x30d8,0x3099},
    {0x800030da,0x30d8,0x309a},{0x800030dc,0x30db,0x3099},{0x800030dd,0x30db,0x309a},{0x800030f4,0x30a6,0x3099},{0x800030f7,0x30ef,0x3099},{0x800030f8,0x30f0,0x3099},
    {0x800030f9,0x30f1,0x3099},{0x800030fa,0x30f2,0x3099},{0x800030fe,0x30fd,0x3099},{0xf900,0x8c48,0x0},{0xf901,0x66f4,0x0},{0xf902,0x8eca,0x0},
    {0xf903,0x8cc8,0x0},{0xf904,0x6ed1,0x0},{0xf905,0x4e32,0x0},{0xf906,0x53e5,0x0},{0xf907,0x9f9c,0x0},{0xf908,0x9f9c,0x0},
    {0xf909,0x5951,0x0},{0xf90a,0x91d1,0x0},{0xf90b,0x5587,0x0},{0xf90c,0x5948,0x0},{0xf90d,0x61f6,0x0},{0xf90e,0x7669,0x0},
    {0xf90f,0x7f85,0x0},{0xf910,0x863f,0x0},{0xf911,0x87ba,0x0},{0xf912,0x88f8,0x0},{0xf913,0x908f,0x0},{0xf914,0x6a02,0x0},
    {0xf915,0x6d1b,0x0},{0xf916,0x70d9,0x0},{0xf917,0x73de,0x0},{0xf918,0x843d,0x0},{0xf919,0x916a,0x0},{0xf91a,0x99f1,0x0},
    {0xf91b,0x4e82,0x0},{0xf91c,0x5375,0x0},{0xf91d,0x6b04,0x0},{0xf91e,0x721b,0x0},{0xf91f,0x862d,0x0},{0xf920,0x9e1e,0x0},
    {0xf921,0x5d50,0x0},{0xf922,0x6feb,0x0},{0xf923,0x85cd,0x0},{0xf924,0x8964,0x0},{0xf925,0x62c9,0x0},{0xf926,0x81d8,0x0},
    {0xf927,0x881f,0x0},{0xf928,0x5eca,0x0},{0xf929,0x6717,0x0},{0xf92a,0x6d6a,0x0},{0xf92b,0x72fc,0x0},{0xf92c,0x90ce,0x0},
    {0xf92d,0x4f86,0x0},{0xf92e,0x51b7,0x0},{0xf92f,0x52de,0x0},{0xf930,0x64c4,0x0},{0xf931,0x6ad3,0x0},{0xf932,0x7210,0x0},
    {0xf933,0x76e7,0x0},{0xf934,0x8001,0x0},{0xf935,0x8606,0x0},{0xf936,0x865c,0x0},{0xf937,0x8def,0x0},{0xf938,0x9732,0x0},
    {0xf939,0x9b6f,0x0},{0xf93a,0x9dfa,0x0},{0xf93b,0x788c,0x0},{0xf93c,0x797f,0x0},{0xf93d,0x7da0,0x0},{0xf93e,0x83c9,0x0},
    {0xf93f,0x9304,0x0},{0xf940,0x9e7f,0x0},{0xf941,0x8ad6,0x0},{0xf942,0x58df,0x0},{0xf943,0x5f04,0x0},{0xf944,0x7c60,0x0},
    {0xf945,0x807e,0x0},{0xf946,0x7262,0x0},{0xf947,0x78ca,0x0},{0xf948,0x8cc2,0x0},{0xf949,0x96f7,0x0},{0xf94a,0x58d8,0x0},
    {0xf94b,0x5c62,0x0},{0xf94c,0x6a13,0x0},{0xf94d,0x6dda,0x0},{0xf94e,0x6f0f,0x0},{0xf94f,0x7d2f,0x0},{0xf950,0x7e37,0x0},
    {0xf951,0x964b,0x0},{0xf952,0x52d2,0x0},{0xf953,0x808b,0x0},{0xf954,0x51dc,0x0},{0xf955,0x51cc,0x0},{0xf956,0x7a1c,0x0},
    {0xf957,0x7dbe,0x0},{0xf958,0x83f1,0x0},{0xf959,0x9675,0x0},{0xf95a,0x8b80,0x0},{0xf95b,0x62cf,0x0},{0xf95c,0x6a02,0x0},
    {0xf95d,0x8afe,0x0},{0xf95e,0x4e39,0x0},{0xf95f,0x5be7,0x0},{0xf960,0x6012,0x0},{0xf961,0x7387,0x0},{0xf962,0x7570,0x0},
    {0xf963,0x5317,0x0},{0xf964,0x78fb,0x0},{0xf965,0x4fbf,0x0},{0xf966,0x5fa9,0x0},{0xf967,0x4e0d,0x0},{0xf968,0x6ccc,0x0},
    {0xf969,0x6578,0x0},{0xf96a,0x7d22,0x0},{0xf96b,0x53c3,0x0},{0xf96c,0x585e,0x0},{0xf96d,0x7701,0x0},{0xf96e,0x8449,0x0},
    {0xf96f,0x8aaa,0x0},{0xf970,0x6bba,0x0},{0xf971,0x8fb0,0x0},{0xf972,0x6c88,0x0},{0xf973,0x62fe,0x0},{0xf974,0x82e5,0x0},
    {0xf975,0x63a0,0x0},{0xf976,0x7565,0x0},{0xf977,0x4eae,0x0},{0xf978,0x5169,0x0},{0xf979,0x51c9,0x0},{0xf97a,0x6881,0x0},
    {0xf97b,0x7ce7,0x0},{0xf97c,0x826f,0x0},{0xf97d,0x8ad2,0x0},{0xf97e,0x91cf,0x0},{0xf97f,0x52f5,0x0},{0xf980,0x5442,0x0},
    {0xf981,0x5973,0x0},{0xf982,0x5eec,0x0},{0xf983,0x65c5,0x0},{0xf984,0x6ffe,0x0},{0xf985,0x792a,0x0},{0xf986,0x95ad,0x0},
    {0xf987,0x9a6a,0x0},{0xf988,0x9e97,0x0},{0xf989,0x9ece,0x0},{0xf98a,0x529b,0x0},{0xf98b,0x66c6,0x0},{0xf98c,0x6b77,0x0},
    {0xf98d,0x8f62,0x0},{0xf98e,0x5e74,0x0},{0xf98f,0x6190,0x0},{0xf990,0x6200,0x0},{0xf991,0x649a,0x0},{0xf992,0x6f23,0x0},
    {0xf993,0x7149,0x0},{0xf994,0x7489,0x0},{0xf995,0x79ca,0x0},{0xf996,0x7df4,0x0},{0xf997,0x806f,0x0},{0xf998,0x8f26,0x0},
    {0xf999,0x84ee,0x0},{0xf99a,0x9023,0x0},{0xf99b,0x934a,0x0},{0xf99c,0x5217,0x0},{0xf99d,0x52a3,0x0},{0xf99e,0x54bd,0x0},
    {0xf99f,0x70c8,0x0},{0xf9a0,0x88c2,0x0},{0xf9a1,0x8aaa,0x0},{0xf9a2,0x5ec9,0x0},{0xf9a3,0x5ff5,0x0},{0xf9a4,0x637b,0x0},
    {0xf9a5,0x6bae,0x0},{0xf9a6,0x7c3e,0x0},{0xf9a7,0x7375,0x0},{0xf9a8,0x4ee4,0x0},{0xf9a9,0x56f9,0x0},{0xf9aa,0x5be7,0x0},
    {0xf9ab,0x5dba,0x0},{0xf9ac,0x601c,0x0},{0xf9ad,0x73b2,0x0},{0xf9ae,0x7469,0x0},{0xf9af,0x7f9a,0x0},{0xf9b0,0x8046,0x0},
    {0xf9b1,0x9234,0x0},{0xf9b2,0x96f6,0x0},{0xf9b3,0x9748,0x0},{0xf9b4,0x9818,0x0},{0xf9b5,0x4f8b,0x0},{0xf9b6,0x79ae,0x0},
    {0xf9b7,0x91b4,0x0},{0xf9b8,0x96b8,0x0},{0xf9b9,0x60e1,0x0},{0xf9ba,0x4e86,0x0},{0xf9bb,0x50da,0x0},{0xf9bc,0x5bee,0x0},
    {0xf9bd,0x5c3f,0x0},{0xf9be,0x6599,0x0},{0xf9bf,0x6a02,0x0},{0xf9c0,0x71ce,0x0},{0xf9c1,0x7642,0x0},{0xf9c2,0x84fc,0x0},
    {0xf9c3,0x907c,0x0},{0xf9c4,0x9f8d,0x0},{0xf9c5,0x6688,0x0},{0xf9c6,0x962e,0x0},{0xf9c7,0x5289,0x0},{0xf9c8,0x677b,0x0},
    {0xf9c9,0x67f3,0x0},{0xf9ca,0x6d41,0x0},{0xf9cb,0x6e9c,0x0},{0xf9cc,0x7409,0x0},{0xf9cd,0x7559,0x0},{0xf9ce,0x786b,0x0},
    {0xf9cf,0x7d10,0x0},{0xf9d0,0x985e,0x0},{0xf9d1,0x516d,0x0},{0xf9d2,0x622e,0x0},{0xf9d3,0x9678,0x0},{0xf9d4,0x502b,0x0},
    {0xf9d5,0x5d19,0x0},{0xf9d6,0x6dea,0x0},{0xf9d7,0x8f2a,0x0},{0xf9d8,0x5f8b,0x0},{0xf9d9,0x6144,0x0},{0xf9da,0x6817,0x0},
    {0xf9db,0x7387,0x0},{0xf9dc,0x9686,0x0},{0xf9dd,0x5229,0x0},{0xf9de,0x540f,0x0},{0xf9df,0x5c65,0x0},{0xf9e0,0x6613,0x0},
    {0xf9e1,0x674e,0x0},{0xf9e2,0x68a8,0x0},{0xf9e3,0x6ce5,0x0},{0xf9e4,0x7406,0x0},{0xf9e5,0x75e2,0x0},{0xf9e6,0x7f79,0x0},
    {0xf9e7,0x88cf,0x0},{0xf9e8,0x88e1,0x0},{0xf9e9,0x91cc,0x0},{0xf9ea,0x96e2,0x0},{0xf9eb,0x533f,0x0},{0xf9ec,0x6eba,0x0},
    {0xf9ed,0x541d,0x0},{0xf9ee,0x71d0,0x0},{0xf9ef,0x7498,0x0},{0xf9f0,0x85fa,0x0},{0xf9f1,0x96a3,0x0},{0xf9f2,0x9c57,0x0},
    {0xf9f3,0x9e9f,0x0},{0xf9f4,0x6797,0x0},{0xf9f5,0x6dcb,0x0},{0xf9f6,0x81e8,0x0},{0xf9f7,0x7acb,0x0},{0xf9f8,0x7b20,0x0},
    {0xf9f9,0x7c92,0x0},{0xf9fa,0x72c0,0x0},{0xf9fb,0x7099,0x0},{0xf9fc,0x8b58,0x0},{0xf9fd,0x4ec0,0x0},{0xf9fe,0x8336,0x0},
    {0xf9ff,0x523a,0x0},{0xfa00,0x5207,0x0},{0xfa01,0x5ea6,0x0},{0xfa02,0x62d3,0x0},{0xfa03,0x7cd6,0x0},{0xfa04,0x5b85,0x0},
    {0xfa05,0x6d1e,0x0},{0xfa06,0x66b4,0x0},{0xfa07,0x8f3b,0x0},{0xfa08,0x884c,0x0},{0xfa09,0x964d,0x0},{0xfa0a,0x898b,0x0},
    {0xfa0b,0x5ed3,0x0},{0xfa0c,0x5140,0x0},{0xfa0d,0x55c0,0x0},{0xfa10,0x585a,0x0},{0xfa12,0x6674,0x0},{0xfa15,0x51de,0x0},
    {0xfa16,0x732a,0x0},{0xfa17,0x76ca,0x0},{0xfa18,0x793c,0x0},{0xfa19,0x795e,0x0},{0xfa1a,0x7965,0x0},{0xfa1b,0x798f,0x0},
    {0xfa1c,0x9756,0x0},{0xfa1d,0x7cbe,0x0},{0xfa1e,0x7fbd,0x0},{0xfa20,0x8612,0x0},{0xfa22,0x8af8,0x0},{0xfa25,0x9038,0x0},
    {0xfa26,0x90fd,0x0},{0xfa2a,0x98ef,0x0},{0xfa2b,0x98fc,0x0},{0xfa2c,0x9928,0x0},{0xfa2d,0x9db4,0x0},{0xfa2e,0x90de,0x0},
    {0xfa2f,0x96b7,0x0},{0xfa30,0x4fae,0x0},{0xfa31,0x50e7,0x0},{0xfa32,0x514d,0x0},{0xfa33,0x52c9,0x0},{0xfa34,0x52e4,0x0},
    {0xfa35,0x5351,0x0},{0xfa36,0x559d,0x0},{0xfa37,0x5606,0x0},{0xfa38,0x5668,0x0},{0xfa39,0x5840,0x0},{0xfa3a,0x58a8,0x0},
    {0xfa3b,0x5c64,0x0},{0xfa3c,0x5c6e,0x0},{0xfa3d,0x6094,0x0},{0xfa3e,0x6168,0x0},{0xfa3f,0x618e,0x0},{0xfa40,0x61f2,0x0},
    {0xfa41,0x654f,0x0},{0xfa42,0x65e2,0x0},{0xfa43,0x6691,0x0},{0xfa44,0x6885,0x0},{0xfa45,0x6d77,0x0},{0xfa46,0x6e1a,0x0},
    {0xfa47,0x6f22,0x0},{0xfa48,0x716e,0x0},{0xfa49,0x722b,0x0},{0xfa4a,0x7422,0x0},{0xfa4b,0x7891,0x0},{0xfa4c,0x793e,0x0},
    {0xfa4d,0x7949,0x0},{0xfa4e,0x7948,0x0},{0xfa4f,0x7950,0x0},{0xfa50,0x7956,0x0},{0xfa51,0x795d,0x0},{0xfa52,0x798d,0x0},
    {0xfa53,0x798e,0x0},{0xfa54,0x7a40,0x0},{0xfa55,0x7a81,0x0},{0xfa56,0x7bc0,0x0},{0xfa57,0x7df4,0x0},{0xfa58,0x7e09,0x0},
    {0xfa59,0x7e41,0x0},{0xfa5a,0x7f72,0x0},{0xfa5b,0x8005,0x0},{0xfa5c,0x81ed,0x0},{0xfa5d,0x8279,0x0},{0xfa5e,0x8279,0x0},
    {0xfa5f,0x8457,0x0},{0xfa60,0x8910,0x0},{0xfa61,0x8996,0x0},{0xfa62,0x8b01,0x0},{0xfa63,0x8b39,0x0},{0xfa64,0x8cd3,0x0},
    {0xfa65,0x8d08,0x0},{0xfa66,0x8fb6,0x0},{0xfa67,0x9038,0x0},{0xfa68,0x96e3,0x0},{0xfa69,0x97ff,0x0},{0xfa6a,0x983b,0x0},
    {0xfa6b,0x6075,0x0},{0xfa6c,0x242ee,0x0},{0xfa6d,0x8218,0x0},{0xfa70,0x4e26,0x0},{0xfa71,0x51b5,0x0},{0xfa72,0x5168,0x0},
    {0xfa73,0x4f80,0x0},{0xfa74,0x5145,0x0},{0xfa75,0x5180,0x0},{0xfa76,0x52c7,0x0},{0xfa77,0x52fa,0x0},{0xfa78,0x559d,0x0},
    {0xfa79,0x5555,0x0},{0xfa7a,0x5599,0x0},{0xfa7b,0x55e2,0x0},{0xfa7c,0x585a,0x0},{0xfa7d,0x58b3,0x0},{0xfa7e,0x5944,0x0},
    {0xfa7f,0x5954,0x0},{0xfa80,0x5a62,0x0},{0xfa81,0x5b28,0x0},{0xfa82,0x5ed2,0x0},{0xfa83,0x5ed9,0x0},{0xfa84,0x5f69,0x0},
    {0xfa85,0x5fad,0x0},{0xfa86,0x60d8,0x0},{0xfa87,0x614e,0x0},{0xfa88,0x6108,0x0},{0xfa89,0x618e,0x0},{0xfa8a,0x6160,0x0},
    {0xfa8b,0x61f2,0x0},{0xfa8c,0x6234,0x0},{0xfa8d,0x63c4,0x0},{0xfa8e,0x641c,0x0},{0xfa8f,0x6452,0x0},{0xfa90,0x6556,0x0},
    {0xfa91,0x6674,0x0},{0xfa92,0x6717,0x0},{0xfa93,0x671b,0x0},{0xfa94,0x6756,0x0},{0xfa95,0x6b79,0x0},{0xfa96,0x6bba,0x0},
    {0xfa97,0x6d41,0x0},{0xfa98,0x6edb,0x0},{0xfa99,0x6ecb,0x0},{0xfa9a,0x6f22,0x0},{0xfa9b,0x701e,0x0},{0xfa9c,0x716e,0x0},
    {0xfa9d,0x77a7,0x0},{0xfa9e,0x7235,0x0},{0xfa9f,0x72af,0x0},{0xfaa0,0x732a,0x0},{0xfaa1,0x7471,0x0},{0xfaa2,0x7506,0x0},
    {0xfaa3,0x753b,0x0},{0xfaa4,0x761d,0x0},{0xfaa5,0x761f,0x0},{0xfaa6,0x76ca,0x0},{0xfaa7,0x76db,0x0},{0xfaa8,0x76f4,0x0},
    {0xfaa9,0x774a,0x0},{0xfaaa,0x7740,0x0},{0xfaab,0x78cc,0x0},{0xfaac,0x7ab1,0x0},{0xfaad,0x7bc0,0x0},{0xfaae,0x7c7b,0x0},
    {0xfaaf,0x7d5b,0x0},{0xfab0,0x7df4,0x0},{0xfab1,0x7f3e,0x0},{0xfab2,0x8005,0x0},{0xfab3,0x8352,0x0},{0xfab4,0x83ef,0x0},
    {0xfab5,0x8779,0x0},{0xfab6,0x8941,0x0},{0xfab7,0x8986,0x0},{0xfab8,0x8996,0x0},{0xfab9,0x8abf,0x0},{0xfaba,0x8af8,0x0},
    {0xfabb,0x8acb,0x0},{0xfabc,0x8b01,0x0},{0xfabd,0x8afe,0x0},{0xfabe,0x8aed,0x0},{0xfabf,0x8b39,0x0},{0xfac0,0x8b8a,0x0},
    {0xfac1,0x8d08,0x0},{0xfac2,0x8f38,0x0},{0xfac3,0x9072,0x0},{0xfac4,0x9199,0x0},{0xfac5,0x9276,0x0},{0xfac6,0x967c,0x0},
    {0xfac7,0x96e3,0x0},{0xfac8,0x9756,0x0},{0xfac9,0x97db,0x0},{0xfaca,0x97ff,0x0},{0xfacb,0x980b,0x0},{0xfacc,0x983b,0x0},
    {0xfacd,0x9b12,0x0},{0xface,0x9f9c,0x0},{0xfacf,0x2284a,0x0},{0xfad0,0x22844,0x0},{0xfad1,0x233d5,0x0},{0xfad2,0x3b9d,0x0},
    {0xfad3,0x4018,0x0},{0xfad4,0x4039,0x0},{0xfad5,0x25249,0x0},{0xfad6,0x25cd0,0x0},{0xfad7,0x27ed3,0x0},{0xfad8,0x9f43,0x0},
    {0xfad9,0x9f8e,0x0},{0xfb1d,0x5d9,0x5b4},{0xfb1f,0x5f2,0x5b7},{0xfb2a,0x5e9,0x5c1},{0xfb2b,0x5e9,0x5c2},{0xfb2c,0xfb49,0x5c1},
    {0xfb2d,0xfb49,0x5c2},{0xfb2e,0x5d0,0x5b7},{0xfb2f,0x5d0,0x5b8},{0xfb30,0x5d0,0x5bc},{0xfb31,0x5d1,0x5bc},{0xfb32,0x5d2,0x5bc},
    {0xfb33,0x5d3,0x5bc},{0xfb34,0x5d4,0x5bc},{0xfb35,0x5d5,0x5bc},{0xfb36,0x5d6,0x5bc},{0xfb38,0x5d8,0x5bc},{0xfb39,0x5d9,0x5bc},
    {0xfb3a,0x5da,0x5bc},{0xfb3b,0x5db,0x5bc},{0xfb3c,0x5dc,0x5bc},{0xfb3e,0x5de,0x5bc},{0xfb40,0x5e0,0x5bc},{0xfb41,0x5e1,0x5bc},
    {0xfb43,0x5e3,0x5bc},{0xfb44,0x5e4,0x5bc},{0xfb46,0x5e6,0x5bc},{0xfb47,0x5e7,0x5bc},{0xfb48,0x5e8,0x5bc},{0xfb49,0x5e9,0x5bc},
    {0xfb4a,0x5ea,0x5bc},{0xfb4b,0x5d5,0x5b9},{0xfb4c,0x5d1,0x5bf},{0xfb4d,0x5db,0x5bf},{0xfb4e,0x5e4,0x5bf},{0x8001109a,0x11099,0x110ba},
    {0x8001109c,0x1109b,0x110ba},{0x800110ab,0x110a5,0x110ba},{0x8001112e,0x11131,0x11127},{0x8001112f,0x11132,0x11127},{0x8001134b,0x11347,0x1133e},{0x8001134c,0x11347,0x11357},
    {0x800114bb,0x114b9,0x114ba},{0x800114bc,0x114b9,0x114b0},{0x800114be,0x114b9,0x114bd},{0x800115ba,0x115b8,0x115af},{0x800115bb,0x115b9,0x115af},{0x1d15e,0x1d157,0x1d165},
    {0x1d15f,0x1d158,0x1d165},{0x1d160,0x1d15f,0x1d16e},{0x1d161,0x1d15f,0x1d16f},{0x1d162,0x1d15f,0x1d170},{0x1d163,0x1d15f,0x1d171},{0x1d164,0x1d15f,0x1d172},
    {0x1d1bb,0x1d1b9,0x1d165},{0x1d1bc,0x1d1ba,0x1d165},{0x1d1bd,0x1d1bb,0x1d16e},{0x1d1be,0x1d1bc,0x1d16e},{0x1d1bf,0x1d1bb,0x1d16f},{0x1d1c0,0x1d1bc,0x1d16f},
    {0x2f800,0x4e3d,0x0},{0x2f801,0x4e38,0x0},{0x2f802,0x4e41,0x0},{0x2f803,0x20122,0x0},{0x2f804,0x4f60,0x0},{0x2f805,0x4fae,0x0},
    {0x2f806,0x4fbb,0x0},{0x2f807,0x5002,0x0},{0x2f808,0x507a,0x0},{0x2f809,0x5099,0x0},{0x2f80a,0x50e7,0x0},{0x2f80b,0x50cf,0x0},
    {0x2f80c,0x349e,0x0},{0x2f80d,0x2063a,0x0},{0x2f80e,0x514d,0x0},{0x2f80f,0x5154,0x0},{0x2f810,0x5164,0x0},{0x2f811,0x5177,0x0},
    {0x2f812,0x2051c,0x0},{0x2f813,0x34b9,0x0},{0x2f814,0x5167,0x0},{0x2f815,0x518d,0x0},{0x2f816,0x2054b,0x0},{0x2f817,0x5197,0x0},
    {0x2f818,0x51a4,0x0},{0x2f819,0x4ecc,0x0},{0x2f81a,0x51ac,0x0},{0x2f81b,0x51b5,0x0},{0x2f81c,0x291df,0x0},{0x2f81d,0x51f5,0x0},
    {0x2f81e,0x5203,0x0},{0x2f81f,0x34df,0x0},{0x2f820,0x523b,0x0},{0x2f821,0x5246,0x0},{0x2f822,0x5272,0x0},{0x2f823,0x5277,0x0},
    {0x2f824,0x3515,0x0},{0x2f825,0x52c7,0x0},{0x2f826,0x52c9,0x0},{0x2f827,0x52e4,0x0},{0x2f828,0x52fa,0x0},{0x2f829,0x5305,0x0},
    {0x2f82a,0x5306,0x0},{0x2f82b,0x5317,0x0},{0x2f82c,0x5349,0x0},{0x2f82d,0x5351,0x0},{0x2f82e,0x535a,0x0},{0x2f82f,0x5373,0x0},
    {0x2f830,0x537d,0x0},{0x2f831,0x537f,0x0},{0x2f832,0x537f,0x0},{0x2f833,0x537f,0x0},{0x2f834,0x20a2c,0x0},{0x2f835,0x7070,0x0},
    {0x2f836,0x53ca,0x0},{0x2f837,0x53df,0x0},{0x2f838,0x20b63,0x0},{0x2f839,0x53eb,0x0},{0x2f83a,0x53f1,0x0},{0x2f83b,0x5406,0x0},
    {0x2f83c,0x549e,0x0},{0x2f83d,0x5438,0x0},{0x2f83e,0x5448,0x0},{0x2f83f,0x5468,0x0},{0x2f840,0x54a2,0x0},{0x2f841,0x54f6,0x0},
    {0x2f842,0x5510,0x0},{0x2f843,0x5553,0x0},{0x2f844,0x5563,0x0},{0x2f845,0x5584,0x0},{0x2f846,0x5584,0x0},{0x2f847,0x5599,0x0},
    {0x2f848,0x55ab,0x0},{0x2f849,0x55b3,0x0},{0x2f84a,0x55c2,0x0},{0x2f84b,0x5716,0x0},{0x2f84c,0x5606,0x0},{0x2f84d,0x5717,0x0},
    {0x2f84e,0x5651,0x0},{0x2f84f,0x5674,0x0},{0x2f850,0x5207,0x0},{0x2f851,0x58ee,0x0},{0x2f852,0x57ce,0x0},{0x2f853,0x57f4,0x0},
    {0x2f854,0x580d,0x0},{0x2f855,0x578b,0x0},{0x2f856,0x5832,0x0},{0x2f857,0x5831,0x0},{0x2f858,0x58ac,0x0},{0x2f859,0x214e4,0x0},
    {0x2f85a,0x58f2,0x0},{0x2f85b,0x58f7,0x0},{0x2f85c,0x5906,0x0},{0x2f85d,0x591a,0x0},{0x2f85e,0x5922,0x0},{0x2f85f,0x5962,0x0},
    {0x2f860,0x216a8,0x0},{0x2f861,0x216ea,0x0},{0x2f862,0x59ec,0x0},{0x2f863,0x5a1b,0x0},{0x2f864,0x5a27,0x0},{0x2f865,0x59d8,0x0},
    {0x2f866,0x5a66,0x0},{0x2f867,0x36ee,0x0},{0x2f868,0x36fc,0x0},{0x2f869,0x5b08,0x0},{0x2f86a,0x5b3e,0x0},{0x2f86b,0x5b3e,0x0},
    {0x2f86c,0x219c8,0x0},{0x2f86d,0x5bc3,0x0},{0x2f86e,0x5bd8,0x0},{0x2f86f,0x5be7,0x0},{0x2f870,0x5bf3,0x0},{0x2f871,0x21b18,0x0},
    {0x2f872,0x5bff,0x0},{0x2f873,0x5c06,0x0},{0x2f874,0x5f53,0x0},{0x2f875,0x5c22,0x0},{0x2f876,0x3781,0x0},{0x2f877,0x5c60,0x0},
    {0x2f878,0x5c6e,0x0},{0x2f879,0x5cc0,0x0},{0x2f87a,0x5c8d,0x0},{0x2f87b,0x21de4,0x0},{0x2f87c,0x5d43,0x0},{0x2f87d,0x21de6,0x0},
    {0x2f87e,0x5d6e,0x0},{0x2f87f,0x5d6b,0x0},{0x2f880,0x5d7c,0x0},{0x2f881,0x5de1,0x0},{0x2f882,0x5de2,0x0},{0x2f883,0x382f,0x0},
    {0x2f884,0x5dfd,0x0},{0x2f885,0x5e28,0x0},{0x2f886,0x5e3d,0x0},{0x2f887,0x5e69,0x0},{0x2f888,0x3862,0x0},{0x2f889,0x22183,0x0},
    {0x2f88a,0x387c,0x0},{0x2f88b,0x5eb0,0x0},{0x2f88c,0x5eb3,0x0},{0x2f88d,0x5eb6,0x0},{0x2f88e,0x5eca,0x0},{0x2f88f,0x2a392,0x0},
    {0x2f890,0x5efe,0x0},{0x2f891,0x22331,0x0},{0x2f892,0x22331,0x0},{0x2f893,0x8201,0x0},{0x2f894,0x5f22,0x0},{0x2f895,0x5f22,0x0},
    {0x2f896,0x38c7,0x0},{0x2f897,0x232b8,0x0},{0x2f898,0x261da,0x0},{0x2f899,0x5f62,0x0},{0x2f89a,0x5f6b,0x0},{0x2f89b,0x38e3,0x0},
    {0x2f89c,0x5f9a,0x0},{0x2f89d,0x5fcd,0x0},{0x2f89e,0x5fd7,0x0},{0x2f89f,0x5ff9,0x0},{0x2f8a0,0x6081,0x0},{0x2f8a1,0x393a,0x0},
    {0x2f8a2,0x391c,0x0},{0x2f8a3,0x6094,0x0},{0x2f8a4,0x226d4,0x0},{0x2f8a5,0x60c7,0x0},{0x2f8a6,0x6148,0x0},{0x2f8a7,0x614c,0x0},
    {0x2f8a8,0x614e,0x0},{0x2f8a9,0x614c,0x0},{0x2f8aa,0x617a,0x0},{0x2f8ab,0x618e,0x0},{0x2f8ac,0x61b2,0x0},{0x2f8ad,0x61a4,0x0},
    {0x2f8ae,0x61af,0x0},{0x2f8af,0x61de,0x0},{0x2f8b0,0x61f2,0x0},{0x2f8b1,0x61f6,0x0},{0x2f8b2,0x6210,0x0},{0x2f8b3,0x621b,0x0},
    {0x2f8b4,0x625d,0x0},{0x2f8b5,0x62b1,0x0},{0x2f8b6,0x62d4,0x0},{0x2f8b7,0x6350,0x0},{0x2f8b8,0x22b0c,0x0},{0x2f8b9,0x633d,0x0},
    {0x2f8ba,0x62fc,0x0},{0x2f8bb,0x6368,0x0},{0x2f8bc,0x6383,0x0},{0x2f8bd,0x63e4,0x0},{0x2f8be,0x22bf1,0x0},{0x2f8bf,0x6422,0x0},
    {0x2f8c0,0x63c5,0x0},{0x2f8c1,0x63a9,0x0},{0x2f8c2,0x3a2e,0x0},{0x2f8c3,0x6469,0x0},{0x2f8c4,0x647e,0x0},{0x2f8c5,0x649d,0x0},
    {0x2f8c6,0x6477,0x0},{0x2f8c7,0x3a6c,0x0},{0x2f8c8,0x654f,0x0},{0x2f8c9,0x656c,0x0},{0x2f8ca,0x2300a,0x0},{0x2f8cb,0x65e3,0x0},
    {0x2f8cc,0x66f8,0x0},{0x2f8cd,0x6649,0x0},{0x2f8ce,0x3b19,0x0},{0x2f8cf,0x6691,0x0},{0x2f8d0,0x3b08,0x0},{0x2f8d1,0x3ae4,0x0},
    {0x2f8d2,0x5192,0x0},{0x2f8d3,0x5195,0x0},{0x2f8d4,0x6700,0x0},{0x2f8d5,0x669c,0x0},{0x2f8d6,0x80ad,0x0},{0x2f8d7,0x43d9,0x0},
    {0x2f8d8,0x6717,0x0},{0x2f8d9,0x671b,0x0},{0x2f8da,0x6721,0x0},{0x2f8db,0x675e,0x0},{0x2f8dc,0x6753,0x0},{0x2f8dd,0x233c3,0x0},
    {0x2f8de,0x3b49,0x0},{0x2f8df,0x67fa,0x0},{0x2f8e0,0x6785,0x0},{0x2f8e1,0x6852,0x0},{0x2f8e2,0x6885,0x0},{0x2f8e3,0x2346d,0x0},
    {0x2f8e4,0x688e,0x0},{0x2f8e5,0x681f,0x0},{0x2f8e6,0x6914,0x0},{0x2f8e7,0x3b9d,0x0},{0x2f8e8,0x6942,0x0},{0x2f8e9,0x69a3,0x0},
    {0x2f8ea,0x69ea,0x0},{0x2f8eb,0x6aa8,0x0},{0x2f8ec,0x236a3,0x0},{0x2f8ed,0x6adb,0x0},{0x2f8ee,0x3c18,0x0},{0x2f8ef,0x6b21,0x0},
    {0x2f8f0,0x238a7,0x0},{0x2f8f1,0x6b54,0x0},{0x2f8f2,0x3c4e,0x0},{0x2f8f3,0x6b72,0x0},{0x2f8f4,0x6b9f,0x0},{0x2f8f5,0x6bba,0x0},
    {0x2f8f6,0x6bbb,0x0},{0x2f8f7,0x23a8d,0x0},{0x2f8f8,0x21d0b,0x0},{0x2f8f9,0x23afa,0x0},{0x2f8fa,0x6c4e,0x0},{0x2f8fb,0x23cbc,0x0},
    {0x2f8fc,0x6cbf,0x0},{0x2f8fd,0x6ccd,0x0},{0x2f8fe,0x6c67,0x0},{0x2f8ff,0x6d16,0x0},{0x2f900,0x6d3e,0x0},{0x2f901,0x6d77,0x0},
    {0x2f902,0x6d41,0x0},{0x2f903,0x6d69,0x0},{0x2f904,0x6d78,0x0},{0x2f905,0x6d85,0x0},{0x2f906,0x23d1e,0x0},{0x2f907,0x6d34,0x0},
    {0x2f908,0x6e2f,0x0},{0x2f909,0x6e6e,0x0},{0x2f90a,0x3d33,0x0},{0x2f90b,0x6ecb,0x0},{0x2f90c,0x6ec7,0x0},{0x2f90d,0x23ed1,0x0},
    {0x2f90e,0x6df9,0x0},{0x2f90f,0x6f6e,0x0},{0x2f910,0x23f5e,0x0},{0x2f911,0x23f8e,0x0},{0x2f912,0x6fc6,0x0},{0x2f913,0x7039,0x0},
    {0x2f914,0x701e,0x0},{0x2f915,0x701b,0x0},{0x2f916,0x3d96,0x0},{0x2f917,0x704a,0x0},{0x2f918,0x707d,0x0},{0x2f919,0x7077,0x0},
    {0x2f91a,0x70ad,0x0},{0x2f91b,0x20525,0x0},{0x2f91c,0x7145,0x0},{0x2f91d,0x24263,0x0},{0x2f91e,0x719c,0x0},{0x2f91f,0x243ab,0x0},
    {0x2f920,0x7228,0x0},{0x2f921,0x7235,0x0},{0x2f922,0x7250,0x0},{0x2f923,0x24608,0x0},{0x2f924,0x7280,0x0},{0x2f925,0x7295,0x0},
    {0x2f926,0x24735,0x0},{0x2f927,0x24814,0x0},{0x2f928,0x737a,0x0},{0x2f929,0x738b,0x0},{0x2f92a,0x3eac,0x0},{0x2f92b,0x73a5,0x0},
    {0x2f92c,0x3eb8,0x0},{0x2f92d,0x3eb8,0x0},{0x2f92e,0x7447,0x0},{0x2f92f,0x745c,0x0},{0x2f930,0x7471,0x0},{0x2f931,0x7485,0x0},
    {0x2f932,0x74ca,0x0},{0x2f933,0x3f1b,0x0},{0x2f934,0x7524,0x0},{0x2f935,0x24c36,0x0},{0x2f936,0x753e,0x0},{0x2f937,0x24c92,0x0},
    {0x2f938,0x7570,0x0},{0x2f939,0x2219f,0x0},{0x2f93a,0x7610,0x0},{0x2f93b,0x24fa1,0x0},{0x2f93c,0x24fb8,0x0},{0x2f93d,0x25044,0x0},
    {0x2f93e,0x3ffc,0x0},{0x2f93f,0x4008,0x0},{0x2f940,0x76f4,0x0},{0x2f941,0x250f3,0x0},{0x2f942,0x250f2,0x0},{0x2f943,0x25119,0x0},
    {0x2f944,0x25133,0x0},{0x2f945,0x771e,0x0},{0x2f946,0x771f,0x0},{0x2f947,0x771f,0x0},{0x2f948,0x774a,0x0},{0x2f949,0x4039,0x0},
    {0x2f94a,0x778b,0x0},{0x2f94b,0x4046,0x0},{0x2f94c,0x4096,0x0},{0x2f94d,0x2541d,0x0},{0x2f94e,0x784e,0x0},{0x2f94f,0x788c,0x0},
    {0x2f950,0x78cc,0x0},{0x2f951,0x40e3,0x0},{0x2f952,0x25626,0x0},{0x2f953,0x7956,0x0},{0x2f954,0x2569a,0x0},{0x2f955,0x256c5,0x0},
    {0x2f956,0x798f,0x0},{0x2f957,0x79eb,0x0},{0x2f958,0x412f,0x0},{0x2f959,0x7a40,0x0},{0x2f95a,0x7a4a,0x0},{0x2f95b,0x7a4f,0x0},
    {0x2f95c,0x2597c,0x0},{0x2f95d,0x25aa7,0x0},{0x2f95e,0x25aa7,0x0},{0x2f95f,0x7aee,0x0},{0x2f960,0x4202,0x0},{0x2f961,0x25bab,0x0},
    {0x2f962,0x7bc6,0x0},{0x2f963,0x7bc9,0x0},{0x2f964,0x4227,0x0},{0x2f965,0x25c80,0x0},{0x2f966,0x7cd2,0x0},{0x2f967,0x42a0,0x0},
    {0x2f968,0x7ce8,0x0},{0x2f969,0x7ce3,0x0},{0x2f96a,0x7d00,0x0},{0x2f96b,0x25f86,0x0},{0x2f96c,0x7d63,0x0},{0x2f96d,0x4301,0x0},
    {0x2f96e,0x7dc7,0x0},{0x2f96f,0x7e02,0x0},{0x2f970,0x7e45,0x0},{0x2f971,0x4334,0x0},{0x2f972,0x26228,0x0},{0x2f973,0x26247,0x0},
    {0x2f974,0x4359,0x0},{0x2f975,0x262d9,0x0},{0x2f976,0x7f7a,0x0},{0x2f977,0x2633e,0x0},{0x2f978,0x7f95,0x0},{0x2f979,0x7ffa,0x0},
    {0x2f97a,0x8005,0x0},{0x2f97b,0x264da,0x0},{0x2f97c,0x26523,0x0},{0x2f97d,0x8060,0x0},{0x2f97e,0x265a8,0x0},{0x2f97f,0x8070,0x0},
    {0x2f980,0x2335f,0x0},{0x2f981,0x43d5,0x0},{0x2f982,0x80b2,0x0},{0x2f983,0x8103,0x0},{0x2f984,0x440b,0x0},{0x2f985,0x813e,0x0},
    {0x2f986,0x5ab5,0x0},{0x2f987,0x267a7,0x0},{0x2f988,0x267b5,0x0},{0x2f989,0x23393,0x0},{0x2f98a,0x2339c,0x0},{0x2f98b,0x8201,0x0},
    {0x2f98c,0x8204,0x0},{0x2f98d,0x8f9e,0x0},{0x2f98e,0x446b,0x0},{0x2f98f,0x8291,0x0},{0x2f990,0x828b,0x0},{0x2f991,0x829d,0x0},
    {0x2f992,0x52b3,0x0},{0x2f993,0x82b1,0x0},{0x2f994,0x82b3,0x0},{0x2f995,0x82bd,0x0},{0x2f996,0x82e6,0x0},{0x2f997,0x26b3c,0x0},
    {0x2f998,0x82e5,0x0},{0x2f999,0x831d,0x0},{0x2f99a,0x8363,0x0},{0x2f99b,0x83ad,0x0},{0x2f99c,0x8323,0x0},{0x2f99d,0x83bd,0x0},
    {0x2f99e,0x83e7,0x0},{0x2f99f,0x8457,0x0},{0x2f9a0,0x8353,0x0},{0x2f9a1,0x83ca,0x0},{0x2f9a2,0x83cc,0x0},{0x2f9a3,0x83dc,0x0},
    {0x2f9a4,0x26c36,0x0},{0x2f9a5,0x26d6b,0x0},{0x2f9a6,0x26cd5,0x0},{0x2f9a7,0x452b,0x0},{0x2f9a8,0x84f1,0x0},{0x2f9a9,0x84f3,0x0},
    {0x2f9aa,0x8516,0x0},{0x2f9ab,0x273ca,0x0},{0x2f9ac,0x8564,0x0},{0x2f9ad,0x26f2c,0x0},{0x2f9ae,0x455d,0x0},{0x2f9af,0x4561,0x0},
    {0x2f9b0,0x26fb1,0x0},{0x2f9b1,0x270d2,0x0},{0x2f9b2,0x456b,0x0},{0x2f9b3,0x8650,0x0},{0x2f9b4,0x865c,0x0},{0x2f9b5,0x8667,0x0},
    {0x2f9b6,0x8669,0x0},{0x2f9b7,0x86a9,0x0},{0x2f9b8,0x8688,0x0},{0x2f9b9,0x870e,0x0},{0x2f9ba,0x86e2,0x0},{0x2f9bb,0x8779,0x0},
    {0x2f9bc,0x8728,0x0},{0x2f9bd,0x876b,0x0},{0x2f9be,0x8786,0x0},{0x2f9bf,0x45d7,0x0},{0x2f9c0,0x87e1,0x0},{0x2f9c1,0x8801,0x0},
    {0x2f9c2,0x45f9,0x0},{0x2f9c3,0x8860,0x0},{0x2f9c4,0x8863,0x0},{0x2f9c5,0x27667,0x0},{0x2f9c6,0x88d7,0x0},{0x2f9c7,0x88de,0x0},
    {0x2f9c8,0x4635,0x0},{0x2f9c9,0x88fa,0x0},{0x2f9ca,0x34bb,0x0},{0x2f9cb,0x278ae,0x0},{0x2f9cc,0x27966,0x0},{0x2f9cd,0x46be,0x0},
    {0x2f9ce,0x46c7,0x0},{0x2f9cf,0x8aa0,0x0},{0x2f9d0,0x8aed,0x0},{0x2f9d1,0x8b8a,0x0},{0x2f9d2,0x8c55,0x0},{0x2f9d3,0x27ca8,0x0},
    {0x2f9d4,0x8cab,0x0},{0x2f9d5,0x8cc1,0x0},{0x2f9d6,0x8d1b,0x0},{0x2f9d7,0x8d77,0x0},{0x2f9d8,0x27f2f,0x0},{0x2f9d9,0x20804,0x0},
    {0x2f9da,0x8dcb,0x0},{0x2f9db,0x8dbc,0x0},{0x2f9dc,0x8df0,0x0},{0x2f9dd,0x208de,0x0},{0x2f9de,0x8ed4,0x0},{0x2f9df,0x8f38,0x0},
    {0x2f9e0,0x285d2,0x0},{0x2f9e1,0x285ed,0x0},{0x2f9e2,0x9094,0x0},{0x2f9e3,0x90f1,0x0},{0x2f9e4,0x9111,0x0},{0x2f9e5,0x2872e,0x0},
    {0x2f9e6,0x911b,0x0},{0x2f9e7,0x9238,0x0},{0x2f9e8,0x92d7,0x0},{0x2f9e9,0x92d8,0x0},{0x2f9ea,0x927c,0x0},{0x2f9eb,0x93f9,0x0},
    {0x2f9ec,0x9415,0x0},{0x2f9ed,0x28bfa,0x0},{0x2f9ee,0x958b,0x0},{0x2f9ef,0x4995,0x0},{0x2f9f0,0x95b7,0x0},{0x2f9f1,0x28d77,0x0},
    {0x2f9f2,0x49e6,0x0},{0x2f9f3,0x96c3,0x0},{0x2f9f4,0x5db2,0x0},{0x2f9f5,0x9723,0x0},{0x2f9f6,0x29145,0x0},{0x2f9f7,0x2921a,0x0},
    {0x2f9f8,0x4a6e,0x0},{0x2f9f9,0x4a76,0x0},{0x2f9fa,0x97e0,0x0},{0x2f9fb,0x2940a,0x0},{0x2f9fc,0x4ab2,0x0},{0x2f9fd,0x29496,0x0},
    {0x2f9fe,0x980b,0x0},{0x2f9ff,0x980b,0x0},{0x2fa00,0x9829,0x0},{0x2fa01,0x295b6,0x0},{0x2fa02,0x98e2,0x0},{0x2fa03,0x4b33,0x0},
    {0x2fa04,0x9929,0x0},{0x2fa05,0x99a7,0x0},{0x2fa06,0x99c2,0x0},{0x2fa07,0x99fe,0x0},{0x2fa08,0x4bce,0x0},{0x2fa09,0x29b30,0x0},
    {0x2fa0a,0x9b12,0x0},{0x2fa0b,0x9c40,0x0},{0x2fa0c,0x9cfd,0x0},{0x2fa0d,0x4cce,0x0},{0x2fa0e,0x4ced,0x0},{0x2fa0f,0x9d67,0x0},
    {0x2fa10,0x2a0ce,0x0},{0x2fa11,0x4cf8,0x0},{0x2fa12,0x2a105,0x0},{0x2fa13,0x2a20e,0x0},{0x2fa14,0x2a291,0x0},{0x2fa15,0x9ebb,0x0},
    {0x2fa16,0x4d56,0x0},{0x2fa17,0x9ef9,0x0},{0x2fa18,0x9efe,0x0},{0x2fa19,0x9f05,0x0},{0x2fa1a,0x9f0f,0x0},{0x2fa1b,0x9f16,0x0},
    {0x2fa1c,0x9f3b,0x0},{0x2fa1d,0x2a600,0x0},
};
#define QSA__UNI_DEC_N 2060

/* indices into qsa__uni_dec of the primary composites, sorted by (first, second) */
static const uint16_t qsa__uni_comp[] = {
    912,909,913,0,1,2,3,53,55,238,4,572,5,165,208,210,
    570,415,57,417,419,421,59,61,63,65,6,425,67,427,431,433,
    429,7,8,9,598,69,71,73,10,596,77,212,214,594,240,75,
    439,441,445,198,79,447,81,83,187,85,87,449,453,236,451,455,
    457,11,12,13,89,91,93,97,14,610,167,216,218,612,95,459,
    98,463,189,465,100,467,102,106,469,104,475,473,477,479,481,200,
    108,15,483,112,485,110,489,487,16,17,18,19,114,116,246,20,
    616,118,169,220,222,161,614,191,499,501,120,503,124,224,226,505,
    122,509,126,128,511,132,513,232,130,521,136,523,234,134,527,525,
    21,22,23,138,140,142,24,640,144,146,171,228,230,163,638,529,
    148,533,531,539,541,543,545,150,549,547,551,553,555,652,25,152,
    658,250,557,154,656,654,155,559,157,159,561,563,26,27,28,29,
    54,56,239,30,573,31,166,209,211,571,416,58,418,420,422,60,
    62,64,66,32,426,68,428,432,434,430,33,34,35,599,70,72,
    74,36,597,78,213,215,595,241,76,440,442,446,199,80,448,82,
    84,188,86,88,450,454,237,452,456,458,565,37,38,39,90,92,
    94,40,611,168,217,219,613,96,460,99,197,464,190,466,101,468,
    103,107,470,105,476,474,478,480,482,201,109,41,484,113,486,111,
    490,488,42,43,44,45,115,117,247,46,617,119,170,221,223,162,
    615,192,500,502,121,504,125,225,227,506,123,510,127,129,512,133,
    514,233,131,522,566,137,524,235,135,528,526,47,48,49,139,141,
    143,50,641,145,147,172,229,231,164,639,530,149,534,532,540,542,
    544,546,151,550,548,567,552,554,556,653,51,153,659,251,558,52,
    657,568,655,156,560,158,160,562,564,875,258,835,576,574,580,578,
    181,202,204,185,423,602,600,606,604,461,620,618,624,622,491,244,
    493,242,206,179,175,173,177,577,575,581,579,182,203,205,186,424,
    603,601,607,605,462,621,619,625,623,492,245,494,243,207,180,176,
    174,178,586,584,590,588,587,585,591,589,435,437,436,438,495,497,
    496,498,515,516,517,518,535,536,537,538,569,630,628,634,632,636,
    631,629,635,633,637,644,642,648,646,650,645,643,649,647,651,195,
    193,194,183,184,443,444,248,249,196,831,259,830,829,668,669,833,
    841,261,682,683,843,262,696,697,845,857,263,856,855,268,712,713,
    883,264,726,727,874,872,265,871,870,269,740,885,266,752,753,887,
    826,838,760,270,823,822,660,661,827,825,762,271,676,677,764,272,
    688,689,839,837,766,273,850,849,275,704,705,853,768,277,720,721,
    866,867,770,278,863,862,276,732,733,868,772,279,744,745,881,879,
    851,267,854,864,274,869,880,280,281,285,302,304,284,282,306,283,
    300,310,312,287,314,289,316,286,318,324,288,326,328,330,332,322,
    303,305,293,291,307,292,301,311,313,296,315,290,317,295,319,325,
    297,327,329,331,333,323,294,298,299,308,309,320,321,334,335,337,
    336,338,340,341,339,342,343,344,353,354,365,364,366,369,370,372,
    371,373,374,377,375,376,378,379,381,380,382,383,385,384,403,404,
    405,406,407,408,409,410,411,412,413,414,471,472,507,508,519,520,
    582,592,583,593,608,609,626,627,662,664,666,774,663,665,667,775,
    776,777,778,779,780,781,670,672,674,782,671,673,675,783,784,785,
    786,787,788,789,678,680,679,681,684,686,685,687,690,692,694,790,
    691,693,695,791,792,793,794,795,796,797,698,700,702,798,699,701,
    703,799,800,801,802,803,804,805,706,708,710,707,709,711,714,716,
    718,715,717,719,722,724,723,725,728,730,729,731,734,736,738,735,
    737,739,741,742,743,746,748,750,806,747,749,751,807,808,809,810,
    811,812,813,754,756,758,814,755,757,759,815,816,817,818,819,820,
    821,824,836,878,828,846,847,848,840,882,859,860,861,894,895,896,
    897,899,898,900,901,902,903,904,905,906,907,908,911,910,914,915,
    916,917,918,919,920,921,930,931,922,923,924,925,932,933,926,927,
    928,929,934,935,936,937,966,941,942,943,944,945,946,947,948,949,
    950,951,952,953,954,955,956,957,958,959,960,961,962,963,964,965,
    967,993,968,969,970,971,972,973,974,975,976,977,978,979,980,981,
    982,983,984,985,986,987,988,989,990,991,992,994,995,996,997,998,
    1493,1494,1495,1496,1497,1498,1499,1501,1500,1502,1503,1504,
};
#define QSA__UNI_COMP_N 940

/* value (top 8 bits of the first word) of the range {lo | value << 24, hi} holding c, or 0:
   binary search over a sorted range table */
QSA_PRIV unsigned qsa__uni_range_value(const uint32_t (*t)[2], size_t n, uint32_t c) {
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if ((t[mid][0] & 0xffffffu) > c) hi = mid;
        else if (t[mid][1] < c) lo = mid + 1;
        else return t[mid][0] >> 24;
    }
    return 0;
}

/* class flags of a code point */
QSA_PRIV unsigned qsa__uni_class(uint32_t c) { return qsa__uni_range_value(qsa__uni_cls, QSA__UNI_CLS_N, c); }

/* canonical combining class (Unicode 9.0 data, like the tokenizers library's NFC) */
QSA_PRIV unsigned qsa__uni_ccc_of(uint32_t c) {
    return c < 0x300 ? 0 : qsa__uni_range_value(qsa__uni_ccc, QSA__UNI_CCC_N, c);
}

/* index of c in qsa__uni_dec or -1 */
QSA_PRIV int qsa__uni_dec_find(uint32_t c) {
    size_t lo = 0, hi = QSA__UNI_DEC_N;
    if (c < 0xc0) return -1;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        uint32_t m = qsa__uni_dec[mid][0] & 0x7fffffffu;
        if (m > c) hi = mid;
        else if (m < c) lo = mid + 1;
        else return (int)mid;
    }
    return -1;
}

/* primary composite of (a, b) from the table (Hangul is handled by the caller), or 0 */
QSA_PRIV uint32_t qsa__uni_compose(uint32_t a, uint32_t b) {
    size_t lo = 0, hi = QSA__UNI_COMP_N;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        const uint32_t *e = qsa__uni_dec[qsa__uni_comp[mid]];
        if (e[1] > a || (e[1] == a && e[2] > b)) hi = mid;
        else if (e[1] < a || e[2] < b) lo = mid + 1;
        else return e[0] & 0x7fffffffu;
    }
    return 0;
}
/* >>unicode-generated-end */

/* ============================================================================================== */
/* >>tokenizer  byte-level BPE (tokenizer.json), added tokens, NFC, Qwen split regex, ChatML       */
/* ============================================================================================== */
/* Conformance target: the Hugging Face `tokenizers` library (Rust), encode(add_special_tokens=False)
   and decode().  The pipeline, in its order:
     1. added tokens with normalized=false are cut out of the raw text (leftmost-longest match,
        lstrip/rstrip/single_word honoured); special ones only when parse_special;
     2. each remaining segment is NFC-normalised (tables of Unicode 9.0, like the library's
        unicode-normalization-alignments crate), then added tokens with normalized=true are cut out;
     3. the Split pre-tokenizer runs the Qwen regex (hand-written matcher below, Oniguruma semantics,
        Unicode 16.0 classes like the library's Oniguruma), ByteLevel maps bytes to symbols;
     4. each piece is merged by BPE exactly like the library's Word::merge_all (min-heap on
        (rank, position), stale entries skipped). */

/* ---- UTF-8 (qsa__u8_next, qsa__u8_put: with the JSON parser) --------------------------------- */

/* QSA_OK when s is well-formed UTF-8, else QSA_ERR_INVALID_ARGUMENT naming the byte offset. */
QSA_PRIV qsa_result qsa__u8_validate(const char *s, size_t n, const char *what) {
    const uint8_t *u = (const uint8_t *)s;
    size_t i = 0;
    while (i < n) {
        if (u[i] < 0x80) { i++; continue; }
        uint32_t cp = 0;
        int sub = 0, k = qsa__u8_next(u + i, n - i, &cp, &sub);
        if (k > 0) { i += (size_t)k; continue; }
        if (k < 0)
            return qsa__fail(QSA_ERR_INVALID_ARGUMENT, "%s: invalid UTF-8: truncated %d-byte sequence at byte offset %zu "
                             "(lead byte 0x%02x, text ends after %d bytes of it)", what,
                             u[i] >= 0xf0 ? 4 : u[i] >= 0xe0 ? 3 : 2, i, u[i], -k);
        {
            int lead_ok = u[i] >= 0xc2 && u[i] <= 0xf4;
            size_t at = lead_ok ? i + (size_t)sub : i;
            if (lead_ok)
                return qsa__fail(QSA_ERR_INVALID_ARGUMENT, "%s: invalid UTF-8 at byte offset %zu (byte 0x%02x does not "
                                 "continue the sequence that starts at offset %zu with 0x%02x)", what, at, u[at], i, u[i]);
            return qsa__fail(QSA_ERR_INVALID_ARGUMENT, "%s: invalid UTF-8 at byte offset %zu (byte 0x%02x cannot start a "
                             "character)", what, at, u[at]);
        }
    }
    return QSA_OK;
}

/* Append s[0..n) to out (which has room for 3n + 1 bytes) with every ill-formed subsequence
   replaced by U+FFFD (maximal subparts, like Rust's from_utf8_lossy and Python's errors="replace").
   When !final a truncated sequence at the very end is left alone: returns its length. */
QSA_PRIV size_t qsa__u8_lossy(char *out, size_t *olen, const uint8_t *s, size_t n, int final) {
    size_t i = 0, o = *olen;
    while (i < n) {
        if (s[i] < 0x80) { out[o++] = (char)s[i++]; continue; }
        uint32_t cp = 0;
        int sub = 0, k = qsa__u8_next(s + i, n - i, &cp, &sub);
        if (k > 0) {
            memcpy(out + o, s + i, (size_t)k);
            o += (size_t)k;
            i += (size_t)k;
            continue;
        }
        if (k < 0 && !final) break;
        out[o++] = (char)0xef; out[o++] = (char)0xbf; out[o++] = (char)0xbd;
        i += (size_t)sub;
    }
    *olen = o;
    return n - i;
}

/* ---- growable arrays ---------------------------------------------------------------------- */

typedef struct qsa__vec { void *p; size_t n, cap, elt; } qsa__vec;
QSA_PRIV int qsa__vec_reserve(qsa__vec *v, size_t want) {
    if (want <= v->cap) return 1;
    size_t cap = v->cap ? v->cap : 16;
    while (cap < want) cap *= 2;
    if (cap > SIZE_MAX / v->elt) return 0;
    void *p = qsa__realloc(v->p, cap * v->elt);
    if (!p) return 0;
    v->p = p;
    v->cap = cap;
    return 1;
}
#define QSA__VEC(T) { NULL, 0, 0, sizeof(T) }
#define QSA__VEC_AT(v, T) ((T *)(v).p)
QSA_PRIV int qsa__vec_push32(qsa__vec *v, uint32_t x) {
    if (!qsa__vec_reserve(v, v->n + 1)) return 0;
    ((uint32_t *)v->p)[v->n++] = x;
    return 1;
}
QSA_PRIV void qsa__vec_free(qsa__vec *v) { qsa__free(v->p); v->p = NULL; v->n = v->cap = 0; }

/* ---- NFC -------------------------------------------------------------------------------- */

#define QSA__HANGUL_SBASE 0xAC00u
#define QSA__HANGUL_LBASE 0x1100u
#define QSA__HANGUL_VBASE 0x1161u
#define QSA__HANGUL_TBASE 0x11A7u
#define QSA__HANGUL_LCOUNT 19u
#define QSA__HANGUL_VCOUNT 21u
#define QSA__HANGUL_TCOUNT 28u
#define QSA__HANGUL_NCOUNT (QSA__HANGUL_VCOUNT * QSA__HANGUL_TCOUNT)
#define QSA__HANGUL_SCOUNT (QSA__HANGUL_LCOUNT * QSA__HANGUL_NCOUNT)

/* full canonical decomposition of c appended to v (table depth is at most 4) */
QSA_PRIV int qsa__nfc_decompose(uint32_t c, qsa__vec *v, int depth) {
    if (c - QSA__HANGUL_SBASE < QSA__HANGUL_SCOUNT) {
        uint32_t s = c - QSA__HANGUL_SBASE, t = s % QSA__HANGUL_TCOUNT;
        if (!qsa__vec_push32(v, QSA__HANGUL_LBASE + s / QSA__HANGUL_NCOUNT)) return 0;
        if (!qsa__vec_push32(v, QSA__HANGUL_VBASE + (s % QSA__HANGUL_NCOUNT) / QSA__HANGUL_TCOUNT)) return 0;
        return t ? qsa__vec_push32(v, QSA__HANGUL_TBASE + t) : 1;
    }
    int k = depth < 8 ? qsa__uni_dec_find(c) : -1;
    if (k < 0) return qsa__vec_push32(v, c);
    if (!qsa__nfc_decompose(qsa__uni_dec[k][1], v, depth + 1)) return 0;
    return qsa__uni_dec[k][2] ? qsa__nfc_decompose(qsa__uni_dec[k][2], v, depth + 1) : 1;
}

QSA_PRIV uint32_t qsa__nfc_pair(uint32_t a, uint32_t b) {
    if (a - QSA__HANGUL_LBASE < QSA__HANGUL_LCOUNT && b - QSA__HANGUL_VBASE < QSA__HANGUL_VCOUNT)
        return QSA__HANGUL_SBASE + ((a - QSA__HANGUL_LBASE) * QSA__HANGUL_VCOUNT + (b - QSA__HANGUL_VBASE)) * QSA__HANGUL_TCOUNT;
    if (a - QSA__HANGUL_SBASE < QSA__HANGUL_SCOUNT && (a - QSA__HANGUL_SBASE) % QSA__HANGUL_TCOUNT == 0 &&
        b - QSA__HANGUL_TBASE - 1 < QSA__HANGUL_TCOUNT - 1)
        return a + (b - QSA__HANGUL_TBASE);
    return qsa__uni_compose(a, b);
}

/* 1 when NFC cannot change s: every code point is below U+0300 (no combining marks, no
   composition exclusions, no singletons there) */
QSA_PRIV int qsa__nfc_trivial(const char *s, size_t n) {
    for (size_t i = 0; i < n; i++)
        if ((uint8_t)s[i] >= 0xcc) return 0;
    return 1;
}

/* Sorts the n non-starters of x stably by combining class: insertion for short runs (a letter's few
   marks), a counting sort over the 255 classes for long ones, where insertion is quadratic (a run of
   alternating classes, 80 KB of U+0301 U+0323: 1.6 s).  0 when out of memory. */
QSA_PRIV int qsa__nfc_order(uint32_t *x, size_t n) {
    if (n <= 32) {
        for (size_t i = 1; i < n; i++) {
            uint32_t v = x[i];
            unsigned k = qsa__uni_ccc_of(v);
            size_t j = i;
            for (; j > 0 && qsa__uni_ccc_of(x[j - 1]) > k; j--) x[j] = x[j - 1];
            x[j] = v;
        }
        return 1;
    }
    size_t at[257] = {0};
    uint32_t *t = QSA__ALLOC(uint32_t, n);
    if (!t) return 0;
    for (size_t i = 0; i < n; i++) at[qsa__uni_ccc_of(x[i]) + 1]++;
    for (int k = 1; k < 257; k++) at[k] += at[k - 1];
    for (size_t i = 0; i < n; i++) t[at[qsa__uni_ccc_of(x[i])]++] = x[i];
    memcpy(x, t, n * sizeof *x);
    qsa__free(t);
    return 1;
}

/* NFC of the well-formed UTF-8 s[0..n), appended to out. */
QSA_PRIV int qsa__nfc(const char *s, size_t n, qsa__buf *out) {
    qsa__vec d = QSA__VEC(uint32_t);
    int ok = 1;
    const uint8_t *u = (const uint8_t *)s;
    for (size_t i = 0; i < n && ok;) {
        uint32_t cp = 0;
        int sub = 0, k = qsa__u8_next(u + i, n - i, &cp, &sub);
        if (k <= 0) { cp = 0xfffd; k = sub > 0 ? sub : 1; } /* callers validate first */
        ok = qsa__nfc_decompose(cp, &d, 0);
        i += (size_t)k;
    }
    uint32_t *c = QSA__VEC_AT(d, uint32_t);
    size_t m = d.n;
    /* canonical ordering: every run of non-starters sorted stably by class */
    for (size_t i = 0; ok && i < m;) {
        if (!qsa__uni_ccc_of(c[i])) { i++; continue; }
        size_t e = i + 1;
        while (e < m && qsa__uni_ccc_of(c[e])) e++;
        ok = qsa__nfc_order(c + i, e - i);
        i = e;
    }
    /* canonical composition */
    size_t o = 0;
    long starter = -1;
    unsigned last = 0;
    for (size_t i = 0; ok && i < m; i++) {
        uint32_t x = c[i];
        unsigned k = qsa__uni_ccc_of(x);
        if (starter >= 0) {
            int adjacent = (size_t)starter == o - 1;
            if (adjacent || (last != 0 && last < k)) {
                uint32_t comp = qsa__nfc_pair(c[starter], x);
                if (comp) { c[starter] = comp; continue; }
            }
        }
        if (k == 0) starter = (long)o;
        last = k;
        c[o++] = x;
    }
    if (ok && !qsa__buf_reserve(out, 4 * o)) ok = 0;
    for (size_t i = 0; ok && i < o; i++) out->len += (size_t)qsa__u8_put(out->data + out->len, c[i]);
    if (ok && out->data) out->data[out->len] = 0;
    qsa__vec_free(&d);
    return ok;
}

/* ---- pre-tokenizer: the Qwen split regexes, matched by hand ------------------------------- */

/* The pattern strings exactly as tokenizer.json carries them (after JSON unescaping). */
static const char qsa__pat_qwen2[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|"
    "\\s+(?!\\S)|\\s+";
static const char qsa__pat_qwen35[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}| ?[^\\s\\p{L}\\p{M}\\p{N}]+[\\r\\n]*|"
    "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

typedef enum qsa__pretok { QSA__PRETOK_QWEN2 = 1, QSA__PRETOK_QWEN35 = 2 } qsa__pretok;

QSA_PRIV unsigned qsa__cls_of(uint32_t c) {
    if (c < 0x80) {
        if ((c | 0x20) - 'a' < 26) return QSA__UNI_L;
        if (c - '0' < 10) return QSA__UNI_N;
        if (c == ' ' || (c >= 9 && c <= 13)) return QSA__UNI_WS;
        return 0;
    }
    return qsa__uni_class(c);
}

/* (?i:s) etc. under Oniguruma's Unicode case folding: U+017F LONG S folds to 's' */
QSA_PRIV int qsa__ci(uint32_t c, char lower) {
    return c == (uint32_t)lower || c == (uint32_t)(lower - 32) || (lower == 's' && c == 0x17f);
}

/* End (exclusive) of the regex match that starts at i, leftmost-first alternation and greedy
   backtracking as in Oniguruma.  cp/cl: code points and their class flags; n: count.
     A1 (?i:'s|'t|'re|'ve|'m|'ll|'d)      A2 [^\r\n\p{L}\p{N}]?LETTER+       A3 \p{N}
     A4 ' '?[^\s\p{L}\p{N}(\p{M})]+[\r\n]*  A5 \s*[\r\n]+  A6 \s+(?!\S)  A7 \s+
   where LETTER is \p{L} (Qwen2/3) or [\p{L}\p{M}] (Qwen3.5).  Every code point starts a match of
   one of A2..A7, so the regex never leaves gaps. */
QSA_PRIV size_t qsa__pretok_match(qsa__pretok kind, const uint32_t *cp, const uint8_t *cl, size_t n, size_t i) {
    const unsigned letter = kind == QSA__PRETOK_QWEN35 ? (QSA__UNI_L | QSA__UNI_M) : QSA__UNI_L;
    const unsigned notp = QSA__UNI_WS | QSA__UNI_L | QSA__UNI_N | (kind == QSA__PRETOK_QWEN35 ? QSA__UNI_M : 0u);
    uint32_t c = cp[i];
    size_t j;
    /* A1 */
    if (c == '\'' && i + 1 < n) {
        uint32_t a = cp[i + 1];
        if (qsa__ci(a, 's') || qsa__ci(a, 't') || qsa__ci(a, 'm') || qsa__ci(a, 'd')) return i + 2;
        if (i + 2 < n) {
            uint32_t b = cp[i + 2];
            if ((qsa__ci(a, 'r') || qsa__ci(a, 'v')) && qsa__ci(b, 'e')) return i + 3;
            if (qsa__ci(a, 'l') && qsa__ci(b, 'l')) return i + 3;
        }
    }
    /* A2: a letter run, optionally preceded by one char that is not CR, LF, \p{L}, \p{N} */
    if (cl[i] & letter) {
        for (j = i + 1; j < n && (cl[j] & letter); j++) {}
        return j;
    }
    if (c != '\r' && c != '\n' && !(cl[i] & (QSA__UNI_L | QSA__UNI_N)) && i + 1 < n && (cl[i + 1] & letter)) {
        for (j = i + 2; j < n && (cl[j] & letter); j++) {}
        return j;
    }
    /* A3 */
    if (cl[i] & QSA__UNI_N) return i + 1;
    /* A4 */
    j = i;
    if (c == ' ' && i + 1 < n && !(cl[i + 1] & notp)) j = i + 1;
    if (!(cl[j] & notp)) {
        for (j++; j < n && !(cl[j] & notp); j++) {}
        while (j < n && (cp[j] == '\r' || cp[j] == '\n')) j++;
        return j;
    }
    /* A5..A7: c is whitespace */
    size_t e = i;
    while (e < n && (cl[e] & QSA__UNI_WS)) e++;
    if (e == i) return i + 1; /* unreachable: every class is covered above */
    for (j = e; j > i; j--)
        if (cp[j - 1] == '\r' || cp[j - 1] == '\n') return j; /* A5: last CR/LF of the run */
    if (e == n) return e;              /* A6 at end of text */
    if (e - i >= 2) return e - 1;      /* A6: leave the last space to the next word */
    return e;                          /* A7 */
}

/* ---- the tokenizer ------------------------------------------------------------------------ */

#define QSA__TOK_EXISTS 1u
#define QSA__TOK_ADDED 2u
#define QSA__TOK_SPECIAL 4u
#define QSA__TOK_MAX_ID (1 << 24)

typedef struct qsa__added_tok {
    char *content;   /* as matched: NFC-normalised when normalized and the normaliser is NFC */
    size_t len;
    char *raw;       /* as in the file */
    size_t raw_len;
    int32_t id;
    uint8_t special, lstrip, rstrip, single_word, normalized;
} qsa__added_tok;

typedef struct qsa__merge_slot {
    uint64_t key;    /* (left id << 32) | right id; UINT64_MAX when empty */
    uint32_t rank;
    int32_t id;
} qsa__merge_slot;

struct qsa_tokenizer {
    int32_t n_ids;            /* 1 + largest id */
    uint8_t *flags;           /* per id: QSA__TOK_* */
    uint32_t *piece_off, *piece_len; /* per id: decoded bytes in pieces */
    char *pieces;
    /* model vocabulary, byte-level strings as in tokenizer.json */
    uint32_t *str_off, *str_len; /* per id (str_len 0 and str_off 0 when not a vocab entry) */
    char *strs;
    int32_t *vocab_hash;      /* open addressing, -1 empty */
    size_t vocab_mask;
    qsa__merge_slot *merges;
    size_t merge_mask;
    size_t n_merges;
    int32_t byte_id[256];     /* vocab id of each single-byte symbol */
    uint16_t byte_cp[256];    /* GPT-2 bytes_to_unicode */
    int16_t cp_byte[324];     /* inverse (code points < 324), -1 outside the alphabet */
    int ignore_merges;
    int nfc;
    qsa__pretok pretok;
    qsa__added_tok *added;
    size_t n_added;
    int any_normalized_added;
    int32_t eos[4];
    int n_eos;
    int32_t bos, pad;
};

QSA_PRIV uint64_t qsa__hash_bytes(const char *s, size_t n) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) { h ^= (uint8_t)s[i]; h *= 1099511628211ull; }
    return h ^ (h >> 29);
}
QSA_PRIV uint64_t qsa__hash_u64(uint64_t x) {
    x ^= x >> 33; x *= 0xff51afd7ed558ccdull; x ^= x >> 33; x *= 0xc4ceb9fe1a85ec53ull; x ^= x >> 33;
    return x;
}

/* vocabulary id of a byte-level string, or -1 */
QSA_PRIV int32_t qsa__vocab_lookup(const qsa_tokenizer *t, const char *s, size_t n) {
    if (!t->vocab_hash) return -1;
    size_t h = (size_t)qsa__hash_bytes(s, n) & t->vocab_mask;
    for (;;) {
        int32_t id = t->vocab_hash[h];
        if (id < 0) return -1;
        if (t->str_len[id] == n && memcmp(t->strs + t->str_off[id], s, n) == 0) return id;
        h = (h + 1) & t->vocab_mask;
    }
}

QSA_PRIV const qsa__merge_slot *qsa__merge_lookup(const qsa_tokenizer *t, int32_t a, int32_t b) {
    uint64_t key = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
    size_t h = (size_t)qsa__hash_u64(key) & t->merge_mask;
    for (;;) {
        const qsa__merge_slot *s = &t->merges[h];
        if (s->key == key) return s;
        if (s->key == UINT64_MAX) return NULL;
        h = (h + 1) & t->merge_mask;
    }
}

QSA_PRIV void qsa__bytes_to_unicode(uint16_t byte_cp[256], int16_t cp_byte[324]) {
    int n = 0;
    for (int i = 0; i < 324; i++) cp_byte[i] = -1;
    for (int b = 0; b < 256; b++) {
        int printable = (b >= '!' && b <= '~') || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff);
        byte_cp[b] = (uint16_t)(printable ? b : 256 + n++);
        cp_byte[byte_cp[b]] = (int16_t)b;
    }
}

/* the ByteLevel decoder's rule for one token string: every char in the byte alphabet -> those
   bytes; otherwise the string's own UTF-8 bytes.  Writes at most n bytes to out. */
QSA_PRIV size_t qsa__bytelevel_decode(const qsa_tokenizer *t, const char *s, size_t n, char *out) {
    const uint8_t *u = (const uint8_t *)s;
    size_t i = 0, o = 0;
    while (i < n) {
        uint32_t cp = 0;
        int sub = 0, k = qsa__u8_next(u + i, n - i, &cp, &sub);
        if (k <= 0 || cp >= 324 || t->cp_byte[cp] < 0) { memcpy(out, s, n); return n; }
        out[o++] = (char)t->cp_byte[cp];
        i += (size_t)k;
    }
    return o;
}

QSA_IMPL void qsa_tokenizer_free(qsa_tokenizer *t) {
    if (!t) return;
    qsa__free(t->flags);
    qsa__free(t->piece_off);
    qsa__free(t->piece_len);
    qsa__free(t->pieces);
    qsa__free(t->str_off);
    qsa__free(t->str_len);
    qsa__free(t->strs);
    qsa__free(t->vocab_hash);
    qsa__free(t->merges);
    for (size_t i = 0; i < t->n_added; i++) {
        qsa__free(t->added[i].content);
        qsa__free(t->added[i].raw);
    }
    qsa__free(t->added);
    qsa__free(t);
}

/* ---- loading ------------------------------------------------------------------------------ */

QSA_PRIV int qsa__json_flag(const qsa__json *obj, const char *key) {
    const qsa__json *v = qsa__json_get(obj, key);
    return v && v->type == QSA__JSON_TRUE;
}

QSA_PRIV size_t qsa__pow2_at_least(size_t n) {
    size_t c = 16;
    while (c < n) c *= 2;
    return c;
}

/* normalizer: null or NFC (possibly as a one-element Sequence) */
QSA_PRIV qsa_result qsa__tok_load_normalizer(qsa_tokenizer *t, const qsa__json *nz, const char *src) {
    if (!nz || nz->type == QSA__JSON_NULL) return QSA_OK;
    const qsa__json *ty = qsa__json_get(nz, "type");
    if (qsa__json_is_str(ty, "Sequence")) {
        const qsa__json *seq = qsa__json_get(nz, "normalizers");
        if (seq && seq->type == QSA__JSON_ARRAY && seq->count == 0) return QSA_OK;
        if (seq && seq->type == QSA__JSON_ARRAY && seq->count == 1) return qsa__tok_load_normalizer(t, seq->child, src);
        return qsa__fail(QSA_ERR_UNSUPPORTED, "%s: normalizer Sequence with %zu elements is not supported (only NFC)", src,
                         seq ? seq->count : (size_t)0);
    }
    if (qsa__json_is_str(ty, "NFC")) { t->nfc = 1; return QSA_OK; }
    return qsa__fail(QSA_ERR_UNSUPPORTED, "%s: normalizer type '%s' is not supported (only NFC or null)", src,
                     ty && ty->type == QSA__JSON_STRING ? ty->str : qsa__json_type_name(ty));
}

/* pre_tokenizer: Sequence[Split(known regex, Isolated), ByteLevel(add_prefix_space=false, use_regex=false)] */
QSA_PRIV qsa_result qsa__tok_load_pretok(qsa_tokenizer *t, const qsa__json *pt, const char *src) {
    const qsa__json *ty = qsa__json_get(pt, "type");
    const qsa__json *seq = qsa__json_get(pt, "pretokenizers");
    if (!qsa__json_is_str(ty, "Sequence") || !seq || seq->type != QSA__JSON_ARRAY || seq->count != 2)
        return qsa__fail(QSA_ERR_UNSUPPORTED, "%s: pre_tokenizer must be a Sequence of Split (regex) and ByteLevel, found "
                         "type '%s'%s", src, ty && ty->type == QSA__JSON_STRING ? ty->str : qsa__json_type_name(ty),
                         qsa__json_is_str(ty, "Sequence") ? " with another element count" : "");
    const qsa__json *split = seq->child, *bl = seq->child->next;
    if (!qsa__json_is_str(qsa__json_get(split, "type"), "Split"))
        return qsa__fail(QSA_ERR_UNSUPPORTED, "%s: pre_tokenizer[0] must be Split", src);
    const qsa__json *pat = qsa__json_get(qsa__json_get(split, "pattern"), "Regex");
    if (!pat || pat->type != QSA__JSON_STRING)
        return qsa__fail(QSA_ERR_UNSUPPORTED, "%s: pre_tokenizer Split pattern must be {\"Regex\": ...} (a String pattern "
                         "is not supported)", src);
    if (pat->len == sizeof qsa__pat_qwen2 - 1 && memcmp(pat->str, qsa__pat_qwen2, pat->len) == 0) t->pretok = QSA__PRETOK_QWEN2;
    else if (pat->len == sizeof qsa__pat_qwen35 - 1 && memcmp(pat->str, qsa__pat_qwen35, pat->len) == 0)
        t->pretok = QSA__PRETOK_QWEN35;
    else
        return qsa__fail(QSA_ERR_UNSUPPORTED, "%s: pre_tokenizer Split regex is not one this runtime implements "
                         "(Qwen2/Qwen3 or Qwen3.5): '%.600s'", src, pat->str);
    if (!qsa__json_is_str(qsa__json_get(split, "behavior"), "Isolated") || qsa__json_flag(split, "invert"))
        return qsa__fail(QSA_ERR_UNSUPPORTED, "%s: pre_tokenizer Split must have behavior Isolated and invert false", src);
    if (!qsa__json_is_str(qsa__json_get(bl, "type"), "ByteLevel"))
        return qsa__fail(QSA_ERR_UNSUPPORTED, "%s: pre_tokenizer[1] must be ByteLevel", src);
    if (qsa__json_flag(bl, "add_prefix_space") || qsa__json_flag(bl, "use_regex"))
        return qsa__fail(QSA_ERR_UNSUPPORTED, "%s: pre_tokenizer ByteLevel with add_prefix_space or use_regex true is not "
                         "supported", src);
    return QSA_OK;
}

QSA_PRIV qsa_result qsa__tok_id_of(const qsa__json *v, const char *src, const char *what, int32_t *id) {
    if (!v || v->type != QSA__JSON_NUMBER || !v->is_int || v->i64 < 0 || v->i64 >= QSA__TOK_MAX_ID)
        return qsa__fail(QSA_ERR_FORMAT, "%s: %s: id must be an integer in [0, %d), found %s", src, what, QSA__TOK_MAX_ID,
                         qsa__json_type_name(v));
    *id = (int32_t)v->i64;
    return QSA_OK;
}

QSA_PRIV qsa_result qsa__tok_oom(const char *src) {
    return qsa__fail(QSA_ERR_OUT_OF_MEMORY, "%s: out of memory while building the tokenizer", src);
}

/* one merge entry: "a b" or ["a", "b"] */
QSA_PRIV qsa_result qsa__tok_merge_parts(const qsa__json *m, size_t idx, const char *src, const char **a, size_t *al,
                                         const char **b, size_t *bl) {
    if (m->type == QSA__JSON_STRING) {
        const char *sp = (const char *)memchr(m->str, ' ', m->len);
        if (!sp || memchr(sp + 1, ' ', m->len - (size_t)(sp + 1 - m->str)))
            return qsa__fail(QSA_ERR_FORMAT, "%s: model.merges[%zu] '%.80s' is not two tokens separated by one space", src,
                             idx, m->str);
        *a = m->str; *al = (size_t)(sp - m->str);
        *b = sp + 1; *bl = m->len - *al - 1;
        return QSA_OK;
    }
    if (m->type == QSA__JSON_ARRAY && m->count == 2 && m->child->type == QSA__JSON_STRING &&
        m->child->next->type == QSA__JSON_STRING) {
        *a = m->child->str; *al = m->child->len;
        *b = m->child->next->str; *bl = m->child->next->len;
        return QSA_OK;
    }
    return qsa__fail(QSA_ERR_FORMAT, "%s: model.merges[%zu] must be a string \"a b\" or an array of two strings, found %s", src,
                     idx, qsa__json_type_name(m));
}

QSA_PRIV qsa_result qsa__tok_build(qsa_tokenizer *t, const qsa__json *root, const char *src) {
    if (!root || root->type != QSA__JSON_OBJECT)
        return qsa__fail(QSA_ERR_FORMAT, "%s: top level must be an object, found %s", src, qsa__json_type_name(root));
    const qsa__json *model = qsa__json_get(root, "model");
    if (!model || model->type != QSA__JSON_OBJECT)
        return qsa__fail(QSA_ERR_FORMAT, "%s: missing \"model\" object (found %s)", src, qsa__json_type_name(model));
    const qsa__json *mt = qsa__json_get(model, "type");
    if (mt && !qsa__json_is_str(mt, "BPE"))
        return qsa__fail(QSA_ERR_UNSUPPORTED, "%s: model.type '%s' is not supported (only BPE)", src,
                         mt->type == QSA__JSON_STRING ? mt->str : qsa__json_type_name(mt));
    const qsa__json *vocab = qsa__json_get(model, "vocab"), *merges = qsa__json_get(model, "merges");
    if (!vocab || vocab->type != QSA__JSON_OBJECT)
        return qsa__fail(QSA_ERR_FORMAT, "%s: model.vocab must be an object of token -> id, found %s", src,
                         qsa__json_type_name(vocab));
    if (!merges || merges->type != QSA__JSON_ARRAY)
        return qsa__fail(QSA_ERR_FORMAT, "%s: model.merges must be an array, found %s", src, qsa__json_type_name(merges));
    const qsa__json *v;
    if (qsa__json_flag(model, "byte_fallback"))
        return qsa__fail(QSA_ERR_UNSUPPORTED, "%s: model.byte_fallback true is not supported", src);
    v = qsa__json_get(model, "dropout");
    if (v && v->type == QSA__JSON_NUMBER && v->num != 0.0)
        return qsa__fail(QSA_ERR_UNSUPPORTED, "%s: model.dropout %g is not supported (inference needs null)", src, v->num);
    v = qsa__json_get(model, "continuing_subword_prefix");
    if (v && v->type == QSA__JSON_STRING && v->len)
        return qsa__fail(QSA_ERR_UNSUPPORTED, "%s: model.continuing_subword_prefix '%s' is not supported", src, v->str);
    v = qsa__json_get(model, "end_of_word_suffix");
    if (v && v->type == QSA__JSON_STRING && v->len)
        return qsa__fail(QSA_ERR_UNSUPPORTED, "%s: model.end_of_word_suffix '%s' is not supported", src, v->str);
    t->ignore_merges = qsa__json_flag(model, "ignore_merges");
    const qsa__json *added = qsa__json_get(root, "added_tokens");
    if (added && added->type != QSA__JSON_ARRAY && added->type != QSA__JSON_NULL)
        return qsa__fail(QSA_ERR_FORMAT, "%s: added_tokens must be an array, found %s", src, qsa__json_type_name(added));

    /* ids and sizes */
    int32_t max_id = -1;
    size_t str_total = 0, added_total = 0;
    for (const qsa__json *e = vocab->child; e; e = e->next) {
        int32_t id = -1;
        char what[96];
        snprintf(what, sizeof what, "model.vocab[\"%.40s\"]", e->key);
        QSA__TRY(qsa__tok_id_of(e, src, what, &id));
        if (id > max_id) max_id = id;
        str_total += e->key_len;
    }
    if (added && added->type == QSA__JSON_ARRAY) {
        size_t k = 0;
        for (const qsa__json *e = added->child; e; e = e->next, k++) {
            int32_t id = -1;
            char what[64];
            snprintf(what, sizeof what, "added_tokens[%zu]", k);
            const qsa__json *c = qsa__json_get(e, "content");
            if (!c || c->type != QSA__JSON_STRING || c->len == 0)
                return qsa__fail(QSA_ERR_FORMAT, "%s: %s.content must be a non-empty string, found %s", src, what,
                                 qsa__json_type_name(c));
            QSA__TRY(qsa__tok_id_of(qsa__json_get(e, "id"), src, what, &id));
            added_total += 4 * c->len + 1; /* room for its NFC form */
        }
    }
    if (max_id < 0) return qsa__fail(QSA_ERR_FORMAT, "%s: model.vocab is empty", src);
    QSA__TRY(qsa__tok_load_normalizer(t, qsa__json_get(root, "normalizer"), src));
    QSA__TRY(qsa__tok_load_pretok(t, qsa__json_get(root, "pre_tokenizer"), src));
    v = qsa__json_get(root, "decoder");
    if (v && v->type != QSA__JSON_NULL && !qsa__json_is_str(qsa__json_get(v, "type"), "ByteLevel"))
        return qsa__fail(QSA_ERR_UNSUPPORTED, "%s: decoder must be ByteLevel (or null)", src);
    /* ids of added tokens are assigned as the library does (see below): at most one past the larger
       of the vocabulary's largest id and its size, plus one per added token */
    size_t n_added_json = added && added->type == QSA__JSON_ARRAY ? added->count : 0;
    size_t nid = (size_t)max_id + 1 > vocab->count ? (size_t)max_id + 1 : vocab->count;
    nid += n_added_json;
    t->n_ids = max_id + 1;
    t->flags = QSA__CALLOC(uint8_t, nid);
    t->piece_off = QSA__CALLOC(uint32_t, nid);
    t->piece_len = QSA__CALLOC(uint32_t, nid);
    t->str_off = QSA__CALLOC(uint32_t, nid);
    t->str_len = QSA__CALLOC(uint32_t, nid);
    t->strs = QSA__ALLOC(char, str_total + 1);
    t->pieces = QSA__ALLOC(char, str_total + added_total + 1);
    t->vocab_mask = qsa__pow2_at_least(2 * vocab->count + 2) - 1;
    t->vocab_hash = QSA__ALLOC(int32_t, t->vocab_mask + 1);
    if (!t->flags || !t->piece_off || !t->piece_len || !t->str_off || !t->str_len || !t->strs || !t->pieces || !t->vocab_hash)
        return qsa__tok_oom(src);
    if (str_total + added_total > UINT32_MAX) return qsa__fail(QSA_ERR_FORMAT, "%s: vocabulary too large", src);
    memset(t->vocab_hash, 0xff, sizeof(int32_t) * (t->vocab_mask + 1));
    qsa__bytes_to_unicode(t->byte_cp, t->cp_byte);

    /* vocabulary: byte-level strings (hash) and decoded pieces */
    size_t so = 0, po = 0;
    for (const qsa__json *e = vocab->child; e; e = e->next) {
        int32_t id = (int32_t)e->i64;
        if (t->flags[id] & QSA__TOK_EXISTS)
            return qsa__fail(QSA_ERR_FORMAT, "%s: model.vocab: id %d is used by '%.40s' and '%.40s'", src, id,
                             t->strs + t->str_off[id], e->key);
        size_t h = (size_t)qsa__hash_bytes(e->key, e->key_len) & t->vocab_mask;
        while (t->vocab_hash[h] >= 0) {
            int32_t o = t->vocab_hash[h];
            if (t->str_len[o] == e->key_len && memcmp(t->strs + t->str_off[o], e->key, e->key_len) == 0)
                return qsa__fail(QSA_ERR_FORMAT, "%s: model.vocab: token '%.40s' appears twice", src, e->key);
            h = (h + 1) & t->vocab_mask;
        }
        t->vocab_hash[h] = id;
        memcpy(t->strs + so, e->key, e->key_len);
        t->str_off[id] = (uint32_t)so;
        t->str_len[id] = (uint32_t)e->key_len;
        so += e->key_len;
        size_t pl = qsa__bytelevel_decode(t, e->key, e->key_len, t->pieces + po);
        t->piece_off[id] = (uint32_t)po;
        t->piece_len[id] = (uint32_t)pl;
        po += pl;
        t->flags[id] = QSA__TOK_EXISTS;
    }
    for (int b = 0; b < 256; b++) {
        char s[4];
        int k = qsa__u8_put(s, t->byte_cp[b]);
        t->byte_id[b] = qsa__vocab_lookup(t, s, (size_t)k);
        if (t->byte_id[b] < 0)
            return qsa__fail(QSA_ERR_FORMAT, "%s: model.vocab has no token for byte 0x%02x ('%.*s'): not a byte-level BPE "
                             "vocabulary", src, b, k, s);
    }

    /* merges: (left id, right id) -> (rank, merged id); a later duplicate wins, like the library */
    t->n_merges = merges->count;
    t->merge_mask = qsa__pow2_at_least(2 * merges->count + 2) - 1;
    t->merges = QSA__ALLOC(qsa__merge_slot, t->merge_mask + 1);
    if (!t->merges) return qsa__tok_oom(src);
    for (size_t i = 0; i <= t->merge_mask; i++) t->merges[i].key = UINT64_MAX;
    {
        qsa__buf cat = {NULL, 0, 0};
        size_t idx = 0;
        for (const qsa__json *m = merges->child; m; m = m->next, idx++) {
            const char *a = NULL, *b = NULL;
            size_t al = 0, bl = 0;
            qsa_result r = qsa__tok_merge_parts(m, idx, src, &a, &al, &b, &bl);
            if (r != QSA_OK) { qsa__buf_free(&cat); return r; }
            int32_t ia = qsa__vocab_lookup(t, a, al), ib = qsa__vocab_lookup(t, b, bl);
            cat.len = 0;
            if (!qsa__buf_put(&cat, a, al) || !qsa__buf_put(&cat, b, bl)) { qsa__buf_free(&cat); return qsa__tok_oom(src); }
            int32_t ic = qsa__vocab_lookup(t, cat.data, cat.len);
            if (ia < 0 || ib < 0 || ic < 0) {
                const char *bad = ia < 0 ? a : ib < 0 ? b : cat.data;
                int badl = (int)(ia < 0 ? al : ib < 0 ? bl : cat.len);
                r = qsa__fail(QSA_ERR_FORMAT, "%s: model.merges[%zu] ('%.*s' '%.*s'): %s '%.*s' is not in model.vocab", src,
                              idx, (int)(al > 40 ? 40 : al), a, (int)(bl > 40 ? 40 : bl), b,
                              ia < 0 || ib < 0 ? "token" : "merged token", badl > 80 ? 80 : badl, bad);
                qsa__buf_free(&cat);
                return r;
            }
            uint64_t key = ((uint64_t)(uint32_t)ia << 32) | (uint32_t)ib;
            size_t h = (size_t)qsa__hash_u64(key) & t->merge_mask;
            while (t->merges[h].key != UINT64_MAX && t->merges[h].key != key) h = (h + 1) & t->merge_mask;
            t->merges[h].key = key;
            t->merges[h].rank = (uint32_t)idx;
            t->merges[h].id = ic;
        }
        qsa__buf_free(&cat);
    }

    /* added tokens.  Like the library's AddedVocabulary::add_tokens, the id of an added token is
       not the "id" of the file: it is the id of the same content when that is already an added token
       or a vocabulary entry, else the next free id (vocabulary size for the first one, then one past
       the largest added id).  For well-formed files the two agree; a difference is logged. */
    if (n_added_json) {
        t->added = QSA__CALLOC(qsa__added_tok, n_added_json);
        if (!t->added) return qsa__tok_oom(src);
        int32_t max_added = -1;
        const int32_t vocab_size = (int32_t)vocab->count;
        for (const qsa__json *e = added->child; e; e = e->next) {
            const qsa__json *c = qsa__json_get(e, "content");
            int32_t file_id = (int32_t)qsa__json_get(e, "id")->i64, id = -1;
            qsa__added_tok *a = NULL;
            for (size_t k = 0; k < t->n_added && !a; k++)
                if (t->added[k].raw_len == c->len && memcmp(t->added[k].raw, c->str, c->len) == 0) a = &t->added[k];
            uint8_t was_special = 0;
            if (a) { /* same content again: the later flags win, but special once is special (as the tokenizers
                        library's set of special tokens: skipped in decoding, text where specials are not parsed) */
                id = a->id;
                was_special = a->special;
                qsa__free(a->content);
                qsa__free(a->raw);
                a->content = a->raw = NULL;
            } else {
                a = &t->added[t->n_added++];
                id = qsa__vocab_lookup(t, c->str, c->len);
                if (id < 0) id = max_added < 0 ? vocab_size : (max_added >= vocab_size ? max_added + 1 : vocab_size);
            }
            if (id > max_added) max_added = id;
            if (id != file_id)
                qsa__log(QSA_LOG_WARN, "%s: added token '%.40s' has id %d in the file but gets id %d (as in the tokenizers "
                         "library)", src, c->str, file_id, id);
            a->id = id;
            a->special = (uint8_t)(was_special | qsa__json_flag(e, "special"));
            a->lstrip = (uint8_t)qsa__json_flag(e, "lstrip");
            a->rstrip = (uint8_t)qsa__json_flag(e, "rstrip");
            a->single_word = (uint8_t)qsa__json_flag(e, "single_word");
            a->normalized = (uint8_t)qsa__json_flag(e, "normalized");
            qsa_result r = qsa__u8_validate(c->str, c->len, "added token content");
            if (r != QSA_OK) return qsa__fail(QSA_ERR_FORMAT, "%s: added_tokens id %d: %s", src, file_id, qsa_last_error());
            a->raw = qsa__strndup(c->str, c->len);
            a->raw_len = c->len;
            if (!a->raw) return qsa__tok_oom(src);
            qsa__buf nc = {NULL, 0, 0};
            if (a->normalized && t->nfc && !qsa__nfc_trivial(c->str, c->len)) {
                if (!qsa__nfc(c->str, c->len, &nc)) { qsa__buf_free(&nc); return qsa__tok_oom(src); }
                a->content = nc.data;
                a->len = nc.len;
            } else {
                a->content = qsa__strndup(c->str, c->len);
                a->len = c->len;
                if (!a->content) return qsa__tok_oom(src);
            }
            if (a->len == 0) return qsa__fail(QSA_ERR_FORMAT, "%s: added token id %d normalises to nothing", src, file_id);
            if (a->normalized) t->any_normalized_added = 1;
            if (id >= t->n_ids) t->n_ids = id + 1;
            /* decoding: the ByteLevel decoder sees the content too */
            size_t pl = qsa__bytelevel_decode(t, c->str, c->len, t->pieces + po);
            t->piece_off[id] = (uint32_t)po;
            t->piece_len[id] = (uint32_t)pl;
            po += pl;
            t->flags[id] = (uint8_t)(QSA__TOK_EXISTS | QSA__TOK_ADDED | (a->special ? QSA__TOK_SPECIAL : 0));
        }
    }
    t->bos = t->pad = -1;
    int32_t x = qsa_tokenizer_find(t, "<|im_end|>");
    if (x >= 0) t->eos[t->n_eos++] = x;
    x = qsa_tokenizer_find(t, "<|endoftext|>");
    if (x >= 0) t->eos[t->n_eos++] = x;
    return QSA_OK;
}

QSA_PRIV qsa_result qsa__tokenizer_from_json(const char *text, size_t len, const char *src, qsa_tokenizer **out) {
    *out = NULL;
    qsa__json_doc doc;
    memset(&doc, 0, sizeof doc);
    QSA__TRY(qsa__json_parse(text, len, src, &doc));
    qsa_tokenizer *t = QSA__CALLOC(qsa_tokenizer, 1);
    if (!t) { qsa__json_free(&doc); return qsa__tok_oom(src); }
    qsa_result r = qsa__tok_build(t, doc.root, src);
    qsa__json_free(&doc);
    if (r != QSA_OK) { qsa_tokenizer_free(t); return r; }
    *out = t;
    return QSA_OK;
}

QSA_IMPL qsa_result qsa_tokenizer_load(const char *path, qsa_tokenizer **out) {
    if (!out) return qsa__fail(QSA_ERR_INVALID_ARGUMENT, "qsa_tokenizer_load: out is NULL");
    *out = NULL;
    if (!path) return qsa__fail(QSA_ERR_INVALID_ARGUMENT, "qsa_tokenizer_load: path is NULL");
    char *text = NULL;
    size_t len = 0;
    QSA__TRY(qsa__read_file(path, &text, &len));
    double t0 = qsa__now();
    qsa_result r = qsa__tokenizer_from_json(text, len, path, out);
    qsa__free(text);
    if (r == QSA_OK)
        qsa__log(QSA_LOG_INFO, "tokenizer '%s': %d ids, %zu merges, %zu added tokens, %s regex%s (%.0f ms)", path,
                 (*out)->n_ids, (*out)->n_merges, (*out)->n_added,
                 (*out)->pretok == QSA__PRETOK_QWEN35 ? "Qwen3.5" : "Qwen2/3", (*out)->nfc ? ", NFC" : "",
                 1e3 * (qsa__now() - t0));
    return r;
}

/* the token named by a tokenizer_config.json field (a string or {"content": ...}); -1 when absent */
QSA_PRIV qsa_result qsa__tok_config_token(const qsa_tokenizer *t, const qsa__json *cfg, const char *key, const char *src,
                                          int32_t *id) {
    const qsa__json *v = qsa__json_get(cfg, key);
    *id = -1;
    if (v && v->type == QSA__JSON_OBJECT) v = qsa__json_get(v, "content");
    if (!v || v->type == QSA__JSON_NULL) return QSA_OK;
    if (v->type != QSA__JSON_STRING)
        return qsa__fail(QSA_ERR_FORMAT, "%s: %s must be a string or {\"content\": string}, found %s", src, key,
                         qsa__json_type_name(v));
    *id = qsa_tokenizer_find(t, v->str);
    if (*id < 0) return qsa__fail(QSA_ERR_FORMAT, "%s: %s '%.80s' is not a token of tokenizer.json", src, key, v->str);
    return QSA_OK;
}

QSA_IMPL qsa_result qsa_tokenizer_load_dir(const char *dir, qsa_tokenizer **out) {
    if (!out) return qsa__fail(QSA_ERR_INVALID_ARGUMENT, "qsa_tokenizer_load_dir: out is NULL");
    *out = NULL;
    if (!dir) return qsa__fail(QSA_ERR_INVALID_ARGUMENT, "qsa_tokenizer_load_dir: model_dir is NULL");
    char *tj = qsa__path_join(dir, "tokenizer.json"), *tc = qsa__path_join(dir, "tokenizer_config.json");
    qsa_result r = QSA_OK;
    if (!tj || !tc) r = qsa__fail(QSA_ERR_OUT_OF_MEMORY, "qsa_tokenizer_load_dir: out of memory");
    if (r == QSA_OK) r = qsa_tokenizer_load(tj, out);
    if (r == QSA_OK && qsa__file_exists(tc)) {
        char *text = NULL;
        size_t len = 0;
        qsa__json_doc doc;
        memset(&doc, 0, sizeof doc);
        r = qsa__read_file(tc, &text, &len);
        if (r == QSA_OK) r = qsa__json_parse(text, len, tc, &doc);
        if (r == QSA_OK && (!doc.root || doc.root->type != QSA__JSON_OBJECT))
            r = qsa__fail(QSA_ERR_FORMAT, "%s: top level must be an object", tc);
        int32_t eos = -1, bos = -1, pad = -1;
        if (r == QSA_OK) r = qsa__tok_config_token(*out, doc.root, "eos_token", tc, &eos);
        if (r == QSA_OK) r = qsa__tok_config_token(*out, doc.root, "bos_token", tc, &bos);
        if (r == QSA_OK) r = qsa__tok_config_token(*out, doc.root, "pad_token", tc, &pad);
        if (r == QSA_OK) {
            if (eos >= 0) { (*out)->eos[0] = eos; (*out)->n_eos = 1; }
            (*out)->bos = bos;
            (*out)->pad = pad;
        }
        qsa__json_free(&doc);
        qsa__free(text);
        if (r != QSA_OK) { qsa_tokenizer_free(*out); *out = NULL; }
    }
    qsa__free(tj);
    qsa__free(tc);
    return r;
}

/* ---- queries ------------------------------------------------------------------------------ */

QSA_IMPL int32_t qsa_tokenizer_vocab_size(const qsa_tokenizer *t) { return t ? t->n_ids : 0; }

QSA_IMPL int32_t qsa_tokenizer_find(const qsa_tokenizer *t, const char *text) {
    if (!t || !text) return -1;
    size_t n = strlen(text);
    for (size_t i = 0; i < t->n_added; i++)
        if (t->added[i].raw_len == n && memcmp(t->added[i].raw, text, n) == 0) return t->added[i].id;
    /* a vocabulary entry: map the bytes to the byte-level alphabet */
    qsa__buf s = {NULL, 0, 0};
    if (!qsa__buf_reserve(&s, 2 * n + 1)) return -1;
    for (size_t i = 0; i < n; i++) s.len += (size_t)qsa__u8_put(s.data + s.len, t->byte_cp[(uint8_t)text[i]]);
    int32_t id = qsa__vocab_lookup(t, s.data, s.len);
    qsa__buf_free(&s);
    return id;
}

QSA_IMPL int qsa_tokenizer_is_special(const qsa_tokenizer *t, int32_t id) {
    return t && id >= 0 && id < t->n_ids && (t->flags[id] & QSA__TOK_SPECIAL) != 0;
}
QSA_IMPL int qsa_tokenizer_eos(const qsa_tokenizer *t, const int32_t **ids) {
    if (ids) *ids = t ? t->eos : NULL;
    return t ? t->n_eos : 0;
}
QSA_IMPL int32_t qsa_tokenizer_bos(const qsa_tokenizer *t) { return t ? t->bos : -1; }
QSA_IMPL int32_t qsa_tokenizer_pad(const qsa_tokenizer *t) { return t ? t->pad : -1; }

/* ---- encoding ----------------------------------------------------------------------------- */

typedef struct qsa__bpe_sym { int32_t id, prev, next, len; } qsa__bpe_sym;
typedef struct qsa__bpe_merge { uint32_t rank, pos; int32_t id; } qsa__bpe_merge;

/* scratch buffers of one qsa_tokenize call */
typedef struct qsa__enc {
    const qsa_tokenizer *t;
    int parse_special;
    qsa__vec ids;     /* int32 output */
    qsa__vec cps, offs; /* code points of the segment being split, and their byte offsets */
    qsa__vec cls;     /* uint8 class flags */
    qsa__vec syms;    /* qsa__bpe_sym */
    qsa__vec heap;    /* qsa__bpe_merge */
    qsa__buf bl;      /* byte-level form of a piece (ignore_merges lookups) */
} qsa__enc;

QSA_PRIV int qsa__merge_less(const qsa__bpe_merge *a, const qsa__bpe_merge *b) {
    return a->rank < b->rank || (a->rank == b->rank && a->pos < b->pos);
}
QSA_PRIV int qsa__heap_push(qsa__vec *h, qsa__bpe_merge m) {
    if (!qsa__vec_reserve(h, h->n + 1)) return 0;
    qsa__bpe_merge *a = QSA__VEC_AT(*h, qsa__bpe_merge);
    size_t i = h->n++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!qsa__merge_less(&m, &a[p])) break;
        a[i] = a[p];
        i = p;
    }
    a[i] = m;
    return 1;
}
QSA_PRIV qsa__bpe_merge qsa__heap_pop(qsa__vec *h) {
    qsa__bpe_merge *a = QSA__VEC_AT(*h, qsa__bpe_merge);
    qsa__bpe_merge top = a[0], last = a[--h->n];
    size_t i = 0, n = h->n;
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        const qsa__bpe_merge *best = &last;
        if (l < n && qsa__merge_less(&a[l], best)) { m = l; best = &a[l]; }
        if (r < n && qsa__merge_less(&a[r], best)) { m = r; }
        if (m == i) break;
        a[i] = a[m];
        i = m;
    }
    if (n) a[i] = last;
    return top;
}

QSA_PRIV int qsa__enc_emit(qsa__enc *e, int32_t id) { return qsa__vec_push32(&e->ids, (uint32_t)id); }

/* BPE of one pre-token (raw bytes), like the library's Word::merge_all */
QSA_PRIV int qsa__bpe(qsa__enc *e, const uint8_t *s, size_t n) {
    const qsa_tokenizer *t = e->t;
    if (!n) return 1;
    if (n == 1) return qsa__enc_emit(e, t->byte_id[s[0]]);
    if (t->ignore_merges) {
        e->bl.len = 0;
        if (!qsa__buf_reserve(&e->bl, 2 * n)) return 0;
        for (size_t i = 0; i < n; i++) e->bl.len += (size_t)qsa__u8_put(e->bl.data + e->bl.len, t->byte_cp[s[i]]);
        int32_t id = qsa__vocab_lookup(t, e->bl.data, e->bl.len);
        if (id >= 0) return qsa__enc_emit(e, id);
    }
    if (!qsa__vec_reserve(&e->syms, n)) return 0;
    qsa__bpe_sym *sy = QSA__VEC_AT(e->syms, qsa__bpe_sym);
    e->heap.n = 0;
    for (size_t i = 0; i < n; i++) {
        sy[i].id = t->byte_id[s[i]];
        sy[i].prev = (int32_t)i - 1;
        sy[i].next = i + 1 < n ? (int32_t)i + 1 : -1;
        sy[i].len = 1;
    }
    for (size_t i = 0; i + 1 < n; i++) {
        const qsa__merge_slot *m = qsa__merge_lookup(t, sy[i].id, sy[i + 1].id);
        if (m) {
            qsa__bpe_merge mm;
            mm.rank = m->rank; mm.pos = (uint32_t)i; mm.id = m->id;
            if (!qsa__heap_push(&e->heap, mm)) return 0;
        }
    }
    while (e->heap.n) {
        qsa__bpe_merge top = qsa__heap_pop(&e->heap);
        qsa__bpe_sym *cur = &sy[top.pos];
        if (cur->len == 0 || cur->next < 0) continue;
        qsa__bpe_sym *right = &sy[cur->next];
        const qsa__merge_slot *m = qsa__merge_lookup(t, cur->id, right->id);
        if (!m || m->id != top.id) continue; /* stale entry */
        cur->id = top.id;
        cur->len += right->len;
        right->len = 0;
        int32_t rn = right->next;
        cur->next = rn;
        if (rn >= 0) sy[rn].prev = (int32_t)top.pos;
        if (cur->prev >= 0) {
            m = qsa__merge_lookup(t, sy[cur->prev].id, cur->id);
            if (m) {
                qsa__bpe_merge mm;
                mm.rank = m->rank; mm.pos = (uint32_t)cur->prev; mm.id = m->id;
                if (!qsa__heap_push(&e->heap, mm)) return 0;
            }
        }
        if (rn >= 0) {
            m = qsa__merge_lookup(t, cur->id, sy[rn].id);
            if (m) {
                qsa__bpe_merge mm;
                mm.rank = m->rank; mm.pos = top.pos; mm.id = m->id;
                if (!qsa__heap_push(&e->heap, mm)) return 0;
            }
        }
    }
    for (int32_t i = 0; i >= 0; i = sy[i].next)
        if (!qsa__enc_emit(e, sy[i].id)) return 0;
    return 1;
}

/* pre-tokenize a normalised segment and BPE every piece */
QSA_PRIV int qsa__enc_split(qsa__enc *e, const char *s, size_t n) {
    const uint8_t *u = (const uint8_t *)s;
    e->cps.n = e->offs.n = e->cls.n = 0;
    if (!qsa__vec_reserve(&e->cps, n + 1) || !qsa__vec_reserve(&e->offs, n + 1) || !qsa__vec_reserve(&e->cls, n + 1)) return 0;
    uint32_t *cp = QSA__VEC_AT(e->cps, uint32_t), *off = QSA__VEC_AT(e->offs, uint32_t);
    uint8_t *cl = QSA__VEC_AT(e->cls, uint8_t);
    size_t m = 0;
    for (size_t i = 0; i < n;) {
        uint32_t c = 0;
        int sub = 0, k = qsa__u8_next(u + i, n - i, &c, &sub);
        if (k <= 0) return 0; /* validated before */
        cp[m] = c;
        off[m] = (uint32_t)i;
        cl[m] = (uint8_t)qsa__cls_of(c);
        m++;
        i += (size_t)k;
    }
    off[m] = (uint32_t)n;
    for (size_t i = 0; i < m;) {
        size_t j = qsa__pretok_match(e->t->pretok, cp, cl, m, i);
        if (!qsa__bpe(e, u + off[i], (size_t)(off[j] - off[i]))) return 0;
        i = j;
    }
    return 1;
}

/* single_word: the library tests Rust regex's \w (Alphabetic, marks, Nd, Pc, Join_Control) next to the
   match.  Approximated by letters, marks, numbers and '_' (differs for No such as U+00B2, other Pc,
   ZWJ/ZWNJ and Other_Alphabetic symbols); Qwen files have no single_word tokens. */
QSA_PRIV int qsa__is_word_char(uint32_t c) {
    return c == '_' || (qsa__cls_of(c) & (QSA__UNI_L | QSA__UNI_N | QSA__UNI_M)) != 0;
}

/* the longest added token (of the given normalized-ness) matching at s[i], or NULL */
QSA_PRIV const qsa__added_tok *qsa__added_at(const qsa_tokenizer *t, const char *s, size_t n, size_t i, int normalized) {
    const qsa__added_tok *best = NULL;
    for (size_t k = 0; k < t->n_added; k++) {
        const qsa__added_tok *a = &t->added[k];
        if (a->normalized != normalized || a->content[0] != s[i] || a->len > n - i) continue;
        if ((!best || a->len > best->len) && memcmp(a->content, s + i, a->len) == 0) best = a;
    }
    return best;
}

QSA_PRIV int qsa__enc_segment(qsa__enc *e, const char *s, size_t n, int normalized);

/* text without added tokens of this stage: the next stage (normalise + normalized tokens), or split */
QSA_PRIV int qsa__enc_plain(qsa__enc *e, const char *s, size_t n, int normalized) {
    if (!n) return 1;
    if (normalized) return qsa__enc_split(e, s, n);
    if (!e->t->nfc || qsa__nfc_trivial(s, n)) {
        if (!e->t->any_normalized_added) return qsa__enc_split(e, s, n);
        return qsa__enc_segment(e, s, n, 1);
    }
    qsa__buf nb = {NULL, 0, 0};
    int ok = qsa__buf_reserve(&nb, n) && qsa__nfc(s, n, &nb);
    if (ok) ok = e->t->any_normalized_added ? qsa__enc_segment(e, nb.data, nb.len, 1) : qsa__enc_split(e, nb.data, nb.len);
    qsa__buf_free(&nb);
    return ok;
}

/* cut the added tokens of one stage out of s (leftmost-longest, like the library's
   AddedVocabulary::find_matches), encoding the text between them */
QSA_PRIV int qsa__enc_segment(qsa__enc *e, const char *s, size_t n, int normalized) {
    const qsa_tokenizer *t = e->t;
    const uint8_t *u = (const uint8_t *)s;
    size_t start = 0, i = 0;
    while (i < n) {
        const qsa__added_tok *a = t->n_added ? qsa__added_at(t, s, n, i, normalized) : NULL;
        if (!a) { i++; continue; }
        size_t ms = i, me = i + a->len;
        i = me;
        if (a->special && !e->parse_special) continue;
        if (a->single_word) {
            uint32_t c = 0;
            int sub = 0;
            if (ms > 0) { /* last char before the match */
                size_t p = ms - 1;
                while (p > 0 && (u[p] & 0xc0) == 0x80) p--;
                if (qsa__u8_next(u + p, ms - p, &c, &sub) > 0 && qsa__is_word_char(c)) continue;
            }
            if (me < n && qsa__u8_next(u + me, n - me, &c, &sub) > 0 && qsa__is_word_char(c)) continue;
        }
        if (a->lstrip) { /* swallow whitespace on the left, not past the previous match */
            while (ms > start) {
                size_t p = ms - 1;
                uint32_t c = 0;
                int sub = 0;
                while (p > start && (u[p] & 0xc0) == 0x80) p--;
                if (qsa__u8_next(u + p, ms - p, &c, &sub) <= 0 || !(qsa__cls_of(c) & QSA__UNI_WS)) break;
                ms = p;
            }
        }
        if (a->rstrip) {
            while (me < n) {
                uint32_t c = 0;
                int sub = 0, k = qsa__u8_next(u + me, n - me, &c, &sub);
                if (k <= 0 || !(qsa__cls_of(c) & QSA__UNI_WS)) break;
                me += (size_t)k;
            }
            i = me;
        }
        if (!qsa__enc_plain(e, s + start, ms - start, normalized)) return 0;
        if (!qsa__enc_emit(e, a->id)) return 0;
        start = me;
    }
    return qsa__enc_plain(e, s + start, n - start, normalized);
}

QSA_IMPL qsa_result qsa_tokenize(const qsa_tokenizer *t, const char *text, size_t len, int parse_special, int32_t **ids,
                                 size_t *n) {
    if (!ids || !n) return qsa__fail(QSA_ERR_INVALID_ARGUMENT, "qsa_tokenize: ids/n output pointers are NULL");
    *ids = NULL;
    *n = 0;
    if (!t) return qsa__fail(QSA_ERR_INVALID_ARGUMENT, "qsa_tokenize: tokenizer is NULL");
    if (!text && len) return qsa__fail(QSA_ERR_INVALID_ARGUMENT, "qsa_tokenize: text is NULL but len is %zu", len);
    if (!len) return QSA_OK;
    if (len > (size_t)UINT32_MAX - 1)
        return qsa__fail(QSA_ERR_INVALID_ARGUMENT, "qsa_tokenize: text of %zu bytes is too long (limit 4 GiB)", len);
    QSA__TRY(qsa__u8_validate(text, len, "qsa_tokenize: text"));
    qsa__enc e;
    memset(&e, 0, sizeof e);
    e.t = t;
    e.parse_special = parse_special;
    e.ids.elt = e.cps.elt = e.offs.elt = sizeof(uint32_t);
    e.cls.elt = 1;
    e.syms.elt = sizeof(qsa__bpe_sym);
    e.heap.elt = sizeof(qsa__bpe_merge);
    int ok = qsa__enc_segment(&e, text, len, 0);
    qsa__vec_free(&e.cps);
    qsa__vec_free(&e.offs);
    qsa__vec_free(&e.cls);
    qsa__vec_free(&e.syms);
    qsa__vec_free(&e.heap);
    qsa__buf_free(&e.bl);
    if (!ok) {
        qsa__vec_free(&e.ids);
        return qsa__fail(QSA_ERR_OUT_OF_MEMORY, "qsa_tokenize: out of memory (%zu bytes of text)", len);
    }
    *ids = (int32_t *)e.ids.p;
    *n = e.ids.n;
    if (!*n) { qsa__free(*ids); *ids = NULL; }
    return QSA_OK;
}

/* ---- decoding ----------------------------------------------------------------------------- */

QSA_IMPL qsa_result qsa_token_to_piece(const qsa_tokenizer *t, int32_t id, const char **piece, size_t *len) {
    if (!t || !piece || !len) return qsa__fail(QSA_ERR_INVALID_ARGUMENT, "qsa_token_to_piece: NULL argument");
    if (id < 0 || id >= t->n_ids || !(t->flags[id] & QSA__TOK_EXISTS))
        return qsa__fail(QSA_ERR_INVALID_ARGUMENT, "qsa_token_to_piece: id %d is not a token (vocabulary has %d ids)", id,
                         t->n_ids);
    *piece = t->pieces + t->piece_off[id];
    *len = t->piece_len[id];
    return QSA_OK;
}

/* Id's text for the detokenizers under QSA_DETOK_* flags: *len 0 for what they leave out */
QSA_PRIV qsa_result qsa__detok_piece(const qsa_tokenizer *t, int32_t id, int flags, const char **p, size_t *len) {
    *p = "";
    *len = 0;
    int known = id >= 0 && id < t->n_ids && (t->flags[id] & QSA__TOK_EXISTS);
    if (!known && id >= 0 && (flags & QSA_DETOK_SKIP_UNKNOWN)) return QSA_OK;
    QSA__TRY(qsa_token_to_piece(t, id, p, len));
    if ((flags & QSA_DETOK_SKIP_SPECIAL) && (t->flags[id] & QSA__TOK_SPECIAL)) *len = 0;
    return QSA_OK;
}

QSA_IMPL qsa_result qsa_detokenize(const qsa_tokenizer *t, const int32_t *ids, size_t n, int flags, char **text,
                                   size_t *len) {
    if (!text) return qsa__fail(QSA_ERR_INVALID_ARGUMENT, "qsa_detokenize: text is NULL");
    *text = NULL;
    if (len) *len = 0;
    if (!t || (!ids && n)) return qsa__fail(QSA_ERR_INVALID_ARGUMENT, "qsa_detokenize: NULL tokenizer or ids");
    qsa__buf raw = {NULL, 0, 0};
    for (size_t i = 0; i < n; i++) {
        const char *p = NULL;
        size_t pl = 0;
        qsa_result r = qsa__detok_piece(t, ids[i], flags, &p, &pl);
        if (r != QSA_OK) {
            qsa__buf_free(&raw);
            return qsa__fail(r, "qsa_detokenize: ids[%zu] = %d is not a token (vocabulary has %d ids)", i, ids[i], t->n_ids);
        }
        if (pl && !qsa__buf_put(&raw, p, pl)) { qsa__buf_free(&raw); return qsa__fail(QSA_ERR_OUT_OF_MEMORY, "qsa_detokenize: out of memory"); }
    }
    char *out = QSA__ALLOC(char, 3 * raw.len + 1);
    if (!out) { qsa__buf_free(&raw); return qsa__fail(QSA_ERR_OUT_OF_MEMORY, "qsa_detokenize: out of memory"); }
    size_t o = 0;
    qsa__u8_lossy(out, &o, (const uint8_t *)raw.data, raw.len, 1);
    out[o] = 0;
    qsa__buf_free(&raw);
    *text = out;
    if (len) *len = o;
    return QSA_OK;
}

QSA_IMPL void qsa_detok_stream_init(qsa_detok_stream *s, const qsa_tokenizer *tok, int flags) {
    if (!s) return;
    memset(s, 0, sizeof *s);
    s->tok = tok;
    s->flags = flags;
}

QSA_PRIV int qsa__detok_reserve(qsa_detok_stream *s, size_t need) {
    if (need <= s->cap) return 1;
    size_t cap = s->cap ? s->cap : 64;
    while (cap < need) cap *= 2;
    char *p = (char *)qsa__realloc(s->buf, cap);
    if (!p) return 0;
    s->buf = p;
    s->cap = cap;
    return 1;
}

QSA_IMPL qsa_result qsa_detok_stream_push(qsa_detok_stream *s, int32_t id, const char **text, size_t *len) {
    if (!s || !s->tok || !text || !len) return qsa__fail(QSA_ERR_INVALID_ARGUMENT, "qsa_detok_stream_push: NULL argument "
                                                         "(stream not initialised?)");
    *text = "";
    *len = 0;
    const char *p = NULL;
    size_t pl = 0;
    QSA__TRY(qsa__detok_piece(s->tok, id, s->flags, &p, &pl));
    size_t np = (size_t)s->n_pending, tot = np + pl;
    if (!qsa__detok_reserve(s, 4 * tot + 8))
        return qsa__fail(QSA_ERR_OUT_OF_MEMORY, "qsa_detok_stream_push: out of memory");
    QSA__INVARIANT(s->buf != NULL); /* (at least 8 bytes reserved) */
    /* input = pending bytes + piece, placed after the output area of the buffer */
    uint8_t *in = (uint8_t *)s->buf + 3 * tot + 4;
    memcpy(in, s->pending, np);
    if (pl) memcpy(in + np, p, pl);
    size_t o = 0, rest = qsa__u8_lossy(s->buf, &o, in, tot, 0);
    memmove(s->pending, in + tot - rest, rest); /* rest <= 3 */
    s->n_pending = (int)rest;
    s->buf[o] = 0;
    *text = s->buf;
    *len = o;
    return QSA_OK;
}

QSA_IMPL qsa_result qsa_detok_stream_flush(qsa_detok_stream *s, const char **text, size_t *len) {
    if (!s || !text || !len) return qsa__fail(QSA_ERR_INVALID_ARGUMENT, "qsa_detok_stream_flush: NULL argument");
    *text = "";
    *len = 0;
    if (!qsa__detok_reserve(s, 16)) return qsa__fail(QSA_ERR_OUT_OF_MEMORY, "qsa_detok_stream_flush: out of memory");
    size_t o = 0;
    qsa__u8_lossy(s->buf, &o, s->pending, (size_t)s->n_pending, 1);
    s->n_pending = 0;
    s->buf[o] = 0;
    *text = s->buf;
    *len = o;
    return QSA_OK;
}

QSA_IMPL void qsa_detok_stream_free(qsa_detok_stream *s) {
    if (!s) return;
    qsa__free(s->buf);
    s->buf = NULL;
    s->cap = 0;
    s->n_pending = 0;
}

/* ---- chat template ------------------------------------------------------------------------ */

QSA_IMPL qsa_result qsa_chat_apply_template(const qsa_tokenizer *t, const qsa_chat_message *msgs, size_t n,
                                            int add_generation_prompt, char **out) {
    if (!out) return qsa__fail(QSA_ERR_INVALID_ARGUMENT, "qsa_chat_apply_template: out is NULL");
    *out = NULL;
    if (!t || (!msgs && n)) return qsa__fail(QSA_ERR_INVALID_ARGUMENT, "qsa_chat_apply_template: NULL tokenizer or messages");
    static const char *const marks[2] = {"<|im_start|>", "<|im_end|>"};
    for (int k = 0; k < 2; k++) {
        int32_t id = qsa_tokenizer_find(t, marks[k]);
        if (id < 0 || !(t->flags[id] & QSA__TOK_ADDED))
            return qsa__fail(QSA_ERR_NOT_FOUND, "qsa_chat_apply_template: the tokenizer has no %s added token (ChatML needs "
                             "<|im_start|> and <|im_end|>)", marks[k]);
    }
    qsa__buf b = {NULL, 0, 0};
    int ok = 1;
    for (size_t i = 0; i < n && ok; i++) {
        if (!msgs[i].role || !msgs[i].content) {
            qsa__buf_free(&b);
            return qsa__fail(QSA_ERR_INVALID_ARGUMENT, "qsa_chat_apply_template: message %zu has a NULL %s", i,
                             msgs[i].role ? "content" : "role");
        }
        char what[96]; /* (offsets in the role or the content, not in the templated text) */
        for (int k = 0; k < 2; k++) {
            const char *f = k ? msgs[i].content : msgs[i].role;
            snprintf(what, sizeof what, "qsa_chat_apply_template: message %zu's %s", i, k ? "content" : "role");
            if (qsa__u8_validate(f, strlen(f), what) != QSA_OK) { qsa__buf_free(&b); return QSA_ERR_INVALID_ARGUMENT; }
        }
        ok = qsa__buf_puts(&b, marks[0]) && qsa__buf_puts(&b, msgs[i].role) && qsa__buf_puts(&b, "\n") &&
             qsa__buf_puts(&b, msgs[i].content) && qsa__buf_puts(&b, marks[1]) && qsa__buf_puts(&b, "\n");
    }
    if (ok && add_generation_prompt) ok = qsa__buf_puts(&b, marks[0]) && qsa__buf_puts(&b, "assistant\n");
    if (ok && !b.data) ok = qsa__buf_reserve(&b, 1);
    if (!ok) { qsa__buf_free(&b); return qsa__fail(QSA_ERR_OUT_OF_MEMORY, "qsa_chat_apply_template: out of memory"); }
    b.data[b.len] = 0;
    *out = b.data;
    return QSA_OK;
}

/* ============================================================================================== */
/* >>weights  binding checkpoint tensors to the model structure                                   */
/* ============================================================================================== */

/* A linear map y = W x with W [out, in].  Dense weights are held in fp32 (converted at load; the
   CPU backend computes in fp32).  NVFP4 weights stay packed: row r, element i is
   e2m1(nibble) * e4m3(scale[r][i/16]) * global_scale, element 2j in the low nibble of byte j. */
typedef struct qsa__lin {
    int out, in;
    const float *w;        /* [out][in] fp32; NULL for NVFP4 (q set) and for a matrix left in the file: */
    const qsa__tensor *src; /* with w NULL and q NULL: the weights are elements src_off .. src_off + out*in - 1 of
                               this mapped BF16/F16/F32 tensor (qsa_model.bind_file: the CPU backend reads them
                               there, the CUDA upload narrows them to FP16 from there) */
    size_t src_off;
    const float *bias;     /* [out] or NULL */
    const uint8_t *q;      /* NVFP4 packed [out][in/2] */
    const uint8_t *qscale; /* NVFP4 E4M3 block scales [out][in/16] */
    float qscale2;         /* NVFP4 global scale */
} qsa__lin;

/* GatedResidual: the hyper-connection block before a mixer / MLP (and the final mixer). */
typedef struct qsa__gres {
    const float *norm_w; /* [hc*H] group RMSNorm weight (1 + w) */
    qsa__lin down;       /* [hc_lowrank, hc*H] */
    qsa__lin up;         /* [hc*H, hc_lowrank] */
    qsa__lin inject;     /* [hc, hc*H]; out == 0 for the final mixer */
} qsa__gres;

typedef struct qsa__gdn_w {
    qsa__lin in_qkv;       /* [2*key_dim + value_dim, H] */
    qsa__lin in_z;         /* [value_dim, H] */
    qsa__lin in_b, in_a;   /* [nv, H] */
    qsa__lin out;          /* [H, value_dim] */
    const float *conv_w;   /* [conv_dim][K] depthwise */
    const float *A_log;    /* [nv] */
    const float *dt_bias;  /* [nv] */
    const float *norm_w;   /* [dv] plain weight */
} qsa__gdn_w;

typedef struct qsa__attn_w {
    qsa__lin q;            /* [nh * 2 * hd, H]: per head [q | gate] */
    qsa__lin k, v;         /* [nkv * hd, H] */
    qsa__lin o;            /* [H, nh * hd] */
    const float *q_norm, *k_norm;      /* [hd] */
    qsa__lin idx_qk;       /* [(ih + 1) * ihd, H] */
    const float *idx_q_norm, *idx_k_norm; /* [ihd] */
} qsa__attn_w;

typedef struct qsa__moe_w {
    qsa__lin router;       /* [E, H] */
    qsa__lin *gate, *up;   /* per expert [I, H] */
    qsa__lin *down;        /* per expert [H, I] */
    qsa__lin sh_gate, sh_up; /* [Is, H] */
    qsa__lin sh_down;      /* [H, Is] */
    qsa__lin sh_expert_gate; /* [1, H] */
} qsa__moe_w;

typedef struct qsa__ple_w {
    int ple_index;                /* index of this layer in ple_layer_ids */
    qsa__rows_view table;         /* [padded_vocab, D / n_heads] in host memory (mmap) */
    int64_t mult[16];             /* hash multipliers per n-gram position */
    int64_t *head_vocab, *head_offset; /* [n_heads] */
    qsa__lin key;                 /* [hc*H, D] */
    qsa__lin value;               /* [H, D] */
    const float *norm_key, *norm_query, *norm_conv; /* [hc*H] */
    const float *conv_w;          /* [hc*H][K] */
} qsa__ple_w;

typedef struct qsa__layer_w {
    int type;              /* qsa_layer_type */
    qsa__gres attn_hc, mlp_hc;
    qsa__gdn_w gdn;
    qsa__attn_w attn;
    qsa__moe_w moe;
    qsa__ple_w *ple;       /* NULL unless a PLE layer */
} qsa__layer_w;


/* ============================================================================================== */
/* >>kv-pool  pages of K, V and indexer keys for the QSA layers                                    */
/* ============================================================================================== */
/* Fixed-size physical pages (any page size >= 1; non-powers of two are fine) and a free list.
   A sequence maps logical page i (tokens i*page_size ...) to a physical page through its block
   table.  Where a page sits is never an ordering key: see the planner below. */
typedef struct qsa__pool {
    int page_size, n_pages, n_qsa;
    int kvd, ihd;           /* per token: nkv*hd values of K (and of V), ihd of raw indexer key */
    int *slot;              /* [num_layers] index among the QSA layers, -1 for others */
    float *k, *v, *ik;      /* CPU storage [n_qsa][n_pages][page_size][kvd | ihd] */
    int32_t *free_pages;    /* stack of free physical pages (popped from the end) */
    int n_free;
    pthread_mutex_t mu;     /* guards free_pages / n_free: sequences of one model may be fed from several threads */
    int mu_init;
} qsa__pool;

QSA_PRIV float *qsa__pool_k(const qsa__pool *p, int slot, int32_t page, int off) {
    return p->k + (((size_t)slot * p->n_pages + (size_t)page) * p->page_size + (size_t)off) * p->kvd;
}
QSA_PRIV float *qsa__pool_v(const qsa__pool *p, int slot, int32_t page, int off) {
    return p->v + (((size_t)slot * p->n_pages + (size_t)page) * p->page_size + (size_t)off) * p->kvd;
}
QSA_PRIV float *qsa__pool_ik(const qsa__pool *p, int slot, int32_t page, int off) {
    return p->ik + (((size_t)slot * p->n_pages + (size_t)page) * p->page_size + (size_t)off) * p->ihd;
}

/* Permute the free list with a seeded Fisher-Yates shuffle (tests and investigations: the next
   allocations land on scattered pages). */
QSA_PRIV void qsa__pool_shuffle(qsa__pool *p, uint64_t seed) {
    for (int i = p->n_free - 1; i > 0; i--) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        int j = (int)((seed >> 33) % (uint64_t)(i + 1));
        int32_t t = p->free_pages[i];
        p->free_pages[i] = p->free_pages[j];
        p->free_pages[j] = t;
    }
}

/* Default page size (the hybrid rule): a page of one layer holds about as many bytes of attention
   state as one GDN layer's recurrent state, rounded up to a multiple of 16 tokens, at most
   QSA__MAX_AUTO_PAGE tokens (the real shape: 1,232). */
#define QSA__MAX_AUTO_PAGE 65536
QSA_PRIV int qsa__default_page_size(const qsa_model_config *c) {
    double gdn = 4.0 * c->linear_num_value_heads * c->linear_key_head_dim * c->linear_value_head_dim;
    double attn = 2.0 * 2.0 * c->num_key_value_heads * c->head_dim + (c->has_qsa ? 4.0 * c->indexer_head_dim : 0.0);
    double pages = ceil(gdn / (16.0 * attn)); /* (in double: a hostile config's ratio passes INT_MAX) */
    return 16 * (pages < 1 ? 1 : pages > QSA__MAX_AUTO_PAGE / 16 ? QSA__MAX_AUTO_PAGE / 16 : (int)pages);
}

/* ============================================================================================== */
/* >>planner  QSA selections -> attention plans in logical order                                  */
/* ============================================================================================== */
/* A query's selection (complete blocks + tail tokens) becomes ascending logical token ranges, cut
   at page boundaries into (physical page, offset, length) segments.  The attention reduces over the
   selected tokens in plan order with split points fixed in *logical selected-token index* (every
   QSA_ATTN_SPLIT tokens) and merges the partial (max, sum, out) triples left to right, so the result
   depends only on logical positions, never on where the pages are.  physical_order = 1 sorts the
   segments by physical address instead (debug: this is what breaks allocation invariance).
   128 (was 256 until 2026-12-01): a decode query's ~2,048 selected tokens make 17 splits, whose
   serial online softmax is each GPU warp's long pole: on the H200 (real shape) the batch-1 decode
   attention went 68.5 -> 51.7 us per layer and batch 1 95.7 -> 97.3 tok/s (batch 8 383 -> 390, batch
   32 651 -> 641, within the run-to-run spread; measured with the batched GDN staging change). */
#define QSA_ATTN_SPLIT 128

typedef struct qsa__seg {
    int32_t page, offset, len; /* physical page, first slot, number of tokens */
    int32_t logical;           /* logical position of the first token */
} qsa__seg;

typedef struct qsa__plan {
    qsa__seg *seg;
    int n_seg, cap;
    int n_tokens;
} qsa__plan;

QSA_PRIV int qsa__plan_push(qsa__plan *pl, int32_t page, int32_t off, int32_t len, int32_t logical) {
    if (pl->n_seg > 0) { /* extend the previous segment when this one continues it */
        qsa__seg *last = &pl->seg[pl->n_seg - 1];
        if (last->page == page && last->offset + last->len == off && last->logical + last->len == logical) {
            last->len += len;
            pl->n_tokens += len;
            return 1;
        }
    }
    if (pl->n_seg == pl->cap) {
        int cap = pl->cap ? 2 * pl->cap : 64;
        qsa__seg *s = (qsa__seg *)qsa__realloc(pl->seg, sizeof(qsa__seg) * (size_t)cap);
        if (!s) return 0;
        pl->seg = s;
        pl->cap = cap;
    }
    qsa__seg *sg = &pl->seg[pl->n_seg++];
    sg->page = page; sg->offset = off; sg->len = len; sg->logical = logical;
    pl->n_tokens += len;
    return 1;
}

/* Append the logical range [a, b) cut at page boundaries. */
QSA_PRIV int qsa__plan_range(qsa__plan *pl, int64_t a, int64_t b, int page_size, const int32_t *bt) {
    while (a < b) {
        int64_t lp = a / page_size, off = a % page_size;
        int64_t len = page_size - off < b - a ? page_size - off : b - a;
        if (!qsa__plan_push(pl, bt[lp], (int32_t)off, (int32_t)len, (int32_t)a)) return 0;
        a += len;
    }
    return 1;
}

QSA_PRIV int qsa__seg_phys_before(const qsa__seg *a, const qsa__seg *b) {
    return a->page < b->page || (a->page == b->page && a->offset < b->offset);
}

/* Plan for the query at logical position pos: blocks[0..nsel) ascending (each of r tokens), then the
   tail nb*r .. pos.  Adjacent blocks merge into one range. */
QSA_PRIV qsa_result qsa__plan_build(qsa__plan *pl, const int32_t *blocks, int nsel, int nb, int r, int64_t pos,
                                    int page_size, const int32_t *bt, int physical_order) {
    pl->n_seg = 0;
    pl->n_tokens = 0;
    int ok = 1;
    for (int i = 0; i < nsel && ok;) {
        int j = i + 1;
        while (j < nsel && blocks[j] == blocks[j - 1] + 1) j++;
        ok = qsa__plan_range(pl, (int64_t)blocks[i] * r, (int64_t)(blocks[j - 1] + 1) * r, page_size, bt);
        i = j;
    }
    if (ok) ok = qsa__plan_range(pl, (int64_t)nb * r, pos + 1, page_size, bt);
    if (!ok) return qsa__fail(QSA_ERR_OUT_OF_MEMORY, "QSA planner: out of memory");
    if (physical_order)
        for (int i = 1; i < pl->n_seg; i++) {
            qsa__seg x = pl->seg[i];
            int j = i;
            while (j > 0 && qsa__seg_phys_before(&x, &pl->seg[j - 1])) { pl->seg[j] = pl->seg[j - 1]; j--; }
            pl->seg[j] = x;
        }
    return QSA_OK;
}

struct qsa_model {
    qsa_model_config cfg;
    qsa_generation_config gen;
    qsa_model_params params;
    qsa__st_set st;
    qsa_tokenizer *tok;
    const float *embed;    /* [vocab, H]; NULL when bind_file left it in the file: */
    const qsa__tensor *embed_t; /* the mapped embed_tokens.weight then */
    qsa__lin lm_head;      /* [vocab, H] */
    qsa__gres final_hc;
    qsa__layer_w *layers;
    float *rope_inv_freq;  /* [rotary_dim / 2] */
    qsa__pool pool;        /* KV pages of the QSA layers */
    struct qsa__cuda *cuda; /* the CUDA backend, NULL on the CPU backend (under TP: local rank 0's backend) */
    struct qsa__tp *tp;     /* tensor parallelism (>>tp): the ranks this process drives; NULL without TP */
    struct qsa__tp_rank *tpr; /* set in a rank's view of the model (its local dims and weights): the forward's
                                 reduction points talk to the other ranks through it; NULL otherwise */
    /* owned fp32 copies of dense tensors (on one GPU only vectors: freed once uploaded, qsa__model_drop_dense) */
    float **owned;
    int n_owned, cap_owned;
    size_t bytes_f32;      /* bytes of the dense tensors converted to fp32 (what `owned` holds, rope aside) */
    int bind_file;         /* 1: the dense matrices and the embedding were not converted (qsa__lin.src,
                              embed_t): the CPU backend reads them from the mapped file, the CUDA upload narrows
                              them to FP16 from there; the vectors (norms, biases, conv taps) are fp32 copies */
    /* thread pool for the CPU matmuls */
    int n_threads;
    /* CUDA models: one stream and one set of scratch buffers serve every sequence, so the public calls that
       use the device (sequence create / free / reset / feed, qsa_generate) hold this recursive lock: threads
       sharing the model take turns.  (CPU models need none: their sequences share only the pool, which
       has its own.) */
    pthread_mutex_t lock;
    int lock_on;
};

QSA_PRIV void qsa__model_enter(qsa_model *m) {
    if (m && m->lock_on) pthread_mutex_lock(&m->lock);
}
QSA_PRIV void qsa__model_leave(qsa_model *m) {
    if (m && m->lock_on) pthread_mutex_unlock(&m->lock);
}

QSA_PRIV qsa_result qsa__own(qsa_model *m, float *p) {
    if (m->n_owned == m->cap_owned) {
        int cap = m->cap_owned ? 2 * m->cap_owned : 256;
        float **o = (float **)qsa__realloc(m->owned, sizeof(float *) * (size_t)cap);
        if (!o) { qsa__free(p); return qsa__fail(QSA_ERR_OUT_OF_MEMORY, "model load: out of memory"); }
        m->owned = o;
        m->cap_owned = cap;
    }
    m->owned[m->n_owned++] = p;
    return QSA_OK;
}

/* Tensor `name` (shape checked against ndim/shape, -1 = any) converted to a new fp32 array. */
QSA_PRIV qsa_result qsa__load_f32(qsa_model *m, const char *name, int ndim, const int64_t *shape, const float **out) {
    const qsa__tensor *t;
    QSA__TRY(qsa__st_get(&m->st, name, (qsa__dtype)-1, ndim, shape, &t));
    if (t->dtype != QSA__F32 && t->dtype != QSA__F16 && t->dtype != QSA__BF16)
        return qsa__fail(QSA_ERR_SHAPE, "tensor '%s': dtype %s, expected F32, F16 or BF16", t->name, qsa__dtype_name(t->dtype));
    size_t n = 1;
    for (int i = 0; i < t->ndim; i++) n *= (size_t)t->shape[i];
    float *p = QSA__ALLOC(float, n);
    if (!p) return qsa__fail(QSA_ERR_OUT_OF_MEMORY, "tensor '%s': out of memory for %zu floats", t->name, n);
    qsa__tensor_to_f32_mt(t, p, m->n_threads);
    QSA__TRY(qsa__own(m, p));
    m->bytes_f32 += n * sizeof(float);
    *out = p;
    return QSA_OK;
}

/* A dense matrix `name` (shape checked; dtype BF16/F16/F32): converted to fp32 at *w, or with m->bind_file
   left in the file at *src (*w NULL). */
QSA_PRIV qsa_result qsa__load_mat(qsa_model *m, const char *name, int ndim, const int64_t *shape, const float **w,
                                  const qsa__tensor **src) {
    *src = NULL;
    if (!m->bind_file) return qsa__load_f32(m, name, ndim, shape, w);
    const qsa__tensor *t;
    QSA__TRY(qsa__st_get(&m->st, name, (qsa__dtype)-1, ndim, shape, &t));
    if (t->dtype != QSA__F32 && t->dtype != QSA__F16 && t->dtype != QSA__BF16)
        return qsa__fail(QSA_ERR_SHAPE, "tensor '%s': dtype %s, expected F32, F16 or BF16", t->name, qsa__dtype_name(t->dtype));
    *w = NULL;
    *src = t;
    return QSA_OK;
}

QSA_PRIV qsa_result qsa__load_vec(qsa_model *m, const char *name, int64_t n, const float **out) {
    int64_t shape[1] = {n};
    return qsa__load_f32(m, name, 1, shape, out);
}

/* A linear layer `<base>.weight` [out, in] (+ optional `<base>.bias`), dense or NVFP4. */
QSA_PRIV qsa_result qsa__load_lin(qsa_model *m, const char *base, int out, int in, qsa__lin *l) {
    char name[512];
    memset(l, 0, sizeof *l);
    l->out = out;
    l->in = in;
    if (qsa__st_is_nvfp4(&m->st, base)) {
        qsa__nvfp4 q;
        QSA__TRY(qsa__st_get_nvfp4(&m->st, base, out, in, &q));
        l->q = q.weight->data;
        l->qscale = q.scale->data;
        l->qscale2 = q.global_scale;
    } else {
        int64_t shape[2] = {out, in};
        snprintf(name, sizeof name, "%s.weight", base);
        QSA__TRY(qsa__load_mat(m, name, 2, shape, &l->w, &l->src));
    }
    snprintf(name, sizeof name, "%s.bias", base);
    if (qsa__st_find(&m->st, name)) QSA__TRY(qsa__load_vec(m, name, out, &l->bias));
    return QSA_OK;
}

/* Row block [row0, row0 + out) of a dense matrix with `in` columns, as a linear map: of the fp32 array w,
   or (w NULL) of the mapped tensor src. */
QSA_PRIV qsa__lin qsa__lin_rows(const float *w, const qsa__tensor *src, size_t row0, int out, int in) {
    qsa__lin l;
    memset(&l, 0, sizeof l);
    l.out = out;
    l.in = in;
    if (w) l.w = w + row0 * (size_t)in;
    else {
        l.src = src;
        l.src_off = row0 * (size_t)in;
    }
    return l;
}

/* Elements i0 .. i0 + n - 1 of the FP16 image of a dense linear map's weights ([out][in] row-major, what the
   CUDA upload sends), narrowed from its fp32 copy or straight from the mapped tensor (the same bits:
   qsa__narrow_ctx) over up to nt threads; returns how many finite values became inf.  l is dense (w or
   src set) and i0 + n <= out * in. */
QSA_PRIV size_t qsa__lin_f16(const qsa__lin *l, size_t i0, size_t n, uint16_t *dst, int nt) {
    return l->w ? qsa__f32_to_f16_mt(l->w + i0, dst, n, nt) : qsa__tensor_to_f16_mt(l->src, l->src_off + i0, n, dst, nt);
}

/* The whole FP16 image of a dense linear map in pieces of at most `chunk` elements: each narrowed into
   the buffer take(ctx, count, &buffer) gives (take NULL: one host buffer of a piece), then put(ctx, first
   element, values, count), in order (the CUDA upload's stage: the host never holds more than a piece);
   stops at the first error.  *over: how many finite values became inf. */
typedef qsa_result (*qsa__f16_take_fn)(void *ctx, size_t n, uint16_t **h);
typedef qsa_result (*qsa__f16_put_fn)(void *ctx, size_t i0, const uint16_t *h, size_t n);
QSA_PRIV qsa_result qsa__lin_f16_pieces(const qsa__lin *l, size_t chunk, int nt, qsa__f16_take_fn take, qsa__f16_put_fn put,
                                        void *ctx, const char *what, size_t *over) {
    size_t n = (size_t)l->out * (size_t)l->in;
    *over = 0;
    if (!l->w && !l->src) return qsa__fail(QSA_ERR_INTERNAL, "%s: no dense weights bound", what);
    if (chunk == 0 || chunk > n) chunk = n;
    uint16_t *own = take ? NULL : QSA__ALLOC(uint16_t, chunk ? chunk : 1), *h = own;
    if (!take && !own) return qsa__fail(QSA_ERR_OUT_OF_MEMORY, "%s: out of host memory for %zu FP16 values", what, chunk);
    qsa_result r = QSA_OK;
    for (size_t i0 = 0; i0 < n && r == QSA_OK; i0 += chunk) {
        size_t k = n - i0 < chunk ? n - i0 : chunk;
        if (take && (r = take(ctx, k, &h)) != QSA_OK) break;
        *over += qsa__lin_f16(l, i0, k, h, nt);
        r = put(ctx, i0, h, k);
    }
    qsa__free(own);
    return r;
}

QSA_PRIV qsa_result qsa__load_gres(qsa_model *m, const char *base, int with_inject, qsa__gres *g) {
    const qsa_model_config *c = &m->cfg;
    int hcH = c->hc_count * c->hidden_size;
    char name[512];
    snprintf(name, sizeof name, "%s.hc_norm.weight", base);
    QSA__TRY(qsa__load_vec(m, name, hcH, &g->norm_w));
    snprintf(name, sizeof name, "%s.input_mix_weight_down", base);
    QSA__TRY(qsa__load_lin(m, name, c->hc_lowrank, hcH, &g->down));
    snprintf(name, sizeof name, "%s.input_mix_weight_up", base);
    QSA__TRY(qsa__load_lin(m, name, hcH, c->hc_lowrank, &g->up));
    memset(&g->inject, 0, sizeof g->inject);
    if (with_inject) {
        snprintf(name, sizeof name, "%s.block_inject_weight", base);
        QSA__TRY(qsa__load_lin(m, name, c->hc_count, hcH, &g->inject));
    }
    return QSA_OK;
}

QSA_PRIV qsa_result qsa__load_gdn(qsa_model *m, int L, qsa__gdn_w *g) {
    const qsa_model_config *c = &m->cfg;
    int H = c->hidden_size, nv = c->linear_num_value_heads;
    int key_dim = c->linear_num_key_heads * c->linear_key_head_dim, value_dim = nv * c->linear_value_head_dim;
    int conv_dim = 2 * key_dim + value_dim, K = c->linear_conv_kernel_dim;
    char b[256], name[512];
    snprintf(b, sizeof b, "layers.%d.linear_attn", L);
    snprintf(name, sizeof name, "%s.in_proj_qkv", b);
    QSA__TRY(qsa__load_lin(m, name, conv_dim, H, &g->in_qkv));
    snprintf(name, sizeof name, "%s.in_proj_z", b);
    QSA__TRY(qsa__load_lin(m, name, value_dim, H, &g->in_z));
    snprintf(name, sizeof name, "%s.in_proj_b", b);
    QSA__TRY(qsa__load_lin(m, name, nv, H, &g->in_b));
    snprintf(name, sizeof name, "%s.in_proj_a", b);
    QSA__TRY(qsa__load_lin(m, name, nv, H, &g->in_a));
    snprintf(name, sizeof name, "%s.out_proj", b);
    QSA__TRY(qsa__load_lin(m, name, H, value_dim, &g->out));
    int64_t cshape[3] = {conv_dim, 1, K};
    snprintf(name, sizeof name, "%s.conv1d.weight", b);
    QSA__TRY(qsa__load_f32(m, name, 3, cshape, &g->conv_w));
    snprintf(name, sizeof name, "%s.A_log", b);
    QSA__TRY(qsa__load_vec(m, name, nv, &g->A_log));
    snprintf(name, sizeof name, "%s.dt_bias", b);
    QSA__TRY(qsa__load_vec(m, name, nv, &g->dt_bias));
    snprintf(name, sizeof name, "%s.norm.weight", b);
    QSA__TRY(qsa__load_vec(m, name, c->linear_value_head_dim, &g->norm_w));
    return QSA_OK;
}

QSA_PRIV qsa_result qsa__load_attn(qsa_model *m, int L, qsa__attn_w *a) {
    const qsa_model_config *c = &m->cfg;
    int H = c->hidden_size, nh = c->num_attention_heads, nkv = c->num_key_value_heads, hd = c->head_dim;
    char b[256], name[512];
    snprintf(b, sizeof b, "layers.%d.self_attn", L);
    snprintf(name, sizeof name, "%s.q_proj", b);
    QSA__TRY(qsa__load_lin(m, name, nh * hd * 2, H, &a->q));
    snprintf(name, sizeof name, "%s.k_proj", b);
    QSA__TRY(qsa__load_lin(m, name, nkv * hd, H, &a->k));
    snprintf(name, sizeof name, "%s.v_proj", b);
    QSA__TRY(qsa__load_lin(m, name, nkv * hd, H, &a->v));
    snprintf(name, sizeof name, "%s.o_proj", b);
    QSA__TRY(qsa__load_lin(m, name, H, nh * hd, &a->o));
    snprintf(name, sizeof name, "%s.q_norm.weight", b);
    QSA__TRY(qsa__load_vec(m, name, hd, &a->q_norm));
    snprintf(name, sizeof name, "%s.k_norm.weight", b);
    QSA__TRY(qsa__load_vec(m, name, hd, &a->k_norm));
    if (!c->has_qsa) return QSA_OK;
    int ih = c->indexer_n_heads, ihd = c->indexer_head_dim;
    snprintf(name, sizeof name, "%s.indexer.index_qk_proj", b);
    QSA__TRY(qsa__load_lin(m, name, (ih + c->indexer_kv_heads) * ihd, H, &a->idx_qk));
    snprintf(name, sizeof name, "%s.indexer.q_layernorm.weight", b);
    QSA__TRY(qsa__load_vec(m, name, ihd, &a->idx_q_norm));
    snprintf(name, sizeof name, "%s.indexer.k_layernorm.weight", b);
    QSA__TRY(qsa__load_vec(m, name, ihd, &a->idx_k_norm));
    return QSA_OK;
}

/* Routed experts are stored either per expert (`experts.{e}.{gate,up,down}_proj`, dense or NVFP4)
   or fused as the reference module holds them (`experts.gate_up_proj` [E, 2I, H], `experts.down_proj`
   [E, H, I]). */
QSA_PRIV qsa_result qsa__load_moe(qsa_model *m, int L, qsa__moe_w *w) {
    const qsa_model_config *c = &m->cfg;
    int H = c->hidden_size, E = c->num_experts, I = c->moe_intermediate_size, Is = c->shared_expert_intermediate_size;
    char b[256], name[512];
    snprintf(b, sizeof b, "layers.%d.mlp", L);
    snprintf(name, sizeof name, "%s.gate", b);
    QSA__TRY(qsa__load_lin(m, name, E, H, &w->router));
    w->gate = QSA__CALLOC(qsa__lin, E);
    w->up = QSA__CALLOC(qsa__lin, E);
    w->down = QSA__CALLOC(qsa__lin, E);
    if (!w->gate || !w->up || !w->down) return qsa__fail(QSA_ERR_OUT_OF_MEMORY, "model load: out of memory");
    snprintf(name, sizeof name, "%s.experts.gate_up_proj", b);
    if (qsa__st_find(&m->st, name)) {
        const float *gu, *dn;
        const qsa__tensor *gut, *dnt;
        int64_t s1[3] = {E, 2 * I, H}, s2[3] = {E, H, I};
        QSA__TRY(qsa__load_mat(m, name, 3, s1, &gu, &gut));
        snprintf(name, sizeof name, "%s.experts.down_proj", b);
        QSA__TRY(qsa__load_mat(m, name, 3, s2, &dn, &dnt));
        for (int e = 0; e < E; e++) { /* expert e: rows 2Ie.. of gate_up, He.. of down */
            w->gate[e] = qsa__lin_rows(gu, gut, (size_t)e * 2 * I, I, H);
            w->up[e] = qsa__lin_rows(gu, gut, (size_t)e * 2 * I + I, I, H);
            w->down[e] = qsa__lin_rows(dn, dnt, (size_t)e * H, H, I);
        }
    } else {
        for (int e = 0; e < E; e++) {
            snprintf(name, sizeof name, "%s.experts.%d.gate_proj", b, e);
            QSA__TRY(qsa__load_lin(m, name, I, H, &w->gate[e]));
            snprintf(name, sizeof name, "%s.experts.%d.up_proj", b, e);
            QSA__TRY(qsa__load_lin(m, name, I, H, &w->up[e]));
            snprintf(name, sizeof name, "%s.experts.%d.down_proj", b, e);
            QSA__TRY(qsa__load_lin(m, name, H, I, &w->down[e]));
        }
    }
    snprintf(name, sizeof name, "%s.shared_expert.gate_proj", b);
    QSA__TRY(qsa__load_lin(m, name, Is, H, &w->sh_gate));
    snprintf(name, sizeof name, "%s.shared_expert.up_proj", b);
    QSA__TRY(qsa__load_lin(m, name, Is, H, &w->sh_up));
    snprintf(name, sizeof name, "%s.shared_expert.down_proj", b);
    QSA__TRY(qsa__load_lin(m, name, H, Is, &w->sh_down));
    snprintf(name, sizeof name, "%s.shared_expert_gate", b);
    QSA__TRY(qsa__load_lin(m, name, 1, H, &w->sh_expert_gate));
    return QSA_OK;
}

/* ---- PLE hashing constants, computed from the config exactly as the reference does ---- */

#define QSA__SPLITMIX_GAMMA 0x9E3779B97F4A7C15ull
QSA_PRIV uint64_t qsa__splitmix64(uint64_t v) {
    v += QSA__SPLITMIX_GAMMA;
    v = (v ^ (v >> 30)) * 0xBF58476D1CE4E5B9ull;
    v = (v ^ (v >> 27)) * 0x94D049BB133111EBull;
    return v ^ (v >> 31);
}

/* multiplier j = 2 * (splitmix64(seed + 10007 * ple_index + GAMMA * (j + 1)) % half_bound) + 1 */
QSA_PRIV void qsa__ple_multipliers(int64_t vocab, int ngram, int ple_index, int64_t seed, int64_t *mult) {
    uint64_t max_long = 0x7fffffffffffffffull;
    uint64_t mmax = max_long / (uint64_t)(vocab > 1 ? vocab : 1);
    uint64_t half = mmax / 2 ? mmax / 2 : 1;
    uint64_t base = (uint64_t)seed + 10007ull * (uint64_t)ple_index;
    for (int j = 0; j < ngram; j++) {
        uint64_t v = base + QSA__SPLITMIX_GAMMA * (uint64_t)(j + 1);
        mult[j] = (int64_t)(2 * (qsa__splitmix64(v) % half) + 1);
    }
}

#if defined(__SIZEOF_INT128__)
__extension__ typedef unsigned __int128 qsa__u128; /* (a GCC/Clang extension: -pedantic accepts it marked so) */
QSA_PRIV uint64_t qsa__mulmod(uint64_t a, uint64_t b, uint64_t m) { return (uint64_t)((qsa__u128)a * b % m); }
QSA_PRIV uint64_t qsa__powmod(uint64_t a, uint64_t e, uint64_t m) {
    uint64_t r = 1;
    for (a %= m; e; e >>= 1, a = qsa__mulmod(a, a, m))
        if (e & 1) r = qsa__mulmod(r, a, m);
    return r;
}
#endif
/* Exact for every int64: trial division by the small primes, then (where 128-bit products exist)
   Miller-Rabin with the first 12 prime bases, deterministic below 3.3e24; else trial division up to
   the square root (2^19 divisions near the 2^40 a config may ask for: a load of seconds per head). */
QSA_PRIV int qsa__is_prime(int64_t v) {
    static const int small[12] = {2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37};
    if (v < 2) return 0;
    for (int i = 0; i < 12; i++)
        if (v % small[i] == 0) return v == small[i];
#if defined(__SIZEOF_INT128__)
    uint64_t n = (uint64_t)v, d = n - 1;
    int sq = 0;
    for (; !(d & 1); d >>= 1) sq++;
    for (int i = 0; i < 12; i++) {
        uint64_t x = qsa__powmod((uint64_t)small[i], d, n);
        if (x == 1 || x == n - 1) continue;
        int j = 1;
        for (; j < sq; j++)
            if ((x = qsa__mulmod(x, x, n)) == n - 1) break;
        if (j == sq) return 0;
    }
    return 1;
#else
    for (int64_t d = 41; d <= v / d; d += 2)
        if (v % d == 0) return 0;
    return 1;
#endif
}

/* Per-head prime vocabularies: head h of PLE layer k uses the (k*n_heads + h + 1)-th prime after
   base - 1; offsets are the running sums.  Called with start = base and skip = k*n_heads, or with
   start = one past PLE layer k-1's last prime and skip = 0 (the same primes). */
QSA_PRIV void qsa__ple_head_vocabs(int64_t start, int64_t skip, int n_heads, int64_t *vocab, int64_t *offset,
                                   int64_t *total) {
    int64_t p = start - 1, sum = 0;
    for (int64_t i = 0; i < skip + n_heads; i++) {
        p++;
        while (!qsa__is_prime(p)) p++;
        if (i >= skip) {
            vocab[i - skip] = p;
            offset[i - skip] = sum;
            sum += p;
        }
    }
    *total = sum;
}

/* PLE layer ple_index of layer L; prev: PLE layer ple_index - 1 (its primes continue), NULL for the first */
QSA_PRIV qsa_result qsa__load_ple(qsa_model *m, int L, int ple_index, const qsa__ple_w *prev, qsa__ple_w *p) {
    const qsa_model_config *c = &m->cfg;
    int H = c->hidden_size, hcH = c->hc_count * H, D = c->ple_embed_dim;
    int n_heads = (c->ngram_size - 1) * c->heads_per_ngram;
    QSA__INVARIANT(n_heads > 0); /* (qsa__cfg_text) */
    char b[256], name[512];
    snprintf(b, sizeof b, "layers.%d.ple", L);
    p->ple_index = ple_index;
    p->head_vocab = QSA__CALLOC(int64_t, n_heads);
    p->head_offset = QSA__CALLOC(int64_t, n_heads);
    if (!p->head_vocab || !p->head_offset) return qsa__fail(QSA_ERR_OUT_OF_MEMORY, "model load: out of memory");
    if (c->ngram_size > 16) return qsa__fail(QSA_ERR_UNSUPPORTED, "config: ngram_size %d > 16", c->ngram_size);
    qsa__ple_multipliers(c->vocab_size, c->ngram_size, ple_index, c->seed, p->mult);
    snprintf(name, sizeof name, "%s.ple_embedding.ngram_embedding", b);
    QSA__TRY(qsa__st_rows_view(&m->st, name, &p->table));
    /* the heads' primes are all at least start: a table with fewer rows than n_heads x start is refused
       before they are searched (the search's time then follows the file's size) */
    int64_t start = prev ? prev->head_vocab[n_heads - 1] + 1 : c->ngram_vocab_size_base;
    if (p->table.rows / n_heads < start)
        return qsa__fail(QSA_ERR_SHAPE, "tensor '%s%s': %lld rows, but the config's %d hashing heads of at least %lld rows each "
                         "need more", m->st.prefix ? m->st.prefix : "", name, (long long)p->table.rows, n_heads, (long long)start);
    int64_t total;
    qsa__ple_head_vocabs(start, prev ? 0 : (int64_t)ple_index * n_heads, n_heads, p->head_vocab, p->head_offset, &total);
    int64_t div = c->make_ngram_vocab_size_divisible_by > 0 ? c->make_ngram_vocab_size_divisible_by : 1;
    int64_t padded = (total + div - 1) / div * div;
    if (p->table.rows != padded || p->table.cols != D / n_heads)
        return qsa__fail(QSA_ERR_SHAPE, "tensor '%s%s': shape [%lld, %lld], expected [%lld, %d] from the config",
                         m->st.prefix ? m->st.prefix : "", name, (long long)p->table.rows, (long long)p->table.cols, (long long)padded, D / n_heads);
    if (p->table.dtype != QSA__F32 && p->table.dtype != QSA__F16 && p->table.dtype != QSA__BF16)
        return qsa__fail(QSA_ERR_SHAPE, "tensor '%s': dtype %s, expected F32, F16 or BF16", name,
                         qsa__dtype_name(p->table.dtype));
    /* The checkpoint may carry the hashing buffers: they must agree with what the config implies. */
    snprintf(name, sizeof name, "%s.ple_embedding.layer_multipliers", b);
    const qsa__tensor *t = qsa__st_find(&m->st, name);
    if (t) {
        if (t->dtype != QSA__I64 || t->ndim != 1 || t->shape[0] != c->ngram_size)
            return qsa__fail(QSA_ERR_SHAPE, "tensor '%s': expected I64 [%d]", name, c->ngram_size);
        for (int j = 0; j < c->ngram_size; j++) {
            int64_t v;
            memcpy(&v, t->data + 8 * j, 8);
            if (v != p->mult[j])
                return qsa__fail(QSA_ERR_FORMAT, "tensor '%s'[%d] = %lld, but the config (seed %lld) gives %lld", name, j,
                                 (long long)v, (long long)c->seed, (long long)p->mult[j]);
        }
    }
    for (int k = 0; k < 2; k++) {
        snprintf(name, sizeof name, "%s.ple_embedding.%s", b, k ? "ngram_heads_offsets" : "ngram_heads_vocab_sizes");
        const int64_t *want = k ? p->head_offset : p->head_vocab;
        if (!(t = qsa__st_find(&m->st, name))) continue;
        if (t->dtype != QSA__I64 || t->ndim != 1 || t->shape[0] != n_heads)
            return qsa__fail(QSA_ERR_SHAPE, "tensor '%s': expected I64 [%d]", name, n_heads);
        for (int j = 0; j < n_heads; j++) {
            int64_t v;
            memcpy(&v, t->data + 8 * (size_t)j, 8);
            if (v != want[j])
                return qsa__fail(QSA_ERR_FORMAT, "tensor '%s'[%d] = %lld, but the config (ngram_vocab_size_base %lld) gives %lld",
                                 name, j, (long long)v, (long long)c->ngram_vocab_size_base, (long long)want[j]);
        }
    }
    snprintf(name, sizeof name, "%s.key_proj", b);
    QSA__TRY(qsa__load_lin(m, name, hcH, D, &p->key));
    snprintf(name, sizeof name, "%s.value_proj", b);
    QSA__TRY(qsa__load_lin(m, name, H, D, &p->value));
    snprintf(name, sizeof name, "%s.norm_key.weight", b);
    QSA__TRY(qsa__load_vec(m, name, hcH, &p->norm_key));
    snprintf(name, sizeof name, "%s.norm_query.weight", b);
    QSA__TRY(qsa__load_vec(m, name, hcH, &p->norm_query));
    snprintf(name, sizeof name, "%s.norm_conv.weight", b);
    QSA__TRY(qsa__load_vec(m, name, hcH, &p->norm_conv));
    int64_t cshape[3] = {hcH, 1, c->ple_conv_kernel_size};
    snprintf(name, sizeof name, "%s.conv1d.weight", b);
    QSA__TRY(qsa__load_f32(m, name, 3, cshape, &p->conv_w));
    return QSA_OK;
}

QSA_PRIV qsa_result qsa__model_bind(qsa_model *m) {
    const qsa_model_config *c = &m->cfg;
    int H = c->hidden_size;
    int64_t eshape[2] = {c->vocab_size, H};
    QSA__TRY(qsa__load_mat(m, "embed_tokens.weight", 2, eshape, &m->embed, &m->embed_t));
    /* a stored head wins over tie_word_embeddings, as in transformers 5 (which ties the two only when they
       are equal, and otherwise keeps both with a warning) */
    if (qsa__st_find(&m->st, "lm_head.weight") || qsa__st_is_nvfp4(&m->st, "lm_head")) {
        QSA__TRY(qsa__load_lin(m, "lm_head", c->vocab_size, H, &m->lm_head));
        if (c->tie_word_embeddings)
            qsa__log(QSA_LOG_INFO, "model: the checkpoint holds lm_head.weight although tie_word_embeddings is true: "
                                   "the stored head is used");
    } else if (c->tie_word_embeddings)
        m->lm_head = qsa__lin_rows(m->embed, m->embed_t, 0, c->vocab_size, H);
    else
        return qsa__fail(QSA_ERR_NOT_FOUND, "tensor 'lm_head.weight' not found and tie_word_embeddings is false");
    QSA__TRY(qsa__load_gres(m, "hyper_connection_mixer", 0, &m->final_hc));
    m->layers = QSA__CALLOC(qsa__layer_w, c->num_hidden_layers);
    if (!m->layers) return qsa__fail(QSA_ERR_OUT_OF_MEMORY, "model load: out of memory");
    for (int L = 0; L < c->num_hidden_layers; L++) {
        qsa__layer_w *lw = &m->layers[L];
        char name[256];
        lw->type = c->layer_types[L];
        snprintf(name, sizeof name, "layers.%d.attn_hyper_connection", L);
        QSA__TRY(qsa__load_gres(m, name, 1, &lw->attn_hc));
        snprintf(name, sizeof name, "layers.%d.mlp_hyper_connection", L);
        QSA__TRY(qsa__load_gres(m, name, 1, &lw->mlp_hc));
        if (lw->type == QSA_LAYER_LINEAR) QSA__TRY(qsa__load_gdn(m, L, &lw->gdn));
        else QSA__TRY(qsa__load_attn(m, L, &lw->attn));
        QSA__TRY(qsa__load_moe(m, L, &lw->moe));
        if (L % 8 == 7) qsa__log(QSA_LOG_DEBUG, "loaded layer %d/%d", L + 1, c->num_hidden_layers);
    }
    /* PLE layers in the order of their indices, each one's primes continuing the one before's (the ids
       are sorted and distinct, as the reference's sorted(set(ple_layer_ids))) */
    for (int k = 0; k < c->n_ple_layers; k++) {
        qsa__layer_w *lw = &m->layers[c->ple_layer_ids[k] - 1];
        lw->ple = QSA__CALLOC(qsa__ple_w, 1);
        if (!lw->ple) return qsa__fail(QSA_ERR_OUT_OF_MEMORY, "model load: out of memory");
        QSA__TRY(qsa__load_ple(m, c->ple_layer_ids[k] - 1, k, k ? m->layers[c->ple_layer_ids[k - 1] - 1].ple : NULL, lw->ple));
    }
    /* RoPE inverse frequencies in fp32, as the reference computes them */
    int rd = c->rotary_dim;
    m->rope_inv_freq = QSA__CALLOC(float, rd / 2 + 1); /* (the device copy is one float longer: zero) */
    if (!m->rope_inv_freq) return qsa__fail(QSA_ERR_OUT_OF_MEMORY, "model load: out of memory");
    for (int i = 0; i < rd / 2; i++) {
        float e = (float)(2 * i) / (float)rd;
        float p = powf((float)c->rope_theta, e);
        m->rope_inv_freq[i] = 1.0f / p;
    }
    return QSA_OK;
}

/* Sampling on the device: a sampler whose draw reads the top-k of a row (1 <= top_k <= QSA__CAND_MAX), or its
   arg-max alone, or a draw over the whole row (its QSA__CAND_Z best and the row's sum), lets a batched
   step reduce the row to those candidates (qsa__sampler_cand_k) */
#define QSA__CAND_MAX 1024
#define QSA__CAND_Z 256 /* the candidates of a whole-row draw */
#define QSA__CAND_STRIDE(kmax) (4 + 2 * (kmax)) /* the words of a row of candidates (qsa_k_sample_cand2) */
/* A batched step's sampling on the device (qsa__feed_batch, qsa__cuda_decode_batch): the rows' samplers, and where
   their candidates go: out + i QSA__CAND_STRIDE(kmax) is row i's for qsa__sampler_from_cand, its word 1 left at -1
   where the row's logits came instead (a step that could not reduce its rows: qsa__cuda_cand_rows), -2 where they came
   with the repetition penalty applied (a whole-row draw that its candidates could not decide: qsa__sampler_cand_draw;
   drawn by qsa__sampler_sample_z with no history and the row's sum, qsa__cand_z) */
struct qsa__cand_req {
    qsa_sampler *const *smp;
    int32_t *out;
    int kmax; /* >= each row's qsa__sampler_cand_k; 1 .. QSA__CAND_MAX */
};
typedef struct qsa__cand_req qsa__cand_req;

#ifndef QSA_NO_CUDA
struct qsa__cuda;
struct qsa__cuda_seq;
QSA_PRIV qsa_result qsa__cuda_init(qsa_model *m, struct qsa__cuda **out);
QSA_PRIV void qsa__cuda_free(struct qsa__cuda *g);
QSA_PRIV qsa_result qsa__cuda_seq_create(qsa_model *m, qsa_seq *s);
QSA_PRIV qsa_result qsa__cuda_seq_reset(qsa_model *m, qsa_seq *s);
QSA_PRIV void qsa__cuda_seq_destroy(qsa_model *m, qsa_seq *s);
QSA_PRIV qsa_result qsa__cuda_chunk(qsa_seq *sq, const int32_t *ids, int M, float *logits, int all_logits,
                                    const qsa__cand_req *cq);
QSA_PRIV qsa_result qsa__cuda_decode_batch(qsa_model *m, qsa_seq **seqs, const int32_t *tokens, int B, float *logits,
                                           int32_t *next, const qsa__cand_req *cq);
QSA_PRIV int qsa__cuda_batch_ready(qsa_model *m);
QSA_PRIV int qsa__cuda_cand_rows(qsa_model *m, qsa_seq **seqs, const int32_t *tokens, int n, int B, const qsa__cand_req *cq);
QSA_PRIV qsa_result qsa__cuda_cand_put(qsa_model *m, int B);
QSA_PRIV qsa_result qsa__cuda_cand_one(qsa_model *m, CUdeviceptr lg, const qsa__cand_req *cq, float *lg_row);
struct qsa__tp;
QSA_PRIV qsa_result qsa__tp_init(qsa_model *m);
QSA_PRIV void qsa__tp_free(qsa_model *m);
#endif
QSA_PRIV void qsa__tp_local_config(const qsa_model_config *c, int tp, qsa_model_config *lc);

QSA_PRIV void qsa__pool_destroy(qsa__pool *p) {
    qsa__free(p->k);
    qsa__free(p->v);
    qsa__free(p->ik);
    qsa__free(p->slot);
    qsa__free(p->free_pages);
    if (p->mu_init) pthread_mutex_destroy(&p->mu);
    memset(p, 0, sizeof *p);
}

QSA_PRIV qsa_result qsa__pool_create(qsa_model *m, int host_storage) {
    const qsa_model_config *c = &m->cfg;
    qsa__pool *p = &m->pool;
    qsa_model_config local = *c; /* under TP the hybrid rule uses one rank's share of the state (docs/TP.md) */
    if (m->params.tp > 1) {
        if (qsa_tp_check(c, m->params.tp) == QSA_OK) qsa__tp_local_config(c, m->params.tp, &local);
        else qsa_clear_error(); /* qsa__tp_init reports it */
    }
    p->page_size = m->params.kv_page_size > 0 ? m->params.kv_page_size : qsa__default_page_size(&local);
    int64_t tokens = m->params.kv_pool_tokens > 0 ? m->params.kv_pool_tokens
                                                  : (c->max_position_embeddings < 32768 ? c->max_position_embeddings : 32768);
    p->n_pages = (int)((tokens + p->page_size - 1) / p->page_size);
    p->kvd = c->num_key_value_heads * c->head_dim;
    p->ihd = c->has_qsa ? c->indexer_head_dim : 0;
    p->slot = QSA__ALLOC(int, c->num_hidden_layers);
    p->free_pages = QSA__ALLOC(int32_t, p->n_pages);
    if (pthread_mutex_init(&p->mu, NULL) == 0) p->mu_init = 1;
    else return qsa__fail(QSA_ERR_OUT_OF_MEMORY, "KV pool: cannot create its mutex");
    if (!p->slot || !p->free_pages) return qsa__fail(QSA_ERR_OUT_OF_MEMORY, "KV pool: out of memory");
    for (int l = 0; l < c->num_hidden_layers; l++) p->slot[l] = c->layer_types[l] == QSA_LAYER_QSA ? p->n_qsa++ : -1;
    size_t slots = (size_t)p->n_qsa * p->n_pages * p->page_size;
    if (p->n_qsa && host_storage) { /* on the CUDA backend the pages live on the device */
        p->k = QSA__ALLOC(float, slots * p->kvd);
        p->v = QSA__ALLOC(float, slots * p->kvd);
        p->ik = QSA__ALLOC(float, slots * p->ihd + 1);
        if (!p->k || !p->v || !p->ik)
            return qsa__fail(QSA_ERR_OUT_OF_MEMORY, "KV pool: out of memory for %d pages of %d tokens", p->n_pages, p->page_size);
    }
    /* pages are handed out in ascending order by default */
    for (int i = 0; i < p->n_pages; i++) p->free_pages[i] = p->n_pages - 1 - i;
    p->n_free = p->n_pages;
    qsa__log(QSA_LOG_INFO, "KV pool: %d pages of %d tokens", p->n_pages, p->page_size);
    return QSA_OK;
}

/* Frees what qsa__model_bind made (the layers, the fp32 tensors, RoPE); the checkpoint stays open. */
QSA_PRIV void qsa__model_unbind(qsa_model *m) {
    if (m->layers) {
        for (int L = 0; L < m->cfg.num_hidden_layers; L++) {
            qsa__layer_w *lw = &m->layers[L];
            qsa__free(lw->moe.gate);
            qsa__free(lw->moe.up);
            qsa__free(lw->moe.down);
            if (lw->ple) {
                qsa__rows_view_free(&lw->ple->table);
                qsa__free(lw->ple->head_vocab);
                qsa__free(lw->ple->head_offset);
                qsa__free(lw->ple);
            }
        }
        qsa__free(m->layers);
    }
    for (int i = 0; i < m->n_owned; i++) qsa__free(m->owned[i]);
    qsa__free(m->owned);
    qsa__free(m->rope_inv_freq);
    m->layers = NULL;
    m->owned = NULL;
    m->n_owned = m->cap_owned = 0;
    m->bytes_f32 = 0;
    m->rope_inv_freq = NULL;
    m->embed = NULL;
    m->embed_t = NULL;
    memset(&m->lm_head, 0, sizeof m->lm_head);
    memset(&m->final_hc, 0, sizeof m->final_hc);
}

/* After a one-GPU upload the forward reads, of the host model, only the layer types and each PLE
   layer's table and hashing (the n-gram rows are gathered on the host): the fp32 copies of the
   vectors (the matrices were never converted: bind_file), the expert tables of views (~10 MB at the real
   shape) and every pointer into the mapped matrices go. */
QSA_PRIV void qsa__model_drop_dense(qsa_model *m) {
    for (int L = 0; L < m->cfg.num_hidden_layers && m->layers; L++) {
        qsa__layer_w *lw = &m->layers[L];
        int type = lw->type;
        qsa__ple_w *ple = lw->ple;
        qsa__free(lw->moe.gate);
        qsa__free(lw->moe.up);
        qsa__free(lw->moe.down);
        memset(lw, 0, sizeof *lw);
        lw->type = type;
        lw->ple = ple;
        if (ple) {
            memset(&ple->key, 0, sizeof ple->key);
            memset(&ple->value, 0, sizeof ple->value);
            ple->norm_key = ple->norm_query = ple->norm_conv = ple->conv_w = NULL;
        }
    }
    for (int i = 0; i < m->n_owned; i++) qsa__free(m->owned[i]);
    m->n_owned = 0;
    m->bytes_f32 = 0;
    m->embed = NULL;
    m->embed_t = NULL;
    memset(&m->lm_head, 0, sizeof m->lm_head);
    memset(&m->final_hc, 0, sizeof m->final_hc);
}

QSA_IMPL void qsa_model_free(qsa_model *m) {
    if (!m) return;
#ifndef QSA_NO_CUDA
    if (m->tp) qsa__tp_free(m); /* every rank's backend, the communicators, the threads */
    else qsa__cuda_free(m->cuda);
#endif
    qsa__model_unbind(m);
    qsa__pool_destroy(&m->pool);
    if (m->tok) qsa_tokenizer_free(m->tok);
    qsa__st_close(&m->st);
    if (m->lock_on) pthread_mutex_destroy(&m->lock);
    qsa__free(m);
}

/* Parameters no value of which means anything: refused before anything is read (0 is every field's
   default; cuda_batch_decode and cuda_graphs also take -1). */
QSA_PRIV qsa_result qsa__model_params_check(const qsa_model_params *p) {
    static const char *const nonneg = "expected >= 0 (0: the default)", *const sw = "expected -1 (off), 0 (default: on) or 1";
#define QSA__PARAM(cond, field, expected) \
    if (!(cond)) return qsa__fail(QSA_ERR_INVALID_ARGUMENT, "qsa_model_load: " #field " %d: %s", (int)p->field, expected)
    QSA__PARAM(p->backend >= QSA_BACKEND_AUTO && p->backend <= QSA_BACKEND_CUDA, backend, "expected QSA_BACKEND_AUTO, _CPU or _CUDA");
    QSA__PARAM(p->n_threads >= 0, n_threads, nonneg);
    QSA__PARAM(p->gdn_chunk_size >= 0 && p->gdn_chunk_size <= 4096, gdn_chunk_size, "expected 0 (64) to 4096");
    QSA__PARAM(p->kv_page_size == 0 || p->kv_page_size >= 16, kv_page_size, "expected 0 (the hybrid rule) or at least 16 tokens");
    QSA__PARAM(p->kv_pool_tokens >= 0, kv_pool_tokens, nonneg);
    QSA__PARAM(p->device >= 0, device, nonneg);
    QSA__PARAM(p->max_chunk >= 0, max_chunk, nonneg);
    QSA__PARAM(p->max_batch >= 0, max_batch, nonneg);
    QSA__PARAM(p->cuda_batch_decode >= -1 && p->cuda_batch_decode <= 1, cuda_batch_decode, sw);
    QSA__PARAM(p->cuda_graphs >= -1 && p->cuda_graphs <= 1, cuda_graphs, sw);
    QSA__PARAM(p->tp >= 0, tp, nonneg);
    QSA__PARAM(p->tp_timeout_s >= 0, tp_timeout_s, nonneg);
#undef QSA__PARAM
    return QSA_OK;
}

/* The host model of `dir`: config, generation config, the mapped checkpoint and its tensors bound with the
   dense matrices left in the file (qsa_model.bind_file, as every load binds them), or with `whole` every
   tensor converted to fp32 (the reference that tests slice TP views from).  No backend, KV pool or
   tokenizer yet.  On failure *out is NULL and the error recorded. */
QSA_PRIV qsa_result qsa__model_open(const char *dir, const qsa_model_params *params, int whole, qsa_model **out) {
    *out = NULL;
    if (params) QSA__TRY(qsa__model_params_check(params));
    qsa_model *m = QSA__CALLOC(qsa_model, 1);
    if (!m) return qsa__fail(QSA_ERR_OUT_OF_MEMORY, "qsa_model_load: out of memory");
    if (params) m->params = *params;
    QSA__DEF(m->params.gdn_chunk_size, 64);
    if (m->params.n_threads <= 0) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        m->params.n_threads = n < 1 ? 1 : n > 16 ? 16 : (int)n;
    }
    m->n_threads = m->params.n_threads;
    qsa_result r = qsa_config_load_dir(dir, &m->cfg);
    if (r == QSA_OK) {
        char *gpath = qsa__path_join(dir, "generation_config.json");
        if (!gpath) r = qsa__fail(QSA_ERR_OUT_OF_MEMORY, "qsa_model_load: out of memory");
        else if (qsa__file_exists(gpath)) {
            char *text;
            size_t len;
            r = qsa__read_file(gpath, &text, &len);
            if (r == QSA_OK) {
                r = qsa_generation_config_parse(text, len, gpath, &m->gen);
                qsa__free(text);
            }
        }
        qsa__free(gpath);
    }
    if (r == QSA_OK) r = qsa__st_open_dir(dir, &m->st);
    m->bind_file = !whole;
    if (r == QSA_OK) r = qsa__model_bind(m);
    if (r == QSA_OK && m->bind_file)
        qsa__log(QSA_LOG_DEBUG, "host weights: %.1f MiB of vectors converted to fp32; the matrices are read from the "
                 "checkpoint", (double)m->bytes_f32 / 1048576.0);
    if (r != QSA_OK) {
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", qsa_last_error());
        qsa_model_free(m);
        return qsa__fail(r, "%s", msg);
    }
    *out = m;
    return QSA_OK;
}

QSA_IMPL qsa_result qsa_model_load(const char *dir, const qsa_model_params *params, qsa_model **out) {
    if (!dir || !out) return qsa__fail(QSA_ERR_INVALID_ARGUMENT, "qsa_model_load: NULL argument");
    *out = NULL;
    double t0 = qsa__now();
    qsa_model *m;
    QSA__TRY(qsa__model_open(dir, params, 0, &m));
    qsa_result r = QSA_OK;
    if (m->params.tp > 1 && m->params.backend == QSA_BACKEND_CPU)
        r = qsa__fail(QSA_ERR_INVALID_ARGUMENT, "qsa_model_load: tp = %d needs the CUDA backend", m->params.tp);
    if (r == QSA_OK && m->params.backend != QSA_BACKEND_CPU) {
#ifdef QSA_NO_CUDA
        if (m->params.backend == QSA_BACKEND_CUDA) r = qsa__fail(QSA_ERR_UNSUPPORTED, "qsa_model_load: built with QSA_NO_CUDA");
#else
        QSA__DEF(m->params.max_chunk, 512);
        QSA__DEF(m->params.max_batch, 32);
        /* batched decode and its graphs: 0 means the default (on), a negative value off */
        m->params.cuda_batch_decode = m->params.cuda_batch_decode >= 0;
        m->params.cuda_graphs = m->params.cuda_graphs >= 0;
        /* the pool's page size is needed by the device allocation: settle it first */
        r = qsa__pool_create(m, 0);
        if (r == QSA_OK) r = m->params.tp > 1 ? qsa__tp_init(m) : qsa__cuda_init(m, &m->cuda);
        if (r == QSA_OK && m->cuda && !m->tp) qsa__model_drop_dense(m); /* uploaded: the host copies go */
        /* a rank of a multi-process group may not fall back: the others would wait for it */
        if (r != QSA_OK && m->params.backend == QSA_BACKEND_AUTO && !(m->params.tp > 1 && m->params.tp_rendezvous)) {
            qsa__log(QSA_LOG_INFO, "CUDA backend unavailable (%s): using the CPU backend", qsa_last_error());
            qsa__pool_destroy(&m->pool);
            r = QSA_OK;
        }
#endif
    }
    if (r == QSA_OK && !m->cuda) r = qsa__pool_create(m, 1);
    if (r == QSA_OK && m->cuda) {
        pthread_mutexattr_t a;
        int ok = pthread_mutexattr_init(&a) == 0;
        if (ok) {
            ok = pthread_mutexattr_settype(&a, PTHREAD_MUTEX_RECURSIVE) == 0 && pthread_mutex_init(&m->lock, &a) == 0;
            pthread_mutexattr_destroy(&a);
        }
        if (ok) m->lock_on = 1;
        else r = qsa__fail(QSA_ERR_OUT_OF_MEMORY, "qsa_model_load: cannot create the model's lock");
    }
    if (r == QSA_OK && !m->params.no_tokenizer) {
        char *tpath = qsa__path_join(dir, "tokenizer.json");
        if (!tpath) r = qsa__fail(QSA_ERR_OUT_OF_MEMORY, "qsa_model_load: out of memory");
        else if (qsa__file_exists(tpath)) r = qsa_tokenizer_load_dir(dir, &m->tok);
        qsa__free(tpath);
    }
    if (r != QSA_OK) {
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", qsa_last_error());
        qsa_model_free(m);
        return qsa__fail(r, "%s", msg);
    }
    qsa__log(QSA_LOG_INFO, "loaded %s: %d layers, hidden %d, %d experts, vocab %d in %.2f s (%s backend)", dir,
             m->cfg.num_hidden_layers, m->cfg.hidden_size, m->cfg.num_experts, m->cfg.vocab_size, qsa__now() - t0,
             m->cuda ? "CUDA" : "CPU");
    *out = m;
    return QSA_OK;
}

QSA_IMPL const qsa_model_config *qsa_model_get_config(const qsa_model *m) { return m ? &m->cfg : NULL; }
QSA_IMPL const qsa_tokenizer *qsa_model_get_tokenizer(const qsa_model *m) { return m ? m->tok : NULL; }
QSA_IMPL const qsa_generation_config *qsa_model_get_generation_config(const qsa_model *m) { return m ? &m->gen : NULL; }

/* ============================================================================================== */
/* >>cpu-forward  the CPU reference forward pass (fp32, plain loops)                              */
/* ============================================================================================== */

QSA_PRIV float qsa__sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }
QSA_PRIV float qsa__silu(float x) { return x / (1.0f + expf(-x)); }
QSA_PRIV float qsa__act(qsa_act a, float x) { return a == QSA_ACT_SIGMOID ? qsa__sigmoid(x) : qsa__silu(x); }
/* torch.nn.functional.softplus (beta 1, threshold 20) */
QSA_PRIV float qsa__softplus(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

QSA_PRIV const float qsa__e2m1_values[16] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f,
                                             -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

/* Row r of a linear map as fp32: an fp32 copy's in place; a row in the mapped file widened into tmp (the
   same values); NVFP4 dequantised into tmp. */
QSA_PRIV const float *qsa__lin_row(const qsa__lin *l, int r, float *tmp) {
    if (l->w) return l->w + (size_t)r * (size_t)l->in;
    if (!l->q) {
        qsa__tensor_to_f32_range(l->src, l->src_off + (size_t)r * (size_t)l->in, (size_t)l->in, tmp);
        return tmp;
    }
    const int ng = l->in / 16; /* (its groups of 16: qsa__st_get_nvfp4 takes rows of a positive multiple of 16) */
    QSA__INVARIANT(ng > 0);
    const uint8_t *q = l->q + (size_t)r * (size_t)(l->in / 2);
    const uint8_t *s = l->qscale + (size_t)r * (size_t)ng;
    for (int g = 0; g < ng; g++) {
        float scale = qsa__e4m3_to_f32(s[g]) * l->qscale2;
        for (int j = 0; j < 8; j++) {
            uint8_t b = q[g * 8 + j];
            tmp[g * 16 + 2 * j] = qsa__e2m1_values[b & 15] * scale;
            tmp[g * 16 + 2 * j + 1] = qsa__e2m1_values[b >> 4] * scale;
        }
    }
    return tmp;
}

/* Row `id` of the embedding table as fp32 (H values), from the fp32 copy or the mapped file. */
QSA_PRIV void qsa__embed_row(const qsa_model *m, int32_t id, float *dst) {
    size_t H = (size_t)m->cfg.hidden_size;
    if (m->embed) memcpy(dst, m->embed + (size_t)id * H, sizeof(float) * H);
    else qsa__tensor_to_f32_range(m->embed_t, (size_t)id * H, H, dst);
}

/* Y[t][r] = sum_i W[r][i] X[t][i] (+ bias[r]) for the T tokens of a chunk (rows of X ldx floats apart, of Y
   ldy apart).  Rows are taken four at a time (in place, widened from the file or dequantised), each once for
   all T; four tokens' sums run side by side for one row, and a token left over runs the four rows' sums side
   by side: independent chains, every sum still in index order, so each (token, row) gets the bits of the plain
   loop whatever T and the thread split (cpu/matmul_is_matvec_per_token).  Split over threads by rows. */
typedef struct qsa__mm_ctx {
    const qsa__lin *l;
    const float *X;
    float *Y;
    int T;
    size_t ldx, ldy;
    int failed[QSA__PAR_MAX];
} qsa__mm_ctx;
QSA_PRIV void qsa__mm_range(void *c, int k, size_t r0, size_t r1) {
    qsa__mm_ctx *v = (qsa__mm_ctx *)c;
    const qsa__lin *l = v->l;
    const int n = l->in, T = v->T;
    const size_t lx = v->ldx, ly = v->ldy;
    float *tmp = l->w ? NULL : QSA__ALLOC(float, 4 * (size_t)n);
    if (!l->w && !tmp) {
        v->failed[k] = 1;
        return;
    }
    for (size_t r = r0; r < r1; r += 4) {
        const int R = r1 - r < 4 ? (int)(r1 - r) : 4;
        const float *w[4];
        float b[4];
        for (int j = 0; j < R; j++) {
            w[j] = qsa__lin_row(l, (int)(r + j), tmp ? tmp + (size_t)j * n : NULL);
            b[j] = l->bias ? l->bias[r + j] : 0.0f;
        }
        int t = 0;
        for (; t + 4 <= T; t += 4) /* four tokens of one row at a time */
            for (int j = 0; j < R; j++) {
                const float *x0 = v->X + (size_t)t * lx, *x1 = x0 + lx, *x2 = x1 + lx, *x3 = x2 + lx, *wj = w[j];
                float a0 = 0.0f, a1 = 0.0f, a2 = 0.0f, a3 = 0.0f;
                for (int i = 0; i < n; i++) {
                    a0 += wj[i] * x0[i];
                    a1 += wj[i] * x1[i];
                    a2 += wj[i] * x2[i];
                    a3 += wj[i] * x3[i];
                }
                float *y = v->Y + (size_t)t * ly + r + j;
                y[0] = a0 + b[j];
                y[ly] = a1 + b[j];
                y[2 * ly] = a2 + b[j];
                y[3 * ly] = a3 + b[j];
            }
        for (; t < T; t++) { /* a token left over: four rows at a time */
            const float *x = v->X + (size_t)t * lx;
            float *y = v->Y + (size_t)t * ly + r;
            if (R == 4) {
                const float *w0 = w[0], *w1 = w[1], *w2 = w[2], *w3 = w[3];
                float a0 = 0.0f, a1 = 0.0f, a2 = 0.0f, a3 = 0.0f;
                for (int i = 0; i < n; i++) {
                    a0 += w0[i] * x[i];
                    a1 += w1[i] * x[i];
                    a2 += w2[i] * x[i];
                    a3 += w3[i] * x[i];
                }
                y[0] = a0 + b[0];
                y[1] = a1 + b[1];
                y[2] = a2 + b[2];
                y[3] = a3 + b[3];
            } else {
                for (int j = 0; j < R; j++) {
                    float a = 0.0f;
                    for (int i = 0; i < n; i++) a += w[j][i] * x[i];
                    y[j] = a + b[j];
                }
            }
        }
    }
    qsa__free(tmp);
}
QSA_PRIV qsa_result qsa__matmul(const qsa_model *m, const qsa__lin *l, const float *X, size_t ldx, int T, float *Y, size_t ldy) {
    size_t work = (size_t)l->out * (size_t)l->in * (size_t)(T > 0 ? T : 0);
    qsa__mm_ctx v;
    memset(&v, 0, sizeof v);
    v.l = l;
    v.X = X;
    v.Y = Y;
    v.T = T;
    v.ldx = ldx;
    v.ldy = ldy;
    if (T <= 0) return QSA_OK;
    qsa__par_ranges((size_t)l->out, work < (1u << 18) ? 1 : m->n_threads, qsa__mm_range, &v);
    for (int k = 0; k < QSA__PAR_MAX; k++)
        if (v.failed[k]) return qsa__fail(QSA_ERR_OUT_OF_MEMORY, "matmul: out of memory");
    return QSA_OK;
}

/* y = W x (+ bias): qsa__matmul of one token.  Large maps are split over threads by rows; each row's sum is
   the same whatever the split, so the result does not depend on the thread count. */
QSA_PRIV qsa_result qsa__matvec(const qsa_model *m, const qsa__lin *l, const float *x, float *y) {
    return qsa__matmul(m, l, x, (size_t)l->in, 1, y, (size_t)l->out);
}

/* RMSNorm over groups of `group` values: x * rsqrt(mean(x^2) + eps) * (1 + w) (zero-centred). */
QSA_PRIV void qsa__rmsnorm_1p(const float *x, const float *w, float *y, int n, int group, float eps) {
    for (int g0 = 0; g0 < n; g0 += group) {
        float ss = 0.0f;
        for (int i = 0; i < group; i++) ss += x[g0 + i] * x[g0 + i];
        float inv = 1.0f / sqrtf(ss / (float)group + eps);
        for (int i = 0; i < group; i++) y[g0 + i] = x[g0 + i] * inv * (1.0f + w[g0 + i]);
    }
}

/* Rotate the first rd values of x (rotate_half convention) for position pos. */
QSA_PRIV void qsa__rope(const qsa_model *m, float *x, int64_t pos) {
    int half = m->cfg.rotary_dim / 2;
    for (int i = 0; i < half; i++) {
        float f = (float)pos * m->rope_inv_freq[i];
        float c = (float)cos((double)f), s = (float)sin((double)f);
        float a = x[i], b = x[i + half];
        x[i] = a * c - b * s;
        x[i + half] = b * c + a * s;
    }
}

/* ---- per-sequence state ---- */

typedef struct qsa__seq_layer {
    /* Gated DeltaNet */
    float *conv;    /* [K-1][conv_dim]: the last K-1 inputs of the causal conv, oldest first */
    float *S;       /* [nv][dk][dv] recurrent state (fp32) */
    /* QSA: K, V and raw indexer keys live in the page pool; block keys are logical, per sequence */
    float *bkey;    /* [n_ctx / r][ihd] keys of completed blocks (mean, k_layernorm, RoPE) */
    int n_blocks;   /* completed blocks cached */
    /* PLE */
    int32_t *ple_ids; /* [ngram-1] previous token ids (EOS at the start) */
    float *ple_conv;  /* [(K-1)*dilation][hc*H] previous normalised conv inputs, oldest first */
} qsa__seq_layer;

/* Observer of QSA selections (tests, capture tools). */
typedef void (*qsa__sel_hook)(void *user, int layer, int64_t pos, const int32_t *blocks, int n_blocks,
                              const float *scores, int n_complete);

/* Debug capture of one QSA layer (qsa_seq_capture_begin / _end): every query's q|gate, selection,
   plan and gated attention output, in feed order. */
typedef struct qsa__capture {
    int layer;
    int n;                          /* queries recorded */
    qsa__buf pos, q, sel, nsel, out, seg, seg_off;
} qsa__capture;

struct qsa_seq {
    qsa_model *m;
    int pos, n_ctx;
    int32_t *tokens;            /* [n_ctx] every token fed */
    int32_t *bt;                /* block table: logical page -> physical page of the pool */
    int n_pages;                /* pages held */
    qsa__seq_layer *L;
    qsa__sel_hook sel_hook;
    void (*route_hook)(void *user, int layer, int64_t pos, float margin); /* MoE routing margins (CPU) */
    void *sel_user;                                                        /* user of both hooks */
    float *hidden_out;          /* if set: receives final hidden states [n][H] of the next feed */
    struct qsa__cuda_seq *cuda; /* device state on the CUDA backend (under TP: local rank 0's) */
    struct qsa__tp_seq *tp;     /* under TP: every local rank's device state and host-side layer state */
    qsa__capture *cap;          /* debug capture, NULL when off */
    int broken;                 /* a feed failed part-way through its forward pass (or the device state's
                                   zeroing failed): the states no longer match pos, so feeds are refused
                                   until qsa_seq_reset */
};

/* Make sure the sequence holds the pages for `need` tokens; all or nothing. */
QSA_PRIV qsa_result qsa__seq_reserve(qsa_seq *s, int need) {
    qsa__pool *pl = &s->m->pool;
    if (!pl->n_qsa) return QSA_OK;
    int want = (int)(((int64_t)need + pl->page_size - 1) / pl->page_size);
    if (want <= s->n_pages) return QSA_OK;
    pthread_mutex_lock(&pl->mu);
    int n_free = pl->n_free;
    if (want - s->n_pages > n_free) {
        pthread_mutex_unlock(&pl->mu);
        return qsa__fail(QSA_ERR_CONTEXT_FULL, "KV page pool: %d more pages of %d tokens needed, %d free of %d",
                         want - s->n_pages, pl->page_size, n_free, pl->n_pages);
    }
    while (s->n_pages < want) s->bt[s->n_pages++] = pl->free_pages[--pl->n_free];
    pthread_mutex_unlock(&pl->mu);
    return QSA_OK;
}

/* Give back the pages taken since n_pages was `had` (reverse order: the free list is restored exactly). */
QSA_PRIV void qsa__seq_unreserve(qsa_seq *s, int had) {
    qsa__pool *pl = &s->m->pool;
    if (s->n_pages <= had) return;
    pthread_mutex_lock(&pl->mu);
    while (s->n_pages > had) pl->free_pages[pl->n_free++] = s->bt[--s->n_pages];
    pthread_mutex_unlock(&pl->mu);
}

QSA_PRIV void qsa__seq_release(qsa_seq *s) { qsa__seq_unreserve(s, 0); }

QSA_PRIV void qsa__capture_clear(qsa__capture *c) {
    c->n = 0;
    c->pos.len = c->q.len = c->sel.len = c->nsel.len = c->out.len = c->seg.len = c->seg_off.len = 0;
}

QSA_PRIV void qsa__seq_reset(qsa_seq *s) {
    const qsa_model_config *c = &s->m->cfg;
    int key_dim = c->linear_num_key_heads * c->linear_key_head_dim;
    int conv_dim = 2 * key_dim + c->linear_num_value_heads * c->linear_value_head_dim;
    int hcH = c->hc_count * c->hidden_size;
    for (int l = 0; l < c->num_hidden_layers; l++) {
        qsa__seq_layer *sl = &s->L[l];
        if (sl->conv) memset(sl->conv, 0, sizeof(float) * (size_t)(c->linear_conv_kernel_dim - 1) * (size_t)conv_dim);
        if (sl->S)
            memset(sl->S, 0, sizeof(float) * (size_t)c->linear_num_value_heads * (size_t)c->linear_key_head_dim *
                                 (size_t)c->linear_value_head_dim);
        sl->n_blocks = 0;
        if (sl->ple_ids)
            for (int j = 0; j < c->ngram_size - 1; j++) sl->ple_ids[j] = c->eos_token_ids[0];
        if (sl->ple_conv)
            memset(sl->ple_conv, 0, sizeof(float) * (size_t)(c->ple_conv_kernel_size - 1) * (size_t)c->ngram_size * (size_t)hcH);
    }
    qsa__seq_release(s);
    if (s->cap) qsa__capture_clear(s->cap); /* its queries attended to the KV pages just given back */
    s->pos = 0;
    s->broken = 0;
#ifndef QSA_NO_CUDA
    /* the device state's zeroing (a driver call: it fails only with the context, e.g. after a kernel
       fault): the states would not match pos, so feeds are refused until a reset succeeds */
    if (s->cuda && qsa__cuda_seq_reset(s->m, s) != QSA_OK) s->broken = 1;
#endif
}
QSA_IMPL void qsa_seq_reset(qsa_seq *s) {
    if (!s) return;
    qsa_model *m = s->m;
    qsa__model_enter(m);
    qsa__seq_reset(s);
    qsa__model_leave(m);
}

QSA_PRIV void qsa__capture_free(qsa_seq *s) {
    qsa__capture *c = s->cap;
    if (!c) return;
    qsa__buf *bufs[7] = {&c->pos, &c->q, &c->sel, &c->nsel, &c->out, &c->seg, &c->seg_off};
    for (int i = 0; i < 7; i++) qsa__buf_free(bufs[i]);
    qsa__free(c);
    s->cap = NULL;
}

QSA_PRIV void qsa__seq_free(qsa_seq *s) {
    if (!s) return;
    if (s->L) {
        for (int l = 0; l < s->m->cfg.num_hidden_layers; l++) {
            qsa__seq_layer *sl = &s->L[l];
            qsa__free(sl->conv);
            qsa__free(sl->S);
            qsa__free(sl->bkey);
            qsa__free(sl->ple_ids);
            qsa__free(sl->ple_conv);
        }
        qsa__free(s->L);
    }
    qsa__seq_release(s);
    qsa__capture_free(s);
#ifndef QSA_NO_CUDA
    qsa__cuda_seq_destroy(s->m, s);
#endif
    qsa__free(s->bt);
    qsa__free(s->tokens);
    qsa__free(s);
}
QSA_IMPL void qsa_seq_free(qsa_seq *s) {
    if (!s) return;
    qsa_model *m = s->m;
    qsa__model_enter(m);
    qsa__seq_free(s);
    qsa__model_leave(m);
}

QSA_PRIV qsa_result qsa__seq_create(qsa_model *m, const qsa_seq_params *params, qsa_seq **out) {
    if (!m || !out) return qsa__fail(QSA_ERR_INVALID_ARGUMENT, "qsa_seq_create: NULL argument");
    *out = NULL;
    const qsa_model_config *c = &m->cfg;
    if (params && (params->n_ctx < 0 || params->n_ctx > c->max_position_embeddings))
        return qsa__fail(QSA_ERR_INVALID_ARGUMENT, "qsa_seq_create: n_ctx %d: expected 0 (max_position_embeddings) to %d",
                         params->n_ctx, c->max_position_embeddings);
    qsa_seq *s = QSA__CALLOC(qsa_seq, 1);
    if (!s) return qsa__fail(QSA_ERR_OUT_OF_MEMORY, "qsa_seq_create: out of memory");
    s->m = m;
    s->n_ctx = params && params->n_ctx > 0 ? params->n_ctx : c->max_position_embeddings;
    s->tokens = QSA__ALLOC(int32_t, s->n_ctx);
    s->bt = QSA__ALLOC(int32_t, s->n_ctx / m->pool.page_size + 1);
    s->L = QSA__CALLOC(qsa__seq_layer, c->num_hidden_layers);
    int ok = s->tokens && s->L && s->bt;
    int key_dim = c->linear_num_key_heads * c->linear_key_head_dim;
    int conv_dim = 2 * key_dim + c->linear_num_value_heads * c->linear_value_head_dim;
    int hcH = c->hc_count * c->hidden_size;
    int host = m->cuda == NULL; /* recurrent state and block keys live on the device otherwise */
    for (int l = 0; ok && l < c->num_hidden_layers; l++) {
        qsa__seq_layer *sl = &s->L[l];
        if (host && c->layer_types[l] == QSA_LAYER_LINEAR) {
            sl->conv = QSA__CALLOC(float, (size_t)(c->linear_conv_kernel_dim - 1) * (size_t)conv_dim);
            sl->S = QSA__CALLOC(float, (size_t)c->linear_num_value_heads * (size_t)c->linear_key_head_dim *
                                           (size_t)c->linear_value_head_dim);
            ok = sl->S && (sl->conv || c->linear_conv_kernel_dim == 1);
        }
        if (ok && host && c->layer_types[l] == QSA_LAYER_QSA && c->has_qsa) {
            sl->bkey = QSA__ALLOC(float, (size_t)(s->n_ctx / c->indexer_compress_ratio + 1) * (size_t)c->indexer_head_dim);
            ok = sl->bkey != NULL;
        }
        if (ok && m->layers[l].ple) {
            sl->ple_ids = QSA__ALLOC(int32_t, c->ngram_size);
            if (host) sl->ple_conv = QSA__CALLOC(float, (size_t)(c->ple_conv_kernel_size - 1) * (size_t)c->ngram_size * (size_t)hcH + 1);
            ok = sl->ple_ids && (sl->ple_conv || !host);
        }
    }
    if (!ok) {
        qsa_seq_free(s);
        return qsa__fail(QSA_ERR_OUT_OF_MEMORY, "qsa_seq_create: out of memory");
    }
#ifndef QSA_NO_CUDA
    if (m->cuda) {
        qsa_result r = qsa__cuda_seq_create(m, s);
        if (r != QSA_OK) { qsa_seq_free(s); return r; }
    }
#endif
    qsa_seq_reset(s);
    *out = s;
    return QSA_OK;
}
QSA_IMPL qsa_result qsa_seq_create(qsa_model *m, const qsa_seq_params *params, qsa_seq **out) {
    qsa__model_enter(m);
    qsa_result r = qsa__seq_create(m, params, out);
    qsa__model_leave(m);
    return r;
}

QSA_IMPL int qsa_seq_pos(const qsa_seq *s) { return s ? s->pos : 0; }

/* ---- layer math ---- */

/* Scratch buffers for one chunk of n tokens. */
typedef struct qsa__scratch {
    float *xn, *mw;         /* [n][hcH]: GatedResidual's normed streams and mix weights (the PLE: one token's) */
    float *low;             /* [n][hc_lowrank]: GatedResidual's low rank */
    float *inj;             /* [n][hc] injection weights */
    float *inp, *out;       /* [n][H] layer input / output */
} qsa__scratch;

/* GatedResidual on the streams X[n][hcH] of n tokens: writes the mixed inputs inp[n][H] and inj[n][hc] (if
   any), with sc's xn, mw and low (sized for n tokens).  Its projections by qsa__matmul over the n tokens
   (each token's bits as its own matvecs). */
QSA_PRIV qsa_result qsa__gres_chunk(const qsa_model *m, const qsa__gres *g, const float *X, int n, float *inp, float *inj,
                                    qsa__scratch *sc) {
    const qsa_model_config *c = &m->cfg;
    int H = c->hidden_size, hc = c->hc_count, hcH = hc * H, R = c->hc_lowrank;
    float *xn = sc->xn, *mw = sc->mw, *low = sc->low;
    /* xn = group RMSNorm of the streams */
    for (int t = 0; t < n; t++) qsa__rmsnorm_1p(X + (size_t)t * hcH, g->norm_w, xn + (size_t)t * hcH, hcH, H, c->rms_norm_eps);
    /* w = sigmoid(up(silu(down(xn) / hc))) */
    QSA__TRY(qsa__matmul(m, &g->down, xn, (size_t)hcH, n, low, (size_t)R));
    for (size_t i = 0; i < (size_t)n * R; i++) low[i] = qsa__silu(low[i] / (float)hc);
    QSA__TRY(qsa__matmul(m, &g->up, low, (size_t)R, n, mw, (size_t)hcH));
    /* input = mean over streams of w * xn */
    for (int t = 0; t < n; t++) {
        const float *wt = mw + (size_t)t * hcH, *xt = xn + (size_t)t * hcH;
        for (int j = 0; j < H; j++) {
            float acc = 0.0f;
            for (int s = 0; s < hc; s++) acc += qsa__sigmoid(wt[s * H + j]) * xt[s * H + j];
            inp[(size_t)t * H + j] = acc / (float)hc;
        }
    }
    /* injection = 2 * sigmoid(inject(xn) / hc) per stream */
    if (inj) {
        QSA__TRY(qsa__matmul(m, &g->inject, xn, (size_t)hcH, n, inj, (size_t)hc));
        for (size_t i = 0; i < (size_t)n * hc; i++) inj[i] = 2.0f * qsa__sigmoid(inj[i] / (float)hc);
    }
    return QSA_OK;
}

/* new stream s = old stream s + inj[s] * out */
QSA_PRIV void qsa__inject(const qsa_model_config *c, float *x, const float *inj, const float *out) {
    int H = c->hidden_size;
    for (int s = 0; s < c->hc_count; s++)
        for (int j = 0; j < H; j++) x[s * H + j] += inj[s] * out[j];
}

/* The concatenated n-gram embedding rows e[D] of the token win[ctx] given the ctx tokens before it
   (win[0..ctx), oldest first): per n-gram order and head, (XOR of token*multiplier) mod prime +
   offset, with tokens beyond an EOS replaced by EOS. */
QSA_PRIV void qsa__ple_embed_cols(const qsa_model_config *c, const qsa__ple_w *p, const int32_t *win, int col0, int ncols,
                                   float *e);
QSA_PRIV void qsa__ple_embed(const qsa_model_config *c, const qsa__ple_w *p, const int32_t *win, float *e) {
    qsa__ple_embed_cols(c, p, win, 0, c->ple_embed_dim / ((c->ngram_size - 1) * c->heads_per_ngram), e);
}

/* The same for columns [col0, col0 + ncols) of every head's row (a tensor-parallel rank's share of the
   table): e[head * ncols + i] = row[col0 + i]. */
QSA_PRIV void qsa__ple_embed_cols(const qsa_model_config *c, const qsa__ple_w *p, const int32_t *win, int col0, int ncols,
                                   float *e) {
    int ctx = c->ngram_size - 1;
    int32_t eos = c->eos_token_ids[0];
    /* shifted[j] = token j places back within the current EOS-delimited segment, else EOS */
    int64_t shifted[16];
    int blocked = 0;
    shifted[0] = win[ctx];
    for (int j = 1; j <= ctx; j++) {
        if (win[ctx - j] == eos) blocked = 1;
        shifted[j] = blocked ? eos : win[ctx - j];
    }
    for (int ng = 2; ng <= c->ngram_size; ng++) {
        uint64_t mixed = (uint64_t)shifted[0] * (uint64_t)p->mult[0];
        for (int j = 1; j < ng; j++) mixed ^= (uint64_t)shifted[j] * (uint64_t)p->mult[j];
        int64_t mv = (int64_t)mixed;
        for (int hh = 0; hh < c->heads_per_ngram; hh++) {
            int head = (ng - 2) * c->heads_per_ngram + hh;
            int64_t mod = mv % p->head_vocab[head];
            if (mod < 0) mod += p->head_vocab[head];
            const uint8_t *src = qsa__rows_view_row(&p->table, mod + p->head_offset[head]);
            QSA__INVARIANT(src != NULL); /* (the heads' offsets and vocabularies tile the table's rows: qsa__load_ple) */
            float *dst = e + (size_t)head * ncols;
            src += (size_t)col0 * (p->table.dtype == QSA__F32 ? 4 : 2);
            for (int i = 0; i < ncols; i++) {
                if (p->table.dtype == QSA__F32) memcpy(&dst[i], src + 4 * i, 4);
                else {
                    uint16_t u;
                    memcpy(&u, src + 2 * i, 2);
                    dst[i] = p->table.dtype == QSA__F16 ? qsa__f16_to_f32(u) : qsa__bf16_to_f32(u);
                }
            }
        }
    }
}

/* PLE: adds the hashed n-gram features of tokens ids[0..n) to the streams X[n][hcH]. */
QSA_PRIV qsa_result qsa__ple_fwd(qsa_seq *sq, int l, const int32_t *ids, int n, float *X, qsa__scratch *sc) {
    const qsa_model *m = sq->m;
    const qsa_model_config *c = &m->cfg;
    const qsa__ple_w *p = m->layers[l].ple;
    qsa__seq_layer *sl = &sq->L[l];
    int H = c->hidden_size, hcH = c->hc_count * H, D = c->ple_embed_dim;
    QSA__INVARIANT(H > 0 && c->hc_count > 0 && n > 0);
    int ctx = c->ngram_size - 1;
    int K = c->ple_conv_kernel_size, dil = c->ngram_size, state_len = (K - 1) * dil;
    float *e = QSA__ALLOC(float, D), *key = QSA__ALLOC(float, hcH), *val = QSA__ALLOC(float, H);
    float *gv = QSA__ALLOC(float, (size_t)n * hcH), *gvn = QSA__ALLOC(float, (size_t)(state_len + n) * hcH);
    int32_t *hist = QSA__ALLOC(int32_t, ctx + n);
    qsa_result r = QSA_OK;
    if (!e || !key || !val || !gv || !gvn || !hist) { r = qsa__fail(QSA_ERR_OUT_OF_MEMORY, "PLE: out of memory"); goto done; }
    /* token history: the previous ctx ids (EOS at the sequence start), then this chunk */
    for (int j = 0; j < ctx; j++) hist[j] = sl->ple_ids[j];
    for (int t = 0; t < n; t++) hist[ctx + t] = ids[t];
    if (state_len) memcpy(gvn, sl->ple_conv, sizeof(float) * (size_t)state_len * hcH);
    for (int t = 0; t < n; t++) {
        qsa__ple_embed(c, p, hist + t, e);
        /* key per stream (group-normed), one shared value */
        if ((r = qsa__matvec(m, &p->key, e, sc->mw)) != QSA_OK) goto done;
        qsa__rmsnorm_1p(sc->mw, p->norm_key, key, hcH, H, c->rms_norm_eps);
        if ((r = qsa__matvec(m, &p->value, e, val)) != QSA_OK) goto done;
        /* query = group-normed streams (before this layer's PLE) */
        const float *x = X + (size_t)t * hcH;
        qsa__rmsnorm_1p(x, p->norm_query, sc->xn, hcH, H, c->rms_norm_eps);
        float *g = gv + (size_t)t * hcH;
        for (int s = 0; s < c->hc_count; s++) {
            float dot = 0.0f;
            for (int j = 0; j < H; j++) dot += key[s * H + j] * sc->xn[s * H + j];
            float gate = dot / sqrtf((float)H);
            float mag = sqrtf(fmaxf(fabsf(gate), 1e-6f));
            gate = gate > 0 ? mag : gate < 0 ? -mag : 0.0f;
            float sg = qsa__sigmoid(gate);
            for (int j = 0; j < H; j++) g[s * H + j] = sg * val[j];
        }
        qsa__rmsnorm_1p(g, p->norm_conv, gvn + (size_t)(state_len + t) * hcH, hcH, H, c->rms_norm_eps);
    }
    /* out = gv + silu(dilated causal depthwise conv of the normed values) */
    for (int t = 0; t < n; t++) {
        float *x = X + (size_t)t * hcH;
        const float *g = gv + (size_t)t * hcH;
        for (int ch = 0; ch < hcH; ch++) {
            float acc = 0.0f;
            for (int k = 0; k < K; k++) acc += p->conv_w[ch * K + k] * gvn[(size_t)(t + k * dil) * hcH + ch];
            x[ch] += g[ch] + qsa__silu(acc);
        }
    }
    /* carry the state: last ctx ids and last state_len normed columns */
    for (int j = 0; j < ctx; j++) sl->ple_ids[j] = hist[n + j];
    if (state_len) memcpy(sl->ple_conv, gvn + (size_t)n * hcH, sizeof(float) * (size_t)state_len * hcH);
done:
    qsa__free(e); qsa__free(key); qsa__free(val); qsa__free(gv); qsa__free(gvn); qsa__free(hist);
    return r;
}

/* Gated DeltaNet core on the normalised q, k (per key head) and v, beta, g of n tokens, recurrent
   form: S *= exp(g); kv = S^T k; d = (v - kv) * beta; S += k d^T; o = S^T q. */
QSA_PRIV qsa_result qsa__gdn_recurrent(const qsa_model_config *c, float *S, const float *q, const float *k, const float *v,
                                       const float *beta, const float *g, float *o, int n) {
    int nk = c->linear_num_key_heads, nv = c->linear_num_value_heads, dk = c->linear_key_head_dim,
        dv = c->linear_value_head_dim, rep = nv / nk;
    float *kv = QSA__ALLOC(float, dv);
    if (!kv) return qsa__fail(QSA_ERR_OUT_OF_MEMORY, "GDN: out of memory");
    for (int t = 0; t < n; t++) {
        for (int h = 0; h < nv; h++) {
            float *Sh = S + (size_t)h * dk * dv;
            const float *qt = q + ((size_t)t * nk + h / rep) * dk, *kt = k + ((size_t)t * nk + h / rep) * dk;
            const float *vt = v + ((size_t)t * nv + h) * dv;
            float decay = expf(g[t * nv + h]), b = beta[t * nv + h];
            for (int i = 0; i < dk * dv; i++) Sh[i] *= decay;
            for (int j = 0; j < dv; j++) kv[j] = 0.0f;
            for (int i = 0; i < dk; i++)
                for (int j = 0; j < dv; j++) kv[j] += Sh[i * dv + j] * kt[i];
            for (int j = 0; j < dv; j++) kv[j] = (vt[j] - kv[j]) * b;
            for (int i = 0; i < dk; i++)
                for (int j = 0; j < dv; j++) Sh[i * dv + j] += kt[i] * kv[j];
            float *ot = o + ((size_t)t * nv + h) * dv;
            for (int j = 0; j < dv; j++) ot[j] = 0.0f;
            for (int i = 0; i < dk; i++)
                for (int j = 0; j < dv; j++) ot[j] += Sh[i * dv + j] * qt[i];
        }
    }
    qsa__free(kv);
    return QSA_OK;
}

/* The same computation in the chunked form of the reference (UT transform within chunks of C tokens,
   one state update per chunk).  Agrees with the recurrence within rounding. */
QSA_PRIV qsa_result qsa__gdn_chunked(const qsa_model_config *c, float *S, const float *q, const float *k,
                                     const float *v, const float *beta, const float *g, float *o, int n, int C) {
    int nk = c->linear_num_key_heads, nv = c->linear_num_value_heads, dk = c->linear_key_head_dim,
        dv = c->linear_value_head_dim, rep = nv / nk;
    size_t need = (size_t)C * C * 2 + (size_t)C * dv * 2 + (size_t)C * dk * 2 + (size_t)C + (size_t)dk * dv;
    float *buf = QSA__ALLOC(float, need);
    if (!buf) return qsa__fail(QSA_ERR_OUT_OF_MEMORY, "GDN chunked prefill: out of memory");
    float *A = buf, *QK = A + (size_t)C * C, *U = QK + (size_t)C * C, *W = U + (size_t)C * dv,
          *Vn = W + (size_t)C * dk, *cum = Vn + (size_t)C * dv, *Kd = cum + C;
    (void)Kd;
    for (int h = 0; h < nv; h++) {
        float *Sh = S + (size_t)h * dk * dv;
        int kh = h / rep;
        for (int c0 = 0; c0 < n; c0 += C) {
            int L = n - c0 < C ? n - c0 : C;
#define QQ(t) (q + ((size_t)(c0 + (t)) * nk + kh) * dk)
#define KK(t) (k + ((size_t)(c0 + (t)) * nk + kh) * dk)
#define VV(t) (v + ((size_t)(c0 + (t)) * nv + h) * dv)
            /* cumulative log decay within the chunk */
            float acc = 0.0f;
            for (int t = 0; t < L; t++) { acc += g[(c0 + t) * nv + h]; cum[t] = acc; }
            /* A[i][j] = beta_i (k_i . k_j) exp(cum_i - cum_j) for j < i (strictly lower) */
            for (int i = 0; i < L; i++) {
                float bi = beta[(c0 + i) * nv + h];
                for (int j = 0; j < L; j++) {
                    float kk = 0.0f, qk = 0.0f;
                    if (j <= i) {
                        for (int d = 0; d < dk; d++) { kk += KK(i)[d] * KK(j)[d]; qk += QQ(i)[d] * KK(j)[d]; }
                    }
                    float decay = j <= i ? expf(cum[i] - cum[j]) : 0.0f;
                    A[i * C + j] = j < i ? bi * kk * decay : 0.0f;
                    QK[i * C + j] = qk * decay;
                }
            }
            /* solve (I + A) U = beta v and (I + A) W = beta k exp(cum) by forward substitution */
            for (int i = 0; i < L; i++) {
                float bi = beta[(c0 + i) * nv + h], ec = expf(cum[i]);
                for (int d = 0; d < dv; d++) {
                    float s = bi * VV(i)[d];
                    for (int j = 0; j < i; j++) s -= A[i * C + j] * U[j * dv + d];
                    U[i * dv + d] = s;
                }
                for (int d = 0; d < dk; d++) {
                    float s = bi * KK(i)[d] * ec;
                    for (int j = 0; j < i; j++) s -= A[i * C + j] * W[j * dk + d];
                    W[i * dk + d] = s;
                }
            }
            /* v_new = U - W S;  o = (q exp(cum)) S + QK v_new */
            for (int i = 0; i < L; i++)
                for (int d = 0; d < dv; d++) {
                    float s = U[i * dv + d];
                    for (int e = 0; e < dk; e++) s -= W[i * dk + e] * Sh[e * dv + d];
                    Vn[i * dv + d] = s;
                }
            for (int i = 0; i < L; i++) {
                float ec = expf(cum[i]);
                float *ot = o + ((size_t)(c0 + i) * nv + h) * dv;
                for (int d = 0; d < dv; d++) {
                    float s = 0.0f;
                    for (int e = 0; e < dk; e++) s += QQ(i)[e] * ec * Sh[e * dv + d];
                    for (int j = 0; j <= i; j++) s += QK[i * C + j] * Vn[j * dv + d];
                    ot[d] = s;
                }
            }
            /* S = S exp(cum_last) + sum_i (k_i exp(cum_last - cum_i)) v_new_i^T */
            float last = cum[L - 1], el = expf(last);
            for (int e = 0; e < dk * dv; e++) Sh[e] *= el;
            for (int i = 0; i < L; i++) {
                float w = expf(last - cum[i]);
                for (int e = 0; e < dk; e++) {
                    float ke = KK(i)[e] * w;
                    for (int d = 0; d < dv; d++) Sh[e * dv + d] += ke * Vn[i * dv + d];
                }
            }
#undef QQ
#undef KK
#undef VV
        }
    }
    qsa__free(buf);
    return QSA_OK;
}

/* x * rsqrt(sum(x^2) + 1e-6) */
QSA_PRIV void qsa__l2norm(float *x, int n) {
    float ss = 0.0f;
    for (int i = 0; i < n; i++) ss += x[i] * x[i];
    float inv = 1.0f / sqrtf(ss + 1e-6f);
    for (int i = 0; i < n; i++) x[i] *= inv;
}

QSA_PRIV qsa_result qsa__gdn_fwd(qsa_seq *sq, int l, const float *inp, float *out, int n) {
    const qsa_model *m = sq->m;
    const qsa_model_config *c = &m->cfg;
    const qsa__gdn_w *w = &m->layers[l].gdn;
    qsa__seq_layer *sl = &sq->L[l];
    int nk = c->linear_num_key_heads, nv = c->linear_num_value_heads, dk = c->linear_key_head_dim,
        dv = c->linear_value_head_dim, K = c->linear_conv_kernel_dim, H = c->hidden_size;
    int key_dim = nk * dk, value_dim = nv * dv, conv_dim = 2 * key_dim + value_dim;
    float *qkv = QSA__ALLOC(float, (size_t)(K - 1 + n) * conv_dim);
    float *q = QSA__ALLOC(float, (size_t)n * key_dim), *k = QSA__ALLOC(float, (size_t)n * key_dim);
    float *v = QSA__ALLOC(float, (size_t)n * value_dim), *z = QSA__ALLOC(float, (size_t)n * value_dim);
    float *o = QSA__ALLOC(float, (size_t)n * value_dim);
    float *beta = QSA__ALLOC(float, (size_t)n * nv), *g = QSA__ALLOC(float, (size_t)n * nv);
    float *bb = QSA__ALLOC(float, (size_t)n * nv), *aa = QSA__ALLOC(float, (size_t)n * nv);
    qsa_result r = QSA_OK;
    if (!qkv || !q || !k || !v || !z || !o || !beta || !g || !bb || !aa) { r = qsa__fail(QSA_ERR_OUT_OF_MEMORY, "GDN: out of memory"); goto done; }
    /* projections of the whole chunk; conv inputs are laid out after the K-1 carried columns */
    if (K > 1) memcpy(qkv, sl->conv, sizeof(float) * (size_t)(K - 1) * conv_dim);
    if ((r = qsa__matmul(m, &w->in_qkv, inp, (size_t)H, n, qkv + (size_t)(K - 1) * conv_dim, (size_t)conv_dim)) != QSA_OK) goto done;
    if ((r = qsa__matmul(m, &w->in_z, inp, (size_t)H, n, z, (size_t)value_dim)) != QSA_OK) goto done;
    if ((r = qsa__matmul(m, &w->in_b, inp, (size_t)H, n, bb, (size_t)nv)) != QSA_OK) goto done;
    if ((r = qsa__matmul(m, &w->in_a, inp, (size_t)H, n, aa, (size_t)nv)) != QSA_OK) goto done;
    for (int t = 0; t < n; t++)
        for (int h = 0; h < nv; h++) {
            beta[t * nv + h] = qsa__sigmoid(bb[t * nv + h]);
            g[t * nv + h] = -expf(w->A_log[h]) * qsa__softplus(aa[t * nv + h] + w->dt_bias[h]);
        }
    /* causal depthwise conv (kernel K) + activation, then split into q, k, v */
    for (int t = 0; t < n; t++) {
        for (int ch = 0; ch < conv_dim; ch++) {
            float acc = 0.0f;
            for (int j = 0; j < K; j++) acc += w->conv_w[ch * K + j] * qkv[(size_t)(t + j) * conv_dim + ch];
            float y = qsa__act(c->hidden_act, acc);
            if (ch < key_dim) q[(size_t)t * key_dim + ch] = y;
            else if (ch < 2 * key_dim) k[(size_t)t * key_dim + ch - key_dim] = y;
            else v[(size_t)t * value_dim + ch - 2 * key_dim] = y;
        }
        /* L2-normalise q and k per head; scale q by dk^-0.5 */
        for (int h = 0; h < nk; h++) {
            float *qh = q + (size_t)t * key_dim + h * dk, *kh = k + (size_t)t * key_dim + h * dk;
            qsa__l2norm(qh, dk);
            qsa__l2norm(kh, dk);
            float sc = 1.0f / sqrtf((float)dk);
            for (int i = 0; i < dk; i++) qh[i] *= sc;
        }
    }
    if (K > 1) memcpy(sl->conv, qkv + (size_t)n * conv_dim, sizeof(float) * (size_t)(K - 1) * conv_dim);
    if (m->params.gdn_chunked_prefill && n > 1)
        r = qsa__gdn_chunked(c, sl->S, q, k, v, beta, g, o, n, m->params.gdn_chunk_size);
    else
        r = qsa__gdn_recurrent(c, sl->S, q, k, v, beta, g, o, n);
    if (r != QSA_OK) goto done;
    /* gated RMSNorm per head: (o * rsqrt(mean(o^2) + eps)) * w * act(z), then out_proj */
    for (int t = 0; t < n; t++) {
        float *ot = o + (size_t)t * value_dim;
        const float *zt = z + (size_t)t * value_dim;
        for (int h = 0; h < nv; h++) {
            float ss = 0.0f;
            for (int j = 0; j < dv; j++) ss += ot[h * dv + j] * ot[h * dv + j];
            float inv = 1.0f / sqrtf(ss / (float)dv + c->rms_norm_eps);
            for (int j = 0; j < dv; j++)
                ot[h * dv + j] = w->norm_w[j] * (ot[h * dv + j] * inv) * qsa__act(c->output_gate_act, zt[h * dv + j]);
        }
    }
    r = qsa__matmul(m, &w->out, o, (size_t)value_dim, n, out, (size_t)H);
done:
    qsa__free(qkv); qsa__free(q); qsa__free(k); qsa__free(v); qsa__free(z); qsa__free(o); qsa__free(beta); qsa__free(g);
    qsa__free(bb); qsa__free(aa);
    return r;
}

/* Block b's key from its r raw keys keys[r][ihd]: fp32 mean, k_layernorm, RoPE at position b*r. */
QSA_PRIV void qsa__block_key(const qsa_model *m, const qsa__attn_w *a, const float *keys, int b, float *out) {
    const qsa_model_config *c = &m->cfg;
    int ihd = c->indexer_head_dim, r = c->indexer_compress_ratio;
    /* the mean in out itself (indexer_head_dim may be up to 1 << 14: no fixed stack array); the norm runs in place */
    for (int d = 0; d < ihd; d++) {
        float s = 0.0f;
        for (int t = 0; t < r; t++) s += keys[(size_t)t * ihd + d];
        out[d] = s / (float)r;
    }
    qsa__rmsnorm_1p(out, a->idx_k_norm, out, ihd, ihd, c->rms_norm_eps);
    qsa__rope(m, out, (int64_t)b * r);
}

/* Top-k blocks by score: higher score first, then lower block index (the reference leaves ties
   open; this is our definition).  Returns the selection sorted by ascending block index. */
/* Block a ranks below block b: lower score, or the same score and a higher index. */
QSA_PRIV int qsa__block_worse(const float *scores, int32_t a, int32_t b) {
    return scores[a] < scores[b] || (scores[a] == scores[b] && a > b);
}

/* Sift down in a heap of n blocks whose root is the worst (a min-heap in ranking order). */
QSA_PRIV void qsa__block_heap_down(const float *scores, int32_t *h, int i, int n) {
    for (;;) {
        int c = 2 * i + 1;
        if (c >= n) return;
        if (c + 1 < n && qsa__block_worse(scores, h[c + 1], h[c])) c++;
        if (!qsa__block_worse(scores, h[c], h[i])) return;
        int32_t t = h[i]; h[i] = h[c]; h[c] = t;
        i = c;
    }
}

/* Sift down in a max-heap of block indices (for the final ascending sort). */
QSA_PRIV void qsa__index_heap_down(int32_t *h, int i, int n) {
    for (;;) {
        int c = 2 * i + 1;
        if (c >= n) return;
        if (c + 1 < n && h[c + 1] > h[c]) c++;
        if (h[c] <= h[i]) return;
        int32_t t = h[i]; h[i] = h[c]; h[c] = t;
        i = c;
    }
}

QSA_PRIV int qsa__select_blocks(const float *scores, int nb, int k, int32_t *sel) {
    if (k > nb) k = nb;
    if (k <= 0) return 0;
    /* the k best blocks in a heap whose root is the worst of them: O(nb log k) */
    int n = 0;
    for (int32_t b = 0; b < nb; b++) {
        if (n < k) {
            int i = n++;
            sel[i] = b;
            while (i > 0 && qsa__block_worse(scores, sel[i], sel[(i - 1) / 2])) {
                int32_t t = sel[i]; sel[i] = sel[(i - 1) / 2]; sel[(i - 1) / 2] = t;
                i = (i - 1) / 2;
            }
        } else if (qsa__block_worse(scores, sel[0], b)) {
            sel[0] = b;
            qsa__block_heap_down(scores, sel, 0, n);
        }
    }
    /* ascending block order (heap sort) */
    for (int i = n / 2 - 1; i >= 0; i--) qsa__index_heap_down(sel, i, n);
    for (int e = n - 1; e > 0; e--) {
        int32_t t = sel[0]; sel[0] = sel[e]; sel[e] = t;
        qsa__index_heap_down(sel, 0, e);
    }
    return n;
}

/* Attention of one query head over a plan: scores and softmax in fp32, reduced in plan order with
   splits every QSA_ATTN_SPLIT selected tokens and a left-to-right merge of (max, sum, out). */
QSA_PRIV void qsa__attn_head_plan(const qsa__pool *pool, int slot, const qsa__plan *pl, const float *q, int kh, int hd,
                                  float *o, float *acc) {
    float scale = 1.0f / sqrtf((float)hd);
    float M = -INFINITY, Lsum = 0.0f, m = -INFINITY, l = 0.0f;
    for (int d = 0; d < hd; d++) o[d] = 0.0f;
    for (int d = 0; d < hd; d++) acc[d] = 0.0f;
    int k = 0;
    for (int si = 0; si < pl->n_seg; si++) {
        const qsa__seg *sg = &pl->seg[si];
        for (int j = 0; j < sg->len; j++, k++) {
            const float *kk = qsa__pool_k(pool, slot, sg->page, sg->offset + j) + kh * hd;
            const float *vv = qsa__pool_v(pool, slot, sg->page, sg->offset + j) + kh * hd;
            float sc = 0.0f;
            for (int d = 0; d < hd; d++) sc += q[d] * kk[d];
            sc *= scale;
            /* online softmax within the split */
            if (sc > m) {
                float f = expf(m - sc);
                l *= f;
                for (int d = 0; d < hd; d++) acc[d] *= f;
                m = sc;
            }
            float e = expf(sc - m);
            l += e;
            for (int d = 0; d < hd; d++) acc[d] += e * vv[d];
            if ((k + 1) % QSA_ATTN_SPLIT == 0 || k + 1 == pl->n_tokens) {
                /* merge this split's (m, l, acc) into the running (M, Lsum, o) */
                float Mn = m > M ? m : M, fa = expf(M - Mn), fb = expf(m - Mn);
                Lsum = Lsum * fa + l * fb;
                for (int d = 0; d < hd; d++) o[d] = o[d] * fa + acc[d] * fb;
                M = Mn;
                m = -INFINITY; l = 0.0f;
                for (int d = 0; d < hd; d++) acc[d] = 0.0f;
            }
        }
    }
    for (int d = 0; d < hd; d++) o[d] /= Lsum;
}

/* Append one query to a capture. */
QSA_PRIV qsa_result qsa__capture_query(qsa__capture *cp, int64_t pos, const float *q, int nq, const int32_t *sel, int ns,
                                       int topk, const qsa__plan *pl, const float *out, int nout) {
    int32_t pad = -1, off = (int32_t)(cp->seg.len / sizeof(int32_t) / 4), ns32 = ns;
    int ok = qsa__buf_put(&cp->pos, &pos, 8) && qsa__buf_put(&cp->q, q, sizeof(float) * (size_t)nq) &&
             qsa__buf_put(&cp->nsel, &ns32, 4) && qsa__buf_put(&cp->out, out, sizeof(float) * (size_t)nout) &&
             qsa__buf_put(&cp->seg_off, &off, 4);
    for (int i = 0; ok && i < topk; i++) ok = qsa__buf_put(&cp->sel, i < ns ? &sel[i] : &pad, 4);
    for (int i = 0; ok && i < pl->n_seg; i++) ok = qsa__buf_put(&cp->seg, &pl->seg[i], sizeof(qsa__seg));
    if (!ok) return qsa__fail(QSA_ERR_OUT_OF_MEMORY, "capture: out of memory");
    cp->n++;
    return QSA_OK;
}

QSA_PRIV qsa_result qsa__attn_fwd(qsa_seq *sq, int l, const float *inp, float *out, int n) {
    const qsa_model *m = sq->m;
    const qsa_model_config *c = &m->cfg;
    const qsa__attn_w *a = &m->layers[l].attn;
    const qsa__pool *pool = &m->pool;
    qsa__seq_layer *sl = &sq->L[l];
    int H = c->hidden_size, nh = c->num_attention_heads, nkv = c->num_key_value_heads, hd = c->head_dim;
    int grp = nh / nkv, p0 = sq->pos, slot = pool->slot[l], ps = pool->page_size;
    int ih = c->indexer_n_heads, ihd = c->indexer_head_dim, r = c->has_qsa ? c->indexer_compress_ratio : 1;
    int topk = c->has_qsa ? c->indexer_budget / r : 0;
    float *qg = QSA__ALLOC(float, (size_t)n * nh * hd * 2);
    float *kg = QSA__ALLOC(float, (size_t)n * nkv * hd), *vg = QSA__ALLOC(float, (size_t)n * nkv * hd);
    float *iq = QSA__ALLOC(float, (size_t)n * (ih + 1) * ihd + 1);
    float *atts = QSA__ALLOC(float, (size_t)n * nh * hd), *acc = QSA__ALLOC(float, hd);
    float *scores = QSA__ALLOC(float, (size_t)(p0 + n) / r + 1);
    int32_t *sel = QSA__ALLOC(int32_t, topk + 1);
    float *ikeys = QSA__ALLOC(float, (size_t)r * ihd + 1);
    qsa__plan plan;
    memset(&plan, 0, sizeof plan);
    qsa_result res = QSA_OK;
    if (!qg || !kg || !vg || !iq || !atts || !acc || !scores || !sel || !ikeys) { res = qsa__fail(QSA_ERR_OUT_OF_MEMORY, "attention: out of memory"); goto done; }
    /* 1. projections of the whole chunk; K, V and raw indexer keys go to each token's page */
    if ((res = qsa__matmul(m, &a->q, inp, (size_t)H, n, qg, (size_t)nh * hd * 2)) != QSA_OK) goto done;
    if ((res = qsa__matmul(m, &a->k, inp, (size_t)H, n, kg, (size_t)nkv * hd)) != QSA_OK) goto done;
    if ((res = qsa__matmul(m, &a->v, inp, (size_t)H, n, vg, (size_t)nkv * hd)) != QSA_OK) goto done;
    if (c->has_qsa && (res = qsa__matmul(m, &a->idx_qk, inp, (size_t)H, n, iq, (size_t)(ih + 1) * ihd)) != QSA_OK) goto done;
    for (int t = 0; t < n; t++) {
        int64_t pos = p0 + t;
        int32_t page = sq->bt[pos / ps];
        int off = (int)(pos % ps);
        float *qt = qg + (size_t)t * nh * hd * 2;
        float *kt = qsa__pool_k(pool, slot, page, off), *vt = qsa__pool_v(pool, slot, page, off);
        memcpy(kt, kg + (size_t)t * nkv * hd, sizeof(float) * (size_t)nkv * hd);
        memcpy(vt, vg + (size_t)t * nkv * hd, sizeof(float) * (size_t)nkv * hd);
        for (int h = 0; h < nh; h++) { /* q_norm then RoPE on the q half of [q | gate] */
            float *qh = qt + (size_t)h * 2 * hd;
            qsa__rmsnorm_1p(qh, a->q_norm, qh, hd, hd, c->rms_norm_eps);
            qsa__rope(m, qh, pos);
        }
        for (int h = 0; h < nkv; h++) {
            qsa__rmsnorm_1p(kt + h * hd, a->k_norm, kt + h * hd, hd, hd, c->rms_norm_eps);
            qsa__rope(m, kt + h * hd, pos);
        }
        if (c->has_qsa) {
            float *it = iq + (size_t)t * (ih + 1) * ihd;
            for (int h = 0; h < ih; h++) { /* indexer queries: q_layernorm then RoPE */
                qsa__rmsnorm_1p(it + h * ihd, a->idx_q_norm, it + h * ihd, ihd, ihd, c->rms_norm_eps);
                qsa__rope(m, it + h * ihd, pos);
            }
            memcpy(qsa__pool_ik(pool, slot, page, off), it + (size_t)ih * ihd, sizeof(float) * (size_t)ihd);
        }
    }
    /* 2. per query: select blocks + tail, plan, attend in plan order */
    for (int t = 0; t < n; t++) {
        int64_t pos = p0 + t;
        int nvis = (int)pos + 1, nb = 0, ns = 0;
        if (c->has_qsa) {
            nb = nvis / r;
            /* cache keys of newly completed blocks (a completed block's key never changes) */
            while (sl->n_blocks < nb) {
                int b = sl->n_blocks;
                for (int j = 0; j < r; j++) {
                    int64_t tp = (int64_t)b * r + j;
                    memcpy(ikeys + (size_t)j * ihd, qsa__pool_ik(pool, slot, sq->bt[tp / ps], (int)(tp % ps)), sizeof(float) * (size_t)ihd);
                }
                qsa__block_key(m, a, ikeys, b, sl->bkey + (size_t)b * ihd);
                sl->n_blocks++;
            }
            const float *it = iq + (size_t)t * (ih + 1) * ihd;
            for (int b = 0; b < nb; b++) {
                const float *bk = sl->bkey + (size_t)b * ihd;
                float s = 0.0f;
                for (int h = 0; h < ih; h++) {
                    float d = 0.0f;
                    for (int i = 0; i < ihd; i++) d += it[h * ihd + i] * bk[i];
                    s += d > 0.0f ? d : 0.0f;
                }
                scores[b] = s / sqrtf((float)ihd);
            }
            ns = qsa__select_blocks(scores, nb, topk, sel);
            if (sq->sel_hook) sq->sel_hook(sq->sel_user, l, pos, sel, ns, scores, nb);
        }
        if ((res = qsa__plan_build(&plan, sel, ns, nb, r, pos, ps, sq->bt, m->params.debug_physical_order)) != QSA_OK) goto done;
        const float *qt = qg + (size_t)t * nh * hd * 2;
        float *att = atts + (size_t)t * nh * hd;
        for (int h = 0; h < nh; h++) {
            const float *qh = qt + (size_t)h * 2 * hd, *gate = qh + hd;
            float *oh = att + (size_t)h * hd;
            qsa__attn_head_plan(pool, slot, &plan, qh, h / grp, hd, oh, acc);
            for (int d = 0; d < hd; d++) oh[d] *= qsa__sigmoid(gate[d]);
        }
        if (sq->cap && sq->cap->layer == l &&
            (res = qsa__capture_query(sq->cap, pos, qt, nh * hd * 2, sel, ns, topk, &plan, att, nh * hd)) != QSA_OK)
            goto done;
    }
    res = qsa__matmul(m, &a->o, atts, (size_t)nh * hd, n, out, (size_t)H);
done:
    qsa__free(qg); qsa__free(kg); qsa__free(vg); qsa__free(iq); qsa__free(atts); qsa__free(acc); qsa__free(scores); qsa__free(sel);
    qsa__free(ikeys);
    qsa__free(plan.seg);
    return res;
}

/* MoE on the n tokens x [n][H] of a chunk: softmax router in fp32, top-k (ties: lower expert id), optional
   renormalisation, SwiGLU experts in ascending id, plus the shared expert scaled by
   sigmoid(shared_expert_gate(x)).  Every matrix by qsa__matmul over the tokens that use it (each token's
   bits as its own matvecs): the router and the shared expert over all n, each routed expert over the
   tokens that chose it (gathered, in order), so a chunk reads an expert's weights once however many of its
   tokens chose it.  Each token sums its experts' outputs in ascending id.  margin[t] (when given): the
   token's routing margin. */
QSA_PRIV qsa_result qsa__moe_chunk(const qsa_model *m, const qsa__moe_w *w, const float *x, int n, float *out, float *margin) {
    const qsa_model_config *c = &m->cfg;
    int H = c->hidden_size, E = c->num_experts, K = c->num_experts_per_tok, I = c->moe_intermediate_size,
        Is = c->shared_expert_intermediate_size;
    QSA__INVARIANT(n > 0);
    float *logits = QSA__ALLOC(float, (size_t)n * E), *a = QSA__ALLOC(float, (size_t)n * I), *b = QSA__ALLOC(float, (size_t)n * I);
    float *xe = QSA__ALLOC(float, (size_t)n * H), *y = QSA__ALLOC(float, (size_t)n * H);
    float *sa = QSA__ALLOC(float, (size_t)n * Is), *sb = QSA__ALLOC(float, (size_t)n * Is), *sy = QSA__ALLOC(float, (size_t)n * H);
    float *sg = QSA__ALLOC(float, n);
    int *top = QSA__ALLOC(int, (size_t)n * K), *who = QSA__ALLOC(int, n), *slot = QSA__ALLOC(int, n);
    float *topw = QSA__ALLOC(float, (size_t)n * K);
    qsa_result r = QSA_OK;
    if (!logits || !a || !b || !xe || !y || !sa || !sb || !sy || !sg || !top || !who || !slot || !topw) {
        r = qsa__fail(QSA_ERR_OUT_OF_MEMORY, "MoE: out of memory");
        goto done;
    }
    if ((r = qsa__matmul(m, &w->router, x, (size_t)H, n, logits, (size_t)E)) != QSA_OK) goto done;
    /* the shared expert of every token */
    if ((r = qsa__matmul(m, &w->sh_gate, x, (size_t)H, n, sa, (size_t)Is)) != QSA_OK) goto done;
    if ((r = qsa__matmul(m, &w->sh_up, x, (size_t)H, n, sb, (size_t)Is)) != QSA_OK) goto done;
    for (size_t i = 0; i < (size_t)n * Is; i++) sa[i] = qsa__act(c->hidden_act, sa[i]) * sb[i];
    if ((r = qsa__matmul(m, &w->sh_down, sa, (size_t)Is, n, sy, (size_t)H)) != QSA_OK) goto done;
    if ((r = qsa__matmul(m, &w->sh_expert_gate, x, (size_t)H, n, sg, 1)) != QSA_OK) goto done;
    /* each token's route */
    for (int t = 0; t < n; t++) {
        float *lt = logits + (size_t)t * E, *tw = topw + (size_t)t * K;
        int *tk = top + (size_t)t * K;
        float mx = -INFINITY, sum = 0.0f;
        for (int e = 0; e < E; e++) mx = lt[e] > mx ? lt[e] : mx;
        for (int e = 0; e < E; e++) { lt[e] = expf(lt[e] - mx); sum += lt[e]; }
        for (int e = 0; e < E; e++) lt[e] /= sum;
        for (int k = 0; k < K; k++) {
            int best = -1;
            for (int e = 0; e < E; e++) {
                int used = 0;
                for (int j = 0; j < k; j++) used |= tk[j] == e;
                if (!used && (best < 0 || lt[e] > lt[best])) best = e;
            }
            tk[k] = best;
            tw[k] = lt[best];
        }
        if (margin) { /* routing margin: the last chosen probability minus the best one left out */
            float next = 0.0f;
            for (int e = 0; e < E; e++) {
                int used = 0;
                for (int j = 0; j < K; j++) used |= tk[j] == e;
                if (!used && lt[e] > next) next = lt[e];
            }
            margin[t] = K < E ? tw[K - 1] - next : INFINITY;
        }
        if (c->norm_topk_prob) {
            float s = 0.0f;
            for (int k = 0; k < K; k++) s += tw[k];
            for (int k = 0; k < K; k++) tw[k] /= s;
        }
    }
    for (size_t i = 0; i < (size_t)n * H; i++) out[i] = 0.0f;
    /* the routed experts in ascending id (as the reference accumulates them), each over its tokens */
    for (int e = 0; e < E; e++) {
        int cnt = 0;
        for (int t = 0; t < n; t++)
            for (int k = 0; k < K; k++)
                if (top[(size_t)t * K + k] == e) { who[cnt] = t; slot[cnt++] = k; }
        if (!cnt) continue;
        for (int i = 0; i < cnt; i++) memcpy(xe + (size_t)i * H, x + (size_t)who[i] * H, sizeof(float) * H);
        if ((r = qsa__matmul(m, &w->gate[e], xe, (size_t)H, cnt, a, (size_t)I)) != QSA_OK) goto done;
        if ((r = qsa__matmul(m, &w->up[e], xe, (size_t)H, cnt, b, (size_t)I)) != QSA_OK) goto done;
        for (size_t i = 0; i < (size_t)cnt * I; i++) a[i] = qsa__act(c->hidden_act, a[i]) * b[i];
        if ((r = qsa__matmul(m, &w->down[e], a, (size_t)I, cnt, y, (size_t)H)) != QSA_OK) goto done;
        for (int i = 0; i < cnt; i++) {
            float *ot = out + (size_t)who[i] * H, wk = topw[(size_t)who[i] * K + slot[i]];
            const float *yi = y + (size_t)i * H;
            for (int j = 0; j < H; j++) ot[j] += yi[j] * wk;
        }
    }
    for (int t = 0; t < n; t++) {
        float gl = qsa__sigmoid(sg[t]), *ot = out + (size_t)t * H;
        for (int j = 0; j < H; j++) ot[j] += gl * sy[(size_t)t * H + j];
    }
done:
    qsa__free(logits); qsa__free(a); qsa__free(b); qsa__free(xe); qsa__free(y); qsa__free(sa); qsa__free(sb); qsa__free(sy);
    qsa__free(sg); qsa__free(top); qsa__free(who); qsa__free(slot); qsa__free(topw);
    return r;
}

/* MoE on one token (qsa__moe_chunk of one). */
QSA_PRIV qsa_result qsa__moe_fwd(const qsa_model *m, const qsa__moe_w *w, const float *x, float *out, float *margin) {
    return qsa__moe_chunk(m, w, x, 1, out, margin);
}

/* What qsa_seq_feed checks before anything changes: context room and token ids.  `who` starts the
   messages ("qsa_seq_feed", or a batch's "qsa_seq_feed_batch: sequence 3"). */
QSA_PRIV qsa_result qsa__seq_feed_check(const qsa_seq *sq, const int32_t *ids, int n, const char *who) {
    int V = sq->m->cfg.vocab_size;
    if (sq->broken)
        return qsa__fail(QSA_ERR_INVALID_ARGUMENT, "%s: an earlier feed of this sequence failed part-way through "
                         "its forward pass, or its last reset failed on the device; qsa_seq_reset it first", who);
    if (n > sq->n_ctx - sq->pos)
        return qsa__fail(QSA_ERR_CONTEXT_FULL, "%s: %d + %d tokens exceed the context of %d", who, sq->pos, n, sq->n_ctx);
    for (int t = 0; t < n; t++)
        if (ids[t] < 0 || ids[t] >= V) {
            if (n == 1) return qsa__fail(QSA_ERR_INVALID_ARGUMENT, "%s: token %d is outside the vocabulary [0, %d)", who, ids[t], V);
            return qsa__fail(QSA_ERR_INVALID_ARGUMENT, "%s: token %d at index %d is outside the vocabulary [0, %d)", who, ids[t], t, V);
        }
    return QSA_OK;
}

#ifndef QSA_NO_CUDA
/* Whether the batched decode step serves this sequence on the GPU: the hooks, hidden-state output,
   capture and the physical-order debug switch are served by the chunked forward (bitwise the same
   for everything the batched step computes). */
QSA_PRIV int qsa__seq_batchable(const qsa_seq *sq) {
    const qsa_model *m = sq->m;
    return m->cuda != NULL && m->params.cuda_batch_decode && !m->params.debug_physical_order && !sq->sel_hook &&
           !sq->hidden_out && !sq->route_hook && !sq->cap;
}
#endif

QSA_PRIV qsa_result qsa__seq_feed(qsa_seq *sq, const int32_t *ids, int n, float *logits, int all_logits,
                                  const qsa__cand_req *cq) {
    qsa_model *m = sq->m;
    const qsa_model_config *c = &m->cfg;
    int H = c->hidden_size, hc = c->hc_count, hcH = hc * H, V = c->vocab_size;
    QSA__TRY(qsa__seq_feed_check(sq, ids, n, "qsa_seq_feed")); /* (a broken sequence refuses 0 tokens too) */
    if (n <= 0) return QSA_OK;
    if (cq && (!logits || all_logits)) cq = NULL;
    if (cq) cq->out[1] = -1; /* (the logits, until the device reduces the row) */
    int had = sq->n_pages; /* a failure before the layers gives back the pages this feed took */
    QSA__TRY(qsa__seq_reserve(sq, sq->pos + n));
#ifndef QSA_NO_CUDA
    /* one token (decode) on one GPU: the batched step for a batch of one, replayed as a CUDA graph
       when graphs are on (the per-token launches of the chunked forward cost more than the
       replay); the same bits (tests/t_gpu.c).  Its per-step buffers are made at the first such
       feed; if they cannot be, the chunked forward serves. */
    if (n == 1 && !m->tp && qsa__seq_batchable(sq) && qsa__cuda_batch_ready(m)) {
        qsa_result r = qsa__cuda_decode_batch(m, &sq, ids, 1, logits, NULL, cq);
        if (r != QSA_OK) { sq->broken = 1; return r; }
        sq->tokens[sq->pos++] = ids[0];
        return QSA_OK;
    }
    if (m->cuda) {
        for (int t0 = 0; t0 < n;) {
            int k = n - t0 < m->params.max_chunk ? n - t0 : m->params.max_chunk;
            float *lg = !logits ? NULL : all_logits ? logits + (size_t)t0 * V : (t0 + k == n ? logits : NULL);
            float *hid = sq->hidden_out;
            if (hid) sq->hidden_out = hid + (size_t)t0 * H;
            qsa_result r = qsa__cuda_chunk(sq, ids + t0, k, lg, all_logits, m->tp || t0 + k < n ? NULL : cq);
            sq->hidden_out = hid;
            if (r != QSA_OK) { sq->broken = 1; return r; }
            memcpy(sq->tokens + sq->pos, ids + t0, sizeof(int32_t) * (size_t)k);
            sq->pos += k;
            t0 += k;
        }
        return QSA_OK;
    }
#endif
    qsa__scratch sc;
    memset(&sc, 0, sizeof sc);
    float *X = QSA__ALLOC(float, (size_t)n * hcH);
    sc.xn = QSA__ALLOC(float, (size_t)n * hcH);
    sc.mw = QSA__ALLOC(float, (size_t)n * hcH);
    sc.low = QSA__ALLOC(float, (size_t)n * c->hc_lowrank);
    sc.inj = QSA__ALLOC(float, (size_t)n * hc);
    sc.inp = QSA__ALLOC(float, (size_t)n * H);
    sc.out = QSA__ALLOC(float, (size_t)n * H);
    float *margins = QSA__ALLOC(float, n);
    qsa_result r = QSA_OK;
    if (!X || !sc.xn || !sc.mw || !sc.low || !sc.inj || !sc.inp || !sc.out || !margins) { r = qsa__fail(QSA_ERR_OUT_OF_MEMORY, "qsa_seq_feed: out of memory"); goto done; }
    /* embedding, repeated into hc streams */
    for (int t = 0; t < n; t++)
        for (int s = 0; s < hc; s++) qsa__embed_row(m, ids[t], X + (size_t)t * hcH + s * H);
    sq->broken = 1; /* until the layers are through: a failure among them leaves their states part-way */
    for (int l = 0; l < c->num_hidden_layers; l++) {
        const qsa__layer_w *lw = &m->layers[l];
        if (lw->ple && (r = qsa__ple_fwd(sq, l, ids, n, X, &sc)) != QSA_OK) goto done;
        if ((r = qsa__gres_chunk(m, &lw->attn_hc, X, n, sc.inp, sc.inj, &sc)) != QSA_OK) goto done;
        r = lw->type == QSA_LAYER_LINEAR ? qsa__gdn_fwd(sq, l, sc.inp, sc.out, n) : qsa__attn_fwd(sq, l, sc.inp, sc.out, n);
        if (r != QSA_OK) goto done;
        for (int t = 0; t < n; t++) qsa__inject(c, X + (size_t)t * hcH, sc.inj + t * hc, sc.out + (size_t)t * H);
        if ((r = qsa__gres_chunk(m, &lw->mlp_hc, X, n, sc.inp, sc.inj, &sc)) != QSA_OK) goto done;
        if ((r = qsa__moe_chunk(m, &lw->moe, sc.inp, n, sc.out, margins)) != QSA_OK) goto done;
        for (int t = 0; t < n; t++) {
            if (sq->route_hook) sq->route_hook(sq->sel_user, l, sq->pos + t, margins[t]);
            qsa__inject(c, X + (size_t)t * hcH, sc.inj + t * hc, sc.out + (size_t)t * H);
        }
    }
    /* final mixer and lm_head (every token's logits, or the last one's) */
    if ((r = qsa__gres_chunk(m, &m->final_hc, X, n, sc.inp, NULL, &sc)) != QSA_OK) goto done;
    if (sq->hidden_out) memcpy(sq->hidden_out, sc.inp, sizeof(float) * (size_t)n * H);
    if (logits && all_logits && (r = qsa__matmul(m, &m->lm_head, sc.inp, (size_t)H, n, logits, (size_t)V)) != QSA_OK) goto done;
    if (logits && !all_logits && (r = qsa__matvec(m, &m->lm_head, sc.inp + (size_t)(n - 1) * H, logits)) != QSA_OK) goto done;
    memcpy(sq->tokens + sq->pos, ids, sizeof(int32_t) * (size_t)n);
    sq->pos += n;
    sq->broken = 0;
done:
    qsa__free(X); qsa__free(sc.xn); qsa__free(sc.mw); qsa__free(sc.low); qsa__free(sc.inj); qsa__free(sc.inp); qsa__free(sc.out);
    qsa__free(margins);
    if (r != QSA_OK && !sq->broken) qsa__seq_unreserve(sq, had);
    return r;
}

QSA_IMPL qsa_result qsa_seq_feed(qsa_seq *seq, const int32_t *ids, int n, float *logits, int all_logits) {
    if (!seq || (!ids && n > 0) || n < 0) return qsa__fail(QSA_ERR_INVALID_ARGUMENT, "qsa_seq_feed: bad arguments");
    qsa__model_enter(seq->m);
    qsa_result r = qsa__seq_feed(seq, ids, n, logits, all_logits, NULL);
    qsa__model_leave(seq->m);
    return r;
}


QSA_PRIV int32_t qsa__argmax(const float *x, int n);
/* qsa_seq_feed_batch (next NULL) and qsa_seq_feed_batch_greedy (logits NULL); with cq (and logits) the rows' sampling
   starts on the device where it can (struct qsa__cand_req; the rows it could not reduce have their logits) */
QSA_PRIV qsa_result qsa__feed_batch(qsa_seq **seqs, const int32_t *tokens, int n, float *logits, int32_t *next,
                                    const qsa__cand_req *cq) {
    const char *fn = next ? "qsa_seq_feed_batch_greedy" : "qsa_seq_feed_batch"; /* (for the messages) */
    if (n < 0 || (n > 0 && (!seqs || !tokens))) return qsa__fail(QSA_ERR_INVALID_ARGUMENT, "%s: bad arguments", fn);
    if (n == 0) return QSA_OK;
    qsa_model *m = seqs[0] ? seqs[0]->m : NULL;
    for (int i = 0; i < n; i++) {
        if (!seqs[i] || seqs[i]->m != m)
            return qsa__fail(QSA_ERR_INVALID_ARGUMENT, "%s: sequence %d is NULL or of another model", fn, i);
        for (int j = 0; j < i; j++)
            if (seqs[j] == seqs[i]) return qsa__fail(QSA_ERR_INVALID_ARGUMENT, "%s: sequences %d and %d are the same", fn, j, i);
        char who[64];
        snprintf(who, sizeof who, "%s: sequence %d", fn, i);
        QSA__TRY(qsa__seq_feed_check(seqs[i], &tokens[i], 1, who));
    }
    /* one forward pass for the batch on CUDA, else qsa_seq_feed per sequence (greedy: into a row) */
    int batched = 0;
#ifndef QSA_NO_CUDA
    batched = 1;
    for (int k = 0; batched && k < n; k++) batched = qsa__seq_batchable(seqs[k]);
    /* the batched step's buffers, made before anything changes: when the device cannot hold them the
       sequences are fed one at a time (the chunked forward), as qsa_seq_feed feeds one token then, instead
       of failing a step that never ran and leaving its sequences broken */
    if (batched && !m->tp && !qsa__cuda_batch_ready(m)) batched = 0;
#endif
    /* pages for every sequence, in order, all or nothing */
    size_t V = (size_t)m->cfg.vocab_size;
    int *had = QSA__ALLOC(int, n);
    float *row = next && !batched ? QSA__ALLOC(float, V) : NULL;
    if (!had || (next && !batched && !row)) {
        qsa__free(had);
        qsa__free(row);
        return qsa__fail(QSA_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
    }
    qsa_result r = QSA_OK;
    int i = 0;
    for (; i < n; i++) {
        had[i] = seqs[i]->n_pages;
        if ((r = qsa__seq_reserve(seqs[i], seqs[i]->pos + 1)) != QSA_OK) break;
    }
    if (r != QSA_OK) {
        char msg[1024];
        int bad = i;
        snprintf(msg, sizeof msg, "%s", qsa_last_error());
        while (--i >= 0) qsa__seq_unreserve(seqs[i], had[i]);
        qsa__free(had);
        qsa__free(row);
        return qsa__fail(r, "%s: sequence %d: %s", fn, bad, msg);
    }
    int fed = 0; /* the sequences fed, in order, before a failure */
    for (int k = 0; cq && k < n; k++) cq->out[(size_t)k * QSA__CAND_STRIDE(cq->kmax) + 1] = -1; /* (the logits, until a step reduces) */
#ifndef QSA_NO_CUDA
    if (batched) {
        int group = m->params.max_batch < m->params.max_chunk ? m->params.max_batch : m->params.max_chunk;
        for (; fed < n; fed += group) {
            int B = n - fed < group ? n - fed : group;
            qsa__cand_req sub;
            if (cq) {
                sub.smp = cq->smp + fed;
                sub.out = cq->out + (size_t)fed * QSA__CAND_STRIDE(cq->kmax);
                sub.kmax = cq->kmax;
            }
            /* each token recorded past pos before the step (the step may write next over tokens), counted after it */
            for (int k = fed; k < fed + B; k++) seqs[k]->tokens[seqs[k]->pos] = tokens[k];
            r = qsa__cuda_decode_batch(m, seqs + fed, tokens + fed, B, logits ? logits + (size_t)fed * V : NULL,
                                       next ? next + fed : NULL, cq && logits && !next ? &sub : NULL);
            if (r != QSA_OK) {
                for (int k = fed; k < fed + B; k++) seqs[k]->broken = 1;
                break;
            }
            for (int k = fed; k < fed + B; k++) seqs[k]->pos++;
        }
    }
#endif
    for (; !batched && fed < n; fed++) {
        r = qsa__seq_feed(seqs[fed], &tokens[fed], 1, next ? row : logits ? logits + (size_t)fed * V : NULL, 0, NULL);
        if (r != QSA_OK) break;
        if (next) next[fed] = qsa__argmax(row, (int)V);
    }
    /* after a failure the sequences not fed give back the pages taken above (those it left broken keep
       them until their reset) */
    for (int j = fed; r != QSA_OK && j < n; j++)
        if (!seqs[j]->broken) qsa__seq_unreserve(seqs[j], had[j]);
    qsa__free(had);
    qsa__free(row);
    return r;
}
/* (the lock of the first sequence's model: qsa__feed_batch refuses sequences of another) */
QSA_PRIV qsa_result qsa__feed_batch_locked(qsa_seq **seqs, const int32_t *tokens, int n, float *logits, int32_t *next,
                                           const qsa__cand_req *cq) {
    qsa_model *m = n > 0 && seqs && seqs[0] ? seqs[0]->m : NULL;
    qsa__model_enter(m);
    qsa_result r = qsa__feed_batch(seqs, tokens, n, logits, next, cq);
    qsa__model_leave(m);
    return r;
}
QSA_IMPL qsa_result qsa_seq_feed_batch(qsa_seq **seqs, const int32_t *tokens, int n, float *logits) {
    return qsa__feed_batch_locked(seqs, tokens, n, logits, NULL, NULL);
}
QSA_IMPL qsa_result qsa_seq_feed_batch_greedy(qsa_seq **seqs, const int32_t *tokens, int n, int32_t *next) {
    if (!next && n > 0) return qsa__fail(QSA_ERR_INVALID_ARGUMENT, "qsa_seq_feed_batch_greedy: next is NULL");
    return qsa__feed_batch_locked(seqs, tokens, n, NULL, next, NULL);
}

/* ============================================================================================== */
/* >>sampler  greedy and seeded sampling                                                          */
/* ============================================================================================== */
/* The RNG is xoshiro256** seeded through splitmix64 from the seed; one uniform double in [0, 1)
   (53 bits) is drawn per sampled token, so the same seed and the same logits give the same tokens.
   Order of operations: repetition penalty, temperature, top-k, softmax, top-p, min-p, draw. */

struct qsa_sampler {
    qsa_sampling_params p;
    uint64_t s[4];
    int cap, rcap;
    int32_t *idx;
    float *prob;
    uint64_t *rad; /* [2 rcap]: the radix sort's (key, id) pairs and their copy */
};

QSA_PRIV uint64_t qsa__rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
QSA_PRIV double qsa__rng_uniform(uint64_t *s) {
    uint64_t r = qsa__rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0]; s[3] ^= s[1]; s[1] ^= s[2]; s[0] ^= s[3];
    s[2] ^= t; s[3] = qsa__rotl(s[3], 45);
    return (double)(r >> 11) * (1.0 / 9007199254740992.0);
}

QSA_IMPL qsa_result qsa_sampler_create(const qsa_sampling_params *params, qsa_sampler **out) {
    if (!out) return qsa__fail(QSA_ERR_INVALID_ARGUMENT, "qsa_sampler_create: NULL out");
    *out = NULL;
    qsa_sampler *s = QSA__CALLOC(qsa_sampler, 1);
    if (!s) return qsa__fail(QSA_ERR_OUT_OF_MEMORY, "qsa_sampler_create: out of memory");
    if (params) s->p = *params;
    qsa_sampling_params p = s->p;
    /* written so that NaN fails every test */
    if (!(p.temperature >= 0 && p.temperature < INFINITY) || !(p.top_p >= 0 && p.top_p <= 1) || !(p.min_p >= 0 && p.min_p <= 1) ||
        !(p.repetition_penalty >= 0 && p.repetition_penalty < INFINITY) || p.top_k < 0 || p.penalty_last_n < -1) {
        qsa__free(s);
        return qsa__fail(QSA_ERR_INVALID_ARGUMENT,
                         "qsa_sampler_create: temperature %g, top_k %d, top_p %g, min_p %g, repetition_penalty %g, penalty_last_n %d: "
                         "expected a finite temperature >= 0, top_k >= 0, top_p and min_p in [0, 1], a finite penalty >= 0, "
                         "penalty_last_n >= -1",
                         p.temperature, p.top_k, p.top_p, p.min_p, p.repetition_penalty, p.penalty_last_n);
    }
    QSA__DEF(s->p.penalty_last_n, 64);
    uint64_t x = s->p.seed;
    for (int i = 0; i < 4; i++) { x += QSA__SPLITMIX_GAMMA; s->s[i] = qsa__splitmix64(x - QSA__SPLITMIX_GAMMA); }
    *out = s;
    return QSA_OK;
}

QSA_IMPL void qsa_sampler_free(qsa_sampler *s) {
    if (!s) return;
    qsa__free(s->idx);
    qsa__free(s->prob);
    qsa__free(s->rad);
    qsa__free(s);
}

/* the lowest id among the largest logits; NaN never wins (a row of NaN gives 0): a greedy row's of qsa_k_sample_cand1, 2 */
QSA_PRIV int32_t qsa__argmax(const float *x, int n) {
    int32_t best = -1;
    for (int i = 0; i < n; i++)
        if (x[i] == x[i] && (best < 0 || x[i] > x[best])) best = i;
    return best < 0 ? 0 : best;
}

/* sort candidate ids by logit descending, lower id first on ties (heap sort: O(n log n), no recursion) */
QSA_PRIV int qsa__cand_before(const float *l, int32_t a, int32_t b) { return l[a] > l[b] || (l[a] == l[b] && a < b); }
QSA_PRIV void qsa__cand_sift(const float *l, int32_t *v, int i, int n) {
    for (;;) {
        int c = 2 * i + 1;
        if (c >= n) return;
        if (c + 1 < n && qsa__cand_before(l, v[c], v[c + 1])) c++;
        if (!qsa__cand_before(l, v[i], v[c])) return;
        int32_t t = v[i]; v[i] = v[c]; v[c] = t;
        i = c;
    }
}
/* The radix key of a logit f at position i: ascending keys order the logits descending (-0 as +0), positions
   ascending within a value */
QSA_PRIV uint64_t qsa__cand_key(float f, uint32_t i) {
    f = f == 0.0f ? 0.0f : f;
    uint32_t u;
    memcpy(&u, &f, 4);
    u = u & 0x80000000u ? ~u : u | 0x80000000u; /* ascending in f */
    return (uint64_t)~u << 32 | i;
}
/* all ids 0..n-1 in qsa__cand_before's order into v, by a stable LSD radix sort of (key, id) pairs
   (3 passes of 11, 11 and 10 bits over a key that orders the floats descending, -0 as +0; O(n): a heap
   sort of the real vocabulary took 58 ms).  The logits hold no NaN.  tmp: 2 n pairs. */
QSA_PRIV void qsa__cand_sort(const float *l, int32_t *v, int n, uint64_t *tmp) {
    uint64_t *a = tmp, *b = tmp + n;
    for (int i = 0; i < n; i++) a[i] = qsa__cand_key(l[i], (uint32_t)i);
    static const int shift[3] = {32, 43, 54};
    for (int p = 0; p < 3; p++) {
        const int sh = shift[p];
        const uint64_t mask = p < 2 ? 2047 : 1023;
        uint32_t cnt[2049] = {0}; /* (n < 2^31) */
        for (int i = 0; i < n; i++) cnt[((a[i] >> sh) & mask) + 1]++;
        if (cnt[((a[0] >> sh) & mask) + 1] == (uint32_t)n) continue; /* one bucket: the order stands */
        for (int d = 0; d < 2048; d++) cnt[d + 1] += cnt[d];
        for (int i = 0; i < n; i++) b[cnt[(a[i] >> sh) & mask]++] = a[i];
        uint64_t *t = a; a = b; b = t;
    }
    for (int i = 0; i < n; i++) v[i] = (int32_t)(uint32_t)a[i];
}
/* the first k (0 < k < n) of qsa__cand_sort's order of ids 0..n-1, in that order, in v[0, k): a heap of the
   k best with the worst at its root, O(n log k) instead of sorting the whole vocabulary */
QSA_PRIV void qsa__cand_topk(const float *l, int32_t *v, int n, int k) {
    for (int i = 0; i < k; i++) v[i] = i;
    for (int i = k / 2 - 1; i >= 0; i--) qsa__cand_sift(l, v, i, k);
    for (int i = k; i < n; i++)
        if (qsa__cand_before(l, i, v[0])) { v[0] = i; qsa__cand_sift(l, v, 0, k); }
    for (int e = k - 1; e > 0; e--) {
        int32_t t = v[0]; v[0] = v[e]; v[e] = t;
        qsa__cand_sift(l, v, 0, e);
    }
}

/* idx and prob for n ids (0: out of memory, reported) */
QSA_PRIV int qsa__sampler_reserve(qsa_sampler *s, int n) {
    if (s->cap >= n) return 1;
    int32_t *idx = (int32_t *)qsa__realloc(s->idx, sizeof(int32_t) * (size_t)n);
    if (idx) s->idx = idx;
    float *prob = (float *)qsa__realloc(s->prob, sizeof(float) * (size_t)n);
    if (prob) s->prob = prob;
    if (!idx || !prob) {
        qsa__fail(QSA_ERR_OUT_OF_MEMORY, "qsa_sampler_sample: out of memory for %d candidates", n);
        return 0;
    }
    s->cap = n;
    return 1;
}

/* rad for n ids (0: out of memory, reported) */
QSA_PRIV int qsa__sampler_reserve_rad(qsa_sampler *s, int n) {
    if (s->rcap >= n) return 1;
    uint64_t *rad = (uint64_t *)qsa__realloc(s->rad, sizeof(uint64_t) * 2 * (size_t)n);
    if (!rad) {
        qsa__fail(QSA_ERR_OUT_OF_MEMORY, "qsa_sampler_sample: out of memory for %d candidates", n);
        return 0;
    }
    s->rad = rad;
    s->rcap = n;
    return 1;
}

/* Where the repetition penalty's window starts in hist[0, n_hist), or -1 when there is no penalty */
QSA_PRIV int qsa__sampler_window(const qsa_sampler *s, const int32_t *hist, int n_hist) {
    const qsa_sampling_params *p = &s->p;
    if (!(p->repetition_penalty > 0 && p->repetition_penalty != 1.0f && hist && n_hist > 0)) return -1;
    return p->penalty_last_n < 0 || p->penalty_last_n > n_hist ? 0 : n_hist - p->penalty_last_n;
}

/* A whole-row draw (temperature > 0, no top-k below the vocabulary) normalises by the row's sum in
   units of 2^-44: the sum over every id of qsa__zterm(t, tmax), t its tempered logit, tmax the largest.  Integers,
   so the sum is the same in any order (kernels.cu's qsa_k_sample_z adds it on the device, in parallel).  A term is
   about 2^44 e^d, d = t - tmax <= 0 (within ~1e-9), from d's 32.32 fixed-point form after two IEEE operations:
   -d log2(e) = I + F / 2^32, then 2^(-F / 2^32) = 2^(-j / 16) 2^(-f / 2^32) (F's top 4 bits j, a table of 16; f < 2^28:
   a degree-5 series) in 31-bit fixed point, shifted by I: only 32 x 32-bit products (kernels.cu's qsa_zterm: the
   same integers).  At 248,320 ids the sum stays below 2^62; below QSA__Z_VOCAB (2^20) ids, below 2^64. */
QSA_PRIV uint64_t qsa__zterm(float t, float tmax) {
    float d = t - tmax;
    if (!(d > -64.0f)) return 0;
    float y = d * 1.44269504088896341f;
    uint64_t zf = (uint64_t)(-(int64_t)(y * 4294967296.0f)), I = zf >> 32; /* (truncated) */
    if (I >= 44) return 0;
    static const uint32_t T[16] = {0x80000000u, 0x7a92be8bu, 0x75606374u, 0x70666f76u, 0x6ba27e65u, 0x6712460bu,
                                   0x62b39509u, 0x5e8451d0u, 0x5a82799au, 0x56ac1f75u, 0x52ff6b55u, 0x4f7a9930u,
                                   0x4c1bf829u, 0x48e1e9bau, 0x45cae0f2u, 0x42d561b4u};
    static const uint32_t b[6] = {0x80000000u, 0x58b90bfcu, 0x1ebfbe00u, 0x71ac236u, 0x13b2ab7u, 0x2bb100u};
    uint32_t F = (uint32_t)zf, f = F & 0x0fffffffu, acc = b[5];
    for (int k = 4; k >= 0; k--) acc = b[k] - (uint32_t)(((uint64_t)acc * f) >> 32);
    uint64_t R = ((uint64_t)T[F >> 28] * acc) >> 31; /* (2^30, 2^31] */
    return I <= 13 ? R << (13 - I) : R >> (I - 13);
}
QSA_PRIV uint64_t qsa__zsum(const float *t, int n, float tmax) {
    uint64_t z = 0;
    for (int i = 0; i < n; i++) z += qsa__zterm(t[i], tmax);
    return z;
}
/* the vocabularies whose whole-row sum (at most 2^44 an id) fits 64 bits: below 2^20 ids */
#define QSA__Z_VOCAB (1 << 20)
/* 1 for a sampler whose draw is one over the whole row (temperature > 0, no top-k below the vocabulary), normalised by
   qsa__zsum: with top-p or min-p (qsa__sample_cut), or with neither (qsa__sample_pure).  0 at QSA__Z_VOCAB ids or more
   (the sum would wrap): every id sorted, normalised by their own sum, as a top-k draw. */
QSA_PRIV int qsa__sampler_whole_z(const qsa_sampler *s, int vocab) {
    const qsa_sampling_params *p = &s->p;
    return p->temperature > 0.0f && (p->top_k <= 0 || p->top_k >= vocab) && vocab < QSA__Z_VOCAB;
}
/* 1 for a sampler with top-p or min-p; a whole-row draw with neither is by the temperature alone (qsa__sample_pure) */
QSA_PRIV int qsa__sampler_cuts(const qsa_sampler *s) {
    const qsa_sampling_params *p = &s->p;
    return (p->top_p > 0.0f && p->top_p < 1.0f) || p->min_p > 0.0f;
}

/* The candidates that a draw keeps of n (>= 1) in order, s->idx[0, n) with their tempered logits in s->prob[0, n)
   (qsa_sampler_sample's steps after the order; prob becomes their probabilities): normalised by their own sum, or
   where z > 0 by z 2^-44 (a whole-row draw: qsa__zterm), then top-p, then min-p.  -2 where they are not every id of
   the row (complete 0) and top-p or min-p would keep more than them: the draw cannot be decided from them. */
QSA_PRIV int qsa__sample_cut(qsa_sampler *s, int n, uint64_t z, int complete) {
    const qsa_sampling_params *p = &s->p;
    double sum = 0.0, mx = s->prob[0];
    for (int i = 0; i < n; i++) { s->prob[i] = (float)exp(s->prob[i] - mx); sum += s->prob[i]; }
    if (z) sum = ldexp((double)z, -44);
    for (int i = 0; i < n; i++) s->prob[i] = (float)(s->prob[i] / sum);
    int cut = 0;
    if (p->top_p > 0.0f && p->top_p < 1.0f) {
        double c = 0.0;
        for (int i = 0; i < n; i++) { c += s->prob[i]; if (c >= p->top_p) { n = i + 1; cut = 1; break; } }
    }
    if (p->min_p > 0.0f) {
        float lim = p->min_p * s->prob[0];
        int k = 1;
        while (k < n && s->prob[k] >= lim) k++;
        cut |= k < n;
        n = k;
    }
    return cut || complete ? n : -2;
}
/* The draw from the first n candidates of qsa__sample_cut's probabilities */
QSA_PRIV int32_t qsa__sample_pick(qsa_sampler *s, int n) {
    double sum = 0.0;
    for (int i = 0; i < n; i++) sum += s->prob[i];
    double u = qsa__rng_uniform(s->s) * sum, c = 0.0;
    for (int i = 0; i < n; i++) {
        c += s->prob[i];
        if (u < c) return s->idx[i];
    }
    return s->idx[n - 1];
}
/* The draw of a whole-row sampler with neither top-p nor min-p (qsa__sampler_cuts 0), over n (>= 1) ids in order with
   their tempered logits, s->idx[0, n) and s->prob[0, n), the largest first; z the whole row's sum (qsa__zsum).  In
   integers: r = u z rounded down (u the generator's uniform; at most z - 1), the pick the first id in order at which
   the running sum of the terms qsa__zterm(t, t_0) passes r.  Id i is drawn with probability term_i / z, and the first
   n decide the draw wherever their terms pass r, whatever the rest of the row.  The id; -2 where they do not (complete
   0), the generator then left as it was (as it is with draw 0, a test of the candidates alone).  qsa__pure_r: r from
   the generator's state st (advanced). */
QSA_PRIV uint64_t qsa__pure_r(uint64_t *st, uint64_t z) {
    uint64_t r = (uint64_t)(qsa__rng_uniform(st) * (double)z);
    return r < z ? r : z - 1;
}
QSA_PRIV int32_t qsa__sample_pure(qsa_sampler *s, int n, uint64_t z, int complete, int draw) {
    uint64_t st[4];
    memcpy(st, s->s, sizeof st);
    uint64_t r = qsa__pure_r(st, z), c = 0;
    int i = 0;
    while (i < n && (c += qsa__zterm(s->prob[i], s->prob[0])) <= r) i++;
    if (i == n && !complete) return -2;
    if (draw) memcpy(s->s, st, sizeof st);
    return s->idx[i < n ? i : n - 1]; /* (past the end: a sum that is not these ids') */
}
/* A whole-row top-p draw that its n candidates cannot cut (qsa__sample_cut -2; s->prob[0, n) their probabilities).
   qsa__sample_pick over the whole cut scales its uniform draw U by the cut's sum, the running sum at the first id where
   it reaches top_p.  That sum is at least top_p (with min-p beside it, at least the n's own sum) and at most top_p + the
   n-th probability as a double sum rounds it (the sum before that id is below top_p, and every later probability is at
   most the n-th).  The pick is the first id whose running sum passes U times the sum: where both ends of that interval
   pick the same one of the n, that one is the draw, whatever the rest of the row.  The id, or -2; the generator
   advanced either way. */
QSA_PRIV int32_t qsa__sample_bounded(qsa_sampler *s, int n) {
    const qsa_sampling_params *p = &s->p;
    if (!(p->top_p > 0.0f && p->top_p < 1.0f)) return -2;
    double c = 0.0;
    for (int i = 0; i < n; i++) c += s->prob[i];
    double u = qsa__rng_uniform(s->s), lo = u * (p->min_p > 0.0f ? c : (double)p->top_p);
    double hi = u * ((double)p->top_p + (double)s->prob[n - 1]);
    c = 0.0;
    for (int i = 0; i < n; i++) {
        c += s->prob[i];
        if (lo < c) return hi < c ? s->idx[i] : -2;
    }
    return -2;
}
/* The draw from n (>= 1) ids in qsa_sampler_sample's order, s->idx[0, n) with their tempered logits in s->prob[0, n): a
   top-k draw's k (z 0), or a whole-row draw's n best (z the row's sum; complete where they are the whole row).  The
   id; -2 where they cannot decide a whole-row draw, the generator then as it was (as always with draw 0: the test
   alone). */
QSA_PRIV int32_t qsa__sample_finish(qsa_sampler *s, int n, uint64_t z, int complete, int draw) {
    if (z && !qsa__sampler_cuts(s)) return qsa__sample_pure(s, n, z, complete, draw);
    uint64_t st[4];
    memcpy(st, s->s, sizeof st);
    int c = qsa__sample_cut(s, n, z, complete);
    int32_t t = c >= 0 ? qsa__sample_pick(s, c) : qsa__sample_bounded(s, n);
    if (!draw || t < 0) memcpy(s->s, st, sizeof st);
    return t;
}

/* The distinct ids of the penalty window (the ids qsa_sampler_sample penalises), at most cap of them, into ids:
   their number; -1 when there are more; -2 out of memory (reported) */
QSA_PRIV int qsa__sampler_pen_ids(qsa_sampler *s, const int32_t *hist, int n_hist, int vocab, int32_t *ids, int cap) {
    int from = qsa__sampler_window(s, hist, n_hist), n = 0;
    if (from < 0) return 0;
    if (!qsa__sampler_reserve(s, vocab)) return -2;
    int32_t *done = s->idx;
    for (int i = from; i < n_hist; i++)
        if (hist[i] >= 0 && hist[i] < vocab) done[hist[i]] = 0;
    for (int i = from; i < n_hist; i++) {
        int32_t t = hist[i];
        if (t < 0 || t >= vocab || done[t]) continue;
        done[t] = 1;
        if (n == cap) return -1;
        ids[n++] = t;
    }
    return n;
}

/* qsa_sampler_sample; z: a whole-row draw's sum (qsa__zsum) where the caller has it, whose best QSA__CAND_Z do not
   decide it (the logits of such a row from the device, penalised: hist NULL), else 0 */
QSA_PRIV int32_t qsa__sampler_sample_z(qsa_sampler *s, float *logits, int vocab, const int32_t *hist, int n_hist, uint64_t z) {
    if (!s || !logits || vocab < 1) {
        qsa__fail(QSA_ERR_INVALID_ARGUMENT, "qsa_sampler_sample: %s", vocab < 1 ? "vocab < 1" : "NULL sampler or logits");
        return -1;
    }
    const qsa_sampling_params *p = &s->p;
    int from = qsa__sampler_window(s, hist, n_hist), penalty = from >= 0;
    int all = p->temperature > 0.0f && (p->top_k <= 0 || p->top_k >= vocab); /* every id sorted */
    if (all && !qsa__sampler_reserve_rad(s, vocab)) return -1;
    if ((p->temperature > 0.0f || penalty) && !qsa__sampler_reserve(s, vocab)) return -1;
    /* once per distinct id of the window, in O(window): the ids (at most vocab) in prob's room, unused until the draw */
    int32_t *pen = (int32_t *)s->prob;
    int np = penalty ? qsa__sampler_pen_ids(s, hist, n_hist, vocab, pen, vocab) : 0;
    for (int j = 0; j < np; j++) {
        int32_t t = pen[j];
        logits[t] = logits[t] > 0 ? logits[t] / p->repetition_penalty : logits[t] * p->repetition_penalty;
    }
    if (p->temperature <= 0.0f) return qsa__argmax(logits, vocab);
    /* NaN never wins (as at temperature 0: it weighs nothing); where the largest logit over the temperature
       is infinite (an infinite logit, or a temperature or penalty so small that it overflows) the draw is
       the limit of a vanishing temperature, the arg-max; where every logit is -inf, the arg-max too */
    float lmax = -INFINITY;
    for (int i = 0; i < vocab; i++) {
        if (logits[i] != logits[i]) logits[i] = -INFINITY;
        lmax = logits[i] > lmax ? logits[i] : lmax;
    }
    if (lmax == -INFINITY || isinf(lmax / p->temperature)) return qsa__argmax(logits, vocab);
    for (int i = 0; i < vocab; i++) logits[i] /= p->temperature;
    int n = vocab;
    if (p->top_k > 0 && p->top_k < vocab) {
        n = p->top_k;
        qsa__cand_topk(logits, s->idx, vocab, n);
        z = 0;
    } else if (!qsa__sampler_whole_z(s, vocab)) {
        qsa__cand_sort(logits, s->idx, n, s->rad); /* (a vocabulary too large for the row's sum) */
        z = 0;
    } else {
        /* a whole-row draw: the row's sum, then its best QSA__CAND_Z (qsa__cand_sort's first): where they decide the
           draw, no sort of every id (as the device's candidates) */
        int k = vocab > QSA__CAND_Z ? QSA__CAND_Z : vocab;
        if (!z) {
            z = qsa__zsum(logits, vocab, lmax / p->temperature); /* (the largest tempered logit) */
            if (k < vocab) qsa__cand_topk(logits, s->idx, vocab, k);
            else qsa__cand_sort(logits, s->idx, n, s->rad);
            for (int i = 0; i < k; i++) s->prob[i] = logits[s->idx[i]];
            int32_t t = qsa__sample_finish(s, k, z, k == vocab, 1);
            if (t >= 0) return t;
        }
        qsa__cand_sort(logits, s->idx, n, s->rad);
    }
    for (int i = 0; i < n; i++) s->prob[i] = logits[s->idx[i]];
    return qsa__sample_finish(s, n, z, 1, 1);
}
QSA_IMPL int32_t qsa_sampler_sample(qsa_sampler *s, float *logits, int vocab, const int32_t *hist, int n_hist) {
    return qsa__sampler_sample_z(s, logits, vocab, hist, n_hist, 0);
}

/* ---- the draw from the device's candidates (qsa_k_sample_cand1, 2) ---- */

/* The top-k of a row's tempered logits are all that a draw with 1 <= top_k < vocab reads, and a greedy pick
   needs the arg-max alone: such a sampler's row can be reduced on the device to its candidates (kernels.cu,
   qsa_k_sample_cand1, 2), up to QSA__CAND_MAX of them, and the host finishes the draw with the same bits
   (qsa__sampler_from_cand).  A draw over the whole row (qsa__sampler_whole_z) reads the row's sum (qsa_k_sample_z) and
   its best ids up to where top-p or min-p stops, or (the temperature alone) up to the one its uniform draw picks: its
   QSA__CAND_Z best decide it where they reach that point (qsa__sampler_cand_draw), and otherwise the row's logits come
   to the host (with the penalty applied). */
/* the candidates a row of this sampler needs: 0 for the arg-max alone, k for a top-k draw, QSA__CAND_Z for a
   whole-row draw, -1 for the whole row (a top-k above QSA__CAND_MAX, or a vocabulary of at most QSA__CAND_Z ids) */
QSA_PRIV int qsa__sampler_cand_k(const qsa_sampler *s, int vocab) {
    const qsa_sampling_params *p = &s->p;
    if (p->temperature <= 0.0f) return 0;
    if (p->top_k >= 1 && p->top_k < vocab && p->top_k <= QSA__CAND_MAX) return p->top_k;
    return qsa__sampler_whole_z(s, vocab) && vocab > QSA__CAND_Z ? QSA__CAND_Z : -1;
}
/* The whole row's sum of a row of candidates (below) */
QSA_PRIV uint64_t qsa__cand_z(const int32_t *row, int kmax) {
    return (uint64_t)(uint32_t)row[2 + 2 * kmax] | (uint64_t)(uint32_t)row[3 + 2 * kmax] << 32;
}
/* A row of candidates (qsa_k_sample_cand2): row[0] the arg-max, row[1] the number k of candidates (0: the pick is the
   arg-max), row[2, 2 + k) their ids in qsa_sampler_sample's order (qsa__cand_sort's: tempered logit descending, the
   lower id first among equals; the kernel ranks them), row[2 + kmax, 2 + kmax + k) their tempered logits' bits, then
   the whole row's sum (qsa__zterm) as two words, low first (0 but for a whole-row draw).  Into s->idx and s->prob as
   they come, then qsa__sample_finish: the draw (draw 1) or the id it would be (draw 0: the generator untouched), -2
   where the candidates cannot decide a whole-row draw, -1 when it cannot allocate (QSA_ERR_OUT_OF_MEMORY). */
QSA_PRIV int32_t qsa__sampler_cand_draw(qsa_sampler *s, const int32_t *row, int kmax, int draw) {
    int k = row[1];
    if (k <= 0) return row[0];
    if (!qsa__sampler_reserve(s, k)) return -1;
    memcpy(s->idx, row + 2, sizeof(int32_t) * (size_t)k);
    memcpy(s->prob, row + 2 + kmax, sizeof(float) * (size_t)k);
    uint64_t z = qsa__cand_z(row, kmax);
    return qsa__sample_finish(s, k, z, !z, draw);
}
/* 1 where a row of candidates decides its sampler's draw (qsa__sampler_cand_draw gives no -2), 0 where not, -1 when it
   cannot allocate.  A draw by the temperature alone needs no order for it: its candidates decide it where the sum of
   all their terms passes r (qsa__sample_pure's running sums only grow). */
QSA_PRIV int qsa__sampler_cand_decides(qsa_sampler *s, const int32_t *row, int kmax) {
    int k = row[1];
    uint64_t z = qsa__cand_z(row, kmax);
    if (k > 0 && z && !qsa__sampler_cuts(s)) {
        const float *val = (const float *)(row + 2 + kmax);
        float tmax = val[0]; /* (the row is ranked: its first is the largest) */
        uint64_t c = 0, st[4];
        for (int j = 0; j < k; j++) c += qsa__zterm(val[j], tmax);
        memcpy(st, s->s, sizeof st);
        return c > qsa__pure_r(st, z);
    }
    int32_t t = qsa__sampler_cand_draw(s, row, kmax, 0);
    return t == -1 ? -1 : t >= 0;
}
/* The pick of qsa_sampler_sample from a row's candidates that decide it (qsa__sampler_cand_draw).  -1 when it cannot
   allocate (QSA_ERR_OUT_OF_MEMORY). */
QSA_PRIV int32_t qsa__sampler_from_cand(qsa_sampler *s, const int32_t *row, int kmax) {
    int32_t t = qsa__sampler_cand_draw(s, row, kmax, 1);
    if (t == -2) /* (qsa__cuda_decode_batch sends the logits of such a row instead) */
        qsa__fail(QSA_ERR_INVALID_ARGUMENT, "qsa_sampler: a whole-row draw's candidates do not decide it");
    return t < 0 ? -1 : t;
}

/* ============================================================================================== */
/* >>generate  prompt + decode loop, stop conditions, statistics                                  */
/* ============================================================================================== */

QSA_IMPL void qsa_generation_free(qsa_generation *g) {
    if (!g) return;
    qsa__free(g->tokens);
    qsa__free(g->text);
    memset(g, 0, sizeof *g);
}

/* Where the earliest stop string in text[0, len) starts, or -1, among the matches that end past `old`
   (the text up to `old` was searched before).  The text may hold NUL bytes (a byte-level token can
   decode to one); an empty stop string never matches. */
QSA_PRIV int64_t qsa__stop_find(const char *text, size_t len, size_t old, const char *const *stops, int n) {
    int64_t best = -1;
    for (int i = 0; i < n; i++) {
        size_t sl = strlen(stops[i]);
        if (sl == 0 || len < sl) continue;
        for (size_t k = old >= sl ? old - sl + 1 : 0; k + sl <= len && (best < 0 || (int64_t)k < best); k++)
            if (text[k] == stops[i][0] && memcmp(text + k, stops[i], sl) == 0) { best = (int64_t)k; break; }
    }
    return best;
}

/* Length of the longest suffix of text that is a proper prefix of some stop string: that much
   text is held back from the callback because it may become a stop string. */
QSA_PRIV size_t qsa__stop_holdback(const char *text, size_t len, const char *const *stops, int n) {
    size_t best = 0;
    for (int i = 0; i < n; i++) {
        size_t sl = strlen(stops[i]);
        for (size_t k = sl > 1 ? sl - 1 : 0; k > best; k--)
            if (k <= len && memcmp(text + len - k, stops[i], k) == 0) { best = k; break; }
    }
    return best;
}

QSA_PRIV qsa_result qsa__generate(qsa_seq *seq, const int32_t *prompt, int n_prompt, const qsa_generate_params *gp,
                                  qsa_generation *out) {
    if (out) memset(out, 0, sizeof *out); /* (freed with qsa_generation_free whatever the result) */
    if (!seq || !out || (n_prompt > 0 && !prompt) || n_prompt < 0)
        return qsa__fail(QSA_ERR_INVALID_ARGUMENT, "qsa_generate: NULL or negative argument");
    qsa_generate_params p;
    memset(&p, 0, sizeof p);
    if (gp) p = *gp;
    if (p.max_tokens < 0 || p.n_stop_strings < 0 || (p.eos_ids && p.n_eos_ids < 0))
        return qsa__fail(QSA_ERR_INVALID_ARGUMENT, "qsa_generate: max_tokens %d, n_stop_strings %d, n_eos_ids %d: expected >= 0",
                         p.max_tokens, p.n_stop_strings, p.n_eos_ids);
    if (p.n_stop_strings > 0 && !p.stop_strings)
        return qsa__fail(QSA_ERR_INVALID_ARGUMENT, "qsa_generate: n_stop_strings %d with NULL stop_strings", p.n_stop_strings);
    for (int i = 0; i < p.n_stop_strings; i++) {
        if (!p.stop_strings[i]) return qsa__fail(QSA_ERR_INVALID_ARGUMENT, "qsa_generate: stop string %d is NULL", i);
        /* (the text is well-formed UTF-8: a stop string that is not would cut it inside a character) */
        QSA__TRY(qsa__u8_validate(p.stop_strings[i], strlen(p.stop_strings[i]), "qsa_generate: stop string"));
    }
    qsa_model *m = seq->m;
    const qsa_tokenizer *tok = m->tok;
    int V = m->cfg.vocab_size;
    const int32_t *eos = p.eos_ids;
    int n_eos = p.n_eos_ids;
    if (!eos) {
        if (m->gen.n_eos) { eos = m->gen.eos_token_ids; n_eos = m->gen.n_eos; }
        else { eos = m->cfg.eos_token_ids; n_eos = m->cfg.n_eos; }
    }
    if (n_prompt == 0) /* (whatever the sequence holds: the first draw is from the logits of the prompt's last token) */
        return qsa__fail(QSA_ERR_INVALID_ARGUMENT, "qsa_generate: n_prompt 0: a prompt of at least one token is needed");
    int room = seq->n_ctx - seq->pos - n_prompt;
    if (room < 1)
        return qsa__fail(QSA_ERR_CONTEXT_FULL, "qsa_generate: prompt of %d tokens at position %d leaves no room in the context of %d",
                         n_prompt, seq->pos, seq->n_ctx);
    int max_new = p.max_tokens > 0 && p.max_tokens < room + 1 ? p.max_tokens : room + 1;
    qsa_sampler *smp = NULL;
    QSA__TRY(qsa_sampler_create(&p.sampling, &smp));
    float *logits = (float *)qsa_host_alloc(m, (size_t)V * sizeof(float)); /* page-locked on CUDA */
    /* on one GPU the prompt's last row and each decode step's reduce the draw's logits to its candidates on the
       device (as the scheduler's steps: struct qsa__cand_req); the same tokens */
    int ck = m->cuda && !m->tp ? qsa__sampler_cand_k(smp, V) : -1, from_cand = 0, penalised = 0;
    qsa__cand_req cq = {&smp, NULL, ck > 1 ? ck : 1};
    if (ck >= 0 && !(cq.out = (int32_t *)qsa_host_alloc(m, QSA__CAND_STRIDE(cq.kmax) * sizeof(int32_t)))) ck = -1;
    out->tokens = QSA__ALLOC(int32_t, max_new);
    qsa__buf text;
    memset(&text, 0, sizeof text);
    qsa_detok_stream ds;
    memset(&ds, 0, sizeof ds);
    if (tok) qsa_detok_stream_init(&ds, tok, QSA_DETOK_SKIP_SPECIAL | QSA_DETOK_SKIP_UNKNOWN);
    size_t emitted = 0;
    qsa_result r = QSA_OK;
    char emsg[1024]; /* a failure part-way: its message, kept over the text's completion */
    if (!logits || !out->tokens || !qsa__buf_reserve(&text, 64)) { r = qsa__fail(QSA_ERR_OUT_OF_MEMORY, "qsa_generate: out of memory"); goto done; }
    double t0, t_first;
    t0 = t_first = qsa__now();
    /* (the prompt's draw starts on the device too: its last token's row) */
    if ((r = qsa__seq_feed(seq, prompt, n_prompt, logits, 0, ck >= 0 ? &cq : NULL)) != QSA_OK) goto done;
    from_cand = ck >= 0 && cq.out[1] >= 0;
    penalised = ck >= 0 && cq.out[1] == -2;
    out->stats.n_prompt = n_prompt;
    out->stats.prefill_s = qsa__now() - t0;
    for (;;) {
        /* (logits that a step sent with the penalty applied: qsa__cand_req) */
        int32_t t = from_cand  ? qsa__sampler_from_cand(smp, cq.out, cq.kmax)
                    : penalised ? qsa__sampler_sample_z(smp, logits, V, NULL, 0, qsa__cand_z(cq.out, cq.kmax))
                                : qsa_sampler_sample(smp, logits, V, seq->tokens, seq->pos);
        if (t < 0) { r = QSA_ERR_OUT_OF_MEMORY; break; }
        out->tokens[out->n_tokens++] = t;
        double now = qsa__now();
        if (out->n_tokens == 1) { t_first = now; out->stats.ttft_s = now - t0; }
        out->stats.decode_s = now - t_first;
        int is_eos = 0;
        for (int i = 0; i < n_eos; i++) is_eos |= eos[i] == t;
        if (is_eos && !p.ignore_eos) { out->stop = QSA_STOP_EOS; break; }
        size_t old = text.len;
        if (tok) {
            const char *piece;
            size_t plen;
            if ((r = qsa_detok_stream_push(&ds, t, &piece, &plen)) != QSA_OK) break;
            if (!qsa__buf_put(&text, piece, plen)) { r = qsa__fail(QSA_ERR_OUT_OF_MEMORY, "qsa_generate: out of memory"); break; }
        }
        /* stop strings: cut the text at the earliest match */
        int64_t at = qsa__stop_find(text.data, text.len, old, p.stop_strings, p.n_stop_strings);
        int stopped = at >= 0;
        if (stopped) { text.len = (size_t)at; text.data[text.len] = 0; }
        size_t hold = stopped ? 0 : qsa__stop_holdback(text.data, text.len, p.stop_strings, p.n_stop_strings);
        size_t upto = text.len > hold ? text.len - hold : 0;
        if (p.on_token && upto >= emitted) {
            if (p.on_token(p.user, t, text.data + emitted, upto - emitted)) { emitted = upto; out->stop = QSA_STOP_CALLBACK; break; }
            emitted = upto;
        }
        if (stopped) { out->stop = QSA_STOP_STRING; break; }
        if (out->n_tokens >= max_new) { out->stop = QSA_STOP_MAX_TOKENS; break; }
        /* (a failure: the pool or the device, part-way) */
        if (ck >= 0) {
            if ((r = qsa__feed_batch(&seq, &t, 1, logits, NULL, &cq)) != QSA_OK) break;
            from_cand = cq.out[1] >= 0;
            penalised = cq.out[1] == -2;
        } else if ((r = qsa_seq_feed(seq, &t, 1, logits, 0)) != QSA_OK) {
            break;
        }
    }
    /* (after a failure part-way, out keeps what was generated: its tokens, text and statistics, stop NONE) */
    if (r != QSA_OK) snprintf(emsg, sizeof emsg, "%s", qsa_last_error());
    if (tok && out->stop != QSA_STOP_STRING && out->stop != QSA_STOP_CALLBACK) {
        /* text held back for a stop string that never came, then any incomplete UTF-8 tail */
        const char *piece;
        size_t plen;
        if (qsa_detok_stream_flush(&ds, &piece, &plen) == QSA_OK && plen) qsa__buf_put(&text, piece, plen);
        if (p.on_token && text.len > emitted) p.on_token(p.user, -1, text.data + emitted, text.len - emitted);
    }
    out->stats.n_generated = out->n_tokens;
    out->stats.prefill_tok_s = out->stats.prefill_s > 0 ? n_prompt / out->stats.prefill_s : 0;
    out->stats.decode_tok_s = out->stats.decode_s > 0 ? (out->n_tokens - 1) / out->stats.decode_s : 0;
    out->text = text.data ? text.data : qsa__strdup("");
    out->text_len = text.len;
    text.data = NULL;
    if (r != QSA_OK) qsa__fail(r, "%s", emsg);
done:
    if (tok) qsa_detok_stream_free(&ds);
    qsa__buf_free(&text);
    qsa_host_free(logits);
    qsa_host_free(cq.out);
    qsa_sampler_free(smp);
    if (r != QSA_OK && !out->n_tokens) qsa_generation_free(out);
    return r;
}
QSA_IMPL qsa_result qsa_generate(qsa_seq *seq, const int32_t *prompt, int n_prompt, const qsa_generate_params *gp,
                                 qsa_generation *out) {
    qsa_model *m = seq ? seq->m : NULL;
    qsa__model_enter(m);
    qsa_result r = qsa__generate(seq, prompt, n_prompt, gp, out);
    qsa__model_leave(m);
    return r;
}

/* ---- writing safetensors (tools: logits dumps, captures) ---- */

typedef struct qsa__st_out {
    const char *name;
    qsa__dtype dtype;
    int ndim;
    int64_t shape[4];
    const void *data;
} qsa__st_out;

/* Write tensors (in the given order) to `path` via a temporary file and rename. */
QSA_PRIV qsa_result qsa__st_write(const char *path, const qsa__st_out *t, int n) {
    static const char *dn[] = {"F32", "F16", "BF16", "F8_E4M3", "U8", "I64", "I32"};
    qsa__buf h;
    memset(&h, 0, sizeof h);
    size_t off = 0;
    int ok = qsa__buf_puts(&h, "{\"__metadata__\":{\"format\":\"pt\"}");
    for (int i = 0; i < n && ok; i++) {
        size_t bytes = qsa__dtype_size(t[i].dtype);
        char tmp[512];
        for (int d = 0; d < t[i].ndim; d++) bytes *= (size_t)t[i].shape[d];
        snprintf(tmp, sizeof tmp, ",\"%s\":{\"dtype\":\"%s\",\"shape\":[", t[i].name, dn[t[i].dtype]);
        ok &= qsa__buf_puts(&h, tmp);
        for (int d = 0; d < t[i].ndim; d++) {
            snprintf(tmp, sizeof tmp, "%s%lld", d ? "," : "", (long long)t[i].shape[d]);
            ok &= qsa__buf_puts(&h, tmp);
        }
        snprintf(tmp, sizeof tmp, "],\"data_offsets\":[%zu,%zu]}", off, off + bytes);
        ok &= qsa__buf_puts(&h, tmp);
        off += bytes;
    }
    ok &= qsa__buf_puts(&h, "}");
    while (ok && h.len % 8) ok &= qsa__buf_puts(&h, " ");
    if (!ok) { qsa__buf_free(&h); return qsa__fail(QSA_ERR_OUT_OF_MEMORY, "write '%s': out of memory", path); }
    char *tmpname = QSA__ALLOC(char, strlen(path) + 8);
    if (!tmpname) { qsa__buf_free(&h); return qsa__fail(QSA_ERR_OUT_OF_MEMORY, "write '%s': out of memory", path); }
    sprintf(tmpname, "%s.tmp", path);
    FILE *f = fopen(tmpname, "wb");
    qsa_result r = QSA_OK;
    if (!f) r = qsa__fail(QSA_ERR_IO, "write '%s': %s", tmpname, strerror(errno));
    else {
        uint64_t hl = h.len;
        uint8_t le[8];
        for (int i = 0; i < 8; i++) le[i] = (uint8_t)(hl >> (8 * i));
        int wok = fwrite(le, 1, 8, f) == 8 && fwrite(h.data, 1, h.len, f) == h.len;
        for (int i = 0; i < n && wok; i++) {
            size_t bytes = qsa__dtype_size(t[i].dtype);
            for (int d = 0; d < t[i].ndim; d++) bytes *= (size_t)t[i].shape[d];
            wok = !bytes || fwrite(t[i].data, 1, bytes, f) == bytes;
        }
        if (fclose(f) != 0) wok = 0;
        if (!wok) r = qsa__fail(QSA_ERR_IO, "write '%s': %s", tmpname, strerror(errno));
        else if (rename(tmpname, path) != 0) r = qsa__fail(QSA_ERR_IO, "rename '%s' -> '%s': %s", tmpname, path, strerror(errno));
        if (r != QSA_OK) remove(tmpname);
    }
    qsa__free(tmpname);
    qsa__buf_free(&h);
    return r;
}

/* ============================================================================================== */
/* >>capture  capture and replay of one QSA layer                                                 */
/* ============================================================================================== */

QSA_IMPL qsa_result qsa_seq_capture_begin(qsa_seq *s, int layer) {
    if (!s) return qsa__fail(QSA_ERR_INVALID_ARGUMENT, "qsa_seq_capture_begin: NULL sequence");
    if (layer < 0 || layer >= s->m->cfg.num_hidden_layers || s->m->cfg.layer_types[layer] != QSA_LAYER_QSA)
        return qsa__fail(QSA_ERR_INVALID_ARGUMENT, "qsa_seq_capture_begin: layer %d is not a QSA layer", layer);
    if (s->cuda) return qsa__fail(QSA_ERR_UNSUPPORTED, "qsa_seq_capture_begin: capture runs on the CPU backend");
    qsa__capture *cap = QSA__CALLOC(qsa__capture, 1); /* (a capture in progress stays when this fails) */
    if (!cap) return qsa__fail(QSA_ERR_OUT_OF_MEMORY, "capture: out of memory");
    qsa__capture_free(s);
    s->cap = cap;
    s->cap->layer = layer;
    return QSA_OK;
}

QSA_IMPL qsa_result qsa_seq_capture_end(qsa_seq *s, const char *path) {
    if (!s || !path) return qsa__fail(QSA_ERR_INVALID_ARGUMENT, "qsa_seq_capture_end: NULL %s", s ? "path" : "sequence");
    if (!s->cap) return qsa__fail(QSA_ERR_INVALID_ARGUMENT, "qsa_seq_capture_end: no capture in progress");
    const qsa_model_config *c = &s->m->cfg;
    const qsa__pool *pl = &s->m->pool;
    qsa__capture *cp = s->cap;
    int slot = pl->slot[cp->layer], np = s->n_pages, n = cp->n, ps = pl->page_size;
    int topk = c->has_qsa ? c->indexer_budget / c->indexer_compress_ratio : 0;
    int64_t meta[12] = {cp->layer, ps, c->num_attention_heads, c->num_key_value_heads, c->head_dim,
                        c->has_qsa ? c->indexer_compress_ratio : 1, topk, n, np, pl->kvd, QSA_ATTN_SPLIT,
                        s->m->params.debug_physical_order};
    size_t page_vals = (size_t)ps * pl->kvd;
    float *k = QSA__ALLOC(float, (size_t)np * page_vals + 1), *v = QSA__ALLOC(float, (size_t)np * page_vals + 1);
    int32_t end = (int32_t)(cp->seg.len / sizeof(qsa__seg));
    size_t off_len = cp->seg_off.len; /* (the entry added here goes again when the write fails) */
    qsa_result r = QSA_OK;
    if (!k || !v || !qsa__buf_put(&cp->seg_off, &end, 4)) r = qsa__fail(QSA_ERR_OUT_OF_MEMORY, "capture: out of memory");
    if (r == QSA_OK) {
        for (int i = 0; i < np; i++) {
            memcpy(k + i * page_vals, qsa__pool_k(pl, slot, s->bt[i], 0), sizeof(float) * page_vals);
            memcpy(v + i * page_vals, qsa__pool_v(pl, slot, s->bt[i], 0), sizeof(float) * page_vals);
        }
        /* the slots past the last token written hold what the page's previous user left there (or
           uninitialised memory): no query reads them, and they stay out of the file */
        int64_t used = s->pos;
        if (n > 0) {
            int64_t last;
            memcpy(&last, cp->pos.data + cp->pos.len - 8, 8); /* (after a failed feed, past s->pos) */
            if (last + 1 > used) used = last + 1;
        }
        if ((size_t)used < (size_t)np * ps) {
            memset(k + (size_t)used * pl->kvd, 0, sizeof(float) * ((size_t)np * page_vals - (size_t)used * pl->kvd));
            memset(v + (size_t)used * pl->kvd, 0, sizeof(float) * ((size_t)np * page_vals - (size_t)used * pl->kvd));
        }
        qsa__st_out t[11];
        memset(t, 0, sizeof t);
#define QSA__T(i, nm, dt, nd, s0, s1, s2, ptr) \
    do { t[i].name = nm; t[i].dtype = dt; t[i].ndim = nd; t[i].shape[0] = s0; t[i].shape[1] = s1; t[i].shape[2] = s2; t[i].data = ptr; } while (0)
        QSA__T(0, "meta", QSA__I64, 1, 12, 0, 0, meta);
        QSA__T(1, "pos", QSA__I64, 1, n, 0, 0, cp->pos.data);
        QSA__T(2, "q", QSA__F32, 2, n, 2 * c->num_attention_heads * c->head_dim, 0, cp->q.data);
        QSA__T(3, "sel", QSA__I32, 2, n, topk, 0, cp->sel.data);
        QSA__T(4, "nsel", QSA__I32, 1, n, 0, 0, cp->nsel.data);
        QSA__T(5, "out", QSA__F32, 2, n, c->num_attention_heads * c->head_dim, 0, cp->out.data);
        QSA__T(6, "plan", QSA__I32, 2, end, 4, 0, cp->seg.data);
        QSA__T(7, "plan_off", QSA__I32, 1, n + 1, 0, 0, cp->seg_off.data);
        QSA__T(8, "bt", QSA__I32, 1, np, 0, 0, s->bt);
        QSA__T(9, "k", QSA__F32, 3, np, ps, pl->kvd, k);
        QSA__T(10, "v", QSA__F32, 3, np, ps, pl->kvd, v);
#undef QSA__T
        r = qsa__st_write(path, t, 11);
    }
    qsa__free(k);
    qsa__free(v);
    if (r == QSA_OK) qsa__capture_free(s);
    else cp->seg_off.len = off_len; /* the capture goes on: end it again, with another path */
    return r;
}

static int qsa__cmp_i32(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

/* The index of v in the ascending a[0..n-1], -1 when it is not there */
QSA_PRIV int qsa__rank_i32(const int32_t *a, int n, int32_t v) {
    int lo = 0, hi = n;
    while (lo < hi) {
        int mid = lo + (hi - lo) / 2;
        if (a[mid] < v) lo = mid + 1;
        else hi = mid;
    }
    return lo < n && a[lo] == v ? lo : -1;
}

QSA_IMPL qsa_result qsa_replay_capture(const char *path, qsa_replay_mode mode, qsa_replay_report *rep) {
    if (!path || !rep) return qsa__fail(QSA_ERR_INVALID_ARGUMENT, "qsa_replay_capture: NULL argument");
    if (mode != QSA_REPLAY_FROZEN_PLAN && mode != QSA_REPLAY_PLANNER && mode != QSA_REPLAY_PHYSICAL_ORDER)
        return qsa__fail(QSA_ERR_INVALID_ARGUMENT, "qsa_replay_capture: unknown mode %d", (int)mode);
    memset(rep, 0, sizeof *rep);
    rep->first_query = rep->first_index = -1;
    qsa__st_set st;
    QSA__TRY(qsa__st_open_file(path, &st));
    const qsa__tensor *T[11];
    static const char *names[11] = {"meta", "pos", "q", "sel", "nsel", "out", "plan", "plan_off", "bt", "k", "v"};
    qsa_result r = QSA_OK;
    for (int i = 0; i < 11 && r == QSA_OK; i++)
        if (!(T[i] = qsa__st_find(&st, names[i]))) r = qsa__fail(QSA_ERR_NOT_FOUND, "%s: tensor '%s' missing: not a capture file", path, names[i]);
    int64_t meta[12];
    if (r == QSA_OK && (T[0]->dtype != QSA__I64 || T[0]->nbytes != sizeof meta))
        r = qsa__fail(QSA_ERR_FORMAT, "%s: 'meta' must be I64 [12]", path);
    if (r != QSA_OK) { qsa__st_close(&st); return r; }
    memcpy(meta, T[0]->data, sizeof meta);
    for (int i = 1; i <= 10; i++) /* (each read as an int below) */
        if (meta[i] < 0 || meta[i] > INT32_MAX) {
            qsa__st_close(&st);
            return qsa__fail(QSA_ERR_FORMAT, "%s: meta[%d] = %lld out of range", path, i, (long long)meta[i]);
        }
    int ps = (int)meta[1], nh = (int)meta[2], nkv = (int)meta[3], hd = (int)meta[4], rr = (int)meta[5], topk = (int)meta[6];
    int n = (int)meta[7], np = (int)meta[8], kvd = (int)meta[9];
    /* every tensor must have the size the meta data implies */
    /* (products saturate at SIZE_MAX, which no tensor has: a hostile meta wrapped them to 0) */
#define QSA__MULZ(a, b) ((a) && (size_t)(b) > SIZE_MAX / (a) ? SIZE_MAX : (a) * (size_t)(b))
    size_t nqh = QSA__MULZ(QSA__MULZ((size_t)n, nh), hd), kvb = QSA__MULZ(QSA__MULZ(QSA__MULZ((size_t)np, ps), kvd), 4);
    size_t want[11] = {sizeof meta, (size_t)n * 8, QSA__MULZ(nqh, 8), QSA__MULZ(QSA__MULZ((size_t)n, topk), 4), (size_t)n * 4,
                       QSA__MULZ(nqh, 4), 0, ((size_t)n + 1) * 4, (size_t)np * 4, kvb, kvb};
#undef QSA__MULZ
    static const qsa__dtype dts[11] = {QSA__I64, QSA__I64, QSA__F32, QSA__I32, QSA__I32, QSA__F32,
                                       QSA__I32, QSA__I32, QSA__I32, QSA__F32, QSA__F32};
    for (int i = 1; i < 11 && r == QSA_OK; i++)
        if (T[i]->dtype != dts[i])
            r = qsa__fail(QSA_ERR_FORMAT, "%s: tensor '%s' is %s, expected %s", path, names[i], qsa__dtype_name(T[i]->dtype),
                          qsa__dtype_name(dts[i]));
    if (r == QSA_OK && (ps < 1 || nh < 1 || nkv < 1 || hd < 1 || rr < 1 || topk < 0 || n < 0 || np < 0 ||
                        (int64_t)kvd != (int64_t)nkv * hd || nh % nkv))
        r = qsa__fail(QSA_ERR_FORMAT, "%s: inconsistent meta data", path);
    for (int i = 0; i < 11 && r == QSA_OK; i++)
        if (i != 6 && T[i]->nbytes != want[i])
            r = qsa__fail(QSA_ERR_SHAPE, "%s: tensor '%s' has %zu bytes, expected %zu", path, names[i], T[i]->nbytes, want[i]);
    qsa__pool pool;
    memset(&pool, 0, sizeof pool);
    int32_t *bt = NULL, *ids = NULL, *offs = NULL, *sel = NULL, *nsel = NULL;
    float *acc = NULL, *o = NULL, *qh = NULL, *want_out = NULL;
    qsa__plan plan;
    memset(&plan, 0, sizeof plan);
    if (r == QSA_OK) {
        bt = QSA__ALLOC(int32_t, np + 1);
        ids = QSA__ALLOC(int32_t, np + 1);
        offs = QSA__ALLOC(int32_t, n + 1);
        sel = QSA__ALLOC(int32_t, (size_t)n * topk + 1);
        nsel = QSA__ALLOC(int32_t, n + 1);
        acc = QSA__ALLOC(float, hd);
        o = QSA__ALLOC(float, hd);
        qh = QSA__ALLOC(float, 2 * hd);
        want_out = QSA__ALLOC(float, hd);
        if (!bt || !ids || !offs || !sel || !nsel || !acc || !o || !qh || !want_out) r = qsa__fail(QSA_ERR_OUT_OF_MEMORY, "replay: out of memory");
    }
    if (r == QSA_OK) {
        memcpy(bt, T[8]->data, (size_t)np * 4);
        memcpy(offs, T[7]->data, (size_t)(n + 1) * 4);
        memcpy(sel, T[3]->data, (size_t)n * topk * 4);
        memcpy(nsel, T[4]->data, (size_t)n * 4);
        /* a pool holding the captured pages in their captured physical order: page ids renumbered
           0..np-1 by rank (the physical-order planner compares ids only; a captured id of 2^30 must
           not ask for 2^30 pages), each id once */
        memcpy(ids, bt, (size_t)np * 4);
        if (np > 1) qsort(ids, (size_t)np, 4, qsa__cmp_i32);
        for (int i = 0; i < np && r == QSA_OK; i++)
            if (ids[i] < 0 || (i && ids[i] == ids[i - 1]))
                r = qsa__fail(QSA_ERR_FORMAT, "%s: page id %d %s", path, ids[i], ids[i] < 0 ? "is negative" : "is in the block table twice");
        for (int i = 0; i < np && r == QSA_OK; i++) bt[i] = qsa__rank_i32(ids, np, bt[i]);
        pool.n_pages = np;
    }
    if (r == QSA_OK) {
        pool.page_size = ps;
        pool.kvd = kvd;
        pool.n_qsa = 1;
        pool.k = QSA__CALLOC(float, (size_t)pool.n_pages * ps * kvd + 1);
        pool.v = QSA__CALLOC(float, (size_t)pool.n_pages * ps * kvd + 1);
        if (!pool.k || !pool.v) r = qsa__fail(QSA_ERR_OUT_OF_MEMORY, "replay: out of memory");
        for (int i = 0; r == QSA_OK && i < np; i++) {
            memcpy(qsa__pool_k(&pool, 0, bt[i], 0), T[9]->data + (size_t)i * ps * kvd * 4, (size_t)ps * kvd * 4);
            memcpy(qsa__pool_v(&pool, 0, bt[i], 0), T[10]->data + (size_t)i * ps * kvd * 4, (size_t)ps * kvd * 4);
        }
    }
    int nseg_total = r == QSA_OK ? (int)(T[6]->nbytes / sizeof(qsa__seg)) : 0;
    for (int t = 0; r == QSA_OK && t < n; t++) {
        int64_t pos;
        memcpy(&pos, T[1]->data + 8 * (size_t)t, 8);
        if (mode == QSA_REPLAY_FROZEN_PLAN) {
            if (offs[t] < 0 || offs[t] > offs[t + 1] || offs[t + 1] > nseg_total) { r = qsa__fail(QSA_ERR_FORMAT, "%s: bad plan offsets", path); break; }
            plan.n_seg = plan.n_tokens = 0;
            for (int i = offs[t]; i < offs[t + 1]; i++) {
                qsa__seg sg;
                memcpy(&sg, T[6]->data + (size_t)i * sizeof sg, sizeof sg);
                sg.page = qsa__rank_i32(ids, np, sg.page); /* (-1: not a page of the capture) */
                if (sg.page < 0 || sg.offset < 0 || sg.len < 0 || sg.offset > ps || sg.len > ps - sg.offset) {
                    r = qsa__fail(QSA_ERR_FORMAT, "%s: plan segment %d out of range", path, i);
                    break;
                }
                if (!qsa__plan_push(&plan, sg.page, sg.offset, sg.len, sg.logical)) r = qsa__fail(QSA_ERR_OUT_OF_MEMORY, "replay: out of memory");
            }
        } else {
            if (pos < 0 || pos / ps >= np || nsel[t] < 0 || nsel[t] > topk) { r = qsa__fail(QSA_ERR_FORMAT, "%s: query %d does not fit the capture", path, t); break; }
            int nb = (int)((pos + 1) / rr), ns = nsel[t];
            const int32_t *qs = sel + (size_t)t * topk; /* the planner's blocks: complete, ascending */
            for (int i = 0; i < ns && r == QSA_OK; i++)
                if (qs[i] < 0 || qs[i] >= nb || (i && qs[i] <= qs[i - 1]))
                    r = qsa__fail(QSA_ERR_FORMAT, "%s: query %d (position %lld): selected block %d is not one of its %d complete "
                                  "blocks in ascending order", path, t, (long long)pos, qs[i], nb);
            if (r != QSA_OK) break;
            r = qsa__plan_build(&plan, sel + (size_t)t * topk, ns, nb, rr, pos, ps, bt, mode == QSA_REPLAY_PHYSICAL_ORDER);
        }
        for (int h = 0; r == QSA_OK && h < nh; h++) {
            /* copies: tensor data in a file need not be aligned */
            memcpy(qh, T[2]->data + ((size_t)t * 2 * nh + (size_t)h * 2) * hd * 4, (size_t)2 * hd * 4);
            memcpy(want_out, T[5]->data + ((size_t)t * nh + h) * hd * 4, (size_t)hd * 4);
            const float *gate = qh + hd;
            qsa__attn_head_plan(&pool, 0, &plan, qh, h / (nh / nkv), hd, o, acc);
            for (int d = 0; d < hd; d++) {
                float got = o[d] * qsa__sigmoid(gate[d]), w = want_out[d];
                rep->n_values++;
                if (memcmp(&got, &w, 4) != 0) {
                    if (rep->n_differ++ == 0) {
                        rep->first_query = t;
                        rep->first_index = h * hd + d;
                        rep->first_captured = w;
                        rep->first_replayed = got;
                    }
                }
            }
        }
        rep->n_queries++;
    }
    qsa__free(plan.seg);
    qsa__free(pool.k);
    qsa__free(pool.v);
    qsa__free(bt); qsa__free(ids); qsa__free(offs); qsa__free(sel); qsa__free(nsel); qsa__free(acc); qsa__free(o);
    qsa__free(qh); qsa__free(want_out);
    qsa__st_close(&st);
    return r;
}

/* ============================================================================================== */
/* >>tp-plan  how every tensor is split over TP ranks                                             */
/* ============================================================================================== */
/* The sharding plan of tensor parallelism (docs/TP.md has the table with the real model's shapes).
   Megatron-style pairs: a column-parallel matrix (rows split, QSA_TP_ROWS) feeds a row-parallel one
   (columns split, QSA_TP_COLS) with no communication in between; each row-parallel product leaves a
   partial sum on every rank, which the ranks all-gather ([tp][H] fp32) and add in rank order 0..tp-1,
   so every rank ends with the same bits whatever algorithm NCCL picks.
     attention   q_proj rows by query head (whole [q | gate] heads of 2*head_dim rows), k/v_proj rows
                 by KV head (replicated on tp / num_key_value_heads ranks when tp exceeds them),
                 o_proj columns.  q_norm / k_norm replicated.
     GDN         split by key-head groups: in_proj_qkv and conv1d channels in three runs (q, k, v;
                 value heads follow their key heads), in_proj_z / in_proj_b / in_proj_a / A_log /
                 dt_bias rows by value head, out_proj columns.  The recurrent state splits with them.
     MoE         routed and shared experts along the intermediate dimension (gate/up rows, down
                 columns; the fused gate_up_proj in two runs).  Router and shared_expert_gate
                 replicated: every rank routes identically.
     PLE         the n-gram tables by columns (each rank gathers its columns of every head's row),
                 the embedding e all-gathered, key/value projections, norms and conv replicated.
     lm_head     vocab rows; floor(V/tp) each, the last V % tp ranks one more; logits all-gathered.
     replicated  embed_tokens (a lookup), every hyper-connection weight, the QSA indexer (its block
                 selection is shared by all heads and must be identical on every rank; splitting it
                 would need a reduction of every block score of every query), norms.
   The reference's base_model_tp_plan gathers the output of the GDN projections and the indexer
   (colwise_gather_output) and splits the HC down projections' input (rowwise_split_input): that
   shards memory, not work, and costs one collective per projection per layer; these matrices are
   small next to the experts, so the runtime replicates what it does not split by heads. */

QSA_PRIV void qsa__tp_note(char *buf, size_t cap, size_t *len, int *n, const char *fmt, ...) QSA__PRINTF(5, 6);
QSA_PRIV void qsa__tp_note(char *buf, size_t cap, size_t *len, int *n, const char *fmt, ...) {
    va_list ap;
    if (*len + 3 >= cap) return;
    if ((*n)++) { memcpy(buf + *len, "; ", 3); *len += 2; }
    va_start(ap, fmt);
    int w = vsnprintf(buf + *len, cap - *len, fmt, ap);
    va_end(ap);
    if (w > 0) *len = *len + (size_t)w < cap ? *len + (size_t)w : cap - 1;
}

/* module name as the quantisation exclude patterns see it: "lm_head", else "model.<relative name>" */
QSA_PRIV int qsa__tp_quantised(const qsa_model_config *c, const char *rel, size_t rel_len) {
    char mod[320];
    if (!c->nvfp4) return 0;
    if (rel_len == 7 && !strncmp(rel, "lm_head", 7)) snprintf(mod, sizeof mod, "lm_head");
    else snprintf(mod, sizeof mod, "model.%.*s", (int)rel_len, rel);
    return !qsa_config_quant_excluded(c, mod);
}

QSA_PRIV int qsa__tp_group(const qsa_model_config *c) { return c->quant_group_size > 0 ? c->quant_group_size : 16; }

QSA_IMPL qsa_result qsa_tp_check(const qsa_model_config *c, int tp) {
    if (!c) return qsa__fail(QSA_ERR_INVALID_ARGUMENT, "qsa_tp_check: NULL config");
    if (tp < 1 || tp > QSA_TP_MAX)
        return qsa__fail(QSA_ERR_INVALID_ARGUMENT, "qsa_tp_check: tp %d: expected 1..%d ranks", tp, QSA_TP_MAX);
    char msg[900];
    size_t len = 0;
    int n = 0, n_lin = 0, n_qsa = 0, g = qsa__tp_group(c);
    msg[0] = 0;
    for (int L = 0; L < c->num_hidden_layers; L++) {
        if (c->layer_types[L] == QSA_LAYER_QSA) n_qsa++;
        else n_lin++;
    }
    int nh = c->num_attention_heads, nkv = c->num_key_value_heads;
    if (n_qsa && nh % tp)
        qsa__tp_note(msg, sizeof msg, &len, &n, "num_attention_heads %d is not divisible by tp (attention is split by query "
                     "heads)", nh);
    else if (n_qsa && (tp <= nkv ? nkv % tp : tp % nkv))
        qsa__tp_note(msg, sizeof msg, &len, &n, "num_key_value_heads %d: a rank's %d query heads must use whole KV heads "
                     "(num_key_value_heads divisible by tp) or share one (tp divisible by num_key_value_heads)", nkv, nh / tp);
    if (n_lin && c->linear_num_key_heads % tp)
        qsa__tp_note(msg, sizeof msg, &len, &n, "linear_num_key_heads %d is not divisible by tp (Gated DeltaNet is split by "
                     "key-head groups)", c->linear_num_key_heads);
    if (c->moe_intermediate_size % tp)
        qsa__tp_note(msg, sizeof msg, &len, &n, "moe_intermediate_size %d is not divisible by tp (routed experts are split "
                     "along their intermediate dimension)", c->moe_intermediate_size);
    if (c->shared_expert_intermediate_size % tp)
        qsa__tp_note(msg, sizeof msg, &len, &n, "shared_expert_intermediate_size %d is not divisible by tp",
                     c->shared_expert_intermediate_size);
    if (c->n_ple_layers) {
        int heads = (c->ngram_size - 1) * c->heads_per_ngram, dh = heads > 0 ? c->ple_embed_dim / heads : 0;
        if (dh % tp)
            qsa__tp_note(msg, sizeof msg, &len, &n, "ple_embed_dim %d / %d n-gram heads = %d columns per head is not divisible "
                         "by tp (the PLE tables are split by columns)", c->ple_embed_dim, heads, dh);
    }
    if (c->vocab_size < tp) qsa__tp_note(msg, sizeof msg, &len, &n, "vocab_size %d is smaller than tp", c->vocab_size);
    /* NVFP4 block scales cover 16 consecutive input columns: a column split must not cut a group */
    if (c->nvfp4) {
        /* the column-split linears: o_proj, out_proj, routed and shared down_proj (local columns, divisible) */
        int64_t ocols = (int64_t)nh * c->head_dim, gcols = (int64_t)c->linear_num_value_heads * c->linear_value_head_dim;
        int64_t cols[4] = {ocols, gcols, c->moe_intermediate_size, c->shared_expert_intermediate_size};
        int divides[4] = {nh % tp == 0, c->linear_num_key_heads % tp == 0, c->moe_intermediate_size % tp == 0,
                          c->shared_expert_intermediate_size % tp == 0};
        static const char *const fmt[4] = {"layers.%d.self_attn.o_proj", "layers.%d.linear_attn.out_proj",
                                           "layers.%d.mlp.experts.0.down_proj", "layers.%d.mlp.shared_expert.down_proj"};
        for (int k = 0; k < 4; k++) {
            if (!divides[k] || (cols[k] / tp) % g == 0) continue;
            for (int L = 0; L < c->num_hidden_layers; L++) {
                char mod[96];
                if ((k == 0 && c->layer_types[L] != QSA_LAYER_QSA) || (k == 1 && c->layer_types[L] != QSA_LAYER_LINEAR)) continue;
                snprintf(mod, sizeof mod, fmt[k], L);
                if (!qsa__tp_quantised(c, mod, strlen(mod))) continue;
                qsa__tp_note(msg, sizeof msg, &len, &n, "%s is NVFP4: each rank's %lld input columns are not a multiple of the "
                             "quantisation group %d", mod, (long long)(cols[k] / tp), g);
                break;
            }
        }
    }
    if (n) return qsa__fail(QSA_ERR_INVALID_ARGUMENT, "qsa_tp_check: the model cannot be split over tp = %d ranks: %s", tp, msg);
    return QSA_OK;
}

/* How the split dimension of one logical tensor is cut for a rank (before NVFP4 packing). */
typedef struct qsa__tp_spec {
    qsa_tp_kind kind;
    int copies, n_runs;
    int64_t rb[QSA_TP_MAX_RUNS], rc[QSA_TP_MAX_RUNS];
} qsa__tp_spec;

/* one qsa_tp_slice_for call */
typedef struct qsa__tp_ctx {
    const qsa_model_config *c;
    int tp, rank;
    const char *name; /* as the caller wrote it (messages) */
    const char *rel;  /* without the model prefix */
    qsa_tp_slice *out;
} qsa__tp_ctx;

QSA_PRIV qsa__tp_spec qsa__tp_repl(const qsa__tp_ctx *x) {
    qsa__tp_spec s;
    memset(&s, 0, sizeof s);
    s.kind = QSA_TP_REPLICATED;
    s.copies = x->tp;
    return s;
}

/* one run [first, first + count) */
QSA_PRIV qsa__tp_spec qsa__tp_run(qsa_tp_kind kind, int64_t first, int64_t count, int copies) {
    qsa__tp_spec s;
    memset(&s, 0, sizeof s);
    s.kind = kind;
    s.copies = copies;
    s.n_runs = 1;
    s.rb[0] = first;
    s.rc[0] = count;
    return s;
}

/* the rank's share of n indices split evenly (n % tp == 0: qsa_tp_check) */
QSA_PRIV qsa__tp_spec qsa__tp_even(const qsa__tp_ctx *x, qsa_tp_kind kind, int64_t n) {
    return qsa__tp_run(kind, n / x->tp * x->rank, n / x->tp, 1);
}

/* vocab-parallel rows: floor(V / tp) per rank, the last V % tp ranks one more */
QSA_PRIV qsa__tp_spec qsa__tp_vocab(const qsa__tp_ctx *x) {
    int64_t V = x->c->vocab_size, base = V / x->tp, first_big = x->tp - V % x->tp;
    int64_t extra = x->rank > first_big ? x->rank - first_big : 0;
    return qsa__tp_run(QSA_TP_ROWS, base * x->rank + extra, base + (x->rank >= first_big), 1);
}

/* Fills x->out for a tensor of shape g[ndim] cut by the spec along `dim`, the runs divided by `div`
   (2 for packed NVFP4 columns, the group size for block scales). */
QSA_PRIV qsa_result qsa__tp_make(const qsa__tp_ctx *x, int ndim, int64_t g0, int64_t g1, int64_t g2, int dim,
                                 const qsa__tp_spec *sp, int64_t div) {
    qsa_tp_slice *s = x->out;
    memset(s, 0, sizeof *s);
    s->ndim = ndim;
    s->global[0] = ndim > 0 ? g0 : 1;
    s->global[1] = ndim > 1 ? g1 : 1;
    s->global[2] = ndim > 2 ? g2 : 1;
    memcpy(s->shape, s->global, sizeof s->shape);
    s->kind = sp->kind;
    s->copies = sp->copies;
    s->dim = -1;
    if (sp->kind == QSA_TP_REPLICATED) return QSA_OK;
    s->dim = dim;
    s->n_runs = sp->n_runs;
    for (int i = 0; i < sp->n_runs; i++) {
        if (sp->rb[i] % div || sp->rc[i] % div)
            return qsa__fail(QSA_ERR_SHAPE, "qsa_tp_slice_for: tensor '%s': rank %d of %d holds logical indices [%lld, %lld) "
                             "along dim %d, which do not fall on whole units of %lld (NVFP4 packing or scale groups)", x->name,
                             x->rank, x->tp, (long long)sp->rb[i], (long long)(sp->rb[i] + sp->rc[i]), dim, (long long)div);
        s->run_begin[i] = sp->rb[i] / div;
        s->run_count[i] = sp->rc[i] / div;
        s->count += s->run_count[i];
    }
    s->begin = s->run_begin[0];
    s->shape[dim] = s->count;
    return QSA_OK;
}

QSA_PRIV qsa_result qsa__tp_repl_tensor(const qsa__tp_ctx *x, int ndim, int64_t g0, int64_t g1, int64_t g2) {
    qsa__tp_spec r = qsa__tp_repl(x);
    return qsa__tp_make(x, ndim, g0, g1, g2, -1, &r, 1);
}

/* advances *p past `s` when *p starts with it */
QSA_PRIV int qsa__tp_eat(const char **p, const char *s) {
    size_t n = strlen(s);
    if (strncmp(*p, s, n)) return 0;
    *p += n;
    return 1;
}

/* a decimal index without sign or leading zeros, then `dot` when given; -1 when absent */
QSA_PRIV int64_t qsa__tp_index(const char **p, int dot) {
    const char *q = *p;
    int64_t v = 0;
    if (*q < '0' || *q > '9' || (*q == '0' && q[1] >= '0' && q[1] <= '9')) return -1;
    for (; *q >= '0' && *q <= '9'; q++) {
        v = v * 10 + (*q - '0');
        if (v > INT32_MAX) return -1;
    }
    if (dot && *q++ != '.') return -1;
    *p = q;
    return v;
}

QSA_PRIV qsa_result qsa__tp_unknown(const qsa__tp_ctx *x, const char *why) {
    return qsa__fail(QSA_ERR_NOT_FOUND, "qsa_tp_slice_for: tensor '%s' is not a tensor of this model%s%s", x->name,
                     why ? ": " : "", why ? why : "");
}

/* The tensors of a linear `<base>` with logical weight [out, in]; `sfx` points after "<base>." in
   x->rel.  A ROWS spec cuts `out`, a COLS spec cuts `in`. */
QSA_PRIV qsa_result qsa__tp_linear(const qsa__tp_ctx *x, const char *sfx, int64_t out, int64_t in, const qsa__tp_spec *sp) {
    const qsa_model_config *c = x->c;
    int dim = sp->kind == QSA_TP_COLS ? 1 : 0, g = qsa__tp_group(c);
    int packed = -1; /* 1: NVFP4 [out, in/2] U8; 0: dense [out, in] */
    if (!strcmp(sfx, "weight"))
        packed = c->quant_format != QSA_QUANT_COMPRESSED_TENSORS && qsa__tp_quantised(c, x->rel, (size_t)(sfx - 1 - x->rel));
    else if (!strcmp(sfx, "weight_packed")) packed = 1;
    if (packed == 0) return qsa__tp_make(x, 2, out, in, 1, dim, sp, 1);
    if (packed == 1 || !strcmp(sfx, "weight_scale")) {
        if (in % g)
            return qsa__fail(QSA_ERR_SHAPE, "qsa_tp_slice_for: tensor '%s': %lld input columns cannot be NVFP4 (groups of %d)",
                             x->name, (long long)in, g);
        if (packed == 1) return qsa__tp_make(x, 2, out, in / 2, 1, dim, sp, dim == 1 ? 2 : 1);
        return qsa__tp_make(x, 2, out, in / g, 1, dim, sp, dim == 1 ? g : 1);
    }
    if (!strcmp(sfx, "weight_scale_2") || !strcmp(sfx, "input_scale") || !strcmp(sfx, "weight_global_scale") ||
        !strcmp(sfx, "input_global_scale"))
        return qsa__tp_repl_tensor(x, 0, 1, 1, 1);
    if (!strcmp(sfx, "bias")) {
        /* a column-split linear's bias is whole on every rank here; the view keeps it on rank 0 only, which
           adds it to its partial sum before the reduction (so once) */
        if (sp->kind == QSA_TP_ROWS) return qsa__tp_make(x, 1, out, 1, 1, 0, sp, 1);
        return qsa__tp_repl_tensor(x, 1, out, 1, 1);
    }
    return qsa__tp_unknown(x, "not a tensor of a linear layer");
}

/* GatedResidual blocks: everything replicated (the streams are replicated on every rank) */
QSA_PRIV qsa_result qsa__tp_gres(const qsa__tp_ctx *x, const char *p, int with_inject) {
    const qsa_model_config *c = x->c;
    int64_t hcH = (int64_t)c->hc_count * c->hidden_size;
    qsa__tp_spec r = qsa__tp_repl(x);
    if (!strcmp(p, "hc_norm.weight")) return qsa__tp_repl_tensor(x, 1, hcH, 1, 1);
    if (qsa__tp_eat(&p, "input_mix_weight_down.")) return qsa__tp_linear(x, p, c->hc_lowrank, hcH, &r);
    if (qsa__tp_eat(&p, "input_mix_weight_up.")) return qsa__tp_linear(x, p, hcH, c->hc_lowrank, &r);
    if (with_inject && qsa__tp_eat(&p, "block_inject_weight.")) return qsa__tp_linear(x, p, c->hc_count, hcH, &r);
    return qsa__tp_unknown(x, NULL);
}

/* Gated DeltaNet, split by key-head groups: the rank's key heads [r*nk/tp, (r+1)*nk/tp) and the value
   heads that read them (value head h uses key head h / (nv/nk)), i.e. value heads [r*nv/tp, ...). */
QSA_PRIV qsa_result qsa__tp_gdn(const qsa__tp_ctx *x, const char *p) {
    const qsa_model_config *c = x->c;
    int64_t H = c->hidden_size, nv = c->linear_num_value_heads, dk = c->linear_key_head_dim, dv = c->linear_value_head_dim;
    int64_t kd = (int64_t)c->linear_num_key_heads * dk, vd = nv * dv, conv_dim = 2 * kd + vd;
    int64_t kr = kd / x->tp, vr = vd / x->tp; /* the rank's key / value channels */
    qsa__tp_spec qkv = qsa__tp_run(QSA_TP_ROWS, kr * x->rank, kr, 1);
    qkv.n_runs = 3;
    qkv.rb[1] = kd + kr * x->rank; qkv.rc[1] = kr;
    qkv.rb[2] = 2 * kd + vr * x->rank; qkv.rc[2] = vr;
    qsa__tp_spec vrows = qsa__tp_even(x, QSA_TP_ROWS, vd), vcols = qsa__tp_even(x, QSA_TP_COLS, vd);
    qsa__tp_spec heads = qsa__tp_even(x, QSA_TP_ROWS, nv);
    if (qsa__tp_eat(&p, "in_proj_qkv.")) return qsa__tp_linear(x, p, conv_dim, H, &qkv);
    if (qsa__tp_eat(&p, "in_proj_z.")) return qsa__tp_linear(x, p, vd, H, &vrows);
    if (qsa__tp_eat(&p, "in_proj_b.") || qsa__tp_eat(&p, "in_proj_a.")) return qsa__tp_linear(x, p, nv, H, &heads);
    if (qsa__tp_eat(&p, "out_proj.")) return qsa__tp_linear(x, p, H, vd, &vcols);
    if (!strcmp(p, "conv1d.weight")) return qsa__tp_make(x, 3, conv_dim, 1, c->linear_conv_kernel_dim, 0, &qkv, 1);
    if (!strcmp(p, "A_log") || !strcmp(p, "dt_bias")) return qsa__tp_make(x, 1, nv, 1, 1, 0, &heads, 1);
    if (!strcmp(p, "norm.weight")) return qsa__tp_repl_tensor(x, 1, dv, 1, 1);
    return qsa__tp_unknown(x, NULL);
}

/* QSA attention, split by query heads; the indexer is replicated. */
QSA_PRIV qsa_result qsa__tp_attn(const qsa__tp_ctx *x, const char *p) {
    const qsa_model_config *c = x->c;
    int64_t H = c->hidden_size, nh = c->num_attention_heads, nkv = c->num_key_value_heads, hd = c->head_dim;
    int64_t qh = nh / x->tp; /* query heads per rank */
    qsa__tp_spec q = qsa__tp_run(QSA_TP_ROWS, x->rank * qh * 2 * hd, qh * 2 * hd, 1); /* whole [q | gate] heads */
    qsa__tp_spec o = qsa__tp_run(QSA_TP_COLS, x->rank * qh * hd, qh * hd, 1);
    qsa__tp_spec kv;
    if (x->tp <= nkv) kv = qsa__tp_even(x, QSA_TP_ROWS, nkv * hd);
    else { /* tp / nkv ranks share KV head rank / (tp / nkv): their query heads all lie in its group */
        int share = (int)(x->tp / nkv);
        kv = qsa__tp_run(QSA_TP_ROWS, (x->rank / share) * hd, hd, share);
    }
    if (qsa__tp_eat(&p, "q_proj.")) return qsa__tp_linear(x, p, nh * 2 * hd, H, &q);
    if (qsa__tp_eat(&p, "k_proj.") || qsa__tp_eat(&p, "v_proj.")) return qsa__tp_linear(x, p, nkv * hd, H, &kv);
    if (qsa__tp_eat(&p, "o_proj.")) return qsa__tp_linear(x, p, H, nh * hd, &o);
    if (!strcmp(p, "q_norm.weight") || !strcmp(p, "k_norm.weight")) return qsa__tp_repl_tensor(x, 1, hd, 1, 1);
    if (c->has_qsa && qsa__tp_eat(&p, "indexer.")) {
        qsa__tp_spec r = qsa__tp_repl(x);
        int64_t ihd = c->indexer_head_dim;
        if (qsa__tp_eat(&p, "index_qk_proj."))
            return qsa__tp_linear(x, p, (int64_t)(c->indexer_n_heads + c->indexer_kv_heads) * ihd, H, &r);
        if (!strcmp(p, "q_layernorm.weight") || !strcmp(p, "k_layernorm.weight")) return qsa__tp_repl_tensor(x, 1, ihd, 1, 1);
    }
    return qsa__tp_unknown(x, NULL);
}

/* MoE: routed and shared experts split along the intermediate dimension; router replicated. */
QSA_PRIV qsa_result qsa__tp_moe(const qsa__tp_ctx *x, const char *p) {
    const qsa_model_config *c = x->c;
    int64_t H = c->hidden_size, E = c->num_experts, I = c->moe_intermediate_size, Is = c->shared_expert_intermediate_size;
    qsa__tp_spec r = qsa__tp_repl(x);
    qsa__tp_spec irows = qsa__tp_even(x, QSA_TP_ROWS, I), icols = qsa__tp_even(x, QSA_TP_COLS, I);
    qsa__tp_spec srows = qsa__tp_even(x, QSA_TP_ROWS, Is), scols = qsa__tp_even(x, QSA_TP_COLS, Is);
    if (qsa__tp_eat(&p, "gate.")) return qsa__tp_linear(x, p, E, H, &r);
    if (qsa__tp_eat(&p, "shared_expert_gate.")) return qsa__tp_linear(x, p, 1, H, &r);
    if (qsa__tp_eat(&p, "shared_expert.")) {
        if (qsa__tp_eat(&p, "gate_proj.") || qsa__tp_eat(&p, "up_proj.")) return qsa__tp_linear(x, p, Is, H, &srows);
        if (qsa__tp_eat(&p, "down_proj.")) return qsa__tp_linear(x, p, H, Is, &scols);
        return qsa__tp_unknown(x, NULL);
    }
    if (!qsa__tp_eat(&p, "experts.")) return qsa__tp_unknown(x, NULL);
    if (!strcmp(p, "gate_up_proj")) { /* fused [E, 2I, H], gate rows then up rows: two runs along dim 1 */
        qsa__tp_spec gu = irows;
        gu.n_runs = 2;
        gu.rb[1] = I + irows.rb[0];
        gu.rc[1] = irows.rc[0];
        return qsa__tp_make(x, 3, E, 2 * I, H, 1, &gu, 1);
    }
    if (!strcmp(p, "down_proj")) return qsa__tp_make(x, 3, E, H, I, 2, &icols, 1); /* fused [E, H, I] */
    int64_t e = qsa__tp_index(&p, 1);
    if (e < 0) return qsa__tp_unknown(x, NULL);
    if (e >= E) return qsa__tp_unknown(x, "expert index out of range");
    if (qsa__tp_eat(&p, "gate_proj.") || qsa__tp_eat(&p, "up_proj.")) return qsa__tp_linear(x, p, I, H, &irows);
    if (qsa__tp_eat(&p, "down_proj.")) return qsa__tp_linear(x, p, H, I, &icols);
    return qsa__tp_unknown(x, NULL);
}

/* PLE: the n-gram table split by columns (every head's row keeps its columns [r*dh/tp, ...)); the
   projections, norms and conv replicated (they act on the all-gathered embedding). */
QSA_PRIV qsa_result qsa__tp_ple(const qsa__tp_ctx *x, const char *p, int ple_index) {
    const qsa_model_config *c = x->c;
    int64_t H = c->hidden_size, hcH = (int64_t)c->hc_count * H, D = c->ple_embed_dim;
    int n_heads = (c->ngram_size - 1) * c->heads_per_ngram;
    int64_t dh = D / n_heads;
    qsa__tp_spec r = qsa__tp_repl(x);
    if (qsa__tp_eat(&p, "ple_embedding.")) {
        if (!strcmp(p, "layer_multipliers")) return qsa__tp_repl_tensor(x, 1, c->ngram_size, 1, 1);
        if (!strcmp(p, "ngram_heads_offsets") || !strcmp(p, "ngram_heads_vocab_sizes")) return qsa__tp_repl_tensor(x, 1, n_heads, 1, 1);
        if (!qsa__tp_eat(&p, "ngram_embedding.")) return qsa__tp_unknown(x, NULL);
        int64_t shard = -1;
        if (strcmp(p, "weight")) {
            if (!qsa__tp_eat(&p, "shard_") || (shard = qsa__tp_index(&p, 1)) < 0 || strcmp(p, "weight")) return qsa__tp_unknown(x, NULL);
        }
        /* rows: the padded n-gram vocabulary (>>weights), in split_ngram_parts shards as torch.chunk cuts it */
        int64_t *vocab = QSA__ALLOC(int64_t, 2 * (size_t)n_heads), total;
        if (!vocab) return qsa__fail(QSA_ERR_OUT_OF_MEMORY, "qsa_tp_slice_for: out of memory");
        qsa__ple_head_vocabs(c->ngram_vocab_size_base, (int64_t)ple_index * n_heads, n_heads, vocab, vocab + n_heads, &total);
        qsa__free(vocab);
        int64_t div = c->make_ngram_vocab_size_divisible_by > 0 ? c->make_ngram_vocab_size_divisible_by : 1;
        int64_t rows = (total + div - 1) / div * div;
        if (shard >= 0) {
            int64_t parts = c->split_ngram_parts > 0 ? c->split_ngram_parts : 1, chunk = (rows + parts - 1) / parts;
            if (shard * chunk >= rows) return qsa__tp_unknown(x, "shard index out of range");
            rows = rows - shard * chunk < chunk ? rows - shard * chunk : chunk;
        }
        qsa__tp_spec cols = qsa__tp_even(x, QSA_TP_COLS, dh);
        return qsa__tp_make(x, 2, rows, dh, 1, 1, &cols, 1);
    }
    if (qsa__tp_eat(&p, "key_proj.")) return qsa__tp_linear(x, p, hcH, D, &r);
    if (qsa__tp_eat(&p, "value_proj.")) return qsa__tp_linear(x, p, H, D, &r);
    if (!strcmp(p, "norm_key.weight") || !strcmp(p, "norm_query.weight") || !strcmp(p, "norm_conv.weight"))
        return qsa__tp_repl_tensor(x, 1, hcH, 1, 1);
    if (!strcmp(p, "conv1d.weight")) return qsa__tp_repl_tensor(x, 3, hcH, 1, c->ple_conv_kernel_size);
    return qsa__tp_unknown(x, NULL);
}

QSA_IMPL qsa_result qsa_tp_slice_for(const qsa_model_config *c, int tp, int rank, const char *tensor, qsa_tp_slice *out) {
    if (!c || !tensor || !out) return qsa__fail(QSA_ERR_INVALID_ARGUMENT, "qsa_tp_slice_for: NULL argument");
    memset(out, 0, sizeof *out);
    QSA__TRY(qsa_tp_check(c, tp));
    if (rank < 0 || rank >= tp)
        return qsa__fail(QSA_ERR_INVALID_ARGUMENT, "qsa_tp_slice_for: rank %d: expected 0..%d (tp = %d)", rank, tp - 1, tp);
    qsa__tp_ctx x;
    x.c = c;
    x.tp = tp;
    x.rank = rank;
    x.name = tensor;
    x.out = out;
    const char *p = tensor;
    if (!qsa__tp_eat(&p, "model.language_model.")) (void)qsa__tp_eat(&p, "model.");
    x.rel = p;
    int64_t H = c->hidden_size;
    if (!strcmp(p, "embed_tokens.weight")) return qsa__tp_repl_tensor(&x, 2, c->vocab_size, H, 1);
    if (qsa__tp_eat(&p, "lm_head.")) {
        qsa__tp_spec v = qsa__tp_vocab(&x);
        return qsa__tp_linear(&x, p, c->vocab_size, H, &v);
    }
    if (qsa__tp_eat(&p, "hyper_connection_mixer.")) return qsa__tp_gres(&x, p, 0);
    if (!qsa__tp_eat(&p, "layers.")) return qsa__tp_unknown(&x, NULL);
    int64_t L = qsa__tp_index(&p, 1);
    if (L < 0) return qsa__tp_unknown(&x, NULL);
    if (L >= c->num_hidden_layers) return qsa__tp_unknown(&x, "layer index out of range");
    if (qsa__tp_eat(&p, "attn_hyper_connection.") || qsa__tp_eat(&p, "mlp_hyper_connection.")) return qsa__tp_gres(&x, p, 1);
    if (qsa__tp_eat(&p, "linear_attn.")) {
        if (c->layer_types[L] != QSA_LAYER_LINEAR) return qsa__tp_unknown(&x, "the layer is not a linear_attention layer");
        return qsa__tp_gdn(&x, p);
    }
    if (qsa__tp_eat(&p, "self_attn.")) {
        if (c->layer_types[L] != QSA_LAYER_QSA) return qsa__tp_unknown(&x, "the layer is not an attention layer");
        return qsa__tp_attn(&x, p);
    }
    if (qsa__tp_eat(&p, "mlp.")) return qsa__tp_moe(&x, p);
    if (qsa__tp_eat(&p, "ple.")) {
        for (int k = 0; k < c->n_ple_layers; k++)
            if (c->ple_layer_ids[k] == L + 1) return qsa__tp_ple(&x, p, k);
        return qsa__tp_unknown(&x, "the layer has no PLE (ple_layer_ids)");
    }
    return qsa__tp_unknown(&x, NULL);
}

/* Per token and rank, each collective is an all-gather whose contribution is
     mixer and MoE partial sums   2 per layer    H floats each
     PLE embedding columns        1 per PLE layer ple_embed_dim / tp floats
     vocab-parallel logits        1              ceil(vocab_size / tp) floats (short ranks pad)
   all fp32; a ring (or direct) all-gather sends tp - 1 contributions from every rank. */
QSA_IMPL qsa_result qsa_tp_comm_per_token(const qsa_model_config *c, int tp, int64_t *bytes, int *collectives) {
    if (!c || !bytes || !collectives) return qsa__fail(QSA_ERR_INVALID_ARGUMENT, "qsa_tp_comm_per_token: NULL argument");
    *bytes = 0;
    *collectives = 0;
    QSA__TRY(qsa_tp_check(c, tp));
    if (tp == 1) return QSA_OK;
    int64_t floats = 2 * (int64_t)c->num_hidden_layers * c->hidden_size + (int64_t)c->n_ple_layers * (c->ple_embed_dim / tp) +
                     ((int64_t)c->vocab_size + tp - 1) / tp;
    *bytes = (int64_t)(tp - 1) * floats * (int64_t)sizeof(float);
    *collectives = 2 * c->num_hidden_layers + c->n_ple_layers + 1;
    return QSA_OK;
}

/* ============================================================================================== */
/* >>cuda  the CUDA backend: context, kernel module and its disk cache, weights, forward          */
/* ============================================================================================== */
/* One GPU, one stream.  Weights: dense tensors in FP16 (BF16 converted at load, values that
   overflow FP16 reported), NVFP4 experts packed with their scales, norms/conv/gates in FP32.
   Activations between kernels: the residual streams and every reduction in FP32; GEMM operands in
   FP16 (W4A16/W16A16 with FP32 accumulation).  The KV pages of the QSA layers live on the device
   (K, V in FP16, raw indexer keys in FP32); the PLE tables stay in host memory and only the gathered
   rows are copied.  Every kernel reduces in an order fixed by the problem shape of one token, so a
   token's bits do not depend on the chunk it is fed in, on other tokens, or on page placement. */
#ifndef QSA_NO_CUDA

#define QSA__KERNEL_LIST(X)                                                                             \
    X(embed) X(rmsnorm) X(gres_mix) X(silu_scale) X(inject) X(inject_rmsnorm) X(to_f16)                     \
    X(gemm_f16) X(gemm_nvfp4) X(gemv_f16) X(gemv_nvfp4) X(gemv_f16_group) X(gemm_f16_group) X(gemv_deep) X(gemv_gres) X(gemv_blk) X(gemv_blk_whole) X(gemv_blk32) X(gemv_fold) X(router_topk) X(moe_plan) X(moe_gate_up) X(moe_down) X(moe_gate_up64) X(moe_down64) X(moe_gate_up_xw) X(moe_gate_up_xwr) X(moe_down_xw) X(moe_gate_up_xwk) X(moe_down_xwk) X(moe_gate_up_xwn) X(moe_down_xwn) X(moe_combine)       \
    X(ple_gate) X(ple_conv) X(gdn_conv) X(gdn_conv_state) X(gdn_recurrent)                  \
    X(gdn_recurrent_f16state) X(gdn_norm_gate) X(attn_qk_prep) X(indexer_prep) X(block_keys)             \
    X(block_scores) X(topk_blocks) X(attn_phys_order) X(sparse_attn)                                     \
    X(attn_prep_batch) X(block_scores_batch)                                                             \
    X(topk_blocks_batch) X(sparse_attn_batch) X(gdn_conv_batch) X(sparse_attn_dec) X(sparse_attn_dec_batch) \
    X(sparse_attn_tc) X(sparse_attn_tc_batch) X(sparse_attn_merge) X(sparse_attn_merge_tc) \
    X(gdn_recurrent_batch) X(gdn_recurrent_f16state_batch) X(ple_conv_batch)                             \
    X(tp_sum) X(tp_ple_unshard) X(sample_cand1) X(sample_cand2) X(sample_z) X(nvfp4_order)

typedef enum qsa__kid {
#define QSA__KID(n) QSA__K_##n,
    QSA__KERNEL_LIST(QSA__KID)
#undef QSA__KID
    QSA__K_COUNT
} qsa__kid;

static const char *const qsa__kernel_names[] = {
#define QSA__KNAME(n) "qsa_k_" #n,
    QSA__KERNEL_LIST(QSA__KNAME)
#undef QSA__KNAME
};
#define QSA__PARTS 8 /* the programs the kernels are compiled as (kernels.cu: QSA_IN_PART) */

/* A linear map on the device: FP16 [out][in] or NVFP4 (q [out][in/2], s [out][in/16], s2). */
typedef struct qsa__dlin {
    int out, in;
    CUdeviceptr w16, q, s, bias;
    float s2;
} qsa__dlin;
/* Rows r0 .. r0 + n - 1 of w (output features) as a linear of their own (NVFP4: K / 2 packed bytes and
   K / 16 scales a row). */
QSA_PRIV qsa__dlin qsa__dlin_rows(const qsa__dlin *w, int r0, int n) {
    qsa__dlin v = *w;
    size_t K = (size_t)w->in;
    v.out = n;
    if (w->w16) v.w16 = w->w16 + (size_t)r0 * K * 2;
    if (w->q) v.q = w->q + (size_t)r0 * (K / 2);
    if (w->s) v.s = w->s + (size_t)r0 * (K / 16);
    if (w->bias) v.bias = w->bias + (size_t)r0 * 4;
    return v;
}

typedef struct qsa__dgres {
    CUdeviceptr norm_w;
    qsa__dlin down, up, inject;
} qsa__dgres;

/* Device mirror of the per-expert weight pointers read by the MoE kernels (layout shared with
   kernels.cu's struct qsa_expert_w). */
typedef struct qsa__dexpert {
    unsigned long long gate_q, gate_s, up_q, up_s, down_q, down_s;
    unsigned long long gate16, up16, down16;
    float gate_s2, up_s2, down_s2, pad;
} qsa__dexpert;

typedef struct qsa__dlayer {
    qsa__dgres attn_hc, mlp_hc;
    /* GDN */
    qsa__dlin in_qkv, in_z, in_b, in_a, out;
    CUdeviceptr conv_w, A_log, dt_bias, gnorm_w;
    /* attention */
    qsa__dlin q, k, v, o, idx_qk;
    CUdeviceptr q_norm, k_norm, idx_q_norm, idx_k_norm;
    /* MoE */
    qsa__dlin router, sh_gate, sh_up, sh_down, sh_expert_gate;
    CUdeviceptr experts;        /* qsa__dexpert [E] */
    int experts_nvfp4;
    /* PLE */
    qsa__dlin ple_key, ple_value;
    CUdeviceptr ple_nk, ple_nq, ple_nc, ple_conv_w;
} qsa__dlayer;

/* qsa_k_gemv_deep (decode batches of 17 to 32 tokens, the wide projections that took the tiled group kernel,
   sm_80+): its ring of stages holds up to QSA__DEEP_RING_BYTES of shared memory (two blocks per SM on the
   H200's 228 KB: 6 stages of a 4-warp block, 4 of an 8-warp one); blocks of 8 warps (128 weight rows) where
   those number at least QSA__DEEP_WIDE_PER_SM per SM, else of 4.  (Measured on the H200, batch 32, eager, per
   launch: the GDN input group 41.5 us with 258 blocks of 4 warps, 43.2 with 130 of 8; each lm_head quarter
   140.3 with 970 of 4, 101.5 with 485 of 8.)  Where the 4-warp blocks are chosen and K has two segments or
   more, blocks of 8 warps in two K halves take their 64 columns instead (kh = 2: twice the warps per tile;
   $QSA_DEEP_KH "1": not). */
#define QSA__DEEP_RING_BYTES 92160
#define QSA__DEEP_WIDE_PER_SM 2
#define QSA__DEEP_STAGE_BYTES(nw, kh) (((nw) * 16 + 32 * (kh)) * (64 + 8) * 2) /* kernels.cu: QSA_DEEP_STAGE */
#define QSA__DEEP_X_BYTES(nc) ((nc) * 16 * 32 * 4)                        /* kernels.cu: QSA_DEEP_X */
/* Scratch for one chunk of up to max_tokens tokens. */
#define QSA__GEMV_PART_BYTES ((size_t)32 << 20) /* cross-warp GEMV partial tiles (qsa__dgemm) */
#define QSA__GEMV_TILES 65536                     /* and its tickets: at most this many tiles */
#define QSA__GEMV_WARPS 4                         /* warps per block of qsa_k_gemv_* (kernels.cu: QSA_GEMV_WARPS) */
#define QSA__GEMV_BLOCKS 5                        /* the dense GEMVs' block form: blocks per SM (kernels.cu: QSA_GEMV_BLOCKS) */
/* ... the dynamic shared memory of its kernels of rp row tiles per group (qsa_k_gemv_blk[_whole] 1,
   qsa_k_gemv_blk32 2): two stages of (QSA__GEMV_WARPS + rp) tiles of 16 x (128 + 8) halves
   (kernels.cu: QSA_GB_SMEM) */
#define QSA__GB_SMEM(rp) (2 * 2 * (QSA__GEMV_WARPS + (rp)) * 16 * (128 + 8))
#define QSA__GEMV_BLK_MIN_M 1                     /* ... and from how many rows (fewer: the per-warp kernels, qsa_seg16_tr up to 4) */
#define QSA__GEMV_WHOLE_SEGS 2                    /* ... whole-K groups (no tickets) for K of up to this many segments */
#define QSA__GEMV_FOLD_MIN_M 2                    /* ... the split groups' folds in a launch of their own from this many rows */
#define QSA__MOE_PLAN_THREADS 1024                /* largest block of qsa_k_moe_plan; its scratch holds E counts per warp */

typedef struct qsa__dscratch {
    int max_tokens;
    CUdeviceptr ids, X, xn, xn16, low, low16, mw, inp, inp16, inj, out;
    CUdeviceptr big[6];         /* mixer / MoE / PLE temporaries, each sized for the largest use */
    CUdeviceptr big16[3];
    CUdeviceptr sel, nsel, scores, logits, tokpos;
    int moe_tokens;             /* tokens per MoE sub-chunk */
    CUdeviceptr moe_pairs, moe_tiles, moe_ntiles, moe_wcnt, moe_h16, moe_y;
    CUdeviceptr moe_ticket;     /* the router launch's ticket (qsa_router_extra; zero between launches) */
    size_t big_bytes, scores_bytes;
    int max_blocks, score_rows, logit_rows;
    CUdeviceptr gemv_part, gemv_count; /* cross-warp GEMV partial tiles and tile tickets (qsa__dgemm) */
    size_t gemv_limit;                 /* partial-tile bytes a dense cross-warp GEMV may use (QSA__GEMV_PART_BYTES;
                                          tests lower it to make qsa__dgemm_ex slice) */
    CUdeviceptr gemv_slice;            /* a column slice's output (QSA__GEMV_PART_BYTES), made at the first slice
                                          or with the batched step's buffers */
    long long n_sliced;                /* GEMVs issued on column slices (a captured step's count once) */
    float *host_e;              /* PLE rows gathered on the host [max_tokens][ple_embed_dim] */
} qsa__dscratch;

#define QSA__ATTN_TC_SMEM 98304 /* qsa_k_sparse_attn_tc[_batch]'s dynamic shared memory: kernels.cu's K3_SMEM_BYTES */
/* ... and the bytes of one query's partials there (kernels.cu: [nkv][smax][128][K3_PW(hd)] floats) */
#define QSA__ATTN_TC_PART(nkv, smax, hd) ((long long)(nkv) * (smax) * 128 * ((hd) / 8 + 4) * 4)

typedef struct qsa__cuda {
    int ordinal, cc, sm_count, smem_per_sm;
    int xw_whole_per_sm;         /* qsa__xw_whole's threshold (QSA__XW_WHOLE_PER_SM; $QSA_XW_WHOLE_PER_SM) */
    int xw_range_per_sm;         /* qsa__xw_ranges' warps per SM (QSA__XW_RANGE_PER_SM; $QSA_XW_RANGE_PER_SM) */
    int deep_off;                /* $QSA_DEEP "0": no qsa_k_gemv_deep */
    int deep_warps;              /* its warps per block, 4 or 8 ($QSA_DEEP_WARPS; 0: chosen per launch) */
    int deep_kh_off;             /* $QSA_DEEP_KH "1": no blocks in two K halves */
    int deep_stages[3];          /* its ring's stages for blocks of 4 and of 8 warps, and of 8 in two K halves
                                    (0: not in this module: below sm_80, or not two stages of shared memory) */
    int gemv_blocks_per_sm;      /* qsa__gemv_blk_grid's cap (QSA__GEMV_BLOCKS; $QSA_GEMV_BLOCKS_PER_SM) */
    int gemv_blk_fit[2];         /* ... and the blocks of QSA__GB_SMEM bytes that fit an SM, rp 1 and 2 (0: that
                                    shared memory not granted: no block form for those rows) */
    int gemv_blk_min_m;          /* rows from which qsa__gemv_groups takes the block form (QSA__GEMV_BLK_MIN_M; $QSA_GEMV_BLK_MIN_M) */
    int gemv_whole_segs;         /* K segments up to which qsa__gemv_blk takes whole-K groups (QSA__GEMV_WHOLE_SEGS; $QSA_GEMV_WHOLE_SEGS) */
    int gemv_fold_min_m;         /* rows from which qsa__gemv_blk folds split groups in qsa_k_gemv_fold (QSA__GEMV_FOLD_MIN_M; $QSA_GEMV_FOLD_MIN_M) */
    int gemv_force_whole;        /* qsa__gemv_blk takes whole-K groups whatever K (set around the side stream's launches) */
    int gemv_whole_min_groups;   /* ... and wherever its whole-K groups number at least this many (the SM count;
                                    $QSA_GEMV_WHOLE_MIN_GROUPS: a positive count, or 0: never) */
    int shared_side;             /* the shared expert's down projection on the side stream (qsa__cuda_moe; $QSA_SHARED_SIDE "0": never) */
    int sample_dev;              /* batched steps reduce sampled rows to their candidates (qsa__cuda_cand_rows; $QSA_SAMPLE_DEVICE "0": never) */
    long long n_cand_rows;       /* rows reduced so */
    long long n_cand_whole;      /* ... of which whole-row draws whose logits came after all (qsa__sampler_cand_draw) */
    int moe_route1;              /* one token's router inside its gate/up launch (qsa__moe_route1; $QSA_MOE_ROUTE1 "0": never) */
    int gdn_fuse;                /* a decode step's GDN conv inside the recurrence's launch (qsa__gdn_fused; $QSA_GDN_FUSE "0": never) */
    long long side_launches;     /* ... how many times it went there (tests) */
    int moe64_pairs;             /* qsa__moe_tr's threshold (QSA__MOE64_PAIRS; $QSA_MOE64_PAIRS) */
    int moe_lean;                /* the lean whole expert kernels where they apply (qsa__moe_lean;
                                    $QSA_MOE_LEAN "0": never) */
    int lean_tasks[2];           /* ... tasks per warp of their gate/up and down launches, 1, 2 or 4
                                    (QSA__LEAN_GU_TASKS, QSA__LEAN_DN_TASKS; $QSA_LEAN_TASKS "GU,DN") */
    int attn_dec_off;            /* $QSA_ATTN_DEC "0": never qsa_k_sparse_attn_dec (qsa__attn_dec_splits) */
    int attn_tc;                 /* qsa_k_sparse_attn_tc[_batch] in this module (sm_80+, the shared memory
                                    granted; $QSA_ATTN_TC "0": never; qsa__attn_tc) */
    int attn_dec_heads;          /* $QSA_ATTN_DEC_HEADS: its heads per block (0: qsa__attn_dec_splits' rule) */
    int attn_dec_warp;           /* $QSA_ATTN_DEC_WARP: its heads per warp, 1 or 2 (0: the rule) */
    int score_keys;              /* block keys per block of qsa_k_block_scores[_batch]'s grid ($QSA_SCORE_KEYS, qsa__score_ys) */
    int tiled_min_m, tiled_min_tiles; /* qsa__tiled_small's thresholds ($QSA_TILED_M, $QSA_TILED_TILES) */
    size_t logit_slice_bytes;    /* qsa__logit_slices' threshold (QSA__LOGIT_SLICE_BYTES; $QSA_LOGIT_SLICE_BYTES, 0: never) */
    CUdevice dev;
    CUcontext ctx;
    CUstream stream;
    CUstream side;               /* work beside the stream's chain, forked and joined by events (qsa__cuda_moe) */
    CUevent side_fork, side_join;
    CUmodule mods[QSA__PARTS];  /* the kernels' modules, one per part (qsa__cuda_module) */
    CUfunction k[QSA__K_COUNT];
    char arch[32];
    int arch_num;               /* the module's target as a number (compute_90: 90; qsa__cuda_module) */
    double jit_seconds;         /* compile (or cache load) time of the modules */
    int jit_from_cache;         /* every part came from the disk cache */
    int pdl;                    /* launch kernels as programmatic dependents (qsa__cu_launch_ex; qsa__cuda_module) */
    int host_threads;           /* the upload's host conversions (the model's n_threads; 0 or 1: this thread) */
    size_t upload_piece;        /* FP16 values narrowed per host-to-device copy (0: QSA__UPLOAD_PIECE) */
    /* the upload's stage (qsa__stage_open .. qsa__stage_close): two pinned slots of stage_cap bytes, one
       filled while the other's copies run on the stream (stage_done[i]: recorded behind slot i's copies,
       stage_used of slot stage_cur taken), or (stage_pinned 0) one ordinary buffer and synchronous copies */
    unsigned char *stage[2];
    CUevent stage_done[2];
    size_t stage_cap, stage_used;
    int stage_cur, stage_pinned;
    int stage_defer;                 /* pieces wait in stage_pend until qsa__stage_flush (a layer's experts) */
    struct qsa__stage_piece *stage_pend;
    int n_pend, cap_pend;
    /* the upload's time (-v log): filling the stage (the expert pieces' copies into it, the dense pieces'
       narrowing) and blocked on the copies of a slot to refill, or of the last ones */
    double up_fill_s, up_wait_s, up_t0;
    size_t bytes_weights, bytes_kv, bytes_state, bytes_scratch;
    CUdeviceptr embed16, rope_inv_freq;
    qsa__dlin lm_head;
    qsa__dgres final_hc;
    qsa__dlayer *layers;
    /* KV pool on the device: per QSA slot [n_pages][page_size][kvd] fp16 and [..][ihd] fp32 */
    CUdeviceptr kpool, vpool, ipool;
    qsa__dscratch sc;
    struct qsa__dbatch *batch;  /* batched decode buffers and graphs, allocated at the first batched step */
    int batch_refused;          /* they could not be made for a single-token feed (qsa__cuda_batch_ready) */
    long long n_coll, bytes_coll; /* TP: NCCL collectives issued on this stream and the bytes this rank contributed to
                                     them; counted at each call, and at each launch of a graph for the calls it recorded */
    CUdeviceptr *allocs;        /* everything allocated, freed at unload */
    int n_allocs, cap_allocs;
    CUdeviceptr arena;          /* while arena_cap: qsa__dalloc carves from here (a layer's experts, qsa__cuda_upload) */
    size_t arena_used, arena_cap;
} qsa__cuda;

QSA_PRIV void qsa__cuda_batch_free(qsa__cuda *g);
QSA_PRIV void qsa__cuda_batch_drop_graphs(qsa__cuda *g);

/* Per-sequence device state. */
typedef struct qsa__cuda_seq {
    CUdeviceptr mem;                           /* one allocation holding everything below */
    size_t mem_bytes;
    CUdeviceptr *conv, *S, *ple_conv, *bkeys; /* per layer (0 where unused) */
    CUdeviceptr bt;                            /* block table copy [n_ctx / page_size + 1] */
    int bt_synced;                             /* pages already copied */
} qsa__cuda_seq;

/* The tensor-parallel hooks (>>tp): without TP (m->tp and m->tpr NULL) the forward never calls them. */
QSA_PRIV qsa_result qsa__tp_reduce(qsa_model *m, CUdeviceptr x, int n);
QSA_PRIV void qsa__tp_ple_embed(const qsa_model *m, const qsa__ple_w *p, const int32_t *hist, float *host_e, int t);
QSA_PRIV qsa_result qsa__tp_ple_rows(qsa_model *m, const float *host_e, CUdeviceptr e, int M);
QSA_PRIV qsa_result qsa__tp_ple_gather(qsa_model *m, CUdeviceptr cols, CUdeviceptr e, int M);
QSA_PRIV qsa_result qsa__tp_logits(qsa_model *m, CUdeviceptr dlogits, int rows, float *dst);
QSA_PRIV qsa_result qsa__tp_logits_gather(qsa_model *m, CUdeviceptr dlogits, int rows);
QSA_PRIV qsa_result qsa__tp_logits_out(qsa_model *m, int rows, float *dst);
QSA_PRIV qsa_result qsa__tp_decode_batch(qsa_model *m, qsa_seq **seqs, const int32_t *tokens, int B, float *logits);
QSA_PRIV qsa_result qsa__tp_decode_greedy(qsa_model *m, qsa_seq **seqs, const int32_t *tokens, int B, float *logits,
                                          int32_t *next);
QSA_PRIV qsa_result qsa__tp_chunk(qsa_seq *sq, const int32_t *ids, int M, float *logits, int all_logits);
QSA_PRIV qsa_result qsa__tp_seq_create(qsa_model *m, qsa_seq *s);
QSA_PRIV qsa_result qsa__tp_seq_reset(qsa_model *m, qsa_seq *s);
QSA_PRIV void qsa__tp_seq_destroy(qsa_model *m, qsa_seq *s);

#define QSA__ARENA_ALIGN 256 /* what cuMemAlloc guarantees; the kernels' vector loads need 16 */
QSA_PRIV size_t qsa__arena_take(size_t bytes) {
    return ((bytes ? bytes : 16) + QSA__ARENA_ALIGN - 1) / QSA__ARENA_ALIGN * QSA__ARENA_ALIGN;
}

QSA_PRIV qsa_result qsa__dalloc(qsa__cuda *g, CUdeviceptr *p, size_t bytes, size_t *counter, const char *what) {
    *p = 0;
    if (bytes == 0) bytes = 16;
    if (g->arena_cap) { /* qsa__arena_take(bytes) of the arena (sized by qsa__dlin_dev_bytes: running short is a bug) */
        size_t take = qsa__arena_take(bytes);
        if (take > g->arena_cap - g->arena_used)
            return qsa__fail(QSA_ERR_INTERNAL, "cuda: %s: %zu bytes past the end of its arena (%zu of %zu used)", what, bytes,
                             g->arena_used, g->arena_cap);
        *p = g->arena + g->arena_used;
        g->arena_used += take;
        if (counter) *counter += bytes;
        return QSA_OK;
    }
    CUresult r = qsa__cu.cuMemAlloc_v2(p, bytes);
    if (r != 0) {
        size_t fr = 0, tot = 0;
        qsa__cu.cuMemGetInfo_v2(&fr, &tot);
        return qsa__fail(r == QSA__CUDA_ERROR_OUT_OF_MEMORY ? QSA_ERR_OUT_OF_MEMORY : QSA_ERR_CUDA,
                         "cuda: allocating %zu bytes for %s failed (%zu of %zu MiB free)", bytes, what, fr >> 20, tot >> 20);
    }
    if (g->n_allocs == g->cap_allocs) {
        int cap = g->cap_allocs ? 2 * g->cap_allocs : 1024;
        CUdeviceptr *a = (CUdeviceptr *)qsa__realloc(g->allocs, sizeof(CUdeviceptr) * (size_t)cap);
        if (!a) { qsa__cu.cuMemFree_v2(*p); *p = 0; return qsa__fail(QSA_ERR_OUT_OF_MEMORY, "cuda: out of host memory"); }
        g->allocs = a;
        g->cap_allocs = cap;
    }
    g->allocs[g->n_allocs++] = *p;
    if (counter) *counter += bytes;
    return QSA_OK;
}

/* ---- the weights' way to the device: staging in pinned memory ----
   While qsa__cuda_upload runs, every copy goes through the stage: two slots of pinned host memory
   (cuMemHostAlloc'd for the upload, freed after it), filled by the host (FP16 narrowed from the mapping,
   or packed NVFP4 words and vectors copied, over the model's threads) and sent by cuMemcpyHtoDAsync on
   the stream, so that one slot's copies run while the other is filled.  Pieces are packed into a slot
   one after another (a real layer has 3 x 512 small expert matrices); a slot is filled again only after
   the event recorded behind its last copy has passed.  Without pinned memory the stage is one ordinary
   buffer and the copies are synchronous.  The same bytes either way
   (cpu/upload_from_the_file_writes_the_same_device_bytes runs both, the pinned form's copies deferred
   until an event behind them is waited on, as a slow device would). */
#define QSA__STAGE_ALIGN 256 /* pieces start at this alignment within a slot */
QSA_PRIV void qsa__stage_free(qsa__cuda *g) {
    for (int i = 0; i < 2; i++) {
        if (g->stage_pinned && g->stage[i]) qsa__cu.cuMemFreeHost(g->stage[i]);
        if (!g->stage_pinned) qsa__free(g->stage[i]);
        if (g->stage_done[i]) qsa__cu.cuEventDestroy_v2(g->stage_done[i]);
        g->stage[i] = NULL;
        g->stage_done[i] = NULL;
    }
    g->stage_cap = g->stage_used = 0;
    g->stage_cur = g->stage_pinned = 0;
    qsa__free(g->stage_pend);
    g->stage_pend = NULL;
    g->n_pend = g->cap_pend = g->stage_defer = 0;
}
/* The stage: two pinned slots of `bytes` each, else one ordinary buffer of that size. */
QSA_PRIV qsa_result qsa__stage_open(qsa__cuda *g, size_t bytes) {
    qsa__stage_free(g);
    g->stage_pinned = 1;
    for (int i = 0; i < 2; i++) {
        void *p = NULL;
        if (qsa__cu.cuMemHostAlloc(&p, bytes, 0) != 0 || !p ||
            qsa__cu.cuEventCreate(&g->stage_done[i], QSA__CU_EVENT_DISABLE_TIMING) != 0) {
            if (p) qsa__cu.cuMemFreeHost(p);
            qsa__stage_free(g);
            qsa__log(QSA_LOG_INFO, "cuda: no pinned memory for the upload (%zu bytes): synchronous copies", 2 * bytes);
            g->stage[0] = QSA__ALLOC(unsigned char, bytes);
            if (!g->stage[0]) return qsa__fail(QSA_ERR_OUT_OF_MEMORY, "cuda: out of host memory for the upload's stage");
            break;
        }
        g->stage[i] = (unsigned char *)p;
    }
    g->stage_cap = bytes;
    return QSA_OK;
}
/* Room for `bytes` (<= stage_cap) in the stage: the current slot's next piece, or the other slot once
   its copies have finished (the ordinary buffer: its start again). */
QSA_PRIV qsa_result qsa__stage_take(qsa__cuda *g, size_t bytes, void **h) {
    if (bytes > g->stage_cap) return qsa__fail(QSA_ERR_INTERNAL, "cuda: a piece of %zu bytes past the stage's %zu", bytes, g->stage_cap);
    if (g->stage_used + bytes > g->stage_cap) {
        if (g->stage_pinned) { /* (the ordinary buffer's copies are done when they return) */
            QSA__CU(qsa__cu.cuEventRecord(g->stage_done[g->stage_cur], g->stream));
            g->stage_cur ^= 1;
            double t0 = qsa__now();
            QSA__CU(qsa__cu.cuEventSynchronize(g->stage_done[g->stage_cur]));
            g->up_wait_s += qsa__now() - t0;
        }
        g->stage_used = 0;
    }
    *h = g->stage[g->stage_cur] + g->stage_used;
    g->stage_used += (bytes + QSA__STAGE_ALIGN - 1) / QSA__STAGE_ALIGN * QSA__STAGE_ALIGN;
    return QSA_OK;
}
/* The piece at h (taken from the stage) -> dst */
QSA_PRIV qsa_result qsa__stage_send(qsa__cuda *g, CUdeviceptr dst, const void *h, size_t bytes) {
    if (g->stage_pinned) QSA__CU(qsa__cu.cuMemcpyHtoDAsync_v2(dst, h, bytes, g->stream));
    else QSA__CU(qsa__cu.cuMemcpyHtoD_v2(dst, h, bytes));
    return QSA_OK;
}
/* The stream the upload's kernels follow its copies on: the stage's (the legacy stream after
   synchronous pageable copies, which may still be in flight when they return) */
QSA_PRIV CUstream qsa__stage_stream(const qsa__cuda *g) { return g->stage_pinned ? g->stream : 0; }
/* Every copy finished, the stage freed; returns the first error of the copies */
QSA_PRIV qsa_result qsa__stage_close(qsa__cuda *g) {
    qsa_result r = QSA_OK;
    double t0 = qsa__now();
    if (g->stage_pinned) r = QSA__CU_R(qsa__cu.cuStreamSynchronize(g->stream));
    g->up_wait_s += qsa__now() - t0;
    qsa__stage_free(g);
    return r;
}

/* The packed NVFP4 words at dst into the device order (kernels.cu: qsa_dq8, qsa_nvfp4_put; the fragment
   order when the rows are whole blocks of 32: frag), on the stream after their copy (qsa__stage_stream) */
QSA_PRIV qsa_result qsa__nvfp4_order(qsa__cuda *g, CUdeviceptr dst, long long words, int frag) {
    void *args[] = {&dst, &words, &frag};
    unsigned gx = (unsigned)((words + 255) / 256 < 1024 ? (words + 255) / 256 : 1024);
    return qsa__cu_launch_ex(g->k[QSA__K_nvfp4_order], "qsa_k_nvfp4_order", gx, 1, 1, 256, 1, 1, 0, qsa__stage_stream(g), args, 0);
}

/* Every copy is a list of pieces of at most a slot (qsa__stage_later), sent by qsa__stage_flush: as many
   as fit in a slot are copied into it over the model's threads, a piece each, then sent in order (and the
   word-order launch after a piece of words: `words` > 0).  Pieces wait in the list while stage_defer is set
   (a layer's experts: thousands of small copies, each too small to split over threads), else they are
   flushed at once: the same copies and launches in the same order either way. */
typedef struct qsa__stage_piece {
    CUdeviceptr dst;
    const unsigned char *src;
    size_t bytes;
    unsigned char *h; /* its place in the stage (qsa__stage_flush) */
    long long words;  /* > 0: qsa__nvfp4_order(dst of the matrix's first piece, words, frag) after it */
    CUdeviceptr wdst;
    int frag;
} qsa__stage_piece;
QSA_PRIV qsa_result qsa__stage_later(qsa__cuda *g, CUdeviceptr dst, const void *src, size_t bytes, long long words, int frag) {
    if (!g->stage_cap) return qsa__fail(QSA_ERR_INTERNAL, "cuda: a copy outside the upload's stage");
    for (size_t o = 0; o < bytes;) { /* (pieces of at most a slot; words > 0 only with bytes = 4 words) */
        size_t k = bytes - o < g->stage_cap ? bytes - o : g->stage_cap;
        if (g->n_pend == g->cap_pend) {
            int cap = g->cap_pend ? 2 * g->cap_pend : 4096;
            qsa__stage_piece *q = (qsa__stage_piece *)qsa__realloc(g->stage_pend, sizeof(qsa__stage_piece) * (size_t)cap);
            if (!q) return qsa__fail(QSA_ERR_OUT_OF_MEMORY, "cuda: out of host memory for the upload's pieces");
            g->stage_pend = q;
            g->cap_pend = cap;
        }
        qsa__stage_piece *p = &g->stage_pend[g->n_pend++];
        memset(p, 0, sizeof *p);
        p->dst = dst + o;
        p->src = (const unsigned char *)src + o;
        p->bytes = k;
        o += k;
        if (o >= bytes && words) { p->words = words; p->wdst = dst; p->frag = frag; }
    }
    return QSA_OK;
}
QSA_PRIV void qsa__piece_fill(void *c, int t, size_t i0, size_t i1) {
    const qsa__stage_piece *p = (const qsa__stage_piece *)c;
    (void)t;
    for (size_t i = i0; i < i1; i++) memcpy(p[i].h, p[i].src, p[i].bytes);
}
QSA_PRIV qsa_result qsa__stage_flush(qsa__cuda *g) {
    qsa__stage_piece *p = g->stage_pend;
    int n = g->n_pend;
    g->n_pend = 0;
    for (int i = 0, j; i < n; i = j) {
        void *h;
        size_t run = 0;
        QSA__TRY(qsa__stage_take(g, p[i].bytes, &h));
        p[i].h = (unsigned char *)h;
        run += p[i].bytes;
        for (j = i + 1; j < n && g->stage_used + p[j].bytes <= g->stage_cap; j++) {
            QSA__TRY(qsa__stage_take(g, p[j].bytes, &h));
            p[j].h = (unsigned char *)h;
            run += p[j].bytes;
        }
        double t0 = qsa__now();
        qsa__par_ranges((size_t)(j - i), run < ((size_t)1 << 20) ? 1 : g->host_threads, qsa__piece_fill, p + i);
        g->up_fill_s += qsa__now() - t0;
        for (int k = i, m; k < j; k = m) { /* pieces k .. m - 1 that follow each other on both sides: one copy
                                              (a layer's experts, carved from one arena: a copy per slot), then
                                              their word-order launches */
            size_t bytes = p[k].bytes;
            for (m = k + 1; m < j && p[m].dst == p[m - 1].dst + p[m - 1].bytes && p[m].h == p[m - 1].h + p[m - 1].bytes; m++)
                bytes += p[m].bytes;
            if (bytes) QSA__TRY(qsa__stage_send(g, p[k].dst, p[k].h, bytes));
            for (int q = k; q < m; q++)
                if (p[q].words) QSA__TRY(qsa__nvfp4_order(g, p[q].wdst, p[q].words, p[q].frag));
        }
    }
    return QSA_OK;
}

/* bytes of src -> dst through the stage (now, or put off while stage_defer is set), then the word-order
   launch when words > 0 */
QSA_PRIV qsa_result qsa__stage_piece_up(qsa__cuda *g, CUdeviceptr dst, const void *src, size_t bytes, long long words, int frag) {
    QSA__TRY(qsa__stage_later(g, dst, src, bytes, words, frag));
    return g->stage_defer ? QSA_OK : qsa__stage_flush(g);
}

QSA_PRIV qsa_result qsa__dupload(qsa__cuda *g, CUdeviceptr *p, const void *src, size_t bytes, const char *what) {
    QSA__TRY(qsa__dalloc(g, p, bytes, &g->bytes_weights, what));
    return qsa__stage_piece_up(g, *p, src, bytes, 0, 0);
}

/* ---- the kernel module: NVRTC at first use, cached on disk ---- */

/* FNV-1a 64 over several byte strings. */
QSA_PRIV uint64_t qsa__fnv(uint64_t h, const void *p, size_t n) {
    const uint8_t *b = (const uint8_t *)p;
    for (size_t i = 0; i < n; i++) { h ^= b[i]; h *= 0x100000001b3ull; }
    return h;
}

/* Cache directory: $QSA_CACHE_DIR ("off", "OFF" or "0": no cache), else $XDG_CACHE_HOME/qsa_runtime, else
   ~/.cache/qsa_runtime.  A directory that cannot be made turns the cache off, with a warning. */
QSA_PRIV int qsa__cache_dir(char *out, size_t cap) {
    const char *d = getenv("QSA_CACHE_DIR");
    if (d && (!strcmp(d, "off") || !strcmp(d, "OFF") || !strcmp(d, "0"))) return 0; /* ("0" made a directory ./0) */
    int n;
    if (d && d[0]) n = snprintf(out, cap, "%s", d);
    else if ((d = getenv("XDG_CACHE_HOME")) && d[0]) n = snprintf(out, cap, "%s/qsa_runtime", d);
    else if ((d = getenv("HOME")) && d[0]) n = snprintf(out, cap, "%s/.cache/qsa_runtime", d);
    else return 0;
    if (n < 0 || (size_t)n >= cap || (size_t)n >= 1024) {
        qsa__log(QSA_LOG_WARN, "kernels: cache directory path too long (%d bytes): the disk cache is off", n);
        return 0;
    }
    char tmp[1024];
    snprintf(tmp, sizeof tmp, "%s", out);
    for (char *p = tmp + 1; *p; p++)
        if (*p == '/') { *p = 0; mkdir(tmp, 0755); *p = '/'; }
    int mk = mkdir(tmp, 0755) == 0 || errno == EEXIST ? 0 : errno;
    struct stat st;
    if (stat(out, &st) != 0 || !S_ISDIR(st.st_mode)) {
        qsa__log(QSA_LOG_WARN, "kernels: cache directory %s cannot be created (%s): the disk cache is off", out,
                 strerror(mk ? mk : ENOTDIR));
        return 0;
    }
    if (access(out, W_OK | X_OK) != 0) /* a read-only cache still serves its entries */
        qsa__log(QSA_LOG_WARN, "kernels: cache directory %s is not writable (%s): new modules will not be cached", out,
                 strerror(errno));
    return 1;
}

/* Cache file layout: "QSAK" magic, u64 key, u64 image length, image, u64 FNV of the image.  A file
   that is absent, unreadable, short, has another key or a bad checksum is a miss (*img NULL; it gets
   rewritten).  Running out of host memory while mapping it or copying a hit is QSA_ERR_OUT_OF_MEMORY,
   not a miss (a miss compiles the kernels again: a minute of NVRTC that would need more memory still). */
QSA_PRIV qsa_result qsa__cache_read(const char *path, uint64_t key, char **img, size_t *len) {
    qsa__map m;
    *img = NULL;
    /* a miss is the usual first run: no file, nothing to report (qsa__fail would echo it at debug level) */
    if (!qsa__file_exists(path)) return QSA_OK;
    qsa_result mr = qsa__map_file(path, &m);
    if (mr == QSA_ERR_OUT_OF_MEMORY) return mr;
    if (mr != QSA_OK) { qsa_clear_error(); return QSA_OK; }
    uint64_t k, n, sum;
    qsa_result r = QSA_OK;
    if (m.size >= 28 && !memcmp(m.data, "QSAK", 4)) {
        memcpy(&k, m.data + 4, 8);
        memcpy(&n, m.data + 12, 8);
        if (k == key && n <= m.size - 28) {
            memcpy(&sum, m.data + 20 + n, 8);
            if (sum == qsa__fnv(0xcbf29ce484222325ull, m.data + 20, (size_t)n)) {
                if ((*img = QSA__ALLOC(char, (size_t)n + 1))) {
                    memcpy(*img, m.data + 20, (size_t)n);
                    (*img)[n] = 0;
                    *len = (size_t)n;
                } else {
                    r = qsa__fail(QSA_ERR_OUT_OF_MEMORY, "kernels: out of memory reading the cached module %s", path);
                }
            }
        }
    }
    qsa__unmap(&m);
    return r;
}

QSA_PRIV void qsa__cache_write(const char *path, uint64_t key, const char *img, size_t len) {
    char tmp[1200];
    /* mkstemp: a name of this writer's own (O_EXCL: two threads, or two processes of one PID in separate PID
       namespaces, never share it, and a link planted under it is not followed) */
    snprintf(tmp, sizeof tmp, "%.1100s.XXXXXX", path);
    int fd = mkstemp(tmp), err = 0;
    FILE *f = fd >= 0 ? fdopen(fd, "wb") : NULL;
    if (!f) {
        err = errno;
        if (fd >= 0) { close(fd); remove(tmp); }
        qsa__log(QSA_LOG_WARN, "kernels: cannot write the cache file %s: %s", path, strerror(err));
        return;
    }
    (void)fchmod(fd, 0644);
    uint64_t n = len, sum = qsa__fnv(0xcbf29ce484222325ull, img, len);
    int ok = fwrite("QSAK", 1, 4, f) == 4 && fwrite(&key, 8, 1, f) == 1 && fwrite(&n, 8, 1, f) == 1 &&
             fwrite(img, 1, len, f) == len && fwrite(&sum, 8, 1, f) == 1;
    if (!ok) err = errno;
    if (fclose(f) != 0 && ok) { ok = 0; err = errno; }
    if (ok && rename(tmp, path) != 0) { ok = 0; err = errno; } /* rename: readers see the old file or the new, never half */
    if (!ok) {
        remove(tmp);
        qsa__log(QSA_LOG_WARN, "kernels: cannot write the cache file %s: %s", path, strerror(err ? err : EIO));
    }
}

/* Programmatic dependent launch (qsa__cu_launch_ex): on sm_90+ devices running a module built for
   compute_90/sm_90 or newer (the kernels' QSA_PDL_ENTRY waits are compiled in only there), with a
   driver that has cuLaunchKernelEx, unless $QSA_PDL is "0". */
QSA_PRIV int qsa__pdl_on(const qsa__cuda *g) {
    return g->cc >= 90 && g->arch_num >= 90 && qsa__cu.cuLaunchKernelEx != NULL && qsa__env_flag("QSA_PDL", 1);
}

/* One part of the kernels (kernels.cu's QSA_IN_PART): its image from the disk cache (dir not NULL) or NVRTC
   (with -DQSA_PART=part; a compile is written to the cache), then (qsa__part_loads) its module in g's
   context.  Jobs run on the threads of qsa__par_ranges: an error is kept in msg for the caller's thread. */
typedef struct qsa__part_job {
    qsa__cuda *g;
    const char *src, *arch, *dir;
    const char *const *opts;
    int nopts, part, from_cache;
    uint64_t key;
    char *img;
    size_t len;
    CUmodule mod;
    qsa_result r;
    char msg[1024];
} qsa__part_job;
QSA_PRIV qsa_result qsa__part_image(qsa__part_job *j) {
    char def[32], path[1100];
    const char *opts[8];
    if (j->nopts > 7) return qsa__fail(QSA_ERR_INTERNAL, "kernels: too many NVRTC options");
    for (int i = 0; i < j->nopts; i++) opts[i] = j->opts[i];
    snprintf(def, sizeof def, "-DQSA_PART=%d", j->part);
    opts[j->nopts] = def;
    uint64_t key = qsa__fnv(j->key, &j->part, sizeof j->part);
    if (j->dir) snprintf(path, sizeof path, "%s/kernels-%016llx.%s", j->dir, (unsigned long long)key, strncmp(j->arch, "sm_", 3) ? "ptx" : "cubin");
    if (j->dir) QSA__TRY(qsa__cache_read(path, key, &j->img, &j->len));
    j->from_cache = j->img != NULL;
    if (!j->img) {
        QSA__TRY(qsa__nvrtc_compile(j->src, "kernels.cu", opts, j->nopts + 1, j->arch, &j->img, &j->len, NULL));
        if (j->dir) qsa__cache_write(path, key, j->img, j->len);
    }
    return QSA_OK;
}
QSA_PRIV qsa_result qsa__part_load(qsa__part_job *j) {
    QSA__TRY(QSA__CU_R(qsa__cu.cuCtxSetCurrent(j->g->ctx)));
    CUresult cr = qsa__cu.cuModuleLoadData(&j->mod, j->img);
    if (cr == 0) return QSA_OK;
    /* the usual cause: an NVRTC newer than the driver (its PTX ISA, or its CUBIN, is past what the driver
       reads) */
    qsa_result r = QSA__CU_R(cr);
    int drv = qsa__cu.driver_version, nv = qsa__nvrtc.major * 1000 + qsa__nvrtc.minor * 10;
    return qsa__fail(r, "kernels: loading part %d (%s%s, from NVRTC %d.%d) into the driver (CUDA %d.%d) failed: %s%s", j->part,
                     j->arch, j->from_cache ? ", from the disk cache" : "", qsa__nvrtc.major, qsa__nvrtc.minor, drv / 1000,
                     drv % 1000 / 10, qsa_last_error(),
                     nv > drv ? "; that NVRTC is newer than the driver: set QSA_NVRTC_LIB to an NVRTC no newer than it" : "");
}
QSA_PRIV void qsa__part_images(void *c, int t, size_t i0, size_t i1) {
    qsa__part_job *j = (qsa__part_job *)c;
    (void)t;
    for (size_t i = i0; i < i1; i++)
        if ((j[i].r = qsa__part_image(&j[i])) != QSA_OK) snprintf(j[i].msg, sizeof j[i].msg, "%s", qsa_last_error());
}
QSA_PRIV void qsa__part_loads(void *c, int t, size_t i0, size_t i1) {
    qsa__part_job *j = (qsa__part_job *)c;
    (void)t;
    for (size_t i = i0; i < i1; i++)
        if ((j[i].r = qsa__part_load(&j[i])) != QSA_OK) snprintf(j[i].msg, sizeof j[i].msg, "%s", qsa_last_error());
}
/* fn over the QSA__PARTS jobs on nt threads (1 .. QSA__PARTS); the first job's error, raised in this thread */
QSA_PRIV qsa_result qsa__parts_run(qsa__part_job *jobs, int nt, qsa__range_fn fn) {
    qsa__par_ranges(QSA__PARTS, nt, fn, jobs);
    for (int p = 0; p < QSA__PARTS; p++)
        if (jobs[p].r != QSA_OK) return qsa__fail(jobs[p].r, "%s", jobs[p].msg);
    return QSA_OK;
}
QSA_PRIV void qsa__cuda_module_unload(qsa__cuda *g) {
    for (int p = 0; p < QSA__PARTS; p++)
        if (g->mods[p]) qsa__cu.cuModuleUnload(g->mods[p]);
    memset(g->mods, 0, sizeof g->mods);
}

/* The kernels for the device: QSA__PARTS programs of kernels.cu (its QSA_IN_PART), each from the disk cache
   or compiled, and loaded, over up to host_threads threads; every entry point from the part that holds it. */
QSA_PRIV qsa_result qsa__cuda_module(qsa__cuda *g, const char *want_arch) {
    QSA__TRY(qsa__nvrtc_load());
    char *src = qsa__kernels_source();
    if (!src) return qsa__fail(QSA_ERR_OUT_OF_MEMORY, "kernels: out of memory");
    char arch[32];
    qsa_result r = qsa__nvrtc_pick_arch(want_arch, g->cc, arch, sizeof arch);
    if (r != QSA_OK) { qsa__free(src); return r; }
    snprintf(g->arch, sizeof g->arch, "%s", arch);
    const char *an = arch;
    while (*an && (*an < '0' || *an > '9')) an++;
    g->arch_num = atoi(an);
    static const char *const opts[] = {"--std=c++14", "-default-device"};
    const int nopts = (int)(sizeof opts / sizeof *opts);
    /* key: source, options, NVRTC version, arch, driver version, library version (and each part's number) */
    uint64_t key = qsa__fnv(0xcbf29ce484222325ull, src, strlen(src));
    for (int i = 0; i < nopts; i++) key = qsa__fnv(key, opts[i], strlen(opts[i]) + 1);
    int ver[3] = {qsa__nvrtc.major * 100 + qsa__nvrtc.minor, qsa__cu.driver_version, QSA_VERSION_MAJOR * 10000 + QSA_VERSION_MINOR * 100 + QSA_VERSION_PATCH};
    key = qsa__fnv(key, ver, sizeof ver);
    key = qsa__fnv(key, arch, strlen(arch) + 1);
    char dir[1024];
    int use_cache = qsa__cache_dir(dir, sizeof dir);
    double t0 = qsa__now();
    qsa__cuda_module_unload(g);
    qsa__part_job jobs[QSA__PARTS];
    memset(jobs, 0, sizeof jobs);
    for (int p = 0; p < QSA__PARTS; p++) {
        jobs[p].g = g;
        jobs[p].src = src;
        jobs[p].arch = arch;
        jobs[p].dir = use_cache ? dir : NULL;
        jobs[p].opts = opts;
        jobs[p].nopts = nopts;
        jobs[p].part = p;
        jobs[p].key = key;
    }
    /* the images, then the modules (for a PTX target the driver's JIT of each part), each over the threads */
    const int nt = g->host_threads < 1 ? 1 : g->host_threads > QSA__PARTS ? QSA__PARTS : g->host_threads;
    r = qsa__parts_run(jobs, nt, qsa__part_images);
    double t1 = qsa__now();
    if (r == QSA_OK) r = qsa__parts_run(jobs, nt, qsa__part_loads);
    qsa__free(src);
    int cached = 0;
    for (int p = 0; p < QSA__PARTS; p++) {
        g->mods[p] = jobs[p].mod;
        cached += jobs[p].from_cache;
        qsa__free(jobs[p].img);
    }
    qsa__cu.cuCtxSetCurrent(g->ctx);
    if (r != QSA_OK) { qsa__cuda_module_unload(g); return r; }
    g->jit_from_cache = cached == QSA__PARTS;
    g->jit_seconds = qsa__now() - t0;
    qsa__log(QSA_LOG_INFO, "kernels: %s for %s in %.3f s (images %.3f s, modules %.3f s; %d parts, %d from the disk cache, "
             "%d threads; %s)", g->jit_from_cache ? "loaded from the disk cache" : "compiled", arch, g->jit_seconds,
             t1 - t0, g->jit_seconds - (t1 - t0), QSA__PARTS, cached, nt, use_cache ? dir : "cache off");
    for (int i = 0; i < QSA__K_COUNT; i++) {
        g->k[i] = NULL;
        for (int p = 0; p < QSA__PARTS && !g->k[i]; p++)
            if (qsa__cu.cuModuleGetFunction(&g->k[i], g->mods[p], qsa__kernel_names[i]) != 0) g->k[i] = NULL;
        if (!g->k[i]) return qsa__fail(QSA_ERR_CUDA, "kernels: entry point %s not found in the modules", qsa__kernel_names[i]);
    }
    g->pdl = qsa__pdl_on(g);
    /* qsa_k_gemv_deep's ring: dynamic shared memory past the default 48 KB needs the function's limit
       raised (and the whole carve-out preferred); without cp.async (a module below sm_80) or the room
       for two stages it stays off */
    int optin = 0, most = 0;
    if (qsa__cu.cuDeviceGetAttribute(&optin, QSA__CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, g->dev) != 0)
        optin = 0;
    for (int i = 0; i < 3; i++) { /* (4, 1), (8, 1), (8, 2): warps, K halves */
        int nw = i ? 8 : 4, kh = i == 2 ? 2 : 1, x = (kh - 1) * QSA__DEEP_X_BYTES(nw / kh);
        int stage = QSA__DEEP_STAGE_BYTES(nw, kh), ring = (QSA__DEEP_RING_BYTES < optin ? QSA__DEEP_RING_BYTES : optin) - x;
        g->deep_stages[i] = ring / stage > 8 ? 8 : ring / stage;
        if (g->deep_off || g->arch_num < 80 || g->deep_stages[i] < 2 || (kh == 2 && g->deep_kh_off)) g->deep_stages[i] = 0;
        if (g->deep_stages[i] && g->deep_stages[i] * stage + x > most) most = g->deep_stages[i] * stage + x;
    }
    if (most && (qsa__cu.cuFuncSetAttribute(g->k[QSA__K_gemv_deep], QSA__CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                            most) != 0 ||
                 qsa__cu.cuFuncSetAttribute(g->k[QSA__K_gemv_deep], QSA__CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT,
                                            100) != 0))
        g->deep_stages[0] = g->deep_stages[1] = g->deep_stages[2] = 0;
    /* the dense GEMVs' block form (sm_80+): QSA__GB_SMEM bytes of dynamic shared memory (past 48 KB from
       17 rows on), the whole carve-out preferred; how many such blocks an SM holds (1 KB more each for
       the system's reservation) caps its grids */
    for (int i = 0; i < 2; i++) {
        int sh = QSA__GB_SMEM(i + 1), ok = g->arch_num >= 80 && sh <= (optin > 49152 ? optin : 49152);
        for (int k = 0; k < 2 - i && ok; k++) { /* (32 rows: the split kernel only) */
            CUfunction f = g->k[i ? QSA__K_gemv_blk32 : k ? QSA__K_gemv_blk_whole : QSA__K_gemv_blk];
            ok = qsa__cu.cuFuncSetAttribute(f, QSA__CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, sh) == 0 &&
                 qsa__cu.cuFuncSetAttribute(f, QSA__CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT, 100) == 0;
        }
        g->gemv_blk_fit[i] = ok ? (g->smem_per_sm > 0 ? g->smem_per_sm / (sh + 1024) : 1) : 0;
    }
    /* the tensor-core attention: cp.async, ldmatrix and mma (sm_80+) and QSA__ATTN_TC_SMEM of dynamic shared memory */
    if (g->arch_num < 80 || optin < QSA__ATTN_TC_SMEM) g->attn_tc = 0;
    for (int i = 0; i < 2 && g->attn_tc; i++) {
        CUfunction f = g->k[i ? QSA__K_sparse_attn_tc_batch : QSA__K_sparse_attn_tc];
        if (qsa__cu.cuFuncSetAttribute(f, QSA__CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, QSA__ATTN_TC_SMEM) != 0 ||
            qsa__cu.cuFuncSetAttribute(f, QSA__CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT, 100) != 0)
            g->attn_tc = 0;
    }
    return QSA_OK;
}

/* Launch helper: grid (gx, gy), block bx, dynamic shared memory sh. */
#define QSA__LAUNCH(g, id, gx, gy, bx, sh, ...)                                                              \
    do {                                                                                                   \
        void *qsa__args_[] = {__VA_ARGS__};                                                                \
        QSA__TRY(qsa__cu_launch_ex((g)->k[QSA__K_##id], "qsa_k_" #id, (unsigned)(gx), (unsigned)(gy), 1,   \
                                   (unsigned)(bx), 1, 1, (unsigned)(sh), (g)->stream, qsa__args_, (g)->pdl)); \
    } while (0)

/* ---- weights ---- */

QSA_PRIV qsa_result qsa__dvec(qsa__cuda *g, CUdeviceptr *p, const float *v, size_t n, const char *what) {
    return qsa__dupload(g, p, v, n * sizeof(float), what);
}

/* A piece of an FP16 image -> its place in the device copy (qsa__lin_f16_pieces) */
typedef struct qsa__f16_dev {
    qsa__cuda *g;
    CUdeviceptr base;
} qsa__f16_dev;
QSA_PRIV qsa_result qsa__f16_stage(void *ctx, size_t n, uint16_t **h) {
    void *p;
    qsa__cuda *g = ((qsa__f16_dev *)ctx)->g;
    QSA__TRY(qsa__stage_take(g, n * 2, &p));
    *h = (uint16_t *)p;
    g->up_t0 = qsa__now(); /* (the piece's narrowing: until its send) */
    return QSA_OK;
}
QSA_PRIV qsa_result qsa__f16_to_dev(void *ctx, size_t i0, const uint16_t *h, size_t n) {
    const qsa__f16_dev *x = (const qsa__f16_dev *)ctx;
    x->g->up_fill_s += qsa__now() - x->g->up_t0;
    return qsa__stage_send(x->g, x->base + i0 * 2, h, n * 2);
}
#define QSA__UPLOAD_PIECE ((size_t)32 << 20) /* FP16 values narrowed per host-to-device copy (64 MiB: a stage slot) */

/* A linear map's weights -> the device: NVFP4 packed, dense as FP16 from the host's fp32 copy or straight
   from the mapped file, in pieces (qsa__lin_f16_pieces, counting values beyond the FP16 range). */
QSA_PRIV qsa_result qsa__dlin_up(qsa__cuda *g, qsa__dlin *d, const qsa__lin *l, const char *what) {
    memset(d, 0, sizeof *d);
    d->out = l->out;
    d->in = l->in;
    if (l->bias) QSA__TRY(qsa__dvec(g, &d->bias, l->bias, (size_t)l->out, what));
    if (l->q) {
        d->s2 = l->qscale2;
        long long words = (long long)l->out * (l->in / 8);
        QSA__TRY(qsa__dalloc(g, &d->q, (size_t)words * 4, &g->bytes_weights, what));
        QSA__TRY(qsa__stage_piece_up(g, d->q, l->q, (size_t)words * 4, words, l->in % 32 == 0)); /* (+ the word order) */
        return qsa__dupload(g, &d->s, l->qscale, (size_t)l->out * (size_t)(l->in / 16), what);
    }
    size_t n = (size_t)l->out * (size_t)l->in, over;
    QSA__TRY(qsa__dalloc(g, &d->w16, n * 2, &g->bytes_weights, what));
    qsa__f16_dev x = {g, d->w16};
    QSA__TRY(qsa__lin_f16_pieces(l, g->stage_cap / 2, g->host_threads, qsa__f16_stage, qsa__f16_to_dev, &x, what, &over));
    if (over) qsa__log(QSA_LOG_WARN, "%s: %zu of %zu values overflow FP16 (become inf)", what, over, n);
    return QSA_OK;
}

/* The device bytes qsa__dlin_up allocates for l, in an arena: the bias, then the packed words and the
   block scales (NVFP4) or the FP16 weights. */
QSA_PRIV size_t qsa__dlin_dev_bytes(const qsa__lin *l) {
    size_t out = (size_t)l->out, in = (size_t)l->in, b = l->bias ? qsa__arena_take(out * 4) : 0;
    if (l->q) return b + qsa__arena_take(out * (in / 8) * 4) + qsa__arena_take(out * (in / 16));
    return b + qsa__arena_take(out * in * 2);
}

/* The hyper-connection up projection with its rows interleaved by stream: device row j * hc + s is
   the checkpoint's row s * H + j (H = out / hc), so the hc mix weights of one hidden index j are
   adjacent (qsa_k_gres_mix reads them so, and the decode GEMV's 16-row tiles hold whole groups:
   qsa_k_gemv_gres mixes in its epilogue).  Each row's values are unchanged: the same dot products. */
QSA_PRIV qsa_result qsa__dlin_up_hc(qsa__cuda *g, qsa__dlin *d, const qsa__lin *l, int hc, const char *what) {
    int H = hc > 0 ? l->out / hc : 0;
    if (hc <= 1 || H * hc != l->out) return qsa__dlin_up(g, d, l, what);
    size_t in = (size_t)l->in, nq = l->q ? in / 2 : 0, ns = l->q ? in / 16 : 0;
    float *w = l->q ? NULL : QSA__ALLOC(float, (size_t)l->out * in), *b = l->bias ? QSA__ALLOC(float, (size_t)l->out) : NULL;
    uint8_t *q = nq ? QSA__ALLOC(uint8_t, (size_t)l->out * nq) : NULL, *sc = ns ? QSA__ALLOC(uint8_t, (size_t)l->out * ns) : NULL;
    qsa_result r = QSA_OK;
    if ((!l->q && !w) || (l->bias && !b) || (nq && !q) || (ns && !sc)) {
        r = qsa__fail(QSA_ERR_OUT_OF_MEMORY, "%s: out of host memory", what);
    } else if (!l->q && !l->w && !l->src) {
        r = qsa__fail(QSA_ERR_INTERNAL, "%s: no weights bound", what);
    } else {
        for (int j = 0; j < H; j++)
            for (int st = 0; st < hc; st++) {
                size_t to = (size_t)j * hc + st, from = (size_t)st * H + j;
                if (w && l->w) memcpy(w + to * in, l->w + from * in, in * sizeof(float));
                else if (w) qsa__tensor_to_f32_range(l->src, l->src_off + from * in, in, w + to * in);
                if (b) b[to] = l->bias[from];
                if (q) memcpy(q + to * nq, l->q + from * nq, nq);
                if (sc) memcpy(sc + to * ns, l->qscale + from * ns, ns);
            }
        qsa__lin p = *l;
        p.w = w;
        p.src = NULL;
        p.bias = b;
        p.q = q;
        p.qscale = sc;
        r = qsa__dlin_up(g, d, &p, what);
    }
    qsa__free(w);
    qsa__free(b);
    qsa__free(q);
    qsa__free(sc);
    return r;
}

QSA_PRIV qsa_result qsa__dgres_up(qsa__cuda *g, qsa__dgres *d, const qsa__gres *w, int hcH, int hc) {
    QSA__TRY(qsa__dvec(g, &d->norm_w, w->norm_w, (size_t)hcH, "hc_norm"));
    QSA__TRY(qsa__dlin_up(g, &d->down, &w->down, "input_mix_weight_down"));
    QSA__TRY(qsa__dlin_up_hc(g, &d->up, &w->up, hc, "input_mix_weight_up"));
    if (w->inject.out) QSA__TRY(qsa__dlin_up(g, &d->inject, &w->inject, "block_inject_weight"));
    return QSA_OK;
}

QSA_PRIV qsa_result qsa__cuda_upload_all(qsa_model *m, qsa__cuda *g) {
    const qsa_model_config *c = &m->cfg;
    int H = c->hidden_size, hcH = c->hc_count * H;
    qsa__lin emb = qsa__lin_rows(m->embed, m->embed_t, 0, c->vocab_size, H);
    qsa__dlin demb;
    QSA__TRY(qsa__dlin_up(g, &demb, &emb, "embed_tokens"));
    g->embed16 = demb.w16;
    QSA__TRY(qsa__dlin_up(g, &g->lm_head, &m->lm_head, "lm_head"));
    QSA__TRY(qsa__dgres_up(g, &g->final_hc, &m->final_hc, hcH, c->hc_count));
    QSA__TRY(qsa__dvec(g, &g->rope_inv_freq, m->rope_inv_freq, (size_t)(c->rotary_dim / 2 + 1), "rope"));
    g->layers = QSA__CALLOC(qsa__dlayer, c->num_hidden_layers);
    if (!g->layers) return qsa__fail(QSA_ERR_OUT_OF_MEMORY, "cuda: out of host memory");
    for (int l = 0; l < c->num_hidden_layers; l++) {
        const qsa__layer_w *w = &m->layers[l];
        qsa__dlayer *d = &g->layers[l];
        QSA__TRY(qsa__dgres_up(g, &d->attn_hc, &w->attn_hc, hcH, c->hc_count));
        QSA__TRY(qsa__dgres_up(g, &d->mlp_hc, &w->mlp_hc, hcH, c->hc_count));
        if (w->type == QSA_LAYER_LINEAR) {
            int key_dim = c->linear_num_key_heads * c->linear_key_head_dim;
            int conv_dim = 2 * key_dim + c->linear_num_value_heads * c->linear_value_head_dim;
            QSA__TRY(qsa__dlin_up(g, &d->in_qkv, &w->gdn.in_qkv, "in_proj_qkv"));
            QSA__TRY(qsa__dlin_up(g, &d->in_z, &w->gdn.in_z, "in_proj_z"));
            QSA__TRY(qsa__dlin_up(g, &d->in_b, &w->gdn.in_b, "in_proj_b"));
            QSA__TRY(qsa__dlin_up(g, &d->in_a, &w->gdn.in_a, "in_proj_a"));
            QSA__TRY(qsa__dlin_up(g, &d->out, &w->gdn.out, "out_proj"));
            QSA__TRY(qsa__dvec(g, &d->conv_w, w->gdn.conv_w, (size_t)conv_dim * c->linear_conv_kernel_dim, "conv1d"));
            QSA__TRY(qsa__dvec(g, &d->A_log, w->gdn.A_log, (size_t)c->linear_num_value_heads, "A_log"));
            QSA__TRY(qsa__dvec(g, &d->dt_bias, w->gdn.dt_bias, (size_t)c->linear_num_value_heads, "dt_bias"));
            QSA__TRY(qsa__dvec(g, &d->gnorm_w, w->gdn.norm_w, (size_t)c->linear_value_head_dim, "norm"));
        } else {
            QSA__TRY(qsa__dlin_up(g, &d->q, &w->attn.q, "q_proj"));
            QSA__TRY(qsa__dlin_up(g, &d->k, &w->attn.k, "k_proj"));
            QSA__TRY(qsa__dlin_up(g, &d->v, &w->attn.v, "v_proj"));
            QSA__TRY(qsa__dlin_up(g, &d->o, &w->attn.o, "o_proj"));
            QSA__TRY(qsa__dvec(g, &d->q_norm, w->attn.q_norm, (size_t)c->head_dim, "q_norm"));
            QSA__TRY(qsa__dvec(g, &d->k_norm, w->attn.k_norm, (size_t)c->head_dim, "k_norm"));
            if (c->has_qsa) {
                QSA__TRY(qsa__dlin_up(g, &d->idx_qk, &w->attn.idx_qk, "index_qk_proj"));
                QSA__TRY(qsa__dvec(g, &d->idx_q_norm, w->attn.idx_q_norm, (size_t)c->indexer_head_dim, "q_layernorm"));
                QSA__TRY(qsa__dvec(g, &d->idx_k_norm, w->attn.idx_k_norm, (size_t)c->indexer_head_dim, "k_layernorm"));
            }
        }
        const qsa__moe_w *mw = &w->moe;
        QSA__TRY(qsa__dlin_up(g, &d->router, &mw->router, "mlp.gate"));
        QSA__TRY(qsa__dlin_up(g, &d->sh_gate, &mw->sh_gate, "shared_expert.gate_proj"));
        QSA__TRY(qsa__dlin_up(g, &d->sh_up, &mw->sh_up, "shared_expert.up_proj"));
        QSA__TRY(qsa__dlin_up(g, &d->sh_down, &mw->sh_down, "shared_expert.down_proj"));
        QSA__TRY(qsa__dlin_up(g, &d->sh_expert_gate, &mw->sh_expert_gate, "shared_expert_gate"));
        qsa__dexpert *ex = QSA__CALLOC(qsa__dexpert, c->num_experts);
        if (!ex) return qsa__fail(QSA_ERR_OUT_OF_MEMORY, "cuda: out of host memory");
        d->experts_nvfp4 = mw->gate[0].q != NULL;
        /* the layer's experts in one allocation (3 E matrices; one cuMemAlloc each took most of a real
           checkpoint's expert upload): qsa__dalloc carves it while arena_cap is set */
        size_t arena = 0;
        for (int e = 0; e < c->num_experts; e++)
            arena += qsa__dlin_dev_bytes(&mw->gate[e]) + qsa__dlin_dev_bytes(&mw->up[e]) + qsa__dlin_dev_bytes(&mw->down[e]);
        qsa_result ra = qsa__dalloc(g, &g->arena, arena, NULL, "a layer's experts");
        if (ra != QSA_OK) { qsa__free(ex); return ra; }
        g->arena_used = 0;
        g->arena_cap = arena;
        g->stage_defer = 1; /* (their copies by qsa__stage_flush below, over the threads) */
        for (int e = 0; e < c->num_experts; e++) {
            qsa__dlin gt, up, dn;
            qsa_result r = qsa__dlin_up(g, &gt, &mw->gate[e], "experts.gate_proj");
            if (r == QSA_OK) r = qsa__dlin_up(g, &up, &mw->up[e], "experts.up_proj");
            if (r == QSA_OK) r = qsa__dlin_up(g, &dn, &mw->down[e], "experts.down_proj");
            if (r == QSA_OK && (gt.w16 == 0) != d->experts_nvfp4)
                r = qsa__fail(QSA_ERR_UNSUPPORTED, "layer %d: experts mix NVFP4 and dense weights", l);
            if (r != QSA_OK) { g->arena_cap = 0; qsa__free(ex); return r; }
            ex[e].gate_q = gt.q; ex[e].gate_s = gt.s; ex[e].gate_s2 = gt.s2; ex[e].gate16 = gt.w16;
            ex[e].up_q = up.q; ex[e].up_s = up.s; ex[e].up_s2 = up.s2; ex[e].up16 = up.w16;
            ex[e].down_q = dn.q; ex[e].down_s = dn.s; ex[e].down_s2 = dn.s2; ex[e].down16 = dn.w16;
        }
        g->arena_cap = 0;
        g->stage_defer = 0;
        qsa_result r = qsa__stage_flush(g);
        if (r == QSA_OK) r = qsa__dupload(g, &d->experts, ex, sizeof(qsa__dexpert) * (size_t)c->num_experts, "expert table");
        qsa__free(ex);
        QSA__TRY(r);
        if (w->ple) {
            QSA__TRY(qsa__dlin_up(g, &d->ple_key, &w->ple->key, "ple.key_proj"));
            QSA__TRY(qsa__dlin_up(g, &d->ple_value, &w->ple->value, "ple.value_proj"));
            QSA__TRY(qsa__dvec(g, &d->ple_nk, w->ple->norm_key, (size_t)hcH, "ple.norm_key"));
            QSA__TRY(qsa__dvec(g, &d->ple_nq, w->ple->norm_query, (size_t)hcH, "ple.norm_query"));
            QSA__TRY(qsa__dvec(g, &d->ple_nc, w->ple->norm_conv, (size_t)hcH, "ple.norm_conv"));
            QSA__TRY(qsa__dvec(g, &d->ple_conv_w, w->ple->conv_w, (size_t)hcH * c->ple_conv_kernel_size, "ple.conv1d"));
        }
    }
    return QSA_OK;
}
/* fn(ctx) with the upload's stage open (slots of `slot` bytes): every host-to-device copy (qsa__dupload,
   qsa__stage_piece_up) goes through it.  Returns when every copy has finished, or with the first error; the
   stage is freed either way. */
QSA_PRIV qsa_result qsa__staged(qsa__cuda *g, size_t slot, qsa_result (*fn)(void *ctx), void *ctx) {
    QSA__TRY(qsa__stage_open(g, slot));
    qsa_result r = fn(ctx);
    if (r == QSA_OK) return qsa__stage_close(g);
    if (g->stage_pinned) qsa__cu.cuStreamSynchronize(g->stream); /* (the copies read the stage: their error is r's) */
    qsa__stage_free(g);
    return r;
}
typedef struct qsa__upload_job { qsa_model *m; qsa__cuda *g; } qsa__upload_job;
QSA_PRIV qsa_result qsa__upload_job_run(void *c) { return qsa__cuda_upload_all(((qsa__upload_job *)c)->m, ((qsa__upload_job *)c)->g); }
/* The model's weights -> the device through the stage (slots of g->upload_piece FP16 values' bytes, default
   QSA__UPLOAD_PIECE). */
QSA_PRIV qsa_result qsa__cuda_upload(qsa_model *m, qsa__cuda *g) {
    qsa__upload_job job = {m, g};
    return qsa__staged(g, 2 * (g->upload_piece ? g->upload_piece : QSA__UPLOAD_PIECE), qsa__upload_job_run, &job);
}

/* Scratch sized for chunks of `max_tokens`. */
/* The cross-warp GEMV's partial tiles and tickets (once; the tickets start at zero and every launch
   leaves them there). */
QSA_PRIV qsa_result qsa__cuda_gemv_scratch(qsa__cuda *g) {
    qsa__dscratch *s = &g->sc;
    if (s->gemv_part) return QSA_OK;
    QSA__TRY(qsa__dalloc(g, &s->gemv_count, QSA__GEMV_TILES * 4, &g->bytes_scratch, "GEMV scratch"));
    QSA__CU(qsa__cu.cuMemsetD8Async(s->gemv_count, 0, QSA__GEMV_TILES * 4, g->stream));
    s->gemv_limit = QSA__GEMV_PART_BYTES;
    return qsa__dalloc(g, &s->gemv_part, QSA__GEMV_PART_BYTES, &g->bytes_scratch, "GEMV scratch");
}

QSA_PRIV qsa_result qsa__cuda_scratch(qsa_model *m, qsa__cuda *g, int T) {
    const qsa_model_config *c = &m->cfg;
    qsa__dscratch *s = &g->sc;
    int H = c->hidden_size, hc = c->hc_count, hcH = hc * H;
    int key_dim = c->linear_num_key_heads * c->linear_key_head_dim, value_dim = c->linear_num_value_heads * c->linear_value_head_dim;
    int conv_dim = 2 * key_dim + value_dim;
    size_t w = (size_t)hcH;
    size_t cand[] = {(size_t)conv_dim, (size_t)value_dim, (size_t)c->num_attention_heads * c->head_dim * 2,
                     (size_t)(c->indexer_n_heads + 1) * (c->indexer_head_dim ? c->indexer_head_dim : 1),
                     (size_t)c->num_experts_per_tok * c->moe_intermediate_size, (size_t)c->shared_expert_intermediate_size,
                     (size_t)c->num_experts, (size_t)c->ple_embed_dim};
    for (size_t i = 0; i < sizeof cand / sizeof cand[0]; i++) if (cand[i] > w) w = cand[i];
    s->max_tokens = T;
    s->big_bytes = (size_t)T * w * sizeof(float);
    size_t *cnt = &g->bytes_scratch;
    QSA__TRY(qsa__dalloc(g, &s->ids, (size_t)T * 4, cnt, "scratch"));
    QSA__TRY(qsa__dalloc(g, &s->X, (size_t)T * hcH * 4, cnt, "scratch"));
    QSA__TRY(qsa__dalloc(g, &s->xn, (size_t)T * hcH * 4, cnt, "scratch"));
    QSA__TRY(qsa__dalloc(g, &s->xn16, (size_t)T * hcH * 2, cnt, "scratch"));
    QSA__TRY(qsa__dalloc(g, &s->low, (size_t)T * c->hc_lowrank * 4, cnt, "scratch"));
    QSA__TRY(qsa__dalloc(g, &s->low16, (size_t)T * c->hc_lowrank * 2, cnt, "scratch"));
    QSA__TRY(qsa__dalloc(g, &s->mw, (size_t)T * hcH * 4, cnt, "scratch"));
    QSA__TRY(qsa__dalloc(g, &s->inp, (size_t)T * H * 4, cnt, "scratch"));
    QSA__TRY(qsa__dalloc(g, &s->inp16, (size_t)T * H * 2, cnt, "scratch"));
    QSA__TRY(qsa__dalloc(g, &s->inj, (size_t)T * hc * 4, cnt, "scratch"));
    QSA__TRY(qsa__dalloc(g, &s->out, (size_t)T * H * 4, cnt, "scratch"));
    for (int i = 0; i < 6; i++) QSA__TRY(qsa__dalloc(g, &s->big[i], s->big_bytes, cnt, "scratch"));
    for (int i = 0; i < 3; i++) QSA__TRY(qsa__dalloc(g, &s->big16[i], s->big_bytes / 2, cnt, "scratch"));
    int topk = c->has_qsa ? c->indexer_budget / c->indexer_compress_ratio : 1;
    /* block scores and logits are produced for row groups small enough to bound their buffers */
    s->max_blocks = c->has_qsa ? c->max_position_embeddings / c->indexer_compress_ratio + 1 : 1;
    s->score_rows = (int)((64u << 20) / (size_t)s->max_blocks);
    if (s->score_rows < 1) s->score_rows = 1;
    if (s->score_rows > T) s->score_rows = T;
    s->scores_bytes = (size_t)s->score_rows * s->max_blocks * 4;
    s->logit_rows = (int)((64u << 20) / (size_t)c->vocab_size);
    if (s->logit_rows < 1) s->logit_rows = 1;
    if (s->logit_rows > T) s->logit_rows = T;
    QSA__TRY(qsa__dalloc(g, &s->logits, (size_t)s->logit_rows * c->vocab_size * 4, cnt, "logits"));
    QSA__TRY(qsa__dalloc(g, &s->sel, (size_t)T * topk * 4, cnt, "scratch"));
    if (m->params.debug_physical_order && c->has_qsa)
        QSA__TRY(qsa__dalloc(g, &s->tokpos, (size_t)T * (topk + 1) * c->indexer_compress_ratio * 4, cnt, "scratch"));
    QSA__TRY(qsa__dalloc(g, &s->nsel, (size_t)T * 4, cnt, "scratch"));
    QSA__TRY(qsa__dalloc(g, &s->scores, s->scores_bytes, cnt, "scratch"));
    /* MoE pair scratch for sub-chunks of up to 256 MiB of expert outputs ([M*K][H] fp32), at least
       256 tokens: a prefill chunk's experts see all its tokens at once (a token's bits do not
       depend on its sub-chunk) */
    {
        size_t per_tok = (size_t)c->num_experts_per_tok * c->hidden_size * 4, cap = ((size_t)256 << 20) / (per_tok ? per_tok : 1);
        if (cap < 256) cap = 256;
        s->moe_tokens = (size_t)T < cap ? T : (int)cap;
    }
    {
        size_t MK = (size_t)s->moe_tokens * c->num_experts_per_tok;
        size_t tiles = (MK + 15) / 16 + ((size_t)c->num_experts < MK ? (size_t)c->num_experts : MK);
        QSA__TRY(qsa__dalloc(g, &s->moe_pairs, MK * 4, cnt, "MoE scratch"));
        QSA__TRY(qsa__dalloc(g, &s->moe_tiles, tiles * 3 * 4, cnt, "MoE scratch"));
        QSA__TRY(qsa__dalloc(g, &s->moe_ntiles, 4, cnt, "MoE scratch"));
        QSA__TRY(qsa__dalloc(g, &s->moe_wcnt, (size_t)QSA__MOE_PLAN_THREADS / 32 * c->num_experts * 4, cnt, "MoE scratch"));
        QSA__TRY(qsa__dalloc(g, &s->moe_ticket, 4, cnt, "MoE scratch"));
        QSA__CU(qsa__cu.cuMemsetD8Async(s->moe_ticket, 0, 4, g->stream));
        QSA__TRY(qsa__dalloc(g, &s->moe_h16, MK * c->moe_intermediate_size * 2, cnt, "MoE scratch"));
        QSA__TRY(qsa__dalloc(g, &s->moe_y, MK * c->hidden_size * 4, cnt, "MoE scratch"));
    }
    /* cross-warp GEMV (qsa__dgemm): partial tiles and one ticket per tile, zeroed once (every
       launch leaves its tickets at zero) */
    QSA__TRY(qsa__cuda_gemv_scratch(g));
    /* a column slice's output (qsa__dgemm_ex), made here rather than at the first sliced GEMV: that can be a
       chunk's lm_head, after its layers have run, where running out of device memory would leave the
       sequence broken (its context lost) for want of a buffer the model keeps anyway */
    if (!s->gemv_slice) QSA__TRY(qsa__dalloc(g, &s->gemv_slice, QSA__GEMV_PART_BYTES, cnt, "GEMV slices"));
    s->host_e = QSA__ALLOC(float, (size_t)T * (c->ple_embed_dim ? c->ple_embed_dim : 1));
    if (!s->host_e) return qsa__fail(QSA_ERR_OUT_OF_MEMORY, "cuda: out of host memory");
    return QSA_OK;
}

QSA_PRIV void qsa__cuda_free(qsa__cuda *g) {
    if (!g) return;
    if (g->ctx) qsa__cu.cuCtxSetCurrent(g->ctx);
    for (int i = 0; i < g->n_allocs; i++) qsa__cu.cuMemFree_v2(g->allocs[i]);
    qsa__free(g->allocs);
    qsa__free(g->layers);
    qsa__free(g->sc.host_e);
    qsa__cuda_batch_free(g);
    qsa__cuda_module_unload(g);
    if (g->side_fork) qsa__cu.cuEventDestroy_v2(g->side_fork);
    if (g->side_join) qsa__cu.cuEventDestroy_v2(g->side_join);
    if (g->side) qsa__cu.cuStreamDestroy_v2(g->side);
    if (g->stream) qsa__cu.cuStreamDestroy_v2(g->stream);
    if (g->ctx) qsa__cu.cuDevicePrimaryCtxRelease_v2(g->dev);
    qsa__free(g);
}

/* Bring up the backend for a loaded (CPU-side) model. */
/* Whether the cross-warp expert kernels give each warp a whole tile (all K segments, folded in
   registers: qsa_k_moe_*_xwk) rather than one segment: once the (tile, column tile) pairs alone
   number QSA__XW_WHOLE_PER_SM warps per SM, there is parallelism enough without the partials and
   tickets.  Same bits either way.  (8 measured on the H200 against 32: batch 8 322 -> 340 tok/s,
   batch 1 and 32 unchanged; 2 makes batch 1's gate/up whole too: 92.0 -> 88.8.) */
#define QSA__XW_WHOLE_PER_SM 8
/* Tasks (column tile, matrix) per warp of the lean expert kernels, gate/up and down: consecutive ones
   of one tile; gate/up with 2 or 4 has both matrices of a column tile and forms act(gate) * up without
   the ticket */
#define QSA__LEAN_GU_TASKS 2
#define QSA__LEAN_DN_TASKS 4
#define QSA__LEAN_MIN_WARPS 16
/* Warps per block of the lean expert kernels (kernels.cu QSA_LEAN_WARPS) */
#define QSA__LEAN_WARPS 2
/* Below that, the split expert kernels give each warp a range of a tile's K segments (copied a
   segment ahead, qsa_k_moe_*_xw with nrange < nseg) rather than one: as few ranges as make
   QSA__XW_RANGE_PER_SM warps per SM (qsa__xw_ranges; the 5 blocks of 4 warps that fit an SM).
   Same bits either way. */
#define QSA__XW_RANGE_PER_SM 20
/* Pairs per expert (on average) from which the routed experts take tiles of 64 pairs
   (qsa_k_moe_*64) instead of 16; the same bits either way.  (4 measured on the H200 against 16: a
   2,048-token prefill in chunks of 512, 10 pairs per expert, 1,719 -> 2,153 tok/s; 2 and 1 the same
   as 4.) */
#define QSA__MOE64_PAIRS 4
/* Decode batches of at least this many tokens take the 64 x 64 tiled kernel for dense projections
   whose tiles number at least the SMs (qsa__tiled_small); the same bits either way.  (Measured on
   the H200, real shape: at 17 against the cross-warp GEMV for every M, B=32 graphs 672.2 / 676.9 ->
   723.8 / 709.0 tok/s — the GDN input group 102.6 -> 49.9 us per launch, attention q/k/v 88.4 ->
   49.2, lm_head 1,328 -> 655 us; at 1, B=8 unchanged and B=1 105.4 -> 98.3.) */
#define QSA__TILED_M 17
/* A batch's logits from 8 MiB on (B >= 9 at the real vocabulary) cross to the host in QSA__LOGIT_SLICES
   slices, each while the next is computed (qsa__logit_slices; the H200, B=32: 974.2 -> 986.5 tok/s,
   +graphs 992.2 -> 1003.8, the greedy step's 1003.8 — the copy hidden; docs/PERFORMANCE-LOG.md) */
#define QSA__LOGIT_SLICE_BYTES ((size_t)8 << 20)
#define QSA__LOGIT_SLICES 4
#define QSA__SCORE_KEYS 32 /* qsa__score_ys */
/* The launch-shape switches read from the environment once per context (the bits do not depend on
   them): $QSA_XW_WHOLE_PER_SM, $QSA_XW_RANGE_PER_SM and $QSA_MOE64_PAIRS, positive integers, replace
   QSA__XW_WHOLE_PER_SM, QSA__XW_RANGE_PER_SM and QSA__MOE64_PAIRS; $QSA_ATTN_DEC ("0": never), $QSA_ATTN_DEC_HEADS and
   $QSA_ATTN_DEC_WARP choose and shape qsa_k_sparse_attn_dec (qsa__attn_dec_splits) where the tensor-core
   attention does not apply ($QSA_ATTN_TC "0": never it — other bits, the fp32 kernels' — qsa__attn_tc), $QSA_SCORE_KEYS (8 or
   more) replaces QSA__SCORE_KEYS (qsa__score_ys); $QSA_TILED_M
   and $QSA_TILED_TILES replace qsa__tiled_small's thresholds (QSA__TILED_M tokens, the SM count of
   tiles); $QSA_GEMV_BLOCKS_PER_SM replaces QSA__GEMV_BLOCKS (qsa__gemv_blk_grid), $QSA_GEMV_BLK_MIN_M
   QSA__GEMV_BLK_MIN_M (qsa__gemv_groups), $QSA_GEMV_WHOLE_SEGS (0 or more) QSA__GEMV_WHOLE_SEGS,
   $QSA_GEMV_FOLD_MIN_M (65: never) QSA__GEMV_FOLD_MIN_M (qsa__gemv_blk)
   and $QSA_GEMV_WHOLE_MIN_GROUPS (0: never) the SM count (qsa__gemv_blk); $QSA_SHARED_SIDE "0" keeps
   the shared expert's down projection in the chain (qsa__cuda_moe); $QSA_MOE_ROUTE1 "0" gives one
   token's router its own launch (qsa__moe_route1); $QSA_GDN_FUSE "0" gives a decode step's GDN conv its
   own launch (qsa__gdn_fused); $QSA_MOE_LEAN "0" keeps the whole
   expert kernels off their lean forms (qsa__moe_lean) and $QSA_LEAN_TASKS ("GU,DN", each 1, 2 or 4) sets
   their tasks per warp; $QSA_LOGIT_SLICE_BYTES (0: never)
   replaces QSA__LOGIT_SLICE_BYTES (qsa__logit_slices); $QSA_DEEP "0" keeps decode batches' wide projections
   on the tiled group kernel (no qsa_k_gemv_deep), $QSA_DEEP_WARPS (4 or 8) fixes its blocks' warps and
   $QSA_DEEP_KH "1" keeps its blocks whole in K. */

QSA_PRIV void qsa__cuda_tuning(qsa__cuda *g) {
    g->gemv_blocks_per_sm = (int)qsa__env_int("QSA_GEMV_BLOCKS_PER_SM", 1, 64, QSA__GEMV_BLOCKS);
    g->gemv_blk_min_m = (int)qsa__env_int("QSA_GEMV_BLK_MIN_M", 1, 1 << 20, QSA__GEMV_BLK_MIN_M);
    g->gemv_whole_segs = (int)qsa__env_int("QSA_GEMV_WHOLE_SEGS", 0, 1 << 20, QSA__GEMV_WHOLE_SEGS);
    g->gemv_fold_min_m = (int)qsa__env_int("QSA_GEMV_FOLD_MIN_M", 1, 1 << 20, QSA__GEMV_FOLD_MIN_M);
    g->gemv_whole_min_groups = (int)qsa__env_int("QSA_GEMV_WHOLE_MIN_GROUPS", 0, 1 << 30, g->sm_count > 0 ? g->sm_count : 1);
    g->shared_side = qsa__env_flag("QSA_SHARED_SIDE", 1);
    g->sample_dev = qsa__env_flag("QSA_SAMPLE_DEVICE", 1);
    g->moe_route1 = qsa__env_flag("QSA_MOE_ROUTE1", 1);
    g->gdn_fuse = qsa__env_flag("QSA_GDN_FUSE", 1);
    g->xw_whole_per_sm = (int)qsa__env_int("QSA_XW_WHOLE_PER_SM", 1, 1 << 20, QSA__XW_WHOLE_PER_SM);
    g->xw_range_per_sm = (int)qsa__env_int("QSA_XW_RANGE_PER_SM", 1, 1 << 20, QSA__XW_RANGE_PER_SM);
    g->moe64_pairs = (int)qsa__env_int("QSA_MOE64_PAIRS", 1, 1 << 20, QSA__MOE64_PAIRS);
    g->moe_lean = qsa__env_flag("QSA_MOE_LEAN", 1);
    g->lean_tasks[0] = QSA__LEAN_GU_TASKS;
    g->lean_tasks[1] = QSA__LEAN_DN_TASKS;
    const char *e = getenv("QSA_LEAN_TASKS");
    if (e && e[0]) {
        int gu = 0, dn = 0, n = 0;
        if (sscanf(e, "%d,%d%n", &gu, &dn, &n) == 2 && !e[n] && (gu == 1 || gu == 2 || gu == 4) && (dn == 1 || dn == 2 || dn == 4)) {
            g->lean_tasks[0] = gu;
            g->lean_tasks[1] = dn;
        } else {
            qsa__log(QSA_LOG_WARN, "QSA_LEAN_TASKS=%.40s is not GU,DN with each 1, 2 or 4: using %d,%d", e, g->lean_tasks[0],
                     g->lean_tasks[1]);
        }
    }
    g->attn_dec_off = !qsa__env_flag("QSA_ATTN_DEC", 1);
    g->attn_tc = qsa__env_flag("QSA_ATTN_TC", 1);
    g->attn_dec_heads = (int)qsa__env_int("QSA_ATTN_DEC_HEADS", 0, 1 << 20, 0);
    g->attn_dec_warp = (int)qsa__env_int("QSA_ATTN_DEC_WARP", 0, 2, 0);
    g->score_keys = (int)qsa__env_int("QSA_SCORE_KEYS", 8, 1 << 20, QSA__SCORE_KEYS);
    g->tiled_min_m = (int)qsa__env_int("QSA_TILED_M", 1, 1 << 20, QSA__TILED_M);
    g->tiled_min_tiles = (int)qsa__env_int("QSA_TILED_TILES", 0, 1 << 20, 0);
    g->deep_off = !qsa__env_flag("QSA_DEEP", 1);
    g->deep_kh_off = qsa__env_flag("QSA_DEEP_KH", 0);
    g->deep_warps = (int)qsa__env_int("QSA_DEEP_WARPS", 0, 8, 0);
    if (g->deep_warps != 0 && g->deep_warps != 4 && g->deep_warps != 8) {
        qsa__log(QSA_LOG_WARN, "QSA_DEEP_WARPS=%d is not 4 or 8: the runtime's choice", g->deep_warps);
        g->deep_warps = 0;
    }
    g->logit_slice_bytes = (size_t)qsa__env_int("QSA_LOGIT_SLICE_BYTES", 0, (long long)1 << 40, QSA__LOGIT_SLICE_BYTES);
}

/* The backend's device bring-up on a zeroed g for device `ordinal`: its compute capability, SM count
   and tuning switches, its primary context (current on this thread), the chain's stream and the side
   stream with its fork and join events (qsa__dgemm_side; without them every launch stays in the
   chain).  *info: the device's description.  tools/bench builds its qsa__cuda through this too, so
   that it measures the launches the runtime makes (until the fifty-fourth session it made its own
   stream only, and its decode steps never used the side stream).  On failure qsa__cuda_free(g)
   releases what was made. */
QSA_PRIV qsa_result qsa__cuda_open(qsa__cuda *g, int ordinal, qsa__gpu_info *info) {
    g->ordinal = ordinal;
    QSA__TRY(qsa__cu_device_info(ordinal, info));
    g->cc = info->cc_major * 10 + info->cc_minor;
    g->sm_count = info->sm_count;
    g->smem_per_sm = info->smem_per_sm;
    qsa__cuda_tuning(g);
    QSA__CU(qsa__cu.cuDeviceGet(&g->dev, ordinal));
    QSA__CU(qsa__cu.cuDevicePrimaryCtxRetain(&g->ctx, g->dev));
    QSA__CU(qsa__cu.cuCtxSetCurrent(g->ctx));
    QSA__CU(qsa__cu.cuStreamCreate(&g->stream, QSA__CU_STREAM_NON_BLOCKING));
    QSA__CU(qsa__cu.cuStreamCreate(&g->side, QSA__CU_STREAM_NON_BLOCKING));
    QSA__CU(qsa__cu.cuEventCreate(&g->side_fork, QSA__CU_EVENT_DISABLE_TIMING));
    QSA__CU(qsa__cu.cuEventCreate(&g->side_join, QSA__CU_EVENT_DISABLE_TIMING));
    return QSA_OK;
}

QSA_PRIV qsa_result qsa__cuda_init(qsa_model *m, qsa__cuda **out) {
    *out = NULL;
    const qsa_model_config *c = &m->cfg;
    /* the GDN gates' [tokens][nv] temporaries live in scratch of [tokens][hidden_size] (out) and
       [tokens][hc_lowrank] (low): qsa__cuda_gdn, qsa__cuda_gdn_batch */
    int gdn = 0;
    for (int l = 0; l < c->num_hidden_layers; l++) gdn |= c->layer_types[l] == QSA_LAYER_LINEAR;
    if (gdn && (c->linear_num_value_heads > c->hidden_size || c->linear_num_value_heads > c->hc_lowrank))
        return qsa__fail(QSA_ERR_UNSUPPORTED, "cuda: %d GDN value heads exceed hidden_size %d or hc_lowrank %d: the CUDA backend "
                         "keeps each token's gates in rows of that size (the CPU backend runs this model)",
                         c->linear_num_value_heads, c->hidden_size, c->hc_lowrank);
    QSA__TRY(qsa__cuda_load());
    if (qsa__cu.device_count <= 0) return qsa__fail(QSA_ERR_NO_DEVICE, "cuda: no CUDA device");
    qsa__cuda *g = QSA__CALLOC(qsa__cuda, 1);
    if (!g) return qsa__fail(QSA_ERR_OUT_OF_MEMORY, "cuda: out of host memory");
    g->host_threads = m->n_threads;
    qsa_result r = QSA_OK;
    qsa__gpu_info info;
    double up_s = 0.0; /* the upload's time */
#define QSA__G(expr) do { if ((r = (expr)) != QSA_OK) goto fail; } while (0)
    QSA__G(qsa__cuda_open(g, m->params.device, &info));
    QSA__G(qsa__cuda_module(g, m->params.arch));
    up_s = qsa__now();
    QSA__G(qsa__cuda_upload(m, g));
    up_s = qsa__now() - up_s;
    {
        const qsa__pool *p = &m->pool;
        size_t slots = (size_t)p->n_qsa * p->n_pages * p->page_size;
        QSA__G(qsa__dalloc(g, &g->kpool, slots * p->kvd * 2, &g->bytes_kv, "KV pool (K)"));
        QSA__G(qsa__dalloc(g, &g->vpool, slots * p->kvd * 2, &g->bytes_kv, "KV pool (V)"));
        QSA__G(qsa__dalloc(g, &g->ipool, slots * p->ihd * 4, &g->bytes_kv, "KV pool (indexer keys)"));
    }
    QSA__G(qsa__cuda_scratch(m, g, m->params.max_chunk));
    /* without pinned memory the upload's copies and word-order launches ran on the legacy stream
       (pageable copies may still be in flight when they return), which the backend's non-blocking
       stream does not wait for: finish everything before any kernel */
    QSA__G(QSA__CU_R(qsa__cu.cuCtxSynchronize()));
#undef QSA__G
    qsa__log(QSA_LOG_INFO, "cuda: %s (cc %d.%d), memory: weights %.1f MiB (uploaded in %.2f s, %.2f GB/s: filling the stage "
             "%.2f s, waiting on copies %.2f s), KV pool %.1f MiB, scratch %.1f MiB", info.name, info.cc_major, info.cc_minor,
             g->bytes_weights / 1048576.0, up_s, up_s > 0 ? g->bytes_weights / up_s * 1e-9 : 0.0, g->up_fill_s, g->up_wait_s,
             g->bytes_kv / 1048576.0, g->bytes_scratch / 1048576.0);
    *out = g;
    return QSA_OK;
fail:
    {
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", qsa_last_error());
        qsa__cuda_free(g);
        return qsa__fail(r, "%s", msg);
    }
}

/* ---- per-sequence device state ---- */

QSA_PRIV void qsa__cuda_seq_free(qsa__cuda_seq *cs) {
    if (!cs) return;
    qsa__free(cs->conv);
    qsa__free(cs->S);
    qsa__free(cs->ple_conv);
    qsa__free(cs->bkeys);
    qsa__free(cs);
}

QSA_PRIV qsa_result qsa__cuda_seq_create(qsa_model *m, qsa_seq *s) {
    if (m->tp) return qsa__tp_seq_create(m, s);
    const qsa_model_config *c = &m->cfg;
    qsa__cuda *g = m->cuda;
    int L = c->num_hidden_layers, hcH = c->hc_count * c->hidden_size;
    int key_dim = c->linear_num_key_heads * c->linear_key_head_dim;
    int conv_dim = 2 * key_dim + c->linear_num_value_heads * c->linear_value_head_dim;
    size_t conv_b = (size_t)(c->linear_conv_kernel_dim - 1) * conv_dim * 4 + 16;
    size_t S_b = (size_t)c->linear_num_value_heads * c->linear_key_head_dim * c->linear_value_head_dim * 4;
    size_t ple_b = (size_t)(c->ple_conv_kernel_size - 1) * c->ngram_size * hcH * 4 + 16;
    size_t bk_b = c->has_qsa ? (size_t)(s->n_ctx / c->indexer_compress_ratio + 1) * c->indexer_head_dim * 4 : 16;
    size_t bt_b = (size_t)(s->n_ctx / m->pool.page_size + 1) * 4;
    qsa__cuda_seq *cs = QSA__CALLOC(qsa__cuda_seq, 1);
    if (!cs) return qsa__fail(QSA_ERR_OUT_OF_MEMORY, "sequence: out of host memory");
    cs->conv = QSA__CALLOC(CUdeviceptr, L);
    cs->S = QSA__CALLOC(CUdeviceptr, L);
    cs->ple_conv = QSA__CALLOC(CUdeviceptr, L);
    cs->bkeys = QSA__CALLOC(CUdeviceptr, L);
    if (!cs->conv || !cs->S || !cs->ple_conv || !cs->bkeys) { qsa__cuda_seq_free(cs); return qsa__fail(QSA_ERR_OUT_OF_MEMORY, "sequence: out of host memory"); }
    /* every part starts on a 256-byte boundary: the allocation holds the parts rounded up (the
       carving below advances by the rounded sizes, so unrounded sums would end short of the last part) */
#define QSA__R256(b) (((b) + 255) & ~(size_t)255)
    size_t total = QSA__R256(bt_b);
    for (int l = 0; l < L; l++) {
        if (c->layer_types[l] == QSA_LAYER_LINEAR) total += QSA__R256(conv_b) + QSA__R256(S_b);
        else total += QSA__R256(bk_b);
        if (m->layers[l].ple) total += QSA__R256(ple_b);
    }
    qsa_result r = QSA_OK;
    CUdeviceptr base = 0;
    CUresult ra = 0;
    if ((r = QSA__CU_R(qsa__cu.cuCtxSetCurrent(g->ctx))) == QSA_OK && (ra = qsa__cu.cuMemAlloc_v2(&base, total)) != 0)
        r = ra == QSA__CUDA_ERROR_OUT_OF_MEMORY
                ? qsa__fail(QSA_ERR_OUT_OF_MEMORY, "sequence: %zu bytes of GPU state (n_ctx %d) do not fit", total, s->n_ctx)
                : qsa__cu_check(ra, "cuMemAlloc (a sequence's GPU state)", __LINE__);
    if (r != QSA_OK) { qsa__cuda_seq_free(cs); return r; }
    cs->mem = base;
    cs->mem_bytes = total;
    size_t off = 0;
#define QSA__CARVE(dst, b) do { (dst) = base + off; off += QSA__R256(b); } while (0)
    QSA__CARVE(cs->bt, bt_b);
    for (int l = 0; l < L; l++) {
        if (c->layer_types[l] == QSA_LAYER_LINEAR) { QSA__CARVE(cs->conv[l], conv_b); QSA__CARVE(cs->S[l], S_b); }
        else QSA__CARVE(cs->bkeys[l], bk_b);
        if (m->layers[l].ple) QSA__CARVE(cs->ple_conv[l], ple_b);
    }
#undef QSA__CARVE
#undef QSA__R256
    (void)off;
    g->bytes_state += total;
    s->cuda = cs;
    /* a failed zeroing takes the state back (a tensor-parallel rank's job, qsa__tp_seq_create_job, keeps
       only a state that succeeded: the sequence's free would not find this one) */
    r = qsa__cuda_seq_reset(m, s);
    if (r != QSA_OK) qsa__cuda_seq_destroy(m, s);
    return r;
}

QSA_PRIV qsa_result qsa__cuda_seq_reset(qsa_model *m, qsa_seq *s) {
    if (m->tp) return qsa__tp_seq_reset(m, s);
    qsa__cuda_seq *cs = s->cuda;
    cs->bt_synced = 0; /* (the pages are the pool's again: the next feed copies the block table whole) */
    QSA__CU(qsa__cu.cuCtxSetCurrent(m->cuda->ctx));
    /* on the backend's stream: a plain cuMemset runs on the legacy stream, which a non-blocking
       stream does not wait for, so the first kernels could race with the zeroing */
    QSA__CU(qsa__cu.cuMemsetD8Async(cs->mem, 0, cs->mem_bytes, m->cuda->stream));
    return QSA_OK;
}

QSA_PRIV void qsa__cuda_seq_destroy(qsa_model *m, qsa_seq *s) {
    if (m->tp) { qsa__tp_seq_destroy(m, s); return; }
    qsa__cuda_seq *cs = s->cuda;
    if (!cs) return;
    qsa__cu.cuCtxSetCurrent(m->cuda->ctx);
    qsa__cu.cuStreamSynchronize(m->cuda->stream); /* no kernel may still use the memory */
    qsa__cu.cuMemFree_v2(cs->mem);
    m->cuda->bytes_state -= cs->mem_bytes;
    m->cuda->batch_refused = 0; /* (device memory given back: the next single-token feed asks for the batched step's buffers again) */
    qsa__cuda_seq_free(cs);
    s->cuda = NULL;
}

/* ---- forward ---- */

/* Launch helper with a z dimension (the batched kernels: z = sequence; the tensor-core attention: z = query):
   grid (gx, gy, gz), block bx, dynamic shared memory sh. */
#define QSA__LAUNCH3(g, id, gx, gy, gz, bx, sh, ...)                                                         \
    do {                                                                                                   \
        void *qsa__args_[] = {__VA_ARGS__};                                                                \
        QSA__TRY(qsa__cu_launch_ex((g)->k[QSA__K_##id], "qsa_k_" #id, (unsigned)(gx), (unsigned)(gy),       \
                                   (unsigned)(gz), (unsigned)(bx), 1, 1, (unsigned)(sh), (g)->stream, qsa__args_, \
                                   (g)->pdl));                                                              \
    } while (0)

/* Threads of a sparse-attention block: 16 warps (16 splits at once: a decode query's 2,048 selected
   tokens in one round, the 0-3 tail tokens in a second) when there are few queries, 8 for prefill.
   The bits do not depend on it. */
QSA_PRIV unsigned qsa__attn_threads(int M) { return M <= 64 ? 512u : 256u; }

/* Decode attention of B queries (one per sequence) through qsa_k_sparse_attn_dec[_batch] (a block
   per (split, group of *hb query heads of one KV head), K and V read once per group, the splits merged
   by a qsa_k_sparse_attn_merge launch after it; the bits of qsa_k_sparse_attn): returns the splits per
   query to launch for (the grid's x) and sets *hb and the block's *threads, or returns 0 for
   qsa_k_sparse_attn.  Used for any number of sequences (unless
   $QSA_ATTN_DEC is "0") with an indexer (r = 0: the context, not the budget, bounds the splits), hd
   128 or 256 and the partials within the GEMV scratch.  *hb: all the query
   heads of a KV head, or the largest divisor of them up to $QSA_ATTN_DEC_HEADS whose block fits
   QSA__ATTN_DEC_THREADS (the kernel's launch bound), with two heads per warp when it is even and
   there are at least QSA__ATTN_DEC_PAIR_B sequences (a warp's heads share its conversions of K and
   V, but its split takes twice as long: fewer sequences want the shorter warps; $QSA_ATTN_DEC_WARP
   "1" or "2" to choose), else one.  Measured on the H200 (real shape, eager --profile, per QSA
   layer): one sequence 52.5 us through qsa_k_sparse_attn (24 blocks) -> 43.8 (34 blocks of 12
   warps; before the chunk's scores were summed at once and its softmax bookkeeping went
   lane-parallel a warp's split was the long pole: 59 -> 78 us, so this kernel started at 8
   sequences); 8 sequences 62.3 us (two heads per warp: 79.9); 32 sequences 167.7 (one per warp:
   179.2). */
#define QSA__ATTN_DEC_THREADS 384 /* qsa_k_sparse_attn_dec[_batch]'s __launch_bounds__ */
#define QSA__ATTN_DEC_PAIR_B 16
QSA_PRIV int qsa__attn_dec_splits(const qsa__cuda *g, int B, int nh, int nkv, int hd, int r, int topk, int split, int *hb,
                                  unsigned *threads) {
    if (g->attn_dec_off || !g->sc.gemv_part || r < 1 || topk < 1 || nkv < 1 || nh % nkv || (hd != 128 && hd != 256) ||
        split < 1 || split > 256)
        return 0;
    int nq = nh / nkv, want = g->attn_dec_heads > 0 ? g->attn_dec_heads : nq;
    *hb = 1;
    *threads = 32u;
    for (int d = 2; d <= want && d <= 16; d++) {
        int two = g->attn_dec_warp ? g->attn_dec_warp == 2 : B >= QSA__ATTN_DEC_PAIR_B;
        unsigned hw = d % 2 == 0 && two ? 2u : 1u, t = 32u * (unsigned)d / hw;
        if (nq % d == 0 && t <= QSA__ATTN_DEC_THREADS) {
            *hb = d;
            *threads = t;
        }
    }
    long long smax = ((long long)topk * r + r - 1 + split - 1) / split; /* ntok <= topk r + r - 1 */
    if ((long long)B * nh * smax * (hd + 2) * 4 > (long long)QSA__GEMV_PART_BYTES) return 0;
    return (int)smax;
}

/* The tensor-core sparse attention (qsa_k_sparse_attn_tc[_batch]: q and p as fp16 hi + lo on the mma,
   one arithmetic for prefill and decode): usable for this layer shape?  Then *smax is the grid's x for
   one query per sequence — every split its own block, merged by a qsa_k_sparse_attn_merge launch after
   it (the splits bounded by the indexer's budget and their partials within the GEMV scratch) — or 1 (a
   block runs all of a query's splits: prefill, and decode without an indexer).  The bits are the same
   either way. */
QSA_PRIV int qsa__attn_tc(const qsa__cuda *g, int B, int nh, int nkv, int hd, int r, int topk, int split, int *smax) {
    *smax = 1;
    if (!g->attn_tc || nkv < 1 || nh % nkv || nh / nkv > 16 || (hd != 128 && hd != 256) || split != 128) return 0;
    long long sx = r >= 1 && topk >= 1 ? ((long long)topk * r + r - 1 + split - 1) / split : 0;
    if (B > 0 && sx > 1 && g->sc.gemv_part && (long long)B * QSA__ATTN_TC_PART(nkv, sx, hd) <= (long long)QSA__GEMV_PART_BYTES)
        *smax = (int)sx;
    return 1;
}

/* The merge after a split decode attention of T queries, positions pos[t] (pos 0: pos0 + t), smax splits
   per query in part: out / out16 [T][nh][hd].  frag 1: qsa_k_sparse_attn_tc[_batch]'s partials, merged by
   qsa_k_sparse_attn_merge_tc (a thread per partial value); 0: qsa_k_sparse_attn_dec[_batch]'s, by
   qsa_k_sparse_attn_merge (a thread per output element). */
QSA_PRIV qsa_result qsa__attn_merge(qsa__cuda *g, CUdeviceptr q, CUdeviceptr part, CUdeviceptr nsel, CUdeviceptr pos, int pos0,
                                    CUdeviceptr out, CUdeviceptr out16, int T, int nh, int nkv, int hd, int r, int split,
                                    int smax, int frag) {
    if (frag)
        QSA__LAUNCH3(g, sparse_attn_merge_tc, nkv, T, hd / 8 + 4, 128, 0, &q, &part, &nsel, &pos, &pos0, &out,
                     &out16, &nh, &nkv, &hd, &r, &split, &smax);
    else
        QSA__LAUNCH(g, sparse_attn_merge, nh, T, hd, 0, &q, &part, &nsel, &pos, &pos0, &out, &out16, &nh, &nkv, &hd, &r,
                    &split, &smax);
    return QSA_OK;
}

/* The tensor-core attention of T queries (batch 0: qsa_k_sparse_attn_tc, one sequence's chunk; 1:
   qsa_k_sparse_attn_tc_batch, a query per sequence) with its arguments, grid tx x nkv x T, and when split
   (part: tx splits per query) its merge (qsa__attn_merge, frag 1).  The split form and its merge launch
   plainly, not as programmatic dependents.  Batch 1 on an H100 (s91; kernel timelines of 4 layers, the
   real shape's rows): as dependents, the attention took 24.8 us after the indexer's top-k at ctx 16 (a
   20-token query: one working block per KV head) against 9.2 us plainly and 10.5 at ctx 8,192; the merge as
   a dependent of a plain attention 5.7 us against 3.0 plainly.  Real shape, two rounds, through a build
   that launched these two plainly by name: ctx 16 147.2 -> 151.0 tok/s, the ctx 8,192 rows within 0.3%.  s92
   (H100, real shape, two rounds against 28fd14f, which launched both as dependents; the same bits): batch 1 at
   ctx 16 +1.9 to +3.2%, the chunked forward's one-token split (TP decode; cuda_batch_decode off) 128.8 ->
   129.8 tok/s there; batch 4 at ctx 16 +0.8 to +1.7%; at ctx 8,192 batches 1 and 4 within about 1%; batch 32
   on 12 layers -0.6 to +2.9% (a round in each of two calls). */
QSA_PRIV qsa_result qsa__attn_tc_run(qsa__cuda *g, int batch, void **args, int tx, int T, CUdeviceptr part, CUdeviceptr q,
                                     CUdeviceptr nsel, CUdeviceptr pos, int pos0, CUdeviceptr out, CUdeviceptr out16,
                                     int nh, int nkv, int hd, int r, int split) {
    int pdl = g->pdl;
    g->pdl = part ? 0 : pdl;
    qsa_result rr = qsa__cu_launch_ex(g->k[batch ? QSA__K_sparse_attn_tc_batch : QSA__K_sparse_attn_tc],
                                      batch ? "qsa_k_sparse_attn_tc_batch" : "qsa_k_sparse_attn_tc", (unsigned)tx,
                                      (unsigned)nkv, (unsigned)T, 128, 1, 1, QSA__ATTN_TC_SMEM, g->stream, args, g->pdl);
    if (rr == QSA_OK && part)
        rr = qsa__attn_merge(g, q, part, nsel, pos, pos0, out, out16, T, nh, nkv, hd, r, split, tx, 1);
    g->pdl = pdl;
    return rr;
}

/* The grid's y of qsa_k_block_scores[_batch] for `rows` decode queries of up to maxb block keys: a
   block of 256 threads per $QSA_SCORE_KEYS (default QSA__SCORE_KEYS) keys, but no more blocks than
   about one wave in all (8 per SM: the warps loop over the blocks; the scores are the same).  On the
   H200, one query, eager, per launch: at context 262,063 27.1 us with a block per 256 keys (3 blocks of
   256 threads per SM at 80 registers), 25.3 with 4 per SM (64 registers), 21.7 at 128 keys, 21.8 at 64,
   21.0 at 32 (the wave: 1,056 blocks); at 8,192 (2,048 keys) 22.2 with a block per 256 keys at 80
   registers, 13.4 at 128, 9.9 at 64, 7.9 at 32. */
QSA_PRIV unsigned qsa__score_ys(const qsa__cuda *g, int rows, int maxb) {
    long long ys = ((long long)maxb + g->score_keys - 1) / g->score_keys, wave = (8LL * g->sm_count + rows - 1) / rows;
    if (ys > wave && wave >= 1) ys = wave;
    return (unsigned)(ys < 1 ? 1 : ys);
}

/* Query heads per sparse-attention block: 2 for prefill when the kernel supports it (hd 128 or 256,
   pairs of heads on one KV head), so each pair reads K and V once; 1 for few queries, where the
   blocks would otherwise not fill the GPU.  The bits do not depend on it. */
QSA_PRIV int qsa__attn_heads(int M, int nh, int nkv, int hd) {
    return M > 64 && (hd == 128 || hd == 256) && nkv > 0 && nh % nkv == 0 && (nh / nkv) % 2 == 0 ? 2 : 1;
}

/* Blocks along H for the per-token element-wise kernels (grid (M, Y)): enough to fill the GPU when M
   is small, one when M alone does. */
QSA_PRIV unsigned qsa__ygrid(int M, int H) {
    int y = M >= 64 ? 1 : (H + 255) / 256;
    return (unsigned)(y < 1 ? 1 : y);
}

/* Whether qsa__dgemm takes the cross-warp form (qsa_k_gemv_*: every (16 x 16 tile, K segment) task
   on its own warp, the partial tiles summed in the canonical order by the warp that completes a
   tile) instead of one block per tile (qsa_k_gemm_*, 8 warps over the segments, idle when K has
   fewer than 8).  Both give the same bits; the cross-warp form for M <= 64 within its scratch. */
QSA_PRIV int qsa__gemv_xwarp(const qsa__cuda *g, int M, int N, int K) {
    if (M > 64 || K <= 0 || !g->sc.gemv_part) return 0; /* (no scratch yet: tools measuring bare GEMMs) */
    long long tiles = (long long)((M + 15) / 16) * ((N + 15) / 16);
    int nseg = (K + 255) / 256, prow = M < 16 ? M : 16;
    return tiles <= QSA__GEMV_TILES && (size_t)(tiles * nseg * prow * 64) <= g->sc.gemv_limit;
}

/* qsa_k_gemv_f16_group's and qsa_k_gemv_blk's parameter (kernels.cu: struct qsa_gemv_group, the same
   layout) */
#define QSA__GEMV_GROUP 4
typedef struct qsa__gemv_member {
    CUdeviceptr W, bias, Y, Y16;
    int N;
    float act_scale;
} qsa__gemv_member;
typedef struct qsa__gemv_group {
    qsa__gemv_member m[QSA__GEMV_GROUP];
    int n;
} qsa__gemv_group;

/* The launch parameter of n (<= QSA__GEMV_GROUP) dense projections w[i] into Y[i] (Y16, scale: NULL or
   per member). */
QSA_PRIV void qsa__gemv_group_fill(qsa__gemv_group *grp, int n, const qsa__dlin *const *w, const CUdeviceptr *Y,
                                   const CUdeviceptr *Y16, const float *scale) {
    memset(grp, 0, sizeof *grp);
    grp->n = n;
    for (int i = 0; i < n; i++) {
        grp->m[i].W = w[i]->w16;
        grp->m[i].bias = w[i]->bias;
        grp->m[i].Y = Y[i];
        grp->m[i].Y16 = Y16 ? Y16[i] : 0;
        grp->m[i].N = w[i]->out;
        grp->m[i].act_scale = scale ? scale[i] : 0.0f;
    }
}

/* The dense cross-warp GEMVs of M rows and K over members with outputs N[i] and weights W[i] (A16
   the input) in the block form, qsa_k_gemv_blk: its groups (4 column tiles x one row tile x one
   segment), or 0 where it does not apply (kernels.cu: qsa_gemv_blockwise, the same test: a module
   for sm_80+, up to 64 rows, K a multiple of 8, A and every W 16-byte aligned; and at least
   gemv_blk_min_m rows) and the per-warp kernels (qsa_k_gemv_f16, _group, _gres) take them.  Its grid:
   at most gemv_blocks_per_sm blocks per SM (qsa__gemv_blk_grid), each looping over groups with its
   copies double-buffered.  (From one row since the twenty-first session: on the H200, real shape, with
   graphs, against the per-warp swapped form for 1-4 rows, B=1 123.5 / 122.9 -> 127.3 / 127.7 tok/s,
   B=2 195.1 / 194.7 -> 200.4 / 200.6, B=4 311.2 / 312.5 -> 317.0 / 319.2; the same bits, tested.) */
QSA_PRIV long long qsa__gemv_groups(const qsa__cuda *g, CUdeviceptr A16, int M, int K, int n, const int *N,
                                    const CUdeviceptr *W) {
    if (g->arch_num < 80 || M < g->gemv_blk_min_m || M > 64 || K <= 0 || K % 8 || A16 % 16 || !g->gemv_blk_fit[0])
        return 0;
    long long groups = 0;
    for (int i = 0; i < n; i++) {
        if (W[i] % 16) return 0;
        long long col_groups = ((N[i] + 15) / 16 + QSA__GEMV_WARPS - 1) / QSA__GEMV_WARPS;
        groups += (long long)((M + 15) / 16) * col_groups * ((K + 255) / 256);
    }
    return groups;
}
/* The row tiles per split group of a block-form launch of M rows: 2 (qsa_k_gemv_blk32, each weight
   fragment loaded once for both) from 17 rows on where its shared memory was granted, else 1.  Whole-K
   groups keep 1.  (Measured on the H200, real shape, batch 32, graphs, per launch: the out projections
   19.3 -> 15.4 us with 2, the HC down and router groups unchanged; whole-K groups with 2, the HC up
   projection's 320 groups halved, 9.7 -> 12.3 us.) */
QSA_PRIV int qsa__gemv_rp(const qsa__cuda *g, int M) { return M > 16 && g->gemv_blk_fit[1] ? 2 : 1; }
/* at most gemv_blocks_per_sm blocks per SM, and no more than fit one (QSA__GB_SMEM(rp) bytes each) */
QSA_PRIV unsigned qsa__gemv_blk_grid(const qsa__cuda *g, int rp, long long groups) {
    int per = g->gemv_blocks_per_sm, fit = g->gemv_blk_fit[rp - 1];
    long long cap = (long long)(fit > 0 && fit < per ? fit : per) * (g->sm_count > 0 ? g->sm_count : 1);
    return (unsigned)(groups < cap ? groups : cap);
}
/* The output elements qsa_k_gemv_fold folds for grp's members over M rows (with xn: its groups of hc
   columns), a thread each: its grid is this over its block size, rounded up. */
QSA_PRIV long long qsa__gemv_fold_items(const qsa__gemv_group *grp, int M, CUdeviceptr xn, int hc) {
    long long items = 0;
    for (int i = 0; i < grp->n; i++)
        items += (long long)((M + 15) / 16) * ((grp->m[i].N + 15) / 16) * (M < 16 ? M : 16) * (xn ? 16 / hc : 16);
    return items;
}
/* qsa_k_gemv_blk over A16 for grp's members (accumulate, and the mix of qsa_k_gemv_gres with xn and
   hc) where the block form applies (qsa__gemv_groups); *launched says whether it did.  K of at most
   gemv_whole_segs segments (or gemv_force_whole), or a launch with at least gemv_whole_min_groups
   whole-K groups (one per SM), takes whole-K groups, qsa_k_gemv_blk_whole (each warp folds its tile's
   segments in registers; no partial tiles, no tickets; the same bits).  (The second rule: on the
   H200, real shape, the GDN input group's 258 groups and attention q/k/v's 208 at K = 2,560 and the
   lm_head's; B=1 134.8 / 134.1 -> 136.6 / 137.3 tok/s, B=8 +graphs 501.4 / 497.9 -> 508.5 / 507.8;
   the lm_head alone: no change.)  Split groups of gemv_fold_min_m rows or more take no tickets: the
   partial tiles, then qsa_k_gemv_fold (a thread per output element; the same bits). */
QSA_PRIV qsa_result qsa__gemv_blk(qsa__cuda *g, CUdeviceptr A16, int M, int K, qsa__gemv_group *grp, int acc,
                                  CUdeviceptr xn, int hc, int *launched) {
    int Ns[QSA__GEMV_GROUP];
    CUdeviceptr Ws[QSA__GEMV_GROUP];
    for (int i = 0; i < grp->n; i++) {
        Ns[i] = grp->m[i].N;
        Ws[i] = grp->m[i].W;
    }
    long long groups = qsa__gemv_groups(g, A16, M, K, grp->n, Ns, Ws);
    *launched = groups > 0;
    if (!groups) return QSA_OK;
    int nseg = (K + 255) / 256;
    CUdeviceptr part = g->sc.gemv_part, cnt = g->sc.gemv_count;
    if (g->gemv_force_whole || nseg <= g->gemv_whole_segs ||
        (g->gemv_whole_min_groups > 0 && groups / nseg >= g->gemv_whole_min_groups)) {
        QSA__LAUNCH(g, gemv_blk_whole, qsa__gemv_blk_grid(g, 1, groups / nseg), 1, 32 * QSA__GEMV_WARPS,
                    QSA__GB_SMEM(1), &A16, grp, &M, &K, &acc, &part, &cnt, &xn, &hc);
        return QSA_OK;
    }
    /* split groups (of 32 rows: half as many), tickets below gemv_fold_min_m rows, else none (the partial
       tiles, then their folds in a launch of their own) */
    int rp = qsa__gemv_rp(g, M);
    long long rgroups = rp == 2 ? groups / ((M + 15) / 16) * ((M + 31) / 32) : groups;
    CUdeviceptr tickets = M < g->gemv_fold_min_m ? cnt : 0;
    void *args[] = {&A16, grp, &M, &K, &acc, &part, &tickets, &xn, &hc};
    QSA__TRY(qsa__cu_launch_ex(g->k[rp == 2 ? QSA__K_gemv_blk32 : QSA__K_gemv_blk],
                               rp == 2 ? "qsa_k_gemv_blk32" : "qsa_k_gemv_blk", qsa__gemv_blk_grid(g, rp, rgroups), 1,
                               1, 32 * QSA__GEMV_WARPS, 1, 1, QSA__GB_SMEM(rp), g->stream, args, g->pdl));
    if (!tickets) {
        long long items = qsa__gemv_fold_items(grp, M, xn, hc);
        QSA__LAUNCH(g, gemv_fold, (unsigned)((items + 255) / 256), 1, 256, 0, grp, &M, &K, &acc, &part, &xn, &hc);
    }
    return QSA_OK;
}

/* Whether the routed-expert GEMMs of MK pairs (16-pair tiles) take the cross-warp kernels
   (qsa_k_moe_*_xw[k], decode-sized steps): the tickets and pair-indexed partials of the forms they
   take (qsa__xw_whole: the whole gate/up form keeps one partial tile per pair and column tile, the
   whole down form none and no tickets) must fit the cross-warp GEMV's scratch.  Same bits as the
   one-block kernels either way. */
QSA_PRIV int qsa__xw_whole(const qsa__cuda *g, long long tiles);
QSA_PRIV int qsa__moe_xwarp(const qsa__cuda *g, int MK, int max_tiles, int H, int I) {
    if (!g->sc.gemv_part || H <= 0 || I <= 0 || (H & 15) || (I & 15)) return 0;
    long long t1 = (long long)max_tiles * (I / 16), t2 = (long long)max_tiles * (H / 16);
    int whole1 = qsa__xw_whole(g, t1), whole2 = qsa__xw_whole(g, t2);
    long long parts_gu = (long long)MK * (I / 16) * (whole1 ? 1 : (H + 255) / 256) * 2 * 16,
              parts_d = whole2 ? 0 : (long long)MK * (H / 16) * ((I + 255) / 256) * 16, tickets = whole2 ? t1 : (t1 > t2 ? t1 : t2);
    return tickets <= QSA__GEMV_TILES && (size_t)((parts_gu > parts_d ? parts_gu : parts_d) * 4) <= QSA__GEMV_PART_BYTES;
}

/* Pairs per tile of the routed-expert plan for MK (token, expert) pairs over E experts: 64 or 16. */
QSA_PRIV int qsa__moe_tr(const qsa__cuda *g, int MK, int E) {
    return (long long)MK >= (long long)(g->moe64_pairs > 0 ? g->moe64_pairs : QSA__MOE64_PAIRS) * E ? 64 : 16;
}
/* Whether the whole expert tiles take the lean kernels (qsa_k_moe_*_xwn: every tile through the direct
   fold, 6 blocks per SM where qsa_k_moe_*_xwk fit 5): an sm_80+ module, NVFP4 experts (all of a layer's
   are, or the upload fails), H and I multiples of 64 (with the 256-byte alignment of every device
   allocation, the 16-byte rows those kernels read).  The same bits either way. */
QSA_PRIV int qsa__moe_lean(const qsa__cuda *g, const qsa__dlayer *d, int H, int I) {
    return g->moe_lean && g->arch_num >= 80 && d->experts_nvfp4 && H > 0 && I > 0 && H % 64 == 0 && I % 64 == 0;
}
QSA_PRIV int qsa__xw_whole(const qsa__cuda *g, long long tiles) {
    return tiles >= (long long)g->xw_whole_per_sm * (g->sm_count > 0 ? g->sm_count : 1);
}
/* Tasks per warp of a lean expert launch (m: 0 gate/up, 1 down) of `tasks` tasks: the configured count,
   halved while the warps would number fewer than QSA__LEAN_MIN_WARPS per SM (batch 1's down projection:
   1,760 tasks at the real shape) */
QSA_PRIV int qsa__lean_tasks(const qsa__cuda *g, int m, long long tasks) {
    int t = g->lean_tasks[m];
    while (t > 1 && tasks / t < (long long)QSA__LEAN_MIN_WARPS * (g->sm_count > 0 ? g->sm_count : 1)) t /= 2;
    return t;
}
/* The segment ranges per task of the split expert kernels for `tasks` (tile, column tile, matrix)
   triples of nseg segments each: the fewest that give xw_range_per_sm warps per SM, at most nseg
   (nseg: one segment per warp, the split form itself). */
QSA_PRIV int qsa__xw_ranges(const qsa__cuda *g, long long tasks, int nseg) {
    long long want = (long long)(g->xw_range_per_sm > 0 ? g->xw_range_per_sm : QSA__XW_RANGE_PER_SM) *
                     (g->sm_count > 0 ? g->sm_count : 1);
    long long r = tasks > 0 ? (want + tasks - 1) / tasks : nseg;
    return r < 1 ? 1 : r > nseg ? nseg : (int)r;
}

/* Whether dense projections of M <= 64 rows (a decode batch) with t64 tiles of 64 x 64 in all take
   the tiled group kernel (qsa_k_gemm_f16_group: each weight row read once for the batch) instead of
   the cross-warp GEMV (once per 16 rows).  The same bits either way. */
QSA_PRIV int qsa__tiled_small(const qsa__cuda *g, int M, long long t64) {
    long long min_tiles = g->tiled_min_tiles > 0 ? g->tiled_min_tiles : (g->sm_count > 0 ? g->sm_count : 1);
    return M >= g->tiled_min_m && M <= 64 && t64 >= min_tiles;
}

/* Y = silu(Y * scale) and Y16 its fp16 copy, n elements (qsa_k_silu_scale) */
QSA_PRIV qsa_result qsa__dsilu_store(qsa__cuda *g, CUdeviceptr Y, CUdeviceptr Y16, int n, float scale) {
    QSA__LAUNCH(g, silu_scale, (n + 255) / 256, 1, 256, 0, &Y, &Y16, &n, &scale);
    return QSA_OK;
}

/* Y[M][out] (+)= A16[M][in] W^T (+ bias); with Y16 != 0 (and no accumulate) then Y = silu(Y * scale)
   and Y16 its fp16 copy: fused into the cross-warp GEMV's store, else a qsa_k_silu_scale launch
   (the same bits either way). */
QSA_PRIV qsa_result qsa__dgemm_tiled(qsa__cuda *g, CUdeviceptr A16, int M, int n, const qsa__dlin *const *w,
                                     const CUdeviceptr *Y, const CUdeviceptr *Y16, const float *scale);

QSA_PRIV qsa_result qsa__dgemm_ex(qsa__cuda *g, CUdeviceptr A16, int M, const qsa__dlin *w, CUdeviceptr Y, int accumulate,
                                  CUdeviceptr Y16, float scale) {
    int N = w->out, K = w->in;
    if (w->w16 && !accumulate && K > 0 && qsa__tiled_small(g, M, (N + 63) / 64))
        return qsa__dgemm_tiled(g, A16, M, 1, &w, &Y, &Y16, &scale);
    if (qsa__gemv_xwarp(g, M, N, K)) {
        long long tasks = (long long)((M + 15) / 16) * ((N + 15) / 16) * ((K + 255) / 256);
        unsigned gx = (unsigned)((tasks + QSA__GEMV_WARPS - 1) / QSA__GEMV_WARPS), bx = 32 * QSA__GEMV_WARPS;
        CUdeviceptr part = g->sc.gemv_part, cnt = g->sc.gemv_count;
        if (w->w16) {
            CUdeviceptr W = w->w16, B = w->bias;
            qsa__gemv_group grp;
            int done = 0;
            qsa__gemv_group_fill(&grp, 1, &w, &Y, &Y16, &scale);
            QSA__TRY(qsa__gemv_blk(g, A16, M, K, &grp, accumulate, 0, 0, &done));
            if (done) return QSA_OK;
            QSA__LAUNCH(g, gemv_f16, gx, 1, bx, 0, &A16, &W, &B, &Y, &M, &N, &K, &accumulate, &part, &cnt, &Y16, &scale);
        } else {
            CUdeviceptr q = w->q, s = w->s;
            float s2 = w->s2;
            QSA__LAUNCH(g, gemv_nvfp4, gx, 1, bx, 0, &A16, &q, &s, &s2, &Y, &M, &N, &K, &accumulate, &part, &cnt, &Y16,
                        &scale);
        }
        return QSA_OK;
    }
    /* Dense, M <= 64, but more partial tiles than the scratch holds (lm_head for a batch: 15,520
       column tiles): the cross-warp GEMV on slices of columns that fit, each into gemv_slice and
       copied (2D) into its columns of Y.  Each tile is computed as in one launch: the same bits. */
    if (w->w16 && !accumulate && !Y16 && M <= 64 && K > 0 && g->sc.gemv_part) {
        long long mt = (M + 15) / 16, per = (long long)((K + 255) / 256) * (M < 16 ? M : 16) * 64;
        long long ct = (long long)(g->sc.gemv_limit / (size_t)per) / mt; /* column tiles per slice */
        if (ct > QSA__GEMV_TILES / mt) ct = QSA__GEMV_TILES / mt;
        int cols = ct >= (N + 15) / 16 ? N : (int)ct * 16;
        if (ct >= 1 && cols < N) { /* (a slice's output, M * cols floats, is at most gemv_limit bytes) */
            if (!g->sc.gemv_slice)
                QSA__TRY(qsa__dalloc(g, &g->sc.gemv_slice, QSA__GEMV_PART_BYTES, &g->bytes_scratch, "GEMV slices"));
            g->sc.n_sliced++;
            for (int n0 = 0; n0 < N; n0 += cols) {
                qsa__dlin ws = qsa__dlin_rows(w, n0, N - n0 < cols ? N - n0 : cols);
                QSA__TRY(qsa__dgemm_ex(g, A16, M, &ws, g->sc.gemv_slice, 0, 0, 0.0f));
                qsa__cu_memcpy2d cp;
                memset(&cp, 0, sizeof cp);
                cp.src_type = cp.dst_type = 2;
                cp.src_dev = g->sc.gemv_slice;
                cp.src_pitch = (size_t)ws.out * 4;
                cp.dst_dev = Y + (size_t)n0 * 4;
                cp.dst_pitch = (size_t)N * 4;
                cp.width = (size_t)ws.out * 4;
                cp.height = (size_t)M;
                QSA__CU(qsa__cu.cuMemcpy2DAsync_v2(&cp, g->stream));
            }
            return QSA_OK;
        }
    }
    /* 16x16 split-K tiles for small M, 64x64 tiles otherwise: the same bits either way */
    unsigned gx = M <= 64 ? (unsigned)(((M + 15) / 16) * ((N + 15) / 16)) : (unsigned)(((M + 63) / 64) * ((N + 63) / 64));
    if (w->w16) {
        CUdeviceptr W = w->w16, B = w->bias;
        QSA__LAUNCH(g, gemm_f16, gx, 1, 256, 0, &A16, &W, &B, &Y, &M, &N, &K, &accumulate);
    } else {
        CUdeviceptr q = w->q, s = w->s;
        float s2 = w->s2;
        QSA__LAUNCH(g, gemm_nvfp4, gx, 1, 256, 0, &A16, &q, &s, &s2, &Y, &M, &N, &K, &accumulate);
    }
    return Y16 ? qsa__dsilu_store(g, Y, Y16, M * N, scale) : QSA_OK;
}

QSA_PRIV qsa_result qsa__dgemm(qsa__cuda *g, CUdeviceptr A16, int M, const qsa__dlin *w, CUdeviceptr Y, int accumulate) {
    return qsa__dgemm_ex(g, A16, M, w, Y, accumulate, 0, 0.0f);
}

/* qsa__dgemm of M rows through w (no accumulation) on the side stream, where the launch it takes
   uses none of the GEMV scratch (part, count) that the stream's kernels use meanwhile: the tiled
   GEMM, or the block form with whole-K groups (forced: the same bits).  Returns 0 (launches
   nothing) where neither applies. */
QSA_PRIV int qsa__dgemm_side_ok(const qsa__cuda *g, CUdeviceptr A16, int M, const qsa__dlin *w) {
    int N = w->out, K = w->in;
    CUdeviceptr W = w->w16;
    if (!g->side || !W || K <= 0) return 0;
    if (qsa__tiled_small(g, M, (N + 63) / 64)) return 1;
    return qsa__gemv_xwarp(g, M, N, K) && qsa__gemv_groups(g, A16, M, K, 1, &N, &W) > 0;
}
QSA_PRIV qsa_result qsa__dgemm_side(qsa__cuda *g, CUdeviceptr A16, int M, const qsa__dlin *w, CUdeviceptr Y) {
    QSA__TRY(QSA__CU_R(qsa__cu.cuEventRecord(g->side_fork, g->stream)));
    QSA__TRY(QSA__CU_R(qsa__cu.cuStreamWaitEvent(g->side, g->side_fork, 0)));
    CUstream chain = g->stream;
    int pdl = g->pdl;
    g->stream = g->side; /* (its first launch waits on the fork: a plain dependency, no PDL) */
    g->pdl = 0;
    g->gemv_force_whole = 1;
    qsa_result r = qsa__dgemm(g, A16, M, w, Y, 0);
    g->stream = chain;
    g->pdl = pdl;
    g->gemv_force_whole = 0;
    QSA__TRY(r);
    g->side_launches++;
    return QSA__CU_R(qsa__cu.cuEventRecord(g->side_join, g->side));
}

/* Y[i] = A16 w[i]^T (+ bias; Y16[i] != 0: the silu store of qsa__dgemm_ex with scale[i]) for n
   projections of one input (at most QSA__GEMV_GROUP): one qsa_k_gemv_f16_group launch when all are
   FP16 of the same K and the cross-warp form takes M, else one qsa__dgemm_ex each.  Every Y gets
   the bits of its own launch either way; only the number of launches differs (decode: one instead
   of n, each small GEMV costing about one warp's task of latency). */
QSA_PRIV qsa_result qsa__dgemm_group(qsa__cuda *g, CUdeviceptr A16, int M, int n, const qsa__dlin *const *w,
                                     const CUdeviceptr *Y, const CUdeviceptr *Y16, const float *scale) {
    int K = w[0]->in, nseg = (K + 255) / 256, prow = M < 16 ? M : 16, ok = n > 1 && n <= QSA__GEMV_GROUP;
    long long tiles = 0;
    for (int i = 0; i < n && ok; i++) {
        ok = w[i]->w16 && w[i]->in == K && qsa__gemv_xwarp(g, M, w[i]->out, K);
        tiles += (long long)((M + 15) / 16) * ((w[i]->out + 15) / 16);
    }
    /* M > 64 (kernels.cu's QSA_SPLITK_MAX_M: prefill), or a decode batch and wide members
       (qsa__tiled_small): the members' 64 x 64 tiles in one launch when all are dense */
    long long t64 = 0;
    int tiled = n > 1 && n <= QSA__GEMV_GROUP && K > 0;
    for (int i = 0; i < n && tiled; i++) {
        tiled = w[i]->w16 && w[i]->in == K;
        t64 += (long long)((M + 63) / 64) * ((w[i]->out + 63) / 64);
    }
    if (tiled && (M > 64 || qsa__tiled_small(g, M, t64))) return qsa__dgemm_tiled(g, A16, M, n, w, Y, Y16, scale);
    if (!ok || tiles > QSA__GEMV_TILES || (size_t)(tiles * nseg * prow * 64) > g->sc.gemv_limit) {
        for (int i = 0; i < n; i++) QSA__TRY(qsa__dgemm_ex(g, A16, M, w[i], Y[i], 0, Y16 ? Y16[i] : 0, scale ? scale[i] : 0.0f));
        return QSA_OK;
    }
    qsa__gemv_group grp;
    int done = 0;
    qsa__gemv_group_fill(&grp, n, w, Y, Y16, scale);
    QSA__TRY(qsa__gemv_blk(g, A16, M, K, &grp, 0, 0, 0, &done));
    if (done) return QSA_OK;
    unsigned bx = 32 * QSA__GEMV_WARPS;
    CUdeviceptr part = g->sc.gemv_part, cnt = g->sc.gemv_count;
    long long tasks = tiles * nseg;
    QSA__LAUNCH(g, gemv_f16_group, (unsigned)((tasks + QSA__GEMV_WARPS - 1) / QSA__GEMV_WARPS), 1, bx, 0, &A16, &grp, &M,
                &K, &part, &cnt);
    return QSA_OK;
}

/* The n (<= QSA__GEMV_GROUP) dense projections w[i] of one input, all of K = w[0]->in, through the
   64 x 64 tiles of one qsa_k_gemm_f16_group launch; Y16[i] != 0: the silu store of qsa__dgemm_ex
   after it (a qsa_k_silu_scale launch).  Any M >= 1: the bits of qsa__dgemm_ex's launch. */
QSA_PRIV qsa_result qsa__dgemm_tiled(qsa__cuda *g, CUdeviceptr A16, int M, int n, const qsa__dlin *const *w,
                                     const CUdeviceptr *Y, const CUdeviceptr *Y16, const float *scale) {
    int K = w[0]->in;
    long long t64 = 0;
    qsa__gemv_group grp;
    qsa__gemv_group_fill(&grp, n, w, Y, Y16, scale); /* (the tiled kernel ignores Y16 and act_scale) */
    int deep = g->deep_stages[0] > 0 && M <= 32 && K % 8 == 0 && A16 % 16 == 0;
    long long wide = 0; /* the groups of 8-warp blocks (128 columns) */
    for (int i = 0; i < n; i++) {
        t64 += (long long)((M + 63) / 64) * ((w[i]->out + 63) / 64);
        wide += (w[i]->out + 127) / 128;
        deep = deep && w[i]->w16 % 16 == 0;
    }
    if (deep) { /* a block per group of 16 nw / kh columns of a member */
        int nw = g->deep_warps ? g->deep_warps : wide >= (long long)QSA__DEEP_WIDE_PER_SM * g->sm_count ? 8 : 4;
        if (!g->deep_stages[nw / 8]) nw = 4;
        /* (kh = 2 from two 256-k segments on) */
        int kh = nw == 4 && !g->deep_warps && K > 256 && g->deep_stages[2] ? 2 : 1, at = kh == 2 ? 2 : nw / 8;
        int stages = g->deep_stages[at];
        long long groups = nw == 8 && kh == 1 ? wide : t64; /* (M <= 32: a 64 x 64 tile per group of 64 columns) */
        if (kh == 2) nw = 8;
        unsigned sh = (unsigned)(stages * QSA__DEEP_STAGE_BYTES(nw, kh) + (kh - 1) * QSA__DEEP_X_BYTES(nw / kh));
        QSA__LAUNCH(g, gemv_deep, (unsigned)groups, 1, 32 * nw, sh, &A16, &grp, &M, &K, &stages, &kh);
    } else {
        QSA__LAUNCH(g, gemm_f16_group, (unsigned)t64, 1, 256, 0, &A16, &grp, &M, &K);
    }
    for (int i = 0; i < n; i++)
        if (Y16 && Y16[i]) QSA__TRY(qsa__dsilu_store(g, Y[i], Y16[i], M * w[i]->out, scale ? scale[i] : 0.0f));
    return QSA_OK;
}

/* GatedResidual on X [M][hcH]: inp/inp16 [M][H] and (with_inj) the raw injection projection inj [M][hc]
   (qsa_k_inject turns it into the weights 2 * sigmoid(inj / hc)). */
QSA_PRIV qsa_result qsa__cuda_gres(qsa_model *m, const qsa__dgres *w, CUdeviceptr X, int M, int with_inj, int normed) {
    const qsa_model_config *c = &m->cfg;
    qsa__cuda *g = m->cuda;
    qsa__dscratch *s = &g->sc;
    int H = c->hidden_size, hc = c->hc_count, hcH = hc * H, one = 1;
    float eps = c->rms_norm_eps, scale = 1.0f / (float)hc;
    CUdeviceptr nw = w->norm_w;
    if (!normed) /* (normed: xn / xn16 came with the previous injection, qsa__cuda_inject) */
        QSA__LAUNCH(g, rmsnorm, M * hc, 1, 256, 0, &X, &nw, &s->xn, &s->xn16, &hcH, &H, &eps, &one);
    /* low = silu(down / hc) and, with the injection, its raw projection (qsa_k_inject takes
       2 * sigmoid(inj / hc) itself) */
    const qsa__dlin *ws[2] = {&w->down, &w->inject};
    CUdeviceptr ys[2] = {s->low, s->inj}, y16[2] = {s->low16, 0};
    float sc[2] = {scale, 0.0f};
    QSA__TRY(qsa__dgemm_group(g, s->xn16, M, with_inj ? 2 : 1, ws, ys, y16, sc));
    /* up (rows interleaved by stream, qsa__dlin_up_hc) and the mix: one launch for decode-sized M */
    int N = w->up.out, K = w->up.in;
    if (w->up.w16 && hc >= 1 && 16 % hc == 0 && N == hcH && qsa__gemv_xwarp(g, M, N, K)) {
        CUdeviceptr W = w->up.w16, B = w->up.bias, part = s->gemv_part, cnt = s->gemv_count, y16 = s->inp16;
        qsa__gemv_group grp;
        const qsa__dlin *up = &w->up;
        int done = 0;
        qsa__gemv_group_fill(&grp, 1, &up, &s->inp, &y16, NULL);
        QSA__TRY(qsa__gemv_blk(g, s->low16, M, K, &grp, 0, s->xn, hc, &done));
        if (done) return QSA_OK;
        long long tasks = (long long)((M + 15) / 16) * ((N + 15) / 16) * ((K + 255) / 256);
        QSA__LAUNCH(g, gemv_gres, (unsigned)((tasks + QSA__GEMV_WARPS - 1) / QSA__GEMV_WARPS), 1, 32 * QSA__GEMV_WARPS, 0,
                    &s->low16, &W, &B, &s->xn, &s->inp, &s->inp16, &M, &N, &K, &hc, &part, &cnt);
        return QSA_OK;
    }
    QSA__TRY(qsa__dgemm(g, s->low16, M, &w->up, s->mw, 0));
    QSA__LAUNCH(g, gres_mix, M, qsa__ygrid(M, H), 256, 0, &s->mw, &s->xn, &s->inp, &s->inp16, &H, &hc);
    return QSA_OK;
}

/* X's streams += the injection of sc.out; with `next` (the gated residual that follows directly,
   nothing in between touching X) also its norm into sc.xn / xn16 in the same launch, and that
   qsa__cuda_gres is then called with normed = 1.  Same bits either way. */
QSA_PRIV qsa_result qsa__cuda_inject(qsa_model *m, CUdeviceptr X, int M, const qsa__dgres *next) {
    qsa__cuda *g = m->cuda;
    QSA__INVARIANT(g != NULL);
    qsa__dscratch *s = &g->sc;
    int H = m->cfg.hidden_size, hc = m->cfg.hc_count;
    if (next) {
        CUdeviceptr nw = next->norm_w;
        float eps = m->cfg.rms_norm_eps;
        QSA__LAUNCH(g, inject_rmsnorm, M * hc, 1, 256, 0, &X, &s->inj, &s->out, &nw, &s->xn, &s->xn16, &H, &hc, &eps);
        return QSA_OK;
    }
    QSA__LAUNCH(g, inject, M, qsa__ygrid(M, H), 256, 0, &X, &s->inj, &s->out, &H, &hc);
    return QSA_OK;
}

/* The gated residual that follows layer l's MoE injection: layer l + 1's attention residual unless
   a PLE layer updates X in between (NULL: inject alone), else the final one. */
QSA_PRIV const qsa__dgres *qsa__cuda_next_gres(const qsa_model *m, int l) {
    const qsa__cuda *g = m->cuda;
    if (l + 1 == m->cfg.num_hidden_layers) return &g->final_hc;
    return m->layers[l + 1].ple ? NULL : &g->layers[l + 1].attn_hc;
}

/* PLE: host hashes the ids and gathers the table rows; the device does the rest. */
QSA_PRIV qsa_result qsa__cuda_ple(qsa_seq *sq, int l, const int32_t *ids, int M) {
    qsa_model *m = sq->m;
    const qsa_model_config *c = &m->cfg;
    qsa__cuda *g = m->cuda;
    qsa__dscratch *s = &g->sc;
    const qsa__ple_w *p = m->layers[l].ple;
    const qsa__dlayer *d = &g->layers[l];
    qsa__seq_layer *sl = &sq->L[l];
    int H = c->hidden_size, hc = c->hc_count, hcH = hc * H, D = c->ple_embed_dim;
    int ctx = c->ngram_size - 1, nheads = ctx * c->heads_per_ngram, hdim = D / nheads;
    int Kc = c->ple_conv_kernel_size, dil = c->ngram_size;
    float eps = c->rms_norm_eps;
    int32_t hist[32];
    (void)nheads; (void)hdim;
    for (int t = 0; t < M; t++) {
        /* the same history and hashing as the CPU reference (ngram_size <= 16: checked at load) */
        for (int j = 0; j < ctx; j++) hist[j] = t - ctx + j >= 0 ? ids[t - ctx + j] : sl->ple_ids[t + j];
        hist[ctx] = ids[t];
        if (m->tpr) qsa__tp_ple_embed(m, p, hist, s->host_e, t); /* TP: this rank's columns */
        else qsa__ple_embed(c, p, hist, s->host_e + (size_t)t * D);
    }
    for (int j = 0; j < ctx; j++) sl->ple_ids[j] = M - ctx + j >= 0 ? ids[M - ctx + j] : sl->ple_ids[M + j];
    CUdeviceptr e = s->big[0], e16 = s->big16[0], keyp = s->big[1], valp = s->big[2], gv = s->big[3], gvn = s->big[4];
    int n = M * D;
    if (m->tpr) QSA__TRY(qsa__tp_ple_rows(m, s->host_e, e, M)); /* TP: all-gather the columns */
    else QSA__CU(qsa__cu.cuMemcpyHtoDAsync_v2(e, s->host_e, (size_t)n * 4, g->stream));
    QSA__LAUNCH(g, to_f16, (n + 255) / 256, 1, 256, 0, &e, &e16, &n);
    QSA__TRY(qsa__dgemm(g, e16, M, &d->ple_key, keyp, 0));
    QSA__TRY(qsa__dgemm(g, e16, M, &d->ple_value, valp, 0));
    CUdeviceptr nk = d->ple_nk, nq = d->ple_nq, nc = d->ple_nc, cw = d->ple_conv_w, st = sq->cuda->ple_conv[l], X = s->X;
    QSA__LAUNCH(g, ple_gate, M, hc, 256, 0, &keyp, &X, &valp, &nk, &nq, &nc, &gv, &gvn, &H, &hc, &eps);
    QSA__LAUNCH(g, ple_conv, (hcH + 255) / 256, 1, 256, 0, &X, &gv, &gvn, &st, &cw, &M, &hcH, &Kc, &dil);
    return QSA_OK;
}

/* kernels.cu's qsa_gdn_gate_args (the same layout): the gates computed in the conv launch */
typedef struct qsa__gdn_gate_args {
    CUdeviceptr b, a, A_log, dt_bias, beta, g;
    int nv;
} qsa__gdn_gate_args;
/* kernels.cu's qsa_gdn_fuse (the same layout) */
typedef struct qsa__gdn_fuse {
    CUdeviceptr qkv, st, w, b, a, A_log, dt_bias;
    int conv_dim, Kc, act;
} qsa__gdn_fuse;
/* kernels.cu's qsa_gdn_shift (qsa_k_gdn_norm_gate's advance of the fused conv's q and k state rows) */
typedef struct qsa__gdn_shift {
    CUdeviceptr st, qkv;
    int conv_dim, Kc, kd2;
} qsa__gdn_shift;
#define QSA__GDN_KC 4 /* kernels.cu's QSA_GDN_KC */
/* Whether a decode step's GDN conv runs inside the batched recurrence's launch (kernels.cu's qsa_gdn_fuse):
   modules whose recurrence is k2_gdn_rec_dec (K2_GDN_SMEM there: compute_80, _87 and 90 up to 11x), dk <= 128,
   a conv of at most QSA__GDN_KC, the fp32 state, and 2 key_dim <= nv 128 (qsa_k_gdn_norm_gate advances the q and k
   channels' state, one per thread); $QSA_GDN_FUSE "0": never.  The same bits either way. */
QSA_PRIV int qsa__gdn_fused(const qsa_model *m) {
    const qsa__cuda *g = m->cuda;
    const qsa_model_config *c = &m->cfg;
    int a = g->arch_num, smem = a == 80 || a == 87 || (a >= 90 && a < 120);
    return g->gdn_fuse && smem && !m->params.gdn_state_f16 && c->linear_key_head_dim <= 128 &&
           c->linear_conv_kernel_dim >= 1 && c->linear_conv_kernel_dim <= QSA__GDN_KC &&
           2 * c->linear_num_key_heads * c->linear_key_head_dim <= c->linear_num_value_heads * 128;
}

/* The GDN recurrence kernels' launch: blocks of 128 threads, P = 4 (dk <= 128), 8 or 16 lanes per
   state column (kernels.cu), so a block covers 128 / P columns of a value head. */
#define QSA__GDN_REC_THREADS 128
QSA_PRIV unsigned qsa__gdn_rec_ny(int dk, int dv) {
    int P = dk <= 128 ? 4 : dk <= 256 ? 8 : 16, cpb = QSA__GDN_REC_THREADS / P;
    return (unsigned)((dv + cpb - 1) / cpb);
}

QSA_PRIV qsa_result qsa__cuda_gdn(qsa_seq *sq, int l, int M) {
    qsa_model *m = sq->m;
    const qsa_model_config *c = &m->cfg;
    qsa__cuda *g = m->cuda;
    qsa__dscratch *s = &g->sc;
    const qsa__dlayer *d = &g->layers[l];
    int nk = c->linear_num_key_heads, nv = c->linear_num_value_heads, dk = c->linear_key_head_dim, dv = c->linear_value_head_dim;
    int key_dim = nk * dk, value_dim = nv * dv, conv_dim = 2 * key_dim + value_dim, Kc = c->linear_conv_kernel_dim;
    int act = c->hidden_act == QSA_ACT_SIGMOID, gact = c->output_gate_act == QSA_ACT_SIGMOID;
    float eps = c->rms_norm_eps;
    CUdeviceptr qkv = s->big[0], z = s->big[1], q = s->big[2], k = s->big[3], v = s->big[4], o = s->big[5];
    CUdeviceptr b = s->out, a = s->mw, beta = s->low, gg = s->xn; /* small [M][nv] temporaries (qsa__cuda_init) */
    const qsa__dlin *ws[4] = {&d->in_qkv, &d->in_z, &d->in_b, &d->in_a};
    CUdeviceptr ys[4] = {qkv, z, b, a};
    QSA__TRY(qsa__dgemm_group(g, s->inp16, M, 4, ws, ys, NULL, NULL));
    /* the conv computes the gates too and, for one token, advances its own state */
    qsa__gdn_gate_args ga = {b, a, d->A_log, d->dt_bias, beta, gg, nv};
    CUdeviceptr cst = sq->cuda->conv[l], cw = d->conv_w;
    int upd = M == 1;
    QSA__LAUNCH(g, gdn_conv, M, 2 * nk + (value_dim + 255) / 256, 256, 0, &qkv, &cst, &cw, &q, &k, &v, &M, &conv_dim, &key_dim, &Kc, &act, &nk, &dk,
                &ga, &upd);
    if (!upd) QSA__LAUNCH(g, gdn_conv_state, (conv_dim + 255) / 256, 1, 256, 0, &qkv, &cst, &M, &conv_dim, &Kc);
    /* P lanes per state column, the column's rows in their registers (kernels.cu) */
    CUdeviceptr S = sq->cuda->S[l];
    unsigned ny = qsa__gdn_rec_ny(dk, dv), smem = 0;
    if (m->params.gdn_state_f16)
        QSA__LAUNCH(g, gdn_recurrent_f16state, nv, ny, QSA__GDN_REC_THREADS, smem, &S, &q, &k, &v, &beta, &gg, &o, &M, &nk, &nv, &dk, &dv);
    else
        QSA__LAUNCH(g, gdn_recurrent, nv, ny, QSA__GDN_REC_THREADS, smem, &S, &q, &k, &v, &beta, &gg, &o, &M, &nk, &nv, &dk, &dv);
    CUdeviceptr nw = d->gnorm_w, o16 = s->big16[0];
    qsa__gdn_shift nosh = {0, 0, 0, 0, 0}; /* (the conv advanced its state) */
    QSA__LAUNCH(g, gdn_norm_gate, M * nv, 1, 128, 0, &o, &z, &nw, &o16, &nv, &dv, &eps, &gact, &nosh);
    (void)value_dim;
    return qsa__dgemm(g, o16, M, &d->out, s->out, 0);
}

/* Hand the selections of the last chunk to the test/capture hook (synchronous; hooks only). */
QSA_PRIV qsa_result qsa__cuda_report_selections(qsa_seq *sq, int l, int M, int topk) {
    qsa__cuda *g = sq->m->cuda;
    int32_t *sel = QSA__ALLOC(int32_t, (size_t)M * topk + 1), *ns = QSA__ALLOC(int32_t, M);
    qsa_result r = QSA_OK;
    if (!sel || !ns) r = qsa__fail(QSA_ERR_OUT_OF_MEMORY, "selections: out of memory");
    if (r == QSA_OK) r = QSA__CU_R(qsa__cu.cuStreamSynchronize(g->stream));
    if (r == QSA_OK && topk) r = QSA__CU_R(qsa__cu.cuMemcpyDtoH_v2(sel, g->sc.sel, (size_t)M * topk * 4));
    if (r == QSA_OK) r = QSA__CU_R(qsa__cu.cuMemcpyDtoH_v2(ns, g->sc.nsel, (size_t)M * 4));
    for (int t = 0; r == QSA_OK && t < M; t++)
        sq->sel_hook(sq->sel_user, l, sq->pos + t, sel + (size_t)t * topk, ns[t], NULL, (sq->pos + t + 1) / sq->m->cfg.indexer_compress_ratio);
    qsa__free(sel);
    qsa__free(ns);
    return r;
}

QSA_PRIV qsa_result qsa__cuda_attn(qsa_seq *sq, int l, int M) {
    qsa_model *m = sq->m;
    const qsa_model_config *c = &m->cfg;
    qsa__cuda *g = m->cuda;
    qsa__dscratch *s = &g->sc;
    const qsa__dlayer *d = &g->layers[l];
    const qsa__pool *pool = &m->pool;
    qsa__seq_layer *sl = &sq->L[l];
    int nh = c->num_attention_heads, nkv = c->num_key_value_heads, hd = c->head_dim, rd = c->rotary_dim;
    int ih = c->indexer_n_heads, ihd = c->indexer_head_dim, r = c->has_qsa ? c->indexer_compress_ratio : 0;
    int topk = c->has_qsa ? c->indexer_budget / r : 0, ps = pool->page_size, pos0 = sq->pos, split = QSA_ATTN_SPLIT;
    int phys = m->params.debug_physical_order, has_qsa = c->has_qsa;
    float eps = c->rms_norm_eps;
    size_t slot_tokens = (size_t)pool->n_pages * ps;
    CUdeviceptr Kp = g->kpool + (size_t)pool->slot[l] * slot_tokens * pool->kvd * 2;
    CUdeviceptr Vp = g->vpool + (size_t)pool->slot[l] * slot_tokens * pool->kvd * 2;
    CUdeviceptr Ip = g->ipool + (size_t)pool->slot[l] * slot_tokens * pool->ihd * 4;
    CUdeviceptr bt = sq->cuda->bt, inv = g->rope_inv_freq, qn = d->q_norm, kn = d->k_norm;
    CUdeviceptr qg = s->big[0], kin = s->big[1], vin = s->big[2], iq = s->big[3], att = s->big[4], att16 = s->big16[0];
    { /* q, k, v and the indexer's queries: one input (attn_qk_prep does not touch iq) */
        const qsa__dlin *ws[4] = {&d->q, &d->k, &d->v, &d->idx_qk};
        CUdeviceptr ys[4] = {qg, kin, vin, iq};
        QSA__TRY(qsa__dgemm_group(g, s->inp16, M, has_qsa ? 4 : 3, ws, ys, NULL, NULL));
    }
    QSA__LAUNCH(g, attn_qk_prep, M, nh + nkv, 128, 0, &qg, &kin, &vin, &qn, &kn, &inv, &bt, &Kp, &Vp, &pos0, &M, &nh, &nkv, &hd, &rd, &ps, &eps);
    if (has_qsa) {
        CUdeviceptr qln = d->idx_q_norm, kln = d->idx_k_norm, bk = sq->cuda->bkeys[l];
        QSA__LAUNCH(g, indexer_prep, M, ih + 1, 128, 0, &iq, &qln, &inv, &bt, &Ip, &pos0, &M, &ih, &ihd, &rd, &ps, &eps);
        /* keys of the blocks completed by this chunk */
        int b0 = sl->n_blocks, b1 = (pos0 + M) / r;
        if (b1 > b0) QSA__LAUNCH(g, block_keys, b1 - b0, 1, 128, 0, &Ip, &bt, &kln, &inv, &bk, &b0, &b1, &r, &ihd, &rd, &ps, &eps);
        sl->n_blocks = b1;
        /* scores and top-k for groups of queries (bounded scores buffer) */
        for (int t0 = 0; t0 < M; t0 += s->score_rows) {
            int mq = M - t0 < s->score_rows ? M - t0 : s->score_rows, p = pos0 + t0, ld = s->max_blocks;
            CUdeviceptr iqt = iq + (size_t)t0 * (ih + 1) * ihd * 4, selt = s->sel + (size_t)t0 * topk * 4, nst = s->nsel + (size_t)t0 * 4;
            int maxb = (p + mq) / r;
            /* with at most topk blocks every query selects all of them: topk_blocks reads no score */
            /* decode: qsa__score_ys; prefill chunks: a block per 256 keys, the grid their time was measured with */
            unsigned ys = mq == 1 ? qsa__score_ys(g, 1, maxb) : (unsigned)((maxb + 255) / 256);
            if (maxb > topk) QSA__LAUNCH(g, block_scores, mq, ys, 256, 0, &iqt, &bk, &s->scores, &p, &mq, &ih, &ihd, &r, &ld);
            QSA__LAUNCH(g, topk_blocks, mq, 1, 1024, 0, &s->scores, &selt, &nst, &p, &mq, &r, &topk, &ld);
        }
        if (sq->sel_hook) QSA__TRY(qsa__cuda_report_selections(sq, l, M, topk));
    }
    /* the attention visits the selection in logical order; the debug switch gives it the physical order */
    CUdeviceptr tokpos = 0;
    int ld_tok = topk * r + r;
    if (phys && has_qsa) {
        tokpos = s->tokpos;
        QSA__LAUNCH(g, attn_phys_order, M, 1, 256, 0, &bt, &s->sel, &s->nsel, &tokpos, &pos0, &M, &r, &topk, &ps, &ld_tok);
    }
    int hb = 1, tx = 1;
    unsigned nt = 0;
    if (qsa__attn_tc(g, M == 1 && !tokpos ? 1 : 0, nh, nkv, hd, r, topk, split, &tx)) {
        CUdeviceptr part = tx > 1 ? s->gemv_part : 0;
        void *args[] = {&qg, &Kp, &Vp, &bt, &s->sel, &s->nsel, &att, &att16, &pos0,
                        &nh, &nkv, &hd, &r, &topk, &ps, &tokpos, &ld_tok, &part, &tx};
        QSA__TRY(qsa__attn_tc_run(g, 0, args, tx, M, part, qg, s->nsel, 0, pos0, att, att16, nh, nkv, hd, r, split));
        return qsa__dgemm(g, att16, M, &d->o, s->out, 0);
    }
    int smax = M == 1 && !tokpos ? qsa__attn_dec_splits(g, 1, nh, nkv, hd, r, topk, split, &hb, &nt) : 0;
    if (smax) {
        CUdeviceptr part = s->gemv_part;
        QSA__LAUNCH(g, sparse_attn_dec, smax, nh / hb, nt, 0, &qg, &Kp, &Vp, &bt, &s->sel, &s->nsel, &pos0, &nh, &nkv, &hd,
                    &r, &ps, &split, &part, &smax);
        QSA__TRY(qsa__attn_merge(g, qg, part, s->nsel, 0, pos0, att, att16, 1, nh, nkv, hd, r, split, smax, 0));
    } else {
        QSA__LAUNCH(g, sparse_attn, M, nh / qsa__attn_heads(M, nh, nkv, hd), qsa__attn_threads(M), 0, &qg, &Kp, &Vp, &bt, &s->sel,
                    &s->nsel, &att, &att16, &pos0, &M, &nh, &nkv, &hd, &r, &topk, &ps, &split, &tokpos, &ld_tok);
    }
    return qsa__dgemm(g, att16, M, &d->o, s->out, 0);
}

/* kernels.cu's qsa_router_extra (the same layout) */
typedef struct qsa__router_extra {
    CUdeviceptr sa, sb, sa16;
    int Is, act;
    CUdeviceptr pairs, tiles, ntiles, wcnt, ticket;
    int tr;
} qsa__router_extra;
/* kernels.cu's qsa_route1 (the same layout) */
typedef struct qsa__route1 {
    CUdeviceptr logits;
    int E, K, norm;
    CUdeviceptr topk_ids, topk_w, pairs, tiles, ntiles, sa, sb, sa16;
    int Is, act;
} qsa__route1;

/* Whether a step of M tokens routes inside its gate/up launch (qsa_k_moe_gate_up_xwr: the router's
   launch goes away): one token (decode of one sequence) whose experts take the ranged cross-warp
   gate/up kernel, K <= 32 (the one-warp plan), E <= QSA__ROUTE1_E (the router's probabilities in the
   registers of one warp), one GPU.  The same bits as the router's own launch (tested). */
#define QSA__ROUTE1_E 512 /* kernels.cu: QSA_ROUTE1_E */
QSA_PRIV int qsa__moe_route1(const qsa_model *m, int M) {
    const qsa__cuda *g = m->cuda;
    const qsa_model_config *c = &m->cfg;
    int H = c->hidden_size, I = c->moe_intermediate_size, E = c->num_experts, K = c->num_experts_per_tok;
    if (!g->moe_route1 || M != 1 || m->tp || m->tpr || K < 1 || K > 32 || E > QSA__ROUTE1_E || K > E) return 0;
    if (M > g->sc.moe_tokens || qsa__moe_tr(g, K, E) != 16) return 0;
    int max_tiles = 1 + (E < K ? E : K);
    return qsa__moe_xwarp(g, K, max_tiles, H, I) && !qsa__xw_whole(g, (long long)max_tiles * ((I + 15) / 16));
}

/* MoE: router (with the shared expert's middle and, for one sub-chunk, the expert plan; one token:
   inside its gate/up launch, qsa__moe_route1), the shared expert's down projection, grouped expert
   GEMMs over (token, slot) pairs, then the combine in ascending expert id plus the shared expert's
   term.  The routed part runs over sub-chunks of moe_tokens tokens to bound the [M*K][H] scratch; a
   token's bits do not depend on its sub-chunk. */
QSA_PRIV qsa_result qsa__cuda_moe(qsa_model *m, int l, int M) {
    const qsa_model_config *c = &m->cfg;
    qsa__cuda *g = m->cuda;
    qsa__dscratch *s = &g->sc;
    const qsa__dlayer *d = &g->layers[l];
    int H = c->hidden_size, E = c->num_experts, K = c->num_experts_per_tok, I = c->moe_intermediate_size;
    int Is = c->shared_expert_intermediate_size, norm = c->norm_topk_prob, act = c->hidden_act == QSA_ACT_SIGMOID;
    CUdeviceptr rl = s->big[0], tw = s->big[1], tid = s->big[2], sa = s->big[3], sb = s->big[4], sh = s->big[5],
                sa16 = s->big16[1], gl = s->low, ex = d->experts;
    { /* the router and the shared expert's input projections: one input; the routed path below
         touches none of rl's neighbours sa, sb, gl, nor sa16 and sh */
        const qsa__dlin *ws[4] = {&d->router, &d->sh_gate, &d->sh_up, &d->sh_expert_gate};
        CUdeviceptr ys[4] = {rl, sa, sb, gl};
        QSA__TRY(qsa__dgemm_group(g, s->inp16, M, 4, ws, ys, NULL, NULL));
    }
    /* the router's launch also forms the shared expert's middle and, when the step is one
       sub-chunk (decode), the expert plan; one token's router runs inside its gate/up launch instead
       (route1: that launch forms the same three) */
    int plan1 = M <= s->moe_tokens, tr1 = qsa__moe_tr(g, M * K, E), route1 = qsa__moe_route1(m, M);
    qsa__router_extra rx = {sa, sb, sa16, Is, act, 0, 0, 0, 0, 0, tr1};
    if (plan1) {
        rx.pairs = s->moe_pairs;
        rx.tiles = s->moe_tiles;
        rx.ntiles = s->moe_ntiles;
        rx.wcnt = s->moe_wcnt;
        rx.ticket = s->moe_ticket;
    }
    if (!route1) QSA__LAUNCH(g, router_topk, M, 1, 256, 0, &rl, &tid, &tw, &E, &K, &norm, &rx);
    /* the shared expert's down projection: its output sh joins the routed sum in qsa_k_moe_combine.
       On the side stream beside the routed experts where its launch needs no scratch (decode steps:
       batch 1's shared down took ~3.7 us of each layer's chain); the chain waits for it before the
       first combine.  (route1: after the gate/up launch that forms its input.) */
    int side = g->shared_side && qsa__dgemm_side_ok(g, sa16, M, &d->sh_down);
    if (!route1) {
        if (side) QSA__TRY(qsa__dgemm_side(g, sa16, M, &d->sh_down, sh));
        else QSA__TRY(qsa__dgemm(g, sa16, M, &d->sh_down, sh, 0));
    }
    for (int t0 = 0; t0 < M; t0 += s->moe_tokens) {
        int mt = M - t0 < s->moe_tokens ? M - t0 : s->moe_tokens, MK = mt * K;
        /* tiles of 64 pairs once experts average 16 pairs (prefill); 16 for decode-sized steps: same bits */
        int tr = qsa__moe_tr(g, MK, E), max_tiles = (MK + tr - 1) / tr + (E < MK ? E : MK);
        CUdeviceptr x16 = s->inp16 + (size_t)t0 * H * 2, ids = tid + (size_t)t0 * K * 4, w = tw + (size_t)t0 * K * 4;
        CUdeviceptr outp = s->out + (size_t)t0 * H * 4;
        /* a warp per 256 pairs, 4 to QSA__MOE_PLAN_THREADS / 32 of them (the plan does not depend on it) */
        unsigned plan_warps = (unsigned)((MK + 255) / 256);
        plan_warps = plan_warps < 4 ? 4 : plan_warps > QSA__MOE_PLAN_THREADS / 32 ? QSA__MOE_PLAN_THREADS / 32 : plan_warps;
        if (!plan1)
            QSA__LAUNCH(g, moe_plan, 1, 1, 32 * plan_warps, 0, &ids, &MK, &E, &s->moe_pairs, &s->moe_tiles, &s->moe_ntiles,
                        &tr, &s->moe_wcnt);
        if (tr == 16 && qsa__moe_xwarp(g, MK, max_tiles, H, I)) {
            CUdeviceptr part = s->gemv_part, cnt = s->gemv_count;
            long long t1 = (long long)max_tiles * ((I + 15) / 16), t2 = (long long)max_tiles * ((H + 15) / 16);
            int whole1 = qsa__xw_whole(g, t1), whole2 = qsa__xw_whole(g, t2);
            int nr1 = whole1 ? 1 : qsa__xw_ranges(g, t1 * 2, (H + 255) / 256);
            int nr2 = whole2 ? 1 : qsa__xw_ranges(g, t2, (I + 255) / 256);
            unsigned bx = 32 * QSA__GEMV_WARPS;
            /* gate_up: a task per (tile, column tile, gate or up[, K segment range]) */
            unsigned gx1 = (unsigned)((t1 * 2 * nr1 + QSA__GEMV_WARPS - 1) / QSA__GEMV_WARPS);
            unsigned gx2 = (unsigned)((t2 * nr2 + QSA__GEMV_WARPS - 1) / QSA__GEMV_WARPS);
            int lean = qsa__moe_lean(g, d, H, I), lt1 = qsa__lean_tasks(g, 0, t1 * 2), lt2 = qsa__lean_tasks(g, 1, t2);
            /* the lean down kernel may read the plan before its PDL wait where the plan's writer (the router's
               launch or qsa_k_moe_plan) is two or more launches back: not when the gate/up launch routes */
            int early = !route1;
            unsigned lx1 = (unsigned)((t1 * 2 + QSA__LEAN_WARPS * lt1 - 1) / (QSA__LEAN_WARPS * lt1));
            unsigned lx2 = (unsigned)((t2 + QSA__LEAN_WARPS * lt2 - 1) / (QSA__LEAN_WARPS * lt2));
            if (route1) { /* (qsa__moe_route1: the ranged form, one sub-chunk) */
                qsa__route1 rt = {rl, E, K, norm, tid, tw, s->moe_pairs, s->moe_tiles, s->moe_ntiles, sa, sb, sa16, Is, act};
                /* at most K tiles (ntiles <= MK) */
                unsigned gr = (unsigned)(((long long)K * ((I + 15) / 16) * 2 * nr1 + QSA__GEMV_WARPS - 1) / QSA__GEMV_WARPS);
                QSA__LAUNCH(g, moe_gate_up_xwr, gr, 1, bx, 0, &x16, &ex, &s->moe_h16, &H, &I, &act, &part, &cnt, &nr1, &rt);
                if (side) QSA__TRY(qsa__dgemm_side(g, sa16, M, &d->sh_down, sh));
                else QSA__TRY(qsa__dgemm(g, sa16, M, &d->sh_down, sh, 0));
            } else if (whole1 && lean)
                QSA__LAUNCH(g, moe_gate_up_xwn, lx1, 1, 32 * QSA__LEAN_WARPS, 0, &x16, &s->moe_pairs, &s->moe_tiles, &s->moe_ntiles, &ex,
                            &s->moe_h16, &H, &I, &K, &act, &part, &cnt, &lt1);
            else if (whole1)
                QSA__LAUNCH(g, moe_gate_up_xwk, gx1, 1, bx, 0, &x16, &s->moe_pairs, &s->moe_tiles, &s->moe_ntiles, &ex,
                            &s->moe_h16, &H, &I, &K, &act, &part, &cnt);
            else
                QSA__LAUNCH(g, moe_gate_up_xw, gx1, 1, bx, 0, &x16, &s->moe_pairs, &s->moe_tiles, &s->moe_ntiles, &ex,
                            &s->moe_h16, &H, &I, &K, &act, &part, &cnt, &nr1);
            if (whole2 && lean)
                QSA__LAUNCH(g, moe_down_xwn, lx2, 1, 32 * QSA__LEAN_WARPS, 0, &s->moe_h16, &s->moe_pairs, &s->moe_tiles, &s->moe_ntiles,
                            &ex, &s->moe_y, &H, &I, &lt2, &early);
            else if (whole2)
                QSA__LAUNCH(g, moe_down_xwk, gx2, 1, bx, 0, &s->moe_h16, &s->moe_pairs, &s->moe_tiles, &s->moe_ntiles, &ex,
                            &s->moe_y, &H, &I);
            else
                QSA__LAUNCH(g, moe_down_xw, gx2, 1, bx, 0, &s->moe_h16, &s->moe_pairs, &s->moe_tiles, &s->moe_ntiles, &ex,
                            &s->moe_y, &H, &I, &part, &cnt, &nr2);
        } else if (tr == 64) {
            QSA__LAUNCH(g, moe_gate_up64, max_tiles, (I + 31) / 32, 256, 0, &x16, &s->moe_pairs, &s->moe_tiles, &s->moe_ntiles,
                        &ex, &s->moe_h16, &H, &I, &K, &act);
            QSA__LAUNCH(g, moe_down64, max_tiles, (H + 63) / 64, 256, 0, &s->moe_h16, &s->moe_pairs, &s->moe_tiles,
                        &s->moe_ntiles, &ex, &s->moe_y, &H, &I);
        } else {
            QSA__LAUNCH(g, moe_gate_up, max_tiles, (I + 15) / 16, 256, 0, &x16, &s->moe_pairs, &s->moe_tiles, &s->moe_ntiles,
                        &ex, &s->moe_h16, &H, &I, &K, &act);
            QSA__LAUNCH(g, moe_down, max_tiles, (H + 15) / 16, 256, 0, &s->moe_h16, &s->moe_pairs, &s->moe_tiles,
                        &s->moe_ntiles, &ex, &s->moe_y, &H, &I);
        }
        CUdeviceptr sht = sh + (size_t)t0 * H * 4, glt = gl + (size_t)t0 * 4;
        if (side) {
            QSA__TRY(QSA__CU_R(qsa__cu.cuStreamWaitEvent(g->stream, g->side_join, 0)));
            side = 0;
        }
        QSA__LAUNCH(g, moe_combine, mt, qsa__ygrid(mt, H), 256, 0, &s->moe_y, &w, &outp, &H, &K, &sht, &glt);
    }
    return QSA_OK;
}

/* One chunk of M <= max_chunk tokens through the whole model. */
/* The rest of layer l once its mixer has written sc.out for M rows (the chunked forward and the
   batched step alike): the TP sum of the ranks' partial sums (a no-op on one GPU), the injection, the
   MLP's gated residual, the MoE, the TP sum, and the injection that also norms X for the next gated
   residual when one follows directly (*normed). */
QSA_PRIV qsa_result qsa__cuda_layer_mlp(qsa_model *m, int l, int M, int *normed) {
    qsa__cuda *g = m->cuda;
    qsa__dscratch *s = &g->sc;
    int H = m->cfg.hidden_size;
    QSA__TRY(qsa__tp_reduce(m, s->out, M * H));
    QSA__TRY(qsa__cuda_inject(m, s->X, M, &g->layers[l].mlp_hc));
    QSA__TRY(qsa__cuda_gres(m, &g->layers[l].mlp_hc, s->X, M, 1, 1));
    QSA__TRY(qsa__cuda_moe(m, l, M));
    QSA__TRY(qsa__tp_reduce(m, s->out, M * H));
    const qsa__dgres *next = qsa__cuda_next_gres(m, l);
    QSA__TRY(qsa__cuda_inject(m, s->X, M, next));
    *normed = next != NULL;
    return QSA_OK;
}

QSA_PRIV qsa_result qsa__cuda_chunk(qsa_seq *sq, const int32_t *ids, int M, float *logits, int all_logits,
                                    const qsa__cand_req *cq) {
    if (sq->m->tp) return qsa__tp_chunk(sq, ids, M, logits, all_logits); /* every local rank runs this function */
    qsa_model *m = sq->m;
    const qsa_model_config *c = &m->cfg;
    qsa__cuda *g = m->cuda;
    qsa__dscratch *s = &g->sc;
    int H = c->hidden_size, hc = c->hc_count, V = c->vocab_size;
    /* the last token's draw started on the device (struct qsa__cand_req, one row: as a decode step's), its parameters
       queued before the forward; cq->out[1] stays -1 where its logits come instead */
    int cand = cq && logits && !all_logits && !m->tpr && g->sample_dev && m->params.cuda_batch_decode;
    if (cand) { /* (the batch's buffers refused: the caller's last error, as a feed that succeeds leaves it) */
        char keep[sizeof qsa__err_buf];
        snprintf(keep, sizeof keep, "%s", qsa__err_buf);
        cand = qsa__cuda_batch_ready(m) && qsa__cuda_cand_rows(m, &sq, ids, M, 1, cq);
        snprintf(qsa__err_buf, sizeof qsa__err_buf, "%s", keep);
    }
    if (cand) QSA__TRY(qsa__cuda_cand_put(m, 1));
    /* block table: pages acquired since the last chunk */
    if (sq->n_pages > sq->cuda->bt_synced) {
        QSA__CU(qsa__cu.cuMemcpyHtoDAsync_v2(sq->cuda->bt + (size_t)sq->cuda->bt_synced * 4, sq->bt + sq->cuda->bt_synced,
                                             (size_t)(sq->n_pages - sq->cuda->bt_synced) * 4, g->stream));
        sq->cuda->bt_synced = sq->n_pages;
    }
    QSA__CU(qsa__cu.cuMemcpyHtoDAsync_v2(s->ids, ids, (size_t)M * 4, g->stream));
    CUdeviceptr table = g->embed16;
    QSA__LAUNCH(g, embed, M, qsa__ygrid(M, H), 256, 0, &table, &s->ids, &s->X, &H, &hc, &V);
    int normed = 0; /* whether the last injection also normed X for the next gated residual */
    for (int l = 0; l < c->num_hidden_layers; l++) {
        if (m->layers[l].ple) QSA__TRY(qsa__cuda_ple(sq, l, ids, M));
        QSA__TRY(qsa__cuda_gres(m, &g->layers[l].attn_hc, s->X, M, 1, normed));
        if (c->layer_types[l] == QSA_LAYER_LINEAR) QSA__TRY(qsa__cuda_gdn(sq, l, M));
        else QSA__TRY(qsa__cuda_attn(sq, l, M));
        QSA__TRY(qsa__cuda_layer_mlp(m, l, M, &normed));
    }
    QSA__TRY(qsa__cuda_gres(m, &g->final_hc, s->X, M, 0, normed));
    if (sq->hidden_out) QSA__CU(qsa__cu.cuMemcpyDtoHAsync_v2(sq->hidden_out, s->inp, (size_t)M * H * 4, g->stream));
    if (logits) {
        int first = all_logits ? 0 : M - 1;
        for (int t0 = first; t0 < M; t0 += s->logit_rows) {
            int rows = M - t0 < s->logit_rows ? M - t0 : s->logit_rows;
            QSA__TRY(qsa__dgemm(g, s->inp16 + (size_t)t0 * H * 2, rows, &g->lm_head, s->logits, 0));
            float *dst = logits + (all_logits ? (size_t)t0 * V : 0);
            if (m->tpr) { QSA__TRY(qsa__tp_logits(m, s->logits, rows, dst)); continue; } /* TP: gather the vocab */
            if (cand) { QSA__TRY(qsa__cuda_cand_one(m, s->logits, cq, logits)); continue; } /* (rows 1: the last's) */
            QSA__CU(qsa__cu.cuMemcpyDtoHAsync_v2(dst, s->logits, (size_t)rows * V * 4, g->stream));
            QSA__CU(qsa__cu.cuStreamSynchronize(g->stream)); /* the logits buffer is reused */
        }
    }
    QSA__CU(qsa__cu.cuStreamSynchronize(g->stream));
    return QSA_OK;
}

/* ---- batched decode: one token of each of B sequences per forward pass, optionally a CUDA graph ----

   Verified on an H200 (tests/t_gpu.c batch_*: batches of 1, 2, 7, 8, 31, 32 bitwise equal to feeding
   each sequence alone, graphs equal to eager; tests/t_sched.c gpu/sched_*).

   The step runs the chunk forward with M = B tokens: every per-token kernel (embedding, norms, mixers,
   GEMMs, MoE, gates) is launched unchanged, and the kernels that need a sequence's position, block
   table or state are their *_batch variants, which run the single-sequence body with M = 1 for
   token b = blockIdx.z.  So token b's bits are those of qsa_seq_feed(seq_b, &tok_b, 1): they do not
   depend on the batch size, on the other sequences or on b.

   Everything that changes between steps lives in device buffers allocated once (addresses fixed):
   `step` holds the token ids, positions and the per-sequence pointers (block table; conv, S, PLE conv
   and block-key state per layer); `ple_e` the PLE rows the host gathers for every PLE layer (they
   depend only on token ids).  The host rewrites both with cuMemcpyHtoDAsync on the stream before
   the step's kernels (or the graph launch); those copies are never captured (their sources are
   pageable host memory).  All launch grids depend only on B and the model (block scores use the
   fixed upper bound ceil(max_blocks / 256) in y; the block-key kernel handles "no block completed"
   on the device), so a graph captured for B stays valid as pages, selections and slots change.
   Graphs are captured per exact B (1..max_batch) at first use, no padding.

   Under TP every local rank runs this step on its view of the model and of the sequences (its slices,
   its device state, its own step buffers and graphs), on its own thread and stream.  The forward calls
   the same reduction hooks as the chunk path, now over B rows: qsa__tp_reduce after the mixer and the
   MoE (B x H partial sums, one all-gather, qsa_k_tp_sum per element in rank order), the PLE columns
   gathered into whole rows (qsa__tp_ple_gather), and the lm_head's vocabulary rows gathered for the B
   rows (qsa__tp_logits_gather).  Each reduction is elementwise over the rows, so a token's bits are
   still those of feeding it alone.  The collectives are part of the forward, so a rank's graph
   captures them (NCCL >= 2.9; every rank captures the same collectives in the same step, in
   thread-local capture mode).  Under TP the first step of each B runs eagerly, and the graph is
   captured before B's second step, by every rank before any rank runs that step
   (qsa__cuda_batch_capture from qsa__tp_decode_batch): every collective of the step has then run once
   outside a capture, so NCCL's lazy set-up (connections at the first use of an algorithm,
   NCCL_RUNTIME_CONNECT in 2.22 and later, with the ranks' bootstrap exchanges and allocations) never
   has to happen inside one; and a capture that fails fails the step before any rank has changed
   anything or waits in a collective for a rank that will not come. */

/* A captured step for one B and the collectives it issues at each launch (TP; none on one GPU). */
typedef struct qsa__dgraph {
    CUgraphExec exec;
    long long n_coll, bytes_coll;
    int warm;  /* a step of this B has run eagerly (TP captures only then) */
    int eager; /* its capture failed: steps of this B run without a graph (one GPU; while the step's buffers live) */
} qsa__dgraph;

/* kernels.cu's qsa_cand_row (the same layout): a row's sampling on the device */
typedef struct qsa__cand_row {
    float temp, pen;
    int k, pen_off, pen_n, z;
} qsa__cand_row;
#define QSA__CAND_PEN (1 << 16) /* penalised ids of one batched step on the device (more: its logits come to the host) */
#define QSA__CAND_GROUP 16       /* rows per pair of launches (the chunks' candidates of 16 rows: 4 MB at 248,320 ids) */
#define QSA__CAND_CHUNKS(V) (((V) + 8191) / 8192) /* kernels.cu: QSA_CAND_CHUNK */
#define QSA__CAND_HOST_BYTES(mb) ((size_t)(mb) * sizeof(qsa__cand_row) + (size_t)QSA__CAND_PEN * 4)

typedef struct qsa__dbatch {
    int max_batch, n_ple, L;
    size_t step_bytes;
    CUdeviceptr step;           /* ids int[mb], pos int[mb], then u64 [mb]: bt; [L][mb]: conv, S, ple, bkeys */
    CUdeviceptr ids, pos, bt, conv, S, ple, bkeys;
    CUdeviceptr ple_e;          /* [n_ple][mb][ple_embed_dim] fp32 */
    CUdeviceptr scores;         /* [mb][max_blocks] */
    CUdeviceptr logits;         /* [mb][V], or in vocabulary slices (qsa__logit_slices) */
    CUdeviceptr cand;           /* sampling on the device (qsa__cuda_cand_rows): qsa__cand_row [mb], the penalised ids
                                   [QSA__CAND_PEN], the rows' candidates [mb][QSA__CAND_STRIDE(QSA__CAND_MAX)] */
    CUdeviceptr cand_part;      /* the chunks' (qsa_k_sample_cand1, qsa_k_sample_z) of QSA__CAND_GROUP rows: arg-max
                                   [G][P][2], candidates' values and ids [G][P QSA__CAND_MAX] each, sums u64 [G][P] */
    unsigned char *cand_host;   /* host image of the rows and the ids */
    unsigned char *host;        /* host image of step */
    float *host_e;              /* host image of ple_e */
    qsa__dgraph *graphs;        /* [mb + 1], by B */
    CUstream copy;              /* the logits slices' copies to the host */
    CUevent lg_ev[QSA__LOGIT_SLICES]; /* slice c of the lm_head is written (recorded in the graph: external) */
} qsa__dbatch;

/* Destroys the captured graphs (they hold the addresses of the KV pool and the step buffers): the
   next step of each B captures again.  Under TP this must precede ncclCommDestroy, which waits until
   no graph holds a collective of its communicator (qsa__tp_free). */
QSA_PRIV void qsa__cuda_batch_drop_graphs(qsa__cuda *g) {
    qsa__dbatch *b = g->batch;
    if (!b || !b->graphs) return;
    for (int i = 0; i <= b->max_batch; i++) {
        if (b->graphs[i].exec) qsa__cu.cuGraphExecDestroy(b->graphs[i].exec);
        memset(&b->graphs[i], 0, sizeof b->graphs[i]);
    }
}

QSA_PRIV void qsa__cuda_batch_free(qsa__cuda *g) {
    qsa__dbatch *b = g->batch;
    if (!b) return;
    qsa__cuda_batch_drop_graphs(g);
    for (int i = 0; i < QSA__LOGIT_SLICES; i++)
        if (b->lg_ev[i]) qsa__cu.cuEventDestroy_v2(b->lg_ev[i]);
    if (b->copy) qsa__cu.cuStreamDestroy_v2(b->copy);
    qsa__free(b->graphs);
    qsa__free(b->host);
    qsa__free(b->host_e);
    qsa__free(b->cand_host);
    qsa__free(b); /* device buffers are in g->allocs */
    g->batch = NULL;
}

QSA_PRIV qsa_result qsa__cuda_batch_alloc_(qsa_model *m) {
    qsa__cuda *g = m->cuda;
    const qsa_model_config *c = &m->cfg;
    qsa__dbatch *b = QSA__CALLOC(qsa__dbatch, 1);
    if (!b) return qsa__fail(QSA_ERR_OUT_OF_MEMORY, "batched decode: out of host memory");
    g->batch = b;
    int mb = m->params.max_batch, L = c->num_hidden_layers, D = c->ple_embed_dim ? c->ple_embed_dim : 1;
    b->max_batch = mb;
    b->L = L;
    for (int l = 0; l < L; l++) b->n_ple += m->layers[l].ple != NULL;
    b->step_bytes = (size_t)mb * 8 + (size_t)mb * 8 * (1 + 4 * (size_t)L);
    size_t *cnt = &g->bytes_scratch;
    b->host = QSA__CALLOC(unsigned char, b->step_bytes);
    b->host_e = QSA__ALLOC(float, (size_t)(b->n_ple ? b->n_ple : 1) * mb * D);
    b->graphs = QSA__CALLOC(qsa__dgraph, mb + 1);
    b->cand_host = QSA__ALLOC(unsigned char, QSA__CAND_HOST_BYTES(mb));
    if (!b->host || !b->host_e || !b->graphs || !b->cand_host)
        return qsa__fail(QSA_ERR_OUT_OF_MEMORY, "batched decode: out of host memory");
    QSA__TRY(qsa__dalloc(g, &b->step, b->step_bytes, cnt, "batched decode"));
    b->ids = b->step;
    b->pos = b->step + (size_t)mb * 4;
    b->bt = b->step + (size_t)mb * 8;
    b->conv = b->bt + (size_t)mb * 8;
    b->S = b->conv + (size_t)L * mb * 8;
    b->ple = b->S + (size_t)L * mb * 8;
    b->bkeys = b->ple + (size_t)L * mb * 8;
    QSA__TRY(qsa__dalloc(g, &b->ple_e, (size_t)(b->n_ple ? b->n_ple : 1) * mb * D * 4, cnt, "batched decode"));
    QSA__TRY(qsa__dalloc(g, &b->scores, (size_t)mb * g->sc.max_blocks * 4, cnt, "batched decode"));
    QSA__TRY(qsa__dalloc(g, &b->logits, (size_t)mb * c->vocab_size * 4, cnt, "batched decode"));
    size_t cand_rows = QSA__CAND_HOST_BYTES(mb) + (size_t)mb * QSA__CAND_STRIDE(QSA__CAND_MAX) * 4;
    QSA__TRY(qsa__dalloc(g, &b->cand,
                         cand_rows + (size_t)QSA__CAND_GROUP * QSA__CAND_CHUNKS(c->vocab_size) * (4 + 2 * QSA__CAND_MAX) * 4, cnt,
                         "batched decode"));
    b->cand_part = b->cand + cand_rows;
    /* a column slice's output (qsa__dgemm_ex makes it at its first slice): made here, since the first
       sliced GEMV of a batch (the real shape's lm_head at B = 4-8 and 14-16) may come in a step's
       capture, where the driver refuses an allocation and the graph is lost */
    if (!g->sc.gemv_slice) QSA__TRY(qsa__dalloc(g, &g->sc.gemv_slice, QSA__GEMV_PART_BYTES, cnt, "GEMV slices"));
    QSA__TRY(QSA__CU_R(qsa__cu.cuStreamCreate(&b->copy, QSA__CU_STREAM_NON_BLOCKING)));
    for (int i = 0; i < QSA__LOGIT_SLICES; i++)
        QSA__TRY(QSA__CU_R(qsa__cu.cuEventCreate(&b->lg_ev[i], QSA__CU_EVENT_DISABLE_TIMING)));
    return QSA_OK;
}

/* The batched step's lm_head in vocabulary slices, so that its logits cross to the host while the
   rest is computed: slice c covers columns c W .. min(V, (c + 1) W) - 1 (W = qsa__logit_slice_w), all
   B rows of it stored together, [B][wc] at c W B floats of bb->logits (qsa_k_sample_cand1 reads that
   layout); its GEMM is followed by an event that the copy stream waits on (an external event record
   node in the graph).  Each logit is the same GEMM element as in one launch: the same bits.  The
   number of slices (1: one GEMM into [B][V]) for B rows: QSA__LOGIT_SLICES once the batch's logits
   reach logit_slice_bytes, except under TP (gathered whole) and on drivers without
   cuEventRecordWithFlags. */
QSA_PRIV int qsa__logit_slices(const qsa_model *m, int B) {
    const qsa__cuda *g = m->cuda;
    size_t bytes = (size_t)B * m->cfg.vocab_size * 4;
    if (m->tpr || !qsa__cu.cuEventRecordWithFlags || !g->logit_slice_bytes || bytes < g->logit_slice_bytes) return 1;
    return m->cfg.vocab_size >= 64 * QSA__LOGIT_SLICES ? QSA__LOGIT_SLICES : 1;
}
QSA_PRIV int qsa__logit_slice_w(int V, int ns) { return ns <= 1 ? V : ((V + ns - 1) / ns + 63) / 64 * 64; }

/* All or nothing: a half-made set is dropped, its device buffers freed at once. */
QSA_PRIV qsa_result qsa__cuda_batch_alloc(qsa_model *m) {
    qsa__cuda *g = m->cuda;
    if (g->batch) return QSA_OK;
    /* (unused yet, and each step asks again: they would pile up) */
    int n0 = g->n_allocs;
    size_t bytes0 = g->bytes_scratch;
    CUdeviceptr slice0 = g->sc.gemv_slice;
    qsa_result r = qsa__cuda_batch_alloc_(m);
    if (r != QSA_OK) {
        qsa__cuda_batch_free(g);
        for (int i = n0; i < g->n_allocs; i++) qsa__cu.cuMemFree_v2(g->allocs[i]);
        g->n_allocs = n0;
        g->bytes_scratch = bytes0;
        g->sc.gemv_slice = slice0;
    }
    return r;
}

/* Whether the batched step's buffers exist or can be made, for qsa_seq_feed of one token: if they
   cannot be (out of device memory), once, single tokens take the chunked forward from then on. */
QSA_PRIV int qsa__cuda_batch_ready(qsa_model *m) {
    qsa__cuda *g = m->cuda;
    if (g->batch) return 1;
    if (g->batch_refused || qsa__cu.cuCtxSetCurrent(g->ctx) != 0) return 0;
    if (qsa__cuda_batch_alloc(m) == QSA_OK) return 1;
    qsa__log(QSA_LOG_INFO, "cuda: single-token feeds take the chunked forward: %s", qsa_last_error());
    g->batch_refused = 1;
    return 0;
}

/* Per-layer pointer arrays of the step buffer: [L][mb] u64, row l. */
#define QSA__BROW(b, arr, l) ((b)->arr + (size_t)(l) * (b)->max_batch * 8)

QSA_PRIV qsa_result qsa__cuda_ple_batch(qsa_model *m, int l, int j, int B) {
    const qsa_model_config *c = &m->cfg;
    qsa__cuda *g = m->cuda;
    qsa__dscratch *s = &g->sc;
    qsa__dbatch *bb = g->batch;
    const qsa__dlayer *d = &g->layers[l];
    int H = c->hidden_size, hc = c->hc_count, hcH = hc * H, D = c->ple_embed_dim;
    int Kc = c->ple_conv_kernel_size, dil = c->ngram_size, n = B * D;
    float eps = c->rms_norm_eps;
    CUdeviceptr e = bb->ple_e + (size_t)j * bb->max_batch * D * 4, e16 = s->big16[0], keyp = s->big[1], valp = s->big[2],
                gv = s->big[3], gvn = s->big[4];
    if (m->tpr) { /* TP: ple_e holds this rank's columns of the rows; all-gather them into whole rows */
        QSA__TRY(qsa__tp_ple_gather(m, e, s->big[0], B));
        e = s->big[0];
    }
    QSA__LAUNCH(g, to_f16, (n + 255) / 256, 1, 256, 0, &e, &e16, &n);
    QSA__TRY(qsa__dgemm(g, e16, B, &d->ple_key, keyp, 0));
    QSA__TRY(qsa__dgemm(g, e16, B, &d->ple_value, valp, 0));
    CUdeviceptr nk = d->ple_nk, nq = d->ple_nq, nc = d->ple_nc, cw = d->ple_conv_w, st = QSA__BROW(bb, ple, l), X = s->X;
    QSA__LAUNCH(g, ple_gate, B, hc, 256, 0, &keyp, &X, &valp, &nk, &nq, &nc, &gv, &gvn, &H, &hc, &eps);
    QSA__LAUNCH3(g, ple_conv_batch, (hcH + 255) / 256, 1, B, 256, 0, &X, &gv, &gvn, &st, &cw, &hcH, &Kc, &dil);
    return QSA_OK;
}

QSA_PRIV qsa_result qsa__cuda_gdn_batch(qsa_model *m, int l, int B) {
    const qsa_model_config *c = &m->cfg;
    qsa__cuda *g = m->cuda;
    qsa__dscratch *s = &g->sc;
    const qsa__dlayer *d = &g->layers[l];
    int nk = c->linear_num_key_heads, nv = c->linear_num_value_heads, dk = c->linear_key_head_dim, dv = c->linear_value_head_dim;
    int key_dim = nk * dk, conv_dim = 2 * key_dim + nv * dv, Kc = c->linear_conv_kernel_dim;
    int act = c->hidden_act == QSA_ACT_SIGMOID, gact = c->output_gate_act == QSA_ACT_SIGMOID;
    float eps = c->rms_norm_eps;
    CUdeviceptr qkv = s->big[0], z = s->big[1], q = s->big[2], k = s->big[3], v = s->big[4], o = s->big[5];
    CUdeviceptr b = s->out, a = s->mw, beta = s->low, gg = s->xn;
    const qsa__dlin *ws[4] = {&d->in_qkv, &d->in_z, &d->in_b, &d->in_a};
    CUdeviceptr ys[4] = {qkv, z, b, a};
    QSA__TRY(qsa__dgemm_group(g, s->inp16, B, 4, ws, ys, NULL, NULL));
    qsa__gdn_gate_args ga = {b, a, d->A_log, d->dt_bias, beta, gg, nv}; /* gates and state update in the conv */
    CUdeviceptr cst = QSA__BROW(g->batch, conv, l), cw = d->conv_w;
    int fused = qsa__gdn_fused(m); /* (the conv inside the recurrence's launch) */
    qsa__gdn_fuse fz = {0, cst, cw, b, a, d->A_log, d->dt_bias, conv_dim, Kc, act};
    qsa__gdn_shift sh = {0, qkv, conv_dim, Kc, 2 * key_dim}; /* (fused: the q and k state rows in the norm's launch) */
    if (fused) fz.qkv = qkv, sh.st = cst;
    else
        QSA__LAUNCH3(g, gdn_conv_batch, 1, 2 * nk + (conv_dim - 2 * key_dim + 255) / 256, B, 256, 0, &qkv, &cst, &cw, &q, &k, &v,
                     &conv_dim, &key_dim, &Kc, &act, &nk, &dk, &ga);
    CUdeviceptr S = QSA__BROW(g->batch, S, l);
    unsigned ny = qsa__gdn_rec_ny(dk, dv), smem = 0;
    if (m->params.gdn_state_f16)
        QSA__LAUNCH3(g, gdn_recurrent_f16state_batch, nv, ny, B, QSA__GDN_REC_THREADS, smem, &S, &q, &k, &v, &beta, &gg, &o, &nk, &nv, &dk, &dv);
    else
        QSA__LAUNCH3(g, gdn_recurrent_batch, nv, ny, B, QSA__GDN_REC_THREADS, smem, &S, &q, &k, &v, &beta, &gg, &o, &nk, &nv, &dk, &dv,
                     &fz);
    CUdeviceptr nw = d->gnorm_w, o16 = s->big16[0];
    QSA__LAUNCH(g, gdn_norm_gate, B * nv, 1, 128, 0, &o, &z, &nw, &o16, &nv, &dv, &eps, &gact, &sh);
    return qsa__dgemm(g, o16, B, &d->out, s->out, 0);
}

QSA_PRIV qsa_result qsa__cuda_attn_batch(qsa_model *m, int l, int B) {
    const qsa_model_config *c = &m->cfg;
    qsa__cuda *g = m->cuda;
    qsa__dscratch *s = &g->sc;
    qsa__dbatch *bb = g->batch;
    const qsa__dlayer *d = &g->layers[l];
    const qsa__pool *pool = &m->pool;
    int nh = c->num_attention_heads, nkv = c->num_key_value_heads, hd = c->head_dim, rd = c->rotary_dim;
    int ih = c->indexer_n_heads, ihd = c->indexer_head_dim, r = c->has_qsa ? c->indexer_compress_ratio : 0;
    int topk = c->has_qsa ? c->indexer_budget / r : 0, ps = pool->page_size, split = QSA_ATTN_SPLIT;
    float eps = c->rms_norm_eps;
    size_t slot_tokens = (size_t)pool->n_pages * ps;
    CUdeviceptr Kp = g->kpool + (size_t)pool->slot[l] * slot_tokens * pool->kvd * 2;
    CUdeviceptr Vp = g->vpool + (size_t)pool->slot[l] * slot_tokens * pool->kvd * 2;
    CUdeviceptr Ip = g->ipool + (size_t)pool->slot[l] * slot_tokens * pool->ihd * 4;
    CUdeviceptr bts = bb->bt, pos = bb->pos, inv = g->rope_inv_freq, qn = d->q_norm, kn = d->k_norm;
    CUdeviceptr qg = s->big[0], kin = s->big[1], vin = s->big[2], iq = s->big[3], att = s->big[4], att16 = s->big16[0];
    { /* q, k, v and the indexer's queries: one input */
        const qsa__dlin *ws[4] = {&d->q, &d->k, &d->v, &d->idx_qk};
        CUdeviceptr ys[4] = {qg, kin, vin, iq};
        QSA__TRY(qsa__dgemm_group(g, s->inp16, B, c->has_qsa ? 4 : 3, ws, ys, NULL, NULL));
    }
    { /* q/k prep, K and V into the pools, and with the indexer its queries, the token's raw key and the key
         of the block it completes: one launch */
        CUdeviceptr qln = c->has_qsa ? d->idx_q_norm : 0, kln = c->has_qsa ? d->idx_k_norm : 0;
        CUdeviceptr bk = c->has_qsa ? QSA__BROW(bb, bkeys, l) : 0, iqp = c->has_qsa ? iq : 0;
        unsigned ny = (unsigned)(nh + nkv + (c->has_qsa ? ih + 1 : 0));
        QSA__LAUNCH3(g, attn_prep_batch, 1, ny, B, 128, 0, &qg, &kin, &vin, &qn, &kn, &inv, &bts, &Kp, &Vp, &pos, &nh, &nkv,
                     &hd, &rd, &ps, &eps, &iqp, &qln, &kln, &Ip, &bk, &ih, &ihd, &r);
    }
    if (c->has_qsa) {
        CUdeviceptr bk = QSA__BROW(bb, bkeys, l), sc = bb->scores;
        int ld = s->max_blocks;
        unsigned ys = qsa__score_ys(g, B, s->max_blocks);
        QSA__LAUNCH3(g, block_scores_batch, 1, ys, B, 256, 0, &iq, &bk, &sc, &pos, &ih, &ihd, &r, &ld, &topk);
        QSA__LAUNCH3(g, topk_blocks_batch, 1, 1, B, 1024, 0, &sc, &s->sel, &s->nsel, &pos, &r, &topk, &ld);
    }
    int hb = 1, tx = 1;
    unsigned nt = 0;
    if (qsa__attn_tc(g, B, nh, nkv, hd, r, topk, split, &tx)) {
        CUdeviceptr part = tx > 1 ? s->gemv_part : 0;
        void *args[] = {&qg, &Kp, &Vp, &bts, &s->sel, &s->nsel, &att, &att16, &pos,
                        &nh, &nkv, &hd, &r, &topk, &ps, &part, &tx};
        QSA__TRY(qsa__attn_tc_run(g, 1, args, tx, B, part, qg, s->nsel, pos, 0, att, att16, nh, nkv, hd, r, split));
        return qsa__dgemm(g, att16, B, &d->o, s->out, 0);
    }
    int smax = qsa__attn_dec_splits(g, B, nh, nkv, hd, r, topk, split, &hb, &nt);
    if (smax) {
        CUdeviceptr part = s->gemv_part;
        QSA__LAUNCH3(g, sparse_attn_dec_batch, smax, nh / hb, B, nt, 0, &qg, &Kp, &Vp, &bts, &s->sel, &s->nsel, &pos, &nh,
                     &nkv, &hd, &r, &topk, &ps, &split, &part, &smax);
        QSA__TRY(qsa__attn_merge(g, qg, part, s->nsel, pos, 0, att, att16, B, nh, nkv, hd, r, split, smax, 0));
    } else {
        QSA__LAUNCH3(g, sparse_attn_batch, 1, nh, B, qsa__attn_threads(B), 0, &qg, &Kp, &Vp, &bts, &s->sel, &s->nsel, &att, &att16, &pos,
                     &nh, &nkv, &hd, &r, &topk, &ps, &split);
    }
    return qsa__dgemm(g, att16, B, &d->o, s->out, 0);
}

/* The kernels of one batched step (what a graph captures): reads only the step buffers. */
QSA_PRIV qsa_result qsa__cuda_batch_forward(qsa_model *m, int B) {
    const qsa_model_config *c = &m->cfg;
    qsa__cuda *g = m->cuda;
    qsa__dscratch *s = &g->sc;
    int H = c->hidden_size, hc = c->hc_count, V = c->vocab_size;
    CUdeviceptr table = g->embed16, ids = g->batch->ids;
    QSA__LAUNCH(g, embed, B, (H + 255) / 256, 256, 0, &table, &ids, &s->X, &H, &hc, &V);
    int normed = 0; /* as in qsa__cuda_chunk */
    for (int l = 0, j = 0; l < c->num_hidden_layers; l++) {
        if (m->layers[l].ple) QSA__TRY(qsa__cuda_ple_batch(m, l, j++, B));
        QSA__TRY(qsa__cuda_gres(m, &g->layers[l].attn_hc, s->X, B, 1, normed));
        if (c->layer_types[l] == QSA_LAYER_LINEAR) QSA__TRY(qsa__cuda_gdn_batch(m, l, B));
        else QSA__TRY(qsa__cuda_attn_batch(m, l, B));
        QSA__TRY(qsa__cuda_layer_mlp(m, l, B, &normed));
    }
    QSA__TRY(qsa__cuda_gres(m, &g->final_hc, s->X, B, 0, normed));
    /* one lm_head GEMM for the B rows (the GEMM's bits do not depend on M), or one per slice */
    int ns = qsa__logit_slices(m, B), W = qsa__logit_slice_w(V, ns);
    if (ns == 1) QSA__TRY(qsa__dgemm(g, s->inp16, B, &g->lm_head, g->batch->logits, 0));
    for (int c = 0; ns > 1 && c * W < V; c++) {
        qsa__dlin ws = qsa__dlin_rows(&g->lm_head, c * W, V - c * W < W ? V - c * W : W);
        QSA__TRY(qsa__dgemm(g, s->inp16, B, &ws, g->batch->logits + (size_t)c * W * B * 4, 0));
        CUevent ev = g->batch->lg_ev[c]; /* (qsa__prof_capturing: this thread is capturing the step's graph) */
        QSA__TRY(QSA__CU_R(qsa__prof_capturing ? qsa__cu.cuEventRecordWithFlags(ev, g->stream, QSA__CU_EVENT_RECORD_EXTERNAL)
                                               : qsa__cu.cuEventRecord(ev, g->stream)));
    }
    return qsa__tp_logits_gather(m, g->batch->logits, B); /* TP: all-gather the ranks' vocabulary rows (no-op on one GPU) */
}

/* Capture the step for B into a graph (once per B), with the collectives it records (TP). */
QSA_PRIV qsa_result qsa__cuda_batch_graph(qsa_model *m, int B, qsa__dgraph *out) {
    qsa__cuda *g = m->cuda;
    CUgraph graph = NULL;
    long long coll0 = g->n_coll, bytes0 = g->bytes_coll;
    QSA__CU(qsa__cu.cuStreamBeginCapture_v2(g->stream, QSA__CU_STREAM_CAPTURE_MODE_THREAD_LOCAL));
    qsa__prof_capturing = 1;
    qsa_result r = qsa__cuda_batch_forward(m, B);
    qsa__prof_capturing = 0;
    /* a capture sends nothing: what it recorded is counted at each launch */
    out->n_coll = g->n_coll - coll0;
    out->bytes_coll = g->bytes_coll - bytes0;
    g->n_coll = coll0;
    g->bytes_coll = bytes0;
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", r != QSA_OK ? qsa_last_error() : "");
    CUresult ce = qsa__cu.cuStreamEndCapture(g->stream, &graph); /* always leave capture mode */
    if (r == QSA_OK && ce != 0) r = QSA__CU_R(ce);
    if (r == QSA_OK) r = QSA__CU_R(qsa__cu.cuGraphInstantiateWithFlags(&out->exec, graph, 0));
    if (graph) qsa__cu.cuGraphDestroy(graph);
    if (r != QSA_OK) {
        if (!msg[0]) snprintf(msg, sizeof msg, "%s", qsa_last_error());
        return qsa__fail(r, "capturing the batched decode graph (B = %d): %s", B, msg);
    }
    qsa__log(QSA_LOG_INFO, "cuda: captured the batched decode step for %d sequences as a graph", B);
    return QSA_OK;
}

QSA_PRIV int qsa__cuda_graphs_on(const qsa_model *m) {
#ifdef QSA_DEBUG
    (void)m;
    return 0; /* debug builds synchronise after each launch, which a capture forbids */
#else
    return m->params.cuda_graphs;
#endif
}

/* TP: capture this rank's graph for B when a step of B has run eagerly and none is captured yet.
   qsa__tp_decode_batch runs it on every rank before the step itself. */
QSA_PRIV qsa_result qsa__cuda_batch_capture(qsa_model *m, int B) {
    qsa__cuda *g = m->cuda;
    if (!qsa__cuda_graphs_on(m) || B < 1 || B > m->params.max_batch || B > g->sc.max_tokens) return QSA_OK;
    QSA__CU(qsa__cu.cuCtxSetCurrent(g->ctx));
    QSA__TRY(qsa__cuda_batch_alloc(m));
    qsa__dgraph *gr = &g->batch->graphs[B];
    return gr->exec || !gr->warm ? QSA_OK : qsa__cuda_batch_graph(m, B, gr);
}

/* One decode step for B <= max_batch validated sequences of m (qsa_seq_feed_batch has checked the
   context and vocabulary and reserved the pages, and advances pos and tokens afterwards). */
/* The rows of a batched step's sampling on the device (qsa_k_sample_cand1, 2) into the batch's host image: 1 when every
   row's sampler can start from candidates (qsa__sampler_cand_k) and the penalised ids fit, 0 when the step's logits
   must come to the host instead.  A row's history is its sequence's tokens with this step's n tokens (tokens + i n,
   written past pos, where the step puts them: one a sequence in a decode step, a prompt chunk's in qsa__cuda_chunk). */
QSA_PRIV int qsa__cuda_cand_rows(qsa_model *m, qsa_seq **seqs, const int32_t *tokens, int n, int B, const qsa__cand_req *cq) {
    qsa__dbatch *bb = m->cuda->batch;
    int V = m->cfg.vocab_size, off = 0;
    qsa__cand_row *rows = (qsa__cand_row *)bb->cand_host;
    int32_t *pid = (int32_t *)(bb->cand_host + (size_t)bb->max_batch * sizeof(qsa__cand_row));
    for (int i = 0; i < B; i++) {
        qsa_sampler *smp = cq->smp[i];
        int k = smp ? qsa__sampler_cand_k(smp, V) : -1;
        if (k < 0 || k > cq->kmax) return 0;
        qsa_seq *sq = seqs[i];
        memcpy(sq->tokens + sq->pos, tokens + (size_t)i * n, sizeof(int32_t) * (size_t)n);
        char keep[sizeof qsa__err_buf]; /* (the caller's last error, as a step that succeeds leaves it) */
        snprintf(keep, sizeof keep, "%s", qsa__err_buf);
        int np = qsa__sampler_pen_ids(smp, sq->tokens, sq->pos + n, V, pid + off, QSA__CAND_PEN - off);
        if (np < 0) { /* (more ids than fit, or out of memory: the host's draw reports that) */
            snprintf(qsa__err_buf, sizeof qsa__err_buf, "%s", keep);
            return 0;
        }
        rows[i].temp = smp->p.temperature;
        rows[i].pen = smp->p.repetition_penalty;
        rows[i].k = k;
        rows[i].pen_off = off;
        rows[i].pen_n = np;
        rows[i].z = qsa__sampler_whole_z(smp, V);
        off += np;
    }
    return 1;
}

/* The sampling kernels (qsa_k_sample_cand1, qsa_k_sample_z, qsa_k_sample_cand2) on the stream for B rows of logits at lg
   (vocabulary slices of W columns), the rows' parameters and penalised ids in the batch's buffers (queued by the
   caller): the rows of candidates (B rows of QSA__CAND_STRIDE(kmax) words) after the rows' parameters in bb->cand; the
   tempered logits in v, rows of V, vr of them (launches of at most that many rows). */
QSA_PRIV qsa_result qsa__cuda_cand_launch(qsa_model *m, CUdeviceptr lg, int W, int B, int kmax, CUdeviceptr v, int vr) {
    qsa__cuda *g = m->cuda;
    qsa__dbatch *bb = g->batch;
    int V = m->cfg.vocab_size;
    const qsa__cand_row *hr = (const qsa__cand_row *)bb->cand_host;
    CUdeviceptr rows = bb->cand, pid = rows + (size_t)bb->max_batch * sizeof(qsa__cand_row),
                out = bb->cand + QSA__CAND_HOST_BYTES(bb->max_batch);
    /* rows in groups of QSA__CAND_GROUP (and of v's rows): their chunks' candidates, then theirs */
    int P = QSA__CAND_CHUNKS(V), G = vr < QSA__CAND_GROUP ? vr : QSA__CAND_GROUP, anyz = 0;
    CUdeviceptr am = bb->cand_part, cv = am + (size_t)G * P * 8, ci = cv + (size_t)G * P * QSA__CAND_MAX * 4,
                zp = ci + (size_t)G * P * QSA__CAND_MAX * 4;
    for (int i = 0; i < B; i++) anyz |= hr[i].z;
    for (int b0 = 0; b0 < B; b0 += G) {
        int nb = B - b0 < G ? B - b0 : G;
        QSA__LAUNCH(g, sample_cand1, P, nb, 1024, 0, &lg, &V, &W, &B, &b0, &rows, &pid, &v, &am, &cv, &ci, &kmax);
        if (anyz) QSA__LAUNCH(g, sample_z, P, nb, 1024, 0, &V, &b0, &rows, &v, &am, &zp);
        QSA__LAUNCH(g, sample_cand2, nb, 1, 1024, 0, &V, &b0, &P, &rows, &am, &cv, &ci, &zp, &out, &kmax);
    }
    return QSA_OK;
}
/* After the candidates of B rows have come to cq->out (the stream synchronised): whole-row draws whose candidates do
   not decide them get their logits (the penalty applied by qsa_k_sample_cand1) from lg (vocabulary slices of W
   columns) into lg_rows + i V, word 1 of the row -2. */
QSA_PRIV qsa_result qsa__cuda_cand_undecided(qsa_model *m, const qsa__cand_req *cq, CUdeviceptr lg, int W, int B,
                                             float *lg_rows) {
    qsa__cuda *g = m->cuda;
    const qsa__cand_row *hr = (const qsa__cand_row *)g->batch->cand_host;
    int V = m->cfg.vocab_size, sent = 0;
    for (int i = 0; i < B; i++) {
        int32_t *row = cq->out + (size_t)i * QSA__CAND_STRIDE(cq->kmax);
        if (!hr[i].z || row[1] <= 0) continue;
        char keep[sizeof qsa__err_buf]; /* (an allocation the check could not make: the host's draw reports it) */
        snprintf(keep, sizeof keep, "%s", qsa__err_buf);
        if (qsa__sampler_cand_decides(cq->smp[i], row, cq->kmax) > 0) continue;
        snprintf(qsa__err_buf, sizeof qsa__err_buf, "%s", keep);
        for (int c = 0; c * W < V; c++) {
            int wc = V - c * W < W ? V - c * W : W;
            QSA__CU(qsa__cu.cuMemcpyDtoHAsync_v2(lg_rows + (size_t)i * V + (size_t)c * W, lg + ((size_t)c * W * B + (size_t)i * wc) * 4,
                                                 (size_t)wc * 4, g->stream));
        }
        row[1] = -2;
        g->n_cand_whole++;
        sent = 1;
    }
    if (sent) QSA__CU(qsa__cu.cuStreamSynchronize(g->stream));
    return QSA_OK;
}
/* One row of logits at lg (the chunked forward's last) reduced to cq->out's first row of candidates (its parameters
   queued by qsa__cuda_cand_put; the batch's logits buffer holds its tempered logits), and its logits into lg_row where
   the candidates do not decide a whole-row draw (qsa__cuda_cand_undecided) */
QSA_PRIV qsa_result qsa__cuda_cand_one(qsa_model *m, CUdeviceptr lg, const qsa__cand_req *cq, float *lg_row) {
    qsa__cuda *g = m->cuda;
    qsa__dbatch *bb = g->batch;
    int V = m->cfg.vocab_size;
    QSA__TRY(qsa__cuda_cand_launch(m, lg, V, 1, cq->kmax, bb->logits, bb->max_batch));
    QSA__CU(qsa__cu.cuMemcpyDtoHAsync_v2(cq->out, bb->cand + QSA__CAND_HOST_BYTES(bb->max_batch),
                                         (size_t)QSA__CAND_STRIDE(cq->kmax) * 4, g->stream));
    QSA__CU(qsa__cu.cuStreamSynchronize(g->stream));
    g->n_cand_rows++;
    return qsa__cuda_cand_undecided(m, cq, lg, V, 1, lg_row);
}
/* The rows' parameters and penalised ids (qsa__cuda_cand_rows' host image, B rows) queued to the device */
QSA_PRIV qsa_result qsa__cuda_cand_put(qsa_model *m, int B) {
    qsa__cuda *g = m->cuda;
    qsa__dbatch *bb = g->batch;
    const qsa__cand_row *hr = (const qsa__cand_row *)bb->cand_host;
    size_t mb = (size_t)bb->max_batch;
    int npid = 0;
    for (int i = 0; i < B; i++) npid = hr[i].pen_off + hr[i].pen_n > npid ? hr[i].pen_off + hr[i].pen_n : npid;
    QSA__CU(qsa__cu.cuMemcpyHtoDAsync_v2(bb->cand, hr, (size_t)B * sizeof(qsa__cand_row), g->stream));
    if (npid)
        QSA__CU(qsa__cu.cuMemcpyHtoDAsync_v2(bb->cand + mb * sizeof(qsa__cand_row), bb->cand_host + mb * sizeof(qsa__cand_row),
                                             (size_t)npid * 4, g->stream));
    return QSA_OK;
}

QSA_PRIV qsa_result qsa__cuda_decode_batch(qsa_model *m, qsa_seq **seqs, const int32_t *tokens, int B, float *logits,
                                           int32_t *next, const qsa__cand_req *cq) {
    const qsa_model_config *c = &m->cfg;
    qsa__cuda *g = m->cuda;
    int L = c->num_hidden_layers, V = c->vocab_size, D = c->ple_embed_dim;
    if (B <= 0) return QSA_OK;
    QSA__INVARIANT(!cq || !next); /* (a step returns candidates or greedy ids, not both) */
    if (m->tp && next) return qsa__tp_decode_greedy(m, seqs, tokens, B, logits, next);
    if (m->tp) return qsa__tp_decode_batch(m, seqs, tokens, B, logits); /* every local rank runs this function on its view */
    if (B > m->params.max_batch || B > g->sc.max_tokens)
        return qsa__fail(QSA_ERR_INVALID_ARGUMENT, "batched decode: %d sequences exceed max_batch %d / max_chunk %d", B,
                         m->params.max_batch, g->sc.max_tokens);
    QSA__CU(qsa__cu.cuCtxSetCurrent(g->ctx));
    QSA__TRY(qsa__cuda_batch_alloc(m));
    qsa__dbatch *bb = g->batch;
    int mb = bb->max_batch;
    /* sampled rows reduced to their candidates on the device where every row of the step can be: no logits cross */
    int cand = cq && g->sample_dev && !m->tpr && qsa__cuda_cand_rows(m, seqs, tokens, 1, B, cq);
    float *lg_rows = cand ? logits : NULL; /* (whole-row draws that their candidates could not decide: their logits) */
    /* greedy ids: every row a greedy row of the same kernels (its arg-max alone) */
    int argmax = next && !m->tpr && !cand;
    qsa__cand_row *hr = (qsa__cand_row *)bb->cand_host;
    if (argmax) {
        memset(hr, 0, (size_t)B * sizeof *hr);
        for (int i = 0; i < B; i++) hr[i].pen = 1.0f;
    }
    if (cand || argmax) { /* the rows' parameters and penalised ids, queued before the step (a copy from pageable
                             memory waits for the stream: here it has nothing to wait for) */
        QSA__TRY(qsa__cuda_cand_put(m, B));
        if (cand) logits = NULL;
    }
    int32_t *hids = (int32_t *)bb->host, *hpos = hids + mb;
    unsigned long long *hbt = (unsigned long long *)(bb->host + (size_t)mb * 8), *hconv = hbt + mb, *hS = hconv + (size_t)L * mb,
                       *hple = hS + (size_t)L * mb, *hbk = hple + (size_t)L * mb;
    for (int i = 0; i < B; i++) {
        qsa_seq *sq = seqs[i];
        qsa__cuda_seq *cs = sq->cuda;
        /* block table: pages acquired since the last step (as qsa__cuda_chunk) */
        if (sq->n_pages > cs->bt_synced) {
            QSA__CU(qsa__cu.cuMemcpyHtoDAsync_v2(cs->bt + (size_t)cs->bt_synced * 4, sq->bt + cs->bt_synced,
                                                 (size_t)(sq->n_pages - cs->bt_synced) * 4, g->stream));
            cs->bt_synced = sq->n_pages;
        }
        hids[i] = tokens[i];
        hpos[i] = sq->pos;
        hbt[i] = cs->bt;
        for (int l = 0; l < L; l++) {
            hconv[(size_t)l * mb + i] = cs->conv[l];
            hS[(size_t)l * mb + i] = cs->S[l];
            hple[(size_t)l * mb + i] = cs->ple_conv[l];
            hbk[(size_t)l * mb + i] = cs->bkeys[l];
        }
    }
    /* PLE rows: hashed and gathered on the host per sequence (its own id history), as qsa__cuda_ple with M = 1 */
    int ctx = c->ngram_size - 1;
    for (int l = 0, j = 0; l < L; l++) {
        const qsa__ple_w *p = m->layers[l].ple;
        if (!p) continue;
        for (int i = 0; i < B; i++) {
            qsa__seq_layer *sl = &seqs[i]->L[l];
            int32_t hist[32];
            for (int k = 0; k < ctx; k++) hist[k] = sl->ple_ids[k];
            hist[ctx] = tokens[i];
            float *rows = bb->host_e + (size_t)j * mb * D;
            if (m->tpr) qsa__tp_ple_embed(m, p, hist, rows, i); /* TP: this rank's columns, rows of D / tp */
            else qsa__ple_embed(c, p, hist, rows + (size_t)i * D);
            for (int k = 0; k < ctx; k++) sl->ple_ids[k] = hist[k + 1];
        }
        j++;
    }
    /* per-step values: written into the fixed buffers before the kernels (never captured) */
    QSA__CU(qsa__cu.cuMemcpyHtoDAsync_v2(bb->step, bb->host, bb->step_bytes, g->stream));
    if (bb->n_ple) QSA__CU(qsa__cu.cuMemcpyHtoDAsync_v2(bb->ple_e, bb->host_e, (size_t)bb->n_ple * mb * D * 4, g->stream));
    int graphs = qsa__cuda_graphs_on(m);
    qsa__dgraph *gr = &bb->graphs[B];
    /* TP: qsa__tp_decode_batch has captured it (qsa__cuda_batch_capture) if B has run before.  On one GPU a
       step that cannot be captured runs eagerly (the same launches, the same bits), and B is not captured
       again while the step's buffers live: the failure is logged, not returned, so that serving goes on at the
       eager step's speed. */
    if (graphs && !gr->exec && !gr->eager && !m->tpr) {
        char keep[sizeof qsa__err_buf]; /* (the caller's last error, as a step that succeeds leaves it) */
        snprintf(keep, sizeof keep, "%s", qsa__err_buf);
        if (qsa__cuda_batch_graph(m, B, gr) != QSA_OK) {
            qsa__log(QSA_LOG_WARN, "cuda: %s; steps of %d sequences run without a graph", qsa_last_error(), B);
            snprintf(qsa__err_buf, sizeof qsa__err_buf, "%s", keep);
            gr->eager = 1;
        }
    }
    if (graphs && gr->exec) {
        QSA__CU(qsa__cu.cuGraphLaunch(gr->exec, g->stream));
        g->n_coll += gr->n_coll;
        g->bytes_coll += gr->bytes_coll;
    } else {
        QSA__TRY(qsa__cuda_batch_forward(m, B));
        gr->warm = 1;
    }
    int ns = qsa__logit_slices(m, B), W = qsa__logit_slice_w(V, ns);
    if (logits && m->tpr) QSA__TRY(qsa__tp_logits_out(m, B, logits)); /* TP: the gathered rows in vocabulary order */
    else if (logits && ns == 1) QSA__CU(qsa__cu.cuMemcpyDtoHAsync_v2(logits, bb->logits, (size_t)B * V * 4, g->stream));
    for (int c = 0; logits && ns > 1 && c * W < V; c++) { /* each slice as soon as it is written */
        int wc = V - c * W < W ? V - c * W : W;
        qsa__cu_memcpy2d cp;
        memset(&cp, 0, sizeof cp);
        cp.src_type = 2;
        cp.src_dev = bb->logits + (size_t)c * W * B * 4;
        cp.src_pitch = (size_t)wc * 4;
        cp.dst_type = 1;
        cp.dst_host = logits + (size_t)c * W;
        cp.dst_pitch = (size_t)V * 4;
        cp.width = (size_t)wc * 4;
        cp.height = (size_t)B;
        QSA__CU(qsa__cu.cuStreamWaitEvent(bb->copy, bb->lg_ev[c], 0));
        QSA__CU(qsa__cu.cuMemcpy2DAsync_v2(&cp, bb->copy));
    }
    int kmax = cand ? cq->kmax : 1;
    if (cand || argmax) { /* B rows of candidates (greedy: B ids instead of B rows of logits); the tempered logits of a
                             launch's rows in sc.logits (logit_rows of them) */
        CUdeviceptr out = bb->cand + QSA__CAND_HOST_BYTES(mb);
        QSA__TRY(qsa__cuda_cand_launch(m, bb->logits, W, B, kmax, g->sc.logits, g->sc.logit_rows));
        if (cand) {
            QSA__CU(qsa__cu.cuMemcpyDtoHAsync_v2(cq->out, out, (size_t)B * QSA__CAND_STRIDE(kmax) * 4, g->stream));
            g->n_cand_rows += B;
        } else { /* word 0 of each row: the ids */
            qsa__cu_memcpy2d cp;
            memset(&cp, 0, sizeof cp);
            cp.src_type = 2;
            cp.src_dev = out;
            cp.src_pitch = (size_t)QSA__CAND_STRIDE(1) * 4;
            cp.dst_type = 1;
            cp.dst_host = next;
            cp.dst_pitch = 4;
            cp.width = 4;
            cp.height = (size_t)B;
            QSA__CU(qsa__cu.cuMemcpy2DAsync_v2(&cp, g->stream));
        }
    }
    QSA__CU(qsa__cu.cuStreamSynchronize(g->stream));
    if (logits && ns > 1) QSA__CU(qsa__cu.cuStreamSynchronize(bb->copy));
    if (lg_rows) QSA__TRY(qsa__cuda_cand_undecided(m, cq, bb->logits, W, B, lg_rows));
    /* the sequences' host-side layer state, as qsa_seq_feed leaves it */
    int r = c->has_qsa ? c->indexer_compress_ratio : 0;
    for (int i = 0; r && i < B; i++)
        for (int l = 0; l < L; l++)
            if (c->layer_types[l] != QSA_LAYER_LINEAR) seqs[i]->L[l].n_blocks = (seqs[i]->pos + 1) / r;
    return QSA_OK;
}

#undef QSA__BROW

#endif /* QSA_NO_CUDA */

/* ============================================================================================== */
/* >>host-memory  page-locked host buffers for what the device copies out                         */
/* ============================================================================================== */

/* qsa_host_alloc's blocks: a header of QSA__HOST_HDR bytes, then the caller's bytes.  A page-locked
   block holds a reference to its device's primary context (the model's), so it outlives the model. */
#define QSA__HOST_HDR 64
#define QSA__HOST_MAGIC 0x71736168u /* "qsah" */
typedef struct {
    unsigned magic;
    int pinned; /* cuMemHostAlloc'd in the primary context of device dev, which it retains */
    int dev;
    size_t bytes;
    void *ctx;
} qsa__host_hdr;
QSA_IMPL void *qsa_host_alloc(const qsa_model *m, size_t bytes) {
    if (!m || bytes == 0) {
        qsa__fail(QSA_ERR_INVALID_ARGUMENT, "qsa_host_alloc: %s", m ? "0 bytes" : "no model");
        return NULL;
    }
    if (bytes > SIZE_MAX - QSA__HOST_HDR) {
        qsa__fail(QSA_ERR_OUT_OF_MEMORY, "qsa_host_alloc: %zu bytes do not fit a size_t with the header", bytes);
        return NULL;
    }
    size_t total = bytes + QSA__HOST_HDR;
    qsa__host_hdr *h = NULL;
#ifndef QSA_NO_CUDA
    if (m->cuda) {
        CUcontext ctx = NULL;
        void *p = NULL;
        if (qsa__cu.cuDevicePrimaryCtxRetain(&ctx, m->cuda->dev) == 0) {
            if (qsa__cu.cuCtxSetCurrent(ctx) == 0 && qsa__cu.cuMemHostAlloc(&p, total, QSA__CU_MEMHOSTALLOC_PORTABLE) == 0) {
                h = (qsa__host_hdr *)p;
                h->pinned = 1;
                h->dev = m->cuda->dev;
                h->ctx = ctx;
            } else {
                qsa__cu.cuDevicePrimaryCtxRelease_v2(m->cuda->dev);
            }
        }
        if (!h) qsa__log(QSA_LOG_WARN, "qsa_host_alloc: page-locking %zu bytes failed: pageable memory instead", bytes);
    }
#endif
    if (!h) {
        h = (qsa__host_hdr *)qsa__malloc(total);
        if (!h) {
            qsa__fail(QSA_ERR_OUT_OF_MEMORY, "qsa_host_alloc: out of memory for %zu bytes", bytes);
            return NULL;
        }
        h->pinned = 0;
        h->dev = 0;
        h->ctx = NULL;
    }
    h->magic = QSA__HOST_MAGIC;
    h->bytes = bytes;
    return (char *)h + QSA__HOST_HDR;
}
QSA_IMPL void qsa_host_free(void *p) {
    if (!p) return;
    qsa__host_hdr *h = (qsa__host_hdr *)((char *)p - QSA__HOST_HDR);
    if (h->magic != QSA__HOST_MAGIC) {
        qsa__log(QSA_LOG_ERROR, "qsa_host_free: %p is not a live block of qsa_host_alloc (not freed)", p);
        return;
    }
    h->magic = 0u;
#ifndef QSA_NO_CUDA
    if (h->pinned) {
        int dev = h->dev;
        qsa__cu.cuCtxSetCurrent((CUcontext)h->ctx);
        qsa__cu.cuMemFreeHost(h);
        qsa__cu.cuDevicePrimaryCtxRelease_v2(dev);
        return;
    }
#endif
    qsa__free(h);
}

/* ============================================================================================== */
/* >>tp  tensor-parallel ranks: each rank's view of the model, the NCCL group, the reductions     */
/* ============================================================================================== */
/* A rank runs the single-GPU forward of >>cuda unchanged on its *view* of the model: a qsa_model
   whose config has the rank's local dimensions (query / KV heads, GDN key and value heads, expert
   and shared-expert widths divided by tp) and whose weights are the rank's slices (qsa_tp_slice_for).
   The host model is bound as every load binds it (qsa_model.bind_file): dense matrices stay in the
   mapped checkpoint.  A replicated one is uploaded by each rank from there; each rank's view converts
   its slices of a split one from the mapping into fp32 host copies, which rank bring-up uploads and
   frees; split vectors are cut from their fp32 copies; NVFP4 slices are views into the mapping or
   copies of its bytes.  (A host model bound whole in fp32, as the tests build it, is sliced in memory
   instead: the same bits.)  The
   forward leaves a partial sum at three kinds of points and calls a hook there (a no-op without
   TP, so one GPU runs exactly as before):
     qsa__tp_reduce    after the mixer's o_proj / out_proj and after the MoE (routed experts +
                       gated shared expert, summed locally): ncclAllGather of the fp32 partials
                       into [tp][M*H], then qsa_k_tp_sum adds them in rank order 0..tp-1;
     qsa__tp_ple_rows  the PLE rows: each rank gathers its columns of every head's row from the
                       host table, all-gathers them, qsa_k_tp_ple_unshard restores the row order;
     qsa__tp_logits    the vocab-parallel lm_head: each rank's rows padded to ceil(V/tp), all-gathered,
                       copied into the caller's [rows][V] in vocab order.
   Everything else (embedding, hyper-connections, router, indexer, norms) is replicated and computed
   identically on every rank, so every rank holds the same bits after every reduction.  The batched
   decode step (qsa_seq_feed_batch) calls the same hooks over its B rows on every rank
   (qsa__tp_decode_batch; the PLE columns and the logits through qsa__tp_ple_gather and
   qsa__tp_logits_gather), and each rank captures and replays it as its own CUDA graph, NCCL calls
   included (>>cuda, batched decode).

   One process: a host thread per local GPU (qsa__tp_worker), each with its own context and stream
   (its view's backend); the communicators come from ncclCommInitAll.  Several processes: one rank
   per process, the communicator from ncclCommInitRank with the unique id passed through a file. */

/* Host copies made for a rank's slices. */
typedef struct qsa__tp_own {
    void **p;
    int n, cap;
    size_t bytes; /* their sizes, summed: a rank's host memory for weights, which the tests hold to the plan */
} qsa__tp_own;

QSA_PRIV void *qsa__tp_keep(qsa__tp_own *o, void *p, size_t bytes) {
    if (!p) return NULL;
    if (o->n == o->cap) {
        int cap = o->cap ? 2 * o->cap : 64;
        void **a = (void **)qsa__realloc(o->p, sizeof(void *) * (size_t)cap);
        if (!a) { qsa__free(p); return NULL; }
        o->p = a;
        o->cap = cap;
    }
    o->p[o->n++] = p;
    o->bytes += bytes;
    return p;
}

QSA_PRIV void qsa__tp_own_free(qsa__tp_own *o) {
    for (int i = 0; i < o->n; i++) qsa__free(o->p[i]);
    qsa__free(o->p);
    memset(o, 0, sizeof *o);
}

/* The config a rank sees: its share of every split dimension (qsa_tp_check has accepted tp). */
QSA_PRIV void qsa__tp_local_config(const qsa_model_config *c, int tp, qsa_model_config *lc) {
    *lc = *c;
    lc->num_attention_heads = c->num_attention_heads / tp;
    lc->num_key_value_heads = c->num_key_value_heads >= tp ? c->num_key_value_heads / tp : 1;
    lc->linear_num_key_heads = c->linear_num_key_heads / tp;
    lc->linear_num_value_heads = c->linear_num_value_heads / tp;
    lc->moe_intermediate_size = c->moe_intermediate_size / tp;
    lc->shared_expert_intermediate_size = c->shared_expert_intermediate_size / tp;
}

/* Rows of a row-major array (row_bytes each) listed by the runs of `sl`, padded with zero rows to
   `pad_rows`: a view when that is one run and no padding, else a copy kept in `o`. */
QSA_PRIV const void *qsa__tp_rows(qsa__tp_own *o, const void *base, size_t row_bytes, const qsa_tp_slice *sl, int64_t pad_rows) {
    int64_t rows = sl->count > pad_rows ? sl->count : pad_rows;
    if (sl->n_runs == 1 && rows == sl->count) return (const char *)base + (size_t)sl->run_begin[0] * row_bytes;
    char *d = (char *)qsa__tp_keep(o, qsa__calloc((size_t)rows, row_bytes), (size_t)rows * row_bytes);
    if (!d) return NULL;
    for (int i = 0, at = 0; i < sl->n_runs; at += (int)sl->run_count[i], i++)
        memcpy(d + (size_t)at * row_bytes, (const char *)base + (size_t)sl->run_begin[i] * row_bytes,
               (size_t)sl->run_count[i] * row_bytes);
    return d;
}

/* Columns of a row-major [rows][row_bytes] array: the runs of `sl`, in logical columns `per` times the
   slice's units, where `per_elem` logical columns share one stored element of `esz` bytes; zero
   columns after them up to pad_cols logical columns. */
QSA_PRIV const void *qsa__tp_cols(qsa__tp_own *o, const void *base, int64_t rows, size_t row_bytes, const qsa_tp_slice *sl,
                                  int per, int per_elem, size_t esz, int64_t pad_cols) {
    int64_t cols = sl->count * per > pad_cols ? sl->count * per : pad_cols;
    size_t out_row = (size_t)(cols / per_elem) * esz;
    char *d = (char *)qsa__tp_keep(o, qsa__calloc((size_t)rows, out_row), (size_t)rows * out_row);
    if (!d) return NULL;
    for (int64_t r = 0; r < rows; r++) {
        const char *src = (const char *)base + (size_t)r * row_bytes;
        char *dst = d + (size_t)r * out_row;
        for (int i = 0; i < sl->n_runs; i++) {
            size_t b = (size_t)(sl->run_begin[i] * per / per_elem) * esz, n = (size_t)(sl->run_count[i] * per / per_elem) * esz;
            memcpy(dst, src + b, n);
            dst += n;
        }
    }
    return d;
}

/* The same two layouts converted to fp32 straight from a mapped checkpoint tensor `t` (F32/F16/BF16,
   element by element as qsa__load_f32 converts it, so the bits equal a slice of the whole fp32
   tensor), whose rows of `row_len` elements are counted from row `row0` (an expert of a fused tensor). */
QSA_PRIV const float *qsa__tp_rows_st(qsa__tp_own *o, const qsa__tensor *t, int64_t row0, size_t row_len, const qsa_tp_slice *sl,
                                      int64_t pad_rows) {
    int64_t rows = sl->count > pad_rows ? sl->count : pad_rows;
    size_t n_out = (size_t)rows * row_len, at = 0;
    float *d = (float *)qsa__tp_keep(o, qsa__calloc(n_out, sizeof(float)), n_out * sizeof(float));
    if (!d) return NULL;
    for (int i = 0; i < sl->n_runs; i++) {
        size_t src = (size_t)(row0 + sl->run_begin[i]) * row_len, n = (size_t)sl->run_count[i] * row_len;
        qsa__tensor_to_f32_range(t, src, n, d + at);
        at += n;
    }
    return d;
}

QSA_PRIV const float *qsa__tp_cols_st(qsa__tp_own *o, const qsa__tensor *t, int64_t row0, int64_t rows, size_t in,
                                      const qsa_tp_slice *sl, int per, int64_t pad_cols) {
    int64_t cols = sl->count * per > pad_cols ? sl->count * per : pad_cols;
    size_t n_out = (size_t)rows * (size_t)cols;
    float *d = (float *)qsa__tp_keep(o, qsa__calloc(n_out, sizeof(float)), n_out * sizeof(float));
    if (!d) return NULL;
    for (int64_t r = 0; r < rows; r++) {
        size_t src = (size_t)(row0 + r) * in;
        float *dst = d + (size_t)r * (size_t)cols;
        for (int i = 0; i < sl->n_runs; i++) {
            size_t b = (size_t)(sl->run_begin[i] * per), n = (size_t)(sl->run_count[i] * per);
            qsa__tensor_to_f32_range(t, src + b, n, dst);
            dst += n;
        }
    }
    return d;
}

/* What one rank's slices are cut from: the host model's tensors, sliced in memory (views or copies) or,
   for a matrix left in the mapped file, converted slice by slice from there (no process ever holds it
   whole in fp32). */
typedef struct qsa__tp_cut {
    const qsa_model_config *c;
    int tp, rank;
    qsa__tp_own *o; /* the rank's host copies */
} qsa__tp_cut;

#define QSA__TP_OOM(p) do { if (!(p)) return qsa__fail(QSA_ERR_OUT_OF_MEMORY, "tp: out of host memory for the slices of rank %d", rank); } while (0)

/* Rank x->rank's slice of the linear map `base` (a checkpoint name without ".weight").  ROWS: the
   rank's output rows, padded with zero rows to `pad` (the lm_head to ceil(V/tp); expert gate/up to a
   multiple of 16); COLS: its input columns, padded with zero columns to `pad` (expert down), the bias
   kept by rank 0 only (it is added once, before the reduction).  Zero padding adds exact zeros.
   A dense weight left in the file (full->src) is converted from there, its rows counted from its
   offset (an expert of a fused tensor). */
QSA_PRIV qsa_result qsa__tp_lin(const qsa__tp_cut *x, const char *base, const qsa__lin *full, int64_t pad, qsa__lin *out) {
    int rank = x->rank;
    int64_t pad_rows = pad;
    char name[320];
    qsa_tp_slice sl;
    qsa__tp_own *o = x->o;
    *out = *full;
    if (!full->out) return QSA_OK; /* absent (the final mixer has no injection) */
    snprintf(name, sizeof name, "%s.weight", base);
    QSA__TRY(qsa_tp_slice_for(x->c, x->tp, rank, name, &sl));
    int in = full->in;
    if (sl.kind == QSA_TP_REPLICATED) return QSA_OK;
    if (!full->w && !full->q && (!full->src || in <= 0)) return qsa__fail(QSA_ERR_INTERNAL, "tp: %s: no weights bound", name);
    const qsa__tensor *src = full->src;
    int64_t row0 = src ? (int64_t)(full->src_off / (size_t)in) : 0;
    out->src = NULL; /* a slice is a host copy */
    out->src_off = 0;
    if (sl.kind == QSA_TP_ROWS) {
        out->out = (int)(sl.count > pad_rows ? sl.count : pad_rows);
        if (full->w) QSA__TP_OOM(out->w = (const float *)qsa__tp_rows(o, full->w, (size_t)in * 4, &sl, pad_rows));
        else if (full->q) {
            QSA__TP_OOM(out->q = (const uint8_t *)qsa__tp_rows(o, full->q, (size_t)in / 2, &sl, pad_rows));
            QSA__TP_OOM(out->qscale = (const uint8_t *)qsa__tp_rows(o, full->qscale, (size_t)in / 16, &sl, pad_rows));
        } else QSA__TP_OOM(out->w = qsa__tp_rows_st(o, src, row0, (size_t)in, &sl, pad_rows));
        if (full->bias) QSA__TP_OOM(out->bias = (const float *)qsa__tp_rows(o, full->bias, 4, &sl, pad_rows));
        return QSA_OK;
    }
    /* COLS: the slice is in the units of the tensor as the config describes it (packed bytes when the
       config quantises it): per = logical columns per unit */
    int per = (int)(in / sl.global[1]);
    if (per < 1 || (int64_t)per * sl.global[1] != in)
        return qsa__fail(QSA_ERR_SHAPE, "tp: %s: %d input columns, the plan expects %lld", name, in, (long long)sl.global[1]);
    out->in = (int)(sl.count * per > pad ? sl.count * per : pad);
    if (full->w) QSA__TP_OOM(out->w = (const float *)qsa__tp_cols(o, full->w, full->out, (size_t)in * 4, &sl, per, 1, 4, pad));
    else if (full->q) {
        if (out->in % 16) return qsa__fail(QSA_ERR_SHAPE, "tp: %s: %d NVFP4 columns per rank split a 16-column group", name, out->in);
        QSA__TP_OOM(out->q = (const uint8_t *)qsa__tp_cols(o, full->q, full->out, (size_t)in / 2, &sl, per, 2, 1, pad));
        QSA__TP_OOM(out->qscale = (const uint8_t *)qsa__tp_cols(o, full->qscale, full->out, (size_t)in / 16, &sl, per, 16, 1, pad));
    } else QSA__TP_OOM(out->w = qsa__tp_cols_st(o, src, row0, full->out, (size_t)in, &sl, per, pad));
    if (rank != 0) out->bias = NULL;
    return QSA_OK;
}

/* Rows of a float tensor `name` of the plan (conv1d channels, A_log, dt_bias: fp32 copies) with row_len
   floats per row. */
QSA_PRIV qsa_result qsa__tp_vec(const qsa__tp_cut *x, const char *name, const float *full, int row_len, const float **out) {
    int rank = x->rank;
    qsa_tp_slice sl;
    QSA__TRY(qsa_tp_slice_for(x->c, x->tp, rank, name, &sl));
    *out = full;
    if (sl.kind == QSA_TP_REPLICATED) return QSA_OK;
    if (sl.kind != QSA_TP_ROWS) return qsa__fail(QSA_ERR_INTERNAL, "tp: %s: expected a row split", name);
    if (!full) return qsa__fail(QSA_ERR_INTERNAL, "tp: %s: not bound", name);
    QSA__TP_OOM(*out = (const float *)qsa__tp_rows(x->o, full, (size_t)row_len * 4, &sl, 0));
    return QSA_OK;
}

/* Rows (vocabulary entries) of the lm_head that `rank` holds: [*begin, *begin + *count). */
QSA_PRIV qsa_result qsa__tp_vocab_rows(const qsa_model_config *c, int tp, int rank, int64_t *begin, int64_t *count) {
    qsa_tp_slice sl;
    QSA__TRY(qsa_tp_slice_for(c, tp, rank, "lm_head.weight", &sl));
    *begin = sl.kind == QSA_TP_ROWS ? sl.begin : 0;
    *count = sl.kind == QSA_TP_ROWS ? sl.count : c->vocab_size;
    return QSA_OK;
}

/* qsa__tp_lin (no padding) and qsa__tp_vec of the tensor "<b>.<leaf>" */
QSA_PRIV qsa_result qsa__tp_lin_in(const qsa__tp_cut *x, const char *b, const char *leaf, const qsa__lin *full,
                                   qsa__lin *out) {
    char name[200];
    snprintf(name, sizeof name, "%s.%s", b, leaf);
    return qsa__tp_lin(x, name, full, 0, out);
}
QSA_PRIV qsa_result qsa__tp_vec_in(const qsa__tp_cut *x, const char *b, const char *leaf, const float *full, int row_len,
                                   const float **out) {
    char name[200];
    snprintf(name, sizeof name, "%s.%s", b, leaf);
    return qsa__tp_vec(x, name, full, row_len, out);
}

/* Rank `rank`'s view of the loaded model m: local config, sliced weights (views into m or copies in
   `copies`), its own KV-pool geometry; the tokenizer, checkpoint mapping, PLE tables and replicated
   weights are m's, shared read-only.  `keep` receives the view's own arrays (layers, expert tables).
   Slices of the matrices left in the file are converted here from the mapping, once per rank that holds
   them.
   The view has no backend; it is never passed to qsa_model_free. */
QSA_PRIV qsa_result qsa__tp_view(const qsa_model *m, int tp, int rank, qsa__tp_own *copies, qsa__tp_own *keep, qsa_model *v) {
    const qsa_model_config *c = &m->cfg;
    int L = c->num_hidden_layers, E = c->num_experts;
    char b[96], name[200];
    QSA__TRY(qsa_tp_check(c, tp));
    if (rank < 0 || rank >= tp) return qsa__fail(QSA_ERR_INVALID_ARGUMENT, "tp: rank %d outside 0..%d", rank, tp - 1);
    qsa__tp_cut x;
    x.c = c;
    x.tp = tp;
    x.rank = rank;
    x.o = copies;
    memcpy(v, m, sizeof *v);
    v->cuda = NULL;
    v->tp = NULL;
    v->tpr = NULL;
    v->owned = NULL;
    v->n_owned = v->cap_owned = 0;
    qsa__tp_local_config(c, tp, &v->cfg);
    v->pool.kvd = v->cfg.num_key_value_heads * c->head_dim;
    int64_t vmax = ((int64_t)c->vocab_size + tp - 1) / tp;
    QSA__TRY(qsa__tp_lin(&x, "lm_head", &m->lm_head, vmax, &v->lm_head));
    qsa__layer_w *lw = (qsa__layer_w *)qsa__tp_keep(keep, qsa__calloc((size_t)L, sizeof(qsa__layer_w)), (size_t)L * sizeof(qsa__layer_w));
    QSA__TP_OOM(lw);
    v->layers = lw;
    for (int l = 0; l < L; l++) {
        const qsa__layer_w *f = &m->layers[l];
        qsa__layer_w *d = &lw[l];
        *d = *f; /* hyper-connections, PLE: replicated */
        if (f->type == QSA_LAYER_LINEAR) {
            int kc = c->linear_conv_kernel_dim;
            snprintf(b, sizeof b, "layers.%d.linear_attn", l);
            QSA__TRY(qsa__tp_lin_in(&x, b, "in_proj_qkv", &f->gdn.in_qkv, &d->gdn.in_qkv));
            QSA__TRY(qsa__tp_lin_in(&x, b, "in_proj_z", &f->gdn.in_z, &d->gdn.in_z));
            QSA__TRY(qsa__tp_lin_in(&x, b, "in_proj_b", &f->gdn.in_b, &d->gdn.in_b));
            QSA__TRY(qsa__tp_lin_in(&x, b, "in_proj_a", &f->gdn.in_a, &d->gdn.in_a));
            QSA__TRY(qsa__tp_lin_in(&x, b, "out_proj", &f->gdn.out, &d->gdn.out));
            QSA__TRY(qsa__tp_vec_in(&x, b, "conv1d.weight", f->gdn.conv_w, kc, &d->gdn.conv_w));
            QSA__TRY(qsa__tp_vec_in(&x, b, "A_log", f->gdn.A_log, 1, &d->gdn.A_log));
            QSA__TRY(qsa__tp_vec_in(&x, b, "dt_bias", f->gdn.dt_bias, 1, &d->gdn.dt_bias));
        } else {
            snprintf(b, sizeof b, "layers.%d.self_attn", l);
            QSA__TRY(qsa__tp_lin_in(&x, b, "q_proj", &f->attn.q, &d->attn.q));
            QSA__TRY(qsa__tp_lin_in(&x, b, "k_proj", &f->attn.k, &d->attn.k));
            QSA__TRY(qsa__tp_lin_in(&x, b, "v_proj", &f->attn.v, &d->attn.v));
            QSA__TRY(qsa__tp_lin_in(&x, b, "o_proj", &f->attn.o, &d->attn.o));
        }
        snprintf(b, sizeof b, "layers.%d.mlp", l);
        /* the MoE kernels work on tiles of 16 intermediate columns (docs/CUDA.md): a rank's share that is not a
           multiple of 16 (only in small models; NVFP4 experts always split into whole groups) is padded with
           zero gate/up rows and zero down columns, whose products add exact zeros */
        int64_t Ipad = (v->cfg.moe_intermediate_size + 15) / 16 * 16;
        size_t tbl = (size_t)E * sizeof(qsa__lin);
        d->moe.gate = (qsa__lin *)qsa__tp_keep(keep, qsa__calloc((size_t)E, sizeof(qsa__lin)), tbl);
        d->moe.up = (qsa__lin *)qsa__tp_keep(keep, qsa__calloc((size_t)E, sizeof(qsa__lin)), tbl);
        d->moe.down = (qsa__lin *)qsa__tp_keep(keep, qsa__calloc((size_t)E, sizeof(qsa__lin)), tbl);
        QSA__TP_OOM(d->moe.gate && d->moe.up && d->moe.down);
        /* (fused experts left in the file: each expert's lin carries its rows' offset, qsa__load_moe) */
        for (int e = 0; e < E; e++) {
            snprintf(name, sizeof name, "%s.experts.%d.gate_proj", b, e);
            QSA__TRY(qsa__tp_lin(&x, name, &f->moe.gate[e], Ipad, &d->moe.gate[e]));
            snprintf(name, sizeof name, "%s.experts.%d.up_proj", b, e);
            QSA__TRY(qsa__tp_lin(&x, name, &f->moe.up[e], Ipad, &d->moe.up[e]));
            snprintf(name, sizeof name, "%s.experts.%d.down_proj", b, e);
            QSA__TRY(qsa__tp_lin(&x, name, &f->moe.down[e], Ipad, &d->moe.down[e]));
        }
        QSA__TRY(qsa__tp_lin_in(&x, b, "shared_expert.gate_proj", &f->moe.sh_gate, &d->moe.sh_gate));
        QSA__TRY(qsa__tp_lin_in(&x, b, "shared_expert.up_proj", &f->moe.sh_up, &d->moe.sh_up));
        QSA__TRY(qsa__tp_lin_in(&x, b, "shared_expert.down_proj", &f->moe.sh_down, &d->moe.sh_down));
    }
    v->cfg.moe_intermediate_size = (v->cfg.moe_intermediate_size + 15) / 16 * 16;
    return QSA_OK;
}

/* Columns of every PLE head's row that `rank` gathers: [*col0, *col0 + *ncols) (0, dh without PLE layers). */
QSA_PRIV qsa_result qsa__tp_ple_cols(const qsa_model_config *c, int tp, int rank, int *col0, int *ncols) {
    *col0 = 0;
    *ncols = 0;
    if (!c->n_ple_layers) return QSA_OK;
    char name[160];
    qsa_tp_slice sl;
    snprintf(name, sizeof name, "layers.%d.ple.ple_embedding.ngram_embedding.weight", c->ple_layer_ids[0] - 1);
    QSA__TRY(qsa_tp_slice_for(c, tp, rank, name, &sl));
    *col0 = sl.kind == QSA_TP_COLS ? (int)sl.begin : 0;
    *ncols = (int)(sl.kind == QSA_TP_COLS ? sl.count : sl.global[1]);
    return QSA_OK;
}

/* ---- the rendezvous file of a multi-process group: "QSATPID1" + the NCCL unique id ---- */

/* Write `n` bytes of id to `path` atomically (a temporary name, then rename). */
QSA_PRIV qsa_result qsa__tp_id_publish(const char *path, const void *id, size_t n) {
    size_t cap = strlen(path) + 32; /* (the temporary name beside the file, whatever the path's length) */
    char *tmp = QSA__ALLOC(char, cap);
    if (!tmp) return qsa__fail(QSA_ERR_OUT_OF_MEMORY, "tp rendezvous: out of memory");
    snprintf(tmp, cap, "%s.%ld.tmp", path, (long)getpid());
    FILE *f = fopen(tmp, "wb");
    qsa_result r = QSA_OK;
    if (!f) r = qsa__fail(QSA_ERR_IO, "tp rendezvous: cannot create %s: %s", tmp, strerror(errno));
    else {
        int ok = fwrite("QSATPID1", 1, 8, f) == 8 && fwrite(id, 1, n, f) == n;
        if (fclose(f) != 0) ok = 0;
        if (!ok || rename(tmp, path) != 0) {
            r = qsa__fail(QSA_ERR_IO, "tp rendezvous: cannot write %s: %s", path, strerror(errno));
            remove(tmp);
        }
    }
    qsa__free(tmp);
    return r;
}

/* Wait up to timeout_s for `path` to hold an id of `n` bytes, then read it.  The file is opened
   without blocking and must be a regular file (a FIFO there blocked fopen past the timeout); a path
   that can never become one fails at once, and the timeout names what was last seen there. */
QSA_PRIV qsa_result qsa__tp_id_wait(const char *path, void *id, size_t n, double timeout_s) {
    double t0 = qsa__now();
    char buf[8 + 256 + 1];
    if (n > 256) return qsa__fail(QSA_ERR_INTERNAL, "tp rendezvous: id of %zu bytes", n);
    char seen[160] = "no such file";
    for (;;) {
        int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
        if (fd < 0) {
            int e = errno;
            if (e == ENOTDIR || e == EACCES || e == ELOOP || e == ENAMETOOLONG)
                return qsa__fail(QSA_ERR_IO, "tp rendezvous: cannot read %s: %s", path, strerror(e));
            if (e != ENOENT) snprintf(seen, sizeof seen, "open: %s", strerror(e));
        } else {
            struct stat st;
            int reg = fstat(fd, &st) == 0 && S_ISREG(st.st_mode);
            ssize_t got = 0; /* up to one byte past the id (a longer file is not ours); -1: a read error */
            while (reg && (size_t)got < 8 + n + 1) {
                ssize_t k = read(fd, buf + got, 8 + n + 1 - (size_t)got);
                if (k < 0 && errno == EINTR) continue;
                if (k <= 0) { got = k < 0 ? -1 : got; break; }
                got += k;
            }
            int read_errno = errno;
            close(fd);
            if (!reg) return qsa__fail(QSA_ERR_IO, "tp rendezvous: %s is not a regular file", path);
            if (got == (ssize_t)(8 + n) && !memcmp(buf, "QSATPID1", 8)) {
                memcpy(id, buf + 8, n);
                return QSA_OK;
            }
            if (got >= 8 && memcmp(buf, "QSATPID1", 8))
                return qsa__fail(QSA_ERR_FORMAT, "tp rendezvous: %s is not a rendezvous file", path);
            if (got < 0) snprintf(seen, sizeof seen, "read: %s", strerror(read_errno));
            else if ((size_t)got > 8 + n) snprintf(seen, sizeof seen, "a file of more than %zu bytes, expected %zu", 8 + n, 8 + n);
            else snprintf(seen, sizeof seen, "a file of %zd bytes, expected %zu", got, 8 + n);
        }
        if (qsa__now() - t0 > timeout_s)
            return qsa__fail(QSA_ERR_IO, "tp rendezvous: no id in %s after %.0f s (last seen there: %s; is rank 0 running, with the "
                             "same path?)", path, timeout_s, seen);
        struct timespec ts = {0, 10 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
}

/* ---- the rendezvous over TCP: rank 0 serves the id on tcp://HOST:PORT, the others fetch it ----
   rank r -> rank 0:  "QSATPID1", tp, r                   16 bytes (integers 32-bit big-endian)
   rank 0 -> rank r:  "QSATPID1", tp, the 128-byte id     140 bytes (the id zeroed when the tp differ)
   rank r -> rank 0:  "QSATPACK"                          8 bytes: rank r holds the id
   Rank 0 moves every connection along at once (poll), counts each rank once, and returns only when
   ranks 1..tp-1 have all acknowledged, so no rank is left connecting to a closed port.  A connection
   that sends anything else, or nothing, is dropped without touching the others; out of descriptors,
   rank 0 pauses accepting for a tick.  Sockets are non-blocking and close-on-exec; sends never raise
   SIGPIPE. */

#define QSA__RDV_ID 128
#define QSA__RDV_HELLO 16
#define QSA__RDV_REPLY (12 + QSA__RDV_ID)
#define QSA__RDV_CONNS 64   /* connections rank 0 serves at once; later ones wait in the listen queue */
#define QSA__RDV_CONN_S 10. /* a connection still unfinished after this long is dropped (a rank takes milliseconds) */

typedef struct qsa__tp_rdv_addr {
    char host[256]; /* a name or a numeric address, without the brackets of an IPv6 literal */
    char port[8];
} qsa__tp_rdv_addr;

QSA_PRIV int qsa__tp_rdv_is_tcp(const char *spec) { return spec && !strncmp(spec, "tcp://", 6); }

/* Split "tcp://HOST:PORT" (HOST a name, an IPv4 literal, [an IPv6 literal]; "*" for rank 0: every IPv4
   interface, as 0.0.0.0).  `serving`: the address rank 0 listens on, else the one the others connect to. */
QSA_PRIV qsa_result qsa__tp_rdv_parse(const char *spec, int serving, qsa__tp_rdv_addr *a) {
    const char *h = spec + 6, *colon;
    size_t hn;
    memset(a, 0, sizeof *a);
    if (*h == '[') {
        const char *close = strchr(h, ']');
        if (!close) return qsa__fail(QSA_ERR_INVALID_ARGUMENT, "tp rendezvous %.300s: no ']' after the IPv6 address (tcp://[ADDR]:PORT)", spec);
        h++;
        hn = (size_t)(close - h);
        colon = close + 1;
        if (*colon != ':') return qsa__fail(QSA_ERR_INVALID_ARGUMENT, "tp rendezvous %.300s: no port (tcp://[ADDR]:PORT)", spec);
    } else {
        colon = strrchr(h, ':');
        if (!colon) return qsa__fail(QSA_ERR_INVALID_ARGUMENT, "tp rendezvous %.300s: no port (tcp://HOST:PORT)", spec);
        hn = (size_t)(colon - h);
        if (memchr(h, ':', hn))
            return qsa__fail(QSA_ERR_INVALID_ARGUMENT, "tp rendezvous %.300s: an IPv6 address goes in brackets (tcp://[ADDR]:PORT)", spec);
    }
    if (hn == 0) return qsa__fail(QSA_ERR_INVALID_ARGUMENT, "tp rendezvous %.300s: empty host (tcp://HOST:PORT)", spec);
    if (hn >= sizeof a->host) return qsa__fail(QSA_ERR_INVALID_ARGUMENT, "tp rendezvous %.300s: host longer than 255 characters", spec);
    const char *p = colon + 1;
    size_t pn = strlen(p);
    long port = pn >= 1 && pn <= 5 && strspn(p, "0123456789") == pn ? strtol(p, NULL, 10) : -1;
    if (port < 1 || port > 65535)
        return qsa__fail(QSA_ERR_INVALID_ARGUMENT, "tp rendezvous %.300s: port '%.20s' is not a number in 1..65535", spec, p);
    memcpy(a->host, h, hn);
    snprintf(a->port, sizeof a->port, "%ld", port);
    if (!strcmp(a->host, "*")) {
        if (!serving)
            return qsa__fail(QSA_ERR_INVALID_ARGUMENT, "tp rendezvous %.300s: '*' names no host to connect to: give ranks 1..tp-1 "
                             "rank 0's address (tcp://HOST:%s)", spec, a->port);
        snprintf(a->host, sizeof a->host, "0.0.0.0");
    }
    return QSA_OK;
}

QSA_PRIV void qsa__be32_put(unsigned char *p, uint32_t v) {
    p[0] = (unsigned char)(v >> 24); p[1] = (unsigned char)(v >> 16); p[2] = (unsigned char)(v >> 8); p[3] = (unsigned char)v;
}
QSA_PRIV uint32_t qsa__be32_get(const unsigned char *p) {
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | (uint32_t)p[3];
}

/* "ADDR:PORT" (IPv6 in brackets) of a socket address, for messages. */
QSA_PRIV void qsa__sock_name(const struct sockaddr *sa, socklen_t n, char *out, size_t cap) {
    char h[128], p[16];
    if (getnameinfo(sa, n, h, sizeof h, p, sizeof p, NI_NUMERICHOST | NI_NUMERICSERV) != 0) snprintf(out, cap, "(unknown address)");
    else snprintf(out, cap, strchr(h, ':') ? "[%s]:%s" : "%s:%s", h, p);
}

/* Make a socket non-blocking and close-on-exec, without SIGPIPE where the system has SO_NOSIGPIPE:
   0, or -1 with errno (the socket is closed). */
QSA_PRIV int qsa__sock_setup(int fd) {
    int fl = fcntl(fd, F_GETFL);
    if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0 || fcntl(fd, F_SETFD, FD_CLOEXEC) < 0) {
        int e = errno;
        close(fd);
        errno = e;
        return -1;
    }
#ifdef SO_NOSIGPIPE
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_NOSIGPIPE, &one, sizeof one);
#endif
    return 0;
}

QSA_PRIV int qsa__sock_open(const struct addrinfo *ai) {
    int fd = socket(ai->ai_family, ai->ai_socktype, ai->ai_protocol);
    return fd < 0 || qsa__sock_setup(fd) < 0 ? -1 : fd;
}

/* Wait until `fd` is ready for `events`: 1, 0 at the deadline, -1 on error (errno). */
QSA_PRIV int qsa__sock_wait(int fd, short events, double deadline) {
    for (;;) {
        double left = deadline - qsa__now();
        if (left <= 0) return 0;
        struct pollfd pfd;
        pfd.fd = fd;
        pfd.events = events;
        pfd.revents = 0;
        int n = poll(&pfd, 1, left < 1 ? (int)(left * 1e3) + 1 : 1000);
        if (n > 0) return 1;
        if (n < 0 && errno != EINTR) return -1;
    }
}

/* Send (`sending`) or receive exactly n bytes before the deadline: 0, or an errno value (ETIMEDOUT at
   the deadline, ECONNRESET when the peer closed first). */
QSA_PRIV int qsa__sock_xfer(int fd, unsigned char *buf, size_t n, int sending, double deadline) {
    size_t done = 0;
    while (done < n) {
        ssize_t k = sending ? send(fd, buf + done, n - done, MSG_NOSIGNAL) : recv(fd, buf + done, n - done, 0);
        if (k > 0) {
            done += (size_t)k;
            continue;
        }
        if (k == 0) return ECONNRESET;
        if (errno == EINTR) continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK) return errno;
        int w = qsa__sock_wait(fd, sending ? POLLOUT : POLLIN, deadline);
        if (w == 0) return ETIMEDOUT;
        if (w < 0) return errno;
    }
    return 0;
}

/* Rank 0's listening socket on the address of `a` (the first that binds), its name in `where`. */
QSA_PRIV qsa_result qsa__tp_rdv_listen(const char *spec, const qsa__tp_rdv_addr *a, int *out, char *where, size_t cap) {
    struct addrinfo hints, *res = NULL;
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE;
    int e = getaddrinfo(a->host, a->port, &hints, &res);
    if (e != 0)
        return qsa__fail(QSA_ERR_IO, "tp rendezvous %.300s: cannot resolve %s: %s", spec, a->host,
                         e == EAI_SYSTEM ? strerror(errno) : gai_strerror(e));
    int fd = -1, err = 0;
    for (const struct addrinfo *ai = res; ai && fd < 0; ai = ai->ai_next) {
        qsa__sock_name(ai->ai_addr, ai->ai_addrlen, where, cap);
        int one = 1;
        fd = qsa__sock_open(ai);
        if (fd < 0) err = errno;
        else if (setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) != 0 || bind(fd, ai->ai_addr, ai->ai_addrlen) != 0 ||
                 listen(fd, 128) != 0) {
            err = errno;
            close(fd);
            fd = -1;
        }
    }
    freeaddrinfo(res);
    if (fd < 0)
        return qsa__fail(QSA_ERR_IO, "tp rendezvous %.300s: cannot listen on %s: %s%s", spec, where, strerror(err),
                         err == EADDRINUSE ? " (another process holds the port: use a free one for each launch)" : "");
    *out = fd;
    return QSA_OK;
}

typedef struct qsa__tp_rdv_conn {
    int fd, phase, rank;   /* phase 0: reading the hello, 1: writing the id, 2: reading the acknowledgement */
    size_t have;           /* bytes of the phase done */
    double since;          /* accepted at */
    unsigned char buf[QSA__RDV_REPLY];
    char peer[128];
} qsa__tp_rdv_conn;

typedef struct qsa__tp_rdv_server {
    const char *spec;
    int tp;
    const unsigned char *id;
    unsigned char *acked;  /* [tp]: rank r holds the id */
    int served, accepted, dropped;
} qsa__tp_rdv_server;

/* One read or write on a connection.  1: it stays open; 0: it is done (its rank counted) or dropped.
   A rank started with another tp fails the rendezvous: no group can form. */
QSA_PRIV int qsa__tp_rdv_step(qsa__tp_rdv_server *s, qsa__tp_rdv_conn *c, qsa_result *r) {
    static const size_t need[3] = {QSA__RDV_HELLO, QSA__RDV_REPLY, 8};
    ssize_t k = c->phase == 1 ? send(c->fd, c->buf + c->have, need[1] - c->have, MSG_NOSIGNAL)
                              : recv(c->fd, c->buf + c->have, need[c->phase] - c->have, 0);
    if (k < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) return 1;
    if (k <= 0) {
        qsa__log(QSA_LOG_DEBUG, "tp rendezvous: %s dropped in phase %d: %s", c->peer, c->phase, k ? strerror(errno) : "closed");
        s->dropped++;
        return 0;
    }
    c->have += (size_t)k;
    if (c->have < need[c->phase]) return 1;
    c->have = 0;
    if (c->phase == 0) {
        uint32_t tp = qsa__be32_get(c->buf + 8), rank = qsa__be32_get(c->buf + 12);
        /* a hello no rank could send (tp outside 2..QSA_TP_MAX, rank outside 1..tp-1) is malformed: dropped;
           only a well-formed hello of another tp fails the group */
        if (memcmp(c->buf, "QSATPID1", 8) || tp < 2 || tp > QSA_TP_MAX || rank < 1 || rank >= tp) {
            qsa__log(QSA_LOG_DEBUG, "tp rendezvous: %s sent a malformed hello, dropped", c->peer);
            s->dropped++;
            return 0;
        }
        c->rank = (int)rank;
        qsa__be32_put(c->buf + 8, (uint32_t)s->tp);
        if (tp != (uint32_t)s->tp) { /* tell it our tp (zero id), then fail */
            memset(c->buf + 12, 0, QSA__RDV_ID);
            qsa__sock_xfer(c->fd, c->buf, QSA__RDV_REPLY, 1, qsa__now() + 1);
            *r = qsa__fail(QSA_ERR_INVALID_ARGUMENT, "tp rendezvous %.300s: rank %u (from %s) was started with tp = %u, this group has tp = %d",
                           s->spec, rank, c->peer, tp, s->tp);
            return 0;
        }
        memcpy(c->buf + 12, s->id, QSA__RDV_ID);
        c->phase = 1;
        return 1;
    }
    if (c->phase == 1) {
        c->phase = 2;
        return 1;
    }
    if (memcmp(c->buf, "QSATPACK", 8)) {
        s->dropped++;
        return 0;
    }
    if (!s->acked[c->rank]) s->served++;
    s->acked[c->rank] = 1;
    return 0;
}

/* "ranks 2, 5, 7" not yet served (the first 16). */
QSA_PRIV void qsa__tp_rdv_missing(const qsa__tp_rdv_server *s, char *out, size_t cap) {
    size_t n = 0;
    int k = 0;
    out[0] = 0;
    for (int r = 1; r < s->tp && n < cap; r++) {
        if (s->acked[r]) continue;
        if (k++ == 16) { snprintf(out + n, cap - n, ", ..."); break; }
        n += (size_t)snprintf(out + n, cap - n, "%s%d", k > 1 ? ", " : "", r);
    }
}

/* Rank 0: listen on `spec` and hand `id` to ranks 1..tp-1; return once every one of them holds it,
   or after timeout_s. */
QSA_PRIV qsa_result qsa__tp_rdv_serve(const char *spec, int tp, const unsigned char id[QSA__RDV_ID], double timeout_s) {
    qsa__tp_rdv_addr a;
    char where[128];
    int lfd = -1;
    QSA__TRY(qsa__tp_rdv_parse(spec, 1, &a));
    QSA__TRY(qsa__tp_rdv_listen(spec, &a, &lfd, where, sizeof where));
    qsa__log(QSA_LOG_INFO, "tp rendezvous: rank 0 hands the NCCL id to %d rank(s) on %s", tp - 1, where);
    qsa__tp_rdv_server s;
    memset(&s, 0, sizeof s);
    s.spec = spec;
    s.tp = tp;
    s.id = id;
    s.acked = (unsigned char *)qsa__calloc((size_t)tp, 1);
    qsa__tp_rdv_conn *cs = QSA__CALLOC(qsa__tp_rdv_conn, QSA__RDV_CONNS);
    struct pollfd pfd[1 + QSA__RDV_CONNS];
    int nc = 0;
    qsa_result r = s.acked && cs ? QSA_OK : qsa__fail(QSA_ERR_OUT_OF_MEMORY, "tp rendezvous: out of host memory");
    double t0 = qsa__now(), deadline = t0 + timeout_s, accept_after = 0; /* (accepting paused until then) */
    while (r == QSA_OK && s.served < tp - 1) {
        double now = qsa__now();
        if (now >= deadline) {
            char missing[160];
            qsa__tp_rdv_missing(&s, missing, sizeof missing);
            r = qsa__fail(QSA_ERR_IO, "tp rendezvous %.300s: %d of %d ranks took the id within %g s on %s (%d connection(s) accepted, "
                          "%d dropped; missing ranks: %s)", spec, s.served, tp - 1, timeout_s, where, s.accepted, s.dropped, missing);
            break;
        }
        for (int i = nc - 1; i >= 0; i--)
            if (now - cs[i].since > QSA__RDV_CONN_S) {
                qsa__log(QSA_LOG_DEBUG, "tp rendezvous: %s silent for %.0f s, dropped", cs[i].peer, QSA__RDV_CONN_S);
                s.dropped++;
                close(cs[i].fd);
                cs[i] = cs[--nc];
            }
        pfd[0].fd = lfd;
        pfd[0].events = nc < QSA__RDV_CONNS && now >= accept_after ? POLLIN : 0;
        pfd[0].revents = 0;
        for (int i = 0; i < nc; i++) {
            pfd[1 + i].fd = cs[i].fd;
            pfd[1 + i].events = cs[i].phase == 1 ? POLLOUT : POLLIN;
            pfd[1 + i].revents = 0;
        }
        double wait = deadline - now < 0.5 ? deadline - now : 0.5; /* wake up to drop stale connections */
        int n = poll(pfd, (nfds_t)(1 + nc), (int)(wait * 1e3) + 1);
        if (n < 0 && errno != EINTR) r = qsa__fail(QSA_ERR_IO, "tp rendezvous %.300s: poll: %s", spec, strerror(errno));
        if (n <= 0) continue;
        for (int i = nc - 1; i >= 0 && r == QSA_OK; i--)
            if (pfd[1 + i].revents && !qsa__tp_rdv_step(&s, &cs[i], &r)) {
                close(cs[i].fd);
                cs[i] = cs[--nc];
            }
        while (r == QSA_OK && (pfd[0].revents & POLLIN) && nc < QSA__RDV_CONNS) {
            struct sockaddr_storage sa;
            socklen_t sn = sizeof sa;
            int fd = accept(lfd, (struct sockaddr *)&sa, &sn);
            if (fd < 0) {
                int e = errno;
                /* out of descriptors or buffers (idle connections can cause it): pause accepting for a
                   tick, while stale connections are dropped; a connection's own network error
                   (accept(2): treat like EAGAIN): drop it and go on; anything else ends the wait */
                if (e == EMFILE || e == ENFILE || e == ENOBUFS || e == ENOMEM) {
                    qsa__log(QSA_LOG_DEBUG, "tp rendezvous: accept on %s: %s; paused for 0.5 s", where, strerror(e));
                    accept_after = qsa__now() + 0.5;
                } else if (e == ENETDOWN || e == EPROTO || e == ENOPROTOOPT || e == EHOSTDOWN || e == EHOSTUNREACH ||
                           e == EOPNOTSUPP || e == ENETUNREACH || e == ECONNABORTED || e == ETIMEDOUT) {
                    s.dropped++;
                    continue;
                } else if (e != EINTR && e != EAGAIN && e != EWOULDBLOCK)
                    r = qsa__fail(QSA_ERR_IO, "tp rendezvous %.300s: accept on %s: %s", spec, where, strerror(e));
                break;
            }
            if (qsa__sock_setup(fd) < 0) continue;
            qsa__tp_rdv_conn *c = &cs[nc++];
            memset(c, 0, sizeof *c);
            c->fd = fd;
            c->since = qsa__now();
            qsa__sock_name((struct sockaddr *)&sa, sn, c->peer, sizeof c->peer);
            s.accepted++;
        }
    }
    for (int i = 0; i < nc; i++) close(cs[i].fd);
    close(lfd);
    qsa__free(cs);
    qsa__free(s.acked);
    return r;
}

/* The longest one connection attempt waits for rank 0's host to answer before the next address (or the next
   round) is tried: an address that drops connection attempts silently (a firewall, a full accept queue) took
   the whole timeout.  Seconds; tests shorten it. */
static double qsa__tp_rdv_connect_s = 5.0;

/* One attempt of rank `rank` on one address of rank 0.  1: the id is in `id`; 0: try again (`last`
   says why); -1: an answer that trying again cannot change (*r says what). */
QSA_PRIV int qsa__tp_rdv_try(const char *spec, const struct addrinfo *ai, int tp, int rank, unsigned char *id, double deadline,
                             char *last, size_t cap, qsa_result *r) {
    char where[128];
    unsigned char msg[QSA__RDV_REPLY];
    qsa__sock_name(ai->ai_addr, ai->ai_addrlen, where, sizeof where);
    int fd = qsa__sock_open(ai), e = 0;
    if (fd < 0) {
        snprintf(last, cap, "socket for %s: %s", where, strerror(errno));
        return 0;
    }
    if (connect(fd, ai->ai_addr, ai->ai_addrlen) != 0) {
        e = errno;
        if (e == EINPROGRESS || e == EINTR) { /* the connection goes on in the background */
            double cdl = qsa__now() + qsa__tp_rdv_connect_s;
            int w = qsa__sock_wait(fd, POLLOUT, cdl < deadline ? cdl : deadline), so = 0;
            socklen_t n = sizeof so;
            if (w == 0) e = ETIMEDOUT;
            else if (w < 0 || getsockopt(fd, SOL_SOCKET, SO_ERROR, &so, &n) != 0) e = errno;
            else e = so;
        }
    }
    memcpy(msg, "QSATPID1", 8);
    qsa__be32_put(msg + 8, (uint32_t)tp);
    qsa__be32_put(msg + 12, (uint32_t)rank);
    if (!e) e = qsa__sock_xfer(fd, msg, QSA__RDV_HELLO, 1, deadline);
    if (!e) e = qsa__sock_xfer(fd, msg, QSA__RDV_REPLY, 0, deadline);
    int st = 0;
    if (e) {
        snprintf(last, cap, "%s: %s", where, e == ECONNRESET ? "connection closed by the peer" : strerror(e));
    } else if (memcmp(msg, "QSATPID1", 8)) {
        *r = qsa__fail(QSA_ERR_FORMAT, "tp rendezvous %.300s: %s answered without the QSATPID1 header: not a rank 0 of qsa_runtime", spec, where);
        st = -1;
    } else if (qsa__be32_get(msg + 8) != (uint32_t)tp) {
        *r = qsa__fail(QSA_ERR_INVALID_ARGUMENT, "tp rendezvous %.300s: rank 0 at %s leads a group of tp = %u, this rank (%d) was started with tp = %d",
                       spec, where, qsa__be32_get(msg + 8), rank, tp);
        st = -1;
    } else {
        memcpy(id, msg + 12, QSA__RDV_ID);
        memcpy(msg, "QSATPACK", 8);
        e = qsa__sock_xfer(fd, msg, 8, 1, deadline);
        if (e) snprintf(last, cap, "%s: acknowledging the id: %s", where, strerror(e));
        st = !e;
    }
    close(fd);
    return st;
}

/* One round over rank 0's addresses, in order, until one gives the id (1) or an answer that ends the fetch (-1;
   *r says what); 0: none did (`last` says why). */
QSA_PRIV int qsa__tp_rdv_round(const char *spec, const struct addrinfo *res, int tp, int rank, unsigned char *id,
                               double deadline, char *last, size_t cap, qsa_result *r) {
    int st = 0;
    for (const struct addrinfo *ai = res; ai && !st; ai = ai->ai_next)
        st = qsa__tp_rdv_try(spec, ai, tp, rank, id, deadline, last, cap, r);
    return st;
}

/* Rank `rank` (1..tp-1): connect to rank 0 at `spec`, retrying until timeout_s, and read the id. */
QSA_PRIV qsa_result qsa__tp_rdv_fetch(const char *spec, int tp, int rank, unsigned char id[QSA__RDV_ID], double timeout_s) {
    qsa__tp_rdv_addr a;
    QSA__TRY(qsa__tp_rdv_parse(spec, 0, &a));
    double deadline = qsa__now() + timeout_s;
    char last[400] = "no attempt";
    int attempts = 0;
    for (;;) {
        struct addrinfo hints, *res = NULL;
        memset(&hints, 0, sizeof hints);
        hints.ai_family = AF_UNSPEC;
        hints.ai_socktype = SOCK_STREAM;
        int e = getaddrinfo(a.host, a.port, &hints, &res);
        if (e != 0 && e != EAI_AGAIN)
            return qsa__fail(QSA_ERR_IO, "tp rendezvous %.300s: cannot resolve %s: %s", spec, a.host,
                             e == EAI_SYSTEM ? strerror(errno) : gai_strerror(e));
        if (e) snprintf(last, sizeof last, "cannot resolve %s: %s", a.host, gai_strerror(e));
        qsa_result r = QSA_OK;
        int st = qsa__tp_rdv_round(spec, res, tp, rank, id, deadline, last, sizeof last, &r);
        if (res) freeaddrinfo(res);
        attempts++;
        if (st) return r;
        /* every attempt gets 20 ms at least, so the last error is rank 0's answer, not the deadline's */
        double left = deadline - qsa__now() - 0.02;
        if (left <= 0)
            return qsa__fail(QSA_ERR_IO, "tp rendezvous %.300s: rank %d got no id from rank 0 within %g s (%d attempt(s), last: %s); is "
                             "rank 0 running, with the same address?", spec, rank, timeout_s, attempts, last);
        struct timespec ts = {0, (long)((left < 0.05 ? left : 0.05) * 1e9)};
        nanosleep(&ts, NULL);
    }
}

#ifndef QSA_NO_CUDA

typedef struct qsa__tp qsa__tp;
typedef struct qsa__tp_rank qsa__tp_rank;
typedef qsa_result (*qsa__tp_job)(qsa__tp_rank *rk, void *arg);

struct qsa__tp_rank {
    qsa__tp *t;
    int rank, local, device;
    qsa_model view;             /* the model as this rank sees it; view.cuda is its backend (context, stream) */
    qsa__tp_own copies, keep;   /* host slices (freed once uploaded) and the view's arrays */
    ncclComm_t comm;
    pthread_t thread;
    int has_thread;
    CUdeviceptr gather;         /* all-gather destination, gather_floats fp32 */
    CUdeviceptr send;           /* this rank's PLE columns [max_chunk][n_heads * ple_ncols] */
    size_t gather_floats;
    float *host_gather;         /* the logits gather copied back [tp][logit_rows][vmax] */
    float *logits, *hidden;     /* ranks other than the process's first: their logits / hidden states of the last
                                   chunk (the caller receives the first rank's; tests compare them) */
    size_t logits_cap, hidden_cap;
    int ple_col0, ple_ncols;
    qsa_result r;               /* the last job's result and message (errors are per thread) */
    char msg[1024];
};

struct qsa__tp {
    int tp, n_local, first_rank;
    int64_t vmax, *vbegin, *vcount; /* lm_head rows per rank; vmax = ceil(V / tp) */
    qsa__tp_rank *ranks;
    pthread_mutex_t mu;
    pthread_cond_t go, done;
    unsigned gen;
    int pending, quit, threads;
    unsigned long long mask;
    qsa__tp_job job;
    void *arg;
    float *greedy_rows;         /* qsa__tp_decode_greedy's rows when the caller takes no logits */
    size_t greedy_cap;          /* (floats) */
};

/* Per sequence: every local rank's device state and its copy of the host-side layer state (block
   counts, PLE id history), refreshed from the sequence before each chunk. */
typedef struct qsa__tp_seq {
    qsa__cuda_seq **cs;
    qsa__seq_layer **L;
    int32_t *ids;               /* storage of the copies' ple_ids */
} qsa__tp_seq;

/* One rank's job, its result and message kept in the rank.  On the caller's own thread (a process of one
   rank, or a group without threads) a job that succeeds leaves the caller's last error as it was. */
QSA_PRIV void qsa__tp_do(qsa__tp_rank *rk, qsa__tp_job job, void *arg) {
    snprintf(rk->msg, sizeof rk->msg, "%s", qsa_last_error());
    qsa_clear_error();
    rk->r = QSA_OK;
    if (rk->view.cuda) rk->r = QSA__CU_R(qsa__cu.cuCtxSetCurrent(rk->view.cuda->ctx));
    if (rk->r == QSA_OK) rk->r = job(rk, arg);
    if (rk->r != QSA_OK) snprintf(rk->msg, sizeof rk->msg, "%s", qsa_last_error());
    else snprintf(qsa__err_buf, sizeof qsa__err_buf, "%s", rk->msg);
}

QSA_PRIV void *qsa__tp_worker(void *p) {
    qsa__tp_rank *rk = (qsa__tp_rank *)p;
    qsa__tp *t = rk->t;
    unsigned seen = 0;
    pthread_mutex_lock(&t->mu);
    for (;;) {
        while (t->gen == seen && !t->quit) pthread_cond_wait(&t->go, &t->mu);
        if (t->quit) break;
        seen = t->gen;
        if (!(t->mask >> rk->local & 1)) continue;
        qsa__tp_job job = t->job;
        void *arg = t->arg;
        pthread_mutex_unlock(&t->mu);
        qsa__tp_do(rk, job, arg);
        pthread_mutex_lock(&t->mu);
        if (--t->pending == 0) pthread_cond_broadcast(&t->done);
    }
    pthread_mutex_unlock(&t->mu);
    return NULL;
}

/* Run job on the local ranks in `mask` (each on its own thread, concurrently) and wait for all; the
   first failure (in rank order) is returned with its message. */
QSA_PRIV qsa_result qsa__tp_exec(qsa__tp *t, unsigned long long mask, qsa__tp_job job, void *arg) {
    if (!t->threads) {
        for (int i = 0; i < t->n_local; i++)
            if (mask >> i & 1) qsa__tp_do(&t->ranks[i], job, arg);
    } else {
        pthread_mutex_lock(&t->mu);
        t->job = job;
        t->arg = arg;
        t->mask = mask;
        t->pending = 0;
        for (int i = 0; i < t->n_local; i++) t->pending += (int)(mask >> i & 1);
        t->gen++;
        pthread_cond_broadcast(&t->go);
        while (t->pending) pthread_cond_wait(&t->done, &t->mu);
        pthread_mutex_unlock(&t->mu);
    }
    for (int i = 0; i < t->n_local; i++)
        if ((mask >> i & 1) && t->ranks[i].r != QSA_OK)
            return qsa__fail(t->ranks[i].r, "tp rank %d (GPU %d): %s", t->ranks[i].rank, t->ranks[i].device, t->ranks[i].msg);
    return QSA_OK;
}
#define QSA__TP_ALL(t) ((t)->n_local >= 64 ? ~0ull : (1ull << (t)->n_local) - 1)

/* ---- collectives (counted) and the three reduction points of the forward ---- */

QSA_PRIV qsa_result qsa__tp_allgather(qsa__tp_rank *rk, CUdeviceptr send, CUdeviceptr recv, size_t n) {
    if (n * (size_t)rk->t->tp > rk->gather_floats)
        return qsa__fail(QSA_ERR_INTERNAL, "tp: all-gather of %zu floats per rank exceeds the buffer of %zu", n, rk->gather_floats);
    QSA__NCCL(qsa__nccl.ncclAllGather((const void *)(uintptr_t)send, (void *)(uintptr_t)recv, n, QSA__NCCL_FLOAT32, rk->comm,
                                      rk->view.cuda->stream));
    rk->view.cuda->n_coll++;
    rk->view.cuda->bytes_coll += (long long)n * 4;
    return QSA_OK;
}

/* x [n] fp32 holds this rank's partial sums: afterwards, their sum over the ranks in rank order. */
QSA_PRIV qsa_result qsa__tp_reduce(qsa_model *m, CUdeviceptr x, int n) {
    qsa__tp_rank *rk = m->tpr;
    if (!rk) return QSA_OK;
    qsa__cuda *g = m->cuda;
    CUdeviceptr parts = rk->gather;
    int tp = rk->t->tp;
    QSA__TRY(qsa__tp_allgather(rk, x, parts, (size_t)n));
    QSA__LAUNCH(g, tp_sum, (n + 255) / 256, 1, 256, 0, &parts, &x, &n, &tp);
    return QSA_OK;
}

/* Token t's share of the PLE rows: this rank's columns of every head, at host_e[t][n_heads][ple_ncols]. */
QSA_PRIV void qsa__tp_ple_embed(const qsa_model *m, const qsa__ple_w *p, const int32_t *hist, float *host_e, int t) {
    const qsa_model_config *c = &m->cfg;
    int nh = (c->ngram_size - 1) * c->heads_per_ngram;
    qsa__ple_embed_cols(c, p, hist, m->tpr->ple_col0, m->tpr->ple_ncols, host_e + (size_t)t * nh * m->tpr->ple_ncols);
}

/* The PLE rows of M tokens on the device: cols holds this rank's columns [M][n_heads][ple_ncols]; e
   receives the full rows [M][D] (all-gather, then qsa_k_tp_ple_unshard restores the row order). */
QSA_PRIV qsa_result qsa__tp_ple_gather(qsa_model *m, CUdeviceptr cols, CUdeviceptr e, int M) {
    qsa__tp_rank *rk = m->tpr;
    qsa__cuda *g = m->cuda;
    const qsa_model_config *c = &m->cfg;
    int nh = (c->ngram_size - 1) * c->heads_per_ngram, dl = rk->ple_ncols, tp = rk->t->tp, n = M * nh * dl * tp;
    CUdeviceptr parts = rk->gather;
    QSA__TRY(qsa__tp_allgather(rk, cols, parts, (size_t)M * nh * dl));
    QSA__LAUNCH(g, tp_ple_unshard, (n + 255) / 256, 1, 256, 0, &parts, &e, &M, &nh, &dl, &tp);
    return QSA_OK;
}

/* The same from the host: host_e holds this rank's columns [M][n_heads][ple_ncols]. */
QSA_PRIV qsa_result qsa__tp_ple_rows(qsa_model *m, const float *host_e, CUdeviceptr e, int M) {
    qsa__tp_rank *rk = m->tpr;
    const qsa_model_config *c = &m->cfg;
    size_t local = (size_t)M * (c->ngram_size - 1) * c->heads_per_ngram * rk->ple_ncols;
    QSA__CU(qsa__cu.cuMemcpyHtoDAsync_v2(rk->send, host_e, local * 4, m->cuda->stream));
    return qsa__tp_ple_gather(m, rk->send, e, M);
}

/* The vocab-parallel logits of `rows` tokens: dlogits [rows][vmax] holds this rank's vocabulary rows
   (zero-padded); the ranks' rows are all-gathered into rk->gather [tp][rows][vmax] (asynchronous;
   a no-op without TP). */
QSA_PRIV qsa_result qsa__tp_logits_gather(qsa_model *m, CUdeviceptr dlogits, int rows) {
    qsa__tp_rank *rk = m->tpr;
    if (!rk) return QSA_OK;
    return qsa__tp_allgather(rk, dlogits, rk->gather, (size_t)rows * (size_t)rk->t->vmax);
}

/* The gathered logits of `rows` tokens into dst [rows][V] in vocabulary order (synchronous). */
QSA_PRIV qsa_result qsa__tp_logits_out(qsa_model *m, int rows, float *dst) {
    qsa__tp_rank *rk = m->tpr;
    qsa__tp *t = rk->t;
    size_t n = (size_t)rows * (size_t)t->vmax, V = (size_t)m->cfg.vocab_size;
    QSA__CU(qsa__cu.cuMemcpyDtoHAsync_v2(rk->host_gather, rk->gather, n * (size_t)t->tp * 4, m->cuda->stream));
    QSA__CU(qsa__cu.cuStreamSynchronize(m->cuda->stream));
    for (int r = 0; r < t->tp; r++)
        for (int i = 0; i < rows; i++)
            memcpy(dst + (size_t)i * V + (size_t)t->vbegin[r], rk->host_gather + (size_t)r * n + (size_t)i * (size_t)t->vmax,
                   (size_t)t->vcount[r] * 4);
    return QSA_OK;
}

QSA_PRIV qsa_result qsa__tp_logits(qsa_model *m, CUdeviceptr dlogits, int rows, float *dst) {
    QSA__TRY(qsa__tp_logits_gather(m, dlogits, rows));
    return qsa__tp_logits_out(m, rows, dst);
}

/* ---- sequences ---- */

QSA_PRIV void qsa__tp_seq_free(qsa__tp *t, qsa__tp_seq *ts) {
    if (!ts) return;
    if (ts->L)
        for (int i = 0; i < t->n_local; i++) qsa__free(ts->L[i]);
    qsa__free(ts->L);
    qsa__free(ts->cs);
    qsa__free(ts->ids);
    qsa__free(ts);
}

/* the sequence as rank rk sees it (its model view, device state and layer-state copy) */
QSA_PRIV void qsa__tp_seq_view(qsa__tp_rank *rk, const qsa_seq *s, qsa_seq *v) {
    *v = *s;
    v->m = &rk->view;
    v->tp = NULL;
    v->cuda = s->tp ? s->tp->cs[rk->local] : NULL;
    if (s->tp) v->L = s->tp->L[rk->local];
}

QSA_PRIV qsa_result qsa__tp_seq_create_job(qsa__tp_rank *rk, void *arg) {
    qsa_seq *s = (qsa_seq *)arg, v;
    qsa__tp_seq_view(rk, s, &v);
    v.cuda = NULL;
    QSA__TRY(qsa__cuda_seq_create(&rk->view, &v));
    s->tp->cs[rk->local] = v.cuda;
    return QSA_OK;
}
QSA_PRIV qsa_result qsa__tp_seq_reset_job(qsa__tp_rank *rk, void *arg) {
    qsa_seq v;
    qsa__tp_seq_view(rk, (qsa_seq *)arg, &v);
    return v.cuda ? qsa__cuda_seq_reset(&rk->view, &v) : QSA_OK;
}
QSA_PRIV qsa_result qsa__tp_seq_destroy_job(qsa__tp_rank *rk, void *arg) {
    qsa_seq *s = (qsa_seq *)arg, v;
    qsa__tp_seq_view(rk, s, &v);
    if (v.cuda) qsa__cuda_seq_destroy(&rk->view, &v);
    s->tp->cs[rk->local] = NULL;
    return QSA_OK;
}

QSA_PRIV void qsa__tp_seq_destroy(qsa_model *m, qsa_seq *s) {
    if (!s->tp) return;
    qsa__tp_exec(m->tp, QSA__TP_ALL(m->tp), qsa__tp_seq_destroy_job, s);
    qsa__tp_seq_free(m->tp, s->tp);
    s->tp = NULL;
    s->cuda = NULL;
}

QSA_PRIV qsa_result qsa__tp_seq_create(qsa_model *m, qsa_seq *s) {
    qsa__tp *t = m->tp;
    const qsa_model_config *c = &m->cfg;
    int L = c->num_hidden_layers, ng = c->ngram_size > 0 ? c->ngram_size : 1;
    qsa__tp_seq *ts = QSA__CALLOC(qsa__tp_seq, 1);
    if (!ts) return qsa__fail(QSA_ERR_OUT_OF_MEMORY, "sequence: out of host memory");
    s->tp = ts;
    ts->cs = QSA__CALLOC(qsa__cuda_seq *, t->n_local);
    ts->L = QSA__CALLOC(qsa__seq_layer *, t->n_local);
    ts->ids = QSA__CALLOC(int32_t, (size_t)t->n_local * L * ng);
    int ok = ts->cs && ts->L && ts->ids;
    for (int i = 0; ok && i < t->n_local; i++) {
        ok = (ts->L[i] = QSA__CALLOC(qsa__seq_layer, L)) != NULL;
        for (int l = 0; ok && l < L; l++)
            if (m->layers[l].ple) ts->L[i][l].ple_ids = ts->ids + ((size_t)i * L + l) * ng;
    }
    if (!ok) { /* (nothing on a device yet: the ranks' destroy jobs would read the arrays that are missing) */
        qsa__tp_seq_free(t, ts);
        s->tp = NULL;
        return qsa__fail(QSA_ERR_OUT_OF_MEMORY, "sequence: out of host memory");
    }
    qsa_result r = qsa__tp_exec(t, QSA__TP_ALL(t), qsa__tp_seq_create_job, s);
    if (r != QSA_OK) {
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", qsa_last_error());
        qsa__tp_seq_destroy(m, s);
        return qsa__fail(r, "%s", msg);
    }
    s->cuda = ts->cs[0];
    return QSA_OK;
}

QSA_PRIV qsa_result qsa__tp_seq_reset(qsa_model *m, qsa_seq *s) {
    return s->tp ? qsa__tp_exec(m->tp, QSA__TP_ALL(m->tp), qsa__tp_seq_reset_job, s) : QSA_OK;
}

/* ---- one chunk through the model on every local rank ---- */

typedef struct qsa__tp_chunk_arg {
    qsa_seq *sq;
    const int32_t *ids;
    int M, all_logits;
    float *logits;
} qsa__tp_chunk_arg;

/* The sequence as rank rk runs it (qsa__tp_seq_view), with the host-side layer state (block counts,
   PLE id history) copied from the sequence into the rank's copy. */
QSA_PRIV void qsa__tp_seq_pull(qsa__tp_rank *rk, const qsa_seq *s, qsa_seq *v) {
    const qsa_model_config *c = &rk->view.cfg;
    qsa__tp_seq_view(rk, s, v);
    for (int l = 0; l < c->num_hidden_layers; l++) {
        v->L[l].n_blocks = s->L[l].n_blocks;
        if (v->L[l].ple_ids) memcpy(v->L[l].ple_ids, s->L[l].ple_ids, sizeof(int32_t) * (size_t)(c->ngram_size - 1));
    }
}

/* Every rank advanced its copy of the layer state identically: the sequence takes the first one's. */
QSA_PRIV void qsa__tp_seq_push(qsa_model *m, qsa_seq *s) {
    const qsa__seq_layer *L0 = s->tp->L[0];
    for (int l = 0; l < m->cfg.num_hidden_layers; l++) {
        s->L[l].n_blocks = L0[l].n_blocks;
        if (s->L[l].ple_ids) memcpy(s->L[l].ple_ids, L0[l].ple_ids, sizeof(int32_t) * (size_t)(m->cfg.ngram_size - 1));
    }
}

/* A rank's host buffer of at least n floats (its contents are not kept when it grows). */
QSA_PRIV qsa_result qsa__tp_grow(float **p, size_t *cap, size_t n) {
    if (n <= *cap) return QSA_OK;
    qsa__free(*p);
    *cap = 0;
    if (!(*p = QSA__ALLOC(float, n))) return qsa__fail(QSA_ERR_OUT_OF_MEMORY, "tp: out of host memory");
    *cap = n;
    return QSA_OK;
}

/* The result buffers of the local ranks but the first (rows logit rows and hid hidden rows of each rank's
   view), had on the calling thread before any rank runs the step: a rank that failed to have its own
   would fail alone and leave the others waiting in a collective. */
QSA_PRIV qsa_result qsa__tp_grow_results(qsa__tp *t, size_t rows, size_t hid) {
    for (int i = 1; i < t->n_local; i++) {
        qsa__tp_rank *rk = &t->ranks[i];
        QSA__TRY(qsa__tp_grow(&rk->logits, &rk->logits_cap, rows * (size_t)rk->view.cfg.vocab_size));
        QSA__TRY(qsa__tp_grow(&rk->hidden, &rk->hidden_cap, hid * (size_t)rk->view.cfg.hidden_size));
    }
    return QSA_OK;
}

QSA_PRIV qsa_result qsa__tp_chunk_job(qsa__tp_rank *rk, void *arg) {
    qsa__tp_chunk_arg *a = (qsa__tp_chunk_arg *)arg;
    qsa_seq v;
    qsa__tp_seq_pull(rk, a->sq, &v);
    float *lg = a->logits;
    if (rk->local) { /* only the first local rank reports to the caller; the others keep their results */
        lg = a->logits ? rk->logits : NULL;
        v.hidden_out = a->sq->hidden_out ? rk->hidden : NULL;
        v.sel_hook = NULL;
        v.route_hook = NULL;
    }
    return qsa__cuda_chunk(&v, a->ids, a->M, lg, a->all_logits, NULL);
}

QSA_PRIV qsa_result qsa__tp_chunk(qsa_seq *sq, const int32_t *ids, int M, float *logits, int all_logits) {
    qsa_model *m = sq->m;
    qsa__tp_chunk_arg a;
    a.sq = sq;
    a.ids = ids;
    a.M = M;
    a.logits = logits;
    a.all_logits = all_logits;
    QSA__TRY(qsa__tp_grow_results(m->tp, logits ? (size_t)(all_logits ? M : 1) : 0, sq->hidden_out ? (size_t)M : 0));
    QSA__TRY(qsa__tp_exec(m->tp, QSA__TP_ALL(m->tp), qsa__tp_chunk_job, &a));
    qsa__tp_seq_push(m, sq);
    return QSA_OK;
}

/* ---- one batched decode step on every local rank ---- */

typedef struct qsa__tp_batch_arg {
    qsa_seq **seqs;
    const int32_t *tokens;
    int B;
    float *logits;
    qsa_seq *v;   /* [n_local][B]: each rank's views of the sequences */
    qsa_seq **pv; /* [n_local][B]: pointers to them */
} qsa__tp_batch_arg;

/* The rank runs qsa__cuda_decode_batch on its views of the B sequences (its device state, its copies
   of their layer state), with its own step buffers and graphs. */
QSA_PRIV qsa_result qsa__tp_decode_batch_job(qsa__tp_rank *rk, void *arg) {
    qsa__tp_batch_arg *a = (qsa__tp_batch_arg *)arg;
    qsa_seq *v = a->v + (size_t)rk->local * a->B, **pv = a->pv + (size_t)rk->local * a->B;
    /* the first local rank reports to the caller; the others keep theirs */
    float *lg = rk->local && a->logits ? rk->logits : a->logits;
    for (int i = 0; i < a->B; i++) {
        qsa__tp_seq_pull(rk, a->seqs[i], &v[i]);
        pv[i] = &v[i];
    }
    return qsa__cuda_decode_batch(&rk->view, pv, a->tokens, a->B, lg, NULL, NULL);
}

/* Before the step, on every rank: its step buffers (whether graphs are on or off) and B's graph */
QSA_PRIV qsa_result qsa__tp_capture_job(qsa__tp_rank *rk, void *arg) {
    QSA__TRY(qsa__cuda_batch_alloc(&rk->view));
    return qsa__cuda_batch_capture(&rk->view, ((qsa__tp_batch_arg *)arg)->B);
}

QSA_PRIV qsa_result qsa__tp_decode_batch(qsa_model *m, qsa_seq **seqs, const int32_t *tokens, int B, float *logits) {
    qsa__tp_batch_arg a;
    a.seqs = seqs;
    a.tokens = tokens;
    a.B = B;
    a.logits = logits;
    /* what the step needs, had before any rank runs it: the ranks' views of the sequences and result rows
       (here), their step buffers and B's graph (after B's first, eager step) on every rank; a failure
       there fails the step with nothing changed and no rank waiting in a collective */
    size_t nv = (size_t)m->tp->n_local * (size_t)B;
    a.v = QSA__ALLOC(qsa_seq, nv);
    a.pv = QSA__ALLOC(qsa_seq *, nv);
    qsa_result r = a.v && a.pv ? QSA_OK : qsa__fail(QSA_ERR_OUT_OF_MEMORY, "tp: out of host memory");
    if (r == QSA_OK) r = qsa__tp_grow_results(m->tp, logits ? (size_t)B : 0, 0);
    if (r == QSA_OK) r = qsa__tp_exec(m->tp, QSA__TP_ALL(m->tp), qsa__tp_capture_job, &a);
    if (r == QSA_OK) r = qsa__tp_exec(m->tp, QSA__TP_ALL(m->tp), qsa__tp_decode_batch_job, &a);
    qsa__free(a.v);
    qsa__free(a.pv);
    QSA__TRY(r);
    for (int i = 0; i < B; i++) qsa__tp_seq_push(m, seqs[i]);
    return QSA_OK;
}

/* The greedy step under TP: the gathered rows (into logits, or a buffer kept for the next step), their
   arg-max on the host. */
QSA_PRIV qsa_result qsa__tp_decode_greedy(qsa_model *m, qsa_seq **seqs, const int32_t *tokens, int B, float *logits,
                                          int32_t *next) {
    qsa__tp *t = m->tp;
    size_t V = (size_t)m->cfg.vocab_size;
    if (!logits && t->greedy_cap < (size_t)B * V) {
        float *p = (float *)qsa__realloc(t->greedy_rows, sizeof(float) * (size_t)B * V);
        if (!p) return qsa__fail(QSA_ERR_OUT_OF_MEMORY, "batched decode: out of host memory for %d rows of logits", B);
        t->greedy_rows = p;
        t->greedy_cap = (size_t)B * V;
    }
    float *rows = logits ? logits : t->greedy_rows;
    QSA__TRY(qsa__tp_decode_batch(m, seqs, tokens, B, rows));
    for (int i = 0; i < B; i++) next[i] = qsa__argmax(rows + (size_t)i * V, (int)V);
    return QSA_OK;
}

/* ---- bring-up and tear-down ---- */

QSA_PRIV qsa_result qsa__tp_rank_init_job(qsa__tp_rank *rk, void *arg) {
    qsa_model *m = (qsa_model *)arg;
    const qsa_model_config *c = &m->cfg;
    qsa__tp *t = rk->t;
    (void)m;
    QSA__TRY(qsa__cuda_init(&rk->view, &rk->view.cuda));
    qsa__cuda *g = rk->view.cuda;
    int T = rk->view.params.max_chunk, nh = c->n_ple_layers ? (c->ngram_size - 1) * c->heads_per_ngram : 0;
    /* logits rows gathered at once: a chunk's group of logit_rows, or a batched step's B <= min(max_batch, max_chunk) */
    int mb = rk->view.params.max_batch < T ? rk->view.params.max_batch : T, lrows = g->sc.logit_rows > mb ? g->sc.logit_rows : mb;
    size_t need = (size_t)t->tp * T * c->hidden_size;
    size_t lg = (size_t)t->tp * lrows * (size_t)t->vmax;
    if (lg > need) need = lg;
    if ((size_t)T * c->ple_embed_dim > need) need = (size_t)T * c->ple_embed_dim;
    rk->gather_floats = need;
    QSA__TRY(qsa__dalloc(g, &rk->gather, need * 4, &g->bytes_scratch, "TP all-gather buffer"));
    QSA__TRY(qsa__dalloc(g, &rk->send, (size_t)T * (nh ? nh : 1) * (rk->ple_ncols ? rk->ple_ncols : 1) * 4, &g->bytes_scratch,
                         "TP PLE columns"));
    rk->host_gather = QSA__ALLOC(float, lg);
    if (!rk->host_gather) return qsa__fail(QSA_ERR_OUT_OF_MEMORY, "tp: out of host memory");
    QSA__CU(qsa__cu.cuCtxSynchronize());
    qsa__tp_own_free(&rk->copies); /* the slices now live on the device */
    return QSA_OK;
}

typedef struct qsa__tp_id_arg {
    const char *rendezvous; /* a file path or tcp://HOST:PORT */
    double timeout_s;
} qsa__tp_id_arg;

/* A multi-process rank: rank 0 makes the unique id and publishes it (file) or hands it to every other
   rank (tcp); the others read it; all join. */
QSA_PRIV qsa_result qsa__tp_comm_rank_job(qsa__tp_rank *rk, void *arg) {
    qsa__tp_id_arg *a = (qsa__tp_id_arg *)arg;
    int tcp = qsa__tp_rdv_is_tcp(a->rendezvous);
    ncclUniqueId id;
    unsigned char *raw = (unsigned char *)id.internal;
    memset(&id, 0, sizeof id);
    if (rk->rank == 0) {
        QSA__NCCL(qsa__nccl.ncclGetUniqueId(&id));
        if (tcp) QSA__TRY(qsa__tp_rdv_serve(a->rendezvous, rk->t->tp, raw, a->timeout_s));
        else QSA__TRY(qsa__tp_id_publish(a->rendezvous, &id, sizeof id));
    } else if (tcp) {
        QSA__TRY(qsa__tp_rdv_fetch(a->rendezvous, rk->t->tp, rk->rank, raw, a->timeout_s));
    } else {
        QSA__TRY(qsa__tp_id_wait(a->rendezvous, &id, sizeof id, a->timeout_s));
    }
    qsa_result r = QSA__NCCL_R(qsa__nccl.ncclCommInitRank(&rk->comm, rk->t->tp, id, rk->rank));
    /* everyone has joined, or rank 0 cannot: either way the id is spent, and a later run must not find it */
    if (rk->rank == 0 && !tcp) remove(a->rendezvous);
    return r;
}

/* ncclCommDestroy may wait for the other ranks of the node: every rank destroys its own at once.  It
   also waits until no CUDA graph holds a collective of the communicator, so the rank's batched-decode
   graphs go first. */
QSA_PRIV qsa_result qsa__tp_comm_destroy_job(qsa__tp_rank *rk, void *arg) {
    (void)arg;
    if (rk->view.cuda) qsa__cuda_batch_drop_graphs(rk->view.cuda);
    if (rk->comm) qsa__nccl.ncclCommDestroy(rk->comm);
    rk->comm = NULL;
    return QSA_OK;
}

QSA_PRIV void qsa__tp_free(qsa_model *m) {
    qsa__tp *t = m->tp;
    if (!t) return;
    if (t->ranks) {
        int comms = 0;
        for (int i = 0; i < t->n_local; i++) comms |= t->ranks[i].comm != NULL;
        if (comms) qsa__tp_exec(t, QSA__TP_ALL(t), qsa__tp_comm_destroy_job, NULL);
    }
    if (t->threads) {
        pthread_mutex_lock(&t->mu);
        t->quit = 1;
        pthread_cond_broadcast(&t->go);
        pthread_mutex_unlock(&t->mu);
    }
    for (int i = 0; t->ranks && i < t->n_local; i++) {
        qsa__tp_rank *rk = &t->ranks[i];
        if (rk->has_thread) pthread_join(rk->thread, NULL);
        qsa__cuda_free(rk->view.cuda);
        qsa__tp_own_free(&rk->copies);
        qsa__tp_own_free(&rk->keep);
        qsa__free(rk->host_gather);
        qsa__free(rk->logits);
        qsa__free(rk->hidden);
    }
    pthread_mutex_destroy(&t->mu);
    pthread_cond_destroy(&t->go);
    pthread_cond_destroy(&t->done);
    qsa__free(t->ranks);
    qsa__free(t->vbegin);
    qsa__free(t->vcount);
    qsa__free(t->greedy_rows);
    qsa__free(t);
    m->tp = NULL;
    m->cuda = NULL;
}

QSA_PRIV qsa_result qsa__tp_init_(qsa_model *m) {
    const qsa_model_params *p = &m->params;
    const qsa_model_config *c = &m->cfg;
    int tp = p->tp, multi = p->tp_rendezvous != NULL;
    QSA__TRY(qsa_tp_check(c, tp));
    QSA__TRY(qsa__cuda_load());
    QSA__TRY(qsa__nccl_load());
    if (multi && (p->tp_rank < 0 || p->tp_rank >= tp))
        return qsa__fail(QSA_ERR_INVALID_ARGUMENT, "tp: tp_rank %d outside 0..%d", p->tp_rank, tp - 1);
    if (multi && qsa__tp_rdv_is_tcp(p->tp_rendezvous)) { /* a malformed address fails now, not after the upload */
        qsa__tp_rdv_addr addr;
        QSA__TRY(qsa__tp_rdv_parse(p->tp_rendezvous, p->tp_rank == 0, &addr));
    }
    if (!multi && tp > 64) return qsa__fail(QSA_ERR_INVALID_ARGUMENT, "tp: one process drives at most 64 GPUs (tp = %d)", tp);
    qsa__tp *t = QSA__CALLOC(qsa__tp, 1);
    if (!t) return qsa__fail(QSA_ERR_OUT_OF_MEMORY, "tp: out of host memory");
    m->tp = t;
    pthread_mutex_init(&t->mu, NULL);
    pthread_cond_init(&t->go, NULL);
    pthread_cond_init(&t->done, NULL);
    t->tp = tp;
    t->n_local = multi ? 1 : tp;
    t->first_rank = multi ? p->tp_rank : 0;
    t->vmax = ((int64_t)c->vocab_size + tp - 1) / tp;
    t->ranks = QSA__CALLOC(qsa__tp_rank, t->n_local);
    t->vbegin = QSA__CALLOC(int64_t, tp);
    t->vcount = QSA__CALLOC(int64_t, tp);
    if (!t->ranks || !t->vbegin || !t->vcount) return qsa__fail(QSA_ERR_OUT_OF_MEMORY, "tp: out of host memory");
    for (int r = 0; r < tp; r++) QSA__TRY(qsa__tp_vocab_rows(c, tp, r, &t->vbegin[r], &t->vcount[r]));
    int *devs = QSA__CALLOC(int, t->n_local);
    if (!devs) return qsa__fail(QSA_ERR_OUT_OF_MEMORY, "tp: out of host memory");
    for (int i = 0; i < t->n_local; i++) devs[i] = multi ? p->device : p->tp_devices ? p->tp_devices[i] : p->device + i;
    qsa_result r = QSA_OK;
    for (int i = 0; r == QSA_OK && i < t->n_local; i++) {
        qsa__tp_rank *rk = &t->ranks[i];
        rk->t = t;
        rk->local = i;
        rk->rank = t->first_rank + i;
        rk->device = devs[i];
        if (devs[i] < 0 || devs[i] >= qsa__cu.device_count) {
            r = qsa__fail(QSA_ERR_NO_DEVICE, "tp: rank %d needs GPU %d, the driver reports %d device(s)", rk->rank, devs[i],
                          qsa__cu.device_count);
            break;
        }
        for (int j = 0; j < i; j++)
            if (devs[j] == devs[i]) r = qsa__fail(QSA_ERR_INVALID_ARGUMENT, "tp: ranks %d and %d on the same GPU %d", j, i, devs[i]);
        if (r == QSA_OK) r = qsa__tp_view(m, tp, rk->rank, &rk->copies, &rk->keep, &rk->view);
        if (r == QSA_OK) r = qsa__tp_ple_cols(c, tp, rk->rank, &rk->ple_col0, &rk->ple_ncols);
        rk->view.params.device = devs[i];
        rk->view.tpr = rk;
        if (qsa__nccl.version < 20900) rk->view.params.cuda_graphs = 0; /* NCCL captures into graphs from 2.9 */
    }
    if (p->cuda_graphs && qsa__nccl.version < 20900)
        qsa__log(QSA_LOG_WARN, "tp: NCCL %d cannot be captured into CUDA graphs (2.9 or later can): batched decode runs eagerly",
                 qsa__nccl.version);
    if (r == QSA_OK && t->n_local > 1) {
        for (int i = 0; r == QSA_OK && i < t->n_local; i++) {
            if (pthread_create(&t->ranks[i].thread, NULL, qsa__tp_worker, &t->ranks[i]) != 0)
                r = qsa__fail(QSA_ERR_INTERNAL, "tp: cannot start the thread of rank %d", i);
            else t->ranks[i].has_thread = 1;
        }
        t->threads = 1;
    }
    /* one rank at a time: the first compiles the kernels, the others find them in the cache */
    for (int i = 0; r == QSA_OK && i < t->n_local; i++) r = qsa__tp_exec(t, 1ull << i, qsa__tp_rank_init_job, m);
    if (r == QSA_OK && !multi) {
        ncclComm_t *comms = QSA__CALLOC(ncclComm_t, tp);
        CUcontext cur = NULL;
        qsa__cu.cuCtxGetCurrent(&cur);
        if (!comms) r = qsa__fail(QSA_ERR_OUT_OF_MEMORY, "tp: out of host memory");
        if (r == QSA_OK) r = QSA__NCCL_R(qsa__nccl.ncclCommInitAll(comms, tp, devs));
        for (int i = 0; r == QSA_OK && i < tp; i++) t->ranks[i].comm = comms[i];
        qsa__cu.cuCtxSetCurrent(cur); /* NCCL switched devices on this thread */
        qsa__free(comms);
    } else if (r == QSA_OK) {
        qsa__tp_id_arg a;
        a.rendezvous = p->tp_rendezvous;
        a.timeout_s = p->tp_timeout_s > 0 ? p->tp_timeout_s : 300;
        r = qsa__tp_exec(t, 1, qsa__tp_comm_rank_job, &a);
    }
    qsa__free(devs);
    if (r != QSA_OK) return r;
    QSA__INVARIANT(t->n_local >= 1);
    m->cuda = t->ranks[0].view.cuda;
    qsa__log(QSA_LOG_INFO, "tp: %d ranks (%s), this process drives ranks %d..%d; NCCL %d", tp,
             multi ? "one per process, ncclCommInitRank" : "one process, ncclCommInitAll", t->first_rank,
             t->first_rank + t->n_local - 1, qsa__nccl.version);
    return QSA_OK;
}

/* Bring up tensor parallelism for a loaded model (m->params.tp > 1): all or nothing. */
QSA_PRIV qsa_result qsa__tp_init(qsa_model *m) {
    qsa_result r = qsa__tp_init_(m);
    if (r != QSA_OK) {
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", qsa_last_error());
        qsa__tp_free(m);
        return qsa__fail(r, "%s", msg);
    }
    return QSA_OK;
}

#endif /* QSA_NO_CUDA */

QSA_IMPL void qsa_model_tp_info(const qsa_model *m, qsa_tp_info *out) {
    if (!out) return;
    memset(out, 0, sizeof *out);
    out->tp = 1;
    out->n_local = 1;
    if (!m) return;
#ifndef QSA_NO_CUDA
    const qsa__tp *t = m->tp;
    if (!t) return;
    out->tp = t->tp;
    out->first_rank = t->first_rank;
    out->n_local = t->n_local;
    const qsa__cuda *g = t->ranks[0].view.cuda;
    out->collectives = g->n_coll;
    out->bytes_contributed = g->bytes_coll;
    out->bytes_sent = (long long)(t->tp - 1) * g->bytes_coll;
#endif
}

QSA_IMPL void qsa_model_tp_reset_counters(qsa_model *m) {
#ifndef QSA_NO_CUDA
    if (!m || !m->tp) return;
    for (int i = 0; i < m->tp->n_local; i++) m->tp->ranks[i].view.cuda->n_coll = m->tp->ranks[i].view.cuda->bytes_coll = 0;
#else
    (void)m;
#endif
}


/* ============================================================================================== */
/* >>scheduler  requests, continuous batching, chunked prefill, admission by KV pages              */
/* ============================================================================================== */
/* Every request is an independent qsa_seq with its own sampler.  A step:
     1. admit queued requests in id order (first come, first served: the first one that does not
        fit stops admission, so a large request is never overtaken forever);
     2. decode: feed every decoding request its last sampled token in one batch
        (qsa__sched_decode), sample the next one with the request's sampler, apply stops;
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
    int32_t *b_next;           /* the greedy tokens of a step whose requests are all greedy */
    int *b_pos;                /* the sequences' positions before the step */
    qsa__sched_req **b_req;
    qsa_sampler **b_smp;
    int32_t *cand;             /* [max_batch][QSA__CAND_STRIDE(QSA__CAND_MAX)]: the rows' candidates (struct qsa__cand_req) */
    long long n_steps, n_prefill_tokens, n_decode_tokens;
    long long n_greedy_steps;  /* decode steps that took the greedy ids, not the logits */
    long long n_cand_tokens;   /* tokens drawn from the device's candidates, not from their logits: sampled decode
                                  steps' (a step of greedy requests takes their ids instead) and prompts' first */
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
    if (p.n_ctx_default > m->cfg.max_position_embeddings)
        return qsa__fail(QSA_ERR_INVALID_ARGUMENT, "qsa_sched_create: n_ctx_default %d exceeds the model's context of %d tokens",
                         p.n_ctx_default, m->cfg.max_position_embeddings);
    qsa__sched_fill_params(&p, m);
    qsa_sched *s = QSA__CALLOC(qsa_sched, 1);
    if (!s) return qsa__fail(QSA_ERR_OUT_OF_MEMORY, "qsa_sched_create: out of memory");
    s->m = m;
    s->p = p;
    s->next_id = 1;
    s->logits = (float *)qsa_host_alloc(m, (size_t)p.max_batch * (size_t)m->cfg.vocab_size * sizeof(float));
    s->b_seq = QSA__ALLOC(qsa_seq *, p.max_batch);
    s->b_tok = QSA__ALLOC(int32_t, p.max_batch);
    s->b_next = QSA__ALLOC(int32_t, p.max_batch);
    s->b_pos = QSA__ALLOC(int, p.max_batch);
    s->b_req = QSA__ALLOC(qsa__sched_req *, p.max_batch);
    s->b_smp = QSA__ALLOC(qsa_sampler *, p.max_batch);
    s->cand = (int32_t *)qsa_host_alloc(m, (size_t)p.max_batch * QSA__CAND_STRIDE(QSA__CAND_MAX) * sizeof(int32_t));
    if (!s->logits || !s->b_seq || !s->b_tok || !s->b_next || !s->b_pos || !s->b_req || !s->b_smp || !s->cand) {
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
        QSA__INVARIANT(sizeof(int32_t) * (size_t)p->n_prompt > 0); /* (the product does not wrap) */
        *ids = QSA__ALLOC(int32_t, p->n_prompt);
        if (!*ids) return qsa__fail(QSA_ERR_OUT_OF_MEMORY, "qsa_sched_submit: out of memory");
        memcpy(*ids, p->prompt, sizeof(int32_t) * (size_t)p->n_prompt);
        *n = p->n_prompt;
        return QSA_OK;
    }
    if (!p->text && !p->messages)
        return qsa__fail(QSA_ERR_INVALID_ARGUMENT, "qsa_sched_submit: no prompt (set prompt, text or messages)");
    if (!p->text && p->n_messages <= 0)
        return qsa__fail(QSA_ERR_INVALID_ARGUMENT, "qsa_sched_submit: messages with n_messages %d: expected > 0", p->n_messages);
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
        QSA__TRY(qsa_chat_apply_template(tok, p->text ? &one : p->messages, p->text ? 1 : (size_t)p->n_messages, 1, &chat));
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
    if (p->n_stop_strings < 0) return qsa__fail(QSA_ERR_INVALID_ARGUMENT, "qsa_sched_submit: n_stop_strings %d: expected >= 0", p->n_stop_strings);
    if (p->n_stop_strings == 0) return QSA_OK;
    if (!p->stop_strings) return qsa__fail(QSA_ERR_INVALID_ARGUMENT, "qsa_sched_submit: n_stop_strings %d with NULL stop_strings", p->n_stop_strings);
    q->stops = QSA__CALLOC(char *, p->n_stop_strings);
    if (!q->stops) return qsa__fail(QSA_ERR_OUT_OF_MEMORY, "qsa_sched_submit: out of memory");
    for (int i = 0; i < p->n_stop_strings; i++) {
        if (!p->stop_strings[i]) return qsa__fail(QSA_ERR_INVALID_ARGUMENT, "qsa_sched_submit: stop string %d is NULL", i);
        if (!p->stop_strings[i][0]) continue; /* an empty stop string never matches (as in qsa_generate) */
        QSA__TRY(qsa__u8_validate(p->stop_strings[i], strlen(p->stop_strings[i]), "qsa_sched_submit: stop string"));
        char *d = qsa__strdup(p->stop_strings[i]);
        if (!d) return qsa__fail(QSA_ERR_OUT_OF_MEMORY, "qsa_sched_submit: out of memory");
        q->stops[q->n_stops++] = d;
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
                         "whole pool has %d pages (%d tokens: raise kv_pool_tokens or %s)", q->budget, pages,
                         pl->page_size, pl->n_pages, pl->n_pages * pl->page_size,
                         p->max_tokens > 0 ? "lower max_tokens"
                         : p->seq ? "set max_tokens (with max_tokens 0 the request keeps its sequence's whole context, its n_ctx)"
                                  : "lower n_ctx (with max_tokens 0 the request keeps its whole context)");
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
        if (p->seq->broken) /* (it would take a slot and pages, then fail its first feed) */
            return qsa__fail(QSA_ERR_INVALID_ARGUMENT, "qsa_sched_submit: an earlier feed of the sequence failed part-way, or "
                             "its last reset failed on the device; qsa_seq_reset it first");
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
        qsa_detok_stream_init(&q->ds, s->m->tok, QSA_DETOK_SKIP_SPECIAL | QSA_DETOK_SKIP_UNKNOWN);
        q->has_ds = 1;
    }
    return QSA_OK;
}

QSA_IMPL qsa_result qsa_sched_submit(qsa_sched *s, const qsa_request_params *p, int64_t *id) {
    if (id) *id = 0;
    if (!s || !p || !id) return qsa__fail(QSA_ERR_INVALID_ARGUMENT, "qsa_sched_submit: NULL argument");
    if (p->max_tokens < 0 || p->n_ctx < 0)
        return qsa__fail(QSA_ERR_INVALID_ARGUMENT, "qsa_sched_submit: max_tokens %d, n_ctx %d: expected >= 0", p->max_tokens, p->n_ctx);
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
    int queued = 0; /* (after the request's checks: a bad request is told so, not to come back later) */
    for (int i = 0; r == QSA_OK && i < s->n_reqs; i++) queued += s->reqs[i]->status == QSA_REQ_QUEUED;
    if (r == QSA_OK && queued >= s->p.max_queued)
        r = qsa__fail(QSA_ERR_CONTEXT_FULL, "qsa_sched_submit: the queue is full (%d requests waiting, max_queued %d)", queued,
                      s->p.max_queued);
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

/* Request q's draw from row i of a step: from its candidates (cq: row i of cq->out) where the device reduced the row,
   from its logits (row i of s->logits) where it did not, with the penalty applied where they came after the
   candidates could not decide it (qsa__cand_req). */
QSA_PRIV int32_t qsa__sched_draw(qsa_sched *s, qsa__sched_req *q, const qsa__cand_req *cq, int i) {
    int V = s->m->cfg.vocab_size;
    const int32_t *row = cq ? cq->out + (size_t)i * QSA__CAND_STRIDE(cq->kmax) : NULL;
    if (row && row[1] >= 0) {
        s->n_cand_tokens++;
        return qsa__sampler_from_cand(q->smp, row, cq->kmax);
    }
    if (row && row[1] == -2) return qsa__sampler_sample_z(q->smp, s->logits + (size_t)i * V, V, NULL, 0, qsa__cand_z(row, cq->kmax));
    return qsa__sched_sample(s, q, s->logits + (size_t)i * V);
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
    if (t < 0) { /* the sampler could not allocate */
        qsa__sched_end_failed(s, q, QSA_REQ_ERROR, QSA_ERR_OUT_OF_MEMORY, qsa_last_error());
        return;
    }
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
    /* a stop string that ends in the new text: cut at the earliest */
    int64_t at = qsa__stop_find(q->text.data, q->text.len, old, (const char *const *)q->stops, q->n_stops);
    int stopped = at >= 0;
    if (stopped) { q->text.len = (size_t)at; q->text.data[q->text.len] = 0; }
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
        QSA__INVARIANT(q->seq != NULL); /* (a queued request that brought no sequence has its own by now) */
        q->pages_held = q->seq->n_pages;
        q->reserved = need;
        s->reserved += need;
        s->n_running++;
        q->status = QSA_REQ_PREFILL;
        q->t_admit = qsa__now();
    }
}

/* Does qsa_sampler_sample pick the arg-max of the logits as they come (temperature 0, no repetition
   penalty)? */
QSA_PRIV int qsa__sampler_greedy(const qsa_sampler *smp) {
    const qsa_sampling_params *p = &smp->p;
    return p->temperature <= 0.0f && !(p->repetition_penalty > 0 && p->repetition_penalty != 1.0f);
}

/* One token for every request that was decoding when the step began.  Each request's sequence is
   checked and given its page first, in id order: a refusal ends that request alone (its own message).
   The others go through qsa_seq_feed_batch together (on CUDA one forward pass per group of max_batch;
   on the CPU a loop over qsa_seq_feed: the same pages in the same order and the same bits as feeding
   them one by one).  When every one of them is greedy and no logits hook is set, the step returns their
   tokens (the arg-max on the device) instead of their logits: the same tokens, without the batch's
   logits crossing to the host.  Otherwise, when every sampler is greedy or draws from a top-k of at most
   QSA__CAND_MAX and no hook is set, a CUDA step reduces each row to its candidates on the device
   (qsa_k_sample_cand1, 2) and the host draws from those (qsa__sampler_from_cand): the same tokens, without the
   host's passes over the vocabulary (0.6 ms a row at 248,320 ids on the development machine).
   A failure inside the batch ends only the requests it reached: the first one not advanced (the CPU
   loop stops there) and those whose sequences it left broken (a failed CUDA group); the ones after it
   that were not fed keep decoding and are fed at the next step.  The step needs no memory of its own. */
QSA_PRIV void qsa__sched_decode(qsa_sched *s) {
    int V = s->m->cfg.vocab_size, n = 0, greedy = !s->logits_hook, cand = !s->logits_hook, kmax = 1;
    for (int i = 0; i < s->n_reqs && n < s->p.max_batch; i++) {
        qsa__sched_req *q = s->reqs[i];
        if (q->status != QSA_REQ_DECODE) continue;
        int32_t t = q->tokens[q->n_tokens - 1];
        qsa_result r = qsa__seq_feed_check(q->seq, &t, 1, "qsa_seq_feed");
        if (r == QSA_OK) r = qsa__seq_reserve(q->seq, q->seq->pos + 1);
        if (r != QSA_OK) {
            qsa__sched_account(s, q);
            qsa__sched_end_failed(s, q, QSA_REQ_ERROR, r, qsa_last_error());
            continue;
        }
        s->b_req[n] = q;
        s->b_seq[n] = q->seq;
        s->b_tok[n] = t;
        s->b_pos[n] = q->seq->pos;
        s->b_smp[n] = q->smp;
        greedy &= qsa__sampler_greedy(q->smp);
        int k = qsa__sampler_cand_k(q->smp, V);
        cand &= k >= 0;
        kmax = k > kmax ? k : kmax;
        n++;
    }
    if (!n) return;
    /* sampled rows: each reduced to its candidates on the device where the step can (qsa__cand_req) */
    qsa__cand_req cq = {s->b_smp, s->cand, kmax};
    qsa_result r = greedy ? qsa_seq_feed_batch_greedy(s->b_seq, s->b_tok, n, s->b_next)
                          : qsa__feed_batch_locked(s->b_seq, s->b_tok, n, s->logits, NULL, cand ? &cq : NULL);
    s->n_greedy_steps += greedy;
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", r != QSA_OK ? qsa_last_error() : "");
    for (int i = 0; i < n; i++) qsa__sched_account(s, s->b_req[i]);
    int blame = -1; /* the first request not advanced, found before a callback can cancel it */
    for (int i = 0; r != QSA_OK && blame < 0 && i < n; i++)
        if (s->b_seq[i]->pos == s->b_pos[i]) blame = i;
    for (int i = 0; i < n; i++) {
        qsa__sched_req *q = s->b_req[i];
        if (q->status != QSA_REQ_DECODE) continue; /* cancelled by an earlier request's callback */
        if (s->b_seq[i]->pos == s->b_pos[i]) { /* not fed (only after a failure) */
            if (i == blame || s->b_seq[i]->broken) qsa__sched_end_failed(s, q, QSA_REQ_ERROR, r, msg);
            continue;
        }
        s->n_decode_tokens++;
        qsa__sched_accept(s, q, greedy ? s->b_next[i] : qsa__sched_draw(s, q, cand ? &cq : NULL, i));
    }
}

/* One prompt chunk for every prefilling request; the first token after the last chunk. */
QSA_PRIV void qsa__sched_prefill(qsa_sched *s) {
    for (int i = 0; i < s->n_reqs; i++) {
        qsa__sched_req *q = s->reqs[i];
        if (q->status != QSA_REQ_PREFILL) continue;
        int k = q->n_prompt - q->n_fed < s->p.prefill_chunk ? q->n_prompt - q->n_fed : s->p.prefill_chunk;
        int last = q->n_fed + k == q->n_prompt;
        /* the last chunk's draw starts on the device as a decode step's (its row in s->cand's first) */
        int ck = last && !s->logits_hook ? qsa__sampler_cand_k(q->smp, s->m->cfg.vocab_size) : -1;
        qsa__cand_req cq = {&q->smp, s->cand, ck > 1 ? ck : 1};
        qsa__model_enter(s->m);
        qsa_result r = qsa__seq_feed(q->seq, q->prompt + q->n_fed, k, last ? s->logits : NULL, 0, ck >= 0 ? &cq : NULL);
        qsa__model_leave(s->m);
        qsa__sched_account(s, q);
        if (r != QSA_OK) { qsa__sched_end_failed(s, q, QSA_REQ_ERROR, r, qsa_last_error()); continue; }
        q->n_fed += k;
        s->n_prefill_tokens += k;
        if (!last) continue;
        q->status = QSA_REQ_DECODE;
        qsa__sched_accept(s, q, qsa__sched_draw(s, q, ck >= 0 ? &cq : NULL, 0));
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
    if (s->in_step) { /* (the step would go on with freed records) */
        qsa__fail(QSA_ERR_INVALID_ARGUMENT, "qsa_sched_free: called from inside a step (a callback): nothing freed");
        qsa__log(QSA_LOG_ERROR, "%s", qsa_last_error());
        return;
    }
    for (int i = 0; i < s->n_reqs; i++) qsa_sched_cancel(s, s->reqs[i]->id);
    for (int i = 0; i < s->n_reqs; i++) qsa__sched_req_free(s->reqs[i]);
    qsa__free(s->reqs);
    qsa_host_free(s->logits);
    qsa__free(s->b_seq);
    qsa__free(s->b_tok);
    qsa__free(s->b_next);
    qsa__free(s->b_pos);
    qsa__free(s->b_req);
    qsa__free(s->b_smp);
    qsa_host_free(s->cand);
    qsa__free(s);
}

#endif /* QSA_RUNTIME_IMPLEMENTATION_DONE */
#endif /* QSA_RUNTIME_IMPLEMENTATION */
