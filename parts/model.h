/* parts/model.h */
