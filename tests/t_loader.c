/* tests/t_loader.c - JSON parser, config.json, safetensors: valid files and hostile input */

/* ---- JSON ---- */

static qsa_result tl_json(const char *text, qsa__json_doc *doc) {
    return qsa__json_parse(text, strlen(text), "t.json", doc);
}
/* expects a parse failure with QSA_ERR_FORMAT and `needle` in the message */
#define TL_JSON_BAD(text, needle) do { qsa__json_doc d_; \
    CHECK_ERR(tl_json(text, &d_), QSA_ERR_FORMAT, needle); CHECK(d_.root == NULL); } while (0)

TEST(cpu, json_values) {
    qsa__json_doc d;
    CHECK_OK(tl_json(" {\"a\": [1, -2, 3.5, 1e3, -0, true, false, null, \"x\\ty\"], \"b\": {}, \"c\": [], "
                     "\"big\": 18446744073709551616, \"max\": 9223372036854775807, \"min\": -9223372036854775808,"
                     "\"u\": \"\\u00e9\\ud83d\\ude00\\u0000z\", \"a\": 7 } ", &d));
    if (!d.root) return;
    CHECK(d.root->type == QSA__JSON_OBJECT && d.root->count == 8);
    const qsa__json *a = d.root->child;
    CHECK(a->type == QSA__JSON_ARRAY && a->count == 9 && a->key_len == 1 && !strcmp(a->key, "a"));
    const qsa__json *e = a->child;
    CHECK(e->type == QSA__JSON_NUMBER && e->is_int && e->i64 == 1 && e->num == 1.0);
    e = e->next; CHECK(e->is_int && e->i64 == -2);
    e = e->next; CHECK(!e->is_int && e->num == 3.5);
    e = e->next; CHECK(e->num == 1000.0 && e->is_int && e->i64 == 1000);
    e = e->next; CHECK(e->is_int && e->i64 == 0);
    e = e->next; CHECK(e->type == QSA__JSON_TRUE);
    e = e->next; CHECK(e->type == QSA__JSON_FALSE);
    e = e->next; CHECK(e->type == QSA__JSON_NULL);
    e = e->next; CHECK(e->type == QSA__JSON_STRING && e->len == 3 && !strcmp(e->str, "x\ty"));
    CHECK(e->next == NULL);
    const qsa__json *v = qsa__json_get(d.root, "a"); /* repeated name: the last wins */
    CHECK(v && v->is_int && v->i64 == 7);
    v = qsa__json_get(d.root, "b"); CHECK(v && v->type == QSA__JSON_OBJECT && v->count == 0 && !v->child);
    v = qsa__json_get(d.root, "c"); CHECK(v && v->type == QSA__JSON_ARRAY && v->count == 0);
    v = qsa__json_get(d.root, "big"); CHECK(v && !v->is_int && v->num == 18446744073709551616.0);
    v = qsa__json_get(d.root, "max"); CHECK(v && v->is_int && v->i64 == INT64_MAX);
    v = qsa__json_get(d.root, "min"); CHECK(v && v->is_int && v->i64 == INT64_MIN);
    uint64_t u = 1;
    CHECK(!qsa__json_u64(qsa__json_get(d.root, "big"), &u) && !qsa__json_u64(qsa__json_get(d.root, "min"), &u) && u == 1);
    CHECK(qsa__json_u64(qsa__json_get(d.root, "max"), &u) && u == INT64_MAX);
    CHECK(qsa__json_u64(a->child->next->next->next, &u) && u == 1000);       /* 1e3 */
    CHECK(qsa__json_u64(a->child->next->next->next->next, &u) && u == 0);    /* -0 */
    CHECK(!qsa__json_u64(a->child->next, &u) && !qsa__json_u64(a->child->next->next, &u)); /* -2, 3.5 */
    v = qsa__json_get(d.root, "u");
    CHECK(v && v->len == 8 && !memcmp(v->str, "\xc3\xa9\xf0\x9f\x98\x80\0z", 9));
    CHECK(qsa__json_get(d.root, "zz") == NULL);
    CHECK(qsa__json_get(a, "a") == NULL); /* not an object */
    qsa__json_free(&d);
    CHECK_OK(tl_json("\"\xe2\x82\xac \xf4\x8f\xbf\xbf\"", &d)); /* euro sign, U+10FFFF */
    if (d.root) CHECK(d.root->len == 8);
    qsa__json_free(&d);
    CHECK_OK(tl_json("[18446744073709551615, 9223372036854775808]", &d)); /* past int64, within uint64 */
    if (d.root) {
        CHECK(!d.root->child->is_int && qsa__json_u64(d.root->child, &u) && u == UINT64_MAX);
        CHECK(qsa__json_u64(d.root->child->next, &u) && u == (uint64_t)INT64_MAX + 1);
        CHECK(d.root->child->num == 18446744073709551616.0);
    }
    qsa__json_free(&d);
    CHECK_OK(tl_json("0.1", &d));
    if (d.root) CHECK(d.root->num == 0.1 && !d.root->is_int);
    qsa__json_free(&d);
    CHECK_OK(tl_json("1e-06", &d));
    if (d.root) CHECK(d.root->num == 1e-6);
    qsa__json_free(&d);
    CHECK_OK(tl_json("3.14159265358979323846264338327950288", &d));
    if (d.root) CHECK(d.root->num == 3.14159265358979323846);
    qsa__json_free(&d);
}

TEST(cpu, json_malformed) {
    TL_JSON_BAD("", "line 1 col 1: unexpected end of input");
    TL_JSON_BAD("   ", "unexpected end");
    TL_JSON_BAD("{", "unexpected end of input in object");
    TL_JSON_BAD("[1,", "unexpected end of input");
    TL_JSON_BAD("[1 2]", "',' or ']' expected");
    TL_JSON_BAD("[1,]", "trailing comma");
    TL_JSON_BAD("{\"a\":1,}", "trailing comma");
    TL_JSON_BAD("{\"a\" 1}", "':' expected");
    TL_JSON_BAD("{a:1}", "member name");
    TL_JSON_BAD("{\"a\":1 \"b\":2}", "',' or '}' expected");
    TL_JSON_BAD("[01]", "leading zero");
    TL_JSON_BAD("[-01]", "leading zero");
    TL_JSON_BAD("[1.]", "after '.'");
    TL_JSON_BAD("[.5]", "unexpected character");
    TL_JSON_BAD("[1e]", "exponent");
    TL_JSON_BAD("[-]", "digit expected");
    TL_JSON_BAD("[+1]", "unexpected character");
    TL_JSON_BAD("[NaN]", "unexpected character");
    TL_JSON_BAD("[Infinity]", "unexpected character");
    TL_JSON_BAD("[tru]", "unexpected character");
    TL_JSON_BAD("[nul]", "unexpected character");
    TL_JSON_BAD("{} x", "trailing characters");
    TL_JSON_BAD("1 2", "trailing characters");
    TL_JSON_BAD("\"abc", "unterminated string");
    TL_JSON_BAD("\"abc\\", "unterminated string");
    TL_JSON_BAD("\"a\tb\"", "control character");
    TL_JSON_BAD("\"\\x\"", "invalid escape");
    TL_JSON_BAD("\"\\u12g4\"", "bad \\u escape");
    TL_JSON_BAD("\"\\u12\"", "bad \\u escape");
    TL_JSON_BAD("['a']", "unexpected character");
    TL_JSON_BAD("[1]\n\n  ]", "line 3 col 3: trailing characters");
    TL_JSON_BAD("{\"a\":\n  [1,\n   2,,3]}", "line 3 col 6");
    TL_JSON_BAD("/* c */ 1", "unexpected character");
    /* embedded NUL outside strings */
    qsa__json_doc d;
    CHECK_ERR(qsa__json_parse("[1]\0", 4, "nul.json", &d), QSA_ERR_FORMAT, "nul.json: line 1 col 4: trailing");
    CHECK_ERR(qsa__json_parse(NULL, 0, NULL, &d), QSA_ERR_FORMAT, "JSON: line 1 col 1");
}

TEST(cpu, json_unicode_hostile) {
    TL_JSON_BAD("\"\\ud800\"", "lone high surrogate");
    TL_JSON_BAD("\"\\ud800x\"", "lone high surrogate");
    TL_JSON_BAD("\"\\ud800\\u0041\"", "lone high surrogate");
    TL_JSON_BAD("\"\\udc00\"", "lone low surrogate");
    TL_JSON_BAD("\"\\udc00\\ud800\"", "lone low surrogate");
    TL_JSON_BAD("\"\xc0\xaf\"", "invalid UTF-8");          /* overlong '/' */
    TL_JSON_BAD("\"\xc1\xbf\"", "invalid UTF-8");          /* overlong */
    TL_JSON_BAD("\"\xe0\x80\xaf\"", "invalid UTF-8");      /* overlong 3-byte */
    TL_JSON_BAD("\"\xf0\x80\x80\xaf\"", "invalid UTF-8");  /* overlong 4-byte */
    TL_JSON_BAD("\"\xed\xa0\x80\"", "invalid UTF-8");      /* encoded surrogate U+D800 */
    TL_JSON_BAD("\"\xf4\x90\x80\x80\"", "invalid UTF-8");  /* U+110000 */
    TL_JSON_BAD("\"\xf5\x80\x80\x80\"", "invalid UTF-8");
    TL_JSON_BAD("\"\x80\"", "invalid UTF-8");              /* lone continuation */
    TL_JSON_BAD("\"\xc3\"", "invalid UTF-8");              /* truncated sequence */
    TL_JSON_BAD("\"\xe2\x82\"", "invalid UTF-8");
    TL_JSON_BAD("\"\xff\"", "invalid UTF-8");
    TL_JSON_BAD("{\"k\xc3\x28\": 1}", "invalid UTF-8");    /* in a member name */
    TL_JSON_BAD("[\xc3\xa9]", "unexpected character");     /* valid UTF-8 outside a string */
    TL_JSON_BAD("[\xc3]", "invalid UTF-8");
}

TEST(cpu, json_deep_nesting) {
    size_t n = 10000;
    char *s = QSA__ALLOC(char, 2 * n + 1);
    for (size_t i = 0; i < n; i++) { s[i] = '['; s[2 * n - 1 - i] = ']'; }
    s[2 * n] = 0;
    qsa__json_doc d;
    CHECK_ERR(qsa__json_parse(s, 2 * n, "deep.json", &d), QSA_ERR_FORMAT, "nesting depth exceeds 128");
    for (size_t i = 0; i + 5 <= n; i += 5) memcpy(s + i, "{\"a\":", 5);
    CHECK_ERR(qsa__json_parse(s, n, "deep2.json", &d), QSA_ERR_FORMAT, "deep2.json: line 1 col 641: nesting depth");
    /* exactly at the limit is fine */
    int k = QSA__JSON_MAX_DEPTH;
    for (int i = 0; i < k; i++) { s[i] = '['; s[2 * k - 1 - i] = ']'; }
    CHECK_OK(qsa__json_parse(s, (size_t)(2 * k), "ok.json", &d));
    qsa__json_free(&d);
    qsa__free(s);
}

TEST(cpu, json_large_tokenizer_file) {
    const char *path = getenv("QSA_TOKENIZER_JSON");
    if (!path) path = "/work/shared/data/qwen3-tokenizer/tokenizer.json";
    char *text = NULL;
    size_t len = 0;
    if (!qsa__file_exists(path)) SKIP("%s missing", path);
    CHECK_OK(qsa__read_file(path, &text, &len));
    if (!text) return;
    double t0 = qsa__now();
    qsa__json_doc d;
    CHECK_OK(qsa__json_parse(text, len, path, &d));
    double t1 = qsa__now();
    if (T_.verbose) printf("    parsed %zu bytes in %.1f ms\n", len, 1e3 * (t1 - t0));
    const qsa__json *vocab = qsa__json_get(qsa__json_get(d.root, "model"), "vocab");
    CHECK(vocab && vocab->type == QSA__JSON_OBJECT && vocab->count > 100000);
    qsa__json_free(&d);
    qsa__free(text);
}

/* ---- temp directories ---- */

typedef struct tl_tmp { char dir[256]; char files[64][320]; int nfiles; } tl_tmp;
static int tl_mkdtemp(tl_tmp *t) {
    memset(t, 0, sizeof *t);
    snprintf(t->dir, sizeof t->dir, "/tmp/qsa_t_loader_XXXXXX");
    return mkdtemp(t->dir) != NULL;
}
/* writes dir/name (remembered for cleanup); returns the path (valid until the next call) */
static const char *tl_write(tl_tmp *t, const char *name, const void *data, size_t len) {
    static char path[320];
    snprintf(path, sizeof path, "%s/%s", t->dir, name);
    FILE *f = fopen(path, "wb");
    if (!f) { printf("    cannot write %s\n", path); return path; }
    if (len) fwrite(data, 1, len, f);
    fclose(f);
    int known = 0;
    for (int i = 0; i < t->nfiles; i++) if (!strcmp(t->files[i], path)) known = 1;
    if (!known && t->nfiles < 64) snprintf(t->files[t->nfiles++], sizeof t->files[0], "%s", path);
    return path;
}
static const char *tl_write_str(tl_tmp *t, const char *name, const char *s) { return tl_write(t, name, s, strlen(s)); }
static void tl_rmdtemp(tl_tmp *t) {
    for (int i = 0; i < t->nfiles; i++) unlink(t->files[i]);
    rmdir(t->dir);
}

/* ---- config.json ---- */

/* a valid tiny text config: 4 layers (3 GDN + 1 QSA), PLE on layer 2 */
#define TL_CFG_BODY \
    "\"model_type\":\"qwen4_exp_text\",\"vocab_size\":256,\"hidden_size\":64,\"num_hidden_layers\":4," \
    "\"num_attention_heads\":4,\"num_key_value_heads\":2,\"head_dim\":16,\"linear_key_head_dim\":8," \
    "\"linear_value_head_dim\":8,\"linear_num_key_heads\":2,\"linear_num_value_heads\":4,\"moe_intermediate_size\":32," \
    "\"shared_expert_intermediate_size\":32,\"num_experts\":4,\"num_experts_per_tok\":2,\"hc_count\":2,\"hc_lowrank\":8," \
    "\"ple_layer_ids\":[2],\"ple_embed_dim\":32,\"ngram_size\":3,\"heads_per_ngram\":2,\"ngram_vocab_size_base\":101," \
    "\"make_ngram_vocab_size_divisible_by\":8,\"split_ngram_parts\":2,\"indexer_n_heads\":2,\"indexer_kv_heads\":1," \
    "\"indexer_head_dim\":16,\"indexer_budget\":8,\"indexer_compress_ratio\":4,\"eos_token_id\":[5,6]," \
    "\"rope_parameters\":{\"rope_type\":\"default\",\"rope_theta\":10000.0,\"partial_rotary_factor\":0.5}," \
    "\"max_position_embeddings\":1024,\"output_gate_type\":null,\"bos_token_id\":null"

/* the base config with `extra` members appended (a repeated name overrides: the last one wins) */
static qsa_result tl_cfg(const char *extra, qsa_model_config *c) {
    char buf[4096];
    snprintf(buf, sizeof buf, "{" TL_CFG_BODY "%s%s}", extra[0] ? "," : "", extra);
    return qsa_config_parse(buf, strlen(buf), NULL, 0, "cfg.json", c);
}

TEST(cpu, config_valid_flat_and_nested) {
    qsa_model_config c, n;
    CHECK_OK(tl_cfg("", &c));
    CHECK(!strcmp(c.model_type, "qwen4_exp_text"));
    CHECK(c.vocab_size == 256 && c.hidden_size == 64 && c.num_hidden_layers == 4 && c.head_dim == 16);
    CHECK(c.num_attention_heads == 4 && c.num_key_value_heads == 2);
    CHECK(c.rotary_dim == 8 && c.partial_rotary_factor == 0.5f && c.rope_theta == 10000.0);
    CHECK(c.layer_types[0] == QSA_LAYER_LINEAR && c.layer_types[1] == QSA_LAYER_LINEAR && c.layer_types[2] == QSA_LAYER_LINEAR &&
          c.layer_types[3] == QSA_LAYER_QSA);
    CHECK(c.n_ple_layers == 1 && c.ple_layer_ids[0] == 2 && c.ple_embed_dim == 32);
    CHECK(c.has_qsa && c.indexer_n_heads == 2 && c.indexer_kv_heads == 1 && c.indexer_head_dim == 16 && c.indexer_budget == 8 &&
          c.indexer_compress_ratio == 4);
    CHECK(c.n_eos == 2 && c.eos_token_ids[0] == 5 && c.eos_token_ids[1] == 6);
    CHECK(c.bos_token_id == -1 && c.pad_token_id == -1);
    CHECK(c.hidden_act == QSA_ACT_SILU && c.output_gate_act == QSA_ACT_SILU);
    CHECK(c.hc_count == 2 && c.hc_lowrank == 8 && c.num_experts == 4 && c.num_experts_per_tok == 2 && c.norm_topk_prob == 1);
    CHECK(c.ngram_size == 3 && c.heads_per_ngram == 2 && c.ngram_vocab_size_base == 101 && c.seed == 1234 &&
          c.split_ngram_parts == 2 && c.make_ngram_vocab_size_divisible_by == 8 && c.ple_conv_kernel_size == 4);
    CHECK(c.linear_conv_kernel_dim == 4 && c.rms_norm_eps == 1e-6f && c.max_position_embeddings == 1024);
    CHECK(!c.nvfp4 && !c.tie_word_embeddings && !c.attention_bias);
    /* nested (multimodal wrapper): the same text config */
    const char *nested = "{\"model_type\":\"qwen4_exp\",\"architectures\":[\"Qwen4ExpForConditionalGeneration\"],"
                         "\"vision_config\":{\"depth\":2,\"model_type\":\"qwen4_exp_vision\"},\"image_token_id\":248056,"
                         "\"text_config\":{" TL_CFG_BODY "}}";
    CHECK_OK(qsa_config_parse(nested, strlen(nested), NULL, 0, "nested.json", &n));
    CHECK(memcmp(&c, &n, sizeof c) == 0);
    /* the nested form names fields with their path */
    const char *bad = "{\"model_type\":\"qwen4_exp\",\"text_config\":{" TL_CFG_BODY ",\"hc_count\":1}}";
    CHECK_ERR(qsa_config_parse(bad, strlen(bad), NULL, 0, "nested.json", &n), QSA_ERR_FORMAT,
              "nested.json: text_config.hc_count: Qwen4-Exp requires hc_count > 1, found 1");
    const char *badtc = "{\"model_type\":\"qwen4_exp\",\"text_config\":[1]}";
    CHECK_ERR(qsa_config_parse(badtc, strlen(badtc), NULL, 0, "n.json", &n), QSA_ERR_FORMAT, "text_config: expected an object");
    /* eos as a single integer */
    CHECK_OK(tl_cfg("\"eos_token_id\": 7", &c));
    CHECK(c.n_eos == 1 && c.eos_token_ids[0] == 7);
    /* gated activation and legacy RoPE keys */
    CHECK_OK(tl_cfg("\"output_gate_type\":\"sigmoid\",\"rope_parameters\":null,\"rope_theta\":5000000,"
                    "\"partial_rotary_factor\":0.25,\"bos_token_id\":1,\"pad_token_id\":-1", &c));
    CHECK(c.output_gate_act == QSA_ACT_SIGMOID && c.hidden_act == QSA_ACT_SILU);
    CHECK(c.rope_theta == 5e6 && c.rotary_dim == 4 && c.bos_token_id == 1 && c.pad_token_id == -1);
    /* rope_parameters wins over the legacy key; a missing partial_rotary_factor means 1.0 */
    CHECK_OK(tl_cfg("\"rope_theta\":5,\"rope_parameters\":{\"rope_theta\":1e6,\"mrope_section\":[11,11,10]},\"indexer_head_dim\":16", &c));
    CHECK(c.rope_theta == 1e6 && c.rotary_dim == 16 && c.partial_rotary_factor == 1.0f);
    /* ple_layer_ids are sorted and de-duplicated like sorted(set(ids)) */
    CHECK_OK(tl_cfg("\"ple_layer_ids\":[3,1,3,2,1]", &c));
    CHECK(c.n_ple_layers == 3 && c.ple_layer_ids[0] == 1 && c.ple_layer_ids[1] == 2 && c.ple_layer_ids[2] == 3);
    /* no PLE: eos may be absent */
    CHECK_OK(tl_cfg("\"ple_layer_ids\":[],\"eos_token_id\":null", &c));
    CHECK(c.n_ple_layers == 0 && c.n_eos == 0);
    /* ple_embed_dim defaults to hidden_size */
    CHECK_OK(tl_cfg("\"ple_embed_dim\":null", &c));
    CHECK(c.ple_embed_dim == 64);
}

TEST(cpu, config_layer_types) {
    qsa_model_config c;
    /* no layer_types: every full_attention_interval-th layer (default 4) */
    CHECK_OK(tl_cfg("\"num_hidden_layers\":8,\"layer_types\":null", &c));
    for (int i = 0; i < 8; i++) CHECKF(c.layer_types[i] == (((i + 1) % 4) ? QSA_LAYER_LINEAR : QSA_LAYER_QSA), "layer %d", i);
    CHECK_OK(tl_cfg("\"full_attention_interval\":2,\"ple_layer_ids\":[1,3]", &c));
    CHECK(c.layer_types[0] == QSA_LAYER_LINEAR && c.layer_types[1] == QSA_LAYER_QSA && c.layer_types[2] == QSA_LAYER_LINEAR &&
          c.layer_types[3] == QSA_LAYER_QSA);
    CHECK_ERR(tl_cfg("\"full_attention_interval\":0", &c), QSA_ERR_FORMAT, "full_attention_interval: expected a positive integer");
    /* explicit list; "full_attention" means qwen_sparse_attention; the interval is then ignored */
    CHECK_OK(tl_cfg("\"full_attention_interval\":1,\"layer_types\":[\"full_attention\",\"linear_attention\",\"linear_attention\","
                    "\"qwen_sparse_attention\"]", &c));
    CHECK(c.layer_types[0] == QSA_LAYER_QSA && c.layer_types[1] == QSA_LAYER_LINEAR && c.layer_types[3] == QSA_LAYER_QSA);
    CHECK_ERR(tl_cfg("\"layer_types\":[\"linear_attention\",\"sliding_attention\",\"linear_attention\",\"full_attention\"]", &c),
              QSA_ERR_UNSUPPORTED, "cfg.json: layer_types: unsupported Qwen4-Exp layer type \"sliding_attention\"");
    CHECK_ERR(tl_cfg("\"layer_types\":[\"linear_attention\",\"linear_attention\",\"full_attention\"]", &c), QSA_ERR_FORMAT,
              "num_hidden_layers (4) must equal the number of layer_types (3)");
    CHECK_ERR(tl_cfg("\"layer_types\":[\"linear_attention\",\"linear_attention\",\"linear_attention\",4]", &c), QSA_ERR_FORMAT,
              "layer_types: expected a list of strings, found 4");
    CHECK_ERR(tl_cfg("\"layer_types\":\"linear_attention\"", &c), QSA_ERR_FORMAT, "layer_types: expected a list of strings");
    CHECK_ERR(tl_cfg("\"num_hidden_layers\":513", &c), QSA_ERR_FORMAT, "num_hidden_layers: expected 1..512");
    CHECK_ERR(tl_cfg("\"num_hidden_layers\":0", &c), QSA_ERR_FORMAT, "num_hidden_layers: expected 1..512");
    /* QSA layers need the indexer */
    CHECK_ERR(tl_cfg("\"indexer_n_heads\":null,\"indexer_kv_heads\":null,\"indexer_head_dim\":null,\"indexer_budget\":null,"
                     "\"indexer_compress_ratio\":null", &c), QSA_ERR_FORMAT, "1 qwen_sparse_attention layers but the QSA indexer fields");
    CHECK_OK(tl_cfg("\"indexer_n_heads\":null,\"indexer_kv_heads\":null,\"indexer_head_dim\":null,\"indexer_budget\":null,"
                    "\"indexer_compress_ratio\":null,\"layer_types\":[\"linear_attention\",\"linear_attention\",\"linear_attention\","
                    "\"linear_attention\"]", &c));
    CHECK(!c.has_qsa);
}

TEST(cpu, config_validation_rules) {
    qsa_model_config c;
    /* validate_architecture, rule by rule */
    CHECK_ERR(tl_cfg("\"output_gate_type\":\"gelu\"", &c), QSA_ERR_UNSUPPORTED,
              "output_gate_type: unsupported Qwen4-Exp output gate activation \"gelu\"");
    CHECK_ERR(tl_cfg("\"hidden_act\":\"gelu\"", &c), QSA_ERR_UNSUPPORTED, "hidden_act: unsupported Qwen4-Exp output gate activation");
    CHECK_ERR(tl_cfg("\"hc_count\":1", &c), QSA_ERR_FORMAT, "cfg.json: hc_count: Qwen4-Exp requires hc_count > 1, found 1");
    CHECK_ERR(tl_cfg("\"num_experts\":0", &c), QSA_ERR_FORMAT, "num_experts: must be > 0, found 0");
    CHECK_ERR(tl_cfg("\"num_experts_per_tok\":5", &c), QSA_ERR_FORMAT, "num_experts_per_tok: must be in [1, num_experts=4], found 5");
    CHECK_ERR(tl_cfg("\"num_experts_per_tok\":0", &c), QSA_ERR_FORMAT, "num_experts_per_tok");
    CHECK_ERR(tl_cfg("\"moe_intermediate_size\":0", &c), QSA_ERR_FORMAT, "moe_intermediate_size and shared_expert_intermediate_size must be > 0");
    CHECK_ERR(tl_cfg("\"shared_expert_intermediate_size\":-1", &c), QSA_ERR_FORMAT, "must be > 0, found 32 and -1");
    CHECK_ERR(tl_cfg("\"indexer_budget\":null", &c), QSA_ERR_FORMAT, "QSA config is missing required fields: indexer_budget");
    CHECK_ERR(tl_cfg("\"indexer_n_heads\":null,\"indexer_head_dim\":null", &c), QSA_ERR_FORMAT,
              "missing required fields: indexer_n_heads, indexer_head_dim");
    CHECK_ERR(tl_cfg("\"indexer_n_heads\":0", &c), QSA_ERR_FORMAT, "indexer_n_heads: QSA config values must be positive, found 0");
    CHECK_ERR(tl_cfg("\"indexer_kv_heads\":2", &c), QSA_ERR_FORMAT, "indexer_kv_heads: Qwen4-Exp QSA requires 1, found 2");
    CHECK_ERR(tl_cfg("\"indexer_budget\":10", &c), QSA_ERR_FORMAT, "indexer_budget (10) must be divisible by indexer_compress_ratio (4)");
    CHECK_ERR(tl_cfg("\"indexer_head_dim\":6", &c), QSA_ERR_FORMAT, "rotary_dim=8 (head_dim 16 * partial_rotary_factor 0.5) > indexer_head_dim=6");
    CHECK_ERR(tl_cfg("\"ple_embed_dim\":30", &c), QSA_ERR_FORMAT,
              "ple_embed_dim: must be positive and divisible by the number of n-gram heads (ngram_size-1)*heads_per_ngram = 4, found 30");
    CHECK_ERR(tl_cfg("\"ngram_size\":1", &c), QSA_ERR_FORMAT, "n-gram heads (ngram_size-1)*heads_per_ngram = 0");
    CHECK_ERR(tl_cfg("\"ple_layer_ids\":[0,2]", &c), QSA_ERR_FORMAT, "ple_layer_ids: must contain one-indexed ids in [1, 4], found 0");
    CHECK_ERR(tl_cfg("\"ple_layer_ids\":[2,5]", &c), QSA_ERR_FORMAT, "ple_layer_ids: must contain one-indexed ids in [1, 4], found 5");
    CHECK_ERR(tl_cfg("\"ple_layer_ids\":[4]", &c), QSA_ERR_FORMAT, "PLE is only supported on linear_attention layers, found PLE on layer 4");
    CHECK_ERR(tl_cfg("\"ple_layer_ids\":[2,\"3\"]", &c), QSA_ERR_FORMAT, "ple_layer_ids: expected a list of integers, found \"3\"");
    CHECK_ERR(tl_cfg("\"eos_token_id\":null", &c), QSA_ERR_FORMAT, "eos_token_id: must be set when Qwen4-Exp PLE layers are enabled");
    CHECK_ERR(tl_cfg("\"eos_token_id\":[]", &c), QSA_ERR_FORMAT, "eos_token_id: must be set");
    CHECK_ERR(tl_cfg("\"eos_token_id\":[1,-2]", &c), QSA_ERR_FORMAT, "eos_token_id: expected a token id");
    CHECK_ERR(tl_cfg("\"eos_token_id\":[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17]", &c), QSA_ERR_FORMAT, "at most 16 ids, found 17");
    /* runtime bounds */
    CHECK_ERR(tl_cfg("\"num_key_value_heads\":3", &c), QSA_ERR_FORMAT, "num_attention_heads (4) must be a multiple of num_key_value_heads (3)");
    CHECK_ERR(tl_cfg("\"linear_num_value_heads\":3", &c), QSA_ERR_FORMAT, "linear_num_value_heads (3) must be a multiple of linear_num_key_heads (2)");
    CHECK_ERR(tl_cfg("\"hidden_size\":0", &c), QSA_ERR_FORMAT, "hidden_size: expected 1..");
    CHECK_ERR(tl_cfg("\"vocab_size\":-5", &c), QSA_ERR_FORMAT, "vocab_size: expected 1..");
    CHECK_ERR(tl_cfg("\"head_dim\":0", &c), QSA_ERR_FORMAT, "head_dim");
    CHECK_ERR(tl_cfg("\"linear_num_key_heads\":0", &c), QSA_ERR_FORMAT, "linear_num_key_heads: expected 1..");
    CHECK_ERR(tl_cfg("\"rms_norm_eps\":0", &c), QSA_ERR_FORMAT, "rms_norm_eps");
    CHECK_ERR(tl_cfg("\"rope_parameters\":{\"rope_theta\":-1}", &c), QSA_ERR_FORMAT, "rope_theta: expected a positive number");
    /* positive as a double but 0 (or subnormal) as the float RoPE uses: inverse frequencies of inf, NaN logits */
    CHECK_ERR(tl_cfg("\"rope_parameters\":{\"rope_theta\":1e-46}", &c), QSA_ERR_FORMAT, "rope_theta: expected a positive number");
    CHECK_ERR(tl_cfg("\"rope_parameters\":{\"rope_theta\":1e-40}", &c), QSA_ERR_FORMAT, "rope_theta: expected a positive number");
    CHECK_ERR(tl_cfg("\"indexer_head_dim\":32,\"rope_parameters\":{\"partial_rotary_factor\":1.5}", &c), QSA_ERR_FORMAT, "partial_rotary_factor: expected a value in (0, 1]");
    CHECK_ERR(tl_cfg("\"rope_parameters\":{\"partial_rotary_factor\":0.1}", &c), QSA_ERR_FORMAT, "rotary_dim = int(head_dim 16 * partial_rotary_factor 0.1) = 1");
    CHECK_ERR(tl_cfg("\"rope_parameters\":{\"rope_type\":\"yarn\",\"factor\":4}", &c), QSA_ERR_UNSUPPORTED, "rope_type: only \"default\" RoPE");
    CHECK_ERR(tl_cfg("\"rope_parameters\":[1]", &c), QSA_ERR_FORMAT, "rope_parameters: expected an object");
    CHECK_ERR(tl_cfg("\"hidden_act\":\"gelu\",\"output_gate_type\":\"silu\"", &c), QSA_ERR_UNSUPPORTED, "hidden_act: the runtime supports");
    CHECK_ERR(tl_cfg("\"indexer_head_dim\":17", &c), QSA_ERR_FORMAT, "indexer_head_dim: expected an even number");
    CHECK_ERR(tl_cfg("\"ngram_vocab_size_base\":1", &c), QSA_ERR_FORMAT, "ngram_vocab_size_base: expected 2..2^40");
    CHECK_ERR(tl_cfg("\"split_ngram_parts\":0", &c), QSA_ERR_FORMAT, "split_ngram_parts: expected 1..");
    /* types */
    CHECK_ERR(tl_cfg("\"hidden_size\":\"64\"", &c), QSA_ERR_FORMAT, "cfg.json: hidden_size: expected an integer, found \"64\"");
    CHECK_ERR(tl_cfg("\"hidden_size\":64.5", &c), QSA_ERR_FORMAT, "hidden_size: expected an integer, found 64.5");
    CHECK_ERR(tl_cfg("\"hidden_size\":4294967296", &c), QSA_ERR_FORMAT, "hidden_size: expected an integer in [");
    CHECK_ERR(tl_cfg("\"tie_word_embeddings\":\"no\"", &c), QSA_ERR_FORMAT, "tie_word_embeddings: expected a boolean");
    CHECK_ERR(tl_cfg("\"rms_norm_eps\":[1]", &c), QSA_ERR_FORMAT, "rms_norm_eps: expected a number, found array");
    CHECK_ERR(tl_cfg("\"hidden_act\":1", &c), QSA_ERR_FORMAT, "hidden_act: expected a string");
    CHECK_ERR(tl_cfg("\"model_type\":\"llama\"", &c), QSA_ERR_UNSUPPORTED, "model_type: expected \"qwen4_exp\" or \"qwen4_exp_text\", found \"llama\"");
    CHECK_ERR(tl_cfg("\"model_type\":null", &c), QSA_ERR_FORMAT, "model_type: expected");
    CHECK_ERR(qsa_config_parse("[1]", 3, NULL, 0, "arr.json", &c), QSA_ERR_FORMAT, "arr.json: expected a JSON object at the top level");
    CHECK_ERR(qsa_config_parse("{\"model_type\":", 14, NULL, 0, "trunc.json", &c), QSA_ERR_FORMAT, "trunc.json: line 1 col 15");
    CHECK(c.vocab_size == 0); /* cleared on failure */
}

TEST(cpu, config_defaults_match_reference) {
    /* only the QSA fields given (the reference class cannot build QSA layers without them) */
    const char *j = "{\"model_type\":\"qwen4_exp_text\",\"indexer_n_heads\":8,\"indexer_kv_heads\":1,\"indexer_head_dim\":256,"
                    "\"indexer_budget\":2048,\"indexer_compress_ratio\":4}";
    qsa_model_config c;
    CHECK_OK(qsa_config_parse(j, strlen(j), NULL, 0, "d.json", &c));
    CHECK(c.vocab_size == 248320 && c.hidden_size == 2048 && c.num_hidden_layers == 40 && c.num_attention_heads == 16);
    CHECK(c.num_key_value_heads == 2 && c.head_dim == 256 && c.max_position_embeddings == 32768 && c.rms_norm_eps == 1e-6f);
    CHECK(c.linear_conv_kernel_dim == 4 && c.linear_key_head_dim == 128 && c.linear_value_head_dim == 128);
    CHECK(c.linear_num_key_heads == 16 && c.linear_num_value_heads == 32);
    CHECK(c.moe_intermediate_size == 512 && c.shared_expert_intermediate_size == 512 && c.num_experts_per_tok == 10 && c.num_experts == 512);
    CHECK(c.hc_count == 4 && c.hc_lowrank == 320 && c.n_ple_layers == 0 && c.ple_embed_dim == 2048 && c.ple_conv_kernel_size == 4);
    CHECK(c.ngram_size == 3 && c.heads_per_ngram == 8 && c.ngram_vocab_size_base == 20000000 && c.make_ngram_vocab_size_divisible_by == 128);
    CHECK(c.seed == 1234 && c.split_ngram_parts == 512 && c.norm_topk_prob == 1 && c.tie_word_embeddings == 0);
    CHECK(c.rope_theta == 10000.0 && c.partial_rotary_factor == 1.0f && c.rotary_dim == 256);
    int nq = 0;
    for (int i = 0; i < 40; i++) nq += c.layer_types[i] == QSA_LAYER_QSA;
    CHECK(nq == 10 && c.layer_types[3] == QSA_LAYER_QSA && c.layer_types[0] == QSA_LAYER_LINEAR);
    CHECK(c.n_eos == 0 && c.bos_token_id == -1);
}

TEST(cpu, config_nvfp4_detection) {
    qsa_model_config c;
    CHECK_OK(tl_cfg("\"quantization_config\":{\"quant_method\":\"modelopt\",\"quant_algo\":\"NVFP4\",\"producer\":{\"name\":\"modelopt\"},"
                    "\"config_groups\":{\"group_0\":{\"weights\":{\"num_bits\":4,\"type\":\"float\",\"group_size\":16}}},"
                    "\"ignore\":[\"lm_head\",\"model.layers.*.mlp.gate\",\"*linear_attn*\"]}", &c));
    CHECK(c.nvfp4 == 1 && c.quant_group_size == 16 && c.quant_format == QSA_QUANT_MODELOPT && c.n_quant_exclude == 3);
    CHECK(qsa_config_quant_excluded(&c, "lm_head") && qsa_config_quant_excluded(&c, "model.layers.7.mlp.gate"));
    CHECK(qsa_config_quant_excluded(&c, "model.layers.0.linear_attn.in_proj_qkv"));
    CHECK(!qsa_config_quant_excluded(&c, "model.layers.7.mlp.experts.3.up_proj"));
    CHECK_ERR(tl_cfg("\"quantization_config\":{\"quant_method\":\"modelopt\",\"quant_algo\":\"FP8\"}", &c), QSA_ERR_UNSUPPORTED,
              "quantization_config.quant_algo: only NVFP4 (ModelOpt) is supported, found \"FP8\"");
    CHECK_ERR(tl_cfg("\"quantization_config\":{\"quant_method\":\"modelopt\",\"quant_algo\":\"NVFP4\",\"group_size\":32}", &c),
              QSA_ERR_UNSUPPORTED, "group_size: NVFP4 needs 16, found 32");
    CHECK_ERR(tl_cfg("\"quantization_config\":{\"quant_method\":\"gptq\",\"bits\":4}", &c), QSA_ERR_UNSUPPORTED,
              "quantization_config.quant_method: only modelopt (NVFP4) and compressed-tensors (nvfp4-pack-quantized) are supported, found \"gptq\"");
    CHECK_ERR(tl_cfg("\"quantization_config\":7", &c), QSA_ERR_FORMAT, "quantization_config: expected an object");
    CHECK_OK(tl_cfg("\"quantization_config\":{\"quant_method\":\"compressed-tensors\",\"format\":\"mixed\",\"config_groups\":{\"g\":"
                    "{\"format\":\"nvfp4-pack-quantized\",\"weights\":{\"group_size\":16}}},\"ignore\":[\"lm_head\",\"re:.*gate$\"]}", &c));
    CHECK(c.nvfp4 && c.quant_format == QSA_QUANT_COMPRESSED_TENSORS && c.n_quant_exclude == 2);
    CHECK(!qsa_config_quant_excluded(&c, "model.layers.0.mlp.gate")); /* regex patterns are not evaluated */
    CHECK_ERR(tl_cfg("\"quantization_config\":{\"quant_method\":\"compressed-tensors\",\"format\":\"float-quantized\"}", &c),
              QSA_ERR_UNSUPPORTED, "only nvfp4-pack-quantized is supported for compressed-tensors, found \"float-quantized\"");
    /* hf_quant_config.json */
    char buf[4096];
    snprintf(buf, sizeof buf, "{" TL_CFG_BODY "}");
    const char *hq = "{\"producer\":{\"name\":\"modelopt\",\"version\":\"0.31.0\"},\"quantization\":{\"quant_algo\":\"NVFP4\","
                     "\"kv_cache_quant_algo\":null,\"group_size\":16,\"exclude_modules\":[\"lm_head\",\"model.layers.*.mlp.gate\"]}}";
    CHECK_OK(qsa_config_parse(buf, strlen(buf), hq, strlen(hq), "cfg.json", &c));
    CHECK(c.nvfp4 && c.quant_group_size == 16 && c.n_quant_exclude == 2 && qsa_config_quant_excluded(&c, "lm_head"));
    const char *hq2 = "{\"quantization\":{\"quant_algo\":\"MIXED_PRECISION\",\"quantized_layers\":{\"model.layers.0.mlp.experts.0.up_proj\":"
                      "{\"quant_algo\":\"FP8\"}}}}";
    CHECK_ERR(qsa_config_parse(buf, strlen(buf), hq2, strlen(hq2), "cfg.json", &c), QSA_ERR_UNSUPPORTED,
              "hf_quant_config.json: quantization.quantized_layers.model.layers.0.mlp.experts.0.up_proj.quant_algo: only NVFP4");
    const char *hq3 = "{\"quantization\":{\"quant_algo\":\"MIXED_PRECISION\",\"quantized_layers\":{\"a\":{\"quant_algo\":\"NVFP4\",\"group_size\":16}}}}";
    CHECK_OK(qsa_config_parse(buf, strlen(buf), hq3, strlen(hq3), "cfg.json", &c));
    CHECK(c.nvfp4);
    CHECK_ERR(qsa_config_parse(buf, strlen(buf), "{\"quant\":1}", 11, "cfg.json", &c), QSA_ERR_FORMAT,
              "hf_quant_config.json: quantization: expected an object, found absent");
    CHECK_ERR(qsa_config_parse(buf, strlen(buf), "{\"quantization\":", 16, "cfg.json", &c), QSA_ERR_FORMAT, "hf_quant_config.json: line 1");
}

TEST(cpu, config_load_dir_and_generation_config) {
    tl_tmp t;
    if (!tl_mkdtemp(&t)) SKIP("mkdtemp failed");
    qsa_model_config c;
    CHECK_ERR(qsa_config_load_dir(t.dir, &c), QSA_ERR_IO, "config.json");
    char buf[4096];
    snprintf(buf, sizeof buf, "{" TL_CFG_BODY "}");
    tl_write_str(&t, "config.json", buf);
    CHECK_OK(qsa_config_load_dir(t.dir, &c));
    CHECK(c.hidden_size == 64 && !c.nvfp4);
    tl_write_str(&t, "hf_quant_config.json", "{\"quantization\":{\"quant_algo\":\"NVFP4\",\"group_size\":16}}");
    CHECK_OK(qsa_config_load_dir(t.dir, &c));
    CHECK(c.nvfp4 && c.quant_format == QSA_QUANT_MODELOPT);
    tl_write_str(&t, "hf_quant_config.json", "{\"quantization\":{\"quant_algo\":\"W4A8_AWQ\"}}");
    CHECK_ERR(qsa_config_load_dir(t.dir, &c), QSA_ERR_UNSUPPORTED, "hf_quant_config.json: quantization.quant_algo: only NVFP4");
    tl_write_str(&t, "config.json", "{\"model_type\":\"qwen4_exp_text\",\"hc_count\":1}");
    CHECK_ERR(qsa_config_load_dir(t.dir, &c), QSA_ERR_FORMAT, "/config.json: hc_count");
    tl_rmdtemp(&t);

    qsa_generation_config g;
    const char *gj = "{\"bos_token_id\":1,\"do_sample\":true,\"eos_token_id\":[248046,248044],\"pad_token_id\":248044,"
                     "\"temperature\":0.6,\"top_k\":20,\"top_p\":0.95,\"transformers_version\":\"5.17.0\"}";
    CHECK_OK(qsa_generation_config_parse(gj, strlen(gj), "gen.json", &g));
    CHECK(g.has_temperature && g.temperature == 0.6f && g.has_top_k && g.top_k == 20 && g.has_top_p && g.top_p == 0.95f);
    CHECK(g.has_do_sample && g.do_sample == 1 && !g.has_min_p && !g.has_repetition_penalty);
    CHECK(g.n_eos == 2 && g.eos_token_ids[0] == 248046 && g.eos_token_ids[1] == 248044);
    CHECK_OK(qsa_generation_config_parse("{\"eos_token_id\":7}", 18, "gen.json", &g));
    CHECK(g.n_eos == 1 && g.eos_token_ids[0] == 7 && !g.has_temperature);
    CHECK_ERR(qsa_generation_config_parse("{\"top_p\":2}", 11, "gen.json", &g), QSA_ERR_FORMAT, "gen.json: top_p: expected a value in [0, 1], found 2");
    CHECK_ERR(qsa_generation_config_parse("{\"temperature\":\"hot\"}", 21, "gen.json", &g), QSA_ERR_FORMAT, "temperature: expected a number");
    CHECK_ERR(qsa_generation_config_parse("{\"top_k\":-1}", 12, "gen.json", &g), QSA_ERR_FORMAT, "top_k: expected >= 0");
    CHECK_ERR(qsa_generation_config_parse("{\"eos_token_id\":\"x\"}", 20, "gen.json", &g), QSA_ERR_FORMAT, "eos_token_id");
    CHECK_ERR(qsa_generation_config_parse("{", 1, "gen.json", &g), QSA_ERR_FORMAT, "gen.json: line 1 col 2");
}

/* ---- safetensors ---- */

/* 8-byte little-endian length + header + data */
static size_t tl_st_image(const char *header, const void *data, size_t data_len, uint8_t *out, size_t cap) {
    size_t h = strlen(header);
    if (8 + h + data_len > cap) return 0;
    for (int i = 0; i < 8; i++) out[i] = (uint8_t)((uint64_t)h >> (8 * i));
    memcpy(out + 8, header, h);
    if (data_len) memcpy(out + 8 + h, data, data_len);
    return 8 + h + data_len;
}
static const char *tl_st_write(tl_tmp *t, const char *name, const char *header, const void *data, size_t data_len) {
    static uint8_t buf[1 << 16];
    size_t n = tl_st_image(header, data, data_len, buf, sizeof buf);
    return tl_write(t, name, buf, n);
}
/* opens a one-file image from memory */
static qsa_result tl_st_mem(const char *header, size_t data_len, qsa__st_set *s) {
    static uint8_t buf[1 << 16], zeros[4096];
    size_t n = tl_st_image(header, zeros, data_len, buf, sizeof buf);
    return qsa__st_open_memory(buf, n, "mem.safetensors", s);
}

TEST(cpu, safetensors_valid_file) {
    tl_tmp t;
    if (!tl_mkdtemp(&t)) SKIP("mkdtemp failed");
    uint8_t data[256];
    memset(data, 0, sizeof data);
    float f[4] = {1.5f, -2.0f, 100000.0f, 3.0f};
    memcpy(data, f, 16);                                              /* model.layers.0.w F32 [2,2] @0 */
    uint16_t bf[2] = {qsa__f32_to_bf16(0.5f), qsa__f32_to_bf16(-1e30f)};
    memcpy(data + 16, bf, 4);                                         /* model.norm.weight BF16 [2] @16 */
    uint16_t hf[1] = {qsa__f32_to_f16(0.25f)};
    memcpy(data + 20, hf, 2);                                         /* model.h F16 [1] @20 */
    data[22] = 0x38; data[23] = 0xb8;                                 /* model.s F8_E4M3 [2] @22: 1, -1 */
    data[24] = 200;                                                   /* model.u U8 [1] @24 */
    int64_t i64 = -7; memcpy(data + 32, &i64, 8);                     /* model.i I64 [1] @32 */
    int32_t i32 = 123456; memcpy(data + 40, &i32, 4);                 /* model.j I32 [1] @40 */
    float sc = 0.125f; memcpy(data + 44, &sc, 4);                     /* model.scalar F32 [] @44 */
    memcpy(data + 48, f, 8);                                          /* lm_head.weight F32 [2] @48 */
    const char *hdr =
        "{\"__metadata__\":{\"format\":\"pt\"},"
        "\"model.layers.0.w\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[0,16]},"
        "\"model.norm.weight\":{\"dtype\":\"BF16\",\"shape\":[2],\"data_offsets\":[16,20]},"
        "\"model.h\":{\"dtype\":\"F16\",\"shape\":[1],\"data_offsets\":[20,22]},"
        "\"model.s\":{\"dtype\":\"F8_E4M3\",\"shape\":[2],\"data_offsets\":[22,24]},"
        "\"model.u\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[24,25]},"
        "\"model.i\":{\"dtype\":\"I64\",\"shape\":[1],\"data_offsets\":[32,40]},"
        "\"model.j\":{\"dtype\":\"I32\",\"shape\":[1],\"data_offsets\":[40,44]},"
        "\"model.scalar\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[44,48]},"
        "\"lm_head.weight\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[48,56]},"
        "\"model.empty\":{\"dtype\":\"F32\",\"shape\":[0,4],\"data_offsets\":[56,56]},"
        "\"model.visual.blocks.0.w\":{\"dtype\":\"F64\",\"shape\":[1],\"data_offsets\":[56,64]},"
        "\"mtp.fc.weight\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[64,72]}}";
    const char *path = tl_st_write(&t, "model.safetensors", hdr, data, 72);
    qsa__st_set s;
    CHECK_OK(qsa__st_open_file(path, &s));
    CHECK(s.ntensors == 10 && s.nfiles == 1 && !strcmp(s.prefix, "model."));
    for (int i = 1; i < s.ntensors; i++) CHECK(strcmp(s.tensors[i - 1].name, s.tensors[i].name) < 0);
    CHECK(qsa__st_find(&s, "visual.blocks.0.w") == NULL && qsa__st_find(&s, "model.visual.blocks.0.w") == NULL);
    CHECK(qsa__st_find(&s, "mtp.fc.weight") == NULL);
    const qsa__tensor *w = qsa__st_find(&s, "layers.0.w");
    CHECK(w && w->dtype == QSA__F32 && w->ndim == 2 && w->shape[0] == 2 && w->nbytes == 16);
    if (w) {
        CHECK(qsa__tensor_f32(w, 0) == 1.5f && qsa__tensor_f32(w, 3) == 3.0f);
        CHECK(qsa__tensor_f32(w, 4) != qsa__tensor_f32(w, 4)); /* out of range: NaN */
        uint16_t h[4];
        size_t over = qsa__tensor_to_f16_mt(w, 0, 4, h, 1);
        CHECK(over == 1 && h[0] == qsa__f32_to_f16(1.5f) && h[2] == 0x7c00);
        over = qsa__tensor_to_f16_mt(w, 2, 2, h, 1); /* from element 2 on (a row block of a fused matrix) */
        CHECK(over == 1 && h[0] == 0x7c00 && h[1] == qsa__f32_to_f16(3.0f));
    }
    const qsa__tensor *x = qsa__st_find(&s, "norm.weight");
    CHECK(x && x->dtype == QSA__BF16 && qsa__tensor_f32(x, 0) == 0.5f);
    if (x) {
        uint16_t h[2];
        size_t over = qsa__tensor_to_f16_mt(x, 0, 2, h, 1);
        CHECK(over == 1 && h[0] == 0x3800 && h[1] == 0xfc00);
    }
    x = qsa__st_find(&s, "h"); CHECK(x && qsa__tensor_f32(x, 0) == 0.25f);
    if (x) { uint16_t h = 0; CHECK(qsa__tensor_to_f16_mt(x, 0, 1, &h, 1) == 0 && h == 0x3400); }
    /* the bulk widening of every float dtype gives qsa__tensor_f32's values */
    const char *wide[3] = {"layers.0.w", "norm.weight", "h"};
    for (int k = 0; k < 3; k++) {
        const qsa__tensor *y = qsa__st_find(&s, wide[k]);
        float v[4];
        if (!y) { CHECK(y != NULL); continue; }
        qsa__tensor_to_f32_mt(y, v, 1);
        for (size_t e = 0; e < qsa__tensor_numel(y); e++) CHECKF(v[e] == qsa__tensor_f32(y, e), "%s[%zu]", wide[k], e);
    }
    { /* a tensor large enough to be widened by threads (a load's): the same values with 1, 3 and 16 */
        size_t n = ((size_t)4 << 20) + 7;
        uint16_t *raw = (uint16_t *)malloc(n * 2);
        float *a = (float *)malloc(n * 4), *b = (float *)malloc(n * 4);
        if (raw && a && b) {
            for (size_t e = 0; e < n; e++) raw[e] = (uint16_t)(e * 2654435761u >> 7);
            qsa__tensor big = test_tensor("big", QSA__BF16, raw, (int64_t)n, 0);
            qsa__tensor_to_f32_range(&big, 0, n, a); /* one thread, one loop */
            qsa__tensor_to_f32_range(&big, 1000, 5000, b); /* from an offset */
            CHECK(!memcmp(a + 1000, b, 5000 * 4));
            static const int nts[3] = {1, 3, 16};
            for (int k = 0; k < 3; k++) {
                memset(b, 0xff, n * 4);
                qsa__tensor_to_f32_mt(&big, b, nts[k]);
                CHECKF(!memcmp(a, b, n * 4), "widened by %d threads: values differ", nts[k]);
            }
            /* and narrowed to FP16 (the CUDA upload's), with the count of finite values that became inf */
            uint16_t *h1 = (uint16_t *)malloc(n * 2), *h2 = (uint16_t *)malloc(n * 2);
            if (h1 && h2) {
                size_t over = 0;
                for (size_t e = 0; e < n; e++) {
                    h1[e] = qsa__f32_to_f16(a[e]);
                    over += (h1[e] & 0x7c00) == 0x7c00 && isfinite(a[e]);
                }
                CHECK(over > 0); /* (the pattern holds values beyond the FP16 range) */
                for (int k = 0; k < 3; k++) {
                    memset(h2, 0xff, n * 2);
                    size_t o2 = qsa__f32_to_f16_mt(a, h2, n, nts[k]);
                    CHECKF(o2 == over && !memcmp(h1, h2, n * 2), "narrowed by %d threads: %zu overflows against %zu, or values differ",
                           nts[k], o2, over);
                    /* straight from the BF16 tensor (a one-GPU upload's): the bits of the fp32 copy's narrowing */
                    memset(h2, 0xff, n * 2);
                    o2 = qsa__tensor_to_f16_mt(&big, 0, n, h2, nts[k]);
                    CHECKF(o2 == over && !memcmp(h1, h2, n * 2), "BF16 narrowed by %d threads: %zu overflows against %zu, or values differ",
                           nts[k], o2, over);
                }
                /* and from an offset, as an expert's rows of a fused tensor */
                size_t off = 12345, over_off = 0;
                for (size_t e = off; e < n; e++) over_off += (h1[e] & 0x7c00) == 0x7c00 && isfinite(a[e]);
                memset(h2, 0xff, n * 2);
                size_t o3 = qsa__tensor_to_f16_mt(&big, off, n - off, h2, 3);
                CHECKF(o3 == over_off && !memcmp(h1 + off, h2, (n - off) * 2), "BF16 from element %zu: %zu overflows against %zu, "
                       "or values differ", off, o3, over_off);
            }
            free(h1);
            free(h2);
        }
        free(raw);
        free(a);
        free(b);
    }
    x = qsa__st_find(&s, "s"); CHECK(x && qsa__tensor_f32(x, 0) == 1.0f && qsa__tensor_f32(x, 1) == -1.0f);
    x = qsa__st_find(&s, "u"); CHECK(x && qsa__tensor_f32(x, 0) == 200.0f);
    x = qsa__st_find(&s, "i"); CHECK(x && x->dtype == QSA__I64 && qsa__tensor_f32(x, 0) == -7.0f);
    x = qsa__st_find(&s, "j"); CHECK(x && x->dtype == QSA__I32 && qsa__tensor_f32(x, 0) == 123456.0f);
    x = qsa__st_find(&s, "scalar"); CHECK(x && x->ndim == 0 && qsa__tensor_f32(x, 0) == 0.125f);
    x = qsa__st_find(&s, "lm_head.weight"); CHECK(x && !strcmp(x->name, "lm_head.weight")); /* bare name */
    x = qsa__st_find(&s, "empty"); CHECK(x && x->nbytes == 0 && x->shape[0] == 0);
    /* checked lookup */
    const qsa__tensor *g;
    int64_t sh22[2] = {2, 2}, sh2x[2] = {-1, 3}, any2[2] = {-1, -1};
    CHECK_OK(qsa__st_get(&s, "layers.0.w", QSA__F32, 2, sh22, &g));
    CHECK(g == w);
    CHECK_OK(qsa__st_get(&s, "layers.0.w", QSA__DTYPE_ANY, 2, any2, &g));
    CHECK_OK(qsa__st_get(&s, "layers.0.w", QSA__DTYPE_ANY, 2, NULL, &g));
    CHECK_ERR(qsa__st_get(&s, "layers.0.w", QSA__BF16, 2, sh22, &g), QSA_ERR_SHAPE, "model.safetensors): expected dtype BF16, found F32");
    CHECK(g == NULL);
    CHECK_ERR(qsa__st_get(&s, "layers.0.w", QSA__F32, 2, sh2x, &g), QSA_ERR_SHAPE,
              "tensor 'model.layers.0.w' (/tmp/qsa_t_loader_");
    CHECK_ERR(qsa__st_get(&s, "layers.0.w", QSA__F32, 1, sh22, &g), QSA_ERR_SHAPE, "expected shape [2] (-1 = any), found [2, 2]");
    CHECK_ERR(qsa__st_get(&s, "layers.9.w", QSA__F32, 1, NULL, &g), QSA_ERR_NOT_FOUND, "tensor 'model.layers.9.w' not found");
    CHECK(!strcmp(qsa__dtype_name(QSA__F8_E4M3), "F8_E4M3") && qsa__dtype_size(QSA__I64) == 8 && qsa__dtype_size(QSA__BF16) == 2);
    qsa__st_close(&s);
    CHECK(s.ntensors == 0 && s.tensors == NULL);
    /* the multimodal prefix */
    CHECK_OK(tl_st_mem("{\"model.language_model.embed_tokens.weight\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                       "\"model.visual.x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]},"
                       "\"lm_head.weight\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,12]}}", 12, &s));
    CHECK(!strcmp(s.prefix, "model.language_model.") && s.ntensors == 2);
    CHECK(qsa__st_find(&s, "embed_tokens.weight") != NULL && qsa__st_find(&s, "lm_head.weight") != NULL);
    qsa__st_close(&s);
    CHECK_OK(tl_st_mem("{}", 0, &s)); /* an empty file is valid */
    CHECK(s.ntensors == 0 && qsa__st_find(&s, "x") == NULL);
    qsa__st_close(&s);
    tl_rmdtemp(&t);
}

TEST(cpu, safetensors_e4m3) {
    CHECK(qsa__e4m3_to_f32(0x00) == 0.0f && qsa__e4m3_to_f32(0x38) == 1.0f && qsa__e4m3_to_f32(0xb8) == -1.0f);
    CHECK(qsa__e4m3_to_f32(0x7e) == 448.0f && qsa__e4m3_to_f32(0xfe) == -448.0f);
    CHECK(qsa__e4m3_to_f32(0x01) == 0.001953125f);   /* smallest subnormal 2^-9 */
    CHECK(qsa__e4m3_to_f32(0x07) == 0.013671875f);   /* largest subnormal 7 * 2^-9 */
    CHECK(qsa__e4m3_to_f32(0x08) == 0.015625f);      /* smallest normal 2^-6 */
    CHECK(qsa__e4m3_to_f32(0x3c) == 1.5f && qsa__e4m3_to_f32(0x40) == 2.0f);
    float n = qsa__e4m3_to_f32(0x7f), m = qsa__e4m3_to_f32(0xff);
    CHECK(n != n && m != m);
    /* monotone over the positive finite range */
    for (int v = 1; v < 0x7f; v++) CHECKF(qsa__e4m3_to_f32((uint8_t)v) > qsa__e4m3_to_f32((uint8_t)(v - 1)), "0x%02x", v);
}

#define TL_T1 "\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}"
TEST(cpu, safetensors_hostile) {
    qsa__st_set s;
    tl_tmp t;
    if (!tl_mkdtemp(&t)) SKIP("mkdtemp failed");
    /* truncated files */
    const char *p = tl_write(&t, "short.safetensors", "\x05\0\0", 3);
    CHECK_ERR(qsa__st_open_file(p, &s), QSA_ERR_FORMAT, "short.safetensors: file too short (3 bytes)");
    p = tl_write(&t, "empty.safetensors", "", 0);
    CHECK_ERR(qsa__st_open_file(p, &s), QSA_ERR_FORMAT, "empty.safetensors: file too short (0 bytes)");
    p = tl_write(&t, "len.safetensors", "\x40\0\0\0\0\0\0\0{}", 10);
    CHECK_ERR(qsa__st_open_file(p, &s), QSA_ERR_FORMAT, "len.safetensors: header length 64 exceeds the file size (10 bytes)");
    p = tl_write(&t, "huge.safetensors", "\xff\xff\xff\xff\xff\xff\xff\xff{}", 10);
    CHECK_ERR(qsa__st_open_file(p, &s), QSA_ERR_FORMAT, "header length 18446744073709551615 exceeds the file size");
    p = tl_write(&t, "cut.safetensors", "\x0a\0\0\0\0\0\0\0{\"a\":{\"dt", 18);
    CHECK_ERR(qsa__st_open_file(p, &s), QSA_ERR_FORMAT, "cut.safetensors (safetensors header): line 1 col 7: unterminated string");
    CHECK_ERR(qsa__st_open_file("/nonexistent/x.safetensors", &s), QSA_ERR_IO, "/nonexistent/x.safetensors");
    CHECK_ERR(qsa__st_open_memory(NULL, 0, "null", &s), QSA_ERR_FORMAT, "null: file too short");
    /* header structure */
    CHECK_ERR(tl_st_mem("[1,2]", 0, &s), QSA_ERR_FORMAT, "mem.safetensors: header is not a JSON object (found array)");
    CHECK_ERR(tl_st_mem("{\"a\":1}", 0, &s), QSA_ERR_FORMAT, "tensor 'a': expected an object {dtype, shape, data_offsets}, found integer");
    CHECK_ERR(tl_st_mem("{\"__metadata__\":[]}", 0, &s), QSA_ERR_FORMAT, "__metadata__: expected an object");
    CHECK_ERR(tl_st_mem("{\"a\":{\"dtype\":4,\"shape\":[2],\"data_offsets\":[0,8]}}", 8, &s), QSA_ERR_FORMAT, "tensor 'a': dtype: expected a string");
    CHECK_ERR(tl_st_mem("{\"a\":{\"dtype\":\"F32\",\"data_offsets\":[0,8]}}", 8, &s), QSA_ERR_FORMAT, "tensor 'a': shape: expected a list");
    CHECK_ERR(tl_st_mem("{\"a\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,4]}}", 8, &s), QSA_ERR_FORMAT,
              "(too many dimensions)");
    CHECK_ERR(tl_st_mem("{\"a\":{\"dtype\":\"F32\",\"shape\":[-2],\"data_offsets\":[0,8]}}", 8, &s), QSA_ERR_FORMAT,
              "tensor 'a': shape[0]: expected a non-negative integer, found -2");
    CHECK_ERR(tl_st_mem("{\"a\":{\"dtype\":\"F32\",\"shape\":[2.5],\"data_offsets\":[0,8]}}", 8, &s), QSA_ERR_FORMAT, "shape[0]");
    CHECK_ERR(tl_st_mem("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0]}}", 8, &s), QSA_ERR_FORMAT,
              "tensor 'a': data_offsets: expected [begin, end]");
    CHECK_ERR(tl_st_mem("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[-8,0]}}", 8, &s), QSA_ERR_FORMAT, "data_offsets: expected");
    CHECK_ERR(tl_st_mem("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":\"0-8\"}}", 8, &s), QSA_ERR_FORMAT, "data_offsets: expected");
    /* offsets and sizes */
    CHECK_ERR(tl_st_mem("{" TL_T1 "}", 4, &s), QSA_ERR_FORMAT, "tensor 'a': data_offsets [0, 8] out of range (data section is 4 bytes)");
    CHECK_ERR(tl_st_mem("{\"a\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[8,4]}}", 8, &s), QSA_ERR_FORMAT,
              "data_offsets [8, 4] out of range");
    CHECK_ERR(tl_st_mem("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,99999999999999999999]}}", 8, &s), QSA_ERR_FORMAT,
              "data_offsets: expected");
    CHECK_ERR(tl_st_mem("{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", 16, &s), QSA_ERR_FORMAT,
              "tensor 'a': shape [3] of F32 needs 12 bytes but data_offsets [0, 8] span 8");
    CHECK_ERR(tl_st_mem("{\"a\":{\"dtype\":\"BF16\",\"shape\":[2,2],\"data_offsets\":[0,4]}}", 16, &s), QSA_ERR_FORMAT,
              "shape [2, 2] of BF16 needs 8 bytes");
    CHECK_ERR(tl_st_mem("{\"a\":{\"dtype\":\"F32\",\"shape\":[4611686018427387904,4611686018427387904],\"data_offsets\":[0,8]}}", 8, &s),
              QSA_ERR_FORMAT, "needs more than 2^64 (overflow)");
    CHECK_ERR(tl_st_mem("{\"a\":{\"dtype\":\"F32\",\"shape\":[4611686018427387904],\"data_offsets\":[0,8]}}", 8, &s),
              QSA_ERR_FORMAT, "needs more than 2^64 (overflow)");
    CHECK_ERR(tl_st_mem("{" TL_T1 ",\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}", 16, &s), QSA_ERR_FORMAT,
              "tensors 'a' and 'b' overlap");
    CHECK_ERR(tl_st_mem("{\"b\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[3,4]}," TL_T1 "}", 16, &s), QSA_ERR_FORMAT,
              "tensors 'a' and 'b' overlap (data_offsets begin 3 < end 8)");
    CHECK_ERR(tl_st_mem("{" TL_T1 ",\"model.visual.v\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[7,8]}}", 16, &s), QSA_ERR_FORMAT,
              "overlap"); /* ignored tensors still may not overlap */
    CHECK_OK(tl_st_mem("{\"z\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[4,4]}," TL_T1 "}", 8, &s)); /* empty tensors share nothing */
    qsa__st_close(&s);
    /* dtypes */
    CHECK_ERR(tl_st_mem("{\"a\":{\"dtype\":\"F64\",\"shape\":[1],\"data_offsets\":[0,8]}}", 8, &s), QSA_ERR_UNSUPPORTED,
              "mem.safetensors: tensor 'a': dtype F64 is not supported");
    CHECK_ERR(tl_st_mem("{\"a\":{\"dtype\":\"F8_E5M2\",\"shape\":[8],\"data_offsets\":[0,8]}}", 8, &s), QSA_ERR_UNSUPPORTED,
              "tensor 'a': dtype F8_E5M2 is not supported");
    CHECK_ERR(tl_st_mem("{\"a\":{\"dtype\":\"Q4_K\",\"shape\":[8],\"data_offsets\":[0,8]}}", 8, &s), QSA_ERR_UNSUPPORTED, "dtype Q4_K");
    CHECK_ERR(tl_st_mem("{\"a\":{\"dtype\":\"\",\"shape\":[8],\"data_offsets\":[0,8]}}", 8, &s), QSA_ERR_UNSUPPORTED, "dtype  is not");
    /* names */
    CHECK_ERR(tl_st_mem("{" TL_T1 "," TL_T1 "}", 8, &s), QSA_ERR_FORMAT, "overlap");
    CHECK_ERR(tl_st_mem("{" TL_T1 ",\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,16]}}", 16, &s), QSA_ERR_FORMAT,
              "tensor 'a' is stored twice");
    CHECK_ERR(tl_st_mem("{\"a\xff\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8, &s), QSA_ERR_FORMAT,
              "mem.safetensors (safetensors header): line 1 col 4: invalid UTF-8");
    CHECK_ERR(tl_st_mem("{\"a\xc0\x80\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8, &s), QSA_ERR_FORMAT, "invalid UTF-8");
    CHECK_ERR(tl_st_mem("{\"a\\ud800\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8, &s), QSA_ERR_FORMAT, "lone high surrogate");
    CHECK_ERR(tl_st_mem("{\"a\\u0000b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8, &s), QSA_ERR_FORMAT,
              "a tensor name contains a NUL character");
    CHECK_OK(tl_st_mem("{\"\xc3\xa9\\u00e9\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8, &s)); /* decoded names */
    CHECK(s.ntensors == 1 && !strcmp(s.tensors[0].name, "\xc3\xa9\xc3\xa9"));
    qsa__st_close(&s);
    /* a deep header */
    {
        char deep[2200];
        size_t k = 0;
        k += (size_t)snprintf(deep, sizeof deep, "{\"a\":");
        for (int i = 0; i < 1000; i++) deep[k++] = '[';
        deep[k++] = '}';
        deep[k] = 0;
        CHECK_ERR(tl_st_mem(deep, 0, &s), QSA_ERR_FORMAT, "nesting depth exceeds");
    }
    /* directories */
    CHECK_ERR(qsa__st_open_dir(t.dir, &s), QSA_ERR_NOT_FOUND, "neither model.safetensors nor model.safetensors.index.json");
    tl_rmdtemp(&t);
}

TEST(cpu, safetensors_sharded_index) {
    tl_tmp t;
    if (!tl_mkdtemp(&t)) SKIP("mkdtemp failed");
    float d[4] = {1, 2, 3, 4}, d6[6] = {1, 2, 3, 4, 5, 6};
    tl_st_write(&t, "model-00001-of-00002.safetensors",
                "{\"model.language_model.embed_tokens.weight\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                "\"model.visual.p\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,16]}}", d, 16);
    tl_st_write(&t, "model-00002-of-00002.safetensors",
                "{\"model.language_model.norm.weight\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                "\"lm_head.weight\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,16]},"
                "\"mtp.x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[16,24]}}", d6, 24);
    const char *idx = "{\"metadata\":{\"total_size\":32},\"weight_map\":{"
                      "\"model.language_model.embed_tokens.weight\":\"model-00001-of-00002.safetensors\","
                      "\"model.visual.p\":\"model-00001-of-00002.safetensors\","
                      "\"mtp.x\":\"model-00002-of-00002.safetensors\","
                      "\"model.language_model.norm.weight\":\"model-00002-of-00002.safetensors\","
                      "\"lm_head.weight\":\"model-00002-of-00002.safetensors\"}}";
    tl_write_str(&t, "model.safetensors.index.json", idx);
    qsa__st_set s;
    CHECK_OK(qsa__st_open_dir(t.dir, &s));
    CHECK(s.nfiles == 2 && s.ntensors == 3 && !strcmp(s.prefix, "model.language_model."));
    const qsa__tensor *x = qsa__st_find(&s, "norm.weight");
    CHECK(x && x->file == 1 && qsa__tensor_f32(x, 1) == 2.0f);
    x = qsa__st_find(&s, "lm_head.weight");
    CHECK(x && qsa__tensor_f32(x, 0) == 3.0f);
    CHECK(qsa__st_find(&s, "embed_tokens.weight") && qsa__st_find(&s, "embed_tokens.weight")->file == 0);
    qsa__st_close(&s);
    /* index names a tensor the shard lacks */
    tl_write_str(&t, "model.safetensors.index.json",
                 "{\"weight_map\":{\"model.language_model.embed_tokens.weight\":\"model-00001-of-00002.safetensors\","
                 "\"model.language_model.layers.0.x\":\"model-00002-of-00002.safetensors\"}}");
    CHECK_ERR(qsa__st_open_dir(t.dir, &s), QSA_ERR_FORMAT,
              "tensor 'model.language_model.layers.0.x' is listed for shard 'model-00002-of-00002.safetensors' but that shard does not contain it");
    tl_write_str(&t, "model.safetensors.index.json",
                 "{\"weight_map\":{\"model.language_model.embed_tokens.weight\":\"model-00002-of-00002.safetensors\"}}");
    CHECK_ERR(qsa__st_open_dir(t.dir, &s), QSA_ERR_FORMAT, "tensor 'model.language_model.embed_tokens.weight' is listed for shard");
    /* missing shard */
    tl_write_str(&t, "model.safetensors.index.json",
                 "{\"weight_map\":{\"a\":\"model-00001-of-00002.safetensors\",\"b\":\"model-00003-of-00003.safetensors\"}}");
    CHECK_ERR(qsa__st_open_dir(t.dir, &s), QSA_ERR_NOT_FOUND, "shard 'model-00003-of-00003.safetensors' named by weight_map is missing");
    /* hostile shard names, bad index */
    tl_write_str(&t, "model.safetensors.index.json", "{\"weight_map\":{\"a\":\"../../etc/passwd\"}}");
    CHECK_ERR(qsa__st_open_dir(t.dir, &s), QSA_ERR_FORMAT, "shard name '../../etc/passwd' must be a plain file name");
    tl_write_str(&t, "model.safetensors.index.json", "{\"weight_map\":{\"a\":3}}");
    CHECK_ERR(qsa__st_open_dir(t.dir, &s), QSA_ERR_FORMAT, "weight_map['a']: expected a shard file name, found integer");
    tl_write_str(&t, "model.safetensors.index.json", "{\"weight_map\":[]}");
    CHECK_ERR(qsa__st_open_dir(t.dir, &s), QSA_ERR_FORMAT, "model.safetensors.index.json: weight_map: expected an object, found array");
    tl_write_str(&t, "model.safetensors.index.json", "{\"weight_map\":{}}");
    CHECK_ERR(qsa__st_open_dir(t.dir, &s), QSA_ERR_FORMAT, "weight_map is empty");
    tl_write_str(&t, "model.safetensors.index.json", "{\"weight_map\":{\"a\":\"x\",}}");
    CHECK_ERR(qsa__st_open_dir(t.dir, &s), QSA_ERR_FORMAT, "model.safetensors.index.json: line 1 col 24: trailing comma");
    /* the same tensor in two shards */
    tl_st_write(&t, "model-00002-of-00002.safetensors",
                "{\"model.language_model.embed_tokens.weight\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", d, 8);
    tl_write_str(&t, "model.safetensors.index.json",
                 "{\"weight_map\":{\"model.language_model.embed_tokens.weight\":\"model-00001-of-00002.safetensors\","
                 "\"x\":\"model-00002-of-00002.safetensors\"}}");
    CHECK_ERR(qsa__st_open_dir(t.dir, &s), QSA_ERR_FORMAT, "tensor 'model.language_model.embed_tokens.weight' is stored twice");
    /* a broken shard is named */
    tl_write(&t, "model-00002-of-00002.safetensors", "\x01\0\0", 3);
    CHECK_ERR(qsa__st_open_dir(t.dir, &s), QSA_ERR_FORMAT, "model-00002-of-00002.safetensors: file too short");
    tl_rmdtemp(&t);
}

TEST(cpu, safetensors_rows_view) {
    qsa__st_set s;
    /* shards of 3 and 2 rows of 2 floats */
    const char *h = "{\"model.layers.1.ple.ple_embedding.ngram_embedding.shard_0.weight\":{\"dtype\":\"F32\",\"shape\":[3,2],\"data_offsets\":[0,24]},"
                    "\"model.layers.1.ple.ple_embedding.ngram_embedding.shard_1.weight\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[24,40]},"
                    "\"model.layers.2.ple.ple_embedding.ngram_embedding.weight\":{\"dtype\":\"F32\",\"shape\":[4,2],\"data_offsets\":[40,72]}}";
    static uint8_t buf[512];
    float vals[18];
    for (int i = 0; i < 18; i++) vals[i] = (float)i;
    size_t n = tl_st_image(h, vals, sizeof vals, buf, sizeof buf);
    CHECK_OK(qsa__st_open_memory(buf, n, "rows.safetensors", &s));
    qsa__rows_view v;
    CHECK_OK(qsa__st_rows_view(&s, "layers.1.ple.ple_embedding.ngram_embedding", &v));
    CHECK(v.nparts == 2 && v.rows == 5 && v.cols == 2 && v.dtype == QSA__F32);
    for (int r = 0; r < 5; r++) {
        const uint8_t *row = qsa__rows_view_row(&v, r);
        float f[2];
        if (row) memcpy(f, row, 8);
        CHECKF(row && f[0] == (float)(2 * r) && f[1] == (float)(2 * r + 1), "row %d", r);
    }
    CHECK(qsa__rows_view_row(&v, 5) == NULL && qsa__rows_view_row(&v, -1) == NULL);
    qsa__rows_view_free(&v);
    CHECK_OK(qsa__st_rows_view(&s, "layers.2.ple.ple_embedding.ngram_embedding", &v));
    CHECK(v.nparts == 1 && v.rows == 4);
    if (v.nparts == 1) { float f; memcpy(&f, qsa__rows_view_row(&v, 3), 4); CHECK(f == 16.0f); }
    qsa__rows_view_free(&v);
    CHECK_ERR(qsa__st_rows_view(&s, "layers.3.ple.ple_embedding.ngram_embedding", &v), QSA_ERR_NOT_FOUND,
              "tensor 'model.layers.3.ple.ple_embedding.ngram_embedding.weight' (or its shards");
    qsa__st_close(&s);
    /* a gap in the numbering, mismatched columns */
    h = "{\"e.shard_0.weight\":{\"dtype\":\"F32\",\"shape\":[1,2],\"data_offsets\":[0,8]},"
        "\"e.shard_2.weight\":{\"dtype\":\"F32\",\"shape\":[1,2],\"data_offsets\":[8,16]}}";
    n = tl_st_image(h, vals, 16, buf, sizeof buf);
    CHECK_OK(qsa__st_open_memory(buf, n, "gap.safetensors", &s));
    CHECK_ERR(qsa__st_rows_view(&s, "e", &v), QSA_ERR_FORMAT, "tensor 'e.shard_N.weight': 2 names match but shard_1 is missing");
    qsa__st_close(&s);
    h = "{\"e.shard_0.weight\":{\"dtype\":\"F32\",\"shape\":[1,2],\"data_offsets\":[0,8]},"
        "\"e.shard_1.weight\":{\"dtype\":\"F32\",\"shape\":[2,1],\"data_offsets\":[8,16]}}";
    n = tl_st_image(h, vals, 16, buf, sizeof buf);
    CHECK_OK(qsa__st_open_memory(buf, n, "cols.safetensors", &s));
    CHECK_ERR(qsa__st_rows_view(&s, "e", &v), QSA_ERR_SHAPE, "tensor 'e.shard_1.weight': expected [*, 2] F32 like shard 0, found [2, 1] F32");
    qsa__st_close(&s);
    /* zero-width shards: any row count in no bytes; their sum must not overflow */
    h = "{\"e.shard_0.weight\":{\"dtype\":\"F32\",\"shape\":[9223372036854775807,0],\"data_offsets\":[0,0]},"
        "\"e.shard_1.weight\":{\"dtype\":\"F32\",\"shape\":[9223372036854775807,0],\"data_offsets\":[0,0]}}";
    n = tl_st_image(h, vals, 0, buf, sizeof buf);
    CHECK_OK(qsa__st_open_memory(buf, n, "wide.safetensors", &s));
    CHECK_ERR(qsa__st_rows_view(&s, "e", &v), QSA_ERR_SHAPE, "tensor 'e.shard_1.weight': shape [9223372036854775807, 0]: the shards' row count overflows");
    qsa__st_close(&s);
    h = "{\"e.shard_0.weight\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}";
    n = tl_st_image(h, vals, 16, buf, sizeof buf);
    CHECK_OK(qsa__st_open_memory(buf, n, "nd.safetensors", &s));
    CHECK_ERR(qsa__st_rows_view(&s, "e", &v), QSA_ERR_SHAPE, "tensor 'e.shard_0.weight': expected 2 dimensions");
    qsa__st_close(&s);
}

TEST(cpu, safetensors_nvfp4) {
    qsa__st_set s;
    static uint8_t buf[1024], data[128];
    memset(data, 0x11, sizeof data);
    float s2 = 0.5f;
    memcpy(data + 40, &s2, 4);
    memcpy(data + 44, &s2, 4);
    /* out 4, in 16: weight U8 [4, 8] @0..32, weight_scale F8 [4, 1] @32..36, weight_scale_2 F32 [] @40, input_scale [1] @44 */
    const char *h = "{\"model.layers.0.mlp.experts.0.up_proj.weight\":{\"dtype\":\"U8\",\"shape\":[4,8],\"data_offsets\":[0,32]},"
                    "\"model.layers.0.mlp.experts.0.up_proj.weight_scale\":{\"dtype\":\"F8_E4M3\",\"shape\":[4,1],\"data_offsets\":[32,36]},"
                    "\"model.layers.0.mlp.experts.0.up_proj.weight_scale_2\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[40,44]},"
                    "\"model.layers.0.mlp.experts.0.up_proj.input_scale\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[44,48]},"
                    "\"model.layers.0.mlp.experts.1.up_proj.weight\":{\"dtype\":\"U8\",\"shape\":[4,8],\"data_offsets\":[48,80]},"
                    "\"model.layers.0.mlp.experts.1.up_proj.weight_scale\":{\"dtype\":\"F8_E4M3\",\"shape\":[4,2],\"data_offsets\":[80,88]},"
                    "\"model.layers.0.mlp.experts.1.up_proj.weight_scale_2\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[88,96]},"
                    "\"model.layers.0.mlp.gate.weight\":{\"dtype\":\"BF16\",\"shape\":[2,16],\"data_offsets\":[96,160]}}";
    static uint8_t big[256];
    memcpy(big, data, 128);
    size_t n = tl_st_image(h, big, 160, buf, sizeof buf);
    CHECK_OK(qsa__st_open_memory(buf, n, "fp4.safetensors", &s));
    CHECK(qsa__st_is_nvfp4(&s, "layers.0.mlp.experts.0.up_proj") && !qsa__st_is_nvfp4(&s, "layers.0.mlp.gate"));
    qsa__nvfp4 q;
    CHECK_OK(qsa__st_get_nvfp4(&s, "layers.0.mlp.experts.0.up_proj", 4, 16, &q));
    CHECK(q.out == 4 && q.in == 16 && q.global_scale == 0.5f && q.weight && q.scale && q.scale2 && q.input_scale);
    CHECK_ERR(qsa__st_get_nvfp4(&s, "layers.0.mlp.experts.0.up_proj", 4, 32, &q), QSA_ERR_SHAPE,
              "tensor 'model.layers.0.mlp.experts.0.up_proj.weight' (fp4.safetensors): expected shape [4, 16] (-1 = any), found [4, 8]");
    CHECK_ERR(qsa__st_get_nvfp4(&s, "layers.0.mlp.experts.0.up_proj", 4, 20, &q), QSA_ERR_SHAPE, "in_features 20 must be a positive multiple of 16");
    CHECK_ERR(qsa__st_get_nvfp4(&s, "layers.0.mlp.experts.1.up_proj", 4, 16, &q), QSA_ERR_SHAPE,
              "experts.1.up_proj.weight_scale' (fp4.safetensors): expected shape [4, 1] (-1 = any), found [4, 2]");
    CHECK_ERR(qsa__st_get_nvfp4(&s, "layers.0.mlp.experts.7.up_proj", 4, 16, &q), QSA_ERR_NOT_FOUND, "experts.7.up_proj.weight' not found");
    CHECK_ERR(qsa__st_get_nvfp4(&s, "layers.0.mlp.gate", 2, 16, &q), QSA_ERR_SHAPE, "gate.weight' (fp4.safetensors): expected dtype U8, found BF16");
    qsa__st_close(&s);
    /* scale_2 checks and the compressed-tensors naming */
    h = "{\"m.weight_packed\":{\"dtype\":\"U8\",\"shape\":[1,8],\"data_offsets\":[0,8]},"
        "\"m.weight_scale\":{\"dtype\":\"F8_E4M3\",\"shape\":[1,1],\"data_offsets\":[8,9]},"
        "\"m.weight_global_scale\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[40,44]},"
        "\"b.weight\":{\"dtype\":\"U8\",\"shape\":[1,8],\"data_offsets\":[12,20]},"
        "\"b.weight_scale\":{\"dtype\":\"F8_E4M3\",\"shape\":[1,1],\"data_offsets\":[20,21]},"
        "\"b.weight_scale_2\":{\"dtype\":\"BF16\",\"shape\":[],\"data_offsets\":[22,24]},"
        "\"z.weight\":{\"dtype\":\"U8\",\"shape\":[1,8],\"data_offsets\":[24,32]},"
        "\"z.weight_scale\":{\"dtype\":\"F8_E4M3\",\"shape\":[1,1],\"data_offsets\":[32,33]},"
        "\"z.weight_scale_2\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[36,40]}}";
    memset(big, 0, sizeof big);
    memcpy(big + 40, &s2, 4);
    n = tl_st_image(h, big, 44, buf, sizeof buf);
    CHECK_OK(qsa__st_open_memory(buf, n, "ct.safetensors", &s));
    CHECK(qsa__st_is_nvfp4(&s, "m"));
    CHECK_OK(qsa__st_get_nvfp4(&s, "m", 1, 16, &q));
    CHECK(q.global_scale == 2.0f && q.input_scale == NULL && !strcmp(q.weight->name, "m.weight_packed"));
    CHECK_ERR(qsa__st_get_nvfp4(&s, "b", 1, 16, &q), QSA_ERR_SHAPE, "tensor 'b.weight_scale_2': expected an F32 scalar ([] or [1]), found BF16 []");
    CHECK_ERR(qsa__st_get_nvfp4(&s, "z", 1, 16, &q), QSA_ERR_FORMAT, "tensor 'z.weight_scale_2': expected a positive finite scale, found 0");
    qsa__st_close(&s);
}

/* ---- the golden fixtures written by the HF reference (tests/fixtures/<name>/) ---- */

static void tl_check_fixture(const char *name) {
    char dir[512];
    snprintf(dir, sizeof dir, "%s", test_path("tests/fixtures"));
    size_t k = strlen(dir);
    snprintf(dir + k, sizeof dir - k, "/%s", name);
    char cfgp[600];
    snprintf(cfgp, sizeof cfgp, "%s/config.json", dir);
    if (!qsa__file_exists(cfgp)) { printf("    (fixture %s absent)\n", name); return; }
    qsa_model_config c;
    qsa__st_set s;
    qsa_result r = qsa_config_load_dir(dir, &c);
    CHECK_OK(r);
    if (r != QSA_OK) return;
    r = qsa__st_open_dir(dir, &s);
    CHECK_OK(r);
    if (r != QSA_OK) return;
    CHECKF(s.ntensors > 0 && !strcmp(s.prefix, "model."), "%s: %d tensors, prefix '%s'", name, s.ntensors, s.prefix);
    char n[256];
    int64_t H = c.hidden_size, I = c.moe_intermediate_size;
    const qsa__tensor *t;
    int64_t emb[2] = {c.vocab_size, H};
    CHECK_OK(qsa__st_get(&s, "embed_tokens.weight", QSA__DTYPE_ANY, 2, emb, &t));
    if (!c.tie_word_embeddings) CHECK_OK(qsa__st_get(&s, "lm_head.weight", QSA__DTYPE_ANY, 2, emb, &t));
    for (int l = 0; l < c.num_hidden_layers; l++) {
        int64_t gate[2] = {c.num_experts, H};
        snprintf(n, sizeof n, "layers.%d.mlp.gate.weight", l);
        CHECK_OK(qsa__st_get(&s, n, QSA__DTYPE_ANY, 2, gate, &t));
        snprintf(n, sizeof n, "layers.%d.%s.weight", l, c.layer_types[l] == QSA_LAYER_QSA ? "self_attn.q_proj" : "linear_attn.in_proj_qkv");
        CHECKF(qsa__st_find(&s, n) != NULL, "%s: %s", name, n);
        for (int e = 0; e < c.num_experts; e++) {
            static const char *const proj[3] = {"gate_proj", "up_proj", "down_proj"};
            for (int p = 0; p < 3; p++) {
                int64_t o = p == 2 ? H : I, in = p == 2 ? I : H;
                snprintf(n, sizeof n, "layers.%d.mlp.experts.%d.%s", l, e, proj[p]);
                if (c.nvfp4) {
                    qsa__nvfp4 q;
                    CHECKF(qsa__st_is_nvfp4(&s, n), "%s: %s not NVFP4", name, n);
                    CHECK_OK(qsa__st_get_nvfp4(&s, n, o, in, &q));
                    CHECK(q.global_scale > 0 && q.input_scale != NULL);
                } else {
                    int64_t sh[2] = {o, in};
                    size_t k2 = strlen(n);
                    snprintf(n + k2, sizeof n - k2, ".weight");
                    CHECK_OK(qsa__st_get(&s, n, QSA__DTYPE_ANY, 2, sh, &t));
                }
            }
        }
        if (c.nvfp4) {
            snprintf(n, sizeof n, "layers.%d.mlp.gate", l);
            CHECK(!qsa__st_is_nvfp4(&s, n));
            snprintf(n, sizeof n, "model.layers.%d.mlp.gate", l);
            CHECK(qsa_config_quant_excluded(&c, n));
        }
    }
    for (int i = 0; i < c.n_ple_layers; i++) {
        qsa__rows_view v;
        snprintf(n, sizeof n, "layers.%d.ple.ple_embedding.ngram_embedding", c.ple_layer_ids[i] - 1);
        CHECK_OK(qsa__st_rows_view(&s, n, &v));
        int ngram_heads = (c.ngram_size - 1) * c.heads_per_ngram;
        CHECKF(v.nparts == c.split_ngram_parts && v.cols * ngram_heads == c.ple_embed_dim && v.rows > 0 &&
               v.rows % c.make_ngram_vocab_size_divisible_by == 0, "%s: %s: %d parts, %lld x %lld", name, n, v.nparts,
               (long long)v.rows, (long long)v.cols);
        if (v.rows) CHECK(qsa__rows_view_row(&v, v.rows - 1) != NULL);
        qsa__rows_view_free(&v);
        snprintf(n, sizeof n, "layers.%d.ple.ple_embedding.layer_multipliers", c.ple_layer_ids[i] - 1);
        int64_t ns = c.ngram_size;
        CHECK_OK(qsa__st_get(&s, n, QSA__I64, 1, &ns, &t));
    }
    qsa__st_close(&s);
    /* the golden outputs are a plain safetensors file too */
    char gp[600];
    snprintf(gp, sizeof gp, "%s/golden.safetensors", dir);
    if (qsa__file_exists(gp)) {
        CHECK_OK(qsa__st_open_file(gp, &s));
        CHECK(s.ntensors > 0);
        qsa__st_close(&s);
    }
    char gc[600];
    snprintf(gc, sizeof gc, "%s/generation_config.json", dir);
    if (qsa__file_exists(gc)) {
        char *text = NULL;
        size_t len = 0;
        qsa_generation_config g;
        CHECK_OK(qsa__read_file(gc, &text, &len));
        if (text) CHECK_OK(qsa_generation_config_parse(text, len, gc, &g));
        qsa__free(text);
    }
}

TEST(cpu, loader_golden_fixtures) {
    tl_check_fixture("qsa_first_no_ple");
    tl_check_fixture("qsa_hc2_ple_bf16");
    tl_check_fixture("qsa_hc4_ple_sharded");
    tl_check_fixture("nvfp4_experts");
}

/* ---- hostile model directories (found by a review) ---- */

/* models/tiny copied to a temp dir with `extra` members appended to its config.json (the last of a
   repeated name wins); 0 when models/tiny is not built */
static int tl_tiny_copy(tl_tmp *t, const char *extra) {
    static const char *const files[] = {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
                                        "tokenizer_config.json"};
    if (!qsa__file_exists(test_path("models/tiny/config.json")) || !tl_mkdtemp(t)) return 0;
    for (int i = 0; i < 5; i++) {
        char src[600];
        snprintf(src, sizeof src, "%s/%s", test_path("models/tiny"), files[i]);
        size_t n = 0;
        char *d = NULL;
        if (qsa__read_file(src, &d, &n) != QSA_OK) return 0;
        if (i == 0 && extra[0]) { /* "...}" -> "..., extra}" */
            char *e = strrchr(d, '}');
            char *c = (char *)malloc(n + strlen(extra) + 8);
            if (!e || !c) { qsa_free(d); free(c); return 0; }
            int k = (int)(e - d);
            n = (size_t)sprintf(c, "%.*s, %s}\n", k, d, extra);
            tl_write(t, files[i], c, n);
            free(c);
        } else {
            tl_write(t, files[i], d, n);
        }
        qsa_free(d);
    }
    return 1;
}

static qsa_result tl_load_cpu(const char *dir, qsa_model **m) {
    qsa_model_params mp;
    memset(&mp, 0, sizeof mp);
    mp.backend = QSA_BACKEND_CPU;
    *m = NULL;
    return qsa_model_load(dir, &mp, m);
}

/* PLE: the checkpoint's per-head vocabularies and offsets must agree with the config (they were not
   read: a model whose buffers disagree ran with the config's); a table too small for the config's
   heads is refused before their primes are searched (heads_per_ngram 4096 near 2^40 searched for
   37 s before its shape check); more than 2^20 hashing heads over the PLE layers are refused at parse. */
TEST(cpu, loader_ple_hashing_buffers_and_hostile_heads) {
    tl_tmp t;
    qsa_model *m = NULL;
    if (!tl_tiny_copy(&t, "")) SKIP("models/tiny is not built");
    CHECK_OK(tl_load_cpu(t.dir, &m)); /* the copy as it is: two PLE layers, primes continued from one to the next */
    qsa_model_free(m);
    /* layer 4's second vocabulary size, then its offsets' last entry, changed in the file */
    qsa__st_set st;
    memset(&st, 0, sizeof st);
    char path[320];
    snprintf(path, sizeof path, "%s/model.safetensors", t.dir);
    CHECK_OK(qsa__st_open_file(path, &st));
    const qsa__tensor *vs = qsa__st_find(&st, "layers.4.ple.ple_embedding.ngram_heads_vocab_sizes");
    const qsa__tensor *of = qsa__st_find(&st, "layers.4.ple.ple_embedding.ngram_heads_offsets");
    CHECK(vs && of && vs->dtype == QSA__I64 && of->dtype == QSA__I64);
    size_t vs_at = vs ? (size_t)(vs->data - st.files[vs->file].data) : 0, of_at = of ? (size_t)(of->data - st.files[of->file].data) : 0;
    qsa__st_close(&st);
    char *img = NULL;
    size_t n = 0;
    CHECK_OK(qsa__read_file(path, &img, &n));
    if (img && vs_at && of_at) {
        int64_t v;
        memcpy(&v, img + vs_at + 8, 8);
        v -= 2;
        memcpy(img + vs_at + 8, &v, 8);
        tl_write(&t, "model.safetensors", img, n);
        CHECK_ERR(tl_load_cpu(t.dir, &m), QSA_ERR_FORMAT, "ngram_heads_vocab_sizes'[1] = ");
        CHECK(m == NULL);
        v += 2;
        memcpy(img + vs_at + 8, &v, 8);
        memcpy(&v, img + of_at + 24, 8);
        v += 1;
        memcpy(img + of_at + 24, &v, 8);
        tl_write(&t, "model.safetensors", img, n);
        CHECK_ERR(tl_load_cpu(t.dir, &m), QSA_ERR_FORMAT, "ngram_heads_offsets'[3] = ");
        v -= 1;
        memcpy(img + of_at + 24, &v, 8);
        tl_write(&t, "model.safetensors", img, n);
    }
    qsa_free(img);
    tl_rmdtemp(&t);
    /* 8,192 heads near 2^40 against a table of 2,048 rows */
    if (!tl_tiny_copy(&t, "\"heads_per_ngram\": 4096, \"ple_embed_dim\": 32768, \"ngram_vocab_size_base\": 1099511627776")) SKIP("copy");
    double t0 = qsa__now();
    CHECK_ERR(tl_load_cpu(t.dir, &m), QSA_ERR_SHAPE, "ple_embedding.ngram_embedding': 4096 rows, but the config's 8192 hashing heads");
    double dt = qsa__now() - t0;
    CHECKF(dt < 5.0, "the refusal took %.1f s", dt);
    tl_rmdtemp(&t);
    qsa_model_config c;
    CHECK_ERR(tl_cfg("\"num_hidden_layers\":8,\"full_attention_interval\":8,\"ple_layer_ids\":[1,2,3,4,5],\"heads_per_ngram\":4096,"
                     "\"ngram_size\":64,\"ple_embed_dim\":258048", &c),
              QSA_ERR_FORMAT, "5 layers x (ngram_size - 1) x heads_per_ngram = 1290240 hashing heads, expected at most 1048576");
    CHECK_OK(tl_cfg("\"num_hidden_layers\":8,\"full_attention_interval\":8,\"ple_layer_ids\":[1,2,3,4],\"heads_per_ngram\":4096,"
                    "\"ngram_size\":64,\"ple_embed_dim\":258048", &c));
}

/* The n-gram vocabularies' primality test against a sieve below 2^20, trial division near 2^40 (the
   largest base a config may give) and strong pseudoprimes to the first bases. */
TEST(cpu, loader_prime_test_is_exact) {
    enum { N = 1 << 20 };
    uint8_t *comp = (uint8_t *)calloc(N, 1);
    if (!comp) SKIP("out of memory");
    comp[0] = comp[1] = 1;
    for (int i = 2; (int64_t)i * i < N; i++)
        if (!comp[i])
            for (int j = i * i; j < N; j += i) comp[j] = 1;
    int bad = 0;
    for (int v = -3; v < N; v++)
        if (qsa__is_prime(v) != (v >= 0 && !comp[v]) && bad++ < 5) printf("    %d: got %d\n", v, qsa__is_prime(v));
    free(comp);
    CHECK(bad == 0);
    int found = 0;
    for (int64_t v = ((int64_t)1 << 40) - 600; v < ((int64_t)1 << 40) + 200; v++) { /* trial division: ~2^19 steps each */
        int td = v > 1;
        for (int64_t d = 2; td && d <= v / d; d++) td = v % d != 0;
        found += td;
        CHECKF(qsa__is_prime(v) == td, "%lld: expected %d", (long long)v, td);
    }
    CHECK(found > 10);
    CHECK(qsa__is_prime(((int64_t)1 << 40) - 87) && !qsa__is_prime(((int64_t)1 << 40) - 85));
    CHECK(!qsa__is_prime(3215031751LL) && !qsa__is_prime(3825123056546413051LL) && !qsa__is_prime(2152302898747LL));
    CHECK(qsa__is_prime(9223372036854775783LL)); /* the largest prime below 2^63 */
}

/* Config values at their edges that loaded and then failed or crashed: the automatic KV page size of a
   config whose GDN state dwarfs its attention rows overflowed (then divided by zero at load), and an
   indexer_budget of INT32_MAX asked for 8 GiB per query and failed every feed. */
TEST(cpu, loader_config_edges) {
    qsa_model_config c;
    CHECK_OK(tl_cfg("\"linear_num_key_heads\":1,\"linear_key_head_dim\":16384,"
                    "\"linear_value_head_dim\":16384,\"head_dim\":4,\"num_key_value_heads\":1,\"linear_num_value_heads\":1024", &c));
    int ps = qsa__default_page_size(&c);
    CHECKF(ps == QSA__MAX_AUTO_PAGE, "page size %d", ps);
    CHECK_OK(tl_cfg("", &c));
    CHECK(qsa__default_page_size(&c) % 16 == 0 && qsa__default_page_size(&c) >= 16);
    CHECK_OK(tl_cfg("\"indexer_budget\":2147483644", &c));
    CHECKF(c.indexer_budget == (1024 / 4 + 1) * 4, "indexer_budget %d", c.indexer_budget);
    CHECK_OK(tl_cfg("\"indexer_budget\":1028", &c));
    CHECK(c.indexer_budget == 1028);
    /* the same tokens with the budget at the whole context and past it */
    tl_tmp a, b;
    if (!tl_tiny_copy(&a, "\"indexer_budget\": 4100") || !tl_tiny_copy(&b, "\"indexer_budget\": 2147483644")) SKIP("models/tiny is not built");
    qsa_model *ma = NULL, *mb = NULL;
    CHECK_OK(tl_load_cpu(a.dir, &ma));
    CHECK_OK(tl_load_cpu(b.dir, &mb));
    if (ma && mb) {
        qsa_seq *sa = NULL, *sb = NULL;
        CHECK_OK(qsa_seq_create(ma, NULL, &sa));
        CHECK_OK(qsa_seq_create(mb, NULL, &sb));
        int32_t ids[48];
        for (int i = 0; i < 48; i++) ids[i] = (int32_t)((i * 37 + 11) % ma->cfg.vocab_size);
        int V = ma->cfg.vocab_size;
        float *la = (float *)malloc(sizeof(float) * V), *lb = (float *)malloc(sizeof(float) * V);
        if (sa && sb && la && lb) {
            CHECK_OK(qsa_seq_feed(sa, ids, 48, la, 0));
            CHECK_OK(qsa_seq_feed(sb, ids, 48, lb, 0));
            CHECK(memcmp(la, lb, sizeof(float) * V) == 0);
        }
        free(la);
        free(lb);
        qsa_seq_free(sa);
        qsa_seq_free(sb);
    }
    qsa_model_free(ma);
    qsa_model_free(mb);
    tl_rmdtemp(&a);
    tl_rmdtemp(&b);
}
