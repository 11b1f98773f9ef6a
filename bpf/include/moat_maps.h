/* SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause */
/* The maps of the filter. Rule maps are shared by every attached interface;
 * the counters map is created once per interface. */
#ifndef MOAT_MAPS_H
#define MOAT_MAPS_H

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

#include "moat_consts.h"
#include "moat_structs.h"
#include "syn_maps.h" /* SYN flood defence maps */
#include "capture_maps.h" /* packet capture (moat dump) */

/* Exact hosts live in hash maps beside the tries: a lookup costs the same
 * however full the map is, and per-bucket locks let every CPU load one map
 * at once, where a trie takes one lock per insert. Loading alone would not
 * decide it (kernel 6.18, 2 vCPUs, kernel CPU time for 600k IPv4 /32s):
 * 0.7 s into this map, 0.8 s into a trie in address order, 1.9 s in random
 * order. No preallocation: a preallocated map loads twice as fast but holds
 * max_entries elements from its creation on (192 MiB for 2M IPv4 hosts,
 * empty or not), where this one takes about 84 bytes per stored element
 * plus 16 per slot of max_entries (32 MiB at 2M). */
#define HOST_MAP(name, key_type, size)                 \
	struct {                                       \
		__uint(type, BPF_MAP_TYPE_HASH);       \
		__uint(max_entries, size);             \
		__uint(map_flags, BPF_F_NO_PREALLOC);  \
		__type(key, key_type);                 \
		__type(value, struct prefix_rule);     \
	} name SEC(".maps")

#define NET_MAP(name, key_type, size)                  \
	struct {                                       \
		__uint(type, BPF_MAP_TYPE_LPM_TRIE);   \
		__uint(max_entries, size);             \
		__uint(map_flags, BPF_F_NO_PREALLOC);  \
		__type(key, key_type);                 \
		__type(value, struct prefix_rule);     \
	} name SEC(".maps")

HOST_MAP(allow_v4_hosts, struct host_v4, MAX_ALLOW_HOSTS);
HOST_MAP(allow_v6_hosts, struct host_v6, MAX_ALLOW_HOSTS);
NET_MAP(allow_v4_nets, struct net_v4, MAX_ALLOW_NETS);
NET_MAP(allow_v6_nets, struct net_v6, MAX_ALLOW_NETS);

HOST_MAP(deny_v4_hosts, struct host_v4, MAX_DENY_HOSTS);
HOST_MAP(deny_v6_hosts, struct host_v6, MAX_DENY_HOSTS);
NET_MAP(deny_v4_nets, struct net_v4, MAX_DENY_NETS);
NET_MAP(deny_v6_nets, struct net_v6, MAX_DENY_NETS);

/* The deny summary (enum deny_summary_geometry): 2.6 MB, allocated whole. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, SUMMARY_BLOCKS);
	__type(key, __u32);
	__type(value, struct summary_block);
} deny_summary SEC(".maps");

/* The host summary (enum deny_summary_family): as large again. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, SUMMARY_BLOCKS);
	__type(key, __u32);
	__type(value, struct summary_block);
} deny_host_summary SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct summary_state);
} deny_summary_state SEC(".maps");

/* Comments of allow and deny entries; only entries with a comment have one. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_COMMENTS);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct comment_key);
	__type(value, struct comment);
} comments SEC(".maps");

/* Reasons of the rate limits' auto-blocks, keyed as comments are. Apart
 * from the comments, so that a flood's blocks never take the room of the
 * operators' comments; when it is full, the reason written longest ago
 * gives way, and its entry is listed without one. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, MAX_AUTO_REASONS);
	__type(key, struct comment_key);
	__type(value, struct comment);
} auto_reasons SEC(".maps");

/* Protocol/port and ICMP type rules, indexed by (class << 16) | port. A range
 * rule fills every port it covers with the same id. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, PORT_TABLE_SIZE);
	__type(key, __u32);
	__type(value, struct port_rule);
} port_rules SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, MAX_PORT_RULES);
	__type(key, __u32);
	__type(value, __u64);
} port_rule_hits SEC(".maps");

/* The rules by id, for the control plane only. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, MAX_PORT_RULES);
	__type(key, __u32);
	__type(value, struct port_rule_def);
} port_rule_defs SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct runtime_settings);
} settings SEC(".maps");

/* Per interface: packets and bytes by reason and verdict, indexed by
 * reason * 2 + (verdict == XDP_DROP), then, from REASON_MAX * 2, by
 * reason alone for the drops monitor mode passed. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, REASON_MAX * 3);
	__type(key, __u32);
	__type(value, struct verdict_counter);
} counters SEC(".maps");

#endif /* MOAT_MAPS_H */
