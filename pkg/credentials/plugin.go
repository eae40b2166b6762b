package credentials

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"golang.org/x/sync/singleflight"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kubeletconfigv1 "k8s.io/kubelet/config/v1"
	credentialproviderv1 "k8s.io/kubelet/pkg/apis/credentialprovider/v1"
	"sigs.k8s.io/yaml"
)

// The API versions kubelet v1.37 accepts, for the config file and for the
// exec protocol.
var (
	configAPIVersions = []string{"kubelet.config.k8s.io/v1", "kubelet.config.k8s.io/v1beta1", "kubelet.config.k8s.io/v1alpha1"}
	execAPIVersions   = []string{
		credentialproviderv1.SchemeGroupVersion.String(),
		"credentialprovider.kubelet.k8s.io/v1beta1", "credentialprovider.kubelet.k8s.io/v1alpha1",
	}
)

const (
	// execTimeout is kubelet's catch-all timeout for an exec plugin.
	execTimeout = time.Minute
	// globalCacheKey is kubelet's key for a Global answer (angle brackets
	// cannot be in an image name).
	globalCacheKey = "<global>"
)

// ReadProviderConfig reads a CredentialProviderConfig as kubelet's
// --image-credential-provider-config does: a file, or a directory whose
// *.json, *.yaml and *.yml files are merged in lexical order; then
// validates it as kubelet does. The types are k8s.io/kubelet's published
// config/v1 (v1beta1 and v1alpha1 files have the same fields).
func ReadProviderConfig(path string) (*kubeletconfigv1.CredentialProviderConfig, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("credential provider config %q: %w", path, err)
	}
	files := []string{path}
	if st.IsDir() {
		entries, err := os.ReadDir(path)
		if err != nil {
			return nil, fmt.Errorf("credential provider config %q: %w", path, err)
		}
		files = files[:0]
		for _, e := range entries {
			if ext := filepath.Ext(e.Name()); !e.IsDir() && (ext == ".json" || ext == ".yaml" || ext == ".yml") {
				files = append(files, filepath.Join(path, e.Name()))
			}
		}
		slices.Sort(files)
		if len(files) == 0 {
			return nil, fmt.Errorf("credential provider config %q: no *.json, *.yaml or *.yml file in the directory", path)
		}
	}
	merged := &kubeletconfigv1.CredentialProviderConfig{}
	seen := map[string]bool{}
	for _, f := range files {
		cfg, err := decodeProviderConfig(f)
		if err != nil {
			return nil, err
		}
		for _, p := range cfg.Providers {
			if seen[p.Name] {
				return nil, fmt.Errorf("credential provider config %q: provider %q is named twice", path, p.Name)
			}
			seen[p.Name] = true
			merged.Providers = append(merged.Providers, p)
		}
	}
	if err := validateProviderConfig(merged); err != nil {
		return nil, fmt.Errorf("credential provider config %q: %w", path, err)
	}
	return merged, nil
}

func decodeProviderConfig(file string) (*kubeletconfigv1.CredentialProviderConfig, error) {
	data, err := readSmall(file)
	if err != nil {
		return nil, fmt.Errorf("credential provider config %q: %w", file, err)
	}
	var tm metav1.TypeMeta
	if err := yaml.Unmarshal(data, &tm); err != nil {
		return nil, fmt.Errorf("credential provider config %q: %w", file, err)
	}
	if tm.Kind != "CredentialProviderConfig" || !slices.Contains(configAPIVersions, tm.APIVersion) {
		return nil, fmt.Errorf("credential provider config %q: kind %q apiVersion %q: want kind CredentialProviderConfig, apiVersion one of %s",
			file, tm.Kind, tm.APIVersion, strings.Join(configAPIVersions, ", "))
	}
	cfg := &kubeletconfigv1.CredentialProviderConfig{}
	if err := yaml.UnmarshalStrict(data, cfg); err != nil {
		return nil, fmt.Errorf("credential provider config %q: %w", file, err)
	}
	return cfg, nil
}

// validateProviderConfig is kubelet's validateCredentialProviderConfig
// (k8s.io/kubernetes v1.37.2 pkg/credentialprovider/plugin/config.go),
// every problem at once.
func validateProviderConfig(cfg *kubeletconfigv1.CredentialProviderConfig) error {
	var errs []error
	if len(cfg.Providers) == 0 {
		errs = append(errs, errors.New("providers: at least 1 item is required"))
	}
	for _, p := range cfg.Providers {
		bad := func(format string, args ...any) {
			errs = append(errs, fmt.Errorf("provider %q: "+format, append([]any{p.Name}, args...)...))
		}
		if strings.ContainsAny(p.Name, "/ ") || p.Name == "." || p.Name == ".." || p.Name == "" {
			bad("the name must be a file name in the bin dir (no '/', no spaces, not '.' or '..')")
		}
		if !slices.Contains(execAPIVersions, p.APIVersion) {
			bad("apiVersion %q: want one of %s", p.APIVersion, strings.Join(execAPIVersions, ", "))
		}
		if len(p.MatchImages) == 0 {
			bad("matchImages: at least 1 item is required")
		}
		for _, m := range p.MatchImages {
			if _, err := parseSchemelessURL(m); err != nil {
				bad("matchImages %q: %v", m, err)
			}
		}
		switch {
		case p.DefaultCacheDuration == nil:
			bad("defaultCacheDuration is required")
		case p.DefaultCacheDuration.Duration < 0:
			bad("defaultCacheDuration %s: must not be negative", p.DefaultCacheDuration.Duration)
		}
		if ta := p.TokenAttributes; ta != nil {
			if ta.ServiceAccountTokenAudience == "" {
				bad("tokenAttributes.serviceAccountTokenAudience is required")
			}
			if ta.RequireServiceAccount == nil {
				bad("tokenAttributes.requireServiceAccount is required")
			}
			if p.APIVersion != credentialproviderv1.SchemeGroupVersion.String() {
				bad("tokenAttributes needs apiVersion %s", credentialproviderv1.SchemeGroupVersion)
			}
			switch ta.CacheType {
			case kubeletconfigv1.TokenServiceAccountTokenCacheType, kubeletconfigv1.ServiceAccountServiceAccountTokenCacheType:
			default:
				bad("tokenAttributes.cacheType %q: want Token or ServiceAccount", ta.CacheType)
			}
		}
	}
	return errors.Join(errs...)
}

// provider is one exec plugin with kubelet's cache of its answers.
type provider struct {
	name        string
	apiVersion  string
	bin         string
	args        []string
	env         []string // NAME=value from the config, after the daemon's own
	matchImages []string
	defaultTTL  time.Duration
	// tokens: the config asks for a service-account token of the pod
	// (tokenAttributes), which inplaced does not request.
	tokens bool
	now    func() time.Time

	group singleflight.Group
	mu    sync.Mutex
	cache map[string]cacheEntry
}

type cacheEntry struct {
	cfg     DockerConfig
	expires time.Time
}

func newProvider(binDir string, p kubeletconfigv1.CredentialProvider, now func() time.Time) (*provider, error) {
	bin, err := exec.LookPath(filepath.Join(binDir, p.Name))
	if err != nil {
		return nil, fmt.Errorf("credential provider %q: plugin executable: %w (it must be in --image-credential-provider-bin-dir %s)", p.Name, err, binDir)
	}
	pr := &provider{name: p.Name, apiVersion: p.APIVersion, bin: bin, args: p.Args, matchImages: p.MatchImages,
		defaultTTL: p.DefaultCacheDuration.Duration, tokens: p.TokenAttributes != nil, now: now, cache: map[string]cacheEntry{}}
	for _, e := range p.Env {
		pr.env = append(pr.env, e.Name+"="+e.Value)
	}
	return pr, nil
}

// matches is kubelet's isImageAllowed: one of matchImages matches image.
func (p *provider) matches(image string) bool {
	for _, m := range p.matchImages {
		if ok, _ := URLsMatchStr(m, image); ok {
			return true
		}
	}
	return false
}

// provide returns the plugin's credentials for image (a repository without
// tag, what kubelet asks for), from the cache while an answer for the
// image, its registry or globally is fresh; else it runs the plugin and
// caches the answer as kubelet does: under the response's cacheKeyType, for
// its cacheDuration (none: defaultCacheDuration; zero: not cached).
func (p *provider) provide(ctx context.Context, image string) (DockerConfig, error) {
	if cfg, ok := p.cached(image); ok {
		return cfg, nil
	}
	res, err, _ := p.group.Do(image, func() (any, error) { return p.exec(ctx, image) })
	if err != nil {
		return nil, err
	}
	resp := res.(*credentialproviderv1.CredentialProviderResponse)
	var key string
	switch resp.CacheKeyType {
	case credentialproviderv1.ImagePluginCacheKeyType:
		key = image
	case credentialproviderv1.RegistryPluginCacheKeyType:
		key = registryOf(image)
	case credentialproviderv1.GlobalPluginCacheKeyType:
		key = globalCacheKey
	default:
		return nil, fmt.Errorf("credential provider %q: cacheKeyType %q: want Image, Registry or Global", p.name, resp.CacheKeyType)
	}
	cfg := make(DockerConfig, len(resp.Auth))
	for match, a := range resp.Auth {
		cfg[match] = DockerConfigEntry{Username: a.Username, Password: a.Password}
	}
	ttl := p.defaultTTL
	if resp.CacheDuration != nil {
		ttl = resp.CacheDuration.Duration
	}
	if ttl > 0 {
		p.mu.Lock()
		p.purgeLocked()
		p.cache[key] = cacheEntry{cfg: cfg, expires: p.now().Add(ttl)}
		p.mu.Unlock()
	}
	return cfg, nil
}

// cached looks the image, its registry and the global key up, in kubelet's
// order.
func (p *provider) cached(image string) (DockerConfig, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := p.now()
	for _, k := range []string{image, registryOf(image), globalCacheKey} {
		if e, ok := p.cache[k]; ok && !now.After(e.expires) {
			return e.cfg, true
		}
	}
	return nil, false
}

func (p *provider) purgeLocked() {
	now := p.now()
	for k, e := range p.cache {
		if now.After(e.expires) {
			delete(p.cache, k)
		}
	}
}

// registryOf is kubelet's parseRegistry: the first path component.
func registryOf(image string) string {
	host, _, _ := strings.Cut(image, "/")
	return host
}

// exec runs the plugin as kubelet does: `ENV... <bin> args... <request`,
// the daemon's environment with the config's variables after it, one
// minute at most, the response's apiVersion the config's.
func (p *provider) exec(ctx context.Context, image string) (*credentialproviderv1.CredentialProviderResponse, error) {
	req, err := json.Marshal(&credentialproviderv1.CredentialProviderRequest{
		TypeMeta: metav1.TypeMeta{Kind: "CredentialProviderRequest", APIVersion: p.apiVersion}, Image: image})
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, execTimeout)
	defer cancel()
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, p.bin, p.args...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = bytes.NewReader(req), &stdout, &stderr
	cmd.Env = append(os.Environ(), p.env...)
	if err := cmd.Run(); err != nil {
		if ctx.Err() != nil {
			err = ctx.Err()
		}
		return nil, fmt.Errorf("credential provider %q for %s: %w: %s", p.name, image, err, firstLine(stderr.String()))
	}
	var tm metav1.TypeMeta
	if err := json.Unmarshal(stdout.Bytes(), &tm); err != nil {
		return nil, fmt.Errorf("credential provider %q for %s: the response is not JSON", p.name, image)
	}
	if tm.APIVersion != p.apiVersion || tm.Kind != "CredentialProviderResponse" {
		return nil, fmt.Errorf("credential provider %q for %s: response kind %q apiVersion %q: want CredentialProviderResponse %s",
			p.name, image, tm.Kind, tm.APIVersion, p.apiVersion)
	}
	resp := &credentialproviderv1.CredentialProviderResponse{}
	if err := yaml.UnmarshalStrict(stdout.Bytes(), resp); err != nil {
		// Not wrapped: the decoder's error may quote the credentials.
		return nil, fmt.Errorf("credential provider %q for %s: the response does not decode", p.name, image)
	}
	return resp, nil
}

// firstLine keeps a plugin's stderr to one bounded line in messages.
func firstLine(s string) string {
	s, _, _ = strings.Cut(strings.TrimSpace(s), "\n")
	if len(s) > 200 {
		s = s[:200] + "…"
	}
	return s
}
