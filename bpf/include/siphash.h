/* SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause */
/* SipHash-2-4 (Aumasson and Bernstein) over a whole number of 64-bit
 * little-endian words and 4 bytes more, unrolled: a bounded amount of work,
 * as the verifier wants. */
#ifndef MOAT_SIPHASH_H
#define MOAT_SIPHASH_H

#include <linux/types.h>

#define SIP_ROTL(x, b) (((x) << (b)) | ((x) >> (64 - (b))))

struct sip_state {
	__u64 v0, v1, v2, v3;
};

static __always_inline void sip_round(struct sip_state *s)
{
	s->v0 += s->v1;
	s->v1 = SIP_ROTL(s->v1, 13);
	s->v1 ^= s->v0;
	s->v0 = SIP_ROTL(s->v0, 32);
	s->v2 += s->v3;
	s->v3 = SIP_ROTL(s->v3, 16);
	s->v3 ^= s->v2;
	s->v0 += s->v3;
	s->v3 = SIP_ROTL(s->v3, 21);
	s->v3 ^= s->v0;
	s->v2 += s->v1;
	s->v1 = SIP_ROTL(s->v1, 17);
	s->v1 ^= s->v2;
	s->v2 = SIP_ROTL(s->v2, 32);
}

/* Hashes a message of nwords * 8 + 4 bytes: the first nwords words of m,
 * then the 4 bytes of tail (as little-endian), which share SipHash's last
 * block with the length. max_words, the most nwords can be, must be a
 * compile-time constant so that the loop unrolls. */
static __always_inline __u64 siphash24(__u64 k0, __u64 k1, const __u64 *m, __u32 nwords,
				       const int max_words, __u32 tail)
{
	struct sip_state s = {
		.v0 = k0 ^ 0x736f6d6570736575ULL,
		.v1 = k1 ^ 0x646f72616e646f6dULL,
		.v2 = k0 ^ 0x6c7967656e657261ULL,
		.v3 = k1 ^ 0x7465646279746573ULL,
	};
	__u64 b = (__u64)((nwords * 8 + 4) & 0xff) << 56 | tail;
	int i;

#pragma unroll
	for (i = 0; i < max_words; i++) {
		if (i < nwords) {
			s.v3 ^= m[i];
			sip_round(&s);
			sip_round(&s);
			s.v0 ^= m[i];
		}
	}
	s.v3 ^= b;
	sip_round(&s);
	sip_round(&s);
	s.v0 ^= b;
	s.v2 ^= 0xff;
	sip_round(&s);
	sip_round(&s);
	sip_round(&s);
	sip_round(&s);
	return s.v0 ^ s.v1 ^ s.v2 ^ s.v3;
}

#endif /* MOAT_SIPHASH_H */
