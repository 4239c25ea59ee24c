/* TEMPORARY (removed once src/api/responses.c lands): links the server before the dialect. */
#include "api/responses.h"
const pgd_dialect pgd_dialect_responses = {.name = "responses"};
bool pgd_responses_background(const void *state) { (void)state; return false; }
char *pgd_responses_snapshot(void *state) { (void)state; return NULL; }
void pgd_responses_mark_cancelled(void *state) { (void)state; }
