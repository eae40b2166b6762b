package swap

import (
	"context"
	"errors"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	inplacedv1 "github.com/inplaced/inplaced/proto/inplaced/v1"
)

const newHash = "cafe01"

func waitClosed(t *testing.T, c <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-c:
	case <-time.After(10 * time.Second):
		t.Fatalf("%s: not within 10s", what)
	}
}

// A kubelet-driven swap pulls at once, touches nothing until Proceed, then
// runs the new image with kubelet's hash for the new spec as the next
// attempt, without health gate or preStop, and records it as kubelet's.
func TestPrepareProceed(t *testing.T) {
	e := newEnv(t)
	oldID := e.create(t, e.containerReq(0), true)
	p, err := e.eng.Prepare(context.Background(), KubeletChange{ContainerID: oldID, Image: "registry.local/app:v2", Hash: newHash})
	if err != nil {
		t.Fatal(err)
	}
	waitClosed(t, p.Pulled(), "pull")
	if err := p.PullErr(); err != nil {
		t.Fatalf("pull: %v", err)
	}
	if st := e.be.Container(oldID); st.State != runtimeapi.ContainerState_CONTAINER_RUNNING {
		t.Fatalf("old container %s after the pull, before Proceed", st.State)
	}
	if got := len(e.be.Named(e.sbID, "app")); got != 1 {
		t.Fatalf("%d containers named app before Proceed, want 1", got)
	}
	// Listed while it waits, with the pull step done.
	recs, err := e.eng.List(context.Background(), nil)
	if err != nil || len(recs) != 1 || recs[0].State != inplacedv1.SwapState_SWAP_STATE_RUNNING || recs[0].Caller.GetDescription() != CallerKubelet {
		t.Fatalf("running swap not listed as kubelet's: %v %v", recs, err)
	}
	res, err := p.Proceed(context.Background(), 7)
	if err != nil || res.Err != nil || !res.Stopped || res.NewID == "" {
		t.Fatalf("proceed: %+v %v", res, err)
	}
	if st := e.be.Container(oldID); st.State != runtimeapi.ContainerState_CONTAINER_EXITED {
		t.Fatalf("old container %s", st.State)
	}
	nst := e.be.Container(res.NewID)
	if nst.State != runtimeapi.ContainerState_CONTAINER_RUNNING {
		t.Fatalf("new container %s", nst.State)
	}
	cfg := res.NewRequest.Config
	if cfg.Annotations[AnnotationHash] != newHash || cfg.Metadata.Attempt != 1 || cfg.Annotations[AnnotationRestarts] != "1" ||
		cfg.Image.UserSpecifiedImage != "registry.local/app:v2" || cfg.LogPath != "app/1.log" {
		t.Fatalf("new config: hash %s attempt %d restarts %s image %v log %s", cfg.Annotations[AnnotationHash], cfg.Metadata.Attempt,
			cfg.Annotations[AnnotationRestarts], cfg.Image, cfg.LogPath)
	}
	rec, err := e.st.Swap(res.SwapID)
	if err != nil {
		t.Fatal(err)
	}
	if rec.State != inplacedv1.SwapState_SWAP_STATE_COMMITTED || rec.Kind != KindKubelet {
		t.Fatalf("record: %v", rec)
	}
	var names []string
	for _, s := range rec.Steps {
		names = append(names, s.Name)
	}
	want := []string{StepPull, StepCreateNew, StepStopOld, StepStartNew, StepCommit}
	if len(names) != len(want) {
		t.Fatalf("steps %v, want %v", names, want)
	}
	for i := range want {
		if names[i] != want[i] {
			t.Fatalf("steps %v, want %v", names, want)
		}
	}
	if js, err := e.st.Journal(); err != nil || len(js) != 0 {
		t.Errorf("journal after commit: %v %v", js, err)
	}
}

// A failed pull touches nothing and says why; so does a cancel.
func TestPreparePullFailsOrCancelled(t *testing.T) {
	e := newEnv(t)
	oldID := e.create(t, e.containerReq(0), true)
	e.be.FailPull("registry.local/app:nope", status.Error(codes.NotFound, "manifest unknown"))
	p, err := e.eng.Prepare(context.Background(), KubeletChange{ContainerID: oldID, Image: "registry.local/app:nope", Hash: newHash})
	if err != nil {
		t.Fatal(err)
	}
	waitClosed(t, p.Pulled(), "pull")
	if p.PullErr() == nil {
		t.Fatalf("pull error %v", p.PullErr())
	}
	waitClosed(t, p.Done(), "end")
	if res := p.Result(); res.Stopped || res.NewID != "" {
		t.Fatalf("result after failed pull: %+v", res)
	}
	if st := e.be.Container(oldID); st.State != runtimeapi.ContainerState_CONTAINER_RUNNING {
		t.Fatalf("old container %s after a failed pull", st.State)
	}

	p2, err := e.eng.Prepare(context.Background(), KubeletChange{ContainerID: oldID, Image: "registry.local/app:v2", Hash: newHash})
	if err != nil {
		t.Fatal(err)
	}
	waitClosed(t, p2.Pulled(), "pull")
	p2.Cancel(errors.New("pod spec reverted"))
	waitClosed(t, p2.Done(), "end")
	if res := p2.Result(); res.Stopped || res.NewID != "" {
		t.Fatalf("result after cancel: %+v", res)
	}
	if got := len(e.be.Named(e.sbID, "app")); got != 1 {
		t.Fatalf("%d containers named app after cancel, want 1", got)
	}
	// Proceed after the end returns the end at once.
	if res, err := p2.Proceed(context.Background(), 2); err != nil || res.Stopped {
		t.Fatalf("proceed after cancel: %+v %v", res, err)
	}
	rec, err := e.st.Swap(p2.ID())
	if err != nil || rec.State != inplacedv1.SwapState_SWAP_STATE_ABORTED {
		t.Fatalf("cancelled record: %v %v", rec, err)
	}
}

// kubelet's own config for the new spec differs from the prepared one only
// in the termination message file: that is no difference.
func TestConfigDiff(t *testing.T) {
	e := newEnv(t)
	a := e.containerReq(1).Config
	a.Annotations[AnnotationTerminationMessagePath] = "/dev/termination-log"
	a.Mounts = append(a.Mounts, &runtimeapi.Mount{ContainerPath: "/dev/termination-log", HostPath: "/var/lib/kubelet/pods/u/containers/app/aaaa"},
		&runtimeapi.Mount{ContainerPath: "/data", HostPath: "/srv/data"})
	b := e.containerReq(1).Config
	b.Annotations[AnnotationTerminationMessagePath] = "/dev/termination-log"
	b.Mounts = append(b.Mounts, &runtimeapi.Mount{ContainerPath: "/dev/termination-log", HostPath: "/var/lib/kubelet/pods/u/containers/app/bbbb"},
		&runtimeapi.Mount{ContainerPath: "/data", HostPath: "/srv/data"})
	if d := ConfigDiff(a, b); len(d) != 0 {
		t.Fatalf("diff %v, want none", d)
	}
	b.Mounts[len(b.Mounts)-1].HostPath = "/srv/other"
	b.Envs = append(b.Envs, &runtimeapi.KeyValue{Key: "X", Value: []byte("1")})
	d := ConfigDiff(a, b)
	if len(d) != 2 || d[0] != "envs" || d[1] != "mounts" {
		t.Fatalf("diff %v, want [envs mounts]", d)
	}
}

// An image change after an env swap of env taken from the pod's metadata:
// the new container has kubelet's declared config (the override is the
// spec change's to drop) with the env kubelet resolves from the pod's
// current metadata, as kubelet's own create would — not the values of the
// pod's first create.
func TestPrepareCarriesMetadataEnv(t *testing.T) {
	for _, tc := range []struct {
		name     string
		metadata map[string]string // KubeletChange.MetadataEnv
		want     string            // MODE in the new container
	}{
		{"label changed since the first create", map[string]string{"MODE": "blue"}, "blue"},
		{"label back to the first create's value", map[string]string{"MODE": "old"}, "old"},
		{"no env from metadata", nil, "old"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			e.create(t, e.containerReq(0), true)
			envRec := e.swap(t, &inplacedv1.Change{SetEnv: map[string]string{"MODE": "blue"}}, nil)
			if envRec.State != inplacedv1.SwapState_SWAP_STATE_COMMITTED {
				t.Fatalf("env swap %s: %s", envRec.State, envRec.Error)
			}
			p, err := e.eng.Prepare(context.Background(), KubeletChange{ContainerID: envRec.RunningContainerId,
				Image: "registry.local/app:v2", Hash: newHash, MetadataEnv: tc.metadata})
			if err != nil {
				t.Fatal(err)
			}
			waitClosed(t, p.Pulled(), "pull")
			res, err := p.Proceed(context.Background(), 2)
			if err != nil || res.NewID == "" {
				t.Fatalf("proceed: %+v %v", res, err)
			}
			env := map[string]string{}
			for _, kv := range res.NewRequest.Config.Envs {
				env[kv.Key] = string(kv.Value)
			}
			if env["MODE"] != tc.want || env["KEEP"] != "kept" || len(env) != 2 {
				t.Errorf("new container env %v, want MODE=%s KEEP=kept", env, tc.want)
			}
			if _, err := e.st.Override(e.sbID, "app"); err == nil {
				t.Error("the env swap's override outlived the spec change")
			}
		})
	}
}
