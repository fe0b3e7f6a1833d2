/* ============================================================================================== */
/* >>dynload  dlopen tables for libcuda / libnvrtc / libnccl                                       */
/* ============================================================================================== */
/* The GPU stack is never linked: libcuda.so.1, libnvrtc and libnccl.so.2 are opened with dlopen
 * at first use and their entry points bound into function tables generated from X-macro lists
 * `X(ret, name, args)`.  Table members carry the exported symbol names, including the `_v2`
 * suffixes that cuda.h's macros would select (cuMemAlloc_v2, ...), so calls read as
 * `qsa__cu.cuMemAlloc_v2(&p, n)`.  The few CUDA/NVRTC/NCCL types needed are declared here: no
 * CUDA header is ever included, and the implementation must not be compiled in a translation unit
 * that includes cuda.h, nvrtc.h or nccl.h (their names would clash).  A missing library, symbol,
 * driver or device is an info log line plus QSA_ERR_NO_DEVICE, never a crash.
 *
 * Environment: QSA_CUDA_LIB, QSA_NVRTC_LIB, QSA_NCCL_LIB (a full path: only that file is tried),
 * QSA_ARCH (NVRTC target, e.g. compute_70 or sm_90; see qsa__nvrtc_pick_arch). */
#ifndef QSA_NO_CUDA

#if defined(__cuda_cuda_h__) || defined(__NVRTC_H__) || defined(NCCL_H_)
#error "qsa_runtime.h: compile the implementation in a file that does not include cuda.h/nvrtc.h/nccl.h"
#endif

/* ---- the foreign types (ABI-identical to the CUDA/NVRTC/NCCL headers) ---- */
typedef int CUresult; /* CUDA_SUCCESS = 0 */
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef struct CUctx_st *CUcontext;
typedef struct CUmod_st *CUmodule;
typedef struct CUfunc_st *CUfunction;
typedef struct CUstream_st *CUstream; /* also NCCL's cudaStream_t */
typedef struct CUevent_st *CUevent;
typedef struct CUgraph_st *CUgraph;
typedef struct CUgraphExec_st *CUgraphExec;

typedef int nvrtcResult; /* NVRTC_SUCCESS = 0 */
typedef struct _nvrtcProgram *nvrtcProgram;

typedef int ncclResult_t; /* ncclSuccess = 0 */
typedef int ncclDataType_t;
typedef int ncclRedOp_t;
typedef struct ncclComm *ncclComm_t;
typedef struct { char internal[128]; } ncclUniqueId;

/* the constants we use, under our own names (values from the CUDA 11-13 / NCCL 2 headers) */
#define QSA__CUDA_ERROR_OUT_OF_MEMORY 2
#define QSA__CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK 1
#define QSA__CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT 16
#define QSA__CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY 19
#define QSA__CU_DEVICE_ATTRIBUTE_PCI_BUS_ID 33
#define QSA__CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH 37
#define QSA__CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE 38
#define QSA__CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING 41
#define QSA__CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR 75
#define QSA__CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR 76
#define QSA__CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR 81
#define QSA__CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN 97
#define QSA__CU_FUNC_ATTRIBUTE_NUM_REGS 4
#define QSA__CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES 8
#define QSA__CU_STREAM_NON_BLOCKING 0x1
#define QSA__CU_EVENT_DISABLE_TIMING 0x2
#define QSA__CU_MEMHOSTALLOC_PORTABLE 0x1
#define QSA__CU_MEMHOSTALLOC_DEVICEMAP 0x2
#define QSA__CU_MEMHOSTREGISTER_PORTABLE 0x1
#define QSA__CU_MEMHOSTREGISTER_DEVICEMAP 0x2
#define QSA__CU_MEMHOSTREGISTER_READ_ONLY 0x8
#define QSA__CU_STREAM_CAPTURE_MODE_GLOBAL 0
#define QSA__CU_STREAM_CAPTURE_MODE_THREAD_LOCAL 1
#define QSA__CU_STREAM_CAPTURE_MODE_RELAXED 2
#define QSA__NCCL_INT8 0
#define QSA__NCCL_UINT8 1
#define QSA__NCCL_INT32 2
#define QSA__NCCL_UINT32 3
#define QSA__NCCL_INT64 4
#define QSA__NCCL_UINT64 5
#define QSA__NCCL_FLOAT16 6
#define QSA__NCCL_FLOAT32 7
#define QSA__NCCL_FLOAT64 8
#define QSA__NCCL_SUM 0
#define QSA__NCCL_MAX 2

/* ---- the function lists ---- */
/* Driver API.  Every entry exists in every driver that can run NVRTC 11.8 PTX (R520+):
   cuGraphInstantiateWithFlags (11.4+) is what cuda.h 12+ calls cuGraphInstantiate;
   cuEventElapsedTime is the v1 entry, still exported by 13.x drivers. */
#define QSA__CU_FUNCS(X) \
    X(CUresult, cuInit, (unsigned int flags)) \
    X(CUresult, cuDriverGetVersion, (int *version)) \
    X(CUresult, cuGetErrorName, (CUresult error, const char **name)) \
    X(CUresult, cuGetErrorString, (CUresult error, const char **text)) \
    X(CUresult, cuDeviceGetCount, (int *count)) \
    X(CUresult, cuDeviceGet, (CUdevice *dev, int ordinal)) \
    X(CUresult, cuDeviceGetName, (char *name, int len, CUdevice dev)) \
    X(CUresult, cuDeviceGetAttribute, (int *value, int attrib, CUdevice dev)) \
    X(CUresult, cuDeviceTotalMem_v2, (size_t *bytes, CUdevice dev)) \
    X(CUresult, cuDeviceCanAccessPeer, (int *can_access, CUdevice dev, CUdevice peer)) \
    X(CUresult, cuDevicePrimaryCtxRetain, (CUcontext *ctx, CUdevice dev)) \
    X(CUresult, cuDevicePrimaryCtxRelease_v2, (CUdevice dev)) \
    X(CUresult, cuCtxCreate_v2, (CUcontext *ctx, unsigned int flags, CUdevice dev)) \
    X(CUresult, cuCtxDestroy_v2, (CUcontext ctx)) \
    X(CUresult, cuCtxSetCurrent, (CUcontext ctx)) \
    X(CUresult, cuCtxGetCurrent, (CUcontext *ctx)) \
    X(CUresult, cuCtxSynchronize, (void)) \
    X(CUresult, cuCtxEnablePeerAccess, (CUcontext peer, unsigned int flags)) \
    X(CUresult, cuMemGetInfo_v2, (size_t *free_bytes, size_t *total_bytes)) \
    X(CUresult, cuMemAlloc_v2, (CUdeviceptr *dptr, size_t bytes)) \
    X(CUresult, cuMemFree_v2, (CUdeviceptr dptr)) \
    X(CUresult, cuMemHostAlloc, (void **pp, size_t bytes, unsigned int flags)) \
    X(CUresult, cuMemFreeHost, (void *p)) \
    X(CUresult, cuMemHostGetDevicePointer_v2, (CUdeviceptr *dptr, void *p, unsigned int flags)) \
    X(CUresult, cuMemHostRegister_v2, (void *p, size_t bytes, unsigned int flags)) \
    X(CUresult, cuMemHostUnregister, (void *p)) \
    X(CUresult, cuMemcpyHtoD_v2, (CUdeviceptr dst, const void *src, size_t bytes)) \
    X(CUresult, cuMemcpyDtoH_v2, (void *dst, CUdeviceptr src, size_t bytes)) \
    X(CUresult, cuMemcpyDtoD_v2, (CUdeviceptr dst, CUdeviceptr src, size_t bytes)) \
    X(CUresult, cuMemcpyHtoDAsync_v2, (CUdeviceptr dst, const void *src, size_t bytes, CUstream s)) \
    X(CUresult, cuMemcpyDtoHAsync_v2, (void *dst, CUdeviceptr src, size_t bytes, CUstream s)) \
    X(CUresult, cuMemcpyDtoDAsync_v2, (CUdeviceptr dst, CUdeviceptr src, size_t bytes, CUstream s)) \
    X(CUresult, cuMemcpyPeerAsync, (CUdeviceptr dst, CUcontext dst_ctx, CUdeviceptr src, CUcontext src_ctx, \
                                    size_t bytes, CUstream s)) \
    X(CUresult, cuMemsetD8_v2, (CUdeviceptr dst, unsigned char value, size_t n)) \
    X(CUresult, cuMemsetD32_v2, (CUdeviceptr dst, unsigned int value, size_t n)) \
    X(CUresult, cuMemsetD8Async, (CUdeviceptr dst, unsigned char value, size_t n, CUstream s)) \
    X(CUresult, cuMemsetD32Async, (CUdeviceptr dst, unsigned int value, size_t n, CUstream s)) \
    X(CUresult, cuModuleLoadData, (CUmodule *mod, const void *image)) \
    X(CUresult, cuModuleLoadDataEx, (CUmodule *mod, const void *image, unsigned int nopts, int *opts, void **values)) \
    X(CUresult, cuModuleUnload, (CUmodule mod)) \
    X(CUresult, cuModuleGetFunction, (CUfunction *fn, CUmodule mod, const char *name)) \
    X(CUresult, cuFuncSetAttribute, (CUfunction fn, int attrib, int value)) \
    X(CUresult, cuFuncGetAttribute, (int *value, int attrib, CUfunction fn)) \
    X(CUresult, cuLaunchKernel, (CUfunction fn, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx, \
                                 unsigned int by, unsigned int bz, unsigned int shmem, CUstream s, void **params, \
                                 void **extra)) \
    X(CUresult, cuStreamCreate, (CUstream *s, unsigned int flags)) \
    X(CUresult, cuStreamDestroy_v2, (CUstream s)) \
    X(CUresult, cuStreamSynchronize, (CUstream s)) \
    X(CUresult, cuStreamWaitEvent, (CUstream s, CUevent e, unsigned int flags)) \
    X(CUresult, cuEventCreate, (CUevent *e, unsigned int flags)) \
    X(CUresult, cuEventRecord, (CUevent e, CUstream s)) \
    X(CUresult, cuEventSynchronize, (CUevent e)) \
    X(CUresult, cuEventElapsedTime, (float *ms, CUevent start, CUevent end)) \
    X(CUresult, cuEventDestroy_v2, (CUevent e)) \
    X(CUresult, cuStreamBeginCapture_v2, (CUstream s, int mode)) \
    X(CUresult, cuStreamEndCapture, (CUstream s, CUgraph *graph)) \
    X(CUresult, cuGraphInstantiateWithFlags, (CUgraphExec *exec, CUgraph graph, unsigned long long flags)) \
    X(CUresult, cuGraphLaunch, (CUgraphExec exec, CUstream s)) \
    X(CUresult, cuGraphExecDestroy, (CUgraphExec exec)) \
    X(CUresult, cuGraphDestroy, (CUgraph graph))

#define QSA__NVRTC_FUNCS(X) \
    X(nvrtcResult, nvrtcVersion, (int *major, int *minor)) \
    X(const char *, nvrtcGetErrorString, (nvrtcResult result)) \
    X(nvrtcResult, nvrtcCreateProgram, (nvrtcProgram *prog, const char *src, const char *name, int nheaders, \
                                        const char *const *headers, const char *const *include_names)) \
    X(nvrtcResult, nvrtcCompileProgram, (nvrtcProgram prog, int nopts, const char *const *opts)) \
    X(nvrtcResult, nvrtcGetPTXSize, (nvrtcProgram prog, size_t *size)) \
    X(nvrtcResult, nvrtcGetPTX, (nvrtcProgram prog, char *ptx)) \
    X(nvrtcResult, nvrtcGetProgramLogSize, (nvrtcProgram prog, size_t *size)) \
    X(nvrtcResult, nvrtcGetProgramLog, (nvrtcProgram prog, char *log)) \
    X(nvrtcResult, nvrtcDestroyProgram, (nvrtcProgram *prog))
/* optional: NULL when the library predates them */
#define QSA__NVRTC_FUNCS_OPT(X) \
    X(nvrtcResult, nvrtcGetNumSupportedArchs, (int *count)) \
    X(nvrtcResult, nvrtcGetSupportedArchs, (int *archs)) \
    X(nvrtcResult, nvrtcGetCUBINSize, (nvrtcProgram prog, size_t *size)) \
    X(nvrtcResult, nvrtcGetCUBIN, (nvrtcProgram prog, char *cubin))

#define QSA__NCCL_FUNCS(X) \
    X(ncclResult_t, ncclGetVersion, (int *version)) \
    X(const char *, ncclGetErrorString, (ncclResult_t result)) \
    X(ncclResult_t, ncclGetUniqueId, (ncclUniqueId *id)) \
    X(ncclResult_t, ncclCommInitRank, (ncclComm_t *comm, int nranks, ncclUniqueId id, int rank)) \
    X(ncclResult_t, ncclCommInitAll, (ncclComm_t *comms, int ndev, const int *devlist)) \
    X(ncclResult_t, ncclCommDestroy, (ncclComm_t comm)) \
    X(ncclResult_t, ncclCommAbort, (ncclComm_t comm)) \
    X(ncclResult_t, ncclCommCount, (const ncclComm_t comm, int *count)) \
    X(ncclResult_t, ncclCommUserRank, (const ncclComm_t comm, int *rank)) \
    X(ncclResult_t, ncclCommGetAsyncError, (ncclComm_t comm, ncclResult_t *async_error)) \
    X(ncclResult_t, ncclAllReduce, (const void *send, void *recv, size_t count, ncclDataType_t type, ncclRedOp_t op, \
                                    ncclComm_t comm, CUstream s)) \
    X(ncclResult_t, ncclAllGather, (const void *send, void *recv, size_t send_count, ncclDataType_t type, \
                                    ncclComm_t comm, CUstream s)) \
    X(ncclResult_t, ncclBroadcast, (const void *send, void *recv, size_t count, ncclDataType_t type, int root, \
                                    ncclComm_t comm, CUstream s)) \
    X(ncclResult_t, ncclReduceScatter, (const void *send, void *recv, size_t recv_count, ncclDataType_t type, \
                                        ncclRedOp_t op, ncclComm_t comm, CUstream s)) \
    X(ncclResult_t, ncclGroupStart, (void)) \
    X(ncclResult_t, ncclGroupEnd, (void))
#define QSA__NCCL_FUNCS_OPT(X) \
    X(ncclResult_t, ncclSend, (const void *send, size_t count, ncclDataType_t type, int peer, ncclComm_t comm, \
                               CUstream s)) \
    X(ncclResult_t, ncclRecv, (void *recv, size_t count, ncclDataType_t type, int peer, ncclComm_t comm, CUstream s)) \
    X(const char *, ncclGetLastError, (ncclComm_t comm))

/* ---- expansion: typedefs, tables ---- */
#define QSA__DL_TYPEDEF(ret, name, args) typedef ret(*qsa__pfn_##name) args;
#define QSA__DL_MEMBER(ret, name, args) qsa__pfn_##name name;
QSA__CU_FUNCS(QSA__DL_TYPEDEF)
QSA__NVRTC_FUNCS(QSA__DL_TYPEDEF)
QSA__NVRTC_FUNCS_OPT(QSA__DL_TYPEDEF)
QSA__NCCL_FUNCS(QSA__DL_TYPEDEF)
QSA__NCCL_FUNCS_OPT(QSA__DL_TYPEDEF)

typedef struct qsa__cuda_api {
    void *lib;
    char path[256];     /* the name or path that was opened */
    int driver_version; /* e.g. 12040 for 12.4 */
    int device_count;
    QSA__CU_FUNCS(QSA__DL_MEMBER)
} qsa__cuda_api;

typedef struct qsa__nvrtc_api {
    void *lib, *builtins; /* builtins: libnvrtc-builtins preloaded from QSA_NVRTC_LIB's directory */
    char path[512];
    int major, minor;
    int narchs;    /* 0 when nvrtcGetSupportedArchs is absent */
    int archs[64]; /* e.g. 70, 75, 80, ... */
    QSA__NVRTC_FUNCS(QSA__DL_MEMBER)
    QSA__NVRTC_FUNCS_OPT(QSA__DL_MEMBER)
} qsa__nvrtc_api;

typedef struct qsa__nccl_api {
    void *lib;
    char path[512];
    int version; /* e.g. 22105 for 2.21.5 */
    QSA__NCCL_FUNCS(QSA__DL_MEMBER)
    QSA__NCCL_FUNCS_OPT(QSA__DL_MEMBER)
} qsa__nccl_api;

/* One symbol to bind: its name and where its pointer goes in the table. */
typedef struct qsa__dl_entry {
    const char *name;
    size_t offset;
    int required;
} qsa__dl_entry;

#define QSA__CU_ENTRY(ret, name, args) {#name, offsetof(qsa__cuda_api, name), 1},
#define QSA__NVRTC_ENTRY(ret, name, args) {#name, offsetof(qsa__nvrtc_api, name), 1},
#define QSA__NVRTC_ENTRY_OPT(ret, name, args) {#name, offsetof(qsa__nvrtc_api, name), 0},
#define QSA__NCCL_ENTRY(ret, name, args) {#name, offsetof(qsa__nccl_api, name), 1},
#define QSA__NCCL_ENTRY_OPT(ret, name, args) {#name, offsetof(qsa__nccl_api, name), 0},
static const qsa__dl_entry qsa__cu_entries[] = {QSA__CU_FUNCS(QSA__CU_ENTRY)};
static const qsa__dl_entry qsa__nvrtc_entries[] = {QSA__NVRTC_FUNCS(QSA__NVRTC_ENTRY)
                                                       QSA__NVRTC_FUNCS_OPT(QSA__NVRTC_ENTRY_OPT)};
static const qsa__dl_entry qsa__nccl_entries[] = {QSA__NCCL_FUNCS(QSA__NCCL_ENTRY)
                                                      QSA__NCCL_FUNCS_OPT(QSA__NCCL_ENTRY_OPT)};

/* The process-wide tables, filled once by qsa__cuda_load / qsa__nvrtc_load / qsa__nccl_load. */
static qsa__cuda_api qsa__cu;
static qsa__nvrtc_api qsa__nvrtc;
static qsa__nccl_api qsa__nccl;

/* ---- loading ---- */

/* Opens the first library of `names` that dlopen accepts, or only getenv(env) when that is set.
   On failure records QSA_ERR_NO_DEVICE with every name tried and dlerror's reason. */
QSA_PRIV void *qsa__dl_open_first(const char *what, const char *env, const char *const *names, int n, char *opened,
                                  size_t cap) {
    const char *forced = env ? getenv(env) : NULL;
    const char *one[1];
    if (forced && forced[0]) {
        one[0] = forced;
        names = one;
        n = 1;
    }
    char tried[768];
    size_t len = 0;
    tried[0] = 0;
    for (int i = 0; i < n; i++) {
        void *h = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
        if (h) {
            snprintf(opened, cap, "%s", names[i]);
            return h;
        }
        const char *why = dlerror();
        if (len < sizeof tried) {
            int k = snprintf(tried + len, sizeof tried - len, "%s%s", len ? "; " : "", why ? why : names[i]);
            if (k > 0) len += (size_t)k;
        }
    }
    if (forced && forced[0])
        qsa__fail(QSA_ERR_NO_DEVICE, "%s: cannot open %s=%s (%s)", what, env, forced, tried);
    else
        qsa__fail(QSA_ERR_NO_DEVICE, "%s not found (%s)", what, tried);
    return NULL;
}

/* Resolves every entry into `table`; a missing required symbol fails, a missing optional one
   stays NULL.  dlsym's void* goes through memcpy: ISO C has no object-to-function pointer cast. */
QSA_PRIV qsa_result qsa__dl_bind(void *lib, const char *path, void *table, const qsa__dl_entry *e, size_t n) {
    for (size_t i = 0; i < n; i++) {
        void *sym = dlsym(lib, e[i].name);
        if (!sym && e[i].required)
            return qsa__fail(QSA_ERR_NO_DEVICE, "%s: missing symbol %s (library too old?)", path, e[i].name);
        memcpy((char *)table + e[i].offset, &sym, sizeof sym);
    }
    return QSA_OK;
}

/* Loads libcuda into *api from the first of `names` (or only getenv(env) when env names a set
   variable), initialises the driver and counts devices.  No device or a stub/broken driver is
   QSA_ERR_NO_DEVICE.  The qsa__*_load_from functions are the uncached loaders behind the
   process-wide qsa__*_load (tests call them directly with env = NULL). */
QSA_PRIV qsa_result qsa__cuda_load_from(const char *env, const char *const *names, int n, qsa__cuda_api *api) {
    memset(api, 0, sizeof *api);
    void *lib = qsa__dl_open_first("libcuda (NVIDIA driver)", env, names, n, api->path, sizeof api->path);
    if (!lib) return QSA_ERR_NO_DEVICE;
    qsa_result r = qsa__dl_bind(lib, api->path, api, qsa__cu_entries, sizeof qsa__cu_entries / sizeof qsa__cu_entries[0]);
    if (r == QSA_OK) {
        CUresult cr = api->cuInit(0);
        if (cr != 0) {
            const char *name = NULL;
            if (api->cuGetErrorName(cr, &name) != 0 || !name) name = "?";
            r = qsa__fail(QSA_ERR_NO_DEVICE, "%s: cuInit(0) failed: %s (%d): no usable driver or device", api->path,
                          name, (int)cr);
        }
    }
    if (r == QSA_OK && (api->cuDriverGetVersion(&api->driver_version) != 0 ||
                        api->cuDeviceGetCount(&api->device_count) != 0 || api->device_count <= 0))
        r = qsa__fail(QSA_ERR_NO_DEVICE, "%s: the driver reports no CUDA device", api->path);
    if (r != QSA_OK) {
        dlclose(lib);
        memset(api, 0, sizeof *api);
        return r;
    }
    api->lib = lib;
    return QSA_OK;
}

/* Loads an NVRTC into *api from the first of `names` (or getenv(env)).  When the library is
   given as a path, its libnvrtc-builtins.so.MAJOR.MINOR is preloaded from the same directory:
   NVRTC dlopens it by soname at compile time, which would otherwise fail outside the loader path. */
QSA_PRIV qsa_result qsa__nvrtc_load_from(const char *env, const char *const *names, int n, qsa__nvrtc_api *api) {
    memset(api, 0, sizeof *api);
    void *lib = qsa__dl_open_first("libnvrtc (CUDA runtime compiler)", env, names, n, api->path,
                                   sizeof api->path);
    if (!lib) return QSA_ERR_NO_DEVICE;
    qsa_result r = qsa__dl_bind(lib, api->path, api, qsa__nvrtc_entries,
                                sizeof qsa__nvrtc_entries / sizeof qsa__nvrtc_entries[0]);
    if (r == QSA_OK && api->nvrtcVersion(&api->major, &api->minor) != 0)
        r = qsa__fail(QSA_ERR_NO_DEVICE, "%s: nvrtcVersion failed", api->path);
    if (r != QSA_OK) {
        dlclose(lib);
        memset(api, 0, sizeof *api);
        return r;
    }
    api->lib = lib;
    const char *slash = strrchr(api->path, '/');
    if (slash) {
        char b[600];
        snprintf(b, sizeof b, "%.*s/libnvrtc-builtins.so.%d.%d", (int)(slash - api->path), api->path, api->major,
                 api->minor);
        api->builtins = dlopen(b, RTLD_NOW | RTLD_LOCAL);
        if (!api->builtins) qsa__log(QSA_LOG_DEBUG, "nvrtc: no %s next to the library (NVRTC will search)", b);
    }
    int na = 0;
    if (api->nvrtcGetNumSupportedArchs && api->nvrtcGetSupportedArchs && api->nvrtcGetNumSupportedArchs(&na) == 0 &&
        na > 0 && na <= (int)(sizeof api->archs / sizeof api->archs[0]) && api->nvrtcGetSupportedArchs(api->archs) == 0)
        api->narchs = na;
    return QSA_OK;
}

/* Loads NCCL into *api from the first of `names` (or getenv(env)). */
QSA_PRIV qsa_result qsa__nccl_load_from(const char *env, const char *const *names, int n, qsa__nccl_api *api) {
    memset(api, 0, sizeof *api);
    void *lib = qsa__dl_open_first("libnccl (NCCL)", env, names, n, api->path, sizeof api->path);
    if (!lib) return QSA_ERR_NO_DEVICE;
    qsa_result r = qsa__dl_bind(lib, api->path, api, qsa__nccl_entries,
                                sizeof qsa__nccl_entries / sizeof qsa__nccl_entries[0]);
    if (r == QSA_OK && api->ncclGetVersion(&api->version) != 0)
        r = qsa__fail(QSA_ERR_NO_DEVICE, "%s: ncclGetVersion failed", api->path);
    if (r != QSA_OK) {
        dlclose(lib);
        memset(api, 0, sizeof *api);
        return r;
    }
    api->lib = lib;
    return QSA_OK;
}

/* Process-wide, thread-safe, once: the outcome (and its message) is remembered and every later
   call returns the same result and re-records the same message for the calling thread. */
typedef struct qsa__dl_once {
    pthread_once_t once;
    qsa_result status;
    char message[1024];
} qsa__dl_once;
static qsa__dl_once qsa__cu_once = {PTHREAD_ONCE_INIT, QSA_ERR_INTERNAL, ""};
static qsa__dl_once qsa__nvrtc_once = {PTHREAD_ONCE_INIT, QSA_ERR_INTERNAL, ""};
static qsa__dl_once qsa__nccl_once = {PTHREAD_ONCE_INIT, QSA_ERR_INTERNAL, ""};

QSA_PRIV void qsa__dl_once_done(qsa__dl_once *o, qsa_result r, const char *what) {
    o->status = r;
    if (r != QSA_OK) {
        snprintf(o->message, sizeof o->message, "%s", qsa__err_buf);
        qsa__log(QSA_LOG_INFO, "%s unavailable: %s", what, o->message);
    }
}
QSA_PRIV qsa_result qsa__dl_once_result(const qsa__dl_once *o) {
    return o->status == QSA_OK ? QSA_OK : qsa__fail(o->status, "%s", o->message);
}

QSA_PRIV void qsa__cuda_load_once(void) {
    static const char *const names[] = {"libcuda.so.1", "libcuda.so"};
    qsa_result r = qsa__cuda_load_from("QSA_CUDA_LIB", names, 2, &qsa__cu);
    qsa__dl_once_done(&qsa__cu_once, r, "CUDA backend");
    if (r == QSA_OK)
        qsa__log(QSA_LOG_INFO, "libcuda: %s, driver API %d.%d, %d device(s)", qsa__cu.path,
                 qsa__cu.driver_version / 1000, qsa__cu.driver_version % 1000 / 10, qsa__cu.device_count);
}
QSA_PRIV void qsa__nvrtc_load_once(void) {
    static const char *const names[] = {"libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so.11.2", "libnvrtc.so"};
    qsa_result r = qsa__nvrtc_load_from("QSA_NVRTC_LIB", names, 4, &qsa__nvrtc);
    qsa__dl_once_done(&qsa__nvrtc_once, r, "NVRTC");
    if (r == QSA_OK) qsa__log(QSA_LOG_INFO, "nvrtc: %s, version %d.%d", qsa__nvrtc.path, qsa__nvrtc.major, qsa__nvrtc.minor);
}
QSA_PRIV void qsa__nccl_load_once(void) {
    static const char *const names[] = {"libnccl.so.2", "libnccl.so"};
    qsa_result r = qsa__nccl_load_from("QSA_NCCL_LIB", names, 2, &qsa__nccl);
    qsa__dl_once_done(&qsa__nccl_once, r, "NCCL");
    if (r == QSA_OK)
        qsa__log(QSA_LOG_INFO, "nccl: %s, version %d", qsa__nccl.path, qsa__nccl.version);
}

/* Load (once per process) and report: QSA_OK, or QSA_ERR_NO_DEVICE with the reason. */
QSA_PRIV qsa_result qsa__cuda_load(void) {
    pthread_once(&qsa__cu_once.once, qsa__cuda_load_once);
    return qsa__dl_once_result(&qsa__cu_once);
}
QSA_PRIV qsa_result qsa__nvrtc_load(void) {
    pthread_once(&qsa__nvrtc_once.once, qsa__nvrtc_load_once);
    return qsa__dl_once_result(&qsa__nvrtc_once);
}
QSA_PRIV qsa_result qsa__nccl_load(void) {
    pthread_once(&qsa__nccl_once.once, qsa__nccl_load_once);
    return qsa__dl_once_result(&qsa__nccl_once);
}

/* ---- error checks: one macro per foreign API ---- */
/* QSA__CU(call) / QSA__NVRTC(call) / QSA__NCCL(call): on failure record the call text, the error
   name and the line with qsa__fail and return the qsa_result from the enclosing function.
   QSA__CU_R(call) etc. are the expression forms (for cleanup paths): they give QSA_OK or the
   recorded failure. */
QSA_PRIV const char *qsa__dl_call_text(const char *call, const char *prefix) {
    size_t n = strlen(prefix);
    return strncmp(call, prefix, n) == 0 ? call + n : call;
}
QSA_PRIV qsa_result qsa__cu_check(CUresult r, const char *call, int line) {
    if (r == 0) return QSA_OK;
    const char *name = NULL, *text = NULL;
    if (qsa__cu.cuGetErrorName && qsa__cu.cuGetErrorName(r, &name) != 0) name = NULL;
    if (qsa__cu.cuGetErrorString && qsa__cu.cuGetErrorString(r, &text) != 0) text = NULL;
    return qsa__fail(r == QSA__CUDA_ERROR_OUT_OF_MEMORY ? QSA_ERR_OUT_OF_MEMORY : QSA_ERR_CUDA,
                     "%s failed: %s (%d%s%s) at line %d", qsa__dl_call_text(call, "qsa__cu."),
                     name ? name : "CUDA_ERROR", (int)r, text ? ": " : "", text ? text : "", line);
}
QSA_PRIV qsa_result qsa__nvrtc_check(nvrtcResult r, const char *call, int line) {
    if (r == 0) return QSA_OK;
    const char *name = qsa__nvrtc.nvrtcGetErrorString ? qsa__nvrtc.nvrtcGetErrorString(r) : NULL;
    return qsa__fail(r == 1 ? QSA_ERR_OUT_OF_MEMORY : QSA_ERR_NVRTC, "%s failed: %s (%d) at line %d",
                     qsa__dl_call_text(call, "qsa__nvrtc."), name ? name : "NVRTC_ERROR", (int)r, line);
}
QSA_PRIV const char *qsa__nccl_result_name(ncclResult_t r) {
    static const char *const names[] = {"ncclSuccess",        "ncclUnhandledCudaError", "ncclSystemError",
                                        "ncclInternalError",  "ncclInvalidArgument",    "ncclInvalidUsage",
                                        "ncclRemoteError",    "ncclInProgress"};
    return r >= 0 && r < (int)(sizeof names / sizeof names[0]) ? names[r] : "ncclError";
}
QSA_PRIV qsa_result qsa__nccl_check(ncclResult_t r, const char *call, int line) {
    if (r == 0) return QSA_OK;
    const char *text = qsa__nccl.ncclGetErrorString ? qsa__nccl.ncclGetErrorString(r) : NULL;
    return qsa__fail(QSA_ERR_NCCL, "%s failed: %s (%d%s%s) at line %d", qsa__dl_call_text(call, "qsa__nccl."),
                     qsa__nccl_result_name(r), (int)r, text ? ": " : "", text ? text : "", line);
}
#define QSA__CU_R(call) qsa__cu_check((call), #call, __LINE__)
#define QSA__NVRTC_R(call) qsa__nvrtc_check((call), #call, __LINE__)
#define QSA__NCCL_R(call) qsa__nccl_check((call), #call, __LINE__)
#define QSA__CU(call) do { qsa_result qsa__cu_r_ = QSA__CU_R(call); if (qsa__cu_r_ != QSA_OK) return qsa__cu_r_; } while (0)
#define QSA__NVRTC(call) do { qsa_result qsa__nv_r_ = QSA__NVRTC_R(call); if (qsa__nv_r_ != QSA_OK) return qsa__nv_r_; } while (0)
#define QSA__NCCL(call) do { qsa_result qsa__nc_r_ = QSA__NCCL_R(call); if (qsa__nc_r_ != QSA_OK) return qsa__nc_r_; } while (0)

/* Launch a kernel; the message names the kernel and the launch shape.  With QSA_DEBUG the stream
   is synchronised afterwards so that a faulting kernel is reported at its own launch. */
QSA_PRIV qsa_result qsa__cu_launch(CUfunction fn, const char *name, unsigned gx, unsigned gy, unsigned gz,
                                   unsigned bx, unsigned by, unsigned bz, unsigned shmem, CUstream s, void **args) {
    CUresult r = qsa__cu.cuLaunchKernel(fn, gx, gy, gz, bx, by, bz, shmem, s, args, NULL);
#ifdef QSA_DEBUG
    if (r == 0) r = qsa__cu.cuStreamSynchronize(s);
#endif
    if (r == 0) return QSA_OK;
    char what[256];
    snprintf(what, sizeof what, "launch %s grid (%u,%u,%u) block (%u,%u,%u) smem %u", name, gx, gy, gz, bx, by, bz,
             shmem);
    return qsa__cu_check(r, what, __LINE__);
}

/* What the runtime needs to know about a device. */
typedef struct qsa__gpu_info {
    int ordinal;
    char name[128];
    int cc_major, cc_minor; /* 7.0 for V100 */
    int sm_count;
    int smem_optin;         /* max shared memory per block with opt-in, bytes */
    int smem_per_sm;
    int unified_addressing, can_map_host;
    size_t total_mem;
} qsa__gpu_info;

QSA_PRIV qsa_result qsa__cu_device_info(int ordinal, qsa__gpu_info *info) {
    CUdevice dev;
    memset(info, 0, sizeof *info);
    QSA__TRY(qsa__cuda_load());
    if (ordinal < 0 || ordinal >= qsa__cu.device_count)
        return qsa__fail(QSA_ERR_INVALID_ARGUMENT, "GPU %d does not exist (%d device(s))", ordinal, qsa__cu.device_count);
    info->ordinal = ordinal;
    QSA__CU(qsa__cu.cuDeviceGet(&dev, ordinal));
    QSA__CU(qsa__cu.cuDeviceGetName(info->name, (int)sizeof info->name, dev));
    QSA__CU(qsa__cu.cuDeviceGetAttribute(&info->cc_major, QSA__CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev));
    QSA__CU(qsa__cu.cuDeviceGetAttribute(&info->cc_minor, QSA__CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev));
    QSA__CU(qsa__cu.cuDeviceGetAttribute(&info->sm_count, QSA__CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev));
    QSA__CU(qsa__cu.cuDeviceGetAttribute(&info->smem_optin, QSA__CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, dev));
    QSA__CU(qsa__cu.cuDeviceGetAttribute(&info->smem_per_sm, QSA__CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR, dev));
    QSA__CU(qsa__cu.cuDeviceGetAttribute(&info->unified_addressing, QSA__CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING, dev));
    QSA__CU(qsa__cu.cuDeviceGetAttribute(&info->can_map_host, QSA__CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY, dev));
    QSA__CU(qsa__cu.cuDeviceTotalMem_v2(&info->total_mem, dev));
    return QSA_OK;
}

/* ============================================================================================== */
/* >>nvrtc  the embedded kernels and their compilation                                             */
/* ============================================================================================== */

/* kernels.cu, one string per line, after `#line 1 "kernels.cu"` (generated by make).  A list of
   short literals rather than one long one: ISO C only promises 4095 characters per literal. */
static const char *const qsa__kernel_lines[] = {
#include "../kernels.cu.inc"
};

/* The kernel source as one NUL-terminated string (caller frees), NULL when out of memory. */
QSA_PRIV char *qsa__kernels_source(void) {
    size_t n = sizeof qsa__kernel_lines / sizeof qsa__kernel_lines[0], len = 0;
    for (size_t i = 0; i < n; i++) len += strlen(qsa__kernel_lines[i]);
    char *s = QSA__ALLOC(char, len + 1);
    if (!s) return NULL;
    len = 0;
    for (size_t i = 0; i < n; i++) {
        size_t k = strlen(qsa__kernel_lines[i]);
        memcpy(s + len, qsa__kernel_lines[i], k);
        len += k;
    }
    s[len] = 0;
    return s;
}

/* Does the loaded NVRTC accept compute_<sm>?  Its own list when it has one (11.2+); otherwise
   NVRTC before 13 still targets Volta. */
QSA_PRIV int qsa__nvrtc_supports(int sm) {
    if (qsa__nvrtc.narchs > 0) {
        for (int i = 0; i < qsa__nvrtc.narchs; i++)
            if (qsa__nvrtc.archs[i] == sm) return 1;
        return 0;
    }
    return sm >= 70 && qsa__nvrtc.major < 13;
}

/* "70" / "compute_70" / "sm_90" / "sm_90a" -> normalised into out; 0 when malformed. */
QSA_PRIV int qsa__nvrtc_parse_arch(const char *s, char *out, size_t cap) {
    const char *p = s;
    const char *prefix = "compute_";
    if (!strncmp(s, "compute_", 8)) p = s + 8;
    else if (!strncmp(s, "sm_", 3)) { p = s + 3; prefix = "sm_"; }
    size_t digits = 0;
    while (p[digits] >= '0' && p[digits] <= '9') digits++;
    if (digits < 2 || digits > 3) return 0;
    if (p[digits] && !(p[digits] >= 'a' && p[digits] <= 'z' && !p[digits + 1])) return 0;
    snprintf(out, cap, "%s%s", prefix, p);
    return 1;
}

/* Chooses the NVRTC target.  In order: `want` (a parameter), $QSA_ARCH, compute_70 when the loaded
   NVRTC supports it (the sm_70 path of SPEC section 6), else PTX for the device's own arch
   `device_cc` (major*10+minor; the newest the NVRTC supports that does not exceed it), else
   compute_90 when there is no device (compile checks).  The choice and the reason are logged. */
QSA_PRIV qsa_result qsa__nvrtc_pick_arch(const char *want, int device_cc, char *arch, size_t cap) {
    QSA__TRY(qsa__nvrtc_load());
    const char *why;
    if (!want || !want[0]) want = getenv("QSA_ARCH");
    if (want && want[0]) {
        if (!qsa__nvrtc_parse_arch(want, arch, cap))
            return qsa__fail(QSA_ERR_INVALID_ARGUMENT, "NVRTC target '%s': expected compute_NN, sm_NN or NN", want);
        why = "requested (parameter or QSA_ARCH)";
    } else if (qsa__nvrtc_supports(70)) {
        snprintf(arch, cap, "compute_70");
        why = "default: Volta PTX, runs on sm_70 and newer";
    } else if (device_cc > 0) {
        int best = device_cc;
        if (qsa__nvrtc.narchs > 0) {
            best = 0;
            for (int i = 0; i < qsa__nvrtc.narchs; i++)
                if (qsa__nvrtc.archs[i] <= device_cc && qsa__nvrtc.archs[i] > best) best = qsa__nvrtc.archs[i];
            if (!best)
                return qsa__fail(QSA_ERR_UNSUPPORTED,
                                 "NVRTC %d.%d (%s) supports no target for a compute %d.%d device: point QSA_NVRTC_LIB "
                                 "at an NVRTC 11.8-12.x",
                                 qsa__nvrtc.major, qsa__nvrtc.minor, qsa__nvrtc.path, device_cc / 10, device_cc % 10);
        }
        snprintf(arch, cap, "compute_%d", best);
        why = "this NVRTC cannot target compute_70: the device's own arch";
    } else {
        snprintf(arch, cap, "compute_90");
        why = "this NVRTC cannot target compute_70 and there is no device";
    }
    qsa__log(QSA_LOG_INFO, "nvrtc: target %s (%s; NVRTC %d.%d)", arch, why, qsa__nvrtc.major, qsa__nvrtc.minor);
    return QSA_OK;
}

/* Compiles `src` (named `name` in diagnostics) for `arch` ("compute_70": PTX; "sm_90": a CUBIN when
 * the NVRTC can produce one, else PTX) with the extra options `opts`.  On success *image is the
 * NUL-terminated PTX (or the CUBIN) for cuModuleLoadData and *image_len its size without the NUL;
 * *log (when log is not NULL) receives NVRTC's log, possibly empty.  Both are freed with qsa_free.
 * On a compilation error the message holds NVRTC's log, whose lines name `kernels.cu(LINE)`. */
QSA_PRIV qsa_result qsa__nvrtc_compile(const char *src, const char *name, const char *const *opts, int nopts,
                                       const char *arch, char **image, size_t *image_len, char **log) {
    *image = NULL;
    *image_len = 0;
    if (log) *log = NULL;
    QSA__TRY(qsa__nvrtc_load());
    if (nopts < 0 || (nopts > 0 && !opts) || !src || !name || !arch)
        return qsa__fail(QSA_ERR_INVALID_ARGUMENT, "qsa__nvrtc_compile: bad arguments");
    const char **all = QSA__ALLOC(const char *, nopts + 1);
    char archopt[64];
    char *logbuf = NULL, *out = NULL;
    size_t loglen = 0, outlen = 0;
    nvrtcProgram prog = NULL;
    qsa_result r = QSA_OK;
    int cubin = !strncmp(arch, "sm_", 3) && qsa__nvrtc.nvrtcGetCUBINSize && qsa__nvrtc.nvrtcGetCUBIN;
    double t0 = qsa__now();
    if (!all) return qsa__fail(QSA_ERR_OUT_OF_MEMORY, "nvrtc: out of memory");
    snprintf(archopt, sizeof archopt, "--gpu-architecture=%s", arch);
    all[0] = archopt;
    for (int i = 0; i < nopts; i++) all[i + 1] = opts[i];

    r = QSA__NVRTC_R(qsa__nvrtc.nvrtcCreateProgram(&prog, src, name, 0, NULL, NULL));
    if (r != QSA_OK) goto done;
    {
        nvrtcResult cr = qsa__nvrtc.nvrtcCompileProgram(prog, nopts + 1, all);
        if (qsa__nvrtc.nvrtcGetProgramLogSize(prog, &loglen) == 0 && loglen > 0 &&
            (logbuf = QSA__ALLOC(char, loglen + 1)) != NULL) {
            if (qsa__nvrtc.nvrtcGetProgramLog(prog, logbuf) != 0) logbuf[0] = 0;
            logbuf[loglen] = 0;
        }
        if (cr != 0) {
            r = qsa__fail(QSA_ERR_NVRTC, "NVRTC %d.%d: compiling %s for %s failed (%s):\n%s", qsa__nvrtc.major,
                          qsa__nvrtc.minor, name, arch, qsa__nvrtc.nvrtcGetErrorString(cr), logbuf ? logbuf : "");
            goto done;
        }
    }
    if (cubin) r = QSA__NVRTC_R(qsa__nvrtc.nvrtcGetCUBINSize(prog, &outlen));
    else r = QSA__NVRTC_R(qsa__nvrtc.nvrtcGetPTXSize(prog, &outlen));
    if (r != QSA_OK) goto done;
    if (outlen == 0) {
        r = qsa__fail(QSA_ERR_NVRTC, "NVRTC %d.%d: compiling %s for %s produced no %s", qsa__nvrtc.major,
                      qsa__nvrtc.minor, name, arch, cubin ? "CUBIN" : "PTX");
        goto done;
    }
    out = QSA__ALLOC(char, outlen + 1);
    if (!out) {
        r = qsa__fail(QSA_ERR_OUT_OF_MEMORY, "nvrtc: out of memory for %zu bytes of output", outlen);
        goto done;
    }
    if (cubin) r = QSA__NVRTC_R(qsa__nvrtc.nvrtcGetCUBIN(prog, out));
    else r = QSA__NVRTC_R(qsa__nvrtc.nvrtcGetPTX(prog, out));
    if (r != QSA_OK) goto done;
    out[outlen] = 0;
    if (!cubin) outlen = strlen(out); /* the PTX size counts its NUL */
    qsa__log(QSA_LOG_INFO, "nvrtc: compiled %s for %s in %.0f ms (%zu bytes of %s, NVRTC %d.%d)", name, arch,
             1e3 * (qsa__now() - t0), outlen, cubin ? "CUBIN" : "PTX", qsa__nvrtc.major, qsa__nvrtc.minor);
    *image = out;
    *image_len = outlen;
    out = NULL;
done:
    if (prog) qsa__nvrtc.nvrtcDestroyProgram(&prog);
    if (log && logbuf) {
        *log = logbuf;
        logbuf = NULL;
    }
    qsa__free(logbuf);
    qsa__free(out);
    qsa__free((void *)all);
    return r;
}

/* Compiles the embedded kernels (kernels.cu) for `arch` (NULL: qsa__nvrtc_pick_arch(NULL, device_cc)).
   `arch_out` (may be NULL) receives the target used. */
QSA_PRIV qsa_result qsa__kernels_compile(const char *arch, int device_cc, const char *const *opts, int nopts,
                                         char **image, size_t *image_len, char **log, char *arch_out,
                                         size_t arch_cap) {
    char picked[32];
    *image = NULL;
    *image_len = 0;
    if (log) *log = NULL;
    QSA__TRY(qsa__nvrtc_pick_arch(arch, device_cc, picked, sizeof picked));
    if (arch_out) snprintf(arch_out, arch_cap, "%s", picked);
    char *src = qsa__kernels_source();
    if (!src) return qsa__fail(QSA_ERR_OUT_OF_MEMORY, "kernels.cu: out of memory");
    qsa_result r = qsa__nvrtc_compile(src, "kernels.cu", opts, nopts, picked, image, image_len, log);
    qsa__free(src);
    return r;
}

#endif /* QSA_NO_CUDA */
