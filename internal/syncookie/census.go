package syncookie

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"

	"github.com/moat-shield/moat/internal/datapath"
)

// The socket census (struct syn_census_table in syn_structs.h) tells the
// data path which tuples of protected ports may belong to a socket other
// than the listener. A SYN or ACK whose tuple no socket can own then skips
// the kernel's socket lookup, whose miss in the established hash was a
// fifth of the CPU under a SYN flood. Census passes keep it true: each
// walks every TCP socket of the namespace with a socket iterator and marks
// the tuples of protected ports. Until a pass has run, or once passes stop
// for longer than the validity they promise, every packet pays the lookup
// as before; a stale census is never trusted.

// DefaultCensusEvery is how often the daemon takes a census pass. It bounds
// how long a socket the data path cannot see being born (one whose SYN came
// in through an interface without moat) goes unmarked.
const DefaultCensusEvery = time.Second

// censusValidity is how long a pass stays trusted when no next one comes:
// a few missed passes (a busy machine, a slow pass) keep the fast path,
// a dead control plane loses it.
func censusValidity(every time.Duration) time.Duration {
	return max(5*every, 5*time.Second)
}

// Census takes census passes into the syn_census map.
type Census struct {
	it   *link.Iter
	mc   *mappedCensus
	done uint32 // generation of the last pass Take completed, 0 for none
}

// CensusPass is what one pass found.
type CensusPass struct {
	Generation uint32
	Sockets    uint64 // sockets of protected ports marked
}

// mappedCensus is the mapped syn_census value: its header, written field
// by field with atomic stores, and the marks after it, which are the data
// path's but for the bits the control plane clears (clearBelow).
type mappedCensus struct {
	mem             []byte
	gen, floor      *uint32
	validUntil      *uint64
	sockets, passes *uint64
	marks           []uint64
}

func mapCensus(m *ebpf.Map) (*mappedCensus, error) {
	if m == nil {
		return nil, errors.New("no census map")
	}
	var t *datapath.MoatSynCensusTable // for sizes and offsets only
	if int(m.ValueSize()) != int(unsafe.Sizeof(*t)) {
		return nil, fmt.Errorf("census of %d bytes, this version's is %d", m.ValueSize(), unsafe.Sizeof(*t))
	}
	page := os.Getpagesize()
	mem, err := unix.Mmap(m.FD(), 0, (int(m.ValueSize())+page-1)/page*page, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("map the census: %w", err)
	}
	at := func(off uintptr) unsafe.Pointer { return unsafe.Pointer(&mem[off]) }
	return &mappedCensus{
		mem:        mem,
		gen:        (*uint32)(at(unsafe.Offsetof(t.Generation))),
		floor:      (*uint32)(at(unsafe.Offsetof(t.Floor))),
		validUntil: (*uint64)(at(unsafe.Offsetof(t.ValidUntilNs))),
		sockets:    (*uint64)(at(unsafe.Offsetof(t.Sockets))),
		passes:     (*uint64)(at(unsafe.Offsetof(t.Passes))),
		marks:      unsafe.Slice((*uint64)(at(unsafe.Offsetof(t.Marks))), len(t.Marks)),
	}, nil
}

// censusGenBits has bit 0 of every slot's 4 in a word of marks: shifted
// by g % 4, the bits of generation g.
const censusGenBits = 0x1111111111111111

// clearBelow clears, in every slot, the bits of generation gen-2 modulo 4
// and, unless the pass of gen-1 cleared them already (prevDone), of gen-3:
// once the pass of gen is done they hold only marks older than the floor
// (gen-1). gen-3 is gen+1 modulo 4, the next pass's: after a complete
// pass of gen-1 it holds nothing, and leaving it alone keeps the marks of
// a pass some other process began meanwhile. Atomic ANDs, and only of
// words that hold such a bit, so that the data path's marks (atomic ORs)
// are never lost and untouched lines stay clean.
func (h *mappedCensus) clearBelow(gen uint32, prevDone bool) {
	stale := uint64(censusGenBits) << ((gen - 2) % 4)
	if !prevDone {
		stale |= uint64(censusGenBits) << ((gen - 3) % 4)
	}
	for i := range h.marks {
		if atomic.LoadUint64(&h.marks[i])&stale != 0 {
			atomic.AndUint64(&h.marks[i], ^stale)
		}
	}
}

func (h *mappedCensus) close() { unix.Munmap(h.mem) }

// readCensus copies the census value: readers need no mapping, so the
// read-only pins that metrics open will do.
func readCensus(m *ebpf.Map) (*datapath.MoatSynCensusTable, error) {
	if m == nil {
		return nil, errors.New("no census map")
	}
	var t datapath.MoatSynCensusTable
	if m.ValueSize() == uint32(unsafe.Sizeof(t)) {
		if err := m.Lookup(uint32(0), &t); err != nil {
			return nil, fmt.Errorf("read the census: %w", err)
		}
		return &t, nil
	}
	// An older moat's census (shield.OpenAsIs leaves it in place): the
	// same header, marks of another size, which readers do not use.
	n := int(unsafe.Offsetof(t.Marks))
	if int(m.ValueSize()) < n {
		return nil, fmt.Errorf("read the census: values of %d bytes hold no header of %d", m.ValueSize(), n)
	}
	var b []byte
	if err := m.Lookup(uint32(0), &b); err != nil {
		return nil, fmt.Errorf("read the census: %w", err)
	}
	copy(unsafe.Slice((*byte)(unsafe.Pointer(&t)), n), b)
	return &t, nil
}

// CensusGeneration reads the generation of the census pass under way (or
// last taken) from the mapped header: callers change the SYN maps, so
// their handles are writable.
func CensusGeneration(m *ebpf.Map) (uint32, error) {
	h, err := mapCensus(m)
	if err != nil {
		return 0, err
	}
	defer h.close()
	return atomic.LoadUint32(h.gen), nil
}

// NewCensus attaches the census iterator (the program moat_syn_census,
// loaded against the map syn_census; the caller may close prog then). A
// pass counts the sockets of the network namespace of the thread that
// calls Take. One Census takes passes into a map at a time.
func NewCensus(prog *ebpf.Program, m *ebpf.Map) (*Census, error) {
	mc, err := mapCensus(m)
	if err != nil {
		return nil, err
	}
	it, err := link.AttachIter(link.IterOptions{Program: prog})
	if err != nil {
		mc.close()
		return nil, fmt.Errorf("attach the socket census: %w", err)
	}
	return &Census{it: it, mc: mc}, nil
}

// Close detaches the iterator and ends the trust in the last pass at once:
// no pass follows it, and the data path looks every socket up again.
func (c *Census) Close() error {
	atomic.StoreUint64(c.mc.validUntil, 0)
	c.mc.close()
	return c.it.Close()
}

// Take runs one pass: it raises the generation, marks every socket of a
// protected port with it, and then lets the data path trust the census
// down to the generation before, which events may still have written, for
// the validity of a pass taken every `every`, and clears the marks of
// older generations.
func (c *Census) Take(every time.Duration) (CensusPass, error) {
	gen := atomic.LoadUint32(c.mc.gen) + 1
	atomic.StoreUint64(c.mc.sockets, 0)
	atomic.StoreUint32(c.mc.gen, gen)
	r, err := c.it.Open()
	if err != nil {
		return CensusPass{}, fmt.Errorf("socket census: %w", err)
	}
	defer r.Close()
	buf := make([]byte, 4096)
	for {
		_, err := r.Read(buf)
		if err == io.EOF {
			break
		}
		// A read ends early, with EAGAIN, after a million sockets that
		// printed nothing; the next one goes on from there.
		if err != nil && !errors.Is(err, unix.EAGAIN) {
			return CensusPass{}, fmt.Errorf("socket census: %w", err)
		}
	}
	if censusIterated != nil {
		censusIterated()
	}
	// Another process took passes into this census meanwhile (one the
	// census lock, a file of /run, does not reach: another mount
	// namespace's): the generations are its now, and what this pass
	// would clear as older than its floor may be its marks.
	if cur := atomic.LoadUint32(c.mc.gen); cur != gen {
		return CensusPass{}, fmt.Errorf("socket census: the generation went from %d to %d during the pass: another process takes passes into this census", gen, cur)
	}
	atomic.StoreUint64(c.mc.validUntil, bootNow()+uint64(censusValidity(every)))
	atomic.StoreUint32(c.mc.floor, gen-1)
	// After the floor: until then a bit of an older generation still
	// counts, and clearing it first could hide a socket.
	c.mc.clearBelow(gen, c.done == gen-1 && gen > 1)
	c.done = gen
	atomic.AddUint64(c.mc.passes, 1)
	return CensusPass{Generation: gen, Sockets: atomic.LoadUint64(c.mc.sockets)}, nil
}

// censusIterated, when tests set it, runs in Take once the sockets are
// walked, before the pass is trusted.
var censusIterated func()

// run takes a pass every `every` until ctx ends, with in and report as
// Start describes.
func (c *Census) run(ctx context.Context, every time.Duration, in func(func() error) error, report func(CensusPass, error)) {
	t := time.NewTicker(every)
	defer t.Stop()
	failing := false
	for {
		var p CensusPass
		err := in(func() (err error) { p, err = c.Take(every); return err })
		if report != nil && (err != nil) != failing {
			report(p, err)
		}
		failing = err != nil
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Start takes two passes at once, so that the census is trusted when it
// returns (the first pass alone leaves it untrusted), then one every
// `every` in the background until stop is called. in runs each pass (nil:
// on the calling goroutine's thread), so that a caller can take it in a
// network namespace of its choice; report, unless nil, hears of the first
// pass that fails (with its error) and of the first that works after
// failures (nil error). stop waits for the pass under way; it does not
// Close c.
func (c *Census) Start(every time.Duration, in func(func() error) error, report func(CensusPass, error)) (stop func(), err error) {
	if in == nil {
		in = func(f func() error) error { return f() }
	}
	for range 2 {
		if err := in(func() error { _, err := c.Take(every); return err }); err != nil {
			return nil, err
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTimer(every)
		defer t.Stop()
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		c.run(ctx, every, in, report)
	}()
	return func() {
		cancel()
		<-done
	}, nil
}

// CensusStatus is the census as the data path sees it.
type CensusStatus struct {
	Generation uint32 `json:"generation"`
	Passes     uint64 `json:"passes"`
	Sockets    uint64 `json:"sockets"` // marked by the last pass
	// Trusted: a pass completed and its validity has not run out; while
	// false, every SYN and ACK of a protected port pays the socket lookup.
	Trusted bool `json:"trusted"`
}

// ReadCensus reads the census header.
func ReadCensus(m *ebpf.Map) (CensusStatus, error) {
	t, err := readCensus(m)
	if err != nil {
		return CensusStatus{}, err
	}
	return CensusStatus{
		Generation: t.Generation,
		Passes:     t.Passes,
		Sockets:    t.Sockets,
		Trusted:    t.Floor != 0 && bootNow() < t.ValidUntilNs,
	}, nil
}

// CensusSlot is the census slot of a tuple, as syn_census_slot computes it
// in the data path: the client's and the server's address and port. An
// IPv4 address mapped into IPv6 counts as IPv4, as its packets are.
func CensusSlot(client, server netip.AddrPort) uint32 {
	word := func(b []byte) uint32 { return binary.LittleEndian.Uint32(b) }
	fold := func(a netip.Addr) uint32 {
		if a.Unmap().Is4() {
			b := a.Unmap().As4()
			return word(b[:])
		}
		b := a.As16()
		return word(b[0:]) ^ word(b[4:]) ^ word(b[8:]) ^ word(b[12:])
	}
	a, b := fold(client.Addr()), fold(server.Addr())
	x := uint64(a^(b*0x9e3779b9))<<32 | uint64(client.Port())<<16 | uint64(server.Port())
	x *= 0x9e3779b97f4a7c15
	return uint32(x>>(64-censusBits)) & (censusSlots - 1)
}

// The size of the census (SYN_CENSUS_BITS in syn_structs.h).
const (
	censusBits  = 17
	censusSlots = 1 << censusBits
)
