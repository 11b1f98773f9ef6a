#!/usr/bin/env bash
# Installs what building and testing moat needs on Debian 12, idempotently:
# a Go toolchain recent enough for go.mod, clang/llvm and libbpf headers for
# the BPF programs, and the network tools the lab and tests use. Run as root.
set -euo pipefail

need_go="$(awk '/^go /{print $2}' "$(dirname "$0")/../go.mod")"
packages=(clang llvm libbpf-dev linux-libc-dev iproute2 ethtool iputils-ping nftables tcpdump tshark ca-certificates git make)
if [ "${MOAT_SETUP_BENCH:-0}" = 1 ]; then
	packages+=(xdp-tools)
fi

missing=()
for p in "${packages[@]}"; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# Compiling the BPF programs (make generate) needs <asm/...> and glibc's
# headers without a multiarch directory, which clang's BPF target does not
# search: Debian's gcc-multilib links /usr/include/asm and brings the 32-bit
# glibc stubs. Tests and builds use the committed objects and need neither.
if [ "${MOAT_SETUP_GENERATE:-0}" = 1 ] && [ ! -e /usr/include/asm ]; then
	if [ "$(dpkg --print-architecture)" = amd64 ]; then
		missing+=(gcc-multilib)
	else
		echo "setup: /usr/include/asm is missing; link it to /usr/include/$(uname -m)-linux-gnu/asm to compile the BPF programs" >&2
	fi
fi

go_ok() {
	command -v go >/dev/null 2>&1 || return 1
	local have
	have="$(go env GOVERSION 2>/dev/null | sed 's/^go//')"
	[ -n "$have" ] && [ "$(printf '%s\n%s\n' "$need_go" "$have" | sort -V | head -1)" = "$need_go" ]
}
if ! go_ok && ! command -v go >/dev/null 2>&1; then
	missing+=(golang-go)
fi

if [ ${#missing[@]} -gt 0 ]; then
	echo "setup: installing ${missing[*]}"
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -qq
	apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# Debian 12's own Go is too old for go.mod. The Go module proxy serves
# release toolchains as ordinary modules (golang.org/toolchain), so fetch
# the one go.mod names with the Go we have and put it on the PATH.
if ! go_ok; then
	arch="$(dpkg --print-architecture)"
	mod="golang.org/toolchain@v0.0.1-go${need_go}.linux-${arch}"
	echo "setup: installing Go ${need_go} from the module proxy"
	tmp="$(mktemp -d)"
	dir="$(cd "$tmp" && GOFLAGS=-mod=mod GOTOOLCHAIN=local go mod download -json "$mod" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')"
	rm -rf "$tmp"
	[ -x "$dir/bin/go" ] || { echo "setup: could not fetch $mod" >&2; exit 1; }
	rm -rf /usr/local/go
	cp -r "$dir" /usr/local/go
	chmod -R u+w /usr/local/go
	ln -sf /usr/local/go/bin/go /usr/local/bin/go
	ln -sf /usr/local/go/bin/gofmt /usr/local/bin/gofmt
fi

# bpffs, for the pins.
if ! mount | grep -q ' /sys/fs/bpf type bpf'; then
	mount -t bpf bpf /sys/fs/bpf
fi
