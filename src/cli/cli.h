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
int pgd_cli_batch(int argc, char **argv);
int pgd_cli_serve(int argc, char **argv);
int pgd_cli_tokenize(int argc, char **argv);
int pgd_cli_detokenize(int argc, char **argv);
int pgd_cli_bench(int argc, char **argv);
int pgd_cli_kv_plan(int argc, char **argv);
int pgd_cli_render_template(int argc, char **argv);

/* Shared helpers (src/cli/args.c). */
/* The model path used when -m is not given: $PAGODA_MODEL or models/SmolLM2-135M-Instruct.Q4_1.gguf */
const char *pgd_cli_default_model(void);
/* Parses "1 2 3" / "1,2,3" into a malloc'd id array; returns 0 or -1 on a bad list. */
int pgd_cli_parse_ids(const char *s, int32_t **ids, size_t *n);
/* Strict number parsing; return 0 on success, -1 if s is not entirely a number in range. */
int pgd_cli_parse_long(const char *s, long lo, long hi, long *out);
int pgd_cli_parse_float(const char *s, float lo, float hi, float *out);
/* --load-format auto|dummy: *dummy set; -1 (after a one-line message naming cmd) otherwise. */
int pgd_cli_parse_load_format(const char *cmd, const char *s, bool *dummy);
/* --gpu-memory-utilization F, 0 < F <= 1: 0 or -1 (after a one-line message naming cmd). */
int pgd_cli_parse_gpu_util(const char *cmd, const char *s, float *out);
/* --kv-dtype f32|f16|bf16: 0, or -1 for anything else (the caller reports it). */
int pgd_cli_parse_kv_dtype(const char *s, pgd_kv_dtype *out);

#endif
