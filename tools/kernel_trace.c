/* kernel_trace.c - a CUPTI injection library that records every kernel the process runs (also the
 * nodes of CUDA graphs, which the runtime's decode steps are) with its GPU start and end times, so
 * that a step's real timeline can be read: which launch ends when, and how much each adds to the
 * step's critical path (tools/kernel_trace.py).  No change to the program: the driver loads it.
 *
 *   make tools/libkernel_trace.so        # where CUPTI is installed (the CUDA toolkit's libcupti)
 *   CUDA_INJECTION64_PATH=$PWD/tools/libkernel_trace.so QSA_TRACE_OUT=/tmp/trace.csv \
 *       ./tools/bench --no-ceilings --no-long --batches 1 --prefill 16 --prefill-reps 1 --steps 5
 *   python3 tools/kernel_trace.py /tmp/trace.csv
 *
 * Output: CSV, one line per kernel: start_ns,end_ns,stream,graph,graph_node,grid_x,grid_y,grid_z,block_x,name
 * (only kernels whose name starts with $QSA_TRACE_PREFIX, default "qsa_k_").  The activity buffers
 * are written as CUPTI hands them back and at exit. */
#include <cupti.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static FILE *kt_out;
static const char *kt_prefix = "qsa_k_";

static void CUPTIAPI kt_buffer_requested(uint8_t **buf, size_t *size, size_t *max_records) {
    *size = (size_t)16 << 20;
    *buf = (uint8_t *)aligned_alloc(8, *size);
    *max_records = 0;
}

static void CUPTIAPI kt_buffer_completed(CUcontext ctx, uint32_t stream, uint8_t *buf, size_t size, size_t valid) {
    CUpti_Activity *r = NULL;
    (void)ctx, (void)stream, (void)size;
    while (cuptiActivityGetNextRecord(buf, valid, &r) == CUPTI_SUCCESS) {
        if (r->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL && r->kind != CUPTI_ACTIVITY_KIND_KERNEL) continue;
        const CUpti_ActivityKernel10 *k = (const CUpti_ActivityKernel10 *)r;
        if (!k->name || strncmp(k->name, kt_prefix, strlen(kt_prefix))) continue;
        fprintf(kt_out, "%llu,%llu,%u,%u,%llu,%d,%d,%d,%d,%s\n", (unsigned long long)k->start, (unsigned long long)k->end,
                k->streamId, k->graphId, (unsigned long long)k->graphNodeId, k->gridX, k->gridY, k->gridZ, k->blockX,
                k->name);
    }
    size_t dropped = 0;
    if (cuptiActivityGetNumDroppedRecords(ctx, stream, &dropped) == CUPTI_SUCCESS && dropped)
        fprintf(stderr, "kernel_trace: %zu records dropped\n", dropped);
    free(buf);
}

static void kt_finish(void) {
    cuptiActivityFlushAll(1);
    if (kt_out) fclose(kt_out);
    kt_out = NULL;
}

/* Called by the driver at cuInit when CUDA_INJECTION64_PATH names this library. */
int InitializeInjection(void) {
    const char *path = getenv("QSA_TRACE_OUT"), *pre = getenv("QSA_TRACE_PREFIX");
    if (pre) kt_prefix = pre;
    kt_out = fopen(path ? path : "kernel_trace.csv", "w");
    if (!kt_out) {
        perror("kernel_trace: QSA_TRACE_OUT");
        return 0;
    }
    fprintf(kt_out, "start_ns,end_ns,stream,graph,graph_node,grid_x,grid_y,grid_z,block_x,name\n");
    if (cuptiActivityRegisterCallbacks(kt_buffer_requested, kt_buffer_completed) != CUPTI_SUCCESS ||
        cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) != CUPTI_SUCCESS) {
        fprintf(stderr, "kernel_trace: CUPTI activity tracing could not be enabled\n");
        return 0;
    }
    atexit(kt_finish);
    return 1;
}
