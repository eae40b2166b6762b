package harness

import (
	"context"
	"fmt"
	"net"

	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"golang.org/x/crypto/bcrypt"
)

// DockerRegistryPath is Debian's docker-registry (the distribution registry,
// hack/install-deps.sh installs it).
const DockerRegistryPath = "/usr/bin/docker-registry"

// AuthRegistry is a distribution registry (Debian's docker-registry) on a
// loopback port that answers only to the users of an htpasswd file: every
// request without valid credentials gets 401. Containerd instances started
// after it pull from it over plain HTTP, like a link of Registry.
type AuthRegistry struct {
	// Addr is "127.0.0.1:PORT", an image reference's registry host.
	Addr    string
	Dir     string
	LogPath string
	users   map[string]string

	mu       sync.Mutex
	accesses []Access
}

// Access is one request to an AuthRegistry, as its front logged it: the
// Basic user name sent (never the password) and the answer's status.
type Access struct {
	Method, Path, User string
	Status             int
}

// AuthRegistryPrerequisites skips (or fails under CI=true) without
// docker-registry.
func AuthRegistryPrerequisites(tb testing.TB) {
	tb.Helper()
	Require(tb, "docker-registry", isExecutable(DockerRegistryPath),
		DockerRegistryPath+" not found; run hack/install-deps.sh (apt package docker-registry)")
}

const authRegistryConfig = `# written by inplaced test/harness
version: 0.1
log:
  level: info
  formatter: text
  accesslog:
    disabled: true
storage:
  filesystem:
    rootdirectory: %[1]s/storage
  delete:
    enabled: false
http:
  addr: %[2]s
  secret: inplaced-test-harness
auth:
  htpasswd:
    realm: inplaced-test
    path: %[1]s/htpasswd
`

// StartAuthRegistry starts docker-registry with users (name → password)
// and lists it with reg, so that containerd instances started afterwards
// pull from it over plain HTTP. tb.Cleanup stops it and removes its files.
func StartAuthRegistry(tb testing.TB, reg *Registry, users map[string]string) *AuthRegistry {
	tb.Helper()
	AuthRegistryPrerequisites(tb)
	dir, err := os.MkdirTemp(shortTempDir(), "ipreg")
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		if os.Getenv("INPLACED_KEEP_REGISTRY") == "" {
			_ = os.RemoveAll(dir)
		}
	})
	var htpasswd strings.Builder
	for u, p := range users {
		h, err := bcrypt.GenerateFromPassword([]byte(p), bcrypt.MinCost)
		if err != nil {
			tb.Fatal(err)
		}
		fmt.Fprintf(&htpasswd, "%s:%s\n", u, h)
	}
	port, err := freePort()
	if err != nil {
		tb.Fatal(err)
	}
	backend := fmt.Sprintf("127.0.0.1:%d", port)
	// A front on Addr records who made each request: the registry logs the
	// user of failed requests only.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	r := &AuthRegistry{Addr: ln.Addr().String(), Dir: dir, LogPath: filepath.Join(dir, "registry.log"), users: users}
	proxy := httputil.NewSingleHostReverseProxy(&url.URL{Scheme: "http", Host: backend})
	front := &http.Server{ReadHeaderTimeout: 10 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		user, _, _ := req.BasicAuth()
		sw := &statusWriter{ResponseWriter: w, status: http.StatusOK}
		proxy.ServeHTTP(sw, req)
		r.mu.Lock()
		r.accesses = append(r.accesses, Access{Method: req.Method, Path: req.URL.Path, User: user, Status: sw.status})
		r.mu.Unlock()
	})}
	go func() { _ = front.Serve(ln) }()
	tb.Cleanup(func() { _ = front.Close() })
	cfg := filepath.Join(dir, "config.yml")
	if err := os.WriteFile(filepath.Join(dir, "htpasswd"), []byte(htpasswd.String()), 0o600); err != nil {
		tb.Fatal(err)
	}
	if err := os.WriteFile(cfg, fmt.Appendf(nil, authRegistryConfig, dir, backend), 0o600); err != nil {
		tb.Fatal(err)
	}
	logf, err := os.Create(r.LogPath)
	if err != nil {
		tb.Fatal(err)
	}
	defer logf.Close()
	cmd := exec.Command(DockerRegistryPath, "serve", cfg)
	cmd.Dir = dir
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := startLocked(cmd); err != nil {
		tb.Fatalf("start %s: %v", DockerRegistryPath, err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	tb.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
	})
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := http.Get("http://" + r.Addr + "/v2/")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusUnauthorized {
				break
			}
			err = fmt.Errorf("GET /v2/ without credentials: %s, want 401", resp.Status)
		}
		select {
		case <-exited:
			b, _ := os.ReadFile(r.LogPath)
			tb.Fatalf("docker-registry exited: %s", b)
		default:
		}
		if time.Now().After(deadline) {
			tb.Fatalf("docker-registry on %s not ready: %v", r.Addr, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	reg.mu.Lock()
	reg.links = append(reg.links, r.Addr)
	reg.mu.Unlock()
	return r
}

// Ref is repoTag ("team/app:v2") in this registry.
func (r *AuthRegistry) Ref(repoTag string) string { return r.Addr + "/" + repoTag }

// Copy copies the image src (a reference in an open registry, e.g.
// Images.App2) to repoTag here, pushed as user, and returns its reference.
func (r *AuthRegistry) Copy(tb testing.TB, src, repoTag, user string) string {
	tb.Helper()
	from, err := name.ParseReference(src, name.Insecure)
	if err != nil {
		tb.Fatal(err)
	}
	ref := r.Ref(repoTag)
	to, err := name.NewTag(ref, name.Insecure)
	if err != nil {
		tb.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	img, err := remote.Image(from, remote.WithContext(ctx))
	if err != nil {
		tb.Fatalf("read %s: %v", src, err)
	}
	// A label makes each copy an image of its own (config digest, image
	// ID): kubelet reports a container's image by its ID, and copies with
	// one ID would all show as one of their tags.
	cfg, err := img.ConfigFile()
	if err != nil {
		tb.Fatal(err)
	}
	c := cfg.Config.DeepCopy()
	c.Labels = map[string]string{"io.inplaced.test.copy": repoTag}
	if img, err = mutate.Config(img, *c); err != nil {
		tb.Fatal(err)
	}
	auth := remote.WithAuth(&authn.Basic{Username: user, Password: r.users[user]})
	if err := remote.Write(to, img, remote.WithContext(ctx), auth); err != nil {
		tb.Fatalf("push %s: %v", ref, err)
	}
	return ref
}

// Pulls returns the users ("" for none) whose manifest requests for repo
// (a repository path, "team/app") succeeded, in order.
func (r *AuthRegistry) Pulls(repo string) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var users []string
	for _, a := range r.accesses {
		if strings.HasPrefix(a.Path, "/v2/"+repo+"/manifests/") && (a.Method == http.MethodGet || a.Method == http.MethodHead) && a.Status == http.StatusOK {
			users = append(users, a.User)
		}
	}
	return users
}

// Accesses returns every request made so far.
func (r *AuthRegistry) Accesses() []Access {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Access(nil), r.accesses...)
}

type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(code int) {
	w.status = code
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}
