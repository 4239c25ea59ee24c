/* Matrix products: activations are converted once per call into the weight's dot-product
 * format, then output rows are split across the pool; each (row, token) dot product is one
 * pgd_vec_dot call with a fixed reduction order. */
#include "backend/cpu/matmul.h"

#include "backend/cpu/quant.h"

size_t pgd_cpu_matmul_act_row_bytes(const pgd_weight *w) {
    return (pgd_vec_dot_act_bytes(w->type, w->n_in) + 63) / 64 * 64;
}

typedef struct matmul_ctx {
    const pgd_weight *w;
    const float *x;       /* (n, w->n_in) */
    unsigned char *act;   /* (n) rows of act_row_bytes */
    size_t act_row_bytes;
    float *y;             /* (n, w->n_out) */
    int n;
} matmul_ctx;

static void quant_task(void *arg, int ith, int nth) {
    matmul_ctx *c = arg;
    long lo, hi;
    pgd_split_range(c->n, ith, nth, &lo, &hi);
    for (long t = lo; t < hi; t++)
        pgd_quantize_act(c->w->type, c->x + (size_t)t * c->w->n_in,
                         c->act + (size_t)t * c->act_row_bytes, c->w->n_in);
}

static void matmul_task(void *arg, int ith, int nth) {
    matmul_ctx *c = arg;
    const pgd_weight *w = c->w;
    long lo, hi;
    /* Rows are split across threads, never the reduction dimension. */
    pgd_split_range(w->n_out, ith, nth, &lo, &hi);
    const unsigned char *base = w->data;
    for (long r = lo; r < hi; r++) {
        const void *row = base + (size_t)r * w->row_bytes;
        for (int t = 0; t < c->n; t++)
            c->y[(size_t)t * w->n_out + r] =
                pgd_vec_dot(w->type, row, c->act + (size_t)t * c->act_row_bytes, w->n_in);
    }
}

void pgd_cpu_matmul(pgd_pool *pool, const pgd_weight *w, const float *x, float *y, int n,
                    void *act, size_t act_row_bytes) {
    matmul_ctx c = {w, x, act, act_row_bytes, y, n};
    if (n > 1) pgd_pool_run(pool, quant_task, &c);
    else quant_task(&c, 0, 1);
    pgd_pool_run(pool, matmul_task, &c);
}
