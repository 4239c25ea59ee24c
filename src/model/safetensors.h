/* safetensors parsing (single files and the sharded model.safetensors.index.json layout).
 * The JSON header is bounded and every tensor extent is checked against the file. */
#ifndef PGD_MODEL_SAFETENSORS_H
#define PGD_MODEL_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "model/gguf.h"
#include "util/mapfile.h"
#include "util/status.h"

typedef struct pgd_st_tensor {
    char *name;         /* owned, NUL-terminated */
    pgd_type type;      /* F32, F16 or BF16 */
    uint32_t n_dims;
    uint64_t shape[4];  /* as in the file: shape[n_dims-1] is the innermost dimension */
    const void *data;   /* points into the file's mapping */
    uint64_t nbytes;
} pgd_st_tensor;

typedef struct pgd_st_file {
    char *path;         /* owned */
    pgd_mapfile map;    /* owned when opened from a path */
} pgd_st_file;

typedef struct pgd_safetensors {
    pgd_st_file *files;      /* (n_files) */
    size_t n_files;
    pgd_st_tensor *tensors;  /* (n_tensors), across all files */
    size_t n_tensors;
} pgd_safetensors;

/* Parses one safetensors buffer (borrowed) and appends its tensors to st. name is used in error
 * messages. Used directly by the fuzz tests. */
int pgd_st_parse(pgd_safetensors *st, const void *buf, size_t len, const char *name, pgd_err *err);
/* Opens one safetensors file. */
int pgd_st_open_file(pgd_safetensors *st, const char *path, pgd_err *err);
/* Opens DIR/model.safetensors, or every shard named by DIR/model.safetensors.index.json. */
int pgd_st_open_dir(pgd_safetensors *st, const char *dir, pgd_err *err);
void pgd_st_close(pgd_safetensors *st);
const pgd_st_tensor *pgd_st_find(const pgd_safetensors *st, const char *name);

#endif
