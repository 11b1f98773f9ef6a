// Package flood is moat's lab traffic generator. The XDP program flood_gen
// (bpf/flood.bpf.c) runs under BPF_PROG_TEST_RUN in live-frames mode: the
// kernel feeds it a template frame over and over, it rewrites the fields
// that make each frame a new flow (spoofed source, ports, sequence numbers),
// patches the checksums incrementally and returns XDP_TX, which sends the
// frame out of the device. That reaches millions of packets per second per
// CPU, far beyond socket-based tools.
//
// Counts are exact: each sending thread loads its own program instance with
// a budget of frames, and the program drops whatever exceeds it, so no run
// can send more than asked, whatever ends it.
//
// The package also has the receiving end for tests and measurements: a
// Counter (frames by kind) and a Dropper (XDP_DROP only).
package flood

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"net"
	"net/netip"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// Config describes one flood.
type Config struct {
	Kind    Kind
	IfIndex int // sending device, in the calling thread's network namespace
	// SrcMAC defaults to the sending device's address. DstMAC is required:
	// frames for another MAC do not reach the peer's stack.
	SrcMAC, DstMAC net.HardwareAddr
	// Sources is the spoofed source range; each frame picks an address in
	// it at random, or, with Sequential, the next one in order (wrapping).
	Sources    netip.Prefix
	Sequential bool
	Dst        netip.Addr
	DstPort    uint16 // required for every kind but icmp and syn-random-port
	// PayloadSize is the UDP or ICMP payload in bytes; 0 picks the default
	// of the kind. Other kinds carry no chosen payload.
	PayloadSize int
	ServerName  string // SNI of tls-hello; DefaultServerName when empty
	VLAN        uint16 // 802.1Q VLAN ID, 0 for untagged frames

	// Count is the exact number of frames to send (0: no limit). Duration
	// bounds the run's time (0: no limit). With neither, Run sends until ctx
	// is cancelled. Rate caps the total packets per second (0: no cap).
	Count    uint64
	Duration time.Duration
	Rate     uint64
	Threads  int  // sending threads, each on its own OS thread; default 1
	PinCPUs  bool // pin thread i to CPU i (modulo the CPUs Run may use)
	Force    bool // send even where CheckTarget refuses
	// Background runs the sending threads at SCHED_IDLE: they send as fast
	// as they can with the CPU time no other task wants, as attackers on
	// other machines would, rather than take a share from the processes
	// of a lab on the same machine.
	Background bool
}

// Result is what a flood did. Sent counts the frames the generator handed
// to the device (XDP_TX), exactly. A veth peer takes every one of them if
// it has NAPI (an XDP program or GRO) and a receive queue per sending CPU;
// with fewer queues, parallel threads can overflow a shared 256-frame ring.
//
// Calls counts the kernel calls that sent the frames, over all threads.
// Each ends in a pause of 20-30ms in which its thread sends nothing. A
// thread makes one call unless a Rate splits its flood into slices, or it
// sends more than 2^32 frames; a signal that reaches the thread for
// another reason ends a call early and adds one.
type Result struct {
	Sent    uint64        `json:"sent"`
	Elapsed time.Duration `json:"elapsed_ns"`
	PPS     float64       `json:"pps"`
	Calls   uint64        `json:"calls"`
}

const (
	// liveBatch is the kernel's batch size: frames are transmitted and the
	// receiving veth's NAPI runs once per batch. 64 is the kernel's default
	// and stays well below veth's 256-frame ring, so a receiver on the same
	// CPU never overflows.
	liveBatch = 64
	// maxCallRuns is the most frames one call can send (the kernel's
	// repeat is 32 bits). A flood without a rate sends its count, or
	// until its deadline or its context ends the call with a signal (see
	// testrun.go), in one call per thread, so it does not pause between
	// calls.
	maxCallRuns = math.MaxUint32
	// rateSlice is how much time one call covers under a rate cap.
	rateSlice = 100 * time.Millisecond
)

// xdpMD is the kernel's struct xdp_md (uapi <linux/bpf.h>), the context of
// a live-frames run. Only the ingress ifindex and the data end matter.
type xdpMD struct {
	Data           uint32
	DataEnd        uint32
	DataMeta       uint32
	IngressIfindex uint32
	RxQueueIndex   uint32
	EgressIfindex  uint32
}

// Validate checks cfg as Run does before it sends anything: an error
// here is the caller's mistake, not the system's.
func (cfg Config) Validate() error { return cfg.validate() }

func (cfg *Config) validate() error {
	switch cfg.Kind {
	case KindSYN, KindACK, KindUDP, KindICMP, KindSYNRandomPort, KindTLSHello, KindQUICInitial:
	case "":
		return errors.New("no attack kind given")
	default:
		return fmt.Errorf("unknown attack kind %q", cfg.Kind)
	}
	if cfg.IfIndex <= 0 {
		return errors.New("no sending interface given")
	}
	if !hardwareAddrOK(cfg.DstMAC) {
		return fmt.Errorf("destination MAC %q is not an Ethernet address", cfg.DstMAC)
	}
	if cfg.SrcMAC != nil && !hardwareAddrOK(cfg.SrcMAC) {
		return fmt.Errorf("source MAC %q is not an Ethernet address", cfg.SrcMAC)
	}
	if !cfg.Dst.IsValid() {
		return errors.New("no destination address given")
	}
	if cfg.Dst.Is4In6() {
		cfg.Dst = cfg.Dst.Unmap()
	}
	if !cfg.Sources.IsValid() {
		return errors.New("no source prefix given")
	}
	if cfg.Sources.Addr().Is4() != cfg.Dst.Is4() {
		return fmt.Errorf("source prefix %s and destination %s are of different families", cfg.Sources, cfg.Dst)
	}
	if cfg.DstPort == 0 && cfg.Kind != KindICMP && cfg.Kind != KindSYNRandomPort {
		return fmt.Errorf("%s flood needs a destination port", cfg.Kind)
	}
	switch cfg.Kind {
	case KindUDP, KindICMP:
		ipHeader := 20
		if cfg.Dst.Is6() {
			ipHeader = 40
		}
		if most := maxIPPacket - ipHeader - 8; cfg.PayloadSize < 0 || cfg.PayloadSize > most {
			return fmt.Errorf("payload size %d out of range 0-%d", cfg.PayloadSize, most)
		}
	default:
		if cfg.PayloadSize != 0 {
			return fmt.Errorf("%s flood has no payload size to choose", cfg.Kind)
		}
	}
	if cfg.VLAN > 4094 {
		return fmt.Errorf("VLAN ID %d out of range 0-4094", cfg.VLAN)
	}
	if cfg.Threads < 0 || cfg.Threads > 1024 {
		return fmt.Errorf("thread count %d out of range 1-1024", cfg.Threads)
	}
	if cfg.Duration < 0 {
		return fmt.Errorf("duration %s is negative", cfg.Duration)
	}
	if cfg.Count != 0 && cfg.Threads > 0 && uint64(cfg.Threads) > cfg.Count {
		cfg.Threads = int(cfg.Count) // no thread without a frame to send
	}
	return nil
}

func (cfg *Config) applyDefaults() {
	if cfg.Threads == 0 {
		cfg.Threads = 1
	}
	if cfg.PayloadSize == 0 {
		switch cfg.Kind {
		case KindUDP:
			cfg.PayloadSize = DefaultUDPPayload
		case KindICMP:
			cfg.PayloadSize = DefaultICMPPayload
		}
	}
	if cfg.ServerName == "" {
		cfg.ServerName = DefaultServerName
	}
}

// Run sends a flood out of cfg.IfIndex and returns when Count frames are
// sent, Duration has passed or ctx is done, whichever comes first. A
// cancelled ctx is not an error: the result says what was sent.
//
// Namespaces: Run works in the network namespace of the calling OS thread.
// To flood from another namespace, lock the goroutine to its thread, switch
// that thread's namespace and call Run; Run moves each of its sending
// threads into the same namespace.
func Run(ctx context.Context, cfg Config) (Result, error) {
	if err := cfg.validate(); err != nil {
		return Result{}, err
	}
	cfg.applyDefaults()

	runtime.LockOSThread()
	ns, err := netns.Get()
	if err == nil {
		err = CheckTarget(cfg.IfIndex, cfg.Force)
	}
	if err == nil && cfg.SrcMAC == nil {
		cfg.SrcMAC, err = deviceMAC(cfg.IfIndex)
	}
	runtime.UnlockOSThread()
	if err != nil {
		if ns.IsOpen() {
			ns.Close()
		}
		return Result{}, err
	}
	defer ns.Close()

	tmpl, spec, err := prepare(&cfg)
	if err != nil {
		return Result{}, err
	}

	var cpus []int
	if cfg.PinCPUs {
		if cpus, err = allowedCPUs(); err != nil {
			return Result{}, err
		}
	}

	// Workers load their programs, then wait at the gate, so that the
	// elapsed time covers sending only and a thread that cannot load its
	// program stops the others before they send anything.
	threads := cfg.Threads
	g := &gate{start: make(chan struct{})}
	var done sync.WaitGroup
	sent := make([]uint64, threads)
	errs := make([]error, threads)
	workers := make([]*worker, threads)
	g.ready.Add(threads)
	done.Add(threads)
	for i := range threads {
		w := &worker{
			index:   i,
			spec:    spec,
			tmpl:    tmpl,
			ifindex: cfg.IfIndex,
			ns:      ns,
			quota:   share(cfg.Count, threads, i),
			rate:    float64(cfg.Rate) / float64(threads),
			seqBase: uint64(i),
			seqStep: uint64(threads),
			cpu:     -1,

			background: cfg.Background,
		}
		if cpus != nil {
			w.cpu = cpus[i%len(cpus)]
		}
		workers[i] = w
		go func() {
			defer done.Done()
			sent[i], errs[i] = w.run(ctx, g)
		}()
	}
	g.ready.Wait()
	t0 := time.Now()
	if cfg.Duration > 0 {
		g.deadline = t0.Add(cfg.Duration)
	}
	g.abort = g.failed.Load()
	close(g.start)
	done.Wait()
	elapsed := time.Since(t0)

	res := Result{Elapsed: elapsed}
	for i, n := range sent {
		res.Sent += n
		res.Calls += workers[i].calls
	}
	if elapsed > 0 {
		res.PPS = float64(res.Sent) / elapsed.Seconds()
	}
	return res, errors.Join(errs...)
}

// share splits count frames over n threads exactly: the first count%n
// threads send one more. A count of 0 means no limit for any thread.
func share(count uint64, n, i int) uint64 {
	if count == 0 {
		return 0
	}
	q := count / uint64(n)
	if uint64(i) < count%uint64(n) {
		q++
	}
	return q
}

// configure sets the program's load-time constants from the template.
func configure(spec *ebpf.CollectionSpec, t *frameTemplate, cfg *Config) error {
	base, mask := hostMask(cfg.Sources)
	// The program restores the template's leading bytes before each frame
	// (see cfg_headers in flood.bpf.c); its array sets how many fit.
	hv, ok := spec.Variables[FloodVarCfgHeaders]
	if !ok {
		return fmt.Errorf("flood program lacks variable %s", FloodVarCfgHeaders)
	}
	headers := make([]byte, hv.Size())
	n := copy(headers, t.frame)
	var seq uint8
	if cfg.Sequential {
		seq = 1
	}
	set := []struct {
		name  string
		value any
	}{
		{FloodVarCfgFamily, t.family},
		{FloodVarCfgL4proto, t.l4proto},
		{FloodVarCfgSequential, seq},
		{FloodVarCfgL3Off, t.l3Off},
		{FloodVarCfgTsvalOff, t.tsvalOff},
		{FloodVarCfgRewrite, uint32(t.rewrite)},
		{FloodVarCfgSrcBase, base},
		{FloodVarCfgSrcMask, mask},
		{FloodVarCfgHeaders, headers},
		{FloodVarCfgHeadersLen, uint32(n)},
	}
	for _, s := range set {
		v, ok := spec.Variables[s.name]
		if !ok {
			return fmt.Errorf("flood program lacks variable %s", s.name)
		}
		if err := v.Set(s.value); err != nil {
			return fmt.Errorf("set %s: %w", s.name, err)
		}
	}
	return nil
}

// generator is one loaded instance of the generator program.
type generator struct {
	prog      *ebpf.Program
	sentCount *ebpf.Variable
}

// newGenerator loads an instance of a configured spec. Its sequential walk
// starts at host number seqFirst and steps by seqStride; it sends at most
// budget frames over its lifetime.
func newGenerator(spec *ebpf.CollectionSpec, seqFirst, seqStride, budget uint64) (*generator, error) {
	spec = spec.Copy()
	var seed [8]byte
	rand.Read(seed[:])
	for _, s := range []struct {
		name  string
		value uint64
	}{
		{FloodVarCfgSeqFirst, seqFirst},
		{FloodVarCfgSeqStride, seqStride},
		{FloodVarBudget, budget},
		{FloodVarPrngState, binary.NativeEndian.Uint64(seed[:]) | 1}, // xorshift needs non-zero
	} {
		if err := spec.Variables[s.name].Set(s.value); err != nil {
			return nil, fmt.Errorf("set %s: %w", s.name, err)
		}
	}
	var objs struct {
		Gen  *ebpf.Program  `ebpf:"flood_gen"`
		Sent *ebpf.Variable `ebpf:"sent"`
	}
	if err := spec.LoadAndAssign(&objs, nil); err != nil {
		return nil, fmt.Errorf("load flood program: %w", err)
	}
	return &generator{prog: objs.Gen, sentCount: objs.Sent}, nil
}

// sent returns how many frames the instance has returned with XDP_TX.
func (g *generator) sent() (uint64, error) {
	var n uint64
	if err := g.sentCount.Get(&n); err != nil {
		return 0, fmt.Errorf("read sent count: %w", err)
	}
	return n, nil
}

func (g *generator) Close() error { return g.prog.Close() }

// prepare checks cfg, fills in defaults and returns the frame template and
// the program spec configured for it. cfg.SrcMAC must be set.
func prepare(cfg *Config) (*frameTemplate, *ebpf.CollectionSpec, error) {
	if err := cfg.validate(); err != nil {
		return nil, nil, err
	}
	cfg.applyDefaults()
	if !hardwareAddrOK(cfg.SrcMAC) {
		return nil, nil, fmt.Errorf("source MAC %q is not an Ethernet address", cfg.SrcMAC)
	}
	tmpl, err := buildTemplate(cfg)
	if err != nil {
		return nil, nil, err
	}
	spec, err := LoadFlood()
	if err != nil {
		return nil, nil, err
	}
	if err := configure(spec, tmpl, cfg); err != nil {
		return nil, nil, err
	}
	return tmpl, spec, nil
}

// worker is one sending thread with its own program instance, so its
// budget, counters and random state are never shared.
type worker struct {
	index            int
	spec             *ebpf.CollectionSpec
	tmpl             *frameTemplate
	ifindex          int
	ns               netns.NsHandle
	quota            uint64 // 0: no limit
	rate             float64
	seqBase, seqStep uint64
	cpu              int // -1: not pinned
	background       bool
	calls            uint64 // kernel calls made, read after the thread ends
}

// gate holds sending threads until all are ready.
type gate struct {
	ready  sync.WaitGroup
	failed atomic.Bool // a thread could not get ready
	// Written before start is closed, read after.
	start    chan struct{}
	abort    bool
	deadline time.Time
}

func (w *worker) run(ctx context.Context, g *gate) (uint64, error) {
	readied := false
	defer func() {
		if !readied {
			g.failed.Store(true)
			g.ready.Done()
		}
	}()
	// The thread's namespace (and CPU mask) change, so it must never run
	// another goroutine: it stays locked and exits with this one.
	runtime.LockOSThread()
	if err := netns.Set(w.ns); err != nil {
		return 0, fmt.Errorf("thread %d: enter network namespace: %w", w.index, err)
	}
	if w.cpu >= 0 {
		var set unix.CPUSet
		set.Set(w.cpu)
		if err := unix.SchedSetaffinity(0, &set); err != nil {
			return 0, fmt.Errorf("thread %d: pin to CPU %d: %w", w.index, w.cpu, err)
		}
	}
	if w.background {
		if err := unix.SchedSetAttr(0, &unix.SchedAttr{Policy: unix.SCHED_IDLE}, 0); err != nil {
			return 0, fmt.Errorf("thread %d: SCHED_IDLE: %w", w.index, err)
		}
	}

	budget := w.quota
	if budget == 0 {
		budget = math.MaxUint64
	}
	gen, err := newGenerator(w.spec, w.seqBase, w.seqStep, budget)
	if err != nil {
		return 0, fmt.Errorf("thread %d: %w", w.index, err)
	}
	defer gen.Close()

	readied = true
	g.ready.Done()
	<-g.start
	if g.abort {
		return 0, nil
	}
	deadline := g.deadline
	t0 := time.Now()

	// The deadline and the context end the call in progress.
	it := newInterrupter()
	defer it.Done()
	defer context.AfterFunc(ctx, it.Stop)()
	if !deadline.IsZero() {
		defer time.AfterFunc(time.Until(deadline), it.Stop).Stop()
	}

	md := &xdpMD{DataEnd: uint32(len(w.tmpl.frame)), IngressIfindex: uint32(w.ifindex)}
	call := &liveRun{progFD: gen.prog.FD(), frame: w.tmpl.frame, md: md}
	var sent uint64
	for w.quota == 0 || sent < w.quota {
		if it.Stopped() || ctx.Err() != nil || (!deadline.IsZero() && !time.Now().Before(deadline)) {
			break
		}
		frames := uint64(maxCallRuns)
		if w.rate > 0 {
			// Send a slice's worth, then wait until the schedule catches up.
			frames = uint64(w.rate * rateSlice.Seconds())
			due := t0.Add(time.Duration(float64(sent) / w.rate * float64(time.Second)))
			if wait := time.Until(due); wait > 0 && !sleepCtx(ctx, wait, deadline) {
				continue // the loop head sees why
			}
		}
		if w.quota != 0 {
			frames = min(frames, w.quota-sent)
		}
		runErr := call.run(uint32(max(1, min(frames, maxCallRuns))), liveBatch)
		w.calls++
		if runErr != nil && !errors.Is(runErr, errInterrupted) {
			return sent, fmt.Errorf("thread %d: run generator: %w", w.index, runErr)
		}
		now, err := gen.sent()
		if err != nil {
			return sent, fmt.Errorf("thread %d: %w", w.index, err)
		}
		// The kernel runs a batch before it looks for a signal, so a call
		// that sent nothing, interrupted or not, had its template refused.
		if now == sent {
			return sent, fmt.Errorf("thread %d: generator sent nothing (template rejected)", w.index)
		}
		sent = now
	}
	return sent, nil
}

// sleepCtx sleeps for d, or less if ctx ends or the deadline comes first.
// It reports whether the full time was slept.
func sleepCtx(ctx context.Context, d time.Duration, deadline time.Time) bool {
	full := true
	if !deadline.IsZero() {
		if left := time.Until(deadline); left < d {
			d, full = max(left, 0), false
		}
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return full
	case <-ctx.Done():
		return false
	}
}

// allowedCPUs lists the CPUs this process may run on.
func allowedCPUs() ([]int, error) {
	var set unix.CPUSet
	if err := unix.SchedGetaffinity(0, &set); err != nil {
		return nil, fmt.Errorf("read CPU affinity: %w", err)
	}
	var cpus []int
	for i := range 1024 {
		if set.IsSet(i) {
			cpus = append(cpus, i)
		}
	}
	if len(cpus) == 0 {
		return nil, errors.New("no CPU to pin to")
	}
	return cpus, nil
}

// deviceMAC returns the hardware address of a device in the calling
// thread's namespace.
func deviceMAC(ifindex int) (net.HardwareAddr, error) {
	link, err := netlink.LinkByIndex(ifindex)
	if err != nil {
		return nil, fmt.Errorf("interface %d: %w", ifindex, err)
	}
	mac := link.Attrs().HardwareAddr
	if !hardwareAddrOK(mac) {
		return nil, fmt.Errorf("interface %s has no Ethernet address; give a source MAC", link.Attrs().Name)
	}
	return mac, nil
}
