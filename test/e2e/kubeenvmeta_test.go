package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/inplaced/inplaced/pkg/kube/podapi"
	inplacedv1 "github.com/inplaced/inplaced/proto/inplaced/v1"
)

func (km *kmenv) createMetaPod(t *testing.T, name string, optIn bool) *corev1.Pod {
	t.Helper()
	return km.createPodWith(t, name, km.imgs.App1, func(p *corev1.Pod) {
		p.Labels["tier"] = "blue"
		if optIn {
			p.Annotations = map[string]string{podapi.AnnotationEnvFromMetadata: "true"}
		}
		p.Spec.Containers[0].Env = []corev1.EnvVar{{Name: "TIER", ValueFrom: &corev1.EnvVarSource{
			FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.labels['tier']"}}}}
	})
}

func (km *kmenv) processEnv(t *testing.T, pod string) (string, string) {
	t.Helper()
	id, env, err := km.tryProcessEnv(t, pod)
	if err != nil {
		t.Fatal(err)
	}
	return id, env
}

func (km *kmenv) tryProcessEnv(t *testing.T, pod string) (string, string, error) {
	t.Helper()
	// The running container at the runtime: the pod status lags a swap.
	resp, err := km.direct.Runtime.ListContainers(ctx(t), &runtimeapi.ListContainersRequest{Filter: &runtimeapi.ContainerFilter{
		State:         &runtimeapi.ContainerStateValue{State: runtimeapi.ContainerState_CONTAINER_RUNNING},
		LabelSelector: map[string]string{"io.kubernetes.pod.name": pod, "io.kubernetes.pod.namespace": km.ns, "io.kubernetes.container.name": "app"}}})
	if err != nil || len(resp.Containers) != 1 {
		return "", "", fmt.Errorf("running app containers of %s: %v %v", pod, resp, err)
	}
	id := resp.Containers[0].Id
	_, in := containerInfo(t, km.direct, id)
	b, err := os.ReadFile("/proc/" + strconv.Itoa(in.Pid) + "/environ")
	if err != nil {
		return "", "", err
	}
	return id, string(b), nil
}

// testEnvFromMetadata: a label change reaches the
// process's env in place, keeping an earlier env override; without the
// opt-in it does not.
func (km *kmenv) testEnvFromMetadata(t *testing.T) {
	before := km.createMetaPod(t, "meta", true)
	km.createMetaPod(t, "nometa", false)
	// An earlier env swap by annotation: it must stay.
	req := `{"container":"app","env":{"KEEP":"me"},"minRuntime":"500ms"}`
	km.requestSwap(t, "meta", req)
	if st := km.waitStatus(t, "meta", req, time.Minute); st.State != podapi.StateCommitted {
		t.Fatalf("env swap: %+v", st)
	}
	idBefore, _ := km.processEnv(t, "meta")
	_, noBefore := km.processEnv(t, "nometa")
	idNoBefore, _ := km.processEnv(t, "nometa")
	patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"labels": map[string]string{"tier": "green"}}})
	for _, name := range []string{"meta", "nometa"} {
		if _, err := km.cp.Admin.CoreV1().Pods(km.ns).Patch(ctx(t), name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, time.Minute, "TIER=green in the process", func() error {
		id, env, err := km.tryProcessEnv(t, "meta")
		if err != nil {
			return err
		}
		if id == idBefore || !strings.Contains(env, "TIER=green\x00") {
			return fmt.Errorf("container %s env %q", short(id), env)
		}
		if !strings.Contains(env, "KEEP=me\x00") {
			t.Errorf("the earlier override KEEP=me was lost: %q", env)
		}
		return nil
	})
	after, _ := km.cp.Admin.CoreV1().Pods(km.ns).Get(ctx(t), "meta", metav1.GetOptions{})
	if after.UID != before.UID || after.Status.PodIP != before.Status.PodIP {
		t.Errorf("pod changed: UID %s→%s IP %s→%s", before.UID, after.UID, before.Status.PodIP, after.Status.PodIP)
	}
	time.Sleep(2 * kubeletSync)
	idNo, envNo := km.processEnv(t, "nometa")
	if idNo != idNoBefore || envNo != noBefore || !strings.Contains(envNo, "TIER=blue\x00") {
		t.Errorf("without the opt-in the container changed: %s→%s, env %q", short(idNoBefore), short(idNo), envNo)
	}
	km.imageAfterEnvFromMetadata(t)
}

// imageAfterEnvFromMetadata: an image patch after the label-driven env swap
// is one kubelet-driven swap whose container has the label's TIER, adopted
// by kubelet; no env swap follows it (one patch, one restart).
func (km *kmenv) imageAfterEnvFromMetadata(t *testing.T) {
	idBefore, _ := km.processEnv(t, "meta")
	before := len(km.kubeletSwaps(t, "meta"))
	off := km.logOffset(t)
	km.setImage(t, "meta", km.imgs.App2)
	var id string
	eventually(t, 2*time.Minute, "meta on the new image with TIER=green", func() error {
		recs := km.kubeletSwaps(t, "meta")
		if len(recs) != before+1 || recs[len(recs)-1].State != inplacedv1.SwapState_SWAP_STATE_COMMITTED {
			return fmt.Errorf("kubelet-driven swaps %v", recs)
		}
		var env string
		var err error
		if id, env, err = km.tryProcessEnv(t, "meta"); err != nil {
			return err
		}
		if id == idBefore || !strings.Contains(env, "TIER=green\x00") {
			return fmt.Errorf("container %s env %q", short(id), env)
		}
		return nil
	})
	recs := km.kubeletSwaps(t, "meta")
	rec := recs[len(recs)-1]
	if rec.RunningContainerId != id || !strings.HasPrefix(rec.Handoff, "adopted") {
		t.Errorf("kubelet-driven swap: running %s (process in %s), handoff %q; want kubelet to adopt its container", short(rec.RunningContainerId), short(id), rec.Handoff)
	}
	t.Logf("image patch after the label's env swap: swap %s, downtime %s, handoff: %s", rec.Id,
		time.Duration(rec.DowntimeNs).Round(time.Millisecond), rec.Handoff)
	time.Sleep(2 * kubeletSync)
	if now, _ := km.processEnv(t, "meta"); now != id {
		t.Errorf("the container changed again after the image swap: %s → %s", short(id), short(now))
	}
	if n := km.pxLogCount(t, off, "pod metadata behind the env changed"); n != 0 {
		t.Errorf("%d env-from-metadata swaps after the image patch, want none", n)
	}
}
