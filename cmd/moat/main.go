// Command moat is an XDP/eBPF DDoS shield for Linux hosts.
package main

import (
	"os"

	"github.com/moat-shield/moat/internal/cli"
)

func main() {
	os.Exit(cli.Main(os.Args[1:], os.Stdout, os.Stderr))
}
