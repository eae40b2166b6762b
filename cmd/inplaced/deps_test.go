package main

import (
	"os/exec"
	"strings"
	"testing"
)

// linkedWhy says why a package must not be linked into inplaced, or "".
//
// client-go's full clientset (k8s.io/client-go/kubernetes), its scheme and
// its informers register the types of every API group at init and link the
// clients, listers and apply configurations of all of them: half of
// inplaced's executable (93.7 MB → 45.7 MB without them) and about 16 MiB
// of its resident memory on every node (49.6 → 32.4 MiB watching 60 pods),
// for a daemon that uses four core/v1 resources. pkg/kubeclient is the
// core/v1-only client that replaces them.
//
// github.com/cilium/ebpf comes in through the Manager of
// github.com/containerd/cgroups/v3/cgroup2 (1.5 MB of binary, 0.2 to 0.8 MB
// of resident memory at start); pkg/resources copies the two small
// functions it used from that package instead.
//
// client-go's gentype (it has the fake clients too, so it links
// k8s.io/client-go/testing) and tools/record both bring strategic merge
// patch, managed fields and the OpenAPI models (gnostic, kube-openapi's
// validation): 4.4 MB of binary and 1.3 MB of resident memory at start.
// pkg/kubeclient writes its five requests out and pkg/kube/events.go
// writes events.
func linkedWhy(pkg string) string {
	for _, p := range []string{"k8s.io/client-go/gentype", "k8s.io/client-go/testing", "k8s.io/client-go/tools/record",
		"k8s.io/apimachinery/pkg/util/strategicpatch", "k8s.io/apimachinery/pkg/util/managedfields", "github.com/google/gnostic-models"} {
		if pkg == p || strings.HasPrefix(pkg, p+"/") {
			return "links strategic merge patch and the OpenAPI models into inplaced (binary size, RSS on every node); use pkg/kubeclient and pkg/kube's event recorder"
		}
	}
	const why = "links every API group's types into inplaced (binary size, RSS on every node); use pkg/kubeclient (core/v1 only)"
	switch {
	case pkg == "github.com/cilium/ebpf", strings.HasPrefix(pkg, "github.com/cilium/ebpf/"):
		return "eBPF library linked by containerd/cgroups/v3/cgroup2's Manager (1.5 MB binary, 0.2-0.8 MB RSS); do not import cgroup2 outside tests"
	case pkg == "k8s.io/api/core/v1", pkg == "k8s.io/client-go/listers/core/v1":
		return ""
	case strings.HasPrefix(pkg, "k8s.io/api/"), strings.HasPrefix(pkg, "k8s.io/client-go/listers/"):
		return "an API group other than core/v1: " + why
	}
	for _, p := range []string{"k8s.io/client-go/kubernetes", "k8s.io/client-go/informers", "k8s.io/client-go/applyconfigurations"} {
		if pkg == p || strings.HasPrefix(pkg, p+"/") {
			return why
		}
	}
	return ""
}

// TestOnlyCoreV1Linked keeps the Kubernetes API groups other than core/v1
// (and client-go's all-group clientset, scheme and informers), what links
// strategic merge patch, and cilium/ebpf, out of inplaced.
func TestOnlyCoreV1Linked(t *testing.T) {
	if _, err := exec.LookPath("go"); err != nil {
		t.Skipf("no go command to list the dependencies: %v", err)
	}
	out, err := exec.Command("go", "list", "-deps", ".").Output()
	if err != nil {
		if ee, ok := err.(*exec.ExitError); ok {
			t.Fatalf("go list -deps: %v\n%s", err, ee.Stderr)
		}
		t.Fatalf("go list -deps: %v", err)
	}
	deps := strings.Fields(string(out))
	var core bool
	for _, pkg := range deps {
		if why := linkedWhy(pkg); why != "" {
			t.Errorf("inplaced links %s: %s", pkg, why)
		}
		core = core || pkg == "k8s.io/api/core/v1"
	}
	if !core {
		t.Errorf("k8s.io/api/core/v1 not among inplaced's %d dependencies: is the list right?", len(deps))
	}
}

func TestLinkedWhy(t *testing.T) {
	for pkg, bad := range map[string]bool{
		"k8s.io/api/core/v1":                           false,
		"k8s.io/client-go/listers/core/v1":             false,
		"k8s.io/client-go/listers":                     false,
		"k8s.io/client-go/tools/cache":                 false,
		"k8s.io/client-go/kubernetes-extra":            false,
		"k8s.io/api/apps/v1":                           true,
		"k8s.io/api/authentication/v1":                 true,
		"k8s.io/client-go/kubernetes":                  true,
		"k8s.io/client-go/kubernetes/scheme":           true,
		"k8s.io/client-go/kubernetes/typed/core/v1":    true,
		"k8s.io/client-go/informers":                   true,
		"k8s.io/client-go/informers/core/v1":           true,
		"k8s.io/client-go/listers/apps/v1":             true,
		"k8s.io/client-go/applyconfigurations/core/v1": true,
		"github.com/cilium/ebpf":                       true,
		"github.com/cilium/ebpf/link":                  true,
		"github.com/cilium/ebpfx":                      false,
		"github.com/containerd/cgroups/v3":             false,
		"k8s.io/client-go/gentype":                     true,
		"k8s.io/client-go/tools/record":                true,
		"k8s.io/apimachinery/pkg/util/strategicpatch":  true,
		"github.com/google/gnostic-models/openapiv2":   true,
	} {
		if got := linkedWhy(pkg) != ""; got != bad {
			t.Errorf("linkedWhy(%s) refuses: %v, want %v", pkg, got, bad)
		}
	}
}
