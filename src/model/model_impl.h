/* What model.c, config.c and dummy.c share: the model loader's parts, internal to src/model.
 * model.c loads (tensors, weights, placement on devices and ranks); config.c reads a GGUF's
 * metadata or a Hugging Face config.json into pgd_model_config (RoPE scaling, windows, Gemma,
 * MoE); dummy.c makes random weights of a config's shapes (--load-format dummy). */
#ifndef PGD_MODEL_MODEL_IMPL_H
#define PGD_MODEL_MODEL_IMPL_H

#include <cjson/cJSON.h>

#include "model/model.h"

/* config.c: the configuration readers; c's Hugging Face names (architecture NULL: the class
 * model_type's models have) */
void pgd__model_names(pgd_model_config *c, const char *model_type, const char *architecture);
bool pgd__gemma_arch(pgd_arch a);
int pgd__gguf_config(pgd_model *m, pgd_err *err);
int pgd__hf_config_file(pgd_model *m, const char *path, pgd_err *err);
int pgd__hf_config(pgd_model *m, const char *dir, pgd_err *err);

/* dummy.c */
int pgd__load_dummy(pgd_model *m, const pgd_model_opts *opts, pgd_err *err);

/* model.c: the loader's helpers the others use */
int pgd__own(pgd_model *m, void *p, pgd_err *err);
void pgd__moe_add_shared(pgd_moe *moe, const pgd_layer *l, int32_t ffn_dim);
pgd_moe pgd__experts_moe(const pgd_model_config *c, const pgd_weight *ex, int32_t ffn_dim);

#endif
