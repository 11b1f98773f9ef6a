package lab

import (
	"errors"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"
	"golang.org/x/sys/unix"
)

// xdpMD is the kernel's struct xdp_md, the context of an XDP test run.
type xdpMD struct {
	Data, DataEnd, DataMeta      uint32
	IngressIfindex, RxQueueIndex uint32
	EgressIfindex                uint32
}

// spoofedUDPFrame builds an Ethernet frame from the attacker's interface to
// the server with a forged source address.
func spoofedUDPFrame(t *testing.T, ifc Iface, src netip.Addr, srcPort, dstPort uint16, payload []byte) []byte {
	t.Helper()
	eth := &layers.Ethernet{SrcMAC: ifc.MAC, DstMAC: ifc.PeerMAC, EthernetType: layers.EthernetTypeIPv4}
	ip := &layers.IPv4{Version: 4, TTL: 64, Protocol: layers.IPProtocolUDP,
		SrcIP: net.IP(src.AsSlice()), DstIP: net.IP(ifc.PeerIPv4.AsSlice())}
	udp := &layers.UDP{SrcPort: layers.UDPPort(srcPort), DstPort: layers.UDPPort(dstPort)}
	if err := udp.SetNetworkLayerForChecksum(ip); err != nil {
		t.Fatal(err)
	}
	buf := gopacket.NewSerializeBuffer()
	opts := gopacket.SerializeOptions{FixLengths: true, ComputeChecksums: true}
	if err := gopacket.SerializeLayers(buf, opts, eth, ip, udp, gopacket.Payload(payload)); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// The attack generator transmits frames with BPF_PROG_TEST_RUN live frames
// from the attacker's interface. They reach the server only if the server's
// veth end runs NAPI (GRO on), and its reply to the forged source must come
// back to the attacker.
func TestLiveFramesReachServer(t *testing.T) {
	l := NewT(t)
	atkIf := l.Attacker.Ifaces[0]
	spoofed := netip.MustParseAddr("198.19.77.1")
	const spoofedPort = 4242

	var srv, atk net.PacketConn
	if err := l.Server.Do(func() (err error) {
		srv, err = net.ListenPacket("udp", netip.AddrPortFrom(atkIf.PeerIPv4, 0).String())
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	if err := l.Attacker.Do(func() (err error) {
		atk, err = net.ListenPacket("udp", netip.AddrPortFrom(spoofed, spoofedPort).String())
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer atk.Close()
	deadline := time.Now().Add(ioTimeout)
	srv.SetDeadline(deadline)
	atk.SetDeadline(deadline)

	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Type:    ebpf.XDP,
		License: "GPL",
		Instructions: asm.Instructions{
			asm.Mov.Imm(asm.R0, 3), // XDP_TX
			asm.Return(),
		},
	})
	if err != nil {
		t.Fatalf("load XDP_TX program: %v", err)
	}
	defer prog.Close()

	const frames = 8
	dstPort := uint16(srv.LocalAddr().(*net.UDPAddr).Port)
	frame := spoofedUDPFrame(t, atkIf, spoofed, spoofedPort, dstPort, []byte("live frame"))
	err = l.Attacker.Do(func() error {
		// ingress_ifindex is resolved in the calling thread's namespace.
		_, err := prog.Run(&ebpf.RunOptions{
			Data:    frame,
			Repeat:  frames,
			Flags:   unix.BPF_F_TEST_XDP_LIVE_FRAMES,
			Context: xdpMD{DataEnd: uint32(len(frame)), IngressIfindex: uint32(atkIf.Index)},
		})
		return err
	})
	if errors.Is(err, ebpf.ErrNotSupported) || errors.Is(err, unix.Errno(524)) /* kernel ENOTSUPP */ {
		t.Skipf("XDP live frames not supported: %v", err)
	}
	if err != nil {
		t.Fatalf("live frames: %v", err)
	}

	buf := make([]byte, 64)
	for i := range frames {
		n, from, err := srv.ReadFrom(buf)
		if err != nil {
			t.Fatalf("server received %d of %d live frames: %v", i, frames, err)
		}
		if got := from.(*net.UDPAddr).AddrPort(); got != netip.AddrPortFrom(spoofed, spoofedPort) || string(buf[:n]) != "live frame" {
			t.Fatalf("server got %q from %s", buf[:n], got)
		}
	}
	if _, err := srv.WriteTo([]byte("to the forger"), net.UDPAddrFromAddrPort(netip.AddrPortFrom(spoofed, spoofedPort))); err != nil {
		t.Fatal(err)
	}
	n, _, err := atk.ReadFrom(buf)
	if err != nil || string(buf[:n]) != "to the forger" {
		t.Fatalf("attacker did not get the reply to its forged source: %q, %v", buf[:n], err)
	}
}
