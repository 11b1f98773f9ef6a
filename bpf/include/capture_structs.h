/* SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause */
/* Packet capture (moat dump): the settings the data path reads and the
 * records it writes to the capture ring. Included from moat_structs.h. */
#ifndef MOAT_CAPTURE_STRUCTS_H
#define MOAT_CAPTURE_STRUCTS_H

#include <linux/types.h>

/* Ring buffer shared by every interface. At about 200 bytes a record for
 * small frames it holds some 20,000 packets, a few tens of milliseconds of
 * a flood: the reader drains it continuously, and what does not fit is
 * counted as lost. A power of two, as the kernel requires. */
#ifndef CAPTURE_RING_SIZE
#define CAPTURE_RING_SIZE (4 << 20)
#endif
/* Longest frame copied: a jumbo frame. Longer frames are cut, and their
 * record says how long they were. */
#define CAPTURE_MAX_SNAPLEN 9216

/* Which verdicts a capture wants; bits of capture_config.verdicts. */
enum capture_verdict {
	CAPTURE_VERDICT_PASS = 1, /* every action but XDP_DROP */
	CAPTURE_VERDICT_DROP = 2,
};

/* Filters in force; bits of capture_config.flags. */
enum capture_filter {
	CAPTURE_F_ADDR = 1,  /* source or destination in addr/mask */
	CAPTURE_F_PROTO = 2, /* IP protocol is proto */
	CAPTURE_F_PORT = 4,  /* TCP or UDP source or destination port is port */
};

/* What to capture. Written whole by moat dump; the data path only clears
 * enabled, when the lease has run out. */
struct capture_config {
	__u32 enabled;  /* read first: 0 costs the data path one load and a branch */
	__u32 session;  /* stamped on records, so a reader skips an earlier session's */
	__u64 lease_ns; /* CLOCK_BOOTTIME; past it the data path turns capture off */
	__u32 ifindex;  /* 0: every interface */
	__u32 snaplen;  /* 1..CAPTURE_MAX_SNAPLEN bytes copied per frame */
	__u32 sample;   /* keep one matching packet in sample per CPU; 0 or 1: all */
	__u8 verdicts;  /* enum capture_verdict bits */
	__u8 flags;     /* enum capture_filter bits */
	__u8 family;    /* 4 or 6, with CAPTURE_F_ADDR */
	__u8 proto;     /* IPPROTO_*, with CAPTURE_F_PROTO */
	__u16 port;     /* host order, with CAPTURE_F_PORT */
	__u16 pad;
	__u32 addr[4];  /* network order, already masked; IPv4 in addr[0] */
	__u32 mask[4];
	__u32 pad2;
};

/* Header of every record in the capture ring; cap_len bytes of the frame
 * follow it. */
struct capture_record {
	__u64 ts_ns;   /* CLOCK_BOOTTIME */
	__u32 session;
	__u32 ifindex;
	__u32 pkt_len; /* length of the frame */
	__u32 cap_len; /* bytes of it that follow */
	__u8 action;   /* XDP_* */
	__u8 reason;   /* enum verdict_reason */
	/* The allow or deny entry that decided, as the family, the packet's
	 * source address and the entry's prefix length; family 0: none. */
	__u8 rule_family;
	__u8 rule_prefixlen;
	__u16 port_rule; /* id of the port rule that decided, 0: none */
	__u8 monitored; /* a drop that monitor mode passed: action is XDP_PASS */
	__u8 pad;
	__u8 rule_addr[16];
};

#endif /* MOAT_CAPTURE_STRUCTS_H */
