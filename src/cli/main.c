/* The pagoda executable: dispatches to a subcommand. */
#include <stdio.h>
#include <string.h>
#if defined(__x86_64__)
#include <cpuid.h>
#endif

#include "cli/cli.h"
#include "util/env.h"

static const struct {
    const char *name;
    int (*fn)(int, char **);
    const char *help;
} commands[] = {
    {"serve", pgd_cli_serve, "serve the OpenAI-compatible HTTP API"},
    {"generate", pgd_cli_generate, "generate text from a prompt with a model"},
    {"batch", pgd_cli_batch, "offline batch inference over a JSONL file of requests"},
    {"tokenize", pgd_cli_tokenize, "print the token ids of a text"},
    {"detokenize", pgd_cli_detokenize, "print the text of token ids"},
    {"logits", pgd_cli_logits, "write the logits of every position of a token sequence"},
    {"perplexity", pgd_cli_perplexity, "perplexity of a text; KL divergence against a saved run"},
    {"kv-plan", pgd_cli_kv_plan, "KV-cache capacity plan: memory, users that fit, roofline"},
    {"render-template", pgd_cli_render_template, "print the prompt a chat template renders"},
    {"bench", pgd_cli_bench, "prefill/decode tokens/s against the hardware roofline"},
};

static void usage(FILE *f) {
    fprintf(f, "usage: pagoda COMMAND [OPTIONS]\n\ncommands:\n");
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(f, "  %-12s %s\n", commands[i].name, commands[i].help);
    fprintf(f, "\n'pagoda COMMAND --help' describes a command's options (and the environment\n"
               "variables that set them). Switches for measuring and working around kernels:\n");
    pgd_env_help(f);
}

/* The build's instruction-set baseline against this CPU, before anything runs that the compiler
 * may have vectorised with it: a one-line refusal instead of SIGILL. Nothing in this function
 * or before it uses AVX. */
static int check_cpu(void) {
#if defined(__x86_64__) && (defined(__AVX2__) || defined(__FMA__) || defined(__F16C__))
    __builtin_cpu_init();
    const char *missing = NULL;
#ifdef __AVX2__
    if (!__builtin_cpu_supports("avx2")) missing = "AVX2";
#endif
#ifdef __FMA__
    if (!missing && !__builtin_cpu_supports("fma")) missing = "FMA";
#endif
#ifdef __F16C__
    unsigned a, b, c, d; /* clang 14 has no "f16c" for __builtin_cpu_supports: CPUID.1:ECX[29] */
    if (!missing && (!__get_cpuid(1, &a, &b, &c, &d) || !(c & (1u << 29)))) missing = "F16C";
#endif
    if (missing) {
        fprintf(stderr, "pagoda: this CPU lacks %s, which this build requires; rebuild with "
                        "cmake -DPAGODA_PORTABLE=ON\n", missing);
        return -1;
    }
#endif
    return 0;
}

int main(int argc, char **argv) {
    if (check_cpu()) return 1;
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        usage(stdout);
        return 0;
    }
    if (!strcmp(argv[1], "--version")) {
        printf("pagoda %s\n", PGD_VERSION);
        return 0;
    }
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (!strcmp(argv[1], commands[i].name)) return commands[i].fn(argc - 1, argv + 1);
    fprintf(stderr, "pagoda: unknown command '%s'\n", argv[1]);
    usage(stderr);
    return 2;
}
