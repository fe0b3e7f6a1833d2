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

#include "../kernel_entries.h"

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
    int cubin = len >= 4 && !memcmp(image, "\177ELF", 4), bad = 0;
    char names[KERNEL_ENTRIES_MAX][64];
    int nk = kernel_entry_names(names, KERNEL_ENTRIES_MAX);
    if (nk >= KERNEL_ENTRIES_MAX) {
        fprintf(stderr, "nvrtc-check: %d or more kernels: raise KERNEL_ENTRIES_MAX (tests/kernel_entries.h)\n", nk);
        bad++;
    }
    for (int i = 0; i < nk; i++)
        if (!kernel_entry_in_image(image, len, cubin, names[i])) {
            fprintf(stderr, "nvrtc-check: entry %s missing from the output\n", names[i]);
            bad++;
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
    qsa_free(image);
    qsa_free(log);
    return bad ? 1 : 0;
}
