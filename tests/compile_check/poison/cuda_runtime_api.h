/* poisoned: the compile check proves qsa_runtime.h never includes CUDA headers */
#error "poisoned cuda_runtime_api.h was included: qsa_runtime.h must not need CUDA headers"
