/*
 * swap_bench.c: the swapper's sustained bandwidth (zck_swap, the path NVMe offload takes):
 * write a swap file of SIZE bytes sequentially in BLOCK-byte requests with DEPTH in flight
 * from rotating aligned buffers of non-zero data, then read it back the same way. Prints one
 * line per direction: "swap write <bytes/s>" and "swap read <bytes/s>", plus whether O_DIRECT
 * was used. Usage: swap_bench PATH SIZE_MIB BLOCK_BYTES DEPTH
 */
#include "zck.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

int main(int argc, char **argv)
{
    if (argc != 5) {
        fprintf(stderr, "usage: swap_bench PATH SIZE_MIB BLOCK_BYTES DEPTH\n");
        return 2;
    }
    const char *path = argv[1];
    uint64_t size = strtoull(argv[2], NULL, 10) << 20;
    size_t block = strtoull(argv[3], NULL, 10);
    unsigned depth = (unsigned)strtoul(argv[4], NULL, 10);
    if (!size || !block || !depth || size % block) {
        fprintf(stderr, "swap_bench: SIZE must be a positive multiple of BLOCK\n");
        return 2;
    }
    unsigned char *buf = NULL;
    if (posix_memalign((void **)&buf, 4096, (size_t)depth * block)) {
        fprintf(stderr, "swap_bench: out of memory\n");
        return 1;
    }
    for (size_t i = 0; i < (size_t)depth * block; i++) /* not zeros: the disk favours those */
        buf[i] = (unsigned char)(i * 2654435761u >> 13) | 1;
    zck_swap *s;
    if (zck_swap_open(&s, path, size, depth, block)) {
        fprintf(stderr, "swap_bench: %s\n", zr_err_msg());
        return 1;
    }
    uint64_t *t = calloc(depth, sizeof *t);
    for (int dir = 0; dir < 2; dir++) {
        double t0 = now_s();
        for (uint64_t off = 0, k = 0; off < size; off += block, k++) {
            unsigned slot = (unsigned)(k % depth);
            unsigned char *b = buf + (size_t)slot * block;
            int rc = zck_swap_wait(s, t[slot]);
            if (!rc)
                rc = dir == 0 ? zck_swap_write(s, b, block, off, &t[slot])
                              : zck_swap_read(s, b, block, off, &t[slot]);
            if (rc) {
                fprintf(stderr, "swap_bench: %s\n", zr_err_msg());
                return 1;
            }
        }
        if (zck_swap_wait(s, UINT64_MAX)) {
            fprintf(stderr, "swap_bench: %s\n", zr_err_msg());
            return 1;
        }
        double dt = now_s() - t0;
        printf("swap %s %.0f\n", dir == 0 ? "write" : "read", (double)size / dt);
    }
    printf("swap direct %d\n", zck_swap_direct(s));
    zck_swap_close(s, 1);
    free(t);
    free(buf);
    return 0;
}
