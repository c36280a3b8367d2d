/* lwIP architecture glue for softrdma (Linux, x86_64/aarch64, gcc). */
#ifndef SOFTRDMA_LWIP_ARCH_CC_H
#define SOFTRDMA_LWIP_ARCH_CC_H

#include <stdint.h>
#include <stdlib.h>

#ifdef __cplusplus
extern "C" {
#endif
/* Defined in stack/sys_arch.cpp. */
void softrdma_lwip_assert(const char *msg, const char *file, int line);
void softrdma_lwip_diag(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
uint32_t softrdma_lwip_rand(void);
/* LWIP_CHKSUM (lwipopts.h): base/inet_sum.hpp's sum of len bytes, folded to 16 bits, not complemented. */
uint16_t softrdma_lwip_chksum(const void *data, int len);
#ifdef __cplusplus
}
#endif

#define LWIP_PLATFORM_DIAG(x)          do { softrdma_lwip_diag x; } while (0)
#define LWIP_PLATFORM_ASSERT(x)        softrdma_lwip_assert((x), __FILE__, __LINE__)
#define LWIP_RAND()                    softrdma_lwip_rand()
#define LWIP_TIMEVAL_PRIVATE           0
#define LWIP_NO_CTYPE_H                0

/* Byte order as compiler builtins: lwIP's def.c would otherwise compile lwip_htons/htonl as functions, called
 * some 30 times per segment sent and received. */
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
#define lwip_htons(x)                  ((uint16_t)__builtin_bswap16((uint16_t)(x)))
#define lwip_htonl(x)                  ((uint32_t)__builtin_bswap32((uint32_t)(x)))
#endif

#endif
