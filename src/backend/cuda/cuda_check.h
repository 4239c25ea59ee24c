/* Checking macros: every CUDA runtime, cuBLAS and NCCL call goes through one of these, which
 * print the failed call with file and line and make the enclosing function fail. */
#ifndef PGD_CUDA_CHECK_H
#define PGD_CUDA_CHECK_H

#include <stdio.h>

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#define PGD_CUDA_REPORT(kind, code, str, call)                                                  \
    fprintf(stderr, "%s:%d: %s error %d (%s) in %s\n", __FILE__, __LINE__, kind, (int)(code),  \
            str, #call)

/* Evaluates call; on failure reports it and executes `on_fail` (e.g. return PGD_EIO). */
#define CUDA_CHECK_OR(call, on_fail)                                                            \
    do {                                                                                        \
        cudaError_t e_ = (call);                                                                \
        if (e_ != cudaSuccess) {                                                                \
            PGD_CUDA_REPORT("CUDA", e_, cudaGetErrorString(e_), call);                          \
            on_fail;                                                                            \
        }                                                                                       \
    } while (0)
#define CUBLAS_CHECK_OR(call, on_fail)                                                          \
    do {                                                                                        \
        cublasStatus_t s_ = (call);                                                             \
        if (s_ != CUBLAS_STATUS_SUCCESS) {                                                      \
            PGD_CUDA_REPORT("cuBLAS", s_, cublasGetStatusString(s_), call);                     \
            on_fail;                                                                            \
        }                                                                                       \
    } while (0)
#define NCCL_CHECK_OR(call, on_fail)                                                            \
    do {                                                                                        \
        ncclResult_t r_ = (call);                                                               \
        if (r_ != ncclSuccess) {                                                                \
            PGD_CUDA_REPORT("NCCL", r_, ncclGetErrorString(r_), call);                          \
            on_fail;                                                                            \
        }                                                                                       \
    } while (0)
/* In void ops: report and remember the failure (checked at sync). */
#define CUDA_CHECK(call) CUDA_CHECK_OR(call, pgd__cuda_failed = 1)
#define CUBLAS_CHECK(call) CUBLAS_CHECK_OR(call, pgd__cuda_failed = 1)
extern int pgd__cuda_failed;

#endif
