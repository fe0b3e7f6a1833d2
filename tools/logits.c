/* logits.c - run a model on given token ids and write its logits, for checking a model or a build
 * against the reference (the tensors have the names of the golden fixtures).
 *
 *   tools/logits --model DIR --ids FILE [--decode N] [--chunk C] [--backend cpu|cuda] --out FILE.safetensors
 *
 * FILE holds a JSON array of prompt token ids.  Output tensors:
 *   prefill_logits F32 [n, vocab]   row i: logits after prompt token i
 *   greedy_tokens  I64 [N]          token 0: argmax of the last prefill row; token i+1: argmax of decode row i
 *   decode_logits  F32 [N, vocab]   row i: logits after feeding greedy token i
 * The model directory needs no tokenizer files.
 */
#define QSA_RUNTIME_IMPLEMENTATION
#include "../qsa_runtime.h"
#include "../examples/cli.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int die(const char *what) {
    fprintf(stderr, "logits: %s: %s\n", what, qsa_last_error());
    return 1;
}

int main(int argc, char **argv) {
    cli_check_stdout("logits");
    const char *model_dir = NULL, *ids_path = NULL, *out_path = NULL;
    int n_decode = 0, chunk = 0;
    qsa_model_params mp;
    memset(&mp, 0, sizeof mp);
    mp.no_tokenizer = 1;
    static const char usage[] = "usage: %s --model DIR --ids FILE [--decode N] [--chunk C] [--backend auto|cpu|cuda] [--threads T] --out FILE\n";
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) { printf(usage, argv[0]); return 0; }
        int known = !strcmp(a, "--model") || !strcmp(a, "--ids") || !strcmp(a, "--out") || !strcmp(a, "--decode") ||
                    !strcmp(a, "--chunk") || !strcmp(a, "--threads") || !strcmp(a, "--backend");
        if (!known) { fprintf(stderr, "logits: unknown option '%s'\n", a); fprintf(stderr, usage, argv[0]); return 2; }
        need_value(a, v);
        i++;
        if (!strcmp(a, "--model")) model_dir = v;
        else if (!strcmp(a, "--ids")) ids_path = v;
        else if (!strcmp(a, "--out")) out_path = v;
        else if (!strcmp(a, "--decode")) n_decode = (int)cli_int(a, v, 0, 1 << 30);
        else if (!strcmp(a, "--chunk")) chunk = (int)cli_int(a, v, 0, 1 << 30);
        else if (!strcmp(a, "--threads")) mp.n_threads = (int)cli_int(a, v, 0, 4096);
        else if (!strcmp(v, "cpu") || !strcmp(v, "cuda") || !strcmp(v, "auto"))
            mp.backend = !strcmp(v, "cpu") ? QSA_BACKEND_CPU : !strcmp(v, "cuda") ? QSA_BACKEND_CUDA : QSA_BACKEND_AUTO;
        else { fprintf(stderr, "logits: --backend: '%s' is not auto, cpu or cuda\n", v); return 2; }
    }
    if (!model_dir || !ids_path || !out_path || n_decode < 0) {
        fprintf(stderr, "logits: --model, --ids and --out are required (see --help)\n");
        return 2;
    }
    qsa_set_logger(qsa_log_stderr, NULL, QSA_LOG_WARN);
    char *text;
    size_t len;
    if (qsa__read_file(ids_path, &text, &len) != QSA_OK) return die("reading ids");
    qsa__json_doc doc;
    if (qsa__json_parse(text, len, ids_path, &doc) != QSA_OK) { free(text); return die("parsing ids"); }
    const qsa__json *arr = doc.root;
    if (!arr || arr->type != QSA__JSON_ARRAY || arr->count == 0) {
        fprintf(stderr, "logits: %s: expected a non-empty JSON array of token ids\n", ids_path);
        return 1;
    }
    int n = (int)arr->count;
    int32_t *ids = (int32_t *)malloc(sizeof(int32_t) * (size_t)n);
    int k = 0;
    for (const qsa__json *e = arr->child; e; e = e->next, k++) {
        if (e->type != QSA__JSON_NUMBER || !e->is_int || e->i64 < 0 || e->i64 > INT32_MAX) {
            fprintf(stderr, "logits: %s: element %d is not a token id\n", ids_path, k);
            return 1;
        }
        ids[k] = (int32_t)e->i64;
    }
    qsa__json_free(&doc);
    qsa__free(text);
    qsa_model *m;
    if (qsa_model_load(model_dir, &mp, &m) != QSA_OK) return die("loading the model");
    int V = qsa_model_get_config(m)->vocab_size;
    qsa_seq_params sp;
    memset(&sp, 0, sizeof sp);
    if ((int64_t)n + n_decode > qsa_model_get_config(m)->max_position_embeddings) {
        fprintf(stderr, "logits: %d prompt ids + %d decoded exceed the model's context of %d\n", n, n_decode,
                qsa_model_get_config(m)->max_position_embeddings);
        return 1;
    }
    sp.n_ctx = n + n_decode; /* what is fed: the prompt and the decoded tokens */
    qsa_seq *s;
    if (qsa_seq_create(m, &sp, &s) != QSA_OK) return die("creating a sequence");
    float *pre = (float *)malloc(sizeof(float) * (size_t)n * V);
    float *dec = (float *)malloc(sizeof(float) * ((size_t)n_decode * V + 1));
    int64_t *greedy = (int64_t *)malloc(sizeof(int64_t) * ((size_t)n_decode + 1));
    for (int p = 0; p < n;) {
        int c = chunk > 0 && chunk < n - p ? chunk : n - p;
        if (qsa_seq_feed(s, ids + p, c, pre + (size_t)p * V, 1) != QSA_OK) return die("prefill");
        p += c;
    }
    const float *last = pre + (size_t)(n - 1) * V;
    for (int i = 0; i < n_decode; i++) {
        int32_t best = 0;
        for (int j = 1; j < V; j++) if (last[j] > last[best]) best = j;
        greedy[i] = best;
        if (qsa_seq_feed(s, &best, 1, dec + (size_t)i * V, 0) != QSA_OK) return die("decode");
        last = dec + (size_t)i * V;
    }
    qsa__st_out t[3];
    memset(t, 0, sizeof t);
    t[0].name = "prefill_logits"; t[0].dtype = QSA__F32; t[0].ndim = 2; t[0].shape[0] = n; t[0].shape[1] = V; t[0].data = pre;
    t[1].name = "greedy_tokens"; t[1].dtype = QSA__I64; t[1].ndim = 1; t[1].shape[0] = n_decode; t[1].data = greedy;
    t[2].name = "decode_logits"; t[2].dtype = QSA__F32; t[2].ndim = 2; t[2].shape[0] = n_decode; t[2].shape[1] = V; t[2].data = dec;
    if (qsa__st_write(out_path, t, 3) != QSA_OK) return die("writing the output");
    fprintf(stderr, "logits: %d prompt tokens, %d decoded -> %s\n", n, n_decode, out_path);
    free(ids); free(pre); free(dec); free(greedy);
    qsa_seq_free(s);
    qsa_model_free(m);
    return 0;
}
