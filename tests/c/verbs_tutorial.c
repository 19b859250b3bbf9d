/*
 * verbs_tutorial.c: one RC connection between two processes, written the way the verbs
 * tutorials teach it, with every step checked.
 *
 *   server:  verbs_tutorial [-d DEV] [-g GIDX] [-p TCPPORT]
 *   client:  verbs_tutorial [-d DEV] [-g GIDX] [-p TCPPORT] SERVER_IP
 *
 * Both sides run the same script. Each step prints one line; a failed step prints
 * "FAILED at <step>: <why>" and the program exits 1. Exit 0 means every step passed.
 *
 *   1 resources     device, protection domain, three memory regions, a completion channel,
 *                   a send CQ (polled) and a receive CQ (waited for through the channel),
 *                   an RC queue pair
 *   2 exchange      QPN, PSN, GID, MTU, buffer addresses and rkeys, over TCP
 *   3 connect       RESET -> INIT -> RTR -> RTS, addressed with a GRH (RoCE needs one)
 *   4 send          SEND with immediate, both ways at once; the receive is waited for
 *                   through the completion channel
 *   5 write         RDMA WRITE into the peer's buffer; the peer checks the bytes
 *   6 read          RDMA READ of a part of the peer's buffer the peer filled itself
 *   7 atomics       fetch-and-add, then compare-and-swap (one that swaps, one that must
 *                   not) on the peer's 8-byte counter, the old values checked; each side
 *                   then checks its own counter
 *   8 violation     the client WRITEs with a wrong rkey: the completion must say
 *                   IBV_WC_REM_ACCESS_ERR, the client's QP must be in the error state, and
 *                   the server checks that its memory did not change. The connection ends
 *                   there: an RC QP in the error state cannot be used again without going
 *                   back through RESET.
 *   9 destroy       QP, MRs, CQs, channel, PD, device: children before their parents
 *
 * Written against <infiniband/verbs.h> only (build: cc -std=c99 ... -libverbs), so the same
 * binary runs on any libibverbs.so.1: rdma-core's (with rxe or a real NIC) or xroce's.
 */
#define _XOPEN_SOURCE 700 /* POSIX 2008 with lrand48 */

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <netdb.h>
#include <poll.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include <infiniband/verbs.h>

/* ---- Sizes and layout -------------------------------------------------------------------- */

#define IB_PORT 1          /* RoCE devices have one port, number 1 */
#define TIMEOUT_MS 15000   /* longest wait for any completion or peer message */

/* The "exposed" buffer is the one the peer may READ and WRITE:
 *   [0, WRITE_LEN)                       the peer's RDMA WRITE lands here
 *   [READ_OFF, READ_OFF + READ_LEN)      filled by its owner; the peer RDMA READs it     */
#define EXPOSED_LEN 8192
#define WRITE_LEN 4000     /* several packets at any RoCE path MTU up to 2048 */
#define READ_OFF 4096
#define READ_LEN 4000

/* The "local" buffer is never exposed to the peer (local write access only):
 *   [SEND_OFF, +MSG_LEN)    the message this side SENDs
 *   [RECV_OFF, +MSG_LEN)    where the peer's SEND lands
 *   [LAND_OFF, +READ_LEN)   where this side's RDMA READ lands; also the WRITE's source
 *   [ATOMIC_OFF, +8)        where an atomic operation returns the old value             */
#define LOCAL_LEN 16384
#define MSG_LEN 64
#define SEND_OFF 0
#define RECV_OFF 256
#define LAND_OFF 4096
#define ATOMIC_OFF 12288

#define FA_ADD 5                         /* what fetch-and-add adds */
#define CAS_SWAP UINT64_C(0xc0ffee0000c0ffee) /* what compare-and-swap writes */

/* wr_id values: they come back in the completions and say which request completed. */
enum { WR_RECV = 1, WR_SEND, WR_WRITE, WR_READ, WR_FA, WR_CAS, WR_CAS_STALE, WR_BAD_WRITE };

/* ---- Failure reporting ------------------------------------------------------------------- */

static const char *role = "?";   /* "server" or "client", in every line printed */
static const char *step = "start";

/* Prints why the current step failed and exits. The process exits without tearing down:
 * the kernel (or xroce's library) releases everything a dead process held, and the peer
 * sees the TCP connection close and fails its own step with a clear message. */
static void fail(const char *fmt, ...)
{
	va_list ap;
	fprintf(stderr, "verbs_tutorial %s: FAILED at %s: ", role, step);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
	exit(1);
}

static void ok(const char *fmt, ...)
{
	va_list ap;
	printf("verbs_tutorial %s: %s: ok: ", role, step);
	va_start(ap, fmt);
	vprintf(fmt, ap);
	va_end(ap);
	putchar('\n');
	fflush(stdout);
}

/* Most verbs return 0 or an errno value (not -1 with errno set): report it as such. */
#define CHECK_RC(call)                                                                     \
	do {                                                                                   \
		int rc_ = (call);                                                                  \
		if (rc_ != 0)                                                                      \
			fail("%s returned %d (%s)", #call, rc_, strerror(rc_ > 0 ? rc_ : errno));      \
	} while (0)

/* The verbs that create objects return NULL and set errno. */
#define CHECK_PTR(ptr, what)                                                               \
	do {                                                                                   \
		if ((ptr) == NULL)                                                                 \
			fail("%s failed: %s", what, strerror(errno));                                  \
	} while (0)

static int64_t now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* The byte pattern a side writes: different for the two roles, so a check cannot pass by
 * finding its own bytes. */
static void fill(uint8_t *p, size_t len, int seed)
{
	for (size_t i = 0; i < len; i++)
		p[i] = (uint8_t)(seed + i * 7 + (i >> 8));
}

static size_t first_mismatch(const uint8_t *p, size_t len, int seed)
{
	for (size_t i = 0; i < len; i++)
		if (p[i] != (uint8_t)(seed + i * 7 + (i >> 8)))
			return i;
	return len;
}

#define SEED_SERVER_WRITE 0x11
#define SEED_CLIENT_WRITE 0x22
#define SEED_SERVER_READ 0x33
#define SEED_CLIENT_READ 0x44

/* ---- The out-of-band channel: TCP, one text line per message ----------------------------- */

static void tcp_send_line(int sock, const char *line)
{
	size_t len = strlen(line), done = 0;
	while (done < len) {
		ssize_t n = send(sock, line + done, len - done, MSG_NOSIGNAL);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			fail("sending to the peer over TCP: %s", strerror(errno));
		done += (size_t)n;
	}
}

/* Reads one line (without its newline). Byte at a time: a handful of short lines, and no
 * buffering that could swallow the start of the next message. */
static void tcp_recv_line(int sock, char *buf, size_t size)
{
	size_t len = 0;
	for (;;) {
		char c;
		ssize_t n = recv(sock, &c, 1, 0);
		if (n < 0 && errno == EINTR)
			continue;
		if (n == 0)
			fail("the peer closed the TCP connection (did its side fail?)");
		if (n < 0)
			fail("receiving from the peer over TCP: %s", strerror(errno));
		if (c == '\n')
			break;
		if (len + 1 < size)
			buf[len++] = c;
	}
	buf[len] = '\0';
}

/* A rendezvous: both sides say they finished `what`, and each waits for the other. */
static void sync_with_peer(int sock, const char *what)
{
	char line[128], got[128];
	snprintf(line, sizeof line, "%s\n", what);
	tcp_send_line(sock, line);
	tcp_recv_line(sock, got, sizeof got);
	if (strcmp(got, what) != 0)
		fail("expected the peer to say \"%s\", it said \"%s\"", what, got);
}

static void set_timeouts(int sock)
{
	/* A peer that hangs must not hang us: a read waits at most twice the completion timeout. */
	struct timeval tv = { .tv_sec = 2 * TIMEOUT_MS / 1000, .tv_usec = 0 };
	setsockopt(sock, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
}

static int tcp_server(const char *port)
{
	struct addrinfo hints = { .ai_family = AF_INET6, .ai_socktype = SOCK_STREAM,
				  .ai_flags = AI_PASSIVE };
	struct addrinfo *res;
	int one = 1, zero = 0;
	/* One IPv6 socket that also accepts IPv4 (v4-mapped), falling back to IPv4 only. */
	if (getaddrinfo(NULL, port, &hints, &res) != 0) {
		hints.ai_family = AF_INET;
		if (getaddrinfo(NULL, port, &hints, &res) != 0)
			fail("getaddrinfo for port %s failed", port);
	}
	int lsock = socket(res->ai_family, res->ai_socktype, res->ai_protocol);
	if (lsock < 0 && res->ai_family == AF_INET6) {
		freeaddrinfo(res);
		hints.ai_family = AF_INET;
		if (getaddrinfo(NULL, port, &hints, &res) != 0)
			fail("getaddrinfo for port %s failed", port);
		lsock = socket(res->ai_family, res->ai_socktype, res->ai_protocol);
	}
	if (lsock < 0)
		fail("socket: %s", strerror(errno));
	setsockopt(lsock, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
	if (res->ai_family == AF_INET6)
		setsockopt(lsock, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);
	if (bind(lsock, res->ai_addr, res->ai_addrlen) != 0 || listen(lsock, 1) != 0)
		fail("cannot listen on TCP port %s: %s", port, strerror(errno));
	freeaddrinfo(res);
	printf("verbs_tutorial server: waiting for the client on TCP port %s\n", port);
	fflush(stdout);
	/* Wait for the client at most a few timeouts' worth: a server nobody connects to must
	 * end too (and free the port), not wait forever. */
	struct pollfd pfd = { .fd = lsock, .events = POLLIN };
	int n;
	do
		n = poll(&pfd, 1, 4 * TIMEOUT_MS);
	while (n < 0 && errno == EINTR);
	if (n == 0)
		fail("no client connected within %d s", 4 * TIMEOUT_MS / 1000);
	if (n < 0)
		fail("poll on the listening socket: %s", strerror(errno));
	int sock = accept(lsock, NULL, NULL);
	if (sock < 0)
		fail("accept: %s", strerror(errno));
	close(lsock);
	set_timeouts(sock);
	return sock;
}

static int tcp_client(const char *host, const char *port)
{
	struct addrinfo hints = { .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM };
	struct addrinfo *res;
	int rc = getaddrinfo(host, port, &hints, &res);
	if (rc != 0)
		fail("cannot resolve %s: %s", host, gai_strerror(rc));
	/* The server may not be listening yet: retry for a while. */
	int64_t deadline = now_ms() + TIMEOUT_MS;
	for (;;) {
		int sock = socket(res->ai_family, res->ai_socktype, res->ai_protocol);
		if (sock < 0)
			fail("socket: %s", strerror(errno));
		if (connect(sock, res->ai_addr, res->ai_addrlen) == 0) {
			freeaddrinfo(res);
			set_timeouts(sock);
			return sock;
		}
		int err = errno;
		close(sock);
		if (now_ms() > deadline)
			fail("cannot connect to %s port %s: %s", host, port, strerror(err));
		struct timespec pause = { .tv_sec = 0, .tv_nsec = 100 * 1000 * 1000 };
		nanosleep(&pause, NULL);
	}
}

/* ---- What the two sides tell each other ---------------------------------------------------- */

struct peer_info {
	uint32_t qpn;          /* queue pair number: where requests are addressed */
	uint32_t psn;          /* first packet sequence number the side will send */
	union ibv_gid gid;     /* its address (for RoCE v2: an IPv4-mapped or IPv6 address) */
	int mtu;               /* its port's active MTU, an enum ibv_mtu */
	uint64_t exposed_addr; /* virtual address and rkey of its exposed buffer */
	uint32_t exposed_rkey;
	uint64_t counter_addr; /* ... and of its 8-byte counter */
	uint32_t counter_rkey;
	uint64_t counter_init; /* the counter's value before any atomic operation */
};

static void format_info(const struct peer_info *p, char *out, size_t size)
{
	char gid[33];
	for (int i = 0; i < 16; i++)
		sprintf(gid + 2 * i, "%02x", p->gid.raw[i]);
	snprintf(out, size,
		 "%06" PRIx32 " %06" PRIx32 " %s %d %016" PRIx64 " %08" PRIx32 " %016" PRIx64
		 " %08" PRIx32 " %016" PRIx64 "\n",
		 p->qpn, p->psn, gid, p->mtu, p->exposed_addr, p->exposed_rkey, p->counter_addr,
		 p->counter_rkey, p->counter_init);
}

static void parse_info(const char *line, struct peer_info *p)
{
	char gid[33];
	if (sscanf(line,
		   "%" SCNx32 " %" SCNx32 " %32s %d %" SCNx64 " %" SCNx32 " %" SCNx64 " %" SCNx32
		   " %" SCNx64,
		   &p->qpn, &p->psn, gid, &p->mtu, &p->exposed_addr, &p->exposed_rkey,
		   &p->counter_addr, &p->counter_rkey, &p->counter_init) != 9 ||
	    strlen(gid) != 32)
		fail("cannot parse the peer's connection data \"%s\"", line);
	for (int i = 0; i < 16; i++) {
		unsigned byte;
		if (sscanf(gid + 2 * i, "%2x", &byte) != 1)
			fail("bad GID in the peer's connection data \"%s\"", line);
		p->gid.raw[i] = (uint8_t)byte;
	}
}

/* ---- Everything one side holds ------------------------------------------------------------- */

struct side {
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	uint8_t *local, *exposed;
	uint64_t *counter;
	struct ibv_mr *local_mr, *exposed_mr, *counter_mr;
	struct ibv_comp_channel *channel;
	struct ibv_cq *send_cq, *recv_cq;
	struct ibv_qp *qp;
	int gid_index;
	struct ibv_port_attr port;
	int events;            /* completion events received (each is acknowledged at once) */
};

static void *alloc_buffer(size_t len)
{
	void *p = NULL;
	/* Page-aligned, zeroed memory. Registration pins the pages it covers. */
	if (posix_memalign(&p, 4096, len) != 0)
		fail("out of memory");
	memset(p, 0, len);
	return p;
}

static void create_resources(struct side *s, const char *dev_name, int is_server)
{
	step = "resources";
	int num;
	struct ibv_device **list = ibv_get_device_list(&num);
	CHECK_PTR(list, "ibv_get_device_list");
	if (num == 0)
		fail("no RDMA device found");
	struct ibv_device *dev = NULL;
	for (int i = 0; i < num; i++)
		if (dev_name == NULL || strcmp(ibv_get_device_name(list[i]), dev_name) == 0) {
			dev = list[i];
			break;
		}
	if (dev == NULL)
		fail("no device named %s", dev_name);
	s->ctx = ibv_open_device(dev);
	CHECK_PTR(s->ctx, "ibv_open_device");
	const char *name = ibv_get_device_name(dev);
	/* The list can go once the device is open: the context keeps what it needs. */
	ibv_free_device_list(list);

	struct ibv_device_attr dattr;
	CHECK_RC(ibv_query_device(s->ctx, &dattr));
	if (dattr.atomic_cap == IBV_ATOMIC_NONE)
		fail("device %s does not support atomic operations", name);
	CHECK_RC(ibv_query_port(s->ctx, IB_PORT, &s->port));
	if (s->port.state != IBV_PORT_ACTIVE)
		fail("port %d of %s is not active (state %d)", IB_PORT, name, s->port.state);
	if (s->port.link_layer != IBV_LINK_LAYER_ETHERNET)
		fail("%s is not a RoCE device (link layer %d)", name, s->port.link_layer);

	s->pd = ibv_alloc_pd(s->ctx);
	CHECK_PTR(s->pd, "ibv_alloc_pd");

	/* Three regions, each with only the rights it needs. LOCAL_WRITE is needed for anything
	 * the device writes into: receives, READ responses, atomic results, and any region the
	 * peer may write or modify. */
	s->local = alloc_buffer(LOCAL_LEN);
	s->exposed = alloc_buffer(EXPOSED_LEN);
	s->counter = alloc_buffer(64); /* atomics need 8-byte alignment; this is 4096 */
	fill(s->exposed + READ_OFF, READ_LEN, is_server ? SEED_SERVER_READ : SEED_CLIENT_READ);
	*s->counter = is_server ? 1000 : 2000000;
	s->local_mr = ibv_reg_mr(s->pd, s->local, LOCAL_LEN, IBV_ACCESS_LOCAL_WRITE);
	CHECK_PTR(s->local_mr, "ibv_reg_mr (local buffer)");
	s->exposed_mr = ibv_reg_mr(s->pd, s->exposed, EXPOSED_LEN,
				   IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
					   IBV_ACCESS_REMOTE_READ);
	CHECK_PTR(s->exposed_mr, "ibv_reg_mr (exposed buffer)");
	s->counter_mr = ibv_reg_mr(s->pd, s->counter, 8,
				   IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_ATOMIC);
	CHECK_PTR(s->counter_mr, "ibv_reg_mr (counter)");

	/* A completion channel is a file descriptor that becomes readable when an armed CQ
	 * gets a completion: the way to sleep instead of spinning on ibv_poll_cq. */
	s->channel = ibv_create_comp_channel(s->ctx);
	CHECK_PTR(s->channel, "ibv_create_comp_channel");
	/* Non-blocking, so the wait can use poll() with a timeout (ibv_get_cq_event would
	 * otherwise block forever if the event never comes). */
	int flags = fcntl(s->channel->fd, F_GETFL);
	if (flags < 0 || fcntl(s->channel->fd, F_SETFL, flags | O_NONBLOCK) < 0)
		fail("cannot make the channel's fd non-blocking: %s", strerror(errno));

	s->send_cq = ibv_create_cq(s->ctx, 16, NULL, NULL, 0);
	CHECK_PTR(s->send_cq, "ibv_create_cq (send)");
	s->recv_cq = ibv_create_cq(s->ctx, 16, NULL, s->channel, 0);
	CHECK_PTR(s->recv_cq, "ibv_create_cq (receive, on the channel)");
	/* Arm the receive CQ now: its first completion will raise an event. */
	CHECK_RC(ibv_req_notify_cq(s->recv_cq, 0));

	struct ibv_qp_init_attr qattr = {
		.send_cq = s->send_cq,
		.recv_cq = s->recv_cq,
		.cap = { .max_send_wr = 16, .max_recv_wr = 16, .max_send_sge = 1, .max_recv_sge = 1 },
		.qp_type = IBV_QPT_RC,
		.sq_sig_all = 0, /* every request below asks for its completion (IBV_SEND_SIGNALED) */
	};
	s->qp = ibv_create_qp(s->pd, &qattr);
	CHECK_PTR(s->qp, "ibv_create_qp");
	ok("device %s, port %d active, MTU %d, QP %#x", name, IB_PORT,
	   128 << s->port.active_mtu, s->qp->qp_num);
}

/* ---- Connecting the QP --------------------------------------------------------------------- */

static void connect_qp(struct side *s, const struct peer_info *peer, const struct peer_info *me)
{
	step = "connect";
	struct ibv_qp_attr a;

	/* RESET -> INIT: which port, which partition, and what the peer may do to our memory
	 * through this QP (on top of each MR's own rights). */
	memset(&a, 0, sizeof a);
	a.qp_state = IBV_QPS_INIT;
	a.port_num = IB_PORT;
	a.pkey_index = 0;
	a.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
			    IBV_ACCESS_REMOTE_ATOMIC;
	CHECK_RC(ibv_modify_qp(s->qp, &a,
			       IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS));

	/* INIT -> RTR (ready to receive): who the peer is. RoCE has no LIDs: the peer is
	 * addressed by its GID in a global route header, from our GID table entry gid_index. */
	memset(&a, 0, sizeof a);
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = peer->mtu < me->mtu ? peer->mtu : me->mtu; /* both ends must agree */
	a.dest_qp_num = peer->qpn;
	a.rq_psn = peer->psn;
	a.max_dest_rd_atomic = 1; /* READs/atomics the peer may have outstanding at us */
	a.min_rnr_timer = 12;     /* 0.64 ms: how long the peer waits if no receive is posted */
	a.ah_attr.is_global = 1;
	a.ah_attr.grh.dgid = peer->gid;
	a.ah_attr.grh.sgid_index = (uint8_t)s->gid_index;
	a.ah_attr.grh.hop_limit = 64;
	a.ah_attr.port_num = IB_PORT;
	CHECK_RC(ibv_modify_qp(s->qp, &a,
			       IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
				       IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC |
				       IBV_QP_MIN_RNR_TIMER));

	/* RTR -> RTS (ready to send): our first PSN and how hard to retry. */
	memset(&a, 0, sizeof a);
	a.qp_state = IBV_QPS_RTS;
	a.sq_psn = me->psn;
	a.timeout = 14;   /* 4.096 us * 2^14 = 67 ms before a retransmission */
	a.retry_cnt = 6;  /* 7 would mean "retry forever" on some devices */
	a.rnr_retry = 7;  /* 7 does mean "forever" for RNR: the peer is slow, not gone */
	a.max_rd_atomic = 1;
	CHECK_RC(ibv_modify_qp(s->qp, &a,
			       IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
				       IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC));
}

/* ---- Posting and completing ---------------------------------------------------------------- */

static struct ibv_sge sge(struct side *s, uint32_t off, uint32_t len)
{
	struct ibv_sge g = { .addr = (uintptr_t)(s->local + off), .length = len,
			     .lkey = s->local_mr->lkey };
	return g;
}

static void post_send(struct side *s, struct ibv_send_wr *wr)
{
	struct ibv_send_wr *bad = NULL;
	int rc = ibv_post_send(s->qp, wr, &bad);
	if (rc != 0)
		fail("ibv_post_send (wr_id %" PRIu64 ") returned %d (%s)", wr->wr_id, rc,
		     strerror(rc));
}

/* Busy-polls the send CQ for one completion, with a deadline. */
static struct ibv_wc poll_send(struct side *s, uint64_t wr_id)
{
	struct ibv_wc wc;
	int64_t deadline = now_ms() + TIMEOUT_MS;
	for (;;) {
		int n = ibv_poll_cq(s->send_cq, 1, &wc);
		if (n < 0)
			fail("ibv_poll_cq (send) returned %d", n);
		if (n == 1)
			break;
		if (now_ms() > deadline)
			fail("no send completion for wr_id %" PRIu64 " within %d ms", wr_id,
			     TIMEOUT_MS);
	}
	if (wc.wr_id != wr_id)
		fail("completion for wr_id %" PRIu64 " while waiting for %" PRIu64, wc.wr_id, wr_id);
	return wc;
}

/* A successful completion of the expected kind, or a failure that names the status. */
static void expect_success(const struct ibv_wc *wc, enum ibv_wc_opcode opcode)
{
	if (wc->status != IBV_WC_SUCCESS)
		fail("completion of wr_id %" PRIu64 " has status %s (%d)", wc->wr_id,
		     ibv_wc_status_str(wc->status), wc->status);
	if (wc->opcode != opcode)
		fail("completion of wr_id %" PRIu64 " has opcode %d, expected %d", wc->wr_id,
		     wc->opcode, opcode);
}

/* Waits for a receive completion through the channel: sleep until the fd is readable, take
 * the event, acknowledge it, re-arm the CQ, then poll it. Re-arming before polling is what
 * makes this race-free: a completion that arrives after the poll raises a new event. */
static struct ibv_wc wait_recv_event(struct side *s)
{
	struct ibv_wc wc;
	int64_t deadline = now_ms() + TIMEOUT_MS;
	for (;;) {
		struct pollfd pfd = { .fd = s->channel->fd, .events = POLLIN };
		int left = (int)(deadline - now_ms());
		if (left <= 0)
			fail("no completion event on the channel within %d ms (%d events so far)",
			     TIMEOUT_MS, s->events);
		int n = poll(&pfd, 1, left);
		if (n < 0 && errno != EINTR)
			fail("poll on the channel's fd: %s", strerror(errno));
		if (n <= 0)
			continue;
		struct ibv_cq *ev_cq;
		void *ev_ctx;
		if (ibv_get_cq_event(s->channel, &ev_cq, &ev_ctx) != 0) {
			if (errno == EAGAIN) /* readable, but the event was gone: wait again */
				continue;
			fail("ibv_get_cq_event: %s", strerror(errno));
		}
		if (ev_cq != s->recv_cq)
			fail("event for CQ %p, expected the receive CQ %p", (void *)ev_cq,
			     (void *)s->recv_cq);
		s->events++;
		/* Every event taken must be acknowledged, or ibv_destroy_cq waits forever. */
		ibv_ack_cq_events(ev_cq, 1);
		CHECK_RC(ibv_req_notify_cq(s->recv_cq, 0));
		n = ibv_poll_cq(s->recv_cq, 1, &wc);
		if (n < 0)
			fail("ibv_poll_cq (receive) returned %d", n);
		if (n == 1)
			return wc;
		/* An event with nothing to poll: it was for a completion polled earlier. */
	}
}

/* ---- The scripted exchange ----------------------------------------------------------------- */

static void step_send(struct side *s, int is_server)
{
	step = "send";
	const char *mine = is_server ? "hello from the server" : "hello from the client";
	const char *theirs = is_server ? "hello from the client" : "hello from the server";
	uint32_t imm_mine = is_server ? 0x5e7e0001 : 0xc11e0001;
	uint32_t imm_theirs = is_server ? 0xc11e0001 : 0x5e7e0001;

	/* The message, with a 32-bit immediate value that arrives in the receiver's completion
	 * (in network byte order, as it is carried on the wire). */
	strcpy((char *)s->local + SEND_OFF, mine);
	struct ibv_sge g = sge(s, SEND_OFF, (uint32_t)strlen(mine) + 1);
	struct ibv_send_wr wr = { .wr_id = WR_SEND, .sg_list = &g, .num_sge = 1,
				  .opcode = IBV_WR_SEND_WITH_IMM, .send_flags = IBV_SEND_SIGNALED,
				  .imm_data = htonl(imm_mine) };
	post_send(s, &wr);
	struct ibv_wc wc = poll_send(s, WR_SEND);
	expect_success(&wc, IBV_WC_SEND);

	/* The receive was posted before the "ready" rendezvous (a SEND that finds no receive
	 * is refused with an RNR NAK and retried later). Its CQ was armed when created, and this is its first
	 * completion: it must raise an event. */
	wc = wait_recv_event(s);
	if (wc.wr_id != WR_RECV)
		fail("receive completion has wr_id %" PRIu64, wc.wr_id);
	expect_success(&wc, IBV_WC_RECV);
	if (!(wc.wc_flags & IBV_WC_WITH_IMM))
		fail("the receive completion has no immediate data (wc_flags %#x)", wc.wc_flags);
	if (ntohl(wc.imm_data) != imm_theirs)
		fail("immediate data %#x, expected %#x", ntohl(wc.imm_data), imm_theirs);
	if (wc.byte_len != strlen(theirs) + 1)
		fail("received %u bytes, expected %zu", wc.byte_len, strlen(theirs) + 1);
	if (strcmp((char *)s->local + RECV_OFF, theirs) != 0)
		fail("received \"%.*s\", expected \"%s\"", MSG_LEN, (char *)s->local + RECV_OFF,
		     theirs);
	if (wc.qp_num != s->qp->qp_num)
		fail("receive completion names QP %#x, ours is %#x", wc.qp_num, s->qp->qp_num);
	ok("sent \"%s\", received \"%s\" with immediate %#x (through %d completion event%s)", mine,
	   theirs, imm_theirs, s->events, s->events == 1 ? "" : "s");
}

static void step_write(struct side *s, int sock, const struct peer_info *peer, int is_server)
{
	step = "write";
	int mine = is_server ? SEED_SERVER_WRITE : SEED_CLIENT_WRITE;
	int theirs = is_server ? SEED_CLIENT_WRITE : SEED_SERVER_WRITE;
	fill(s->local + LAND_OFF, WRITE_LEN, mine);
	struct ibv_sge g = sge(s, LAND_OFF, WRITE_LEN);
	struct ibv_send_wr wr = { .wr_id = WR_WRITE, .sg_list = &g, .num_sge = 1,
				  .opcode = IBV_WR_RDMA_WRITE, .send_flags = IBV_SEND_SIGNALED };
	wr.wr.rdma.remote_addr = peer->exposed_addr;
	wr.wr.rdma.rkey = peer->exposed_rkey;
	post_send(s, &wr);
	struct ibv_wc wc = poll_send(s, WR_WRITE);
	expect_success(&wc, IBV_WC_RDMA_WRITE);
	/* The WRITE's completion means the peer acknowledged it, so the bytes are in its
	 * memory. A WRITE raises no completion at the target: the peer learns of it here. */
	sync_with_peer(sock, "written");
	size_t bad = first_mismatch(s->exposed, WRITE_LEN, theirs);
	if (bad != WRITE_LEN)
		fail("byte %zu of what the peer wrote is %#x", bad, s->exposed[bad]);
	ok("wrote %d bytes into the peer's buffer; the peer's %d bytes arrived intact", WRITE_LEN,
	   WRITE_LEN);
}

static void step_read(struct side *s, const struct peer_info *peer, int is_server)
{
	step = "read";
	int theirs = is_server ? SEED_CLIENT_READ : SEED_SERVER_READ;
	memset(s->local + LAND_OFF, 0, READ_LEN);
	struct ibv_sge g = sge(s, LAND_OFF, READ_LEN);
	struct ibv_send_wr wr = { .wr_id = WR_READ, .sg_list = &g, .num_sge = 1,
				  .opcode = IBV_WR_RDMA_READ, .send_flags = IBV_SEND_SIGNALED };
	wr.wr.rdma.remote_addr = peer->exposed_addr + READ_OFF;
	wr.wr.rdma.rkey = peer->exposed_rkey;
	post_send(s, &wr);
	struct ibv_wc wc = poll_send(s, WR_READ);
	expect_success(&wc, IBV_WC_RDMA_READ);
	size_t bad = first_mismatch(s->local + LAND_OFF, READ_LEN, theirs);
	if (bad != READ_LEN)
		fail("byte %zu read from the peer is %#x", bad, s->local[LAND_OFF + bad]);
	ok("read %d bytes the peer filled, intact", READ_LEN);
}

/* One atomic operation on the peer's counter; returns the value the counter had before. */
static uint64_t atomic_op(struct side *s, const struct peer_info *peer, uint64_t wr_id,
			  enum ibv_wr_opcode op, uint64_t compare_add, uint64_t swap)
{
	uint64_t *old = (uint64_t *)(s->local + ATOMIC_OFF);
	*old = 0xdeaddeaddeaddeadULL;
	struct ibv_sge g = sge(s, ATOMIC_OFF, 8);
	struct ibv_send_wr wr = { .wr_id = wr_id, .sg_list = &g, .num_sge = 1, .opcode = op,
				  .send_flags = IBV_SEND_SIGNALED };
	wr.wr.atomic.remote_addr = peer->counter_addr;
	wr.wr.atomic.rkey = peer->counter_rkey;
	wr.wr.atomic.compare_add = compare_add;
	wr.wr.atomic.swap = swap;
	post_send(s, &wr);
	struct ibv_wc wc = poll_send(s, wr_id);
	expect_success(&wc, op == IBV_WR_ATOMIC_FETCH_AND_ADD ? IBV_WC_FETCH_ADD : IBV_WC_COMP_SWAP);
	return *old;
}

static void step_atomics(struct side *s, int sock, const struct peer_info *peer)
{
	step = "atomics";
	uint64_t init = peer->counter_init, old;

	old = atomic_op(s, peer, WR_FA, IBV_WR_ATOMIC_FETCH_AND_ADD, FA_ADD, 0);
	if (old != init)
		fail("fetch-and-add returned %#" PRIx64 ", the counter held %#" PRIx64, old, init);

	/* Compare-and-swap writes `swap` only if the counter equals `compare_add`; either way
	 * it returns what the counter held. */
	old = atomic_op(s, peer, WR_CAS, IBV_WR_ATOMIC_CMP_AND_SWP, init + FA_ADD, CAS_SWAP);
	if (old != init + FA_ADD)
		fail("compare-and-swap returned %#" PRIx64 ", expected %#" PRIx64, old,
		     init + FA_ADD);
	/* A stale compare value: nothing is swapped, and the current value comes back. */
	old = atomic_op(s, peer, WR_CAS_STALE, IBV_WR_ATOMIC_CMP_AND_SWP, init, 1);
	if (old != CAS_SWAP)
		fail("compare-and-swap with a stale value returned %#" PRIx64 ", expected %#" PRIx64,
		     old, CAS_SWAP);

	sync_with_peer(sock, "atomics done");
	/* The peer's operations on our counter are complete (it saw their completions). */
	if (*s->counter != CAS_SWAP)
		fail("our counter holds %#" PRIx64 " after the peer's atomics, expected %#" PRIx64,
		     *s->counter, CAS_SWAP);
	ok("fetch-and-add returned %" PRIu64 ", compare-and-swap returned %" PRIu64
	   " and swapped, the stale one returned %#" PRIx64 " and did not; our counter is %#" PRIx64,
	   init, init + FA_ADD, CAS_SWAP, *s->counter);
}

static const char *qp_state_name(enum ibv_qp_state st)
{
	switch (st) {
	case IBV_QPS_RESET: return "RESET";
	case IBV_QPS_INIT: return "INIT";
	case IBV_QPS_RTR: return "RTR";
	case IBV_QPS_RTS: return "RTS";
	case IBV_QPS_SQD: return "SQD";
	case IBV_QPS_SQE: return "SQE";
	case IBV_QPS_ERR: return "ERR";
	default: return "unknown";
	}
}

static enum ibv_qp_state query_state(struct side *s)
{
	struct ibv_qp_attr a;
	struct ibv_qp_init_attr ia;
	CHECK_RC(ibv_query_qp(s->qp, &a, IBV_QP_STATE, &ia));
	return a.qp_state;
}

static void step_violation(struct side *s, int sock, const struct peer_info *peer, int is_server)
{
	step = "violation";
	char line[128];
	if (!is_server) {
		/* A WRITE with an rkey the peer never gave out. The responder checks the rkey
		 * before it touches memory, refuses with a NAK (remote access error), and our
		 * request completes with IBV_WC_REM_ACCESS_ERR. */
		memset(s->local + LAND_OFF, 0xee, 64);
		struct ibv_sge g = sge(s, LAND_OFF, 64);
		struct ibv_send_wr wr = { .wr_id = WR_BAD_WRITE, .sg_list = &g, .num_sge = 1,
					  .opcode = IBV_WR_RDMA_WRITE,
					  .send_flags = IBV_SEND_SIGNALED };
		wr.wr.rdma.remote_addr = peer->exposed_addr;
		wr.wr.rdma.rkey = ~peer->exposed_rkey;
		post_send(s, &wr);
		struct ibv_wc wc = poll_send(s, WR_BAD_WRITE);
		if (wc.status != IBV_WC_REM_ACCESS_ERR)
			fail("the WRITE with a wrong rkey completed with %s (%d), expected "
			     "IBV_WC_REM_ACCESS_ERR",
			     ibv_wc_status_str(wc.status), wc.status);
		/* An error completion moves the QP to the error state: whatever else is queued
		 * is flushed, and nothing more can be sent on it. */
		enum ibv_qp_state st = query_state(s);
		if (st != IBV_QPS_ERR)
			fail("after the access error the QP is in state %s, expected ERR",
			     qp_state_name(st));
		tcp_send_line(sock, "violation done\n");
		/* The server's verdict on its memory. */
		tcp_recv_line(sock, line, sizeof line);
		if (strcmp(line, "memory unchanged") != 0)
			fail("the server reports: %s", line);
		ok("WRITE with a wrong rkey completed with IBV_WC_REM_ACCESS_ERR; our QP is in "
		   "ERR; the server's memory is unchanged");
	} else {
		tcp_recv_line(sock, line, sizeof line);
		if (strcmp(line, "violation done") != 0)
			fail("expected the client to say \"violation done\", it said \"%s\"", line);
		/* The refused WRITE must not have changed a byte: the buffer still holds the
		 * client's WRITE of step 5, then zeros up to the READ part. */
		size_t bad = first_mismatch(s->exposed, WRITE_LEN, SEED_CLIENT_WRITE);
		for (size_t i = WRITE_LEN; bad == WRITE_LEN && i < READ_OFF; i++)
			if (s->exposed[i] != 0)
				bad = i;
		if (bad != WRITE_LEN) {
			snprintf(line, sizeof line, "byte %zu of the exposed buffer changed to %#x\n",
				 bad, s->exposed[bad]);
			tcp_send_line(sock, line);
			fail("the refused WRITE changed our memory: byte %zu is %#x", bad,
			     s->exposed[bad]);
		}
		tcp_send_line(sock, "memory unchanged\n");
		/* Whether the responder's QP also moved to ERR is shown, not required. */
		ok("the client's WRITE with a wrong rkey left our memory unchanged (our QP: %s)",
		   qp_state_name(query_state(s)));
	}
}

/* ---- Teardown ------------------------------------------------------------------------------ */

static void destroy_resources(struct side *s)
{
	step = "destroy";
	/* Children before parents: the QP uses the CQs and the PD; the MRs belong to the PD;
	 * the CQ uses the channel; everything belongs to the device context. Destroying a
	 * parent first fails with EBUSY. */
	CHECK_RC(ibv_destroy_qp(s->qp));
	CHECK_RC(ibv_dereg_mr(s->local_mr));
	CHECK_RC(ibv_dereg_mr(s->exposed_mr));
	CHECK_RC(ibv_dereg_mr(s->counter_mr));
	CHECK_RC(ibv_destroy_cq(s->send_cq));
	CHECK_RC(ibv_destroy_cq(s->recv_cq));
	CHECK_RC(ibv_destroy_comp_channel(s->channel));
	CHECK_RC(ibv_dealloc_pd(s->pd));
	CHECK_RC(ibv_close_device(s->ctx));
	/* The memory can go only once it is deregistered. */
	free(s->local);
	free(s->exposed);
	free(s->counter);
	ok("QP, 3 MRs, 2 CQs, channel, PD and device released");
}

/* ---- main ---------------------------------------------------------------------------------- */

static void usage(const char *argv0)
{
	fprintf(stderr, "usage: %s [-d DEV] [-g GIDX] [-p TCPPORT] [SERVER_IP]\n", argv0);
	exit(2);
}

int main(int argc, char **argv)
{
	const char *dev_name = NULL, *port = "18515";
	struct side s;
	memset(&s, 0, sizeof s);
	int opt;
	while ((opt = getopt(argc, argv, "d:g:p:")) != -1) {
		switch (opt) {
		case 'd': dev_name = optarg; break;
		case 'g': s.gid_index = atoi(optarg); break;
		case 'p': port = optarg; break;
		default: usage(argv[0]);
		}
	}
	if (optind + 1 < argc)
		usage(argv[0]);
	const char *server_ip = optind < argc ? argv[optind] : NULL;
	int is_server = server_ip == NULL;
	role = is_server ? "server" : "client";
	setvbuf(stdout, NULL, _IOLBF, 0);

	create_resources(&s, dev_name, is_server);

	/* What the peer needs to know about us. */
	step = "exchange";
	struct peer_info me = { 0 }, peer = { 0 };
	me.qpn = s.qp->qp_num;
	srand48((long)getpid() ^ (long)time(NULL));
	me.psn = (uint32_t)lrand48() & 0xffffff; /* PSNs are 24 bits */
	CHECK_RC(ibv_query_gid(s.ctx, IB_PORT, s.gid_index, &me.gid));
	static const uint8_t zero_gid[16];
	if (memcmp(me.gid.raw, zero_gid, 16) == 0)
		fail("GID %d of port %d is empty: choose another with -g", s.gid_index, IB_PORT);
	me.mtu = s.port.active_mtu;
	me.exposed_addr = (uintptr_t)s.exposed;
	me.exposed_rkey = s.exposed_mr->rkey;
	me.counter_addr = (uintptr_t)s.counter;
	me.counter_rkey = s.counter_mr->rkey;
	me.counter_init = *s.counter;

	int sock = is_server ? tcp_server(port) : tcp_client(server_ip, port);
	char line[256], peer_line[256];
	format_info(&me, line, sizeof line);
	tcp_send_line(sock, line);
	tcp_recv_line(sock, peer_line, sizeof peer_line);
	parse_info(peer_line, &peer);
	ok("local QPN %#x PSN %#x, peer QPN %#x PSN %#x", me.qpn, me.psn, peer.qpn, peer.psn);

	connect_qp(&s, &peer, &me);
	{
		/* One receive for the peer's SEND, posted before we tell the peer we are ready. */
		step = "connect";
		struct ibv_sge g = sge(&s, RECV_OFF, MSG_LEN);
		struct ibv_recv_wr rwr = { .wr_id = WR_RECV, .sg_list = &g, .num_sge = 1 };
		struct ibv_recv_wr *bad = NULL;
		CHECK_RC(ibv_post_recv(s.qp, &rwr, &bad));
	}
	enum ibv_qp_state st = query_state(&s);
	if (st != IBV_QPS_RTS)
		fail("the QP is in state %s after connecting, expected RTS", qp_state_name(st));
	sync_with_peer(sock, "ready");
	char gid_text[INET6_ADDRSTRLEN];
	inet_ntop(AF_INET6, peer.gid.raw, gid_text, sizeof gid_text);
	ok("RTS, path MTU %d, peer GID %s", 128 << (peer.mtu < me.mtu ? peer.mtu : me.mtu),
	   gid_text);

	step_send(&s, is_server);
	step_write(&s, sock, &peer, is_server);
	step_read(&s, &peer, is_server);
	step_atomics(&s, sock, &peer);
	step_violation(&s, sock, &peer, is_server);
	close(sock);
	destroy_resources(&s);

	printf("verbs_tutorial %s: all steps passed\n", role);
	return 0;
}
