/* bench.c - performance of the CUDA backend against the measured limits of the GPU (issue 9).
 *
 *   tools/bench [--quick] [--config FILE] [--batches 1,8,32,128] [--no-long] [--out FILE.json] ...
 *   tools/bench --help
 *
 * One run measures, in this order, printing each result as soon as it is known and a compact
 * table (markdown) at the end:
 *   1. JIT: the kernel module compiled by NVRTC into an empty cache directory (cold: also an empty
 *      driver PTX cache, CUDA_CACHE_PATH, unless --keep-driver-cache), then loaded again from that
 *      disk cache (warm).  Both go through qsa__cuda_module, the runtime's own code.
 *   2. Ceilings: device copy bandwidth (cuMemcpyDtoDAsync of a large buffer; bytes read + written)
 *      and the FP16 WMMA matmul rate (qsa_k_gemm_f16 with M = N = K; FLOPs = 2MNK); plus the same
 *      GEMM with NVFP4 weights and the M = 1 (GEMV) forms of both, as diagnostics; and the launch
 *      floor: a CUDA graph of 1,000 dependent launches of a minimal kernel and of one that ends
 *      like the cross-warp GEMV (a ticket), per launch (a decode step is ~850 launches).
 *   3. A synthetic model at the real Qwen3.8-Flash-Next shape (or --config FILE, or --quick),
 *      generated directly on the GPU from a seed (load time = allocation + device fill).
 *   4. Prefill of an 8,192-token prompt (tok/s, TFLOP/s over the FLOPs counted from the shapes, %
 *      of the measured WMMA rate) and the time to first token (sequence creation + prefill + greedy
 *      pick of the first token on the host).
 *   5. Decode at batch 1, 8, 32, 128 (--batches) for contexts 8,192 and ~262,144: tok/s, bytes per
 *      token counted from the shapes, GB/s and % of the measured copy bandwidth.  Batch 1 runs
 *      the single-sequence call (qsa_seq_feed of one token) with the library's defaults (row
 *      "single": the batched step for a batch of one, replayed as a CUDA graph) and through the
 *      chunked forward (cuda_batch_decode off: "single, chunked forward"), and the batched path
 *      (qsa_seq_feed_batch with cuda_batch_decode = 1); larger batches run the batched path
 *      (--graphs adds rows with CUDA graphs, and rows with CUDA graphs and the greedy pick on the
 *      device, qsa_seq_feed_batch_greedy: "batched+graphs, greedy ids", B ids to the host instead
 *      of B x vocabulary logits, and two rows of top-k draws, T 0.6, top-k 20, top-p 0.95, timed with
 *      the draws on the host's clock: "top-k 20 drawn on the host" from B rows of logits, "top-k 20
 *      from device candidates" from B rows of 20 candidates, as the scheduler draws, and the same two with
 *      top-p 0.95 alone, "top-p 0.95 drawn on the host" / "from device candidates": a whole-row draw, from its
 *      256 best and the row's sum where those decide it, else from its logits, each row's note counting
 *      those, and the same two with the temperature alone, "temperature alone drawn on the host" / "from
 *      device candidates"); batch 1 then runs "single" once more ("single, again": the two
 *      should agree).  Each row's note gives its fastest and slowest step and an FNV-1a of its last
 *      step's logits (ids): the same tokens each run, so two runs of one tree under different launch
 *      switches ($QSA_MOE_HANDOFF=0, ...) must print the same.  The
 *      batched rows run after everything else, and a failure there is recorded in its row (a sticky
 *      CUDA error ends the run, the table is still printed).
 * Timings use CUDA events on the backend's stream (cuEventRecord / cuEventElapsedTime) around
 * each call, after warm-up calls; every number is the median of its repeats.
 *
 * SHORTCUTS (stated again in docs/PERFORMANCE.md)
 *   * Weights are random (seeded), made on the device by a small fill kernel compiled here with
 *     qsa__nvrtc_compile: dense FP16 ~ U(-a, a) with std 1/sqrt(in); NVFP4 experts with random
 *     nibbles, E4M3 block scales drawn from [0.5, 1.875] (codes 0x30..0x3f, never NaN) and a global
 *     scale giving std 1/sqrt(in); norms near 1; A_log/dt_bias giving per-token decays exp(g) of ~0.55 .. 0.99.  All
 *     512 experts of a layer share one allocation (pointers into it fill the qsa__dexpert table);
 *     the runtime allocates each matrix separately: the kernels see the same pointers and bytes.
 *   * The PLE table (host memory, as in the runtime) uses ngram_vocab_size_base = --ple-vocab-base
 *     (default 100,000 instead of 20,000,000: ~0.5 GB instead of ~100 GB); hashing and gathering
 *     cost the same per token.
 *   * Decode contexts are not prefilled: a sequence takes the KV pages for its context from the
 *     pool (whose K, V and indexer keys are filled with random values once), its completed-block
 *     keys, GDN conv and recurrent state are filled with random values on the device, and its host
 *     position, token history, block count and PLE id history are set.  The kernels then read
 *     exactly the bytes a prefilled sequence of that length makes them read (the selection of
 *     blocks differs, the amount does not).  The prefill row's sequence (really prefilled) is
 *     decoded too, as a check of the shortcut at batch 1.  The long context is
 *     max_position_embeddings minus the decode steps (the block-score buffers hold
 *     max_position_embeddings / r blocks).
 *
 * HOST FIELDS OF THE SYNTHETIC qsa_model (what the CUDA path reads on the host; nothing else is set)
 *   cfg                       every field, from qsa_config_parse (synthetic JSON or --config FILE)
 *   params                    backend CUDA, device, arch, max_chunk 512, max_batch = largest batch,
 *                             kv_page_size (--page-size, 0: the hybrid rule), kv_pool_tokens (planned
 *                             from the free memory), cuda_batch_decode / cuda_graphs (per row)
 *   pool                      qsa__pool_create(m, 0): page size, pages, slots, free list (no host pages)
 *   layers[l].type            the layer type
 *   layers[l].ple             PLE layers only: ple_index, mult (qsa__ple_multipliers), head_vocab /
 *                             head_offset (qsa__ple_head_vocabs with the smaller base), table (a
 *                             qsa__rows_view of one host F16 tensor [padded_vocab, D / n_heads])
 *   rope_inv_freq             as qsa__model_bind computes it (uploaded to cuda->rope_inv_freq)
 *   cuda                      the qsa__cuda built here: context, stream, kernel module, weights
 *                             (embed16, lm_head, final_hc, layers[] as qsa__cuda_upload lays them
 *                             out), device KV pool, scratch (qsa__cuda_scratch)
 *   Not set (read only by the checkpoint upload or the CPU backend): embed, lm_head, final_hc,
 *   layers[l].attn_hc/mlp_hc/gdn/attn/moe, st, tok, gen, owned.
 *
 * Exit status: 0 when every measurement ran, 1 when one failed (see the table), 2 without a usable
 * GPU / NVRTC or for bad arguments.
 */
#define QSA_RUNTIME_IMPLEMENTATION
#include "../qsa_runtime.h"

#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../examples/cli.h"

#ifdef QSA_NO_CUDA
int main(void) {
    fprintf(stderr, "bench: built with QSA_NO_CUDA: nothing to measure\n");
    return 2;
}
#else

#define BENCH_MAX_BATCHES 16
#define BENCH_MAX_ROWS 128
#define BENCH_MAX_SHAPES 16

typedef struct bench_opt {
    int quick, no_long, no_sampled, graphs, verbose, keep_driver_cache, no_ceilings, device, page_size, profile, marginal;
    int pageable_logits; /* --pageable-logits: the decode rows' logits into malloc's memory */
    int layers;          /* --layers: the built-in shape with this many layers (0: its own, 48 or 8) */
    int steps, warmup, prefill, ctx, prefill_reps, chunk, settle_ms;
    int batches[BENCH_MAX_BATCHES], n_batches;
    long long ple_base;
    const char *config, *out, *arch, *profiler_row;
    int gemv_n[BENCH_MAX_SHAPES], gemv_k[BENCH_MAX_SHAPES], n_gemv; /* --gemv-shapes */
    int gemv_m[BENCH_MAX_BATCHES], n_gemv_m;                         /* --gemv-m (default 1) */
    unsigned long long seed;
    double max_seconds;
    float sample_temp; /* --sample-temp: the temperature of the sampled rows (default 0.6) */
} bench_opt;

static void usage(FILE *f) {
    fprintf(f,
            "usage: tools/bench [options]\n"
            "Measures the CUDA backend on a synthetic model at the real Qwen3.8-Flash-Next shape, generated on\n"
            "the GPU, against ceilings measured in the same run (docs/PERFORMANCE.md).\n"
            "  --quick              a small model with the same layer pattern (smoke run, ~1 minute)\n"
            "  --config FILE        the model shape from a config.json (file, or a directory holding one)\n"
            "  --layers N           the built-in shape (real or --quick) with N layers in its pattern (3 GDN +\n"
            "                       1 QSA, repeated): e.g. batch 32 of the real shape's kernels on an 80 GB GPU\n"
            "  --batches LIST       decode batch sizes (default 1,8,32,128)\n"
            "  --ctx N              the short decode context (default 8192; --quick 2048)\n"
            "  --no-long            skip decode at the long context (max_position_embeddings)\n"
            "  --prefill N          prompt tokens of the prefill measurement (default 8192; --quick 2048)\n"
            "  --prefill-reps N     timed prefills (default 3)\n"
            "  --chunk N            tokens per prefill forward (max_chunk; default 512)\n"
            "  --steps N            timed decode steps per row (default 10; fewer when a row passes 4 s)\n"
            "  --settle-ms N        idle the GPU N ms before each decode row (default 0)\n"
            "  --warmup N           untimed decode steps before them (default 2)\n"
            "  --graphs             also measure batched decode replayed as CUDA graphs (with the rows of draws)\n"
            "  --no-sampled         with --graphs, leave out the rows of draws (top-k, top-p, the temperature alone)\n"
            "  --profile            after each eager decode row and the prefill, time every kernel launch\n"
            "                       (CUDA events; untimed extra steps) and print where the time goes\n"
            "  --marginal           after each batch's rows at the short context: what each of the costliest\n"
            "                       kernel shapes costs inside the graph-replayed step (the step without it, timed)\n"
            "  --profiler-row S     bracket the first decode row whose configuration contains S (e.g.\n"
            "                       \"B=32 ctx=8192 batched\") with cuProfilerStart/Stop, for\n"
            "                       ncu --profile-from-start off (its warm-up and timed steps only)\n"
            "  --ple-vocab-base N   ngram_vocab_size_base of the synthetic PLE table (default 100000; --quick 10000)\n"
            "  --page-size N        KV page size (default: the runtime's hybrid rule)\n"
            "  --seed N             weight/token seed (default 1)\n"
            "  --device N           CUDA device ordinal (default 0)\n"
            "  --arch A             NVRTC target (default: the runtime's choice, see README)\n"
            "  --max-seconds S      stop starting new measurements after S seconds (default 480)\n"
            "  --sample-temp T      the temperature of the rows with draws (default 0.6: Qwen3's; a random model's\n"
            "                       logits are flat there, so its top-p rows take the logits; a low T decides them)\n"
            "  --keep-driver-cache  leave CUDA_CACHE_PATH alone (the cold JIT may then hit the driver's cache)\n"
            "  --gemv-shapes LIST   FP16 GEMVs of these N x K shapes (e.g. 2560x6144,320x10240), each launch timed\n"
            "                       alone with L2 flushed before it and without, and 20 launches back to back\n"
            "                       over copies of the weights that L2 cannot hold (the rate in a chain)\n"
            "  --gemv-m LIST        the rows of A for --gemv-shapes (default 1; e.g. 1,32: a decode batch)\n"
            "  --pageable-logits    the logits of every row into pageable memory (malloc) instead of qsa_host_alloc's\n"
            "                       page-locked memory (what the copies cost without it)\n"
            "  --no-ceilings        skip the JIT cold/warm, copy-bandwidth, GEMM and GEMV measurements: kernels from\n"
            "                       the usual disk cache, rows without a fraction of a ceiling (quick iterations, ncu)\n"
            "  --out FILE.json      also write the results as JSON\n"
            "  -v                   runtime log at info level\n"
            "  -h, --help           this text\n"
            "Exit: 0 all measured, 1 a measurement failed, 2 no usable GPU/NVRTC or bad arguments.\n");
}

/* "NxK,NxK,..." -> n[i], k[i] (1 .. 2^20 each); the count, or -1 when malformed or more than max. */
static int parse_shapes(const char *v, int *n, int *k, int max) {
    int c = 0;
    for (const char *p = v; *p;) {
        char *end;
        long a = strtol(p, &end, 10), b = 0;
        if (end == p || *end != 'x') return -1;
        p = end + 1;
        b = strtol(p, &end, 10);
        if (end == p || a < 1 || b < 1 || a > (1 << 20) || b > (1 << 20) || c >= max || (*end && (*end != ',' || !end[1])))
            return -1;
        n[c] = (int)a;
        k[c++] = (int)b;
        p = *end ? end + 1 : end;
    }
    return c;
}

static int parse_list(const char *s, int *out, int cap) {
    int n = 0;
    while (*s) {
        char *end;
        long v = strtol(s, &end, 10);
        if (end == s || v < 1 || v > 512 || n == cap) return -1;
        out[n++] = (int)v;
        s = end;
        if (*s == ',') s++;
        else if (*s) return -1;
    }
    return n;
}

static int parse_args(int argc, char **argv, bench_opt *o) {
    memset(o, 0, sizeof *o);
    o->steps = 10;
    o->warmup = 2;
    o->prefill_reps = 3;
    o->chunk = 512;
    o->ple_base = -1;
    o->seed = 1;
    o->max_seconds = 480;
    o->sample_temp = 0.6f;
    o->prefill = -1;
    o->ctx = -1;
    int dflt[4] = {1, 8, 32, 128};
    memcpy(o->batches, dflt, sizeof dflt);
    o->n_batches = 4;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) return 1;
        if (!strcmp(a, "--quick")) { o->quick = 1; continue; }
        if (!strcmp(a, "--no-long")) { o->no_long = 1; continue; }
        if (!strcmp(a, "--no-sampled")) { o->no_sampled = 1; continue; }
        if (!strcmp(a, "--graphs")) { o->graphs = 1; continue; }
        if (!strcmp(a, "--profile")) { o->profile = 1; continue; }
        if (!strcmp(a, "--marginal")) { o->marginal = 1; continue; }
        if (!strcmp(a, "--keep-driver-cache")) { o->keep_driver_cache = 1; continue; }
        if (!strcmp(a, "--no-ceilings")) { o->no_ceilings = 1; continue; }
        if (!strcmp(a, "--pageable-logits")) { o->pageable_logits = 1; continue; }
        if (!strcmp(a, "-v")) { o->verbose = 1; continue; }
        if (!v) { fprintf(stderr, "bench: %s needs a value (see --help)\n", a); return -1; }
        i++;
        if (!strcmp(a, "--config")) o->config = v;
        else if (!strcmp(a, "--out")) o->out = v;
        else if (!strcmp(a, "--layers")) o->layers = atoi(v);
        else if (!strcmp(a, "--arch")) o->arch = v;
        else if (!strcmp(a, "--profiler-row")) o->profiler_row = v;
        else if (!strcmp(a, "--gemv-shapes")) {
            o->n_gemv = parse_shapes(v, o->gemv_n, o->gemv_k, BENCH_MAX_SHAPES);
            if (o->n_gemv <= 0) {
                fprintf(stderr, "bench: --gemv-shapes %s: expected a list like 2560x6144,320x10240 (at most %d)\n", v,
                        BENCH_MAX_SHAPES);
                return -1;
            }
        }
        else if (!strcmp(a, "--gemv-m")) {
            o->n_gemv_m = parse_list(v, o->gemv_m, BENCH_MAX_BATCHES);
            if (o->n_gemv_m <= 0) { fprintf(stderr, "bench: --gemv-m %s: expected a list like 1,32 (1..512)\n", v); return -1; }
        }
        else if (!strcmp(a, "--batches")) {
            o->n_batches = parse_list(v, o->batches, BENCH_MAX_BATCHES);
            if (o->n_batches <= 0) { fprintf(stderr, "bench: --batches %s: expected a list like 1,8,32 (1..512)\n", v); return -1; }
        } else if (!strcmp(a, "--ctx")) o->ctx = atoi(v);
        else if (!strcmp(a, "--prefill")) o->prefill = atoi(v);
        else if (!strcmp(a, "--prefill-reps")) o->prefill_reps = atoi(v);
        else if (!strcmp(a, "--chunk")) o->chunk = atoi(v);
        else if (!strcmp(a, "--steps")) o->steps = atoi(v);
        else if (!strcmp(a, "--warmup")) o->warmup = atoi(v);
        else if (!strcmp(a, "--settle-ms")) o->settle_ms = atoi(v);
        else if (!strcmp(a, "--ple-vocab-base")) o->ple_base = atoll(v);
        else if (!strcmp(a, "--page-size")) o->page_size = atoi(v);
        else if (!strcmp(a, "--seed")) o->seed = strtoull(v, NULL, 10);
        else if (!strcmp(a, "--device")) o->device = atoi(v);
        else if (!strcmp(a, "--max-seconds")) o->max_seconds = atof(v);
        else if (!strcmp(a, "--sample-temp")) o->sample_temp = (float)atof(v);
        else { fprintf(stderr, "bench: unknown option %s (see --help)\n", a); return -1; }
    }
    if (o->prefill < 0) o->prefill = o->quick ? 2048 : 8192;
    if (o->ple_base < 0) o->ple_base = o->quick ? 10000 : 100000;
    if (o->ctx < 0) o->ctx = o->quick ? 2048 : 8192;
    if (o->steps < 3 || o->warmup < 1 || o->prefill < 1 || o->ctx < 1 || o->prefill_reps < 1 || o->ple_base < 2 ||
        o->chunk < 1 || o->max_seconds <= 0 || (o->page_size && o->page_size < 16) || !(o->sample_temp > 0 && o->sample_temp < 1e30f)) {
        fprintf(stderr, "bench: --steps >= 3, --warmup >= 1, --prefill/--ctx/--prefill-reps >= 1, --ple-vocab-base >= 2, "
                        "--chunk >= 1, --page-size 0 or >= 16, --sample-temp > 0\n");
        return -1;
    }
    if (o->layers && (o->config || o->layers < 1 || o->layers > QSA_MAX_LAYERS)) {
        fprintf(stderr, "bench: --layers 1..%d, and not with --config (the file gives its layers)\n", QSA_MAX_LAYERS);
        return -1;
    }
    return 0;
}

/* ---- the model shape ---- */

/* The real shape (issue 9), a printf format of its layer count (48).  Fields not given take the reference
   config's defaults. */
static const char *const bench_real_json =
    "{\"model_type\": \"qwen4_exp_text\", \"vocab_size\": 248320, \"hidden_size\": 2560, \"num_hidden_layers\": %d,"
    " \"num_attention_heads\": 24, \"num_key_value_heads\": 2, \"head_dim\": 256, \"max_position_embeddings\": 262144,"
    " \"rms_norm_eps\": 1e-6, \"hidden_act\": \"silu\","
    " \"rope_parameters\": {\"rope_type\": \"default\", \"rope_theta\": 10000000, \"partial_rotary_factor\": 0.25},"
    " \"full_attention_interval\": 4,"
    " \"linear_conv_kernel_dim\": 4, \"linear_key_head_dim\": 128, \"linear_value_head_dim\": 128,"
    " \"linear_num_key_heads\": 16, \"linear_num_value_heads\": 48,"
    " \"num_experts\": 512, \"num_experts_per_tok\": 10, \"moe_intermediate_size\": 640,"
    " \"shared_expert_intermediate_size\": 640, \"norm_topk_prob\": true,"
    " \"hc_count\": 4, \"hc_lowrank\": 320, \"ple_layer_ids\": [1], \"eos_token_id\": 248044,"
    " \"indexer_n_heads\": 4, \"indexer_kv_heads\": 1, \"indexer_head_dim\": 128, \"indexer_budget\": 2048,"
    " \"indexer_compress_ratio\": 4,"
    " \"quantization_config\": {\"quant_method\": \"modelopt\", \"quant_algo\": \"NVFP4\", \"group_size\": 16}}";

/* --quick: the same layer pattern (3 GDN + 1 QSA, repeated; PLE on layer 1), small sizes; 8 layers. */
static const char *const bench_quick_json =
    "{\"model_type\": \"qwen4_exp_text\", \"vocab_size\": 32768, \"hidden_size\": 512, \"num_hidden_layers\": %d,"
    " \"num_attention_heads\": 8, \"num_key_value_heads\": 2, \"head_dim\": 128, \"max_position_embeddings\": 32768,"
    " \"rms_norm_eps\": 1e-6, \"hidden_act\": \"silu\","
    " \"rope_parameters\": {\"rope_type\": \"default\", \"rope_theta\": 10000000, \"partial_rotary_factor\": 0.25},"
    " \"full_attention_interval\": 4,"
    " \"linear_conv_kernel_dim\": 4, \"linear_key_head_dim\": 64, \"linear_value_head_dim\": 64,"
    " \"linear_num_key_heads\": 4, \"linear_num_value_heads\": 8,"
    " \"num_experts\": 64, \"num_experts_per_tok\": 4, \"moe_intermediate_size\": 128,"
    " \"shared_expert_intermediate_size\": 128, \"norm_topk_prob\": true,"
    " \"hc_count\": 4, \"hc_lowrank\": 64, \"ple_layer_ids\": [1], \"eos_token_id\": 32000,"
    " \"indexer_n_heads\": 2, \"indexer_kv_heads\": 1, \"indexer_head_dim\": 64, \"indexer_budget\": 512,"
    " \"indexer_compress_ratio\": 4,"
    " \"quantization_config\": {\"quant_method\": \"modelopt\", \"quant_algo\": \"NVFP4\", \"group_size\": 16}}";

static qsa_result bench_config(const bench_opt *o, qsa_model_config *c) {
    qsa_result r;
    if (o->config) {
        struct stat st;
        if (stat(o->config, &st) == 0 && S_ISDIR(st.st_mode)) r = qsa_config_load_dir(o->config, c);
        else {
            char *text;
            size_t len;
            QSA__TRY(qsa__read_file(o->config, &text, &len));
            r = qsa_config_parse(text, len, NULL, 0, o->config, c);
            qsa__free(text);
        }
    } else {
        char j[2048]; /* (either text is about 1,100 characters) */
        snprintf(j, sizeof j, o->quick ? bench_quick_json : bench_real_json, o->layers ? o->layers : o->quick ? 8 : 48);
        r = qsa_config_parse(j, strlen(j), NULL, 0, o->quick ? "bench --quick shape" : "bench real shape", c);
    }
    QSA__TRY(r);
    if (c->n_ple_layers) c->ngram_vocab_size_base = o->ple_base; /* the smaller table (see the top comment) */
    return QSA_OK;
}

/* What the kernels need of the shape (the runtime checks most of these when it meets them). */
static qsa_result bench_check_shape(const qsa_model_config *c) {
    int H = c->hidden_size, I = c->moe_intermediate_size;
    if (H % 16 || I % 16)
        return qsa__fail(QSA_ERR_UNSUPPORTED, "shape: NVFP4 experts need hidden_size (%d) and moe_intermediate_size (%d) "
                         "divisible by 16", H, I);
    if (c->head_dim % 32 || c->head_dim > 256)
        return qsa__fail(QSA_ERR_UNSUPPORTED, "shape: the sparse attention kernel needs head_dim %% 32 == 0 and <= 256, found %d",
                         c->head_dim);
    if (c->has_qsa && c->rotary_dim > c->indexer_head_dim)
        return qsa__fail(QSA_ERR_UNSUPPORTED, "shape: rotary_dim %d > indexer_head_dim %d", c->rotary_dim, c->indexer_head_dim);
    if (c->linear_key_head_dim > 512)
        return qsa__fail(QSA_ERR_UNSUPPORTED, "shape: linear_key_head_dim %d > 512", c->linear_key_head_dim);
    if (c->linear_num_value_heads > c->hc_lowrank)
        return qsa__fail(QSA_ERR_UNSUPPORTED, "shape: linear_num_value_heads %d > hc_lowrank %d (GDN scratch)",
                         c->linear_num_value_heads, c->hc_lowrank);
    if (c->n_ple_layers && c->ngram_size > 16)
        return qsa__fail(QSA_ERR_UNSUPPORTED, "shape: ngram_size %d > 16", c->ngram_size);
    if (c->num_experts_per_tok > 64) return qsa__fail(QSA_ERR_UNSUPPORTED, "shape: num_experts_per_tok > 64");
    return QSA_OK;
}

/* ---- results ---- */

typedef struct bench_row {
    char what[40];    /* "decode", "prefill", ... */
    char config[64];  /* "B=8 ctx=8192 batched" */
    int status;       /* 0 measured, 1 skipped, 2 failed */
    double ms;        /* median time of one call (step, prefill, copy, GEMM, compile) */
    double tok_s;     /* tokens per second (decode, prefill), 0 when not a token rate */
    double per_tok;   /* bytes (unit 'B') or FLOPs ('F') per token; per call for the ceilings */
    char unit;        /* 'B', 'F' or 0 */
    double achieved;  /* GB/s (unit B) or TFLOP/s (unit F) */
    double frac;      /* of the measured ceiling; < 0: not applicable */
    int n;            /* repeats behind the median */
    char note[512];
} bench_row;

typedef struct bench_counts {
    double dense_bytes;   /* FP16 matrices read once per decode step: every layer's, the final mixer's (lm_head apart) */
    double vec_bytes;     /* FP32 vectors (norms, conv, gates), also read once per step */
    double lm_head_bytes;
    double embed_bytes;   /* the embedding table (a step reads one row per token) */
    double dense_macs;    /* multiply-adds per token of the dense matmuls, lm_head excluded */
    double lm_head_macs;
    double expert_bytes;  /* one expert's three NVFP4 matrices: nibbles + E4M3 scales */
    double expert_macs;   /* one expert's multiply-adds per token */
    double weights_total; /* device bytes of all weights */
} bench_counts;

typedef struct bench {
    bench_opt o;
    qsa_model_config cfg;
    qsa_model *m;
    qsa__cuda *g;
    qsa__gpu_info info;
    CUmodule fillmod;
    CUfunction f_f16, f_f32, f_words, f_e4m3, f_step, f_ticket;
    CUevent ev0, ev1;
    int dry;                    /* building: count only */
    bench_counts cnt;
    unsigned long long seq_no;  /* fill seeds */
    uint64_t rng;               /* host RNG (token ids) */
    double copy_gbs, wmma_tflops;
    CUdeviceptr pool_mem[3];    /* the KV pool (K, V, indexer keys), re-sized per context */
    long long pool_tokens;
    double jit_cold_s, jit_warm_s, load_s;
    bench_row rows[BENCH_MAX_ROWS];
    int nrows, failed, broken, profiler_done;
    double t_start;
    char tmpdir[256];
    char note_buf[512];
    /* NVML (libnvidia-ml.so.1, optional): the SM clock and its event reasons after each timed decode step */
    int nvml_tried;
    void *nvml_lib, *nvml_dev;
    int (*nvml_clock)(void *dev, int type, unsigned *mhz);
    int (*nvml_reasons)(void *dev, unsigned long long *mask);
} bench;

static bench_row *row_add(bench *b, const char *what, const char *config) {
    bench_row *r = &b->rows[b->nrows < BENCH_MAX_ROWS ? b->nrows++ : BENCH_MAX_ROWS - 1];
    memset(r, 0, sizeof *r);
    snprintf(r->what, sizeof r->what, "%s", what);
    snprintf(r->config, sizeof r->config, "%s", config);
    r->frac = -1;
    return r;
}

static const char *fmt_bytes(double v, char *buf, size_t n) {
    if (v >= 1e9) snprintf(buf, n, "%.2f GB", v / 1e9);
    else if (v >= 1e6) snprintf(buf, n, "%.2f MB", v / 1e6);
    else if (v >= 1e3) snprintf(buf, n, "%.1f kB", v / 1e3);
    else snprintf(buf, n, "%.0f B", v);
    return buf;
}

static void row_print(const bench_row *r) {
    char pb[32];
    printf("  %-16s %-28s ", r->what, r->config);
    if (r->status == 1) { printf("skipped: %s\n", r->note); fflush(stdout); return; }
    if (r->status == 2) { printf("FAILED: %s\n", r->note); fflush(stdout); return; }
    printf("%10.3f ms", r->ms);
    if (r->tok_s > 0) printf("  %10.1f tok/s", r->tok_s);
    if (r->unit == 'B') printf("  %s/%s  %8.1f GB/s", fmt_bytes(r->per_tok, pb, sizeof pb), r->tok_s > 0 ? "tok" : "call", r->achieved);
    if (r->unit == 'F') printf("  %.3g FLOP/%s  %7.1f TFLOP/s", r->per_tok, r->tok_s > 0 ? "tok" : "call", r->achieved);
    if (r->frac >= 0) printf("  = %.1f%% of %s", 100 * r->frac, r->unit == 'F' ? "WMMA" : "copy");
    if (r->note[0]) printf("  (%s)", r->note);
    printf("\n");
    fflush(stdout);
}

static void row_fail(bench *b, const char *what, const char *config, qsa_result r) {
    bench_row *w = row_add(b, what, config);
    w->status = 2;
    snprintf(w->note, sizeof w->note, "%s: %.440s", qsa_result_string(r), qsa_last_error());
    b->failed = 1;
    row_print(w);
    /* a sticky error (illegal address, launch failure) poisons the context: stop using the GPU */
    if (b->g && qsa__cu.cuCtxSynchronize() != 0) {
        b->broken = 1;
        fprintf(stderr, "bench: the CUDA context is no longer usable after this failure: the remaining measurements are skipped\n");
    }
}

static void row_skip(bench *b, const char *what, const char *config, const char *why) {
    bench_row *w = row_add(b, what, config);
    w->status = 1;
    snprintf(w->note, sizeof w->note, "%s", why);
    row_print(w);
}

/* 0 when the run may start another measurement (no broken context, within the time budget). */
static int may_run(bench *b, const char *what, const char *config) {
    if (b->broken) { row_skip(b, what, config, "the CUDA context failed earlier"); return 0; }
    if (qsa__now() - b->t_start > b->o.max_seconds) { row_skip(b, what, config, "--max-seconds budget spent"); return 0; }
    return 1;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}
static double median(double *v, int n) {
    if (n <= 0) return 0;
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static uint64_t rng_next(bench *b) {
    b->rng ^= b->rng << 13;
    b->rng ^= b->rng >> 7;
    b->rng ^= b->rng << 17;
    return b->rng;
}

/* ---- device helpers: events, fills ---- */

static qsa_result ev_begin(bench *b) { return QSA__CU_R(qsa__cu.cuEventRecord(b->ev0, b->g->stream)); }
static qsa_result ev_end(bench *b, double *ms) {
    float f = 0;
    QSA__CU(qsa__cu.cuEventRecord(b->ev1, b->g->stream));
    QSA__CU(qsa__cu.cuEventSynchronize(b->ev1));
    QSA__CU(qsa__cu.cuEventElapsedTime(&f, b->ev0, b->ev1));
    *ms = f;
    return QSA_OK;
}

/* Counter-based random fills (splitmix64 of seed and index): no state, any grid. */
static const char *const bench_fill_src =
    "typedef unsigned long long u64;\n"
    "__device__ inline u64 bench_mix(u64 v) {\n"
    "    v += 0x9E3779B97F4A7C15ull;\n"
    "    v = (v ^ (v >> 30)) * 0xBF58476D1CE4E5B9ull;\n"
    "    v = (v ^ (v >> 27)) * 0x94D049BB133111EBull;\n"
    "    return v ^ (v >> 31);\n"
    "}\n"
    "__device__ inline float bench_unif(u64 seed, u64 i) { /* [-1, 1) */\n"
    "    return (float)(bench_mix(seed * 0xD1342543DE82EF95ull + i) >> 40) * (1.0f / 8388608.0f) - 1.0f;\n"
    "}\n"
    "extern \"C\" __global__ void bench_fill_f16(unsigned short *p, u64 n, u64 seed, float scale, float offset) {\n"
    "    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x) {\n"
    "        float f = offset + scale * bench_unif(seed, i);\n"
    "        unsigned short h;\n"
    "        asm(\"cvt.rn.f16.f32 %0, %1;\" : \"=h\"(h) : \"f\"(f));\n"
    "        p[i] = h;\n"
    "    }\n"
    "}\n"
    "extern \"C\" __global__ void bench_fill_f32(float *p, u64 n, u64 seed, float scale, float offset) {\n"
    "    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x)\n"
    "        p[i] = offset + scale * bench_unif(seed, i);\n"
    "}\n"
    "extern \"C\" __global__ void bench_fill_words(unsigned int *p, u64 n, u64 seed) {\n"
    "    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x)\n"
    "        p[i] = (unsigned int)(bench_mix(seed * 0xD1342543DE82EF95ull + i) >> 16);\n"
    "}\n"
    "extern \"C\" __global__ void bench_fill_e4m3(unsigned char *p, u64 n, u64 seed, unsigned int lo, unsigned int span) {\n"
    "    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x)\n"
    "        p[i] = (unsigned char)(lo + (unsigned int)(bench_mix(seed * 0xD1342543DE82EF95ull + i) >> 33) % span);\n"
    "}\n"
    /* the launch floor (bench_launch_floor): the runtime kernels' entry (the PDL wait and trigger on
       sm_90+), then one float per thread; or that, a release ticket, and the last block summing 64
       values through L2 (the ending of the cross-warp GEMV) */
    "#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900\n"
    "#define BENCH_PDL() asm volatile(\"griddepcontrol.wait;\\n\\tgriddepcontrol.launch_dependents;\" ::: \"memory\")\n"
    "#else\n"
    "#define BENCH_PDL() ((void)0)\n"
    "#endif\n"
    "extern \"C\" __global__ void bench_step(float *x) {\n"
    "    BENCH_PDL();\n"
    "    const unsigned i = blockIdx.x * blockDim.x + threadIdx.x;\n"
    "    x[i] = x[i] * 0.5f + 1.0f;\n"
    "}\n"
    "extern \"C\" __global__ void bench_ticket(float *x, unsigned int *count) {\n"
    "    BENCH_PDL();\n"
    "    __shared__ unsigned int last;\n"
    "    const unsigned i = blockIdx.x * blockDim.x + threadIdx.x;\n"
    "    x[i] = x[i] * 0.5f + 1.0f;\n"
    "    __syncthreads();\n"
    "    if (threadIdx.x == 0) {\n"
    "        __threadfence();\n"
    "        last = atomicAdd(count, 1u) == gridDim.x - 1u;\n"
    "    }\n"
    "    __syncthreads();\n"
    "    if (!last) return;\n"
    "    __threadfence();\n"
    "    float s = 0.0f;\n"
    "    for (int k = 0; k < 64; k++) s += __ldcg(x + k * blockDim.x + threadIdx.x); /* x holds >= 64 blocks' */\n"
    "    x[threadIdx.x] = s;\n"
    "    if (threadIdx.x == 0) *count = 0u;\n"
    "}\n";

static qsa_result fill_module(bench *b) {
    static const char *const opts[] = {"--std=c++14"};
    char *img = NULL;
    size_t len = 0;
    QSA__TRY(qsa__nvrtc_compile(bench_fill_src, "bench_fill.cu", opts, 1, b->g->arch, &img, &len, NULL));
    qsa_result r = QSA__CU_R(qsa__cu.cuModuleLoadData(&b->fillmod, img));
    qsa__free(img);
    QSA__TRY(r);
    QSA__CU(qsa__cu.cuModuleGetFunction(&b->f_f16, b->fillmod, "bench_fill_f16"));
    QSA__CU(qsa__cu.cuModuleGetFunction(&b->f_f32, b->fillmod, "bench_fill_f32"));
    QSA__CU(qsa__cu.cuModuleGetFunction(&b->f_words, b->fillmod, "bench_fill_words"));
    QSA__CU(qsa__cu.cuModuleGetFunction(&b->f_e4m3, b->fillmod, "bench_fill_e4m3"));
    QSA__CU(qsa__cu.cuModuleGetFunction(&b->f_step, b->fillmod, "bench_step"));
    QSA__CU(qsa__cu.cuModuleGetFunction(&b->f_ticket, b->fillmod, "bench_ticket"));
    return QSA_OK;
}

static unsigned fill_grid(bench *b, unsigned long long n) {
    unsigned long long want = (n + 255) / 256, cap = (unsigned long long)(b->info.sm_count > 0 ? b->info.sm_count : 80) * 32;
    return (unsigned)(want < 1 ? 1 : want > cap ? cap : want);
}

/* FP16 values offset + U(-half, half) */
static qsa_result fill_f16(bench *b, CUdeviceptr p, size_t n, float half, float offset) {
    unsigned long long nn = n, seed = b->o.seed * 1000003ull + ++b->seq_no;
    void *args[] = {&p, &nn, &seed, &half, &offset};
    return qsa__cu_launch(b->f_f16, "bench_fill_f16", fill_grid(b, nn), 1, 1, 256, 1, 1, 0, b->g->stream, args);
}
static qsa_result fill_f32(bench *b, CUdeviceptr p, size_t n, float half, float offset) {
    unsigned long long nn = n, seed = b->o.seed * 1000003ull + ++b->seq_no;
    void *args[] = {&p, &nn, &seed, &half, &offset};
    return qsa__cu_launch(b->f_f32, "bench_fill_f32", fill_grid(b, nn), 1, 1, 256, 1, 1, 0, b->g->stream, args);
}
/* random bytes (n % 4 == 0) */
static qsa_result fill_bytes(bench *b, CUdeviceptr p, size_t n) {
    unsigned long long nn = n / 4, seed = b->o.seed * 1000003ull + ++b->seq_no;
    void *args[] = {&p, &nn, &seed};
    if (n % 4) return qsa__fail(QSA_ERR_INTERNAL, "fill_bytes: %zu is not a multiple of 4", n);
    return qsa__cu_launch(b->f_words, "bench_fill_words", fill_grid(b, nn), 1, 1, 256, 1, 1, 0, b->g->stream, args);
}
/* E4M3 codes lo .. lo+span-1 */
static qsa_result fill_e4m3(bench *b, CUdeviceptr p, size_t n, unsigned lo, unsigned span) {
    unsigned long long nn = n, seed = b->o.seed * 1000003ull + ++b->seq_no;
    void *args[] = {&p, &nn, &seed, &lo, &span};
    return qsa__cu_launch(b->f_e4m3, "bench_fill_e4m3", fill_grid(b, nn), 1, 1, 256, 1, 1, 0, b->g->stream, args);
}

/* ---- the synthetic weights: built on the device, or only counted (b->dry) ---- */

/* E2M1 values with random nibbles: rms sqrt(mean(0, .25, 1, 2.25, 4, 9, 16, 36)) = 2.926; the E4M3
   scales drawn from 0x30..0x3f (0.5 .. 1.875) have rms ~1.24. */
#define BENCH_E2M1_RMS 2.926f
#define BENCH_E4M3_RMS 1.24f
#define BENCH_SQRT3 1.7320508f

static qsa_result bw_dense(bench *b, qsa__dlin *d, int out, int in, float stdev, int lm_head) {
    double n = (double)out * in;
    if (lm_head) { b->cnt.lm_head_bytes += 2 * n; b->cnt.lm_head_macs += n; }
    else { b->cnt.dense_bytes += 2 * n; b->cnt.dense_macs += n; }
    b->cnt.weights_total += 2 * n;
    if (b->dry) return QSA_OK;
    memset(d, 0, sizeof *d);
    d->out = out;
    d->in = in;
    QSA__TRY(qsa__dalloc(b->g, &d->w16, (size_t)out * in * 2, &b->g->bytes_weights, "synthetic dense weight"));
    return fill_f16(b, d->w16, (size_t)out * in, stdev * BENCH_SQRT3, 0.0f);
}

static qsa_result bw_vec(bench *b, CUdeviceptr *p, size_t n, float half, float offset) {
    b->cnt.vec_bytes += 4.0 * n;
    b->cnt.weights_total += 4.0 * n;
    if (b->dry) return QSA_OK;
    QSA__TRY(qsa__dalloc(b->g, p, n * 4, &b->g->bytes_weights, "synthetic vector"));
    return fill_f32(b, *p, n, half, offset);
}

static qsa_result bw_gres(bench *b, qsa__dgres *d, int with_inject) {
    const qsa_model_config *c = &b->cfg;
    int hcH = c->hc_count * c->hidden_size;
    QSA__TRY(bw_vec(b, &d->norm_w, (size_t)hcH, 0.1f, 0.0f));
    QSA__TRY(bw_dense(b, &d->down, c->hc_lowrank, hcH, 1.0f / sqrtf((float)hcH), 0));
    QSA__TRY(bw_dense(b, &d->up, hcH, c->hc_lowrank, 1.0f / sqrtf((float)c->hc_lowrank), 0));
    if (with_inject) QSA__TRY(bw_dense(b, &d->inject, c->hc_count, hcH, 1.0f / sqrtf((float)hcH), 0));
    return QSA_OK;
}

static size_t round256(size_t v) { return (v + 255) & ~(size_t)255; }

/* All experts of a layer: one allocation of nibbles and one of scales; the table points into them. */
static qsa_result bw_experts(bench *b, qsa__dlayer *d) {
    const qsa_model_config *c = &b->cfg;
    size_t E = (size_t)c->num_experts, H = (size_t)c->hidden_size, I = (size_t)c->moe_intermediate_size;
    size_t q1 = round256(I * H / 2), s1 = round256(I * H / 16); /* one matrix: [I][H/2] or [H][I/2] */
    b->cnt.expert_bytes = 3.0 * ((double)I * H / 2 + (double)I * H / 16);
    b->cnt.expert_macs = 3.0 * (double)I * H;
    b->cnt.weights_total += (double)E * 3 * (q1 + s1) + sizeof(qsa__dexpert) * (double)E;
    if (b->dry) return QSA_OK;
    qsa__cuda *g = b->g;
    CUdeviceptr Q, S;
    QSA__TRY(qsa__dalloc(g, &Q, E * 3 * q1, &g->bytes_weights, "synthetic NVFP4 experts"));
    QSA__TRY(qsa__dalloc(g, &S, E * 3 * s1, &g->bytes_weights, "synthetic NVFP4 expert scales"));
    QSA__TRY(fill_bytes(b, Q, E * 3 * q1));
    QSA__TRY(fill_e4m3(b, S, E * 3 * s1, 0x30, 16));
    /* global scales: std of w = e2m1 * e4m3 * s2 equal to 1/sqrt(in) */
    float s2_h = 1.0f / (sqrtf((float)H) * BENCH_E2M1_RMS * BENCH_E4M3_RMS);
    float s2_i = 1.0f / (sqrtf((float)I) * BENCH_E2M1_RMS * BENCH_E4M3_RMS);
    qsa__dexpert *ex = QSA__CALLOC(qsa__dexpert, E);
    if (!ex) return qsa__fail(QSA_ERR_OUT_OF_MEMORY, "bench: out of host memory");
    for (size_t e = 0; e < E; e++) {
        CUdeviceptr q = Q + e * 3 * q1, s = S + e * 3 * s1;
        ex[e].gate_q = q;          ex[e].gate_s = s;          ex[e].gate_s2 = s2_h;
        ex[e].up_q = q + q1;       ex[e].up_s = s + s1;       ex[e].up_s2 = s2_h;
        ex[e].down_q = q + 2 * q1; ex[e].down_s = s + 2 * s1; ex[e].down_s2 = s2_i;
    }
    qsa_result r = qsa__dupload(g, &d->experts, ex, sizeof(qsa__dexpert) * E, "expert table");
    qsa__free(ex);
    d->experts_nvfp4 = 1;
    return r;
}

/* Every weight qsa__cuda_upload would create, in its layout, from the seed (or only counted). */
static qsa_result bench_build_weights(bench *b) {
    const qsa_model_config *c = &b->cfg;
    qsa__cuda *g = b->g;
    int H = c->hidden_size, hc = c->hc_count, hcH = hc * H, V = c->vocab_size;
    int nk = c->linear_num_key_heads, nv = c->linear_num_value_heads, dk = c->linear_key_head_dim, dv = c->linear_value_head_dim;
    int key_dim = nk * dk, value_dim = nv * dv, conv_dim = 2 * key_dim + value_dim, Kc = c->linear_conv_kernel_dim;
    int nh = c->num_attention_heads, nkv = c->num_key_value_heads, hd = c->head_dim;
    int E = c->num_experts, Is = c->shared_expert_intermediate_size, D = c->ple_embed_dim;
    float sH = 1.0f / sqrtf((float)H);
    static qsa__cuda dry_g;
    static qsa__dlayer dry_layer;
    memset(&b->cnt, 0, sizeof b->cnt);
    if (b->dry) g = &dry_g;
    /* the embedding table: a step reads one row per token */
    b->cnt.embed_bytes = 2.0 * V * H;
    b->cnt.weights_total += 2.0 * V * H;
    if (!b->dry) {
        QSA__TRY(qsa__dalloc(g, &g->embed16, (size_t)V * H * 2, &g->bytes_weights, "synthetic embed_tokens"));
        QSA__TRY(fill_f16(b, g->embed16, (size_t)V * H, BENCH_SQRT3, 0.0f));
    }
    QSA__TRY(bw_dense(b, &g->lm_head, V, H, sH, 1));
    QSA__TRY(bw_gres(b, &g->final_hc, 0));
    if (!b->dry) {
        QSA__TRY(qsa__dupload(g, &g->rope_inv_freq, b->m->rope_inv_freq, sizeof(float) * (size_t)(c->rotary_dim / 2 + 1), "rope"));
        g->layers = QSA__CALLOC(qsa__dlayer, c->num_hidden_layers);
        if (!g->layers) return qsa__fail(QSA_ERR_OUT_OF_MEMORY, "bench: out of host memory");
    }
    for (int l = 0; l < c->num_hidden_layers; l++) {
        qsa__dlayer *d = b->dry ? &dry_layer : &g->layers[l];
        QSA__TRY(bw_gres(b, &d->attn_hc, 1));
        QSA__TRY(bw_gres(b, &d->mlp_hc, 1));
        if (c->layer_types[l] == QSA_LAYER_LINEAR) {
            QSA__TRY(bw_dense(b, &d->in_qkv, conv_dim, H, sH, 0));
            QSA__TRY(bw_dense(b, &d->in_z, value_dim, H, sH, 0));
            QSA__TRY(bw_dense(b, &d->in_b, nv, H, sH, 0));
            QSA__TRY(bw_dense(b, &d->in_a, nv, H, sH, 0));
            QSA__TRY(bw_dense(b, &d->out, H, value_dim, 1.0f / sqrtf((float)value_dim), 0));
            QSA__TRY(bw_vec(b, &d->conv_w, (size_t)conv_dim * Kc, 0.5f, 0.0f));
            QSA__TRY(bw_vec(b, &d->A_log, (size_t)nv, 1.0f, 1.0f));    /* A in [1, 7.4] */
            QSA__TRY(bw_vec(b, &d->dt_bias, (size_t)nv, 1.0f, -3.5f)); /* softplus ~ 0.01 .. 0.1 */
            QSA__TRY(bw_vec(b, &d->gnorm_w, (size_t)dv, 0.1f, 1.0f));  /* plain weight */
        } else {
            QSA__TRY(bw_dense(b, &d->q, nh * 2 * hd, H, sH, 0));
            QSA__TRY(bw_dense(b, &d->k, nkv * hd, H, sH, 0));
            QSA__TRY(bw_dense(b, &d->v, nkv * hd, H, sH, 0));
            QSA__TRY(bw_dense(b, &d->o, H, nh * hd, 1.0f / sqrtf((float)(nh * hd)), 0));
            QSA__TRY(bw_vec(b, &d->q_norm, (size_t)hd, 0.1f, 0.0f));
            QSA__TRY(bw_vec(b, &d->k_norm, (size_t)hd, 0.1f, 0.0f));
            if (c->has_qsa) {
                QSA__TRY(bw_dense(b, &d->idx_qk, (c->indexer_n_heads + 1) * c->indexer_head_dim, H, sH, 0));
                QSA__TRY(bw_vec(b, &d->idx_q_norm, (size_t)c->indexer_head_dim, 0.1f, 0.0f));
                QSA__TRY(bw_vec(b, &d->idx_k_norm, (size_t)c->indexer_head_dim, 0.1f, 0.0f));
            }
        }
        QSA__TRY(bw_dense(b, &d->router, E, H, sH, 0));
        QSA__TRY(bw_dense(b, &d->sh_gate, Is, H, sH, 0));
        QSA__TRY(bw_dense(b, &d->sh_up, Is, H, sH, 0));
        QSA__TRY(bw_dense(b, &d->sh_down, H, Is, 1.0f / sqrtf((float)Is), 0));
        QSA__TRY(bw_dense(b, &d->sh_expert_gate, 1, H, sH, 0));
        QSA__TRY(bw_experts(b, d));
        int ple = 0;
        for (int k = 0; k < c->n_ple_layers; k++) ple |= c->ple_layer_ids[k] == l + 1;
        if (ple) {
            QSA__TRY(bw_dense(b, &d->ple_key, hcH, D, 1.0f / sqrtf((float)D), 0));
            QSA__TRY(bw_dense(b, &d->ple_value, H, D, 1.0f / sqrtf((float)D), 0));
            QSA__TRY(bw_vec(b, &d->ple_nk, (size_t)hcH, 0.1f, 0.0f));
            QSA__TRY(bw_vec(b, &d->ple_nq, (size_t)hcH, 0.1f, 0.0f));
            QSA__TRY(bw_vec(b, &d->ple_nc, (size_t)hcH, 0.1f, 0.0f));
            QSA__TRY(bw_vec(b, &d->ple_conv_w, (size_t)hcH * c->ple_conv_kernel_size, 0.5f, 0.0f));
        }
    }
    return QSA_OK;
}

/* ---- counted work per token ---- */

static int n_layers_of(const qsa_model_config *c, int type) {
    int n = 0;
    for (int l = 0; l < c->num_hidden_layers; l++) n += c->layer_types[l] == type;
    return n;
}

/* Tokens a query at position p attends to (selected blocks + tail), and the blocks it scores. */
static void qsa_sel(const qsa_model_config *c, long long p, double *n_sel, double *n_blocks) {
    if (!c->has_qsa) { *n_sel = (double)(p + 1); *n_blocks = 0; return; }
    long long r = c->indexer_compress_ratio, nb = (p + 1) / r, topk = c->indexer_budget / r;
    long long k = nb < topk ? nb : topk;
    *n_sel = (double)(k * r + (p + 1 - nb * r));
    *n_blocks = (double)nb;
}

/* Bytes of the state one GDN layer reads and writes per token (recurrent state fp32 + conv state). */
static double gdn_state_bytes(const qsa_model_config *c) {
    int conv_dim = 2 * c->linear_num_key_heads * c->linear_key_head_dim + c->linear_num_value_heads * c->linear_value_head_dim;
    return 4.0 * c->linear_num_value_heads * c->linear_key_head_dim * c->linear_value_head_dim +
           4.0 * (c->linear_conv_kernel_dim - 1) * conv_dim;
}

typedef struct decode_bytes {
    double dense, experts, kv, index, gdn, logits, other, total;
    double unique_experts; /* per layer */
} decode_bytes;

/* Bytes one decode step of B tokens at context P reads/writes, counted from the shapes (the
   minimum a kernel set must move): every dense weight once per step, the NVFP4 bytes of the
   distinct experts the batch touches (E * (1 - (1 - K/E)^B) per layer, uniform routing), per token
   and QSA layer the K and V of the selected tokens plus the new token's K/V/indexer key and the
   completed-block keys the indexer scores, per token and GDN layer the state read and written,
   the logits written, one embedding row and the PLE rows per token. */
static decode_bytes count_decode(const bench *b, int B, long long P) {
    const qsa_model_config *c = &b->cfg;
    decode_bytes d;
    memset(&d, 0, sizeof d);
    double E = c->num_experts, K = c->num_experts_per_tok;
    double kvd = (double)c->num_key_value_heads * c->head_dim, ihd = c->has_qsa ? c->indexer_head_dim : 0;
    double n_sel, nb;
    qsa_sel(c, P, &n_sel, &nb);
    d.dense = b->cnt.dense_bytes + b->cnt.vec_bytes + b->cnt.lm_head_bytes;
    d.unique_experts = E * (1.0 - pow(1.0 - K / E, (double)B));
    d.experts = d.unique_experts * b->cnt.expert_bytes * c->num_hidden_layers;
    int nq = n_layers_of(c, QSA_LAYER_QSA), ng = n_layers_of(c, QSA_LAYER_LINEAR);
    d.kv = (double)B * nq * (n_sel * 2 * kvd * 2 + (2 * kvd * 2 + ihd * 4));
    d.index = (double)B * nq * nb * ihd * 4;
    d.gdn = (double)B * ng * 2 * gdn_state_bytes(c);
    d.logits = (double)B * c->vocab_size * 4;
    d.other = (double)B * (2.0 * c->hidden_size + 4.0 * c->n_ple_layers * c->ple_embed_dim);
    d.total = d.dense + d.experts + d.kv + d.index + d.gdn + d.logits + d.other;
    return d;
}

/* FLOPs of one token at position p: 2 per multiply-add of the dense matmuls (lm_head excluded:
   the prompt produces logits for its last token only), the top-K experts, attention (QK and PV
   over the selected tokens), indexer scores over the completed blocks, and the GDN recurrence
   (~7 FLOPs per state element: decay, S^T k, rank-1 update, S^T q). */
static double flops_token(const bench *b, long long p) {
    const qsa_model_config *c = &b->cfg;
    double n_sel, nb;
    qsa_sel(c, p, &n_sel, &nb);
    int nq = n_layers_of(c, QSA_LAYER_QSA), ng = n_layers_of(c, QSA_LAYER_LINEAR);
    double f = 2 * b->cnt.dense_macs + 2 * c->num_experts_per_tok * b->cnt.expert_macs * c->num_hidden_layers;
    f += nq * (4.0 * c->num_attention_heads * c->head_dim * n_sel +
               (c->has_qsa ? 2.0 * c->indexer_n_heads * c->indexer_head_dim * nb : 0));
    f += ng * 7.0 * c->linear_num_value_heads * c->linear_key_head_dim * c->linear_value_head_dim;
    return f;
}

static double flops_prefill(const bench *b, int N) {
    double f = 0;
    for (long long p = 0; p < N; p++) f += flops_token(b, p);
    return f + 2 * b->cnt.lm_head_macs; /* logits of the last token */
}

static void print_summary(bench *b) {
    const qsa_model_config *c = &b->cfg;
    char b1[32], b2[32], b3[32], b4[32], b5[32], b6[32], b7[32];
    printf("model: %s: %d layers (%d GDN + %d QSA), hidden %d, heads %d/%d x %d (rotary %d), GDN %d/%d x %d/%d, "
           "experts %d top-%d x %d + shared %d (NVFP4), vocab %d, hc %d x %d, PLE layers %d (table base %lld), "
           "indexer %d x %d budget %d r %d, context %d\n",
           b->o.config ? b->o.config : b->o.quick ? "--quick shape" : "Qwen3.8-Flash-Next shape", c->num_hidden_layers,
           n_layers_of(c, QSA_LAYER_LINEAR), n_layers_of(c, QSA_LAYER_QSA), c->hidden_size, c->num_attention_heads,
           c->num_key_value_heads, c->head_dim, c->rotary_dim, c->linear_num_key_heads, c->linear_num_value_heads,
           c->linear_key_head_dim, c->linear_value_head_dim, c->num_experts, c->num_experts_per_tok,
           c->moe_intermediate_size, c->shared_expert_intermediate_size, c->vocab_size, c->hc_count, c->hc_lowrank,
           c->n_ple_layers, (long long)c->ngram_vocab_size_base, c->indexer_n_heads, c->indexer_head_dim,
           c->indexer_budget, c->indexer_compress_ratio, c->max_position_embeddings);
    printf("weights on the device: %s (dense FP16 read per step %s incl. lm_head %s; one expert %s, all experts %s)\n",
           fmt_bytes(b->cnt.weights_total, b1, sizeof b1),
           fmt_bytes(b->cnt.dense_bytes + b->cnt.vec_bytes + b->cnt.lm_head_bytes, b2, sizeof b2),
           fmt_bytes(b->cnt.lm_head_bytes, b3, sizeof b3), fmt_bytes(b->cnt.expert_bytes, b4, sizeof b4),
           fmt_bytes(b->cnt.expert_bytes * c->num_experts * c->num_hidden_layers, b5, sizeof b5));
    long long ctxs[2] = {b->o.ctx, c->max_position_embeddings};
    for (int i = 0; i < 2; i++) {
        decode_bytes d = count_decode(b, 1, ctxs[i]);
        printf("decode bytes per token, batch 1, context %lld: %s = dense %s + experts %s + KV %s + block keys %s + GDN state "
               "%s + logits/rows %s\n", ctxs[i], fmt_bytes(d.total, b1, sizeof b1), fmt_bytes(d.dense, b2, sizeof b2),
               fmt_bytes(d.experts, b3, sizeof b3), fmt_bytes(d.kv, b4, sizeof b4), fmt_bytes(d.index, b5, sizeof b5),
               fmt_bytes(d.gdn, b6, sizeof b6), fmt_bytes(d.logits + d.other, b7, sizeof b7));
    }
    printf("prefill FLOPs per token (%d-token prompt): %.3g\n", b->o.prefill, flops_prefill(b, b->o.prefill) / b->o.prefill);
    fflush(stdout);
}

/* ---- output ---- */

static void json_str(FILE *f, const char *s) {
    fputc('"', f);
    for (; *s; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch == '"' || ch == '\\') fprintf(f, "\\%c", ch);
        else if (ch < 0x20) fprintf(f, "\\u%04x", ch);
        else fputc(ch, f);
    }
    fputc('"', f);
}

static void write_json(bench *b, const char *path, int argc, char **argv) {
    FILE *f = fopen(path, "w");
    if (!f) { fprintf(stderr, "bench: cannot write %s\n", path); b->failed = 1; return; }
    char cmd[1024] = "";
    size_t k = 0;
    for (int i = 0; i < argc && k < sizeof cmd - 2; i++) k += (size_t)snprintf(cmd + k, sizeof cmd - k, "%s%s", i ? " " : "", argv[i]);
    time_t now = time(NULL);
    char date[64];
    strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", gmtime(&now));
    fprintf(f, "{\n  \"tool\": \"tools/bench\", \"version\": \"%s\", \"date\": \"%s\", \"command\": ", QSA_VERSION_STRING, date);
    json_str(f, cmd);
    fprintf(f, ",\n  \"device\": ");
    json_str(f, b->info.name);
    fprintf(f, ", \"cc\": %d, \"sm_count\": %d, \"memory_bytes\": %zu, \"driver\": %d, \"nvrtc\": \"%d.%d\", \"arch\": ",
            b->info.cc_major * 10 + b->info.cc_minor, b->info.sm_count, b->info.total_mem, qsa__cu.driver_version,
            qsa__nvrtc.major, qsa__nvrtc.minor);
    json_str(f, b->g ? b->g->arch : "");
    fprintf(f, ",\n  \"ceilings\": {\"copy_GBps\": %.3f, \"wmma_fp16_TFLOPs\": %.3f},\n", b->copy_gbs, b->wmma_tflops);
    fprintf(f, "  \"model\": {\"layers\": %d, \"hidden\": %d, \"experts\": %d, \"top_k\": %d, \"vocab\": %d, "
               "\"weights_bytes\": %.0f, \"dense_bytes_per_step\": %.0f, \"expert_bytes\": %.0f, \"page_size\": %d},\n",
            b->cfg.num_hidden_layers, b->cfg.hidden_size, b->cfg.num_experts, b->cfg.num_experts_per_tok, b->cfg.vocab_size,
            b->cnt.weights_total, b->cnt.dense_bytes + b->cnt.vec_bytes + b->cnt.lm_head_bytes, b->cnt.expert_bytes,
            b->m ? b->m->pool.page_size : 0);
    fprintf(f, "  \"results\": [\n");
    for (int i = 0; i < b->nrows; i++) {
        const bench_row *r = &b->rows[i];
        fprintf(f, "    {\"what\": ");
        json_str(f, r->what);
        fprintf(f, ", \"config\": ");
        json_str(f, r->config);
        fprintf(f, ", \"status\": \"%s\", \"ms\": %.6g, \"tok_s\": %.6g, \"per_token\": %.6g, \"unit\": \"%s\", "
                   "\"achieved\": %.6g, \"fraction_of_ceiling\": %.6g, \"repeats\": %d, \"note\": ",
                r->status == 0 ? "measured" : r->status == 1 ? "skipped" : "failed", r->ms, r->tok_s, r->per_tok,
                r->unit == 'B' ? "bytes" : r->unit == 'F' ? "flops" : "", r->achieved, r->frac, r->n);
        json_str(f, r->note);
        fprintf(f, "}%s\n", i + 1 < b->nrows ? "," : "");
    }
    fprintf(f, "  ]\n}\n");
    if (fclose(f) != 0) { fprintf(stderr, "bench: writing %s failed\n", path); b->failed = 1; }
    else printf("results written to %s\n", path);
}

static void print_table(bench *b) {
    time_t now = time(NULL);
    char date[64], pb[32], ach[32], frac[32], rate[32], tm[32];
    strftime(date, sizeof date, "%Y-%m-%d", gmtime(&now));
    printf("\n== results: tools/bench%s on %s, %s ==\n", b->o.quick ? " --quick" : "", b->info.name[0] ? b->info.name : "?", date);
    printf("| measurement | config | median time | tok/s | per token (call) | achieved | of ceiling |\n");
    printf("|---|---|---:|---:|---:|---:|---:|\n");
    for (int i = 0; i < b->nrows; i++) {
        const bench_row *r = &b->rows[i];
        if (r->status) {
            printf("| %s | %s | %s: %.60s | | | | |\n", r->what, r->config, r->status == 1 ? "skipped" : "FAILED", r->note);
            continue;
        }
        snprintf(tm, sizeof tm, "%.3f ms", r->ms);
        if (r->tok_s > 0) snprintf(rate, sizeof rate, "%.1f", r->tok_s);
        else rate[0] = 0;
        if (r->unit == 'B') { fmt_bytes(r->per_tok, pb, sizeof pb); snprintf(ach, sizeof ach, "%.0f GB/s", r->achieved); }
        else if (r->unit == 'F') { snprintf(pb, sizeof pb, "%.3g FLOP", r->per_tok); snprintf(ach, sizeof ach, "%.1f TFLOP/s", r->achieved); }
        else { pb[0] = 0; ach[0] = 0; }
        if (r->frac >= 0) snprintf(frac, sizeof frac, "%.1f%% %s", 100 * r->frac, r->unit == 'F' ? "WMMA" : "copy");
        else snprintf(frac, sizeof frac, "%s", r->note[0] && !strcmp(r->note, "ceiling") ? "ceiling" : "");
        printf("| %s | %s | %s | %s | %s | %s | %s |\n", r->what, r->config, tm, rate, pb, ach, frac);
    }
    fflush(stdout);
}

/* ---- temporary directories (kernel cache, driver cache) ---- */

static int rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
    (void)st; (void)flag; (void)ftw;
    remove(path);
    return 0;
}
static void rm_tree(const char *dir) {
    if (dir[0]) nftw(dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
}

/* ---- measurements ---- */

static qsa_result bench_device_init(bench *b) {
    qsa__cuda *g = QSA__CALLOC(qsa__cuda, 1);
    if (!g) return qsa__fail(QSA_ERR_OUT_OF_MEMORY, "bench: out of host memory");
    b->g = g;
    long nc = sysconf(_SC_NPROCESSORS_ONLN); /* (the kernels' parts compile over the threads, as a model's load) */
    g->host_threads = nc < 1 ? 1 : nc > 16 ? 16 : (int)nc;
    QSA__TRY(qsa__cuda_open(g, b->o.device, &b->info)); /* (the runtime's bring-up: its streams, the side stream too) */
    QSA__CU(qsa__cu.cuEventCreate(&b->ev0, 0));
    QSA__CU(qsa__cu.cuEventCreate(&b->ev1, 0));
    printf("device: %s (cc %d.%d, %d SMs, %.1f GiB), driver %d.%d, NVRTC %d.%d (%s)\n", b->info.name, b->info.cc_major,
           b->info.cc_minor, b->info.sm_count, b->info.total_mem / 1073741824.0, qsa__cu.driver_version / 1000,
           qsa__cu.driver_version % 1000 / 10, qsa__nvrtc.major, qsa__nvrtc.minor, qsa__nvrtc.path);
    fflush(stdout);
    return QSA_OK;
}

/* Cold: the first compile in this process into an empty cache directory; warm: loaded from it. */
static void bench_jit(bench *b) {
    char dir[300], old[1024] = "";
    const char *prev = getenv("QSA_CACHE_DIR");
    int had = prev != NULL;
    if (had) snprintf(old, sizeof old, "%s", prev);
    snprintf(dir, sizeof dir, "%.280s/kernels", b->tmpdir);
    setenv("QSA_CACHE_DIR", dir, 1);
    qsa__cuda *g = b->g;
    for (int pass = 0; pass < 2; pass++) {
        const char *name = pass ? "JIT warm" : "JIT cold";
        qsa__cuda_module_unload(g);
        double t0 = qsa__now();
        qsa_result r = qsa__cuda_module(g, b->o.arch);
        double wall = qsa__now() - t0;
        if (r != QSA_OK) { row_fail(b, name, "kernel module", r); break; }
        if (pass && !g->jit_from_cache) qsa__log(QSA_LOG_WARN, "bench: the warm load did not come from the disk cache");
        bench_row *w = row_add(b, name, g->arch);
        w->ms = 1e3 * wall;
        w->n = 1;
        snprintf(w->note, sizeof w->note, "%s; compile/load %.3f s + NVRTC setup", g->jit_from_cache ? "from the disk cache" : "NVRTC compile",
                 g->jit_seconds);
        if (pass) b->jit_warm_s = wall;
        else b->jit_cold_s = wall;
        row_print(w);
    }
    if (had) setenv("QSA_CACHE_DIR", old, 1);
    else unsetenv("QSA_CACHE_DIR");
}

static qsa_result bench_copy(bench *b) {
    size_t bytes = (size_t)(b->o.quick ? 1 : 4) << 30;
    CUdeviceptr src = 0, dst = 0;
    double t[20];
    int n = 0;
    qsa_result r = QSA__CU_R(qsa__cu.cuMemAlloc_v2(&src, bytes));
    if (r == QSA_OK) r = QSA__CU_R(qsa__cu.cuMemAlloc_v2(&dst, bytes));
    if (r == QSA_OK) r = fill_bytes(b, src, bytes);
    for (int i = 0; r == QSA_OK && i < 3 + 15; i++) {
        double ms;
        r = ev_begin(b);
        if (r == QSA_OK) r = QSA__CU_R(qsa__cu.cuMemcpyDtoDAsync_v2(dst, src, bytes, b->g->stream));
        if (r == QSA_OK) r = ev_end(b, &ms);
        if (r == QSA_OK && i >= 3) t[n++] = ms;
    }
    if (src) qsa__cu.cuMemFree_v2(src);
    if (dst) qsa__cu.cuMemFree_v2(dst);
    QSA__TRY(r);
    char cfg[64];
    snprintf(cfg, sizeof cfg, "cuMemcpyDtoD %zu GiB", bytes >> 30);
    bench_row *w = row_add(b, "copy bandwidth", cfg);
    w->ms = median(t, n);
    w->n = n;
    w->unit = 'B';
    w->per_tok = 2.0 * bytes;
    w->achieved = w->per_tok / (w->ms * 1e-3) / 1e9;
    snprintf(w->note, sizeof w->note, "ceiling");
    b->copy_gbs = w->achieved;
    row_print(w);
    return QSA_OK;
}

/* The copy of a batch's logits to the host: 32 MiB (32 rows of the real vocabulary are 31.8 MB) from
   the device into pageable memory (malloc: what a caller's own buffer gets; the driver stages it) and
   into page-locked memory (cuMemHostAlloc, as qsa_host_alloc), each timed on the host around the copy
   and a stream synchronisation.  Not a ceiling of the decode rows: what their logits cost beside it. */
static qsa_result bench_host_copy(bench *b) {
    const size_t bytes = (size_t)32 << 20;
    CUdeviceptr src = 0;
    void *dst[2] = {NULL, NULL};
    qsa_result r = QSA__CU_R(qsa__cu.cuMemAlloc_v2(&src, bytes));
    if (r == QSA_OK) r = fill_bytes(b, src, bytes);
    dst[0] = qsa__malloc(bytes);
    if (r == QSA_OK && !dst[0]) r = qsa__fail(QSA_ERR_OUT_OF_MEMORY, "host copy: out of host memory");
    if (r == QSA_OK) r = QSA__CU_R(qsa__cu.cuMemHostAlloc(&dst[1], bytes, QSA__CU_MEMHOSTALLOC_PORTABLE));
    for (int k = 0; r == QSA_OK && k < 2; k++) {
        double t[10];
        int n = 0;
        for (int i = 0; r == QSA_OK && i < 2 + 10; i++) {
            double t0 = qsa__now();
            r = QSA__CU_R(qsa__cu.cuMemcpyDtoHAsync_v2(dst[k], src, bytes, b->g->stream));
            if (r == QSA_OK) r = QSA__CU_R(qsa__cu.cuStreamSynchronize(b->g->stream));
            if (r == QSA_OK && i >= 2) t[n++] = 1e3 * (qsa__now() - t0);
        }
        if (r != QSA_OK) break;
        bench_row *w = row_add(b, "logits to host", k ? "DtoH 32 MiB, page-locked" : "DtoH 32 MiB, pageable");
        w->ms = median(t, n);
        w->n = n;
        w->unit = 'B';
        w->per_tok = (double)bytes;
        w->achieved = w->per_tok / (w->ms * 1e-3) / 1e9;
        snprintf(w->note, sizeof w->note, "%s", k ? "qsa_host_alloc's memory" : "a caller's malloc'd buffer");
        row_print(w);
    }
    if (src) qsa__cu.cuMemFree_v2(src);
    qsa__free(dst[0]);
    if (dst[1]) qsa__cu.cuMemFreeHost(dst[1]);
    return r;
}

/* The floor under a decode step of ~850 dependent launches: a CUDA graph of BENCH_FLOOR_N launches
   of one kernel (one block of 128 threads per SM), each a programmatic dependent of the one before
   when the runtime uses them (qsa__cu_launch_ex, as the decode graph), replayed; per launch.  Two
   kernels: the smallest (the entry's PDL wait, one float per thread), and one that ends like the
   cross-warp GEMV (an atomic ticket, the last block reading through L2). */
#define BENCH_FLOOR_N 1000
static qsa_result bench_floor1(bench *b, int ticket) {
    qsa__cuda *g = b->g;
    unsigned blocks = (unsigned)(b->info.sm_count > 0 ? b->info.sm_count : 80);
    size_t xn = (size_t)(blocks > 64 ? blocks : 64) * 128; /* the ticket kernel's last block reads 64 x 128 */
    CUdeviceptr x = 0, cnt = 0;
    CUgraph graph = NULL;
    CUgraphExec exec = NULL;
    double t[10];
    int n = 0;
    qsa_result r = QSA__CU_R(qsa__cu.cuMemAlloc_v2(&x, xn * 4));
    if (r == QSA_OK) r = QSA__CU_R(qsa__cu.cuMemAlloc_v2(&cnt, 4));
    if (r == QSA_OK) r = QSA__CU_R(qsa__cu.cuMemsetD8Async(x, 0, xn * 4, g->stream));
    if (r == QSA_OK) r = QSA__CU_R(qsa__cu.cuMemsetD8Async(cnt, 0, 4, g->stream));
    if (r == QSA_OK) r = QSA__CU_R(qsa__cu.cuStreamBeginCapture_v2(g->stream, QSA__CU_STREAM_CAPTURE_MODE_THREAD_LOCAL));
    if (r == QSA_OK) {
        qsa__prof_capturing = 1;
        for (int i = 0; r == QSA_OK && i < BENCH_FLOOR_N; i++) {
            void *a1[] = {&x}, *a2[] = {&x, &cnt};
            r = ticket ? qsa__cu_launch_ex(b->f_ticket, "bench_ticket", blocks, 1, 1, 128, 1, 1, 0, g->stream, a2, g->pdl)
                       : qsa__cu_launch_ex(b->f_step, "bench_step", blocks, 1, 1, 128, 1, 1, 0, g->stream, a1, g->pdl);
        }
        qsa__prof_capturing = 0;
        qsa_result re = QSA__CU_R(qsa__cu.cuStreamEndCapture(g->stream, &graph)); /* always leave capture mode */
        if (r == QSA_OK) r = re;
    }
    if (r == QSA_OK) r = QSA__CU_R(qsa__cu.cuGraphInstantiateWithFlags(&exec, graph, 0));
    for (int i = 0; r == QSA_OK && i < 2 + 7; i++) {
        double ms;
        r = ev_begin(b);
        if (r == QSA_OK) r = QSA__CU_R(qsa__cu.cuGraphLaunch(exec, g->stream));
        if (r == QSA_OK) r = ev_end(b, &ms);
        if (r == QSA_OK && i >= 2) t[n++] = ms;
    }
    if (exec) qsa__cu.cuGraphExecDestroy(exec);
    if (graph) qsa__cu.cuGraphDestroy(graph);
    if (x) qsa__cu.cuMemFree_v2(x);
    if (cnt) qsa__cu.cuMemFree_v2(cnt);
    QSA__TRY(r);
    char cfg[64];
    snprintf(cfg, sizeof cfg, "graph of %d %s kernels", BENCH_FLOOR_N, ticket ? "ticket" : "minimal");
    bench_row *w = row_add(b, "launch floor", cfg);
    w->ms = median(t, n);
    w->n = n;
    snprintf(w->note, sizeof w->note, "%.2f us per launch (%u blocks of 128; %s)", 1e3 * w->ms / BENCH_FLOOR_N, blocks,
             g->pdl ? "programmatic dependent launches" : "plain launches");
    row_print(w);
    return QSA_OK;
}
static void bench_launch_floor(bench *b) {
    qsa_result r;
    for (int k = 0; k < 2 && !b->broken; k++)
        if (may_run(b, "launch floor", "") && (r = bench_floor1(b, k)) != QSA_OK) row_fail(b, "launch floor", k ? "ticket" : "minimal", r);
}

/* bench_gemm's `copies`: streamed rows rotate over this many bytes of weights at least (L2 holds 50 MB on
   the H200), so that no launch finds its weights left in L2 by the launch before */
#define BENCH_STREAM_BYTES ((size_t)256 << 20)
/* One GEMM / GEMV shape through qsa__dgemm (the runtime's launch; FP16 or NVFP4 weights), the median of `reps` timed launches after two untimed ones;
   flush: a buffer memset before each (outside the timed events); copies > 1 (a streamed GEMV row): each
   timed sample is `reps` launches back to back, launch i on copy i % copies of the weights, over reps.
   `gemv`: the row counts bytes (weights, A and Y) against the copy rate, else FLOPs against WMMA's. */
static qsa_result bench_gemm(bench *b, const char *what, int M, int N, int K, int nvfp4, int reps, CUdeviceptr flush,
                             size_t flush_bytes, int copies, int gemv) {
    qsa__cuda *g = b->g;
    CUdeviceptr A = 0, W = 0, S = 0, Y = 0;
    qsa__dlin w;
    memset(&w, 0, sizeof w);
    w.out = N;
    w.in = K;
    size_t wb = nvfp4 ? (size_t)N * K / 2 : (size_t)N * K * 2;
    if (copies < 1 || nvfp4) copies = 1;
    qsa_result r = qsa__cuda_gemv_scratch(g); /* M <= 64 may take the cross-block GEMV, as in decode */
    if (r == QSA_OK) r = QSA__CU_R(qsa__cu.cuMemAlloc_v2(&A, (size_t)M * K * 2));
    if (r == QSA_OK) r = QSA__CU_R(qsa__cu.cuMemAlloc_v2(&W, wb * (size_t)copies));
    if (r == QSA_OK && nvfp4) r = QSA__CU_R(qsa__cu.cuMemAlloc_v2(&S, (size_t)N * K / 16));
    if (r == QSA_OK) r = QSA__CU_R(qsa__cu.cuMemAlloc_v2(&Y, (size_t)M * N * 4));
    if (r == QSA_OK) r = fill_f16(b, A, (size_t)M * K, 1.0f, 0.0f);
    if (r == QSA_OK && !nvfp4) {
        w.w16 = W;
        r = fill_f16(b, W, (size_t)N * K * (size_t)copies, BENCH_SQRT3 / sqrtf((float)K), 0.0f);
    }
    if (r == QSA_OK && nvfp4) {
        w.q = W;
        w.s = S;
        w.s2 = 1.0f / (sqrtf((float)K) * BENCH_E2M1_RMS * BENCH_E4M3_RMS);
        r = fill_bytes(b, W, wb);
        if (r == QSA_OK) r = fill_e4m3(b, S, (size_t)N * K / 16, 0x30, 16);
    }
    double t[64];
    int n = 0;
    for (int i = 0; r == QSA_OK && i < 2 + reps && i < 64; i++) {
        double ms;
        if (flush) r = QSA__CU_R(qsa__cu.cuMemsetD8Async(flush, (unsigned char)i, flush_bytes, g->stream));
        if (r == QSA_OK) r = ev_begin(b);
        for (int j = 0; r == QSA_OK && j < (copies > 1 ? reps : 1); j++) {
            if (copies > 1) w.w16 = W + (CUdeviceptr)((size_t)(j % copies) * wb); /* (FP16 only) */
            r = qsa__dgemm(g, A, M, &w, Y, 0);
        }
        if (r == QSA_OK) r = ev_end(b, &ms);
        if (r == QSA_OK && i >= 2) t[n++] = copies > 1 ? ms / reps : ms;
        if (copies > 1 && i >= 4) break; /* (three samples of reps launches each) */
    }
    if (A) qsa__cu.cuMemFree_v2(A);
    if (W) qsa__cu.cuMemFree_v2(W);
    if (S) qsa__cu.cuMemFree_v2(S);
    if (Y) qsa__cu.cuMemFree_v2(Y);
    QSA__TRY(r);
    char cfg[64];
    snprintf(cfg, sizeof cfg, "M=%d N=%d K=%d %s%s", M, N, K, nvfp4 ? "NVFP4" : "FP16",
             flush ? ", L2 flushed" : copies > 1 ? ", streamed" : "");
    bench_row *o = row_add(b, what, cfg);
    o->ms = median(t, n);
    o->n = n;
    if (copies > 1) snprintf(o->note, sizeof o->note, "%d launches a sample over %d weight copies", reps, copies);
    if (M == 1 || gemv) { /* a GEMV: bandwidth-bound, bytes = weights (+ scales), A and Y */
        o->unit = 'B';
        o->per_tok = (double)wb + (nvfp4 ? (double)N * K / 16 : 0) + 2.0 * M * K + 4.0 * M * N;
        o->achieved = o->per_tok / (o->ms * 1e-3) / 1e9;
        o->frac = b->copy_gbs > 0 ? o->achieved / b->copy_gbs : -1;
    } else {
        o->unit = 'F';
        o->per_tok = 2.0 * M * N * K;
        o->achieved = o->per_tok / (o->ms * 1e-3) / 1e12;
        if (!strcmp(what, "fp16 WMMA GEMM")) { b->wmma_tflops = o->achieved; snprintf(o->note, sizeof o->note, "ceiling"); }
        else o->frac = b->wmma_tflops > 0 ? o->achieved / b->wmma_tflops : -1;
    }
    row_print(o);
    return QSA_OK;
}

/* --gemv-shapes: single FP16 GEMVs (M = 1) of the listed N x K shapes (the decode step's
   projections), each launch timed alone, with L2 flushed before it (a 512 MiB memset outside the
   timed events: the weights come from DRAM) and without (the previous launch left them in L2 when
   they fit): how much of a projection's time is the weight stream. */
static void bench_gemv_shapes(bench *b) {
    size_t fb = (size_t)512 << 20;
    CUdeviceptr flush = 0;
    qsa_result r = QSA__CU_R(qsa__cu.cuMemAlloc_v2(&flush, fb));
    if (r != QSA_OK) { row_fail(b, "GEMV", "L2 flush buffer", r); return; }
    for (int mi = 0; mi < (b->o.n_gemv_m ? b->o.n_gemv_m : 1); mi++)
        for (int i = 0; i < b->o.n_gemv; i++) {
            const int m = b->o.n_gemv_m ? b->o.gemv_m[mi] : 1, n = b->o.gemv_n[i], k = b->o.gemv_k[i];
            const size_t wb = (size_t)n * k * 2, need = (BENCH_STREAM_BYTES + wb - 1) / wb;
            const int copies = need < 2 ? 2 : (int)need;
            if (may_run(b, "GEMV", "L2 flushed") && (r = bench_gemm(b, "GEMV", m, n, k, 0, 20, flush, fb, 1, 1)) != QSA_OK)
                row_fail(b, "GEMV", "L2 flushed", r);
            if (may_run(b, "GEMV", "L2 warm") && (r = bench_gemm(b, "GEMV", m, n, k, 0, 20, 0, 0, 1, 1)) != QSA_OK)
                row_fail(b, "GEMV", "L2 warm", r);
            if (may_run(b, "GEMV", "streamed") && (r = bench_gemm(b, "GEMV", m, n, k, 0, 20, 0, 0, copies, 1)) != QSA_OK)
                row_fail(b, "GEMV", "streamed", r);
        }
    qsa__cu.cuMemFree_v2(flush);
}

/* ---- the synthetic model ---- */

/* The host side of the model: what the CUDA forward reads on the host (see the top comment). */
static qsa_result bench_host_model(bench *b) {
    const qsa_model_config *c = &b->cfg;
    qsa_model *m = QSA__CALLOC(qsa_model, 1);
    if (!m) return qsa__fail(QSA_ERR_OUT_OF_MEMORY, "bench: out of host memory");
    b->m = m;
    m->cfg = *c;
    m->params.backend = QSA_BACKEND_CUDA;
    m->params.device = b->o.device;
    m->params.arch = b->o.arch;
    m->params.max_chunk = b->o.chunk;
    m->params.kv_page_size = b->o.page_size;
    int mb = 1;
    for (int i = 0; i < b->o.n_batches; i++) if (b->o.batches[i] > mb) mb = b->o.batches[i];
    m->params.max_batch = mb;
    m->params.n_threads = 1;
    m->n_threads = 1;
    int L = c->num_hidden_layers;
    m->layers = QSA__CALLOC(qsa__layer_w, L);
    int rd = c->rotary_dim;
    m->rope_inv_freq = QSA__ALLOC(float, rd / 2 + 1);
    if (!m->layers || !m->rope_inv_freq) return qsa__fail(QSA_ERR_OUT_OF_MEMORY, "bench: out of host memory");
    for (int i = 0; i < rd / 2; i++) m->rope_inv_freq[i] = 1.0f / powf((float)c->rope_theta, (float)(2 * i) / (float)rd);
    m->rope_inv_freq[rd / 2] = 0;
    int n_heads = (c->ngram_size - 1) * c->heads_per_ngram;
    for (int l = 0; l < L; l++) {
        m->layers[l].type = c->layer_types[l];
        for (int k = 0; k < c->n_ple_layers; k++) {
            if (c->ple_layer_ids[k] != l + 1) continue;
            qsa__ple_w *p = QSA__CALLOC(qsa__ple_w, 1);
            if (!p) return qsa__fail(QSA_ERR_OUT_OF_MEMORY, "bench: out of host memory");
            m->layers[l].ple = p;
            p->ple_index = k;
            p->head_vocab = QSA__CALLOC(int64_t, n_heads);
            p->head_offset = QSA__CALLOC(int64_t, n_heads);
            qsa__tensor *t = QSA__CALLOC(qsa__tensor, 1);
            p->table.parts = QSA__CALLOC(const qsa__tensor *, 1);
            p->table.row_start = QSA__CALLOC(int64_t, 2);
            if (!p->head_vocab || !p->head_offset || !t || !p->table.parts || !p->table.row_start) {
                qsa__free(t);
                return qsa__fail(QSA_ERR_OUT_OF_MEMORY, "bench: out of host memory");
            }
            p->table.parts[0] = t;
            p->table.nparts = 1;
            qsa__ple_multipliers(c->vocab_size, c->ngram_size, k, c->seed, p->mult);
            int64_t total;
            qsa__ple_head_vocabs(c->ngram_vocab_size_base, k, n_heads, p->head_vocab, p->head_offset, &total);
            int64_t div = c->make_ngram_vocab_size_divisible_by > 0 ? c->make_ngram_vocab_size_divisible_by : 1;
            int64_t rows = (total + div - 1) / div * div, cols = c->ple_embed_dim / n_heads;
            size_t n = (size_t)rows * (size_t)cols;
            uint16_t *data = QSA__ALLOC(uint16_t, n);
            if (!data) return qsa__fail(QSA_ERR_OUT_OF_MEMORY, "bench: %zu bytes for the PLE table of layer %d", n * 2, l + 1);
            uint16_t pal[4096]; /* random FP16 values U(-1, 1), drawn from a palette (fast to fill) */
            for (int i = 0; i < 4096; i++) pal[i] = qsa__f32_to_f16((float)((rng_next(b) >> 40) * (1.0 / 8388608.0) - 1.0));
            for (size_t i = 0; i < n; i++) data[i] = pal[rng_next(b) & 4095];
            t->name = "bench synthetic ngram_embedding";
            t->dtype = QSA__F16;
            t->ndim = 2;
            t->shape[0] = rows;
            t->shape[1] = cols;
            t->data = (const uint8_t *)data;
            t->nbytes = n * 2;
            p->table.row_start[1] = rows;
            p->table.rows = rows;
            p->table.cols = cols;
            p->table.dtype = QSA__F16;
        }
    }
    return QSA_OK;
}

static void bench_host_model_free(bench *b) {
    qsa_model *m = b->m;
    if (!m) return;
    if (m->layers) {
        for (int l = 0; l < m->cfg.num_hidden_layers; l++) {
            qsa__ple_w *p = m->layers[l].ple;
            if (!p) continue;
            if (p->table.parts && p->table.parts[0]) {
                qsa__free((void *)p->table.parts[0]->data);
                qsa__free((void *)p->table.parts[0]);
            }
            qsa__rows_view_free(&p->table);
            qsa__free(p->head_vocab);
            qsa__free(p->head_offset);
            qsa__free(p);
        }
        qsa__free(m->layers);
    }
    qsa__free(m->rope_inv_freq);
    qsa__pool_destroy(&m->pool);
    qsa__free(m);
    b->m = NULL;
}

/* Device bytes of one sequence's state with context n_ctx (as qsa__cuda_seq_create carves it). */
static double seq_state_bytes(const bench *b, int n_ctx, int page_size) {
    const qsa_model_config *c = &b->cfg;
    int key_dim = c->linear_num_key_heads * c->linear_key_head_dim;
    int conv_dim = 2 * key_dim + c->linear_num_value_heads * c->linear_value_head_dim, hcH = c->hc_count * c->hidden_size;
    double conv_b = (double)(c->linear_conv_kernel_dim - 1) * conv_dim * 4 + 16 + 256;
    double S_b = 4.0 * c->linear_num_value_heads * c->linear_key_head_dim * c->linear_value_head_dim + 256;
    double ple_b = 4.0 * (c->ple_conv_kernel_size - 1) * c->ngram_size * hcH + 16 + 256;
    double bk_b = c->has_qsa ? (double)(n_ctx / c->indexer_compress_ratio + 1) * c->indexer_head_dim * 4 + 256 : 272;
    double bt_b = (double)(n_ctx / page_size + 1) * 4 + 256;
    return bt_b + n_layers_of(c, QSA_LAYER_LINEAR) * (conv_b + S_b) + n_layers_of(c, QSA_LAYER_QSA) * bk_b +
           c->n_ple_layers * ple_b;
}

static double pool_bytes_per_token(const qsa_model_config *c) {
    return n_layers_of(c, QSA_LAYER_QSA) * (2.0 * 2 * c->num_key_value_heads * c->head_dim + (c->has_qsa ? 4.0 * c->indexer_head_dim : 0));
}

/* The decode rows planned: (context, batch); feasible ones share one KV pool. */
typedef struct bench_plan {
    int n;
    int ctx[2 * BENCH_MAX_BATCHES], batch[2 * BENCH_MAX_BATCHES], n_ctx[2 * BENCH_MAX_BATCHES], ok[2 * BENCH_MAX_BATCHES];
    double need_state[2 * BENCH_MAX_BATCHES];
    long long pool_tok[2 * BENCH_MAX_BATCHES];
    long long pool_tokens;
    int steps_per_seq;   /* decode steps one sequence may take in all its rows */
} bench_plan;

static void plan_decode(bench *b, bench_plan *pl, int page_size, double avail) {
    const qsa_model_config *c = &b->cfg;
    memset(pl, 0, sizeof *pl);
    int per_mode = b->o.warmup + b->o.steps;
    /* at most 12 modes per row (single, chunked forward, batched, graphs, graphs with greedy ids, top-k, top-p and
       temperature-alone draws on the host and from the device's candidates, single again) + 2 profiles; --marginal
       profiles 3 steps more (its timed steps take fresh sequences) */
    pl->steps_per_seq = per_mode * 12 + 8 + (b->o.marginal ? 4 : 0);
    int ctxs[2], nctx = 0;
    ctxs[nctx++] = b->o.ctx;
    long long lng = (long long)c->max_position_embeddings - pl->steps_per_seq - 1;
    if (!b->o.no_long && lng > b->o.ctx) ctxs[nctx++] = (int)lng;
    if (b->o.ctx + pl->steps_per_seq + 1 > c->max_position_embeddings) ctxs[0] = c->max_position_embeddings - pl->steps_per_seq - 1;
    double per_tok = pool_bytes_per_token(c);
    for (int i = 0; i < nctx; i++)
        for (int j = 0; j < b->o.n_batches; j++) {
            int k = pl->n++;
            pl->ctx[k] = ctxs[i] > 0 ? ctxs[i] : 1;
            pl->batch[k] = b->o.batches[j];
            pl->n_ctx[k] = pl->ctx[k] + pl->steps_per_seq + 1;
            long long pages = (pl->n_ctx[k] + page_size - 1) / page_size;
            pl->pool_tok[k] = (long long)pl->batch[k] * pages * page_size;
            pl->need_state[k] = pl->batch[k] * seq_state_bytes(b, pl->n_ctx[k], page_size);
            /* the pool is re-sized per context (no sequence lives across contexts): a row fits alone */
            pl->ok[k] = pl->pool_tok[k] * per_tok + pl->need_state[k] <= avail;
        }
    pl->pool_tokens = ((long long)b->o.prefill + pl->steps_per_seq + 1 + page_size - 1) / page_size * page_size;
}

/* (Re)allocate the device KV pool for `tokens` tokens (no sequence may hold pages), filled with
   random K, V (FP16) and indexer keys (FP32).  Raw allocations, freed here or at the end. */
static qsa_result bench_pool(bench *b, long long tokens) {
    qsa_model *m = b->m;
    qsa__cuda *g = b->g;
    if (b->pool_tokens == tokens && m->pool.free_pages) return QSA_OK;
    QSA__CU(qsa__cu.cuStreamSynchronize(g->stream));
    for (int i = 0; i < 3; i++) if (b->pool_mem[i]) { qsa__cu.cuMemFree_v2(b->pool_mem[i]); b->pool_mem[i] = 0; }
    g->kpool = g->vpool = g->ipool = 0;
    g->bytes_kv = 0;
    /* captured decode graphs hold the old pool's addresses and page count: drop them (the runtime
       never reallocates its pool; only this tool does) */
    qsa__cuda_batch_drop_graphs(g);
    qsa__pool_destroy(&m->pool);
    b->pool_tokens = 0;
    m->params.kv_pool_tokens = (int)(tokens < 2000000000 ? tokens : 2000000000);
    QSA__TRY(qsa__pool_create(m, 0));
    const qsa__pool *p = &m->pool;
    size_t slots = (size_t)p->n_qsa * p->n_pages * p->page_size;
    size_t bytes[3] = {slots * p->kvd * 2 + 16, slots * p->kvd * 2 + 16, slots * p->ihd * 4 + 16};
    for (int i = 0; i < 3; i++) {
        if (qsa__cu.cuMemAlloc_v2(&b->pool_mem[i], bytes[i]) != 0) {
            size_t fr = 0, tot = 0;
            qsa__cu.cuMemGetInfo_v2(&fr, &tot);
            b->pool_mem[i] = 0;
            return qsa__fail(QSA_ERR_OUT_OF_MEMORY, "bench: KV pool of %lld tokens: %zu bytes do not fit (%zu MiB free)",
                             tokens, bytes[i], fr >> 20);
        }
        g->bytes_kv += bytes[i];
    }
    g->kpool = b->pool_mem[0];
    g->vpool = b->pool_mem[1];
    g->ipool = b->pool_mem[2];
    if (slots) {
        QSA__TRY(fill_f16(b, g->kpool, slots * p->kvd, 1.5f, 0.0f));
        QSA__TRY(fill_f16(b, g->vpool, slots * p->kvd, 1.5f, 0.0f));
        if (p->ihd) QSA__TRY(fill_f32(b, g->ipool, slots * p->ihd, 1.0f, 0.0f));
    }
    QSA__CU(qsa__cu.cuStreamSynchronize(g->stream));
    b->pool_tokens = tokens;
    size_t fr = 0, tot = 0;
    QSA__CU(qsa__cu.cuMemGetInfo_v2(&fr, &tot));
    printf("KV pool: %d pages of %d tokens (%.1f GiB); %.1f of %.1f GiB free\n", p->n_pages, p->page_size,
           g->bytes_kv / 1073741824.0, fr / 1073741824.0, tot / 1073741824.0);
    fflush(stdout);
    return QSA_OK;
}

static qsa_result bench_build_weights_job(void *b) { return bench_build_weights((bench *)b); }
/* Build the model on the device: weights, scratch, the memory plan and the first KV pool. */
static qsa_result bench_load(bench *b, bench_plan *pl) {
    qsa__cuda *g = b->g;
    qsa_model *m = b->m;
    double t0 = qsa__now();
    b->dry = 0;
    QSA__TRY(qsa__staged(g, (size_t)1 << 20, bench_build_weights_job, b)); /* (its tables' copies: the stage) */
    QSA__TRY(qsa__cuda_scratch(m, g, m->params.max_chunk));
    QSA__CU(qsa__cu.cuCtxSynchronize());
    b->load_s = qsa__now() - t0;
    bench_row *w = row_add(b, "load", "synthetic weights, device fill");
    w->ms = 1e3 * b->load_s;
    w->n = 1;
    w->unit = 'B';
    w->per_tok = (double)g->bytes_weights;
    w->achieved = w->per_tok / b->load_s / 1e9;
    snprintf(w->note, sizeof w->note, "allocation + random fill, no disk I/O: not a checkpoint load");
    row_print(w);
    /* memory plan: what the pool and the sequences may use */
    size_t fr = 0, tot = 0;
    QSA__CU(qsa__cu.cuMemGetInfo_v2(&fr, &tot));
    const qsa_model_config *c = &b->cfg;
    int ps = m->params.kv_page_size > 0 ? m->params.kv_page_size : qsa__default_page_size(c);
    int mb = m->params.max_batch;
    double reserve = (double)mb * (c->vocab_size * 4.0 + (c->max_position_embeddings / 4 + 2) * 4.0) + (1.5 * 1073741824.0);
    plan_decode(b, pl, ps, (double)fr - reserve);
    m->cuda = g;
    printf("memory: weights %.1f GiB, scratch %.2f GiB; %.1f of %.1f GiB free for KV pages and sequences (%.1f GiB kept back)\n",
           g->bytes_weights / 1073741824.0, g->bytes_scratch / 1073741824.0, fr / 1073741824.0, tot / 1073741824.0,
           reserve / 1073741824.0);
    fflush(stdout);
    return bench_pool(b, pl->pool_tokens);
}

/* A sequence holding P tokens without a prefill (see SHORTCUTS in the top comment). */
static qsa_result bench_seq_fill(bench *b, qsa_seq *s, int P) {
    qsa_model *m = b->m;
    const qsa_model_config *c = &m->cfg;
    qsa__cuda_seq *cs = s->cuda;
    QSA__TRY(qsa__seq_reserve(s, P));
    for (int t = 0; t < P; t++) s->tokens[t] = (int32_t)(rng_next(b) % (uint64_t)c->vocab_size);
    int key_dim = c->linear_num_key_heads * c->linear_key_head_dim;
    int conv_dim = 2 * key_dim + c->linear_num_value_heads * c->linear_value_head_dim;
    for (int l = 0; l < c->num_hidden_layers; l++) {
        qsa__seq_layer *sl = &s->L[l];
        if (c->layer_types[l] == QSA_LAYER_LINEAR) {
            QSA__TRY(fill_f32(b, cs->conv[l], (size_t)(c->linear_conv_kernel_dim - 1) * conv_dim, 0.5f, 0.0f));
            QSA__TRY(fill_f32(b, cs->S[l], (size_t)c->linear_num_value_heads * c->linear_key_head_dim * c->linear_value_head_dim,
                              0.02f, 0.0f));
        } else if (c->has_qsa) {
            int r = c->indexer_compress_ratio;
            if (P / r > 0) QSA__TRY(fill_f32(b, cs->bkeys[l], (size_t)(P / r) * c->indexer_head_dim, 1.5f, 0.0f));
            sl->n_blocks = P / r;
        }
        if (m->layers[l].ple && sl->ple_ids)
            for (int j = 0; j < c->ngram_size - 1; j++) {
                int t = P - (c->ngram_size - 1) + j;
                sl->ple_ids[j] = t >= 0 ? s->tokens[t] : c->eos_token_ids[0];
            }
    }
    s->pos = P;
    return QSA_OK;
}

static long count_nonfinite(const float *v, size_t n) {
    long k = 0;
    for (size_t i = 0; i < n; i++) k += !isfinite(v[i]);
    return k;
}

/* NVML for the bench's device, found by its PCI address; without the library (or the device) the rows
   carry no clock note. */
static void nvml_open(bench *b) {
    b->nvml_tried = 1;
    void *lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) return;
    int (*init)(void) = (int (*)(void))dlsym(lib, "nvmlInit_v2");
    int (*by_bus)(const char *, void **) = (int (*)(const char *, void **))dlsym(lib, "nvmlDeviceGetHandleByPciBusId_v2");
    b->nvml_clock = (int (*)(void *, int, unsigned *))dlsym(lib, "nvmlDeviceGetClockInfo");
    b->nvml_reasons = (int (*)(void *, unsigned long long *))dlsym(lib, "nvmlDeviceGetCurrentClocksEventReasons");
    if (!b->nvml_reasons) b->nvml_reasons = (int (*)(void *, unsigned long long *))dlsym(lib, "nvmlDeviceGetCurrentClocksThrottleReasons");
    int dom = 0, bus = 0, dev = 0;
    char id[32];
    if (!init || !by_bus || !b->nvml_clock || init() != 0 ||
        qsa__cu.cuDeviceGetAttribute(&dom, 50 /* CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID */, b->g->dev) != 0 ||
        qsa__cu.cuDeviceGetAttribute(&bus, 33 /* CU_DEVICE_ATTRIBUTE_PCI_BUS_ID */, b->g->dev) != 0 ||
        qsa__cu.cuDeviceGetAttribute(&dev, 34 /* CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID */, b->g->dev) != 0) {
        dlclose(lib);
        return;
    }
    snprintf(id, sizeof id, "%08x:%02x:%02x.0", (unsigned)dom, (unsigned)bus, (unsigned)dev);
    if (by_bus(id, &b->nvml_dev) != 0) {
        b->nvml_dev = NULL;
        dlclose(lib);
        return;
    }
    b->nvml_lib = lib;
}

/* The SM clock now (into [*lo, *hi]) and the clock-event reasons (OR-ed into *why). */
static void nvml_sample(bench *b, unsigned *lo, unsigned *hi, unsigned long long *why) {
    if (!b->nvml_tried) nvml_open(b);
    if (!b->nvml_lib) return;
    unsigned mhz = 0;
    unsigned long long r = 0;
    if (b->nvml_clock(b->nvml_dev, 1 /* NVML_CLOCK_SM */, &mhz) == 0) {
        if (mhz < *lo) *lo = mhz;
        if (mhz > *hi) *hi = mhz;
    }
    if (b->nvml_reasons && b->nvml_reasons(b->nvml_dev, &r) == 0) *why |= r;
}

/* "; SM lo-hi MHz (reasons)" for a row's note, or "" without samples.  The reasons named are the
   slowdowns (NVML's clock-event bits): power cap 0x4, hardware slowdown 0x8, software thermal 0x20,
   hardware thermal 0x40, power brake 0x80. */
static void nvml_note(char *out, size_t n, unsigned lo, unsigned hi, unsigned long long why) {
    out[0] = 0;
    if (hi == 0) return;
    static const struct { unsigned long long bit; const char *name; } rs[] = {
        {0x4, "power cap"}, {0x8, "HW slowdown"}, {0x20, "SW thermal"}, {0x40, "HW thermal"}, {0x80, "power brake"}};
    char r[96] = "";
    for (size_t i = 0; i < sizeof rs / sizeof rs[0]; i++)
        if (why & rs[i].bit) snprintf(r + strlen(r), sizeof r - strlen(r), "%s%s", r[0] ? ", " : " (", rs[i].name);
    if (r[0]) snprintf(r + strlen(r), sizeof r - strlen(r), ")");
    if (lo == hi) snprintf(out, n, "; SM %u MHz%s", hi, r);
    else snprintf(out, n, "; SM %u-%u MHz%s", lo, hi, r);
}

/* Decode steps on B sequences: mode 0 qsa_seq_feed (B = 1) with the library's defaults (batched
   step and graphs on), 1 batched, 2 batched + CUDA graphs, 3 qsa_seq_feed (B = 1) through the
   chunked forward (cuda_batch_decode off), 4 as 2 through qsa_seq_feed_batch_greedy (the arg-max on
   the device: B ids cross to the host instead of B logits rows; the ids are checked to be in the
   vocabulary), 5 as 2 with each row's token drawn on the host (qsa_sampler_sample: temperature 0.6, top-k
   20, top-p 0.95, the Qwen3 defaults), 6 as 5 with the rows reduced to their candidates on the device
   (struct qsa__cand_req, as the scheduler's steps), 7 and 8 as 5 and 6 with top-p 0.95 alone (a whole-row draw: on
   the device its QSA__CAND_Z best and the row's sum, or its logits where those do not decide it), 9 and 10 as 7 and 8
   with the temperature alone (a whole-row draw too).  Modes 5 to 10 time the step with its draws on the host's clock.  The per-launch profile: modes 1 and 3 (eager). */
static qsa_result bench_decode_mode(bench *b, qsa_seq **seqs, int B, int ctx, int mode, float *logits, const char *tag) {
    qsa_model *m = b->m;
    int V = m->cfg.vocab_size;
    char cfg[64];
    snprintf(cfg, sizeof cfg, "B=%d ctx=%d %s", B, ctx, tag);
    if (!may_run(b, "decode", cfg)) return QSA_OK;
    const int single = mode == 0 || mode == 3;
    const int sampled = mode >= 5 && mode <= 10, whole = mode >= 7, dev = sampled && mode % 2 == 0, kc = whole ? QSA__CAND_Z : 20;
    m->params.cuda_batch_decode = mode <= 2 || mode >= 4;
    m->params.cuda_graphs = mode == 0 || mode == 2 || mode >= 4;
    int32_t *tok = QSA__ALLOC(int32_t, 2 * B), *next = tok ? tok + B : NULL;
    long bad_ids = 0, not_reduced = 0, from_row = 0;
    qsa_sampler **smp = sampled ? QSA__CALLOC(qsa_sampler *, B) : NULL;
    int32_t *cand = sampled ? QSA__ALLOC(int32_t, (size_t)B * QSA__CAND_STRIDE(kc)) : NULL;
    qsa__cand_req cq = {smp, cand, kc};
    double t[256], wall[256];
    int n = 0, total = b->o.warmup + b->o.steps;
    if (total > 256) total = 256;
    qsa_result r = tok && (!sampled || (smp && cand)) ? QSA_OK : qsa__fail(QSA_ERR_OUT_OF_MEMORY, "bench: out of host memory");
    for (int k = 0; r == QSA_OK && sampled && k < B; k++) {
        qsa_sampling_params sp;
        memset(&sp, 0, sizeof sp);
        sp.temperature = b->o.sample_temp;
        sp.top_k = whole ? 0 : kc;
        sp.top_p = mode >= 9 ? 0.0f : 0.95f;
        sp.seed = 1 + (uint64_t)k;
        r = qsa_sampler_create(&sp, &smp[k]);
    }
    /* --profiler-row: the profiler's range around this row's steps (the first row that matches) */
    CUresult (*prof_stop)(void) = NULL;
    void *cu = NULL; /* (the loaded driver, referenced while the range is open) */
    if (r == QSA_OK && b->o.profiler_row && !b->profiler_done && strstr(cfg, b->o.profiler_row)) {
        cu = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
        CUresult (*start)(void) = cu ? (CUresult(*)(void))dlsym(cu, "cuProfilerStart") : NULL;
        prof_stop = cu ? (CUresult(*)(void))dlsym(cu, "cuProfilerStop") : NULL;
        if (!start || !prof_stop || start() != 0) {
            fprintf(stderr, "bench: --profiler-row: cuProfilerStart is not available\n");
            prof_stop = NULL;
        }
        b->profiler_done = 1;
    }
    if (b->o.settle_ms > 0) { /* an idle GPU before the row (--settle-ms) */
        struct timespec ts = {b->o.settle_ms / 1000, (long)(b->o.settle_ms % 1000) * 1000000L};
        nanosleep(&ts, NULL);
    }
    double t0 = qsa__now();
    unsigned clk_lo = ~0u, clk_hi = 0;
    unsigned long long clk_why = 0;
    for (int i = 0; r == QSA_OK && i < total; i++) {
        for (int k = 0; k < B; k++) tok[k] = (int32_t)(rng_next(b) % (uint64_t)V);
        double ms, h0 = qsa__now();
        r = ev_begin(b);
        if (r == QSA_OK)
            r = single      ? qsa_seq_feed(seqs[0], tok, 1, logits, 0)
                : mode == 4 ? qsa_seq_feed_batch_greedy(seqs, tok, B, next)
                : dev       ? qsa__feed_batch_locked(seqs, tok, B, logits, NULL, &cq)
                            : qsa_seq_feed_batch(seqs, tok, B, logits);
        if (r == QSA_OK) r = ev_end(b, &ms);
        for (int k = 0; r == QSA_OK && sampled && k < B; k++) { /* (the draws see the history the step left) */
            const int32_t *row = cand + (size_t)k * QSA__CAND_STRIDE(kc);
            int pen = dev && row[1] == -2; /* (the penalised logits of a whole-row draw its candidates did not decide) */
            not_reduced += dev && row[1] == -1;
            from_row += pen;
            next[k] = dev && row[1] >= 0 ? qsa__sampler_from_cand(smp[k], row, kc)
                                         : qsa__sampler_sample_z(smp[k], logits + (size_t)k * V, V, pen ? NULL : seqs[k]->tokens,
                                                                 pen ? 0 : seqs[k]->pos, pen ? qsa__cand_z(row, kc) : 0);
        }
        for (int k = 0; r == QSA_OK && (mode == 4 || sampled) && k < B; k++) bad_ids += next[k] < 0 || next[k] >= V;
        if (r == QSA_OK && i >= b->o.warmup) {
            wall[n] = 1e3 * (qsa__now() - h0);
            t[n] = sampled ? wall[n] : ms;
            n++;
            nvml_sample(b, &clk_lo, &clk_hi, &clk_why); /* after the step's events: not timed */
        }
        if (r == QSA_OK && n >= 3 && qsa__now() - t0 > 4.0) break; /* enough for a median */
    }
    if (prof_stop) prof_stop();
    if (cu) dlclose(cu);
    if (r == QSA_OK && b->o.profile && (mode == 1 || mode == 3) && qsa__prof_begin() == QSA_OK) {
        int steps = 3;
        for (int i = 0; r == QSA_OK && i < steps; i++) {
            for (int k = 0; k < B; k++) tok[k] = (int32_t)(rng_next(b) % (uint64_t)V);
            r = single ? qsa_seq_feed(seqs[0], tok, 1, logits, 0) : qsa_seq_feed_batch(seqs, tok, B, logits);
        }
        if (r == QSA_OK) {
            printf("\nprofile: decode %s, per step (%d steps):\n", cfg, steps);
            qsa__prof_report(stdout, steps, 40);
            printf("\n");
        }
        qsa__prof_end();
    }
    m->params.cuda_batch_decode = 0;
    m->params.cuda_graphs = 0;
    /* FNV-1a of the last step's logits (or ids): two runs of one tree under different launch switches
       draw the same tokens from the seeded generator, so they must show the same bits */
    const uint64_t fnv0 = 0xcbf29ce484222325ull; /* (the offset basis, as the kernel cache's sums) */
    const int ids = mode == 4 || sampled;
    unsigned long long fp = r != QSA_OK ? 0
                            : ids ? qsa__fnv(fnv0, next, sizeof(int32_t) * (size_t)B)
                                  : qsa__fnv(fnv0, logits, sizeof(float) * (size_t)(single ? 1 : B) * V);
    qsa__free(tok);
    for (int k = 0; smp && k < B; k++) qsa_sampler_free(smp[k]);
    qsa__free(smp);
    qsa__free(cand);
    if (r != QSA_OK) { row_fail(b, "decode", cfg, r); return r; }
    bench_row *w = row_add(b, "decode", cfg);
    w->ms = median(t, n);
    w->n = n;
    w->tok_s = B / (w->ms * 1e-3);
    decode_bytes d = count_decode(b, B, ctx);
    w->unit = 'B';
    w->per_tok = d.total / B;
    w->achieved = d.total / (w->ms * 1e-3) / 1e9;
    w->frac = b->copy_gbs > 0 ? w->achieved / b->copy_gbs : -1;
    long bad = mode == 4 || dev ? 0 : count_nonfinite(logits, (size_t)B * V);
    /* (median sorted t: its first and last steps are the fastest and the slowest) */
    char clk[160];
    nvml_note(clk, sizeof clk, clk_lo, clk_hi, clk_why);
    char nr[128] = ""; /* (QSA_SAMPLE_DEVICE=0, or a TP model: the rows' logits came instead) */
    if (not_reduced) snprintf(nr, sizeof nr, "; %ld rows drawn from their logits", not_reduced);
    if (from_row) snprintf(nr + strlen(nr), sizeof nr - strlen(nr), "; %ld whole-row draws from their logits", from_row);
    snprintf(w->note, sizeof w->note, "%shost wall %.3f ms; steps %.3f-%.3f ms; %.0f experts/layer (expected, uniform routing); last step %s fnv %016llx%s%s%s",
             sampled ? "timed on the host's clock with the draws; " : "", median(wall, n), t[0], t[n - 1], d.unique_experts,
             ids ? "ids" : "logits", fp, nr, clk, bad ? "; NON-FINITE LOGITS" : bad_ids ? "; IDS OUTSIDE THE VOCABULARY" : "");
    if (bad || bad_ids) b->failed = 1;
    row_print(w);
    return QSA_OK;
}

/* --marginal: what each kernel costs inside the graph-replayed decode step (B = 1: qsa_seq_feed with
   the library's defaults; B > 1: qsa_seq_feed_batch with graphs), which --profile's events around
   eager launches cannot say (they add the launch latency that a graph with programmatic dependent
   launches hides, and miss the overlap).  An eager profile of the same step names its kernel shapes
   (kernel and launch shape, as in the --profile table); for each of the BENCH_MARGINAL_KEYS
   costliest, the step is captured again with that shape's launches left out (qsa__prof_skip) and
   timed; the marginal cost is the full step's median (measured before, between every 8 and after the
   shapes, on the same footing) minus that median.  Each measurement takes fresh sequences at the
   context.  The outputs of a step without one of its kernels are garbage: a step whose logits are not
   finite is flagged (its routing, hence its expert work, may differ). */
#define BENCH_MARGINAL_KEYS 24
static qsa_result marginal_feed(qsa_seq **seqs, int B, int32_t *tok, float *logits) {
    return B == 1 ? qsa_seq_feed(seqs[0], tok, 1, logits, 0) : qsa_seq_feed_batch(seqs, tok, B, logits);
}
static qsa_result marginal_step(bench *b, qsa_seq **seqs, int B, const qsa_seq_params *sp, int ctx, float *logits,
                                int32_t *tok, double *ms_out, long *bad) {
    qsa_model *m = b->m;
    int V = m->cfg.vocab_size;
    for (int k = 0; k < B; k++) {
        qsa_seq_free(seqs[k]);
        seqs[k] = NULL;
    }
    for (int k = 0; k < B; k++) {
        QSA__TRY(qsa_seq_create(m, sp, &seqs[k]));
        QSA__TRY(bench_seq_fill(b, seqs[k], ctx));
    }
    qsa__cuda_batch_drop_graphs(b->g); /* the first step captures the graph anew, with the skip in force */
    double t[256];
    int n = 0;
    *bad = 0;
    for (int i = 0; i < b->o.warmup + b->o.steps && i < 256; i++) {
        for (int k = 0; k < B; k++) tok[k] = (int32_t)(rng_next(b) % (uint64_t)V);
        double ms = 0;
        QSA__TRY(ev_begin(b));
        QSA__TRY(marginal_feed(seqs, B, tok, logits));
        QSA__TRY(ev_end(b, &ms));
        if (i >= b->o.warmup) t[n++] = ms;
        *bad += count_nonfinite(logits, (size_t)B * V) > 0;
    }
    *ms_out = median(t, n);
    return QSA_OK;
}

static void bench_marginal(bench *b, qsa_seq **seqs, int B, int ctx, const qsa_seq_params *sp, float *logits) {
    char cfg[64];
    snprintf(cfg, sizeof cfg, "B=%d ctx=%d %s", B, ctx, B == 1 ? "single" : "batched+graphs");
    if (!b->o.marginal || !may_run(b, "marginal", cfg)) return;
    qsa_model *m = b->m;
    qsa__prof_key keys[BENCH_MARGINAL_KEYS];
    int nk = 0, steps = 3;
    double base[8], eager_total = 0;
    int nb = 0;
    int32_t *tok = QSA__ALLOC(int32_t, B);
    if (!tok) { row_fail(b, "marginal", cfg, qsa__fail(QSA_ERR_OUT_OF_MEMORY, "bench: out of host memory")); return; }
    /* the kernel shapes, from an eager profile of the same step */
    m->params.cuda_batch_decode = 1;
    m->params.cuda_graphs = 0;
    qsa_result r = qsa__prof_begin();
    for (int i = 0; r == QSA_OK && i < steps; i++) {
        for (int k = 0; k < B; k++) tok[k] = (int32_t)(rng_next(b) % (uint64_t)m->cfg.vocab_size);
        r = marginal_feed(seqs, B, tok, logits);
    }
    if (r == QSA_OK) {
        qsa__prof_flush();
        qsa__prof_state *p = qsa__prof;
        qsort(p->keys, (size_t)p->nkeys, sizeof p->keys[0], qsa__prof_cmp);
        for (int i = 0; i < p->nkeys; i++) eager_total += p->keys[i].ms / steps;
        for (int i = 0; i < p->nkeys && nk < BENCH_MARGINAL_KEYS; i++) keys[nk++] = p->keys[i];
    }
    qsa__prof_end();
    m->params.cuda_graphs = 1;
    double ms[BENCH_MARGINAL_KEYS];
    long bad[BENCH_MARGINAL_KEYS], bbad = 0;
    for (int i = 0; r == QSA_OK && i <= nk; i++) {
        if (i % 8 == 0 || i == nk) { /* the full step: before, between every 8 shapes and after */
            long bd = 0;
            r = marginal_step(b, seqs, B, sp, ctx, logits, tok, &base[nb], &bd);
            bbad += bd;
            if (r == QSA_OK) nb++;
        }
        if (i == nk || r != QSA_OK) break;
        qsa__prof_skip = &keys[i];
        r = marginal_step(b, seqs, B, sp, ctx, logits, tok, &ms[i], &bad[i]);
        qsa__prof_skip = NULL;
    }
    qsa__prof_skip = NULL;
    qsa__cuda_batch_drop_graphs(b->g);
    m->params.cuda_batch_decode = 0;
    m->params.cuda_graphs = 0;
    qsa__free(tok);
    if (r != QSA_OK) { row_fail(b, "marginal", cfg, r); return; }
    double full = median(base, nb), sum = 0;
    printf("\nmarginal cost inside the graph-replayed step, %s: the full step %.3f ms (median of %d measurements%s),\n"
           "eager profile %.3f ms of kernels per step:\n",
           cfg, full, nb, bbad ? "; NON-FINITE LOGITS" : "", eager_total);
    printf("| kernel | grid | block | launches/step | eager us/step | in-graph us/step | of the step | step without it |\n"
           "|---|---|---:|---:|---:|---:|---:|---:|\n");
    for (int i = 0; i < nk; i++) {
        const qsa__prof_key *k = &keys[i];
        const char *nm = k->name + (strncmp(k->name, "qsa_k_", 6) ? 0 : 6);
        double saved = full - ms[i];
        sum += saved;
        printf("| %s | %u,%u,%u | %u | %.1f | %.1f | %.1f | %.1f%% | %.3f ms%s |\n", nm, k->gx, k->gy, k->gz, k->bx,
               (double)k->calls / steps, 1000.0 * k->ms / steps, 1000.0 * saved, 100.0 * saved / full, ms[i],
               bad[i] ? " (non-finite logits)" : "");
        char c2[64];
        snprintf(c2, sizeof c2, "%s %u,%u,%u x %u", nm, k->gx, k->gy, k->gz, k->bx);
        bench_row *w = row_add(b, "marginal", c2);
        w->ms = saved;
        w->n = b->o.steps;
        snprintf(w->note, sizeof w->note, "%s; %.1f launches/step; eager %.1f us/step; the step without it %.3f ms of %.3f%s",
                 cfg, (double)k->calls / steps, 1000.0 * k->ms / steps, ms[i], full, bad[i] ? "; non-finite logits" : "");
    }
    printf("| the %d shapes together | | | | | %.1f | %.1f%% | |\n\n", nk, 1000.0 * sum, 100.0 * sum / full);
    fflush(stdout);
}

static qsa_result bench_prefill(bench *b, bench_plan *pl, float *logits) {
    qsa_model *m = b->m;
    int N = b->o.prefill, V = m->cfg.vocab_size;
    char cfg[64];
    snprintf(cfg, sizeof cfg, "%d-token prompt", N);
    if (!may_run(b, "prefill", cfg)) return QSA_OK;
    int32_t *ids = QSA__ALLOC(int32_t, N);
    if (!ids) return qsa__fail(QSA_ERR_OUT_OF_MEMORY, "bench: out of host memory");
    for (int i = 0; i < N; i++) ids[i] = (int32_t)(rng_next(b) % (uint64_t)V);
    qsa_seq_params sp;
    sp.n_ctx = N + pl->steps_per_seq + 1;
    qsa_seq *s = NULL;
    double t[32], ttft = 0;
    int n = 0;
    /* warm-up: one chunk */
    qsa_result r = qsa_seq_create(m, &sp, &s);
    if (r == QSA_OK) r = qsa_seq_feed(s, ids, N < 512 ? N : 512, logits, 0);
    if (s) { qsa_seq_free(s); s = NULL; }
    double t_all = qsa__now();
    for (int rep = 0; r == QSA_OK && rep < b->o.prefill_reps && rep < 32; rep++) {
        double ms, h0 = qsa__now();
        if (rep == 0) r = qsa_seq_create(m, &sp, &s); /* the first repeat is the time-to-first-token run */
        else qsa_seq_reset(s);
        if (r == QSA_OK) r = ev_begin(b);
        if (r == QSA_OK) r = qsa_seq_feed(s, ids, N, logits, 0);
        if (r == QSA_OK) r = ev_end(b, &ms);
        if (r != QSA_OK) break;
        t[n++] = ms;
        if (rep == 0) {
            int best = 0;
            for (int i = 1; i < V; i++) if (logits[i] > logits[best]) best = i;
            ttft = qsa__now() - h0;
            (void)best;
        }
        if (qsa__now() - t_all > 60.0) break;
    }
    if (r == QSA_OK && b->o.profile && qsa__prof_begin() == QSA_OK) {
        qsa_seq_reset(s);
        r = qsa_seq_feed(s, ids, N, logits, 0);
        if (r == QSA_OK) {
            printf("\nprofile: prefill %s (one prefill):\n", cfg);
            qsa__prof_report(stdout, 1, 40);
            printf("\n");
        }
        qsa__prof_end();
    }
    qsa__free(ids);
    if (r != QSA_OK) {
        if (s) qsa_seq_free(s);
        row_fail(b, "prefill", cfg, r);
        return r;
    }
    double flops = flops_prefill(b, N);
    bench_row *w = row_add(b, "prefill", cfg);
    w->ms = median(t, n);
    w->n = n;
    w->tok_s = N / (w->ms * 1e-3);
    w->unit = 'F';
    w->per_tok = flops / N;
    w->achieved = flops / (w->ms * 1e-3) / 1e12;
    w->frac = b->wmma_tflops > 0 ? w->achieved / b->wmma_tflops : -1;
    long bad = count_nonfinite(logits, (size_t)V);
    snprintf(w->note, sizeof w->note, "chunks of %d%s", m->params.max_chunk, bad ? "; NON-FINITE LOGITS" : "");
    if (bad) b->failed = 1;
    row_print(w);
    bench_row *f = row_add(b, "time to first token", cfg);
    f->ms = 1e3 * ttft;
    f->n = 1;
    snprintf(f->note, sizeof f->note, "sequence create + prefill + greedy pick; + JIT warm %.3f s at model load", b->jit_warm_s);
    row_print(f);
    /* decode on the really prefilled sequence: the check of the filled-context shortcut */
    qsa_seq *one[1] = {s};
    bench_decode_mode(b, one, 1, N, 0, logits, "single, after a real prefill");
    qsa_seq_free(s);
    return QSA_OK;
}

static qsa_result bench_decode(bench *b, bench_plan *pl, float *logits) {
    qsa_model *m = b->m;
    for (int k = 0; k < pl->n && !b->broken; k++) {
        int B = pl->batch[k], ctx = pl->ctx[k];
        char cfg[64];
        snprintf(cfg, sizeof cfg, "B=%d ctx=%d", B, ctx);
        if (k == 0 || pl->ctx[k - 1] != ctx) { /* a new context: the pool for its largest feasible batch */
            long long tok = 0;
            for (int j = k; j < pl->n && pl->ctx[j] == ctx; j++) if (pl->ok[j] && pl->pool_tok[j] > tok) tok = pl->pool_tok[j];
            qsa_result pr = tok ? bench_pool(b, tok) : QSA_OK;
            if (pr != QSA_OK) {
                row_fail(b, "KV pool", cfg, pr);
                for (; k + 1 < pl->n && pl->ctx[k + 1] == ctx; k++) {}
                continue;
            }
        }
        if (!pl->ok[k]) {
            char why[160];
            snprintf(why, sizeof why, "needs %.1f GiB of KV pages + %.1f GiB of sequence state: does not fit",
                     pl->pool_tok[k] * pool_bytes_per_token(&b->cfg) / 1073741824.0, pl->need_state[k] / 1073741824.0);
            row_skip(b, "decode", cfg, why);
            continue;
        }
        if (!may_run(b, "decode", cfg)) continue;
        qsa_seq **seqs = QSA__CALLOC(qsa_seq *, B);
        if (!seqs) return qsa__fail(QSA_ERR_OUT_OF_MEMORY, "bench: out of host memory");
        qsa_seq_params sp;
        sp.n_ctx = pl->n_ctx[k];
        qsa_result r = QSA_OK;
        for (int i = 0; r == QSA_OK && i < B; i++) {
            r = qsa_seq_create(m, &sp, &seqs[i]);
            if (r == QSA_OK) r = bench_seq_fill(b, seqs[i], ctx);
        }
        if (r == QSA_OK) r = QSA__CU_R(qsa__cu.cuStreamSynchronize(b->g->stream));
        if (r != QSA_OK) row_fail(b, "decode", cfg, r);
        else {
            if (B == 1) bench_decode_mode(b, seqs, 1, ctx, 0, logits, "single");
            if (B == 1 && !b->broken) bench_decode_mode(b, seqs, 1, ctx, 3, logits, "single, chunked forward");
            if (!b->broken) bench_decode_mode(b, seqs, B, ctx, 1, logits, "batched");
            if (b->o.graphs && !b->broken) bench_decode_mode(b, seqs, B, ctx, 2, logits, "batched+graphs");
            if (b->o.graphs && !b->broken) bench_decode_mode(b, seqs, B, ctx, 4, logits, "batched+graphs, greedy ids");
            static const char *const drawn[] = {"top-k 20 drawn on the host", "top-k 20 from device candidates",
                                                "top-p 0.95 drawn on the host", "top-p 0.95 from device candidates",
                                                "temperature alone drawn on the host",
                                                "temperature alone from device candidates"}; /* (modes 5 .. 10) */
            for (int d = 0; b->o.graphs && !b->o.no_sampled && d < 6 && !b->broken; d++) {
                char tag[96];
                snprintf(tag, sizeof tag, "batched+graphs, %s", drawn[d]);
                bench_decode_mode(b, seqs, B, ctx, 5 + d, logits, tag);
            }
            /* the first row again, after the others: the two should agree (a difference is a warm-up or
               ordering effect of the context's first steps, not of the path) */
            if (B == 1 && !b->broken) bench_decode_mode(b, seqs, 1, ctx, 0, logits, "single, again");
            if (ctx == pl->ctx[0] && !b->broken) bench_marginal(b, seqs, B, ctx, &sp, logits);
        }
        for (int i = 0; i < B; i++) if (seqs[i]) qsa_seq_free(seqs[i]);
        qsa__free(seqs);
    }
    return QSA_OK;
}

int main(int argc, char **argv) {
    cli_check_stdout("bench");
    static bench bb;
    bench *b = &bb;
    int pr = parse_args(argc, argv, &b->o);
    if (pr > 0) { usage(stdout); return 0; }
    if (pr < 0) return 2;
    qsa_set_logger(qsa_log_stderr, NULL, b->o.verbose ? QSA_LOG_INFO : QSA_LOG_WARN);
    b->t_start = qsa__now();
    b->rng = 0x9E3779B97F4A7C15ull ^ (b->o.seed * 0xD1342543DE82EF95ull);
    if (!b->rng) b->rng = 1;
    if (bench_config(&b->o, &b->cfg) != QSA_OK || bench_check_shape(&b->cfg) != QSA_OK) {
        fprintf(stderr, "bench: %s\n", qsa_last_error());
        return 2;
    }
    b->dry = 1;
    bench_build_weights(b); /* counts only */
    print_summary(b);
    /* temporary cache directories: the cold JIT must not find anything */
    snprintf(b->tmpdir, sizeof b->tmpdir, "%s/qsa_bench.XXXXXX", getenv("TMPDIR") && getenv("TMPDIR")[0] ? getenv("TMPDIR") : "/tmp");
    if (!mkdtemp(b->tmpdir)) {
        fprintf(stderr, "bench: cannot create a temporary directory %s\n", b->tmpdir);
        return 2;
    }
    char drv[300];
    snprintf(drv, sizeof drv, "%.280s/driver", b->tmpdir);
    if (!b->o.keep_driver_cache && !b->o.no_ceilings) setenv("CUDA_CACHE_PATH", drv, 1); /* read by cuInit */
    if (qsa__cuda_load() != QSA_OK || qsa__nvrtc_load() != QSA_OK) {
        fprintf(stderr, "bench: no usable CUDA GPU: %s\n", qsa_last_error());
        rm_tree(b->tmpdir);
        return 2;
    }
    qsa_result r = bench_device_init(b);
    if (r != QSA_OK) {
        fprintf(stderr, "bench: CUDA device %d: %s\n", b->o.device, qsa_last_error());
        rm_tree(b->tmpdir);
        return 2;
    }
    float *logits = NULL;
    bench_plan plan;
    memset(&plan, 0, sizeof plan);
    printf("\n== measurements ==\n");
    if (!b->o.no_ceilings) bench_jit(b);
    else if ((r = qsa__cuda_module(b->g, b->o.arch)) != QSA_OK) row_fail(b, "kernel module", "", r);
    if (!b->g->mods[0]) goto report;
    if ((r = fill_module(b)) != QSA_OK) { row_fail(b, "fill kernels", "bench_fill.cu", r); goto report; }
    if (!b->o.no_ceilings && may_run(b, "copy bandwidth", "") && (r = bench_copy(b)) != QSA_OK) row_fail(b, "copy bandwidth", "", r);
    if (may_run(b, "logits to host", "") && (r = bench_host_copy(b)) != QSA_OK) /* (~0.1 s: also without the ceilings) */
        row_fail(b, "logits to host", "", r);
    if (!b->o.no_ceilings) bench_launch_floor(b);
    if (!b->o.no_ceilings) {
        int S = b->o.quick ? 4096 : 8192;
        if (may_run(b, "fp16 WMMA GEMM", "") && (r = bench_gemm(b, "fp16 WMMA GEMM", S, S, S, 0, 10, 0, 0, 1, 0)) != QSA_OK)
            row_fail(b, "fp16 WMMA GEMM", "", r);
        if (may_run(b, "nvfp4 GEMM", "") && (r = bench_gemm(b, "nvfp4 GEMM", S, S, S, 1, 10, 0, 0, 1, 0)) != QSA_OK) row_fail(b, "nvfp4 GEMM", "", r);
        if (may_run(b, "fp16 GEMV", "") && (r = bench_gemm(b, "fp16 GEMV", 1, 4 * S, S, 0, 20, 0, 0, 1, 0)) != QSA_OK) row_fail(b, "fp16 GEMV", "", r);
        if (may_run(b, "nvfp4 GEMV", "") && (r = bench_gemm(b, "nvfp4 GEMV", 1, 4 * S, S, 1, 20, 0, 0, 1, 0)) != QSA_OK) row_fail(b, "nvfp4 GEMV", "", r);
    }
    if (b->o.n_gemv) bench_gemv_shapes(b);
    if (b->broken) goto report;
    if ((r = bench_host_model(b)) != QSA_OK) { row_fail(b, "load", "host side", r); goto report; }
    if (!may_run(b, "load", "synthetic model")) goto report;
    if ((r = bench_load(b, &plan)) != QSA_OK) { row_fail(b, "load", "synthetic model", r); goto report; }
    {
        int mb = b->m->params.max_batch;
        size_t lb = (size_t)mb * b->cfg.vocab_size * sizeof(float);
        logits = b->o.pageable_logits ? QSA__ALLOC(float, lb / sizeof(float)) : (float *)qsa_host_alloc(b->m, lb);
        if (!logits) { fprintf(stderr, "bench: out of host memory for logits\n"); b->failed = 1; goto report; }
        printf("  (the logits of every row land in %s host memory)\n", b->o.pageable_logits ? "pageable" : "page-locked");
    }
    bench_prefill(b, &plan, logits);
    if (!b->broken) bench_decode(b, &plan, logits);
report:
    print_table(b);
    if (b->o.out) write_json(b, b->o.out, argc, argv);
    if (b->o.pageable_logits) qsa__free(logits);
    else qsa_host_free(logits); /* (before the context goes: its primary context is retained anyway) */
    if (b->g) {
        qsa__cu.cuCtxSetCurrent(b->g->ctx);
        if (!b->broken) qsa__cu.cuCtxSynchronize();
        if (b->fillmod) qsa__cu.cuModuleUnload(b->fillmod);
        for (int i = 0; i < 3; i++) if (b->pool_mem[i]) qsa__cu.cuMemFree_v2(b->pool_mem[i]);
        if (b->ev0) qsa__cu.cuEventDestroy_v2(b->ev0);
        if (b->ev1) qsa__cu.cuEventDestroy_v2(b->ev1);
        qsa__cuda_free(b->g); /* every device allocation, the module, the stream, the context */
        if (b->m) b->m->cuda = NULL;
        b->g = NULL;
    }
    bench_host_model_free(b);
    rm_tree(b->tmpdir);
    printf("bench: %s (%.0f s)\n", b->failed ? "some measurements FAILED" : "done", qsa__now() - b->t_start);
    return b->failed ? 1 : 0;
}
#endif /* QSA_NO_CUDA */
