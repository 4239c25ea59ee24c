/* TEMPORARY (removed once src/api/anthropic.c lands): links the server before the dialect. */
#include "api/dialect.h"
const pgd_dialect pgd_dialect_anthropic = {.name = "anthropic"};
