package bench

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
)

// pathCostPkg holds the data path's Go benchmarks (BPF_PROG_TEST_RUN per
// packet kind and verdict); pathCostBench picks the per-path one. Each of
// its iterations is itself a million runs in the kernel, so a handful of
// iterations is plenty.
const (
	pathCostPkg   = "./internal/datapath/"
	pathCostBench = "VerdictPaths"
)

// establishedPkg and establishedBench: the SYN defence's cost per packet
// beside a real socket (internal/syncookie's BenchmarkPerPacket), with the
// established path in auto mode against the port unprotected side by side.
// One iteration is 9 interleaved rounds of 4 million runs.
const (
	establishedPkg   = "./internal/syncookie/"
	establishedBench = "PerPacket"
	// establishedExtra names the sub-benchmark that reports the
	// difference (extra-ns/pkt) and the ratio.
	establishedExtra = "auto_no_flood_minus_unprotected"
)

// Benchmark is one line of `go test -bench` output.
type Benchmark struct {
	Name    string             `json:"name"`
	N       uint64             `json:"n"`
	Metrics map[string]float64 `json:"metrics"` // unit -> value, e.g. "ns/op", "ns/pkt"
	Units   []string           `json:"units"`   // in the order go test printed them
}

// PathCostResult is the per-path cost comparison.
type PathCostResult struct {
	Command    string      `json:"command"`
	Benchmarks []Benchmark `json:"benchmarks"`
	Printed    string      `json:"printed,omitempty"` // the summary the benchmark prints
	Note       string      `json:"note,omitempty"`
	Output     string      `json:"output,omitempty"` // go test's output when it failed
	// The SYN defence's cost per packet (establishedBench).
	EstablishedCommand string      `json:"established_command,omitempty"`
	Established        []Benchmark `json:"established,omitempty"`
	EstablishedOutput  string      `json:"established_output,omitempty"` // go test's output when it failed
}

// EstablishedExtra is the established path's extra nanoseconds per packet
// in auto mode with no flood over the port unprotected, and their ratio;
// ok is false when the benchmark gave none.
func (pc *PathCostResult) EstablishedExtra() (ns, ratio float64, ok bool) {
	for _, b := range pc.Established {
		if strings.Contains(b.Name, establishedExtra) {
			ns, ok = b.Metrics["extra-ns/pkt"]
			return ns, b.Metrics["ratio"], ok
		}
	}
	return 0, 0, false
}

var benchLine = regexp.MustCompile(`^(Benchmark\S+)\s+(\d+)\s+(.+)$`)

// pathCost runs the data path's benchmarks with go test and collects them.
// It runs after the lab comparisons so compiling does not disturb them.
func (b *Bench) pathCost(ctx context.Context) (*PathCostResult, error) {
	root, err := moduleRoot()
	if err != nil {
		return nil, err
	}
	args := []string{"test", "-run", "^$", "-bench", pathCostBench, "-benchtime", b.cfg.PathBenchtime, "-count", "1"}
	if b.cfg.Quick {
		args = append(args, "-short") // without the million-prefix paths
	}
	args = append(args, pathCostPkg)
	res := &PathCostResult{Command: "go " + strings.Join(args, " ")}
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Dir = root
	out, err := cmd.CombinedOutput()
	res.Benchmarks = parseBenchmarks(out)
	res.Printed = printedSummary(out)
	var errs []error
	if err != nil {
		res.Output = tail(string(out), 4000)
		errs = append(errs, fmt.Errorf("%s: %v", res.Command, err))
	} else if len(res.Benchmarks) == 0 {
		res.Note = "internal/datapath has no Benchmark" + pathCostBench + " yet"
	}

	args = []string{"test", "-run", "^$", "-bench", establishedBench, "-benchtime", "1x", "-count", "1", establishedPkg}
	res.EstablishedCommand = "go " + strings.Join(args, " ")
	cmd = exec.CommandContext(ctx, "go", args...)
	cmd.Dir = root
	out, err = cmd.CombinedOutput()
	res.Established = parseBenchmarks(out)
	if err != nil {
		res.EstablishedOutput = tail(string(out), 4000)
		errs = append(errs, fmt.Errorf("%s: %v", res.EstablishedCommand, err))
	}
	return res, errors.Join(errs...)
}

func parseBenchmarks(out []byte) []Benchmark {
	var bs []Benchmark
	pending := "" // a name whose figures come after printed output
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		name, n, rest := "", "", ""
		if m := benchLine.FindStringSubmatch(line); m != nil {
			name, n, rest = m[1], m[2], m[3]
		} else if strings.HasPrefix(line, "Benchmark") {
			pending = strings.Fields(line)[0]
			continue
		} else if pending != "" && metricsOnly.MatchString(line) {
			f := strings.SplitN(line, "\t", 2)
			if len(f) != 2 {
				f = strings.SplitN(line, " ", 2)
			}
			name, n, rest = pending, strings.TrimSpace(f[0]), f[1]
			pending = ""
		} else {
			continue
		}
		count, _ := strconv.ParseUint(n, 10, 64)
		bm := Benchmark{Name: name, N: count, Metrics: map[string]float64{}}
		f := strings.Fields(rest)
		for i := 0; i+1 < len(f); i += 2 {
			v, err := strconv.ParseFloat(f[i], 64)
			if err != nil {
				break
			}
			bm.Metrics[f[i+1]] = v
			bm.Units = append(bm.Units, f[i+1])
		}
		bs = append(bs, bm)
	}
	return bs
}

// printedSummary is the last block the benchmark prints between its
// result lines, starting at its "ns per packet" heading. go test puts a
// sub-benchmark's name and its figures on either side of what it prints.
func printedSummary(out []byte) string {
	lines := strings.Split(string(out), "\n")
	start := -1
	for i, l := range lines {
		if j := strings.Index(l, "ns per packet"); j >= 0 {
			start = i
			lines[i] = l[j:]
		}
	}
	if start < 0 {
		return ""
	}
	var keep []string
	for _, l := range lines[start:] {
		t := strings.TrimSpace(l)
		if t == "PASS" || strings.HasPrefix(t, "ok ") || strings.HasPrefix(t, "Benchmark") || metricsOnly.MatchString(t) {
			break
		}
		keep = append(keep, l)
	}
	return strings.TrimRight(strings.Join(keep, "\n"), "\n")
}

// metricsOnly is the rest of a result line whose name came before printed
// output: iterations and figures.
var metricsOnly = regexp.MustCompile(`^\d+\s+[-\d.e+]+ \S+`)

// moduleRoot finds go.mod from the working directory up.
func moduleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("no go.mod above the working directory")
		}
		dir = parent
	}
}

func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return "..." + s[len(s)-n:]
}
