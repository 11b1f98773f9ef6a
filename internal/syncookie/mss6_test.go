package syncookie

import (
	"net/netip"
	"testing"
)

// TestCookieKeepsIPv6JumboMSS: the cookie's last MSS entry is a 9000-byte
// MTU's: 8960 over IPv4, and 8940 over IPv6, whose header is 20 bytes
// longer. With 8960 for both, an IPv6 client on a 9000-byte MTU (MSS
// 8940) fell to 1460, a sixth of its segment size, where the kernel's own
// IPv6 cookies keep 8940.
func TestCookieKeepsIPv6JumboMSS(t *testing.T) {
	tuple := Tuple{netip.MustParseAddrPort("[2001:db8::10]:40000"), netip.MustParseAddrPort("[2001:db8::1]:443")}
	keys := [2]Key{{1, 2}, {3, 4}}
	for mss, want := range map[uint16]uint16{0: 1220, 536: 1220, 1440: 1440, 1460: 1460, 8939: 1460, 8940: 8940, 9000: 8940} {
		meta := Meta(mss, mss != 0, 8, true, true, false, 1, true)
		o, ok := Check(keys, tuple, 42, Cookie(keys[1], tuple, 42, meta))
		if !ok || o.MSS != want {
			t.Errorf("ipv6 mss %d: decoded %+v (%v), want MSS %d", mss, o, ok, want)
		}
	}
}
