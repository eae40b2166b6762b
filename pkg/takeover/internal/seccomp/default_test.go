package seccomp

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"
)

var update = flag.Bool("update", false, "copy containerd's seccomp_default.go into default.go")

const containerdModule = "github.com/containerd/containerd/v2"

// TestDefaultIsContainerds checks that default.go is the seccomp_default.go
// of the containerd module go.mod requires, byte for byte after the
// generated header.
func TestDefaultIsContainerds(t *testing.T) {
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}} {{.Version}}", containerdModule).Output()
	if err != nil {
		t.Skipf("go list -m %s (the go tool and the module cache are needed to compare): %v", containerdModule, err)
	}
	dir, version, _ := strings.Cut(strings.TrimSpace(string(out)), " ")
	src, err := os.ReadFile(filepath.Join(dir, "contrib", "seccomp", "seccomp_default.go"))
	if err != nil {
		t.Fatalf("containerd's default profile: %v", err)
	}
	want := append([]byte(fmt.Sprintf("// Code generated from %s@%s contrib/seccomp/seccomp_default.go"+
		" by TestDefaultIsContainerds -update. DO NOT EDIT.\n\n", containerdModule, version)), src...)
	if *update {
		if err := os.WriteFile("default.go", want, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	got, err := os.ReadFile("default.go")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("default.go is not containerd %s's seccomp_default.go: run go test ./pkg/takeover/internal/seccomp -run TestDefaultIsContainerds -update", version)
	}
}

// The copy works as containerd's does: capabilities add their rules.
func TestDefaultProfileFollowsCapabilities(t *testing.T) {
	names := func(p *specs.LinuxSeccomp) map[string]bool {
		m := map[string]bool{}
		for _, s := range p.Syscalls {
			if s.Action == specs.ActAllow && len(s.Args) == 0 {
				for _, n := range s.Names {
					m[n] = true
				}
			}
		}
		return m
	}
	plain := names(DefaultProfile(&specs.Spec{Process: &specs.Process{Capabilities: &specs.LinuxCapabilities{}}}))
	admin := names(DefaultProfile(&specs.Spec{Process: &specs.Process{Capabilities: &specs.LinuxCapabilities{
		Bounding: []string{"CAP_SYS_ADMIN"},
	}}}))
	if !plain["bind"] || plain["mount"] || !admin["mount"] {
		t.Fatalf("bind %v, mount without CAP_SYS_ADMIN %v, mount with it %v", plain["bind"], plain["mount"], admin["mount"])
	}
}
