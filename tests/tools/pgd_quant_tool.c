/* Test tool: exposes backend/cpu/quant to tests/integration/test_quant_ref.py.
 *   pgd_quant_tool dequant TYPE IN.bin OUT.f32        whole file of TYPE blocks -> float32
 *   pgd_quant_tool dot TYPE W.bin X.f32 OUT.f32 [ACT.f32]
 *       rows of W (row length = count of X) dotted with X -> one float32 per row; ACT.f32
 *       receives the activations as the kernel saw them (pgd_dequantize_act)
 *   pgd_quant_tool kvquant TYPE IN.f32 OUT.bin
 *       float32 rows into Q8_0 / Q4_0 blocks as the KV cache stores them (pgd_kv_quantize_row)
 * TYPE is the ggml name (F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL, Q2_K, Q3_K, Q4_K,
 * Q5_K, Q6_K, Q8_K, IQ4_XS). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/kv_quant.h"
#include "backend/cpu/quant.h"

static const struct {
    const char *name;
    pgd_type t;
    int qk, bytes;
} k_types[] = {
    {"F32", PGD_TYPE_F32, 1, 4},        {"F16", PGD_TYPE_F16, 1, 2},
    {"BF16", PGD_TYPE_BF16, 1, 2},      {"Q4_0", PGD_TYPE_Q4_0, 32, 18},
    {"Q4_1", PGD_TYPE_Q4_1, 32, 20},    {"Q8_0", PGD_TYPE_Q8_0, 32, 34},
    {"Q4_K", PGD_TYPE_Q4_K, 256, 144},  {"Q5_K", PGD_TYPE_Q5_K, 256, 176},
    {"Q6_K", PGD_TYPE_Q6_K, 256, 210},  {"Q8_K", PGD_TYPE_Q8_K, 256, 292},
    {"Q5_0", PGD_TYPE_Q5_0, 32, 22},    {"Q5_1", PGD_TYPE_Q5_1, 32, 24},
    {"IQ4_NL", PGD_TYPE_IQ4_NL, 32, 18}, {"Q2_K", PGD_TYPE_Q2_K, 256, 84},
    {"Q3_K", PGD_TYPE_Q3_K, 256, 110},  {"IQ4_XS", PGD_TYPE_IQ4_XS, 256, 136},
};

static void *slurp(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long sz = ftell(f);
    fseek(f, 0, SEEK_SET);
    void *buf = malloc(sz > 0 ? (size_t)sz : 1);
    if (buf && fread(buf, 1, (size_t)sz, f) != (size_t)sz) {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    *len = (size_t)sz;
    return buf;
}

static int spill(const char *path, const void *buf, size_t len) {
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    size_t w = fwrite(buf, 1, len, f);
    return fclose(f) == 0 && w == len ? 0 : -1;
}

int main(int argc, char **argv) {
    if (argc < 5) {
        fprintf(stderr,
                "usage: %s dequant TYPE IN.bin OUT.f32\n"
                "       %s dot TYPE W.bin X.f32 OUT.f32 [ACT.f32]\n",
                argv[0], argv[0]);
        return 2;
    }
    int ti = -1;
    for (int i = 0; i < (int)(sizeof k_types / sizeof k_types[0]); i++)
        if (strcmp(argv[2], k_types[i].name) == 0) ti = i;
    if (ti < 0) {
        fprintf(stderr, "unknown type %s\n", argv[2]);
        return 2;
    }
    size_t len;
    unsigned char *in = slurp(argv[3], &len);
    if (strcmp(argv[1], "kvquant") == 0 && argc == 5) {
        pgd_type t = k_types[ti].t;
        if ((t != PGD_TYPE_Q8_0 && t != PGD_TYPE_Q4_0) || !in || len % (32 * sizeof(float))) {
            fprintf(stderr, "%s: kvquant takes Q8_0 or Q4_0 and whole blocks of float32\n",
                    argv[3]);
            free(in);
            return 1;
        }
        int n = (int)(len / sizeof(float));
        size_t out_len = (size_t)n / 32 * (size_t)k_types[ti].bytes;
        void *y = malloc(out_len ? out_len : 1);
        float *x = malloc(len ? len : 1);
        int rc = 1;
        if (y && x) {
            memcpy(x, in, len);
            pgd_kv_quantize_row(t, x, y, n);
            rc = spill(argv[4], y, out_len) ? 1 : 0;
        }
        free(x);
        free(y);
        free(in);
        return rc;
    }
    if (!in || len % (size_t)k_types[ti].bytes) {
        fprintf(stderr, "%s: unreadable or not a whole number of %s blocks\n", argv[3], argv[2]);
        return 1;
    }
    int64_t n_all = (int64_t)(len / (size_t)k_types[ti].bytes) * k_types[ti].qk;
    int rc = 1;
    if (strcmp(argv[1], "dequant") == 0 && argc == 5) {
        float *y = malloc((size_t)(n_all > 0 ? n_all : 1) * sizeof(float));
        pgd_dequantize_row(k_types[ti].t, in, y, n_all);
        rc = spill(argv[4], y, (size_t)n_all * sizeof(float)) ? 1 : 0;
        free(y);
    } else if (strcmp(argv[1], "dot") == 0 && (argc == 6 || argc == 7)) {
        size_t xlen;
        float *x = slurp(argv[4], &xlen);
        int64_t n = (int64_t)(xlen / sizeof(float));
        if (!x || n == 0 || n % k_types[ti].qk || n_all % n ||
            !pgd_cpu_type_supported(k_types[ti].t)) {
            fprintf(stderr, "dot: bad shapes or type\n");
            return 1;
        }
        int64_t rows = n_all / n;
        size_t row_bytes = (size_t)(n / k_types[ti].qk * k_types[ti].bytes);
        void *act = malloc(pgd_vec_dot_act_bytes(k_types[ti].t, n));
        float *out = malloc((size_t)rows * sizeof(float) + 1);
        pgd_quantize_act(k_types[ti].t, x, act, n);
        for (int64_t r = 0; r < rows; r++)
            out[r] = pgd_vec_dot(k_types[ti].t, in + (size_t)r * row_bytes, act, n);
        rc = spill(argv[5], out, (size_t)rows * sizeof(float)) ? 1 : 0;
        if (argc == 7) {
            pgd_dequantize_act(k_types[ti].t, act, x, n);
            rc |= spill(argv[6], x, (size_t)n * sizeof(float)) ? 1 : 0;
        }
        free(act), free(out), free(x);
    } else {
        fprintf(stderr, "bad command %s\n", argv[1]);
        rc = 2;
    }
    free(in);
    return rc;
}
