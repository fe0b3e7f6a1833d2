/* parts/json.h */
