/* compile_check/static_b.c - the second QSA_STATIC translation unit; see static_a.c. */
#define QSA_STATIC
#define QSA_RUNTIME_IMPLEMENTATION
#include "../../qsa_runtime.h"

#include <stdio.h>
#include <string.h>

const char *static_a_ok(void);

int main(void) {
    if (strcmp(static_a_ok(), qsa_result_string(QSA_OK)) != 0) return 1;
    printf("QSA_STATIC: two copies linked: %s\n", qsa_result_string(QSA_OK));
    return 0;
}
