/* Kernel ISA selection.
 *
 * Every kernel in the project has a portable C path and (where it pays) an
 * AVX2/FMA path that is bit-identical to it, and the GEMM and the int8
 * attention of one Q head an AVX-512F path too; tests check the equality
 * (AVX-512 also on CPUs without it, through SIMDe: the unit tests
 * gemm_avx512 and attn_avx512). The
 * choice is therefore a speed setting only, never an answer-changing one,
 * which is what lets ranks on different CPUs share one cluster (ARCHITECTURE.md
 * §1).
 *
 * The selection is process-wide and set once at start-up. It is one of the few
 * process-wide mutable values the project keeps on purpose instead of passing
 * state in a context (the others: the kv_layer generation source and the
 * ring_layer identity counter in cache/, unique across the process by
 * design); none of them carries answer-relevant state. PD_ISA=scalar in the
 * environment forces the portable path. */
#ifndef PD_CPU_H
#define PD_CPU_H

typedef enum pd_isa {
    PD_ISA_SCALAR = 0, /* portable C with fmaf */
    PD_ISA_AVX2,       /* AVX2 + FMA (+ F16C for conversions) */
    PD_ISA_AVX512,     /* AVX-512F (the GEMM's kernels and int8 single-head
                        * attention; the rest run AVX2) */
    PD_ISA_COUNT
} pd_isa;

/* The best ISA this CPU supports (cpuid), ignoring PD_ISA and overrides. */
pd_isa pd_cpu_detect(void);

/* The ISA kernels use now: an override from pd_cpu_set_isa, else PD_ISA from
 * the environment ("scalar", "avx2" or "avx512", capped at what the CPU has), else the
 * detected one. */
pd_isa pd_cpu_isa(void);

/* Forces kernels to isa (capped at pd_cpu_detect()); returns the ISA in force.
 * Tests use it to compare paths; the cluster uses it to pick the ISA level
 * every rank supports. */
pd_isa pd_cpu_set_isa(pd_isa isa);

/* "scalar" / "avx2" / "avx512". */
const char *pd_isa_name(pd_isa isa);

#endif
