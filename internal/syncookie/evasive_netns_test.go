package syncookie

import (
	"encoding/binary"
	"fmt"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"

	"github.com/moat-shield/moat/internal/datapath"
	"github.com/moat-shield/moat/internal/lab"
	"github.com/moat-shield/moat/internal/testpkt"
)

// evasivePort has a listener and, once the filter is attached, a drop rule.
const evasivePort = 2222

// TCP states as /proc/net/tcp prints them.
const (
	tcpSynRecv  = "03"
	tcpTimeWait = "06"
)

// socketsIn counts the TCP sockets of local port port in state in h's
// namespace (tcp and tcp6: a dual-stack listener's sockets are in either).
// /proc/thread-self: /proc/net shows the namespace of the process's first
// thread, which an earlier test may have left in a scratch one.
func socketsIn(t *testing.T, h *lab.Host, port uint16, state string) int {
	t.Helper()
	want := fmt.Sprintf(":%04X", port)
	n := 0
	err := h.Do(func() error {
		for _, table := range []string{"/proc/thread-self/net/tcp", "/proc/thread-self/net/tcp6"} {
			b, err := os.ReadFile(table)
			if err != nil {
				return err
			}
			for _, line := range strings.Split(string(b), "\n")[1:] {
				f := strings.Fields(line)
				if len(f) > 3 && strings.HasSuffix(f[1], want) && f[3] == state {
					n++
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestEvasivePacketsNeverReachTheListener sends SYNs that the kernel takes
// but the filter cannot read through: split into RFC 1858 tiny IPv4
// fragments (the first holds 8 bytes of TCP, the second the rest at offset
// 8), or behind nine IPv6 destination options headers, one more than the
// filter walks. Without the filter each reaches the listener. With a drop
// rule on the port and the malformed policy at pass, none may: the policy
// passes headers the stack discards too, never ones that would carry a
// packet past a rule.
func TestEvasivePacketsNeverReachTheListener(t *testing.T) {
	l := lab.NewT(t)
	objs := loadObjects(t)
	ifc := l.Attacker.Ifaces[0]
	server := l.Server.Ifaces[1] // the attacker's side
	if server.PeerMAC.String() != ifc.MAC.String() {
		t.Fatalf("lab layout: server interface %s is not the attacker's peer", server.Name)
	}

	// The attacker drops the SYN-ACKs, so that no reset from its stack
	// takes the request sockets away before they are counted.
	dropAll, err := ebpf.NewProgram(&ebpf.ProgramSpec{Type: ebpf.XDP, License: "GPL",
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 1), asm.Return()}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dropAll.Close() })
	attach := func(h *lab.Host, prog *ebpf.Program, index int) link.Link {
		var x link.Link
		if err := h.Do(func() (err error) {
			x, err = link.AttachXDP(link.XDPOptions{Program: prog, Interface: index})
			return err
		}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { x.Close() })
		return x
	}
	attach(l.Attacker, dropAll, ifc.Index)
	var ln net.Listener
	if err := l.Server.Do(func() (err error) {
		ln, err = net.Listen("tcp", fmt.Sprintf("[::]:%d", evasivePort))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })

	send := l.Attacker.RawSender(t)
	sport := uint16(41000)
	syn := func() testpkt.TCP {
		sport++
		return testpkt.TCP{SrcPort: sport, DstPort: evasivePort, Seq: 1, SYN: true, Window: 64240,
			Options: []testpkt.TCPOption{testpkt.MSS(1460)}}
	}
	frame := func(n testpkt.Network, l4 testpkt.Transport) []byte {
		return testpkt.Frame{SrcMAC: ifc.MAC, DstMAC: ifc.PeerMAC, Net: n, L4: l4}.Bytes()
	}
	whole := func() [][]byte {
		return [][]byte{frame(testpkt.IPv4{Src: ifc.IPv4.Addr(), Dst: ifc.PeerIPv4}, syn())}
	}
	tinyFragments := func() [][]byte {
		// The segment with its checksum, as the stack checks it once
		// the fragments are put together (the IPv4 total length leaves
		// out the frame's padding).
		b := testpkt.TCPv4(ifc.IPv4.Addr(), ifc.PeerIPv4, syn())
		seg := b[14+20 : 14+int(binary.BigEndian.Uint16(b[14+2:]))]
		id := sport
		return [][]byte{
			frame(testpkt.IPv4{Src: ifc.IPv4.Addr(), Dst: ifc.PeerIPv4, ID: id, MF: true},
				testpkt.Payload{Proto: testpkt.ProtoTCP, Data: seg[:8]}),
			frame(testpkt.IPv4{Src: ifc.IPv4.Addr(), Dst: ifc.PeerIPv4, ID: id, FragOff: 1},
				testpkt.Payload{Proto: testpkt.ProtoTCP, Data: seg[8:]}),
		}
	}
	longChain := func() [][]byte {
		ext := make([]testpkt.IPv6Ext, 9)
		for i := range ext {
			ext[i] = testpkt.DestOpts{}
		}
		return [][]byte{frame(testpkt.IPv6{Src: ifc.IPv6.Addr(), Dst: ifc.PeerIPv6, Ext: ext}, syn())}
	}
	// took sends the frames and says whether the listener got a request
	// socket from them.
	took := func(frames [][]byte) bool {
		before := socketsIn(t, l.Server, evasivePort, tcpSynRecv)
		for _, f := range frames {
			send(f)
		}
		deadline := time.Now().Add(time.Second)
		for time.Now().Before(deadline) {
			if socketsIn(t, l.Server, evasivePort, tcpSynRecv) > before {
				return true
			}
			time.Sleep(20 * time.Millisecond)
		}
		return false
	}

	shapes := []struct {
		name   string
		frames func() [][]byte
	}{
		{"tiny IPv4 fragments", tinyFragments},
		{"IPv6 SYN behind nine destination options", longChain},
	}
	for _, s := range shapes {
		if !took(s.frames()) {
			t.Fatalf("%s: no request socket without the filter; the test sends nothing the stack takes", s.name)
		}
	}

	if err := objs.PortRules.Put(uint32(datapath.MoatPortClassPORT_CLASS_TCP)<<16|evasivePort,
		datapath.MoatPortRule{Id: 1, Action: uint8(datapath.MoatRuleActionACTION_DROP)}); err != nil {
		t.Fatal(err)
	}
	if err := objs.Settings.Put(uint32(0), datapath.MoatRuntimeSettings{
		Malformed: uint32(datapath.MoatMalformedPolicyMALFORMED_PASS),
	}); err != nil {
		t.Fatal(err)
	}
	attach(l.Server, objs.MoatFilter, server.Index)
	if took(whole()) {
		t.Fatalf("a whole SYN reached the listener past the drop rule on tcp/%d", evasivePort)
	}
	for _, s := range shapes {
		if took(s.frames()) {
			t.Errorf("%s reached the listener past the drop rule on tcp/%d (malformed policy pass)", s.name, evasivePort)
		}
	}
	// Each evasive frame is counted as a malformed drop.
	var per []datapath.MoatVerdictCounter
	if err := objs.Counters.Lookup(uint32(datapath.MoatVerdictReasonREASON_MALFORMED)*2+1, &per); err != nil {
		t.Fatal(err)
	}
	var dropped uint64
	for _, c := range per {
		dropped += c.Packets
	}
	if dropped != 3 {
		t.Errorf("malformed drops %d, want 3 (two fragments, one long chain)", dropped)
	}
}
