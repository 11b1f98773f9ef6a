package bench

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// TestNftCounterPackets creates a named counter holding a known count with
// nft in a scratch network namespace and reads it back through netlink.
func TestNftCounterPackets(t *testing.T) {
	if _, err := exec.LookPath("nft"); err != nil {
		t.Skip("nft not installed (scripts/setup.sh with MOAT_SETUP_BENCH=1)")
	}
	errc := make(chan error, 1)
	go func() {
		// The thread never returns to the pool: it ends with the goroutine.
		runtime.LockOSThread()
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			errc <- fmt.Errorf("unshare: %w", err)
			return
		}
		ns := fmt.Sprintf("/proc/%d/task/%d/ns/net", os.Getpid(), unix.Gettid())
		script := "table netdev moatbenchtest {\n\tcounter seen { packets 12345 bytes 678 }\n}\n"
		cmd := exec.Command("nsenter", "--net="+ns, "--", "nft", "-f", "-")
		cmd.Stdin = strings.NewReader(script)
		if out, err := cmd.CombinedOutput(); err != nil {
			errc <- fmt.Errorf("nft: %v: %s", err, out)
			return
		}
		n, err := nftCounterPackets(unix.NFPROTO_NETDEV, "moatbenchtest", "seen")
		if err != nil {
			errc <- err
			return
		}
		if n != 12345 {
			errc <- fmt.Errorf("read %d packets, want 12345", n)
			return
		}
		_, err = nftCounterPackets(unix.NFPROTO_NETDEV, "moatbenchtest", "missing")
		if !errors.Is(err, unix.ENOENT) {
			errc <- fmt.Errorf("missing counter: got %v, want ENOENT", err)
			return
		}
		errc <- nil
	}()
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
}
