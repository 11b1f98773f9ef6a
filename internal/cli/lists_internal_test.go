package cli

import (
	"net/netip"
	"testing"

	"github.com/moat-shield/moat/internal/shield"
)

// TestReplacedNote: what `moat block` and `moat allow` add to "added N"
// when the new entries took the place of expired entries or auto-blocks.
func TestReplacedNote(t *testing.T) {
	a, b := netip.MustParsePrefix("10.77.0.2/32"), netip.MustParsePrefix("2001:db8::/48")
	for _, tc := range []struct {
		r    shield.Replaced
		want string
	}{
		{shield.Replaced{}, ""},
		{shield.Replaced{Expired: []netip.Prefix{a}}, " (replaced an expired entry: 10.77.0.2/32)"},
		{shield.Replaced{Expired: []netip.Prefix{a, b}}, " (replaced 2 expired entries)"},
		{shield.Replaced{AutoBlocks: []netip.Prefix{b}}, " (replaced an auto-block: 2001:db8::/48)"},
		{shield.Replaced{Expired: []netip.Prefix{a}, AutoBlocks: []netip.Prefix{a, b}},
			" (replaced an expired entry: 10.77.0.2/32; replaced 2 auto-blocks)"},
	} {
		if got := replacedNote(tc.r); got != tc.want {
			t.Errorf("replacedNote(%+v) = %q, want %q", tc.r, got, tc.want)
		}
	}
}
