package shield

import (
	"fmt"

	"github.com/cilium/ebpf"

	"github.com/moat-shield/moat/internal/datapath"
	"github.com/moat-shield/moat/internal/syncookie"
)

// NewCensus loads the socket census iterator against the pinned SYN maps
// (see syncookie.Census). Its passes count the sockets of the network
// namespace of the thread that takes them: the interfaces'.
func (s *Shield) NewCensus() (*syncookie.Census, error) {
	spec := s.spec.Copy()
	for name, m := range s.maps {
		spec.Maps[name].Flags = withAccessFlags(spec.Maps[name].Flags, m)
	}
	var objs struct {
		Prog *ebpf.Program `ebpf:"moat_syn_census"`
	}
	if err := spec.LoadAndAssign(&objs, &ebpf.CollectionOptions{MapReplacements: s.maps}); err != nil {
		return nil, fmt.Errorf("load the socket census: %w", err)
	}
	c, err := syncookie.NewCensus(objs.Prog, s.maps[datapath.MoatMapSynCensus])
	objs.Prog.Close() // the iterator link holds the program
	if err != nil {
		return nil, err
	}
	return c, nil
}
