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
	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"

	"github.com/moat-shield/moat/internal/datapath"
	"github.com/moat-shield/moat/internal/testpkt"
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

// TestSynAckWindowScaleSetting: a window scale set in the SYN settings
// (Config.WScale) is what the SYN-ACK announces, in place of the
// listener's (testWScale), and a scale over 14 is refused.
func TestSynAckWindowScaleSetting(t *testing.T) {
	objs := setup(t)
	syn := synFrame(nil, client4, server4, testpkt.TCP{Options: []layers.TCPOption{
		testpkt.MSS(1460), testpkt.SACKPermitted(), testpkt.Timestamps(777, 0), testpkt.TCPNOP(), testpkt.WindowScale(7)}})
	scaleOf := func(t *testing.T) uint8 {
		t.Helper()
		rets, outs := verdicts(t, objs.MoatFilter, [][]byte{syn}, nil)
		if rets[0] != 3 {
			t.Fatalf("verdict %d, want XDP_TX (3)", rets[0])
		}
		pkt := gopacket.NewPacket(outs[0], layers.LayerTypeEthernet, gopacket.Default)
		tcp, _ := pkt.Layer(layers.LayerTypeTCP).(*layers.TCP)
		if tcp == nil {
			t.Fatalf("no TCP header in the SYN-ACK %x", outs[0])
		}
		for _, o := range tcp.Options {
			if o.OptionType == layers.TCPOptionKindWindowScale && len(o.OptionData) == 1 {
				return o.OptionData[0]
			}
		}
		t.Fatalf("no window scale option in the SYN-ACK: %v", tcp.Options)
		return 0
	}
	if got := scaleOf(t); got != testWScale {
		t.Errorf("window scale %d with no setting, want the listener's %d", got, testWScale)
	}
	if err := Configure(objs.SynSettings, Config{WScale: 9}); err != nil {
		t.Fatal(err)
	}
	if got := scaleOf(t); got != 9 {
		t.Errorf("window scale %d with the setting at 9", got)
	}
	if err := Configure(objs.SynSettings, Config{WScale: 15}); err == nil || !strings.Contains(err.Error(), "at most 14") {
		t.Errorf("window scale 15: error %v, want one saying at most 14", err)
	}
	// A negative hold would read as one of centuries in the data path's
	// unsigned settings.
	if err := Configure(objs.SynSettings, Config{Hold: -time.Second}); err == nil || !strings.Contains(err.Error(), "must not be negative") {
		t.Errorf("hold -1s: error %v, want one saying it must not be negative", err)
	}
	if got := scaleOf(t); got != 9 {
		t.Errorf("window scale %d after refused settings, want the 9 set before", got)
	}
	// A hold shorter than auto mode's window of SYN counting holds a window.
	if err := Configure(objs.SynSettings, Config{Hold: 30 * time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	var v datapath.MoatSynConfig
	if err := objs.SynSettings.Lookup(uint32(0), &v); err != nil {
		t.Fatal(err)
	}
	if v.HoldNs != uint64(100*time.Millisecond) {
		t.Errorf("hold 30ms written as %v, want 100ms", time.Duration(v.HoldNs))
	}
}
