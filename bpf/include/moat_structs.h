/* SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause */
/* Map keys and values. The Go side gets its types from these through
 * bpf2go; there is no hand-written copy. */
#ifndef MOAT_STRUCTS_H
#define MOAT_STRUCTS_H

#include <linux/types.h>

#include "capture_structs.h" /* packet capture (moat dump) */

/* Key of the exact-host maps (/32 and /128), network byte order. */
struct host_v4 {
	__u8 addr[4];
};

struct host_v6 {
	__u8 addr[16];
};

/* Key of the prefix tries. */
struct net_v4 {
	__u32 prefixlen;
	__u8 addr[4];
};

struct net_v6 {
	__u32 prefixlen;
	__u8 addr[16];
};

/* Value of every allow and deny entry. */
struct prefix_rule {
	__u64 hits;       /* packets this rule decided; atomic add */
	__u64 expires_ns; /* CLOCK_BOOTTIME deadline, 0 = never */
	__u32 prefixlen;  /* the entry's own length, to step past it when expired */
	__u32 flags;      /* RULE_F_* */
};

#define RULE_F_COMMENT 1 /* a comment is stored in the comments map */
#define RULE_F_AUTO 2    /* written by the data path: a rate limit's auto-block */
/* An auto-block written in monitor mode: in force only while monitoring,
 * so that a trial's blocks never drop once it ends. */
#define RULE_F_MONITOR 4

/* Key of the comments map: which list and which prefix. */
struct comment_key {
	__u8 list;   /* 0 allow, 1 deny */
	__u8 family; /* 4 or 6 */
	__u8 prefixlen;
	__u8 pad;
	__u8 addr[16];
};

struct comment {
	char text[64];
};

/* Element of the port table: which rule covers this port, and its action. */
struct port_rule {
	__u16 id;     /* 1..MAX_PORT_RULES-1, 0 = no rule */
	__u8 action;  /* enum rule_action */
	__u8 pad;
};

/* A port rule as the operator wrote it. The data path never reads these;
 * they let the control plane list rules without scanning the whole port
 * table. Written before a rule's slots are filled, cleared after they are
 * emptied. */
struct port_rule_def {
	__u8 class;  /* enum port_class */
	__u8 action; /* enum rule_action; ACTION_NONE = unused id */
	__u16 from;
	__u16 to;
	__u16 pad;
};

struct verdict_counter {
	__u64 packets;
	__u64 bytes;
};

/* A block of the deny summary (see enum deny_summary_geometry). Bits are
 * set with atomic ORs, by the control plane (through deny_summary_or)
 * before it adds entries and by the data path before it adds an
 * auto-block; only a rebuild clears them. */
struct summary_block {
	__u64 w[SUMMARY_BLOCK_WORDS];
};

/* Written by the control plane only. */
struct summary_state {
	__u32 ready;   /* enum deny_summary_family: families whose bits hold */
	__u32 built;   /* the layout the control plane built it in; 0: unbuilt */
	__u64 removed; /* entries removed since: bits that may be stale */
};

/* Argument of deny_summary_or: ORs w into block number block. */
struct summary_or_args {
	__u32 block;
	__u32 pad;
	__u64 w[SUMMARY_BLOCK_WORDS];
};

/* Settings that may change while the program runs. */
struct runtime_settings {
	__u32 fragments; /* enum fragment_policy */
	__u32 malformed; /* enum malformed_policy */
	__u32 allow_in_use; /* enum allow_in_use bits */
	/* Non-zero: monitor mode. Every verdict that would drop passes and is
	 * counted as monitored; the SYN defence, which answers and drops
	 * rather than judges, stands down. */
	__u32 monitor;
};

#endif /* MOAT_STRUCTS_H */
