package ratelimit_test

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"

	"github.com/moat-shield/moat/internal/ratelimit"
)

// varySource returns an XDP program that rewrites the IPv4 source of the
// frame to the next address of 10.0.0.0/8 under mask and tail-calls
// target. BPF_PROG_TEST_RUN keeps the frame between repetitions, so a run
// of N repetitions shows target N sources, each once when N <= mask+1.
// The kernel times the runs with the clock stopped while the thread is
// rescheduled, which makes ns per packet far steadier on a loaded machine
// than any flood.
func varySource(tb testing.TB, target *ebpf.Program, mask uint32) *ebpf.Program {
	tb.Helper()
	pa, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.ProgramArray, KeySize: 4, ValueSize: 4, MaxEntries: 1})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { pa.Close() })
	if err := pa.Put(uint32(0), target); err != nil {
		tb.Fatal(err)
	}
	const saddrOff = 14 + 12 // Ethernet, then the IPv4 source
	prog, err := ebpf.NewProgramWithOptions(&ebpf.ProgramSpec{
		Type:       ebpf.XDP,
		AttachType: ebpf.AttachXDP, // a tail call needs what the target was loaded with
		License:    "GPL",
		Instructions: asm.Instructions{
			asm.Mov.Reg(asm.R6, asm.R1),
			asm.LoadMem(asm.R2, asm.R1, 0, asm.Word), // data
			asm.LoadMem(asm.R3, asm.R1, 4, asm.Word), // data_end
			asm.Mov.Reg(asm.R4, asm.R2),
			asm.Add.Imm(asm.R4, saddrOff+4),
			asm.JGT.Reg(asm.R4, asm.R3, "out"),
			asm.LoadMem(asm.R5, asm.R2, saddrOff, asm.Word),
			asm.HostTo(asm.BE, asm.R5, asm.Word),
			asm.Add.Imm(asm.R5, 1),
			asm.And.Imm(asm.R5, int32(mask)),
			asm.Or.Imm(asm.R5, 0x0a000000),
			asm.HostTo(asm.BE, asm.R5, asm.Word),
			asm.StoreMem(asm.R2, saddrOff, asm.R5, asm.Word),
			asm.Mov.Reg(asm.R1, asm.R6),
			asm.LoadMapPtr(asm.R2, pa.FD()),
			asm.Mov.Imm(asm.R3, 0),
			asm.FnTailCall.Call(),
			asm.Mov.Imm(asm.R0, 2).WithSymbol("out"), // the tail call failed
			asm.Return(),
		},
	}, ebpf.ProgramOptions{LogLevel: ebpf.LogLevelBranch})
	if err != nil {
		tb.Fatalf("%+v", err)
	}
	tb.Cleanup(func() { prog.Close() })
	return prog
}

// BenchmarkPathCost reports the ns per packet that the rate-limit stage
// adds, with 1,024 and with 10,000,000 distinct sources, and the cost of
// the attack-shape counters and heavy-hitter sampling. Run with
//
//	go test -run '^$' -bench PathCost -benchtime 1x ./internal/ratelimit/
func BenchmarkPathCost(b *testing.B) {
	f := newFilter(b)
	pkt := udp4(netip.MustParseAddr("10.0.0.1"), 9)
	thousand := varySource(b, f.prog, 0x3ff)    // 1,024 sources
	distinct := varySource(b, f.prog, 0xffffff) // 16.7M: 10M runs see each once
	const reps = 10_000_000

	off := ratelimit.Config{Gate: ratelimit.GateSample}
	high := ratelimit.Limit{Kind: ratelimit.Source, Scope: mustScope("udp"), PPS: 1e8}
	low := ratelimit.Limit{Kind: ratelimit.Source, Scope: mustScope("udp"), PPS: 1000}
	withGate := func(g ratelimit.Gate) ratelimit.Config { c := off; c.Gate = g; return c }

	measure := func(p *ebpf.Program, cfg ratelimit.Config, n int, limits ...ratelimit.Limit) float64 {
		f.reset(cfg)
		if err := ratelimit.Apply(f.rl, limits); err != nil {
			b.Fatal(err)
		}
		_, d, err := p.Benchmark(pkt, n, nil)
		if err != nil {
			b.Fatal(err)
		}
		return float64(d) / float64(time.Nanosecond)
	}
	type row struct {
		name string
		ns   float64
		base float64
	}
	var rows []row
	// Each configuration against its own baseline: the same program and
	// sources with no limit and both switches off.
	for round := 0; round < 2; round++ {
		b1 := measure(thousand, off, reps)
		b10 := measure(distinct, off, reps)
		bs := measure(f.prog, off, reps)
		rows = append(rows,
			row{"shape counters on, 1,024 sources", measure(thousand, ratelimit.Config{Shape: true, Gate: ratelimit.GateSample}, reps), b1},
			row{"heavy hitters on (1/64), 1,024 sources", measure(thousand, ratelimit.Config{HeavyHitters: true, Sample: 64, Gate: ratelimit.GateSample}, reps), b1},
			row{"heavy hitters on (1/64), 10M sources", measure(distinct, ratelimit.Config{HeavyHitters: true, Sample: 64, Gate: ratelimit.GateSample}, reps), b10},
			row{"source limit, 1,024 sources under it", measure(thousand, off, reps, high), b1},
			row{"source limit, 1 source over it (dropped)", measure(f.prog, off, reps, low), bs},
			row{"source limit, 10M sources once, gate sample", measure(distinct, withGate(ratelimit.GateSample), reps, low), b10},
			row{"source limit, 10M sources once, gate sketch", measure(distinct, withGate(ratelimit.GateSketch), reps, low), b10},
			row{"source limit, 10M sources once, gate none", measure(distinct, withGate(ratelimit.GateNone), reps, low), b10},
			row{"budget on udp, 10M sources", measure(distinct, off, reps, ratelimit.Limit{Kind: ratelimit.Budget, Scope: mustScope("udp"), PPS: 1000}), b10},
			row{"baseline 1,024 / 10M / 1 source", b1, 0},
			row{"", b10, 0},
			row{"", bs, 0},
		)
	}
	var out strings.Builder
	fmt.Fprintf(&out, "%-46s %10s %10s\n", "configuration", "ns/pkt", "added")
	for _, r := range rows {
		if r.base == 0 {
			fmt.Fprintf(&out, "%-46s %10.1f\n", r.name, r.ns)
			continue
		}
		fmt.Fprintf(&out, "%-46s %10.1f %+10.1f\n", r.name, r.ns, r.ns-r.base)
	}
	b.Log("\n" + out.String())
}

func mustScope(s string) ratelimit.Scope {
	sc, err := ratelimit.ParseScope(s)
	if err != nil {
		panic(err)
	}
	return sc
}
