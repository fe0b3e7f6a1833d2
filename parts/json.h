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
    int64_t i64;         /* exact integer value when is_int */
    int is_int;          /* integral and exactly representable in int64 */
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

/* Length of the valid UTF-8 sequence at p (lead byte >= 0x80), 0 when invalid. */
QSA_PRIV int qsa__utf8_valid_seq(const unsigned char *p, const unsigned char *e) {
    unsigned c = p[0];
    if (c >= 0xc2 && c <= 0xdf) return (e - p >= 2 && (p[1] & 0xc0) == 0x80) ? 2 : 0;
    if (c >= 0xe0 && c <= 0xef) {
        if (e - p < 3 || (p[1] & 0xc0) != 0x80 || (p[2] & 0xc0) != 0x80) return 0;
        if (c == 0xe0 && p[1] < 0xa0) return 0;  /* overlong */
        if (c == 0xed && p[1] >= 0xa0) return 0; /* UTF-16 surrogate */
        return 3;
    }
    if (c >= 0xf0 && c <= 0xf4) {
        if (e - p < 4 || (p[1] & 0xc0) != 0x80 || (p[2] & 0xc0) != 0x80 || (p[3] & 0xc0) != 0x80) return 0;
        if (c == 0xf0 && p[1] < 0x90) return 0;  /* overlong */
        if (c == 0xf4 && p[1] >= 0x90) return 0; /* > U+10FFFF */
        return 4;
    }
    return 0; /* continuation byte, 0xc0/0xc1 overlong lead, 0xf5.. */
}

QSA_PRIV size_t qsa__utf8_put(char *d, uint32_t cp) {
    if (cp < 0x80) { d[0] = (char)cp; return 1; }
    if (cp < 0x800) { d[0] = (char)(0xc0 | (cp >> 6)); d[1] = (char)(0x80 | (cp & 0x3f)); return 2; }
    if (cp < 0x10000) {
        d[0] = (char)(0xe0 | (cp >> 12)); d[1] = (char)(0x80 | ((cp >> 6) & 0x3f)); d[2] = (char)(0x80 | (cp & 0x3f));
        return 3;
    }
    d[0] = (char)(0xf0 | (cp >> 18)); d[1] = (char)(0x80 | ((cp >> 12) & 0x3f));
    d[2] = (char)(0x80 | ((cp >> 6) & 0x3f)); d[3] = (char)(0x80 | (cp & 0x3f));
    return 4;
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
            d += qsa__utf8_put(d, cp);
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
