package cli_test

import (
	"testing"

	"github.com/cilium/ebpf"

	"github.com/moat-shield/moat/internal/datapath"
	"github.com/moat-shield/moat/internal/shield"
	"github.com/moat-shield/moat/internal/syncookie"
)

// TestSynProtectPastTheSlots checks that asking to protect more ports than
// the counters have slots for is a user error that protects none of them.
func TestSynProtectPastTheSlots(t *testing.T) {
	t.Parallel()
	root := newRoot(t)
	s, err := shield.Open(root)
	if err != nil {
		t.Fatal(err)
	}
	ports := s.Map(datapath.MoatMapSynPorts)
	// All slots but one taken, as `moat syn protect` would take them.
	for i := 1; i < syncookie.MaxProtectedPorts; i++ {
		e := datapath.MoatSynPort{Mode: uint8(syncookie.ModeNever), Slot: uint16(i)}
		if err := ports.Update(uint32(10000+i), e, ebpf.UpdateAny); err != nil {
			t.Fatal(err)
		}
	}
	s.Close()

	checkUsageError(t, runMain(root, "syn", "protect", "tcp/80", "tcp/443", "--mode", "never"), "too many protected ports")
	r := mustRun(t, root, "syn", "status", "--json")
	if got := len(protectedPorts(t, root)); got != syncookie.MaxProtectedPorts-1 {
		t.Fatalf("%d ports protected after the refused command, want %d\n%s", got, syncookie.MaxProtectedPorts-1, r.stdout)
	}
	// One more fits; protecting a protected port again needs no slot.
	mustRun(t, root, "syn", "protect", "tcp/80", "--mode", "never")
	mustRun(t, root, "syn", "protect", "tcp/80", "tcp/10001", "--mode", "never")
	if got := len(protectedPorts(t, root)); got != syncookie.MaxProtectedPorts {
		t.Fatalf("%d ports protected, want %d", got, syncookie.MaxProtectedPorts)
	}
}

func protectedPorts(t *testing.T, root string) []syncookie.PortEntry {
	t.Helper()
	s, err := shield.Open(root)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	pe, err := syncookie.ProtectedPorts(s.Map(datapath.MoatMapSynPorts))
	if err != nil {
		t.Fatal(err)
	}
	return pe
}
