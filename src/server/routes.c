/* The route table: path, methods, how the route is served, and its handler. */
#include "server/internal.h"

static const route_def routes[] = {
    {"/v1/completions", R_COMPLETIONS, "POST", "POST", 0, pgd__route_generate},
    {"/v1/chat/completions", R_CHAT, "POST", "POST", 0, pgd__route_generate},
    {"/v1/embeddings", R_EMBED, "POST", "POST", 0, pgd__route_generate},
    {"/v1/completions/render", R_COMPLETIONS_RENDER, "POST", "POST", 0, pgd__route_generate},
    {"/v1/chat/completions/render", R_CHAT_RENDER, "POST", "POST", 0, pgd__route_generate},
    {"/v1/messages", R_MESSAGES, "POST", "POST", 0, pgd__route_generate},
    {"/v1/messages/count_tokens", R_COUNT_TOKENS, "POST", "POST", 0, pgd__route_generate},
    {"/v1/responses", R_RESPONSES, "POST", "POST", 0, pgd__route_generate},
    {"/v1/responses/*", R_STORED, "GET, DELETE, POST", "GET, HEAD, DELETE, POST",
     ROUTE_NO_ENGINE, pgd__answer_stored_response},
    {"/tokenize", R_TOKENIZE, "POST", "POST", 0, pgd__route_tokenize},
    {"/detokenize", R_DETOKENIZE, "POST", "POST", 0, pgd__route_tokenize},
    {"/v1/models", R_MODELS, "GET", "GET, HEAD", ROUTE_NO_ENGINE, pgd__answer_models},
    {"/v1/models/*", R_MODEL, "GET", "GET, HEAD", ROUTE_NO_ENGINE, pgd__answer_model},
    {"/health", R_HEALTH, "GET", "GET, HEAD", ROUTE_PUBLIC | ROUTE_NO_ENGINE, pgd__answer_health},
    {"/metrics", R_METRICS, "GET", "GET, HEAD", ROUTE_PUBLIC | ROUTE_NO_ENGINE, pgd__answer_metrics},
    {"/version", R_VERSION, "GET", "GET, HEAD", ROUTE_PUBLIC | ROUTE_NO_ENGINE, pgd__answer_version},
    {"/v1/kv_plan", R_KV_PLAN, "GET", "GET, HEAD", ROUTE_NO_ENGINE, pgd__answer_kv_plan},
    /* SGLang's worker contract (sglang-router and vllm-router read these) */
    {"/server_info", R_SERVER_INFO, "GET", "GET, HEAD", ROUTE_NO_ENGINE, pgd__answer_server_info},
    {"/get_server_info", R_SERVER_INFO, "GET", "GET, HEAD", ROUTE_NO_ENGINE,
     pgd__answer_server_info},
    {"/model_info", R_MODEL_INFO, "GET", "GET, HEAD", ROUTE_NO_ENGINE, pgd__answer_model_info},
    {"/get_model_info", R_MODEL_INFO, "GET", "GET, HEAD", ROUTE_NO_ENGINE, pgd__answer_model_info},
    {"/get_load", R_LOAD, "GET", "GET, HEAD", ROUTE_NO_ENGINE, pgd__answer_load},
    {"/flush_cache", R_FLUSH_CACHE, "POST", "POST", 0, pgd__flush_cache},
    /* the prefix cache's registered blocks, as its KV events describe them (kv_events.h) */
    {"/debug/kv_cache", R_KV_DUMP, "GET", "GET, HEAD", 0, pgd__kv_dump},
    {"/v1/load_lora_adapter", R_LORA_LOAD, "POST", "POST", ROUTE_LORA_ADMIN, pgd__lora_update},
    {"/v1/unload_lora_adapter", R_LORA_UNLOAD, "POST", "POST", ROUTE_LORA_ADMIN, pgd__lora_update},
};

const route_def *pgd__find_route(const char *url) {
    for (size_t i = 0; i < sizeof routes / sizeof routes[0]; i++) {
        const char *p = routes[i].path;
        size_t n = strlen(p);
        if (p[n - 1] == '*' ? !strncmp(url, p, n - 1) && url[n - 1] : !strcmp(url, p))
            return &routes[i];
    }
    return NULL;
}

/* Whether method is one of the list's ("GET, DELETE"); GET lets HEAD in. */
bool pgd__method_in(const char *list, const char *method) {
    const char *m = strcmp(method, "HEAD") ? method : "GET";
    size_t n = strlen(m);
    for (const char *p = strstr(list, m); p; p = strstr(p + 1, m))
        if ((p == list || p[-1] == ' ') && (p[n] == 0 || p[n] == ',')) return true;
    return false;
}
