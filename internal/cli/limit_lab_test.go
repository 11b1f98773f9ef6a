package cli_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/moat-shield/moat/internal/cli"
	"github.com/moat-shield/moat/internal/datapath"
	"github.com/moat-shield/moat/internal/flood"
	"github.com/moat-shield/moat/internal/lab"
	"github.com/moat-shield/moat/internal/ratelimit"
	"github.com/moat-shield/moat/internal/shield"
)

// floodFrom sends cfg from the attacker to the server's attacker-facing
// address.
func (sl *shieldLab) floodFrom(cfg flood.Config) flood.Result {
	sl.t.Helper()
	res, err := sl.floodRun(cfg)
	if err != nil {
		sl.t.Fatalf("flood: %v", err)
	}
	return res
}

// floodRun is floodFrom for goroutines: it returns the error.
func (sl *shieldLab) floodRun(cfg flood.Config) (flood.Result, error) {
	atk := sl.lab.Attacker.Ifaces[0]
	cfg.IfIndex, cfg.DstMAC = atk.Index, atk.PeerMAC
	if !cfg.Dst.IsValid() {
		cfg.Dst = atk.PeerIPv4
	}
	var res flood.Result
	err := sl.lab.Attacker.Do(func() error {
		var err error
		res, err = flood.Run(context.Background(), cfg)
		return err
	})
	return res, err
}

// limitStatus returns the stored limit "KIND SCOPE" with its counters.
func (sl *shieldLab) limitStatus(key string) ratelimit.Status {
	sl.t.Helper()
	var ll cli.LimitList
	sl.moatJSON(&ll, "limit", "list")
	for _, l := range ll.Limits {
		if l.Kind.String()+" "+l.Scope.String() == key {
			return l
		}
	}
	sl.t.Fatalf("no limit %q in %+v", key, ll.Limits)
	return ratelimit.Status{}
}

// sendUDPFrom sends one datagram from h to sink and returns its payload,
// or "" if it could not be sent; safe in a goroutine.
func (sl *shieldLab) sendUDPFrom(h *lab.Host, sink *udpSink) string {
	payload := token(h.Name)
	dst := netip.AddrPortFrom(sl.serverAddr(h, false), sink.port)
	err := h.Do(func() error {
		c, err := net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(dst))
		if err != nil {
			return err
		}
		defer c.Close()
		_, err = c.Write([]byte(payload))
		return err
	})
	if err != nil {
		return ""
	}
	return payload
}

// clientDatagrams has the client send 100 datagrams to sink at 50 a
// second in the background; the function it returns waits for the last
// and tells how many of those sent never arrived.
func (sl *shieldLab) clientDatagrams(sink *udpSink) func() (lost, sent int) {
	var wg sync.WaitGroup
	var legit []string
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; i < 100; i++ {
			legit = append(legit, sl.sendUDPFrom(sl.lab.Client, sink))
			time.Sleep(20 * time.Millisecond)
		}
	}()
	return func() (lost, sent int) {
		wg.Wait()
		for _, p := range legit {
			if !sink.waitFor(p, passWait) {
				lost++
			}
		}
		return lost, len(legit)
	}
}

// denyExpiry reads the deadline (CLOCK_BOOTTIME ns) of a denied host.
func (sl *shieldLab) denyExpiry(a netip.Addr) uint64 {
	sl.t.Helper()
	s, err := shield.Open(sl.root)
	if err != nil {
		sl.t.Fatal(err)
	}
	defer s.Close()
	var v datapath.MoatPrefixRule
	if err := s.Map(datapath.MoatMapDenyV4Hosts).Lookup(datapath.MoatHostV4{Addr: a.As4()}, &v); err != nil {
		sl.t.Fatalf("denylist entry of %v: %v", a, err)
	}
	return v.ExpiresNs
}

func bootNanos(t testing.TB) uint64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_BOOTTIME, &ts); err != nil {
		t.Fatal(err)
	}
	return uint64(ts.Nano())
}

func sleepUntilBoot(t testing.TB, deadline uint64) {
	if now := bootNanos(t); deadline > now {
		time.Sleep(time.Duration(deadline - now))
	}
}

// within says whether got is within frac of want.
func within(got, want, frac float64) bool { return math.Abs(got-want) <= frac*want }

// TestLabLimits: limits enforced on real traffic through veth, with the
// frames of the floods generated in the kernel.
func TestLabLimits(t *testing.T) {
	sl := newShieldLab(t)
	toClient, toAttacker := sl.ifaces()
	sl.mustMoat("attach", toClient, toAttacker)
	udp, udp2 := sl.udp[0], sl.udp[1]

	t.Run("a source is held to its limit while a client below it loses nothing", func(t *testing.T) {
		sl.t = t
		const limit, burst = 2000, 500 // the flood sends in 100 ms slices: the bucket must hold one slice of the rate
		sl.mustMoat("limit", "add", "source", "udp", "--pps", fmt.Sprint(limit), "--burst", fmt.Sprint(burst))
		defer sl.mustMoat("limit", "remove", "source", "udp")

		// The client sends 100 datagrams at 50 per second during the flood.
		lostOf := sl.clientDatagrams(udp)
		res := sl.floodFrom(flood.Config{Kind: flood.KindUDP, Sources: netip.MustParsePrefix("198.19.7.7/32"),
			DstPort: udp.port, Rate: 4 * limit, Duration: 3 * time.Second})
		lost, legit := lostOf()
		if lost > 0 {
			t.Errorf("the client below its limit lost %d of %d datagrams", lost, legit)
		}
		st := sl.limitStatus("source udp")
		attackerPassed := float64(st.Stats.Passed) - float64(legit)
		want := limit*res.Elapsed.Seconds() + burst
		t.Logf("flood sent %d at %.0f pps in %v; limit passed %d (attacker %.0f, want %.0f), dropped %d",
			res.Sent, res.PPS, res.Elapsed, st.Stats.Passed, attackerPassed, want, st.Stats.Dropped)
		if res.PPS < 2*limit {
			t.Fatalf("the flood reached only %.0f pps, not over the limit: nothing to measure", res.PPS)
		}
		if !within(attackerPassed, want, 0.10) {
			t.Errorf("the flooding source got %.0f packets through, want %.0f within 10%%", attackerPassed, want)
		}
		if got := st.Stats.Passed + st.Stats.Dropped; got != res.Sent+uint64(legit) {
			t.Errorf("the limit saw %d packets, the flood and the client sent %d", got, res.Sent+uint64(legit))
		}
	})

	t.Run("a spoofed flood is held to the port budget; TCP on another port is unaffected", func(t *testing.T) {
		sl.t = t
		const budget, burst = 5000, 1000
		scope := fmt.Sprintf("udp/%d", udp2.port)
		sl.mustMoat("limit", "add", "budget", scope, "--pps", fmt.Sprint(budget), "--burst", fmt.Sprint(burst))
		defer sl.mustMoat("limit", "remove", "budget", scope)

		var wg sync.WaitGroup
		var connectErrs []error
		var mu sync.Mutex
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 20; i++ {
				if err := sl.connect(sl.lab.Client, false, time.Second); err != nil {
					mu.Lock()
					connectErrs = append(connectErrs, err)
					mu.Unlock()
				}
				time.Sleep(100 * time.Millisecond)
			}
		}()
		res := sl.floodFrom(flood.Config{Kind: flood.KindUDP, Sources: netip.MustParsePrefix("10.0.0.0/8"),
			DstPort: udp2.port, Rate: 20 * budget, Duration: 3 * time.Second})
		wg.Wait()
		if len(connectErrs) > 0 {
			t.Errorf("%d of 20 TCP connections to port %d failed during the flood: %v", len(connectErrs), sl.tcpPort, connectErrs[0])
		}
		st := sl.limitStatus("budget " + scope)
		want := budget*res.Elapsed.Seconds() + burst
		t.Logf("flood sent %d at %.0f pps from 10.0.0.0/8 in %v; budget passed %d (want %.0f), dropped %d",
			res.Sent, res.PPS, res.Elapsed, st.Stats.Passed, want, st.Stats.Dropped)
		if res.PPS < 4*budget {
			t.Fatalf("the flood reached only %.0f pps: nothing to measure", res.PPS)
		}
		if !within(float64(st.Stats.Passed), want, 0.10) {
			t.Errorf("the budget let %d through, want %.0f within 10%%", st.Stats.Passed, want)
		}
	})

	t.Run("a spoofed QUIC Initial flood is held to its budget; other datagrams to the port pass", func(t *testing.T) {
		sl.t = t
		const budget, burst = 2000, 400
		scope := fmt.Sprintf("udp/%d+quic-initial", udp2.port)
		sl.mustMoat("limit", "add", "budget", scope, "--pps", fmt.Sprint(budget), "--burst", fmt.Sprint(burst))
		defer sl.mustMoat("limit", "remove", "budget", scope)

		lostOf := sl.clientDatagrams(udp2)
		res := sl.floodFrom(flood.Config{Kind: flood.KindQUICInitial, Sources: netip.MustParsePrefix("10.0.0.0/8"),
			DstPort: udp2.port, Rate: 10 * budget, Duration: 2 * time.Second})
		if lost, sent := lostOf(); lost > 0 {
			t.Errorf("%d of %d ordinary datagrams to the port were lost", lost, sent)
		}
		st := sl.limitStatus("budget " + scope)
		want := budget*res.Elapsed.Seconds() + burst
		t.Logf("flood sent %d Initials at %.0f pps in %v; budget passed %d (want %.0f), dropped %d",
			res.Sent, res.PPS, res.Elapsed, st.Stats.Passed, want, st.Stats.Dropped)
		if res.PPS < 4*budget {
			t.Fatalf("the flood reached only %.0f pps: nothing to measure", res.PPS)
		}
		if !within(float64(st.Stats.Passed), want, 0.10) {
			t.Errorf("the budget let %d Initials through, want %.0f within 10%%", st.Stats.Passed, want)
		}
		if got := st.Stats.Passed + st.Stats.Dropped; got != res.Sent {
			t.Errorf("the budget saw %d packets, the flood sent %d Initials (and the client's datagrams are not Initials)", got, res.Sent)
		}
	})

	t.Run("an auto-block expires on time", func(t *testing.T) {
		sl.t = t
		scope := fmt.Sprintf("udp/%d", udp.port)
		sl.mustMoat("limit", "add", "source", scope, "--pps", "100", "--burst", "10", "--block", "2s")
		defer sl.mustMoat("limit", "remove", "source", scope)
		src := netip.MustParsePrefix("198.19.8.8/32")
		sl.floodFrom(flood.Config{Kind: flood.KindUDP, Sources: src, DstPort: udp.port, Rate: 2000, Duration: 300 * time.Millisecond})

		rs := sl.list()
		var comment string
		for _, e := range rs.Deny {
			if e.Prefix == src {
				comment = e.Comment
			}
		}
		if !strings.HasPrefix(comment, "auto-block on ") {
			t.Fatalf("moat list has no auto-block entry for %v: %+v", src, rs.Deny)
		}
		expires := sl.denyExpiry(src.Addr())
		send := func() uint64 { // 3 packets; returns how many the limit passed
			before := sl.limitStatus("source " + scope).Stats.Passed
			sl.floodFrom(flood.Config{Kind: flood.KindUDP, Sources: src, DstPort: udp.port, Count: 3})
			return sl.limitStatus("source "+scope).Stats.Passed - before
		}
		sleepUntilBoot(t, expires-uint64(400*time.Millisecond))
		if n := send(); n != 0 {
			t.Errorf("before the expiry %d packets reached the limit, want the denylist to drop them", n)
		}
		sleepUntilBoot(t, expires+uint64(300*time.Millisecond))
		if n := send(); n != 3 {
			t.Errorf("after the expiry %d of 3 packets passed, want 3", n)
		}
	})

	t.Run("moat top names the heavy hitter in a mix", func(t *testing.T) {
		sl.t = t
		heavy := netip.MustParsePrefix("198.19.9.9/32")
		const heavyPPS = 10000
		errs := make(chan error, 2)
		for _, cfg := range []flood.Config{
			// 20,000 pps spread over 65,536 addresses: a third of a packet
			// per second each.
			{Kind: flood.KindUDP, Sources: netip.MustParsePrefix("198.19.0.0/16"), DstPort: udp2.port, Rate: 20000, Duration: 3 * time.Second},
			{Kind: flood.KindUDP, Sources: heavy, DstPort: udp.port, Rate: heavyPPS, Duration: 3 * time.Second},
		} {
			go func() { _, err := sl.floodRun(cfg); errs <- err }()
		}
		// The client below everyone else.
		for i := 0; i < 5; i++ {
			sl.sendUDPFrom(sl.lab.Client, udp)
		}
		time.Sleep(500 * time.Millisecond)
		r := runMain(sl.root, "top", "--interval", "1500ms", "--count", "1", "--json", "-n", "5")
		for i := 0; i < 2; i++ {
			if err := <-errs; err != nil {
				t.Fatalf("flood: %v", err)
			}
		}
		if r.code != 0 {
			t.Fatalf("moat top: %v", r)
		}
		var rep cli.TopReport
		if err := json.Unmarshal([]byte(r.stdout), &rep); err != nil {
			t.Fatalf("moat top --json: %v\n%s", err, r.stdout)
		}
		t.Logf("moat top: %s", r.stdout)
		if len(rep.Sources) == 0 || rep.Sources[0].Source != heavy {
			t.Fatalf("top source is not %v: %+v", heavy, rep.Sources)
		}
		// Sampling 1 in 64 over 1.5 s: about 230 samples, so the estimate
		// is good to a few tens of percent; the rate cap is bursty too.
		if got := rep.Sources[0].PPS; !within(got, heavyPPS, 0.35) {
			t.Errorf("heavy hitter at %.0f pps, sent at %d", got, heavyPPS)
		}
		if len(rep.Sources) > 1 && rep.Sources[1].PPS > rep.Sources[0].PPS/10 {
			t.Errorf("second source %v at %.0f pps: the mix has one heavy hitter", rep.Sources[1].Source, rep.Sources[1].PPS)
		}
	})
}
