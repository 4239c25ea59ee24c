/* GGUF v2/v3 parsing: header, metadata key/values, tensor infos, alignment.
 * The parser never reads outside the buffer it is given; every string, array and tensor
 * extent is checked against it. Strings point into the mapping and are NOT NUL-terminated. */
#ifndef PGD_MODEL_GGUF_H
#define PGD_MODEL_GGUF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/types.h"
#include "util/mapfile.h"
#include "util/status.h"

/* GGUF metadata value types. */
typedef enum {
    PGD_GGUF_U8 = 0, PGD_GGUF_I8 = 1, PGD_GGUF_U16 = 2, PGD_GGUF_I16 = 3,
    PGD_GGUF_U32 = 4, PGD_GGUF_I32 = 5, PGD_GGUF_F32 = 6, PGD_GGUF_BOOL = 7,
    PGD_GGUF_STRING = 8, PGD_GGUF_ARRAY = 9, PGD_GGUF_U64 = 10, PGD_GGUF_I64 = 11,
    PGD_GGUF_F64 = 12,
} pgd_gguf_vtype;

typedef struct pgd_str {
    const char *ptr; /* (len) bytes, not NUL-terminated */
    uint64_t len;
} pgd_str;

typedef struct pgd_gguf_kv {
    pgd_str key;
    pgd_gguf_vtype type;
    union {
        uint64_t u;  /* any unsigned integer type, bool */
        int64_t i;   /* any signed integer type */
        double f;    /* F32, F64 */
        pgd_str s;   /* STRING */
    } v;
    /* ARRAY only: */
    pgd_gguf_vtype arr_type;
    uint64_t arr_n;
    const void *arr_data; /* numeric arrays: (arr_n) packed little-endian elements */
    pgd_str *arr_str;     /* STRING arrays: (arr_n) strings, malloc'd index into the mapping */
} pgd_gguf_kv;

typedef struct pgd_gguf_tensor {
    pgd_str name;
    uint32_t n_dims;
    uint64_t ne[4];     /* ne[0] is the innermost (contiguous) dimension; unused dims are 1 */
    pgd_type type;
    uint64_t offset;    /* relative to the data section */
    const void *data;   /* points into the mapping */
    uint64_t nbytes;
} pgd_gguf_tensor;

typedef struct pgd_gguf {
    const char *path;   /* borrowed; used in error messages */
    pgd_mapfile map;    /* owned when opened with pgd_gguf_open */
    uint32_t version;
    uint64_t n_kv;
    pgd_gguf_kv *kv;    /* (n_kv) */
    uint64_t n_tensors;
    pgd_gguf_tensor *tensors; /* (n_tensors) */
    uint64_t alignment;
    const unsigned char *data; /* start of the tensor data section */
} pgd_gguf;

/* Opens and parses path. path is borrowed and must outlive g. */
int pgd_gguf_open(pgd_gguf *g, const char *path, pgd_err *err);
/* Parses an in-memory buffer (borrowed); name is used in error messages. Used by fuzzers. */
int pgd_gguf_parse(pgd_gguf *g, const void *buf, size_t len, const char *name, pgd_err *err);
void pgd_gguf_close(pgd_gguf *g);

const pgd_gguf_kv *pgd_gguf_find(const pgd_gguf *g, const char *key);
const pgd_gguf_tensor *pgd_gguf_find_tensor(const pgd_gguf *g, const char *name);

/* Typed getters: PGD_ENOENT if the key is missing, PGD_EFORMAT if the type does not fit.
 * Integer getters accept any integer type whose value fits. */
int pgd_gguf_get_u32(const pgd_gguf *g, const char *key, uint32_t *out);
int pgd_gguf_get_f32(const pgd_gguf *g, const char *key, float *out);
int pgd_gguf_get_bool(const pgd_gguf *g, const char *key, bool *out);
int pgd_gguf_get_str(const pgd_gguf *g, const char *key, pgd_str *out);
/* Array getter: checks the element type (arr_type) and returns the kv. */
int pgd_gguf_get_arr(const pgd_gguf *g, const char *key, pgd_gguf_vtype elem, const pgd_gguf_kv **out);

bool pgd_str_eq(pgd_str s, const char *cstr);
/* A name made safe for a one-line message: at most 64 bytes, control bytes replaced by '?'. */
typedef struct pgd_name_buf { char s[72]; } pgd_name_buf;
const char *pgd_str_safe(pgd_str s, pgd_name_buf *b);

#endif
