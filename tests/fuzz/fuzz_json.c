/* fuzz_json.c - libFuzzer harness for the JSON parser and the config readers.
 *
 *   clang -g -O1 -fsanitize=fuzzer,address,undefined -o fuzz_json tests/fuzz/fuzz_json.c -lm -ldl -lpthread
 *   ./fuzz_json -max_total_time=60 corpus/
 *
 * The input is parsed as JSON (the tree is then walked and its invariants checked), as config.json,
 * as hf_quant_config.json next to a valid config, and as generation_config.json.  Any crash, leak,
 * sanitizer report or violated invariant (abort) is a bug. */
#define QSA_RUNTIME_IMPLEMENTATION
#include "../../qsa_runtime.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FZ_ASSERT(c) do { if (!(c)) { fprintf(stderr, "invariant failed: %s (line %d)\n", #c, __LINE__); abort(); } } while (0)

static size_t fz_walk(const qsa__json *v, int depth, int in_object) {
    FZ_ASSERT(depth <= QSA__JSON_MAX_DEPTH);
    FZ_ASSERT(in_object ? v->key != NULL && v->key[v->key_len] == 0 : v->key == NULL);
    size_t nodes = 1;
    switch (v->type) {
    case QSA__JSON_STRING: FZ_ASSERT(v->str && v->str[v->len] == 0); break;
    case QSA__JSON_NUMBER:
        if (v->is_int && v->num == v->num && v->num > -9.2e18 && v->num < 9.2e18) FZ_ASSERT((double)v->i64 == v->num);
        break;
    case QSA__JSON_ARRAY:
    case QSA__JSON_OBJECT: {
        size_t n = 0;
        for (const qsa__json *c = v->child; c; c = c->next) {
            nodes += fz_walk(c, depth + 1, v->type == QSA__JSON_OBJECT);
            if (v->type == QSA__JSON_OBJECT) FZ_ASSERT(qsa__json_get(v, c->key) != NULL || strlen(c->key) != c->key_len);
            n++;
        }
        FZ_ASSERT(n == v->count);
        break;
    }
    default: FZ_ASSERT(!v->child && !v->count); break;
    }
    return nodes;
}

static const char fz_base_config[] =
    "{\"model_type\":\"qwen4_exp_text\",\"vocab_size\":256,\"hidden_size\":64,\"num_hidden_layers\":4,"
    "\"num_attention_heads\":4,\"num_key_value_heads\":2,\"head_dim\":16,\"linear_key_head_dim\":8,"
    "\"linear_value_head_dim\":8,\"linear_num_key_heads\":2,\"linear_num_value_heads\":4,\"moe_intermediate_size\":32,"
    "\"shared_expert_intermediate_size\":32,\"num_experts\":4,\"num_experts_per_tok\":2,\"hc_count\":2,\"hc_lowrank\":8,"
    "\"indexer_n_heads\":2,\"indexer_kv_heads\":1,\"indexer_head_dim\":16,\"indexer_budget\":8,\"indexer_compress_ratio\":4}";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *text = (const char *)data;
    qsa__json_doc doc;
    if (qsa__json_parse(text, size, "fuzz.json", &doc) == QSA_OK) {
        FZ_ASSERT(doc.root != NULL);
        fz_walk(doc.root, 0, 0);
        qsa__json_free(&doc);
    } else {
        FZ_ASSERT(doc.root == NULL && strstr(qsa_last_error(), "fuzz.json") != NULL);
    }
    qsa_model_config c;
    qsa_result r = qsa_config_parse(text, size, NULL, 0, "config.json", &c);
    if (r == QSA_OK) {
        FZ_ASSERT(c.num_hidden_layers >= 1 && c.num_hidden_layers <= QSA_MAX_LAYERS);
        FZ_ASSERT(c.hidden_size > 0 && c.num_attention_heads % c.num_key_value_heads == 0);
        FZ_ASSERT(c.linear_num_value_heads % c.linear_num_key_heads == 0);
        FZ_ASSERT(c.rotary_dim >= 2 && c.rotary_dim <= c.head_dim);
        FZ_ASSERT(c.n_ple_layers >= 0 && c.n_ple_layers <= c.num_hidden_layers);
        for (int i = 0; i < c.n_ple_layers; i++) {
            FZ_ASSERT(c.ple_layer_ids[i] >= 1 && c.ple_layer_ids[i] <= c.num_hidden_layers);
            FZ_ASSERT(i == 0 || c.ple_layer_ids[i] > c.ple_layer_ids[i - 1]);
        }
        FZ_ASSERT(c.n_eos >= 0 && c.n_eos <= QSA_MAX_EOS);
        qsa_config_quant_excluded(&c, "model.layers.0.mlp.gate");
    } else {
        FZ_ASSERT(qsa_last_error()[0] != 0);
    }
    if (qsa_config_parse(fz_base_config, sizeof fz_base_config - 1, text, size, "config.json", &c) == QSA_OK)
        FZ_ASSERT(c.nvfp4 == 1 && c.quant_group_size == 16);
    qsa_generation_config g;
    if (qsa_generation_config_parse(text, size, "generation_config.json", &g) == QSA_OK) FZ_ASSERT(g.n_eos <= QSA_MAX_EOS);
    return 0;
}
