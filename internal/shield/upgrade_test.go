package shield_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/moat-shield/moat/internal/datapath"
	"github.com/moat-shield/moat/internal/rules"
	"github.com/moat-shield/moat/internal/shield"
)

// TestOpenAddsMapsOfNewerVersions checks the upgrade path: state pinned by
// an older moat lacks the maps that later versions added; Open adds them
// and keeps every rule that was there.
func TestOpenAddsMapsOfNewerVersions(t *testing.T) {
	s := openFresh(t)
	root := s.Root()
	if err := s.Add(shield.DenyList, entries("198.51.100.0/24"), shield.Strict); err != nil {
		t.Fatal(err)
	}
	s.Close()

	// Remove a map, as if this state came from a version without it.
	missing := filepath.Join(root, "maps", datapath.MoatMapPortRuleDefs)
	if err := os.Remove(missing); err != nil {
		t.Fatal(err)
	}
	s, err := shield.Open(root)
	if err != nil {
		t.Fatalf("open state that lacks a map: %v", err)
	}
	defer s.Close()
	if _, err := os.Stat(missing); err != nil {
		t.Fatalf("the missing map was not pinned again: %v", err)
	}
	if got := listOf(t, s, shield.DenyList); got != "198.51.100.0/24" {
		t.Fatalf("denylist after upgrade = %q", got)
	}
	spec, _ := rules.ParsePortSpec("udp/19")
	if err := s.AddPortRule(spec, rules.Drop); err != nil {
		t.Fatalf("the added map does not work: %v", err)
	}
}
