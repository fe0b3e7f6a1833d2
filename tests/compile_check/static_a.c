/* compile_check/static_a.c - QSA_STATIC: two translation units each with a private copy of the
 * implementation, linked into one program (with static_b.c). */
#define QSA_STATIC
#define QSA_RUNTIME_IMPLEMENTATION
#include "../../qsa_runtime.h"

const char *static_a_ok(void);
const char *static_a_ok(void) { return qsa_result_string(QSA_OK); }
