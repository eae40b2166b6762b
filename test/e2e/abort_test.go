package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/inplaced/inplaced/test/harness"
)

// TestSwapAbortedByPodRemoval: a pod removed through the proxy while a swap
// runs in it ends the swap ABORTED and leaves no container behind.
func TestSwapAbortedByPodRemoval(t *testing.T) {
	forEachBackend(t, func(t *testing.T, c *harness.Containerd) {
		e := newEnv(t, c)
		p := runPod(t, e.cri, "abort-me", e.imgs.App1, podOpts{})
		done := make(chan string, 1)
		go func() {
			out, _ := e.px.Ctl("swap", p.name, "-c", "app", "--image", e.imgs.App2, "--min-runtime", "30s", "-o", "json")
			done <- out
		}()
		// Wait until the new container exists (the swap is in its health gate).
		eventually(t, 30*time.Second, "swap reaching the health gate", func() error {
			resp, err := e.direct.Runtime.ListContainers(context.Background(), &runtimeapi.ListContainersRequest{
				Filter: &runtimeapi.ContainerFilter{PodSandboxId: p.sandboxID}})
			if err != nil {
				return err
			}
			if len(resp.Containers) < 2 {
				return errorf("%d containers in the pod", len(resp.Containers))
			}
			return nil
		})
		cc, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		// kubelet retries a failed StopPodSandbox; so does this test: on a
		// loaded machine containerd 1.6 sometimes reports a shim that is
		// closing ("ttrpc: closed") for a container it is tearing down.
		var stopErr error
		for attempt := 0; attempt < 5; attempt++ {
			if _, stopErr = e.cri.Runtime.StopPodSandbox(cc, &runtimeapi.StopPodSandboxRequest{PodSandboxId: p.sandboxID}); stopErr == nil {
				break
			}
			t.Logf("StopPodSandbox attempt %d: %v (retrying, as kubelet does)", attempt+1, stopErr)
			time.Sleep(time.Second)
		}
		if stopErr != nil {
			t.Fatalf("StopPodSandbox through the proxy: %v", stopErr)
		}
		if _, err := e.cri.Runtime.RemovePodSandbox(cc, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: p.sandboxID}); err != nil {
			t.Fatalf("RemovePodSandbox through the proxy: %v", err)
		}
		var out string
		select {
		case out = <-done:
		case <-time.After(30 * time.Second):
			t.Fatal("the swap did not end when its pod was removed")
		}
		r := lastJSONObject(t, out)
		if r.State != "SWAP_STATE_ABORTED" {
			t.Fatalf("swap ended %s (%s), want ABORTED", r.State, r.Error)
		}
		resp, err := e.direct.Runtime.ListContainers(cc, &runtimeapi.ListContainersRequest{Filter: &runtimeapi.ContainerFilter{PodSandboxId: p.sandboxID}})
		if err != nil {
			t.Fatal(err)
		}
		if len(resp.Containers) != 0 {
			t.Fatalf("%d containers left behind in the removed pod", len(resp.Containers))
		}
		ov, err := e.px.Ctl("overrides", "-o", "json")
		if err != nil || strings.Contains(ov, p.sandboxID) {
			t.Fatalf("override left for the removed pod: %v\n%s", err, ov)
		}
	})
}
