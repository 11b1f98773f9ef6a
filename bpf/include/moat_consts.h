/* SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause */
/* Constants shared by the data path and the control plane. Every limit can
 * be overridden at build time with -D. */
#ifndef MOAT_CONSTS_H
#define MOAT_CONSTS_H

/* Parser bounds. Going past one is a deliberate malformed verdict. */
#ifndef MAX_VLAN_DEPTH
#define MAX_VLAN_DEPTH 2
#endif
#ifndef MAX_IPV6_EXT_HDRS
#define MAX_IPV6_EXT_HDRS 8
#endif

/* Map sizes. */
#ifndef MAX_DENY_HOSTS
#define MAX_DENY_HOSTS (1 << 21)
#endif
#ifndef MAX_DENY_NETS
#define MAX_DENY_NETS (1 << 21)
#endif
#ifndef MAX_ALLOW_HOSTS
#define MAX_ALLOW_HOSTS (1 << 16)
#endif
#ifndef MAX_ALLOW_NETS
#define MAX_ALLOW_NETS (1 << 16)
#endif
#ifndef MAX_PORT_RULES
#define MAX_PORT_RULES 1024
#endif
#ifndef MAX_COMMENTS
#define MAX_COMMENTS (1 << 16)
#endif
#ifndef MAX_AUTO_REASONS
#define MAX_AUTO_REASONS (1 << 16)
#endif
#define COMMENT_LEN 64

/* The port table is indexed by (class << 16) | port, where for ICMP the
 * "port" is the message type. */
enum port_class {
	PORT_CLASS_TCP = 0,
	PORT_CLASS_UDP = 1,
	PORT_CLASS_ICMP = 2,
	PORT_CLASS_ICMPV6 = 3,
	PORT_CLASS_MAX = 4,
};
#define PORT_TABLE_SIZE (PORT_CLASS_MAX << 16)

enum rule_action {
	ACTION_NONE = 0,
	ACTION_DROP = 1,
	ACTION_ALLOW = 2,
};

/* Why a packet got its verdict; one counter slot each. */
enum verdict_reason {
	REASON_PASS = 0,       /* no rule matched */
	REASON_NON_IP = 1,     /* ARP, LLDP, ...: passed untouched */
	REASON_ALLOWLIST = 2,  /* source in the allowlist: passed */
	REASON_DENYLIST = 3,   /* source in the denylist: dropped */
	REASON_PORT_DROP = 4,  /* protocol/port or ICMP type rule: dropped */
	REASON_PORT_ALLOW = 5, /* protocol/port or ICMP type rule: passed */
	REASON_FRAGMENT = 6,   /* non-first fragment, per the fragment policy */
	REASON_MALFORMED = 7,  /* truncated or inconsistent headers */
	REASON_RATELIMIT = 8,  /* source over its rate limit (ratelimit.h): dropped */
	REASON_BUDGET = 9,     /* over the flood budget of its protocol/port: dropped */
	REASON_SYN_COOKIE = 10, /* SYN answered with a moat cookie (XDP_TX, counted in the pass slot) */
	REASON_SYN_DEFENCE = 11, /* ACK that fits no socket or cookie, or SYN refused in cookie mode: dropped;
				  * or the ACK answered with a RST (XDP_TX, in the pass slot) */
	REASON_MAX = 12,
};

/* What to do with a non-first fragment, which carries no L4 header: source
 * address rules still apply, port rules cannot. */
enum fragment_policy {
	FRAGMENTS_PASS = 0,
	FRAGMENTS_DROP = 1,
};

/* Which address families have allowlist entries (runtime_settings
 * .allow_in_use). Only the control plane writes the allowlist: it sets a
 * bit before adding entries and clears it after removing the last, so the
 * data path skips both allow lookups for a family with none. A stale set
 * bit costs a lookup, never a verdict. */
enum allow_in_use {
	ALLOW_IN_USE_V4 = 1,
	ALLOW_IN_USE_V6 = 2,
};

/* The deny summary (maps deny_summary and deny_summary_state): one bit per
 * IPv4 /24 and one per hashed IPv6 /32, set while a denylist entry may cover
 * an address there. A source whose bit is clear is in no entry, so its two
 * deny lookups are skipped: on a large list they are a hash bucket and a
 * trie walk, several cache misses for a source not seen before, where the
 * summary costs one word (2 MB for all of IPv4). The map is an array of
 * 64-word blocks: block 0 holds flags, then the IPv4 bits (bit n is /24
 * number n), then the IPv6 ones (bit n is every /32 whose hash is n). */
enum deny_summary_geometry {
	SUMMARY_BLOCK_WORDS = 64,
	SUMMARY_BLOCK_SHIFT = 12, /* 4096 bits per block */
	SUMMARY_V4_FIRST = 1,
	SUMMARY_V4_BLOCKS = 4096, /* 2^24 /24s */
	SUMMARY_V6_FIRST = 4097,
	SUMMARY_V6_BLOCKS = 1024, /* 2^22 hashes of /32s */
	SUMMARY_V6_HASH_BITS = 22,
	SUMMARY_V6_HASH_MUL = 0x61c88647, /* odd; the hash is the product's top bits */
	SUMMARY_BLOCKS = 5121,
};

/* Families in the summary's state (deny_summary_state.ready: the family's
 * bits are complete and the data path may trust them) and in its flags
 * (block 0 word 0: the data path blocked an IPv6 prefix shorter than /32,
 * which no single bit covers, so IPv6 sources are looked up until the
 * control plane rebuilds the summary).
 *
 * The host summary (map deny_host_summary, the same geometry; its block 0
 * unused) has a bit set while an exact host entry (deny_v4_hosts,
 * deny_v6_hosts) may exist in the /24 or hashed /32. A source whose
 * summary bit is set but whose host bit is clear is covered, if at all,
 * by a prefix: its host lookup, a cache miss on a large list, is skipped
 * and the trie decides. SUMMARY_V4_HOSTS and SUMMARY_V6_HOSTS in ready say
 * the family's host bits are complete. */
enum deny_summary_family {
	SUMMARY_V4 = 1,
	SUMMARY_V6 = 2,
	SUMMARY_V4_HOSTS = 4,
	SUMMARY_V6_HOSTS = 8,
};

/* What to do with a malformed packet. */
enum malformed_policy {
	MALFORMED_DROP = 0,
	MALFORMED_PASS = 1,
};

#endif /* MOAT_CONSTS_H */
