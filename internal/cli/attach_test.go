package cli_test

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/vishvananda/netlink"

	"github.com/moat-shield/moat/internal/shield"
)

// addBridge makes a bridge in the lab's server namespace: an interface
// without native XDP. It goes when the test ends.
func (sl *shieldLab) addBridge(name string) {
	sl.t.Helper()
	t := sl.t
	err := sl.lab.Server.Do(func() error {
		return netlink.LinkAdd(&netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: name}})
	})
	if err != nil {
		t.Fatalf("add bridge %s: %v", name, err)
	}
	t.Cleanup(func() {
		err := sl.lab.Server.Do(func() error {
			l, err := netlink.LinkByName(name)
			if err != nil {
				return nil // gone with the namespace
			}
			return netlink.LinkDel(l)
		})
		if err != nil {
			t.Errorf("delete bridge %s: %v", name, err)
		}
	})
}

// checkFailedOneLine asserts that a command failed with one line of error
// and printed nothing, whatever its exit status.
func checkFailedOneLine(t *testing.T, r result, errPart string) {
	t.Helper()
	if r.code == 0 {
		t.Fatalf("the command succeeded:\n%v", r)
	}
	if lines := strings.Split(strings.TrimSuffix(r.stderr, "\n"), "\n"); len(lines) != 1 || !strings.HasPrefix(lines[0], "moat: ") ||
		!strings.Contains(r.stderr, errPart) {
		t.Errorf("stderr is not one line starting with \"moat: \" and naming %q:\n%q", errPart, r.stderr)
	}
	if r.stdout != "" {
		t.Errorf("a failed command wrote to stdout:\n%s", r.stdout)
	}
}

// TestLabAttachAllOrNothing: an attach that fails on one of its interfaces
// leaves every interface as it was: those it had attached are detached
// again, an attachment it would have replaced keeps its program, and a
// root that it created is removed.
func TestLabAttachAllOrNothing(t *testing.T) {
	t.Parallel()
	sl := newShieldLab(t)
	toClient, toAttacker := sl.ifaces()
	const bridge = "moat-nat-br0" // the lab's namespace is the test's own
	sl.addBridge(bridge)

	t.Run("fresh root", func(t *testing.T) {
		sl.t = t
		// The bridge refuses native XDP after toClient took it.
		checkFailedOneLine(t, sl.moat("attach", toClient, bridge, "--mode", "native"), bridge)
		if sl.xdpAttached(toClient) {
			t.Fatalf("%s kept the program of a failed attach", toClient)
		}
		if st := pinnedState(t, sl.root); st != "" {
			t.Fatalf("a failed attach left state behind:\n%s", st)
		}
	})

	t.Run("mode of an attached interface", func(t *testing.T) {
		sl.t = t
		sl.mustMoat("attach", toAttacker, "--mode", "native")
		before := pinnedState(t, sl.root)
		r := sl.moat("attach", toClient, toAttacker, "--mode", "generic")
		checkUsageError(t, r, toAttacker+" is attached in native mode; detach it first to change the mode")
		if sl.xdpAttached(toClient) {
			t.Fatalf("%s was attached by a refused command", toClient)
		}
		if after := pinnedState(t, sl.root); after != before {
			t.Fatalf("a refused attach changed the state:\nbefore %s\nafter %s", before, after)
		}
	})

	t.Run("root in use", func(t *testing.T) {
		sl.t = t
		// toAttacker is attached: its program would be replaced, after
		// toClient is attached and the bridge fails.
		before := pinnedState(t, sl.root)
		checkFailedOneLine(t, sl.moat("attach", toAttacker, toClient, bridge, "--mode", "native"), bridge)
		if sl.xdpAttached(toClient) {
			t.Fatalf("%s kept the program of a failed attach", toClient)
		}
		if after := pinnedState(t, sl.root); after != before {
			t.Fatalf("a failed attach changed the state:\nbefore %s\nafter %s", before, after)
		}
		sl.mustMoat("detach", toAttacker)
	})
}

// TestLabAttachWarnsAfterAttaching: when the state around the filters
// cannot be brought up to date after an interface is attached or detached
// (here the SYN counters' slots: something that is not a map is pinned
// where an older moat kept its SYN counters), moat attach keeps the filter
// and moat detach removes it; each says what failed in a warning and
// exits 0. The filter attached judges packets.
func TestLabAttachWarnsAfterAttaching(t *testing.T) {
	t.Parallel()
	sl := newShieldLab(t)
	toClient, _ := sl.ifaces()
	s, err := shield.Open(sl.root) // the root and its maps
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Type:         ebpf.XDP,
		License:      "GPL",
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 2), asm.Return()},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer prog.Close()
	if err := prog.Pin(filepath.Join(sl.root, "maps", "syn_stats")); err != nil {
		t.Fatal(err)
	}

	r := sl.moat("attach", toClient)
	if r.code != 0 {
		t.Fatalf("attach failed after the filter was attached:\n%v", r)
	}
	want := "moat: warning: attached to " + toClient + ", but: open syn_stats"
	if !strings.Contains(r.stderr, want) {
		t.Errorf("stderr does not warn %q:\n%s", want, r.stderr)
	}
	if !sl.xdpAttached(toClient) {
		t.Fatalf("%s lost its filter", toClient)
	}
	// The filter is moat's and judges: a denied client is refused.
	sl.expectConnect(sl.lab.Client, false)
	sl.mustMoat("block", sl.clientV4().String())
	sl.expectNoConnect(sl.lab.Client, false)
	// So does moat detach: the interface is detached all the same.
	r = sl.moat("detach", toClient)
	if r.code != 0 {
		t.Fatalf("detach failed after the filter was detached:\n%v", r)
	}
	want = "moat: warning: detached from " + toClient + ", but: open syn_stats"
	if !strings.Contains(r.stderr, want) {
		t.Errorf("stderr does not warn %q:\n%s", want, r.stderr)
	}
	if sl.xdpAttached(toClient) {
		t.Errorf("%s kept its filter", toClient)
	}
}
