package syncookie

import (
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"math/bits"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
	"unsafe"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"

	"github.com/moat-shield/moat/internal/datapath"
)

// Mode is what moat does with SYNs to a protected port.
type Mode uint8

const (
	// ModeOff: the port is not protected (nothing counted).
	ModeOff = Mode(datapath.MoatSynModeSYN_MODE_OFF)
	// ModeNever: SYNs are counted and always left to the kernel.
	ModeNever = Mode(datapath.MoatSynModeSYN_MODE_NEVER)
	// ModeAlways: every SYN is answered with a moat cookie.
	ModeAlways = Mode(datapath.MoatSynModeSYN_MODE_ALWAYS)
	// ModeAuto: cookies only while a SYN flood is detected.
	ModeAuto = Mode(datapath.MoatSynModeSYN_MODE_AUTO)
)

// DefaultRotation is how often keys rotate; a cookie lives one to two
// rotation periods. It must match SYN_DEFAULT_ROTATION_NS (syn_structs.h),
// the period the data path assumes when Config.RotationPeriod is zero.
const DefaultRotation = time.Minute

// MinRotation and MaxRotation bound the rotation period: shorter, cookies
// expire within a slow client's round trips; longer, the data path's
// arithmetic on the period (StaleAfter, in nanoseconds) would overflow, and
// a key would sign for days.
const (
	MinRotation = time.Second
	MaxRotation = 24 * time.Hour
)

// CheckRotation tells whether d may be a rotation period.
func CheckRotation(d time.Duration) error {
	if d < MinRotation || d > MaxRotation {
		return fmt.Errorf("%s is out of range: the key rotation period must be between %s and %s", d, MinRotation, MaxRotation)
	}
	return nil
}

// StaleAfter is how old the last rotation may get, for a rotation period,
// before the data path takes the rotator for dead and stops issuing and
// accepting moat cookies (SYNs go to the kernel): two periods, a key's
// life, plus half a period of slack. Mirrors SYN_STALE_HALF_PERIODS.
func StaleAfter(period time.Duration) time.Duration {
	if period <= 0 {
		period = DefaultRotation
	}
	return period / 2 * 5
}

// DefaultThreshold is the SYN rate (per second, per port) above which auto
// mode turns cookies on. Cookies keep every option, so erring low is cheap.
const DefaultThreshold = 2000

// windowsPerSecond matches SYN_WINDOW_NS (100 ms) in syn_structs.h.
const windowsPerSecond = 10

// synWindow is auto mode's window of SYN counting (SYN_WINDOW_NS).
const synWindow = time.Second / windowsPerSecond

func (m Mode) String() string {
	switch m {
	case ModeOff:
		return "off"
	case ModeNever:
		return "never"
	case ModeAlways:
		return "always"
	case ModeAuto:
		return "auto"
	}
	return fmt.Sprintf("mode(%d)", uint8(m))
}

// ParseMode reads "always", "never", "auto" or "off".
func ParseMode(s string) (Mode, error) {
	for _, m := range []Mode{ModeOff, ModeNever, ModeAlways, ModeAuto} {
		if m.String() == s {
			return m, nil
		}
	}
	return 0, fmt.Errorf("unknown SYN protection mode %q (want always, never, auto or off)", s)
}

// NewKey draws a key from the system CSPRNG.
func NewKey() (Key, error) {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		return Key{}, fmt.Errorf("syn cookie key: %w", err)
	}
	return Key{binary.LittleEndian.Uint64(b[:8]), binary.LittleEndian.Uint64(b[8:])}, nil
}

// Generation returns how many times the keys have been rotated; 0 means
// no key is installed and moat issues no cookies.
func Generation(rotation *ebpf.Map) (uint64, error) {
	var st datapath.MoatSynKeyState
	if err := rotation.Lookup(uint32(0), &st); err != nil {
		return 0, fmt.Errorf("read key generation: %w", err)
	}
	return st.Generation, nil
}

// InstallKey makes k the key of generation gen, which must be the current
// generation plus one: the slot it goes into holds the key two generations
// old, so cookies made under that one stop being valid now, and cookies of
// the generation before stay valid. The generation is written last so the
// data path never signs with a half-written key.
//
// Generation 1 also fills the other slot with an independent random key:
// the data path refuses that slot until generation 2, but nothing should
// ever sign with a key nobody chose (an unwritten slot is all zeros).
func InstallKey(keys, rotation *ebpf.Map, gen uint64, k Key) error {
	slot := uint32(gen & 1)
	if gen == 1 {
		other, err := NewKey()
		if err != nil {
			return err
		}
		if err := keys.Update(slot^1, datapath.MoatSynKey{K0: other.K0, K1: other.K1}, ebpf.UpdateAny); err != nil {
			return fmt.Errorf("install syn cookie key: %w", err)
		}
	}
	if err := keys.Update(slot, datapath.MoatSynKey{K0: k.K0, K1: k.K1}, ebpf.UpdateAny); err != nil {
		return fmt.Errorf("install syn cookie key: %w", err)
	}
	st := datapath.MoatSynKeyState{Generation: gen, RotatedNs: bootNow()}
	if err := rotation.Update(uint32(0), st, ebpf.UpdateAny); err != nil {
		return fmt.Errorf("publish key generation: %w", err)
	}
	return nil
}

// Rotate installs a fresh key from crypto/rand as the next generation and
// returns that generation. Call it on a schedule (DefaultRotation, or the
// Config.RotationPeriod written to the data path): once the last rotation
// is older than StaleAfter(period), moat issues no more cookies. The first
// call also enables cookies.
func Rotate(keys, rotation *ebpf.Map) (uint64, error) {
	gen, err := Generation(rotation)
	if err != nil {
		return 0, err
	}
	k, err := NewKey()
	if err != nil {
		return 0, err
	}
	if err := InstallKey(keys, rotation, gen+1, k); err != nil {
		return 0, err
	}
	return gen + 1, nil
}

// Config is the run-time settings of the SYN defence; zero fields keep the
// data path's defaults.
type Config struct {
	Hold           time.Duration // auto mode: cookie mode lasts this long after the flood (default 10s)
	CookieLifetime time.Duration // tc looks for cookies this long after a flood (default 4m; >= 2 rotations)
	MSSv4, MSSv6   uint16        // the most MSS moat announces (default: what the device and listener take, as the kernel)
	WScale         uint8         // window scale moat announces (default: the kernel's for the listener)
	// RotationPeriod is how often the control plane calls Rotate (default
	// DefaultRotation). The data path stops issuing cookies when the last
	// rotation is older than StaleAfter(RotationPeriod).
	RotationPeriod time.Duration
	// ResetsPerSec is how many RSTs a second cookie mode may send, on
	// each interface, for the ACKs it drops as stray (no socket, no
	// cookie), as the kernel would answer them: a client whose
	// connection this host no longer has (a reboot, a failover) learns
	// so at once. Shared out among the online CPUs. 0: DefaultResets;
	// negative: none.
	ResetsPerSec int
}

// DefaultResets is Config.ResetsPerSec's default.
const DefaultResets = 1000

// maxResetsPerCPU is the most syn_config.rst_rate holds; one more means
// none.
const maxResetsPerCPU = 0xfffe

// resetRate is syn_config.rst_rate for n RSTs a second (Config.ResetsPerSec)
// over ncpu CPUs: each CPU's share, rounded up.
func resetRate(n, ncpu int) uint16 {
	if n < 0 {
		return maxResetsPerCPU + 1
	}
	if n == 0 {
		n = DefaultResets
	}
	per := (n + ncpu - 1) / ncpu
	return uint16(min(per, maxResetsPerCPU))
}

// Configure writes the settings, with net.core.rmem_max as it is now: the
// kernel's window scale for a handshake depends on it, and the data path
// cannot read it.
func Configure(settings *ebpf.Map, c Config) error {
	v := datapath.MoatSynConfig{
		HoldNs:           uint64(c.Hold),
		CookieLifetimeNs: uint64(c.CookieLifetime),
		MssV4:            c.MSSv4,
		MssV6:            c.MSSv6,
		RcvWscale:        c.WScale,
		RotationPeriodNs: uint64(c.RotationPeriod),
		RstRate:          resetRate(c.ResetsPerSec, OnlineCPUs()),
	}
	if c.Hold < 0 {
		return fmt.Errorf("hold %s: must not be negative", c.Hold)
	}
	// A hold shorter than a window would let a window over the threshold
	// turn the port back to cookies at every SYN after the hold turned
	// them off (syn_flooding): it holds a window at least.
	if c.Hold > 0 && c.Hold < synWindow {
		v.HoldNs = uint64(synWindow)
	}
	if c.RotationPeriod < 0 {
		return fmt.Errorf("rotation period %s: must not be negative", c.RotationPeriod)
	}
	if c.WScale > 14 {
		return fmt.Errorf("window scale %d: at most 14", c.WScale)
	}
	var err error
	if v.RmemMaxLog2, err = rmemMaxLog2(); err != nil {
		return err
	}
	if err := settings.Update(uint32(0), v, ebpf.UpdateAny); err != nil {
		return fmt.Errorf("write syn settings: %w", err)
	}
	return nil
}

// SetRotationPeriod changes only the rotation period the data path
// expects, keeping the other settings.
func SetRotationPeriod(settings *ebpf.Map, period time.Duration) error {
	if period < 0 {
		return fmt.Errorf("rotation period %s: must not be negative", period)
	}
	var v datapath.MoatSynConfig
	if err := settings.Lookup(uint32(0), &v); err != nil {
		return fmt.Errorf("read syn settings: %w", err)
	}
	v.RotationPeriodNs = uint64(period)
	if err := settings.Update(uint32(0), v, ebpf.UpdateAny); err != nil {
		return fmt.Errorf("write syn settings: %w", err)
	}
	return nil
}

// NoteRmemMax writes net.core.rmem_max as it is now to the settings, if it
// changed: the rotators call it at every rotation, so that a changed
// sysctl reaches the data path's window scale within a rotation period.
func NoteRmemMax(settings *ebpf.Map) error {
	lg, err := rmemMaxLog2()
	if err != nil {
		return err
	}
	var v datapath.MoatSynConfig
	if err := settings.Lookup(uint32(0), &v); err != nil {
		return fmt.Errorf("read syn settings: %w", err)
	}
	if v.RmemMaxLog2 == lg {
		return nil
	}
	v.RmemMaxLog2 = lg
	if err := settings.Update(uint32(0), v, ebpf.UpdateAny); err != nil {
		return fmt.Errorf("write syn settings: %w", err)
	}
	return nil
}

// rmemMaxLog2 is floor(log2(net.core.rmem_max)), 0 for 0 or when a
// network namespace does not show the sysctl (kernels before 6.10 show it
// only in the host's): the data path then scales for tcp_rmem's maximum
// and the listener alone, which is nearly always what decides.
func rmemMaxLog2() (uint8, error) {
	n, err := readSysctl("net/core/rmem_max")
	if errors.Is(err, fs.ErrNotExist) {
		return 0, nil
	}
	if err != nil || n == 0 {
		return 0, err
	}
	return uint8(bits.Len64(n) - 1), nil
}

// KeyStatus is the state of key rotation; key material is never read (the
// keys map is write-only from user space).
type KeyStatus struct {
	Rotations    uint64        `json:"key_rotations"`
	LastRotation time.Time     `json:"last_rotation,omitzero"`
	Age          time.Duration `json:"-"`
	AgeSeconds   float64       `json:"last_rotation_age_seconds"`
	Period       time.Duration `json:"-"`
	// Stale: the last rotation is older than StaleAfter(Period), so the
	// data path issues no cookies (is the rotator running?).
	Stale bool `json:"stale"`
}

// Keys reads the rotation state and the period the data path expects.
func Keys(rotation, settings *ebpf.Map) (KeyStatus, error) {
	var st datapath.MoatSynKeyState
	if err := rotation.Lookup(uint32(0), &st); err != nil {
		return KeyStatus{}, fmt.Errorf("read key generation: %w", err)
	}
	var cfg datapath.MoatSynConfig
	if err := settings.Lookup(uint32(0), &cfg); err != nil {
		return KeyStatus{}, fmt.Errorf("read syn settings: %w", err)
	}
	ks := KeyStatus{Rotations: st.Generation, Period: time.Duration(cfg.RotationPeriodNs)}
	if ks.Period == 0 {
		ks.Period = DefaultRotation
	}
	if st.Generation == 0 {
		return ks, nil
	}
	now := bootNow()
	ks.Age = time.Duration(now - st.RotatedNs)
	ks.AgeSeconds = ks.Age.Seconds()
	ks.LastRotation = time.Now().Add(-ks.Age)
	ks.Stale = ks.Age > StaleAfter(ks.Period)
	return ks, nil
}

// Protect sets the mode of one TCP port; see PortTable.Protect. It reads
// all of syn_ports to find a free counters slot: a caller that sets many
// ports reads them once, with ReadPortTable.
func Protect(ports, counters, census *ebpf.Map, port uint16, mode Mode, threshold uint32) error {
	t, err := ReadPortTable(ports, counters, census)
	if err != nil {
		return err
	}
	return t.Protect(port, mode, threshold)
}

// PortTable is the protected ports and the counters slots they hold, read
// once from syn_ports, and the maps to change them in. It stays true only
// while its holder is the only writer: shield.Open's lock makes it so.
// Reading syn_ports costs about 15 ms (the kernel copies the 65536 entries
// one by one), so a change of many ports uses one table for all of them.
type PortTable struct {
	ports, counters, census *ebpf.Map
	entries                 map[uint16]datapath.MoatSynPort // protected ports only
	slots                   map[uint16]uint16               // slot -> port
}

// ReadPortTable reads the protected ports of syn_ports. census is the
// socket census (syn_census), which a newly protected port must wait for.
func ReadPortTable(ports, counters, census *ebpf.Map) (*PortTable, error) {
	protected, err := ProtectedPorts(ports)
	if err != nil {
		return nil, err
	}
	t := &PortTable{
		ports:    ports,
		counters: counters,
		census:   census,
		entries:  make(map[uint16]datapath.MoatSynPort, len(protected)),
		slots:    make(map[uint16]uint16, len(protected)),
	}
	for _, p := range protected {
		t.entries[p.Port] = p.Entry
		if p.Entry.Slot != 0 {
			t.slots[p.Entry.Slot] = p.Port
		}
	}
	return t, nil
}

// Protect sets the mode of a TCP port. threshold is the SYN rate per second
// that auto mode takes for a flood (0: DefaultThreshold). Protecting a port
// resets its flood detection, but not the acceptance of the cookies it
// issued; ModeOff removes it. A protected port keeps its slot of
// syn_counters, named in its syn_ports entry, and the counters in it: a
// change of mode or threshold (a daemon's reload, `moat syn protect`
// again) must not take moat_syncookie_*_total back to zero. A newly
// protected one takes the lowest free slot, its counters from zero.
func (t *PortTable) Protect(port uint16, mode Mode, threshold uint32) error {
	key := uint32(port)
	cur, protected := t.entries[port]
	if mode == ModeOff {
		// The slot is free once no port names it; its counters are
		// cleared when it is handed out again.
		if err := t.ports.Update(key, datapath.MoatSynPort{}, ebpf.UpdateAny); err != nil {
			return fmt.Errorf("unprotect tcp/%d: %w", port, err)
		}
		if protected {
			delete(t.entries, port)
			if t.slots[cur.Slot] == port {
				delete(t.slots, cur.Slot)
			}
		}
		return nil
	}
	if mode > ModeAuto {
		return fmt.Errorf("tcp/%d: invalid mode %d", port, mode)
	}
	if threshold == 0 {
		threshold = DefaultThreshold
	}
	slot := cur.Slot
	fresh := !protected || slot == 0
	if fresh {
		var err error
		if slot, err = t.freeSlot(); err != nil {
			return fmt.Errorf("protect tcp/%d: %w", port, err)
		}
	}
	// The data path counts per CPU in 100 ms windows; spread the rate
	// evenly, as RSS spreads a spoofed flood.
	perWindow := windowThreshold(threshold)
	// The census has not marked this port's sockets (nor, for a port
	// that was in never mode, the ones born since): the data path may
	// trust it for the port only from the first pass that starts after
	// this. Counters first: the port's entry names the slot only once it
	// is clear.
	// A port that stays protected keeps its counters; the census starts
	// over for it only out of never mode, which marks no tuples (the
	// other modes mark every socket they see born).
	gen, err := CensusGeneration(t.census)
	if err != nil {
		return fmt.Errorf("protect tcp/%d: %w", port, err)
	}
	switch {
	case fresh:
		err = clearSlot(t.counters, slot, gen+1)
	case Mode(cur.Mode) == ModeNever && mode != ModeNever:
		err = censusFrom(t.counters, slot, gen+1)
	}
	if err != nil {
		return fmt.Errorf("protect tcp/%d: %w", port, err)
	}
	v := datapath.MoatSynPort{Mode: uint8(mode), WindowThreshold: perWindow, Slot: slot}
	// Cookies the port issued until now come back in ACKs for a cookie
	// lifetime: in auto mode the tc acceptor takes them only that long
	// after the last flood, so the new entry carries it on, and a port
	// that answered every SYN counts as flooded until now. Flood
	// detection itself starts over.
	flooding := cur.Flooding != 0 && int64(bootNow()-cur.FloodUntilNs) <= 0 // the flag outlives the flood (Status)
	if protected && (Mode(cur.Mode) == ModeAlways || flooding) {
		v.LastFloodNs = bootNow()
	} else if protected {
		v.LastFloodNs = cur.LastFloodNs
	}
	if err := t.ports.Update(key, v, ebpf.UpdateAny); err != nil {
		return fmt.Errorf("protect tcp/%d: %w", port, err)
	}
	t.entries[port] = v
	t.slots[slot] = port
	return nil
}

// ErrNoFreeSlot means that every slot of the counters map is taken.
var ErrNoFreeSlot = errors.New("too many protected ports")

// MaxProtectedPorts is how many ports can be protected at once
// (MAX_SYN_PORTS in syn_structs.h): the slots of syn_counters but slot 0.
const MaxProtectedPorts = 1024

// clearSlot zeroes a slot's counters on every CPU, where the data path
// then trusts the socket census from generation censusFrom.
func clearSlot(counters *ebpf.Map, slot uint16, censusFrom uint32) error {
	zero := make([]datapath.MoatSynPortStats, ebpf.MustPossibleCPU())
	for i := range zero {
		zero[i].CensusFrom = censusFrom
	}
	if err := counters.Update(uint32(slot), zero, ebpf.UpdateAny); err != nil {
		return fmt.Errorf("clear counters slot %d: %w", slot, err)
	}
	return nil
}

// moatSpec is the BPF object, parsed once (14 ms) for every censusFrom.
var moatSpec = sync.OnceValues(datapath.LoadMoat)

// censusFrom has the data path trust the socket census for a slot only
// from generation from, and keeps its counters. The kernel sets the field
// on every CPU (syn_set_census_from): a write of the per-CPU values from
// here would put back, over the counts the data path made since they
// were read, the values read.
func censusFrom(counters *ebpf.Map, slot uint16, from uint32) error {
	spec, err := moatSpec()
	if err != nil {
		return err
	}
	spec = spec.Copy()
	var objs struct {
		Set *ebpf.Program `ebpf:"syn_set_census_from"`
	}
	opts := &ebpf.CollectionOptions{MapReplacements: map[string]*ebpf.Map{datapath.MoatMapSynCounters: counters}}
	if err := spec.LoadAndAssign(&objs, opts); err != nil {
		return fmt.Errorf("load the census_from writer: %w", err)
	}
	defer objs.Set.Close()
	cpus := uint32(ebpf.MustPossibleCPU())
	args := datapath.MoatSynCensusFromArgs{Slot: uint32(slot), From: from, Cpus: cpus}
	if _, err := objs.Set.Run(&ebpf.RunOptions{Context: args, ContextOut: &args}); err != nil {
		return fmt.Errorf("set census_from of counters slot %d: %w", slot, err)
	}
	if args.Done != cpus {
		return fmt.Errorf("set census_from of counters slot %d on %d of %d CPUs", slot, args.Done, cpus)
	}
	return nil
}

// Ports lists the protected ports, in port order.
func (t *PortTable) Ports() []uint16 {
	out := make([]uint16, 0, len(t.entries))
	for p := range t.entries {
		out = append(out, p)
	}
	slices.Sort(out)
	return out
}

// Protected says whether a port is protected, in any mode.
func (t *PortTable) Protected(port uint16) bool {
	_, ok := t.entries[port]
	return ok
}

// Holds says whether port is protected with mode and threshold (0:
// DefaultThreshold) as Protect would store them, with a counters slot: then
// protecting it again would only reset its flood state.
func (t *PortTable) Holds(port uint16, mode Mode, threshold uint32) bool {
	e, ok := t.entries[port]
	if !ok || e.Slot == 0 || e.Mode != uint8(mode) {
		return false
	}
	if threshold == 0 {
		threshold = DefaultThreshold
	}
	return e.WindowThreshold == windowThreshold(threshold)
}

// freeSlot is the lowest slot of counters that no protected port names.
// Slot 0 means "no counters" to the data path and is never handed out.
func (t *PortTable) freeSlot() (uint16, error) {
	for slot := uint16(1); uint32(slot) < t.counters.MaxEntries(); slot++ {
		if _, taken := t.slots[slot]; !taken {
			return slot, nil
		}
	}
	return 0, fmt.Errorf("%w: at most %d", ErrNoFreeSlot, t.counters.MaxEntries()-1)
}

// CheckRoom fails with ErrNoFreeSlot if protecting ports would need more
// slots than are free (ports already protected keep theirs), so that a
// caller can refuse a set of ports before protecting any of them.
func (t *PortTable) CheckRoom(want []uint16) error {
	need := 0
	seen := map[uint16]bool{}
	for _, p := range want {
		if e, ok := t.entries[p]; (!ok || e.Slot == 0) && !seen[p] {
			seen[p] = true
			need++
		}
	}
	limit := int(t.counters.MaxEntries()) - 1
	if len(t.slots)+need > limit {
		return fmt.Errorf("%w: at most %d, %d protected now, %d more asked", ErrNoFreeSlot, limit, len(t.slots), need)
	}
	return nil
}

// PortEntry is a protected port and its syn_ports entry.
type PortEntry struct {
	Port  uint16
	Entry datapath.MoatSynPort
}

// ProtectedPorts reads the syn_ports array (one entry per TCP port) in
// batches and returns the ports whose mode is not off, in port order.
func ProtectedPorts(ports *ebpf.Map) ([]PortEntry, error) {
	n := int(ports.MaxEntries())
	keys := make([]uint32, n)
	// Raw values, decoded only for protected ports: the generated struct
	// has no layout cilium/ebpf can copy, and decoding all 65536 entries by
	// reflection took most of the time (15 ms).
	vals := make([]rawSynPort, n)
	var cursor ebpf.MapBatchCursor
	got := 0
	for got < n {
		c, err := ports.BatchLookup(&cursor, keys[got:], vals[got:], nil)
		got += c
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("read protected ports: %w", err)
		}
	}
	var out []PortEntry
	for i := 0; i < got; i++ {
		if vals[i][0] == uint8(ModeOff) { // mode is the first byte of struct syn_port
			continue
		}
		pe := PortEntry{Port: uint16(keys[i])}
		if _, err := binary.Decode(vals[i][:], binary.NativeEndian, &pe.Entry); err != nil {
			return nil, fmt.Errorf("read tcp/%d: %w", keys[i], err)
		}
		out = append(out, pe)
	}
	return out, nil
}

// rawSynPort is a syn_ports value as bytes.
type rawSynPort [unsafe.Sizeof(datapath.MoatSynPort{})]byte

// windowThreshold is a per-port rate as the data path counts it: per CPU
// and per SYN_WINDOW_NS window. A flood is spread over the CPUs that run,
// so the online ones count, not every possible one.
func windowThreshold(perSec uint32) uint32 {
	w := perSec / windowsPerSecond / uint32(OnlineCPUs())
	if w == 0 {
		w = 1
	}
	return w
}

// StoredThreshold is the rate Status reports for a port protected with
// threshold perSec (0: DefaultThreshold): the data path keeps it per CPU
// and per window, rounded down.
func StoredThreshold(perSec uint32) uint64 {
	if perSec == 0 {
		perSec = DefaultThreshold
	}
	return uint64(windowThreshold(perSec)) * windowsPerSecond * uint64(OnlineCPUs())
}

// OnlineCPUs counts the CPUs online now (/sys/devices/system/cpu/online),
// falling back to the possible CPUs.
func OnlineCPUs() int {
	b, err := os.ReadFile("/sys/devices/system/cpu/online")
	if err == nil {
		if n := countCPUList(strings.TrimSpace(string(b))); n > 0 {
			return n
		}
	}
	return max(ebpf.MustPossibleCPU(), 1)
}

// countCPUList counts the CPUs in a kernel CPU list such as "0-3,6".
func countCPUList(s string) int {
	n := 0
	for _, part := range strings.Split(s, ",") {
		lo, hi, isRange := strings.Cut(part, "-")
		a, err := strconv.Atoi(lo)
		if err != nil {
			return 0
		}
		b := a
		if isRange {
			if b, err = strconv.Atoi(hi); err != nil || b < a {
				return 0
			}
		}
		n += b - a + 1
	}
	return n
}

// PortStatus is the state and counters of one protected port.
type PortStatus struct {
	Port            uint16    `json:"port"`
	Mode            string    `json:"mode"`
	Flooding        bool      `json:"flooding"`
	LastChange      time.Time `json:"last_change,omitzero"`
	ThresholdPerSec uint64    `json:"threshold_per_sec"`
	SYNs            uint64    `json:"syns"`
	CookiesIssued   uint64    `json:"cookies_issued"`
	CookiesAccepted uint64    `json:"cookies_accepted"`
	CookiesRejected uint64    `json:"cookies_rejected"`
	ACKsDropped     uint64    `json:"acks_dropped"`
	AcceptErrors    uint64    `json:"accept_errors"`
	SYNsDropped     uint64    `json:"syns_dropped"`
	SYNsPassed      uint64    `json:"syns_passed"`
	StaleKeySYNs    uint64    `json:"stale_key_syns"`
	// Valid cookies handed over while the listener's accept queue was
	// full: the kernel drops the connection (its ListenOverflows) and
	// the client sends again. Not in CookiesAccepted. tc's view as the
	// handshake passes: tc judges a whole receive batch before the stack
	// takes any of it in, so handshakes that fill the queue within one
	// batch count as accepted, and the service may accept before the
	// stack takes one counted here. The sum of the two is exact.
	AcceptQueueFull uint64 `json:"accept_queue_full"`
	// SYNs left to the kernel because the listener is MPTCP: the kernel
	// makes no connection from a cookie handshake that moat completes
	// for one. Also in SYNsPassed.
	MPTCPSYNs uint64 `json:"mptcp_syns"`
	// RSTs sent for stray ACKs (Config.ResetsPerSec); those ACKs are
	// also in ACKsDropped and CookiesRejected.
	ResetsSent uint64 `json:"resets_sent"`
	// SYNs left to the kernel because NAT runs for their address family
	// in the listener's namespace: it would drop the request socket of a
	// moat cookie handshake (syn_net_nat in bpf/include/syncookie.h).
	// Also in SYNsPassed.
	NATSYNs uint64 `json:"nat_syns"`
}

// Status reads the protected ports and sums their per-CPU counters.
func Status(ports, counters *ebpf.Map) ([]PortStatus, error) {
	out := []PortStatus{} // JSON [] with no protected port
	bootOffset := bootEpoch()
	now := bootNow()
	protected, err := ProtectedPorts(ports)
	if err != nil {
		return nil, err
	}
	var per []datapath.MoatSynPortStats
	for _, pe := range protected {
		p := pe.Entry
		s := PortStatus{
			Port:            pe.Port,
			Mode:            Mode(p.Mode).String(),
			Flooding:        p.Flooding != 0,
			ThresholdPerSec: uint64(p.WindowThreshold) * windowsPerSecond * uint64(OnlineCPUs()),
		}
		if p.LastChangeNs != 0 {
			s.LastChange = bootOffset.Add(time.Duration(p.LastChangeNs))
		}
		// The data path clears flooding only when a SYN comes after the
		// hold time; with no SYN since, the flood is over all the same.
		if s.Flooding && p.FloodUntilNs != 0 && int64(now-p.FloodUntilNs) > 0 {
			s.Flooding = false
			s.LastChange = bootOffset.Add(time.Duration(p.FloodUntilNs))
		}
		if p.Slot == 0 {
			// Protected by a moat that kept counters elsewhere; shield.Open
			// gives it a slot.
			out = append(out, s)
			continue
		}
		if err := lookupSynCounters(counters, uint32(p.Slot), &per); err != nil {
			return nil, fmt.Errorf("read syn counters of tcp/%d: %w", pe.Port, err)
		}
		for _, c := range per {
			s.SYNs += c.Syns
			s.CookiesIssued += c.CookiesIssued
			s.CookiesAccepted += c.CookiesAccepted
			s.CookiesRejected += c.CookiesRejected
			s.ACKsDropped += c.AcksDropped
			s.AcceptErrors += c.AcceptErrors
			s.AcceptQueueFull += c.AcceptQueueFull
			s.MPTCPSYNs += c.MptcpSyns
			s.ResetsSent += c.ResetsSent
			s.NATSYNs += c.NatSyns
			s.SYNsDropped += c.SynsDropped
			s.SYNsPassed += c.SynsPassed
			s.StaleKeySYNs += c.StaleKeySyns
		}
		out = append(out, s)
	}
	return out, nil
}

// lookupSynCounters reads a slot's per-CPU counters, also from the map
// of an older moat (shield.OpenAsIs leaves it in place), whose values
// were shorter: counters are only added at the end of struct
// syn_port_stats, so the older ones lead and those it lacked read zero.
func lookupSynCounters(counters *ebpf.Map, slot uint32, per *[]datapath.MoatSynPortStats) error {
	size := int(unsafe.Sizeof(datapath.MoatSynPortStats{}))
	if int(counters.ValueSize()) == size {
		return counters.Lookup(slot, per)
	}
	if int(counters.ValueSize()) > size {
		return fmt.Errorf("values of %d bytes, this version's are %d (a newer moat's?)", counters.ValueSize(), size)
	}
	var raw [][]byte
	if err := counters.Lookup(slot, &raw); err != nil {
		return err
	}
	out := make([]datapath.MoatSynPortStats, len(raw))
	for i, v := range raw {
		copy(unsafe.Slice((*byte)(unsafe.Pointer(&out[i])), size), v)
	}
	*per = out
	return nil
}

// bootEpoch is the wall-clock time at which CLOCK_BOOTTIME (what
// bpf_ktime_get_boot_ns reads) was zero.
func bootEpoch() time.Time {
	return time.Now().Add(-time.Duration(bootNow()))
}

// bootNow reads CLOCK_BOOTTIME, the data path's clock.
func bootNow() uint64 {
	var ts unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_BOOTTIME, &ts)
	return uint64(ts.Nano())
}

// sysctlsRead are the namespace settings moat cookies depend on. With
// tcp_syncookies 0 the stack ignores the request socket tc hands it, so the
// data path leaves SYNs to the kernel and nothing is protected. The other
// settings turn a TCP option off: the data path reads them live (through
// the listener's namespace) and offers only what is on, as the kernel's
// own SYN-ACKs do, so they are worth a note, not a refusal.
var sysctlsRead = []struct {
	name     string
	required bool
	off      string // what moat does while it is 0
}{
	{"tcp_syncookies", true, "the kernel accepts no cookie handshake, so moat leaves SYNs to it (set it to 1 or 2)"},
	{"tcp_sack", false, "moat's SYN-ACKs offer no SACK, as the kernel's do not"},
	{"tcp_timestamps", false, "moat's SYN-ACKs offer no timestamps, as the kernel's do not"},
	{"tcp_window_scaling", false, "moat's SYN-ACKs offer no window scaling, as the kernel's do not"},
	{"tcp_ecn", false, "moat's SYN-ACKs agree to no ECN, as the kernel's do not"},
}

// CheckSysctls checks, in the network namespace of the calling thread,
// that the kernel takes cookie handshakes at all (net.ipv4.tcp_syncookies
// at least 1): an error, on one line, if not. notes name the TCP options
// the namespace turned off, which moat then does not offer either.
func CheckSysctls() (notes []string, err error) {
	return checkSysctlsIn("/proc/sys/net/ipv4")
}

// readSysctl reads a numeric sysctl under /proc/sys, as path
// "net/core/rmem_max".
func readSysctl(path string) (uint64, error) {
	return readSysctlFile(filepath.Join("/proc/sys", path), strings.ReplaceAll(path, "/", "."))
}

// readSysctlFile reads the numeric sysctl name from file.
func readSysctlFile(file, name string) (uint64, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return 0, fmt.Errorf("read %s: %w", name, err)
	}
	v, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%s: %q is not a number", name, b)
	}
	return v, nil
}

func checkSysctlsIn(dir string) (notes []string, err error) {
	var errs []string
	for _, s := range sysctlsRead {
		var msg string
		v, err := readSysctlFile(filepath.Join(dir, s.name), "net.ipv4."+s.name)
		switch {
		case err != nil:
			msg = err.Error()
		case v >= 1:
			continue
		default:
			msg = fmt.Sprintf("net.ipv4.%s is %d: %s", s.name, v, s.off)
		}
		if s.required {
			errs = append(errs, msg)
		} else {
			notes = append(notes, msg)
		}
	}
	if len(errs) == 0 {
		return notes, nil
	}
	// One line, however many are wrong.
	return notes, errors.New(strings.Join(errs, "; "))
}

// AttachTC attaches the cookie accepting program (moat_syn_accept) to the
// tcx ingress hook of an interface. It must run on every interface whose
// XDP program issues cookies. It goes first in the chain: a program ahead
// of it that ends the chain (TCX_PASS, as Cilium's do) would keep the
// third ACKs of moat's cookies from it, and the kernel, which has no
// request socket for them, would reset every such handshake. The acceptor
// itself never ends the chain nor drops, so the programs after it see
// every packet as before.
func AttachTC(prog *ebpf.Program, ifindex int) (link.Link, error) {
	l, err := link.AttachTCX(link.TCXOptions{
		Interface: ifindex,
		Program:   prog,
		Attach:    ebpf.AttachTCXIngress,
		Anchor:    link.Head(),
	})
	if err != nil {
		return nil, fmt.Errorf("attach syn accept program to tcx ingress of ifindex %d: %w", ifindex, err)
	}
	return l, nil
}

// TCXAhead counts the tcx ingress programs of interface ifindex (in the
// calling thread's network namespace) that run before the program prog,
// the SYN acceptor; ok is false if prog is not attached there. Other
// acceptors of moat (those of other ports of one bridge, all at the
// bridge's ingress) are not counted: they never end the chain.
func TCXAhead(ifindex int, prog ebpf.ProgramID) (n int, ok bool, err error) {
	res, err := link.QueryPrograms(link.QueryOptions{Target: ifindex, Attach: ebpf.AttachTCXIngress})
	if err != nil {
		return 0, false, fmt.Errorf("query tcx ingress programs of ifindex %d: %w", ifindex, err)
	}
	for _, p := range res.Programs {
		if p.ID == prog {
			return n, true, nil
		}
		if !isAcceptor(p.ID) {
			n++
		}
	}
	return 0, false, nil
}

// isAcceptor says whether program id is a SYN acceptor of moat, by its
// name (moat_syn_accept, within the kernel's 15 characters).
func isAcceptor(id ebpf.ProgramID) bool {
	p, err := ebpf.NewProgramFromID(id)
	if err != nil {
		return false
	}
	defer p.Close()
	info, err := p.Info()
	return err == nil && info.Type == ebpf.SchedCLS && info.Name == datapath.MoatProgMoatSynAccept
}

// Listening says whether a TCP socket listens on port in the network
// namespace of the calling thread. moat answers SYNs only for listeners in
// the namespace of the device it is attached to; SYNs for anything else
// (containers in other namespaces, DNAT, routed traffic) go to the kernel.
func Listening(port uint16) (bool, error) {
	for _, f := range []string{"tcp", "tcp6"} {
		b, err := os.ReadFile(filepath.Join("/proc/thread-self/net", f))
		if errors.Is(err, os.ErrNotExist) {
			continue // no IPv6
		}
		if err != nil {
			return false, fmt.Errorf("read listening sockets: %w", err)
		}
		if listensOn(string(b), port) {
			return true, nil
		}
	}
	return false, nil
}

// listensOn reads a /proc/net/tcp table: "sl local_address rem_address st",
// addresses as HEXADDR:HEXPORT, state 0A is LISTEN.
func listensOn(table string, port uint16) bool {
	for _, line := range strings.Split(table, "\n")[1:] {
		f := strings.Fields(line)
		if len(f) < 4 || f[3] != "0A" {
			continue
		}
		_, p, ok := strings.Cut(f[1], ":")
		if !ok {
			continue
		}
		if n, err := strconv.ParseUint(p, 16, 16); err == nil && uint16(n) == port {
			return true
		}
	}
	return false
}
