// Command moat-bench runs moat side by side with the XDP_DROP floor,
// xdp-filter, nftables, the kernel's own defences (its SYN cookies among
// them) and an XDP SYN reflector (the ceiling of answering SYNs from XDP)
// in a throw-away lab, and writes bench/results.md, bench/results.json and
// plots (make bench).
// It needs root, bpffs, nftables and xdp-tools (scripts/setup.sh with
// MOAT_SETUP_BENCH=1 installs them).
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/moat-shield/moat/internal/bench"
)

func main() {
	quick := flag.Bool("quick", false, "smoke run: small counts and denylist, about two minutes")
	out := flag.String("out", "bench", "directory for results.md, results.json and plots (with -quick: a temporary directory unless given)")
	only := flag.String("only", "", "comma-separated subset of phases to run: "+strings.Join(bench.Phases, ","))
	rounds := flag.Int("rounds", 0, "repetitions of the drop path and SYN comparisons (0: default)")
	frames := flag.Uint64("frames", 0, "frames per drop-path run (0: default)")
	deny := flag.Int("deny", 0, "denylist size (0: default)")
	flag.Parse()

	// Parse every flag before choosing defaults, so that -quick may come
	// anywhere on the command line.
	cfg := bench.DefaultConfig(*quick)
	cfg.Out = *out
	outSet := false
	flag.Visit(func(f *flag.Flag) { outSet = outSet || f.Name == "out" })
	if *quick && !outSet {
		// A smoke run must not replace the committed results.
		cfg.Out = filepath.Join(os.TempDir(), "moat-bench-quick")
	}
	if *only != "" {
		cfg.Phases = nil
		for _, p := range strings.Split(*only, ",") {
			if !slices.Contains(bench.Phases, p) {
				fmt.Fprintf(os.Stderr, "moat-bench: unknown phase %q (want %s)\n", p, strings.Join(bench.Phases, ","))
				os.Exit(2)
			}
			cfg.Phases = append(cfg.Phases, p)
		}
	}
	if *rounds > 0 {
		cfg.Rounds = *rounds
	}
	if *frames > 0 {
		cfg.DropFrames = *frames
	}
	if *deny > 0 {
		cfg.DenySize = *deny
	}
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "moat-bench: needs root (network namespaces, XDP, nftables)")
		os.Exit(1)
	}

	// An interrupt cancels the run; Run still removes the lab, the pins and
	// the nftables table before returning.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	t0 := time.Now()
	err := bench.Run(ctx, cfg)
	fmt.Fprintf(os.Stderr, "moat-bench: done in %s; results in %s/results.md\n", time.Since(t0).Round(time.Second), cfg.Out)
	if err != nil {
		fmt.Fprintf(os.Stderr, "moat-bench: %v\n", err)
		os.Exit(1)
	}
}
