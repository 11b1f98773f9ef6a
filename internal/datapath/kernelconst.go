package datapath

import (
	"fmt"
	"strings"
	"sync"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/btf"
)

// inetFlagVars are the filter's constants that hold the numbers of bits of
// the kernel's struct inet_sock inet_flags, by the member of the kernel's
// enum that numbers each: a listener's own choices of IPv6 flow label for
// its SYN-ACKs and RSTs (bpf/include/syncookie.h, syn_listener_flow). The
// kernel keeps them there from Linux 6.7.
var inetFlagVars = []struct{ member, variable string }{
	{"INET_FLAGS_REPFLOW", MoatVarInetFlagRepflow},
	{"INET_FLAGS_AUTOFLOWLABEL", MoatVarInetFlagAutoflowlabel},
	{"INET_FLAGS_AUTOFLOWLABEL_SET", MoatVarInetFlagAutoflowlabelSet},
}

// kernelInetFlags reads the running kernel's numbers of the inet_flags
// bits of inetFlagVars from its BTF. Their enum has no name, so CO-RE
// cannot relocate them in the filter. A member the kernel lacks is not in
// the map: that is no error.
var kernelInetFlags = sync.OnceValues(func() (map[string]uint64, error) {
	spec, err := btf.LoadKernelSpec()
	if err != nil {
		return nil, fmt.Errorf("read the kernel's BTF: %w", err)
	}
	want := make(map[string]bool, len(inetFlagVars))
	for _, f := range inetFlagVars {
		want[f.member] = true
	}
	found := map[string]uint64{}
	for typ, err := range spec.All() {
		if err != nil {
			return nil, fmt.Errorf("read the kernel's BTF: %w", err)
		}
		e, ok := typ.(*btf.Enum)
		if !ok || e.Name != "" || len(e.Values) == 0 || !strings.HasPrefix(e.Values[0].Name, "INET_FLAGS_") {
			continue
		}
		for _, v := range e.Values {
			if want[v.Name] {
				found[v.Name] = v.Value
			}
		}
		if len(found) == len(want) {
			break
		}
	}
	return found, nil
})

// SetKernelConstants writes into spec, before the filter is loaded from
// it, what the filter must know of the running kernel and CO-RE cannot
// tell it: the numbers of a listener's flow label bits in inet_flags. A
// bit the kernel lacks stays unknown (0xff), and the filter takes the
// namespace's sysctls for the listener's choices.
func SetKernelConstants(spec *ebpf.CollectionSpec) error {
	flags, err := kernelInetFlags()
	if err != nil {
		return err
	}
	for _, f := range inetFlagVars {
		v, ok := spec.Variables[f.variable]
		if !ok {
			return fmt.Errorf("the BPF object has no %s", f.variable)
		}
		bit, ok := flags[f.member]
		if !ok || bit >= 64 {
			bit = 0xff
		}
		if err := v.Set(uint8(bit)); err != nil {
			return fmt.Errorf("set %s: %w", f.variable, err)
		}
	}
	return nil
}
