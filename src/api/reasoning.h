/* Reasoning in chat answers (vLLM's --reasoning-parser): the text a thinking model writes
 * between <think> and </think> comes back as message.reasoning_content, apart from the content.
 *
 * Two formats, as vLLM's parsers of those names:
 * - deepseek_r1: the chat template opens the thinking (DeepSeek-R1's distills end the
 *   generation prompt with "<think>\n"): the answer is reasoning up to "</think>", content after
 *   it; with no "</think>" all of it is reasoning.
 * - qwen3: the model opens it: reasoning only when the answer starts with "<think>" (Qwen3,
 *   SmolLM3 in thinking mode), up to "</think>"; otherwise all of it is content.
 * In both a "<think>" opening the answer (after whitespace) is dropped. One rule serves streamed
 * and whole answers, so the stream's pieces add up to the whole answer's: vLLM's whole-answer
 * parsers also drop text before a "<think>" found later, which a stream cannot take back. */
#ifndef PGD_API_REASONING_H
#define PGD_API_REASONING_H

#include <stdbool.h>
#include <stddef.h>

typedef enum {
    PGD_REASONING_NONE = 0,
    PGD_REASONING_DEEPSEEK_R1,
    PGD_REASONING_QWEN3,
} pgd_reasoning_format;

/* The tags both formats use. */
#define PGD_THINK_OPEN "<think>"
#define PGD_THINK_CLOSE "</think>"

/* "none", "deepseek_r1" or "qwen3"; -1 for another name. */
int pgd_reasoning_format_of(const char *name);

/* Where the reasoning and the content of an answer lie. */
typedef struct pgd_reasoning_span {
    bool thinking;     /* the answer has reasoning (it may be empty) */
    size_t r_off, r_end; /* reasoning: t[r_off, r_end) */
    bool content;      /* the content has started, at c_off */
    size_t c_off;
} pgd_reasoning_span;

/* Scans the answer so far, t[0..n); done: the whole answer. While it is not done, bytes that may
 * begin "<think>" or "</think>" are held back (neither reasoning nor content yet). known: bytes
 * of t an earlier scan of the same answer saw without a "</think>" (0: none), so a stream's
 * scans search only what is new -- once one finds content the span is final, and a streaming
 * caller keeps it. */
void pgd_reasoning_scan(pgd_reasoning_format f, const char *t, size_t n, bool done, size_t known,
                        pgd_reasoning_span *sp);

/* Whether a rendered chat prompt ends (but for white space) by opening the thinking (1), by
 * closing it (2), or neither (0). */
int pgd_reasoning_prompt_state(const char *prompt);

#endif
