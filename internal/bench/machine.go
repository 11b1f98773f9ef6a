package bench

import (
	"bufio"
	"bytes"
	"os"
	"os/exec"
	"runtime"
	"strings"

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
	LoadBefore string            `json:"loadavg_before"`
	LoadAfter  string            `json:"loadavg_after"`
}

func machineInfo(versions map[string]string) Machine {
	m := Machine{VCPUs: runtime.NumCPU(), Go: runtime.Version(), Tools: versions, LoadBefore: loadAvg()}
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
