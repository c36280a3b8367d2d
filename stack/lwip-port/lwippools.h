/* lwIP's mem_malloc() served from fixed-size static pools (MEM_USE_POOLS): O(1) allocation and free. The
 * first-fit heap that lwIP uses otherwise walks every block when it is nearly full, which with a hundred
 * busy connections costs milliseconds per tcp_write. A request that finds its pool empty takes the next
 * bigger one; when all are empty tcp_write says ERR_MEM (back-pressure).
 * Sizes include lwIP's pbuf header (16 bytes) and Ethernet/IP/TCP headers (54 bytes). */

LWIP_MALLOC_MEMPOOL_START
/* Small: TCP headers of zero-copy writes (one per queued segment), ACKs, ARP/ICMP replies, RSTs.
 * Rule: >= MEMP_NUM_TCP_SEG (6848) + 1024 for control frames. */
LWIP_MALLOC_MEMPOOL(8192, 256)
/* One MSS-1460 segment of copied data. Rule: TCP_SND_BUF / 1460 (180) x 32 busy connections. */
LWIP_MALLOC_MEMPOOL(5760, 1600)
/* One MSS-8960 segment (9000-byte MTU). Rule: TCP_SND_BUF / 8960 (30) x 32 busy connections. Large-segment
 * connections copy in these pieces too (TCP_COPY_WRITE_MAX) when no TX chunk is free, up to their 1 MiB send
 * buffer (stack::TcpConnection::kLargeSendBuffer: 117 pieces): eight of them copying at once fill the pool,
 * and the rest see tcp_write's ERR_MEM (TcpConnection::write: try again on a later turn). tests/stack tcp_test
 * "48 large-segment connections at once...": ~7.9 MB in flight at most (of 48 MiB of send buffers), every
 * byte arrives. */
LWIP_MALLOC_MEMPOOL(960, 9100)
LWIP_MALLOC_MEMPOOL_END
