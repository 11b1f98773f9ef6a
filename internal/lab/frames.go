package lab

import (
	"testing"
	"time"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"
	"golang.org/x/sys/unix"
)

// RawSender returns a function that transmits whole Ethernet frames on
// h's first interface with AF_PACKET, to the peer's MAC address, as built:
// the kernel neither routes nor checks them. The socket is closed when the
// test ends.
func (h *Host) RawSender(tb testing.TB) func(frame []byte) {
	tb.Helper()
	ifc := h.Ifaces[0]
	var fd int
	if err := h.Do(func() (err error) {
		fd, err = unix.Socket(unix.AF_PACKET, unix.SOCK_RAW, 0)
		return err
	}); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { unix.Close(fd) })
	sa := &unix.SockaddrLinklayer{Ifindex: ifc.Index, Halen: 6}
	copy(sa.Addr[:], ifc.PeerMAC)
	return func(frame []byte) {
		for {
			err := unix.Sendto(fd, frame, 0, sa)
			if err == unix.ENOBUFS || err == unix.EAGAIN {
				time.Sleep(time.Millisecond)
				continue
			}
			if err != nil {
				tb.Fatalf("send: %v", err)
			}
			return
		}
	}
}

// SynAckCatcher reads, on h's first interface, the frames that come in,
// and returns a function that waits (up to 5 s) for the next TCP SYN-ACK
// to port. With RawSender it answers what a server sent in reply to a
// hand-made SYN, such as the kernel's SYN cookie, without a socket on h
// taking part. The socket is closed when the test ends.
func (h *Host) SynAckCatcher(tb testing.TB) func(port uint16) *layers.TCP {
	tb.Helper()
	var fd int
	if err := h.Do(func() (err error) {
		fd, err = unix.Socket(unix.AF_PACKET, unix.SOCK_RAW, int(htons(unix.ETH_P_ALL)))
		if err != nil {
			return err
		}
		return unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_ALL), Ifindex: h.Ifaces[0].Index})
	}); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { unix.Close(fd) })
	tv := unix.NsecToTimeval(int64(100 * time.Millisecond))
	if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
		tb.Fatal(err)
	}
	return func(port uint16) *layers.TCP {
		buf := make([]byte, 2048)
		for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); {
			n, from, err := unix.Recvfrom(fd, buf, 0)
			if err != nil {
				continue
			}
			if ll, ok := from.(*unix.SockaddrLinklayer); ok && ll.Pkttype == unix.PACKET_OUTGOING {
				continue
			}
			pkt := gopacket.NewPacket(buf[:n], layers.LayerTypeEthernet, gopacket.Default)
			if tcp, ok := pkt.Layer(layers.LayerTypeTCP).(*layers.TCP); ok && tcp.SYN && tcp.ACK && uint16(tcp.DstPort) == port {
				return tcp
			}
		}
		tb.Fatalf("no SYN-ACK to port %d", port)
		return nil
	}
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }
