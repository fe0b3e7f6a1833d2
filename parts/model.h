/* ============================================================================================== */
/* >>weights  binding checkpoint tensors to the model structure                                   */
/* ============================================================================================== */

/* A linear map y = W x with W [out, in].  Dense weights are held in fp32 (converted at load; the
   CPU backend computes in fp32).  NVFP4 weights stay packed: row r, element i is
   e2m1(nibble) * e4m3(scale[r][i/16]) * global_scale, element 2j in the low nibble of byte j. */
typedef struct qsa__lin {
    int out, in;
    const float *w;        /* [out][in] fp32, or NULL for NVFP4 */
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
   state as one GDN layer's recurrent state, rounded up to a multiple of 16 tokens. */
QSA_PRIV int qsa__default_page_size(const qsa_model_config *c) {
    double gdn = 4.0 * c->linear_num_value_heads * c->linear_key_head_dim * c->linear_value_head_dim;
    double attn = 2.0 * 2.0 * c->num_key_value_heads * c->head_dim + (c->has_qsa ? 4.0 * c->indexer_head_dim : 0.0);
    int pages = (int)ceil(gdn / (16.0 * attn));
    return 16 * (pages < 1 ? 1 : pages);
}

/* ============================================================================================== */
/* >>planner  QSA selections -> attention plans in logical order                                  */
/* ============================================================================================== */
/* A query's selection (complete blocks + tail tokens) becomes ascending logical token ranges, cut
   at page boundaries into (physical page, offset, length) segments.  The attention reduces over the
   selected tokens in plan order with split points fixed in *logical selected-token index* (every
   QSA_ATTN_SPLIT tokens) and merges the partial (max, sum, out) triples left to right, so the result
   depends only on logical positions, never on where the pages are.  physical_order = 1 sorts the
   segments by physical address instead (debug: this is what breaks allocation invariance). */
#define QSA_ATTN_SPLIT 256

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
    const float *embed;    /* [vocab, H] */
    qsa__lin lm_head;      /* [vocab, H] */
    qsa__gres final_hc;
    qsa__layer_w *layers;
    float *rope_inv_freq;  /* [rotary_dim / 2] */
    qsa__pool pool;        /* KV pages of the QSA layers */
    struct qsa__cuda *cuda; /* the CUDA backend, NULL on the CPU backend */
    /* owned fp32 copies of dense tensors */
    float **owned;
    int n_owned, cap_owned;
    /* thread pool for the CPU matmuls */
    int n_threads;
};

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
    for (size_t i = 0; i < n; i++) p[i] = qsa__tensor_f32(t, i);
    QSA__TRY(qsa__own(m, p));
    *out = p;
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
        QSA__TRY(qsa__load_f32(m, name, 2, shape, &l->w));
    }
    snprintf(name, sizeof name, "%s.bias", base);
    if (qsa__st_find(&m->st, name)) QSA__TRY(qsa__load_vec(m, name, out, &l->bias));
    return QSA_OK;
}

/* Row block [row0, row0 + out) of a dense fp32 matrix with `in` columns, as a linear map. */
QSA_PRIV qsa__lin qsa__lin_rows(const float *w, int row0, int out, int in) {
    qsa__lin l;
    memset(&l, 0, sizeof l);
    l.out = out;
    l.in = in;
    l.w = w + (size_t)row0 * (size_t)in;
    return l;
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
        int64_t s1[3] = {E, 2 * I, H}, s2[3] = {E, H, I};
        QSA__TRY(qsa__load_f32(m, name, 3, s1, &gu));
        snprintf(name, sizeof name, "%s.experts.down_proj", b);
        QSA__TRY(qsa__load_f32(m, name, 3, s2, &dn));
        for (int e = 0; e < E; e++) {
            const float *ge = gu + (size_t)e * 2 * (size_t)I * (size_t)H;
            w->gate[e] = qsa__lin_rows(ge, 0, I, H);
            w->up[e] = qsa__lin_rows(ge, I, I, H);
            w->down[e] = qsa__lin_rows(dn + (size_t)e * (size_t)H * (size_t)I, 0, H, I);
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

QSA_PRIV int qsa__is_prime(int64_t v) {
    if (v < 2) return 0;
    if (v % 2 == 0) return v == 2;
    for (int64_t d = 3; d * d <= v; d += 2)
        if (v % d == 0) return 0;
    return 1;
}

/* Per-head prime vocabularies: head h of PLE layer k uses the (k*n_heads + h + 1)-th prime after
   base - 1; offsets are the running sums. */
QSA_PRIV void qsa__ple_head_vocabs(int64_t base, int ple_index, int n_heads, int64_t *vocab, int64_t *offset,
                                   int64_t *total) {
    int64_t p = base - 1, sum = 0;
    int skip = ple_index * n_heads;
    for (int i = 0; i < skip + n_heads; i++) {
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

QSA_PRIV qsa_result qsa__load_ple(qsa_model *m, int L, int ple_index, qsa__ple_w *p) {
    const qsa_model_config *c = &m->cfg;
    int H = c->hidden_size, hcH = c->hc_count * H, D = c->ple_embed_dim;
    int n_heads = (c->ngram_size - 1) * c->heads_per_ngram;
    char b[256], name[512];
    snprintf(b, sizeof b, "layers.%d.ple", L);
    p->ple_index = ple_index;
    p->head_vocab = QSA__CALLOC(int64_t, n_heads);
    p->head_offset = QSA__CALLOC(int64_t, n_heads);
    if (!p->head_vocab || !p->head_offset) return qsa__fail(QSA_ERR_OUT_OF_MEMORY, "model load: out of memory");
    if (c->ngram_size > 16) return qsa__fail(QSA_ERR_UNSUPPORTED, "config: ngram_size %d > 16", c->ngram_size);
    qsa__ple_multipliers(c->vocab_size, c->ngram_size, ple_index, c->seed, p->mult);
    int64_t total;
    qsa__ple_head_vocabs(c->ngram_vocab_size_base, ple_index, n_heads, p->head_vocab, p->head_offset, &total);
    int64_t div = c->make_ngram_vocab_size_divisible_by > 0 ? c->make_ngram_vocab_size_divisible_by : 1;
    int64_t padded = (total + div - 1) / div * div;
    snprintf(name, sizeof name, "%s.ple_embedding.ngram_embedding", b);
    QSA__TRY(qsa__st_rows_view(&m->st, name, &p->table));
    if (p->table.rows != padded || p->table.cols != D / n_heads)
        return qsa__fail(QSA_ERR_SHAPE, "tensor '%s': shape [%lld, %lld], expected [%lld, %d] from the config", name,
                         (long long)p->table.rows, (long long)p->table.cols, (long long)padded, D / n_heads);
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
    QSA__TRY(qsa__load_f32(m, "embed_tokens.weight", 2, eshape, &m->embed));
    if (qsa__st_find(&m->st, "lm_head.weight") || qsa__st_is_nvfp4(&m->st, "lm_head"))
        QSA__TRY(qsa__load_lin(m, "lm_head", c->vocab_size, H, &m->lm_head));
    else if (c->tie_word_embeddings)
        m->lm_head = qsa__lin_rows(m->embed, 0, c->vocab_size, H);
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
        for (int k = 0; k < c->n_ple_layers; k++) {
            if (c->ple_layer_ids[k] != L + 1) continue;
            lw->ple = QSA__CALLOC(qsa__ple_w, 1);
            if (!lw->ple) return qsa__fail(QSA_ERR_OUT_OF_MEMORY, "model load: out of memory");
            QSA__TRY(qsa__load_ple(m, L, k, lw->ple));
        }
        if (L % 8 == 7) qsa__log(QSA_LOG_DEBUG, "loaded layer %d/%d", L + 1, c->num_hidden_layers);
    }
    /* RoPE inverse frequencies in fp32, as the reference computes them */
    int rd = c->rotary_dim;
    m->rope_inv_freq = QSA__ALLOC(float, rd / 2 + 1);
    if (!m->rope_inv_freq) return qsa__fail(QSA_ERR_OUT_OF_MEMORY, "model load: out of memory");
    for (int i = 0; i < rd / 2; i++) {
        float e = (float)(2 * i) / (float)rd;
        float p = powf((float)c->rope_theta, e);
        m->rope_inv_freq[i] = 1.0f / p;
    }
    return QSA_OK;
}

#ifndef QSA_NO_CUDA
struct qsa__cuda;
struct qsa__cuda_seq;
QSA_PRIV qsa_result qsa__cuda_init(qsa_model *m, struct qsa__cuda **out);
QSA_PRIV void qsa__cuda_free(struct qsa__cuda *g);
QSA_PRIV qsa_result qsa__cuda_seq_create(qsa_model *m, qsa_seq *s);
QSA_PRIV qsa_result qsa__cuda_seq_reset(qsa_model *m, qsa_seq *s);
QSA_PRIV void qsa__cuda_seq_destroy(qsa_model *m, qsa_seq *s);
QSA_PRIV qsa_result qsa__cuda_chunk(qsa_seq *sq, const int32_t *ids, int M, float *logits, int all_logits);
#endif

QSA_PRIV void qsa__pool_destroy(qsa__pool *p) {
    qsa__free(p->k);
    qsa__free(p->v);
    qsa__free(p->ik);
    qsa__free(p->slot);
    qsa__free(p->free_pages);
    memset(p, 0, sizeof *p);
}

QSA_PRIV qsa_result qsa__pool_create(qsa_model *m, int host_storage) {
    const qsa_model_config *c = &m->cfg;
    qsa__pool *p = &m->pool;
    p->page_size = m->params.kv_page_size > 0 ? m->params.kv_page_size : qsa__default_page_size(c);
    if (m->params.kv_page_size > 0 && m->params.kv_page_size < 16)
        return qsa__fail(QSA_ERR_INVALID_ARGUMENT, "kv_page_size %d: expected at least 16 tokens", m->params.kv_page_size);
    int64_t tokens = m->params.kv_pool_tokens > 0 ? m->params.kv_pool_tokens
                                                  : (c->max_position_embeddings < 32768 ? c->max_position_embeddings : 32768);
    p->n_pages = (int)((tokens + p->page_size - 1) / p->page_size);
    p->kvd = c->num_key_value_heads * c->head_dim;
    p->ihd = c->has_qsa ? c->indexer_head_dim : 0;
    p->slot = QSA__ALLOC(int, c->num_hidden_layers);
    p->free_pages = QSA__ALLOC(int32_t, p->n_pages);
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

QSA_IMPL void qsa_model_free(qsa_model *m) {
    if (!m) return;
#ifndef QSA_NO_CUDA
    qsa__cuda_free(m->cuda);
#endif
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
    qsa__pool_destroy(&m->pool);
    if (m->tok) qsa_tokenizer_free(m->tok);
    qsa__st_close(&m->st);
    qsa__free(m);
}

QSA_IMPL qsa_result qsa_model_load(const char *dir, const qsa_model_params *params, qsa_model **out) {
    if (!dir || !out) return qsa__fail(QSA_ERR_INVALID_ARGUMENT, "qsa_model_load: NULL argument");
    *out = NULL;
    qsa_model *m = QSA__CALLOC(qsa_model, 1);
    if (!m) return qsa__fail(QSA_ERR_OUT_OF_MEMORY, "qsa_model_load: out of memory");
    if (params) m->params = *params;
    QSA__DEF(m->params.gdn_chunk_size, 64);
    if (m->params.n_threads <= 0) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        m->params.n_threads = n < 1 ? 1 : n > 16 ? 16 : (int)n;
    }
    m->n_threads = m->params.n_threads;
    double t0 = qsa__now();
    qsa_result r = qsa_config_load_dir(dir, &m->cfg);
    if (r == QSA_OK) {
        char *gpath = qsa__path_join(dir, "generation_config.json");
        if (gpath && qsa__file_exists(gpath)) {
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
    if (r == QSA_OK) r = qsa__model_bind(m);
    if (r == QSA_OK && m->params.backend != QSA_BACKEND_CPU) {
#ifdef QSA_NO_CUDA
        if (m->params.backend == QSA_BACKEND_CUDA) r = qsa__fail(QSA_ERR_UNSUPPORTED, "qsa_model_load: built with QSA_NO_CUDA");
#else
        QSA__DEF(m->params.max_chunk, 512);
        /* the pool's page size is needed by the device allocation: settle it first */
        r = qsa__pool_create(m, 0);
        if (r == QSA_OK) r = qsa__cuda_init(m, &m->cuda);
        if (r != QSA_OK && m->params.backend == QSA_BACKEND_AUTO) {
            qsa__log(QSA_LOG_INFO, "CUDA backend unavailable (%s): using the CPU backend", qsa_last_error());
            qsa__pool_destroy(&m->pool);
            r = QSA_OK;
        }
#endif
    }
    if (r == QSA_OK && !m->cuda) r = qsa__pool_create(m, 1);
    if (r == QSA_OK && !m->params.no_tokenizer) {
        char *tpath = qsa__path_join(dir, "tokenizer.json");
        if (tpath && qsa__file_exists(tpath)) r = qsa_tokenizer_load_dir(dir, &m->tok);
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

QSA_IMPL const qsa_model_config *qsa_model_get_config(const qsa_model *m) { return &m->cfg; }
QSA_IMPL const qsa_tokenizer *qsa_model_get_tokenizer(const qsa_model *m) { return m->tok; }
QSA_IMPL const qsa_generation_config *qsa_model_get_generation_config(const qsa_model *m) { return &m->gen; }

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

/* Row r of a linear map as fp32 (dense rows are returned in place; NVFP4 rows are dequantised into tmp). */
QSA_PRIV const float *qsa__lin_row(const qsa__lin *l, int r, float *tmp) {
    if (l->w) return l->w + (size_t)r * (size_t)l->in;
    const uint8_t *q = l->q + (size_t)r * (size_t)(l->in / 2);
    const uint8_t *s = l->qscale + (size_t)r * (size_t)(l->in / 16);
    for (int g = 0; g < l->in / 16; g++) {
        float scale = qsa__e4m3_to_f32(s[g]) * l->qscale2;
        for (int j = 0; j < 8; j++) {
            uint8_t b = q[g * 8 + j];
            tmp[g * 16 + 2 * j] = qsa__e2m1_values[b & 15] * scale;
            tmp[g * 16 + 2 * j + 1] = qsa__e2m1_values[b >> 4] * scale;
        }
    }
    return tmp;
}

/* y[r] = sum_i W[r][i] x[i] for r in [r0, r1), fp32 accumulation in index order. */
QSA_PRIV void qsa__matvec_rows(const qsa__lin *l, const float *x, float *y, int r0, int r1, float *tmp) {
    for (int r = r0; r < r1; r++) {
        const float *w = qsa__lin_row(l, r, tmp);
        float acc = 0.0f;
        for (int i = 0; i < l->in; i++) acc += w[i] * x[i];
        y[r] = acc + (l->bias ? l->bias[r] : 0.0f);
    }
}

typedef struct qsa__mv_job {
    const qsa__lin *l;
    const float *x;
    float *y;
    int r0, r1;
} qsa__mv_job;

QSA_PRIV void *qsa__mv_thread(void *arg) {
    qsa__mv_job *j = (qsa__mv_job *)arg;
    float *tmp = j->l->w ? NULL : QSA__ALLOC(float, j->l->in);
    if (j->l->w || tmp) qsa__matvec_rows(j->l, j->x, j->y, j->r0, j->r1, tmp);
    qsa__free(tmp);
    return NULL;
}

/* y = W x.  Large maps are split over threads by rows; each row's sum is the same whatever the
   split, so the result does not depend on the thread count. */
QSA_PRIV qsa_result qsa__matvec(const qsa_model *m, const qsa__lin *l, const float *x, float *y) {
    int nt = m->n_threads;
    size_t work = (size_t)l->out * (size_t)l->in;
    if (nt <= 1 || work < (1u << 18)) {
        float *tmp = l->w ? NULL : QSA__ALLOC(float, l->in);
        if (!l->w && !tmp) return qsa__fail(QSA_ERR_OUT_OF_MEMORY, "matvec: out of memory");
        qsa__matvec_rows(l, x, y, 0, l->out, tmp);
        qsa__free(tmp);
        return QSA_OK;
    }
    if (nt > 16) nt = 16;
    pthread_t th[16];
    qsa__mv_job jobs[16];
    int started = 0;
    for (int t = 0; t < nt; t++) {
        jobs[t].l = l;
        jobs[t].x = x;
        jobs[t].y = y;
        jobs[t].r0 = (int)((int64_t)l->out * t / nt);
        jobs[t].r1 = (int)((int64_t)l->out * (t + 1) / nt);
        if (t == 0) continue;
        if (pthread_create(&th[t], NULL, qsa__mv_thread, &jobs[t]) != 0) {
            qsa__mv_thread(&jobs[t]);
            jobs[t].r0 = -1;
        }
        started++;
    }
    qsa__mv_thread(&jobs[0]);
    for (int t = 1; t < nt; t++)
        if (jobs[t].r0 >= 0) pthread_join(th[t], NULL);
    (void)started;
    return QSA_OK;
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
    struct qsa__cuda_seq *cuda; /* device state on the CUDA backend */
    qsa__capture *cap;          /* debug capture, NULL when off */
};

/* Make sure the sequence holds the pages for `need` tokens; all or nothing. */
QSA_PRIV qsa_result qsa__seq_reserve(qsa_seq *s, int need) {
    qsa__pool *pl = &s->m->pool;
    if (!pl->n_qsa) return QSA_OK;
    int want = (need + pl->page_size - 1) / pl->page_size;
    if (want <= s->n_pages) return QSA_OK;
    if (want - s->n_pages > pl->n_free)
        return qsa__fail(QSA_ERR_CONTEXT_FULL, "KV page pool: %d more pages of %d tokens needed, %d free of %d",
                         want - s->n_pages, pl->page_size, pl->n_free, pl->n_pages);
    while (s->n_pages < want) s->bt[s->n_pages++] = pl->free_pages[--pl->n_free];
    return QSA_OK;
}

QSA_PRIV void qsa__seq_release(qsa_seq *s) {
    qsa__pool *pl = &s->m->pool;
    while (s->n_pages > 0) pl->free_pages[pl->n_free++] = s->bt[--s->n_pages];
}

QSA_IMPL void qsa_seq_reset(qsa_seq *s) {
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
    s->pos = 0;
#ifndef QSA_NO_CUDA
    if (s->cuda) qsa__cuda_seq_reset(s->m, s); /* a memset of device memory we own: cannot fail in practice */
#endif
}

QSA_PRIV void qsa__capture_free(qsa_seq *s) {
    qsa__capture *c = s->cap;
    if (!c) return;
    qsa__buf *bufs[7] = {&c->pos, &c->q, &c->sel, &c->nsel, &c->out, &c->seg, &c->seg_off};
    for (int i = 0; i < 7; i++) qsa__buf_free(bufs[i]);
    qsa__free(c);
    s->cap = NULL;
}

QSA_IMPL void qsa_seq_free(qsa_seq *s) {
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

QSA_IMPL qsa_result qsa_seq_create(qsa_model *m, const qsa_seq_params *params, qsa_seq **out) {
    if (!m || !out) return qsa__fail(QSA_ERR_INVALID_ARGUMENT, "qsa_seq_create: NULL argument");
    const qsa_model_config *c = &m->cfg;
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

QSA_IMPL int qsa_seq_pos(const qsa_seq *s) { return s->pos; }

/* ---- layer math ---- */

/* Scratch buffers for one chunk of n tokens. */
typedef struct qsa__scratch {
    float *xn, *mw, *low;   /* GatedResidual: normed streams [hcH], mix weights [hcH], low rank [r] */
    float *inj;             /* [n][hc] injection weights */
    float *inp, *out;       /* [n][H] layer input / output */
    float *big, *big2;      /* mixer scratch (sized for the largest projection) */
    float *tmp;             /* [max in] dequantised row */
} qsa__scratch;

/* GatedResidual on one token's streams x[hcH]: writes the mixed input inp[H] and inj[hc] (if any). */
QSA_PRIV qsa_result qsa__gres_fwd(const qsa_model *m, const qsa__gres *g, const float *x, float *inp, float *inj,
                                  qsa__scratch *sc) {
    const qsa_model_config *c = &m->cfg;
    int H = c->hidden_size, hc = c->hc_count, hcH = hc * H;
    /* xn = group RMSNorm of the streams */
    qsa__rmsnorm_1p(x, g->norm_w, sc->xn, hcH, H, c->rms_norm_eps);
    /* w = sigmoid(up(silu(down(xn) / hc))) */
    QSA__TRY(qsa__matvec(m, &g->down, sc->xn, sc->low));
    for (int i = 0; i < c->hc_lowrank; i++) sc->low[i] = qsa__silu(sc->low[i] / (float)hc);
    QSA__TRY(qsa__matvec(m, &g->up, sc->low, sc->mw));
    /* input = mean over streams of w * xn */
    for (int j = 0; j < H; j++) {
        float acc = 0.0f;
        for (int s = 0; s < hc; s++) acc += qsa__sigmoid(sc->mw[s * H + j]) * sc->xn[s * H + j];
        inp[j] = acc / (float)hc;
    }
    /* injection = 2 * sigmoid(inject(xn) / hc) per stream */
    if (inj) {
        QSA__TRY(qsa__matvec(m, &g->inject, sc->xn, inj));
        for (int s = 0; s < hc; s++) inj[s] = 2.0f * qsa__sigmoid(inj[s] / (float)hc);
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
QSA_PRIV void qsa__ple_embed(const qsa_model_config *c, const qsa__ple_w *p, const int32_t *win, float *e) {
    int ctx = c->ngram_size - 1, hdim = c->ple_embed_dim / (ctx * c->heads_per_ngram);
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
            float *dst = e + (size_t)head * hdim;
            for (int i = 0; i < hdim; i++) {
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
QSA_PRIV void qsa__gdn_recurrent(const qsa_model_config *c, float *S, const float *q, const float *k, const float *v,
                                 const float *beta, const float *g, float *o, int n) {
    int nk = c->linear_num_key_heads, nv = c->linear_num_value_heads, dk = c->linear_key_head_dim,
        dv = c->linear_value_head_dim, rep = nv / nk;
    float *kv = QSA__ALLOC(float, dv);
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
    qsa_result r = QSA_OK;
    if (!qkv || !q || !k || !v || !z || !o || !beta || !g) { r = qsa__fail(QSA_ERR_OUT_OF_MEMORY, "GDN: out of memory"); goto done; }
    /* projections; conv inputs are laid out after the K-1 carried columns */
    if (K > 1) memcpy(qkv, sl->conv, sizeof(float) * (size_t)(K - 1) * conv_dim);
    for (int t = 0; t < n; t++) {
        const float *x = inp + (size_t)t * H;
        if ((r = qsa__matvec(m, &w->in_qkv, x, qkv + (size_t)(K - 1 + t) * conv_dim)) != QSA_OK) goto done;
        if ((r = qsa__matvec(m, &w->in_z, x, z + (size_t)t * value_dim)) != QSA_OK) goto done;
        float bb[1024], aa[1024];
        if (nv > 1024) { r = qsa__fail(QSA_ERR_UNSUPPORTED, "GDN: more than 1024 value heads"); goto done; }
        if ((r = qsa__matvec(m, &w->in_b, x, bb)) != QSA_OK) goto done;
        if ((r = qsa__matvec(m, &w->in_a, x, aa)) != QSA_OK) goto done;
        for (int h = 0; h < nv; h++) {
            beta[t * nv + h] = qsa__sigmoid(bb[h]);
            g[t * nv + h] = -expf(w->A_log[h]) * qsa__softplus(aa[h] + w->dt_bias[h]);
        }
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
        qsa__gdn_recurrent(c, sl->S, q, k, v, beta, g, o, n);
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
        if ((r = qsa__matvec(m, &w->out, ot, out + (size_t)t * H)) != QSA_OK) goto done;
    }
done:
    qsa__free(qkv); qsa__free(q); qsa__free(k); qsa__free(v); qsa__free(z); qsa__free(o); qsa__free(beta); qsa__free(g);
    return r;
}

/* Block b's key from its r raw keys keys[r][ihd]: fp32 mean, k_layernorm, RoPE at position b*r. */
QSA_PRIV void qsa__block_key(const qsa_model *m, const qsa__attn_w *a, const float *keys, int b, float *out) {
    const qsa_model_config *c = &m->cfg;
    int ihd = c->indexer_head_dim, r = c->indexer_compress_ratio;
    float mean[1024];
    for (int d = 0; d < ihd; d++) {
        float s = 0.0f;
        for (int t = 0; t < r; t++) s += keys[(size_t)t * ihd + d];
        mean[d] = s / (float)r;
    }
    qsa__rmsnorm_1p(mean, a->idx_k_norm, out, ihd, ihd, c->rms_norm_eps);
    qsa__rope(m, out, (int64_t)b * r);
}

/* Top-k blocks by score: higher score first, then lower block index (the reference leaves ties
   open; this is our definition).  Returns the selection sorted by ascending block index. */
QSA_PRIV int qsa__select_blocks(const float *scores, int nb, int k, int32_t *sel) {
    if (k > nb) k = nb;
    int n = 0;
    for (int b = 0; b < nb; b++) {
        /* insertion into a list kept in (score desc, index asc) order, at most k long */
        if (n == k && !(scores[b] > scores[sel[n - 1]])) continue;
        int i = n < k ? n++ : k - 1;
        while (i > 0 && scores[b] > scores[sel[i - 1]]) { sel[i] = sel[i - 1]; i--; }
        sel[i] = b;
    }
    /* ascending block order */
    for (int i = 1; i < n; i++) {
        int32_t x = sel[i];
        int j = i;
        while (j > 0 && sel[j - 1] > x) { sel[j] = sel[j - 1]; j--; }
        sel[j] = x;
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
    float *iq = QSA__ALLOC(float, (size_t)n * (ih + 1) * ihd + 1);
    float *att = QSA__ALLOC(float, (size_t)nh * hd), *acc = QSA__ALLOC(float, hd);
    float *scores = QSA__ALLOC(float, (size_t)(p0 + n) / r + 1);
    int32_t *sel = QSA__ALLOC(int32_t, topk + 1);
    float *ikeys = QSA__ALLOC(float, (size_t)r * ihd + 1);
    qsa__plan plan;
    memset(&plan, 0, sizeof plan);
    qsa_result res = QSA_OK;
    if (!qg || !iq || !att || !acc || !scores || !sel || !ikeys) { res = qsa__fail(QSA_ERR_OUT_OF_MEMORY, "attention: out of memory"); goto done; }
    /* 1. projections for every token of the chunk; K, V and raw indexer keys go to the token's page */
    for (int t = 0; t < n; t++) {
        const float *x = inp + (size_t)t * H;
        int64_t pos = p0 + t;
        int32_t page = sq->bt[pos / ps];
        int off = (int)(pos % ps);
        float *qt = qg + (size_t)t * nh * hd * 2;
        if ((res = qsa__matvec(m, &a->q, x, qt)) != QSA_OK) goto done;
        float *kt = qsa__pool_k(pool, slot, page, off), *vt = qsa__pool_v(pool, slot, page, off);
        if ((res = qsa__matvec(m, &a->k, x, kt)) != QSA_OK) goto done;
        if ((res = qsa__matvec(m, &a->v, x, vt)) != QSA_OK) goto done;
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
            if ((res = qsa__matvec(m, &a->idx_qk, x, it)) != QSA_OK) goto done;
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
        for (int h = 0; h < nh; h++) {
            const float *qh = qt + (size_t)h * 2 * hd, *gate = qh + hd;
            float *oh = att + (size_t)h * hd;
            qsa__attn_head_plan(pool, slot, &plan, qh, h / grp, hd, oh, acc);
            for (int d = 0; d < hd; d++) oh[d] *= qsa__sigmoid(gate[d]);
        }
        if (sq->cap && sq->cap->layer == l &&
            (res = qsa__capture_query(sq->cap, pos, qt, nh * hd * 2, sel, ns, topk, &plan, att, nh * hd)) != QSA_OK)
            goto done;
        if ((res = qsa__matvec(m, &a->o, att, out + (size_t)t * H)) != QSA_OK) goto done;
    }
done:
    qsa__free(qg); qsa__free(iq); qsa__free(att); qsa__free(acc); qsa__free(scores); qsa__free(sel); qsa__free(ikeys);
    qsa__free(plan.seg);
    return res;
}

/* MoE on one token: softmax router in fp32, top-k (ties: lower expert id), optional renormalisation,
   SwiGLU experts, plus the shared expert scaled by sigmoid(shared_expert_gate(x)). */
QSA_PRIV qsa_result qsa__moe_fwd(const qsa_model *m, const qsa__moe_w *w, const float *x, float *out, float *margin) {
    const qsa_model_config *c = &m->cfg;
    int H = c->hidden_size, E = c->num_experts, K = c->num_experts_per_tok, I = c->moe_intermediate_size,
        Is = c->shared_expert_intermediate_size;
    int mi = I > Is ? I : Is;
    float *logits = QSA__ALLOC(float, E), *a = QSA__ALLOC(float, mi), *b = QSA__ALLOC(float, mi), *y = QSA__ALLOC(float, H);
    int *top = QSA__ALLOC(int, K);
    float *topw = QSA__ALLOC(float, K);
    qsa_result r = QSA_OK;
    if (!logits || !a || !b || !y || !top || !topw) { r = qsa__fail(QSA_ERR_OUT_OF_MEMORY, "MoE: out of memory"); goto done; }
    if ((r = qsa__matvec(m, &w->router, x, logits)) != QSA_OK) goto done;
    float mx, sum;
    mx = -INFINITY;
    sum = 0.0f;
    for (int e = 0; e < E; e++) mx = logits[e] > mx ? logits[e] : mx;
    for (int e = 0; e < E; e++) { logits[e] = expf(logits[e] - mx); sum += logits[e]; }
    for (int e = 0; e < E; e++) logits[e] /= sum;
    for (int k = 0; k < K; k++) {
        int best = -1;
        for (int e = 0; e < E; e++) {
            int used = 0;
            for (int j = 0; j < k; j++) used |= top[j] == e;
            if (!used && (best < 0 || logits[e] > logits[best])) best = e;
        }
        top[k] = best;
        topw[k] = logits[best];
    }
    if (margin) { /* routing margin: the last chosen probability minus the best one left out */
        float next = 0.0f;
        for (int e = 0; e < E; e++) {
            int used = 0;
            for (int j = 0; j < K; j++) used |= top[j] == e;
            if (!used && logits[e] > next) next = logits[e];
        }
        *margin = K < E ? topw[K - 1] - next : INFINITY;
    }
    if (c->norm_topk_prob) {
        float s = 0.0f;
        for (int k = 0; k < K; k++) s += topw[k];
        for (int k = 0; k < K; k++) topw[k] /= s;
    }
    for (int j = 0; j < H; j++) out[j] = 0.0f;
    /* experts in ascending id order, as the reference accumulates them */
    for (int e = 0; e < E; e++) {
        int k = -1;
        for (int j = 0; j < K; j++) if (top[j] == e) k = j;
        if (k < 0) continue;
        if ((r = qsa__matvec(m, &w->gate[e], x, a)) != QSA_OK) goto done;
        if ((r = qsa__matvec(m, &w->up[e], x, b)) != QSA_OK) goto done;
        for (int i = 0; i < I; i++) a[i] = qsa__act(c->hidden_act, a[i]) * b[i];
        if ((r = qsa__matvec(m, &w->down[e], a, y)) != QSA_OK) goto done;
        for (int j = 0; j < H; j++) out[j] += y[j] * topw[k];
    }
    if ((r = qsa__matvec(m, &w->sh_gate, x, a)) != QSA_OK) goto done;
    if ((r = qsa__matvec(m, &w->sh_up, x, b)) != QSA_OK) goto done;
    for (int i = 0; i < Is; i++) a[i] = qsa__act(c->hidden_act, a[i]) * b[i];
    if ((r = qsa__matvec(m, &w->sh_down, a, y)) != QSA_OK) goto done;
    float gl;
    if ((r = qsa__matvec(m, &w->sh_expert_gate, x, &gl)) != QSA_OK) goto done;
    gl = qsa__sigmoid(gl);
    for (int j = 0; j < H; j++) out[j] += gl * y[j];
done:
    qsa__free(logits); qsa__free(a); qsa__free(b); qsa__free(y); qsa__free(top); qsa__free(topw);
    return r;
}

QSA_PRIV qsa_result qsa__seq_feed(qsa_seq *sq, const int32_t *ids, int n, float *logits, int all_logits) {
    qsa_model *m = sq->m;
    const qsa_model_config *c = &m->cfg;
    int H = c->hidden_size, hc = c->hc_count, hcH = hc * H, V = c->vocab_size;
    if (n <= 0) return QSA_OK;
    if (sq->pos + n > sq->n_ctx)
        return qsa__fail(QSA_ERR_CONTEXT_FULL, "qsa_seq_feed: %d + %d tokens exceed the context of %d", sq->pos, n, sq->n_ctx);
    for (int t = 0; t < n; t++)
        if (ids[t] < 0 || ids[t] >= V)
            return qsa__fail(QSA_ERR_INVALID_ARGUMENT, "qsa_seq_feed: token %d at index %d is outside the vocabulary [0, %d)", ids[t], t, V);
    QSA__TRY(qsa__seq_reserve(sq, sq->pos + n));
#ifndef QSA_NO_CUDA
    if (m->cuda) {
        for (int t0 = 0; t0 < n;) {
            int k = n - t0 < m->params.max_chunk ? n - t0 : m->params.max_chunk;
            float *lg = !logits ? NULL : all_logits ? logits + (size_t)t0 * V : (t0 + k == n ? logits : NULL);
            float *hid = sq->hidden_out;
            if (hid) sq->hidden_out = hid + (size_t)t0 * H;
            qsa_result r = qsa__cuda_chunk(sq, ids + t0, k, lg, all_logits);
            sq->hidden_out = hid;
            if (r != QSA_OK) return r;
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
    sc.xn = QSA__ALLOC(float, hcH);
    sc.mw = QSA__ALLOC(float, hcH);
    sc.low = QSA__ALLOC(float, c->hc_lowrank);
    sc.inj = QSA__ALLOC(float, (size_t)n * hc);
    sc.inp = QSA__ALLOC(float, (size_t)n * H);
    sc.out = QSA__ALLOC(float, (size_t)n * H);
    qsa_result r = QSA_OK;
    if (!X || !sc.xn || !sc.mw || !sc.low || !sc.inj || !sc.inp || !sc.out) { r = qsa__fail(QSA_ERR_OUT_OF_MEMORY, "qsa_seq_feed: out of memory"); goto done; }
    /* embedding, repeated into hc streams */
    for (int t = 0; t < n; t++)
        for (int s = 0; s < hc; s++) memcpy(X + (size_t)t * hcH + s * H, m->embed + (size_t)ids[t] * H, sizeof(float) * H);
    for (int l = 0; l < c->num_hidden_layers; l++) {
        const qsa__layer_w *lw = &m->layers[l];
        if (lw->ple && (r = qsa__ple_fwd(sq, l, ids, n, X, &sc)) != QSA_OK) goto done;
        for (int t = 0; t < n; t++)
            if ((r = qsa__gres_fwd(m, &lw->attn_hc, X + (size_t)t * hcH, sc.inp + (size_t)t * H, sc.inj + t * hc, &sc)) != QSA_OK) goto done;
        r = lw->type == QSA_LAYER_LINEAR ? qsa__gdn_fwd(sq, l, sc.inp, sc.out, n) : qsa__attn_fwd(sq, l, sc.inp, sc.out, n);
        if (r != QSA_OK) goto done;
        for (int t = 0; t < n; t++) qsa__inject(c, X + (size_t)t * hcH, sc.inj + t * hc, sc.out + (size_t)t * H);
        for (int t = 0; t < n; t++) {
            float *x = X + (size_t)t * hcH;
            if ((r = qsa__gres_fwd(m, &lw->mlp_hc, x, sc.inp, sc.inj, &sc)) != QSA_OK) goto done;
            float margin = INFINITY;
            if ((r = qsa__moe_fwd(m, &lw->moe, sc.inp, sc.out, &margin)) != QSA_OK) goto done;
            if (sq->route_hook) sq->route_hook(sq->sel_user, l, sq->pos + t, margin);
            qsa__inject(c, x, sc.inj, sc.out);
        }
    }
    /* final mixer and lm_head */
    for (int t = 0; t < n; t++) {
        if ((r = qsa__gres_fwd(m, &m->final_hc, X + (size_t)t * hcH, sc.inp, NULL, &sc)) != QSA_OK) goto done;
        if (sq->hidden_out) memcpy(sq->hidden_out + (size_t)t * H, sc.inp, sizeof(float) * H);
        if (logits && (all_logits || t == n - 1))
            if ((r = qsa__matvec(m, &m->lm_head, sc.inp, logits + (all_logits ? (size_t)t * V : 0))) != QSA_OK) goto done;
    }
    memcpy(sq->tokens + sq->pos, ids, sizeof(int32_t) * (size_t)n);
    sq->pos += n;
done:
    qsa__free(X); qsa__free(sc.xn); qsa__free(sc.mw); qsa__free(sc.low); qsa__free(sc.inj); qsa__free(sc.inp); qsa__free(sc.out);
    return r;
}

QSA_IMPL qsa_result qsa_seq_feed(qsa_seq *seq, const int32_t *ids, int n, float *logits, int all_logits) {
    if (!seq || (!ids && n > 0) || n < 0) return qsa__fail(QSA_ERR_INVALID_ARGUMENT, "qsa_seq_feed: bad arguments");
    return qsa__seq_feed(seq, ids, n, logits, all_logits);
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
    int cap;
    int32_t *idx;
    float *prob;
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
    qsa_sampler *s = QSA__CALLOC(qsa_sampler, 1);
    if (!s) return qsa__fail(QSA_ERR_OUT_OF_MEMORY, "qsa_sampler_create: out of memory");
    if (params) s->p = *params;
    qsa_sampling_params p = s->p;
    if (p.temperature < 0 || p.top_p < 0 || p.top_p > 1 || p.min_p < 0 || p.min_p > 1 || p.repetition_penalty < 0 ||
        p.top_k < 0) {
        qsa__free(s);
        return qsa__fail(QSA_ERR_INVALID_ARGUMENT,
                         "qsa_sampler_create: temperature %g, top_k %d, top_p %g, min_p %g, repetition_penalty %g: "
                         "expected temperature >= 0, top_k >= 0, top_p and min_p in [0, 1], penalty >= 0",
                         p.temperature, p.top_k, p.top_p, p.min_p, p.repetition_penalty);
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
    qsa__free(s);
}

QSA_PRIV int32_t qsa__argmax(const float *x, int n) {
    int32_t best = 0;
    for (int i = 1; i < n; i++) if (x[i] > x[best]) best = i;
    return best;
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
QSA_PRIV void qsa__cand_sort(const float *l, int32_t *v, int n) {
    /* max-heap on "after" ordering, so popping gives descending order at the front */
    for (int i = n / 2 - 1; i >= 0; i--) qsa__cand_sift(l, v, i, n);
    for (int e = n - 1; e > 0; e--) {
        int32_t t = v[0]; v[0] = v[e]; v[e] = t;
        qsa__cand_sift(l, v, 0, e);
    }
}

QSA_IMPL int32_t qsa_sampler_sample(qsa_sampler *s, float *logits, int vocab, const int32_t *hist, int n_hist) {
    const qsa_sampling_params *p = &s->p;
    if (p->repetition_penalty > 0 && p->repetition_penalty != 1.0f && hist) {
        int from = p->penalty_last_n < 0 || p->penalty_last_n > n_hist ? 0 : n_hist - p->penalty_last_n;
        for (int i = from; i < n_hist; i++) {
            int32_t t = hist[i];
            int seen = 0;
            for (int j = from; j < i; j++) seen |= hist[j] == t;
            if (seen || t < 0 || t >= vocab) continue;
            logits[t] = logits[t] > 0 ? logits[t] / p->repetition_penalty : logits[t] * p->repetition_penalty;
        }
    }
    if (p->temperature <= 0.0f) return qsa__argmax(logits, vocab);
    if (s->cap < vocab) {
        int32_t *idx = (int32_t *)qsa__realloc(s->idx, sizeof(int32_t) * (size_t)vocab);
        if (idx) s->idx = idx;
        float *prob = (float *)qsa__realloc(s->prob, sizeof(float) * (size_t)vocab);
        if (prob) s->prob = prob;
        if (!idx || !prob) return qsa__argmax(logits, vocab); /* cannot sample: degrade to greedy */
        s->cap = vocab;
    }
    for (int i = 0; i < vocab; i++) logits[i] /= p->temperature;
    int n = vocab;
    for (int i = 0; i < vocab; i++) s->idx[i] = i;
    qsa__cand_sort(logits, s->idx, n);
    if (p->top_k > 0 && p->top_k < n) n = p->top_k;
    double sum = 0.0, mx = logits[s->idx[0]];
    for (int i = 0; i < n; i++) { s->prob[i] = (float)exp(logits[s->idx[i]] - mx); sum += s->prob[i]; }
    for (int i = 0; i < n; i++) s->prob[i] = (float)(s->prob[i] / sum);
    if (p->top_p > 0.0f && p->top_p < 1.0f) {
        double c = 0.0;
        for (int i = 0; i < n; i++) { c += s->prob[i]; if (c >= p->top_p) { n = i + 1; break; } }
    }
    if (p->min_p > 0.0f) {
        float lim = p->min_p * s->prob[0];
        int k = 1;
        while (k < n && s->prob[k] >= lim) k++;
        n = k;
    }
    sum = 0.0;
    for (int i = 0; i < n; i++) sum += s->prob[i];
    double u = qsa__rng_uniform(s->s) * sum, c = 0.0;
    for (int i = 0; i < n; i++) {
        c += s->prob[i];
        if (u < c) return s->idx[i];
    }
    return s->idx[n - 1];
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

QSA_IMPL qsa_result qsa_generate(qsa_seq *seq, const int32_t *prompt, int n_prompt, const qsa_generate_params *gp,
                                 qsa_generation *out) {
    if (!seq || !out || (n_prompt > 0 && !prompt) || n_prompt < 0)
        return qsa__fail(QSA_ERR_INVALID_ARGUMENT, "qsa_generate: NULL or negative argument");
    memset(out, 0, sizeof *out);
    qsa_generate_params p;
    memset(&p, 0, sizeof p);
    if (gp) p = *gp;
    qsa_model *m = seq->m;
    const qsa_tokenizer *tok = m->tok;
    int V = m->cfg.vocab_size;
    const int32_t *eos = p.eos_ids;
    int n_eos = p.n_eos_ids;
    if (!eos) {
        if (m->gen.n_eos) { eos = m->gen.eos_token_ids; n_eos = m->gen.n_eos; }
        else { eos = m->cfg.eos_token_ids; n_eos = m->cfg.n_eos; }
    }
    int room = seq->n_ctx - seq->pos - n_prompt;
    if (room < 1)
        return qsa__fail(QSA_ERR_CONTEXT_FULL, "qsa_generate: prompt of %d tokens at position %d leaves no room in the context of %d",
                         n_prompt, seq->pos, seq->n_ctx);
    if (n_prompt == 0 && seq->pos == 0)
        return qsa__fail(QSA_ERR_INVALID_ARGUMENT, "qsa_generate: empty prompt on an empty sequence");
    int max_new = p.max_tokens > 0 && p.max_tokens < room + 1 ? p.max_tokens : room + 1;
    qsa_sampler *smp = NULL;
    QSA__TRY(qsa_sampler_create(&p.sampling, &smp));
    float *logits = QSA__ALLOC(float, V);
    out->tokens = QSA__ALLOC(int32_t, max_new);
    qsa__buf text;
    memset(&text, 0, sizeof text);
    qsa_detok_stream ds;
    memset(&ds, 0, sizeof ds);
    if (tok) qsa_detok_stream_init(&ds, tok, QSA_DETOK_SKIP_SPECIAL);
    size_t emitted = 0;
    qsa_result r = QSA_OK;
    if (!logits || !out->tokens || !qsa__buf_reserve(&text, 64)) { r = qsa__fail(QSA_ERR_OUT_OF_MEMORY, "qsa_generate: out of memory"); goto done; }
    double t0, t_first;
    t0 = t_first = qsa__now();
    if (n_prompt > 0) r = qsa_seq_feed(seq, prompt, n_prompt, logits, 0);
    else r = qsa__fail(QSA_ERR_INVALID_ARGUMENT, "qsa_generate: a prompt of at least one token is needed for logits");
    if (r != QSA_OK) goto done;
    out->stats.n_prompt = n_prompt;
    out->stats.prefill_s = qsa__now() - t0;
    for (;;) {
        int32_t t = qsa_sampler_sample(smp, logits, V, seq->tokens, seq->pos);
        out->tokens[out->n_tokens++] = t;
        double now = qsa__now();
        if (out->n_tokens == 1) { t_first = now; out->stats.ttft_s = now - t0; }
        out->stats.decode_s = now - t_first;
        int is_eos = 0;
        for (int i = 0; i < n_eos; i++) is_eos |= eos[i] == t;
        if (is_eos && !p.ignore_eos) { out->stop = QSA_STOP_EOS; break; }
        if (tok) {
            const char *piece;
            size_t plen;
            if ((r = qsa_detok_stream_push(&ds, t, &piece, &plen)) != QSA_OK) goto done;
            if (!qsa__buf_put(&text, piece, plen)) { r = qsa__fail(QSA_ERR_OUT_OF_MEMORY, "qsa_generate: out of memory"); goto done; }
        }
        /* stop strings: cut the text at the earliest match */
        int stopped = 0;
        for (int i = 0; i < p.n_stop_strings && !stopped; i++) {
            const char *hit = p.stop_strings[i][0] ? strstr(text.data, p.stop_strings[i]) : NULL;
            if (hit) { text.len = (size_t)(hit - text.data); text.data[text.len] = 0; stopped = 1; }
        }
        size_t hold = stopped ? 0 : qsa__stop_holdback(text.data, text.len, p.stop_strings, p.n_stop_strings);
        size_t upto = text.len > hold ? text.len - hold : 0;
        if (p.on_token && upto >= emitted) {
            if (p.on_token(p.user, t, text.data + emitted, upto - emitted)) { emitted = upto; out->stop = QSA_STOP_CALLBACK; break; }
            emitted = upto;
        }
        if (stopped) { out->stop = QSA_STOP_STRING; break; }
        if (out->n_tokens >= max_new) { out->stop = QSA_STOP_MAX_TOKENS; break; }
        if ((r = qsa_seq_feed(seq, &t, 1, logits, 0)) != QSA_OK) goto done;
    }
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
done:
    if (tok) qsa_detok_stream_free(&ds);
    qsa__buf_free(&text);
    qsa__free(logits);
    qsa_sampler_free(smp);
    if (r != QSA_OK) qsa_generation_free(out);
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
    if (!s || layer < 0 || layer >= s->m->cfg.num_hidden_layers || s->m->cfg.layer_types[layer] != QSA_LAYER_QSA)
        return qsa__fail(QSA_ERR_INVALID_ARGUMENT, "qsa_seq_capture_begin: layer %d is not a QSA layer", layer);
    if (s->cuda) return qsa__fail(QSA_ERR_UNSUPPORTED, "qsa_seq_capture_begin: capture runs on the CPU backend");
    qsa__capture_free(s);
    s->cap = QSA__CALLOC(qsa__capture, 1);
    if (!s->cap) return qsa__fail(QSA_ERR_OUT_OF_MEMORY, "capture: out of memory");
    s->cap->layer = layer;
    return QSA_OK;
}

QSA_IMPL qsa_result qsa_seq_capture_end(qsa_seq *s, const char *path) {
    if (!s || !s->cap || !path) return qsa__fail(QSA_ERR_INVALID_ARGUMENT, "qsa_seq_capture_end: no capture in progress");
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
    qsa_result r = QSA_OK;
    if (!k || !v || !qsa__buf_put(&cp->seg_off, &end, 4)) r = qsa__fail(QSA_ERR_OUT_OF_MEMORY, "capture: out of memory");
    if (r == QSA_OK) {
        for (int i = 0; i < np; i++) {
            memcpy(k + i * page_vals, qsa__pool_k(pl, slot, s->bt[i], 0), sizeof(float) * page_vals);
            memcpy(v + i * page_vals, qsa__pool_v(pl, slot, s->bt[i], 0), sizeof(float) * page_vals);
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
    qsa__capture_free(s);
    return r;
}

QSA_IMPL qsa_result qsa_replay_capture(const char *path, qsa_replay_mode mode, qsa_replay_report *rep) {
    if (!path || !rep) return qsa__fail(QSA_ERR_INVALID_ARGUMENT, "qsa_replay_capture: NULL argument");
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
    int ps = (int)meta[1], nh = (int)meta[2], nkv = (int)meta[3], hd = (int)meta[4], rr = (int)meta[5], topk = (int)meta[6];
    int n = (int)meta[7], np = (int)meta[8], kvd = (int)meta[9];
    /* every tensor must have the size the meta data implies */
    size_t want[11] = {sizeof meta, (size_t)n * 8, (size_t)n * 2 * nh * hd * 4, (size_t)n * topk * 4, (size_t)n * 4,
                       (size_t)n * nh * hd * 4, 0, (size_t)(n + 1) * 4, (size_t)np * 4, (size_t)np * ps * kvd * 4,
                       (size_t)np * ps * kvd * 4};
    if (ps < 1 || nh < 1 || nkv < 1 || hd < 1 || rr < 1 || topk < 0 || n < 0 || np < 0 || kvd != nkv * hd || nh % nkv)
        r = qsa__fail(QSA_ERR_FORMAT, "%s: inconsistent meta data", path);
    for (int i = 0; i < 11 && r == QSA_OK; i++)
        if (i != 6 && T[i]->nbytes != want[i])
            r = qsa__fail(QSA_ERR_SHAPE, "%s: tensor '%s' has %zu bytes, expected %zu", path, names[i], T[i]->nbytes, want[i]);
    qsa__pool pool;
    memset(&pool, 0, sizeof pool);
    int32_t *bt = NULL, *offs = NULL, *sel = NULL, *nsel = NULL;
    float *acc = NULL, *o = NULL, *qh = NULL, *want_out = NULL;
    qsa__plan plan;
    memset(&plan, 0, sizeof plan);
    if (r == QSA_OK) {
        bt = QSA__ALLOC(int32_t, np + 1);
        offs = QSA__ALLOC(int32_t, n + 1);
        sel = QSA__ALLOC(int32_t, (size_t)n * topk + 1);
        nsel = QSA__ALLOC(int32_t, n + 1);
        acc = QSA__ALLOC(float, hd);
        o = QSA__ALLOC(float, hd);
        qh = QSA__ALLOC(float, 2 * hd);
        want_out = QSA__ALLOC(float, hd);
        if (!bt || !offs || !sel || !nsel || !acc || !o || !qh || !want_out) r = qsa__fail(QSA_ERR_OUT_OF_MEMORY, "replay: out of memory");
    }
    if (r == QSA_OK) {
        memcpy(bt, T[8]->data, (size_t)np * 4);
        memcpy(offs, T[7]->data, (size_t)(n + 1) * 4);
        memcpy(sel, T[3]->data, (size_t)n * topk * 4);
        memcpy(nsel, T[4]->data, (size_t)n * 4);
        /* a pool holding the captured pages at their captured physical places */
        for (int i = 0; i < np; i++) {
            if (bt[i] < 0 || bt[i] > (1 << 24)) { r = qsa__fail(QSA_ERR_FORMAT, "%s: bad page id %d", path, bt[i]); break; }
            if (bt[i] + 1 > pool.n_pages) pool.n_pages = bt[i] + 1;
        }
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
                if (sg.page < 0 || sg.page >= pool.n_pages || sg.offset < 0 || sg.len < 0 || sg.offset + sg.len > ps) {
                    r = qsa__fail(QSA_ERR_FORMAT, "%s: plan segment %d out of range", path, i);
                    break;
                }
                if (!qsa__plan_push(&plan, sg.page, sg.offset, sg.len, sg.logical)) r = qsa__fail(QSA_ERR_OUT_OF_MEMORY, "replay: out of memory");
            }
        } else {
            int nb = (int)((pos + 1) / rr), ns = nsel[t];
            if (ns < 0 || ns > topk || (pos + 1 + ps - 1) / ps > np) { r = qsa__fail(QSA_ERR_FORMAT, "%s: query %d does not fit the capture", path, t); break; }
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
    qsa__free(bt); qsa__free(offs); qsa__free(sel); qsa__free(nsel); qsa__free(acc); qsa__free(o);
    qsa__free(qh); qsa__free(want_out);
    qsa__st_close(&st);
    return r;
}
