// What a copy into a freshly mapped memfd costs this machine, against copies through the
// file: the probe behind the simulated GPU's file-backed copies (tests/simgpu/src/memory.rs,
// `file_at`; docs/rerun.md, "Session 28").
//
//   gcc -O2 -o /tmp/memfd_copy bench/simgpu/memfd_copy.c && /tmp/memfd_copy [KiB]
//
// A VMM mapping on the simulated GPU is a memfd mapped MAP_SHARED at the tensor's address, and
// the memory manager remaps for nearly every move, so each copy meets page tables that are not
// there yet: one fault per 4 KiB page, where a card's copy engine has no such cost.
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

static double now_us(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

static char *map(int fd, size_t n) {
    char *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
        perror("mmap");
        exit(1);
    }
    return p;
}

int main(int argc, char **argv) {
    size_t n = (argc > 1 ? (size_t)atol(argv[1]) : 512) << 10;
    const int rounds = 200;
    int a = memfd_create("a", 0), b = memfd_create("b", 0);
    if (a < 0 || b < 0 || ftruncate(a, n) || ftruncate(b, n)) {
        perror("memfd");
        return 1;
    }
    char *p = map(a, n);
    memset(p, 1, n);
    munmap(p, n);
    p = map(b, n);
    memset(p, 2, n);
    munmap(p, n);
    char *host = malloc(n);
    memset(host, 3, n);

    double t, fresh = 0, unmap_populated = 0, unmap_bare = 0, cfr = 0, pw = 0;
    for (int i = 0; i < rounds; i++) {
        char *x = map(a, n), *y = map(b, n);
        t = now_us();
        memcpy(y, x, n);
        fresh += now_us() - t;
        t = now_us();
        munmap(x, n);
        munmap(y, n);
        unmap_populated += now_us() - t;

        loff_t from = 0, to = 0;
        t = now_us();
        if (copy_file_range(a, &from, b, &to, n, 0) != (ssize_t)n) {
            perror("copy_file_range");
            return 1;
        }
        cfr += now_us() - t;
        t = now_us();
        if (pwrite(b, host, n, 0) != (ssize_t)n) {
            perror("pwrite");
            return 1;
        }
        pw += now_us() - t;

        x = map(a, n);
        y = map(b, n);
        t = now_us();
        munmap(x, n);
        munmap(y, n);
        unmap_bare += now_us() - t;
    }
    printf("per %zu KiB, mean of %d:\n", n >> 10, rounds);
    printf("  memcpy between two fresh mappings  %7.1f us\n", fresh / rounds);
    printf("  copy_file_range between the files  %7.1f us\n", cfr / rounds);
    printf("  pwrite from host memory            %7.1f us\n", pw / rounds);
    printf("  munmap of both, populated          %7.1f us\n", unmap_populated / rounds);
    printf("  munmap of both, never touched      %7.1f us\n", unmap_bare / rounds);
    return 0;
}
