package shield_test

import (
	"strings"
	"testing"

	"github.com/moat-shield/moat/internal/datapath"
	"github.com/moat-shield/moat/internal/shield"
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

// TestCensusHolderTakesOver: a holder refused because another process
// takes the census keeps asking to retry, takes it once the other stops,
// and then stops asking.
func TestCensusHolderTakesOver(t *testing.T) {
	s := openFresh(t)
	other, err := s.StartCensus(nil)
	if err != nil {
		t.Fatal(err)
	}
	var reports []error
	h := shield.HoldCensus(func() (func(), error) { return s.StartCensus(nil) }, func(err error) { reports = append(reports, err) })
	t.Cleanup(h.Stop)
	if err := h.Err(); err == nil || !strings.Contains(err.Error(), "another process") || h.Retry() == nil || len(reports) != 1 || reports[0] != err {
		t.Fatalf("holder while another takes the census: err %v, retry %v, reports %v; want refused, reported and retrying", err, h.Retry(), reports)
	}
	if h.Take(); h.Err() == nil || len(reports) != 1 {
		t.Fatalf("second refusal: err %v, reports %v; want the same refusal, not reported again", h.Err(), reports)
	}
	other()
	before, _ := syncookie.ReadCensus(s.Map(datapath.MoatMapSynCensus))
	if h.Take(); h.Err() != nil || len(reports) != 2 || reports[1] != nil {
		t.Fatalf("take once the other stopped: err %v, reports %v; want taken and reported", h.Err(), reports)
	}
	if h.Retry() != nil || h.Err() != nil {
		t.Fatalf("holder with the census: retry %v, err %v; want neither", h.Retry(), h.Err())
	}
	if st, err := syncookie.ReadCensus(s.Map(datapath.MoatMapSynCensus)); err != nil || !st.Trusted || st.Passes != before.Passes+2 {
		t.Fatalf("census taken over: %+v (%v), want current with two more passes than %d", st, err, before.Passes)
	}
	h.Stop()
	if st, _ := syncookie.ReadCensus(s.Map(datapath.MoatMapSynCensus)); st.Trusted {
		t.Fatalf("census after the holder stopped: %+v, want out of date", st)
	}
}
