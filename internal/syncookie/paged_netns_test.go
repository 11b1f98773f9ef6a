package syncookie

import (
	"bytes"
	"encoding/binary"
	"io"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
	"github.com/google/gopacket/layers"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/moat-shield/moat/internal/testpkt"
)

// openTap makes a tap device in the calling thread's namespace and returns
// its fd (blocking, with a virtio-net header in front of every frame) and
// the device. A blocking write of a page or more with the header's hdr_len
// set leaves only hdr_len bytes in the skb's linear area and the rest in
// page fragments, as drivers that split headers do, and as GRO leaves the
// segments it merges.
func openTap(t *testing.T, name string) (int, netlink.Link) {
	t.Helper()
	fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatalf("open /dev/net/tun: %v", err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	ifr, err := unix.NewIfreq(name)
	if err != nil {
		t.Fatal(err)
	}
	ifr.SetUint16(unix.IFF_TAP | unix.IFF_NO_PI | unix.IFF_VNET_HDR)
	if err := unix.IoctlIfreq(fd, unix.TUNSETIFF, ifr); err != nil {
		t.Fatalf("TUNSETIFF %s: %v", name, err)
	}
	l, err := netlink.LinkByName(name)
	if err != nil {
		t.Fatal(err)
	}
	return fd, l
}

// writeNonLinear writes frame to the tap with its first linear bytes in
// the skb's linear area and the rest in page fragments (virtio-net header:
// no checksum offload, no GSO, hdr_len linear, little-endian). The frame
// must be a page long or more.
func writeNonLinear(t *testing.T, fd int, frame []byte, linear int) {
	t.Helper()
	var hdr [10]byte
	binary.LittleEndian.PutUint16(hdr[2:], uint16(linear))
	if _, err := unix.Write(fd, append(hdr[:], frame...)); err != nil {
		t.Fatalf("write to tap: %v", err)
	}
}

// linearLengths is a tcx program that records, for each packet, the length
// of the skb's linear area (data_end - data) in slot 0 of the returned
// map, then hands the packet on to the next program.
func linearLengths(t *testing.T) (*ebpf.Program, *ebpf.Map) {
	t.Helper()
	m, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.Array, KeySize: 4, ValueSize: 4, MaxEntries: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{Type: ebpf.SchedCLS, License: "GPL", Instructions: asm.Instructions{
		asm.Mov.Reg(asm.R6, asm.R1),
		asm.StoreImm(asm.RFP, -4, 0, asm.Word),
		asm.LoadMapPtr(asm.R1, m.FD()),
		asm.Mov.Reg(asm.R2, asm.RFP),
		asm.Add.Imm(asm.R2, -4),
		asm.FnMapLookupElem.Call(),
		asm.JEq.Imm(asm.R0, 0, "next"),
		asm.LoadMem(asm.R2, asm.R6, 76, asm.Word), // __sk_buff.data
		asm.LoadMem(asm.R3, asm.R6, 80, asm.Word), // __sk_buff.data_end
		asm.Sub.Reg(asm.R3, asm.R2),
		asm.StoreMem(asm.R0, 0, asm.R3, asm.Word),
		asm.Mov.Imm(asm.R0, -1).WithSymbol("next"), // TCX_NEXT
		asm.Return(),
	}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { prog.Close() })
	return prog, m
}

// TestAcceptorTakesPagedPackets: a packet that completes moat's handshake
// need not be linear. A tap written with a virtio-net header leaves the
// first hdr_len bytes in the skb's linear area and the rest in page
// fragments. Here the packet is the client's first data segment, which
// completes the handshake when the pure third ACK was lost (as a GRO
// packet of several segments also comes): with the headers outside the
// linear area, the acceptor pulls them in; with the payload outside, its
// length is no reason to refuse. Either way the server accepts the
// connection and reads the data. Before, both went to the kernel, which
// found no cookie of its own and reset the connection.
func TestAcceptorTakesPagedPackets(t *testing.T) {
	objs := setup(t)
	payload := make([]byte, 4096) // a page: tun makes shorter writes linear
	for i := range payload {
		payload[i] = byte(i * 7)
	}
	for _, fam := range []struct {
		name           string
		client, server netip.Addr
		l4             int
	}{
		{"ipv4", client4, server4, 14 + 20},
		{"ipv6", client6, server6, 14 + 40},
	} {
		t.Run(fam.name, func(t *testing.T) {
			inScratchNetns(t, func() {
				fd, tap := openTap(t, "moatpaged0")
				for _, a := range []string{server4.String() + "/24", server6.String() + "/64"} {
					addr, err := netlink.ParseAddr(a)
					if err != nil {
						t.Fatal(err)
					}
					addr.Flags = unix.IFA_F_NODAD
					if err := netlink.AddrAdd(tap, addr); err != nil {
						t.Fatalf("address %s: %v", a, err)
					}
				}
				lo, err := netlink.LinkByName("lo")
				if err != nil {
					t.Fatal(err)
				}
				for _, l := range []netlink.Link{lo, tap} {
					if err := netlink.LinkSetUp(l); err != nil {
						t.Fatal(err)
					}
				}
				seen, lens := linearLengths(t)
				for _, p := range []*ebpf.Program{seen, objs.MoatSynAccept} {
					l, err := link.AttachTCX(link.TCXOptions{Interface: tap.Attrs().Index, Program: p, Attach: ebpf.AttachTCXIngress})
					if err != nil {
						t.Fatal(err)
					}
					defer l.Close()
				}
				ln := listen(t, protectedPort)
				defer ln.Close()

				// TCP header with timestamps: 32 bytes.
				headers := fam.l4 + 32
				for i, linearBytes := range []int{14, headers} {
					port := uint16(clientPort + i)
					frame := func(tcp testpkt.TCP) []byte {
						tcp.SrcPort, tcp.DstPort = port, protectedPort
						return testpkt.Frame{SrcMAC: net.HardwareAddr{2, 0, 0, 0, 0, 0x10}, DstMAC: tap.Attrs().HardwareAddr, Net: testpkt.Net(fam.client, fam.server), L4: tcp}.Bytes()
					}
					before := portStatus(t, objs, protectedPort)
					// moat's SYN-ACK, from the XDP program.
					ret, synack := run(t, objs.MoatFilter, frame(testpkt.TCP{SYN: true, Seq: clientISN, Options: []layers.TCPOption{
						testpkt.MSS(1460), testpkt.SACKPermitted(), testpkt.Timestamps(777, 0), testpkt.TCPNOP(), testpkt.WindowScale(7)}}))
					if ret != 3 { // XDP_TX
						t.Fatalf("SYN: verdict %d, want XDP_TX: %+v", ret, portStatus(t, objs, protectedPort))
					}
					cookie := binary.BigEndian.Uint32(synack[fam.l4+4:])
					data := frame(testpkt.TCP{ACK: true, PSH: true, Seq: clientISN + 1, Ack: cookie + 1,
						Options: tsOpts(tsvalOf(synack, fam.l4)), Payload: payload})
					if got := len(data) - len(payload); got != headers {
						t.Fatalf("headers of %d bytes, want %d", got, headers)
					}
					writeNonLinear(t, fd, data, linearBytes)

					if err := ln.(*net.TCPListener).SetDeadline(time.Now().Add(2 * time.Second)); err != nil {
						t.Fatal(err)
					}
					c, err := ln.Accept()
					after := portStatus(t, objs, protectedPort)
					var linear uint32
					if err := lens.Lookup(uint32(0), &linear); err != nil {
						t.Fatal(err)
					}
					if int(linear) != linearBytes {
						t.Fatalf("the packet reached tc with %d of its %d bytes linear, want %d", linear, len(data), linearBytes)
					}
					if err != nil {
						t.Fatalf("%d bytes linear: nothing accepted (%v): %+v", linearBytes, err, after)
					}
					defer c.Close()
					want := netip.AddrPortFrom(fam.client, port)
					if got := c.RemoteAddr().(*net.TCPAddr).AddrPort(); netip.AddrPortFrom(got.Addr().Unmap(), got.Port()) != want {
						t.Errorf("accepted a connection from %v, want %v", got, want)
					}
					if after.CookiesAccepted != before.CookiesAccepted+1 || after.AcceptErrors != before.AcceptErrors {
						t.Errorf("cookies accepted %d->%d, accept errors %d->%d",
							before.CookiesAccepted, after.CookiesAccepted, before.AcceptErrors, after.AcceptErrors)
					}
					got := make([]byte, len(payload))
					c.SetReadDeadline(time.Now().Add(2 * time.Second))
					if _, err := io.ReadFull(c, got); err != nil {
						t.Fatalf("%d bytes linear: read the client's data: %v", linearBytes, err)
					}
					if !bytes.Equal(got, payload) {
						t.Errorf("%d bytes linear: the server read other data than the client sent", linearBytes)
					}
				}
			})
		})
	}
}
