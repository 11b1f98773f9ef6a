package rules

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"
)

// MaxCommentLen is the longest comment the data path's comment map stores
// (COMMENT_LEN less the terminating NUL).
const MaxCommentLen = 63

// MaxFileSize is the most of a rule file that moat reads: input without
// end (/dev/zero, a pipe that never closes) would otherwise take all the
// memory there is. It leaves room for what moat's own export writes: a
// million IPv4 deny entries with expiries and hit counts are about 125 MB
// of JSON, a million IPv6 ones about 150 MB, so a deny list of four
// million timed entries still fits. (Feeds, fetched from other hosts,
// take less: feed.MaxSize.)
const MaxFileSize = 1 << 30

// Ruleset is the JSON form of every rule moat holds: what `moat export`
// writes and `moat import` reads.
type Ruleset struct {
	Allow    []PrefixEntry `json:"allow"`
	Deny     []PrefixEntry `json:"deny"`
	Ports    []PortEntry   `json:"ports"`
	Settings *Settings     `json:"settings,omitempty"`
}

// DropExpired removes the allow and deny entries whose time passed before
// now and says how many went.
func (rs *Ruleset) DropExpired(now time.Time) int {
	n := 0
	for _, l := range []*[]PrefixEntry{&rs.Allow, &rs.Deny} {
		before := len(*l)
		*l = slices.DeleteFunc(*l, func(e PrefixEntry) bool { return e.Expires != nil && !e.Expires.After(now) })
		n += before - len(*l)
	}
	return n
}

// PrefixEntry is one allow or deny entry.
type PrefixEntry struct {
	Prefix  netip.Prefix `json:"prefix"`
	Expires *time.Time   `json:"expires,omitempty"`
	Comment string       `json:"comment,omitempty"`
	Hits    uint64       `json:"hits,omitempty"` // written by export, ignored by import
}

// PortEntry is one protocol/port or ICMP type rule.
type PortEntry struct {
	Spec   PortSpec `json:"rule"`
	Action Action   `json:"action"`
	Hits   uint64   `json:"hits,omitempty"`
}

// Settings are the data path's policies for packets that rules cannot
// fully judge.
type Settings struct {
	Fragments string `json:"fragments"` // "pass" or "drop": non-first fragments
	Malformed string `json:"malformed"` // "drop" or "pass"
	// Monitor: every verdict that would drop passes and is counted as
	// monitored, and the SYN defence stands down (a trial of the rules).
	Monitor bool `json:"monitor"`
}

// Validate checks a settings block.
func (s Settings) Validate() error {
	if s.Fragments != "pass" && s.Fragments != "drop" {
		return fmt.Errorf("invalid fragments policy %q: want pass or drop", s.Fragments)
	}
	if s.Malformed != "pass" && s.Malformed != "drop" {
		return fmt.Errorf("invalid malformed policy %q: want drop or pass", s.Malformed)
	}
	return nil
}

func (s PortSpec) MarshalText() ([]byte, error) { return []byte(s.String()), nil }

func (s *PortSpec) UnmarshalText(b []byte) error {
	v, err := ParsePortSpec(string(b))
	if err != nil {
		return err
	}
	*s = v
	return nil
}

func (a Action) MarshalText() ([]byte, error) { return []byte(a.String()), nil }

func (a *Action) UnmarshalText(b []byte) error {
	v, err := ParseAction(string(b))
	if err != nil {
		return err
	}
	*a = v
	return nil
}

// ValidateComment checks that a comment fits the data path's comment map
// and prints as it reads: listings write comments as they are, so a
// control character (an escape sequence, a tab) would act on the terminal
// or the columns.
func ValidateComment(c string) error {
	if len(c) > MaxCommentLen {
		return fmt.Errorf("comment is %d bytes long, at most %d fit", len(c), MaxCommentLen)
	}
	if !utf8.ValidString(c) || strings.ContainsAny(c, "\x00\n") {
		return fmt.Errorf("comment must be one line of UTF-8 text")
	}
	if i := strings.IndexFunc(c, unicode.IsControl); i >= 0 {
		r, _ := utf8.DecodeRuneInString(c[i:])
		return fmt.Errorf("comment holds the control character %U; write printable text", r)
	}
	return nil
}

// Validate checks a whole ruleset: prefixes masked, no duplicates within a
// list, comments that fit, port rules that do not overlap each other.
func (r *Ruleset) Validate() error {
	for _, l := range []struct {
		name    string
		entries []PrefixEntry
	}{{"allow", r.Allow}, {"deny", r.Deny}} {
		// Duplicates are found by sorting, not with a set: for a million
		// entries a map costs a cache miss per entry, several times the
		// sort. The error names the first entry that repeats an earlier one.
		dup := firstRepeat(l.entries)
		for i, e := range l.entries {
			if !e.Prefix.IsValid() {
				return fmt.Errorf("%s entry %d: missing prefix", l.name, i+1)
			}
			if err := checkPrefix(e.Prefix); err != nil {
				return fmt.Errorf("%s entry %d: %v", l.name, i+1, err)
			}
			if i == dup {
				return fmt.Errorf("%s entry %d: %s listed twice", l.name, i+1, e.Prefix)
			}
			if err := ValidateComment(e.Comment); err != nil {
				return fmt.Errorf("%s entry %d (%s): %v", l.name, i+1, e.Prefix, err)
			}
		}
	}
	for i, p := range r.Ports {
		if p.Action != Drop && p.Action != Allow {
			return fmt.Errorf("port rule %d (%s): missing action", i+1, p.Spec)
		}
		for j := 0; j < i; j++ {
			if p.Spec.Overlaps(r.Ports[j].Spec) {
				return fmt.Errorf("port rule %d (%s) overlaps port rule %d (%s)", i+1, p.Spec, j+1, r.Ports[j].Spec)
			}
		}
	}
	if r.Settings != nil {
		if err := r.Settings.Validate(); err != nil {
			return err
		}
	}
	return nil
}

// firstRepeat returns the index of the first entry whose prefix an earlier
// entry has, or -1.
func firstRepeat(entries []PrefixEntry) int {
	type ref struct {
		p netip.Prefix
		i int
	}
	refs := make([]ref, len(entries))
	for i, e := range entries {
		refs[i] = ref{e.Prefix, i}
	}
	slices.SortFunc(refs, func(a, b ref) int {
		// Any order that puts equal prefixes side by side will do; this
		// one skips the masking that Prefix.Compare does on every call.
		if c := a.p.Addr().Compare(b.p.Addr()); c != 0 {
			return c
		}
		if c := a.p.Bits() - b.p.Bits(); c != 0 {
			return c
		}
		return a.i - b.i
	})
	first := -1
	for k := 1; k < len(refs); k++ {
		if refs[k].p == refs[k-1].p && (first < 0 || refs[k].i < first) {
			first = refs[k].i
		}
	}
	return first
}

// ReadRuleset reads a rule file: the JSON that `moat export` writes, or a
// plain list of addresses and CIDRs, one per line, with # or ; comments, as
// ipset and FireHOL netsets ship them. A plain list goes to the list named
// by plainList ("deny" or "allow"). Any bad line fails the whole file, and
// the error names the line.
func ReadRuleset(name string, r io.Reader, plainList string) (*Ruleset, error) {
	data, err := ReadAll(name, r)
	if err != nil {
		return nil, err
	}
	if t := bytes.TrimSpace(data); len(t) > 0 && t[0] == '{' {
		return readJSON(name, data)
	}
	return readPlain(name, data, plainList)
}

// ReadAll reads a rule file whole, up to MaxFileSize bytes. A regular
// file larger than that is refused before a byte of it is read.
func ReadAll(name string, r io.Reader) ([]byte, error) {
	if f, ok := r.(interface{ Stat() (fs.FileInfo, error) }); ok {
		if fi, err := f.Stat(); err == nil && fi.Mode().IsRegular() && fi.Size() > MaxFileSize {
			return nil, tooLarge(name, MaxFileSize)
		}
	}
	return readAll(name, r, MaxFileSize)
}

// readAll is ReadAll for a stream, which says its size only by ending.
func readAll(name string, r io.Reader, max int64) ([]byte, error) {
	data, err := io.ReadAll(io.LimitReader(r, max+1))
	if err != nil {
		return nil, fmt.Errorf("%s: %v", name, err)
	}
	if int64(len(data)) > max {
		return nil, tooLarge(name, max)
	}
	return data, nil
}

func tooLarge(name string, max int64) error {
	return fmt.Errorf("%s: too large: moat reads rule files of up to %d MiB", name, max>>20)
}

func readJSON(name string, data []byte) (*Ruleset, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	var file fileRuleset
	if err := dec.Decode(&file); err != nil {
		// encoding/json reports most errors only once the whole object is
		// read, so its offset names the last line; find the culprit.
		if _, syntax := err.(*json.SyntaxError); !syntax {
			if off, e := locateJSONError(data, reflect.TypeOf(file)); e != nil {
				return nil, fmt.Errorf("%s:%d: %v", name, lineOf(data, off, nil), jsonMessage(e))
			}
		}
		return nil, fmt.Errorf("%s:%d: %v", name, lineOf(data, dec.InputOffset(), err), jsonMessage(err))
	}
	if dec.More() {
		return nil, fmt.Errorf("%s: trailing data after the JSON object", name)
	}
	// encoding/json takes the last of two equal keys (a second "deny"
	// replaces the first): refuse what it would silently drop.
	if off, key := repeatedKey(data); off >= 0 {
		return nil, fmt.Errorf("%s:%d: key %q given twice in one object", name, lineOf(data, int64(off), nil), key)
	}
	rs := Ruleset{Allow: file.Allow.entries(), Deny: file.Deny.entries(), Ports: file.Ports, Settings: file.Settings}
	for i := range rs.Ports {
		rs.Ports[i].Hits = 0
	}
	if err := rs.Validate(); err != nil {
		return nil, fmt.Errorf("%s: %v", name, err)
	}
	return &rs, nil
}

// fileRuleset is Ruleset as a file gives it: prefixes and times are read
// by moat's own parsers, so a bare address is a host as on the command
// line, and errors say what is wrong in the words the command line uses.
type fileRuleset struct {
	Allow    fileEntries `json:"allow"`
	Deny     fileEntries `json:"deny"`
	Ports    []PortEntry `json:"ports"`
	Settings *Settings   `json:"settings,omitempty"`
}

type fileEntries []fileEntry

type fileEntry struct {
	Prefix  filePrefix `json:"prefix"`
	Expires *fileTime  `json:"expires,omitempty"`
	Comment string     `json:"comment,omitempty"`
	Hits    uint64     `json:"hits,omitempty"` // written by export, ignored by import
}

// entries converts, leaving the hits out.
func (fs fileEntries) entries() []PrefixEntry {
	if fs == nil {
		return nil
	}
	out := make([]PrefixEntry, len(fs))
	for i, f := range fs {
		out[i] = PrefixEntry{Prefix: netip.Prefix(f.Prefix), Comment: f.Comment}
		if f.Expires != nil {
			t := time.Time(*f.Expires)
			out[i].Expires = &t
		}
	}
	return out
}

type filePrefix netip.Prefix

func (p *filePrefix) UnmarshalJSON(b []byte) error {
	s, ok := jsonString(b)
	if !ok {
		return fmt.Errorf("invalid prefix %s: want an address or CIDR in quotes, such as \"192.0.2.0/24\"", b)
	}
	v, err := ParsePrefix(s)
	if err != nil {
		return err
	}
	*p = filePrefix(v)
	return nil
}

// fileTime is an expiry as export writes it.
type fileTime time.Time

func (t *fileTime) UnmarshalJSON(b []byte) error {
	s, ok := jsonString(b)
	v, err := time.Parse(time.RFC3339, s)
	if !ok || err != nil {
		return fmt.Errorf("invalid expiry %s: want an RFC 3339 time such as \"2030-01-02T15:04:05Z\"", b)
	}
	*t = fileTime(v)
	return nil
}

// jsonString reads a JSON string value.
func jsonString(b []byte) (string, bool) {
	if len(b) < 2 || b[0] != '"' {
		return "", false
	}
	if bytes.IndexByte(b, '\\') < 0 { // the usual case, without a decoder
		return string(b[1 : len(b)-1]), true
	}
	var s string
	return s, json.Unmarshal(b, &s) == nil
}

// repeatedKey returns the offset of the first key in data that an earlier
// key of the same object matches as encoding/json matches keys to fields
// (without regard to case), and the key; -1 if none does. data must be
// valid JSON.
func repeatedKey(data []byte) (int, string) {
	var objects []bool  // per open value: an object, not an array
	var keys [][][]byte // per depth: the keys of the object open there; reused
	expectKey := false
	for i := 0; i < len(data); i++ {
		switch c := data[i]; c {
		case '{', '[':
			d := len(objects)
			objects = append(objects, c == '{')
			if d == len(keys) {
				keys = append(keys, nil)
			}
			keys[d] = keys[d][:0]
			expectKey = c == '{'
		case '}', ']':
			objects = objects[:len(objects)-1]
			expectKey = false
		case ',':
			expectKey = len(objects) > 0 && objects[len(objects)-1]
		case '"':
			end := i + 1
			for data[end] != '"' {
				if data[end] == '\\' {
					end++
				}
				end++
			}
			if expectKey {
				d := len(objects) - 1
				key := data[i+1 : end]
				if bytes.IndexByte(key, '\\') >= 0 {
					var s string
					json.Unmarshal(data[i:end+1], &s)
					key = []byte(s)
				}
				for _, k := range keys[d] {
					if bytes.EqualFold(k, key) {
						return i, string(key)
					}
				}
				keys[d] = append(keys[d], key)
				expectKey = false
			}
			i = end
		}
	}
	return -1, ""
}

// lineOf finds the line a JSON error refers to.
func lineOf(data []byte, off int64, err error) int {
	switch e := err.(type) {
	case *json.SyntaxError:
		off = e.Offset
	case *json.UnmarshalTypeError:
		off = e.Offset
	}
	if off > int64(len(data)) {
		off = int64(len(data))
	}
	return bytes.Count(data[:off], []byte("\n")) + 1
}

func jsonMessage(err error) string {
	s := err.Error()
	return strings.TrimPrefix(s, "json: ")
}

func readPlain(name string, data []byte, list string) (*Ruleset, error) {
	if list != "deny" && list != "allow" {
		return nil, fmt.Errorf("invalid list %q: want deny or allow", list)
	}
	var entries []PrefixEntry
	seen := make(map[netip.Prefix]bool)
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		if i := strings.IndexAny(line, "#;"); i >= 0 {
			line = line[:i]
		}
		line = strings.TrimSpace(line)
		if line == "" {
			continue
		}
		p, err := ParsePrefix(line)
		if err != nil {
			return nil, fmt.Errorf("%s:%d: %v", name, n, err)
		}
		if seen[p] { // netsets repeat entries now and then; one rule serves
			continue
		}
		seen[p] = true
		entries = append(entries, PrefixEntry{Prefix: p})
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%s: %v", name, err)
	}
	rs := &Ruleset{}
	if list == "deny" {
		rs.Deny = entries
	} else {
		rs.Allow = entries
	}
	return rs, nil
}

// locateJSONError walks data against the shape of t and returns the offset
// and error of the first unknown key or bad value in document order, or a
// nil error if it finds none.
func locateJSONError(data []byte, t reflect.Type) (int64, error) {
	w := jsonWalker{data: data, dec: json.NewDecoder(bytes.NewReader(data))}
	err := w.value(t)
	return w.off, err
}

type jsonWalker struct {
	data []byte
	dec  *json.Decoder
	off  int64 // where the error found lies
}

// next returns the offset where the next token starts.
func (w *jsonWalker) next() int64 {
	off := w.dec.InputOffset()
	for off < int64(len(w.data)) && strings.IndexByte(" \t\r\n,:", w.data[off]) >= 0 {
		off++
	}
	return off
}

var (
	jsonUnmarshalerType = reflect.TypeFor[json.Unmarshaler]()
	textUnmarshalerType = reflect.TypeFor[interface{ UnmarshalText([]byte) error }]()
)

func (w *jsonWalker) value(t reflect.Type) error {
	start := w.next()
	fail := func(err error) error { w.off = start; return err }
	if start < int64(len(w.data)) && w.data[start] == 'n' { // null fits every pointer, slice and map
		var raw json.RawMessage
		if err := w.dec.Decode(&raw); err != nil {
			return fail(err)
		}
		return nil
	}
	pt := reflect.PointerTo(t)
	custom := pt.Implements(jsonUnmarshalerType) || pt.Implements(textUnmarshalerType)
	switch {
	case !custom && t.Kind() == reflect.Pointer:
		return w.value(t.Elem())
	case !custom && t.Kind() == reflect.Struct:
		if tok, err := w.dec.Token(); err != nil || tok != json.Delim('{') {
			return w.leafAfter(start, t, tok, err)
		}
		for w.dec.More() {
			keyStart := w.next()
			tok, err := w.dec.Token()
			if err != nil {
				w.off = keyStart
				return err
			}
			key, _ := tok.(string)
			f, ok := jsonField(t, key)
			if !ok {
				w.off = keyStart
				return fmt.Errorf("unknown field %q", key)
			}
			if err := w.value(f.Type); err != nil {
				return err
			}
		}
		_, err := w.dec.Token()
		return err
	case !custom && t.Kind() == reflect.Slice:
		if tok, err := w.dec.Token(); err != nil || tok != json.Delim('[') {
			return w.leafAfter(start, t, tok, err)
		}
		for w.dec.More() {
			if err := w.value(t.Elem()); err != nil {
				return err
			}
		}
		_, err := w.dec.Token()
		return err
	}
	var raw json.RawMessage
	if err := w.dec.Decode(&raw); err != nil {
		return fail(err)
	}
	if err := json.Unmarshal(raw, reflect.New(t).Interface()); err != nil {
		return fail(err)
	}
	return nil
}

// leafAfter reports a value of the wrong kind where an object or array
// belongs.
func (w *jsonWalker) leafAfter(start int64, t reflect.Type, tok json.Token, err error) error {
	w.off = start
	if err != nil {
		return err
	}
	return fmt.Errorf("cannot unmarshal %v into a value of type %s", tok, t)
}

// jsonField finds the struct field a key decodes into, matching names
// without regard to case as encoding/json does.
func jsonField(t reflect.Type, key string) (reflect.StructField, bool) {
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		if !f.IsExported() {
			continue
		}
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if name == "-" {
			continue
		}
		if name == "" {
			name = f.Name
		}
		if strings.EqualFold(name, key) {
			return f, true
		}
	}
	return reflect.StructField{}, false
}
