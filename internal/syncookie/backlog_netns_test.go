package syncookie

import (
	"errors"
	"io"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/moat-shield/moat/internal/lab"
)

// TestFullAcceptQueueResetsNobody: when a listener's accept queue is full,
// the stack drops the connection a cookie ACK's request socket would make,
// and the client, which took the handshake for done, sends its request
// again until the server accepts. The request right behind the ACK must
// not reach the listener bare, which answers it with a RST: every client
// gets through once the server accepts. Cookies that came while the queue
// was full count apart from those accepted.
func TestFullAcceptQueueResetsNobody(t *testing.T) {
	// The queue of a backlog of n takes n+1 connections.
	const clients, queued = 12, 2
	s := newShielded(t, ModeAlways)
	var lfd int
	if err := s.lab.Server.Do(func() (err error) {
		// Dual-stack, as most servers listen: IPv4 clients reach it.
		if lfd, err = unix.Socket(unix.AF_INET6, unix.SOCK_STREAM, 0); err != nil {
			return err
		}
		if err = unix.SetsockoptInt(lfd, unix.IPPROTO_IPV6, unix.IPV6_V6ONLY, 0); err != nil {
			return err
		}
		if err = unix.SetsockoptInt(lfd, unix.SOL_SOCKET, unix.SO_REUSEADDR, 1); err != nil {
			return err
		}
		if err = unix.Bind(lfd, &unix.SockaddrInet6{Port: labPort}); err != nil {
			return err
		}
		return unix.Listen(lfd, queued-1) // never accepted yet
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(lfd) })
	// Blocking sockets: the request leaves right behind the third ACK, as
	// from most clients, and lands in the same poll.
	var cfds []int
	t.Cleanup(func() {
		for _, fd := range cfds {
			unix.Close(fd)
		}
	})
	server := &unix.SockaddrInet4{Port: labPort, Addr: s.lab.Client.Ifaces[0].PeerIPv4.As4()}
	if err := s.lab.Client.Do(func() error {
		for range clients {
			fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM, 0)
			if err != nil {
				return err
			}
			cfds = append(cfds, fd)
			if err := unix.Connect(fd, server); err != nil {
				return err
			}
			if _, err := unix.Write(fd, []byte("hello")); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	// A client that the server reset is closed by now.
	time.Sleep(300 * time.Millisecond)
	for i, fd := range cfds {
		info, err := unix.GetsockoptTCPInfo(fd, unix.IPPROTO_TCP, unix.TCP_INFO)
		if err == nil && info.State == unix.BPF_TCP_CLOSE {
			t.Errorf("client %d: reset by the server while its accept queue was full", i)
		}
	}
	// Two connections fit the queue of a backlog of 1; the other clients'
	// ACKs and requests, sent again while it stays full, made none.
	full := s.status(t)
	if full.CookiesAccepted != queued || full.AcceptQueueFull < clients-queued {
		t.Errorf("accept queue full: %d cookies accepted and %d while full, want %d and at least %d",
			full.CookiesAccepted, full.AcceptQueueFull, queued, clients-queued)
	}
	// The server accepts only now, and reads each connection's request.
	got := make(chan error, clients)
	go func() {
		for range clients {
			fd, _, err := unix.Accept(lfd)
			if err != nil {
				got <- err
				return
			}
			go func() {
				defer unix.Close(fd)
				b := make([]byte, 5)
				n, err := unix.Read(fd, b)
				if err == nil && n != 5 {
					err = io.ErrUnexpectedEOF
				}
				unix.Write(fd, b[:max(n, 0)])
				got <- err
			}()
		}
	}()
	// Each client hears its request echoed: a reset one fails here.
	for i, fd := range cfds {
		tv := unix.NsecToTimeval(int64(10 * time.Second))
		unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv)
		b := make([]byte, 5)
		if n, err := unix.Read(fd, b); err != nil || n != 5 {
			if !errors.Is(err, syscall.ECONNRESET) { // reported above
				t.Errorf("client %d: read %d bytes: %v", i, n, err)
			}
		}
	}
	// Every cookie handed over made a connection or a listen overflow.
	// tc sees a whole receive batch before the stack takes any of it in,
	// so when several clients' segments come in one, those that found
	// room in the queue when tc looked can still overflow it: the split
	// is exact for segments that come one at a time (above), the sum
	// always.
	end := s.status(t)
	var kernel map[string]uint64
	if err := s.lab.Server.Do(func() (err error) { kernel, err = lab.NetCounters(); return err }); err != nil {
		t.Fatal(err)
	}
	made, overflows := kernel["Tcp.PassiveOpens"], kernel["TcpExt.ListenOverflows"]
	if made != clients || end.CookiesAccepted+end.AcceptQueueFull != made+overflows {
		t.Errorf("%d cookies accepted and %d while the queue was full; the kernel made %d connections (want %d) and overflowed %d times",
			end.CookiesAccepted, end.AcceptQueueFull, made, clients, overflows)
	}
	t.Logf("syn status: %+v", end)
}
