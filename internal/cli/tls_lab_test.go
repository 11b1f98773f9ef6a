package cli_test

import (
	"bufio"
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
	"testing"
	"time"

	"github.com/moat-shield/moat/internal/lab"
)

// tlsServer starts a TLS echo server in the server namespace, on both
// families, with a fresh self-signed certificate; it returns its port.
func (sl *shieldLab) tlsServer() uint16 {
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
		ln, err := tls.Listen("tcp", "[::]:0", cfg)
		if err != nil {
			return err
		}
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
