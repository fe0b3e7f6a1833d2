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
