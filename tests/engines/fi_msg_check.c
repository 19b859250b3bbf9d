/* fi_msg_check: the project's own check of libfabric's FI_EP_MSG endpoints (tests/libfabric_msg.rs,
 * tests/interop_rxe.rs, docs/engines.md). A plain libfabric program, unmodified by xroce, built
 * with gcc against Debian's libfabric-dev (1.17):
 *
 *   fi_msg_check -s [-b ADDR] [-p PORT] [-P PROV]       server (passive endpoint)
 *   fi_msg_check -c SERVER_ADDR [-p PORT] [-P PROV]     client
 *
 * The server asks fi_getinfo for FI_SOURCE with node ADDR (or, without -b, node NULL: what
 * fi_pingpong does), opens a passive endpoint and listens; the client asks with the server's
 * address as node. Over one connection (FI_CONNREQ, fi_accept, FI_CONNECTED on an event queue,
 * one completion queue per side), checked byte for byte:
 *
 *   1. the server sends the address and key of a registered 1 MiB buffer (fi_mr_reg, FI_MR_*
 *      modes of the verbs provider: local descriptors, virtual addresses, provider keys);
 *   2. 100 ping-pongs of 1 KiB (fi_send/fi_recv), every message checked;
 *   3. RMA of 64 KiB: fi_read of the server's pattern, fi_write of the client's, fi_read back,
 *      and the server checks its buffer;
 *   4. one 1 MiB fi_send (if the endpoint's max_msg_size allows; else a 1 MiB fi_write),
 *      waited for with fi_cq_sread (a blocking wait through the completion channel) on both
 *      sides, the rest with fi_cq_read polling;
 *   5. fi_shutdown by the client, FI_SHUTDOWN on both sides, every object closed.
 *
 * Prints `fi_msg_check ok role=... ` and exits 0 only if every check passed; any failure prints
 * `fi_msg_check FAILED: ...` and exits 1. Every wait has a deadline (-t SECONDS, default 30).
 */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>

#define KIB 1024
#define MIB (1024 * 1024)
#define PINGS 100
#define PING_LEN KIB
#define RMA_LEN (64 * KIB)
#define BIG_LEN MIB
#define SLACK 4096
/* One registered buffer per side: [recv | send | rma]. */
#define RECV_OFF 0
#define SEND_OFF (BIG_LEN + SLACK)
#define RMA_OFF (2 * (BIG_LEN + SLACK))
#define BUF_LEN (RMA_OFF + BIG_LEN)

#define CTL_MAGIC 0x66696d63u /* "fimc" */
enum ctl_type { CTL_KEYS = 1, CTL_RMA_DONE, CTL_RMA_OK, CTL_BIG_RMA_DONE, CTL_BIG_OK };

struct ctl {
    uint32_t magic;
    uint32_t type;
    uint64_t addr;
    uint64_t key;
    uint64_t len;
    uint64_t arg;
};

static const char *role = "?";
static int timeout_s = 30;
static struct fid_fabric *fabric;
static struct fid_domain *domain;
static struct fid_eq *eq;
static struct fid_pep *pep;
static struct fid_ep *ep;
static struct fid_cq *cq;
static struct fid_mr *mr;
static unsigned char *buf;
static void *desc;
static struct fi_context recv_ctx, send_ctx, rma_ctx;
static int recv_ready;  /* a receive completed and was not consumed yet */
static size_t recv_len; /* its length */
static int tx_pending;  /* sends and RMA operations not completed yet */
static int use_sread;   /* wait with fi_cq_sread instead of fi_cq_read */
static unsigned long sread_waits, polls;
static size_t max_msg_size; /* of the connected endpoint (a listener's info may say 0) */

static void die(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "fi_msg_check FAILED: %s: ", role);
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    fflush(stdout);
    exit(1);
}

#define CHECK(call)                                                                          \
    do {                                                                                     \
        int ret_ = (int)(call);                                                              \
        if (ret_)                                                                            \
            die("%s: %d (%s)", #call, ret_, fi_strerror(-ret_));                             \
    } while (0)

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* The byte at `i` of a buffer filled for `seed`: differs by seed and has no period of 256, so a
 * stale, shifted or misplaced buffer does not pass. */
static unsigned char pattern(uint32_t seed, size_t i)
{
    uint32_t x = (uint32_t)i * 2654435761u ^ (seed + 1) * 40503u;
    return (unsigned char)(x ^ (x >> 13) ^ (x >> 24));
}

static void fill(unsigned char *p, size_t len, uint32_t seed)
{
    for (size_t i = 0; i < len; i++)
        p[i] = pattern(seed, i);
}

static void check(const char *what, const unsigned char *p, size_t len, uint32_t seed)
{
    for (size_t i = 0; i < len; i++)
        if (p[i] != pattern(seed, i))
            die("%s: byte %zu of %zu is 0x%02x, want 0x%02x", what, i, len, p[i],
                pattern(seed, i));
}

/* Takes one completion (or error) off the CQ and books it. */
static void take_completion(void)
{
    struct fi_cq_msg_entry e;
    ssize_t n;
    double deadline = now() + timeout_s;
    for (;;) {
        if (use_sread) {
            n = fi_cq_sread(cq, &e, 1, NULL, 1000);
            sread_waits++;
        } else {
            n = fi_cq_read(cq, &e, 1);
            polls++;
        }
        if (n == 1)
            break;
        if (n == -FI_EAVAIL) {
            struct fi_cq_err_entry err;
            memset(&err, 0, sizeof err);
            fi_cq_readerr(cq, &err, 0);
            die("completion error: %s (prov_errno %d: %s), flags 0x%" PRIx64, fi_strerror(err.err),
                err.prov_errno, fi_cq_strerror(cq, err.prov_errno, err.err_data, NULL, 0),
                (uint64_t)err.flags);
        }
        if (n != -FI_EAGAIN)
            die("%s: %zd (%s)", use_sread ? "fi_cq_sread" : "fi_cq_read", n,
                fi_strerror((int)-n));
        if (now() > deadline)
            die("no completion in %d s (waiting %s, %d sends/RMA pending, receive %s)", timeout_s,
                use_sread ? "with fi_cq_sread" : "polling fi_cq_read", tx_pending,
                recv_ready ? "ready" : "pending");
    }
    if (e.flags & FI_RECV) {
        if (e.op_context != &recv_ctx)
            die("receive completion with a foreign context");
        if (recv_ready)
            die("two receives completed at once");
        recv_ready = 1;
        recv_len = e.len;
    } else if (e.flags & (FI_SEND | FI_RMA | FI_READ | FI_WRITE)) {
        if (tx_pending <= 0)
            die("a send/RMA completion nobody waited for (flags 0x%" PRIx64 ")",
                (uint64_t)e.flags);
        tx_pending--;
    } else {
        die("completion with flags 0x%" PRIx64, (uint64_t)e.flags);
    }
}

static void post_recv(void)
{
    ssize_t r;
    while ((r = fi_recv(ep, buf + RECV_OFF, BIG_LEN + SLACK, desc, 0, &recv_ctx)) == -FI_EAGAIN)
        ;
    if (r)
        die("fi_recv: %zd (%s)", r, fi_strerror((int)-r));
}

/* Waits for the next message, reposts the receive buffer, returns the message's length (its
 * bytes stay in the buffer until the next receive completes: the protocol is a strict
 * alternation, so nothing arrives before this side sends). */
static size_t wait_recv(unsigned char *copy, size_t copy_max)
{
    while (!recv_ready)
        take_completion();
    size_t len = recv_len;
    if (copy) {
        if (len > copy_max)
            die("a message of %zu bytes, at most %zu expected", len, copy_max);
        memcpy(copy, buf + RECV_OFF, len);
    }
    recv_ready = 0;
    post_recv();
    return len;
}

static void wait_tx(void)
{
    while (tx_pending > 0)
        take_completion();
}

static void send_bytes(size_t len)
{
    ssize_t r;
    while ((r = fi_send(ep, buf + SEND_OFF, len, desc, 0, &send_ctx)) == -FI_EAGAIN)
        ;
    if (r)
        die("fi_send of %zu bytes: %zd (%s)", len, r, fi_strerror((int)-r));
    tx_pending++;
    wait_tx();
}

static void send_ctl(uint32_t type, uint64_t addr, uint64_t key, uint64_t len, uint64_t arg)
{
    struct ctl c = {CTL_MAGIC, type, addr, key, len, arg};
    memcpy(buf + SEND_OFF, &c, sizeof c);
    send_bytes(sizeof c);
}

static struct ctl recv_ctl(uint32_t want)
{
    struct ctl c;
    size_t len = wait_recv((unsigned char *)&c, sizeof c);
    if (len != sizeof c || c.magic != CTL_MAGIC || c.type != want)
        die("expected control message %u, got %zu bytes (type %u)", want, len,
            len == sizeof c ? c.type : 0);
    return c;
}

static void rma(int write, size_t off, size_t len, uint64_t raddr, uint64_t key)
{
    ssize_t r;
    for (;;) {
        r = write ? fi_write(ep, buf + off, len, desc, 0, raddr, key, &rma_ctx)
                  : fi_read(ep, buf + off, len, desc, 0, raddr, key, &rma_ctx);
        if (r != -FI_EAGAIN)
            break;
    }
    if (r)
        die("%s of %zu bytes: %zd (%s)", write ? "fi_write" : "fi_read", len, r,
            fi_strerror((int)-r));
    tx_pending++;
    wait_tx();
}

/* The next event on the EQ, which must be `want` (FI_CONNREQ, FI_CONNECTED, FI_SHUTDOWN). */
static void wait_event(uint32_t want, struct fi_eq_cm_entry *entry, size_t entry_len)
{
    uint32_t event = 0;
    double deadline = now() + timeout_s;
    for (;;) {
        ssize_t n = fi_eq_sread(eq, &event, entry, entry_len, 1000, 0);
        if (n >= 0)
            break;
        if (n == -FI_EAVAIL) {
            struct fi_eq_err_entry err;
            memset(&err, 0, sizeof err);
            fi_eq_readerr(eq, &err, 0);
            die("event queue error waiting for event %u: %s (prov_errno %d: %s)", want,
                fi_strerror(err.err), err.prov_errno,
                fi_eq_strerror(eq, err.prov_errno, err.err_data, NULL, 0));
        }
        if (n != -FI_EAGAIN && n != -FI_ETIMEDOUT)
            die("fi_eq_sread: %zd (%s)", n, fi_strerror((int)-n));
        if (now() > deadline)
            die("no event %u in %d s", want, timeout_s);
    }
    if (event != want)
        die("event %u, expected %u", event, want);
}

static struct fi_info *hints_for(const char *prov)
{
    struct fi_info *h = fi_allocinfo();
    if (!h)
        die("fi_allocinfo");
    h->ep_attr->type = FI_EP_MSG;
    h->caps = FI_MSG | FI_RMA;
    h->mode = FI_CONTEXT;
    h->domain_attr->mr_mode = FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY;
    h->fabric_attr->prov_name = strdup(prov);
    h->addr_format = FI_SOCKADDR_IN;
    return h;
}

static void open_resources(struct fi_info *info)
{
    struct fi_cq_attr cq_attr;
    memset(&cq_attr, 0, sizeof cq_attr);
    cq_attr.size = 64;
    cq_attr.format = FI_CQ_FORMAT_MSG;
    cq_attr.wait_obj = FI_WAIT_UNSPEC; /* polled with fi_cq_read, waited on with fi_cq_sread */
    max_msg_size = info->ep_attr->max_msg_size;
    CHECK(fi_domain(fabric, info, &domain, NULL));
    CHECK(fi_endpoint(domain, info, &ep, NULL));
    CHECK(fi_cq_open(domain, &cq_attr, &cq, NULL));
    CHECK(fi_ep_bind(ep, &eq->fid, 0));
    CHECK(fi_ep_bind(ep, &cq->fid, FI_TRANSMIT | FI_RECV));
    CHECK(fi_enable(ep));
    buf = aligned_alloc(4096, BUF_LEN);
    if (!buf)
        die("aligned_alloc");
    memset(buf, 0, BUF_LEN);
    CHECK(fi_mr_reg(domain, buf, BUF_LEN,
                    FI_SEND | FI_RECV | FI_READ | FI_WRITE | FI_REMOTE_READ | FI_REMOTE_WRITE, 0,
                    0, 0, &mr, NULL));
    desc = fi_mr_desc(mr);
    post_recv();
}

static void open_eq(void)
{
    struct fi_eq_attr eq_attr;
    memset(&eq_attr, 0, sizeof eq_attr);
    eq_attr.wait_obj = FI_WAIT_UNSPEC;
    CHECK(fi_eq_open(fabric, &eq_attr, &eq, NULL));
}

static void teardown(void)
{
    CHECK(fi_close(&ep->fid));
    CHECK(fi_close(&mr->fid));
    CHECK(fi_close(&cq->fid));
    CHECK(fi_close(&domain->fid));
    if (pep)
        CHECK(fi_close(&pep->fid));
    CHECK(fi_close(&eq->fid));
    CHECK(fi_close(&fabric->fid));
    free(buf);
}

static void usage(void)
{
    fprintf(stderr, "usage: fi_msg_check -s [-b ADDR] [-p PORT] [-P PROV] [-t SECONDS]\n"
                    "       fi_msg_check -c SERVER_ADDR [-p PORT] [-P PROV] [-t SECONDS]\n");
    exit(2);
}

int main(int argc, char **argv)
{
    int server = 0, opt;
    const char *peer = NULL, *bind_addr = NULL, *port = "47593", *prov = "verbs";
    /* Line by line even into a pipe: a crash must not take the lines before it along. */
    setvbuf(stdout, NULL, _IOLBF, 0);
    while ((opt = getopt(argc, argv, "sc:b:p:P:t:")) != -1) {
        switch (opt) {
        case 's': server = 1; break;
        case 'c': peer = optarg; break;
        case 'b': bind_addr = optarg; break;
        case 'p': port = optarg; break;
        case 'P': prov = optarg; break;
        case 't': timeout_s = atoi(optarg); break;
        default: usage();
        }
    }
    if (server == (peer != NULL))
        usage();
    role = server ? "server" : "client";
    setvbuf(stdout, NULL, _IOLBF, 0);
    double t0 = now();

    struct fi_info *hints = hints_for(prov), *info = NULL;
    int ret = server ? fi_getinfo(FI_VERSION(1, 17), bind_addr, port, FI_SOURCE, hints, &info)
                     : fi_getinfo(FI_VERSION(1, 17), peer, port, 0, hints, &info);
    if (ret)
        die("fi_getinfo(node %s, service %s%s): %d (%s)", server ? (bind_addr ? bind_addr : "NULL")
                                                                 : peer,
            port, server ? ", FI_SOURCE" : "", ret, fi_strerror(-ret));
    printf("fi_msg_check %s: provider %s, fabric %s, domain %s, max_msg_size %zu\n", role,
           info->fabric_attr->prov_name, info->fabric_attr->name, info->domain_attr->name,
           info->ep_attr->max_msg_size);
    CHECK(fi_fabric(info->fabric_attr, &fabric, NULL));
    open_eq();

    struct {
        struct fi_eq_cm_entry e;
        unsigned char private_data[256];
    } entry;
    uint64_t raddr = 0, rkey = 0;
    if (server) {
        CHECK(fi_passive_ep(fabric, info, &pep, NULL));
        CHECK(fi_pep_bind(pep, &eq->fid, 0));
        CHECK(fi_listen(pep));
        printf("fi_msg_check server: listening on port %s (node %s)\n", port,
               bind_addr ? bind_addr : "NULL");
        /* The test harness waits for this line: no deadline on the first event. */
        int saved = timeout_s;
        timeout_s = 600;
        wait_event(FI_CONNREQ, &entry.e, sizeof entry);
        timeout_s = saved;
        struct fi_info *conn = entry.e.info;
        if (!conn)
            die("FI_CONNREQ without info");
        open_resources(conn);
        CHECK(fi_accept(ep, NULL, 0));
        wait_event(FI_CONNECTED, &entry.e, sizeof entry);
        if (entry.e.fid != &ep->fid)
            die("FI_CONNECTED for another endpoint");
        printf("fi_msg_check server: connection request on domain %s, max_msg_size %zu\n",
               conn->domain_attr->name, conn->ep_attr->max_msg_size);
        fi_freeinfo(conn);
    } else {
        open_resources(info);
        CHECK(fi_connect(ep, info->dest_addr, NULL, 0));
        wait_event(FI_CONNECTED, &entry.e, sizeof entry);
        if (entry.e.fid != &ep->fid)
            die("FI_CONNECTED for another endpoint");
    }
    printf("fi_msg_check %s: connected after %.2f s\n", role, now() - t0);

    /* 1. Keys of the server's RMA buffer. */
    if (server) {
        fill(buf + RMA_OFF, BIG_LEN, 4242);
        send_ctl(CTL_KEYS, (uint64_t)(uintptr_t)(buf + RMA_OFF), fi_mr_key(mr), BIG_LEN, 0);
    } else {
        struct ctl k = recv_ctl(CTL_KEYS);
        if (k.len != BIG_LEN)
            die("the server's buffer is %" PRIu64 " bytes", k.len);
        raddr = k.addr;
        rkey = k.key;
    }

    /* 2. Ping-pongs of 1 KiB. */
    double tp = now();
    for (uint32_t i = 0; i < PINGS; i++) {
        if (!server) {
            fill(buf + SEND_OFF, PING_LEN, i);
            send_bytes(PING_LEN);
        }
        size_t len = wait_recv(NULL, 0);
        char what[64];
        snprintf(what, sizeof what, "ping-pong %u", i);
        if (len != PING_LEN)
            die("%s: %zu bytes received, %d sent", what, len, PING_LEN);
        check(what, buf + RECV_OFF, PING_LEN, server ? i : 1000 + i);
        if (server) {
            fill(buf + SEND_OFF, PING_LEN, 1000 + i);
            send_bytes(PING_LEN);
        }
    }
    double ping_us = (now() - tp) / PINGS * 1e6;

    /* 3. RMA of 64 KiB: read the server's bytes, write ours, read them back. */
    if (!server) {
        rma(0, RMA_OFF, RMA_LEN, raddr, rkey);
        check("fi_read of the server's buffer", buf + RMA_OFF, RMA_LEN, 4242);
        fill(buf + SEND_OFF + SLACK, RMA_LEN, 777);
        rma(1, SEND_OFF + SLACK, RMA_LEN, raddr, rkey);
        memset(buf + RMA_OFF, 0, RMA_LEN);
        rma(0, RMA_OFF, RMA_LEN, raddr, rkey);
        check("fi_read after fi_write", buf + RMA_OFF, RMA_LEN, 777);
        send_ctl(CTL_RMA_DONE, 0, 0, RMA_LEN, 0);
        recv_ctl(CTL_RMA_OK);
    } else {
        recv_ctl(CTL_RMA_DONE);
        check("the server's buffer after fi_write", buf + RMA_OFF, RMA_LEN, 777);
        for (size_t i = RMA_LEN; i < 2 * RMA_LEN; i++)
            if (buf[RMA_OFF + i] != pattern(4242, i))
                die("the fi_write of %d bytes changed byte %zu", RMA_LEN, i);
        send_ctl(CTL_RMA_OK, 0, 0, RMA_LEN, 0);
    }

    /* 4. 1 MiB in one message, waited for through the completion channel. */
    int big_send = max_msg_size >= BIG_LEN;
    use_sread = 1;
    double tb = now();
    if (!server) {
        if (big_send) {
            fill(buf + SEND_OFF, BIG_LEN, 9999);
            send_bytes(BIG_LEN);
        } else {
            fill(buf + SEND_OFF, BIG_LEN, 9999);
            rma(1, SEND_OFF, BIG_LEN, raddr, rkey);
            send_ctl(CTL_BIG_RMA_DONE, 0, 0, BIG_LEN, 0);
        }
        struct ctl ok = recv_ctl(CTL_BIG_OK);
        if (ok.arg != BIG_LEN)
            die("the server checked %" PRIu64 " bytes of the 1 MiB", ok.arg);
    } else {
        if (big_send) {
            size_t len = wait_recv(NULL, 0);
            if (len != BIG_LEN)
                die("1 MiB fi_send: %zu bytes received", len);
            check("1 MiB fi_send", buf + RECV_OFF, BIG_LEN, 9999);
        } else {
            recv_ctl(CTL_BIG_RMA_DONE);
            check("1 MiB fi_write", buf + RMA_OFF, BIG_LEN, 9999);
        }
        send_ctl(CTL_BIG_OK, 0, 0, BIG_LEN, BIG_LEN);
    }
    double big_ms = (now() - tb) * 1e3;
    use_sread = 0;

    /* 5. Shutdown: the client ends the connection, both sides see FI_SHUTDOWN. */
    if (!server)
        CHECK(fi_shutdown(ep, 0));
    wait_event(FI_SHUTDOWN, &entry.e, sizeof entry);
    if (entry.e.fid != &ep->fid)
        die("FI_SHUTDOWN for another endpoint");
    teardown();
    fi_freeinfo(info);
    fi_freeinfo(hints);
    printf("fi_msg_check ok role=%s pings=%d ping_rtt_us=%.1f rma=%d big=%s big_ms=%.1f "
           "sread_waits=%lu polls=%lu total_s=%.2f\n",
           role, PINGS, ping_us, RMA_LEN, big_send ? "fi_send" : "fi_write", big_ms, sread_waits,
           polls, now() - t0);
    return 0;
}
