/* SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause */
/* SYN flood defence. The XDP side answers SYNs to a local listener on a
 * protected port with a SYN-ACK that carries a moat cookie (syn_defend) and
 * drops ACKs that reach only the listener and carry no valid cookie,
 * moat's or the kernel's; the tc side (syn_accept)
 * turns a valid cookie ACK into a request socket with bpf_sk_assign_tcp_reqsk
 * so the kernel creates the connection with the options the client sent.
 *
 * Policy order: this runs after the allow/deny lists and port drop rules.
 * Allowlisted sources are trusted and bypass it (their SYNs go to the
 * kernel); a port "allow" rule does not turn protection off, only
 * `moat syn protect --mode never` or unprotecting the port does. */
#ifndef MOAT_SYNCOOKIE_H
#define MOAT_SYNCOOKIE_H

#include <linux/bpf.h>
#include <linux/pkt_cls.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>
#include <bpf/bpf_core_read.h>

#include "parsing.h"
#include "siphash.h"
#include "syn_structs.h"
#include "syn_maps.h"
#include "tcp_options.h"

/* syn_defend's "no decision, carry on with the policy". */
#define SYN_CONTINUE -1
/* syn_defend's "the frame is now a RST to send back" (XDP_TX), which the
 * caller counts apart from SYN-ACKs. */
#define SYN_RESET -2
/* syn_check_ack's "no socket and no cookie": syn_defend asks
 * syn_reset_stray what becomes of it. */
#define SYN_STRAY -3
/* tcx: "not mine to decide", the next program in the chain (and legacy tc
 * filters after them) runs. TC_ACT_OK would end the chain. */
#define SYN_TC_NEXT TC_ACT_UNSPEC

#define TCPF_FIN 0x01
#define TCPF_SYN 0x02
#define TCPF_RST 0x04
#define TCPF_ACK 0x10
#define TCPF_ECE 0x40
#define TCPF_CWR 0x80

/* Only plain headers are answered: IPv4 without options and IPv6 without
 * extension headers. In cookie mode anything else is dropped, or a flood
 * of such SYNs would reach the kernel at its own rate. */
#define SYN_MAX_L3_OFF (14 + 4 * MAX_VLAN_DEPTH)
/* An ACK's TCP header may sit behind IP options or IPv6 extension headers;
 * its offset is masked with this so the verifier sees it bounded. A larger
 * offset (a kilobyte of extension headers) is not a handshake moat takes. */
#define SYN_L4_MASK 0x3ff
/* The longest headers a handshake moat takes has: its TCP header, with
 * options, at up to SYN_L4_MASK (two tags, IPv4 options or IPv6 extension
 * headers before it). tc pulls this much into the linear area when the
 * headers are not there. */
#define SYN_PULL_LEN (SYN_L4_MASK + 60)
#define SYNACK_TCP_LEN 40 /* 20 bytes of header, 20 of options at most */
#define IPV6_MIN_MSS 1220 /* IPv6 minimum MTU 1280 - 60 */
#define IPV4_MIN_MSS 536

/* The few fields of the kernel's own types that moat reads to learn the
 * TCP settings of a listener's namespace. Offsets come from the running
 * kernel's BTF when the program loads (CO-RE), so they follow its layout. */
struct netns_ipv4___moat {
	__u8 sysctl_tcp_ecn;
	__u8 sysctl_tcp_syncookies;
	__u8 sysctl_tcp_sack;
	__u8 sysctl_tcp_window_scaling;
	__u8 sysctl_tcp_timestamps;
	int sysctl_tcp_rmem[3];
	/* What the kernel's SYN-ACK takes from the namespace: the TTL of a
	 * listener without IP_TTL, and whether the SYN's DS field is
	 * reflected (tcp_reflect_tos). */
	__u8 sysctl_ip_default_ttl;
	__u8 sysctl_tcp_reflect_tos;
} __attribute__((preserve_access_index));

/* The IPv6 flow label settings of a namespace (net.ipv6.auto_flowlabels,
 * flowlabel_reflect, flowlabel_state_ranges): the kernel's SYN-ACK
 * carries the SYN's label where new listeners reflect it, else a label
 * of its own where auto labels are on. */
struct netns_sysctl_ipv6___moat {
	__u8 auto_flowlabels;
	__u8 flowlabel_state_ranges;
	int flowlabel_reflect;
} __attribute__((preserve_access_index));

struct netns_ipv6___moat {
	struct netns_sysctl_ipv6___moat sysctl;
} __attribute__((preserve_access_index));

/* The netfilter hooks of a namespace (struct netns_nf), as far as moat
 * reads them to learn whether NAT runs at LOCAL_IN (syn_net_nat). A hook
 * list (struct nf_hook_entries) holds its entries, then, in a trailer, a
 * pointer to each one's registration (struct nf_hook_ops), in the same
 * order: by priority. */
struct nf_hook_entry___moat {
	void *hook;
	void *priv;
} __attribute__((preserve_access_index));

struct nf_hook_entries___moat {
	__u16 num_hook_entries;
	struct nf_hook_entry___moat hooks[];
} __attribute__((preserve_access_index));

enum nf_hook_ops_type___moat {
	NF_HOOK_OP_UNDEFINED___moat = 0, /* a hook of the kernel's own */
	NF_HOOK_OP_NF_TABLES___moat = 1, /* an nftables chain */
};

struct nf_hook_ops___moat {
	__u8 pf;
	/* An enum, as the kernel's: CO-RE takes no int for it. */
	enum nf_hook_ops_type___moat hook_ops_type : 8;
	unsigned int hooknum;
	int priority;
} __attribute__((preserve_access_index));

struct netns_nf___moat {
	struct nf_hook_entries___moat *hooks_ipv4[5]; /* NF_INET_NUMHOOKS */
	struct nf_hook_entries___moat *hooks_ipv6[5];
} __attribute__((preserve_access_index));

struct net___moat {
	struct netns_ipv4___moat ipv4;
	struct netns_nf___moat nf; /* absent without CONFIG_NETFILTER */
	struct netns_ipv6___moat ipv6; /* absent without CONFIG_IPV6 */
} __attribute__((preserve_access_index));

/* What the kernel's SYN-ACK takes from a listener's IP layer: its hop
 * limit (IP_TTL, IPV6_UNICAST_HOPS; -1: none set) and DS field (IP_TOS,
 * IPV6_TCLASS). Read with plain loads through the listener, which take
 * no stack: the SYN path has none to spare. */
struct ipv6_pinfo___moat {
	__s16 hop_limit;
	__u8 tclass;
} __attribute__((preserve_access_index));

struct inet_sock___moat {
	struct ipv6_pinfo___moat *pinet6;
	__s16 uc_ttl;
	__u8 tos;
	unsigned long inet_flags; /* Linux 6.6 and later; the bits below from 6.7 */
} __attribute__((preserve_access_index));

/* The numbers of three bits of inet_flags, the socket's own choices of
 * IPv6 flow label: REPFLOW (reflect the peer's label: flowlabel_reflect
 * bit 0 when the socket was made, or IPV6_FL_F_REFLECT), AUTOFLOWLABEL
 * and AUTOFLOWLABEL_SET (IPV6_AUTOFLOWLABEL, where the socket set it).
 * They name members of an anonymous enum (INET_FLAGS_*), which CO-RE
 * cannot relocate: the loader reads them from the kernel's BTF
 * (datapath.SetKernelConstants). 0xff: not known, and the namespace's
 * sysctls stand for the listener's choices, as they do for a listener
 * that made none since they last changed. */
volatile const __u8 inet_flag_repflow = 0xff;
volatile const __u8 inet_flag_autoflowlabel = 0xff;
volatile const __u8 inet_flag_autoflowlabel_set = 0xff;

/* The device an XDP frame came in on (bpf_cast_to_kern_ctx), as far as
 * its IPv6 hop limit (net.ipv6.conf.DEV.hop_limit, which router
 * advertisements also set): the kernel's SYN-ACK of a listener without
 * IPV6_UNICAST_HOPS carries it (ip6_dst_hoplimit). */
struct ipv6_devconf___moat {
	__s32 hop_limit;
	__s32 forwarding; /* net.ipv6.conf.DEV.forwarding */
} __attribute__((preserve_access_index));

struct inet6_dev___moat {
	struct ipv6_devconf___moat cnf;
} __attribute__((preserve_access_index));

struct possible_net_t___moat {
	struct net___moat *net;
} __attribute__((preserve_access_index));

struct net_device___moat {
	struct inet6_dev___moat *ip6_ptr;
	struct possible_net_t___moat nd_net; /* its namespace's settings */
} __attribute__((preserve_access_index));

struct xdp_rxq_info___moat {
	struct net_device___moat *dev;
} __attribute__((preserve_access_index));

struct xdp_buff___moat {
	struct xdp_rxq_info___moat *rxq;
} __attribute__((preserve_access_index));

extern void *bpf_cast_to_kern_ctx(void *obj) __ksym;

/* What the SYN path reads of a listener: its TCP_MAXSEG (user_mss), its
 * window clamp, its receive buffer, and the share of a buffer's bytes the
 * kernel reckons as window (scaling_ratio, in 256ths; kernels before 6.7
 * had none and offered half). */
struct tcp_options_received___moat {
	__u16 user_mss;
} __attribute__((preserve_access_index));

struct sock___moat {
	int sk_rcvbuf;
	__u8 sk_userlocks;
	__u32 sk_ack_backlog;
	__u32 sk_max_ack_backlog;
} __attribute__((preserve_access_index));

struct tcp_sock___moat {
	struct tcp_options_received___moat rx_opt;
	__u32 window_clamp;
	__u8 scaling_ratio;
	__u8 is_mptcp; /* absent from kernels built without MPTCP */
	/* Keys for TCP-MD5 and TCP-AO: absent without CONFIG_TCP_MD5SIG,
	 * CONFIG_TCP_AO. */
	void *md5sig_info;
	void *ao_info;
} __attribute__((preserve_access_index));

/* Also what the socket census reads of any socket (full, request or
 * time-wait): its tuple, family and state. */
struct sock_common___moat {
	__be32 skc_daddr;
	__be32 skc_rcv_saddr;
	__be16 skc_dport;
	__u16 skc_num;
	unsigned short skc_family;
	volatile unsigned char skc_state;
	struct in6_addr skc_v6_daddr;
	struct in6_addr skc_v6_rcv_saddr;
	struct possible_net_t___moat skc_net;
} __attribute__((preserve_access_index));

/* The settings of a namespace (net.ipv4.*) that decide what a cookie
 * handshake may keep. bpf_sk_assign_tcp_reqsk refuses window scaling,
 * SACK or timestamps that the namespace turned off, and the stack takes
 * no request socket at all with tcp_syncookies 0; so moat offers only
 * what is on, as the kernel's own SYN-ACKs do. */
enum syn_net_setting {
	SYN_NET_COOKIES = 1 << 0, /* tcp_syncookies != 0 */
	SYN_NET_SACK = 1 << 1,    /* tcp_sack */
	SYN_NET_TS = 1 << 2,      /* tcp_timestamps (1 or 2) */
	SYN_NET_WSCALE = 1 << 3,  /* tcp_window_scaling */
	SYN_NET_ECN = 1 << 4,     /* tcp_ecn != 0: ECN for clients that ask */
	/* NAT's LOCAL_IN hook runs for IPv4 (IPv6) packets: it orphans a
	 * packet whose socket's remote port differs from the connection's
	 * (nf_nat_ipv4_local_in, against early demux finding a socket for a
	 * tuple SNAT then changed), and the request socket that
	 * bpf_sk_assign_tcp_reqsk hands over has no ports yet: the kernel
	 * would drop it and reset the client. Such a namespace's SYNs are the
	 * kernel's (syn_answer). */
	SYN_NET_NAT4 = 1 << 5,
	SYN_NET_NAT6 = 1 << 6,
	/* The SYN-ACK's IP header, as the kernel's: the SYN's DS field
	 * reflected (tcp_reflect_tos); the SYN's IPv6 flow label reflected
	 * (flowlabel_reflect bit 0, which new listeners take on); or, where
	 * not, a flow label of moat's own (auto_flowlabels 1 or 3), with
	 * its top bit set under flowlabel_state_ranges. */
	SYN_NET_REFLECT_TOS = 1 << 7,
	SYN_NET_FLOW_REFLECT = 1 << 8,
	SYN_NET_FLOW_AUTO = 1 << 9,
	SYN_NET_FLOW_STATELESS = 1 << 10,
	/* auto_flowlabels 3: auto labels whatever a socket chose; 0: none
	 * whatever it chose. */
	SYN_NET_FLOW_FORCED = 1 << 11,
	SYN_NET_FLOW_OFF = 1 << 12,
	/* flowlabel_reflect bit 1 (FLOWLABEL_REFLECT_TCP_RESET): a RST of no
	 * socket carries the segment's label. */
	SYN_NET_FLOW_REFLECT_RESET = 1 << 13,
	/* Not the namespace's but the listener's (syn_listener_flow), set
	 * with the listener: it reflects labels (on its SYN-ACKs and RSTs),
	 * and its SYN-ACKs carry auto labels. */
	SYN_NET_LISTENER_REFLECT = 1 << 14,
	SYN_NET_LISTENER_AUTO = 1 << 15,
};

#define SYN_NF_INET_LOCAL_IN 1
#define SYN_NFPROTO_IPV4 2
#define SYN_NFPROTO_IPV6 10
/* NF_IP_PRI_NAT_SRC and NF_IP6_PRI_NAT_SRC: NAT's LOCAL_IN hook. */
#define SYN_NF_PRI_NAT_SRC 100
/* Hooks of a list looked at, in priority order: conntrack's, the tables
 * of iptables and nftables (the input chains of a host of firewalld,
 * Docker and Kubernetes come to a handful), NAT's. A list with more ahead
 * of NAT's priority is taken for one where NAT runs. */
#define SYN_NAT_MAX_HOOKS 16

/* Whether NAT's LOCAL_IN hook is in hook list e (a kernel pointer, read
 * with probes) of protocol family pf: the kernel registers it, whatever
 * front end asked for NAT (iptables, nftables of any family), as a hook of
 * its own at NAT_SRC priority, which no nftables chain (NF_TABLES) nor
 * IPVS (98 and 99) is. Recognised by its registration rather than its
 * function's address, which a module loaded later would change. 1 too
 * where it cannot tell. */
static __always_inline int syn_nf_nat_hooked(__u64 e, __u8 pf)
{
	__u64 trailer;
	__u16 n = 0;
	int i;

	if (!e)
		return 0;
	if (bpf_probe_read_kernel(&n, sizeof(n), (void *)(e + bpf_core_field_offset(struct nf_hook_entries___moat,
										       num_hook_entries))))
		return 1;
	trailer = e + bpf_core_field_offset(struct nf_hook_entries___moat, hooks) +
		  (__u64)n * bpf_core_type_size(struct nf_hook_entry___moat);
	for (i = 0; i < SYN_NAT_MAX_HOOKS; i++) {
		const struct nf_hook_ops___moat *ops = NULL;
		int prio;

		if (i >= n)
			return 0;
		if (bpf_probe_read_kernel(&ops, sizeof(ops), (void *)(trailer + i * sizeof(ops))) || !ops)
			return 1;
		prio = BPF_CORE_READ(ops, priority);
		if (prio > SYN_NF_PRI_NAT_SRC)
			return 0; /* in priority order: none after */
		if (prio == SYN_NF_PRI_NAT_SRC && BPF_CORE_READ(ops, hooknum) == SYN_NF_INET_LOCAL_IN &&
		    BPF_CORE_READ(ops, pf) == pf &&
		    (!bpf_core_field_exists(ops->hook_ops_type) ||
		     BPF_CORE_READ_BITFIELD_PROBED(ops, hook_ops_type) == NF_HOOK_OP_UNDEFINED___moat))
			return 1;
	}
	return 1; /* more hooks ahead of NAT's priority than looked at */
}

/* The SYN_NET_NAT bit of an address family (4 or 6). */
static __always_inline __u32 syn_net_nat_bit(int family)
{
	return family == 4 ? SYN_NET_NAT4 : SYN_NET_NAT6;
}

/* SYN_NET_NAT4 and SYN_NET_NAT6 of namespace net (a struct net * as a
 * number). A global function: the verifier walks its loops once, not on
 * every path of the tc program that leads to it. */
__attribute__((noinline)) int syn_net_nat(__u64 net)
{
	__u64 e = 0;
	int s = 0;

	if (!net || !bpf_core_field_exists(struct net___moat, nf))
		return 0;
	/* One list at a time, through one slot: this function's stack is
	 * the last of the SYN path's chain of calls, which has none to spare. */
	if (bpf_probe_read_kernel(&e, sizeof(e),
				  (void *)(net + bpf_core_field_offset(struct net___moat, nf.hooks_ipv4[SYN_NF_INET_LOCAL_IN]))))
		return SYN_NET_NAT4 | SYN_NET_NAT6;
	if (syn_nf_nat_hooked(e, SYN_NFPROTO_IPV4))
		s |= SYN_NET_NAT4;
	if (bpf_probe_read_kernel(&e, sizeof(e),
				  (void *)(net + bpf_core_field_offset(struct net___moat, nf.hooks_ipv6[SYN_NF_INET_LOCAL_IN]))))
		return SYN_NET_NAT4 | SYN_NET_NAT6;
	if (syn_nf_nat_hooked(e, SYN_NFPROTO_IPV6))
		s |= SYN_NET_NAT6;
	return s;
}

/* SYN_NET_NAT4 and SYN_NET_NAT6 of the namespace tsk (a listener) lives
 * in. */
static __always_inline __u32 syn_listener_nat(const struct tcp_sock *tsk)
{
	const struct sock_common___moat *skc = (const void *)tsk;
	__u64 netp = 0;

	if (!skc || !bpf_core_field_exists(skc->skc_net.net))
		return 0;
	/* The pointer read as a number: syn_net_nat takes one. */
	if (bpf_probe_read_kernel(&netp, sizeof(netp), &skc->skc_net.net))
		return SYN_NET_NAT4 | SYN_NET_NAT6;
	return syn_net_nat(netp);
}

/* syn_net_setting bits of the namespace tsk (a listener) lives in. */
static __always_inline __u32 syn_net_settings(const struct tcp_sock *tsk)
{
	const struct sock_common___moat *skc = (const void *)tsk;
	const struct net___moat *net;
	__u32 s = 0;

	if (!skc)
		return 0;
	/* A kernel without network namespaces has one set of settings and
	 * no pointer to it here: every option is taken for on. */
	if (!bpf_core_field_exists(skc->skc_net.net))
		return SYN_NET_COOKIES | SYN_NET_SACK | SYN_NET_TS | SYN_NET_WSCALE | SYN_NET_ECN;
	net = skc->skc_net.net;
	if (!net)
		return 0;
	if (net->ipv4.sysctl_tcp_syncookies)
		s |= SYN_NET_COOKIES;
	if (net->ipv4.sysctl_tcp_sack)
		s |= SYN_NET_SACK;
	if (net->ipv4.sysctl_tcp_timestamps)
		s |= SYN_NET_TS;
	if (net->ipv4.sysctl_tcp_window_scaling)
		s |= SYN_NET_WSCALE;
	if (net->ipv4.sysctl_tcp_ecn)
		s |= SYN_NET_ECN;
	if (bpf_core_field_exists(net->ipv4.sysctl_tcp_reflect_tos) && net->ipv4.sysctl_tcp_reflect_tos)
		s |= SYN_NET_REFLECT_TOS;
	if (bpf_core_field_exists(net->ipv6)) {
		if (net->ipv6.sysctl.flowlabel_reflect & 1) /* FLOWLABEL_REFLECT_ESTABLISHED */
			s |= SYN_NET_FLOW_REFLECT;
		if (net->ipv6.sysctl.flowlabel_reflect & 2) /* FLOWLABEL_REFLECT_TCP_RESET */
			s |= SYN_NET_FLOW_REFLECT_RESET;
		/* IP6_AUTO_FLOW_LABEL_OPTOUT and _FORCED: on for a socket
		 * that did not opt out (syn_listener_flow looks). */
		if (net->ipv6.sysctl.auto_flowlabels == 1 || net->ipv6.sysctl.auto_flowlabels == 3)
			s |= SYN_NET_FLOW_AUTO;
		if (net->ipv6.sysctl.auto_flowlabels == 3)
			s |= SYN_NET_FLOW_FORCED;
		if (net->ipv6.sysctl.auto_flowlabels == 0)
			s |= SYN_NET_FLOW_OFF;
		if (net->ipv6.sysctl.flowlabel_state_ranges)
			s |= SYN_NET_FLOW_STATELESS;
	}
	return s | syn_listener_nat(tsk);
}

/* The hop limit of what the kernel sends from a socket that sets none
 * (ip_select_ttl, ip6_dst_hoplimit), as for its RSTs, which leave through
 * the namespace's control socket: the namespace's ip_default_ttl (IPv4),
 * or the hop limit of the device the packet came in by and its answer
 * leaves by (IPv6). A route's hoplimit metric is not looked at. 0 if it
 * cannot be read. */
static __always_inline __u8 syn_default_ttl(struct xdp_md *ctx, int family)
{
	struct xdp_buff___moat *xdp = bpf_cast_to_kern_ctx(ctx);
	struct net_device___moat *dev;
	long ttl;

	if (!xdp || !xdp->rxq || !xdp->rxq->dev)
		return 0;
	dev = xdp->rxq->dev;
	if (family == 4) {
		if (!bpf_core_field_exists(dev->nd_net.net) || !dev->nd_net.net ||
		    !bpf_core_field_exists(dev->nd_net.net->ipv4.sysctl_ip_default_ttl))
			return 0;
		return dev->nd_net.net->ipv4.sysctl_ip_default_ttl;
	}
	if (!dev->ip6_ptr)
		return 0;
	ttl = dev->ip6_ptr->cnf.hop_limit;
	return ttl > 0 && ttl <= 255 ? ttl : 0;
}

/* The hop limit of the kernel's SYN-ACK for a listener: its IP_TTL (IPv4)
 * or IPV6_UNICAST_HOPS (IPv6), or where it set none syn_default_ttl (the
 * listener is in the device's namespace). 0 if it cannot be read: the
 * caller takes SYNACK_TTL. A GTSM peer (RFC 5082: IP_MINTTL 255) takes no
 * SYN-ACK of less than the 255 its listener set. */
static __always_inline __u8 syn_listener_ttl(struct xdp_md *ctx, const struct tcp_sock *tsk, int family)
{
	const struct inet_sock___moat *inet = (const void *)tsk;
	long ttl;

	if (!tsk)
		return 0;
	if (family == 4) {
		ttl = inet->uc_ttl;
		if (ttl > 0 && ttl <= 255)
			return ttl;
	} else if (inet->pinet6) {
		const struct ipv6_pinfo___moat *np = inet->pinet6;

		ttl = np->hop_limit;
		if (ttl > 0 && ttl <= 255)
			return ttl;
	}
	return syn_default_ttl(ctx, family);
}

/* The DS field of the kernel's SYN-ACK for a listener without
 * tcp_reflect_tos: its IP_TOS (IPv4) or IPV6_TCLASS (IPv6), whose ECN
 * bits a stream socket does not set. */
static __always_inline __u8 syn_listener_tos(const struct tcp_sock *tsk, int family)
{
	const struct inet_sock___moat *inet = (const void *)tsk;
	const struct ipv6_pinfo___moat *np;

	if (!tsk)
		return 0;
	if (family == 4)
		return inet->tos & ~3;
	np = inet->pinet6;
	if (!np)
		return 0;
	return np->tclass & ~3;
}

/* The bit of inet_flags numbered bit (inet_flag_*): 1, 0, or -1 where
 * that number or the field is not known. */
static __always_inline int syn_inet_flag(const struct inet_sock___moat *inet, __u8 bit)
{
	if (bit >= 64 || !bpf_core_field_exists(inet->inet_flags))
		return -1;
	return (inet->inet_flags >> bit) & 1;
}

/* net, a namespace's syn_net_setting bits, with the flow label choices of
 * its listener tsk: SYN_NET_LISTENER_REFLECT where the listener reflects
 * labels (its REPFLOW, taken from flowlabel_reflect when it was made: the
 * namespace's bit stands for it only where it cannot be read), and
 * SYN_NET_LISTENER_AUTO where its SYN-ACKs carry auto labels
 * (ip6_autoflowlabel: the listener's IPV6_AUTOFLOWLABEL where it set
 * one, else the namespace's; always under auto_flowlabels 3, never under
 * 0, as ip6_make_flowlabel has it). */
static __always_inline __u32 syn_listener_flow(const struct tcp_sock *tsk, __u32 net)
{
	const struct inet_sock___moat *inet = (const void *)tsk;
	int reflect = !!(net & SYN_NET_FLOW_REFLECT), autolabel = !!(net & SYN_NET_FLOW_AUTO), own;

	net &= ~(SYN_NET_LISTENER_REFLECT | SYN_NET_LISTENER_AUTO);
	if (tsk) {
		own = syn_inet_flag(inet, inet_flag_repflow);
		if (own >= 0)
			reflect = own;
		if (syn_inet_flag(inet, inet_flag_autoflowlabel_set) == 1)
			autolabel = syn_inet_flag(inet, inet_flag_autoflowlabel) == 1;
	}
	if (net & SYN_NET_FLOW_OFF)
		autolabel = 0;
	if (reflect)
		net |= SYN_NET_LISTENER_REFLECT;
	if (autolabel || (net & SYN_NET_FLOW_FORCED))
		net |= SYN_NET_LISTENER_AUTO;
	return net;
}

/* The MSS a listener sets for itself (TCP_MAXSEG), 0 for none. */
static __always_inline __u16 syn_user_mss(const struct tcp_sock *tsk)
{
	const struct tcp_sock___moat *tp = (const void *)tsk;

	return tp ? tp->rx_opt.user_mss : 0;
}

/* Whether a listener is the TCP side of an MPTCP socket (sk_is_mptcp).
 * bpf_sk_assign_tcp_reqsk refuses such a listener, and the client of the
 * handshake would be reset, so its SYNs are left to the kernel, whose own
 * SYN cookies make MPTCP connections. 0 if tsk is NULL or the kernel has
 * no MPTCP. */
static __always_inline __u8 syn_listener_mptcp(const struct tcp_sock *tsk)
{
	const struct tcp_sock___moat *tp = (const void *)tsk;

	if (!tp || !bpf_core_field_exists(tp->is_mptcp))
		return 0;
	return tp->is_mptcp ? 1 : 0;
}

/* Whether a listener holds TCP-MD5 or TCP-AO keys, so that the kernel
 * takes signed SYNs for it (it drops a signed SYN for a listener with no
 * key). 0 if tsk is NULL. */
static __always_inline __u8 syn_listener_signs(const struct tcp_sock *tsk)
{
	const struct tcp_sock___moat *tp = (const void *)tsk;

	if (!tp)
		return 0;
	if (bpf_core_field_exists(tp->md5sig_info) && tp->md5sig_info)
		return 1;
	if (bpf_core_field_exists(tp->ao_info) && tp->ao_info)
		return 1;
	return 0;
}

/* The window a listener's receive buffer holds (tcp_full_space): its
 * buffer less the share the kernel reckons as overhead (scaling_ratio, in
 * 256ths; kernels before 6.7 had none and took half). 0 if tsk is NULL. */
static __always_inline __u64 syn_full_space(const struct tcp_sock *tsk)
{
	const struct tcp_sock___moat *tp = (const void *)tsk;
	const struct sock___moat *sk = (const void *)tsk;
	int rcvbuf;

	if (!tp)
		return 0;
	rcvbuf = sk->sk_rcvbuf;
	if (rcvbuf <= 0)
		return 0;
	if (bpf_core_field_exists(tp->scaling_ratio))
		return ((__u64)rcvbuf * tp->scaling_ratio) >> 8;
	return (__u64)rcvbuf >> 1;
}

/* The receive space a listener offers a new connection, as the kernel
 * reckons it for a request socket (tcp_openreq_init_rwin: the window of
 * its receive buffer, no more than its window clamp). 0 if tsk is NULL. */
static __always_inline __u32 syn_listener_space(const struct tcp_sock *tsk)
{
	const struct tcp_sock___moat *tp = (const void *)tsk;
	__u64 space;

	if (!tp)
		return 0;
	space = syn_full_space(tsk);
	if (!space)
		return 0;
	if (tp->window_clamp && tp->window_clamp < space)
		space = tp->window_clamp;
	return space > 0xffffffff ? 0xffffffff : space;
}

/* floor(log2(v)), 0 for 0. */
static __always_inline __u8 syn_log2(__u64 v)
{
	/* Without a branch, which the verifier would follow both ways at
	 * every step: every bit below the highest set, then the count of set
	 * bits less one. v | 1 makes 0 count as 1. */
	v |= 1;
	v |= v >> 1;
	v |= v >> 2;
	v |= v >> 4;
	v |= v >> 8;
	v |= v >> 16;
	v |= v >> 32;
	v -= (v >> 1) & 0x5555555555555555ULL;
	v = (v & 0x3333333333333333ULL) + ((v >> 2) & 0x3333333333333333ULL);
	v = (v + (v >> 4)) & 0x0f0f0f0f0f0f0f0fULL;
	return ((v * 0x0101010101010101ULL) >> 56) - 1;
}

/* sk_userlocks: the owner set SO_RCVBUF (include/net/sock.h). */
#define SOCK_RCVBUF_LOCK 2

/* The logarithms a listener's window scale depends on (struct
 * syn_scale_logs). tcp_openreq_init_rwin and tcp_select_initial_window
 * reckon so; a route's window metric is not looked at, and the buffer's
 * window is taken before the kernel rounds it down to whole segments,
 * which lowers its log only when it is a power of two above tcp_rmem's
 * maximum and net.core.rmem_max (SO_RCVBUFFORCE). */
static __always_inline struct syn_scale_logs syn_listener_scale(const struct tcp_sock *tsk)
{
	const struct tcp_sock___moat *tp = (const void *)tsk;
	const struct sock___moat *sk = (const void *)tsk;
	const struct sock_common___moat *skc = (const void *)tsk;
	struct syn_scale_logs l = {};
	__u64 full, clamp, space;
	int rmem;

	if (!tp)
		return l;
	full = syn_full_space(tsk);
	clamp = tp->window_clamp;
	if ((sk->sk_userlocks & SOCK_RCVBUF_LOCK) && (!clamp || clamp > full))
		clamp = full;
	if (!clamp)
		clamp = (__u64)0xffff << TCP_MAX_WSCALE;
	space = full < clamp ? full : clamp;
	if (bpf_core_field_exists(skc->skc_net.net) && skc->skc_net.net) {
		rmem = skc->skc_net.net->ipv4.sysctl_tcp_rmem[2];
		if (rmem > 0 && (__u64)rmem > space)
			space = rmem;
	}
	l.space = syn_log2(space);
	l.clamp = syn_log2(clamp);
	return l;
}

/* The window scale the kernel would announce to a client that offers
 * scaling: the least that scales the window a connection may grow to
 * (net.core.rmem_max counts too: a global sysctl BPF cannot read, whose
 * log2 the control plane writes to syn_config), within the clamp. The
 * cookie has no room for it, so SYN-ACK and third ACK each reckon it from
 * the listener, as the kernel does for its own cookies (cookie_v4_check). */
static __always_inline __u8 syn_rcv_wscale(struct syn_scale_logs l, const struct syn_config *cfg)
{
	__u8 lg = l.space;

	if (cfg->rcv_wscale)
		return cfg->rcv_wscale > TCP_MAX_WSCALE ? TCP_MAX_WSCALE : cfg->rcv_wscale;
	if (!l.clamp)
		return SYN_DEFAULT_RCV_WSCALE; /* no listener read */
	if (cfg->rmem_max_log2 > lg)
		lg = cfg->rmem_max_log2;
	if (lg > l.clamp)
		lg = l.clamp;
	if (lg <= 15)
		return 0;
	return lg - 15 > TCP_MAX_WSCALE ? TCP_MAX_WSCALE : lg - 15;
}

/* Whether a listener's accept queue is full (sk_acceptq_is_full): the
 * stack then drops the connection that a request socket would make. */
static __always_inline int syn_accept_queue_full(const struct tcp_sock *tsk)
{
	const struct sock___moat *sk = (const void *)tsk;

	return sk && sk->sk_ack_backlog > sk->sk_max_ack_backlog;
}

/* The window a SYN-ACK announces: the listener's receive space, rounded
 * down to a multiple of the segment the client will send (the MSS less
 * the timestamp option it carries), as tcp_select_initial_window rounds
 * it, then capped at what the field holds, as tcp_make_synack caps it.
 * The largest window a SYN-ACK can carry when the space is unknown. */
static __always_inline __u16 syn_window(__u32 space, __u16 mss, int ts)
{
	__u32 seg = mss - (ts ? 12 : 0);

	if (!space)
		return SYNACK_WINDOW;
	if (seg && space > seg)
		space = space / seg * seg;
	return space > SYNACK_WINDOW ? SYNACK_WINDOW : space;
}

/* The kernel's struct of the same name (include/net/tcp.h); the kfunc
 * checks its size. */
struct bpf_tcp_req_attrs {
	__u32 rcv_tsval;
	__u32 rcv_tsecr;
	__u16 mss;
	__u8 rcv_wscale;
	__u8 snd_wscale;
	__u8 ecn_ok;
	__u8 wscale_ok;
	__u8 sack_ok;
	__u8 tstamp_ok;
	__u8 usec_ts_ok;
	__u8 reserved[3];
};

/* Only its name matters: the loader checks that the kfunc's argument is a
 * struct called sock, and the pointer comes from bpf_skc_to_tcp_sock. */
struct sock {
};
extern int bpf_sk_assign_tcp_reqsk(struct __sk_buff *skb, struct sock *sk,
				   struct bpf_tcp_req_attrs *attrs, int attrs__sz) __ksym;

/* The MSS a cookie can carry: more values than the kernel's four, so that
 * common tunnel and jumbo MTUs are not rounded down far. The Go reference
 * (internal/syncookie) keeps the same table and a test compares them. */
static __always_inline __u16 syn_mss_value(__u32 idx, int family)
{
	__u16 mss;

	switch (idx & SYN_COOKIE_MSS_MASK) {
	case 0: mss = 536; break;
	case 1: mss = 1220; break;
	case 2: mss = 1300; break;
	case 3: mss = 1360; break;
	case 4: mss = 1400; break;
	case 5: mss = 1440; break;
	case 6: mss = 1460; break;
	/* A 9000-byte MTU: IPv6 headers take 20 bytes more than IPv4's. */
	default: mss = family == 6 ? 8940 : 8960; break;
	}
	/* IPv6 guarantees a 1280-byte MTU, and the kfunc refuses less. */
	if (family == 6 && mss < IPV6_MIN_MSS)
		mss = IPV6_MIN_MSS;
	return mss;
}

/* The largest table entry that does not exceed the client's MSS. */
static __always_inline __u32 syn_mss_index(__u16 mss, int family)
{
	if (mss >= (family == 6 ? 8940 : 8960)) return 7;
	if (mss >= 1460) return 6;
	if (mss >= 1440) return 5;
	if (mss >= 1400) return 4;
	if (mss >= 1360) return 3;
	if (mss >= 1300) return 2;
	if (mss >= 1220) return 1;
	return 0;
}

static __always_inline struct syn_config *syn_get_config(void)
{
	__u32 zero = 0;

	return bpf_map_lookup_elem(&syn_settings, &zero);
}

/* A protected port's counters on this CPU, or NULL if it has no slot. */
static __always_inline struct syn_port_stats *syn_counters_of(const struct syn_port *port)
{
	__u32 slot = port->slot;

	if (!slot)
		return NULL;
	return bpf_map_lookup_elem(&syn_counters, &slot);
}

/* The SYN path's clock: CLOCK_BOOTTIME, read at the port's first SYN in
 * each jiffy and reused for the rest of it (at most 4 ms old with
 * HZ=250). Everything the SYN path times (TSval in milliseconds, key
 * rotation in minutes, flood windows of 100 ms, holds of seconds) is far
 * coarser, and a clock read costs a SYN-ACK about as much as its hash
 * (live flood profile: read_tsc was 5% of the CPU). bpf_jiffies64 is a
 * plain load once the verifier inlines it. */
static __always_inline __u64 syn_clock(struct syn_port_stats *st, struct packet *p)
{
	__u64 j = bpf_jiffies64();

	/* The cached value even when this packet has read the clock (a rate
	 * limit, a sample): within one jiffy the SYN path's time never goes
	 * back. */
	if (st->clock_jiffies != j || !st->clock_ns) {
		st->clock_jiffies = j;
		st->clock_ns = packet_now(p);
	}
	return st->clock_ns;
}

/* The census slot of a tuple: the client's and the server's address (4 or
 * 16 bytes, IPv4 in the first word) and ports in host order. Multiplicative
 * hashing of the folded words, top bits: the census and the data path must
 * agree, and a collision only costs a socket lookup. */
static __always_inline __u32 syn_census_slot(int family, const __u32 *client, const __u32 *server,
					     __u16 cport, __u16 sport)
{
	__u32 a = client[0], b = server[0];
	__u64 x;

	if (family == 6) {
		a ^= client[1] ^ client[2] ^ client[3];
		b ^= server[1] ^ server[2] ^ server[3];
	}
	x = ((__u64)(a ^ (b * 0x9e3779b9u)) << 32) | ((__u32)cport << 16 | sport);
	x *= 0x9e3779b97f4a7c15ULL;
	return (__u32)(x >> (64 - SYN_CENSUS_BITS)) & (SYN_CENSUS_SLOTS - 1);
}

static __always_inline __u32 syn_census_slot_of(const struct packet *p)
{
	__u32 c[4], s[4];

	__builtin_memcpy(c, p->saddr, 16);
	__builtin_memcpy(s, p->daddr, 16);
	return syn_census_slot(p->family, c, s, p->sport, p->dport);
}

static __always_inline struct syn_census_table *syn_get_census(void)
{
	__u32 zero = 0;

	return bpf_map_lookup_elem(&syn_census, &zero);
}

/* The word of the census that holds slot's 4 bits, and where in it they
 * lie. */
static __always_inline __u64 *syn_census_word(struct syn_census_table *c, __u32 slot)
{
	return &c->marks[(slot & (SYN_CENSUS_SLOTS - 1)) / 16];
}

static __always_inline __u32 syn_census_shift(__u32 slot)
{
	return (slot % 16) * 4;
}

/* Marks the census slot of a tuple whose socket the kernel is about to
 * make, with the generation of the pass under way: the next pass, which
 * would see the socket, may be a second away. Written only when it
 * changes, so a slot's cache line is not dirtied per packet; an atomic OR,
 * as the control plane clears other bits of the word meanwhile. */
static __always_inline void syn_census_mark(struct syn_census_table *c, __u32 slot)
{
	__u64 *w = syn_census_word(c, slot);
	__u64 bit = 1ULL << (syn_census_shift(slot) + c->generation % 4);

	if (!(*w & bit))
		__sync_fetch_and_or(w, bit);
}

static __always_inline void syn_mark_packet(const struct packet *p)
{
	struct syn_census_table *c = syn_get_census();

	if (c)
		syn_census_mark(c, syn_census_slot_of(p));
}

/* p's entry in syn_recent, or NULL. */
static __always_inline struct syn_recent *syn_recent_of(const struct packet *p)
{
	__u32 slot = syn_census_slot_of(p) & (SYN_RECENT_SLOTS - 1);

	return bpf_map_lookup_elem(&syn_recent, &slot);
}

_Static_assert(__builtin_offsetof(struct packet, daddr) == __builtin_offsetof(struct packet, saddr) + 16 &&
		       __builtin_offsetof(struct syn_recent, daddr) == __builtin_offsetof(struct syn_recent, saddr) + 16,
	       "the addresses are copied and compared as one 32-byte block");

/* Whether r holds p's tuple. */
static __always_inline int syn_recent_tuple(const struct syn_recent *r, const struct packet *p)
{
	__u64 a[4], b[4];

	__builtin_memcpy(a, r->saddr, 32);
	__builtin_memcpy(b, p->saddr, 32);
	return r->sport == p->sport && r->dport == p->dport &&
	       ((a[0] ^ b[0]) | (a[1] ^ b[1]) | (a[2] ^ b[2]) | (a[3] ^ b[3])) == 0;
}

/* Notes that p, whose acknowledgement number is ack and sequence number
 * seq, completes a cookie handshake: validated (XDP), or assigned its
 * request socket (tc, assigned 1). An entry that says as much already is
 * not written again: the segments behind a handshake do not dirty its
 * cache line. now is CLOCK_BOOTTIME. */
static __always_inline void syn_recent_note(const struct packet *p, __be32 ack, __u32 seq, __u64 now,
					    __u32 assigned)
{
	struct syn_recent *r = syn_recent_of(p);
	__u32 stamp = now >> SYN_RECENT_UNIT_SHIFT;

	if (!r)
		return;
	if (r->ack_seq == ack && r->seq == seq && r->assigned >= assigned &&
	    stamp - r->stamp <= SYN_RECENT_UNITS && syn_recent_tuple(r, p))
		return;
	__builtin_memcpy(r->saddr, p->saddr, 32);
	r->sport = p->sport;
	r->dport = p->dport;
	r->ack_seq = ack;
	r->seq = seq;
	r->stamp = stamp;
	r->assigned = assigned;
}

/* Whether p follows a handshake of its tuple that syn_recent_note noted
 * within the last SYN_RECENT_UNITS: it acknowledges the same cookie, and
 * starts at most SYN_RECENT_SEQ_SPAN past the segment that was validated.
 * assigned: only if tc assigned that handshake its request socket. The
 * acknowledgement number decides first, and a flood's ACKs go no
 * further. */
static __always_inline int syn_recent_follows(const struct packet *p, __be32 ack, __u32 seq, __u64 now,
					      __u32 assigned)
{
	struct syn_recent *r = syn_recent_of(p);
	__u32 stamp = now >> SYN_RECENT_UNIT_SHIFT;

	return r && r->ack_seq == ack && seq - r->seq <= SYN_RECENT_SEQ_SPAN &&
	       stamp - r->stamp <= SYN_RECENT_UNITS && r->assigned >= assigned && syn_recent_tuple(r, p);
}

/* Whether p's tuple may belong to a socket other than the listener: its
 * census slot is marked (any of its bits), or the census cannot be
 * trusted for this port (no full pass since the port was protected, or the
 * control plane stopped counting: valid_until_ns is past). st is the
 * port's counters, whose clock syn_clock set for this packet. */
static __always_inline int syn_tuple_marked(const struct packet *p, const struct syn_port_stats *st)
{
	struct syn_census_table *c = syn_get_census();
	__u32 floor, slot;

	if (!c)
		return 1;
	floor = c->floor;
	if (!floor || floor < st->census_from || st->clock_ns >= c->valid_until_ns)
		return 1;
	slot = syn_census_slot_of(p);
	return (*syn_census_word(c, slot) >> syn_census_shift(slot)) & 0xf;
}

/* The socket tuple of a packet, in the packet's direction. */
static __always_inline __u32 syn_tuple(const struct packet *p, struct bpf_sock_tuple *t)
{
	if (p->family == 4) {
		__builtin_memcpy(&t->ipv4.saddr, p->saddr, 4);
		__builtin_memcpy(&t->ipv4.daddr, p->daddr, 4);
		t->ipv4.sport = bpf_htons(p->sport);
		t->ipv4.dport = bpf_htons(p->dport);
		return sizeof(t->ipv4);
	}
	__builtin_memcpy(t->ipv6.saddr, p->saddr, 16);
	__builtin_memcpy(t->ipv6.daddr, p->daddr, 16);
	t->ipv6.sport = bpf_htons(p->sport);
	t->ipv6.dport = bpf_htons(p->dport);
	return sizeof(t->ipv6);
}

/* The 32-bit word whose first two bytes hold a and last two hold b, each
 * stored as a 16-bit value, and the 64-bit word whose first four bytes
 * hold a and last four b: what a load of such bytes gives. */
static __always_inline __u32 syn_word_halves(__u16 a, __u16 b)
{
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
	return a | (__u32)b << 16;
#else
	return (__u32)a << 16 | b;
#endif
}

static __always_inline __u64 syn_dword_halves(__u32 a, __u32 b)
{
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
	return a | (__u64)b << 32;
#else
	return (__u64)a << 32 | b;
#endif
}

/* SipHash of a cookie's message; meta may carry SYN_COOKIE_MSG_TS. An
 * IPv4 message is 3 SipHash blocks, an IPv6 one 6. */
static __always_inline __u64 syn_hash(const struct syn_key *k, const struct packet *p,
				      __be32 client_isn, __u32 meta)
{
	/* One buffer seen three ways: the stack is shared with the rest of
	 * the SYN path and the verifier's 512 bytes are counted across calls.
	 * It is filled a whole word at a time, as SipHash reads it: a word
	 * read back from narrower stores stalls the CPU, which cannot forward
	 * them to the load. */
	union {
		struct syn_cookie_msg msg;
		struct syn_cookie_msg_v4 v4;
		__u64 words[(sizeof(struct syn_cookie_msg) + 7) / 8];
	} u = {};
	/* struct syn_cookie_msg_tail up to meta: the ports and the client's
	 * ISN, in network order. */
	__u64 ports = syn_dword_halves(syn_word_halves(bpf_htons(p->sport), bpf_htons(p->dport)), client_isn);
	__u32 nwords;

	if (p->family == 4) {
		u.words[0] = syn_dword_halves(*(const __u32 *)p->saddr, *(const __u32 *)p->daddr);
		u.words[1] = ports;
		nwords = sizeof(u.v4) / 8;
	} else {
		u.words[0] = *(const __u64 *)p->saddr;
		u.words[1] = *(const __u64 *)(p->saddr + 8);
		u.words[2] = *(const __u64 *)p->daddr;
		u.words[3] = *(const __u64 *)(p->daddr + 8);
		u.words[4] = ports;
		nwords = sizeof(u.msg) / 8;
	}
	/* Both messages end in meta (u.v4.tail.meta, u.msg.tail.meta), the
	 * first half of the word after the whole ones. It is written at an
	 * index rather than to the field, and read back at another: the
	 * verifier then keeps no track of its bits, which cost it some 55,000
	 * more instructions through the hash. Passing meta itself also cost
	 * the SYN path 72 more bytes of stack. */
	*(__u32 *)&u.words[nwords] = meta & (SYN_COOKIE_META_MASK | SYN_COOKIE_MSG_TS);
	return siphash24(k->k0, k->k1, u.words, nwords, sizeof(u.words) / 8 - 1,
			 *(const __u32 *)&u.words[p->family == 4 ? sizeof(u.v4) / 8 : sizeof(u.msg) / 8]);
}

/* The cookie: 22 hash bits above the 10 meta bits. */
static __always_inline __u32 syn_cookie_of(__u64 h, __u32 meta)
{
	return ((__u32)h & ~(__u32)SYN_COOKIE_META_MASK) | (meta & SYN_COOKIE_META_MASK);
}

/* moat's TSval: a millisecond clock moved by a keyed per-connection offset
 * of 32 bits, as wide as the kernel's own, so that it tells nothing of the
 * host's uptime; with 8 more hash bits in its low byte (syn_structs.h). */
static __always_inline __u32 syn_tsval(__u64 h, __u64 now_ns)
{
	__u32 ms = (__u32)(now_ns / 1000000) + (__u32)(h >> SYN_TS_OFFSET_SHIFT);

	return (ms & ~(__u32)SYN_TS_HASH_MASK) | ((__u32)(h >> SYN_TS_HASH_SHIFT) & SYN_TS_HASH_MASK);
}

enum syn_key_status {
	SYN_KEYS_LIVE = 0,
	SYN_KEYS_NONE = 1,  /* never installed: no cookies */
	SYN_KEYS_STALE = 2, /* the rotator stopped: no cookies, fail open */
};

/* The rotation state, and whether cookies may be issued and accepted. A
 * rotator that died would leave one key signing forever; instead moat
 * stops issuing cookies SYN_STALE_HALF_PERIODS / 2 periods after the last
 * rotation, visibly (stale_key_syns, `moat syn status`). */
static __always_inline int syn_rotation_state(const struct syn_config *cfg, __u64 now, struct syn_key_state **out)
{
	__u32 zero = 0;
	struct syn_key_state *ks = bpf_map_lookup_elem(&syn_rotation, &zero);
	__u64 period;

	*out = ks;
	if (!ks || ks->generation == 0)
		return SYN_KEYS_NONE;
	period = cfg->rotation_period_ns ? cfg->rotation_period_ns : SYN_DEFAULT_ROTATION_NS;
	if ((__s64)(now - ks->rotated_ns) > (__s64)(period / 2 * SYN_STALE_HALF_PERIODS))
		return SYN_KEYS_STALE;
	return SYN_KEYS_LIVE;
}

/* Checks the cookie an ACK returns (its ack_seq - 1) for the client's ISN
 * (its seq - 1) and, when the ACK carries timestamps, the hash bits its
 * TSecr echoes. Returns the cookie's low bits, or -1. The key slot is
 * named by the cookie, so one hash decides; a cookie made two rotations
 * ago names the slot the current key now holds and fails. */
static __always_inline int syn_cookie_check(const struct packet *p, const struct syn_config *cfg,
					    __u64 now, __u32 cookie, __u32 client_isn,
					    const struct tcp_opts *o)
{
	struct syn_key_state *ks;
	struct syn_key *k;
	__u32 slot, meta = cookie & SYN_COOKIE_META_MASK;
	__u64 gen, h;

	if (syn_rotation_state(cfg, now, &ks) != SYN_KEYS_LIVE || !ks)
		return -1;
	gen = ks->generation;
	slot = (meta & SYN_COOKIE_KEY) ? 1 : 0;
	/* Before the second rotation the other slot never held a key of a
	 * generation in force: whatever is in it (zeros, if the control plane
	 * wrote only one slot) must not sign anything. */
	if (slot != (gen & 1) && gen < 2)
		return -1;
	k = bpf_map_lookup_elem(&syn_keys, &slot);
	if (!k)
		return -1;
	h = syn_hash(k, p, bpf_htonl(client_isn), meta | (o->has_ts ? SYN_COOKIE_MSG_TS : 0));
	if (syn_cookie_of(h, meta) != cookie)
		return -1;
	if (o->has_ts && (o->tsecr & SYN_TS_HASH_MASK) != ((__u32)(h >> SYN_TS_HASH_SHIFT) & SYN_TS_HASH_MASK))
		return -1;
	if ((meta & SYN_COOKIE_WSCALE_MASK) > TCP_MAX_WSCALE &&
	    (meta & SYN_COOKIE_WSCALE_MASK) != SYN_COOKIE_NO_WSCALE)
		return -1;
	return meta;
}

/* The state of the socket that owns p's TCP tuple in the device's
 * namespace (established, request, time-wait or listener), or -1 for
 * none. A global function: its tuple is not on its callers' stacks. */
__attribute__((noinline)) int tcp_sock_state(struct xdp_md *ctx, const struct packet *p)
{
	struct bpf_sock_tuple t = {};
	struct bpf_sock *sk;
	__u32 size;
	int state;

	if (!ctx || !p)
		return -1;
	size = syn_tuple(p, &t);
	sk = bpf_skc_lookup_tcp(ctx, &t, size, BPF_F_CURRENT_NETNS, 0);
	if (!sk)
		return -1;
	state = sk->state;
	bpf_sk_release(sk);
	return state;
}

/* Marks p's tuple if a socket other than a listener owns it (a SYN-ACK to
 * a connection this host opened), and returns the state of the socket
 * that owns it, or -1 for none. */
static __always_inline int syn_mark_connecting(struct xdp_md *ctx, struct packet *p)
{
	int state = tcp_sock_state(ctx, p);

	if (state >= 0 && state != BPF_TCP_LISTEN)
		syn_mark_packet(p);
	return state;
}

/* Half i (0 or 1) of a 16-byte address field that lies 8-aligned in its
 * struct (struct packet, struct syn_port_stats): one load, where a memcpy
 * from the field's second half comes out as eight byte loads. */
static __always_inline __u64 syn_addr_half(const __u8 *a, int i)
{
	return ((const __u64 *)a)[i];
}

_Static_assert(__builtin_offsetof(struct packet, saddr) % 8 == 0 &&
		       __builtin_offsetof(struct packet, daddr) % 8 == 0 &&
		       __builtin_offsetof(struct syn_port_stats, local_addr) % 8 == 0 &&
		       __builtin_offsetof(struct syn_port_stats, listener_addr) % 8 == 0,
	       "addresses read a word at a time lie 8-aligned");

/* Whether this CPU found the listener for p's destination within this
 * jiffy on this device (syn_sock_state keeps it in st). */
static __always_inline int syn_listener_known(const struct xdp_md *ctx, const struct packet *p,
					      const struct syn_port_stats *st)
{
	__u64 a0, a1, c0, c1;

	if (st->net_jiffies != st->clock_jiffies || st->net_ifindex != ctx->ingress_ifindex ||
	    st->listener_family != p->family)
		return 0;
	a0 = syn_addr_half(p->daddr, 0);
	a1 = syn_addr_half(p->daddr, 1);
	c0 = syn_addr_half(st->listener_addr, 0);
	c1 = syn_addr_half(st->listener_addr, 1);
	return a0 == c0 && a1 == c1;
}

/* The state of the socket that owns a packet's tuple in the device's
 * namespace (established, request, time-wait or listener), or -1. *wild
 * says whether that socket is bound to the wildcard address (0.0.0.0 or
 * ::), which the lookup matches whatever the destination.
 *
 * The lookup walks the kernel's established hash, and a random tuple
 * misses the cache there: under a flood that miss was a fifth of the CPU.
 * So when this CPU found the listener for this destination within the
 * jiffy and the socket census says no other socket can own the tuple, the
 * answer is that listener, without a lookup. Otherwise, when the lookup
 * finds a listener, st remembers it, with its namespace's syn_net_setting
 * bits in st->net_settings (st's clock_jiffies is this packet's, as
 * syn_clock set it). */
static __always_inline int syn_sock_state(struct xdp_md *ctx, const struct packet *p, int *wild,
					  struct syn_port_stats *st)
{
	struct bpf_sock_tuple t = {};
	struct bpf_sock *sk;
	__u32 size;
	int state;

	if (syn_listener_known(ctx, p, st) && !syn_tuple_marked(p, st)) {
		*wild = st->listener_wild;
		return BPF_TCP_LISTEN;
	}
	size = syn_tuple(p, &t);
	sk = bpf_skc_lookup_tcp(ctx, &t, size, BPF_F_CURRENT_NETNS, 0);
	if (!sk)
		return -1;
	state = sk->state;
	if (sk->family == AF_INET)
		*wild = sk->src_ip4 == 0;
	else
		*wild = (sk->src_ip6[0] | sk->src_ip6[1] | sk->src_ip6[2] | sk->src_ip6[3]) == 0;
	if (state == BPF_TCP_LISTEN) {
		struct tcp_sock *tsk = bpf_skc_to_tcp_sock(sk);
		__u32 mtu = 0;
		__u16 user_mss = syn_user_mss(tsk);

		if (st->net_jiffies != st->clock_jiffies || st->net_ifindex != ctx->ingress_ifindex) {
			st->net_settings = syn_net_settings(tsk);
			st->net_jiffies = st->clock_jiffies;
			st->net_ifindex = ctx->ingress_ifindex;
		}
		/* With every listener found: another may own the next tuple. */
		st->net_settings = syn_listener_flow(tsk, st->net_settings);
		/* The MSS the kernel's SYN-ACK would announce: what the device
		 * takes (its MTU less the headers), or the listener's own
		 * TCP_MAXSEG if lower. */
		bpf_check_mtu(ctx, 0, &mtu, 0, 0);
		mtu -= p->family == 4 ? 40 : 60;
		if (mtu > 0xffff || mtu < IPV4_MIN_MSS)
			mtu = 0;
		else if (p->family == 4 && mtu > 0xffff - 40)
			mtu = 0xffff - 40; /* an IPv4 datagram's limit (ipv4_default_advmss) */
		if (user_mss && (!mtu || user_mss < mtu))
			mtu = user_mss;
		st->listener_mss = mtu;
		st->listener_space = syn_listener_space(tsk);
		st->listener_scale = syn_listener_scale(tsk);
		st->listener_family = p->family;
		st->listener_wild = *wild;
		st->listener_mptcp = syn_listener_mptcp(tsk);
		st->listener_signs = syn_listener_signs(tsk);
		st->listener_ttl = syn_listener_ttl(ctx, tsk, p->family);
		st->listener_tos = syn_listener_tos(tsk, p->family);
		__builtin_memcpy(st->listener_addr, p->daddr, 16);
	}
	bpf_sk_release(sk);
	return state;
}

_Static_assert(sizeof(((struct syn_port_stats *)0)->fib) == sizeof(struct bpf_fib_lookup),
	       "syn_port_stats.fib holds a struct bpf_fib_lookup");

/* Whether the kernel delivers a packet for p's destination here rather
 * than route it on. A listener bound to the wildcard address matches any
 * destination in the socket lookup, also ones this host only forwards (a
 * router, a host of containers or VMs with a local service on the same
 * port): those handshakes belong to the host the packet is routed to, and
 * the ACK of a moat cookie, handed to the local listener, would die in the
 * forwarding path. The FIB says: a local destination is not forwarded;
 * with forwarding off on the device nothing is routed at all. Asked once
 * per jiffy per CPU and port for the same destination and device (st
 * caches it); st is the port's counters, whose clock_jiffies syn_clock set
 * for this packet. */
static __always_inline int syn_dest_local(struct xdp_md *ctx, const struct packet *p,
					  struct syn_port_stats *st)
{
	struct bpf_fib_lookup *f = (void *)st->fib;
	__u64 a0, a1, c0, c1;
	long ret;

	a0 = syn_addr_half(p->daddr, 0);
	a1 = syn_addr_half(p->daddr, 1);
	c0 = syn_addr_half(st->local_addr, 0);
	c1 = syn_addr_half(st->local_addr, 1);
	if (st->local_jiffies == st->clock_jiffies && st->local_family == p->family &&
	    st->local_ifindex == ctx->ingress_ifindex && a0 == c0 && a1 == c1)
		return st->local;

	__builtin_memset(f, 0, sizeof(*f));
	f->ifindex = ctx->ingress_ifindex;
	f->l4_protocol = IPPROTO_TCP;
	f->sport = bpf_htons(p->sport);
	f->dport = bpf_htons(p->dport);
	if (p->family == 4) {
		f->family = AF_INET;
		__builtin_memcpy(&f->ipv4_src, p->saddr, 4);
		__builtin_memcpy(&f->ipv4_dst, p->daddr, 4);
	} else {
		f->family = AF_INET6;
		__builtin_memcpy(f->ipv6_src, p->saddr, 16);
		__builtin_memcpy(f->ipv6_dst, p->daddr, 16);
	}
	ret = bpf_fib_lookup(ctx, f, sizeof(*f), BPF_FIB_LOOKUP_SKIP_NEIGH);
	/* Forwarded: a unicast route out (found, or found but with an
	 * unknown neighbour or too small an MTU, or a tunnel), or a route the
	 * kernel drops on (blackhole, unreachable, prohibit). Not forwarded:
	 * local (or broadcast, multicast, no route). An error (a family the
	 * kernel lacks) says nothing: as before the check. */
	st->local = ret < 0 || ret == BPF_FIB_LKUP_RET_NOT_FWDED || ret == BPF_FIB_LKUP_RET_FWD_DISABLED;
	st->local_jiffies = st->clock_jiffies;
	st->local_family = p->family;
	st->local_ifindex = ctx->ingress_ifindex;
	__builtin_memcpy(st->local_addr, &a0, 8);
	__builtin_memcpy(st->local_addr + 8, &a1, 8);
	return st->local;
}

/* Whether a listener of this host owns p's tuple: the socket lookup finds
 * a listener (no established, request or time-wait socket owns the tuple,
 * and some socket listens here), and the destination is one this host
 * delivers to itself rather than routes on (syn_dest_local, asked only
 * when the listener is bound to the wildcard address). moat answers SYNs
 * and filters ACKs only then; st->net_settings is then the listener's
 * namespace's (syn_sock_state). */
static __always_inline int syn_local_listener(struct xdp_md *ctx, const struct packet *p,
					      struct syn_port_stats *st)
{
	int wild = 0;

	if (syn_sock_state(ctx, p, &wild, st) != BPF_TCP_LISTEN)
		return 0;
	return !wild || syn_dest_local(ctx, p, st);
}

/* A SYN moat may answer comes to a unicast frame, from and to unicast,
 * routable addresses: no SYN-ACK to broadcast, multicast, loopback or
 * unspecified addresses, nor over IPv6 to an IPv4-mapped one, which the
 * kernel would never answer either. */
static __always_inline int syn_addrs_unicast(const struct ethhdr *eth, const struct packet *p)
{
	__u64 hi, lo;
	int i;

	if (eth->h_dest[0] & 1) /* group bit: broadcast or multicast MAC */
		return 0;
	if (p->family == 4) {
		/* 0/8, 127/8, and 224/3 (multicast, reserved, broadcast). */
		if (p->saddr[0] == 0 || p->saddr[0] == 127 || p->saddr[0] >= 224)
			return 0;
		if (p->daddr[0] == 0 || p->daddr[0] == 127 || p->daddr[0] >= 224)
			return 0;
		return 1;
	}
#pragma unroll
	for (i = 0; i < 2; i++) {
		const __u8 *a = i ? p->daddr : p->saddr;

		if (a[0] == 0xff) /* ff00::/8 multicast */
			return 0;
		__builtin_memcpy(&hi, a, 8);
		__builtin_memcpy(&lo, a + 8, 8);
		if (hi == 0 && (lo == 0 || lo == bpf_cpu_to_be64(1))) /* :: and ::1 */
			return 0;
		/* ::ffff:0:0/96; the parser already refuses such a source. */
		if (i && hi == 0 && a[8] == 0 && a[9] == 0 && a[10] == 0xff && a[11] == 0xff)
			return 0;
	}
	return 1;
}

/* Whether an IPv6 destination is a subnet-router anycast address (RFC 4291
 * 2.6.1): a prefix with an all-zero interface identifier. The kernel makes
 * one for each prefix of a device that forwards (2001:db8:1:: for
 * 2001:db8:1::1/64, fe80::), and takes no TCP connection to an anycast
 * address: it drops the SYN (tcp_v6_conn_request). (A stray segment to one
 * still gets the listener's RST: only a RST of no socket is refused.) Told
 * apart by the interface identifier of a /64, the prefix length of all but
 * point-to-point links, where the device the packet came in by forwards
 * IPv6 (conf.all sets every device's; the prefix may be on another
 * device that alone forwards, a bridge above moat's port, which is not
 * seen): on a host that does not forward, an address with a zero interface identifier is unicast, and its
 * SYNs get moat's cookies. Where it forwards, RFC 6164's /127 or a /128
 * (whose ::0 address the kernel keeps unicast) has its SYNs left to the
 * kernel; an anycast address of a longer prefix, or one a socket joined
 * (IPV6_JOIN_ANYCAST), is not seen. */
static __always_inline int syn_dest_subnet_anycast(struct xdp_md *ctx, const struct packet *p)
{
	struct xdp_buff___moat *xdp;

	if (p->family != 6 || syn_addr_half(p->daddr, 1) != 0)
		return 0;
	xdp = bpf_cast_to_kern_ctx(ctx);
	if (!xdp || !xdp->rxq || !xdp->rxq->dev)
		return 1; /* cannot tell: as the kernel on a router */
	return xdp->rxq->dev->ip6_ptr && xdp->rxq->dev->ip6_ptr->cnf.forwarding > 0;
}

/* Auto mode: counts the SYN in this CPU's window and says whether the
 * port is in cookie mode. Each CPU writes the shared port entry at most
 * once per window while a flood lasts, so detection costs a SYN a per-CPU
 * counter and the SYN path's clock (syn_clock: a load per SYN, a clock read
 * per jiffy). */
static __always_inline int syn_flooding(struct syn_port *port, struct syn_port_stats *st,
					const struct syn_config *cfg, __u64 now)
{
	__u64 hold = cfg->hold_ns ? cfg->hold_ns : SYN_DEFAULT_HOLD_NS;

	if (now - st->win_start_ns >= SYN_WINDOW_NS) {
		st->win_start_ns = now;
		st->win_syns = 0;
	}
	st->win_syns++;
	/* The window's first SYN over the threshold; or a later one while
	 * the port is not flooding: its entry was written again (a reload,
	 * `moat syn protect` again), with flooding clear, in the middle of
	 * this CPU's window, which would not cross the threshold again until
	 * it ends. */
	if (st->win_syns == (__u64)port->window_threshold + 1 ||
	    (st->win_syns > (__u64)port->window_threshold + 1 && !port->flooding)) {
		port->last_flood_ns = now;
		port->flood_until_ns = now + hold;
		if (!port->flooding) {
			port->flooding = 1;
			port->last_change_ns = now;
		}
	} else if (port->flooding && (__s64)(now - port->last_flood_ns) > (__s64)hold) {
		port->flooding = 0;
		/* The flood ended when its hold ran out, as status and the
		 * daemon's log already said (flood_until_ns), not at this SYN,
		 * which may come much later. */
		port->last_change_ns = port->flood_until_ns && (__s64)(now - port->flood_until_ns) > 0 ?
					       port->flood_until_ns : now;
	}
	return port->flooding;
}

/* The SYN-ACK's options, at most 5 words of 4 bytes (synack_options). */
#define SYNACK_OPT_WORDS ((SYNACK_TCP_LEN - 20) / 4)

/* The SYN-ACK is built as 32-bit words in registers, each the value a
 * 32-bit load of its 4 bytes would give, and written to the frame and
 * summed as such: no header is assembled byte by byte on the stack and
 * read back in wider loads, which the CPU cannot forward from the narrow
 * stores and stalls on. */

/* The word whose bytes, in order, are the 4 bytes of the big-endian v. */
#define SYN_WORD(v) bpf_htonl(v)

/* The ones' complement sum of nwords 32-bit words, which csum_fold32 turns
 * into a checksum: the same sum bpf_csum_diff makes, without a helper call
 * per header. nwords must be a compile-time constant. */
static __always_inline __u64 csum_words(const void *buf, const int nwords)
{
	const __u32 *w = buf;
	__u64 sum = 0;
	int i;

#pragma unroll
	for (i = 0; i < nwords; i++)
		sum += w[i];
	return sum;
}

/* The sum of the TCP pseudo-header of a reply to p (its addresses, which
 * the sum does not order) with tcp_len bytes of TCP. */
static __always_inline __u64 syn_pseudo_sum(const struct packet *p, __u32 tcp_len)
{
	if (p->family == 4)
		return (__u64)*(const __u32 *)p->saddr + *(const __u32 *)p->daddr +
		       SYN_WORD(IPPROTO_TCP << 16 | tcp_len);
	return csum_words(p->saddr, 8) + SYN_WORD(tcp_len) + SYN_WORD(IPPROTO_TCP);
}

static __always_inline __u16 csum_fold32(__u64 sum)
{
	sum = (sum & 0xffff) + (sum >> 16);
	sum = (sum & 0xffff) + (sum >> 16);
	sum = (sum & 0xffff) + (sum >> 16);
	return (__u16)~sum;
}

/* Fills w with the options of the SYN-ACK: MSS, then SACK-permitted and
 * timestamps, then window scale, each only if the client offered it; the
 * words after them stay zero. Returns their number, 1 to 5: the SYN-ACK is
 * no longer than its options make it (an option-less SYN gets a 24-byte
 * TCP header, as from the kernel). */
static __always_inline int synack_options(__u32 *w, const struct tcp_opts *o,
					  __u16 our_mss, __u8 our_wscale, __u32 tsval)
{
	int i = 0;

	w[i++] = SYN_WORD((__u32)TCPOPT_MSS << 24 | 4 << 16 | our_mss);
	if (o->has_ts) {
		if (o->sack_ok)
			w[i++] = SYN_WORD(TCPOPT_SACK_PERM << 24 | 2 << 16 | TCPOPT_TIMESTAMP << 8 | 10);
		else
			w[i++] = SYN_WORD(TCPOPT_NOP << 24 | TCPOPT_NOP << 16 | TCPOPT_TIMESTAMP << 8 | 10);
		w[i++] = SYN_WORD(tsval);
		w[i++] = SYN_WORD(o->tsval);
	} else if (o->sack_ok) {
		w[i++] = SYN_WORD(TCPOPT_NOP << 24 | TCPOPT_NOP << 16 | TCPOPT_SACK_PERM << 8 | 2);
	}
	if (o->has_wscale)
		w[i++] = SYN_WORD(TCPOPT_NOP << 24 | TCPOPT_WINDOW << 16 | 3 << 8 | our_wscale);
	return i;
}

/* The first word of a reply's IP header, as IPv6 has it but for the
 * version: the DS field of p's header at l3 in bits 20-27, over IPv6 with
 * its flow label in bits 0-19. 0 if the header cannot be read. */
static __always_inline __u32 syn_ip_word0(struct xdp_md *ctx, __u32 l3, int family)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	__u32 w = 0;

	if (l3 <= SYN_MAX_L3_OFF && data + l3 + 4 <= data_end)
		w = bpf_ntohl(*(__be32 *)(data + l3));
	if (family == 4)
		return (w >> 16 & 0xff) << 20;
	return w & 0xfffffff;
}

/* The flow label of the kernel's reply to a segment of flow label label
 * (ip6_make_flowlabel), under the syn_net_setting bits net of the
 * listener and its namespace: the segment's where the bit reflect is in
 * net (SYN_NET_LISTENER_REFLECT for the listener's SYN-ACK or RST;
 * SYN_NET_FLOW_REFLECT_RESET for a RST of no socket) and it has one;
 * else, where the bit autolabel is (SYN_NET_LISTENER_AUTO for a SYN-ACK,
 * which leaves by the listener; SYN_NET_FLOW_AUTO for a RST, which leaves
 * by the namespace's control socket), a label of moat's own spread from
 * spread (something the client sees anyway), as the kernel's comes from a
 * hash, in the stateless range under flowlabel_state_ranges; else none. */
static __always_inline __u32 syn_reply_label(__u32 label, __u32 net, __u32 reflect, __u32 autolabel, __u32 spread)
{
	if ((net & reflect) && label)
		return label;
	if (!(net & autolabel))
		return 0;
	return ((spread * 0x9e3779b1u) >> 12) | ((net & SYN_NET_FLOW_STATELESS) ? 0x80000 : 0);
}

/* Makes the frame a reply to p of tcp_len bytes of TCP: keeps the
 * Ethernet header and VLAN tags with the MAC addresses swapped, resizes
 * the frame to them and a plain IP header (20 bytes, or 40) and the TCP
 * bytes, and writes that IP header from p's addresses, swapped, with hop
 * limit ttl (SYNACK_TTL where 0) and, from w0, a first word as
 * syn_ip_word0 gives it, the DS field with its ECN bits clear and (IPv6)
 * the flow label. A frame shorter
 * than the reply grows at the head, where XDP always has room; tailroom
 * is not guaranteed (veth has none). Returns 0 with *th at the TCP header
 * and *end at the frame's end; SYN_CONTINUE when the frame is as it was;
 * XDP_DROP when it was resized but could not be filled. */
static __always_inline int syn_reply_frame(struct xdp_md *ctx, const struct packet *p, __u32 tcp_len,
					   struct tcphdr **th, void **end, __u8 ttl, __u32 w0)
{
	__u8 tos = (w0 >> 20) & 0xfc;
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	__u32 dst_mac, src_mac, len, l3 = p->l3_off;
	__u16 dst_mac2, src_mac2, l2_type;
	__u64 l2_tags;
	int delta, iplen = p->family == 4 ? sizeof(struct iphdr) : sizeof(struct ipv6hdr);

	if (l3 > SYN_MAX_L3_OFF || data + SYN_MAX_L3_OFF > data_end)
		return SYN_CONTINUE;
	_Static_assert(SYN_MAX_L3_OFF == 22, "the Ethernet header and tags are kept as 12 + 2 + 8 bytes");
	dst_mac = *(__u32 *)data;
	dst_mac2 = *(__u16 *)(data + 4);
	src_mac = *(__u32 *)(data + 6);
	src_mac2 = *(__u16 *)(data + 10);
	l2_type = *(__u16 *)(data + 12);
	l2_tags = *(__u64 *)(data + 14);
	/* The frame's length taken apart first: folded into the sum below,
	 * the pointers would meet 32-bit arithmetic, which the verifier
	 * refuses. */
	len = data_end - data;
	asm volatile("" : "+r"(len));
	delta = (int)(l3 + iplen + tcp_len) - (int)len;
	if (delta > 0 && bpf_xdp_adjust_head(ctx, -delta))
		return SYN_CONTINUE;
	if (delta < 0 && bpf_xdp_adjust_tail(ctx, delta))
		return SYN_CONTINUE;
	data = (void *)(long)ctx->data;
	data_end = (void *)(long)ctx->data_end;

	if (data + SYN_MAX_L3_OFF > data_end)
		return XDP_DROP;
	/* Addresses swapped; EtherType and tags (up to the IP header) kept. */
	*(__u32 *)data = src_mac;
	*(__u16 *)(data + 4) = src_mac2;
	*(__u32 *)(data + 6) = dst_mac;
	*(__u16 *)(data + 10) = dst_mac2;
	*(__u16 *)(data + 12) = l2_type;
	*(__u64 *)(data + 14) = l2_tags;

	if (p->family == 4) {
		__u32 *ip = data + l3;
		/* Version 4, header length 5, TOS; ID 0 and DF. */
		__u32 v0 = SYN_WORD(0x45 << 24 | (__u32)tos << 16 | (sizeof(struct iphdr) + tcp_len));
		__u32 w1 = SYN_WORD(0x4000);
		__u16 ttl_proto = bpf_htons((__u16)(ttl ? ttl : SYNACK_TTL) << 8 | IPPROTO_TCP);
		__u32 saddr = *(const __u32 *)p->daddr, daddr = *(const __u32 *)p->saddr;

		if ((void *)(ip + 5) > data_end)
			return XDP_DROP;
		ip[0] = v0;
		ip[1] = w1;
		ip[2] = syn_word_halves(ttl_proto,
					csum_fold32((__u64)v0 + w1 + syn_word_halves(ttl_proto, 0) + saddr + daddr));
		ip[3] = saddr;
		ip[4] = daddr;
		*th = (void *)(ip + 5);
	} else {
		struct ipv6hdr *ip6h = data + l3;

		if ((void *)(ip6h + 1) > data_end)
			return XDP_DROP;
		/* Version 6, traffic class, flow label. */
		*(__be32 *)ip6h = bpf_htonl(0x60000000 | (__u32)tos << 20 | (w0 & 0xfffff));
		ip6h->payload_len = bpf_htons(tcp_len);
		ip6h->nexthdr = IPPROTO_TCP;
		ip6h->hop_limit = ttl ? ttl : SYNACK_TTL;
		__builtin_memcpy(&ip6h->saddr, p->daddr, 16);
		__builtin_memcpy(&ip6h->daddr, p->saddr, 16);
		*th = (void *)(ip6h + 1);
	}
	if ((void *)(*th + 1) > data_end)
		return XDP_DROP;
	*end = data_end;
	return 0;
}

/* Answers a SYN with a SYN-ACK carrying a moat cookie, rewriting the frame
 * in place. Returns XDP_TX; XDP_DROP for a SYN moat will not answer (odd
 * shapes and addresses: passing them would let a flood of them reach the
 * kernel at its own rate); or SYN_CONTINUE to leave the SYN to the kernel
 * when the kernel must decide (no listener here, a time-wait or request
 * socket, no live key, double tags). st is the port's counters on this
 * CPU, now the SYN path's clock. A global function: the verifier checks
 * it once, not once per path through the parser. */
__attribute__((noinline)) int syn_answer(struct xdp_md *ctx, struct packet *p,
					 struct syn_port_stats *st, __u64 now)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	__u32 l3, l4, optlen, payload, meta, slot;
	struct syn_config *cfg;
	const struct tcp_opts *opts;
	struct tcp_opts o_copy;
	struct tcp_opts *o = &o_copy;
	__u32 tw[4], ow[SYNACK_OPT_WORDS] = {};
	struct syn_key_state *ks;
	struct syn_key *k;
	struct tcphdr *th;
	struct ethhdr *eth;
	__u16 check;
	__be32 client_isn;
	__u64 sum, h;
	__u16 our_mss;
	__u8 our_wscale, wscale, ip_ecn;
	int ecn, keys, i, ret;
	__u32 net = 0, tcp_len, ipw0;

	if (!ctx || !p || !st)
		return SYN_CONTINUE;
	cfg = syn_get_config();
	if (!cfg)
		return SYN_CONTINUE;
	l3 = p->l3_off;
	l4 = p->l4_off;

	/* No live key: the kernel's own cookies are all there is. */
	keys = syn_rotation_state(cfg, now, &ks);
	if (keys == SYN_KEYS_STALE)
		st->stale_key_syns++;
	if (keys != SYN_KEYS_LIVE || !ks)
		return SYN_CONTINUE;

	if (p->tcp_flags & (TCPF_FIN | TCPF_RST))
		goto refuse;
	if (l3 > SYN_MAX_L3_OFF)
		goto refuse;
	eth = data;
	if ((void *)(eth + 1) > data_end || !syn_addrs_unicast(eth, p))
		goto refuse;

	/* Plain IP headers, no fragment, no payload. */
	if (p->family == 4) {
		struct iphdr *iph = data + l3;

		if ((void *)(iph + 1) > data_end)
			goto refuse;
		if (iph->ihl != 5 || (iph->frag_off & bpf_htons(IP_MF | IP_OFFSET)))
			goto refuse;
		if (l4 != l3 + sizeof(*iph))
			goto refuse;
		payload = bpf_ntohs(iph->tot_len) - sizeof(*iph);
		ip_ecn = iph->tos & 3;
	} else {
		struct ipv6hdr *ip6h = data + l3;

		if ((void *)(ip6h + 1) > data_end)
			goto refuse;
		if (ip6h->nexthdr != IPPROTO_TCP || l4 != l3 + sizeof(*ip6h))
			goto refuse;
		payload = bpf_ntohs(ip6h->payload_len);
		ip_ecn = (ip6h->flow_lbl[0] >> 4) & 3;
	}
	th = data + l4;
	if ((void *)(th + 1) > data_end)
		goto refuse;
	optlen = th->doff * 4;
	if (optlen < sizeof(*th) || payload != optlen)
		goto refuse; /* data in the SYN (TFO): the client resends a plain SYN */
	client_isn = th->seq;
	/* The kernel's rule for ECN setup (tcp_ecn_create_request): an
	 * ECT-marked SYN gets ECN only with the reserved bit set; and only
	 * where tcp_ecn is on (below). */
	ecn = (p->tcp_flags & (TCPF_ECE | TCPF_CWR)) == (TCPF_ECE | TCPF_CWR) &&
	      (ip_ecn == 0 || th->res1);

	/* Double tags: the tc acceptor runs after the outer tag is stripped
	 * and would see the inner one still in the frame. A subnet-router
	 * anycast destination: the kernel drops the SYN, and moat's SYN-ACK
	 * would make a connection the kernel alone never makes. */
	if (p->vlans > 1 || syn_dest_subnet_anycast(ctx, p))
		return SYN_CONTINUE;
	/* Only a listener's SYNs: a time-wait socket must see a reused tuple
	 * (or the third ACK reaches it and dies), an established one answers
	 * with a challenge ACK, and no socket here means the destination is
	 * elsewhere (another namespace, behind NAT, routed through) or absent,
	 * all the kernel's business; so is a destination this host routes on. */
	if (!syn_local_listener(ctx, p, st))
		return SYN_CONTINUE;
	/* An MPTCP listener's SYNs are the kernel's (syn_listener_mptcp). */
	if (st->listener_mptcp) {
		st->mptcp_syns++;
		return SYN_CONTINUE;
	}
	net = st->net_settings;
	/* With tcp_syncookies 0 the stack would ignore the request socket tc
	 * hands it: the kernel keeps its SYNs. */
	if (!(net & SYN_NET_COOKIES))
		return SYN_CONTINUE;
	/* NAT would drop the request socket tc hands over (SYN_NET_NAT4):
	 * the kernel keeps the family's SYNs, as an MPTCP listener's. */
	if (net & syn_net_nat_bit(p->family)) {
		st->nat_syns++;
		return SYN_CONTINUE;
	}
	if (!(net & SYN_NET_ECN))
		ecn = 0;

	slot = ks->generation & 1;
	k = bpf_map_lookup_elem(&syn_keys, &slot);
	if (!k)
		return SYN_CONTINUE;

	/* Read once per packet: the attack shape may have walked them. */
	opts = xdp_tcp_options(ctx, p);
	if (!opts)
		return SYN_CONTINUE;
	o_copy = *opts;
	/* A SYN signed with TCP-MD5 or TCP-AO (BGP's sessions) needs a signed
	 * SYN-ACK, which only the kernel can make: its own where the
	 * listener holds keys; where it holds none, the kernel drops the SYN,
	 * and so does cookie mode. */
	if (o->signed_seg) {
		if (st->listener_signs)
			return SYN_CONTINUE;
		goto refuse;
	}
	/* What the namespace turned off is not offered, as the kernel's own
	 * SYN-ACK would not: the client then does without it. */
	if (!(net & SYN_NET_SACK))
		o->sack_ok = 0;
	if (!(net & SYN_NET_TS))
		o->has_ts = 0;
	if (!(net & SYN_NET_WSCALE))
		o->has_wscale = 0;

	/* The cookie's low bits. */
	wscale = SYN_COOKIE_NO_WSCALE;
	if (o->has_wscale)
		wscale = o->wscale > TCP_MAX_WSCALE ? TCP_MAX_WSCALE : o->wscale;
	if (!o->has_mss)
		o->mss = p->family == 4 ? IPV4_MIN_MSS : IPV6_MIN_MSS;
	meta = wscale | syn_mss_index(o->mss, p->family) << SYN_COOKIE_MSS_SHIFT;
	if (o->sack_ok)
		meta |= SYN_COOKIE_SACK;
	if (ecn)
		meta |= SYN_COOKIE_ECN;
	if (slot)
		meta |= SYN_COOKIE_KEY;
	h = syn_hash(k, p, client_isn, meta | (o->has_ts ? SYN_COOKIE_MSG_TS : 0));

	/* The MSS the kernel would announce (st->listener_mss: the device's
	 * MTU, the listener's TCP_MAXSEG), or a lower one the control plane
	 * set. */
	our_mss = p->family == 4 ? cfg->mss_v4 : cfg->mss_v6;
	if (st->listener_mss && (!our_mss || st->listener_mss < our_mss))
		our_mss = st->listener_mss;
	if (!our_mss)
		our_mss = p->family == 4 ? SYN_DEFAULT_MSS_V4 : SYN_DEFAULT_MSS_V6;
	our_wscale = syn_rcv_wscale(st->listener_scale, cfg);

	/* The kernel continues moat's TSval clock (bpf_tcp_req_attrs.rcv_tsecr),
	 * offset included. */
	tcp_len = sizeof(*th) + 4 * synack_options(ow, o, our_mss, our_wscale, syn_tsval(h, now));
	if (tcp_len > SYNACK_TCP_LEN)
		return SYN_CONTINUE; /* cannot happen: keeps the verifier content */
	/* Ports swapped, the cookie, the client's ISN + 1, SYN|ACK (and ECE). */
	tw[0] = SYN_WORD((__u32)p->dport << 16 | p->sport);
	tw[1] = SYN_WORD(syn_cookie_of(h, meta));
	tw[2] = SYN_WORD(bpf_ntohl(client_isn) + 1);
	tw[3] = SYN_WORD((tcp_len / 4) << 28 | (__u32)(TCPF_SYN | TCPF_ACK | (ecn ? TCPF_ECE : 0)) << 16 |
			 syn_window(st->listener_space, our_mss, o->has_ts));

	/* The pseudo-header, then the header without its checksum (and a zero
	 * urgent pointer) and the options, whose unused words are zero. */
	sum = syn_pseudo_sum(p, tcp_len) + csum_words(tw, 4) + csum_words(ow, SYNACK_OPT_WORDS);
	check = csum_fold32(sum);

	/* The IP header the kernel's SYN-ACK would have (tcp_v4_send_synack,
	 * tcp_v6_send_synack): the listener's hop limit and DS field, or the
	 * SYN's DS field under tcp_reflect_tos; over IPv6 the flow label of
	 * syn_reply_label, one of moat's own spread from the cookie. Built in
	 * ipw0 from the SYN's, read again here rather than kept: the SYN path
	 * has no stack to spare. */
	ipw0 = syn_ip_word0(ctx, l3, p->family);
	if (!(net & SYN_NET_REFLECT_TOS))
		ipw0 = (ipw0 & 0xfffff) | (__u32)st->listener_tos << 20;
	if (p->family == 6)
		ipw0 = (ipw0 & 0xff00000) | syn_reply_label(ipw0 & 0xfffff, net, SYN_NET_LISTENER_REFLECT, SYN_NET_LISTENER_AUTO,
							       bpf_ntohl(tw[1]));

	/* Everything past the Ethernet header and tags is rebuilt from what
	 * was read above. */
	ret = syn_reply_frame(ctx, p, tcp_len, &th, &data_end, st->listener_ttl, ipw0);
	if (ret)
		return ret;
	((__u32 *)th)[0] = tw[0];
	((__u32 *)th)[1] = tw[1];
	((__u32 *)th)[2] = tw[2];
	((__u32 *)th)[3] = tw[3];
	((__u32 *)th)[4] = syn_word_halves(check, 0);
	/* The options, as many words as they take. */
	for (i = 0; i < SYNACK_OPT_WORDS; i++) {
		__u32 *dst = (__u32 *)(th + 1) + i;

		if (sizeof(*th) + i * 4 >= tcp_len)
			break;
		if ((void *)(dst + 1) > data_end)
			return XDP_DROP;
		*dst = ow[i];
	}
	st->cookies_issued++;
	return XDP_TX;

refuse:
	/* A SYN for no listener of this host (routed on, another namespace,
	 * NAT) is the kernel's business whatever its shape: a Fast Open SYN
	 * routed through keeps its data. Where the kernel takes no cookie
	 * handshake (tcp_syncookies 0), the port is not in cookie mode at
	 * all: these SYNs are the kernel's too, and so are all of an MPTCP
	 * listener's, and all of a family whose NAT runs, as their others
	 * reach the kernel anyway. */
	if (!syn_local_listener(ctx, p, st) || !(st->net_settings & SYN_NET_COOKIES))
		return SYN_CONTINUE;
	if (st->listener_mptcp) {
		st->mptcp_syns++;
		return SYN_CONTINUE;
	}
	if (st->net_settings & syn_net_nat_bit(p->family)) {
		st->nat_syns++;
		return SYN_CONTINUE;
	}
	st->syns_dropped++;
	return XDP_DROP;
}

/* Whether a TCP ACK returns a valid SYN cookie of the kernel's own (the
 * namespace's tcp_syncookies secret). The kernel's helpers read the base
 * IP header, at l3, and the TCP header wherever they are. */
static __always_inline int syn_kernel_cookie(void *data, void *data_end, __u32 l3, struct tcphdr *th,
					     int family)
{
	if (family == 4) {
		struct iphdr *iph = data + l3;

		return (void *)(iph + 1) <= data_end && bpf_tcp_raw_check_syncookie_ipv4(iph, th) == 0;
	}
	struct ipv6hdr *ip6h = data + l3;

	return (void *)(ip6h + 1) <= data_end && bpf_tcp_raw_check_syncookie_ipv6(ip6h, th) == 0;
}

/* Whether this CPU's budget of stray-ACK resets has one left at now
 * (syn_config.rst_rate a second, up to a second's worth saved). now is a
 * port's clock (syn_clock): each port reads its own, so the next packet,
 * to another port, may bring an earlier time; time only counts forward. */
static __always_inline int syn_rst_take(__u64 now)
{
	struct syn_config *cfg = syn_get_config();
	struct syn_rst_bucket *b;
	__u32 zero = 0;
	__u64 rate, credit;

	if (!cfg || cfg->rst_rate == SYN_RST_OFF)
		return 0;
	rate = cfg->rst_rate ? cfg->rst_rate : SYN_DEFAULT_RST_RATE;
	b = bpf_map_lookup_elem(&syn_rst_budget, &zero);
	if (!b)
		return 0;
	credit = b->credit_ns;
	if (!b->stamp_ns) {
		credit = 1000000000ULL;
		b->stamp_ns = now;
	} else if ((__s64)(now - b->stamp_ns) > 0) {
		credit += now - b->stamp_ns;
		b->stamp_ns = now;
	}
	if (credit > 1000000000ULL)
		credit = 1000000000ULL;
	if (credit * rate < 1000000000ULL) {
		b->credit_ns = credit;
		return 0;
	}
	b->credit_ns = credit - 1000000000ULL / rate;
	return 1;
}

/* An ACK to a listener that carries no valid cookie (a spoofed ACK, or a
 * client's segment for a connection this host no longer has: after a
 * reboot, a failover, a lost RST). The kernel answers such a segment with
 * a RST, which tells a real client at once that its connection is gone;
 * dropped, it would send again for many minutes. So moat answers it too,
 * as many a second as syn_config.rst_rate allows, and drops the rest: an
 * ACK flood draws no more than that. Before a RST, a socket lookup makes
 * sure that no socket owns the tuple: one that the census has not marked
 * yet (a connection whose SYN came in another way) takes the segment
 * instead, and its tuple is marked. Returns SYN_RESET with the frame made
 * into the RST (the kernel's: the ACK's acknowledgment number as its
 * sequence number, no ACK flag), XDP_DROP, or SYN_CONTINUE. A global
 * function, as its callers are. */
__attribute__((noinline)) int syn_reset_stray(struct xdp_md *ctx, struct packet *p,
					      struct syn_port_stats *st, __u64 now)
{
	const struct tcp_opts *o;
	struct syn_recent *r;
	void *data, *data_end;
	struct tcphdr *th;
	__u32 l3, l4, tw[5], ipw0, reflect;
	__be32 seq;
	__u64 sum;
	int state;

	if (!ctx || !p || !st)
		return XDP_DROP;
	/* Not a fragment's first part: the kernel answers the whole segment,
	 * if it ever comes whole. */
	if (p->first_fragment)
		return XDP_DROP;
	data = (void *)(long)ctx->data;
	data_end = (void *)(long)ctx->data_end;
	l3 = p->l3_off;
	l4 = p->l4_off;
	if (l3 > SYN_MAX_L3_OFF || l4 > SYN_L4_MASK || data + SYN_MAX_L3_OFF > data_end)
		return XDP_DROP;
	th = data + (l4 & SYN_L4_MASK);
	if ((void *)(th + 1) > data_end)
		return XDP_DROP;
	/* Nor to what the kernel would drop before TCP sees it (a group MAC;
	 * a broadcast, multicast, loopback or unspecified address), nor to a
	 * segment signed with TCP-MD5 or TCP-AO, whose RST would have to be
	 * signed too. (To a subnet-router anycast address, the listener's RST
	 * goes out: the kernel refuses only a RST of no socket there.) */
	if (!syn_addrs_unicast(data, p))
		return XDP_DROP;
	o = xdp_tcp_options(ctx, p);
	if (o && o->signed_seg)
		return XDP_DROP;
	seq = th->ack_seq;
	/* Nor while the tuple's syn_recent slot holds another handshake of
	 * the last 100 ms, or this one's with the same acknowledgment: this
	 * may be a segment right behind a valid cookie ACK (whose entry
	 * another handshake took over), whose socket the stack is yet to
	 * make; dropped, it comes again. */
	r = syn_recent_of(p);
	if (r && (__u32)(now >> SYN_RECENT_UNIT_SHIFT) - r->stamp <= SYN_RECENT_UNITS &&
	    (r->ack_seq == seq || !syn_recent_tuple(r, p)))
		return XDP_DROP;
	if (!syn_rst_take(now))
		return XDP_DROP;
	state = syn_mark_connecting(ctx, p);
	if (state >= 0 && state != BPF_TCP_LISTEN)
		return SYN_CONTINUE;
	/* No socket at all (the listener closed since this CPU found it): the
	 * kernel's RST of no socket, which it refuses to an anycast address. */
	if (state < 0 && syn_dest_subnet_anycast(ctx, p))
		return XDP_DROP;

	/* The RST's TCP header, then its checksum over the pseudo-header. */
	tw[0] = SYN_WORD((__u32)p->dport << 16 | p->sport);
	tw[1] = seq;
	tw[2] = 0;
	tw[3] = SYN_WORD(5 << 28 | (__u32)TCPF_RST << 16);
	sum = syn_pseudo_sum(p, sizeof(*th)) + csum_words(tw, 4);
	tw[4] = syn_word_halves(csum_fold32(sum), 0);

	/* The IP header of the kernel's RST (tcp_v4_send_reset,
	 * tcp_v6_send_reset), which leaves through the namespace's control
	 * socket whatever the listener set: the namespace's hop limit; the
	 * segment's DS field, ECN bits clear; over IPv6 the flow label of
	 * syn_reply_label, one of moat's own spread from the tuple and the
	 * sequence number. */
	ipw0 = syn_ip_word0(ctx, l3, p->family);
	/* A RST of no socket reflects by the namespace's bit, not by the
	 * listener that was. */
	reflect = state < 0 ? SYN_NET_FLOW_REFLECT_RESET : SYN_NET_LISTENER_REFLECT;
	if (p->family == 6)
		ipw0 = (ipw0 & 0xff00000) |
		       syn_reply_label(ipw0 & 0xfffff, st->net_settings, reflect, SYN_NET_FLOW_AUTO, bpf_ntohl(seq) ^ tw[0]);

	/* The frame cut to the headers (the ACK had both whole, so it only
	 * shrinks), everything past the Ethernet header and tags rebuilt. */
	if (syn_reply_frame(ctx, p, sizeof(*th), &th, &data_end, syn_default_ttl(ctx, p->family), ipw0))
		return XDP_DROP;
	((__u32 *)th)[0] = tw[0];
	((__u32 *)th)[1] = tw[1];
	((__u32 *)th)[2] = tw[2];
	((__u32 *)th)[3] = tw[3];
	((__u32 *)th)[4] = tw[4];
	st->resets_sent++;
	return SYN_RESET;
}

/* An ACK to a port in cookie mode. It is stray (SYN_STRAY: dropped, or
 * answered with a RST, by syn_reset_stray) only when the tuple's socket is
 * the listener (no established, request or time-wait socket owns it) and
 * it carries neither a valid moat cookie nor a valid kernel one. With no
 * socket at all the destination is not a local listener of this namespace
 * (a container behind this device, NAT, a routed flow): passed. Headers
 * too long to check: dropped. st and now as for syn_answer. A global
 * function, so the verifier checks it once. */
__attribute__((noinline)) int syn_check_ack(struct xdp_md *ctx, struct packet *p,
					    struct syn_port_stats *st, __u64 now)
{
	struct tcp_opts no_opts = {};
	const struct tcp_opts *opts;
	struct syn_config *cfg;
	void *data, *data_end;
	struct tcphdr *th;
	__u32 l3, l4, seq;
	__be32 ack;

	if (!ctx || !p || !st)
		return SYN_CONTINUE;
	if (!syn_local_listener(ctx, p, st))
		return SYN_CONTINUE;
	cfg = syn_get_config();
	if (!cfg)
		return SYN_CONTINUE;

	data = (void *)(long)ctx->data;
	data_end = (void *)(long)ctx->data_end;
	l3 = p->l3_off;
	l4 = p->l4_off;
	if (l3 > SYN_MAX_L3_OFF || l4 > SYN_L4_MASK)
		goto drop; /* a kilobyte of extension headers before a stray ACK */
	l4 &= SYN_L4_MASK;
	th = data + l4;
	if ((void *)(th + 1) > data_end)
		return SYN_CONTINUE; /* the parser saw it whole: cannot happen */
	/* Options that cannot be copied count as none, as before a walk. */
	opts = xdp_tcp_options(ctx, p);
	if (!opts)
		opts = &no_opts;
	ack = th->ack_seq;
	seq = bpf_ntohl(th->seq);
	if (syn_cookie_check(p, cfg, now, bpf_ntohl(ack) - 1, seq - 1, opts) >= 0) {
		syn_recent_note(p, ack, seq, now, 0);
		return SYN_CONTINUE; /* tc accepts it, and marks its tuple */
	}
	/* A segment right behind a valid cookie ACK, in the same poll: the
	 * stack makes the socket from the ACK before it gets to this one. */
	if (syn_recent_follows(p, ack, seq, now, 0))
		return SYN_CONTINUE;

	/* The kernel may have issued this ACK's cookie itself: before a flood
	 * was detected in auto mode, or when moat left a SYN to it. */
	if (syn_kernel_cookie(data, data_end, l3, th, p->family)) {
		/* The kernel makes the socket now; the census learns of it
		 * here, as the SYN's mark may be older than the floor. */
		syn_mark_packet(p);
		syn_recent_note(p, ack, seq, now, 0);
		return SYN_CONTINUE;
	}
	/* No socket and no cookie: the kernel would answer with a RST, and
	 * so does moat, within a budget (syn_reset_stray, which syn_defend
	 * calls: the verifier's stack of calls is too short from here). */
	return SYN_STRAY;
drop:
	st->acks_dropped++;
	return XDP_DROP;
}

/* The port's counters on this CPU if its ACKs (and SYN-ACKs) are filtered
 * now, with the SYN path's clock in *now; NULL if not. ACK filtering costs
 * a socket lookup per packet, so it runs only while cookies are being
 * issued: in always mode, and in auto mode during a flood and its hold
 * time. Established traffic otherwise pays the port's entry and nothing
 * more. Only a SYN clears flooding after the hold time: on a port that
 * gets none once the flood is over, the flood is over all the same, and
 * so is ACK filtering. */
static __always_inline struct syn_port_stats *syn_filtering(struct syn_port *port, struct packet *p,
							    __u64 *now)
{
	struct syn_port_stats *st;

	if (port->mode != SYN_MODE_ALWAYS && !(port->mode == SYN_MODE_AUTO && port->flooding))
		return NULL;
	st = syn_counters_of(port);
	if (!st)
		return NULL;
	*now = syn_clock(st, p);
	if (port->mode == SYN_MODE_AUTO && (__s64)(*now - port->flood_until_ns) > 0)
		return NULL;
	return st;
}

/* A SYN-ACK to a protected port while its ACKs are filtered: one that a
 * connection this host opened from the port owns goes on (its tuple
 * marked), and so does one no socket here owns (forwarded traffic). One
 * that only the local listener would take is as stray as an ACK no socket
 * owns, and the stack would answer each with a RST: dropped, counted
 * with the ACKs. A global function, for syn_defend's stack. */
__attribute__((noinline)) int syn_check_synack(struct xdp_md *ctx, struct packet *p,
					       struct syn_port_stats *st)
{
	if (!ctx || !p || !st)
		return SYN_CONTINUE;
	if (syn_mark_connecting(ctx, p) != BPF_TCP_LISTEN || !syn_local_listener(ctx, p, st))
		return SYN_CONTINUE;
	st->acks_dropped++;
	return XDP_DROP;
}

/* The XDP entry point of the SYN defence, called once the policy has let
 * the packet through. Returns an XDP action, SYN_RESET or SYN_CONTINUE. */
/* A global function: the verifier checks it once, not once for every path
 * through the parser that reaches the call. */
__attribute__((noinline)) int syn_defend(struct xdp_md *ctx, struct packet *p)
{
	if (!ctx || !p)
		return SYN_CONTINUE;
	struct syn_port_stats *st;
	struct syn_config *cfg;
	struct syn_port *port;
	__u64 now;
	__u32 key;
	__u8 flags;
	int ret;

	if (p->l4proto != IPPROTO_TCP || !p->has_l4)
		return SYN_CONTINUE;
	key = p->dport;
	port = bpf_map_lookup_elem(&syn_ports, &key);
	if (!port || port->mode == SYN_MODE_OFF)
		return SYN_CONTINUE;
	flags = p->tcp_flags;

	/* A SYN-ACK to a protected port answers a connection this host
	 * opened from it: the census learns of that socket here, before its
	 * peer's ACKs meet the ACK filter. Only of a socket that exists: a
	 * flood of SYN-ACKs (reflected, spoofed) marks nothing, and while
	 * ACKs are filtered it is dropped like theirs (syn_check_synack). */
	if ((flags & (TCPF_SYN | TCPF_ACK)) == (TCPF_SYN | TCPF_ACK)) {
		st = syn_filtering(port, p, &now);
		if (st)
			return syn_check_synack(ctx, p, st);
		syn_mark_connecting(ctx, p);
		return SYN_CONTINUE;
	}

	if ((flags & (TCPF_SYN | TCPF_ACK)) == TCPF_SYN) {
		st = syn_counters_of(port);
		cfg = syn_get_config();
		if (!st || !cfg)
			return SYN_CONTINUE;
		st->syns++;
		if (port->mode == SYN_MODE_NEVER)
			return SYN_CONTINUE;
		now = syn_clock(st, p);
		/* A SYN the kernel takes may become a socket that the next
		 * census pass is yet to see: its tuple is marked now. (Never
		 * mode needs no marks: protecting the port anew makes the
		 * census start over for it.) */
		if (port->mode == SYN_MODE_AUTO && !syn_flooding(port, st, cfg, now)) {
			syn_mark_packet(p);
			return SYN_CONTINUE;
		}
		ret = syn_answer(ctx, p, st, now);
		if (ret == SYN_CONTINUE) {
			st->syns_passed++;
			syn_mark_packet(p);
		}
		return ret;
	}

	if ((flags & (TCPF_SYN | TCPF_ACK | TCPF_RST)) == TCPF_ACK) {
		st = syn_filtering(port, p, &now);
		if (!st)
			return SYN_CONTINUE;
		ret = syn_check_ack(ctx, p, st, now);
		if (ret != SYN_STRAY)
			return ret;
		ret = syn_reset_stray(ctx, p, st, now);
		if (ret != SYN_CONTINUE) {
			st->cookies_rejected++;
			st->acks_dropped++;
		}
		return ret;
	}
	return SYN_CONTINUE;
}

/* Monitor mode leaves a protected port's SYNs and SYN-ACKs to the kernel,
 * past syn_defend, and the connections they make must be known to the
 * census when monitoring stops: the next pass may be a second away, and
 * until then their ACKs would meet the ACK filter as the listener's. So
 * their tuples are marked here, as syn_defend marks what it leaves to the
 * kernel. A global function, like syn_defend; returns 0. */
__attribute__((noinline)) int syn_note_monitored(struct xdp_md *ctx, struct packet *p)
{
	struct syn_port *port;
	__u32 key;
	__u8 flags;

	if (!ctx || !p || p->l4proto != IPPROTO_TCP || !p->has_l4)
		return 0;
	key = p->dport;
	port = bpf_map_lookup_elem(&syn_ports, &key);
	if (!port || port->mode == SYN_MODE_OFF)
		return 0;
	flags = p->tcp_flags & (TCPF_SYN | TCPF_ACK);
	if (flags == TCPF_SYN)
		syn_mark_packet(p);
	else if (flags == (TCPF_SYN | TCPF_ACK))
		syn_mark_connecting(ctx, p);
	return 0;
}

/* Parses an skb's headers with the XDP program's parser, IPv6 extension
 * headers included: cookies are only issued to SYNs without them, but the
 * third ACK may carry some (hop-by-hop, destination options), and the
 * stack takes such an ACK; passed on without its request socket, it would
 * meet the listener and draw a RST. The payload may be in page fragments
 * past data_end (a GRO packet; the first data segment that completes a
 * handshake whose third ACK was lost): paged. */
static __always_inline int syn_parse_skb(struct __sk_buff *skb, struct packet *p)
{
	return parse_frame((void *)(long)skb->data, (void *)(long)skb->data_end, p, 0, 1);
}

/* The tc ingress side: a valid moat cookie ACK for a listener becomes a
 * request socket carrying the options the cookie encodes. Never drops,
 * and never ends the chain: every packet goes on to the next tcx program
 * (SYN_TC_NEXT), a moat handshake with its request socket assigned. */
__attribute__((noinline)) int syn_accept_packet(struct __sk_buff *skb, struct packet *p);

static __always_inline int syn_accept(struct __sk_buff *skb)
{
	struct packet p = {};
	__u32 len = skb->len, want;

	/* Some drivers leave headers outside the linear area, where the
	 * parser cannot see them: only then, when the headers do not parse,
	 * are the first bytes (as many as headers can take) pulled in and
	 * parsed again. Traffic whose headers are linear never pays for a
	 * copy, whatever the length of its payload. */
	if (syn_parse_skb(skb, &p) != PARSE_OK) {
		want = len < SYN_PULL_LEN ? len : SYN_PULL_LEN;
		if ((__u32)((long)skb->data_end - (long)skb->data) >= want ||
		    bpf_skb_pull_data(skb, want))
			return SYN_TC_NEXT;
		__builtin_memset(&p, 0, sizeof(p));
		if (syn_parse_skb(skb, &p) != PARSE_OK)
			return SYN_TC_NEXT;
	}
	return syn_accept_packet(skb, &p);
}

/* Global, like syn_defend, so the parser's paths do not multiply it. */
__attribute__((noinline)) int syn_accept_packet(struct __sk_buff *skb, struct packet *p)
{
	struct bpf_tcp_req_attrs attrs = {};
	struct bpf_sock_tuple t = {};
	struct tcp_opt_walk w = {};
	struct syn_port_stats *st;
	struct syn_config *cfg;
	struct syn_port *port;
	struct tcp_sock *tsk;
	struct bpf_sock *sk;
	struct tcphdr *th;
	__u32 key, size, l4, optlen, net, seq;
	__u16 user_mss;
	int meta, wscale, err;
	__be32 ack;
	__u64 now;

	if (!skb || !p)
		return SYN_TC_NEXT;
	if (p->l4proto != IPPROTO_TCP || !p->has_l4)
		return SYN_TC_NEXT;
	if ((p->tcp_flags & (TCPF_SYN | TCPF_ACK | TCPF_RST)) != TCPF_ACK)
		return SYN_TC_NEXT;
	/* The first part of a fragmented segment is reassembled by the stack
	 * after tc: no request socket goes with a part. */
	if (p->first_fragment)
		return SYN_TC_NEXT;
	key = p->dport;
	port = bpf_map_lookup_elem(&syn_ports, &key);
	/* In auto mode cookies exist only during and shortly after a flood,
	 * in never mode only shortly after the port left cookie mode (the
	 * control plane then sets last_flood_ns); outside that the ACK path
	 * costs the port's entry and, after a flood, a clock read. */
	if (!port || port->mode == SYN_MODE_OFF || !(port->mode == SYN_MODE_ALWAYS || port->last_flood_ns))
		return SYN_TC_NEXT;
	cfg = syn_get_config();
	if (!cfg)
		return SYN_TC_NEXT;
	now = bpf_ktime_get_boot_ns();
	/* flooding is cleared only by a SYN after the hold: flood_until_ns
	 * says when a flood is over. */
	if (port->mode != SYN_MODE_ALWAYS &&
	    !(port->mode == SYN_MODE_AUTO && port->flooding && (__s64)(now - port->flood_until_ns) <= 0) &&
	    now - port->last_flood_ns >
		    (cfg->cookie_lifetime_ns ? cfg->cookie_lifetime_ns : SYN_DEFAULT_LIFETIME_NS))
		return SYN_TC_NEXT;

	size = syn_tuple(p, &t);
	sk = bpf_skc_lookup_tcp(skb, &t, size, BPF_F_CURRENT_NETNS, 0);
	if (!sk)
		return SYN_TC_NEXT;
	if (sk->state != BPF_TCP_LISTEN)
		goto release;

	l4 = p->l4_off;
	if (l4 > SYN_L4_MASK)
		goto release;
	l4 &= SYN_L4_MASK;
	th = (void *)(long)skb->data + l4;
	if ((void *)(th + 1) > (void *)(long)skb->data_end)
		goto release;
	optlen = th->doff * 4;
	if (optlen > sizeof(*th) && optlen - sizeof(*th) <= TCP_MAX_OPTLEN) {
		optlen -= sizeof(*th);
		if (bpf_skb_load_bytes(skb, l4 + sizeof(*th), w.buf, opt_copy_len(optlen)) == 0) {
			w.len = optlen;
			parse_tcp_options(&w);
		}
	}
	/* th stays valid: bpf_skb_load_bytes does not move packet data. */
	ack = th->ack_seq;
	seq = bpf_ntohl(th->seq);
	meta = syn_cookie_check(p, cfg, now, bpf_ntohl(ack) - 1, seq - 1, &w.opts);
	if (meta < 0)
		goto release;

	attrs.mss = syn_mss_value(meta >> SYN_COOKIE_MSS_SHIFT, p->family);
	wscale = meta & SYN_COOKIE_WSCALE_MASK;
	if (wscale != SYN_COOKIE_NO_WSCALE) {
		attrs.wscale_ok = 1;
		attrs.snd_wscale = wscale;
	}
	attrs.sack_ok = !!(meta & SYN_COOKIE_SACK);
	attrs.ecn_ok = !!(meta & SYN_COOKIE_ECN);
	/* A cookie checked with timestamps was made for a SYN with them (the
	 * hash says so), so they were agreed; TSecr is moat's TSval. */
	if (w.opts.has_ts) {
		attrs.tstamp_ok = 1;
		attrs.rcv_tsval = w.opts.tsval;
		attrs.rcv_tsecr = w.opts.tsecr;
	}

	st = syn_counters_of(port);
	tsk = bpf_skc_to_tcp_sock(sk);
	/* The scale the SYN-ACK announced, reckoned again from the listener. */
	if (attrs.wscale_ok)
		attrs.rcv_wscale = syn_rcv_wscale(syn_listener_scale(tsk), cfg);
	/* The listener's TCP_MAXSEG caps what the connection sends, as the
	 * kernel caps a request's MSS with it (tcp_parse_options). The kfunc
	 * takes nothing below the family's minimum MSS, so a smaller
	 * TCP_MAXSEG caps at that minimum. */
	user_mss = syn_user_mss(tsk);
	if (user_mss && user_mss < attrs.mss) {
		attrs.mss = user_mss;
		if (attrs.mss < (p->family == 4 ? IPV4_MIN_MSS : IPV6_MIN_MSS))
			attrs.mss = p->family == 4 ? IPV4_MIN_MSS : IPV6_MIN_MSS;
	}
	/* Settings turned off in the namespace since the SYN-ACK went out:
	 * the kfunc would refuse SACK and timestamps, which the connection
	 * can do without (the client's are ignored). Window scaling it
	 * cannot: both sides would read windows differently, so that refusal
	 * stands; and with tcp_syncookies 0 the stack would ignore the
	 * request socket. (ECN the stack itself drops when tcp_ecn is 0.) */
	net = syn_net_settings(tsk);
	if (!(net & SYN_NET_SACK))
		attrs.sack_ok = 0;
	if (!(net & SYN_NET_TS)) {
		attrs.tstamp_ok = 0;
		attrs.rcv_tsval = 0;
		attrs.rcv_tsecr = 0;
	}
	/* The first data segment carries the cookie of the ACK ahead of it
	 * in the same poll: the stack makes the socket from the ACK's request
	 * socket, and finds it for this one. Not while the listener's accept
	 * queue is full: the stack then drops the ACK's connection, and this
	 * segment, handed over without a request socket of its own, would
	 * reach the listener and draw a RST; with one it is dropped as the
	 * ACK was, and the client sends it again. */
	if (syn_recent_follows(p, ack, seq, now, 1) && !syn_accept_queue_full(tsk))
		goto release;
	/* NAT would orphan the request socket (SYN_NET_NAT4): counted as an
	 * accept error, which it is. */
	if (!tsk || !(net & SYN_NET_COOKIES) || (net & syn_net_nat_bit(p->family))) {
		err = -1;
	} else {
		err = bpf_sk_assign_tcp_reqsk(skb, (struct sock *)tsk, &attrs, sizeof(attrs));
		if (!err)
			syn_recent_note(p, ack, seq, now, 1);
	}
	if (st) {
		if (err)
			st->accept_errors++;
		else if (syn_accept_queue_full(tsk))
			st->accept_queue_full++;
		else
			st->cookies_accepted++;
	}
	/* moat's handshake: the request socket is assigned, the stack takes
	 * it from here, and the census learns of its tuple at once. The tcx
	 * programs after this one still judge the packet (an ingress
	 * firewall that denies the client drops it, and with it the
	 * handshake): the assignment stands whatever they return but a drop. */
	if (!err)
		syn_mark_packet(p);
release:
	bpf_sk_release(sk);
	return SYN_TC_NEXT;
}

/* One socket of a census pass (struct bpf_iter__tcp: every TCP socket of
 * the namespace that opened the iterator, listeners, request and
 * time-wait sockets included). A socket on a protected port, other than a
 * listener, marks its tuple's slot with the pass's generation. */
static __always_inline int syn_census_visit(struct sock_common___moat *sk)
{
	struct syn_census_table *c;
	struct syn_port *port;
	__u32 client[4] = {}, server[4] = {};
	__u32 key;
	int family;

	if (!sk || sk->skc_state == BPF_TCP_LISTEN)
		return 0;
	key = sk->skc_num;
	port = bpf_map_lookup_elem(&syn_ports, &key);
	if (!port || port->mode == SYN_MODE_OFF)
		return 0;
	c = syn_get_census();
	if (!c)
		return 0;
	if (sk->skc_family == AF_INET) {
		family = 4;
		client[0] = sk->skc_daddr;
		server[0] = sk->skc_rcv_saddr;
	} else if (sk->skc_family == AF_INET6) {
		BPF_CORE_READ_INTO(&client, sk, skc_v6_daddr.in6_u.u6_addr32);
		BPF_CORE_READ_INTO(&server, sk, skc_v6_rcv_saddr.in6_u.u6_addr32);
		family = 6;
		/* An IPv4 peer of a dual-stack socket (::ffff:a.b.c.d) sends
		 * IPv4 packets: its tuple is hashed as one. */
		if (!client[0] && !client[1] && client[2] == bpf_htonl(0xffff)) {
			family = 4;
			client[0] = client[3];
			server[0] = server[3];
			client[1] = client[2] = client[3] = 0;
			server[1] = server[2] = server[3] = 0;
		}
	} else {
		return 0;
	}
	syn_census_mark(c, syn_census_slot(family, client, server, bpf_ntohs(sk->skc_dport), key));
	c->sockets++;
	return 0;
}

/* Types the control plane needs but no map declares, so that they reach
 * BTF and bpf2go generates them. */
struct syn_exported_types {
	enum syn_mode mode;
	enum syn_cookie_bits bits;
	struct syn_cookie_msg msg;
	struct syn_cookie_msg_v4 msg_v4;
};
const struct syn_exported_types *unused_syn_exported_types __attribute__((unused));

#endif /* MOAT_SYNCOOKIE_H */
