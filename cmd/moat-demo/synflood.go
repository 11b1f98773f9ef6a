package main

// Part two of the demo: a spoofed SYN flood against a TCP service while the
// legitimate client keeps connecting, first with the kernel alone, then
// with moat's SYN cookies (issued in XDP, accepted by a tcx program).

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/moat-shield/moat/internal/flood"
	"github.com/moat-shield/moat/internal/lab"
	"github.com/moat-shield/moat/internal/syncookie"
)

const (
	synPort = 9090
	// synBacklog caps the listen backlog, and with it the SYN queue, so
	// the flood really fills the queue within microseconds; production
	// servers run larger queues, which a flood at these rates fills just
	// as surely, only a few milliseconds later.
	synBacklog = 128

	// The client opens connections from clientWorkers goroutines, each at
	// most once per clientInterval: a steady 400 attempts per second,
	// enough for meaningful percentiles, few enough that TIME_WAIT never
	// runs the client out of ports.
	clientWorkers  = 8
	clientInterval = 20 * time.Millisecond
	// dialTimeout lets one lost SYN be retransmitted (after 1 s), so a
	// lost SYN shows in the latency rather than as a failure at once.
	dialTimeout = 3 * time.Second
	echoTimeout = 2 * time.Second
	// clientLead lets the flood get going before the client measures.
	clientLead = 300 * time.Millisecond

	// minServed is the share of client connections moat's round must serve.
	minServed = 0.99
)

// synRound is what one flood round measured.
type synRound struct {
	attempted, served int
	p50, p99          time.Duration // connect latency; +Inf if more than that share failed
	flood             flood.Result
	atSpoofed         uint64 // SYN-ACKs (and other TCP) that reached the spoofed sources
	kernel            kernelCounters
	moat              *syncookie.PortStatus // nil in the kernel-only round
}

// kernelCounters are deltas of the server namespace's TcpExt counters.
type kernelCounters struct {
	cookiesSent, cookiesRecv, listenDrops uint64
}

func synFloodPart(ctx context.Context, l *lab.Lab, moat, root string, floodFor time.Duration) (err error) {
	srv, att := l.Server, l.Attacker
	dst := l.Client.Ifaces[0].PeerIPv4 // the server as the client sees it
	fmt.Printf("\n\n######## part two: SYN flood on tcp/%d ########\n", synPort)
	fmt.Printf("== the attacker floods spoofed SYNs from %s at full speed for %v while the client\n", l.SpoofV4, floodFor)
	fmt.Printf("   opens up to %d connections per second to %s:%d (connect, echo a line, close)\n",
		int(clientWorkers*time.Second/clientInterval), dst, synPort)

	// The kernel's defaults, written explicitly so the round does not
	// depend on what a namespace inherits: SYN cookies only once the SYN
	// queue is full (tcp_syncookies=1), and a queue of synBacklog entries.
	if err := srv.Do(func() error {
		for _, s := range []struct{ path, value string }{
			{"/proc/sys/net/ipv4/tcp_syncookies", "1"},
			{"/proc/sys/net/core/somaxconn", strconv.Itoa(synBacklog)},
		} {
			if err := os.WriteFile(s.path, []byte(s.value), 0); err != nil {
				return fmt.Errorf("sysctl %s: %w", s.path, err)
			}
		}
		return nil
	}); err != nil {
		return err
	}
	fmt.Printf("   server: net.ipv4.tcp_syncookies=1 (the kernel default: cookies once the SYN queue is full),\n")
	fmt.Printf("   net.core.somaxconn=%d (caps the listen backlog, so the SYN queue holds %d and the flood fills it)\n", synBacklog, synBacklog)

	// Spoofed sources must stay silent, as forged addresses do: routed to
	// the attacker, the SYN-ACKs would otherwise meet RSTs from its stack
	// that free the server's SYN queue. An XDP counter on the attacker
	// counts what arrives and drops it; being an XDP program it also gives
	// the attacker's veth the NAPI that frames sent by XDP_TX need.
	var counter *flood.Counter
	if err := att.Do(func() (err error) {
		counter, err = flood.AttachCounter(att.Ifaces[0].Index, false)
		return err
	}); err != nil {
		return fmt.Errorf("counter on the attacker: %w", err)
	}
	defer counter.Close()
	fmt.Println("   attacker: an XDP counter drops what the server sends to the spoofed sources (forged addresses never answer)")

	fmt.Println("   attacker: SYNs with a Linux client's options, generated in the kernel (flood.Run, one thread)")

	fmt.Println("\n== round A: the kernel alone (no moat)")
	kernelOnly, err := synFloodRound(ctx, l, counter, dst, floodFor, nil)
	if err != nil {
		return err
	}

	fmt.Printf("\n== attaching moat and protecting tcp/%d with SYN cookies in XDP\n", synPort)
	// Moat answers SYNs with XDP_TX, which the client's veth delivers only
	// while it runs an XDP program: a pass-through one.
	pass, err := l.Client.AttachPassXDP()
	if err != nil {
		return err
	}
	passAttached := true
	defer func() {
		if passAttached {
			pass.Close()
		}
	}()
	fmt.Printf("   client: pass-through XDP program on %s (veth delivers XDP_TX frames only to a peer running NAPI)\n", l.Client.Ifaces[0].Name)

	moatCmd := moatIn(srv, moat, root)
	attached := false
	defer func() {
		if attached { // only on failure: the normal path detaches below
			moatOutput(srv, moat, root, false, "detach", "--all")
		}
	}()
	attached = true // an attach that fails half-way may still leave pins
	// No denylist this time: forged sources are unknown in a real flood.
	if err := moatCmd("attach", srv.Ifaces[0].Name, srv.Ifaces[1].Name); err != nil {
		return err
	}
	if err := moatCmd("syn", "protect", fmt.Sprintf("tcp/%d", synPort), "--mode", "always"); err != nil {
		return err
	}

	fmt.Println("\n== round B: with moat (syn protect --mode always)")
	withMoat, err := synFloodRound(ctx, l, counter, dst, floodFor, func() (*syncookie.PortStatus, error) {
		return synStatus(srv, moat, root)
	})
	if err != nil {
		return err
	}

	fmt.Println("\n== moat's view of the SYN defence")
	if err := moatCmd("syn", "status"); err != nil {
		return err
	}

	printSynTable(l, floodFor, kernelOnly, withMoat)

	fmt.Println("\n== tearing down part two")
	if err := moatCmd("detach", "--all"); err != nil {
		return err
	}
	attached = false
	if err := pass.Close(); err != nil {
		return fmt.Errorf("remove pass-through XDP from the client: %w", err)
	}
	passAttached = false
	fmt.Printf("   removed the pass-through XDP program from the client's %s and the counter from the attacker\n", l.Client.Ifaces[0].Name)

	if share := float64(withMoat.served) / float64(max(withMoat.attempted, 1)); withMoat.attempted == 0 || share < minServed {
		return fmt.Errorf("with moat the client got %d of %d connections (%.1f%%), below %.0f%%",
			withMoat.served, withMoat.attempted, 100*share, 100*minServed)
	}
	// Every served connection must have been a moat cookie handshake, or
	// the round measured the kernel rather than moat.
	if withMoat.moat == nil || withMoat.moat.CookiesAccepted < uint64(withMoat.served) {
		return fmt.Errorf("with moat: %d connections served but only %v moat cookies accepted", withMoat.served, withMoat.moat)
	}
	// The flood itself must have met moat's cookies, or the table
	// describes something else (a generator that stopped sending SYNs, say).
	if withMoat.kernel.cookiesSent != 0 || withMoat.moat.CookiesIssued < withMoat.flood.Sent/2 {
		return fmt.Errorf("with moat: %d spoofed SYNs sent, moat issued %d cookies and the kernel %d: the flood did not meet moat's cookies",
			withMoat.flood.Sent, withMoat.moat.CookiesIssued, withMoat.kernel.cookiesSent)
	}
	fmt.Println("done: under a spoofed SYN flood moat answered every SYN from XDP and the client was served.")
	return nil
}

// synFloodRound runs one flood with the client connecting throughout. A
// fresh listener per round: closing it empties its SYN queue, so no round
// inherits the previous one's half-open connections. moatStatus, when set,
// reads moat's counters for the port.
func synFloodRound(ctx context.Context, l *lab.Lab, counter *flood.Counter, dst netip.Addr, floodFor time.Duration,
	moatStatus func() (*syncookie.PortStatus, error)) (synRound, error) {
	var r synRound
	ln, err := listenEcho(l.Server)
	if err != nil {
		return r, err
	}
	defer ln.Close()

	kernelBefore, err := readKernelCounters(l.Server)
	if err != nil {
		return r, err
	}
	countsBefore, err := counter.Counts()
	if err != nil {
		return r, err
	}

	att := l.Attacker.Ifaces[0]
	floodDone := make(chan error, 1)
	go func() {
		floodDone <- l.Attacker.Do(func() (err error) {
			r.flood, err = flood.Run(ctx, flood.Config{
				Kind: flood.KindSYN, IfIndex: att.Index, DstMAC: att.PeerMAC,
				Sources: l.SpoofV4, Dst: att.PeerIPv4, DstPort: synPort,
				Duration: floodFor,
				Force:    true, // the demo built this namespace itself
			})
			return err
		})
	}()

	stop := make(chan struct{})
	clientDone := make(chan []time.Duration, 1)
	go func() {
		select {
		case <-time.After(clientLead):
		case <-stop:
		}
		clientDone <- clientLoad(ctx, l.Client, netip.AddrPortFrom(dst, synPort), stop)
	}()
	ferr := <-floodDone
	close(stop)
	lat := <-clientDone
	if ferr != nil {
		return r, fmt.Errorf("SYN flood: %w", ferr)
	}
	if ctx.Err() != nil {
		return r, ctx.Err()
	}

	// In-flight SYN-ACKs and the client's last handshakes settle first.
	time.Sleep(200 * time.Millisecond)
	kernelAfter, err := readKernelCounters(l.Server)
	if err != nil {
		return r, err
	}
	countsAfter, err := counter.Counts()
	if err != nil {
		return r, err
	}
	r.kernel = kernelCounters{
		cookiesSent: kernelAfter.cookiesSent - kernelBefore.cookiesSent,
		cookiesRecv: kernelAfter.cookiesRecv - kernelBefore.cookiesRecv,
		listenDrops: kernelAfter.listenDrops - kernelBefore.listenDrops,
	}
	r.atSpoofed = countsAfter.TCPOther - countsBefore.TCPOther
	if moatStatus != nil {
		if r.moat, err = moatStatus(); err != nil {
			return r, err
		}
	}

	r.attempted = len(lat)
	for _, d := range lat {
		if d != failed {
			r.served++
		}
	}
	slices.Sort(lat)
	r.p50, r.p99 = percentile(lat, 0.50), percentile(lat, 0.99)
	fmt.Printf("   attacker: %d spoofed SYNs at %.2f Mpps; client: %d of %d connections served, connect p50 %s, p99 %s\n",
		r.flood.Sent, r.flood.PPS/1e6, r.served, r.attempted, fmtLatency(r.p50), fmtLatency(r.p99))
	return r, nil
}

// failed marks an attempt that did not complete: it sorts after every
// real latency, so percentiles beyond the success rate show as failures.
const failed = time.Duration(math.MaxInt64)

func percentile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return failed
	}
	i := int(math.Ceil(q*float64(len(sorted)))) - 1
	return sorted[max(i, 0)]
}

func fmtLatency(d time.Duration) string {
	if d == failed {
		return "failed"
	}
	if d < time.Millisecond {
		return fmt.Sprintf("%dµs", d.Microseconds())
	}
	return fmt.Sprintf("%.1fms", float64(d)/float64(time.Millisecond))
}

// listenEcho starts an echo server on synPort in h's namespace.
func listenEcho(h *lab.Host) (net.Listener, error) {
	// Go enables MPTCP on listeners by default, and moat leaves an MPTCP
	// listener's SYNs to the kernel (which makes no connection from a moat
	// cookie for one): turn it off, so that moat answers them.
	var lc net.ListenConfig
	lc.SetMultipathTCP(false)
	var ln net.Listener
	if err := h.Do(func() (err error) {
		ln, err = lc.Listen(context.Background(), "tcp", fmt.Sprintf(":%d", synPort))
		return err
	}); err != nil {
		return nil, fmt.Errorf("listen on tcp/%d: %w", synPort, err)
	}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				c.SetDeadline(time.Now().Add(echoTimeout))
				io.Copy(c, c)
			}()
		}
	}()
	return ln, nil
}

// clientLoad opens connections to dst from h until stop is closed and
// returns one entry per attempt: its connect latency, or failed when the
// connection or its echo did not complete.
func clientLoad(ctx context.Context, h *lab.Host, dst netip.AddrPort, stop <-chan struct{}) []time.Duration {
	var (
		mu  sync.Mutex
		all []time.Duration
		wg  sync.WaitGroup
	)
	d := net.Dialer{Timeout: dialTimeout}
	for range clientWorkers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tick := time.NewTicker(clientInterval)
			defer tick.Stop()
			for {
				lat := connectEcho(ctx, h, &d, dst)
				mu.Lock()
				all = append(all, lat)
				mu.Unlock()
				select {
				case <-stop:
					return
				case <-ctx.Done():
					return
				case <-tick.C:
				}
			}
		}()
	}
	wg.Wait()
	return all
}

// connectEcho makes one connection, has a line echoed through it and
// returns the time the handshake took, or failed.
func connectEcho(ctx context.Context, h *lab.Host, d *net.Dialer, dst netip.AddrPort) time.Duration {
	var c net.Conn
	t0 := time.Now()
	// The socket is created in the namespace; it stays there afterwards.
	if err := h.Do(func() (err error) {
		c, err = d.DialContext(ctx, "tcp", dst.String())
		return err
	}); err != nil {
		return failed
	}
	lat := time.Since(t0)
	defer c.Close()
	// The handshake only counts if the server took it: under cookies the
	// client is connected as soon as it sends its ACK, whatever became of it.
	c.SetDeadline(time.Now().Add(echoTimeout))
	const line = "hello\n"
	if _, err := io.WriteString(c, line); err != nil {
		return failed
	}
	buf := make([]byte, len(line))
	if _, err := io.ReadFull(c, buf); err != nil || string(buf) != line {
		return failed
	}
	return lat
}

// readKernelCounters reads the TcpExt counters of h's namespace. It reads
// /proc/thread-self: /proc/self/net would show the namespace of the
// process's main thread, not of the thread Do switched.
func readKernelCounters(h *lab.Host) (kernelCounters, error) {
	var k kernelCounters
	err := h.Do(func() error {
		f, err := os.Open("/proc/thread-self/net/netstat")
		if err != nil {
			return err
		}
		defer f.Close()
		// Pairs of lines: "TcpExt: Name1 Name2 ..." then "TcpExt: v1 v2 ...".
		var names []string
		sc := bufio.NewScanner(f)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			fields := strings.Fields(sc.Text())
			if len(fields) == 0 || fields[0] != "TcpExt:" {
				continue
			}
			if names == nil {
				names = fields
				continue
			}
			for i := 1; i < len(fields) && i < len(names); i++ {
				v, _ := strconv.ParseUint(fields[i], 10, 64)
				switch names[i] {
				case "SyncookiesSent":
					k.cookiesSent = v
				case "SyncookiesRecv":
					k.cookiesRecv = v
				case "ListenDrops":
					k.listenDrops = v
				}
			}
			return nil
		}
		if err := sc.Err(); err != nil {
			return err
		}
		return errors.New("no TcpExt counters")
	})
	if err != nil {
		return k, fmt.Errorf("kernel counters of %s: %w", h.Name, err)
	}
	return k, nil
}

// synStatus reads moat's counters for synPort through `moat syn status --json`.
func synStatus(h *lab.Host, moat, root string) (*syncookie.PortStatus, error) {
	out, err := moatOutput(h, moat, root, false, "syn", "status", "--json")
	if err != nil {
		return nil, fmt.Errorf("%w: %s", err, strings.TrimSpace(string(out)))
	}
	var st struct {
		Ports []syncookie.PortStatus `json:"ports"`
	}
	if err := json.Unmarshal(out, &st); err != nil {
		return nil, fmt.Errorf("moat syn status --json: %w", err)
	}
	for _, p := range st.Ports {
		if p.Port == synPort {
			return &p, nil
		}
	}
	return nil, fmt.Errorf("moat syn status does not list tcp/%d", synPort)
}

func printSynTable(l *lab.Lab, floodFor time.Duration, a, b synRound) {
	fmt.Printf("\n== SYN flood: %v of spoofed SYNs from %s while the client connects\n", floodFor, l.SpoofV4)
	w := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(w, "\tkernel alone\twith moat\t")
	fmt.Fprintf(w, "client connections ok / attempted\t%d/%d\t%d/%d\t\n", a.served, a.attempted, b.served, b.attempted)
	fmt.Fprintf(w, "client connect p50\t%s\t%s\t\n", fmtLatency(a.p50), fmtLatency(b.p50))
	fmt.Fprintf(w, "client connect p99\t%s\t%s\t\n", fmtLatency(a.p99), fmtLatency(b.p99))
	fmt.Fprintf(w, "spoofed SYNs sent (Mpps)\t%d (%.2f)\t%d (%.2f)\t\n", a.flood.Sent, a.flood.PPS/1e6, b.flood.Sent, b.flood.PPS/1e6)
	fmt.Fprintf(w, "SYN-ACKs by the kernel as cookies\t%d\t%d\t\n", a.kernel.cookiesSent, b.kernel.cookiesSent)
	var issued, accepted uint64
	if b.moat != nil {
		issued, accepted = b.moat.CookiesIssued, b.moat.CookiesAccepted
	}
	fmt.Fprintf(w, "SYN-ACKs by moat in XDP (cookies)\t-\t%d\t\n", issued)
	fmt.Fprintf(w, "SYN-ACKs reaching the spoofed sources\t%d\t%d\t\n", a.atSpoofed, b.atSpoofed)
	fmt.Fprintf(w, "handshakes completed by cookie: kernel / moat\t%d / -\t%d / %d\t\n", a.kernel.cookiesRecv, b.kernel.cookiesRecv, accepted)
	fmt.Fprintf(w, "SYNs the kernel dropped (ListenDrops)\t%d\t%d\t\n", a.kernel.listenDrops, b.kernel.listenDrops)
	w.Flush()
	fmt.Printf("   kernel alone: the flood fills the %d-entry SYN queue at once; from then on the kernel answers every\n", synBacklog)
	fmt.Println("   SYN, the client's too, with a cookie of its own, after allocating an skb and running the TCP stack.")
	fmt.Println("   with moat: XDP answers every SYN to the port with a cookie before the kernel allocates anything, and")
	fmt.Println("   moat's tcx program turns the client's cookie ACKs into connections; the kernel sends no SYN-ACK at all.")
	fmt.Println("   Both rounds keep every vCPU busy: the flood rate is what sender and server sustain together, so the")
	fmt.Println("   higher rate with moat is the lower cost of answering a SYN in XDP.")
}
