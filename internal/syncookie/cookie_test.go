package syncookie

import (
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The first vector of the SipHash paper's appendix: key 00..0f, message
// 00..0e.
func TestSipHashVector(t *testing.T) {
	msg := make([]byte, 15)
	for i := range msg {
		msg[i] = byte(i)
	}
	k := Key{0x0706050403020100, 0x0f0e0d0c0b0a0908}
	if got := SipHash24(k, msg); got != 0xa129ca6149be45e5 {
		t.Fatalf("SipHash-2-4 = %#x, want 0xa129ca6149be45e5", got)
	}
}

func TestCookieRoundTrip(t *testing.T) {
	tuple := Tuple{netip.MustParseAddrPort("192.0.2.10:40000"), netip.MustParseAddrPort("192.0.2.1:443")}
	keys := [2]Key{{1, 2}, {3, 4}}
	// The largest table entry not above the client's MSS (536 at least).
	want := map[uint16]uint16{0: 536, 536: 536, 1300: 1300, 1460: 1460, 9000: 8960}
	for gen := uint64(1); gen <= 2; gen++ {
		for _, mss := range []uint16{0, 536, 1300, 1460, 9000} {
			meta := Meta(mss, true, 8, true, true, true, gen, false)
			c := Cookie(keys[gen&1], tuple, 42, meta)
			o, ok := Check(keys, tuple, 42, c)
			if !ok || o.WScale != 8 || !o.SACK || !o.ECN || o.MSS != want[mss] {
				t.Errorf("gen %d mss %d: %+v %v", gen, mss, o, ok)
			}
			if _, ok := Check(keys, tuple, 43, c); ok {
				t.Errorf("cookie valid for another ISN")
			}
			if _, ok := Check([2]Key{{5, 6}, {7, 8}}, tuple, 42, c); ok {
				t.Errorf("cookie valid under other keys")
			}
		}
	}
}

// TestCheckSysctlsNamesWhatIsWrong: tcp_syncookies 0 is an error (no
// cookie handshake is taken at all); an option turned off is a note, named
// with what moat then does.
func TestCheckSysctlsNamesWhatIsWrong(t *testing.T) {
	dir := t.TempDir()
	write := func(vals map[string]string) {
		for name, v := range vals {
			if err := os.WriteFile(filepath.Join(dir, name), []byte(v), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	write(map[string]string{"tcp_syncookies": "0\n", "tcp_sack": "1\n", "tcp_timestamps": "1\n", "tcp_window_scaling": "0\n", "tcp_ecn": "2\n"})
	notes, err := checkSysctlsIn(dir)
	if err == nil || !strings.Contains(err.Error(), "net.ipv4.tcp_syncookies is 0") || strings.Contains(err.Error(), "\n") {
		t.Errorf("error %v, want one line naming net.ipv4.tcp_syncookies", err)
	}
	if err != nil && strings.Contains(err.Error(), "window_scaling") {
		t.Errorf("error %q names a sysctl moat can do without", err)
	}
	if len(notes) != 1 || !strings.Contains(notes[0], "net.ipv4.tcp_window_scaling is 0: moat's SYN-ACKs offer no window scaling") {
		t.Errorf("notes %q, want one for tcp_window_scaling", notes)
	}

	write(map[string]string{"tcp_syncookies": "2\n", "tcp_sack": "0\n", "tcp_timestamps": "2\n", "tcp_window_scaling": "1\n", "tcp_ecn": "0\n"})
	notes, err = checkSysctlsIn(dir)
	if err != nil || len(notes) != 2 || !strings.Contains(notes[0], "net.ipv4.tcp_sack is 0") || !strings.Contains(notes[1], "net.ipv4.tcp_ecn is 0") {
		t.Errorf("sack and ecn off: error %v, notes %q", err, notes)
	}
	write(map[string]string{"tcp_sack": "1\n", "tcp_ecn": "1\n"})
	if notes, err := checkSysctlsIn(dir); err != nil || len(notes) != 0 {
		t.Errorf("all on: error %v, notes %q", err, notes)
	}
}

// TestCookieTSRoundTrip: a cookie made for a SYN with timestamps is valid
// only with them, and only when TSecr echoes the TSval's hash bits.
func TestCookieTSRoundTrip(t *testing.T) {
	tuple := Tuple{netip.MustParseAddrPort("[2001:db8::10]:40000"), netip.MustParseAddrPort("[2001:db8::1]:443")}
	keys := [2]Key{{1, 2}, {3, 4}}
	meta := Meta(1400, true, 7, true, true, false, 1, true)
	c, ts := CookieTS(keys[1], tuple, 42, meta, 123456)
	if o, ok := CheckTS(keys, tuple, 42, c, ts); !ok || o.MSS != 1400 || o.WScale != 7 {
		t.Fatalf("CheckTS: %+v %v", o, ok)
	}
	if _, ok := Check(keys, tuple, 42, c); ok {
		t.Error("a timestamps cookie is valid without timestamps")
	}
	if _, ok := CheckTS(keys, tuple, 42, c, ts^1); ok {
		t.Error("valid with a wrong TSecr hash bit")
	}
	if off := TSOffset(keys[1], tuple, 42, meta); (ts-off)&^0xff != 123456&^0xff {
		t.Errorf("TSval %d less offset %d is not the clock 123456", ts, off)
	}
	if _, ok := CheckTS(keys, tuple, 42, Cookie(keys[1], tuple, 42, meta), ts); ok {
		t.Error("a cookie made without timestamps is valid with them")
	}
}

func TestCountCPUList(t *testing.T) {
	for in, want := range map[string]int{"0": 1, "0-1": 2, "0-3,6": 5, "0,2,4-7": 6, "": 0, "x": 0, "3-1": 0} {
		if got := countCPUList(in); got != want {
			t.Errorf("countCPUList(%q) = %d, want %d", in, got, want)
		}
	}
}

func TestListensOn(t *testing.T) {
	table := `  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 00000000:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1 1 0000000000000000 100 0 0 10 0
   1: 0100007F:0050 0100007F:9C40 01 00000000:00000000 00:00000000 00000000     0        0 2 1 0000000000000000 20 4 30 10 -1
`
	if !listensOn(table, 8080) {
		t.Error("listener on 8080 not found")
	}
	if listensOn(table, 80) {
		t.Error("an established socket on 80 taken for a listener")
	}
}

// TestTSvalOffsetHidesUptime: the TSval offset is as wide as the kernel's
// own (32 bits), so the smallest TSval of many connections tells nothing
// of the clock. With a narrower offset every TSval would lie within its
// range above the clock.
func TestTSvalOffsetHidesUptime(t *testing.T) {
	const uptimeMS = uint32(30 * 24 * 3600 * 1000)
	k := Key{0x0123456789abcdef, 0xfedcba9876543210}
	meta := Meta(1460, true, 7, true, true, false, 1, false)
	const n = 1000
	above := 0 // TSvals more than 2^28 ms (3.1 days) above the clock
	for i := range n {
		tuple := Tuple{netip.AddrPortFrom(netip.AddrFrom4([4]byte{198, 51, 100, byte(i)}), uint16(40000+i)), netip.MustParseAddrPort("192.0.2.1:443")}
		_, ts := CookieTS(k, tuple, uint32(i)*2654435761, meta, uptimeMS)
		if ts-uptimeMS >= 1<<28 {
			above++
		}
	}
	// Uniform offsets put 15/16 of them there.
	if above < n*85/100 {
		t.Errorf("%d of %d TSvals more than 2^28 ms above the clock, want about 15/16", above, n)
	}
}
