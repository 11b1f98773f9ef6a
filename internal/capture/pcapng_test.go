package capture

import (
	"bytes"
	"encoding/binary"
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
	// No interfaces up front: each gets its block with its first packet.
	w, err := NewPcapngWriter(&buf, 1500, nil, func(i int) string { return names[i] })
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

// TestPcapngEmpty: a capture that matched nothing is still a file that
// readers take, with an interface per target and the closing statistics.
func TestPcapngEmpty(t *testing.T) {
	names := map[int]string{3: "eth-a", 7: "eth-b"}
	var buf bytes.Buffer
	w, err := NewPcapngWriter(&buf, 1500, []int{3, 7}, func(i int) string { return names[i] })
	if err != nil {
		t.Fatal(err)
	}
	const stats = "moat: 0 packets captured, 0 lost (ring buffer full)"
	if err := w.WriteStats(stats); err != nil {
		t.Fatal(err)
	}
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	got, err := ReadPcapng(bytes.NewReader(buf.Bytes()))
	if err != nil || len(got) != 0 {
		t.Fatalf("read %d packets: %v", len(got), err)
	}
	var types []uint32
	for b := buf.Bytes(); len(b) >= 8; b = b[binary.LittleEndian.Uint32(b[4:]):] {
		types = append(types, binary.LittleEndian.Uint32(b))
	}
	if want := []uint32{blockSHB, blockIDB, blockIDB, blockISB, blockISB}; fmt.Sprint(types) != fmt.Sprint(want) {
		t.Errorf("blocks %x, want %x", types, want)
	}
	if !bytes.Contains(buf.Bytes(), []byte(stats)) {
		t.Error("no statistics comment")
	}

	file := filepath.Join(t.TempDir(), "empty.pcapng")
	if err := os.WriteFile(file, buf.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, r := range [][]string{{"tcpdump", "-nr", file}, {"tshark", "-r", file}} {
		bin, err := exec.LookPath(r[0])
		if err != nil {
			t.Logf("%s not installed", r[0])
			continue
		}
		if out, err := exec.Command(bin, r[1:]...).CombinedOutput(); err != nil {
			t.Errorf("%s: %v\n%s", r[0], err, out)
		}
	}
}
