// Copyright 2014 The Kubernetes Authors.
// Copyright 2026 The inplaced Authors.
//
// Licensed under the Apache License, Version 2.0 (the "License");
// you may not use this file except in compliance with the License.
// You may obtain a copy of the License at
//
//     http://www.apache.org/licenses/LICENSE-2.0
//
// Unless required by applicable law or agreed to in writing, software
// distributed under the License is distributed on an "AS IS" BASIS,
// WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
// See the License for the specific language governing permissions and
// limitations under the License.

// This file is a port of kubelet's keyring, k8s.io/kubernetes v1.37.2
// pkg/credentialprovider/keyring.go (BasicDockerKeyring, URLsMatch,
// isDefaultRegistryMatch) and the docker config entry decoding of
// pkg/credentialprovider/config.go. It is copied rather than imported
// because k8s.io/kubernetes is not meant to be a library (its go.mod pins
// every staging module to v0.0.0 and the package pulls in the feature-gate
// registry of the whole kubelet). Changes: a credential carries a
// description of where it came from instead of kubelet's
// KubeletEnsureSecretPulledImages tracking; klog is dropped (an unusable
// key is skipped, as kubelet skips it).

package credentials

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"net"
	"net/url"
	"path/filepath"
	"slices"
	"sort"
	"strings"
)

// DockerConfig is the "auths" map of a docker config: registry keys
// ("registry.example.com", "registry.example.com/team",
// "https://index.docker.io/v1/", "*.example.com") to credentials.
type DockerConfig map[string]DockerConfigEntry

// DockerConfigEntry is one key's credentials; "auth" (base64 of
// user:password) is decoded into Username and Password.
type DockerConfigEntry struct {
	Username string
	Password string
	Email    string
}

type dockerConfigEntryWithAuth struct {
	Username string `json:"username,omitempty"`
	Password string `json:"password,omitempty"`
	Email    string `json:"email,omitempty"`
	Auth     string `json:"auth,omitempty"`
}

// UnmarshalJSON implements json.Unmarshaler.
func (e *DockerConfigEntry) UnmarshalJSON(data []byte) error {
	var tmp dockerConfigEntryWithAuth
	if err := json.Unmarshal(data, &tmp); err != nil {
		return err
	}
	e.Username, e.Password, e.Email = tmp.Username, tmp.Password, tmp.Email
	if tmp.Auth == "" {
		return nil
	}
	var err error
	e.Username, e.Password, err = decodeAuth(tmp.Auth)
	return err
}

// decodeAuth decodes a docker config "auth" field, padded or not.
func decodeAuth(field string) (username, password string, err error) {
	var decoded []byte
	if strings.HasSuffix(strings.TrimSpace(field), "=") {
		decoded, err = base64.StdEncoding.DecodeString(field)
	} else {
		decoded, err = base64.RawStdEncoding.DecodeString(field)
	}
	if err != nil {
		// The field itself is a secret: never in the error.
		return "", "", errors.New("auth field is not base64")
	}
	u, p, ok := strings.Cut(string(decoded), ":")
	if !ok {
		return "", "", errors.New("unable to parse auth field, must be formatted as base64(username:password)")
	}
	return u, p, nil
}

// Credential is one username/password to try for a pull, and where it came
// from (never the secret itself: a pod secret's name and key, a file's
// path and key, a provider's name).
type Credential struct {
	Username string
	Password string
	Email    string
	// Source says where the credential came from, for messages.
	Source string
}

// Keyring is kubelet's BasicDockerKeyring: credentials by registry key,
// looked up most specific key first.
type Keyring struct {
	index []string
	creds map[string][]Credential
}

// Add inserts the keys of cfg; source describes where cfg came from (the
// key is appended to it in each credential's Source).
func (k *Keyring) Add(source string, cfg DockerConfig) {
	if k.index == nil {
		k.creds = make(map[string][]Credential)
	}
	// Map order is random; kubelet's own order among the keys of one
	// config is the index sort below, so sorting here only makes the
	// order of two entries for one key (from two sources) stable.
	keys := make([]string, 0, len(cfg))
	for key := range cfg {
		keys = append(keys, key)
	}
	sort.Strings(keys)
	for _, repository := range keys {
		e := cfg[repository]
		loc := repository
		if !strings.HasPrefix(loc, "https://") && !strings.HasPrefix(loc, "http://") {
			loc = "https://" + loc
		}
		parsed, err := url.Parse(loc)
		if err != nil {
			continue // kubelet: "Entry %q in dockercfg invalid, ignoring"
		}
		// The docker client allows exact matches (foo.bar.com/namespace)
		// or hostname matches (foo.bar.com); /v1/ and /v2/ are the
		// hostname (ResolveAuthConfig in docker/registry/auth.go).
		effectivePath := parsed.Path
		if strings.HasPrefix(effectivePath, "/v2/") || strings.HasPrefix(effectivePath, "/v1/") {
			effectivePath = effectivePath[3:]
		}
		key := parsed.Host
		if effectivePath != "" && effectivePath != "/" {
			key = parsed.Host + effectivePath
		}
		k.creds[key] = append(k.creds[key], Credential{Username: e.Username, Password: e.Password, Email: e.Email,
			Source: source + " key " + key})
		k.index = append(k.index, key)
	}
	// Reverse-sorted so that more specific paths are matched first:
	// "quay.io/coreos" before "quay.io".
	slices.Sort(k.index)
	k.index = slices.Compact(k.index)
	sort.Sort(sort.Reverse(sort.StringSlice(k.index)))
}

const defaultRegistryHost = "index.docker.io"

// isDefaultRegistryMatch reports whether image pulls from Docker Hub.
func isDefaultRegistryMatch(image string) bool {
	parts := strings.SplitN(image, "/", 2)
	if parts[0] == "" {
		return false
	}
	if len(parts) == 1 {
		return true // library/ubuntu
	}
	if parts[0] == "docker.io" || parts[0] == "index.docker.io" {
		return true
	}
	// A first component with a "." or ":" is a registry host, not a user.
	return !strings.ContainsAny(parts[0], ".:")
}

// parseSchemelessURL parses "host[:port]/path" (url.Parse wants a scheme).
func parseSchemelessURL(schemeless string) (*url.URL, error) {
	parsed, err := url.Parse("https://" + schemeless)
	if err != nil {
		return nil, err
	}
	parsed.Scheme = ""
	return parsed, nil
}

func splitURL(u *url.URL) (parts []string, port string) {
	host, port, err := net.SplitHostPort(u.Host)
	if err != nil {
		host, port = u.Host, ""
	}
	return strings.Split(host, "."), port
}

// URLsMatchStr is URLsMatch on schemeless strings.
func URLsMatchStr(glob, target string) (bool, error) {
	globURL, err := parseSchemelessURL(glob)
	if err != nil {
		return false, err
	}
	targetURL, err := parseSchemelessURL(target)
	if err != nil {
		return false, err
	}
	return URLsMatch(globURL, targetURL)
}

// URLsMatch reports whether target matches glob: the same port, the same
// number of host labels each matching its glob label (*.docker.io matches
// blah.docker.io, not a.b.docker.io), and glob's path a prefix of
// target's. No wildcards in ports or paths.
func URLsMatch(globURL, targetURL *url.URL) (bool, error) {
	globParts, globPort := splitURL(globURL)
	targetParts, targetPort := splitURL(targetURL)
	if globPort != targetPort || len(globParts) != len(targetParts) {
		return false, nil
	}
	if !strings.HasPrefix(targetURL.Path, globURL.Path) {
		return false, nil
	}
	for i, g := range globParts {
		matched, err := filepath.Match(g, targetParts[i])
		if err != nil {
			return false, err
		}
		if !matched {
			return false, nil
		}
	}
	return true, nil
}

// Lookup returns the credentials whose keys match image (a repository
// without tag, as kubelet looks up: "registry.example.com/team/app"), most
// specific key first; Docker Hub images fall back to an "index.docker.io"
// key.
func (k *Keyring) Lookup(image string) ([]Credential, bool) {
	var ret []Credential
	for _, key := range k.index {
		if matched, _ := URLsMatchStr(key, image); matched {
			ret = append(ret, k.creds[key]...)
		}
	}
	if len(ret) > 0 {
		return ret, true
	}
	if isDefaultRegistryMatch(image) {
		if auth, ok := k.creds[defaultRegistryHost]; ok {
			return auth, true
		}
	}
	return nil, false
}
