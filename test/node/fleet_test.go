package node

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/inplaced/inplaced/test/harness"
)

// fleetTest is the guest suite that installs inplaced with the chart on a
// node whose kubelet is still on containerd: run.sh runs it on its own,
// before it installs inplaced by hand for the other suites. fleetK3sTest
// does the same on a k3s agent node: run.sh runs it after fleetTest, with
// kubelet.service stopped and k3s-agent.service joined to the k3s server
// this test runs (k3sControlPlane).
const (
	fleetTest    = "TestFleet"
	fleetK3sTest = "TestFleetK3s"
)

// fleetTags are the two versions of inplaced's image the guest's registry
// serves: the chart installs the first and upgrades to the second. Their
// binaries differ (the version is linked in), so the upgrade replaces
// inplaced's binary and restarts it.
var fleetTags = []string{"fleet-v1", "fleet-v2"}

// splitFleet takes the fleet suites out of the guest tests listed: each
// runs as a suite of its own. fleet and k3s say which were listed.
func splitFleet(tests []string) (rest []string, fleet, k3s bool) {
	fleet, k3s = slices.Contains(tests, fleetTest), slices.Contains(tests, fleetK3sTest)
	rest = slices.DeleteFunc(slices.Clone(tests), func(s string) bool { return s == fleetTest || s == fleetK3sTest })
	return rest, fleet, k3s
}

// k3sPayload puts k3s (hack/build-k3s.sh's build) in dir for the guest's
// k3s-agent.service.
func k3sPayload(t *testing.T, dir string) {
	t.Helper()
	harness.Require(t, "k3s "+harness.K3sVersion, fileExists(harness.K3sPath()), harness.K3sPath()+" not found; run hack/build-k3s.sh")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	copyFile(t, harness.K3sPath(), filepath.Join(dir, "k3s"))
}

// fleetPayload puts in dir what the fleet suite needs in the guest: helm
// (hack/install-deps.sh builds it from the Go module proxy), the chart, and
// one OCI layout per fleetTags entry of the image make image builds (linux/amd64
// only: the guest's platform), its binaries linked with that version.
func fleetPayload(t *testing.T, root, dir string) {
	t.Helper()
	helm := filepath.Join(harness.ToolsDir(), "bin", "helm")
	harness.Require(t, "helm", fileExists(helm), helm+" not found; run hack/install-deps.sh")
	for _, d := range []string{"chart/templates", "images"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	copyFile(t, helm, filepath.Join(dir, "helm"))
	chart := filepath.Join(root, "deploy/helm/inplaced")
	for _, sub := range []string{".", "templates"} {
		entries, err := os.ReadDir(filepath.Join(chart, sub))
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range entries {
			if !e.IsDir() {
				copyFile(t, filepath.Join(chart, sub, e.Name()), filepath.Join(dir, "chart", sub, e.Name()))
			}
		}
	}
	tool := filepath.Join(t.TempDir(), "image")
	goCmd(t, root, "build", "-o", tool, "./hack/image")
	bins := []string{"inplaced", "inplacectl", "inplaced-installer"}
	for _, tag := range fleetTags {
		binDir := filepath.Join(t.TempDir(), tag)
		args := []string{"build", "-trimpath", "-ldflags",
			"-s -w -X github.com/inplaced/inplaced/pkg/version.Version=" + tag, "-o", binDir + "/"}
		for _, b := range bins {
			args = append(args, "./cmd/"+b)
		}
		goCmd(t, root, args...)
		for _, b := range bins {
			if err := os.Rename(filepath.Join(binDir, b), filepath.Join(binDir, b+"-linux-amd64")); err != nil {
				t.Fatal(err)
			}
		}
		run(t, root, tool, "-bin-dir", binDir, "-platforms", "linux/amd64", "-bins", "inplaced inplacectl inplaced-installer",
			"-entrypoint", "inplaced-installer", "-version", tag, "-source", root, "-layout", filepath.Join(dir, "images", tag))
	}
}

// run runs name with args in dir and fails t with its output if it fails.
func run(t *testing.T, dir, name string, args ...string) {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%s %s: %v\n%s", filepath.Base(name), strings.Join(args, " "), err, out)
	}
}
