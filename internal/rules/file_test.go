package rules

import (
	"encoding/json"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

func TestReadRulesetJSONErrors(t *testing.T) {
	tests := []struct {
		name string
		in   string
		want string // the error must contain this, including FILE:LINE where known
	}{
		{
			name: "unknown top-level key",
			in: `{
  "allow": [],
  "denied": [],
  "ports": []
}`,
			want: `rules.json:3: unknown field "denied"`,
		},
		{
			name: "unknown key in an entry",
			in: `{
  "allow": [],
  "deny": [
    {"prefix": "192.0.2.0/24"},
    {"prefix": "198.51.100.0/24", "coment": "typo"},
    {"prefix": "203.0.113.0/24"}
  ],
  "ports": []
}`,
			want: `rules.json:5: unknown field "coment"`,
		},
		{
			name: "unknown key in an indented entry",
			in: `{
  "deny": [
    {
      "prefix": "192.0.2.0/24",
      "expiry": "2030-01-01T00:00:00Z"
    }
  ]
}`,
			want: `rules.json:5: unknown field "expiry"`,
		},
		{
			name: "bad prefix",
			in: `{
  "deny": [
    {"prefix": "192.0.2.0/24"},
    {"prefix": "192.0.2.0/33"},
    {"prefix": "198.51.100.0/24"}
  ]
}`,
			want: "rules.json:4: ",
		},
		{
			name: "prefix with host bits",
			in:   `{"allow": [{"prefix": "10.1.2.3/8"}]}`,
			want: "rules.json:1: invalid CIDR \"10.1.2.3/8\": host bits set",
		},
		{
			name: "address out of range, in the command line's words",
			in: `{
  "deny": [
    {"prefix": "10.5.0.300/32"}
  ]
}`,
			want: `rules.json:3: invalid CIDR "10.5.0.300/32"`,
		},
		{
			name: "bad bare address",
			in:   `{"deny": [{"prefix": "10.5.0.300"}]}`,
			want: `rules.json:1: invalid address or CIDR "10.5.0.300"`,
		},
		{
			name: "prefix not a string",
			in:   `{"deny": [{"prefix": 10}]}`,
			want: `rules.json:1: invalid prefix 10: want an address or CIDR in quotes`,
		},
		{
			name: "bad expiry",
			in: `{
  "deny": [
    {"prefix": "10.5.0.1/32", "expires": "2030-01-02 15:04"}
  ]
}`,
			want: `rules.json:3: invalid expiry "2030-01-02 15:04": want an RFC 3339 time such as "2030-01-02T15:04:05Z"`,
		},
		{
			name: "expiry not a string",
			in:   `{"deny": [{"prefix": "10.5.0.1/32", "expires": 1893456000}]}`,
			want: `invalid expiry 1893456000: want an RFC 3339 time`,
		},
		{
			name: "list given twice",
			in: `{
  "deny": [{"prefix": "10.5.0.1/32"}],
  "allow": [],
  "deny": [{"prefix": "10.5.0.2/32"}]
}`,
			want: `rules.json:4: key "deny" given twice in one object`,
		},
		{
			name: "list given twice, in other case",
			in:   `{"Deny": [], "deny": []}`,
			want: `rules.json:1: key "deny" given twice in one object`,
		},
		{
			name: "key given twice in an entry",
			in: `{"deny": [
  {"prefix": "10.5.0.1/32"},
  {"prefix": "10.5.0.2/32", "comment": "a",
   "prefix": "10.5.0.3/32"}
]}`,
			want: `rules.json:4: key "prefix" given twice in one object`,
		},
		{
			name: "escaped key given twice",
			in:   `{"settings": {"fragments": "pass", "malformed": "drop", "fr\u0061gments": "drop"}}`,
			want: `key "fragments" given twice in one object`,
		},
		{
			name: "IPv4-mapped prefix",
			in:   `{"deny": [{"prefix": "::ffff:10.0.0.0/104"}]}`,
			want: "IPv4-mapped",
		},
		{
			name: "duplicate entry",
			in:   `{"deny": [{"prefix": "192.0.2.1/32"}, {"prefix": "192.0.2.1/32"}]}`,
			want: "deny entry 2: 192.0.2.1/32 listed twice",
		},
		{
			name: "first of two duplicates named",
			in:   `{"deny": [{"prefix": "198.51.100.0/24"}, {"prefix": "10.0.0.0/8"}, {"prefix": "198.51.100.0/24"}, {"prefix": "10.0.0.0/8"}]}`,
			want: "deny entry 3: 198.51.100.0/24 listed twice",
		},
		{
			name: "bad port rule",
			in: `{
  "ports": [
    {"rule": "udp/19", "action": "drop"},
    {"rule": "udp/70000", "action": "drop"}
  ]
}`,
			want: `rules.json:4: invalid port rule "udp/70000"`,
		},
		{
			name: "bad action",
			in: `{
  "ports": [
    {"rule": "udp/19", "action": "reject"}
  ]
}`,
			want: `rules.json:3: invalid action "reject"`,
		},
		{
			name: "missing action",
			in:   `{"ports": [{"rule": "udp/19"}]}`,
			want: "port rule 1 (udp/19): missing action",
		},
		{
			name: "overlapping port rules",
			in: `{"ports": [
  {"rule": "tcp/6000-6063", "action": "drop"},
  {"rule": "udp/6010", "action": "drop"},
  {"rule": "tcp/6010", "action": "allow"}
]}`,
			want: "port rule 3 (tcp/6010) overlaps port rule 1 (tcp/6000-6063)",
		},
		{
			name: "bad settings",
			in:   `{"settings": {"fragments": "maybe", "malformed": "drop"}}`,
			want: `invalid fragments policy "maybe"`,
		},
		{
			name: "comment too long",
			in:   `{"deny": [{"prefix": "192.0.2.1/32", "comment": "` + strings.Repeat("x", MaxCommentLen+1) + `"}]}`,
			want: "at most 63 fit",
		},
		{
			name: "wrong type",
			in: `{
  "deny": {"prefix": "192.0.2.1/32"}
}`,
			want: "rules.json:2: ",
		},
		{
			name: "syntax error",
			in: `{
  "deny": [
    {"prefix": "192.0.2.1/32"},
  ]
}`,
			want: "rules.json:4: ",
		},
		{
			name: "trailing data",
			in:   `{"deny": []} {"allow": []}`,
			want: "trailing data",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			rs, err := ReadRuleset("rules.json", strings.NewReader(tc.in), "deny")
			if err == nil {
				t.Fatalf("accepted: %+v", rs)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %q does not contain %q", err, tc.want)
			}
			if strings.Contains(err.Error(), "\n") {
				t.Fatalf("error %q spans lines", err)
			}
		})
	}
}

// TestReadRulesetJSONRoundTrip writes a ruleset the way export does and
// reads it back: everything but the hit counters survives.
func TestReadRulesetJSONRoundTrip(t *testing.T) {
	exp := time.Date(2031, 5, 6, 7, 8, 9, 0, time.UTC)
	orig := &Ruleset{
		Allow: []PrefixEntry{
			{Prefix: netip.MustParsePrefix("198.18.1.0/24"), Comment: "office", Hits: 12},
			{Prefix: netip.MustParsePrefix("2001:db8:1::2/128")},
		},
		Deny: []PrefixEntry{
			{Prefix: netip.MustParsePrefix("192.0.2.7/32"), Expires: &exp, Hits: 99},
			{Prefix: netip.MustParsePrefix("10.0.0.0/8"), Comment: "rfc1918 spoofers"},
			{Prefix: netip.MustParsePrefix("2001:db8:f00::/48")},
		},
		Ports: []PortEntry{
			{Spec: PortSpec{UDP, 19, 19}, Action: Drop, Hits: 5},
			{Spec: PortSpec{TCP, 6000, 6063}, Action: Drop},
			{Spec: PortSpec{ICMP, 8, 8}, Action: Drop},
			{Spec: PortSpec{ICMPv6, 128, 128}, Action: Allow},
		},
		Settings: &Settings{Fragments: "drop", Malformed: "pass"},
	}
	data, err := json.MarshalIndent(orig, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	for _, frag := range []string{`"rule": "icmp/echo-request"`, `"action": "drop"`, `"prefix": "10.0.0.0/8"`} {
		if !strings.Contains(string(data), frag) {
			t.Fatalf("export shape lacks %s:\n%s", frag, data)
		}
	}
	got, err := ReadRuleset("export.json", strings.NewReader("\n  "+string(data)), "deny")
	if err != nil {
		t.Fatal(err)
	}
	want := *orig
	want.Allow = append([]PrefixEntry(nil), orig.Allow...)
	want.Deny = append([]PrefixEntry(nil), orig.Deny...)
	want.Ports = append([]PortEntry(nil), orig.Ports...)
	for i := range want.Allow {
		want.Allow[i].Hits = 0
	}
	for i := range want.Deny {
		want.Deny[i].Hits = 0
	}
	for i := range want.Ports {
		want.Ports[i].Hits = 0
	}
	if !reflect.DeepEqual(got, &want) {
		t.Fatalf("round trip:\n got %+v\nwant %+v", got, &want)
	}
}

func TestReadRulesetPlain(t *testing.T) {
	in := "# FireHOL-style netset\r\n" +
		"; generated for a test\n" +
		"\n" +
		"192.0.2.0/24\n" +
		"  198.51.100.7   # a host, with a comment\n" +
		"2001:db8:f00::/48;trailing comment\n" +
		"\t\n" +
		"192.0.2.0/24\n" + // repeated: one rule serves
		"198.51.100.7/32\r\n" + // the same host written as a /32
		"203.0.113.0/24\n"
	for _, list := range []string{"deny", "allow"} {
		rs, err := ReadRuleset("set.netset", strings.NewReader(in), list)
		if err != nil {
			t.Fatal(err)
		}
		got, other := rs.Deny, rs.Allow
		if list == "allow" {
			got, other = rs.Allow, rs.Deny
		}
		var names []string
		for _, e := range got {
			names = append(names, e.Prefix.String())
		}
		want := []string{"192.0.2.0/24", "198.51.100.7/32", "2001:db8:f00::/48", "203.0.113.0/24"}
		if !reflect.DeepEqual(names, want) {
			t.Fatalf("%s list = %v, want %v", list, names, want)
		}
		if len(other) != 0 || len(rs.Ports) != 0 || rs.Settings != nil {
			t.Fatalf("plain list filled more than the %s list: %+v", list, rs)
		}
	}
}

func TestReadRulesetPlainErrors(t *testing.T) {
	tests := []struct {
		name, in, list, want string
	}{
		{"bad line among good ones", "# header\n192.0.2.0/24\n\n198.51.100.0/24\n10.0.0.300\n203.0.113.0/24\n", "deny", "blocklist.txt:5: invalid address"},
		{"host bits", "192.0.2.0/24\n198.51.100.1/24\n", "deny", "blocklist.txt:2: invalid CIDR \"198.51.100.1/24\": host bits set"},
		{"two on one line", "192.0.2.0/24 198.51.100.0/24\n", "allow", "blocklist.txt:1: invalid CIDR"},
		{"zone", "\n\nfe80::1%eth0\n", "deny", "blocklist.txt:3: invalid address \"fe80::1%eth0\": zones"},
		{"bad list name", "192.0.2.0/24\n", "block", `invalid list "block"`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			rs, err := ReadRuleset("blocklist.txt", strings.NewReader(tc.in), tc.list)
			if err == nil {
				t.Fatalf("accepted: %+v", rs)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %q does not contain %q", err, tc.want)
			}
		})
	}
}

func TestReadRulesetEmpty(t *testing.T) {
	for _, in := range []string{"", "\n\n", "# nothing here\n; nor here\n"} {
		rs, err := ReadRuleset("empty", strings.NewReader(in), "deny")
		if err != nil {
			t.Fatalf("%q: %v", in, err)
		}
		if len(rs.Deny)+len(rs.Allow)+len(rs.Ports) != 0 {
			t.Fatalf("%q: got rules %+v", in, rs)
		}
	}
}

func TestValidateComment(t *testing.T) {
	ok := []string{"", "office network", strings.Repeat("é", MaxCommentLen/2)}
	bad := []string{strings.Repeat("x", MaxCommentLen+1), "two\nlines", "nul\x00", "\xff\xfe",
		"\x1b[31mred", "tab\there", "cr\r", "del\x7f", "c1 \u009b"}
	for _, c := range ok {
		if err := ValidateComment(c); err != nil {
			t.Errorf("ValidateComment(%q): %v", c, err)
		}
	}
	for _, c := range bad {
		if err := ValidateComment(c); err == nil {
			t.Errorf("ValidateComment(%q) accepted", c)
		}
	}
}

// TestReadRulesetJSONBareAddress: a prefix without a length is a host, as
// on the command line, in the config and in plain lists; keys repeated in
// different objects are no repetition.
func TestReadRulesetJSONBareAddress(t *testing.T) {
	in := `{
  "deny": [{"prefix": "10.5.0.1"}, {"prefix": "2001:db8::1", "comment": "c"}],
  "allow": [{"prefix": "10.6.0.0/16", "expires": "2031-05-06T07:08:09Z"}],
  "settings": {"fragments": "pass", "malformed": "drop"}
}`
	rs, err := ReadRuleset("rules.json", strings.NewReader(in), "deny")
	if err != nil {
		t.Fatal(err)
	}
	if len(rs.Deny) != 2 || rs.Deny[0].Prefix != netip.MustParsePrefix("10.5.0.1/32") ||
		rs.Deny[1].Prefix != netip.MustParsePrefix("2001:db8::1/128") || rs.Deny[1].Comment != "c" {
		t.Errorf("deny %+v", rs.Deny)
	}
	if len(rs.Allow) != 1 || rs.Allow[0].Expires == nil || !rs.Allow[0].Expires.Equal(time.Date(2031, 5, 6, 7, 8, 9, 0, time.UTC)) {
		t.Errorf("allow %+v", rs.Allow)
	}
}

// endless is an input that never ends (/dev/zero); it counts what was
// read of it.
type endless struct{ n int64 }

func (e *endless) Read(p []byte) (int, error) {
	clear(p)
	e.n += int64(len(p))
	return len(p), nil
}

// TestReadRulesetTooLarge: a rule file is read up to a maximum and no
// further: a stream past it is cut off there and refused, and a regular
// file larger than MaxFileSize is refused before a byte of it is read.
func TestReadRulesetTooLarge(t *testing.T) {
	const max = 1 << 20
	if _, err := readAll("blank", strings.NewReader(strings.Repeat(" ", max-1)+"\n"), max); err != nil {
		t.Errorf("a file of the maximum size: %v", err)
	}
	var in endless
	_, err := readAll("endless", &in, max)
	if want := "endless: too large: moat reads rule files of up to 1 MiB"; err == nil || err.Error() != want {
		t.Errorf("endless input: error %v, want %q", err, want)
	}
	if in.n > max+1 {
		t.Errorf("read %d bytes of an endless input, want at most %d", in.n, max+1)
	}

	name := filepath.Join(t.TempDir(), "huge.netset")
	f, err := os.Create(name)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	// Sparse: it takes no room on disk.
	if err := f.Truncate(MaxFileSize + 1); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadRuleset(name, f, "deny"); err == nil || !strings.Contains(err.Error(), name+": too large") {
		t.Errorf("a file past MaxFileSize: error %v, want it too large", err)
	}
	if off, _ := f.Seek(0, io.SeekCurrent); off != 0 {
		t.Errorf("%d bytes read of a file that is too large", off)
	}
}
