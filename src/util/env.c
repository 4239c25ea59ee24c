/* The environment switches (env.h): the one table of them. */
#include "util/env.h"

#include <stdlib.h>

/* One entry: PAGODA_<id>, its values, what it does. */
#define VAR(id, values, help) [PGD_ENV_##id] = {"PAGODA_" #id, values, help}

static const struct {
    const char *name, *values, *help;
} vars[PGD_ENV_COUNT] = {
    VAR(DEVICE_SAMPLING, "0|1", "sample on the device (default: one GPU)"),
    VAR(DUMMY_TYPE, "TYPE", "--load-format dummy's weight type (BF16)"),
    VAR(PROFILE, "0|1", "time each op of the forward pass"),
    VAR(HUGEPAGES, "0|1", "0: no transparent huge pages"),
    VAR(PIN, "0|1", "0: pool threads not pinned to cores"),
    VAR(INT8_ACT, "0|1", "8-bit activations: 0 none, 1 every quantized type (default: K-quants)"),
    VAR(AVX512, "0|1", "0: no AVX-512 kernels"),
    VAR(PACK, "0|1", "0: no 16-row weight panels (CPU GEMM)"),
    VAR(PACK_F16, "0|1", "0: F16 weights not packed"),
    VAR(PACK_Q8_0, "0|1", "0: Q8_0 weights not packed"),
    VAR(PACK_Q4_Q5, "0|1", "0: Q4_0/1, Q5_0/1 weights not packed"),
    VAR(PACK_Q3_K, "0|1", "0: Q3_K weights not packed"),
    VAR(PACK_Q4_K, "0|1", "0: Q4_K weights not packed"),
    VAR(PACK_Q5_K, "0|1", "0: Q5_K weights not packed"),
    VAR(PACK_Q6_K, "0|1", "0: Q6_K weights not packed"),
    VAR(CUDA_WIDEN, "0|1", "1: K-quants, Q5, IQ4 widened to F32 at load"),
    VAR(CUDA_GRAPHS, "0|1", "0: no CUDA graphs for decode steps"),
    VAR(CUDA_XCONV, "0|1", "0: a matmul input's BF16 copy not reused (measuring)"),
    VAR(CUDA_GEMV_GROUP, "0|1", "0: Q, K, V (gate, up) GEMVs not grouped"),
    VAR(CUDA_GEMV_MAX, "N", "most rows for the GEMV kernel"),
    VAR(CUDA_TC_ATTN, "0|1", "0: no tensor-core attention"),
    VAR(CUDA_PDL, "0|1", "0: no programmatic dependent launch"),
    VAR(CUDA_ATTN_FILL, "N", "attention splits per SM (0: per 256)"),
    VAR(TEST_SPEC_ALWAYS_ACCEPT, "0|1", "test hook (batch): accept every proposal"),
};
#undef VAR

const char *pgd_env(pgd_env_var v) {
    return v >= 0 && v < PGD_ENV_COUNT ? getenv(vars[v].name) : NULL;
}

void pgd_env_help(FILE *f) {
    for (int v = 0; v < PGD_ENV_COUNT; v++)
        fprintf(f, "  %-31s %-8s %s\n", vars[v].name, vars[v].values, vars[v].help);
}
