/* SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause */
/* SYN flood defence: constants, map keys and values shared with the control
 * plane (bpf2go generates the Go types from these). */
#ifndef MOAT_SYN_STRUCTS_H
#define MOAT_SYN_STRUCTS_H

#include <linux/types.h>

/* How many ports may be protected at once: the counters map has a slot
 * for each, plus slot 0, which means "no counters". */
#ifndef MAX_SYN_PORTS
#define MAX_SYN_PORTS 1024
#endif
/* Flood detection counts SYNs per CPU in windows of this length. */
#ifndef SYN_WINDOW_NS
#define SYN_WINDOW_NS 100000000ULL
#endif
/* Keys older than this many rotation periods are stale: two periods are
 * the life of a key, the half period is slack for a late rotator. In half
 * periods so that the arithmetic stays in integers. */
#define SYN_STALE_HALF_PERIODS 5
/* TCP options are at most 40 bytes, so at most 40 of them. */
#define MAX_TCP_OPTIONS 40
/* Defaults used when the syn_config map holds zeros. */
#define SYN_DEFAULT_HOLD_NS 10000000000ULL
#define SYN_DEFAULT_LIFETIME_NS 240000000000ULL
#define SYN_DEFAULT_MSS_V4 1460
#define SYN_DEFAULT_MSS_V6 1440
#define SYN_DEFAULT_RCV_WSCALE 7
/* How often the control plane rotates keys unless syn_config says other. */
#define SYN_DEFAULT_ROTATION_NS 60000000000ULL
/* RSTs a second per CPU for stray ACKs (syn_config.rst_rate). */
#define SYN_DEFAULT_RST_RATE 250
#define SYN_RST_OFF 0xffff
#define SYNACK_WINDOW 65535
#define SYNACK_TTL 64

/* The 32-bit cookie moat puts in its SYN-ACK's sequence number:
 *
 *   31 ......... 10 |  9  |  8  |  7   | 6 5 4 | 3 2 1 0
 *   hash (22 bits)  | key | ECN | SACK |  MSS  | wscale
 *
 * hash is bits 10-31 of SipHash-2-4 over the addresses, ports, the client's
 * ISN, the low 10 bits themselves (so those are authenticated too) and
 * whether the SYN offered timestamps. key is the parity of the key
 * generation that made the cookie. wscale 15 means the client sent no
 * window scale option. MSS indexes the table in syncookie.h.
 *
 * When the SYN offers timestamps, moat's TSval is the millisecond clock
 * plus a per-connection offset (bits 40-63 of the same hash, so TSval says
 * nothing about uptime) with its low 8 bits replaced by hash bits 32-39;
 * the ACK must echo them in TSecr, so a forged ACK with timestamps must
 * guess 30 bits, not 22. */
enum syn_cookie_bits {
	SYN_COOKIE_WSCALE_MASK = 0xf,
	SYN_COOKIE_NO_WSCALE = 0xf,
	SYN_COOKIE_MSS_SHIFT = 4,
	SYN_COOKIE_MSS_MASK = 0x7,
	SYN_COOKIE_SACK = 1 << 7,
	SYN_COOKIE_ECN = 1 << 8,
	SYN_COOKIE_KEY = 1 << 9,
	SYN_COOKIE_META_MASK = 0x3ff,
	SYN_COOKIE_MSS_ENTRIES = 8,
	/* Hashed with the meta bits but not carried in the cookie: the SYN
	 * offered timestamps, so the ACK must carry them too. */
	SYN_COOKIE_MSG_TS = 1 << 16,
	SYN_TS_HASH_MASK = 0xff, /* TSval bits that carry hash bits */
	SYN_TS_HASH_SHIFT = 32,  /* where in the 64-bit hash they come from */
	SYN_TS_OFFSET_SHIFT = 32, /* the TSval offset: the hash's top 32 bits */
};

/* What moat does with SYNs to a port. */
enum syn_mode {
	SYN_MODE_OFF = 0,    /* not protected: nothing is counted */
	SYN_MODE_NEVER = 1,  /* counted, SYNs always go to the kernel */
	SYN_MODE_ALWAYS = 2, /* every SYN answered with a moat cookie */
	SYN_MODE_AUTO = 3,   /* cookies only while a SYN flood is detected */
};

/* Element of syn_ports, indexed by TCP destination port (host order). The
 * control plane writes mode and window_threshold; the data path keeps the
 * flood fields. */
struct syn_port {
	__u8 mode;     /* enum syn_mode */
	__u8 flooding; /* auto mode: cookies are being issued */
	/* The port's slot in syn_counters, 1 to MAX_SYN_PORTS; 0: none, and
	 * the data path leaves the port alone. */
	__u16 slot;
	__u32 window_threshold; /* SYNs per CPU per SYN_WINDOW_NS that mean a flood */
	__u64 last_flood_ns;    /* last time a CPU saw its window go over the threshold */
	__u64 last_change_ns;   /* last time flooding changed */
	/* last_flood_ns plus the hold time: flooding is only cleared by the
	 * next SYN, so readers compare this with the clock instead. */
	__u64 flood_until_ns;
};

/* What a listener's window scale depends on, as logarithms (floor of
 * log2; clamp 0: not read): the window its handshake may grow to (the
 * larger of its buffer's window and the namespace's tcp_rmem[2]) and its
 * window clamp (TCP_WINDOW_CLAMP; with SO_RCVBUF set, no more than its
 * buffer's window; else the largest window a scale can announce). */
struct syn_scale_logs {
	__u8 space;
	__u8 clamp;
};

/* Per CPU and per protected port (key: the port's slot). The window and
 * clock fields belong to the data path and are not counters. */
struct syn_port_stats {
	__u64 syns;             /* SYNs seen (no ACK flag) */
	__u64 cookies_issued;   /* SYN-ACKs sent with XDP_TX */
	__u64 cookies_accepted; /* handshakes handed to the kernel by tc while
				 * the listener's accept queue had room (the
				 * others: accept_queue_full, at the end) */
	__u64 cookies_rejected; /* cookie mode: ACKs to a listener whose cookie,
				 * moat's or the kernel's, is not valid (dropped) */
	__u64 acks_dropped;     /* cookie mode: ACKs with no socket dropped: those
				 * of cookies_rejected, and ones whose headers are
				 * too long to check (over SYN_L4_MASK bytes) */
	__u64 accept_errors;    /* valid cookie, but bpf_sk_assign_tcp_reqsk failed */
	__u64 syns_dropped;     /* cookie mode: SYNs moat will not answer (data, FIN/RST,
				 * IP options or extension headers, fragments,
				 * non-unicast or martian addresses), dropped */
	__u64 stale_key_syns;   /* SYNs left to the kernel because the key rotation is
				 * overdue (see syn_config.rotation_period_ns) */
	__u64 syns_passed;      /* cookie mode: SYNs left to the kernel (no listener
				 * here, a time-wait, request or established socket
				 * owns the tuple, a destination this host routes
				 * on, no key or stale keys (these also in
				 * stale_key_syns), an MPTCP listener (these also
				 * in mptcp_syns), NAT in the listener's namespace
				 * (these also in nat_syns), a SYN signed with TCP-MD5 or
				 * TCP-AO for a listener with keys, double VLAN
				 * tags, a frame moat could not rewrite) */
	__u64 win_start_ns;
	__u64 win_syns;
	/* The SYN path's clock (syn_clock): CLOCK_BOOTTIME as read at the
	 * first SYN of the jiffy clock_jiffies, reused for the rest of it. */
	__u64 clock_jiffies;
	__u64 clock_ns;
	/* syn_net_settings of the listener's namespace as last read on this
	 * CPU, and the jiffy and device it was read for; beside the clock,
	 * in the cache line every answered SYN touches. */
	__u64 net_jiffies;
	__u32 net_ifindex;
	__u32 net_settings;
	/* syn_dest_local's last answer on this CPU: the destination (family
	 * 4 or 6, address) and the device it came in on (forwarding and
	 * policy routing are per device), the jiffy it was asked in, and
	 * whether the kernel delivers packets for it here (1) or routes them
	 * on (0). */
	__u8 local_addr[16];
	__u64 local_jiffies;
	__u8 local_family;
	__u8 local;
	/* The logarithms of the window scale of the listener syn_sock_state
	 * last found (below, with it). */
	struct syn_scale_logs listener_scale;
	__u32 local_ifindex;
	/* That listener's receive space for a handshake: its receive
	 * buffer's window, or its window clamp if lower. Rounded down to the
	 * MSS, and no more than 65535, it is the SYN-ACK's window, as the
	 * kernel's would be. */
	__u32 listener_space;
	/* The first census generation whose pass saw this port protected
	 * (syn_census.generation + 1 when the control plane cleared the
	 * slot): until the census floor reaches it, the port's sockets may
	 * be unmarked and every SYN pays the socket lookup. */
	__u32 census_from;
	/* The listener syn_sock_state last found on this CPU, in the jiffy
	 * and on the device of net_jiffies and net_ifindex: the family and
	 * destination it was asked for, and whether it is bound to the
	 * wildcard address. Within that jiffy a SYN to the same destination
	 * whose tuple no socket census marks (syn_tuple_marked) takes it
	 * without a socket lookup. */
	__u8 listener_addr[16];
	__u8 listener_family;
	__u8 listener_wild;
	/* The MSS that listener announces on this device: the device's MTU
	 * less the IP and TCP headers, or the listener's TCP_MAXSEG if lower. */
	__u16 listener_mss;
	/* The arguments of that FIB lookup (struct bpf_fib_lookup), kept here
	 * rather than on the BPF stack, which the SYN path has little of. */
	__u8 fib[64];
	/* Whether that listener is MPTCP (syn_listener_mptcp): its SYNs go
	 * to the kernel. In what was padding. */
	__u8 listener_mptcp;
	/* And whether it holds TCP-MD5 or TCP-AO keys (syn_listener_signs):
	 * its signed SYNs go to the kernel. */
	__u8 listener_signs;
	/* And the IP header its SYN-ACK would carry: the hop limit (TTL)
	 * and the DS field (TOS or traffic class, ECN bits clear) that the
	 * kernel's own SYN-ACK takes from the listener (IP_TTL, IP_TOS,
	 * IPV6_UNICAST_HOPS, IPV6_TCLASS) or, where it set none, from the
	 * namespace (ip_default_ttl) or the device (conf.DEV.hop_limit)
	 * (syn_listener_ttl, syn_listener_tos). In what was padding. */
	__u8 listener_ttl;
	__u8 listener_tos;
	/* Valid cookie ACKs handed to the kernel while the listener's accept
	 * queue was full: the stack drops the connection the request socket
	 * would make (its ListenOverflows) and the client sends again; not in
	 * cookies_accepted. tc's view as the ACK passes: tc sees a whole
	 * receive batch before the stack takes any of it in, so the split
	 * may differ from the stack's; the sum of the two is exact. Here
	 * rather than with the counters above, whose place older layouts
	 * share (carrySynCounters); counters added later go after it, and
	 * nothing else does. */
	__u64 accept_queue_full;
	/* cookie mode: SYNs left to the kernel because the listener is
	 * MPTCP (syn_listener_mptcp); also in syns_passed. */
	__u64 mptcp_syns;
	/* cookie mode: RSTs sent for stray ACKs (syn_reset_stray); those
	 * ACKs are also in acks_dropped. */
	__u64 resets_sent;
	/* cookie mode: SYNs left to the kernel because NAT runs for their
	 * address family in the listener's namespace (SYN_NET_NAT4): it
	 * would drop the request socket of a moat handshake. Also in
	 * syns_passed. */
	__u64 nat_syns;
};

/* The budget of stray-ACK resets, per CPU and interface: credit of time
 * that each RST spends 1e9 / rate ns of, up to a second's worth. */
struct syn_rst_bucket {
	__u64 stamp_ns;
	__u64 credit_ns;
};

/* One SipHash key. The two slots of syn_keys hold the keys of the current
 * generation (slot generation & 1) and the one before it. */
struct syn_key {
	__u64 k0;
	__u64 k1;
};

/* Rotation state, written by the control plane after the new key. */
struct syn_key_state {
	__u64 generation; /* number of rotations; 0: no key yet, no cookies */
	__u64 rotated_ns; /* CLOCK_BOOTTIME of the last rotation */
};

/* Settings of the SYN defence that may change at run time; zero fields
 * take the SYN_DEFAULT_* values. */
struct syn_config {
	__u64 hold_ns;          /* auto mode: stay in cookie mode this long after the flood */
	__u64 cookie_lifetime_ns; /* tc stops looking for cookies this long after a flood */
	__u16 mss_v4;           /* MSS moat announces in its SYN-ACK */
	__u16 mss_v6;
	__u8 rcv_wscale;        /* window scale moat announces (and the kernel then
				 * uses); 0: the kernel's choice for the listener */
	/* floor(log2(net.core.rmem_max)), a global sysctl the data path
	 * cannot read; the kernel's window scale depends on it. */
	__u8 rmem_max_log2;
	/* RSTs a second, per CPU and interface, that cookie mode sends for
	 * the ACKs it drops as stray (syn_reset_stray); 0: the default,
	 * SYN_RST_OFF: none. */
	__u16 rst_rate;
	/* How often the control plane rotates keys. Once the last rotation is
	 * older than 2.5 of these (SYN_STALE_HALF_PERIODS), the rotator is taken for dead:
	 * moat issues and accepts no more cookies and the kernel handles SYNs. */
	__u64 rotation_period_ns;
};

/* Slots of the socket census: 2^17 of 4 bits, 64 KiB. A random SYN reads
 * one slot: a table of 32-bit generations (512 KiB) missed the cache there
 * under a flood, one load that took 4% of a CPU answering SYNs with the
 * generator beside it and 8% of one answering them on its own (perf over
 * moat-bench). */
#define SYN_CENSUS_BITS 17
#define SYN_CENSUS_SLOTS (1 << SYN_CENSUS_BITS)

/* The socket census: which tuples of protected ports may belong to a
 * socket other than the listener (established, request, time-wait), so
 * that a SYN or ACK whose tuple none may own skips the socket lookup.
 *
 * A tuple hashes to a slot (syn_census_slot) of 4 bits, one for each
 * generation modulo 4: a slot marked in generation g has bit g % 4 set
 * (syn_census_mark). Marks come from the census pass, a socket iterator
 * the control plane runs every second or so over every TCP socket of the
 * namespace, and, between passes, from the data path where a socket is
 * born: a SYN left to the kernel (XDP) and a cookie handshake accepted
 * (tc). A pass raises generation, then marks; when it is done, floor
 * becomes the generation before its own, as events may still have written
 * that one, and the control plane clears, in every slot, the bits of
 * generation floor - 1 modulo 4 (and of floor - 2, the next pass's, when
 * the pass before did not complete): they can only hold marks older than
 * floor. A pass that finds the generation raised by another process when
 * it is done neither sets floor nor clears. So a slot with any bit set
 * may belong to a socket, and one with none cannot: its tuple has none.
 * Marks of generations below floor that are not cleared yet (passes that
 * failed) and collisions only cost lookups.
 *
 * floor 0 (no full pass yet, a fresh map) or a clock past valid_until_ns
 * (the control plane stopped counting) means no slot can be trusted and
 * every packet pays the lookup, as without the census. The control plane
 * writes the header fields one by one through mmap, never the whole
 * value, and clears bits with atomic ANDs, so the data path's marks
 * (atomic ORs) are never lost. */
struct syn_census_table {
	__u32 generation;      /* raised at the start of each pass */
	__u32 floor;           /* lowest generation that still marks a socket; 0: none trusted */
	__u64 valid_until_ns;  /* CLOCK_BOOTTIME past which floor is not trusted */
	__u64 sockets;         /* sockets the pass running or last run marked */
	__u64 passes;          /* complete passes */
	/* slot s: bits 4 * (s % 16) to 4 * (s % 16) + 3 of marks[s / 16] */
	__u64 marks[SYN_CENSUS_SLOTS / 16];
};

/* A cookie handshake whose third ACK (moat's cookie or the kernel's) was
 * just found valid, kept in syn_recent at a slot of its tuple (the census
 * slot's low SYN_RECENT_BITS bits).
 *
 * A client sends its first data right behind that ACK (a request, the
 * second segment of a ClientHello that post-quantum key shares make
 * longer than one), and a NIC hands such a run of frames over in one poll:
 * XDP judges all of them, and tc sees all of them, before the stack has
 * made the socket from the ACK. A segment behind the first carries no
 * cookie moat can check (its sequence number is past the client's ISN);
 * the first data segment carries the same one as the ACK. So XDP lets a
 * segment of the tuple through that acknowledges the cookie just
 * validated, from within a window of the sequence number that validated
 * it, and tc hands the stack one request socket per handshake (a second
 * one for the same tuple would be refused, and its segment with it). Only
 * who saw the SYN-ACK knows the cookie, and the entry holds the whole
 * tuple: a forged ACK matches no entry. */
struct syn_recent {
	__u8 saddr[16];   /* the client's address, as struct packet holds it */
	__u8 daddr[16];
	__u16 sport;      /* host order */
	__u16 dport;
	__be32 ack_seq;   /* the validated ACK's acknowledgement number: the cookie + 1 */
	__u32 seq;        /* its sequence number: the client's ISN + 1 */
	__u32 stamp;      /* when, CLOCK_BOOTTIME >> SYN_RECENT_UNIT_SHIFT */
	__u32 assigned;   /* 1 once tc assigned the handshake its request socket */
};

/* 16384 slots of 52 bytes: 832 KiB. The handshakes of 100 ms rarely meet
 * in one; when two do, the later one wins and the earlier one's segments
 * are judged one by one, as without the table. */
#define SYN_RECENT_BITS 14
#define SYN_RECENT_SLOTS (1 << SYN_RECENT_BITS)
/* Stamps count units of 2^20 ns (about a millisecond); an entry covers
 * segments for SYN_RECENT_UNITS of them (about 100 ms): the poll and the
 * stack's handling of it take far less, and a segment sent again after a
 * loss finds the socket made by then, or is the kernel's to answer. */
#define SYN_RECENT_UNIT_SHIFT 20
#define SYN_RECENT_UNITS 96
/* The furthest a following segment may start past the validated one: the
 * largest window a TCP receiver can offer (65535 << 14). */
#define SYN_RECENT_SEQ_SPAN (65535U << 14)

/* What a cookie's message holds after the addresses, in both families. */
struct syn_cookie_msg_tail {
	__be16 sport;   /* the client's port, network order */
	__be16 dport;
	__be32 client_isn; /* network order */
	__u32 meta;     /* the cookie's low 10 bits, | SYN_COOKIE_MSG_TS */
};

/* The message SipHash authenticates for IPv6, 44 bytes: 5 words, and meta
 * in the last block with the length. */
struct syn_cookie_msg {
	__u8 saddr[16]; /* the client's address */
	__u8 daddr[16]; /* ours */
	struct syn_cookie_msg_tail tail;
};

/* The same for IPv4, 20 bytes: 2 words, and meta in the last block. SipHash
 * puts the length in its last block, so no IPv4 message hashes like an
 * IPv6 one. */
struct syn_cookie_msg_v4 {
	__u8 saddr[4];
	__u8 daddr[4];
	struct syn_cookie_msg_tail tail;
};

_Static_assert(sizeof(struct syn_cookie_msg_v4) == 20 && sizeof(struct syn_cookie_msg) == 44,
	       "cookie messages are whole words and the 4 bytes of meta");

/* The arguments of syn_set_census_from (moat.bpf.c): set census_from to
 * from in slot's syn_port_stats on CPUs 0 to cpus - 1; done comes back as
 * the number of CPUs set. */
struct syn_census_from_args {
	__u32 slot;
	__u32 from;
	__u32 cpus;
	__u32 done;
};

#endif /* MOAT_SYN_STRUCTS_H */
