/* SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause */
/* Packet capture for moat dump. verdict() calls capture_hook() on every
 * packet; while no capture runs that is an inlined array lookup, a load and
 * a branch. The work is in capture_packet(), a global function: the
 * verifier checks it once, not once per verdict() site, which keeps the
 * filter inside its instruction budget.
 *
 * Records go through a BPF ring buffer rather than a perf event array with
 * bpf_xdp_output: one buffer for every CPU and interface bounds the memory
 * once, keeps records in time order for a single reader, and its wakeups
 * adapt to the reader (none while it is busy draining). Its reservations
 * are of constant size, so the frame is copied with bpf_xdp_load_bytes
 * straight into a record of the next size class up: no stack bounce, at
 * most about twice the bytes. */
#ifndef MOAT_CAPTURE_H
#define MOAT_CAPTURE_H

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

#include "moat_maps.h"
#include "parsing.h"
#include "policy.h"

/* Types only the control plane uses, kept in BTF for bpf2go. */
struct capture_exported_types {
	struct capture_record record;
	enum capture_verdict verdict;
	enum capture_filter filter;
};
const struct capture_exported_types *unused_capture_exported_types __attribute__((unused));

/* addr (16 bytes, any alignment) is inside the configured prefix. */
static __always_inline int capture_addr_in(const struct capture_config *c, const __u8 *addr)
{
	__u32 w[4];
	int i;

	/* pkt.saddr is not 4-byte aligned, and the verifier refuses
	 * misaligned stack loads: copy first. */
	__builtin_memcpy(w, addr, sizeof(w));
#pragma unroll
	for (i = 0; i < 4; i++)
		if ((w[i] & c->mask[i]) != c->addr[i])
			return 0;
	return 1;
}

/* Copies the record header and len bytes of the frame into a record with
 * room for size bytes. Returns 1 if written, 0 if the frame could not be
 * read, -1 if the ring is full. */
static __always_inline int capture_emit(struct xdp_md *ctx, const struct capture_record *hdr,
					__u64 len, const __u64 size)
{
	struct capture_record *rec;

	rec = bpf_ringbuf_reserve(&capture_ring, sizeof(*rec) + size, 0);
	if (!rec)
		return -1;
	*rec = *hdr;
	/* The caller picked size >= len, but the verifier needs to see the
	 * bound on the register the helper gets; the barrier stops clang
	 * from dropping the check it knows to be redundant, and 64 bits keep
	 * it from checking a zero-extended copy instead. */
	asm volatile("" : "+r"(len));
	if (len > size)
		len = size;
	if (len < 1 || bpf_xdp_load_bytes(ctx, 0, rec + 1, len) < 0) {
		bpf_ringbuf_discard(rec, 0);
		return 0;
	}
	bpf_ringbuf_submit(rec, 0);
	return 1;
}

/* parse_packet() without the walk through IPv6 extension headers: that
 * walk is most of what the verifier spends on the parser, and capture
 * would pay it a second time, doubling the program's verification. A
 * packet with extension headers keeps its addresses but has no protocol
 * or ports here, so protocol and port filters do not match it. */
static __always_inline int capture_parse(struct xdp_md *ctx, struct packet *p)
{
	void *data = (void *)(long)ctx->data;
	struct cursor c = {
		.pos = data,
		.end = (void *)(long)ctx->data_end,
	};
	struct ipv6hdr *ip6h;
	struct iphdr *iph;
	__u8 l4proto = 0;
	__u16 proto;
	int ret;

	ret = parse_eth(&c, p, &proto);
	if (ret != PARSE_OK)
		return ret;
	p->l3_off = c.pos - data;
	if (proto == bpf_htons(ETH_P_IP)) {
		iph = c.pos;
		ret = parse_ipv4(&c, p, &l4proto, 0);
		if (ret != PARSE_OK) {
			/* A whole header names its protocol even when its
			 * lengths lie (a total length past the frame): such a
			 * malformed flood is what a capture by protocol looks
			 * for. */
			if (p->addr_ok && (void *)(iph + 1) <= c.end)
				p->l4proto = iph->protocol;
			return ret;
		}
	} else if (proto == bpf_htons(ETH_P_IPV6)) {
		ip6h = c.pos;
		if ((void *)(ip6h + 1) > c.end || ip6h->version != 6)
			return PARSE_MALFORMED;
		p->family = 6;
		__builtin_memcpy(p->saddr, &ip6h->saddr, 16);
		__builtin_memcpy(p->daddr, &ip6h->daddr, 16);
		p->addr_ok = 1;
		l4proto = ip6h->nexthdr;
		if (is_ipv6_ext(l4proto))
			return PARSE_MALFORMED; /* not walked: no protocol, no ports */
		/* Known before the length is checked, as for IPv4. */
		p->l4proto = l4proto;
		c.l3_end = (void *)(ip6h + 1) + bpf_ntohs(ip6h->payload_len);
		if (c.l3_end > c.end)
			return PARSE_MALFORMED;
		c.pos = ip6h + 1;
	} else {
		return PARSE_NON_IP;
	}
	p->l4proto = l4proto;
	if (p->fragment)
		return PARSE_OK;
	return parse_l4(&c, p, data);
}

/* Size classes of records, in bytes of frame. */
#define CAPTURE_EMIT_CLASSES(X) X(64) X(128) X(256) X(512) X(1024) X(1536) X(2048) X(4096)

/* Fills in the rule that decided, found again: verdict() is not told, and
 * the lookups cost only packets that are captured. A global function of
 * its own, like capture_match(), so that the verifier checks its paths
 * once rather than once for each path through the parser. */
__noinline int capture_rule(const struct packet *pkt, __u32 reason, struct capture_record *hdr)
{
	struct prefix_rule *rule = NULL;
	struct port_rule *pr;
	__u32 idx;
	int class;

	if (!pkt || !hdr)
		return 0;
	if (pkt->addr_ok && reason == REASON_ALLOWLIST)
		rule = match_allow(pkt, ALLOW_IN_USE_V4 | ALLOW_IN_USE_V6); /* it matched: look */
	else if (pkt->addr_ok && reason == REASON_DENYLIST)
		rule = match_deny(pkt);
	if (rule) {
		hdr->rule_family = pkt->family;
		hdr->rule_prefixlen = rule->prefixlen;
		__builtin_memcpy(hdr->rule_addr, pkt->saddr, sizeof(hdr->rule_addr));
		return 1;
	}
	if ((reason == REASON_PORT_DROP || reason == REASON_PORT_ALLOW) && pkt->has_l4) {
		class = port_class(pkt);
		if (class < 0)
			return 0;
		idx = ((__u32)class << 16) | pkt->dport;
		pr = bpf_map_lookup_elem(&port_rules, &idx);
		if (pr) {
			hdr->port_rule = pr->id;
			return 1;
		}
	}
	return 0;
}

/* Parses the packet and applies the address, protocol and port filters.
 * Returns 1, with the rule filled in, if the packet is wanted. */
__noinline int capture_match(struct xdp_md *ctx, __u32 reason, struct capture_record *hdr)
{
	struct packet pkt = {};
	struct capture_config *c;
	__u32 zero = 0;

	c = bpf_map_lookup_elem(&capture_settings, &zero);
	if (!c || !hdr)
		return 0;
	capture_parse(ctx, &pkt);
	if (c->flags & CAPTURE_F_ADDR) {
		if (!pkt.addr_ok || pkt.family != c->family)
			return 0;
		if (!capture_addr_in(c, pkt.saddr) && !capture_addr_in(c, pkt.daddr))
			return 0;
	}
	/* The protocol is known once the IP header is: a malformed TCP or UDP
	 * packet is one a capture by protocol wants to see. */
	if ((c->flags & CAPTURE_F_PROTO) && (!pkt.addr_ok || pkt.l4proto != c->proto))
		return 0;
	if (c->flags & CAPTURE_F_PORT) {
		if (!pkt.has_l4 || (pkt.l4proto != IPPROTO_TCP && pkt.l4proto != IPPROTO_UDP))
			return 0;
		if (pkt.sport != c->port && pkt.dport != c->port)
			return 0;
	}
	capture_rule(&pkt, reason, hdr);
	return 1;
}

/* Reading the clock costs more than everything else a packet that is not
 * wanted goes through (about 75 ns in a VM here), so such packets check
 * the lease only once in this many, at random: enough for the data path
 * to turn off a dead session's capture promptly at any real packet rate. */
#define CAPTURE_LEASE_CHECK_MASK 255

/* Decides whether the packet is wanted and writes its record. Returns 1 if
 * it wrote one. */
__noinline int capture_packet(struct xdp_md *ctx, __u32 reason, __u32 action, __u32 monitored)
{
	struct capture_record hdr = {};
	struct capture_config *c;
	__u32 zero = 0, len, pkt_len;
	__u64 now, *seen, *lost;
	int ret;

	c = bpf_map_lookup_elem(&capture_settings, &zero);
	if (!c || !c->enabled)
		return 0;
	if (c->ifindex && c->ifindex != ctx->ingress_ifindex)
		goto unwanted;
	/* A drop that monitor mode passed is selected as a drop. */
	if (!(c->verdicts & (action == XDP_DROP || monitored ? CAPTURE_VERDICT_DROP : CAPTURE_VERDICT_PASS)))
		goto unwanted;
	if (!capture_match(ctx, reason, &hdr))
		goto unwanted;
	if (c->sample > 1) {
		seen = bpf_map_lookup_elem(&capture_seen, &zero);
		if (!seen || (*seen)++ % c->sample)
			goto unwanted;
	}
	now = bpf_ktime_get_boot_ns();
	if (now > c->lease_ns)
		goto lapsed;

	pkt_len = ctx->data_end - ctx->data;
	len = pkt_len < c->snaplen ? pkt_len : c->snaplen;
	if (len > CAPTURE_MAX_SNAPLEN)
		len = CAPTURE_MAX_SNAPLEN;
	hdr.ts_ns = now;
	hdr.session = c->session;
	hdr.ifindex = ctx->ingress_ifindex;
	hdr.pkt_len = pkt_len;
	hdr.cap_len = len;
	hdr.action = action;
	hdr.reason = reason;
	hdr.monitored = !!monitored;

#define CAPTURE_TRY(size)                                 \
	if (len <= size)                                  \
		ret = capture_emit(ctx, &hdr, len, size); \
	else
	CAPTURE_EMIT_CLASSES(CAPTURE_TRY)
		ret = capture_emit(ctx, &hdr, len, CAPTURE_MAX_SNAPLEN);
#undef CAPTURE_TRY

	if (ret < 0) {
		lost = bpf_map_lookup_elem(&capture_lost, &zero);
		if (lost)
			*lost += 1;
		return 0;
	}
	return ret;

unwanted:
	if (bpf_get_prandom_u32() & CAPTURE_LEASE_CHECK_MASK)
		return 0;
	if (bpf_ktime_get_boot_ns() <= c->lease_ns)
		return 0;
lapsed:
	/* The dump that asked went away without turning capture off (killed,
	 * or stopped): stop paying for it. */
	c->enabled = 0;
	return 0;
}

/* The hook verdict() calls: everything past the flag is out of line. */
static __always_inline void capture_hook(struct xdp_md *ctx, enum verdict_reason reason, int action,
					 int monitored)
{
	__u32 zero = 0;
	struct capture_config *c = bpf_map_lookup_elem(&capture_settings, &zero);

	if (c && c->enabled)
		capture_packet(ctx, reason, action, monitored);
}

#endif /* MOAT_CAPTURE_H */
