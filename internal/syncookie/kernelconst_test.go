package syncookie

import (
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/btf"

	"github.com/moat-shield/moat/internal/datapath"
)

// TestSetKernelConstants: the filter's flow label bit numbers come from the
// kernel's BTF, each one of struct inet_sock's inet_flags and no two the
// same; a spec without the variables is refused, not loaded half set. The
// bits' effect is in TestSynAckIPHeaderAsTheKernels and
// TestStrayAckResetIPHeaderAsTheKernels.
func TestSetKernelConstants(t *testing.T) {
	kernel, err := btf.LoadKernelSpec()
	if err != nil {
		t.Skipf("no kernel BTF: %v", err)
	}
	var inet *btf.Struct
	if err := kernel.TypeByName("inet_sock", &inet); err != nil {
		t.Fatal(err)
	}
	hasFlags := false
	for _, m := range inet.Members {
		hasFlags = hasFlags || m.Name == "inet_flags"
	}
	if !hasFlags {
		t.Skip("struct inet_sock has no inet_flags (Linux before 6.6): the bits stay unknown")
	}

	spec, err := datapath.LoadMoat()
	if err != nil {
		t.Fatal(err)
	}
	if err := SetKernelConstants(spec); err != nil {
		t.Fatal(err)
	}
	seen := map[uint8]string{}
	for _, f := range inetFlagVars {
		var bit uint8
		if err := spec.Variables[f.variable].Get(&bit); err != nil {
			t.Fatal(err)
		}
		if bit >= 64 {
			t.Errorf("%s = %d: %s not found in the kernel's BTF", f.variable, bit, f.member)
		}
		if other, ok := seen[bit]; ok {
			t.Errorf("%s and %s are both bit %d", f.variable, other, bit)
		}
		seen[bit] = f.variable
	}

	if err := SetKernelConstants(&ebpf.CollectionSpec{Variables: map[string]*ebpf.VariableSpec{}}); err == nil {
		t.Error("a spec without the flow label variables was taken")
	}
}
