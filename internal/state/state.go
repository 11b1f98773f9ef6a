// Package state keeps the rules added while the daemon runs (through the
// API or the CLI) in a file, so that they survive a restart of
// the daemon and a reboot of the host. The file is replaced atomically: a
// crash at any moment leaves either the old file or the new one, whole.
package state

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/moat-shield/moat/internal/rules"
)

// version is the format of the file; a reader refuses a newer one rather
// than drop what it does not understand.
const version = 1

// State is the dynamic rules.
type State struct {
	Version int                 `json:"version"`
	Saved   time.Time           `json:"saved"`
	Allow   []rules.PrefixEntry `json:"allow"`
	Deny    []rules.PrefixEntry `json:"deny"`
	Ports   []rules.PortEntry   `json:"ports"`
}

// Load reads the state file. A missing file is an empty state: the first
// start, or a host where nothing was ever added.
func Load(path string) (*State, error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return &State{Version: version}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read state: %w", err)
	}
	// The format first: a newer one may hold fields this moat lacks, and
	// that is what its refusal should say.
	var head struct {
		Version int `json:"version"`
	}
	if err := json.Unmarshal(data, &head); err == nil && head.Version > version {
		return nil, fmt.Errorf("state %s has format %d; this moat reads up to %d", path, head.Version, version)
	}
	var st State
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&st); err != nil {
		return nil, fmt.Errorf("read state %s: %w", path, err)
	}
	rs := rules.Ruleset{Allow: st.Allow, Deny: st.Deny, Ports: st.Ports}
	if err := rs.Validate(); err != nil {
		return nil, fmt.Errorf("state %s: %w", path, err)
	}
	st.Version = version
	return &st, nil
}

// Save writes the state through WriteFile.
func Save(path string, st *State) error {
	st.Version = version
	st.Saved = time.Now().UTC().Truncate(time.Second)
	data, err := json.MarshalIndent(st, "", "  ")
	if err != nil {
		return err
	}
	if err := WriteFile(path, append(data, '\n')); err != nil {
		return fmt.Errorf("save state: %w", err)
	}
	return nil
}

// WriteFile replaces path with data, readable by root only: a temporary
// file in the same directory, synced, renamed over the old one, and the
// directory synced so that the rename itself survives a power cut. A
// crash leaves the old file or the new one, never a part.
func WriteFile(path string, data []byte) error {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp-")
	if err != nil {
		return err
	}
	done := false
	defer func() {
		if !done {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	if err := tmp.Chmod(0o600); err != nil {
		return err
	}
	if _, err := tmp.Write(data); err != nil {
		return err
	}
	if err := tmp.Sync(); err != nil {
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return err
	}
	done = true
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("sync %s: %w", dir, err)
	}
	return nil
}

// DropExpired removes entries whose time has passed and tells how many
// went.
func (st *State) DropExpired(now time.Time) int {
	n := 0
	for _, l := range []*[]rules.PrefixEntry{&st.Allow, &st.Deny} {
		kept := (*l)[:0]
		for _, e := range *l {
			if e.Expires != nil && !e.Expires.After(now) {
				n++
				continue
			}
			kept = append(kept, e)
		}
		*l = kept
	}
	return n
}
