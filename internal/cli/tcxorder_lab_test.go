package cli_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
)

// TestSynAcceptorRunsFirst: moat's tc acceptor must see the third ACK of
// every cookie it issued, whatever else runs at tcx ingress. A program
// that ends the chain (returns TCX_PASS, as Cilium's cil_from_netdev
// does; Cilium attaches at the tail) and was attached before moat used to
// run first, so moat's acceptor never ran and the kernel reset every
// cookie handshake, while `moat syn status` showed nothing amiss. moat
// now attaches its acceptor at the head; a tool that puts a program ahead
// of it later draws a warning from `moat syn protect`, and `moat attach`
// again moves the acceptor back to the head.
func TestSynAcceptorRunsFirst(t *testing.T) {
	sl := newShieldLab(t)
	srv := sl.lab.Server.Ifaces[0]
	sl.lab.Client.AttachPassXDPT(t)

	port := sl.greeter(t)
	greeted := func() error { return sl.readGreeting(sl.serverAddr(sl.lab.Client, false), port) }

	// A program that ends the chain for every packet, as an agent's
	// ingress program that passes traffic to the stack does; a new one
	// each time, as tcx takes a program once per hook.
	attachPass := func(anchor link.Anchor) {
		t.Helper()
		pass, err := ebpf.NewProgram(&ebpf.ProgramSpec{Type: ebpf.SchedCLS, License: "GPL",
			Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 0 /* TCX_PASS */), asm.Return()}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { pass.Close() })
		if err := sl.lab.Server.Do(func() error {
			l, err := link.AttachTCX(link.TCXOptions{Interface: srv.Index, Program: pass,
				Attach: ebpf.AttachTCXIngress, Anchor: anchor})
			if err == nil {
				t.Cleanup(func() { l.Close() })
			}
			return err
		}); err != nil {
			t.Fatal(err)
		}
	}

	// The agent was there first.
	attachPass(link.Tail())
	sl.mustMoat("attach", srv.Name)
	r := sl.mustMoat("syn", "protect", fmt.Sprintf("tcp/%d", port), "--mode", "always")
	if strings.Contains(r.stderr, "before moat's SYN acceptor") {
		t.Errorf("syn protect warns of a program ahead of the acceptor, attached at the head: %s", r.stderr)
	}
	if err := greeted(); err != nil {
		t.Fatalf("an agent's tcx program attached before moat: the cookie handshake failed: %v", err)
	}
	var st struct {
		Ports []struct {
			CookiesAccepted uint64 `json:"cookies_accepted"`
		} `json:"ports"`
	}
	sl.moatJSON(&st, "syn", "status")
	if len(st.Ports) != 1 || st.Ports[0].CookiesAccepted != 1 {
		t.Fatalf("syn status %+v: want the handshake accepted by moat", st)
	}

	// A tool that attaches ahead of moat's acceptor since.
	sl.mustMoat("syn", "protect", fmt.Sprintf("tcp/%d", port), "--mode", "never")
	attachPass(link.Head())
	r = sl.mustMoat("syn", "protect", fmt.Sprintf("tcp/%d", port), "--mode", "always")
	if !strings.Contains(r.stderr, "1 tcx ingress program(s) run before moat's SYN acceptor") {
		t.Errorf("syn protect says nothing of the program ahead of the acceptor: %s", r.stderr)
	}
	r = sl.mustMoat("attach", srv.Name)
	if !strings.Contains(r.stderr, "runs first now") {
		t.Errorf("attach does not say it moved the acceptor: %s", r.stderr)
	}
	if err := greeted(); err != nil {
		t.Fatalf("after attach again: the cookie handshake failed: %v", err)
	}
	r = sl.mustMoat("syn", "protect", fmt.Sprintf("tcp/%d", port), "--mode", "always")
	if strings.Contains(r.stderr, "before moat's SYN acceptor") {
		t.Errorf("after attach again, syn protect still warns: %s", r.stderr)
	}
}
