package harness

import (
	"context"
	"fmt"
	"path"
	"runtime"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"golang.org/x/sync/errgroup"
)

// CritestRegistryHosts are the registries critest v1.37 pulls its own images
// from. A containerd started with WithMirrors(CritestRegistryHosts...) resolves
// them to the harness registry, where PushCritestImages put substitutes.
var CritestRegistryHosts = []string{"registry.k8s.io", "gcr.io", "k8s.gcr.io"}

// PushCritestImages pushes to r, under the repository paths critest v1.37
// uses (host left out), stand-ins for its upstream test images, so that its
// image, user, namespace and multi-container specs run offline:
//
//	e2e-test-images/busybox:1.29-2, httpd:2.4.39-4   busybox, busybox httpd on :80 (logs "httpd")
//	e2e-test-images/nginx:1.14-2                     /usr/sbin/nginx (test/images/app) on :80 writing /var/run/nginx.pid,
//	                                                 argv[0] "nginx: master process nginx"
//	e2e-test-images/nonewprivs:1.3                   setuid-root app printing "Effective uid: N"
//	k8s-staging-cri-tools/hostnet-nginx-<arch>       the nginx stand-in on :12003
//	k8s-staging-cri-tools/test-image-user-*          USER 1002, www-data, 1003:1003, www-data:www-data
//	k8s-staging-cri-tools/test-image-predefined-group  uid 1000 in group 50000 in /etc/group
//	k8s-staging-cri-tools/test-image-{latest,tag:test,tag:all,1,2,3,tags:1..3}
//	pause:3.9
//
// test-image-digest@sha256:9700... cannot be reproduced: its specs fail on every path.
func (r *Registry) PushCritestImages(tb testing.TB) {
	tb.Helper()
	r.PushTestImages(tb)
	imgs, err := buildTestImages(tb)
	if err != nil {
		tb.Fatal(err)
	}
	push, err := critestImages(imgs)
	if err != nil {
		tb.Fatalf("critest images: %v", err)
	}
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(4)
	for path, img := range push {
		g.Go(func() error {
			tag, err := name.NewTag(r.Ref(path), name.Insecure)
			if err != nil {
				return err
			}
			if err := remote.Write(tag, img, remote.WithContext(gctx)); err != nil {
				return fmt.Errorf("push %s: %w", path, err)
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		tb.Fatalf("push critest images: %v", err)
	}
	tb.Logf("pushed %d critest stand-in images to %s in %s", len(push), r.Addr, time.Since(start).Round(time.Millisecond))
}

const (
	e2eImages   = "e2e-test-images/"
	criTestRepo = "k8s-staging-cri-tools/"
)

// critestImages maps repository paths ("e2e-test-images/nginx:1.14-2") to images.
func critestImages(t *testImages) (map[string]v1.Image, error) {
	nginxLayer, err := fileLayer(map[string]tarFile{"usr/sbin/nginx": {0o755, t.app}})
	if err != nil {
		return nil, err
	}
	nnpLayer, err := fileLayer(map[string]tarFile{"nnp": {0o4755, t.app}})
	if err != nil {
		return nil, err
	}
	groupLayer, err := fileLayer(map[string]tarFile{
		"etc/passwd": {0o644, []byte(etcPasswd + "user-defined-in-image:x:1000:1000::/home:/bin/sh\n")},
		"etc/group":  {0o644, []byte(etcGroup + "user-defined-in-image:x:1000:\ngroup-defined-in-image:x:50000:user-defined-in-image\n")},
	})
	if err != nil {
		return nil, err
	}
	// "nginx: master process" in /proc/1/cmdline, "nginx" as comm for pidof.
	nginx := func(port int) v1.Config {
		return v1.Config{Entrypoint: []string{"/bin/sh", "-c", fmt.Sprintf(
			"exec -a 'nginx: master process nginx' /usr/sbin/nginx -listen=:%d -pidfile=/var/run/nginx.pid", port)}}
	}
	pauseLayer, err := fileLayer(map[string]tarFile{"pause": {0o755, t.app}})
	if err != nil {
		return nil, err
	}
	busybox := v1.Config{Cmd: []string{"sh"}}
	withUser := func(u string) v1.Config { return v1.Config{Cmd: []string{"sh"}, User: u} }

	specs := map[string]struct {
		layers []v1.Layer
		cfg    v1.Config
	}{
		e2eImages + "busybox:1.29-2":                    {[]v1.Layer{t.base}, busybox},
		e2eImages + "httpd:2.4.39-4":                    {[]v1.Layer{t.base}, v1.Config{Entrypoint: []string{"/bin/sh", "-c", "echo 'httpd: serving /www on :80'; exec httpd -f -p 80 -h /www"}}},
		e2eImages + "nginx:1.14-2":                      {[]v1.Layer{t.base, nginxLayer}, nginx(80)},
		e2eImages + "nonewprivs:1.3":                    {[]v1.Layer{t.base, nnpLayer}, v1.Config{Entrypoint: []string{"/nnp", "-print-euid"}}},
		criTestRepo + "hostnet-nginx-" + runtime.GOARCH: {[]v1.Layer{t.base, nginxLayer}, nginx(12003)},
		criTestRepo + "test-image-user-uid":             {[]v1.Layer{t.base}, withUser("1002")},
		criTestRepo + "test-image-user-username":        {[]v1.Layer{t.base}, withUser("www-data")},
		criTestRepo + "test-image-user-uid-group":       {[]v1.Layer{t.base}, withUser("1003:1003")},
		criTestRepo + "test-image-user-username-group":  {[]v1.Layer{t.base}, withUser("www-data:www-data")},
		criTestRepo + "test-image-predefined-group":     {[]v1.Layer{t.base, groupLayer}, busybox},
		criTestRepo + "test-image-latest":               {[]v1.Layer{t.base}, busybox},
		criTestRepo + "test-image-tag:test":             {[]v1.Layer{t.base}, busybox},
		criTestRepo + "test-image-tag:all":              {[]v1.Layer{t.base}, busybox},
		criTestRepo + "test-image-tags:1":               {[]v1.Layer{t.base}, busybox},
		criTestRepo + "test-image-tags:2":               {[]v1.Layer{t.base}, busybox},
		criTestRepo + "test-image-tags:3":               {[]v1.Layer{t.base}, busybox},
		"pause:3.9":                                     {[]v1.Layer{t.base, pauseLayer}, v1.Config{Entrypoint: []string{"/pause", "-listen="}}},
	}
	// Three different images: each has its own marker file.
	for i := 1; i <= 3; i++ {
		l, err := fileLayer(map[string]tarFile{fmt.Sprintf("image-%d", i): {0o644, []byte(fmt.Sprintf("%d\n", i))}})
		if err != nil {
			return nil, err
		}
		specs[fmt.Sprintf("%stest-image-%d:latest", criTestRepo, i)] = struct {
			layers []v1.Layer
			cfg    v1.Config
		}{[]v1.Layer{t.base, l}, busybox}
	}

	out := make(map[string]v1.Image, len(specs))
	for path, s := range specs {
		// One image per repository (so one image ID per tag pulled), except
		// test-image-tags:1..3, which critest wants to be the same image.
		name, _, _ := strings.Cut(path, ":")
		if !strings.HasSuffix(name, "test-image-tags") {
			name = path
		}
		img, err := ociImage(name, s.layers, s.cfg)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		out[path] = img
	}
	return out, nil
}

type tarFile struct {
	mode int64
	data []byte
}

// fileLayer is a layer holding files (parent directories are created).
func fileLayer(files map[string]tarFile) (v1.Layer, error) {
	b := newTarBuilder()
	names := make([]string, 0, len(files))
	for n := range files {
		names = append(names, n)
	}
	sort.Strings(names)
	dirs := map[string]bool{}
	for _, n := range names {
		for d := path.Dir(n); d != "." && !dirs[d]; d = path.Dir(d) {
			dirs[d] = true
		}
	}
	dirList := make([]string, 0, len(dirs))
	for d := range dirs {
		dirList = append(dirList, d)
	}
	sort.Strings(dirList)
	for _, d := range dirList {
		if err := b.dir(d, 0o755); err != nil {
			return nil, err
		}
	}
	for _, n := range names {
		if err := b.file(n, files[n].mode, files[n].data); err != nil {
			return nil, err
		}
	}
	return b.layer()
}
