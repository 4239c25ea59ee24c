/* The K-quant x Q8_K register tiles (kq_tiles.h) in AVX-512: maddubs, then vpdpwssd (VNNI) with
 * the scales, 64 elements per vector, 32 registers for 2 x 8 tiles. This file alone is compiled
 * with -mavx512f -mavx512bw -mavx512vl -mavx512vnni (CMakeLists.txt); matmul.c calls it only
 * where pgd__kq_vnni_supported() and pgd_cpu_avx512() say so. */
#include "backend/cpu/kq_tiles.h"

#if defined(PGD_AVX512_KERNELS) && defined(__AVX512F__) && defined(__AVX512BW__) &&              \
    defined(__AVX512VL__) && defined(__AVX512VNNI__)
#define KQ_W 64
#define KQ_MR PGD_KQ_MR_VNNI
#define KQ_MT PGD_KQ_MT_VNNI
#define KQ_FN pgd__kq_tile_vnni
#include "backend/cpu/kq_kernels.h"

bool pgd__kq_vnni_supported(void) {
    /* libgcc's checks include the OS's saving of the zmm state (XCR0) */
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni");
}
#else
bool pgd__kq_vnni_supported(void) { return false; }
void pgd__kq_tile_vnni(pgd_type t, const pgd__kq_tile *g, int nr, int nt) {
    (void)t, (void)g, (void)nr, (void)nt;
}
#endif
