/* The element types' block geometry and names (core/types.h), in one table: read by the GGUF
 * parser, the safetensors loader, the quantization kernels and the CLI alike. */
#include "core/types.h"

#include <stdbool.h>
#include <strings.h>

/* elements and bytes a block, the name, and where a block keeps its fp16 scale d and its second
 * fp16 (Q4_1/Q5_1's min, the K-quants' dmin; Q8_1's sum), offset + 1 (0: none) */
static const struct {
    uint32_t elems, bytes;
    const char *name;
    uint8_t d1, m1;
} type_info[PGD_TYPE_COUNT] = {
    [PGD_TYPE_F32] = {1, 4, "F32", 0, 0},         [PGD_TYPE_F16] = {1, 2, "F16", 0, 0},
    [PGD_TYPE_Q4_0] = {32, 18, "Q4_0", 1, 0},     [PGD_TYPE_Q4_1] = {32, 20, "Q4_1", 1, 3},
    [PGD_TYPE_Q5_0] = {32, 22, "Q5_0", 1, 0},     [PGD_TYPE_Q5_1] = {32, 24, "Q5_1", 1, 3},
    [PGD_TYPE_Q8_0] = {32, 34, "Q8_0", 1, 0},     [PGD_TYPE_Q8_1] = {32, 36, "Q8_1", 1, 3},
    [PGD_TYPE_Q2_K] = {256, 84, "Q2_K", 81, 83},  [PGD_TYPE_Q3_K] = {256, 110, "Q3_K", 109, 0},
    [PGD_TYPE_Q4_K] = {256, 144, "Q4_K", 1, 3},   [PGD_TYPE_Q5_K] = {256, 176, "Q5_K", 1, 3},
    [PGD_TYPE_Q6_K] = {256, 210, "Q6_K", 209, 0}, [PGD_TYPE_Q8_K] = {256, 292, "Q8_K", 0, 0},
    [PGD_TYPE_IQ4_NL] = {32, 18, "IQ4_NL", 1, 0}, [PGD_TYPE_IQ4_XS] = {256, 136, "IQ4_XS", 1, 0},
    [PGD_TYPE_BF16] = {1, 2, "BF16", 0, 0},
};

int pgd_type_from_name(const char *name, pgd_type *out) {
    for (int t = 0; t < PGD_TYPE_COUNT; t++)
        if (type_info[t].name && !strcasecmp(type_info[t].name, name)) {
            *out = (pgd_type)t;
            return 0;
        }
    return -1;
}

void pgd_type_scale_offsets(pgd_type t, int *d, int *m) {
    bool known = (unsigned)t < PGD_TYPE_COUNT;
    *d = known ? type_info[t].d1 - 1 : -1;
    *m = known ? type_info[t].m1 - 1 : -1;
}

uint32_t pgd_type_block_elems(pgd_type t) {
    return (unsigned)t < PGD_TYPE_COUNT ? type_info[t].elems : 0;
}
uint32_t pgd_type_block_bytes(pgd_type t) {
    return (unsigned)t < PGD_TYPE_COUNT ? type_info[t].bytes : 0;
}
const char *pgd_type_name(pgd_type t) {
    return (unsigned)t < PGD_TYPE_COUNT && type_info[t].name ? type_info[t].name : "unknown";
}
uint64_t pgd_type_row_bytes(pgd_type t, uint64_t n) {
    uint32_t be = pgd_type_block_elems(t);
    if (!be || n % be) return 0;
    return n / be * pgd_type_block_bytes(t);
}
