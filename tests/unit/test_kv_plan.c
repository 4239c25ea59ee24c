/* The capacity planner's arithmetic against hand-computed cases: Llama-3-70B on 4 x A100-80GB,
 * SmolLM2-135M from its real GGUF, and inputs it must refuse. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "model/gguf.h"
#include "plan/kv_plan.h"
#include "test.h"

#define CHECK_NEAR(a, b, rel) CHECK(fabs((double)(a) - (double)(b)) <= (rel)*fabs((double)(b)))

static void test_llama3_70b(void) {
    pgd_kv_plan_input in;
    pgd_kv_plan_input_init(&in);
    pgd_err err = {{0}};
    CHECK_EQ_INT(pgd_kv_plan_model_load("configs/models/Llama-3-70B.json", &in.model, &err), 0);
    CHECK_EQ_INT(pgd_kv_plan_gpu_preset("a100-80gb", &in.hw), 0);
    in.hw.n_gpus = 4;
    in.hw.tp = 4;
    pgd_kv_plan p;
    CHECK_EQ_INT(pgd_kv_plan_compute(&in, &p, &err), 0);
    /* 80 layers x (Q 8192x8192 + K,V 8192x1024 x2 + O 8192x8192 + MLP 3x8192x28672 + 2 norms)
     * + embedding and LM head 128256x8192 each + final norm = 70,553,706,496 (the published
     * safetensors total). */
    CHECK_EQ_INT(p.n_params, 70553706496LL);
    /* KV: 2 (K and V) x 80 layers x 8 KV heads x 128 x 2 bytes = 327,680 B = 320 KiB. */
    CHECK_EQ_INT((int64_t)p.kv_bytes_per_token, 327680);
    CHECK_EQ_INT((int64_t)p.kv_bytes_per_token_per_gpu, 327680 / 4);
    /* Weights per GPU: norms (80 x 2 x 8192 + 8192 = 1,318,912) replicated, the rest / 4:
     * ((70,553,706,496 - 1,318,912) / 4 + 1,318,912) x 2 B = 35,278,831,616 B (32.86 GiB). */
    CHECK_EQ_INT((int64_t)p.weight_bytes_per_gpu, 35278831616LL);
    CHECK_EQ_INT((int64_t)p.weight_bytes_total, 141107412992LL);
    /* KV budget: 80 GiB x 0.90 - weights = 77,309,411,328 - 35,278,831,616 = 42,030,579,712;
     * tokens = floor(42,030,579,712 / 81,920) = 513,068. */
    CHECK_EQ_INT((int64_t)p.kv_budget_bytes_per_gpu, 42030579712LL);
    CHECK_EQ_INT(p.max_kv_tokens, 513068);
    /* Users: 513,068 / 2048, 4096, 32768, 131072. */
    CHECK_EQ_INT(p.max_users[0], 250);
    CHECK_EQ_INT(p.max_users[1], 125);
    CHECK_EQ_INT(p.max_users[2], 15);
    CHECK_EQ_INT(p.max_users[3], 3);
    /* Roofline at batch 1, 2k context: each GPU streams its shard without the input embedding
     * ((70,553,706,496 - 1,050,673,152 - 1,318,912) / 4 + 1,318,912) x 2 = 34,753,495,040 B plus
     * 2048 x 81,920 B of KV, at 2.039 TB/s: 1 / (34,921,267,200 / 2.039e12) = 58.39 tok/s. */
    CHECK_EQ_INT((int64_t)p.streamed_bytes_per_gpu, 34753495040LL);
    CHECK(p.has_roofline);
    CHECK_NEAR(p.roof[0].per_user_tok_s, 2.039e12 / 34921267200.0, 1e-12);
    /* At the batch that fits (250 x 2048 tokens of KV) still bandwidth-bound:
     * 250 / ((34,753,495,040 + 250 x 2048 x 81,920) / 2.039e12) = 6,646.3 tok/s. */
    CHECK_EQ_INT(p.roof[0].max_batch, 250);
    CHECK(!p.roof[0].compute_bound);
    CHECK_NEAR(p.roof[0].aggregate_tok_s, 250.0 * 2.039e12 / (34753495040.0 + 250.0 * 2048 * 81920),
               1e-12);
    /* Crossover 312e12 / 2.039e12 = 153 FLOP/byte; batch 1 decode is ~1 FLOP/byte. */
    CHECK_NEAR(p.crossover_ops_per_byte, 312e12 / 2.039e12, 1e-12);
    CHECK(p.ops_per_byte[0] > 0.9 && p.ops_per_byte[0] < 1.2);
    for (int i = 1; i < PGD_KV_PLAN_N_BATCH; i++)
        CHECK(p.ops_per_byte[i] > p.ops_per_byte[i - 1]);

    /* JSON: the keys the issue names. */
    char *js = NULL;
    CHECK_EQ_INT(pgd_kv_plan_json(&in, &js, &err), 0);
    cJSON *o = cJSON_Parse(js);
    CHECK(o != NULL);
    CHECK_EQ_INT(cJSON_GetObjectItem(o, "kv_bytes_per_token")->valuedouble, 327680);
    CHECK_EQ_INT(cJSON_GetObjectItem(o, "weight_bytes_per_gpu")->valuedouble, 35278831616LL);
    CHECK_EQ_INT(cJSON_GetObjectItem(o, "max_kv_tokens")->valuedouble, 513068);
    CHECK_EQ_INT(cJSON_GetObjectItem(cJSON_GetObjectItem(o, "max_users"), "131072")->valuedouble,
                 3);
    cJSON *r = cJSON_GetObjectItem(cJSON_GetObjectItem(o, "decode_roofline_tok_s"), "2048");
    CHECK(r && fabs(cJSON_GetObjectItem(r, "batch_1_per_user")->valuedouble - 58.3885) < 1e-3);
    cJSON_Delete(o);
    free(js);

    /* FP8 KV halves the bytes per token: floor(42,030,579,712 / 40,960) = 1,026,137 tokens. */
    in.kv_dtype = PGD_KV_PLAN_FP8;
    CHECK_EQ_INT(pgd_kv_plan_compute(&in, &p, &err), 0);
    CHECK_EQ_INT((int64_t)p.kv_bytes_per_token, 163840);
    CHECK_EQ_INT(p.max_kv_tokens, 1026137);
    /* 8 GPUs as 2 replicas of TP 4: twice the tokens and users. */
    in.kv_dtype = PGD_KV_PLAN_BF16;
    in.hw.n_gpus = 8;
    CHECK_EQ_INT(pgd_kv_plan_compute(&in, &p, &err), 0);
    CHECK_EQ_INT(p.n_replicas, 2);
    CHECK_EQ_INT(p.max_kv_tokens, 2 * 513068);
    CHECK_EQ_INT(p.max_users[0], 500);
    /* TP 16 > 8 KV heads: each GPU keeps one (replicated) KV head. */
    in.hw.n_gpus = 16;
    in.hw.tp = 16;
    CHECK_EQ_INT(pgd_kv_plan_compute(&in, &p, &err), 0);
    CHECK_EQ_INT((int64_t)p.kv_bytes_per_token_per_gpu, 2 * 80 * 1 * 128 * 2);
}

static void test_smollm2_gguf(void) {
    const char *path = "models/SmolLM2-135M-Instruct.Q4_1.gguf";
    if (access(path, R_OK)) {
        printf("skip: %s missing (scripts/fetch-default-model.sh)\n", path);
        return;
    }
    pgd_kv_plan_input in;
    pgd_kv_plan_input_init(&in);
    pgd_err err = {{0}};
    CHECK_EQ_INT(pgd_kv_plan_model_load(path, &in.model, &err), 0);
    const pgd_kv_plan_model *m = &in.model;
    CHECK_EQ_INT(m->n_layer, 30);
    CHECK_EQ_INT(m->dim, 576);
    CHECK_EQ_INT(m->n_head, 9);
    CHECK_EQ_INT(m->n_kv_head, 3);
    CHECK_EQ_INT(m->head_dim, 64);
    CHECK_EQ_INT(m->ffn_dim, 1536);
    CHECK_EQ_INT(m->n_vocab, 49152);
    CHECK(m->tied_embeddings);
    CHECK(m->file_bytes_per_param > 0.5 && m->file_bytes_per_param < 1.0);
    /* The server's own setting: F32 KV in a 512 MiB budget. 2 x 30 x 3 x 64 x 4 = 46,080 B per
     * token; 536,870,912 / 46,080 = 11,650 tokens; no roofline without a bandwidth. */
    in.weight_dtype = PGD_KV_PLAN_GGUF;
    in.kv_dtype = PGD_KV_PLAN_F32;
    in.kv_budget_bytes = 512.0 * 1048576;
    pgd_kv_plan p;
    CHECK_EQ_INT(pgd_kv_plan_compute(&in, &p, &err), 0);
    /* 30 x (2 x 576 x 576 + 2 x 576 x 192 + 3 x 576 x 1536 + 2 x 576) + 49152 x 576 + 576 */
    CHECK_EQ_INT(p.n_params, 134515008);
    CHECK_EQ_INT((int64_t)p.kv_bytes_per_token, 46080);
    CHECK_EQ_INT(p.max_kv_tokens, 11650);
    CHECK_EQ_INT(p.max_users[0], 5);
    CHECK(!p.has_roofline);
    /* The weights are planned at the file's size: tensor bytes summed over the file. */
    pgd_gguf g;
    CHECK_EQ_INT(pgd_gguf_open(&g, path, &err), 0);
    double bytes = 0, elems = 0;
    for (uint64_t i = 0; i < g.n_tensors; i++) {
        bytes += (double)g.tensors[i].nbytes;
        elems += (double)g.tensors[i].ne[0] * g.tensors[i].ne[1] * g.tensors[i].ne[2] *
                 g.tensors[i].ne[3];
    }
    pgd_gguf_close(&g);
    CHECK_EQ_INT((int64_t)elems, 134515008);
    CHECK_NEAR(p.weight_bytes_total, bytes, 1e-9);
    char *js = NULL;
    CHECK_EQ_INT(pgd_kv_plan_json(&in, &js, &err), 0);
    CHECK(js && strstr(js, "\"decode_roofline_tok_s\":null"));
    free(js);
    /* BF16 KV: 23,040 B per token (22.5 KiB). */
    in.kv_dtype = PGD_KV_PLAN_BF16;
    CHECK_EQ_INT(pgd_kv_plan_compute(&in, &p, &err), 0);
    CHECK_EQ_INT((int64_t)p.kv_bytes_per_token, 23040);
}

static void test_bad_input(void) {
    pgd_kv_plan_input in;
    pgd_kv_plan_input_init(&in);
    pgd_err err = {{0}};
    pgd_kv_plan p;
    CHECK_EQ_INT(pgd_kv_plan_model_load("configs/models/nope.json", &in.model, &err), PGD_ENOENT);
    CHECK(strstr(err.msg, "nope.json") != NULL);
    char tmp[] = "/tmp/pgd_kv_plan_XXXXXX";
    int fd = mkstemp(tmp);
    CHECK(fd >= 0);
    const char *bad =
        "{\"num_hidden_layers\": 32, \"num_attention_heads\": 32, \"vocab_size\": 1000,"
        " \"intermediate_size\": 100}";
    CHECK(write(fd, bad, strlen(bad)) == (ssize_t)strlen(bad));
    close(fd);
    CHECK_EQ_INT(pgd_kv_plan_model_load(tmp, &in.model, &err), PGD_EFORMAT);
    CHECK(strstr(err.msg, "hidden_size") != NULL);
    FILE *f = fopen(tmp, "w");
    fputs("{\"num_hidden_layers\": -3}", f);
    fclose(f);
    CHECK_EQ_INT(pgd_kv_plan_model_load(tmp, &in.model, &err), PGD_EFORMAT);
    f = fopen(tmp, "w");
    fputs("not json", f);
    fclose(f);
    CHECK_EQ_INT(pgd_kv_plan_model_load(tmp, &in.model, &err), PGD_EFORMAT);
    unlink(tmp);

    CHECK_EQ_INT(pgd_kv_plan_model_load("configs/models/Llama-3-70B.json", &in.model, &err), 0);
    CHECK_EQ_INT(pgd_kv_plan_gpu_preset("b200", &in.hw), PGD_ENOENT);
    CHECK_EQ_INT(pgd_kv_plan_gpu_preset("H100-80GB", &in.hw), 0);
    in.hw.n_gpus = 4;
    in.hw.tp = 3; /* does not divide 4 GPUs */
    CHECK_EQ_INT(pgd_kv_plan_compute(&in, &p, &err), PGD_EINVAL);
    in.hw.n_gpus = 6;
    in.hw.tp = 6; /* does not divide 64 heads */
    CHECK_EQ_INT(pgd_kv_plan_compute(&in, &p, &err), PGD_EINVAL);
    in.hw.n_gpus = in.hw.tp = 1;
    in.weight_dtype = PGD_KV_PLAN_GGUF; /* no file to take sizes from */
    CHECK_EQ_INT(pgd_kv_plan_compute(&in, &p, &err), PGD_EINVAL);
    in.weight_dtype = PGD_KV_PLAN_BF16;
    in.gpu_mem_util = 1.5;
    CHECK_EQ_INT(pgd_kv_plan_compute(&in, &p, &err), PGD_EINVAL);
    in.gpu_mem_util = 0.9;
    in.model.n_kv_head = 7; /* 64 heads are not a multiple of 7 */
    CHECK_EQ_INT(pgd_kv_plan_compute(&in, &p, &err), PGD_EINVAL);
    in.model.n_kv_head = 0;
    CHECK_EQ_INT(pgd_kv_plan_compute(&in, &p, &err), PGD_EINVAL);
    /* Weights beyond memory: planned, not refused; nothing fits. */
    CHECK_EQ_INT(pgd_kv_plan_model_load("configs/models/Llama-3-405B.json", &in.model, &err), 0);
    CHECK_EQ_INT(pgd_kv_plan_compute(&in, &p, &err), 0);
    CHECK(p.kv_budget_bytes_per_gpu < 0);
    CHECK_EQ_INT(p.max_kv_tokens, 0);
    CHECK_EQ_INT(p.max_users[0], 0);
    CHECK_EQ_INT(p.roof[0].aggregate_tok_s, 0);
    pgd_kv_plan_dtype d;
    CHECK_EQ_INT(pgd_kv_plan_dtype_parse("FP8", &d), 0);
    CHECK_EQ_INT(d, PGD_KV_PLAN_FP8);
    CHECK_EQ_INT(pgd_kv_plan_dtype_parse("int3", &d), PGD_EINVAL);
}

int main(void) {
    test_llama3_70b();
    test_smollm2_gguf();
    test_bad_input();
    return test_report("test_kv_plan");
}
