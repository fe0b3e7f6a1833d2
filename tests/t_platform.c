/* tests/t_platform.c - errors, fp16 conversions */

TEST(cpu, result_strings_and_errors) {
    CHECK(strcmp(qsa_result_string(QSA_OK), "ok") == 0);
    qsa__map m;
    CHECK_ERR(qsa__map_file("/nonexistent/qsa/file", &m), QSA_ERR_IO, "/nonexistent/qsa/file");
    qsa_clear_error();
    CHECK(qsa_last_error()[0] == 0);
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
