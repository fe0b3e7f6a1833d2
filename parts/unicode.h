/* parts/unicode.h */
