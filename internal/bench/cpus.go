package bench

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"time"

	"golang.org/x/sys/unix"
)

// setThreadCPUs gives every thread of this process the CPU mask set. A
// thread started meanwhile inherits its creator's mask, which may be the
// old one, so passes repeat until one finds every thread with set. The
// kernel copies the mask when a thread is cloned but lists the thread
// only later, and on a busy host a clone begun before its creator's mask
// changed can show up after such a pass: the pass that ends it must come
// a while after one that changed nothing.
func setThreadCPUs(set unix.CPUSet) error {
	const passes = 10
	settled := false
	for range passes {
		tids, err := threadIDs()
		if err != nil {
			return err
		}
		changed := false
		for _, tid := range tids {
			var cur unix.CPUSet
			if err := unix.SchedGetaffinity(tid, &cur); err != nil {
				if errors.Is(err, unix.ESRCH) {
					continue // ended meanwhile
				}
				return fmt.Errorf("read the CPUs of thread %d: %w", tid, err)
			}
			if cur == set {
				continue
			}
			if err := unix.SchedSetaffinity(tid, &set); err != nil && !errors.Is(err, unix.ESRCH) {
				return fmt.Errorf("set the CPUs of thread %d: %w", tid, err)
			}
			changed = true
		}
		switch {
		case changed:
			settled = false
		case settled:
			return nil
		default:
			settled = true
			time.Sleep(settleTime)
		}
	}
	return fmt.Errorf("threads kept starting with other CPUs after %d passes", passes)
}

// settleTime is how long setThreadCPUs waits for clones in flight: a few
// scheduler ticks.
const settleTime = 20 * time.Millisecond

// threadIDs lists the threads of this process.
func threadIDs() ([]int, error) {
	ents, err := os.ReadDir("/proc/self/task")
	if err != nil {
		return nil, fmt.Errorf("list this process's threads: %w", err)
	}
	tids := make([]int, 0, len(ents))
	for _, e := range ents {
		if tid, err := strconv.Atoi(e.Name()); err == nil {
			tids = append(tids, tid)
		}
	}
	return tids, nil
}

// confineThreads runs every thread of this process on cpu alone, and
// returns the function that gives every thread back the CPUs the calling
// thread had.
func confineThreads(cpu int) (restore func() error, err error) {
	var saved unix.CPUSet
	if err := unix.SchedGetaffinity(0, &saved); err != nil {
		return nil, fmt.Errorf("read this process's CPUs: %w", err)
	}
	if !saved.IsSet(cpu) {
		return nil, fmt.Errorf("this process may not run on CPU %d", cpu)
	}
	var one unix.CPUSet
	one.Set(cpu)
	restore = func() error { return setThreadCPUs(saved) }
	if err := setThreadCPUs(one); err != nil {
		return nil, errors.Join(err, restore())
	}
	return restore, nil
}
