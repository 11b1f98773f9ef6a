package shield_test

import (
	"strings"
	"testing"

	"github.com/moat-shield/moat/internal/datapath"
	"github.com/moat-shield/moat/internal/syncookie"
)

// TestOneCensusPerRoot: one process at a time takes the census of a root;
// a second is refused with a clear error until the first stops, whose
// stop leaves the census out of date.
func TestOneCensusPerRoot(t *testing.T) {
	s := openFresh(t)
	stop, err := s.StartCensus(nil)
	if err != nil {
		t.Fatal(err)
	}
	if st, err := syncookie.ReadCensus(s.Map(datapath.MoatMapSynCensus)); err != nil || !st.Trusted || st.Passes != 2 {
		t.Fatalf("census once started: %+v (%v), want current after two passes", st, err)
	}
	if _, err := s.StartCensus(nil); err == nil || !strings.Contains(err.Error(), "another process") {
		t.Fatalf("a second census of the root: %v, want refused", err)
	}
	stop()
	if st, _ := syncookie.ReadCensus(s.Map(datapath.MoatMapSynCensus)); st.Trusted {
		t.Fatalf("census after stop: %+v, want out of date", st)
	}
	stop, err = s.StartCensus(nil)
	if err != nil {
		t.Fatalf("census after the first stopped: %v", err)
	}
	stop()
}
