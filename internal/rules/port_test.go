package rules

import (
	"strings"
	"testing"
)

func TestParsePortSpec(t *testing.T) {
	tests := []struct {
		in      string
		want    PortSpec
		errPart string // non-empty: an error mentioning this is expected
	}{
		{in: "udp/19", want: PortSpec{UDP, 19, 19}},
		{in: "tcp/6000-6063", want: PortSpec{TCP, 6000, 6063}},
		{in: "TCP/80", want: PortSpec{TCP, 80, 80}},
		{in: " udp/53 ", want: PortSpec{UDP, 53, 53}},
		{in: "tcp/1-65535", want: PortSpec{TCP, 1, 65535}},
		{in: "udp/65535", want: PortSpec{UDP, 65535, 65535}},
		{in: "tcp/443-443", want: PortSpec{TCP, 443, 443}},
		{in: "icmp/echo-request", want: PortSpec{ICMP, 8, 8}},
		{in: "icmp/Echo-Reply", want: PortSpec{ICMP, 0, 0}},
		{in: "icmp/0", want: PortSpec{ICMP, 0, 0}}, // echo reply is type 0
		{in: "icmp/3-5", want: PortSpec{ICMP, 3, 5}},
		{in: "icmp/255", want: PortSpec{ICMP, 255, 255}},
		{in: "icmpv6/128", want: PortSpec{ICMPv6, 128, 128}},
		{in: "icmp6/echo-request", want: PortSpec{ICMPv6, 128, 128}},
		{in: "ipv6-icmp/neighbor-solicitation", want: PortSpec{ICMPv6, 135, 135}},

		{in: "udp/65536", errPart: "above 65535"},
		{in: "tcp/1-70000", errPart: "above 65535"},
		{in: "tcp/99999999999", errPart: "not a number"},
		{in: "icmp/256", errPart: "above 255"},
		{in: "icmpv6/300", errPart: "above 255"},
		{in: "tcp/0", errPart: "port 0"},
		{in: "udp/0-10", errPart: "port 0"},
		{in: "tcp/90-80", errPart: "ends before it starts"},
		{in: "sctp/80", errPart: `unknown protocol "sctp"`},
		{in: "80", errPart: "want PROTO/PORT"},
		{in: "tcp/", errPart: "want PROTO/PORT"},
		{in: "tcp", errPart: "want PROTO/PORT"},
		{in: "", errPart: "want PROTO/PORT"},
		{in: "tcp/http", errPart: "not a number"},
		{in: "tcp/-80", errPart: "not a number"},
		{in: "tcp/80-", errPart: "not a number"},
		{in: "tcp/+80", errPart: "not a number"},
		{in: "tcp/80-90-100", errPart: "not a number"},
		{in: "icmp/echo-bogus", errPart: "not a number"},
		{in: "tcp/echo-request", errPart: "not a number"}, // ICMP names are not ports
	}
	for _, tc := range tests {
		t.Run(tc.in, func(t *testing.T) {
			got, err := ParsePortSpec(tc.in)
			if tc.errPart != "" {
				if err == nil {
					t.Fatalf("ParsePortSpec(%q) = %+v, want an error", tc.in, got)
				}
				if !strings.Contains(err.Error(), tc.errPart) {
					t.Fatalf("ParsePortSpec(%q) error %q does not mention %q", tc.in, err, tc.errPart)
				}
				return
			}
			if err != nil {
				t.Fatalf("ParsePortSpec(%q): %v", tc.in, err)
			}
			if got != tc.want {
				t.Fatalf("ParsePortSpec(%q) = %+v, want %+v", tc.in, got, tc.want)
			}
			// What String writes, ParsePortSpec must read back the same.
			back, err := ParsePortSpec(got.String())
			if err != nil || back != got {
				t.Fatalf("round trip through %q: %+v, %v", got.String(), back, err)
			}
		})
	}
}

func TestPortSpecString(t *testing.T) {
	for spec, want := range map[PortSpec]string{
		{UDP, 19, 19}:       "udp/19",
		{TCP, 6000, 6063}:   "tcp/6000-6063",
		{ICMP, 8, 8}:        "icmp/echo-request",
		{ICMP, 42, 42}:      "icmp/42",
		{ICMPv6, 128, 128}:  "icmpv6/echo-request",
		{ICMPv6, 0, 255}:    "icmpv6/0-255",
		{ICMPv6, 135, 135}:  "icmpv6/neighbor-solicitation",
		{Class(9), 1, 1}:    "class9/1",
		{ICMP, 3, 3}:        "icmp/destination-unreachable",
		{ICMPv6, 1, 1}:      "icmpv6/destination-unreachable",
		{UDP, 65535, 65535}: "udp/65535",
	} {
		if got := spec.String(); got != want {
			t.Errorf("%+v.String() = %q, want %q", spec, got, want)
		}
	}
}

func TestPortSpecOverlaps(t *testing.T) {
	tests := []struct {
		a, b string
		want bool
	}{
		{"tcp/80", "tcp/80", true},
		{"tcp/80", "udp/80", false},
		{"tcp/6000-6063", "tcp/6063", true},
		{"tcp/6000-6063", "tcp/5990-6000", true},
		{"tcp/6000-6063", "tcp/6064-7000", false},
		{"tcp/6000-6063", "tcp/5000-5999", false},
		{"tcp/1-65535", "tcp/443", true},
		{"icmp/echo-request", "icmp/8", true},
		{"icmp/echo-request", "icmpv6/8", false},
	}
	for _, tc := range tests {
		a, b := mustSpec(t, tc.a), mustSpec(t, tc.b)
		if got := a.Overlaps(b); got != tc.want {
			t.Errorf("%s overlaps %s = %v, want %v", tc.a, tc.b, got, tc.want)
		}
		if got := b.Overlaps(a); got != tc.want {
			t.Errorf("%s overlaps %s = %v, want %v (not symmetric)", tc.b, tc.a, got, tc.want)
		}
	}
}

func TestParseAction(t *testing.T) {
	for in, want := range map[string]Action{"drop": Drop, "allow": Allow} {
		if got, err := ParseAction(in); err != nil || got != want {
			t.Errorf("ParseAction(%q) = %v, %v", in, got, err)
		}
	}
	for _, in := range []string{"", "Drop", "deny", "pass"} {
		if _, err := ParseAction(in); err == nil {
			t.Errorf("ParseAction(%q) accepted", in)
		}
	}
}

func mustSpec(t *testing.T, s string) PortSpec {
	t.Helper()
	p, err := ParsePortSpec(s)
	if err != nil {
		t.Fatal(err)
	}
	return p
}
