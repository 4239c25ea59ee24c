/* A Jinja interpreter for chat templates: parses the Jinja subset real chat templates use
 * (if/for/set/macro, filters, tests, loop variables, namespace, string/dict methods) and renders
 * it exactly as Python's jinja2 does under Hugging Face's settings (trim_blocks, lstrip_blocks,
 * the loopcontrols extension, json.dumps-style tojson, raise_exception, strftime_now). */
#ifndef PGD_API_JINJA_H
#define PGD_API_JINJA_H

#include <cjson/cJSON.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include "util/status.h"

/* A parsed template. Immutable once parsed: any number of threads may render it at once. */
typedef struct pgd_jinja_tmpl pgd_jinja_tmpl;

/* Parses src[0..len) (need not be NUL-terminated; borrowed during the call only) into *out,
 * which the caller releases with pgd_jinja_free. On a syntax error returns PGD_EFORMAT with
 * "line L col C: what" in err; PGD_ERANGE if the template nests deeper than the parser allows
 * or is larger than 16 MiB. Never reads outside src. */
int pgd_jinja_parse(const char *src, size_t len, pgd_jinja_tmpl **out, pgd_err *err);
void pgd_jinja_free(pgd_jinja_tmpl *t);

/* Limits and inputs of one render. Zero fields take the defaults in brackets. */
typedef struct pgd_jinja_opts {
    time_t now;         /* what strftime_now formats (as local time) [time(NULL)] */
    size_t max_output;  /* bytes of rendered text [16 MiB] */
    size_t max_memory;  /* bytes of values live at once [256 MiB] */
    uint64_t max_steps; /* evaluation steps: loop iterations, expression nodes [50 M] */
    int max_call_depth; /* nested macro calls [64] */
} pgd_jinja_opts;

/* Renders t with the variables of ctx (a cJSON object, borrowed during the call: messages,
 * add_generation_prompt, bos_token, eos_token, tools, ...; NULL means no variables) into a
 * malloc'd NUL-terminated *out of *out_len bytes, which the caller frees. opts may be NULL.
 * Globals as Hugging Face defines them: raise_exception, strftime_now, namespace, range, dict.
 * Errors (nothing is written to *out):
 *   PGD_EINVAL  the template raised: err holds exactly raise_exception's message;
 *               or a runtime error (type error, undefined value called, ...): "line L: what";
 *   PGD_ERANGE  a limit of opts was reached;
 *   PGD_ENOMEM  an allocation failed. */
int pgd_jinja_render(const pgd_jinja_tmpl *t, const cJSON *ctx, const pgd_jinja_opts *opts,
                     char **out, size_t *out_len, pgd_err *err);

/* Whether t loops over a message's content as a list of parts ({% for part in
 * message['content'] %}, or over a variable named content): vLLM's detection of the "openai"
 * content format (chat_utils.py, _detect_content_format), on the same syntax tree walk; else
 * the template takes content as a string ("string"). Read-only: safe beside renders. */
bool pgd_jinja_iterates_content(const pgd_jinja_tmpl *t);

#endif
