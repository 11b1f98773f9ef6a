package metrics_test

import (
	"encoding/binary"
	"net/netip"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/moat-shield/moat/internal/metrics"
	"github.com/moat-shield/moat/internal/rules"
)

// BenchmarkScrapeMillion measures one scrape of a state holding a million
// deny entries (800,000 IPv4 hosts in the hash map, 200,000 IPv4 networks
// in the trie): every scrape reads every entry for the top entries and the
// fill levels, unless the last read is recent enough (Config.ScanShare).
//
//	go test -run '^$' -bench ScrapeMillion -benchtime 5x ./internal/metrics/
func BenchmarkScrapeMillion(b *testing.B) {
	s := openFreshTB(b)
	const hosts, nets = 800_000, 200_000
	entries := make([]rules.PrefixEntry, 0, hosts+nets)
	for i := 0; i < hosts; i++ {
		entries = append(entries, rules.PrefixEntry{Prefix: netip.PrefixFrom(v4(uint32(11<<24)+uint32(i)*3), 32)})
	}
	for i := 0; i < nets; i++ {
		entries = append(entries, rules.PrefixEntry{Prefix: netip.PrefixFrom(v4(uint32(64<<24)+uint32(i)<<8), 24)})
	}
	if _, err := s.Apply(&rules.Ruleset{Deny: entries}, false); err != nil {
		b.Fatal(err)
	}
	for _, bc := range []struct {
		name  string
		share float64
	}{
		// ScanShare 1: back-to-back scrapes read every entry every time.
		{"lists-read-every-scrape", 1},
		{"default", 0},
	} {
		b.Run(bc.name, func(b *testing.B) {
			reg := prometheus.NewRegistry()
			reg.MustRegister(metrics.NewCollector(metrics.Config{Root: s.Root(), ScanShare: bc.share}))
			for b.Loop() {
				fams, err := reg.Gather()
				if err != nil || len(fams) == 0 {
					b.Fatalf("gather: %d families, %v", len(fams), err)
				}
			}
		})
	}
}

func v4(a uint32) netip.Addr {
	var b [4]byte
	binary.BigEndian.PutUint32(b[:], a)
	return netip.AddrFrom4(b)
}
