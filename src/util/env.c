/* The environment switches (env.h): the one table of them. */
#include "util/env.h"

#include <stdlib.h>

static const struct {
    const char *name, *values, *help;
} vars[PGD_ENV_COUNT] = {
    [PGD_ENV_DEVICE_SAMPLING] = {"PAGODA_DEVICE_SAMPLING", "0|1",
                                 "sample on the device (default: one GPU)"},
    [PGD_ENV_DUMMY_TYPE] = {"PAGODA_DUMMY_TYPE", "TYPE",
                            "--load-format dummy's weight type (BF16)"},
    [PGD_ENV_PROFILE] = {"PAGODA_PROFILE", "0|1", "time each op of the forward pass"},
    [PGD_ENV_HUGEPAGES] = {"PAGODA_HUGEPAGES", "0|1", "0: no transparent huge pages"},
    [PGD_ENV_PIN] = {"PAGODA_PIN", "0|1", "0: pool threads not pinned to cores"},
    [PGD_ENV_INT8_ACT] = {"PAGODA_INT8_ACT", "0|1",
                          "8-bit activations for quantized matmuls"},
    [PGD_ENV_AVX512] = {"PAGODA_AVX512", "0|1", "0: no AVX-512 kernels"},
    [PGD_ENV_PACK] = {"PAGODA_PACK", "0|1", "0: no 16-row weight panels (CPU GEMM)"},
    [PGD_ENV_PACK_F16] = {"PAGODA_PACK_F16", "0|1", "0: F16 weights not packed"},
    [PGD_ENV_PACK_Q8_0] = {"PAGODA_PACK_Q8_0", "0|1", "0: Q8_0 weights not packed"},
    [PGD_ENV_PACK_Q4_Q5] = {"PAGODA_PACK_Q4_Q5", "0|1", "0: Q4_0/1, Q5_0/1 weights not packed"},
    [PGD_ENV_PACK_Q3_K] = {"PAGODA_PACK_Q3_K", "0|1", "0: Q3_K weights not packed"},
    [PGD_ENV_PACK_Q4_K] = {"PAGODA_PACK_Q4_K", "0|1", "0: Q4_K weights not packed"},
    [PGD_ENV_PACK_Q5_K] = {"PAGODA_PACK_Q5_K", "0|1", "0: Q5_K weights not packed"},
    [PGD_ENV_PACK_Q6_K] = {"PAGODA_PACK_Q6_K", "0|1", "0: Q6_K weights not packed"},
    [PGD_ENV_CUDA_WIDEN] = {"PAGODA_CUDA_WIDEN", "0|1",
                            "1: K-quants, Q5, IQ4 widened to F32 at load"},
    [PGD_ENV_CUDA_GRAPHS] = {"PAGODA_CUDA_GRAPHS", "0|1", "0: no CUDA graphs for decode steps"},
    [PGD_ENV_CUDA_XCONV] = {"PAGODA_CUDA_XCONV", "0|1",
                            "0: a matmul input's BF16 copy not reused (measuring)"},
    [PGD_ENV_CUDA_GEMV_GROUP] = {"PAGODA_CUDA_GEMV_GROUP", "0|1", "0: Q, K, V (gate, up) GEMVs not grouped"},
    [PGD_ENV_CUDA_GEMV_MAX] = {"PAGODA_CUDA_GEMV_MAX", "N",
                               "most rows for the GEMV kernel"},
    [PGD_ENV_CUDA_TC_ATTN] = {"PAGODA_CUDA_TC_ATTN", "0|1", "0: no tensor-core attention"},
    [PGD_ENV_CUDA_PDL] = {"PAGODA_CUDA_PDL", "0|1",
                          "0: no programmatic dependent launch"},
    [PGD_ENV_CUDA_ATTN_FILL] = {"PAGODA_CUDA_ATTN_FILL", "N",
                                "attention splits per SM (0: per 256)"},
    [PGD_ENV_TEST_SPEC_ALWAYS_ACCEPT] = {"PAGODA_TEST_SPEC_ALWAYS_ACCEPT", "0|1",
                                         "test hook (batch): accept every proposal"},
};

const char *pgd_env(pgd_env_var v) {
    return v >= 0 && v < PGD_ENV_COUNT ? getenv(vars[v].name) : NULL;
}

void pgd_env_help(FILE *f) {
    for (int v = 0; v < PGD_ENV_COUNT; v++)
        fprintf(f, "  %-31s %-8s %s\n", vars[v].name, vars[v].values, vars[v].help);
}
