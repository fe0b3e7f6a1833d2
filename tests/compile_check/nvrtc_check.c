/* compile_check/nvrtc_check.c - `make nvrtc-check`: compiles the embedded kernels (kernels.cu.inc)
 * with an NVRTC and reports what it did.  No GPU is needed.
 *
 *   build/nvrtc_check [TARGET [OUT]]
 *
 * The NVRTC is QSA_NVRTC_LIB (a full path) or the first of the runtime's default names.  TARGET
 * (compute_70, sm_90, ...) defaults to the runtime's own choice: compute_70 when the NVRTC supports
 * it, else compute_90 (no device here); "" picks that default too.  OUT: also write the PTX or
 * CUBIN there, exactly what the runtime would load (for `ptxas -v` register counts and SASS:
 * docs/CUDA.md).  Fails when NVRTC is missing, compilation fails, an entry point is missing from
 * the output, NVRTC emits any diagnostic about kernels.cu, or OUT cannot be written.
 */
#define QSA_RUNTIME_IMPLEMENTATION
#include "../../qsa_runtime.h"

#include <stdio.h>
#include <string.h>

int main(int argc, char **argv) {
    const char *want = argc > 1 && argv[1][0] ? argv[1] : NULL;
    char arch[32], *image = NULL, *log = NULL;
    size_t len = 0;
    const char *out = argc > 2 ? argv[2] : NULL;
    if (argc > 3 || (want && want[0] == '-') || (out && !out[0])) {
        fprintf(stderr, "usage: %s [compute_NN|sm_NN|\"\" [OUT]]\n", argv[0]);
        return 2;
    }
    qsa_set_logger(qsa_log_stderr, NULL, QSA_LOG_INFO);
    if (qsa__nvrtc_load() != QSA_OK) {
        fprintf(stderr, "nvrtc-check: FAILED: %s\n", qsa_last_error());
        return 1;
    }
    double t0 = qsa__now();
    qsa_result r = qsa__kernels_compile(want, 0, NULL, 0, &image, &len, &log, arch, sizeof arch);
    double ms = 1e3 * (qsa__now() - t0);
    if (log && log[0]) printf("NVRTC log:\n%s\n", log);
    if (r != QSA_OK) {
        fprintf(stderr, "nvrtc-check: FAILED (%s): %s\n", qsa_result_string(r), qsa_last_error());
        return 1;
    }
    int cubin = len >= 4 && !memcmp(image, "\177ELF", 4), bad = 0, nk = 0;
    char *src = qsa__kernels_source();
    const char *key = "extern \"C\" __global__ void ";
    for (const char *p = src ? strstr(src, key) : NULL; p; p = strstr(p + 1, key)) {
        const char *s = p + strlen(key);
        if (!strncmp(s, "__launch_bounds__(", 18)) { /* skip the attribute: the name follows it */
            s = strchr(s, ')');
            if (!s) break;
            s++;
            while (*s == ' ') s++;
        }
        size_t k = 0;
        char name[128], needle[160];
        while (k < sizeof name - 1 && (s[k] == '_' || (s[k] >= 'a' && s[k] <= 'z') || (s[k] >= '0' && s[k] <= '9'))) k++;
        if (s[k] != '(') continue;
        memcpy(name, s, k);
        name[k] = 0;
        nk++;
        size_t nlen;
        if (cubin) {
            memcpy(needle, name, k + 1);
            nlen = k + 1;
        } else {
            snprintf(needle, sizeof needle, ".entry %s(", name);
            nlen = strlen(needle);
        }
        int found = 0;
        for (size_t i = 0; i + nlen <= len && !found; i++) found = !memcmp(image + i, needle, nlen);
        if (!found) {
            fprintf(stderr, "nvrtc-check: entry %s missing from the output\n", name);
            bad++;
        }
    }
    if (log && strstr(log, "kernels.cu(")) {
        fprintf(stderr, "nvrtc-check: NVRTC has diagnostics about kernels.cu (see the log above)\n");
        bad++;
    }
    if (nk == 0) {
        fprintf(stderr, "nvrtc-check: no kernels found in the embedded source\n");
        bad++;
    }
    if (out) {
        FILE *f = fopen(out, "wb");
        int ok = f && fwrite(image, 1, len, f) == len;
        if (f && fclose(f) != 0) ok = 0;
        if (!ok) {
            fprintf(stderr, "nvrtc-check: cannot write %s\n", out);
            bad++;
        }
    }
    printf("nvrtc-check: %s: NVRTC %d.%d (%s), target %s: %d kernels, %zu bytes of %s in %.0f ms\n",
           bad ? "FAILED" : "ok", qsa__nvrtc.major, qsa__nvrtc.minor, qsa__nvrtc.path, arch, nk, len,
           cubin ? "CUBIN" : "PTX", ms);
    qsa_free(src);
    qsa_free(image);
    qsa_free(log);
    return bad ? 1 : 0;
}
