/* SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause */
/* Maps of packet capture (moat dump), shared by every interface. Included
 * from moat_maps.h. */
#ifndef MOAT_CAPTURE_MAPS_H
#define MOAT_CAPTURE_MAPS_H

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

#include "capture_structs.h"

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct capture_config);
} capture_settings SEC(".maps");

/* Records: struct capture_record and the frame's bytes. */
struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, CAPTURE_RING_SIZE);
} capture_ring SEC(".maps");

/* Records that did not fit in the ring, per CPU. Never reset: a reader
 * counts from the value it finds at its start. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} capture_lost SEC(".maps");

/* Matching packets seen, per CPU, for 1-in-N sampling. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} capture_seen SEC(".maps");

#endif /* MOAT_CAPTURE_MAPS_H */
