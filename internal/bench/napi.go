package bench

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"

	"github.com/moat-shield/moat/internal/lab"
)

// The netdev generic netlink family (include/uapi/linux/netdev.h): a dump
// of NAPI_GET filtered by interface lists each NAPI instance of the device
// with the pid of its kernel thread when the device runs threaded NAPI.
const (
	netdevCmdNAPIGet   = 11 // NETDEV_CMD_NAPI_GET
	netdevANAPIIfindex = 1  // NETDEV_A_NAPI_IFINDEX
	netdevANAPIPID     = 4  // NETDEV_A_NAPI_PID
)

// pfKthread is PF_KTHREAD in the flags field of /proc/PID/stat.
const pfKthread = 0x00200000

// taskCommLen is TASK_COMM_LEN: a kernel thread's name keeps 15 bytes.
const taskCommLen = 16

// pinnedNAPI is threaded NAPI on one veth end with its kernel threads
// pinned to one CPU. On the server's attacker-facing veth, pinned apart
// from the generator's CPU, the server takes the flood on a CPU of its own,
// and what it answers per second is that CPU's capacity rather than a
// share of the generator's.
type pinnedNAPI struct {
	b       *Bench
	host    *lab.Host
	dev     lab.Iface
	cpu     int
	how     string
	threads []napiThread
}

type napiThread struct {
	pid   int
	comm  string
	saved unix.CPUSet // affinity before pinning, put back on release
	// The scheduling policy before it was raised, put back on release:
	// a kernel before 6.17 keeps the thread when threaded NAPI goes off.
	sched *unix.SchedAttr
}

// generatorAndServerCPUs are the CPUs the generator and the server's NAPI
// thread run on: the generator (internal/flood, one thread, PinCPUs) takes
// the first CPU this process may use, the NAPI thread the next one.
func generatorAndServerCPUs() (gen, srv int, err error) {
	var set unix.CPUSet
	if err := unix.SchedGetaffinity(0, &set); err != nil {
		return 0, 0, fmt.Errorf("read this process's CPUs: %w", err)
	}
	var cpus []int
	for c := range 1024 {
		if set.IsSet(c) {
			cpus = append(cpus, c)
		}
	}
	if len(cpus) < 2 {
		return 0, 0, fmt.Errorf("separate CPUs for the generator and the server need two CPUs, this process may use %v", cpus)
	}
	return cpus[0], cpus[1], nil
}

// pinNAPI turns threaded NAPI on for the server's attacker-facing veth and
// pins the device's NAPI threads to the CPU after the generator's.
func (b *Bench) pinNAPI(ctx context.Context) (*pinnedNAPI, error) {
	_, cpu, err := generatorAndServerCPUs()
	if err != nil {
		return nil, err
	}
	return b.pinDeviceNAPI(ctx, b.lab.Server, b.serverIf(), cpu)
}

// pinReturnNAPI turns threaded NAPI on for the attacker's veth, which takes
// what the server sends back, and pins its threads to the generator's CPU.
// A veth runs its peer's NAPI for frames sent with XDP_TX on the sending
// CPU: without this, the server's CPU would also pay for taking its own
// SYN-ACKs in at the attacker's end and for handing their pages back to the
// generator's page pool, across CPUs, while the generator on the other CPU
// recycles pages into the same pool. A server's SYN-ACKs leave by a NIC,
// and the hosts they go to pay for receiving them.
func (b *Bench) pinReturnNAPI(ctx context.Context) (*pinnedNAPI, error) {
	gen, _, err := generatorAndServerCPUs()
	if err != nil {
		return nil, err
	}
	p, err := b.pinDeviceNAPI(ctx, b.lab.Attacker, b.attackerIf(), gen)
	if err != nil {
		return p, err
	}
	for i := range p.threads {
		t := &p.threads[i]
		old, err := unix.SchedGetAttr(t.pid, 0)
		if err == nil {
			t.sched = old
			attr := unix.SchedAttr{Size: unix.SizeofSchedAttr, Policy: unix.SCHED_FIFO, Priority: 1}
			err = unix.SchedSetAttr(t.pid, &attr, 0)
		}
		if err != nil {
			return p, errors.Join(fmt.Errorf("run %s (pid %d) at real-time priority: %w", t.comm, t.pid, err), p.release(context.WithoutCancel(ctx)))
		}
	}
	return p, nil
}

// pinDeviceNAPI turns threaded NAPI on for dev in host and pins the
// device's NAPI threads to cpu. The threads are those the kernel names for
// the device over netlink (netdev NAPI_GET); on a kernel that does not say,
// the napi/ kernel threads that appeared when threaded mode went on and
// whose name fits the device.
func (b *Bench) pinDeviceNAPI(ctx context.Context, host *lab.Host, iface lab.Iface, cpu int) (_ *pinnedNAPI, err error) {
	dev := iface.Name
	before, err := napiKernelThreads()
	if err != nil {
		return nil, err
	}
	if err := setThreadedNAPI(ctx, host, dev, true); err != nil {
		return nil, err
	}
	p := &pinnedNAPI{b: b, host: host, dev: iface, cpu: cpu}
	defer func() {
		if err != nil {
			err = errors.Join(err, p.release(context.WithoutCancel(ctx)))
		}
	}()
	after, err := napiKernelThreads()
	if err != nil {
		return nil, err
	}
	var pids []int
	nlErr := host.Do(func() error {
		var err error
		pids, err = napiThreadPIDs(iface.Index)
		return err
	})
	prefix := napiCommPrefix(dev)
	switch {
	case nlErr == nil && len(pids) > 0:
		p.how = fmt.Sprintf("named by the kernel over netlink (netdev NAPI_GET for %s)", dev)
		for _, pid := range pids {
			if comm, ok := after[pid]; !ok || !strings.HasPrefix(comm, prefix) {
				return p, fmt.Errorf("netlink names pid %d as a NAPI thread of %s, but it is not a kernel thread named %s* (%q)", pid, dev, prefix, comm)
			}
		}
	default:
		pids = newNAPIThreads(before, after, dev)
		p.how = fmt.Sprintf("the napi/ kernel threads named %s* that appeared when threaded NAPI went on (netlink: %v)", prefix, nlErr)
	}
	if len(pids) == 0 {
		return p, fmt.Errorf("no NAPI thread found for %s after turning threaded NAPI on", dev)
	}
	for _, pid := range pids {
		t := napiThread{pid: pid, comm: after[pid]}
		if err := unix.SchedGetaffinity(pid, &t.saved); err != nil {
			return p, fmt.Errorf("read the CPUs of %s (pid %d): %w", t.comm, pid, err)
		}
		var one unix.CPUSet
		one.Set(cpu)
		if err := unix.SchedSetaffinity(pid, &one); err != nil {
			return p, fmt.Errorf("pin %s (pid %d) to CPU %d: %w", t.comm, pid, cpu, err)
		}
		p.threads = append(p.threads, t)
	}
	return p, p.check()
}

// describe names the pinned threads for the results.
func (p *pinnedNAPI) describe() string {
	var ts []string
	for _, t := range p.threads {
		ts = append(ts, fmt.Sprintf("%s (pid %d)", t.comm, t.pid))
	}
	return fmt.Sprintf("%s pinned to CPU %d; found as %s", strings.Join(ts, ", "), p.cpu, p.how)
}

// check verifies that every pinned thread still runs and only on its CPU:
// a thread the kernel replaced (the device's NAPI set up anew) would run
// anywhere.
func (p *pinnedNAPI) check() error {
	if p == nil {
		return nil
	}
	for _, t := range p.threads {
		comm, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", t.pid))
		if err != nil || strings.TrimSpace(string(comm)) != t.comm {
			return fmt.Errorf("NAPI thread %s (pid %d) is gone", t.comm, t.pid)
		}
		var set unix.CPUSet
		if err := unix.SchedGetaffinity(t.pid, &set); err != nil {
			return fmt.Errorf("read the CPUs of %s (pid %d): %w", t.comm, t.pid, err)
		}
		if set.Count() != 1 || !set.IsSet(p.cpu) {
			return fmt.Errorf("NAPI thread %s (pid %d) is no longer pinned to CPU %d", t.comm, t.pid, p.cpu)
		}
	}
	return nil
}

// cpuTime is how long the pinned threads have run and waited to run (on
// the run queue, behind other tasks of their CPU) so far, summed, from
// /proc/PID/schedstat.
func (p *pinnedNAPI) cpuTime() (ran, waited time.Duration, err error) {
	if p == nil {
		return 0, 0, nil
	}
	for _, t := range p.threads {
		raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/schedstat", t.pid))
		if err != nil {
			return 0, 0, err
		}
		r, w, ok := parseSchedstat(string(raw))
		if !ok {
			return 0, 0, fmt.Errorf("/proc/%d/schedstat: %q", t.pid, raw)
		}
		ran, waited = ran+r, waited+w
	}
	return ran, waited, nil
}

// parseSchedstat reads the first two fields of /proc/PID/schedstat:
// nanoseconds on the CPU and nanoseconds waiting on a run queue.
func parseSchedstat(s string) (ran, waited time.Duration, ok bool) {
	f := strings.Fields(s)
	if len(f) < 2 {
		return 0, 0, false
	}
	r, err1 := strconv.ParseUint(f[0], 10, 64)
	w, err2 := strconv.ParseUint(f[1], 10, 64)
	return time.Duration(r), time.Duration(w), err1 == nil && err2 == nil
}

// napiUse is how a stretch of wall time went on the server's CPU: how much
// of it the pinned threads ran and waited to run, and how much the CPU was
// idle. Zero without pinned threads.
type napiUse struct {
	p      *pinnedNAPI
	t0     time.Time
	r0, w0 time.Duration
	c0     cpuTicks
}

// NAPIShares is what napiUse measured, as shares of the wall time.
type NAPIShares struct {
	Seconds float64 `json:"seconds"` // the wall time measured
	Ran     float64 `json:"napi_thread_ran"`
	Waited  float64 `json:"napi_thread_waited"` // runnable, behind other tasks of its CPU
	CPUIdle float64 `json:"server_cpu_idle"`    // the NAPI thread's CPU had nothing to run
}

func (p *pinnedNAPI) startUse() (napiUse, error) {
	if p == nil {
		return napiUse{}, nil
	}
	r, w, err := p.cpuTime()
	if err != nil {
		return napiUse{}, err
	}
	c, err := readCPUTicks(p.cpu)
	return napiUse{p: p, t0: time.Now(), r0: r, w0: w, c0: c}, err
}

// shares returns the shares of the wall time since startUse.
func (u napiUse) shares() (NAPIShares, error) {
	if u.p == nil {
		return NAPIShares{}, nil
	}
	r, w, err := u.p.cpuTime()
	if err != nil {
		return NAPIShares{}, err
	}
	c, err := readCPUTicks(u.p.cpu)
	if err != nil {
		return NAPIShares{}, err
	}
	wall := time.Since(u.t0)
	if wall <= 0 {
		return NAPIShares{}, nil
	}
	return NAPIShares{
		Seconds: wall.Seconds(),
		Ran:     float64(r-u.r0) / float64(wall),
		Waited:  float64(w-u.w0) / float64(wall),
		CPUIdle: c.idleShareSince(u.c0),
	}, nil
}

// cpuTicks is one CPU's line of /proc/stat: the ticks it spent idle (with
// iowait) and in all.
type cpuTicks struct{ idle, total uint64 }

func readCPUTicks(cpu int) (cpuTicks, error) {
	raw, err := os.ReadFile("/proc/stat")
	if err != nil {
		return cpuTicks{}, err
	}
	return parseCPUTicks(string(raw), cpu)
}

// parseCPUTicks finds "cpuN user nice system idle iowait irq softirq
// steal ..." in /proc/stat.
func parseCPUTicks(stat string, cpu int) (cpuTicks, error) {
	name := fmt.Sprintf("cpu%d", cpu)
	for _, line := range strings.Split(stat, "\n") {
		f := strings.Fields(line)
		if len(f) < 6 || f[0] != name {
			continue
		}
		var t cpuTicks
		for i, v := range f[1:min(len(f), 9)] {
			n, err := strconv.ParseUint(v, 10, 64)
			if err != nil {
				return cpuTicks{}, fmt.Errorf("/proc/stat %s: %q", name, line)
			}
			t.total += n
			if i == 3 || i == 4 { // idle, iowait
				t.idle += n
			}
		}
		return t, nil
	}
	return cpuTicks{}, fmt.Errorf("/proc/stat has no %s", name)
}

// idleShareSince is the share of the ticks since t0 that the CPU was idle.
func (t cpuTicks) idleShareSince(t0 cpuTicks) float64 {
	if t.total <= t0.total {
		return 0
	}
	return float64(t.idle-t0.idle) / float64(t.total-t0.total)
}

// release puts the threads' CPUs back and turns threaded NAPI off, which
// ends the threads.
func (p *pinnedNAPI) release(ctx context.Context) error {
	if p == nil {
		return nil
	}
	var errs []error
	for _, t := range p.threads {
		if err := unix.SchedSetaffinity(t.pid, &t.saved); err != nil && !errors.Is(err, unix.ESRCH) {
			errs = append(errs, fmt.Errorf("restore the CPUs of %s (pid %d): %w", t.comm, t.pid, err))
		}
		if t.sched == nil {
			continue
		}
		if err := unix.SchedSetAttr(t.pid, t.sched, 0); err != nil && !errors.Is(err, unix.ESRCH) {
			errs = append(errs, fmt.Errorf("restore the scheduling policy of %s (pid %d): %w", t.comm, t.pid, err))
		}
	}
	p.threads = nil
	return errors.Join(append(errs, setThreadedNAPI(ctx, p.host, p.dev.Name, false))...)
}

// napiCommPrefix is how the names of a device's NAPI threads start: the
// kernel names them napi/DEV-ID and keeps the first 15 bytes.
func napiCommPrefix(dev string) string {
	s := "napi/" + dev + "-"
	return s[:min(len(s), taskCommLen-1)]
}

// newNAPIThreads are the threads in after but not in before whose name fits
// dev's NAPI threads, sorted.
func newNAPIThreads(before, after map[int]string, dev string) []int {
	prefix := napiCommPrefix(dev)
	var out []int
	for pid, comm := range after {
		if _, old := before[pid]; !old && strings.HasPrefix(comm, prefix) {
			out = append(out, pid)
		}
	}
	slices.Sort(out)
	return out
}

// napiKernelThreads lists the kernel threads whose name starts with napi/.
func napiKernelThreads() (map[int]string, error) {
	dirs, err := filepath.Glob("/proc/[0-9]*")
	if err != nil {
		return nil, err
	}
	out := map[int]string{}
	for _, d := range dirs {
		pid, err := strconv.Atoi(filepath.Base(d))
		if err != nil {
			continue
		}
		comm, err := os.ReadFile(filepath.Join(d, "comm"))
		if err != nil || !strings.HasPrefix(string(comm), "napi/") {
			continue // gone meanwhile, or another thread
		}
		stat, err := os.ReadFile(filepath.Join(d, "stat"))
		if err != nil {
			continue
		}
		if flags, ok := statFlags(string(stat)); ok && flags&pfKthread != 0 {
			out[pid] = strings.TrimSpace(string(comm))
		}
	}
	return out, nil
}

// statFlags reads the flags field (the ninth) of a /proc/PID/stat line; the
// name in parentheses may hold spaces, so fields count from its end.
func statFlags(stat string) (uint64, bool) {
	i := strings.LastIndexByte(stat, ')')
	if i < 0 {
		return 0, false
	}
	f := strings.Fields(stat[i+1:])
	if len(f) < 7 {
		return 0, false
	}
	v, err := strconv.ParseUint(f[6], 10, 64)
	return v, err == nil
}

// napiThreadPIDs asks the kernel, in the calling thread's network
// namespace, for the pids of the NAPI threads of a device; none when the
// device does not run threaded NAPI.
func napiThreadPIDs(ifindex int) ([]int, error) {
	fam, err := netlink.GenlFamilyGet("netdev")
	if err != nil {
		return nil, fmt.Errorf("generic netlink family netdev: %w", err)
	}
	req := nl.NewNetlinkRequest(int(fam.ID), unix.NLM_F_DUMP)
	req.AddData(genlHeader{cmd: netdevCmdNAPIGet, version: 1})
	req.AddData(nl.NewRtAttr(netdevANAPIIfindex, nl.Uint32Attr(uint32(ifindex))))
	msgs, err := req.Execute(unix.NETLINK_GENERIC, 0)
	if err != nil {
		return nil, fmt.Errorf("netdev NAPI_GET for ifindex %d: %w", ifindex, err)
	}
	var pids []int
	for _, m := range msgs {
		if len(m) < nl.SizeofGenlmsg {
			continue
		}
		attrs, err := nl.ParseRouteAttr(m[nl.SizeofGenlmsg:])
		if err != nil {
			return nil, err
		}
		var idx, pid uint32
		for _, a := range attrs {
			if len(a.Value) < 4 {
				continue
			}
			switch a.Attr.Type {
			case netdevANAPIIfindex:
				idx = nl.NativeEndian().Uint32(a.Value)
			case netdevANAPIPID:
				pid = nl.NativeEndian().Uint32(a.Value)
			}
		}
		if int(idx) == ifindex && pid != 0 {
			pids = append(pids, int(pid))
		}
	}
	slices.Sort(pids)
	return pids, nil
}

// genlHeader is a generic netlink header with its reserved bytes zero, as
// families with strict validation (netdev) insist. nl.Genlmsg serializes
// four bytes from a two-byte struct, so its reserved bytes are whatever
// follows it in memory.
type genlHeader struct{ cmd, version uint8 }

func (h genlHeader) Len() int          { return nl.SizeofGenlmsg }
func (h genlHeader) Serialize() []byte { return []byte{h.cmd, h.version, 0, 0} }
