/* The CUDA flash-decoding kernel's split of a token's context (kernels/kernels.h,
 * pgd_k_split_len and pgd_k_splits_used, shared by k_attention and k_attn_combine): for every
 * split count and position, the splits it uses tile positions 0 .. p in order, none empty, at
 * least the minimum long (but the last), no more of them than the grid has, and the ones past
 * them start beyond p (their blocks return at once). Host code: runs in every build. */
#include "../../kernels/kernels.h"
#include "test.h"

static void check_one(int n_splits, int min_len, int p) {
    int len = pgd_k_split_len(n_splits, min_len, p);
    int used = pgd_k_splits_used(len, p);
    int ok = used >= 1 && used <= n_splits && len >= min_len;
    int covered = 0; /* positions 0 .. covered - 1 are in the splits seen so far */
    for (int s = 0; s < n_splits && ok; s++) {
        int start = s * len, end = start + len < p + 1 ? start + len : p + 1;
        if (s >= used) {
            ok = start > p;
            continue;
        }
        ok = start == covered && end > start && (end - start == len || s == used - 1);
        covered = end;
    }
    ok = ok && covered == p + 1;
    if (!ok) fprintf(stderr, "n_splits %d, min %d, p %d: len %d, used %d\n", n_splits, min_len, p,
                     len, used);
    CHECK(ok);
}

int main(void) {
    for (int n = 1; n <= 160; n++)
        for (int p = 0; p <= 4200; p += p < 300 ? 1 : 37) check_one(n, 16, p);
    check_one(64, 16, 131071);
    check_one(1, 256, 0);
    /* the geometry of the H200 decode benchmark: batch 1 at positions 512-543 in a graph keyed
     * for 1,024 positions (64 splits of >= 16): 34 splits used, none empty */
    CHECK_EQ_INT(pgd_k_split_len(64, 16, 543), 16);
    CHECK_EQ_INT(pgd_k_splits_used(16, 543), 34);
    /* batch 8 (9 splits): the context over all 9, not 5 of 114 positions */
    CHECK_EQ_INT(pgd_k_split_len(9, 16, 543), 61);
    CHECK_EQ_INT(pgd_k_splits_used(61, 543), 9);
    return test_report("test_attn_splits");
}
