/* parts/dynload.h */
