package bench

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Machine says where the figures come from.
type Machine struct {
	CPU        string            `json:"cpu"`
	VCPUs      int               `json:"vcpus"`
	Kernel     string            `json:"kernel"`
	Hypervisor string            `json:"hypervisor,omitempty"`
	MemoryMB   uint64            `json:"memory_mb"`
	Go         string            `json:"go"`
	Commit     string            `json:"commit"`
	Tools      map[string]string `json:"tools"`
	Scheduler  string            `json:"scheduler,omitempty"`
	LoadBefore string            `json:"loadavg_before"`
	LoadAfter  string            `json:"loadavg_after"`
}

func machineInfo(versions map[string]string) Machine {
	m := Machine{VCPUs: runtime.NumCPU(), Go: runtime.Version(), Tools: versions, LoadBefore: loadAvg(), Scheduler: schedulerText(kernelConfig(), kernelCmdline())}
	if raw, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		sc := bufio.NewScanner(bytes.NewReader(raw))
		for sc.Scan() {
			k, v, ok := strings.Cut(sc.Text(), ":")
			if ok && strings.TrimSpace(k) == "model name" {
				m.CPU = strings.TrimSpace(v)
				break
			}
		}
	}
	var u unix.Utsname
	if unix.Uname(&u) == nil {
		m.Kernel = unix.ByteSliceToString(u.Sysname[:]) + " " + unix.ByteSliceToString(u.Release[:]) + " " + unix.ByteSliceToString(u.Machine[:])
	}
	if out, err := exec.Command("lscpu").Output(); err == nil {
		for _, line := range strings.Split(string(out), "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "Hypervisor vendor" {
				m.Hypervisor = strings.TrimSpace(v)
			}
		}
	}
	var si unix.Sysinfo_t
	if unix.Sysinfo(&si) == nil {
		m.MemoryMB = uint64(si.Totalram) * uint64(si.Unit) >> 20
	}
	if out, err := exec.Command("git", "rev-parse", "--short", "HEAD").Output(); err == nil {
		m.Commit = strings.TrimSpace(string(out))
		if st, err := exec.Command("git", "status", "--porcelain", "--untracked-files=no").Output(); err == nil && len(bytes.TrimSpace(st)) > 0 {
			m.Commit += " with uncommitted changes"
		}
	}
	return m
}

// toolVersions asks the packages and tools that run for their versions.
func toolVersions() map[string]string {
	v := map[string]string{}
	for _, pkg := range []string{"nftables", "xdp-tools"} {
		if out, err := exec.Command("dpkg-query", "-W", "-f=${Version}", pkg).Output(); err == nil {
			v[pkg] = "Debian " + pkg + " " + strings.TrimSpace(string(out))
		}
	}
	if out, err := exec.Command("nft", "--version").Output(); err == nil && v["nftables"] == "" {
		v["nftables"] = strings.TrimSpace(string(out))
	}
	return v
}

func loadAvg() string {
	raw, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return ""
	}
	f := strings.Fields(string(raw))
	if len(f) < 3 {
		return ""
	}
	return strings.Join(f[:3], " ")
}

// kernelConfig reads the running kernel's build options from
// /proc/config.gz or /boot/config-RELEASE; nil when neither is there.
func kernelConfig() map[string]string {
	var raw []byte
	if f, err := os.Open("/proc/config.gz"); err == nil {
		defer f.Close()
		if zr, err := gzip.NewReader(f); err == nil {
			raw, _ = io.ReadAll(zr)
		}
	}
	if raw == nil {
		var u unix.Utsname
		if unix.Uname(&u) == nil {
			raw, _ = os.ReadFile("/boot/config-" + unix.ByteSliceToString(u.Release[:]))
		}
	}
	if raw == nil {
		return nil
	}
	cfg := map[string]string{}
	for _, line := range strings.Split(string(raw), "\n") {
		if k, v, ok := strings.Cut(line, "="); ok && strings.HasPrefix(k, "CONFIG_") {
			cfg[k] = v
		}
	}
	return cfg
}

// kernelCmdline is the running kernel's command line.
func kernelCmdline() string {
	raw, _ := os.ReadFile("/proc/cmdline")
	return string(raw)
}

// schedulerText says how often the scheduler ticks and whether kernel
// code is preempted, which bounds how long a woken thread may wait for a
// CPU that a kernel thread keeps busy. A kernel built with dynamic
// preemption takes the mode from preempt= on its command line.
func schedulerText(cfg map[string]string, cmdline string) string {
	tick := schedulerTick(cfg)
	if tick == 0 {
		return ""
	}
	s := fmt.Sprintf("HZ=%s (a tick every %s)", cfg["CONFIG_HZ"], tick)
	mode := ""
	for _, m := range []struct{ key, name string }{
		{"CONFIG_PREEMPT_NONE", "none"}, {"CONFIG_PREEMPT_VOLUNTARY", "voluntary"},
		{"CONFIG_PREEMPT", "full"}, {"CONFIG_PREEMPT_LAZY", "lazy"}, {"CONFIG_PREEMPT_RT", "realtime"},
	} {
		if cfg[m.key] == "y" {
			mode = m.name
		}
	}
	if cfg["CONFIG_PREEMPT_DYNAMIC"] == "y" {
		for _, f := range strings.Fields(cmdline) {
			if v, ok := strings.CutPrefix(f, "preempt="); ok {
				mode = v
			}
		}
	}
	if mode != "" {
		s += ", preemption " + mode
	}
	return s
}

// schedulerTick is the scheduler tick of a kernel built with cfg, zero
// when cfg does not say.
func schedulerTick(cfg map[string]string) time.Duration {
	hz, err := strconv.Atoi(cfg["CONFIG_HZ"])
	if err != nil || hz <= 0 {
		return 0
	}
	return time.Second / time.Duration(hz)
}

// tickText is how long this kernel's scheduler tick is.
func tickText() string {
	if tick := schedulerTick(kernelConfig()); tick != 0 {
		return tick.String()
	}
	return "unknown"
}
