package shield

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/moat-shield/moat/internal/datapath"
	"github.com/moat-shield/moat/internal/netnsrun"
	"github.com/moat-shield/moat/internal/syncookie"
)

// NewCensus loads the socket census iterator against the pinned SYN maps
// (see syncookie.Census). Its passes count the sockets of the network
// namespace of the thread that takes them: the interfaces'.
func (s *Shield) NewCensus() (*syncookie.Census, error) {
	spec := s.spec.Copy()
	for name, m := range s.maps {
		spec.Maps[name].Flags = withAccessFlags(spec.Maps[name].Flags, m)
	}
	var objs struct {
		Prog *ebpf.Program `ebpf:"moat_syn_census"`
	}
	if err := spec.LoadAndAssign(&objs, &ebpf.CollectionOptions{MapReplacements: s.maps}); err != nil {
		return nil, fmt.Errorf("load the socket census: %w", err)
	}
	c, err := syncookie.NewCensus(objs.Prog, s.maps[datapath.MoatMapSynCensus])
	objs.Prog.Close() // the iterator link holds the program
	if err != nil {
		return nil, err
	}
	return c, nil
}

// StartCensus keeps the socket census current, as the daemon does: it
// loads the census, takes two passes at once and then one every second in
// the network namespace of the calling thread (the interfaces'), whichever
// thread takes them, until stop. The census outlives s. report hears when
// passes start failing and when they work again (syncookie.Census.Start).
//
// Passes from two processes would step on each other's generations, so
// one process at a time takes them: a lock file of the root says which.
func (s *Shield) StartCensus(report func(syncookie.CensusPass, error)) (stop func(), err error) {
	lock, err := os.OpenFile(s.lockPath(".census"), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("lock the socket census: %w", err)
	}
	if err := unix.Flock(int(lock.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		lock.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, userErrorf("another process (a daemon, `moat syn rotate --every`) takes the socket census of %s", s.root)
		}
		return nil, fmt.Errorf("lock the socket census: %w", err)
	}
	target, err := netns.Get()
	if err != nil {
		lock.Close()
		return nil, fmt.Errorf("network namespace: %w", err)
	}
	c, err := s.NewCensus()
	if err != nil {
		target.Close()
		lock.Close()
		return nil, err
	}
	end, err := c.Start(syncookie.DefaultCensusEvery, func(f func() error) error { return netnsrun.In(target, f) }, report)
	if err != nil {
		c.Close()
		target.Close()
		lock.Close()
		return nil, err
	}
	return func() {
		end()
		c.Close()
		target.Close()
		lock.Close()
	}, nil
}

// censusTaken says whether another process holds the census lock of the
// root (StartCensus): a daemon or `moat syn rotate --every` runs on it.
//
// A moat older than RootLockID (05ea365) named the lock by the root's
// inode alone; its rotator holds that one.
func (s *Shield) censusTaken() bool {
	paths := []string{s.lockPath(".census")}
	var st unix.Stat_t
	if err := unix.Stat(filepath.Dir(s.root), &st); err == nil {
		paths = append(paths, fmt.Sprintf("/run/moat-%d-%s.census.lock", st.Ino, filepath.Base(s.root)))
	}
	for _, p := range paths {
		f, err := os.OpenFile(p, os.O_RDWR, 0)
		if err != nil {
			continue // never taken since boot
		}
		// Closing f releases the lock, if this took it.
		taken := errors.Is(unix.Flock(int(f.Fd()), unix.LOCK_SH|unix.LOCK_NB), unix.EWOULDBLOCK)
		f.Close()
		if taken {
			return true
		}
	}
	return false
}

// CensusRetryEvery is how often a process that keeps the socket census
// (the daemon, `moat syn rotate --every`) tries again to take it when it
// could not: another process took it, or the kernel refused the iterator.
const CensusRetryEvery = 5 * time.Second

// CensusHolder keeps the socket census taken for a long-running process,
// so that it takes over when the process that held the census stops.
type CensusHolder struct {
	start  func() (stop func(), err error)
	report func(error)
	stop   func()
	err    error
	retry  *time.Ticker
}

// HoldCensus tries to take the census with start (StartCensus in the
// right namespace) at once. report hears each change worth a line in a
// log: a failure whose cause differs from the last attempt's (err), and
// the census taken after failures (nil).
func HoldCensus(start func() (stop func(), err error), report func(error)) *CensusHolder {
	h := &CensusHolder{start: start, report: report, retry: time.NewTicker(CensusRetryEvery)}
	h.Take()
	return h
}

// Retry ticks every CensusRetryEvery while the census is not taken, for
// the caller to call Take; it is nil once it is.
func (h *CensusHolder) Retry() <-chan time.Time {
	if h.stop != nil {
		return nil
	}
	return h.retry.C
}

// Err is why the last attempt to take the census failed, nil once taken.
func (h *CensusHolder) Err() error { return h.err }

// Take tries to take the census unless it is taken.
func (h *CensusHolder) Take() {
	if h.stop != nil {
		return
	}
	last := h.err
	h.stop, h.err = h.start()
	switch {
	case h.err == nil:
		h.retry.Stop()
		if last != nil {
			h.report(nil)
		}
	case last == nil || last.Error() != h.err.Error():
		h.report(h.err)
	}
}

// Stop ends the census passes, if taken, and the retries.
func (h *CensusHolder) Stop() {
	h.retry.Stop()
	if h.stop != nil {
		h.stop()
		h.stop = nil
	}
}
