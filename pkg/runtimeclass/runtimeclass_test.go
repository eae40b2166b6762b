package runtimeclass

import (
	"strings"
	"testing"
)

func TestLookup(t *testing.T) {
	tab, err := New([]Class{
		{Handler: "kata-fc", Enforcement: SandboxCgroup, Overhead: Overhead{CPUMillis: 250, MemoryBytes: 64 << 20}},
		{Handler: "my*", Enforcement: ContainerCgroups},
		{Handler: "runsc-hostnet", Enforcement: SandboxCgroup, NetworkStack: HostKernel},
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		handler, runtimeType string
		want                 Enforcement
		stack                NetworkStack
		source               string
	}{
		{"runc", "", ContainerCgroups, HostKernel, "built-in"},
		{"crun", "", ContainerCgroups, HostKernel, "built-in"},
		{"", "", ContainerCgroups, HostKernel, "built-in"},
		{"", "io.containerd.runsc.v1", SandboxCgroup, SandboxStack, "runtime type io.containerd.runsc.v1"},
		{"runsc", "io.containerd.runsc.v1", SandboxCgroup, SandboxStack, "built-in"},
		{"gvisor", "", SandboxCgroup, SandboxStack, "built-in"},
		{"kata-qemu", "", VM, SandboxStack, "built-in"},
		{"kata-fc", "", SandboxCgroup, SandboxStack, "config"}, // the configuration wins over the built-in pattern; its stack by its kind
		{"myrunc", "", ContainerCgroups, HostKernel, "config"},
		{"runsc-hostnet", "io.containerd.runsc.v1", SandboxCgroup, HostKernel, "config"}, // said, not inferred
		{"secure", "io.containerd.kata-qemu.v2", VM, SandboxStack, "runtime type io.containerd.kata-qemu.v2"},
		{"secure", "io.containerd.runc.v2", ContainerCgroups, HostKernel, "runtime type io.containerd.runc.v2"},
		{"nvidia", "", Unknown, "", ""},
	} {
		got := tab.Lookup(c.handler, c.runtimeType)
		if got.Enforcement != c.want || got.NetworkStack != c.stack || got.Source != c.source || got.Handler != c.handler {
			t.Errorf("Lookup(%q, %q) = %+v, want %s, network stack %q, from %q", c.handler, c.runtimeType, got, c.want, c.stack, c.source)
		}
		if got.OwnNetworkStack() != (c.stack == SandboxStack) {
			t.Errorf("Lookup(%q, %q).OwnNetworkStack() = %v", c.handler, c.runtimeType, got.OwnNetworkStack())
		}
	}
	if o := tab.Lookup("kata-fc", "").Overhead; o.MemoryBytes != 64<<20 || o.CPUMillis != 250 {
		t.Errorf("configured overhead lost: %+v", o)
	}
}

func TestNewRefuses(t *testing.T) {
	for name, c := range map[string][]Class{
		"enforcement": {{Handler: "x", Enforcement: "cgroup"}},
		"unknown":     {{Handler: "x", Enforcement: Unknown}},
		"pattern":     {{Handler: "ka*ta", Enforcement: VM}},
		"twice":       {{Handler: "x", Enforcement: VM}, {Handler: "x", Enforcement: SandboxCgroup}},
		"overhead":    {{Handler: "x", Enforcement: VM, Overhead: Overhead{MemoryBytes: -1}}},
		"stack":       {{Handler: "x", Enforcement: VM, NetworkStack: "own"}},
	} {
		if _, err := New(c); err == nil || !strings.Contains(err.Error(), "runtimeClasses[") {
			t.Errorf("%s: New(%+v) = %v, want an error naming the entry", name, c, err)
		}
	}
}
