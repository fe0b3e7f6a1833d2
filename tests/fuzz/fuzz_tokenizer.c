/* fuzz_tokenizer.c - libFuzzer harness for the tokenizer (encode, decode, streaming decode).
 *
 *   clang -g -O1 -fsanitize=fuzzer,address,undefined -o fuzz_tokenizer tests/fuzz/fuzz_tokenizer.c -lm -ldl -lpthread
 *   QSA_FUZZ_TOKENIZER=path/to/tokenizer.json ./fuzz_tokenizer -max_total_time=60 corpus/
 *
 * The tokenizer is loaded once from $QSA_FUZZ_TOKENIZER, else the Qwen3 tokenizer under
 * /work/shared/data, else tests/fixtures/qwen3-tokenizer/tokenizer.json; without one every input is
 * skipped.  Input byte 0 picks the mode; the rest is text (or ids).  Checks: tokenize succeeds on
 * valid UTF-8 and refuses invalid UTF-8; ids are in range; ASCII text round-trips through
 * detokenize (ASCII is NFC-invariant); the streaming detokenizer's output equals qsa_detokenize. */
#define QSA_RUNTIME_IMPLEMENTATION
#include "../../qsa_runtime.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FZ_ASSERT(c) do { if (!(c)) { fprintf(stderr, "invariant failed: %s (line %d): %s\n", #c, __LINE__, qsa_last_error()); abort(); } } while (0)

static qsa_tokenizer *fz_tok;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc; (void)argv;
    const char *cands[4];
    int n = 0;
    if (getenv("QSA_FUZZ_TOKENIZER")) cands[n++] = getenv("QSA_FUZZ_TOKENIZER");
    cands[n++] = "/work/shared/data/qwen3-tokenizer/tokenizer.json";
    cands[n++] = "tests/fixtures/qwen3-tokenizer/tokenizer.json";
    for (int i = 0; i < n && !fz_tok; i++) {
        if (!qsa__file_exists(cands[i])) continue;
        if (qsa_tokenizer_load(cands[i], &fz_tok) != QSA_OK) {
            fprintf(stderr, "fuzz_tokenizer: cannot load %s: %s\n", cands[i], qsa_last_error());
            abort();
        }
        fprintf(stderr, "fuzz_tokenizer: using %s\n", cands[i]);
    }
    if (!fz_tok) fprintf(stderr, "fuzz_tokenizer: no tokenizer.json (set QSA_FUZZ_TOKENIZER); every input is skipped\n");
    return 0;
}

static int fz_valid_utf8(const uint8_t *p, size_t n) {
    for (size_t i = 0; i < n;) {
        if (p[i] < 0x80) { i++; continue; }
        int k = qsa__utf8_valid_seq(p + i, p + n);
        if (!k) return 0;
        i += (size_t)k;
    }
    return 1;
}

/* streaming output of `ids` must equal qsa_detokenize */
static void fz_check_stream(const int32_t *ids, size_t n, int flags) {
    char *whole = NULL;
    size_t wlen = 0;
    FZ_ASSERT(qsa_detokenize(fz_tok, ids, n, flags, &whole, &wlen) == QSA_OK);
    qsa__buf acc;
    memset(&acc, 0, sizeof acc);
    qsa_detok_stream st;
    memset(&st, 0, sizeof st);
    qsa_detok_stream_init(&st, fz_tok, flags);
    for (size_t i = 0; i < n; i++) {
        const char *t = NULL;
        size_t tl = 0;
        FZ_ASSERT(qsa_detok_stream_push(&st, ids[i], &t, &tl) == QSA_OK);
        if (tl) qsa__buf_put(&acc, t, tl);
    }
    const char *t = NULL;
    size_t tl = 0;
    FZ_ASSERT(qsa_detok_stream_flush(&st, &t, &tl) == QSA_OK);
    if (tl) qsa__buf_put(&acc, t, tl);
    FZ_ASSERT(acc.len == wlen && (wlen == 0 || memcmp(acc.data, whole, wlen) == 0));
    FZ_ASSERT(fz_valid_utf8((const uint8_t *)whole, wlen));
    qsa_detok_stream_free(&st);
    qsa__buf_free(&acc);
    qsa_free(whole);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!fz_tok || size < 1) return 0;
    int mode = data[0] & 3;
    const uint8_t *p = data + 1;
    size_t n = size - 1;
    int32_t vocab = qsa_tokenizer_vocab_size(fz_tok);
    if (mode == 3) { /* arbitrary ids (2 bytes each, some out of range) through the decoders */
        size_t k = n / 2;
        int32_t *ids = (int32_t *)malloc((k ? k : 1) * sizeof(int32_t));
        int all_valid = 1;
        for (size_t i = 0; i < k; i++) {
            ids[i] = (int32_t)((p[2 * i] | (p[2 * i + 1] << 8)) * 4);
            if (ids[i] >= vocab) all_valid = 0;
        }
        if (all_valid) {
            fz_check_stream(ids, k, 0);
            fz_check_stream(ids, k, QSA_DETOK_SKIP_SPECIAL);
        } else {
            char *s = NULL;
            size_t sl = 0;
            if (qsa_detokenize(fz_tok, ids, k, 0, &s, &sl) == QSA_OK) qsa_free(s); /* must not crash */
        }
        free(ids);
        return 0;
    }
    int parse_special = mode & 1;
    int32_t *ids = NULL;
    size_t nids = 0;
    qsa_result r = qsa_tokenize(fz_tok, (const char *)p, n, parse_special, &ids, &nids);
    if (!fz_valid_utf8(p, n)) {
        FZ_ASSERT(r == QSA_ERR_INVALID_ARGUMENT);
        return 0;
    }
    FZ_ASSERT(r == QSA_OK);
    FZ_ASSERT(nids <= 4 * n); /* NFC may expand the text (U+0344 -> U+0308 U+0301) */
    for (size_t i = 0; i < nids; i++) FZ_ASSERT(ids[i] >= 0 && ids[i] < vocab);
    int ascii = 1;
    for (size_t i = 0; i < n; i++) if (p[i] >= 0x80 || p[i] == 0) ascii = 0;
    char *text = NULL;
    size_t tl = 0;
    FZ_ASSERT(qsa_detokenize(fz_tok, ids, nids, 0, &text, &tl) == QSA_OK);
    if (ascii) FZ_ASSERT(tl == n && memcmp(text, p, n) == 0);
    qsa_free(text);
    if (mode == 2) fz_check_stream(ids, nids, 0);
    qsa_free(ids);
    return 0;
}
