package cli_test

import (
	"bufio"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"fmt"
	"math/big"
	"net"
	"net/netip"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/moat-shield/moat/internal/lab"
	"github.com/moat-shield/moat/internal/syncookie"
)

// tlsServer starts a TLS echo server in the server namespace, on both
// families, with a fresh self-signed certificate; it returns its port.
func (sl *shieldLab) tlsServer() uint16 {
	sl.t.Helper()
	return sl.tlsServerOn(true)
}

// tlsServerOn is tlsServer with Go's default MPTCP listener (mptcp) or a
// plain TCP one.
func (sl *shieldLab) tlsServerOn(mptcp bool) uint16 {
	sl.t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		sl.t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "moat.test"},
		DNSNames: []string{"moat.test"}, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		sl.t.Fatal(err)
	}
	cfg := &tls.Config{Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}}}
	var port uint16
	err = sl.lab.Server.Do(func() error {
		var lc net.ListenConfig
		lc.SetMultipathTCP(mptcp)
		inner, err := lc.Listen(context.Background(), "tcp", "[::]:0")
		if err != nil {
			return err
		}
		ln := tls.NewListener(inner, cfg)
		sl.t.Cleanup(func() { ln.Close() })
		port = uint16(ln.Addr().(*net.TCPAddr).Port)
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				go func() {
					defer c.Close()
					c.SetDeadline(time.Now().Add(10 * time.Second))
					r := bufio.NewReader(c)
					for {
						line, err := r.ReadString('\n')
						if err != nil {
							return
						}
						if _, err := c.Write([]byte(line)); err != nil {
							return
						}
					}
				}()
			}
		}()
		return nil
	})
	if err != nil {
		sl.t.Fatalf("TLS server: %v", err)
	}
	return port
}

// tlsDial makes a TLS connection from h to the server's TLS port; it is
// safe in a goroutine.
func (sl *shieldLab) tlsDial(h *lab.Host, port uint16, timeout time.Duration) (*tls.Conn, error) {
	dst := netip.AddrPortFrom(sl.serverAddr(h, false), port)
	var raw net.Conn
	if err := h.Do(func() (err error) {
		raw, err = net.DialTimeout("tcp", dst.String(), timeout)
		return err
	}); err != nil {
		return nil, err
	}
	c := tls.Client(raw, &tls.Config{ServerName: "moat.test", InsecureSkipVerify: true})
	c.SetDeadline(time.Now().Add(timeout))
	if err := c.Handshake(); err != nil {
		raw.Close()
		return nil, err
	}
	c.SetDeadline(time.Time{})
	return c, nil
}

// handshakes makes TLS handshakes from h one after another for d, or until
// one fails, and returns how many completed.
func (sl *shieldLab) handshakes(h *lab.Host, port uint16, d time.Duration) (ok int, err error) {
	for end := time.Now().Add(d); time.Now().Before(end); {
		c, err := sl.tlsDial(h, port, 500*time.Millisecond)
		if err != nil {
			return ok, err
		}
		c.Close()
		ok++
	}
	return ok, nil
}

// TestLabTLSHandshakeLimit: real TLS clients through veth. A source that
// opens handshakes faster than its +tls-hello limit gets its burst and is
// then blocked, with a reason that names the limit, while a client below
// the limit completes every handshake and an established connection's
// data is not counted against it.
func TestLabTLSHandshakeLimit(t *testing.T) {
	t.Parallel()
	sl := newShieldLab(t)
	toClient, toAttacker := sl.ifaces()
	sl.mustMoat("attach", toClient, toAttacker)
	port := sl.tlsServer()

	// Without the limit the abusive source completes handshakes as fast
	// as it can: the control for what the limit holds back below.
	free, err := sl.handshakes(sl.lab.Attacker, port, 300*time.Millisecond)
	if err != nil || free < 30 {
		t.Fatalf("without a limit the attacker completed %d handshakes in 300 ms (%v): too few to show a limit", free, err)
	}

	const burst = 10
	scope := fmt.Sprintf("tcp/%d+tls-hello", port)
	// A bucket from a source's first packet: the default gate gives one
	// after 4 packets on average at this rate, and charges it 3, so a
	// source would get 7 to about 20 handshakes, not its burst.
	sl.mustMoat("limit", "config", "--gate", "none")
	sl.mustMoat("limit", "add", "source", scope, "--pps", "5", "--burst", fmt.Sprint(burst), "--block", "1m")

	// The client: one long connection that sends 300 lines, and a new
	// handshake every 250 ms (4 a second, under the limit of 5).
	var wg sync.WaitGroup
	var clientErrs []string
	var mu sync.Mutex
	fail := func(format string, a ...any) {
		mu.Lock()
		clientErrs = append(clientErrs, fmt.Sprintf(format, a...))
		mu.Unlock()
	}
	long, err := sl.tlsDial(sl.lab.Client, port, 2*time.Second)
	if err != nil {
		t.Fatalf("client connection: %v", err)
	}
	defer long.Close()
	wg.Add(2)
	go func() {
		defer wg.Done()
		long.SetDeadline(time.Now().Add(10 * time.Second))
		r := bufio.NewReader(long)
		for i := 0; i < 300; i++ {
			line := fmt.Sprintf("line %d\n", i)
			if _, err := long.Write([]byte(line)); err != nil {
				fail("write %d on the established connection: %v", i, err)
				return
			}
			if got, err := r.ReadString('\n'); err != nil || got != line {
				fail("echo %d on the established connection: %q, %v", i, got, err)
				return
			}
		}
	}()
	go func() {
		defer wg.Done()
		for i := 0; i < 8; i++ {
			c, err := sl.tlsDial(sl.lab.Client, port, 2*time.Second)
			if err != nil {
				fail("client handshake %d: %v", i, err)
			} else {
				c.Close()
			}
			time.Sleep(250 * time.Millisecond)
		}
	}()

	got, err := sl.handshakes(sl.lab.Attacker, port, 2*time.Second)
	wg.Wait()
	t.Logf("attacker: %d handshakes without the limit in 300 ms, %d with it before failing (%v)", free, got, err)
	if err == nil {
		t.Fatalf("the attacker made handshakes for 2 s under a limit of %d and 5 a second: %d completed", burst, got)
	}
	// The burst, and a token or two that came back while it was spent.
	if got < burst || got > burst+2 {
		t.Errorf("the attacker completed %d handshakes, want its burst of %d", got, burst)
	}
	if len(clientErrs) > 0 {
		t.Errorf("the client below the limit failed: %s", strings.Join(clientErrs, "; "))
	}

	var reason string
	for _, e := range sl.list().Deny {
		if e.Prefix == netip.PrefixFrom(sl.attackerV4(), 32) {
			reason = e.Comment
		}
	}
	if !strings.Contains(reason, scope) {
		t.Errorf("the attacker's denylist entry has reason %q, want one that names %s", reason, scope)
	}
	if _, err := sl.tlsDial(sl.lab.Attacker, port, 300*time.Millisecond); err == nil {
		t.Error("the blocked attacker completed a handshake")
	}
	st := sl.limitStatus("source " + scope)
	if st.Stats.Blocks != 1 || st.Stats.Dropped < 1 {
		t.Errorf("limit counters %+v: want one block and a drop", st.Stats)
	}
	// Every hello the limit saw is one the two hosts sent: the client's 8
	// and its long connection's one were before or under the limit.
	if min := uint64(got + 8); st.Stats.Passed < min {
		t.Errorf("the limit passed %d hellos, want at least %d", st.Stats.Passed, min)
	}
}

// TestLabTLSHelloOnTheThirdACK: a client that sets TCP_DEFER_ACCEPT on its
// socket sends no pure third ACK: its ClientHello completes the handshake,
// while only a request socket (or, under SYN cookies, the listener) owns
// the tuple. The hello is work for the server all the same, so it must
// count against a +tls-hello limit; it used to count only on an
// established socket, and such a client made every handshake it wanted.
// The request socket of an MPTCP listener (Go's default) is read as a
// plain TCP one. (Under SYN cookies the hello counts when its ACK returns
// a valid cookie: TestTLSHelloOnCookieACK in internal/ratelimit.)
func TestLabTLSHelloOnTheThirdACK(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		mptcp   bool
		cookies bool
	}{
		{"request socket", false, false},
		{"request socket of an MPTCP listener", true, false},
		{"moat's SYN cookie", false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			sl := newShieldLab(t)
			toClient, toAttacker := sl.ifaces()
			sl.mustMoat("attach", toClient, toAttacker)
			port := sl.tlsServerOn(tc.mptcp)
			if tc.cookies {
				// moat's SYN-ACKs leave by XDP_TX, which the client's
				// veth delivers only while it runs an XDP program.
				sl.lab.Client.AttachPassXDPT(t)
				sl.mustMoat("syn", "protect", fmt.Sprintf("tcp/%d", port), "--mode", "always")
			}
			const burst = 3
			sl.mustMoat("limit", "config", "--gate", "none")
			sl.mustMoat("limit", "add", "source", fmt.Sprintf("tcp/%d+tls-hello", port), "--pps", "1", "--burst", fmt.Sprint(burst), "--block", "1m")

			dst := netip.AddrPortFrom(sl.serverAddr(sl.lab.Client, false), port)
			ok := 0
			for i := 0; i < 10; i++ {
				var raw net.Conn
				err := sl.lab.Client.Do(func() (err error) {
					d := net.Dialer{Timeout: 500 * time.Millisecond, Control: func(_, _ string, rc syscall.RawConn) error {
						var serr error
						if err := rc.Control(func(fd uintptr) {
							serr = syscall.SetsockoptInt(int(fd), syscall.IPPROTO_TCP, syscall.TCP_DEFER_ACCEPT, 1)
						}); err != nil {
							return err
						}
						return serr
					}}
					d.SetMultipathTCP(false)
					raw, err = d.Dial("tcp", dst.String())
					return err
				})
				if err != nil {
					t.Logf("connection %d: %v", i, err)
					break
				}
				c := tls.Client(raw, &tls.Config{ServerName: "moat.test", InsecureSkipVerify: true})
				c.SetDeadline(time.Now().Add(500 * time.Millisecond))
				err = c.Handshake()
				raw.Close()
				if err != nil {
					t.Logf("handshake %d: %v", i, err)
					break
				}
				ok++
			}
			if ok == 0 {
				t.Fatal("no handshake completed: the test measures nothing")
			}
			if ok > burst+1 {
				t.Errorf("a client whose hellos ride on the third ACK completed %d handshakes under a burst of %d", ok, burst)
			}
			blocked := false
			for _, e := range sl.list().Deny {
				blocked = blocked || e.Prefix == netip.PrefixFrom(sl.clientV4(), 32)
			}
			if !blocked {
				t.Errorf("the client was not auto-blocked (%d handshakes)", ok)
			}
			if tc.cookies {
				// Every completed handshake must have been one of moat's
				// cookies, or the row measured request sockets again.
				var st struct {
					Ports []syncookie.PortStatus `json:"ports"`
				}
				sl.moatJSON(&st, "syn", "status", "--json")
				if len(st.Ports) != 1 || st.Ports[0].CookiesAccepted < uint64(ok) {
					t.Errorf("%d handshakes, but syn status: %+v", ok, st.Ports)
				}
			}
		})
	}
}
