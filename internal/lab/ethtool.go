package lab

import (
	"fmt"
	"runtime"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The legacy ethtool ioctls are enough for the two flags the lab needs and
// avoid both an ethtool process per interface and the string-set dance of
// ETHTOOL_SFEATURES.

// ethtoolValue is struct ethtool_value from <linux/ethtool.h>.
type ethtoolValue struct {
	cmd  uint32
	data uint32
}

// ifreqData is struct ifreq with the ifr_data member of the union, padded to
// the kernel's 40 bytes.
type ifreqData struct {
	name [unix.IFNAMSIZ]byte
	data unsafe.Pointer
	_    [40 - unix.IFNAMSIZ - 8]byte
}

// ethtoolIoctl runs one ethtool_value command on ifname in the calling
// thread's network namespace.
func ethtoolIoctl(ifname string, cmd, data uint32) (uint32, error) {
	if len(ifname) >= unix.IFNAMSIZ {
		return 0, fmt.Errorf("interface name %q too long", ifname)
	}
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return 0, err
	}
	defer unix.Close(fd)
	val := &ethtoolValue{cmd: cmd, data: data}
	req := &ifreqData{data: unsafe.Pointer(val)}
	copy(req.name[:], ifname)
	_, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.SIOCETHTOOL, uintptr(unsafe.Pointer(req)))
	runtime.KeepAlive(val)
	runtime.KeepAlive(req)
	if errno != 0 {
		return 0, errno
	}
	return val.data, nil
}

// setEthtoolFlag sets a boolean offload with setCmd (ETHTOOL_SGRO, ...) and
// reads it back with getCmd, since a feature the device cannot honour is
// silently left off.
func setEthtoolFlag(ifname string, getCmd, setCmd uint32, on bool) error {
	var want uint32
	if on {
		want = 1
	}
	if _, err := ethtoolIoctl(ifname, setCmd, want); err != nil {
		return err
	}
	got, err := ethtoolIoctl(ifname, getCmd, 0)
	if err != nil {
		return err
	}
	if (got != 0) != on {
		return fmt.Errorf("ethtool command %#x: asked %v, kernel kept %v", setCmd, on, got != 0)
	}
	return nil
}

// OffloadSegmentation turns tx checksum offload and TSO on for one of h's
// interfaces, where the lab turns checksum offload off for the client and
// attacker: h's TCP then leaves in aggregates up to the interface's GSO
// size, which a veth hands over whole.
func (h *Host) OffloadSegmentation(iface string) error {
	return h.Do(func() error {
		if err := setEthtoolFlag(iface, unix.ETHTOOL_GTXCSUM, unix.ETHTOOL_STXCSUM, true); err != nil {
			return fmt.Errorf("lab: tx checksum on %s in %s: %w", iface, h.Name, err)
		}
		if err := setEthtoolFlag(iface, unix.ETHTOOL_GTSO, unix.ETHTOOL_STSO, true); err != nil {
			return fmt.Errorf("lab: tso on %s in %s: %w", iface, h.Name, err)
		}
		return nil
	})
}
