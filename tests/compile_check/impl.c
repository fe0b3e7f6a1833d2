/* compile_check/impl.c - the implementation translation unit of the compile checks (`make
 * compile-check` builds it as C99/C11 with gcc and clang and as C++17 with g++ and clang++, with
 * and without QSA_NO_CUDA, and with a poisoned cuda.h/nvrtc.h/nccl.h on the include path). */
#define QSA_RUNTIME_IMPLEMENTATION
#include "../../qsa_runtime.h"
