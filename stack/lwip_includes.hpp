// SPDX-License-Identifier: MIT
// lwIP headers for the glue code that also sees DPDK/glibc network headers. glibc's <netinet/ip.h> (pulled
// in by DPDK's rte_ip.h) and lwIP's prot/ip4.h both define IP_RF/IP_DF/IP_MF/IP_OFFMASK with the same
// values; lwIP's definitions win inside this project's glue. (lwIP's htons macros are off in lwipopts.h.)
#pragma once

#undef IP_RF
#undef IP_DF
#undef IP_MF
#undef IP_OFFMASK

#include "lwip/etharp.h"
#include "lwip/init.h"
#include "lwip/memp.h"
#include "lwip/netif.h"
#include "lwip/pbuf.h"
#include "lwip/priv/tcp_priv.h"
#include "lwip/stats.h"
#include "lwip/sys.h"
#include "lwip/tcp.h"
#include "lwip/timeouts.h"
#include "netif/ethernet.h"
