// SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause
/* moat flood: a lab traffic generator. flood_gen runs under
 * BPF_PROG_TEST_RUN with BPF_F_TEST_XDP_LIVE_FRAMES: the kernel hands it a
 * template frame over and over, it rewrites the fields that make each frame a
 * new flow, patches the checksums and returns XDP_TX, which transmits the
 * frame out of the device named in the run's context.
 *
 * flood_count, flood_drop and flood_reflect are receivers for tests and
 * measurements. */
#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/ipv6.h>
#include <linux/tcp.h>
#include <linux/udp.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#include "flood_consts.h"
#include "parsing.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

/* Referenced so that they reach BTF and bpf2go generates them. */
struct flood_exported_types {
	enum rewrite_field rewrite;
	enum count_slot slot;
};
const struct flood_exported_types *unused_flood_exported_types __attribute__((unused));

/* Set from Go before load; the verifier prunes what a setting turns off.
 * The template's layout is fixed by the Go builder: an IPv4 header without
 * options or an IPv6 header without extension headers at cfg_l3_off, the L4
 * header right after it. */
volatile const __u8 cfg_family;     /* 4 or 6; anything else aborts */
volatile const __u8 cfg_l4proto;    /* IPPROTO_TCP, _UDP, _ICMP or _ICMPV6 */
volatile const __u8 cfg_sequential; /* walk the source prefix instead of random picks */
volatile const __u16 cfg_l3_off;    /* 14, or 18 with a VLAN tag */
volatile const __u16 cfg_tsval_off; /* offset of TSval in the TCP header, 0: none */
volatile const __u32 cfg_rewrite;   /* enum rewrite_field bits */
/* Source prefix, network order; IPv4 uses word 0. A source is
 * base | (x & mask), so it never leaves the prefix. */
volatile const __u32 cfg_src_base[4];
volatile const __u32 cfg_src_mask[4];
/* Sequential mode: this instance's n-th frame uses host number
 * seq_first + n * seq_stride, so threads interleave over one walk. */
volatile const __u64 cfg_seq_first;
volatile const __u64 cfg_seq_stride;
/* The template's headers, restored before every frame: live-frame pages are
 * recycled without being reset, and a receiver that answers with XDP_TX
 * (moat's SYN cookies) rewrites the very page it got. Once the receiver
 * frees it, the page comes back to this run's pool holding the reply, and
 * without the restore the generator would send that reply on. */
volatile const __u8 cfg_headers[FLOOD_HEADER_MAX];
volatile const __u32 cfg_headers_len; /* 1..FLOOD_HEADER_MAX */

/* Per-instance state. Each sending thread loads its own instance, and one
 * PROG_TEST_RUN runs on one CPU at a time, so none of this needs atomics. */
__u64 budget;     /* frames this instance may send in all, set from Go */
__u64 sent;       /* frames returned with XDP_TX */
__u64 prng_state; /* xorshift64* state, seeded from Go; never 0 */

static __always_inline __u64 next_random(void)
{
	__u64 x = prng_state;

	x ^= x >> 12;
	x ^= x << 25;
	x ^= x >> 27;
	prng_state = x;
	return x * 0x2545F4914F6CDD1DULL;
}

/* Incremental checksum update (RFC 1624, eqn. 3): accumulate ~old + new per
 * 16-bit word, then fold into the stored checksum. Words stay in network
 * order; the one's complement sum does not care about byte order. */
static __always_inline __u32 csum_delta16(__u32 acc, __u16 old, __u16 new)
{
	return acc + (__u16)~old + new;
}

static __always_inline __u32 csum_delta32(__u32 acc, __u32 old, __u32 new)
{
	acc = csum_delta16(acc, old & 0xffff, new & 0xffff);
	return csum_delta16(acc, old >> 16, new >> 16);
}

static __always_inline __u16 csum_apply(__u16 csum, __u32 acc)
{
	acc += (__u16)~csum;
	acc = (acc & 0xffff) + (acc >> 16);
	acc = (acc & 0xffff) + (acc >> 16);
	return ~acc;
}

/* Host number for word `word` of the source address (network order). */
static __always_inline __u32 src_host_word(int word, __u64 seq)
{
	if (!cfg_sequential)
		return (__u32)next_random();
	/* Sequential numbers fill the low 64 bits; higher host bits of an
	 * IPv6 prefix stay at the base. */
	if (cfg_family == 4 || word == 3)
		return bpf_htonl((__u32)seq);
	if (word == 2)
		return bpf_htonl((__u32)(seq >> 32));
	return 0;
}

/* Rewrites the source address and returns the checksum delta that the
 * pseudo-header of the L4 checksum sees. */
static __always_inline int rewrite_ipv4(void *data, void *end, __u32 *l4_acc, void **l4)
{
	struct iphdr *iph = data + cfg_l3_off;
	__u32 ip_acc = 0, old, new;
	__u64 seq = cfg_seq_first + sent * cfg_seq_stride;

	if ((void *)(iph + 1) > end)
		return -1;
	old = iph->saddr;
	new = cfg_src_base[0] | (src_host_word(3, seq) & cfg_src_mask[0]);
	ip_acc = csum_delta32(ip_acc, old, new);
	*l4_acc = csum_delta32(*l4_acc, old, new);
	iph->saddr = new;
	if (cfg_rewrite & FLOOD_REWRITE_IP_ID) {
		__u16 id = (__u16)next_random();

		ip_acc = csum_delta16(ip_acc, iph->id, id);
		iph->id = id;
	}
	iph->check = csum_apply(iph->check, ip_acc);
	*l4 = iph + 1;
	return 0;
}

static __always_inline int rewrite_ipv6(void *data, void *end, __u32 *l4_acc, void **l4)
{
	struct ipv6hdr *ip6h = data + cfg_l3_off;
	__u64 seq = cfg_seq_first + sent * cfg_seq_stride;
	int i;

	if ((void *)(ip6h + 1) > end)
		return -1;
#pragma unroll
	for (i = 0; i < 4; i++) {
		__u32 old, new;

		if (!cfg_src_mask[i])
			continue;
		old = ip6h->saddr.in6_u.u6_addr32[i];
		new = cfg_src_base[i] | (src_host_word(i, seq) & cfg_src_mask[i]);
		*l4_acc = csum_delta32(*l4_acc, old, new);
		ip6h->saddr.in6_u.u6_addr32[i] = new;
	}
	*l4 = ip6h + 1;
	return 0;
}

/* Rewrites the source and destination ports, which TCP and UDP both keep
 * in their first four bytes, and returns the checksum delta. */
static __always_inline __u32 rewrite_ports(__be16 *ports, __u32 acc)
{
	if (cfg_rewrite & FLOOD_REWRITE_SPORT) {
		__u16 port = (__u16)next_random();

		acc = csum_delta16(acc, ports[0], port);
		ports[0] = port;
	}
	if (cfg_rewrite & FLOOD_REWRITE_DPORT) {
		__u16 port = (__u16)next_random();

		acc = csum_delta16(acc, ports[1], port);
		ports[1] = port;
	}
	return acc;
}

static __always_inline int rewrite_tcp(void *l4, void *end, __u32 acc)
{
	struct tcphdr *th = l4;

	if ((void *)(th + 1) > end)
		return -1;
	acc = rewrite_ports(&th->source, acc);
	if (cfg_rewrite & FLOOD_REWRITE_SEQ) {
		__u32 seq = (__u32)next_random();

		acc = csum_delta32(acc, th->seq, seq);
		th->seq = seq;
	}
	if (cfg_rewrite & FLOOD_REWRITE_ACK) {
		__u32 ack = (__u32)next_random();

		acc = csum_delta32(acc, th->ack_seq, ack);
		th->ack_seq = ack;
	}
	if (cfg_rewrite & FLOOD_REWRITE_TSVAL) {
		__u32 *tsval = l4 + cfg_tsval_off;
		__u32 ts = (__u32)next_random();

		if ((void *)(tsval + 1) > end)
			return -1;
		acc = csum_delta32(acc, *tsval, ts);
		*tsval = ts;
	}
	th->check = csum_apply(th->check, acc);
	return 0;
}

static __always_inline int rewrite_udp(void *l4, void *end, __u32 acc)
{
	struct udphdr *uh = l4;
	__u16 check;

	if ((void *)(uh + 1) > end)
		return -1;
	acc = rewrite_ports(&uh->source, acc);
	check = csum_apply(uh->check, acc);
	/* 0 means "no checksum" in UDP; the same sum is sent as 0xffff. */
	uh->check = check ? check : 0xffff;
	return 0;
}

/* ICMP and ICMPv6 echo share a layout: type, code, checksum, identifier,
 * sequence. Only ICMPv6 has the addresses in its checksum (acc). */
static __always_inline int rewrite_icmp(void *l4, void *end, __u32 acc)
{
	__u16 *h = l4;

	if ((void *)(h + 4) > end)
		return -1;
	if (cfg_rewrite & FLOOD_REWRITE_ICMP_ECHO) {
		__u16 id = (__u16)next_random();
		__u16 seq = bpf_htons((__u16)sent);

		acc = csum_delta16(acc, h[2], id);
		acc = csum_delta16(acc, h[3], seq);
		h[2] = id;
		h[3] = seq;
	}
	h[1] = csum_apply(h[1], acc);
	return 0;
}

SEC("xdp")
int flood_gen(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *end = (void *)(long)ctx->data_end;
	__u32 l4_acc = 0;
	void *l4 = NULL;
	__u32 len;
	int err;

	/* Past the budget, frames are dropped rather than sent: however a run
	 * ends or is repeated, it cannot overshoot an exact count. */
	if (sent >= budget)
		return XDP_DROP;

	len = cfg_headers_len;
	if (len == 0 || len > FLOOD_HEADER_MAX)
		return XDP_ABORTED;
	if (bpf_xdp_store_bytes(ctx, 0, (void *)cfg_headers, len))
		return XDP_ABORTED;
	data = (void *)(long)ctx->data;
	end = (void *)(long)ctx->data_end;

	if (cfg_family == 4)
		err = rewrite_ipv4(data, end, &l4_acc, &l4);
	else if (cfg_family == 6)
		err = rewrite_ipv6(data, end, &l4_acc, &l4);
	else
		return XDP_ABORTED;
	if (err)
		return XDP_ABORTED;

	switch (cfg_l4proto) {
	case IPPROTO_TCP:
		err = rewrite_tcp(l4, end, l4_acc);
		break;
	case IPPROTO_UDP:
		err = rewrite_udp(l4, end, l4_acc);
		break;
	case IPPROTO_ICMP:
		err = rewrite_icmp(l4, end, 0);
		break;
	case IPPROTO_ICMPV6:
		err = rewrite_icmp(l4, end, l4_acc);
		break;
	default:
		return XDP_ABORTED;
	}
	if (err)
		return XDP_ABORTED;
	sent++;
	return XDP_TX;
}

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, FLOOD_COUNT_MAX);
	__type(key, __u32);
	__type(value, __u64);
} flood_counts SEC(".maps");

/* Set from Go: pass counted frames on to the stack instead of dropping. */
volatile const __u8 cfg_count_pass;
/* Set from Go: IPv4 frames to this address (network order; 0: none) go on
 * to the stack whatever cfg_count_pass says, so that a host's own traffic
 * gets through a counter that drops what comes back to spoofed sources. */
volatile const __u32 cfg_count_keep_v4;

/* Counts what arrives, by kind, then drops it or passes it on. Its presence
 * also gives a receiving veth the NAPI context that frames sent with XDP_TX
 * need. */
SEC("xdp")
int flood_count(struct xdp_md *ctx)
{
	struct packet p = {};
	int ret = parse_packet(ctx, &p);
	__u32 slot;
	__u64 *n;

	if (ret == PARSE_MALFORMED || ret == PARSE_EVASIVE)
		slot = FLOOD_COUNT_MALFORMED;
	else if (p.family == 0 || !p.has_l4)
		slot = FLOOD_COUNT_OTHER;
	else if (p.l4proto == IPPROTO_TCP)
		slot = (p.tcp_flags & 0x12) == 0x02 ? FLOOD_COUNT_TCP_SYN : FLOOD_COUNT_TCP_OTHER;
	else if (p.l4proto == IPPROTO_UDP)
		slot = FLOOD_COUNT_UDP;
	else if (p.l4proto == IPPROTO_ICMP || p.l4proto == IPPROTO_ICMPV6)
		slot = FLOOD_COUNT_ICMP;
	else
		slot = FLOOD_COUNT_OTHER;

	n = bpf_map_lookup_elem(&flood_counts, &slot);
	if (n)
		*n += 1;
	if (cfg_count_keep_v4 && p.family == 4) {
		__u32 daddr;

		__builtin_memcpy(&daddr, p.daddr, sizeof(daddr));
		if (daddr == cfg_count_keep_v4)
			return XDP_PASS;
	}
	return cfg_count_pass ? XDP_PASS : XDP_DROP;
}

/* The cheapest possible receiver: the floor for rate measurements. */
SEC("xdp")
int flood_drop(struct xdp_md *ctx)
{
	return XDP_DROP;
}

/* Sends every IPv4 TCP SYN back to where it came from as a SYN-ACK: MACs,
 * addresses and ports swapped, SYN and ACK the only flags, the sequence
 * number acknowledged. No lookup, no cookie, the options left as they came:
 * the least work that answers a SYN from XDP, so its rate is the ceiling
 * that the device's XDP_TX path sets for any SYN-cookie answerer. Swapping
 * two fields leaves a one's complement sum as it was, so only the flags
 * word and the acknowledgment number need a checksum update. Every other
 * frame goes on to the stack. */
SEC("xdp")
int flood_reflect(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *end = (void *)(long)ctx->data_end;
	struct ethhdr *eth = data;
	struct iphdr *iph = (void *)(eth + 1);
	struct tcphdr *th = (void *)(iph + 1);
	__u8 mac[ETH_ALEN];
	__u32 addr, ack, acc = 0;
	__u16 port, old_word, *word;

	if ((void *)(th + 1) > end || eth->h_proto != bpf_htons(ETH_P_IP) ||
	    iph->ihl != 5 || iph->protocol != IPPROTO_TCP)
		return XDP_PASS;
	/* A plain SYN: SYN set, ACK clear (the 13th byte holds the flags). */
	if ((((__u8 *)th)[13] & 0x12) != 0x02)
		return XDP_PASS;

	__builtin_memcpy(mac, eth->h_dest, ETH_ALEN);
	__builtin_memcpy(eth->h_dest, eth->h_source, ETH_ALEN);
	__builtin_memcpy(eth->h_source, mac, ETH_ALEN);
	addr = iph->saddr;
	iph->saddr = iph->daddr;
	iph->daddr = addr;
	port = th->source;
	th->source = th->dest;
	th->dest = port;

	word = (__u16 *)th + 6; /* data offset and flags */
	old_word = *word;
	((__u8 *)th)[13] = 0x12;
	acc = csum_delta16(acc, old_word, *word);
	ack = bpf_htonl(bpf_ntohl(th->seq) + 1);
	acc = csum_delta32(acc, th->ack_seq, ack);
	th->ack_seq = ack;
	th->check = csum_apply(th->check, acc);
	return XDP_TX;
}
