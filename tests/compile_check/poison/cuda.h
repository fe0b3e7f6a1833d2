/* poisoned: the compile check proves qsa_runtime.h never includes CUDA headers */
#error "poisoned cuda.h was included: qsa_runtime.h must not need CUDA headers"
