// Package bench runs moat side by side with the tools people use today on
// the same lab and the same machine, and writes the figures (make bench).
//
// Every comparison alternates its contenders within each repetition
// (A B C D, B C D A, ...) rather than running one contender's repetitions
// back to back, so that drift of the machine (other load, frequency, cache
// state) spreads over all of them instead of favouring one.
package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/moat-shield/moat/internal/flood"
	"github.com/moat-shield/moat/internal/lab"
	"github.com/moat-shield/moat/internal/shield"
)

// Config chooses what runs and how much.
type Config struct {
	Out   string // directory for results.md, results.json and the plots
	Quick bool   // smoke run: small counts, results go to Out all the same

	Rounds       int          // repetitions of the drop path and SYN comparisons
	DropFrames   uint64       // frames per drop-path run
	DenySize     int          // prefixes in the denylist
	FloodSources netip.Prefix // spoofed sources of the drop path and the legit flood

	SynDuration time.Duration // SYN flood length per run

	LegitRounds  int
	LegitWindow  time.Duration // client measuring time per point
	LegitRates   []float64     // fractions of the generator's maximum
	LegitRate    int           // legitimate requests offered per second
	LegitWorkers int           // most legitimate requests in flight at once
	// LegitThreadedNAPI makes the server take the legit flood in a NAPI
	// thread instead of inside the generator's batches.
	LegitThreadedNAPI bool

	PathBenchtime string // -benchtime of the data path's Go benchmarks

	Phases []string // subset of Phases
	Log    io.Writer
}

// Phases in the order they run.
var Phases = []string{"drop", "syn", "synlegit", "legit", "pathcost"}

// DefaultConfig is what make bench runs; quick is the smoke run.
func DefaultConfig(quick bool) Config {
	c := Config{
		Out: "bench", Quick: quick,
		// 10M frames make a drop-path run last most of a second on a
		// fast host: runs of 2M (0.13 s at the floor's 15 Mpps on an Intel
		// Xeon) caught the floor before it reached its pace and swung
		// with every hiccup of the machine (57-90% for moat in one run).
		Rounds: 5, DropFrames: 10_000_000, DenySize: 1_000_000,
		FloodSources: netip.MustParsePrefix("198.19.32.0/20"),
		SynDuration:  3 * time.Second,
		LegitRounds:  3, LegitWindow: 2 * time.Second, LegitRates: []float64{0, 0.1, 0.25, 0.5, 1},
		LegitRate: 200, LegitWorkers: 64, LegitThreadedNAPI: true,
		PathBenchtime: "3x",
		Phases:        Phases, Log: os.Stderr,
	}
	if quick {
		c.Rounds, c.DropFrames, c.DenySize = 2, 300_000, 20_000
		c.FloodSources = netip.MustParsePrefix("198.19.32.0/24")
		c.SynDuration = time.Second
		c.LegitRounds, c.LegitWindow, c.LegitRates = 1, time.Second, []float64{0, 1}
		c.PathBenchtime = "1x"
	}
	return c
}

// Lab addressing the comparisons use.
const (
	servicePort = 8080 // the legitimate HTTP service, also the SYN flood's target
	discardPort = 9    // closed UDP port the drop-path flood goes to
	denySeed    = 20250101
)

// synSources is where SYN-flood sources come from: inside the spoofed range
// (replies reach the attacker) and outside the denylist.
var synSources = netip.MustParsePrefix("198.19.128.0/17")

// Bench is one run: the lab, the shared state of the contenders and the
// results so far.
type Bench struct {
	cfg      Config
	lab      *lab.Lab
	res      *Results
	versions map[string]string

	deny         []netip.Prefix
	floodSources netip.Prefix

	shieldRoot string
	shield     *shield.Shield
	nftLoaded  bool
	xdpFilter  *xdpFilterRx
	xdpDirOwn  bool // libxdp's pin directory did not exist before this run

	http     *http.Server
	cleanups []func() error
}

func (b *Bench) logf(format string, args ...any) {
	fmt.Fprintf(b.cfg.Log, "%s  %s\n", time.Now().Format("15:04:05"), fmt.Sprintf(format, args...))
}

func (b *Bench) serverIf() lab.Iface   { return b.lab.Server.Ifaces[1] }
func (b *Bench) attackerIf() lab.Iface { return b.lab.Attacker.Ifaces[0] }

func (b *Bench) onCleanup(fn func() error) { b.cleanups = append(b.cleanups, fn) }

// Run builds the lab, runs the chosen comparisons and writes the results.
// A comparison that fails is reported in the results and the others still
// run; the error returned joins every failure. Everything the run set up is
// removed before Run returns, whatever happened.
func Run(ctx context.Context, cfg Config) (err error) {
	b := &Bench{cfg: cfg, floodSources: cfg.FloodSources, versions: toolVersions()}
	b.res = &Results{Quick: cfg.Quick, Machine: machineInfo(b.versions), Config: describeConfig(cfg)}
	defer func() {
		err = errors.Join(err, b.cleanup())
		b.res.Machine.LoadAfter = loadAvg()
		b.res.Finished = time.Now().UTC()
		if werr := b.write(); werr != nil {
			err = errors.Join(err, werr)
		}
	}()
	b.res.Started = time.Now().UTC()

	if err := b.setup(ctx); err != nil {
		return err
	}
	var errs []error
	for _, phase := range cfg.Phases {
		if ctx.Err() != nil {
			errs = append(errs, ctx.Err())
			break
		}
		t0 := time.Now()
		b.logf("phase %s", phase)
		var perr error
		switch phase {
		case "drop":
			b.res.Drop, perr = b.dropPath(ctx)
		case "syn":
			b.res.Syn, perr = b.synFlood(ctx)
		case "synlegit":
			b.res.SynLegit, perr = b.synLegit(ctx)
		case "legit":
			b.res.Legit, perr = b.legit(ctx)
		case "pathcost":
			b.res.PathCost, perr = b.pathCost(ctx)
		default:
			perr = fmt.Errorf("unknown phase %q", phase)
		}
		b.res.Durations = append(b.res.Durations, PhaseTime{phase, time.Since(t0).Round(time.Second).String()})
		if perr != nil {
			b.logf("phase %s failed: %v", phase, perr)
			b.res.Errors = append(b.res.Errors, fmt.Sprintf("%s: %v", phase, perr))
			errs = append(errs, fmt.Errorf("%s: %w", phase, perr))
		}
	}
	return errors.Join(errs...)
}

// setup builds the lab and starts the legitimate service. The contenders'
// state (denylist, nftables sets, xdp-filter addresses) is set up by the
// first comparison that needs it.
func (b *Bench) setup(ctx context.Context) error {
	b.logf("building the lab")
	l, err := lab.New("moatbench")
	if err != nil {
		return err
	}
	b.lab = l
	b.onCleanup(l.Close)
	return b.startService()
}

// startService runs a small HTTP server in the server's namespace: the
// legitimate service of the comparisons, and the listener the SYN flood
// needs. It listens on every address so both client and attacker reach it.
// The listener is plain TCP: Go makes listeners MPTCP by default, and
// moat leaves an MPTCP listener's SYNs to the kernel, which makes no
// connection from a moat cookie for one.
func (b *Bench) startService() error {
	if err := b.listen(); err != nil {
		return err
	}
	b.onCleanup(func() error { return b.http.Close() })
	return nil
}

// listen opens the service's listener and serves it.
func (b *Bench) listen() error {
	var ln net.Listener
	err := b.lab.Server.Do(func() error {
		var lc net.ListenConfig
		lc.SetMultipathTCP(false)
		var err error
		ln, err = lc.Listen(context.Background(), "tcp", fmt.Sprintf(":%d", servicePort))
		return err
	})
	if err != nil {
		return fmt.Errorf("listen in the server namespace: %w", err)
	}
	b.http = &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "text/plain")
			io.WriteString(w, "moat bench: ok\n")
		}),
		ReadHeaderTimeout: 2 * time.Second,
	}
	b.http.SetKeepAlivesEnabled(false)
	go b.http.Serve(ln)
	return nil
}

// freshService replaces the service's listener with a new one, so that a
// measurement starts from a listener with empty queues. The kernel, when
// it meets a SYN flood, fills its listener's SYN queue (4096 half-open
// connections here) and sends each a SYN-ACK again 1, 3, 7, 15 and 31 s
// later; those bursts fill the attacked link's ring in the points that
// come after and cost their requests a retransmission. The requests of a
// closed listener are dropped at their next timer, unsent.
func (b *Bench) freshService() error {
	if err := b.http.Close(); err != nil {
		return fmt.Errorf("close the service: %w", err)
	}
	return b.listen()
}

// cleanup undoes everything in reverse order; it runs even after a failure
// or an interrupt, so it uses a context of its own.
func (b *Bench) cleanup() error {
	var errs []error
	for i := len(b.cleanups) - 1; i >= 0; i-- {
		if err := b.cleanups[i](); err != nil {
			errs = append(errs, err)
		}
	}
	b.cleanups = nil
	return errors.Join(errs...)
}

// ensureDenylist generates the denylist (once) and loads it into moat.
func (b *Bench) ensureMoat() (*moatRx, error) {
	if err := b.ensureDenyList(); err != nil {
		return nil, err
	}
	if b.shield != nil {
		return &moatRx{b: b, s: b.shield}, nil
	}
	b.shieldRoot = filepath.Join("/sys/fs/bpf", fmt.Sprintf("moat-bench-%d", os.Getpid()))
	s, err := shield.Open(b.shieldRoot)
	if err != nil {
		return nil, err
	}
	b.shield = s
	b.onCleanup(func() error {
		err := s.Remove()
		s.Close()
		// The shield locks its state with a file in /run that it leaves
		// behind; this root is gone, so is the need for its lock.
		locks, _ := filepath.Glob("/run/moat-*-" + filepath.Base(b.shieldRoot) + ".lock")
		for _, l := range locks {
			os.Remove(l)
		}
		return err
	})
	entries := make([]shield.Entry, len(b.deny))
	for i, p := range b.deny {
		entries[i] = shield.Entry{Prefix: p}
	}
	t0 := time.Now()
	if err := s.Add(shield.DenyList, entries, shield.Upsert); err != nil {
		return nil, fmt.Errorf("load the denylist into moat: %w", err)
	}
	n, err := s.Count(shield.DenyList)
	if err != nil {
		return nil, err
	}
	if n != len(b.deny) {
		return nil, fmt.Errorf("moat holds %d denylist entries, want %d", n, len(b.deny))
	}
	b.res.Setup.MoatLoad = time.Since(t0).Round(time.Millisecond).String()
	b.logf("moat: %d prefixes loaded in %s", n, b.res.Setup.MoatLoad)
	return &moatRx{b: b, s: s}, nil
}

func (b *Bench) ensureDenyList() error {
	if b.deny != nil {
		return nil
	}
	t0 := time.Now()
	deny, err := GenerateDenylist(b.cfg.DenySize, []netip.Prefix{b.floodSources}, DefaultMix, denySeed)
	if err != nil {
		return err
	}
	b.deny = deny
	b.logf("denylist: %d prefixes generated in %s", len(deny), time.Since(t0).Round(time.Millisecond))
	return nil
}

// ensureNft creates the nftables table and fills its sets with the whole
// denylist, once.
func (b *Bench) ensureNft(ctx context.Context) (*nftRx, error) {
	if err := b.ensureDenyList(); err != nil {
		return nil, err
	}
	r := &nftRx{b: b}
	if b.nftLoaded {
		return r, nil
	}
	f, err := os.CreateTemp("", "moat-bench-*.nft")
	if err != nil {
		return nil, err
	}
	defer os.Remove(f.Name())
	if err := WriteNftSets(f, b.deny); err != nil {
		f.Close()
		return nil, err
	}
	if err := f.Close(); err != nil {
		return nil, err
	}
	b.logf("nftables: loading %d prefixes into interval sets (this takes a while)", len(b.deny))
	t0 := time.Now()
	out, err := b.lab.Server.Command(ctx, "nft", "-f", f.Name()).CombinedOutput()
	if err != nil {
		return nil, fmt.Errorf("nft -f: %v: %s", err, out)
	}
	b.nftLoaded = true
	b.onCleanup(func() error {
		// The namespace's end would remove the table too; deleting it
		// first frees the million elements before the lab goes.
		out, err := b.lab.Server.Command(context.Background(), "nft", "delete", "table", "netdev", nftTable).CombinedOutput()
		if err != nil {
			return fmt.Errorf("nft delete table: %v: %s", err, out)
		}
		return nil
	})
	b.res.Setup.NftLoad = time.Since(t0).Round(time.Millisecond).String()
	b.logf("nftables: loaded in %s", b.res.Setup.NftLoad)
	return r, nil
}

// flood sends cfg from the attacker towards the server's attacker-facing
// interface on one generator thread pinned to the first CPU: the receiver's
// work then runs on that CPU too (veth), and the other CPU stays for the
// rest of the run (the Go runtime, legitimate clients, the service).
func (b *Bench) flood(ctx context.Context, cfg flood.Config) (flood.Result, error) {
	cfg.IfIndex = b.attackerIf().Index
	cfg.DstMAC = b.attackerIf().PeerMAC
	if !cfg.Dst.IsValid() {
		cfg.Dst = b.serverIf().IPv4.Addr()
	}
	cfg.Threads, cfg.PinCPUs = 1, true
	var res flood.Result
	err := b.lab.Attacker.Do(func() error {
		var err error
		res, err = flood.Run(ctx, cfg)
		return err
	})
	return res, err
}

// sysctl sets a sysctl in a host's namespace (net.* sysctls are per
// namespace and resolved by the writing thread's namespace).
func sysctl(h *lab.Host, name, value string) error {
	return h.Do(func() error {
		p := "/proc/sys/" + strings.ReplaceAll(name, ".", "/")
		if err := os.WriteFile(p, []byte(value), 0); err != nil {
			return fmt.Errorf("sysctl %s=%s in %s: %w", name, value, h.Name, err)
		}
		return nil
	})
}

// withReceiver attaches r, runs fn and detaches r, even if fn fails.
func withReceiver(ctx context.Context, r receiver, fn func() error) (err error) {
	if err := r.Attach(ctx); err != nil {
		return fmt.Errorf("attach %s: %w", r.Name(), err)
	}
	defer func() {
		if derr := r.Detach(context.WithoutCancel(ctx)); derr != nil {
			err = errors.Join(err, fmt.Errorf("detach %s: %w", r.Name(), derr))
		}
	}()
	return fn()
}

// rotate returns xs starting at index k, wrapping: round k's order.
func rotate[T any](xs []T, k int) []T {
	k %= len(xs)
	return append(append([]T{}, xs[k:]...), xs[:k]...)
}

// denyMixText describes the denylist's composition.
func (b *Bench) denyMixText() string {
	var v4h, v4n, v6h, v6n int
	for _, p := range b.deny {
		switch {
		case p.Addr().Is4() && p.IsSingleIP():
			v4h++
		case p.Addr().Is4():
			v4n++
		case p.IsSingleIP():
			v6h++
		default:
			v6n++
		}
	}
	return fmt.Sprintf("%d IPv4 hosts, %d IPv4 networks /%d-/%d, %d IPv6 hosts, %d IPv6 networks /%d-/%d, none overlapping; among them %s, which covers every flood source",
		v4h, v4n, minV4NetBits, maxV4NetBits, v6h, v6n, minV6NetBits, maxV6NetBits, b.floodSources)
}

// nftSetsText says what the nftables sets hold.
func (b *Bench) nftSetsText() string {
	return fmt.Sprintf("the same %d prefixes as moat's denylist", len(b.deny))
}
