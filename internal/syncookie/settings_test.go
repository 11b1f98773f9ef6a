package syncookie

import (
	"errors"
	"io/fs"
	"math/bits"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"

	"github.com/moat-shield/moat/internal/datapath"
)

// TestSettingsCarryRmemMax: Configure writes floor(log2(net.core.rmem_max))
// with the settings, and NoteRmemMax puts a stale value right without
// touching the others. (The window scale that follows from it is checked
// against the kernel's in TestHandshakeFollowsTheListener.)
func TestSettingsCarryRmemMax(t *testing.T) {
	raw, err := os.ReadFile("/proc/sys/net/core/rmem_max")
	if err != nil {
		t.Fatal(err)
	}
	n, err := strconv.ParseUint(strings.TrimSpace(string(raw)), 10, 64)
	if err != nil || n == 0 {
		t.Fatalf("net.core.rmem_max %q", raw)
	}
	want := uint8(bits.Len64(n) - 1)

	objs := loadObjects(t)
	read := func() datapath.MoatSynConfig {
		var v datapath.MoatSynConfig
		if err := objs.SynSettings.Lookup(uint32(0), &v); err != nil {
			t.Fatal(err)
		}
		return v
	}
	if err := Configure(objs.SynSettings, Config{Hold: 3 * time.Second, WScale: 9}); err != nil {
		t.Fatal(err)
	}
	if v := read(); v.RmemMaxLog2 != want || v.HoldNs != uint64(3*time.Second) || v.RcvWscale != 9 {
		t.Fatalf("after Configure: %+v, want rmem_max_log2 %d (rmem_max %d)", v, want, n)
	}
	stale := read()
	stale.RmemMaxLog2 = want - 1
	if err := objs.SynSettings.Update(uint32(0), stale, ebpf.UpdateAny); err != nil {
		t.Fatal(err)
	}
	if err := NoteRmemMax(objs.SynSettings); err != nil {
		t.Fatal(err)
	}
	if v := read(); v.RmemMaxLog2 != want || v.HoldNs != uint64(3*time.Second) || v.RcvWscale != 9 {
		t.Errorf("after NoteRmemMax: %+v, want rmem_max_log2 %d and the rest as before", v, want)
	}
	// A namespace that does not show the sysctl (kernels before 6.10)
	// reads as missing, which rmemMaxLog2 takes for unknown.
	if _, err := readSysctlFile(filepath.Join(t.TempDir(), "rmem_max"), "net.core.rmem_max"); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("a missing sysctl reads as %v, want an error that is fs.ErrNotExist", err)
	}
}
