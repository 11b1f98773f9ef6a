// SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause
/* The moat XDP filter. Policy, in order: allowlist, denylist, port drop
 * rules, rate limits and flood budgets, fragment and malformed policy, SYN
 * defence, port allow rules, pass. */
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

#include "moat_consts.h"
#include "moat_structs.h"
#include "moat_maps.h"
#include "parsing.h"
#include "policy.h"
#include "syncookie.h"
#include "capture.h"
#include "ratelimit.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

/* Types the control plane needs but no map declares; referenced here so
 * that they reach BTF and bpf2go generates them. */
struct exported_types {
	struct host_v4 host_v4;
	struct host_v6 host_v6;
	enum verdict_reason reason;
	enum port_class port_class;
	enum rule_action action;
	enum fragment_policy fragments;
	enum malformed_policy malformed;
	enum allow_in_use allow_in_use;
	enum deny_summary_geometry summary_geometry;
	enum deny_summary_family summary_family;
	struct summary_or_args summary_or_args;
};
const struct exported_types *unused_exported_types __attribute__((unused));

static __always_inline struct runtime_settings *get_settings(void)
{
	__u32 zero = 0;

	return bpf_map_lookup_elem(&settings, &zero);
}

/* Counts the packet under its reason and verdict and returns the action.
 * In monitor mode a drop passes instead, counted in the reason's monitored
 * slot; capture records the pass, marked monitored. */
static __always_inline int verdict(struct xdp_md *ctx, const struct runtime_settings *cfg,
				   enum verdict_reason reason, int action)
{
	__u32 idx = reason * 2 + (action == XDP_DROP);
	struct verdict_counter *c;
	int monitored = 0;

	if (action == XDP_DROP && cfg->monitor) {
		idx = REASON_MAX * 2 + reason;
		action = XDP_PASS;
		monitored = 1;
	}
	c = bpf_map_lookup_elem(&counters, &idx);
	if (c) {
		c->packets++;
		c->bytes += ctx->data_end - ctx->data;
	}
	capture_hook(ctx, reason, action, monitored); /* moat dump (capture.h): a branch while off */
	return action;
}

/* A drop verdict of the lists or the rate limits. In monitor mode the
 * packet passes instead, and a protected port's SYN or SYN-ACK passed so
 * makes a connection the census must know of, as those past syn_defend
 * (see there). */
static __always_inline int policy_drop(struct xdp_md *ctx, const struct runtime_settings *cfg,
				       struct packet *p, enum verdict_reason reason)
{
	if (cfg->monitor)
		syn_note_monitored(ctx, p);
	return verdict(ctx, cfg, reason, XDP_DROP);
}

SEC("xdp")
int moat_filter(struct xdp_md *ctx)
{
	struct packet pkt = {};
	struct runtime_settings *cfg;
	struct prefix_rule *rule;
	struct port_rule *prule;
	int ret, ret2;

	cfg = get_settings();
	if (!cfg) /* cannot happen for an array map; keeps the verifier content */
		return XDP_PASS;

	ret = parse_packet(ctx, &pkt);
	if (ret == PARSE_NON_IP)
		return verdict(ctx, cfg, REASON_NON_IP, XDP_PASS);
	/* Headers the stack would see through and the filter cannot: no
	 * policy passes them, or they would pass every rule (parsing.h). */
	if (ret == PARSE_EVASIVE)
		return verdict(ctx, cfg, REASON_MALFORMED, XDP_DROP);
	if (ret == PARSE_MALFORMED && (!pkt.addr_ok || cfg->malformed == MALFORMED_DROP))
		return verdict(ctx, cfg, REASON_MALFORMED,
			       cfg->malformed == MALFORMED_DROP ? XDP_DROP : XDP_PASS);

	/* From here the source address is whole. */
	rule = match_allow(&pkt, cfg->allow_in_use);
	if (rule) {
		__sync_fetch_and_add(&rule->hits, 1);
		/* Trusted SYNs skip the SYN defence, and their connections
		 * would lose that trust with the allowlist entry: the census
		 * learns of them here (syncookie.h). */
		if (pkt.l4proto == IPPROTO_TCP && pkt.has_l4 &&
		    (pkt.tcp_flags & (TCPF_SYN | TCPF_ACK)) == TCPF_SYN)
			syn_mark_packet(&pkt);
		return verdict(ctx, cfg, REASON_ALLOWLIST, XDP_PASS);
	}
	rule = match_deny(&pkt);
	if (rule) {
		__sync_fetch_and_add(&rule->hits, 1);
		return policy_drop(ctx, cfg, &pkt, REASON_DENYLIST);
	}

	/* Port rules judge whole packets with their L4 header: not malformed
	 * ones (passed by policy) nor non-first fragments. A drop rule decides
	 * before the rate limits: a packet dropped anyway must not spend a
	 * budget that other traffic shares, nor count against its source. */
	prule = NULL;
	if (ret != PARSE_MALFORMED && !pkt.fragment) {
		prule = match_port(&pkt);
		if (prule && prule->action == ACTION_DROP) {
			port_hit(prule);
			rl_check(ctx, &pkt, 1); /* the attack shape and heavy hitters see it */
			return policy_drop(ctx, cfg, &pkt, REASON_PORT_DROP);
		}
	}

	/* Rate limits and flood budgets (ratelimit.h): after the lists, so
	 * allowlisted sources are never limited and auto-blocked ones stop at
	 * the denylist; before the fragment and malformed verdicts, so
	 * fragments and malformed packets count against their source too. */
	ret2 = rl_check(ctx, &pkt, 0);
	if (ret2 == RL_CHECK_COOKIE) {
		pkt.on_connection = rl_cookie_ack(ctx, &pkt) ? RL_CONN_YES : RL_CONN_NO;
		ret2 = rl_check(ctx, &pkt, 0);
	}
	switch (ret2) {
	case RL_DROP_SOURCE:
		return policy_drop(ctx, cfg, &pkt, REASON_RATELIMIT);
	case RL_DROP_BUDGET:
		return policy_drop(ctx, cfg, &pkt, REASON_BUDGET);
	}

	if (ret == PARSE_MALFORMED) /* malformed L4, passed by policy */
		return verdict(ctx, cfg, REASON_MALFORMED, XDP_PASS);
	if (pkt.fragment)
		return verdict(ctx, cfg, REASON_FRAGMENT,
			       cfg->fragments == FRAGMENTS_DROP ? XDP_DROP : XDP_PASS);

	/* SYN flood defence (syncookie.h): answers SYNs with cookies, drops
	 * ACKs that fit no socket. Per port in syn_counters, per interface
	 * here. Monitor mode leaves SYNs and ACKs to the kernel: a SYN-ACK
	 * sent is no verdict that could be counted and then not enforced. It
	 * still marks the census with the connections the kernel makes, whose
	 * ACKs the filter judges once monitoring stops. */
	if (!cfg->monitor) {
		ret = syn_defend(ctx, &pkt);
		if (ret == XDP_TX)
			return verdict(ctx, cfg, REASON_SYN_COOKIE, XDP_TX);
		if (ret == SYN_RESET) /* a stray ACK answered with a RST */
			return verdict(ctx, cfg, REASON_SYN_DEFENCE, XDP_TX);
		if (ret != SYN_CONTINUE)
			return verdict(ctx, cfg, REASON_SYN_DEFENCE, ret);
	} else {
		syn_note_monitored(ctx, &pkt);
	}

	if (prule) {
		port_hit(prule);
		return verdict(ctx, cfg, REASON_PORT_ALLOW, XDP_PASS);
	}
	return verdict(ctx, cfg, REASON_PASS, XDP_PASS);
}

/* ORs args->w into block args->block of summary map m: an atomic OR, so
 * that it never undoes a bit the data path set meanwhile, which writing
 * the block from user space could. */
static __always_inline int summary_or(void *m, struct summary_or_args *args)
{
	__u32 blk = args->block;
	struct summary_block *b = bpf_map_lookup_elem(m, &blk);
	int i;

	if (!b)
		return -1;
#pragma unroll
	for (i = 0; i < SUMMARY_BLOCK_WORDS; i++) {
		__u64 v = args->w[i];

		if (v)
			__sync_fetch_and_or(&b->w[i], v);
	}
	return 0;
}

/* Run by the control plane (BPF_PROG_TEST_RUN) to set deny summary bits. */
SEC("syscall")
int deny_summary_or(struct summary_or_args *args)
{
	return summary_or(&deny_summary, args);
}

/* The same for the host summary. */
SEC("syscall")
int deny_host_summary_or(struct summary_or_args *args)
{
	return summary_or(&deny_host_summary, args);
}

/* One CPU's step of syn_set_census_from. */
static long syn_census_from_cpu(__u64 cpu, void *ctx)
{
	struct syn_census_from_args *args = ctx;
	__u32 slot = args->slot;
	struct syn_port_stats *st;

	st = bpf_map_lookup_percpu_elem(&syn_counters, &slot, cpu);
	if (!st)
		return 1; /* no such CPU or slot: stop */
	st->census_from = args->from;
	args->done++;
	return 0;
}

/* Run by the control plane (BPF_PROG_TEST_RUN) to set a protected port's
 * census_from on CPUs 0 to cpus - 1: a store into that field of each
 * CPU's value, where writing the per-CPU values from user space would put
 * back, over the counts the data path made meanwhile, what it had read.
 * args->done says how many CPUs were set. */
SEC("syscall")
int syn_set_census_from(struct syn_census_from_args *args)
{
	struct syn_census_from_args a = *args;

	a.done = 0;
	bpf_loop(a.cpus, syn_census_from_cpu, &a, 0);
	args->done = a.done;
	return 0;
}

/* tc ingress half of the SYN defence: accepts moat cookie handshakes. */
SEC("tc")
int moat_syn_accept(struct __sk_buff *skb)
{
	return syn_accept(skb);
}

/* Kernel-side types of the census iterator's context (CO-RE). */
struct bpf_iter_meta___moat {
	void *seq;
} __attribute__((preserve_access_index));

struct bpf_iter__tcp___moat {
	struct bpf_iter_meta___moat *meta;
	struct sock_common___moat *sk_common;
} __attribute__((preserve_access_index));

/* The socket census pass (syncookie.h, struct syn_census_table): the control
 * plane reads this iterator to its end every second or so. */
SEC("iter/tcp")
int moat_syn_census(struct bpf_iter__tcp___moat *ctx)
{
	return syn_census_visit(ctx->sk_common);
}
