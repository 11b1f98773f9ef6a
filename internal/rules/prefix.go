// Package rules parses and validates what users write: prefixes, port and
// ICMP type specs, and rule files. Nothing here touches the kernel, so every
// input can be checked completely before any map is changed.
package rules

import (
	"fmt"
	"net/netip"
	"strings"
)

// ParsePrefix reads an IPv4 or IPv6 address or CIDR. A bare address is a
// host prefix (/32 or /128). Host bits set below the prefix length are an
// error rather than silently cleared: "10.1.2.3/8" is usually a typo.
// IPv4-mapped IPv6 addresses are refused because packets never carry them
// as sources; the plain IPv4 form is what matches.
func ParsePrefix(s string) (netip.Prefix, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return netip.Prefix{}, fmt.Errorf("empty prefix")
	}
	if !strings.Contains(s, "/") {
		a, err := netip.ParseAddr(s)
		if err != nil {
			return netip.Prefix{}, fmt.Errorf("invalid address or CIDR %q", s)
		}
		if a.Zone() != "" {
			return netip.Prefix{}, fmt.Errorf("invalid address %q: zones are not allowed", s)
		}
		if a.Is4In6() {
			return netip.Prefix{}, fmt.Errorf("invalid address %q: write IPv4-mapped addresses as plain IPv4", s)
		}
		return netip.PrefixFrom(a, a.BitLen()), nil
	}
	p, err := netip.ParsePrefix(s)
	if err != nil {
		return netip.Prefix{}, fmt.Errorf("invalid CIDR %q", s)
	}
	if p.Addr().Is4In6() {
		return netip.Prefix{}, fmt.Errorf("invalid CIDR %q: write IPv4-mapped prefixes as plain IPv4", s)
	}
	if p.Masked() != p {
		return netip.Prefix{}, fmt.Errorf("invalid CIDR %q: host bits set (did you mean %s?)", s, p.Masked())
	}
	return p, nil
}

// checkPrefix accepts p when ParsePrefix accepts its text form, without
// formatting and parsing it again.
func checkPrefix(p netip.Prefix) error {
	if p.Addr().Is4In6() || p.Addr().Zone() != "" || p.Masked() != p {
		_, err := ParsePrefix(p.String())
		if err == nil {
			err = fmt.Errorf("invalid prefix %s", p)
		}
		return err
	}
	return nil
}

// ParsePrefixes parses every argument, failing on the first bad one and
// on duplicates.
func ParsePrefixes(args []string) ([]netip.Prefix, error) {
	out := make([]netip.Prefix, 0, len(args))
	seen := make(map[netip.Prefix]bool, len(args))
	for _, a := range args {
		p, err := ParsePrefix(a)
		if err != nil {
			return nil, err
		}
		if seen[p] {
			return nil, fmt.Errorf("prefix %s given twice", p)
		}
		seen[p] = true
		out = append(out, p)
	}
	return out, nil
}

// IsHost tells whether p names a single address; hosts are stored in hash
// maps, shorter prefixes in longest-prefix-match tries.
func IsHost(p netip.Prefix) bool {
	return p.Bits() == p.Addr().BitLen()
}

// ComparePrefixes orders prefixes by first address, then length (wider
// first): the order in which rule lists are sorted and compared.
func ComparePrefixes(a, b netip.Prefix) int {
	if c := a.Addr().Compare(b.Addr()); c != 0 {
		return c
	}
	return a.Bits() - b.Bits()
}
