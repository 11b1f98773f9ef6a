package shield

import (
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// TestLockPathTellsMountsApart checks that two roots of the same name on
// two bpffs mounts get locks of their own: the top directory of every
// bpffs mount is inode 1, so a name made of the inode alone was shared,
// and a rotator or dump on one root refused to run beside one on the other.
func TestLockPathTellsMountsApart(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to mount bpffs")
	}
	var roots []string
	for i := 0; i < 2; i++ {
		dir := t.TempDir()
		if err := unix.Mount("bpf", dir, "bpf", 0, ""); err != nil {
			t.Skipf("mount bpffs: %v", err)
		}
		t.Cleanup(func() { unix.Unmount(dir, unix.MNT_DETACH) })
		roots = append(roots, filepath.Join(dir, "moat"))
	}
	a, b := &Shield{root: roots[0]}, &Shield{root: roots[1]}
	for _, what := range []string{"", ".census"} {
		if pa, pb := a.lockPath(what), b.lockPath(what); pa == pb {
			t.Errorf("roots %s and %s share the lock %s", roots[0], roots[1], pa)
		}
	}
	if RootLockID(roots[0]) == RootLockID(roots[1]) {
		t.Errorf("RootLockID is %s for both roots", RootLockID(roots[0]))
	}
	// The same root, named another way, keeps its lock.
	if a.lockPath("") != (&Shield{root: filepath.Join(filepath.Dir(roots[0]), ".", "moat")}).lockPath("") {
		t.Error("one root got two lock names")
	}
}
