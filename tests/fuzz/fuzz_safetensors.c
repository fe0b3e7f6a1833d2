/* fuzz_safetensors.c - libFuzzer harness for the safetensors reader.
 *
 *   clang -g -O1 -fsanitize=fuzzer,address,undefined -o fuzz_safetensors tests/fuzz/fuzz_safetensors.c -lm -ldl -lpthread
 *   ./fuzz_safetensors -max_total_time=60 corpus/
 *
 * The input is one safetensors image, opened in place (qsa__st_open_memory, the same parser the
 * file and directory paths use).  libFuzzer's buffer has exactly `size` bytes, so AddressSanitizer
 * catches any read a checked tensor would make outside the file: the harness reads the first and
 * last byte of every tensor and goes through the lookup, conversion, row-view and NVFP4 helpers. */
#define QSA_RUNTIME_IMPLEMENTATION
#include "../../qsa_runtime.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FZ_ASSERT(c) do { if (!(c)) { fprintf(stderr, "invariant failed: %s (line %d)\n", #c, __LINE__); abort(); } } while (0)

static volatile unsigned fz_sink;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    qsa__st_set s;
    if (qsa__st_open_memory(data, size, "fuzz.safetensors", &s) != QSA_OK) {
        FZ_ASSERT(s.tensors == NULL && s.ntensors == 0 && qsa_last_error()[0] != 0);
        return 0;
    }
    for (int i = 0; i < s.ntensors; i++) {
        const qsa__tensor *t = &s.tensors[i];
        FZ_ASSERT(i == 0 || strcmp(s.tensors[i - 1].name, t->name) < 0);
        FZ_ASSERT(t->nbytes % qsa__dtype_size(t->dtype) == 0);
        if (t->nbytes) {
            FZ_ASSERT(t->data >= data && t->data + t->nbytes <= data + size);
            fz_sink += t->data[0] + t->data[t->nbytes - 1];
            size_t n = t->nbytes / qsa__dtype_size(t->dtype);
            float f = qsa__tensor_f32(t, n - 1);
            fz_sink += f == f;
            if (n <= 4096 && (t->dtype == QSA__F32 || t->dtype == QSA__BF16 || t->dtype == QSA__F16)) {
                uint16_t *h = (uint16_t *)malloc(n * 2);
                FZ_ASSERT(h == NULL || qsa__tensor_to_f16_mt(t, 0, n, h, 1) <= n); /* (the count of values past FP16) */
                free(h);
            }
        }
        /* lookup tries prefix + name first, so a prefixed twin may shadow a bare name */
        const qsa__tensor *f = qsa__st_find(&s, t->name);
        size_t pfl = strlen(s.prefix);
        FZ_ASSERT(f && (f == t || (!strncmp(f->name, s.prefix, pfl) && !strcmp(f->name + pfl, t->name))));
        const qsa__tensor *g = NULL;
        if (qsa__st_get(&s, t->name, t->dtype, t->ndim, t->shape, &g) == QSA_OK) FZ_ASSERT(g != NULL);
        /* the helpers that take a base name */
        size_t len = strlen(t->name);
        const char *pl = strlen(s.prefix) && !strncmp(t->name, s.prefix, strlen(s.prefix)) ? t->name + strlen(s.prefix) : t->name;
        size_t bl = len - (size_t)(pl - t->name);
        char base[256];
        if (bl > 7 && bl < sizeof base && !strcmp(pl + bl - 7, ".weight")) {
            memcpy(base, pl, bl - 7);
            base[bl - 7] = 0;
            char *shard = strstr(base, ".shard_");
            if (shard) *shard = 0;
            qsa__rows_view v;
            if (qsa__st_rows_view(&s, base, &v) == QSA_OK) {
                FZ_ASSERT(v.nparts >= 1 && v.rows >= 0);
                if (v.rows > 0 && v.cols > 0) {
                    const uint8_t *r0 = qsa__rows_view_row(&v, 0), *rl = qsa__rows_view_row(&v, v.rows - 1);
                    size_t rb = (size_t)v.cols * qsa__dtype_size(v.dtype);
                    fz_sink += r0[0] + rl[rb - 1];
                }
                FZ_ASSERT(qsa__rows_view_row(&v, v.rows) == NULL);
                qsa__rows_view_free(&v);
            }
        }
        if (bl > 13 && bl < sizeof base && !strcmp(pl + bl - 13, ".weight_scale")) {
            memcpy(base, pl, bl - 13);
            base[bl - 13] = 0;
            FZ_ASSERT(qsa__st_is_nvfp4(&s, base));
            qsa__nvfp4 q;
            if (t->ndim == 2 && qsa__st_get_nvfp4(&s, base, t->shape[0], t->shape[1] * 16, &q) == QSA_OK) {
                FZ_ASSERT(q.weight && q.scale && q.scale2 && q.global_scale > 0);
                if (q.weight->nbytes) fz_sink += q.weight->data[q.weight->nbytes - 1];
            }
        }
    }
    qsa__st_close(&s);
    return 0;
}
