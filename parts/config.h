/* parts/config.h */
