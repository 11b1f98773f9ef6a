package flood

//go:generate go tool bpf2go -cc clang -cflags "-O2 -g -Wall -Werror -fno-strict-aliasing" -target bpfel -type rewrite_field -type count_slot Flood ../../bpf/flood.bpf.c -- -I../../bpf/include
