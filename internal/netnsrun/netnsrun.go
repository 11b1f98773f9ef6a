// Package netnsrun runs a function in another network namespace.
package netnsrun

import (
	"fmt"
	"runtime"

	"github.com/vishvananda/netns"
)

// In runs fn on a locked OS thread switched into the network namespace
// target (the mount namespace, and so /sys and bpffs, stay the caller's),
// and switches the thread back afterwards. Sockets fn creates stay in
// target. Goroutines fn starts run in whatever namespace their thread is
// in, not target's.
func In(target netns.NsHandle, fn func() error) error {
	runtime.LockOSThread()
	orig, err := netns.Get()
	if err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("current network namespace: %w", err)
	}
	defer orig.Close()
	if err := netns.Set(target); err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("enter network namespace: %w", err)
	}
	// Deferred so that a panic or t.FailNow inside fn still restores the
	// thread. If restoring fails the thread stays locked, and the runtime
	// ends it with its goroutine rather than reuse it in the wrong
	// namespace.
	defer func() {
		if netns.Set(orig) == nil {
			runtime.UnlockOSThread()
		}
	}()
	return fn()
}
