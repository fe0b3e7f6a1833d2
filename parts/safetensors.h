/* ============================================================================================== */
/* >>safetensors  safetensors files and sharded indexes                                           */
/* ============================================================================================== */

typedef enum qsa__dtype {
    QSA__F32 = 0, QSA__F16, QSA__BF16, QSA__F8_E4M3, QSA__U8, QSA__I64, QSA__I32, QSA__DTYPE_COUNT
} qsa__dtype;

/* One tensor of a mapped safetensors file.  `data` points into the mapping (not aligned in general:
   read through memcpy or byte loads).  `name` is the full name as stored in the file. */
typedef struct qsa__tensor {
    const char *name;
    qsa__dtype dtype;
    int ndim;
    int64_t shape[8];
    const uint8_t *data;
    size_t nbytes;
    int file;           /* index of the file in the set */
} qsa__tensor;

/* All tensors of a model directory (single file or sharded index), sorted by name. */
typedef struct qsa__st_set {
    int nfiles;
    qsa__map *files;
    int ntensors;
    qsa__tensor *tensors;
    char *prefix;       /* "model.language_model." or "model." or "" as detected */
    /* ... implementation-private fields may follow ... */
} qsa__st_set;
