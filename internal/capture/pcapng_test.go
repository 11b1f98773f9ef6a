package capture

import (
	"bytes"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/moat-shield/moat/internal/datapath"
	"github.com/moat-shield/moat/internal/testpkt"
)

// TestPcapngRoundTrip writes packets of every padding remainder, with
// comments of every padding remainder, on two interfaces, and reads them
// back with ReadPcapng and, where installed, tshark.
func TestPcapngRoundTrip(t *testing.T) {
	names := map[int]string{3: "eth-a", 7: "eth-b"}
	var buf bytes.Buffer
	w, err := NewPcapngWriter(&buf, 1500, func(i int) string { return names[i] })
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Unix(1_700_000_000, 123456789)
	var want []Packet
	var comments []string
	for i := 0; i < 8; i++ {
		pkt := testpkt.UDPv4(clean4, server4, testpkt.UDP{SrcPort: 1, DstPort: 2, Payload: bytes.Repeat([]byte{byte(i)}, 18+i)}) // frames of 60+i bytes
		p := Packet{
			Time: t0.Add(time.Duration(i) * time.Microsecond), Ifindex: []int{3, 7}[i%2],
			Length: len(pkt) + i%3, Data: pkt, Action: ActionDrop,
			Reason: datapath.MoatVerdictReasonREASON_DENYLIST,
			Rule:   netip.MustParsePrefix(fmt.Sprintf("10.%d.0.0/16", i)),
		}
		c := Comment(p, nil) + strings.Repeat("!", i%4)
		if err := w.WritePacket(p, c); err != nil {
			t.Fatal(err)
		}
		want = append(want, p)
		comments = append(comments, c)
	}
	if err := w.WriteStats("moat: 8 packets captured, 0 lost (ring buffer full)"); err != nil {
		t.Fatal(err)
	}
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}

	got, err := ReadPcapng(bytes.NewReader(buf.Bytes()))
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(want) {
		t.Fatalf("read %d packets, wrote %d", len(got), len(want))
	}
	for i, g := range got {
		p := want[i]
		if g.IfName != names[p.Ifindex] || !g.Time.Equal(p.Time) || g.Length != p.Length ||
			!bytes.Equal(g.Data, p.Data) || len(g.Comments) != 1 || g.Comments[0] != comments[i] {
			t.Errorf("packet %d: read %+v, wrote %+v with %q", i, g, p, comments[i])
		}
	}

	tshark, err := exec.LookPath("tshark")
	if err != nil {
		t.Log("tshark not installed; checked with moat's reader only")
		return
	}
	file := filepath.Join(t.TempDir(), "t.pcapng")
	if err := os.WriteFile(file, buf.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(tshark, "-r", file, "-T", "fields", "-E", "separator=|",
		"-e", "frame.interface_name", "-e", "frame.len", "-e", "frame.cap_len", "-e", "frame.comment").Output()
	if err != nil {
		t.Fatalf("tshark: %v", err)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if len(lines) != len(want) {
		t.Fatalf("tshark read %d packets, wrote %d:\n%s", len(lines), len(want), out)
	}
	for i, l := range lines {
		p := want[i]
		if exp := fmt.Sprintf("%s|%d|%d|%s", names[p.Ifindex], p.Length, len(p.Data), comments[i]); l != exp {
			t.Errorf("tshark packet %d: %q, want %q", i, l, exp)
		}
	}
}
