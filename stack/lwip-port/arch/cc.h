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
#ifdef __cplusplus
}
#endif

#define LWIP_PLATFORM_DIAG(x)          do { softrdma_lwip_diag x; } while (0)
#define LWIP_PLATFORM_ASSERT(x)        softrdma_lwip_assert((x), __FILE__, __LINE__)
#define LWIP_RAND()                    softrdma_lwip_rand()
#define LWIP_TIMEVAL_PRIVATE           0
#define LWIP_NO_CTYPE_H                0

#endif
