// SPDX-License-Identifier: GPL-2.0
/*
 * xroce_xdp: steer RoCEv2 (UDP destination port 4791) to an AF_XDP socket.
 *
 * Runs on every frame the interface receives. It parses
 *   Ethernet [one or two tags: 802.1Q, 802.1ad, 0x9100] | IPv4 (options allowed) or IPv6
 *   (up to 3 hop-by-hop / routing / destination-options extension headers) | UDP
 * and, when the UDP destination port is 4791 (IBTA Annex A17.2: the RoCEv2 port), redirects
 * the frame into the XSKMAP slot of the receive queue it arrived on, if xroce's parser
 * (src/wire/frame.rs) takes it: no tag or one 802.1Q tag, IPv4 with or without options, IPv6
 * without extension headers. RoCEv2 it does not take goes to the kernel, counted as
 * unsupported: stacked or 802.1ad tags (an address vector has one 802.1Q tag, a reply could
 * not go back that way) and IPv6 extension headers (the ICRC masks only fixed IPv6 header
 * fields, so it cannot be verified over headers that change in flight). Everything else,
 * and RoCE that arrives on a queue with no socket, goes on to the kernel (XDP_PASS)
 * untouched. IP fragments are passed too: only a whole datagram can be a RoCE packet.
 *
 * The helpers are declared here (no libbpf headers needed); GPL is required by the verifier
 * for bpf_redirect_map.
 */
#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/ipv6.h>
#include <linux/udp.h>

#define SEC(name) __attribute__((section(name), used))
#define __uint(name, val) int(*name)[val]
#define __type(name, val) typeof(val) *name
#define ALWAYS_INLINE static __attribute__((always_inline)) inline

static void *(*bpf_map_lookup_elem)(void *map, const void *key) = (void *)BPF_FUNC_map_lookup_elem;
static long (*bpf_redirect_map)(void *map, __u64 key, __u64 flags) = (void *)BPF_FUNC_redirect_map;

#define ROCEV2_UDP_PORT 4791
#define ETH_P_8021Q_ 0x8100
#define ETH_P_8021AD_ 0x88A8
#define ETH_P_QINQ_9100 0x9100
#define IPV6_MAX_EXT_HEADERS 3

/* Receive queue index -> AF_XDP socket. Filled in by the xroce driver. */
struct {
	__uint(type, BPF_MAP_TYPE_XSKMAP);
	__uint(max_entries, 64);
	__type(key, __u32);
	__type(value, __u32);
} xsks SEC(".maps");

/* Counter indexes; keep in sync with src/driver/xdp/bpf.rs. */
enum {
	CNT_SEEN = 0,       /* every frame looked at */
	CNT_REDIRECTED = 1, /* RoCEv2 frames handed to the AF_XDP socket */
	CNT_PASSED = 2,     /* frames passed to the kernel (not RoCEv2) */
	CNT_MALFORMED = 3,  /* truncated or inconsistent headers (passed; the kernel drops them) */
	CNT_NO_SOCKET = 4,  /* RoCEv2 on a queue with no socket bound (passed) */
	CNT_UNSUPPORTED = 5, /* RoCEv2 behind headers xroce does not take (passed) */
	CNT_MAX = 6,
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, CNT_MAX);
	__type(key, __u32);
	__type(value, __u64);
} counters SEC(".maps");

ALWAYS_INLINE void count(__u32 idx)
{
	__u64 *v = bpf_map_lookup_elem(&counters, &idx);
	if (v)
		*v += 1; /* per-CPU slot: no atomics needed */
}

ALWAYS_INLINE int pass(__u32 why)
{
	count(why);
	return XDP_PASS;
}

/* Returns the UDP header if the packet is a whole IPv4 UDP datagram, else NULL. */
ALWAYS_INLINE struct udphdr *ipv4_udp(void *l3, void *end, int *malformed)
{
	struct iphdr *ip = l3;
	if ((void *)(ip + 1) > end) {
		*malformed = 1;
		return 0;
	}
	__u32 ihl = ip->ihl * 4;
	if (ip->version != 4 || ihl < sizeof(*ip)) {
		*malformed = 1;
		return 0;
	}
	/* More-fragments flag set or a non-zero offset: a fragment. */
	if (ip->frag_off & __builtin_bswap16(0x3FFF))
		return 0;
	if (ip->protocol != IPPROTO_UDP)
		return 0;
	struct udphdr *udp = l3 + ihl;
	if ((void *)(udp + 1) > end) {
		*malformed = 1;
		return 0;
	}
	return udp;
}

/* As ipv4_udp; *ext_headers is set when extension headers precede UDP. */
ALWAYS_INLINE struct udphdr *ipv6_udp(void *l3, void *end, int *malformed, int *ext_headers)
{
	struct ipv6hdr *ip6 = l3;
	if ((void *)(ip6 + 1) > end) {
		*malformed = 1;
		return 0;
	}
	if (ip6->version != 6) {
		*malformed = 1;
		return 0;
	}
	__u8 next = ip6->nexthdr;
	void *cursor = ip6 + 1;
#pragma unroll
	for (int i = 0; i < IPV6_MAX_EXT_HEADERS; i++) {
		if (next != IPPROTO_HOPOPTS && next != IPPROTO_ROUTING && next != IPPROTO_DSTOPTS)
			break;
		__u8 *ext = cursor;
		if ((void *)(ext + 2) > end) {
			*malformed = 1;
			return 0;
		}
		next = ext[0];
		cursor += (ext[1] + 1) * 8;
		*ext_headers = 1;
	}
	if (next != IPPROTO_UDP) /* includes the fragment header (44) */
		return 0;
	struct udphdr *udp = cursor;
	if ((void *)(udp + 1) > end) {
		*malformed = 1;
		return 0;
	}
	return udp;
}

SEC("xdp")
int xroce_xdp(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *end = (void *)(long)ctx->data_end;
	int malformed = 0;
	int unsupported = 0; /* RoCEv2 here goes to the kernel: src/wire/frame.rs refuses it */

	count(CNT_SEEN);

	struct ethhdr *eth = data;
	if ((void *)(eth + 1) > end)
		return pass(CNT_MALFORMED);
	__u16 proto = eth->h_proto;
	void *l3 = eth + 1;

	/* Up to two VLAN tags. Only a single 802.1Q tag is taken; a second tag, or an 802.1ad
	 * (or 0x9100) outer tag, makes RoCEv2 unsupported. */
#pragma unroll
	for (int i = 0; i < 2; i++) {
		int c_tag = proto == __builtin_bswap16(ETH_P_8021Q_);
		if (!c_tag && proto != __builtin_bswap16(ETH_P_8021AD_) &&
		    proto != __builtin_bswap16(ETH_P_QINQ_9100))
			break;
		if (!c_tag || i > 0)
			unsupported = 1;
		__u16 *tag = l3; /* TCI, then the encapsulated EtherType */
		if ((void *)(tag + 2) > end)
			return pass(CNT_MALFORMED);
		proto = tag[1];
		l3 = tag + 2;
	}

	struct udphdr *udp;
	if (proto == __builtin_bswap16(ETH_P_IP))
		udp = ipv4_udp(l3, end, &malformed);
	else if (proto == __builtin_bswap16(ETH_P_IPV6))
		udp = ipv6_udp(l3, end, &malformed, &unsupported);
	else
		return pass(CNT_PASSED);

	if (!udp)
		return pass(malformed ? CNT_MALFORMED : CNT_PASSED);
	if (udp->dest != __builtin_bswap16(ROCEV2_UDP_PORT))
		return pass(CNT_PASSED);
	if (unsupported)
		return pass(CNT_UNSUPPORTED);

	__u32 queue = ctx->rx_queue_index;
	if (!bpf_map_lookup_elem(&xsks, &queue))
		return pass(CNT_NO_SOCKET);
	long action = bpf_redirect_map(&xsks, queue, XDP_PASS);
	count(action == XDP_REDIRECT ? CNT_REDIRECTED : CNT_NO_SOCKET);
	return action;
}

char LICENSE[] SEC("license") = "GPL";
