// Package credentials finds the registry credentials kubelet would pull an
// image with, from the same sources, in the same order and with the same
// matching (k8s.io/kubernetes v1.37 pkg/kubelet/images/image_manager.go
// makeLookupPullCredentialsFunc):
//
//  1. the pod's imagePullSecrets, all in one keyring;
//  2. the node's docker config: config.json in kubelet's --root-dir, the
//     working directory, ~/.docker, /.docker, else .dockercfg in the same
//     places (the first file that reads);
//  3. the credential-provider exec plugins of kubelet's
//     --image-credential-provider-config and --image-credential-provider-bin-dir,
//     each answer cached as kubelet caches it.
//
// Each source is a keyring looked up with the image's repository (no tag):
// a key scoped to a path applies only under that path, more specific keys
// come first, globs match label by label. The credentials of the three are
// tried in that order; none at all means an anonymous pull.
//
// What inplaced cannot know is reported, never guessed: a pull secret it
// could not read (but one that does not exist: kubelet skips that too), a
// plugin that failed, a plugin that wants the pod's service-account token
// (inplaced does not request tokens). A lookup with such a gap is not
// Complete: kubelet may have credentials inplaced lacks.
//
// Credentials never leave this package but in Result.Credentials; every
// message names sources only.
package credentials

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/distribution/reference"
	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
)

// Options configures a Resolver.
type Options struct {
	// KubeletRootDir is kubelet's --root-dir (/var/lib/kubelet): the first
	// place of the node's docker config. Empty: skipped.
	KubeletRootDir string
	// ProviderConfig and ProviderBinDir are kubelet's
	// --image-credential-provider-config and
	// --image-credential-provider-bin-dir; both empty: no plugins.
	ProviderConfig string
	ProviderBinDir string
	Logger         *zap.Logger
	// Now is the plugin cache's clock (default time.Now).
	Now func() time.Time
}

// Resolver looks credentials up. It is safe for concurrent use.
type Resolver struct {
	rootDir   string
	providers []*provider
	log       *zap.Logger
}

// New reads and validates the plugin config (as kubelet does at start: a
// bad config or a missing plugin is an error).
func New(o Options) (*Resolver, error) {
	if o.Logger == nil {
		o.Logger = zap.NewNop()
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	r := &Resolver{rootDir: o.KubeletRootDir, log: o.Logger}
	if (o.ProviderConfig == "") != (o.ProviderBinDir == "") {
		return nil, errors.New("--image-credential-provider-config and --image-credential-provider-bin-dir go together: give both (kubelet's values) or neither")
	}
	if o.ProviderConfig == "" {
		return r, nil
	}
	if st, err := os.Stat(o.ProviderBinDir); err != nil || !st.IsDir() {
		return nil, fmt.Errorf("--image-credential-provider-bin-dir %q: not a directory (give kubelet's)", o.ProviderBinDir)
	}
	cfg, err := ReadProviderConfig(o.ProviderConfig)
	if err != nil {
		return nil, err
	}
	for _, p := range cfg.Providers {
		pr, err := newProvider(o.ProviderBinDir, p, o.Now)
		if err != nil {
			return nil, err
		}
		if pr.tokens {
			o.Logger.Warn("credential provider asks for the pod's service-account token, which inplaced does not request: "+
				"for the images it matches, a pull refused for want of credentials is left to kubelet", zap.String("provider", p.Name))
		}
		r.providers = append(r.providers, pr)
	}
	return r, nil
}

// Request is one image pull's lookup.
type Request struct {
	// Image is the image reference as in the pod spec.
	Image string
	// Secrets are the pod's pull secrets that were read, in the spec's order.
	Secrets []*corev1.Secret
	// Missing names pull secrets that do not exist (kubelet skips them).
	Missing []string
	// Unreadable says why pull secrets could not be read (a gap).
	Unreadable []string
}

// Result is a lookup's answer.
type Result struct {
	// Credentials to try, in kubelet's order; none: anonymous.
	Credentials []Credential
	// Sources that were read (names, paths), for messages.
	Searched []string
	// Gaps are sources kubelet may have credentials from that inplaced
	// could not read; empty: the lookup is what kubelet's would be.
	Gaps []string
}

// Complete reports whether every source kubelet uses was read.
func (r Result) Complete() bool { return len(r.Gaps) == 0 }

// Describe says what was tried, without the credentials: "2 credential(s)
// for r/team/app: pod secret ns/a key r/team; node docker config /x key r"
// or "no credentials for r/team/app (looked in: ...)".
func (r Result) Describe(repo string) string {
	var b strings.Builder
	if len(r.Credentials) == 0 {
		fmt.Fprintf(&b, "no credentials for %s (looked in: %s)", repo, strings.Join(r.Searched, "; "))
	} else {
		srcs := make([]string, len(r.Credentials))
		for i, c := range r.Credentials {
			srcs[i] = c.Source
		}
		fmt.Fprintf(&b, "%d credential(s) for %s: %s", len(r.Credentials), repo, strings.Join(srcs, "; "))
	}
	if len(r.Gaps) > 0 {
		fmt.Fprintf(&b, "; not available to inplaced: %s", strings.Join(r.Gaps, "; "))
	}
	return b.String()
}

// Repository is the name kubelet looks credentials up with: the image's
// normalized repository without tag or digest ("docker.io/library/nginx").
func Repository(image string) (string, error) {
	named, err := reference.ParseNormalizedNamed(image)
	if err != nil {
		return "", fmt.Errorf("image %q: %w", image, err)
	}
	return named.Name(), nil
}

// Lookup returns the credentials kubelet would try for req.Image.
func (r *Resolver) Lookup(ctx context.Context, req Request) (Result, error) {
	repo, err := Repository(req.Image)
	if err != nil {
		return Result{}, err
	}
	var res Result
	res.Gaps = append(res.Gaps, req.Unreadable...)

	// 1. Pod secrets: one keyring, as kubelet's secretsToTrackedDockerConfigs.
	secrets := &Keyring{}
	for _, s := range req.Secrets {
		cfg, err := secretConfig(s)
		if err != nil {
			// kubelet fails the whole lookup (and the pull) on a secret
			// that does not parse; here the pull goes on without it and
			// the message says so.
			res.Gaps = append(res.Gaps, fmt.Sprintf("pull secret %s/%s: %v", s.Namespace, s.Name, err))
			continue
		}
		if cfg != nil {
			secrets.Add(fmt.Sprintf("pod secret %s/%s", s.Namespace, s.Name), cfg)
		}
		res.Searched = append(res.Searched, fmt.Sprintf("pod secret %s/%s", s.Namespace, s.Name))
	}
	for _, m := range req.Missing {
		res.Searched = append(res.Searched, fmt.Sprintf("pod secret %s (does not exist)", m))
	}
	if len(req.Secrets) == 0 && len(req.Missing) == 0 && len(req.Unreadable) == 0 {
		res.Searched = append(res.Searched, "no pod pull secrets")
	}
	creds, _ := secrets.Lookup(repo)
	res.Credentials = append(res.Credentials, creds...)

	// 2. The node's docker config.
	node := &Keyring{}
	cfg, from, skipped := readNodeConfig(r.rootDir)
	if skipped != nil {
		r.log.Warn("node docker config skipped, as kubelet skips it", zap.Error(skipped))
	}
	if from != "" {
		node.Add("node docker config "+from, cfg)
		res.Searched = append(res.Searched, "node docker config "+from)
	} else {
		res.Searched = append(res.Searched, "no node docker config")
	}
	creds, _ = node.Lookup(repo)
	res.Credentials = append(res.Credentials, creds...)

	// 3. Plugins: one keyring over every provider's answer.
	plugins := &Keyring{}
	for _, p := range r.providers {
		if !p.matches(repo) {
			continue
		}
		if p.tokens {
			res.Gaps = append(res.Gaps, fmt.Sprintf("credential provider %q wants the pod's service-account token (not supported by inplaced)", p.name))
			continue
		}
		cfg, err := p.provide(ctx, repo)
		if err != nil {
			res.Gaps = append(res.Gaps, err.Error())
			continue
		}
		plugins.Add(fmt.Sprintf("credential provider %q", p.name), cfg)
		res.Searched = append(res.Searched, fmt.Sprintf("credential provider %q", p.name))
	}
	if len(r.providers) == 0 {
		res.Searched = append(res.Searched, "no credential providers")
	}
	creds, _ = plugins.Lookup(repo)
	res.Credentials = append(res.Credentials, creds...)
	return res, nil
}

// secretConfig is the docker config of a pull secret, as kubelet reads it:
// kubernetes.io/dockerconfigjson or kubernetes.io/dockercfg with its key
// present and not empty; any other secret gives nil (kubelet ignores it).
func secretConfig(s *corev1.Secret) (DockerConfig, error) {
	switch {
	case s.Type == corev1.SecretTypeDockerConfigJson && len(s.Data[corev1.DockerConfigJsonKey]) > 0:
		return readDockerConfigJSONFromBytes(s.Data[corev1.DockerConfigJsonKey])
	case s.Type == corev1.SecretTypeDockercfg && len(s.Data[corev1.DockerConfigKey]) > 0:
		return readDockerConfigFileFromBytes(s.Data[corev1.DockerConfigKey])
	}
	return nil, nil
}
