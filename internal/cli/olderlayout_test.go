package cli_test

import (
	"encoding/binary"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"unsafe"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/moat-shield/moat/internal/datapath"
	"github.com/moat-shield/moat/internal/shield"
	"github.com/moat-shield/moat/internal/syncookie"
)

// TestCommandsLeaveAnOlderLayout: the commands that load no filter and
// change none of the maps whose layout changed (status, syn status, list,
// stats, policy, export, limit list, top, and the list and port rule
// changes block, unblock, allow, disallow, port, expire) over state that
// an older moat pinned (a socket census of 32-bit marks, SYN counters
// without nat_syns) leave it as it is, and read it as it is. Replacing
// those maps, as `moat attach` and the daemon's start do, took them from
// under the older moat's filter, which went on counting in maps no one
// reads (its counts since were lost at the upgrade), and from under its
// daemon or rotator, whose every later Open failed on the new census: no
// key rotation (stale keys, no cookies 2.5 periods later), no expiry, no
// rule through its API.
func TestCommandsLeaveAnOlderLayout(t *testing.T) {
	root := newRoot(t)
	mustRun(t, root, "syn", "protect", "tcp/8443", "--mode", "never")
	s, err := shield.Open(root)
	if err != nil {
		t.Fatal(err)
	}
	var e datapath.MoatSynPort
	if err := s.Map(datapath.MoatMapSynPorts).Lookup(uint32(8443), &e); err != nil || e.Slot == 0 {
		t.Fatalf("tcp/8443 has no counters slot (%v)", err)
	}
	cur := s.Map(datapath.MoatMapSynCounters)
	maxEntries := cur.MaxEntries()
	s.Close()

	// The census an older moat pinned, current, as its daemon keeps it.
	census := olderCensus(t)
	v := make([]byte, olderCensusSize)
	binary.NativeEndian.PutUint32(v[0:], 41)            // generation
	binary.NativeEndian.PutUint32(v[4:], 40)            // floor
	binary.NativeEndian.PutUint64(v[8:], math.MaxInt64) // valid until
	binary.NativeEndian.PutUint64(v[16:], 7)            // sockets
	binary.NativeEndian.PutUint64(v[24:], 40)           // passes
	if err := census.Put(uint32(0), v); err != nil {
		t.Fatal(err)
	}
	// Its counters: one field (nat_syns) short.
	size := int(unsafe.Sizeof(datapath.MoatSynPortStats{})) - 8
	counters, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.PerCPUArray, KeySize: 4, ValueSize: uint32(size), MaxEntries: maxEntries})
	if err != nil {
		t.Fatal(err)
	}
	defer counters.Close()
	per := make([][]byte, ebpf.MustPossibleCPU())
	for i := range per {
		per[i] = make([]byte, size)
		binary.NativeEndian.PutUint64(per[i][0:], 5) // syns
		binary.NativeEndian.PutUint64(per[i][8:], 3) // cookies issued
	}
	if err := counters.Put(uint32(e.Slot), per); err != nil {
		t.Fatal(err)
	}
	ids := map[string]ebpf.MapID{}
	for name, m := range map[string]*ebpf.Map{datapath.MoatMapSynCensus: census, datapath.MoatMapSynCounters: counters} {
		pin := filepath.Join(root, "maps", name)
		if err := os.Remove(pin); err != nil {
			t.Fatal(err)
		}
		if err := m.Pin(pin); err != nil {
			t.Fatal(err)
		}
		info, err := m.Info()
		if err != nil {
			t.Fatal(err)
		}
		ids[name], _ = info.ID()
	}

	for _, args := range [][]string{{"status"}, {"status", "--json"}, {"list"}, {"stats"}, {"stats", "--detail"}, {"policy"},
		{"export"}, {"limit", "list"}, {"top", "--count", "1", "--interval", "100ms"}, {"syn", "status"},
		{"block", "203.0.113.0/24"}, {"unblock", "203.0.113.0/24"}, {"allow", "192.0.2.1"}, {"disallow", "192.0.2.1"},
		{"port", "drop", "udp/19"}, {"port", "remove", "udp/19"}, {"expire"}} {
		mustRun(t, root, args...)
	}
	r := mustRun(t, root, "syn", "status", "--json")
	for name, id := range ids {
		m, err := ebpf.LoadPinnedMap(filepath.Join(root, "maps", name), nil)
		if err != nil {
			t.Fatal(err)
		}
		info, err := m.Info()
		m.Close()
		if err != nil {
			t.Fatal(err)
		}
		if got, _ := info.ID(); got != id {
			t.Errorf("%s: a command that loads no filter replaced the older moat's map %d with %d", name, id, got)
		}
	}
	var st struct {
		Census syncookie.CensusStatus `json:"socket_census"`
		Ports  []syncookie.PortStatus `json:"ports"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &st); err != nil {
		t.Fatalf("%v\n%s", err, r.stdout)
	}
	cpus := uint64(ebpf.MustPossibleCPU())
	if len(st.Ports) != 1 || st.Ports[0].SYNs != 5*cpus || st.Ports[0].CookiesIssued != 3*cpus {
		t.Errorf("ports %+v, want tcp/8443 with the older map's %d SYNs and %d cookies", st.Ports, 5*cpus, 3*cpus)
	}
	if !st.Census.Trusted || st.Census.Passes != 40 {
		t.Errorf("census %+v, want the older moat's: current, 40 passes", st.Census)
	}

	// `moat attach` or this version's daemon still replaces them: Open.
	s, err = shield.Open(root)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if got := s.Map(datapath.MoatMapSynCounters).ValueSize(); got != uint32(unsafe.Sizeof(datapath.MoatSynPortStats{})) {
		t.Errorf("after Open, syn_counters values of %d bytes", got)
	}
}

// TestUpgradeNamesTheStrandedRotator: a command that replaces the SYN maps
// of an older moat (here syn protect; attach and the daemon's start do the
// same) while that moat's rotator still runs (it holds the root's census
// lock) says so: the rotator can no longer open the state, stops at its
// next key rotation, and 2.5 periods later moat issues no cookies.
// Nothing said it; the rotator only failed later, with "pinned map
// syn_census does not match this version of moat".
func TestUpgradeNamesTheStrandedRotator(t *testing.T) {
	root := newRoot(t)
	s, err := shield.Open(root)
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	census := olderCensus(t)
	pin := filepath.Join(root, "maps", datapath.MoatMapSynCensus)
	if err := os.Remove(pin); err != nil {
		t.Fatal(err)
	}
	if err := census.Pin(pin); err != nil {
		t.Fatal(err)
	}
	// The older rotator: it holds the census lock.
	lock, err := os.OpenFile("/run/moat-"+shield.RootLockID(root)+".census.lock", os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Close()
	if err := unix.Flock(int(lock.Fd()), unix.LOCK_EX); err != nil {
		t.Fatal(err)
	}

	// A look at the state replaces nothing, and has nothing to say.
	if r := mustRun(t, root, "status"); strings.Contains(r.stderr, "restart it") {
		t.Errorf("status warns of a replacement it did not make:\n%s", r.stderr)
	}
	r := mustRun(t, root, "syn", "protect", "tcp/8443", "--mode", "never")
	if !strings.Contains(r.stderr, "stops at its next key rotation") || !strings.Contains(r.stderr, "restart it with this version") {
		t.Errorf("replacing the census under a running older rotator says nothing of it:\n%s", r.stderr)
	}
	// Once replaced, no more.
	if r := mustRun(t, root, "syn", "protect", "tcp/8443", "--mode", "never"); strings.Contains(r.stderr, "restart it") {
		t.Errorf("the warning comes again with nothing replaced:\n%s", r.stderr)
	}
}

// olderCensusSize is the census value of a moat before 4-bit slots: the
// same header, then a 32-bit generation per slot.
const olderCensusSize = 32 + 4<<17

// olderCensus makes a census map of that layout, closed when the test ends.
func olderCensus(t *testing.T) *ebpf.Map {
	t.Helper()
	m, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.Array, KeySize: 4, ValueSize: olderCensusSize, MaxEntries: 1, Flags: unix.BPF_F_MMAPABLE})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}
