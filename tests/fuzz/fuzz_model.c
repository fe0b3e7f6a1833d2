/* fuzz_model.c - libFuzzer harness for loading a model directory and running it on the CPU backend.
 *
 *   clang -g -O1 -fsanitize=fuzzer,address,undefined -o fuzz_model tests/fuzz/fuzz_model.c -lm -ldl -lpthread
 *   ./fuzz_model -max_total_time=60 -dict=tests/fuzz/fuzz_model.dict -len_control=0 corpus/
 *
 * Run from the repository root (the bases are models/tiny and three of tests/fixtures).  Each input
 * replaces one file of one base model directory: byte 0 picks the pair (fz_targets), the rest is the
 * file's new text.  A safetensors target's text is the file's JSON header only: the harness writes it
 * with its length in front of the base file's own data bytes, so that the fuzzer works on names,
 * dtypes, shapes and offsets rather than on weights.  The model is loaded (qsa_model_load, CPU
 * backend); a refused load must leave no model and name its reason, and a model that loads must run a
 * chat prompt (its template, tokenizer and sampling settings) and a few generated tokens without a
 * sanitizer report (ASan sees every read of the mapped files).
 *
 * libFuzzer cannot make a valid header from nothing, so the harness writes each target's unmodified
 * text into the first corpus directory on the command line as its seeds (up to 56 KB each: with
 * -len_control=0 the mutations start from their whole length at once). */
#define QSA_RUNTIME_IMPLEMENTATION
#include "../../qsa_runtime.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#define FZ_ASSERT(c) do { if (!(c)) { fprintf(stderr, "invariant failed: %s (line %d): %s\n", #c, __LINE__, qsa_last_error()); abort(); } } while (0)

typedef struct {
    const char *base; /* directory under the repository root */
    const char *file; /* the file an input replaces */
    int header;       /* a safetensors file: the input is its JSON header */
} fz_target;

static const fz_target fz_targets[] = {
    {"models/tiny", "model.safetensors", 1},
    {"models/tiny", "config.json", 0},
    {"models/tiny", "tokenizer.json", 0},
    {"models/tiny", "tokenizer_config.json", 0},
    {"models/tiny", "generation_config.json", 0},
    {"tests/fixtures/nvfp4_experts", "model.safetensors", 1},
    {"tests/fixtures/nvfp4_experts", "config.json", 0},
    {"tests/fixtures/nvfp4_experts", "hf_quant_config.json", 0},
    {"tests/fixtures/qsa_hc4_ple_sharded", "model.safetensors.index.json", 0},
    {"tests/fixtures/qsa_hc4_ple_sharded", "model-00003-of-00007.safetensors", 1},
};
#define FZ_NT ((int)(sizeof fz_targets / sizeof fz_targets[0]))

/* Per target: a private copy of its base directory, the original bytes of its file, and, for a
   safetensors file, where its data bytes start. */
static char fz_dir[FZ_NT][256];
static char *fz_orig[FZ_NT];
static size_t fz_orig_len[FZ_NT], fz_data_at[FZ_NT];
static int fz_verbose; /* $QSA_FUZZ_VERBOSE: each input's load result on stderr */

static void fz_write(const char *path, const void *a, size_t na, const void *b, size_t nb) {
    FILE *f = fopen(path, "wb");
    FZ_ASSERT(f != NULL);
    FZ_ASSERT(fwrite(a, 1, na, f) == na && (nb == 0 || fwrite(b, 1, nb, f) == nb));
    FZ_ASSERT(fclose(f) == 0);
}

/* Copies the base's files (flat directories) into a fresh directory under /dev/shm (or /tmp). */
static void fz_copy_base(int t) {
    const char *root = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
    snprintf(fz_dir[t], sizeof fz_dir[t], "%s/qsa_fuzz_model_%d_%d", root, (int)getpid(), t);
    FZ_ASSERT(mkdir(fz_dir[t], 0700) == 0);
    DIR *d = opendir(fz_targets[t].base);
    FZ_ASSERT(d != NULL);
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        const char *name = e->d_name;
        if (name[0] == '.' || !strcmp(name, "golden.safetensors")) continue;
        char src[512], dst[512];
        snprintf(src, sizeof src, "%s/%s", fz_targets[t].base, name);
        snprintf(dst, sizeof dst, "%s/%s", fz_dir[t], name);
        char *text;
        size_t len;
        FZ_ASSERT(qsa__read_file(src, &text, &len) == QSA_OK);
        fz_write(dst, text, len, NULL, 0);
        if (!strcmp(name, fz_targets[t].file)) { fz_orig[t] = text; fz_orig_len[t] = len; }
        else qsa__free(text);
    }
    closedir(d);
    FZ_ASSERT(fz_orig[t] != NULL);
    if (fz_targets[t].header) {
        uint64_t n = 0;
        FZ_ASSERT(fz_orig_len[t] >= 8);
        for (int i = 7; i >= 0; i--) n = n << 8 | (uint8_t)fz_orig[t][i];
        FZ_ASSERT(n <= fz_orig_len[t] - 8);
        fz_data_at[t] = 8 + (size_t)n;
    }
}

static void fz_remove_dirs(void) {
    for (int t = 0; t < FZ_NT; t++) {
        if (!fz_dir[t][0]) continue;
        DIR *d = opendir(fz_dir[t]);
        struct dirent *e;
        while (d && (e = readdir(d)) != NULL) {
            char p[512];
            snprintf(p, sizeof p, "%s/%s", fz_dir[t], e->d_name);
            if (e->d_name[0] != '.') remove(p);
        }
        if (d) closedir(d);
        rmdir(fz_dir[t]);
    }
}

/* The seed of target t: its byte, then the file's text (a safetensors file's header). */
static void fz_write_seed(const char *corpus, int t) {
    char path[512];
    snprintf(path, sizeof path, "%s/seed_%d", corpus, t);
    if (qsa__file_exists(path)) return;
    unsigned char b = (unsigned char)t;
    const char *text = fz_orig[t] + (fz_targets[t].header ? 8 : 0);
    size_t len = fz_targets[t].header ? fz_data_at[t] - 8 : fz_orig_len[t];
    fz_write(path, &b, 1, text, len);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    fz_verbose = getenv("QSA_FUZZ_VERBOSE") != NULL;
    for (int t = 0; t < FZ_NT; t++) fz_copy_base(t);
    atexit(fz_remove_dirs);
    for (int i = 1; i < *argc; i++) {
        const char *a = (*argv)[i];
        struct stat st;
        if (a[0] == '-' || stat(a, &st) != 0 || !S_ISDIR(st.st_mode)) continue;
        for (int t = 0; t < FZ_NT; t++) fz_write_seed(a, t);
        break;
    }
    return 0;
}

/* Writes target t's file from the input (or, with data NULL, its original bytes). */
static void fz_put(int t, const uint8_t *data, size_t size) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", fz_dir[t], fz_targets[t].file);
    if (!data) { fz_write(path, fz_orig[t], fz_orig_len[t], NULL, 0); return; }
    if (!fz_targets[t].header) { fz_write(path, data, size, NULL, 0); return; }
    unsigned char len8[8];
    for (int i = 0; i < 8; i++) len8[i] = (unsigned char)((uint64_t)size >> (8 * i));
    FILE *f = fopen(path, "wb");
    FZ_ASSERT(f != NULL);
    FZ_ASSERT(fwrite(len8, 1, 8, f) == 8 && (size == 0 || fwrite(data, 1, size, f) == size));
    size_t nd = fz_orig_len[t] - fz_data_at[t];
    FZ_ASSERT(nd == 0 || fwrite(fz_orig[t] + fz_data_at[t], 1, nd, f) == nd);
    FZ_ASSERT(fclose(f) == 0);
}

/* The prompt: a chat message through the model's template and tokenizer when it has one, else ids
   spread over its vocabulary. */
static int fz_prompt(qsa_model *m, int32_t *ids, int cap) {
    const qsa_tokenizer *tok = qsa_model_get_tokenizer(m);
    int vocab = qsa_model_get_config(m)->vocab_size;
    if (!tok) {
        for (int i = 0; i < cap; i++) ids[i] = (int32_t)((i * 7919 + 3) % vocab);
        return cap;
    }
    qsa_chat_message msg = {"user", "Hi, fuzz!"};
    char *text = NULL;
    int32_t *t = NULL;
    size_t n = 0;
    if (qsa_chat_apply_template(tok, &msg, 1, 1, &text) != QSA_OK) { FZ_ASSERT(text == NULL && qsa_last_error()[0]); return 0; }
    qsa_result r = qsa_tokenize(tok, text, strlen(text), 1, &t, &n);
    qsa_free(text);
    if (r != QSA_OK) { FZ_ASSERT(t == NULL && qsa_last_error()[0]); return 0; }
    int k = n < (size_t)cap ? (int)n : cap;
    for (int i = 0; i < k; i++) {
        FZ_ASSERT(t[i] >= 0 && t[i] < qsa_tokenizer_vocab_size(tok));
        ids[i] = t[i];
    }
    qsa_free(t);
    return k;
}

/* A prompt and a few generated tokens on a model that loaded: whatever the weights, the forward must
   stay inside its buffers (a NaN logit is the weights' business, not a bug), and a prompt the model
   cannot take (an id past its vocabulary: the tokenizer's may be larger) is refused with the sequence
   left as it was. */
static void fz_run(qsa_model *m) {
    int vocab = qsa_model_get_config(m)->vocab_size;
    qsa_seq_params sp;
    memset(&sp, 0, sizeof sp);
    sp.n_ctx = 48;
    qsa_seq *s = NULL;
    if (qsa_seq_create(m, &sp, &s) != QSA_OK) { FZ_ASSERT(s == NULL && qsa_last_error()[0]); return; }
    int32_t ids[32];
    int n = fz_prompt(m, ids, 32), fits = n > 0;
    for (int i = 0; i < n; i++) fits &= ids[i] < vocab;
    qsa_generate_params gp;
    memset(&gp, 0, sizeof gp);
    const qsa_generation_config *gc = qsa_model_get_generation_config(m);
    gp.sampling.temperature = gc->has_temperature ? gc->temperature : 0.0f;
    gp.sampling.top_k = gc->has_top_k ? gc->top_k : 0;
    gp.sampling.top_p = gc->has_top_p ? gc->top_p : 0.0f;
    gp.sampling.seed = 7;
    gp.max_tokens = 4;
    const char *stop[1] = {"\n"};
    gp.stop_strings = stop;
    gp.n_stop_strings = 1;
    qsa_generation g;
    memset(&g, 0, sizeof g);
    qsa_result r = qsa_generate(s, ids, n, &gp, &g);
    if (!fits) FZ_ASSERT(r != QSA_OK && qsa_seq_pos(s) == 0);
    if (r == QSA_OK) {
        FZ_ASSERT(g.n_tokens >= 0 && g.n_tokens <= gp.max_tokens && qsa_seq_pos(s) >= n);
        for (int i = 0; i < g.n_tokens; i++) FZ_ASSERT(g.tokens[i] >= 0 && g.tokens[i] < vocab);
    } else {
        FZ_ASSERT(qsa_last_error()[0] != 0);
    }
    qsa_generation_free(&g);
    qsa_seq_free(s);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    int t = data[0] % FZ_NT;
    fz_put(t, data + 1, size - 1);
    qsa_model_params mp;
    memset(&mp, 0, sizeof mp);
    mp.backend = QSA_BACKEND_CPU;
    mp.n_threads = 1;
    qsa_model *m = (qsa_model *)1;
    qsa_result r = qsa_model_load(fz_dir[t], &mp, &m);
    if (fz_verbose) fprintf(stderr, "fuzz_model: %s/%s: %s\n", fz_targets[t].base, fz_targets[t].file, r ? qsa_last_error() : "loaded");
    if (r != QSA_OK) {
        FZ_ASSERT(m == NULL && qsa_last_error()[0] != 0);
    } else {
        FZ_ASSERT(m != NULL);
        fz_run(m);
        qsa_model_free(m);
    }
    fz_put(t, NULL, 0);
    return 0;
}
