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
    if (!(c->rope_theta > 0) || c->rope_theta > 1e30)
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
            static const qsa__json empty_obj = {QSA__JSON_OBJECT, NULL, 0, NULL, 0, 0, 0, 0, NULL, NULL, 0};
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
            r = qsa__cfg_num(&rd, #field, 0, &v); out->field = (float)v; out->has_##field = 1; }
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
