package shield_test

import (
	"encoding/binary"
	"net/netip"
	"testing"

	"github.com/moat-shield/moat/internal/datapath"
	"github.com/moat-shield/moat/internal/ratelimit"
	"github.com/moat-shield/moat/internal/shield"
)

// TestOpenCarriesOlderHeavyHitters: an older moat pinned the heavy
// hitters without the monitored count (32-byte values). Open replaces the
// table with one of this version's shape and carries every source's counts
// over, monitored at zero, so that `moat top` and the metrics go on where
// they were; a filter still attached from before samples into the old
// table, which HeavyHittersOlderFilter names until attach replaces it.
func TestOpenCarriesOlderHeavyHitters(t *testing.T) {
	s := openFresh(t)
	root := s.Root()
	a, _ := vethPair(t)
	if _, err := s.Attach(a, shield.ModeGeneric); err != nil {
		t.Fatal(err)
	}
	rl, err := ratelimit.NewMaps(s.Map)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := rl.Config()
	if err != nil {
		t.Fatal(err)
	}
	const oldSize = 32
	older := olderMap(t, s, datapath.MoatMapHhSources, oldSize)
	defer older.Close()
	want := map[netip.Prefix]ratelimit.HeavyHitter{}
	scale := uint64(cfg.Sample)
	for i, src := range []string{"198.51.100.7", "203.0.113.9", "2001:db8:5:6::"} {
		addr := netip.MustParseAddr(src)
		k := datapath.MoatRlSrcKey{Family: 4, Prefixlen: 32}
		if addr.Is6() {
			k.Family, k.Prefixlen = 6, 64
		}
		copy(k.Addr[:], addr.AsSlice())
		n := uint64(i + 1)
		v := make([]byte, oldSize)
		for j, c := range []uint64{100 * n, 6400 * n, 10 * n, 1000 + n} { // packets, bytes, dropped, last_ns
			binary.NativeEndian.PutUint64(v[8*j:], c)
		}
		if err := older.Put(k, v); err != nil {
			t.Fatal(err)
		}
		p := netip.PrefixFrom(addr, int(k.Prefixlen))
		want[p] = ratelimit.HeavyHitter{Source: p, Packets: 100 * n * scale, Bytes: 6400 * n * scale, Dropped: 10 * n * scale}
	}
	pinInstead(t, root, datapath.MoatMapHhSources, older)
	s.Close()

	for round := 0; round < 2; round++ { // the second Open finds nothing to do
		s, err = shield.Open(root)
		if err != nil {
			t.Fatalf("round %d: open over 32-byte heavy-hitter values: %v", round, err)
		}
		if want := uint32(binary.Size(datapath.MoatHhCounts{})); s.Map(datapath.MoatMapHhSources).ValueSize() != want {
			t.Errorf("round %d: hh_sources values of %d bytes, want %d", round, s.Map(datapath.MoatMapHhSources).ValueSize(), want)
		}
		rl, err := ratelimit.NewMaps(s.Map)
		if err != nil {
			t.Fatal(err)
		}
		hh, err := rl.HeavyHitters()
		if err != nil {
			t.Fatal(err)
		}
		got := map[netip.Prefix]ratelimit.HeavyHitter{}
		for _, h := range hh {
			got[h.Source] = h
		}
		if len(got) != len(want) {
			t.Errorf("round %d: heavy hitters %+v, want %+v", round, hh, want)
		}
		for p, w := range want {
			if got[p] != w {
				t.Errorf("round %d: heavy hitter %v %+v, want the old counts %+v", round, p, got[p], w)
			}
		}
		if name, err := s.HeavyHittersOlderFilter(); err != nil || name != a {
			t.Errorf("round %d: HeavyHittersOlderFilter %q, %v; want %s, which still samples into the old table", round, name, err, a)
		}
		s.Close()
	}
	attachEndsOlderFilter(t, root, a, "HeavyHittersOlderFilter", (*shield.Shield).HeavyHittersOlderFilter)
}
