package daemon_test

import (
	"fmt"
	"testing"

	"github.com/moat-shield/moat/internal/ratelimit"
)

// limitSettings reads the switches of the env's rate limits.
func (e *env) limitSettings() ratelimit.Config {
	e.t.Helper()
	var c ratelimit.Config
	e.withLimitMaps(func(m ratelimit.Maps) (err error) { c, err = m.Config(); return err })
	return c
}

// TestLimitSettingsFromTheConfig: under a daemon `moat limit config` is
// refused and points at the config, so the config's limit_settings set the
// switches, at start and at each reload; a switch it leaves out keeps its
// value.
func TestLimitSettingsFromTheConfig(t *testing.T) {
	e := newEnv(t)
	base := fmt.Sprintf("interfaces:\n  - name: %s\n    mode: generic\n", e.attackerIf())
	e.writeConfig(base + "limit_settings:\n  gate: none\n  sample: 1024\n")
	e.start()
	if c := e.limitSettings(); c.Gate != ratelimit.GateNone || c.Sample != 1024 || !c.Shape || !c.HeavyHitters {
		t.Errorf("after start: %+v, want gate none, sample 1024, shape and heavy hitters on", c)
	}
	if r := e.moat("limit", "config", "--gate", "sketch"); r.code != 2 {
		t.Errorf("moat limit config under the daemon: exit %d, want 2 (refused)", r.code)
	}
	e.writeConfig(base + "limit_settings:\n  shape: false\n")
	e.mustMoat("reload")
	if c := e.limitSettings(); c.Gate != ratelimit.GateNone || c.Sample != 1024 || c.Shape || !c.HeavyHitters {
		t.Errorf("after the reload: %+v, want shape off and the rest as it was", c)
	}
}
