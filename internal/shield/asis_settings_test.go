package shield_test

import (
	"encoding/binary"
	"net/netip"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/moat-shield/moat/internal/datapath"
	"github.com/moat-shield/moat/internal/shield"
)

// TestOpenAsIsAllowOverOlderSettings: `moat allow`, `disallow` and
// `expire` open the state with OpenAsIs, which leaves an older moat's
// 12-byte settings (no monitor field) in place. Their allowlist in-use
// bits still live in that map, where the older filter reads them: an
// allow must set its family's bit there, a removal that empties the
// family must clear it, and neither may fail on the older size.
func TestOpenAsIsAllowOverOlderSettings(t *testing.T) {
	root, pin, _ := pinOlderMap(t, datapath.MoatMapSettings, 12)
	older, err := ebpf.LoadPinnedMap(pin, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer older.Close()
	var v [12]byte
	binary.NativeEndian.PutUint32(v[0:], uint32(datapath.MoatFragmentPolicyFRAGMENTS_DROP))
	if err := older.Put(uint32(0), v[:]); err != nil {
		t.Fatal(err)
	}

	inUse := func() uint32 {
		t.Helper()
		var b []byte
		if err := older.Lookup(uint32(0), &b); err != nil {
			t.Fatal(err)
		}
		if binary.NativeEndian.Uint32(b[0:]) != uint32(datapath.MoatFragmentPolicyFRAGMENTS_DROP) {
			t.Errorf("the fragments policy of the older settings changed: % x", b)
		}
		return binary.NativeEndian.Uint32(b[8:])
	}
	p := netip.MustParsePrefix("192.0.2.1/32")
	s, err := shield.OpenAsIs(root)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Add(shield.AllowList, []shield.Entry{{Prefix: p}}, shield.Upsert); err != nil {
		t.Errorf("allow over an older moat's settings: %v", err)
	}
	s.Close()
	if got := inUse(); got != uint32(datapath.MoatAllowInUseALLOW_IN_USE_V4) {
		t.Errorf("allow_in_use %#x in the older settings after an IPv4 allow, want the v4 bit", got)
	}
	s, err = shield.OpenAsIs(root)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.RemovePrefixes(shield.AllowList, []netip.Prefix{p}); err != nil {
		t.Errorf("disallow over an older moat's settings: %v", err)
	}
	s.Close()
	if got := inUse(); got != 0 {
		t.Errorf("allow_in_use %#x in the older settings after the last allow went, want 0", got)
	}
	// `moat expire` clears the bits of empty families whatever it
	// removes: it failed on every run, before the denylist's turn.
	s, err = shield.OpenAsIs(root)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, err := s.ExpireStale(); err != nil {
		t.Errorf("expire over an older moat's settings: %v", err)
	}
}
