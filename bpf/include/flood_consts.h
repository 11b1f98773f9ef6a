/* SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause */
/* Constants shared by the flood generator program and its Go loader. */
#ifndef FLOOD_CONSTS_H
#define FLOOD_CONSTS_H

/* Which template fields the generator rewrites per frame. The Go side picks
 * the set from the attack kind, so the program knows fields, not attacks. */
enum rewrite_field {
	FLOOD_REWRITE_IP_ID = 1 << 0,     /* IPv4 identification: random */
	FLOOD_REWRITE_SPORT = 1 << 1,     /* TCP/UDP source port: random */
	FLOOD_REWRITE_DPORT = 1 << 2,     /* TCP/UDP destination port: random */
	FLOOD_REWRITE_SEQ = 1 << 3,       /* TCP sequence number: random */
	FLOOD_REWRITE_ACK = 1 << 4,       /* TCP acknowledgment number: random */
	FLOOD_REWRITE_TSVAL = 1 << 5,     /* TCP timestamp option value: random */
	FLOOD_REWRITE_ICMP_ECHO = 1 << 6, /* echo identifier random, sequence counts up */
};

/* Bytes of the template's headers that the generator restores before each
 * frame: Ethernet, two VLAN tags, IPv6 and a TCP header with 40 bytes of
 * options fit. */
#ifndef FLOOD_HEADER_MAX
#define FLOOD_HEADER_MAX 136
#endif

/* Slots of the receiver-side counter, one per kind of frame seen. */
enum count_slot {
	FLOOD_COUNT_TCP_SYN = 0,   /* SYN without ACK */
	FLOOD_COUNT_TCP_OTHER = 1, /* every other TCP segment */
	FLOOD_COUNT_UDP = 2,
	FLOOD_COUNT_ICMP = 3,      /* ICMP and ICMPv6 */
	FLOOD_COUNT_OTHER = 4,     /* IP with another protocol, or not IP */
	FLOOD_COUNT_MALFORMED = 5, /* the shared parser refused it */
	FLOOD_COUNT_MAX = 6,
};

#endif /* FLOOD_CONSTS_H */
