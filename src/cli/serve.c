/* `pagoda serve`: configuration, then the server loop (src/server). */
#include <stdio.h>

#include "cli/cli.h"
#include "server/config.h"

int pgd_serve(const pgd_server_config *cfg);

int pgd_cli_serve(int argc, char **argv) {
    pgd_server_config cfg;
    int rc = pgd_server_config_load(&cfg, argc, argv);
    if (rc) {
        pgd_server_config_free(&cfg);
        return rc > 0 ? 0 : 2;
    }
    rc = pgd_serve(&cfg);
    pgd_server_config_free(&cfg);
    return rc;
}
