/* tests/isa_gate.c - runs a test program under the instruction-set ceiling in SHARDLM_CPU_ISA
 * (kernels/cpu/cpu_isa.h), or reports SKIP (exit 77) when this CPU lacks that level, so that a
 * test variant for a level the machine cannot run never passes. tests/CMakeLists.txt registers
 * each kernel test once per level through it (the *_isa_<level> tests).
 * Usage: SHARDLM_CPU_ISA=<level> isa_gate <program> [args...]
 * Not here: the checks themselves (the program it runs). */
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "cpu/cpu_isa.h"

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: SHARDLM_CPU_ISA=<level> %s <program> [args...]\n", argv[0]);
        return 2;
    }
    const char *asked = getenv("SHARDLM_CPU_ISA");
    const enum cpu_isa level = cpu_isa_parse(asked);
    if (level == CPU_ISA_COUNT) {
        fprintf(stderr, "isa_gate: SHARDLM_CPU_ISA=%s is not a level\n", asked ? asked : "(unset)");
        return 2;
    }
    if (level > cpu_isa_supported()) {
        printf("SKIP: SHARDLM_CPU_ISA=%s: this CPU (%s) supports up to %s\n", asked, cpu_isa_model(),
               cpu_isa_name(cpu_isa_supported()));
        return 77;
    }
    printf("isa_gate: %s at SHARDLM_CPU_ISA=%s on %s\n", argv[1], asked, cpu_isa_model());
    fflush(stdout);
    execv(argv[1], argv + 1);
    perror("isa_gate: execv");
    return 2;
}
