/* kernels/cpu/amx_tiles.h - what the two users of Intel AMX tiles share (amx.c: bf16 products;
 * quant_amx.c: Q8_0's int8 products): the tile configuration ldtilecfg reads (palette 1) and
 * the tile instructions as inline assembly with memory clobbers (GCC 12's AMX intrinsics
 * describe their memory operands too narrowly for a buffer that C code only writes; the
 * assembler knows them whatever the target flags). x86-64 Linux only; whether the CPU has the
 * tiles and Linux's permission for their state is cpu_isa.c's question (cpu_amx_enabled). */
#ifndef SHARDLM_AMX_TILES_H
#define SHARDLM_AMX_TILES_H

#include <stdint.h>

struct amx_tilecfg {
    uint8_t  palette;
    uint8_t  start_row;
    uint8_t  reserved[14];
    uint16_t colsb[16];
    uint8_t  rows[16];
};

#define TILE_LOAD(t, base, stride) \
    __asm__ volatile("tileloadd (%0,%1,1), %%tmm" #t ::"r"(base), "r"((long)(stride)) : "memory")
#define TILE_STORE(t, base, stride) \
    __asm__ volatile("tilestored %%tmm" #t ", (%0,%1,1)" ::"r"(base), "r"((long)(stride)) : "memory")
#define TILE_ZERO(t) __asm__ volatile("tilezero %%tmm" #t ::)
#define TILE_CONFIG(cfg) __asm__ volatile("ldtilecfg %0" ::"m"(cfg))
#define TILE_RELEASE() __asm__ volatile("tilerelease" ::)

#endif
