/* softrdma's lwIP 2.1.3 configuration (compiled from Debian's `lwip` source package by meson).
 *
 * One lwIP instance per process, raw API only, NO_SYS=1: lwIP is driven by the thread that owns it
 * (stack::Stack::poll: RX input, timers, TX flush). Every pool is a static array sized here, with its sizing
 * rule beside it; nothing calls malloc. When a pool runs dry lwIP returns ERR_MEM (tcp_write: back-pressure,
 * the writer retries after ACKs) or drops an input frame (TCP retransmits it) — never an allocation.
 */
#ifndef SOFTRDMA_LWIPOPTS_H
#define SOFTRDMA_LWIPOPTS_H

/* ---- system --------------------------------------------------------------------------------------- */
#define NO_SYS                          1
#define LWIP_SOCKET                     0
#define LWIP_NETCONN                    0
#define LWIP_TIMERS                     1    /* sys_check_timeouts() from the polling loop */
#define SYS_LIGHTWEIGHT_PROT            0    /* single owner thread, asserted in stack/ */
#define LWIP_ERRNO_STDINCLUDE           1
#define LWIP_DONT_PROVIDE_BYTEORDER_FUNCTIONS 1  /* no htons() macros clashing with glibc's */

/* ---- memory: static pools, never malloc ------------------------------------------------------------ */
#define MEM_LIBC_MALLOC                 0
#define MEMP_MEM_MALLOC                 0
#define MEM_ALIGNMENT                   8
/* lwIP's mem_malloc (PBUF_RAM: TX data copied by tcp_write(TCP_WRITE_FLAG_COPY) until ACKed, TCP headers
 * of zero-copy writes, control frames) comes from the fixed-size static pools in lwippools.h, each with its
 * sizing rule, instead of a first-fit heap. */
#define MEM_USE_POOLS                   1
#define MEMP_USE_CUSTOM_POOLS           1
#define MEM_USE_POOLS_TRY_BIGGER_POOL   1
#define MEM_SIZE                        0   /* unused with MEM_USE_POOLS */

/* ---- protocols ----------------------------------------------------------------------------------- */
#define LWIP_IPV4                       1
#define LWIP_IPV6                       0
#define LWIP_ARP                        1
#define LWIP_ETHERNET                   1
#define LWIP_ICMP                       1    /* answers ping: handy when checking a setup */
#define LWIP_RAW                        0
#define LWIP_UDP                        0
#define LWIP_TCP                        1
#define LWIP_DHCP                       0
#define LWIP_AUTOIP                     0
#define LWIP_IGMP                       0
#define LWIP_DNS                        0
#define IP_REASSEMBLY                   0    /* TCP never sends fragments (DF, MSS-sized segments) */
#define IP_FRAG                         0
#define ARP_TABLE_SIZE                  64   /* peers on the L2 segment; one entry per neighbour */
#define ARP_QUEUEING                    1
/* Frames held per neighbour while its ARP resolves. Every connection opened before the first ARP reply
 * queues its SYN here, and lwIP drops the excess (each costs a 3 s SYN retransmission: lwIP's initial RTO
 * is fixed): rule >= the connections an application opens at once to one peer (1024 QPs). */
#define ARP_QUEUE_LEN                   1100
#define ETHARP_SUPPORT_STATIC_ENTRIES   1

/* ---- TCP ---------------------------------------------------------------------------------------- */
/* The largest segment lwIP may build or accept: the large segments of memif's large-frame mode
 * (stack::StackConfig::large_segments, stack::kLargeSegmentMss: the netif MTU is then 65384). TCP_CALCULATE_
 * EFF_SEND_MSS caps the MSS actually advertised and used by the netif MTU: 1460 at MTU 1500, 8960 at 9000.
 * Segments lwIP copies (tcp_write with copy) are written in pieces of at most TCP_COPY_WRITE_MAX bytes
 * (stack/tcp.cpp), which the heap pools in lwippools.h hold. */
#define TCP_MSS                         65344
#define TCP_COPY_WRITE_MAX              8960
#define TCP_CALCULATE_EFF_SEND_MSS      1
/* Window scaling: a 1 MiB receive window (scale 5 allows up to 2 MiB). */
#define LWIP_WND_SCALE                  1
#define TCP_RCV_SCALE                   5
#define TCP_WND                         (1024u * 1024u)
/* Send buffer: must cover the bandwidth-delay product (3 GB/s x 50 us = 150 KB on a local link), and no
 * more: lwIP 2.1.3's tcp_output() walks the whole unacked queue on every call, so a needlessly long queue
 * costs CPU on every ACK. 256 KiB keeps it <= 180 segments at MSS 1460. Connections in memif's 64 KiB
 * segments get 1 MiB once established (16 segments; stack::TcpConnection::kLargeSendBuffer). */
#define TCP_SND_BUF                     (256u * 1024u)
/* Segments a pcb may queue: TCP_SND_BUF at the smallest useful MSS (536) x2 for partial segments. */
#define TCP_SND_QUEUELEN                ((2u * TCP_SND_BUF) / 536u)
/* Send-space threshold for "writable again"; lwIP requires it 4 MSS below 64 KiB. */
/* Used by lwIP's netconn API only (not compiled here); its sanity check assumes TCP_MSS below 16 KiB, which
 * is why LWIP_DISABLE_TCP_SANITY_CHECKS is set: the checks that matter hold (TCP_SND_BUF >= 2 * TCP_MSS,
 * TCP_SND_QUEUELEN >= 2 * TCP_SND_BUF / TCP_MSS, TCP_WND >= TCP_MSS; static_asserts in stack/stack.cpp). */
#define TCP_SNDLOWAT                    (TCP_SND_BUF / 2u)
#define LWIP_DISABLE_TCP_SANITY_CHECKS  1
#define TCP_SNDQUEUELOWAT               (TCP_SND_QUEUELEN / 2u)
#define TCP_QUEUE_OOSEQ                 1
/* Out-of-order data holds RX frames (and so DPDK mbufs): bound it per pcb so one lossy connection cannot
 * starve the mbuf pool. 256 pbufs >= a quarter of a 1 MiB window of 1460-byte segments. */
#define TCP_OOSEQ_MAX_PBUFS             256
#define TCP_OOSEQ_MAX_BYTES             (TCP_WND / 2u)
/* Room lwIP may allocate ahead in a copied segment (only with TCP_WRITE_FLAG_MORE or Nagle, neither used):
 * at most one copy piece. */
#define TCP_OVERSIZE                    TCP_COPY_WRITE_MAX
/* A window update is sent once the window grew by this much (lwIP's default would follow TCP_MSS up to
 * 256 KiB): as with an MSS of 8960. */
#define TCP_WND_UPDATE_THRESHOLD        (4u * 8960u)
#define LWIP_TCP_TIMESTAMPS             0
#define LWIP_TCP_SACK_OUT               0
#define TCP_LISTEN_BACKLOG              0
#define LWIP_TCP_KEEPALIVE              1
/* SOF_REUSEADDR on listeners (TcpListener): listening again on a port whose earlier connections are still up,
   as the kernel's iWARP listeners may (perftest's second rdma_cm connection on the same port). A second
   listener on the same port is still refused (tcp_listen checks). */
#define SO_REUSE                        1
/* Timer tick: lwIP counts its TCP timeouts in ticks of this many ms (slow timer = 2 ticks). 250 ms (the
 * default) delays ACKs and retransmissions for far too long on a microsecond link; 10 ms keeps the
 * minimum RTO at tens of ms. TCP_MSL bounds TIME_WAIT (2*MSL): the stack purges it at shutdown. */
#define TCP_TMR_INTERVAL                10
#define TCP_MSL                         2000UL
/* Retransmissions before a connection is declared dead. lwIP doubles the RTO each time (x2 .. x128), so
 * with a local link's RTO of a few 10 ms ticks, 8 tries give up after roughly 10-20 s: a dead peer becomes
 * an error in seconds, not the quarter hour of kernel TCP. */
#define TCP_SYNMAXRTX                   6
#define TCP_MAXRTX                      8

/* ---- pools (memp): counts are objects ---------------------------------------------------------------- */
/* 1024 RDMA connections per process (verbs target) + 64 for listeners and connections in TIME_WAIT. */
#define MEMP_NUM_TCP_PCB                1088
#define MEMP_NUM_TCP_PCB_LISTEN         16
/* Queued TCP segments over all pcbs: 32 connections with full send buffers at MSS 1460 (180 each)
 * + 1 per other connection. */
#define MEMP_NUM_TCP_SEG                (32 * 180 + 1088)
/* PBUF_REF/ROM headers for zero-copy tcp_write (data owned by the caller until ACKed): as many as
 * segments. */
#define MEMP_NUM_PBUF                   MEMP_NUM_TCP_SEG
/* RX frames are DPDK mbufs wrapped as custom pbufs (stack/stack.cpp), and none of the lwIP code we compile
 * allocates from PBUF_POOL (ARP/ICMP/TCP control frames use the heap): no pool at all. */
#define PBUF_POOL_SIZE                  0
#define PBUF_POOL_BUFSIZE               1536
#define LWIP_SUPPORT_CUSTOM_PBUF        1
#define MEMP_NUM_ARP_QUEUE              ARP_QUEUE_LEN  /* one queue entry per held frame */
#define MEMP_NUM_SYS_TIMEOUT            (LWIP_NUM_SYS_TIMEOUT_INTERNAL + 4)
#define MEMP_NUM_REASSDATA              0
#define MEMP_NUM_FRAG_PBUF              0
#define MEMP_NUM_NETBUF                 0
#define MEMP_NUM_NETCONN                0
#define MEMP_NUM_TCPIP_MSG_API          0
#define MEMP_NUM_TCPIP_MSG_INPKT        0
/* The stack's own pool of custom-pbuf wrappers (one per RX mbuf held by lwIP) is declared in stack/. */

/* ---- netif ---------------------------------------------------------------------------------------- */
#define LWIP_NETIF_STATUS_CALLBACK      0
#define LWIP_NETIF_LINK_CALLBACK        0
#define LWIP_SINGLE_NETIF               1
#define LWIP_NETIF_TX_SINGLE_PBUF       0
#define ETH_PAD_SIZE                    0

/* ---- checksums: software (memif and af_packet offer no offload) ---------------------------------- */
#define CHECKSUM_GEN_IP                 1
#define CHECKSUM_GEN_TCP                1
#define CHECKSUM_CHECK_IP               1
#define CHECKSUM_CHECK_TCP              1
/* Ours (stack/sys_arch.cpp, base/inet_sum.hpp): eight bytes per step, shared with the RX thread's checks. Each
 * IP header is summed twice per segment (built, checked); lwIP's algorithm 3 took ~80 instructions for 20 bytes. */
#define LWIP_CHKSUM                     softrdma_lwip_chksum
#define LWIP_CHECKSUM_ON_COPY           0
// Per-netif control: with the RX thread (StackConfig::rx_external) the RX thread verifies TCP checksums and
// lwIP does not (frames whose payload was placed reach lwIP as headers only).
#define LWIP_CHECKSUM_CTRL_PER_NETIF    1

/* ---- statistics: pools and heap, so tests check every pool returns to its start ------------------- */
#define LWIP_STATS                      1
#define LWIP_STATS_DISPLAY              0
#define MEM_STATS                       1
#define MEMP_STATS                      1
#define LINK_STATS                      1
#define TCP_STATS                       1
#define IP_STATS                        1
#define ETHARP_STATS                    1
#define ICMP_STATS                      0
#define UDP_STATS                       0
#define SYS_STATS                       0

#define LWIP_DEBUG                      0

#endif /* SOFTRDMA_LWIPOPTS_H */
