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

/* ---- UTF-8 ---------------------------------------------------------------------------------- */

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
    /* canonical ordering: stable insertion sort of every run of non-starters by class */
    for (size_t i = 1; ok && i < m; i++) {
        unsigned ki = qsa__uni_ccc_of(c[i]);
        if (!ki) continue;
        uint32_t x = c[i];
        size_t j = i;
        while (j > 0) {
            unsigned kj = qsa__uni_ccc_of(c[j - 1]);
            if (kj == 0 || kj <= ki) break;
            c[j] = c[j - 1];
            j--;
        }
        c[j] = x;
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
            if (a) { /* same content again: the later flags win */
                id = a->id;
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
            a->special = (uint8_t)qsa__json_flag(e, "special");
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
        qsa_result r = qsa_token_to_piece(t, ids[i], &p, &pl);
        if (r != QSA_OK) {
            qsa__buf_free(&raw);
            return qsa__fail(r, "qsa_detokenize: ids[%zu] = %d is not a token (vocabulary has %d ids)", i, ids[i], t->n_ids);
        }
        if ((flags & QSA_DETOK_SKIP_SPECIAL) && (t->flags[ids[i]] & QSA__TOK_SPECIAL)) continue;
        if (!qsa__buf_put(&raw, p, pl)) { qsa__buf_free(&raw); return qsa__fail(QSA_ERR_OUT_OF_MEMORY, "qsa_detokenize: out of memory"); }
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
    s->tok = tok;
    s->flags = flags;
    s->n_pending = 0;
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
    QSA__TRY(qsa_token_to_piece(s->tok, id, &p, &pl));
    if ((s->flags & QSA_DETOK_SKIP_SPECIAL) && (s->tok->flags[id] & QSA__TOK_SPECIAL)) pl = 0;
    size_t np = (size_t)s->n_pending, tot = np + pl;
    if (!qsa__detok_reserve(s, 4 * tot + 8))
        return qsa__fail(QSA_ERR_OUT_OF_MEMORY, "qsa_detok_stream_push: out of memory");
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
