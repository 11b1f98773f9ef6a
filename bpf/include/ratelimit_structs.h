/* SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause */
/* Rate limits, flood budgets, heavy hitters and attack shape: constants,
 * map keys and values shared with the control plane (internal/ratelimit
 * gets its Go types from here through bpf2go). */
#ifndef MOAT_RATELIMIT_STRUCTS_H
#define MOAT_RATELIMIT_STRUCTS_H

#include <linux/types.h>
#include "moat_structs.h"

/* Rule ids are 1..MAX_RL_RULES-1; 0 in a scope table means no rule. */
#ifndef MAX_RL_RULES
#define MAX_RL_RULES 256
#endif
/* Per-source bucket state. An LRU hash is preallocated (about 100 bytes an
 * entry), and only sources that pass the sketch threshold get an entry, so
 * this bounds the number of sources over their limit tracked at once. */
#ifndef MAX_RL_SOURCES
#define MAX_RL_SOURCES (1 << 17)
#endif
/* Sampled heavy-hitter sources. */
#ifndef MAX_HH_SOURCES
#define MAX_HH_SOURCES (1 << 14)
#endif
/* The heavy-hitter admission gate: a sampled source that is not in
 * hh_sources leaves a fingerprint in one of HH_GATE_SLOTS slots, and
 * enters the table only when a later sample finds it there. */
#define HH_GATE_BITS 12
#define HH_GATE_SLOTS (1 << HH_GATE_BITS)
/* Count-min sketch: RL_SKETCH_ROWS rows of RL_SKETCH_WIDTH cells. */
#ifndef RL_SKETCH_WIDTH
#define RL_SKETCH_WIDTH (1 << 16)
#endif
#define RL_SKETCH_ROWS 2
/* The sketch counts packets per source in windows of 2^RL_WINDOW_SHIFT ns
 * (about 1.07 s): long enough that a source over even a low limit crosses
 * its threshold within one window. */
#ifndef RL_WINDOW_SHIFT
#define RL_WINDOW_SHIFT 30
#endif
/* Bucket intervals are ns per packet or per byte in fixed point. */
#define RL_FP_SHIFT 16
/* Heavy hitters aggregate IPv6 sources per prefix of this length. */
#ifndef HH_V6_PREFIX
#define HH_V6_PREFIX 64
#endif

/* Scope tables: the class table has one slot per port class and one,
 * RL_CLASS_ALL, for all traffic. */
#define RL_CLASS_ALL 4
#define RL_CLASS_SLOTS 5

/* Attack shape: frame size buckets (upper bounds in bytes, the last open). */
#define SHAPE_SIZE_BUCKETS 8
/* Per destination port packet counts: TCP and UDP ports, then ICMP and
 * ICMPv6 types, in blocks of SHAPE_PORT_BLOCK: a per-CPU array allocates
 * each element apart, and 131,584 one-counter elements took half a second
 * to create. */
#define SHAPE_PORT_SLOTS (2 * 65536 + 2 * 256)
#define SHAPE_PORT_BLOCK 256
#define SHAPE_PORT_BLOCKS (SHAPE_PORT_SLOTS / SHAPE_PORT_BLOCK)

enum rl_kind {
	RL_KIND_NONE = 0,
	RL_KIND_SOURCE = 1, /* a bucket per source address (or IPv6 prefix) */
	RL_KIND_BUDGET = 2, /* one bucket for everyone: a flood budget */
};

enum rl_rule_flags {
	RL_F_SYN_ONLY = 1,  /* TCP SYNs (no ACK) only */
	RL_F_TLS_HELLO = 2, /* TCP segments that open a TLS ClientHello only */
	RL_F_QUIC_INITIAL = 4, /* UDP datagrams that open with a QUIC Initial packet only */
};

/* What lets a source that has no bucket get one. A flood from random
 * addresses sends a packet or two per address: giving each a bucket would
 * churn the per-source map and cost an insert per packet. */
enum rl_gate {
	/* With probability 1/track_pkts per packet: the default, as its cost
	 * does not grow with the flood (BenchmarkPathCost in internal/ratelimit). */
	RL_GATE_SAMPLE = 0,
	/* Once the sketch counts track_pkts packets in a window, which is
	 * checked before the per-source map is read. Once a window holds
	 * more than about RL_SKETCH_WIDTH * track_pkts sources every cell is
	 * over the threshold and every source gets a bucket. */
	RL_GATE_SKETCH = 1,
	RL_GATE_NONE = 2, /* on the first packet */
};

/* Why rl_check dropped a packet, or RL_PASS. */
enum rl_result {
	RL_PASS = 0,
	RL_DROP_SOURCE = 1,
	RL_DROP_BUDGET = 2,
	/* Not a verdict: the packet is an ACK to a listener that a
	 * +tls-hello limit takes if it returns a valid SYN cookie; the caller
	 * sets on_connection with rl_cookie_ack and runs rl_check again. */
	RL_CHECK_COOKIE = 3,
};

/* packet.on_connection: whether a TCP packet is part of a connection, as
 * rl_on_connection found. */
enum rl_connection {
	RL_CONN_UNKNOWN = 0,
	RL_CONN_YES = 1,
	RL_CONN_NO = 2,
	RL_CONN_COOKIE = 3, /* an ACK to a listener: yes if its cookie is valid */
};

/* A limit, indexed by id. The control plane writes the whole rule before
 * pointing a scope slot at it and clears the slots before the rule. The
 * intervals are ns per unit << RL_FP_SHIFT (0: no limit on that unit); a
 * tolerance is the burst in ns of the bucket's clock. */
struct rl_rule {
	__u64 pkt_interval;
	__u64 pkt_tolerance;
	__u64 byte_interval;
	__u64 byte_tolerance;
	__u64 block_ns;   /* source rules: deny a source over its limit this long; 0 = never */
	__u32 track_pkts; /* source rules: packets per sketch window before a source gets a bucket */
	__u8 kind;        /* enum rl_kind */
	__u8 flags;       /* enum rl_rule_flags */
	__u8 v6_prefix;   /* source rules: IPv6 sources share a bucket per prefix of this length */
	__u8 class;       /* scope, for listing: enum port_class or RL_CLASS_ALL */
	__u16 port_from;  /* scope, for listing; both 0 and all_ports set for a whole class */
	__u16 port_to;
	__u8 all_ports;
	__u8 pad[3];
	struct comment reason; /* the comment of the denylist entry an auto-block makes */
};

/* Element of the scope tables: the rules of each kind that cover a scope. */
struct rl_slot {
	__u16 source; /* rule id, 0 = none */
	__u16 budget;
};

/* A GCRA token bucket: the theoretical arrival time of the next packet on
 * the CLOCK_BOOTTIME ns clock, per unit. */
struct rl_bucket {
	__u64 tat_pkts;
	__u64 tat_bytes;
};

/* Key of per-source state and of heavy hitters. */
struct rl_src_key {
	__u8 addr[16]; /* IPv4 in the first 4 bytes; IPv6 masked to the prefix */
	__u16 rule;    /* 0 in heavy-hitter keys */
	__u8 family;   /* 4 or 6 */
	__u8 prefixlen;
};

struct rl_src_state {
	struct rl_bucket bucket;
	__u64 passed;
	__u64 dropped;
	__u64 created_ns;
};

/* Per CPU and per rule. Fields are only ever added at the end: the
 * control plane carries the counters of an older, shorter value over
 * (carryRuleStats in internal/shield) and reads a missing field as 0. */
struct rl_rule_stats {
	__u64 passed;
	__u64 passed_bytes;
	__u64 dropped;
	__u64 dropped_bytes;
	__u64 untracked; /* passed on the sketch alone, with no bucket */
	__u64 tracked;   /* buckets created */
	__u64 blocks;    /* denylist entries created */
	__u64 block_errors; /* an auto-block that could not be written */
	/* Over the limit but passed, in monitor mode: what enforcing would
	 * have counted as dropped. */
	__u64 monitored;
	__u64 monitored_bytes;
};

/* Sampled counts of one source; multiply by the sampling interval. Fields
 * are only ever added at the end: the control plane carries the entries
 * of an older, shorter value over (carryHeavyHitters in internal/shield)
 * and reads a missing field as 0. */
struct hh_counts {
	__u64 packets;
	__u64 bytes;
	__u64 dropped; /* sampled packets that a limit, budget or port rule dropped */
	__u64 last_ns;
	/* Sampled packets that one of those would have dropped and monitor
	 * mode passed: what enforcing would have counted as dropped. */
	__u64 monitored;
};

struct shape_port_block {
	__u64 packets[SHAPE_PORT_BLOCK];
};

/* Settings that change at run time. All zeros, as a new map holds, is the
 * default: shape counted, 1 packet in 2^HH_DEFAULT_SAMPLE_LOG2 sampled,
 * the default gate. */
struct rl_config {
	__u32 shape_off;       /* 1: do not count the attack shape */
	__u32 hh_off;          /* 1: no heavy-hitter sampling */
	__u32 hh_sample;       /* sample 1 packet in 2^(hh_sample - 1); 0 = 2^HH_DEFAULT_SAMPLE_LOG2 */
	__u32 gate;            /* enum rl_gate */
};
#define HH_DEFAULT_SAMPLE_LOG2 6
#define HH_MAX_SAMPLE_LOG2 16

/* The attack shape, per CPU, of traffic that reaches the limits (so not
 * allowlisted or denylisted). */
struct attack_shape {
	__u64 sizes[SHAPE_SIZE_BUCKETS]; /* frame length <=64,128,256,512,1024,1518,9018,more */
	__u64 protocols[4];              /* TCP, UDP, ICMP or ICMPv6, other */
	__u64 tcp_flags[256];            /* by the TCP flags byte */
	__u64 syn_options[16];           /* SYNs by options present: MSS 1, WS 2, SACK 4, TS 8 */
	__u64 tcp_options;               /* non-SYN TCP segments with options */
	__u64 tcp_no_options;            /* non-SYN TCP segments without */
	__u64 fragments;
};

#endif /* MOAT_RATELIMIT_STRUCTS_H */
