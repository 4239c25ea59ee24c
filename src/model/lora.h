/* LoRA adapters: low-rank deltas on a loaded model's matrices, read from a PEFT adapter directory
 * (adapter_config.json and adapter_model.safetensors, as PeftModel.save_pretrained writes them).
 * A matrix W of the model with an adapter computes y = W x + scale * B (A x), as PEFT's LoRA
 * layer does (scale = lora_alpha / r, or lora_alpha / sqrt(r) with use_rslora); A and B stay
 * apart (never merged into W), so one model serves many adapters and the base model at once, each
 * sequence of a batch with its own (forward.c, pgd_batch.seq_lora). */
#ifndef PGD_MODEL_LORA_H
#define PGD_MODEL_LORA_H

#include <stdint.h>

#include "model/model.h"
#include "util/status.h"

/* The largest rank read (vLLM's --max-lora-rank tops out at 512 too). */
#define PGD_LORA_MAX_RANK 512

/* A and B keep the file's element type when both have the same one of F32, F16 and BF16 (the
 * op widens each element exactly, so the results are those of F32 copies); mixed types are
 * widened to F32 at load. */
typedef struct pgd_lora_matrix {
    void *a;        /* (rank, n_in), owned; NULL: the adapter leaves this matrix alone */
    void *bt;       /* B transposed, (rank, n_out), owned; outputs in the model's order (a GGUF
                       llama file's Q/K rows are permuted for adjacent-pair RoPE, so are these) */
    pgd_type type;  /* of both */
} pgd_lora_matrix;

typedef struct pgd_lora {
    char *path;          /* owned: the adapter directory */
    int32_t rank;
    float scale;
    int32_t n_layer;
    /* (n_layer * PGD_LAYER_N_MATRICES), per layer in PGD_LAYER_MATRICES order (model.h): the
     * model's full (unsharded) matrices */
    pgd_lora_matrix *m;
    int32_t n_matrices;  /* of those, the ones the adapter changes */
} pgd_lora;

/* Matrix mi's (n_out, n_in) in model m (PGD_LAYER_MATRICES order), full size; false when layer
 * il has no such matrix (a mixture-of-experts layer's FFN). */
bool pgd_lora_matrix_shape(const pgd_model *m, int32_t il, int mi, int64_t *n_out,
                           int64_t *n_in);

/* Reads the adapter in directory dir for model m (its shapes checked against m's). Refuses, in
 * one line naming the file, what it would otherwise have to ignore: a tensor of any module other
 * than the attention's q/k/v/o projections and the dense FFN's gate/up/down, DoRA, LoRA biases,
 * modules_to_save, per-module rank or alpha patterns, pickled (.bin) weights. */
int pgd_lora_load(const char *dir, const pgd_model *m, pgd_lora **out, pgd_err *err);
void pgd_lora_free(pgd_lora *l);

#endif
