package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

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
// none does.
func (g *globals) daemon() (*daemonClient, error) {
	return g.findDaemon(true)
}

// findDaemon is daemon. The daemon asked first is the one on the socket
// that the operator names (or the default); where that one manages
// another root or none answers there, the lock that a daemon holds on its
// root says whether one manages g.root, and on which socket. A daemon
// that holds the lock but answers on neither socket fails the command:
// whatever it did next would be behind the daemon's back. With forChange,
// a socket that no daemon answers on, where no daemon holds the lock,
// gets a warning on stderr: the change goes to the pinned maps alone, and
// a daemon that managed this root removes it when it starts again unless
// its config or state file has it.
func (g *globals) findDaemon(forChange bool) (*daemonClient, error) {
	socket := socketPath()
	c, dead, err := askDaemon(socket, g.root)
	if c != nil || err != nil {
		return c, err
	}
	holder, err := lockHolder(g.root)
	if err != nil {
		return nil, err
	}
	if holder == nil {
		if dead && forChange && g.errOut != nil && !g.warned {
			// Once a command: a command that asks again before it
			// opens the state would give it twice.
			g.warned = true
			fmt.Fprintf(g.errOut, "moat: warning: no daemon answers on %s (stopped?): this change goes to the pinned maps "+
				"alone, and a daemon that manages %s removes it at its next start unless its config has it\n", socket, g.root)
		}
		return nil, nil
	}
	if holder.socket != "" && holder.socket != socket {
		if c, _, err := askDaemon(holder.socket, g.root); c != nil || err != nil {
			return c, err
		}
	}
	if forChange {
		return nil, fmt.Errorf("the moat daemon that manages %s (%s) does not answer; nothing was changed behind its back", g.root, holder)
	}
	return nil, fmt.Errorf("the moat daemon that manages %s (%s) does not answer", g.root, holder)
}

// askDaemon returns a client of the daemon on socket if it manages root.
// dead says that a socket is there but nobody answers on it: a socket
// left by a killed daemon.
func askDaemon(socket, root string) (c *daemonClient, dead bool, err error) {
	if _, err := os.Stat(socket); err != nil {
		return nil, false, nil
	}
	c = newDaemonClient(socket)
	var st daemon.Status
	if err := c.call(http.MethodGet, "/v1/status", nil, &st); err != nil {
		var ne *net.OpError
		if errors.As(err, &ne) {
			return nil, true, nil
		}
		return nil, false, err
	}
	// The same state, whichever path leads to it: a root named through a
	// symbolic link is the daemon's too.
	if shield.ResolveRoot(st.Root) != shield.ResolveRoot(root) {
		return nil, false, nil
	}
	return c, false, nil
}

// daemonHolder is the daemon that holds a root's lock, as its lock file
// names it.
type daemonHolder struct {
	lock   string // the lock file
	pid    int    // 0: the file does not say
	socket string // "": the file does not say
}

func (h *daemonHolder) String() string {
	if h.pid == 0 || h.socket == "" {
		return "lock " + h.lock
	}
	return fmt.Sprintf("pid %d, socket %s", h.pid, h.socket)
}

// lockHolder returns the daemon that holds root's lock, or nil when none
// does. It takes the lock shared for a moment: that fails only while a
// daemon holds it, which a daemon does from before it opens its socket
// until it exits, killed or not. A socket cannot tell as much: the
// operator's MOAT_SOCKET may name another daemon's, or none.
func lockHolder(root string) (*daemonHolder, error) {
	path, err := daemon.LockPath(root)
	if err != nil {
		return nil, err
	}
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) || errors.Is(err, fs.ErrPermission) {
		// No daemon ever ran on root; or not root ourselves, and then
		// the pinned maps are out of reach too.
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("daemon lock of %s: %w", root, err)
	}
	defer f.Close()
	err = unix.Flock(int(f.Fd()), unix.LOCK_SH|unix.LOCK_NB)
	if err == nil {
		return nil, nil // closing the file lets go of it
	}
	if !errors.Is(err, unix.EWOULDBLOCK) {
		return nil, fmt.Errorf("daemon lock of %s: %w", root, err)
	}
	h := &daemonHolder{lock: path}
	// The daemon writes "pid N, socket PATH" once it holds the lock.
	text, _ := io.ReadAll(io.LimitReader(f, 4096))
	if rest, ok := strings.CutPrefix(strings.TrimSpace(string(text)), "pid "); ok {
		if pid, socket, ok := strings.Cut(rest, ", socket "); ok {
			h.pid, _ = strconv.Atoi(pid)
			h.socket = socket
		}
	}
	return h, nil
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
