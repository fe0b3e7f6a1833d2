/* parts/tokenizer.h */
