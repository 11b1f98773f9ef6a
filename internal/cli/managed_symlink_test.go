package cli_test

import (
	"os"
	"testing"
)

// TestManagedRootThroughASymlink: a root named through a symbolic link
// to the daemon's is the daemon's: a command given the link goes through
// the daemon (here a refusal, as for the root itself), never to the maps
// behind its back, where the daemon's next reload would remove it.
func TestManagedRootThroughASymlink(t *testing.T) {
	t.Parallel()
	root := newRoot(t)
	mustRun(t, root, "block", "192.0.2.1")
	alias := root + "-link"
	if err := os.Symlink(root, alias); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Remove(alias) })
	socket := fakeDaemon(t, root)
	checkUsageError(t, runManaged(t, socket, alias, "limit", "add", "source", "all", "--pps", "10k"), "a moat daemon manages")
}
