package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"github.com/moat-shield/moat/internal/config"
	"github.com/moat-shield/moat/internal/daemon"
	"github.com/moat-shield/moat/internal/shield"
)

// The CLI sends changes through the daemon's API when a daemon manages the
// same pinned state, so that one writer serialises them and persists them
// in the state file; without a daemon it changes the pinned maps itself.

// apiTimeout bounds one API call; a reload of a million rules takes
// seconds, not minutes.
const apiTimeout = 5 * time.Minute

// daemonClient talks to a running daemon.
type daemonClient struct {
	socket string
	http   *http.Client
}

// socketPath is the daemon's API socket: $MOAT_SOCKET, or the default.
func socketPath() string {
	if s := os.Getenv("MOAT_SOCKET"); s != "" {
		return s
	}
	return config.DefaultSocket
}

func newDaemonClient(socket string) *daemonClient {
	return &daemonClient{socket: socket, http: &http.Client{
		Timeout: apiTimeout,
		Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", socket)
		}},
	}}
}

// daemon returns a client of the daemon that manages g.root, or nil when
// none runs (no socket, nobody listening) or the one that runs manages
// other pins.
func (g *globals) daemon() (*daemonClient, error) {
	return g.findDaemon(true)
}

// findDaemon is daemon; with forChange, a socket that no daemon answers
// on gets a warning on stderr: the change goes to the pinned maps alone,
// and a daemon that managed this root removes it when it starts again
// unless its config or state file has it.
func (g *globals) findDaemon(forChange bool) (*daemonClient, error) {
	socket := socketPath()
	if _, err := os.Stat(socket); err != nil {
		return nil, nil
	}
	c := newDaemonClient(socket)
	var st daemon.Status
	if err := c.call(http.MethodGet, "/v1/status", nil, &st); err != nil {
		var ne *net.OpError
		if errors.As(err, &ne) {
			// A socket left by a killed daemon.
			if forChange && g.errOut != nil {
				fmt.Fprintf(g.errOut, "moat: warning: no daemon answers on %s (stopped?): this change goes to the pinned maps "+
					"alone, and a daemon that manages %s removes it at its next start unless its config has it\n", socket, g.root)
			}
			return nil, nil
		}
		return nil, err
	}
	if filepath.Clean(st.Root) != filepath.Clean(g.root) {
		return nil, nil
	}
	return c, nil
}

// via says on stderr that a change went through the daemon; called once
// the daemon made it, so that an error alone is one line, as without one.
func (c *daemonClient) via(w io.Writer) {
	fmt.Fprintf(w, "moat: via moat daemon (%s)\n", c.socket)
}

// call sends a request and decodes the reply into out. A refusal by the
// daemon comes back as a *shield.UserError, so the exit status is the one
// the same refusal gets without a daemon.
func (c *daemonClient) call(method, path string, in, out any) error {
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return err
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, "http://moat"+path, body)
	if err != nil {
		return err
	}
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		return fmt.Errorf("moat daemon: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		var er daemon.ErrorResponse
		if json.Unmarshal(data, &er) != nil || er.Error == "" {
			return fmt.Errorf("moat daemon: %s: %s", resp.Status, bytes.TrimSpace(data))
		}
		if er.User {
			return &shield.UserError{Err: errors.New(er.Error)}
		}
		return fmt.Errorf("moat daemon: %s", er.Error)
	}
	if out != nil {
		if err := json.Unmarshal(data, out); err != nil {
			return fmt.Errorf("moat daemon: bad reply: %w", err)
		}
	}
	return nil
}

// daemonCaptureLimits returns the capture limits of the daemon that manages
// g.root, or nil when no daemon runs: `moat dump` applies them so that the
// config's capture section binds every capture on a host with a daemon.
func (g *globals) daemonCaptureLimits() (*daemon.CaptureLimits, error) {
	c, err := g.findDaemon(false)
	if err != nil || c == nil {
		return nil, err
	}
	var cl daemon.CaptureLimits
	if err := c.call(http.MethodGet, "/v1/capture", nil, &cl); err != nil {
		return nil, err
	}
	return &cl, nil
}
