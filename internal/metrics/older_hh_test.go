package metrics_test

import (
	"encoding/binary"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/moat-shield/moat/internal/datapath"
	"github.com/moat-shield/moat/internal/metrics"
	"github.com/moat-shield/moat/internal/ratelimit"
)

// TestOlderHeavyHitterTable: the metrics read the pins as they find them,
// without shield.Open. A heavy-hitter table pinned by a moat from before
// the monitored count (32-byte values) still scrapes: its sources with
// their counts and nothing monitored, and its fill.
func TestOlderHeavyHitterTable(t *testing.T) {
	s := openFresh(t)
	rl, err := ratelimit.NewMaps(s.Map)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := rl.Config()
	if err != nil {
		t.Fatal(err)
	}
	cur := s.Map(datapath.MoatMapHhSources)
	const oldSize = 32
	older, err := ebpf.NewMap(&ebpf.MapSpec{Type: cur.Type(), KeySize: cur.KeySize(), ValueSize: oldSize, MaxEntries: cur.MaxEntries()})
	if err != nil {
		t.Fatal(err)
	}
	defer older.Close()
	k := datapath.MoatRlSrcKey{Family: 4, Prefixlen: 32}
	copy(k.Addr[:], []byte{198, 51, 100, 7})
	v := make([]byte, oldSize)
	for i, n := range []uint64{30, 3000, 12, 1} { // packets, bytes, dropped, last_ns
		binary.NativeEndian.PutUint64(v[8*i:], n)
	}
	if err := older.Put(k, v); err != nil {
		t.Fatal(err)
	}
	pin := filepath.Join(s.Root(), "maps", datapath.MoatMapHhSources)
	if err := os.Remove(pin); err != nil {
		t.Fatal(err)
	}
	if err := older.Pin(pin); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(metrics.Handler(metrics.Config{Root: s.Root()}))
	defer srv.Close()
	got := series(scrape(t, srv.URL))
	got.eq(t, "moat_scrape_collector_success", gaugeT, 1, "collector", "ratelimit")
	src := []string{"source", "198.51.100.7/32"}
	scale := float64(cfg.Sample)
	got.eq(t, "moat_heavy_hitter_packets", gaugeT, 30*scale, src...)
	got.eq(t, "moat_heavy_hitter_dropped_packets", gaugeT, 12*scale, src...)
	got.eq(t, "moat_heavy_hitter_monitored_packets", gaugeT, 0, src...)
	got.eq(t, "moat_map_entries", gaugeT, 1, "map", datapath.MoatMapHhSources)
}
