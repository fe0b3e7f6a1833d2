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
        return qsa__fail(QSA_ERR_SHAPE, "tensor '%s': expected dtype %s, found %s", t->name, qsa__dtype_name(dtype_or_minus1),
                         qsa__dtype_name(t->dtype));
    int ok = t->ndim == ndim;
    for (int i = 0; ok && i < ndim; i++)
        if (shape && shape[i] >= 0 && shape[i] != t->shape[i]) ok = 0;
    if (!ok) {
        int64_t want[8];
        for (int i = 0; i < ndim && i < 8; i++) want[i] = shape ? shape[i] : -1;
        return qsa__fail(QSA_ERR_SHAPE, "tensor '%s': expected shape %s (-1 = any), found %s", t->name,
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

/* BF16/F32/F16 -> FP16 into dst (numel elements); *n_overflow counts finite values that became inf. */
QSA_PRIV qsa_result qsa__tensor_to_f16(const qsa__tensor *t, uint16_t *dst, size_t *n_overflow) {
    size_t n = qsa__tensor_numel(t), over = 0;
    if (t->dtype == QSA__F16) {
        if (n) memcpy(dst, t->data, n * 2);
    } else if (t->dtype == QSA__BF16 || t->dtype == QSA__F32) {
        for (size_t i = 0; i < n; i++) {
            float f;
            if (t->dtype == QSA__BF16) { uint16_t h; memcpy(&h, t->data + 2 * i, 2); f = qsa__bf16_to_f32(h); }
            else memcpy(&f, t->data + 4 * i, 4);
            uint16_t h = qsa__f32_to_f16(f);
            if ((h & 0x7fff) == 0x7c00 && f == f && f - f == 0) over++; /* finite in, inf out */
            dst[i] = h;
        }
    } else {
        return qsa__fail(QSA_ERR_UNSUPPORTED, "tensor '%s': cannot convert %s to FP16", t->name, qsa__dtype_name(t->dtype));
    }
    if (n_overflow) *n_overflow = over;
    return QSA_OK;
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
