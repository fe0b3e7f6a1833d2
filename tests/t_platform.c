/* tests/t_platform.c - errors, fp16 conversions */

TEST(cpu, result_strings_and_errors) {
    CHECK(strcmp(qsa_result_string(QSA_OK), "ok") == 0);
    qsa__map m;
    CHECK_ERR(qsa__map_file("/nonexistent/qsa/file", &m), QSA_ERR_IO, "/nonexistent/qsa/file");
    qsa_clear_error();
    CHECK(qsa_last_error()[0] == 0);
    /* a message that wraps the one before (vsnprintf read its argument from the buffer it wrote) */
    qsa__fail(QSA_ERR_IO, "inner %d", 7);
    qsa__fail(QSA_ERR_IO, "outer: %s", qsa_last_error());
    CHECKF(!strcmp(qsa_last_error(), "outer: inner 7"), "'%s'", qsa_last_error());
    qsa_clear_error();
}

TEST(cpu, fp16_roundtrip_exhaustive) {
    int bad = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        float f = qsa__f16_to_f32((uint16_t)h);
        if (f != f) continue; /* NaN payloads are not preserved bit-exactly */
        if (qsa__f32_to_f16(f) != h) bad++;
    }
    CHECKF(bad == 0, "%d fp16 values did not round-trip", bad);
    CHECK(qsa__f32_to_f16(65519.0f) == 0x7bff);
    CHECK(qsa__f32_to_f16(65520.0f) == 0x7c00);
    CHECK(qsa__f32_to_f16(1.0f + 1.0f / 2048) == 0x3c00); /* tie to even */
    CHECK(qsa__f32_to_f16(5.9604645e-8f) == 0x0001);      /* smallest subnormal */
    CHECK(qsa__bf16_to_f32(qsa__f32_to_bf16(3.0f)) == 3.0f);
}

/* The load's narrowing to FP16 (qsa__tensor_to_f16_mt, qsa__f32_to_f16_mt: chunks of QSA__NARROW_CHUNK values,
   a branch-free fast path where every value of a chunk is zero or in FP16's normal range, else value by value)
   gives qsa__f32_to_f16's bits and overflow count: every BF16 pattern in order (chunks that take the fast path
   and chunks that do not), then shifted by one (chunks across the range's ends, a short last chunk); fp32
   patterns of every exponent, from a BF16 tensor's fp32 copy, an F32 tensor and fp32 values. */
static void narrow_expect(const float *f, size_t n, uint16_t *want, size_t *over) {
    *over = 0;
    for (size_t i = 0; i < n; i++) {
        want[i] = qsa__f32_to_f16(f[i]);
        *over += (want[i] & 0x7c00) == 0x7c00 && isfinite(f[i]);
    }
}
TEST(cpu, fp16_narrowing_fast_path_bits) {
    size_t nb = 65536, nf = (size_t)1 << 20;
    uint16_t *bf = (uint16_t *)malloc(nb * 2), *got = (uint16_t *)malloc(nf * 2), *want = (uint16_t *)malloc(nf * 2);
    float *f = (float *)malloc(nf * 4);
    if (!bf || !got || !want || !f) { CHECK(0); free(bf); free(got); free(want); free(f); return; }
    for (size_t i = 0; i < nb; i++) bf[i] = (uint16_t)i;
    qsa__tensor t = test_tensor("narrow", QSA__BF16, bf, (int64_t)nb, 0);
    for (size_t off = 0; off < 2; off++) {
        size_t over = 0, n = nb - off;
        for (size_t i = 0; i < n; i++) f[i] = qsa__bf16_to_f32(bf[off + i]);
        narrow_expect(f, n, want, &over);
        for (int nt = 1; nt <= 3; nt += 2) {
            memset(got, 0, n * 2);
            size_t o = qsa__tensor_to_f16_mt(&t, off, n, got, nt);
            CHECKF(!memcmp(got, want, n * 2) && o == over, "BF16 from %zu, %d threads: other bits (or %zu overflows, not %zu)",
                   off, nt, o, over);
        }
    }
    /* fp32: patterns 0, s, 2 s, ... of the whole 32-bit range (s odd: every exponent, both signs) */
    uint32_t stride = (uint32_t)(((uint64_t)1 << 32) / nf) | 1u;
    for (size_t i = 0; i < nf; i++) {
        uint32_t x = (uint32_t)(i * stride);
        memcpy(f + i, &x, 4);
    }
    size_t over = 0;
    narrow_expect(f, nf, want, &over);
    memset(got, 0, nf * 2);
    size_t o = qsa__f32_to_f16_mt(f, got, nf, 2);
    CHECKF(!memcmp(got, want, nf * 2) && o == over, "fp32 values: other bits (or %zu overflows, not %zu)", o, over);
    t = test_tensor("narrow", QSA__F32, f, (int64_t)nf, 0);
    memset(got, 0, nf * 2);
    o = qsa__tensor_to_f16_mt(&t, 0, nf, got, 2);
    CHECKF(!memcmp(got, want, nf * 2) && o == over, "F32 tensor: other bits (or %zu overflows, not %zu)", o, over);
    free(bf); free(got); free(want); free(f);
}

/* Environment switches are read strictly: anything but a whole number in range (a switch: 0 or 1) keeps the
   default, with a warning that names the variable (atoi read "8M" as 8 and 99999999999 as 1215752191). */
static int env_warns;
static char env_last[256];
static void env_logger(void *user, qsa_log_level level, const char *msg) {
    (void)user;
    if (level == QSA_LOG_WARN) { env_warns++; snprintf(env_last, sizeof env_last, "%s", msg); }
}
TEST(cpu, env_switches_are_read_strictly) {
    const char *name = "QSA_TEST_ENV_SWITCH";
    static const struct { const char *v; long long want; int warns; } cases[] = {
        {NULL, 7, 0}, {"", 7, 0}, {"12", 12, 0}, {"-3", -3, 0}, {"8M", 7, 1}, {"auto", 7, 1}, {"99999999999", 7, 1},
        {"64 keys", 7, 1}, {"101", 7, 1}, {"-11", 7, 1}, {" 5", 5, 0}, {"0x10", 7, 1},
    };
    qsa_set_logger(env_logger, NULL, QSA_LOG_WARN);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        if (cases[i].v) setenv(name, cases[i].v, 1);
        else unsetenv(name);
        env_warns = 0;
        long long got = qsa__env_int(name, -10, 100, 7);
        CHECKF(got == cases[i].want && env_warns == cases[i].warns, "'%s': %lld with %d warnings", cases[i].v ? cases[i].v : "(unset)",
               got, env_warns);
        if (cases[i].warns) CHECKF(strstr(env_last, name) && strstr(env_last, "using 7"), "warning '%s'", env_last);
    }
    static const struct { const char *v; int want; } flags[] = {{"0", 0}, {"1", 1}, {"off", 1}, {"2", 1}, {NULL, 1}};
    for (size_t i = 0; i < sizeof flags / sizeof flags[0]; i++) {
        if (flags[i].v) setenv(name, flags[i].v, 1);
        else unsetenv(name);
        CHECKF(qsa__env_flag(name, 1) == flags[i].want, "switch '%s'", flags[i].v ? flags[i].v : "(unset)");
    }
    unsetenv(name);
    qsa_set_logger(T_.verbose ? qsa_log_stderr : NULL, NULL, QSA_LOG_DEBUG);
}
