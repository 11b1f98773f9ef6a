package syncookie

import (
	"context"
	"encoding/binary"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/google/gopacket/layers"
	"golang.org/x/sys/unix"

	"github.com/moat-shield/moat/internal/lab"
	"github.com/moat-shield/moat/internal/testpkt"
)

const burstFrameMax = 192 // bytes of a burst frame

// burster returns a function that transmits frames from h's first
// interface in one BPF_PROG_TEST_RUN live-frames batch: the receiving
// veth end then sees them in one NAPI poll, as a NIC hands a driver the
// frames that arrived together, so XDP runs over all of them before the
// stack has seen the first.
func burster(t *testing.T, h *lab.Host) func(frames [][]byte) {
	t.Helper()
	ctr, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.Array, KeySize: 4, ValueSize: 4, MaxEntries: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ctr.Close() })
	frames, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.Array, KeySize: 4, ValueSize: 8 + burstFrameMax, MaxEntries: 64})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { frames.Close() })
	ins := asm.Instructions{
		asm.Mov.Reg(asm.R6, asm.R1),
		asm.StoreImm(asm.R10, -4, 0, asm.Word),
		asm.LoadMapPtr(asm.R1, ctr.FD()),
		asm.Mov.Reg(asm.R2, asm.R10),
		asm.Add.Imm(asm.R2, -4),
		asm.FnMapLookupElem.Call(),
		asm.JEq.Imm(asm.R0, 0, "drop"),
		asm.LoadMem(asm.R7, asm.R0, 0, asm.Word),
		asm.Mov.Reg(asm.R8, asm.R7),
		asm.Add.Imm(asm.R8, 1),
		asm.StoreMem(asm.R0, 0, asm.R8, asm.Word),
		asm.StoreMem(asm.R10, -8, asm.R7, asm.Word),
		asm.LoadMapPtr(asm.R1, frames.FD()),
		asm.Mov.Reg(asm.R2, asm.R10),
		asm.Add.Imm(asm.R2, -8),
		asm.FnMapLookupElem.Call(),
		asm.JEq.Imm(asm.R0, 0, "drop"),
		asm.Mov.Reg(asm.R9, asm.R0),
		asm.LoadMem(asm.R2, asm.R6, 0, asm.Word),
		asm.LoadMem(asm.R3, asm.R6, 4, asm.Word),
		asm.Mov.Reg(asm.R4, asm.R2),
		asm.Add.Imm(asm.R4, burstFrameMax),
		asm.JGT.Reg(asm.R4, asm.R3, "drop"),
	}
	for k := int16(0); k < burstFrameMax/8; k++ {
		ins = append(ins,
			asm.LoadMem(asm.R5, asm.R9, 8+8*k, asm.DWord),
			asm.StoreMem(asm.R2, 8*k, asm.R5, asm.DWord))
	}
	ins = append(ins,
		asm.LoadMem(asm.R2, asm.R9, 0, asm.Word),
		asm.Add.Imm(asm.R2, -burstFrameMax),
		asm.Mov.Reg(asm.R1, asm.R6),
		asm.FnXdpAdjustTail.Call(),
		asm.Mov.Imm(asm.R0, 3), // XDP_TX
		asm.Return(),
		asm.Mov.Imm(asm.R0, 1).WithSymbol("drop"),
		asm.Return(),
	)
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{Type: ebpf.XDP, License: "GPL", Instructions: ins})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { prog.Close() })
	ifc := h.Ifaces[0]
	return func(fs [][]byte) {
		t.Helper()
		if err := ctr.Put(uint32(0), uint32(0)); err != nil {
			t.Fatal(err)
		}
		for i, f := range fs {
			if len(f) > burstFrameMax {
				t.Fatalf("frame of %d bytes", len(f))
			}
			v := make([]byte, 8+burstFrameMax)
			binary.NativeEndian.PutUint32(v, uint32(len(f)))
			copy(v[8:], f)
			if err := frames.Put(uint32(i), v); err != nil {
				t.Fatal(err)
			}
		}
		tmpl := make([]byte, burstFrameMax)
		err := h.Do(func() error {
			_, err := prog.Run(&ebpf.RunOptions{Data: tmpl, Repeat: uint32(len(fs)), BatchSize: uint32(len(fs)),
				Flags:   unix.BPF_F_TEST_XDP_LIVE_FRAMES,
				Context: xdpMD{DataEnd: uint32(len(tmpl)), IngressIfindex: uint32(ifc.Index)}})
			return err
		})
		if errors.Is(err, ebpf.ErrNotSupported) {
			t.Skipf("live frames: %v", err)
		}
		if err != nil {
			t.Fatalf("live frames: %v", err)
		}
	}
}

// quietResets keeps h's stack from resetting the connections a test plays
// by hand from h's own address (an nftables table in h's namespace, which
// goes with it).
func quietResets(t *testing.T, h *lab.Host) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cmd := h.Command(ctx, "nft", "-f", "-")
	cmd.Stdin = strings.NewReader("table inet quiet_resets {\n chain out {\n type filter hook output priority 0;\n tcp flags & rst == rst drop\n }\n}\n")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("nft: %v: %s", err, out)
	}
}

// TestHandshakeBurst: the third ACK of a cookie handshake and the
// client's first data segments reach the server in one burst (one NAPI
// poll, as a NIC delivers back-to-back frames): XDP and tc see them all
// before the stack has made the socket. None may be dropped, and the
// server must have them all at once, without waiting for the client to
// send them again: also when the third ACK itself was lost, and when the
// kernel issued the cookie. The control (the kernel's own cookies, no ACK
// filter) shows what the stack alone does. Without syn_recent, XDP
// dropped 5 of the 6 segments and tc gave the first data segment a second
// request socket, which the stack refused.
func TestHandshakeBurst(t *testing.T) {
	for _, tc := range []struct {
		name    string
		pureACK bool
		kernel  bool // control: moat in never mode, the kernel's own cookies
		filter  bool // with kernel: moat turns to cookie mode (always) between the SYN-ACK and the burst
	}{
		{"pure ack then data", true, false, false},
		{"data only (third ack lost)", false, false, false},
		{"control: kernel cookies, pure ack then data", true, true, false},
		{"kernel cookie, moat in cookie mode by the burst", true, true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mode := ModeAlways
			if tc.kernel {
				mode = ModeNever
			}
			s := newShielded(t, mode)
			if tc.kernel {
				setSysctl(t, s.lab.Server, "tcp_syncookies", "2")
			}
			_, accepted := echoServer(t, s.lab.Server)
			quietResets(t, s.lab.Attacker)
			send := s.lab.Attacker.RawSender(t)
			catch := s.lab.Attacker.SynAckCatcher(t)
			burst := burster(t, s.lab.Attacker)
			ifc := s.lab.Attacker.Ifaces[0]
			const sport = 45000
			frame := func(tcp testpkt.TCP) []byte {
				tcp.SrcPort, tcp.DstPort = sport, labPort
				return testpkt.Frame{SrcMAC: ifc.MAC, DstMAC: ifc.PeerMAC,
					Net: testpkt.IPv4{Src: ifc.IPv4.Addr(), Dst: ifc.PeerIPv4}, L4: tcp}.Bytes()
			}
			send(frame(testpkt.TCP{SYN: true, Seq: clientISN, Window: 65535,
				Options: []layers.TCPOption{testpkt.MSS(1460), testpkt.TCPNOP(), testpkt.TCPNOP(), testpkt.SACKPermitted()}}))
			synack := catch(sport)
			var fs [][]byte
			if tc.pureACK {
				fs = append(fs, frame(testpkt.TCP{ACK: true, Seq: clientISN + 1, Ack: synack.Seq + 1, Window: 65535}))
			}
			const segs, size = 6, 100
			var want []byte
			for i := 0; i < segs; i++ {
				p := make([]byte, size)
				for j := range p {
					p[j] = byte('a' + i)
				}
				want = append(want, p...)
				fs = append(fs, frame(testpkt.TCP{ACK: true, PSH: true, Seq: clientISN + 1 + uint32(i*size),
					Ack: synack.Seq + 1, Window: 65535, Payload: p}))
			}
			if tc.filter {
				if err := Protect(s.objs.SynPorts, s.objs.SynCounters, s.objs.SynCensus, labPort, ModeAlways, 0); err != nil {
					t.Fatal(err)
				}
			}
			before := s.status(t)
			burst(fs)
			var srv *net.TCPConn
			select {
			case srv = <-accepted:
			case <-time.After(2 * time.Second):
				t.Fatalf("nothing accepted: %+v", s.status(t))
			}
			// The echo server copies what it reads back: read it from the
			// server socket's counters instead.
			time.Sleep(300 * time.Millisecond)
			after := s.status(t)
			si := tcpInfo(t, srv)
			t.Logf("server socket: bytes received %d (of %d), segs in %d; moat: cookies accepted +%d, cookies rejected +%d, acks dropped +%d",
				si.Bytes_received, len(want), si.Segs_in, after.CookiesAccepted-before.CookiesAccepted,
				after.CookiesRejected-before.CookiesRejected, after.ACKsDropped-before.ACKsDropped)
			if d := after.ACKsDropped - before.ACKsDropped; d != 0 {
				t.Errorf("moat dropped %d of the client's in-order segments", d)
			}
			if si.Bytes_received != uint64(len(want)) {
				t.Errorf("server received %d bytes of the burst's %d", si.Bytes_received, len(want))
			}
			if d := after.CookiesAccepted - before.CookiesAccepted; d != 1 && !tc.kernel {
				t.Errorf("one handshake accepted %d times", d)
			}
		})
	}
}
