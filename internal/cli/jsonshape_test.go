package cli_test

import (
	"encoding/json"
	"testing"
)

// JSON output keeps its shape on empty state: lists are [], not null, and
// defaults are spelled out.
func TestJSONEmptyShapes(t *testing.T) {
	t.Parallel()
	root := newRoot(t)
	decode := func(args ...string) map[string]any {
		t.Helper()
		var v map[string]any
		r := mustRun(t, root, append(args, "--json")...)
		if err := json.Unmarshal([]byte(r.stdout), &v); err != nil {
			t.Fatalf("moat %v --json: %v\n%s", args, err, r.stdout)
		}
		return v
	}
	isList := func(what string, v any) {
		t.Helper()
		if _, ok := v.([]any); !ok {
			t.Errorf("%s is %#v, want a list", what, v)
		}
	}
	settings := func(v map[string]any) any {
		s, _ := v["settings"].(map[string]any)
		return [2]any{s["fragments"], s["malformed"]}
	}
	want := [2]any{"pass", "drop"}

	// Not set up: the policies a new state would start with.
	if got := settings(decode("status")); got != want {
		t.Errorf("status of a fresh root: settings %v, want %v", got, want)
	}
	mustRun(t, root, "block", "192.0.2.1") // sets up the state
	if got := settings(decode("status")); got != want {
		t.Errorf("status of a new state: settings %v, want %v", got, want)
	}

	shape, _ := decode("stats", "--detail")["shape"].(map[string]any)
	for _, k := range []string{"sizes", "protocols", "tcp_flags", "syn_options", "ports"} {
		isList("stats --detail: shape."+k, shape[k])
	}
	isList("syn status: ports", decode("syn", "status")["ports"])
}
