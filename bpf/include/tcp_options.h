/* SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause */
/* TCP option parsing over a stack copy of the options, in any order, with
 * a bounded loop. */
#ifndef MOAT_TCP_OPTIONS_H
#define MOAT_TCP_OPTIONS_H

#include <linux/types.h>
#include <bpf/bpf_helpers.h>
#include "syn_structs.h"

#define TCPOPT_EOL 0
#define TCPOPT_NOP 1
#define TCPOPT_MSS 2
#define TCPOPT_WINDOW 3
#define TCPOPT_SACK_PERM 4
#define TCPOPT_TIMESTAMP 8
#define TCP_MAX_WSCALE 14
/* The stack buffer is larger than the 40 bytes of options so that an index
 * masked with TCP_OPTBUF_MASK is always inside it. */
#define TCP_OPTBUF_SIZE 64
#define TCP_OPTBUF_MASK (TCP_OPTBUF_SIZE - 1)
#define TCP_MAX_OPTLEN 40

struct tcp_opts {
	__u32 tsval;
	__u32 tsecr;
	__u16 mss;
	__u8 has_mss;
	__u8 wscale;
	__u8 has_wscale;
	__u8 sack_ok;
	__u8 has_ts;
	__u8 pad;
};

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
	}
	w->pos = i + olen;
	return 0;
}

/* Walks w->len bytes of options in w->buf, whatever their order. Every
 * option is at least one byte, so MAX_TCP_OPTIONS steps cover 40 bytes;
 * bpf_loop keeps the verifier's work to one pass over the step. */
static __always_inline void parse_tcp_options(struct tcp_opt_walk *w)
{
	w->pos = 0;
	bpf_loop(MAX_TCP_OPTIONS, tcp_opt_step, w, 0);
}

#endif /* MOAT_TCP_OPTIONS_H */
