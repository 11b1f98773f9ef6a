package bench

import (
	"context"
	"errors"
	"sync"

	"github.com/moat-shield/moat/internal/lab"
	"github.com/moat-shield/moat/internal/syncookie"
)

// censusRunner takes socket census passes in a lab host's namespace, as
// the daemon takes them in its own, while a moat contender is attached.
type censusRunner struct {
	c      *syncookie.Census
	cancel context.CancelFunc
	done   sync.WaitGroup
	mu     sync.Mutex
	err    error
}

// startCensus takes a first pass before it returns, so that a measurement
// never starts on a census the data path cannot trust yet (the first pass
// leaves it untrusted: two are needed), and goes on in the background.
func startCensus(h *lab.Host, c *syncookie.Census) (*censusRunner, error) {
	every := syncookie.DefaultCensusEvery
	in := func(f func() error) error { return h.Do(f) }
	for i := 0; i < 2; i++ {
		if err := in(func() error { _, err := c.Take(every); return err }); err != nil {
			c.Close()
			return nil, err
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &censusRunner{c: c, cancel: cancel}
	r.done.Add(1)
	go func() {
		defer r.done.Done()
		c.Run(ctx, every, in, func(_ syncookie.CensusPass, err error) {
			r.mu.Lock()
			r.err = errors.Join(r.err, err)
			r.mu.Unlock()
		})
	}()
	return r, nil
}

// stop ends the passes and reports any that failed.
func (r *censusRunner) stop() error {
	r.cancel()
	r.done.Wait()
	r.mu.Lock()
	defer r.mu.Unlock()
	return errors.Join(r.err, r.c.Close())
}
