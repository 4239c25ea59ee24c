/* `pagoda kv-plan`: the capacity planner on the command line (the arithmetic is in
 * src/plan/kv_plan.c). Reads only model metadata, never the weights. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "plan/kv_plan.h"

static void usage(FILE *f) {
    fprintf(
        f,
        "usage: pagoda kv-plan (-m MODEL | --model-config CONFIG.json)\n"
        "                      [--gpu NAME | --gpu-memory-gb G --bandwidth-tbs B --tflops T]\n"
        "                      [--num-gpus N] [--tensor-parallel-size N] [--weight-dtype D]\n"
        "                      [--kv-dtype D] [--gpu-memory-utilization F] [--reserve-gb G]\n"
        "                      [--context N] [--json]\n\n"
        "  -m MODEL              GGUF file or HF model directory (metadata only)\n"
        "  --model-config FILE   HF config.json (e.g. configs/models/Llama-3-70B.json)\n"
        "  --gpu NAME            a100-40gb, a100-80gb, h100-80gb, h200-141gb (default a100-80gb)\n"
        "  --gpu-memory-gb G     memory per GPU in GiB (overrides the preset)\n"
        "  --bandwidth-tbs B     HBM bandwidth per GPU in TB/s (0: no roofline)\n"
        "  --tflops T            dense BF16 peak per GPU in TFLOP/s\n"
        "  --num-gpus N          GPUs in total (default 1)\n"
        "  --tensor-parallel-size N  GPUs per replica (default: --num-gpus)\n"
        "  --weight-dtype D      bf16, fp16, fp8, int8, int4, f32, gguf (default: gguf for a\n"
        "                        GGUF file, else the config's torch_dtype)\n"
        "  --kv-dtype D          bf16, fp16, fp8, int8, int4, f32 (default bf16)\n"
        "  --gpu-memory-utilization F  share of memory the server uses (default 0.90)\n"
        "  --reserve-gb G        GiB per GPU kept for activations (default 0)\n"
        "  --kv-budget-gb G      KV budget per GPU in GiB, instead of memory - weights\n"
        "  --context N           context for the ops:byte table (default 4096)\n"
        "  --json                one JSON object instead of the report\n");
}

static int parse_pos_double(const char *s, double *out) {
    char *end;
    double v = strtod(s, &end);
    if (end == s || *end || !(v >= 0) || v > 1e9) return -1;
    *out = v;
    return 0;
}

int pgd_cli_kv_plan(int argc, char **argv) {
    const char *model = NULL, *config = NULL, *gpu = NULL, *wdt = NULL, *kvdt = NULL;
    double mem_gb = -1, bw = -1, tflops = -1, util = 0.90, reserve_gb = 0, budget_gb = 0;
    long n_gpus = 1, tp = 0, ctx = 4096;
    bool json = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        int bad = 0;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "--json")) {
            json = true;
            continue;
        }
        if (!v) {
            fprintf(stderr, "pagoda kv-plan: %s needs a value (see --help)\n", a);
            return 2;
        }
        if (!strcmp(a, "-m") || !strcmp(a, "--model"))
            model = v;
        else if (!strcmp(a, "--model-config"))
            config = v;
        else if (!strcmp(a, "--gpu"))
            gpu = v;
        else if (!strcmp(a, "--gpu-memory-gb"))
            bad = parse_pos_double(v, &mem_gb);
        else if (!strcmp(a, "--bandwidth-tbs"))
            bad = parse_pos_double(v, &bw);
        else if (!strcmp(a, "--tflops"))
            bad = parse_pos_double(v, &tflops);
        else if (!strcmp(a, "--num-gpus"))
            bad = pgd_cli_parse_long(v, 1, 65536, &n_gpus);
        else if (!strcmp(a, "--tensor-parallel-size"))
            bad = pgd_cli_parse_long(v, 1, 65536, &tp);
        else if (!strcmp(a, "--weight-dtype"))
            wdt = v;
        else if (!strcmp(a, "--kv-dtype"))
            kvdt = v;
        else if (!strcmp(a, "--gpu-memory-utilization"))
            bad = parse_pos_double(v, &util);
        else if (!strcmp(a, "--reserve-gb"))
            bad = parse_pos_double(v, &reserve_gb);
        else if (!strcmp(a, "--kv-budget-gb"))
            bad = parse_pos_double(v, &budget_gb);
        else if (!strcmp(a, "--context"))
            bad = pgd_cli_parse_long(v, 1, 1 << 24, &ctx);
        else {
            fprintf(stderr, "pagoda kv-plan: unknown option '%s' (see --help)\n", a);
            return 2;
        }
        if (bad) {
            fprintf(stderr, "pagoda kv-plan: bad value '%s' for %s\n", v, a);
            return 2;
        }
        i++;
    }
    if (!model == !config) {
        fprintf(stderr, "pagoda kv-plan: give exactly one of -m MODEL or --model-config FILE\n");
        return 2;
    }
    pgd_kv_plan_input in;
    pgd_kv_plan_input_init(&in);
    pgd_err err = {{0}};
    int rc = pgd_kv_plan_model_load(model ? model : config, &in.model, &err);
    if (rc) {
        fprintf(stderr, "pagoda kv-plan: %s\n", err.msg);
        return 1;
    }
    /* A preset unless every custom figure is given; explicit figures override the preset. */
    if (gpu || !(mem_gb >= 0 && bw >= 0 && tflops >= 0)) {
        if (pgd_kv_plan_gpu_preset(gpu ? gpu : "a100-80gb", &in.hw)) {
            fprintf(stderr,
                    "pagoda kv-plan: unknown GPU '%s' (a100-40gb, a100-80gb, h100-80gb, "
                    "h200-141gb, or --gpu-memory-gb/--bandwidth-tbs/--tflops)\n",
                    gpu ? gpu : "a100-80gb");
            return 2;
        }
        if (mem_gb >= 0 || bw >= 0 || tflops >= 0) strcat(in.hw.name, "*");
    } else {
        snprintf(in.hw.name, sizeof in.hw.name, "custom");
    }
    if (mem_gb >= 0) in.hw.mem_bytes = mem_gb * 1073741824.0;
    if (bw >= 0) in.hw.bandwidth_bytes_s = bw * 1e12;
    if (tflops >= 0) in.hw.flops = tflops * 1e12;
    in.hw.n_gpus = (int32_t)n_gpus;
    in.hw.tp = (int32_t)(tp ? tp : n_gpus);
    in.gpu_mem_util = util;
    in.reserve_bytes = reserve_gb * 1073741824.0;
    in.kv_budget_bytes = budget_gb * 1073741824.0;
    in.roofline_ctx = ctx;
    in.weight_dtype = in.model.file_bytes_per_param > 0 ? PGD_KV_PLAN_GGUF : in.model.config_dtype;
    if (wdt && pgd_kv_plan_dtype_parse(wdt, &in.weight_dtype)) {
        fprintf(stderr,
                "pagoda kv-plan: unknown weight dtype '%s' (bf16, fp16, fp8, int8, int4, "
                "f32, gguf)\n",
                wdt);
        return 2;
    }
    if (kvdt && (pgd_kv_plan_dtype_parse(kvdt, &in.kv_dtype) || in.kv_dtype == PGD_KV_PLAN_GGUF)) {
        fprintf(stderr,
                "pagoda kv-plan: unknown KV dtype '%s' (bf16, fp16, fp8, int8, int4, f32)\n", kvdt);
        return 2;
    }
    pgd_kv_plan plan;
    if ((rc = pgd_kv_plan_compute(&in, &plan, &err))) {
        fprintf(stderr, "pagoda kv-plan: %s\n", err.msg);
        return 1;
    }
    if (json) {
        char *js = NULL;
        if ((rc = pgd_kv_plan_to_json(&plan, &js, &err))) {
            fprintf(stderr, "pagoda kv-plan: %s\n", err.msg);
            return 1;
        }
        printf("%s\n", js);
        free(js);
    } else {
        pgd_kv_plan_print(&plan, stdout);
    }
    return 0;
}
