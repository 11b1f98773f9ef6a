/* SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause */
/* Address and port rule lookups. */
#ifndef MOAT_POLICY_H
#define MOAT_POLICY_H

#include "moat_maps.h"
#include "parsing.h"

/* Whether moat is in monitor mode (struct runtime_settings). */
static __always_inline int monitoring(void)
{
	__u32 zero = 0;
	struct runtime_settings *s = bpf_map_lookup_elem(&settings, &zero);

	return s && s->monitor;
}

/* Whether an entry is in force: its time has not passed, and an auto-block
 * of monitor mode only while monitoring. */
static __always_inline int rule_live(const struct prefix_rule *r)
{
	if ((r->flags & RULE_F_MONITOR) && !monitoring())
		return 0;
	return r->expires_ns == 0 || bpf_ktime_get_boot_ns() < r->expires_ns;
}

/* The tries match_prefix walks, named for the walk's step. */
enum prefix_trie {
	TRIE_ALLOW_V4,
	TRIE_ALLOW_V6,
	TRIE_DENY_V4,
	TRIE_DENY_V6,
};

/* A walk below expired trie entries (match_prefix). key is the next
 * question: the source address, and a length below the last expired
 * entry's (an IPv4 trie reads its first 8 bytes, which have the layout of
 * its own key). found is 1 + the length of the live entry that ended the
 * walk, or 0 if none covers the address. */
struct prefix_walk {
	struct net_v6 key;
	__u32 trie; /* enum prefix_trie */
	__u32 found;
};

static long prefix_walk_step(__u64 i, struct prefix_walk *w)
{
	struct prefix_rule *r;

	switch (w->trie) {
	case TRIE_ALLOW_V4:
		r = bpf_map_lookup_elem(&allow_v4_nets, &w->key);
		break;
	case TRIE_ALLOW_V6:
		r = bpf_map_lookup_elem(&allow_v6_nets, &w->key);
		break;
	case TRIE_DENY_V4:
		r = bpf_map_lookup_elem(&deny_v4_nets, &w->key);
		break;
	default:
		r = bpf_map_lookup_elem(&deny_v6_nets, &w->key);
		break;
	}
	if (!r)
		return 1;
	if (rule_live(r)) {
		w->found = r->prefixlen + 1;
		return 1;
	}
	/* An expired /0 has nothing shorter behind it; a longer entry than
	 * asked for cannot come back from a trie. */
	if (r->prefixlen == 0 || r->prefixlen > w->key.prefixlen)
		return 1;
	w->key.prefixlen = r->prefixlen - 1;
	return 0;
}

/* Finds the rule in force for addr: the exact host first, then the longest
 * live prefix. An expired prefix must not shadow a shorter live one that
 * covers it, so the trie is asked again below each expired entry's length,
 * down to a live entry or none. Each question is shorter than the last, so
 * 129 questions end any walk; bpf_loop keeps the verifier's work to one
 * pass over the step, and the common case (no entry, or a live one first)
 * never enters it. */
static __always_inline struct prefix_rule *
match_prefix(void *hosts, void *nets, const __u8 *addr, int family, enum prefix_trie trie, int no_host)
{
	struct prefix_walk w = {};
	struct prefix_rule *r;

	/* no_host: the host summary says addr has no host entry. */
	if (!no_host) {
		r = bpf_map_lookup_elem(hosts, addr);
		if (r && rule_live(r))
			return r;
	}

	w.key.prefixlen = family == 4 ? 32 : 128;
	__builtin_memcpy(w.key.addr, addr, 16);
	r = bpf_map_lookup_elem(nets, &w.key);
	if (!r || rule_live(r))
		return r;
	if (r->prefixlen == 0 || r->prefixlen > w.key.prefixlen)
		return NULL;
	w.key.prefixlen = r->prefixlen - 1;
	w.trie = trie;
	bpf_loop(129, prefix_walk_step, &w, 0);
	if (!w.found)
		return NULL;
	/* The live entry the walk found, for its hits and verdict. Should it
	 * have expired or gone in between, nothing is in force. */
	w.key.prefixlen = w.found - 1;
	r = bpf_map_lookup_elem(nets, &w.key);
	return r && rule_live(r) ? r : NULL;
}

static __always_inline struct prefix_rule *match_allow(const struct packet *p, __u32 in_use)
{
	if (p->family == 4)
		return in_use & ALLOW_IN_USE_V4 ?
			match_prefix(&allow_v4_hosts, &allow_v4_nets, p->saddr, 4, TRIE_ALLOW_V4, 0) : NULL;
	return in_use & ALLOW_IN_USE_V6 ?
		match_prefix(&allow_v6_hosts, &allow_v6_nets, p->saddr, 6, TRIE_ALLOW_V6, 0) : NULL;
}

/* The summary word and bit of an address (enum deny_summary_geometry) in
 * summary map m (deny_summary or deny_host_summary). */
static __always_inline __u64 *summary_word(void *m, int family, const __u8 *addr, __u64 *mask)
{
	struct summary_block *b;
	__u32 n, blk;

	if (family == 4) {
		n = (__u32)addr[0] << 16 | (__u32)addr[1] << 8 | addr[2];
		blk = SUMMARY_V4_FIRST + (n >> SUMMARY_BLOCK_SHIFT);
	} else {
		n = (__u32)addr[0] << 24 | (__u32)addr[1] << 16 | (__u32)addr[2] << 8 | addr[3];
		n = (n * (__u32)SUMMARY_V6_HASH_MUL) >> (32 - SUMMARY_V6_HASH_BITS);
		blk = SUMMARY_V6_FIRST + (n >> SUMMARY_BLOCK_SHIFT);
	}
	b = bpf_map_lookup_elem(m, &blk);
	if (!b)
		return NULL;
	*mask = 1ULL << (n & 63);
	return &b->w[(n >> 6) & (SUMMARY_BLOCK_WORDS - 1)];
}

/* Whether the summary shows that no denylist entry covers the source. st
 * is the summary's state. */
static __always_inline int deny_summary_clear(const struct packet *p, const struct summary_state *st)
{
	__u32 zero = 0, fam = p->family == 4 ? SUMMARY_V4 : SUMMARY_V6;
	struct summary_block *flags = bpf_map_lookup_elem(&deny_summary, &zero);
	__u64 mask, *w;

	if (!st || !flags || !(st->ready & fam) || (flags->w[0] & fam))
		return 0;
	w = summary_word(&deny_summary, p->family, p->saddr, &mask);
	return w && !(*w & mask);
}

/* Whether the host summary shows that the source has no host entry. */
static __always_inline int deny_hosts_absent(const struct packet *p, const struct summary_state *st)
{
	__u32 fam = p->family == 4 ? SUMMARY_V4_HOSTS : SUMMARY_V6_HOSTS;
	__u64 mask, *w;

	if (!st || !(st->ready & fam))
		return 0;
	w = summary_word(&deny_host_summary, p->family, p->saddr, &mask);
	return w && !(*w & mask);
}

/* Marks the summary for a denylist entry the data path is about to add,
 * and the host summary when the entry is an exact host. */
static __always_inline void deny_summary_mark(int family, const __u8 *addr, __u32 prefixlen)
{
	__u32 zero = 0;
	__u64 mask, *w;

	if (family == 6 && prefixlen < 32) {
		struct summary_block *flags = bpf_map_lookup_elem(&deny_summary, &zero);

		if (flags)
			__sync_fetch_and_or(&flags->w[0], SUMMARY_V6);
		return;
	}
	w = summary_word(&deny_summary, family, addr, &mask);
	if (w)
		__sync_fetch_and_or(w, mask);
	if (prefixlen != (family == 4 ? 32 : 128))
		return;
	w = summary_word(&deny_host_summary, family, addr, &mask);
	if (w)
		__sync_fetch_and_or(w, mask);
}

static __always_inline struct prefix_rule *match_deny(const struct packet *p)
{
	__u32 zero = 0;
	struct summary_state *st = bpf_map_lookup_elem(&deny_summary_state, &zero);
	int no_host;

	if (deny_summary_clear(p, st))
		return NULL;
	no_host = deny_hosts_absent(p, st);
	if (p->family == 4)
		return match_prefix(&deny_v4_hosts, &deny_v4_nets, p->saddr, 4, TRIE_DENY_V4, no_host);
	return match_prefix(&deny_v6_hosts, &deny_v6_nets, p->saddr, 6, TRIE_DENY_V6, no_host);
}

static __always_inline int port_class(const struct packet *p)
{
	switch (p->l4proto) {
	case IPPROTO_TCP:
		return PORT_CLASS_TCP;
	case IPPROTO_UDP:
		return PORT_CLASS_UDP;
	case IPPROTO_ICMP:
		return PORT_CLASS_ICMP;
	case IPPROTO_ICMPV6:
		return PORT_CLASS_ICMPV6;
	}
	return -1;
}

/* Returns the port rule that covers the packet's destination port (or ICMP
 * type), counting a hit on it, or NULL. */
/* The port rule for p's destination port (or ICMP type), if any. Its hit
 * is counted by port_hit, where it decides. */
static __always_inline struct port_rule *match_port(const struct packet *p)
{
	struct port_rule *rule;
	__u32 idx;
	int class;

	if (!p->has_l4)
		return NULL;
	class = port_class(p);
	if (class < 0)
		return NULL;
	idx = ((__u32)class << 16) | p->dport;
	rule = bpf_map_lookup_elem(&port_rules, &idx);
	if (!rule || rule->id == 0 || rule->action == ACTION_NONE)
		return NULL;
	return rule;
}

/* Counts a hit of the port rule that decided a packet. */
static __always_inline void port_hit(const struct port_rule *rule)
{
	__u32 id = rule->id;
	__u64 *hits = bpf_map_lookup_elem(&port_rule_hits, &id);

	if (hits)
		*hits += 1;
}

#endif /* MOAT_POLICY_H */
