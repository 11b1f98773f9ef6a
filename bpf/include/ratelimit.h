/* SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause */
/* Per-source rate limits, flood budgets, heavy-hitter sampling and the
 * attack shape. rl_check runs after the allow and deny lists: allowlisted
 * sources are never limited, and a source that a limit blocks is in the
 * denylist from its next packet on.
 *
 * Buckets are GCRA (one theoretical-arrival-time word per unit, updated
 * with compare-and-swap), equivalent to a token bucket that starts full.
 * A source gets a bucket only after a gate lets it through (see
 * enum rl_gate), so a flood of packets from random addresses, each seen
 * once, does not fill and churn the per-source map. */
#ifndef MOAT_RATELIMIT_H
#define MOAT_RATELIMIT_H

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#include "moat_maps.h"
#include "parsing.h"
#include "policy.h"
#include "tcp_options.h"
#include "ratelimit_structs.h"
#include "ratelimit_maps.h"

/* Tries at a contended compare-and-swap before a bucket counts as empty. */
#define RL_CAS_TRIES 3

/* Types the control plane needs but no map declares. */
struct rl_exported_types {
	enum rl_kind kind;
	enum rl_rule_flags flags;
	enum rl_result result;
	enum rl_gate gate;
};
const struct rl_exported_types *unused_rl_exported_types __attribute__((unused));

/* Takes cost units from the bucket at *tat: 1 if they conform. A packet
 * that does not conform leaves the bucket as it was (no debt). A packet
 * that costs more than the whole burst (a frame longer than the byte
 * burst, a GRO frame in generic mode) is charged the burst: it passes when
 * the bucket is full and empties it, where it could never conform. */
static __always_inline int rl_take(__u64 *tat, __u64 now, __u64 interval, __u64 tolerance,
				   __u64 cost)
{
	__u64 inc = (cost * interval) >> RL_FP_SHIFT;
	__u64 old, next;
	int i;

	if (!interval)
		return 1;
	if (inc > tolerance && tolerance)
		inc = tolerance;
#pragma unroll
	for (i = 0; i < RL_CAS_TRIES; i++) {
		old = *(volatile __u64 *)tat;
		next = (old > now ? old : now) + inc;
		if (next - now > tolerance)
			return 0;
		if (__sync_val_compare_and_swap(tat, old, next) == old)
			return 1;
	}
	return 0;
}

/* Both units of a bucket. A packet refused for its bytes has spent its
 * packet token: the two limits bind together, which errs on the strict side. */
static __always_inline int rl_conform(struct rl_bucket *b, const struct rl_rule *r, __u64 now,
				      __u32 len)
{
	return rl_take(&b->tat_pkts, now, r->pkt_interval, r->pkt_tolerance, 1) &&
	       rl_take(&b->tat_bytes, now, r->byte_interval, r->byte_tolerance, len);
}

/* The source address as a bucket key: IPv4 /32, IPv6 masked to plen. */
static __always_inline void rl_key_of(const struct packet *p, struct rl_src_key *k, __u32 plen)
{
	__u64 hi, lo;

	if (p->family == 4) {
		__builtin_memcpy(k->addr, p->saddr, 4);
		k->family = 4;
		k->prefixlen = 32;
		return;
	}
	if (plen > 128)
		plen = 128;
	__builtin_memcpy(&hi, p->saddr, 8);
	__builtin_memcpy(&lo, p->saddr + 8, 8);
	hi = bpf_be64_to_cpu(hi);
	lo = bpf_be64_to_cpu(lo);
	if (plen == 0) {
		hi = 0;
		lo = 0;
	} else if (plen <= 64) {
		hi &= ~0ULL << (64 - plen);
		lo = 0;
	} else if (plen < 128) {
		lo &= ~0ULL << (128 - plen);
	}
	hi = bpf_cpu_to_be64(hi);
	lo = bpf_cpu_to_be64(lo);
	__builtin_memcpy(k->addr, &hi, 8);
	__builtin_memcpy(k->addr + 8, &lo, 8);
	k->family = 6;
	k->prefixlen = plen;
}

/* A 64-bit mix of the key; its halves index the two sketch rows. Not keyed:
 * a collision can only make a source get its bucket sooner. */
static __always_inline __u64 rl_hash(const struct rl_src_key *k)
{
	__u64 h = 0x9e3779b97f4a7c15ULL;
	__u32 w[5];
	int i;

	__builtin_memcpy(w, k, sizeof(w));
#pragma unroll
	for (i = 0; i < 5; i++) {
		h = (h ^ w[i]) * 0xff51afd7ed558ccdULL;
		h ^= h >> 32;
	}
	return h;
}

/* Counts a packet of the key in the sketch and returns the estimate of its
 * packets in the current window, this one included; *crossed says that
 * this packet took the estimate to track. */
static __always_inline __u32 rl_sketch_add(__u64 h, __u64 now, __u32 track, int *crossed)
{
	__u32 window = now >> RL_WINDOW_SHIFT;
	__u32 est = ~0U, before = ~0U;
	int row;

#pragma unroll
	for (row = 0; row < RL_SKETCH_ROWS; row++) {
		__u32 idx = row * RL_SKETCH_WIDTH + ((h >> (row * 32)) & (RL_SKETCH_WIDTH - 1));
		__u64 *cell = bpf_map_lookup_elem(&rl_sketch, &idx);
		__u64 old;
		__u32 n;

		if (!cell)
			return 0;
		old = *(volatile __u64 *)cell;
		n = (__u32)(old >> 32) == window ? (__u32)old : 0;
		/* One try: a count lost to a race only delays the bucket. */
		__sync_val_compare_and_swap(cell, old, (__u64)window << 32 | (n + 1));
		if (n < before)
			before = n;
		if (n + 1 < est)
			est = n + 1;
	}
	*crossed = before < track && est >= track;
	return est;
}

/* Adds debt to a bucket: packets that passed without it. */
static __always_inline void rl_charge(__u64 *tat, __u64 now, __u64 inc)
{
	__u64 old = *(volatile __u64 *)tat;

	__sync_val_compare_and_swap(tat, old, (old > now ? old : now) + inc);
}

/* Writes the denylist entry of an auto-block: the source (or its IPv6
 * prefix) until now + block_ns, with the rule's reason in auto_reasons, and
 * marked as monitor mode's while moat monitors. */
static __always_inline void rl_block(const struct rl_src_key *k, struct rl_rule *r, __u64 now,
				     struct rl_rule_stats *st)
{
	struct prefix_rule v = {
		.expires_ns = now + r->block_ns,
		.prefixlen = k->prefixlen,
		.flags = RULE_F_AUTO,
	};
	struct comment_key ck = { .list = 1, .family = k->family, .prefixlen = k->prefixlen };
	long err;

	if (monitoring())
		v.flags |= RULE_F_MONITOR;
	__builtin_memcpy(ck.addr, k->addr, 16);
	/* The summary bit before the entry: the filter skips the lookups of a
	 * source whose bit is clear. */
	deny_summary_mark(k->family, k->addr, k->prefixlen);
	/* The reason first, so that the entry is never listed without it. */
	if (bpf_map_update_elem(&auto_reasons, &ck, &r->reason, BPF_ANY) == 0)
		v.flags |= RULE_F_COMMENT;
	if (k->family == 4) {
		err = bpf_map_update_elem(&deny_v4_hosts, k->addr, &v, BPF_ANY);
	} else if (k->prefixlen == 128) {
		err = bpf_map_update_elem(&deny_v6_hosts, k->addr, &v, BPF_ANY);
	} else {
		struct net_v6 nk = { .prefixlen = k->prefixlen };

		__builtin_memcpy(nk.addr, k->addr, 16);
		err = bpf_map_update_elem(&deny_v6_nets, &nk, &v, BPF_ANY);
	}
	if (err)
		st->block_errors++;
	else
		st->blocks++;
}

/* A full Ethernet frame with a VLAN tag: what a source limit's gate
 * threshold takes each packet it passes for at most (trackPackets in
 * internal/ratelimit). */
#define RL_FULL_FRAME 1518

/* The bytes to charge for the seen - 1 packets a gate let through before
 * this one, whose lengths it did not keep, in ns of the byte bucket.
 *
 * The sampling gate charges none: its threshold is a random draw, so a
 * source's burst is give or take it anyway, and a guess could only be too
 * high for some source (small packets, then a large one sampled), which a
 * limit with --block would then deny. The sketch gate charges each at
 * this packet's length, up to a full frame, but never so much that this
 * packet, at a bucket that was full, could not pass: charged at a long
 * frame's length (jumbo, or GRO in generic mode), the packets before it
 * would leave the bucket over its burst at once, whatever the rate.
 * interval and tolerance are the rule's byte_interval and
 * byte_tolerance. A function of its own, on scalars: inlined, it took
 * rl_check's stack past what the verifier allows for the calls below it. */
static __attribute__((noinline)) __u64 rl_gate_bytes(__u64 interval, __u64 tolerance, __u32 gate, __u32 seen,
						      __u32 len)
{
	__u64 each, charge, own;

	if (gate != RL_GATE_SKETCH || !interval || seen <= 1)
		return 0;
	each = len < RL_FULL_FRAME ? len : RL_FULL_FRAME;
	charge = ((__u64)(seen - 1) * each * interval) >> RL_FP_SHIFT;
	own = ((__u64)len * interval) >> RL_FP_SHIFT;
	if (own > tolerance)
		own = tolerance;
	if (charge > tolerance - own)
		charge = tolerance - own;
	return charge;
}

/* A per-source limit. */
static __always_inline int rl_source(const struct packet *p, __u32 id, struct rl_rule *r,
				     const struct rl_config *set, __u64 now, __u32 len,
				     struct rl_rule_stats *st)
{
	__u32 gate = set ? set->gate : RL_GATE_SAMPLE;
	__u32 track = r->track_pkts;
	struct rl_src_key key = {};
	struct rl_src_state *s;
	__u32 seen = 1;
	int crossed = 0;

	rl_key_of(p, &key, r->v6_prefix);
	key.rule = id;
	if (track > 1 && gate == RL_GATE_SKETCH) {
		/* Below the threshold a source sends under its rate in this
		 * window (track <= rate * window), so the per-source map, the
		 * costly part under a random-source flood, is not even read. */
		seen = rl_sketch_add(rl_hash(&key), now, track, &crossed);
		if (seen < track) {
			st->untracked++;
			return RL_PASS;
		}
		seen = track; /* more is sketch noise, not this source's */
	}
	s = bpf_map_lookup_elem(&rl_sources, &key);
	if (!s) {
		struct rl_src_state fresh = {};

		if (track > 1 && gate == RL_GATE_SAMPLE) {
			/* 1 in track (a power of two): a source gets its bucket
			 * after track packets on average. */
			if (bpf_get_prandom_u32() & (track - 1)) {
				st->untracked++;
				return RL_PASS;
			}
			seen = track;
		}
		/* What the gate let through is charged to the new bucket, so
		 * the gate does not add to the burst: its packets in full,
		 * their bytes as rl_gate_bytes can tell. */
		fresh.bucket.tat_pkts = now + (((__u64)(seen - 1) * r->pkt_interval) >> RL_FP_SHIFT);
		fresh.bucket.tat_bytes = now + rl_gate_bytes(r->byte_interval, r->byte_tolerance, gate, seen, len);
		fresh.created_ns = now;
		bpf_map_update_elem(&rl_sources, &key, &fresh, BPF_NOEXIST);
		s = bpf_map_lookup_elem(&rl_sources, &key);
		if (!s)
			return RL_PASS;
		st->tracked++;
	} else if (crossed) {
		/* A new window: the packets the sketch passed before this one
		 * are charged, so a source over its limit gains nothing from
		 * the window turning. */
		rl_charge(&s->bucket.tat_pkts, now, ((__u64)(seen - 1) * r->pkt_interval) >> RL_FP_SHIFT);
		rl_charge(&s->bucket.tat_bytes, now, rl_gate_bytes(r->byte_interval, r->byte_tolerance, gate, seen, len));
	}
	if (rl_conform(&s->bucket, r, now, len)) {
		__sync_fetch_and_add(&s->passed, 1);
		return RL_PASS;
	}
	__sync_fetch_and_add(&s->dropped, 1);
	if (r->block_ns)
		rl_block(&key, r, now, st);
	return RL_DROP_SOURCE;
}

static __always_inline int rl_is_syn(const struct packet *p)
{
	return p->l4proto == IPPROTO_TCP && p->has_l4 && (p->tcp_flags & 0x12) == 0x02;
}

/* TLS record and handshake message types (RFC 8446). */
#define TLS_RECORD_HANDSHAKE 22
#define TLS_CLIENT_HELLO 1

/* What the TLS match reads of a request socket: the sequence number of
 * its SYN-ACK. Offsets come from the running kernel's BTF (CO-RE). */
struct tcp_request_sock___moat {
	__u32 snt_isn;
} __attribute__((preserve_access_index));

/* A read-only view of a kernel object as a type of the kernel's BTF: its
 * fields are read as with bpf_probe_read_kernel. A kfunc for every
 * program type (Linux 6.2). */
extern void *bpf_rdonly_cast(const void *obj__ign, __u32 btf_id__k) __ksym;

/* Answers of rl_tcp_owner. */
enum rl_tcp_owner {
	RL_OWNER_NONE = 0,
	RL_OWNER_CONNECTION = 1, /* a connection owns the segment */
	RL_OWNER_LISTENER = 2,   /* an ACK to a listener: it may carry a cookie */
};

/* Who owns a TCP segment: a connection when an established socket owns
 * its tuple, or when the segment is the third ACK of a handshake and
 * acknowledges the SYN-ACK of the request socket that owns the tuple. A
 * global function: the verifier checks it once. */
__attribute__((noinline)) int rl_tcp_owner(struct xdp_md *ctx, struct packet *p)
{
	void *data, *data_end;
	struct bpf_sock_tuple t = {};
	struct tcp_request_sock___moat *treq;
	struct tcphdr *th;
	struct bpf_sock *sk;
	__u32 size, l4;
	int state, owner = RL_OWNER_NONE;

	if (!ctx || !p)
		return RL_OWNER_NONE;
	data = (void *)(long)ctx->data;
	data_end = (void *)(long)ctx->data_end;
	l4 = p->l4_off & SYN_L4_MASK;
	th = data + l4;
	if (p->l4_off > SYN_L4_MASK || (void *)(th + 1) > data_end)
		return RL_OWNER_NONE;
	size = syn_tuple(p, &t);
	sk = bpf_skc_lookup_tcp(ctx, &t, size, BPF_F_CURRENT_NETNS, 0);
	if (!sk)
		return RL_OWNER_NONE;
	state = sk->state;
	if (state == BPF_TCP_ESTABLISHED) {
		owner = RL_OWNER_CONNECTION;
	} else if (state == BPF_TCP_NEW_SYN_RECV && (p->tcp_flags & TCPF_ACK)) {
		/* A TCP socket in this state is a struct tcp_request_sock, or
		 * begins with one (MPTCP's subflow requests, whose listener's
		 * protocol bpf_skc_to_tcp_request_sock does not take). */
		treq = bpf_rdonly_cast(sk, bpf_core_type_id_kernel(struct tcp_request_sock___moat));
		if (treq && treq->snt_isn + 1 == bpf_ntohl(th->ack_seq))
			owner = RL_OWNER_CONNECTION;
	} else if (state == BPF_TCP_LISTEN && (p->tcp_flags & TCPF_ACK)) {
		owner = RL_OWNER_LISTENER;
	}
	bpf_sk_release(sk);
	return owner;
}

/* Whether an ACK to a listener returns a valid SYN cookie, moat's or the
 * kernel's: the stack then makes the socket from it. moat_filter calls it
 * when rl_check asks (RL_CHECK_COOKIE): the cookie check's frame does not
 * fit on the stack below rl_check's. */
__attribute__((noinline)) int rl_cookie_ack(struct xdp_md *ctx, struct packet *p)
{
	void *data, *data_end;
	const struct syn_config *cfg;
	const struct tcp_opts *opts;
	struct tcphdr *th;
	__u32 l3, l4;

	if (!ctx || !p)
		return 0;
	data = (void *)(long)ctx->data;
	data_end = (void *)(long)ctx->data_end;
	l3 = p->l3_off;
	l4 = p->l4_off;
	if (l3 > SYN_MAX_L3_OFF || l4 > SYN_L4_MASK)
		return 0;
	th = data + (l4 & SYN_L4_MASK);
	if ((void *)(th + 1) > data_end)
		return 0;
	cfg = syn_get_config();
	opts = xdp_tcp_options(ctx, p);
	if (cfg && opts &&
	    syn_cookie_check(p, cfg, packet_now(p), bpf_ntohl(th->ack_seq) - 1, bpf_ntohl(th->seq) - 1, opts) >= 0)
		return 1;
	return syn_kernel_cookie(data, data_end, l3, th, p->family);
}

/* Whether a TCP segment is part of a connection: an established socket
 * owns its tuple, or the segment is the third ACK of a handshake, which
 * may carry the client's first bytes (a client that sets TCP_DEFER_ACCEPT
 * sends no pure ACK): it acknowledges the SYN-ACK of the request socket
 * that owns the tuple, or returns a valid SYN cookie to the listener. The
 * stack makes the socket and hands it those bytes, so a ClientHello there
 * is work for the server as on an established connection. Only who saw
 * the SYN-ACK knows its sequence number or cookie, so a forged segment
 * does not count, even on a tuple whose SYN the forger sent in another's
 * name. Looked up once per packet; an ACK to a listener stays
 * RL_CONN_COOKIE (not a connection) until rl_cookie_ack has judged it. */
static __always_inline int rl_on_connection(struct xdp_md *ctx, struct packet *p)
{
	int owner;

	if (!p->on_connection) {
		owner = rl_tcp_owner(ctx, p);
		p->on_connection = owner == RL_OWNER_CONNECTION ? RL_CONN_YES :
				   owner == RL_OWNER_LISTENER ? RL_CONN_COOKIE : RL_CONN_NO;
	}
	return p->on_connection == RL_CONN_YES;
}

/* Whether a TCP segment opens a TLS ClientHello: its payload starts with a
 * handshake record header (type 22) whose message is a ClientHello (type
 * 1). The record's version is not looked at: servers take hellos of any
 * (Go's crypto/tls those of version 0.0, OpenSSL those of 3.255). The
 * message type decides only when the segment has it: a segment of 1 to 5
 * bytes that starts with type 22 counts, as does a first IP fragment whose
 * payload lies wholly in later fragments. So does every segment with the
 * urgent flag: the stack takes urgent bytes out of the stream, so a hello
 * behind one reaches the server while the segment starts with another
 * byte. No client does any of these, but an abusive one could, to hide
 * its hellos from a byte match.
 *
 * Only a segment of an established connection counts: a hello is work for
 * the server only there, and anyone can forge a segment from any address.
 * Counted without a connection, forged hellos would spend a source's
 * budget or get it auto-blocked (a few dozen segments would block any
 * address), while the stack answers them with a RST, or the ACK filter
 * drops them, before any TLS. So a SYN with data (TCP Fast Open) never
 * counts, nor does a RST. The socket lookup runs only for segments that
 * match, about one per connection. A global function: the verifier
 * checks it once, not at each limit it serves. */
__attribute__((noinline)) int rl_is_tls_hello(struct xdp_md *ctx, struct packet *p)
{
	void *data, *end;
	__u32 off, len;
	__u8 *q;

	if (!ctx || !p || p->l4proto != IPPROTO_TCP || !p->has_l4 || (p->tcp_flags & 0x06))
		return 0;
	if (p->tcp_flags & 0x20)
		return rl_on_connection(ctx, p);
	off = p->l4_off + sizeof(struct tcphdr) + p->tcp_optlen;
	if (off >= p->l3_end)
		return p->first_fragment && rl_on_connection(ctx, p);
	/* An XDP frame without fragments fits in a page: the bound is for the
	 * verifier. */
	if (off > 0x3fff)
		return 0;
	len = p->l3_end - off;
	data = (void *)(long)ctx->data;
	end = (void *)(long)ctx->data_end;
	q = data + off;
	if ((void *)(q + 1) > end || q[0] != TLS_RECORD_HANDSHAKE)
		return 0;
	if (len >= 6 && ((void *)(q + 6) > end || q[5] != TLS_CLIENT_HELLO))
		return 0;
	return rl_on_connection(ctx, p);
}

/* QUIC versions whose Initial packets open a TLS handshake (RFC 9000,
 * RFC 9369, and the drafts some servers still speak). */
#define QUIC_V1 0x00000001
#define QUIC_V2 0x6b3343cf
#define QUIC_DRAFT_MASK 0xffffff00
#define QUIC_DRAFT 0xff000000

/* Whether a UDP datagram opens with a QUIC Initial packet: a long header
 * (first bit set) of version 1 or a draft with packet type 0, or of
 * version 2 with packet type 1. The fixed bit is not looked at: a server
 * decides what it takes. A first IP fragment with fewer than the 5 bytes
 * that tell counts, as in rl_is_tls_hello. A global function, checked
 * once. */
__attribute__((noinline)) int rl_is_quic_initial(struct xdp_md *ctx, struct packet *p)
{
	void *data = (void *)(long)ctx->data, *end = (void *)(long)ctx->data_end;
	__u32 off, version, type;
	__u8 *q;

	if (!p || p->l4proto != IPPROTO_UDP || !p->has_l4)
		return 0;
	off = p->l4_off + 8;
	if (off > 0x3fff)
		return 0;
	if (off + 5 > p->l3_end)
		return p->first_fragment;
	q = data + off;
	if ((void *)(q + 5) > end || !(q[0] & 0x80))
		return 0;
	version = (__u32)q[1] << 24 | (__u32)q[2] << 16 | (__u32)q[3] << 8 | q[4];
	type = (q[0] >> 4) & 3;
	if (version == QUIC_V2)
		return type == 1;
	return (version == QUIC_V1 || (version & QUIC_DRAFT_MASK) == QUIC_DRAFT) && type == 0;
}

/* Whether rule r applies to the packet: a +syn, +tls-hello or
 * +quic-initial limit takes those packets only. */
static __always_inline int rl_applies(struct xdp_md *ctx, struct packet *p,
				      const struct rl_rule *r)
{
	if (r->flags & RL_F_SYN_ONLY)
		return rl_is_syn(p);
	if (r->flags & RL_F_TLS_HELLO)
		return rl_is_tls_hello(ctx, p);
	if (r->flags & RL_F_QUIC_INITIAL)
		return rl_is_quic_initial(ctx, p);
	return 1;
}

/* Frame size histogram bucket. */
static __always_inline __u32 shape_size_bucket(__u32 len)
{
	if (len <= 64)
		return 0;
	if (len <= 128)
		return 1;
	if (len <= 256)
		return 2;
	if (len <= 512)
		return 3;
	if (len <= 1024)
		return 4;
	if (len <= 1518)
		return 5;
	if (len <= 9018)
		return 6;
	return 7;
}

/* Counts the packet in the attack shape. TCP options are walked for SYNs
 * only: they are what tells one SYN flood tool from another, and walking
 * them on every segment would cost every connection. The walk is kept in p
 * for the SYN defence (xdp_tcp_options). */
static __always_inline void shape_count(struct xdp_md *ctx, struct packet *p, __u32 len)
{
	struct attack_shape *s;
	struct shape_port_block *ports;
	__u32 zero = 0, idx, block;

	s = bpf_map_lookup_elem(&shape, &zero);
	if (!s)
		return;
	s->sizes[shape_size_bucket(len) & (SHAPE_SIZE_BUCKETS - 1)]++;
	if (p->fragment)
		s->fragments++;
	switch (p->l4proto) {
	case IPPROTO_TCP:
		s->protocols[0]++;
		break;
	case IPPROTO_UDP:
		s->protocols[1]++;
		break;
	case IPPROTO_ICMP:
	case IPPROTO_ICMPV6:
		s->protocols[2]++;
		break;
	default:
		s->protocols[3]++;
	}
	if (!p->has_l4)
		return;

	switch (p->l4proto) {
	case IPPROTO_TCP:
		idx = p->dport;
		break;
	case IPPROTO_UDP:
		idx = 65536 + p->dport;
		break;
	case IPPROTO_ICMP:
		idx = 2 * 65536 + (p->dport & 0xff);
		break;
	case IPPROTO_ICMPV6:
		idx = 2 * 65536 + 256 + (p->dport & 0xff);
		break;
	default:
		return;
	}
	block = idx / SHAPE_PORT_BLOCK;
	ports = bpf_map_lookup_elem(&shape_ports, &block);
	if (ports)
		ports->packets[idx & (SHAPE_PORT_BLOCK - 1)]++;

	if (p->l4proto == IPPROTO_TCP) {
		__u32 optlen = p->tcp_optlen;

		s->tcp_flags[p->tcp_flags]++;
		if (!rl_is_syn(p)) {
			if (optlen)
				s->tcp_options++;
			else
				s->tcp_no_options++;
			return;
		}
		if (optlen) {
			const struct tcp_opts *o = xdp_tcp_options(ctx, p);
			__u32 combo;

			if (!o)
				return;
			combo = (o->has_mss ? 1 : 0) | (o->has_wscale ? 2 : 0) |
				(o->sack_ok ? 4 : 0) | (o->has_ts ? 8 : 0);
			s->syn_options[combo & 15]++;
		} else {
			s->syn_options[0]++;
		}
	}
}

/* Whether this packet is its CPU's next heavy-hitter sample: one in
 * 2^log2 on average, as the control plane's scaling assumes. The gap to
 * the next sample is drawn at each sample, uniform over
 * [1, 2^(log2 + 1) - 1] (mean 2^log2), so the other packets cost a
 * countdown, not a random number (a helper call) each. */
static __always_inline int hh_sampled(__u32 log2)
{
	__u32 zero = 0, *left;

	if (log2 == 0)
		return 1;
	left = bpf_map_lookup_elem(&hh_countdown, &zero);
	if (!left)
		return 0;
	if (*left > 1) {
		(*left)--;
		return 0;
	}
	*left = bpf_get_prandom_u32() % ((2U << log2) - 1) + 1;
	return 1;
}

/* What became of a sample, in hh_count's argument and in a gate slot's
 * low bits beside its length: a limit, budget or port rule dropped it, or
 * would have and monitor mode passed it; neither if it passed. */
#define HH_GATE_DROPPED (1U << 31)
#define HH_GATE_MONITORED (1U << 30)
#define HH_GATE_LEN_MASK (HH_GATE_MONITORED - 1)

/* A source's slot in hh_gate and its fingerprint there: a 64-bit
 * finalizer (MurmurHash3's constants) over the key folded with hh_seed. A
 * collision admits a source one sample early and counts another's first
 * sample to it; the seed keeps anyone from choosing sources that collide. */
static __always_inline __u64 *hh_gate_slot(const struct rl_src_key *key, __u32 *tag)
{
	__u64 a, b, h;
	__u32 idx;

	__builtin_memcpy(&a, key->addr, 8);
	__builtin_memcpy(&b, key->addr + 8, 8);
	h = a ^ hh_seed ^ (b * 0x9e3779b97f4a7c15ULL) ^
	    (((__u64)key->family << 8 | key->prefixlen) * 0xc2b2ae3d27d4eb4fULL);
	h ^= h >> 33;
	h *= 0xff51afd7ed558ccdULL;
	h ^= h >> 33;
	h *= 0xc4ceb9fe1a85ec53ULL;
	h ^= h >> 33;
	idx = (__u32)(h >> (64 - HH_GATE_BITS));
	*tag = (__u32)h;
	return bpf_map_lookup_elem(&hh_gate, &idx);
}

/* Takes the sample the gate holds for tag, if any: its frame length and
 * what became of it (HH_GATE_DROPPED, HH_GATE_MONITORED). A
 * compare-and-swap, so two CPUs never both count it. */
static __always_inline int hh_gate_take(__u64 *slot, __u32 tag, __u32 *len, __u32 *fate)
{
	__u64 seen = *(volatile __u64 *)slot;

	if (!seen || (__u32)(seen >> 32) != tag || __sync_val_compare_and_swap(slot, seen, 0) != seen)
		return 0;
	*len = (__u32)seen & HH_GATE_LEN_MASK;
	*fate = (__u32)seen & (HH_GATE_DROPPED | HH_GATE_MONITORED);
	return 1;
}

/* Samples the packet into the heavy-hitter map. A source the map lacks
 * enters it when a later sample finds its first one still waiting in the
 * gate, and that sample then counts both. A flood from spoofed, random
 * sources (each sampled once) so costs a sample a slot write, where an
 * entry would cost the LRU an insertion and push out the sources that
 * matter. Under such a flood a slot is overwritten often (at 32,000
 * samples a second, 8 times a second): a source gets in when it is
 * sampled again before that, and a first sample overwritten is not
 * counted. A source in the map takes its sample back from the gate too, if
 * one is there (left by another CPU before the entry was made). fate says
 * what became of the packet: HH_GATE_DROPPED, HH_GATE_MONITORED or 0. */
static __always_inline void hh_count(const struct packet *p, __u32 len, __u32 fate, __u64 now)
{
	struct rl_src_key key = {};
	struct hh_counts *c;
	__u32 tag = 0, first_len = 0, first_fate = 0;
	int first = 0, n;
	__u64 *slot;

	rl_key_of(p, &key, HH_V6_PREFIX);
	slot = hh_gate_slot(&key, &tag);
	if (slot)
		first = hh_gate_take(slot, tag, &first_len, &first_fate);
	c = bpf_map_lookup_elem(&hh_sources, &key);
	if (!c) {
		struct hh_counts zero = {};

		if (!first) {
			if (slot)
				*slot = (__u64)tag << 32 | fate | (len & HH_GATE_LEN_MASK);
			return;
		}
		bpf_map_update_elem(&hh_sources, &key, &zero, BPF_NOEXIST);
		c = bpf_map_lookup_elem(&hh_sources, &key);
		if (!c)
			return;
	}
	__sync_fetch_and_add(&c->packets, 1 + first);
	__sync_fetch_and_add(&c->bytes, len + first_len);
	n = !!(fate & HH_GATE_DROPPED) + !!(first_fate & HH_GATE_DROPPED);
	if (n)
		__sync_fetch_and_add(&c->dropped, n);
	n = !!(fate & HH_GATE_MONITORED) + !!(first_fate & HH_GATE_MONITORED);
	if (n)
		__sync_fetch_and_add(&c->monitored, n);
	c->last_ns = now;
}

/* Takes the rules of scope slot s for the kinds that have none yet, if
 * they apply to the packet: a packet that a limit narrowed to SYNs, TLS
 * ClientHellos or QUIC Initials does not take falls to the next wider
 * scope. */
static __always_inline void rl_choose(struct xdp_md *ctx, struct packet *p,
				      const struct rl_slot *s, __u32 *src, struct rl_rule **src_r,
				      __u32 *bud, struct rl_rule **bud_r)
{
	struct rl_rule *r;
	__u32 id;

	if (!s)
		return;
	if (!*src_r && s->source) {
		id = s->source;
		r = bpf_map_lookup_elem(&rl_rules, &id);
		if (r && r->kind == RL_KIND_SOURCE && rl_applies(ctx, p, r)) {
			*src = id;
			*src_r = r;
		}
	}
	if (!*bud_r && s->budget) {
		id = s->budget;
		r = bpf_map_lookup_elem(&rl_rules, &id);
		if (r && r->kind == RL_KIND_BUDGET && rl_applies(ctx, p, r)) {
			*bud = id;
			*bud_r = r;
		}
	}
}

/* Counts a packet in a limit's counters: passed, or over the limit and
 * dropped, or in monitor mode monitored, as verdict() will count it. The
 * mode is looked up only for a packet over the limit. */
static __always_inline void rl_count(struct rl_rule_stats *st, int over, __u32 len)
{
	if (!over) {
		st->passed++;
		st->passed_bytes += len;
	} else if (monitoring()) {
		st->monitored++;
		st->monitored_bytes += len;
	} else {
		st->dropped++;
		st->dropped_bytes += len;
	}
}

/* The rate-limit stage: returns RL_PASS or why the packet is dropped. With
 * port_dropped set (a port rule drops the packet) no limit is charged: the
 * packet is only counted in the attack shape and, as dropped (in monitor
 * mode, monitored), among the heavy hitters, so a flood that a port rule
 * stops still shows there. A global function, so the verifier checks it
 * once, apart from the rest of the program. */
__attribute__((noinline)) int rl_check(struct xdp_md *ctx, struct packet *p, int port_dropped)
{
	__u32 len = ctx->data_end - ctx->data;
	struct rl_rule *src_r = NULL, *bud_r = NULL;
	struct rl_config *set;
	struct rl_rule_stats *st;
	__u32 zero = 0, all = RL_CLASS_ALL, src = 0, bud = 0, idx;
	int class = -1, res = RL_PASS;

	if (!p)
		return RL_PASS;
	/* The clock is read only when a rule or a sample needs it: with no
	 * rule in scope a packet never pays for it (packet_now). */
	set = bpf_map_lookup_elem(&rl_settings, &zero);
	if (port_dropped)
		goto observe;
	/* A protocol's limits take all of its packets, non-first fragments
	 * and headers cut short among them: the IP header names the protocol.
	 * Port scopes need the port. */
	class = port_class(p);
	if (class >= 0) {
		if (p->has_l4) {
			idx = ((__u32)class << 16) | p->dport;
			rl_choose(ctx, p, bpf_map_lookup_elem(&rl_port_scopes, &idx), &src, &src_r, &bud, &bud_r);
		}
		idx = class;
		rl_choose(ctx, p, bpf_map_lookup_elem(&rl_class_scopes, &idx), &src, &src_r, &bud, &bud_r);
	}
	rl_choose(ctx, p, bpf_map_lookup_elem(&rl_class_scopes, &all), &src, &src_r, &bud, &bud_r);
	/* A ClientHello in an ACK to a listener counts if the ACK returns a
	 * valid cookie: the caller checks it and runs the packet again,
	 * before anything is charged or counted. */
	if (p->on_connection == RL_CONN_COOKIE)
		return RL_CHECK_COOKIE;

	/* The source limit first: a source over its own limit must not spend
	 * the budget that everyone else shares. */
	if (src_r) {
		st = bpf_map_lookup_elem(&rl_stats, &src);
		if (st) {
			res = rl_source(p, src, src_r, set, packet_now(p), len, st);
			rl_count(st, res != RL_PASS, len);
		}
	}
	if (res == RL_PASS && bud_r) {
		st = bpf_map_lookup_elem(&rl_stats, &bud);
		idx = bud;
		if (st) {
			struct rl_bucket *b = bpf_map_lookup_elem(&rl_budgets, &idx);

			if (b && !rl_conform(b, bud_r, packet_now(p), len))
				res = RL_DROP_BUDGET;
			rl_count(st, res != RL_PASS, len);
		}
	}

observe:
	if (set) {
		__u32 log2 = set->hh_sample ? set->hh_sample - 1 : HH_DEFAULT_SAMPLE_LOG2;

		if (!set->shape_off)
			shape_count(ctx, p, len);
		if (log2 > HH_MAX_SAMPLE_LOG2)
			log2 = HH_MAX_SAMPLE_LOG2;
		if (!set->hh_off && hh_sampled(log2)) {
			__u32 fate = 0;

			/* Over a limit or dropped by a port rule: dropped, or
			 * in monitor mode passed and counted as monitored, as
			 * verdict() counts it. */
			if (res != RL_PASS || port_dropped)
				fate = monitoring() ? HH_GATE_MONITORED : HH_GATE_DROPPED;
			hh_count(p, len, fate, packet_now(p));
		}
	}
	return res;
}

#endif /* MOAT_RATELIMIT_H */
