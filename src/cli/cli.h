/* Subcommands of the pagoda executable. Each takes the arguments after "pagoda" (argv[0] is
 * the subcommand name) and returns the process exit code. */
#ifndef PGD_CLI_H
#define PGD_CLI_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "pagoda/pagoda.h"

int pgd_cli_generate(int argc, char **argv);
int pgd_cli_logits(int argc, char **argv);
int pgd_cli_perplexity(int argc, char **argv);
int pgd_cli_batch(int argc, char **argv);
int pgd_cli_serve(int argc, char **argv);
int pgd_cli_tokenize(int argc, char **argv);
int pgd_cli_detokenize(int argc, char **argv);
int pgd_cli_bench(int argc, char **argv);
int pgd_cli_kv_plan(int argc, char **argv);
int pgd_cli_render_template(int argc, char **argv);

/* Shared helpers (src/cli/args.c). */
/* The model path used when -m is not given: the --model declaration's environment variable
 * ($PAGODA_MODEL) or default */
const char *pgd_cli_default_model(void);
/* Parses "1 2 3" / "1,2,3" into a malloc'd id array; returns 0 or -1 on a bad list. */
int pgd_cli_parse_ids(const char *s, int32_t **ids, size_t *n);
/* Strict number parsing; return 0 on success, -1 if s is not entirely a number in range. */
int pgd_cli_parse_long(const char *s, long lo, long hi, long *out);
int pgd_cli_parse_float(const char *s, float lo, float hi, float *out);
/* The model-loading options the engine and model options give (for the commands that load a
 * model without an engine). Borrowed: eo's strings. */
struct pgd_engine_opts;
struct pgd_model_opts;
void pgd_cli_model_opts(const struct pgd_engine_opts *eo, struct pgd_model_opts *mo);

#endif
