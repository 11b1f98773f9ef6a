package flood

import (
	"errors"
	"fmt"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
)

// Counts is what a Counter saw, by kind of frame.
type Counts struct {
	TCPSyn    uint64 `json:"tcp_syn"`
	TCPOther  uint64 `json:"tcp_other"`
	UDP       uint64 `json:"udp"`
	ICMP      uint64 `json:"icmp"`
	Other     uint64 `json:"other"`
	Malformed uint64 `json:"malformed"`
}

// Total is the number of frames counted.
func (c Counts) Total() uint64 {
	return c.TCPSyn + c.TCPOther + c.UDP + c.ICMP + c.Other + c.Malformed
}

// Counter is an XDP program on a receiving device that counts frames by
// kind and drops them, or passes them on to the stack: the far end of a
// flood in tests and measurements.
type Counter struct {
	prog   *ebpf.Program
	counts *ebpf.Map
	link   link.Link
}

// AttachCounter attaches a Counter to a device in the calling OS thread's
// network namespace, in native mode. With pass, counted frames go on to the
// stack; without, they are dropped.
func AttachCounter(ifindex int, pass bool) (*Counter, error) {
	spec, err := LoadFlood()
	if err != nil {
		return nil, err
	}
	if err := spec.Variables[FloodVarCfgCountPass].Set(pass); err != nil {
		return nil, err
	}
	var objs struct {
		Prog   *ebpf.Program `ebpf:"flood_count"`
		Counts *ebpf.Map     `ebpf:"flood_counts"`
	}
	if err := spec.LoadAndAssign(&objs, nil); err != nil {
		return nil, fmt.Errorf("load counter: %w", err)
	}
	l, err := link.AttachXDP(link.XDPOptions{Program: objs.Prog, Interface: ifindex, Flags: link.XDPDriverMode})
	if err != nil {
		objs.Prog.Close()
		objs.Counts.Close()
		return nil, fmt.Errorf("attach counter to interface %d: %w", ifindex, err)
	}
	return &Counter{prog: objs.Prog, counts: objs.Counts, link: l}, nil
}

// Counts sums the per-CPU counters.
func (c *Counter) Counts() (Counts, error) {
	var out Counts
	slots := []struct {
		slot FloodCountSlot
		dst  *uint64
	}{
		{FloodCountSlotFLOOD_COUNT_TCP_SYN, &out.TCPSyn},
		{FloodCountSlotFLOOD_COUNT_TCP_OTHER, &out.TCPOther},
		{FloodCountSlotFLOOD_COUNT_UDP, &out.UDP},
		{FloodCountSlotFLOOD_COUNT_ICMP, &out.ICMP},
		{FloodCountSlotFLOOD_COUNT_OTHER, &out.Other},
		{FloodCountSlotFLOOD_COUNT_MALFORMED, &out.Malformed},
	}
	for _, s := range slots {
		var perCPU []uint64
		if err := c.counts.Lookup(uint32(s.slot), &perCPU); err != nil {
			return Counts{}, fmt.Errorf("read counter %d: %w", s.slot, err)
		}
		for _, n := range perCPU {
			*s.dst += n
		}
	}
	return out, nil
}

// Close detaches the program.
func (c *Counter) Close() error {
	return errors.Join(c.link.Close(), c.prog.Close(), c.counts.Close())
}

// Dropper is an XDP program that drops every frame: the cheapest receiver,
// for measuring the generator itself.
type Dropper struct {
	prog *ebpf.Program
	link link.Link
}

// AttachDropper attaches a Dropper like AttachCounter does.
func AttachDropper(ifindex int) (*Dropper, error) {
	spec, err := LoadFlood()
	if err != nil {
		return nil, err
	}
	var objs struct {
		Prog *ebpf.Program `ebpf:"flood_drop"`
	}
	if err := spec.LoadAndAssign(&objs, nil); err != nil {
		return nil, fmt.Errorf("load dropper: %w", err)
	}
	l, err := link.AttachXDP(link.XDPOptions{Program: objs.Prog, Interface: ifindex, Flags: link.XDPDriverMode})
	if err != nil {
		objs.Prog.Close()
		return nil, fmt.Errorf("attach dropper to interface %d: %w", ifindex, err)
	}
	return &Dropper{prog: objs.Prog, link: l}, nil
}

// Close detaches the program.
func (d *Dropper) Close() error {
	return errors.Join(d.link.Close(), d.prog.Close())
}
