package bench

import (
	"os"
	"strings"
	"testing"
)

func TestParseBenchmarkOutput(t *testing.T) {
	out, err := os.ReadFile("testdata/verdictpaths.txt")
	if err != nil {
		t.Fatal(err)
	}
	bs := parseBenchmarks(out)
	if len(bs) != 3 {
		t.Fatalf("parsed %d benchmarks, want 3: %+v", len(bs), bs)
	}
	if bs[1].Name != "BenchmarkVerdictPaths/deny-host-1M-2" || bs[1].N != 5 || bs[1].Metrics["ns/op"] != 120.4 {
		t.Errorf("second benchmark: %+v", bs[1])
	}
	got := printedSummary(out)
	want := "ns per packet (BPF_PROG_TEST_RUN, repeat 1000000, mean per run):\n  pass-no-rules          222.6 ns\n  deny-host-1M           120.4 ns\ndeny by /8: 10 prefixes 142.0 ns, 1,000,010 prefixes 176.0 ns, ratio 1M/10 = 1.24"
	if got != want {
		t.Errorf("printed summary:\n%s\nwant:\n%s", got, want)
	}
	if r := bs[2]; r.Name != "BenchmarkVerdictPaths/ratio-deny-net8-1M-over-10-2" || r.Metrics["ratio"] != 1.239 {
		t.Errorf("split result line: %+v", r)
	}
	if strings.Contains(got, "ratio\n") {
		t.Error("the summary kept the result line's figures")
	}
}

// TestEstablishedExtra: the established path's figure comes from the line
// of BenchmarkPerPacket's side-by-side sub-benchmark.
func TestEstablishedExtra(t *testing.T) {
	out := []byte(`goos: linux
BenchmarkPerPacket/established_ack,_port_unprotected-2         	       1	 428068415 ns/op	       122.7 ns/pkt
BenchmarkPerPacket/established_ack,_auto_no_flood-2            	       1	 440148331 ns/op	       133.6 ns/pkt
BenchmarkPerPacket/established_ack,_auto_no_flood_minus_unprotected-2         	       1	8132119682 ns/op	         0.2000 extra-ns/pkt	         1.002 ratio
ok  	github.com/moat-shield/moat/internal/syncookie	15.009s
`)
	pc := &PathCostResult{Established: parseBenchmarks(out)}
	ns, ratio, ok := pc.EstablishedExtra()
	if !ok || ns != 0.2 || ratio != 1.002 {
		t.Errorf("EstablishedExtra = %v, %v, %v; want 0.2, 1.002, true (parsed %+v)", ns, ratio, ok, pc.Established)
	}
	var w strings.Builder
	pathCostMarkdown(&w, &PathCostResult{EstablishedCommand: "go test", Established: pc.Established})
	if !strings.Contains(w.String(), "takes **+0.2 ns** per packet more") || !strings.Contains(w.String(), "| 122.7 ns/pkt |") {
		t.Errorf("markdown:\n%s", w.String())
	}
	if _, _, ok := (&PathCostResult{}).EstablishedExtra(); ok {
		t.Error("a figure from no benchmark")
	}
}
