/* tests/t_tp.c - the tensor-parallel sharding plan (CPU): qsa_tp_check, qsa_tp_slice_for,
 * qsa_tp_comm_per_token (docs/TP.md).
 *
 * For TP 1, 2, 4, 8 on the Qwen3.8-Flash-Next configuration and on every golden fixture: the slices
 * of ranks 0..tp-1 of every tensor cover it exactly (each index held by `copies` ranks, runs of
 * consecutive ranks adjacent), local shapes agree with the runs, NVFP4 packed weights and block
 * scales cut the same logical columns, replicated tensors are whole everywhere; fixture tensors'
 * global shapes equal the checkpoint's.  Configurations that do not split are refused with a message
 * naming the field.
 */

/* ---- the Qwen3.8-Flash-Next text config (published values; layer_types as the checkpoint writes
   them, "full_attention" every 4th layer) ---- */
static char *tp_real_json(int num_attention_heads, int nvfp4) {
    size_t cap = 8192;
    char *s = (char *)malloc(cap);
    size_t n = 0;
    n += (size_t)snprintf(s + n, cap - n,
        "{\"model_type\": \"qwen4_exp_text\", \"vocab_size\": 248320, \"hidden_size\": 2560, \"num_hidden_layers\": 48,"
        " \"num_attention_heads\": %d, \"num_key_value_heads\": 2, \"head_dim\": 256, \"max_position_embeddings\": 262144,"
        " \"rms_norm_eps\": 1e-6, \"hidden_act\": \"silu\", \"tie_word_embeddings\": false, \"attention_bias\": false,"
        " \"rope_parameters\": {\"rope_type\": \"default\", \"rope_theta\": 10000000.0, \"partial_rotary_factor\": 0.25},"
        " \"linear_conv_kernel_dim\": 4, \"linear_key_head_dim\": 128, \"linear_value_head_dim\": 128,"
        " \"linear_num_key_heads\": 16, \"linear_num_value_heads\": 48,"
        " \"num_experts\": 512, \"num_experts_per_tok\": 10, \"moe_intermediate_size\": 640,"
        " \"shared_expert_intermediate_size\": 640, \"norm_topk_prob\": true, \"hc_count\": 4, \"hc_lowrank\": 320,"
        " \"ple_layer_ids\": [1], \"ple_embed_dim\": 2560, \"ple_conv_kernel_size\": 4, \"ngram_size\": 3,"
        " \"heads_per_ngram\": 8, \"ngram_vocab_size_base\": 20000000, \"make_ngram_vocab_size_divisible_by\": 128,"
        " \"seed\": 1234, \"split_ngram_parts\": 512,"
        " \"indexer_n_heads\": 4, \"indexer_kv_heads\": 1, \"indexer_head_dim\": 128, \"indexer_budget\": 2048,"
        " \"indexer_compress_ratio\": 4, \"eos_token_id\": [248046, 248044], \"layer_types\": [",
        num_attention_heads);
    for (int i = 0; i < 48; i++)
        n += (size_t)snprintf(s + n, cap - n, "%s\"%s\"", i ? ", " : "", (i + 1) % 4 ? "linear_attention" : "full_attention");
    n += (size_t)snprintf(s + n, cap - n, "]");
    if (nvfp4)
        n += (size_t)snprintf(s + n, cap - n,
            ", \"quantization_config\": {\"quant_method\": \"modelopt\", \"quant_algo\": \"NVFP4\", \"group_size\": 16,"
            " \"exclude_modules\": [\"lm_head\", \"*.mlp.gate\", \"*shared_expert*\", \"*linear_attn*\", \"*self_attn*\","
            " \"*.ple.*\", \"*hyper_connection*\", \"*embed_tokens*\"]}");
    snprintf(s + n, cap - n, "}");
    return s;
}

static int tp_real_config(qsa_model_config *c, int num_attention_heads, int nvfp4) {
    char *js = tp_real_json(num_attention_heads, nvfp4);
    qsa_result r = qsa_config_parse(js, strlen(js), NULL, 0, "real config.json", c);
    free(js);
    CHECK_OK(r);
    return r == QSA_OK;
}

/* ---- names the loader binds, generated from the config (experts: a few representative ids) ---- */
typedef struct tp_names { char (*v)[128]; int n, cap; } tp_names;

static void tp_add(tp_names *nm, const char *fmt, ...) QSA__PRINTF(2, 3);
static void tp_add(tp_names *nm, const char *fmt, ...) {
    if (nm->n == nm->cap) {
        nm->cap = nm->cap ? 2 * nm->cap : 1024;
        nm->v = (char (*)[128])realloc(nm->v, sizeof *nm->v * (size_t)nm->cap);
    }
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(nm->v[nm->n++], sizeof nm->v[0], fmt, ap);
    va_end(ap);
}

/* every tensor of a linear: weight (+ NVFP4 companions when the config quantises it) and a bias */
static void tp_add_lin(tp_names *nm, const qsa_model_config *c, const char *base, int with_bias) {
    tp_add(nm, "%s.weight", base);
    char mod[160];
    snprintf(mod, sizeof mod, "%s%s", strcmp(base, "lm_head") ? "model." : "", base);
    if (c->nvfp4 && !qsa_config_quant_excluded(c, mod)) {
        tp_add(nm, "%s.weight_scale", base);
        tp_add(nm, "%s.weight_scale_2", base);
        tp_add(nm, "%s.input_scale", base);
    }
    if (with_bias) tp_add(nm, "%s.bias", base);
}

static void tp_add_gres(tp_names *nm, const qsa_model_config *c, const char *base, int inject) {
    char b[160];
    tp_add(nm, "%s.hc_norm.weight", base);
    snprintf(b, sizeof b, "%s.input_mix_weight_down", base); tp_add_lin(nm, c, b, 0);
    snprintf(b, sizeof b, "%s.input_mix_weight_up", base); tp_add_lin(nm, c, b, 0);
    if (inject) { snprintf(b, sizeof b, "%s.block_inject_weight", base); tp_add_lin(nm, c, b, 0); }
}

static void tp_model_names(const qsa_model_config *c, tp_names *nm) {
    char b[160];
    tp_add(nm, "embed_tokens.weight");
    tp_add_lin(nm, c, "lm_head", 0);
    tp_add_gres(nm, c, "hyper_connection_mixer", 0);
    const int experts[4] = {0, 1, 17, c->num_experts - 1};
    for (int L = 0; L < c->num_hidden_layers; L++) {
        snprintf(b, sizeof b, "layers.%d.attn_hyper_connection", L); tp_add_gres(nm, c, b, 1);
        snprintf(b, sizeof b, "layers.%d.mlp_hyper_connection", L); tp_add_gres(nm, c, b, 1);
        if (c->layer_types[L] == QSA_LAYER_LINEAR) {
            static const char *const lins[5] = {"in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a", "out_proj"};
            for (int i = 0; i < 5; i++) { snprintf(b, sizeof b, "layers.%d.linear_attn.%s", L, lins[i]); tp_add_lin(nm, c, b, 0); }
            tp_add(nm, "layers.%d.linear_attn.conv1d.weight", L);
            tp_add(nm, "layers.%d.linear_attn.A_log", L);
            tp_add(nm, "layers.%d.linear_attn.dt_bias", L);
            tp_add(nm, "layers.%d.linear_attn.norm.weight", L);
        } else {
            static const char *const lins[4] = {"q_proj", "k_proj", "v_proj", "o_proj"};
            for (int i = 0; i < 4; i++) { snprintf(b, sizeof b, "layers.%d.self_attn.%s", L, lins[i]); tp_add_lin(nm, c, b, 1); }
            tp_add(nm, "layers.%d.self_attn.q_norm.weight", L);
            tp_add(nm, "layers.%d.self_attn.k_norm.weight", L);
            snprintf(b, sizeof b, "layers.%d.self_attn.indexer.index_qk_proj", L); tp_add_lin(nm, c, b, 0);
            tp_add(nm, "layers.%d.self_attn.indexer.q_layernorm.weight", L);
            tp_add(nm, "layers.%d.self_attn.indexer.k_layernorm.weight", L);
        }
        snprintf(b, sizeof b, "layers.%d.mlp.gate", L); tp_add_lin(nm, c, b, 0);
        snprintf(b, sizeof b, "layers.%d.mlp.shared_expert_gate", L); tp_add_lin(nm, c, b, 0);
        static const char *const sh[3] = {"gate_proj", "up_proj", "down_proj"};
        for (int i = 0; i < 3; i++) { snprintf(b, sizeof b, "layers.%d.mlp.shared_expert.%s", L, sh[i]); tp_add_lin(nm, c, b, 0); }
        for (int k = 0; k < 4; k++)
            for (int i = 0; i < 3; i++) {
                snprintf(b, sizeof b, "layers.%d.mlp.experts.%d.%s", L, experts[k], sh[i]);
                tp_add_lin(nm, c, b, 0);
            }
        tp_add(nm, "layers.%d.mlp.experts.gate_up_proj", L); /* the fused layout */
        tp_add(nm, "layers.%d.mlp.experts.down_proj", L);
        for (int k = 0; k < c->n_ple_layers; k++) {
            if (c->ple_layer_ids[k] != L + 1) continue;
            tp_add(nm, "layers.%d.ple.ple_embedding.ngram_embedding.weight", L);
            tp_add(nm, "layers.%d.ple.ple_embedding.ngram_embedding.shard_0.weight", L);
            tp_add(nm, "layers.%d.ple.ple_embedding.ngram_embedding.shard_%d.weight", L, c->split_ngram_parts - 1);
            tp_add(nm, "layers.%d.ple.ple_embedding.layer_multipliers", L);
            tp_add(nm, "layers.%d.ple.ple_embedding.ngram_heads_offsets", L);
            tp_add(nm, "layers.%d.ple.ple_embedding.ngram_heads_vocab_sizes", L);
            snprintf(b, sizeof b, "layers.%d.ple.key_proj", L); tp_add_lin(nm, c, b, 0);
            snprintf(b, sizeof b, "layers.%d.ple.value_proj", L); tp_add_lin(nm, c, b, 0);
            tp_add(nm, "layers.%d.ple.norm_key.weight", L);
            tp_add(nm, "layers.%d.ple.norm_query.weight", L);
            tp_add(nm, "layers.%d.ple.norm_conv.weight", L);
            tp_add(nm, "layers.%d.ple.conv1d.weight", L);
        }
    }
}

/* ---- the invariants of one tensor's slices over all ranks ---- */
static int tp_slices_ok(const char *name, int tp, const qsa_tp_slice *s) {
    int bad = T_.failed;
    const qsa_tp_slice *s0 = &s[0];
    for (int r = 0; r < tp; r++) {
        CHECKF(s[r].kind == s0->kind && s[r].ndim == s0->ndim && s[r].dim == s0->dim && s[r].n_runs == s0->n_runs &&
               s[r].copies == s0->copies && !memcmp(s[r].global, s0->global, sizeof s0->global), "%s tp %d rank %d", name, tp, r);
        for (int d = 0; d < 3; d++) CHECKF(d < s[r].ndim || (s[r].global[d] == 1 && s[r].shape[d] == 1), "%s dim %d", name, d);
    }
    if (T_.failed != bad) return 0;
    if (s0->kind == QSA_TP_REPLICATED) {
        for (int r = 0; r < tp; r++)
            CHECKF(!memcmp(s[r].shape, s[r].global, sizeof s[r].shape) && s[r].copies == tp && s[r].n_runs == 0 &&
                   s[r].dim == -1 && s[r].count == 0 && s[r].begin == 0, "%s: replicated slice of rank %d is not whole", name, r);
        return T_.failed == bad;
    }
    int dim = s0->dim, copies = s0->copies;
    CHECKF(dim >= 0 && dim < s0->ndim && s0->n_runs >= 1 && s0->n_runs <= QSA_TP_MAX_RUNS, "%s: dim %d, %d runs", name, dim, s0->n_runs);
    CHECKF(copies >= 1 && tp % copies == 0, "%s: copies %d", name, copies);
    CHECKF(s0->kind == QSA_TP_ROWS ? dim == 0 || (s0->ndim == 3 && dim == 1) : dim == s0->ndim - 1, "%s: kind %d on dim %d",
           name, (int)s0->kind, dim);
    if (T_.failed != bad) return 0;
    int64_t extent = s0->global[dim];
    int *held = (int *)calloc((size_t)extent, sizeof(int));
    for (int r = 0; r < tp; r++) {
        int64_t sum = 0;
        for (int i = 0; i < s[r].n_runs; i++) {
            CHECKF(s[r].run_count[i] > 0 && s[r].run_begin[i] >= 0 && s[r].run_begin[i] + s[r].run_count[i] <= extent,
                   "%s rank %d run %d [%lld, +%lld) of %lld", name, r, i, (long long)s[r].run_begin[i],
                   (long long)s[r].run_count[i], (long long)extent);
            if (T_.failed != bad) break;
            for (int64_t j = 0; j < s[r].run_count[i]; j++) held[s[r].run_begin[i] + j]++;
            sum += s[r].run_count[i];
            /* consecutive rank groups hold adjacent runs */
            if (r >= copies) {
                const qsa_tp_slice *p = &s[r - copies];
                CHECKF(s[r].run_begin[i] == p->run_begin[i] + p->run_count[i], "%s run %d: rank %d begins at %lld, rank %d ends at %lld",
                       name, i, r, (long long)s[r].run_begin[i], r - copies, (long long)(p->run_begin[i] + p->run_count[i]));
            }
            if (r % copies) CHECKF(s[r].run_begin[i] == s[r - 1].run_begin[i] && s[r].run_count[i] == s[r - 1].run_count[i],
                                   "%s: ranks %d and %d should share a slice", name, r - 1, r);
        }
        CHECKF(s[r].count == sum && s[r].begin == s[r].run_begin[0], "%s rank %d: count %lld, runs sum %lld", name, r,
               (long long)s[r].count, (long long)sum);
        for (int d = 0; d < 3; d++)
            CHECKF(s[r].shape[d] == (d == dim ? sum : s[r].global[d]), "%s rank %d: local dim %d = %lld", name, r, d,
                   (long long)s[r].shape[d]);
    }
    if (T_.failed == bad)
        for (int64_t j = 0; j < extent; j++)
            if (held[j] != copies) {
                CHECKF(held[j] == copies, "%s tp %d: index %lld along dim %d is held by %d ranks, want %d", name, tp, (long long)j, dim,
                       held[j], copies);
                break;
            }
    free(held);
    return T_.failed == bad;
}

/* ends with `sfx` */
static int tp_ends(const char *s, const char *sfx) {
    size_t a = strlen(s), b = strlen(sfx);
    return a >= b && !strcmp(s + a - b, sfx);
}

/* All ranks' slices of every name; then NVFP4 scale slices against their packed weights.
   Returns the number of tensors checked. */
static int tp_check_names(const qsa_model_config *c, int tp, const tp_names *nm) {
    qsa_tp_slice *all = (qsa_tp_slice *)calloc((size_t)nm->n * (size_t)tp, sizeof(qsa_tp_slice));
    int checked = 0;
    for (int i = 0; i < nm->n; i++) {
        qsa_tp_slice *s = all + (size_t)i * (size_t)tp;
        int ok = 1;
        for (int r = 0; r < tp && ok; r++) {
            qsa_result res = qsa_tp_slice_for(c, tp, r, nm->v[i], &s[r]);
            CHECKF(res == QSA_OK, "%s tp %d rank %d: %s", nm->v[i], tp, r, qsa_last_error());
            ok = res == QSA_OK;
        }
        if (ok && tp_slices_ok(nm->v[i], tp, s)) checked++;
    }
    /* packed weight [out, in/2] and block scales [out, in/16] must cut the same logical matrix */
    for (int i = 0; i < nm->n; i++) {
        if (!tp_ends(nm->v[i], ".weight_scale")) continue;
        char wname[128];
        snprintf(wname, sizeof wname, "%.*s", (int)(strlen(nm->v[i]) - strlen("_scale")), nm->v[i]);
        int w = -1;
        for (int j = 0; j < nm->n && w < 0; j++) if (!strcmp(nm->v[j], wname)) w = j;
        CHECKF(w >= 0, "%s without %s", nm->v[i], wname);
        if (w < 0) continue;
        const qsa_tp_slice *sc = all + (size_t)i * (size_t)tp, *pw = all + (size_t)w * (size_t)tp;
        CHECKF(sc[0].global[0] == pw[0].global[0] && sc[0].global[1] * 16 == pw[0].global[1] * 2, "%s: scale %lldx%lld vs weight %lldx%lld",
               nm->v[i], (long long)sc[0].global[0], (long long)sc[0].global[1], (long long)pw[0].global[0], (long long)pw[0].global[1]);
        for (int r = 0; r < tp; r++) {
            CHECKF(sc[r].kind == pw[r].kind && sc[r].dim == pw[r].dim && sc[r].n_runs == pw[r].n_runs, "%s rank %d", nm->v[i], r);
            int64_t us = sc[r].dim == 1 ? 16 : 1, uw = sc[r].dim == 1 ? 2 : 1; /* logical indices per stored one */
            for (int k = 0; k < sc[r].n_runs; k++)
                CHECKF(sc[r].run_begin[k] * us == pw[r].run_begin[k] * uw && sc[r].run_count[k] * us == pw[r].run_count[k] * uw,
                       "%s rank %d: scale run [%lld, +%lld) vs weight run [%lld, +%lld)", nm->v[i], r, (long long)sc[r].run_begin[k],
                       (long long)sc[r].run_count[k], (long long)pw[r].run_begin[k], (long long)pw[r].run_count[k]);
            if (sc[r].dim == 1) CHECKF(sc[r].count * 16 == c->moe_intermediate_size / tp || !strstr(nm->v[i], ".experts."),
                                       "%s rank %d: %lld scale groups for %d columns", nm->v[i], r, (long long)sc[r].count,
                                       c->moe_intermediate_size / tp);
        }
    }
    free(all);
    return checked;
}

static qsa_tp_slice tp_slice(const qsa_model_config *c, int tp, int rank, const char *name) {
    qsa_tp_slice s;
    qsa_result r = qsa_tp_slice_for(c, tp, rank, name, &s);
    CHECKF(r == QSA_OK, "%s: %s", name, qsa_last_error());
    return s;
}

#define CHECK_SLICE(s, b, c0, c1) CHECKF((s).begin == (b) && (s).shape[0] == (c0) && (s).shape[1] == (c1), \
    "begin %lld shape [%lld, %lld], want %lld [%lld, %lld]", (long long)(s).begin, (long long)(s).shape[0], \
    (long long)(s).shape[1], (long long)(b), (long long)(c0), (long long)(c1))

TEST(cpu, tp_check_real_config) {
    qsa_model_config c;
    if (!tp_real_config(&c, 24, 1)) return;
    CHECK(c.nvfp4 && c.n_ple_layers == 1 && c.layer_types[3] == QSA_LAYER_QSA && c.layer_types[4] == QSA_LAYER_LINEAR);
    for (int tp = 1; tp <= 8; tp *= 2) CHECK_OK(qsa_tp_check(&c, tp));
    CHECK_ERR(qsa_tp_check(&c, 3), QSA_ERR_INVALID_ARGUMENT, "linear_num_key_heads 16 is not divisible");
    CHECK(strstr(qsa_last_error(), "num_key_value_heads 2") && strstr(qsa_last_error(), "moe_intermediate_size 640") &&
          strstr(qsa_last_error(), "tp = 3") && !strstr(qsa_last_error(), "num_attention_heads 24"));
    CHECK_ERR(qsa_tp_check(&c, 6), QSA_ERR_INVALID_ARGUMENT, "linear_num_key_heads 16");
    CHECK_ERR(qsa_tp_check(&c, 16), QSA_ERR_INVALID_ARGUMENT, "num_attention_heads 24 is not divisible");
    /* 640 / 16 = 40 columns per rank: not whole NVFP4 groups */
    CHECK(strstr(qsa_last_error(), "layers.0.mlp.experts.0.down_proj is NVFP4: each rank's 40 input columns") != NULL);
    CHECK(!strstr(qsa_last_error(), "shared_expert")); /* excluded from quantisation: dense */
    CHECK_ERR(qsa_tp_check(&c, 32), QSA_ERR_INVALID_ARGUMENT, "linear_num_key_heads 16");
    CHECK(!strstr(qsa_last_error(), "columns per head")); /* 2560 / 16 n-gram heads = 160 = 32 * 5 */
    CHECK_ERR(qsa_tp_check(&c, 64), QSA_ERR_INVALID_ARGUMENT, "160 columns per head is not divisible");
    CHECK_ERR(qsa_tp_check(&c, 0), QSA_ERR_INVALID_ARGUMENT, "expected 1..64");
    CHECK_ERR(qsa_tp_check(&c, 65), QSA_ERR_INVALID_ARGUMENT, "expected 1..64");
    CHECK_ERR(qsa_tp_check(NULL, 2), QSA_ERR_INVALID_ARGUMENT, "NULL");

    /* 32 heads: everything divides at tp 16 except the NVFP4 groups of the routed experts */
    qsa_model_config c32;
    if (!tp_real_config(&c32, 32, 1)) return;
    CHECK_ERR(qsa_tp_check(&c32, 16), QSA_ERR_INVALID_ARGUMENT, "experts.0.down_proj is NVFP4");
    CHECK(!strstr(qsa_last_error(), "divisible"));
    if (!tp_real_config(&c32, 32, 0)) return; /* the same model in BF16 splits over 16 */
    CHECK_OK(qsa_tp_check(&c32, 16));
    CHECK_ERR(qsa_tp_check(&c32, 64), QSA_ERR_INVALID_ARGUMENT, "num_attention_heads 32"); /* and KV, key heads, ... */
}

TEST(cpu, tp_slices_real_config) {
    qsa_model_config c;
    if (!tp_real_config(&c, 24, 1)) return;
    tp_names nm;
    memset(&nm, 0, sizeof nm);
    tp_model_names(&c, &nm);
    for (int tp = 1; tp <= 8; tp *= 2) {
        int n = tp_check_names(&c, tp, &nm);
        CHECKF(n == nm.n, "tp %d: %d of %d tensors pass", tp, n, nm.n);
    }
    if (T_.verbose) printf("    %d tensor names x TP 1, 2, 4, 8\n", nm.n);
    free(nm.v);

    /* the numbers docs/TP.md quotes (TP = 4 unless said) */
    qsa_tp_slice s;
    s = tp_slice(&c, 4, 1, "layers.3.self_attn.q_proj.weight");       /* 6 heads of [q | gate] = 3072 rows */
    CHECK_SLICE(s, 3072, 3072, 2560);
    s = tp_slice(&c, 4, 1, "layers.3.self_attn.o_proj.weight");
    CHECK(s.kind == QSA_TP_COLS && s.dim == 1);
    CHECK_SLICE(s, 1536, 2560, 1536);
    s = tp_slice(&c, 4, 1, "layers.3.self_attn.k_proj.weight");        /* KV head 0 on ranks 0, 1 */
    CHECK_SLICE(s, 0, 256, 2560);
    CHECK(s.copies == 2);
    s = tp_slice(&c, 4, 2, "model.language_model.layers.3.self_attn.v_proj.weight");
    CHECK_SLICE(s, 256, 256, 2560);
    s = tp_slice(&c, 8, 7, "layers.47.self_attn.v_proj.weight");
    CHECK_SLICE(s, 256, 256, 2560);
    CHECK(s.copies == 4);
    s = tp_slice(&c, 4, 1, "layers.0.linear_attn.in_proj_qkv.weight"); /* q 512 | k 512 | v 1536 channels */
    CHECK(s.n_runs == 3 && s.run_begin[0] == 512 && s.run_begin[1] == 2048 + 512 && s.run_begin[2] == 4096 + 1536 &&
          s.run_count[0] == 512 && s.run_count[1] == 512 && s.run_count[2] == 1536);
    CHECK_SLICE(s, 512, 2560, 2560);
    s = tp_slice(&c, 4, 1, "layers.0.linear_attn.conv1d.weight");
    CHECK(s.ndim == 3 && s.shape[0] == 2560 && s.shape[1] == 1 && s.shape[2] == 4 && s.run_begin[2] == 5632);
    s = tp_slice(&c, 4, 3, "layers.0.linear_attn.A_log");
    CHECK(s.ndim == 1 && s.begin == 36 && s.shape[0] == 12);
    s = tp_slice(&c, 4, 1, "layers.0.linear_attn.out_proj.weight");
    CHECK_SLICE(s, 1536, 2560, 1536);
    s = tp_slice(&c, 4, 1, "layers.0.mlp.experts.17.gate_proj.weight"); /* NVFP4 packed [640, 1280] */
    CHECK_SLICE(s, 160, 160, 1280);
    s = tp_slice(&c, 4, 1, "layers.0.mlp.experts.17.down_proj.weight"); /* packed [2560, 320]: columns 160..319 */
    CHECK_SLICE(s, 80, 2560, 80);
    s = tp_slice(&c, 4, 1, "layers.0.mlp.experts.17.down_proj.weight_scale"); /* [2560, 40]: groups 10..19 */
    CHECK_SLICE(s, 10, 2560, 10);
    s = tp_slice(&c, 8, 7, "layers.0.mlp.experts.511.down_proj.weight_scale");
    CHECK_SLICE(s, 35, 2560, 5);
    s = tp_slice(&c, 4, 1, "layers.0.mlp.experts.17.down_proj.weight_scale_2");
    CHECK(s.kind == QSA_TP_REPLICATED && s.ndim == 0 && s.copies == 4);
    s = tp_slice(&c, 4, 1, "layers.0.mlp.experts.gate_up_proj");      /* fused [512, 1280, 2560] */
    CHECK(s.ndim == 3 && s.dim == 1 && s.n_runs == 2 && s.run_begin[0] == 160 && s.run_begin[1] == 800 &&
          s.shape[0] == 512 && s.shape[1] == 320 && s.shape[2] == 2560);
    s = tp_slice(&c, 4, 1, "layers.0.mlp.experts.down_proj");          /* fused [512, 2560, 640] */
    CHECK(s.ndim == 3 && s.dim == 2 && s.begin == 160 && s.shape[2] == 160 && s.kind == QSA_TP_COLS);
    s = tp_slice(&c, 4, 1, "layers.0.mlp.shared_expert.down_proj.weight"); /* dense (excluded) */
    CHECK_SLICE(s, 160, 2560, 160);
    s = tp_slice(&c, 8, 3, "lm_head.weight");
    CHECK_SLICE(s, 3 * 31040, 31040, 2560);
    s = tp_slice(&c, 4, 2, "layers.0.ple.ple_embedding.ngram_embedding.shard_5.weight");
    CHECK(s.kind == QSA_TP_COLS && s.begin == 80 && s.shape[1] == 40 && s.global[1] == 160 && s.global[0] * 512 >= 16 * 20000000LL);
    s = tp_slice(&c, 4, 2, "layers.0.ple.ple_embedding.ngram_embedding.weight");
    CHECK(s.global[0] % 128 == 0 && s.global[0] > 16 * 20000000LL && s.shape[0] == s.global[0]);
    s = tp_slice(&c, 4, 2, "layers.3.self_attn.indexer.index_qk_proj.weight");
    CHECK(s.kind == QSA_TP_REPLICATED && s.shape[0] == 640 && s.shape[1] == 2560);
    s = tp_slice(&c, 4, 2, "layers.3.attn_hyper_connection.input_mix_weight_down.weight");
    CHECK(s.kind == QSA_TP_REPLICATED && s.shape[0] == 320 && s.shape[1] == 10240);
    s = tp_slice(&c, 4, 2, "layers.3.self_attn.o_proj.bias");          /* added once, after the reduction */
    CHECK(s.kind == QSA_TP_REPLICATED && s.shape[0] == 2560);
    s = tp_slice(&c, 4, 2, "layers.3.self_attn.q_proj.bias");
    CHECK(s.kind == QSA_TP_ROWS && s.begin == 6144 && s.shape[0] == 3072);
}

TEST(cpu, tp_vocab_remainder_goes_to_the_last_ranks) {
    qsa_model_config c;
    if (!tp_real_config(&c, 24, 0)) return;
    c.vocab_size = 248323; /* 3 more than 8 * 31040 */
    tp_names nm;
    memset(&nm, 0, sizeof nm);
    tp_add(&nm, "lm_head.weight");
    tp_add(&nm, "lm_head.bias");
    tp_add(&nm, "embed_tokens.weight");
    CHECK(tp_check_names(&c, 8, &nm) == 3);
    free(nm.v);
    for (int r = 0; r < 8; r++) {
        qsa_tp_slice s = tp_slice(&c, 8, r, "lm_head.weight");
        CHECKF(s.count == (r < 5 ? 31040 : 31041) && s.begin == 31040LL * r + (r > 5 ? r - 5 : 0), "rank %d: [%lld, +%lld)", r,
               (long long)s.begin, (long long)s.count);
    }
    int64_t bytes;
    int coll;
    CHECK_OK(qsa_tp_comm_per_token(&c, 8, &bytes, &coll));
    CHECK(bytes == 7LL * 4 * (2 * 48 * 2560 + 2560 / 8 + 31041)); /* the short ranks pad the gather */
}

TEST(cpu, tp_unknown_names_and_bad_arguments) {
    qsa_model_config c;
    if (!tp_real_config(&c, 24, 1)) return;
    qsa_tp_slice s;
    static const char *const unknown[] = {
        "layers.48.mlp.gate.weight",                       /* layer out of range */
        "layers.0.self_attn.q_proj.weight",                /* layer 0 is linear attention */
        "layers.3.linear_attn.A_log",                      /* layer 3 is attention */
        "layers.1.ple.key_proj.weight",                    /* only layer 0 (ple_layer_ids [1]) has PLE */
        "layers.0.mlp.experts.512.gate_proj.weight",       /* 512 experts: 0..511 */
        "layers.0.mlp.experts.01.gate_proj.weight",
        "layers.0.mlp.experts.1.gate_proj",
        "layers.0.mlp.experts.1.gate_proj.weight_bogus",
        "layers.0.ple.ple_embedding.ngram_embedding.shard_512.weight",
        "layers.-1.mlp.gate.weight", "layers..mlp.gate.weight", "layers.0", "layers.0.", "layers.0.mlp.experts.gate_up_proj.weight",
        "mtp.layers.0.mlp.gate.weight", "visual.blocks.0.attn.qkv.weight", "lm_head", "embed_tokens.weight.x", "", "model.",
        "layers.3.self_attn.indexer.index_qk_proj.bias.x", "hyper_connection_mixer.block_inject_weight.weight",
        "layers.99999999999999999999.mlp.gate.weight",
    };
    for (size_t i = 0; i < sizeof unknown / sizeof unknown[0]; i++) {
        qsa_result r = qsa_tp_slice_for(&c, 4, 0, unknown[i], &s);
        CHECKF(r == QSA_ERR_NOT_FOUND && strstr(qsa_last_error(), unknown[i]), "'%s': %s (%s)", unknown[i], qsa_result_string(r),
               qsa_last_error());
    }
    CHECK_ERR(qsa_tp_slice_for(&c, 4, 4, "lm_head.weight", &s), QSA_ERR_INVALID_ARGUMENT, "rank 4: expected 0..3");
    CHECK_ERR(qsa_tp_slice_for(&c, 4, -1, "lm_head.weight", &s), QSA_ERR_INVALID_ARGUMENT, "rank -1");
    CHECK_ERR(qsa_tp_slice_for(&c, 3, 0, "lm_head.weight", &s), QSA_ERR_INVALID_ARGUMENT, "linear_num_key_heads");
    CHECK_ERR(qsa_tp_slice_for(&c, 4, 0, NULL, &s), QSA_ERR_INVALID_ARGUMENT, "NULL");
    CHECK_ERR(qsa_tp_slice_for(&c, 4, 0, "lm_head.weight", NULL), QSA_ERR_INVALID_ARGUMENT, "NULL");
    /* block scales of a linear the config leaves dense: the slice they would have (whole groups) */
    CHECK_OK(qsa_tp_slice_for(&c, 4, 0, "layers.3.self_attn.o_proj.weight_scale", &s));
    CHECK(s.kind == QSA_TP_COLS && s.shape[0] == 2560 && s.shape[1] == 1536 / 16);
    int64_t bytes = -1;
    int coll = -1;
    CHECK_ERR(qsa_tp_comm_per_token(&c, 3, &bytes, &coll), QSA_ERR_INVALID_ARGUMENT, "tp = 3");
    CHECK(bytes == 0 && coll == 0);
    CHECK_ERR(qsa_tp_comm_per_token(&c, 2, NULL, &coll), QSA_ERR_INVALID_ARGUMENT, "NULL");
}

/* The collectives of one token under the documented scheme, counted from the plan itself: one
   all-gather per group of row-parallel (COLS) outputs that are summed together, one for the PLE
   columns, one for the logits. */
static void tp_explicit_comm(const qsa_model_config *c, int tp, int layer, int64_t *floats, int *coll) {
    char n[160];
    qsa_tp_slice s;
    *floats = 0;
    *coll = 0;
    if (layer >= 0) {
        int L = layer;
        if (c->layer_types[L] == QSA_LAYER_QSA) snprintf(n, sizeof n, "layers.%d.self_attn.o_proj.weight", L);
        else snprintf(n, sizeof n, "layers.%d.linear_attn.out_proj.weight", L);
        s = tp_slice(c, tp, 0, n);
        CHECK(s.kind == QSA_TP_COLS);
        *floats += s.global[0]; /* the mixer's partial sum [H] */
        (*coll)++;
        snprintf(n, sizeof n, "layers.%d.mlp.experts.0.down_proj.weight", L);
        s = tp_slice(c, tp, 0, n);
        snprintf(n, sizeof n, "layers.%d.mlp.shared_expert.down_proj.weight", L);
        qsa_tp_slice sh = tp_slice(c, tp, 0, n);
        CHECK(s.kind == QSA_TP_COLS && sh.kind == QSA_TP_COLS && s.global[0] == sh.global[0]);
        *floats += s.global[0]; /* routed + shared partial sums, added locally: one [H] */
        (*coll)++;
        for (int k = 0; k < c->n_ple_layers; k++) {
            if (c->ple_layer_ids[k] != L + 1) continue;
            snprintf(n, sizeof n, "layers.%d.ple.ple_embedding.ngram_embedding.weight", L);
            s = tp_slice(c, tp, 0, n);
            CHECK(s.kind == QSA_TP_COLS);
            *floats += s.shape[1] * (int64_t)((c->ngram_size - 1) * c->heads_per_ngram); /* the rank's columns of every head */
            (*coll)++;
        }
    } else {
        int64_t most = 0;
        for (int r = 0; r < tp; r++) {
            s = tp_slice(c, tp, r, "lm_head.weight");
            if (s.shape[0] > most) most = s.shape[0];
        }
        *floats = most;
        *coll = 1;
    }
}

TEST(cpu, tp_comm_per_token) {
    qsa_model_config c;
    if (!tp_real_config(&c, 24, 1)) return;
    int64_t bytes;
    int coll;
    CHECK_OK(qsa_tp_comm_per_token(&c, 1, &bytes, &coll));
    CHECK(bytes == 0 && coll == 0);
    /* per layer: linear + PLE (layer 0), linear (1), attention (3), then lm_head */
    int64_t f;
    int k;
    tp_explicit_comm(&c, 4, 0, &f, &k);
    CHECK(k == 3 && f == 2 * 2560 + 2560 / 4);
    tp_explicit_comm(&c, 4, 1, &f, &k);
    CHECK(k == 2 && f == 2 * 2560);
    tp_explicit_comm(&c, 4, 3, &f, &k);
    CHECK(k == 2 && f == 2 * 2560);
    tp_explicit_comm(&c, 4, -1, &f, &k);
    CHECK(k == 1 && f == 248320 / 4);
    /* (tp - 1) * 4 bytes * (2 * 48 layers * 2560 + 2560 / tp PLE columns + 248320 / tp logits) */
    static const int64_t want[4] = {0, 1LL * 4 * (245760 + 1280 + 124160), 3LL * 4 * (245760 + 640 + 62080),
                                    7LL * 4 * (245760 + 320 + 31040)};
    for (int tp = 2, i = 1; tp <= 8; tp *= 2, i++) {
        int64_t sum = 0;
        int ncoll = 0;
        for (int L = -1; L < c.num_hidden_layers; L++) {
            tp_explicit_comm(&c, tp, L, &f, &k);
            sum += f;
            ncoll += k;
        }
        CHECK_OK(qsa_tp_comm_per_token(&c, tp, &bytes, &coll));
        CHECKF(bytes == (int64_t)(tp - 1) * 4 * sum && coll == ncoll && coll == 98 && bytes == want[i],
               "tp %d: %lld bytes, %d collectives; explicit %lld bytes, %d; documented %lld", tp, (long long)bytes, coll,
               (long long)((tp - 1) * 4 * sum), ncoll, (long long)want[i]);
    }
}

/* Every tensor of every golden checkpoint: where tp fits, its slices and its global shape (against
   the file); where it does not, a refusal naming the field. */
TEST(cpu, tp_slices_fixtures) {
    static const struct { const char *dir; int fits[4]; const char *refusal; } fx[] = {
        /* fits for tp = 1, 2, 4, 8; a field the tp = 4 refusal must name */
        {"tests/fixtures/nvfp4_experts", {1, 1, 0, 0}, "is NVFP4: each rank's 8 input columns"},
        {"tests/fixtures/qsa_first_no_ple", {1, 0, 0, 0}, "linear_num_key_heads 1"},
        {"tests/fixtures/qsa_hc2_ple_bf16", {1, 1, 0, 0}, "linear_num_key_heads 2"},
        {"tests/fixtures/qsa_hc4_ple_sharded", {1, 1, 0, 0}, "columns per head is not divisible"},
    };
    for (size_t f = 0; f < sizeof fx / sizeof fx[0]; f++) {
        qsa_model_config c;
        qsa__st_set st;
        memset(&st, 0, sizeof st);
        CHECK_OK(qsa_config_load_dir(test_path(fx[f].dir), &c));
        qsa_result r = qsa__st_open_dir(test_path(fx[f].dir), &st);
        CHECK_OK(r);
        if (r != QSA_OK) continue;
        tp_names nm;
        memset(&nm, 0, sizeof nm);
        for (int i = 0; i < st.ntensors; i++) tp_add(&nm, "%s", st.tensors[i].name);
        for (int ti = 0, tp = 1; tp <= 8; tp *= 2, ti++) {
            qsa_result ok = qsa_tp_check(&c, tp);
            CHECKF((ok == QSA_OK) == fx[f].fits[ti], "%s tp %d: %s", fx[f].dir, tp, qsa_last_error());
            if (ok != QSA_OK) {
                CHECKF(ok == QSA_ERR_INVALID_ARGUMENT && strstr(qsa_last_error(), "cannot be split over"), "%s", qsa_last_error());
                if (tp == 4) CHECKF(strstr(qsa_last_error(), fx[f].refusal) != NULL, "%s: '%s'", fx[f].dir, qsa_last_error());
                qsa_tp_slice s;
                CHECK(qsa_tp_slice_for(&c, tp, 0, nm.v[0], &s) == QSA_ERR_INVALID_ARGUMENT);
                continue;
            }
            CHECKF(tp_check_names(&c, tp, &nm) == nm.n, "%s tp %d", fx[f].dir, tp);
            /* the plan's global shapes are the checkpoint's */
            for (int i = 0; i < st.ntensors; i++) {
                const qsa__tensor *t = &st.tensors[i];
                qsa_tp_slice s = tp_slice(&c, tp, tp - 1, t->name);
                int same = s.ndim == t->ndim || (s.ndim == 0 && t->ndim == 1 && t->shape[0] == 1);
                for (int d = 0; same && d < t->ndim; d++) same = s.global[d] == t->shape[d];
                CHECKF(same, "%s: %s: plan [%lld, %lld, %lld] (ndim %d), file ndim %d [%lld, %lld, ...]", fx[f].dir, t->name,
                       (long long)s.global[0], (long long)s.global[1], (long long)s.global[2], s.ndim, t->ndim,
                       (long long)t->shape[0], (long long)(t->ndim > 1 ? t->shape[1] : 0));
            }
            int64_t bytes;
            int coll;
            CHECK_OK(qsa_tp_comm_per_token(&c, tp, &bytes, &coll));
            int64_t sum = 0;
            int ncoll = 0;
            for (int L = -1; L < c.num_hidden_layers; L++) {
                int64_t fl;
                int k;
                tp_explicit_comm(&c, tp, L, &fl, &k);
                sum += fl;
                ncoll += k;
            }
            CHECKF(tp == 1 ? bytes == 0 && coll == 0 : bytes == (int64_t)(tp - 1) * 4 * sum && coll == ncoll,
                   "%s tp %d: %lld bytes %d collectives, explicit %lld floats %d", fx[f].dir, tp, (long long)bytes, coll,
                   (long long)sum, ncoll);
        }
        if (strstr(fx[f].dir, "qsa_hc4")) { /* hc_lowrank 12: no NVFP4 scales can exist for the HC up projection */
            qsa_tp_slice s;
            CHECK_ERR(qsa_tp_slice_for(&c, 2, 0, "hyper_connection_mixer.input_mix_weight_up.weight_scale", &s), QSA_ERR_SHAPE,
                      "12 input columns cannot be NVFP4");
        }
        free(nm.v);
        qsa__st_close(&st);
    }
}
