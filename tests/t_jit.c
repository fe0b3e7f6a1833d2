/* tests/t_jit.c */
