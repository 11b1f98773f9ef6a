package bench

import (
	"errors"
	"sync"

	"github.com/moat-shield/moat/internal/lab"
	"github.com/moat-shield/moat/internal/syncookie"
)

// censusRunner takes socket census passes in a lab host's namespace, as
// the daemon takes them in its own, while a moat contender is attached.
type censusRunner struct {
	c   *syncookie.Census
	end func()
	mu  sync.Mutex
	err error
}

// startCensus returns once the census is trusted, so that no measurement
// starts on the lookup path, and goes on in the background.
func startCensus(h *lab.Host, c *syncookie.Census) (*censusRunner, error) {
	r := &censusRunner{c: c}
	stop, err := c.Start(syncookie.DefaultCensusEvery, h.Do, func(_ syncookie.CensusPass, err error) {
		r.mu.Lock()
		r.err = errors.Join(r.err, err)
		r.mu.Unlock()
	})
	if err != nil {
		c.Close()
		return nil, err
	}
	r.end = stop
	return r, nil
}

// stop ends the passes and reports any that failed.
func (r *censusRunner) stop() error {
	r.end()
	r.mu.Lock()
	defer r.mu.Unlock()
	return errors.Join(r.err, r.c.Close())
}
