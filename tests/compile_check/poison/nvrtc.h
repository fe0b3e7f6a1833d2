/* poisoned: the compile check proves qsa_runtime.h never includes CUDA headers */
#error "poisoned nvrtc.h was included: qsa_runtime.h must not need CUDA headers"
