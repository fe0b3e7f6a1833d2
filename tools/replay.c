/* replay.c - capture a QSA layer of a request and replay it (the tool behind allocation-invariance
 * investigations; see docs/DETERMINISM.md).
 *
 *   tools/replay capture --model DIR --ids FILE --layer L --out FILE.safetensors
 *                        [--page-size P] [--shuffle SEED] [--physical-order]
 *   tools/replay replay FILE.safetensors
 *
 * capture: feeds the ids (a JSON array) on the CPU backend, with the page pool's free list shuffled
 * by SEED (to place the request on scattered pages), recording layer L.
 * replay: recomputes the captured layer's attention with (a) the frozen captured plan, (b) today's
 * planner, (c) the physical-order planner, and prints for each: identical, or the count of differing
 * values and the first one.  Exit status 0 when (a) and (b) are identical.
 */
#define QSA_RUNTIME_IMPLEMENTATION
#include "../qsa_runtime.h"
#include "../examples/cli.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int die(const char *what) {
    fprintf(stderr, "replay: %s: %s\n", what, qsa_last_error());
    return 1;
}

static int capture(int argc, char **argv) {
    const char *model = NULL, *ids_path = NULL, *out = NULL;
    int layer = -1;
    long long shuffle = -1; /* (off) */
    qsa_model_params mp;
    memset(&mp, 0, sizeof mp);
    mp.backend = QSA_BACKEND_CPU;
    mp.no_tokenizer = 1;
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--physical-order")) { mp.debug_physical_order = 1; continue; }
        int known = !strcmp(a, "--model") || !strcmp(a, "--ids") || !strcmp(a, "--out") || !strcmp(a, "--layer") ||
                    !strcmp(a, "--page-size") || !strcmp(a, "--shuffle");
        if (!known) { fprintf(stderr, "replay capture: unknown option '%s'\n", a); return 2; }
        need_value(a, v);
        i++;
        if (!strcmp(a, "--model")) model = v;
        else if (!strcmp(a, "--ids")) ids_path = v;
        else if (!strcmp(a, "--out")) out = v;
        else if (!strcmp(a, "--layer")) layer = (int)cli_int(a, v, 0, QSA_MAX_LAYERS - 1);
        else if (!strcmp(a, "--page-size")) mp.kv_page_size = (int)cli_int(a, v, 0, 1 << 20);
        else shuffle = (long long)(cli_u64(a, v) & 0x7fffffffffffffffull);
    }
    if (!model || !ids_path || !out || layer < 0) {
        fprintf(stderr, "replay capture: --model, --ids, --layer and --out are required\n");
        return 2;
    }
    char *text;
    size_t len;
    if (qsa__read_file(ids_path, &text, &len) != QSA_OK) return die("reading ids");
    qsa__json_doc doc;
    if (qsa__json_parse(text, len, ids_path, &doc) != QSA_OK) return die("parsing ids");
    if (!doc.root || doc.root->type != QSA__JSON_ARRAY || doc.root->count == 0) {
        fprintf(stderr, "replay: %s: expected a non-empty JSON array of token ids\n", ids_path);
        return 1;
    }
    int n = (int)doc.root->count, k = 0;
    int32_t *ids = (int32_t *)malloc(sizeof(int32_t) * (size_t)n);
    for (const qsa__json *e = doc.root->child; e; e = e->next) {
        if (e->type != QSA__JSON_NUMBER || !e->is_int || e->i64 < 0 || e->i64 > INT32_MAX) {
            fprintf(stderr, "replay: %s: element %d is not a token id\n", ids_path, k);
            return 1;
        }
        ids[k++] = (int32_t)e->i64;
    }
    qsa__json_free(&doc);
    qsa__free(text);
    qsa_model *m;
    if (qsa_model_load(model, &mp, &m) != QSA_OK) return die("loading the model");
    if (shuffle >= 0) qsa__pool_shuffle(&m->pool, (uint64_t)shuffle);
    qsa_seq_params sp;
    memset(&sp, 0, sizeof sp);
    sp.n_ctx = n;
    qsa_seq *s;
    if (qsa_seq_create(m, &sp, &s) != QSA_OK) return die("creating a sequence");
    if (qsa_seq_capture_begin(s, layer) != QSA_OK) return die("capture");
    if (qsa_seq_feed(s, ids, n, NULL, 0) != QSA_OK) return die("feeding the prompt");
    if (qsa_seq_capture_end(s, out) != QSA_OK) return die("writing the capture");
    fprintf(stderr, "replay: captured layer %d, %d queries, pages of %d tokens -> %s\n", layer, n, m->pool.page_size, out);
    qsa_seq_free(s);
    qsa_model_free(m);
    free(ids);
    return 0;
}

static int replay(const char *path) {
    static const char *names[3] = {"frozen captured plan", "current planner", "physical-order planner"};
    int bad = 0;
    for (int mode = 0; mode < 3; mode++) {
        qsa_replay_report rep;
        if (qsa_replay_capture(path, (qsa_replay_mode)mode, &rep) != QSA_OK) return die("replaying");
        if (rep.n_differ == 0) printf("%-24s identical (%d queries, %lld values)\n", names[mode], rep.n_queries, rep.n_values);
        else {
            printf("%-24s %lld of %lld values differ; first: query %d, index %d: captured %.9g, replayed %.9g\n", names[mode],
                   rep.n_differ, rep.n_values, rep.first_query, rep.first_index, rep.first_captured, rep.first_replayed);
            if (mode < 2) bad = 1;
        }
    }
    return bad;
}

int main(int argc, char **argv) {
    cli_check_stdout("replay");
    if (argc >= 2 && !strcmp(argv[1], "capture")) return capture(argc, argv);
    if (argc == 3 && !strcmp(argv[1], "replay")) return replay(argv[2]);
    fprintf(stderr, "usage: %s capture --model DIR --ids FILE --layer L --out FILE [--page-size P] [--shuffle SEED] [--physical-order]\n"
                    "       %s replay FILE\n", argv[0], argv[0]);
    return 2;
}
