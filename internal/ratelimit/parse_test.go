package ratelimit

import (
	"strings"
	"testing"
	"time"

	"github.com/moat-shield/moat/internal/rules"
)

func TestParseScope(t *testing.T) {
	for _, c := range []struct {
		in, want string
		err      string
	}{
		{"all", "all", ""},
		{"UDP", "udp", ""},
		{"udp/53", "udp/53", ""},
		{"tcp/6000-6063", "tcp/6000-6063", ""},
		{"tcp/443+syn", "tcp/443+syn", ""},
		{"tcp+syn", "tcp+syn", ""},
		{"tcp/443+TLS-hello", "tcp/443+tls-hello", ""},
		{"tcp+tls-hello", "tcp+tls-hello", ""},
		{"udp/443+tls-hello", "", "TCP scopes only"},
		{"all+tls-hello", "", "TCP scopes only"},
		{"tcp/443+syn+tls-hello", "", "one qualifier at most"},
		{"tcp/443+tls-hello+syn", "", "one qualifier at most"},
		{"tcp/443+", "", "one qualifier at most"},
		{"udp/443+quic-initial", "udp/443+quic-initial", ""},
		{"udp+QUIC-initial", "udp+quic-initial", ""},
		{"tcp/443+quic-initial", "", "UDP scopes only"},
		{"all+quic-initial", "", "UDP scopes only"},
		{"udp/443+syn", "", "TCP scopes only"},
		{"icmp/echo-request", "icmp/echo-request", ""},
		{"icmpv6", "icmpv6", ""},
		{"udp/53+syn", "", "TCP scopes only"},
		{"all+syn", "", "TCP scopes only"},
		{"sctp/9", "", "invalid scope"},
		{"udp/70000", "", "invalid scope"},
		{"", "", "invalid scope"},
	} {
		s, err := ParseScope(c.in)
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("ParseScope(%q) = %v, %v; want error with %q", c.in, s, err, c.err)
			}
			continue
		}
		if err != nil || s.String() != c.want {
			t.Errorf("ParseScope(%q) = %q, %v; want %q", c.in, s, err, c.want)
		}
	}
}

func TestOverlaps(t *testing.T) {
	p := func(s string) Scope {
		sc, err := ParseScope(s)
		if err != nil {
			t.Fatal(err)
		}
		return sc
	}
	for _, c := range []struct {
		a, b string
		want bool
	}{
		{"all", "all", true},
		{"all", "udp", false}, // different slots: the more specific wins
		{"udp", "udp/53", false},
		{"udp/50-60", "udp/60-70", true},
		{"udp/50-60", "udp/61-70", false},
		{"tcp/80", "tcp/80+syn", true}, // one slot per port
		{"tcp/443+syn", "tcp/443+tls-hello", true},
		{"tcp/443+tls-hello", "tcp+tls-hello", false},
		{"tcp/80", "udp/80", false},
	} {
		if got := p(c.a).Overlaps(p(c.b)); got != c.want {
			t.Errorf("%s overlaps %s = %v, want %v", c.a, c.b, got, c.want)
		}
	}
}

func TestValidate(t *testing.T) {
	udp := Scope{Class: rules.UDP, WholeClass: true}
	for _, c := range []struct {
		name string
		l    Limit
		err  string
	}{
		{"no rate", Limit{Kind: Source, Scope: udp}, "give a rate"},
		{"no kind", Limit{Scope: udp, PPS: 1}, "kind"},
		{"budget block", Limit{Kind: Budget, Scope: udp, PPS: 1, Block: Duration(time.Second)}, "source limits"},
		{"budget prefix", Limit{Kind: Budget, Scope: udp, PPS: 1, IPv6Prefix: 48}, "source limits"},
		{"burst without rate", Limit{Kind: Source, Scope: udp, BPS: 1e6, BurstPackets: 5}, "burst needs"},
		{"tiny byte burst", Limit{Kind: Source, Scope: udp, BPS: 1e6, BurstBytes: 100}, "below one"},
		{"slow bps", Limit{Kind: Source, Scope: udp, BPS: 100}, "below 8000"},
		{"prefix", Limit{Kind: Source, Scope: udp, PPS: 1, IPv6Prefix: 129}, "out of"},
		{"negative block", Limit{Kind: Source, Scope: udp, PPS: 1, Block: -1}, "negative"},
	} {
		if err := c.l.Validate(); err == nil || !strings.Contains(err.Error(), c.err) {
			t.Errorf("%s: %v, want error with %q", c.name, err, c.err)
		}
	}
	l := Limit{Kind: Source, Scope: udp, PPS: 5000, BPS: 80e6}
	if err := l.Validate(); err != nil {
		t.Fatal(err)
	}
	if l.BurstPackets != 500 || l.BurstBytes != 1e6 || l.IPv6Prefix != 64 {
		t.Errorf("defaults: %+v", l)
	}
}

// The data path's form reads back as what was written.
func TestRuleRoundTrip(t *testing.T) {
	for _, l := range []Limit{
		{Kind: Source, Scope: Scope{All: true}, PPS: 3_000_000, BurstPackets: 7, IPv6Prefix: 56, Block: Duration(90 * time.Second)},
		{Kind: Budget, Scope: Scope{Class: rules.TCP, From: 443, To: 443, Only: SYNs}, PPS: 20000, BurstPackets: 2000},
		{Kind: Budget, Scope: Scope{Class: rules.UDP, From: 1000, To: 2000}, BPS: 1_000_000_000, BurstBytes: 12_500_000},
		{Kind: Source, Scope: Scope{Class: rules.ICMP, WholeClass: true}, PPS: 10, BurstPackets: 1, BPS: 64000, BurstBytes: 1518, IPv6Prefix: 64},
	} {
		got := limitOf(l.ruleValue())
		if got != l {
			t.Errorf("round trip:\n got %+v\nwant %+v", got, l)
		}
	}
}

func TestTrackPackets(t *testing.T) {
	for _, c := range []struct {
		l    Limit
		want uint32
	}{
		{Limit{PPS: 1e6, BurstPackets: 1e5}, 64},
		{Limit{PPS: 1000, BurstPackets: 50}, 32},
		{Limit{PPS: 10, BurstPackets: 1}, 1},
		{Limit{PPS: 3, BurstPackets: 100}, 2},
		{Limit{BPS: 1e9, BurstBytes: 1518 * 5}, 4},
	} {
		if got := trackPackets(c.l); got != c.want {
			t.Errorf("trackPackets(%+v) = %d, want %d", c.l, got, c.want)
		}
	}
}
