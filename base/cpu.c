/* cpuid-based ISA detection and the process-wide kernel ISA choice. */
#include "base/cpu.h"

#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

/* -1 = not decided yet. Atomic so concurrent first calls agree. */
static atomic_int pd_isa_current = -1;

pd_isa pd_cpu_detect(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#ifdef PD_AVX512_EMULATED
    /* a test build whose AVX-512 kernels run on SIMDe (gemm_avx512.c) */
    if (avx2)
        return PD_ISA_AVX512;
#endif
    /* gcc's check includes the OS saving the zmm registers (XCR0) */
    if (avx2 && __builtin_cpu_supports("avx512f"))
        return PD_ISA_AVX512;
    if (avx2)
        return PD_ISA_AVX2;
#endif
    return PD_ISA_SCALAR;
}

static pd_isa pd_cpu_cap(pd_isa isa)
{
    pd_isa best = pd_cpu_detect();
    return (unsigned)isa > (unsigned)best ? best : isa;
}

pd_isa pd_cpu_isa(void)
{
    int cur = atomic_load(&pd_isa_current);
    if (cur >= 0)
        return (pd_isa)cur;
    pd_isa isa = pd_cpu_detect();
    const char *env = getenv("PD_ISA");
    if (env && strcmp(env, "scalar") == 0)
        isa = PD_ISA_SCALAR;
    else if (env && strcmp(env, "avx2") == 0)
        isa = pd_cpu_cap(PD_ISA_AVX2);
    else if (env && strcmp(env, "avx512") == 0)
        isa = pd_cpu_cap(PD_ISA_AVX512);
    int expected = -1;
    atomic_compare_exchange_strong(&pd_isa_current, &expected, (int)isa);
    return (pd_isa)atomic_load(&pd_isa_current);
}

pd_isa pd_cpu_set_isa(pd_isa isa)
{
    pd_isa capped = pd_cpu_cap(isa);
    atomic_store(&pd_isa_current, (int)capped);
    return capped;
}

const char *pd_isa_name(pd_isa isa)
{
    switch (isa) {
    case PD_ISA_SCALAR: return "scalar";
    case PD_ISA_AVX2: return "avx2";
    case PD_ISA_AVX512: return "avx512";
    default: return "unknown";
    }
}
