package datapath

import (
	"regexp"
	"strconv"
	"testing"

	"github.com/cilium/ebpf"
)

// verifierCeiling is the share of the verifier's limit of processed
// instructions that any program of moat's object may take here. The
// largest take about half (moat_filter 494,037, moat_syn_accept 362,327 of
// 1,000,000 on Linux 6.18). A change that raises one past this has most
// likely let the verifier follow both ways of branches it used to prune
// together: a window-scale log2 with a branch per step took
// moat_syn_accept to 743,547, and a kernel whose verifier prunes a little
// worse would then refuse the object.
const verifierCeiling = 0.6

var processed = regexp.MustCompile(`processed (\d+) insns \(limit (\d+)\)`)

// TestVerifierHeadroom loads moat's programs with the verifier's
// statistics and checks each against verifierCeiling.
func TestVerifierHeadroom(t *testing.T) {
	spec, err := LoadMoat()
	if err == nil {
		// As loaded in production: with constants the verifier would
		// otherwise prune the reads of.
		err = SetKernelConstants(spec)
	}
	if err != nil {
		t.Fatal(err)
	}
	coll, err := ebpf.NewCollectionWithOptions(spec, ebpf.CollectionOptions{
		Programs: ebpf.ProgramOptions{LogLevel: ebpf.LogLevelStats},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer coll.Close()
	for name, p := range coll.Programs {
		m := processed.FindStringSubmatch(p.VerifierLog)
		if m == nil {
			t.Errorf("%s: no statistics in the verifier's log: %q", name, p.VerifierLog)
			continue
		}
		n, _ := strconv.Atoi(m[1])
		limit, _ := strconv.Atoi(m[2])
		t.Logf("%s: %d of %d instructions processed", name, n, limit)
		if float64(n) > verifierCeiling*float64(limit) {
			t.Errorf("%s: the verifier processed %d instructions, more than %.0f%% of its limit of %d",
				name, n, 100*verifierCeiling, limit)
		}
	}
}
