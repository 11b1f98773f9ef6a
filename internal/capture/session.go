package capture

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/ringbuf"
	"golang.org/x/sys/unix"

	"github.com/moat-shield/moat/internal/datapath"
	"github.com/moat-shield/moat/internal/shield"
)

// Lease timing. A killed session keeps the data path capturing for at most
// leaseTime; renewals come often enough that two may be missed.
const (
	leaseTime  = 3 * time.Second
	leaseRenew = time.Second
)

// ErrBusy is returned by Start while another session captures.
var ErrBusy = errors.New("another moat dump is capturing (one at a time)")

// Maps are the data path's capture maps, and the port rule definitions
// that name port rules in the records.
type Maps struct {
	Settings, Ring, Lost, PortRuleDefs *ebpf.Map
}

// PinnedMaps takes its own handles on the capture maps of open pinned
// state, so that the caller can close s, and with it the state's lock,
// while the capture runs.
func PinnedMaps(s *shield.Shield) (Maps, error) {
	var m Maps
	for _, x := range []struct {
		dst  **ebpf.Map
		name string
	}{
		{&m.Settings, datapath.MoatMapCaptureSettings},
		{&m.Ring, datapath.MoatMapCaptureRing},
		{&m.Lost, datapath.MoatMapCaptureLost},
		{&m.PortRuleDefs, datapath.MoatMapPortRuleDefs},
	} {
		src := s.Map(x.name)
		if src == nil {
			m.Close()
			return Maps{}, fmt.Errorf("the pinned state under %s has no map %s; re-attach with this version of moat", s.Root(), x.name)
		}
		c, err := src.Clone()
		if err != nil {
			m.Close()
			return Maps{}, fmt.Errorf("open map %s: %w", x.name, err)
		}
		*x.dst = c
	}
	return m, nil
}

// Close releases the handles.
func (m Maps) Close() {
	for _, x := range []*ebpf.Map{m.Settings, m.Ring, m.Lost, m.PortRuleDefs} {
		if x != nil {
			x.Close()
		}
	}
}

// Packet is one captured frame.
type Packet struct {
	Time    time.Time
	Ifindex int
	Length  int    // length of the frame on the wire
	Data    []byte // its first bytes, up to the snap length
	Action  uint8  // XDP_DROP, XDP_PASS, ...
	// Monitored: a rule would have dropped the frame and monitor mode
	// passed it (Action is XDP_PASS).
	Monitored bool
	Reason    shield.Reason
	// Rule is the allow or deny entry that decided, when one did.
	Rule netip.Prefix
	// PortRule is the id of the port rule that decided, 0 if none.
	PortRule uint16
}

// XDP actions, as the data path reports them.
const (
	ActionAborted = 0
	ActionDrop    = 1
	ActionPass    = 2
	ActionTX      = 3
)

// Session is a running capture.
type Session struct {
	maps     Maps
	cfg      datapath.MoatCaptureConfig
	rd       *ringbuf.Reader
	lock     *os.File
	lostBase uint64
	wallOff  int64 // CLOCK_REALTIME - CLOCK_BOOTTIME, in ns

	mu        sync.Mutex // serialises writes of the settings
	closed    bool
	finalLost uint64 // Lost, read as Close turned capture off
	finalErr  error
	stop      chan struct{}
	renewDone chan struct{}
	lapses    atomic.Uint64
	stale     uint64 // records of an earlier session skipped
	rec       ringbuf.Record
}

// LockPath is the lock file that admits one session per pinned state at
// root. It lives in /run, like shield's, so it never shows among the pins.
func LockPath(root string) string {
	return "/run/moat-capture-" + shield.RootLockID(root) + ".lock"
}

// Start turns capture on with filter f. lockPath admits one session at a
// time (see LockPath). The session owns m and closes it.
func Start(m Maps, f Filter, lockPath string) (*Session, error) {
	if err := f.Validate(); err != nil {
		return nil, err
	}
	lock, err := os.OpenFile(lockPath, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("capture lock: %w", err)
	}
	if err := unix.Flock(int(lock.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		lock.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, ErrBusy
		}
		return nil, fmt.Errorf("capture lock: %w", err)
	}
	s := &Session{maps: m, lock: lock, stop: make(chan struct{}), renewDone: make(chan struct{})}
	fail := func(err error) (*Session, error) {
		s.rd = nil
		s.release()
		return nil, err
	}

	var prev datapath.MoatCaptureConfig
	if err := m.Settings.Lookup(uint32(0), &prev); err != nil {
		return fail(fmt.Errorf("read capture settings: %w", err))
	}
	s.cfg = f.config()
	s.cfg.Session = prev.Session + 1
	if s.lostBase, err = s.lostTotal(); err != nil {
		return fail(err)
	}
	if s.rd, err = ringbuf.NewReader(m.Ring); err != nil {
		return fail(fmt.Errorf("open capture ring: %w", err))
	}
	boot, real := clockNow(unix.CLOCK_BOOTTIME), clockNow(unix.CLOCK_REALTIME)
	s.wallOff = real - boot

	s.cfg.Enabled = 1
	s.cfg.LeaseNs = uint64(boot + int64(leaseTime))
	if err := m.Settings.Put(uint32(0), s.cfg); err != nil {
		s.rd.Close()
		return fail(fmt.Errorf("turn capture on: %w", err))
	}
	go s.renew()
	return s, nil
}

func clockNow(clock int32) int64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(clock, &ts); err != nil {
		panic(err) // both clocks exist on every Linux moat runs on
	}
	return ts.Nano()
}

// renew extends the lease until the session closes. If it finds capture
// off, the lease ran out before a renewal came (the process was stopped
// or starved), and packets went uncaptured: that is counted as a lapse.
func (s *Session) renew() {
	defer close(s.renewDone)
	t := time.NewTicker(leaseRenew)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
		}
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			return
		}
		var cur datapath.MoatCaptureConfig
		if err := s.maps.Settings.Lookup(uint32(0), &cur); err == nil && cur.Enabled == 0 {
			s.lapses.Add(1)
		}
		s.cfg.LeaseNs = uint64(clockNow(unix.CLOCK_BOOTTIME) + int64(leaseTime))
		s.maps.Settings.Put(uint32(0), s.cfg)
		s.mu.Unlock()
	}
}

// Lapses counts the times the lease ran out while the session lived.
func (s *Session) Lapses() uint64 { return s.lapses.Load() }

// lostTotal sums the data path's lost-record counters over CPUs.
func (s *Session) lostTotal() (uint64, error) {
	var per []uint64
	if err := s.maps.Lost.Lookup(uint32(0), &per); err != nil {
		return 0, fmt.Errorf("read lost samples: %w", err)
	}
	var n uint64
	for _, v := range per {
		n += v
	}
	return n, nil
}

// Lost is the number of packets that matched since Start but found the
// ring full. After Close it is the final count.
func (s *Session) Lost() (uint64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return s.finalLost, s.finalErr
	}
	n, err := s.lostTotal()
	return n - s.lostBase, err
}

// ErrTimeout is returned by Next when nothing arrived before the deadline.
var ErrTimeout = os.ErrDeadlineExceeded

var recordSize = int(unsafe.Sizeof(datapath.MoatCaptureRecord{}))

// Next returns the next packet, waiting until deadline (zero: forever).
// Data stays valid until the next call.
func (s *Session) Next(deadline time.Time) (Packet, error) {
	s.rd.SetDeadline(deadline)
	for {
		if err := s.rd.ReadInto(&s.rec); err != nil {
			return Packet{}, err
		}
		raw := s.rec.RawSample
		if len(raw) < recordSize {
			return Packet{}, fmt.Errorf("capture record of %d bytes", len(raw))
		}
		// Copied out through the generated type rather than decoded by
		// reflection, which cost more than everything else per record.
		// The record lies in native order, as the kernel wrote it.
		hdr := *(*datapath.MoatCaptureRecord)(unsafe.Pointer(unsafe.SliceData(raw)))
		// Left in the ring by a session that was killed.
		if hdr.Session != s.cfg.Session {
			s.stale++
			continue
		}
		if int(hdr.CapLen) > len(raw)-recordSize {
			return Packet{}, fmt.Errorf("capture record of %d bytes claims %d bytes of frame", len(raw), hdr.CapLen)
		}
		p := Packet{
			Time:      time.Unix(0, int64(hdr.TsNs)+s.wallOff),
			Ifindex:   int(hdr.Ifindex),
			Length:    int(hdr.PktLen),
			Data:      raw[recordSize : recordSize+int(hdr.CapLen)],
			Action:    hdr.Action,
			Monitored: hdr.Monitored != 0,
			Reason:    shield.Reason(hdr.Reason),
			PortRule:  hdr.PortRule,
		}
		switch hdr.RuleFamily {
		case 4:
			a := netip.AddrFrom4([4]byte(hdr.RuleAddr[:4]))
			p.Rule, _ = a.Prefix(int(hdr.RulePrefixlen))
		case 6:
			p.Rule, _ = netip.AddrFrom16(hdr.RuleAddr).Prefix(int(hdr.RulePrefixlen))
		}
		return p, nil
	}
}

// Close turns capture off and releases everything the session held.
func (s *Session) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	var err error
	var cur datapath.MoatCaptureConfig
	// Turned off only if still ours: after a lapse and a kill, the next
	// session may already have taken over (it cannot, while the lock is
	// held, but the check costs nothing).
	if s.maps.Settings.Lookup(uint32(0), &cur) == nil && cur.Session == s.cfg.Session {
		cur.Enabled = 0
		err = s.maps.Settings.Put(uint32(0), cur)
	}
	n, lerr := s.lostTotal()
	s.finalLost, s.finalErr = n-s.lostBase, lerr
	s.mu.Unlock()
	close(s.stop)
	<-s.renewDone
	s.release()
	return err
}

func (s *Session) release() {
	if s.rd != nil {
		s.rd.Close()
	}
	s.maps.Close()
	if s.lock != nil {
		s.lock.Close()
	}
}

func nativeWord(b []byte) uint32 { return binary.NativeEndian.Uint32(b) }
