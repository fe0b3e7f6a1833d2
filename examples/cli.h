/* cli.h - the command-line values of the example programs and tools, read strictly: a whole number
 * must be all digits and in range, a real number finite; anything else ends the program with a usage
 * error (exit status 2) that names the flag.  (atoi and atof read "abc" as 0 and "1e12" past INT_MAX
 * as anything.)  And cli_check_stdout: a program whose output could not be written fails.
 */
#ifndef QSA_EXAMPLES_CLI_H
#define QSA_EXAMPLES_CLI_H

#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static inline int is_opt(const char *a, const char *s1, const char *s2) { return !strcmp(a, s1) || (s2 && !strcmp(a, s2)); }

static inline int need_value(const char *a, const char *v) {
    if (v) return 1;
    fprintf(stderr, "%s needs a value\n", a);
    exit(2);
}

/* v as a whole number in [lo, hi] */
static inline long cli_int(const char *flag, const char *v, long lo, long hi) {
    char *end = NULL;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (errno || end == v || *end || x < lo || x > hi) {
        fprintf(stderr, "%s: '%s' is not a whole number from %ld to %ld\n", flag, v, lo, hi);
        exit(2);
    }
    return x;
}

/* v as a finite number that fits a float */
static inline float cli_float(const char *flag, const char *v) {
    char *end = NULL;
    errno = 0;
    double x = strtod(v, &end);
    if (errno || end == v || *end || !isfinite(x) || fabs(x) > 3.0e38) {
        fprintf(stderr, "%s: '%s' is not a finite number\n", flag, v);
        exit(2);
    }
    return (float)x;
}

/* v as an unsigned 64-bit whole number (no sign) */
static inline uint64_t cli_u64(const char *flag, const char *v) {
    char *end = NULL;
    errno = 0;
    unsigned long long x = v[0] >= '0' && v[0] <= '9' ? strtoull(v, &end, 10) : 0;
    if (errno || !end || end == v || *end) {
        fprintf(stderr, "%s: '%s' is not a whole number from 0 to 18446744073709551615\n", flag, v);
        exit(2);
    }
    return (uint64_t)x;
}

/* At exit, flush stdout and fail (exit status 1, a message naming `prog`) if any of it could not be
   written: a full disk, a closed pipe with SIGPIPE ignored.  (stdio keeps such errors to itself, and
   `tokenize > /dev/full` used to exit 0.)  Call once, first thing in main. */
static const char *cli_stdout_prog;

static inline void cli_stdout_at_exit(void) {
    errno = 0;
    int bad = ferror(stdout);
    if (fclose(stdout) != 0 || bad) {
        int e = errno;
        fprintf(stderr, "%s: writing the output failed%s%s\n", cli_stdout_prog, e ? ": " : "", e ? strerror(e) : "");
        fflush(stderr);
        _Exit(1);
    }
}

static inline void cli_check_stdout(const char *prog) {
    cli_stdout_prog = prog;
    atexit(cli_stdout_at_exit);
}

#endif
