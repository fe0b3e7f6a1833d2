/* tests/t_model.c */
