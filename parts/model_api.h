/* parts/model_api.h */
