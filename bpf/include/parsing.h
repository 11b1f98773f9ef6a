/* SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause */
/* Header parsing with a cursor. Each parse_*() checks its bounds against
 * both the end of the frame and the end that the IP header declares, and
 * advances the cursor. Nothing here lets a packet skip a rule: a header we
 * cannot make sense of ends parsing with PARSE_MALFORMED, or PARSE_EVASIVE
 * when the stack would still make sense of it. */
#ifndef MOAT_PARSING_H
#define MOAT_PARSING_H

#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/ipv6.h>
#include <linux/tcp.h>
#include <linux/udp.h>
#include <linux/icmp.h>
#include <linux/icmpv6.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#include "moat_consts.h"

#ifndef ETH_P_8021AD
#define ETH_P_8021AD 0x88A8
#endif

#define IP_MF 0x2000
#define IP_OFFSET 0x1FFF
#define IP6_OFFSET 0xFFF8 /* fragment offset bits of frag_off, host order */
#define IP6_MF 0x0001     /* more fragments, host order */

enum parse_result {
	PARSE_OK = 0,
	PARSE_NON_IP = 1,
	/* Truncated or inconsistent headers, which the stack discards too. */
	PARSE_MALFORMED = 2,
	/* Headers the filter does not see through but the stack does, so
	 * that a rule would be skipped: a third VLAN tag, an IPv6 extension
	 * chain past the bound, an IPv4 TCP fragment at offset 8 bytes (RFC
	 * 1858), a first fragment that cuts its TCP, UDP or ICMP header (the
	 * stack reassembles it whole). No malformed policy passes them. */
	PARSE_EVASIVE = 3,
};

struct vlan_hdr {
	__be16 tci;
	__be16 encap_proto;
};

struct ipv6_frag_hdr {
	__u8 nexthdr;
	__u8 reserved;
	__be16 frag_off;
	__be32 identification;
};

struct cursor {
	void *pos;
	void *end;    /* end of the bytes the program can read (data_end) */
	void *l3_end; /* end of the IP datagram as its header declares */
	int first_fragment; /* offset 0 with more to come: L4 may go on past l3_end */
};

/* The TCP options moat reads (tcp_options.h). */
struct tcp_opts {
	__u32 tsval;
	__u32 tsecr;
	__u16 mss;
	__u8 has_mss;
	__u8 wscale;
	__u8 has_wscale;
	__u8 sack_ok;
	__u8 has_ts;
	__u8 signed_seg; /* a TCP-MD5 (RFC 2385) or TCP-AO (RFC 5925) option */
};

enum tcp_opts_state {
	TCP_OPTS_UNREAD = 0,
	TCP_OPTS_READ = 1,       /* opts holds them (all zero: none) */
	TCP_OPTS_UNREADABLE = 2, /* the copy out of the frame failed */
};

/* What the parser found out about a packet. */
struct packet {
	__u8 family;    /* 4 or 6, 0 when not IP */
	__u8 l4proto;   /* IPPROTO_* of the upper-layer header */
	__u8 has_l4;    /* the L4 header is present and whole */
	__u8 fragment;  /* 1: a non-first fragment (no L4 header) */
	__u8 addr_ok;   /* the IP header is whole: its source can be trusted */
	__u8 vlans;     /* number of VLAN tags */
	__u16 dport;    /* host order; the ICMP type for ICMP and ICMPv6 */
	__u16 sport;    /* host order */
	__u16 l3_off;   /* offset of the IP header in the frame */
	__u16 l4_off;   /* offset of the L4 header, when has_l4 */
	__u8 tcp_flags; /* the flags byte of the TCP header */
	__u8 tcp_optlen; /* bytes of TCP options (0-40) */
	__u8 saddr[16]; /* IPv4 uses the first 4 bytes */
	__u8 daddr[16];
	__u8 opts_state; /* enum tcp_opts_state: what opts holds */
	__u8 first_fragment; /* offset 0 with more fragments to come */
	__u16 l3_end;   /* offset of the end of the IP datagram (XDP: within the frame) */
	struct tcp_opts opts; /* filled on first use (xdp_tcp_options) */
	__u8 on_connection; /* TCP: enum rl_connection (ratelimit_structs.h), 0 until looked up */
	__u64 now;      /* CLOCK_BOOTTIME, read on first use (packet_now) */
};

/* The time the packet is handled at, CLOCK_BOOTTIME in ns: one clock read
 * per packet however many stages need it (a read is a helper call). */
static __always_inline __u64 packet_now(struct packet *p)
{
	if (!p->now)
		p->now = bpf_ktime_get_boot_ns();
	return p->now;
}

static __always_inline int parse_eth(struct cursor *c, struct packet *p, __u16 *proto)
{
	struct ethhdr *eth = c->pos;
	int i;

	if ((void *)(eth + 1) > c->end)
		return PARSE_MALFORMED;
	*proto = eth->h_proto;
	c->pos = eth + 1;

#pragma unroll
	for (i = 0; i < MAX_VLAN_DEPTH; i++) {
		struct vlan_hdr *vh = c->pos;

		if (*proto != bpf_htons(ETH_P_8021Q) && *proto != bpf_htons(ETH_P_8021AD))
			break;
		if ((void *)(vh + 1) > c->end)
			return PARSE_MALFORMED;
		*proto = vh->encap_proto;
		c->pos = vh + 1;
		p->vlans++;
	}
	/* More tags than we look through: refuse rather than guess. */
	if (*proto == bpf_htons(ETH_P_8021Q) || *proto == bpf_htons(ETH_P_8021AD))
		return PARSE_EVASIVE;
	return PARSE_OK;
}

/* The datagram's end as packet.l3_end keeps it: a GRO frame in generic
 * mode may end past 64 KiB, and a wrapped end would hide its payload from
 * the handshake matches; the end saturates instead (what lies past it is
 * never read there). */
static __always_inline __u16 l3_end_of(__u32 end)
{
	return end > 0xffff ? 0xffff : end;
}

/* What is left of a frame from an IP header on (room), as the length of
 * a datagram whose header gives none: capped where packet.l3_end
 * saturates (a frame in generic mode may go on past it; what lies there
 * is never read). */
static __always_inline __u32 frame_rest(__u64 room)
{
	return room > 0xffff ? 0xffff : room;
}

/* paged (a constant at every call): the packet may go on past c->end, in
 * page fragments of an skb that the program cannot read directly, so the
 * length the IP header declares is not held against c->end. The headers
 * themselves must still be readable. XDP frames are whole: never paged. */
static __always_inline int parse_ipv4(struct cursor *c, struct packet *p, __u8 *l4proto,
				      const int paged)
{
	struct iphdr *iph = c->pos;
	__u32 hdr_len, tot_len;
	__u16 frag;

	if ((void *)(iph + 1) > c->end)
		return PARSE_MALFORMED;
	if (iph->version != 4 || iph->ihl < 5)
		return PARSE_MALFORMED;
	hdr_len = iph->ihl * 4;
	if (c->pos + hdr_len > c->end)
		return PARSE_MALFORMED;

	/* The header is whole, so source rules apply even when the length
	 * below is a lie: a denied source must not get through by claiming
	 * more bytes than it sent (malformed policy "pass"). */
	p->family = 4;
	__builtin_memcpy(p->saddr, &iph->saddr, 4);
	__builtin_memcpy(p->daddr, &iph->daddr, 4);
	p->addr_ok = 1;

	/* Total length 0: BIG TCP's GRO builds such datagrams past 64 KiB in
	 * generic mode, and the stack takes their length from the skb. From
	 * the wire it drops them; moat judges them as any other. */
	tot_len = bpf_ntohs(iph->tot_len);
	if (!paged && tot_len == 0)
		tot_len = frame_rest(c->end - (void *)iph);
	if (tot_len < hdr_len || (!paged && c->pos + tot_len > c->end))
		return PARSE_MALFORMED;
	*l4proto = iph->protocol;

	frag = bpf_ntohs(iph->frag_off);
	if (frag & IP_OFFSET) {
		/* RFC 1858: an offset of 8 bytes can only serve to overwrite
		 * the TCP flags of the first fragment. */
		if ((frag & IP_OFFSET) == 1 && iph->protocol == IPPROTO_TCP)
			return PARSE_EVASIVE;
		p->fragment = 1;
	} else if (frag & IP_MF) {
		c->first_fragment = 1;
	}
	c->l3_end = c->pos + tot_len;
	p->l3_end = l3_end_of(p->l3_off + tot_len);
	c->pos += hdr_len;
	return PARSE_OK;
}

/* The payload length of an IPv6 packet whose header gives 0, as the stack
 * takes it: with a hop-by-hop header next, a jumbogram (RFC 2675; BIG
 * TCP's GRO builds them in generic mode), which the stack does not trim,
 * jumbo option or not: the rest of the frame (room), as frame_rest caps
 * it. Otherwise none. A global function: the verifier does not see into
 * its result (parse_ipv6). */
__attribute__((noinline)) __u32 ipv6_jumbo_len(__u32 nexthdr, __u64 room)
{
	if (nexthdr != IPPROTO_HOPOPTS)
		return 0;
	return frame_rest(room);
}

static __always_inline int is_ipv6_ext(__u8 nexthdr)
{
	return nexthdr == IPPROTO_HOPOPTS || nexthdr == IPPROTO_ROUTING ||
	       nexthdr == IPPROTO_DSTOPTS || nexthdr == IPPROTO_FRAGMENT ||
	       nexthdr == IPPROTO_AH;
}

static __always_inline int parse_ipv6(struct cursor *c, struct packet *p, __u8 *l4proto,
				      const int paged)
{
	struct ipv6hdr *ip6h = c->pos;
	__u32 plen;
	__u8 nexthdr;
	int i;

	if ((void *)(ip6h + 1) > c->end)
		return PARSE_MALFORMED;
	if (ip6h->version != 6)
		return PARSE_MALFORMED;

	/* An IPv4-mapped source (::ffff:a.b.c.d) would be judged by the IPv6
	 * lists, while a dual-stack socket takes it for the IPv4 host it
	 * names and answers over IPv4: a host on the IPv4 denylist would get
	 * through. No such source is valid on the wire (RFC 4291 2.5.5.2). */
	if (ip6h->saddr.in6_u.u6_addr32[0] == 0 && ip6h->saddr.in6_u.u6_addr32[1] == 0 &&
	    ip6h->saddr.in6_u.u6_addr32[2] == bpf_htonl(0xffff))
		return PARSE_EVASIVE;

	/* Whole header: source rules apply whatever the payload length says. */
	p->family = 6;
	__builtin_memcpy(p->saddr, &ip6h->saddr, 16);
	__builtin_memcpy(p->daddr, &ip6h->daddr, 16);
	p->addr_ok = 1;
	plen = bpf_ntohs(ip6h->payload_len);
	/* Laid out for the verifier, which walks the path of a branch before
	 * the jump: the call's result, any length, then covers every length
	 * of the other path, which it prunes there. Inline, the two would be
	 * walked apart through the rest of the program. */
	if (!paged && __builtin_expect(plen == 0, 1))
		plen = ipv6_jumbo_len(ip6h->nexthdr, c->end - (void *)(ip6h + 1)) & 0xffff;
	if (!paged && (void *)(ip6h + 1) + plen > c->end)
		return PARSE_MALFORMED;
	c->l3_end = (void *)(ip6h + 1) + plen;
	p->l3_end = l3_end_of((__u32)p->l3_off + sizeof(*ip6h) + plen);
	c->pos = ip6h + 1;
	nexthdr = ip6h->nexthdr;

	for (i = 0; i < MAX_IPV6_EXT_HDRS; i++) {
		struct ipv6_opt_hdr *oh = c->pos;
		__u32 len;

		if (!is_ipv6_ext(nexthdr))
			break;
		if (nexthdr == IPPROTO_FRAGMENT) {
			struct ipv6_frag_hdr *fh = c->pos;

			if ((void *)(fh + 1) > c->end || (void *)(fh + 1) > c->l3_end)
				return PARSE_MALFORMED;
			nexthdr = fh->nexthdr;
			c->pos = fh + 1;
			if (bpf_ntohs(fh->frag_off) & IP6_OFFSET) {
				p->fragment = 1;
				*l4proto = nexthdr;
				return PARSE_OK;
			}
			if (bpf_ntohs(fh->frag_off) & IP6_MF)
				c->first_fragment = 1;
			continue;
		}
		if ((void *)(oh + 1) > c->end || (void *)(oh + 1) > c->l3_end)
			return PARSE_MALFORMED;
		if (nexthdr == IPPROTO_AH)
			len = (oh->hdrlen + 2) * 4;
		else
			len = (oh->hdrlen + 1) * 8;
		if (c->pos + len > c->end || c->pos + len > c->l3_end)
			return PARSE_MALFORMED;
		nexthdr = oh->nexthdr;
		c->pos += len;
	}
	/* A chain longer than the bound is refused, never skipped: the stack
	 * walks chains of any length. */
	if (is_ipv6_ext(nexthdr))
		return PARSE_EVASIVE;
	*l4proto = nexthdr;
	return PARSE_OK;
}

/* Parses the L4 header at the cursor. Protocols without ports are fine as
 * they are; TCP, UDP, ICMP and ICMPv6 must be whole. */
static __always_inline int parse_l4(struct cursor *c, struct packet *p, void *data)
{
	p->l4_off = c->pos - data;

	switch (p->l4proto) {
	case IPPROTO_TCP: {
		struct tcphdr *th = c->pos;
		__u32 len;

		if ((void *)(th + 1) > c->end || (void *)(th + 1) > c->l3_end)
			return PARSE_MALFORMED;
		len = th->doff * 4;
		if (len < sizeof(*th) || c->pos + len > c->end || c->pos + len > c->l3_end)
			return PARSE_MALFORMED;
		p->sport = bpf_ntohs(th->source);
		p->dport = bpf_ntohs(th->dest);
		p->tcp_flags = ((__u8 *)th)[13];
		p->tcp_optlen = len - sizeof(*th);
		break;
	}
	case IPPROTO_UDP: {
		struct udphdr *uh = c->pos;

		if ((void *)(uh + 1) > c->end || (void *)(uh + 1) > c->l3_end)
			return PARSE_MALFORMED;
		/* Over IPv6 a length of 0 stands for the whole payload (RFC
		 * 2675), and the stack delivers such a datagram: its ports are
		 * judged. Over IPv4 the stack drops it. */
		if (bpf_ntohs(uh->len) < sizeof(*uh) && !(uh->len == 0 && p->family == 6))
			return PARSE_MALFORMED;
		p->sport = bpf_ntohs(uh->source);
		p->dport = bpf_ntohs(uh->dest);
		break;
	}
	case IPPROTO_ICMP:
	case IPPROTO_ICMPV6: {
		/* Type, code, checksum and the 4-byte rest of header. */
		__u8 *ic = c->pos;

		if ((p->l4proto == IPPROTO_ICMP) != (p->family == 4))
			return PARSE_OK; /* ICMP over IPv6 or ICMPv6 over IPv4: no type rules */
		if ((void *)(ic + 8) > c->end || (void *)(ic + 8) > c->l3_end)
			return PARSE_MALFORMED;
		p->dport = ic[0];
		break;
	}
	default:
		return PARSE_OK;
	}
	p->has_l4 = 1;
	return PARSE_OK;
}

/* Parses a frame in [data, data_end) up to and including its L4 header.
 * ipv6_tcp_only (a constant at every call, so the verifier never sees the
 * other branch) treats any IPv6 packet whose first header after IPv6 is not
 * TCP as not IP: for callers that never need the extension header walk.
 * paged (a constant too): the packet may go on past data_end (parse_ipv4). */
static __always_inline int parse_frame(void *data, void *data_end, struct packet *p,
				       const int ipv6_tcp_only, const int paged)
{
	struct cursor c = {
		.pos = data,
		.end = data_end,
	};
	__u16 proto;
	__u8 l4proto = 0;
	int ret;

	ret = parse_eth(&c, p, &proto);
	if (ret != PARSE_OK)
		return ret;

	p->l3_off = c.pos - data;
	if (proto == bpf_htons(ETH_P_IP)) {
		ret = parse_ipv4(&c, p, &l4proto, paged);
	} else if (proto == bpf_htons(ETH_P_IPV6)) {
		struct ipv6hdr *ip6h = c.pos;

		if (ipv6_tcp_only &&
		    ((void *)(ip6h + 1) > c.end || ip6h->nexthdr != IPPROTO_TCP))
			return PARSE_NON_IP;
		ret = parse_ipv6(&c, p, &l4proto, paged);
	} else {
		return PARSE_NON_IP;
	}
	/* A first fragment whose header chain breaks off is evasive, as one
	 * whose L4 header does (below): the stack judges the reassembled
	 * datagram, where the chain goes on in the next fragment. */
	if (ret == PARSE_MALFORMED && c.first_fragment)
		return PARSE_EVASIVE;
	if (ret != PARSE_OK)
		return ret;

	p->l4proto = l4proto;
	p->first_fragment = c.first_fragment;
	if (p->fragment)
		return PARSE_OK;
	ret = parse_l4(&c, p, data);
	if (ret == PARSE_MALFORMED && c.first_fragment)
		return PARSE_EVASIVE;
	return ret;
}

/* Parses an XDP frame, every header chain included. */
static __always_inline int parse_packet(struct xdp_md *ctx, struct packet *p)
{
	return parse_frame((void *)(long)ctx->data, (void *)(long)ctx->data_end, p, 0, 0);
}

#endif /* MOAT_PARSING_H */
