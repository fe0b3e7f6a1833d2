/* tests/t_loader.c */
