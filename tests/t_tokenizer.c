/* tests/t_tokenizer.c */
