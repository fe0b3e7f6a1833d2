/* tests/kernel_entries.h - the kernel entry points of the embedded source and their presence in a
 * compiled image, shared by the JIT tests (t_jit.c) and `make nvrtc-check`
 * (compile_check/nvrtc_check.c).  Include after the runtime's implementation. */
#ifndef QSA_TESTS_KERNEL_ENTRIES_H
#define QSA_TESTS_KERNEL_ENTRIES_H

#include <string.h>

#define KERNEL_ENTRIES_MAX 96

/* Every `extern "C" __global__ void [__launch_bounds__(...)] NAME(` of the embedded kernels.cu, in
   source order, into names (at most cap); returns the count. */
static int kernel_entry_names(char names[][64], int cap) {
    char *src = qsa__kernels_source();
    int n = 0;
    const char *key = "extern \"C\" __global__ void ";
    for (const char *p = src ? strstr(src, key) : NULL; p && n < cap; p = strstr(p + 1, key)) {
        const char *s = p + strlen(key);
        if (!strncmp(s, "__launch_bounds__(", 18)) { /* skip the attribute: the name follows it */
            s = strchr(s, ')');
            if (!s) break;
            s++;
            while (*s == ' ' || *s == '\n' || *s == '\t') s++; /* (the name may start the next line) */
        }
        size_t k = 0;
        while (k < 63 && (s[k] == '_' || (s[k] >= 'a' && s[k] <= 'z') || (s[k] >= 'A' && s[k] <= 'Z') ||
                          (s[k] >= '0' && s[k] <= '9')))
            k++;
        if (s[k] != '(') continue; /* e.g. the `qsa_k_<op>` of a comment */
        memcpy(names[n], s, k);
        names[n][k] = 0;
        n++;
    }
    qsa_free(src);
    return n;
}

/* Whether a PTX (".entry NAME(") or a CUBIN (the symbol "NAME\0") of len bytes has entry NAME. */
static int kernel_entry_in_image(const char *image, size_t len, int cubin, const char *name) {
    char needle[128];
    size_t k;
    if (cubin) {
        k = strlen(name) + 1; /* with its NUL: no prefix matches */
        if (k > sizeof needle) return 0;
        memcpy(needle, name, k);
    } else {
        snprintf(needle, sizeof needle, ".entry %.63s(", name);
        k = strlen(needle);
    }
    for (size_t i = 0; i + k <= len; i++)
        if (image[i] == needle[0] && !memcmp(image + i, needle, k)) return 1;
    return 0;
}

#endif
