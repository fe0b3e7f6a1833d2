/* fuzz_replay.c - libFuzzer harness for the capture reader (qsa_replay_capture, tools/replay).
 *
 *   clang -g -O1 -fsanitize=fuzzer,address,undefined -o fuzz_replay tests/fuzz/fuzz_replay.c -lm -ldl -lpthread
 *   ./fuzz_replay -max_total_time=60 corpus/
 *
 * Run from the repository root.  The input is a capture file (safetensors: meta, positions, queries,
 * selections, plans, block table, pages), written to a file in /dev/shm (the reader takes a path) and
 * replayed in all three modes: each replay either succeeds or fails with a message, and never reads
 * outside the file or asks for more than the file's pages.  Before the first input, a real capture
 * (models/tiny, 40 tokens in pages of 16 from a shuffled free list, its first QSA layer) goes into the
 * corpus directory given first, so that the mutations start from a file every check accepts. */
#define QSA_RUNTIME_IMPLEMENTATION
#include "../../qsa_runtime.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define FZ_ASSERT(c) do { if (!(c)) { fprintf(stderr, "invariant failed: %s (line %d): %s\n", #c, __LINE__, qsa_last_error()); abort(); } } while (0)

static char fz_path[64];

/* The seed: a capture of models/tiny's first QSA layer into DIR/seed_capture.safetensors */
static void fz_seed(const char *dir) {
    char out[4200];
    snprintf(out, sizeof out, "%s/seed_capture.safetensors", dir);
    if (access(out, F_OK) == 0) return;
    qsa_model_params mp;
    memset(&mp, 0, sizeof mp);
    mp.backend = QSA_BACKEND_CPU;
    mp.n_threads = 1;
    mp.kv_page_size = 16;
    qsa_model *m = NULL;
    qsa_seq *s = NULL;
    if (qsa_model_load("models/tiny", &mp, &m) != QSA_OK) {
        fprintf(stderr, "fuzz_replay: models/tiny: %s (run `make` in the repository root first)\n", qsa_last_error());
        abort();
    }
    int layer = -1;
    for (int l = 0; l < m->cfg.num_hidden_layers && layer < 0; l++)
        if (m->cfg.layer_types[l] == QSA_LAYER_QSA) layer = l;
    qsa__pool_shuffle(&m->pool, 5);
    int32_t ids[40];
    for (int i = 0; i < 40; i++) ids[i] = (int32_t)((i * 37 + 11) % m->cfg.vocab_size);
    FZ_ASSERT(layer >= 0 && qsa_seq_create(m, NULL, &s) == QSA_OK && qsa_seq_capture_begin(s, layer) == QSA_OK &&
              qsa_seq_feed(s, ids, 40, NULL, 0) == QSA_OK && qsa_seq_capture_end(s, out) == QSA_OK);
    qsa_seq_free(s);
    qsa_model_free(m);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    snprintf(fz_path, sizeof fz_path, "/dev/shm/qsa_fuzz_replay_%d.safetensors", (int)getpid());
    for (int i = 1; i < *argc; i++)
        if ((*argv)[i][0] != '-') { fz_seed((*argv)[i]); break; }
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    FILE *f = fopen(fz_path, "wb");
    FZ_ASSERT(f && fwrite(data, 1, size, f) == size && fclose(f) == 0);
    for (int mode = 0; mode < 3; mode++) {
        qsa_replay_report rep;
        qsa_result r = qsa_replay_capture(fz_path, (qsa_replay_mode)mode, &rep);
        if (r != QSA_OK) FZ_ASSERT(qsa_last_error()[0] != 0);
        else FZ_ASSERT(rep.n_differ <= rep.n_values && rep.n_queries >= 0);
    }
    remove(fz_path);
    return 0;
}
