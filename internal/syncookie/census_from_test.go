package syncookie

import (
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/moat-shield/moat/internal/datapath"
	"github.com/moat-shield/moat/internal/testpkt"
)

// TestCensusFromKeepsCounts: a port that leaves never mode has the census
// trusted for it only from a later generation (censusFrom), and keeps its
// counters. SYNs counted on every CPU while censusFrom runs again and
// again all stay counted: the field is set in the kernel, CPU by CPU,
// not by writing back per-CPU values read a moment before.
func TestCensusFromKeepsCounts(t *testing.T) {
	objs := setup(t)
	var entry datapath.MoatSynPort
	if err := objs.SynPorts.Lookup(uint32(neverPort), &entry); err != nil || entry.Slot == 0 {
		t.Fatalf("tcp/%d has no counters slot (%v)", neverPort, err)
	}
	frame := synFrame(nil, client4, server4, testpkt.TCP{DstPort: neverPort})
	if ret, _ := run(t, objs.MoatFilter, frame); ret != 2 {
		t.Fatalf("SYN to a port in never mode: verdict %d, want XDP_PASS (2)", ret)
	}
	before := sumSyns(t, objs.SynCounters, entry.Slot)

	// One counting thread per CPU, each pinned to it, for as long as
	// censusFrom runs: 50 times, and at least half a second.
	const repeat = 1000
	var stop atomic.Bool
	var runs, resets atomic.Uint64
	var wg, started sync.WaitGroup
	errs := make(chan error, runtime.NumCPU())
	for cpu := 0; cpu < runtime.NumCPU(); cpu++ {
		wg.Add(1)
		started.Add(1)
		go func() {
			defer wg.Done()
			once := sync.OnceFunc(started.Done)
			defer once()
			// Left locked: the thread, pinned below, exits with the
			// goroutine rather than go back to the scheduler pinned.
			runtime.LockOSThread()
			var set unix.CPUSet
			set.Set(cpu)
			if err := unix.SchedSetaffinity(0, &set); err != nil {
				errs <- err
				return
			}
			for !stop.Load() {
				// A run a signal cuts short is run again whole, its
				// first SYNs counted twice: resets says how often.
				opts := &ebpf.RunOptions{Data: frame, Repeat: repeat, Reset: func() { resets.Add(1) }}
				if _, err := objs.MoatFilter.Run(opts); err != nil {
					errs <- err
					return
				}
				runs.Add(1)
				once()
			}
		}()
	}
	started.Wait()
	from := uint32(100)
	for begin := time.Now(); from < 150 || time.Since(begin) < 500*time.Millisecond; from++ {
		if err := censusFrom(objs.SynCounters, entry.Slot, from); err != nil {
			t.Error(err)
			break
		}
	}
	stop.Store(true)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}

	want, extra := before+runs.Load()*repeat, resets.Load()*repeat
	if got := sumSyns(t, objs.SynCounters, entry.Slot); got < want || got > want+extra {
		t.Errorf("SYNs counted %d, want %d (and up to %d of runs cut short) (%d lost while census_from was set)",
			got, want, extra, int64(want)-int64(got))
	}
	var per []datapath.MoatSynPortStats
	if err := objs.SynCounters.Lookup(uint32(entry.Slot), &per); err != nil {
		t.Fatal(err)
	}
	for cpu, st := range per {
		if st.CensusFrom != from-1 {
			t.Errorf("CPU %d: census_from %d, want %d", cpu, st.CensusFrom, from-1)
		}
	}

	// A slot the counters map lacks is set on no CPU: an error.
	if err := censusFrom(objs.SynCounters, MaxProtectedPorts+1, 1); err == nil {
		t.Errorf("census_from set in slot %d of a map of %d", MaxProtectedPorts+1, objs.SynCounters.MaxEntries())
	}
}

// sumSyns is the SYNs counted in a counters slot, over every CPU.
func sumSyns(t *testing.T, counters *ebpf.Map, slot uint16) uint64 {
	t.Helper()
	var per []datapath.MoatSynPortStats
	if err := counters.Lookup(uint32(slot), &per); err != nil {
		t.Fatal(err)
	}
	var n uint64
	for _, st := range per {
		n += st.Syns
	}
	return n
}
