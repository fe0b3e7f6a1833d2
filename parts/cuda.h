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
    X(embed) X(rmsnorm) X(gres_mix) X(silu_scale) X(inj_weights) X(inject) X(to_f16) X(argmax)           \
    X(gemm_f16) X(gemm_nvfp4) X(router_topk) X(moe_plan) X(moe_gate_up) X(moe_down) X(moe_combine)       \
    X(shared_combine) X(act_mul)                                                                         \
    X(ple_gate) X(ple_conv) X(gdn_conv) X(gdn_conv_state) X(gdn_gates) X(gdn_recurrent)                  \
    X(gdn_recurrent_f16state) X(gdn_norm_gate) X(attn_qk_prep) X(indexer_prep) X(block_keys)             \
    X(block_scores) X(topk_blocks) X(attn_phys_order) X(sparse_attn)

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

/* A linear map on the device: FP16 [out][in] or NVFP4 (q [out][in/2], s [out][in/16], s2). */
typedef struct qsa__dlin {
    int out, in;
    CUdeviceptr w16, q, s, bias;
    float s2;
} qsa__dlin;

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

/* Scratch for one chunk of up to max_tokens tokens. */
typedef struct qsa__dscratch {
    int max_tokens;
    CUdeviceptr ids, X, xn, xn16, low, low16, mw, inp, inp16, inj, out;
    CUdeviceptr big[6];         /* mixer / MoE / PLE temporaries, each sized for the largest use */
    CUdeviceptr big16[3];
    CUdeviceptr sel, nsel, scores, logits, argmax, tokpos;
    int moe_tokens;             /* tokens per MoE sub-chunk */
    CUdeviceptr moe_pairs, moe_tiles, moe_ntiles, moe_h16, moe_y;
    size_t big_bytes, scores_bytes;
    int max_blocks, score_rows, logit_rows;
    float *host_e;              /* PLE rows gathered on the host [max_tokens][ple_embed_dim] */
} qsa__dscratch;

typedef struct qsa__cuda {
    int ordinal, cc;
    CUdevice dev;
    CUcontext ctx;
    CUstream stream;
    CUmodule mod;
    CUfunction k[QSA__K_COUNT];
    char arch[32];
    double jit_seconds;         /* compile (or cache load) time of the module */
    int jit_from_cache;
    size_t bytes_weights, bytes_kv, bytes_state, bytes_scratch;
    CUdeviceptr embed16, rope_inv_freq;
    qsa__dlin lm_head;
    qsa__dgres final_hc;
    qsa__dlayer *layers;
    /* KV pool on the device: per QSA slot [n_pages][page_size][kvd] fp16 and [..][ihd] fp32 */
    CUdeviceptr kpool, vpool, ipool;
    qsa__dscratch sc;
    CUdeviceptr *allocs;        /* everything allocated, freed at unload */
    int n_allocs, cap_allocs;
} qsa__cuda;

/* Per-sequence device state. */
typedef struct qsa__cuda_seq {
    CUdeviceptr mem;                           /* one allocation holding everything below */
    size_t mem_bytes;
    CUdeviceptr *conv, *S, *ple_conv, *bkeys; /* per layer (0 where unused) */
    CUdeviceptr bt;                            /* block table copy [n_ctx / page_size + 1] */
    int bt_synced;                             /* pages already copied */
} qsa__cuda_seq;

QSA_PRIV qsa_result qsa__dalloc(qsa__cuda *g, CUdeviceptr *p, size_t bytes, size_t *counter, const char *what) {
    *p = 0;
    if (bytes == 0) bytes = 16;
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

QSA_PRIV qsa_result qsa__dupload(qsa__cuda *g, CUdeviceptr *p, const void *src, size_t bytes, const char *what) {
    QSA__TRY(qsa__dalloc(g, p, bytes, &g->bytes_weights, what));
    if (bytes) QSA__CU(qsa__cu.cuMemcpyHtoD_v2(*p, src, bytes));
    return QSA_OK;
}

/* ---- the kernel module: NVRTC at first use, cached on disk ---- */

/* FNV-1a 64 over several byte strings. */
QSA_PRIV uint64_t qsa__fnv(uint64_t h, const void *p, size_t n) {
    const uint8_t *b = (const uint8_t *)p;
    for (size_t i = 0; i < n; i++) { h ^= b[i]; h *= 0x100000001b3ull; }
    return h;
}

/* Cache directory: $QSA_CACHE_DIR, else $XDG_CACHE_HOME/qsa_runtime, else ~/.cache/qsa_runtime. */
QSA_PRIV int qsa__cache_dir(char *out, size_t cap) {
    const char *d = getenv("QSA_CACHE_DIR");
    if (d && !strcmp(d, "off")) return 0;
    if (d && d[0]) snprintf(out, cap, "%s", d);
    else if ((d = getenv("XDG_CACHE_HOME")) && d[0]) snprintf(out, cap, "%s/qsa_runtime", d);
    else if ((d = getenv("HOME")) && d[0]) snprintf(out, cap, "%s/.cache/qsa_runtime", d);
    else return 0;
    char tmp[1024];
    snprintf(tmp, sizeof tmp, "%s", out);
    for (char *p = tmp + 1; *p; p++)
        if (*p == '/') { *p = 0; mkdir(tmp, 0755); *p = '/'; }
    mkdir(tmp, 0755);
    return 1;
}

/* Cache file layout: "QSAK" magic, u64 key, u64 image length, image, u64 FNV of the image.  A file
   that is short, has another key or a bad checksum is a miss (and gets rewritten). */
QSA_PRIV char *qsa__cache_read(const char *path, uint64_t key, size_t *len) {
    qsa__map m;
    if (qsa__map_file(path, &m) != QSA_OK) { qsa_clear_error(); return NULL; }
    char *img = NULL;
    uint64_t k, n, sum;
    if (m.size >= 28 && !memcmp(m.data, "QSAK", 4)) {
        memcpy(&k, m.data + 4, 8);
        memcpy(&n, m.data + 12, 8);
        if (k == key && n <= m.size - 28) {
            memcpy(&sum, m.data + 20 + n, 8);
            if (sum == qsa__fnv(0xcbf29ce484222325ull, m.data + 20, (size_t)n) && (img = QSA__ALLOC(char, (size_t)n + 1))) {
                memcpy(img, m.data + 20, (size_t)n);
                img[n] = 0;
                *len = (size_t)n;
            }
        }
    }
    qsa__unmap(&m);
    return img;
}

QSA_PRIV void qsa__cache_write(const char *path, uint64_t key, const char *img, size_t len) {
    char tmp[1200];
    snprintf(tmp, sizeof tmp, "%.1100s.%ld.tmp", path, (long)getpid());
    FILE *f = fopen(tmp, "wb");
    if (!f) return;
    uint64_t n = len, sum = qsa__fnv(0xcbf29ce484222325ull, img, len);
    int ok = fwrite("QSAK", 1, 4, f) == 4 && fwrite(&key, 8, 1, f) == 1 && fwrite(&n, 8, 1, f) == 1 &&
             fwrite(img, 1, len, f) == len && fwrite(&sum, 8, 1, f) == 1;
    if (fclose(f) != 0) ok = 0;
    if (!ok || rename(tmp, path) != 0) remove(tmp); /* rename: readers see the old file or the new, never half */
}

QSA_PRIV qsa_result qsa__cuda_module(qsa__cuda *g, const char *want_arch) {
    QSA__TRY(qsa__nvrtc_load());
    char *src = qsa__kernels_source();
    if (!src) return qsa__fail(QSA_ERR_OUT_OF_MEMORY, "kernels: out of memory");
    char arch[32];
    qsa_result r = qsa__nvrtc_pick_arch(want_arch, g->cc, arch, sizeof arch);
    if (r != QSA_OK) { qsa__free(src); return r; }
    snprintf(g->arch, sizeof g->arch, "%s", arch);
    static const char *const opts[] = {"--std=c++14", "-default-device", "--use_fast_math=false"};
    int nopts = 2;
    /* key: source, options, NVRTC version, arch, driver version, library version */
    uint64_t key = qsa__fnv(0xcbf29ce484222325ull, src, strlen(src));
    for (int i = 0; i < nopts; i++) key = qsa__fnv(key, opts[i], strlen(opts[i]) + 1);
    int ver[3] = {qsa__nvrtc.major * 100 + qsa__nvrtc.minor, qsa__cu.driver_version, QSA_VERSION_MAJOR * 10000 + QSA_VERSION_MINOR * 100 + QSA_VERSION_PATCH};
    key = qsa__fnv(key, ver, sizeof ver);
    key = qsa__fnv(key, arch, strlen(arch) + 1);
    char dir[1024], path[1100];
    int use_cache = qsa__cache_dir(dir, sizeof dir);
    if (use_cache) snprintf(path, sizeof path, "%s/kernels-%016llx.%s", dir, (unsigned long long)key, strncmp(arch, "sm_", 3) ? "ptx" : "cubin");
    double t0 = qsa__now();
    size_t len = 0;
    char *img = use_cache ? qsa__cache_read(path, key, &len) : NULL;
    g->jit_from_cache = img != NULL;
    if (!img) {
        r = qsa__nvrtc_compile(src, "kernels.cu", opts, nopts, arch, &img, &len, NULL);
        if (r == QSA_OK && use_cache) qsa__cache_write(path, key, img, len);
    }
    qsa__free(src);
    if (r != QSA_OK) return r;
    r = QSA__CU_R(qsa__cu.cuModuleLoadData(&g->mod, img));
    qsa__free(img);
    if (r != QSA_OK) return r;
    g->jit_seconds = qsa__now() - t0;
    qsa__log(QSA_LOG_INFO, "kernels: %s for %s in %.3f s (%s)", g->jit_from_cache ? "loaded from the disk cache" : "compiled",
             arch, g->jit_seconds, use_cache ? path : "cache off");
    for (int i = 0; i < QSA__K_COUNT; i++) {
        CUresult cr = qsa__cu.cuModuleGetFunction(&g->k[i], g->mod, qsa__kernel_names[i]);
        if (cr != 0) return qsa__fail(QSA_ERR_CUDA, "kernels: entry point %s not found in the module", qsa__kernel_names[i]);
    }
    return QSA_OK;
}

/* Launch helper: grid (gx, gy), block bx, dynamic shared memory sh. */
#define QSA__LAUNCH(g, id, gx, gy, bx, sh, ...)                                                              \
    do {                                                                                                   \
        void *qsa__args_[] = {__VA_ARGS__};                                                                \
        QSA__TRY(qsa__cu_launch((g)->k[QSA__K_##id], "qsa_k_" #id, (unsigned)(gx), (unsigned)(gy), 1,      \
                                (unsigned)(bx), 1, 1, (unsigned)(sh), (g)->stream, qsa__args_));             \
    } while (0)

/* ---- weights ---- */

QSA_PRIV qsa_result qsa__dvec(qsa__cuda *g, CUdeviceptr *p, const float *v, size_t n, const char *what) {
    return qsa__dupload(g, p, v, n * sizeof(float), what);
}

/* Host fp32 weights -> device FP16 (counting values beyond the FP16 range). */
QSA_PRIV qsa_result qsa__dlin_up(qsa__cuda *g, qsa__dlin *d, const qsa__lin *l, const char *what) {
    memset(d, 0, sizeof *d);
    d->out = l->out;
    d->in = l->in;
    if (l->bias) QSA__TRY(qsa__dvec(g, &d->bias, l->bias, (size_t)l->out, what));
    if (!l->w) {
        d->s2 = l->qscale2;
        QSA__TRY(qsa__dupload(g, &d->q, l->q, (size_t)l->out * (size_t)(l->in / 2), what));
        return qsa__dupload(g, &d->s, l->qscale, (size_t)l->out * (size_t)(l->in / 16), what);
    }
    size_t n = (size_t)l->out * (size_t)l->in, over = 0;
    uint16_t *h = QSA__ALLOC(uint16_t, n);
    if (!h) return qsa__fail(QSA_ERR_OUT_OF_MEMORY, "%s: out of host memory", what);
    for (size_t i = 0; i < n; i++) {
        h[i] = qsa__f32_to_f16(l->w[i]);
        if ((h[i] & 0x7c00) == 0x7c00 && isfinite(l->w[i])) over++;
    }
    if (over) qsa__log(QSA_LOG_WARN, "%s: %zu of %zu values overflow FP16 (become inf)", what, over, n);
    qsa_result r = qsa__dupload(g, &d->w16, h, n * 2, what);
    qsa__free(h);
    return r;
}

QSA_PRIV qsa_result qsa__dgres_up(qsa__cuda *g, qsa__dgres *d, const qsa__gres *w, int hcH) {
    QSA__TRY(qsa__dvec(g, &d->norm_w, w->norm_w, (size_t)hcH, "hc_norm"));
    QSA__TRY(qsa__dlin_up(g, &d->down, &w->down, "input_mix_weight_down"));
    QSA__TRY(qsa__dlin_up(g, &d->up, &w->up, "input_mix_weight_up"));
    if (w->inject.out) QSA__TRY(qsa__dlin_up(g, &d->inject, &w->inject, "block_inject_weight"));
    return QSA_OK;
}

QSA_PRIV qsa_result qsa__cuda_upload(qsa_model *m, qsa__cuda *g) {
    const qsa_model_config *c = &m->cfg;
    int H = c->hidden_size, hcH = c->hc_count * H;
    qsa__lin emb = qsa__lin_rows(m->embed, 0, c->vocab_size, H);
    qsa__dlin demb;
    QSA__TRY(qsa__dlin_up(g, &demb, &emb, "embed_tokens"));
    g->embed16 = demb.w16;
    QSA__TRY(qsa__dlin_up(g, &g->lm_head, &m->lm_head, "lm_head"));
    QSA__TRY(qsa__dgres_up(g, &g->final_hc, &m->final_hc, hcH));
    QSA__TRY(qsa__dvec(g, &g->rope_inv_freq, m->rope_inv_freq, (size_t)(c->rotary_dim / 2 + 1), "rope"));
    g->layers = QSA__CALLOC(qsa__dlayer, c->num_hidden_layers);
    if (!g->layers) return qsa__fail(QSA_ERR_OUT_OF_MEMORY, "cuda: out of host memory");
    for (int l = 0; l < c->num_hidden_layers; l++) {
        const qsa__layer_w *w = &m->layers[l];
        qsa__dlayer *d = &g->layers[l];
        QSA__TRY(qsa__dgres_up(g, &d->attn_hc, &w->attn_hc, hcH));
        QSA__TRY(qsa__dgres_up(g, &d->mlp_hc, &w->mlp_hc, hcH));
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
        d->experts_nvfp4 = mw->gate[0].w == NULL;
        for (int e = 0; e < c->num_experts; e++) {
            qsa__dlin gt, up, dn;
            qsa_result r = qsa__dlin_up(g, &gt, &mw->gate[e], "experts.gate_proj");
            if (r == QSA_OK) r = qsa__dlin_up(g, &up, &mw->up[e], "experts.up_proj");
            if (r == QSA_OK) r = qsa__dlin_up(g, &dn, &mw->down[e], "experts.down_proj");
            if (r == QSA_OK && (gt.w16 == 0) != d->experts_nvfp4)
                r = qsa__fail(QSA_ERR_UNSUPPORTED, "layer %d: experts mix NVFP4 and dense weights", l);
            if (r != QSA_OK) { qsa__free(ex); return r; }
            ex[e].gate_q = gt.q; ex[e].gate_s = gt.s; ex[e].gate_s2 = gt.s2; ex[e].gate16 = gt.w16;
            ex[e].up_q = up.q; ex[e].up_s = up.s; ex[e].up_s2 = up.s2; ex[e].up16 = up.w16;
            ex[e].down_q = dn.q; ex[e].down_s = dn.s; ex[e].down_s2 = dn.s2; ex[e].down16 = dn.w16;
        }
        qsa_result r = qsa__dupload(g, &d->experts, ex, sizeof(qsa__dexpert) * (size_t)c->num_experts, "expert table");
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

/* Scratch sized for chunks of `max_tokens`. */
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
    QSA__TRY(qsa__dalloc(g, &s->argmax, (size_t)T * 4, cnt, "scratch"));
    /* MoE pair scratch for sub-chunks of at most 256 tokens */
    s->moe_tokens = T < 256 ? T : 256;
    {
        size_t MK = (size_t)s->moe_tokens * c->num_experts_per_tok;
        size_t tiles = (MK + 15) / 16 + ((size_t)c->num_experts < MK ? (size_t)c->num_experts : MK);
        QSA__TRY(qsa__dalloc(g, &s->moe_pairs, MK * 4, cnt, "MoE scratch"));
        QSA__TRY(qsa__dalloc(g, &s->moe_tiles, tiles * 3 * 4, cnt, "MoE scratch"));
        QSA__TRY(qsa__dalloc(g, &s->moe_ntiles, 4, cnt, "MoE scratch"));
        QSA__TRY(qsa__dalloc(g, &s->moe_h16, MK * c->moe_intermediate_size * 2, cnt, "MoE scratch"));
        QSA__TRY(qsa__dalloc(g, &s->moe_y, MK * c->hidden_size * 4, cnt, "MoE scratch"));
    }
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
    if (g->mod) qsa__cu.cuModuleUnload(g->mod);
    if (g->stream) qsa__cu.cuStreamDestroy_v2(g->stream);
    if (g->ctx) qsa__cu.cuDevicePrimaryCtxRelease_v2(g->dev);
    qsa__free(g);
}

/* Bring up the backend for a loaded (CPU-side) model. */
QSA_PRIV qsa_result qsa__cuda_init(qsa_model *m, qsa__cuda **out) {
    *out = NULL;
    QSA__TRY(qsa__cuda_load());
    if (qsa__cu.device_count <= 0) return qsa__fail(QSA_ERR_NO_DEVICE, "cuda: no CUDA device");
    qsa__cuda *g = QSA__CALLOC(qsa__cuda, 1);
    if (!g) return qsa__fail(QSA_ERR_OUT_OF_MEMORY, "cuda: out of host memory");
    qsa_result r = QSA_OK;
    g->ordinal = m->params.device;
    qsa__gpu_info info;
#define QSA__G(expr) do { if ((r = (expr)) != QSA_OK) goto fail; } while (0)
    QSA__G(qsa__cu_device_info(g->ordinal, &info));
    g->cc = info.cc_major * 10 + info.cc_minor;
    QSA__G(QSA__CU_R(qsa__cu.cuDeviceGet(&g->dev, g->ordinal)));
    QSA__G(QSA__CU_R(qsa__cu.cuDevicePrimaryCtxRetain(&g->ctx, g->dev)));
    QSA__G(QSA__CU_R(qsa__cu.cuCtxSetCurrent(g->ctx)));
    QSA__G(QSA__CU_R(qsa__cu.cuStreamCreate(&g->stream, QSA__CU_STREAM_NON_BLOCKING)));
    QSA__G(qsa__cuda_module(g, m->params.arch));
    QSA__G(qsa__cuda_upload(m, g));
    {
        const qsa__pool *p = &m->pool;
        size_t slots = (size_t)p->n_qsa * p->n_pages * p->page_size;
        QSA__G(qsa__dalloc(g, &g->kpool, slots * p->kvd * 2, &g->bytes_kv, "KV pool (K)"));
        QSA__G(qsa__dalloc(g, &g->vpool, slots * p->kvd * 2, &g->bytes_kv, "KV pool (V)"));
        QSA__G(qsa__dalloc(g, &g->ipool, slots * p->ihd * 4, &g->bytes_kv, "KV pool (indexer keys)"));
    }
    QSA__G(qsa__cuda_scratch(m, g, m->params.max_chunk));
    /* the uploads ran on the legacy stream (pageable copies may still be in flight when they return),
       which the backend's non-blocking stream does not wait for: finish them before any kernel */
    QSA__G(QSA__CU_R(qsa__cu.cuCtxSynchronize()));
#undef QSA__G
    qsa__log(QSA_LOG_INFO, "cuda: %s (cc %d.%d), memory: weights %.1f MiB, KV pool %.1f MiB, scratch %.1f MiB", info.name,
             info.cc_major, info.cc_minor, g->bytes_weights / 1048576.0, g->bytes_kv / 1048576.0, g->bytes_scratch / 1048576.0);
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
    size_t total = bt_b;
    for (int l = 0; l < L; l++) {
        if (c->layer_types[l] == QSA_LAYER_LINEAR) total += conv_b + S_b;
        else total += bk_b;
        if (m->layers[l].ple) total += ple_b;
    }
    qsa_result r = QSA_OK;
    CUdeviceptr base = 0;
    if ((r = QSA__CU_R(qsa__cu.cuCtxSetCurrent(g->ctx))) == QSA_OK && qsa__cu.cuMemAlloc_v2(&base, total) != 0)
        r = qsa__fail(QSA_ERR_OUT_OF_MEMORY, "sequence: %zu bytes of GPU state (n_ctx %d) do not fit", total, s->n_ctx);
    if (r != QSA_OK) { qsa__cuda_seq_free(cs); return r; }
    cs->mem = base;
    cs->mem_bytes = total;
    size_t off = 0;
#define QSA__CARVE(dst, b) do { (dst) = base + off; off += ((b) + 255) & ~(size_t)255; } while (0)
    QSA__CARVE(cs->bt, bt_b);
    for (int l = 0; l < L; l++) {
        if (c->layer_types[l] == QSA_LAYER_LINEAR) { QSA__CARVE(cs->conv[l], conv_b); QSA__CARVE(cs->S[l], S_b); }
        else QSA__CARVE(cs->bkeys[l], bk_b);
        if (m->layers[l].ple) QSA__CARVE(cs->ple_conv[l], ple_b);
    }
#undef QSA__CARVE
    (void)off;
    g->bytes_state += total;
    s->cuda = cs;
    return qsa__cuda_seq_reset(m, s);
}

QSA_PRIV qsa_result qsa__cuda_seq_reset(qsa_model *m, qsa_seq *s) {
    qsa__cuda_seq *cs = s->cuda;
    QSA__CU(qsa__cu.cuCtxSetCurrent(m->cuda->ctx));
    /* on the backend's stream: a plain cuMemset runs on the legacy stream, which a non-blocking
       stream does not wait for, so the first kernels could race with the zeroing */
    QSA__CU(qsa__cu.cuMemsetD8Async(cs->mem, 0, cs->mem_bytes, m->cuda->stream));
    cs->bt_synced = 0;
    return QSA_OK;
}

QSA_PRIV void qsa__cuda_seq_destroy(qsa_model *m, qsa_seq *s) {
    qsa__cuda_seq *cs = s->cuda;
    if (!cs) return;
    qsa__cu.cuCtxSetCurrent(m->cuda->ctx);
    qsa__cu.cuStreamSynchronize(m->cuda->stream); /* no kernel may still use the memory */
    qsa__cu.cuMemFree_v2(cs->mem);
    m->cuda->bytes_state -= cs->mem_bytes;
    qsa__cuda_seq_free(cs);
    s->cuda = NULL;
}

/* ---- forward ---- */

/* Y[M][out] (+)= A16[M][in] W^T (+ bias) */
QSA_PRIV qsa_result qsa__dgemm(qsa__cuda *g, CUdeviceptr A16, int M, const qsa__dlin *w, CUdeviceptr Y, int accumulate) {
    int N = w->out, K = w->in;
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
    return QSA_OK;
}

/* GatedResidual on X [M][hcH]: inp/inp16 [M][H] and (when inj != 0) injection weights [M][hc]. */
QSA_PRIV qsa_result qsa__cuda_gres(qsa_model *m, const qsa__dgres *w, CUdeviceptr X, int M, int with_inj) {
    const qsa_model_config *c = &m->cfg;
    qsa__cuda *g = m->cuda;
    qsa__dscratch *s = &g->sc;
    int H = c->hidden_size, hc = c->hc_count, hcH = hc * H, one = 1, n;
    float eps = c->rms_norm_eps, scale = 1.0f / (float)hc;
    CUdeviceptr nw = w->norm_w;
    QSA__LAUNCH(g, rmsnorm, M * hc, 1, 256, 0, &X, &nw, &s->xn, &s->xn16, &hcH, &H, &eps, &one);
    QSA__TRY(qsa__dgemm(g, s->xn16, M, &w->down, s->low, 0));
    n = M * c->hc_lowrank;
    QSA__LAUNCH(g, silu_scale, (n + 255) / 256, 1, 256, 0, &s->low, &s->low16, &n, &scale);
    QSA__TRY(qsa__dgemm(g, s->low16, M, &w->up, s->mw, 0));
    QSA__LAUNCH(g, gres_mix, M, 1, 256, 0, &s->mw, &s->xn, &s->inp, &s->inp16, &H, &hc);
    if (with_inj) {
        QSA__TRY(qsa__dgemm(g, s->xn16, M, &w->inject, s->inj, 0));
        n = M * hc;
        QSA__LAUNCH(g, inj_weights, (n + 255) / 256, 1, 256, 0, &s->inj, &n, &hc);
    }
    return QSA_OK;
}

QSA_PRIV qsa_result qsa__cuda_inject(qsa_model *m, CUdeviceptr X, int M) {
    qsa__cuda *g = m->cuda;
    int H = m->cfg.hidden_size, hc = m->cfg.hc_count;
    QSA__LAUNCH(g, inject, M, 1, 256, 0, &X, &g->sc.inj, &g->sc.out, &H, &hc);
    return QSA_OK;
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
        qsa__ple_embed(c, p, hist, s->host_e + (size_t)t * D);
    }
    for (int j = 0; j < ctx; j++) sl->ple_ids[j] = M - ctx + j >= 0 ? ids[M - ctx + j] : sl->ple_ids[M + j];
    CUdeviceptr e = s->big[0], e16 = s->big16[0], keyp = s->big[1], valp = s->big[2], gv = s->big[3], gvn = s->big[4];
    int n = M * D;
    QSA__CU(qsa__cu.cuMemcpyHtoDAsync_v2(e, s->host_e, (size_t)n * 4, g->stream));
    QSA__LAUNCH(g, to_f16, (n + 255) / 256, 1, 256, 0, &e, &e16, &n);
    QSA__TRY(qsa__dgemm(g, e16, M, &d->ple_key, keyp, 0));
    QSA__TRY(qsa__dgemm(g, e16, M, &d->ple_value, valp, 0));
    CUdeviceptr nk = d->ple_nk, nq = d->ple_nq, nc = d->ple_nc, cw = d->ple_conv_w, st = sq->cuda->ple_conv[l], X = s->X;
    QSA__LAUNCH(g, ple_gate, M, 1, 256, 0, &keyp, &X, &valp, &nk, &nq, &nc, &gv, &gvn, &H, &hc, &eps);
    QSA__LAUNCH(g, ple_conv, (hcH + 255) / 256, 1, 256, 0, &X, &gv, &gvn, &st, &cw, &M, &hcH, &Kc, &dil);
    return QSA_OK;
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
    CUdeviceptr b = s->out, a = s->mw, beta = s->low, gg = s->xn; /* small [M][nv] temporaries */
    if ((size_t)M * nv * 4 > (size_t)M * c->hc_lowrank * 4)
        return qsa__fail(QSA_ERR_UNSUPPORTED, "GDN: %d value heads exceed the scratch sized by hc_lowrank %d", nv, c->hc_lowrank);
    QSA__TRY(qsa__dgemm(g, s->inp16, M, &d->in_qkv, qkv, 0));
    QSA__TRY(qsa__dgemm(g, s->inp16, M, &d->in_z, z, 0));
    QSA__TRY(qsa__dgemm(g, s->inp16, M, &d->in_b, b, 0));
    QSA__TRY(qsa__dgemm(g, s->inp16, M, &d->in_a, a, 0));
    int n = M * nv;
    CUdeviceptr Al = d->A_log, dtb = d->dt_bias;
    QSA__LAUNCH(g, gdn_gates, (n + 255) / 256, 1, 256, 0, &b, &a, &Al, &dtb, &beta, &gg, &n, &nv);
    CUdeviceptr cst = sq->cuda->conv[l], cw = d->conv_w;
    QSA__LAUNCH(g, gdn_conv, M, 1, 256, 0, &qkv, &cst, &cw, &q, &k, &v, &M, &conv_dim, &key_dim, &Kc, &act, &nk, &dk);
    QSA__LAUNCH(g, gdn_conv_state, (conv_dim + 255) / 256, 1, 256, 0, &qkv, &cst, &M, &conv_dim, &Kc);
    /* one warp per 32 state columns of a value head, its slice of S in shared memory */
    CUdeviceptr S = sq->cuda->S[l];
    unsigned ny = (unsigned)((dv + 31) / 32), smem = (unsigned)(4 * dk * 32);
    if (m->params.gdn_state_f16)
        QSA__LAUNCH(g, gdn_recurrent_f16state, nv, ny, 32, smem, &S, &q, &k, &v, &beta, &gg, &o, &M, &nk, &nv, &dk, &dv);
    else
        QSA__LAUNCH(g, gdn_recurrent, nv, ny, 32, smem, &S, &q, &k, &v, &beta, &gg, &o, &M, &nk, &nv, &dk, &dv);
    CUdeviceptr nw = d->gnorm_w, o16 = s->big16[0];
    QSA__LAUNCH(g, gdn_norm_gate, M * nv, 1, 128, 0, &o, &z, &nw, &o16, &nv, &dv, &eps, &gact);
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
    QSA__TRY(qsa__dgemm(g, s->inp16, M, &d->q, qg, 0));
    QSA__TRY(qsa__dgemm(g, s->inp16, M, &d->k, kin, 0));
    QSA__TRY(qsa__dgemm(g, s->inp16, M, &d->v, vin, 0));
    QSA__LAUNCH(g, attn_qk_prep, M, 1, 128, 0, &qg, &kin, &vin, &qn, &kn, &inv, &bt, &Kp, &Vp, &pos0, &M, &nh, &nkv, &hd, &rd, &ps, &eps);
    if (has_qsa) {
        CUdeviceptr qln = d->idx_q_norm, kln = d->idx_k_norm, bk = sq->cuda->bkeys[l];
        QSA__TRY(qsa__dgemm(g, s->inp16, M, &d->idx_qk, iq, 0));
        QSA__LAUNCH(g, indexer_prep, M, 1, 128, 0, &iq, &qln, &inv, &bt, &Ip, &pos0, &M, &ih, &ihd, &rd, &ps, &eps);
        /* keys of the blocks completed by this chunk */
        int b0 = sl->n_blocks, b1 = (pos0 + M) / r;
        if (b1 > b0) QSA__LAUNCH(g, block_keys, b1 - b0, 1, 128, 0, &Ip, &bt, &kln, &inv, &bk, &b0, &b1, &r, &ihd, &rd, &ps, &eps);
        sl->n_blocks = b1;
        /* scores and top-k for groups of queries (bounded scores buffer) */
        for (int t0 = 0; t0 < M; t0 += s->score_rows) {
            int mq = M - t0 < s->score_rows ? M - t0 : s->score_rows, p = pos0 + t0, ld = s->max_blocks;
            CUdeviceptr iqt = iq + (size_t)t0 * (ih + 1) * ihd * 4, selt = s->sel + (size_t)t0 * topk * 4, nst = s->nsel + (size_t)t0 * 4;
            int maxb = (p + mq) / r;
            if (maxb > 0) QSA__LAUNCH(g, block_scores, mq, (maxb + 255) / 256, 256, 0, &iqt, &bk, &s->scores, &p, &mq, &ih, &ihd, &r, &ld);
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
    QSA__LAUNCH(g, sparse_attn, M, nh, 256, 0, &qg, &Kp, &Vp, &bt, &s->sel, &s->nsel, &att, &att16, &pos0, &M, &nh, &nkv, &hd, &r,
                &topk, &ps, &split, &tokpos, &ld_tok);
    return qsa__dgemm(g, att16, M, &d->o, s->out, 0);
}

/* MoE: router, grouped expert GEMMs over (token, slot) pairs, combine in ascending expert id, then
   the shared expert.  Run over sub-chunks of moe_tokens tokens to bound the [M*K][H] scratch;
   a token's bits do not depend on its sub-chunk. */
QSA_PRIV qsa_result qsa__cuda_moe(qsa_model *m, int l, int M) {
    const qsa_model_config *c = &m->cfg;
    qsa__cuda *g = m->cuda;
    qsa__dscratch *s = &g->sc;
    const qsa__dlayer *d = &g->layers[l];
    int H = c->hidden_size, E = c->num_experts, K = c->num_experts_per_tok, I = c->moe_intermediate_size;
    int Is = c->shared_expert_intermediate_size, norm = c->norm_topk_prob, act = c->hidden_act == QSA_ACT_SIGMOID, n;
    CUdeviceptr rl = s->big[0], tw = s->big[1], tid = s->big[2], sa = s->big[3], sb = s->big[4], sh = s->big[5],
                sa16 = s->big16[1], gl = s->low, ex = d->experts;
    QSA__TRY(qsa__dgemm(g, s->inp16, M, &d->router, rl, 0));
    QSA__LAUNCH(g, router_topk, M, 1, 256, 0, &rl, &tid, &tw, &E, &K, &norm);
    for (int t0 = 0; t0 < M; t0 += s->moe_tokens) {
        int mt = M - t0 < s->moe_tokens ? M - t0 : s->moe_tokens, MK = mt * K;
        int max_tiles = (MK + 15) / 16 + (E < MK ? E : MK);
        CUdeviceptr x16 = s->inp16 + (size_t)t0 * H * 2, ids = tid + (size_t)t0 * K * 4, w = tw + (size_t)t0 * K * 4;
        CUdeviceptr outp = s->out + (size_t)t0 * H * 4;
        QSA__LAUNCH(g, moe_plan, 1, 1, 1024, 0, &ids, &MK, &E, &s->moe_pairs, &s->moe_tiles, &s->moe_ntiles);
        QSA__LAUNCH(g, moe_gate_up, max_tiles, (I + 15) / 16, 256, 0, &x16, &s->moe_pairs, &s->moe_tiles, &s->moe_ntiles, &ex,
                    &s->moe_h16, &H, &I, &K, &act);
        QSA__LAUNCH(g, moe_down, max_tiles, (H + 15) / 16, 256, 0, &s->moe_h16, &s->moe_pairs, &s->moe_tiles, &s->moe_ntiles,
                    &ex, &s->moe_y, &H, &I);
        QSA__LAUNCH(g, moe_combine, mt, 1, 256, 0, &s->moe_y, &w, &outp, &H, &K);
    }
    QSA__TRY(qsa__dgemm(g, s->inp16, M, &d->sh_gate, sa, 0));
    QSA__TRY(qsa__dgemm(g, s->inp16, M, &d->sh_up, sb, 0));
    n = M * Is;
    QSA__LAUNCH(g, act_mul, (n + 255) / 256, 1, 256, 0, &sa, &sb, &sa16, &n, &act);
    QSA__TRY(qsa__dgemm(g, sa16, M, &d->sh_down, sh, 0));
    QSA__TRY(qsa__dgemm(g, s->inp16, M, &d->sh_expert_gate, gl, 0));
    QSA__LAUNCH(g, shared_combine, M, 1, 256, 0, &s->out, &sh, &gl, &H);
    return QSA_OK;
}

/* One chunk of M <= max_chunk tokens through the whole model. */
QSA_PRIV qsa_result qsa__cuda_chunk(qsa_seq *sq, const int32_t *ids, int M, float *logits, int all_logits) {
    qsa_model *m = sq->m;
    const qsa_model_config *c = &m->cfg;
    qsa__cuda *g = m->cuda;
    qsa__dscratch *s = &g->sc;
    int H = c->hidden_size, hc = c->hc_count, V = c->vocab_size;
    /* block table: pages acquired since the last chunk */
    if (sq->n_pages > sq->cuda->bt_synced) {
        QSA__CU(qsa__cu.cuMemcpyHtoDAsync_v2(sq->cuda->bt + (size_t)sq->cuda->bt_synced * 4, sq->bt + sq->cuda->bt_synced,
                                             (size_t)(sq->n_pages - sq->cuda->bt_synced) * 4, g->stream));
        sq->cuda->bt_synced = sq->n_pages;
    }
    QSA__CU(qsa__cu.cuMemcpyHtoDAsync_v2(s->ids, ids, (size_t)M * 4, g->stream));
    CUdeviceptr table = g->embed16;
    QSA__LAUNCH(g, embed, M, 1, 256, 0, &table, &s->ids, &s->X, &H, &hc, &V);
    for (int l = 0; l < c->num_hidden_layers; l++) {
        if (m->layers[l].ple) QSA__TRY(qsa__cuda_ple(sq, l, ids, M));
        QSA__TRY(qsa__cuda_gres(m, &g->layers[l].attn_hc, s->X, M, 1));
        if (c->layer_types[l] == QSA_LAYER_LINEAR) QSA__TRY(qsa__cuda_gdn(sq, l, M));
        else QSA__TRY(qsa__cuda_attn(sq, l, M));
        QSA__TRY(qsa__cuda_inject(m, s->X, M));
        QSA__TRY(qsa__cuda_gres(m, &g->layers[l].mlp_hc, s->X, M, 1));
        QSA__TRY(qsa__cuda_moe(m, l, M));
        QSA__TRY(qsa__cuda_inject(m, s->X, M));
    }
    QSA__TRY(qsa__cuda_gres(m, &g->final_hc, s->X, M, 0));
    if (sq->hidden_out) QSA__CU(qsa__cu.cuMemcpyDtoHAsync_v2(sq->hidden_out, s->inp, (size_t)M * H * 4, g->stream));
    if (logits) {
        int first = all_logits ? 0 : M - 1;
        for (int t0 = first; t0 < M; t0 += s->logit_rows) {
            int rows = M - t0 < s->logit_rows ? M - t0 : s->logit_rows;
            QSA__TRY(qsa__dgemm(g, s->inp16 + (size_t)t0 * H * 2, rows, &g->lm_head, s->logits, 0));
            float *dst = logits + (all_logits ? (size_t)t0 * V : 0);
            QSA__CU(qsa__cu.cuMemcpyDtoHAsync_v2(dst, s->logits, (size_t)rows * V * 4, g->stream));
            QSA__CU(qsa__cu.cuStreamSynchronize(g->stream)); /* the logits buffer is reused */
        }
    }
    QSA__CU(qsa__cu.cuStreamSynchronize(g->stream));
    return QSA_OK;
}

#endif /* QSA_NO_CUDA */
