/* The environment variables Pagoda reads besides the options' (util/options.c's table names each
 * option's variable, and reads those): switches for measuring and working around kernels and
 * backends, and one test hook. Each is declared once here -- name, values, what it does -- and
 * read only through pgd_env, so `pagoda --help` lists them all and no module has a getenv of
 * its own. */
#ifndef PGD_UTIL_ENV_H
#define PGD_UTIL_ENV_H

#include <stdio.h>

typedef enum {
    PGD_ENV_DEVICE_SAMPLING,
    PGD_ENV_DUMMY_TYPE,
    PGD_ENV_PROFILE,
    PGD_ENV_HUGEPAGES,
    PGD_ENV_PIN,
    PGD_ENV_INT8_ACT,
    PGD_ENV_AVX512,
    PGD_ENV_PACK,
    PGD_ENV_PACK_F16,
    PGD_ENV_PACK_Q8_0,
    PGD_ENV_PACK_Q4_Q5,
    PGD_ENV_PACK_Q3_K,
    PGD_ENV_PACK_Q4_K,
    PGD_ENV_PACK_Q5_K,
    PGD_ENV_PACK_Q6_K,
    PGD_ENV_CUDA_WIDEN,
    PGD_ENV_CUDA_GRAPHS,
    PGD_ENV_CUDA_XCONV,
    PGD_ENV_CUDA_GEMV_GROUP,
    PGD_ENV_CUDA_GEMV_MAX,
    PGD_ENV_CUDA_TC_ATTN,
    PGD_ENV_CUDA_PDL,
    PGD_ENV_CUDA_ATTN_FILL,
    PGD_ENV_TEST_SPEC_ALWAYS_ACCEPT,
    PGD_ENV_COUNT
} pgd_env_var;

/* The variable's value as the environment holds it, or NULL when it is unset. */
const char *pgd_env(pgd_env_var v);
/* One line per variable: name, values, what it does. */
void pgd_env_help(FILE *f);

#endif
