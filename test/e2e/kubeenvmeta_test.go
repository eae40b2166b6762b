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

	"github.com/inplaced/inplaced/pkg/kube"
)

func (km *kmenv) createMetaPod(t *testing.T, name string, optIn bool) *corev1.Pod {
	t.Helper()
	return km.createPodWith(t, name, km.imgs.App1, func(p *corev1.Pod) {
		p.Labels["tier"] = "blue"
		if optIn {
			p.Annotations = map[string]string{kube.AnnotationEnvFromMetadata: "true"}
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

// testEnvFromMetadata is issue 10's must-show 3: a label change reaches the
// process's env in place, keeping an earlier env override; without the
// opt-in it does not.
func (km *kmenv) testEnvFromMetadata(t *testing.T) {
	before := km.createMetaPod(t, "meta", true)
	km.createMetaPod(t, "nometa", false)
	// An earlier env swap by annotation: it must stay.
	req := `{"container":"app","env":{"KEEP":"me"},"minRuntime":"500ms"}`
	km.requestSwap(t, "meta", req)
	if st := km.waitStatus(t, "meta", req, time.Minute); st.State != kube.StateCommitted {
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
}
