package cli_test

import (
	"path/filepath"
	"testing"
)

// TestRootNotOnBPFFS checks that a --root outside bpffs, or the bpffs
// mount itself, is refused as bad input: exit status 2 and one line that
// names the root and what a root looks like (it used to exit 1 with
// "/sys/fs is not on a bpf filesystem" for --root /sys/fs/bpf).
func TestRootNotOnBPFFS(t *testing.T) {
	for _, c := range []struct {
		root string
		args []string
	}{
		{bpffsDir, []string{"list"}},
		{bpffsDir, []string{"block", "192.0.2.1"}},
		{filepath.Join(t.TempDir(), "moat"), []string{"block", "192.0.2.1"}},
	} {
		r := runMain(c.root, c.args...)
		checkUsageError(t, r, "root "+c.root+": ")
		checkUsageError(t, r, "inside a bpffs mount")
	}
}

// TestLimitBurstZero checks that --burst 0 and --burst-bytes 0 are refused
// and change nothing: they used to add the limit with the default burst,
// as if left out.
func TestLimitBurstZero(t *testing.T) {
	root := newRoot(t)
	mustRun(t, root, "limit", "add", "source", "tcp/80", "--pps", "10")
	before := mustRun(t, root, "limit", "list").stdout
	for _, args := range [][]string{
		{"limit", "add", "source", "udp", "--pps", "1000", "--burst", "0"},
		{"limit", "add", "budget", "udp", "--bps", "1M", "--burst-bytes", "0"},
	} {
		checkUsageError(t, runMain(root, args...), "leave --burst")
	}
	if after := mustRun(t, root, "limit", "list").stdout; after != before {
		t.Errorf("a refused limit changed the limits:\n%s\nwas\n%s", after, before)
	}
}
