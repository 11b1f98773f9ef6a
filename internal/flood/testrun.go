package flood

import (
	"errors"
	"runtime"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The generator calls BPF_PROG_TEST_RUN itself rather than through
// cilium/ebpf's Program.Run, because Program.Run repeats a run that a
// signal interrupts (EINTR) from the start. Here a signal is the way to
// end a run: one call can then last the whole flood and still stop at its
// deadline or when its context ends. That matters because every live
// frames call ends in a pause of 20-30ms on the 6.18 kernel here, in which
// nothing is sent (the kernel tears down the call's page pool after an RCU
// grace period): a flood made of short calls stops and starts again a few
// times a second, and a real one does not.

// testRunAttr is the test member of the kernel's union bpf_attr (uapi
// <linux/bpf.h>) as BPF_PROG_TEST_RUN reads it. The kernel's __aligned_u64
// addresses are unsafe.Pointer here (8 bytes on the 64-bit machines this
// runs on), so that the Go runtime sees the buffers they point to.
type testRunAttr struct {
	progFD      uint32
	retval      uint32
	dataSizeIn  uint32
	dataSizeOut uint32
	dataIn      unsafe.Pointer
	dataOut     unsafe.Pointer
	repeat      uint32
	duration    uint32
	ctxSizeIn   uint32
	ctxSizeOut  uint32
	ctxIn       unsafe.Pointer
	ctxOut      unsafe.Pointer
	flags       uint32
	cpu         uint32
	batchSize   uint32
	_           uint32
}

// The kernel reads 80 bytes; a layout that differs would be read wrong.
var _ [80 - unsafe.Sizeof(testRunAttr{})]struct{}
var _ [unsafe.Sizeof(testRunAttr{}) - 80]struct{}

// liveRun is one live-frames run of a program: frame is the template the
// kernel copies into every frame, md the struct xdp_md that goes with it.
type liveRun struct {
	progFD int
	frame  []byte
	md     *xdpMD
}

// errInterrupted is a run that a signal ended before it sent every frame.
var errInterrupted = errors.New("interrupted")

// run sends frames copies of the template, batch frames at a time. It
// returns errInterrupted when a signal ended it early; the generator's own
// count says how many went out.
func (r *liveRun) run(frames uint32, batch uint32) error {
	attr := testRunAttr{
		progFD:     uint32(r.progFD),
		dataSizeIn: uint32(len(r.frame)),
		dataIn:     unsafe.Pointer(&r.frame[0]),
		repeat:     frames,
		ctxSizeIn:  uint32(unsafe.Sizeof(*r.md)),
		ctxIn:      unsafe.Pointer(r.md),
		flags:      unix.BPF_F_TEST_XDP_LIVE_FRAMES,
		batchSize:  batch,
	}
	_, _, errno := unix.Syscall(unix.SYS_BPF, unix.BPF_PROG_TEST_RUN, uintptr(unsafe.Pointer(&attr)), unsafe.Sizeof(attr))
	runtime.KeepAlive(&attr)
	switch errno {
	case 0:
		return nil
	case unix.EINTR:
		return errInterrupted
	default:
		return errno
	}
}

// stopSignal interrupts a thread's run. The Go runtime sends SIGURG to its
// own threads to preempt goroutines and lets every program receive it
// without harm, so its handler is already in place and does nothing to a
// thread in a system call, which returns EINTR.
const stopSignal = unix.SIGURG

// interrupter ends the runs of one locked OS thread once told to stop: it
// signals the thread until the thread says it has left its loop of runs,
// since a signal that lands between two runs ends neither. The thread
// waits for the signalling to end before it exits, so that no signal goes
// to a thread ID the kernel has given to another thread.
type interrupter struct {
	tid      int
	stopping atomic.Bool
	stop     chan struct{} // closed to begin signalling
	done     chan struct{} // closed by the thread when it runs no more
	finished chan struct{} // closed when signalling has ended
}

// newInterrupter is for the calling goroutine's thread, which must be
// locked to it.
func newInterrupter() *interrupter {
	it := &interrupter{tid: unix.Gettid(), stop: make(chan struct{}), done: make(chan struct{}), finished: make(chan struct{})}
	go it.loop()
	return it
}

func (it *interrupter) loop() {
	defer close(it.finished)
	select {
	case <-it.stop:
	case <-it.done:
		return
	}
	pid := unix.Getpid()
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	for {
		if err := unix.Tgkill(pid, it.tid, stopSignal); err != nil {
			return // the thread is gone
		}
		select {
		case <-it.done:
			return
		case <-tick.C:
		}
	}
}

// Stop asks the thread to stop; it may be called more than once.
func (it *interrupter) Stop() {
	if it.stopping.CompareAndSwap(false, true) {
		close(it.stop)
	}
}

// Stopped reports whether Stop was called.
func (it *interrupter) Stopped() bool { return it.stopping.Load() }

// Done is called by the thread when it will run no more; it returns when
// the interrupter sends no more signals.
func (it *interrupter) Done() {
	close(it.done)
	<-it.finished
}
