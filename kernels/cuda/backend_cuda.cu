/* kernels/cuda/backend_cuda.cu - the CUDA backend: opening it on one GPU (stream, cuBLAS
 * handle), its memory ops, the ops' scratch area, and the table of its op functions. Built with
 * the rest of kernels/cuda/ into libshardlm_cuda.so, whose two entry points (cuda_lib_abi,
 * cuda_lib_backend_open) kernels/backend_cuda_loader.c resolves with dlsym.
 * Not here: the ops themselves (one .cu file per op in this folder) or any cuBLAS call
 * (matmul.cu).
 * Tests: tests/test_ops.c --backend cuda (SKIP when no GPU is present). */
#include <stdlib.h>
#include <string.h>

#include "backend_impl.h"
#include "cuda_common.cuh"
#include "cuda_ops.h"

/* The device needs bf16 arithmetic and the build ships sm_80 and sm_90 code (plus PTX that
 * newer devices compile at load time); an older device could not run any kernel. */
#define CUDA_MIN_COMPUTE_MAJOR 8

/* Inside a graph's capture: names what the capture cannot hold (the first such) and returns 1,
 * and the caller does nothing; 0 outside one. */
static int capture_refuses(struct cuda_state *s, const char *what)
{
    if (!s->capturing) return 0;
    if (!s->capture_failed) s->capture_failed = what;
    return 1;
}

static enum status cuda_alloc(struct backend *b, size_t nbytes, void **ptr)
{
    struct cuda_state *s = cuda_state_enter(b);
    *ptr = NULL;
    if (capture_refuses(s, "an alloc")) return status_errorf(STATUS_UNAVAILABLE, "CUDA: no alloc inside a graph's capture");
    /* cudaMalloc returns 256-byte aligned memory, as ops.h promises. A zero-byte request still
     * gets a distinct, freeable pointer, as on the CPU backend. */
    cudaError_t err = cudaMalloc(ptr, nbytes ? nbytes : 256);
    if (err == cudaErrorMemoryAllocation) {
        (void)cudaGetLastError(); /* out of memory is not sticky: clear it for later checks */
        *ptr = NULL;
        size_t free_bytes = 0, total_bytes = 0;
        CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
        return status_errorf(STATUS_RESOURCE_EXHAUSTED,
                             "CUDA device %d: out of memory allocating %zu bytes (%zu of %zu free)",
                             b->device_id, nbytes, free_bytes, total_bytes);
    }
    CUDA_CHECK(err);
    return STATUS_OK;
}

static void cuda_free(struct backend *b, void *ptr)
{
    if (capture_refuses(cuda_state_enter(b), "a free")) return;
    CUDA_CHECK(cudaFree(ptr));
}

/* Page-locked host memory (portable: any device may copy into it). When the driver refuses (a
 * locked-memory limit), STATUS_UNAVAILABLE: backend_host_alloc then takes ordinary memory, which
 * cuda_host_free tells apart. */
static enum status cuda_host_alloc(struct backend *b, size_t nbytes, void **ptr)
{
    cuda_state_enter(b);
    *ptr = NULL;
    if (cudaHostAlloc(ptr, nbytes ? nbytes : 256, cudaHostAllocPortable) == cudaSuccess) return STATUS_OK;
    (void)cudaGetLastError(); /* not sticky: clear it for later checks */
    *ptr = NULL;
    return status_errorf(STATUS_UNAVAILABLE, "CUDA: cannot page-lock %zu bytes of host memory", nbytes);
}

static void cuda_host_free(struct backend *b, void *ptr)
{
    cuda_state_enter(b);
    cudaPointerAttributes attr;
    if (cudaPointerGetAttributes(&attr, ptr) == cudaSuccess && attr.type == cudaMemoryTypeHost) {
        CUDA_CHECK(cudaFreeHost(ptr));
        return;
    }
    (void)cudaGetLastError();
    free(ptr);
}

/* src_host is pageable memory (the engine has no other kind): CUDA copies it to a staging
 * buffer before cudaMemcpyAsync returns, so the caller may reuse it at once while the copy to
 * the device stays ordered on the stream. */
static void cuda_upload(struct backend *b, void *dst_device, const void *src_host, size_t nbytes)
{
    struct cuda_state *s = cuda_state_enter(b);
    if (nbytes == 0 || capture_refuses(s, "an upload")) return;
    CUDA_CHECK(cudaMemcpyAsync(dst_device, src_host, nbytes, cudaMemcpyHostToDevice, s->stream));
}

/* Waits for the stream, so that dst_host holds the data (and every op queued before it has
 * finished) when this returns. */
static void cuda_download(struct backend *b, void *dst_host, const void *src_device, size_t nbytes)
{
    struct cuda_state *s = cuda_state_enter(b);
    if (nbytes == 0 || capture_refuses(s, "a download")) return;
    CUDA_CHECK(cudaMemcpyAsync(dst_host, src_device, nbytes, cudaMemcpyDeviceToHost, s->stream));
    CUDA_CHECK(cudaStreamSynchronize(s->stream));
}

/* The ranges must not overlap (cudaMemcpy's rule; the CPU backend's memmove is more lenient,
 * and ops.h does not say): a partial overlap is a bug, caught here rather than corrupting. */
static void cuda_copy(struct backend *b, void *dst_device, const void *src_device, size_t nbytes)
{
    struct cuda_state *s = cuda_state_enter(b);
    if (nbytes == 0 || dst_device == src_device) return;
    const char *d = (const char *)dst_device, *src = (const char *)src_device;
    CHECK(d + nbytes <= src || src + nbytes <= d, "cuda copy: %zu bytes between overlapping ranges",
          nbytes);
    CUDA_CHECK(cudaMemcpyAsync(dst_device, src_device, nbytes, cudaMemcpyDeviceToDevice,
                               s->stream));
}

static void cuda_memset_zero(struct backend *b, void *dst_device, size_t nbytes)
{
    struct cuda_state *s = cuda_state_enter(b);
    if (nbytes == 0) return;
    CUDA_CHECK(cudaMemsetAsync(dst_device, 0, nbytes, s->stream));
}

static enum status cuda_mem_info(struct backend *b, size_t *free_bytes, size_t *total_bytes)
{
    cuda_state_enter(b);
    cudaError_t err = cudaMemGetInfo(free_bytes, total_bytes);
    if (err != cudaSuccess)
        return status_errorf(STATUS_INTERNAL, "cudaMemGetInfo: %s", cudaGetErrorString(err));
    return STATUS_OK;
}

static void cuda_synchronize(struct backend *b)
{
    struct cuda_state *s = cuda_state_enter(b);
    if (capture_refuses(s, "a synchronize")) return;
    CUDA_CHECK(cudaStreamSynchronize(s->stream));
    /* A fault in a kernel is also reported by the synchronize above; this catches a launch
     * error nobody has read yet. */
    CUDA_CHECK(cudaGetLastError());
}

static void cuda_close(struct backend *b)
{
    struct cuda_state *s = cuda_state_enter(b);
    if (s->capturing) { /* closed inside a capture: end it, keep nothing */
        cudaGraph_t g = NULL;
        if (cudaStreamEndCapture(s->stream, &g) == cudaSuccess && g) (void)cudaGraphDestroy(g);
        (void)cudaGetLastError();
        s->capturing = 0;
    }
    CUDA_CHECK(cudaStreamSynchronize(s->stream));
    cuda_matmul_free(s);
    if (s->scratch) CUDA_CHECK(cudaFree(s->scratch));
    CUDA_CHECK(cudaStreamDestroy(s->stream));
    free(s);
    free(b);
}

void *cuda_scratch(struct backend *b, size_t nbytes)
{
    struct cuda_state *s = cuda_state_enter(b);
    if (nbytes <= s->scratch_bytes && s->scratch) return s->scratch;
    /* A capture records the pointer and runs nothing: it fails, and the ops run again outside it. */
    if (capture_refuses(s, "the op scratch growing")) return s->scratch;
    CUDA_CHECK(cudaStreamSynchronize(s->stream)); /* queued ops may still use the old area */
    if (s->scratch) CUDA_CHECK(cudaFree(s->scratch));
    s->scratch = NULL;
    s->scratch_bytes = 0;
    cudaError_t err = cudaMalloc(&s->scratch, nbytes ? nbytes : 256);
    CHECK(err == cudaSuccess, "CUDA device %d: no %zu bytes of op scratch: %s", s->device_id, nbytes,
          cudaGetErrorString(err));
    s->scratch_bytes = nbytes;
    return s->scratch;
}

/* ---- graphs (ops.h backend_graph_*) ------------------------------------------------------------
 * Stream capture in thread-local mode: this thread's calls that capture cannot hold are refused
 * by the slots above (capture_refuses) rather than made; other threads are not affected. A graph
 * keeps the op scratch it was captured with: once the scratch has moved (grown), launch refuses
 * it and the caller captures again. */
struct cuda_graph {
    cudaGraphExec_t exec;
    void           *scratch;
};

static enum status cuda_graph_begin(struct backend *b)
{
    struct cuda_state *s = cuda_state_enter(b);
    CHECK(!s->capturing, "CUDA graph: begin inside a capture");
    const cudaError_t err = cudaStreamBeginCapture(s->stream, cudaStreamCaptureModeThreadLocal);
    if (err != cudaSuccess) {
        (void)cudaGetLastError();
        return status_errorf(STATUS_UNAVAILABLE, "CUDA device %d: cudaStreamBeginCapture: %s", s->device_id,
                             cudaGetErrorString(err));
    }
    s->capturing = 1;
    s->capture_failed = NULL;
    return STATUS_OK;
}

static enum status cuda_graph_end(struct backend *b, void **graph)
{
    struct cuda_state *s = cuda_state_enter(b);
    CHECK(s->capturing, "CUDA graph: end without a begin");
    *graph = NULL;
    cudaGraph_t g = NULL;
    cudaError_t err = cudaStreamEndCapture(s->stream, &g);
    s->capturing = 0;
    const char *why = s->capture_failed ? s->capture_failed : err != cudaSuccess ? cudaGetErrorString(err) : NULL;
    cudaGraphExec_t exec = NULL;
    if (!why && (err = cudaGraphInstantiate(&exec, g, 0)) != cudaSuccess) why = cudaGetErrorString(err);
    if (g) CUDA_CHECK(cudaGraphDestroy(g));
    if (why) {
        (void)cudaGetLastError(); /* a failed capture is not sticky */
        return status_errorf(STATUS_UNAVAILABLE, "CUDA device %d: graph capture failed: %s", s->device_id, why);
    }
    struct cuda_graph *cg = (struct cuda_graph *)malloc(sizeof *cg);
    if (!cg) {
        CUDA_CHECK(cudaGraphExecDestroy(exec));
        return status_errorf(STATUS_RESOURCE_EXHAUSTED, "CUDA graph: out of host memory");
    }
    cg->exec = exec;
    cg->scratch = s->scratch;
    *graph = cg;
    return STATUS_OK;
}

static enum status cuda_graph_launch(struct backend *b, void *graph)
{
    struct cuda_state *s = cuda_state_enter(b);
    const struct cuda_graph *cg = (const struct cuda_graph *)graph;
    if (cg->scratch != s->scratch)
        return status_errorf(STATUS_UNAVAILABLE, "CUDA graph: the op scratch moved since the capture");
    CUDA_CHECK(cudaGraphLaunch(cg->exec, s->stream));
    return STATUS_OK;
}

static void cuda_graph_free(struct backend *b, void *graph)
{
    cuda_state_enter(b);
    struct cuda_graph *cg = (struct cuda_graph *)graph;
    CUDA_CHECK(cudaGraphExecDestroy(cg->exec));
    free(cg);
}

static const struct backend_ops cuda_backend_ops = {
    .name = "cuda",
    .alloc = cuda_alloc,
    .free = cuda_free,
    .host_alloc = cuda_host_alloc,
    .host_free = cuda_host_free,
    .upload = cuda_upload,
    .download = cuda_download,
    .copy = cuda_copy,
    .memset_zero = cuda_memset_zero,
    .synchronize = cuda_synchronize,
    .close = cuda_close,
    .mem_info = cuda_mem_info,
    .cast = cuda_cast,
    .embedding = cuda_embedding,
    .position_embedding_add = cuda_position_embedding_add,
    .matmul = cuda_matmul,
    .matmul_many = cuda_matmul_many,
    .rmsnorm = cuda_rmsnorm,
    .add_rmsnorm = cuda_add_rmsnorm,
    .layernorm = cuda_layernorm,
    .add = cuda_add,
    .scale = cuda_scale,
    .softcap = cuda_softcap,
    .scatter_add_rows = cuda_scatter_add_weighted,
    .dropout = cuda_dropout,
    .rope = cuda_rope,
    .rope_qk = cuda_rope_qk,
    .kv_write = cuda_kv_write,
    .attention = cuda_attention,
    .activation = cuda_activation,
    .gated_activation = cuda_gated_activation,
    .softmax = cuda_softmax,
    .log_softmax = cuda_log_softmax,
    .argmax = cuda_argmax,
    .topk = cuda_topk,
    .logit_mass = cuda_logit_mass,
    .logit_draw = cuda_logit_draw,
    .logit_edit = cuda_logit_edit,
    .logit_mask = cuda_logit_mask,
    .logit_lse = cuda_logit_lse,
    .attention_train = cuda_attention_train,
    .attention_train_backward = cuda_attention_train_backward,
    .attention_sinks_backward = cuda_attention_sinks_backward,
    .embedding_backward = cuda_embedding_backward,
    .position_embedding_add_backward = cuda_position_embedding_add_backward,
    .matmul_backward = cuda_matmul_backward,
    .rmsnorm_backward = cuda_rmsnorm_backward,
    .layernorm_backward = cuda_layernorm_backward,
    .rope_backward = cuda_rope_backward,
    .activation_backward = cuda_activation_backward,
    .gated_activation_backward = cuda_gated_activation_backward,
    .cross_entropy_stats = cuda_cross_entropy_stats,
    .cross_entropy_combine = cuda_cross_entropy_combine,
    .cross_entropy_backward = cuda_cross_entropy_backward,
    .adamw = cuda_adamw,
    .sum_squares = cuda_sum_squares,
    .scatter_add_rows_backward = cuda_scatter_add_weighted_backward,
    .graph_begin = cuda_graph_begin,
    .graph_end = cuda_graph_end,
    .graph_launch = cuda_graph_launch,
    .graph_free = cuda_graph_free,
};

/* SHARDLM_CUDA_ATTENTION (see enum cuda_attention_mode); an unknown value is refused rather
 * than ignored, so that a benchmark never measures another kernel than it names. */
static enum status cuda_attention_mode_from_env(enum cuda_attention_mode *mode)
{
    const char *v = getenv("SHARDLM_CUDA_ATTENTION");
    *mode = CUDA_ATTENTION_AUTO;
    if (!v || !*v || !strcmp(v, "auto")) return STATUS_OK;
    if (!strcmp(v, "simple")) *mode = CUDA_ATTENTION_SIMPLE;
    else if (!strcmp(v, "split")) *mode = CUDA_ATTENTION_SPLIT;
    else if (!strcmp(v, "tc")) *mode = CUDA_ATTENTION_TC;
    else
        return status_errorf(STATUS_INVALID_ARGUMENT,
                             "SHARDLM_CUDA_ATTENTION=%s: expected auto, simple, split or tc", v);
    return STATUS_OK;
}

/* SHARDLM_CUDA_TRAIN_ATTENTION: auto (or unset), tc or simple (cuda_common.cuh). */
static enum status cuda_train_attention_from_env(int *tc)
{
    const char *v = getenv("SHARDLM_CUDA_TRAIN_ATTENTION");
    *tc = CUDA_TRAIN_ATTENTION_TC_DEFAULT;
    if (!v || !*v || !strcmp(v, "auto")) return STATUS_OK;
    if (!strcmp(v, "tc")) *tc = 2; /* forced: head_dim 96 too (attention_train_tc.cu) */
    else if (!strcmp(v, "simple")) *tc = 0;
    else return status_errorf(STATUS_INVALID_ARGUMENT, "SHARDLM_CUDA_TRAIN_ATTENTION=%s: expected auto, tc or simple", v);
    return STATUS_OK;
}

/* An integer in [min, max] from the environment variable `name`, or `fallback` when it is
 * unset; anything else is refused. */
static enum status cuda_int_from_env(const char *name, int fallback, int min, int max, int *out)
{
    const char *v = getenv(name);
    *out = fallback;
    if (!v || !*v) return STATUS_OK;
    char *end = NULL;
    long x = strtol(v, &end, 10);
    if (*end || x < min || x > max)
        return status_errorf(STATUS_INVALID_ARGUMENT, "%s=%s: expected an integer in [%d, %d]", name, v, min, max);
    *out = (int)x;
    return STATUS_OK;
}

/* No GPU, a driver too old for this runtime, a device out of range or too old, a device in
 * exclusive use by another process: all are STATUS_UNAVAILABLE with a message, never an
 * abort, so that a caller can fall back to the CPU or report it. */
extern "C" enum status cuda_lib_backend_open(int device_id, struct backend **out)
{
    *out = NULL;
    enum status st = STATUS_OK;
    struct backend *b = NULL;
    struct cuda_state *s = NULL;
    int stream_created = 0;

    int n_devices = 0;
    cudaError_t err = cudaGetDeviceCount(&n_devices);
    if (err != cudaSuccess) {
        (void)cudaGetLastError();
        return status_errorf(STATUS_UNAVAILABLE, "no usable CUDA device: %s (%s)",
                             cudaGetErrorString(err), cudaGetErrorName(err));
    }
    if (n_devices == 0) return status_errorf(STATUS_UNAVAILABLE, "no CUDA device is present");
    if (device_id < 0 || device_id >= n_devices)
        return status_errorf(STATUS_UNAVAILABLE,
                             "CUDA device %d does not exist (this machine has %d: 0..%d)",
                             device_id, n_devices, n_devices - 1);

    struct cudaDeviceProp prop;
    err = cudaGetDeviceProperties(&prop, device_id);
    if (err == cudaSuccess) err = cudaSetDevice(device_id);
    /* The first call that needs a context creates it: this is where a device held in
     * exclusive mode by another process, or a driver problem, shows up. */
    if (err == cudaSuccess) err = cudaFree(NULL);
    if (err != cudaSuccess) {
        (void)cudaGetLastError();
        return status_errorf(STATUS_UNAVAILABLE, "CUDA device %d cannot be used: %s (%s)",
                             device_id, cudaGetErrorString(err), cudaGetErrorName(err));
    }
    if (prop.major < CUDA_MIN_COMPUTE_MAJOR)
        return status_errorf(STATUS_UNAVAILABLE,
                             "CUDA device %d (%s) has compute capability %d.%d; shardlm needs "
                             "%d.0 or newer",
                             device_id, prop.name, prop.major, prop.minor,
                             CUDA_MIN_COMPUTE_MAJOR);

    b = (struct backend *)calloc(1, sizeof *b);
    s = (struct cuda_state *)calloc(1, sizeof *s);
    if (!b || !s) {
        st = status_errorf(STATUS_RESOURCE_EXHAUSTED, "out of host memory opening CUDA backend");
        goto fail;
    }
    s->device_id = device_id;
    s->n_sms = prop.multiProcessorCount > 0 ? prop.multiProcessorCount : 1;
    st = cuda_attention_mode_from_env(&s->attention_mode);
    if (st == STATUS_OK) st = cuda_int_from_env("SHARDLM_CUDA_SPLIT_WAVES", CUDA_SPLIT_WAVES_DEFAULT, 1, 64, &s->split_waves);
    if (st == STATUS_OK)
        st = cuda_int_from_env("SHARDLM_CUDA_SPLIT_MIN_CHUNK", CUDA_SPLIT_MIN_CHUNK_DEFAULT, 1, 1 << 16, &s->split_min_chunk);
    if (st == STATUS_OK)
        st = cuda_int_from_env("SHARDLM_CUDA_GEMV_ROWS", CUDA_GEMV_ROWS_DEFAULT, 0, CUDA_GEMV_MAX_ROWS, &s->gemv_rows);
    if (st == STATUS_OK)
        st = cuda_int_from_env("SHARDLM_CUDA_GEMV_SPLIT", CUDA_GEMV_SPLIT_DEFAULT, 0, 8, &s->gemv_split);
    if (st == STATUS_OK) st = cuda_train_attention_from_env(&s->train_attention_tc);
    if (st == STATUS_OK && s->gemv_split & (s->gemv_split - 1))
        st = status_errorf(STATUS_INVALID_ARGUMENT, "SHARDLM_CUDA_GEMV_SPLIT must be 0, 1, 2, 4 or 8, got %d", s->gemv_split);
    if (st != STATUS_OK) goto fail;
    err = cudaStreamCreateWithFlags(&s->stream, cudaStreamNonBlocking);
    if (err != cudaSuccess) {
        (void)cudaGetLastError();
        st = status_errorf(STATUS_UNAVAILABLE, "CUDA device %d: cannot create a stream: %s",
                           device_id, cudaGetErrorString(err));
        goto fail;
    }
    stream_created = 1;
    st = cuda_matmul_init(s);
    if (st != STATUS_OK) goto fail;

    b->ops = &cuda_backend_ops;
    b->device = DEVICE_CUDA;
    b->device_id = device_id;
    b->n_threads = 0;
    b->stream = s->stream;
    b->impl = s;
    *out = b;
    return STATUS_OK;

fail:
    if (s) {
        cuda_matmul_free(s);
        if (stream_created) (void)cudaStreamDestroy(s->stream);
    }
    free(s);
    free(b);
    return st;
}

extern "C" unsigned long cuda_lib_abi(void) { return CUDA_LIB_ABI; }
