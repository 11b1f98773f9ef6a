package bench

import (
	"runtime"
	"sync"
	"testing"

	"golang.org/x/sys/unix"
)

// threadMasks reads the CPU mask of every thread of this process.
func threadMasks(t *testing.T) map[int]unix.CPUSet {
	t.Helper()
	tids, err := threadIDs()
	if err != nil {
		t.Fatal(err)
	}
	out := map[int]unix.CPUSet{}
	for _, tid := range tids {
		var set unix.CPUSet
		if err := unix.SchedGetaffinity(tid, &set); err == nil {
			out[tid] = set
		}
	}
	return out
}

// lockedThreads keeps n goroutines on threads of their own until release
// is called, and reports the CPU mask each thread had once it ran.
func lockedThreads(n int) (masks chan unix.CPUSet, release func()) {
	masks = make(chan unix.CPUSet, n)
	done := make(chan struct{})
	var wg sync.WaitGroup
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			var set unix.CPUSet
			unix.SchedGetaffinity(0, &set)
			masks <- set
			<-done
		}()
	}
	return masks, func() { close(done); wg.Wait() }
}

func TestConfineThreads(t *testing.T) {
	var all unix.CPUSet
	if err := unix.SchedGetaffinity(0, &all); err != nil {
		t.Fatal(err)
	}
	if all.Count() < 2 {
		t.Skip("needs two CPUs")
	}
	cpu := -1
	for c := range 1024 {
		if all.IsSet(c) {
			cpu = c // the last: not the mask of any thread by chance
		}
	}
	var one unix.CPUSet
	one.Set(cpu)

	// Threads that exist before the confinement.
	_, releaseOld := lockedThreads(4)
	defer releaseOld()

	restore, err := confineThreads(cpu)
	if err != nil {
		t.Fatal(err)
	}
	restored := false
	defer func() {
		if !restored {
			restore()
		}
	}()
	for tid, set := range threadMasks(t) {
		if set != one {
			t.Errorf("confined: thread %d may run on %d CPUs", tid, set.Count())
		}
	}
	// Threads started while confined inherit the confinement.
	masks, releaseNew := lockedThreads(4)
	for range 4 {
		if set := <-masks; set != one {
			t.Errorf("a thread started while confined may run on %d CPUs", set.Count())
		}
	}

	restored = true
	if err := restore(); err != nil {
		t.Fatal(err)
	}
	// Every thread has the process's CPUs again, those started while
	// confined included.
	for tid, set := range threadMasks(t) {
		if set != all {
			t.Errorf("restored: thread %d may run on %d CPUs, want %d", tid, set.Count(), all.Count())
		}
	}
	releaseNew()

	if _, err := confineThreads(1024 + 1); err == nil {
		t.Error("confined to a CPU this process may not use")
	}
}
