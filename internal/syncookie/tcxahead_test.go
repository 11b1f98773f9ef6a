package syncookie

import (
	"net"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
)

// TestTCXAheadCountsOnlyOthers: moat's acceptors never end the tcx chain,
// so one that runs ahead of another (the acceptors of two ports of one
// bridge, both at the bridge's ingress) keeps nothing from it: TCXAhead
// counts only programs that are not moat's acceptor. Counting them made
// `moat syn protect` warn, and `moat attach` move the acceptor, for every
// port but the last attached.
func TestTCXAheadCountsOnlyOthers(t *testing.T) {
	a, b := loadObjects(t), loadObjects(t)
	pass, err := ebpf.NewProgram(&ebpf.ProgramSpec{Type: ebpf.SchedCLS, License: "GPL",
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 0 /* TCX_PASS */), asm.Return()}})
	if err != nil {
		t.Fatal(err)
	}
	defer pass.Close()
	inScratchNetns(t, func() {
		lo, err := net.InterfaceByName("lo")
		if err != nil {
			t.Error(err)
			return
		}
		la, err := AttachTC(a.MoatSynAccept, lo.Index)
		if err != nil {
			t.Error(err)
			return
		}
		defer la.Close()
		info, err := a.MoatSynAccept.Info()
		if err != nil {
			t.Error(err)
			return
		}
		id, _ := info.ID()
		lb, err := AttachTC(b.MoatSynAccept, lo.Index) // another port's, at the head
		if err != nil {
			t.Error(err)
			return
		}
		defer lb.Close()
		if n, ok, err := TCXAhead(lo.Index, id); err != nil || !ok || n != 0 {
			t.Errorf("behind another moat acceptor: %d ahead, found %v, %v; want 0", n, ok, err)
		}
		lp, err := link.AttachTCX(link.TCXOptions{Interface: lo.Index, Program: pass,
			Attach: ebpf.AttachTCXIngress, Anchor: link.Head()})
		if err != nil {
			t.Error(err)
			return
		}
		defer lp.Close()
		if n, ok, err := TCXAhead(lo.Index, id); err != nil || !ok || n != 1 {
			t.Errorf("behind a program that ends the chain: %d ahead, found %v, %v; want 1", n, ok, err)
		}
	})
}
