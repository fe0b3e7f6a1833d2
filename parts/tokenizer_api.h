/* parts/tokenizer_api.h */
