package lab

import (
	"errors"
	"fmt"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
)

// PassXDP is an XDP program that passes every frame, attached to each
// interface of one host.
type PassXDP struct {
	prog  *ebpf.Program
	links []link.Link
}

// AttachPassXDP attaches an XDP program that passes every frame to each of
// h's interfaces. A veth hands frames that its peer sends with XDP_TX (a
// SYN-ACK answered from XDP, say) to the stack only while it runs NAPI, and
// GRO alone does not keep NAPI running once the peer has an XDP program of
// its own: without a program here such frames wait in the ring until other
// traffic arrives. An interface can hold one XDP program, so a test that
// attaches its own (a counter) needs no pass-through one.
func (h *Host) AttachPassXDP() (*PassXDP, error) {
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Name:         "lab_pass",
		Type:         ebpf.XDP,
		License:      "GPL",
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 2 /* XDP_PASS */), asm.Return()},
	})
	if err != nil {
		return nil, fmt.Errorf("lab: pass-through XDP program: %w", err)
	}
	p := &PassXDP{prog: prog}
	err = h.Do(func() error {
		for _, ifc := range h.Ifaces {
			l, err := link.AttachXDP(link.XDPOptions{Program: prog, Interface: ifc.Index})
			if err != nil {
				return fmt.Errorf("lab: pass-through XDP on %s in %s: %w", ifc.Name, h.Name, err)
			}
			p.links = append(p.links, l)
		}
		return nil
	})
	if err != nil {
		p.Close()
		return nil, err
	}
	return p, nil
}

// AttachPassXDPT is AttachPassXDP for tests: it fails t on error and
// detaches the program when t ends.
func (h *Host) AttachPassXDPT(t testing.TB) {
	t.Helper()
	p, err := h.AttachPassXDP()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
}

// Close detaches the program from every interface.
func (p *PassXDP) Close() error {
	var errs []error
	for _, l := range p.links {
		errs = append(errs, l.Close())
	}
	p.links = nil
	errs = append(errs, p.prog.Close())
	return errors.Join(errs...)
}
