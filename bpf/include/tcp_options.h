/* SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause */
/* TCP option parsing over a stack copy of the options, in any order, with
 * a bounded loop. */
#ifndef MOAT_TCP_OPTIONS_H
#define MOAT_TCP_OPTIONS_H

#include <linux/types.h>
#include <bpf/bpf_helpers.h>
#include "parsing.h"
#include "syn_structs.h"

#define TCPOPT_EOL 0
#define TCPOPT_NOP 1
#define TCPOPT_MSS 2
#define TCPOPT_WINDOW 3
#define TCPOPT_SACK_PERM 4
#define TCPOPT_TIMESTAMP 8
#define TCPOPT_MD5SIG 19
#define TCPOPT_AO 29
#define TCP_MAX_WSCALE 14
/* The stack buffer is larger than the 40 bytes of options so that an index
 * masked with TCP_OPTBUF_MASK is always inside it. */
#define TCP_OPTBUF_SIZE 64
#define TCP_OPTBUF_MASK (TCP_OPTBUF_SIZE - 1)
#define TCP_MAX_OPTLEN 40

struct tcp_opt_walk {
	__u8 buf[TCP_OPTBUF_SIZE]; /* a copy of the options, zero beyond len */
	__u32 len;
	__u32 pos;
	struct tcp_opts opts;
};

static __always_inline __u32 opt_be32(const __u8 *b, __u32 j)
{
	return (__u32)b[j & TCP_OPTBUF_MASK] << 24 | (__u32)b[(j + 1) & TCP_OPTBUF_MASK] << 16 |
	       (__u32)b[(j + 2) & TCP_OPTBUF_MASK] << 8 | b[(j + 3) & TCP_OPTBUF_MASK];
}

/* One option per call. A malformed option ends the walk with what was found
 * before it, which is what the kernel's parser does too. */
static long tcp_opt_step(__u32 index, void *ctx)
{
	struct tcp_opt_walk *w = ctx;
	struct tcp_opts *o = &w->opts;
	__u32 i = w->pos;
	__u8 kind, olen;

	if (i >= w->len)
		return 1;
	kind = w->buf[i & TCP_OPTBUF_MASK];
	if (kind == TCPOPT_EOL)
		return 1;
	if (kind == TCPOPT_NOP) {
		w->pos = i + 1;
		return 0;
	}
	if (i + 1 >= w->len)
		return 1;
	olen = w->buf[(i + 1) & TCP_OPTBUF_MASK];
	if (olen < 2 || i + olen > w->len)
		return 1;
	switch (kind) {
	case TCPOPT_MSS:
		if (olen == 4) {
			o->mss = (__u16)w->buf[(i + 2) & TCP_OPTBUF_MASK] << 8 |
				 w->buf[(i + 3) & TCP_OPTBUF_MASK];
			o->has_mss = 1;
		}
		break;
	case TCPOPT_WINDOW:
		if (olen == 3) {
			o->wscale = w->buf[(i + 2) & TCP_OPTBUF_MASK];
			o->has_wscale = 1;
		}
		break;
	case TCPOPT_SACK_PERM:
		if (olen == 2)
			o->sack_ok = 1;
		break;
	case TCPOPT_TIMESTAMP:
		if (olen == 10) {
			o->tsval = opt_be32(w->buf, i + 2);
			o->tsecr = opt_be32(w->buf, i + 6);
			o->has_ts = 1;
		}
		break;
	case TCPOPT_MD5SIG:
	case TCPOPT_AO:
		o->signed_seg = 1;
		break;
	}
	w->pos = i + olen;
	return 0;
}

/* optlen (1..40) in a form whose range the verifier can see: the helpers
 * that copy options refuse a size that might be zero or exceed the buffer,
 * and the compiler otherwise checks a copy of the register it passes. */
static __always_inline __u32 opt_copy_len(__u32 optlen)
{
	__u32 n = ((optlen - 1) & TCP_OPTBUF_MASK) + 1;

	/* The empty asm makes n opaque to the compiler, so the register the
	 * helper gets is the one the mask and add bounded, whatever the
	 * register allocation. */
	asm volatile("" : "+r"(n));
	return n;
}

/* The two layouts most segments of a handshake carry, read without the
 * walk. A layout matches only when every kind and length byte is as below,
 * so the result is the walk's own.
 *
 * Linux's SYN: MSS, SACK-permitted, timestamps, NOP, window scale. */
static __always_inline int tcp_opts_linux_syn(struct tcp_opt_walk *w)
{
	const __u8 *b = w->buf;
	struct tcp_opts *o = &w->opts;

	if (w->len != 20 || b[0] != TCPOPT_MSS || b[1] != 4 || b[4] != TCPOPT_SACK_PERM ||
	    b[5] != 2 || b[6] != TCPOPT_TIMESTAMP || b[7] != 10 || b[16] != TCPOPT_NOP ||
	    b[17] != TCPOPT_WINDOW || b[18] != 3)
		return 0;
	o->mss = (__u16)b[2] << 8 | b[3];
	o->has_mss = 1;
	o->sack_ok = 1;
	o->tsval = opt_be32(b, 8);
	o->tsecr = opt_be32(b, 12);
	o->has_ts = 1;
	o->wscale = b[19];
	o->has_wscale = 1;
	return 1;
}

/* Timestamps behind two NOPs: the third ACK of a handshake, and most
 * segments after it, from any stack that agreed to timestamps. */
static __always_inline int tcp_opts_nop_nop_ts(struct tcp_opt_walk *w)
{
	const __u8 *b = w->buf;
	struct tcp_opts *o = &w->opts;

	if (w->len != 12 || b[0] != TCPOPT_NOP || b[1] != TCPOPT_NOP || b[2] != TCPOPT_TIMESTAMP ||
	    b[3] != 10)
		return 0;
	o->tsval = opt_be32(b, 4);
	o->tsecr = opt_be32(b, 8);
	o->has_ts = 1;
	return 1;
}

/* Walks w->len bytes of options in w->buf, whatever their order. Every
 * option is at least one byte, so MAX_TCP_OPTIONS steps cover 40 bytes;
 * bpf_loop keeps the verifier's work to one pass over the step. The two
 * common layouts above skip the walk. */
static __always_inline void parse_tcp_options(struct tcp_opt_walk *w)
{
	if (tcp_opts_linux_syn(w) || tcp_opts_nop_nop_ts(w))
		return;
	w->pos = 0;
	bpf_loop(MAX_TCP_OPTIONS, tcp_opt_step, w, 0);
}

/* The two layouts above, read as 32-bit words straight from the frame: a
 * few loads and compares where a copy to the stack and the byte-wise match
 * take a hundred instructions. The same kind and length bytes must match,
 * so the result is the walk's own. b holds len bytes of options. */
static __always_inline int tcp_opts_words(const __u32 *b, __u32 len, struct tcp_opts *o)
{
	__u32 w0 = b[0];

	if (len == 20) {
		__u32 w4 = b[4];

		if ((w0 & bpf_htonl(0xffff0000)) != bpf_htonl((__u32)TCPOPT_MSS << 24 | 4 << 16) ||
		    b[1] != bpf_htonl((__u32)TCPOPT_SACK_PERM << 24 | 2 << 16 | TCPOPT_TIMESTAMP << 8 | 10) ||
		    (w4 & bpf_htonl(0xffffff00)) != bpf_htonl((__u32)TCPOPT_NOP << 24 | TCPOPT_WINDOW << 16 | 3 << 8))
			return 0;
		o->mss = bpf_ntohl(w0) & 0xffff;
		o->has_mss = 1;
		o->sack_ok = 1;
		o->tsval = bpf_ntohl(b[2]);
		o->tsecr = bpf_ntohl(b[3]);
		o->has_ts = 1;
		o->wscale = bpf_ntohl(w4) & 0xff;
		o->has_wscale = 1;
		return 1;
	}
	if (w0 != bpf_htonl((__u32)TCPOPT_NOP << 24 | TCPOPT_NOP << 16 | TCPOPT_TIMESTAMP << 8 | 10))
		return 0;
	o->tsval = bpf_ntohl(b[1]);
	o->tsecr = bpf_ntohl(b[2]);
	o->has_ts = 1;
	return 1;
}

/* The common option lengths (the layouts above) are read or copied
 * straight out of the frame when the TCP header starts within this
 * offset; others go through bpf_xdp_load_bytes, a helper call. */
#define TCP_OPTS_DIRECT_OFF_MASK 0xff

/* The options of the packet's TCP header, copied out of the frame and
 * walked on first use and kept in p, so that a SYN's options are read once
 * however many stages need them (the attack shape, the cookie). NULL when
 * they cannot be copied. */
static __always_inline const struct tcp_opts *xdp_tcp_options(struct xdp_md *ctx, struct packet *p)
{
	__u32 optlen = p->tcp_optlen;
	void *end = (void *)(long)ctx->data_end;
	__u8 *src;

	if (p->opts_state == TCP_OPTS_READ)
		return &p->opts;
	if (p->opts_state == TCP_OPTS_UNREADABLE)
		return NULL;
	__builtin_memset(&p->opts, 0, sizeof(p->opts));
	src = (void *)(long)ctx->data + (p->l4_off & TCP_OPTS_DIRECT_OFF_MASK) + sizeof(struct tcphdr);
	/* The common layouts need no copy. */
	if (p->l4_off <= TCP_OPTS_DIRECT_OFF_MASK &&
	    ((optlen == 20 && (void *)(src + 20) <= end && tcp_opts_words((const __u32 *)src, 20, &p->opts)) ||
	     (optlen == 12 && (void *)(src + 12) <= end && tcp_opts_words((const __u32 *)src, 12, &p->opts)))) {
		p->opts_state = TCP_OPTS_READ;
		return &p->opts;
	}
	p->opts_state = TCP_OPTS_UNREADABLE;
	if (optlen) {
		struct tcp_opt_walk w = {};

		if (p->l4_off <= TCP_OPTS_DIRECT_OFF_MASK && optlen == 20 && (void *)(src + 20) <= end)
			__builtin_memcpy(w.buf, src, 20);
		else if (p->l4_off <= TCP_OPTS_DIRECT_OFF_MASK && optlen == 12 && (void *)(src + 12) <= end)
			__builtin_memcpy(w.buf, src, 12);
		else if (bpf_xdp_load_bytes(ctx, p->l4_off + sizeof(struct tcphdr), w.buf, opt_copy_len(optlen)))
			return NULL;
		w.len = optlen;
		parse_tcp_options(&w);
		p->opts = w.opts;
	}
	p->opts_state = TCP_OPTS_READ;
	return &p->opts;
}

#endif /* MOAT_TCP_OPTIONS_H */
