/*
 * wal/crc32c.c -- CRC32C (Castagnoli, reflected polynomial 0x82F63B78),
 * the checksum of every record. The SSE4.2 crc32 instruction when the CPU
 * has it (chosen once, at first use), else slicing-by-8 tables.
 */
#include <pthread.h>
#include <string.h>

#include "keel_wal/wal.h"

static uint32_t table[8][256];
static pthread_once_t once = PTHREAD_ONCE_INIT;
static int how;                   /* 1 = software, 2 = hardware (set once) */

static void init_tables(void)
{
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++)
            c = c & 1 ? (c >> 1) ^ 0x82F63B78u : c >> 1;
        table[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; i++)
        for (int t = 1; t < 8; t++)
            table[t][i] = (table[t - 1][i] >> 8) ^ table[0][table[t - 1][i] & 0xff];
}

static uint32_t crc_soft(uint32_t crc, const unsigned char *p, size_t n)
{
    while (n && ((uintptr_t)p & 7)) {
        crc = (crc >> 8) ^ table[0][(crc ^ *p++) & 0xff];
        n--;
    }
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        w ^= crc;
        crc = table[7][w & 0xff] ^ table[6][(w >> 8) & 0xff] ^ table[5][(w >> 16) & 0xff] ^
              table[4][(w >> 24) & 0xff] ^ table[3][(w >> 32) & 0xff] ^ table[2][(w >> 40) & 0xff] ^
              table[1][(w >> 48) & 0xff] ^ table[0][w >> 56];
        p += 8;
        n -= 8;
    }
    while (n--)
        crc = (crc >> 8) ^ table[0][(crc ^ *p++) & 0xff];
    return crc;
}

#if defined(__x86_64__)
__attribute__((target("sse4.2"))) static uint32_t crc_hw(uint32_t crc, const unsigned char *p, size_t n)
{
    uint64_t c = crc;
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        c = __builtin_ia32_crc32di(c, w);
        p += 8;
        n -= 8;
    }
    uint32_t c32 = (uint32_t)c;
    while (n--)
        c32 = __builtin_ia32_crc32qi(c32, *p++);
    return c32;
}
#endif

static void choose(void)
{
    init_tables();
#if defined(__x86_64__)
    __builtin_cpu_init();
    how = __builtin_cpu_supports("sse4.2") ? 2 : 1;
#else
    how = 1;
#endif
}

uint32_t kw_crc32c(uint32_t crc, const void *p, size_t n)
{
    pthread_once(&once, choose);
    crc = ~crc;
#if defined(__x86_64__)
    if (how == 2)
        return ~crc_hw(crc, p, n);
#endif
    return ~crc_soft(crc, p, n);
}
