package shield_test

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/moat-shield/moat/internal/datapath"
	"github.com/moat-shield/moat/internal/shield"
)

// TestStrandedTakerOverOlderSettings: Open replaces an older moat's
// settings (12-byte values) while that moat's daemon or rotator holds the
// census lock. Its next Open refuses the larger settings, as it would a
// census of another size, so it is stranded all the same and must be
// named, census replaced or not.
func TestStrandedTakerOverOlderSettings(t *testing.T) {
	root, _, _ := pinOlderMap(t, datapath.MoatMapSettings, 12)
	holdLock(t, "/run/moat-"+shield.RootLockID(root)+".census.lock")
	s, err := shield.Open(root)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if got := s.Map(datapath.MoatMapSettings).ValueSize(); got == 12 {
		t.Fatalf("settings not replaced")
	}
	if !s.StrandedCensusTaker {
		t.Errorf("Open replaced an older moat's settings under its running census taker and did not say so")
	}
}

// TestStrandedTakerOfAnOlderLockName: a rotator of a moat older than
// RootLockID holds the census lock under the name of that time (the
// root's inode and base name): it is stranded as well when Open replaces
// its census.
func TestStrandedTakerOfAnOlderLockName(t *testing.T) {
	root, _, _ := pinOlderMap(t, datapath.MoatMapSynCensus, 32+4<<17)
	var st unix.Stat_t
	if err := unix.Stat(filepath.Dir(root), &st); err != nil {
		t.Fatal(err)
	}
	name := fmt.Sprintf("/run/moat-%d-%s.census.lock", st.Ino, filepath.Base(root))
	holdLock(t, name)
	t.Cleanup(func() { os.Remove(name) })
	s, err := shield.Open(root)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if !s.StrandedCensusTaker {
		t.Errorf("Open replaced the census under an older rotator's lock (%s) and did not say so", name)
	}
}

// holdLock takes an exclusive lock on the file at path, as a census taker
// does, until the test ends.
func holdLock(t *testing.T, path string) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX); err != nil {
		t.Fatal(err)
	}
}
