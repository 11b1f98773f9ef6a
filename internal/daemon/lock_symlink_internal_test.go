package daemon

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/moat-shield/moat/internal/shield"
)

// TestOneDaemonThroughASymlinkedRoot: a root named through a symbolic
// link (`--root /sys/fs/bpf/edge` where edge leads to moat) is the same
// state: a second daemon on it is refused, and the state's own lock, which
// commands that go round no daemon take, is the same file. Both went by
// the name given, so a second daemon ran on the state (each removing the
// other's run-time rules at its reloads), and `moat block --root LINK`
// wrote behind the first daemon's back.
func TestOneDaemonThroughASymlinkedRoot(t *testing.T) {
	dir := t.TempDir()
	root := filepath.Join(dir, "moat-symroot")
	if err := os.Mkdir(root, 0o700); err != nil {
		t.Fatal(err)
	}
	alias := filepath.Join(dir, "moat-symalias")
	if err := os.Symlink(root, alias); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, r := range []string{root, alias} {
			if p, err := LockPath(r); err == nil {
				os.Remove(p)
			}
			// The lock name before symbolic links were resolved.
			locks, _ := filepath.Glob("/run/moat-daemon-" + filepath.Base(r) + "-*.lock")
			for _, l := range locks {
				os.Remove(l)
			}
		}
	})
	first, err := lockDaemon(root, "/run/moat/first.sock")
	if err != nil {
		t.Fatal(err)
	}
	defer first.Close()
	if second, err := lockDaemon(alias, "/run/moat/second.sock"); err == nil {
		second.Close()
		t.Errorf("a second daemon locked %s through the link %s", root, alias)
	}
	if a, b := shield.RootLockID(alias), shield.RootLockID(root); a != b {
		t.Errorf("the state's lock is %s through the link and %s directly, want one lock", a, b)
	}
}
