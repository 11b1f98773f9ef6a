package shield

import (
	"testing"

	"github.com/cilium/ebpf"
)

// LoadFilter loads the XDP filter against the shield's maps, for tests that
// run packets through it.
func (s *Shield) LoadFilter(tb testing.TB) *ebpf.Program {
	tb.Helper()
	objs, err := s.loadFilter(nil)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(objs.Close)
	return objs.Filter
}

// SummaryRebuildAfter is summaryRebuildAfter, for tests.
const SummaryRebuildAfter = summaryRebuildAfter

// FilterSeed loads a filter and returns the heavy-hitter seed it was given.
func (s *Shield) FilterSeed(tb testing.TB) uint64 {
	tb.Helper()
	objs, err := s.loadFilter(nil)
	if err != nil {
		tb.Fatal(err)
	}
	defer objs.Close()
	var seed uint64
	if err := objs.HHSeed.Get(&seed); err != nil {
		tb.Fatal(err)
	}
	return seed
}

// OpenSized is Open with shared maps of other sizes, by name, so that a
// test can fill a list without a million entries. Open the root with the
// same sizes every time.
func OpenSized(root string, sizes map[string]uint32) (*Shield, error) {
	return open(root, sizes)
}

// AddInBatches makes Add take the path of large changes (a count of each
// map it writes) however few the entries, until restore is called.
func AddInBatches() (restore func()) {
	was := fewEntries
	fewEntries = 0
	return func() { fewEntries = was }
}
