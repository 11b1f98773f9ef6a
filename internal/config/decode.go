package config

import (
	"errors"
	"fmt"
	"reflect"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	"gopkg.in/yaml.v3"
)

// Error is one problem in a config file, at the line (and column) of the
// value or key that causes it.
type Error struct {
	Line, Column int
	Msg          string
}

func (e Error) Error() string {
	if e.Line == 0 {
		return e.Msg
	}
	return fmt.Sprintf("line %d: %s", e.Line, e.Msg)
}

// Errors is every problem found in a config file, in line order.
type Errors struct {
	File string
	List []Error
}

func (e *Errors) Error() string {
	var b strings.Builder
	for i, x := range e.List {
		if i > 0 {
			b.WriteByte('\n')
		}
		if x.Line > 0 {
			fmt.Fprintf(&b, "%s:%d: %s", e.File, x.Line, x.Msg)
		} else {
			fmt.Fprintf(&b, "%s: %s", e.File, x.Msg)
		}
	}
	return b.String()
}

// errs collects errors while a document is decoded, so that one run of
// check-config reports all of them rather than the first.
type errs struct {
	list  []Error
	lines map[string]int // line of every value decoded, by path
}

// reported tells whether an error was reported at line already.
func (e *errs) reported(line int) bool {
	for _, x := range e.list {
		if x.Line == line {
			return true
		}
	}
	return false
}

// lineOf is the line of the value at path ("syn.rotate_every"), or of the
// nearest enclosing value that was in the file.
func (e *errs) lineOf(path string) int {
	for path != "" {
		if l, ok := e.lines[path]; ok {
			return l
		}
		i := strings.LastIndexAny(path, ".[")
		if i < 0 {
			break
		}
		path = path[:i]
	}
	return 0
}

func (e *errs) at(n *yaml.Node, format string, args ...any) {
	line, col := 0, 0
	if n != nil {
		line, col = n.Line, n.Column
	}
	e.list = append(e.list, Error{Line: line, Column: col, Msg: fmt.Sprintf(format, args...)})
}

func (e *errs) result(file string) error {
	if len(e.list) == 0 {
		return nil
	}
	sort.SliceStable(e.list, func(i, j int) bool { return e.list[i].Line < e.list[j].Line })
	return &Errors{File: file, List: e.list}
}

// yamlLine finds the line in a parser error of yaml.v3 ("yaml: line 4:
// did not find expected key"), which has no structured form.
var yamlLine = regexp.MustCompile(`^yaml: line (\d+): `)

func syntaxError(err error) Error {
	msg := err.Error()
	if m := yamlLine.FindStringSubmatch(msg); m != nil {
		n, _ := strconv.Atoi(m[1])
		return Error{Line: n, Msg: "syntax error: " + strings.TrimPrefix(msg, m[0])}
	}
	return Error{Msg: "syntax error: " + strings.TrimPrefix(msg, "yaml: ")}
}

// nodeDecoder is implemented by config types that read themselves from a
// YAML value (prefixes, port specs, entries with a short form); they
// report their errors to e at the lines they concern.
type nodeDecoder interface {
	decodeNode(n *yaml.Node, path string, e *errs)
}

var (
	nodeDecoderType = reflect.TypeFor[nodeDecoder]()
	durationType    = reflect.TypeFor[time.Duration]()
)

// decode fills v from n, following the `yaml` tags of structs. It is
// strict: an unknown key, a value of the wrong kind or a bad value is an
// error at its line, and decoding goes on so that every error is found.
// A struct with an int field named Line gets the line of its mapping.
func decode(n *yaml.Node, v reflect.Value, path string, e *errs) {
	for n.Kind == yaml.AliasNode {
		n = n.Alias
	}
	if e.lines == nil {
		e.lines = map[string]int{}
	}
	e.lines[path] = n.Line
	if v.CanAddr() && v.Addr().Type().Implements(nodeDecoderType) {
		v.Addr().Interface().(nodeDecoder).decodeNode(n, path, e)
		return
	}
	if n.Kind == yaml.ScalarNode && n.Tag == "!!null" {
		return // an empty value keeps the default
	}
	switch {
	case v.Type() == durationType:
		d, err := parseDuration(n)
		if err != nil {
			e.at(n, "%s: %v", path, err)
			return
		}
		v.SetInt(int64(d))
		return
	case v.Kind() == reflect.Pointer:
		if v.IsNil() {
			v.Set(reflect.New(v.Type().Elem()))
		}
		decode(n, v.Elem(), path, e)
		return
	}
	switch v.Kind() {
	case reflect.Struct:
		if n.Kind != yaml.MappingNode {
			e.at(n, "%swant a mapping of keys to values, not %s", where(path), describe(n))
			return
		}
		if f := v.FieldByName("Line"); f.IsValid() && f.Kind() == reflect.Int {
			f.SetInt(int64(n.Line))
		}
		seen := map[string]bool{}
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, val := n.Content[i], n.Content[i+1]
			if seen[k.Value] {
				e.at(k, "%skey %q given twice", where(path), k.Value)
				continue
			}
			seen[k.Value] = true
			f, ok := fieldByTag(v, k.Value)
			if !ok {
				e.at(k, "%sunknown key %q (known: %s)", where(path), k.Value, strings.Join(knownKeys(v.Type()), ", "))
				continue
			}
			decode(val, f, join(path, k.Value), e)
		}
	case reflect.Slice:
		if n.Kind != yaml.SequenceNode {
			e.at(n, "%s: want a list, not %s", path, describe(n))
			return
		}
		s := reflect.MakeSlice(v.Type(), len(n.Content), len(n.Content))
		for i, item := range n.Content {
			decode(item, s.Index(i), fmt.Sprintf("%s[%d]", path, i+1), e)
		}
		v.Set(s)
	case reflect.String:
		if n.Kind != yaml.ScalarNode {
			e.at(n, "%s: want a text value, not %s", path, describe(n))
			return
		}
		v.SetString(n.Value)
	case reflect.Bool:
		var b bool
		if n.Kind != yaml.ScalarNode || n.Tag != "!!bool" || n.Decode(&b) != nil {
			e.at(n, "%s: want true or false, not %s", path, describe(n))
			return
		}
		v.SetBool(b)
	case reflect.Int, reflect.Int32, reflect.Int64:
		x, err := strconv.ParseInt(n.Value, 10, v.Type().Bits())
		if n.Kind != yaml.ScalarNode || n.Tag != "!!int" || err != nil {
			e.at(n, "%s: want a whole number, not %s", path, describe(n))
			return
		}
		v.SetInt(x)
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		x, err := strconv.ParseUint(n.Value, 10, v.Type().Bits())
		if n.Kind != yaml.ScalarNode || n.Tag != "!!int" || err != nil {
			e.at(n, "%s: want a whole number up to %d, not %s", path, uint64(1)<<v.Type().Bits()-1, describe(n))
			return
		}
		v.SetUint(x)
	default:
		panic(fmt.Sprintf("config: no decoder for %s", v.Type()))
	}
}

// where starts a message about the value at path.
func where(path string) string {
	if path == "" {
		return ""
	}
	return path + ": "
}

func join(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

// describe names what a node holds, for error messages.
func describe(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	}
	return strconv.Quote(n.Value)
}

func fieldByTag(v reflect.Value, key string) (reflect.Value, bool) {
	t := v.Type()
	for i := 0; i < t.NumField(); i++ {
		name, _, _ := strings.Cut(t.Field(i).Tag.Get("yaml"), ",")
		if name != "" && name != "-" && name == key {
			return v.Field(i), true
		}
	}
	return reflect.Value{}, false
}

func knownKeys(t reflect.Type) []string {
	var out []string
	for i := 0; i < t.NumField(); i++ {
		name, _, _ := strings.Cut(t.Field(i).Tag.Get("yaml"), ",")
		if name != "" && name != "-" {
			out = append(out, name)
		}
	}
	return out
}

// parseDuration reads "60s", "1m30s" or "2h". A bare number is refused:
// seconds or milliseconds would be a guess.
func parseDuration(n *yaml.Node) (time.Duration, error) {
	if n.Kind != yaml.ScalarNode {
		return 0, fmt.Errorf("want a duration such as 60s or 5m, not %s", describe(n))
	}
	d, err := time.ParseDuration(n.Value)
	if err != nil {
		return 0, fmt.Errorf("want a duration such as 60s or 5m, not %q", n.Value)
	}
	if d < 0 {
		return 0, errors.New("a duration cannot be negative")
	}
	return d, nil
}
