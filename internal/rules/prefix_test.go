package rules

import (
	"net/netip"
	"strings"
	"testing"
)

func TestParsePrefix(t *testing.T) {
	tests := []struct {
		in      string
		want    string // the prefix, or "" for an error
		errPart string // a piece of the error message
	}{
		{in: "198.18.0.0/15", want: "198.18.0.0/15"},
		{in: "10.0.0.0/8", want: "10.0.0.0/8"},
		{in: "0.0.0.0/0", want: "0.0.0.0/0"},
		{in: "192.0.2.7", want: "192.0.2.7/32"},
		{in: "192.0.2.7/32", want: "192.0.2.7/32"},
		{in: "  192.0.2.7 \t", want: "192.0.2.7/32"},
		{in: "2001:db8::/32", want: "2001:db8::/32"},
		{in: "2001:db8::1", want: "2001:db8::1/128"},
		{in: "2001:DB8::1", want: "2001:db8::1/128"},
		{in: "::/0", want: "::/0"},

		{in: "10.1.2.3/8", errPart: "host bits set (did you mean 10.0.0.0/8?)"},
		{in: "2001:db8::1/32", errPart: "host bits set (did you mean 2001:db8::/32?)"},
		{in: "fe80::1%eth0", errPart: "zones are not allowed"},
		{in: "fe80::1%eth0/64", errPart: "invalid CIDR"},
		{in: "::ffff:192.0.2.7", errPart: "IPv4-mapped"},
		{in: "::ffff:192.0.2.0/120", errPart: "IPv4-mapped"},
		{in: "10.0.0.0/33", errPart: "invalid CIDR"},
		{in: "2001:db8::/129", errPart: "invalid CIDR"},
		{in: "10.0.0.0/-1", errPart: "invalid CIDR"},
		{in: "10.0.0.0/", errPart: "invalid CIDR"},
		{in: "256.0.0.1", errPart: "invalid address"},
		{in: "010.0.0.1", errPart: "invalid address"},
		{in: "10.0.0", errPart: "invalid address"},
		{in: "example.com", errPart: "invalid address"},
		{in: "10.0.0.1-10.0.0.9", errPart: "invalid address"},
		{in: "", errPart: "empty prefix"},
		{in: "   ", errPart: "empty prefix"},
	}
	for _, tc := range tests {
		t.Run(tc.in, func(t *testing.T) {
			got, err := ParsePrefix(tc.in)
			if tc.want == "" {
				if err == nil {
					t.Fatalf("ParsePrefix(%q) = %s, want an error", tc.in, got)
				}
				if !strings.Contains(err.Error(), tc.errPart) {
					t.Fatalf("ParsePrefix(%q) error %q does not mention %q", tc.in, err, tc.errPart)
				}
				return
			}
			if err != nil {
				t.Fatalf("ParsePrefix(%q): %v", tc.in, err)
			}
			if got != netip.MustParsePrefix(tc.want) {
				t.Fatalf("ParsePrefix(%q) = %s, want %s", tc.in, got, tc.want)
			}
		})
	}
}

func TestParsePrefixesRefusesDuplicates(t *testing.T) {
	// A bare host and its /32 are the same rule.
	if _, err := ParsePrefixes([]string{"192.0.2.7", "10.0.0.0/8", "192.0.2.7/32"}); err == nil ||
		!strings.Contains(err.Error(), "given twice") {
		t.Fatalf("duplicate host: err = %v, want 'given twice'", err)
	}
	if _, err := ParsePrefixes([]string{"10.0.0.0/8", "nonsense"}); err == nil {
		t.Fatal("a bad second prefix was accepted")
	}
	got, err := ParsePrefixes([]string{"192.0.2.7", "2001:db8::/48"})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0].Bits() != 32 || got[1].Bits() != 48 {
		t.Fatalf("ParsePrefixes = %v", got)
	}
}

func TestIsHost(t *testing.T) {
	for in, want := range map[string]bool{
		"192.0.2.7/32": true, "192.0.2.6/31": false, "2001:db8::1/128": true, "2001:db8::/127": false,
	} {
		if got := IsHost(netip.MustParsePrefix(in)); got != want {
			t.Errorf("IsHost(%s) = %v, want %v", in, got, want)
		}
	}
}
