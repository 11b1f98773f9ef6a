/* SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause */
/* Maps of the rate limits, flood budgets, heavy hitters and attack shape.
 * All are shared by every attached interface (internal/shield pins them). */
#ifndef MOAT_RATELIMIT_MAPS_H
#define MOAT_RATELIMIT_MAPS_H

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

#include "moat_consts.h"
#include "ratelimit_structs.h"

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, MAX_RL_RULES);
	__type(key, __u32);
	__type(value, struct rl_rule);
} rl_rules SEC(".maps");

/* Scope tables. Port scopes are indexed like port_rules, (class << 16) |
 * port; class scopes by class, with RL_CLASS_ALL for all traffic. The most
 * specific slot with a rule of a kind decides for that kind. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, PORT_TABLE_SIZE);
	__type(key, __u32);
	__type(value, struct rl_slot);
} rl_port_scopes SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, RL_CLASS_SLOTS);
	__type(key, __u32);
	__type(value, struct rl_slot);
} rl_class_scopes SEC(".maps");

/* Flood budgets: one bucket per budget rule, shared by every CPU (updated
 * with compare-and-swap) so that the ceiling is global. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, MAX_RL_RULES);
	__type(key, __u32);
	__type(value, struct rl_bucket);
} rl_budgets SEC(".maps");

/* Buckets of sources that crossed the sketch threshold. A common LRU (not
 * per CPU) so that one source's bucket is one bucket whatever CPU its
 * packets land on. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, MAX_RL_SOURCES);
	__type(key, struct rl_src_key);
	__type(value, struct rl_src_state);
} rl_sources SEC(".maps");

/* Count-min sketch of packets per (rule, source) in the current window.
 * Each cell is (window << 32) | count, so a cell from an old window reads
 * as zero and nothing has to clear the sketch. Shared, not per CPU: a
 * source spread over CPUs must still reach its threshold. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, RL_SKETCH_ROWS * RL_SKETCH_WIDTH);
	__type(key, __u32);
	__type(value, __u64);
} rl_sketch SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, MAX_RL_RULES);
	__type(key, __u32);
	__type(value, struct rl_rule_stats);
} rl_stats SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct rl_config);
} rl_settings SEC(".maps");

/* Heavy hitters: sampled packets and bytes per source. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, MAX_HH_SOURCES);
	__type(key, struct rl_src_key);
	__type(value, struct hh_counts);
} hh_sources SEC(".maps");

/* The admission gate of hh_sources (hh_count): per slot, a sampled
 * source's fingerprint in the high 32 bits, and that sample's frame length
 * (bits 0-29), whether a limit dropped it (bit 31) and whether one would
 * have and monitor mode passed it (bit 30) in the low ones; 0 when empty.
 * Shared by the CPUs, so a source whose samples land on different CPUs
 * still meets its fingerprint; one per loaded filter (an interface), not
 * pinned, so a filter that starts afresh starts with an empty gate. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, HH_GATE_SLOTS);
	__type(key, __u32);
	__type(value, __u64);
} hh_gate SEC(".maps");

/* The key of the gate's fingerprints, drawn from the CSPRNG by the loader
 * (internal/shield) for every filter it loads: sources chosen to share a
 * slot and a fingerprint, and so to walk through the gate, cannot be
 * worked out in advance. */
volatile const __u64 hh_seed;

/* Packets each CPU lets go by before its next heavy-hitter sample. Not
 * shared: a program that starts afresh just samples its first packet. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u32);
} hh_countdown SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct attack_shape);
} shape SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, SHAPE_PORT_BLOCKS);
	__type(key, __u32);
	__type(value, struct shape_port_block);
} shape_ports SEC(".maps");

#endif /* MOAT_RATELIMIT_MAPS_H */
