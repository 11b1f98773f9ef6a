/* SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause */
/* Maps of the SYN flood defence, shared by the XDP program that issues
 * cookies and the tc program that accepts them. */
#ifndef MOAT_SYN_MAPS_H
#define MOAT_SYN_MAPS_H

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

#include "syn_structs.h"

/* Indexed by TCP destination port: one array lookup per TCP packet is all
 * an unprotected port costs. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 65536);
	__type(key, __u32);
	__type(value, struct syn_port);
} syn_ports SEC(".maps");

/* Counters and flood windows of protected ports, in the slot that
 * syn_port.slot names: an array, so that a SYN finds them without a hash
 * lookup. The control plane clears a slot before it hands it out. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, MAX_SYN_PORTS + 1);
	__type(key, __u32);
	__type(value, struct syn_port_stats);
} syn_counters SEC(".maps");

/* Cookie keys, slot generation & 1 is current. Write-only from user space
 * so that no dump or export can show them. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 2);
	__uint(map_flags, BPF_F_WRONLY);
	__type(key, __u32);
	__type(value, struct syn_key);
} syn_keys SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct syn_key_state);
} syn_rotation SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct syn_config);
} syn_settings SEC(".maps");

/* The socket census (struct syn_census_table). Mappable: the control plane
 * writes its header through mmap, field by field. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__uint(map_flags, BPF_F_MMAPABLE);
	__type(key, __u32);
	__type(value, struct syn_census_table);
} syn_census SEC(".maps");

/* Handshakes just validated, by the low bits of their census slot
 * (struct syn_recent). A collision overwrites: the segments behind the
 * older handshake are then judged as before, one by one. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, SYN_RECENT_SLOTS);
	__type(key, __u32);
	__type(value, struct syn_recent);
} syn_recent SEC(".maps");

/* The budget of stray-ACK resets (struct syn_rst_bucket): not pinned, a
 * fresh one comes with each program. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct syn_rst_bucket);
} syn_rst_budget SEC(".maps");

#endif /* MOAT_SYN_MAPS_H */
