/* batch.c - offline batch generation through the qsa_runtime scheduler.
 *
 *   examples/batch [-m DIR] [options] PROMPTS.jsonl [--out FILE]
 *
 * PROMPTS.jsonl holds one JSON object per line:
 *   {"prompt": "raw text"}  or  {"messages": [{"role": "user", "content": "..."}, ...]}
 * with optional "id", "max_tokens", "temperature", "top_p", "top_k", "min_p", "repetition_penalty",
 * "seed", "stop": ["...", ...].  Messages go through the ChatML template (with the assistant prompt);
 * a "prompt" is raw text (special tokens such as <|im_start|> are recognised), or a user message
 * with --chat.  Blank lines are skipped.  All requests are submitted at once and served together
 * (continuous batching, chunked prefill); one JSON line per request is written, in input order:
 *   {"id": ..., "text": "...", "tokens": N, "stop": "eos|stop_string|max_tokens", "ttft_s": ...,
 *    "prefill_tok_s": ..., "decode_tok_s": ...}
 * or {"id": ..., "error": "...", "status": "refused|error"}; a summary goes to stderr.  Exit status:
 * 0 when every request completed, 3 when some were refused or failed, 1/2 on fatal/usage errors.
 */
#define QSA_RUNTIME_IMPLEMENTATION
#include "../qsa_runtime.h"

#include "cli.h"

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void usage(const char *argv0) {
    fprintf(stderr,
            "usage: %s [options] PROMPTS.jsonl\n"
            "  -m, --model DIR         model directory (default: models/tiny)\n"
            "  -f, --file FILE         prompts file (or give it as the last argument)\n"
            "  -o, --out FILE          write the results to FILE (default: stdout)\n"
            "  -n, --n-predict N       default max tokens per request (default: 128; 0: until EOS / context)\n"
            "      --max-batch N       requests running at once (default: 32)\n"
            "      --chunk N           prefill chunk in tokens (default: 8192)\n"
            "  -c, --ctx-size N        context of a request without max tokens (default: 4096)\n"
            "      --kv-tokens N       KV page pool capacity in tokens (default: the model's rule)\n"
            "      --chat              wrap a \"prompt\" in the chat template as a user message\n"
            "      --temp F            default temperature (default 0: greedy)\n"
            "      --top-k N / --top-p F / --min-p F   default sampling filters (off)\n"
            "  -s, --seed N            default seed (default 0)\n"
            "  -t, --threads N         CPU threads (default: all, at most 16)\n"
            "      --backend B         cpu, cuda or auto (default auto)\n"
            "  -v, --verbose           log details to stderr\n",
            argv0);
}

/* One input line and what became of it. */
typedef struct batch_item {
    int line;
    char *id_json;     /* the input "id" re-serialised, or the line number */
    int64_t req;       /* scheduler id, 0 when refused at submit */
    char *error;       /* submit failure */
    const char *status;
} batch_item;

/* s[0..n) as a JSON string literal.  Valid UTF-8 passes through; bytes that are not (an error message
   that names a file path of other bytes, or one cut inside a character where a message buffer ends) are
   written as U+FFFD, one per maximal subpart, so that every line is valid JSON (RFC 8259 wants UTF-8). */
static void json_escape(qsa__buf *b, const char *s, size_t n) {
    char u[8];
    qsa__buf_put(b, "\"", 1);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c >= 0x80) {
            uint32_t cp;
            int sub = 1, k = qsa__u8_next((const uint8_t *)s + i, n - i, &cp, &sub);
            if (k > 0) { qsa__buf_put(b, s + i, (size_t)k); i += (size_t)k - 1; }
            else { qsa__buf_puts(b, "\\ufffd"); i += (size_t)(sub > 0 ? sub : 1) - 1; }
            continue;
        }
        if (c == '"') qsa__buf_puts(b, "\\\"");
        else if (c == '\\') qsa__buf_puts(b, "\\\\");
        else if (c == '\n') qsa__buf_puts(b, "\\n");
        else if (c == '\r') qsa__buf_puts(b, "\\r");
        else if (c == '\t') qsa__buf_puts(b, "\\t");
        else if (c < 0x20) { snprintf(u, sizeof u, "\\u%04x", c); qsa__buf_puts(b, u); }
        else qsa__buf_put(b, s + i, 1);
    }
    qsa__buf_put(b, "\"", 1);
}

static void put_json_string(FILE *f, const char *s, size_t n) {
    qsa__buf b;
    memset(&b, 0, sizeof b);
    json_escape(&b, s, n);
    if (b.data) fwrite(b.data, 1, b.len, f);
    qsa__buf_free(&b);
}

static char *id_to_json(const qsa__json *v, int line) {
    char buf[64];
    if (v && v->type == QSA__JSON_STRING) {
        qsa__buf b;
        memset(&b, 0, sizeof b);
        json_escape(&b, v->str, v->len);
        if (b.data) return b.data; /* allocated by the library's allocator: free with qsa_free */
    }
    if (v && v->type == QSA__JSON_NUMBER && v->is_int) snprintf(buf, sizeof buf, "%lld", (long long)v->i64);
    else snprintf(buf, sizeof buf, "%d", line);
    return qsa__strdup(buf);
}

static const char *stop_name(qsa_stop_reason r) {
    switch (r) {
    case QSA_STOP_EOS: return "eos";
    case QSA_STOP_STRING: return "stop_string";
    case QSA_STOP_MAX_TOKENS: return "max_tokens";
    case QSA_STOP_CALLBACK: return "callback";
    case QSA_STOP_NONE: break;
    }
    return "none";
}

/* A number member, or dflt; a member of the wrong type is an error. */
static int get_num(const qsa__json *o, const char *key, double dflt, double *out, char *err, size_t errn) {
    const qsa__json *v = qsa__json_get(o, key);
    *out = dflt;
    if (!v) return 1;
    if (v->type != QSA__JSON_NUMBER) {
        snprintf(err, errn, "\"%s\": expected a number, found %s", key, qsa__json_type_name(v));
        return 0;
    }
    *out = v->num;
    return 1;
}

/* A whole-number member in [lo, hi], or dflt */
static int get_int(const qsa__json *o, const char *key, int dflt, int lo, int hi, int *out, char *err, size_t errn) {
    double v;
    if (!get_num(o, key, dflt, &v, err, errn)) return 0;
    if (!(v >= lo && v <= hi) || v != floor(v)) {
        snprintf(err, errn, "\"%s\": expected a whole number from %d to %d", key, lo, hi);
        return 0;
    }
    *out = (int)v;
    return 1;
}

/* 1 when the string value holds no NUL (\u0000): the library takes C strings, which would end there */
static int no_nul(const qsa__json *v, const char *what, char *err, size_t errn) {
    if (strlen(v->str) == v->len) return 1;
    snprintf(err, errn, "%s: a NUL character (\\u0000) is not allowed (the text would end there)", what);
    return 0;
}

/* Build and submit the request of one parsed line. */
static qsa_result submit_line(qsa_sched *s, const qsa__json *o, const qsa_request_params *defaults, int chat, int64_t *id,
                              char *err, size_t errn) {
    qsa_request_params rp = *defaults;
    qsa_chat_message msgs[64];
    const char *stops[16];
    if (!o || o->type != QSA__JSON_OBJECT) { snprintf(err, errn, "expected a JSON object"); return QSA_ERR_FORMAT; }
    const qsa__json *prompt = qsa__json_get(o, "prompt"), *messages = qsa__json_get(o, "messages");
    if (prompt && prompt->type == QSA__JSON_STRING) {
        if (!no_nul(prompt, "\"prompt\"", err, errn)) return QSA_ERR_FORMAT;
        rp.text = prompt->str;
        rp.chat = chat;
        rp.parse_special = 1;
    } else if (messages && messages->type == QSA__JSON_ARRAY && messages->count > 0 && messages->count <= 64) {
        int n = 0;
        for (const qsa__json *m = messages->child; m; m = m->next, n++) {
            const qsa__json *role = qsa__json_get(m, "role"), *content = qsa__json_get(m, "content");
            if (!role || role->type != QSA__JSON_STRING || !content || content->type != QSA__JSON_STRING) {
                snprintf(err, errn, "messages[%d]: expected {\"role\": string, \"content\": string}", n);
                return QSA_ERR_FORMAT;
            }
            char what[64];
            snprintf(what, sizeof what, "messages[%d]", n);
            if (!no_nul(role, what, err, errn) || !no_nul(content, what, err, errn)) return QSA_ERR_FORMAT;
            msgs[n].role = role->str;
            msgs[n].content = content->str;
        }
        rp.messages = msgs;
        rp.n_messages = n;
    } else {
        snprintf(err, errn, "expected \"prompt\": string or \"messages\": [1..64 messages]");
        return QSA_ERR_FORMAT;
    }
    double v;
    if (!get_int(o, "max_tokens", rp.max_tokens, 0, INT_MAX, &rp.max_tokens, err, errn)) return QSA_ERR_FORMAT;
    if (!get_num(o, "temperature", rp.sampling.temperature, &v, err, errn)) return QSA_ERR_FORMAT;
    rp.sampling.temperature = (float)v;
    if (!get_num(o, "top_p", rp.sampling.top_p, &v, err, errn)) return QSA_ERR_FORMAT;
    rp.sampling.top_p = (float)v;
    if (!get_int(o, "top_k", rp.sampling.top_k, 0, INT_MAX, &rp.sampling.top_k, err, errn)) return QSA_ERR_FORMAT;
    if (!get_num(o, "min_p", rp.sampling.min_p, &v, err, errn)) return QSA_ERR_FORMAT;
    rp.sampling.min_p = (float)v;
    if (!get_num(o, "repetition_penalty", rp.sampling.repetition_penalty, &v, err, errn)) return QSA_ERR_FORMAT;
    rp.sampling.repetition_penalty = (float)v;
    const qsa__json *seed = qsa__json_get(o, "seed");
    if (seed) {
        if (!qsa__json_u64(seed, &rp.sampling.seed)) {
            snprintf(err, errn, "\"seed\": expected an integer from 0 to 18446744073709551615");
            return QSA_ERR_FORMAT;
        }
    }
    const qsa__json *stop = qsa__json_get(o, "stop");
    if (stop) {
        int n = 0;
        if (stop->type == QSA__JSON_STRING) {
            if (!no_nul(stop, "\"stop\"", err, errn)) return QSA_ERR_FORMAT;
            stops[n++] = stop->str;
        } else if (stop->type == QSA__JSON_ARRAY && stop->count <= 16) {
            for (const qsa__json *e = stop->child; e; e = e->next) {
                if (e->type != QSA__JSON_STRING) { snprintf(err, errn, "\"stop\": expected strings"); return QSA_ERR_FORMAT; }
                if (!no_nul(e, "\"stop\"", err, errn)) return QSA_ERR_FORMAT;
                stops[n++] = e->str;
            }
        } else {
            snprintf(err, errn, "\"stop\": expected a string or an array of at most 16 strings");
            return QSA_ERR_FORMAT;
        }
        rp.stop_strings = stops;
        rp.n_stop_strings = n;
    }
    qsa_result r = qsa_sched_submit(s, &rp, id);
    if (r != QSA_OK) snprintf(err, errn, "%s", qsa_last_error());
    return r;
}

int main(int argc, char **argv) {
    cli_check_stdout("batch");
    const char *model_dir = "models/tiny", *in_path = NULL, *out_path = NULL;
    int n_predict = 128, chat = 0, threads = 0, verbose = 0, kv_tokens = 0;
    qsa_backend backend = QSA_BACKEND_AUTO;
    qsa_sched_params spar;
    memset(&spar, 0, sizeof spar);
    qsa_sampling_params sp;
    memset(&sp, 0, sizeof sp);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
#define ARG(s1, s2) (is_opt(a, s1, s2) && need_value(a, v) && ++i)
        if (ARG("-m", "--model")) model_dir = v;
        else if (ARG("-f", "--file")) in_path = v;
        else if (ARG("-o", "--out")) out_path = v;
        else if (ARG("-n", "--n-predict")) n_predict = (int)cli_int(a, v, 0, INT_MAX);
        else if (ARG("--max-batch", NULL)) spar.max_batch = (int)cli_int(a, v, 0, INT_MAX);
        else if (ARG("--chunk", NULL)) spar.prefill_chunk = (int)cli_int(a, v, 0, INT_MAX);
        else if (ARG("-c", "--ctx-size")) spar.n_ctx_default = (int)cli_int(a, v, 0, INT_MAX);
        else if (ARG("--kv-tokens", NULL)) kv_tokens = (int)cli_int(a, v, 0, INT_MAX);
        else if (ARG("--temp", NULL)) sp.temperature = cli_float(a, v);
        else if (ARG("--top-k", NULL)) sp.top_k = (int)cli_int(a, v, 0, INT_MAX);
        else if (ARG("--top-p", NULL)) sp.top_p = cli_float(a, v);
        else if (ARG("--min-p", NULL)) sp.min_p = cli_float(a, v);
        else if (ARG("-s", "--seed")) sp.seed = cli_u64(a, v);
        else if (ARG("-t", "--threads")) threads = (int)cli_int(a, v, 0, 4096);
        else if (ARG("--backend", NULL)) {
            if (!strcmp(v, "cpu")) backend = QSA_BACKEND_CPU;
            else if (!strcmp(v, "cuda")) backend = QSA_BACKEND_CUDA;
            else if (!strcmp(v, "auto")) backend = QSA_BACKEND_AUTO;
            else { fprintf(stderr, "unknown backend '%s'\n", v); return 2; }
        }
        else if (!strcmp(a, "--chat")) chat = 1;
        else if (!strcmp(a, "-v") || !strcmp(a, "--verbose")) verbose = 1;
        else if (!strcmp(a, "-h") || !strcmp(a, "--help")) { usage(argv[0]); return 0; }
        else if (a[0] != '-' && !in_path) in_path = a;
        else { fprintf(stderr, "unknown option '%s'\n", a); usage(argv[0]); return 2; }
#undef ARG
    }
    if (!in_path) { usage(argv[0]); return 2; }
    qsa_set_logger(qsa_log_stderr, NULL, verbose ? QSA_LOG_DEBUG : QSA_LOG_WARN);
    char *text = NULL;
    size_t text_len = 0;
    if (qsa__read_file(in_path, &text, &text_len) != QSA_OK) { fprintf(stderr, "error: %s\n", qsa_last_error()); return 1; }
    FILE *out = stdout;
    if (out_path && !(out = fopen(out_path, "w"))) {
        fprintf(stderr, "error: cannot write '%s'\n", out_path);
        free(text);
        return 1;
    }
    int n_lines = 1;
    for (size_t i = 0; i < text_len; i++) n_lines += text[i] == '\n';
    qsa_model_params mp;
    memset(&mp, 0, sizeof mp);
    mp.backend = backend;
    mp.n_threads = threads;
    mp.kv_pool_tokens = kv_tokens;
    qsa_model *model = NULL;
    if (qsa_model_load(model_dir, &mp, &model) != QSA_OK) {
        fprintf(stderr, "error: cannot load model '%s': %s\n", model_dir, qsa_last_error());
        free(text);
        if (out != stdout) fclose(out);
        return 1;
    }
    spar.max_queued = n_lines;
    qsa_sched *s = NULL;
    if (qsa_sched_create(model, &spar, &s) != QSA_OK) {
        fprintf(stderr, "error: %s\n", qsa_last_error());
        qsa_model_free(model);
        free(text);
        if (out != stdout) fclose(out);
        return 1;
    }
    qsa_request_params defaults;
    memset(&defaults, 0, sizeof defaults);
    defaults.sampling = sp;
    defaults.max_tokens = n_predict;
    batch_item *items = (batch_item *)calloc((size_t)n_lines, sizeof(batch_item));
    int n_items = 0, rc = 0;
    char source[512], err[1024];
    double t0 = qsa__now();
    /* parse and submit every line */
    for (size_t pos = 0, line = 1; pos < text_len; line++) {
        size_t end = pos;
        while (end < text_len && text[end] != '\n') end++;
        size_t a = pos, b = end;
        pos = end + 1;
        while (a < b && (text[a] == ' ' || text[a] == '\t' || text[a] == '\r')) a++;
        while (b > a && (text[b - 1] == ' ' || text[b - 1] == '\t' || text[b - 1] == '\r')) b--;
        if (a == b) continue;
        batch_item *it = &items[n_items++];
        it->line = (int)line;
        snprintf(source, sizeof source, "%s:%d", in_path, (int)line);
        qsa__json_doc doc;
        if (qsa__json_parse(text + a, b - a, source, &doc) != QSA_OK) {
            it->id_json = id_to_json(NULL, (int)line);
            it->error = strdup(qsa_last_error());
            it->status = "error";
            continue;
        }
        it->id_json = id_to_json(qsa__json_get(doc.root, "id"), (int)line);
        qsa_result r = submit_line(s, doc.root, &defaults, chat, &it->req, err, sizeof err);
        if (r != QSA_OK) {
            char full[sizeof source + sizeof err + 4];
            snprintf(full, sizeof full, "%s: %s", source, err);
            it->error = strdup(full);
            it->status = r == QSA_ERR_CONTEXT_FULL ? "refused" : "error";
        }
        qsa__json_free(&doc);
    }
    if (qsa_sched_run(s) != QSA_OK) { fprintf(stderr, "error: %s\n", qsa_last_error()); rc = 1; }
    double wall = qsa__now() - t0;
    /* results in input order */
    long long n_prompt = 0, n_gen = 0;
    int n_ok = 0, n_failed = 0;
    double ttft_sum = 0;
    for (int i = 0; i < n_items; i++) {
        batch_item *it = &items[i];
        fprintf(out, "{\"id\": %s, ", it->id_json);
        qsa_request_result r;
        if (!it->error && qsa_sched_poll(s, it->req, &r) == QSA_OK && r.status == QSA_REQ_DONE) {
            fprintf(out, "\"text\": ");
            put_json_string(out, r.text, r.text_len);
            fprintf(out, ", \"tokens\": %d, \"stop\": \"%s\", \"ttft_s\": %.6f, \"prefill_tok_s\": %.1f, \"decode_tok_s\": %.1f}\n",
                    r.n_tokens, stop_name(r.stop), r.stats.ttft_s, r.stats.prefill_tok_s, r.stats.decode_tok_s);
            n_ok++;
            n_prompt += r.stats.n_prompt;
            n_gen += r.n_tokens;
            ttft_sum += r.stats.ttft_s;
            continue;
        }
        const char *msg = it->error ? it->error : r.message;
        const char *st = it->error ? it->status : qsa_request_status_string(r.status);
        fprintf(out, "\"error\": ");
        put_json_string(out, msg, strlen(msg));
        fprintf(out, ", \"status\": \"%s\"}\n", st);
        n_failed++;
    }
    qsa_sched_info info;
    qsa_sched_get_info(s, &info);
    fprintf(stderr,
            "batch: %d requests (%d done, %d failed) | %lld prompt + %lld generated tokens in %.3f s | %.1f generated tok/s, "
            "%.1f total tok/s | mean ttft %.3f s | %lld steps (max batch %d, chunk %d, %d KV pages of %d tokens)\n",
            n_items, n_ok, n_failed, n_prompt, n_gen, wall, wall > 0 ? n_gen / wall : 0.0,
            wall > 0 ? (n_prompt + n_gen) / wall : 0.0, n_ok ? ttft_sum / n_ok : 0.0, info.n_steps, s->p.max_batch,
            s->p.prefill_chunk, info.pages_total, info.page_size);
    for (int i = 0; i < n_items; i++) { qsa_free(items[i].id_json); free(items[i].error); }
    free(items);
    qsa_sched_free(s);
    qsa_model_free(model);
    free(text);
    if (out != stdout && fclose(out) != 0) { fprintf(stderr, "error: writing '%s' failed\n", out_path); rc = 1; }
    return rc || n_failed ? (rc ? rc : 3) : 0;
}
