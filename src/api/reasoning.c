/* Reasoning spans of chat answers (reasoning.h). */
#include "api/reasoning.h"

#include <string.h>

static const char OPEN[] = PGD_THINK_OPEN, CLOSE[] = PGD_THINK_CLOSE;

int pgd_reasoning_format_of(const char *name) {
    if (!strcmp(name, "none")) return PGD_REASONING_NONE;
    if (!strcmp(name, "deepseek_r1")) return PGD_REASONING_DEEPSEEK_R1;
    if (!strcmp(name, "qwen3")) return PGD_REASONING_QWEN3;
    return -1;
}

/* The length of the longest suffix of t[0..n) that is a proper prefix of tag. */
static size_t partial_tag(const char *t, size_t n, const char *tag) {
    size_t tl = strlen(tag);
    for (size_t k = n < tl - 1 ? n : tl - 1; k > 0; k--)
        if (!memcmp(t + n - k, tag, k)) return k;
    return 0;
}

void pgd_reasoning_scan(pgd_reasoning_format f, const char *t, size_t n, bool done, size_t known,
                        pgd_reasoning_span *sp) {
    memset(sp, 0, sizeof *sp);
    if (f == PGD_REASONING_NONE) {
        sp->content = true;
        return;
    }
    size_t w = 0;
    while (w < n && (t[w] == ' ' || t[w] == '\n' || t[w] == '\r' || t[w] == '\t')) w++;
    size_t rest = n - w, ol = sizeof OPEN - 1;
    bool opens = rest >= ol && !memcmp(t + w, OPEN, ol);
    if (!opens && !done && (rest == 0 || (rest < ol && !memcmp(t + w, OPEN, rest))))
        return; /* undecided: the answer may still open with "<think>" */
    if (!opens && f == PGD_REASONING_QWEN3) { /* no thinking: all content */
        sp->content = true;
        return;
    }
    sp->thinking = true;
    sp->r_off = opens ? w + ol : 0;
    size_t from = known > sizeof CLOSE - 2 ? known - (sizeof CLOSE - 2) : 0; /* a tag's tail */
    if (from < sp->r_off) from = sp->r_off;
    const char *e = memmem(t + from, n - from, CLOSE, sizeof CLOSE - 1);
    if (e) {
        sp->r_end = (size_t)(e - t);
        sp->content = true;
        sp->c_off = sp->r_end + sizeof CLOSE - 1;
        return;
    }
    sp->r_end = n - (done ? 0 : partial_tag(t + sp->r_off, n - sp->r_off, CLOSE));
}

/* The prompt ends with tag, but for white space after it. */
static bool ends_with_tag(const char *prompt, const char *tag) {
    size_t n = strlen(prompt), l = strlen(tag);
    while (n && strchr(" \t\r\n", prompt[n - 1])) n--;
    return n >= l && !memcmp(prompt + n - l, tag, l);
}

int pgd_reasoning_prompt_state(const char *prompt) {
    return ends_with_tag(prompt, OPEN) ? 1 : ends_with_tag(prompt, CLOSE) ? 2 : 0;
}
