package cli_test

import (
	"os"
	"testing"
)

// TestSynProtectWithoutSyncookies: where net.ipv4.tcp_syncookies is 0 the
// kernel takes no cookie handshake, so protecting a port in a cookie mode
// is refused as bad input (exit 2, one line) before anything is pinned.
func TestSynProtectWithoutSyncookies(t *testing.T) {
	t.Parallel()
	sl := newShieldLab(t)
	// The server's namespace is the lab's own, and goes with it.
	if err := sl.lab.Server.Do(func() error {
		return os.WriteFile("/proc/sys/net/ipv4/tcp_syncookies", []byte("0"), 0)
	}); err != nil {
		t.Fatal(err)
	}
	for _, mode := range []string{"always", "auto"} {
		checkUsageError(t, sl.moat("syn", "protect", "tcp/443", "--mode", mode), "net.ipv4.tcp_syncookies is 0")
	}
	if st := pinnedState(t, sl.root); st != "" {
		t.Fatalf("a refused command left state behind:\n%s", st)
	}
}
