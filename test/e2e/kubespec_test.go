package e2e

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes/scheme"

	"github.com/inplaced/inplaced/pkg/kube"
	"github.com/inplaced/inplaced/pkg/kube/podapi"
)

// applyRBAC creates the objects of deploy/kubernetes/rbac.yaml (kept if
// they exist: the control plane is shared by both backends) and returns a
// kubeconfig that authenticates as its ServiceAccount.
func (km *kmenv) applyRBAC(t *testing.T) string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("..", "..", "deploy", "kubernetes", "rbac.yaml")) // go test runs in test/e2e
	if err != nil {
		t.Fatal(err)
	}
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	var sa *corev1.ServiceAccount
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("rbac.yaml: %v", err)
		}
		if len(bytes.TrimSpace(doc)) == 0 {
			continue
		}
		obj, _, err := scheme.Codecs.UniversalDeserializer().Decode(doc, nil, nil)
		if err != nil {
			t.Fatalf("rbac.yaml: %v", err)
		}
		switch o := obj.(type) {
		case *corev1.ServiceAccount:
			sa = o
			_, err = km.cp.Admin.CoreV1().ServiceAccounts(o.Namespace).Create(ctx(t), o, metav1.CreateOptions{})
		case *rbacv1.ClusterRole:
			_, err = km.cp.Admin.RbacV1().ClusterRoles().Create(ctx(t), o, metav1.CreateOptions{})
		case *rbacv1.ClusterRoleBinding:
			_, err = km.cp.Admin.RbacV1().ClusterRoleBindings().Create(ctx(t), o, metav1.CreateOptions{})
		default:
			t.Fatalf("rbac.yaml: unexpected %T", obj)
		}
		if err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatalf("rbac.yaml: create: %v", err)
		}
	}
	if sa == nil {
		t.Fatal("rbac.yaml has no ServiceAccount")
	}
	return km.cp.ServiceAccountKubeconfig(t, sa.Namespace, sa.Name)
}

// restartWithKubeconfig restarts inplaced with another identity.
func (km *kmenv) restartWithKubeconfig(t *testing.T, kubeconfig string) {
	t.Helper()
	if err := km.px.Stop(); err != nil {
		t.Fatal(err)
	}
	args := append([]string(nil), km.px.ExtraArgs...)
	for i := range args {
		if args[i] == "--kubeconfig" && i+1 < len(args) {
			args[i+1] = kubeconfig
		}
	}
	km.px.ExtraArgs = args
	if err := km.px.Start(); err != nil {
		t.Fatalf("restart inplaced: %v\n%s", err, km.px.LogTail(30))
	}
}

// testAnnotationImage: an image change requested
// on the pod runs in place, then the spec names the new image; kubelet
// makes no Stop/Create/StartContainer for it (from the request on, and in
// the three sync periods after); spec and status agree.
func (km *kmenv) testAnnotationImage(t *testing.T) {
	// A node's own credentials may not write a pod spec (NodeRestriction):
	// first, with them, the image stays an override and the pod says why.
	before := km.createPod(t, "imgnode", km.imgs.App1)
	req := fmt.Sprintf(`{"container":"app","image":%q,"minRuntime":"500ms"}`, km.imgs.App2)
	km.requestSwap(t, "imgnode", req)
	if st := km.waitStatus(t, "imgnode", req, 2*time.Minute); st.State != podapi.StateCommitted || !st.Override {
		t.Fatalf("node credentials: status %+v, want Committed with the image as an override", st)
	}
	eventually(t, 30*time.Second, "InPlacedForbidden event for the spec write", func() error {
		if km.events(t, "imgnode")["InPlacedForbidden"] == 0 {
			return errorf("no InPlacedForbidden event")
		}
		return nil
	})
	if p, _ := km.cp.Admin.CoreV1().Pods(km.ns).Get(ctx(t), "imgnode", metav1.GetOptions{}); p.Spec.Containers[0].Image != before.Spec.Containers[0].Image {
		t.Errorf("the spec changed without the permission: %s", p.Spec.Containers[0].Image)
	}

	// With the identity of deploy/kubernetes/rbac.yaml the spec follows.
	km.restartWithKubeconfig(t, km.applyRBAC(t))
	before = km.createPod(t, "imgann", km.imgs.App1)
	oldID := criID(appStatus(before))
	sb := km.sandboxOf(t, "imgann")
	off := km.logOffset(t)
	km.requestSwap(t, "imgann", req)
	var st *podapi.SwapStatus
	eventually(t, 2*time.Minute, "Committed with the spec image written", func() error {
		p, err := km.cp.Admin.CoreV1().Pods(km.ns).Get(ctx(t), "imgann", metav1.GetOptions{})
		if err != nil {
			return err
		}
		st = &podapi.SwapStatus{}
		if err := json.Unmarshal([]byte(p.Annotations[podapi.AnnotationSwapStatus]), st); err != nil {
			return err
		}
		for _, s := range st.Steps {
			if s.Name == kube.StepSpecPatch {
				return nil
			}
		}
		return errorf("status %+v", st)
	})
	if st.State != podapi.StateCommitted || st.Override {
		t.Errorf("status %+v: want Committed, no override (the spec declares the image)", st)
	}
	for _, s := range st.Steps {
		if s.Name == kube.StepSpecPatch && s.Error != "" {
			t.Fatalf("spec patch: %s", s.Error)
		}
	}
	newID := ""
	after := km.cp.WaitPod(t, km.ns, "imgann", time.Minute, func(p *corev1.Pod) error {
		s := appStatus(p)
		if s == nil || criID(s) == oldID || s.Image != km.imgs.App2 || !s.Ready || p.Spec.Containers[0].Image != km.imgs.App2 {
			return fmt.Errorf("want spec and status on %s, ready; spec %s, status %+v", km.imgs.App2, p.Spec.Containers[0].Image, s)
		}
		newID = criID(s)
		return podReady(p)
	})
	if after.UID != before.UID || after.Status.PodIP != before.Status.PodIP {
		t.Errorf("pod changed: UID %s→%s, IP %s→%s", before.UID, after.UID, before.Status.PodIP, after.Status.PodIP)
	}
	if now := km.sandboxOf(t, "imgann"); now != sb {
		t.Errorf("sandbox changed: %s → %s", short(sb), short(now))
	}
	ct, _ := containerInfo(t, km.direct, newID)
	if got, want := ct.Annotations["io.kubernetes.container.hash"], kube.ContainerHash("app", km.imgs.App2); got != want {
		t.Errorf("the new container carries hash %s, kubelet's for the new spec is %s", got, want)
	}
	// Three sync periods: kubelet has had nothing to do since the request.
	time.Sleep(3 * kubeletSync)
	calls := km.kubeletCalls(t, off, sb)
	for _, m := range []string{"StopContainer", "CreateContainer", "StartContainer", "StopPodSandbox"} {
		if calls[m] != 0 {
			t.Errorf("kubelet called %s %d times from the request to three sync periods after the spec write", m, calls[m])
		}
	}
	final, _ := km.cp.Admin.CoreV1().Pods(km.ns).Get(ctx(t), "imgann", metav1.GetOptions{})
	if s := appStatus(final); s == nil || criID(s) != newID || s.Image != final.Spec.Containers[0].Image || s.RestartCount != appStatus(after).RestartCount {
		t.Errorf("three sync periods later spec and status disagree or kubelet restarted it: spec %s, status %+v", final.Spec.Containers[0].Image, s)
	}
	if out, err := km.px.Ctl("overrides"); err != nil || strings.Contains(out, "imgann") {
		t.Errorf("an override is left for the pod whose spec names the image: %s %v", out, err)
	}
	t.Logf("image by annotation: %s, downtime %.0f ms, spec and status on %s; kubelet's calls for the pod from the request on: %v",
		st.State, st.DowntimeMs, km.imgs.App2, calls)
}
