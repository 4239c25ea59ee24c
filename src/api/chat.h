/* Chat prompts: the model's own Jinja chat template rendered with the variables Hugging Face
 * passes (messages, add_generation_prompt, bos_token, eos_token, tools). */
#ifndef PGD_API_CHAT_H
#define PGD_API_CHAT_H

#include <cjson/cJSON.h>
#include <stdbool.h>
#include <stddef.h>

#include "api/jinja.h"
#include "tokenizer/tokenizer.h"

/* How to render: add_generation_prompt; kwargs (may be NULL): more template variables
 * (chat_template_kwargs, e.g. {"enable_thinking": false}), set last; continue_final: the prompt
 * ends inside the final message, for the model to continue it (transformers'
 * continue_final_message: a tag appended to its last text is found in the rendering, which is
 * cut there). */
typedef struct pgd_chat_opts {
    bool add_generation_prompt, continue_final;
    const cJSON *kwargs;
} pgd_chat_opts;

/* Renders into a malloc'd *out. messages and tools (may be NULL) are borrowed; each message's
 * content (a string, null, absent, or text parts {"type": "text", "text"}) is handed to the
 * template in the form it reads, as vLLM does: a string, or a list of parts where the template
 * loops over content (pgd_jinja_iterates_content). On failure
 * returns a negative status and writes the template's message (e.g. its raise_exception text)
 * into err. Thread-safe: t and tok are immutable. */
int pgd_chat_render(const pgd_jinja_tmpl *t, const pgd_tokenizer *tok, const cJSON *messages,
                    const cJSON *tools, const pgd_chat_opts *o, char **out, char *err,
                    size_t errlen);

#endif
