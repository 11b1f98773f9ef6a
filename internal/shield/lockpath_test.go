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

// TestResolveRootBeforeItIsMade: a root named through a symbolic link
// higher up than its parent, with the directories below the link not made
// yet, resolves to the directory it will be once they are: a daemon that
// started before them locked the unresolved name, and a command or a
// second daemon after them the resolved one, and went round it.
func TestResolveRootBeforeItIsMade(t *testing.T) {
	dir := t.TempDir()
	real := filepath.Join(dir, "real")
	if err := os.Mkdir(real, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(real, filepath.Join(dir, "link")); err != nil {
		t.Fatal(err)
	}
	realDir, err := filepath.EvalSymlinks(real) // TempDir may itself be under a link
	if err != nil {
		t.Fatal(err)
	}
	root := filepath.Join(dir, "link", "a", "b", "moat")
	want := filepath.Join(realDir, "a", "b", "moat")
	before := ResolveRoot(root)
	if before != want {
		t.Errorf("before the root is made: ResolveRoot(%s) = %s, want %s", root, before, want)
	}
	if err := os.MkdirAll(root, 0o755); err != nil {
		t.Fatal(err)
	}
	if after := ResolveRoot(root); after != before {
		t.Errorf("ResolveRoot(%s) was %s before the root was made, %s after", root, before, after)
	}
	if got := ResolveRoot("relative/never/made"); !filepath.IsAbs(got) {
		t.Errorf("ResolveRoot of a relative path gave %s", got)
	}
}
