/* Checking macros: every CUDA runtime, cuBLAS and NCCL call goes through one of these, which
 * print the failed call with file and line and make the enclosing function fail. */
#ifndef PGD_CUDA_CHECK_H
#define PGD_CUDA_CHECK_H

#include <stdio.h>

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

/* Evaluates call (a library call returning a status of type T, `ok` on success); on failure
 * prints it with file and line, the library's name and str_fn's text for the status, and
 * executes on_fail. The three checks below are this one for each library. */
#define PGD_CUDA_CHECK_STATUS(T, ok, kind, str_fn, call, on_fail)                               \
    do {                                                                                        \
        T s_ = (call);                                                                          \
        if (s_ != (ok)) {                                                                       \
            fprintf(stderr, "%s:%d: %s error %d (%s) in %s\n", __FILE__, __LINE__, kind,        \
                    (int)s_, str_fn(s_), #call);                                                \
            on_fail;                                                                            \
        }                                                                                       \
    } while (0)

/* Evaluates call; on failure reports it and executes `on_fail` (e.g. return PGD_EIO). */
#define CUDA_CHECK_OR(call, on_fail)                                                            \
    PGD_CUDA_CHECK_STATUS(cudaError_t, cudaSuccess, "CUDA", cudaGetErrorString, call, on_fail)
#define CUBLAS_CHECK_OR(call, on_fail)                                                          \
    PGD_CUDA_CHECK_STATUS(cublasStatus_t, CUBLAS_STATUS_SUCCESS, "cuBLAS",                      \
                          cublasGetStatusString, call, on_fail)
#define NCCL_CHECK_OR(call, on_fail)                                                            \
    PGD_CUDA_CHECK_STATUS(ncclResult_t, ncclSuccess, "NCCL", ncclGetErrorString, call, on_fail)
/* In void ops: report and remember the failure (checked at sync). */
#define CUDA_CHECK(call) CUDA_CHECK_OR(call, pgd__cuda_failed = 1)
#define CUBLAS_CHECK(call) CUBLAS_CHECK_OR(call, pgd__cuda_failed = 1)
extern int pgd__cuda_failed;

#endif
