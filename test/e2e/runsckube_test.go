package e2e

import (
	"context"
	"fmt"
	"path"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	corev1 "k8s.io/api/core/v1"
	nodev1 "k8s.io/api/node/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	inplacedv1 "github.com/inplaced/inplaced/proto/inplaced/v1"
	"github.com/inplaced/inplaced/test/harness"
)

// TestRunscKubernetes: a pod of RuntimeClass runsc (gVisor, with a pod
// overhead) on a registered kubelet through inplaced in Kubernetes mode.
// An image patch (what `kubectl set image` sends) becomes an in-place swap
// that keeps the sentry, netns and IP, and kubelet adopts it; kubelet's own
// resize (the pods/resize subresource) passes through inplaced and the pod
// cgroup that holds the sandbox follows, overhead included.
func TestRunscKubernetes(t *testing.T) {
	harness.KubeletPrerequisites(t)
	harness.ControlPlanePrerequisites(t)
	requireRunsc(t)
	reg := harness.StartRegistry(t)
	cp := harness.StartControlPlane(t)
	km := startKubeMode(t, cp, harness.Containerd2, reg, "ipgv-")
	km.ctrd.RequireRunsc(t)
	e, k := km.env, km.k

	overhead := corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("32Mi"), corev1.ResourceCPU: resource.MustParse("100m")}
	rc := &nodev1.RuntimeClass{ObjectMeta: metav1.ObjectMeta{Name: harness.RuntimeHandlerRunsc}, Handler: harness.RuntimeHandlerRunsc,
		Overhead: &nodev1.Overhead{PodFixed: overhead}}
	if _, err := cp.Admin.NodeV1().RuntimeClasses().Create(ctx(t), rc, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create RuntimeClass runsc: %v", err)
	}
	t.Cleanup(func() {
		_ = cp.Admin.NodeV1().RuntimeClasses().Delete(context.Background(), rc.Name, metav1.DeleteOptions{})
	})

	limits := corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("128Mi"), corev1.ResourceCPU: resource.MustParse("500m")}
	before := km.createPodWith(t, "gv-web", km.imgs.App1, func(p *corev1.Pod) {
		rcName := harness.RuntimeHandlerRunsc
		p.Spec.RuntimeClassName = &rcName
		p.Spec.Containers[0].Resources = corev1.ResourceRequirements{Requests: limits, Limits: limits}
	})
	if before.Spec.Overhead.Memory().Cmp(resource.MustParse("32Mi")) != 0 {
		t.Fatalf("the API did not set the pod overhead from the RuntimeClass: %v", before.Spec.Overhead)
	}
	sb := km.sandboxOf(t, "gv-web")
	sbSt, _ := sandboxInfo(t, km.direct, sb)
	if sbSt.GetRuntimeHandler() != harness.RuntimeHandlerRunsc {
		t.Fatalf("pod sandbox runs on %q, want runsc", sbSt.GetRuntimeHandler())
	}
	pid := sentry(t, sb)
	ns := netns(t, pid)
	oldID := criID(appStatus(before))

	// `kubectl set image`: an in-place swap in the same gVisor sandbox.
	km.setImage(t, "gv-web", km.imgs.App2)
	after := km.waitInPlace(t, before, oldID, km.imgs.App2)
	if now := km.sandboxOf(t, "gv-web"); now != sb {
		t.Errorf("sandbox changed: %s → %s", short(sb), short(now))
	}
	if got := sentry(t, sb); got != pid {
		t.Errorf("sentry pid %d → %d", pid, got)
	}
	if got := netns(t, pid); got != ns {
		t.Errorf("sentry netns %s → %s", ns, got)
	}
	if v, err := httpGet("http://" + after.Status.PodIP + ":8080/version"); err != nil || v != "v2" {
		t.Errorf("/version after the swap: %q %v, want v2", v, err)
	}
	recs := km.kubeletSwaps(t, "gv-web")
	if len(recs) != 1 {
		t.Fatalf("%d kubelet-driven swap records, want 1: %v", len(recs), recs)
	}
	if r := recs[0]; r.State != inplacedv1.SwapState_SWAP_STATE_COMMITTED || !strings.HasPrefix(r.Handoff, "adopted") ||
		r.RuntimeHandler != harness.RuntimeHandlerRunsc || !r.SandboxKept {
		t.Fatalf("swap record: %v", r)
	}
	// kubelet adopted it: three sync periods without a create, stop or start.
	quiet := km.logOffset(t)
	time.Sleep(3 * kubeletSync)
	calls := km.kubeletCalls(t, quiet, sb)
	for _, m := range []string{"CreateContainer", "StopContainer", "StartContainer", "StopPodSandbox"} {
		if calls[m] != 0 {
			t.Errorf("kubelet called %s %d times in three sync periods after the swap", m, calls[m])
		}
	}

	// kubelet's own resize: 128Mi → 192Mi. kubelet sizes the pod cgroup (the
	// sandbox's) to the containers' limits plus the overhead.
	podCg := path.Join(k.CgroupRoot, "kubepods", "pod"+string(before.UID))
	want := int64(192+32) << 20
	if got := readCgroup(t, "memory", podCg, "memory.limit_in_bytes"); got != strconv.FormatInt(int64(128+32)<<20, 10) {
		t.Errorf("pod cgroup %s memory limit %s before the resize, want 128Mi + 32Mi overhead", podCg, got)
	}
	patch := `{"spec":{"containers":[{"name":"app","resources":{"requests":{"memory":"192Mi","cpu":"500m"},"limits":{"memory":"192Mi","cpu":"500m"}}}]}}`
	if _, err := cp.Admin.CoreV1().Pods(km.ns).Patch(ctx(t), "gv-web", types.StrategicMergePatchType, []byte(patch), metav1.PatchOptions{}, "resize"); err != nil {
		t.Fatalf("patch pods/resize: %v", err)
	}
	eventually(t, 90*time.Second, "pod cgroup at 192Mi + 32Mi overhead", func() error {
		if got := readCgroup(t, "memory", podCg, "memory.limit_in_bytes"); got != strconv.FormatInt(want, 10) {
			return fmt.Errorf("memory.limit_in_bytes %s", got)
		}
		return nil
	})
	km.cp.WaitPod(t, km.ns, "gv-web", time.Minute, func(p *corev1.Pod) error {
		s := appStatus(p)
		if s == nil || s.Resources == nil || s.Resources.Limits.Memory().Cmp(resource.MustParse("192Mi")) != 0 {
			return fmt.Errorf("app status resources %+v", s)
		}
		return nil
	})
	out, err := e.px.Ctl("resizes", "-o", "json")
	if err != nil {
		t.Fatal(err)
	}
	var l inplacedv1.ListResizesResponse
	if err := (protojson.UnmarshalOptions{DiscardUnknown: true}).Unmarshal([]byte(out), &l); err != nil {
		t.Fatalf("decode resizes: %v\n%s", err, out)
	}
	var rec *inplacedv1.ResizeRecord
	for _, r := range l.Resizes {
		if r.Pod == "gv-web" {
			rec = r
		}
	}
	if rec == nil || rec.Result != "applied" || rec.Method != "sandbox" || rec.Requested.GetMemoryLimitBytes() != 192<<20 ||
		rec.Verified == "" || !strings.Contains(rec.EnforcedBy, podCg) {
		t.Errorf("inplaced's record of kubelet's resize: %v", rec)
	}
	t.Logf("kubelet's resize as inplaced recorded it: %v", rec)
}
