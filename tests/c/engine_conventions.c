/* What MPI, UCX and libfabric expect of a libibverbs device, checked one by one on the
 * device named in argv[1] (tests/ibverbs_conventions.rs runs it on xroce's library over a
 * veth end at MTU 9000). Each check prints "ok NAME" or "FAIL NAME: why"; the exit status
 * is the number of failures. rdma-core with rxe or mlx5 passes every check. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <infiniband/verbs.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/stat.h>
#include <unistd.h>

static int failures;

static void check(const char *name, int good, const char *why)
{
	if (good) {
		printf("ok %s\n", name);
	} else {
		printf("FAIL %s: %s\n", name, why);
		failures++;
	}
}

static int set_nonblocking(int fd)
{
	int flags = fcntl(fd, F_GETFL);
	return flags < 0 ? -1 : fcntl(fd, F_SETFL, flags | O_NONBLOCK);
}

static struct ibv_qp *make_qp(struct ibv_pd *pd, struct ibv_cq *cq, enum ibv_qp_type type,
			      uint32_t recv_wr, uint32_t inline_bytes)
{
	struct ibv_qp_init_attr init = {
		.send_cq = cq,
		.recv_cq = cq,
		.qp_type = type,
		.sq_sig_all = 1,
		.cap = { .max_send_wr = 16, .max_recv_wr = recv_wr, .max_send_sge = 1,
			 .max_recv_sge = 1, .max_inline_data = inline_bytes },
	};
	struct ibv_qp *qp = ibv_create_qp(pd, &init);
	if (qp && inline_bytes)
		printf("info %s QP asked %u inline bytes, got %u\n",
		       type == IBV_QPT_UD ? "UD" : "RC", inline_bytes, init.cap.max_inline_data);
	return qp;
}

static int to_init(struct ibv_qp *qp, int ud)
{
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .port_num = 1, .qkey = 0x11111111,
				 .qp_access_flags = IBV_ACCESS_REMOTE_WRITE };
	int mask = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT;
	mask |= ud ? IBV_QP_QKEY : IBV_QP_ACCESS_FLAGS;
	return ibv_modify_qp(qp, &a, mask);
}

static int rc_to_rtr(struct ibv_qp *qp, enum ibv_mtu mtu, union ibv_gid *dgid)
{
	struct ibv_qp_attr a = {
		.qp_state = IBV_QPS_RTR, .path_mtu = mtu, .dest_qp_num = qp->qp_num,
		.rq_psn = 0, .max_dest_rd_atomic = 1, .min_rnr_timer = 12,
		.ah_attr = { .is_global = 1, .port_num = 1,
			     .grh = { .dgid = *dgid, .sgid_index = 1, .hop_limit = 64,
				      .flow_label = 0xffffffff } },
	};
	return ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU |
				 IBV_QP_DEST_QPN | IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC |
				 IBV_QP_MIN_RNR_TIMER);
}

static int wait_completion(struct ibv_cq *cq, struct ibv_wc *wc)
{
	for (int spins = 0; spins < 2000000; spins++) {
		int n = ibv_poll_cq(cq, 1, wc);
		if (n)
			return n;
		if (spins % 1000 == 999)
			usleep(100);
	}
	return 0;
}

int main(int argc, char **argv)
{
	if (argc != 2) {
		fprintf(stderr, "usage: %s DEVICE\n", argv[0]);
		return 100;
	}
	struct ibv_device **list = ibv_get_device_list(NULL);
	struct ibv_device *dev = NULL;
	for (int i = 0; list && list[i]; i++)
		if (!strcmp(ibv_get_device_name(list[i]), argv[1]))
			dev = list[i];
	if (!dev) {
		fprintf(stderr, "no device %s\n", argv[1]);
		return 100;
	}
	char why[640];

	/* UCX uses a device only if /dev/infiniband/<dev_name> is a character device it may
	 * open for reading and writing. */
	char node[512];
	struct stat st;
	snprintf(node, sizeof(node), "/dev/infiniband/%s", dev->dev_name);
	int is_node = stat(node, &st) == 0 && S_ISCHR(st.st_mode) && !access(node, R_OK | W_OK);
	snprintf(why, sizeof(why), "%s is not a read/write character device", node);
	check("device_node", is_node, why);

	struct ibv_context *ctx = ibv_open_device(dev);
	if (!ctx) {
		perror("ibv_open_device");
		return 100;
	}
	/* UCX registers async_fd with its epoll before it makes anything, and removes it when it
	 * closes: the fd must still be the file it registered. */
	int ep = epoll_create1(0);
	struct epoll_event ev = { .events = EPOLLIN };
	int added = epoll_ctl(ep, EPOLL_CTL_ADD, ctx->async_fd, &ev);

	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	struct ibv_comp_channel *channel = ibv_create_comp_channel(ctx);
	struct ibv_cq *cq = ibv_create_cq(ctx, 64, NULL, channel, 0);
	if (!pd || !channel || !cq) {
		perror("resources");
		return 100;
	}

	/* rdma-core's channel fds start blocking; with O_NONBLOCK the calls say EAGAIN. */
	int channel_flags = fcntl(channel->fd, F_GETFL);
	check("channel_fd_starts_blocking", channel_flags >= 0 && !(channel_flags & O_NONBLOCK),
	      "the completion channel's fd is O_NONBLOCK before the program asked");
	struct ibv_cq *ev_cq;
	void *ev_ctx;
	int rc = set_nonblocking(channel->fd) ? -2 : ibv_get_cq_event(channel, &ev_cq, &ev_ctx);
	snprintf(why, sizeof(why), "ibv_get_cq_event returned %d, errno %d", rc, errno);
	check("cq_event_nonblocking_eagain", rc == -1 && errno == EAGAIN, why);
	struct ibv_async_event aev;
	rc = set_nonblocking(ctx->async_fd) ? -2 : ibv_get_async_event(ctx, &aev);
	snprintf(why, sizeof(why), "ibv_get_async_event returned %d, errno %d", rc, errno);
	check("async_event_nonblocking_eagain", rc == -1 && errno == EAGAIN, why);

	struct ibv_device_attr dattr;
	struct ibv_port_attr pattr;
	union ibv_gid gid;
	if (ibv_query_device(ctx, &dattr) || ibv_query_port(ctx, 1, &pattr) ||
	    ibv_query_gid(ctx, 1, 1, &gid)) {
		perror("queries");
		return 100;
	}
	snprintf(why, sizeof(why), "max_cqe %d", dattr.max_cqe);
	check("max_cqe_as_deep_as_rxm_asks", dattr.max_cqe >= 262144, why);
	struct ibv_cq *deep = ibv_create_cq(ctx, 262144, NULL, NULL, 0);
	check("deep_cq_created", deep != NULL, "ibv_create_cq(262144) failed");
	if (deep)
		ibv_destroy_cq(deep);

	/* IBV_ACCESS_HUGETLB with on-demand paging is a hint. */
	size_t len = 1 << 16;
	char *buf = calloc(1, len);
	struct ibv_mr *odp = ibv_reg_mr(pd, buf, len,
					IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_ON_DEMAND |
					IBV_ACCESS_HUGETLB);
	snprintf(why, sizeof(why), "ibv_reg_mr: errno %d", errno);
	check("odp_hugetlb_mr", odp != NULL, why);
	if (odp)
		ibv_dereg_mr(odp);
	struct ibv_mr *mr = ibv_reg_mr(pd, buf, len, IBV_ACCESS_LOCAL_WRITE);
	if (!mr) {
		perror("ibv_reg_mr");
		return 100;
	}

	/* UCX sets every bit of the flow label; the GRH field takes the low 20. */
	struct ibv_ah_attr ah_attr = { .is_global = 1, .port_num = 1,
				       .grh = { .dgid = gid, .sgid_index = 1, .hop_limit = 64,
						.flow_label = 0xffffffff } };
	struct ibv_ah *ah = ibv_create_ah(pd, &ah_attr);
	snprintf(why, sizeof(why), "ibv_create_ah: errno %d", errno);
	check("ah_flow_label_all_ones", ah != NULL, why);

	/* Libraries find the limits by asking for too much: refused, and nothing printed. */
	struct ibv_qp *probe = make_qp(pd, cq, IBV_QPT_RC, 4, 1 << 20);
	check("inline_probe_refused", probe == NULL, "a QP with 1 MiB of inline data was made");

	/* A send-only QP. */
	struct ibv_qp *send_only = make_qp(pd, cq, IBV_QPT_RC, 0, 0);
	snprintf(why, sizeof(why), "ibv_create_qp: errno %d", errno);
	check("qp_without_receive_queue", send_only != NULL, why);

	/* RC: a path MTU above the port's is refused; the port's own, with an all-ones flow
	 * label, is taken. */
	struct ibv_qp *too_big = make_qp(pd, cq, IBV_QPT_RC, 4, 0);
	if (!too_big || to_init(too_big, 0)) {
		perror("RC QP");
		return 100;
	}
	if (pattr.active_mtu < IBV_MTU_4096) {
		int refused = rc_to_rtr(too_big, IBV_MTU_4096, &gid);
		snprintf(why, sizeof(why), "path MTU 4096 over active MTU %d: %d, errno %d",
			 pattr.active_mtu, refused, errno);
		check("path_mtu_above_port_refused", refused == EINVAL, why);
	}
	struct ibv_qp *rc2 = make_qp(pd, cq, IBV_QPT_RC, 4, 0);
	rc = rc2 && !to_init(rc2, 0) ? rc_to_rtr(rc2, pattr.active_mtu, &gid) : -1;
	snprintf(why, sizeof(why), "modify to RTR: %d, errno %d", rc, errno);
	check("rtr_flow_label_all_ones", rc == 0, why);

	/* UD: inline room as reported, and messages as large as the port's MTU. */
	struct ibv_qp *ud = make_qp(pd, cq, IBV_QPT_UD, 4, 16);
	if (!ud || to_init(ud, 1)) {
		perror("UD QP");
		return 100;
	}
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_RTR };
	struct ibv_qp_attr rts = { .qp_state = IBV_QPS_RTS, .sq_psn = 0 };
	struct ibv_qp_init_attr got;
	if (ibv_modify_qp(ud, &a, IBV_QP_STATE) ||
	    ibv_modify_qp(ud, &rts, IBV_QP_STATE | IBV_QP_SQ_PSN) ||
	    ibv_query_qp(ud, &a, IBV_QP_CAP, &got)) {
		perror("UD to RTS");
		return 100;
	}
	snprintf(why, sizeof(why), "asked 16 inline bytes, got %u", got.cap.max_inline_data);
	check("inline_rounded_up", got.cap.max_inline_data >= 32, why);
	struct ibv_sge sge = { .addr = (uintptr_t)buf, .length = 32, .lkey = mr->lkey };
	struct ibv_send_wr wr = { .wr_id = 1, .sg_list = &sge, .num_sge = 1,
				  .opcode = IBV_WR_SEND, .send_flags = IBV_SEND_INLINE,
				  .wr.ud = { .ah = ah, .remote_qpn = ud->qp_num,
					     .remote_qkey = 0x11111111 } };
	struct ibv_send_wr *bad;
	struct ibv_wc wc;
	rc = ibv_post_send(ud, &wr, &bad);
	snprintf(why, sizeof(why), "post of 32 inline bytes: %d", rc);
	check("inline_as_reported_accepted", rc == 0 && wait_completion(cq, &wc) == 1 &&
	      wc.status == IBV_WC_SUCCESS, why);
	uint32_t mtu_bytes = 128u << pattr.active_mtu;
	sge.length = mtu_bytes;
	wr.send_flags = 0;
	wr.wr_id = 2;
	rc = ibv_post_send(ud, &wr, &bad);
	int done = rc == 0 ? wait_completion(cq, &wc) : 0;
	snprintf(why, sizeof(why), "UD send of %u bytes (active MTU): post %d, status %s",
		 mtu_bytes, rc, done ? ibv_wc_status_str(wc.status) : "none");
	check("ud_message_of_port_mtu", done == 1 && wc.status == IBV_WC_SUCCESS, why);

	/* Closing in order; the epoll registration must still be the one UCX made. */
	ibv_destroy_qp(ud);
	if (rc2)
		ibv_destroy_qp(rc2);
	ibv_destroy_ah(ah);
	int removed = epoll_ctl(ep, EPOLL_CTL_DEL, ctx->async_fd, NULL);
	snprintf(why, sizeof(why), "EPOLL_CTL_ADD %d, EPOLL_CTL_DEL %d (errno %d)", added,
		 removed, errno);
	check("async_fd_stays_the_same_file", added == 0 && removed == 0, why);
	printf("%d failures\n", failures);
	return failures;
}
