package datapath

import (
	"fmt"
	"testing"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// TestSetKernelConstants: on Linux 6.7 and later, where a socket's flow
// label choices are bits of inet_flags, the filter's bit numbers come from
// the kernel's BTF, no two the same; a spec without the variables is
// refused, not loaded half set. The bits' effect is in the syncookie
// package's TestSynAckIPHeaderAsTheKernels and
// TestStrayAckResetIPHeaderAsTheKernels.
func TestSetKernelConstants(t *testing.T) {
	var uts unix.Utsname
	if err := unix.Uname(&uts); err != nil {
		t.Fatal(err)
	}
	var major, minor int
	if _, err := fmt.Sscanf(unix.ByteSliceToString(uts.Release[:]), "%d.%d", &major, &minor); err != nil {
		t.Fatalf("kernel release %q: %v", unix.ByteSliceToString(uts.Release[:]), err)
	}
	if major < 6 || major == 6 && minor < 7 {
		t.Skipf("Linux %d.%d keeps the flow label choices out of inet_flags: the bits stay unknown", major, minor)
	}

	spec, err := LoadMoat()
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
