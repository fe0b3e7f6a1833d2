/* chat.c - interactive ChatML chat (streaming) with a Qwen4-Exp model, on qsa_runtime.
 *
 *   examples/chat [-m DIR] [options]                interactive: one user turn per line
 *   examples/chat [-m DIR] -p "question" [-n 64]    one-shot: answer, stats on stderr, exit
 *
 * Each answer is a request to the scheduler (qsa_sched) that continues one sequence
 * (qsa_request_params.seq), so history is never recomputed.  Type /reset to start over, /exit (or
 * end of input) to quit.
 */
#define QSA_RUNTIME_IMPLEMENTATION
#include "../qsa_runtime.h"

#include "cli.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void usage(const char *argv0) {
    fprintf(stderr,
            "usage: %s [options]\n"
            "  -m, --model DIR         model directory (default: models/tiny)\n"
            "  -p, --prompt TEXT       one-shot mode: answer TEXT and exit\n"
            "  -f, --file FILE         one-shot mode with the prompt read from FILE\n"
            "      --raw               one-shot prompt is raw text (no chat template)\n"
            "  -sys, --system TEXT     system message\n"
            "  -n, --n-predict N       max tokens per answer, N >= 1 (default: 256; -1: until EOS / context)\n"
            "  -c, --ctx-size N        context length in tokens, N >= 1 (default: 4096, at most the model's)\n"
            "      --temp F            temperature (default: generation_config.json, 0 if its do_sample is\n"
            "                          false, else 0.7; 0 = greedy)\n"
            "      --top-k N           top-k (default: generation_config.json, else 0 = off)\n"
            "      --top-p F           top-p (default: generation_config.json, else 1 = off)\n"
            "      --min-p F           min-p (default: generation_config.json, else 0 = off)\n"
            "      --repeat-penalty F  repetition penalty (default: generation_config.json, else 1 = off)\n"
            "  -s, --seed N            sampling seed (default 0)\n"
            "  -t, --threads N         CPU threads (default: all, at most 16)\n"
            "      --backend B         cpu, cuda or auto (default auto)\n"
            "      --no-stats          do not print the statistics line\n"
            "  -v, --verbose           log loading details to stderr\n",
            argv0);
}

typedef struct chat_opts {
    const char *model, *prompt, *prompt_file, *system;
    int raw, n_predict, n_ctx, threads, stats, verbose;
    qsa_backend backend;
    qsa_sampling_params sp;
    int set_temp, set_top_k, set_top_p, set_min_p, set_penalty;
} chat_opts;

static int on_token(void *user, int32_t token, const char *text, size_t len) {
    (void)user; (void)token;
    fwrite(text, 1, len, stdout);
    fflush(stdout);
    return 0;
}

static void print_stats(const qsa_stats *st) {
    fprintf(stderr, "[prefill %d tok in %.3f s, %.1f tok/s | decode %d tok in %.3f s, %.1f tok/s | ttft %.3f s]\n",
            st->n_prompt, st->prefill_s, st->prefill_tok_s, st->n_generated, st->decode_s, st->decode_tok_s, st->ttft_s);
}

/* The whole of f, NUL-terminated; NULL (and a message) when it cannot be read or holds a NUL byte (the
   prompt would end there). */
static char *read_all(FILE *f, const char *name, size_t *len) {
    size_t cap = 4096, n = 0;
    char *b = (char *)malloc(cap);
    for (size_t k = 1; b && k;) {
        if (n + 4097 > cap) {
            char *nb = (char *)realloc(b, cap *= 2);
            if (!nb) { free(b); b = NULL; break; }
            b = nb;
        }
        k = fread(b + n, 1, 4096, f);
        n += k;
    }
    if (!b) { fprintf(stderr, "error: '%s': out of memory\n", name); return NULL; }
    if (ferror(f)) { fprintf(stderr, "error: cannot read '%s'\n", name); free(b); return NULL; }
    b[n] = 0;
    if (strlen(b) != n) { fprintf(stderr, "error: '%s' holds a NUL byte\n", name); free(b); return NULL; }
    *len = n;
    return b;
}

/* One answer through the scheduler: a request that continues `seq` with `text` (special tokens
   parsed) after `pending` (the last token of the previous answer, not yet fed; -1 if none); its
   tokens are streamed by on_token. */
static int answer(qsa_sched *sched, qsa_seq *seq, int n_ctx, const qsa_tokenizer *tok, int32_t *pending, const char *text,
                  const chat_opts *o, int32_t im_end) {
    int32_t *ids = NULL;
    size_t n = 0;
    if (qsa_tokenize(tok, text, strlen(text), 1, &ids, &n) != QSA_OK) {
        fprintf(stderr, "error: %s\n", qsa_last_error());
        return 1;
    }
    int32_t *prompt = (int32_t *)malloc(sizeof(int32_t) * (n + 1));
    if (!prompt) {
        fprintf(stderr, "error: out of memory\n");
        qsa_free(ids);
        return 1;
    }
    int np = 0;
    if (*pending >= 0) prompt[np++] = *pending;
    if (n) memcpy(prompt + np, ids, sizeof(int32_t) * n); /* (ids is NULL for text of no tokens) */
    np += (int)n;
    qsa_free(ids);
    qsa_request_params rp;
    memset(&rp, 0, sizeof rp);
    rp.prompt = prompt;
    rp.n_prompt = np;
    rp.seq = seq; /* continue the conversation: the history is never recomputed */
    rp.sampling = o->sp;
    rp.max_tokens = o->n_predict > 0 ? o->n_predict : 0;
    /* an answer that would overflow the context stops when the context is full (the last token
       is not fed: room + 1 tokens fit) */
    int room = n_ctx - qsa_seq_pos(seq) - np;
    if (room >= 1 && rp.max_tokens > room + 1) rp.max_tokens = room + 1;
    rp.on_token = on_token;
    int64_t id = 0;
    qsa_result r = qsa_sched_submit(sched, &rp, &id);
    free(prompt);
    qsa_request_result res;
    memset(&res, 0, sizeof res);
    if (r == QSA_OK) r = qsa_sched_run(sched);
    if (r == QSA_OK) r = qsa_sched_poll(sched, id, &res);
    if (r == QSA_OK && res.status != QSA_REQ_DONE) {
        r = res.error != QSA_OK ? res.error : QSA_ERR_INTERNAL;
        qsa__fail(r, "%s", res.message);
    }
    if (r != QSA_OK) {
        fprintf(stderr, "\nerror: %s: %s\n", qsa_result_string(r), qsa_last_error());
        if (r == QSA_ERR_CONTEXT_FULL) fprintf(stderr, "(the conversation fills the context: /reset to start over)\n");
        if (id) qsa_sched_release(sched, id);
        return 1;
    }
    printf("\n");
    fflush(stdout);
    /* the next turn must close this one: after <|im_end|> (pending, fed with it) a newline, else the end
       marker; another EOS (<|endoftext|>) is not fed, so the history reads as the template writes it */
    int32_t last = res.n_tokens ? res.tokens[res.n_tokens - 1] : -1;
    int closed = res.stop == QSA_STOP_EOS && last == im_end;
    *pending = res.stop == QSA_STOP_EOS && !closed ? -1 : last;
    if (res.stop == QSA_STOP_MAX_TOKENS && qsa_seq_pos(seq) + 1 >= n_ctx)
        fprintf(stderr, "(the answer filled the context of %d tokens: /reset to start over)\n", n_ctx);
    if (o->stats) print_stats(&res.stats);
    qsa_sched_release(sched, id);
    return closed ? 0 : 2;
}

int main(int argc, char **argv) {
    cli_check_stdout("chat");
    chat_opts o;
    memset(&o, 0, sizeof o);
    o.model = "models/tiny";
    o.n_predict = 256;
    o.n_ctx = 4096;
    o.stats = 1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
#define ARG(s1, s2) (is_opt(a, s1, s2) && need_value(a, v) && ++i)
        if (ARG("-m", "--model")) o.model = v;
        else if (ARG("-p", "--prompt")) o.prompt = v;
        else if (ARG("-f", "--file")) o.prompt_file = v;
        else if (ARG("-sys", "--system")) o.system = v;
        else if (ARG("-n", "--n-predict")) {
            o.n_predict = (int)cli_int(a, v, -1, INT_MAX);
            if (!o.n_predict) { fprintf(stderr, "%s 0 would answer nothing: give N >= 1, or -1 for no limit\n", a); return 2; }
        }
        else if (ARG("-c", "--ctx-size")) o.n_ctx = (int)cli_int(a, v, 1, INT_MAX);
        else if (ARG("--temp", NULL)) { o.sp.temperature = cli_float(a, v); o.set_temp = 1; }
        else if (ARG("--top-k", NULL)) { o.sp.top_k = (int)cli_int(a, v, 0, INT_MAX); o.set_top_k = 1; }
        else if (ARG("--top-p", NULL)) { o.sp.top_p = cli_float(a, v); o.set_top_p = 1; }
        else if (ARG("--min-p", NULL)) { o.sp.min_p = cli_float(a, v); o.set_min_p = 1; }
        else if (ARG("--repeat-penalty", NULL)) { o.sp.repetition_penalty = cli_float(a, v); o.set_penalty = 1; }
        else if (ARG("-s", "--seed")) o.sp.seed = cli_u64(a, v);
        else if (ARG("-t", "--threads")) o.threads = (int)cli_int(a, v, 0, 4096);
        else if (ARG("--backend", NULL)) {
            if (!strcmp(v, "cpu")) o.backend = QSA_BACKEND_CPU;
            else if (!strcmp(v, "cuda")) o.backend = QSA_BACKEND_CUDA;
            else if (!strcmp(v, "auto")) o.backend = QSA_BACKEND_AUTO;
            else { fprintf(stderr, "unknown backend '%s'\n", v); return 2; }
        }
        else if (!strcmp(a, "--raw")) o.raw = 1;
        else if (!strcmp(a, "--no-stats")) o.stats = 0;
        else if (!strcmp(a, "-v") || !strcmp(a, "--verbose")) o.verbose = 1;
        else if (!strcmp(a, "-h") || !strcmp(a, "--help")) { usage(argv[0]); return 0; }
        else { fprintf(stderr, "unknown option '%s'\n", a); usage(argv[0]); return 2; }
#undef ARG
    }
    qsa_set_logger(qsa_log_stderr, NULL, o.verbose ? QSA_LOG_DEBUG : QSA_LOG_WARN);
    qsa_model_params mp;
    memset(&mp, 0, sizeof mp);
    mp.backend = o.backend;
    mp.n_threads = o.threads;
    /* a KV pool for the one sequence's context (the library's default holds at most 32,768 tokens) */
    static qsa_model_config mc;
    mp.kv_pool_tokens = o.n_ctx;
    if (qsa_config_load_dir(o.model, &mc) == QSA_OK && mc.max_position_embeddings < o.n_ctx)
        mp.kv_pool_tokens = mc.max_position_embeddings;
    qsa_clear_error(); /* (a config that does not load is reported by the model's load) */
    qsa_model *model = NULL;
    if (qsa_model_load(o.model, &mp, &model) != QSA_OK) {
        fprintf(stderr, "error: cannot load model '%s': %s\n", o.model, qsa_last_error());
        return 1;
    }
    const qsa_tokenizer *tok = qsa_model_get_tokenizer(model);
    if (!tok) {
        fprintf(stderr, "error: '%s' has no tokenizer.json: the chat needs one\n", o.model);
        qsa_model_free(model);
        return 1;
    }
    /* sampling defaults from generation_config.json where the user gave none */
    const qsa_generation_config *gc = qsa_model_get_generation_config(model);
    /* (do_sample false is greedy whatever the temperature, as in transformers) */
    if (!o.set_temp) o.sp.temperature = gc->has_do_sample && !gc->do_sample ? 0.0f : gc->has_temperature ? gc->temperature : 0.7f;
    if (!o.set_top_k && gc->has_top_k) o.sp.top_k = gc->top_k;
    if (!o.set_top_p && gc->has_top_p) o.sp.top_p = gc->top_p;
    if (!o.set_min_p && gc->has_min_p) o.sp.min_p = gc->min_p;
    if (!o.set_penalty && gc->has_repetition_penalty) o.sp.repetition_penalty = gc->repetition_penalty;
    const qsa_model_config *cfg = qsa_model_get_config(model);
    qsa_seq_params sp;
    memset(&sp, 0, sizeof sp);
    sp.n_ctx = o.n_ctx < cfg->max_position_embeddings ? o.n_ctx : cfg->max_position_embeddings;
    qsa_seq *seq = NULL;
    if (qsa_seq_create(model, &sp, &seq) != QSA_OK) {
        fprintf(stderr, "error: %s\n", qsa_last_error());
        qsa_model_free(model);
        return 1;
    }
    /* one request at a time: a batch of one */
    qsa_sched_params schp;
    memset(&schp, 0, sizeof schp);
    schp.max_batch = 1;
    qsa_sched *sched = NULL;
    if (qsa_sched_create(model, &schp, &sched) != QSA_OK) {
        fprintf(stderr, "error: %s\n", qsa_last_error());
        qsa_seq_free(seq);
        qsa_model_free(model);
        return 1;
    }
    int rc = 0;
    int32_t pending = -1;
    int32_t im_end = qsa_tokenizer_find(tok, "<|im_end|>");
    int last_eos = 1; /* whether the previous answer ended with <|im_end|> */
    int first = 1;    /* no answer yet since the start or /reset */
    char *line = NULL;
    size_t line_cap = 0;
    qsa_chat_message msgs[2];
    if (o.prompt || o.prompt_file) {
        char *text = NULL;
        size_t len = 0;
        if (o.prompt_file) {
            FILE *f = fopen(o.prompt_file, "rb");
            if (!f) { fprintf(stderr, "error: cannot open '%s'\n", o.prompt_file); rc = 1; goto out; }
            text = read_all(f, o.prompt_file, &len);
            fclose(f);
            if (!text) { rc = 1; goto out; }
        } else text = strdup(o.prompt);
        char *chat = NULL;
        int nm = 0;
        if (o.system) { msgs[nm].role = "system"; msgs[nm].content = o.system; nm++; }
        msgs[nm].role = "user"; msgs[nm].content = text; nm++;
        if (!o.raw && qsa_chat_apply_template(tok, msgs, (size_t)nm, 1, &chat) != QSA_OK) {
            fprintf(stderr, "error: %s\n", qsa_last_error());
            free(text);
            rc = 1;
            goto out;
        }
        int r = answer(sched, seq, sp.n_ctx, tok, &pending, o.raw ? text : chat, &o, im_end);
        rc = r == 1;
        qsa_free(chat);
        free(text);
        goto out;
    }
    fprintf(stderr, "qsa chat: %s (%d layers, vocab %d). One message per line; /reset, /exit.\n", o.model,
            cfg->num_hidden_layers, cfg->vocab_size);
    for (;;) {
        fprintf(stderr, "> ");
        fflush(stderr);
        ssize_t got = getline(&line, &line_cap, stdin); /* (a line of any length is one message) */
        if (got < 0) break;
        size_t len = (size_t)got;
        while (len && (line[len - 1] == '\n' || line[len - 1] == '\r')) line[--len] = 0;
        if (strlen(line) != len) { fprintf(stderr, "error: the line holds a NUL byte: not sent\n"); rc = 1; continue; }
        if (!strcmp(line, "/exit") || !strcmp(line, "/quit")) break;
        if (!strcmp(line, "/reset")) { qsa_seq_reset(seq); pending = -1; first = 1; fprintf(stderr, "(history cleared)\n"); continue; }
        if (!len) continue;
        int nm = 0;
        if (first && o.system) { msgs[nm].role = "system"; msgs[nm].content = o.system; nm++; }
        msgs[nm].role = "user"; msgs[nm].content = line; nm++;
        char *turn = NULL;
        if (qsa_chat_apply_template(tok, msgs, (size_t)nm, 1, &turn) != QSA_OK) {
            fprintf(stderr, "error: %s\n", qsa_last_error());
            rc = 1;
            continue;
        }
        /* close the previous answer: after its <|im_end|> (pending) a newline, else the marker too */
        size_t tl = strlen(turn) + 32;
        char *text = (char *)malloc(tl);
        if (!text) { fprintf(stderr, "error: out of memory\n"); qsa_free(turn); rc = 1; continue; }
        snprintf(text, tl, "%s%s", first ? "" : last_eos ? "\n" : "<|im_end|>\n", turn);
        qsa_free(turn);
        int pos0 = qsa_seq_pos(seq);
        int r = answer(sched, seq, sp.n_ctx, tok, &pending, text, &o, im_end);
        free(text);
        if (r == 1) { /* the conversation goes on; one the failure cut into starts over */
            rc = 1;
            if (qsa_seq_pos(seq) != pos0) {
                qsa_seq_reset(seq);
                pending = -1;
                first = 1;
                fprintf(stderr, "(the turn was cut short part-way: history cleared)\n");
            }
            continue;
        }
        last_eos = r == 0;
        first = 0;
    }
out:
    free(line);
    qsa_sched_free(sched);
    qsa_seq_free(seq);
    qsa_model_free(model);
    return rc;
}
