/* qsa_runtime.h - v0.1.0 - Qwen4-Exp inference runtime (CPU reference + CUDA via NVRTC) - MIT licence
 *
 * USAGE
 *   In exactly one C or C++ file:
 *       #define QSA_RUNTIME_IMPLEMENTATION
 *       #include "qsa_runtime.h"
 *   Everywhere else just #include "qsa_runtime.h".  Put kernels.cu.inc next to the header (the
 *   implementation includes it for the CUDA backend).  Link with -ldl -lm -lpthread; nothing else:
 *   libcuda.so.1, libnvrtc and libnccl.so.2 are opened at run time with dlopen.
 *
 * CONFIGURATION MACROS (define before the implementation include)
 *   QSA_MALLOC(sz) / QSA_REALLOC(p,sz) / QSA_FREE(p)   all three or none: the allocator.
 *   QSA_STATIC      make every function static (several copies in one program are fine).
 *   QSA_NO_CUDA     compile without the CUDA backend (no CUDA types, no dlopen of CUDA libraries).
 *   QSA_DEBUG       extra checks; synchronise after every kernel launch.
 *
 * QUICK START
 *       qsa_model *m; qsa_model_params mp = {0};            // zero = defaults
 *       if (qsa_model_load("path/to/model_dir", &mp, &m) != QSA_OK) puts(qsa_last_error());
 *       ... see examples/chat.c and docs/API.md.
 *
 * MODEL FILES
 *   A Hugging Face directory: config.json (model_type qwen4_exp or qwen4_exp_text), model.safetensors
 *   or model.safetensors.index.json + shards, tokenizer.json, tokenizer_config.json, optionally
 *   generation_config.json and hf_quant_config.json (NVFP4 experts, ModelOpt format).
 *
 * ERRORS AND LOGGING
 *   Every fallible call returns a qsa_result.  qsa_last_error() (thread-local) gives a message that
 *   names the call, the file/tensor/field and what was expected vs found.  The library never exits.
 *   Logging goes to a callback set with qsa_set_logger(); without one the library is silent.
 *   qsa_log_stderr is a ready-made callback.
 *
 * MEMORY
 *   Weights are memory-mapped and used in place by the CPU backend; per-sequence state is allocated
 *   when a sequence is created.  Every allocation goes through QSA_MALLOC/QSA_REALLOC/QSA_FREE.
 *
 * THREAD SAFETY
 *   A model is read-only after load and may be shared between threads; a sequence/context must be
 *   used by one thread at a time.  The error message is per thread.
 *
 * LIMITATIONS
 *   Text model only (vision and MTP weights are ignored).  See docs/ for what is implemented.
 *
 * SECTIONS (grep for the tag)
 *   >>api          public declarations
 *   >>platform     allocation, errors, logging, files, clocks, threads
 *   >>dynload      dlopen tables for libcuda / libnvrtc / libnccl
 *   >>json         bounded, strict JSON parser
 *   >>config       config.json / generation_config.json / quantisation config
 *   >>safetensors  safetensors files and sharded indexes, dtype conversion
 *   >>unicode      Unicode tables (categories, NFC) for the tokenizer
 *   >>tokenizer    byte-level BPE, added tokens, chat template
 *   >>weights      binding checkpoint tensors to the model structure
 *   >>cpu-forward  the CPU reference forward pass
 *   >>sampler      greedy and seeded sampling
 *   >>kv-pool      KV pages and the free list
 *   >>planner      QSA selections -> attention plans in logical order
 *   >>generate     sequences, prefill/decode, stop conditions, statistics
 *   >>capture      capture and replay of one QSA layer
 *   >>cuda         the CUDA backend: kernel module, weights, device KV pool, forward
 *   >>scheduler    requests, continuous batching, chunked prefill, KV-page admission
 */
#ifndef QSA_RUNTIME_H
#define QSA_RUNTIME_H

/* The implementation needs POSIX (mmap, dlopen, clock_gettime); ask for it before any system
   header is seen.  Include this header first in the implementation file, or define _GNU_SOURCE. */
#if defined(QSA_RUNTIME_IMPLEMENTATION) && defined(__linux__) && !defined(_GNU_SOURCE)
#define _GNU_SOURCE
#endif

#define QSA_VERSION_MAJOR 0
#define QSA_VERSION_MINOR 1
#define QSA_VERSION_PATCH 0
#define QSA_VERSION_STRING "0.1.0"

#include <stddef.h>
#include <stdint.h>

#ifdef QSA_STATIC
#define QSA_API static
#else
#define QSA_API extern
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* ============================================================================================== */
/* >>api  public declarations                                                                      */
/* ============================================================================================== */

typedef enum qsa_result {
    QSA_OK = 0,
    QSA_ERR_INVALID_ARGUMENT, /* a parameter the caller passed is wrong */
    QSA_ERR_IO,               /* a file could not be opened/read/mapped */
    QSA_ERR_FORMAT,           /* a file is malformed (JSON, safetensors, tokenizer) */
    QSA_ERR_UNSUPPORTED,      /* valid input we do not support (dtype, model type, regex) */
    QSA_ERR_NOT_FOUND,        /* a tensor / file / token that must exist does not */
    QSA_ERR_SHAPE,            /* a tensor has the wrong shape or dtype */
    QSA_ERR_OUT_OF_MEMORY,    /* host or device allocation failed */
    QSA_ERR_CONTEXT_FULL,     /* the request does not fit the context / memory budget */
    QSA_ERR_NO_DEVICE,        /* the GPU stack is missing or has no usable device */
    QSA_ERR_CUDA,             /* a CUDA driver call failed */
    QSA_ERR_NVRTC,            /* kernel compilation failed */
    QSA_ERR_NCCL,             /* a NCCL call failed */
    QSA_ERR_CANCELLED,        /* the request was cancelled */
    QSA_ERR_INTERNAL          /* a bug: please report */
} qsa_result;

QSA_API const char *qsa_result_string(qsa_result r);
/* Detail message of the last failure on this thread ("" when none). */
QSA_API const char *qsa_last_error(void);
QSA_API void qsa_clear_error(void);

typedef enum qsa_log_level { QSA_LOG_ERROR = 0, QSA_LOG_WARN, QSA_LOG_INFO, QSA_LOG_DEBUG } qsa_log_level;
typedef void (*qsa_logger)(void *user, qsa_log_level level, const char *message);
/* Install a logger (NULL: silent).  max_level filters: QSA_LOG_INFO shows errors, warnings, info. */
QSA_API void qsa_set_logger(qsa_logger fn, void *user, qsa_log_level max_level);
QSA_API void qsa_log_stderr(void *user, qsa_log_level level, const char *message);

/* Frees memory the library returned to the caller (token arrays, strings). */
QSA_API void qsa_free(void *p);

/* public declarations of the sections in parts/ (inlined here when they settle) */
#include "parts/config_api.h"
#include "parts/tokenizer_api.h"
#include "parts/model_api.h"
#include "parts/sched_api.h"

#ifdef __cplusplus
}
#endif
#endif /* QSA_RUNTIME_H */

/* ============================================================================================== */
/*                                        IMPLEMENTATION                                          */
/* ============================================================================================== */
#ifdef QSA_RUNTIME_IMPLEMENTATION
#ifndef QSA_RUNTIME_IMPLEMENTATION_DONE
#define QSA_RUNTIME_IMPLEMENTATION_DONE

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <pthread.h>
#include <dlfcn.h>
#ifndef O_CLOEXEC
#define O_CLOEXEC 0
#endif

#if defined(QSA_MALLOC) && defined(QSA_REALLOC) && defined(QSA_FREE)
#elif !defined(QSA_MALLOC) && !defined(QSA_REALLOC) && !defined(QSA_FREE)
#define QSA_MALLOC(sz) malloc(sz)
#define QSA_REALLOC(p, sz) realloc(p, sz)
#define QSA_FREE(p) free(p)
#else
#error "qsa_runtime.h: define all of QSA_MALLOC, QSA_REALLOC and QSA_FREE, or none"
#endif

#if defined(__GNUC__) || defined(__clang__)
#define QSA__PRINTF(a, b) __attribute__((format(printf, a, b)))
#define QSA__UNUSED __attribute__((unused))
#define QSA__TLS __thread
#else
#define QSA__PRINTF(a, b)
#define QSA__UNUSED
#define QSA__TLS _Thread_local
#endif

#ifdef QSA_STATIC
#define QSA_IMPL static QSA__UNUSED
#else
#define QSA_IMPL
#endif
/* private helpers are always static (and may be unused in a given configuration) */
#define QSA_PRIV static QSA__UNUSED


#ifdef __cplusplus
#define QSA__CAST(T, x) (static_cast<T>(x))
#else
#define QSA__CAST(T, x) ((T)(x))
#endif
/* typed allocation: works in C and C++ */
#define QSA__ALLOC(T, n) ((T *)qsa__malloc(sizeof(T) * (size_t)(n)))
#define QSA__CALLOC(T, n) ((T *)qsa__calloc((size_t)(n), sizeof(T)))
#define QSA__DEF(v, d) do { if (!(v)) (v) = (d); } while (0)

/* ============================================================================================== */
/* >>platform  allocation, errors, logging, files, clocks                                          */
/* ============================================================================================== */

static QSA__TLS char qsa__err_buf[1024];
static qsa_logger qsa__logger_fn;
static void *qsa__logger_user;
static qsa_log_level qsa__logger_max = QSA_LOG_INFO;

QSA_PRIV void *qsa__malloc(size_t n) { return QSA_MALLOC(n ? n : 1); }
QSA_PRIV void *qsa__realloc(void *p, size_t n) { return QSA_REALLOC(p, n ? n : 1); }
QSA_PRIV void qsa__free(void *p) { if (p) QSA_FREE(p); }
QSA_PRIV void *qsa__calloc(size_t n, size_t sz) {
    if (sz && n > SIZE_MAX / sz) return NULL;
    void *p = qsa__malloc(n * sz);
    if (p) memset(p, 0, n * sz);
    return p;
}
QSA_PRIV char *qsa__strdup(const char *s) {
    size_t n = strlen(s) + 1;
    char *d = QSA__ALLOC(char, n);
    if (d) memcpy(d, s, n);
    return d;
}
QSA_PRIV char *qsa__strndup(const char *s, size_t n) {
    char *d = QSA__ALLOC(char, n + 1);
    if (d) { memcpy(d, s, n); d[n] = 0; }
    return d;
}

QSA_IMPL void qsa_free(void *p) { qsa__free(p); }

QSA_IMPL const char *qsa_result_string(qsa_result r) {
    switch (r) {
    case QSA_OK: return "ok";
    case QSA_ERR_INVALID_ARGUMENT: return "invalid argument";
    case QSA_ERR_IO: return "i/o error";
    case QSA_ERR_FORMAT: return "malformed input";
    case QSA_ERR_UNSUPPORTED: return "unsupported";
    case QSA_ERR_NOT_FOUND: return "not found";
    case QSA_ERR_SHAPE: return "wrong shape or dtype";
    case QSA_ERR_OUT_OF_MEMORY: return "out of memory";
    case QSA_ERR_CONTEXT_FULL: return "context or memory budget exceeded";
    case QSA_ERR_NO_DEVICE: return "no usable GPU";
    case QSA_ERR_CUDA: return "CUDA error";
    case QSA_ERR_NVRTC: return "NVRTC error";
    case QSA_ERR_NCCL: return "NCCL error";
    case QSA_ERR_CANCELLED: return "cancelled";
    case QSA_ERR_INTERNAL: return "internal error";
    }
    return "unknown result";
}

QSA_IMPL const char *qsa_last_error(void) { return qsa__err_buf; }
QSA_IMPL void qsa_clear_error(void) { qsa__err_buf[0] = 0; }

QSA_PRIV void qsa__log(qsa_log_level level, const char *fmt, ...) QSA__PRINTF(2, 3);
QSA_PRIV void qsa__log(qsa_log_level level, const char *fmt, ...) {
    if (!qsa__logger_fn || level > qsa__logger_max) return;
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    qsa__logger_fn(qsa__logger_user, level, buf);
}

/* Record a failure: the message is kept per thread and logged at debug level; returns r so that
   callers can write `return qsa__fail(QSA_ERR_IO, "open %s: %s", path, strerror(errno));`. */
QSA_PRIV qsa_result qsa__fail(qsa_result r, const char *fmt, ...) QSA__PRINTF(2, 3);
QSA_PRIV qsa_result qsa__fail(qsa_result r, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(qsa__err_buf, sizeof qsa__err_buf, fmt, ap);
    va_end(ap);
    qsa__log(QSA_LOG_DEBUG, "error (%s): %s", qsa_result_string(r), qsa__err_buf);
    return r;
}
#define QSA__TRY(expr) do { qsa_result qsa__r_ = (expr); if (qsa__r_ != QSA_OK) return qsa__r_; } while (0)

QSA_IMPL void qsa_set_logger(qsa_logger fn, void *user, qsa_log_level max_level) {
    qsa__logger_fn = fn;
    qsa__logger_user = user;
    qsa__logger_max = max_level;
}
QSA_IMPL void qsa_log_stderr(void *user, qsa_log_level level, const char *message) {
    static const char *names[] = {"error", "warn", "info", "debug"};
    (void)user;
    fprintf(stderr, "qsa %s: %s\n", names[level <= QSA_LOG_DEBUG ? level : QSA_LOG_DEBUG], message);
}

QSA_PRIV double qsa__now(void) {
    struct timespec ts;
#ifdef CLOCK_MONOTONIC
    clock_gettime(CLOCK_MONOTONIC, &ts);
#else
    timespec_get(&ts, TIME_UTC);
#endif
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* A read-only file mapping.  Empty files map to a NULL pointer with size 0. */
typedef struct qsa__map {
    const uint8_t *data;
    size_t size;
    char *path;
} qsa__map;

QSA_PRIV qsa_result qsa__map_file(const char *path, qsa__map *m) {
    memset(m, 0, sizeof *m);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return qsa__fail(QSA_ERR_IO, "open '%s': %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return qsa__fail(QSA_ERR_IO, "'%s' is not a regular file", path);
    }
    m->size = (size_t)st.st_size;
    if (m->size) {
        void *p = mmap(NULL, m->size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (p == MAP_FAILED) {
            close(fd);
            return qsa__fail(QSA_ERR_IO, "mmap '%s' (%zu bytes): %s", path, m->size, strerror(errno));
        }
        m->data = (const uint8_t *)p;
    }
    close(fd);
    m->path = qsa__strdup(path);
    if (!m->path) {
        if (m->size) munmap((void *)m->data, m->size);
        return qsa__fail(QSA_ERR_OUT_OF_MEMORY, "map '%s': out of memory", path);
    }
    return QSA_OK;
}
QSA_PRIV void qsa__unmap(qsa__map *m) {
    if (m->data && m->size) munmap((void *)m->data, m->size);
    qsa__free(m->path);
    memset(m, 0, sizeof *m);
}

/* Whole file into a NUL-terminated buffer (for small JSON files). */
QSA_PRIV qsa_result qsa__read_file(const char *path, char **out, size_t *len) {
    qsa__map m;
    QSA__TRY(qsa__map_file(path, &m));
    char *buf = QSA__ALLOC(char, m.size + 1);
    if (!buf) { qsa__unmap(&m); return qsa__fail(QSA_ERR_OUT_OF_MEMORY, "read '%s': out of memory", path); }
    if (m.size) memcpy(buf, m.data, m.size);
    buf[m.size] = 0;
    *out = buf;
    if (len) *len = m.size;
    qsa__unmap(&m);
    return QSA_OK;
}

QSA_PRIV int qsa__file_exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

/* dir + "/" + name into a new string */
QSA_PRIV char *qsa__path_join(const char *dir, const char *name) {
    size_t a = strlen(dir), b = strlen(name);
    char *p = QSA__ALLOC(char, a + b + 2);
    if (!p) return NULL;
    memcpy(p, dir, a);
    size_t k = a;
    if (a && dir[a - 1] != '/') p[k++] = '/';
    memcpy(p + k, name, b + 1);
    return p;
}

/* Growable array of bytes, used to build strings and buffers. */
typedef struct qsa__buf {
    char *data;
    size_t len, cap;
} qsa__buf;
QSA_PRIV int qsa__buf_reserve(qsa__buf *b, size_t extra) {
    if (b->len + extra + 1 <= b->cap) return 1;
    size_t cap = b->cap ? b->cap : 64;
    while (cap < b->len + extra + 1) cap *= 2;
    char *d = (char *)qsa__realloc(b->data, cap);
    if (!d) return 0;
    b->data = d;
    b->cap = cap;
    return 1;
}
QSA_PRIV int qsa__buf_put(qsa__buf *b, const void *p, size_t n) {
    if (!qsa__buf_reserve(b, n)) return 0;
    if (n) memcpy(b->data + b->len, p, n);
    b->len += n;
    b->data[b->len] = 0;
    return 1;
}
QSA_PRIV int qsa__buf_puts(qsa__buf *b, const char *s) { return qsa__buf_put(b, s, strlen(s)); }
QSA_PRIV void qsa__buf_free(qsa__buf *b) { qsa__free(b->data); memset(b, 0, sizeof *b); }

/* fp16 / bf16 <-> fp32 (bit exact, round to nearest even) */
QSA_PRIV float qsa__f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h >> 15) << 31, exp = (h >> 10) & 0x1f, man = h & 0x3ff, bits;
    if (exp == 0) {
        if (man == 0) bits = sign;
        else { /* subnormal */
            int e = -1;
            do { e++; man <<= 1; } while (!(man & 0x400));
            bits = sign | ((uint32_t)(127 - 15 - e) << 23) | ((man & 0x3ff) << 13);
        }
    } else if (exp == 31) bits = sign | 0x7f800000u | (man << 13);
    else bits = sign | ((exp + 112) << 23) | (man << 13);
    float f;
    memcpy(&f, &bits, 4);
    return f;
}
QSA_PRIV uint16_t qsa__f32_to_f16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000, ax = x & 0x7fffffffu;
    if (ax >= 0x7f800000u) return (uint16_t)(sign | 0x7c00 | (ax > 0x7f800000u ? 0x200 : 0));
    if (ax >= 0x477ff000u) return (uint16_t)(sign | 0x7c00); /* rounds to >= 65520: inf */
    if (ax < 0x38800000u) { /* subnormal or zero in fp16 */
        if (ax < 0x33000000u) return (uint16_t)sign; /* < 2^-25 rounds to zero */
        uint32_t e = ax >> 23, man = (ax & 0x7fffff) | 0x800000;
        uint32_t shift = 126 - e; /* 14..24 */
        uint32_t half = man >> shift, rem = man & ((1u << shift) - 1), mid = 1u << (shift - 1);
        if (rem > mid || (rem == mid && (half & 1))) half++;
        return (uint16_t)(sign | half);
    }
    uint32_t r = ax + 0xfff + ((ax >> 13) & 1) - 0x38000000u; /* rebias 127->15, round to nearest even */
    return (uint16_t)(sign | (r >> 13));
}
QSA_PRIV float qsa__bf16_to_f32(uint16_t h) {
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}
QSA_PRIV uint16_t qsa__f32_to_bf16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40);
    x += 0x7fff + ((x >> 16) & 1);
    return (uint16_t)(x >> 16);
}

/* ---- sections written in parts/ during development; inlined here when they settle ---- */
#include "parts/dynload.h"
#include "parts/json.h"
#include "parts/config.h"
#include "parts/safetensors.h"
#include "parts/unicode.h"
#include "parts/tokenizer.h"
#include "parts/model.h"
#include "parts/cuda.h"
#include "parts/sched.h"

#endif /* QSA_RUNTIME_IMPLEMENTATION_DONE */
#endif /* QSA_RUNTIME_IMPLEMENTATION */
