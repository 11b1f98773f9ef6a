// Package datapath holds the compiled XDP filter and the Go types that
// bpf2go generates from its C headers.
package datapath

//go:generate go tool bpf2go -cc clang -cflags "-O2 -g -Wall -Werror" -target bpfel -type host_v4 -type host_v6 -type net_v4 -type net_v6 -type prefix_rule -type comment_key -type comment -type port_rule -type port_rule_def -type verdict_counter -type runtime_settings -type verdict_reason -type port_class -type rule_action -type fragment_policy -type malformed_policy -type syn_port -type syn_port_stats -type syn_key -type syn_key_state -type syn_config -type syn_mode -type syn_cookie_bits -type syn_cookie_msg Moat ../../bpf/moat.bpf.c -- -I../../bpf/include
