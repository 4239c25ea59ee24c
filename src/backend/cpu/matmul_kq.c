/* The K-quant x Q8_K register tiles (kq_tiles.h) in AVX2: maddubs, then madd with the scales,
 * 32 elements per vector. Compiled with the build's baseline flags; absent in a portable build. */
#include "backend/cpu/kq_tiles.h"

#ifdef __AVX2__
#define KQ_W 32
#define KQ_MR PGD_KQ_MR_AVX2
#define KQ_MT PGD_KQ_MT_AVX2
#define KQ_FN pgd__kq_tile_avx2
#include "backend/cpu/kq_kernels.h"
#endif
