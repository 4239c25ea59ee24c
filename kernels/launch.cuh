// Kernel launches with programmatic dependent launch (PDL, compute capability 9.0+).
//
// A decode step at batch 1 is ~290 dependent kernels; without PDL each waits for the whole of
// the kernel before it to finish and only then is scheduled, so every boundary costs the launch
// and the ramp of a grid (a few microseconds, ~0.2 of the step). Launched by klaunch() with
// pgd_k_pdl set, a kernel may be scheduled while the one before it is still running: its
// blocks start, do what does not depend on that kernel (k_gemv16 prefetches its first weights
// into L2), and wait in pdl_wait() until the kernel before has completed and its writes are
// visible. Then they call pdl_trigger(), which lets the next kernel be scheduled once every
// block of this one has called it (or exited).
//
// The rule for every kernel launched through klaunch(): pdl_wait() comes before its first read
// of anything an earlier kernel wrote and before its first global write (a write before it could
// overwrite what the kernel before is still reading). Only reads of memory no kernel writes
// (weights) may come earlier. Both are no-ops where the kernel was launched without PDL and on
// devices before sm_90 (the backend sets pgd_k_pdl only on those that have it, and only where
// the kernels were compiled for compute_90 or later: pgd_k_set_pdl).
#pragma once
#include <cuda_runtime.h>
#include <stdio.h>

extern int pgd_k_pdl; /* launch with PDL (kernels/pagoda.cu; pgd_k_set_pdl) */

static __device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

static __device__ __forceinline__ void pdl_trigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" :::);
#endif
}

// Both, first thing in a kernel that has nothing to do before its inputs are ready.
static __device__ __forceinline__ void pdl_enter() {
    pdl_wait();
    pdl_trigger();
}

// kernel<<<grid, block, shm, s>>>(args...), with the PDL attribute where pgd_k_pdl is set;
// returns the launch status.
template <typename... P, typename... A>
static cudaError_t klaunch(void (*kernel)(P...), dim3 grid, dim3 block, size_t shm,
                           cudaStream_t s, A &&...args) {
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[0].val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = shm;
    cfg.stream = s;
    cfg.attrs = at;
    cfg.numAttrs = pgd_k_pdl ? 1 : 0;
    cudaError_t e = cudaLaunchKernelEx(&cfg, kernel, static_cast<P>(args)...);
    if (e != cudaSuccess) (void)cudaGetLastError(); // reported here: not left for a later check
    if (e != cudaSuccess && cfg.numAttrs) {
        // Refused with the attribute and taken without it: PDL is off from here on. Under
        // stream capture the refusal has already ended the capture, so the retry reports the
        // capture invalidated: PDL goes off then too, the backend runs that step eagerly (and
        // keeps that one shape eager), and the next shapes capture without PDL. (A capture
        // that was broken before this launch says so to both tries: PDL stays on.)
        cfg.numAttrs = 0;
        cudaError_t e2 = cudaLaunchKernelEx(&cfg, kernel, static_cast<P>(args)...);
        if (e2 != cudaSuccess) (void)cudaGetLastError();
        if (e2 == cudaSuccess ||
            (e2 == cudaErrorStreamCaptureInvalidated && e != cudaErrorStreamCaptureInvalidated)) {
            pgd_k_pdl = 0;
            fprintf(stderr, "pagoda: CUDA programmatic dependent launch refused (%s): off\n",
                    cudaGetErrorString(e));
        }
        e = e2;
    }
    return e;
}
