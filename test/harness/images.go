package harness

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"debug/elf"
	"encoding/binary"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"golang.org/x/sync/errgroup"
)

// Images holds the references of the test images pushed by PushTestImages.
type Images struct {
	// Pause is the sandbox image: /pause (test/images/app, no HTTP) waiting
	// for a signal and reaping orphans; a process named "pause" as upstream.
	Pause string
	// App1 and App2 run /app (test/images/app) built as v1 and v2; /VERSION holds
	// "v1" or "v2"; busybox applets are in /bin. /app serves :8080 /version and
	// /healthz and exits 0 on SIGTERM.
	App1, App2 string
	// Crash is App1 whose entrypoint exits at once with code 3.
	Crash string
	// Large is App1 plus a layer with LargeFileSize bytes of random data at
	// LargeFilePath.
	Large string
	// Busybox has every applet and /etc/passwd (critest's defaultTestContainerImage).
	Busybox string
	// Web runs `httpd -f -p 80` serving /www (critest's webServerTestImage).
	Web string
}

// Layout facts of the test images that tests may rely on.
const (
	AppPort       = 8080
	CrashExitCode = 3
	LargeFilePath = "/large/random.bin"
	LargeFileSize = 100<<20 + 4096
	largeSeed     = 0x1a9ced
)

// All lists every reference.
func (im Images) All() []string {
	return []string{im.Pause, im.App1, im.App2, im.Crash, im.Large, im.Busybox, im.Web}
}

// TestImagesYAML is the content of critest's --test-images-file for these images.
func (im Images) TestImagesYAML() string {
	return fmt.Sprintf("defaultTestContainerImage: %s\nwebServerTestImage: %s\n", im.Busybox, im.Web)
}

// PushTestImages builds the test images (once per process) and pushes them to r
// (once per registry). It returns their references.
func (r *Registry) PushTestImages(tb testing.TB) Images {
	tb.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.images != nil {
		return *r.images
	}
	imgs, err := buildTestImages(tb)
	if err != nil {
		tb.Fatalf("build test images: %v", err)
	}
	refs := Images{
		Pause:   r.Ref("pause:3.10"),
		App1:    r.Ref("app:v1"),
		App2:    r.Ref("app:v2"),
		Crash:   r.Ref("crash:v1"),
		Large:   r.Ref("large:v1"),
		Busybox: r.Ref("busybox:1.36"),
		Web:     r.Ref("web:1"),
	}
	push := map[string]v1.Image{
		refs.Pause: imgs.pause, refs.App1: imgs.app1, refs.App2: imgs.app2, refs.Crash: imgs.crash,
		refs.Large: imgs.large, refs.Busybox: imgs.busybox, refs.Web: imgs.web,
	}
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(4)
	for ref, img := range push {
		g.Go(func() error {
			tag, err := name.NewTag(ref, name.Insecure)
			if err != nil {
				return err
			}
			if err := remote.Write(tag, img, remote.WithContext(gctx)); err != nil {
				return fmt.Errorf("push %s: %w", ref, err)
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		tb.Fatalf("push test images: %v", err)
	}
	tb.Logf("pushed %d test images to %s in %s", len(push), r.Addr, time.Since(start).Round(time.Millisecond))
	r.images = &refs
	return refs
}

type testImages struct {
	pause, app1, app2, crash, large, busybox, web v1.Image

	// For derived images (PushCritestImages).
	base v1.Layer
	app  []byte // test/images/app built as v1
}

var (
	buildOnce   sync.Once
	builtImages *testImages
	buildErr    error
)

func buildTestImages(tb testing.TB) (*testImages, error) {
	buildOnce.Do(func() {
		start := time.Now()
		builtImages, buildErr = doBuildTestImages()
		if buildErr == nil {
			tb.Logf("built test images in %s", time.Since(start).Round(time.Millisecond))
		}
	})
	return builtImages, buildErr
}

func doBuildTestImages() (*testImages, error) {
	base, err := busyboxLayer(BusyboxPath())
	if err != nil {
		return nil, err
	}
	apps, err := buildApps("v1", "v2")
	if err != nil {
		return nil, err
	}
	app1, err := appLayer(apps["v1"], "v1")
	if err != nil {
		return nil, err
	}
	app2, err := appLayer(apps["v2"], "v2")
	if err != nil {
		return nil, err
	}
	large, err := largeLayer()
	if err != nil {
		return nil, err
	}
	pause, err := fileLayer(map[string]tarFile{"pause": {0o755, apps["v1"]}})
	if err != nil {
		return nil, err
	}

	out := &testImages{base: base, app: apps["v1"]}
	steps := []struct {
		dst    *v1.Image
		name   string
		layers []v1.Layer
		cfg    v1.Config
	}{
		{&out.pause, "pause", []v1.Layer{base, pause}, v1.Config{Entrypoint: []string{"/pause", "-listen="}}},
		{&out.app1, "app-v1", []v1.Layer{base, app1}, v1.Config{Entrypoint: []string{"/app"}}},
		{&out.app2, "app-v2", []v1.Layer{base, app2}, v1.Config{Entrypoint: []string{"/app"}}},
		{&out.crash, "crash", []v1.Layer{base, app1}, v1.Config{Entrypoint: []string{"/app", fmt.Sprintf("-exit=%d", CrashExitCode)}}},
		{&out.large, "large", []v1.Layer{base, app1, large}, v1.Config{Entrypoint: []string{"/app"}}},
		{&out.busybox, "busybox", []v1.Layer{base}, v1.Config{Cmd: []string{"sh"}}},
		{&out.web, "web", []v1.Layer{base}, v1.Config{Entrypoint: []string{"/bin/httpd", "-f", "-p", "80", "-h", "/www"}}},
	}
	for _, s := range steps {
		img, err := ociImage(s.name, s.layers, s.cfg)
		if err != nil {
			return nil, err
		}
		*s.dst = img
	}
	return out, nil
}

// ImageLabel is the config label that names each test image. Images with the
// same layers and command still get their own image ID: critest expects an
// image it pulled to carry only its own tag.
const ImageLabel = "io.inplaced.test-image"

func ociImage(name string, layers []v1.Layer, cfg v1.Config) (v1.Image, error) {
	cfg.Labels = map[string]string{ImageLabel: name}
	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	img, err := mutate.AppendLayers(img, layers...)
	if err != nil {
		return nil, fmt.Errorf("append layers: %w", err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.OS = "linux"
	cf.Architecture = runtime.GOARCH
	cf.Created = v1.Time{Time: fixedTime}
	cfg.Env = append([]string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}, cfg.Env...)
	if cfg.WorkingDir == "" {
		cfg.WorkingDir = "/"
	}
	cf.Config = cfg
	return mutate.ConfigFile(img, cf)
}

// fixedTime keeps layers and configs reproducible.
var fixedTime = time.Date(2024, 1, 1, 0, 0, 0, 0, time.UTC)

// tarBuilder writes a layer tar in memory.
type tarBuilder struct {
	buf bytes.Buffer
	tw  *tar.Writer
}

func newTarBuilder() *tarBuilder {
	b := &tarBuilder{}
	b.tw = tar.NewWriter(&b.buf)
	return b
}

func (b *tarBuilder) dir(path string, mode int64) error {
	return b.tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: path + "/", Mode: mode, ModTime: fixedTime, Format: tar.FormatPAX})
}

func (b *tarBuilder) file(path string, mode int64, data []byte) error {
	// Mode may hold the setuid bit (0o4000): tar keeps it, owner is root.
	if err := b.tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: path, Mode: mode, Size: int64(len(data)), ModTime: fixedTime, Format: tar.FormatPAX}); err != nil {
		return err
	}
	_, err := b.tw.Write(data)
	return err
}

// hardlink adds path as a hard link to target (a path in the same layer).
func (b *tarBuilder) hardlink(path, target string) error {
	return b.tw.WriteHeader(&tar.Header{Typeflag: tar.TypeLink, Name: path, Linkname: target, Mode: 0o755, ModTime: fixedTime, Format: tar.FormatPAX})
}

func (b *tarBuilder) layer() (v1.Layer, error) {
	if err := b.tw.Close(); err != nil {
		return nil, err
	}
	data := b.buf.Bytes()
	return tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(data)), nil
	}, tarball.WithMediaType(types.OCILayer), tarball.WithCompressionLevel(gzip.BestSpeed))
}

// standInTools are shell scripts for commands critest runs in its default
// image that Debian's busybox-static does not have.
var standInTools = map[string]string{
	"pgrep": `#!/bin/sh
# stand-in for pgrep NAME (test/harness): pids of processes named NAME
exec pidof "$@"
`,
	"ipcs": `#!/bin/sh
# stand-in for "ipcs -m" (test/harness): shared memory segments of this IPC namespace
echo "------ Shared Memory Segments --------"
echo "key        shmid      owner      perms      bytes      nattch"
tail -n +2 /proc/sysvipc/shm | while read key shmid perms size cpid lpid nattch uid rest; do
	printf '0x%08x %-10s %-10s %-10s %-10s %s\n' "$key" "$shmid" "$uid" "$perms" "$size" "$nattch"
done
`,
}

const etcPasswd = `root:x:0:0:root:/root:/bin/sh
daemon:x:1:1:daemon:/usr/sbin:/bin/false
bin:x:2:2:bin:/bin:/bin/false
sys:x:3:3:sys:/dev:/bin/false
sync:x:4:100:sync:/bin:/bin/sync
mail:x:8:8:mail:/var/spool/mail:/bin/false
www-data:x:33:33:www-data:/var/www:/bin/false
operator:x:37:37:Operator:/var:/bin/false
nobody:x:65534:65534:nobody:/home:/bin/false
`

const etcGroup = `root:x:0:
daemon:x:1:
bin:x:2:
sys:x:3:
adm:x:4:
tty:x:5:
disk:x:6:
wheel:x:10:root
mail:x:12:
www-data:x:33:
users:x:100:
nogroup:x:65534:
`

// busyboxLayer is the base layer of every image: a static busybox at
// /bin/busybox with every applet as a hard link in /bin (as in the upstream
// busybox image: masking /bin/ls must not mask the shell), /etc/passwd and
// /etc/group, /www/index.html for the web image, and shell stand-ins for the
// tools critest runs that Debian's busybox lacks (pgrep, ipcs -m).
func busyboxLayer(busybox string) (v1.Layer, error) {
	if err := checkStatic(busybox); err != nil {
		return nil, fmt.Errorf("%s: %w (install busybox-static, run hack/install-deps.sh)", busybox, err)
	}
	bin, err := os.ReadFile(busybox)
	if err != nil {
		return nil, err
	}
	out, err := exec.Command(busybox, "--list").Output()
	if err != nil {
		return nil, fmt.Errorf("%s --list: %w", busybox, err)
	}
	applets := strings.Fields(string(out))
	sort.Strings(applets)

	b := newTarBuilder()
	for _, d := range []struct {
		path string
		mode int64
	}{{"bin", 0o755}, {"etc", 0o755}, {"home", 0o755}, {"root", 0o700}, {"tmp", 0o1777}, {"var", 0o755}, {"var/run", 0o755}, {"var/www", 0o755}, {"www", 0o755}} {
		if err := b.dir(d.path, d.mode); err != nil {
			return nil, err
		}
	}
	if err := b.file("bin/busybox", 0o755, bin); err != nil {
		return nil, err
	}
	have := map[string]bool{}
	for _, a := range applets {
		if a == "busybox" || strings.Contains(a, "/") {
			continue
		}
		have[a] = true
		if err := b.hardlink("bin/"+a, "bin/busybox"); err != nil {
			return nil, err
		}
	}
	for name, script := range standInTools {
		if have[name] {
			continue
		}
		if err := b.file("bin/"+name, 0o755, []byte(script)); err != nil {
			return nil, err
		}
	}
	for _, f := range []struct {
		path, data string
	}{
		{"etc/passwd", etcPasswd},
		{"etc/group", etcGroup},
		{"www/index.html", "<html><body>inplaced test web server</body></html>\n"},
	} {
		if err := b.file(f.path, 0o644, []byte(f.data)); err != nil {
			return nil, err
		}
	}
	return b.layer()
}

func checkStatic(path string) error {
	f, err := elf.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return fmt.Errorf("not a static binary")
		}
	}
	return nil
}

// appLayer holds /app and /VERSION.
func appLayer(bin []byte, version string) (v1.Layer, error) {
	b := newTarBuilder()
	if err := b.file("app", 0o755, bin); err != nil {
		return nil, err
	}
	if err := b.file("VERSION", 0o644, []byte(version+"\n")); err != nil {
		return nil, err
	}
	return b.layer()
}

// buildApps builds test/images/app once per version, statically.
func buildApps(versions ...string) (map[string][]byte, error) {
	root, err := ModuleRoot()
	if err != nil {
		return nil, err
	}
	tmp, err := os.MkdirTemp("", "inplaced-app-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)

	out := make(map[string][]byte, len(versions))
	var mu sync.Mutex
	var g errgroup.Group
	for _, v := range versions {
		g.Go(func() error {
			dst := filepath.Join(tmp, "app-"+v)
			cmd := exec.Command("go", "build", "-trimpath", "-ldflags", "-s -w -X main.version="+v, "-o", dst, "./test/images/app")
			cmd.Dir = root
			cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux")
			if out, err := cmd.CombinedOutput(); err != nil {
				return fmt.Errorf("go build test/images/app %s: %w\n%s", v, err, out)
			}
			data, err := os.ReadFile(dst)
			if err != nil {
				return err
			}
			mu.Lock()
			out[v] = data
			mu.Unlock()
			return nil
		})
	}
	return out, g.Wait()
}

// ModuleRoot is the directory of inplaced's go.mod, found upwards from the
// working directory (go test runs in the package directory), or from
// $INPLACED_ROOT.
func ModuleRoot() (string, error) {
	if d := os.Getenv("INPLACED_ROOT"); d != "" {
		return d, nil
	}
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		data, err := os.ReadFile(filepath.Join(dir, "go.mod"))
		if err == nil && strings.Contains(string(data), "module github.com/inplaced/inplaced\n") {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("go.mod of github.com/inplaced/inplaced not found above the working directory (set INPLACED_ROOT)")
		}
		dir = parent
	}
}

// largeLayer is a layer with LargeFileSize bytes of seeded random data at
// LargeFilePath. The gzip'd layer (stored blocks: the data does not compress)
// is cached under ToolsDir()/images, or the temp dir when that is not writable.
func largeLayer() (v1.Layer, error) {
	file := fmt.Sprintf("large-%d-%x.tar.gz", LargeFileSize, uint64(largeSeed))
	var path string
	for _, dir := range []string{filepath.Join(ToolsDir(), "images"), filepath.Join(os.TempDir(), "inplaced-images")} {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			continue
		}
		path = filepath.Join(dir, file)
		if _, err := os.Stat(path); err == nil {
			break
		}
		if err := writeLargeLayer(path); err != nil {
			path = ""
			continue
		}
		break
	}
	if path == "" {
		return nil, fmt.Errorf("cannot write the large layer under %s or %s", ToolsDir(), os.TempDir())
	}
	return tarball.LayerFromFile(path, tarball.WithMediaType(types.OCILayer))
}

func writeLargeLayer(path string) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), ".large-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	zw, err := gzip.NewWriterLevel(tmp, gzip.NoCompression)
	if err != nil {
		return err
	}
	tw := tar.NewWriter(zw)
	dir := strings.TrimPrefix(filepath.Dir(LargeFilePath), "/")
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: dir + "/", Mode: 0o755, ModTime: fixedTime, Format: tar.FormatPAX}); err != nil {
		return err
	}
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: strings.TrimPrefix(LargeFilePath, "/"), Mode: 0o644, Size: LargeFileSize, ModTime: fixedTime, Format: tar.FormatPAX}); err != nil {
		return err
	}
	var seed [32]byte
	binary.LittleEndian.PutUint64(seed[:], uint64(largeSeed))
	rng := rand.NewChaCha8(seed)
	if _, err := io.CopyN(tw, rng, LargeFileSize); err != nil {
		return err
	}
	if err := tw.Close(); err != nil {
		return err
	}
	if err := zw.Close(); err != nil {
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	if err := os.Chmod(tmp.Name(), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}
