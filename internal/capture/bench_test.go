package capture

import (
	"fmt"
	"slices"
	"strings"
	"testing"
)

// benchRepeat is the packets of one measured run: few enough that every
// record of a capturing run fits in the ring, so the figure is the cost of
// capturing, not of finding the ring full.
const benchRepeat = 20_000

// BenchmarkCaptureCost measures ns per packet through moat_filter on the
// pass path with capture off, on but filtered out (early, by verdict, and
// late, by port after parsing), and on and capturing every packet, in
// interleaved rounds so that drift on the machine hits every case alike.
// Run with
//
//	go test -run xxx -bench CaptureCost -benchtime 1x ./internal/capture/
func BenchmarkCaptureCost(b *testing.B) {
	f := newFixture(b, 0)
	f.rules()
	pkt := testPackets()[1].pkt // clean TCP SYN: no rule, passed
	cases := []struct {
		name   string
		filter *Filter // nil: capture off
	}{
		{"off", nil},
		{"on-filtered-by-verdict", &Filter{Verdicts: VerdictDrop}},
		{"on-filtered-by-port", &Filter{Port: 1, HasPort: true}},
		{"on-capturing-64B-snap", &Filter{Snaplen: 64}},
		{"on-capturing-whole", &Filter{}},
	}
	const rounds = 15
	for i := 0; i < b.N; i++ {
		ns := make([][]float64, len(cases))
		var captured, lost uint64
		for r := 0; r < rounds; r++ {
			for j, c := range cases {
				var s *Session
				if c.filter != nil {
					s = f.start(*c.filter)
				}
				ret, d, err := f.objs.MoatFilter.Benchmark(pkt, benchRepeat, nil)
				if err != nil || ret != ActionPass {
					b.Fatalf("%s: verdict %d, %v", c.name, ret, err)
				}
				ns[j] = append(ns[j], float64(d.Nanoseconds()))
				if s != nil {
					got := len(drain(b, s))
					l, _ := s.Lost()
					if strings.HasPrefix(c.name, "on-capturing") {
						captured += uint64(got)
						lost += l
					} else if got != 0 {
						b.Fatalf("%s: %d records of packets the filter excludes", c.name, got)
					}
					s.Close()
				}
			}
		}
		var out strings.Builder
		fmt.Fprintf(&out, "capture cost, ns per packet on the pass path (BPF_PROG_TEST_RUN, %d packets a run, median of %d interleaved rounds):\n", benchRepeat, rounds)
		base := 0.0
		for j, c := range cases {
			slices.Sort(ns[j])
			med := ns[j][rounds/2]
			if j == 0 {
				base = med
			}
			fmt.Fprintf(&out, "  %-24s %6.1f ns  (%+.1f ns)\n", c.name, med, med-base)
		}
		fmt.Fprintf(&out, "  records written by the capturing runs: %d, lost: %d\n", captured, lost)
		fmt.Print(out.String())
	}
	b.ReportMetric(0, "ns/op")
}
