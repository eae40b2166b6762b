package runtimeclass

import (
	"strings"
	"testing"
)

func TestLookup(t *testing.T) {
	tab, err := New([]Class{
		{Handler: "kata-fc", Enforcement: SandboxCgroup, Overhead: Overhead{CPUMillis: 250, MemoryBytes: 64 << 20}},
		{Handler: "my*", Enforcement: ContainerCgroups},
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		handler, runtimeType string
		want                 Enforcement
		source               string
	}{
		{"runc", "", ContainerCgroups, "built-in"},
		{"", "", ContainerCgroups, "built-in"},
		{"", "io.containerd.runsc.v1", SandboxCgroup, "runtime type io.containerd.runsc.v1"},
		{"runsc", "io.containerd.runsc.v1", SandboxCgroup, "built-in"},
		{"kata-qemu", "", VM, "built-in"},
		{"kata-fc", "", SandboxCgroup, "config"}, // the configuration wins over the built-in pattern
		{"myrunc", "", ContainerCgroups, "config"},
		{"secure", "io.containerd.kata-qemu.v2", VM, "runtime type io.containerd.kata-qemu.v2"},
		{"secure", "io.containerd.runc.v2", ContainerCgroups, "runtime type io.containerd.runc.v2"},
		{"nvidia", "", Unknown, ""},
	} {
		got := tab.Lookup(c.handler, c.runtimeType)
		if got.Enforcement != c.want || got.Source != c.source || got.Handler != c.handler {
			t.Errorf("Lookup(%q, %q) = %+v, want %s from %q", c.handler, c.runtimeType, got, c.want, c.source)
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
	} {
		if _, err := New(c); err == nil || !strings.Contains(err.Error(), "runtimeClasses[") {
			t.Errorf("%s: New(%+v) = %v, want an error naming the entry", name, c, err)
		}
	}
}
