/* tokenize.c - text <-> token ids with the qsa_runtime tokenizer (like llama.cpp's llama-tokenize).
 *
 *   tools/tokenize (--model DIR | --tokenizer FILE) [--text STRING | --text-file FILE] [--no-special]
 *   tools/tokenize (--model DIR | --tokenizer FILE) --decode [--skip-special] [--text JSON | --text-file FILE]
 *
 * Encoding prints the ids as one JSON array on stdout.  The text is taken verbatim (raw bytes, no
 * newline added) from --text, --text-file or stdin.  --no-special treats special tokens such as
 * <|im_start|> as plain text.  --model reads only DIR/tokenizer.json and DIR/tokenizer_config.json.
 * --decode reads ids (a JSON array, or integers separated by spaces, commas or newlines) and prints
 * the decoded text exactly (no newline added).
 * Errors go to stderr and the exit status is 1.
 */
#define QSA_RUNTIME_IMPLEMENTATION
#include "../qsa_runtime.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../examples/cli.h"

static void usage(FILE *f) {
    fprintf(f, "usage: tokenize (--model DIR | --tokenizer FILE) [--text STRING | --text-file FILE] [--no-special]\n"
               "       tokenize (--model DIR | --tokenizer FILE) --decode [--skip-special] [--text JSON | --text-file FILE]\n"
               "  Encodes text (stdin by default) to a JSON array of ids, or decodes such an array to text.\n"
               "  --no-special    do not match special tokens (<|im_start|> ...) in the text\n"
               "  --skip-special  leave special tokens out of decoded text\n"
               "  -v              log loading details to stderr\n");
}

static int die(const char *what) {
    fprintf(stderr, "tokenize: %s\n", what);
    return 1;
}

static int read_stream(FILE *f, char **out, size_t *len) {
    size_t cap = 1 << 16, n = 0;
    char *buf = (char *)malloc(cap);
    if (!buf) return 0;
    for (;;) {
        if (n + 1 >= cap) { /* (one byte kept for the terminating 0: the id parser's strtol stops there) */
            char *nb = (char *)realloc(buf, cap *= 2);
            if (!nb) { free(buf); return 0; }
            buf = nb;
        }
        size_t k = fread(buf + n, 1, cap - n - 1, f);
        n += k;
        if (k == 0) break;
    }
    if (ferror(f)) { free(buf); return 0; }
    buf[n] = 0;
    *out = buf;
    *len = n;
    return 1;
}

int main(int argc, char **argv) {
    cli_check_stdout("tokenize");
    const char *model = NULL, *tokfile = NULL, *text = NULL, *text_file = NULL;
    int parse_special = 1, decode = 0, skip_special = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int has = i + 1 < argc;
        if (!strcmp(a, "--model") && has) model = argv[++i];
        else if (!strcmp(a, "--tokenizer") && has) tokfile = argv[++i];
        else if (!strcmp(a, "--text") && has) text = argv[++i];
        else if (!strcmp(a, "--text-file") && has) text_file = argv[++i];
        else if (!strcmp(a, "--no-special")) parse_special = 0;
        else if (!strcmp(a, "--decode")) decode = 1;
        else if (!strcmp(a, "--skip-special")) skip_special = 1;
        else if (!strcmp(a, "-v")) qsa_set_logger(qsa_log_stderr, NULL, QSA_LOG_DEBUG);
        else if (!strcmp(a, "-h") || !strcmp(a, "--help")) { usage(stdout); return 0; }
        else { fprintf(stderr, "tokenize: unknown or incomplete argument '%s'\n", a); usage(stderr); return 1; }
    }
    if (!model == !tokfile) { usage(stderr); return die("give exactly one of --model DIR and --tokenizer FILE"); }
    if (text && text_file) return die("give at most one of --text and --text-file");

    qsa_tokenizer *tok = NULL;
    qsa_result r = model ? qsa_tokenizer_load_dir(model, &tok) : qsa_tokenizer_load(tokfile, &tok);
    if (r != QSA_OK) return die(qsa_last_error());

    char *buf = NULL;
    size_t len = 0;
    if (text) {
        len = strlen(text);
        buf = (char *)malloc(len + 1);
        if (buf) memcpy(buf, text, len + 1);
    } else if (text_file) {
        FILE *f = fopen(text_file, "rb");
        if (!f) { fprintf(stderr, "tokenize: cannot open '%s'\n", text_file); qsa_tokenizer_free(tok); return 1; }
        int ok = read_stream(f, &buf, &len);
        fclose(f);
        if (!ok) buf = NULL;
    } else if (!read_stream(stdin, &buf, &len)) {
        buf = NULL;
    }
    if (!buf) { qsa_tokenizer_free(tok); return die("cannot read the input"); }

    int status = 0;
    if (!decode) {
        int32_t *ids = NULL;
        size_t n = 0;
        r = qsa_tokenize(tok, buf, len, parse_special, &ids, &n);
        if (r != QSA_OK) status = die(qsa_last_error());
        else {
            putchar('[');
            for (size_t i = 0; i < n; i++) printf(i ? ", %d" : "%d", ids[i]);
            printf("]\n");
        }
        qsa_free(ids);
    } else {
        /* a JSON array of ids, or plain integers separated by spaces/commas/newlines */
        const char *p = buf, *end = buf + len;
        while (p < end && (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r')) p++;
        int32_t *ids = NULL;
        size_t n = 0, cap = 0;
        qsa__json_doc doc;
        memset(&doc, 0, sizeof doc);
        if (p < end && *p == '[') {
            r = qsa__json_parse(buf, len, text_file ? text_file : text ? "--text" : "stdin", &doc);
            if (r != QSA_OK) status = die(qsa_last_error());
            else if (!doc.root || doc.root->type != QSA__JSON_ARRAY) status = die("--decode expects a JSON array of token ids");
            else {
                cap = doc.root->count ? doc.root->count : 1;
                ids = (int32_t *)malloc(sizeof(int32_t) * cap);
                if (!ids) status = die("out of memory");
                for (const qsa__json *e = doc.root->child; e && ids; e = e->next, n++) {
                    if (e->type != QSA__JSON_NUMBER || !e->is_int || e->i64 < INT32_MIN || e->i64 > INT32_MAX) {
                        fprintf(stderr, "tokenize: element %zu of the id array is not an integer id\n", n);
                        status = 1;
                        break;
                    }
                    ids[n] = (int32_t)e->i64;
                }
            }
        } else {
            while (!status) {
                while (p < end && (*p == ' ' || *p == ',' || *p == '\t' || *p == '\n' || *p == '\r')) p++;
                if (p >= end) break;
                char *q;
                long v = strtol(p, &q, 10);
                if (q == p || q > end || v < INT32_MIN || v > INT32_MAX) {
                    fprintf(stderr, "tokenize: --decode input is not a list of integer ids (at byte %zu)\n", (size_t)(p - buf));
                    status = 1;
                    break;
                }
                if (n == cap) {
                    int32_t *ni = (int32_t *)realloc(ids, sizeof(int32_t) * (cap = cap ? 2 * cap : 64));
                    if (!ni) { status = die("out of memory"); break; }
                    ids = ni;
                }
                ids[n++] = (int32_t)v;
                p = q;
            }
        }
        if (!status) {
            char *out = NULL;
            size_t olen = 0;
            r = qsa_detokenize(tok, ids, n, skip_special ? QSA_DETOK_SKIP_SPECIAL : 0, &out, &olen);
            if (r != QSA_OK) status = die(qsa_last_error());
            else fwrite(out, 1, olen, stdout);
            qsa_free(out);
        }
        free(ids);
        qsa__json_free(&doc);
    }
    free(buf);
    qsa_tokenizer_free(tok);
    return status;
}
