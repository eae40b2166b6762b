package kube

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/url"
	"path"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"
	corev1 "k8s.io/api/core/v1"

	inplacedv1 "github.com/inplaced/inplaced/proto/inplaced/v1"
)

// dockerConfig is the body of a kubernetes.io/dockerconfigjson secret
// ({"auths": {...}}) or, without the wrapper, of a kubernetes.io/dockercfg one.
type dockerConfig struct {
	Auths map[string]dockerEntry `json:"auths"`
}

type dockerEntry struct {
	Username      string `json:"username"`
	Password      string `json:"password"`
	Auth          string `json:"auth"`
	IdentityToken string `json:"identitytoken"`
	RegistryToken string `json:"registrytoken"`
}

// registryHost is the registry an image reference pulls from, as kubelet's
// keyring matches it ("index.docker.io" for Docker Hub).
func registryHost(image string) (string, error) {
	ref, err := name.ParseReference(image, name.WeakValidation)
	if err != nil {
		return "", fmt.Errorf("image %q: %w", image, err)
	}
	return normalizeHost(ref.Context().RegistryStr()), nil
}

func normalizeHost(h string) string {
	switch h {
	case "docker.io", "registry-1.docker.io":
		return "index.docker.io"
	}
	return h
}

// keyHost is the host[:port] (possibly a glob like *.example.com) a docker
// config key names: keys may carry a scheme and a path
// ("https://index.docker.io/v1/").
func keyHost(key string) string {
	k := key
	if strings.Contains(k, "://") {
		if u, err := url.Parse(k); err == nil {
			k = u.Host
		}
	}
	if i := strings.IndexByte(k, '/'); i >= 0 {
		k = k[:i]
	}
	return normalizeHost(k)
}

// AuthsFor returns the credentials of the pod's pull secrets that apply to
// image, in the secrets' order, as kubelet would try them. Secrets that
// cannot be read are reported in errs and skipped.
func AuthsFor(image string, secrets []*corev1.Secret) (auths []*inplacedv1.RegistryAuth, errs []error) {
	host, err := registryHost(image)
	if err != nil {
		return nil, []error{err}
	}
	for _, s := range secrets {
		cfg, err := parseDockerSecret(s)
		if err != nil {
			errs = append(errs, fmt.Errorf("secret %s/%s: %w", s.Namespace, s.Name, err))
			continue
		}
		for key, e := range cfg.Auths {
			kh := keyHost(key)
			if ok, _ := path.Match(kh, host); !ok && kh != host {
				continue
			}
			a := &inplacedv1.RegistryAuth{Username: e.Username, Password: e.Password, Auth: e.Auth,
				ServerAddress: kh, IdentityToken: e.IdentityToken, RegistryToken: e.RegistryToken}
			if a.Username == "" && a.Auth != "" {
				if u, p, ok := decodeAuth(a.Auth); ok {
					a.Username, a.Password, a.Auth = u, p, ""
				}
			}
			auths = append(auths, a)
		}
	}
	return auths, errs
}

func parseDockerSecret(s *corev1.Secret) (*dockerConfig, error) {
	switch s.Type {
	case corev1.SecretTypeDockerConfigJson:
		cfg := &dockerConfig{}
		if err := json.Unmarshal(s.Data[corev1.DockerConfigJsonKey], cfg); err != nil {
			return nil, fmt.Errorf("%s: %w", corev1.DockerConfigJsonKey, err)
		}
		return cfg, nil
	case corev1.SecretTypeDockercfg:
		cfg := &dockerConfig{}
		if err := json.Unmarshal(s.Data[corev1.DockerConfigKey], &cfg.Auths); err != nil {
			return nil, fmt.Errorf("%s: %w", corev1.DockerConfigKey, err)
		}
		return cfg, nil
	default:
		return nil, fmt.Errorf("type %q is not a pull secret (want %s or %s)", s.Type, corev1.SecretTypeDockerConfigJson, corev1.SecretTypeDockercfg)
	}
}

func decodeAuth(auth string) (user, pass string, ok bool) {
	b, err := base64.StdEncoding.DecodeString(auth)
	if err != nil {
		return "", "", false
	}
	user, pass, ok = strings.Cut(string(b), ":")
	return user, pass, ok
}
