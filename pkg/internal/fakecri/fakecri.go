// Package fakecri serves the k8s.io/cri-api testing fakes (FakeRuntimeService,
// FakeImageService) over a real gRPC server on a temporary unix socket, so
// that tests of the swap engine and the proxy talk CRI on the wire as they do
// to containerd.
//
// The fakes fake the Go client interface, not the gRPC servers; the adapters
// here translate between the two. They also do three things the fakes do not:
//
//   - errors the fakes make with fmt.Errorf("... not found") reach the caller
//     as codes.NotFound, as containerd's do (errors that already carry a gRPC
//     status pass unchanged);
//   - PullImage can be made to fail for one image (FailPull);
//   - StartContainer can be made to leave a container of one image exited,
//     as a container whose process dies at once (ExitOnStart);
//   - StartContainer can be made slow for one image and, as containerd's,
//     finish what it began when its caller gives up; meanwhile the container
//     is "starting" and RemoveContainer refuses it (SlowStart).
//
// Test-only: nothing outside *_test.go files imports it.
package fakecri

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	critest "k8s.io/cri-api/pkg/apis/testing"
)

// Backend is a running fake CRI backend.
type Backend struct {
	Runtime *critest.FakeRuntimeService
	Images  *critest.FakeImageService
	// Socket is the path of the unix socket; Endpoint is "unix://" + Socket.
	Socket, Endpoint string
	// Conn is a client connection to the backend, closed at cleanup.
	Conn          *grpc.ClientConn
	RuntimeClient runtimeapi.RuntimeServiceClient
	ImageClient   runtimeapi.ImageServiceClient

	mu          sync.Mutex
	pullErrors  map[string]error
	exitOnStart map[string]int32
	slowStart   map[string]time.Duration
	starting    map[string]bool
	info        map[string]string // verbose ContainerStatus info by container ID
}

// Start serves fresh fakes on a temporary socket until the test ends. Extra
// server options (a codec, say) are passed to grpc.NewServer.
func Start(t testing.TB, opts ...grpc.ServerOption) *Backend {
	t.Helper()
	// t.TempDir() paths grow with the test name and unix socket paths are
	// limited to 108 bytes: keep it short.
	dir, err := os.MkdirTemp("", "fakecri")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	b := &Backend{
		Runtime:     critest.NewFakeRuntimeService(),
		Images:      critest.NewFakeImageService(),
		Socket:      filepath.Join(dir, "cri.sock"),
		pullErrors:  map[string]error{},
		exitOnStart: map[string]int32{},
		slowStart:   map[string]time.Duration{},
		starting:    map[string]bool{},
	}
	b.Endpoint = "unix://" + b.Socket
	lis, err := net.Listen("unix", b.Socket)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(opts...)
	runtimeapi.RegisterRuntimeServiceServer(srv, &runtimeServer{b: b, f: b.Runtime})
	runtimeapi.RegisterImageServiceServer(srv, &imageServer{b: b, f: b.Images})
	served := make(chan struct{})
	go func() {
		defer close(served)
		_ = srv.Serve(lis) // returns when Stop is called at cleanup
	}()
	conn, err := grpc.NewClient(b.Endpoint, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		conn.Close()
		srv.Stop()
		<-served
	})
	b.Conn = conn
	b.RuntimeClient = runtimeapi.NewRuntimeServiceClient(conn)
	b.ImageClient = runtimeapi.NewImageServiceClient(conn)
	return b
}

// FailPull makes every PullImage of image fail with err (a status error
// keeps its code; nil clears it).
func (b *Backend) FailPull(image string, err error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if err == nil {
		delete(b.pullErrors, image)
		return
	}
	b.pullErrors[image] = err
}

// ExitOnStart makes StartContainer of a container whose config image (the
// ImageSpec.Image given to CreateContainer) is image succeed and leave it
// EXITED with exitCode, like a process that dies at once.
func (b *Backend) ExitOnStart(image string, exitCode int32) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.exitOnStart[image] = exitCode
}

// SetInfo makes a verbose ContainerStatus of container id carry info (as
// containerd's "info" key: its JSON with pid and runtimeSpec).
func (b *Backend) SetInfo(id, info string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.info == nil {
		b.info = map[string]string{}
	}
	b.info[id] = info
}

// SlowStart makes StartContainer of a container whose config image is image
// take d. Like containerd's, the start runs to its end even when the caller
// cancels; until then the container is starting and RemoveContainer of it
// fails.
func (b *Backend) SlowStart(image string, d time.Duration) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.slowStart[image] = d
}

// Container returns a copy of a container's status in the fake, or nil.
func (b *Backend) Container(id string) *runtimeapi.ContainerStatus {
	b.Runtime.Lock()
	defer b.Runtime.Unlock()
	c, ok := b.Runtime.Containers[id]
	if !ok {
		return nil
	}
	return proto.Clone(&c.ContainerStatus).(*runtimeapi.ContainerStatus)
}

// Named returns copies of the containers of a sandbox whose metadata name is
// name, oldest first.
func (b *Backend) Named(sandboxID, name string) []*runtimeapi.ContainerStatus {
	b.Runtime.Lock()
	defer b.Runtime.Unlock()
	var out []*runtimeapi.ContainerStatus
	for _, c := range b.Runtime.Containers {
		if c.SandboxID == sandboxID && c.GetMetadata().GetName() == name {
			out = append(out, proto.Clone(&c.ContainerStatus).(*runtimeapi.ContainerStatus))
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].CreatedAt < out[j].CreatedAt })
	return out
}

// SetState sets a container's state as if its process had changed it.
func (b *Backend) SetState(id string, state runtimeapi.ContainerState, exitCode int32) {
	b.Runtime.Lock()
	defer b.Runtime.Unlock()
	c, ok := b.Runtime.Containers[id]
	if !ok {
		return
	}
	c.State = state
	c.ExitCode = exitCode
	if state == runtimeapi.ContainerState_CONTAINER_EXITED {
		c.FinishedAt = time.Now().UnixNano()
	}
}

// Calls returns the names of the runtime calls made so far.
func (b *Backend) Calls() []string { return b.Runtime.GetCalls() }

// grpcErr gives a fake's plain error the code containerd would use.
func grpcErr(err error) error {
	if err == nil {
		return nil
	}
	if _, ok := status.FromError(err); ok {
		return err
	}
	if strings.Contains(err.Error(), "not found") {
		return status.Error(codes.NotFound, err.Error())
	}
	return status.Error(codes.Unknown, err.Error())
}

type runtimeServer struct {
	runtimeapi.UnimplementedRuntimeServiceServer
	b *Backend
	f *critest.FakeRuntimeService
}

func (s *runtimeServer) Version(ctx context.Context, req *runtimeapi.VersionRequest) (*runtimeapi.VersionResponse, error) {
	resp, err := s.f.Version(ctx, req.Version)
	return resp, grpcErr(err)
}

func (s *runtimeServer) Status(ctx context.Context, req *runtimeapi.StatusRequest) (*runtimeapi.StatusResponse, error) {
	resp, err := s.f.Status(ctx, req.Verbose)
	return resp, grpcErr(err)
}

func (s *runtimeServer) RunPodSandbox(ctx context.Context, req *runtimeapi.RunPodSandboxRequest) (*runtimeapi.RunPodSandboxResponse, error) {
	id, err := s.f.RunPodSandbox(ctx, req.Config, req.RuntimeHandler)
	if err != nil {
		return nil, grpcErr(err)
	}
	return &runtimeapi.RunPodSandboxResponse{PodSandboxId: id}, nil
}

func (s *runtimeServer) StopPodSandbox(ctx context.Context, req *runtimeapi.StopPodSandboxRequest) (*runtimeapi.StopPodSandboxResponse, error) {
	return &runtimeapi.StopPodSandboxResponse{}, grpcErr(s.f.StopPodSandbox(ctx, req.PodSandboxId))
}

func (s *runtimeServer) RemovePodSandbox(ctx context.Context, req *runtimeapi.RemovePodSandboxRequest) (*runtimeapi.RemovePodSandboxResponse, error) {
	return &runtimeapi.RemovePodSandboxResponse{}, grpcErr(s.f.RemovePodSandbox(ctx, req.PodSandboxId))
}

func (s *runtimeServer) PodSandboxStatus(ctx context.Context, req *runtimeapi.PodSandboxStatusRequest) (*runtimeapi.PodSandboxStatusResponse, error) {
	resp, err := s.f.PodSandboxStatus(ctx, req.PodSandboxId, req.Verbose)
	return resp, grpcErr(err)
}

func (s *runtimeServer) ListPodSandbox(ctx context.Context, req *runtimeapi.ListPodSandboxRequest) (*runtimeapi.ListPodSandboxResponse, error) {
	items, err := s.f.ListPodSandbox(ctx, req.Filter)
	if err != nil {
		return nil, grpcErr(err)
	}
	return &runtimeapi.ListPodSandboxResponse{Items: items}, nil
}

func (s *runtimeServer) CreateContainer(ctx context.Context, req *runtimeapi.CreateContainerRequest) (*runtimeapi.CreateContainerResponse, error) {
	id, err := s.f.CreateContainer(ctx, req.PodSandboxId, req.Config, req.SandboxConfig)
	if err != nil {
		return nil, grpcErr(err)
	}
	return &runtimeapi.CreateContainerResponse{ContainerId: id}, nil
}

func (s *runtimeServer) StartContainer(ctx context.Context, req *runtimeapi.StartContainerRequest) (*runtimeapi.StartContainerResponse, error) {
	if d := s.b.startDelay(s.f, req.ContainerId); d > 0 {
		done := make(chan error, 1)
		go func() {
			time.Sleep(d)
			_, err := s.start(context.Background(), req)
			s.b.mu.Lock()
			delete(s.b.starting, req.ContainerId)
			s.b.mu.Unlock()
			done <- err
		}()
		select {
		case err := <-done:
			return &runtimeapi.StartContainerResponse{}, err
		case <-ctx.Done():
			return nil, status.FromContextError(ctx.Err()).Err()
		}
	}
	return s.start(ctx, req)
}

// startDelay marks a container of a SlowStart image as starting and returns
// its delay (0 for other containers).
func (b *Backend) startDelay(f *critest.FakeRuntimeService, id string) time.Duration {
	f.Lock()
	c, ok := f.Containers[id]
	var image string
	if ok {
		image = c.GetImage().GetImage()
	}
	f.Unlock()
	b.mu.Lock()
	defer b.mu.Unlock()
	d := b.slowStart[image]
	if ok && d > 0 {
		b.starting[id] = true
	}
	return d
}

func (s *runtimeServer) start(ctx context.Context, req *runtimeapi.StartContainerRequest) (*runtimeapi.StartContainerResponse, error) {
	if err := s.f.StartContainer(ctx, req.ContainerId); err != nil {
		return nil, grpcErr(err)
	}
	s.b.mu.Lock()
	defer s.b.mu.Unlock()
	s.f.Lock()
	defer s.f.Unlock()
	if c, ok := s.f.Containers[req.ContainerId]; ok {
		if code, exits := s.b.exitOnStart[c.GetImage().GetImage()]; exits {
			c.State = runtimeapi.ContainerState_CONTAINER_EXITED
			c.ExitCode = code
			c.FinishedAt = time.Now().UnixNano()
			c.Reason = "Error"
		}
	}
	return &runtimeapi.StartContainerResponse{}, nil
}

func (s *runtimeServer) StopContainer(ctx context.Context, req *runtimeapi.StopContainerRequest) (*runtimeapi.StopContainerResponse, error) {
	return &runtimeapi.StopContainerResponse{}, grpcErr(s.f.StopContainer(ctx, req.ContainerId, req.Timeout))
}

func (s *runtimeServer) RemoveContainer(ctx context.Context, req *runtimeapi.RemoveContainerRequest) (*runtimeapi.RemoveContainerResponse, error) {
	s.b.mu.Lock()
	starting := s.b.starting[req.ContainerId]
	s.b.mu.Unlock()
	if starting {
		// containerd's words, from a start its caller gave up on.
		return nil, status.Errorf(codes.Unknown, "failed to set removing state for container %q: container is in starting state, can't be removed", req.ContainerId)
	}
	return &runtimeapi.RemoveContainerResponse{}, grpcErr(s.f.RemoveContainer(ctx, req.ContainerId))
}

func (s *runtimeServer) ListContainers(ctx context.Context, req *runtimeapi.ListContainersRequest) (*runtimeapi.ListContainersResponse, error) {
	cs, err := s.f.ListContainers(ctx, req.Filter)
	if err != nil {
		return nil, grpcErr(err)
	}
	// The fake iterates a map: give a stable order, as containerd's store does.
	sort.Slice(cs, func(i, j int) bool { return cs[i].CreatedAt < cs[j].CreatedAt })
	return &runtimeapi.ListContainersResponse{Containers: cs}, nil
}

func (s *runtimeServer) ContainerStatus(ctx context.Context, req *runtimeapi.ContainerStatusRequest) (*runtimeapi.ContainerStatusResponse, error) {
	resp, err := s.f.ContainerStatus(ctx, req.ContainerId, req.Verbose)
	s.b.mu.Lock()
	info, ok := s.b.info[req.ContainerId]
	s.b.mu.Unlock()
	if err == nil && ok && req.Verbose {
		resp.Info = map[string]string{"info": info}
	}
	return resp, grpcErr(err)
}

func (s *runtimeServer) UpdateContainerResources(ctx context.Context, req *runtimeapi.UpdateContainerResourcesRequest) (*runtimeapi.UpdateContainerResourcesResponse, error) {
	err := s.f.UpdateContainerResources(ctx, req.ContainerId, &runtimeapi.ContainerResources{Linux: req.Linux, Windows: req.Windows})
	return &runtimeapi.UpdateContainerResourcesResponse{}, grpcErr(err)
}

func (s *runtimeServer) ExecSync(ctx context.Context, req *runtimeapi.ExecSyncRequest) (*runtimeapi.ExecSyncResponse, error) {
	stdout, stderr, err := s.f.ExecSync(ctx, req.ContainerId, req.Cmd, time.Duration(req.Timeout)*time.Second)
	if err != nil {
		return nil, grpcErr(err)
	}
	return &runtimeapi.ExecSyncResponse{Stdout: stdout, Stderr: stderr}, nil
}

type imageServer struct {
	runtimeapi.UnimplementedImageServiceServer
	b *Backend
	f *critest.FakeImageService
}

func (s *imageServer) ListImages(ctx context.Context, req *runtimeapi.ListImagesRequest) (*runtimeapi.ListImagesResponse, error) {
	imgs, err := s.f.ListImages(ctx, req.Filter)
	if err != nil {
		return nil, grpcErr(err)
	}
	return &runtimeapi.ListImagesResponse{Images: imgs}, nil
}

func (s *imageServer) ImageStatus(ctx context.Context, req *runtimeapi.ImageStatusRequest) (*runtimeapi.ImageStatusResponse, error) {
	resp, err := s.f.ImageStatus(ctx, req.Image, req.Verbose)
	return resp, grpcErr(err)
}

func (s *imageServer) PullImage(ctx context.Context, req *runtimeapi.PullImageRequest) (*runtimeapi.PullImageResponse, error) {
	s.b.mu.Lock()
	perr := s.b.pullErrors[req.GetImage().GetImage()]
	s.b.mu.Unlock()
	if perr != nil {
		return nil, grpcErr(perr)
	}
	ref, err := s.f.PullImage(ctx, req.Image, req.Auth, req.SandboxConfig)
	if err != nil {
		return nil, grpcErr(err)
	}
	return &runtimeapi.PullImageResponse{ImageRef: ref}, nil
}

func (s *imageServer) RemoveImage(ctx context.Context, req *runtimeapi.RemoveImageRequest) (*runtimeapi.RemoveImageResponse, error) {
	return &runtimeapi.RemoveImageResponse{}, grpcErr(s.f.RemoveImage(ctx, req.Image))
}

func (s *imageServer) ImageFsInfo(ctx context.Context, _ *runtimeapi.ImageFsInfoRequest) (*runtimeapi.ImageFsInfoResponse, error) {
	resp, err := s.f.ImageFsInfo(ctx)
	return resp, grpcErr(err)
}

// PodConfig is a sandbox config like kubelet's for pod ns/name.
func PodConfig(ns, name, uid string) *runtimeapi.PodSandboxConfig {
	return &runtimeapi.PodSandboxConfig{
		Metadata:     &runtimeapi.PodSandboxMetadata{Name: name, Namespace: ns, Uid: uid},
		Labels:       map[string]string{"app": name, "io.kubernetes.pod.name": name, "io.kubernetes.pod.namespace": ns, "io.kubernetes.pod.uid": uid},
		Annotations:  map[string]string{"kubernetes.io/config.source": "api"},
		LogDirectory: "/var/log/pods/" + ns + "_" + name + "_" + uid,
	}
}

// ContainerConfig is a container config like kubelet's CreateContainer
// carries: the four labels, the hash and restart count annotations, a log
// path of <name>/<attempt>.log, the resolved image ID with the user's
// reference beside it.
func ContainerConfig(pod *runtimeapi.PodSandboxConfig, name string, attempt uint32, imageID, userImage, hash string) *runtimeapi.ContainerConfig {
	md := pod.GetMetadata()
	return &runtimeapi.ContainerConfig{
		Metadata: &runtimeapi.ContainerMetadata{Name: name, Attempt: attempt},
		Image:    &runtimeapi.ImageSpec{Image: imageID, UserSpecifiedImage: userImage, RuntimeHandler: "runc"},
		Command:  []string{"/app"},
		Args:     []string{"--port", "8080"},
		Envs: []*runtimeapi.KeyValue{
			{Key: "MODE", Value: []byte("old")},
			{Key: "KEEP", Value: []byte("kept")},
		},
		Labels: map[string]string{
			"io.kubernetes.pod.name":       md.GetName(),
			"io.kubernetes.pod.namespace":  md.GetNamespace(),
			"io.kubernetes.pod.uid":        md.GetUid(),
			"io.kubernetes.container.name": name,
		},
		Annotations: map[string]string{
			"io.kubernetes.container.hash":                     hash,
			"io.kubernetes.container.restartCount":             itoa(attempt),
			"io.kubernetes.container.terminationMessagePath":   "/dev/termination-log",
			"io.kubernetes.container.terminationMessagePolicy": "File",
			"io.kubernetes.pod.terminationGracePeriod":         "30",
		},
		LogPath: name + "/" + itoa(attempt) + ".log",
		Linux:   &runtimeapi.LinuxContainerConfig{Resources: &runtimeapi.LinuxContainerResources{CpuShares: 102, MemoryLimitInBytes: 64 << 20}},
	}
}

func itoa(n uint32) string { return strconv.FormatUint(uint64(n), 10) }
