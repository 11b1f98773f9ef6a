package syncookie

import (
	"sync/atomic"
	"testing"
	"time"
)

// TestCensusPassOvertaken: two processes that take passes into one census
// (the census lock is a file of /run, which a process in another mount
// namespace, a container's, does not share) must not make it lie. A pass
// that another process overtook (it raised the generation twice while
// this one walked the sockets) used to set its floor and clear the bits
// of "its" two older generations, which modulo 4 are those of the passes
// that overtook it: every mark went, while the census stayed trusted, and
// the ACKs of established connections looked stray.
func TestCensusPassOvertaken(t *testing.T) {
	objs := loadObjects(t)
	a, err := NewCensus(objs.MoatSynCensus, objs.SynCensus)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := NewCensus(objs.MoatSynCensus, objs.SynCensus)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	c := censusTable(t, objs.SynCensus)
	const slot = 4242
	for range 2 { // trusted
		if _, err := b.Take(time.Second); err != nil {
			t.Fatal(err)
		}
	}
	censusIterated = func() {
		censusIterated = nil
		// b takes two passes while a walks the sockets, and the data path
		// marks a socket about to be born with the generation of b's last.
		for range 2 {
			if _, err := b.Take(time.Second); err != nil {
				t.Error(err)
			}
		}
		markCensusSlot(c, slot, atomic.LoadUint32(&c.Generation))
	}
	defer func() { censusIterated = nil }()
	_, err = a.Take(time.Second)
	t.Logf("overtaken pass: %v", err)
	st, _ := ReadCensus(objs.SynCensus)
	if st.Trusted && censusSlotBits(c, slot) == 0 {
		t.Errorf("the census is trusted (generation %d, floor %d) and the slot's mark is gone", c.Generation, c.Floor)
	}
}
