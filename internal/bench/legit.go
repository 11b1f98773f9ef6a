package bench

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/moat-shield/moat/internal/datapath"
	"github.com/moat-shield/moat/internal/flood"
	"github.com/moat-shield/moat/internal/lab"
	"github.com/moat-shield/moat/internal/syncookie"
)

// legitTimeout bounds one legitimate request: connect, send, read reply.
const legitTimeout = time.Second

// LegitRound is one measurement of one defence at one flood rate.
type LegitRound struct {
	Round     int     `json:"round"`
	FloodSent uint64  `json:"flood_sent"`
	FloodPPS  float64 `json:"flood_pps"`           // offered: what the generator sent
	Delivered float64 `json:"flood_delivered_pps"` // what the server's veth ring took in
	Attempts  int     `json:"attempts"`
	OK        int     `json:"ok"`
	P50ms     float64 `json:"p50_ms"`
	P99ms     float64 `json:"p99_ms"`
	// The requests that failed, by why (failureKind).
	Failures map[string]int `json:"failures,omitempty"`
}

// LegitPoint is one defence, one client placement and one flood rate over
// all rounds.
type LegitPoint struct {
	Defence   string       `json:"defence"`
	Placement string       `json:"client_placement"`
	Fraction  float64      `json:"rate_fraction"` // of the generator's maximum
	TargetPPS float64      `json:"target_pps"`    // 0: no flood; at 1.0 the generator runs uncapped
	Rounds    []LegitRound `json:"rounds"`
	FloodPPS  Summary      `json:"flood_pps"`
	Delivered Summary      `json:"flood_delivered_pps"`
	Success   Summary      `json:"success"` // fraction of requests answered in time
	P50ms     Summary      `json:"p50_ms"`
	P99ms     Summary      `json:"p99_ms"`
	// The requests that failed, by why, summed over the rounds.
	Failures map[string]int `json:"failures,omitempty"`
}

// LegitResult is the legitimate-service comparison.
type LegitResult struct {
	Flood        string        `json:"flood"`
	Receive      string        `json:"receive"`
	Client       string        `json:"client"`
	Placements   []string      `json:"placements"`
	GeneratorMax Summary       `json:"generator_max_pps"`
	Defences     []string      `json:"defences"`
	What         []string      `json:"what"`
	Points       []*LegitPoint `json:"points"`
	Plot         string        `json:"plot,omitempty"`
}

// placement is where legitimate clients connect from.
type placement struct {
	name   string
	host   *lab.Host
	target netip.AddrPort
}

const (
	placeOwnLink    = "own link"
	placeSharedLink = "attacked link"
)

// legit measures how a real service fares for legitimate clients while the
// attacker floods the server, with no filter, nftables or moat dropping
// the flood's sources. Clients connect both over their own link and over
// the attacked link, where they share the server's receive ring with the
// flood as users share an uplink with an attack.
func (b *Bench) legit(ctx context.Context) (*LegitResult, error) {
	moat, err := b.ensureMoat()
	if err != nil {
		return nil, err
	}
	nft, err := b.ensureNft(ctx)
	if err != nil {
		return nil, err
	}
	defences := []receiver{kernelRx{}, nft, moat}
	places := b.placements()
	// The kernel's default: cookies once the SYN queue overflows.
	if err := sysctl(b.lab.Server, "net.ipv4.tcp_syncookies", "1"); err != nil {
		return nil, err
	}
	if err := b.prepareClients(); err != nil {
		return nil, err
	}
	// Replies to spoofed sources are dropped by the attacker's kernel (it
	// does not forward) instead of answered with resets, as at addresses
	// where nobody lives; the legit client there still gets its replies.
	restore, err := b.unroutSpoofed()
	if err != nil {
		return nil, err
	}
	defer restore()

	fc := flood.Config{Kind: flood.KindSYN, Sources: b.floodSources, DstPort: servicePort}
	res := &LegitResult{
		Flood: fmt.Sprintf("TCP SYN flood to the service (%s port %d) from %s (denied by nftables and moat), moat flood on one thread pinned to CPU 0, capped at a fraction of the generator's maximum (uncapped at 100%%)",
			b.serverIf().IPv4.Addr(), servicePort, b.floodSources),
		Client:     b.clientText(places),
		Placements: []string{placeOwnLink, placeSharedLink},
	}
	if b.cfg.LegitThreadedNAPI {
		// The server takes the flood in a NAPI thread of its own rather
		// than inside the generator's batches, as a host takes frames off
		// a NIC's ring: the attacker's rate no longer depends on the
		// defence, and what the server does not take in time is dropped
		// at the full ring, whoever sent it.
		if err := setThreadedNAPI(ctx, b.lab.Server, b.serverIf().Name, true); err != nil {
			return res, err
		}
		defer setThreadedNAPI(context.WithoutCancel(ctx), b.lab.Server, b.serverIf().Name, false)
		res.Receive = fmt.Sprintf("threaded NAPI on the server's %s: the server takes frames off the veth's ring (256 frames) in a kernel thread at normal priority, which the scheduler runs beside the generator's CPU; frames that find the ring full are dropped at the attacker's end (counted as delivered: attacker's tx_queue_*_xdp_xmit)", b.serverIf().Name)
	} else {
		res.Receive = "the server takes the flood inside the generator's batches on CPU 0 (the drop path's mode)"
	}
	for _, d := range defences {
		res.Defences = append(res.Defences, d.Name())
		what := d.Name() + ": " + d.What()
		if d == receiver(moat) {
			what += "; " + b.moatSynState()
		}
		res.What = append(res.What, what)
	}

	maxPPS, err := b.synGeneratorMax(ctx, fc)
	if err != nil {
		return res, err
	}
	res.GeneratorMax = maxPPS
	b.logf("legit: generator maximum (SYN, XDP_DROP on the server) %.3f Mpps", maxPPS.Median/1e6)

	points := map[string]*LegitPoint{}
	key := func(pl, d string, f float64) string { return fmt.Sprintf("%s/%s/%g", pl, d, f) }
	for _, pl := range places {
		for _, f := range b.cfg.LegitRates {
			for _, d := range defences {
				p := &LegitPoint{Defence: d.Name(), Placement: pl.name, Fraction: f, TargetPPS: f * maxPPS.Median}
				points[key(pl.name, d.Name(), f)] = p
				res.Points = append(res.Points, p)
			}
		}
	}
	// Whatever ends the rounds, what was measured is summarised.
	defer summarizeLegit(res)
	for round := range b.cfg.LegitRounds {
		for i, f := range b.cfg.LegitRates {
			for j, pl := range places {
				for _, d := range rotate(defences, round+i+j) {
					p := points[key(pl.name, d.Name(), f)]
					lr, err := b.legitPoint(ctx, d, pl, fc, f, p.TargetPPS)
					if err != nil {
						return res, err
					}
					lr.Round = round + 1
					p.Rounds = append(p.Rounds, lr)
					b.logf("legit round %d %3.0f%% %-13s %-8s flood %6.3f Mpps offered %6.3f Mpps taken  ok %4d/%4d%s  p50 %7.2f ms  p99 %7.2f ms",
						round+1, 100*f, pl.name, d.Name(), lr.FloodPPS/1e6, lr.Delivered/1e6, lr.OK, lr.Attempts, failedNote(lr.Failures), lr.P50ms, lr.P99ms)
				}
			}
		}
	}
	return res, nil
}

// placements are the legitimate clients' places: their own link, and the
// link that carries the flood.
func (b *Bench) placements() []placement {
	return []placement{
		{placeOwnLink, b.lab.Client, netip.AddrPortFrom(b.lab.Server.Ifaces[0].IPv4.Addr(), servicePort)},
		{placeSharedLink, b.lab.Attacker, netip.AddrPortFrom(b.serverIf().IPv4.Addr(), servicePort)},
	}
}

// prepareClients lets the client hosts open connections at the offered
// rate: the whole port range, and ports in TIME_WAIT reused.
func (b *Bench) prepareClients() error {
	for _, h := range []*lab.Host{b.lab.Client, b.lab.Attacker} {
		for _, s := range []struct{ name, value string }{
			{"net.ipv4.ip_local_port_range", "1024 65535"},
			{"net.ipv4.tcp_tw_reuse", "1"},
		} {
			if err := sysctl(h, s.name, s.value); err != nil {
				return err
			}
		}
	}
	return nil
}

// clientText describes the legitimate clients for the results.
func (b *Bench) clientText(places []placement) string {
	return fmt.Sprintf("%d requests per second for %s per point, offered at a fixed rate whatever the answers (open loop, up to %d in flight): TCP connect to the service, HTTP/1.0 GET, full reply; %s timeout per request; latency is the whole request. "+
		"Placements: %q = clients in the client namespace over their own veth (%s); %q = clients in the attacker namespace at its own address %s, over the veth that carries the flood (%s)",
		b.cfg.LegitRate, b.cfg.LegitWindow, b.cfg.LegitWorkers, legitTimeout,
		placeOwnLink, places[0].target, placeSharedLink, b.attackerIf().IPv4.Addr(), places[1].target)
}

// unroutSpoofed removes the attacker's local routes for the spoofed ranges
// and returns a function that puts them back.
func (b *Bench) unroutSpoofed() (func(), error) {
	var removed []netlink.Route
	err := b.lab.Attacker.Do(func() error {
		for _, p := range []netip.Prefix{b.lab.SpoofV4, b.lab.SpoofV6} {
			family := netlink.FAMILY_V4
			if p.Addr().Is6() {
				family = netlink.FAMILY_V6
			}
			routes, err := netlink.RouteListFiltered(family, &netlink.Route{Table: unix.RT_TABLE_LOCAL}, netlink.RT_FILTER_TABLE)
			if err != nil {
				return err
			}
			for _, r := range routes {
				if r.Dst == nil || r.Type != unix.RTN_LOCAL {
					continue
				}
				ones, _ := r.Dst.Mask.Size()
				a, _ := netip.AddrFromSlice(r.Dst.IP)
				if netip.PrefixFrom(a.Unmap(), ones) != p {
					continue
				}
				if err := netlink.RouteDel(&r); err != nil {
					return fmt.Errorf("remove the attacker's local route %s: %w", p, err)
				}
				removed = append(removed, r)
			}
		}
		return nil
	})
	restore := func() {
		b.lab.Attacker.Do(func() error {
			for _, r := range removed {
				netlink.RouteAdd(&r)
			}
			return nil
		})
	}
	if err != nil {
		restore()
		return nil, err
	}
	return restore, nil
}

// synGeneratorMax is the SYN rate the generator reaches when the receiver
// costs next to nothing: the top of the legit comparison's scale.
func (b *Bench) synGeneratorMax(ctx context.Context, fc flood.Config) (Summary, error) {
	floor := &floorRx{b: b}
	fc.Duration = min(b.cfg.SynDuration, time.Second)
	var pps []float64
	err := withReceiver(ctx, floor, func() error {
		for range 3 {
			r, err := b.flood(ctx, fc)
			if err != nil {
				return err
			}
			pps = append(pps, r.PPS)
		}
		return nil
	})
	return Summarize(pps), err
}

// legitPoint runs the flood at one rate while the clients measure.
func (b *Bench) legitPoint(ctx context.Context, d receiver, pl placement, fc flood.Config, fraction, target float64) (LegitRound, error) {
	var lr LegitRound
	if err := b.freshService(); err != nil {
		return lr, err
	}
	err := withReceiver(ctx, d, func() error {
		const lead, tail = 300 * time.Millisecond, 200 * time.Millisecond
		var (
			wg   sync.WaitGroup
			fr   flood.Result
			ferr error
		)
		xmit0, xerr0 := b.floodDelivered(ctx)
		if fraction > 0 {
			fc.Duration = lead + b.cfg.LegitWindow + tail
			if fraction < 1 {
				fc.Rate = uint64(target)
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				fr, ferr = b.flood(ctx, fc)
			}()
			select {
			case <-time.After(lead):
			case <-ctx.Done():
			}
		}
		lat, attempts, cerr := b.clients(ctx, pl)
		wg.Wait()
		xmit1, xerr1 := b.floodDelivered(ctx)
		if ferr != nil {
			return ferr
		}
		if cerr != nil {
			return cerr
		}
		lr.FloodSent, lr.FloodPPS = fr.Sent, fr.PPS
		if xerr0 == nil && xerr1 == nil && fr.Elapsed > 0 {
			// The counter also holds the shared-link clients' few frames.
			lr.Delivered = float64(xmit1-xmit0) / fr.Elapsed.Seconds()
		}
		lr.Attempts, lr.OK, lr.Failures = attempts, len(lat.request), lat.failed
		lr.P50ms, lr.P99ms = Percentile(lat.request, 50), Percentile(lat.request, 99)
		return nil
	})
	return lr, err
}

// summarizeLegit fills every point's summaries from its rounds.
func summarizeLegit(res *LegitResult) {
	for _, p := range res.Points {
		var fl, dl, ok, p50, p99 []float64
		p.Failures = nil
		for _, r := range p.Rounds {
			fl, dl = append(fl, r.FloodPPS), append(dl, r.Delivered)
			ok = append(ok, float64(r.OK)/float64(max(r.Attempts, 1)))
			p50, p99 = append(p50, r.P50ms), append(p99, r.P99ms)
			p.Failures = addFailures(p.Failures, r.Failures)
		}
		p.FloodPPS, p.Delivered = Summarize(fl), Summarize(dl)
		p.Success, p.P50ms, p.P99ms = Summarize(ok), Summarize(p50), Summarize(p99)
	}
}

// floodDelivered counts the frames the attacker's veth handed to the
// server's ring (XDP frames only: the generator's, not sockets').
func (b *Bench) floodDelivered(ctx context.Context) (uint64, error) {
	return vethStat(ctx, b.lab.Attacker, b.attackerIf().Name, "tx_queue_", "_xdp_xmit")
}

// setThreadedNAPI turns threaded NAPI on or off for dev in host. The
// attribute is only in sysfs, which shows the devices of the namespace it
// was mounted in, so the write goes through ip netns exec, which mounts a
// sysfs of the namespace for the command.
func setThreadedNAPI(ctx context.Context, host *lab.Host, dev string, on bool) error {
	v := "0"
	if on {
		v = "1"
	}
	script := fmt.Sprintf("echo %s > /sys/class/net/%s/threaded", v, dev)
	out, err := exec.CommandContext(ctx, "ip", "netns", "exec", host.Name, "sh", "-c", script).CombinedOutput()
	if err != nil {
		return fmt.Errorf("threaded NAPI on %s: %v: %s", dev, err, out)
	}
	return nil
}

// latencies are the durations (ms) of the requests that succeeded (the
// whole request, and its TCP connect alone, in the same order) and the
// count of those that failed, by failureKind.
type latencies struct {
	request, connect []float64
	failed           map[string]int
}

func (l *latencies) add(m latencies) {
	l.request = append(l.request, m.request...)
	l.connect = append(l.connect, m.connect...)
	l.failed = addFailures(l.failed, m.failed)
}

// addFailures adds the counts of failed requests in from to into, which
// it makes when there is something to add, and returns into.
func addFailures(into, from map[string]int) map[string]int {
	for k, n := range from {
		if into == nil {
			into = map[string]int{}
		}
		into[k] += n
	}
	return into
}

// clients offers requests at a fixed rate for one window, whether or not
// earlier ones have been answered (an open loop: a slow server does not
// slow the clients down, as it does not slow real users). It returns the
// latencies of the requests that succeeded and the number offered. A
// pool of goroutines locked into the placement's namespace makes them, so
// their sockets are made there; a request that no goroutine could start
// within the timeout counts as failed.
func (b *Bench) clients(ctx context.Context, pl placement) (latencies, int, error) {
	if b.cfg.LegitWorkers < 1 || b.cfg.LegitRate < 1 {
		return latencies{}, 0, fmt.Errorf("clients need at least one worker and one request per second (have %d, %d)", b.cfg.LegitWorkers, b.cfg.LegitRate)
	}
	interval := time.Second / time.Duration(b.cfg.LegitRate)
	offered := int(b.cfg.LegitWindow / interval)
	slots := make(chan time.Time, offered)
	var (
		mu   sync.Mutex
		lat  latencies
		wg   sync.WaitGroup
		errs = make([]error, b.cfg.LegitWorkers)
		// Each worker enters the client's namespace on a thread of its
		// own, and leaves it again. Neither is a client's work, so none of
		// it happens while requests are measured: the first request is due
		// once every worker is ready, and the workers are let go (all at
		// once, which wakes every one of them) only when the last request
		// has finished.
		ready    sync.WaitGroup
		notIn    atomic.Bool // a worker could not enter the namespace
		inFlight sync.WaitGroup
	)
	target := pl.target.String()
	ready.Add(b.cfg.LegitWorkers)
	for w := range b.cfg.LegitWorkers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			entered := false
			errs[w] = pl.host.Do(func() error {
				entered = true
				ready.Done()
				for due := range slots {
					if time.Since(due) <= legitTimeout && ctx.Err() == nil {
						total, conn, err := request(target)
						mu.Lock()
						if err == nil {
							lat.request = append(lat.request, total)
							lat.connect = append(lat.connect, conn)
						} else {
							lat.failed = addFailures(lat.failed, map[string]int{failureKind(err): 1})
						}
						mu.Unlock()
					} // else the user gave up before a client was free
					inFlight.Done()
				}
				return nil
			})
			if !entered {
				notIn.Store(true)
				ready.Done()
			}
		}()
	}
	ready.Wait()
	if notIn.Load() {
		close(slots)
		wg.Wait()
		return latencies{}, 0, errors.Join(errs...)
	}
	start := time.Now()
	inFlight.Add(offered)
	for i := range offered {
		due := start.Add(time.Duration(i) * interval)
		if wait := time.Until(due); wait > 0 {
			select {
			case <-time.After(wait):
			case <-ctx.Done():
			}
		}
		slots <- due
	}
	inFlight.Wait()
	close(slots)
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return latencies{}, 0, err
		}
	}
	return lat, offered, nil
}

// request makes one HTTP request on a fresh connection and reports its
// duration and that of its TCP connect, in milliseconds, or why it did not
// get a complete 200 reply in time.
func request(target string) (total, connect float64, err error) {
	t0 := time.Now()
	deadline := t0.Add(legitTimeout)
	d := net.Dialer{Deadline: deadline}
	conn, err := d.Dial("tcp4", target)
	if err != nil {
		return 0, 0, &requestError{"connect", err}
	}
	connect = msSince(t0)
	defer conn.Close()
	conn.SetDeadline(deadline)
	if _, err := io.WriteString(conn, "GET / HTTP/1.0\r\nHost: moat-bench\r\n\r\n"); err != nil {
		return 0, 0, &requestError{"send", err}
	}
	br := bufio.NewReader(conn)
	status, err := br.ReadString('\n')
	if err != nil {
		return 0, 0, &requestError{"reply", err}
	}
	if !strings.Contains(status, " 200 ") {
		return 0, 0, &requestError{"reply", errNot200}
	}
	body, err := io.ReadAll(br)
	if err != nil {
		return 0, 0, &requestError{"reply", err}
	}
	if !strings.Contains(string(body), "moat bench: ok") {
		return 0, 0, &requestError{"reply", errWrongBody}
	}
	return msSince(t0), connect, nil
}

var (
	errNot200    = errors.New("status not 200")
	errWrongBody = errors.New("wrong body")
)

// requestError is a request that failed at one step: connect, send or
// reply.
type requestError struct {
	step string
	err  error
}

func (e *requestError) Error() string { return e.step + ": " + e.err.Error() }
func (e *requestError) Unwrap() error { return e.err }

// isTimeout reports a network error that says it is a timeout, as a dial
// past its deadline does.
func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// failureKind names why a request failed in a few words, the same for
// every failure alike, so that failures can be counted by kind.
func failureKind(err error) string {
	step := "request"
	var re *requestError
	if errors.As(err, &re) {
		step = re.step
	}
	var why string
	switch {
	case errors.Is(err, os.ErrDeadlineExceeded), errors.Is(err, context.DeadlineExceeded), isTimeout(err):
		why = "timed out"
	case errors.Is(err, unix.ECONNREFUSED):
		why = "refused"
	case errors.Is(err, unix.ECONNRESET):
		why = "reset"
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		why = "closed early"
	case errors.Is(err, errNot200):
		why = "status not 200"
	case errors.Is(err, errWrongBody):
		why = "wrong body"
	default:
		why = "other error"
	}
	return step + " " + why
}

// msSince is the time since t0 in milliseconds.
func msSince(t0 time.Time) float64 { return float64(time.Since(t0)) / float64(time.Millisecond) }

// moatSynState says whether the shield has SYN protection on the service
// port, which changes what moat does with the legitimate clients' SYNs.
func (b *Bench) moatSynState() string {
	m := b.shield.Map(datapath.MoatMapSynPorts)
	if m == nil {
		return "this shield has no SYN protection"
	}
	var p datapath.MoatSynPort
	if err := m.Lookup(uint32(servicePort), &p); err != nil || syncookie.Mode(p.Mode) == syncookie.ModeOff {
		return fmt.Sprintf("SYN protection off on port %d (SYNs not denied go to the kernel)", servicePort)
	}
	return fmt.Sprintf("SYN protection %s on port %d", syncookie.Mode(p.Mode), servicePort)
}
