package swap

import (
	"context"
	"encoding/json"
	"errors"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/inplaced/inplaced/pkg/criinfo"
	"github.com/inplaced/inplaced/pkg/internal/fakecri"
	"github.com/inplaced/inplaced/pkg/store"
)

// containerd 2.x writes the verbose info with encoding/json over the CRI
// structs. KeyValue.value is []byte since cri-api v0.34, but cri-api's
// KeyValue.MarshalJSON keeps the old plain-string form, so the values are
// plain strings here too (package criinfo pins that).
const containerd2Info = `{
  "sandboxID": "sb1",
  "pid": 4242,
  "removing": false,
  "snapshotKey": "c1",
  "snapshotter": "overlayfs",
  "runtimeType": "io.containerd.runc.v2",
  "runtimeOptions": {"systemd_cgroup": true},
  "config": {
    "metadata": {"name": "app", "attempt": 2},
    "image": {"image": "sha256:0123", "user_specified_image": "registry.local/app:v1", "runtime_handler": "runc"},
    "command": ["/app"],
    "args": ["--port", "8080"],
    "envs": [{"key": "MODE", "value": "old"}, {"key": "KEEP", "value": "kept"}, {"key": "EMPTY"}, {"key": "B64LIKE", "value": "b2xk"}],
    "labels": {"io.kubernetes.container.name": "app", "io.kubernetes.pod.name": "web"},
    "annotations": {"io.kubernetes.container.hash": "abc123", "io.kubernetes.container.restartCount": "2"},
    "log_path": "app/2.log",
    "linux": {"resources": {"cpu_shares": 102, "memory_limit_in_bytes": 67108864}}
  },
  "runtimeSpec": {"ociVersion": "1.2.0"}
}`

// containerd 1.6 (cri-api with a string value field) writes them as they are.
const containerd16Info = `{
  "sandboxID": "sb1",
  "pid": 4242,
  "config": {
    "metadata": {"name": "app", "attempt": 2},
    "image": {"image": "sha256:0123"},
    "command": ["/app"],
    "envs": [{"key": "MODE", "value": "old"}, {"key": "KEEP", "value": "kept"}, {"key": "EMPTY", "value": ""}, {"key": "B64LIKE", "value": "b2xk"}],
    "labels": {"io.kubernetes.container.name": "app"},
    "annotations": {"io.kubernetes.container.hash": "abc123"},
    "log_path": "app/2.log"
  }
}`

// versionOnly answers Version and nothing else.
type versionOnly struct {
	runtimeapi.RuntimeServiceClient
	resp *runtimeapi.VersionResponse
	err  error
}

func (v versionOnly) Version(context.Context, *runtimeapi.VersionRequest, ...grpc.CallOption) (*runtimeapi.VersionResponse, error) {
	return v.resp, v.err
}

// TestRecordedAdopts proves a container that did not pass through inplaced
// is adopted from the backend's verbose info, recorded, and that a sandbox
// config already in the store is used rather than asked of the backend.
func TestRecordedAdopts(t *testing.T) {
	v2 := versionOnly{resp: &runtimeapi.VersionResponse{RuntimeName: "containerd", RuntimeVersion: "v2.1.4"}}
	v16 := versionOnly{resp: &runtimeapi.VersionResponse{RuntimeName: "containerd", RuntimeVersion: "v1.6.36"}}
	pod := fakecri.PodConfig("ns", "web", "u1")
	sbInfo, _ := json.Marshal(map[string]any{"config": pod})
	info := criinfo.ContainerOf(map[string]string{"info": containerd2Info})
	sbFromBackend := criinfo.SandboxOf(map[string]string{"info": string(sbInfo)})

	t.Run("both from the backend", func(t *testing.T) {
		s := openStore(t)
		e := &Engine{rt: v2, store: s}
		req, err := e.recorded(context.Background(), "c1", "sb1", info, sbFromBackend)
		if err != nil {
			t.Fatal(err)
		}
		if req.PodSandboxId != "sb1" || req.Config.GetAnnotations()[AnnotationHash] != "abc123" || envString(req.Config.Envs) != "MODE=old,KEEP=kept,EMPTY=,B64LIKE=b2xk" {
			t.Errorf("adopted %v", req)
		}
		if !proto.Equal(req.SandboxConfig, pod) {
			t.Errorf("sandbox config = %v", req.SandboxConfig)
		}
		got, err := s.Container("c1")
		if err != nil || !proto.Equal(got, req) {
			t.Errorf("adopted config not recorded: %v, %v", got, err)
		}
	})
	t.Run("containerd 1.6 env values kept as written", func(t *testing.T) {
		e := &Engine{rt: v16, store: openStore(t)}
		info16 := criinfo.ContainerOf(map[string]string{"info": containerd16Info})
		req, err := e.recorded(context.Background(), "c1", "sb1", info16, sbFromBackend)
		if err != nil {
			t.Fatal(err)
		}
		if got, want := envString(req.Config.Envs), "MODE=old,KEEP=kept,EMPTY=,B64LIKE=b2xk"; got != want {
			t.Errorf("adopted envs on containerd 1.6 = %q, want %q", got, want)
		}
	})
	t.Run("sandbox from the store", func(t *testing.T) {
		s := openStore(t)
		if err := s.PutSandbox("sb1", &runtimeapi.RunPodSandboxRequest{Config: pod}); err != nil {
			t.Fatal(err)
		}
		e := &Engine{rt: v2, store: s}
		// The backend does not expose the sandbox config.
		req, err := e.recorded(context.Background(), "c1", "sb1", info, criinfo.SandboxOf(nil))
		if err != nil {
			t.Fatalf("recorded: %v (the sandbox config is in the store)", err)
		}
		if !proto.Equal(req.SandboxConfig, pod) {
			t.Errorf("sandbox config = %v", req.SandboxConfig)
		}
	})
	t.Run("recorded wins", func(t *testing.T) {
		s := openStore(t)
		want := &runtimeapi.CreateContainerRequest{PodSandboxId: "sb1",
			Config: fakecri.ContainerConfig(pod, "app", 0, "sha256:rec", "r/app:rec", "h"), SandboxConfig: pod}
		if err := s.PutContainer("c1", want); err != nil {
			t.Fatal(err)
		}
		e := &Engine{rt: v2, store: s}
		req, err := e.recorded(context.Background(), "c1", "", info, criinfo.SandboxOf(nil))
		if err != nil || !proto.Equal(req, want) {
			t.Errorf("recorded = %v, %v; want the stored request", req, err)
		}
	})
	t.Run("no verbose info", func(t *testing.T) {
		e := &Engine{rt: v2, store: openStore(t)}
		_, err := e.recorded(context.Background(), "c1", "sb1", criinfo.ContainerOf(nil), criinfo.SandboxOf(nil))
		if !errors.Is(err, ErrRefused) {
			t.Errorf("err = %v, want a refusal", err)
		}
		if _, err := e.store.Container("c1"); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("nothing adopted, yet the store has c1: %v", err)
		}
	})
}

func openStore(t *testing.T) *store.Store {
	t.Helper()
	s, err := store.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}
