/* kernels/cuda_emu/emu.cc - the CUDA emulator's host side: the fibers that run a block's threads,
 * the parts of the CUDA runtime and cuBLAS that kernels/cuda/ calls, and stream capture into
 * graphs, all on the CPU (kernels/cuda_emu/README.md). With emu.h and the rewritten kernels it
 * makes libshardlm_cuda_emu.so, a stand-in for libshardlm_cuda.so (SHARDLM_CUDA_LIB) that runs
 * the CUDA backend's own code where no GPU is.
 * Checks a GPU would make (or that a GPU would fail on later): a launch's configuration and
 * dynamic shared memory against the function's attribute; a copy or memset outside device
 * allocations; a kernel that reads or writes past the end of an allocation (each one ends at a
 * page that faults); a barrier that can never open (threads of a block waiting at different
 * barriers, or a collective whose lanes exited); what a capture cannot hold (a synchronous copy,
 * a synchronize, a copy from pageable memory), which invalidates it as CUDA does. Device memory
 * and dynamic shared memory start as 0xff bytes (NaN in every float dtype).
 * Blocks run one at a time, in order, their threads in turns between barriers (forward in even
 * blocks, backward in odd ones, so that a read missing its barrier sees the other order too). */
#define EMU_HOST_SIDE
#include "emu.h"

#include <pthread.h>
#include <sys/mman.h>
#include <unistd.h>

#include <map>
#include <mutex>
#include <vector>

/* ---- fibers ---------------------------------------------------------------------------------- */

/* emu_switch(save, to): saves the callee-saved registers on this stack and its stack pointer in
 * *save, then continues the fiber whose stack pointer is to (x86-64 System V). */
extern "C" void emu_switch(void **save, void *to);
asm(R"(
    .text
    .globl emu_switch
    .hidden emu_switch
    .type emu_switch, @function
emu_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size emu_switch, .-emu_switch
)");

namespace emu {

thread_pos *current;
uint3 block_idx;
dim3 block_dim, grid_dim;

namespace {

const size_t STACK_BYTES = 256 << 10;
const int    MAX_THREADS = 1024;
const uint64_t POISON = 0xffffffffffffffffull;

struct fiber {
    thread_pos pos;
    void      *sp;
    char      *stack; /* STACK_BYTES above a guard page */
    int        done;
    int        wait; /* 0 running, 1 at __syncthreads, 2 at a warp collective */
    unsigned   gen;  /* the barrier's generation it waits to see pass */
};

struct warp_state {
    unsigned live;    /* lanes still running */
    unsigned arrived; /* lanes at the collective now */
    unsigned want;    /* the lanes the arrived ones named */
    unsigned gen;
    uint64_t slots[2][32];
};

std::recursive_mutex big_lock; /* one grid at a time: __shared__ variables are static */
fiber fibers[MAX_THREADS];
warp_state warps[MAX_THREADS / 32];
void *sched_sp;
fiber *running;
const std::function<void()> *body_now;
int live, bar_arrived;
unsigned bar_gen;
std::vector<unsigned char> dyn_shared;
thread_local cudaError_t last_error = cudaSuccess;

void fail(const char *fmt, const char *what)
{
    fprintf(stderr, "CUDA emulator: ");
    fprintf(stderr, fmt, what);
    fprintf(stderr, "\n");
    abort();
}

void yield_to_scheduler() { emu_switch(&running->sp, sched_sp); }

int try_release_warp(warp_state &w)
{
    if (!w.arrived || (w.want & w.live & ~w.arrived)) return 0;
    for (int i = 0; i < 32; i++)
        if (!(w.arrived >> i & 1u)) w.slots[w.gen & 1][i] = POISON; /* a lane that took no part */
    w.arrived = w.want = 0;
    w.gen++;
    return 1;
}

void try_release_block()
{
    if (bar_arrived > 0 && bar_arrived == live) {
        bar_arrived = 0;
        bar_gen++;
    }
}

void fiber_main()
{
    (*body_now)();
    fiber *f = running;
    f->done = 1;
    live--;
    warp_state &w = warps[f->pos.warp];
    w.live &= ~(1u << f->pos.lane);
    try_release_warp(w);
    try_release_block();
    emu_switch(&f->sp, sched_sp);
    abort(); /* never resumed */
}

char *new_stack()
{
    const size_t page = (size_t)sysconf(_SC_PAGESIZE);
    void *p = mmap(NULL, STACK_BYTES + page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) fail("%s", "out of memory for a thread's stack");
    mprotect(p, page, PROT_NONE); /* a thread that overflows its stack faults */
    return (char *)p + page;
}

void start_fiber(fiber *f)
{
    if (!f->stack) f->stack = new_stack();
    uintptr_t *sp = (uintptr_t *)(f->stack + STACK_BYTES);
    *--sp = 0;                        /* fiber_main's return address: never used, keeps rsp 16-aligned + 8 */
    *--sp = (uintptr_t)&fiber_main;   /* emu_switch's ret goes here */
    for (int i = 0; i < 6; i++) *--sp = 0; /* rbp rbx r12 r13 r14 r15 */
    f->sp = sp;
    f->done = f->wait = 0;
}

void run_block(int n, int reverse)
{
    live = n;
    bar_arrived = 0;
    for (int w = 0; w < (n + 31) / 32; w++) {
        warp_state &ws = warps[w];
        const int lanes = n - 32 * w < 32 ? n - 32 * w : 32;
        ws.live = lanes == 32 ? 0xffffffffu : (1u << lanes) - 1u;
        ws.arrived = ws.want = 0;
    }
    for (int i = 0; i < n; i++) {
        fiber *f = &fibers[i];
        f->pos.linear = i;
        f->pos.lane = i & 31;
        f->pos.warp = i >> 5;
        f->pos.tid = make_uint3((unsigned)i % block_dim.x, (unsigned)i / block_dim.x % block_dim.y,
                                (unsigned)i / (block_dim.x * block_dim.y));
        start_fiber(f);
    }
    while (live > 0) {
        int progress = 0;
        for (int k = 0; k < n; k++) {
            fiber *f = &fibers[reverse ? n - 1 - k : k];
            if (f->done) continue;
            if (f->wait == 1 && bar_gen == f->gen) continue;
            if (f->wait == 2 && warps[f->pos.warp].gen == f->gen) continue;
            running = f;
            current = &f->pos;
            emu_switch(&sched_sp, f->sp);
            progress = 1;
        }
        if (!progress) {
            fprintf(stderr, "CUDA emulator: block (%u, %u, %u) of %d threads can go no further:", block_idx.x,
                    block_idx.y, block_idx.z, n);
            for (int i = 0, shown = 0; i < n && shown < 8; i++)
                if (!fibers[i].done)
                    fprintf(stderr, " thread %d at %s;", i, fibers[i].wait == 1 ? "__syncthreads" : "a warp collective"),
                        shown++;
            fail("%s", "\na barrier that not every live thread reaches (divergent __syncthreads, or a warp "
                       "collective whose lanes diverged)");
        }
    }
    running = NULL;
    current = NULL;
}

std::map<const void *, int> max_dynamic_shared; /* cudaFuncAttributeMaxDynamicSharedMemorySize */

void run_grid(const launch_cfg &c, const std::function<void()> &body)
{
    std::lock_guard<std::recursive_mutex> hold(big_lock);
    const int n = (int)(c.block.x * c.block.y * c.block.z);
    static unsigned long blocks_run;
    grid_dim = c.grid;
    block_dim = c.block;
    body_now = &body;
    if (dyn_shared.size() < c.shared + 16) dyn_shared.resize(c.shared + 16);
    for (unsigned z = 0; z < c.grid.z; z++)
        for (unsigned y = 0; y < c.grid.y; y++)
            for (unsigned x = 0; x < c.grid.x; x++) {
                block_idx = make_uint3(x, y, z);
                memset(dyn_shared.data(), 0xff, c.shared);
                run_block(n, (int)(blocks_run++ & 1));
            }
    body_now = NULL;
}

} /* namespace */

void *dynamic_shared() { return dyn_shared.data(); }

void syncthreads()
{
    fiber *f = running;
    const unsigned g = bar_gen;
    bar_arrived++;
    try_release_block();
    if (bar_gen != g) return;
    f->wait = 1;
    f->gen = g;
    while (bar_gen == g) yield_to_scheduler();
    f->wait = 0;
}

void warp_exchange(unsigned mask, uint64_t value, uint64_t *out)
{
    fiber *f = running;
    warp_state &w = warps[f->pos.warp];
    const int lane = f->pos.lane;
    if (!(mask >> lane & 1u)) fail("%s", "a warp collective called by a lane outside its mask");
    const unsigned g = w.gen;
    w.slots[g & 1][lane] = value;
    w.arrived |= 1u << lane;
    w.want |= mask;
    if (!try_release_warp(w)) {
        f->wait = 2;
        f->gen = g;
        while (w.gen == g) yield_to_scheduler();
        f->wait = 0;
    }
    memcpy(out, w.slots[g & 1], sizeof w.slots[0]);
}

void warp_share(unsigned mask, const void *mine, size_t bytes, void *all)
{
    static unsigned char stage[MAX_THREADS / 32][2][32][64];
    if (bytes > 64) fail("%s", "warp_share: more than 64 bytes a lane");
    fiber *f = running;
    const unsigned g = warps[f->pos.warp].gen;
    memcpy(stage[f->pos.warp][g & 1][f->pos.lane], mine, bytes);
    uint64_t ignored[32];
    warp_exchange(mask, 0, ignored); /* (generation g: every lane has written its share) */
    for (int l = 0; l < 32; l++) memcpy((char *)all + l * bytes, stage[f->pos.warp][g & 1][l], bytes);
}

void trap()
{
    fprintf(stderr, "CUDA emulator: __trap() in block (%u, %u, %u), thread (%u, %u, %u)\n", block_idx.x, block_idx.y,
            block_idx.z, current ? current->tid.x : 0, current ? current->tid.y : 0, current ? current->tid.z : 0);
    abort();
}

} /* namespace emu */

/* ---- device memory ----------------------------------------------------------------------------- */

namespace {

struct allocation {
    char  *map;
    size_t map_len, size;
};

std::mutex mem_lock;
std::map<uintptr_t, allocation> device_allocs; /* by start */
std::map<uintptr_t, size_t> pinned;            /* cudaHostAlloc'd, by start */
size_t device_used;

size_t emulated_total()
{
    const char *e = getenv("SHARDLM_CUDA_EMU_MEMORY_MB");
    const size_t mb = e && *e ? strtoull(e, NULL, 10) : 8192;
    return mb << 20;
}

} /* namespace */

/* Whether [p, p + n) lies inside one device allocation. */
int emu::in_device(const void *p, size_t n)
{
    std::lock_guard<std::mutex> hold(mem_lock);
    auto it = device_allocs.upper_bound((uintptr_t)p);
    if (it == device_allocs.begin()) return 0;
    --it;
    return (uintptr_t)p + n <= it->first + it->second.size;
}

namespace {

int is_pinned(const void *p, size_t n)
{
    std::lock_guard<std::mutex> hold(mem_lock);
    auto it = pinned.upper_bound((uintptr_t)p);
    if (it == pinned.begin()) return 0;
    --it;
    return (uintptr_t)p + n <= it->first + it->second;
}

cudaError_t set_error(cudaError_t e)
{
    if (e != cudaSuccess) emu::last_error = e;
    return e;
}

} /* namespace */

/* ---- streams and graphs ---------------------------------------------------------------------- */

struct CUgraph_st {
    std::vector<std::function<void()>> nodes;
};
struct CUgraphExec_st {
    std::vector<std::function<void()>> nodes;
};
struct CUstream_st {
    int         capturing, invalidated;
    CUgraph_st *graph;
};

namespace {
int captures_open; /* streams capturing now (the legacy stream may not be used then) */
} /* namespace */

/* Runs op now, or records it where the stream is capturing. */
cudaError_t emu::on_stream(cudaStream_t st, std::function<void()> op)
{
    if (st && st->capturing) {
        st->graph->nodes.push_back(std::move(op));
        return cudaSuccess;
    }
    if (!st && captures_open) return set_error(cudaErrorStreamCaptureImplicit);
    op();
    return cudaSuccess;
}

using emu::in_device;
using emu::on_stream;

namespace {

/* The error of what a capture cannot hold (the caller has invalidated the capture). */
cudaError_t refuse_in_capture() { return set_error(cudaErrorStreamCaptureUnsupported); }

std::vector<CUstream_st *> streams;
std::mutex stream_lock;

/* A call a capture cannot hold (thread-local mode: a potentially unsafe one): while any stream
 * captures, every open capture is invalidated and the call refused; else cudaSuccess. */
cudaError_t refuse_if_capturing()
{
    std::lock_guard<std::mutex> hold(stream_lock);
    int any = 0;
    for (CUstream_st *s : streams)
        if (s->capturing) s->invalidated = 1, any = 1;
    return any ? refuse_in_capture() : cudaSuccess;
}
} /* namespace */

void emu::submit(const launch_cfg &c, const void *kernel, std::function<void()> body)
{
    const unsigned long threads = (unsigned long)c.block.x * c.block.y * c.block.z;
    if (!threads || threads > 1024 || c.block.z > 64 || !c.grid.x || !c.grid.y || !c.grid.z || c.grid.x > 0x7fffffffu ||
        c.grid.y > 65535 || c.grid.z > 65535) {
        set_error(cudaErrorInvalidConfiguration);
        return;
    }
    if (c.shared > 48 * 1024) {
        std::lock_guard<std::recursive_mutex> hold(big_lock);
        auto it = max_dynamic_shared.find(kernel);
        if (c.shared > 232448 || it == max_dynamic_shared.end() || (size_t)it->second < c.shared) {
            set_error(cudaErrorInvalidValue); /* over 48 KiB needs the attribute raised first */
            return;
        }
    }
    on_stream(c.stream, [c, body]() { run_grid(c, body); });
}

extern "C" {

cudaError_t cudaGetLastError(void)
{
    const cudaError_t e = emu::last_error;
    emu::last_error = cudaSuccess;
    return e;
}
cudaError_t cudaPeekAtLastError(void) { return emu::last_error; }

const char *cudaGetErrorName(cudaError_t e)
{
    switch (e) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
    case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
    case cudaErrorNoDevice: return "cudaErrorNoDevice";
    case cudaErrorStreamCaptureUnsupported: return "cudaErrorStreamCaptureUnsupported";
    case cudaErrorStreamCaptureInvalidated: return "cudaErrorStreamCaptureInvalidated";
    case cudaErrorStreamCaptureImplicit: return "cudaErrorStreamCaptureImplicit";
    case cudaErrorIllegalState: return "cudaErrorIllegalState";
    case cudaErrorInvalidResourceHandle: return "cudaErrorInvalidResourceHandle";
    default: return "cudaError (emulator: unnamed)";
    }
}
const char *cudaGetErrorString(cudaError_t e)
{
    switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorStreamCaptureUnsupported: return "operation not permitted when stream is capturing";
    case cudaErrorStreamCaptureInvalidated: return "operation failed due to a previous error during capture";
    case cudaErrorStreamCaptureImplicit: return "operation would make the legacy stream depend on a capturing blocking stream";
    default: return cudaGetErrorName(e);
    }
}

cudaError_t cudaGetDeviceCount(int *n)
{
    const char *e = getenv("SHARDLM_CUDA_EMU_DEVICES");
    *n = e && *e ? atoi(e) : 1;
    return cudaSuccess;
}

static thread_local int device_now;

cudaError_t cudaSetDevice(int d)
{
    int n;
    cudaGetDeviceCount(&n);
    if (d < 0 || d >= n) return set_error(cudaErrorInvalidDevice);
    device_now = d;
    return cudaSuccess;
}
cudaError_t cudaGetDevice(int *d)
{
    *d = device_now;
    return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *p, int d)
{
    int n;
    cudaGetDeviceCount(&n);
    if (d < 0 || d >= n) return set_error(cudaErrorInvalidDevice);
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "shardlm CUDA emulator (sm_90 on the CPU)");
    p->major = 9;
    p->minor = 0;
    p->multiProcessorCount = 132;
    p->totalGlobalMem = emulated_total();
    p->sharedMemPerBlock = 48 * 1024;
    p->sharedMemPerBlockOptin = 232448;
    p->sharedMemPerMultiprocessor = 233472;
    p->warpSize = 32;
    p->maxThreadsPerBlock = 1024;
    p->maxThreadsDim[0] = p->maxThreadsDim[1] = 1024;
    p->maxThreadsDim[2] = 64;
    p->maxGridSize[0] = 0x7fffffff;
    p->maxGridSize[1] = p->maxGridSize[2] = 65535;
    p->l2CacheSize = 50 << 20;
    p->unifiedAddressing = 1;
    return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize(void)
{
    if (refuse_if_capturing() != cudaSuccess) return cudaErrorStreamCaptureUnsupported;
    return cudaSuccess;
}

cudaError_t cudaMalloc(void **ptr, size_t size)
{
    *ptr = NULL;
    if (refuse_if_capturing() != cudaSuccess) return cudaErrorStreamCaptureUnsupported;
    const size_t page = (size_t)sysconf(_SC_PAGESIZE), body = (size ? size + 255 : 256) & ~(size_t)255;
    const size_t len = (body + page - 1) / page * page + page;
    {
        std::lock_guard<std::mutex> hold(mem_lock);
        if (device_used + body > emulated_total()) return set_error(cudaErrorMemoryAllocation);
    }
    char *map = (char *)mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (map == (char *)MAP_FAILED) return set_error(cudaErrorMemoryAllocation);
    mprotect(map + len - page, page, PROT_NONE); /* a read or write past the end faults */
    char *p = map + len - page - body;
    memset(p, 0xff, body);
    std::lock_guard<std::mutex> hold(mem_lock);
    device_allocs[(uintptr_t)p] = allocation{map, len, size ? size : 1};
    device_used += body;
    *ptr = p;
    return cudaSuccess;
}

cudaError_t cudaFree(void *ptr)
{
    if (!ptr) return cudaSuccess;
    if (refuse_if_capturing() != cudaSuccess) return cudaErrorStreamCaptureUnsupported;
    std::lock_guard<std::mutex> hold(mem_lock);
    auto it = device_allocs.find((uintptr_t)ptr);
    if (it == device_allocs.end()) return set_error(cudaErrorInvalidValue);
    device_used -= (it->second.size + 255) & ~(size_t)255;
    munmap(it->second.map, it->second.map_len); /* a use after free faults */
    device_allocs.erase(it);
    return cudaSuccess;
}

cudaError_t cudaMallocAsync(void **ptr, size_t size, cudaStream_t st)
{
    (void)st;
    return cudaMalloc(ptr, size);
}

cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total)
{
    std::lock_guard<std::mutex> hold(mem_lock);
    *total = emulated_total();
    *free_bytes = *total - device_used;
    return cudaSuccess;
}

cudaError_t cudaHostAlloc(void **ptr, size_t size, unsigned int flags)
{
    (void)flags;
    *ptr = aligned_alloc(4096, (size + 4095) & ~(size_t)4095);
    if (!*ptr) return set_error(cudaErrorMemoryAllocation);
    std::lock_guard<std::mutex> hold(mem_lock);
    pinned[(uintptr_t)*ptr] = size;
    return cudaSuccess;
}

cudaError_t cudaFreeHost(void *ptr)
{
    std::lock_guard<std::mutex> hold(mem_lock);
    auto it = pinned.find((uintptr_t)ptr);
    if (it == pinned.end()) return set_error(cudaErrorInvalidValue);
    pinned.erase(it);
    free(ptr);
    return cudaSuccess;
}

cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes *a, const void *ptr)
{
    memset(a, 0, sizeof *a);
    a->type = is_pinned(ptr, 1) ? cudaMemoryTypeHost : in_device(ptr, 1) ? cudaMemoryTypeDevice : cudaMemoryTypeUnregistered;
    a->devicePointer = a->type == cudaMemoryTypeDevice ? (void *)ptr : NULL;
    a->hostPointer = a->type == cudaMemoryTypeHost ? (void *)ptr : NULL;
    return cudaSuccess;
}

/* A copy's ends must be where its kind says (device ends inside one allocation). */
static cudaError_t check_copy(void *dst, const void *src, size_t n, cudaMemcpyKind kind)
{
    const int dst_dev = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice;
    const int src_dev = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;
    if (kind == cudaMemcpyDefault || kind == cudaMemcpyHostToHost) return cudaSuccess;
    if (n && ((dst_dev && !in_device(dst, n)) || (src_dev && !in_device(src, n)))) {
        fprintf(stderr, "CUDA emulator: a copy of %zu bytes (kind %d) reaches outside device memory (dst %p, src %p)\n", n,
                (int)kind, dst, src);
        return set_error(cudaErrorInvalidValue);
    }
    return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, cudaMemcpyKind kind, cudaStream_t st)
{
    const cudaError_t e = check_copy(dst, src, n, kind);
    if (e != cudaSuccess) return e;
    if (st && st->capturing) {
        const void *host = kind == cudaMemcpyHostToDevice ? src : kind == cudaMemcpyDeviceToHost ? dst : NULL;
        if (host && !is_pinned(host, n)) { /* pageable memory cannot be a graph's node */
            st->invalidated = 1;
            return refuse_in_capture();
        }
    }
    return on_stream(st, [dst, src, n]() { memmove(dst, src, n); });
}

cudaError_t cudaMemcpy(void *dst, const void *src, size_t n, cudaMemcpyKind kind)
{
    if (refuse_if_capturing() != cudaSuccess) return cudaErrorStreamCaptureUnsupported;
    const cudaError_t e = check_copy(dst, src, n, kind);
    if (e == cudaSuccess) memmove(dst, src, n);
    return e;
}

cudaError_t cudaMemcpy2DAsync(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width, size_t height,
                              cudaMemcpyKind kind, cudaStream_t st)
{
    if (width > dpitch || width > spitch) return set_error(cudaErrorInvalidValue);
    if (!width || !height) return cudaSuccess;
    const int dst_dev = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice;
    const int src_dev = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;
    if ((dst_dev && !in_device(dst, dpitch * (height - 1) + width)) || (src_dev && !in_device(src, spitch * (height - 1) + width))) {
        fprintf(stderr, "CUDA emulator: a 2D copy of %zu rows of %zu bytes reaches outside device memory\n", height, width);
        return set_error(cudaErrorInvalidValue);
    }
    if (st && st->capturing && kind != cudaMemcpyDeviceToDevice) {
        st->invalidated = 1;
        return refuse_in_capture();
    }
    return on_stream(st, [=]() {
        for (size_t r = 0; r < height; r++) memmove((char *)dst + r * dpitch, (const char *)src + r * spitch, width);
    });
}

cudaError_t cudaStreamQuery(cudaStream_t st)
{
    (void)st;
    return cudaSuccess; /* its work ran when it was queued */
}

cudaError_t cudaMemsetAsync(void *dst, int value, size_t n, cudaStream_t st)
{
    if (n && !in_device(dst, n)) {
        fprintf(stderr, "CUDA emulator: a memset of %zu bytes reaches outside device memory (%p)\n", n, dst);
        return set_error(cudaErrorInvalidValue);
    }
    return on_stream(st, [dst, value, n]() { memset(dst, value, n); });
}

cudaError_t cudaMemset2DAsync(void *dst, size_t pitch, int value, size_t width, size_t height, cudaStream_t st)
{
    if (width > pitch && height > 1) return set_error(cudaErrorInvalidValue);
    if (width && height && !in_device(dst, pitch * (height - 1) + width)) {
        fprintf(stderr, "CUDA emulator: a 2D memset of %zu rows of %zu bytes (pitch %zu) reaches outside device memory (%p)\n",
                height, width, pitch, dst);
        return set_error(cudaErrorInvalidValue);
    }
    return on_stream(st, [dst, pitch, value, width, height]() {
        for (size_t r = 0; r < height; r++) memset((char *)dst + r * pitch, value, width);
    });
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *st, unsigned int flags)
{
    (void)flags;
    *st = new CUstream_st();
    std::lock_guard<std::mutex> hold(stream_lock);
    streams.push_back(*st);
    return cudaSuccess;
}
cudaError_t cudaStreamCreate(cudaStream_t *st) { return cudaStreamCreateWithFlags(st, 0); }

cudaError_t cudaStreamDestroy(cudaStream_t st)
{
    std::lock_guard<std::mutex> hold(stream_lock);
    for (size_t i = 0; i < streams.size(); i++)
        if (streams[i] == st) {
            streams.erase(streams.begin() + (long)i);
            if (st->capturing) captures_open--;
            delete st->graph;
            delete st;
            return cudaSuccess;
        }
    return set_error(cudaErrorInvalidResourceHandle);
}

cudaError_t cudaStreamSynchronize(cudaStream_t st)
{
    if (st && st->capturing) {
        st->invalidated = 1;
        return refuse_in_capture();
    }
    return cudaSuccess;
}

cudaError_t cudaStreamBeginCapture(cudaStream_t st, enum cudaStreamCaptureMode mode)
{
    (void)mode;
    if (!st || st->capturing) return set_error(cudaErrorIllegalState);
    st->capturing = 1;
    st->invalidated = 0;
    st->graph = new CUgraph_st();
    captures_open++;
    return cudaSuccess;
}

cudaError_t cudaStreamEndCapture(cudaStream_t st, cudaGraph_t *graph)
{
    *graph = NULL;
    if (!st || !st->capturing) return set_error(cudaErrorIllegalState);
    st->capturing = 0;
    captures_open--;
    CUgraph_st *g = st->graph;
    st->graph = NULL;
    if (st->invalidated) {
        delete g;
        return set_error(cudaErrorStreamCaptureInvalidated);
    }
    *graph = g;
    return cudaSuccess;
}

cudaError_t cudaStreamIsCapturing(cudaStream_t st, enum cudaStreamCaptureStatus *status)
{
    *status = st && st->capturing ? (st->invalidated ? cudaStreamCaptureStatusInvalidated : cudaStreamCaptureStatusActive)
                                  : cudaStreamCaptureStatusNone;
    return cudaSuccess;
}

cudaError_t cudaGraphInstantiate(cudaGraphExec_t *exec, cudaGraph_t g, unsigned long long flags)
{
    (void)flags;
    *exec = new CUgraphExec_st{g->nodes};
    return cudaSuccess;
}

cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t st)
{
    if (!exec) return set_error(cudaErrorInvalidResourceHandle);
    std::vector<std::function<void()>> nodes = exec->nodes;
    return on_stream(st, [nodes]() {
        for (const std::function<void()> &op : nodes) op();
    });
}

cudaError_t cudaGraphDestroy(cudaGraph_t g)
{
    delete g;
    return cudaSuccess;
}
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t e)
{
    delete e;
    return cudaSuccess;
}

cudaError_t cudaFuncSetAttribute(const void *func, enum cudaFuncAttribute attr, int value)
{
    if (attr != cudaFuncAttributeMaxDynamicSharedMemorySize) return cudaSuccess;
    if (value < 0 || value > 232448) return set_error(cudaErrorInvalidValue);
    std::lock_guard<std::recursive_mutex> hold(emu::big_lock);
    emu::max_dynamic_shared[func] = value;
    return cudaSuccess;
}

} /* extern "C" */
