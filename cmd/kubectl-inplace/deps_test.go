package main

import (
	"os/exec"
	"strings"
	"testing"
)

// maxDeps bounds how many packages kubectl-inplace links (go list -deps,
// the standard library included). It linked 717 when the annotation
// contract lived in pkg/kube, which brought the whole daemon (swap engine,
// relay, bbolt store, grpc, the control API), and then 590 with
// client-go's full clientset; 328 with pkg/kube/podapi and pkg/kubeclient,
// client-go's rest client, clientcmd, cobra and sigs.k8s.io/yaml.
const maxDeps = 350

// ownAllowed are the only packages of this module kubectl-inplace may
// link: the pod API contract (with the swap strategies' vocabulary and the
// enum package it reads it with, leaves of the standard library), the
// change flags it shares with inplacectl swap and the core/v1 client.
var ownAllowed = map[string]bool{
	"github.com/inplaced/inplaced/cmd/kubectl-inplace": true,
	"github.com/inplaced/inplaced/pkg/kube/podapi":     true,
	"github.com/inplaced/inplaced/pkg/kubeclient":      true,
	"github.com/inplaced/inplaced/pkg/strategy":        true,
	"github.com/inplaced/inplaced/pkg/internal/enum":   true,
	"github.com/inplaced/inplaced/pkg/swapflags":       true,
}

// linkedWhy says why a package must not be linked into kubectl-inplace,
// or "".
//
// The plugin writes the inplaced.io/swap annotation and reads the status
// inplaced writes back: it needs the pod API contract (pkg/kube/podapi),
// a pods client and the kubeconfig loader, nothing of the daemon. Every
// other package of this module leads to the daemon (pkg/kube is the node's
// controller and links the swap engine), and so do grpc, the control API's
// protobuf and bbolt. client-go's full clientset and informers register
// and link every API group for a plugin that reads and patches pods.
func linkedWhy(pkg string) string {
	const module = "github.com/inplaced/inplaced"
	if pkg == module || strings.HasPrefix(pkg, module+"/") {
		if ownAllowed[pkg] {
			return ""
		}
		return "a package of the daemon: kubectl-inplace needs only pkg/kube/podapi (the pod API contract) and pkg/kubeclient"
	}
	for _, p := range []string{"google.golang.org/grpc", "google.golang.org/protobuf", "go.etcd.io/bbolt",
		"github.com/containerd", "k8s.io/cri-api", "go.uber.org/zap"} {
		if pkg == p || strings.HasPrefix(pkg, p+"/") {
			return "the daemon's (CRI, control API, store, logging): kubectl-inplace talks to the API server only"
		}
	}
	for _, p := range []string{"k8s.io/client-go/kubernetes", "k8s.io/client-go/informers", "k8s.io/client-go/applyconfigurations"} {
		if pkg == p || strings.HasPrefix(pkg, p+"/") {
			return "links every API group's types and clients: use pkg/kubeclient (core/v1 only)"
		}
	}
	return ""
}

// TestLinksNoDaemon keeps kubectl-inplace a small client of the pod API:
// no package of the daemon, at most maxDeps packages in all.
func TestLinksNoDaemon(t *testing.T) {
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
	var podapi bool
	for _, pkg := range deps {
		if why := linkedWhy(pkg); why != "" {
			t.Errorf("kubectl-inplace links %s: %s", pkg, why)
		}
		podapi = podapi || pkg == "github.com/inplaced/inplaced/pkg/kube/podapi"
	}
	if !podapi {
		t.Errorf("pkg/kube/podapi not among kubectl-inplace's %d dependencies: is the list right?", len(deps))
	}
	if len(deps) > maxDeps {
		t.Errorf("kubectl-inplace links %d packages, at most %d: what brought the new ones in?", len(deps), maxDeps)
	}
	t.Logf("%d packages linked", len(deps))
}

func TestLinkedWhy(t *testing.T) {
	for pkg, bad := range map[string]bool{
		"github.com/inplaced/inplaced/pkg/kube/podapi":        false,
		"github.com/inplaced/inplaced/pkg/kubeclient":         false,
		"github.com/inplaced/inplaced/pkg/strategy":           false,
		"github.com/inplaced/inplaced/pkg/internal/enum":      false,
		"github.com/inplaced/inplaced/pkg/swapflags":          false,
		"github.com/inplaced/inplaced/cmd/kubectl-inplace":    false,
		"github.com/inplaced/inplaced/pkg/kube":               true,
		"github.com/inplaced/inplaced/pkg/swap":               true,
		"github.com/inplaced/inplaced/pkg/relay":              true,
		"github.com/inplaced/inplaced/pkg/store":              true,
		"github.com/inplaced/inplaced/proto/inplaced/v1":      true,
		"github.com/inplaced/inplaced":                        true,
		"github.com/inplaced/inplacedx":                       false,
		"google.golang.org/grpc":                              true,
		"google.golang.org/grpc/codes":                        true,
		"google.golang.org/protobuf/proto":                    true,
		"go.etcd.io/bbolt":                                    true,
		"github.com/containerd/containerd/v2/client":          true,
		"k8s.io/cri-api/pkg/apis/runtime/v1":                  true,
		"go.uber.org/zap":                                     true,
		"k8s.io/client-go/kubernetes":                         true,
		"k8s.io/client-go/kubernetes/typed/core/v1":           true,
		"k8s.io/client-go/informers":                          true,
		"k8s.io/client-go/applyconfigurations/core/v1":        true,
		"k8s.io/client-go/rest":                               false,
		"k8s.io/client-go/tools/clientcmd":                    false,
		"k8s.io/api/core/v1":                                  false,
		"golang.org/x/net/http2":                              false,
		"k8s.io/apimachinery/pkg/runtime/serializer/protobuf": false,
	} {
		if got := linkedWhy(pkg) != ""; got != bad {
			t.Errorf("linkedWhy(%s) refuses: %v, want %v", pkg, got, bad)
		}
	}
}
