/* compile_check/user.c - a user translation unit: the declarations only, linked against impl.c
 * (compiled as C or C++) and run: the public symbols resolve and the program starts on a machine
 * without CUDA (nothing from the GPU stack is linked). */
#include "../../qsa_runtime.h"

#include <stdio.h>
#include <string.h>

int main(void) {
    qsa_set_logger(qsa_log_stderr, NULL, QSA_LOG_INFO);
    if (strcmp(qsa_result_string(QSA_OK), "ok") != 0) return 1;
    qsa_clear_error();
    printf("compile-check program: %s, last error '%s'\n", qsa_result_string(QSA_ERR_NO_DEVICE), qsa_last_error());
    return 0;
}
