package cli_test

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cilium/ebpf"

	"github.com/moat-shield/moat/internal/capture"
	"github.com/moat-shield/moat/internal/datapath"
	"github.com/moat-shield/moat/internal/flood"
)

// dumpRun is a moat dump running in the server namespace.
type dumpRun struct {
	cmd    *exec.Cmd
	stderr *bytes.Buffer
	done   chan error
}

// startDump starts moat dump and waits until it captures.
func (sl *shieldLab) startDump(ctx context.Context, args ...string) *dumpRun {
	sl.t.Helper()
	cmd := sl.lab.Server.Command(ctx, moatBin, append(append([]string{"dump"}, args...), "--root", sl.root)...)
	pr, pw := io.Pipe()
	cmd.Stderr = pw
	d := &dumpRun{cmd: cmd, stderr: &bytes.Buffer{}, done: make(chan error, 1)}
	if err := cmd.Start(); err != nil {
		sl.t.Fatalf("start moat dump: %v", err)
	}
	ready := make(chan bool, 1)
	go func() {
		sc := bufio.NewScanner(pr)
		signalled := false
		for sc.Scan() {
			d.stderr.WriteString(sc.Text() + "\n")
			if !signalled && strings.Contains(sc.Text(), "capturing on") {
				ready <- true
				signalled = true
			}
		}
		if !signalled {
			ready <- false
		}
	}()
	go func() {
		err := cmd.Wait()
		pw.Close()
		d.done <- err
	}()
	sl.t.Cleanup(func() { cmd.Process.Kill() })
	if !<-ready {
		err := <-d.done
		sl.t.Fatalf("moat dump did not start: %v\n%s", err, d.stderr)
	}
	return d
}

// floodUDP sends exactly n spoofed UDP packets from the attacker to the
// server's port 9, at a rate the capture ring never overflows at.
func (sl *shieldLab) floodUDP(n uint64) {
	sl.t.Helper()
	ifc := sl.lab.Attacker.Ifaces[0]
	var res flood.Result
	err := sl.lab.Attacker.Do(func() (err error) {
		res, err = flood.Run(context.Background(), flood.Config{
			Kind: flood.KindUDP, IfIndex: ifc.Index, DstMAC: ifc.PeerMAC,
			Sources: sl.lab.SpoofV4, Dst: ifc.PeerIPv4, DstPort: 9,
			Count: n, Rate: 20000,
		})
		return err
	})
	if err != nil || res.Sent != n {
		sl.t.Fatalf("flood: sent %d of %d: %v", res.Sent, n, err)
	}
}

func (sl *shieldLab) captureSettings() datapath.MoatCaptureConfig {
	sl.t.Helper()
	m, err := ebpf.LoadPinnedMap(filepath.Join(sl.root, "maps", datapath.MoatMapCaptureSettings), nil)
	if err != nil {
		sl.t.Fatal(err)
	}
	defer m.Close()
	var c datapath.MoatCaptureConfig
	if err := m.Lookup(uint32(0), &c); err != nil {
		sl.t.Fatal(err)
	}
	return c
}

// TestDumpFlood captures a short flood of which a deny rule drops part,
// and reads the file back with moat's pcapng reader and with tshark. Packet counts, verdicts and bytes must match
// the filter's own counters. Then a killed dump: capture must turn itself
// off.
func TestDumpFlood(t *testing.T) {
	t.Parallel()
	tshark, err := exec.LookPath("tshark")
	if err != nil {
		t.Fatalf("tshark is missing: run scripts/setup.sh (apt-get install tshark)")
	}
	sl := newShieldLab(t)
	_, toAttacker := sl.ifaces()
	// Half of the spoofed range is denied: the flood picks sources at
	// random in the /16, so both verdicts show up.
	denied := netip.PrefixFrom(sl.lab.SpoofV4.Addr(), sl.lab.SpoofV4.Bits()+1)
	sl.mustMoat("attach", toAttacker)
	sl.mustMoat("block", denied.String())
	before := sl.stats()[toAttacker]

	const n = 2000
	file := filepath.Join(t.TempDir(), "flood.pcapng")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	d := sl.startDump(ctx, "-i", toAttacker, "-w", file, "--net", sl.lab.SpoofV4.String(), "-c", strconv.Itoa(n))
	if c := sl.captureSettings(); c.Enabled != 1 {
		t.Fatalf("capture settings while dumping: %+v", c)
	}
	sl.floodUDP(n)
	if err := <-d.done; err != nil {
		t.Fatalf("moat dump: %v\n%s", err, d.stderr)
	}
	after := sl.stats()[toAttacker]
	if c := sl.captureSettings(); c.Enabled != 0 {
		t.Fatal("capture still on after moat dump exited")
	}
	if !strings.Contains(d.stderr.String(), "2000 packets captured") || !strings.Contains(d.stderr.String(), " 0 packets lost") {
		t.Errorf("dump's report:\n%s", d.stderr)
	}

	// What the filter counted, to compare the capture with.
	deny := after.ByReason["denylist"].Dropped.Packets - before.ByReason["denylist"].Dropped.Packets
	pass := after.ByReason["pass"].Passed.Packets - before.ByReason["pass"].Passed.Packets
	bytesIn := after.Passed.Bytes + after.Dropped.Bytes - before.Passed.Bytes - before.Dropped.Bytes
	if deny+pass != n || deny == 0 || pass == 0 {
		t.Fatalf("filter counted %d denied and %d passed of %d sent; want both, and nothing else", deny, pass, n)
	}

	// 1. moat's reader: every packet whole, with its verdict and rule.
	raw, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	pkts, err := capture.ReadPcapng(bytes.NewReader(raw))
	if err != nil {
		t.Fatalf("read pcapng: %v", err)
	}
	wantDeny := "moat: drop denylist rule=" + denied.String()
	var gotDeny, gotPass, gotBytes uint64
	for i, p := range pkts {
		if len(p.Comments) != 1 || len(p.Data) != p.Length || p.IfName != toAttacker {
			t.Fatalf("packet %d: %d of %d bytes on %q, comments %q", i, len(p.Data), p.Length, p.IfName, p.Comments)
		}
		switch p.Comments[0] {
		case wantDeny:
			gotDeny++
		case "moat: pass pass":
			gotPass++
		default:
			t.Fatalf("packet %d: comment %q", i, p.Comments[0])
		}
		gotBytes += uint64(p.Length)
	}
	if uint64(len(pkts)) != n || gotDeny != deny || gotPass != pass || gotBytes != bytesIn {
		t.Fatalf("file: %d packets, %d denied, %d passed, %d bytes; filter: %d, %d, %d, %d bytes",
			len(pkts), gotDeny, gotPass, gotBytes, n, deny, pass, bytesIn)
	}

	// 2. tshark, which knows nothing of moat.
	out, err := exec.Command(tshark, "-r", file, "-T", "fields", "-E", "separator=|",
		"-e", "frame.len", "-e", "frame.cap_len", "-e", "frame.comment", "-e", "ip.src").Output()
	if err != nil {
		t.Fatalf("tshark: %v", err)
	}
	var tsDeny, tsPass, tsBytes, tsCount uint64
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Split(line, "|")
		if len(f) != 4 || f[0] != f[1] {
			t.Fatalf("tshark line %q", line)
		}
		l, _ := strconv.ParseUint(f[0], 10, 32)
		tsBytes += l
		tsCount++
		src := netip.MustParseAddr(f[3])
		switch {
		case f[2] == wantDeny && denied.Contains(src):
			tsDeny++
		case f[2] == "moat: pass pass" && !denied.Contains(src):
			tsPass++
		default:
			t.Fatalf("tshark: %s with comment %q", src, f[2])
		}
	}
	if tsCount != n || tsDeny != deny || tsPass != pass || tsBytes != bytesIn {
		t.Fatalf("tshark: %d packets, %d denied, %d passed, %d bytes; filter: %d, %d, %d, %d bytes",
			tsCount, tsDeny, tsPass, tsBytes, n, deny, pass, bytesIn)
	}

	t.Logf("%d packets captured: %d denied, %d passed, %d bytes; moat, tshark and the filter's counters agree", n, deny, pass, bytesIn)
	if testing.Verbose() {
		if out, err := exec.Command(tshark, "-r", file, "-c", "3", "-V").Output(); err == nil {
			t.Logf("tshark -V, first packets:\n%s", out)
		}
		out, err := exec.Command("tcpdump", "-nr", file, "-c", "3").CombinedOutput()
		t.Logf("tcpdump (%v):\n%s", err, out)
	}

	// A killed dump: the lock goes with it, a second dump is refused
	// while it lives, and the data path turns capture off once the lease
	// has run out.
	d2 := sl.startDump(ctx, "-i", toAttacker, "-w", filepath.Join(t.TempDir(), "killed.pcapng"))
	if r := sl.moat("dump", "-i", toAttacker, "-w", filepath.Join(t.TempDir(), "second.pcapng")); r.code != 2 || !strings.Contains(r.stderr, "another moat dump") {
		t.Fatalf("second dump: %v", r)
	}
	d2.cmd.Process.Signal(syscall.SIGKILL)
	<-d2.done
	if c := sl.captureSettings(); c.Enabled != 1 {
		t.Fatal("capture off right after the kill: the test does not test the lease")
	}
	time.Sleep(3500 * time.Millisecond) // the lease (3 s) runs out
	sl.floodUDP(1)                      // the data path notices on the next packet
	if c := sl.captureSettings(); c.Enabled != 0 {
		t.Fatal("capture still on after a killed dump's lease ran out")
	}
}

// TestDumpRefusedKeepsFile: a dump refused while another captures leaves
// its -w file alone, even when that is the running dump's. The running
// dump, which matches nothing, then writes a file that readers take.
func TestDumpRefusedKeepsFile(t *testing.T) {
	t.Parallel()
	sl := newShieldLab(t)
	_, toAttacker := sl.ifaces()
	sl.mustMoat("attach", toAttacker)
	dir := t.TempDir()
	first, other := filepath.Join(dir, "first.pcapng"), filepath.Join(dir, "other.pcapng")
	if err := os.WriteFile(other, []byte("not a capture\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	d := sl.startDump(ctx, "-i", toAttacker, "-w", first, "--host", "192.0.2.123")
	// The headers reach the file at the first flush.
	var head []byte
	for deadline := time.Now().Add(5 * time.Second); len(head) == 0 && time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		head, _ = os.ReadFile(first)
	}
	if len(head) == 0 {
		t.Fatal("the running dump wrote nothing")
	}
	for _, file := range []string{other, first} {
		before, _ := os.ReadFile(file)
		if r := sl.moat("dump", "-i", toAttacker, "-w", file); r.code != 2 || !strings.Contains(r.stderr, "another moat dump") {
			t.Fatalf("second dump to %s: %v", filepath.Base(file), r)
		}
		if after, _ := os.ReadFile(file); !bytes.Equal(after, before) {
			t.Errorf("a refused dump changed %s: %d bytes, were %d", filepath.Base(file), len(after), len(before))
		}
	}

	d.cmd.Process.Signal(os.Interrupt)
	if err := <-d.done; err != nil {
		t.Fatalf("moat dump: %v\n%s", err, d.stderr)
	}
	if !strings.Contains(d.stderr.String(), " 0 packets captured") {
		t.Errorf("dump's report:\n%s", d.stderr)
	}
	raw, err := os.ReadFile(first)
	if err != nil {
		t.Fatal(err)
	}
	if pkts, err := capture.ReadPcapng(bytes.NewReader(raw)); err != nil || len(pkts) != 0 {
		t.Fatalf("read pcapng: %d packets, %v", len(pkts), err)
	}
	if !bytes.Contains(raw, []byte("moat: 0 packets captured, 0 lost")) {
		t.Error("no statistics block")
	}
	if tcpdump, err := exec.LookPath("tcpdump"); err == nil {
		if out, err := exec.Command(tcpdump, "-nr", first).CombinedOutput(); err != nil {
			t.Errorf("tcpdump: %v\n%s", err, out)
		}
	}
}
