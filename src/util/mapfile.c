/* mmap of model files; small-file reading for JSON configs. */
#include "util/mapfile.h"
#include "util/env.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* Opens path for reading, refusing anything but a regular file. O_NONBLOCK keeps a FIFO given
 * as a model file from blocking the open until a writer comes; it changes nothing for a regular
 * file's reads. */
static int open_regular(const char *path, int *fd_out, struct stat *st, pgd_err *err) {
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) return pgd_err_set(err, PGD_EIO, "%s: cannot open: %s", path, strerror(errno));
    if (fstat(fd, st) != 0) {
        int e = errno;
        close(fd);
        return pgd_err_set(err, PGD_EIO, "%s: cannot stat: %s", path, strerror(e));
    }
    if (!S_ISREG(st->st_mode)) {
        close(fd);
        return pgd_err_set(err, PGD_EIO, "%s: not a regular file", path);
    }
    *fd_out = fd;
    return PGD_OK;
}

int pgd_mapfile_open(pgd_mapfile *m, const char *path, pgd_err *err) {
    m->data = NULL;
    m->size = 0;
    struct stat st;
    int fd = -1, rc = open_regular(path, &fd, &st, err);
    if (rc != PGD_OK) return rc;
    if (st.st_size > 0) {
        void *p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (p == MAP_FAILED) {
            int e = errno;
            close(fd);
            return pgd_err_set(err, PGD_EIO, "%s: cannot mmap: %s", path, strerror(e));
        }
        m->data = p;
        m->size = (size_t)st.st_size;
    }
    close(fd);
    return PGD_OK;
}

void pgd_mapfile_close(pgd_mapfile *m) {
    if (m->data) munmap((void *)m->data, m->size);
    m->data = NULL;
    m->size = 0;
}

int pgd_read_file(const char *path, char **out, size_t *len, pgd_err *err) {
    *out = NULL;
    FILE *f = fopen(path, "rb"); /* a pipe too: `pagoda batch -i <(...)` */
    if (!f) return pgd_err_set(err, errno == ENOENT ? PGD_ENOENT : PGD_EIO, "%s: cannot open: %s",
                               path, strerror(errno));
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap + 1);
    if (!buf) {
        fclose(f);
        return pgd_err_set(err, PGD_ENOMEM, "%s: out of memory", path);
    }
    for (;;) {
        size_t got = fread(buf + n, 1, cap - n, f);
        n += got;
        if (n < cap) break;
        char *nb = realloc(buf, cap * 2 + 1);
        if (!nb) {
            free(buf);
            fclose(f);
            return pgd_err_set(err, PGD_ENOMEM, "%s: out of memory", path);
        }
        buf = nb;
        cap *= 2;
    }
    int rerr = ferror(f);
    fclose(f);
    if (rerr) {
        free(buf);
        return pgd_err_set(err, PGD_EIO, "%s: read error", path);
    }
    buf[n] = 0;
    *out = buf;
    if (len) *len = n;
    return PGD_OK;
}

bool pgd_advise_hugepages(void *p, size_t n) {
    const char *env = pgd_env(PGD_ENV_HUGEPAGES);
    if (env && !strcmp(env, "0")) return false;
    char buf[128] = {0};
    FILE *f = fopen("/sys/kernel/mm/transparent_hugepage/enabled", "r");
    if (!f) return false;
    size_t got = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[got] = 0;
    return !strstr(buf, "[never]") && madvise(p, n, MADV_HUGEPAGE) == 0;
}
